package raftlog

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
)

var quietLogger = &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)}

// group is a raft group of one over a Storage, driven the way a partition
// drives it: persist Ready's entries and HardState, sync, apply committed
// entries, Advance.
type group struct {
	t       testing.TB
	s       *Storage
	rn      *raft.RawNode
	applied []string // data of applied normal entries with a payload
	last    uint64   // applied index
}

func newGroup(t testing.TB, l *seglog.Log, applied uint64) *group {
	t.Helper()
	g := &group{t: t, s: New(l, Options{})}
	hs, _, err := g.s.InitialState()
	if err != nil {
		t.Fatal(err)
	}
	if raft.IsEmptyHardState(hs) {
		if err := g.s.SetConfState(&raftpb.ConfState{Voters: []uint64{1}}); err != nil {
			t.Fatal(err)
		}
	}
	g.rn, err = raft.NewRawNode(&raft.Config{
		ID: 1, ElectionTick: 10, HeartbeatTick: 1, Storage: g.s, Applied: applied,
		MaxSizePerMsg: 1 << 20, MaxInflightMsgs: 256, MaxCommittedSizePerReady: 4 << 20,
		Logger: quietLogger,
	})
	if err != nil {
		t.Fatal(err)
	}
	g.last = applied
	if err := g.rn.Campaign(); err != nil {
		t.Fatal(err)
	}
	g.drain()
	return g
}

// drain handles Ready until there is none.
func (g *group) drain() {
	for g.rn.HasReady() {
		rd := g.rn.Ready()
		if err := g.s.Append(rd.Entries); err != nil {
			g.t.Fatal(err)
		}
		if !raft.IsEmptyHardState(rd.HardState) {
			if err := g.s.SetHardState(&rd.HardState); err != nil {
				g.t.Fatal(err)
			}
		}
		if len(rd.Entries) > 0 {
			if err := g.s.Sync(); err != nil {
				g.t.Fatal(err)
			}
		}
		for _, e := range rd.CommittedEntries {
			if e.Index != g.last+1 {
				g.t.Fatalf("applied %d after %d", e.Index, g.last)
			}
			g.last = e.Index
			if e.Type == raftpb.EntryNormal && len(e.Data) > 0 {
				g.applied = append(g.applied, string(e.Data))
			}
		}
		g.s.SetApplied(g.last)
		g.rn.Advance(rd)
	}
}

// TestGroupOfOne runs a single-replica raft group on the Storage: it elects
// itself, commits proposals, hands committed entries back from memory (no
// segment read), and after a restart from the files replays exactly the
// committed entries and continues in a higher term.
func TestGroupOfOne(t *testing.T) {
	fs := vfs.NewMem()
	o := seglog.Options{FS: fs, Dir: "log", SegmentBytes: 4096}
	l, err := seglog.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	g := newGroup(t, l, 0)
	var want []string
	for i := range 300 {
		d := fmt.Sprintf("\x01msg %d", i)
		want = append(want, d)
		if err := g.rn.Propose([]byte(d)); err != nil {
			t.Fatal(err)
		}
		if i%7 == 0 {
			g.drain()
		}
	}
	g.drain()
	if fmt.Sprint(g.applied) != fmt.Sprint(want) {
		t.Fatalf("applied %d entries, want %d", len(g.applied), len(want))
	}
	if n, m := g.s.DiskReads(), g.s.MemReads(); n != 0 || m == 0 {
		t.Fatalf("committed entries: %d reads from segment files, %d from memory; want 0 and some", n, m)
	}
	term1 := g.rn.BasicStatus().Term
	if len(l.Segments()) < 3 {
		t.Fatalf("want several segments, got %d", len(l.Segments()))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}

	l, err = seglog.Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	g = newGroup(t, l, 0) // nothing applied: replay everything committed
	if fmt.Sprint(g.applied) != fmt.Sprint(want) {
		t.Fatalf("after restart applied %d entries, want %d", len(g.applied), len(want))
	}
	if term := g.rn.BasicStatus().Term; term <= term1 {
		t.Fatalf("term %d after restart, want above %d", term, term1)
	}
	if err := g.rn.Propose([]byte("\x01after")); err != nil {
		t.Fatal(err)
	}
	g.drain()
	if got := g.applied[len(g.applied)-1]; got != "\x01after" {
		t.Fatalf("last applied %q", got)
	}
	// The log holds the records the queue would see: type byte, payload.
	var n int
	_ = l.Scan(0, func(r seglog.Record) error {
		if r.Type == 1 {
			n++
			if !bytes.HasPrefix(r.Payload, []byte("msg ")) && string(r.Payload) != "after" {
				t.Fatalf("record %d payload %q", r.LSN, r.Payload)
			}
		} else if r.Type != TypeNoop {
			t.Fatalf("record %d type %d", r.LSN, r.Type)
		}
		return nil
	})
	if n != len(want)+1 {
		t.Fatalf("%d queue records in the log, want %d", n, len(want)+1)
	}
}
