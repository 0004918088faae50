package broker

import (
	"context"
	"math/rand/v2"
	"testing"
	"testing/synctest"

	"github.com/sinewmq/sinew/protocol"
)

// An ACK applied through the node journal whose answer was lost in a crash
// is answered ok when the client repeats it (by lease, as the SDK does)
// after a second crash: the broker came back once in between without the
// client, long enough for its partitions to checkpoint, and the ACK must
// not be forgotten with the records that checkpoint covers. The leases
// still held are adopted, and one that did not ACK the message is refused.
func TestRepeatedAckOkAfterTwoRestarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(7, 7))
		fs := walFS(t)
		cfg := walConfig(fs)
		cfg.RecoveredLeaseGraceMs = 60_000
		b := mustOpen(t, cfg)
		for _, body := range []string{"a", "b", "c"} {
			mustPublish(t, b, msg("st", body))
		}
		opts := SubscribeOptions{ID: 41, OwnerPrefix: "own/c-1"}
		r1 := &rec{}
		s1, err := b.SubscribeWith(&protocol.Subscribe{Topic: "st", Partition: -1, Prefetch: 2}, r1, opts)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		ds := r1.deliveries()
		if len(ds) != 2 {
			t.Fatalf("%d deliveries, want 2", len(ds))
		}
		if code := r1.settle(s1, protocol.OpAck, ds[0]); code != protocol.CodeOK {
			t.Fatalf("ack: %v", code)
		}
		for range 2 {
			crashed := fs.Crash(rng, true)
			b.Close()
			fs = crashed
			cfg.FS = fs
			b = mustOpen(t, cfg)
			synctest.Wait() // the partitions' first turns and checkpoints
		}
		defer b.Close()
		opts.Adopt = true
		r2 := &rec{}
		s2, err := b.SubscribeWith(&protocol.Subscribe{Topic: "st", Partition: -1, Prefetch: 2}, r2, opts)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if s2.Adopted() != 2 {
			t.Fatalf("adopted %d leases, want 2 (b, and c leased after the ACK of a)", s2.Adopted())
		}
		d := ds[0]
		if cur, err := s2.LeaseCurrent(context.Background(), d.Partition, d.Offset, d.LeaseID); err != nil || !cur {
			t.Fatalf("the lease that ACKed offset %d is not current after two restarts (%v, %v)", d.Offset, cur, err)
		}
		if code := r2.settle(s2, protocol.OpAck, d); code != protocol.CodeOK {
			t.Fatalf("the repeated ACK after two restarts: %v, want ok", code)
		}
		other := d
		other.LeaseID ^= 1
		if code := r2.settle(s2, protocol.OpAck, other); code != protocol.CodeStaleLease {
			t.Fatalf("an ACK by a lease that did not ACK the message: %v, want stale_lease", code)
		}
	})
}
