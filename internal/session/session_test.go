package session_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/session"
	"github.com/sinewmq/sinew/internal/session/sessiontest"
	"github.com/sinewmq/sinew/protocol"
)

// sink records what a session sends.
type sink struct {
	mu     sync.Mutex
	frames []session.Outbound
	closed bool
	kicked int
}

func (k *sink) Send(o session.Outbound) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return false
	}
	k.frames = append(k.frames, o)
	return true
}

func (k *sink) Kick() {
	k.mu.Lock()
	k.kicked++
	k.closed = true
	k.mu.Unlock()
}

// take returns and forgets the recorded frames, running after-write hooks as a
// real writer would.
func (k *sink) take() []session.Outbound {
	k.mu.Lock()
	f := k.frames
	k.frames = nil
	k.mu.Unlock()
	for _, o := range f {
		if o.AfterWrite != nil {
			o.AfterWrite()
		}
	}
	return f
}

func ops(fs []session.Outbound) []protocol.Op {
	out := make([]protocol.Op, len(fs))
	for i, f := range fs {
		out[i] = f.Body.Op()
	}
	return out
}

// timers is a fake AfterFunc that fires on demand.
type timers struct {
	mu  sync.Mutex
	fns []*timer
}

type timer struct {
	d       time.Duration
	f       func()
	stopped bool
}

func (t *timers) after(d time.Duration, f func()) func() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	tm := &timer{d: d, f: f}
	t.fns = append(t.fns, tm)
	return func() bool {
		t.mu.Lock()
		defer t.mu.Unlock()
		was := !tm.stopped
		tm.stopped = true
		return was
	}
}

// fireAll runs every timer not stopped and reports how many ran.
func (t *timers) fireAll() int {
	t.mu.Lock()
	fns := t.fns
	t.fns = nil
	t.mu.Unlock()
	n := 0
	for _, tm := range fns {
		if !tm.stopped {
			tm.stopped = true
			tm.f()
			n++
		}
	}
	return n
}

// counter is a deterministic Rand: an endless run of increasing bytes.
type counter struct{ n byte }

func (c *counter) Read(p []byte) (int, error) {
	for i := range p {
		c.n++
		p[i] = c.n
	}
	return len(p), nil
}

type fixture struct {
	t      *testing.T
	fake   *sessiontest.Fake
	reg    *session.Registry
	timers *timers
}

func newFixture(t *testing.T, graceMs int64) *fixture {
	fx := &fixture{t: t, fake: sessiontest.New(), timers: &timers{}}
	reg, err := session.NewRegistry(session.Config{
		Backend: fx.fake, OwnerID: "owner-a", Rand: &counter{}, ReconnectGraceMs: graceMs,
		AfterFunc: fx.timers.after, SubscriptionsMax: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	fx.reg = reg
	return fx
}

func hello(id protocol.ResumeIdentity, outcome protocol.ResumeOutcome) session.Outbound {
	return session.Outbound{Body: &protocol.HelloOK{Resume: id, Outcome: outcome}}
}

func (fx *fixture) open(offer protocol.ResumeIdentity, k *sink) (*session.Session, protocol.ResumeOutcome) {
	fx.t.Helper()
	s, out, err := fx.reg.Open(offer, "anonymous:", k, 1, hello)
	if err != nil {
		fx.t.Fatal(err)
	}
	got := k.take()
	if len(got) == 0 || got[0].Body.Op() != protocol.OpHelloOK {
		fx.t.Fatalf("first frame %v, want HELLO_OK first", ops(got))
	}
	if h := got[0].Body.(*protocol.HelloOK); h.Outcome != out || h.Resume.ClientID != s.ClientID() {
		fx.t.Fatalf("HELLO_OK %+v does not match outcome %v / client %s", h, out, s.ClientID())
	}
	k.frames = append(got[1:], k.frames...) // keep what followed HELLO_OK
	return s, out
}

func (fx *fixture) publish(topic string, n int) {
	for range n {
		fx.fake.Publish(&protocol.Publish{Topic: topic, Body: []byte("x")}, func(protocol.PublishOK, error) {})
	}
}

func TestResumeOutcomes(t *testing.T) {
	fx := newFixture(t, 1000)
	k1 := &sink{}
	s, out := fx.open(protocol.ResumeIdentity{}, k1)
	if out != protocol.ResumeNew {
		t.Fatalf("outcome %v, want new", out)
	}
	id := s.Identity()
	if id.OwnerID != "owner-a" || len(id.Token) != 32 || id.ClientID == "" {
		t.Fatalf("identity %+v", id)
	}
	s.Detach(k1, nil)

	cases := []struct {
		name  string
		offer protocol.ResumeIdentity
		want  protocol.ResumeOutcome
	}{
		{"wrong token", protocol.ResumeIdentity{ClientID: id.ClientID, OwnerID: id.OwnerID, Token: bytes.Repeat([]byte{9}, 32)}, protocol.ResumeRejected},
		{"short token", protocol.ResumeIdentity{ClientID: id.ClientID, OwnerID: id.OwnerID, Token: id.Token[:5]}, protocol.ResumeRejected},
		{"other owner", protocol.ResumeIdentity{ClientID: id.ClientID, OwnerID: "owner-b", Token: id.Token}, protocol.ResumeRejected},
		{"unknown", protocol.ResumeIdentity{ClientID: "c-nope", OwnerID: id.OwnerID, Token: id.Token}, protocol.ResumeNotFound},
		{"right", id, protocol.ResumeResumed},
	}
	for _, tc := range cases {
		k := &sink{}
		got, out := fx.open(tc.offer, k)
		if out != tc.want {
			t.Fatalf("%s: outcome %v, want %v", tc.name, out, tc.want)
		}
		if (got == s) != (tc.want == protocol.ResumeResumed) {
			t.Fatalf("%s: got session %v, original %v", tc.name, got, s)
		}
		if tc.want != protocol.ResumeResumed && got.ClientID() == id.ClientID {
			t.Fatalf("%s: a refused resume must issue a fresh client id", tc.name)
		}
	}
	st := fx.reg.Stats()
	if st.Resumed != 1 || st.ResumeRejected != 3 || st.ResumeNotFound != 1 || st.Issued != 5 {
		t.Fatalf("stats %+v", st)
	}
}

func subscribe(t *testing.T, s *session.Session, k *sink, req protocol.Subscribe) uint64 {
	t.Helper()
	if err := s.Subscribe(k, 7, req); err != nil {
		t.Fatal(err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.frames) == 0 || k.frames[0].Body.Op() != protocol.OpSubscribeOK || k.frames[0].RequestID != 7 {
		t.Fatalf("frames after SUBSCRIBE: %v, want SUBSCRIBE_OK first", ops(k.frames))
	}
	return k.frames[0].Body.(*protocol.SubscribeOK).SubID
}

func delivers(fs []session.Outbound) []*protocol.Deliver {
	var out []*protocol.Deliver
	for _, f := range fs {
		if d, ok := f.Body.(*protocol.Deliver); ok {
			out = append(out, d)
		}
	}
	return out
}

func settle(t *testing.T, s *session.Session, kind protocol.Op, tags ...uint64) []protocol.Code {
	t.Helper()
	var got []protocol.Code
	s.Settle(kind, tags, nil, 0, func(c []protocol.Code) { got = c })
	if got == nil {
		t.Fatal("settle did not complete")
	}
	return got
}

func TestTagsAndSettle(t *testing.T) {
	fx := newFixture(t, 0)
	k := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k)
	fx.publish("q", 3)
	subscribe(t, s, k, protocol.Subscribe{Topic: "q", Prefetch: 2})
	ds := delivers(k.take())
	if len(ds) != 2 || ds[0].Tag != 1 || ds[1].Tag != 2 {
		t.Fatalf("deliveries %+v, want tags 1 and 2 (prefetch 2)", ds)
	}
	codes := settle(t, s, protocol.OpAck, ds[0].Tag, 99, 0)
	if codes[0] != protocol.CodeOK || codes[1] != protocol.CodeUnknownTag || codes[2] != protocol.CodeUnknownTag {
		t.Fatalf("codes %v", codes)
	}
	// Ack freed credit: the third message arrives with a new, higher tag.
	ds2 := delivers(k.take())
	if len(ds2) != 1 || ds2[0].Tag != 3 {
		t.Fatalf("after ack: %+v", ds2)
	}
	// The same settle again gets its original outcome; another settle of the
	// same lease is stale. Neither reaches the queue.
	if c := settle(t, s, protocol.OpAck, ds[0].Tag); c[0] != protocol.CodeOK {
		t.Fatalf("second ack: %v", c)
	}
	if c := settle(t, s, protocol.OpNack, ds[0].Tag); c[0] != protocol.CodeStaleLease {
		t.Fatalf("nack after ack: %v", c)
	}
	if st := fx.reg.Stats(); st.SettleRepeated != 1 || st.LateSettleStale != 1 {
		t.Fatalf("stats %+v", st)
	}
	// Nack requeues: the message comes back under a new tag, never a reused one.
	if c := settle(t, s, protocol.OpNack, ds[1].Tag); c[0] != protocol.CodeOK {
		t.Fatalf("nack: %v", c)
	}
	ds3 := delivers(k.take())
	if len(ds3) != 1 || ds3[0].Tag != 4 || ds3[0].Offset != ds[1].Offset || ds3[0].Attempt != 2 {
		t.Fatalf("redelivery %+v", ds3)
	}
	if c := settle(t, s, protocol.OpFail, ds3[0].Tag, ds2[0].Tag); c[0] != protocol.CodeOK || c[1] != protocol.CodeOK {
		t.Fatalf("fail: %v", c)
	}
	if r, in, acked, failed := fx.fake.Counts("q", ""); r != 0 || in != 0 || acked != 1 || failed != 2 {
		t.Fatalf("queue ready=%d inflight=%d acked=%d failed=%d", r, in, acked, failed)
	}
}

func TestAutoAckAfterWrite(t *testing.T) {
	fx := newFixture(t, 0)
	k := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k)
	fx.publish("q", 3)
	subscribe(t, s, k, protocol.Subscribe{Topic: "q", AckMode: protocol.AckAuto, Prefetch: 1})
	// Nothing is acked until the writer reports the DELIVER written.
	if _, in, acked, _ := fx.fake.Counts("q", ""); in != 1 || acked != 0 {
		t.Fatalf("before write: inflight=%d acked=%d", in, acked)
	}
	for range 3 {
		k.take() // "writes" the frames, which acks and lets the next one in
	}
	if r, in, acked, _ := fx.fake.Counts("q", ""); r != 0 || in != 0 || acked != 3 {
		t.Fatalf("after writes: ready=%d inflight=%d acked=%d", r, in, acked)
	}
}

func TestImmediateCleanupRequeues(t *testing.T) {
	fx := newFixture(t, 0)
	k := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k)
	fx.publish("q", 5)
	subscribe(t, s, k, protocol.Subscribe{Topic: "q", Prefetch: 3})
	k.take()
	s.Detach(k, nil)
	if r, in, _, _ := fx.fake.Counts("q", ""); r != 5 || in != 0 {
		t.Fatalf("after disconnect ready=%d inflight=%d, want all 5 ready", r, in)
	}
	if !s.Info().Closed || fx.reg.Stats().Sessions != 0 || fx.reg.Stats().Requeued != 3 {
		t.Fatalf("session %+v registry %+v", s.Info(), fx.reg.Stats())
	}
	// The identity is gone.
	if _, out := fx.open(s.Identity(), &sink{}); out != protocol.ResumeNotFound {
		t.Fatalf("resume after cleanup: %v", out)
	}
}

func TestGraceResumeKeepsDeliveriesAndTags(t *testing.T) {
	fx := newFixture(t, 5000)
	k1 := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k1)
	fx.publish("q", 2)
	subscribe(t, s, k1, protocol.Subscribe{Topic: "q", Prefetch: 4})
	first := delivers(k1.take())
	if len(first) != 2 {
		t.Fatalf("deliveries %d", len(first))
	}
	// The DELIVER of a third message was queued but never written when the socket died.
	fx.publish("q", 1)
	unsent := k1.frames
	k1.frames = nil
	s.Detach(k1, unsent)
	if info := s.Info(); info.Attached || info.Closed || info.Pending != 1 {
		t.Fatalf("dormant session %+v", info)
	}
	fx.publish("q", 1) // a dormant session takes no new deliveries
	if info := s.Info(); info.Pending != 1 {
		t.Fatalf("pending %d, want 1", info.Pending)
	}
	if r, _, _, _ := fx.fake.Counts("q", ""); r != 1 {
		t.Fatalf("ready %d, want the new message left in the queue", r)
	}
	k2 := &sink{}
	got, out := fx.open(s.Identity(), k2)
	if out != protocol.ResumeResumed || got != s {
		t.Fatalf("resume: %v", out)
	}
	flushed := delivers(k2.take())
	if len(flushed) != 2 || flushed[0].Tag != 3 || flushed[1].Tag != 4 {
		t.Fatalf("flushed after resume: %+v", flushed)
	}
	// A settle for a tag issued on the old socket still counts.
	if c := settle(t, s, protocol.OpAck, first[0].Tag, flushed[1].Tag); c[0] != protocol.CodeOK || c[1] != protocol.CodeOK {
		t.Fatalf("late settle codes %v", c)
	}
	if fx.timers.fireAll() != 0 {
		t.Fatal("the grace timer should have been stopped by the resume")
	}
	if s.Info().Closed {
		t.Fatal("resumed session closed by a stale timer")
	}
}

func TestGraceExpiryRunsCleanup(t *testing.T) {
	fx := newFixture(t, 5000)
	k := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k)
	fx.publish("q", 3)
	subscribe(t, s, k, protocol.Subscribe{Topic: "q", Prefetch: 2})
	k.take()
	s.Detach(k, nil)
	if _, in, _, _ := fx.fake.Counts("q", ""); in != 2 {
		t.Fatalf("inflight during grace %d, want leases kept", in)
	}
	if fx.reg.Stats().Dormant != 1 {
		t.Fatalf("stats %+v", fx.reg.Stats())
	}
	if n := fx.timers.fireAll(); n != 1 {
		t.Fatalf("%d timers fired", n)
	}
	if r, in, _, _ := fx.fake.Counts("q", ""); r != 3 || in != 0 {
		t.Fatalf("after grace ready=%d inflight=%d", r, in)
	}
	st := fx.reg.Stats()
	if st.GraceExpired != 1 || st.Dormant != 0 || st.Sessions != 0 || st.Requeued != 2 || st.GraceEntered != 1 || st.GraceRequeued != 2 {
		t.Fatalf("stats %+v", st)
	}
	if _, out := fx.open(s.Identity(), &sink{}); out != protocol.ResumeNotFound {
		t.Fatalf("resume after grace: %v", out)
	}
}

func TestTakeoverKicksOldSink(t *testing.T) {
	fx := newFixture(t, 5000)
	k1 := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k1)
	k2 := &sink{}
	if _, out := fx.open(s.Identity(), k2); out != protocol.ResumeResumed {
		t.Fatalf("takeover outcome %v", out)
	}
	if k1.kicked != 1 {
		t.Fatal("old sink not kicked")
	}
	// The old connection's late detach must not disturb the new one.
	s.Detach(k1, nil)
	if !s.Info().Attached {
		t.Fatal("stale detach detached the new sink")
	}
}

func TestBrokerClosedAndUnsubscribe(t *testing.T) {
	fx := newFixture(t, 0)
	k := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k)
	fx.publish("q", 1)
	id := subscribe(t, s, k, protocol.Subscribe{Topic: "q", Prefetch: 1})
	ds := delivers(k.take())
	fx.fake.CloseFromBroker("q", "", protocol.SubClosedQueueDeleted, protocol.Errorf(protocol.CodeUnavailable, "gone"))
	got := k.take()
	if len(got) != 1 {
		t.Fatalf("frames %v", ops(got))
	}
	sc := got[0].Body.(*protocol.SubClosed)
	if sc.SubID != id || sc.Reason != protocol.SubClosedQueueDeleted || sc.Code != protocol.CodeUnavailable {
		t.Fatalf("SUB_CLOSED %+v", sc)
	}
	if c := settle(t, s, protocol.OpAck, ds[0].Tag); c[0] != protocol.CodeStaleLease {
		t.Fatalf("settle after close: %v", c)
	}
	if err := s.Unsubscribe(id); !errors.Is(err, &protocol.Error{Code: protocol.CodeNotFound}) {
		t.Fatalf("unsubscribe closed sub: %v", err)
	}
	id2 := subscribe(t, s, k, protocol.Subscribe{Topic: "q", Prefetch: 1})
	k.take()
	if err := s.Unsubscribe(id2); err != nil {
		t.Fatal(err)
	}
	if r, in, _, _ := fx.fake.Counts("q", ""); r != 1 || in != 0 {
		t.Fatalf("after unsubscribe ready=%d inflight=%d", r, in)
	}
}

// TestBrokerCloseLostWithTheSocket: the queue is deleted while the client's
// socket is dead but not yet detected, so its SUB_CLOSED is written to nothing.
// On resume the client still lists the subscription; under the restore policy
// the session tells it again that the queue went away instead of recreating
// the subscription (and with it the queue).
func TestBrokerCloseLostWithTheSocket(t *testing.T) {
	fx := newFixture(t, 5000)
	k1 := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k1)
	id := subscribe(t, s, k1, protocol.Subscribe{Topic: "gone", Prefetch: 1})
	k1.take()
	fx.fake.CloseFromBroker("gone", "", protocol.SubClosedQueueDeleted, protocol.Errorf(protocol.CodeNotFound, "deleted"))
	k1.take() // written to a socket that was already cut
	s.Detach(k1, nil)

	k2 := &sink{}
	fx.open(s.Identity(), k2)
	k2.take()
	if err := s.Reconcile(k2, 9, &protocol.Reconcile{Policy: protocol.ReconcileRestore, Subs: []protocol.SubView{
		{SubID: id, Topic: "gone", Partition: -1, Prefetch: 1},
	}}); err != nil {
		t.Fatal(err)
	}
	got := k2.take()
	if len(got) != 2 || got[0].Body.Op() != protocol.OpSubClosed || got[1].Body.Op() != protocol.OpReconcileResult {
		t.Fatalf("frames %v, want SUB_CLOSED then RECONCILE_RESULT", ops(got))
	}
	if sc := got[0].Body.(*protocol.SubClosed); sc.SubID != id || sc.Reason != protocol.SubClosedQueueDeleted || sc.Code != protocol.CodeNotFound {
		t.Fatalf("SUB_CLOSED %+v", sc)
	}
	entries := got[1].Body.(*protocol.ReconcileResult).Entries
	if len(entries) != 1 || entries[0].Action != protocol.ActionCloseClientSide || entries[0].ServerSubID != 0 {
		t.Fatalf("entries %+v, want close_client_side without a new subscription", entries)
	}
	if n := s.Info().Subscriptions; n != 0 {
		t.Fatalf("session holds %d subscriptions after reconcile, want 0", n)
	}
	// Told once: a later reconcile treats the id as any unknown one.
	if err := s.Reconcile(k2, 10, &protocol.Reconcile{Policy: protocol.ReconcileConservative, Subs: []protocol.SubView{
		{SubID: id, Topic: "gone", Partition: -1, Prefetch: 1},
	}}); err != nil {
		t.Fatal(err)
	}
	if got := k2.take(); len(got) != 1 || got[0].Body.Op() != protocol.OpReconcileResult {
		t.Fatalf("second reconcile frames %v", ops(got))
	}
}

func TestSubscriptionLimitAndPrefetchClamp(t *testing.T) {
	fx := newFixture(t, 0)
	k := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k)
	if err := s.Subscribe(k, 1, protocol.Subscribe{Topic: "q", Prefetch: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	if ok := k.take()[0].Body.(*protocol.SubscribeOK); ok.Prefetch != session.PrefetchMaxDefault {
		t.Fatalf("prefetch %d, want clamped to %d", ok.Prefetch, session.PrefetchMaxDefault)
	}
	if err := s.Subscribe(k, 1, protocol.Subscribe{Topic: "q"}); err != nil {
		t.Fatal(err)
	}
	if ok := k.take()[0].Body.(*protocol.SubscribeOK); ok.Prefetch != session.PrefetchDefaultDefault {
		t.Fatalf("prefetch %d, want default", ok.Prefetch)
	}
	for range 2 {
		if err := s.Subscribe(k, 1, protocol.Subscribe{Topic: "q"}); err != nil {
			t.Fatal(err)
		}
	}
	err := s.Subscribe(k, 1, protocol.Subscribe{Topic: "q"})
	if !errors.Is(err, &protocol.Error{Code: protocol.CodeLimitExceeded}) {
		t.Fatalf("fifth subscription: %v", err)
	}
	if err := s.Subscribe(k, 1, protocol.Subscribe{Topic: "q", AckMode: 9}); !errors.Is(err, &protocol.Error{Code: protocol.CodeBadRequest}) {
		t.Fatalf("bad ack mode: %v", err)
	}
}

func TestReconcile(t *testing.T) {
	for _, policy := range []uint8{protocol.ReconcileConservative, protocol.ReconcileRestore} {
		fx := newFixture(t, 0)
		k := &sink{}
		s, _ := fx.open(protocol.ResumeIdentity{}, k)
		keep := subscribe(t, s, k, protocol.Subscribe{Topic: "a", Prefetch: 5})
		k.take()
		serverOnly := subscribe(t, s, k, protocol.Subscribe{Topic: "b", Prefetch: 5})
		k.take()
		differs := subscribe(t, s, k, protocol.Subscribe{Topic: "c", Prefetch: 5})
		k.take()
		fx.publish("d", 1)
		req := &protocol.Reconcile{Policy: policy, Subs: []protocol.SubView{
			{SubID: keep, Topic: "a", Partition: 0, Prefetch: 5},
			{SubID: differs, Topic: "c", Partition: 0, AckMode: protocol.AckAuto, Prefetch: 5},
			{SubID: 77, Topic: "d", Partition: 0, Prefetch: 5},
		}}
		if err := s.Reconcile(k, 9, req); err != nil {
			t.Fatal(err)
		}
		got := k.take()
		if got[0].Body.Op() != protocol.OpReconcileResult || got[0].RequestID != 9 {
			t.Fatalf("frames %v", ops(got))
		}
		actions := map[uint64]uint8{}
		var recreated uint64
		for _, e := range got[0].Body.(*protocol.ReconcileResult).Entries {
			key := e.ClientSubID
			if key == 0 {
				key = e.ServerSubID
			}
			actions[key] = e.Action
			if e.ClientSubID == 77 {
				recreated = e.ServerSubID
			}
		}
		want := map[uint64]uint8{keep: protocol.ActionKeep, serverOnly: protocol.ActionCloseServerSide}
		if policy == protocol.ReconcileConservative {
			want[differs], want[77] = protocol.ActionCloseClientSide, protocol.ActionCloseClientSide
		} else {
			want[differs], want[77] = protocol.ActionRecreateClient, protocol.ActionRecreateClient
		}
		for id, a := range want {
			if actions[id] != a {
				t.Fatalf("policy %d sub %d: action %d, want %d (all %v)", policy, id, actions[id], a, actions)
			}
		}
		if policy == protocol.ReconcileRestore {
			// The recreated subscription's delivery comes after the result.
			ds := delivers(got[1:])
			if len(ds) != 1 || ds[0].SubID != recreated || recreated == 0 {
				t.Fatalf("recreated sub %d deliveries %+v", recreated, ds)
			}
			if s.Info().Subscriptions != 3 {
				t.Fatalf("subscriptions %d, want keep + 2 recreated", s.Info().Subscriptions)
			}
		} else if s.Info().Subscriptions != 1 {
			t.Fatalf("subscriptions %d, want only the kept one", s.Info().Subscriptions)
		}
		st := fx.reg.Stats()
		wantNew, wantClient := uint64(0), uint64(2)
		if policy == protocol.ReconcileRestore {
			wantNew, wantClient = 2, 0
		}
		if st.ReconcileKeep != 1 || st.ReconcileCloseServer != 1 || st.ReconcileCloseClient != wantClient || st.ReconcileRecreate != wantNew {
			t.Fatalf("policy %d: reconcile counters %+v", policy, st)
		}
	}
}

func TestDrainCleansDormantAndRefusesOpen(t *testing.T) {
	fx := newFixture(t, 5000)
	k := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k)
	s.Detach(k, nil)
	fx.reg.Drain()
	if !s.Info().Closed {
		t.Fatal("dormant session survived drain")
	}
	if _, _, err := fx.reg.Open(protocol.ResumeIdentity{}, "anonymous:", &sink{}, 2, hello); !errors.Is(err, session.ErrDraining) {
		t.Fatalf("open while draining: %v", err)
	}
}

// TestResumeResendsWrittenDeliveries: deliveries written to a socket that then
// died are sent again after a resume, with the same tag and attempt, after the
// RECONCILE_RESULT and only for subscriptions the reconciliation kept.
func TestResumeResendsWrittenDeliveries(t *testing.T) {
	fx := newFixture(t, 5000)
	k1 := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k1)
	fx.publish("a", 2)
	keep := subscribe(t, s, k1, protocol.Subscribe{Topic: "a", Prefetch: 4})
	fx.publish("b", 1)
	subscribe(t, s, k1, protocol.Subscribe{Topic: "b", Prefetch: 4})
	written := delivers(k1.take()) // tags 1, 2 (a) and 3 (b) reached the socket
	if len(written) != 3 {
		t.Fatalf("written %+v", written)
	}
	fx.publish("a", 1) // tag 4 is queued but never written
	unsent := k1.frames
	k1.frames = nil
	s.Detach(k1, unsent)

	k2 := &sink{}
	fx.open(s.Identity(), k2)
	if ds := delivers(k2.take()); len(ds) != 1 || ds[0].Tag != 4 {
		t.Fatalf("after HELLO_OK, want only the unwritten tag 4 flushed, got %+v", ds)
	}
	err := s.Reconcile(k2, 9, &protocol.Reconcile{Policy: protocol.ReconcileConservative, Subs: []protocol.SubView{
		{SubID: keep, Topic: "a", Partition: 0, Prefetch: 4},
	}})
	if err != nil {
		t.Fatal(err)
	}
	got := k2.take()
	if len(got) == 0 || got[0].Body.Op() != protocol.OpReconcileResult {
		t.Fatalf("frames %v, want RECONCILE_RESULT first", ops(got))
	}
	re := delivers(got[1:])
	if len(re) != 2 {
		t.Fatalf("re-sent %+v, want tags 1 and 2 of the kept subscription", re)
	}
	for i, d := range re {
		w := written[i]
		if d.Tag != w.Tag || d.SubID != keep || d.Attempt != w.Attempt || d.Offset != w.Offset || !bytes.Equal(d.Body, w.Body) {
			t.Fatalf("re-sent %+v, first sent %+v", d, w)
		}
	}
	if c := settle(t, s, protocol.OpAck, re[0].Tag, re[1].Tag, 4); c[0] != protocol.CodeOK || c[1] != protocol.CodeOK || c[2] != protocol.CodeOK {
		t.Fatalf("settle codes %v", c)
	}
	s.Resend() // once per resume
	if ds := delivers(k2.take()); len(ds) != 0 {
		t.Fatalf("second Resend sent %+v", ds)
	}
	if st := fx.reg.Stats(); st.Resent != 2 {
		t.Fatalf("stats %+v", st)
	}
}

// TestResumeResendWithoutReconcile: a client that does not reconcile gets the
// re-sent deliveries when the server calls Resend; one settled in between is
// skipped.
func TestResumeResendWithoutReconcile(t *testing.T) {
	fx := newFixture(t, 5000)
	k1 := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k1)
	fx.publish("a", 2)
	subscribe(t, s, k1, protocol.Subscribe{Topic: "a", Prefetch: 4})
	written := delivers(k1.take())
	s.Detach(k1, nil)
	k2 := &sink{}
	fx.open(s.Identity(), k2)
	if c := settle(t, s, protocol.OpAck, written[0].Tag); c[0] != protocol.CodeOK {
		t.Fatalf("settle %v", c)
	}
	k2.take()
	s.Resend()
	if ds := delivers(k2.take()); len(ds) != 1 || ds[0].Tag != written[1].Tag {
		t.Fatalf("re-sent %+v, want only tag %d", ds, written[1].Tag)
	}
	// A fresh session re-sends nothing.
	k3 := &sink{}
	s3, _ := fx.open(protocol.ResumeIdentity{}, k3)
	s3.Resend()
	if ds := delivers(k3.take()); len(ds) != 0 {
		t.Fatalf("fresh session re-sent %+v", ds)
	}
}

// TestResumeResendsNothingOfAPartitionServedElsewhere: in a cluster, a
// session on a node that lost a partition to another owner while its
// client was away sends none of that partition's deliveries again when the
// client resumes, neither written ones nor ones never written, by Resend
// or INFLIGHT: the new owner judges their leases (the client may have
// settled them there), and a copy from here would hand a settled message to
// the application again.
func TestResumeResendsNothingOfAPartitionServedElsewhere(t *testing.T) {
	fx := newFixture(t, 5000)
	k1 := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k1)
	fx.publish("a", 2)
	subscribe(t, s, k1, protocol.Subscribe{Topic: "a", Prefetch: 4})
	if written := delivers(k1.take()); len(written) != 2 {
		t.Fatalf("written %+v", written)
	}
	fx.publish("a", 1) // queued, never written
	unsent := k1.frames
	k1.frames = nil
	s.Detach(k1, unsent)
	fx.fake.ServeElsewhere("a", "")

	k2 := &sink{}
	fx.open(s.Identity(), k2)
	if ds := delivers(k2.take()); len(ds) != 0 {
		t.Fatalf("after HELLO_OK: flushed %+v, want nothing of a partition served elsewhere", ds)
	}
	s.Resend()
	if ds := delivers(k2.take()); len(ds) != 0 {
		t.Fatalf("Resend sent %+v", ds)
	}
	if err := s.Inflight(k2, 3, &protocol.Inflight{}); err != nil {
		t.Fatal(err)
	}
	if ds := delivers(k2.take()); len(ds) != 0 {
		t.Fatalf("INFLIGHT re-sent %+v", ds)
	}
}

// TestExpiredLeaseForgetsTag: a lease that expires while the session holds its
// delivery (here: dormant) drops the tag, so a resume re-sends only the
// redelivery, never the stale DELIVER, and the old tag settles as stale.
func TestExpiredLeaseForgetsTag(t *testing.T) {
	fx := newFixture(t, 5000)
	k1 := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k1)
	fx.publish("a", 1)
	subscribe(t, s, k1, protocol.Subscribe{Topic: "a", Prefetch: 1})
	first := delivers(k1.take())
	if len(first) != 1 {
		t.Fatalf("delivered %+v", first)
	}
	s.Detach(k1, nil) // the DELIVER was written, then the socket died
	if !fx.fake.ExpireLease("a", "", first[0].Offset) {
		t.Fatal("offset not inflight")
	}
	k2 := &sink{}
	fx.open(s.Identity(), k2)
	s.Resend()
	got := delivers(k2.take())
	if len(got) != 1 || got[0].Tag == first[0].Tag || got[0].Attempt != 2 {
		t.Fatalf("after resume got %+v, want only the redelivery (attempt 2, new tag)", got)
	}
	if c := settle(t, s, protocol.OpAck, first[0].Tag, got[0].Tag); c[0] != protocol.CodeStaleLease || c[1] != protocol.CodeOK {
		t.Fatalf("settle codes %v, want [stale_lease ok]", c)
	}
}

// TestLifecycleLogs: every event of the session lifecycle is logged with the
// client id, and no record carries the resume token.
func TestLifecycleLogs(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	fx := &fixture{t: t, fake: sessiontest.New(), timers: &timers{}}
	reg, err := session.NewRegistry(session.Config{
		Backend: fx.fake, OwnerID: "owner-a", Rand: &counter{}, ReconnectGraceMs: 5000, AfterFunc: fx.timers.after,
		Logger: slog.New(slog.NewJSONHandler(lockedWriter{&mu, &buf}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	fx.reg = reg
	k1 := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k1)
	fx.publish("q", 2)
	sub := subscribe(t, s, k1, protocol.Subscribe{Topic: "q", Prefetch: 2})
	ds := delivers(k1.take())
	s.Detach(k1, nil)
	bad := s.Identity()
	bad.Token = []byte("wrong")
	fx.open(bad, &sink{})
	k2 := &sink{}
	fx.open(s.Identity(), k2)
	if err := s.Reconcile(k2, 3, &protocol.Reconcile{Subs: []protocol.SubView{{SubID: sub, Topic: "q", Prefetch: 2}}}); err != nil {
		t.Fatal(err)
	}
	settle(t, s, protocol.OpAck, ds[0].Tag)
	settle(t, s, protocol.OpAck, 999)
	s.Detach(k2, nil)
	fx.timers.fireAll()

	mu.Lock()
	out := buf.String()
	mu.Unlock()
	for _, msg := range []string{"session identity issued", "session entered grace", "resume rejected", "resume accepted",
		"reconciled", "late settle accepted", "late settle rejected", "grace expired; unsettled deliveries requeued"} {
		if !strings.Contains(out, `"msg":"`+msg+`"`) {
			t.Errorf("no %q record in:\n%s", msg, out)
		}
	}
	if !strings.Contains(out, `"client_id":"`+s.ClientID()+`"`) || !strings.Contains(out, `"requeued":1`) {
		t.Errorf("records lack the client id or the requeue count:\n%s", out)
	}
	if strings.Contains(strings.ToLower(out), "token\":") {
		t.Errorf("a record carries a token:\n%s", out)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestReconcileWithRefusesRecreate: the restore policy recreates only the
// subscriptions allow accepts; a refused one is left closed with the error
// as its reason, and the others are recreated as usual.
func TestReconcileWithRefusesRecreate(t *testing.T) {
	fx := newFixture(t, 5000)
	k := &sink{}
	s, _ := fx.open(protocol.ResumeIdentity{}, k)
	denied := protocol.Errorf(protocol.CodePermissionDenied, "may not consume topic %q", "secret")
	allow := func(topic string) error {
		if topic == "secret" {
			return denied
		}
		return nil
	}
	err := s.ReconcileWith(k, 9, &protocol.Reconcile{Policy: protocol.ReconcileRestore, Subs: []protocol.SubView{
		{SubID: 1, Topic: "a", Prefetch: 4},
		{SubID: 2, Topic: "secret", Prefetch: 4},
	}}, allow, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := k.take()
	if len(got) == 0 || got[0].Body.Op() != protocol.OpReconcileResult {
		t.Fatalf("frames %v, want RECONCILE_RESULT", ops(got))
	}
	entries := got[0].Body.(*protocol.ReconcileResult).Entries
	if len(entries) != 2 {
		t.Fatalf("entries %+v", entries)
	}
	if e := entries[0]; e.Action != protocol.ActionRecreateClient || e.Client.Topic != "a" {
		t.Fatalf("allowed entry %+v, want recreated", e)
	}
	if e := entries[1]; e.Action != protocol.ActionCloseClientSide || !strings.Contains(e.Reason, "permission_denied") {
		t.Fatalf("refused entry %+v, want close_client_side with the denial as reason", e)
	}
	if n := s.Info().Subscriptions; n != 1 {
		t.Fatalf("%d subscriptions after reconcile, want 1", n)
	}
}
