package partition

import (
	"fmt"
	"sync"
	"testing"
	"testing/synctest"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/vfs"
)

// trio is three replicas of one partition on their own MemFS, wired by a
// router that can cut a replica off.
type trio struct {
	t     *testing.T
	mu    sync.Mutex
	ps    [4]*Partition // by raft id 1..3
	fss   [4]*vfs.MemFS
	cfgs  [4]Config
	cut   [4]bool
	peers []uint64
	// hold, when set, sees every message before it is routed (under mu);
	// it returns true to keep the message from its replica.
	hold func(from uint64, m *raftpb.Message) bool
}

func newTrio(t *testing.T, mod func(*Config)) *trio {
	tr := &trio{t: t, peers: []uint64{1, 2, 3}}
	for id := uint64(1); id <= 3; id++ {
		fs := vfs.NewMem()
		cfg := testConfig(fs)
		cfg.RaftID, cfg.RaftPeers = id, tr.peers
		from := id
		cfg.Send = func(ms []*raftpb.Message) { tr.route(from, ms) }
		if mod != nil {
			mod(&cfg)
		}
		tr.fss[id], tr.cfgs[id] = fs, cfg
		tr.ps[id] = mustOpen(t, cfg)
	}
	return tr
}

func (tr *trio) route(from uint64, ms []*raftpb.Message) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, m := range ms {
		to := m.To
		if to < 1 || to > 3 || tr.cut[from] || tr.cut[to] || tr.ps[to] == nil {
			continue
		}
		if tr.hold != nil && tr.hold(from, m) {
			continue
		}
		_ = tr.ps[to].Step(m)
	}
}

// tick ticks every replica n times, letting each settle in between.
func (tr *trio) tick(n int) {
	for range n {
		tr.mu.Lock()
		ps := tr.ps
		tr.mu.Unlock()
		for _, p := range ps[1:] {
			if p != nil {
				p.Tick()
			}
		}
		synctest.Wait()
	}
}

// leaveBehind cuts a follower of leader l off, then consumes, acks and
// publishes on l (through consumer c, attached to l) until l's checkpoints
// have dropped the log segments the follower would need to catch up from
// its log. It returns the follower's id, still cut off, and c.
func (tr *trio) leaveBehind(l *Partition) (lag uint64, c *tconsumer) {
	t := tr.t
	for id := uint64(1); id <= 3; id++ {
		if tr.ps[id] != l {
			lag = id
			break
		}
	}
	tr.mu.Lock()
	tr.cut[lag] = true
	tr.mu.Unlock()
	c = &tconsumer{owner: "c", credit: -1}
	l.Attach(c)
	synctest.Wait()
	for round := range 20 {
		for _, d := range c.deliveries() {
			done := make(chan error, 1)
			l.Settle(Ack, d.Offset, d.LeaseID, 0, func(err error) { done <- err })
			synctest.Wait()
			if err := <-done; err != nil && err != queue.ErrStaleLease {
				t.Fatalf("ack %d: %v", d.Offset, err)
			}
		}
		for i := range 10 {
			ch := publish(l, fmt.Sprintf("r%d-%d", round, i), nil)
			synctest.Wait()
			if r := <-ch; r.err != nil {
				t.Fatalf("publish: %v", r.err)
			}
		}
		tr.tick(1)
	}
	if first := l.log.FirstLSN(); first <= 2 {
		t.Fatalf("the leader's log still starts at %d: retention did not run", first)
	}
	return lag, c
}

// leader ticks until a replica leads and returns it.
func (tr *trio) leader() *Partition {
	tr.t.Helper()
	for range 200 {
		for _, p := range tr.ps[1:] {
			if p == nil {
				continue
			}
			var leads bool
			inspect(p, func() { leads = p.leads })
			if leads {
				return p
			}
		}
		tr.tick(1)
	}
	tr.t.Fatal("no leader elected")
	return nil
}

func (tr *trio) closeAll() {
	for _, p := range tr.ps[1:] {
		if p != nil {
			p.Close()
		}
	}
}

func readyCount(p *Partition) (n uint64, applied uint64) {
	inspect(p, func() {
		n = uint64(p.st.Stats(p.nowMs()).Ready)
		applied = p.applied
	})
	return
}

func TestReplicaGroupReplicatesAndCatchesUpBySnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := snapshotTrio(t, nil)
		defer tr.closeAll()
		l := tr.leader()
		// A follower refuses publishes.
		for _, p := range tr.ps[1:] {
			if p != l {
				if r := <-publish(p, "x", nil); r.err != ErrNotLeader {
					t.Fatalf("publish to a follower: %v, want ErrNotLeader", r.err)
				}
				break
			}
		}
		for i := range 30 {
			ch := publish(l, fmt.Sprint("m", i), nil)
			tr.tick(0)
			synctest.Wait()
			if r := <-ch; r.err != nil {
				t.Fatalf("publish %d: %v", i, r.err)
			}
		}
		tr.tick(3)
		for id := 1; id <= 3; id++ {
			if n, _ := readyCount(tr.ps[id]); n != 30 {
				t.Errorf("replica %d holds %d ready messages, want 30", id, n)
			}
		}
		lag, c := tr.leaveBehind(l)
		tr.mu.Lock()
		tr.cut[lag] = false
		tr.mu.Unlock()
		tr.tick(30)
		ln, la := readyCount(l)
		fn, fa := readyCount(tr.ps[lag])
		var ferr error
		inspect(tr.ps[lag], func() { ferr = tr.ps[lag].failed })
		if ferr != nil {
			t.Fatalf("lagging replica failed: %v", ferr)
		}
		if fa < la-1 || fn != ln {
			t.Errorf("lagging replica: applied %d ready %d; leader applied %d ready %d", fa, fn, la, ln)
		}
		if tr.ps[lag].log.FirstLSN() < 2 {
			t.Errorf("lagging replica's log starts at %d: it was not caught up by a snapshot", tr.ps[lag].log.FirstLSN())
		}
		// The messages still live (leased, not acked) are readable on
		// the caught-up replica, their bodies carried by the snapshot.
		live := 0
		inspect(tr.ps[lag], func() {
			f := tr.ps[lag]
			for _, d := range c.deliveries() {
				in, ok := f.st.Lookup(d.Offset, f.nowMs())
				if !ok || in.State == queue.StateSettled {
					continue
				}
				live++
				m, err := f.message(d.Offset)
				if err != nil {
					t.Errorf("offset %d on the caught-up replica: %v", d.Offset, err)
				} else if string(m.Body) != string(d.Body) {
					t.Errorf("offset %d on the caught-up replica: body %q, want %q", d.Offset, m.Body, d.Body)
				}
			}
		})
		if live == 0 {
			t.Error("no live message to read on the caught-up replica")
		}
	})
}
