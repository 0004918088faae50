package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
}

// Placement is one partition's raft group and its replicas.
type Placement struct {
	// RaftGroup is the partition's multi-raft group id, unique in the
	// cluster and never reused.
	RaftGroup uint64 `json:"raft_group"`
	// Replicas are the raft ids of the nodes holding a replica, the
	// preferred owner first. They are the group's voters when it starts.
	Replicas []uint64 `json:"replicas"`
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
		parts[p] = Placement{RaftGroup: next, Replicas: slices.Clone(pl.Replicas)}
		next++
	}
	t.NextRaftGroup = next
	nq := Queue{Topic: q.Topic, Group: q.Group, Settings: slices.Clone(q.Settings), Partitions: parts, CreatedAt: index}
	t.Queues = slices.Insert(t.Queues, i, nq)
	return nil
}

// Place chooses the replicas of a queue's n partitions, spread first over
// the live members (in join order): the queue's replica set is rf members
// in a row, starting at the catalogue's size so that successive queues
// start on different nodes, and partition p's preferred owner is the p-th
// of that set, so a queue's partitions are led by different nodes. Every
// partition of a queue has the same replica set: a node holds all of a
// queue or none of it. rf is capped by the live members; live lists the
// members that may hold a replica.
func Place(t *Table, live []uint64, n, rf int) []Placement {
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
	set := make([]uint64, rf)
	for r := range set {
		set[r] = members[(start+r)%len(members)]
	}
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
	var retry <-chan time.Time
	proposedTo := uint64(0) // the leader the last proposal went to
	for {
		changed := c.Changed()
		st := c.Status()
		if cur, ok := st.Table.Queue(q.Topic, q.Group); ok {
			return cur, nil
		}
		if st.Err != "" {
			return Queue{}, fmt.Errorf("controller failed: %s", st.Err)
		}
		// Proposed once per leader, and again each proposeRetryInterval:
		// a proposal may be lost with a change of leader, or applied as
		// nothing when a replica's node left meanwhile.
		if st.Leader != 0 && (proposedTo != st.Leader || retry == nil) {
			c.propose(data)
			proposedTo, retry = st.Leader, time.After(proposeRetryInterval)
		}
		select {
		case <-ctx.Done():
			if st.Leader == 0 {
				return Queue{}, ErrNoLeader
			}
			return Queue{}, ctx.Err()
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
