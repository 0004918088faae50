package multiraft

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/raftlog"
	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
)

// errCrashed is what a segStore's save returns when the test crashes the
// node in the middle of it.
var errCrashed = errors.New("node crashed during save")

// segStore is the partition's raft storage, raftlog.Storage over a seglog
// v2 log, on a node's crashable MemFS. save appends, syncs, then stores the
// HardState, so everything a Ready's messages rely on is durable before
// they are sent.
type segStore struct {
	*raftlog.Storage
	log *seglog.Log
	// crashBeforeSync, when set, makes the next save append its entries
	// and return errCrashed without syncing them: the test then crashes
	// the node, and the MemFS crash keeps a random (possibly torn) prefix
	// of what was not synced.
	crashBeforeSync bool
}

func openSegStore(fs vfs.FS, dir string) (*segStore, error) {
	l, err := seglog.Open(seglog.Options{FS: fs, Dir: dir, SegmentBytes: 64 << 10})
	if err != nil {
		return nil, err
	}
	return &segStore{Storage: raftlog.New(l, raftlog.Options{CacheBytesMax: 16 << 10}), log: l}, nil
}

// bootstrap gives a new, empty log the group's voters.
func (s *segStore) bootstrap(voters []uint64) error {
	return s.SetConfState(&raftpb.ConfState{Voters: voters})
}

func (s *segStore) save(rd *raft.Ready) error {
	if !raft.IsEmptySnap(rd.Snapshot) {
		if err := s.ApplySnapshot(&rd.Snapshot); err != nil {
			return err
		}
	}
	if err := s.Append(rd.Entries); err != nil {
		return err
	}
	if s.crashBeforeSync {
		s.crashBeforeSync = false
		return errCrashed
	}
	if len(rd.Entries) > 0 {
		if err := s.Sync(); err != nil {
			return err
		}
	}
	if !raft.IsEmptyHardState(rd.HardState) {
		return s.SetHardState(&rd.HardState)
	}
	return nil
}

// segNodes gives each node of a qCluster one crashable MemFS holding a
// seglog v2 log per group, and makes crash a power loss of that MemFS
// (torn unsynced writes) instead of keeping every store as it was.
type segNodes struct {
	c   *qCluster
	rng *rand.Rand
	fs  map[uint64]*vfs.MemFS
	// logs open per node, to close them when the node crashes.
	open map[uint64][]*segStore
}

func useSegStores(c *qCluster, seed uint64) *segNodes {
	sn := &segNodes{c: c, rng: rand.New(rand.NewPCG(seed, 4242)), fs: make(map[uint64]*vfs.MemFS), open: make(map[uint64][]*segStore)}
	for _, id := range c.nodeIDs {
		sn.fs[id] = vfs.NewMem()
	}
	c.newStore = func(node, g uint64, voters []uint64) qStore {
		st, err := openSegStore(sn.fs[node], groupDir(g))
		if err != nil {
			c.t.Fatal(err)
		}
		if err := st.bootstrap(voters); err != nil {
			c.t.Fatal(err)
		}
		sn.open[node] = append(sn.open[node], st)
		return st
	}
	c.reopen = func(node, g uint64) qStore {
		st, err := openSegStore(sn.fs[node], groupDir(g))
		if err != nil {
			c.fail("node %d group %d: reopen after crash: %v", node, g, err)
		}
		sn.open[node] = append(sn.open[node], st)
		return st
	}
	c.onCrash = func(node uint64) {
		// Power loss: the rebooted node sees only what was synced, plus a
		// random, possibly torn, prefix of the rest.
		sn.fs[node] = sn.fs[node].Crash(sn.rng, true)
		for _, st := range sn.open[node] {
			st.log.Close() // its file system is gone; this only stops its goroutine
		}
		sn.open[node] = nil
	}
	c.t.Cleanup(func() {
		for _, sts := range sn.open {
			for _, st := range sts {
				st.log.Close()
			}
		}
	})
	return sn
}

func groupDir(g uint64) string { return fmt.Sprintf("/data/g%d", g) }

// The leader of a 3-replica queue group on seglog v2 loses power in the
// middle of a save (entries appended, not synced) while publishes and
// settles are in flight; the MemFS keeps only synced data plus a torn
// prefix of the rest. A new leader takes over, the old node reboots from
// its crashed file system and catches up: 0 confirmed publishes lost, 0
// settled messages leased again, every replica with the same state.
func TestSeglogQueueLeaderPowerLoss(t *testing.T) {
	for _, seed := range seeds(t, 5) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			c := newQCluster(t, seed, 3, Faults{DelayMinMs: 1, DelayMaxMs: 5})
			useSegStores(c, seed)
			c.addGroup(1, all3)
			rng := rand.New(rand.NewPCG(seed, 3))
			c.waitLeader(1, 5*time.Second)
			for range 150 {
				c.work(rng, 1)
				c.run(5 * time.Millisecond)
			}
			old := c.leaderOf(1)
			if old == nil {
				t.Fatal("no leader before the crash")
			}
			for i := range 5 {
				old.publish(fmt.Sprintf("in-flight-%d", i), c.nowMs())
			}
			c.nodes[old.node].stores[1].(*segStore).crashBeforeSync = true
			old.publish("torn", c.nowMs())
			if !old.dead {
				t.Fatal("the save did not crash")
			}
			c.run(tickEvery)
			if !c.nodes[old.node].down {
				t.Fatal("node not crashed")
			}
			nl := c.waitLeader(1, 5*time.Second)
			for range 150 {
				c.work(rng, 1)
				c.run(5 * time.Millisecond)
			}
			c.restart(old.node)
			c.settleAll(10 * time.Second)
			confirmed, settled := c.check()
			c.checkLogsAgree()
			if _, ok := c.confirmed[1]["torn"]; ok {
				t.Fatal("a publish whose save never synced was confirmed")
			}
			if confirmed < 40 || settled < 5 {
				t.Fatalf("too little load: confirmed %d settled %d", confirmed, settled)
			}
			t.Logf("old leader %d, new leader %d: confirmed %d, settled %d", old.node, nl.node, confirmed, settled)
		})
	}
}

// Randomised runs of the replicated queue on seglog v2 and crashable
// MemFS: node crashes are power losses, some in the middle of a save.
func TestSeglogQueueRandomized(t *testing.T) {
	for _, seed := range seeds(t, 15) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			c := newQCluster(t, seed, 3, Faults{})
			useSegStores(c, seed)
			c.armTornSave = func(rng *rand.Rand) {
				id := uint64(1 + rng.IntN(3))
				n := c.nodes[id]
				if n.down {
					return
				}
				for _, g := range c.groupIDs() {
					if st, ok := n.stores[g].(*segStore); ok && rng.IntN(2) == 0 {
						st.crashBeforeSync = true
						return
					}
				}
			}
			replqRandomRun(t, c, seed)
		})
	}
}

// Every node of the group loses power at once, right after publishes were
// confirmed and settles acknowledged, with more in flight: what a confirm
// promised must be on a quorum's disks, so after all three reboot from
// their crashed file systems nothing confirmed is missing and nothing
// settled is back.
func TestSeglogQueueClusterPowerLoss(t *testing.T) {
	for _, seed := range seeds(t, 5) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			c := newQCluster(t, seed, 3, Faults{DelayMinMs: 1, DelayMaxMs: 5})
			useSegStores(c, seed)
			c.addGroup(1, all3)
			c.addGroup(2, all3)
			rng := rand.New(rand.NewPCG(seed, 5))
			c.waitLeader(1, 5*time.Second)
			c.waitLeader(2, 5*time.Second)
			for range 200 {
				c.work(rng, uint64(1+rng.IntN(2)))
				c.run(time.Duration(rng.IntN(6)) * time.Millisecond)
			}
			before := len(c.confirmed[1]) + len(c.confirmed[2])
			for _, id := range all3 {
				c.crash(id)
			}
			c.run(time.Second)
			c.settleAll(10 * time.Second)
			confirmed, settled := c.check()
			c.checkLogsAgree()
			if before < 40 || settled == 0 {
				t.Fatalf("too little load: %d confirmed before the crash, %d settled", before, settled)
			}
			t.Logf("confirmed %d before the power loss, %d after more work; settled %d", before, confirmed, settled)
		})
	}
}
