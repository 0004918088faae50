package broker

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// TestRestartReleasesDoNotUseRetries: leases outstanding when the broker
// stops are released after the restart (their holders' sessions are gone).
// Like any release, that is not a failed delivery: with max_retries 1 a
// message survives five restarts while leased, and its attempt shows each
// delivery. A NACK still counts.
func TestRestartReleasesDoNotUseRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		b := mustOpen(t, testConfig(fs))
		defer func() { b.Close() }() // whichever broker is open last
		if _, err := b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "q", MaxRetries: 1}); err != nil {
			t.Fatal(err)
		}
		off := mustPublish(t, b, msg("q", "x")).Offset
		deliver := func(b *Broker) (*rec, *Subscription, Delivery) {
			t.Helper()
			r := &rec{}
			s, err := b.Subscribe(&protocol.Subscribe{Topic: "q", Partition: -1, Prefetch: 1}, r)
			if err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			got := r.deliveries()
			if len(got) != 1 || got[0].Offset != off {
				t.Fatalf("deliveries %+v, want offset %d", got, off)
			}
			return r, s, got[0]
		}
		for want := uint32(1); want <= 5; want++ {
			_, _, d := deliver(b)
			if d.Attempt != want {
				t.Fatalf("delivery %d has attempt %d", want, d.Attempt)
			}
			b.Close() // the lease stays in the log, released at the next Open
			b = mustOpen(t, testConfig(fs))
		}
		// One NACK is within max_retries 1; the second failed delivery
		// dead-letters.
		r, s, d := deliver(b)
		if d.Attempt != 6 {
			t.Fatalf("attempt %d after five restarts, want 6", d.Attempt)
		}
		if code := r.settle(s, protocol.OpNack, d); code != protocol.CodeOK {
			t.Fatal(code)
		}
		synctest.Wait()
		got := r.deliveries()
		if len(got) != 2 || got[1].Attempt != 7 {
			t.Fatalf("after one NACK: %+v, want a redelivery at attempt 7", got)
		}
		if code := r.settle(s, protocol.OpNack, got[1]); code != protocol.CodeOK {
			t.Fatal(code)
		}
		synctest.Wait()
		for _, q := range b.Stats().Queues {
			n := 0
			for _, p := range q.Partitions {
				n += p.Ready + p.Delayed + p.Inflight
			}
			switch {
			case q.Topic == "q" && n != 0:
				t.Errorf("q still holds %d after its retries ran out", n)
			case q.Topic == DeadLetterTopicDefault && n != 1:
				t.Errorf("dead-letter queue holds %d, want 1", n)
			}
		}
	})
}
