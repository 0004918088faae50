package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/vfs"
)

// A non-loopback admin listener without authentication refuses to start,
// before anything is bound or recovered.
func TestServeRefusesOpenNonLoopbackAdmin(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0"} {
		cfg := testServeConfig(t)
		cfg.AdminListen = addr
		ctx, cancel := context.WithTimeout(context.Background(), safetyTimeoutMs*time.Millisecond)
		err := serve(ctx, cfg, slog.New(slog.DiscardHandler))
		cancel()
		if err == nil || !strings.Contains(err.Error(), "refusing to start") || !strings.Contains(err.Error(), "admin_listen") {
			t.Fatalf("admin_listen %s without auth: %v", addr, err)
		}
	}
}

func httpGetAuth(t *testing.T, url, authz string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, string(body)
}

// With auth configured the admin listener asks for credentials, loopback
// included: 401 without or with a wrong token, 200 with the right one;
// the probes stay open.
func TestServeAdminAuthTokens(t *testing.T) {
	cfg := testServeConfig(t)
	cfg.Auth.Tokens = []string{"tok-admin-0123456789abcdef0123456789"}
	_, adminAddr, _ := runServeAdmin(t, cfg)
	base := "http://" + adminAddr
	code, hdr, _ := httpGetAuth(t, base+"/api/v1/overview", "")
	if code != http.StatusUnauthorized || len(hdr.Values("WWW-Authenticate")) == 0 {
		t.Fatalf("without credentials: %d %v", code, hdr)
	}
	if code, _, _ := httpGetAuth(t, base+"/api/v1/overview", "Bearer wrong-token"); code != http.StatusUnauthorized {
		t.Fatalf("wrong token: %d", code)
	}
	if code, _, _ := httpGetAuth(t, base+"/metrics", ""); code != http.StatusUnauthorized {
		t.Fatalf("/metrics without credentials: %d", code)
	}
	code, _, body := httpGetAuth(t, base+"/api/v1/overview", "Bearer tok-admin-0123456789abcdef0123456789")
	if code != http.StatusOK || !strings.Contains(body, "owner_id") {
		t.Fatalf("right token: %d %s", code, body)
	}
	code, _, body = httpGetAuth(t, base+"/metrics", "Bearer tok-admin-0123456789abcdef0123456789")
	if code != http.StatusOK || !strings.Contains(body, `sinew_admin_auth_refusals_total{reason="failed"} 1`) ||
		!strings.Contains(body, `sinew_admin_auth_refusals_total{reason="missing"} 2`) {
		t.Fatalf("metrics: %d\n%s", code, body)
	}
	for _, p := range []string{"/healthz", "/readyz"} {
		if code, _, _ := httpGetAuth(t, base+p, ""); code != http.StatusOK {
			t.Fatalf("%s: %d", p, code)
		}
	}
}

// sinew admin sends the credentials it is given: --token or SINEW_TOKEN as
// a bearer token, --user with SINEW_PASSWORD as basic auth; without them a
// broker with auth configured refuses, and the error says what to pass.
func TestAdminCLICredentials(t *testing.T) {
	cfg := testServeConfig(t)
	cfg.Auth.Tokens = []string{"tok-admin-0123456789abcdef0123456789"}
	_, adminAddr, _ := runServeAdmin(t, cfg)
	t.Setenv("SINEW_TOKEN", "")
	t.Setenv("SINEW_USER", "")
	code, _, errOut := runCmd(t, "", "admin", "overview", "--admin-addr", adminAddr)
	if code == 0 || !strings.Contains(errOut, "unauthorized (HTTP 401)") || !strings.Contains(errOut, "SINEW_PASSWORD") {
		t.Fatalf("without credentials: exit %d, %q", code, errOut)
	}
	if code, out, errOut := runCmd(t, "", "admin", "overview", "--admin-addr", adminAddr, "--token", "tok-admin-0123456789abcdef0123456789"); code != 0 || !strings.Contains(out, "owner") {
		t.Fatalf("--token: exit %d, %q, %q", code, out, errOut)
	}
	t.Setenv("SINEW_TOKEN", "tok-admin-0123456789abcdef0123456789")
	if code, _, errOut := runCmd(t, "", "admin", "queues", "--admin-addr", adminAddr); code != 0 {
		t.Fatalf("SINEW_TOKEN: exit %d, %q", code, errOut)
	}
	if code, _, errOut := runCmd(t, "", "admin", "queues", "--admin-addr", adminAddr, "--token", "wrong-token"); code == 0 || !strings.Contains(errOut, "HTTP 401") {
		t.Fatalf("wrong --token: exit %d, %q", code, errOut)
	}
	t.Setenv("SINEW_TOKEN", "")
	if code, _, errOut := runCmd(t, "", "admin", "queues", "--admin-addr", adminAddr, "--user", "root"); code == 0 || !strings.Contains(errOut, "SINEW_PASSWORD") {
		t.Fatalf("--user without SINEW_PASSWORD: exit %d, %q", code, errOut)
	}
	if code, _, errOut := runCmd(t, "", "admin", "queues", "--admin-addr", adminAddr, "--user", "root", "--token", "x"); code == 0 || !strings.Contains(errOut, "not both") {
		t.Fatalf("--user and --token: exit %d, %q", code, errOut)
	}
	t.Setenv("SINEW_PASSWORD", "some-password")
	if code, _, errOut := runCmd(t, "", "admin", "queues", "--admin-addr", adminAddr, "--user", "root"); code == 0 || !strings.Contains(errOut, "HTTP 401") {
		t.Fatalf("--user unknown to the broker: exit %d, %q", code, errOut)
	}
}

// With users in the store, the admin listener takes basic auth: an
// administrator (manage "*") gets 200, a user limited to some topics 403, a
// wrong password 401; sinew admin sends --user with SINEW_PASSWORD.
func TestServeAdminAuthUsers(t *testing.T) {
	cfg := testServeConfig(t)
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	users, err := auth.OpenUsers(vfs.OS(), broker.UsersPath(cfg.DataDir))
	if err != nil {
		t.Fatal(err)
	}
	if err := users.Add("root", "root-password-1", auth.Permissions{Manage: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	if err := users.Add("orders", "orders-password-1", auth.Permissions{Publish: []string{"orders"}, Manage: []string{"orders"}}); err != nil {
		t.Fatal(err)
	}
	_, adminAddr, _ := runServeAdmin(t, cfg)
	base := "http://" + adminAddr
	basicAuth := func(user, password string) string {
		req, _ := http.NewRequest("GET", base, nil)
		req.SetBasicAuth(user, password)
		return req.Header.Get("Authorization")
	}
	for _, c := range []struct {
		name, authz string
		want        int
	}{
		{"none", "", http.StatusUnauthorized},
		{"wrong password", basicAuth("root", "root-password-2"), http.StatusUnauthorized},
		{"unknown user", basicAuth("nobody", "root-password-1"), http.StatusUnauthorized},
		{"administrator", basicAuth("root", "root-password-1"), http.StatusOK},
		{"user limited to one topic", basicAuth("orders", "orders-password-1"), http.StatusForbidden},
	} {
		if code, _, body := httpGetAuth(t, base+"/api/v1/queues", c.authz); code != c.want {
			t.Fatalf("%s: %d, want %d: %s", c.name, code, c.want, body)
		}
	}
	t.Setenv("SINEW_TOKEN", "")
	t.Setenv("SINEW_PASSWORD", "root-password-1")
	if code, _, errOut := runCmd(t, "", "admin", "queues", "--admin-addr", adminAddr, "--user", "root"); code != 0 {
		t.Fatalf("--user root: exit %d, %q", code, errOut)
	}
	t.Setenv("SINEW_PASSWORD", "wrong-password")
	if code, _, errOut := runCmd(t, "", "admin", "queues", "--admin-addr", adminAddr, "--user", "root"); code == 0 || !strings.Contains(errOut, "HTTP 401") {
		t.Fatalf("--user root, wrong password: exit %d, %q", code, errOut)
	}
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte("root-password-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := runCmd(t, "", "admin", "queues", "--admin-addr", adminAddr, "--user", "root", "--password-file", pwFile); code != 0 {
		t.Fatalf("--password-file: exit %d, %q", code, errOut)
	}
	if code, _, errOut := runCmd(t, "", "admin", "queues", "--admin-addr", adminAddr, "--password-file", pwFile); code == 0 || !strings.Contains(errOut, "needs --user") {
		t.Fatalf("--password-file without --user: exit %d, %q", code, errOut)
	}
}

// The admin listener's rule on a non-loopback address, without binding it:
// no auth refuses; a token or a user makes the gate ask for credentials;
// auth.allow_anonymous admits anonymous requests and warns. On loopback the
// gate is open until the first user is added.
func TestAdminGateRule(t *testing.T) {
	var logs strings.Builder
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	cfg := testServeConfig(t)
	cfg.AdminListen = "0.0.0.0:7655"
	users := openTestUsers(t, cfg.DataDir)
	if _, err := adminGate(cfg, users, logger); err == nil || !strings.Contains(err.Error(), "admin_listen") {
		t.Fatalf("no auth: %v", err)
	}
	withToken := cfg
	withToken.Auth.Tokens = []string{"tok-0123456789abcdef0123456789abcdef"}
	g, err := adminGate(withToken, users, logger)
	if err != nil || g.Anonymous() {
		t.Fatalf("token: %v, anonymous %v", err, g != nil && g.Anonymous())
	}
	anon := cfg
	anon.Auth.AllowAnonymous = true
	g, err = adminGate(anon, users, logger)
	if err != nil || !g.Anonymous() || !strings.Contains(logs.String(), "admin listener is not loopback-only") {
		t.Fatalf("allow_anonymous: %v, anonymous %v, log %q", err, g != nil && g.Anonymous(), logs.String())
	}
	lo := cfg
	lo.AdminListen = "127.0.0.1:7655"
	g, err = adminGate(lo, users, logger)
	if err != nil || !g.Anonymous() {
		t.Fatalf("loopback, no auth: %v", err)
	}
	if err := users.Add("root", "root-password-1", auth.Permissions{Manage: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	if g.Anonymous() {
		t.Fatal("loopback gate still open after the first user was added")
	}
	if _, err := adminGate(cfg, users, logger); err != nil {
		t.Fatalf("non-loopback with a user: %v", err)
	}
}
