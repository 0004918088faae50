package partition

import (
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
	"go.etcd.io/raft/v3/raftpb"
)

// ckptReadGateFS holds every read of a checkpoint file while armed, until
// released: a disk slow to give a snapshot's checkpoint back.
type ckptReadGateFS struct {
	vfs.FS
	armed *atomic.Bool
	hit   *atomic.Bool
	rel   chan struct{}
}

func (g ckptReadGateFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	if flag == os.O_RDONLY && filepath.Base(name) == checkpointFile && g.armed.Load() {
		g.hit.Store(true)
		<-g.rel
	}
	return g.FS.OpenFile(name, flag, perm)
}

// snapshotTrio is a trio whose leader's retention soon drops what a
// follower cut off would need (tests of snapshots); mod, if set, changes
// each replica's config further.
func snapshotTrio(t *testing.T, mod func(*Config)) *trio {
	return newTrio(t, func(c *Config) {
		c.CheckpointEveryRecords = 20
		c.SegmentBytes = 4096
		c.Queue.LeaseMs = 3_600_000
		if mod != nil {
			mod(c)
		}
	})
}

// snaps watches the snapshots a trio's leader sends to follower lag.
type snaps struct {
	tr   *trio
	sent int
	held []*raftpb.Message
}

// watchSnapshots heals lag and counts every snapshot sent to it; those
// for which hold (given their number, from 1) says true are kept from it.
func (tr *trio) watchSnapshots(lag uint64, hold func(n int) bool) *snaps {
	w := &snaps{tr: tr}
	tr.mu.Lock()
	tr.hold = func(from uint64, m *raftpb.Message) bool {
		if m.Type != raftpb.MsgSnap || m.To != lag {
			return false
		}
		w.sent++
		if hold(w.sent) {
			w.held = append(w.held, m)
			return true
		}
		return false
	}
	tr.cut[lag] = false
	tr.mu.Unlock()
	return w
}

// count returns the snapshots sent so far and those held.
func (w *snaps) count() (int, []*raftpb.Message) {
	w.tr.mu.Lock()
	defer w.tr.mu.Unlock()
	return w.sent, slices.Clone(w.held)
}

// caughtUp fails t unless follower lag was caught up with leader l by a
// snapshot: its log restarts past the first entry, and it holds what l
// holds.
func (tr *trio) caughtUp(t *testing.T, l *Partition, lag uint64) {
	t.Helper()
	if got := tr.ps[lag].log.FirstLSN(); got < 2 {
		t.Fatalf("lagging replica's log starts at %d: it was not caught up by a snapshot", got)
	}
	ln, la := readyCount(l)
	fn, fa := readyCount(tr.ps[lag])
	if fa < la-1 || fn != ln {
		t.Errorf("lagging replica: applied %d ready %d; leader applied %d ready %d", fa, fn, la, ln)
	}
}

// A leader builds the snapshot a lagging replica needs off its actor: while
// the build waits on the disk, the leader still confirms publishes (with
// the other follower as its quorum), and once the build is done the lagging
// replica is caught up by it.
func TestSnapshotBuildDoesNotHoldUpTheLeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var armed, hit atomic.Bool
		rel := make(chan struct{})
		tr := snapshotTrio(t, func(c *Config) {
			c.FS = ckptReadGateFS{FS: c.FS, armed: &armed, hit: &hit, rel: rel}
		})
		defer tr.closeAll()
		l := tr.leader()
		lag, _ := tr.leaveBehind(l)

		armed.Store(true)
		tr.mu.Lock()
		tr.cut[lag] = false
		tr.mu.Unlock()
		tr.tick(3)
		if !hit.Load() {
			t.Fatal("the leader did not start a snapshot for the lagging replica")
		}
		// The build is stuck on the disk; the leader goes on.
		ch := publish(l, "during the build", nil)
		tr.tick(1)
		select {
		case r := <-ch:
			if r.err != nil {
				t.Fatalf("publish during the snapshot build: %v", r.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the leader confirmed nothing while its snapshot was being built")
		}

		armed.Store(false)
		close(rel)
		tr.tick(30)
		tr.caughtUp(t, l, lag)
	})
}

// A leader that sent a follower a snapshot sends it nothing else until the
// follower answers once it has applied it: appends sent meanwhile would
// reach it first, be refused, and make the leader send another snapshot.
func TestSnapshotFollowerAnswersBeforeTheLeaderMovesOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := snapshotTrio(t, nil)
		defer tr.closeAll()
		l := tr.leader()
		lag, _ := tr.leaveBehind(l)
		// Snapshots to the lagging replica are held back, as on a slow
		// lane; everything else flows.
		w := tr.watchSnapshots(lag, func(int) bool { return true })
		tr.tick(40)
		if n, _ := w.count(); n != 1 {
			t.Fatalf("the leader sent %d snapshots while the first was on its way, want 1", n)
		}
		// The snapshot arrives; the follower applies it and answers.
		tr.mu.Lock()
		tr.hold = nil
		tr.mu.Unlock()
		_, held := w.count()
		if err := tr.ps[lag].Step(held[0]); err != nil {
			t.Fatal(err)
		}
		tr.tick(30)
		tr.caughtUp(t, l, lag)
		if n, _ := w.count(); n != 1 {
			t.Errorf("the leader sent %d snapshots in all, want 1", n)
		}
	})
}

// A snapshot the transport reports lost (raftnet's MsgSnapStatus with
// Reject) is sent again at the leader's next attempt, without waiting for
// an answer that cannot come.
func TestSnapshotLostInTransportIsSentAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := snapshotTrio(t, nil)
		defer tr.closeAll()
		l := tr.leader()
		lag, _ := tr.leaveBehind(l)
		// The first is dropped, as by a failed write.
		w := tr.watchSnapshots(lag, func(n int) bool { return n == 1 })
		tr.tick(10)
		_, lost := w.count()
		if len(lost) == 0 {
			t.Fatal("no snapshot was sent")
		}
		if err := l.Step(&raftpb.Message{Type: raftpb.MsgSnapStatus, From: lag, To: lost[0].From, Reject: true}); err != nil {
			t.Fatal(err)
		}
		tr.tick(30)
		if n, _ := w.count(); n < 2 {
			t.Fatalf("the lost snapshot was not sent again (%d sent)", n)
		}
		tr.caughtUp(t, l, lag)
	})
}

// A snapshot whose follower never answers (the answer was lost, or the
// follower restarted after applying it) keeps the leader waiting only
// snapshotAnswerWaitMs: raft then probes the follower, which asks for a
// snapshot again if it still lacks one.
func TestSnapshotUnansweredIsGivenUpAfterTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := snapshotTrio(t, nil)
		defer tr.closeAll()
		l := tr.leader()
		lag, _ := tr.leaveBehind(l)
		// The first never arrives, and nothing says so.
		w := tr.watchSnapshots(lag, func(n int) bool { return n == 1 })
		tr.tick(20)
		time.Sleep(snapshotAnswerWaitMs * time.Millisecond)
		tr.tick(30)
		if n, _ := w.count(); n < 2 {
			t.Fatalf("the leader still waits on its unanswered snapshot (%d sent)", n)
		}
		tr.caughtUp(t, l, lag)
	})
}
