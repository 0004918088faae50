package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
)

const usersTestToken = "tok-admin-0123456789abcdef0123456789"

// adminUser runs `sinew admin user ARGS` against adminAddr with the admin
// token, and checks that no password appears in what it printed.
func adminUser(t *testing.T, adminAddr, stdin string, args ...string) (int, string, string) {
	t.Helper()
	full := append([]string{"admin", "user"}, args...)
	if adminAddr != "" {
		full = append(full, "--admin-addr", adminAddr, "--token", usersTestToken)
	}
	code, out, errOut := runCmd(t, stdin, full...)
	for _, pw := range []string{"first password", "second password"} {
		if strings.Contains(out+errOut, pw) {
			t.Fatalf("admin user %v printed a password: %q %q", args, out, errOut)
		}
	}
	return code, out, errOut
}

// publishAs publishes one message as user with password (SINEW_PASSWORD)
// and returns the exit code and stderr.
func publishAs(t *testing.T, addr, user, password, topic string) (int, string) {
	t.Helper()
	t.Setenv("SINEW_PASSWORD", password)
	code, _, errOut := runCmd(t, "x\n", "publish", "--addr", addr, "--topic", topic, "--user", user)
	t.Setenv("SINEW_PASSWORD", "")
	return code, errOut
}

// TestAdminUserLifecycle: against the real broker, through the CLI and the
// admin API: add a user with permissions (password on stdin) -> it logs in
// and may publish only where granted -> passwd (password in
// SINEW_NEW_PASSWORD) -> the old password is refused, the new one works ->
// grant widens, revoke narrows -> remove -> refused. The API's errors have
// its usual shape and no answer or output holds a password.
func TestAdminUserLifecycle(t *testing.T) {
	cfg := testServeConfig(t)
	cfg.Auth.Tokens = []string{usersTestToken}
	addr, admin, _ := runServeAdmin(t, cfg)

	code, out, errOut := adminUser(t, admin, "first password\n", "add", "alice", "--publish", "orders.*", "--consume", "orders.*", "--password-stdin")
	if code != 0 || !strings.Contains(out, "added user") || !strings.Contains(out, "publish orders.*; consume orders.*; manage -") {
		t.Fatalf("add: exit %d, %q, %s", code, out, errOut)
	}
	// Creating a queue needs manage, which alice lacks: the token creates
	// the queues she publishes to.
	for _, topic := range []string{"orders.eu", "payments"} {
		if code, _, errOut := runCmd(t, "x\n", "publish", "--addr", addr, "--topic", topic, "--token", usersTestToken); code != 0 {
			t.Fatalf("token publish %s: exit %d, %s", topic, code, errOut)
		}
	}
	if code, errOut := publishAs(t, addr, "alice", "first password", "orders.eu"); code != 0 {
		t.Fatalf("alice publish orders.eu: exit %d, %s", code, errOut)
	}
	if code, errOut := publishAs(t, addr, "alice", "first password", "payments"); code == 0 || !strings.Contains(errOut, "permission_denied") {
		t.Fatalf("alice publish payments: exit %d, %s", code, errOut)
	}

	t.Setenv("SINEW_NEW_PASSWORD", "second password")
	code, out, errOut = adminUser(t, admin, "", "passwd", "alice")
	t.Setenv("SINEW_NEW_PASSWORD", "")
	if code != 0 || !strings.Contains(out, "password of alice changed") {
		t.Fatalf("passwd: exit %d, %q, %s", code, out, errOut)
	}
	if code, errOut := publishAs(t, addr, "alice", "first password", "orders.eu"); code == 0 || !strings.Contains(errOut, "auth_failed") {
		t.Fatalf("old password: exit %d, %s", code, errOut)
	}
	if code, errOut := publishAs(t, addr, "alice", "second password", "orders.eu"); code != 0 {
		t.Fatalf("new password: exit %d, %s", code, errOut)
	}

	code, out, errOut = adminUser(t, admin, "", "grant", "alice", "--publish", "payments", "--publish", "orders.*")
	if code != 0 || !strings.Contains(out, "publish orders.* payments;") {
		t.Fatalf("grant: exit %d, %q, %s", code, out, errOut)
	}
	if code, errOut := publishAs(t, addr, "alice", "second password", "payments"); code != 0 {
		t.Fatalf("publish after grant: exit %d, %s", code, errOut)
	}
	code, out, errOut = adminUser(t, admin, "", "revoke", "alice", "--publish", "orders.*")
	if code != 0 || !strings.Contains(out, "publish payments;") {
		t.Fatalf("revoke: exit %d, %q, %s", code, out, errOut)
	}
	if code, errOut := publishAs(t, addr, "alice", "second password", "orders.eu"); code == 0 || !strings.Contains(errOut, "permission_denied") {
		t.Fatalf("publish after revoke: exit %d, %s", code, errOut)
	}

	code, out, errOut = adminUser(t, admin, "", "list", "--json")
	var list struct {
		Users []struct {
			Name        string              `json:"name"`
			Permissions map[string][]string `json:"permissions"`
		} `json:"users"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list.Users) != 1 || list.Users[0].Name != "alice" ||
		strings.Contains(out, "key") || strings.Contains(out, "salt") {
		t.Fatalf("list --json: exit %d, %q, %s", code, out, errOut)
	}
	if p := list.Users[0].Permissions; len(p["publish"]) != 1 || len(p["consume"]) != 1 || p["manage"] == nil {
		t.Fatalf("permissions %v: want every list present", p)
	}

	// The API's own errors, in its usual shape.
	for _, c := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"POST", "/api/v1/users", `{"name":"alice","password":"whatever123"}`, http.StatusConflict, "conflict"},
		{"POST", "/api/v1/users", `{"name":"bob","password":"short"}`, http.StatusBadRequest, "bad_request"},
		{"POST", "/api/v1/users", `{"name":"bob","password":"long enough","permissions":{"publish":["a*b"]}}`, http.StatusBadRequest, "bad_request"},
		{"POST", "/api/v1/users", `{"name":"bob","password":"long enough","admin":true}`, http.StatusBadRequest, "bad_request"},
		{"PUT", "/api/v1/users/nobody/password", `{"password":"long enough"}`, http.StatusNotFound, "not_found"},
		{"PUT", "/api/v1/users/nobody/permissions", `{}`, http.StatusNotFound, "not_found"},
		{"DELETE", "/api/v1/users/nobody", ``, http.StatusNotFound, "not_found"},
		{"GET", "/api/v1/users/nobody", ``, http.StatusNotFound, "not_found"},
	} {
		req, _ := http.NewRequest(c.method, "http://"+admin+c.path, strings.NewReader(c.body))
		req.Header.Set("Authorization", "Bearer "+usersTestToken)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var eb struct{ Code, Error string }
		json.NewDecoder(res.Body).Decode(&eb)
		res.Body.Close()
		if res.StatusCode != c.status || eb.Code != c.code || eb.Error == "" || strings.Contains(eb.Error, "short") {
			t.Errorf("%s %s %s: %d %+v, want %d %s", c.method, c.path, c.body, res.StatusCode, eb, c.status, c.code)
		}
	}
	// Concurrent grants through PATCH lose nothing: each is one atomic
	// read-change-write on the broker.
	const grants = 16
	var wg sync.WaitGroup
	statuses := make([]int, grants)
	for i := range grants {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"grant":{"consume":["c%d.*"]}}`, i)
			req, _ := http.NewRequest("PATCH", "http://"+admin+"/api/v1/users/alice/permissions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+usersTestToken)
			if res, err := http.DefaultClient.Do(req); err == nil {
				statuses[i] = res.StatusCode
				res.Body.Close()
			}
		}()
	}
	wg.Wait()
	code, out, errOut = adminUser(t, admin, "", "show", "alice", "--json")
	var shown struct {
		Permissions struct{ Consume []string } `json:"permissions"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &shown) != nil || len(shown.Permissions.Consume) != grants+1 {
		t.Fatalf("after %d concurrent grants (statuses %v): exit %d, %s %s", grants, statuses, code, out, errOut)
	}

	// Without the admin's credentials, nothing.
	if code, _, errOut := runCmd(t, "", "admin", "user", "list", "--admin-addr", admin); code == 0 || !strings.Contains(errOut, "unauthorized") {
		t.Fatalf("list without credentials: exit %d, %s", code, errOut)
	}

	code, out, errOut = adminUser(t, admin, "", "remove", "alice")
	if code != 0 || !strings.Contains(out, "removed user alice") {
		t.Fatalf("remove: exit %d, %q, %s", code, out, errOut)
	}
	if code, errOut := publishAs(t, addr, "alice", "second password", "payments"); code == 0 || !strings.Contains(errOut, "auth_failed") {
		t.Fatalf("removed user: exit %d, %s", code, errOut)
	}
	if code, _, errOut := adminUser(t, admin, "", "remove", "alice"); code == 0 || !strings.Contains(errOut, "not_found") {
		t.Fatalf("remove twice: exit %d, %s", code, errOut)
	}
	_, _, body := httpGetAuth(t, "http://"+admin+"/metrics", "Bearer "+usersTestToken)
	if !strings.Contains(body, "\nsinew_permission_denials_total 2\n") {
		t.Fatalf("metrics: want sinew_permission_denials_total 2 in\n%s", body)
	}
}

// TestAdminUserPasswordSources: the new password comes only from stdin
// (--password-stdin) or SINEW_NEW_PASSWORD; without either, or with an
// empty first line, the command refuses before it changes anything, and
// there is no flag that takes a password.
func TestAdminUserPasswordSources(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("SINEW_NEW_PASSWORD", "")
	for _, c := range []struct {
		stdin string
		args  []string
	}{
		{"", []string{"add", "bob", "--data-dir", dir}},
		{"\nsecond line\n", []string{"add", "bob", "--data-dir", dir, "--password-stdin"}},
		{"", []string{"add", "bob", "--data-dir", dir, "--password", "first password"}},
		{"first password\n", []string{"add", "bob", "--data-dir", dir, "--password-stdin", "--publish", "a*b"}},
		{"first password\n", []string{"add", "--data-dir", dir, "--password-stdin"}},
	} {
		code, _, errOut := adminUser(t, "", c.stdin, c.args...)
		if code != 2 || errOut == "" {
			t.Errorf("%v: exit %d, %s; want a usage error", c.args, code, errOut)
		}
	}
	if code, out, _ := adminUser(t, "", "", "list", "--data-dir", dir); code != 0 || strings.Contains(out, "bob") {
		t.Fatalf("a refused add changed the store: exit %d, %q", code, out)
	}
}

// TestAdminUserOfflineBootstrap: the first user of a broker that will listen
// on a public address is added offline, in its data dir; the startup rule
// then passes, the broker requires that user's credentials, and while it
// runs the offline path refuses at once, naming the lock.
func TestAdminUserOfflineBootstrap(t *testing.T) {
	cfg := testServeConfig(t)
	public := cfg
	public.Listen = "0.0.0.0:0"
	logger := slog.New(slog.DiscardHandler)
	if err := checkListenAuth(public, openTestUsers(t, cfg.DataDir), logger); err == nil {
		t.Fatal("a public listener without users passed the startup rule")
	}

	code, out, errOut := adminUser(t, "", "first password\n", "add", "root", "--manage", "*", "--publish", "*", "--consume", "*",
		"--password-stdin", "--data-dir", cfg.DataDir)
	if code != 0 || !strings.Contains(out, "data dir "+cfg.DataDir) {
		t.Fatalf("offline add: exit %d, %q, %s", code, out, errOut)
	}
	if err := checkListenAuth(public, openTestUsers(t, cfg.DataDir), logger); err != nil {
		t.Fatalf("startup rule with a user: %v", err)
	}

	addr, _, stop := runServeAdmin(t, cfg)
	if code, errOut := publishAs(t, addr, "", "", "t"); code == 0 {
		t.Fatalf("anonymous publish served with a user configured: %s", errOut)
	}
	if code, errOut := publishAs(t, addr, "root", "first password", "t"); code != 0 {
		t.Fatalf("root publish: exit %d, %s", code, errOut)
	}
	code, _, errOut = adminUser(t, "", "", "list", "--data-dir", cfg.DataDir)
	if code == 0 || !strings.Contains(errOut, "locked") || !strings.Contains(errOut, "admin API") {
		t.Fatalf("offline list while the broker runs: exit %d, %s", code, errOut)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = adminUser(t, "", "", "list", "--data-dir", cfg.DataDir)
	if code != 0 || !strings.Contains(out, "root") || !strings.Contains(out, "*") {
		t.Fatalf("offline list after stop: exit %d, %q, %s", code, out, errOut)
	}
}

// TestAdminUserFirstUserFlow runs the commands security.md shows against a
// loopback broker with no users: the first add needs no credentials and says
// that the admin API now asks for them, naming --user; the next adds pass
// the administrator's credentials as the note says and succeed, while an add
// without them is refused with a message naming the flags.
func TestAdminUserFirstUserFlow(t *testing.T) {
	cfg := testServeConfig(t)
	_, admin, _ := runServeAdmin(t, cfg)
	run := func(stdin string, args ...string) (int, string, string) {
		t.Helper()
		return runCmd(t, stdin, append(append([]string{"admin", "user"}, args...), "--admin-addr", admin)...)
	}

	code, out, errOut := run("ops password\n", "add", "ops", "--manage", "*", "--consume", "*", "--publish", "*", "--password-stdin")
	if code != 0 || !strings.Contains(out, "added user") {
		t.Fatalf("first add: exit %d, %q, %s", code, out, errOut)
	}
	if !strings.Contains(errOut, "now asks for credentials") || !strings.Contains(errOut, "--user ops") {
		t.Fatalf("first add said nothing of the credentials the next command needs: %q", errOut)
	}
	code, _, errOut = run("orders password\n", "add", "orders-api", "--publish", "orders.*", "--password-stdin")
	if code == 0 || !strings.Contains(errOut, "HTTP 401") || !strings.Contains(errOut, "--user") {
		t.Fatalf("add without credentials: exit %d, %s", code, errOut)
	}
	t.Setenv("SINEW_USER", "ops")
	t.Setenv("SINEW_PASSWORD", "ops password")
	for _, args := range [][]string{
		{"add", "orders-api", "--publish", "orders.*", "--password-stdin"},
		{"add", "billing", "--consume", "orders.*", "--publish", "invoices.*", "--password-stdin"},
	} {
		code, out, errOut := run("service password\n", args...)
		if code != 0 || !strings.Contains(out, "added user") || strings.Contains(errOut, "note:") {
			t.Fatalf("%v as ops: exit %d, %q, %s", args, code, out, errOut)
		}
	}
}
