package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/testkit"
	"github.com/sinewmq/sinew/internal/vfs"
)

// TestServeRefusesPublicListenerWithoutAuth: serve on an address that is not
// loopback, with no users, no tokens and no auth.allow_anonymous, refuses to
// start and names the fixes; tokens, a user, or allow_anonymous (with a
// warning) satisfy the rule. Only the refusal runs serve itself: the others
// check the rule without binding a public address.
func TestServeRefusesPublicListenerWithoutAuth(t *testing.T) {
	cfg := testServeConfig(t)
	cfg.Listen = "0.0.0.0:0"
	err := serve(t.Context(), cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "refusing to start") || !strings.Contains(err.Error(), "auth.allow_anonymous = true") ||
		!strings.Contains(err.Error(), `"0.0.0.0:0"`) {
		t.Fatalf("serve on 0.0.0.0 without auth = %v, want a refusal naming the fixes", err)
	}

	empty := openTestUsers(t, cfg.DataDir)
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	withTokens := cfg
	withTokens.Auth.Tokens = []string{"startup-rule-token-0123456789abcdef"}
	if err := checkListenAuth(withTokens, empty, logger); err != nil {
		t.Fatalf("tokens set: %v", err)
	}
	anon := cfg
	anon.Auth.AllowAnonymous = true
	if err := checkListenAuth(anon, empty, logger); err != nil {
		t.Fatalf("allow_anonymous: %v", err)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "auth.allow_anonymous") {
		t.Fatalf("allow_anonymous on a public address did not warn:\n%s", logs.String())
	}
	if err := empty.Add("alice", "password1", auth.Permissions{}); err != nil {
		t.Fatal(err)
	}
	if err := checkListenAuth(cfg, empty, logger); err != nil {
		t.Fatalf("a user exists: %v", err)
	}
	// Loopback needs nothing and warns about nothing.
	logs.Reset()
	lo := testServeConfig(t)
	if err := checkListenAuth(lo, openTestUsers(t, lo.DataDir), logger); err != nil || logs.Len() != 0 {
		t.Fatalf("loopback: %v, log %q", err, logs.String())
	}
}

func openTestUsers(t *testing.T, dataDir string) *auth.Users {
	t.Helper()
	u, err := auth.OpenUsersParams(vfs.OS(), broker.UsersPath(dataDir), testkit.UserHashParams)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestServeUserLoginAndCLI: a user in the data dir's store makes the real
// serve require credentials on loopback; the CLI logs in with --user and
// SINEW_PASSWORD or --password-file, never a password flag; refusals are
// counted in sinew_auth_failures_total.
func TestServeUserLoginAndCLI(t *testing.T) {
	cfg := testServeConfig(t)
	users := openTestUsers(t, cfg.DataDir)
	// Manage on "t": her first publish creates that queue.
	if err := users.Add("alice", "correct horse", auth.Permissions{Publish: []string{"*"}, Consume: []string{"*"}, Manage: []string{"t"}}); err != nil {
		t.Fatal(err)
	}
	// The admin listener asks for credentials too once a user exists.
	if err := users.Add("root", "root password", auth.Permissions{Manage: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	addr, adminAddr, _ := runServeAdmin(t, cfg)

	code, _, errOut := runCmd(t, "x\n", "publish", "--addr", addr, "--topic", "t")
	if code == 0 || !strings.Contains(errOut, "rejected the credentials") {
		t.Fatalf("no credentials: exit %d, %s", code, errOut)
	}
	t.Setenv("SINEW_PASSWORD", "wrong horse")
	code, _, errOut = runCmd(t, "x\n", "publish", "--addr", addr, "--topic", "t", "--user", "alice")
	if code == 0 || !strings.Contains(errOut, "auth_failed") || strings.Contains(errOut, "wrong horse") {
		t.Fatalf("wrong password: exit %d, %s", code, errOut)
	}
	t.Setenv("SINEW_PASSWORD", "correct horse")
	if code, _, errOut = runCmd(t, "via env\n", "publish", "--addr", addr, "--topic", "t", "--user", "alice"); code != 0 {
		t.Fatalf("SINEW_PASSWORD: exit %d, %s", code, errOut)
	}
	t.Setenv("SINEW_PASSWORD", "")
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("correct horse\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut = runCmd(t, "via file\n", "publish", "--addr", addr, "--topic", "t", "--user", "alice", "--password-file", pwFile); code != 0 {
		t.Fatalf("--password-file: exit %d, %s", code, errOut)
	}
	code, out, errOut := runCmd(t, "", "consume", "--addr", addr, "--topic", "t", "--count", "2", "--user", "alice", "--password-file", pwFile)
	if code != 0 || !strings.Contains(out, "via env") || !strings.Contains(out, "via file") {
		t.Fatalf("consume: exit %d, %q, %s", code, out, errOut)
	}
	for _, args := range [][]string{
		{"--user", "alice"}, // no password anywhere
		{"--user", "alice", "--token", "t", "--password-file", pwFile},
		{"--password-file", pwFile},
		{"--password", "correct horse"}, // there is no such flag
	} {
		code, _, errOut := runCmd(t, "x\n", append([]string{"publish", "--addr", addr, "--topic", "t"}, args...)...)
		if code == 0 || strings.Contains(errOut, "correct horse") {
			t.Fatalf("%v: exit %d, %s", args, code, errOut)
		}
	}
	req, _ := http.NewRequest("GET", "/", nil)
	req.SetBasicAuth("root", "root password")
	samples, _ := scrapeAs(t, adminAddr, req.Header.Get("Authorization"))
	if got := samples["sinew_auth_failures_total"]; got != 2 {
		t.Fatalf("sinew_auth_failures_total = %v, want 2", got)
	}
}

// TestBenchLogsIn: sinew bench logs in like the other client commands, with
// --user and SINEW_PASSWORD or --password-file, or --token; without
// credentials, or with a wrong password, the broker refuses it.
func TestBenchLogsIn(t *testing.T) {
	cfg := testServeConfig(t)
	cfg.Auth.Tokens = []string{"bench-token-0123456789abcdef0123456789"}
	users := openTestUsers(t, cfg.DataDir)
	// bench declares its queue: it needs manage on its topics.
	if err := users.Add("bencher", "bench password", auth.Permissions{Publish: []string{"bench-*"}, Consume: []string{"bench-*"}, Manage: []string{"bench-*"}}); err != nil {
		t.Fatal(err)
	}
	addr, _, _ := runServeAdmin(t, cfg)
	bench := func(args ...string) (int, string, string) {
		t.Helper()
		return runCmd(t, "", append([]string{"bench", "publish", "--addr", addr, "--duration", "200ms", "--warmup", "0s", "--quiet", "--json"}, args...)...)
	}
	benched := func(what string, code int, out, errOut string) {
		t.Helper()
		var res struct{ Messages int64 }
		if code != 0 || json.Unmarshal([]byte(out), &res) != nil || res.Messages == 0 {
			t.Fatalf("%s: exit %d, out %q, stderr %s", what, code, out, errOut)
		}
	}

	if code, _, errOut := bench(); code == 0 || !strings.Contains(errOut, "auth_failed") {
		t.Fatalf("no credentials: exit %d, %s", code, errOut)
	}
	t.Setenv("SINEW_PASSWORD", "wrong password")
	if code, _, errOut := bench("--user", "bencher"); code == 0 || !strings.Contains(errOut, "auth_failed") || strings.Contains(errOut, "wrong password") {
		t.Fatalf("wrong password: exit %d, %s", code, errOut)
	}
	t.Setenv("SINEW_PASSWORD", "bench password")
	code, out, errOut := bench("--user", "bencher")
	benched("SINEW_PASSWORD", code, out, errOut)
	t.Setenv("SINEW_PASSWORD", "")

	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("bench password\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = bench("--user", "bencher", "--password-file", pwFile)
	benched("--password-file", code, out, errOut)
	code, out, errOut = bench("--token", "bench-token-0123456789abcdef0123456789")
	benched("--token", code, out, errOut)
	if code, _, errOut := bench("--user", "bencher", "--token", "bench-token-0123456789abcdef0123456789", "--password-file", pwFile); code == 0 || !strings.Contains(errOut, "not both") {
		t.Fatalf("--user and --token: exit %d, %s", code, errOut)
	}
}
