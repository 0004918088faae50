package session_test

import (
	"bytes"
	"sync/atomic"
	"testing"

	"github.com/sinewmq/sinew/internal/session"
	"github.com/sinewmq/sinew/internal/session/sessiontest"
	"github.com/sinewmq/sinew/protocol"
)

// frameBytes is the Outbound.Bytes of one DELIVER of a 1 KiB body on topic "q".
const frameBytes = 1<<10 + 1 + 128

func newBoundedFixture(t *testing.T, graceMs int64, mod func(*session.Config)) *fixture {
	fx := &fixture{t: t, fake: sessiontest.New(), timers: &timers{}}
	cfg := session.Config{
		Backend: fx.fake, OwnerID: "owner-a", Rand: &counter{}, ReconnectGraceMs: graceMs,
		AfterFunc: fx.timers.after, SubscriptionsMax: 4,
	}
	mod(&cfg)
	reg, err := session.NewRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fx.reg = reg
	return fx
}

func (fx *fixture) publishKiB(topic string, n int) {
	body := bytes.Repeat([]byte{'k'}, 1<<10)
	for range n {
		fx.fake.Publish(&protocol.Publish{Topic: topic, Body: body}, func(protocol.PublishOK, error) {})
	}
}

// TestDormantSessionTakesNoDeliveries: a dormant session takes no new
// deliveries (they stay ready in the broker for live consumers), and its
// buffer of frames the old socket never wrote is bounded by DormantBytesMax;
// a resume flushes the buffer and wakes the subscription.
func TestDormantSessionTakesNoDeliveries(t *testing.T) {
	fx := newBoundedFixture(t, 5000, func(c *session.Config) { c.DormantBytesMax = 4 * frameBytes })
	k1 := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k1)
	subscribe(t, s, k1, protocol.Subscribe{Topic: "q", Prefetch: 100})
	k1.take()
	fx.publishKiB("q", 5)
	unsent := k1.frames // queued, never written
	k1.frames = nil
	s.Detach(k1, unsent)
	fx.publishKiB("q", 45)
	if info := s.Info(); info.Pending != 5 {
		t.Fatalf("dormant session buffered %d deliveries, want the 5 unsent", info.Pending)
	}
	if ready, inflight, _, _ := fx.fake.Counts("q", ""); ready != 45 || inflight != 5 {
		t.Fatalf("ready %d inflight %d, want 45 and 5", ready, inflight)
	}
	if st := fx.reg.Stats(); st.DormantPaused != 1 {
		t.Fatalf("stats %+v: want one dormant pause (5 unsent frames pass the 4-frame bound)", st)
	}
	k2 := &sink{}
	fx.open(s.Identity(), k2)
	if got := delivers(k2.take()); len(got) != 50 {
		t.Fatalf("after resume %d deliveries, want all 50", len(got))
	}
}

// throttledSink is a sink whose fullness the test sets, as the server's
// writer's is set by its byte cap.
type throttledSink struct {
	sink
	full      atomic.Bool
	fullAfter int // frames after which Send sets full; 0 = never
	sent      int
	onDrain   func()
}

func (k *throttledSink) Send(o session.Outbound) bool {
	k.sent++
	if k.fullAfter > 0 && k.sent >= k.fullAfter {
		k.full.Store(true)
	}
	return k.sink.Send(o)
}

func (k *throttledSink) RoomBytes() int64 {
	if k.full.Load() {
		return 0
	}
	return 1 << 30
}
func (k *throttledSink) SetOnDrain(f func()) { k.onDrain = f }

// TestEarlyDeliveriesPauseAtByteBound: deliveries that arrive before the
// subscription is announced are bounded like a dormant buffer, and a full
// sink keeps the subscription paused until it drains.
func TestEarlyDeliveriesPauseAtByteBound(t *testing.T) {
	fx := newBoundedFixture(t, 0, func(c *session.Config) { c.DormantBytesMax = 3 * frameBytes })
	k := &throttledSink{}
	s, _, err := fx.reg.Open(protocol.ResumeIdentity{}, "anonymous:", k, 1, hello)
	if err != nil {
		t.Fatal(err)
	}
	k.take()
	k.fullAfter = k.sent + 4 // full once SUBSCRIBE_OK and 3 deliveries are in
	fx.publishKiB("q", 20)
	if err := s.Subscribe(k, 7, protocol.Subscribe{Topic: "q", Prefetch: 100}); err != nil {
		t.Fatal(err)
	}
	// Three were held before SUBSCRIBE_OK (the byte bound); they fill the
	// sink, so the wake after the announcement brings nothing more.
	if got := delivers(k.take()); len(got) != 3 {
		t.Fatalf("%d deliveries while paused, want 3", len(got))
	}
	if ready, _, _, _ := fx.fake.Counts("q", ""); ready != 17 {
		t.Fatalf("ready %d, want 17", ready)
	}
	k.fullAfter = 0
	k.full.Store(false)
	k.onDrain()
	if got := delivers(k.take()); len(got) != 17 {
		t.Fatalf("%d deliveries after the drain, want 17", len(got))
	}
}

// TestDormantSessionsCapped: past DormantSessionsMax a disconnect ends the
// session at once (leases back to ready), and its resume is not found.
func TestDormantSessionsCapped(t *testing.T) {
	fx := newBoundedFixture(t, 5000, func(c *session.Config) { c.DormantSessionsMax = 2 })
	var ss []*session.Session
	var ks []*sink
	for range 3 {
		k := &sink{}
		s, _ := fx.open(protocol.ResumeIdentity{}, k)
		ss, ks = append(ss, s), append(ks, k)
	}
	fx.publishKiB("q", 1)
	subscribe(t, ss[2], ks[2], protocol.Subscribe{Topic: "q", Prefetch: 1})
	for i, s := range ss {
		s.Detach(ks[i], nil)
		if got := s.Info().Closed; got != (i == 2) {
			t.Fatalf("session %d closed=%v after detach", i, got)
		}
	}
	if st := fx.reg.Stats(); st.DormantCapped != 1 || st.Dormant != 2 {
		t.Fatalf("stats %+v: want 2 dormant and 1 capped", st)
	}
	if ready, inflight, _, _ := fx.fake.Counts("q", ""); ready != 1 || inflight != 0 {
		t.Fatalf("ready %d inflight %d: the capped session's lease should be back", ready, inflight)
	}
	if _, out, err := fx.reg.Open(ss[2].Identity(), "anonymous:", &sink{}, 9, hello); err != nil || out != protocol.ResumeNotFound {
		t.Fatalf("resume of the capped session: %v %v, want resume_not_found", out, err)
	}
}

// TestResendBytesBound: only ResendBytesMax of unsettled deliveries are kept
// for re-send; settling frees room for later ones.
func TestResendBytesBound(t *testing.T) {
	fx := newBoundedFixture(t, 5000, func(c *session.Config) { c.ResendBytesMax = 3 * frameBytes })
	k1 := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k1)
	fx.publishKiB("q", 5)
	subscribe(t, s, k1, protocol.Subscribe{Topic: "q", Prefetch: 10})
	written := delivers(k1.take())
	if len(written) != 5 {
		t.Fatalf("written %d", len(written))
	}
	if st := fx.reg.Stats(); st.ResendUnkept != 2 {
		t.Fatalf("stats %+v: want 2 deliveries not kept for re-send", st)
	}
	s.Detach(k1, nil)
	k2 := &sink{}
	fx.open(s.Identity(), k2)
	s.Resend()
	re := delivers(k2.take())
	if len(re) != 3 || re[0].Tag != 1 || re[2].Tag != 3 {
		t.Fatalf("re-sent %d deliveries, want the first 3", len(re))
	}
	// Settling frees the room: the next deliveries are kept again.
	settle(t, s, protocol.OpAck, 1, 2, 3, 4, 5)
	fx.publishKiB("q", 2)
	k2.take()
	if st := fx.reg.Stats(); st.ResendUnkept != 2 {
		t.Fatalf("stats %+v: new deliveries after the settle should be kept", st)
	}
}

// TestSettleMemoryBound: the table of recent settle outcomes holds at most
// SettleMemoryMax tags, oldest dropped first; a repeat of a dropped one is no
// longer recognised and is stale, a repeat of a kept one is ok.
func TestSettleMemoryBound(t *testing.T) {
	fx := newBoundedFixture(t, 0, func(c *session.Config) { c.SettleMemoryMax = 2 })
	k := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k)
	fx.publish("q", 3)
	subscribe(t, s, k, protocol.Subscribe{Topic: "q", Prefetch: 3})
	ds := delivers(k.take())
	for _, d := range ds {
		if c := settle(t, s, protocol.OpAck, d.Tag); c[0] != protocol.CodeOK {
			t.Fatalf("ack %d: %v", d.Tag, c)
		}
	}
	if c := settle(t, s, protocol.OpAck, ds[0].Tag, ds[1].Tag, ds[2].Tag); c[0] != protocol.CodeStaleLease || c[1] != protocol.CodeOK || c[2] != protocol.CodeOK {
		t.Fatalf("repeats %v, want [stale_lease ok ok]: the oldest outcome was dropped", c)
	}
}
