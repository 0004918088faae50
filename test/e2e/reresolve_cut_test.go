package e2e_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/internal/tlsconf"
	"github.com/sinewmq/sinew/test/chaos/netlab"
)

// Three `sinew serve --cluster` nodes, each in its own network namespace
// (hosts 1 to 3), and a client in a fourth (host 4) dialled with ONE
// address: the owner of a one-partition queue. The client learns the
// cluster's nodes from the owner (METADATA) on its first publish. Then the
// owner's links to its peers are cut (blackhole routes to their addresses
// inside its namespace) while the client still reaches it: the owner
// answers unavailable or fenced, the other two elect a new owner, and a
// publisher going on through the cut sees every publish confirmed with no
// error reaching it. After the cut heals and the nodes agree, the queue
// holds every confirmed message exactly once. The longest pause between
// two confirms is logged (not asserted: the machine may be loaded). Skipped
// where network namespaces are unavailable (not root, no ip command).
func TestClusterClientWithOneAddressGoesOnPastACutOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	l := netlab.ForTest(t, 1, 2, 3, 4)
	bin := buildSinew(t)
	key := filepath.Join(t.TempDir(), "gossip.key")
	if err := os.WriteFile(key, []byte(base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := func(i int) string { return l.IP(i) + ":7654" }
	admin := func(i int) string { return l.IP(i) + ":7655" }
	now := time.Now()
	ca, err := tlsconf.NewIssuer("cluster CA", now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		dir := t.TempDir()
		args := append(l.Exec(i), bin, "serve", "--data-dir", dir, "--listen", addr(i),
			"--admin-listen", admin(i), "--cluster", "--cluster-profile", "lan",
			"--cluster-gossip-listen", l.IP(i)+":7946", "--cluster-gossip-key-file", key,
			"--cluster-peer-listen", l.IP(i)+":7947", "--auth-allow-anonymous")
		// Peer links off loopback need peer TLS.
		args = append(args, writePeerTLS(t, ca, t.TempDir(), dir)...)
		if i > 1 {
			args = append(args, "--cluster-seeds", l.IP(1)+":7946")
		}
		startCommand(t, args[0], args[1:]...)
	}
	// The admin APIs, from host 4.
	tr := &http.Transport{DialContext: l.Dialer(4)}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	getJSON := func(i int, path string, v any) bool {
		resp, err := hc.Get("http://" + admin(i) + path)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(v) == nil
	}
	poll := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(safetyTimeout)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v", what, safetyTimeout)
			}
			time.Sleep(50 * time.Millisecond) // polling real processes
		}
	}
	for i := 1; i <= 3; i++ {
		poll(fmt.Sprintf("node %d has a controller of three voters", i), func() bool {
			var v nodesView
			return getJSON(i, "/api/v1/nodes", &v) && v.Controller != nil && v.Controller.Leader != "" &&
				len(v.Controller.Voters) == 3
		})
	}
	type queueView struct {
		Partitions []struct {
			Owner string `json:"owner"`
			Ready int    `json:"ready"`
		} `json:"partitions"`
	}
	ownerAt := func(i int, topic string) string {
		var v queueView
		if !getJSON(i, "/api/v1/queues/"+topic, &v) || len(v.Partitions) != 1 {
			return ""
		}
		return v.Partitions[0].Owner
	}
	// agreed returns the owner the given hosts name alike, or "".
	agreed := func(topic string, hosts ...int) string {
		o := ownerAt(hosts[0], topic)
		for _, i := range hosts[1:] {
			if ownerAt(i, topic) != o {
				return ""
			}
		}
		return o
	}
	all := []string{addr(1), addr(2), addr(3)}
	const topic = "cutowner"
	ctx, cancel := context.WithTimeout(context.Background(), 4*safetyTimeout)
	defer cancel()
	declarer, err := sinew.Dial(ctx, addr(1), fastReconnect(), sinew.WithDialer(l.Dialer(4)), sinew.WithSeeds(all...))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := declarer.DeclareQueue(ctx, topic, sinew.QueueConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	declarer.Close()
	owner := ""
	poll("the nodes agree on an owner", func() bool { owner = agreed(topic, 1, 2, 3); return owner != "" })
	cut := 0
	for i := 1; i <= 3; i++ {
		if addr(i) == owner {
			cut = i
		}
	}
	if cut == 0 {
		t.Fatalf("owner %q is none of %v", owner, all)
	}
	var others []int
	for i := 1; i <= 3; i++ {
		if i != cut {
			others = append(others, i)
		}
	}

	var logs lockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	client, err := sinew.Dial(ctx, owner, fastReconnect(), sinew.WithDialer(l.Dialer(4)), sinew.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	pub := startPublisher(ctx, client, topic)
	defer pub.stop()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		pub.waitFor(t, what, safetyTimeout, &logs, cond)
	}
	waitFor("the client learns the cluster from its one node", func() bool {
		return strings.Contains(logs.String(), "the node is clustered") && pub.count() >= 20
	})

	// Cut the owner's peer links, not the client's: inside its namespace,
	// routes to the other nodes' addresses drop everything.
	if err := l.CutFrom(cut, others...); err != nil {
		t.Fatal(err)
	}
	healed := false
	heal := func() {
		if !healed {
			healed = true
			if err := l.HealFrom(cut, others...); err != nil {
				t.Error(err)
			}
		}
	}
	defer heal()
	cutAt, before := time.Now(), pub.count()
	newOwner := ""
	waitFor("another node owns the queue and confirms publishes", func() bool {
		if newOwner == "" {
			if o := agreed(topic, others...); o != "" && o != owner {
				newOwner = o
			}
		}
		// The cut lasts 5 s at least, whatever the machine's speed.
		return newOwner != "" && pub.count() >= before+20 && time.Since(cutAt) >= 5*time.Second
	})
	t.Logf("owner %s cut from its peers for %v; %d publishes confirmed meanwhile, new owner %s",
		owner, time.Since(cutAt).Round(time.Millisecond), pub.count()-before, newOwner)
	heal()
	after := pub.count()
	waitFor("publishes go on after the cut heals", func() bool { return pub.count() >= after+20 })
	want, pause := pub.finish(t, &logs)
	t.Logf("%d publishes confirmed, no error; longest pause between confirms %v", len(want), pause.Round(time.Millisecond))
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "publish hedged") {
			t.Logf("client: %s", line)
		}
	}

	final := ""
	poll("the three nodes agree on an owner after the cut", func() bool { final = agreed(topic, 1, 2, 3); return final != "" })
	fi := 0
	for i := 1; i <= 3; i++ {
		if addr(i) == final {
			fi = i
		}
	}
	checkStoredOnce(t, ctx, topic, want, func() (int, bool) {
		var v queueView
		if !getJSON(fi, "/api/v1/queues/"+topic, &v) || len(v.Partitions) != 1 {
			return 0, false
		}
		return v.Partitions[0].Ready, true
	}, func() (*sinew.Client, error) {
		return sinew.Dial(ctx, final, fastReconnect(), sinew.WithDialer(l.Dialer(4)), sinew.WithSeeds(all...))
	})
}
