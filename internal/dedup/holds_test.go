package dedup

import "testing"

// TestHolds checks the ordering link's answer: a sequence the window
// remembers or one at or below the floor is held; a gap, an unknown producer
// and an idle-expired one hold nothing.
func TestHolds(t *testing.T) {
	tab := New(Config{WindowSeqs: 3, IdleMs: 100})
	for _, seq := range []uint64{2, 4, 6, 8} { // sparse, as one partition sees a producer's sequences
		tab.Record("p", seq, 10+seq, 1)
	}
	// Window {4, 6, 8}, floor 2.
	cases := []struct {
		id   string
		seq  uint64
		want bool
	}{
		{"p", 1, true}, {"p", 2, true}, // at or below the floor
		{"p", 3, false}, // above the floor, never stored: a gap
		{"p", 4, true}, {"p", 8, true},
		{"p", 7, false}, {"p", 9, false}, // not arrived yet
		{"other", 1, false}, // unknown producer
		{"", 1, false},
	}
	for _, c := range cases {
		if got := tab.Holds(c.id, c.seq, 50); got != c.want {
			t.Errorf("Holds(%q, %d) = %v, want %v", c.id, c.seq, got, c.want)
		}
	}
	if tab.Holds("p", 8, 101) {
		t.Error("an idle-expired producer still holds its sequences")
	}
	// Holds changes nothing: the table answers Check as before.
	if v, off := tab.Check("p", 8, 50); v != Duplicate || off != 18 {
		t.Errorf("Check after Holds = %v %d", v, off)
	}
}
