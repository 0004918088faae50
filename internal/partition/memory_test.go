package partition

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/budget"
	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/vfs"
)

// TestAckMemoryPackKeepsAnswers: packing a large ACK memory halves it or
// better and changes no answer; the next put unpacks it, and the bound and
// oldest-first forgetting hold afterwards.
func TestAckMemoryPackKeepsAnswers(t *testing.T) {
	a := newAckMemory()
	const n = 50_000
	for off := uint64(0); off < n; off++ {
		a.put(off*2, off*7+1) // gaps, as leases take offsets between messages
	}
	before := 16*len(a.slots) + 8*cap(a.order)
	a.pack()
	if a.packed == nil || a.slots != nil || a.order != nil {
		t.Fatal("not packed")
	}
	if after := 16 * cap(a.packed); after*2 > before {
		t.Fatalf("packed %d bytes, unpacked %d", after, before)
	}
	for _, off := range []uint64{0, 1, 2, 999, 1000, 2 * (n - 1), 2 * n} {
		want := off%2 == 0 && off/2 < n
		if got := a.by(off, (off/2)*7+1); got != want {
			t.Errorf("packed by(%d) = %v, want %v", off, got, want)
		}
		if a.by(off, 12345678) || a.by(off, 0) {
			t.Errorf("packed by(%d) matched a lease that did not ACK it", off)
		}
	}
	// Fill past the bound: the lowest offsets go first.
	for off := uint64(2 * n); off < 2*n+ackMemoryMax; off++ {
		a.put(off, 1)
	}
	if a.packed != nil || a.n != ackMemoryMax {
		t.Fatalf("after puts: packed %v, n %d", a.packed != nil, a.n)
	}
	if a.by(0, 1) || a.by(2*(n-1), (n-1)*7+1) {
		t.Error("the oldest offsets were not forgotten first")
	}
	if !a.by(2*n+ackMemoryMax-1, 1) {
		t.Error("the newest ACK is not remembered")
	}
}

// TestAckMemorySmallNotPacked: a small memory stays a table.
func TestAckMemorySmallNotPacked(t *testing.T) {
	a := newAckMemory()
	for off := range uint64(10) {
		a.put(off, off+1)
	}
	a.pack()
	if a.packed != nil || !a.by(3, 4) {
		t.Fatal("a small ACK memory was packed")
	}
}

// TestPartitionsShareBodyBudget: two partitions on one node budget. The
// budget never ends a publish above its limit, the partition that went
// quiet gave its bodies to the busy one, and closing both gives every
// byte back.
func TestPartitionsShareBodyBudget(t *testing.T) {
	fs := vfs.NewMem()
	bud := budget.New("body_cache", 64<<10)
	raft := budget.New("raft_cache", 1<<20)
	cfgA, cfgB := testConfig(fs), testConfig(fs)
	cfgB.Dir, cfgB.Index = "data/p1", 1
	for _, c := range []*Config{&cfgA, &cfgB} {
		c.BodyBudget, c.RaftBudget = bud, raft
	}
	a, b := mustOpen(t, cfgA), mustOpen(t, cfgB)
	body := strings.Repeat("x", 1000)
	for range 40 {
		mustPublish(t, a, body, nil)
	}
	for range 200 {
		mustPublish(t, b, body, nil)
		if u := bud.Used(); u > bud.Limit() {
			t.Fatalf("budget used %d above its limit %d", u, bud.Limit())
		}
	}
	if bud.Evicted() == 0 {
		t.Fatal("nothing was evicted from a full budget")
	}
	a.cache.mu.Lock()
	quiet := a.cache.bytes
	a.cache.mu.Unlock()
	if quiet != 0 {
		t.Fatalf("the quiet partition kept %d bytes of bodies", quiet)
	}
	for _, p := range []*Partition{a, b} {
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if bud.Used() != 0 || raft.Used() != 0 {
		t.Fatalf("after Close: body budget used %d, raft budget used %d", bud.Used(), raft.Used())
	}
}

// TestQuietPartitionShrinks: once a drained partition has been idle past
// its idle checkpoint, it packs its ACK memory and lets its record arena go,
// and an ACK sent again is still answered ok from the packed memory.
func TestQuietPartitionShrinks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := mustOpen(t, testConfig(vfs.NewMem()))
		defer p.Close()
		const n = 2 * ackPackThreshold
		for i := range n {
			publish(p, strconv.Itoa(i), nil)
		}
		c := &tconsumer{owner: "c1", credit: -1}
		if err := p.Attach(c); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		got := c.deliveries()
		if len(got) != n {
			t.Fatalf("%d deliveries, want %d", len(got), n)
		}
		for _, d := range got {
			if err := settle(p, Ack, d, 0); err != nil {
				t.Fatal(err)
			}
		}
		if err := settle(p, Ack, got[0], 0); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * idleCheckpointMs * time.Millisecond)
		synctest.Wait()
		// An ACK sent again: answered from the packed memory.
		if err := settle(p, Ack, got[7], 0); err != nil {
			t.Fatalf("repeated ACK after the partition went quiet: %v, want ok", err)
		}
		if err := settle(p, Ack, Delivery{Offset: got[7].Offset, LeaseID: got[7].LeaseID + 1}, 0); !errors.Is(err, queue.ErrAlreadySettled) {
			t.Fatalf("ACK of another lease: %v, want ErrAlreadySettled", err)
		}
		if p.decider.acked.packed == nil || p.decider.acked.slots != nil {
			t.Fatal("the ACK memory of a quiet partition is not packed")
		}
		if cap(p.decider.arena) > arenaKeepBytes {
			t.Fatalf("a quiet partition keeps a %d-byte arena", cap(p.decider.arena))
		}
	})
}
