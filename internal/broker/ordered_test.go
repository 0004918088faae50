package broker

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

func linked(topic, body, producer string, seq, prev uint64) *protocol.Publish {
	p := idem(topic, body, producer, seq)
	p.ProducerPrev = prev
	return p
}

// TestOrderedPublishRefusesGap: a publish whose producer_prev the partition
// does not hold is refused with out_of_sequence and stores nothing; once the
// predecessor is stored it is accepted; a duplicate gets the duplicate answer
// whatever its link says; after a restart the table, rebuilt from the log,
// still holds what was stored.
func TestOrderedPublishRefusesGap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		b := mustOpen(t, testConfig(fs))
		ctx := context.Background()
		if _, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: "t", Partitions: 4, MaxRetries: -1}); err != nil {
			t.Fatal(err)
		}
		keyed := func(seq, prev uint64, body string) *protocol.Publish {
			p := linked("t", body, "p", seq, prev)
			p.Key = []byte("account-7")
			return p
		}
		refused := func(p *protocol.Publish) {
			t.Helper()
			_, err := publish(t, b, p)
			if protocol.CodeOf(err) != protocol.CodeOutOfSequence || !protocol.CodeOf(err).Retryable() {
				t.Fatalf("seq %d after %d: %v, want a retryable out_of_sequence", p.ProducerSeq, p.ProducerPrev, err)
			}
		}
		a := mustPublish(t, b, keyed(1, 0, "a"))
		refused(keyed(3, 2, "c")) // 2 has not arrived: a gap
		bOK := mustPublish(t, b, keyed(2, 1, "b"))
		cOK := mustPublish(t, b, keyed(3, 2, "c"))
		if bOK.Partition != a.Partition || cOK.Partition != a.Partition || !(a.Offset < bOK.Offset && bOK.Offset < cOK.Offset) {
			t.Fatalf("a %+v b %+v c %+v: not in order in one partition", a, bOK, cOK)
		}
		if dup := mustPublish(t, b, keyed(2, 1, "b")); !dup.Duplicate || dup.Offset != bOK.Offset {
			t.Fatalf("resend of 2 = %+v, want the duplicate of %+v", dup, bOK)
		}
		// An unknown producer: a first publish (no link) is stored; a
		// link to something it never stored is refused.
		mustPublish(t, b, linked("t", "x", "fresh", 9, 0))
		stranger := linked("t", "y", "stranger", 5, 4)
		stranger.Key = []byte("account-7")
		refused(stranger)
		// An explicit partition is its own lane.
		p0 := func(seq, prev uint64) *protocol.Publish {
			p := linked("t", "z", "p", seq, prev)
			p.Partition = 0
			return p
		}
		refused(p0(11, 10))
		mustPublish(t, b, p0(10, 0))
		mustPublish(t, b, p0(11, 10))
		// A keyless link to a sequence the hash places in another
		// partition asks nothing of this one.
		var seq, prev uint64 = 100, 99
		for producerPartition("p", seq, 4) == producerPartition("p", prev, 4) {
			seq++
		}
		mustPublish(t, b, linked("t", "k", "p", seq, prev))
		for _, bad := range []*protocol.Publish{linked("t", "e", "p", 5, 5), linked("t", "e", "p", 5, 6), linked("t", "e", "", 0, 1)} {
			if _, err := publish(t, b, bad); protocol.CodeOf(err) != protocol.CodeBadRequest {
				t.Fatalf("seq %d prev %d id %q: %v, want bad_request", bad.ProducerSeq, bad.ProducerPrev, bad.ProducerID, err)
			}
		}
		// Refusals stored nothing: a, b, c, x, z10, z11 and the keyless one.
		synctest.Wait()
		total := 0
		for _, q := range b.Stats().Queues {
			for _, p := range q.Partitions {
				total += p.Ready
			}
		}
		if total != 7 {
			t.Fatalf("%d messages stored, want 7", total)
		}
		b.Close()

		b = mustOpen(t, testConfig(fs))
		defer b.Close()
		d := mustPublish(t, b, keyed(4, 3, "d"))
		if d.Duplicate || d.Partition != a.Partition || d.Offset <= cOK.Offset {
			t.Fatalf("after a restart, 4 after 3 = %+v", d)
		}
	})
}
