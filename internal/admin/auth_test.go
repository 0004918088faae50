package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/vfs"
)

const (
	rootPassword   = "root-password-1"
	readerPassword = "reader-password-1"
	adminToken     = "admin-token-0123456789abcdef"
)

// gateFixture is the real admin handler behind a Gate with a real users
// store (cheap hash parameters) and a recording Sleep.
type gateFixture struct {
	t      *testing.T
	gate   *Gate
	h      http.Handler
	log    *bytes.Buffer
	mu     sync.Mutex
	sleeps []time.Duration
	anon   bool
}

func newGateFixture(t *testing.T, problems []string) *gateFixture {
	t.Helper()
	users, err := auth.OpenUsersParams(vfs.NewMem(), "/data/meta/users", auth.HashParams{TimeCost: 1, MemoryKiB: 64, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := users.Add("root", rootPassword, auth.Permissions{Manage: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	if err := users.Add("reader", readerPassword, auth.Permissions{Consume: []string{"*"}, Manage: []string{"orders.*"}}); err != nil {
		t.Fatal(err)
	}
	fx := &gateFixture{t: t, log: &bytes.Buffer{}}
	fx.gate = &Gate{
		Anonymous: func() bool { return fx.anon },
		Users:     users, Tokens: []string{"other-token-xxxxxxxxxxxx", adminToken},
		Logger: slog.New(slog.NewTextHandler(fx.log, nil)),
		Sleep: func(_ context.Context, d time.Duration) {
			fx.mu.Lock()
			fx.sleeps = append(fx.sleeps, d)
			fx.mu.Unlock()
		},
	}
	fx.h = fx.gate.Wrap(Handler(Config{
		Ready: func() bool { return true }, Problems: func() []string { return problems },
		Metrics: testRegistry(), Version: "test",
	}))
	return fx
}

// do sends a GET of path with the Authorization header authz ("" for none).
func (fx *gateFixture) do(path, authz string) *http.Response {
	fx.t.Helper()
	req := httptest.NewRequest("GET", path, nil)
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	rec := httptest.NewRecorder()
	fx.h.ServeHTTP(rec, req)
	return rec.Result()
}

func (fx *gateFixture) sleepCount() int {
	fx.mu.Lock()
	defer fx.mu.Unlock()
	return len(fx.sleeps)
}

func basic(user, password string) string {
	req, _ := http.NewRequest("GET", "/", nil)
	req.SetBasicAuth(user, password)
	return req.Header.Get("Authorization")
}

func errorCode(t *testing.T, res *http.Response) string {
	t.Helper()
	var e ErrorBody
	body, _ := io.ReadAll(res.Body)
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("body %q is not the JSON error: %v", body, err)
	}
	return e.Code
}

// On a broker where anonymous access is not allowed: a missing or wrong
// credential is 401 with WWW-Authenticate, the right one 200, and a user
// who may not manage every topic 403.
func TestGateRequiresCredentials(t *testing.T) {
	fx := newGateFixture(t, nil)
	for _, path := range []string{"/api/v1/version", "/metrics", "/", "/api/v1/queues", "/api/v1/cohorts"} {
		res := fx.do(path, "")
		if res.StatusCode != http.StatusUnauthorized || errorCode(t, res) != "unauthorized" {
			t.Fatalf("%s without credentials: %d", path, res.StatusCode)
		}
		ch := res.Header.Values("WWW-Authenticate")
		if len(ch) != 2 || !strings.HasPrefix(ch[0], `Basic realm="sinew admin"`) || !strings.HasPrefix(ch[1], "Bearer ") {
			t.Fatalf("%s: WWW-Authenticate %q", path, ch)
		}
	}
	if n := fx.sleepCount(); n != 0 {
		t.Fatalf("a missing credential waited (%d sleeps); only wrong ones do", n)
	}

	wrong := []struct{ name, authz string }{
		{"wrong password", basic("root", "not-the-password")},
		{"unknown user", basic("mallory", rootPassword)},
		{"wrong token", "Bearer not-a-token-at-all"},
		{"token as password", basic("root", adminToken)},
		{"bad base64", "Basic !!!"},
		{"unknown scheme", "Digest username=root"},
	}
	for i, c := range wrong {
		res := fx.do("/api/v1/version", c.authz)
		if res.StatusCode != http.StatusUnauthorized || len(res.Header.Values("WWW-Authenticate")) != 2 {
			t.Fatalf("%s: %d %v", c.name, res.StatusCode, res.Header)
		}
		if n := fx.sleepCount(); n != i+1 || fx.sleeps[i] != AuthFailureDelayMsDefault*time.Millisecond {
			t.Fatalf("%s: sleeps %v, want one more of %d ms", c.name, fx.sleeps, AuthFailureDelayMsDefault)
		}
	}
	logged := fx.log.String()
	if strings.Count(logged, "admin authentication failed") != len(wrong) || !strings.Contains(logged, "user=mallory") {
		t.Fatalf("log:\n%s", logged)
	}
	for _, secret := range []string{"not-the-password", rootPassword, "not-a-token-at-all", adminToken} {
		if strings.Contains(logged, secret) {
			t.Fatalf("the log holds a credential %q:\n%s", secret, logged)
		}
	}

	for _, c := range []struct{ name, authz string }{
		{"basic", basic("root", rootPassword)},
		{"bearer", "Bearer " + adminToken},
		{"bearer lower case", "bearer " + adminToken},
	} {
		res := fx.do("/api/v1/version", c.authz)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", c.name, res.StatusCode)
		}
		if res := fx.do("/metrics", c.authz); res.StatusCode != http.StatusOK {
			t.Fatalf("%s /metrics: %d", c.name, res.StatusCode)
		}
	}
	res := fx.do("/api/v1/version", basic("reader", readerPassword))
	if res.StatusCode != http.StatusForbidden || errorCode(t, res) != "forbidden" {
		t.Fatalf("reader: %d", res.StatusCode)
	}
	st := fx.gate.Stats()
	if st.Missing != 5 || st.Failed != uint64(len(wrong)) || st.Denied != 1 || st.Busy != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// Probes stay open; /readyz then leaves out the problem lines, which name
// queues, unless anonymous access is allowed.
func TestGateProbesOpen(t *testing.T) {
	problem := `queue "secret-orders" group "" partition 0 quarantined: bad crc`
	fx := newGateFixture(t, []string{problem})
	if res := fx.do("/healthz", ""); res.StatusCode != http.StatusOK {
		t.Fatalf("healthz: %d", res.StatusCode)
	}
	res := fx.do("/readyz", "")
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusServiceUnavailable || string(body) != "not ready: 1 problem(s)\n" {
		t.Fatalf("readyz: %d %q", res.StatusCode, body)
	}
	fx.anon = true
	res = fx.do("/readyz", "")
	body, _ = io.ReadAll(res.Body)
	if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), problem) {
		t.Fatalf("readyz with anonymous access: %d %q", res.StatusCode, body)
	}
}

// Where anonymous access is allowed (loopback, no auth configured), a
// request without credentials is served, but a credential presented is
// still checked.
func TestGateAnonymousAllowed(t *testing.T) {
	fx := newGateFixture(t, nil)
	fx.anon = true
	if res := fx.do("/api/v1/version", ""); res.StatusCode != http.StatusOK {
		t.Fatalf("anonymous: %d", res.StatusCode)
	}
	if res := fx.do("/api/v1/version", basic("root", "wrong-password")); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("wrong password with anonymous allowed: %d", res.StatusCode)
	}
	if res := fx.do("/api/v1/version", basic("root", rootPassword)); res.StatusCode != http.StatusOK {
		t.Fatalf("root: %d", res.StatusCode)
	}
}

// At most authCheckingMax failed authentications wait out their delay at
// once; one more is answered 429 before its credentials are checked.
func TestGateBoundsConcurrentFailures(t *testing.T) {
	fx := newGateFixture(t, nil)
	entered := make(chan struct{}, authCheckingMax)
	release := make(chan struct{})
	fx.gate.Sleep = func(context.Context, time.Duration) {
		entered <- struct{}{}
		<-release
	}
	var wg sync.WaitGroup
	codes := make(chan int, authCheckingMax)
	for i := range authCheckingMax {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := httptest.NewRequest("GET", "/api/v1/version", nil)
			// Each from its own address: one address's checks run one at
			// a time.
			req.RemoteAddr = fmt.Sprintf("10.1.0.%d:1000", i+1)
			req.Header.Set("Authorization", "Bearer wrong")
			rec := httptest.NewRecorder()
			fx.h.ServeHTTP(rec, req)
			codes <- rec.Code
		}()
	}
	for range authCheckingMax {
		<-entered
	}
	res := fx.do("/api/v1/version", "Bearer "+adminToken)
	if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" {
		t.Fatalf("with %d failures waiting: %d", authCheckingMax, res.StatusCode)
	}
	close(release)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusUnauthorized {
			t.Fatalf("a waiting failure answered %d", c)
		}
	}
	if res := fx.do("/api/v1/version", "Bearer "+adminToken); res.StatusCode != http.StatusOK {
		t.Fatalf("after the flood: %d", res.StatusCode)
	}
	if st := fx.gate.Stats(); st.Busy != 1 || st.Failed != authCheckingMax {
		t.Fatalf("stats %+v", st)
	}
}

// Basic-auth checks from one client address run one at a time, a failed one
// holding the address through its delay; another address is not held up.
func TestGateOneLoginPerAddress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { testGateOneCheckPerAddress(t, basic("root", "wrong-password")) })
}

// remoteKey carries a request's client address into the gate's Sleep.
type remoteKey struct{}

// testGateOneCheckPerAddress sends three failing requests with
// authorization: two from one address, one from another. The second from
// the address is not checked until the first's failure delay ends, the
// other address's is checked meanwhile. Run inside a synctest bubble.
func testGateOneCheckPerAddress(t *testing.T, authorization string) {
	fx := newGateFixture(t, nil)
	entered := make(chan string, 4)
	release := make(chan struct{})
	fx.gate.Sleep = func(ctx context.Context, _ time.Duration) {
		entered <- ctx.Value(remoteKey{}).(string)
		<-release
	}
	done := make(chan int, 3)
	send := func(remote string) {
		req := httptest.NewRequest("GET", "/api/v1/version", nil)
		req.RemoteAddr = remote
		req.Header.Set("Authorization", authorization)
		req = req.WithContext(context.WithValue(req.Context(), remoteKey{}, remote))
		rec := httptest.NewRecorder()
		fx.h.ServeHTTP(rec, req)
		done <- rec.Code
	}
	go send("10.0.0.9:1000")
	if got := <-entered; got != "10.0.0.9:1000" {
		t.Fatalf("first in its delay: %s", got)
	}
	go send("10.0.0.9:1001") // same address: waits for the first
	go send("10.0.0.3:1000") // another address: its own lane
	if got := <-entered; got != "10.0.0.3:1000" {
		t.Fatalf("second in a delay: %s, want the other address", got)
	}
	synctest.Wait()
	select {
	case got := <-entered:
		t.Fatalf("%s checked while its address's first failure was in its delay", got)
	default:
	}
	release <- struct{}{}
	release <- struct{}{}
	if got := <-entered; got != "10.0.0.9:1001" {
		t.Fatalf("third in a delay: %s", got)
	}
	close(release)
	for range 3 {
		if code := <-done; code != http.StatusUnauthorized {
			t.Fatalf("answer %d", code)
		}
	}
}

// A successful basic-auth request lets its address's lane go once the
// check is done: a request still being served does not hold up the next
// login from the same address.
func TestGateLaneFreedAfterCheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fx := newGateFixture(t, nil)
		inHandler := make(chan struct{})
		finish := make(chan struct{})
		slow := fx.gate.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			inHandler <- struct{}{}
			<-finish
		}))
		go func() {
			req := httptest.NewRequest("GET", "/api/v1/version", nil)
			req.RemoteAddr = "10.0.0.9:1000"
			req.Header.Set("Authorization", basic("root", rootPassword))
			slow.ServeHTTP(httptest.NewRecorder(), req)
		}()
		<-inHandler
		req := httptest.NewRequest("GET", "/api/v1/version", nil)
		req.RemoteAddr = "10.0.0.9:1001"
		req.Header.Set("Authorization", basic("root", rootPassword))
		rec := httptest.NewRecorder()
		fx.h.ServeHTTP(rec, req) // would wait its 10 s and answer 429 if the lane were still held
		if rec.Code != http.StatusOK {
			t.Fatalf("second login from the address while the first request runs: %d", rec.Code)
		}
		close(finish)
		synctest.Wait()
	})
}

// A loopback listener that serves requests without credentials answers only
// requests addressed to a loopback name: any other Host, as a page that
// rebinds its own name to 127.0.0.1 would send, gets 403 on every path but
// the probes, whose /readyz then leaves out its problem lines.
func TestGateForeignHost(t *testing.T) {
	problem := `queue "secret-orders" group "" partition 0 quarantined: bad crc`
	fx := newGateFixture(t, []string{problem})
	fx.anon = true
	fx.gate.Loopback = true
	get := func(host, path string, hdr ...string) *http.Response {
		req := httptest.NewRequest("GET", path, nil)
		req.Host = host
		if len(hdr) > 0 {
			req.Header.Set("Authorization", hdr[0])
		}
		rec := httptest.NewRecorder()
		fx.h.ServeHTTP(rec, req)
		return rec.Result()
	}
	for _, host := range []string{"attacker.example", "attacker.example:7655", "localhost.attacker.example", "127.0.0.1.nip.io:7655", "", "10.0.0.1:7655"} {
		for _, path := range []string{"/api/v1/version", "/api/v1/users", "/metrics", "/", "/api/v1/queues"} {
			res := get(host, path)
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "forbidden_host") ||
				!strings.Contains(string(body), "DNS rebinding") {
				t.Fatalf("Host %q %s: %d %s", host, path, res.StatusCode, body)
			}
		}
		// Credentials do not open a foreign name either: the guard is the
		// listener's, not the request's.
		if res := get(host, "/api/v1/version", "Bearer "+adminToken); res.StatusCode != http.StatusForbidden {
			t.Fatalf("Host %q with a token: %d", host, res.StatusCode)
		}
		if res := get(host, "/healthz"); res.StatusCode != http.StatusOK {
			t.Fatalf("Host %q /healthz: %d", host, res.StatusCode)
		}
		res := get(host, "/readyz")
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusServiceUnavailable || string(body) != "not ready: 1 problem(s)\n" {
			t.Fatalf("Host %q /readyz: %d %q", host, res.StatusCode, body)
		}
	}
	if !strings.Contains(fx.log.String(), "Host is not a loopback name") {
		t.Fatalf("refusal not logged:\n%s", fx.log)
	}
	for _, host := range []string{"localhost", "localhost:7655", "LOCALHOST:1", "127.0.0.1", "127.0.0.1:7655", "127.9.8.7:80", "[::1]", "[::1]:7655"} {
		if res := get(host, "/api/v1/version"); res.StatusCode != http.StatusOK {
			t.Fatalf("Host %q: %d", host, res.StatusCode)
		}
		res := get(host, "/readyz")
		body, _ := io.ReadAll(res.Body)
		if !strings.Contains(string(body), problem) {
			t.Fatalf("Host %q /readyz: %q", host, body)
		}
	}
	// Once credentials are required, the Host no longer matters: a page
	// cannot send the operator's credentials to a name of its own.
	fx.anon = false
	if res := get("broker.example:7655", "/api/v1/version", "Bearer "+adminToken); res.StatusCode != http.StatusOK {
		t.Fatalf("foreign Host with credentials required: %d", res.StatusCode)
	}
	// A listener that is not loopback (auth.allow_anonymous on a public
	// address) cannot know its names and does not check them.
	fx.anon, fx.gate.Loopback = true, false
	if res := get("broker.example:7655", "/api/v1/version"); res.StatusCode != http.StatusOK {
		t.Fatalf("non-loopback listener: %d", res.StatusCode)
	}
}

func TestLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost": true, "LocalHost:7655": true, "127.0.0.1": true, "127.0.0.1:0": true, "127.255.255.254:65535": true,
		"[::1]": true, "[::1]:7655": true, "[::ffff:127.0.0.1]:1": true,
		"": false, "localhost:": false, "localhost:65536": false, "localhost:x": false, "localhost.": false,
		"foo.localhost": false, "attacker.example": false, "128.0.0.1": false, "0.0.0.0": false, "::1": false,
		"[::1": false, "[::1]x": false, "[::1]:": false, "[fe80::1%lo]": false, "[::2]": false, "127.1": false,
		"127.0.0.1:80:80": false, "[127.0.0.1]": false, "2130706433": false, "0x7f000001": false,
	} {
		if got := LoopbackHost(host); got != want {
			t.Errorf("LoopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}

// Bearer checks from one client address run one at a time too, a wrong
// token holding the address through its delay: a second guess from the
// address is not checked until the first's delay ends, another address's
// is.
func TestGateTokenGuessesOnePerAddress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { testGateOneCheckPerAddress(t, "Bearer wrong-token") })
}

// A basic-auth request that finds no free hash slot within the wait is
// answered 429 with Retry-After, counted as busy: it was never checked, so
// it is no failed login and waits no failure delay.
func TestGateHashWaitBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		held := make(chan struct{})
		var blocking sync.Once
		block := false
		users, err := auth.OpenUsersWith(vfs.NewMem(), "/data/meta/users", auth.UsersOptions{
			Params: auth.HashParams{TimeCost: 1, MemoryKiB: 64, Threads: 1}, HashesMax: 1,
			OnHash: func() {
				if block {
					blocking.Do(func() { close(held); <-hold })
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := users.Add("root", rootPassword, auth.Permissions{Manage: []string{"*"}}); err != nil {
			t.Fatal(err)
		}
		block = true
		var sleeps int
		g := &Gate{Users: users, Sleep: func(context.Context, time.Duration) { sleeps++ }}
		h := g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
		holderDone := make(chan int, 1)
		go func() {
			req := httptest.NewRequest("GET", "/api/v1/version", nil)
			req.RemoteAddr = "10.0.0.1:1000"
			req.Header.Set("Authorization", basic("root", rootPassword))
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			holderDone <- rec.Code
		}()
		<-held
		req := httptest.NewRequest("GET", "/api/v1/version", nil)
		req.RemoteAddr = "10.0.0.2:1000"
		req.Header.Set("Authorization", basic("root", "wrong-password"))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req) // waits out laneWaitMs on the fake clock
		if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
			t.Fatalf("basic auth with no hash slot free: %d", rec.Code)
		}
		if st := g.Stats(); st.Busy != 1 || st.Failed != 0 || sleeps != 0 {
			t.Fatalf("stats %+v, %d failure delays; want one busy, no failure", st, sleeps)
		}
		close(hold)
		if code := <-holderDone; code != http.StatusOK {
			t.Fatalf("the login holding the slot: %d", code)
		}
	})
}
