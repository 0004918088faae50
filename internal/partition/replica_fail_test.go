package partition

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/multiraft"
	"github.com/sinewmq/sinew/internal/vfs"
)

// gateFS blocks the first file Sync after arm until release.
type gateFS struct {
	*vfs.MemFS
	armed atomic.Bool
	hit   atomic.Bool
	rel   chan struct{}
}

type gateFile struct {
	vfs.File
	g *gateFS
}

func (f gateFile) Sync() error {
	if f.g.armed.CompareAndSwap(true, false) {
		f.g.hit.Store(true)
		<-f.g.rel
	}
	return f.File.Sync()
}

func (g *gateFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	f, err := g.MemFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return gateFile{f, g}, nil
}

// A leader that fails while its stage's sync is under way must not confirm
// that stage's publishes when the local sync returns: no quorum holds them.
func TestFailedLeaderDoesNotConfirmUncommitted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &rgroup{t: t, seed: 11, hist: &rhistory{}}
		g.rng = nil
		g.net = multiraft.NewNetwork(11, time.Now, multiraft.Faults{})
		g.nextTick = time.Now().Add(replTick)
		gfss := map[uint64]*gateFS{}
		for id := uint64(1); id <= 3; id++ {
			fs := vfs.NewMem()
			gfs := &gateFS{MemFS: fs, rel: make(chan struct{})}
			gfss[id] = gfs
			cfg := testConfig(fs)
			cfg.RaftID, cfg.RaftPeers = id, []uint64{1, 2, 3}
			cfg.Queue.LeaseMs = 3_600_000
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
		for i := range 3 {
			if r, ok := awaitRes(g, publish(l.p, fmt.Sprint("base", i), nil), time.Second); !ok || r.err != nil {
				t.Fatalf("base publish: %v %v", r.err, ok)
			}
		}
		var others []uint64
		for _, n := range g.up() {
			if n != l {
				others = append(others, n.id)
			}
		}
		g.net.Isolate(l.id, others)
		gfs.armed.Store(true)
		ch := publish(l.p, "P1", nil)
		synctest.Wait()
		if !gfs.hit.Load() {
			t.Fatal("the sync of P1's stage did not reach the gate")
		}
		gfs.MemFS.SetWriteError(errors.New("injected write error"))
		time.Sleep(time.Duration(idleCheckpointMs+100) * time.Millisecond) // no host ticks: raft stays leader
		synctest.Wait()
		if l.p.Stats().Err == "" {
			t.Fatal("the leader did not fail")
		}
		gfs.MemFS.SetWriteError(nil)
		close(gfs.rel)
		synctest.Wait()
		select {
		case r := <-ch:
			t.Logf("P1 answered off=%d err=%v (leader failed: %s)", r.off, r.err, l.p.Stats().Err)
			if r.err == nil {
				for _, n := range g.up() {
					if n != l {
						a, nx := commitIndex(n.p)
						t.Logf("follower %d applied %d next %d", n.id, a, nx)
					}
				}
				t.Errorf("P1 confirmed at offset %d though no follower holds it and the leader failed", r.off)
			}
		default:
			t.Fatal("P1 not answered")
		}
	})
}
