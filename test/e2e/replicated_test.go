package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/protocol"
)

// rawPublish sends one PUBLISH to addr on a connection of its own, as a
// client that does not follow not_owner would, and returns the answer.
func rawPublish(t *testing.T, addr, topic string) protocol.Body {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	read := func() protocol.Body {
		f, _, err := protocol.ReadFrame(br, protocol.FrameBytesDefault, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, err := protocol.Decode(f)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if _, err := c.Write(protocol.AppendFrame(nil, 0, 1, &protocol.Hello{ProtocolVersion: protocol.Version, ClientName: "raw"})); err != nil {
		t.Fatal(err)
	}
	if b := read(); b.Op() != protocol.OpHelloOK {
		t.Fatalf("handshake: %v", b.Op())
	}
	if _, err := c.Write(protocol.AppendFrame(nil, 0, 2, &protocol.Publish{Topic: topic, Partition: -1, Body: []byte("raw")})); err != nil {
		t.Fatal(err)
	}
	return read()
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
	nodes, _, _ := startThreeVoting(t, bin)
	// The client dials one node and knows the others as seeds: it finds
	// the owner by itself.
	byAddr, addrs, client := seededClient(t, nodes, 1)
	const topic = "replicated"
	confirmed := map[string]bool{}
	publish := func(body string, bound time.Duration) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		if _, err := client.Publish(ctx, topic, []byte(body)); err != nil {
			t.Fatalf("publish %s: %v", body, err)
		}
		confirmed[body] = true
	}
	publish("m-0", 30*time.Second)
	owner := ""
	for owner == "" {
		for _, a := range addrs {
			if b, ok := rawPublish(t, a, topic).(*protocol.PublishOK); ok && b != nil {
				owner = a
				confirmed["raw"] = true // stored: "raw" may come back any number of times
			}
		}
	}
	// A node that is not the owner says who is.
	for _, a := range addrs {
		if a == owner {
			continue
		}
		// A follower that has not heard from the new leader yet answers
		// unavailable (no owner known, docs/protocol.md 6); it learns the
		// owner within a heartbeat.
		deadline := time.Now().Add(safetyTimeout)
		for {
			eb, ok := rawPublish(t, a, topic).(*protocol.ErrorBody)
			if ok && eb.Code == protocol.CodeNotOwner && eb.Owner == owner {
				break
			}
			if !ok || eb.Code != protocol.CodeUnavailable || time.Now().After(deadline) {
				t.Fatalf("raw publish on %s (not the owner %s): %+v, want not_owner naming the owner", a, owner, eb)
			}
			time.Sleep(20 * time.Millisecond) // polling a real process
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
		publish(fmt.Sprintf("m-%d", i), 10*time.Second)
	}

	killed := byAddr[owner]
	if err := killed.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed.cmd.Wait()
	killedAt := time.Now()
	// The application's publish carries on: the client finds the new
	// owner, and no error reaches it.
	publish("after-0", 30*time.Second)
	failover := time.Since(killedAt)
	newOwner := ""
	for newOwner == "" {
		for _, a := range addrs {
			if a == owner {
				continue
			}
			var q struct {
				Partitions []struct {
					Owner string `json:"owner"`
				} `json:"partitions"`
			}
			getJSONInto(t, "http://"+byAddr[a].admin+"/api/v1/queues/"+topic, &q)
			if len(q.Partitions) == 1 && q.Partitions[0].Owner != "" && q.Partitions[0].Owner != owner {
				newOwner = q.Partitions[0].Owner
			}
		}
	}
	t.Logf("owner killed with -9: publishes confirmed again (by %s) after %v", newOwner, failover.Round(time.Millisecond))
	for i := 1; i < 100; i++ {
		publish(fmt.Sprintf("after-%d", i), 10*time.Second)
	}

	// Everything confirmed is there, on the new owner.
	consumeAll(t, newOwner, topic, confirmed)

	// The killed node restarts on its data directory and follows.
	back := startClusterChild(t, bin, killed.dir, nodes[0].gossip, nodes[1].gossip, nodes[2].gossip)
	deadline := time.Now().Add(safetyTimeout)
	for {
		eb, ok := rawPublish(t, back.addr, topic).(*protocol.ErrorBody)
		if ok && eb.Code == protocol.CodeNotOwner && eb.Owner == newOwner {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restarted node answers %+v, want not_owner naming %s", eb, newOwner)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Four `sinew serve --cluster` processes; a queue is placed on three of
// them. The owner is killed with -9 and not restarted: another replica
// takes over at once, and once membership has held the node dead for the
// recovery plan's grace, the controller moves its replicas to the fourth
// node, whose replica the new owner adds as a learner, catches up, promotes
// and then removes the dead one. The time from the kill to three live
// voters is logged, and every message confirmed is then consumed.
func TestClusterRecoveryPlanRestoresRF(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	nodes, spare := startThreeAndSpare(t, bin)
	byAddr, _, client := seededClient(t, nodes, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const topic = "recovered"
	confirmed := publishNumbered(t, ctx, client, topic, "m", 200)
	type partView struct {
		Replicas []string `json:"replicas"`
		Owner    string   `json:"owner"`
		Voters   []string `json:"voters"`
		Learners []string `json:"learners"`
	}
	view := func(c *clusterChild) partView {
		var q struct {
			Partitions []partView `json:"partitions"`
		}
		resp, err := http.Get("http://" + c.admin + "/api/v1/queues/" + topic)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusNotFound {
			return partView{} // no replica here (yet)
		}
		if err := json.NewDecoder(resp.Body).Decode(&q); err != nil || len(q.Partitions) != 1 {
			t.Fatalf("queue view on %s: %+v %v", c.addr, q, err)
		}
		return q.Partitions[0]
	}
	before := view(nodes[0])
	if len(before.Replicas) != 3 || slices.Contains(before.Replicas, spare.addr) || len(before.Voters) != 3 {
		t.Fatalf("placement %+v: want three replicas on the first three nodes", before)
	}
	killed := byAddr[before.Owner]
	if err := killed.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed.cmd.Wait()
	killedAt := time.Now()
	deadline := killedAt.Add(60 * time.Second)
	var after partView
	for {
		after = view(spare)
		if len(after.Voters) == 3 && slices.Contains(after.Voters, spare.addr) && !slices.Contains(after.Voters, killed.addr) &&
			len(after.Learners) == 0 && after.Owner != "" && after.Owner != killed.addr {
			break
		}
		if time.Now().After(deadline) {
			for _, c := range nodes {
				if c == killed {
					continue
				}
				for _, l := range strings.Split(c.log(), "\n") {
					if strings.Contains(l, "replica") || strings.Contains(l, "placement") || strings.Contains(l, "recovery") || strings.Contains(l, "level=ERROR") || strings.Contains(l, "level=WARN") {
						t.Logf("%s: %s", c.addr, l)
					}
				}
			}
			t.Fatalf("RF not restored 60 s after the kill: %+v", after)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("owner killed with -9: three live voters again (the spare node among them) after %v", time.Since(killedAt).Round(time.Millisecond))
	if !slices.Contains(after.Replicas, spare.addr) || slices.Contains(after.Replicas, killed.addr) {
		t.Fatalf("placement after the plan: %+v", after)
	}
	maps.Copy(confirmed, publishNumbered(t, ctx, client, topic, "after", 50))
	consumeAll(t, after.Owner, topic, confirmed)

	// The killed node comes back: once the move is done, it drops the
	// replica it no longer holds, files included.
	replicaDir := filepath.Join(killed.dir, "queues", "="+topic)
	if _, err := os.Stat(replicaDir); err != nil {
		t.Fatalf("the killed node's replica directory: %v", err)
	}
	back := startClusterChild(t, bin, killed.dir, spare.gossip)
	deadline = time.Now().Add(30 * time.Second)
	for {
		_, err := os.Stat(replicaDir)
		if errors.Is(err, os.ErrNotExist) && strings.Contains(back.log(), "queue replicas moved to other nodes; files removed") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node back after the move still holds its old replica (%v):\n%s", err, back.log())
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The node, holding no replica now, still changes the queue's
	// settings: through the catalogue, for the nodes that hold it.
	if code, body := adminDo(t, http.MethodPatch, "http://"+back.admin+"/api/v1/queues/"+topic, map[string]any{"lease_ms": 2345}); code != http.StatusOK {
		t.Fatalf("PATCH on a node holding no replica: %d %s", code, body)
	}
	var remote struct {
		State  string `json:"state"`
		Config struct {
			LeaseMs int64 `json:"lease_ms"`
		} `json:"config"`
	}
	getJSONInto(t, "http://"+back.admin+"/api/v1/queues/"+topic, &remote)
	if remote.State != "remote" || remote.Config.LeaseMs != 2345 {
		t.Fatalf("the queue on a node holding no replica: %+v, want state remote and the new lease", remote)
	}
	awaitAll(t, []*clusterChild{spare, byAddr[after.Owner]}, "lease_ms 2345 on the replicas", func(c *clusterChild) bool {
		var v struct {
			Config struct {
				LeaseMs int64 `json:"lease_ms"`
			} `json:"config"`
		}
		getJSONInto(t, "http://"+c.admin+"/api/v1/queues/"+topic, &v)
		return v.Config.LeaseMs == 2345
	})
}

// Four `sinew serve --cluster` processes; a queue is placed on three of
// them. Its owner leaves (POST /api/v1/nodes/self/leave) with the fourth
// node as a spare: the plan moves its replica there, and the owner waits
// until the new replica votes and it has handed its lead to a wanted
// replica (a raft leadership transfer) before it drains and exits, so its
// exit costs the partition no election. Its log shows the lead moving
// before "replicas handed over"; every confirmed message is then consumed
// from the new owner, which removed the departed replica.
func TestClusterLeavingOwnerHandsItsLeadOver(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	nodes, spare := startThreeAndSpare(t, bin)
	byAddr, _, client := seededClient(t, nodes, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const topic = "handed-over"
	confirmed := publishNumbered(t, ctx, client, topic, "m", 200)
	before := queuePartition(t, nodes[0], topic)
	owner := byAddr[before.Owner]
	if len(before.Voters) != 3 || slices.Contains(before.Replicas, spare.addr) || owner == nil {
		t.Fatalf("placement %+v: want three voters on the first three nodes, one of them the owner", before)
	}
	stay := otherThan(nodes[:3], owner) // a node that holds a replica and stays
	leftAt := leaveAndExit(t, owner)
	t.Logf("the owner left and exited %v after the leave", time.Since(leftAt).Round(time.Millisecond))
	log := owner.log()
	// The partition's own "no longer leads" line comes from its goroutine
	// and may follow the leave's "replicas handed over" by a moment; the
	// stop's summary says whether the node still led anything when it
	// drained.
	transfer := strings.Index(log, "partition replica transfers its lead")
	stepped := strings.Index(log, "partition replica no longer leads")
	handed := strings.Index(log, "replicas handed over")
	if transfer < 0 || stepped < transfer || handed < transfer || !strings.Contains(log, "leads handed over\" component=cluster partitions_led=0 ") {
		t.Fatalf("the leaving owner's log does not show the lead handed over (at %d) and given up (at %d) before it drained leading nothing (\"replicas handed over\" at %d, then partitions_led=0):\n%s",
			transfer, stepped, handed, log)
	}
	maps.Copy(confirmed, publishNumbered(t, ctx, client, topic, "after", 50))
	deadline := time.Now().Add(30 * time.Second)
	var after partitionView
	for {
		after = queuePartition(t, stay, topic)
		if len(after.Voters) == 3 && slices.Contains(after.Voters, spare.addr) && !slices.Contains(after.Voters, owner.addr) &&
			after.Owner != "" && after.Owner != owner.addr {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the departed owner's replica not removed 30 s after the leave: %+v", after)
		}
		time.Sleep(50 * time.Millisecond) // polling real processes
	}
	consumeAll(t, after.Owner, topic, confirmed)
}

// Three `sinew serve --cluster` processes and a queue on all three: its
// owner leaves with no spare to hand its replica to. It hands its
// partition's lead to another replica (a raft leadership transfer) before
// it drains and exits, so its exit costs the partition no election: the
// others name the new owner as soon as it has exited, and the same owner
// and term 2 s later (an election timeout is 0.5 to 1 s). Every confirmed
// message is then consumed from the new owner.
func TestClusterLeavingOwnerWithoutASpareHandsItsLeadOver(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	nodes, _, _ := startThreeVoting(t, bin)
	byAddr, _, client := seededClient(t, nodes, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const topic = "no-spare"
	confirmed := publishNumbered(t, ctx, client, topic, "m", 200)
	before := queuePartition(t, nodes[0], topic)
	owner := byAddr[before.Owner]
	if len(before.Voters) != 3 || owner == nil {
		t.Fatalf("placement %+v: want three voters, one of them the owner", before)
	}
	stay := otherThan(nodes, owner)
	leaveAndExit(t, owner)
	exited := time.Now()
	log := owner.log()
	transfer := strings.Index(log, "partition replica transfers its lead")
	handed := strings.Index(log, "partition leads handed over; draining")
	if transfer < 0 || handed < transfer {
		t.Fatalf("the leaving owner's log does not show the lead handed over (at %d) before \"partition leads handed over\" (at %d):\n%s",
			transfer, handed, log)
	}
	// Without the transfer the others would still name the departed
	// owner here, until an election timeout passed.
	at := queuePartition(t, stay, topic)
	if at.Owner == "" || at.Owner == owner.addr {
		t.Fatalf("at the exit the partition's owner is %q (the departed owner is %s): the lead was not handed over", at.Owner, owner.addr)
	}
	for time.Since(exited) < 2*time.Second {
		time.Sleep(50 * time.Millisecond) // an election, were there one, would show by now
	}
	if later := queuePartition(t, stay, topic); later.Term != at.Term || later.Owner != at.Owner {
		t.Fatalf("the partition held an election after the owner exited: owner %s term %d at the exit, owner %s term %d 2 s later",
			at.Owner, at.Term, later.Owner, later.Term)
	}
	maps.Copy(confirmed, publishNumbered(t, ctx, client, topic, "after", 50))
	consumeAll(t, at.Owner, topic, confirmed)
}

// otherThan returns the first of nodes that is not c.
func otherThan(nodes []*clusterChild, c *clusterChild) *clusterChild {
	for _, n := range nodes {
		if n != c {
			return n
		}
	}
	return nil
}

// leaveAndExit makes c leave (POST /api/v1/nodes/self/leave) and waits
// until its process exits 0; it returns when the leave was asked.
func leaveAndExit(t *testing.T, c *clusterChild) time.Time {
	t.Helper()
	resp, err := http.Post("http://"+c.admin+"/api/v1/nodes/self/leave", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("leave: %s", resp.Status)
	}
	at := time.Now()
	if status := waitChild(t, c.child); status != 0 {
		t.Fatalf("the node that left exited %d:\n%s", status, c.log())
	}
	return at
}

// partitionView is one partition as GET /api/v1/queues/{topic} shows it.
type partitionView struct {
	Replicas []string `json:"replicas"`
	Owner    string   `json:"owner"`
	Term     uint64   `json:"term"`
	Voters   []string `json:"voters"`
	Learners []string `json:"learners"`
}

// queuePartition returns partition 0 of topic's queue as node c shows it
// (empty while c holds no replica of it).
func queuePartition(t *testing.T, c *clusterChild, topic string) partitionView {
	t.Helper()
	var q struct {
		Partitions []partitionView `json:"partitions"`
	}
	resp, err := http.Get("http://" + c.admin + "/api/v1/queues/" + topic)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return partitionView{}
	}
	if err := json.NewDecoder(resp.Body).Decode(&q); err != nil || len(q.Partitions) == 0 {
		t.Fatalf("queue view on %s: %+v %v", c.addr, q, err)
	}
	return q.Partitions[0]
}

// seededClient dials nodes[dial] with every node as a seed; it returns the
// nodes by client address, the addresses, and the client (closed at the
// test's end).
func seededClient(t *testing.T, nodes []*clusterChild, dial int) (map[string]*clusterChild, []string, *sinew.Client) {
	t.Helper()
	byAddr := map[string]*clusterChild{}
	var addrs []string
	for _, c := range nodes {
		byAddr[c.addr] = c
		addrs = append(addrs, c.addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, err := sinew.Dial(ctx, addrs[dial], fastReconnect(), sinew.WithSeeds(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return byAddr, addrs, client
}

// consumeAll subscribes at addr and completes messages until every body in
// confirmed was delivered (bounded); a delivered body never published fails
// the test.
func consumeAll(t *testing.T, addr, topic string, confirmed map[string]bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	consumer, err := sinew.Dial(ctx, addr, fastReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	drainWith(t, ctx, consumer, topic, confirmed)
}

// drainWith subscribes to topic through client and completes messages
// until every body in confirmed was delivered (bounded by ctx); a delivered
// body not in confirmed fails the test. It unsubscribes and returns how
// many times each body was delivered.
func drainWith(t *testing.T, ctx context.Context, client *sinew.Client, topic string, confirmed map[string]bool) map[string]int {
	t.Helper()
	sub, err := client.Subscribe(ctx, topic, sinew.WithPrefetch(64))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for n := 0; n < len(confirmed); {
		select {
		case m, ok := <-sub.Messages():
			if !ok {
				t.Fatalf("subscription to %s ended: %v", topic, sub.Err())
			}
			if !confirmed[string(m.Body)] {
				t.Fatalf("delivered %q from %s, never published there", m.Body, topic)
			}
			if got[string(m.Body)] == 0 {
				n++
			}
			got[string(m.Body)]++
			if err := m.Complete(ctx); err != nil {
				t.Fatalf("complete: %v", err)
			}
		case <-ctx.Done():
			var missing []string
			for b := range confirmed {
				if got[b] == 0 {
					missing = append(missing, b)
				}
			}
			sort.Strings(missing)
			t.Fatalf("%s: %d of %d confirmed messages not delivered, e.g. %v", topic, len(missing), len(confirmed), missing[:min(10, len(missing))])
		}
	}
	if err := sub.Unsubscribe(ctx); err != nil {
		t.Fatalf("unsubscribe %s: %v", topic, err)
	}
	return got
}

// publishNumbered publishes n messages "prefix-0" and on to topic, each
// confirmed (any error fails the test), and returns their bodies.
func publishNumbered(t *testing.T, ctx context.Context, client *sinew.Client, topic, prefix string, n int) map[string]bool {
	t.Helper()
	confirmed := make(map[string]bool, n)
	for i := range n {
		b := fmt.Sprintf("%s-%d", prefix, i)
		if _, err := client.Publish(ctx, topic, []byte(b)); err != nil {
			t.Fatal(err)
		}
		confirmed[b] = true
	}
	return confirmed
}

// startThreeAndSpare starts three voting nodes and a fourth, a learner of
// the controller that holds no replica yet; it returns the four (the spare
// last) and the spare.
func startThreeAndSpare(t *testing.T, bin string) ([]*clusterChild, *clusterChild) {
	t.Helper()
	nodes, id, three := startThreeVoting(t, bin)
	spare := startClusterChild(t, bin, t.TempDir(), nodes[0].gossip)
	id[spare] = nodesOf(t, spare.admin).Self.ID
	nodes = append(nodes, spare)
	four := append(slices.Clone(three), id[spare])
	for _, c := range nodes {
		awaitNodes(t, c, "four members", func(v nodesView) bool {
			return controllerAgrees(v, three, []string{id[spare]}, four, nil)
		})
	}
	return nodes, spare
}

// startThreeVoting is startThree, waiting until every node's controller has
// the three voters; it also returns their node ids in start order.
func startThreeVoting(t *testing.T, bin string) ([]*clusterChild, map[*clusterChild]string, []string) {
	t.Helper()
	nodes, id := startThree(t, bin)
	three := []string{id[nodes[0]], id[nodes[1]], id[nodes[2]]}
	for _, c := range nodes {
		awaitNodes(t, c, "three voters", func(v nodesView) bool { return controllerAgrees(v, three, nil, three, nil) })
	}
	return nodes, id, three
}

// A client that knows the cluster's nodes subscribes once and receives
// every partition of a queue whose partitions are owned by different
// nodes. Messages it holds unsettled when one owner is killed with -9 are
// then completed without an error: each settle goes to the partition's new
// owner by its lease reference, and is applied there (nothing is left
// ready or leased). Deliveries go on through the same subscription.
func TestClusterSubscriptionSpansOwnersAndSettlesThroughFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	nodes, _, _ := startThreeVoting(t, bin)
	byAddr, addrs, client := seededClient(t, nodes, 0)
	const topic, parts = "spanned", 3
	ctx, cancel := context.WithTimeout(context.Background(), 2*safetyTimeout)
	defer cancel()
	if _, err := client.DeclareQueue(ctx, topic, sinew.QueueConfig{Partitions: parts}); err != nil {
		t.Fatal(err)
	}
	type view struct {
		Partitions []struct {
			Owner    string `json:"owner"`
			Ready    int    `json:"ready"`
			Inflight int    `json:"inflight"`
		} `json:"partitions"`
	}
	owners := func(skip string) []string {
		t.Helper()
		out := make([]string, parts)
		for _, a := range addrs {
			if a == skip {
				continue
			}
			var v view
			getJSONInto(t, "http://"+byAddr[a].admin+"/api/v1/queues/"+topic, &v)
			for p, pv := range v.Partitions {
				if pv.Owner == a {
					out[p] = a
				}
			}
		}
		return out
	}
	// The preferred owners take their partitions' leads: at once, or
	// after a short hold-down when a replica opened a moment late.
	var own []string
	distinct := map[string]bool{}
	for deadline := time.Now().Add(10 * time.Second); ; {
		own = owners("")
		clear(distinct)
		for _, o := range own {
			distinct[o] = true
		}
		if (len(distinct) >= 2 && !distinct[""]) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // polling real processes
	}
	if len(distinct) < 2 || distinct[""] {
		t.Fatalf("partition owners %v: want owners on at least two nodes (placement rotates preferred owners)", own)
	}
	sub, err := client.Subscribe(ctx, topic, sinew.WithPrefetch(256))
	if err != nil {
		t.Fatal(err)
	}
	const n = 60
	publish := func(prefix string) {
		t.Helper()
		for i := range n {
			if _, err := client.Publish(ctx, topic, []byte(fmt.Sprintf("%s-%d", prefix, i)), sinew.WithPartition(i%parts)); err != nil {
				t.Fatalf("publish %s-%d: %v", prefix, i, err)
			}
		}
	}
	receive := func(prefix string) []*sinew.Message {
		t.Helper()
		var got []*sinew.Message
		seen := map[uint32]bool{}
		for len(got) < n {
			select {
			case m, ok := <-sub.Messages():
				if !ok {
					t.Fatalf("subscription ended: %v", sub.Err())
				}
				if !strings.HasPrefix(string(m.Body), prefix+"-") {
					t.Fatalf("delivered %q (attempt %d), want only %s-* now", m.Body, m.Attempt, prefix)
				}
				got = append(got, m)
				seen[m.Partition] = true
			case <-ctx.Done():
				t.Fatalf("%d of %d %s messages delivered through one subscription; partitions seen %v", len(got), n, prefix, seen)
			}
		}
		if len(seen) != parts {
			t.Fatalf("partitions delivered %v, want all %d", seen, parts)
		}
		return got
	}
	publish("before")
	held := receive("before")

	victim := own[0]
	killed := byAddr[victim]
	if err := killed.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed.cmd.Wait()
	killedAt := time.Now()
	// Every held message completes: those of the killed node's partitions
	// through their new owners.
	for _, m := range held {
		if err := m.Complete(ctx); err != nil {
			t.Fatalf("complete %q (partition %d) after its owner %s was killed: %v", m.Body, m.Partition, victim, err)
		}
	}
	t.Logf("owner %s killed with -9: %d held messages completed, the last %v after the kill", victim, len(held), time.Since(killedAt).Round(time.Millisecond))

	publish("after")
	for _, m := range receive("after") {
		if err := m.Complete(ctx); err != nil {
			t.Fatalf("complete %q: %v", m.Body, err)
		}
	}
	// The settles took effect at the owners: nothing is ready or leased.
	deadline := time.Now().Add(safetyTimeout)
	for {
		own = owners(victim)
		left := 0
		for _, a := range addrs {
			if a == victim {
				continue
			}
			var v view
			getJSONInto(t, "http://"+byAddr[a].admin+"/api/v1/queues/"+topic, &v)
			for p, pv := range v.Partitions {
				if own[p] == a {
					left += pv.Ready + pv.Inflight
				}
			}
		}
		if left == 0 && !slices.Contains(own, "") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages still ready or leased at the owners %v after every complete returned nil", left, own)
		}
		time.Sleep(50 * time.Millisecond) // polling real processes
	}
	select {
	case m := <-sub.Messages():
		t.Fatalf("delivered %q (attempt %d) again after its complete returned nil", m.Body, m.Attempt)
	default:
	}
}
