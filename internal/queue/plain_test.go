package queue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"runtime"
	"testing"
	"unsafe"
)

// TestPlainBacklogCostsBits: a backlog nobody consumes holds no entry and no
// index item, only bitmap chunks; the messages a consumer touches get
// entries, and once settled those go again.
func TestPlainBacklogCostsBits(t *testing.T) {
	const n = 100_000
	s := New(Config{LeaseMs: 1000})
	m := &Message{Body: []byte("x"), PublishedAtMs: 1}
	var evs []Event
	for i := range n {
		evs, _ = s.Enqueue(evs[:0], m, 1)
		applyAll(t, s, evs)
		if i%10 == 9 {
			// A no-op between enqueues (a raft leader's, say).
			if err := s.ApplyGap(s.NextLSN()); err != nil {
				t.Fatal(err)
			}
		}
	}
	lsns := n + n/10
	if len(s.slab) != 0 || s.nLive-s.nPlain != 0 || s.ready.len() != 0 || s.ttl.len() != 0 {
		t.Fatalf("plain backlog holds %d entries, %d index keys, %d ready items", len(s.slab), s.nLive-s.nPlain, s.ready.len())
	}
	if got, want := len(s.bits.chunks), lsns/chunkLSNs+1; got > want {
		t.Fatalf("%d chunks for %d LSNs, want at most %d", got, lsns, want)
	}
	if st := s.Stats(1); st.Ready != n || st.Frontier != 0 || st.SettledRanges != n/10 {
		t.Fatalf("stats %+v", st)
	}

	// A consumer takes 300 and acks them: entries while it holds them,
	// none after.
	evs = s.Lease(evs[:0], "c", 300, 2)
	applyAll(t, s, evs)
	if len(evs) != 300 || evs[0].Offset != 0 || evs[299].Offset != 328 {
		t.Fatalf("leased %d, first %d, last %d", len(evs), evs[0].Offset, evs[len(evs)-1].Offset)
	}
	if s.nLive-s.nPlain != 300 || len(s.Inflight("c")) != 300 {
		t.Fatalf("%d entries, %d inflight for 300 leases", s.nLive-s.nPlain, len(s.Inflight("c")))
	}
	leases := append([]Event(nil), evs...)
	for _, l := range leases {
		evs, _ = s.Ack(evs[:0], l.Offset, l.LeaseID)
		applyAll(t, s, evs)
	}
	if s.nLive-s.nPlain != 0 || len(s.slab) > garbageSlack || s.Frontier() != 330 {
		t.Fatalf("after acks: %d entries, slab %d, frontier %d", s.nLive-s.nPlain, len(s.slab), s.Frontier())
	}

	// The snapshot lists the backlog as runs, a few bytes each, and
	// restores to the same state.
	snap := s.Snapshot(nil)
	if per := float64(len(snap)) / float64(n); per > 3 {
		t.Fatalf("snapshot of %d plain messages is %d bytes", n, len(snap))
	}
	r, err := Restore(s.Config(), snap)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := dump(r, 2), dump(s, 2); got != want {
		t.Fatal("restored plain backlog differs")
	}
	if r.nLive-r.nPlain != 0 || r.nPlain != n-300 {
		t.Fatalf("restored: %d entries, %d plain", r.nLive-r.nPlain, r.nPlain)
	}
}

// TestTTLBacklogNeedsNoReadyIndex: messages that only have a TTL get an
// entry and a TTL item, but no ready item; they are leased in offset order
// with plain ones, and the expired ones among them are dead-lettered on
// the way.
func TestTTLBacklogNeedsNoReadyIndex(t *testing.T) {
	h := &harness{s: New(Config{LeaseMs: 1000})}
	var evs []Event
	for i := range 6 {
		m := &Message{Body: []byte("x"), PublishedAtMs: 1}
		if i%2 == 1 {
			m.ExpiresAtMs = 100 * int64(i) // 100, 300, 500
		}
		evs, _ = h.s.Enqueue(evs[:0], m, 1)
		mustApply(t, h, evs)
	}
	if h.s.ready.len() != 0 || h.s.ttl.len() != 3 || h.s.nFresh != 3 || h.s.nPlain != 3 {
		t.Fatalf("ready items %d, ttl items %d, fresh %d, plain %d", h.s.ready.len(), h.s.ttl.len(), h.s.nFresh, h.s.nPlain)
	}
	evs = h.s.Lease(evs[:0], "c", 3, 300)
	var got []string
	for _, ev := range evs {
		got = append(got, fmt.Sprintf("%v %d", ev.Kind, ev.Offset))
	}
	if want := "[lease 0 dead_letter 1 lease 2 dead_letter 3 lease 4]"; fmt.Sprint(got) != want {
		t.Fatalf("lease at 300: %v, want %s", got, want)
	}
	mustApply(t, h, evs)
	if h.s.nFresh != 1 || len(h.s.Inflight("c")) != 3 {
		t.Fatalf("fresh %d, inflight %v", h.s.nFresh, h.s.Inflight("c"))
	}
}

// TestSnapshotV4PlainEntriesRestoreAsPlain: a version 4 checkpoint lists
// every message as an entry; the plain ones restore as plain bits, the rest
// as entries, and nothing tells them apart.
func TestSnapshotV4PlainEntriesRestoreAsPlain(t *testing.T) {
	b := append([]byte(snapshotMagic), 4)
	b = append(b, 8, 1, 1, 1, 'a', 5) // next lsn 8, lease seq 1, strings ["a"], 5 entries
	for _, off := range []uint64{1, 1, 1} {
		b = append(b, byte(off), snapQueued, 0, 0, 0, 0, 0) // offsets 1, 2, 3: plain
	}
	b = append(b, 1, snapInflight, 1, 0, 0, 0, 1, 0, 0xd0, 0x0f) // 4: inflight, lease 1, owner a, deadline 1000
	b = append(b, 2, snapQueued, 0, 0, 0, 0, 0)                  // 6: plain
	b = append(b, 0)                                             // no moved bodies
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	s, err := Restore(Config{}, b)
	if err != nil {
		t.Fatal(err)
	}
	const want = `next-lsn=8 frontier=1 lease-seq=1 ready=4 delayed=0 inflight=1 dead-lettering=0 settled-ranges=3
next-deadline=1000
1: ready attempt=0
2: ready attempt=0
3: ready attempt=0
4: inflight attempt=1 lease=1 owner=a deadline=1000
6: ready attempt=0
`
	if got := dump(s, 0); got != want {
		t.Fatalf("v4 restore:\n%s\nwant:\n%s", got, want)
	}
	if s.nPlain != 4 || s.nLive-s.nPlain != 1 {
		t.Fatalf("%d plain, %d entries", s.nPlain, s.nLive-s.nPlain)
	}
	if evs := s.Lease(nil, "b", 5, 0); len(evs) != 4 || evs[0].Offset != 1 || evs[3].Offset != 6 {
		t.Fatalf("lease after v4 restore: %v", evs)
	}
	r, err := Restore(Config{}, s.Snapshot(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := dump(r, 0); got != want {
		t.Fatalf("v5 round trip:\n%s\nwant:\n%s", got, want)
	}
}

// TestRestoreRejectsBadRuns: plain runs that overlap an entry or each
// other, run past NextLSN or are empty are corrupt.
func TestRestoreRejectsBadRuns(t *testing.T) {
	build := func(runs ...byte) []byte {
		b := append([]byte(snapshotMagic), snapshotVersion)
		b = append(b, 10, 0, 0, 1)                  // next lsn 10, no leases, no strings, one entry
		b = append(b, 4, snapQueued, 0, 0, 2, 0, 0) // 4: delayed until 1
		b = append(b, runs...)
		b = append(b, 0)       // no moved bodies
		b = append(b, 0, 0, 0) // gate open at epoch 0
		return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
	}
	if s, err := Restore(Config{}, build(2, 1, 2, 2, 3)); err != nil || s.nPlain != 5 {
		t.Fatalf("good runs [1,3) [5,8): %v", err)
	}
	defer func(n uint64) { restorePlainMax = n }(restorePlainMax)
	restorePlainMax = 1
	for name, runs := range map[string][]byte{
		"over entry":      {1, 1, 5},
		"at entry":        {1, 4, 1},
		"past next lsn":   {1, 8, 3},
		"empty":           {1, 1, 0},
		"adjacent":        {2, 1, 2, 0, 1},
		"count too large": {9, 1, 1},
		"beyond the cap":  {1, 0, 2},
	} {
		if _, err := Restore(Config{}, build(runs...)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: err %v", name, err)
		}
	}
}

// TestApplyGap: a gap settles its LSN at once, joins settled runs, and an
// LSN below NextLSN is ignored.
func TestApplyGap(t *testing.T) {
	h := &harness{s: New(Config{})}
	enqueueN(t, h, 2, 0)
	if _, err := h.gap(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.gap(); err != nil {
		t.Fatal(err)
	}
	if err := h.s.ApplyGap(1); err != nil {
		t.Fatal(err)
	}
	if st := h.s.Stats(0); st.NextLSN != 4 || st.Ready != 2 || st.SettledRanges != 1 {
		t.Fatalf("stats %+v", st)
	}
	if in, _ := h.s.Lookup(3, 0); in.State != StateSettled {
		t.Fatalf("gap lsn: %+v", in)
	}
}

// BenchmarkBacklogHeap measures the heap a queue holds per waiting message:
// one million published, none consumed; plain, or each with a TTL (as on
// a queue with a default TTL).
func BenchmarkBacklogHeap(b *testing.B) {
	for _, ttl := range []int64{0, 3_600_000} {
		b.Run(fmt.Sprintf("ttl=%d", ttl), func(b *testing.B) {
			const n = 1_000_000
			var evs []Event
			var ms0, ms1 runtime.MemStats
			for b.Loop() {
				runtime.GC()
				runtime.ReadMemStats(&ms0)
				s := New(Config{DefaultTTLMs: ttl})
				for range n {
					evs, _ = s.Enqueue(evs[:0], &Message{PublishedAtMs: 1}, 1)
					applyAll(b, s, evs)
				}
				runtime.GC()
				runtime.ReadMemStats(&ms1)
				b.ReportMetric(float64(ms1.HeapAlloc-ms0.HeapAlloc)/n, "heapB/msg")
				runtime.KeepAlive(s)
			}
		})
	}
}

// BenchmarkInflightOfOneOwner measures what a consumer's detach costs to
// look up: its 8 leases among 100,000 held by others.
func BenchmarkInflightOfOneOwner(b *testing.B) {
	s := New(Config{LeaseMs: LeaseMsMax})
	m := &Message{PublishedAtMs: 1}
	var evs []Event
	for range 100_008 {
		evs, _ = s.Enqueue(evs[:0], m, 1)
		applyAll(b, s, evs)
	}
	for i := range 100_000 / LeaseBatchMax {
		evs = s.Lease(evs[:0], string(rune('a'+i%16)), LeaseBatchMax, 1)
		applyAll(b, s, evs)
	}
	evs = s.Lease(evs[:0], "detaching", 8, 1)
	applyAll(b, s, evs)
	for b.Loop() {
		if got := s.Inflight("detaching"); len(got) != 8 {
			b.Fatalf("%d leases", len(got))
		}
	}
}

// TestRecordSizes keeps the sizes the package doc promises.
func TestRecordSizes(t *testing.T) {
	if n := unsafe.Sizeof(entry{}); n != 80 {
		t.Errorf("entry is %d bytes, doc says 80", n)
	}
	if n := unsafe.Sizeof(chunk{}); n != 144 {
		t.Errorf("chunk is %d bytes, doc says 144", n)
	}
}
