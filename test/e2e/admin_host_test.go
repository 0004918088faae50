package e2e_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestAdminRefusesForeignHost runs the real binary on loopback with no
// credentials configured, the quick start. A page on another site that
// rebinds its own name to 127.0.0.1 makes the browser send requests with
// Host and Origin of that site: the open admin listener must answer them
// 403, on every path but the probes, so the page can neither create a queue
// nor an administrator (which would lock the operator out) nor read
// messages or metrics. The same requests addressed to 127.0.0.1 are served.
func TestAdminRefusesForeignHost(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	srv := startChildArgs(t, bin, t.TempDir(), "--admin-listen", "127.0.0.1:0")
	admin := logField(t, srv, "msg=serving", "admin_listen")

	do := func(host, method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+admin+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		if strings.Contains(host, "attacker") {
			req.Header.Set("Origin", "http://"+host)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}

	const foreign = "attacker.example:7655"
	for _, r := range []struct{ method, path, body string }{
		{"PUT", "/api/v1/queues/stolen", `{"partitions":1}`},
		{"POST", "/api/v1/users", `{"name":"mallory","password":"mallory-password","permissions":{"manage":["*"]}}`},
		{"GET", "/api/v1/queues/stolen/messages", ""},
		{"GET", "/api/v1/users", ""},
		{"GET", "/metrics", ""},
		{"GET", "/", ""},
	} {
		code, body := do(foreign, r.method, r.path, r.body)
		if code != http.StatusForbidden || !strings.Contains(body, "forbidden_host") {
			t.Fatalf("%s %s with Host %s: %d %s", r.method, r.path, foreign, code, body)
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := do(foreign, "GET", path, ""); code != http.StatusOK {
			t.Fatalf("probe %s with Host %s: %d %s", path, foreign, code, body)
		}
	}

	// Nothing the foreign requests asked for happened, and the listener
	// still serves the local host by its loopback names without credentials.
	if code, body := do(admin, "GET", "/api/v1/users", ""); code != http.StatusOK || strings.Contains(body, "mallory") {
		t.Fatalf("users after the foreign requests: %d %s", code, body)
	}
	if code, body := do("localhost", "GET", "/api/v1/queues/stolen", ""); code != http.StatusNotFound {
		t.Fatalf("queue after the foreign requests: %d %s", code, body)
	}
	if code, body := do(admin, "PUT", "/api/v1/queues/mine", `{"partitions":1}`); code/100 != 2 {
		t.Fatalf("declare by the local host: %d %s", code, body)
	}
	if code, body := do(admin, "GET", "/metrics", ""); code != http.StatusOK || !strings.Contains(body, `sinew_admin_auth_refusals_total{reason="host"} 6`) {
		t.Fatalf("metrics: %d, refusals by host not counted:\n%.2000s", code, body)
	}
	stopChild(t, srv)
}
