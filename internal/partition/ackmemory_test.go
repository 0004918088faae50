package partition

import "testing"

// TestAckMemoryForgetsOldestPastMax fills the memory past its bound and
// checks that exactly the oldest offsets are forgotten, that a repeated
// offset neither grows nor reorders it, and that the map stays bounded.
func TestAckMemoryForgetsOldestPastMax(t *testing.T) {
	a := ackMemory{m: make(map[uint64]uint64)}
	const extra = 10
	for off := uint64(0); off < ackMemoryMax+extra; off++ {
		a.put(off, off+1)
		a.put(off, off+1) // the same ACK replayed must not take a second slot
	}
	if len(a.m) != ackMemoryMax || len(a.order) != ackMemoryMax {
		t.Fatalf("remembered %d (order %d), want %d", len(a.m), len(a.order), ackMemoryMax)
	}
	for off := uint64(0); off < extra; off++ {
		if a.by(off, off+1) {
			t.Errorf("offset %d should have been forgotten", off)
		}
	}
	for _, off := range []uint64{extra, ackMemoryMax, ackMemoryMax + extra - 1} {
		if !a.by(off, off+1) {
			t.Errorf("offset %d should be remembered", off)
		}
		if a.by(off, off+2) || a.by(off, 0) {
			t.Errorf("offset %d matched a lease that did not ACK it", off)
		}
	}
	// One more new offset evicts the next oldest, extra.
	a.put(1<<40, 7)
	if a.by(extra, extra+1) || !a.by(1<<40, 7) || !a.by(extra+1, extra+2) {
		t.Errorf("ring eviction out of order")
	}
}
