package chaos_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/internal/nodeid"
	"github.com/sinewmq/sinew/internal/tlsconf"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/test/chaos/checker"
	"github.com/sinewmq/sinew/test/chaos/netlab"
)

// The partition scenario runs the cluster in network namespaces the test
// creates (package netlab): node i (1 to 3) in its own namespace at
// 10.77.0.i, wired to a bridge, and the clients' connections (the
// workload's, the probe's) opened from a client namespace at 10.77.0.100
// on the same bridge. The test process itself stays in its namespace, and
// nothing is added to it. Nodes listen for clients, gossip and raft on
// their namespace's address, gossip encrypted with a key and raft over
// mutual TLS (required off loopback), and their admin API on their
// namespace's loopback, which the test reaches from inside that namespace.

// clientHost is the client namespace's host number (10.77.0.100).
const clientHost = 100

// Ports of every node, each on its own namespace's addresses.
const (
	nsClientPort = 7654
	nsAdminAddr  = "127.0.0.1:7655"
	nsGossipPort = 7946
	nsPeerPort   = 7947
)

// Bounds of one partition.
const (
	// cutHold is how long a node stays cut off at least: well past the LAN
	// profile's failure detection (1.5 s after the first failed probe,
	// which comes within 1 s), so that it sees both peers dead and fences
	// itself, and they declare it dead.
	cutHold = 4 * time.Second
	// fenceTimeout bounds the wait, from the cut, for the cut node to
	// fence itself.
	fenceTimeout = 15 * time.Second
	// healTimeout bounds the wait, from the heal, until every node sees the
	// two others alive and none is fenced.
	healTimeout = 30 * time.Second
)

// namespaceHosts are the lab's hosts: the nodes and the clients.
func namespaceHosts() []int {
	hosts := []int{clientHost}
	for i := range clusterNodes {
		hosts = append(hosts, i+1)
	}
	return hosts
}

// namespaceNet places node i in host i+1's namespace, with a gossip key
// and peer TLS certificates written under base, and the clients in the
// client namespace.
func namespaceNet(t *testing.T, lab *netlab.Lab, bin, base string) clusterNet {
	t.Helper()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(base, "gossip.key")
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(key)), 0o600); err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(base, "certs")
	var ips, dataDirs []string
	for i := range clusterNodes {
		ips = append(ips, lab.IP(i+1))
		// startClusterNodes' data directory of node i.
		dataDirs = append(dataDirs, filepath.Join(base, fmt.Sprintf("n%d", i+1), "data"))
	}
	// A peer certificate per node, naming its node id (created here in
	// its data directory), from a peer CA of their own (docs/cluster.md).
	if out, err := exec.Command(bin, "cert", "generate", "--dir", certs, "--hosts", strings.Join(ips, ","),
		"--peer-data-dirs", strings.Join(dataDirs, ",")).CombinedOutput(); err != nil {
		t.Fatalf("sinew cert generate: %v\n%s", err, out)
	}
	cn := clusterNet{dial: lab.Dialer(clientHost)}
	for i := range clusterNodes {
		h := i + 1
		id, err := nodeid.Load(vfs.OS(), dataDirs[i], nil)
		if err != nil {
			t.Fatal(err)
		}
		cn.nodes = append(cn.nodes, nodeNet{
			addr:   fmt.Sprintf("%s:%d", lab.IP(h), nsClientPort),
			admin:  nsAdminAddr,
			gossip: fmt.Sprintf("%s:%d", lab.IP(h), nsGossipPort),
			peer:   fmt.Sprintf("%s:%d", lab.IP(h), nsPeerPort),
			args: []string{"--cluster-gossip-key-file", keyFile,
				"--cluster-peer-tls-cert-file", filepath.Join(certs, tlsconf.PeerCertFile(id)),
				"--cluster-peer-tls-key-file", filepath.Join(certs, tlsconf.PeerKeyFile(id)),
				"--cluster-peer-tls-ca-file", filepath.Join(certs, tlsconf.PeerCAFile),
				// The client listener is off loopback and the test uses
				// no credentials.
				"--auth-allow-anonymous"},
			wrap: lab.Exec(h),
			dial: lab.Dialer(h),
		})
	}
	return cn
}

// TestClusterMinorityPartition cuts the owner of one of the workload
// queue's partitions off the network (its namespace's cable out of the
// switch) under publish and consume load, holds it there until it has
// fenced itself and the two others have elected a new owner, then heals
// the link and waits until every node sees the others alive, before the
// next fault. The faults alternate between the queue's two partitions.
func TestClusterMinorityPartition(t *testing.T) {
	const every = 10 * time.Second
	// Faults at 10 and 20 s; the phase ends at 25 s.
	runClusterScenario(t, clusterScenario{name: "cluster-minority-partition", every: every,
		shortPhase: 2*every + every/2, fault: minorityPartition, netns: true})
}

// TestClusterOwnerPeerLinksCut cuts the owner of the probe queue's
// partition off its two peers for peerCutHold while the clients still
// reach it (blackhole routes to the peers' addresses inside its
// namespace): it answers its clients unavailable, then fenced, and the
// clients (the confirm watch's, the workload's on whatever partitions the
// node owned too) must find the owner the two others elect without an
// error reaching the application.
func TestClusterOwnerPeerLinksCut(t *testing.T) {
	clusterScenariosMore(t)
	const every = 20 * time.Second
	runClusterScenario(t, clusterScenario{name: "cluster-owner-peer-cut", every: every,
		shortPhase: 2*every + every/2, fault: ownerPeerCut, netns: true, pauseGoals: true})
}

// peerCutHold is how long ownerPeerCut keeps an owner's peer links cut.
const peerCutHold = 10 * time.Second

// ownerPeerCut cuts the owner of the probe queue's partition 0 off its
// peers (not its clients) for peerCutHold, times until a publish to it is
// confirmed again, heals the links and waits until all three see each
// other alive and none is fenced. The links are healed whatever happens.
func ownerPeerCut(ctx context.Context, e *clusterEnv) error {
	i, err := e.owner(ctx, e.topic+"-probe", 0)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	host := i + 1
	var peers []int
	for j := range e.nodes {
		if j != i {
			peers = append(peers, j+1)
		}
	}
	if err := e.lab.CutFrom(host, peers...); err != nil {
		return errors.Join(err, e.lab.HealFrom(host, peers...))
	}
	cut := time.Now()
	took, probeErr := e.probeFailover(cut)
	time.Sleep(time.Until(cut.Add(peerCutHold)))
	if err := e.lab.HealFrom(host, peers...); err != nil {
		return errors.Join(probeErr, err)
	}
	healed := time.Now()
	viewErr := e.awaitAllAlive(healed)
	e.logf("cut node %d (the owner of partition 0) off its peers, its clients still reaching it: a publish to partition 0 was confirmed again after %v; healed after %v, all three saw each other alive %v later",
		host, took.Round(time.Millisecond), healed.Sub(cut).Round(time.Millisecond), time.Since(healed).Round(time.Millisecond))
	return errors.Join(probeErr, viewErr)
}

// nodesView is what the partition scenario reads of GET /api/v1/nodes.
type nodesView struct {
	Fenced bool `json:"fenced"`
	Nodes  []struct {
		State string `json:"state"`
	} `json:"nodes"`
}

func (v nodesView) count(state string) int {
	n := 0
	for _, p := range v.Nodes {
		if p.State == state {
			n++
		}
	}
	return n
}

// awaitView polls node i's view (from inside its namespace, so also while
// it is cut off) until cond holds, at most until the deadline.
func (e *clusterEnv) awaitView(i int, deadline time.Time, cond func(nodesView) bool) (nodesView, error) {
	for {
		var v nodesView
		err := getJSON(e.nodes[i], "/api/v1/nodes", &v)
		if err == nil && cond(v) {
			return v, nil
		}
		if time.Now().After(deadline) {
			return v, fmt.Errorf("node %d's view %+v (err %v)", i+1, v, err)
		}
		time.Sleep(100 * time.Millisecond) // polling real processes
	}
}

// minorityPartition cuts the owner of one of the workload queue's
// partitions off, times until the probe's publish to that partition is
// confirmed again (by the new owner the two others elect), waits until the
// cut node fences itself and at least cutHold has passed, heals the link
// and waits until all three see each other alive again. The link is healed
// whatever happens.
func minorityPartition(ctx context.Context, e *clusterEnv) error {
	p := (e.faults - 1) % workloadPartitions
	i, err := e.owner(ctx, e.topic, p)
	if err != nil {
		if ctx.Err() != nil {
			return nil // the phase ended while an election was under way
		}
		return err
	}
	host := i + 1
	// A publish to the partition first, so that the probe, like a producer
	// that was publishing, sends the next one to its owner.
	wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	err = e.probeWorkload(wctx, p)
	cancel()
	if err != nil {
		return fmt.Errorf("probe publish before the cut: %w", err)
	}
	if err := e.lab.Cut(host); err != nil {
		return err
	}
	cut := time.Now()
	// The cut node's view is watched while the probe publishes.
	var fenced time.Duration
	fenceDone := make(chan error, 1)
	go func() {
		_, err := e.awaitView(i, cut.Add(fenceTimeout), func(v nodesView) bool { return v.Fenced })
		fenced = time.Since(cut)
		fenceDone <- err
	}()
	took, probeErr := e.timeFailover(cut, func(ctx context.Context) error { return e.probeWorkload(ctx, p) })
	fenceErr := <-fenceDone
	if fenceErr != nil {
		fenceErr = fmt.Errorf("node %d, cut off, did not fence itself within %v: %w", host, fenceTimeout, fenceErr)
	}
	time.Sleep(time.Until(cut.Add(cutHold)))
	if err := e.lab.Heal(host); err != nil {
		return errors.Join(probeErr, fenceErr, err)
	}
	healed := time.Now()
	viewErr := e.awaitAllAlive(healed)
	e.logf("cut node %d (the owner of partition %d) off: a publish to partition %d was confirmed again after %v, the node fenced itself after %v; healed after %v, all three saw each other alive %v later",
		host, p, p, took.Round(time.Millisecond), fenced.Round(time.Millisecond), healed.Sub(cut).Round(time.Millisecond),
		time.Since(healed).Round(time.Millisecond))
	return errors.Join(probeErr, fenceErr, viewErr)
}

// awaitAllAlive waits, from a heal at healed, until every node sees the
// others alive and is not fenced, at most healTimeout.
func (e *clusterEnv) awaitAllAlive(healed time.Time) error {
	var errs []error
	for j := range e.nodes {
		_, err := e.awaitView(j, healed.Add(healTimeout), func(v nodesView) bool {
			return v.count("alive") == clusterNodes-1 && !v.Fenced
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("after the heal, not every node alive and unfenced within %v: %w", healTimeout, err))
		}
	}
	return errors.Join(errs...)
}

// probeWorkload publishes one message into the workload's queue at
// partition p, as the producer "probe" with its own sequence (so a resend
// is stored once), and records it with the checker like any workload
// message: once confirmed it must be delivered.
func (e *clusterEnv) probeWorkload(ctx context.Context, p int) error {
	e.probeSeq++
	id := checker.ID{Producer: "probe", Seq: e.probeSeq}
	body, err := checker.AppendBody(nil, id, 64)
	if err != nil {
		return err
	}
	e.ck.Attempted(id)
	if _, err := e.probe.Publish(ctx, e.topic, body, sinew.WithPartition(p),
		sinew.WithProducerSequence(id.Producer, id.Seq)); err != nil {
		return err
	}
	e.ck.Confirmed(id)
	return nil
}
