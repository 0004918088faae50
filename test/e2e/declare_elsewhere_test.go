package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
)

// queueSeen is the part of GET /api/v1/queues/{topic} the declare test
// reads.
type queueSeen struct {
	PartitionCount int    `json:"partition_count"`
	State          string `json:"state"`
	Ready          int    `json:"ready"`
	Config         struct {
		MaxRetries int `json:"max_retries"`
	} `json:"config"`
	Partitions []struct {
		Replicas []string `json:"replicas"`
	} `json:"partitions"`
}

// getQueueSeen reads topic's view on node c; the status is returned with it.
func getQueueSeen(t *testing.T, c *clusterChild, topic string) (int, queueSeen, []byte) {
	t.Helper()
	code, body := adminDo(t, http.MethodGet, "http://"+c.admin+"/api/v1/queues/"+topic, nil)
	var v queueSeen
	if code == http.StatusOK {
		if err := json.Unmarshal(body, &v); err != nil {
			t.Fatalf("GET queue %s on %s: %v: %s", topic, c.addr, err, body)
		}
	}
	return code, v, body
}

// replicaNode returns a node of all that holds a replica of topic, and
// whether node via holds none, as via's view of the queue says.
func placedOn(t *testing.T, all []*clusterChild, via *clusterChild, topic string) (*clusterChild, bool) {
	t.Helper()
	code, v, body := getQueueSeen(t, via, topic)
	if code != http.StatusOK || len(v.Partitions) == 0 {
		t.Fatalf("GET queue %s through %s: %d %s", topic, via.addr, code, body)
	}
	reps := v.Partitions[0].Replicas
	var holder *clusterChild
	for _, c := range all {
		if slices.Contains(reps, c.addr) {
			holder = c
			break
		}
	}
	if holder == nil {
		t.Fatalf("queue %s: replicas %v are none of the nodes", topic, reps)
	}
	return holder, !slices.Contains(reps, via.addr)
}

// Four `sinew serve --cluster` processes (three voters and a node that
// joined later), replication factor 3: every queue leaves one node
// without a replica. A declaration sent to that node, through the admin
// API (PUT) and through the Go SDK connected to that node alone, creates
// the queue and answers success, as through any other node; the queue's
// other admin operations through that node work too: GET (state
// "remote"), a second PUT (200, not created), a PUT with another
// partition count (409), PATCH of its settings (reaching the replicas),
// a purge counting the messages of every partition, a read of its
// messages (503 not_owner naming a node with a replica), and DELETE.
func TestClusterAdminDeclareThroughANodeWithoutAReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	all, _ := threeWithQueuesThenSpare(t, bin, map[string]int{"first": 1})

	// Through the admin API: declare queues through each node in turn
	// until one is placed without the node it was declared through.
	var via, holder *clusterChild
	topic := ""
	for i := 0; i < 12 && via == nil; i++ {
		c := all[i%len(all)]
		name := fmt.Sprintf("http-%d", i)
		code, body := adminDo(t, http.MethodPut, "http://"+c.admin+"/api/v1/queues/"+name, map[string]any{"partitions": 2})
		if code != http.StatusCreated {
			t.Fatalf("PUT queue %s through %s: %d %s", name, c.addr, code, body)
		}
		var v queueSeen
		if err := json.Unmarshal(body, &v); err != nil || v.PartitionCount != 2 {
			t.Fatalf("PUT queue %s through %s answered %s (%v)", name, c.addr, body, err)
		}
		if h, elsewhere := placedOn(t, all, c, name); elsewhere {
			via, holder, topic = c, h, name
		}
	}
	if via == nil {
		t.Fatal("no queue of 12 was placed without the node it was declared through")
	}
	t.Logf("queue %s declared through %s, which holds no replica; %s does", topic, via.addr, holder.addr)

	code, v, body := getQueueSeen(t, via, topic)
	if code != http.StatusOK || v.State != "remote" || v.PartitionCount != 2 {
		t.Fatalf("GET queue %s through %s: %d %s", topic, via.addr, code, body)
	}
	if code, body := adminDo(t, http.MethodPut, "http://"+via.admin+"/api/v1/queues/"+topic, map[string]any{"partitions": 2}); code != http.StatusOK {
		t.Fatalf("second PUT of %s through %s: %d %s", topic, via.addr, code, body)
	}
	if code, body := adminDo(t, http.MethodPut, "http://"+via.admin+"/api/v1/queues/"+topic, map[string]any{"partitions": 3}); code != http.StatusConflict {
		t.Fatalf("PUT of %s with another partition count through %s: %d %s, want 409", topic, via.addr, code, body)
	}
	if code, body := adminDo(t, http.MethodPatch, "http://"+via.admin+"/api/v1/queues/"+topic, map[string]any{"max_retries": 7}); code != http.StatusOK {
		t.Fatalf("PATCH of %s through %s: %d %s", topic, via.addr, code, body)
	}
	awaitAll(t, []*clusterChild{holder}, "the replica holds the settings changed through the node without one", func(c *clusterChild) bool {
		code, v, _ := getQueueSeen(t, c, topic)
		return code == http.StatusOK && v.Config.MaxRetries == 7
	})

	// The SDK connected to the node without a replica alone.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client, err := sinew.Dial(ctx, via.addr, fastReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	const n = 20
	for i := range n {
		if _, err := client.Publish(ctx, topic, []byte(fmt.Sprintf("m-%d", i)), sinew.WithPartition(i%2)); err != nil {
			t.Fatalf("publish %d to %s through %s: %v", i, topic, via.addr, err)
		}
	}
	code, body = adminDo(t, http.MethodPost, "http://"+via.admin+"/api/v1/queues/"+topic+"/purge", nil)
	var pv struct {
		Purged int `json:"purged"`
	}
	if code != http.StatusOK || json.Unmarshal(body, &pv) != nil || pv.Purged != n {
		t.Fatalf("purge of %s through %s: %d %s, want %d purged", topic, via.addr, code, body, n)
	}
	code, body = adminDo(t, http.MethodGet, "http://"+via.admin+"/api/v1/queues/"+topic+"/messages?partition=0", nil)
	var eb struct {
		Code  string `json:"code"`
		Owner string `json:"owner"`
	}
	if code != http.StatusServiceUnavailable || json.Unmarshal(body, &eb) != nil || eb.Code != "not_owner" ||
		!slices.ContainsFunc(all, func(c *clusterChild) bool { return c.addr == eb.Owner && c != via }) {
		t.Fatalf("messages of %s through %s: %d %s, want 503 not_owner naming a node with a replica", topic, via.addr, code, body)
	}
	if code, body := adminDo(t, http.MethodDelete, "http://"+via.admin+"/api/v1/queues/"+topic, nil); code != http.StatusOK {
		t.Fatalf("DELETE of %s through %s: %d %s", topic, via.addr, code, body)
	}
	awaitAll(t, all, "the queue deleted through the node without a replica is gone everywhere", func(c *clusterChild) bool {
		code, _, _ := getQueueSeen(t, c, topic)
		return code == http.StatusNotFound
	})

}

// The same four nodes; through the Go SDK, a client per node, each
// connected to that node alone, declares queues of two partitions until
// one is placed without the node it was declared through: the
// declaration answers created, a second one not created; the client
// publishes to the queue, consumes every message once, purges it and
// deletes it, all through that node; first publishes to new queues
// through it create them.
func TestClusterSDKDeclareThroughANodeWithoutAReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	all, _ := threeWithQueuesThenSpare(t, bin, map[string]int{"first": 1})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 20
	var sdkVia *clusterChild
	var sdkClient *sinew.Client
	sdkTopic := ""
	for i := 0; i < 12 && sdkVia == nil; i++ {
		c := all[i%len(all)]
		cl, err := sinew.Dial(ctx, c.addr, fastReconnect())
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("sdk-%d", i)
		info, err := cl.DeclareQueue(ctx, name, sinew.QueueConfig{Partitions: 2})
		if err != nil {
			cl.Close()
			t.Fatalf("DeclareQueue %s through %s: %v", name, c.addr, err)
		}
		if !info.Created || info.Partitions != 2 {
			cl.Close()
			t.Fatalf("DeclareQueue %s through %s: %+v, want created with 2 partitions", name, c.addr, info)
		}
		if _, elsewhere := placedOn(t, all, c, name); elsewhere {
			sdkVia, sdkClient, sdkTopic = c, cl, name
			defer cl.Close()
		} else {
			cl.Close()
		}
	}
	if sdkVia == nil {
		t.Fatal("no queue of 12 declared through the SDK was placed without the node it was declared through")
	}
	t.Logf("queue %s declared through the SDK on %s, which holds no replica", sdkTopic, sdkVia.addr)
	info, err := sdkClient.DeclareQueue(ctx, sdkTopic, sinew.QueueConfig{Partitions: 2, MaxRetries: 4})
	if err != nil || info.Created || info.Partitions != 2 {
		t.Fatalf("second DeclareQueue %s through %s: %+v %v", sdkTopic, sdkVia.addr, info, err)
	}
	confirmed := map[string]bool{}
	for i := range n {
		b := fmt.Sprintf("s-%d", i)
		if _, err := sdkClient.Publish(ctx, sdkTopic, []byte(b), sinew.WithPartition(i%2)); err != nil {
			t.Fatalf("publish %d to %s through %s: %v", i, sdkTopic, sdkVia.addr, err)
		}
		confirmed[b] = true
	}
	got := drainWith(t, ctx, sdkClient, sdkTopic, confirmed)
	for b, k := range got {
		if k != 1 {
			t.Fatalf("%s delivered %d times", b, k)
		}
	}
	for i := range 3 {
		if _, err := sdkClient.Publish(ctx, sdkTopic, []byte(fmt.Sprintf("p-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if purged, err := sdkClient.PurgeQueue(ctx, sdkTopic, ""); err != nil || purged != 3 {
		t.Fatalf("PurgeQueue %s through %s: %d %v, want 3", sdkTopic, sdkVia.addr, purged, err)
	}
	if err := sdkClient.DeleteQueue(ctx, sdkTopic, ""); err != nil {
		t.Fatalf("DeleteQueue %s through %s: %v", sdkTopic, sdkVia.addr, err)
	}

	// First use: publishes to new queues through the same node create
	// them, whether or not the placement leaves that node out.
	left := 0
	for i := range 4 {
		name := fmt.Sprintf("auto-%d", i)
		if _, err := sdkClient.Publish(ctx, name, []byte("first")); err != nil {
			t.Fatalf("first publish to %s through %s: %v", name, sdkVia.addr, err)
		}
		if _, elsewhere := placedOn(t, all, sdkVia, name); elsewhere {
			left++
		}
	}
	t.Logf("%d of 4 queues created by a first publish through %s were placed without it", left, sdkVia.addr)
}
