package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/protocol"
)

// ownerRouter publishes to a replicated queue the way a client of the
// cluster must: to the node that owns the partition, following not_owner
// to the address it names, and past a dead node to the others.
type ownerRouter struct {
	t       *testing.T
	clients map[string]*sinew.Client // by client address
	addrs   []string
	cur     string
}

func newOwnerRouter(t *testing.T, addrs []string) *ownerRouter {
	r := &ownerRouter{t: t, clients: map[string]*sinew.Client{}, addrs: addrs, cur: addrs[0]}
	for _, a := range addrs {
		r.add(a)
	}
	return r
}

func (r *ownerRouter) add(addr string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := sinew.Dial(ctx, addr, fastReconnect(), sinew.WithProducerID("router-"+addr))
	if err != nil {
		r.t.Fatalf("dial %s: %v", addr, err)
	}
	r.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		done := make(chan struct{})
		go func() { c.Close(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
		}
	})
	r.clients[addr] = c
}

// publish sends body until some owner confirms it (within bound); it
// returns the node that confirmed it.
func (r *ownerRouter) publish(topic string, body []byte, bound time.Duration) (string, error) {
	deadline := time.Now().Add(bound)
	var last error
	for i := 0; time.Now().Before(deadline); i++ {
		c := r.clients[r.cur]
		ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
		_, err := c.Publish(ctx, topic, body)
		cancel()
		if err == nil {
			return r.cur, nil
		}
		last = err
		var be *sinew.BrokerError
		// A not_owner naming a node this client saw die (not in addrs) is
		// a follower that has not noticed yet: treated as unavailable.
		if errors.As(err, &be) && be.Code == protocol.CodeNotOwner && be.Owner != "" && slices.Contains(r.addrs, be.Owner) {
			if _, ok := r.clients[be.Owner]; !ok {
				r.add(be.Owner)
			}
			r.cur = be.Owner
			continue
		}
		// Unavailable (an election under way), or the node is gone: try
		// the next one after a short pause.
		r.cur = r.addrs[(indexOf(r.addrs, r.cur)+1)%len(r.addrs)]
		time.Sleep(20 * time.Millisecond)
	}
	return "", fmt.Errorf("not confirmed within %v: %w", bound, last)
}

func getJSONInto(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return 0
}

// Three `sinew serve --cluster` processes hold a replicated queue (one
// partition, three replicas). Messages are published to its owner; a node
// that does not own it answers not_owner with the owner's address. The
// owner's process is killed with -9; another replica takes over, and the
// time from the kill to the next confirmed publish is logged. Every message
// confirmed before and after the kill is then consumed from the new owner:
// none is lost. The killed node restarts and catches up as a follower.
func TestClusterReplicatedQueueSurvivesOwnerKill(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	nodes, id := startThree(t, bin)
	three := []string{id[nodes[0]], id[nodes[1]], id[nodes[2]]}
	for _, c := range nodes {
		awaitNodes(t, c, "three voters", func(v nodesView) bool { return controllerAgrees(v, three, nil, three, nil) })
	}
	byAddr := map[string]*clusterChild{}
	var addrs []string
	for _, c := range nodes {
		byAddr[c.addr] = c
		addrs = append(addrs, c.addr)
	}
	r := newOwnerRouter(t, addrs)

	// A node that is not the owner says who is.
	const topic = "replicated"
	confirmed := map[string]bool{}
	owner, err := r.publish(topic, []byte("m-0"), 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	confirmed["m-0"] = true
	for _, a := range addrs {
		if a == owner {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := r.clients[a].Publish(ctx, topic, []byte("refused"))
		cancel()
		var be *sinew.BrokerError
		if !errors.As(err, &be) || be.Code != protocol.CodeNotOwner || be.Owner != owner {
			t.Fatalf("publish on %s (not the owner %s): %v, want not_owner naming the owner", a, owner, err)
		}
	}
	// The operations API of a follower shows the partition's replicas and
	// its owner.
	for _, c := range nodes {
		if c.addr == owner {
			continue
		}
		var q struct {
			Partitions []struct {
				Replicas []string `json:"replicas"`
				Owner    string   `json:"owner"`
				Term     uint64   `json:"term"`
			} `json:"partitions"`
		}
		getJSONInto(t, "http://"+c.admin+"/api/v1/queues/"+topic, &q)
		if len(q.Partitions) != 1 || len(q.Partitions[0].Replicas) != 3 || q.Partitions[0].Owner != owner || q.Partitions[0].Term == 0 {
			t.Fatalf("queue view on %s: %+v, want three replicas and owner %s", c.addr, q, owner)
		}
	}
	for i := 1; i < 200; i++ {
		b := fmt.Sprintf("m-%d", i)
		if _, err := r.publish(topic, []byte(b), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		confirmed[b] = true
	}

	killed := byAddr[owner]
	if err := killed.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed.cmd.Wait()
	killedAt := time.Now()
	var survivors []string
	for _, a := range addrs {
		if a != owner {
			survivors = append(survivors, a)
		}
	}
	r.addrs, r.cur = survivors, survivors[0]
	newOwner, err := r.publish(topic, []byte("after-0"), 30*time.Second)
	if err != nil {
		t.Fatalf("after the owner's kill: %v", err)
	}
	failover := time.Since(killedAt)
	t.Logf("owner killed with -9: publishes confirmed again by %s after %v", newOwner, failover.Round(time.Millisecond))
	confirmed["after-0"] = true
	for i := 1; i < 100; i++ {
		b := fmt.Sprintf("after-%d", i)
		if _, err := r.publish(topic, []byte(b), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		confirmed[b] = true
	}

	// Everything confirmed is there, on the new owner.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub, err := r.clients[newOwner].Subscribe(ctx, topic, sinew.WithPrefetch(64))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for len(got) < len(confirmed) {
		select {
		case m, ok := <-sub.Messages():
			if !ok {
				t.Fatalf("subscription ended: %v", sub.Err())
			}
			got[string(m.Body)] = true
			if err := m.Complete(ctx); err != nil {
				t.Fatalf("complete: %v", err)
			}
		case <-ctx.Done():
			var missing []string
			for b := range confirmed {
				if !got[b] {
					missing = append(missing, b)
				}
			}
			sort.Strings(missing)
			t.Fatalf("%d of %d confirmed messages not delivered, e.g. %v", len(missing), len(confirmed), missing[:min(10, len(missing))])
		}
	}
	for b := range got {
		if !confirmed[b] && b != "refused" {
			t.Errorf("delivered %q, never published", b)
		}
	}

	// The killed node restarts on its data directory and follows.
	back := startClusterChild(t, bin, killed.dir, nodes[0].gossip, nodes[1].gossip, nodes[2].gossip)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	c, err := sinew.Dial(ctx2, back.addr, fastReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	deadline := time.Now().Add(safetyTimeout)
	for {
		_, err := c.Publish(ctx2, topic, []byte("to-the-restarted"))
		var be *sinew.BrokerError
		if errors.As(err, &be) && be.Code == protocol.CodeNotOwner && be.Owner == newOwner {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restarted node answers %v, want not_owner naming %s", err, newOwner)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
