package sinew

import (
	"errors"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/testkit"
	"github.com/sinewmq/sinew/protocol"
)

// These tests fake the cluster (fakeserver_test.go) on a fake clock: a node
// that refuses a partition (unavailable, fenced) while the client still
// reaches it cannot be made in process from the real broker.
// test/e2e/reresolve_test.go runs a real three-node cluster.

// refuseWith makes b answer every publish with code (and owner, for
// not_owner).
func refuseWith(code protocol.Code, owner string) func(*fakeBroker) {
	return func(b *fakeBroker) {
		b.publishErr = func(*protocol.Publish) *protocol.ErrorBody {
			return &protocol.ErrorBody{Code: code, Message: "refused", Owner: owner}
		}
	}
}

// driveUntil advances clk past each pending pause shorter than a hedge
// (the router's retry backoff) until cond holds; it fails the test after
// testTimeout. The clock moves only by the pauses the client asked for.
func driveUntil(t *testing.T, clk *testkit.Clock, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s (pending timers %v)", what, clk.Pending())
		}
		short := time.Duration(0)
		for _, d := range clk.Pending() {
			if d < publishHedgeAfter && (short == 0 || d < short) {
				short = d
			}
		}
		if short > 0 {
			clk.Advance(short)
			continue
		}
		runtime.Gosched()
	}
}

// A node that refuses a publish (unavailable, fenced, or not_owner naming
// no owner) while it still answers is dropped as the partition's node: the
// next send goes to another node the client knows, which stores it, and
// the refusing node is not asked again for the next publish either.
func TestRefusalSendsThePublishToAnotherNode(t *testing.T) {
	for _, tc := range []struct {
		name string
		code protocol.Code
	}{
		{"unavailable", protocol.CodeUnavailable},
		{"fenced", protocol.CodeFenced},
		{"not_owner without owner", protocol.CodeNotOwner},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			a, b := newFakeBroker(t), newFakeBroker(t)
			a.set(refuseWith(tc.code, ""))
			c, clk, _ := hedgeClient(t, a, b)

			f := c.PublishAsync(ctx, "orders", []byte("one"))
			a.await(ctx, "the refusal", func(a *fakeBroker) bool { return a.ops[protocol.OpPublish] == 1 })
			driveUntil(t, clk, "the publish is sent again", func() bool {
				return a.count(protocol.OpPublish) > 1 || len(b.stored("orders")) > 0
			})
			if n := a.count(protocol.OpPublish); n != 1 {
				t.Fatalf("the refusing node got %d sends of the publish, want 1 (the next goes elsewhere)", n)
			}
			if _, err := f.Wait(ctx); err != nil {
				t.Fatalf("publish: %v", err)
			}
			got := b.stored("orders")
			if len(got) != 1 || got[0].ProducerID != c.ProducerID() || got[0].ProducerSeq != 1 {
				t.Fatalf("the other node stored %+v, want seq 1 once", got)
			}
			if _, err := c.Publish(ctx, "orders", []byte("two")); err != nil {
				t.Fatal(err)
			}
			if n := a.count(protocol.OpPublish); n != 1 {
				t.Fatalf("the refusing node got %d publishes, want 1", n)
			}
		})
	}
}

// A node that names as the owner a node that just refused the partition
// (its view is older) is passed over too: the publish reaches a third node
// instead of going back and forth. The hedge is armed once for the
// publish, however many sends it takes.
func TestOwnerHintNamingARefusingNodeIsNotFollowed(t *testing.T) {
	ctx := testCtx(t)
	a, b, d := newFakeBroker(t), newFakeBroker(t), newFakeBroker(t)
	a.set(refuseWith(protocol.CodeFenced, ""))
	b.set(refuseWith(protocol.CodeNotOwner, a.addr()))
	clk := testkit.NewClock(time.Unix(1_700_000_000, 0))
	c := dialT(t, a.addr(), WithSeeds(b.addr(), d.addr()), WithClock(clk), WithHeartbeat(time.Hour),
		WithDrainTimeout(200*time.Millisecond))

	f := c.PublishAsync(ctx, "orders", []byte("one"))
	driveUntil(t, clk, "the third node stores the publish", func() bool {
		return len(d.stored("orders")) == 1 || a.count(protocol.OpPublish) > 1
	})
	if _, err := f.Wait(ctx); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if na, nb := a.count(protocol.OpPublish), b.count(protocol.OpPublish); na != 1 || nb != 1 {
		t.Fatalf("sends: fenced node %d, stale node %d; want 1 each", na, nb)
	}
	armed := 0
	for _, w := range clk.Waits() {
		if w == publishHedgeAfter {
			armed++
		}
	}
	if armed != 1 {
		t.Fatalf("the hedge was armed %d times for one publish, want 1", armed)
	}
}

// A client dialled with one address learns from the first node it reaches
// that it is clustered, and which nodes hold the queue's replicas: a
// fenced answer from that node then sends the publish to another, and the
// application sees no error.
func TestClientWithoutSeedsLearnsTheCluster(t *testing.T) {
	ctx := testCtx(t)
	a, b := newFakeBroker(t), newFakeBroker(t)
	a.set(func(a *fakeBroker) {
		a.metadata = ownedBy(b.addr(), a.addr(), b.addr())
		refuseWith(protocol.CodeFenced, "")(a)
	})
	clk := testkit.NewClock(time.Unix(1_700_000_000, 0))
	c := dialT(t, a.addr(), WithClock(clk), WithHeartbeat(time.Hour), WithDrainTimeout(200*time.Millisecond))

	f := c.PublishAsync(ctx, "orders", []byte("one"))
	driveUntil(t, clk, "the publish resolves", func() bool {
		select {
		case <-f.Done():
			return true
		default:
			return false
		}
	})
	if _, err := f.Wait(ctx); err != nil {
		t.Fatalf("publish through a fenced node, client without seeds: %v", err)
	}
	if got := b.stored("orders"); len(got) != 1 {
		t.Fatalf("the other node stored %d messages, want 1", len(got))
	}
	if !slices.Contains(c.rt.nodes(), b.addr()) {
		t.Fatalf("known nodes %v lack %s", c.rt.nodes(), b.addr())
	}
}

// The same refusal from a single broker (not clustered, or one that does
// not know METADATA) is the publish's outcome, as it always was.
func TestSingleBrokerRefusalIsTheOutcome(t *testing.T) {
	for _, tc := range []struct {
		name string
		md   func(*protocol.Metadata) protocol.Body
	}{
		{"not clustered", func(*protocol.Metadata) protocol.Body { return &protocol.MetadataResult{} }},
		{"no METADATA", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			a := newFakeBroker(t)
			a.set(func(a *fakeBroker) {
				a.metadata = tc.md
				refuseWith(protocol.CodeUnavailable, "")(a)
			})
			c := dialT(t, a.addr(), WithHeartbeat(time.Hour), WithDrainTimeout(200*time.Millisecond))
			for i := range 2 {
				_, err := c.Publish(ctx, "orders", []byte("x"))
				var be *BrokerError
				if !errors.As(err, &be) || be.Code != protocol.CodeUnavailable {
					t.Fatalf("publish %d: %v, want unavailable", i, err)
				}
			}
			if n := a.count(protocol.OpPublish); n != 2 {
				t.Fatalf("%d sends for 2 publishes, want 2", n)
			}
			if c.rt.clustered.Load() {
				t.Fatal("a single broker was taken for a cluster")
			}
		})
	}
}

// GOING_AWAY naming a redirect (a cluster node stopping, naming one that
// stays up) makes the client route new publishes through that node at once
// instead of waiting for the stopping node's next connection.
func TestGoingAwayRedirectRoutesNewWorkElsewhere(t *testing.T) {
	ctx := testCtx(t)
	a, b := newFakeBroker(t), newFakeBroker(t)
	c := dialT(t, a.addr(), WithHeartbeat(time.Hour), WithDrainTimeout(200*time.Millisecond))
	if _, err := c.Publish(ctx, "orders", []byte("before")); err != nil {
		t.Fatal(err)
	}
	a.goingAwayTo(time.Now().Add(time.Hour).UnixMilli(), b.addr())
	until(t, "the client takes the redirect", func() bool { return slices.Contains(c.rt.nodes(), b.addr()) })
	if _, err := c.Publish(ctx, "orders", []byte("after")); err != nil {
		t.Fatal(err)
	}
	if na, nb := len(a.stored("orders")), len(b.stored("orders")); na != 1 || nb != 1 {
		t.Fatalf("stored: stopping node %d, redirect %d; want 1 and 1", na, nb)
	}
}

// A quick refusal does not disarm the publish's hedge: the hedge is armed
// at the first send, and fires publishHedgeAfter later on the client's
// clock although the refusing node answered at once and the publish went
// on to a node that is silent; the hedge then reaches the owner METADATA
// names, whose confirm is the outcome.
func TestQuickRefusalKeepsTheHedgeArmed(t *testing.T) {
	ctx := testCtx(t)
	a, b, d := newFakeBroker(t), newFakeBroker(t), newFakeBroker(t)
	a.set(func(a *fakeBroker) {
		a.metadata = ownedBy(d.addr(), a.addr(), b.addr(), d.addr())
		refuseWith(protocol.CodeFenced, "")(a)
	})
	clk := testkit.NewClock(time.Unix(1_700_000_000, 0))
	c := dialT(t, a.addr(), WithSeeds(b.addr(), d.addr()), WithClock(clk), WithHeartbeat(time.Hour),
		WithDrainTimeout(200*time.Millisecond))
	outcomes := make(chan string, 8)
	c.rt.onHedge = func(o string) { outcomes <- o }
	b.set(func(b *fakeBroker) { b.silent = true })

	f := c.PublishAsync(ctx, "orders", []byte("one"))
	a.await(ctx, "the refusal", func(a *fakeBroker) bool { return a.ops[protocol.OpPublish] == 1 })
	pause := min(routeBackoffMin<<1, routeBackoffMax)
	awaitTimer(t, clk, pause)
	clk.Advance(pause)
	b.await(ctx, "the publish reaches the silent node", func(b *fakeBroker) bool { return b.ops[protocol.OpPublish] == 1 })
	clk.Advance(publishHedgeAfter - pause) // the first send's hedge is due
	if _, err := f.Wait(ctx); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if o := nextOutcome(t, outcomes); o != hedgeWon {
		t.Fatalf("hedge outcome %q, want %q", o, hedgeWon)
	}
	if got := d.stored("orders"); len(got) != 1 || got[0].ProducerSeq != 1 {
		t.Fatalf("the owner stored %+v, want seq 1 once", got)
	}
}
