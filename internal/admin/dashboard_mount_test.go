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
