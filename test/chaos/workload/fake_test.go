package workload

import (
	"bufio"
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/sinewmq/sinew/protocol"
)

// fakeBroker is a tiny in-memory broker speaking just enough of the protocol
// for the workload's own tests: one queue, no leases, unsettled deliveries of
// a closed connection return to the queue. loseEvery > 0 makes it confirm
// every loseEvery-th publish without keeping it, so tests can show the
// checker catches a broker that loses confirmed messages.
type fakeBroker struct {
	l         net.Listener
	loseEvery int
	cutAt     int // close every connection when the cutAt-th fresh publish arrives
	wg        sync.WaitGroup

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	msgs     [][]byte
	ready    []int
	seen     map[string]bool // producer:seq already accepted
	subs     []*fakeSub
	publishN int
}

type fakeSub struct {
	c        *fakeConn
	id       uint64
	prefetch int
	leased   map[uint64]int // tag -> message index
}

type fakeConn struct {
	nc   net.Conn
	wmu  sync.Mutex
	tags uint64
}

func (c *fakeConn) write(id uint64, b protocol.Body) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, _ = c.nc.Write(protocol.AppendFrame(nil, 0, id, b))
}

func startFake(t *testing.T, loseEvery int) *fakeBroker {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeBroker{l: l, loseEvery: loseEvery, conns: map[net.Conn]struct{}{}, seen: map[string]bool{}}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conns[nc] = struct{}{}
			f.mu.Unlock()
			f.wg.Add(1)
			go func() { defer f.wg.Done(); f.serve(nc) }()
		}
	}()
	t.Cleanup(f.close)
	return f
}

func (f *fakeBroker) addr() string { return f.l.Addr().String() }

// cutAll closes every client connection, as a network break would.
func (f *fakeBroker) cutAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for nc := range f.conns {
		nc.Close()
	}
}

func (f *fakeBroker) close() {
	f.l.Close()
	f.cutAll()
	f.wg.Wait()
}

func (f *fakeBroker) serve(nc net.Conn) {
	c := &fakeConn{nc: nc}
	defer func() {
		nc.Close()
		f.mu.Lock()
		delete(f.conns, nc)
		kept := f.subs[:0]
		for _, s := range f.subs {
			if s.c != c {
				kept = append(kept, s)
				continue
			}
			for _, idx := range s.leased {
				f.ready = append(f.ready, idx)
			}
		}
		f.subs = kept
		f.dispatchLocked()
		f.mu.Unlock()
	}()
	br := bufio.NewReader(nc)
	var buf []byte
	for {
		var fr protocol.Frame
		var err error
		fr, buf, err = protocol.ReadFrame(br, protocol.FrameBytesDefault, buf)
		if err != nil {
			return
		}
		body, err := protocol.Decode(fr)
		if err != nil {
			return
		}
		id := fr.RequestID
		switch m := body.(type) {
		case *protocol.Hello:
			c.write(id, &protocol.HelloOK{ProtocolVersion: 1, HeartbeatMs: 1000,
				Resume: protocol.ResumeIdentity{ClientID: "x", OwnerID: "fake", Token: []byte{1}},
				Limits: protocol.Limits{FrameBytesMax: protocol.FrameBytesDefault, SettleBatchMax: 16}})
		case *protocol.Ping:
			c.write(id, &protocol.Pong{})
		case *protocol.DeclareQueue:
			c.write(id, &protocol.DeclareOK{Partitions: 1, Created: true})
		case *protocol.Publish:
			f.mu.Lock()
			key := fmt.Sprintf("%s:%d", m.ProducerID, m.ProducerSeq)
			dup := f.seen[key]
			if !dup {
				f.seen[key] = true
				f.publishN++
				if f.publishN == f.cutAt {
					for nc := range f.conns {
						nc.Close()
					}
				}
				if f.loseEvery == 0 || f.publishN%f.loseEvery != 0 {
					f.msgs = append(f.msgs, append([]byte(nil), m.Body...))
					f.ready = append(f.ready, len(f.msgs)-1)
				}
			}
			f.dispatchLocked()
			f.mu.Unlock()
			c.write(id, &protocol.PublishOK{Duplicate: dup})
		case *protocol.Subscribe:
			f.mu.Lock()
			s := &fakeSub{c: c, id: uint64(len(f.subs) + 1), prefetch: int(m.Prefetch), leased: map[uint64]int{}}
			f.subs = append(f.subs, s)
			c.write(id, &protocol.SubscribeOK{SubID: s.id, Partitions: []uint32{0}, Prefetch: m.Prefetch})
			f.dispatchLocked()
			f.mu.Unlock()
		case *protocol.Unsubscribe:
			f.mu.Lock()
			kept := f.subs[:0]
			for _, s := range f.subs {
				if s.c == c && s.id == m.SubID {
					for _, idx := range s.leased {
						f.ready = append(f.ready, idx)
					}
					continue
				}
				kept = append(kept, s)
			}
			f.subs = kept
			f.dispatchLocked()
			f.mu.Unlock()
			c.write(id, &protocol.OK{})
		case *protocol.Settle:
			f.mu.Lock()
			codes := make([]protocol.Code, len(m.Tags))
			for i, tag := range m.Tags {
				codes[i] = protocol.CodeUnknownTag
				for _, s := range f.subs {
					if _, ok := s.leased[tag]; ok && s.c == c {
						delete(s.leased, tag)
						codes[i] = protocol.CodeOK
					}
				}
			}
			f.dispatchLocked()
			f.mu.Unlock()
			c.write(id, &protocol.SettleResult{Codes: codes})
		}
	}
}

func (f *fakeBroker) dispatchLocked() {
	for _, s := range f.subs {
		for len(f.ready) > 0 && len(s.leased) < s.prefetch {
			idx := f.ready[0]
			f.ready = f.ready[1:]
			s.c.tags++
			s.leased[s.c.tags] = idx
			s.c.write(0, &protocol.Deliver{SubID: s.id, Tag: s.c.tags, Offset: uint64(idx), Attempt: 1, Body: f.msgs[idx]})
		}
	}
}
