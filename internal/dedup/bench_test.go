package dedup

import (
	"strconv"
	"testing"
)

// BenchmarkCheckRecord is the work one idempotent publish adds on the
// partition goroutine: a Check and a Record, here for 64 producers each
// numbering its publishes, with full windows.
func BenchmarkCheckRecord(b *testing.B) {
	tab := New(Config{})
	ids := make([]string, 64)
	for i := range ids {
		ids[i] = "producer-" + strconv.Itoa(i)
	}
	var seq, off uint64
	for b.Loop() {
		id := ids[off%uint64(len(ids))]
		if off%uint64(len(ids)) == 0 {
			seq++
		}
		off++
		if v, _ := tab.Check(id, seq, 1); v != Fresh {
			b.Fatalf("%s/%d: %v", id, seq, v)
		}
		tab.Record(id, seq, off, 1)
	}
}
