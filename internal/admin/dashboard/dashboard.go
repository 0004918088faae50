package dashboard

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed static
var static embed.FS

// files is the embedded static directory.
var files, _ = fs.Sub(static, "static")

// csp allows the page its own origin only: scripts, styles and fetches from
// the admin listener, images from it or inline data (the empty favicon).
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Mount registers the dashboard on mux: the page at GET / (exactly) and its
// assets at GET /ui/. Other paths stay free for the API.
func Mount(mux *http.ServeMux) {
	mux.Handle("GET /{$}", http.HandlerFunc(servePage))
	mux.Handle("GET /ui/", withHeaders(http.StripPrefix("/ui/", noDirs(http.FileServerFS(files)))))
}

// noDirs answers 404 for a directory, so the assets are never listed.
func noDirs(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "" || r.URL.Path[len(r.URL.Path)-1] == '/' {
			http.NotFound(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

func servePage(w http.ResponseWriter, r *http.Request) {
	setHeaders(w)
	http.ServeFileFS(w, r, files, "index.html")
}

func withHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		setHeaders(w)
		h.ServeHTTP(w, r)
	})
}

func setHeaders(w http.ResponseWriter) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", csp)
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	// The files change only with the binary; revalidate so an upgrade shows at once.
	hd.Set("Cache-Control", "no-cache")
}
