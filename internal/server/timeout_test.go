package server

import (
	"context"
	"net"
	"testing"
	"testing/synctest"

	"github.com/sinewmq/sinew/internal/session/sessiontest"
	"github.com/sinewmq/sinew/protocol"
)

// pipeServer runs a server inside a synctest bubble and connects clients to it
// through net.Pipe, whose deadlines follow the bubble's fake clock.
type pipeServer struct {
	t   *testing.T
	srv *Server
}

func newPipeServer(t *testing.T, mod func(*Config)) *pipeServer {
	cfg := Config{Backend: sessiontest.New(), OwnerID: "owner-test", Rand: &seq{}, HandshakeTimeoutMs: 2000, HeartbeatMs: 1000}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &pipeServer{t: t, srv: srv}
}

func (p *pipeServer) dial() *client {
	a, b := net.Pipe()
	go p.srv.ServeConn(b)
	return wrap(p.t, a)
}

func (p *pipeServer) shutdown() {
	if err := p.srv.Shutdown(context.Background()); err != nil {
		p.t.Fatal(err)
	}
}

func TestHandshakeTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPipeServer(t, nil)
		other := p.dial()
		other.hello(protocol.Hello{})
		silent := p.dial()
		silent.expectFatal(protocol.CodeHandshakeTimeout) // after 2 s of fake time
		other.ping()
		p.shutdown()
	})
}

func TestHeartbeatPingAndTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPipeServer(t, nil)
		c := p.dial()
		c.hello(protocol.Hello{})
		// Idle for a heartbeat: the server pings.
		h, _, err := c.tryRead()
		if err != nil || h.Op != protocol.OpPing {
			t.Fatalf("got %v %v, want PING", h.Op, err)
		}
		// A peer that answers stays connected across many intervals.
		for range 5 {
			c.raw(protocol.AppendFrame(nil, 0, h.RequestID, &protocol.Pong{}))
			if h, _, err = c.tryRead(); err != nil || h.Op != protocol.OpPing {
				t.Fatalf("got %v %v, want PING", h.Op, err)
			}
		}
		// A second client goes silent; the first keeps answering.
		other := p.dial()
		other.hello(protocol.Hello{})
		var got *protocol.ErrorBody
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				_, b, err := other.tryRead()
				if err != nil {
					return
				}
				if e, ok := b.(*protocol.ErrorBody); ok {
					got = e
				}
			}
		}()
		for range 10 { // ten heartbeat intervals; other is cut after three
			c.raw(protocol.AppendFrame(nil, 0, h.RequestID, &protocol.Pong{}))
			if h, _, err = c.tryRead(); err != nil || h.Op != protocol.OpPing {
				t.Fatalf("got %v %v, want PING", h.Op, err)
			}
		}
		<-done
		if got == nil || got.Code != protocol.CodeHeartbeatTimeout || !got.Fatal {
			t.Fatalf("silent client got %+v, want fatal heartbeat_timeout", got)
		}
		c.raw(protocol.AppendFrame(nil, 0, h.RequestID, &protocol.Pong{}))
		c.ping()
		p.shutdown()
	})
}
