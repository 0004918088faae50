package raftlog

import (
	"fmt"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
)

// BenchmarkEntries reads back 64 committed 1 KiB entries, as raft does after
// persisting them, from the in-memory tail (hot) and from the segment files
// (cold: a Storage whose cache was evicted). It reports the segment-file
// reads per operation, which must be 0 for the hot path.
func BenchmarkEntries(b *testing.B) {
	for _, hot := range []bool{true, false} {
		b.Run(fmt.Sprintf("hot=%v", hot), func(b *testing.B) {
			l, err := seglog.Open(seglog.Options{FS: vfs.NewMem(), Dir: "log"})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			s := New(l, Options{})
			data := make([]byte, 1024)
			data[0] = 1
			for i := uint64(1); i <= 64; i++ {
				e := ent(i, 1)
				e.Data = data
				if err := s.Append([]raftpb.Entry{e}); err != nil {
					b.Fatal(err)
				}
			}
			if err := s.Sync(); err != nil {
				b.Fatal(err)
			}
			if !hot {
				s = New(l, Options{})
			}
			b.SetBytes(64 * 1024)
			for b.Loop() {
				ents, err := s.Entries(1, 65, 1<<20)
				if err != nil || len(ents) != 64 {
					b.Fatalf("%d entries, %v", len(ents), err)
				}
			}
			b.ReportMetric(float64(s.DiskReads())/float64(b.N), "filereads/op")
		})
	}
}

// BenchmarkGroupOfOne drives a raft group of one on a MemFS log: one
// proposal of 1 KiB, persisted, committed and applied per operation. It
// reports the Entries calls that read segment files per operation (0: the
// committed entries came back from memory).
func BenchmarkGroupOfOne(b *testing.B) {
	l, err := seglog.Open(seglog.Options{FS: vfs.NewMem(), Dir: "log"})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	g := newGroup(b, l, 0)
	data := make([]byte, 1024)
	data[0] = 1
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if err := g.rn.Propose(data); err != nil {
			b.Fatal(err)
		}
		g.drain()
	}
	b.ReportMetric(float64(g.s.DiskReads())/float64(b.N), "filereads/op")
}
