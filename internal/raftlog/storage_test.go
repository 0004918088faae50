package raftlog

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/goleak"

	"github.com/sinewmq/sinew/internal/budget"
	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ent builds a normal entry whose data is a queue-like record (type 1) that
// names its index and term.
func ent(index, term uint64) raftpb.Entry {
	return raftpb.Entry{Index: index, Term: term, Type: raftpb.EntryNormal,
		Data: fmt.Appendf([]byte{1}, "entry %d/%d", index, term)}
}

// run returns entries first, first+1, ... with the given terms.
func run(first uint64, terms ...uint64) []raftpb.Entry {
	out := make([]raftpb.Entry, len(terms))
	for i, t := range terms {
		out[i] = ent(first+uint64(i), t)
	}
	return out
}

type fixture struct {
	fs *vfs.MemFS
	o  seglog.Options
	l  *seglog.Log
	s  *Storage
}

// newFixture builds a Storage whose log starts after a snapshot at
// (snapIndex, snapTerm) and then holds entries with terms.
func newFixture(t *testing.T, snapIndex, snapTerm uint64, terms ...uint64) *fixture {
	t.Helper()
	f := &fixture{fs: vfs.NewMem()}
	f.o = seglog.Options{FS: f.fs, Dir: "log", SegmentBytes: 4096}
	f.open(t)
	if snapIndex > 0 {
		if err := f.l.ResetTo(snapIndex, snapTerm); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.s.Append(run(snapIndex+1, terms...)); err != nil {
		t.Fatal(err)
	}
	if err := f.s.Sync(); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) open(t *testing.T) {
	t.Helper()
	l, err := seglog.Open(f.o)
	if err != nil {
		t.Fatal(err)
	}
	f.l, f.s = l, New(l, Options{})
	t.Cleanup(func() { _ = l.Close() })
}

// reopen closes the log and opens it again: a Storage with a cold cache.
func (f *fixture) reopen(t *testing.T) {
	t.Helper()
	if err := f.l.Close(); err != nil {
		t.Fatal(err)
	}
	f.open(t)
}

func equalEntries(t *testing.T, got, want []raftpb.Entry) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d entries, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Index != w.Index || g.Term != w.Term || g.Type != w.Type || !bytes.Equal(g.Data, w.Data) {
			t.Fatalf("entry %d: got %v, want %v", i, got[i], want[i])
		}
	}
}

func TestStorageTerm(t *testing.T) {
	f := newFixture(t, 3, 3, 4, 5)
	for _, cold := range []bool{false, true} {
		if cold {
			f.reopen(t)
		}
		for _, tc := range []struct {
			i, term uint64
			err     error
		}{{2, 0, raft.ErrCompacted}, {3, 3, nil}, {4, 4, nil}, {5, 5, nil}, {6, 0, raft.ErrUnavailable}} {
			term, err := f.s.Term(tc.i)
			if err != tc.err || term != tc.term { // raft compares errors with ==
				t.Fatalf("cold=%v Term(%d) = %d, %v; want %d, %v", cold, tc.i, term, err, tc.term, tc.err)
			}
		}
	}
}

func TestStorageEntries(t *testing.T) {
	f := newFixture(t, 3, 3, 4, 5, 6)
	ents := run(4, 4, 5, 6)
	sz := func(es ...raftpb.Entry) uint64 {
		var n uint64
		for _, e := range es {
			n += uint64(e.Size())
		}
		return n
	}
	cases := []struct {
		lo, hi, maxSize uint64
		err             error
		want            []raftpb.Entry
	}{
		{2, 6, noLimit, raft.ErrCompacted, nil},
		{3, 4, noLimit, raft.ErrCompacted, nil},
		{4, 5, noLimit, nil, ents[:1]},
		{4, 6, noLimit, nil, ents[:2]},
		{4, 7, noLimit, nil, ents},
		{4, 8, noLimit, raft.ErrUnavailable, nil},
		{4, 7, 0, nil, ents[:1]}, // at least one entry
		{4, 7, sz(ents[0], ents[1]), nil, ents[:2]},
		{4, 7, sz(ents[0], ents[1]) + sz(ents[2])/2, nil, ents[:2]},
		{4, 7, sz(ents...) - 1, nil, ents[:2]},
		{4, 7, sz(ents...), nil, ents},
	}
	for _, cold := range []bool{false, true} {
		if cold {
			f.reopen(t)
		}
		for _, tc := range cases {
			got, err := f.s.Entries(tc.lo, tc.hi, tc.maxSize)
			if err != tc.err {
				t.Fatalf("cold=%v Entries(%d, %d, %d): %v, want %v", cold, tc.lo, tc.hi, tc.maxSize, err, tc.err)
			}
			equalEntries(t, got, tc.want)
		}
		if reads := f.s.DiskReads(); cold != (reads > 0) {
			t.Fatalf("cold=%v: %d disk reads", cold, reads)
		}
	}
}

// TestStorageEntriesCacheAndDisk: a range that starts on disk and ends in the
// cache comes back whole, and evicting past CacheBytesMax keeps it correct.
func TestStorageEntriesCacheAndDisk(t *testing.T) {
	f := newFixture(t, 0, 0, 1, 1, 1)
	f.reopen(t)
	f.s = New(f.l, Options{CacheBytesMax: 200})
	terms := make([]uint64, 40)
	for i := range terms {
		terms[i] = 2
	}
	if err := f.s.Append(run(4, terms...)); err != nil {
		t.Fatal(err)
	}
	if f.s.cacheBytes > 200 || len(f.s.cache) == 0 {
		t.Fatalf("cache %d entries, %d bytes", len(f.s.cache), f.s.cacheBytes)
	}
	got, err := f.s.Entries(1, 44, noLimit)
	if err != nil {
		t.Fatal(err)
	}
	equalEntries(t, got, append(run(1, 1, 1, 1), run(4, terms...)...))
	f.s.SetApplied(43)
	if len(f.s.cache) != 0 || f.s.cacheBytes != 0 {
		t.Fatalf("after SetApplied: %d entries, %d bytes cached", len(f.s.cache), f.s.cacheBytes)
	}
}

func TestStorageLastAndFirstIndex(t *testing.T) {
	f := newFixture(t, 3, 3, 4, 5)
	if last, _ := f.s.LastIndex(); last != 5 {
		t.Fatalf("LastIndex %d", last)
	}
	if first, _ := f.s.FirstIndex(); first != 4 {
		t.Fatalf("FirstIndex %d", first)
	}
	if err := f.s.Append(run(6, 5)); err != nil {
		t.Fatal(err)
	}
	if last, _ := f.s.LastIndex(); last != 6 {
		t.Fatalf("LastIndex after append %d", last)
	}
}

// TestStorageCompact: compaction is by whole segments; the term of the entry
// before the new first index stays known, and entries before it are gone.
func TestStorageCompact(t *testing.T) {
	terms := make([]uint64, 200)
	for i := range terms {
		terms[i] = 1 + uint64(i/50)
	}
	f := newFixture(t, 0, 0, terms...)
	if err := f.s.Compact(120); err != nil {
		t.Fatal(err)
	}
	first, _ := f.s.FirstIndex()
	if first <= 1 || first > 120 {
		t.Fatalf("FirstIndex %d after Compact(120)", first)
	}
	if term, err := f.s.Term(first - 1); err != nil || term != terms[first-2] {
		t.Fatalf("Term(%d) = %d, %v", first-1, term, err)
	}
	if _, err := f.s.Term(first - 2); err != raft.ErrCompacted {
		t.Fatalf("Term before the start: %v", err)
	}
	if _, err := f.s.Entries(first-1, first+1, noLimit); err != raft.ErrCompacted {
		t.Fatalf("Entries before the start: %v", err)
	}
	f.reopen(t)
	if got, _ := f.s.FirstIndex(); got != first {
		t.Fatalf("FirstIndex after reopen %d, want %d", got, first)
	}
	if term, err := f.s.Term(first - 1); err != nil || term != terms[first-2] {
		t.Fatalf("Term(%d) after reopen = %d, %v", first-1, term, err)
	}
}

func TestStorageCreateSnapshot(t *testing.T) {
	f := newFixture(t, 3, 3, 4, 5)
	cs := &raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	snap, err := f.s.CreateSnapshot(4, cs, []byte("data"))
	if err != nil {
		t.Fatal(err)
	}
	md := snap.Metadata
	if md.Index != 4 || md.Term != 4 || !reflect.DeepEqual(md.ConfState, *cs) || string(snap.Data) != "data" {
		t.Fatalf("snapshot %v", snap)
	}
	if got, err := f.s.Snapshot(); err != nil || !reflect.DeepEqual(got, *snap) {
		t.Fatalf("Snapshot() = %v, %v", got, err)
	}
	if _, err := f.s.CreateSnapshot(4, cs, nil); err != raft.ErrSnapOutOfDate {
		t.Fatalf("older snapshot: %v", err)
	}
	// A snapshot source takes over, and can be cleared again.
	src := &raftpb.Snapshot{Data: []byte("from the partition"), Metadata: raftpb.SnapshotMetadata{Index: uint64(5), Term: uint64(5)}}
	f.s.SetSnapshotSource(func() (*raftpb.Snapshot, error) { return src, nil })
	if got, err := f.s.Snapshot(); err != nil || !reflect.DeepEqual(got, *src) {
		t.Fatalf("Snapshot() with a source = %v, %v", got, err)
	}
	f.s.SetSnapshotSource(nil)
	if got, err := f.s.Snapshot(); err != nil || !reflect.DeepEqual(got, *snap) {
		t.Fatalf("Snapshot() after clearing the source = %v, %v", got, err)
	}
}

func TestStorageAppend(t *testing.T) {
	cases := []struct {
		in   []raftpb.Entry
		want []uint64 // terms of entries 4.. after the append
	}{
		{run(1, 1, 2), []uint64{4, 5}},
		{run(3, 3, 4, 5), []uint64{4, 5}},
		{run(3, 3, 6, 6), []uint64{6, 6}},
		{run(3, 3, 4, 5, 5), []uint64{4, 5, 5}},
		{run(2, 3, 3, 5), []uint64{5}},
		{run(4, 5), []uint64{5}},
		{run(6, 5), []uint64{4, 5, 5}},
	}
	for i, tc := range cases {
		f := newFixture(t, 3, 3, 4, 5)
		if err := f.s.Append(tc.in); err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		for _, cold := range []bool{false, true} {
			if cold {
				f.reopen(t)
			}
			got, err := f.s.Entries(4, 4+uint64(len(tc.want)), noLimit)
			if err != nil {
				t.Fatalf("case %d cold=%v: %v", i, cold, err)
			}
			for j, term := range tc.want {
				if got[j].Term != term {
					t.Fatalf("case %d cold=%v: entry %d term %d, want %d", i, cold, 4+j, got[j].Term, term)
				}
			}
			if last, _ := f.s.LastIndex(); last != 3+uint64(len(tc.want)) {
				t.Fatalf("case %d cold=%v: LastIndex %d", i, cold, last)
			}
		}
	}
	// A gap is refused, and so is a normal entry in a reserved type.
	f := newFixture(t, 3, 3, 4, 5)
	if err := f.s.Append(run(7, 5)); !errors.Is(err, ErrBadEntry) {
		t.Fatalf("gap: %v", err)
	}
	bad := ent(6, 5)
	bad.Data[0] = TypeNoop
	if err := f.s.Append([]raftpb.Entry{bad}); !errors.Is(err, ErrReservedType) {
		t.Fatalf("reserved type: %v", err)
	}
}

// TestStorageEntryKinds: no-ops and configuration changes survive the trip
// through records, from the cache and from disk.
func TestStorageEntryKinds(t *testing.T) {
	f := newFixture(t, 0, 0)
	cc := &raftpb.ConfChange{Type: raftpb.ConfChangeAddNode, NodeID: 2}
	ccData, _ := cc.Marshal()
	ents := []raftpb.Entry{
		{Index: 1, Term: 1, Type: raftpb.EntryNormal},
		{Index: 2, Term: 1, Type: raftpb.EntryConfChange, Data: ccData},
		{Index: 3, Term: 1, Type: raftpb.EntryConfChangeV2, Data: []byte{8, 1}},
		ent(4, 1),
	}
	if err := f.s.Append(ents); err != nil {
		t.Fatal(err)
	}
	if err := f.s.Sync(); err != nil {
		t.Fatal(err)
	}
	for _, cold := range []bool{false, true} {
		if cold {
			f.reopen(t)
		}
		got, err := f.s.Entries(1, 5, noLimit)
		if err != nil {
			t.Fatal(err)
		}
		equalEntries(t, got, ents)
	}
	var types []uint8
	_ = f.l.Scan(0, func(r seglog.Record) error { types = append(types, r.Type); return nil })
	if fmt.Sprint(types) != fmt.Sprint([]uint8{TypeNoop, TypeConfChange, TypeConfChangeV2, 1}) {
		t.Fatalf("record types %v", types)
	}
}

func TestStorageApplySnapshot(t *testing.T) {
	cs := &raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	snap := func(i, term uint64) *raftpb.Snapshot {
		return &raftpb.Snapshot{Data: []byte("data"), Metadata: raftpb.SnapshotMetadata{Index: i, Term: term, ConfState: *cs}}
	}
	f := newFixture(t, 0, 0, 1, 1)
	if err := f.s.ApplySnapshot(snap(4, 4)); err != nil {
		t.Fatal(err)
	}
	if err := f.s.ApplySnapshot(snap(3, 3)); err != raft.ErrSnapOutOfDate {
		t.Fatalf("older snapshot: %v", err)
	}
	f.reopen(t)
	first, _ := f.s.FirstIndex()
	last, _ := f.s.LastIndex()
	if term, err := f.s.Term(4); first != 5 || last != 4 || err != nil || term != 4 {
		t.Fatalf("after snapshot: first %d last %d Term(4) = %d, %v", first, last, term, err)
	}
	if _, gotCS, err := f.s.InitialState(); err != nil || !reflect.DeepEqual(gotCS, *cs) {
		t.Fatalf("InitialState ConfState %v, %v", gotCS, err)
	}
	// Bootstrap: a snapshot with only a ConfState on an empty log.
	g := newFixture(t, 0, 0)
	if err := g.s.ApplySnapshot(&raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{ConfState: *cs}}); err != nil {
		t.Fatalf("bootstrap snapshot: %v", err)
	}
}

func TestStorageInitialState(t *testing.T) {
	f := newFixture(t, 0, 0, 1, 1, 2)
	hs := &raftpb.HardState{Term: uint64(2), Vote: uint64(1), Commit: uint64(3)}
	if err := f.s.SetHardState(hs); err != nil {
		t.Fatal(err)
	}
	f.reopen(t)
	got, cs, err := f.s.InitialState()
	if err != nil || got != *hs || len(cs.Voters) != 0 {
		t.Fatalf("InitialState = %v, %v, %v", got, cs, err)
	}
	if err := f.l.TruncateAfter(2); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.s.InitialState(); err == nil {
		t.Fatal("a commit index past the log was accepted")
	}
}

// Entries handed to raft stay as they were when the cache later drops them
// (SetApplied, or the size bound): raft keeps those slices in its log and in
// messages still in flight to followers.
func TestStorageEntriesUnchangedAfterCacheDrops(t *testing.T) {
	f := newFixture(t, 0, 0)
	f.s = New(f.l, Options{CacheBytesMax: 200})
	terms := make([]uint64, 10)
	for i := range terms {
		terms[i] = 1
	}
	if err := f.s.Append(run(1, terms...)); err != nil {
		t.Fatal(err)
	}
	got, err := f.s.Entries(1, 11, noLimit)
	if err != nil {
		t.Fatal(err)
	}
	want := run(1, terms...)
	equalEntries(t, got, want)
	f.s.SetApplied(6)
	more := make([]uint64, 40)
	for i := range more {
		more[i] = 1
	}
	if err := f.s.Append(run(11, more...)); err != nil { // evicts by size too
		t.Fatal(err)
	}
	for i, e := range got {
		if e.Index == 0 || e.Data == nil {
			t.Fatalf("entry %d of a slice Entries returned was cleared", i+1)
		}
	}
	equalEntries(t, got, want)
}

// TestStorageCacheBoundCountsEntries: a tail of tiny entries stays within
// CacheBytesMax too, because every entry costs its fixed overhead.
func TestStorageCacheBoundCountsEntries(t *testing.T) {
	f := newFixture(t, 0, 0)
	f.s = New(f.l, Options{CacheBytesMax: 10_000})
	for i := uint64(1); i <= 1000; i++ {
		e := ent(i, 1)
		e.Data = []byte{1, byte(i)}
		if err := f.s.Append([]raftpb.Entry{e}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(f.s.cache); n*cacheEntryBytes > 10_000 || f.s.cacheBytes > 10_000 || n == 0 {
		t.Fatalf("%d entries cached, %d bytes counted, for a 10,000-byte bound", n, f.s.cacheBytes)
	}
	if got, err := f.s.Entries(1, 1001, noLimit); err != nil || len(got) != 1000 || got[999].Data[1] != byte(1000%256) {
		t.Fatalf("Entries: %d, %v", len(got), err)
	}
}

// TestStorageSharedBudget: two groups' caches on one node budget. The group
// that stopped appending holds the coldest entries and gives them back; its
// entries are then read from the log, unchanged. Applying and closing give
// every byte back to the budget.
func TestStorageSharedBudget(t *testing.T) {
	const limit = 8 << 10 // chunks of 1 KiB
	bud := budget.New("raft_cache", limit)
	idle := newFixture(t, 0, 0)
	busy := newFixture(t, 0, 0)
	idle.s = New(idle.l, Options{Budget: bud})
	busy.s = New(busy.l, Options{Budget: bud})
	terms := func(n int) []uint64 {
		ts := make([]uint64, n)
		for i := range ts {
			ts[i] = 1
		}
		return ts
	}
	idleEnts := run(1, terms(40)...)
	if err := idle.s.Append(idleEnts); err != nil {
		t.Fatal(err)
	}
	if idle.s.cacheBytes == 0 {
		t.Fatal("nothing cached under the limit")
	}
	for i := uint64(1); i <= 400; i += 10 {
		if err := busy.s.Append(run(i, terms(10)...)); err != nil {
			t.Fatal(err)
		}
		if u := bud.Used(); u > limit {
			t.Fatalf("after index %d: budget used %d above %d", i+9, u, limit)
		}
	}
	if idle.s.cacheBytes != 0 {
		t.Fatalf("the idle group kept %d cached bytes", idle.s.cacheBytes)
	}
	if busy.s.cacheBytes < limit/2 {
		t.Fatalf("the busy group caches only %d bytes of %d", busy.s.cacheBytes, limit)
	}
	for _, f := range []*fixture{idle, busy} {
		if err := f.s.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	got, err := idle.s.Entries(1, 41, noLimit)
	if err != nil {
		t.Fatal(err)
	}
	equalEntries(t, got, idleEnts)
	if idle.s.diskReads == 0 {
		t.Fatal("the evicted entries did not come from the log")
	}
	busy.s.SetApplied(300)
	idle.s.Close()
	used := bud.Used()
	if want := int64(busy.s.cacheBytes); used < want || used > want+bud.Chunk() {
		t.Fatalf("budget used %d, the busy cache holds %d", used, want)
	}
	busy.s.SetApplied(400)
	if bud.Used() != 0 {
		t.Fatalf("budget used %d once everything is applied", bud.Used())
	}
	busy.s.Close()
}

// QuietLogger drops raft's lines and turns Fatal and Panic into panics
// carrying the message, never an exit.
func TestQuietLogger(t *testing.T) {
	var l raft.Logger = QuietLogger{}
	l.Infof("%d", 1)
	l.Warning("w")
	l.Errorf("%s", "e")
	for _, f := range []func(){
		func() { l.Fatalf("bad %d", 7) },
		func() { l.Panicf("bad %d", 7) },
	} {
		func() {
			defer func() {
				if r := recover(); r != "bad 7" {
					t.Errorf("recovered %v, want the message", r)
				}
			}()
			f()
		}()
	}
}
