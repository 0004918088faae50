package admin

import (
	"io"
	"net/http"
	"strings"
)

// Recovering returns the handler the admin listener serves while the broker
// recovers, before Handler can be built: the process is alive (/healthz 200)
// and not ready (/readyz 503), and every other path answers 503, the API
// ones with the JSON error body. Probes then get an answer during a long
// recovery instead of a connection that hangs.
func Recovering() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/healthz":
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			io.WriteString(w, "ok\n")
		case strings.HasPrefix(r.URL.Path, "/api/"):
			writeError(w, http.StatusServiceUnavailable, "unavailable", "the broker is recovering its queues; retry when /readyz answers 200")
		default:
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "not ready: recovering\n")
		}
	})
}
