package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/admin"
	"github.com/sinewmq/sinew/internal/settings"
	"github.com/sinewmq/sinew/protocol"
)

// safetyTimeoutMs bounds each wait for an event the test caused; reaching it is
// a failure, never a pass.
const safetyTimeoutMs = 30_000

// runServeAdmin is runServeT that also serves the admin API, returning both
// addresses.
func runServeAdmin(t *testing.T, cfg settings.Config) (clientAddr, adminAddr string, stop func() error) {
	t.Helper()
	cfg.AdminListen = "127.0.0.1:0"
	type addrs struct{ client, admin string }
	ready := make(chan addrs, 1)
	serveReadyHook = func(c, a string) { ready <- addrs{c, a} }
	t.Cleanup(func() { serveReadyHook = nil })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, slog.New(slog.DiscardHandler)) }()
	select {
	case a := <-ready:
		clientAddr, adminAddr = a.client, a.admin
	case err := <-done:
		cancel()
		t.Fatalf("serve: %v", err)
	case <-time.After(safetyTimeoutMs * time.Millisecond):
		cancel()
		t.Fatal("serve did not start")
	}
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	t.Cleanup(func() { stop() })
	return clientAddr, adminAddr, stop
}

// hello opens a raw connection, offers resume (zero for a fresh session) and
// returns the connection and its HELLO_OK.
func hello(t *testing.T, addr string, resume protocol.ResumeIdentity) (net.Conn, *protocol.HelloOK) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(safetyTimeoutMs * time.Millisecond))
	if _, err := nc.Write(protocol.AppendFrame(nil, 0, 1, &protocol.Hello{ProtocolVersion: protocol.Version, ClientName: "settings-test", Resume: resume})); err != nil {
		t.Fatal(err)
	}
	f, _, err := protocol.ReadFrame(bufio.NewReader(nc), 1<<21, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := protocol.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	ok, is := body.(*protocol.HelloOK)
	if !is {
		t.Fatalf("answer to HELLO: %T %+v", body, body)
	}
	return nc, ok
}

func httpJSON(t *testing.T, method, url, body string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Timeout: safetyTimeoutMs * time.Millisecond}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: %d %s: %v", method, url, resp.StatusCode, data, err)
		}
	}
	return resp.StatusCode
}

// graceTimer is one call of the fake AfterFunc: the grace a disconnect got.
type graceTimer struct {
	d    time.Duration
	fire func()
}

// The grace is a live setting of the real broker: a PUT changes what later
// disconnects get (and what HELLO_OK reports), a session already dormant keeps
// the grace it started with, and the change survives a restart, while a
// changed runtime_seed does not override it.
func TestRuntimeGraceLive(t *testing.T) {
	timers := make(chan graceTimer, 16)
	serveAfterFunc = func(d time.Duration, f func()) func() bool {
		timers <- graceTimer{d, f}
		return func() bool { return true }
	}
	t.Cleanup(func() { serveAfterFunc = nil })
	nextTimer := func() graceTimer {
		t.Helper()
		select {
		case g := <-timers:
			return g
		case <-time.After(safetyTimeoutMs * time.Millisecond):
			t.Fatal("no grace timer started after a disconnect")
			return graceTimer{}
		}
	}

	cfg := testServeConfig(t) // no runtime_seed given: sinew serve's 5000
	addr, adminAddr, stop := runServeAdmin(t, cfg)
	url := "http://" + adminAddr + "/api/v1/settings"
	var doc admin.SettingsDoc
	if code := httpJSON(t, "GET", url, "", &doc); code != 200 || doc.Version != 1 || doc.Values["connection.reconnect_grace_ms"] != 5000 {
		t.Fatalf("GET: %d %+v", code, doc)
	}

	a, okA := hello(t, addr, protocol.ResumeIdentity{})
	if okA.ReconnectGraceMs != 5000 {
		t.Fatalf("HELLO_OK grace %d, want 5000", okA.ReconnectGraceMs)
	}
	a.Close()
	if g := nextTimer(); g.d != 5000*time.Millisecond {
		t.Fatalf("first disconnect got grace %v, want 5s", g.d)
	}

	if code := httpJSON(t, "PUT", url, `{"version": 1, "values": {"connection.reconnect_grace_ms": 250}}`, &doc); code != 200 ||
		doc.Version != 2 || doc.Values["connection.reconnect_grace_ms"] != 250 {
		t.Fatalf("PUT: %d %+v", code, doc)
	}
	var conflict admin.SettingsError
	if code := httpJSON(t, "PUT", url, `{"version": 1, "values": {"connection.reconnect_grace_ms": 9}}`, &conflict); code != 409 || conflict.Version != 2 {
		t.Fatalf("stale PUT: %d %+v", code, conflict)
	}
	var bad admin.SettingsError
	if code := httpJSON(t, "PUT", url, `{"version": 2, "values": {"connection.nope_ms": 9}}`, &bad); code != 400 || !strings.Contains(bad.Error, "connection.nope_ms") {
		t.Fatalf("unknown key PUT: %d %+v", code, bad)
	}

	b, okB := hello(t, addr, protocol.ResumeIdentity{})
	if okB.ReconnectGraceMs != 250 {
		t.Fatalf("HELLO_OK after the PUT reports grace %d, want 250", okB.ReconnectGraceMs)
	}
	b.Close()
	gB := nextTimer()
	if gB.d != 250*time.Millisecond {
		t.Fatalf("disconnect after the PUT got grace %v, want 250ms", gB.d)
	}
	// B's grace runs out; A's (5 s, started before the change) has not.
	gB.fire()
	if _, ok := hello(t, addr, okB.Resume); ok.Outcome != protocol.ResumeNotFound {
		t.Fatalf("resume after B's grace expired: %v", ok.Outcome)
	}
	if _, ok := hello(t, addr, okA.Resume); ok.Outcome != protocol.ResumeResumed {
		t.Fatalf("resume of A, dormant before the change: %v (its grace was shortened retroactively)", ok.Outcome)
	}

	if err := stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	cfg.RuntimeSeed.Connection.ReconnectGraceMs = 7000
	addr, adminAddr, _ = runServeAdmin(t, cfg)
	if code := httpJSON(t, "GET", "http://"+adminAddr+"/api/v1/settings", "", &doc); code != 200 || doc.Version != 2 || doc.Values["connection.reconnect_grace_ms"] != 250 {
		t.Fatalf("GET after restart: %d %+v", code, doc)
	}
	if _, ok := hello(t, addr, protocol.ResumeIdentity{}); ok.ReconnectGraceMs != 250 {
		t.Fatalf("HELLO_OK after restart reports grace %d, want the persisted 250", ok.ReconnectGraceMs)
	}
}

// runtime_seed decides the first value of a new data directory, 0 included
// (it opts out of grace).
func TestRuntimeSeedAppliesToANewDataDir(t *testing.T) {
	for _, seed := range []int64{1234, 0} {
		cfg := testServeConfig(t)
		cfg.RuntimeSeed.Connection.ReconnectGraceMs = seed
		addr, adminAddr, stop := runServeAdmin(t, cfg)
		if _, ok := hello(t, addr, protocol.ResumeIdentity{}); int64(ok.ReconnectGraceMs) != seed {
			t.Errorf("seed %d: HELLO_OK reports %d", seed, ok.ReconnectGraceMs)
		}
		var doc admin.SettingsDoc
		if code := httpJSON(t, "GET", "http://"+adminAddr+"/api/v1/settings", "", &doc); code != 200 || doc.Version != 1 ||
			doc.Values["connection.reconnect_grace_ms"] != seed {
			t.Errorf("seed %d: GET %d %+v", seed, code, doc)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
}
