package controller

import (
	"context"
	"slices"
	"testing"
	"time"
)

func TestOrderByLoad(t *testing.T) {
	replicas := map[uint64]int{1: 2, 2: 0, 3: 0, 4: 0, 5: 2}
	cases := []struct {
		name  string
		loads NodeLoads
		want  []uint64
	}{
		{"no loads: spread-first, join order among equals", nil, []uint64{2, 3, 4, 1, 5}},
		{"every tie reported: the less loaded first", NodeLoads{
			1: {AppendRate: 9}, 2: {AppendRate: 50}, 3: {AppendRate: 10}, 4: {AppendRate: 10, Backlog: 3}, 5: {AppendRate: 1},
		}, []uint64{3, 4, 2, 5, 1}},
		{"a report missing in a run: that run in join order, the others by load", NodeLoads{
			1: {AppendRate: 9}, 2: {AppendRate: 50}, 3: {AppendRate: 10}, 5: {AppendRate: 1},
		}, []uint64{2, 3, 4, 5, 1}},
		{"load never beats replicas held", NodeLoads{
			1: {}, 5: {}, 2: {AppendRate: 1 << 30}, 3: {AppendRate: 1 << 30}, 4: {AppendRate: 1 << 30},
		}, []uint64{2, 3, 4, 1, 5}},
		{"partitions led breaks an equal rate and backlog", NodeLoads{
			2: {PartitionsLed: 3}, 3: {PartitionsLed: 1}, 4: {PartitionsLed: 2},
		}, []uint64{3, 4, 2, 1, 5}},
	}
	for _, tc := range cases {
		ids := []uint64{1, 2, 3, 4, 5}
		orderBy(ids, replicas, tc.loads)
		if !slices.Equal(ids, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, ids, tc.want)
		}
	}
}

func TestPlaceLoaded(t *testing.T) {
	tb := &Table{}
	for id := uint64(1); id <= 4; id++ {
		if err := tb.apply(id, command{Op: opJoin, Node: &Node{RaftID: id * 10, ID: nodeOf(id).ID}}); err != nil {
			t.Fatal(err)
		}
	}
	live := []uint64{10, 20, 30, 40}
	set := func(pl []Placement) []uint64 { return slices.Sorted(slices.Values(pl[0].Replicas)) }
	plain := Place(tb, live, 2, 3)
	if got := PlaceLoaded(tb, live, 2, 3, nil); !slices.EqualFunc(got, plain, func(a, b Placement) bool { return slices.Equal(a.Replicas, b.Replicas) }) {
		t.Fatalf("without loads %v, Place %v", got, plain)
	}
	if s := set(plain); !slices.Equal(s, []uint64{10, 20, 30}) {
		t.Fatalf("spread-first on an empty table: %v", s)
	}
	// 10 is the busiest: the queue goes to the three others.
	loads := NodeLoads{10: {AppendRate: 5000}, 20: {AppendRate: 10}, 30: {AppendRate: 20}, 40: {AppendRate: 0}}
	got := PlaceLoaded(tb, live, 2, 3, loads)
	if s := set(got); !slices.Equal(s, []uint64{20, 30, 40}) {
		t.Fatalf("with 10 busiest: replicas %v, want 20, 30, 40", s)
	}
	if got[0].Replicas[0] != 40 || got[1].Replicas[0] != 20 {
		t.Fatalf("preferred owners %d, %d: want the least loaded (40) then the next (20)", got[0].Replicas[0], got[1].Replicas[0])
	}
	// One node without a report: spread-first as if none had one.
	delete(loads, 30)
	if s := set(PlaceLoaded(tb, live, 2, 3, loads)); !slices.Equal(s, set(plain)) {
		t.Fatalf("a report missing: %v, want spread-first's %v", s, set(plain))
	}
	// Replicas held come first: a node holding fewer wins whatever it reports.
	tb.Queues = []Queue{{Topic: "x", Partitions: []Placement{{Replicas: []uint64{20, 30, 40}}}}}
	loads[30] = NodeLoad{AppendRate: 20}
	if s := set(PlaceLoaded(tb, live, 1, 1, loads)); !slices.Equal(s, []uint64{10}) {
		t.Fatalf("the only node holding no replica is 10: got %v", s)
	}
}

func TestRebalanceSource(t *testing.T) {
	joined := []uint64{1, 2, 3, 4}
	load := map[uint64]int{1: 1, 2: 5, 3: 5, 4: 5}
	members := slices.Clone(joined)
	orderBy(members, load, nil)
	if got := rebalanceSource(joined, members, load, nil, 5); got != 2 {
		t.Errorf("no loads: %d, want the first in join order among the most replicas (2)", got)
	}
	loads := NodeLoads{1: {}, 2: {AppendRate: 1}, 3: {AppendRate: 9}, 4: {AppendRate: 4}}
	members = slices.Clone(joined)
	orderBy(members, load, loads)
	if got := rebalanceSource(joined, members, load, loads, 5); got != 3 {
		t.Errorf("with loads: %d, want the most loaded among the most replicas (3)", got)
	}
	delete(loads, 4)
	members = slices.Clone(joined)
	orderBy(members, load, loads)
	if got := rebalanceSource(joined, members, load, loads, 5); got != 2 {
		t.Errorf("a report missing: %d, want 2", got)
	}
}

// TestRecoveryPlanGrowsOntoLessLoadedNodes: a queue on one node grows to
// three replicas on the two nodes the loads say are the least busy among
// those holding no replica; without loads it would take 2 and 3 (join
// order, as TestRecoveryPlanGrowsAQueueToTheReplicationFactor shows).
func TestRecoveryPlanGrowsOntoLessLoadedNodes(t *testing.T) {
	for _, tc := range []struct {
		loads NodeLoads
		want  []uint64
	}{
		{nil, []uint64{1, 2, 3}},
		{NodeLoads{1: {AppendRate: 1}, 2: {AppendRate: 900}, 3: {AppendRate: 5}, 4: {AppendRate: 7}}, []uint64{1, 3, 4}},
	} {
		if got := growOneReplicaQueue(t, tc.loads); !slices.Equal(got, tc.want) {
			t.Errorf("loads %v: replicas %v, want %v", tc.loads, got, tc.want)
		}
	}
}

// growOneReplicaQueue starts four nodes, hands the leader loads, creates
// a queue on node 1 alone and returns its replicas once it has three.
func growOneReplicaQueue(t *testing.T, loads NodeLoads) []uint64 {
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
	n1.SetNodeLoads(loads)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := n1.CreateQueue(ctx, Queue{Topic: "q", Partitions: []Placement{{Replicas: []uint64{1}}}})
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
	c.until("the queue holds three replicas", func() bool {
		q, ok := n1.Status().Table.Queue("q", "")
		if !ok {
			return false
		}
		p := q.Partitions[0]
		if p.Moving {
			n1.PlacementDone("q", "", 0, p.RaftGroup, p.Replicas)
			return false
		}
		return len(p.Replicas) == 3
	})
	q, _ := n1.Status().Table.Queue("q", "")
	return slices.Sorted(slices.Values(q.Partitions[0].Replicas))
}
