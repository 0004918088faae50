package server

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/session/bridge"
	"github.com/sinewmq/sinew/internal/session/sessiontest"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// These tests hold each connection limit with hostile peers while a
// well-behaved client keeps publishing and consuming on a real broker.

// goodClient is a well-behaved client: subscribed to its own topic with
// prefetch 1, it publishes a message, receives it and acks it.
type goodClient struct {
	c     *client
	topic string
	n     int
}

func newGoodClient(c *client, topic string) *goodClient {
	c.hello(protocol.Hello{ClientName: "good"})
	c.subscribe(protocol.Subscribe{Topic: topic, Partition: -1, Prefetch: 1})
	return &goodClient{c: c, topic: topic}
}

// roundTrip publishes one message and consumes it; it fails the test unless
// the publish is confirmed and the very message comes back and is acked.
func (g *goodClient) roundTrip(t *testing.T) {
	t.Helper()
	g.n++
	body := fmt.Sprintf("%s-%d", g.topic, g.n)
	g.c.send(0, &protocol.Publish{Topic: g.topic, Partition: -1, Body: []byte(body)})
	got := g.c.readN(2) // PUBLISH_OK and DELIVER, in either order
	if len(got[protocol.OpPublishOK]) != 1 || len(got[protocol.OpDeliver]) != 1 {
		t.Fatalf("good client: frames %v, want PUBLISH_OK and DELIVER", got)
	}
	d := got[protocol.OpDeliver][0].(*protocol.Deliver)
	if string(d.Body) != body {
		t.Fatalf("good client: delivered %q, want %q", d.Body, body)
	}
	if codes := g.c.settle(protocol.OpAck, d.Tag); codes[0] != protocol.CodeOK {
		t.Fatalf("good client: ack %v", codes)
	}
}

// expectRefused reads the fatal ERROR of a refused connection and checks
// that its message names the limit.
func expectRefused(t *testing.T, c *client, code protocol.Code, limit string) {
	t.Helper()
	_, e := expect[*protocol.ErrorBody](c)
	if e.Code != code || !e.Fatal || !strings.Contains(e.Message, limit) {
		t.Fatalf("error %+v, want fatal %v naming %s", e, code, limit)
	}
	c.expectClosed()
}

// addrConn gives one end of a net.Pipe a TCP remote address, so the
// per-address limit sees a source IP.
type addrConn struct {
	net.Conn
	remote net.Addr
}

func (a addrConn) RemoteAddr() net.Addr { return a.remote }

// realPipeServer serves a real broker on an in-memory file system inside a
// synctest bubble; clients connect through net.Pipe.
func realPipeServer(t *testing.T, mod func(*Config)) *pipeServer {
	t.Helper()
	b, err := broker.Open(broker.Config{DataDir: "/data", FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("broker close: %v", err)
		}
	})
	return newPipeServer(t, func(c *Config) {
		c.Backend = bridge.New(b)
		if mod != nil {
			mod(c)
		}
	})
}

// dialFrom connects a client whose source address is ip and returns once the
// server has taken the connection in (or is writing its refusal).
func (p *pipeServer) dialFrom(ip string) *client {
	a, b := net.Pipe()
	go p.srv.ServeConn(addrConn{Conn: b, remote: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}})
	synctest.Wait()
	return wrap(p.t, a)
}

func TestLimitConnectionsTotal(t *testing.T) {
	fx := startReal(t, broker.Config{}, func(c *Config) { c.ConnectionsMax = 3 })
	good := newGoodClient(fx.dial(), "good")
	for range 2 {
		fx.dial().hello(protocol.Hello{ClientName: "hostile"})
	}
	good.roundTrip(t)
	expectRefused(t, fx.dial(), protocol.CodeTooManyConns, "limits.connections_max")
	good.roundTrip(t)
	st := fx.srv.Stats()
	if st.Refused.Connections != 1 || st.ConnectionsRejected != 1 || st.ConnectionsOpen != 3 {
		t.Fatalf("stats: refused %+v, rejected %d, open %d", st.Refused, st.ConnectionsRejected, st.ConnectionsOpen)
	}
}

// Over TCP on loopback: connections from 127.0.0.2 reach their per-address
// cap while a client from 127.0.0.1 still connects and works.
func TestLimitConnectionsPerAddressTCP(t *testing.T) {
	fx := startReal(t, broker.Config{}, func(c *Config) { c.ConnectionsPerAddressMax = 2 })
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: safetyTimeout}
	dialHostile := func() *client {
		nc, err := d.Dial("tcp", fx.addr)
		if err != nil {
			t.Skipf("cannot dial from 127.0.0.2 on this host: %v", err)
		}
		return wrap(t, nc)
	}
	for range 2 {
		dialHostile().hello(protocol.Hello{ClientName: "hostile"})
	}
	expectRefused(t, dialHostile(), protocol.CodeTooManyConns, "limits.connections_per_address_max")
	good := newGoodClient(fx.dial(), "good") // from 127.0.0.1
	good.roundTrip(t)
	good2 := newGoodClient(fx.dial(), "good2") // 127.0.0.1 holds 2 now, at its cap too
	good2.roundTrip(t)
	expectRefused(t, fx.dial(), protocol.CodeTooManyConns, "limits.connections_per_address_max")
	good.roundTrip(t)
	if r := fx.srv.Stats().Refused; r.ConnectionsPerAddress != 2 || r.Connections != 0 {
		t.Fatalf("refusals %+v", r)
	}
}

// The per-address count follows connections as they close, and a
// connection without an IP address counts only towards the total.
func TestLimitConnectionsPerAddressReleased(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := realPipeServer(t, func(c *Config) { c.ConnectionsPerAddressMax = 2 })
		good := newGoodClient(p.dialFrom("10.0.0.1"), "good")
		h1 := p.dialFrom("10.0.0.9")
		h1.hello(protocol.Hello{})
		p.dialFrom("10.0.0.9").hello(protocol.Hello{})
		expectRefused(t, p.dialFrom("10.0.0.9"), protocol.CodeTooManyConns, "limits.connections_per_address_max")
		good.roundTrip(t)
		// Another address is not affected, nor is a connection with no IP.
		p.dialFrom("10.0.0.2").hello(protocol.Hello{})
		for range 3 {
			p.dial().hello(protocol.Hello{})
		}
		h1.nc.Close()
		synctest.Wait() // the server saw the close and released the slot
		p.dialFrom("10.0.0.9").hello(protocol.Hello{})
		good.roundTrip(t)
		if r := p.srv.Stats().Refused; r.ConnectionsPerAddress != 1 {
			t.Fatalf("refusals %+v", r)
		}
		p.shutdown()
	})
}

// Handshakes in progress are capped: one more connection is refused at
// once; a finished HELLO or the handshake timeout frees a slot; an
// established client carries on throughout.
func TestLimitHandshakesInProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := realPipeServer(t, func(c *Config) { c.HandshakesMax = 2 }) // handshake timeout 2 s
		good := newGoodClient(p.dialFrom("10.0.0.1"), "good")
		s1 := p.dialFrom("10.0.0.9")
		s2 := p.dialFrom("10.0.0.9")
		expectRefused(t, p.dialFrom("10.0.0.3"), protocol.CodeTooManyConns, "limits.handshakes_max")
		good.roundTrip(t)

		s1.hello(protocol.Hello{}) // its slot is free once the HELLO succeeded
		synctest.Wait()
		p.dialFrom("10.0.0.4").hello(protocol.Hello{})
		s5 := p.dialFrom("10.0.0.9")
		expectRefused(t, p.dialFrom("10.0.0.5"), protocol.CodeTooManyConns, "limits.handshakes_max")
		good.roundTrip(t)

		// The silent ones are cut by the handshake timeout (fake time), and
		// their slots come back.
		s2.expectFatal(protocol.CodeHandshakeTimeout)
		s5.expectFatal(protocol.CodeHandshakeTimeout)
		synctest.Wait()
		late := newGoodClient(p.dialFrom("10.0.0.6"), "late")
		late.roundTrip(t)
		good.roundTrip(t)
		if r := p.srv.Stats().Refused; r.Handshakes != 2 || r.HandshakeTimeouts != 2 || r.Connections != 0 {
			t.Fatalf("refusals %+v", r)
		}
		p.shutdown()
	})
}

// Subscriptions per session: one over the cap is limit_exceeded on that
// request only; the connection and other clients carry on.
func TestLimitSubscriptionsPerConnection(t *testing.T) {
	fx := startReal(t, broker.Config{}, func(c *Config) { c.SubscriptionsMax = 2 })
	good := newGoodClient(fx.dial(), "good")
	hostile := fx.dial()
	hostile.hello(protocol.Hello{ClientName: "hostile"})
	hostile.subscribe(protocol.Subscribe{Topic: "h1", Partition: -1})
	hostile.subscribe(protocol.Subscribe{Topic: "h2", Partition: -1})
	for range 3 {
		id := hostile.send(0, &protocol.Subscribe{Topic: "h3", Partition: -1})
		if e := expectErr(t, hostile, id, protocol.CodeLimitExceeded); !strings.Contains(e.Message, "2 subscriptions") {
			t.Fatalf("limit error %q does not say the limit", e.Message)
		}
		good.roundTrip(t)
	}
	hostile.publish("h-other", "still served")
	hostile.ping()
	if n := fx.srv.Stats().Sessions.SubscriptionsRefused; n != 3 {
		t.Fatalf("subscriptions refused %d, want 3", n)
	}
}

// BenchmarkConnChurn is one connection that sends a bad first frame and is
// cut, as a garbage or wrong-credential peer in a reconnect loop does: its
// B/op is what each such connection costs the collector.
func BenchmarkConnChurn(b *testing.B) {
	srv, err := New(Config{Backend: sessiontest.New(), OwnerID: "owner-bench", Rand: &seq{}})
	if err != nil {
		b.Fatal(err)
	}
	junk := protocol.AppendFrame(nil, 0, 1, &protocol.Ping{}) // not HELLO: handshake_required
	reply := make([]byte, 4<<10)
	b.ReportAllocs()
	for b.Loop() {
		a, c := net.Pipe()
		done := make(chan struct{})
		go func() { srv.ServeConn(c); close(done) }()
		a.Write(junk)
		for {
			if _, err := a.Read(reply); err != nil {
				break
			}
		}
		a.Close()
		<-done
	}
}

// Password checks from one source address run one at a time, and a failed
// one holds its address's lane through the failure delay: a second wrong
// password from the same address is answered a delay later, while one from
// another address and a right one after the first failure are not held up
// by other addresses (fake clock).
func TestLoginLanePerAddress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		users := newUsers(t, "alice", "correct horse")
		p := newPipeServer(t, func(c *Config) {
			c.Users, c.AuthFailureDelayMs, c.HandshakeTimeoutMs = users, 1000, 5000
		})
		wrong := protocol.Hello{ProtocolVersion: protocol.Version, User: "alice", Credentials: "wrong"}
		var mu sync.Mutex
		answeredAt := map[string]time.Duration{}
		start := time.Now()
		watch := func(name string, c *client) {
			go func() {
				if _, b, err := c.tryRead(); err == nil {
					if e, ok := b.(*protocol.ErrorBody); ok && e.Code == protocol.CodeAuthFailed {
						mu.Lock()
						answeredAt[name] = time.Since(start)
						mu.Unlock()
					}
				}
			}()
		}
		for _, n := range []struct{ name, ip string }{{"first", "10.0.0.9"}, {"second", "10.0.0.9"}, {"other", "10.0.0.3"}} {
			c := p.dialFrom(n.ip)
			c.send(0, &wrong)
			watch(n.name, c)
			synctest.Wait()
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		mu.Lock()
		got := map[string]time.Duration{}
		for k, v := range answeredAt {
			got[k] = v
		}
		mu.Unlock()
		want := map[string]time.Duration{"first": time.Second, "other": time.Second, "second": 2 * time.Second}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("auth_failed at %v (fake time), want %v", got, want)
			}
		}
		p.dialFrom("10.0.0.9").hello(protocol.Hello{User: "alice", Credentials: "correct horse"})
		if n := p.srv.logins.Len(); n != 0 {
			t.Fatalf("%d login lanes left", n)
		}
		p.shutdown()
	})
}

// sniffConn reads before its first write, as a TLS server connection does
// (its handshake runs on the first Read or Write).
type sniffConn struct {
	net.Conn
	once sync.Once
}

func (c *sniffConn) Write(b []byte) (int, error) {
	var err error
	c.once.Do(func() { _, err = c.Conn.Read(make([]byte, 1)) })
	if err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// A refused connection whose write must first read (a TLS handshake) from a
// peer that sends nothing is closed within the reject timeout: refused
// connections are in no count, so none may hold a goroutine.
func TestRefusalBoundedWhenWriteReads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := realPipeServer(t, func(c *Config) { c.ConnectionsMax = 1 })
		good := newGoodClient(p.dialFrom("10.0.0.1"), "good")
		a, b := net.Pipe()
		defer a.Close()
		done := make(chan struct{})
		go func() { p.srv.ServeConn(&sniffConn{Conn: b}); close(done) }()
		time.Sleep(rejectWriteTimeoutMs * time.Millisecond)
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("the refused connection is still held after the reject timeout")
		}
		good.roundTrip(t)
		p.shutdown()
	})
}
