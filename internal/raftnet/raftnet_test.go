package raftnet

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/goleak"

	"github.com/sinewmq/sinew/internal/multiraft"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type got struct {
	from  uint64
	batch []multiraft.Envelope
}

// recorder is a Receiver that never blocks: the test reads ch.
type recorder struct{ ch chan got }

func (r *recorder) Deliver(from uint64, batch []multiraft.Envelope) {
	select {
	case r.ch <- got{from, batch}:
	default:
	}
}

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type tnode struct {
	t   *Transport
	rec *recorder
	log *lockedBuf
}

func start(t *testing.T, id uint64, cluster string, opts ...func(*Config)) *tnode {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{ch: make(chan got, 1024)}
	lb := &lockedBuf{}
	cfg := Config{
		ClusterID: cluster, NodeID: id, Listener: ln, Receiver: rec,
		BackoffMinMs: 5, BackoffMaxMs: 50,
		Logger: slog.New(slog.NewTextHandler(lb, nil)),
	}
	for _, o := range opts {
		o(&cfg)
	}
	tr, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return &tnode{t: tr, rec: rec, log: lb}
}

func (n *tnode) addr() string { return n.t.cfg.Listener.Addr().String() }

const waitMax = 20 * time.Second

func msg(group, from, to, index uint64) multiraft.Envelope {
	typ, term, next := raftpb.MsgApp, uint64(3), index+1
	return multiraft.Envelope{Group: group, Msg: &raftpb.Message{
		Type: typ, From: from, To: to, Term: term, Index: index,
		Entries: []raftpb.Entry{{Term: term, Index: next, Data: []byte("payload")}},
	}}
}

// await reads n's deliveries until one matches, resending with send (if
// not nil) on each poll tick, since the transport may lose a batch while
// it (re)connects.
func await(t *testing.T, n *tnode, what string, send func(), match func(got) bool) got {
	t.Helper()
	deadline := time.After(waitMax)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	if send != nil {
		send()
	}
	for {
		select {
		case g := <-n.rec.ch:
			if match(g) {
				return g
			}
		case <-tick.C:
			if send != nil {
				send()
			}
		case <-deadline:
			t.Fatalf("%s: not within %v", what, waitMax)
		}
	}
}

func TestDeliverBetweenThree(t *testing.T) {
	nodes := []*tnode{start(t, 1, "c"), start(t, 2, "c"), start(t, 3, "c")}
	for i, a := range nodes {
		for j, b := range nodes {
			if i != j {
				a.t.AddPeer(uint64(j+1), b.addr())
			}
		}
	}
	for i, a := range nodes {
		for j, b := range nodes {
			if i == j {
				continue
			}
			from, to := uint64(i+1), uint64(j+1)
			batch := []multiraft.Envelope{msg(7, from, to, 10), msg(8, from, to, 20)}
			g := await(t, b, "delivery", func() { a.t.Send(to, batch) }, func(g got) bool { return g.from == from })
			if len(g.batch) != 2 || g.batch[0].Group != 7 || g.batch[1].Group != 8 ||
				g.batch[1].Msg.Index != 20 || string(g.batch[1].Msg.Entries[0].Data) != "payload" ||
				g.batch[0].Msg.From != from || g.batch[0].Msg.To != to {
				t.Fatalf("%d->%d delivered %+v", from, to, g.batch)
			}
		}
	}
}

func TestCutConnectionReconnects(t *testing.T) {
	a, b := start(t, 1, "c"), start(t, 2, "c")
	a.t.AddPeer(2, b.addr())
	await(t, b, "first delivery", func() { a.t.Send(2, []multiraft.Envelope{msg(1, 1, 2, 1)}) }, func(got) bool { return true })
	dials := a.t.Stats().Dials
	a.t.CutConnections()
	b.t.CutConnections()
	await(t, b, "delivery after the cut", func() { a.t.Send(2, []multiraft.Envelope{msg(1, 1, 2, 99)}) },
		func(g got) bool { return g.batch[0].Msg.Index == 99 })
	if a.t.Stats().Dials <= dials {
		t.Errorf("delivered after a cut without a new dial (%d dials before, %d after)", dials, a.t.Stats().Dials)
	}
}

func TestOtherClusterRefused(t *testing.T) {
	a, b := start(t, 1, "alpha"), start(t, 2, "beta")
	a.t.AddPeer(2, b.addr())
	deadline := time.After(waitMax)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for b.t.Stats().Refused < 2 {
		a.t.Send(2, []multiraft.Envelope{msg(1, 1, 2, 1)})
		select {
		case g := <-b.rec.ch:
			t.Fatalf("a node of another cluster delivered %+v", g)
		case <-tick.C:
		case <-deadline:
			t.Fatalf("no refusal within %v; stats %+v", waitMax, b.t.Stats())
		}
	}
	if !bytes.Contains([]byte(b.log.String()), []byte("another cluster")) {
		t.Errorf("refusal log does not say why: %s", b.log.String())
	}
	if b.t.Stats().Delivered != 0 {
		t.Errorf("delivered %d batches from another cluster", b.t.Stats().Delivered)
	}
}

// TestGarbageNeverPanics: random bytes, a hello then random frames, and
// frames with a bad checksum or length close the connection; the node
// keeps serving a good peer afterwards.
func TestGarbageNeverPanics(t *testing.T) {
	b := start(t, 2, "c")
	rng := rand.New(rand.NewPCG(1, 2))
	raw := func(data []byte) {
		c, err := net.Dial("tcp", b.addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write(data)
		c.(*net.TCPConn).CloseWrite()
		c.SetReadDeadline(time.Now().Add(waitMax))
		var sink [256]byte
		for {
			if _, err := c.Read(sink[:]); err != nil {
				return // the node closed it, or answered a good hello and then closed on garbage
			}
		}
	}
	good := frame(hello(9, "c"))
	for range 50 {
		junk := make([]byte, rng.IntN(300))
		for i := range junk {
			junk[i] = byte(rng.Uint32())
		}
		raw(junk)
		raw(append(bytes.Clone(good), frame(junk)...))
		bad := frame(junk)
		if len(bad) > headerBytes {
			bad[rng.IntN(len(bad))] ^= 1 << rng.IntN(8)
		}
		raw(append(bytes.Clone(good), bad...))
	}
	huge := frame(nil)
	huge[0] = 0xff
	raw(append(bytes.Clone(good), huge...))
	if s := b.t.Stats(); s.BadFrames == 0 || s.Refused == 0 {
		t.Errorf("garbage was not counted: %+v", s)
	}
	a := start(t, 1, "c")
	a.t.AddPeer(2, b.addr())
	await(t, b, "good peer after garbage", func() { a.t.Send(2, []multiraft.Envelope{msg(1, 1, 2, 5)}) }, func(got) bool { return true })
}

// TestInboundConnsBounded: past InboundConnsMax, an accepted connection is
// closed at once; when one closes, a new one is served again.
func TestInboundConnsBounded(t *testing.T) {
	// The hello deadline is far beyond waitMax, so only the bound can
	// close the extra connection within the wait.
	b := start(t, 2, "c", func(c *Config) { c.InboundConnsMax, c.DialTimeoutMs = 2, 60_000 })
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range 2 {
		c, err := net.Dial("tcp", b.addr())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
		c.Write(frame(hello(9, "c"))) // say hello, so the handshake deadline does not close it
		c.SetReadDeadline(time.Now().Add(waitMax))
		var h [headerBytes]byte
		if _, err := io.ReadFull(c, h[:]); err != nil {
			t.Fatalf("held connection got no hello back: %v", err)
		}
	}
	extra, err := net.Dial("tcp", b.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	extra.SetReadDeadline(time.Now().Add(waitMax))
	var one [1]byte
	if _, err := extra.Read(one[:]); err == nil {
		t.Fatal("a connection over the bound was served")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("a connection over the bound was left open: %v", err)
	}
	if b.t.Stats().Refused == 0 {
		t.Error("the refusal was not counted")
	}
}

func TestSendNeverBlocks(t *testing.T) {
	a := start(t, 1, "c")
	// A peer that does not exist: the writer keeps failing to dial, the
	// queue fills, and Send drops and counts instead of blocking.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	a.t.AddPeer(2, dead)
	for range a.t.cfg.SendQueueMax + 100 {
		a.t.Send(2, []multiraft.Envelope{msg(1, 1, 2, 1)})
	}
	a.t.Send(42, []multiraft.Envelope{msg(1, 1, 42, 1)}) // unknown peer
	if s := a.t.Stats(); s.QueueDropped < 100 {
		t.Errorf("dropped %d, want at least 100 (queue %d)", s.QueueDropped, a.t.cfg.SendQueueMax)
	}
}

func TestBatchSplitAndDecode(t *testing.T) {
	var batch []multiraft.Envelope
	for i := range uint64(100) {
		batch = append(batch, msg(i, 1, 2, i))
	}
	big := msg(7, 1, 2, 7)
	big.Msg.Type = raftpb.MsgSnap
	big.Msg.Snapshot = &raftpb.Snapshot{Data: make([]byte, 4096)}
	batch = append(batch, big)
	frames, dropped := encodeBatch(batch, 1024)
	if len(dropped) != 1 || dropped[0].env.Group != 7 || dropped[0].typ != "MsgSnap" || dropped[0].bytes <= 4096 {
		t.Fatalf("dropped %+v, want the 4 KiB snapshot only", dropped)
	}
	if len(frames) < 2 {
		t.Fatalf("100 messages in %d frames of 1 KiB", len(frames))
	}
	var all []multiraft.Envelope
	for _, f := range frames {
		if len(f) > 1024 {
			t.Fatalf("frame of %d bytes over 1024", len(f))
		}
		got, err := decodeBatch(f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, got...)
	}
	if len(all) != 100 || all[99].Group != 99 || all[99].Msg.Index != 99 {
		t.Fatalf("decoded %d envelopes", len(all))
	}
	if _, err := decodeBatch([]byte{5, 1}); !errors.Is(err, ErrFrame) {
		t.Errorf("truncated batch: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	frames, _ := encodeBatch([]multiraft.Envelope{msg(1, 1, 2, 3)}, 1<<20)
	f.Add(frames[0])
	f.Add(hello(1, "c"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = decodeBatch(b)
		_, _, _ = parseHello(b)
		_, _ = readFrame(bytes.NewReader(b), 1<<16, nil)
	})
}

// TestPeerAddressChange: a peer named first at an address where nothing
// listens (a node's old port) is reached once AddPeer names its new one.
func TestPeerAddressChange(t *testing.T) {
	a, b := start(t, 1, "c"), start(t, 2, "c")
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	old := dead.Addr().String()
	dead.Close()
	a.t.AddPeer(2, old)
	deadline := time.Now().Add(waitMax)
	for a.t.Stats().Dials == 0 { // the writer tried the old address
		if time.Now().After(deadline) {
			t.Fatal("no dial of the old address")
		}
		a.t.Send(2, []multiraft.Envelope{msg(1, 1, 2, 6)})
		time.Sleep(5 * time.Millisecond) // polling the transport's own goroutine
	}
	a.t.AddPeer(2, b.addr())
	await(t, b, "a batch at the peer's new address", func() { a.t.Send(2, []multiraft.Envelope{msg(1, 1, 2, 7)}) },
		func(g got) bool { return g.from == 1 && len(g.batch) == 1 && g.batch[0].Msg.Index == 7 })
}

// A snapshot larger than the default frame: with the default FrameBytesMax
// it is dropped, counted and logged (never delivered, so raft would send
// it again forever); with a FrameBytesMax above it, as `sinew serve`
// configures, it is delivered whole.
func TestSnapshotLargerThanTheDefaultFrame(t *testing.T) {
	snap := func(from, to uint64) []multiraft.Envelope {
		m := msg(9, from, to, 1)
		m.Msg.Type, m.Msg.Entries = raftpb.MsgSnap, nil
		m.Msg.Snapshot = &raftpb.Snapshot{Data: bytes.Repeat([]byte{7}, 6<<20),
			Metadata: raftpb.SnapshotMetadata{Index: 5, Term: 3}}
		return []multiraft.Envelope{m, msg(10, from, to, 2)}
	}

	small, sink := start(t, 1, "c"), start(t, 2, "c")
	small.t.AddPeer(2, sink.addr())
	g := await(t, sink, "the small message beside the snapshot", func() { small.t.Send(2, snap(1, 2)) },
		func(g got) bool { return len(g.batch) > 0 })
	for _, e := range g.batch {
		if e.Msg.Type == raftpb.MsgSnap {
			t.Fatal("a 6 MiB snapshot went through a 4 MiB frame")
		}
	}
	// The snapshot goes on its own lane: its drop may come after the
	// small message's delivery.
	deadline := time.Now().Add(5 * time.Second)
	for small.t.Stats().Oversized == 0 || !strings.Contains(small.log.String(), "larger than a frame was dropped") {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: the dropped snapshot is not counted, or no WARN for it:\n%s", small.t.Stats(), small.log.String())
		}
		time.Sleep(5 * time.Millisecond) // polling the transport's own goroutine
	}

	big := func(c *Config) { c.FrameBytesMax = 8 << 20 }
	a, b := start(t, 3, "c", big), start(t, 4, "c", big)
	a.t.AddPeer(4, b.addr())
	g = await(t, b, "the snapshot", func() { a.t.Send(4, snap(3, 4)) }, func(g got) bool {
		return len(g.batch) > 0 && g.batch[0].Msg.Type == raftpb.MsgSnap
	})
	if d := g.batch[0].Msg.Snapshot.Data; len(d) != 6<<20 || d[len(d)-1] != 7 {
		t.Fatalf("snapshot of %d bytes delivered", len(d))
	}
}

// snapHolder is a Receiver that holds the reader of any batch with a
// snapshot until release is closed (a snapshot still on its way), and
// records every other batch.
type snapHolder struct {
	recorder
	held    chan struct{}
	release chan struct{}
	once    sync.Once
}

func (h *snapHolder) Deliver(from uint64, batch []multiraft.Envelope) {
	for _, e := range batch {
		if e.Msg.Type == raftpb.MsgSnap {
			h.once.Do(func() { close(h.held) })
			<-h.release
			return
		}
	}
	h.recorder.Deliver(from, batch)
}

// A snapshot on its way does not hold up the messages sent after it:
// they go on another connection (the snapshot lane is its own), so while
// the receiver still reads the snapshot, the heartbeats and appends of
// every group behind it arrive.
func TestSnapshotDoesNotHoldUpOtherMessages(t *testing.T) {
	h := &snapHolder{recorder: recorder{ch: make(chan got, 1024)}, held: make(chan struct{}), release: make(chan struct{})}
	a := start(t, 1, "c")
	b := start(t, 2, "c", func(c *Config) { c.Receiver = h })
	defer close(h.release)
	a.t.AddPeer(2, b.addr())
	snap := msg(9, 1, 2, 1)
	snap.Msg.Type, snap.Msg.Entries = raftpb.MsgSnap, nil
	snap.Msg.Snapshot = &raftpb.Snapshot{Data: bytes.Repeat([]byte{7}, 1<<20), Metadata: raftpb.SnapshotMetadata{Index: 5, Term: 3}}
	// Resent until the receiver holds it: the first may be lost while
	// the lane connects.
	deadline := time.After(waitMax)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	a.t.Send(2, []multiraft.Envelope{snap})
wait:
	for {
		select {
		case <-h.held:
			break wait
		case <-tick.C:
			a.t.Send(2, []multiraft.Envelope{snap})
		case <-deadline:
			t.Fatal("the snapshot did not reach the receiver")
		}
	}
	rec := &tnode{rec: &h.recorder}
	await(t, rec, "a message sent after the snapshot, while the snapshot is held", func() { a.t.Send(2, []multiraft.Envelope{msg(1, 1, 2, 42)}) },
		func(g got) bool { return len(g.batch) == 1 && g.batch[0].Msg.Index == 42 })
}

// A snapshot the transport drops is reported to the sending group at once,
// as raft's failed snapshot (MsgSnapStatus with Reject, from the peer it was
// for), so its leader sends another rather than wait for an answer: here
// one for a peer the transport does not know, and one larger than a frame.
func TestDroppedSnapshotIsReportedToItsGroup(t *testing.T) {
	snap := func(group, from, to uint64, bytesN int) multiraft.Envelope {
		m := msg(group, from, to, 1)
		m.Msg.Type, m.Msg.Entries = raftpb.MsgSnap, nil
		m.Msg.Snapshot = &raftpb.Snapshot{Data: bytes.Repeat([]byte{7}, bytesN),
			Metadata: raftpb.SnapshotMetadata{Index: 5, Term: 3}}
		return m
	}
	isLoss := func(group, peer, self uint64) func(got) bool {
		return func(g got) bool {
			if g.from != self || len(g.batch) != 1 {
				return false
			}
			e := g.batch[0]
			return e.Group == group && e.Msg.Type == raftpb.MsgSnapStatus && e.Msg.Reject && e.Msg.From == peer && e.Msg.To == self
		}
	}
	a, b := start(t, 1, "c"), start(t, 2, "c")
	// No peer 7: the snapshot (and the message beside it) go nowhere.
	a.t.Send(7, []multiraft.Envelope{msg(4, 1, 7, 1), snap(5, 1, 7, 10)})
	await(t, a, "the report of a snapshot for an unknown peer", nil, isLoss(5, 7, 1))
	// Larger than the 4 MiB default frame: dropped by the peer's writer.
	a.t.AddPeer(2, b.addr())
	a.t.Send(2, []multiraft.Envelope{snap(6, 1, 2, 6<<20)})
	await(t, a, "the report of a snapshot larger than a frame", nil, isLoss(6, 2, 1))
}
