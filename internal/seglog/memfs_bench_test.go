package seglog

import (
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
)

// BenchmarkAppendSyncMem1KiB is BenchmarkAppendSync1KiB (batch=64) on MemFS:
// the log's own CPU cost per record (encoding, CRC, buffer hand-off, write
// bookkeeping) without the disk, whose fsync noise hides it on a shared
// machine.
func BenchmarkAppendSyncMem1KiB(b *testing.B) {
	l, err := Open(Options{FS: vfs.NewMem(), Dir: "log", SegmentBytes: 8 << 20})
	if err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 1024)
	const batch = 64
	b.SetBytes(batch * int64(len(payload)))
	n := 0
	for b.Loop() {
		for range batch {
			if _, err := l.Append(1, payload); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := l.Sync(); err != nil {
			b.Fatal(err)
		}
		n += batch
		if n >= 1<<16 { // keep MemFS memory bounded
			if err := l.Rotate(); err != nil {
				b.Fatal(err)
			}
			if _, err := l.DropBefore(l.NextLSN()); err != nil {
				b.Fatal(err)
			}
			n = 0
		}
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "records/s")
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
}
