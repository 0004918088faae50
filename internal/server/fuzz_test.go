package server

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/session/sessiontest"
	"github.com/sinewmq/sinew/protocol"
)

// FuzzServeConn feeds arbitrary bytes to one connection. The server must answer or
// close, never panic, and tear the connection down completely.
func FuzzServeConn(f *testing.F) {
	hello := protocol.AppendFrame(nil, 0, 1, &protocol.Hello{ProtocolVersion: protocol.Version})
	seed := func(bodies ...protocol.Body) []byte {
		b := append([]byte(nil), hello...)
		for i, x := range bodies {
			b = protocol.AppendFrame(b, 0, uint64(i+2), x)
		}
		return b
	}
	f.Add(seed(&protocol.Publish{Topic: "q", Body: []byte("x")}, &protocol.Subscribe{Topic: "q", Prefetch: 2},
		&protocol.Settle{Kind: protocol.OpAck, Tags: []uint64{1, 5}, Leases: []protocol.LeaseRef{{SubID: 1, LeaseID: 1}, {SubID: 9, Epoch: 1}}},
		&protocol.Reconcile{Subs: []protocol.SubView{{SubID: 1, Topic: "q"}}, InflightFollows: true},
		&protocol.Inflight{Entries: []protocol.InflightEntry{{Tag: 1}, {Tag: 7, Lease: protocol.LeaseRef{SubID: 1, LeaseID: 3}}}},
		&protocol.EndSession{}, &protocol.Ping{}))
	f.Add([]byte{})
	f.Add(hello)
	f.Add(seed(&protocol.Publish{Topic: "q", Body: []byte("x")}, &protocol.Subscribe{Topic: "q", Prefetch: 1},
		&protocol.Settle{Kind: protocol.OpAck, Tags: []uint64{1}}, &protocol.Settle{Kind: protocol.OpNack, Tags: []uint64{2, 0}}))
	f.Add(seed(&protocol.Publish{Topic: "q", Body: []byte("x")}, &protocol.Subscribe{Topic: "q", Prefetch: 1},
		&protocol.Extend{Tags: []uint64{1}, ExtendMs: 1000}, &protocol.Extend{Tags: []uint64{1, 9}, ExtendMs: 0, Leases: []protocol.LeaseRef{{SubID: 1, LeaseID: 1}}},
		&protocol.Extend{Tags: []uint64{0}, ExtendMs: 5, Leases: []protocol.LeaseRef{{SubID: 1, Offset: 1, LeaseID: 1}}},
		&protocol.Settle{Kind: protocol.OpAck, Tags: []uint64{1}}, &protocol.Extend{Tags: []uint64{1}, ExtendMs: 1 << 40}))
	f.Add(seed(&protocol.Subscribe{Topic: "q", AckMode: protocol.AckAuto}, &protocol.Publish{Topic: "q"},
		&protocol.Reconcile{Policy: protocol.ReconcileRestore, Subs: []protocol.SubView{{SubID: 1, Topic: "q"}, {SubID: 9, Topic: "r"}}},
		&protocol.Unsubscribe{SubID: 1}, &protocol.DeclareQueue{Topic: "q"}, &protocol.Ping{}, &protocol.Hello{}))
	f.Add([]byte("\x00\x00\x00\x0c\x01\x7f\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01"))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, input []byte) {
		srv, err := New(Config{Backend: sessiontest.New(), OwnerID: "o", Rand: &seq{}, HandshakeTimeoutMs: 5000,
			FrameBytesMax: protocol.FrameBytesMin, BodyBytesMax: 1 << 10, ReconnectGraceMs: 10})
		if err != nil {
			t.Fatal(err)
		}
		a, b := net.Pipe()
		served := make(chan struct{})
		go func() { srv.ServeConn(b); close(served) }()
		drained := make(chan struct{})
		go func() { io.Copy(io.Discard, a); close(drained) }()
		a.SetWriteDeadline(time.Now().Add(5 * time.Second)) // safety net only
		a.Write(input)
		a.Close()
		<-served
		<-drained
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
