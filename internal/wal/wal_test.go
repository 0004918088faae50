package wal

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
)

func open(t *testing.T, fs vfs.FS, o Options) *WAL {
	t.Helper()
	o.FS, o.Dir = fs, "data/wal"
	mkData(t, fs)
	w, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// mkData makes "data" durable, as a DATA_DIR is before the WAL opens in it.
func mkData(t *testing.T, fs vfs.FS) {
	t.Helper()
	if err := fs.MkdirAll("data", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := fs.SyncDir("."); err != nil {
		t.Fatal(err)
	}
}

func payload(g string, idx, term uint64) []byte {
	return []byte(fmt.Sprintf("%s/%d/%d", g, idx, term))
}

func entries(g string, from, to, term uint64) []Entry {
	var es []Entry
	for i := from; i <= to; i++ {
		es = append(es, Entry{Index: i, Term: term, Type: 1, Payload: payload(g, i, term)})
	}
	return es
}

func TestReplayAfterClose(t *testing.T) {
	fs := vfs.NewMem()
	w := open(t, fs, Options{})
	if err := w.Commit("queues/a/g/p0", Batch{Entries: entries("a", 1, 5, 1), HardState: &HardState{Term: 1, Vote: 1, Commit: 3}}); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit("queues/b/g/p1", Batch{Entries: entries("b", 1, 2, 1)}); err != nil {
		t.Fatal(err)
	}
	// A leader overwrites a's suffix from index 3 in term 2.
	if err := w.Commit("queues/a/g/p0", Batch{Entries: entries("a", 3, 4, 2), HardState: &HardState{Term: 2, Vote: 1, Commit: 4}}); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w = open(t, fs, Options{})
	defer w.Close()
	if got := w.Replayed(); len(got) != 2 {
		t.Fatalf("replayed groups %v", got)
	}
	a, ok := w.Take("queues/a/g/p0")
	if !ok || !a.HasHardState || a.HardState != (HardState{Term: 2, Vote: 1, Commit: 4}) {
		t.Fatalf("a: %+v %v", a.HardState, ok)
	}
	want := append(entries("a", 1, 2, 1), entries("a", 3, 4, 2)...)
	if len(a.Entries) != len(want) {
		t.Fatalf("a has %d entries, want %d", len(a.Entries), len(want))
	}
	for i, e := range a.Entries {
		if e.Index != want[i].Index || e.Term != want[i].Term || !bytes.Equal(e.Payload, want[i].Payload) {
			t.Fatalf("a entry %d = %+v, want %+v", i, e, want[i])
		}
	}
	b, _ := w.Take("queues/b/g/p1")
	if len(b.Entries) != 2 || b.HasHardState {
		t.Fatalf("b: %+v", b)
	}
	if _, ok := w.Take("queues/b/g/p1"); ok {
		t.Fatal("Take twice returned data")
	}
}

func TestInvalid(t *testing.T) {
	if _, err := Open(Options{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Open without FS: %v", err)
	}
	w := open(t, vfs.NewMem(), Options{})
	defer w.Close()
	if err := w.Commit("", Batch{Entries: entries("x", 1, 1, 1)}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("empty group: %v", err)
	}
	if err := w.Commit("g", Batch{Entries: []Entry{{Index: 1, Payload: make([]byte, PayloadBytesMax+1)}}}); !errors.Is(err, ErrRecordTooLarge) {
		t.Fatalf("large: %v", err)
	}
}

func TestStickyFailure(t *testing.T) {
	fs := vfs.NewMem()
	w := open(t, fs, Options{})
	boom := errors.New("boom")
	fs.SetSyncError(boom)
	if err := w.Commit("g", Batch{Entries: entries("g", 1, 1, 1)}); !errors.Is(err, ErrFailed) || !errors.Is(err, boom) {
		t.Fatalf("commit with failing sync: %v", err)
	}
	fs.SetSyncError(nil)
	if err := w.Commit("g", Batch{Entries: entries("g", 2, 2, 1)}); !errors.Is(err, ErrFailed) {
		t.Fatalf("commit after failure: %v", err)
	}
	if err := w.Close(); !errors.Is(err, ErrFailed) {
		t.Fatalf("close: %v", err)
	}
}

func TestDamageInOlderSegmentRefused(t *testing.T) {
	fs := vfs.NewMem()
	w := open(t, fs, Options{SegmentBytes: 4 << 10})
	for i := uint64(1); i <= 1000; i++ {
		if err := w.Commit("g", Batch{Entries: entries("g", i, i, 1)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	names, _ := fs.ReadDir("data/wal")
	if len(names) < 3 {
		t.Fatalf("want several segments, have %v", names)
	}
	if err := fs.FlipBit(filepath.Join("data/wal", names[0]), segHeaderBytes+100, 3); err != nil {
		t.Fatal(err)
	}
	_, err := Open(Options{FS: fs, Dir: "data/wal"})
	var de *DamagedError
	if !errors.Is(err, ErrDamaged) || !errors.As(err, &de) || de.Segment != names[0] {
		t.Fatalf("open over damage: %v", err)
	}
}

func TestDamageMidLastSegmentRefused(t *testing.T) {
	fs := vfs.NewMem()
	w := open(t, fs, Options{})
	for i := uint64(1); i <= 20; i++ {
		if err := w.Commit("g", Batch{Entries: entries("g", i, i, 1)}); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	names, _ := fs.ReadDir("data/wal")
	last := filepath.Join("data/wal", names[len(names)-1])
	// A bit in the first entry's payload: more records follow it.
	if err := fs.FlipBit(last, segHeaderBytes+60+recHeaderBytes+2, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{FS: fs, Dir: "data/wal"}); !errors.Is(err, ErrDamaged) {
		t.Fatalf("open over mid-segment damage: %v", err)
	}
}

func TestTrimAndPressure(t *testing.T) {
	fs := vfs.NewMem()
	var mu sync.Mutex
	asked := map[string]uint64{}
	var w *WAL
	w = open(t, fs, Options{SegmentBytes: 4 << 10, PressureSegments: 4, OnPressure: func(g string, idx uint64) {
		mu.Lock()
		asked[g] = max(asked[g], idx)
		mu.Unlock()
	}})
	// "idle" commits a little and never releases; "busy" releases as it goes.
	if err := w.Commit("idle", Batch{Entries: entries("idle", 1, 3, 1), HardState: &HardState{Term: 1, Commit: 3}}); err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 1000; i++ {
		if err := w.Commit("busy", Batch{Entries: entries("busy", i, i, 1)}); err != nil {
			t.Fatal(err)
		}
		w.Release("busy", i)
	}
	w.Close() // waits for pressure callbacks
	mu.Lock()
	if asked["idle"] != 3 {
		t.Fatalf("pressure asked %v, want idle up to 3", asked)
	}
	mu.Unlock()
	// Segments go oldest first only, so the idle group's segment keeps
	// every later one until it releases.
	n, _ := fs.ReadDir("data/wal")
	if len(n) < 3 || n[0] != segName(1) {
		t.Fatalf("idle group should pin its segment and the later ones, have %v", n)
	}
	// After idle releases, everything but the active segment goes.
	w = open(t, fs, Options{SegmentBytes: 4 << 10})
	g, _ := w.Take("idle")
	if len(g.Entries) != 3 || g.HardState.Commit != 3 {
		t.Fatalf("idle replay %+v", g)
	}
	w.Release("idle", 3)
	w.Release("busy", 1000)
	if err := w.Commit("busy", Batch{Entries: entries("busy", 1001, 1001, 1)}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	n, _ = fs.ReadDir("data/wal")
	if len(n) != 1 {
		t.Fatalf("after release: %v", n)
	}
	// The HardState survives in the one remaining segment.
	w = open(t, fs, Options{})
	defer w.Close()
	g, _ = w.Take("idle")
	if !g.HasHardState || g.HardState.Commit != 3 || len(g.Entries) != 0 {
		t.Fatalf("idle after trim: %+v", g)
	}
}

// TestCrash: concurrent groups commit (some releasing, with small segments so
// rolls and trims happen), the machine crashes at a random moment with torn
// unsynced writes, and every Commit that returned nil must be replayed unless
// its group had released it; the HardState replayed is at least the last
// acknowledged one.
func TestCrash(t *testing.T) {
	seeds := 150
	if testing.Short() {
		seeds = 30
	}
	for seed := range seeds {
		crashOnce(t, uint64(seed))
	}
}

type ack struct {
	mu       sync.Mutex
	last     map[string]uint64 // highest acked index per group
	term     map[string]uint64 // term of acked HardState
	released map[string]uint64
}

func crashOnce(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	fs := vfs.NewMem()
	mkData(t, fs)
	// Half the seeds roll into prepared (zero-filled) segments.
	prep := PrepareNever
	if seed%2 == 1 {
		prep = PrepareAlways
	}
	w, err := Open(Options{FS: fs, Dir: "data/wal", SegmentBytes: int64(1+rng.IntN(8)) << 10, PendingBytesMax: 2 << 10, Prepare: prep})
	if err != nil {
		t.Fatal(err)
	}
	a := &ack{last: map[string]uint64{}, term: map[string]uint64{}, released: map[string]uint64{}}
	groups := 1 + rng.IntN(6)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for gi := range groups {
		g := fmt.Sprintf("queues/t/g/p%d", gi)
		release := gi%2 == 1
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := uint64(1); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := w.Commit(g, Batch{Entries: entries(g, i, i, i), HardState: &HardState{Term: i, Commit: i}}); err != nil {
					return
				}
				a.mu.Lock()
				a.last[g], a.term[g] = i, i
				a.mu.Unlock()
				if release && i%5 == 0 {
					// The group's own files would now hold up to i-3.
					a.mu.Lock()
					a.released[g] = i - 3
					a.mu.Unlock()
					w.Release(g, i-3)
				}
			}
		}()
	}
	// Let some commits through, then crash.
	target := uint64(5 + rng.IntN(200))
	for {
		a.mu.Lock()
		var n uint64
		for _, v := range a.last {
			n += v
		}
		a.mu.Unlock()
		if n >= target {
			break
		}
		runtimeGosched()
	}
	a.mu.Lock()
	img := fs.Crash(rng, true)
	snap := map[string][3]uint64{}
	for g, v := range a.last {
		snap[g] = [3]uint64{v, a.term[g], a.released[g]}
	}
	a.mu.Unlock()
	close(stop)
	wg.Wait()
	w.Close()

	w2, err := Open(Options{FS: img, Dir: "data/wal"})
	if err != nil {
		t.Fatalf("seed %d: reopen: %v", seed, err)
	}
	for g, s := range snap {
		last, term, rel := s[0], s[1], s[2]
		got, _ := w2.Take(g)
		if !got.HasHardState || got.HardState.Term < term {
			t.Fatalf("seed %d: %s hardstate %+v, acked term %d", seed, g, got.HardState, term)
		}
		have := map[uint64]Entry{}
		for _, e := range got.Entries {
			have[e.Index] = e
		}
		for i := rel + 1; i <= last; i++ {
			e, ok := have[i]
			if !ok {
				t.Fatalf("seed %d: %s lost acked index %d (acked up to %d, released %d)", seed, g, i, last, rel)
			}
			if !bytes.Equal(e.Payload, payload(g, i, i)) || e.Term != i {
				t.Fatalf("seed %d: %s index %d wrong: %+v", seed, g, i, e)
			}
		}
	}
	// The reopened WAL keeps working and a second open is clean.
	if err := w2.Commit("after", Batch{Entries: entries("after", 1, 1, 1)}); err != nil {
		t.Fatalf("seed %d: commit after recovery: %v", seed, err)
	}
	if err := w2.Close(); err != nil {
		t.Fatal(err)
	}
	w3, err := Open(Options{FS: img, Dir: "data/wal"})
	if err != nil {
		t.Fatalf("seed %d: third open: %v", seed, err)
	}
	w3.Close()
}

var _ = os.O_RDONLY

func runtimeGosched() { runtime.Gosched() }

// Entries committed at indexes the group had released (a follower
// overwriting its suffix, or a group name used again) are not released
// with the old ones: the WAL keeps them, through rolls and trims, until the
// group releases them again, and replay returns them over the old ones.
func TestCommitBelowReleaseIsKept(t *testing.T) {
	fs := vfs.NewMem()
	w := open(t, fs, Options{SegmentBytes: 4096})
	g := "queues/jobs/_/p0"
	if err := w.Commit(g, Batch{Entries: entries(g, 1, 50, 1)}); err != nil {
		t.Fatal(err)
	}
	w.Release(g, 50)
	// Entries 1..3 again, with a new term; the group's own files do not
	// hold them durably yet.
	if err := w.Commit(g, Batch{Entries: entries(g, 1, 3, 2)}); err != nil {
		t.Fatal(err)
	}
	// Another group's traffic rolls and trims the WAL.
	other := "queues/other/_/p0"
	for i := uint64(1); i <= 200; i++ {
		if err := w.Commit(other, Batch{Entries: entries(other, i, i, 1)}); err != nil {
			t.Fatal(err)
		}
	}
	w.Release(other, 200)
	for i := uint64(201); i <= 260; i++ {
		if err := w.Commit(other, Batch{Entries: entries(other, i, i, 1)}); err != nil {
			t.Fatal(err)
		}
	}
	crashed := fs.Crash(rand.New(rand.NewPCG(1, 1)), false)
	w.Close()
	w2, err := Open(Options{FS: crashed, Dir: "data/wal"})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	got, _ := w2.Take(g)
	if len(got.Entries) != 3 || got.Entries[0].Index != 1 || got.Entries[2].Index != 3 || got.Entries[0].Term != 2 {
		t.Fatalf("replayed %d entries %v, want 1..3 of term 2", len(got.Entries), got.Entries)
	}
}

// HasSegments: a missing directory has none, a directory of other files
// has none, one segment is enough, and an unreadable path is an error.
func TestHasSegments(t *testing.T) {
	fs := vfs.NewMem()
	if has, err := HasSegments(fs, "data/wal"); has || err != nil {
		t.Fatalf("missing dir: %v %v", has, err)
	}
	mkData(t, fs)
	if err := fs.MkdirAll("data/wal", 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := fs.OpenFile("data/wal/notes.txt", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if has, err := HasSegments(fs, "data/wal"); has || err != nil {
		t.Fatalf("dir without segments: %v %v", has, err)
	}
	w := open(t, fs, Options{})
	w.Close()
	if has, err := HasSegments(fs, "data/wal"); !has || err != nil {
		t.Fatalf("dir with a segment: %v %v", has, err)
	}
	if _, err := HasSegments(fs, "data/wal/notes.txt"); err == nil {
		t.Fatal("a file read as a directory: no error")
	}
}

// Retire deletes the segments only when every entry is released and every
// replayed group was taken.
func TestRetire(t *testing.T) {
	fs := vfs.NewMem()
	w := open(t, fs, Options{SegmentBytes: 4096})
	g := "queues/a/_/p0"
	if err := w.Commit(g, Batch{Entries: entries(g, 1, 40, 1)}); err != nil {
		t.Fatal(err)
	}
	w.Release(g, 39)
	if retired, err := w.Retire(); retired || err != nil {
		t.Fatalf("retire with entry 40 unreleased: %v %v", retired, err)
	}
	// Reopened, the group is replayed; untaken, it keeps the WAL.
	w, err := Open(Options{FS: fs, Dir: "data/wal"})
	if err != nil {
		t.Fatal(err)
	}
	if retired, err := w.Retire(); retired || err != nil {
		t.Fatalf("retire with a replayed group not taken: %v %v", retired, err)
	}
	w, err = Open(Options{FS: fs, Dir: "data/wal"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := w.Take(g); !ok {
		t.Fatal("nothing replayed")
	}
	w.Release(g, 40)
	if retired, err := w.Retire(); !retired || err != nil {
		t.Fatalf("retire with everything released: %v %v", retired, err)
	}
	if has, err := HasSegments(fs, "data/wal"); has || err != nil {
		t.Fatalf("segments left after retiring: %v %v", has, err)
	}
}

// Groups committed once and forgotten (queues created and deleted) stop
// being tracked once no segment holds their entries, and a name forgotten
// and then used again replays under its new id.
func TestForgottenGroupsAreNotTrackedForever(t *testing.T) {
	fs := vfs.NewMem()
	w := open(t, fs, Options{SegmentBytes: 4096})
	for i := range 2000 {
		g := "queues/jobs/_/p0@" + fmt.Sprint(i)
		if err := w.Commit(g, Batch{Entries: entries(g, 1, 1, 1)}); err != nil {
			t.Fatal(err)
		}
		w.Forget(g)
	}
	w.mu.Lock()
	nr, ni := len(w.released), len(w.ids)
	w.mu.Unlock()
	if nr > 100 || ni > 100 {
		t.Fatalf("after 2000 groups committed and forgotten the WAL still tracks %d released and %d ids", nr, ni)
	}
	// A forgotten name used again: its entries replay.
	g := "queues/jobs/_/p0@1999"
	if err := w.Commit(g, Batch{Entries: entries(g, 1, 2, 2)}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	w2, err := Open(Options{FS: fs, Dir: "data/wal"})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	got, _ := w2.Take(g)
	if len(got.Entries) != 2 || got.Entries[0].Term != 2 {
		t.Fatalf("the name used again replays %v", got.Entries)
	}
}

// A release based on a sync taken before a commit rewrote released
// indexes is ignored; one taken after counts.
func TestReleaseSinceIgnoresAStaleSync(t *testing.T) {
	fs := vfs.NewMem()
	w := open(t, fs, Options{})
	defer w.Close()
	g := "queues/r/_/p0"
	if err := w.Commit(g, Batch{Entries: entries(g, 1, 10, 1)}); err != nil {
		t.Fatal(err)
	}
	w.Release(g, 10)
	mark := w.Mark(g) // a sync of the group's own log starts here
	// Meanwhile the group overwrites 6..10 with a new term.
	if err := w.Commit(g, Batch{Entries: entries(g, 6, 10, 2)}); err != nil {
		t.Fatal(err)
	}
	w.ReleaseSince(g, 10, mark) // the sync that may predate the overwrite
	w.mu.Lock()
	got := w.released[g]
	w.mu.Unlock()
	if got != 5 {
		t.Fatalf("released %d after a stale release, want 5", got)
	}
	w.ReleaseSince(g, 10, w.Mark(g))
	w.mu.Lock()
	got = w.released[g]
	w.mu.Unlock()
	if got != 10 {
		t.Fatalf("released %d after a fresh release, want 10", got)
	}
}

// pad commits and releases entries of a group of its own until the WAL has
// rolled at least n times.
func pad(t *testing.T, w *WAL, n int) {
	t.Helper()
	start, _ := w.Segments()
	for i := uint64(1); ; i++ {
		if k, _ := w.Segments(); k >= start+n {
			return
		}
		idx := w.padNext()
		if err := w.Commit("pad", Batch{Entries: entries("pad", idx, idx, 1)}); err != nil {
			t.Fatal(err)
		}
		w.Release("pad", idx)
		if i > 10000 {
			t.Fatal("the WAL never rolled")
		}
	}
}

// TestReplayKeepsTheLastWriteAcrossTrim: an index written twice, the first
// write in a segment another group pins and the second in a later segment
// that holds nothing unreleased. Replay must give the second write; a WAL
// that deleted the later segment alone would give the first.
func TestReplayKeepsTheLastWriteAcrossTrim(t *testing.T) {
	fs := vfs.NewMem()
	w := open(t, fs, Options{SegmentBytes: 512})
	if err := w.Commit("pin", Batch{Entries: entries("pin", 1, 1, 1)}); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit("g", Batch{Entries: entries("g", 1, 6, 1)}); err != nil {
		t.Fatal(err)
	}
	pad(t, w, 1)
	// A new leader overwrites index 6; the group's files then hold it.
	if err := w.Commit("g", Batch{Entries: entries("g", 6, 6, 2)}); err != nil {
		t.Fatal(err)
	}
	w.Release("g", 6)
	pad(t, w, 2)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w = open(t, fs, Options{SegmentBytes: 512})
	defer w.Close()
	g, ok := w.Take("g")
	if !ok || len(g.Entries) == 0 {
		t.Fatalf("g replayed nothing: %+v", g)
	}
	last := g.Entries[len(g.Entries)-1]
	if last.Index != 6 || last.Term != 2 {
		t.Fatalf("replay ends with %d@%d, want the last write 6@2", last.Index, last.Term)
	}
}

// TestResetVoidsEarlierEntries: entries before a reset are not replayed and
// no longer keep their segments.
func TestResetVoidsEarlierEntries(t *testing.T) {
	fs := vfs.NewMem()
	w := open(t, fs, Options{SegmentBytes: 512})
	if err := w.Commit("g", Batch{Entries: entries("g", 1, 9, 1)}); err != nil {
		t.Fatal(err)
	}
	pad(t, w, 2)
	// A snapshot at 20 replaced the group's files; its log restarts at 21.
	if err := w.Commit("g", Batch{Reset: true, HardState: &HardState{Term: 3, Commit: 20}}); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit("g", Batch{Entries: entries("g", 21, 22, 3)}); err != nil {
		t.Fatal(err)
	}
	pad(t, w, 1)
	if n, _ := fs.ReadDir("data/wal"); len(n) != 2 || n[0] == segName(1) {
		t.Fatalf("voided entries still pin segments: %v", n)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	w = open(t, fs, Options{SegmentBytes: 512})
	defer w.Close()
	g, _ := w.Take("g")
	if len(g.Entries) != 2 || g.Entries[0].Index != 21 || g.HardState.Commit != 20 {
		t.Fatalf("after reset: %+v", g)
	}
	// A reset in the same segment as the entries it voids.
	if err := w.Commit("h", Batch{Entries: entries("h", 1, 3, 1)}); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit("h", Batch{Reset: true, Entries: entries("h", 7, 7, 2)}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	w = open(t, fs, Options{SegmentBytes: 512})
	defer w.Close()
	h, _ := w.Take("h")
	if len(h.Entries) != 1 || h.Entries[0].Index != 7 {
		t.Fatalf("h after reset: %+v", h)
	}
}

// TestPreparedSegments: with PrepareAlways the segments after the first are
// prepared full of zeros; everything committed replays across them, and no
// prepared file is left after Close.
func TestPreparedSegments(t *testing.T) {
	fs := vfs.NewMem()
	w := open(t, fs, Options{SegmentBytes: 2 << 10, Prepare: PrepareAlways})
	for i := uint64(1); i <= 200; i++ {
		if err := w.Commit("g", Batch{Entries: entries("g", i, i, 1)}); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := w.Segments(); n < 3 {
		t.Fatalf("%d segments: the test never rolled", n)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	names, _ := fs.ReadDir("data/wal")
	for _, n := range names {
		if n == preparedName {
			t.Fatalf("a prepared segment was left after Close: %v", names)
		}
	}
	if w.rolledPrepared < 2 {
		t.Fatalf("%d rolls took a prepared segment, want every one after the first", w.rolledPrepared)
	}
	w = open(t, fs, Options{SegmentBytes: 2 << 10, Prepare: PrepareAlways})
	defer w.Close()
	g, _ := w.Take("g")
	if len(g.Entries) != 200 || g.Entries[199].Index != 200 {
		t.Fatalf("replayed %d entries", len(g.Entries))
	}
}

// noSpaceForPrepared fails every write to the prepared segment, as a full
// disk does.
type noSpaceForPrepared struct{ vfs.FS }

func (f noSpaceForPrepared) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil || filepath.Base(name) != preparedName {
		return file, err
	}
	return noSpaceFile{file}, nil
}

type noSpaceFile struct{ vfs.File }

func (noSpaceFile) WriteAt([]byte, int64) (int, error) {
	return 0, errors.New("no space left on device")
}

// TestPrepareFailureIsNotFatal: a prepared segment that cannot be written
// (a full disk) leaves the WAL working on reserved segments.
func TestPrepareFailureIsNotFatal(t *testing.T) {
	fs := vfs.NewMem()
	mkData(t, fs)
	w, err := Open(Options{FS: noSpaceForPrepared{fs}, Dir: "data/wal", SegmentBytes: 2 << 10, Prepare: PrepareAlways})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 400; i++ {
		if err := w.Commit("g", Batch{Entries: entries("g", i, i, 1)}); err != nil {
			t.Fatalf("commit %d with a failing preparation: %v", i, err)
		}
	}
	if n, _ := w.Segments(); n < 3 {
		t.Fatalf("%d segments: the test never rolled", n)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSyncInterval: with SyncIntervalMs a Commit returns once written, and
// only a tick (or Close) makes it durable: a power loss before the tick
// loses it, after the tick keeps it.
func TestSyncInterval(t *testing.T) {
	synctest.Test(t, testSyncInterval)
}

func testSyncInterval(t *testing.T) {
	for _, tick := range []bool{false, true} {
		fs := vfs.NewMem()
		mkData(t, fs)
		ticks := make(chan time.Time)
		w, err := Open(Options{FS: fs, Dir: "data/wal", SyncIntervalMs: 100,
			NewTicker: func(time.Duration) (<-chan time.Time, func()) { return ticks, func() {} }})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Commit("g", Batch{Entries: entries("g", 1, 1, 1)}); err != nil {
			t.Fatal(err)
		}
		if tick {
			ticks <- time.Time{}
			synctest.Wait() // the writer has acted on the tick
		}
		after := fs.Crash(rand.New(rand.NewPCG(1, 1)), false)
		w.Close() // the crashed FS refuses it
		w2, err := Open(Options{FS: after, Dir: "data/wal"})
		if err != nil {
			t.Fatal(err)
		}
		g, _ := w2.Take("g")
		w2.Close()
		if tick && len(g.Entries) != 1 {
			t.Fatalf("a commit synced by the tick was lost: %+v", g)
		}
		if !tick && len(g.Entries) != 0 {
			t.Fatalf("a commit before any tick survived a power loss: %+v (it was never fsynced)", g)
		}
	}
}
