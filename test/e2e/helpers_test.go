package e2e_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/server"
	"github.com/sinewmq/sinew/internal/session/bridge"
	"github.com/sinewmq/sinew/protocol"
)

// safetyTimeout bounds every blocking read so that a bug fails a test instead of
// hanging it. Tests wait for frames, never for time.
const safetyTimeout = 30 * time.Second

// node is an in-process broker and server on a loopback port.
type node struct {
	t      *testing.T
	dir    string
	b      *broker.Broker
	srv    *server.Server
	addr   string
	served chan error
	bcfg   broker.Config
	opts   nodeOpts
}

// nodeOpts adjust a node beyond its broker configuration.
type nodeOpts struct {
	// addr to listen on; "" picks a free loopback port.
	addr string
	// server adjusts the server's configuration.
	server func(*server.Config)
	// wrap, when set, wraps the listener the server accepts on.
	wrap func(net.Listener) net.Listener
	// drain, when set, bounds the drain of stop, and a drain that runs out of
	// it is expected (the test holds deliveries unsettled across the stop).
	// Unset, the drain is bounded by safetyTimeout and must finish early,
	// because nothing is left in flight.
	drain time.Duration
}

func startNode(t *testing.T, dir string, mod func(*broker.Config)) *node {
	t.Helper()
	return startNodeOpts(t, dir, mod, nodeOpts{})
}

func startNodeOpts(t *testing.T, dir string, mod func(*broker.Config), o nodeOpts) *node {
	t.Helper()
	cfg := broker.Config{DataDir: dir}
	if mod != nil {
		mod(&cfg)
	}
	b, err := broker.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	scfg := server.Config{Backend: bridge.New(b), OwnerID: "e2e-owner", Rand: rand.Reader, ServerVersion: "e2e"}
	if o.server != nil {
		o.server(&scfg)
	}
	srv, err := server.New(scfg)
	if err != nil {
		t.Fatal(err)
	}
	addr := o.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, dir: dir, b: b, srv: srv, addr: ln.Addr().String(), served: make(chan error, 1), bcfg: cfg, opts: o}
	if o.wrap != nil {
		ln = o.wrap(ln)
	}
	go func() { n.served <- srv.Serve(ln) }()
	t.Cleanup(n.stop)
	return n
}

// stop drains the server and closes the broker; safe to call twice.
func (n *node) stop() {
	if n.srv == nil {
		return
	}
	bound := safetyTimeout
	if n.opts.drain > 0 {
		bound = n.opts.drain
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if err := n.srv.Shutdown(ctx); err != nil && !(n.opts.drain > 0 && errors.Is(err, context.DeadlineExceeded)) {
		n.t.Errorf("shutdown: %v", err)
	}
	if err := <-n.served; !errors.Is(err, server.ErrServerClosed) {
		n.t.Errorf("serve: %v", err)
	}
	if err := n.b.Close(); err != nil {
		n.t.Errorf("broker close: %v", err)
	}
	n.srv = nil
}

// restart closes everything and opens the same data directory again.
func (n *node) restart() *node {
	n.stop()
	cfg := n.bcfg
	return startNodeOpts(n.t, n.dir, func(c *broker.Config) { *c = cfg }, n.opts)
}

// client speaks raw protocol frames.
type client struct {
	t   *testing.T
	nc  net.Conn
	br  *bufio.Reader
	req uint64
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &client{t: t, nc: nc, br: bufio.NewReader(nc)}
	c.send(0, &protocol.Hello{ProtocolVersion: protocol.Version, ClientName: "e2e"})
	expect[*protocol.HelloOK](c)
	return c
}

func (c *client) send(flags uint16, body protocol.Body) uint64 {
	c.t.Helper()
	c.req++
	if _, err := c.nc.Write(protocol.AppendFrame(nil, flags, c.req, body)); err != nil {
		c.t.Fatalf("write: %v", err)
	}
	return c.req
}

// read returns the next frame other than PING, answering PINGs.
func (c *client) read() (protocol.FrameHeader, protocol.Body) {
	c.t.Helper()
	for {
		c.nc.SetReadDeadline(time.Now().Add(safetyTimeout))
		f, _, err := protocol.ReadFrame(c.br, 1<<24, nil)
		if err != nil {
			c.t.Fatalf("read: %v", err)
		}
		b, err := protocol.Decode(f)
		if err != nil {
			c.t.Fatalf("decode %s: %v", f.Op, err)
		}
		if f.Op == protocol.OpPing {
			c.nc.Write(protocol.AppendFrame(nil, 0, f.RequestID, &protocol.Pong{}))
			continue
		}
		if e, ok := b.(*protocol.ErrorBody); ok && e.Fatal {
			c.t.Fatalf("fatal error from server: %+v", e)
		}
		return f.FrameHeader, b
	}
}

func expect[T protocol.Body](c *client) T {
	c.t.Helper()
	h, b := c.read()
	v, ok := b.(T)
	if !ok {
		c.t.Fatalf("got %s %+v, want %T", h.Op, b, v)
	}
	return v
}

// call sends a request and returns its reply, keeping pushes (DELIVER, SUB_CLOSED)
// that arrive meanwhile in c's backlog.
func (c *client) call(body protocol.Body) protocol.Body {
	c.t.Helper()
	id := c.send(0, body)
	for {
		h, b := c.read()
		if h.RequestID == id && h.Op != protocol.OpDeliver && h.Op != protocol.OpSubClosed {
			return b
		}
		if d, ok := b.(*protocol.Deliver); ok {
			backlog[c] = append(backlog[c], d)
			continue
		}
		c.t.Fatalf("unexpected %s %+v while waiting for reply %d", h.Op, b, id)
	}
}

// backlog holds deliveries that arrived while a test waited for a reply. Tests in
// this package do not run in parallel.
var backlog = map[*client][]*protocol.Deliver{}

// next returns the next delivery (from the backlog first).
func (c *client) next() *protocol.Deliver {
	c.t.Helper()
	if q := backlog[c]; len(q) > 0 {
		backlog[c] = q[1:]
		return q[0]
	}
	return expect[*protocol.Deliver](c)
}

func (c *client) pending() int { return len(backlog[c]) }

func (c *client) publish(p *protocol.Publish) *protocol.PublishOK {
	c.t.Helper()
	switch r := c.call(p).(type) {
	case *protocol.PublishOK:
		return r
	default:
		c.t.Fatalf("publish: got %+v", r)
	}
	return nil
}

func (c *client) declare(d *protocol.DeclareQueue) *protocol.DeclareOK {
	c.t.Helper()
	r, ok := c.call(d).(*protocol.DeclareOK)
	if !ok {
		c.t.Fatalf("declare %+v failed", d)
	}
	return r
}

func (c *client) subscribe(s *protocol.Subscribe) *protocol.SubscribeOK {
	c.t.Helper()
	r, ok := c.call(s).(*protocol.SubscribeOK)
	if !ok {
		c.t.Fatalf("subscribe %+v failed: %+v", s, r)
	}
	return r
}

func (c *client) settle(kind protocol.Op, delayMs int64, tags ...uint64) []protocol.Code {
	c.t.Helper()
	r, ok := c.call(&protocol.Settle{Kind: kind, Tags: tags, DelayMs: delayMs}).(*protocol.SettleResult)
	if !ok {
		c.t.Fatalf("settle failed: %+v", r)
	}
	return r.Codes
}

// quiet checks that no delivery is waiting: a PING round trip flushes anything
// the server had queued before it.
func (c *client) quiet() {
	c.t.Helper()
	if _, ok := c.call(&protocol.Ping{}).(*protocol.Pong); !ok {
		c.t.Fatal("no PONG")
	}
	if n := c.pending(); n != 0 {
		c.t.Fatalf("%d unexpected deliveries: first %+v", n, backlog[c][0])
	}
}

func header(d *protocol.Deliver, key string) string {
	for _, h := range d.Headers {
		if h.Key == key {
			return h.Value
		}
	}
	return ""
}
