package sinew

import (
	"fmt"
	"strconv"
	"testing"

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
