package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestPlaceSpreadsFirst: every partition's replicas are distinct live
// members, all partitions of a queue share one replica set, their preferred
// owners rotate over it, successive queues start on different nodes, and RF
// is capped by the members that may hold a replica.
func TestPlaceSpreadsFirst(t *testing.T) {
	tb := &Table{}
	for id := uint64(1); id <= 4; id++ {
		if err := tb.apply(id, command{Op: opJoin, Node: &Node{RaftID: id * 10, ID: nodeOf(id).ID}}); err != nil {
			t.Fatal(err)
		}
	}
	live := []uint64{10, 20, 30, 40}
	pl := Place(tb, live, 3, 3)
	owners := map[uint64]int{}
	var set []uint64
	for p, x := range pl {
		s := slices.Clone(x.Replicas)
		slices.Sort(s)
		if len(x.Replicas) != 3 || len(slices.Compact(s)) != 3 {
			t.Fatalf("partition %d: replicas %v, want 3 distinct", p, x.Replicas)
		}
		if set == nil {
			set = s
		} else if !slices.Equal(set, s) {
			t.Fatalf("partition %d: replica set %v, partition 0's %v", p, s, set)
		}
		owners[x.Replicas[0]]++
	}
	if len(owners) != 3 {
		t.Fatalf("preferred owners %v: want each node of the set once", owners)
	}
	tb.Queues = append(tb.Queues, Queue{Topic: "a"})
	if next := Place(tb, live, 1, 3); next[0].Replicas[0] == pl[0].Replicas[0] {
		t.Fatalf("the next queue starts on %d too", next[0].Replicas[0])
	}
	// Load: with queues on 10, 20 and 30, a new queue goes to the node
	// holding none (40) and the two holding the fewest.
	tb.Queues = []Queue{
		{Topic: "x", Partitions: []Placement{{Replicas: []uint64{10, 20, 30}}, {Replicas: []uint64{20, 30, 10}}}},
		{Topic: "y", Partitions: []Placement{{Replicas: []uint64{20, 30, 40}}}},
	}
	got := Place(tb, live, 1, 3)[0].Replicas
	if s := slices.Sorted(slices.Values(got)); !slices.Equal(s, []uint64{10, 30, 40}) && !slices.Equal(s, []uint64{10, 20, 40}) {
		t.Fatalf("replicas %v with loads 10:2 20:3 30:3 40:1: want 40, 10 and one of 20, 30", got)
	}
	if !slices.Contains(got[:1], 40) && !slices.Contains(got[:1], 10) {
		t.Fatalf("preferred owner %d: want one of the least loaded", got[0])
	}
	tb.Queues = nil
	// Node 20 is not live: nothing is placed on it; RF is capped at 2.
	for _, x := range Place(tb, []uint64{10, 30}, 3, 3) {
		if len(x.Replicas) != 2 || slices.Contains(x.Replicas, 20) {
			t.Fatalf("replicas %v with two live nodes", x.Replicas)
		}
	}
	if got := Place(tb, nil, 2, 3); got != nil {
		t.Fatalf("placement without live nodes: %v", got)
	}
	for _, bad := range [][]Placement{nil, {{Replicas: nil}}, {{Replicas: []uint64{1, 1}}}, {{Replicas: []uint64{0}}}} {
		if err := checkPlacement(bad); err == nil {
			t.Fatalf("placement %v accepted", bad)
		}
	}
}

// TestCatalogueCommands: a queue is created once (the second proposal of the
// same queue does nothing), raft group ids are never reused, and a
// placement that names an unknown node, a node twice or no node is applied
// as nothing.
func TestCatalogueCommands(t *testing.T) {
	tb := &Table{}
	for id := uint64(1); id <= 3; id++ {
		if err := tb.apply(id, command{Op: opJoin, Node: &Node{RaftID: id, ID: nodeOf(id).ID}}); err != nil {
			t.Fatal(err)
		}
	}
	create := func(index uint64, topic string, reps ...[]uint64) {
		t.Helper()
		q := Queue{Topic: topic, Settings: json.RawMessage(`{"lease_ms":5}`)}
		for _, r := range reps {
			q.Partitions = append(q.Partitions, Placement{Replicas: r})
		}
		data, err := encode(command{Op: opCreateQueue, Queue: &q})
		if err != nil {
			t.Fatal(err)
		}
		cmd, err := decode(data)
		if err != nil {
			t.Fatal(err)
		}
		if err := tb.apply(index, cmd); err != nil {
			t.Fatal(err)
		}
	}
	create(10, "a", []uint64{1, 2, 3}, []uint64{2, 3, 1})
	create(11, "a", []uint64{3}) // a second proposal of "a"
	create(12, "bad", []uint64{1, 9})
	create(13, "bad", []uint64{1, 1})
	create(14, "bad", []uint64{})
	create(15, "b", []uint64{3, 1})
	if len(tb.Queues) != 2 {
		t.Fatalf("queues %+v", tb.Queues)
	}
	a, ok := tb.Queue("a", "")
	if !ok || a.CreatedAt != 10 || len(a.Partitions) != 2 || a.Partitions[0].RaftGroup != FirstPartitionGroup ||
		a.Partitions[1].RaftGroup != FirstPartitionGroup+1 || string(a.Settings) != `{"lease_ms":5}` {
		t.Fatalf("queue a %+v", a)
	}
	b, _ := tb.Queue("b", "")
	if b.Partitions[0].RaftGroup != FirstPartitionGroup+2 || !slices.Equal(b.Partitions[0].Replicas, []uint64{3, 1}) {
		t.Fatalf("queue b %+v", b)
	}
	if _, ok := tb.Queue("bad", ""); ok {
		t.Fatal("a bad placement was applied")
	}
}

// TestCreateQueueFromAnyNode: queues proposed on a follower and on a learner
// reach every node's catalogue; two nodes proposing the same queue at once
// get the same queue; the catalogue survives a restart from the node's own
// log and snapshots.
func TestCreateQueueFromAnyNode(t *testing.T) {
	c := newCluster(t)
	c.snapEvery = 8
	c.start(1, true)
	for id := uint64(2); id <= 5; id++ {
		c.start(id, false)
	}
	c.until("five nodes, three voting", c.agreed([]uint64{1, 2, 3}, []uint64{4, 5}, []uint64{1, 2, 3, 4, 5}, nil))

	create := func(on uint64, topic string, owner uint64) <-chan Queue {
		out := make(chan Queue, 1)
		c.mu.Lock()
		n := c.nodes[on]
		c.mu.Unlock()
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			q, err := n.CreateQueue(ctx, Queue{Topic: topic, Partitions: []Placement{{Replicas: []uint64{owner, 1}}}})
			if err != nil {
				t.Errorf("create %s on %d: %v", topic, on, err)
			}
			out <- q
		}()
		return out
	}
	wait := func(chs ...<-chan Queue) []Queue {
		t.Helper()
		var got []Queue
		for _, ch := range chs {
			var q Queue
			c.until("a create returns", func() bool {
				select {
				case q = <-ch:
					return true
				default:
					return false
				}
			})
			got = append(got, q)
		}
		return got
	}
	wait(create(2, "from-follower", 2))
	wait(create(5, "from-learner", 5))
	both := wait(create(3, "raced", 3), create(4, "raced", 4))
	if both[0].CreatedAt != both[1].CreatedAt || both[0].Partitions[0].Replicas[0] != both[1].Partitions[0].Replicas[0] {
		t.Fatalf("two creates of one queue returned different queues: %+v, %+v", both[0], both[1])
	}
	for i := range 12 { // enough entries for snapshots
		wait(create(uint64(1+i%5), "q"+string(rune('a'+i)), uint64(2+i%4)))
	}
	sameCatalogue := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		var first []Queue
		for _, n := range c.nodes {
			qs := n.Status().Table.Queues
			if len(qs) != 15 {
				return false
			}
			if first == nil {
				first = qs
				continue
			}
			for i := range qs {
				if qs[i].Topic != first[i].Topic || qs[i].CreatedAt != first[i].CreatedAt || qs[i].Partitions[0].RaftGroup != first[i].Partitions[0].RaftGroup {
					return false
				}
			}
		}
		return true
	}
	c.until("every node holds the 15 queues", sameCatalogue)
	c.stop(4)
	n4 := c.start(4, false)
	if got := len(n4.Status().Table.Queues); got != 15 {
		t.Fatalf("restarted node holds %d queues before hearing from anyone, want 15", got)
	}
	c.until("after the restart every node holds the 15 queues", sameCatalogue)
}

// TestRecoveryPlanMovesReplicas: a queue on three of four nodes loses one
// of them (held dead past the grace): its replicas move to the fourth,
// which was held live, in every partition, and the bootstrap voters stay
// as they were. A node that leaves is replaced the same way.
func TestRecoveryPlanMovesReplicas(t *testing.T) {
	c, n1 := fourNodesWithQueue(t, Placement{Replicas: []uint64{1, 2, 3}}, Placement{Replicas: []uint64{2, 3, 1}})
	holds := func(want ...uint64) func() bool {
		return func() bool {
			q, ok := n1.Status().Table.Queue("q", "")
			if !ok {
				return false
			}
			for _, p := range q.Partitions {
				s := slices.Clone(p.Replicas)
				slices.Sort(s)
				if !slices.Equal(s, want) || !slices.Equal(p.Bootstrap, []uint64{1, 2, 3}) && !slices.Equal(p.Bootstrap, []uint64{2, 3, 1}) {
					return false
				}
			}
			return true
		}
	}
	c.mu.Lock()
	c.dead[3] = true
	c.mu.Unlock()
	c.until("node 3's replicas move to node 4", holds(1, 2, 4))
	q, _ := n1.Status().Table.Queue("q", "")
	if !slices.Equal(q.Partitions[0].Replicas, []uint64{1, 2, 4}) || !slices.Equal(q.Partitions[1].Replicas, []uint64{2, 4, 1}) {
		t.Fatalf("replicas %+v: want node 4 in node 3's place", q.Partitions)
	}
}

// TestRecoveryPlanReplacesANodeThatLeft: a queue on three of four nodes;
// one of its nodes leaves on purpose and its replicas move to the fourth at
// once, without the dead node's grace.
func TestRecoveryPlanReplacesANodeThatLeft(t *testing.T) {
	c, n1 := fourNodesWithQueue(t, Placement{Replicas: []uint64{1, 2, 3}})
	c.stop(2)
	c.until("node 2 left and its replicas moved to node 4", func() bool {
		q, ok := n1.Status().Table.Queue("q", "")
		return ok && slices.Equal(q.Partitions[0].Replicas, []uint64{1, 4, 3})
	}, 2)
}

// fourNodesWithQueue starts four controllers (three voting) and creates
// queue "q" with the given placement through node 1, which it returns.
func fourNodesWithQueue(t *testing.T, parts ...Placement) (*cluster, *Controller) {
	t.Helper()
	c := newCluster(t)
	c.start(1, true)
	for id := uint64(2); id <= 4; id++ {
		c.start(id, false)
	}
	c.until("four nodes, three voting", c.agreed([]uint64{1, 2, 3}, []uint64{4}, []uint64{1, 2, 3, 4}, nil))
	c.mu.Lock()
	n1 := c.nodes[1]
	c.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := n1.CreateQueue(ctx, Queue{Topic: "q", Partitions: parts})
		done <- err
	}()
	c.until("the queue is created", func() bool {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return true
		default:
			return false
		}
	})
	return c, n1
}

// TestLeaveByTheLeader: the controller's leader itself leaves (Leave, as a
// node does before handing its replicas over: membership would not report
// its own leave to it). The table records it left, its replicas move to
// the spare node, and only then is it taken out of the controller group.
// Membership shows every node the leaver alive throughout (a view from
// before its leave; its own view of itself): that run is not taken for a
// node coming back. Once it runs again (a new boot) it is admitted again.
func TestLeaveByTheLeader(t *testing.T) {
	c, n1 := fourNodesWithQueue(t, Placement{Replicas: []uint64{1, 2, 3}})
	// Past proposeRetryTicks, so the joins proposed so far no longer
	// hold back another join of the leaver.
	for range 2 * proposeRetryTicks {
		c.round(time.Millisecond)
	}
	// Ticks faster than the controllers' goroutines may have cost the
	// leader its lead (check quorum): wait for one.
	c.until("a leader", c.agreed([]uint64{1, 2, 3}, []uint64{4}, []uint64{1, 2, 3, 4}, nil))
	lead := n1.Status().Leader
	if lead == 0 || lead == 4 {
		t.Fatalf("leader %d: want one of the voters 1-3", lead)
	}
	other := uint64(1)
	for other == lead {
		other++
	}
	c.mu.Lock()
	leaving, watch := c.nodes[lead], c.nodes[other]
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	left := make(chan error, 1)
	go func() { left <- leaving.Leave(ctx) }()
	var err error
	c.until("Leave returns", func() bool {
		select {
		case err = <-left:
			return true
		default:
			return false
		}
	})
	if err != nil {
		t.Fatalf("Leave: %v", err)
	}
	if n, ok := leaving.Status().Table.Node(lead); !ok || !n.Left {
		t.Fatalf("Leave returned before the table recorded it: %+v", n)
	}
	c.until("the leaver's replicas moved to node 4 and the leaver left the group", func() bool {
		st := watch.Status()
		q, ok := st.Table.Queue("q", "")
		if !ok || slices.Contains(q.Partitions[0].Replicas, lead) || !slices.Contains(q.Partitions[0].Replicas, 4) {
			return false
		}
		return len(st.Voters) == 3 && !slices.Contains(st.Voters, lead) && !slices.Contains(st.Learners, lead)
	})
	if n, ok := watch.Status().Table.Node(lead); !ok || !n.Left {
		t.Fatalf("the leaver's table entry after the handover: %+v, want left", n)
	}
	c.stop(lead)
	c.start(lead, false)
	c.until(fmt.Sprintf("node %d, the leaver, run again, is admitted again", lead), func() bool {
		st := watch.Status()
		n, ok := st.Table.Node(lead)
		return ok && !n.Left && slices.Contains(st.Learners, lead)
	})
}

// TestRecoveryPlanGrowsAQueueToTheReplicationFactor: a queue placed on one
// node (created while the cluster formed) gets a second and then a third
// replica, one at a time: each is added after the others, in every
// partition, and the next waits until the owners report the last one in
// place (placement_done). The preferred owners and bootstrap voters stay.
// The table counts the queue under-replicated until it holds three.
func TestRecoveryPlanGrowsAQueueToTheReplicationFactor(t *testing.T) {
	c, n1 := fourNodesWithQueue(t, Placement{Replicas: []uint64{1}}, Placement{Replicas: []uint64{1}})
	if st := n1.Status(); st.Table.UnderReplicatedQueues(n1.ReplicationFactor()) != 1 {
		t.Fatalf("under-replicated queues %d, want 1", st.Table.UnderReplicatedQueues(n1.ReplicationFactor()))
	}
	most := 0
	c.until("the queue holds three replicas in every partition, placed", func() bool {
		q, ok := n1.Status().Table.Queue("q", "")
		if !ok {
			return false
		}
		done := true
		for i, p := range q.Partitions {
			most = max(most, len(p.Replicas))
			if p.Replicas[0] != 1 || !slices.Equal(p.Bootstrap, []uint64{1}) {
				t.Fatalf("partition %d: %+v: the preferred owner or bootstrap changed", i, p)
			}
			if p.Moving {
				// As the owner does once the group votes with them.
				n1.PlacementDone("q", "", i, p.RaftGroup, p.Replicas)
				done = false
			}
			done = done && len(p.Replicas) == 3
		}
		return done
	})
	if most != 3 {
		t.Fatalf("a partition held %d replicas, want at most 3", most)
	}
	q, _ := n1.Status().Table.Queue("q", "")
	if !slices.Equal(q.Partitions[0].Replicas, q.Partitions[1].Replicas) {
		t.Fatalf("partitions placed apart: %+v", q.Partitions)
	}
	if n := n1.Status().Table.UnderReplicatedQueues(n1.ReplicationFactor()); n != 0 {
		t.Fatalf("under-replicated queues %d after growing, want 0", n)
	}
	// Nothing more happens: the queue has what it should.
	before := n1.Status().Applied
	for range 200 {
		c.round(time.Millisecond)
	}
	q2, _ := n1.Status().Table.Queue("q", "")
	if !slices.Equal(q2.Partitions[0].Replicas, q.Partitions[0].Replicas) {
		t.Fatalf("replicas changed again after %d: %v -> %v", before, q.Partitions[0].Replicas, q2.Partitions[0].Replicas)
	}
}

// TestRecoveryPlanKeepsALoneDeadReplica: a queue whose only replica's node
// is dead past the grace is not moved: a new replica could not be caught
// up by anyone (the group has no live voter to lead it), and moving it
// would serve an empty queue. A queue of three replicas with one dead is
// moved as before.
func TestRecoveryPlanKeepsALoneDeadReplica(t *testing.T) {
	c, n1 := fourNodesWithQueue(t, Placement{Replicas: []uint64{3}})
	c.mu.Lock()
	c.dead[3] = true
	c.mu.Unlock()
	for range 3 * replaceAfterTicks {
		c.round(time.Millisecond)
	}
	c.until("a while after the grace", func() bool { return n1.Status().Applied > 0 })
	// (A replica the plan added before node 3 died, growing the queue,
	// may be there too: it is not a majority either.)
	q, _ := n1.Status().Table.Queue("q", "")
	if rs := q.Partitions[0].Replicas; rs[0] != 3 || len(rs) > 2 {
		t.Fatalf("replicas %v: the lone dead replica was moved", rs)
	}
}

// TestAddReplicaCommand: add_replica appends a member to every partition's
// replicas and marks them moving; it is applied as nothing for a node that
// is not a member, one the queue holds, or while a move is under way.
func TestAddReplicaCommand(t *testing.T) {
	tb := &Table{}
	for id := uint64(1); id <= 4; id++ {
		if err := tb.apply(id, command{Op: opJoin, Node: &Node{RaftID: id, ID: nodeOf(id).ID}}); err != nil {
			t.Fatal(err)
		}
	}
	q := Queue{Topic: "q", Partitions: []Placement{{Replicas: []uint64{1}}, {Replicas: []uint64{1}}}}
	if err := tb.apply(10, command{Op: opCreateQueue, Queue: &q}); err != nil {
		t.Fatal(err)
	}
	add := func(to uint64) Queue {
		t.Helper()
		data, err := encode(command{Op: opAddReplica, Queue: &Queue{Topic: "q"}, To: to})
		if err != nil {
			t.Fatal(err)
		}
		cmd, err := decode(data)
		if err != nil {
			t.Fatal(err)
		}
		if err := tb.apply(11, cmd); err != nil {
			t.Fatal(err)
		}
		got, _ := tb.Queue("q", "")
		return got
	}
	if got := add(9); !slices.Equal(got.Partitions[0].Replicas, []uint64{1}) {
		t.Fatalf("a node not in the table was added: %v", got.Partitions[0].Replicas)
	}
	if got := add(1); !slices.Equal(got.Partitions[0].Replicas, []uint64{1}) {
		t.Fatalf("a replica the queue holds was added again: %v", got.Partitions[0].Replicas)
	}
	got := add(3)
	for _, p := range got.Partitions {
		if !slices.Equal(p.Replicas, []uint64{1, 3}) || !p.Moving {
			t.Fatalf("after add 3: %+v, want replicas [1 3], moving", p)
		}
	}
	if got := add(4); !slices.Equal(got.Partitions[0].Replicas, []uint64{1, 3}) {
		t.Fatalf("added while a move was under way: %v", got.Partitions[0].Replicas)
	}
	if err := tb.apply(12, command{Op: opAddReplica}); !errors.Is(err, ErrCommand) {
		t.Fatalf("add_replica without a queue: %v, want ErrCommand", err)
	}
}

// TestRecoveryPlanRebalancesOntoANewNode: two queues of one partition on
// three of four nodes (loads 2, 2, 2, 0). Once every node has been live
// for the hold-off, one queue's replica moves from the most loaded node
// (the first in join order) to the fourth; then the loads (1, 2, 2, 1)
// leave nothing to narrow, and nothing more moves.
func TestRecoveryPlanRebalancesOntoANewNode(t *testing.T) {
	c, n1 := fourNodesWithQueue(t, Placement{Replicas: []uint64{1, 2, 3}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	created := make(chan error, 1)
	go func() {
		_, err := n1.CreateQueue(ctx, Queue{Topic: "r", Partitions: []Placement{{Replicas: []uint64{2, 3, 1}}}})
		created <- err
	}()
	c.until("queue r is created", func() bool {
		select {
		case err := <-created:
			if err != nil {
				t.Fatal(err)
			}
			return true
		default:
			return false
		}
	})
	// The owners report each move in place, as they do once the group
	// votes with its replicas.
	placed := func() {
		for _, q := range n1.Status().Table.Queues {
			for i, p := range q.Partitions {
				if p.Moving {
					n1.PlacementDone(q.Topic, q.Group, i, p.RaftGroup, p.Replicas)
				}
			}
		}
	}
	c.until("node 4 holds a replica", func() bool {
		placed()
		return n1.Status().Table.replicaCounts()[4] > 0
	})
	for range 3 * rebalanceAfterTicks {
		placed()
		c.round(time.Millisecond)
	}
	placed()
	load := n1.Status().Table.replicaCounts()
	if load[1] != 1 || load[2] != 2 || load[3] != 2 || load[4] != 1 {
		t.Fatalf("replicas held %v, want node 1's first queue moved to node 4 and nothing more", load)
	}
	q, _ := n1.Status().Table.Queue("q", "")
	if !slices.Equal(q.Partitions[0].Replicas, []uint64{4, 2, 3}) {
		t.Fatalf("queue q's replicas %v, want node 4 in node 1's place (its preferred owner too)", q.Partitions[0].Replicas)
	}
}
