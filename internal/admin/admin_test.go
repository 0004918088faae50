package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// testRegistry holds samples whose exposition shows the format's rules: a
// HELP with a newline, label values with quotes, backslashes and newlines.
func testRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	open := prometheus.NewGauge(prometheus.GaugeOpts{Name: "sinew_connections_open", Help: "Open client connections."})
	open.Set(2)
	ready := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sinew_queue_ready", Help: "Ready messages."}, []string{"topic", "partition"})
	ready.WithLabelValues(`a"b\c`, "0").Set(5)
	ready.WithLabelValues("x\ny", "1").Set(1.5)
	pubs := prometheus.NewCounter(prometheus.CounterOpts{Name: "sinew_publishes_total", Help: "Publishes.\nAll of them."})
	pubs.Add(1e6)
	reg.MustRegister(open, ready, pubs)
	return reg
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(body)
}

func TestEndpoints(t *testing.T) {
	ready := false
	var problems []string
	h := Handler(Config{
		Ready:    func() bool { return ready },
		Problems: func() []string { return problems },
		Metrics:  testRegistry(),
	})
	if code, body := get(t, h, "/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("healthz %d %q", code, body)
	}
	if code, _ := get(t, h, "/readyz"); code != 503 {
		t.Fatalf("readyz before ready: %d", code)
	}
	ready = true
	if code, _ := get(t, h, "/readyz"); code != 200 {
		t.Fatalf("readyz: %d", code)
	}
	problems = []string{"queue \"t\" group \"\" partition 0 quarantined: bad crc", "second\nline"}
	if code, body := get(t, h, "/readyz"); code != 503 || body != "not ready: 2 problem(s)\n"+
		"queue \"t\" group \"\" partition 0 quarantined: bad crc\nsecond line\n" {
		t.Fatalf("readyz with problems: %d %q", code, body)
	}
	problems = nil
	_, metrics := get(t, h, "/metrics")
	for _, want := range []string{
		"# HELP sinew_connections_open Open client connections.\n# TYPE sinew_connections_open gauge\nsinew_connections_open 2\n",
		"# TYPE sinew_queue_ready gauge\n",
		`sinew_queue_ready{partition="0",topic="a\"b\\c"} 5` + "\n",
		`sinew_queue_ready{partition="1",topic="x\ny"} 1.5` + "\n",
		"# HELP sinew_publishes_total Publishes.\\nAll of them.\n# TYPE sinew_publishes_total counter\nsinew_publishes_total 1e+06\n",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %q:\n%s", want, metrics)
		}
	}
	// Without a broker the queue endpoints say so in the JSON error body.
	code, body := get(t, h, "/api/v1/queues")
	var e ErrorBody
	if code != 503 || json.Unmarshal([]byte(body), &e) != nil || e.Code != "unavailable" || e.Error == "" {
		t.Fatalf("queues without a broker: %d %s", code, body)
	}
	code, body = get(t, h, "/api/v1/nope")
	if code != 404 || json.Unmarshal([]byte(body), &e) != nil || e.Code != "not_found" {
		t.Fatalf("unknown API path: %d %s", code, body)
	}
	if code, _ := get(t, h, "/nope"); code != 404 {
		t.Fatalf("unknown path %d", code)
	}
}
