package broker

import (
	"context"
	"strconv"
	"testing"
	"testing/synctest"

	"github.com/sinewmq/sinew/internal/dedup"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

func idem(topic, body, producer string, seq uint64) *protocol.Publish {
	p := msg(topic, body)
	p.ProducerID, p.ProducerSeq = producer, seq
	return p
}

// TestIdempotentPublishAcrossRestart: keyless idempotent publishes are
// placed by (producer, sequence), spread over the partitions, and a resend
// (before and after a restart) gets the original partition and offset with
// Duplicate set, and stores nothing.
func TestIdempotentPublishAcrossRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		b := mustOpen(t, testConfig(fs))
		b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "t", Partitions: 4, MaxRetries: -1})
		const n = 40
		first := make([]protocol.PublishOK, n)
		used := map[uint32]bool{}
		for i := range n {
			first[i] = mustPublish(t, b, idem("t", strconv.Itoa(i), "prod", uint64(i+1)))
			if first[i].Duplicate {
				t.Fatalf("first publish of %d answered as a duplicate", i+1)
			}
			if want := uint32(producerPartition("prod", uint64(i+1), 4)); first[i].Partition != want {
				t.Fatalf("seq %d went to partition %d, want %d", i+1, first[i].Partition, want)
			}
			used[first[i].Partition] = true
		}
		if len(used) < 2 {
			t.Fatalf("40 sequences all went to partition(s) %v", used)
		}
		check := func(when string, b *Broker) {
			for i := range n {
				got := mustPublish(t, b, idem("t", "resent", "prod", uint64(i+1)))
				if !got.Duplicate || got.Partition != first[i].Partition || got.Offset != first[i].Offset {
					t.Fatalf("%s: resend of %d = %+v, want %+v duplicate", when, i+1, got, first[i])
				}
			}
			// The partitions publish their stats after the turn that
			// answered: wait for every turn to end before reading them.
			synctest.Wait()
			total, dups := 0, uint64(0)
			for _, q := range b.Stats().Queues {
				for _, p := range q.Partitions {
					total += p.Ready
					dups += p.Duplicates
				}
			}
			if total != n || dups != n {
				t.Fatalf("%s: %d messages ready and %d duplicates counted, want %d and %d", when, total, dups, n, n)
			}
		}
		check("live", b)
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		b = mustOpen(t, testConfig(fs))
		defer b.Close()
		check("after restart", b)

		long := idem("t", "x", string(make([]byte, dedup.ProducerIDBytesMax+1)), 1)
		if _, err := publish(t, b, long); protocol.CodeOf(err) != protocol.CodeBadRequest {
			t.Fatalf("oversized producer id: %v, want bad_request", err)
		}
	})
}

// TestSequenceBelowWindowIsRefused: a resend of a sequence that left the
// producer's window is refused with sequence_too_old, never stored again.
func TestSequenceBelowWindowIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(vfs.NewMem())
		cfg.Dedup = dedup.Config{WindowSeqs: 2}
		b := mustOpen(t, cfg)
		defer b.Close()
		for seq := uint64(1); seq <= 3; seq++ {
			mustPublish(t, b, idem("w", "m", "prod", seq))
		}
		_, err := publish(t, b, idem("w", "m again", "prod", 1))
		if protocol.CodeOf(err) != protocol.CodeSequenceTooOld || protocol.CodeOf(err).Retryable() {
			t.Fatalf("resend below the window: %v, want a non-retryable sequence_too_old", err)
		}
		if got := mustPublish(t, b, idem("w", "m again", "prod", 2)); !got.Duplicate {
			t.Fatalf("resend inside the window: %+v, want duplicate", got)
		}
		if ready := b.Stats().Queues[0].Partitions[0].Ready; ready != 3 {
			t.Fatalf("%d messages stored, want 3", ready)
		}
	})
}
