package admin

import (
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/vfs"
)

// FuzzGateAuthorization sends one request with an arbitrary Authorization
// header through a Gate with users and tokens configured. The gate must
// never panic, must answer 200, 401, 403 or 429 only, must challenge every
// 401, and must let a request through only with a token of auth.tokens or
// the basic credentials of an administrator. The seed corpus runs as a
// plain test in go test.
func FuzzGateAuthorization(f *testing.F) {
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	for _, h := range []string{
		"", "Bearer " + adminToken, "bearer " + adminToken, "BEARER  " + adminToken + " ", "Bearer " + adminToken + "x",
		"Bearer", "Bearer ", "Bearer other-token-xxxxxxxxxxxx",
		"Basic " + b64("root:"+rootPassword), "basic " + b64("root:"+rootPassword), "Basic " + b64("root:wrong"),
		"Basic " + b64("reader:"+readerPassword), "Basic " + b64("root"), "Basic " + b64(":"), "Basic " + b64("root:"+rootPassword+":x"),
		"Basic !!!", "Basic", "Basic ", "Basic " + b64("root:" + rootPassword)[:10], "Digest username=root",
		"Negotiate abc", " ", "\x00", "Bearer \xff\xfe", strings.Repeat("A", authHeaderBytesMax+1),
		"Basic " + b64(strings.Repeat("u", 200)+":"+rootPassword),
	} {
		f.Add(h)
	}
	users, err := auth.OpenUsersParams(vfs.NewMem(), "/data/meta/users", auth.HashParams{TimeCost: 1, MemoryKiB: 64, Threads: 1})
	if err != nil {
		f.Fatal(err)
	}
	if err := users.Add("root", rootPassword, auth.Permissions{Manage: []string{"*"}}); err != nil {
		f.Fatal(err)
	}
	if err := users.Add("reader", readerPassword, auth.Permissions{Manage: []string{"orders.*"}}); err != nil {
		f.Fatal(err)
	}
	g := &Gate{Users: users, Tokens: []string{"other-token-xxxxxxxxxxxx", adminToken}, FailureDelayMs: -1}
	h := g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p, ok := PrincipalFrom(r.Context()); !ok || !IsAdmin(p) {
			t := "handler reached without an administrator"
			http.Error(w, t, http.StatusTeapot)
		}
	}))

	f.Fuzz(func(t *testing.T, hdr string) {
		req := httptest.NewRequest("GET", "/api/v1/version", nil)
		req.RemoteAddr = "10.0.0.1:1000"
		if hdr != "" {
			req.Header["Authorization"] = []string{hdr}
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK:
			scheme, cred, _ := strings.Cut(hdr, " ")
			cred = strings.TrimSpace(cred)
			raw, _ := base64.StdEncoding.DecodeString(cred)
			token := strings.EqualFold(scheme, "Bearer") && (cred == adminToken || cred == "other-token-xxxxxxxxxxxx")
			basic := strings.EqualFold(scheme, "Basic") && string(raw) == "root:"+rootPassword
			if !token && !basic {
				t.Fatalf("Authorization %q let through", hdr)
			}
		case http.StatusUnauthorized:
			if len(rec.Header().Values("WWW-Authenticate")) != 2 {
				t.Fatalf("Authorization %q: 401 without the challenges", hdr)
			}
		case http.StatusForbidden, http.StatusTooManyRequests:
		default:
			t.Fatalf("Authorization %q: status %d %s", hdr, rec.Code, rec.Body)
		}
	})
}

// FuzzLoopbackHost checks that LoopbackHost never panics and accepts only
// the loopback spellings: a name that passes starts with localhost, 127. or
// a bracketed IPv6 address, and has at most a numeric port after it.
func FuzzLoopbackHost(f *testing.F) {
	for _, h := range []string{"localhost", "localhost:7655", "127.0.0.1:7655", "[::1]:7655", "[::ffff:127.0.0.1]",
		"attacker.example", "127.0.0.1.nip.io", "localhost.", "[::1", "", ":", "[]:", "127.0.0.1:99999", "0x7f.1"} {
		f.Add(h)
	}
	f.Fuzz(func(t *testing.T, host string) {
		if !LoopbackHost(host) {
			return
		}
		l := strings.ToLower(host)
		if !strings.HasPrefix(l, "localhost") && !strings.HasPrefix(l, "127.") && !strings.HasPrefix(l, "[") {
			t.Fatalf("LoopbackHost(%q) = true", host)
		}
		name := l
		if i := strings.LastIndexByte(l, ']'); i >= 0 {
			name = l[:i+1]
		} else if n, _, ok := strings.Cut(l, ":"); ok {
			name = n
		}
		if name != "localhost" && strings.ContainsFunc(name, func(r rune) bool {
			return !strings.ContainsRune("0123456789.:[]abcdef", r)
		}) {
			t.Fatalf("LoopbackHost(%q) = true for a name", host)
		}
	})
}
