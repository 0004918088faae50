package sinew

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/testkit"
	"github.com/sinewmq/sinew/protocol"
)

// These tests fake the cluster (fakeserver_test.go) because they need a
// node that is silent but connected, which the real broker cannot be made
// in process; test/e2e's TestClusterPublishHedgedPastAStoppedOwner runs
// the hedge against a real three-node cluster whose owner is stopped.

// awaitTimer waits until clk has a pending timer of d.
func awaitTimer(t *testing.T, clk *testkit.Clock, d time.Duration) {
	t.Helper()
	ctx := testCtx(t)
	for {
		if slices.Contains(clk.Pending(), d) {
			return
		}
		if _, err := clk.WaitForWaits(ctx, len(clk.Waits())+1); err != nil {
			t.Fatalf("no %v timer: pending %v", d, clk.Pending())
		}
	}
}

// ownedBy answers METADATA naming owner as the owner of partition 0 of
// every queue, with replicas.
func ownedBy(owner string, replicas ...string) func(*protocol.Metadata) protocol.Body {
	return func(*protocol.Metadata) protocol.Body {
		return &protocol.MetadataResult{Cluster: true, Partitions: []protocol.PartitionMeta{
			{Partition: 0, Owner: owner, Epoch: 2, Replicas: replicas}}}
	}
}

// hedgeClient dials a with b as a seed on a fake clock, and reports each
// hedge's outcome on the returned channel.
func hedgeClient(t *testing.T, a, b *fakeBroker) (*Client, *testkit.Clock, chan string) {
	t.Helper()
	clk := testkit.NewClock(time.Unix(1_700_000_000, 0))
	c := dialT(t, a.addr(), WithSeeds(b.addr()), WithClock(clk), WithHeartbeat(time.Hour),
		WithDrainTimeout(200*time.Millisecond))
	outcomes := make(chan string, 8)
	c.rt.onHedge = func(o string) { outcomes <- o }
	return c, clk, outcomes
}

func nextOutcome(t *testing.T, outcomes chan string) string {
	t.Helper()
	select {
	case o := <-outcomes:
		return o
	case <-testCtx(t).Done():
		t.Fatal("no hedge outcome")
	}
	return ""
}

// A publish its owner leaves unanswered (its connection silent, not
// broken) is sent again after publishHedgeAfter, on the client's clock, to
// the owner METADATA names now, with the same producer id and sequence;
// that confirm is the outcome, and later publishes go to the new owner.
func TestHedgedPublishGoesToTheNewOwner(t *testing.T) {
	ctx := testCtx(t)
	a, b := newFakeBroker(t), newFakeBroker(t)
	b.set(func(b *fakeBroker) { b.metadata = ownedBy(b.addr(), a.addr(), b.addr()) })
	c, clk, outcomes := hedgeClient(t, a, b)
	a.set(func(a *fakeBroker) { a.silent = true })

	f := c.PublishAsync(ctx, "orders", []byte("one"))
	a.await(ctx, "the publish reaches the silent owner", func(a *fakeBroker) bool { return a.ops[protocol.OpPublish] == 1 })
	awaitTimer(t, clk, publishHedgeAfter)
	select {
	case <-f.Done():
		t.Fatalf("resolved before any broker answered: %v", f.err)
	default:
	}
	clk.Advance(publishHedgeAfter)
	res, err := f.Wait(ctx)
	if err != nil {
		t.Fatalf("hedged publish: %v", err)
	}
	if o := nextOutcome(t, outcomes); o != hedgeWon {
		t.Fatalf("hedge outcome %q, want %q", o, hedgeWon)
	}
	got := b.stored("orders")
	if len(got) != 1 || string(got[0].Body) != "one" || got[0].ProducerID != c.ProducerID() || got[0].ProducerSeq != 1 {
		t.Fatalf("the new owner stored %+v, want one copy of seq 1 under %q", got, c.ProducerID())
	}
	if res.Offset != 0 || res.Duplicate {
		t.Fatalf("result %+v, want the new owner's confirm", res)
	}

	// The owner moved: the next publish goes straight to it, unhedged.
	if _, err := c.Publish(ctx, "orders", []byte("two")); err != nil {
		t.Fatal(err)
	}
	if n := len(b.stored("orders")); n != 2 {
		t.Fatalf("the new owner holds %d messages, want 2", n)
	}
	if n := a.count(protocol.OpPublish); n != 1 {
		t.Fatalf("the silent node got %d publishes, want 1", n)
	}
}

// A slow owner that still answers (heartbeats) is not sent a second copy
// when METADATA still names it; its own confirm is the outcome.
func TestHedgeSkippedWhileTheOwnerIsLive(t *testing.T) {
	ctx := testCtx(t)
	a, b := newFakeBroker(t), newFakeBroker(t)
	a.set(func(a *fakeBroker) { a.metadata = ownedBy(a.addr(), a.addr(), b.addr()); a.holdPublishes = true })
	b.set(func(b *fakeBroker) { b.metadata = ownedBy(a.addr(), a.addr(), b.addr()) })
	c, clk, outcomes := hedgeClient(t, a, b)

	f := c.PublishAsync(ctx, "orders", []byte("slow"))
	a.await(ctx, "the publish reaches the owner", func(a *fakeBroker) bool { return len(a.heldPublishes) == 1 })
	awaitTimer(t, clk, publishHedgeAfter)
	clk.Advance(publishHedgeAfter)
	// Nothing read for publishHedgeAfter: the hedge sends a PING, which
	// the live owner answers.
	if o := nextOutcome(t, outcomes); o != hedgeSkipped {
		t.Fatalf("hedge outcome %q, want %q", o, hedgeSkipped)
	}
	if n := b.count(protocol.OpPublish); n != 0 {
		t.Fatalf("the other node got %d publishes, want none", n)
	}
	if n := a.count(protocol.OpPing); n != 1 {
		t.Fatalf("the owner got %d PINGs, want the hedge's one", n)
	}
	a.releaseHeld()
	if _, err := f.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(a.stored("orders")); n != 1 {
		t.Fatalf("stored %d, want 1", n)
	}
}

// The first confirm is the outcome; the hedge's later one is dropped, and
// nothing is reported before a broker confirmed.
func TestHedgeFirstConfirmWins(t *testing.T) {
	ctx := testCtx(t)
	a, b := newFakeBroker(t), newFakeBroker(t)
	a.set(func(a *fakeBroker) { a.holdPublishes = true })
	b.set(func(b *fakeBroker) { b.metadata = ownedBy(b.addr(), a.addr(), b.addr()); b.holdPublishes = true })
	c, clk, outcomes := hedgeClient(t, a, b)

	f := c.PublishAsync(ctx, "orders", []byte("raced"))
	a.await(ctx, "the publish reaches the first owner", func(a *fakeBroker) bool { return len(a.heldPublishes) == 1 })
	awaitTimer(t, clk, publishHedgeAfter)
	clk.Advance(publishHedgeAfter)
	b.await(ctx, "the hedge reaches the new owner", func(b *fakeBroker) bool { return len(b.heldPublishes) == 1 })
	select {
	case <-f.Done():
		t.Fatalf("resolved before any broker confirmed: %v", f.err)
	default:
	}
	a.releaseHeld() // the original's confirm comes first
	res, err := f.Wait(ctx)
	if err != nil || res.Offset != 0 {
		t.Fatalf("Wait = %+v, %v", res, err)
	}
	if o := nextOutcome(t, outcomes); o != hedgeLost {
		t.Fatalf("hedge outcome %q, want %q", o, hedgeLost)
	}
	b.releaseHeld() // the hedge's confirm, dropped
	if _, err := c.Publish(ctx, "orders", []byte("after")); err != nil {
		t.Fatal(err)
	}
	if r, err := f.Result(); err != nil || r != res {
		t.Fatalf("the outcome changed to %+v, %v", r, err)
	}
}

// A publish without a producer id could be stored twice by a hedge: it is
// never hedged. Neither is a publish of a client without seeds.
func TestNoHedgeWithoutDeduplicationOrSeeds(t *testing.T) {
	ctx := testCtx(t)
	a, b := newFakeBroker(t), newFakeBroker(t)
	b.set(func(b *fakeBroker) { b.metadata = ownedBy(b.addr(), a.addr(), b.addr()) })
	a.set(func(a *fakeBroker) { a.holdPublishes = true })
	c, clk, _ := hedgeClient(t, a, b)
	c.PublishAsync(ctx, "orders", []byte("plain"), WithProducerSequence("", 0))
	a.await(ctx, "the publish arrives", func(a *fakeBroker) bool { return len(a.heldPublishes) == 1 })
	if slices.Contains(clk.Waits(), publishHedgeAfter) {
		t.Fatalf("a publish without a producer id was armed for a hedge: waits %v", clk.Waits())
	}

	clk2 := testkit.NewClock(time.Unix(1_700_000_000, 0))
	single := dialT(t, a.addr(), WithClock(clk2), WithHeartbeat(time.Hour), WithDrainTimeout(200*time.Millisecond))
	single.PublishAsync(ctx, "orders", []byte("single"))
	a.await(ctx, "the publish arrives", func(a *fakeBroker) bool { return len(a.heldPublishes) == 2 })
	if slices.Contains(clk2.Waits(), publishHedgeAfter) {
		t.Fatalf("a client without seeds armed a hedge: waits %v", clk2.Waits())
	}
	a.releaseHeld()
}

// The hedge of an ACK of a spanning subscription runs on the client's
// clock: nothing is re-sent before it has advanced by settleHedgeAfter.
func TestAckHedgeUsesTheClientsClock(t *testing.T) {
	ctx := testCtx(t)
	a, b := newFakeBroker(t), newFakeBroker(t)
	meta := ownedBy(b.addr(), a.addr(), b.addr())
	a.set(func(a *fakeBroker) { a.metadata = meta })
	b.set(func(b *fakeBroker) { b.metadata = meta })
	c, clk, _ := hedgeClient(t, a, b)
	sub, err := c.Subscribe(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	b.await(ctx, "a part subscribes on the owner", func(b *fakeBroker) bool { return b.ops[protocol.OpSubscribe] == 1 })
	a.set(func(a *fakeBroker) {
		q := a.queue("jobs")
		q.ready = append(q.ready, &fMsg{offset: 0, pub: protocol.Publish{Topic: "jobs", Body: []byte("job")}})
		a.dispatch(q)
	})
	m := recv(t, sub)
	a.set(func(a *fakeBroker) { a.silent = true })
	f := m.CompleteAsync()
	a.await(ctx, "the ACK reaches the silent node", func(a *fakeBroker) bool { return a.ops[protocol.OpAck] == 1 })
	awaitTimer(t, clk, settleHedgeAfter)
	if n := b.count(protocol.OpAck); n != 0 {
		t.Fatalf("the owner got %d ACKs before the clock moved", n)
	}
	clk.Advance(settleHedgeAfter)
	b.await(ctx, "the ACK is hedged to the owner", func(b *fakeBroker) bool { return b.ops[protocol.OpAck] == 1 })
	// The fake owner does not know the lease (it never delivered it): the
	// outcome is its answer, not a confirm it did not give.
	if err := f.Wait(ctx); !errors.Is(err, ErrUnknownTag) {
		t.Fatalf("Complete = %v, want the owner's unknown_tag", err)
	}
}

// With seeds, Subscribe asks METADATA again, with backoff on the client's
// clock, while no node gives a usable answer; the ctx bounds it.
func TestSubscribeWithSeedsRetriesMetadata(t *testing.T) {
	ctx := testCtx(t)
	a, b := newFakeBroker(t), newFakeBroker(t)
	unavailable := func(*protocol.Metadata) protocol.Body {
		return &protocol.ErrorBody{Code: protocol.CodeUnavailable, Message: "electing"}
	}
	a.set(func(a *fakeBroker) { a.metadata = unavailable })
	b.set(func(b *fakeBroker) { b.metadata = unavailable })
	c, clk, _ := hedgeClient(t, a, b)

	type result struct {
		s   *Subscription
		err error
	}
	done := make(chan result, 1)
	go func() {
		s, err := c.Subscribe(ctx, "later")
		done <- result{s, err}
	}()
	for _, d := range []time.Duration{metadataBackoffMin, 2 * metadataBackoffMin} {
		awaitTimer(t, clk, d)
		select {
		case r := <-done:
			t.Fatalf("Subscribe returned during the election: %v", r.err)
		default:
		}
		if d == 2*metadataBackoffMin {
			a.set(func(a *fakeBroker) { a.metadata = ownedBy(a.addr(), a.addr()) })
		}
		clk.Advance(d)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("Subscribe: %v", r.err)
	}
	if n := a.count(protocol.OpMetadata); n != 3 {
		t.Fatalf("METADATA asked of the client's node %d times, want 3", n)
	}
	_ = r.s.Unsubscribe(ctx)

	// Bounded by the ctx: a cancel ends the retries.
	a.set(func(a *fakeBroker) { a.metadata = unavailable })
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Subscribe(cctx, "never")
		errc <- err
	}()
	awaitTimer(t, clk, metadataBackoffMin) // both nodes asked, and refused
	cancel()
	err := <-errc
	var be *BrokerError
	if !errors.Is(err, context.Canceled) || !errors.As(err, &be) || be.Code != protocol.CodeUnavailable {
		t.Fatalf("Subscribe = %v, want the cancel wrapping the last answer", err)
	}
}

// While METADATA still names the silent owner (the cluster has not noticed
// yet) and its connection does not answer (not even the hedge's PING), the
// hedge looks again every hedgeLookEvery, and goes to the new owner once
// one is named.
func TestHedgeWaitsForTheClusterToNameANewOwner(t *testing.T) {
	ctx := testCtx(t)
	a, b := newFakeBroker(t), newFakeBroker(t)
	b.set(func(b *fakeBroker) { b.metadata = ownedBy(a.addr(), a.addr(), b.addr()) })
	clk := testkit.NewClock(time.Unix(1_700_000_000, 0))
	c := dialT(t, a.addr(), WithSeeds(b.addr()), WithClock(clk), WithHeartbeat(time.Hour),
		WithDrainTimeout(200*time.Millisecond))
	outcomes := make(chan string, 8)
	c.rt.onHedge = func(o string) { outcomes <- o }
	a.set(func(a *fakeBroker) { a.silent = true })

	f := c.PublishAsync(ctx, "orders", []byte("one"))
	awaitTimer(t, clk, publishHedgeAfter)
	clk.Advance(publishHedgeAfter)
	b.await(ctx, "the hedge asks METADATA", func(b *fakeBroker) bool { return b.ops[protocol.OpMetadata] == 1 })
	a.await(ctx, "and pings the owner it names", func(a *fakeBroker) bool { return a.ops[protocol.OpPing] == 1 })
	awaitTimer(t, clk, hedgeLookEvery)
	if n := b.count(protocol.OpPublish); n != 0 {
		t.Fatalf("hedged to the node METADATA does not name: %d publishes", n)
	}
	b.set(func(b *fakeBroker) { b.metadata = ownedBy(b.addr(), a.addr(), b.addr()) })
	clk.Advance(hedgeLookEvery)
	if _, err := f.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if o := nextOutcome(t, outcomes); o != hedgeWon {
		t.Fatalf("hedge outcome %q, want %q", o, hedgeWon)
	}
	if n := len(b.stored("orders")); n != 1 {
		t.Fatalf("stored %d, want 1", n)
	}
}

// partitionOf places a publish where the real broker does, so that a hedge
// asks for the right partition's owner: keyed publishes by the key's hash,
// keyless idempotent ones by their (producer id, sequence), or by the
// partition hint the Client sent them to.
func TestPartitionOfMatchesTheBroker(t *testing.T) {
	ctx := testCtx(t)
	rb := startRealBroker(t, nil)
	c := dialT(t, rb.Addr)
	const parts = 4
	if _, err := c.DeclareQueue(ctx, "placed", QueueConfig{Partitions: parts}); err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		var opts []PublishOption
		p := &protocol.Publish{Partition: -1, ProducerID: c.ProducerID(), ProducerSeq: c.seq.Load() + 1}
		switch {
		case i%2 == 0:
			key := []byte(fmt.Sprintf("key-%d", i))
			opts = append(opts, WithKey(key))
			p.Key = key
		case i%4 == 1:
			c.hints.drop("placed", "") // placed by the hash of (producer id, sequence)
		default:
			// Sent to the partition the broker hinted (hint.go).
			h, ok := c.hints.take("placed", "")
			if !ok {
				t.Fatalf("publish %d: no partition hint after a keyless publish", i)
			}
			p.Partition = h
		}
		res, err := c.Publish(ctx, "placed", []byte("m"), opts...)
		if err != nil {
			t.Fatal(err)
		}
		if want := partitionOf(p, parts); res.Partition != want {
			t.Fatalf("publish %d (key %q, seq %d) landed in partition %d, partitionOf says %d", i, p.Key, p.ProducerSeq, res.Partition, want)
		}
	}
}

// A hedge whose target refuses the partition (an election not over yet:
// unavailable) stores nothing there; it passes that node over, looks
// again, and sends to the owner METADATA names next, rather than leaving
// the publish to the silent connection.
func TestHedgeLooksAgainAfterARefusal(t *testing.T) {
	ctx := testCtx(t)
	a, b, c := newFakeBroker(t), newFakeBroker(t), newFakeBroker(t)
	var mu sync.Mutex
	refused := false
	md := func(*protocol.Metadata) protocol.Body {
		mu.Lock()
		defer mu.Unlock()
		if refused {
			return ownedBy(c.addr(), a.addr(), b.addr(), c.addr())(nil)
		}
		return ownedBy(b.addr(), a.addr(), b.addr(), c.addr())(nil)
	}
	b.set(func(b *fakeBroker) {
		b.metadata = md
		b.publishErr = func(*protocol.Publish) *protocol.ErrorBody {
			mu.Lock()
			refused = true
			mu.Unlock()
			return &protocol.ErrorBody{Code: protocol.CodeUnavailable, Message: "election under way"}
		}
	})
	c.set(func(c *fakeBroker) { c.metadata = md })
	clk := testkit.NewClock(time.Unix(1_700_000_000, 0))
	cl := dialT(t, a.addr(), WithSeeds(b.addr(), c.addr()), WithClock(clk), WithHeartbeat(time.Hour),
		WithDrainTimeout(200*time.Millisecond))
	outcomes := make(chan string, 8)
	cl.rt.onHedge = func(o string) { outcomes <- o }
	a.set(func(a *fakeBroker) { a.silent = true })

	f := cl.PublishAsync(ctx, "orders", []byte("one"))
	a.await(ctx, "the publish reaches the silent owner", func(a *fakeBroker) bool { return a.ops[protocol.OpPublish] == 1 })
	awaitTimer(t, clk, publishHedgeAfter)
	clk.Advance(publishHedgeAfter)
	b.await(ctx, "the hedge reaches the node METADATA named first", func(b *fakeBroker) bool { return b.ops[protocol.OpPublish] == 1 })
	awaitTimer(t, clk, hedgeLookEvery)
	clk.Advance(hedgeLookEvery)
	if _, err := f.Wait(ctx); err != nil {
		t.Fatalf("hedged publish: %v", err)
	}
	if o := nextOutcome(t, outcomes); o != hedgeWon {
		t.Fatalf("hedge outcome %q, want %q", o, hedgeWon)
	}
	if got := c.stored("orders"); len(got) != 1 || got[0].ProducerSeq != 1 {
		t.Fatalf("the next owner stored %+v, want one copy of seq 1", got)
	}
	if got := b.stored("orders"); len(got) != 0 {
		t.Fatalf("the refusing node stored %+v", got)
	}
}
