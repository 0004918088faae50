package queue

import (
	"testing"
)

// apply is the benchmarks' stand-in for the partition: it gives events
// consecutive LSNs and applies them without the codec.
func applyAll(tb testing.TB, s *State, evs []Event) {
	for _, ev := range evs {
		if err := s.Apply(s.NextLSN(), ev); err != nil {
			tb.Fatal(err)
		}
	}
}

// BenchmarkEnqueueLeaseAck measures the hot path of one message through a
// queue holding a standing backlog: enqueue, lease, ack, each command
// followed by the Apply of its event.
func BenchmarkEnqueueLeaseAck(b *testing.B) {
	const backlog = 10_000
	s := New(Config{})
	m := &Message{Body: []byte("payload"), PublishedAtMs: 1}
	evs := make([]Event, 0, 4)
	for range backlog {
		evs, _ = s.Enqueue(evs[:0], m, 1)
		applyAll(b, s, evs)
	}
	b.ReportAllocs()
	for b.Loop() {
		evs, _ = s.Enqueue(evs[:0], m, 1)
		applyAll(b, s, evs)
		evs = s.Lease(evs[:0], "consumer", 1, 1)
		applyAll(b, s, evs)
		off, lease := evs[0].Offset, evs[0].LeaseID
		evs, _ = s.Ack(evs[:0], off, lease)
		applyAll(b, s, evs)
	}
}

// build1M returns a queue with one million unsettled messages in a realistic
// mix: mostly ready, some delayed with TTLs, a slice inflight across a few
// consumers, a few dead-lettering, with settled gaps between them.
func build1M(tb testing.TB) *State {
	const n = 1_000_000
	s := New(Config{DeadLetter: DeadLetterPolicy{Target: "dlq"}})
	var evs []Event
	for i := range n {
		m := &Message{PublishedAtMs: 1}
		if i%10 == 1 {
			m.NotBeforeMs = 1_000_000 + int64(i)
			m.ExpiresAtMs = 2_000_000 + int64(i)
		}
		evs, _ = s.Enqueue(evs[:0], m, 1)
		applyAll(tb, s, evs)
	}
	owners := []string{"c1", "c2", "c3", "c4"}
	for i := range 150_000 {
		evs = s.Lease(evs[:0], owners[i%len(owners)], 1, 2)
		applyAll(tb, s, evs)
		if i%30 == 0 {
			evs, _ = s.Fail(evs[:0], evs[0].Offset, evs[0].LeaseID, 2)
			applyAll(tb, s, evs)
		}
	}
	return s
}

// BenchmarkRestore1M measures rebuilding a queue of one million unsettled
// messages from its snapshot.
func BenchmarkRestore1M(b *testing.B) {
	snap := build1M(b).Snapshot(nil)
	b.SetBytes(int64(len(snap)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Restore(Config{}, snap); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSnapshot1M measures checkpointing the same queue.
func BenchmarkSnapshot1M(b *testing.B) {
	s := build1M(b)
	buf := s.Snapshot(nil)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		buf = s.Snapshot(buf[:0])
	}
}
