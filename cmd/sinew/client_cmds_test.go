package main

import (
	"bytes"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/sinewmq/sinew/internal/server"
	"github.com/sinewmq/sinew/internal/testkit"
)

// startClientTestBroker runs the real broker (on MemFS) and wire server in
// process on loopback and returns its address.
func startClientTestBroker(t *testing.T, tokens ...string) string {
	t.Helper()
	return testkit.StartBroker(t, testkit.WithServerConfig(func(c *server.Config) { c.AuthTokens = tokens })).Addr
}

func runCmd(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func TestPublishThenConsumeJSON(t *testing.T) {
	addr := startClientTestBroker(t)
	code, out, errOut := runCmd(t, "hello\nworld\r\nagain\n", "publish", "--addr", addr, "--topic", "demo", "--json",
		"--header", "a=b", "--key", "k")
	if code != 0 {
		t.Fatalf("publish exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("publish printed %q", out)
	}
	for i, l := range lines {
		var r publishResultJSON
		if err := json.Unmarshal([]byte(l), &r); err != nil || r.Seq != uint64(i+1) {
			t.Fatalf("line %d %q: %+v %v", i, l, r, err)
		}
	}
	code, out, errOut = runCmd(t, "", "consume", "--addr", addr, "--topic", "demo", "--count", "3", "--json")
	if code != 0 {
		t.Fatalf("consume exit %d: %s", code, errOut)
	}
	var bodies []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var m consumeJSON
		if err := json.Unmarshal([]byte(l), &m); err != nil || m.Attempt != 1 {
			t.Fatalf("consume line %q: %+v %v", l, m, err)
		}
		bodies = append(bodies, m.Body)
	}
	if strings.Join(bodies, ",") != "hello,world,again" {
		t.Fatalf("consumed %v", bodies)
	}
	// Everything was acked: an idle consumer gets nothing and exits.
	code, out, errOut = runCmd(t, "", "consume", "--addr", addr, "--topic", "demo", "--idle-exit", "200ms")
	if code != 0 || out != "" {
		t.Fatalf("idle consume exit %d, out %q, err %q", code, out, errOut)
	}
}

func TestPublishGeneratedBodies(t *testing.T) {
	addr := startClientTestBroker(t)
	code, out, errOut := runCmd(t, "", "publish", "--addr", addr, "--topic", "gen", "--count", "500", "--size", "32", "--window", "16")
	if code != 0 || out != "published to gen: confirmed 500, failed 0\n" {
		t.Fatalf("publish exit %d, out %q, err %q", code, out, errOut)
	}
	code, out, errOut = runCmd(t, "", "consume", "--addr", addr, "--topic", "gen", "--count", "500", "--prefetch", "100", "--auto-ack")
	if code != 0 {
		t.Fatalf("consume exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 500 || len(lines[0]) != 32 || !strings.HasPrefix(lines[0], "seq=1 ") {
		t.Fatalf("got %d lines, first %q", len(lines), lines[0])
	}
	code, out, errOut = runCmd(t, "", "publish", "--addr", addr, "--topic", "gen", "--count", "10", "--no-confirm")
	if code != 0 || out != "published to gen: sent 10 unconfirmed, failed 0\n" {
		t.Fatalf("no-confirm exit %d: %s", code, errOut)
	}
	code, out, _ = runCmd(t, "", "consume", "--addr", addr, "--topic", "gen", "--count", "10")
	if code != 0 || len(strings.Split(strings.TrimSpace(out), "\n")) != 10 {
		t.Fatalf("after no-confirm: exit %d, %q", code, out)
	}
}

func TestClientCommandErrors(t *testing.T) {
	addr := startClientTestBroker(t, "secret")
	free := func() string { // a loopback port with nobody listening
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		a := ln.Addr().String()
		_ = ln.Close()
		return a
	}()
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"publish"}, 2, "--topic is required"},
		{[]string{"publish", "--topic", "t", "--window", "0"}, 2, "--window"},
		{[]string{"publish", "--topic", "t", "--header", "nokv"}, 2, "key=value"},
		{[]string{"consume", "--topic", "t", "--bogus"}, 2, "bogus"},
		{[]string{"publish", "--addr", free, "--topic", "t", "--connect-timeout", "500ms"}, 1, "unreachable"},
		{[]string{"consume", "--addr", addr, "--topic", "t", "--token", "wrong"}, 1, "rejected the credentials"},
		{[]string{"publish", "--addr", addr + ",nope", "--topic", "t"}, 2, "not host:port"},
		{[]string{"consume", "--addr", addr + ",", "--topic", "t"}, 2, "not host:port"},
	}
	for _, tc := range cases {
		code, _, errOut := runCmd(t, "", tc.args...)
		lines := strings.Split(strings.TrimSpace(errOut), "\n")
		last := lines[len(lines)-1]
		if code != tc.code || !strings.Contains(last, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
	code, out, errOut := runCmd(t, "x\n", "publish", "--addr", addr, "--topic", "t", "--token", "secret")
	if code != 0 || out != "published to t: confirmed 1, failed 0\n" {
		t.Fatalf("with the right token: exit %d, %q %q", code, out, errOut)
	}
	// Several addresses: the first is dialled, the others are seeds.
	code, out, errOut = runCmd(t, "y\n", "publish", "--addr", addr+", "+free, "--topic", "t", "--token", "secret")
	if code != 0 || out != "published to t: confirmed 1, failed 0\n" {
		t.Fatalf("with a list of addresses: exit %d, %q %q", code, out, errOut)
	}
}

// TestPublishOversizedLine: a stdin line over the body limit stops publish
// with an error, after a summary of what was stored; a line of exactly the
// limit is published.
func TestPublishOversizedLine(t *testing.T) {
	addr := startClientTestBroker(t)
	full := strings.Repeat("f", publishBodyBytesMax)
	over := strings.Repeat("x", publishBodyBytesMax+1)
	stdin := "a\r\n" + full + "\r\nb\n" + over + "\nafter\n"
	code, out, errOut := runCmd(t, stdin, "publish", "--addr", addr, "--topic", "big")
	if code != 1 {
		t.Fatalf("exit %d, out %q, err %q; want 1", code, out, errOut)
	}
	if out != "published to big: confirmed 3, failed 0\n" {
		t.Fatalf("stdout %q; want the summary of the 3 lines before the long one", out)
	}
	if want := "sinew publish: stdin line 4: line too long: more than 1048576 bytes"; !strings.HasPrefix(errOut, want) ||
		strings.Count(errOut, "\n") != 1 {
		t.Fatalf("stderr %q; want one line starting %q", errOut, want)
	}
	// Much longer than the scanner's buffer: the same error.
	huge := strings.Repeat("y", 3*publishBodyBytesMax)
	code, out, errOut = runCmd(t, "c\n"+huge+"\n", "publish", "--addr", addr, "--topic", "big", "--json")
	if code != 1 || !strings.Contains(errOut, "published to big: confirmed 1, failed 0\n") ||
		!strings.Contains(errOut, "stdin line 2: line too long") {
		t.Fatalf("huge line: exit %d, out %q, err %q", code, out, errOut)
	}
	code, out, errOut = runCmd(t, "", "consume", "--addr", addr, "--topic", "big", "--idle-exit", "300ms")
	if code != 0 {
		t.Fatalf("consume exit %d: %s", code, errOut)
	}
	if got := strings.Split(strings.TrimSuffix(out, "\n"), "\n"); len(got) != 4 || got[0] != "a" || got[1] != full ||
		got[2] != "b" || got[3] != "c" {
		t.Fatalf("stored %d messages, want a, the full-size line, b, c", len(got))
	}
}

// TestPublishSummary: the summary ends every publish; with --json it goes
// to stderr so stdout stays JSON lines, and failures are counted.
func TestPublishSummary(t *testing.T) {
	addr := startClientTestBroker(t)
	code, out, errOut := runCmd(t, "1\n2\n", "publish", "--addr", addr, "--topic", "sum", "--json")
	if code != 0 || errOut != "published to sum: confirmed 2, failed 0\n" {
		t.Fatalf("--json: exit %d, stderr %q", code, errOut)
	}
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		var r publishResultJSON
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("stdout line %q is not a JSON result: %v", l, err)
		}
	}
	// The broker refuses every message to a topic with '/': each one in the
	// window fails, and the summary says so before the first error.
	code, out, errOut = runCmd(t, "1\n2\n3\n", "publish", "--addr", addr, "--topic", "no/such", "--window", "3")
	if code != 1 || out != "published to no/such: confirmed 0, failed 3\n" ||
		!strings.Contains(errOut, "message 1:") || !strings.Contains(errOut, "contains '/'") {
		t.Fatalf("refused topic: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	// No broker at all: the summary still ends the run, then the error.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := ln.Addr().String()
	ln.Close()
	code, out, errOut = runCmd(t, "1\n", "publish", "--addr", free, "--topic", "sum", "--connect-timeout", "1s")
	if code != 1 || out != "published to sum: confirmed 0, failed 0\n" || !strings.Contains(errOut, "unreachable") {
		t.Fatalf("unreachable: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestConnectTimeoutBoundsTheFirstConnect: against an address nobody serves,
// the command keeps retrying until --connect-timeout (longer than the five
// attempts it used to stop at), logs each failed attempt with its reason
// (with --verbose), and ends with one line saying the broker is unreachable.
func TestConnectTimeoutBoundsTheFirstConnect(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	free := ln.Addr().String()
	_ = ln.Close()
	code, _, errOut := runCmd(t, "", "publish", "--addr", free, "--topic", "t", "--connect-timeout", "2s", "--verbose")
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	last := lines[len(lines)-1]
	if code != 1 || !strings.Contains(last, "unreachable") || !strings.Contains(last, "deadline exceeded") {
		t.Fatalf("exit %d, last line %q; want exit 1, unreachable after the connect timeout", code, last)
	}
	attempts := strings.Count(errOut, "connect attempt failed")
	if attempts < 2 || strings.Count(errOut, "connection refused") < attempts {
		t.Fatalf("%d failed attempts logged, each with its reason?\n%s", attempts, errOut)
	}
}
