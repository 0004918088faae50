package e2e_test

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/protocol"
)

// rejoinBound bounds how long the restarted node may take to see its peers
// and a controller leader again. It is a bound, not a measure of speed: with
// the LAN profile the node rejoins within a reconnect round, while a node
// that knows no peer (no seeds, nothing taken from its table) waits for a
// peer's periodic full state exchange (30 s) or, on a new address, forever.
const rejoinBound = 15 * time.Second

// The node that bootstrapped the cluster (started without seeds) is
// stopped and started again with the same command line, still without
// seeds: it reaches the nodes its committed table names, through raft and
// through gossip, sees both alive and the controller's three voters within
// rejoinBound, answers not_owner for a replicated queue it does not own,
// and a publish through it succeeds. Stopped with SIGTERM (a drain) and
// started on the same ports; killed with -9 and started at once on the
// same ports (before the others declare its previous run dead: the new run
// answers their probes, so nothing tells it of its peers); and killed with
// -9 and started on new ports (a machine whose address changed: the
// others know nothing of its new one).
func TestClusterBootstrapNodeRejoinsThroughItsTable(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	for _, tc := range []struct {
		name     string
		profile  string
		sig      os.Signal
		newPorts bool
	}{
		{"sigterm-same-ports", "lan", syscall.SIGTERM, false},
		{"kill-same-ports", "lan", syscall.SIGKILL, false},
		{"sigterm-same-ports-seed-profile", "seed", syscall.SIGTERM, false},
		{"kill-same-ports-seed-profile", "seed", syscall.SIGKILL, false},
		{"kill-new-ports", "lan", syscall.SIGKILL, true},
	} {
		t.Run(tc.name, func(t *testing.T) { bootstrapNodeRejoins(t, bin, tc.profile, tc.sig, tc.newPorts) })
	}
}

func bootstrapNodeRejoins(t *testing.T, bin, profile string, sig os.Signal, newPorts bool) {
	dir1 := t.TempDir()
	// Node 1's command line, as docs/cluster.md writes it: fixed ports,
	// no seeds.
	args := func() []string {
		return []string{"--listen", freeAddr(t), "--admin-listen", freeAddr(t), "--cluster", "--cluster-profile", profile,
			"--cluster-gossip-listen", freeAddr(t), "--cluster-peer-listen", freeAddr(t)}
	}
	start1 := func(args []string) *clusterChild {
		c := startChildArgs(t, bin, dir1, args...)
		return &clusterChild{child: c, dir: dir1, admin: logField(t, c, "msg=serving", "admin_listen"),
			gossip: logField(t, c, "cluster membership started", "gossip_addr")}
	}
	cmdline := args()
	n1 := start1(cmdline)
	n2 := startClusterChildArgs(t, bin, t.TempDir(), []string{"--cluster-profile", profile}, n1.gossip)
	n3 := startClusterChildArgs(t, bin, t.TempDir(), []string{"--cluster-profile", profile}, n1.gossip)
	nodes := []*clusterChild{n1, n2, n3}
	id := map[*clusterChild]string{}
	var three []string
	for _, c := range nodes {
		id[c] = nodesOf(t, c.admin).Self.ID
		three = append(three, id[c])
	}
	for _, c := range nodes {
		awaitNodes(t, c, "three voters", func(v nodesView) bool { return controllerAgrees(v, three, nil, three, nil) })
	}

	// A queue whose preferred owner is another node: its owner stays
	// there while node 1 restarts (successive queues start on different
	// nodes, so one of the first three is one).
	_, _, client := seededClient(t, nodes, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 2*safetyTimeout)
	defer cancel()
	topic := ""
	for i := 0; i < 3 && topic == ""; i++ {
		name := fmt.Sprintf("rejoin-%d", i)
		if _, err := client.DeclareQueue(ctx, name, sinew.QueueConfig{Partitions: 1}); err != nil {
			t.Fatal(err)
		}
		var q struct {
			Partitions []struct {
				Replicas []string `json:"replicas"`
			} `json:"partitions"`
		}
		getJSONInto(t, "http://"+n2.admin+"/api/v1/queues/"+name, &q)
		if len(q.Partitions) != 1 || len(q.Partitions[0].Replicas) != 3 {
			t.Fatalf("queue %s: %+v, want one partition on three replicas", name, q)
		}
		if q.Partitions[0].Replicas[0] != n1.addr {
			topic = name
		}
	}
	if topic == "" {
		t.Fatal("the first three queues all prefer node 1 as their owner")
	}
	if _, err := client.Publish(ctx, topic, []byte("before")); err != nil {
		t.Fatal(err)
	}

	if err := n1.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	waitChild(t, n1.child)
	if newPorts {
		cmdline = args()
	}
	restarted := time.Now()
	n1b := start1(cmdline)
	if got := nodesOf(t, n1b.admin).Self.ID; got != id[n1] {
		t.Fatalf("the restarted node has id %s, was %s", got, id[n1])
	}
	v := awaitNodesFor(t, n1b, "the restarted node sees both peers alive and the controller's three voters", rejoinBound, func(v nodesView) bool {
		return v.state(id[n2]) == "alive" && v.state(id[n3]) == "alive" && !v.Fenced && controllerAgrees(v, three, nil, three, nil)
	})
	t.Logf("restart (%v) to both peers alive and a controller leader (%s) on the restarted node: %v", sig, v.Controller.Leader,
		time.Since(restarted).Round(time.Millisecond))
	for _, c := range []*clusterChild{n2, n3} {
		awaitNodesFor(t, c, "the others see the restarted node alive", rejoinBound, func(v nodesView) bool { return v.state(id[n1]) == "alive" })
	}

	// The restarted node serves the queue: it follows the owner and names
	// it, or (an election on a loaded machine may give it the lead) it is
	// the owner and stores the publish.
	deadline := time.Now().Add(rejoinBound)
	for {
		body := rawPublish(t, n1b.addr, topic)
		if _, stored := body.(*protocol.PublishOK); stored {
			t.Logf("the restarted node leads the queue's partition now")
			break
		}
		eb, ok := body.(*protocol.ErrorBody)
		if ok && eb.Code == protocol.CodeNotOwner && eb.Owner != "" && eb.Owner != n1b.addr {
			break
		}
		if !ok || eb.Code != protocol.CodeUnavailable || time.Now().After(deadline) {
			t.Fatalf("raw publish on the restarted node: %+v, want stored or not_owner naming another node", body)
		}
		time.Sleep(50 * time.Millisecond) // polling a real process
	}
	// A client that knows only the restarted node publishes through it.
	_, _, viaClient := seededClient(t, []*clusterChild{n1b}, 0)
	pctx, pcancel := context.WithTimeout(context.Background(), rejoinBound)
	defer pcancel()
	if _, err := viaClient.Publish(pctx, topic, []byte("after")); err != nil {
		t.Fatalf("publish through the restarted node: %v", err)
	}
}
