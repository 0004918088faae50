package server

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/session/sessiontest"
	"github.com/sinewmq/sinew/protocol"
)

// safetyTimeout bounds every blocking read in these tests so a bug fails the test
// instead of hanging it. It is never what a test waits for.
const safetyTimeout = 20 * time.Second

// seq is a deterministic Rand.
type seq struct {
	mu sync.Mutex
	n  byte
}

func (s *seq) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range p {
		s.n++
		p[i] = s.n
	}
	return len(p), nil
}

type fixture struct {
	t    *testing.T
	srv  *Server
	fake *sessiontest.Fake
	addr string
}

// start runs a server with the fake backend on a loopback listener.
func start(t *testing.T, mod func(*Config)) *fixture {
	t.Helper()
	fake := sessiontest.New()
	cfg := Config{Backend: fake, OwnerID: "owner-test", Rand: &seq{}, ServerVersion: "test"}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), safetyTimeout)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, ErrServerClosed) {
			t.Errorf("serve returned %v", err)
		}
	})
	return &fixture{t: t, srv: srv, fake: fake, addr: ln.Addr().String()}
}

// client speaks raw frames.
type client struct {
	t   *testing.T
	nc  net.Conn
	br  *bufio.Reader
	req uint64
}

func (fx *fixture) dial() *client {
	fx.t.Helper()
	nc, err := net.Dial("tcp", fx.addr)
	if err != nil {
		fx.t.Fatal(err)
	}
	return wrap(fx.t, nc)
}

func wrap(t *testing.T, nc net.Conn) *client {
	c := &client{t: t, nc: nc, br: bufio.NewReader(nc)}
	t.Cleanup(func() { nc.Close() })
	return c
}

func (c *client) send(flags uint16, body protocol.Body) uint64 {
	c.t.Helper()
	c.req++
	c.raw(protocol.AppendFrame(nil, flags, c.req, body))
	return c.req
}

func (c *client) raw(b []byte) {
	c.t.Helper()
	if _, err := c.nc.Write(b); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// read returns the next frame that is not a server PING (PINGs are answered).
func (c *client) read() (protocol.FrameHeader, protocol.Body) {
	c.t.Helper()
	for {
		h, b, err := c.tryRead()
		if err != nil {
			c.t.Fatalf("read: %v", err)
		}
		if h.Op == protocol.OpPing {
			c.raw(protocol.AppendFrame(nil, 0, h.RequestID, &protocol.Pong{}))
			continue
		}
		return h, b
	}
}

func (c *client) tryRead() (protocol.FrameHeader, protocol.Body, error) {
	c.nc.SetReadDeadline(time.Now().Add(safetyTimeout))
	// A fresh buffer per frame: decoded bodies alias it and tests keep them.
	f, _, err := protocol.ReadFrame(c.br, 1<<24, nil)
	if err != nil {
		return protocol.FrameHeader{}, nil, err
	}
	b, err := protocol.Decode(f)
	if err != nil {
		c.t.Fatalf("decode %s: %v", f.Op, err)
	}
	return f.FrameHeader, b, nil
}

// expect reads the next frame and checks its op.
func expect[T protocol.Body](c *client) (protocol.FrameHeader, T) {
	c.t.Helper()
	h, b := c.read()
	v, ok := b.(T)
	if !ok {
		c.t.Fatalf("got %s %+v, want %T", h.Op, b, v)
	}
	return h, v
}

func (c *client) hello(h protocol.Hello) *protocol.HelloOK {
	c.t.Helper()
	if h.ProtocolVersion == 0 {
		h.ProtocolVersion = protocol.Version
	}
	c.send(0, &h)
	_, ok := expect[*protocol.HelloOK](c)
	return ok
}

// expectFatal reads an ERROR with code and Fatal set, then the close.
func (c *client) expectFatal(code protocol.Code) {
	c.t.Helper()
	_, e := expect[*protocol.ErrorBody](c)
	if e.Code != code || !e.Fatal {
		c.t.Fatalf("error %+v, want fatal %v", e, code)
	}
	c.expectClosed()
}

func (c *client) expectClosed() {
	c.t.Helper()
	for {
		h, _, err := c.tryRead()
		if err == nil && h.Op == protocol.OpPing {
			continue
		}
		if err == nil {
			c.t.Fatalf("got %s, want the connection closed", h.Op)
		}
		if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !isReset(err) {
			c.t.Fatalf("read: %v, want EOF", err)
		}
		return
	}
}

func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && !ne.Timeout()
}

// ping checks that the connection still answers.
func (c *client) ping() {
	c.t.Helper()
	id := c.send(0, &protocol.Ping{})
	h, _ := expect[*protocol.Pong](c)
	if h.RequestID != id {
		c.t.Fatalf("pong for %d, want %d", h.RequestID, id)
	}
}

func (c *client) publish(topic, body string) *protocol.PublishOK {
	c.t.Helper()
	id := c.send(0, &protocol.Publish{Topic: topic, Partition: -1, Body: []byte(body)})
	h, ok := expect[*protocol.PublishOK](c)
	if h.RequestID != id {
		c.t.Fatalf("PUBLISH_OK for %d, want %d", h.RequestID, id)
	}
	return ok
}

func (c *client) subscribe(s protocol.Subscribe) *protocol.SubscribeOK {
	c.t.Helper()
	c.send(0, &s)
	_, ok := expect[*protocol.SubscribeOK](c)
	return ok
}

func (c *client) settle(kind protocol.Op, tags ...uint64) []protocol.Code {
	c.t.Helper()
	id := c.send(0, &protocol.Settle{Kind: kind, Tags: tags})
	h, r := expect[*protocol.SettleResult](c)
	if h.RequestID != id {
		c.t.Fatalf("SETTLE_RESULT for %d, want %d", h.RequestID, id)
	}
	return r.Codes
}

// readN reads n frames (PINGs aside) and groups them by op, for replies whose
// order relative to pushes is not defined (a settle frees credit and the next
// DELIVER may overtake its SETTLE_RESULT).
func (c *client) readN(n int) map[protocol.Op][]protocol.Body {
	c.t.Helper()
	out := map[protocol.Op][]protocol.Body{}
	for range n {
		h, b := c.read()
		out[h.Op] = append(out[h.Op], b)
	}
	return out
}

// settleAnd sends a settle and reads its result plus extra further frames.
func (c *client) settleAnd(extra int, kind protocol.Op, tags ...uint64) ([]protocol.Code, map[protocol.Op][]protocol.Body) {
	c.t.Helper()
	c.send(0, &protocol.Settle{Kind: kind, Tags: tags})
	got := c.readN(1 + extra)
	rs := got[protocol.OpSettleResult]
	if len(rs) != 1 {
		c.t.Fatalf("frames %v, want one SETTLE_RESULT", got)
	}
	return rs[0].(*protocol.SettleResult).Codes, got
}
