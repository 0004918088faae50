package partition

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/internal/wal"
)

// A follower holds an uncommitted suffix 10..12 of term 1 (from a deposed
// leader), made durable through the node journal. It installs a raft
// snapshot at index 9 of term 3 (the log reset to 9, then a reset record in
// the journal, as storeSnapshot does) and loses power. Recovery must not
// append the stale 10..12 of term 1 after the snapshot: the log's terms
// would go down and entries raft discarded would come back.
func TestMergeWALDropsASuffixASnapshotDiscarded(t *testing.T) {
	group := "queues/t/g/p0"
	fs, w, log := mergeFixture(t, 0)
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
	if err := w.Commit(group, wal.Batch{Reset: true}); err != nil {
		t.Fatal(err)
	}
	w.Release(group, log.NextLSN()-1)
	log2 := crashAndMerge(t, fs, w, log, group, 10)
	last, _ := log2.Term(9)
	if next := log2.NextLSN(); next != 10 {
		t10, _ := log2.Term(10)
		t.Fatalf("after the snapshot at 9 (term %d) recovery put back %d..%d, entry 10 of term %d: the log's terms go down", last, 10, next-1, t10)
	}
}

// A follower's journal segment S1 holds its entries 1..5 of term 1 (3..5
// uncommitted, from a deposed leader) and stays, pinned by another group's
// unreleased entry. A leader of term 2 overwrites 3..5 (segment S2); the
// follower's own log makes 1..2@1, 3..5@2 durable and releases 5. S2 holds
// nothing unreleased but stays: segments go oldest first, so replay never
// joins S1's stale 3..5@1 to a later segment across a gap. The leader then
// sends 6@2, durable only in the journal (S3). Recovery keeps the later
// writes 3..5@2 and appends 6@2, with the checkpoint covering 1..3 or only
// 1..2.
func TestMergeWALKeepsTheLaterWriteAndAnAckedEntry(t *testing.T) {
	for _, covers := range []uint64{4, 3} {
		t.Run(fmt.Sprintf("covers=%d", covers), func(t *testing.T) {
			mergeAfterDeletedRewrite(t, covers)
		})
	}
}

func mergeAfterDeletedRewrite(t *testing.T, covers uint64) {
	group, other := "queues/t/g/p0", "queues/t/h/p0"
	pay := func(n int) []byte { return bytes.Repeat([]byte("x"), n) }
	// Segment sizes: S1 = header + g's 1..5 + h's 1 (then full), S2 = g's
	// 3..5 (full on its own), S3 = g's 6.
	fs, w, log := mergeFixture(t, 600)
	var ents []wal.Entry
	for i := uint64(1); i <= 5; i++ {
		ents = append(ents, wal.Entry{Index: i, Term: 1, Payload: pay(20)})
	}
	if err := w.Commit(group, wal.Batch{Entries: ents}); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(other, wal.Batch{Entries: []wal.Entry{{Index: 1, Term: 1, Payload: pay(500)}}}); err != nil {
		t.Fatal(err)
	}
	var over []wal.Entry
	for i := uint64(3); i <= 5; i++ {
		over = append(over, wal.Entry{Index: i, Term: 2, Payload: pay(300)})
	}
	if err := w.Commit(group, wal.Batch{Entries: over}); err != nil {
		t.Fatal(err)
	}
	// The follower's own log after its checkpoint: 1..2@1, 3..5@2.
	for i := uint64(1); i <= 5; i++ {
		term := uint64(1)
		if i >= 3 {
			term = 2
		}
		if err := log.AppendAt(i, term, 0, pay(20)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := log.Sync(); err != nil {
		t.Fatal(err)
	}
	w.Release(group, 5)
	if err := w.Commit(group, wal.Batch{Entries: []wal.Entry{{Index: 6, Term: 2, Payload: []byte("acked")}}}); err != nil {
		t.Fatal(err)
	}
	// The writer trims after the write that acknowledged 6; a later commit
	// is written only after that trim, so it orders the check below.
	if err := w.Commit(other, wal.Batch{Entries: []wal.Entry{{Index: 2, Term: 1, Payload: pay(1)}}}); err != nil {
		t.Fatal(err)
	}
	if names, _ := fs.ReadDir("data/wal"); !slices.Contains(names, "wal-0000000000000002.log") {
		t.Fatalf("the segment of the rewrite 3..5@2 was deleted while an older one stays: %v", names)
	}
	log2 := crashAndMerge(t, fs, w, log, group, covers)
	if next := log2.NextLSN(); next != 7 {
		t.Fatalf("entry 6@2, fsynced through the WAL and acknowledged, is gone after recovery: the log ends at %d", next-1)
	}
	for i, want := range []uint64{1, 1, 2, 2, 2, 2} {
		if got, _ := log2.Term(uint64(i + 1)); got != want {
			t.Errorf("after recovery entry %d has term %d, want %d", i+1, got, want)
		}
	}
}

// crashAndMerge cuts the power under w and log (a replica's WAL and log on
// fs), reopens both and runs a replica's mergeWAL of group with a
// checkpoint covering covers. The reopened log is returned, closed at the
// end of the test.
func crashAndMerge(t *testing.T, fs *vfs.MemFS, w *wal.WAL, log *seglog.Log, group string, covers uint64) *seglog.Log {
	t.Helper()
	crashed := fs.Crash(rand.New(rand.NewPCG(1, 1)), false)
	log.Close()
	w.Close()
	w2, err := wal.Open(wal.Options{FS: crashed, Dir: "data/wal"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w2.Close() })
	log2, err := seglog.Open(seglog.Options{FS: crashed, Dir: "data/p0/log"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log2.Close() })
	g, _ := w2.Take(group)
	p := &Partition{cfg: Config{Topic: "t", Group: "g", WAL: w2, WALGroup: group, WALReplay: &g}}
	if err := p.mergeWAL(log2, false, nil, nil, covers); err != nil {
		t.Fatalf("mergeWAL: %v", err)
	}
	return log2
}

// The journal holds the last write of an index even when its term is lower
// than the log's copy: a leader may overwrite a follower's entry with one an
// earlier leader wrote (raft's "figure 8"). The follower's log held 3@3,
// durable; the overwrite 3@2 and then 4@4 were fsynced only through the
// journal. Recovery must keep 3@2, not the higher term.
func TestMergeWALTheJournalIsTheLastWrite(t *testing.T) {
	group := "queues/t/g/p0"
	fs, w, log := mergeFixture(t, 0)
	for i, term := range []uint64{1, 1, 3} {
		if err := log.AppendAt(uint64(i+1), term, 0, []byte("log")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := log.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(group, wal.Batch{Entries: []wal.Entry{{Index: 3, Term: 2, Payload: []byte("j")}, {Index: 4, Term: 4, Payload: []byte("j")}}}); err != nil {
		t.Fatal(err)
	}
	log2 := crashAndMerge(t, fs, w, log, group, 1)
	for i, want := range []uint64{1, 1, 2, 4} {
		if got, _ := log2.Term(uint64(i + 1)); got != want {
			t.Errorf("after recovery entry %d has term %d, want %d", i+1, got, want)
		}
	}
	if next := log2.NextLSN(); next != 5 {
		t.Errorf("after recovery the log ends at %d, want 4", next-1)
	}
}

// A vote committed through the journal, its write to the log's HardState
// file not synced, survives a power loss: recovery takes it from the
// journal, so the replica never votes twice in one term.
func TestMergeWALRestoresAVote(t *testing.T) {
	group := "queues/t/g/p0"
	fs, w, log := mergeFixture(t, 0)
	if err := log.AppendAt(1, 1, 0, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := log.SetHardState(&raftpb.HardState{Term: 1, Commit: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := log.Sync(); err != nil {
		t.Fatal(err)
	}
	// Term 3, vote for 2: through the journal, as storeHardState does.
	if err := w.Commit(group, wal.Batch{HardState: &wal.HardState{Term: 3, Vote: 2, Commit: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := log.SetHardStateJournaled(&raftpb.HardState{Term: 3, Vote: 2, Commit: 1}); err != nil {
		t.Fatal(err)
	}
	log2 := crashAndMerge(t, fs, w, log, group, 1)
	if hs := log2.HardState(); hs.Term != 3 || hs.Vote != 2 || hs.Commit != 1 {
		t.Fatalf("after recovery the HardState is %+v, want term 3 vote 2 commit 1", hs)
	}
}

// mergeFixture makes a durable data directory on MemFS with a replica's
// journal (segments of segmentBytes, 0: the default) and log in it.
func mergeFixture(t *testing.T, segmentBytes int64) (*vfs.MemFS, *wal.WAL, *seglog.Log) {
	t.Helper()
	fs := vfs.NewMem()
	for _, d := range []string{"data", "data/p0", "data/p0/log"} {
		if err := fs.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{".", "data", "data/p0"} {
		if err := fs.SyncDir(d); err != nil {
			t.Fatal(err)
		}
	}
	w, err := wal.Open(wal.Options{FS: fs, Dir: "data/wal", SegmentBytes: segmentBytes})
	if err != nil {
		t.Fatal(err)
	}
	log, err := seglog.Open(seglog.Options{FS: fs, Dir: "data/p0/log"})
	if err != nil {
		t.Fatal(err)
	}
	return fs, w, log
}
