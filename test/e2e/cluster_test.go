package e2e_test

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// clusterChild is a `sinew serve --cluster` process with its admin and
// gossip addresses.
type clusterChild struct {
	*child
	dir, admin, gossip string
}

// logField returns the value of key= in the first log line of c holding
// msg, waiting for it (bounded).
func logField(t testing.TB, c *child, msg, key string) string {
	t.Helper()
	deadline := time.Now().Add(safetyTimeout)
	for time.Now().Before(deadline) {
		for line := range strings.Lines(c.log()) {
			if !strings.Contains(line, msg) {
				continue
			}
			for f := range strings.FieldsSeq(line) {
				if v, ok := strings.CutPrefix(f, key+"="); ok {
					return v
				}
			}
		}
		time.Sleep(10 * time.Millisecond) // polling a real process's log
	}
	t.Fatalf("no %q with %s= in the log:\n%s", msg, key, c.log())
	return ""
}

func startClusterChild(t testing.TB, bin, dir string, seeds ...string) *clusterChild {
	t.Helper()
	return startClusterChildArgs(t, bin, dir, nil, seeds...)
}

// startClusterChildArgs is startClusterChild with extra serve flags.
func startClusterChildArgs(t testing.TB, bin, dir string, extra []string, seeds ...string) *clusterChild {
	t.Helper()
	args := []string{"--cluster", "--cluster-profile", "lan", "--cluster-gossip-listen", "127.0.0.1:0",
		"--cluster-peer-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}
	args = append(args, extra...)
	if len(seeds) > 0 {
		args = append(args, "--cluster-seeds", strings.Join(seeds, ","))
	}
	c := startChildArgs(t, bin, dir, args...)
	return &clusterChild{child: c, dir: dir,
		admin:  logField(t, c, "msg=serving", "admin_listen"),
		gossip: logField(t, c, "cluster membership started", "gossip_addr")}
}

type nodesView struct {
	Cluster    bool            `json:"cluster"`
	Self       nodeView        `json:"self"`
	Fenced     bool            `json:"fenced"`
	Nodes      []nodeView      `json:"nodes"`
	Controller *controllerView `json:"controller"`
}

type controllerView struct {
	Leader   string   `json:"leader"`
	Term     uint64   `json:"term"`
	Voters   []string `json:"voters"`
	Learners []string `json:"learners"`
	Nodes    []struct {
		ID       string `json:"id"`
		PeerAddr string `json:"peer_addr"`
		Left     bool   `json:"left"`
	} `json:"nodes"`
	Error string `json:"error"`
}

type nodeView struct {
	ID         string `json:"id"`
	State      string `json:"state"`
	GossipAddr string `json:"gossip_addr"`
}

func nodesOf(t testing.TB, admin string) nodesView {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/api/v1/nodes")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v nodesView
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /api/v1/nodes: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func (v nodesView) state(id string) string {
	for _, n := range v.Nodes {
		if n.ID == id {
			return n.State
		}
	}
	return ""
}

// awaitNodes polls c's view until cond holds (bounded: far above the LAN
// profile's detection time, so that a loaded machine does not fail it).
func awaitNodes(t testing.TB, c *clusterChild, what string, cond func(nodesView) bool) nodesView {
	t.Helper()
	return awaitNodesFor(t, c, what, safetyTimeout, cond)
}

// awaitNodesFor is awaitNodes with its own bound.
func awaitNodesFor(t testing.TB, c *clusterChild, what string, bound time.Duration, cond func(nodesView) bool) nodesView {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		v := nodesOf(t, c.admin)
		if cond(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; view %+v", what, bound, v)
		}
		time.Sleep(50 * time.Millisecond) // polling real processes
	}
}

// Three `sinew serve --cluster` processes on loopback find each other
// through one seed. `sinew admin node leave` makes one leave (the others
// see it left, it drains and exits 0); a kill -9 is seen dead and fences
// the last node, which sees a majority of its peers dead; the killed node
// restarts with the same node id and is alive again.
func TestClusterNodesFindEachOtherLeaveAndDie(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	n1 := startClusterChild(t, bin, t.TempDir())
	n2 := startClusterChild(t, bin, t.TempDir(), n1.gossip)
	n3 := startClusterChild(t, bin, t.TempDir(), n1.gossip)
	ids := map[*clusterChild]string{}
	for _, c := range []*clusterChild{n1, n2, n3} {
		v := awaitNodes(t, c, "every node sees the two others alive", func(v nodesView) bool {
			alive := 0
			for _, n := range v.Nodes {
				if n.State == "alive" {
					alive++
				}
			}
			return v.Cluster && alive == 2
		})
		if len(v.Self.ID) != 32 || v.Self.State != "self" || v.Self.GossipAddr != c.gossip {
			t.Fatalf("self %+v, want a 32-digit id at %s", v.Self, c.gossip)
		}
		ids[c] = v.Self.ID
	}

	out, err := exec.Command(bin, "admin", "node", "leave", "--admin-addr", n3.admin).CombinedOutput()
	if err != nil {
		t.Fatalf("sinew admin node leave: %v\n%s", err, out)
	}
	if status := waitChild(t, n3.child); status != 0 {
		t.Fatalf("the node that left exited %d:\n%s", status, n3.log())
	}
	for _, c := range []*clusterChild{n1, n2} {
		awaitNodes(t, c, "the node that left is seen left", func(v nodesView) bool { return v.state(ids[n3]) == "left" })
	}

	n2.cmd.Process.Kill()
	n2.cmd.Wait()
	v := awaitNodes(t, n1, "the killed node is seen dead", func(v nodesView) bool { return v.state(ids[n2]) == "dead" })
	if v.state(ids[n3]) != "left" {
		t.Fatalf("the node that left is %q after another died", v.state(ids[n3]))
	}
	awaitNodes(t, n1, "the last node, its only live peer dead, is fenced", func(v nodesView) bool { return v.Fenced })
	metrics := scrape(t, n1.admin)
	for _, want := range []string{`sinew_cluster_nodes{state="dead"} 1`, `sinew_cluster_nodes{state="left"} 1`,
		`sinew_cluster_nodes{state="alive"} 0`, "sinew_cluster_fenced 1"} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	// A fenced node takes no writes: it says so at once, so a client goes
	// elsewhere instead of waiting on a quorum that is not there.
	if eb, ok := rawPublish(t, n1.addr, "while-fenced").(*protocol.ErrorBody); !ok || eb.Code != protocol.CodeFenced || !strings.Contains(eb.Message, "fenced") {
		t.Fatalf("publish on a fenced node: %+v, want fenced", eb)
	}

	n2b := startClusterChild(t, bin, n2.dir, n1.gossip)
	if id := nodesOf(t, n2b.admin).Self.ID; id != ids[n2] {
		t.Fatalf("the restarted node has id %s, was %s", id, ids[n2])
	}
	awaitNodes(t, n1, "the restarted node is alive and the fence lifted", func(v nodesView) bool {
		return v.state(ids[n2]) == "alive" && !v.Fenced
	})
}

// A node that runs alone (the default) reports no cluster, and refuses a
// leave with 409.
func TestNodesOfASingleNode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	c := startChildArgs(t, bin, t.TempDir(), "--admin-listen", "127.0.0.1:0")
	admin := logField(t, c, "msg=serving", "admin_listen")
	if v := nodesOf(t, admin); v.Cluster || len(v.Nodes) != 0 {
		t.Fatalf("a single node's view %+v", v)
	}
	resp, err := http.Post("http://"+admin+"/api/v1/nodes/self/leave", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("leave on a single node: %s, want 409", resp.Status)
	}
	out, err := exec.Command(bin, "admin", "node", "leave", "--admin-addr", admin).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not in a cluster") {
		t.Fatalf("sinew admin node leave on a single node: %v\n%s", err, out)
	}
}

// scrape returns the admin listener's /metrics text.
func scrape(t *testing.T, admin string) string {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// BenchmarkClusterDeathDetection measures, on real `sinew serve --cluster`
// processes on loopback, the time from a kill -9 of one of three nodes to
// a surviving node's view showing it dead (polled every 50 ms through the
// admin API), with the profile of SINEW_BENCH_PROFILE (lan by default, or
// seed). It reports detect_ms per kill; each iteration restarts the node.
//
//	go test ./test/e2e -run '^$' -bench BenchmarkClusterDeathDetection -benchtime 5x
func BenchmarkClusterDeathDetection(b *testing.B) {
	profile := cmp.Or(os.Getenv("SINEW_BENCH_PROFILE"), "lan")
	bin := buildSinew(b)
	start := func(dir string, seeds ...string) *clusterChild {
		args := []string{"--cluster", "--cluster-profile", profile, "--cluster-gossip-listen", "127.0.0.1:0", "--cluster-peer-listen", "127.0.0.1:0",
			"--admin-listen", "127.0.0.1:0"}
		if len(seeds) > 0 {
			args = append(args, "--cluster-seeds", strings.Join(seeds, ","))
		}
		c := startChildArgs(b, bin, dir, args...)
		return &clusterChild{child: c, dir: dir, admin: logField(b, c, "msg=serving", "admin_listen"),
			gossip: logField(b, c, "cluster membership started", "gossip_addr")}
	}
	n1 := start(b.TempDir())
	n2 := start(b.TempDir(), n1.gossip)
	victimDir := b.TempDir()
	var total time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		v := start(victimDir, n1.gossip)
		id := nodesOf(b, v.admin).Self.ID
		for _, c := range []*clusterChild{n1, n2} {
			awaitNodes(b, c, "the victim alive", func(nv nodesView) bool { return nv.state(id) == "alive" })
		}
		b.StartTimer()
		killed := time.Now()
		v.cmd.Process.Kill()
		v.cmd.Wait()
		awaitNodesFor(b, n1, "the victim dead", 60*time.Second, func(nv nodesView) bool { return nv.state(id) == "dead" })
		total += time.Since(killed)
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "detect_ms")
}

// A node stopped and started again at once on another gossip address,
// before the others declared its previous run dead, is seen alive at the
// new address; a node killed for good is forgotten with `sinew admin node
// forget`, and every alive node then holds it left, not dead.
func TestClusterNodeComesBackOnANewAddressAndIsForgotten(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	n1 := startClusterChild(t, bin, t.TempDir())
	n2 := startClusterChild(t, bin, t.TempDir(), n1.gossip)
	n3 := startClusterChild(t, bin, t.TempDir(), n1.gossip)
	allAlive := func(v nodesView) bool {
		alive := 0
		for _, n := range v.Nodes {
			if n.State == "alive" {
				alive++
			}
		}
		return alive == 2
	}
	for _, c := range []*clusterChild{n1, n2, n3} {
		awaitNodes(t, c, "everyone alive", allAlive)
	}
	id2, id3 := nodesOf(t, n2.admin).Self.ID, nodesOf(t, n3.admin).Self.ID

	if status, _ := termChild(t, n3.child); status != 0 {
		t.Fatalf("SIGTERM: exit %d", status)
	}
	n3b := startClusterChild(t, bin, n3.dir, n1.gossip)
	if n3b.gossip == n3.gossip {
		t.Skipf("the new run got the same gossip address %s", n3b.gossip)
	}
	for _, c := range []*clusterChild{n1, n2} {
		awaitNodesFor(t, c, "the restarted node alive at its new address", 60*time.Second, func(v nodesView) bool {
			for _, n := range v.Nodes {
				if n.ID == id3 {
					return n.State == "alive" && n.GossipAddr == n3b.gossip
				}
			}
			return false
		})
	}

	n2.cmd.Process.Kill()
	n2.cmd.Wait()
	awaitNodes(t, n1, "the killed node dead", func(v nodesView) bool { return v.state(id2) == "dead" })
	out, err := exec.Command(bin, "admin", "node", "forget", id2, "--admin-addr", n1.admin).CombinedOutput()
	if err != nil {
		t.Fatalf("sinew admin node forget: %v\n%s", err, out)
	}
	for _, c := range []*clusterChild{n1, n3b} {
		v := awaitNodes(t, c, "the forgotten node left", func(v nodesView) bool { return v.state(id2) == "left" })
		if v.Fenced {
			t.Errorf("fenced with the forgotten node left and the other alive: %+v", v)
		}
	}
	out, err = exec.Command(bin, "admin", "node", "forget", id3, "--admin-addr", n1.admin).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "is alive in this node's view") {
		t.Fatalf("forget of an alive node: %v\n%s", err, out)
	}
}

// A node with another gossip key is not heard, and both sides say so in
// their logs at WARN.
func TestClusterWrongGossipKeyIsLogged(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	dir := t.TempDir()
	keyA, keyB := filepath.Join(dir, "a.key"), filepath.Join(dir, "b.key")
	if err := os.WriteFile(keyA, []byte(base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyB, []byte(base64.StdEncoding.EncodeToString([]byte("fedcba9876543210fedcba9876543210"))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := startChildArgs(t, bin, t.TempDir(), "--cluster", "--cluster-profile", "lan", "--cluster-gossip-listen", "127.0.0.1:0", "--cluster-peer-listen", "127.0.0.1:0",
		"--cluster-gossip-key-file", keyA)
	aGossip := logField(t, a, "cluster membership started", "gossip_addr")
	b := startChildArgs(t, bin, t.TempDir(), "--cluster", "--cluster-profile", "lan", "--cluster-gossip-listen", "127.0.0.1:0", "--cluster-peer-listen", "127.0.0.1:0",
		"--cluster-gossip-key-file", keyB, "--cluster-seeds", aGossip)
	if !strings.Contains(b.log(), "level=WARN msg=\"cluster: no seed could be joined yet") {
		t.Errorf("the node with the other key logs no WARN about its seeds:\n%s", b.log())
	}
	deadline := time.Now().Add(safetyTimeout)
	for !strings.Contains(a.log(), "level=WARN msg=\"memberlist: ") {
		if time.Now().After(deadline) {
			t.Fatalf("the seed logs no WARN about the undecryptable messages:\n%s", a.log())
		}
		time.Sleep(50 * time.Millisecond) // polling a real process's log
	}
}
