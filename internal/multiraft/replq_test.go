package multiraft

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/queue"
)

// This file is a thin replicated queue: queue.State applied from committed
// raft entries, one queue event per entry (offset = raft index), on the
// Host and the faulty Network. It checks the promises a replicated
// partition makes: a confirmed publish is never lost, a settled message
// never comes back, and every replica applies the same events at the same
// indexes.

// qStore is a replica's raft storage: what raft reads, and save, which
// makes a Ready's HardState, entries and snapshot durable before the
// Ready's messages are sent.
type qStore interface {
	raft.Storage
	save(rd *raft.Ready) error
}

// memStore keeps everything it saves: a crash loses nothing saved, as a
// store that fsyncs in save would.
type memStore struct{ *raft.MemoryStorage }

func (m memStore) save(rd *raft.Ready) error {
	if !raft.IsEmptySnap(rd.Snapshot) {
		if err := m.ApplySnapshot(rd.Snapshot); err != nil {
			return err
		}
	}
	if !raft.IsEmptyHardState(rd.HardState) {
		if err := m.SetHardState(rd.HardState); err != nil {
			return err
		}
	}
	// MemoryStorage.Append truncates a conflicting suffix first, as a
	// follower must when a new leader overwrites it.
	return m.Append(rd.Entries)
}

// qReplica is one replica of a replicated queue.
type qReplica struct {
	c        *qCluster
	node     uint64
	group    uint64
	store    qStore
	rn       *raft.RawNode
	q        *queue.State
	applied  uint64
	send     func([]*raftpb.Message)
	mine     map[string]bool // publish bodies this replica proposed, until applied
	myAcks   map[uint64]bool // offsets this replica proposed an ack for, until applied
	rejected int             // committed events the state refused (applied as gaps)
	dead     bool            // crashed in the middle of a save; ignores everything
	quiesce  Quiescence
	live     func(node uint64) bool // the host's Live
}

func qRaftConfig(id uint64, st raft.Storage, voters int) *raft.Config {
	cfg := raftConfig(id, st, voters)
	// Only the leader proposes, as only a partition's owner accepts
	// publishes and settles.
	cfg.DisableProposalForwarding = true
	return cfg
}

func (r *qReplica) Step(m *raftpb.Message) error {
	if r.dead {
		return errCrashed
	}
	r.quiesce.Observe(m, r.rn.BasicStatus().Lead)
	err := r.rn.Step(*m)
	r.handleReady()
	return err
}

func (r *qReplica) Tick() {
	if r.dead {
		return
	}
	r.rn.Tick()
	r.handleReady()
}

// Quiet implements Quieter.
func (r *qReplica) Quiet() bool {
	if r.dead {
		return true
	}
	if len(r.c.groups[r.group]) == 1 {
		return true
	}
	last, _ := r.store.LastIndex()
	return r.quiesce.Quiet(r.rn, last, r.live)
}

func (r *qReplica) handleReady() {
	for !r.dead && r.rn.HasReady() {
		rd := r.rn.Ready()
		if err := r.store.save(&rd); errors.Is(err, errCrashed) {
			// The process dies here: nothing of this Ready is sent or
			// applied. The cluster crashes the node after this round.
			r.dead = true
			r.c.crashPending[r.node] = true
			return
		} else if err != nil {
			r.c.fail("node %d group %d: save: %v", r.node, r.group, err)
		}
		if len(rd.Messages) > 0 {
			r.send(msgPtrs(rd.Messages))
		}
		for i := range rd.CommittedEntries {
			r.apply(&rd.CommittedEntries[i])
		}
		r.rn.Advance(rd)
	}
}

// apply folds one committed entry into the queue state: a leader's empty
// entry is a settled gap, every other entry one event.
func (r *qReplica) apply(e *raftpb.Entry) {
	idx := e.Index
	if idx != r.applied+1 {
		r.c.fail("node %d group %d: applied %d after %d", r.node, r.group, idx, r.applied)
	}
	r.applied = idx
	if a, ok := r.store.(interface{ SetApplied(uint64) }); ok {
		a.SetApplied(idx)
	}
	r.c.hist[r.group].observe(r.node, e)
	data := e.Data
	if e.Type != raftpb.EntryNormal || len(data) == 0 {
		if err := r.q.ApplyGap(idx); err != nil {
			r.c.fail("node %d group %d: gap %d: %v", r.node, r.group, idx, err)
		}
		return
	}
	ev, err := queue.DecodeEvent(data[0], data[1:])
	if err != nil {
		r.c.fail("node %d group %d: index %d: %v", r.node, r.group, idx, err)
	}
	if at := r.c.settled[r.group][ev.Offset]; ev.Kind == queue.KindLease && at != 0 && idx > at {
		r.c.fail("node %d group %d: index %d leases offset %d, settled at index %d", r.node, r.group, idx, ev.Offset, at)
	}
	if err := r.q.Apply(idx, ev); err != nil {
		// A committed event the state refuses (decided on a state that
		// changed before it committed) is a gap on every replica alike.
		r.rejected++
		r.q.ApplyGap(idx)
		return
	}
	switch ev.Kind {
	case queue.KindEnqueue:
		body := string(ev.Msg.Body)
		if r.mine[body] {
			delete(r.mine, body)
			r.c.confirm(r.group, body, idx)
		}
	case queue.KindAck:
		if r.myAcks[ev.Offset] {
			delete(r.myAcks, ev.Offset)
			r.c.settle(r.group, ev.Offset, idx)
		}
	}
}

func (r *qReplica) leader() bool {
	return !r.dead && r.rn.BasicStatus().RaftState == raft.StateLeader
}

// caughtUp reports whether the leader has applied its whole log, so a
// command decided on its state now sees every earlier entry.
func (r *qReplica) caughtUp() bool {
	last, _ := r.store.LastIndex()
	return r.leader() && r.applied == last
}

func (r *qReplica) proposeEvent(ev queue.Event) error {
	data := ev.Marshal([]byte{uint8(ev.Kind)})
	r.quiesce.Wake()
	err := r.rn.Propose(data)
	r.handleReady()
	return err
}

// publish proposes body as a new message (leader only).
func (r *qReplica) publish(body string, nowMs int64) bool {
	evs, err := r.q.Enqueue(nil, &queue.Message{Body: []byte(body)}, nowMs)
	if err != nil {
		r.c.fail("enqueue: %v", err)
	}
	r.mine[body] = true
	if r.proposeEvent(evs[0]) != nil {
		delete(r.mine, body)
		return false
	}
	return true
}

// lease proposes leases of up to max messages to owner (caught-up leader only).
func (r *qReplica) lease(owner string, max int, nowMs int64) int {
	evs := r.q.Lease(nil, owner, max, nowMs)
	for _, ev := range evs {
		if r.proposeEvent(ev) != nil {
			return 0
		}
	}
	return len(evs)
}

// ackOne proposes an ack of one of owner's leases, picked by rng (caught-up leader only).
func (r *qReplica) ackOne(rng *rand.Rand, owner string) bool {
	inf := r.q.Inflight(owner)
	if len(inf) == 0 {
		return false
	}
	in := inf[rng.IntN(len(inf))]
	evs, err := r.q.Ack(nil, in.Offset, in.LeaseID)
	if err != nil {
		r.c.fail("ack: %v", err)
	}
	r.myAcks[in.Offset] = true
	r.c.ackProposed[r.group][in.Offset] = true
	return r.proposeEvent(evs[0]) == nil
}

// qNode is one node: a host and its replicas; stores survive a crash.
type qNode struct {
	id     uint64
	host   *Host
	down   bool
	reps   map[uint64]*qReplica
	stores map[uint64]qStore
}

// qCluster is three (or more) nodes running replicated queue groups in
// simulated time on one Network, driven from the test goroutine.
type qCluster struct {
	t        testing.TB
	seed     uint64
	now      time.Time
	nextTick time.Time
	net      *Network
	nodeIDs  []uint64
	nodes    map[uint64]*qNode
	groups   map[uint64][]uint64 // group -> voters
	hist     map[uint64]*history
	// reopen rebuilds a node's store for group after a crash (nil: the
	// store object survives as it is).
	reopen   func(node, group uint64) qStore
	newStore func(node, group uint64, voters []uint64) qStore
	// onCrash is the power loss of a node's storage (nil: stores survive
	// whole).
	onCrash func(node uint64)
	// crashPending holds nodes whose replica died in a save this round.
	crashPending map[uint64]bool
	// armTornSave, when set, is a random run's chance to make a later save
	// crash before its sync.
	armTornSave func(rng *rand.Rand)

	confirmed map[uint64]map[string]uint64 // group -> body -> offset, as the client saw it
	settled   map[uint64]map[uint64]uint64 // group -> offset whose ack was confirmed -> the ack's index
	// ackProposed holds every offset an ack was proposed for: an ack
	// can commit without its proposer confirming it (the proposer crashed
	// or was deposed first), so only these may be settled unconfirmed.
	ackProposed map[uint64]map[uint64]bool
	published   int
}

func newQCluster(t testing.TB, seed uint64, nodes int, f Faults) *qCluster {
	c := &qCluster{
		t: t, seed: seed,
		now:          time.Unix(1_800_000_000, 0),
		nodes:        make(map[uint64]*qNode),
		groups:       make(map[uint64][]uint64),
		hist:         make(map[uint64]*history),
		confirmed:    make(map[uint64]map[string]uint64),
		settled:      make(map[uint64]map[uint64]uint64),
		ackProposed:  make(map[uint64]map[uint64]bool),
		crashPending: make(map[uint64]bool),
	}
	c.newStore = func(_, _ uint64, voters []uint64) qStore { return memStore{bootstrapStorage(voters)} }
	c.nextTick = c.now.Add(tickEvery)
	c.net = NewNetwork(seed, func() time.Time { return c.now }, f)
	for i := 1; i <= nodes; i++ {
		id := uint64(i)
		c.nodeIDs = append(c.nodeIDs, id)
		c.nodes[id] = &qNode{id: id, reps: make(map[uint64]*qReplica), stores: make(map[uint64]qStore)}
		c.startHost(c.nodes[id])
	}
	return c
}

func (c *qCluster) fail(format string, args ...any) {
	c.t.Helper()
	c.t.Fatalf("seed %d: %s", c.seed, fmt.Sprintf(format, args...))
}

func (c *qCluster) nowMs() int64 { return c.now.UnixMilli() }

func (c *qCluster) startHost(n *qNode) {
	h, err := NewHost(Config{NodeID: n.id, Transport: c.net.Endpoint(n.id)})
	if err != nil {
		c.t.Fatal(err)
	}
	n.host, n.down = h, false
	c.net.Attach(n.id, h)
}

func (c *qCluster) addGroup(g uint64, voters []uint64) {
	c.groups[g] = voters
	c.hist[g] = newHistory(g, c.fail)
	c.confirmed[g] = make(map[string]uint64)
	c.settled[g] = make(map[uint64]uint64)
	c.ackProposed[g] = make(map[uint64]bool)
	for _, v := range voters {
		n := c.nodes[v]
		n.stores[g] = c.newStore(v, g, voters)
		c.startReplica(n, g)
	}
}

func (c *qCluster) startReplica(n *qNode, g uint64) {
	st := n.stores[g]
	rn, err := raft.NewRawNode(qRaftConfig(n.id, st, len(c.groups[g])))
	if err != nil {
		c.t.Fatal(err)
	}
	first, _ := st.FirstIndex()
	r := &qReplica{
		c: c, node: n.id, group: g, store: st, rn: rn,
		q:       queue.New(queue.Config{MaxRetries: -1}),
		applied: first - 1,
		send:    n.host.Sender(g),
		live:    n.host.Live,
		mine:    make(map[string]bool),
		myAcks:  make(map[uint64]bool),
	}
	// The bootstrap snapshot at index 1 holds no queue event.
	r.q.ApplyGap(first - 1)
	n.reps[g] = r
	if err := n.host.AddGroup(g, r); err != nil {
		c.t.Fatal(err)
	}
	if len(c.groups[g]) == 1 {
		rn.Campaign()
		r.handleReady()
	}
}

// crash kills node id: host, replicas and their queue states are gone;
// only what the stores saved survives (through reopen, when set).
func (c *qCluster) crash(id uint64) {
	n := c.nodes[id]
	n.down, n.host = true, nil
	clear(n.reps)
	c.net.Detach(id)
	delete(c.crashPending, id)
	if c.onCrash != nil {
		c.onCrash(id)
	}
}

func (c *qCluster) restart(id uint64) {
	n := c.nodes[id]
	c.startHost(n)
	for _, g := range c.groupIDs() {
		if _, ok := n.stores[g]; !ok {
			continue
		}
		if c.reopen != nil {
			n.stores[g] = c.reopen(id, g)
		}
		c.startReplica(n, g)
	}
}

func (c *qCluster) groupIDs() []uint64 {
	var ids []uint64
	for g := range c.groups {
		ids = append(ids, g)
	}
	slices.Sort(ids)
	return ids
}

func (c *qCluster) confirm(g uint64, body string, off uint64) {
	if prev, ok := c.confirmed[g][body]; ok && prev != off {
		// The same body committed twice is a duplicate publish, which
		// at-least-once allows; the client saw the first confirm.
		return
	}
	c.confirmed[g][body] = off
}

func (c *qCluster) settle(g, off, ackIndex uint64) {
	if _, ok := c.settled[g][off]; !ok {
		c.settled[g][off] = ackIndex
	}
}

// leaderOf returns group g's leader replica, the one with the highest
// term among live replicas that think they lead, or nil.
func (c *qCluster) leaderOf(g uint64) *qReplica {
	var best *qReplica
	var term uint64
	for _, id := range c.nodeIDs {
		n := c.nodes[id]
		if n.down {
			continue
		}
		if r, ok := n.reps[g]; ok && r.leader() {
			if t := r.rn.BasicStatus().HardState.Term; t > term {
				best, term = r, t
			}
		}
	}
	return best
}

func (c *qCluster) run(d time.Duration) {
	end := c.now.Add(d)
	for {
		next := c.nextTick
		if due, ok := c.net.NextDue(); ok && due.Before(next) {
			next = due
		}
		if next.After(end) {
			c.now = end
			return
		}
		c.now = next
		c.net.DeliverDue(c.now)
		tick := !c.now.Before(c.nextTick)
		if tick {
			c.nextTick = c.nextTick.Add(tickEvery)
		}
		for _, id := range c.nodeIDs {
			n := c.nodes[id]
			if n.down {
				continue
			}
			if tick {
				n.host.Tick()
			}
			for range 100 {
				if n.host.Process()+n.host.Flush() == 0 {
					break
				}
			}
			if c.crashPending[id] {
				c.crash(id)
			}
		}
	}
}

// work does one random client action on group g's leader: publish, lease
// or ack. Lease and ack are decided only by a caught-up leader.
func (c *qCluster) work(rng *rand.Rand, g uint64) {
	r := c.leaderOf(g)
	if r == nil {
		return
	}
	switch x := rng.IntN(10); {
	case x < 5:
		c.published++
		r.publish(fmt.Sprintf("s%d-g%d-m%d", c.seed, g, c.published), c.nowMs())
	case x < 8:
		if r.caughtUp() {
			r.lease("consumer", 1+rng.IntN(4), c.nowMs())
		}
	default:
		if r.caughtUp() {
			r.ackOne(rng, "consumer")
		}
	}
}

// settleAll heals the network, drops the faults, restarts crashed nodes
// and runs until every group has a leader and every replica applied the
// group's whole history.
func (c *qCluster) settleAll(limit time.Duration) {
	c.net.Heal()
	c.net.SetFaults(Faults{})
	deadline := c.now.Add(limit)
	for c.now.Before(deadline) {
		// A save armed to crash may still fire here: bring the node back.
		for _, id := range c.nodeIDs {
			if c.nodes[id].down {
				c.restart(id)
			}
		}
		c.run(50 * time.Millisecond)
		if c.allSettled() {
			return
		}
	}
	c.fail("not settled within %v", limit)
}

func (c *qCluster) allSettled() bool {
	for g, voters := range c.groups {
		l := c.leaderOf(g)
		if l == nil || !l.caughtUp() {
			return false
		}
		for _, v := range voters {
			r, ok := c.nodes[v].reps[g]
			if c.nodes[v].down || !ok || r.dead || r.applied != c.hist[g].last {
				return false
			}
		}
	}
	return true
}

// check is the chaos checker's rules on every replica of every group:
// every confirmed publish is present at its offset (unsettled unless its
// ack was confirmed), every confirmed settle is settled, and all replicas
// hold the same queue state. It returns confirmed and settled counts.
func (c *qCluster) check() (confirmed, settled int) {
	for _, g := range c.groupIDs() {
		var ref queue.Stats
		for i, v := range c.groups[g] {
			r := c.nodes[v].reps[g]
			for body, off := range c.confirmed[g] {
				e := c.hist[g].entries[off]
				ev, err := queue.DecodeEvent(e.data[0], []byte(e.data[1:]))
				if err != nil || ev.Kind != queue.KindEnqueue || string(ev.Msg.Body) != body {
					c.fail("group %d: confirmed %q at offset %d, the log holds %v (%v)", g, body, off, ev.Kind, err)
				}
				info, ok := r.q.Lookup(off, c.nowMs())
				if !ok {
					c.fail("group %d node %d: confirmed offset %d not in the state (next %d)", g, v, off, r.q.NextLSN())
				}
				if info.State == queue.StateSettled && !c.ackProposed[g][off] {
					c.fail("group %d node %d: confirmed offset %d settled, and nobody acked it", g, v, off)
				}
			}
			for off := range c.settled[g] {
				if info, _ := r.q.Lookup(off, c.nowMs()); info.State != queue.StateSettled {
					c.fail("group %d node %d: settled offset %d is %v again", g, v, off, info.State)
				}
			}
			st := r.q.Stats(c.nowMs())
			if i == 0 {
				ref = st
			} else if st != ref {
				c.fail("group %d: node %d state %+v, node %d %+v", g, v, st, c.groups[g][0], ref)
			}
		}
		confirmed += len(c.confirmed[g])
		settled += len(c.settled[g])
	}
	return confirmed, settled
}

// checkLogsAgree is Log Matching on the stores, up to each pair's lower
// commit index.
func (c *qCluster) checkLogsAgree() {
	for _, g := range c.groupIDs() {
		voters := c.groups[g]
		for i := range voters {
			for j := i + 1; j < len(voters); j++ {
				a, b := c.nodes[voters[i]].stores[g], c.nodes[voters[j]].stores[g]
				ha, _, _ := a.InitialState()
				hb, _, _ := b.InitialState()
				hi := min(ha.Commit, hb.Commit)
				fa, _ := a.FirstIndex()
				fb, _ := b.FirstIndex()
				lo := max(fa, fb)
				if hi < lo {
					continue
				}
				ea, err1 := a.Entries(lo, hi+1, 1<<62)
				eb, err2 := b.Entries(lo, hi+1, 1<<62)
				if err1 != nil || err2 != nil {
					c.fail("group %d: entries %d..%d: %v %v", g, lo, hi, err1, err2)
				}
				for k := range ea {
					if ea[k].Term != eb[k].Term || string(ea[k].Data) != string(eb[k].Data) {
						c.fail("group %d: nodes %d and %d differ at committed index %d", g, voters[i], voters[j], ea[k].Index)
					}
				}
			}
		}
	}
}

func (c *qCluster) waitLeader(g uint64, limit time.Duration) *qReplica {
	deadline := c.now.Add(limit)
	for c.now.Before(deadline) {
		if l := c.leaderOf(g); l != nil && l.caughtUp() {
			return l
		}
		c.run(tickEvery)
	}
	c.fail("group %d: no caught-up leader within %v", g, limit)
	return nil
}

var all3 = []uint64{1, 2, 3}

// A 3-replica queue group elects a leader, replicates publishes, leases
// and acks, and every replica ends with the same queue state.
func TestReplicatedQueueElectsAndReplicates(t *testing.T) {
	c := newQCluster(t, 1, 3, Faults{DelayMinMs: 1, DelayMaxMs: 3})
	c.addGroup(1, all3)
	l := c.waitLeader(1, 5*time.Second)
	for i := range 40 {
		l.publish(fmt.Sprintf("m%d", i), c.nowMs())
	}
	c.run(time.Second)
	if n := len(c.confirmed[1]); n != 40 {
		t.Fatalf("confirmed %d of 40 publishes", n)
	}
	if n := l.lease("consumer", 10, c.nowMs()); n != 10 {
		t.Fatalf("leased %d, want 10", n)
	}
	c.run(time.Second)
	for range 5 {
		if !l.caughtUp() || !l.ackOne(rand.New(rand.NewPCG(1, 1)), "consumer") {
			t.Fatal("ack not proposed")
		}
		c.run(200 * time.Millisecond)
	}
	c.settleAll(5 * time.Second)
	confirmed, settled := c.check()
	c.checkLogsAgree()
	if confirmed != 40 || settled != 5 {
		t.Fatalf("confirmed %d settled %d, want 40 and 5", confirmed, settled)
	}
	for _, v := range all3 {
		st := c.nodes[v].reps[1].q.Stats(c.nowMs())
		if st.Ready != 30 || st.Inflight != 5 {
			t.Fatalf("node %d: %+v, want 30 ready, 5 inflight", v, st)
		}
	}
}

// The leader crashes in the middle of a publish and settle load: a new
// leader takes over, and after the old one restarts no confirmed publish
// is lost and no settled message comes back.
func TestReplicatedQueueSurvivesLeaderCrash(t *testing.T) {
	c := newQCluster(t, 3, 3, Faults{DelayMinMs: 1, DelayMaxMs: 5})
	c.addGroup(1, all3)
	rng := rand.New(rand.NewPCG(3, 3))
	c.waitLeader(1, 5*time.Second)
	for range 200 {
		c.work(rng, 1)
		c.run(5 * time.Millisecond)
	}
	old := c.leaderOf(1)
	if old == nil {
		t.Fatal("no leader before the crash")
	}
	// Leave proposals in flight at the crash.
	for i := range 10 {
		old.publish(fmt.Sprintf("in-flight-%d", i), c.nowMs())
	}
	c.crash(old.node)
	nl := c.waitLeader(1, 5*time.Second)
	if nl.node == old.node {
		t.Fatal("crashed node leads")
	}
	for range 200 {
		c.work(rng, 1)
		c.run(5 * time.Millisecond)
	}
	c.restart(old.node)
	c.settleAll(10 * time.Second)
	confirmed, settled := c.check()
	c.checkLogsAgree()
	if confirmed < 50 || settled < 10 {
		t.Fatalf("too little load to mean anything: confirmed %d settled %d", confirmed, settled)
	}
	t.Logf("confirmed %d, settled %d", confirmed, settled)
}

// A leader cut off from the others keeps appending proposals it cannot
// commit; the majority elects a new leader and commits other entries at
// those indexes; after the heal the deposed leader's uncommitted suffix is
// overwritten, never applied, and none of it was confirmed.
func TestReplicatedQueueTruncatesDeposedLeaderSuffix(t *testing.T) {
	c := newQCluster(t, 4, 3, Faults{DelayMinMs: 1, DelayMaxMs: 3})
	c.addGroup(1, all3)
	l := c.waitLeader(1, 5*time.Second)
	for i := range 5 {
		l.publish(fmt.Sprintf("before-%d", i), c.nowMs())
	}
	c.run(time.Second)
	base := l.applied
	c.net.Isolate(l.node, all3)
	for i := range 5 {
		if !l.publish(fmt.Sprintf("lost-%d", i), c.nowMs()) {
			t.Fatal("isolated leader refused a proposal before it stepped down")
		}
	}
	lastOld, _ := l.store.LastIndex()
	if lastOld != base+5 {
		t.Fatalf("deposed leader's log ends at %d, want %d", lastOld, base+5)
	}
	c.run(3 * time.Second)
	var nl *qReplica
	for _, id := range all3 {
		if r := c.nodes[id].reps[1]; id != l.node && r.leader() {
			nl = r
		}
	}
	if nl == nil {
		t.Fatal("majority elected no leader")
	}
	for i := range 8 {
		nl.publish(fmt.Sprintf("kept-%d", i), c.nowMs())
	}
	c.run(time.Second)
	c.settleAll(10 * time.Second)
	c.check()
	c.checkLogsAgree()
	for body := range c.confirmed[1] {
		if len(body) > 4 && body[:4] == "lost" {
			t.Fatalf("%s was confirmed", body)
		}
	}
	// The old leader's store now holds the new leader's entries at the
	// indexes of its lost suffix.
	ents, err := l.store.Entries(base+1, lastOld+1, 1<<62)
	if err != nil {
		t.Fatal(err)
	}
	oldTerm := c.hist[1].entries[base].term
	for _, e := range ents {
		if e.Term <= oldTerm {
			t.Fatalf("index %d still holds term %d (deposed leader's term %d)", e.Index, e.Term, oldTerm)
		}
		if d := e.Data; len(d) > 0 {
			if ev, err := queue.DecodeEvent(d[0], d[1:]); err == nil && ev.Kind == queue.KindEnqueue && strings.HasPrefix(string(ev.Msg.Body), "lost") {
				t.Fatalf("index %d holds %s", e.Index, ev.Msg.Body)
			}
		}
	}
	// No replica applied any of it: the history of applied entries holds
	// no lost publish.
	for off, e := range c.hist[1].entries {
		if strings.Contains(e.data, "lost-") {
			t.Fatalf("a lost publish was applied at %d", off)
		}
	}
}

// Randomised runs: queue groups of three and one on a network that drops,
// duplicates, delays and reorders, with partitions, heals, and crashes of
// one node at a time, under a publish/lease/ack load; the checker runs
// after everything heals.
func TestReplicatedQueueRandomized(t *testing.T) {
	for _, seed := range seeds(t, 20) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			c := newQCluster(t, seed, 3, Faults{})
			replqRandomRun(t, c, seed)
		})
	}
}

func replqRandomRun(t *testing.T, c *qCluster, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 77))
	c.net.SetFaults(Faults{
		DropPermille: rng.IntN(150),
		DupPermille:  rng.IntN(100),
		DelayMinMs:   rng.IntN(3),
		DelayMaxMs:   3 + rng.IntN(30),
		Reorder:      rng.IntN(2) == 0,
	})
	c.addGroup(1, all3)
	c.addGroup(2, all3)
	c.addGroup(3, []uint64{uint64(1 + rng.IntN(3))})
	for step := range 400 {
		switch x := rng.IntN(100); {
		case x < 75:
			c.work(rng, uint64(1+rng.IntN(3)))
		case x < 79:
			c.net.Isolate(uint64(1+rng.IntN(3)), all3)
		case x < 87:
			c.net.Heal()
		case x < 90:
			down := false
			for _, id := range all3 {
				down = down || c.nodes[id].down
			}
			if !down && len(c.crashPending) == 0 {
				c.crash(uint64(1 + rng.IntN(3)))
			}
		case x < 93:
			if c.armTornSave != nil {
				c.armTornSave(rng)
			}
		case x < 97:
			for _, id := range all3 {
				if c.nodes[id].down {
					c.restart(id)
				}
			}
		}
		_ = step
		c.run(time.Duration(2+rng.IntN(30)) * time.Millisecond)
	}
	c.settleAll(30 * time.Second)
	confirmed, settled := c.check()
	c.checkLogsAgree()
	if confirmed == 0 {
		t.Fatalf("seed %d: nothing confirmed", seed)
	}
	t.Logf("seed %d: %d publishes, %d confirmed, %d settled; net %+v", seed, c.published, confirmed, settled, c.net.Stats())
}
