package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/sinewmq/sinew/internal/auth"
)

// sinew auth token prints tokens that sinew serve accepts, each different;
// a bad count or a missing subcommand is a usage error.
func TestAuthTokenCommand(t *testing.T) {
	code, out, errOut := runCmd(t, "", "auth", "token")
	tok := strings.TrimSuffix(out, "\n")
	if code != 0 || errOut != "" || strings.Count(out, "\n") != 1 || len(tok) != 64 {
		t.Fatalf("sinew auth token: exit %d, out %q, stderr %q", code, out, errOut)
	}
	if err := auth.CheckToken(tok); err != nil {
		t.Fatalf("generated token refused: %v", err)
	}
	code, out, _ = runCmd(t, "", "auth", "token", "--count", "3")
	lines := strings.Fields(out)
	if code != 0 || len(lines) != 3 || lines[0] == lines[1] || lines[1] == lines[2] || lines[0] == tok {
		t.Fatalf("--count 3: exit %d, out %q", code, out)
	}
	for _, args := range [][]string{{"auth"}, {"auth", "tokens"}, {"auth", "token", "--count", "0"}, {"auth", "token", "--count", "101"}, {"auth", "token", "extra"}} {
		if code, _, errOut := runCmd(t, "", args...); code != 2 || !strings.Contains(errOut, "usage") {
			t.Fatalf("%v: exit %d, stderr %q, want a usage error", args, code, errOut)
		}
	}
	if code, _, errOut := runCmd(t, "", "auth", "--help"); code != 0 || !strings.Contains(errOut, "sinew auth token") {
		t.Fatalf("auth --help: exit %d, stderr %q", code, errOut)
	}
}

// sinew serve refuses a token too short to carry 128 bits before it binds
// anything, naming the token's position and how to generate one, never the
// token itself; serve() itself refuses one whatever its caller checked.
func TestServeRefusesShortToken(t *testing.T) {
	// With the context already ended, a serve that did not refuse would
	// start and return nil rather than run on.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	cfg := testServeConfig(t)
	cfg.Auth.Tokens = []string{"t"}
	err := serve(ctx, cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "refusing to start: auth.tokens: token 1 of 1") {
		t.Fatalf("serve() with a 1-character token: %v", err)
	}

	good := auth.GenerateToken()
	code, out, errOut := runCmd(t, "", "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--admin-listen", "",
		"--auth-tokens", good+",hunter2")
	if code != 2 || strings.Contains(errOut, "msg=serving") || !strings.Contains(errOut, "auth.tokens: token 2 of 2") ||
		!strings.Contains(errOut, "at least 32") || !strings.Contains(errOut, "sinew auth token") {
		t.Fatalf("serve with a 7-character token: exit %d, out %q, stderr %q", code, out, errOut)
	}
	if strings.Contains(errOut, "hunter2") || strings.Contains(errOut, good) {
		t.Fatalf("the refusal shows a token: %q", errOut)
	}
}
