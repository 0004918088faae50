package e2e_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// netLab is a set of network namespaces this test creates: one switch
// namespace holding a bridge, and one namespace per node wired to it by a
// veth pair, with addresses 10.77.0.1, 10.77.0.2, ... It touches no other
// namespace, and Cleanup deletes them all.
type netLab struct {
	t      *testing.T
	prefix string
	nodes  int
}

// ipCmd runs ip with args, failing the test on an error.
func (l *netLab) ip(args ...string) {
	l.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (l *netLab) sw() string          { return l.prefix + "sw" }
func (l *netLab) node(i int) string   { return fmt.Sprintf("%sn%d", l.prefix, i) }
func (l *netLab) addr(i int) string   { return fmt.Sprintf("10.77.0.%d", i) }
func (l *netLab) swPort(i int) string { return fmt.Sprintf("p%d", i) }

// newNetLab creates the namespaces, or skips the test with the reason when
// this machine cannot (not root, no ip command, no namespace support).
func newNetLab(t *testing.T, nodes int) *netLab {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespace test skipped: it needs root to create namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("network namespace test skipped: no ip command (install iproute2)")
	}
	l := &netLab{t: t, prefix: fmt.Sprintf("sinew%d", os.Getpid()%100000), nodes: nodes}
	if out, err := exec.Command("ip", "netns", "add", l.sw()).CombinedOutput(); err != nil {
		t.Skipf("network namespace test skipped: cannot create a network namespace: %v %s", err, out)
	}
	t.Cleanup(func() {
		for i := 1; i <= nodes; i++ {
			exec.Command("ip", "netns", "del", l.node(i)).Run()
		}
		exec.Command("ip", "netns", "del", l.sw()).Run()
	})
	l.ip("-n", l.sw(), "link", "add", "br0", "type", "bridge")
	l.ip("-n", l.sw(), "link", "set", "br0", "up")
	for i := 1; i <= nodes; i++ {
		l.ip("netns", "add", l.node(i))
		l.ip("-n", l.node(i), "link", "add", "eth0", "type", "veth", "peer", "name", l.swPort(i), "netns", l.sw())
		l.ip("-n", l.node(i), "addr", "add", l.addr(i)+"/24", "dev", "eth0")
		l.ip("-n", l.node(i), "link", "set", "eth0", "up")
		l.ip("-n", l.node(i), "link", "set", "lo", "up")
		l.ip("-n", l.sw(), "link", "set", l.swPort(i), "master", "br0")
		l.ip("-n", l.sw(), "link", "set", l.swPort(i), "up")
	}
	return l
}

// cut takes node i's cable out of the switch; heal puts it back.
func (l *netLab) cut(i int)  { l.ip("-n", l.sw(), "link", "set", l.swPort(i), "down") }
func (l *netLab) heal(i int) { l.ip("-n", l.sw(), "link", "set", l.swPort(i), "up") }

// nsNodes asks node i, inside its namespace, for its view (sinew admin
// nodes --json against its admin listener on the namespace's loopback).
func nsNodes(t *testing.T, l *netLab, bin string, i int, admin string) (nodesView, error) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", l.node(i), bin, "admin", "nodes", "--json", "--admin-addr", admin).Output()
	if err != nil {
		return nodesView{}, err
	}
	var v nodesView
	return v, json.Unmarshal(out, &v)
}

// Three `sinew serve --cluster` nodes, each in its own network namespace
// and speaking over a real (virtual) network with an encrypted gossip key.
// One node's link is cut: it sees a majority of its peers dead and fences
// itself, while the other two see it dead and stay unfenced. The link comes
// back: every node sees the others alive and nobody is fenced.
func TestClusterNetworkPartitionInNamespaces(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	l := newNetLab(t, 3)
	bin := buildSinew(t)
	key := filepath.Join(t.TempDir(), "gossip.key")
	if err := os.WriteFile(key, []byte(base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))), 0o600); err != nil {
		t.Fatal(err)
	}
	admins := map[int]string{}
	for i := 1; i <= 3; i++ {
		args := []string{"netns", "exec", l.node(i), bin, "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0",
			"--admin-listen", "127.0.0.1:7655", "--cluster", "--cluster-profile", "lan",
			"--cluster-gossip-listen", l.addr(i) + ":7946", "--cluster-gossip-key-file", key}
		if i > 1 {
			args = append(args, "--cluster-seeds", l.addr(1)+":7946")
		}
		c := startCommand(t, "ip", args...)
		admins[i] = logField(t, c, "msg=serving", "admin_listen")
	}
	await := func(what string, i int, cond func(nodesView) bool) {
		t.Helper()
		deadline := time.Now().Add(safetyTimeout)
		for {
			v, err := nsNodes(t, l, bin, i, admins[i])
			if err == nil && cond(v) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("node %d: %s: not within %v; view %+v (err %v)", i, what, safetyTimeout, v, err)
			}
			time.Sleep(100 * time.Millisecond) // polling real processes
		}
	}
	count := func(v nodesView, state string) int {
		n := 0
		for _, p := range v.Nodes {
			if p.State == state {
				n++
			}
		}
		return n
	}
	for i := 1; i <= 3; i++ {
		await("sees the two others alive", i, func(v nodesView) bool { return count(v, "alive") == 2 && !v.Fenced })
	}

	l.cut(3)
	await("fenced, both peers dead", 3, func(v nodesView) bool { return v.Fenced && count(v, "dead") == 2 })
	for i := 1; i <= 2; i++ {
		await("sees the cut node dead and stays unfenced", i, func(v nodesView) bool {
			return count(v, "dead") == 1 && count(v, "alive") == 1 && !v.Fenced
		})
	}

	l.heal(3)
	for i := 1; i <= 3; i++ {
		await("everyone alive again, nobody fenced", i, func(v nodesView) bool { return count(v, "alive") == 2 && !v.Fenced })
	}
}
