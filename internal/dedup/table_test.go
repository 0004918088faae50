package dedup

import (
	"errors"
	"testing"
)

func TestWindowAndFloor(t *testing.T) {
	tab := New(Config{WindowSeqs: 3})
	for seq := uint64(1); seq <= 5; seq++ {
		tab.Record("p", seq, 100+seq, 1)
	}
	cases := []struct {
		seq  uint64
		want Verdict
		off  uint64
	}{
		{1, TooOld, 0}, {2, TooOld, 0}, {3, Duplicate, 103}, {5, Duplicate, 105}, {6, Fresh, 0},
	}
	for _, c := range cases {
		if v, off := tab.Check("p", c.seq, 1); v != c.want || off != c.off {
			t.Errorf("check seq %d = %v %d, want %v %d", c.seq, v, off, c.want, c.off)
		}
	}
	if v, _ := tab.Check("other", 1, 1); v != Fresh {
		t.Errorf("unknown producer: %v, want new", v)
	}
	if v, _ := tab.Check("", 3, 1); v != Fresh {
		t.Errorf("empty producer id: %v, want new", v)
	}
}

func TestIdleExpiryAndLimits(t *testing.T) {
	tab := New(Config{IdleMs: 10, ProducersMax: 2})
	tab.Record("a", 1, 1, 0)
	if v, _ := tab.Check("a", 1, 9); v != Duplicate {
		t.Fatalf("within idle: %v", v)
	}
	if v, _ := tab.Check("a", 1, 10); v != Fresh {
		t.Fatalf("idle producer still remembered by Check: %v", v)
	}
	tab.Record("b", 1, 2, 5)
	tab.Record("c", 1, 3, 6) // over ProducersMax: a, the least recent, goes
	if st := tab.Stats(); st.Producers != 2 || st.EvictedLimit != 1 || st.EvictedIdle != 0 {
		t.Fatalf("stats %+v", st)
	}
	tab.Record("c", 2, 4, 15) // b idle since 5: forgotten; c, seen at 6, is not
	if st := tab.Stats(); st.Producers != 1 || st.EvictedIdle != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestRestoreRejectsDamage(t *testing.T) {
	tab := New(Config{})
	tab.Record("p", 7, 70, 5)
	tab.Record("q", 9, 90, 6)
	snap := tab.Snapshot(nil)
	for i := range snap {
		if _, err := Restore(Config{}, snap[:i]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d bytes: %v", i, err)
		}
	}
	bad := append([]byte(nil), snap...)
	bad[4] = 9
	if _, err := Restore(Config{}, bad); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("version 9: %v", err)
	}
	if _, err := Restore(Config{}, append(snap, 0)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("trailing byte: %v", err)
	}
}

func FuzzRestore(f *testing.F) {
	tab := New(Config{})
	tab.Record("p", 1, 1, 1)
	f.Add(tab.Snapshot(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		tab, err := Restore(Config{WindowSeqs: 4, ProducersMax: 4, EntriesMax: 8}, b)
		if err != nil {
			return
		}
		if st := tab.Stats(); st.Producers > 4 || st.Entries > 8 {
			t.Fatalf("restored beyond bounds: %+v", st)
		}
		tab.Record("x", 1, 1, 1)
	})
}
