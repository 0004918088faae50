package main

import (
	"net"
	"strings"
	"testing"
)

// TestUnreachableBrokerOneLine: with no broker at --addr, a client command
// prints its one error line (after publish's documented summary) and no
// warning per failed connect attempt; --verbose shows the attempts.
func TestUnreachableBrokerOneLine(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: every dial is refused

	code, out, errOut := runCmd(t, "", "consume", "--addr", addr, "--topic", "t", "--connect-timeout", "500ms")
	if code != 1 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "unreachable") ||
		!strings.Contains(errOut, "connection refused") || strings.Contains(errOut, "WARN") {
		t.Fatalf("consume: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, errOut = runCmd(t, "x\n", "publish", "--addr", addr, "--topic", "t", "--connect-timeout", "500ms")
	if code != 1 || out != "published to t: confirmed 0, failed 0\n" || strings.Count(errOut, "\n") != 1 || strings.Contains(errOut, "WARN") {
		t.Fatalf("publish: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, _, errOut = runCmd(t, "", "consume", "--addr", addr, "--topic", "t", "--connect-timeout", "500ms", "--verbose")
	if code != 1 || !strings.Contains(errOut, "connect attempt failed") {
		t.Fatalf("consume --verbose: exit %d, stderr %q", code, errOut)
	}
}
