package broker

import (
	"testing"
	"testing/synctest"

	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// TestStableSubscriptionAdoptsAcrossRestart: a subscription with an owner
// prefix and an id records its leases under "<prefix>/<id>"; after a
// restart (Close without releasing them) the same identity with Adopt takes
// them back, delivered again with the same lease and counted against the
// prefetch, and its ACKs are ok. Fresh ids stay at or above ReserveSubIDs,
// and an id in use is refused.
func TestStableSubscriptionAdoptsAcrossRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		cfg := testConfig(fs)
		cfg.RecoveredLeaseGraceMs = 60_000
		b := mustOpen(t, cfg)
		for _, body := range []string{"a", "b", "c"} {
			mustPublish(t, b, msg("st", body))
		}
		r1 := &rec{}
		opts := SubscribeOptions{ID: 41, OwnerPrefix: "own/c-1"}
		s1, err := b.SubscribeWith(&protocol.Subscribe{Topic: "st", Partition: -1, Prefetch: 2}, r1, opts)
		if err != nil {
			t.Fatal(err)
		}
		if s1.ID() != 41 || s1.owner != "own/c-1/41" {
			t.Fatalf("id %d owner %q, want 41 and own/c-1/41", s1.ID(), s1.owner)
		}
		synctest.Wait()
		before := r1.deliveries()
		if len(before) != 2 {
			t.Fatalf("%d deliveries before the restart, want 2", len(before))
		}
		if err := b.Close(); err != nil { // the leases stay in the log
			t.Fatal(err)
		}

		b = mustOpen(t, cfg)
		defer b.Close()
		b.ReserveSubIDs(100)
		r2 := &rec{}
		opts.Adopt = true
		s2, err := b.SubscribeWith(&protocol.Subscribe{Topic: "st", Partition: -1, Prefetch: 2}, r2, opts)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		got := r2.deliveries()
		if s2.Adopted() != 2 || len(got) != 2 {
			t.Fatalf("adopted %d, delivered %d; want 2 and 2 (prefetch full: c waits)", s2.Adopted(), len(got))
		}
		for i := range got {
			if got[i].Offset != before[i].Offset || got[i].LeaseID != before[i].LeaseID || got[i].Attempt != 1 {
				t.Fatalf("adopted %+v, want the lease of %+v", got[i], before[i])
			}
		}
		if code := r2.settle(s2, protocol.OpAck, got[0]); code != protocol.CodeOK {
			t.Fatalf("ack of an adopted lease: %v", code)
		}
		synctest.Wait()
		if ds := r2.deliveries(); len(ds) != 3 || string(ds[2].Body) != "c" {
			t.Fatalf("after one ack: %d deliveries, want c next", len(ds))
		}

		if _, err := b.SubscribeWith(&protocol.Subscribe{Topic: "st", Partition: -1}, &rec{}, SubscribeOptions{ID: 41}); protocol.CodeOf(err) != protocol.CodeBadRequest {
			t.Fatalf("second subscription with id 41: %v, want bad_request", err)
		}
		s3, err := b.Subscribe(&protocol.Subscribe{Topic: "st", Partition: -1}, &rec{})
		if err != nil {
			t.Fatal(err)
		}
		if s3.ID() < 100 {
			t.Fatalf("fresh id %d below the reserved 100", s3.ID())
		}
		s3.Close()
	})
}
