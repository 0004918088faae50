package e2e_test

import (
	"context"
	"errors"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/internal/nodeid"
	"github.com/sinewmq/sinew/internal/tlsconf"
	"github.com/sinewmq/sinew/internal/vfs"
)

// TestClusterCreatingAQueueNeedsManage runs three `sinew serve --cluster`
// processes, each with a user "pub" that may publish and consume everywhere
// but manage nothing. Through a node other than the one that created it,
// pub publishes to and consumes from a queue the catalogue holds: that is
// not a creation. A publish or subscribe of pub naming a new queue is
// refused permission_denied on whichever node it reaches, and no node's
// catalogue gains the queue (the refusal comes before the node proposes a
// create to the controller). An anonymous peer (auth.allow_anonymous:
// every permission) still creates on first use through any node. With
// users, the nodes run with a gossip key and peer TLS, as they must.
func TestClusterCreatingAQueueNeedsManage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	// Anonymous peers keep every permission beside the user, so the
	// admin API and the anonymous client below need no credentials.
	t.Setenv("SINEW_AUTH_ALLOW_ANONYMOUS", "true")
	nodes := startThreeSecured(t, bin)
	const pw = "pub password 1"
	for _, c := range nodes {
		code, out, errOut := runSinew(t, bin, pw+"\n", "admin", "user", "add", "pub", "--publish", "*", "--consume", "*",
			"--password-stdin", "--admin-addr", c.admin)
		if code != 0 {
			t.Fatalf("user add on %s: exit %d, %s %s", c.admin, code, out, errOut)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	queueURL := func(c *clusterChild, topic string) string { return "http://" + c.admin + "/api/v1/queues/" + topic }

	anon, err := sinew.Dial(ctx, nodes[0].addr, fastReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, err := anon.DeclareQueue(ctx, "existing", sinew.QueueConfig{}); err != nil {
		t.Fatal(err)
	}
	awaitAll(t, nodes, "the queue in every node's catalogue", func(c *clusterChild) bool {
		code, _ := adminDo(t, http.MethodGet, queueURL(c, "existing"), nil)
		return code == http.StatusOK
	})

	var addrs []string
	for _, c := range nodes {
		addrs = append(addrs, c.addr)
	}
	for i, c := range nodes[1:] {
		// Seeds: a subscription reaches each partition's owner.
		pub, err := sinew.Dial(ctx, c.addr, fastReconnect(), sinew.WithSeeds(addrs...), sinew.WithUser("pub", pw))
		if err != nil {
			t.Fatal(err)
		}
		defer pub.Close()
		if _, err := pub.PublishText(ctx, "existing", "through another node"); err != nil {
			t.Fatalf("node %d: publish to the catalogue's queue: %v", i+1, err)
		}
		_, err = pub.PublishText(ctx, "fresh", "x")
		want := `queue "fresh" does not exist and creating it needs manage on topic "fresh", which user pub does not hold`
		if !errors.Is(err, sinew.ErrPermissionDenied) || !strings.Contains(err.Error(), want) {
			t.Fatalf("node %d: publish creating fresh = %v, want permission_denied saying %q", i+1, err, want)
		}
		if _, err := pub.Subscribe(ctx, "fresh"); !errors.Is(err, sinew.ErrPermissionDenied) {
			t.Fatalf("node %d: subscribe creating fresh = %v, want permission_denied", i+1, err)
		}
		sub, err := pub.Subscribe(ctx, "existing")
		if err != nil {
			t.Fatalf("node %d: subscribe to the catalogue's queue: %v", i+1, err)
		}
		select {
		case m := <-sub.Messages():
			if err := m.Complete(ctx); err != nil {
				t.Fatal(err)
			}
		case <-ctx.Done():
			t.Fatalf("node %d: no delivery from the catalogue's queue", i+1)
		}
		sub.Unsubscribe(ctx)
	}
	for _, c := range nodes {
		if code, body := adminDo(t, http.MethodGet, queueURL(c, "fresh"), nil); code != http.StatusNotFound {
			t.Fatalf("%s has the refused queue: %d %s", c.admin, code, body)
		}
	}

	// Every permission: creation on first use through another node.
	anon2, err := sinew.Dial(ctx, nodes[2].addr, fastReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer anon2.Close()
	if _, err := anon2.PublishText(ctx, "made", "x"); err != nil {
		t.Fatalf("anonymous creates on first use: %v", err)
	}
	awaitAll(t, nodes, "the created queue everywhere", func(c *clusterChild) bool {
		code, _ := adminDo(t, http.MethodGet, queueURL(c, "made"), nil)
		return code == http.StatusOK
	})
}

// startThreeSecured starts three `sinew serve --cluster` processes with a
// gossip key and the peer certificates of `sinew cert generate
// --peer-data-dirs`, as a cluster with users needs, and waits until all
// three are voters.
func startThreeSecured(t *testing.T, bin string) []*clusterChild {
	t.Helper()
	base := t.TempDir()
	certs := filepath.Join(base, "certs")
	dirs := []string{filepath.Join(base, "d1"), filepath.Join(base, "d2"), filepath.Join(base, "d3")}
	if out, err := exec.Command(bin, "cert", "generate", "--dir", certs, "--peer-data-dirs", strings.Join(dirs, ",")).CombinedOutput(); err != nil {
		t.Fatalf("sinew cert generate: %v\n%s", err, out)
	}
	key := writeGossipKey(t, base)
	var nodes []*clusterChild
	var ids []string
	for i, d := range dirs {
		id, err := nodeid.Load(vfs.OS(), d, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
		extra := append([]string{"--cluster-gossip-key-file", key}, peerFlags(certs, id, filepath.Join(certs, tlsconf.PeerCAFile))...)
		var seeds []string
		if i > 0 {
			seeds = []string{nodes[0].gossip}
		}
		nodes = append(nodes, startClusterChildArgs(t, bin, d, extra, seeds...))
	}
	for _, c := range nodes {
		awaitNodes(t, c, "three voters", func(v nodesView) bool { return controllerAgrees(v, ids, nil, ids, nil) })
	}
	return nodes
}
