package main

import (
	"bytes"
	"encoding/json"
	"fmt"
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
	if code != 0 || !strings.Contains(out, "published 500 messages") {
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
	code, _, errOut = runCmd(t, "", "publish", "--addr", addr, "--topic", "gen", "--count", "10", "--no-confirm")
	if code != 0 {
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
		{[]string{"publish", "--addr", free, "--topic", "t", "--connect-timeout", "2s"}, 1, "unreachable"},
		{[]string{"consume", "--addr", addr, "--topic", "t", "--token", "wrong"}, 1, "rejected the credentials"},
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
	if code != 0 || !strings.Contains(out, fmt.Sprintf("published %d", 1)) {
		t.Fatalf("with the right token: exit %d, %q %q", code, out, errOut)
	}
}
