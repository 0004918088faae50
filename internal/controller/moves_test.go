package controller

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// moveTable is a table of five nodes (node 5 left) holding queue "q" of
// one partition on nodes 1, 2, 3 and queue "p" of two partitions on 1, 2.
func moveTable(t *testing.T) *Table {
	t.Helper()
	tb := &Table{}
	for id := uint64(1); id <= 5; id++ {
		if err := tb.apply(id, command{Op: opJoin, Node: &Node{RaftID: id, ID: nodeOf(id).ID}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tb.apply(6, command{Op: opLeave, RaftID: 5}); err != nil {
		t.Fatal(err)
	}
	for i, q := range []Queue{
		{Topic: "q", Partitions: []Placement{{Replicas: []uint64{1, 2, 3}}}},
		{Topic: "p", Partitions: []Placement{{Replicas: []uint64{1, 2}}, {Replicas: []uint64{2, 1}}}},
	} {
		if err := tb.apply(uint64(10+i), command{Op: opCreateQueue, Queue: &q}); err != nil {
			t.Fatal(err)
		}
	}
	return tb
}

// applyCmd encodes, decodes and applies one command, as a replica does.
func applyCmd(t *testing.T, tb *Table, index uint64, c command) {
	t.Helper()
	data, err := encode(c)
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

// placeAll reports every moving partition of queue topic in place, as its
// owner does once the group votes with its replicas.
func placeAll(t *testing.T, tb *Table, index uint64, topic string) {
	t.Helper()
	q, _ := tb.Queue(topic, "")
	for i, p := range q.Partitions {
		if p.Moving {
			applyCmd(t, tb, index, command{Op: opPlacementDone, Queue: &Queue{Topic: topic}, Partition: i, RaftGroup: p.RaftGroup, Replicas: p.Replicas})
		}
	}
}

// TestMoveRefusals: every refusal of a move has its typed error, and the
// table would apply none of them.
func TestMoveRefusals(t *testing.T) {
	tb := moveTable(t)
	live := func(id uint64) bool { return id != 4 }
	for _, tc := range []struct {
		name string
		r    MoveRequest
		live func(uint64) bool
		want error
	}{
		{"unknown queue", MoveRequest{Topic: "nope", Partition: -1, To: 4}, nil, ErrNoQueue},
		{"partition out of range", MoveRequest{Topic: "q", Partition: 1, To: 4}, nil, ErrMoveNoPartition},
		{"negative partition", MoveRequest{Topic: "q", Partition: -2, To: 4}, nil, ErrMoveNoPartition},
		{"a partition of a queue of two", MoveRequest{Topic: "p", Partition: 1, To: 4}, nil, ErrMovePerQueue},
		{"unknown target", MoveRequest{Topic: "q", Partition: -1, To: 9}, nil, ErrMoveNoNode},
		{"target left", MoveRequest{Topic: "q", Partition: -1, To: 5}, nil, ErrMoveNoNode},
		{"unknown source", MoveRequest{Topic: "q", Partition: -1, From: 9, To: 4}, nil, ErrMoveNoNode},
		{"source not a replica", MoveRequest{Topic: "p", Partition: -1, From: 3, To: 4}, nil, ErrMoveNotReplica},
		{"target a replica", MoveRequest{Topic: "q", Partition: 0, From: 1, To: 2}, nil, ErrMoveAlreadyReplica},
		{"source is target", MoveRequest{Topic: "q", Partition: 0, From: 4, To: 4}, nil, ErrMoveAlreadyReplica},
		{"target not live", MoveRequest{Topic: "q", Partition: -1, To: 4}, live, ErrMoveNodeNotLive},
	} {
		_, err := tb.checkMove(tc.r, tc.live)
		var me *MoveError
		if !errors.Is(err, tc.want) || (tc.want != ErrNoQueue && !errors.As(err, &me)) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// With no source named, the controller picks the most loaded node's
	// replica (1 and 2 hold three replicas, 3 one: the last of 1 and 2
	// in the placement).
	if from, err := tb.checkMove(MoveRequest{Topic: "q", Partition: -1, To: 4}, nil); err != nil || from != 2 {
		t.Fatalf("picked source %d (%v), want 2", from, err)
	}
	// A queue whose replicas move already: busy; one with a move: running.
	applyCmd(t, tb, 20, command{Op: opAddReplica, Queue: &Queue{Topic: "p"}, To: 3})
	if _, err := tb.checkMove(MoveRequest{Topic: "p", Partition: -1, From: 1, To: 4}, nil); !errors.Is(err, ErrMoveBusy) {
		t.Fatalf("a queue whose replicas move: %v, want ErrMoveBusy", err)
	}
	applyCmd(t, tb, 21, command{Op: opStartMove, Move: &Move{Topic: "q", Partition: -1, From: 1, To: 4, Token: "a"}})
	if _, err := tb.checkMove(MoveRequest{Topic: "q", Partition: -1, From: 2, To: 4}, nil); !errors.Is(err, ErrMoveRunning) {
		t.Fatalf("a second move of a queue: %v, want ErrMoveRunning", err)
	}
	// A start_move the table refuses is applied as nothing.
	before := len(tb.Moves)
	applyCmd(t, tb, 22, command{Op: opStartMove, Move: &Move{Topic: "q", Partition: -1, From: 2, To: 3, Token: "b"}})
	if len(tb.Moves) != before {
		t.Fatalf("a refused move was recorded: %+v", tb.Moves)
	}
	if err := tb.apply(23, command{Op: opStartMove}); !errors.Is(err, ErrCommand) {
		t.Fatalf("start_move without a move: %v, want ErrCommand", err)
	}
}

// TestMoveSteps: a move adds the target after the replicas, cuts over once
// the owners report it in place (the target takes the source's place, as
// preferred owner too), ends done once they report that, and pins the
// queue.
func TestMoveSteps(t *testing.T) {
	tb := moveTable(t)
	applyCmd(t, tb, 20, command{Op: opStartMove, Move: &Move{Topic: "q", Partition: 0, From: 1, To: 4, Token: "a"}})
	m, ok := tb.MoveOf(20)
	if !ok || m.State != MoveCatchingUp || m.From != 1 || m.To != 4 || m.Token != "a" {
		t.Fatalf("move %+v (%v), want catching_up 1 -> 4 with id 20", m, ok)
	}
	q, _ := tb.Queue("q", "")
	if p := q.Partitions[0]; !slices.Equal(p.Replicas, []uint64{1, 2, 3, 4}) || !p.Moving {
		t.Fatalf("catching up: %+v, want [1 2 3 4] moving", p)
	}
	// A stale placement_done (the old replicas) changes nothing.
	applyCmd(t, tb, 21, command{Op: opPlacementDone, Queue: &Queue{Topic: "q"}, RaftGroup: q.Partitions[0].RaftGroup, Replicas: []uint64{1, 2, 3}})
	if m, _ := tb.MoveOf(20); m.State != MoveCatchingUp {
		t.Fatalf("a stale report moved the move on: %+v", m)
	}
	placeAll(t, tb, 22, "q")
	q, _ = tb.Queue("q", "")
	if p := q.Partitions[0]; !slices.Equal(p.Replicas, []uint64{4, 2, 3}) || !p.Moving {
		t.Fatalf("cut over: %+v, want [4 2 3] moving", p)
	}
	if m, _ := tb.MoveOf(20); m.State != MoveCuttingOver {
		t.Fatalf("after the target voted: %+v, want cutting_over", m)
	}
	applyCmd(t, tb, 23, command{Op: opCancelMove, Move: &Move{ID: 20, State: MoveCancelled}})
	if m, _ := tb.MoveOf(20); m.State != MoveCuttingOver {
		t.Fatalf("a cancel after the cut-over applied: %+v", m)
	}
	placeAll(t, tb, 24, "q")
	q, _ = tb.Queue("q", "")
	if m, _ := tb.MoveOf(20); m.State != MoveDone || m.EndedAt != 24 || !q.Pinned || q.Partitions[0].Moving {
		t.Fatalf("after the cut-over: move %+v, queue %+v, want done at 24 and pinned", m, q)
	}
	applyCmd(t, tb, 25, command{Op: opUnpinQueue, Queue: &Queue{Topic: "q"}})
	if q, _ := tb.Queue("q", ""); q.Pinned || !slices.Equal(q.Partitions[0].Replicas, []uint64{4, 2, 3}) {
		t.Fatalf("after unpin_queue: %+v, want not pinned, replicas as they were", q)
	}
	applyCmd(t, tb, 26, command{Op: opUnpinQueue, Queue: &Queue{Topic: "nope"}}) // applied as nothing
	if err := tb.apply(27, command{Op: opUnpinQueue}); !errors.Is(err, ErrCommand) {
		t.Fatalf("unpin_queue without a queue: %v, want ErrCommand", err)
	}
}

// TestMoveCancelAndBound: a cancel while catching up takes the target out
// again (the owners then remove it) and ends the move; the table keeps
// movesEndedKept ended moves.
func TestMoveCancelAndBound(t *testing.T) {
	tb := moveTable(t)
	idx := uint64(20)
	for i := range movesEndedKept + 5 {
		idx++
		applyCmd(t, tb, idx, command{Op: opStartMove, Move: &Move{Topic: "p", Partition: -1, From: 2, To: 3}})
		q, _ := tb.Queue("p", "")
		if !slices.Equal(q.Partitions[1].Replicas, []uint64{2, 1, 3}) {
			t.Fatalf("round %d: %+v", i, q.Partitions)
		}
		start := idx
		idx++
		applyCmd(t, tb, idx, command{Op: opCancelMove, Move: &Move{ID: start, State: MoveCancelled, Reason: "test"}})
		q, _ = tb.Queue("p", "")
		m, _ := tb.MoveOf(start)
		if m.State != MoveCancelled || m.Reason != "test" || !slices.Equal(q.Partitions[0].Replicas, []uint64{1, 2}) ||
			!slices.Equal(q.Partitions[1].Replicas, []uint64{2, 1}) || !q.Partitions[0].Moving {
			t.Fatalf("round %d: move %+v, queue %+v, want cancelled, replicas back, moving", i, m, q.Partitions)
		}
		idx++
		placeAll(t, tb, idx, "p")
	}
	if len(tb.Moves) != movesEndedKept {
		t.Fatalf("%d moves kept, want %d", len(tb.Moves), movesEndedKept)
	}
	if q, _ := tb.Queue("p", ""); q.Pinned {
		t.Fatal("a cancelled move pinned its queue")
	}
}

// TestMoveThroughTheController: a move started through one node runs to
// its end while the owners report their groups in place, through a change
// of the controller's leader; a second move of the queue is refused while
// it runs; a cancel after the cut-over is refused; the rebalancer leaves
// the pinned queue alone.
func TestMoveThroughTheController(t *testing.T) {
	c, n1 := fourNodesWithQueue(t, Placement{Replicas: []uint64{1, 2, 3}})
	c.mu.Lock()
	n2 := c.nodes[2]
	c.mu.Unlock()
	c.until("node 2 holds the queue", func() bool {
		_, ok := n2.Status().Table.Queue("q", "")
		return ok
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type res struct {
		m   Move
		err error
	}
	ch := make(chan res, 1)
	go func() {
		m, err := n2.StartMove(ctx, MoveRequest{Topic: "q", Partition: 0, From: 1, To: 4})
		ch <- res{m, err}
	}()
	var started res
	c.until("the move starts", func() bool {
		select {
		case started = <-ch:
			return true
		default:
			return false
		}
	})
	if started.err != nil || started.m.State != MoveCatchingUp {
		t.Fatalf("StartMove: %+v, %v", started.m, started.err)
	}
	if _, err := n2.StartMove(ctx, MoveRequest{Topic: "q", Partition: -1, From: 2, To: 4}); !errors.Is(err, ErrMoveRunning) {
		t.Fatalf("a second move: %v, want ErrMoveRunning", err)
	}
	// The controller's leader stops mid-move; the others elect another.
	leader := n1.Status().Leader
	c.stop(leader)
	var other *Controller
	c.mu.Lock()
	for id, n := range c.nodes {
		if id != leader && id != 4 {
			other = n
		}
	}
	c.mu.Unlock()
	report := func() {
		q, ok := other.Status().Table.Queue("q", "")
		if !ok {
			return
		}
		for i, p := range q.Partitions {
			if p.Moving {
				other.PlacementDone("q", "", i, p.RaftGroup, p.Replicas)
			}
		}
	}
	c.until("a new leader, and the move cut over", func() bool {
		report()
		m, _ := other.Status().Table.MoveOf(started.m.ID)
		st := other.Status()
		return st.Leader != 0 && st.Leader != leader && m.State != MoveCatchingUp
	})
	if _, err := other.CancelMove(ctx, started.m.ID, ""); !errors.Is(err, ErrMoveCutOver) && !errors.Is(err, ErrMoveEnded) {
		t.Fatalf("cancel after the cut-over: %v, want ErrMoveCutOver", err)
	}
	c.until("the move is done", func() bool {
		report()
		m, _ := other.Status().Table.MoveOf(started.m.ID)
		return m.State == MoveDone
	})
	q, _ := other.Status().Table.Queue("q", "")
	if !slices.Equal(q.Partitions[0].Replicas, []uint64{4, 2, 3}) || !q.Pinned {
		t.Fatalf("after the move: %+v, want [4 2 3], pinned", q)
	}
	if _, err := other.CancelMove(ctx, 999, ""); !errors.Is(err, ErrMoveUnknown) {
		t.Fatalf("cancel of an unknown move: %v, want ErrMoveUnknown", err)
	}
}

// TestMoveFailsWhenItsTargetDies: the target is held dead past the grace
// while the move catches up: the move fails and the queue keeps its
// replicas; the recovery plan does not move the queue meanwhile.
func TestMoveFailsWhenItsTargetDies(t *testing.T) {
	c, n1 := fourNodesWithQueue(t, Placement{Replicas: []uint64{1, 2, 3}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ch := make(chan error, 1)
	var m Move
	go func() {
		var err error
		m, err = n1.StartMove(ctx, MoveRequest{Topic: "q", Partition: -1, From: 3, To: 4})
		ch <- err
	}()
	c.until("the move starts", func() bool {
		select {
		case err := <-ch:
			if err != nil {
				t.Fatal(err)
			}
			return true
		default:
			return false
		}
	})
	c.mu.Lock()
	c.dead[4] = true
	c.mu.Unlock()
	c.until("the move fails", func() bool {
		cur, _ := n1.Status().Table.MoveOf(m.ID)
		return cur.State == MoveFailed
	})
	q, _ := n1.Status().Table.Queue("q", "")
	cur, _ := n1.Status().Table.MoveOf(m.ID)
	if !slices.Equal(q.Partitions[0].Replicas, []uint64{1, 2, 3}) || cur.Reason == "" {
		t.Fatalf("after the failed move: %+v, move %+v, want [1 2 3] and a reason", q.Partitions[0], cur)
	}
}

// TestRebalancerLeavesAPinnedQueue: queue q on nodes 1, 2 and 4, queues r
// and s on 1, 2 and 3; an operator moves q's replica on node 4 to node 3
// (loads 3, 3, 3, 0). Once every node has been live for the hold-off the
// rebalancer evens the load out with the other queues, and never moves the
// pinned q (the first queue it would otherwise take from node 1).
func TestRebalancerLeavesAPinnedQueue(t *testing.T) {
	c, n1 := fourNodesWithQueue(t, Placement{Replicas: []uint64{1, 2, 4}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, topic := range []string{"r", "s"} {
		created := make(chan error, 1)
		go func() {
			_, err := n1.CreateQueue(ctx, Queue{Topic: topic, Partitions: []Placement{{Replicas: []uint64{1, 2, 3}}}})
			created <- err
		}()
		c.until("queue "+topic+" is created", func() bool {
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
	}
	placed := func() {
		for _, q := range n1.Status().Table.Queues {
			for i, p := range q.Partitions {
				if p.Moving {
					n1.PlacementDone(q.Topic, q.Group, i, p.RaftGroup, p.Replicas)
				}
			}
		}
	}
	started := make(chan error, 1)
	go func() {
		_, err := n1.StartMove(ctx, MoveRequest{Topic: "q", Partition: -1, From: 4, To: 3})
		started <- err
	}()
	c.until("the move is done", func() bool {
		placed()
		select {
		case err := <-started:
			if err != nil {
				t.Fatal(err)
			}
		default:
		}
		q, _ := n1.Status().Table.Queue("q", "")
		return q.Pinned
	})
	for range 3 * rebalanceAfterTicks {
		placed()
		c.round(time.Millisecond)
	}
	placed()
	tb := n1.Status().Table
	q, _ := tb.Queue("q", "")
	if !slices.Equal(q.Partitions[0].Replicas, []uint64{1, 2, 3}) {
		t.Fatalf("the pinned queue's replicas %v, want [1 2 3] as the operator placed them", q.Partitions[0].Replicas)
	}
	if load := tb.replicaCounts(); load[4] == 0 {
		t.Fatalf("replicas held %v: the rebalancer moved nothing else onto node 4", load)
	}
	if err := n1.UnpinQueue(ctx, "nope", ""); !errors.Is(err, ErrNoQueue) {
		t.Fatalf("UnpinQueue of an unknown queue: %v, want ErrNoQueue", err)
	}
	unpinned := make(chan error, 1)
	go func() { unpinned <- n1.UnpinQueue(ctx, "q", "") }()
	c.until("q is unpinned", func() bool {
		select {
		case err := <-unpinned:
			if err != nil {
				t.Fatal(err)
			}
			q, _ := n1.Status().Table.Queue("q", "")
			return !q.Pinned
		default:
			return false
		}
	})
}
