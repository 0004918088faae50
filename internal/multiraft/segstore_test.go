package multiraft

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
)

// Record types for raft entries that hold no queue event. They are outside
// the queue's event kinds, so the queue treats their indexes as settled gaps.
const (
	recRaftEmpty      = 0xF0 // a leader's empty entry
	recRaftConfChange = 0xF1 // a configuration change; payload is the entry data
)

// errCrashed is what a segStore's save returns when the test crashes the
// node in the middle of it.
var errCrashed = errors.New("node crashed during save")

// segStore is raft.Storage over a seglog v2 log on a node's crashable
// MemFS: entries are records (index = LSN, with their term), HardState and
// ConfState live in the log's HardState file. save appends, syncs, then
// stores the HardState, so everything a Ready's messages rely on is durable
// before they are sent.
type segStore struct {
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
	return &segStore{log: l}, nil
}

// bootstrap makes a new log start after the group's initial membership
// snapshot at index 1, term 1.
func (s *segStore) bootstrap(voters []uint64) error {
	if err := s.log.ResetTo(1, 1); err != nil {
		return err
	}
	return s.log.SetConfState(&raftpb.ConfState{Voters: voters})
}

func (s *segStore) InitialState() (*raftpb.HardState, *raftpb.ConfState, error) {
	cs, err := s.log.ConfState()
	if err != nil {
		return nil, nil, err
	}
	return s.log.HardState(), cs, nil
}

func (s *segStore) Entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, error) {
	if lo < s.log.FirstLSN() {
		return nil, raft.ErrCompacted
	}
	if hi > s.log.NextLSN() {
		return nil, fmt.Errorf("entries [%d, %d) past the log's end %d", lo, hi, s.log.NextLSN())
	}
	var out []*raftpb.Entry
	var size uint64
	errFull := errors.New("full")
	err := s.log.ScanRange(lo, hi-1, func(r seglog.Record) error {
		e := recordEntry(r)
		size += uint64(proto.Size(e))
		if len(out) > 0 && size > maxSize {
			return errFull
		}
		out = append(out, e)
		return nil
	})
	if err != nil && !errors.Is(err, errFull) {
		return nil, err
	}
	return out, nil
}

func recordEntry(r seglog.Record) *raftpb.Entry {
	idx, term := r.LSN, r.Term
	e := &raftpb.Entry{Index: &idx, Term: &term}
	switch r.Type {
	case recRaftEmpty:
		t := raftpb.EntryNormal
		e.Type = &t
	case recRaftConfChange:
		t := raftpb.EntryConfChange
		e.Type = &t
		e.Data = append([]byte(nil), r.Payload...)
	default:
		t := raftpb.EntryNormal
		e.Type = &t
		e.Data = append([]byte{r.Type}, r.Payload...)
	}
	return e
}

func (s *segStore) Term(i uint64) (uint64, error) {
	t, err := s.log.Term(i)
	switch {
	case errors.Is(err, seglog.ErrCompacted):
		return 0, raft.ErrCompacted
	case errors.Is(err, seglog.ErrNotFound):
		return 0, raft.ErrUnavailable
	}
	return t, err
}

func (s *segStore) LastIndex() (uint64, error)  { return s.log.NextLSN() - 1, nil }
func (s *segStore) FirstIndex() (uint64, error) { return s.log.FirstLSN(), nil }

func (s *segStore) Snapshot() (*raftpb.Snapshot, error) {
	idx := s.log.FirstLSN() - 1
	term, err := s.log.Term(idx)
	if err != nil {
		return nil, err
	}
	cs, err := s.log.ConfState()
	if err != nil {
		return nil, err
	}
	return &raftpb.Snapshot{Metadata: &raftpb.SnapshotMetadata{Index: &idx, Term: &term, ConfState: cs}}, nil
}

func (s *segStore) save(rd *raft.Ready) error {
	if !raft.IsEmptySnap(rd.Snapshot) {
		return errors.New("segStore: snapshots are not used by these tests")
	}
	for _, e := range rd.Entries {
		typ, payload := uint8(recRaftEmpty), []byte(nil)
		switch {
		case e.GetType() == raftpb.EntryConfChange:
			typ, payload = recRaftConfChange, e.GetData()
		case len(e.GetData()) > 0:
			typ, payload = e.GetData()[0], e.GetData()[1:]
		}
		if err := s.log.AppendAt(e.GetIndex(), e.GetTerm(), typ, payload); err != nil {
			return err
		}
	}
	if s.crashBeforeSync {
		s.crashBeforeSync = false
		return errCrashed
	}
	if len(rd.Entries) > 0 {
		if _, err := s.log.Sync(); err != nil {
			return err
		}
	}
	if !raft.IsEmptyHardState(rd.HardState) {
		return s.log.SetHardState(rd.HardState)
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
