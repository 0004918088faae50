package seglog

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/vfs"
)

// termPayload ties a payload to its (index, term), so a record left over
// from an overwritten suffix is told apart from its replacement.
func termPayload(index, term uint64) []byte {
	p := payloadFor(index*1000+term, 150)
	p[0] = byte(term)
	return p
}

// checkLog verifies that the log holds exactly want[i] = term of index
// first+i, each record with termPayload bytes, through Scan, Read and Term.
func checkLog(t *testing.T, l *Log, first uint64, want []uint64) {
	t.Helper()
	if l.FirstLSN() != first || l.NextLSN() != first+uint64(len(want)) {
		t.Fatalf("first %d next %d, want %d and %d", l.FirstLSN(), l.NextLSN(), first, first+uint64(len(want)))
	}
	i := 0
	err := l.Scan(0, func(r Record) error {
		idx := first + uint64(i)
		if r.LSN != idx || r.Term != want[i] || !bytes.Equal(r.Payload, termPayload(idx, want[i])) {
			t.Fatalf("scan: lsn %d term %d, want lsn %d term %d (payload ok %v)", r.LSN, r.Term, idx, want[i],
				bytes.Equal(r.Payload, termPayload(idx, want[i])))
		}
		i++
		return nil
	})
	if err != nil || i != len(want) {
		t.Fatalf("scan saw %d records: %v", i, err)
	}
	for j, term := range want {
		idx := first + uint64(j)
		if got, err := l.Term(idx); err != nil || got != term {
			t.Fatalf("Term(%d) = %d, %v; want %d", idx, got, err, term)
		}
		if r, err := l.Read(idx); err != nil || r.Term != term {
			t.Fatalf("Read(%d) = term %d, %v", idx, r.Term, err)
		}
	}
	if _, err := l.Term(first + uint64(len(want))); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Term past the end: %v", err)
	}
}

func appendTerms(t *testing.T, l *Log, from uint64, terms ...uint64) {
	t.Helper()
	for i, term := range terms {
		idx := from + uint64(i)
		if err := l.AppendAt(idx, term, 3, termPayload(idx, term)); err != nil {
			t.Fatalf("AppendAt(%d, %d): %v", idx, term, err)
		}
	}
	if _, err := l.Sync(); err != nil {
		t.Fatal(err)
	}
}

func TestAppendAtOverwritesConflictingSuffix(t *testing.T) {
	for _, prealloc := range []PreallocMode{PreallocNone, PreallocReserve, PreallocZero} {
		fs := vfs.NewMem()
		o := Options{FS: fs, Dir: "log", SegmentBytes: 4096, IndexIntervalBytes: 256, Preallocate: prealloc}
		l := openT(t, o)
		terms := make([]uint64, 100) // ~24 records per segment: 5 segments
		for i := range terms {
			terms[i] = 1 + uint64(i/30)
		}
		appendTerms(t, l, 1, terms...)
		checkLog(t, l, 1, terms)

		// Overwrite from 70 (mid-segment) with term 5, across the
		// segment boundaries that held 70..100.
		appendTerms(t, l, 70, 5, 5, 5)
		want := append(append([]uint64{}, terms[:69]...), 5, 5, 5)
		checkLog(t, l, 1, want)
		// Overwrite at a segment's first record.
		segs := l.Segments()
		b := segs[1].Base
		appendTerms(t, l, b, 6)
		want = append(want[:b-1], 6)
		checkLog(t, l, 1, want)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		l = openT(t, o)
		checkLog(t, l, 1, want)
		// Appends continue after a reopen; old-API appends take the
		// current term.
		lsn, err := l.Commit(3, termPayload(b+1, 6))
		if err != nil || lsn != b+1 {
			t.Fatalf("Commit = %d, %v", lsn, err)
		}
		want = append(want, 6)
		checkLog(t, l, 1, want)
		_ = l.Close()
	}
}

func TestAppendAtErrors(t *testing.T) {
	l := openT(t, memOpts(vfs.NewMem()))
	defer l.Close()
	appendTerms(t, l, 1, 2, 2, 3)
	if err := l.AppendAt(5, 3, 0, nil); !errors.Is(err, ErrBadIndex) {
		t.Fatalf("gap: %v", err)
	}
	if err := l.AppendAt(4, 2, 0, nil); !errors.Is(err, ErrBadIndex) {
		t.Fatalf("term regress: %v", err)
	}
	if err := l.AppendAt(0, 2, 0, nil); !errors.Is(err, ErrBadIndex) {
		t.Fatalf("index 0: %v", err)
	}
	if err := l.AppendAt(4, 0, 0, nil); !errors.Is(err, ErrBadIndex) {
		t.Fatalf("term 0: %v", err)
	}
	if err := l.ResetTo(10, 4); err != nil {
		t.Fatal(err)
	}
	if err := l.AppendAt(10, 4, 0, nil); !errors.Is(err, ErrCompacted) {
		t.Fatalf("append into the snapshot: %v", err)
	}
	if err := l.TruncateAfter(5); !errors.Is(err, ErrCompacted) {
		t.Fatalf("truncate into the snapshot: %v", err)
	}
	if _, err := l.Term(9); !errors.Is(err, ErrCompacted) {
		t.Fatalf("Term before the start: %v", err)
	}
	// Compaction errors are not sticky.
	appendTerms(t, l, 11, 4)
}

func TestTruncateAfter(t *testing.T) {
	fs := vfs.NewMem()
	o := Options{FS: fs, Dir: "log", SegmentBytes: 4096, IndexIntervalBytes: 256}
	l := openT(t, o)
	terms := make([]uint64, 80)
	for i := range terms {
		terms[i] = 1 + uint64(i/20)
	}
	appendTerms(t, l, 1, terms...)
	if err := l.TruncateAfter(200); err != nil { // past the end: nothing
		t.Fatal(err)
	}
	checkLog(t, l, 1, terms)
	if err := l.TruncateAfter(50); err != nil {
		t.Fatal(err)
	}
	checkLog(t, l, 1, terms[:50])
	if d := l.DurableLSN(); d != 50 {
		t.Fatalf("DurableLSN %d after truncate", d)
	}
	if err := l.TruncateAfter(0); err != nil { // everything
		t.Fatal(err)
	}
	checkLog(t, l, 1, nil)
	if term, err := l.Term(0); err != nil || term != 0 {
		t.Fatalf("Term(0) = %d, %v", term, err)
	}
	appendTerms(t, l, 1, 7, 7)
	_ = l.Close()
	l = openT(t, o)
	checkLog(t, l, 1, []uint64{7, 7})
	_ = l.Close()
}

func TestResetTo(t *testing.T) {
	fs := vfs.NewMem()
	o := Options{FS: fs, Dir: "log", SegmentBytes: 4096}
	l := openT(t, o)
	appendTerms(t, l, 1, 1, 1, 2)
	// A reset behind the end of the log and one beyond it both discard it.
	for _, snap := range []struct{ index, term uint64 }{{2, 1}, {1000, 9}} {
		if err := l.ResetTo(snap.index, snap.term); err != nil {
			t.Fatal(err)
		}
		checkLog(t, l, snap.index+1, nil)
		if term, err := l.Term(snap.index); err != nil || term != snap.term {
			t.Fatalf("Term(%d) = %d, %v", snap.index, term, err)
		}
	}
	appendTerms(t, l, 1001, 9, 10)
	_ = l.Close()
	names, _ := fs.ReadDir("log")
	if len(names) != 1 || names[0] != SegmentName(1001) {
		t.Fatalf("files after reset: %v", names)
	}
	l = openT(t, o)
	checkLog(t, l, 1001, []uint64{9, 10})
	if term, err := l.Term(1000); err != nil || term != 9 {
		t.Fatalf("Term(1000) after reopen = %d, %v", term, err)
	}
	_ = l.Close()
}

func TestHardStateRoundTrip(t *testing.T) {
	fs := vfs.NewMem()
	o := memOpts(fs)
	l := openT(t, o)
	if hs := l.HardState(); hs.Term != 0 || hs.Vote != 0 || hs.Commit != 0 {
		t.Fatalf("fresh HardState %v", hs)
	}
	if names, _ := fs.ReadDir("log"); len(names) != 1 {
		t.Fatalf("a log without HardState has files %v", names)
	}
	hs := &raftpb.HardState{Term: 3, Vote: 2, Commit: 0}
	if err := l.SetHardState(hs); err != nil {
		t.Fatal(err)
	}
	cs := &raftpb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}}
	if err := l.SetConfState(cs); err != nil {
		t.Fatal(err)
	}
	hs.Commit = 7
	if err := l.SetHardState(hs); err != nil {
		t.Fatal(err)
	}
	if got := l.HardState(); got == nil || *got != *hs {
		t.Fatalf("HardState %v, want %v", got, hs)
	}
	_ = l.Close()
	l = openT(t, o)
	defer l.Close()
	if got := l.HardState(); got == nil || *got != *hs {
		t.Fatalf("after reopen HardState %v, want %v", got, hs)
	}
	if got, err := l.ConfState(); err != nil || !confStateEqual(got, cs) {
		t.Fatalf("after reopen ConfState %v, %v", got, err)
	}
	big := &raftpb.ConfState{Voters: make([]uint64, 1000)}
	for i := range big.Voters {
		big.Voters[i] = 1 << 40
	}
	if err := l.SetConfState(big); !errors.Is(err, ErrConfStateTooLarge) {
		t.Fatalf("oversized ConfState: %v", err)
	}
}

// confStateEqual reports whether a and b hold the same configuration, field
// by field and in order (an empty list equals a nil one).
func confStateEqual(a, b *raftpb.ConfState) bool {
	if a == nil || b == nil {
		return a == b
	}
	return slices.Equal(a.Voters, b.Voters) && slices.Equal(a.Learners, b.Learners) &&
		slices.Equal(a.VotersOutgoing, b.VotersOutgoing) && slices.Equal(a.LearnersNext, b.LearnersNext) &&
		a.AutoLeave == b.AutoLeave
}
