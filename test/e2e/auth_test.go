package e2e_test

import (
	"strings"
	"testing"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/vfs"
)

// TestServeAuthRules runs the real binary: `sinew serve` on an address that
// is not loopback, with no users, no tokens and no auth.allow_anonymous,
// exits 1 before it binds anything, naming the fixes. On loopback, a user in
// the data dir's store makes credentials required: `sinew publish` without
// them is refused, with --user and SINEW_PASSWORD it is served.
func TestServeAuthRules(t *testing.T) {
	bin := buildSinew(t)
	dir := t.TempDir()
	code, _, errOut := runSinew(t, bin, "", "serve", "--data-dir", dir, "--listen", "0.0.0.0:0", "--admin-listen", "")
	if code != 1 || !strings.Contains(errOut, "refusing to start") || !strings.Contains(errOut, "auth.allow_anonymous = true") ||
		strings.Contains(errOut, "msg=serving") {
		t.Fatalf("serve on 0.0.0.0 without auth: exit %d, stderr %q", code, errOut)
	}

	users, err := auth.OpenUsersParams(vfs.OS(), broker.UsersPath(dir), auth.HashParams{TimeCost: 1, MemoryKiB: 64, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Manage too: her publish creates the queue "t" on first use.
	if err := users.Add("alice", "correct horse", auth.Permissions{Publish: []string{"*"}, Manage: []string{"t"}}); err != nil {
		t.Fatal(err)
	}
	srv := startChildArgs(t, bin, dir)
	code, _, errOut = runSinew(t, bin, "x\n", "publish", "--addr", srv.addr, "--topic", "t")
	if code != 1 || !strings.Contains(errOut, "auth_failed") {
		t.Fatalf("publish without credentials: exit %d, stderr %q", code, errOut)
	}
	t.Setenv("SINEW_PASSWORD", "correct horse")
	code, out, errOut := runSinew(t, bin, "x\n", "publish", "--addr", srv.addr, "--topic", "t", "--user", "alice")
	if code != 0 || !strings.Contains(out, "confirmed 1") {
		t.Fatalf("publish as alice: exit %d, out %q, stderr %q", code, out, errOut)
	}
	stopChild(t, srv)
	logs := srv.log()
	if strings.Contains(logs, "correct horse") || !strings.Contains(logs, "authentication failed") {
		t.Fatalf("broker log: credential present or refusal missing:\n%s", logs)
	}
}
