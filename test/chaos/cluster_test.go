package chaos_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/test/chaos/checker"
	"github.com/sinewmq/sinew/test/chaos/harness"
	"github.com/sinewmq/sinew/test/chaos/netlab"
	"github.com/sinewmq/sinew/test/chaos/workload"
)

// The cluster scenarios run three `sinew serve --cluster` processes on
// loopback (LAN profile) with the SDK workload: every client knows the
// three nodes as seeds, producers publish through any node and follow
// not_owner, and the consumers subscribe through different nodes, so that
// whichever node owns a partition has consumers. The checker is the same
// as for one broker: 0 confirmed messages lost and 0 settled messages
// delivered again, with duplicates counted.

// clusterNodes is the cluster's size.
const clusterNodes = 3

// workloadPartitions is the number of partitions of the workload's queue.
const workloadPartitions = 2

// clusterEnv is what a cluster nemesis acts on.
type clusterEnv struct {
	t      *testing.T
	bin    string // the sinew binary
	base   string // the scenario's directory
	joined int    // nodes started to join during the run
	nodes  []*harness.Broker
	topic  string
	run    *workload.Run
	faults int
	// probe publishes to partition 0 through the cluster (it knows every
	// node), to time failovers; failovers are the times from an owner's
	// kill to the probe's next confirmed publish.
	probe     *sinew.Client
	failovers []time.Duration
	// ck is the run's checker; lab is the network the nodes run in (nil on
	// loopback).
	ck  *checker.Checker
	lab *netlab.Lab
	// probeSeq numbers the probe's publishes into the workload's queue.
	probeSeq uint64
	// watch times the gaps in the probe's confirms around each fault.
	watch *confirmWatch
	// upgraded counts the nodes a rolling upgrade moved to this tree's
	// binary.
	upgraded int
}

func (e *clusterEnv) logf(format string, args ...any) {
	e.t.Logf("t=%dms "+format, append([]any{e.run.SinceMs()}, args...)...)
}

// clusterNet is where a cluster's nodes listen and how the test reaches
// them: loopback ports (loopbackNet), or network namespaces (namespaceNet).
type clusterNet struct {
	nodes []nodeNet
	// dial opens the clients' connections (the probe's and the
	// workload's); nil dials from the test's own namespace.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// nodeNet is one node's place in a clusterNet.
type nodeNet struct {
	addr, admin  string // client and admin listeners ("" picks a loopback port)
	gossip, peer string
	args         []string // more flags (keys, TLS, auth)
	wrap         []string // harness.Config.Wrap
	dial         func(ctx context.Context, network, addr string) (net.Conn, error)
}

// loopbackNet places every node on loopback ports.
func loopbackNet(t *testing.T) clusterNet {
	t.Helper()
	var cn clusterNet
	for range clusterNodes {
		gossip, err := harness.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		peer, err := harness.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		cn.nodes = append(cn.nodes, nodeNet{gossip: gossip, peer: peer})
	}
	return cn
}

// startClusterNodes starts three nodes; the first bootstraps the controller
// group, and every node names the others as gossip seeds on a restart.
func startClusterNodes(t *testing.T, bin, base string, cn clusterNet, firstWithoutSeeds bool) []*harness.Broker {
	t.Helper()
	var nodes []*harness.Broker
	for i, nn := range cn.nodes {
		var others []string
		for j, o := range cn.nodes {
			if j != i {
				others = append(others, o.gossip)
			}
		}
		started := false // set once the first start is done (seeds runs under the broker's lock)
		b := newClusterNode(t, bin, filepath.Join(base, fmt.Sprintf("n%d", i+1)), nn, func() []string {
			// The first node's first start bootstraps the controller;
			// every later start joins through the others.
			// With firstWithoutSeeds, the first node keeps its first
			// command line on every restart: it rejoins through the
			// peers its own node table records.
			if i > 0 || started && !firstWithoutSeeds {
				return others
			}
			return nil
		})
		if err := b.Start(); err != nil {
			t.Fatalf("start node %d: %v\nstderr:\n%s", i+1, err, b.StderrTail())
		}
		started = true
		nodes = append(nodes, b)
	}
	// Every node's controller replica votes before the workload starts.
	deadline := time.Now().Add(startupTimeout)
	for {
		var v struct {
			Controller struct {
				Leader string   `json:"leader"`
				Voters []string `json:"voters"`
			} `json:"controller"`
		}
		err := getJSON(nodes[0], "/api/v1/nodes", &v)
		if err == nil && v.Controller.Leader != "" && len(v.Controller.Voters) == clusterNodes {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the controller group did not reach %d voters: %+v %v\nnode 1 stderr:\n%s", clusterNodes, v, err, nodes[0].StderrTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nodes
}

// clusterLeaseMs is the workload queue's lease: leaseMs (2 s, shorter
// than a cut owner takes to be noticed, so that leases run out during
// faults), or SINEW_CHAOS_CLUSTER_LEASE_MS (30000: the broker's default).
func clusterLeaseMs(t *testing.T) int64 {
	v := os.Getenv("SINEW_CHAOS_CLUSTER_LEASE_MS")
	if v == "" {
		return leaseMs
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms <= 0 {
		t.Fatalf("SINEW_CHAOS_CLUSTER_LEASE_MS=%q: want a positive number of milliseconds", v)
	}
	return ms
}

// clusterProfile is the nodes' failure-detection profile: lan, or
// SINEW_CHAOS_CLUSTER_PROFILE (seed: the seed's slower timings).
func clusterProfile() string {
	if p := os.Getenv("SINEW_CHAOS_CLUSTER_PROFILE"); p != "" {
		return p
	}
	return "lan"
}

// newClusterNode makes (does not start) a cluster node in dir, placed as
// nn says; seeds gives the gossip seeds of each start (none: it
// bootstraps the controller).
func newClusterNode(t *testing.T, bin, dir string, nn nodeNet, seeds func() []string) *harness.Broker {
	t.Helper()
	args := append(slices.Clone(serveArgs), "--cluster", "--cluster-profile", clusterProfile(),
		"--cluster-gossip-listen", nn.gossip, "--cluster-peer-listen", nn.peer)
	args = append(args, nn.args...)
	b, err := harness.New(harness.Config{Binary: bin, DataDir: filepath.Join(dir, "data"), LogDir: dir,
		Addr: nn.addr, AdminAddr: nn.admin, Wrap: nn.wrap, Dial: nn.dial,
		ReadyTimeout: startupTimeout, ExtraArgs: args,
		Args: func(b *harness.Broker) []string {
			a := harness.ServeArgs(b)
			if s := seeds(); len(s) > 0 {
				a = append(a, "--cluster-seeds", strings.Join(s, ","))
			}
			return a
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// getJSON reads path from b's admin API into v.
func getJSON(b *harness.Broker, path string, v any) error {
	resp, err := adminClient(b).Get("http://" + b.AdminAddr() + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// owner returns the index of the node that owns partition p of the topic,
// as a running node reports it, waiting (bounded) while there is none.
func (e *clusterEnv) owner(ctx context.Context, topic string, p int) (int, error) {
	for {
		for _, n := range e.nodes {
			if !n.Running() {
				continue
			}
			var q struct {
				Partitions []struct {
					Owner string `json:"owner"`
				} `json:"partitions"`
			}
			if err := getJSON(n, "/api/v1/queues/"+topic, &q); err != nil || len(q.Partitions) <= p {
				continue
			}
			for i, m := range e.nodes {
				if m.Addr() == q.Partitions[p].Owner && m.Running() {
					return i, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return -1, errors.New("no running node owns the partition")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ownerKill9 kills the owner of partition 0 with -9, times until a publish is
// confirmed again (through the workload's own producers), and restarts it.
func ownerKill9(ctx context.Context, e *clusterEnv) error {
	i, err := e.owner(ctx, e.topic+"-probe", 0)
	if err != nil {
		if ctx.Err() != nil {
			return nil // the phase ended while an election was under way
		}
		return err
	}
	if err := e.nodes[i].Kill(); err != nil {
		return err
	}
	took, err := e.probeFailover(time.Now())
	if err != nil {
		return err
	}
	e.logf("killed -9 node %d (the owner of partition 0); a publish to partition 0 was confirmed again after %v; restarting it",
		i+1, took.Round(time.Millisecond))
	return e.nodes[i].Restart()
}

// probeFailover times a publish to the probe queue's partition 0 after a
// fault at `at`, and records it.
func (e *clusterEnv) probeFailover(at time.Time) (time.Duration, error) {
	return e.timeFailover(at, func(ctx context.Context) error {
		_, err := e.probe.Publish(ctx, e.topic+"-probe", []byte("probe"), sinew.WithPartition(0))
		return err
	})
}

// timeFailover runs publish (a probe's publish, bounded) after a fault at
// `at`, and records the time from the fault to its confirm.
func (e *clusterEnv) timeFailover(at time.Time, publish func(context.Context) error) (time.Duration, error) {
	pctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := publish(pctx); err != nil {
		return 0, fmt.Errorf("probe publish after the fault: %w", err)
	}
	took := time.Since(at)
	e.failovers = append(e.failovers, took)
	return took, nil
}

// ownerPause stops the owner of the probe queue's partition with SIGSTOP for
// pauseHold, as a node cut off from the others would be, then lets it go
// on: it comes back deposed, with a stale term, and must not serve anything
// the new owner decided differently.
func ownerPause(ctx context.Context, e *clusterEnv) error {
	i, err := e.owner(ctx, e.topic+"-probe", 0)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if err := e.nodes[i].Pause(); err != nil {
		return err
	}
	took, err := e.probeFailover(time.Now())
	if err != nil {
		_ = e.nodes[i].Resume()
		return err
	}
	hold(ctx, pauseHold)
	e.logf("paused node %d (the owner of partition 0): a publish to partition 0 was confirmed again after %v; resuming it after %v",
		i+1, took.Round(time.Millisecond), pauseHold)
	return e.nodes[i].Resume()
}

// pauseHold is how long ownerPause keeps the owner stopped: long enough for
// the failure detector to declare it dead and its groups to elect anew.
const pauseHold = 8 * time.Second

// controllerLeaderKill9 kills the controller group's leader with -9 and
// restarts it: queues keep working (their partitions do not depend on the
// controller), and a queue created right after the kill waits for the new
// controller leader.
func controllerLeaderKill9(ctx context.Context, e *clusterEnv) error {
	leader := -1
	for leader < 0 {
		for i, n := range e.nodes {
			var v struct {
				Self       struct{ ID string } `json:"self"`
				Controller struct {
					Leader string `json:"leader"`
				} `json:"controller"`
			}
			if !n.Running() || getJSON(n, "/api/v1/nodes", &v) != nil {
				continue
			}
			if v.Controller.Leader != "" && v.Controller.Leader == v.Self.ID {
				leader = i
			}
		}
		if leader < 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	if err := e.nodes[leader].Kill(); err != nil {
		return err
	}
	killed := time.Now()
	topic := fmt.Sprintf("%s-new-%d", e.topic, e.faults)
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.probe.Publish(cctx, topic, []byte("first")); err != nil {
		return fmt.Errorf("a new queue after the controller leader's kill: %w", err)
	}
	e.logf("killed -9 node %d (the controller leader); a new queue took its first publish after %v; restarting it",
		leader+1, time.Since(killed).Round(time.Millisecond))
	return e.nodes[leader].Restart()
}

// TestClusterOwnerKill9 kills the owner of a partition with -9 and restarts
// it, over and over, under publish and consume load through the SDK.
func TestClusterOwnerKill9(t *testing.T) {
	runClusterScenario(t, clusterScenario{name: "cluster-owner-kill9", every: 2500 * time.Millisecond, fault: ownerKill9})
}

// TestClusterOwnerPause stops the owner with SIGSTOP and lets it go on.
// It is not part of the default run yet (SINEW_CHAOS_CLUSTER_PAUSE=1 runs
// it): it found two faults only recently fixed (a client reading messages
// past their leases, and a replica that lost the lead leaking its
// consumers' credit) and has too few clean runs behind it to gate CI.
func TestClusterOwnerPause(t *testing.T) {
	if os.Getenv("SINEW_CHAOS_CLUSTER_PAUSE") == "" {
		t.Skip("not in the default run yet (docs/cluster-runs.md, \"The Jepsen-style run\"); SINEW_CHAOS_CLUSTER_PAUSE=1 runs it")
	}
	runClusterScenario(t, clusterScenario{name: "cluster-owner-pause", every: 12 * time.Second, fault: ownerPause, pauseGoals: true})
}

// rollingRestart stops one node at a time with SIGTERM, in turn: a
// planned stop, which hands the leads the node holds over and drains. The
// probe's publish to partition 0 runs from the signal on and its confirm
// is timed; once the node exited (status 0) it restarts and serves again
// before the next fault. Three faults are one rolling restart of the
// cluster.
func rollingRestart(ctx context.Context, e *clusterEnv) error {
	i := e.faults % len(e.nodes)
	n := e.nodes[i]
	took, err := e.plannedStop(i, "")
	if err != nil {
		return err
	}
	if err := n.Restart(); err != nil {
		return err
	}
	if err := n.WaitReady(startupTimeout); err != nil {
		return fmt.Errorf("node %d after its restart: %w", i+1, err)
	}
	e.logf("stopped node %d with SIGTERM (leads handed over, then a drain; exit 0); a publish to partition 0 was confirmed %v after the signal; restarted it",
		i+1, took.Round(time.Millisecond))
	return nil
}

// plannedStop stops node i with SIGTERM (a planned stop: it hands its
// leads over and drains; it must exit 0) while the probe's publish to
// partition 0 runs from the signal on, and returns the time to its
// confirm. what names the node's release in errors ("" for none).
func (e *clusterEnv) plannedStop(i int, what string) (time.Duration, error) {
	at := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- e.nodes[i].Term(30 * time.Second) }()
	took, perr := e.probeFailover(at)
	if err := <-stopped; err != nil {
		return 0, fmt.Errorf("SIGTERM of node %d%s: %w", i+1, what, err)
	}
	return took, perr
}

// bootstrapRestartThenKill restarts the first node, the one that
// bootstrapped the cluster, with SIGTERM and its first command line (no
// seeds), waits until it serves again, then kills another node with -9:
// the first node must have rejoined through the peers its node table
// records, or the two left would have no quorum. The killed node restarts.
func bootstrapRestartThenKill(ctx context.Context, e *clusterEnv) error {
	first := e.nodes[0]
	if err := first.Term(30 * time.Second); err != nil {
		return fmt.Errorf("SIGTERM of node 1: %w", err)
	}
	if err := first.Restart(); err != nil {
		return err
	}
	if err := first.WaitReady(startupTimeout); err != nil {
		return fmt.Errorf("node 1 after its restart without seeds: %w", err)
	}
	// Its peers see it again: give membership a moment to say so, bounded.
	hold(ctx, 2*time.Second)
	victim := 1 + e.faults%2
	if err := e.nodes[victim].Kill(); err != nil {
		return err
	}
	took, err := e.probeFailover(time.Now())
	if err != nil {
		return fmt.Errorf("after node 1 came back without seeds and node %d was killed: %w", victim+1, err)
	}
	e.logf("restarted node 1 without seeds, then killed -9 node %d; a publish to partition 0 was confirmed again after %v; restarting it",
		victim+1, took.Round(time.Millisecond))
	return e.nodes[victim].Restart()
}

// clusterScenariosMore gates the scenarios not yet in the default run.
func clusterScenariosMore(t *testing.T) {
	if os.Getenv("SINEW_CHAOS_CLUSTER_MORE") == "" {
		t.Skip("not in the default run yet; SINEW_CHAOS_CLUSTER_MORE=1 runs it (scripts/chaos -r ...)")
	}
}

// TestClusterRollingRestart restarts the three nodes in turn with SIGTERM,
// under publish and consume load through the SDK.
func TestClusterRollingRestart(t *testing.T) {
	clusterScenariosMore(t)
	runClusterScenario(t, clusterScenario{name: "cluster-rolling-restart", every: 8 * time.Second, shortPhase: 24 * time.Second, fault: rollingRestart})
}

// TestClusterBootstrapRestartThenKill restarts the bootstrap node without
// seeds, then kills another node with -9, over and over.
func TestClusterBootstrapRestartThenKill(t *testing.T) {
	clusterScenariosMore(t)
	runClusterScenario(t, clusterScenario{name: "cluster-bootstrap-no-seeds", every: 12 * time.Second, fault: bootstrapRestartThenKill, firstWithoutSeeds: true})
}

// TestClusterControllerLeaderKill9 kills the controller's leader.
func TestClusterControllerLeaderKill9(t *testing.T) {
	runClusterScenario(t, clusterScenario{name: "cluster-controller-kill9", every: 3 * time.Second, fault: controllerLeaderKill9})
}

// TestClusterNodeLeavesAndAnotherJoins adds a node and makes the owner of
// a partition leave, under load, over and over: after a few rounds none of
// the first nodes is left.
func TestClusterNodeLeavesAndAnotherJoins(t *testing.T) {
	runClusterScenario(t, clusterScenario{name: "cluster-leave-join", every: 12 * time.Second, fault: nodeJoinAndLeave})
}

// nodeJoinAndLeave starts a new node with a fresh data directory, joining
// through the others, waits until the owner of the probe queue's partition
// 0 sees it alive, and makes that owner leave the cluster (POST
// /api/v1/nodes/self/leave, as `sinew admin node leave`). With a spare node
// alive the leaving node hands its replicas over first (the recovery plan
// moves them to the new node, which catches up and votes) and only then
// drains and exits. The fault times until a publish to the partition is
// confirmed again after the leave, and ends once every partition of both
// queues has three voters, none of them the departed node.
func nodeJoinAndLeave(ctx context.Context, e *clusterEnv) error {
	if e.lab != nil {
		return errors.New("the leave scenario runs on loopback only")
	}
	i, err := e.owner(ctx, e.topic+"-probe", 0)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	gone := e.nodes[i]
	var seeds []string
	for j, n := range e.nodes {
		var v struct {
			Self struct {
				GossipAddr string `json:"gossip_addr"`
			} `json:"self"`
		}
		if j != i && n.Running() && getJSON(n, "/api/v1/nodes", &v) == nil && v.Self.GossipAddr != "" {
			seeds = append(seeds, v.Self.GossipAddr)
		}
	}
	if len(seeds) == 0 {
		return errors.New("no running node to join through")
	}
	gossip, err := harness.FreeAddr()
	if err != nil {
		return err
	}
	peer, err := harness.FreeAddr()
	if err != nil {
		return err
	}
	e.joined++
	b := newClusterNode(e.t, e.bin, filepath.Join(e.base, fmt.Sprintf("joined%d", e.joined)), nodeNet{gossip: gossip, peer: peer},
		func() []string { return seeds })
	if err := b.Start(); err != nil {
		return fmt.Errorf("start a new node: %w\n%s", err, b.StderrTail())
	}
	e.nodes = append(e.nodes, b) // a node of the cluster until the swap below
	deadline := time.Now().Add(30 * time.Second)
	for {
		var v struct {
			Nodes []struct {
				State string `json:"state"`
			} `json:"nodes"`
		}
		alive := 0
		if getJSON(gone, "/api/v1/nodes", &v) == nil {
			for _, n := range v.Nodes {
				if n.State == "alive" {
					alive++
				}
			}
		}
		if alive >= clusterNodes {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %d does not see the new node alive within 30 s (%d peers alive)", i+1, alive)
		}
		time.Sleep(50 * time.Millisecond) // polling real processes
	}
	resp, err := adminClient(gone).Post("http://"+gone.AdminAddr()+"/api/v1/nodes/self/leave", "application/json", nil)
	if err != nil {
		return fmt.Errorf("leave node %d: %w", i+1, err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("leave node %d: %s", i+1, resp.Status)
	}
	at := time.Now()
	if err := gone.WaitExit(90 * time.Second); err != nil {
		return fmt.Errorf("node %d did not exit after leaving: %w", i+1, err)
	}
	exited := time.Since(at)
	if err := gone.ExitErr(); err != nil {
		return fmt.Errorf("node %d exited with %v after leaving\n%s", i+1, err, gone.StderrTail())
	}
	if !strings.Contains(gone.StderrTail(), "replicas handed over") {
		return fmt.Errorf("node %d exited without handing its replicas over\n%s", i+1, gone.StderrTail())
	}
	took, err := e.probeFailover(at)
	if err != nil {
		return err
	}
	e.nodes[i] = b // the departed node is not restarted at the end
	e.nodes = e.nodes[:len(e.nodes)-1]
	rf, err := e.awaitVoters(gone.Addr(), at, e.topic, e.topic+"-probe")
	if err != nil {
		return err
	}
	e.logf("a node joined; node %d (the owner of partition 0) left, handed its replicas over and exited %v after the leave; a publish to partition 0 was confirmed again %v after the leave; three voters on every partition %v after it",
		i+1, exited.Round(time.Millisecond), took.Round(time.Millisecond), rf.Round(time.Millisecond))
	return nil
}

// awaitVoters waits (bounded) until every partition of the topics' queues
// has three voters, none of them gone, and returns the time since at.
func (e *clusterEnv) awaitVoters(gone string, at time.Time, topics ...string) (time.Duration, error) {
	deadline := time.Now().Add(60 * time.Second)
	for _, topic := range topics {
		if err := e.awaitTopicVoters(gone, topic, deadline); err != nil {
			return 0, err
		}
	}
	return time.Since(at), nil
}

func (e *clusterEnv) awaitTopicVoters(gone, topic string, deadline time.Time) error {
	for {
		ok := false
		for _, n := range e.nodes {
			var q struct {
				Partitions []struct {
					Voters []string `json:"voters"`
				} `json:"partitions"`
			}
			if !n.Running() || getJSON(n, "/api/v1/queues/"+topic, &q) != nil || len(q.Partitions) == 0 {
				continue
			}
			ok = true
			for _, p := range q.Partitions {
				ok = ok && len(p.Voters) == clusterNodes && !slices.Contains(p.Voters, gone) && !slices.Contains(p.Voters, "")
			}
			break
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("queue %s's partitions did not get %d voters without %s within 60 s: %s", topic, clusterNodes, gone, queuesJSON(e.nodes[0]))
		}
		time.Sleep(50 * time.Millisecond) // polling real processes
	}
}

// clusterScenario is one cluster nemesis with its timing and network.
type clusterScenario struct {
	name string
	// every is the spacing of faults; the short run has two, in a fault
	// phase of shortPhase (2 × every when 0).
	every, shortPhase time.Duration
	fault             func(context.Context, *clusterEnv) error
	// netns runs the nodes and the clients in network namespaces the test
	// creates (namespaceNet), instead of on loopback.
	netns bool
	// firstWithoutSeeds restarts the first node (the bootstrap node) with
	// its first command line, without seeds.
	firstWithoutSeeds bool
	// pauseGoals fails the run when the longest pause in the probe's
	// confirms around a fault is over 2 s, or their median over 1 s
	// (issue 27's goals); every scenario reports them.
	pauseGoals bool
	// firstBinary, when set, gives the binary the nodes first start with
	// (a previous release); e.bin stays this tree's.
	firstBinary func(*testing.T) string
	// check, when set, judges the fault phase once it ended (that every
	// fault it needs has run).
	check func(*clusterEnv) error
}

func runClusterScenario(t *testing.T, sc clusterScenario) {
	if testing.Short() {
		t.Skip("runs three broker processes")
	}
	name, every, fault := sc.name, sc.every, sc.fault
	res := result{name: name, status: "unfinished"}
	recordAtEnd(t, &res)
	e := &clusterEnv{t: t, topic: "chaos-" + name}
	if sc.netns {
		e.lab = netlab.ForTest(t, namespaceHosts()...)
	}
	bin := binary(t)
	base := scenarioDir(t, name)
	cn := loopbackNet(t)
	if sc.netns {
		cn = namespaceNet(t, e.lab, bin, base)
	}
	first := bin
	if sc.firstBinary != nil {
		first = sc.firstBinary(t)
	}
	nodes := startClusterNodes(t, first, base, cn, sc.firstWithoutSeeds)
	e.nodes, e.bin, e.base = nodes, bin, base
	var seeds []string
	for _, n := range nodes {
		seeds = append(seeds, n.Addr())
	}
	pctx, pcancel := context.WithTimeout(context.Background(), startupTimeout)
	defer pcancel()
	popts := []sinew.Option{sinew.WithSeeds(seeds...),
		sinew.WithReconnect(sinew.ReconnectPolicy{BaseDelay: 25 * time.Millisecond, MaxDelay: time.Second})}
	if cn.dial != nil {
		popts = append(popts, sinew.WithDialer(cn.dial))
	}
	// The probe's own log (its routes, hedges and reconnects), kept with
	// the nodes' logs under SINEW_CHAOS_KEEP.
	probeLog, err := os.Create(filepath.Join(base, "probe.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer probeLog.Close()
	popts = append(popts, sinew.WithLogger(slog.New(slog.NewTextHandler(probeLog, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	probe, err := sinew.Dial(pctx, seeds[0], popts...)
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	e.probe = probe
	// The probe's queue has one partition, replicated like the workload's;
	// the nemesis kills its owner.
	if _, err := probe.DeclareQueue(pctx, e.topic+"-probe", sinew.QueueConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := probe.Publish(pctx, e.topic+"-probe", []byte("probe")); err != nil {
		t.Fatal(err)
	}
	phase := faultPhase()
	if !long() {
		phase = 2 * every // two kills in the short run
		if sc.shortPhase > 0 {
			phase = sc.shortPhase
		}
	}
	ck := checker.New()
	e.ck = ck
	ctx, cancel := context.WithTimeout(context.Background(), startupTimeout)
	defer cancel()
	run, err := workload.Start(ctx, workload.Config{
		Addr: seeds[0], Seeds: seeds, Topic: e.topic, Partitions: workloadPartitions, LeaseMs: clusterLeaseMs(t),
		Producers: 2, Consumers: clusterNodes, MessagesPerProducer: 1 << 40, PublishWindow: 32, Prefetch: 32,
		SDK: true, Dial: cn.dial, Checker: ck, Logf: t.Logf,
	})
	if err != nil {
		t.Fatalf("workload: %v", err)
	}
	e.run = run
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = run.Stop()
		}
	})
	e.watch = e.watchConfirms()
	faultErr := clusterNemesis(e, every, fault, phase)
	if faultErr == nil && sc.check != nil {
		faultErr = sc.check(e)
	}
	gaps, ends, watchErrs, watchErr := e.watch.finish()
	pauses, pauseErr := pauseSummary(gaps, 2*time.Second, time.Second)
	t.Logf("%s: %s; the watch's publishes that failed: %d", name, pauses, watchErrs)
	var endsAt []string
	for _, at := range ends {
		endsAt = append(endsAt, at.UTC().Format("15:04:05.000"))
	}
	t.Logf("%s: each fault's longest pause ended at %v (UTC, the nodes' log clock)", name, endsAt)
	if watchErrs > 0 && faultErr == nil {
		faultErr = fmt.Errorf("%d of the confirm watch's publishes failed (an application error), the last: %w", watchErrs, watchErr)
	}
	if sc.pauseGoals && pauseErr != nil && faultErr == nil {
		faultErr = pauseErr
	}
	for i, n := range e.nodes { // a node that left is no longer there
		if !n.Running() {
			if err := n.Restart(); err != nil && faultErr == nil {
				faultErr = fmt.Errorf("final restart of node %d: %w", i+1, err)
			}
		}
	}
	res, drainErr, stopErr := finishRun(run, ck, name, phase, e.faults)
	stopped = true
	rep := res.rep
	t.Logf("%s: faults=%d failovers=%v %s", name, e.faults, e.failovers, rep)
	t.Logf("%s: workload %s", name, run.Stats())
	tails := func() string {
		var b strings.Builder
		for i, n := range e.nodes {
			fmt.Fprintf(&b, "--- node %d stderr (tail):\n%s\n", i+1, n.StderrTail())
		}
		return b.String()
	}
	if drainErr != nil {
		t.Logf("%s: %v; queues: %s", name, drainErr, queuesJSON(nodes[0]))
	}
	if stopErr != nil {
		t.Fatalf("%s: %v", name, stopErr)
	}
	if err := rep.Err(); err != nil {
		t.Fatalf("%s: %v\n%s", name, err, tails())
	}
	if faultErr != nil {
		t.Fatalf("%s: %v\n%s", name, faultErr, tails())
	}
	if rep.DedupMisses > 0 {
		t.Fatalf("%s: %d messages stored twice (dedup misses)\n%s", name, rep.DedupMisses, tails())
	}
	if rep.Confirmed == 0 {
		t.Fatalf("%s: nothing was confirmed; the scenario tested nothing\n%s", name, tails())
	}
}

// clusterNemesis injects a fault every `every` for phase.
func clusterNemesis(e *clusterEnv, every time.Duration, fault func(context.Context, *clusterEnv) error, phase time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), phase)
	defer cancel()
	next := time.NewTimer(min(every, phase/2))
	defer next.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-next.C:
			next.Reset(every)
		}
		e.faults++
		if e.watch != nil {
			e.watch.open()
		}
		if err := fault(ctx, e); err != nil {
			return fmt.Errorf("fault #%d: %w", e.faults, err)
		}
	}
}
