package main

import (
	"encoding/base64"
	"encoding/json"
	"sort"
	"strings"
	"testing"
)

// TestConsumePeekSettlesNothing: consume --peek shows each message with its
// key and headers, binary bodies losslessly, and hands every message back: a
// consumer afterwards gets the same messages, on their second attempt.
func TestConsumePeekSettlesNothing(t *testing.T) {
	addr := startClientTestBroker(t)
	bin := "\x00\xffbin\x1b[31m"
	stdin := "hello\n" + bin + "\nwörld\n"
	if code, _, errOut := runCmd(t, stdin, "publish", "--addr", addr, "--topic", "pk", "--key", "k1",
		"--header", "a=b", "--header", "trace=\x01x"); code != 0 {
		t.Fatalf("publish exit %d: %s", code, errOut)
	}
	code, out, errOut := runCmd(t, "", "consume", "--addr", addr, "--topic", "pk", "--peek", "--count", "3", "--json")
	if code != 0 {
		t.Fatalf("peek exit %d: %s", code, errOut)
	}
	var bodies []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m consumeJSON
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("peek line %q: %v", l, err)
		}
		if m.Attempt != 1 || m.Topic != "pk" || m.Key != "k1" || m.KeyEncoding != encodingUTF8 || m.PublishedAtMs == 0 {
			t.Fatalf("peek line %q: %+v", l, m)
		}
		if len(m.Headers) != 2 || m.Headers[0] != (headerJSON{Key: "a", Value: "b"}) ||
			m.Headers[1] != (headerJSON{Key: "trace", Value: "\x01x"}) {
			t.Fatalf("headers %+v", m.Headers)
		}
		body := m.Body
		switch m.BodyEncoding {
		case encodingBase64:
			raw, err := base64.StdEncoding.DecodeString(m.Body)
			if err != nil {
				t.Fatal(err)
			}
			body = string(raw)
		case encodingUTF8:
		default:
			t.Fatalf("body_encoding %q", m.BodyEncoding)
		}
		bodies = append(bodies, body)
	}
	sort.Strings(bodies)
	want := []string{bin, "hello", "wörld"}
	sort.Strings(want)
	if strings.Join(bodies, "|") != strings.Join(want, "|") {
		t.Fatalf("peeked %q, want %q", bodies, want)
	}

	// Nothing was settled: the same three come back, attempt 2.
	code, out, errOut = runCmd(t, "", "consume", "--addr", addr, "--topic", "pk", "--peek", "--count", "3")
	if code != 0 {
		t.Fatalf("second peek exit %d: %s", code, errOut)
	}
	for _, want := range []string{
		"key: k1\n", "header a: b\n", `header trace: "\x01x"` + "\n",
		"body (5 bytes): hello\n", "body (6 bytes): wörld\n", `body (10 bytes): "\x00\xffbin\x1b[31m"` + "\n",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("peek text lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "attempt 2 ") != 3 {
		t.Fatalf("second peek: want 3 messages on attempt 2:\n%s", out)
	}

	// A peek of more than the queue holds ends when nothing more comes.
	code, out, errOut = runCmd(t, "", "consume", "--addr", addr, "--topic", "pk", "--peek", "--idle-exit", "300ms", "--body", "base64")
	if code != 0 || strings.Count(out, "--- pk partition") != 3 ||
		!strings.Contains(out, "body (5 bytes): "+base64.StdEncoding.EncodeToString([]byte("hello"))+"\n") {
		t.Fatalf("peek of 10 with 3 there: exit %d, %q, %q", code, out, errOut)
	}

	// A real consumer acks them; then there is nothing left to peek.
	code, out, errOut = runCmd(t, "", "consume", "--addr", addr, "--topic", "pk", "--count", "3", "--json")
	if code != 0 {
		t.Fatalf("consume exit %d: %s", code, errOut)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m consumeJSON
		if err := json.Unmarshal([]byte(l), &m); err != nil || m.Attempt != 4 {
			t.Fatalf("after three peeks want attempt 4: %q %v", l, err)
		}
	}
	code, out, _ = runCmd(t, "", "consume", "--addr", addr, "--topic", "pk", "--peek", "--idle-exit", "200ms")
	if code != 0 || out != "" {
		t.Fatalf("peek after acks: exit %d, %q", code, out)
	}
}

func TestConsumePeekUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"consume", "--topic", "t", "--peek", "--auto-ack"}, "--auto-ack"},
		{[]string{"consume", "--topic", "t", "--peek", "--prefetch", "5"}, "--prefetch"},
		{[]string{"consume", "--topic", "t", "--body", "base64"}, "--body is for --peek"},
		{[]string{"consume", "--topic", "t", "--peek", "--body", "hex"}, `--body "hex"`},
		{[]string{"consume", "--topic", "t", "--peek", "--count", "2000000"}, "--count 2000000 is out of range"},
	} {
		code, _, errOut := runCmd(t, "", tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, code, errOut, tc.want)
		}
	}
}
