package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

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
		Queues:   func() any { return []map[string]any{{"topic": "jobs", "ready": 3}} },
		Metrics: func() []Metric {
			return []Metric{
				{Name: "sinew_connections_open", Help: "Open client connections.", Type: "gauge", Value: 2},
				{Name: "sinew_queue_ready", Help: "Ready messages.", Type: "gauge", Labels: [][2]string{{"topic", `a"b\c`}, {"partition", "0"}}, Value: 5},
				{Name: "sinew_queue_ready", Help: "Ready messages.", Type: "gauge", Labels: [][2]string{{"topic", "x\ny"}, {"partition", "1"}}, Value: 1.5},
				{Name: "sinew_publishes_total", Help: "Publishes.\nAll of them.", Type: "counter", Value: 1e6},
			}
		},
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
	want := `# HELP sinew_connections_open Open client connections.
# TYPE sinew_connections_open gauge
sinew_connections_open 2
# HELP sinew_queue_ready Ready messages.
# TYPE sinew_queue_ready gauge
sinew_queue_ready{topic="a\"b\\c",partition="0"} 5
sinew_queue_ready{topic="x\ny",partition="1"} 1.5
# HELP sinew_publishes_total Publishes.\nAll of them.
# TYPE sinew_publishes_total counter
sinew_publishes_total 1e+06
`
	if metrics != want {
		t.Fatalf("metrics:\n%s\nwant:\n%s", metrics, want)
	}
	code, body := get(t, h, "/api/v1/queues")
	var v []map[string]any
	if code != 200 || json.Unmarshal([]byte(body), &v) != nil || v[0]["topic"] != "jobs" {
		t.Fatalf("queues %d %s", code, body)
	}
	if code, _ := get(t, h, "/nope"); code != 404 {
		t.Fatalf("unknown path %d", code)
	}
}
