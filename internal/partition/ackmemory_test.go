package partition

import (
	"math/rand/v2"
	"testing"
)

// TestAckMemoryForgetsOldestPastMax fills the memory past its bound and
// checks that exactly the oldest offsets are forgotten, that a repeated
// offset neither grows nor reorders it, and that the map stays bounded.
func TestAckMemoryForgetsOldestPastMax(t *testing.T) {
	a := newAckMemory()
	const extra = 10
	for off := uint64(0); off < ackMemoryMax+extra; off++ {
		a.put(off, off+1)
		a.put(off, off+1) // the same ACK replayed must not take a second slot
	}
	if a.n != ackMemoryMax || len(a.order) != ackMemoryMax || len(a.slots) > 2*ackMemoryMax {
		t.Fatalf("remembered %d (order %d, %d slots), want %d", a.n, len(a.order), len(a.slots), ackMemoryMax)
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

// TestAckMemoryMatchesAMapAndAQueue drives the table with offsets in order,
// in scattered runs and in strides that share home slots, and checks every
// answer against a plain map with an eviction queue.
func TestAckMemoryMatchesAMapAndAQueue(t *testing.T) {
	for seed := range uint64(6) {
		rng := rand.New(rand.NewPCG(seed, 7))
		a := newAckMemory()
		ref := map[uint64]uint64{}
		var fifo []uint64
		next := uint64(0)
		for i := range 300_000 {
			var off uint64
			switch rng.IntN(4) {
			case 0:
				off = next
				next++
			case 1:
				off = rng.Uint64N(1 << 20)
			case 2:
				off = rng.Uint64N(64) * (1 << 16) // same home run
			default:
				off = next - min(next, rng.Uint64N(200))
			}
			lease := rng.Uint64N(1<<30) + 1
			a.put(off, lease)
			if _, ok := ref[off]; !ok {
				fifo = append(fifo, off)
				if len(fifo) > ackMemoryMax {
					delete(ref, fifo[0])
					fifo = fifo[1:]
				}
			}
			ref[off] = lease
			if a.n != len(ref) {
				t.Fatalf("seed %d step %d: %d remembered, want %d", seed, i, a.n, len(ref))
			}
			probe := rng.Uint64N(1 << 20)
			if i%3 == 0 && len(fifo) > 0 {
				probe = fifo[rng.IntN(len(fifo))]
			}
			l, ok := ref[probe]
			if got := a.by(probe, l); got != ok {
				t.Fatalf("seed %d step %d: by(%d) = %v, want %v", seed, i, probe, got, ok)
			}
			if ok && a.by(probe, l+1) {
				t.Fatalf("seed %d step %d: by(%d) matched another lease", seed, i, probe)
			}
		}
	}
}

func BenchmarkAckMemoryInOrder(b *testing.B) {
	a := newAckMemory()
	for i := range b.N {
		a.put(uint64(i)*2, uint64(i))
	}
}
