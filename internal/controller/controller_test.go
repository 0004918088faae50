package controller

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/goleak"

	"github.com/sinewmq/sinew/internal/vfs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// cluster is a set of controllers wired by an in-process router that can
// cut a node off; each node keeps its file system across restarts.
type cluster struct {
	t     *testing.T
	mu    sync.Mutex
	nodes map[uint64]*Controller
	fs    map[uint64]*vfs.MemFS
	cut   map[uint64]bool
	// epoch moves every node's client address (each move is a join
	// entry); snapEvery and segBytes configure the controllers.
	epoch int
	dead  map[uint64]bool // reported dead by membership
	// boots counts each node's starts: its run (Node.Boot).
	boots     map[uint64]uint64
	snapEvery int
	segBytes  int64
	// gossip is each node's gossip address in the view (none: empty).
	gossip map[uint64]string
}

func newCluster(t *testing.T) *cluster {
	c := &cluster{t: t, nodes: map[uint64]*Controller{}, fs: map[uint64]*vfs.MemFS{}, cut: map[uint64]bool{}, dead: map[uint64]bool{}, boots: map[uint64]uint64{}}
	t.Cleanup(func() {
		c.mu.Lock()
		nodes := c.nodes
		c.nodes = map[uint64]*Controller{}
		c.mu.Unlock()
		for _, n := range nodes {
			n.Close()
		}
	})
	return c
}

func nodeOf(id uint64) Node { return nodeAt(id, 0) }

func nodeAt(id uint64, epoch int) Node {
	return Node{RaftID: id, ID: fmt.Sprintf("%016x%016x", id, id), ClientAddr: fmt.Sprintf("127.0.0.1:%d", 7000+int(id)+10*epoch), PeerAddr: fmt.Sprintf("127.0.0.1:%d", 8000+id)}
}

func (c *cluster) send(from uint64) func([]*raftpb.Message) {
	return func(ms []*raftpb.Message) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.cut[from] {
			return
		}
		for _, m := range ms {
			if to, ok := c.nodes[m.To]; ok && !c.cut[m.To] {
				cp := *m
				to.Step(&cp)
			}
		}
	}
}

func (c *cluster) start(id uint64, bootstrap bool) *Controller {
	c.t.Helper()
	c.mu.Lock()
	fs := c.fs[id]
	if fs == nil {
		fs = vfs.NewMem()
		c.fs[id] = fs
	}
	c.boots[id]++
	self := c.member(id)
	c.mu.Unlock()
	ctl, err := Open(Config{FS: fs, Dir: "controller", Self: self, Bootstrap: bootstrap, Send: c.send(id),
		SnapshotEvery: c.snapEvery, SegmentBytes: c.segBytes})
	if err != nil {
		c.t.Fatalf("open controller %d: %v", id, err)
	}
	c.mu.Lock()
	c.nodes[id] = ctl
	c.mu.Unlock()
	return ctl
}

func (c *cluster) stop(id uint64) {
	c.mu.Lock()
	n := c.nodes[id]
	delete(c.nodes, id)
	c.mu.Unlock()
	if err := n.Close(); err != nil {
		c.t.Fatalf("close %d: %v", id, err)
	}
}

// member is node id as membership shows it now, in its current run.
// Called with c.mu held.
func (c *cluster) member(id uint64) Node {
	n := nodeAt(id, c.epoch)
	n.Boot = c.boots[id]
	n.GossipAddr = c.gossip[id]
	return n
}

// view is the membership view every node gets: the running nodes (those
// in c.dead reported dead), plus the ones named gone.
func (c *cluster) reconcile(gone ...uint64) {
	c.mu.Lock()
	var view []Member
	ids := make([]uint64, 0, len(c.nodes))
	for id := range c.nodes {
		ids = append(ids, id)
	}
	slices.Sort(ids) // nodes join in id order
	for _, id := range ids {
		view = append(view, Member{Node: c.member(id), Dead: c.dead[id]})
	}
	for _, id := range gone {
		view = append(view, Member{Node: c.member(id), Gone: true})
	}
	nodes := make([]*Controller, 0, len(c.nodes))
	for _, n := range c.nodes {
		nodes = append(nodes, n)
	}
	c.mu.Unlock()
	for _, n := range nodes {
		n.Reconcile(view)
	}
}

// round hands every node the view and one tick, then waits for a status
// change (at most wait) to let the controllers' goroutines run.
func (c *cluster) round(wait time.Duration, gone ...uint64) {
	c.reconcile(gone...)
	c.mu.Lock()
	var changed []<-chan struct{}
	for _, n := range c.nodes {
		changed = append(changed, n.Changed())
		n.Tick()
	}
	c.mu.Unlock()
	select {
	case <-changed[0]:
	case <-time.After(wait):
	}
}

// until ticks every node and hands it the view until cond holds, for at
// least 3000 rounds and at least untilPatience; each round waits at most
// 2 ms for a status change. A round can end within microseconds (any
// status change ends it), so the rounds alone may pass before the
// controllers' goroutines have handled what they were handed.
func (c *cluster) until(what string, cond func() bool, gone ...uint64) {
	c.t.Helper()
	deadline := time.Now().Add(untilPatience)
	for i := 0; i < 3000 || time.Now().Before(deadline); i++ {
		if cond() {
			return
		}
		c.round(2*time.Millisecond, gone...)
	}
	c.t.Fatalf("not reached: %s; %s", what, c.describe())
}

// untilPatience is the least real time until waits before it gives up.
const untilPatience = 10 * time.Second

func (c *cluster) describe() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := ""
	for id, n := range c.nodes {
		st := n.Status()
		s += fmt.Sprintf("[node %d: leader %d term %d voters %v learners %v applied %d nodes %+v err %q] ", id, st.Leader, st.Term, st.Voters, st.Learners, st.Applied, st.Table.Nodes, st.Err)
	}
	return s
}

// agreed reports whether every running node has the same leader, the
// given voters and learners, and a table of exactly the members named,
// with the gone ones marked left.
func (c *cluster) agreed(voters, learners []uint64, members []uint64, left []uint64) func() bool {
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		var lead uint64
		for _, n := range c.nodes {
			st := n.Status()
			if st.Err != "" || st.Leader == 0 {
				return false
			}
			if lead == 0 {
				lead = st.Leader
			}
			if st.Leader != lead || !sameSet(st.Voters, voters) || !sameSet(st.Learners, learners) {
				return false
			}
			var ids, gone []uint64
			for _, nd := range st.Table.Nodes {
				ids = append(ids, nd.RaftID)
				if nd.Left {
					gone = append(gone, nd.RaftID)
				}
				if want := c.member(nd.RaftID); nd.ID != want.ID || nd.ClientAddr != want.ClientAddr || nd.PeerAddr != want.PeerAddr || nd.Boot != want.Boot {
					return false
				}
			}
			if !sameSet(ids, members) || !sameSet(gone, left) {
				return false
			}
		}
		return true
	}
}

func sameSet(a, b []uint64) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// TestControllerGrowsToThreeVotersAndLearners: a bootstrap node elects
// itself and records itself; nodes that join are added as voters up to
// three, then as learners, and every node holds the same table.
func TestControllerGrowsToThreeVotersAndLearners(t *testing.T) {
	c := newCluster(t)
	c.start(1, true)
	c.until("node 1 alone", c.agreed([]uint64{1}, nil, []uint64{1}, nil))
	for id := uint64(2); id <= 5; id++ {
		c.start(id, false)
	}
	c.until("five nodes, three voting", c.agreed([]uint64{1, 2, 3}, []uint64{4, 5}, []uint64{1, 2, 3, 4, 5}, nil))
}

// TestControllerLeaderLossAndRestart: the controller keeps a leader and its
// table when its leader's node is cut off, and a stopped node comes back
// with the table from its own log.
func TestControllerLeaderLossAndRestart(t *testing.T) {
	c := newCluster(t)
	c.start(1, true)
	c.until("node 1 alone", c.agreed([]uint64{1}, nil, []uint64{1}, nil))
	c.start(2, false)
	c.start(3, false)
	all := c.agreed([]uint64{1, 2, 3}, nil, []uint64{1, 2, 3}, nil)
	c.until("three voters", all)

	lead := c.nodes[1].Status().Leader
	c.mu.Lock()
	c.cut[lead] = true
	c.mu.Unlock()
	c.until("a new leader among the other two", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for id, n := range c.nodes {
			if id == lead {
				continue
			}
			if st := n.Status(); st.Leader == 0 || st.Leader == lead {
				return false
			}
		}
		return true
	})
	c.mu.Lock()
	c.cut[lead] = false
	c.mu.Unlock()
	c.until("the old leader follows again", all)

	// A stopped node restarts from its own log: its table and
	// configuration come back before it hears from anyone.
	c.stop(2)
	n := c.start(2, false)
	st := n.Status()
	if !sameSet(st.Voters, []uint64{1, 2, 3}) || len(st.Table.Nodes) != 3 {
		t.Fatalf("restarted node 2 holds voters %v and %d nodes, want the committed table (%s)", st.Voters, len(st.Table.Nodes), c.describe())
	}
	c.until("all agree after the restart", all)
}

// TestControllerNodeLeaves: a node that leaves on purpose is marked left
// and removed from the group; a learner is promoted to keep three voters.
func TestControllerNodeLeaves(t *testing.T) {
	c := newCluster(t)
	c.start(1, true)
	c.until("node 1 alone", c.agreed([]uint64{1}, nil, []uint64{1}, nil))
	for id := uint64(2); id <= 4; id++ {
		c.start(id, false)
	}
	c.until("three voters and a learner", c.agreed([]uint64{1, 2, 3}, []uint64{4}, []uint64{1, 2, 3, 4}, nil))
	c.stop(2)
	c.until("node 2 left, node 4 promoted", c.agreed([]uint64{1, 3, 4}, nil, []uint64{1, 2, 3, 4}, []uint64{2}), 2)
}

// TestControllerWithoutBootstrapWaits: nodes that are not told to bootstrap
// elect nothing on their own.
func TestControllerWithoutBootstrapWaits(t *testing.T) {
	c := newCluster(t)
	c.start(1, false)
	c.start(2, false)
	for range 100 {
		c.reconcile()
		for _, n := range c.nodes {
			n.Tick()
		}
	}
	for id, n := range c.nodes {
		if st := n.Status(); st.Leader != 0 || len(st.Voters) != 0 || len(st.Table.Nodes) != 0 {
			t.Fatalf("node %d without a bootstrap node: leader %d, voters %v, %d nodes", id, st.Leader, st.Voters, len(st.Table.Nodes))
		}
	}
}

func TestCommandEncoding(t *testing.T) {
	n := nodeOf(9)
	b, err := encode(command{Op: opJoin, Node: &n})
	if err != nil {
		t.Fatal(err)
	}
	c, err := decode(b)
	if err != nil || c.Op != opJoin || *c.Node != n {
		t.Fatalf("decode(encode) = %+v, %v", c, err)
	}
	for _, bad := range [][]byte{nil, {recordType}, {2, '{', '}'}, append([]byte{recordType}, `{"v":2,"op":"join"}`...), append([]byte{recordType}, `{"v":1`...)} {
		if _, err := decode(bad); err == nil {
			t.Errorf("decode(%q) accepted", bad)
		}
	}
	var tb Table
	if err := tb.apply(1, command{Op: "rename"}); err == nil {
		t.Error("an unknown op applied")
	}
	if err := tb.apply(1, command{Op: opJoin}); err == nil {
		t.Error("a join without a node applied")
	}
}

func TestRaftIDOf(t *testing.T) {
	id, err := RaftIDOf("00000000000000ff0123456789abcdef")
	if err != nil || id != 0xff {
		t.Fatalf("RaftIDOf = %d, %v", id, err)
	}
	if id, _ := RaftIDOf("00000000000000000123456789abcdef"); id != 1 {
		t.Fatalf("a zero prefix maps to %d, want 1", id)
	}
	for _, bad := range []string{"", "xyz", "0011"} {
		if _, err := RaftIDOf(bad); err == nil {
			t.Errorf("RaftIDOf(%q) accepted", bad)
		}
	}
}

// TestControllerNodePowerLoss: a voter loses power (its file system keeps
// only what was synced, with torn unsynced writes) and restarts; it comes
// back with a table the others agree with, and the group goes on.
func TestControllerNodePowerLoss(t *testing.T) {
	for seed := range uint64(10) {
		c := newCluster(t)
		if seed%2 == 1 {
			// Snapshots and compaction in the picture: the crash may
			// fall between a snapshot file and the configuration
			// stored after it, or mid-compaction.
			c.snapEvery, c.segBytes = 4, 4096
		}
		c.start(1, true)
		c.until("node 1 alone", c.agreed([]uint64{1}, nil, []uint64{1}, nil))
		c.start(2, false)
		c.start(3, false)
		all := c.agreed([]uint64{1, 2, 3}, nil, []uint64{1, 2, 3}, nil)
		c.until("three voters", all)
		for e := 1; e <= int(seed%4)*5; e++ {
			c.mu.Lock()
			c.epoch = e
			c.mu.Unlock()
			c.until(fmt.Sprintf("seed %d: epoch %d", seed, e), all)
		}
		victim := 1 + seed%3
		c.mu.Lock()
		crashed := c.fs[victim].Crash(rand.New(rand.NewPCG(seed, 9)), true)
		c.mu.Unlock()
		c.mu.Lock()
		old := c.nodes[victim]
		delete(c.nodes, victim)
		c.fs[victim] = crashed
		c.mu.Unlock()
		_ = old.Close() // the old process is gone; its files are the crashed copy's
		c.start(victim, false)
		c.start(4, false)
		c.until(fmt.Sprintf("seed %d: node %d back and node 4 a learner", seed, victim),
			c.agreed([]uint64{1, 2, 3}, []uint64{4}, []uint64{1, 2, 3, 4}, nil))
	}
}

// TestControllerSnapshotsAndCompacts: with a snapshot every 8 entries and
// small segments, a long run of table changes leaves the log compacted; a
// node that joins afterwards is caught up by a snapshot, and a node that
// restarts comes back from its snapshot and the log after it.
func TestControllerSnapshotsAndCompacts(t *testing.T) {
	c := newCluster(t)
	c.snapEvery, c.segBytes = 8, 4096
	c.start(1, true)
	c.start(2, false)
	c.start(3, false)
	three := []uint64{1, 2, 3}
	c.until("three voters", c.agreed(three, nil, three, nil))
	for e := 1; e <= 60; e++ {
		c.mu.Lock()
		c.epoch = e // every node's client address moves: three join entries
		c.mu.Unlock()
		c.until(fmt.Sprintf("epoch %d applied everywhere", e), c.agreed(three, nil, three, nil))
	}
	for id := uint64(1); id <= 3; id++ {
		n := c.nodes[id]
		first, _ := n.rs.FirstIndex()
		if st := n.Status(); first <= 1 || n.snap.Index == 0 || st.Applied < 180 {
			t.Fatalf("node %d: log starts at %d, snapshot at %d, applied %d: want a compacted log", id, first, n.snap.Index, st.Applied)
		}
	}
	c.start(4, false)
	four := []uint64{1, 2, 3, 4}
	c.until("node 4 caught up by a snapshot", c.agreed(three, []uint64{4}, four, nil))
	if c.nodes[4].snap.Index == 0 {
		t.Fatal("node 4 caught up without a snapshot")
	}
	c.stop(2)
	n := c.start(2, false)
	if st := n.Status(); len(st.Table.Nodes) != 4 || !sameSet(st.Voters, three) {
		t.Fatalf("node 2 restarted with %d nodes and voters %v", len(st.Table.Nodes), st.Voters)
	}
	c.until("all four agree after the restart", c.agreed(three, []uint64{4}, four, nil))
}

func TestSnapshotEncoding(t *testing.T) {
	s := snap{Index: 9, Term: 2, Conf: raftpb.ConfState{Voters: []uint64{1, 2}}, Table: Table{Nodes: []Node{nodeOf(1)}}}
	b, err := encodeSnap(s)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeSnap(b)
	if err != nil || got.Index != 9 || got.Term != 2 || !slices.Equal(got.Conf.Voters, []uint64{1, 2}) || got.Table.Nodes[0] != nodeOf(1) {
		t.Fatalf("decodeSnap(encodeSnap) = %+v, %v", got, err)
	}
	for i := range b {
		bad := slices.Clone(b)
		bad[i] ^= 0x10
		if _, err := decodeSnap(bad); err == nil {
			t.Fatalf("a flip at byte %d was not detected", i)
		}
	}
	if _, err := decodeSnap(b[:3]); err == nil {
		t.Fatal("a short snapshot decoded")
	}
}

// TestControllerRandomised runs five controllers through random cuts,
// heals, clean restarts, power losses and address changes, and checks the
// state machine's safety all along: every table any node reports at an
// applied index is the same table (a checker over every observation); at
// the end, with every link healed, all five agree.
func TestControllerRandomised(t *testing.T) {
	for seed := range uint64(12) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 77))
			c := newCluster(t)
			if seed%2 == 0 {
				c.snapEvery, c.segBytes = 6, 4096
			}
			c.start(1, true)
			c.until("node 1 alone", c.agreed([]uint64{1}, nil, []uint64{1}, nil))
			for id := uint64(2); id <= 5; id++ {
				c.start(id, false)
			}
			five := []uint64{1, 2, 3, 4, 5}
			c.until("five nodes", c.agreed([]uint64{1, 2, 3}, []uint64{4, 5}, five, nil))

			seen := map[uint64]string{} // applied index -> table
			observe := func() {
				c.mu.Lock()
				defer c.mu.Unlock()
				for id, n := range c.nodes {
					st := n.Status()
					if st.Err != "" {
						t.Fatalf("node %d failed: %s", id, st.Err)
					}
					b, _ := json.Marshal(st.Table)
					if prev, ok := seen[st.Applied]; ok && prev != string(b) {
						t.Fatalf("node %d at index %d holds %s; another node held %s there", id, st.Applied, b, prev)
					}
					seen[st.Applied] = string(b)
				}
			}
			for step := range 40 {
				switch op := rng.IntN(6); op {
				case 0, 1: // cut or heal a node
					id := 1 + rng.Uint64N(5)
					c.mu.Lock()
					cut := 0
					for _, v := range c.cut {
						if v {
							cut++
						}
					}
					c.cut[id] = !c.cut[id] && cut < 2
					c.mu.Unlock()
				case 2: // a clean restart
					id := 1 + rng.Uint64N(5)
					c.stop(id)
					c.start(id, false)
				case 3: // a power loss
					id := 1 + rng.Uint64N(5)
					c.mu.Lock()
					crashed := c.fs[id].Crash(rand.New(rand.NewPCG(seed, uint64(step))), true)
					old := c.nodes[id]
					delete(c.nodes, id)
					c.fs[id] = crashed
					c.mu.Unlock()
					_ = old.Close()
					c.start(id, false)
				default: // every address moves: join entries
					c.mu.Lock()
					c.epoch++
					c.mu.Unlock()
				}
				for range 30 {
					c.round(time.Millisecond)
					observe()
				}
			}
			c.mu.Lock()
			clear(c.cut)
			c.mu.Unlock()
			c.until("all five agree once healed", c.agreed([]uint64{1, 2, 3}, []uint64{4, 5}, five, nil))
			observe()
		})
	}
}

// TestControllerReplacesADeadVoter: a voter membership reports dead is
// demoted to learner and the first live learner promoted, so the group
// keeps three live voters; when the node comes back it stays a learner.
// With no learner to take the seat, a dead voter keeps it.
func TestControllerReplacesADeadVoter(t *testing.T) {
	c := newCluster(t)
	c.start(1, true)
	c.until("node 1 alone", c.agreed([]uint64{1}, nil, []uint64{1}, nil))
	c.start(2, false)
	c.start(3, false)
	three := []uint64{1, 2, 3}
	c.until("three voters", c.agreed(three, nil, three, nil))

	// No learner: node 3, cut off and reported dead, keeps its seat.
	c.mu.Lock()
	c.cut[3], c.dead[3] = true, true
	c.mu.Unlock()
	for range 200 {
		c.reconcile()
		c.mu.Lock()
		for _, n := range c.nodes {
			n.Tick()
		}
		c.mu.Unlock()
	}
	if st := c.nodes[1].Status(); !sameSet(st.Voters, three) {
		t.Fatalf("a dead voter with no learner to replace it lost its seat: voters %v", st.Voters)
	}
	c.mu.Lock()
	c.cut[3], c.dead[3] = false, false
	c.mu.Unlock()
	c.until("three voters again", c.agreed(three, nil, three, nil))

	c.start(4, false)
	four := []uint64{1, 2, 3, 4}
	c.until("node 4 a learner", c.agreed(three, []uint64{4}, four, nil))
	c.mu.Lock()
	c.cut[2], c.dead[2] = true, true
	c.mu.Unlock()
	live := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for id, n := range c.nodes {
			if id == 2 {
				continue
			}
			if st := n.Status(); !sameSet(st.Voters, []uint64{1, 3, 4}) || !sameSet(st.Learners, []uint64{2}) {
				return false
			}
		}
		return true
	}
	c.until("node 2 demoted, node 4 promoted", live)
	c.mu.Lock()
	c.cut[2], c.dead[2] = false, false
	c.mu.Unlock()
	c.until("node 2 back as a learner", c.agreed([]uint64{1, 3, 4}, []uint64{2}, four, nil))
}

// TestRaftIDCollisionIsNotAdmitted: a second node id with the same raft id
// is not admitted: the table keeps the first, at every replica.
func TestRaftIDCollisionIsNotAdmitted(t *testing.T) {
	var tb Table
	first, second := nodeOf(7), nodeOf(7)
	second.ID = "ffffffffffffffff0000000000000007"
	if err := tb.apply(1, command{Op: opJoin, Node: &first}); err != nil {
		t.Fatal(err)
	}
	if err := tb.apply(2, command{Op: opJoin, Node: &second}); err != nil {
		t.Fatal(err)
	}
	if len(tb.Nodes) != 1 || tb.Nodes[0].ID != first.ID {
		t.Fatalf("table %+v, want only the first node", tb.Nodes)
	}
}

// TestUnreachableMemberStaysALearner: a member that membership sees alive
// but whose raft messages never arrive (a wrong peer CA, a blocked peer
// port) is added as a learner and never made a voter; after lagSkipTicks
// the next members in join order take the seats, and the group keeps a
// quorum it can reach.
func TestUnreachableMemberStaysALearner(t *testing.T) {
	c := newCluster(t)
	c.start(1, true)
	c.mu.Lock()
	c.cut[2] = true
	c.mu.Unlock()
	c.start(2, false)
	c.start(3, false)
	c.start(4, false)
	c.until("voters 1, 3 and 4; 2 a learner", func() bool {
		c.mu.Lock()
		st := c.nodes[1].Status()
		c.mu.Unlock()
		return sameSet(st.Voters, []uint64{1, 3, 4}) && sameSet(st.Learners, []uint64{2})
	})
	// No node holds 2 as a voter.
	c.mu.Lock()
	for id, n := range c.nodes {
		if id != 2 && slices.Contains(n.Status().Voters, 2) {
			t.Errorf("node %d has 2 as a voter", id)
		}
	}
	c.mu.Unlock()
}

// TestFencedLeaderHandsItsLeadOver: the controller's leader is told its
// node is fenced (membership holds a majority of its peers dead, though its
// raft messages flow): it hands the lead to another voter. Unfenced, the
// group goes on.
func TestFencedLeaderHandsItsLeadOver(t *testing.T) {
	c := newCluster(t)
	c.start(1, true)
	c.start(2, false)
	c.start(3, false)
	three := []uint64{1, 2, 3}
	c.until("three voters", c.agreed(three, nil, three, nil))
	c.mu.Lock()
	old := c.nodes[1].Status().Leader
	fenced := c.nodes[old]
	c.mu.Unlock()
	fenced.SetFenced(true)
	c.until("another voter leads", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		var lead uint64
		for _, n := range c.nodes {
			st := n.Status()
			if st.Leader == 0 || st.Leader == old || (lead != 0 && st.Leader != lead) {
				return false
			}
			lead = st.Leader
		}
		return true
	})
	fenced.SetFenced(false)
	c.until("three voters, one leader", c.agreed(three, nil, three, nil))
}
