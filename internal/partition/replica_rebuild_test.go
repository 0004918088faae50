package partition

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/multiraft"
	"github.com/sinewmq/sinew/internal/vfs"
)

type ckGateFS struct {
	*vfs.MemFS
	wArmed, wHit atomic.Bool
	rArmed, rHit atomic.Bool
	relW, relR   chan struct{}
}

func (g *ckGateFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	base := filepath.Base(name)
	if strings.HasPrefix(base, "checkpoint.tmp") && g.wArmed.CompareAndSwap(true, false) {
		g.wHit.Store(true)
		<-g.relW
	}
	f, err := g.MemFS.OpenFile(name, flag, perm)
	if base == "checkpoint" && flag == os.O_RDONLY && g.rArmed.CompareAndSwap(true, false) {
		g.rHit.Store(true)
		<-g.relR
	}
	return f, err
}

// A leader that steps down while its checkpointer writes a checkpoint and
// drops segments must not rebuild from the old checkpoint and a log that
// lost the records after it: it waits for the checkpointer first.
func TestStepDownRebuildWaitsForCheckpointer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &rgroup{t: t, seed: 3, hist: &rhistory{}}
		g.net = multiraft.NewNetwork(3, time.Now, multiraft.Faults{})
		g.nextTick = time.Now().Add(replTick)
		gfss := map[uint64]*ckGateFS{}
		for id := uint64(1); id <= 3; id++ {
			fs := vfs.NewMem()
			gfs := &ckGateFS{MemFS: fs, relW: make(chan struct{}), relR: make(chan struct{})}
			gfss[id] = gfs
			cfg := testConfig(fs)
			cfg.RaftID, cfg.RaftPeers = id, []uint64{1, 2, 3}
			cfg.Queue.LeaseMs = 3_600_000
			cfg.SegmentBytes = 16 << 10
			cfg.CheckpointEveryRecords = 1_000_000
			n := &rnode{id: id, fs: fs, cfg: cfg}
			g.nodes[id] = n
			h, err := multiraft.NewHost(multiraft.Config{NodeID: id, Transport: g.net.Endpoint(id)})
			if err != nil {
				t.Fatal(err)
			}
			n.cfg.FS = gfs
			n.cfg.Send = h.Sender(replGroupID)
			p, err := Open(n.cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.AddGroup(replGroupID, p); err != nil {
				t.Fatal(err)
			}
			g.net.Attach(id, h)
			n.host, n.p = h, p
		}
		defer g.closeAll()
		l := g.awaitLeader()
		gfs := gfss[l.id]
		body := strings.Repeat("x", 1000)
		for i := range 60 {
			if r, ok := awaitRes(g, g.hist.publish(l.p, fmt.Sprint(i, body)), time.Second); !ok || r.err != nil {
				t.Fatalf("publish: %v %v", r.err, ok)
			}
		}
		g.ackAll(l, -1)
		gfs.wArmed.Store(true)
		for range 1200 {
			g.run(replTick)
			if gfs.wHit.Load() {
				break
			}
		}
		if !gfs.wHit.Load() {
			t.Fatal("no checkpoint started")
		}
		if r, ok := awaitRes(g, g.hist.publish(l.p, "Y"), time.Second); !ok || r.err != nil {
			t.Fatalf("publish Y: %v %v", r.err, ok)
		}
		t.Logf("segments before: %v", len(l.p.log.Segments()))
		gfs.rArmed.Store(true)
		var others []uint64
		for _, n := range g.up() {
			if n != l {
				others = append(others, n.id)
			}
		}
		g.net.Isolate(l.id, others)
		for range 500 {
			g.run(replTick)
			if gfs.rHit.Load() {
				break
			}
		}
		// Either the rebuild started reading the old checkpoint while the
		// checkpointer is held (the race), or the step-down is waiting for
		// the checkpointer: release it either way.
		close(gfs.relW)
		synctest.Wait()
		for range 100 {
			if gfs.rHit.Load() {
				break
			}
			g.run(replTick)
		}
		if !gfs.rHit.Load() {
			t.Fatal("the leader did not rebuild")
		}
		t.Logf("after the checkpointer: first lsn %d, segments %d", l.p.log.FirstLSN(), len(l.p.log.Segments()))
		close(gfs.relR)
		synctest.Wait()
		g.run(replTick)
		if e := l.p.Stats().Err; e != "" {
			t.Errorf("the deposed leader failed on step-down: %s", e)
		}
		g.net.Heal()
		g.run(time.Second)
	})
}
