package cdp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Close must stop the reader and the process waiter.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// launch starts Chromium for a test, or skips the test when none is installed.
func launch(t *testing.T) *Browser {
	t.Helper()
	path, err := Find()
	if errors.Is(err, ErrNoBrowser) {
		t.Skip(err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(t.TempDir(), "chromium.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logf.Close() })
	b, err := Launch(path, t.TempDir(), logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestPageReportsErrors loads a page that logs an error, throws, and requests
// a missing file, and checks each is reported; then evaluates, waits for a
// condition the page sets later, and takes a screenshot.
func TestPageReportsErrors(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, `<!doctype html><html><head><title>t</title></head><body><p id="x">hello</p>
<img src="/missing.png">
<script>
console.log("just a log");
console.error("boom", 42);
setTimeout(() => { document.getElementById("x").textContent = "later"; }, 100);
setTimeout(() => { throw new Error("uncaught-thing"); }, 0);
</script></body></html>`)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	b := launch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := b.NewPage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Navigate(ctx, srv.URL+"/"); err != nil {
		t.Fatal(err)
	}
	if err := p.WaitFor(ctx, "text set by the timer", `document.getElementById("x").textContent === "later"`, 5000); err != nil {
		t.Fatal(err)
	}
	var title string
	if err := p.Eval(ctx, `document.title + "-" + (1+2)`, &title); err != nil {
		t.Fatal(err)
	}
	if title != "t-3" {
		t.Fatalf("eval = %q, want t-3", title)
	}
	err = p.WaitFor(ctx, "a thing that never happens", `false`, 200)
	if err == nil || !strings.Contains(err.Error(), "a thing that never happens") {
		t.Fatalf("WaitFor on a false condition: %v", err)
	}
	if err := p.Eval(ctx, `(() => { throw new Error("eval-throws") })()`, nil); err == nil || !strings.Contains(err.Error(), "eval-throws") {
		t.Fatalf("Eval of a throwing expression: %v", err)
	}
	shot := filepath.Join(t.TempDir(), "page.png")
	if err := p.Screenshot(ctx, shot); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(shot); err != nil || fi.Size() < 100 {
		t.Fatalf("screenshot: %v %v", fi, err)
	}

	var all []string
	for _, e := range p.Errors() {
		all = append(all, e.String())
	}
	joined := strings.Join(all, "\n")
	for _, want := range []string{"console error: boom 42", "uncaught-thing", "404"} {
		if !strings.Contains(joined, want) {
			t.Errorf("errors do not mention %q:\n%s", want, joined)
		}
	}
	for _, e := range p.Errors() {
		if strings.Contains(e.Text, "just a log") {
			t.Errorf("a plain log was reported as an error: %v", e)
		}
	}
}

// A resource the page's Content-Security-Policy refuses (here an inline
// script and an image from another origin) is reported as an error, so a
// test that asserts no errors also catches a page that breaks its own CSP.
func TestPageReportsCSPViolations(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'")
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, `<!doctype html><html><head><link rel="icon" href="data:,"></head><body>
<script>document.title = "inline ran";</script>
<img src="http://127.0.0.2:1/x.png"></body></html>`)
	}))
	defer srv.Close()
	b := launch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := b.NewPage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Navigate(ctx, srv.URL+"/"); err != nil {
		t.Fatal(err)
	}
	var title string
	if err := p.Eval(ctx, `document.title`, &title); err != nil {
		t.Fatal(err)
	}
	if title == "inline ran" {
		t.Fatal("the inline script ran despite the CSP")
	}
	var all []string
	for _, e := range p.Errors() {
		all = append(all, e.String())
	}
	joined := strings.Join(all, "\n")
	for _, want := range []string{"inline script", "127.0.0.2"} {
		if !strings.Contains(joined, want) {
			t.Errorf("errors do not mention %q:\n%s", want, joined)
		}
	}
}

// TestCloseEndsBrowser checks Close returns and later calls fail clearly.
func TestCloseEndsBrowser(t *testing.T) {
	b := launch(t)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := b.NewPage(ctx); err == nil {
		t.Fatal("NewPage after Close succeeded")
	}
}
