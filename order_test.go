package sinew

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/testkit"
	"github.com/sinewmq/sinew/protocol"
)

// storedBodies returns the bodies stored in partition idx of topic on kb,
// in offset order.
func storedBodies(t *testing.T, kb *testkit.Broker, topic string, idx uint32) []string {
	t.Helper()
	var out []string
	from := uint64(0)
	for range 1000 {
		res, err := kb.Broker.Peek(testCtx(t), topic, "", idx, from, 1000)
		if err != nil {
			t.Fatalf("peek %s/%d: %v", topic, idx, err)
		}
		for _, m := range res.Messages {
			out = append(out, string(m.Msg.Body))
		}
		if res.Next >= res.NextLSN {
			return out
		}
		from = res.Next
	}
	t.Fatalf("peek %s/%d: no end", topic, idx)
	return nil
}

// TestPublishesRedirectedStayInOrder: a node that owns nothing answers every
// publish not_owner, naming the real broker; the client redirects each
// publish on its own goroutine, so they reach the owner in any order. The
// links (order.go) make the owner store them in the order sent, keyless and
// keyed alike.
func TestPublishesRedirectedStayInOrder(t *testing.T) {
	owner := startRealBroker(t, nil)
	relay := newFakeBroker(t)
	relay.set(func(b *fakeBroker) {
		b.publishErr = func(*protocol.Publish) *protocol.ErrorBody {
			return &protocol.ErrorBody{Code: protocol.CodeNotOwner, Message: "elsewhere", Owner: owner.Addr}
		}
	})
	c := dialT(t, relay.addr())
	ctx := testCtx(t)
	const n = 300
	for round := range 3 {
		topic := "ordered-" + strconv.Itoa(round)
		var opts []PublishOption
		if round == 2 {
			opts = append(opts, WithKey([]byte("account-7")))
		}
		fs := make([]*PublishFuture, n)
		for i := range n {
			fs[i] = c.PublishAsync(ctx, topic, []byte(strconv.Itoa(i)), opts...)
		}
		for i, f := range fs {
			if _, err := f.Wait(ctx); err != nil {
				t.Fatalf("%s: publish %d: %v", topic, i, err)
			}
		}
		got := storedBodies(t, owner, topic, 0)
		if len(got) != n {
			t.Fatalf("%s: %d stored, want %d", topic, len(got), n)
		}
		for i, b := range got {
			if b != strconv.Itoa(i) {
				t.Fatalf("%s: offset order %v..., want 0 1 2 ...", topic, got[:min(len(got), i+5)])
			}
		}
	}
	if l := c.lanes.size(); l != 0 {
		t.Fatalf("%d publishes left in the lanes after every one resolved", l)
	}
}

// TestLaneLinksToTheHighestUnresolved: a send links to the highest
// unresolved sequence below its own in its lane, and to nothing once those
// resolved; lanes are separate per queue, explicit partition and key.
func TestLaneLinksToTheHighestUnresolved(t *testing.T) {
	c := &Client{}
	mk := func(topic string, part int32, key string) (*protocol.Publish, *flight) {
		p := &protocol.Publish{Topic: topic, Partition: part, ProducerID: "p"}
		if key != "" {
			p.Key = []byte(key)
		}
		fl := &flight{f: &PublishFuture{done: make(chan struct{})}}
		c.lanes.number(c, p, fl)
		return p, fl
	}
	a, fa := mk("t", -1, "")
	b, fb := mk("t", -1, "")
	k, fk := mk("t", -1, "key") // another lane: links to nothing
	d, fd := mk("t", -1, "")
	p0, f0 := mk("t", 0, "")
	other, fo := mk("u", -1, "")
	// link stamps a send of p and then marks it queued, as router.send.
	link := func(p *protocol.Publish, fl *flight) uint64 {
		prev := c.stamped(p, fl).ProducerPrev
		c.lanes.sent(fl, p.ProducerSeq)
		return prev
	}
	// b is sent before a: a publish not sent yet is concurrent, never
	// linked to.
	if got := link(b, fb); got != 0 {
		t.Errorf("b sent before a links to %d, want 0", got)
	}
	for _, tc := range []struct {
		name string
		got  uint64
		want uint64
	}{
		{"a", link(a, fa), 0}, {"b", link(b, fb), a.ProducerSeq}, {"keyed", link(k, fk), 0},
		{"d", link(d, fd), b.ProducerSeq}, {"partition 0", link(p0, f0), 0}, {"other queue", link(other, fo), 0},
	} {
		if tc.got != tc.want {
			t.Errorf("%s links to %d, want %d", tc.name, tc.got, tc.want)
		}
	}
	fb.f.resolve(nil, fmt.Errorf("failed"))
	if got := link(d, fd); got != a.ProducerSeq {
		t.Errorf("after b failed, d links to %d, want a's %d", got, a.ProducerSeq)
	}
	fa.f.resolve(&protocol.PublishOK{}, nil)
	if got := link(d, fd); got != 0 {
		t.Errorf("after a and b resolved, d links to %d, want 0", got)
	}
	if b.ProducerPrev != 0 || d.ProducerPrev != 0 {
		t.Error("stamped changed the shared publish")
	}
}

// stuckClock never fires: a wait bounded by it ends only by what it waits
// for.
type stuckClock struct{}

func (stuckClock) Now() time.Time                       { return time.Unix(0, 0) }
func (stuckClock) After(time.Duration) <-chan time.Time { return nil }

// A publish refused with out_of_sequence because the one it follows was
// refused too waits only until that one is queued again, not for its
// confirm: otherwise every follower of one refused publish is refused in
// turn and the lane moves one confirm at a time (a client whose first
// node did not own the partition ran at 1,400 msg/s instead of 24,000).
// Refused a second time, it waits for the confirm.
func TestRefusedFollowerWaitsForTheResendOnly(t *testing.T) {
	c := &Client{}
	c.o.clock = stuckClock{}
	mk := func() (*protocol.Publish, *flight) {
		p := &protocol.Publish{Topic: "t", Partition: -1, ProducerID: "p"}
		fl := &flight{f: &PublishFuture{done: make(chan struct{})}}
		c.lanes.number(c, p, fl)
		return p, fl
	}
	a, fa := mk()
	b, fb := mk()
	for _, x := range []struct {
		p  *protocol.Publish
		fl *flight
	}{{a, fa}, {b, fb}} {
		c.stamped(x.p, x.fl)
		c.lanes.sent(x.fl, x.p.ProducerSeq)
	}
	c.lanes.unsent(fa, a.ProducerSeq) // a was refused: it will be sent again
	ctx := context.Background()
	returned := make(chan bool, 1)
	go func() { returned <- c.waitPrev(ctx, b, fb) }()
	select {
	case <-returned:
		t.Fatal("b went again before a was queued again")
	default:
	}
	c.lanes.sent(fa, a.ProducerSeq) // a queued again, not confirmed
	select {
	case ok := <-returned:
		if !ok {
			t.Fatal("waitPrev reported b resolved")
		}
	case <-time.After(10 * time.Second): // a bound on a hang, not a timing assertion
		t.Fatal("b still waits after a was queued again")
	}
	go func() { returned <- c.waitPrev(ctx, b, fb) }() // refused again
	select {
	case <-returned:
		t.Fatal("refused twice, b did not wait for a's confirm")
	default:
	}
	fa.f.resolve(&protocol.PublishOK{}, nil)
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("b still waits after a was confirmed")
	}
}
