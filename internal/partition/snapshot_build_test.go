package partition

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
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

// A leader builds the snapshot a lagging replica needs off its actor: while
// the build waits on the disk, the leader still confirms publishes (with
// the other follower as its quorum), and once the build is done the lagging
// replica is caught up by it.
func TestSnapshotBuildDoesNotHoldUpTheLeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var armed, hit atomic.Bool
		rel := make(chan struct{})
		tr := newTrio(t, func(c *Config) {
			c.CheckpointEveryRecords = 20
			c.SegmentBytes = 4096
			c.Queue.LeaseMs = 3_600_000
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
		if got := tr.ps[lag].log.FirstLSN(); got < 2 {
			t.Fatalf("lagging replica's log starts at %d: it was not caught up by a snapshot", got)
		}
		ln, la := readyCount(l)
		fn, fa := readyCount(tr.ps[lag])
		if fa < la-1 || fn != ln {
			t.Errorf("lagging replica: applied %d ready %d; leader applied %d ready %d", fa, fn, la, ln)
		}
	})
}
