package e2e_test

import (
	"testing"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

type loadNodesView struct {
	Nodes []struct {
		ID    string `json:"id"`
		State string `json:"state"`
		Load  *struct {
			PartitionsLed uint32 `json:"partitions_led"`
			Backlog       uint64 `json:"backlog"`
			AppendRate    uint32 `json:"append_rate"`
			AgeMs         int64  `json:"age_ms"`
			Stale         bool   `json:"stale"`
		} `json:"load"`
	} `json:"nodes"`
}

// Two `sinew serve --cluster` processes tell each other their load over
// gossip: once messages wait in a queue, GET /api/v1/nodes on each node
// shows the other's last report, fresh, and between them the partitions
// led and the messages waiting.
func TestClusterNodesReportLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	n1 := startClusterChild(t, bin, t.TempDir())
	n2 := startClusterChild(t, bin, t.TempDir(), n1.gossip)
	for _, c := range []*clusterChild{n1, n2} {
		awaitNodes(t, c, "each node sees the other alive", func(v nodesView) bool { return len(v.Nodes) == 1 && v.Nodes[0].State == "alive" })
	}
	const published = 5
	confirmed := 0
	deadline := time.Now().Add(safetyTimeout)
	for confirmed < published {
		for _, c := range []*clusterChild{n1, n2} {
			if b, ok := rawPublish(t, c.addr, "load-e2e").(*protocol.PublishOK); ok && b != nil && confirmed < published {
				confirmed++
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d publishes confirmed within %v, want %d", confirmed, safetyTimeout, published)
		}
	}
	for {
		var led uint32
		var backlog uint64
		fresh := 0
		for _, c := range []*clusterChild{n1, n2} {
			var v loadNodesView
			getJSONInto(t, "http://"+c.admin+"/api/v1/nodes", &v)
			for _, n := range v.Nodes {
				if l := n.Load; l != nil && !l.Stale && l.AgeMs >= 0 && l.AgeMs <= 6000 {
					fresh++
					led += l.PartitionsLed
					backlog += l.Backlog
				}
			}
		}
		if fresh == 2 && led >= 1 && backlog >= published {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reports: %d fresh, %d partitions led, %d waiting; want 2 fresh, at least 1 led and %d waiting", fresh, led, backlog, published)
		}
		time.Sleep(100 * time.Millisecond) // polling real processes
	}
}
