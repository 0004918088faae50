package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// adminDo sends method url with body (nil: none) and returns the status and
// the body read.
func adminDo(t *testing.T, method, url string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, out
}

// awaitAll polls cond on every node until it holds on all (bounded: a
// real cluster applies a committed change within a few hundred ms).
func awaitAll(t *testing.T, nodes []*clusterChild, what string, cond func(c *clusterChild) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok := true
		for _, c := range nodes {
			ok = ok && cond(c)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not on every node within 20 s: %s", what)
		}
		time.Sleep(50 * time.Millisecond) // polling real processes
	}
}

// Three `sinew serve --cluster` processes and a queue of three partitions,
// each preferring another node as its owner. A queue's settings changed through one
// node's admin API reach every node's replica; a purge through one node
// empties every partition and counts them all; the runtime
// settings changed on one node are the same, same version, on all, and a
// change based on a stale version is refused everywhere; the queue deleted
// through a third node is gone from every node, its files included, and a
// publish afterwards makes a new, empty queue that serves as before.
func TestClusterQueueChangesAndRuntimeSettingsReachEveryNode(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	nodes, _, _ := startThreeVoting(t, bin)
	_, _, client := seededClient(t, nodes, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const topic = "changed"
	queueURL := func(c *clusterChild) string { return "http://" + c.admin + "/api/v1/queues/" + topic }
	// Three partitions: each node owns one.
	if code, body := adminDo(t, http.MethodPut, queueURL(nodes[0]), map[string]any{"partitions": 3}); code != http.StatusCreated {
		t.Fatalf("PUT queue: %d %s", code, body)
	}
	for i := range 20 {
		if _, err := client.Publish(ctx, topic, []byte(fmt.Sprintf("old-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	type queueView struct {
		Config struct {
			LeaseMs    int64 `json:"lease_ms"`
			MaxRetries int   `json:"max_retries"`
		} `json:"config"`
	}
	awaitAll(t, nodes, "the queue's replicas open", func(c *clusterChild) bool {
		code, _ := adminDo(t, http.MethodGet, queueURL(c), nil)
		return code == http.StatusOK
	})

	// Queue settings, through node 1.
	if code, body := adminDo(t, http.MethodPatch, queueURL(nodes[1]), map[string]any{"lease_ms": 4321, "max_retries": 7}); code != http.StatusOK {
		t.Fatalf("PATCH: %d %s", code, body)
	}
	awaitAll(t, nodes, "lease_ms 4321 and max_retries 7", func(c *clusterChild) bool {
		var v queueView
		getJSONInto(t, queueURL(c), &v)
		return v.Config.LeaseMs == 4321 && v.Config.MaxRetries == 7
	})

	// The preferred owners take their partitions' leads (a replica that
	// opened a moment late gets it after a short hold-down).
	awaitAll(t, nodes, "partition owners on several nodes", func(c *clusterChild) bool {
		var v struct {
			Partitions []struct {
				Owner string `json:"owner"`
			} `json:"partitions"`
		}
		getJSONInto(t, queueURL(c), &v)
		seen := map[string]bool{}
		for _, p := range v.Partitions {
			seen[p.Owner] = true
		}
		return len(v.Partitions) == 3 && !seen[""] && len(seen) >= 2
	})

	// Purge, through node 1: every partition's owner discards its part.
	code, body := adminDo(t, http.MethodPost, queueURL(nodes[1])+"/purge", nil)
	if code != http.StatusOK || !bytes.Contains(body, []byte(`"purged": 20`)) {
		t.Fatalf("purge: %d %s, want the 20 messages", code, body)
	}
	owners := map[string]bool{}
	awaitAll(t, nodes, "the queue empty on every replica", func(c *clusterChild) bool {
		var v struct {
			Ready      int `json:"ready"`
			Partitions []struct {
				Owner string `json:"owner"`
			} `json:"partitions"`
		}
		getJSONInto(t, queueURL(c), &v)
		for _, p := range v.Partitions {
			owners[p.Owner] = true
		}
		return v.Ready == 0
	})
	if len(owners) < 2 {
		t.Fatalf("partition owners %v: want several nodes, so that the purge spans owners", owners)
	}

	// Runtime settings, through node 2.
	type settingsView struct {
		Version uint64           `json:"version"`
		Values  map[string]int64 `json:"values"`
	}
	settingsURL := func(c *clusterChild) string { return "http://" + c.admin + "/api/v1/settings" }
	var first settingsView
	awaitAll(t, nodes, "one runtime settings version on every node", func(c *clusterChild) bool {
		var v settingsView
		getJSONInto(t, settingsURL(c), &v)
		if c == nodes[0] {
			first = v
		}
		return v.Version == first.Version
	})
	code, body = adminDo(t, http.MethodPut, settingsURL(nodes[2]), map[string]any{"version": first.Version, "values": map[string]int64{"connection.reconnect_grace_ms": 12345}})
	if code != http.StatusOK {
		t.Fatalf("PUT settings: %d %s", code, body)
	}
	awaitAll(t, nodes, "reconnect_grace_ms 12345", func(c *clusterChild) bool {
		var v settingsView
		getJSONInto(t, settingsURL(c), &v)
		return v.Version == first.Version+1 && v.Values["connection.reconnect_grace_ms"] == 12345
	})
	if code, body := adminDo(t, http.MethodPut, settingsURL(nodes[0]), map[string]any{"version": first.Version, "values": map[string]int64{"connection.reconnect_grace_ms": 1}}); code != http.StatusConflict {
		t.Fatalf("PUT on a stale version through another node: %d %s, want 409", code, body)
	}

	// Delete, through node 0's protocol connection... and node 2's admin API.
	var dirs []string
	for _, c := range nodes {
		dirs = append(dirs, filepath.Join(c.dir, "queues", "="+topic))
		if _, err := os.Stat(dirs[len(dirs)-1]); err != nil {
			t.Fatalf("replica directory: %v", err)
		}
	}
	if code, body := adminDo(t, http.MethodDelete, queueURL(nodes[2]), nil); code != http.StatusOK {
		t.Fatalf("DELETE: %d %s", code, body)
	}
	awaitAll(t, nodes, "the queue gone, files included", func(c *clusterChild) bool {
		code, _ := adminDo(t, http.MethodGet, queueURL(c), nil)
		_, err := os.Stat(filepath.Join(c.dir, "queues", "="+topic))
		return code == http.StatusNotFound && errors.Is(err, os.ErrNotExist)
	})
	if code, body := adminDo(t, http.MethodDelete, queueURL(nodes[0]), nil); code != http.StatusNotFound {
		t.Fatalf("second DELETE: %d %s, want 404", code, body)
	}
	// A publish makes a new queue; only the new message is there.
	if _, err := client.Publish(ctx, topic, []byte("new")); err != nil {
		t.Fatal(err)
	}
	sub, err := client.Subscribe(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe(context.Background())
	select {
	case m := <-sub.Messages():
		if string(m.Body) != "new" {
			t.Fatalf("delivered %q from the deleted queue", m.Body)
		}
		if err := m.Complete(ctx); err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the new queue's message was not delivered")
	}
	var v queueView
	getJSONInto(t, queueURL(nodes[0]), &v)
	if v.Config.LeaseMs == 4321 {
		t.Fatal("the new queue has the deleted one's settings")
	}
}
