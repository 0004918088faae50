package main

import (
	"strings"
	"testing"
)

// TestWrongPort: against a real broker, a client command pointed at the
// admin port and an admin command pointed at the client port each fail with
// one error that names the other port and the flag to use, instead of a
// handshake timeout or net/http's words for a malformed answer.
func TestWrongPort(t *testing.T) {
	addr, admin, _ := runServeAdmin(t, testServeConfig(t))

	code, _, errOut := runCmd(t, "x\n", "publish", "--addr", admin, "--topic", "t")
	if code == 0 || !strings.Contains(errOut, "admin (HTTP) listener") || !strings.Contains(errOut, "client listener at "+addr) ||
		!strings.Contains(errOut, "--addr") {
		t.Fatalf("publish to the admin port: exit %d, %s", code, errOut)
	}
	code, _, errOut = runCmd(t, "", "consume", "--addr", admin, "--topic", "t", "--count", "1")
	if code == 0 || !strings.Contains(errOut, "client listener at "+addr) {
		t.Fatalf("consume from the admin port: exit %d, %s", code, errOut)
	}

	code, _, errOut = runCmd(t, "", "admin", "queues", "--admin-addr", addr)
	if code == 0 || !strings.Contains(errOut, "client port") || !strings.Contains(errOut, "--admin-addr") {
		t.Fatalf("admin to the client port: exit %d, %s", code, errOut)
	}
	// The admin listener still serves HTTP.
	if code, out, errOut := runCmd(t, "", "admin", "queues", "--admin-addr", admin); code != 0 {
		t.Fatalf("admin queues: exit %d, %s %s", code, out, errOut)
	}
}
