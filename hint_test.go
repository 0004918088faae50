package sinew

import (
	"testing"
)

// Keyless publishes lean away from a backlogged partition: after the first
// (placed by its hash), each goes to the partition the broker hinted in the
// answer to the one before, the less loaded of two, so a partition holding
// a backlog the others do not receives none of them.
func TestKeylessPublishesAvoidABackloggedPartition(t *testing.T) {
	ctx := testCtx(t)
	rb := startRealBroker(t, nil)
	c := dialT(t, rb.Addr)
	if _, err := c.DeclareQueue(ctx, "leaning", QueueConfig{Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	for range 200 {
		if _, err := c.Publish(ctx, "leaning", []byte("waiting"), WithPartition(1)); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]int, 4)
	for i := range 120 {
		res, err := c.Publish(ctx, "leaning", []byte("keyless"))
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			got[res.Partition]++
		}
	}
	t.Logf("keyless publishes after the first, per partition: %v", got)
	if got[1] != 0 {
		t.Fatalf("keyless publishes per partition %v: %d went to partition 1, which holds 200 waiting", got, got[1])
	}
	for _, p := range []int{0, 2, 3} {
		if got[p] == 0 {
			t.Fatalf("keyless publishes per partition %v: partition %d got none", got, p)
		}
	}
}

// A hint names a partition that may be gone: the queue deleted and
// declared again with fewer partitions answers not_found for it, and the
// Client sends the publish again without the hint (nothing was stored),
// so the application sees no error and the message is stored once.
func TestHintedPartitionGoneIsSentAgainUnhinted(t *testing.T) {
	ctx := testCtx(t)
	rb := startRealBroker(t, nil)
	c := dialT(t, rb.Addr)
	if _, err := c.DeclareQueue(ctx, "shrinks", QueueConfig{Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		if _, err := c.Publish(ctx, "shrinks", []byte("before")); err != nil {
			t.Fatal(err)
		}
		if h, ok := c.hints.take("shrinks", ""); ok && h >= 2 {
			break
		}
		if i == 100 {
			t.Fatal("no hint of partition 2 or 3 in 100 publishes to 4 partitions")
		}
	}
	if err := c.DeleteQueue(ctx, "shrinks", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeclareQueue(ctx, "shrinks", QueueConfig{Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	res, err := c.Publish(ctx, "shrinks", []byte("after"))
	if err != nil {
		t.Fatalf("publish after the queue shrank: %v", err)
	}
	if res.Partition > 1 {
		t.Fatalf("stored in partition %d of 2", res.Partition)
	}
	n, err := c.PurgeQueue(ctx, "shrinks", "")
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("the queue held %d messages, want 1", n)
	}
}

// A publish refused with not_found at its hinted partition goes again
// without a partition only when no send of it may have been stored: not
// after a send whose answer never came, and not once a hedge (which
// carries the hinted partition) sent it; a hedge still looking is barred
// from sending instead. Going again bars later hedges.
func TestUnhintOnlyWhenNothingMayBeStored(t *testing.T) {
	hinted := func() *flight {
		fl := &flight{f: &PublishFuture{done: make(chan struct{})}}
		fl.hinted.Store(true)
		return fl
	}
	if fl := (&flight{}); fl.unhint() {
		t.Fatal("a publish that was not hinted was unhinted")
	}
	fl := hinted()
	fl.uncertain.Store(true)
	if fl.unhint() {
		t.Fatal("unhinted after a send whose outcome is unknown")
	}
	fl = hinted()
	if !fl.startHedge() || !fl.claimHedgeSend() {
		t.Fatal("no hedge could start and send")
	}
	if fl.unhint() {
		t.Fatal("unhinted once a hedge with the hinted partition was sent")
	}
	// A hedge still looking for the owner has stored nothing: the
	// publish goes unhinted, and the hedge may no longer send.
	fl = hinted()
	if !fl.startHedge() {
		t.Fatal("no hedge could start")
	}
	if !fl.unhint() {
		t.Fatal("a hedge that sent nothing kept the publish on its stale hint")
	}
	if fl.claimHedgeSend() {
		t.Fatal("a hedge sent the hinted partition after the publish went without it")
	}
	fl = hinted()
	if !fl.unhint() {
		t.Fatal("a hinted publish refused at once was not unhinted")
	}
	if fl.startHedge() {
		t.Fatal("a hedge started after the publish went without its hint")
	}
	if fl.unhint() {
		t.Fatal("unhinted twice")
	}
}
