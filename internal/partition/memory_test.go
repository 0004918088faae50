package partition

import "testing"

// TestAckMemoryPackKeepsAnswers: packing a large ACK memory halves it or
// better and changes no answer; the next put unpacks it, and the bound and
// oldest-first forgetting hold afterwards.
func TestAckMemoryPackKeepsAnswers(t *testing.T) {
	a := newAckMemory()
	const n = 50_000
	for off := uint64(0); off < n; off++ {
		a.put(off*2, off*7+1) // gaps, as leases take offsets between messages
	}
	before := 16*len(a.slots) + 8*cap(a.order)
	a.pack()
	if a.packed == nil || a.slots != nil || a.order != nil {
		t.Fatal("not packed")
	}
	if after := 16 * cap(a.packed); after*2 > before {
		t.Fatalf("packed %d bytes, unpacked %d", after, before)
	}
	for _, off := range []uint64{0, 1, 2, 999, 1000, 2 * (n - 1), 2 * n} {
		want := off%2 == 0 && off/2 < n
		if got := a.by(off, (off/2)*7+1); got != want {
			t.Errorf("packed by(%d) = %v, want %v", off, got, want)
		}
		if a.by(off, 12345678) || a.by(off, 0) {
			t.Errorf("packed by(%d) matched a lease that did not ACK it", off)
		}
	}
	// Fill past the bound: the lowest offsets go first.
	for off := uint64(2 * n); off < 2*n+ackMemoryMax; off++ {
		a.put(off, 1)
	}
	if a.packed != nil || a.n != ackMemoryMax {
		t.Fatalf("after puts: packed %v, n %d", a.packed != nil, a.n)
	}
	if a.by(0, 1) || a.by(2*(n-1), (n-1)*7+1) {
		t.Error("the oldest offsets were not forgotten first")
	}
	if !a.by(2*n+ackMemoryMax-1, 1) {
		t.Error("the newest ACK is not remembered")
	}
}

// TestAckMemorySmallNotPacked: a small memory stays a table.
func TestAckMemorySmallNotPacked(t *testing.T) {
	a := newAckMemory()
	for off := range uint64(10) {
		a.put(off, off+1)
	}
	a.pack()
	if a.packed != nil || !a.by(3, 4) {
		t.Fatal("a small ACK memory was packed")
	}
}
