package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/admin"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/protocol"
)

// rawConn is a protocol connection that reads frames one at a time.
type rawConn struct {
	t   *testing.T
	nc  net.Conn
	br  *bufio.Reader
	req uint64
}

func (c *rawConn) send(body protocol.Body) uint64 {
	c.t.Helper()
	c.req++
	if _, err := c.nc.Write(protocol.AppendFrame(nil, 0, c.req, body)); err != nil {
		c.t.Fatalf("write %s: %v", body.Op(), err)
	}
	return c.req
}

// next returns the next frame that is not a PING, or the read error.
func (c *rawConn) next() (protocol.Body, error) {
	for {
		f, _, err := protocol.ReadFrame(c.br, 1<<21, nil)
		if err != nil {
			return nil, err
		}
		if f.Op == protocol.OpPing {
			continue
		}
		b, err := protocol.Decode(f)
		if err != nil {
			c.t.Fatalf("decode %s: %v", f.Op, err)
		}
		return b, nil
	}
}

func rawNext[T protocol.Body](c *rawConn) T {
	c.t.Helper()
	b, err := c.next()
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	v, ok := b.(T)
	if !ok {
		c.t.Fatalf("got %s %+v, want %T", b.Op(), b, v)
	}
	return v
}

// POST /api/v1/drain starts the same two-phase drain as SIGTERM: /readyz turns
// 503, the client gets GOING_AWAY, the ack of the delivery it holds is still
// taken, and once nothing is in flight serve returns nil on its own (exit 0)
// with the ack durable, long before the drain's deadline, which follows the
// runtime setting connection.drain_timeout_ms as it is when the drain starts.
func TestAdminDrain(t *testing.T) {
	cfg := testServeConfig(t)
	cfg.AdminListen = "127.0.0.1:0"
	cfg.RuntimeSeed.Connection.DrainTimeoutMs = 10 * safetyTimeoutMs // far beyond any wait below
	type addrs struct{ client, admin string }
	ready := make(chan addrs, 1)
	serveReadyHook = func(c, a string) { ready <- addrs{c, a} }
	t.Cleanup(func() { serveReadyHook = nil })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, slog.New(slog.DiscardHandler)) }()
	var a addrs
	select {
	case a = <-ready:
	case err := <-done:
		t.Fatalf("serve: %v", err)
	case <-time.After(safetyTimeoutMs * time.Millisecond):
		t.Fatal("serve did not start")
	}

	nc, _ := hello(t, a.client, protocol.ResumeIdentity{})
	c := &rawConn{t: t, nc: nc, br: bufio.NewReader(nc)}
	c.send(&protocol.Publish{Topic: "drained", Partition: -1, Body: []byte("held")})
	rawNext[*protocol.PublishOK](c)
	c.send(&protocol.Subscribe{Topic: "drained", Partition: -1, Prefetch: 1})
	rawNext[*protocol.SubscribeOK](c)
	d := rawNext[*protocol.Deliver](c)

	url := "http://" + a.admin
	// The drain timeout is a runtime setting, read when the drain starts:
	// raise it to an hour, and the deadline follows.
	var cur admin.SettingsDoc
	if code := httpJSON(t, http.MethodGet, url+"/api/v1/settings", "", &cur); code != http.StatusOK {
		t.Fatalf("GET settings: %d", code)
	}
	put := fmt.Sprintf(`{"version": %d, "values": {"connection.drain_timeout_ms": 3600000}}`, cur.Version)
	if code := httpJSON(t, http.MethodPut, url+"/api/v1/settings", put, nil); code != http.StatusOK {
		t.Fatalf("PUT settings: %d", code)
	}
	var doc admin.DrainView
	if code := httpJSON(t, http.MethodPost, url+"/api/v1/drain", "", &doc); code != http.StatusAccepted || !doc.Draining {
		t.Fatalf("POST /api/v1/drain: %d %+v", code, doc)
	}
	away := rawNext[*protocol.GoingAway](c)
	if left := time.Until(time.UnixMilli(away.DeadlineMs)); left < 30*time.Minute || left > time.Hour {
		t.Fatalf("GOING_AWAY deadline %v away, want the hour set just before", left)
	}
	// A second request finds the drain under way and changes nothing.
	var again admin.DrainView
	if code := httpJSON(t, http.MethodPost, url+"/api/v1/drain", "", &again); code != http.StatusAccepted || !again.Draining {
		t.Fatalf("second POST /api/v1/drain: %d %+v", code, again)
	}
	if code := httpJSON(t, http.MethodGet, url+"/readyz", "", nil); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz while draining: %d, want 503", code)
	}
	select {
	case err := <-done:
		t.Fatalf("serve returned (%v) while a delivery was unsettled", err)
	default:
	}
	// A publish is refused, a settle is taken.
	c.send(&protocol.Publish{Topic: "drained", Partition: -1, Body: []byte("late")})
	if e := rawNext[*protocol.ErrorBody](c); e.Code != protocol.CodeShuttingDown || e.Fatal {
		t.Fatalf("publish while draining: %+v", e)
	}
	c.send(&protocol.Settle{Kind: protocol.OpAck, Tags: []uint64{d.Tag}})
	if r := rawNext[*protocol.SettleResult](c); len(r.Codes) != 1 || r.Codes[0] != protocol.CodeOK {
		t.Fatalf("ack while draining: %+v", r)
	}
	if b, err := c.next(); err == nil {
		t.Fatalf("got %s after the drain, want the connection closed", b.Op())
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve after the drain: %v", err)
		}
	case <-time.After(safetyTimeoutMs * time.Millisecond):
		t.Fatal("serve did not return after the drain")
	}

	b, err := broker.Open(broker.Config{DataDir: cfg.DataDir})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	found := false
	for _, q := range b.Stats().Queues {
		found = found || q.Topic == "drained"
		for _, p := range q.Partitions {
			if p.Ready+p.Inflight+p.Delayed != 0 {
				t.Fatalf("after the drain %s/%d holds ready %d inflight %d delayed %d; the ack was lost", q.Topic, p.Partition, p.Ready, p.Inflight, p.Delayed)
			}
		}
	}
	if !found {
		t.Fatal("queue drained not found after the restart")
	}
}
