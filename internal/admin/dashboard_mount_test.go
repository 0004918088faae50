package admin

import (
	"net/http/httptest"
	"strings"
	"testing"
)

// The admin listener serves the dashboard at / and its assets under /ui/.
func TestHandlerServesDashboard(t *testing.T) {
	h := Handler(Config{})
	for path, want := range map[string]string{"/": "<title>Sinew dashboard</title>", "/ui/app.js": "/api/v1/"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != 200 || !strings.Contains(rec.Body.String(), want) {
			t.Errorf("GET %s: %d, body has %q: %v", path, rec.Code, want, strings.Contains(rec.Body.String(), want))
		}
	}
}

// A page of another site cannot change the broker through the operator's
// browser: a state-changing request marked cross-site by the browser, or
// from another origin, is refused with 403 before it reaches the API; the
// same request without browser headers (the CLI) gets through.
func TestHandlerRefusesCrossOriginChanges(t *testing.T) {
	h := Handler(Config{})
	for _, c := range []struct {
		name   string
		header map[string]string
		want   int
	}{
		{"cross-site fetch", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
		{"other origin", map[string]string{"Origin": "http://evil.example"}, 403},
		{"same origin", map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://127.0.0.1:7655"}, 501},
		{"no browser headers", nil, 501},
	} {
		req := httptest.NewRequest("POST", "http://127.0.0.1:7655/api/v1/drain", nil)
		for k, v := range c.header {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, rec.Code, rec.Body.String(), c.want)
		}
		if c.want == 403 && !strings.Contains(rec.Body.String(), `"code": "forbidden"`) {
			t.Errorf("%s: body %s", c.name, rec.Body.String())
		}
	}
	// Reads stay open to any origin: they change nothing.
	req := httptest.NewRequest("GET", "http://127.0.0.1:7655/healthz", nil)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Errorf("cross-site GET /healthz: %d", rec.Code)
	}
}
