package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/internal/server"
	"github.com/sinewmq/sinew/internal/testkit"
	"github.com/sinewmq/sinew/protocol"
)

// tap records every byte the server writes, per connection, so that a test can
// wait until a frame has really been handed to a socket.
type tap struct {
	net.Listener
	mu      sync.Mutex
	written map[*tapConn][]byte
	wake    chan struct{} // cap 1: something was written
}

type tapConn struct {
	net.Conn
	t *tap
}

func newTap() *tap { return &tap{written: map[*tapConn][]byte{}, wake: make(chan struct{}, 1)} }

func (t *tap) wrap(ln net.Listener) net.Listener { t.Listener = ln; return t }

func (t *tap) Accept() (net.Conn, error) {
	c, err := t.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &tapConn{Conn: c, t: t}, nil
}

func (c *tapConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if n > 0 {
		c.t.mu.Lock()
		c.t.written[c] = append(c.t.written[c], p[:n]...)
		c.t.mu.Unlock()
		select {
		case c.t.wake <- struct{}{}:
		default:
		}
	}
	return n, err
}

// waitWritten blocks until the server has written, on some connection, a frame
// for which match is true.
func (t *tap) waitWritten(tb testing.TB, match func(protocol.Frame, protocol.Body) bool) {
	tb.Helper()
	timeout := time.NewTimer(safetyTimeout)
	defer timeout.Stop()
	for {
		t.mu.Lock()
		found := false
		for _, b := range t.written {
			br := bufio.NewReader(bytes.NewReader(b))
			for !found {
				f, _, err := protocol.ReadFrame(br, 1<<24, nil)
				if err != nil {
					break // end of what was written (possibly mid-frame)
				}
				body, err := protocol.Decode(f)
				found = err == nil && match(f, body)
			}
		}
		t.mu.Unlock()
		if found {
			return
		}
		select {
		case <-t.wake:
		case <-timeout.C:
			tb.Fatal("the server never wrote the awaited frame")
		}
	}
}

func sdkCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeout)
	t.Cleanup(cancel)
	return ctx
}

func sdkDial(t *testing.T, addr string, opts ...sinew.Option) *sinew.Client {
	t.Helper()
	c, err := sinew.Dial(sdkCtx(t), addr, opts...)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func sdkRecv(t *testing.T, sub *sinew.Subscription) *sinew.Message {
	t.Helper()
	timeout := time.NewTimer(safetyTimeout)
	defer timeout.Stop()
	select {
	case m, ok := <-sub.Messages():
		if !ok {
			t.Fatalf("subscription ended: %v", sub.Err())
		}
		return m
	case <-timeout.C:
		t.Fatal("no message arrived")
	}
	return nil
}

// TestResumeResendsDeliveryLostWithSocket: a DELIVER written to a socket that
// dies before the client reads it is sent again when the client resumes within
// the grace: same lease, same attempt, long before the lease could expire, and
// the client's Complete succeeds.
func TestResumeResendsDeliveryLostWithSocket(t *testing.T) {
	tp := newTap()
	n := startNodeOpts(t, t.TempDir(), nil, nodeOpts{
		server: func(c *server.Config) { c.ReconnectGraceMs = 60_000 },
		wrap:   tp.wrap,
	})
	p, err := testkit.NewProxy(n.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx := sdkCtx(t)
	pub := sdkDial(t, n.addr)
	// A lease far longer than the test: a redelivery by expiry cannot happen.
	if _, err := pub.DeclareQueue(ctx, "resend", sinew.QueueConfig{Partitions: 1, Lease: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	cons := sdkDial(t, p.Addr())
	sub, err := cons.Subscribe(ctx, "resend", sinew.WithPrefetch(4))
	if err != nil {
		t.Fatal(err)
	}

	p.SetStalled(true) // what the server writes now never reaches the client
	r, err := pub.PublishText(ctx, "resend", "in-flight")
	if err != nil {
		t.Fatal(err)
	}
	tp.waitWritten(t, func(f protocol.Frame, b protocol.Body) bool {
		d, ok := b.(*protocol.Deliver)
		return ok && string(d.Body) == "in-flight"
	})
	p.CutAll()
	p.SetStalled(false)

	m := sdkRecv(t, sub)
	if m.Text() != "in-flight" || m.Offset != r.Offset || m.Attempt != 1 {
		t.Fatalf("after resume got %q offset %d attempt %d, want in-flight at %d, attempt 1", m.Text(), m.Offset, m.Attempt, r.Offset)
	}
	if err := m.Complete(ctx); err != nil {
		t.Fatalf("Complete after resume: %v", err)
	}
	// Nothing else was queued for this subscription: a duplicate of the
	// re-sent delivery would arrive before the next message.
	if _, err := pub.PublishText(ctx, "resend", "next"); err != nil {
		t.Fatal(err)
	}
	if next := sdkRecv(t, sub); next.Text() != "next" || next.Attempt != 1 {
		t.Fatalf("got %q attempt %d, want next", next.Text(), next.Attempt)
	}
	st := n.srv.Stats().Sessions
	if st.Resumed != 1 || st.Resent != 1 || st.GraceExpired != 0 {
		t.Fatalf("session stats %+v: want one resume and one re-sent delivery", st)
	}
}
