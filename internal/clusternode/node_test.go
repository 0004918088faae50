package clusternode

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/settings"
)

// startNode starts a cluster node in this process on loopback ports the
// system picks, joining seeds (none: it bootstraps the cluster).
func startNode(t *testing.T, i int, seeds []string) *Node {
	t.Helper()
	cfg := settings.Default()
	cfg.DataDir = t.TempDir()
	cfg.Cluster.Enabled = true
	cfg.Cluster.Profile = "lan"
	cfg.Cluster.GossipListen = "127.0.0.1:0"
	cfg.Cluster.PeerListen = "127.0.0.1:0"
	cfg.Cluster.Seeds = seeds
	n, err := Start(cfg, fmt.Sprintf("127.0.0.1:%d", 17000+i), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("node %d: %v", i, err)
	}
	t.Cleanup(n.Close)
	return n
}

// Three nodes started in one process form a cluster: each sees the other
// two alive in gossip, and the controller group they share names all three
// as voters, with one leader every node agrees on. A test of the cluster
// node needs no processes.
func TestThreeNodesFormInProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("forms a cluster over loopback")
	}
	n1 := startNode(t, 1, nil)
	seed := []string{n1.m.Addr()}
	nodes := []*Node{n1, startNode(t, 2, seed), startNode(t, 3, seed)}

	formed := func() string {
		var leader string
		for i, n := range nodes {
			v := n.view()
			alive := 0
			for _, p := range v.Nodes {
				if p.State == "alive" {
					alive++
				}
			}
			if alive != 2 {
				return fmt.Sprintf("node %d sees %d of 2 peers alive", i+1, alive)
			}
			c := v.Controller
			if len(c.Voters) != 3 || len(c.Nodes) != 3 {
				return fmt.Sprintf("node %d: controller voters %v, nodes %d", i+1, c.Voters, len(c.Nodes))
			}
			if c.Leader == "" || leader != "" && c.Leader != leader {
				return fmt.Sprintf("node %d: controller leader %q (others: %q)", i+1, c.Leader, leader)
			}
			leader = c.Leader
		}
		return ""
	}
	// Bounded: formation over loopback takes a few seconds; the bound
	// only ends a broken run.
	deadline := time.Now().Add(60 * time.Second)
	for {
		why := formed()
		if why == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no cluster of three formed: %s", why)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Each node's committed table holds every node's client and peer
	// address, the ones it was started with.
	for _, n := range nodes {
		for _, nd := range n.controllerAdminView().Nodes {
			var want *Node
			for _, m := range nodes {
				if m.id == nd.ID {
					want = m
				}
			}
			if want == nil || nd.ClientAddr != want.client || nd.PeerAddr != want.peer {
				t.Errorf("table entry %+v does not match a started node", nd)
			}
		}
	}
}
