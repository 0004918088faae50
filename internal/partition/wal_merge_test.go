package partition

import (
	"math/rand/v2"
	"testing"

	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/internal/wal"
)

// A follower holds an uncommitted suffix 10..12 of term 1 (from a deposed
// leader), made durable through the node WAL. It installs a raft snapshot
// at index 9 of term 3 (the log reset to 9, the WAL released to 9) and
// loses power. Recovery skips the WAL entries below covers (10) and must
// not append the stale 10..12 of term 1 after the snapshot either: the
// log's terms would go down and entries raft discarded would come back.
func TestMergeWALDropsASuffixASnapshotDiscarded(t *testing.T) {
	fs := vfs.NewMem()
	for _, d := range []string{"data", "data/p0", "data/p0/log"} {
		if err := fs.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := fs.SyncDir("."); err != nil {
		t.Fatal(err)
	}
	_ = fs.SyncDir("data")
	_ = fs.SyncDir("data/p0")
	group := "queues/t/g/p0"
	w, err := wal.Open(wal.Options{FS: fs, Dir: "data/wal"})
	if err != nil {
		t.Fatal(err)
	}
	log, err := seglog.Open(seglog.Options{FS: fs, Dir: "data/p0/log"})
	if err != nil {
		t.Fatal(err)
	}
	// Entries 1..12: 1..5 of term 1 committed, 6..12 of term 1 from a
	// leader that was deposed before committing them.
	var ents []wal.Entry
	for i := uint64(1); i <= 12; i++ {
		if err := log.AppendAt(i, 1, 0, []byte("old")); err != nil {
			t.Fatal(err)
		}
		ents = append(ents, wal.Entry{Index: i, Term: 1, Payload: []byte("old")})
	}
	if err := w.Commit(group, wal.Batch{Entries: ents}); err != nil {
		t.Fatal(err)
	}
	// The snapshot install at 9 of term 3, as storeSnapshot does it.
	if err := log.ResetTo(9, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := log.Sync(); err != nil {
		t.Fatal(err)
	}
	w.Release(group, log.NextLSN()-1)
	crashed := fs.Crash(rand.New(rand.NewPCG(1, 1)), false)
	log.Close()
	w.Close()

	w2, err := wal.Open(wal.Options{FS: crashed, Dir: "data/wal"})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	log2, err := seglog.Open(seglog.Options{FS: crashed, Dir: "data/p0/log"})
	if err != nil {
		t.Fatal(err)
	}
	defer log2.Close()
	g, ok := w2.Take(group)
	if !ok {
		t.Fatal("nothing replayed")
	}
	p := &Partition{cfg: Config{Topic: "t", Group: "g", WAL: w2, WALGroup: group, WALReplay: &g}}
	if err := p.mergeWAL(log2, false, nil, nil, 10); err != nil {
		t.Fatalf("mergeWAL: %v", err)
	}
	last, _ := log2.Term(9)
	if next := log2.NextLSN(); next != 10 {
		t10, _ := log2.Term(10)
		t.Fatalf("after the snapshot at 9 (term %d) recovery put back %d..%d, entry 10 of term %d: the log's terms go down", last, 10, next-1, t10)
	}
}
