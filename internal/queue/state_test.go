package queue

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash/crc32"
	"math"
	"testing"
)

// mustApply appends evs to h and fails the test on any error.
func mustApply(t testing.TB, h *harness, evs []Event) []uint64 {
	t.Helper()
	lsns, err := h.apply(evs)
	if err != nil {
		t.Fatal(err)
	}
	return lsns
}

func enqueueN(t testing.TB, h *harness, n int, now int64) {
	t.Helper()
	var evs []Event
	for range n {
		var err error
		if evs, err = h.s.Enqueue(evs, &Message{Body: []byte("x")}, now); err != nil {
			t.Fatal(err)
		}
	}
	mustApply(t, h, evs)
}

func TestEnqueueValidatesAndDefaults(t *testing.T) {
	s := New(Config{DefaultTTLMs: 1000})
	for _, m := range []*Message{nil, {NotBeforeMs: -1}, {ExpiresAtMs: -1}, {PublishedAtMs: -5}} {
		if _, err := s.Enqueue(nil, m, 10); !errors.Is(err, ErrInvalidMessage) {
			t.Fatalf("enqueue %+v: err %v", m, err)
		}
	}
	m := &Message{Body: []byte("b")}
	evs, err := s.Enqueue(nil, m, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := evs[0].Msg; got.PublishedAtMs != 10 || got.ExpiresAtMs != 1010 || got == m {
		t.Fatalf("defaults: %+v (same pointer: %v)", got, got == m)
	}
	if m.PublishedAtMs != 0 || m.ExpiresAtMs != 0 {
		t.Fatalf("caller's message modified: %+v", m)
	}
	full := &Message{PublishedAtMs: 5, ExpiresAtMs: 50}
	if evs, _ := s.Enqueue(nil, full, 10); evs[0].Msg != full {
		t.Fatal("message copied although no default applied")
	}
}

// TestApplyRejectsContradictions: events that do not fit the state are
// refused with ErrCorrupt and change nothing.
// A message's new lease must not reuse its last one: a late settle of the
// ended lease would otherwise settle the new one.
func TestApplyRejectsALeaseThatReusesTheLastOne(t *testing.T) {
	h := &harness{s: New(Config{}), nextLSN: 1}
	enqueueN(t, h, 1, 0)
	evs := h.s.Lease(nil, "a", 1, 0)
	mustApply(t, h, evs)
	rel, err := h.s.Release(nil, 1, evs[0].LeaseID, 0)
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, h, rel)
	before := dump(h.s, 0)
	err = h.s.Apply(h.s.NextLSN(), Event{Kind: KindLease, Offset: 1, LeaseID: evs[0].LeaseID, Attempt: 2})
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("err %v", err)
	}
	if after := dump(h.s, 0); after != before {
		t.Fatalf("changed the state:\n%s\nwas:\n%s", after, before)
	}
}

// With a source, lease ids are drawn from it, skipping 0 and the message's
// last lease, and every id is applied as drawn, in any order.
func TestLeaseIDsFromTheSource(t *testing.T) {
	h := &harness{s: New(Config{}), nextLSN: 1}
	enqueueN(t, h, 3, 0)
	draws := []uint64{0, 900, 7, 7, 5}
	h.s.SetLeaseIDs(func() uint64 { id := draws[0]; draws = draws[1:]; return id })
	evs := h.s.Lease(nil, "a", 2, 0)
	if len(evs) != 2 || evs[0].LeaseID != 900 || evs[1].LeaseID != 7 {
		t.Fatalf("leases %+v", evs)
	}
	mustApply(t, h, evs)
	rel, err := h.s.Release(nil, evs[1].Offset, 7, 0)
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, h, rel)
	// Offset 2's last lease was 7: the next draw of 7 is skipped.
	again := h.s.Lease(nil, "b", 1, 0)
	if len(again) != 1 || again[0].Offset != 2 || again[0].LeaseID != 5 {
		t.Fatalf("lease %+v", again)
	}
	mustApply(t, h, again)
	if _, err := h.s.Ack(nil, 2, 7); !errors.Is(err, ErrStaleLease) {
		t.Fatalf("ack of the ended lease: %v", err)
	}
	if _, err := h.s.Ack(nil, 2, 5); err != nil {
		t.Fatalf("ack of the current lease: %v", err)
	}
}

func TestApplyRejectsContradictions(t *testing.T) {
	h := &harness{s: New(Config{}), nextLSN: 1}
	enqueueN(t, h, 3, 0)
	mustApply(t, h, h.s.Lease(nil, "a", 1, 0)) // offset 1, lease 1, lsn 4
	before := dump(h.s, 0)
	next := h.s.NextLSN()
	for _, c := range []struct {
		name string
		lsn  uint64
		ev   Event
	}{
		{"enqueue without message", next, Event{Kind: KindEnqueue}},
		{"lsn out of range", math.MaxUint64, Event{Kind: KindAck, Offset: 1, LeaseID: 1}},
		{"unknown kind", next, Event{Kind: 99, Offset: 2}},
		{"event on settled lsn", next, Event{Kind: KindAck, Offset: 4, LeaseID: 1}},
		{"event on future offset", next, Event{Kind: KindAck, Offset: 100, LeaseID: 1}},
		{"lease of inflight", next, Event{Kind: KindLease, Offset: 1, LeaseID: 2, Attempt: 2}},
		{"lease id zero", next, Event{Kind: KindLease, Offset: 2, LeaseID: 0, Attempt: 1}},
		{"lease skips an attempt", next, Event{Kind: KindLease, Offset: 2, LeaseID: 2, Attempt: 2}},
		{"ack with other lease", next, Event{Kind: KindAck, Offset: 1, LeaseID: 2}},
		{"ack of ready", next, Event{Kind: KindAck, Offset: 2, LeaseID: 0}},
		{"requeue of ready", next, Event{Kind: KindRequeue, Offset: 2, Reason: ReasonNack}},
		{"dead letter of inflight without lease", next, Event{Kind: KindDeadLetter, Offset: 1, Reason: ReasonExpired}},
		{"dead letter of ready with lease", next, Event{Kind: KindDeadLetter, Offset: 2, LeaseID: 1, Reason: ReasonFailed}},
		{"done of ready", next, Event{Kind: KindDeadLetterDone, Offset: 2}},
	} {
		if err := h.s.Apply(c.lsn, c.ev); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("%s: err %v", c.name, err)
		}
		if after := dump(h.s, 0); after != before {
			t.Fatalf("%s changed the state:\n%s\nwas:\n%s", c.name, after, before)
		}
	}
	// Replaying an applied LSN is a no-op, even with a different event.
	if err := h.s.Apply(2, Event{Kind: KindAck, Offset: 77}); err != nil {
		t.Fatal(err)
	}
	if err := replay(h.s, h.log); err != nil {
		t.Fatal(err)
	}
	if after := dump(h.s, 0); after != before {
		t.Fatalf("replay of applied LSNs changed the state:\n%s\nwas:\n%s", after, before)
	}
}

// TestLimits: a Lease hands out at most LeaseBatchMax and a Tick returns at
// most TickEventsMax; the rest stays due and NextDeadlineMs says so.
func TestLimits(t *testing.T) {
	const n = TickEventsMax + 100
	h := &harness{s: New(Config{LeaseMs: 10})}
	enqueueN(t, h, n, 0)
	leased := 0
	for leased < n {
		evs := h.s.Lease(nil, "a", n, 0)
		if len(evs) == 0 || len(evs) > LeaseBatchMax {
			t.Fatalf("lease returned %d events", len(evs))
		}
		leased += len(evs)
		mustApply(t, h, evs)
	}
	evs := h.s.Tick(nil, 10)
	if len(evs) != TickEventsMax {
		t.Fatalf("tick returned %d events, want %d", len(evs), TickEventsMax)
	}
	mustApply(t, h, evs)
	if at, ok := h.s.NextDeadlineMs(); !ok || at > 10 {
		t.Fatalf("next deadline %d,%v after a capped tick", at, ok)
	}
	if evs := h.s.Tick(nil, 10); len(evs) != n-TickEventsMax {
		t.Fatalf("second tick returned %d events, want %d", len(evs), n-TickEventsMax)
	}
}

// TestMemoryFollowsUnsettled: one message stuck at the bottom while many
// pass through must not make the indexes grow with the traffic.
func TestMemoryFollowsUnsettled(t *testing.T) {
	h := &harness{s: New(Config{LeaseMs: 1_000_000})}
	enqueueN(t, h, 1, 0)
	mustApply(t, h, h.s.Lease(nil, "stuck", 1, 0))
	for i := range 20_000 {
		enqueueN(t, h, 1, int64(i))
		evs := h.s.Lease(nil, "a", 1, int64(i))
		mustApply(t, h, evs)
		// Nack once, then ack: leaves garbage in the lease and ready indexes.
		rq, err := h.s.Nack(nil, evs[0].Offset, evs[0].LeaseID, 0, int64(i))
		if err != nil {
			t.Fatal(err)
		}
		mustApply(t, h, rq)
		evs = h.s.Lease(nil, "a", 1, int64(i))
		mustApply(t, h, evs)
		ack, err := h.s.Ack(nil, evs[0].Offset, evs[0].LeaseID)
		if err != nil {
			t.Fatal(err)
		}
		mustApply(t, h, ack)
	}
	s := h.s
	if s.nLive != 1 || s.Frontier() != 0 {
		t.Fatalf("unsettled %d, frontier %d", s.nLive, s.Frontier())
	}
	limit := 2 + 2*garbageSlack
	for name, n := range map[string]int{
		"chunks": len(s.bits.chunks), "ready": s.ready.len(), "leases": s.leases.len(),
		"delayed": s.delayed.len(), "ttl": s.ttl.len(), "slab": len(s.slab),
	} {
		if n > limit {
			t.Errorf("%s holds %d items for 1 unsettled message", name, n)
		}
	}
	if st := s.Stats(0); st.SettledRanges != 1 {
		t.Fatalf("settled ranges %d, want 1", st.SettledRanges)
	}
}

func TestRestoreRejects(t *testing.T) {
	h := &harness{s: New(Config{DeadLetter: DeadLetterPolicy{Target: "dlq"}})}
	enqueueN(t, h, 4, 0)
	evs := h.s.Lease(nil, "a", 2, 0)
	mustApply(t, h, evs)
	dl, _ := h.s.Fail(nil, evs[0].Offset, evs[0].LeaseID, 0)
	mustApply(t, h, dl)
	snap := h.s.Snapshot(nil)
	if _, err := Restore(Config{}, snap); err != nil {
		t.Fatal(err)
	}
	for n := range len(snap) {
		if _, err := Restore(Config{}, snap[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d: err %v", n, err)
		}
	}
	for i := range snap {
		bad := append([]byte{}, snap...)
		bad[i] ^= 0x10
		if _, err := Restore(Config{}, bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("bit flip at %d: err %v", i, err)
		}
	}
}

// withCRC recomputes the snapshot checksum so fuzzed bodies reach the
// field checks instead of stopping at the checksum.
func withCRC(b []byte) []byte {
	if len(b) < 4 {
		return b
	}
	body := b[:len(b)-4]
	return binary.LittleEndian.AppendUint32(append([]byte{}, body...), crc32.Checksum(body, castagnoli))
}

// FuzzRestore: no input panics; whatever restores snapshots to itself, and
// commands on it produce events that apply cleanly.
func FuzzRestore(f *testing.F) {
	h := &harness{s: New(Config{LeaseMs: 100, DeadLetter: DeadLetterPolicy{Target: "dlq"}})}
	f.Add(h.s.Snapshot(nil))
	if v1, err := hex.DecodeString(snapshotV1Hex); err == nil {
		f.Add(v1)
	}
	enqueueN(f, h, 5, 0)
	mustApply(f, h, h.s.Lease(nil, "a", 3, 0))
	mustApply(f, h, h.s.Tick(nil, 100))
	mustApply(f, h, h.s.Lease(nil, "b", 1, 100))
	m := &Message{NotBeforeMs: 500, ExpiresAtMs: 700}
	evs, _ := h.s.Enqueue(nil, m, 100)
	mustApply(f, h, evs)
	f.Add(h.s.Snapshot(nil))
	enqueueN(f, h, 300, 100) // plain runs across a chunk boundary
	mustApply(f, h, h.s.Lease(nil, "c", 2, 100))
	f.Add(h.s.Snapshot(nil))
	// Keep restores of claimed backlogs small enough to fuzz quickly.
	defer func(n uint64) { restorePlainMax = n }(restorePlainMax)
	restorePlainMax = 1 << 16
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, in := range [][]byte{b, withCRC(b)} {
			s, err := Restore(Config{LeaseMs: 100}, in)
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("untyped error %v", err)
				}
				continue
			}
			now := int64(1000)
			want := dump(s, now)
			r, err := Restore(Config{}, s.Snapshot(nil))
			if err != nil {
				t.Fatalf("own snapshot does not restore: %v", err)
			}
			if got := dump(r, now); got != want {
				t.Fatalf("snapshot round trip:\n%s\nwant:\n%s", got, want)
			}
			if s.NextLSN() > math.MaxUint64-1<<20 {
				continue // no room left in the LSN space for the commands below
			}
			h := &harness{s: s, nextLSN: s.NextLSN()}
			mustApply(t, h, s.Tick(nil, now))
			mustApply(t, h, s.Lease(nil, "z", 10, now))
			for _, in := range s.PendingDeadLetters() {
				evs, err := s.DeadLettered(nil, in.Offset, now)
				if err != nil {
					t.Fatal(err)
				}
				mustApply(t, h, evs)
			}
			s.Inflight("a")
			s.NextDeadlineMs()
		}
	})
}
