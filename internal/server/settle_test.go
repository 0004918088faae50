package server

import (
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// These tests run the server on the real broker (startReal): the settle
// semantics, END_SESSION, INFLIGHT and the resume lifecycle over TCP.

// graceTimers is a fake session.AfterFunc: grace timers fire when the test
// says so.
type graceTimers struct {
	mu    sync.Mutex
	fns   []*graceTimer
	armed chan struct{} // one value per timer started
}

type graceTimer struct {
	f       func()
	stopped bool
}

func (g *graceTimers) after(_ time.Duration, f func()) func() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	t := &graceTimer{f: f}
	g.fns = append(g.fns, t)
	g.armed <- struct{}{}
	return func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		was := !t.stopped
		t.stopped = true
		return was
	}
}

// waitArmed waits until a session entered its grace (started a timer): the
// server notices a closed socket on its own goroutine.
func (g *graceTimers) waitArmed(t *testing.T) {
	t.Helper()
	select {
	case <-g.armed:
	case <-time.After(safetyTimeout):
		t.Fatal("no session entered its grace")
	}
}

// fire runs every pending timer and reports how many ran.
func (g *graceTimers) fire() int {
	g.mu.Lock()
	fns := g.fns
	g.fns = nil
	g.mu.Unlock()
	n := 0
	for _, t := range fns {
		g.mu.Lock()
		run := !t.stopped
		t.stopped = true
		g.mu.Unlock()
		if run {
			t.f()
			n++
		}
	}
	return n
}

// startGrace serves the real broker with a reconnect grace whose timers fire
// on demand.
func startGrace(t *testing.T, graceMs int64) (*fixture, *graceTimers) {
	timers := &graceTimers{armed: make(chan struct{}, 64)}
	fx := startReal(t, broker.Config{}, func(c *Config) {
		c.ReconnectGraceMs = graceMs
		c.AfterFunc = timers.after
	})
	return fx, timers
}

func ref(d *protocol.Deliver) protocol.LeaseRef {
	return protocol.LeaseRef{SubID: d.SubID, Partition: d.Partition, Offset: d.Offset, LeaseID: d.LeaseID, Epoch: d.Epoch}
}

// settleRefs sends one settle with lease references and returns its codes.
func (c *client) settleRefs(kind protocol.Op, tags []uint64, leases []protocol.LeaseRef) []protocol.Code {
	c.t.Helper()
	id := c.send(0, &protocol.Settle{Kind: kind, Tags: tags, Leases: leases})
	h, r := expect[*protocol.SettleResult](c)
	if h.RequestID != id {
		c.t.Fatalf("SETTLE_RESULT for %d, want %d", h.RequestID, id)
	}
	return r.Codes
}

func wantCodes(t *testing.T, what string, got []protocol.Code, want ...protocol.Code) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: codes %v, want %v", what, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: codes %v, want %v", what, got, want)
		}
	}
}

// TestSettleSemantics walks the rows of the settle table that one session
// can reach by itself.
func TestSettleSemantics(t *testing.T) {
	fx := startReal(t, broker.Config{NackDelayMsMax: 1000}, nil)
	c := fx.dial()
	c.hello(protocol.Hello{})
	for _, b := range []string{"m1", "m2", "m3"} {
		c.publish("q", b)
	}
	c.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 3})
	var ds []*protocol.Deliver
	for range 3 {
		_, d := expect[*protocol.Deliver](c)
		ds = append(ds, d)
	}
	for _, d := range ds {
		if d.LeaseID == 0 || d.Epoch != 0 {
			t.Fatalf("DELIVER %+v: want a lease id and epoch 0", d)
		}
	}

	// Current lease, named by tag and lease reference: applied.
	wantCodes(t, "ack", c.settleRefs(protocol.OpAck, []uint64{ds[0].Tag}, []protocol.LeaseRef{ref(ds[0])}), protocol.CodeOK)
	// The same ack again, with or without the reference: its original outcome.
	wantCodes(t, "ack again", c.settleRefs(protocol.OpAck, []uint64{ds[0].Tag}, []protocol.LeaseRef{ref(ds[0])}), protocol.CodeOK)
	wantCodes(t, "ack again by tag", c.settle(protocol.OpAck, ds[0].Tag), protocol.CodeOK)
	// Another settle of the settled lease is stale.
	wantCodes(t, "nack after ack", c.settle(protocol.OpNack, ds[0].Tag), protocol.CodeStaleLease)
	// Never issued here, no reference: unknown.
	wantCodes(t, "unknown", c.settle(protocol.OpAck, 999), protocol.CodeUnknownTag)
	// A reference that does not name the tag's lease is judged by itself:
	// a lease id the message never had is stale, as is an epoch this
	// single node never issues. Neither touches the lease the tag holds.
	bad := ref(ds[1])
	bad.LeaseID += 100
	wrongEpoch := ref(ds[1])
	wrongEpoch.Epoch = 1
	wantCodes(t, "wrong lease", c.settleRefs(protocol.OpAck, []uint64{ds[1].Tag, ds[1].Tag}, []protocol.LeaseRef{bad, wrongEpoch}),
		protocol.CodeStaleLease, protocol.CodeStaleLease)
	// leases must be empty or as long as tags.
	wantCodes(t, "length mismatch", c.settleRefs(protocol.OpAck, []uint64{ds[1].Tag, ds[2].Tag}, []protocol.LeaseRef{ref(ds[1])}),
		protocol.CodeBadRequest, protocol.CodeBadRequest)
	// The op's own refusal leaves the lease held: a NACK delay over the cap.
	id := c.send(0, &protocol.Settle{Kind: protocol.OpNack, Tags: []uint64{ds[1].Tag}, DelayMs: 5000})
	if h, r := expect[*protocol.SettleResult](c); h.RequestID != id || r.Codes[0] != protocol.CodeBadRequest {
		t.Fatalf("nack over the cap: %v", r.Codes)
	}
	wantCodes(t, "fail and nack", c.settleRefs(protocol.OpFail, []uint64{ds[1].Tag}, []protocol.LeaseRef{ref(ds[1])}), protocol.CodeOK)
	wantCodes(t, "fail again", c.settle(protocol.OpFail, ds[1].Tag), protocol.CodeOK)

	// A NACK requeues: the redelivery is a new lease with a new tag; the
	// old lease is stale for every op.
	c.send(0, &protocol.Settle{Kind: protocol.OpNack, Tags: []uint64{ds[2].Tag}})
	got := c.readN(2)
	if r := got[protocol.OpSettleResult]; len(r) != 1 || r[0].(*protocol.SettleResult).Codes[0] != protocol.CodeOK {
		t.Fatalf("nack: %v", got)
	}
	re := got[protocol.OpDeliver][0].(*protocol.Deliver)
	if re.Offset != ds[2].Offset || re.LeaseID == ds[2].LeaseID || re.Tag == ds[2].Tag || re.Attempt != 2 {
		t.Fatalf("redelivery %+v of %+v", re, ds[2])
	}
	wantCodes(t, "ack of the nacked lease", c.settleRefs(protocol.OpAck, []uint64{ds[2].Tag}, []protocol.LeaseRef{ref(ds[2])}), protocol.CodeStaleLease)
	wantCodes(t, "ack of the redelivery", c.settle(protocol.OpAck, re.Tag), protocol.CodeOK)

	st := fx.srv.Stats().Sessions
	if st.SettleRepeated != 3 || st.LateSettleStale < 4 || st.LateSettleUnknownTag != 1 {
		t.Fatalf("session stats %+v", st)
	}
}

// TestAckAfterReleaseBeforeRelease: a lease released because its
// subscription went away is still the message's latest attempt until the
// message is leased again, so its holder's late ack applies.
func TestAckAfterReleaseBeforeReLease(t *testing.T) {
	fx := startReal(t, broker.Config{}, nil)
	c := fx.dial()
	c.hello(protocol.Hello{})
	c.publish("q", "m1")
	sub := c.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 1})
	_, d := expect[*protocol.Deliver](c)
	id := c.send(0, &protocol.Unsubscribe{SubID: sub.SubID})
	if h, _ := expect[*protocol.OK](c); h.RequestID != id {
		t.Fatalf("OK for %d", h.RequestID)
	}
	wantCodes(t, "late ack", c.settle(protocol.OpAck, d.Tag), protocol.CodeOK)
	wantCodes(t, "late ack again", c.settle(protocol.OpAck, d.Tag), protocol.CodeOK)
	// The message is gone: a new subscriber gets the next one first.
	c.publish("q", "m2")
	c.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 1})
	if _, d2 := expect[*protocol.Deliver](c); string(d2.Body) != "m2" {
		t.Fatalf("delivered %q after the late ack, want m2", d2.Body)
	}
	if st := fx.srv.Stats().Sessions; st.LateSettleAccepted != 1 || st.SettleRepeated != 1 {
		t.Fatalf("session stats %+v", st)
	}
}

// TestLateSettleAfterGraceExpiry: after the grace ran out, the client comes
// back fresh; its settle by lease reference applies while the message was
// not leased again, and is stale once another consumer holds it, whose
// settle then wins.
func TestLateSettleAfterGraceExpiry(t *testing.T) {
	fx, timers := startGrace(t, 60_000)
	c1 := fx.dial()
	ok1 := c1.hello(protocol.Hello{})
	c1.publish("q", "m1")
	c1.publish("q", "m2")
	c1.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 2})
	_, d1 := expect[*protocol.Deliver](c1)
	_, d2 := expect[*protocol.Deliver](c1)
	c1.nc.Close()
	timers.waitArmed(t)

	// Another consumer of the queue gets nothing while the session is
	// dormant: its leases are kept.
	other := fx.dial()
	other.hello(protocol.Hello{})
	other.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 1})
	other.ping()
	if fx.srv.Stats().Sessions.Dormant != 1 {
		t.Fatalf("stats %+v", fx.srv.Stats().Sessions)
	}
	if n := timers.fire(); n != 1 {
		t.Fatalf("%d grace timers fired", n)
	}
	// Grace expired: both leases were released; the other consumer (prefetch
	// 1) takes m1 again, m2 waits in the queue.
	_, o1 := expect[*protocol.Deliver](other)
	if o1.Offset != d1.Offset || o1.Attempt != 2 {
		t.Fatalf("other got %+v, want m1 again", o1)
	}

	// The client returns after the grace: a fresh session.
	c2 := fx.dial()
	ok2 := c2.hello(protocol.Hello{Resume: ok1.Resume})
	if ok2.Outcome != protocol.ResumeNotFound || ok2.Resume.ClientID == ok1.Resume.ClientID {
		t.Fatalf("resume after expiry: %+v", ok2)
	}
	// Its old tags mean nothing here; with their lease references, the
	// re-leased m1 is stale and the unleased m2 is applied.
	wantCodes(t, "late settles", c2.settleRefs(protocol.OpAck, []uint64{d1.Tag, d2.Tag}, []protocol.LeaseRef{ref(d1), ref(d2)}),
		protocol.CodeStaleLease, protocol.CodeOK)
	wantCodes(t, "without references", c2.settle(protocol.OpAck, d1.Tag), protocol.CodeUnknownTag)
	// The other consumer's settle wins.
	wantCodes(t, "other's ack", other.settle(protocol.OpAck, o1.Tag), protocol.CodeOK)
	// Both messages are settled: a new one is what comes next.
	other.publish("q", "m3")
	if _, d := expect[*protocol.Deliver](other); string(d.Body) != "m3" {
		t.Fatalf("next delivery %q, want m3", d.Body)
	}
	st := fx.srv.Stats().Sessions
	if st.GraceEntered != 1 || st.GraceExpired != 1 || st.GraceRequeued != 2 || st.LateSettleAccepted != 1 || st.LateSettleStale != 1 {
		t.Fatalf("session stats %+v", st)
	}
}

// TestRefNeverReachesAnotherSessionsLease: a lease reference to a live
// subscription of another session is stale, and the lease stays with its
// holder.
func TestRefNeverReachesAnotherSessionsLease(t *testing.T) {
	fx := startReal(t, broker.Config{}, nil)
	a := fx.dial()
	a.hello(protocol.Hello{})
	a.publish("q", "m1")
	a.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 1})
	_, d := expect[*protocol.Deliver](a)
	b := fx.dial()
	b.hello(protocol.Hello{})
	wantCodes(t, "foreign ref", b.settleRefs(protocol.OpAck, []uint64{1}, []protocol.LeaseRef{ref(d)}), protocol.CodeStaleLease)
	wantCodes(t, "holder's ack", a.settle(protocol.OpAck, d.Tag), protocol.CodeOK)
}

// TestEndSession: END_SESSION answers OK, closes the connection, hands the
// leases back at once without using a retry, and the identity no longer
// resumes.
func TestEndSession(t *testing.T) {
	fx, timers := startGrace(t, 60_000)
	c := fx.dial()
	ok := c.hello(protocol.Hello{})
	// No retries at all: a delivery that used one would be discarded.
	c.send(0, &protocol.DeclareQueue{Topic: "q", Partitions: 1, MaxRetries: 0, DeadLetterMode: protocol.DeadLetterDiscard})
	expect[*protocol.DeclareOK](c)
	c.publish("q", "m1")
	c.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 1})
	_, d := expect[*protocol.Deliver](c)

	other := fx.dial()
	other.hello(protocol.Hello{})
	other.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 1})

	id := c.send(0, &protocol.EndSession{})
	if h, _ := expect[*protocol.OK](c); h.RequestID != id {
		t.Fatalf("OK for %d, want %d", h.RequestID, id)
	}
	c.expectClosed()
	// At once, not after the grace: no timer had to fire.
	_, o := expect[*protocol.Deliver](other)
	if o.Offset != d.Offset || o.Attempt != 2 {
		t.Fatalf("other got %+v, want the released message", o)
	}
	if n := timers.fire(); n != 0 {
		t.Fatalf("%d grace timers were pending after END_SESSION", n)
	}
	c2 := fx.dial()
	if ok2 := c2.hello(protocol.Hello{Resume: ok.Resume}); ok2.Outcome != protocol.ResumeNotFound {
		t.Fatalf("resume after END_SESSION: %v", ok2.Outcome)
	}
	wantCodes(t, "other's ack", other.settle(protocol.OpAck, o.Tag), protocol.CodeOK)
	st := fx.srv.Stats().Sessions
	if st.SessionsEnded != 1 || st.GraceEntered != 0 {
		t.Fatalf("session stats %+v", st)
	}
}

// TestInflightReconcile: after a resume, INFLIGHT gets only the deliveries
// the client lacks re-sent, marks stale what the session no longer holds and
// keeps the rest.
func TestInflightReconcile(t *testing.T) {
	fx, _ := startGrace(t, 60_000)
	c1 := fx.dial()
	ok1 := c1.hello(protocol.Hello{})
	for _, b := range []string{"m1", "m2", "m3"} {
		c1.publish("q", b)
	}
	sub := c1.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 3})
	var ds []*protocol.Deliver
	for range 3 {
		_, d := expect[*protocol.Deliver](c1)
		ds = append(ds, d)
	}
	// m1 is acked; the client will not know (its reply "was lost").
	wantCodes(t, "ack m1", c1.settle(protocol.OpAck, ds[0].Tag), protocol.CodeOK)
	c1.nc.Close()

	c2 := fx.dial()
	if ok2 := c2.hello(protocol.Hello{Resume: ok1.Resume}); ok2.Outcome != protocol.ResumeResumed {
		t.Fatalf("resume: %v", ok2.Outcome)
	}
	view := protocol.SubView{SubID: sub.SubID, Topic: "q", Partition: 0, Prefetch: 3}
	c2.send(0, &protocol.Reconcile{Subs: []protocol.SubView{view}, InflightFollows: true})
	_, rr := expect[*protocol.ReconcileResult](c2)
	if len(rr.Entries) != 1 || rr.Entries[0].Action != protocol.ActionKeep {
		t.Fatalf("reconcile: %+v", rr.Entries)
	}
	// The client holds m1 (it thinks) and m2, and lost m3 with the socket.
	id := c2.send(0, &protocol.Inflight{Entries: []protocol.InflightEntry{
		{Tag: ds[0].Tag, Lease: ref(ds[0])}, {Tag: ds[1].Tag, Lease: ref(ds[1])},
	}})
	_, re := expect[*protocol.Deliver](c2) // written before the result
	if re.Tag != ds[2].Tag || re.LeaseID != ds[2].LeaseID || string(re.Body) != "m3" {
		t.Fatalf("re-sent %+v, want m3 unchanged", re)
	}
	h, res := expect[*protocol.InflightResult](c2)
	if h.RequestID != id || len(res.Stale) != 1 || res.Stale[0] != ds[0].Tag || res.Resent != 1 || res.Kept != 1 {
		t.Fatalf("INFLIGHT_RESULT %+v", res)
	}
	c2.ping() // nothing else was re-sent
	wantCodes(t, "settle kept and re-sent", c2.settle(protocol.OpAck, ds[1].Tag, ds[2].Tag), protocol.CodeOK, protocol.CodeOK)
	st := fx.srv.Stats().Sessions
	if st.InflightResent != 1 || st.InflightStale != 1 || st.InflightKept != 1 || st.ReconcileKeep != 1 || st.Resent != 1 {
		t.Fatalf("session stats %+v", st)
	}
}

// TestInflightFollowsButAnotherRequestComes: a client that promised INFLIGHT
// and sends something else first gets every re-send before that answer.
func TestInflightFollowsButAnotherRequestComes(t *testing.T) {
	fx, _ := startGrace(t, 60_000)
	c1 := fx.dial()
	ok1 := c1.hello(protocol.Hello{})
	c1.publish("q", "m1")
	sub := c1.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 3})
	_, d := expect[*protocol.Deliver](c1)
	c1.nc.Close()
	c2 := fx.dial()
	c2.hello(protocol.Hello{Resume: ok1.Resume})
	c2.send(0, &protocol.Reconcile{Subs: []protocol.SubView{{SubID: sub.SubID, Topic: "q", Prefetch: 3}}, InflightFollows: true})
	expect[*protocol.ReconcileResult](c2)
	id := c2.send(0, &protocol.Ping{})
	if _, re := expect[*protocol.Deliver](c2); re.Tag != d.Tag {
		t.Fatalf("re-sent %+v", re)
	}
	if h, _ := expect[*protocol.Pong](c2); h.RequestID != id {
		t.Fatalf("pong for %d", h.RequestID)
	}
}

// TestResumeLifecycle is the note's protocol and broker list against the
// real broker: new, resumed, not found; no grace requeues at once; grace
// keeps leases and the dormant consumer takes no new deliveries; a late
// settle after the resume is accepted; grace expiry requeues; a reconnect
// after expiry is fresh.
func TestResumeLifecycle(t *testing.T) {
	t.Run("no grace requeues at once", func(t *testing.T) {
		fx := startReal(t, broker.Config{}, nil)
		c := fx.dial()
		if ok := c.hello(protocol.Hello{}); ok.Outcome != protocol.ResumeNew || ok.ReconnectGraceMs != 0 {
			t.Fatalf("hello: %+v", ok)
		}
		c.publish("q", "m1")
		c.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 1})
		expect[*protocol.Deliver](c)
		other := fx.dial()
		other.hello(protocol.Hello{})
		other.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 1})
		c.nc.Close()
		if _, d := expect[*protocol.Deliver](other); d.Attempt != 2 {
			t.Fatalf("requeued delivery %+v", d)
		}
	})
	t.Run("grace", func(t *testing.T) {
		fx, timers := startGrace(t, 60_000)
		c1 := fx.dial()
		ok1 := c1.hello(protocol.Hello{})
		if ok1.Outcome != protocol.ResumeNew || ok1.ReconnectGraceMs != 60_000 {
			t.Fatalf("hello: %+v", ok1)
		}
		c1.publish("q", "m1")
		sub := c1.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 5})
		_, d1 := expect[*protocol.Deliver](c1)
		c1.nc.Close()
		timers.waitArmed(t)

		// Unknown identity: a clear outcome and a fresh session.
		stranger := fx.dial()
		unknown := ok1.Resume
		unknown.ClientID = "c-0000000000000000"
		if ok := stranger.hello(protocol.Hello{Resume: unknown}); ok.Outcome != protocol.ResumeNotFound {
			t.Fatalf("unknown identity: %v", ok.Outcome)
		}
		// The dormant consumer (prefetch 5, one held) is skipped: a new
		// message goes to a live consumer.
		other := fx.dial()
		other.hello(protocol.Hello{})
		other.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 1})
		other.publish("q", "m2")
		if _, d := expect[*protocol.Deliver](other); string(d.Body) != "m2" || d.Attempt != 1 {
			t.Fatalf("live consumer got %+v, want m2 (m1 stays leased to the dormant session)", d)
		}

		c2 := fx.dial()
		ok2 := c2.hello(protocol.Hello{Resume: ok1.Resume})
		if ok2.Outcome != protocol.ResumeResumed || ok2.Resume.ClientID != ok1.Resume.ClientID {
			t.Fatalf("resume: %+v", ok2)
		}
		c2.send(0, &protocol.Reconcile{Subs: []protocol.SubView{{SubID: sub.SubID, Topic: "q", Prefetch: 5}}})
		expect[*protocol.ReconcileResult](c2)
		if _, re := expect[*protocol.Deliver](c2); re.Tag != d1.Tag {
			t.Fatalf("re-sent %+v", re)
		}
		// The late settle of a delivery made before the break is accepted.
		wantCodes(t, "late ack", c2.settle(protocol.OpAck, d1.Tag), protocol.CodeOK)

		// A second break, past the grace this time.
		c2.publish("q", "m3")
		_, d3 := expect[*protocol.Deliver](c2)
		c2.nc.Close()
		timers.waitArmed(t)
		if n := timers.fire(); n != 1 {
			t.Fatalf("%d timers fired", n)
		}
		// Grace expiry requeued m3 (the other consumer still holds m2, so
		// it settles m2 to make room).
		wantCodes(t, "other's ack", other.settle(protocol.OpAck, 1), protocol.CodeOK)
		if _, d := expect[*protocol.Deliver](other); d.Offset != d3.Offset || d.Attempt != 2 {
			t.Fatalf("after grace expiry other got %+v, want m3 again", d)
		}
		c3 := fx.dial()
		if ok3 := c3.hello(protocol.Hello{Resume: ok1.Resume}); ok3.Outcome != protocol.ResumeNotFound || ok3.Resume.ClientID == ok1.Resume.ClientID {
			t.Fatalf("reconnect after expiry: %+v", ok3)
		}
		st := fx.srv.Stats().Sessions
		if st.Resumed != 1 || st.ResumeNotFound != 2 || st.GraceEntered != 2 || st.GraceExpired != 1 || st.GraceRequeued != 1 || st.LateSettleAccepted != 1 {
			t.Fatalf("session stats %+v", st)
		}
	})
}

// TestReconcileClosedDeliveriesAreStale: the deliveries of a subscription
// that reconciliation closed are stale, by tag and by lease reference, and
// go back to the queue.
func TestReconcileClosedDeliveriesAreStale(t *testing.T) {
	fx, timers := startGrace(t, 60_000)
	c1 := fx.dial()
	ok1 := c1.hello(protocol.Hello{})
	c1.publish("q", "m1")
	c1.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 1})
	_, d := expect[*protocol.Deliver](c1)
	c1.nc.Close()
	timers.waitArmed(t)
	c2 := fx.dial()
	c2.hello(protocol.Hello{Resume: ok1.Resume})
	c2.send(0, &protocol.Reconcile{}) // the client holds nothing: the server's subscription is closed
	if _, rr := expect[*protocol.ReconcileResult](c2); len(rr.Entries) != 1 || rr.Entries[0].Action != protocol.ActionCloseServerSide {
		t.Fatalf("reconcile: %+v", rr.Entries)
	}
	wantCodes(t, "by tag and by reference", c2.settleRefs(protocol.OpAck, []uint64{d.Tag, d.Tag}, []protocol.LeaseRef{ref(d), ref(d)}),
		protocol.CodeStaleLease, protocol.CodeStaleLease)
	wantCodes(t, "by tag alone", c2.settle(protocol.OpAck, d.Tag), protocol.CodeStaleLease)
	c2.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 1})
	if _, again := expect[*protocol.Deliver](c2); again.Offset != d.Offset || again.Attempt != 2 {
		t.Fatalf("after reconciliation got %+v, want m1 again", again)
	}
}

// TestReconcileRestoreRecreates: under the restore policy a subscription the
// client holds and the broker does not is recreated with a new id, which the
// result reports, and its deliveries follow the result.
func TestReconcileRestoreRecreates(t *testing.T) {
	fx, timers := startGrace(t, 60_000)
	c1 := fx.dial()
	ok1 := c1.hello(protocol.Hello{})
	c1.publish("q", "m1")
	c1.nc.Close()
	timers.waitArmed(t)
	c2 := fx.dial()
	c2.hello(protocol.Hello{Resume: ok1.Resume})
	view := protocol.SubView{SubID: 77, Topic: "q", Partition: 0, Prefetch: 2}
	c2.send(0, &protocol.Reconcile{Policy: protocol.ReconcileRestore, Subs: []protocol.SubView{view}})
	_, rr := expect[*protocol.ReconcileResult](c2)
	if len(rr.Entries) != 1 {
		t.Fatalf("entries %+v", rr.Entries)
	}
	e := rr.Entries[0]
	if e.Action != protocol.ActionRecreateClient || e.ClientSubID != 77 || e.ServerSubID == 0 || e.ServerSubID == 77 || e.Server.Topic != "q" {
		t.Fatalf("entry %+v, want recreate_client_side with a new server id", e)
	}
	_, d := expect[*protocol.Deliver](c2)
	if d.SubID != e.ServerSubID || string(d.Body) != "m1" {
		t.Fatalf("delivery %+v on the recreated subscription %d", d, e.ServerSubID)
	}
	wantCodes(t, "ack", c2.settle(protocol.OpAck, d.Tag), protocol.CodeOK)
	if st := fx.srv.Stats().Sessions; st.ReconcileRecreate != 1 {
		t.Fatalf("session stats %+v", st)
	}
}

// TestRefThroughAnotherPrincipalsClosedSubscription: a closed subscription
// still takes a settle by lease reference from its own principal (the same
// client on a fresh session), but never from another user's session, even
// one that names the exact lease: that gets stale_lease, like a lease that
// does not exist, and the message is untouched.
func TestRefThroughAnotherPrincipalsClosedSubscription(t *testing.T) {
	users, err := auth.OpenUsersParams(vfs.NewMem(), "/data/meta/users", cheapHash)
	if err != nil {
		t.Fatal(err)
	}
	all := []string{"*"}
	if err := users.Add("alice", "alice password", auth.Permissions{Publish: all, Consume: all, Manage: all}); err != nil {
		t.Fatal(err)
	}
	if err := users.Add("mallory", "mallory password", auth.Permissions{}); err != nil {
		t.Fatal(err)
	}
	fx := startReal(t, broker.Config{}, func(c *Config) { c.Users, c.AuthFailureDelayMs = users, -1 })
	alice := fx.dial()
	alice.hello(protocol.Hello{User: "alice", Credentials: "alice password"})
	alice.publish("q", "m1")
	sub := alice.subscribe(protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 1})
	_, d := expect[*protocol.Deliver](alice)
	// Closing the subscription hands the lease back: m1 waits in the
	// queue, and its ended lease is still its latest attempt.
	alice.send(0, &protocol.Unsubscribe{SubID: sub.SubID})
	expect[*protocol.OK](alice)

	mallory := fx.dial()
	mallory.hello(protocol.Hello{User: "mallory", Credentials: "mallory password"})
	unknown := ref(d)
	unknown.SubID = sub.SubID + 1000
	for _, op := range []protocol.Op{protocol.OpFail, protocol.OpAck, protocol.OpNack} {
		wantCodes(t, "mallory through alice's closed subscription", mallory.settleRefs(op, []uint64{0, 0}, []protocol.LeaseRef{ref(d), unknown}),
			protocol.CodeStaleLease, protocol.CodeStaleLease)
	}
	// Alice, back on a fresh session, still settles her own ended lease:
	// the FAIL above changed nothing.
	again := fx.dial()
	again.hello(protocol.Hello{User: "alice", Credentials: "alice password"})
	wantCodes(t, "alice's late ack", again.settleRefs(protocol.OpAck, []uint64{d.Tag}, []protocol.LeaseRef{ref(d)}), protocol.CodeOK)
}
