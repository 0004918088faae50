package clusternode

import (
	"maps"
	"slices"
	"testing"

	"github.com/sinewmq/sinew/internal/controller"
)

// The transport is handed every node of the committed table that has not
// left, at its peer address, whatever gossip says; membership's address
// wins where both exist. Membership is handed the table's gossip
// addresses, without this node's and those of nodes that left.
func TestTablePeers(t *testing.T) {
	tbl := &controller.Table{Nodes: []controller.Node{
		{RaftID: 1, ID: "a", PeerAddr: "10.0.0.1:7947", GossipAddr: "10.0.0.1:7946"}, // this node
		{RaftID: 2, ID: "b", PeerAddr: "10.0.0.2:7947", GossipAddr: "10.0.0.2:7946"},
		{RaftID: 3, ID: "c", PeerAddr: "10.0.0.3:7947", GossipAddr: "10.0.0.3:7946"},
		{RaftID: 4, ID: "d", PeerAddr: "10.0.0.4:7947", GossipAddr: "10.0.0.4:7946", Left: true},
		{RaftID: 5, ID: "e", PeerAddr: "127.0.0.1:7947", GossipAddr: "127.0.0.1:7946"}, // another machine's loopback
		{RaftID: 6, ID: "f"}, // no address recorded
	}}
	self := controller.Member{Node: controller.Node{RaftID: 1, PeerAddr: "10.0.0.1:7947", GossipAddr: "10.0.0.1:7946"}}

	// Alone: the table alone names the peers.
	got := transportPeers(tbl, 1, self.PeerAddr, []controller.Member{self})
	want := map[uint64]string{2: "10.0.0.2:7947", 3: "10.0.0.3:7947"}
	if !maps.Equal(got, want) {
		t.Fatalf("transport peers of the table alone: %v, want %v", got, want)
	}
	// Gossip knows node 3 at a new address, and node 7 the table does
	// not hold yet.
	view := []controller.Member{self,
		{Node: controller.Node{RaftID: 3, PeerAddr: "10.0.0.33:7947"}},
		{Node: controller.Node{RaftID: 7, PeerAddr: "10.0.0.7:7947"}, Dead: true}}
	got = transportPeers(tbl, 1, self.PeerAddr, view)
	want = map[uint64]string{2: "10.0.0.2:7947", 3: "10.0.0.33:7947", 7: "10.0.0.7:7947"}
	if !maps.Equal(got, want) {
		t.Fatalf("transport peers with gossip: %v, want %v", got, want)
	}
	if got := transportPeers(nil, 1, self.PeerAddr, view[:1]); len(got) != 0 {
		t.Fatalf("transport peers without a table: %v", got)
	}

	if got, want := tableGossipAddrs(tbl, 1, self.GossipAddr), []string{"10.0.0.2:7946", "10.0.0.3:7946"}; !slices.Equal(got, want) {
		t.Fatalf("gossip addresses %v, want %v", got, want)
	}
	// On loopback (every node on this machine) a loopback address is one.
	if got, want := tableGossipAddrs(tbl, 1, "127.0.0.1:9946"), []string{"10.0.0.2:7946", "10.0.0.3:7946", "127.0.0.1:7946"}; !slices.Equal(got, want) {
		t.Fatalf("gossip addresses from a loopback node %v, want %v", got, want)
	}
	if got := tableGossipAddrs(nil, 1, self.GossipAddr); got != nil {
		t.Fatalf("gossip addresses without a table: %v", got)
	}
}
