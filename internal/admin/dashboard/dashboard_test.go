package dashboard

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, path string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	return rec.Result()
}

func TestServesPageAndAssets(t *testing.T) {
	mux := http.NewServeMux()
	Mount(mux)
	mux.HandleFunc("GET /api/v1/queues", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "api") })
	for _, c := range []struct {
		path, ctype, contains string
	}{
		{"/", "text/html", `<script src="/ui/app.js"`},
		{"/ui/app.js", "javascript", "/api/v1/overview"},
		{"/ui/app.css", "text/css", ":root"},
	} {
		res := get(t, mux, c.path)
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 || !strings.Contains(res.Header.Get("Content-Type"), c.ctype) || !strings.Contains(string(body), c.contains) {
			t.Errorf("GET %s: %d %q, body has %q: %v", c.path, res.StatusCode, res.Header.Get("Content-Type"), c.contains, strings.Contains(string(body), c.contains))
		}
		if got := res.Header.Get("Content-Security-Policy"); got != csp {
			t.Errorf("GET %s: CSP %q", c.path, got)
		}
	}
	// The page takes "/" only: API paths and unknown paths are not swallowed,
	// and the asset directory is not listed.
	if res := get(t, mux, "/api/v1/queues"); res.StatusCode != 200 {
		t.Errorf("API path: %d", res.StatusCode)
	}
	for _, p := range []string{"/nope", "/ui/", "/ui/nope.js", "/api/v1/nope"} {
		if res := get(t, mux, p); res.StatusCode != 404 {
			t.Errorf("GET %s: %d, want 404", p, res.StatusCode)
		}
	}
}

// Nothing in the page may come from another origin: every src and href is a
// local path or inline data, and no file names an http(s) URL other than the
// SVG namespace (an identifier, never fetched).
func TestNoExternalResources(t *testing.T) {
	ref := regexp.MustCompile(`(?:src|href)="([^"]*)"`)
	url := regexp.MustCompile(`https?://[^\s"'<>)]+`)
	err := fs.WalkDir(files, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := fs.ReadFile(files, path)
		if err != nil {
			return err
		}
		for _, m := range ref.FindAllStringSubmatch(string(data), -1) {
			if !strings.HasPrefix(m[1], "/") || strings.HasPrefix(m[1], "//") {
				if !strings.HasPrefix(m[1], "data:") {
					t.Errorf("%s: reference %q is not a local path", path, m[1])
				}
			}
		}
		for _, u := range url.FindAllString(string(data), -1) {
			if u != "http://www.w3.org/2000/svg" {
				t.Errorf("%s: names %s", path, u)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// The cohorts section starts hidden, is filled from /api/v1/cohorts and
// shown only while there is a cohort, and the stylesheet keeps the hidden
// attribute above any class's display (a .badge{display:inline-block} once
// showed hidden badges).
func TestCohortsSectionHiddenUntilUsed(t *testing.T) {
	read := func(name string) string {
		data, err := fs.ReadFile(files, name)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	page, js, css := read("index.html"), read("app.js"), read("app.css")
	if !strings.Contains(page, `<section id="cohorts" hidden>`) || !strings.Contains(page, `<p id="cohorts-msg" class="msg"></p>`) {
		t.Errorf("index.html lacks the hidden cohorts section")
	}
	for _, want := range []string{`api("GET", "/api/v1/cohorts")`, `$("#cohorts").hidden = cohorts.length === 0;`, "loadCohorts(),"} {
		if !strings.Contains(js, want) {
			t.Errorf("app.js lacks %q", want)
		}
	}
	if !regexp.MustCompile(`(?m)^\[hidden\] \{ display: none !important; \}$`).MatchString(css) {
		t.Errorf("app.css lacks [hidden] { display: none !important; }")
	}
}
