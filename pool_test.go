package sinew

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/testkit"
	"github.com/sinewmq/sinew/protocol"
)

// An endpoint nothing uses, whose address is not a seed, the client's own,
// or an owner or replica the client knows now, is retired after
// endpointIdleRetire on the client's clock: a dead node's stops redialing,
// and it leaves the pool and the learned nodes. The others stay.
func TestIdleEndpointsAreRetired(t *testing.T) {
	ctx := testCtx(t)
	own, seed, replica, used, idle := newFakeBroker(t), newFakeBroker(t), newFakeBroker(t), newFakeBroker(t), newFakeBroker(t)
	dead := newFakeBroker(t)
	deadAddr := dead.addr()
	dead.close() // nothing listens there any more
	clk := testkit.NewClock(time.Unix(1_700_000_000, 0))
	c := dialT(t, own.addr(), WithSeeds(seed.addr()), WithClock(clk), WithHeartbeat(time.Hour))
	swept := make(chan struct{}, 16)
	c.pool.swept = func() { swept <- struct{}{} }

	c.rt.noteReplicas("q", "", &protocol.MetadataResult{Cluster: true,
		Partitions: []protocol.PartitionMeta{{Partition: 0, Owner: replica.addr(), Replicas: []string{replica.addr()}}}})
	c.rt.learn(deadAddr, idle.addr(), replica.addr(), used.addr())
	for _, a := range []string{seed.addr(), replica.addr(), used.addr(), idle.addr()} {
		if err := c.pool.get(a).openOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.subscribeAt(ctx, c.pool.get(used.addr()), "t", subscribeConfig{partition: -1}, nil); err != nil {
		t.Fatal(err)
	}
	deadEP := c.pool.get(deadAddr) // never connects
	idleEP := c.pool.get(idle.addr())

	for range endpointIdleRetire / endpointSweepEvery {
		awaitTimer(t, clk, endpointSweepEvery)
		clk.Advance(endpointSweepEvery)
		<-swept
	}
	c.pool.mu.Lock()
	var left []string
	for a := range c.pool.eps {
		left = append(left, a)
	}
	c.pool.mu.Unlock()
	slices.Sort(left)
	want := []string{own.addr(), seed.addr(), replica.addr(), used.addr()}
	slices.Sort(want)
	if !slices.Equal(left, want) {
		t.Fatalf("pool holds %v, want %v", left, want)
	}
	for _, e := range []*endpoint{deadEP, idleEP} {
		if !e.stopping() {
			t.Fatalf("retired endpoint %s still runs", e.addr)
		}
	}
	idle.await(ctx, "the retired connection closes", func(b *fakeBroker) bool { return len(b.conns) == 0 })
	nodes := c.rt.nodes()
	if slices.Contains(nodes, deadAddr) || !slices.Contains(nodes, idle.addr()) {
		t.Fatalf("nodes %v: want the dead node forgotten, the live idle one kept", nodes)
	}
	// A retired address is usable again: get makes a fresh endpoint.
	if err := c.pool.get(idle.addr()).openOnce(ctx); err != nil {
		t.Fatal(err)
	}
}

// The pool is bounded: past endpointsMax, unused endpoints idle for
// endpointEvictIdle are retired at once, oldest first.
func TestEndpointPoolIsBounded(t *testing.T) {
	ctx := testCtx(t)
	own := newFakeBroker(t)
	clk := testkit.NewClock(time.Unix(1_700_000_000, 0))
	c := dialT(t, own.addr(), WithSeeds(own.addr()), WithClock(clk), WithHeartbeat(time.Hour))
	swept := make(chan struct{}, 1)
	c.pool.swept = func() {
		select {
		case swept <- struct{}{}:
		default:
		}
	}
	for i := range endpointsMax + 20 {
		c.pool.get(fmt.Sprintf("192.0.2.1:%d", 1000+i)) // never dialled
	}
	clk.Advance(endpointEvictIdle)
	c.pool.get("192.0.2.1:999")
	for c.pool.size() > endpointsMax {
		select {
		case <-swept:
		case <-ctx.Done():
			t.Fatalf("pool holds %d endpoints, bound %d", c.pool.size(), endpointsMax)
		}
		if c.pool.size() > endpointsMax {
			c.pool.get("192.0.2.1:999") // ask for another sweep
		}
	}
	if c.pool.get(own.addr()) != c.ep {
		t.Fatal("the client's own endpoint was retired")
	}
}
