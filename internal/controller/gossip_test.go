package controller

import (
	"fmt"
	"maps"
	"testing"
	"time"
)

// gossipIs reports whether every running node's table holds exactly the
// gossip addresses of want (raft id -> address, "" for none).
func (c *cluster) gossipIs(want map[uint64]string) func() bool {
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, n := range c.nodes {
			if !tableGossip(n.Status().Table, want) {
				return false
			}
		}
		return true
	}
}

func tableGossip(t *Table, want map[uint64]string) bool {
	got := map[uint64]string{}
	for _, nd := range t.Nodes {
		got[nd.RaftID] = nd.GossipAddr
	}
	return maps.Equal(got, want)
}

// The leader records each node's gossip address from the membership view,
// and the new one when it moves. A view that does not know a node's
// address (empty) changes nothing and proposes nothing, however long it
// lasts. A restarted node holds the addresses in the table it opens from
// its own log and snapshot, before it hears from anyone.
func TestControllerRecordsGossipAddr(t *testing.T) {
	c := newCluster(t)
	c.snapEvery = 4 // the restart below goes through a snapshot
	c.gossip = map[uint64]string{}
	c.start(1, true)
	c.start(2, false)
	c.start(3, false)
	three := []uint64{1, 2, 3}
	c.until("three voters, no gossip address known", c.agreed(three, nil, three, nil))
	c.until("no gossip address recorded", c.gossipIs(map[uint64]string{1: "", 2: "", 3: ""}))

	want := map[uint64]string{}
	c.mu.Lock()
	for id := uint64(1); id <= 3; id++ {
		c.gossip[id] = fmt.Sprintf("127.0.0.1:%d", 7900+id)
		want[id] = c.gossip[id]
	}
	c.mu.Unlock()
	c.until("gossip addresses recorded", c.gossipIs(want))

	// Node 2's address is not known for a while: the table keeps the
	// last one heard, and no join is proposed, even past the retry
	// interval of a proposal that did not show in the table.
	c.mu.Lock()
	c.gossip[2] = ""
	c.mu.Unlock()
	c.until("still three voters", c.agreed(three, nil, three, nil))
	// An election meanwhile (the rounds tick faster than the goroutines
	// may deliver) adds its leader's empty entry: one per new term.
	applied, term := map[uint64]uint64{}, map[uint64]uint64{}
	for id := uint64(1); id <= 3; id++ {
		st := c.nodes[id].Status()
		applied[id], term[id] = st.Applied, st.Term
	}
	for range 20 * proposeRetryTicks {
		c.round(2 * time.Millisecond)
	}
	for id := uint64(1); id <= 3; id++ {
		if st := c.nodes[id].Status(); st.Applied-applied[id] > st.Term-term[id] {
			got := st.Applied
			t.Fatalf("node %d applied %d entries while node 2's gossip address was unknown: %s", id, got-applied[id], c.describe())
		}
	}
	if !c.gossipIs(want)() {
		t.Fatalf("an unknown gossip address changed the table: %s", c.describe())
	}

	// Node 3's address moves: the new one is recorded.
	c.mu.Lock()
	c.gossip[3] = "127.0.0.1:7999"
	c.mu.Unlock()
	want[3] = "127.0.0.1:7999"
	c.until("node 3's new gossip address recorded", c.gossipIs(want))

	c.stop(1)
	if n := c.start(1, true); !tableGossip(n.Status().Table, want) {
		t.Fatalf("node 1 restarted with the table %+v, want gossip addresses %v", n.Status().Table.Nodes, want)
	}
	c.until("all three agree after the restart", c.agreed(three, nil, three, nil))
}

// A join keeps a node's recorded gossip address when it names none, and a
// snapshot carries the addresses.
func TestGossipAddrApplyAndSnapshot(t *testing.T) {
	var tbl Table
	n := nodeOf(1)
	n.GossipAddr = "10.0.0.1:7946"
	if err := tbl.apply(1, command{Op: opJoin, Node: &n}); err != nil {
		t.Fatal(err)
	}
	moved := nodeAt(1, 1) // a new client address, no gossip address known
	if err := tbl.apply(2, command{Op: opJoin, Node: &moved}); err != nil {
		t.Fatal(err)
	}
	if got := tbl.Nodes[0]; got.GossipAddr != "10.0.0.1:7946" || got.ClientAddr != moved.ClientAddr {
		t.Fatalf("after a join without a gossip address: %+v", got)
	}
	moved.GossipAddr = "10.0.0.9:7946"
	if err := tbl.apply(3, command{Op: opJoin, Node: &moved}); err != nil {
		t.Fatal(err)
	}
	if got := tbl.Nodes[0].GossipAddr; got != "10.0.0.9:7946" {
		t.Fatalf("gossip address %q after a join naming a new one", got)
	}
	b, err := encodeSnap(snap{Index: 3, Term: 1, Table: tbl})
	if err != nil {
		t.Fatal(err)
	}
	s, err := decodeSnap(b)
	if err != nil || len(s.Table.Nodes) != 1 || s.Table.Nodes[0] != tbl.Nodes[0] {
		t.Fatalf("decodeSnap(encodeSnap) = %+v, %v", s.Table.Nodes, err)
	}
}
