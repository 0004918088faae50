package controller

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"
)

// TestQueueChangeCommands: delete and update name the queue's incarnation
// (a queue deleted and created again is not touched by a change meant for
// the first one); a replica move marks every partition Moving until its
// owner reports the new voters; runtime settings change only from the
// version they were based on.
func TestQueueChangeCommands(t *testing.T) {
	tb := &Table{}
	for id := uint64(1); id <= 4; id++ {
		if err := tb.apply(id, command{Op: opJoin, Node: &Node{RaftID: id, ID: nodeOf(id).ID}}); err != nil {
			t.Fatal(err)
		}
	}
	apply := func(index uint64, c command) {
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
	create := func(index uint64, topic string) Queue {
		t.Helper()
		apply(index, command{Op: opCreateQueue, Queue: &Queue{Topic: topic, Settings: json.RawMessage(`{"v":1}`),
			Partitions: []Placement{{Replicas: []uint64{1, 2, 3}}, {Replicas: []uint64{2, 3, 1}}}}})
		q, ok := tb.Queue(topic, "")
		if !ok {
			t.Fatalf("queue %s not created", topic)
		}
		return q
	}
	a := create(10, "a")
	create(11, "b")
	if a.Partitions[0].Moving {
		t.Fatal("a new queue's partitions are Moving")
	}

	// Update: an old incarnation's change does nothing; the current one's applies.
	apply(12, command{Op: opUpdateQueue, Queue: &Queue{Topic: "a", CreatedAt: 9, Settings: json.RawMessage(`{"v":2}`)}})
	if q, _ := tb.Queue("a", ""); string(q.Settings) != `{"v":1}` {
		t.Fatalf("a change for another incarnation applied: %s", q.Settings)
	}
	apply(13, command{Op: opUpdateQueue, Queue: &Queue{Topic: "a", CreatedAt: 10, Settings: json.RawMessage(`{"v":2}`)}})
	if q, _ := tb.Queue("a", ""); string(q.Settings) != `{"v":2}` {
		t.Fatalf("settings %s after the update, want v 2", q.Settings)
	}

	// A move marks every partition Moving; placement_done clears one
	// partition only when it names the group's current replicas.
	apply(14, command{Op: opReplaceReplica, Queue: &Queue{Topic: "a"}, From: 3, To: 4})
	q, _ := tb.Queue("a", "")
	for p, pl := range q.Partitions {
		if !pl.Moving || slices.Contains(pl.Replicas, 3) {
			t.Fatalf("partition %d after the move: %+v", p, pl)
		}
	}
	apply(15, command{Op: opPlacementDone, Queue: &Queue{Topic: "a"}, Partition: 0, RaftGroup: q.Partitions[0].RaftGroup, Replicas: []uint64{1, 2, 3}})
	apply(16, command{Op: opPlacementDone, Queue: &Queue{Topic: "a"}, Partition: 0, RaftGroup: q.Partitions[1].RaftGroup, Replicas: q.Partitions[0].Replicas})
	apply(17, command{Op: opPlacementDone, Queue: &Queue{Topic: "a"}, Partition: 7, RaftGroup: q.Partitions[0].RaftGroup, Replicas: q.Partitions[0].Replicas})
	if q, _ := tb.Queue("a", ""); !q.Partitions[0].Moving {
		t.Fatal("a stale placement_done cleared Moving")
	}
	apply(18, command{Op: opPlacementDone, Queue: &Queue{Topic: "a"}, Partition: 0, RaftGroup: q.Partitions[0].RaftGroup, Replicas: q.Partitions[0].Replicas})
	if q, _ := tb.Queue("a", ""); q.Partitions[0].Moving || !q.Partitions[1].Moving {
		t.Fatalf("after placement_done of partition 0: %+v", q.Partitions)
	}

	// Purge: recorded at its index; a partition's report counts only for
	// the last purge.
	apply(30, command{Op: opPurgeQueue, Queue: &Queue{Topic: "a", CreatedAt: 10}})
	apply(31, command{Op: opPurgeDone, Queue: &Queue{Topic: "a"}, Partition: 1, Seq: 30, Count: 5})
	apply(32, command{Op: opPurgeQueue, Queue: &Queue{Topic: "a"}})
	apply(33, command{Op: opPurgeDone, Queue: &Queue{Topic: "a"}, Partition: 0, Seq: 30, Count: 9})
	apply(34, command{Op: opPurgeDone, Queue: &Queue{Topic: "a"}, Partition: 0, Seq: 32, Count: 2})
	apply(35, command{Op: opPurgeDone, Queue: &Queue{Topic: "a"}, Partition: 9, Seq: 32, Count: 2})
	if q, _ := tb.Queue("a", ""); q.PurgeSeq != 32 || !slices.Equal(q.PurgeDone, []uint64{32, 30}) || !slices.Equal(q.PurgeCount, []uint64{2, 5}) {
		t.Fatalf("purges: seq %d done %v count %v", q.PurgeSeq, q.PurgeDone, q.PurgeCount)
	}

	// Delete: another incarnation's delete does nothing; the queue's own
	// removes it; a new queue of the same name gets new raft groups.
	apply(19, command{Op: opDeleteQueue, Queue: &Queue{Topic: "a", CreatedAt: 3}})
	if _, ok := tb.Queue("a", ""); !ok {
		t.Fatal("a delete for another incarnation removed the queue")
	}
	apply(20, command{Op: opDeleteQueue, Queue: &Queue{Topic: "a", CreatedAt: 10}})
	if _, ok := tb.Queue("a", ""); ok {
		t.Fatal("queue a still in the catalogue after its delete")
	}
	if _, ok := tb.Queue("b", ""); !ok {
		t.Fatal("queue b went with a")
	}
	a2 := create(21, "a")
	if a2.Partitions[0].RaftGroup <= a.Partitions[1].RaftGroup+2 {
		t.Fatalf("the new queue a reuses raft groups: %d after %d", a2.Partitions[0].RaftGroup, a.Partitions[1].RaftGroup)
	}

	// Runtime settings: version checked.
	set := func(index, expected, version uint64, id string) {
		apply(index, command{Op: opSetRuntime, Expected: expected, Runtime: &Runtime{Version: version, Values: map[string]int64{"k": int64(version)}, ID: id}})
	}
	set(22, 1, 2, "x") // based on a version that is not there
	if tb.Runtime != nil {
		t.Fatalf("runtime %+v from a change based on version 1", tb.Runtime)
	}
	set(23, 0, 4, "seed")
	set(24, 0, 5, "late-seed")
	set(25, 4, 5, "first")
	set(26, 4, 5, "second")
	if tb.Runtime == nil || tb.Runtime.Version != 5 || tb.Runtime.ID != "first" || tb.Runtime.Values["k"] != 5 {
		t.Fatalf("runtime %+v, want version 5 by the first change", tb.Runtime)
	}
}

// TestQueueChangesThroughTheGroup: delete, update and runtime changes
// proposed on a follower reach every node, and survive a restart.
func TestQueueChangesThroughTheGroup(t *testing.T) {
	c := newCluster(t)
	c.start(1, true)
	c.start(2, false)
	c.start(3, false)
	c.until("three voters", c.agreed([]uint64{1, 2, 3}, nil, []uint64{1, 2, 3}, nil))
	c.mu.Lock()
	n2 := c.nodes[2]
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := n2.CreateQueue(ctx, Queue{Topic: "q", Settings: json.RawMessage(`{"v":1}`), Partitions: []Placement{{Replicas: []uint64{1, 2, 3}}}}); err != nil {
		t.Fatal(err)
	}
	if q, err := n2.UpdateQueue(ctx, "q", "", json.RawMessage(`{"v":2}`)); err != nil || string(q.Settings) != `{"v":2}` {
		t.Fatalf("update: %+v, %v", q, err)
	}
	rt, mine, err := n2.SetRuntime(ctx, 0, 1, map[string]int64{"k": 1})
	if err != nil || !mine || rt.Version != 1 {
		t.Fatalf("first runtime settings: %+v mine %v, %v", rt, mine, err)
	}
	rt, mine, err = n2.SetRuntime(ctx, 0, 1, map[string]int64{"k": 9})
	if err != nil || mine || rt.Version != 1 || rt.Values["k"] != 1 {
		t.Fatalf("a change based on a stale version: %+v mine %v, %v", rt, mine, err)
	}
	if err := n2.DeleteQueue(ctx, "q", ""); err != nil {
		t.Fatal(err)
	}
	if err := n2.DeleteQueue(ctx, "q", ""); !errors.Is(err, ErrNoQueue) {
		t.Fatalf("second delete: %v, want ErrNoQueue", err)
	}
	if _, err := n2.UpdateQueue(ctx, "q", "", json.RawMessage(`{"v":3}`)); !errors.Is(err, ErrNoQueue) {
		t.Fatalf("update of a deleted queue: %v, want ErrNoQueue", err)
	}
	c.until("every node applied the changes", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, n := range c.nodes {
			tb := n.Status().Table
			if _, ok := tb.Queue("q", ""); ok || tb.Runtime == nil || tb.Runtime.Values["k"] != 1 {
				return false
			}
		}
		return true
	})
	c.stop(3)
	if tb := c.start(3, false).Status().Table; tb.Runtime == nil || tb.Runtime.Version != 1 || len(tb.Queues) != 0 {
		t.Fatalf("after a restart: runtime %+v, queues %d", tb.Runtime, len(tb.Queues))
	}
}
