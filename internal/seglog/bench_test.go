package seglog

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
)

// benchDir returns a fresh directory on a real disk for benchmarks:
// $SINEW_BENCH_DIR if set, else .benchtmp at the module root (gitignored),
// because /tmp may be tmpfs, where fsync costs nothing.
func benchDir(b *testing.B) string {
	b.Helper()
	root := os.Getenv("SINEW_BENCH_DIR")
	if root == "" {
		root = filepath.Join("..", "..", ".benchtmp")
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		b.Fatal(err)
	}
	dir, err := os.MkdirTemp(root, "seglog-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// diskModes are the ways a file can be laid out before synced writes:
// grown by each write, fallocate'd ahead, or fully written (zeros) ahead.
var diskModes = []string{"append", "fallocate", "zeroed"}

func prepareFile(b *testing.B, mode string, size int64) vfs.File {
	b.Helper()
	f, err := vfs.OS().OpenFile(filepath.Join(benchDir(b), "f"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = f.Close() })
	switch mode {
	case "fallocate":
		err = vfs.Allocate(f, size)
	case "zeroed":
		zero := make([]byte, 1<<20)
		for off := int64(0); off < size && err == nil; off += int64(len(zero)) {
			_, err = f.WriteAt(zero, off)
		}
	}
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		b.Fatal(err)
	}
	return f
}

// BenchmarkDiskFsync1KiB measures the disk's one-at-a-time limit: write
// 1 KiB, fdatasync, repeat.
func BenchmarkDiskFsync1KiB(b *testing.B) {
	for _, mode := range diskModes {
		b.Run("mode="+mode, func(b *testing.B) {
			const fileBytes = 256 << 20
			f := prepareFile(b, mode, fileBytes)
			buf := make([]byte, 1024)
			for i := range buf {
				buf[i] = byte(i)
			}
			off, n := int64(0), 0
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				if _, err := f.WriteAt(buf, off%fileBytes); err != nil {
					b.Fatal(err)
				}
				if err := f.Sync(); err != nil {
					b.Fatal(err)
				}
				off += int64(len(buf))
				n++
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
		})
	}
}

// BenchmarkDiskSeqSynced measures synced sequential bandwidth: write 1 MiB,
// fdatasync, repeat.
func BenchmarkDiskSeqSynced(b *testing.B) {
	for _, mode := range diskModes {
		b.Run("mode="+mode, func(b *testing.B) {
			const fileBytes = 512 << 20
			f := prepareFile(b, mode, fileBytes)
			buf := make([]byte, 1<<20)
			for i := range buf {
				buf[i] = byte(i * 7)
			}
			off := int64(0)
			b.SetBytes(int64(len(buf)))
			for b.Loop() {
				if _, err := f.WriteAt(buf, off%fileBytes); err != nil {
					b.Fatal(err)
				}
				if err := f.Sync(); err != nil {
					b.Fatal(err)
				}
				off += int64(len(buf))
			}
		})
	}
}

var preallocNames = map[PreallocMode]string{PreallocNone: "none", PreallocReserve: "reserve", PreallocZero: "zero"}

// BenchmarkCommit1KiB measures Commit under SyncAlways with N closed-loop
// appenders; each iteration is one acknowledged (durable) 1 KiB record.
func BenchmarkCommit1KiB(b *testing.B) {
	for _, prealloc := range []PreallocMode{PreallocNone, PreallocReserve, PreallocZero} {
		for _, appenders := range []int{1, 8, 64} {
			b.Run(fmt.Sprintf("prealloc=%s/appenders=%d", preallocNames[prealloc], appenders), func(b *testing.B) {
				l, err := Open(Options{FS: vfs.OS(), Dir: benchDir(b), Preallocate: prealloc})
				if err != nil {
					b.Fatal(err)
				}
				payload := make([]byte, 1024)
				acked := make(chan struct{})
				stop := make(chan struct{})
				var wg sync.WaitGroup
				for range appenders {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							if _, err := l.Commit(1, payload); err != nil {
								b.Error(err)
								return
							}
							select {
							case acked <- struct{}{}:
							case <-stop:
								return
							}
						}
					}()
				}
				n := 0
				b.SetBytes(int64(len(payload)))
				for b.Loop() {
					<-acked
					n++
				}
				b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
				close(stop)
				wg.Wait()
				if err := l.Close(); err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// BenchmarkAppendSync1KiB is the partition actor's pattern: one goroutine
// appends a batch of records and makes them durable with one Sync. It shows
// the log's cost without goroutine hand-offs; records/s counts records.
func BenchmarkAppendSync1KiB(b *testing.B) {
	for _, batch := range []int{64, 512} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			l, err := Open(Options{FS: vfs.OS(), Dir: benchDir(b)})
			if err != nil {
				b.Fatal(err)
			}
			payload := make([]byte, 1024)
			b.SetBytes(int64(batch * len(payload)))
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
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "records/s")
			if err := l.Close(); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkRecover1M measures Open over a log of 1,000,000 x 1 KiB records
// (about 1 GiB in 17 segments): every record's CRC is verified and the sparse
// index rebuilt. replay=none is the restart-from-checkpoint case (ReplayFrom
// past the end); replay=all also hands every record to a callback.
func BenchmarkRecover1M(b *testing.B) {
	const records = 1_000_000
	dir := benchDir(b)
	l, err := Open(Options{FS: vfs.OS(), Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 1024)
	for i := range records {
		payload[0], payload[1], payload[2] = byte(i), byte(i>>8), byte(i>>16)
		if _, err := l.Append(1, payload); err != nil {
			b.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
	for _, replay := range []string{"none", "all"} {
		b.Run("replay="+replay, func(b *testing.B) {
			o := Options{FS: vfs.OS(), Dir: dir, ReplayFrom: math.MaxUint64}
			var seen uint64
			if replay == "all" {
				o.ReplayFrom = 0
			}
			o.Replay = func(r Record) error { seen += uint64(len(r.Payload)); return nil }
			b.SetBytes(records * (headerBytes + 1024))
			for b.Loop() {
				l, err := Open(o)
				if err != nil {
					b.Fatal(err)
				}
				if rep := l.Report(); rep.Records != records {
					b.Fatalf("recovered %d records", rep.Records)
				}
				if err := l.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(records)*float64(b.N)/b.Elapsed().Seconds(), "records/s")
		})
	}
}
