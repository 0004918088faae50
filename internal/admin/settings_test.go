package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sinewmq/sinew/internal/runtimesettings"
	"github.com/sinewmq/sinew/internal/vfs"
)

func settingsStore(t *testing.T, fs *vfs.MemFS) *runtimesettings.Store {
	t.Helper()
	if err := fs.MkdirAll("/data", 0o755); err != nil {
		t.Fatal(err)
	}
	st, err := runtimesettings.Open(fs, "/data", map[string]int64{runtimesettings.KeyReconnectGraceMs: 5000}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func do(t *testing.T, h http.Handler, method, path, body string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
	out, _ := io.ReadAll(rec.Result().Body)
	if ct := rec.Result().Header.Get("Content-Type"); rec.Code != 404 && rec.Code != 405 && ct != "application/json" {
		t.Errorf("%s %s: content type %q", method, path, ct)
	}
	return rec.Code, string(out)
}

func TestSettingsAPI(t *testing.T) {
	fs := vfs.NewMem()
	h := Handler(Config{Settings: settingsStore(t, fs)})

	code, body := do(t, h, "GET", "/api/v1/settings", "")
	var doc SettingsDoc
	if code != 200 || json.Unmarshal([]byte(body), &doc) != nil {
		t.Fatalf("GET: %d %s", code, body)
	}
	if doc.Version != 1 || doc.Values["connection.reconnect_grace_ms"] != 5000 || len(doc.RuntimeKeys) != len(runtimesettings.Keys()) ||
		doc.RuntimeKeys[0].Key != "connection.reconnect_grace_ms" || doc.RuntimeKeys[0].Max != 1<<31 || doc.RuntimeKeys[0].Description == "" {
		t.Fatalf("GET: %s", body)
	}
	for _, field := range []string{`"version"`, `"values"`, `"runtime_keys"`, `"key"`, `"min"`, `"max"`, `"description"`} {
		if !strings.Contains(body, field) {
			t.Errorf("GET body lacks %s: %s", field, body)
		}
	}

	code, body = do(t, h, "PUT", "/api/v1/settings", `{"version": 1, "values": {"connection.reconnect_grace_ms": 1500}}`)
	if code != 200 || json.Unmarshal([]byte(body), &doc) != nil || doc.Version != 2 || doc.Values["connection.reconnect_grace_ms"] != 1500 {
		t.Fatalf("PUT: %d %s", code, body)
	}
	// Persisted before the answer: a fresh store on the same files sees it.
	again, err := runtimesettings.Open(fs, "/data", nil, nil)
	if err != nil || again.Int(runtimesettings.KeyReconnectGraceMs) != 1500 {
		t.Fatalf("after PUT, on disk: %v %v", again.Snapshot(), err)
	}

	// A PUT based on an old version loses the race: 409, with the current
	// document to retry from, and nothing changes.
	code, body = do(t, h, "PUT", "/api/v1/settings", `{"version": 1, "values": {"connection.reconnect_grace_ms": 9}}`)
	var e SettingsError
	if code != 409 || json.Unmarshal([]byte(body), &e) != nil || e.Version != 2 || e.Values["connection.reconnect_grace_ms"] != 1500 ||
		!strings.Contains(e.Error, "expected version 1, current is 2") {
		t.Fatalf("stale PUT: %d %s", code, body)
	}

	for _, tc := range []struct{ body, want string }{
		{`{"version": 2, "values": {"connection.grace": 1}}`, "connection.grace: not a runtime setting"},
		{`{"version": 2, "values": {"connection.reconnect_grace_ms": -1}}`, "connection.reconnect_grace_ms: -1 is out of range 0..2147483648"},
		{`{"version": 2, "values": {"connection.reconnect_grace_ms": 2147483649}}`, "out of range"},
		{`{"version": 2, "values": {"connection.reconnect_grace_ms": 1.5}}`, "connection.reconnect_grace_ms: 1.5 is not an integer"},
		{`{"version": 2, "values": {}}`, "no runtime settings given"},
		{`{"values": {"connection.reconnect_grace_ms": 1}}`, "version is required"},
		{`{"version": 2, "values": {"connection.reconnect_grace_ms": 1}, "force": true}`, `unknown field "force"`},
		{`{"version": 2`, "not a settings change"},
		{`{"version": 2, "values": {"connection.reconnect_grace_ms": 1}} {}`, "data after"},
		{`{"version": 2, "values": {"connection.reconnect_grace_ms": 1}, "pad": "` + strings.Repeat("x", settingsBodyBytesMax) + `"}`, "too large"},
	} {
		code, body := do(t, h, "PUT", "/api/v1/settings", tc.body)
		if code != 400 || json.Unmarshal([]byte(body), &e) != nil || !strings.Contains(e.Error, tc.want) {
			t.Errorf("PUT %.80s: %d %s, want 400 with %q", tc.body, code, body, tc.want)
		}
	}
	if code, body := do(t, h, "GET", "/api/v1/settings", ""); code != 200 || json.Unmarshal([]byte(body), &doc) != nil ||
		doc.Version != 2 || doc.Values["connection.reconnect_grace_ms"] != 1500 {
		t.Fatalf("refused PUTs changed the settings: %s", body)
	}
	if code, _ := do(t, h, "POST", "/api/v1/settings", "{}"); code != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d", code)
	}
}

func TestSettingsAPIWriteFailure(t *testing.T) {
	fs := vfs.NewMem()
	h := Handler(Config{Settings: settingsStore(t, fs)})
	fs.SetSyncError(io.ErrShortWrite)
	code, body := do(t, h, "PUT", "/api/v1/settings", `{"version": 1, "values": {"connection.reconnect_grace_ms": 1}}`)
	fs.SetSyncError(nil)
	if code != 500 || !strings.Contains(body, "short write") {
		t.Fatalf("PUT with failing fsync: %d %s", code, body)
	}
	if _, body := do(t, h, "GET", "/api/v1/settings", ""); !strings.Contains(body, `"connection.reconnect_grace_ms": 5000`) {
		t.Fatalf("failed write became visible: %s", body)
	}
}

func TestNoSettingsEndpointWithoutStore(t *testing.T) {
	if code, _ := do(t, Handler(Config{}), "GET", "/api/v1/settings", ""); code != 404 {
		t.Fatalf("GET without a store: %d", code)
	}
}
