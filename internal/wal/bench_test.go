package wal

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
)

// benchDir returns a fresh directory on a real disk: $SINEW_BENCH_DIR if set,
// else .benchtmp at the module root (gitignored), because /tmp may be tmpfs,
// where fsync costs nothing.
func benchDir(b *testing.B) string {
	b.Helper()
	root := os.Getenv("SINEW_BENCH_DIR")
	if root == "" {
		root = filepath.Join("..", "..", ".benchtmp")
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		b.Fatal(err)
	}
	dir, err := os.MkdirTemp(root, "wal-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

const (
	benchInFlight    = 256
	benchRecordBytes = 1 << 10
)

// runCommitters runs benchInFlight goroutines, committer i serving group
// i mod groups, until b.N records are committed in total, and reports
// records/s.
func runCommitters(b *testing.B, groups int, commit func(group int, index uint64) error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	b.SetBytes(benchRecordBytes)
	b.ResetTimer()
	for c := range benchInFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n := next.Add(1)
				if n > int64(b.N) {
					return
				}
				if err := commit(c%groups, uint64(n)); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkCommit compares committed records/s through one WAL shared by
// all groups with one seglog per group, each doing its own fdatasync; 256
// commits of 1 KiB in flight in total. Indexes are not dense per group here:
// the WAL does not check them and each seglog assigns its own.
func BenchmarkCommit(b *testing.B) {
	payload := make([]byte, benchRecordBytes)
	for _, groups := range []int{1, 4, 16, 64} {
		b.Run(fmt.Sprintf("wal/groups=%d", groups), func(b *testing.B) {
			w, err := Open(Options{FS: vfs.OS(), Dir: filepath.Join(benchDir(b), "wal")})
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			names := make([]string, groups)
			for i := range names {
				names[i] = fmt.Sprintf("queues/bench/g/p%d", i)
			}
			runCommitters(b, groups, func(g int, idx uint64) error {
				return w.Commit(names[g], Batch{Entries: []Entry{{Index: idx, Term: 1, Type: 1, Payload: payload}}})
			})
		})
		b.Run(fmt.Sprintf("seglog/groups=%d", groups), func(b *testing.B) {
			dir := benchDir(b)
			logs := make([]*seglog.Log, groups)
			for i := range logs {
				l, err := seglog.Open(seglog.Options{FS: vfs.OS(), Dir: filepath.Join(dir, fmt.Sprint("p", i))})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				logs[i] = l
			}
			runCommitters(b, groups, func(g int, _ uint64) error {
				_, err := logs[g].Commit(1, payload)
				return err
			})
		})
	}
}

// BenchmarkLoneCommit is one committer with one 1 KiB record in flight, on
// a reserved (fallocated) segment and on a prepared (zero-filled) one: the
// cost of one fdatasync per record, which is what a lone publish waits for.
func BenchmarkLoneCommit(b *testing.B) {
	payload := make([]byte, benchRecordBytes)
	for _, mode := range []struct {
		name string
		p    PrepareMode
	}{{"reserved", PrepareNever}, {"prepared", PrepareAlways}} {
		b.Run(mode.name, func(b *testing.B) {
			w, err := Open(Options{FS: vfs.OS(), Dir: filepath.Join(benchDir(b), "wal"), Prepare: mode.p})
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			if mode.p == PrepareAlways {
				// Wait for the writer to move to the prepared segment.
				for i := uint64(1); w.preparedActive() == false; i++ {
					if err := w.Commit("warm", Batch{Entries: []Entry{{Index: i, Term: 1, Type: 1, Payload: payload}}}); err != nil {
						b.Fatal(err)
					}
					w.Release("warm", i)
				}
			}
			b.SetBytes(benchRecordBytes)
			b.ResetTimer()
			for i := range b.N {
				if err := w.Commit("lone", Batch{Entries: []Entry{{Index: uint64(i + 1), Term: 1, Type: 1, Payload: payload}}}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
		})
	}
}
