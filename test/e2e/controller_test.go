package e2e_test

import (
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/nodeid"
	"github.com/sinewmq/sinew/internal/tlsconf"
	"github.com/sinewmq/sinew/internal/vfs"
)

// controllerAgrees reports whether v's controller has a leader, exactly
// the voters and learners named (node ids), and a table of the members
// named, with left marking the ones that left.
func controllerAgrees(v nodesView, voters, learners, members, left []string) bool {
	c := v.Controller
	if c == nil || c.Error != "" || c.Leader == "" {
		return false
	}
	sorted := func(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }
	if !slices.Equal(sorted(c.Voters), sorted(voters)) || !slices.Equal(sorted(c.Learners), sorted(learners)) {
		return false
	}
	var ids, gone []string
	for _, n := range c.Nodes {
		ids = append(ids, n.ID)
		if n.Left {
			gone = append(gone, n.ID)
		}
	}
	return slices.Equal(sorted(ids), sorted(members)) && slices.Equal(sorted(gone), sorted(left))
}

// startThree starts three cluster nodes on loopback, the first without
// seeds (it bootstraps the controller group) and the others joining
// through it, and returns them with their node ids.
func startThree(t *testing.T, bin string) ([]*clusterChild, map[*clusterChild]string) {
	t.Helper()
	n1 := startClusterChild(t, bin, t.TempDir())
	nodes := []*clusterChild{n1, startClusterChild(t, bin, t.TempDir(), n1.gossip), startClusterChild(t, bin, t.TempDir(), n1.gossip)}
	id := map[*clusterChild]string{}
	for _, c := range nodes {
		id[c] = nodesOf(t, c.admin).Self.ID
	}
	return nodes, id
}

// Three `sinew serve --cluster` processes form the controller group: the
// node started without seeds bootstraps it and the others are added as
// voters; every node shows the same committed node table. The leader's
// process is killed with -9: the other two elect a new leader. It restarts
// on new ports and is a voter again, its new peer address committed. A
// fourth node joins as a learner; a voter that leaves is marked left and
// removed, and the learner is promoted. The node that left runs again and
// is admitted again, as a learner.
func TestClusterControllerGroup(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	nodes, id := startThree(t, bin)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	three := []string{id[n1], id[n2], id[n3]}
	var leader string
	for _, c := range nodes {
		v := awaitNodes(t, c, "three voters and the same table everywhere", func(v nodesView) bool {
			return controllerAgrees(v, three, nil, three, nil)
		})
		if leader == "" {
			leader = v.Controller.Leader
		}
		if v.Controller.Leader != leader {
			awaitNodes(t, c, "one leader", func(v nodesView) bool { return v.Controller.Leader == leader })
		}
	}

	out, err := exec.Command(bin, "admin", "nodes", "--admin-addr", n2.admin).CombinedOutput()
	if err != nil {
		t.Fatalf("sinew admin nodes: %v\n%s", err, out)
	}
	roles := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n")[1:] {
		f := strings.Fields(line)
		roles[f[len(f)-1]]++
	}
	if !strings.Contains(string(out), "CONTROLLER") || roles["leader"] != 1 || roles["voter"] != 2 {
		t.Fatalf("sinew admin nodes: want one leader and two voters in the CONTROLLER column:\n%s", out)
	}

	leaders := 0
	for _, c := range nodes {
		m := scrape(t, c.admin)
		for _, want := range []string{`sinew_controller_members{role="voter"} 3`, `sinew_controller_members{role="learner"} 0`, "sinew_controller_has_leader 1"} {
			if !strings.Contains(m, want+"\n") {
				t.Errorf("/metrics lacks %q", want)
			}
		}
		if strings.Contains(m, "sinew_controller_leader 1\n") {
			leaders++
		}
	}
	if leaders != 1 {
		t.Errorf("%d nodes report sinew_controller_leader 1, want 1", leaders)
	}

	var dead *clusterChild
	var live []*clusterChild
	for _, c := range nodes {
		if id[c] == leader {
			dead = c
		} else {
			live = append(live, c)
		}
	}
	dead.cmd.Process.Kill()
	dead.cmd.Wait()
	var next string
	for _, c := range live {
		v := awaitNodes(t, c, "a new controller leader after a kill -9 of the old one", func(v nodesView) bool {
			l := v.Controller.Leader
			return l != "" && l != leader && (next == "" || l == next)
		})
		next = v.Controller.Leader
	}

	back := startClusterChild(t, bin, dead.dir, n1.gossip, n2.gossip)
	backPeer := logField(t, back.child, "cluster controller started", "peer_addr")
	for _, c := range append(live, back) {
		awaitNodes(t, c, "the restarted node votes again, at its new peer address", func(v nodesView) bool {
			if !controllerAgrees(v, three, nil, three, nil) {
				return false
			}
			for _, n := range v.Controller.Nodes {
				if n.ID == id[dead] {
					return n.PeerAddr == backPeer
				}
			}
			return false
		})
	}

	n4 := startClusterChild(t, bin, t.TempDir(), live[0].gossip)
	id4 := nodesOf(t, n4.admin).Self.ID
	four := append(slices.Clone(three), id4)
	awaitNodes(t, n4, "a fourth node is a learner", func(v nodesView) bool {
		return controllerAgrees(v, three, []string{id4}, four, nil)
	})

	gone := live[1]
	if out, err := exec.Command(bin, "admin", "node", "leave", "--admin-addr", gone.admin).CombinedOutput(); err != nil {
		t.Fatalf("sinew admin node leave: %v\n%s", err, out)
	}
	if status := waitChild(t, gone.child); status != 0 {
		t.Fatalf("the node that left exited %d:\n%s", status, gone.log())
	}
	var voters []string
	for _, s := range four {
		if s != id[gone] {
			voters = append(voters, s)
		}
	}
	for _, c := range []*clusterChild{live[0], back, n4} {
		awaitNodes(t, c, "the node that left is removed and the learner promoted", func(v nodesView) bool {
			return controllerAgrees(v, voters, nil, four, []string{id[gone]})
		})
	}

	// The node that left runs again from its data directory (a new run
	// of its process): it is admitted again, as a learner.
	again := startClusterChild(t, bin, gone.dir, live[0].gossip)
	for _, c := range []*clusterChild{live[0], back, n4, again} {
		awaitNodes(t, c, "the node that left, run again, is a learner", func(v nodesView) bool {
			return controllerAgrees(v, voters, []string{id[gone]}, four, nil)
		})
	}
}

// writePeerTLS writes a peer certificate and key issued by is for the
// node of data directory dataDir (its node id created there now, as the
// node's first start would), and is's certificate, into dir, and returns
// the serve flags naming them.
func writePeerTLS(t *testing.T, is *tlsconf.Issuer, dir, dataDir string) []string {
	t.Helper()
	id, err := nodeid.Load(vfs.OS(), dataDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	certPEM, keyPEM, err := is.Issue(tlsconf.Leaf{CommonName: "sinew peer", URIs: []*url.URL{tlsconf.PeerURI("sinew", id)}, Server: true, Client: true,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"peer.crt": certPEM, "peer.key": keyPEM, "ca.crt": is.CertPEM}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return []string{"--cluster-peer-tls-cert-file", filepath.Join(dir, "peer.crt"),
		"--cluster-peer-tls-key-file", filepath.Join(dir, "peer.key"), "--cluster-peer-tls-ca-file", filepath.Join(dir, "ca.crt")}
}

// The controller group forms over mutual TLS on the raft transport, and
// serve refuses to start with a peer TLS file missing, half the set, or
// a certificate naming another node.
func TestClusterControllerOverPeerTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	now := time.Now()
	ca, err := tlsconf.NewIssuer("cluster CA", now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	start := func(seeds ...string) *clusterChild {
		dir := t.TempDir()
		args := []string{"--cluster", "--cluster-profile", "lan", "--cluster-gossip-listen", "127.0.0.1:0",
			"--cluster-peer-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}
		args = append(args, writePeerTLS(t, ca, t.TempDir(), dir)...)
		if len(seeds) > 0 {
			args = append(args, "--cluster-seeds", strings.Join(seeds, ","))
		}
		c := startChildArgs(t, bin, dir, args...)
		if tlsOn := logField(t, c, "cluster controller started", "peer_tls"); tlsOn != "true" {
			t.Fatalf("peer_tls=%s in the log", tlsOn)
		}
		return &clusterChild{child: c, dir: dir,
			admin:  logField(t, c, "msg=serving", "admin_listen"),
			gossip: logField(t, c, "cluster membership started", "gossip_addr")}
	}
	n1 := start()
	n2 := start(n1.gossip)
	n3 := start(n1.gossip)
	var three []string
	for _, c := range []*clusterChild{n1, n2, n3} {
		three = append(three, nodesOf(t, c.admin).Self.ID)
	}
	for _, c := range []*clusterChild{n1, n2, n3} {
		awaitNodes(t, c, "three voters over peer TLS", func(v nodesView) bool {
			return controllerAgrees(v, three, nil, three, nil)
		})
	}

	files := writePeerTLS(t, ca, t.TempDir(), t.TempDir())
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a missing key file", []string{files[0], files[1], files[2], filepath.Join(t.TempDir(), "nope.key"), files[4], files[5]}, "cluster.peer_tls_key_file"},
		{"half the set", files[:2], "go together"},
		{"another node's certificate", files, "is not this node's peer certificate"},
		{"a peer address off loopback without TLS", []string{"--cluster-peer-listen", "10.255.255.1:0"}, "cluster.peer_tls_cert_file"},
		{"an unspecified peer address", []string{"--cluster-peer-listen", "0.0.0.0:0"}, "not an unspecified one"},
	} {
		args := append([]string{"serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--admin-listen", "",
			"--cluster", "--cluster-gossip-listen", "127.0.0.1:0", "--cluster-peer-listen", "127.0.0.1:0"}, tc.args...)
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) || strings.Contains(string(out), "panic") {
			t.Errorf("%s: err %v, output %s; want a refusal naming %s", tc.name, err, out, tc.want)
		}
	}
}

// A controller voter's process is killed with -9 in a four-node cluster:
// once membership declares it dead, it is demoted to learner and the
// learner promoted, so the group has three live voters again; restarted,
// the node stays a learner.
func TestClusterControllerReplacesADeadVoter(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	nodes, id := startThree(t, bin)
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	three := []string{id[n1], id[n2], id[n3]}
	awaitNodes(t, n1, "three voters", func(v nodesView) bool { return controllerAgrees(v, three, nil, three, nil) })
	n4 := startClusterChild(t, bin, t.TempDir(), n1.gossip)
	id[n4] = nodesOf(t, n4.admin).Self.ID
	four := append(slices.Clone(three), id[n4])
	v := awaitNodes(t, n4, "a fourth node is a learner", func(v nodesView) bool {
		return controllerAgrees(v, three, []string{id[n4]}, four, nil)
	})
	// Kill a voter that does not lead, so the timing below is the
	// replacement's alone.
	var victim *clusterChild
	var live []*clusterChild
	for _, c := range []*clusterChild{n1, n2, n3} {
		if victim == nil && id[c] != v.Controller.Leader {
			victim = c
		} else {
			live = append(live, c)
		}
	}
	victim.cmd.Process.Kill()
	victim.cmd.Wait()
	killed := time.Now()
	voters := []string{id[live[0]], id[live[1]], id[n4]}
	for _, c := range append(live, n4) {
		awaitNodes(t, c, "the dead voter demoted and the learner promoted", func(v nodesView) bool {
			return controllerAgrees(v, voters, []string{id[victim]}, four, nil)
		})
	}
	t.Logf("kill -9 of a controller voter to three live voters again: %v (LAN profile)", time.Since(killed).Round(time.Millisecond))
	back := startClusterChild(t, bin, victim.dir, n1.gossip, n4.gossip)
	awaitNodes(t, back, "the restarted node is a learner", func(v nodesView) bool {
		return controllerAgrees(v, voters, []string{id[victim]}, four, nil)
	})
}
