package e2e_test

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sinewmq/sinew/test/chaos/netlab"
)

// nsNodes asks node i, inside its namespace, for its view (sinew admin
// nodes --json against its admin listener on the namespace's loopback).
func nsNodes(t *testing.T, l *netlab.Lab, bin string, i int, admin string) (nodesView, error) {
	t.Helper()
	cmd := append(l.Exec(i), bin, "admin", "nodes", "--json", "--admin-addr", admin)
	out, err := exec.Command(cmd[0], cmd[1:]...).Output()
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
	l := netlab.ForTest(t, 1, 2, 3)
	bin := buildSinew(t)
	key := filepath.Join(t.TempDir(), "gossip.key")
	if err := os.WriteFile(key, []byte(base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))), 0o600); err != nil {
		t.Fatal(err)
	}
	admins := map[int]string{}
	for i := 1; i <= 3; i++ {
		args := append(l.Exec(i), bin, "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0",
			"--admin-listen", "127.0.0.1:7655", "--cluster", "--cluster-profile", "lan",
			"--cluster-gossip-listen", l.IP(i)+":7946", "--cluster-gossip-key-file", key)
		if i > 1 {
			args = append(args, "--cluster-seeds", l.IP(1)+":7946")
		}
		c := startCommand(t, args[0], args[1:]...)
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

	if err := l.Cut(3); err != nil {
		t.Fatal(err)
	}
	await("fenced, both peers dead", 3, func(v nodesView) bool { return v.Fenced && count(v, "dead") == 2 })
	for i := 1; i <= 2; i++ {
		await("sees the cut node dead and stays unfenced", i, func(v nodesView) bool {
			return count(v, "dead") == 1 && count(v, "alive") == 1 && !v.Fenced
		})
	}

	if err := l.Heal(3); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		await("everyone alive again, nobody fenced", i, func(v nodesView) bool { return count(v, "alive") == 2 && !v.Fenced })
	}
}
