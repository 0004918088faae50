package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
)

// A queue created on the first node of a cluster, before any other node
// joined, has one replica. Once two more nodes join, the controller grows
// it to three replicas in every partition (its API shows the replication
// it has against the factor, and /metrics counts it under-replicated
// until then), with every message still there: after the node that held
// it alone is killed with -9, every confirmed message is consumed from
// the others, and publishing goes on.
func TestClusterQueueCreatedWhileFormingGrowsToThreeReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	n1 := startClusterChild(t, bin, t.TempDir())
	id1 := nodesOf(t, n1.admin).Self.ID
	awaitNodes(t, n1, "node 1 in its controller's table", func(v nodesView) bool {
		return controllerAgrees(v, []string{id1}, nil, []string{id1}, nil)
	})
	const topic = "formed"
	queueURL := func(c *clusterChild) string { return "http://" + c.admin + "/api/v1/queues/" + topic }
	if code, body := adminDo(t, http.MethodPut, queueURL(n1), map[string]any{"partitions": 2}); code != http.StatusCreated {
		t.Fatalf("PUT queue: %d %s", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first, err := sinew.Dial(ctx, n1.addr, fastReconnect())
	if err != nil {
		t.Fatal(err)
	}
	confirmed := publishNumbered(t, ctx, first, topic, "alone", 100)
	first.Close()

	type replView struct {
		Replication *struct {
			Factor          int  `json:"factor"`
			Replicas        int  `json:"replicas"`
			UnderReplicated bool `json:"under_replicated"`
		} `json:"replication"`
		Partitions []struct {
			Owner    string   `json:"owner"`
			Replicas []string `json:"replicas"`
			Voters   []string `json:"voters"`
			Learners []string `json:"learners"`
		} `json:"partitions"`
	}
	var alone replView
	getJSONInto(t, queueURL(n1), &alone)
	if r := alone.Replication; r == nil || r.Factor != 1 || r.Replicas != 1 || r.UnderReplicated {
		t.Fatalf("a one-node cluster's queue: replication %+v, want factor 1, 1 replica", r)
	}

	n2 := startClusterChild(t, bin, t.TempDir(), n1.gossip)
	n3 := startClusterChild(t, bin, t.TempDir(), n1.gossip)
	nodes := []*clusterChild{n1, n2, n3}
	ids := []string{id1, nodesOf(t, n2.admin).Self.ID, nodesOf(t, n3.admin).Self.ID}
	for _, c := range nodes {
		awaitNodes(t, c, "three voters", func(v nodesView) bool { return controllerAgrees(v, ids, nil, ids, nil) })
	}
	joined := time.Now()
	grown := func(c *clusterChild) bool {
		var v replView
		getJSONInto(t, queueURL(c), &v)
		if r := v.Replication; r == nil || r.Factor != 3 || r.Replicas != 3 || r.UnderReplicated || len(v.Partitions) != 2 {
			return false
		}
		for _, p := range v.Partitions {
			if len(p.Replicas) != 3 || len(p.Voters) != 3 || len(p.Learners) != 0 || p.Owner == "" {
				return false
			}
		}
		return true
	}
	for deadline := joined.Add(60 * time.Second); !(grown(n1) && grown(n2) && grown(n3)); {
		if time.Now().After(deadline) {
			for _, c := range nodes {
				for _, l := range strings.Split(c.log(), "\n") {
					if strings.Contains(l, "replica") || strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") {
						t.Logf("%s: %s", c.addr, l)
					}
				}
			}
			for _, c := range nodes {
				_, body := adminDo(t, http.MethodGet, queueURL(c), nil)
				t.Logf("%s: %s", c.addr, body)
			}
			t.Fatal("the queue did not grow to three voting replicas on every node within 60 s of the third node joining")
		}
		time.Sleep(50 * time.Millisecond) // polling real processes
	}
	t.Logf("three voting replicas in every partition %v after the third node joined (goal: within 10 s)", time.Since(joined).Round(time.Millisecond))
	// The owners report the replicas in place (placement_done), which
	// ends the move in the catalogue, and so the count on every node.
	awaitAll(t, nodes, "sinew_queues_under_replicated 0", func(c *clusterChild) bool {
		return strings.Contains(scrape(t, c.admin), "\nsinew_queues_under_replicated 0\n")
	})

	// The node that held the queue alone dies: the others hold it all.
	if err := n1.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	n1.cmd.Wait()
	_, _, client := seededClient(t, nodes[1:], 0)
	maps.Copy(confirmed, publishNumbered(t, ctx, client, topic, "after", 50))
	drainWith(t, ctx, client, topic, confirmed)
}

// Three nodes hold three queues of one partition each (three replicas
// apiece); a fourth node joins while a producer publishes to all three.
// Once every node has been live for the hold-off, the controller moves
// replicas onto the new node, one queue at a time, until the loads are
// even (3, 3, 3, 0 becomes 2, 2, 3, 2 or the like), and the new node leads
// what it took the preferred owner's place in. No publish fails, and every
// confirmed message is consumed afterwards. The longest pause in confirms
// around the moves is logged.
func TestClusterNodeThatJoinsTakesItsShareUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	nodes, _, _ := startThreeVoting(t, bin)
	_, _, client := seededClient(t, nodes, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	topics := []string{"share-a", "share-b", "share-c"}
	confirmed := map[string]bool{}
	for _, topic := range topics {
		maps.Copy(confirmed, publishNumbered(t, ctx, client, topic, topic+"-before", 20))
	}

	// A producer publishes round the three queues until told to stop.
	stop := make(chan struct{})
	type result struct {
		bodies   []string
		err      error
		maxPause time.Duration
	}
	done := make(chan result, 1)
	go func() {
		var r result
		last := time.Now()
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- r
				return
			default:
			}
			topic := topics[i%len(topics)]
			b := fmt.Sprintf("%s-during-%d", topic, i)
			pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
			_, err := client.Publish(pctx, topic, []byte(b))
			pcancel()
			if err != nil {
				r.err = fmt.Errorf("publish %s: %w", b, err)
				done <- r
				return
			}
			now := time.Now()
			r.maxPause = max(r.maxPause, now.Sub(last))
			last = now
			r.bodies = append(r.bodies, b)
		}
	}()

	spare := startClusterChild(t, bin, t.TempDir(), nodes[0].gossip)
	joined := time.Now()
	all := append(slices.Clone(nodes), spare)
	holds := func() int {
		n := 0
		for _, topic := range topics {
			var v struct {
				Replication *struct {
					UnderReplicated bool `json:"under_replicated"`
				} `json:"replication"`
				Partitions []struct {
					Owner  string   `json:"owner"`
					Voters []string `json:"voters"`
				} `json:"partitions"`
			}
			code, body := adminDo(t, http.MethodGet, "http://"+spare.admin+"/api/v1/queues/"+topic, nil)
			if code != http.StatusOK {
				continue // the new node has not applied the catalogue yet
			}
			if err := json.Unmarshal(body, &v); err != nil {
				t.Fatal(err)
			}
			if v.Replication != nil && !v.Replication.UnderReplicated && len(v.Partitions) == 1 &&
				len(v.Partitions[0].Voters) == 3 && slices.Contains(v.Partitions[0].Voters, spare.addr) {
				n++
			}
		}
		return n
	}
	for deadline := time.Now().Add(90 * time.Second); holds() < 2; {
		if time.Now().After(deadline) {
			for _, c := range all {
				for _, l := range strings.Split(c.log(), "\n") {
					if strings.Contains(l, "rebalanc") || strings.Contains(l, "replica") || strings.Contains(l, "level=ERROR") {
						t.Logf("%s: %s", c.addr, l)
					}
				}
			}
			t.Fatalf("the new node holds voting replicas of %d queues 90 s after it joined, want 2", holds())
		}
		time.Sleep(100 * time.Millisecond) // polling real processes
	}
	t.Logf("the new node votes in 2 of 3 queues %v after it started", time.Since(joined).Round(time.Millisecond))
	// Let the loads settle: nothing more moves (3 queues of one
	// partition over four nodes: 2, 2, 3, 2 or the like).
	time.Sleep(2 * time.Second) // polling real processes
	close(stop)
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("published %d during the join and the moves; longest pause between confirms %v", len(r.bodies), r.maxPause.Round(time.Millisecond))
	for _, b := range r.bodies {
		confirmed[b] = true
	}
	if holds() != 2 {
		t.Fatalf("the new node holds replicas of %d queues after the loads settled, want 2", holds())
	}

	consumer, err := sinew.Dial(ctx, spare.addr, fastReconnect(), sinew.WithSeeds(nodes[0].addr, nodes[1].addr, nodes[2].addr, spare.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	got := map[string]int{}
	for _, topic := range topics {
		want := map[string]bool{}
		for b := range confirmed {
			if strings.HasPrefix(b, topic+"-") {
				want[b] = true
			}
		}
		maps.Copy(got, drainWith(t, ctx, consumer, topic, want))
	}
	for b, n := range got {
		if n > 1 {
			t.Errorf("%q delivered %d times: stored more than once, or a settle lost", b, n)
		}
	}
}
