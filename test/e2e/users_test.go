package e2e_test

import (
	"os"
	"strings"
	"testing"
)

// TestUsersOfflineBootstrapAndPermissions runs the real binary: the first
// users are added offline in a data dir (sinew admin user add --data-dir,
// password on stdin, users file 0600); the broker started on that data dir
// (on loopback; the startup rule for public listeners is covered by
// cmd/sinew TestAdminUserOfflineBootstrap) requires credentials and
// enforces each user's topic patterns (creating a queue on first use
// needs manage), and while it runs the offline path is refused because
// another process holds the data dir's lock. No password reaches the
// broker's log or the commands' output.
func TestUsersOfflineBootstrapAndPermissions(t *testing.T) {
	bin := buildSinew(t)
	dir := t.TempDir()
	const rootPW, alicePW = "root password 1", "alice password 1"
	add := func(stdin string, args ...string) {
		t.Helper()
		code, out, errOut := runSinew(t, bin, stdin, append([]string{"admin", "user", "add"}, append(args, "--password-stdin", "--data-dir", dir)...)...)
		if code != 0 || strings.Contains(out+errOut, stdin[:len(stdin)-1]) {
			t.Fatalf("add %v: exit %d, %q, %q", args, code, out, errOut)
		}
	}
	add(rootPW+"\n", "root", "--manage", "*", "--publish", "*", "--consume", "*")
	add(alicePW+"\n", "alice", "--publish", "orders.*", "--consume", "orders.*")
	if fi, err := os.Stat(dir + "/meta/users"); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("users file: %v %v", fi, err)
	}

	srv := startChildArgs(t, bin, dir)
	publish := func(user, pw, topic string) (int, string) {
		t.Helper()
		t.Setenv("SINEW_PASSWORD", pw)
		code, _, errOut := runSinew(t, bin, "x\n", "publish", "--addr", srv.addr, "--topic", topic, "--user", user)
		return code, errOut
	}
	if code, errOut := publish("", "", "orders.eu"); code != 1 || !strings.Contains(errOut, "auth_failed") {
		t.Fatalf("anonymous: exit %d, %s", code, errOut)
	}
	// Creating a queue needs manage: alice may publish to orders.* but
	// not create orders.eu; root creates it, and then she publishes.
	if code, errOut := publish("alice", alicePW, "orders.eu"); code != 1 ||
		!strings.Contains(errOut, `queue "orders.eu" does not exist and creating it needs manage on topic "orders.eu"`) {
		t.Fatalf("alice creating orders.eu: exit %d, %s", code, errOut)
	}
	if code, errOut := publish("root", rootPW, "orders.eu"); code != 0 {
		t.Fatalf("root orders.eu: exit %d, %s", code, errOut)
	}
	if code, errOut := publish("alice", alicePW, "orders.eu"); code != 0 {
		t.Fatalf("alice orders.eu: exit %d, %s", code, errOut)
	}
	if code, errOut := publish("alice", alicePW, "payments"); code != 1 || !strings.Contains(errOut, "permission_denied") {
		t.Fatalf("alice payments: exit %d, %s", code, errOut)
	}
	if code, errOut := publish("root", rootPW, "payments"); code != 0 {
		t.Fatalf("root payments: exit %d, %s", code, errOut)
	}
	t.Setenv("SINEW_PASSWORD", "")
	code, _, errOut := runSinew(t, bin, "", "admin", "user", "list", "--data-dir", dir)
	if code != 1 || !strings.Contains(errOut, "is locked by another process (pid ") {
		t.Fatalf("offline list while serving: exit %d, %s", code, errOut)
	}
	stopChild(t, srv)
	if logs := srv.log(); strings.Contains(logs, rootPW) || strings.Contains(logs, alicePW) {
		t.Fatalf("a password reached the broker log:\n%s", logs)
	}
	code, out, errOut := runSinew(t, bin, "", "admin", "user", "list", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "alice") || !strings.Contains(out, "orders.*") || !strings.Contains(out, "root") {
		t.Fatalf("offline list after stop: exit %d, %q, %s", code, out, errOut)
	}
}
