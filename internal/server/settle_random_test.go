package server

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/sinewmq/sinew/protocol"
)

// rclient is a raw client that keeps the deliveries it reads while waiting
// for replies.
type rclient struct {
	c     *client
	inbox []*protocol.Deliver
}

// call sends body and reads until its reply, keeping deliveries aside.
func (r *rclient) call(body protocol.Body) protocol.Body {
	r.c.t.Helper()
	id := r.c.send(0, body)
	for {
		h, b := r.c.read()
		if d, ok := b.(*protocol.Deliver); ok {
			r.inbox = append(r.inbox, d)
			continue
		}
		if h.RequestID == id {
			return b
		}
		if h.Op != protocol.OpSubClosed {
			r.c.t.Fatalf("unexpected %s %+v while waiting for %d", h.Op, b, id)
		}
	}
}

// TestSettleRandomized drives two consumers of one queue through random
// settles (current, repeated, late, by reference, bogus), cuts with and
// without a resume, grace expiries and unsubscribes, against the real
// broker, and checks the settle promises:
//   - a message whose ACK or FAIL was answered ok is never delivered again;
//   - no message is settled ok under two different leases;
//   - at the end, what a fresh consumer drains is exactly what was published
//     minus what was settled ok: a settle answered stale_lease or unknown_tag
//     took no effect, and nothing answered ok was left undone.
func TestSettleRandomized(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) { settleRandomized(t, seed) })
	}
}

type heldDelivery struct {
	d     *protocol.Deliver
	owner string // which session lineage got it
}

func settleRandomized(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 99))
	fx, timers := startGrace(t, 60_000)
	const topic = "rq"

	b := &rclient{c: fx.dial()}
	b.c.hello(protocol.Hello{})
	// Retries are plenty, so only an ok ACK or FAIL (discarded) removes a
	// message.
	if _, ok := b.call(&protocol.DeclareQueue{Topic: topic, Partitions: 1, MaxRetries: 100_000,
		DeadLetterMode: protocol.DeadLetterDiscard}).(*protocol.DeclareOK); !ok {
		t.Fatal("declare failed")
	}
	b.call(&protocol.Subscribe{Topic: topic, Partition: 0, Prefetch: 3})

	var a *rclient
	var identity protocol.ResumeIdentity
	var subA uint64
	openA := func(resume bool) {
		a = &rclient{c: fx.dial()}
		ok := a.c.hello(protocol.Hello{Resume: identity})
		if resume && ok.Outcome != protocol.ResumeResumed {
			t.Fatalf("resume outcome %v", ok.Outcome)
		}
		if !resume && ok.Outcome == protocol.ResumeResumed {
			t.Fatal("resumed after the grace expired")
		}
		identity = ok.Resume
	}
	openA(false)
	subA = a.call(&protocol.Subscribe{Topic: topic, Partition: 0, Prefetch: 4}).(*protocol.SubscribeOK).SubID

	published := map[uint64]bool{}
	settledBy := map[uint64]uint64{} // offset -> lease id of the ok ACK/FAIL
	heldA := map[uint64]*protocol.Deliver{}
	heldB := map[uint64]*protocol.Deliver{}
	var old []*protocol.Deliver // deliveries of A's earlier sessions, for late settles by reference
	type past struct {
		kind protocol.Op
		d    *protocol.Deliver
		ref  bool
	}
	var done []past // settles of A answered ok, to repeat

	absorb := func(r *rclient, held map[uint64]*protocol.Deliver) {
		for _, d := range r.inbox {
			if lid, ok := settledBy[d.Offset]; ok {
				if d.LeaseID == lid {
					continue // a copy re-sent after a resume, written before the settle: clients drop it by tag
				}
				t.Fatalf("seed %d: offset %d delivered again (lease %d) after an ok settle under lease %d", seed, d.Offset, d.LeaseID, lid)
			}
			held[d.Tag] = d
		}
		r.inbox = r.inbox[:0]
	}
	pick := func(m map[uint64]*protocol.Deliver) *protocol.Deliver {
		if len(m) == 0 {
			return nil
		}
		n := rng.IntN(len(m))
		for _, d := range m {
			if n == 0 {
				return d
			}
			n--
		}
		return nil
	}
	kindOf := func() protocol.Op {
		switch x := rng.IntN(10); {
		case x < 6:
			return protocol.OpAck
		case x < 8:
			return protocol.OpNack
		}
		return protocol.OpFail
	}
	// settle sends one settle from r and accounts for its answer.
	settle := func(r *rclient, held map[uint64]*protocol.Deliver, kind protocol.Op, d *protocol.Deliver, withRef bool) protocol.Code {
		body := &protocol.Settle{Kind: kind, Tags: []uint64{d.Tag}}
		if withRef {
			body.Leases = []protocol.LeaseRef{ref(d)}
		}
		res, ok := r.call(body).(*protocol.SettleResult)
		if !ok || len(res.Codes) != 1 {
			t.Fatalf("seed %d: settle answered %+v", seed, res)
		}
		code := res.Codes[0]
		switch code {
		case protocol.CodeOK:
			if kind != protocol.OpNack {
				if lid, ok := settledBy[d.Offset]; ok && lid != d.LeaseID {
					t.Fatalf("seed %d: offset %d settled ok under lease %d and again under lease %d", seed, d.Offset, lid, d.LeaseID)
				}
				settledBy[d.Offset] = d.LeaseID
			}
			delete(held, d.Tag)
		case protocol.CodeStaleLease, protocol.CodeUnknownTag:
			delete(held, d.Tag)
		default:
			t.Fatalf("seed %d: %s of offset %d answered %v", seed, kind, d.Offset, code)
		}
		return code
	}

	for step := 0; step < 250; step++ {
		absorb(a, heldA)
		absorb(b, heldB)
		switch x := rng.IntN(100); {
		case x < 25: // publish
			ok := b.call(&protocol.Publish{Topic: topic, Partition: 0, Body: []byte(fmt.Sprint("m", step))}).(*protocol.PublishOK)
			published[ok.Offset] = true
		case x < 50: // A settles one it holds
			if d := pick(heldA); d != nil {
				kind := kindOf()
				withRef := rng.IntN(2) == 0
				if settle(a, heldA, kind, d, withRef) == protocol.CodeOK {
					done = append(done, past{kind, d, withRef})
				}
			}
		case x < 60: // A repeats an earlier settle: its original outcome
			if len(done) > 0 {
				p := done[rng.IntN(len(done))]
				if code := settle(a, map[uint64]*protocol.Deliver{}, p.kind, p.d, p.ref); code != protocol.CodeOK {
					t.Fatalf("seed %d: repeated %s of tag %d answered %v, want its original ok", seed, p.kind, p.d.Tag, code)
				}
			}
		case x < 68: // A settles a delivery of an earlier session, by reference
			if len(old) > 0 {
				d := old[rng.IntN(len(old))]
				settle(a, map[uint64]*protocol.Deliver{}, kindOf(), d, true)
			}
		case x < 72: // a bogus tag
			body := &protocol.Settle{Kind: protocol.OpAck, Tags: []uint64{1 << 40}}
			if res := a.call(body).(*protocol.SettleResult); res.Codes[0] != protocol.CodeUnknownTag {
				t.Fatalf("seed %d: bogus tag answered %v", seed, res.Codes[0])
			}
		case x < 85: // B settles one it holds
			if d := pick(heldB); d != nil {
				settle(b, heldB, kindOf(), d, rng.IntN(2) == 0)
			}
		case x < 91: // A's socket is cut and A resumes within the grace
			a.c.nc.Close()
			timers.waitArmed(t)
			openA(true)
			view := protocol.SubView{SubID: subA, Topic: topic, Partition: 0, Prefetch: 4}
			inflight := rng.IntN(2) == 0
			a.call(&protocol.Reconcile{Subs: []protocol.SubView{view}, InflightFollows: inflight})
			if inflight {
				var entries []protocol.InflightEntry
				for tag, d := range heldA {
					entries = append(entries, protocol.InflightEntry{Tag: tag, Lease: ref(d)})
				}
				res := a.call(&protocol.Inflight{Entries: entries}).(*protocol.InflightResult)
				for _, tag := range res.Stale {
					delete(heldA, tag)
				}
			}
		case x < 95: // A's socket is cut for longer than the grace
			a.c.nc.Close()
			timers.waitArmed(t)
			timers.fire()
			for _, d := range heldA {
				old = append(old, d)
			}
			clear(heldA)
			done = done[:0]
			openA(false)
			subA = a.call(&protocol.Subscribe{Topic: topic, Partition: 0, Prefetch: 4}).(*protocol.SubscribeOK).SubID
		default: // A unsubscribes (its leases go back) and subscribes again
			a.call(&protocol.Unsubscribe{SubID: subA})
			for _, d := range heldA {
				old = append(old, d)
			}
			clear(heldA)
			subA = a.call(&protocol.Subscribe{Topic: topic, Partition: 0, Prefetch: 4}).(*protocol.SubscribeOK).SubID
		}
	}
	absorb(a, heldA)
	absorb(b, heldB)

	// Both end their sessions; the releases are applied before the
	// sentinel's publish, so a fresh consumer drains every message left,
	// the sentinel last.
	for _, r := range []*rclient{a, b} {
		if _, ok := r.call(&protocol.EndSession{}).(*protocol.OK); !ok {
			t.Fatal("END_SESSION not answered OK")
		}
	}
	c := &rclient{c: fx.dial()}
	c.c.hello(protocol.Hello{})
	sentinel := c.call(&protocol.Publish{Topic: topic, Partition: 0, Body: []byte("end")}).(*protocol.PublishOK).Offset
	c.call(&protocol.Subscribe{Topic: topic, Partition: 0, Prefetch: 10_000})
	left := map[uint64]bool{}
	for {
		var d *protocol.Deliver
		if len(c.inbox) > 0 {
			d, c.inbox = c.inbox[0], c.inbox[1:]
		} else {
			_, d = expect[*protocol.Deliver](c.c)
		}
		if d.Offset == sentinel {
			break
		}
		if _, ok := settledBy[d.Offset]; ok {
			t.Fatalf("seed %d: settled offset %d drained", seed, d.Offset)
		}
		if left[d.Offset] {
			t.Fatalf("seed %d: offset %d drained twice", seed, d.Offset)
		}
		left[d.Offset] = true
	}
	for off := range published {
		_, settled := settledBy[off]
		if settled == left[off] {
			t.Fatalf("seed %d: offset %d settled ok=%v, drained=%v: want exactly one", seed, off, settled, left[off])
		}
	}
	st := fx.srv.Stats().Sessions
	t.Logf("seed %d: %d published, %d settled ok, %d left; late settles ok %d stale %d unknown %d, repeats %d, inflight resent %d stale %d kept %d",
		seed, len(published), len(settledBy), len(left), st.LateSettleAccepted, st.LateSettleStale, st.LateSettleUnknownTag,
		st.SettleRepeated, st.InflightResent, st.InflightStale, st.InflightKept)
}
