package seglog

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/vfs"
)

// raftPayload identifies one AppendAt call: its index, term and a sequence
// number unique across the test, then filler derived from them.
func raftPayload(index, term, seq uint64) []byte {
	r := rand.New(rand.NewPCG(seq, index))
	b := make([]byte, 24+r.IntN(300))
	binary.LittleEndian.PutUint64(b[0:], index)
	binary.LittleEndian.PutUint64(b[8:], term)
	binary.LittleEndian.PutUint64(b[16:], seq)
	for i := 24; i < len(b); i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

// raftModel is what the test knows independent of the log.
//
//   - acked[j]: the payload at j known durable (a Sync covered it, and no
//     TruncateAfter or ResetTo that removed it has returned since).
//   - cands[j]: every payload appended at j that no returned TruncateAfter
//     or ResetTo has removed; whatever recovery finds at j must be one.
//   - inflight: the call running when the crash fired (its effects may or
//     may not have happened).
type raftModel struct {
	acked      map[uint64][]byte
	cands      map[uint64][][]byte
	start      uint64 // the log's start point (FirstLSN-1) after the last returned ResetTo
	startTerm  uint64
	next       uint64 // NextLSN as the driver sees it
	term       uint64 // the highest term used so far
	seq        uint64
	inflight   string
	inflightAt uint64 // the index argument of the in-flight call
	inflightT  uint64 // its term (ResetTo)
}

func (m *raftModel) removeAfter(i uint64) {
	for j := range m.cands {
		if j > i {
			delete(m.cands, j)
			delete(m.acked, j)
		}
	}
}

// TestCrashRaftOps drives AppendAt (including conflicting overwrites),
// TruncateAfter, ResetTo and Sync against a MemFS, crashes at a random
// file-system operation with torn writes, reopens and checks that every
// durable record is there with its bytes, that no record removed by a
// returned TruncateAfter or ResetTo comes back, and that terms and the start
// point are right.
func TestCrashRaftOps(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 60
	}
	var stats [4]int // crashes during: append/sync, truncate, reset, none
	for seed := range uint64(seeds) {
		if !raftCrashSeed(t, seed, &stats) {
			t.Fatalf("seed %d failed", seed)
		}
	}
	t.Logf("%d seeds; crashes in append/sync %d, truncate %d, reset %d, after the ops %d",
		seeds, stats[0], stats[1], stats[2], stats[3])
	if stats[1] == 0 || stats[2] == 0 {
		t.Error("no crash fell inside a truncate or a reset: the test no longer covers them")
	}
}

func raftCrashSeed(t *testing.T, seed uint64, stats *[4]int) bool {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x7A5F))
	fs := vfs.NewMem()
	cfs := &crashFS{MemFS: fs}
	o := Options{
		FS: cfs, Dir: "log",
		SegmentBytes:       int64(4096 << rng.IntN(2)),
		IndexIntervalBytes: 64 << rng.IntN(4),
		Preallocate:        PreallocMode(rng.IntN(3)),
		BufferBytes:        1024 << rng.IntN(3),
		reserveStepMin:     int64(512 << rng.IntN(3)),
	}
	m := &raftModel{acked: map[uint64][]byte{}, cands: map[uint64][][]byte{}, next: 1, term: 1}
	for round := range 3 {
		l, err := Open(o)
		if err != nil {
			t.Errorf("seed %d round %d: Open: %v", seed, round, err)
			return false
		}
		if !checkRaftModel(t, seed, l, m) {
			_ = l.Close()
			return false
		}
		// What survived is durable now: it becomes the new baseline.
		m.acked, m.cands = map[uint64][]byte{}, map[uint64][][]byte{}
		m.start, m.next = l.FirstLSN()-1, l.NextLSN()
		m.startTerm, _ = l.Term(m.start)
		_ = l.Scan(0, func(r Record) error {
			p := slices.Clone(r.Payload)
			m.acked[r.LSN], m.cands[r.LSN] = p, [][]byte{p}
			return nil
		})
		m.term = max(m.term, l.LastTerm())
		m.inflight = ""

		var (
			mu      sync.Mutex
			current = "none"
			crashed string
			image   *vfs.MemFS
		)
		crash := func() {
			mu.Lock()
			defer mu.Unlock()
			if image == nil {
				crashed = current
				image = cfs.Crash(rand.New(rand.NewPCG(seed, uint64(round))), true)
			}
		}
		cfs.arm(1+int64(rng.IntN(120)), crash)
		set := func(op string, at, term uint64) {
			mu.Lock()
			current = op
			mu.Unlock()
			m.inflight, m.inflightAt, m.inflightT = op, at, term
		}
		done := func() bool {
			mu.Lock()
			defer mu.Unlock()
			current = "none"
			return image != nil
		}
		for range 40 + rng.IntN(120) {
			switch k := rng.IntN(20); {
			case k < 11: // append at the end, sometimes in a new term
				if rng.IntN(8) == 0 {
					m.term++
				}
				set("append", m.next, 0)
				m.seq++
				p := raftPayload(m.next, m.term, m.seq)
				if err := l.AppendAt(m.next, m.term, 1, p); err == nil {
					m.cands[m.next] = append(m.cands[m.next], p)
					m.next++
				}
			case k < 14: // a new leader overwrites a suffix
				if m.next-1 <= m.start {
					continue
				}
				at := m.start + 1 + uint64(rng.IntN(int(m.next-1-m.start)))
				m.term++
				set("truncate", at-1, 0)
				m.seq++
				p := raftPayload(at, m.term, m.seq)
				if err := l.AppendAt(at, m.term, 1, p); err == nil {
					m.removeAfter(at - 1)
					m.cands[at] = append(m.cands[at], p)
					m.next = at + 1
				}
			case k < 16:
				at := m.start + uint64(rng.IntN(int(m.next-m.start)))
				set("truncate", at, 0)
				if err := l.TruncateAfter(at); err == nil {
					m.removeAfter(at)
					m.next = min(m.next, at+1)
				}
			case k < 17:
				at := m.start + uint64(rng.IntN(int(m.next-m.start)+20))
				m.term++
				set("reset", at, m.term)
				if err := l.ResetTo(at, m.term); err == nil {
					m.acked, m.cands = map[uint64][]byte{}, map[uint64][][]byte{}
					m.start, m.startTerm, m.next = at, m.term, at+1
				}
			default:
				set("sync", 0, 0)
				if _, err := l.Sync(); err == nil {
					for j, ps := range m.cands {
						m.acked[j] = ps[len(ps)-1]
					}
				}
			}
			if done() {
				break
			}
		}
		crash() // if the ops finished first, crash now
		switch crashed {
		case "truncate":
			stats[1]++
		case "reset":
			stats[2]++
		case "none":
			stats[3]++
			m.inflight = ""
		default:
			stats[0]++
		}
		_ = l.Close()
		cfs = &crashFS{MemFS: image}
		o.FS = cfs
	}
	return true
}

// checkRaftModel checks a freshly opened log against the model.
func checkRaftModel(t *testing.T, seed uint64, l *Log, m *raftModel) bool {
	t.Helper()
	first, next := l.FirstLSN(), l.NextLSN()
	fail := func(format string, args ...any) bool {
		t.Errorf("seed %d (in flight: %s %d): %s", seed, m.inflight, m.inflightAt, fmt.Sprintf(format, args...))
		return false
	}
	if m.inflight == "reset" && first == m.inflightAt+1 && next == first {
		if term, err := l.Term(m.inflightAt); err == nil && term == m.inflightT {
			return true // the reset happened
		}
		// Else the old log must stand (it may look the same but for the term).
	}
	if first != m.start+1 {
		return fail("FirstLSN %d, want %d", first, m.start+1)
	}
	if term, err := l.Term(m.start); err != nil || term != m.startTerm {
		return fail("Term(start %d) = %d, %v; want %d", m.start, term, err, m.startTerm)
	}
	cut := uint64(1<<63 - 1) // indexes above cut may be missing
	if m.inflight == "truncate" {
		cut = m.inflightAt
	}
	for j := range m.acked {
		if j >= next && j <= cut {
			return fail("durable index %d lost (next %d)", j, next)
		}
	}
	prevTerm := m.startTerm
	want := first
	err := l.Scan(0, func(r Record) error {
		if r.LSN != want {
			return fmt.Errorf("scan lsn %d, want %d", r.LSN, want)
		}
		want++
		if r.Term < prevTerm {
			return fmt.Errorf("lsn %d: term %d below %d", r.LSN, r.Term, prevTerm)
		}
		prevTerm = r.Term
		if len(r.Payload) < 24 || binary.LittleEndian.Uint64(r.Payload) != r.LSN ||
			binary.LittleEndian.Uint64(r.Payload[8:]) != r.Term {
			return fmt.Errorf("lsn %d: payload does not match the record's index and term", r.LSN)
		}
		if a, ok := m.acked[r.LSN]; ok && r.LSN <= cut && !bytes.Equal(a, r.Payload) {
			return fmt.Errorf("lsn %d: durable payload (seq %d) replaced by seq %d", r.LSN,
				binary.LittleEndian.Uint64(a[16:]), binary.LittleEndian.Uint64(r.Payload[16:]))
		}
		if !slices.ContainsFunc(m.cands[r.LSN], func(p []byte) bool { return bytes.Equal(p, r.Payload) }) {
			return fmt.Errorf("lsn %d: seq %d term %d was removed or never appended here", r.LSN,
				binary.LittleEndian.Uint64(r.Payload[16:]), r.Term)
		}
		if term, err := l.Term(r.LSN); err != nil || term != r.Term {
			return fmt.Errorf("Term(%d) = %d, %v; record says %d", r.LSN, term, err, r.Term)
		}
		return nil
	})
	if err == nil && want != next {
		err = fmt.Errorf("scan ended at %d, NextLSN %d", want, next)
	}
	if err != nil {
		return fail("%v", err)
	}
	return true
}

// TestCrashHardState sets HardStates (term and vote changes, which sync, and
// commit-only changes, which do not) and ConfStates, crashes at a random
// file-system operation with torn writes, and checks that the HardState read
// back is the last synced one or one set after it: never older, never
// garbage.
func TestCrashHardState(t *testing.T) {
	seeds := 400
	if testing.Short() {
		seeds = 80
	}
	newer := 0
	for seed := range uint64(seeds) {
		rng := rand.New(rand.NewPCG(seed, 0x4A5D))
		cfs := &crashFS{MemFS: vfs.NewMem()}
		o := Options{FS: cfs, Dir: "log", SegmentBytes: 4096}
		type state struct {
			term, vote, commit uint64
			voters             int
		}
		var states []state // every state set, in order
		durable := -1      // index in states of the last one known synced
		for round := range 3 {
			l, err := Open(o)
			if err != nil {
				t.Fatalf("seed %d: Open: %v", seed, err)
			}
			hs := l.HardState()
			cs, err := l.ConfState()
			if err != nil {
				t.Fatalf("seed %d: ConfState: %v", seed, err)
			}
			got := state{hs.Term, hs.Vote, hs.Commit, len(cs.Voters)}
			if durable >= 0 {
				k := slices.Index(states[durable:], got)
				if k < 0 {
					t.Fatalf("seed %d round %d: HardState %+v is neither the synced %+v nor a later one (%d set)",
						seed, round, got, states[durable], len(states)-durable)
				}
				if k > 0 {
					newer++
				}
			} else if got != (state{}) && !slices.Contains(states, got) {
				t.Fatalf("seed %d round %d: HardState %+v was never set", seed, round, got)
			}
			states, durable = []state{got}, 0
			var image *vfs.MemFS
			var once sync.Once
			crash := func() { once.Do(func() { image = cfs.Crash(rng, true) }) }
			cfs.arm(1+int64(rng.IntN(40)), crash)
			cur := got
			for range 30 {
				s := cur
				var err error
				switch rng.IntN(4) {
				case 0:
					s.term++
					s.vote = 0
				case 1:
					s.vote = 1 + uint64(rng.IntN(3))
				case 2:
					s.voters = 1 + rng.IntN(5)
					states = append(states, s)
					err = l.SetConfState(&raftpb.ConfState{Voters: make([]uint64, s.voters)})
					if err == nil {
						durable = len(states) - 1
						cur = s
					}
					continue
				default:
					s.commit++
				}
				states = append(states, s)
				err = l.SetHardState(&raftpb.HardState{Term: s.term, Vote: s.vote, Commit: s.commit})
				if err != nil {
					break
				}
				if s.term != cur.term || s.vote != cur.vote {
					durable = len(states) - 1
				}
				cur = s
			}
			crash()
			_ = l.Close()
			cfs = &crashFS{MemFS: image}
			o.FS = cfs
		}
	}
	t.Logf("%d seeds: %d recoveries found a state newer than the last synced one", seeds, newer)
}

// TestTruncateAfterThenCrash cuts a multi-segment log at several points
// (mid-segment, at a segment's first record, everything) and crashes right
// after TruncateAfter returns: the cut holds, nothing before it is lost, and
// the log takes new records at the cut.
func TestTruncateAfterThenCrash(t *testing.T) {
	for _, cutAt := range []uint64{70, 33, 12, 1, 0} {
		for _, prealloc := range []PreallocMode{PreallocNone, PreallocReserve, PreallocZero} {
			fs := vfs.NewMem()
			o := Options{FS: fs, Dir: "log", SegmentBytes: 4096, IndexIntervalBytes: 128, Preallocate: prealloc}
			l := openT(t, o)
			for i := uint64(1); i <= 100; i++ {
				if err := l.AppendAt(i, 1+i/40, 1, raftPayload(i, 1+i/40, i)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := l.Sync(); err != nil {
				t.Fatal(err)
			}
			if len(l.Segments()) < 4 {
				t.Fatalf("want several segments, got %d", len(l.Segments()))
			}
			if err := l.TruncateAfter(cutAt); err != nil {
				t.Fatal(err)
			}
			img := fs.Crash(rand.New(rand.NewPCG(cutAt, 1)), true)
			_ = l.Close()
			o.FS = img
			l = openT(t, o)
			if l.NextLSN() != cutAt+1 {
				t.Fatalf("cut at %d (prealloc %d): NextLSN %d after the crash", cutAt, prealloc, l.NextLSN())
			}
			for i := uint64(1); i <= cutAt; i++ {
				if r, err := l.Read(i); err != nil || !bytes.Equal(r.Payload, raftPayload(i, 1+i/40, i)) {
					t.Fatalf("cut at %d: record %d: %v", cutAt, i, err)
				}
			}
			if err := l.AppendAt(cutAt+1, 9, 1, raftPayload(cutAt+1, 9, 999)); err != nil {
				t.Fatal(err)
			}
			if _, err := l.Sync(); err != nil {
				t.Fatal(err)
			}
			_ = l.Close()
		}
	}
}

// TestResetToThenCrash crashes at every file-system operation of a ResetTo
// in turn: the log after recovery is either the old one, whole, or the new
// empty one after the snapshot, never a mix.
func TestResetToThenCrash(t *testing.T) {
	var sawOld, sawNew int
	for crashAt := int64(1); crashAt <= 30; crashAt++ {
		cfs := &crashFS{MemFS: vfs.NewMem()}
		o := Options{FS: cfs, Dir: "log", SegmentBytes: 4096}
		l := openT(t, o)
		for i := uint64(1); i <= 60; i++ {
			if err := l.AppendAt(i, 2, 1, raftPayload(i, 2, i)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.Sync(); err != nil {
			t.Fatal(err)
		}
		var img *vfs.MemFS
		var once sync.Once
		cfs.arm(crashAt, func() { once.Do(func() { img = cfs.Crash(rand.New(rand.NewPCG(uint64(crashAt), 2)), true) }) })
		err := l.ResetTo(500, 7)
		once.Do(func() { img = cfs.Crash(rand.New(rand.NewPCG(uint64(crashAt), 2)), true) })
		_ = l.Close()
		o.FS = img
		l = openT(t, o)
		switch {
		case l.FirstLSN() == 501 && l.NextLSN() == 501:
			if term, terr := l.Term(500); terr != nil || term != 7 {
				t.Fatalf("crash at op %d: reset log has Term(500) = %d, %v", crashAt, term, terr)
			}
			sawNew++
		case l.FirstLSN() == 1 && l.NextLSN() == 61:
			if err == nil {
				t.Fatalf("crash at op %d: ResetTo returned nil but the old log came back", crashAt)
			}
			for i := uint64(1); i <= 60; i++ {
				if r, rerr := l.Read(i); rerr != nil || !bytes.Equal(r.Payload, raftPayload(i, 2, i)) {
					t.Fatalf("crash at op %d: old record %d: %v", crashAt, i, rerr)
				}
			}
			sawOld++
		default:
			t.Fatalf("crash at op %d: log [%d, %d) is neither the old nor the reset one", crashAt, l.FirstLSN(), l.NextLSN())
		}
		_ = l.Close()
		names, _ := img.ReadDir("log")
		if slices.Contains(names, resetName) {
			t.Fatalf("crash at op %d: %s left behind: %v", crashAt, resetName, names)
		}
	}
	if sawOld == 0 || sawNew == 0 {
		t.Fatalf("old %d, new %d: the crash points no longer straddle the reset", sawOld, sawNew)
	}
}
