package controller

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"time"
)

// Queue is one queue in the controller's catalogue: its declaration and
// where its partitions live. Applied entries are never changed in place
// (a Status shares them).
type Queue struct {
	Topic string `json:"topic"`
	Group string `json:"group,omitempty"`
	// Settings is the broker's declaration of the queue; the controller
	// stores it and does not read it.
	Settings json.RawMessage `json:"settings,omitempty"`
	// Partitions holds partition i's placement at index i.
	Partitions []Placement `json:"partitions"`
	// CreatedAt is the controller log index of the entry that created it.
	CreatedAt uint64 `json:"created_at"`
	// PurgeSeq is the index of the last purge_queue entry (0: none).
	// Each partition's owner carries it out and reports it:
	// PurgeDone[i] is the last purge partition i carried out, and
	// PurgeCount[i] how many messages it discarded.
	PurgeSeq   uint64   `json:"purge_seq,omitempty"`
	PurgeDone  []uint64 `json:"purge_done,omitempty"`
	PurgeCount []uint64 `json:"purge_count,omitempty"`
	// Pinned is set once an operator move of the queue is done
	// (moves.go): the rebalancer leaves its replicas where they are.
	Pinned bool `json:"pinned,omitempty"`
}

// Placement is one partition's raft group and its replicas.
type Placement struct {
	// RaftGroup is the partition's multi-raft group id, unique in the
	// cluster and never reused.
	RaftGroup uint64 `json:"raft_group"`
	// Replicas are the raft ids of the nodes holding a replica, the
	// preferred owner first.
	Replicas []uint64 `json:"replicas"`
	// Bootstrap are the group's voters when it started (the first
	// Replicas). A replica placed later joins the running group: the
	// owner adds it as a learner, catches it up and promotes it.
	Bootstrap []uint64 `json:"bootstrap,omitempty"`
	// Moving is set while the group's configuration is not yet Replicas:
	// from a replica move until the owner reports the group's voters are
	// exactly Replicas (placement_done). A replica no longer placed may
	// drop its files only once it is clear.
	Moving bool `json:"moving,omitempty"`
}

// FirstPartitionGroup is the raft group id of the first partition ever
// placed; the ids below it are the controller's own.
const FirstPartitionGroup = 1 << 16

// Bounds of the catalogue.
const (
	// QueuesMax bounds the queues in the catalogue.
	QueuesMax = 100_000
	// PartitionsMax bounds one queue's partitions.
	PartitionsMax = 1024
	// ReplicationMax bounds one partition's replicas.
	ReplicationMax = 7
)

// ErrNoLeader is returned by a proposal while the controller group has no
// leader this node knows of; it may succeed later.
var ErrNoLeader = errors.New("controller: no leader")

// Queue returns the queue topic/group of the catalogue.
func (t *Table) Queue(topic, group string) (Queue, bool) {
	i, ok := t.findQueue(topic, group)
	if !ok {
		return Queue{}, false
	}
	return t.Queues[i], true
}

func (t *Table) findQueue(topic, group string) (int, bool) {
	i := sort.Search(len(t.Queues), func(i int) bool {
		q := &t.Queues[i]
		return q.Topic > topic || q.Topic == topic && q.Group >= group
	})
	return i, i < len(t.Queues) && t.Queues[i].Topic == topic && t.Queues[i].Group == group
}

// applyCreateQueue adds a queue unless the catalogue holds it already (two
// nodes may propose the same queue; the first entry wins). Replicas must
// be nodes of the table that have not left; a command that names others,
// or breaks a bound, is applied as nothing, the same way on every replica.
func (t *Table) applyCreateQueue(index uint64, q *Queue) error {
	if q == nil || q.Topic == "" {
		return fmt.Errorf("%w: create_queue without a queue", ErrCommand)
	}
	i, ok := t.findQueue(q.Topic, q.Group)
	if ok || len(t.Queues) >= QueuesMax || len(q.Partitions) == 0 || len(q.Partitions) > PartitionsMax {
		return nil
	}
	next := max(t.NextRaftGroup, FirstPartitionGroup)
	parts := make([]Placement, len(q.Partitions))
	for p, pl := range q.Partitions {
		if len(pl.Replicas) == 0 || len(pl.Replicas) > ReplicationMax {
			return nil
		}
		seen := map[uint64]bool{}
		for _, r := range pl.Replicas {
			n, ok := t.Node(r)
			if !ok || n.Left || seen[r] {
				return nil
			}
			seen[r] = true
		}
		parts[p] = Placement{RaftGroup: next, Replicas: slices.Clone(pl.Replicas), Bootstrap: slices.Clone(pl.Replicas)}
		next++
	}
	t.NextRaftGroup = next
	nq := Queue{Topic: q.Topic, Group: q.Group, Settings: slices.Clone(q.Settings), Partitions: parts, CreatedAt: index}
	t.Queues = slices.Insert(t.Queues, i, nq)
	return nil
}

// Place chooses the replicas of a queue's n partitions, spread first over
// the live members: the queue's replica set is the rf members holding the
// fewest partition replicas (the node load the catalogue itself records,
// so it is never stale), ties broken in join order from a start that moves
// with the catalogue's size, so that successive queues on equally loaded
// nodes start on different nodes; with equal loads the set is rf members
// in a row. Partition p's preferred owner is the p-th of that set, so a
// queue's partitions are led by different nodes. Every partition of a
// queue has the same replica set: a node holds all of a queue or none of
// it. rf is capped by the live members; live lists the members that may
// hold a replica.
func Place(t *Table, live []uint64, n, rf int) []Placement {
	return PlaceLoaded(t, live, n, rf, nil)
}

// PlaceLoaded is Place where, among members holding as many replicas,
// the less loaded by their reports (loads) come first, when every one of
// them has a report; otherwise, and with no loads, it is Place.
func PlaceLoaded(t *Table, live []uint64, n, rf int, loads NodeLoads) []Placement {
	members := make([]uint64, 0, len(live))
	for _, id := range t.members() {
		if slices.Contains(live, id) {
			members = append(members, id)
		}
	}
	if len(members) == 0 || n <= 0 {
		return nil
	}
	rf = min(max(rf, 1), len(members), ReplicationMax)
	start := len(t.Queues)
	order := make([]uint64, len(members))
	for i := range order {
		order[i] = members[(start+i)%len(members)]
	}
	orderBy(order, t.replicaCounts(), loads)
	set := order[:rf]
	out := make([]Placement, n)
	for p := range out {
		rs := make([]uint64, rf)
		for r := range rs {
			rs[r] = set[(p+r)%rf]
		}
		out[p] = Placement{Replicas: rs}
	}
	return out
}

// CreateQueue proposes a queue with the given placement (RaftGroup ids are
// assigned when the entry applies) and waits until this node has applied
// the entry that holds it, or ctx ends. It returns the queue as the
// catalogue holds it, which is another proposal's if one came first. It
// may be called on any node: a follower's proposal goes to the leader.
func (c *Controller) CreateQueue(ctx context.Context, q Queue) (Queue, error) {
	if err := checkPlacement(q.Partitions); err != nil {
		return Queue{}, err
	}
	data, err := encode(command{Op: opCreateQueue, Queue: &q})
	if err != nil {
		return Queue{}, err
	}
	var cur Queue
	err = c.proposeUntil(ctx, data, func(st Status) bool {
		var ok bool
		cur, ok = st.Table.Queue(q.Topic, q.Group)
		return ok
	})
	return cur, err
}

// proposeUntil proposes data, to each new leader and again every
// proposeRetryInterval (a proposal may be lost with a change of leader, or
// applied as nothing when a replica's node left meanwhile), until done
// finds its effect in the table this node applied, or ctx ends.
func (c *Controller) proposeUntil(ctx context.Context, data []byte, done func(Status) bool) error {
	var retry <-chan time.Time
	proposedTo := uint64(0) // the leader the last proposal went to
	for {
		changed := c.Changed()
		st := c.Status()
		if done(st) {
			return nil
		}
		if st.Err != "" {
			return fmt.Errorf("controller failed: %s", st.Err)
		}
		if st.Leader != 0 && (proposedTo != st.Leader || retry == nil) {
			c.propose(data)
			proposedTo, retry = st.Leader, time.After(proposeRetryInterval)
		}
		select {
		case <-ctx.Done():
			if st.Leader == 0 {
				return ErrNoLeader
			}
			return ctx.Err()
		case <-changed:
		case <-retry:
			retry = nil
		}
	}
}

// checkPlacement refuses a placement the catalogue would not apply.
func checkPlacement(ps []Placement) error {
	if len(ps) == 0 || len(ps) > PartitionsMax {
		return fmt.Errorf("controller: %d partitions, want 1 to %d", len(ps), PartitionsMax)
	}
	for p, pl := range ps {
		s := slices.Clone(pl.Replicas)
		slices.Sort(s)
		if len(s) == 0 || len(s) > ReplicationMax || len(slices.Compact(s)) != len(pl.Replicas) || s[0] == 0 {
			return fmt.Errorf("controller: partition %d: replicas %v: want 1 to %d distinct nodes", p, pl.Replicas, ReplicationMax)
		}
	}
	return nil
}

// propose hands data to the controller's goroutine, which proposes it
// (a follower forwards it to the leader). A proposal may be lost with a
// change of leader; callers wait for its effect and propose again.
func (c *Controller) propose(data []byte) {
	select {
	case c.proposals <- data:
		c.poke()
	default:
		// Full: the waiters propose again.
	}
}

// applyReplaceReplica moves a queue's replicas from node from to node to, in
// every partition (a queue's partitions share one replica set): the recovery
// plan for a node that died or left. It is applied as nothing, the same way
// on every replica, when the queue does not hold from, holds to already, or
// to is not a member.
func (t *Table) applyReplaceReplica(c *command) error {
	if c.Queue == nil || c.From == 0 || c.To == 0 {
		return fmt.Errorf("%w: replace_replica without a queue or nodes", ErrCommand)
	}
	return t.changeReplicas(c, func(pl Placement) ([]uint64, bool) {
		at := slices.Index(pl.Replicas, c.From)
		if at < 0 || slices.Contains(pl.Replicas, c.To) {
			return nil, false
		}
		rs := slices.Clone(pl.Replicas)
		rs[at] = c.To
		return rs, true
	})
}

// changeReplicas gives every partition of c.Queue the replicas change
// returns for it and marks them moving; it is applied as nothing, the same
// way on every replica, when the catalogue does not hold the queue, c.To
// is not a member, or change refuses a partition (false).
func (t *Table) changeReplicas(c *command, change func(Placement) ([]uint64, bool)) error {
	if n, ok := t.Node(c.To); !ok || n.Left {
		return nil
	}
	t.rewriteReplicas(c.Queue.Topic, c.Queue.Group, change)
	return nil
}

// applyAddReplica adds node To to a queue's replicas, in every partition,
// after the others (a replica the placement grows by: the queue has fewer
// than the replication factor, as one created while the cluster formed).
// It is applied as nothing, the same way on every replica, when the queue
// holds To already, has ReplicationMax replicas, has a move under way, or
// To is not a member.
func (t *Table) applyAddReplica(c *command) error {
	if c.Queue == nil || c.To == 0 {
		return fmt.Errorf("%w: add_replica without a queue or node", ErrCommand)
	}
	return t.changeReplicas(c, func(pl Placement) ([]uint64, bool) {
		if pl.Moving || len(pl.Replicas) >= ReplicationMax || slices.Contains(pl.Replicas, c.To) {
			return nil, false
		}
		return append(slices.Clone(pl.Replicas), c.To), true
	})
}

// ReplicationWant is how many replicas each queue should have: rf, capped
// by the nodes of the table that have not left and by ReplicationMax.
func (t *Table) ReplicationWant(rf int) int {
	return min(max(rf, 1), len(t.members()), ReplicationMax)
}

// UnderReplicated reports whether q holds fewer replicas than the table
// wants for it (ReplicationWant) or has a replica move under way.
func (t *Table) UnderReplicated(q *Queue, rf int) bool {
	if len(replicaSet(q)) < t.ReplicationWant(rf) {
		return true
	}
	return movingAny(q)
}

// UnderReplicatedQueues counts the queues UnderReplicated reports, with
// the replication factor rf.
func (t *Table) UnderReplicatedQueues(rf int) int {
	n := 0
	for i := range t.Queues {
		if t.UnderReplicated(&t.Queues[i], rf) {
			n++
		}
	}
	return n
}

// replicaSet is the nodes holding q's replicas.
func replicaSet(q *Queue) []uint64 {
	var set []uint64
	for _, p := range q.Partitions {
		for _, r := range p.Replicas {
			if !slices.Contains(set, r) {
				set = append(set, r)
			}
		}
	}
	return set
}

// replicaCounts counts the partition replicas each node holds.
func (t *Table) replicaCounts() map[uint64]int {
	n := map[uint64]int{}
	for i := range t.Queues {
		for _, p := range t.Queues[i].Partitions {
			for _, r := range p.Replicas {
				n[r]++
			}
		}
	}
	return n
}

// holdsReplicas reports whether some queue's placement names node id.
func (t *Table) holdsReplicas(id uint64) bool {
	for i := range t.Queues {
		if slices.Contains(replicaSet(&t.Queues[i]), id) {
			return true
		}
	}
	return false
}

// replaceAfterTicks is how long a node holding replicas stays dead before
// the recovery plan moves them (3 s at the raft host's 50 ms tick): a node
// restarted at once keeps its replicas.
const replaceAfterTicks = 60

// planRecovery proposes, as leader, one replica change per queue at a
// time (the one holding the fewest replicas, the first in join order among
// equals, takes what is placed):
//   - a move for a queue whose replica set holds a node that left, or that
//     membership has held dead for replaceAfterTicks, when a live member
//     outside the set can take its place and, for a dead node, the set's
//     live replicas are a majority (they must elect an owner to catch the
//     new replica up: a queue whose only replica died waits for it);
//   - a new replica for a queue with fewer than the replication factor
//     (ReplicationWant), when every replica it has is live and no move is
//     under way: a queue created while the cluster formed grows to it.
func (c *Controller) planRecovery(view []Member) error {
	// The plan depends on the table, the view and, while a node is dead
	// or newly live, the clock. With none of them changed since a plan
	// that found nothing to do, it would find nothing again: skip it
	// (a leader runs this every turn, and it reads every placement).
	sig := viewSignature(view)
	if c.planIdle && c.planApplied == c.applied && c.planView == sig && len(c.proposed) == 0 {
		return nil
	}
	before := len(c.proposed)
	pending := false
	defer func() {
		c.planApplied, c.planView = c.applied, sig
		c.planIdle = !pending && len(c.proposed) == before
	}()
	live := map[uint64]bool{}
	for _, m := range view {
		switch {
		case m.Dead:
			if _, ok := c.deadSince[m.RaftID]; !ok {
				c.deadSince[m.RaftID] = c.tickN
			}
		case !m.Gone:
			live[m.RaftID] = true
			delete(c.deadSince, m.RaftID)
			if _, ok := c.liveSince[m.RaftID]; !ok {
				c.liveSince[m.RaftID] = c.tickN
			}
		}
		if !live[m.RaftID] {
			delete(c.liveSince, m.RaftID)
		}
	}
	// A dead node's grace, or a live one's hold-off before rebalancing,
	// is counted in ticks: the plan runs again at every turn until they
	// have passed.
	if len(c.deadSince) > 0 {
		pending = true
	}
	for _, since := range c.liveSince {
		if c.tickN < since+rebalanceAfterTicks {
			pending = true
		}
	}
	// Candidates to take a replica: the least loaded first (replicas
	// held), among equals the less loaded by their reports when all of
	// them have one, else in join order.
	members := c.table.members()
	load := c.table.replicaCounts()
	loads := c.planLoads()
	orderBy(members, load, loads)
	want := c.table.ReplicationWant(c.rf)
	settled := true // no queue short of replicas, dead ones or a move
	for qi := range c.table.Queues {
		q := &c.table.Queues[qi]
		if busy, err := c.planMoves(q); err != nil {
			return err
		} else if busy {
			settled = false // an operator move carries it on
			continue
		}
		set := replicaSet(q)
		liveInSet := 0
		for _, r := range set {
			if live[r] {
				liveInSet++
			}
		}
		moved := false
		for _, r := range set {
			n, known := c.table.Node(r)
			since, dead := c.deadSince[r]
			if !(known && n.Left || dead && c.tickN >= since+replaceAfterTicks) {
				continue
			}
			moved = true
			if !(known && n.Left) && liveInSet <= len(set)/2 {
				break
			}
			to := uint64(0)
			for _, id := range members {
				if live[id] && !slices.Contains(set, id) {
					to = id
					break
				}
			}
			if to == 0 {
				break
			}
			ok, err := c.proposeOnce(fmt.Sprintf("replace/%s/%s/%d/%d", q.Topic, q.Group, r, to),
				command{Op: opReplaceReplica, Queue: &Queue{Topic: q.Topic, Group: q.Group}, From: r, To: to})
			if err != nil {
				return err
			}
			if ok {
				c.log.Info("controller: recovery plan: moving a queue's replicas", "topic", q.Topic, "group", q.Group,
					"from", r, "to", to, "from_left", known && n.Left)
			}
			break // one move per queue at a time
		}
		if moved || liveInSet < len(set) || movingAny(q) || len(set) < want {
			settled = false
		}
		if moved || len(set) >= want || liveInSet < len(set) || movingAny(q) {
			continue
		}
		if err := c.planGrowth(q, set, members, live, want); err != nil {
			return err
		}
	}
	if settled {
		return c.planRebalance(members, live, load, loads)
	}
	return nil
}

// viewSignature hashes what the plan reads from a membership view: each
// member's raft id and whether it is dead or gone, in any order.
func viewSignature(view []Member) uint64 {
	var sum uint64
	var b [10]byte
	for _, m := range view {
		binary.LittleEndian.PutUint64(b[:8], m.RaftID)
		b[8], b[9] = 0, 0
		if m.Dead {
			b[8] = 1
		}
		if m.Gone {
			b[9] = 1
		}
		h := fnv.New64a()
		h.Write(b[:])
		sum += h.Sum64()
	}
	return sum
}

// rebalanceAfterTicks is how long every member must have been live before
// the plan moves a replica to even out the load (10 s at the raft host's
// 50 ms tick): a node that joins or comes back takes replicas only once it
// stayed.
const rebalanceAfterTicks = 200

// planRebalance proposes, as leader, at most one replica move in the
// cluster to even out the replicas the nodes hold, once nothing else is
// under way (every queue has its replicas, all live, and no move runs)
// and every member has been live for rebalanceAfterTicks: the most loaded
// member (the first in join order among equals) hands a queue's replicas
// to the least loaded member outside that queue's set, when that narrows
// the gap between them (the queue's partitions count fewer than it). A
// node that joins a cluster whose queues have all their replicas so takes
// its share, one queue at a time, and with the preferred owner's place
// the leads of the partitions the old node was preferred for.
func (c *Controller) planRebalance(members []uint64, live map[uint64]bool, load map[uint64]int, loads NodeLoads) error {
	for _, id := range members {
		since, ok := c.liveSince[id]
		if !live[id] || !ok || c.tickN < since+rebalanceAfterTicks {
			return nil
		}
	}
	if len(members) < 2 {
		return nil
	}
	// members is sorted least loaded first; the most loaded is the last
	// of the highest load, the first in join order among equals.
	top := load[members[len(members)-1]]
	from := rebalanceSource(c.table.members(), members, load, loads, top)
	for qi := range c.table.Queues {
		q := &c.table.Queues[qi]
		set := replicaSet(q)
		if q.Pinned || !slices.Contains(set, from) {
			continue // an operator placed a pinned queue's replicas
		}
		n := len(q.Partitions)
		for _, to := range members {
			if slices.Contains(set, to) || load[from]-load[to] <= n {
				continue
			}
			ok, err := c.proposeOnce(fmt.Sprintf("rebalance/%s/%s/%d/%d", q.Topic, q.Group, from, to),
				command{Op: opReplaceReplica, Queue: &Queue{Topic: q.Topic, Group: q.Group}, From: from, To: to})
			if ok {
				c.log.Info("controller: rebalancing: moving a queue's replicas to a less loaded node", "topic", q.Topic, "group", q.Group,
					"from", from, "to", to, "from_replicas", load[from], "to_replicas", load[to])
			}
			return err
		}
	}
	return nil
}

// rebalanceSource is the member that hands replicas over: of those
// holding the most (top), the most loaded by their reports when every one
// of them has a report (the last of them in members, which orderBy
// sorted), else the first in join order (joined).
func rebalanceSource(joined, members []uint64, load map[uint64]int, loads NodeLoads, top int) uint64 {
	all := len(loads) > 0
	for _, id := range members {
		if _, ok := loads[id]; load[id] == top && !ok {
			all = false
		}
	}
	if all {
		return members[len(members)-1]
	}
	for _, id := range joined {
		if load[id] == top {
			return id
		}
	}
	return 0
}

// planGrowth proposes one new replica for q, whose replica set (set) is
// smaller than want: the least loaded live member outside it.
func (c *Controller) planGrowth(q *Queue, set, members []uint64, live map[uint64]bool, want int) error {
	to := uint64(0)
	for _, id := range members {
		if live[id] && !slices.Contains(set, id) {
			to = id
			break
		}
	}
	if to == 0 {
		return nil
	}
	ok, err := c.proposeOnce(fmt.Sprintf("add/%s/%s/%d", q.Topic, q.Group, to),
		command{Op: opAddReplica, Queue: &Queue{Topic: q.Topic, Group: q.Group}, To: to})
	if ok {
		c.log.Warn("controller: a queue has fewer replicas than the replication factor: adding one", "topic", q.Topic, "group", q.Group,
			"replicas", len(set), "want", want, "to", to)
	}
	return err
}

// proposeOnce proposes cmd, as leader, unless a proposal under key is
// still waiting to show in the table (c.proposed), and reports whether it
// did. A proposal raft refuses (the lead was lost meanwhile) is no error:
// the next leader plans again.
func (c *Controller) proposeOnce(key string, cmd command) (bool, error) {
	if _, ok := c.proposed[key]; ok {
		return false, nil
	}
	data, err := encode(cmd)
	if err != nil {
		return false, err
	}
	if err := c.rn.Propose(data); err != nil {
		return false, nil
	}
	c.proposed[key] = c.tickN
	return true, nil
}

// movingAny reports whether a replica move of q is under way.
func movingAny(q *Queue) bool {
	for _, p := range q.Partitions {
		if p.Moving {
			return true
		}
	}
	return false
}

// Leave records in the table that this node leaves the cluster, and
// returns once this node has applied that (or ctx ends). The leader would
// record it anyway once membership reports the leave, but not when this
// node is the leader: a leaving node that stays until its replicas are
// handed over calls it, so that the recovery plan starts at once, from
// whichever node leads.
func (c *Controller) Leave(ctx context.Context) error {
	self := c.cfg.Self.RaftID
	data, err := encode(command{Op: opLeave, RaftID: self, Boot: c.cfg.Self.Boot})
	if err != nil {
		return err
	}
	return c.proposeUntil(ctx, data, func(st Status) bool {
		n, ok := st.Table.Node(self)
		return !ok || n.Left
	})
}
