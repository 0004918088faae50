package chaos_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew/test/chaos/harness"
)

// TestClusterNodeJoinsAndQueuesMove: a fourth node joins under load, then
// an operator moves the workload's queue (both partitions) and the probe
// queue onto whichever node does not hold them, over and over (POST
// /api/v1/moves naming the owner of partition 0 as the source, so that
// its lead is handed over too). The checker fails the run on anything
// lost, settled and delivered again, or stored twice; the fault fails on
// a move that does not end done, and on a pause in the probe's confirms
// around a move longer than 2 s.
func TestClusterNodeJoinsAndQueuesMove(t *testing.T) {
	var pauses []time.Duration
	runClusterScenario(t, clusterScenario{name: "cluster-join-move", every: 15 * time.Second, shortPhase: 35 * time.Second, fault: func(ctx context.Context, e *clusterEnv) error {
		p, err := joinThenMove(ctx, e)
		if p > 0 {
			pauses = append(pauses, p)
		}
		return err
	}})
	if len(pauses) == 0 {
		t.Fatal("no move was made")
	}
	s := slices.Clone(pauses)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	t.Logf("cluster-join-move: %d rounds of moves; the longest pause in the probe's confirms around each round %v; longest %v, median %v (goals: 2 s, 1 s)",
		len(pauses), pauses, s[len(s)-1], s[len(s)/2])
	if s[len(s)/2] > time.Second {
		t.Fatalf("the median of the rounds' longest pauses is %v, over 1 s", s[len(s)/2])
	}
}

// movePauseMax is the longest pause in confirms a round of moves may cause.
const movePauseMax = 2 * time.Second

// joinThenMove starts a fourth node on the first round, then moves the
// probe queue and the workload's queue to the node that holds neither,
// one after the other, while a probe publishes to the probe queue without
// a break; it returns the longest pause between two of the probe's
// confirms during the round.
func joinThenMove(ctx context.Context, e *clusterEnv) (time.Duration, error) {
	if len(e.nodes) == clusterNodes {
		if err := e.joinNode(ctx); err != nil {
			return 0, err
		}
	}
	var mu sync.Mutex
	var worst time.Duration
	var probeErr error
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := time.Now()
		for {
			select {
			case <-stop:
				return
			default:
			}
			pctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, err := e.probe.Publish(pctx, e.topic+"-probe", []byte("probe"))
			cancel()
			now := time.Now()
			mu.Lock()
			if err != nil {
				probeErr = err
				mu.Unlock()
				return
			}
			worst = max(worst, now.Sub(last))
			mu.Unlock()
			last = now
		}
	}()
	var moveErr error
	for _, topic := range []string{e.topic + "-probe", e.topic} {
		if moveErr = e.moveQueue(ctx, topic); moveErr != nil {
			break
		}
	}
	hold(context.Background(), 500*time.Millisecond) // confirms after the moves count too
	close(stop)
	<-done
	mu.Lock()
	defer mu.Unlock()
	if moveErr != nil {
		return worst, moveErr
	}
	if probeErr != nil {
		return worst, fmt.Errorf("probe publish during the moves: %w", probeErr)
	}
	if worst > movePauseMax {
		return worst, fmt.Errorf("the probe's confirms paused %v during the moves (at most %v)", worst, movePauseMax)
	}
	return worst, nil
}

// joinNode starts a node with a fresh data directory, joining through the
// running ones, and waits (bounded) until every other node sees it alive.
func (e *clusterEnv) joinNode(ctx context.Context) error {
	var seeds []string
	for _, n := range e.nodes {
		var v struct {
			Self struct {
				GossipAddr string `json:"gossip_addr"`
			} `json:"self"`
		}
		if n.Running() && getJSON(n, "/api/v1/nodes", &v) == nil && v.Self.GossipAddr != "" {
			seeds = append(seeds, v.Self.GossipAddr)
		}
	}
	if len(seeds) == 0 {
		return errors.New("no running node to join through")
	}
	gossip, err := harness.FreeAddr()
	if err != nil {
		return err
	}
	peer, err := harness.FreeAddr()
	if err != nil {
		return err
	}
	e.joined++
	b := newClusterNode(e.t, e.bin, filepath.Join(e.base, fmt.Sprintf("joined%d", e.joined)), nodeNet{gossip: gossip, peer: peer},
		func() []string { return seeds })
	if err := b.Start(); err != nil {
		return fmt.Errorf("start a new node: %w\n%s", err, b.StderrTail())
	}
	e.nodes = append(e.nodes, b)
	at := time.Now()
	deadline := at.Add(30 * time.Second)
	for i, n := range e.nodes {
		for {
			var v struct {
				Nodes []struct {
					State string `json:"state"`
				} `json:"nodes"`
				Controller struct {
					Nodes []struct {
						ClientAddr string `json:"client_addr"`
					} `json:"nodes"`
				} `json:"controller"`
			}
			alive, inTable := 0, false
			if getJSON(n, "/api/v1/nodes", &v) == nil {
				for _, m := range v.Nodes {
					if m.State == "alive" {
						alive++
					}
				}
				for _, m := range v.Controller.Nodes {
					inTable = inTable || m.ClientAddr == b.Addr()
				}
			}
			if inTable && (alive == len(e.nodes)-1 || i == len(e.nodes)-1) {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("node %s does not see the new node alive and in the controller's table within 30 s", n.Addr())
			}
			time.Sleep(50 * time.Millisecond) // polling real processes
		}
	}
	e.logf("a fourth node joined; every node sees it alive, and in the controller's table, %v after its start", time.Since(at).Round(time.Millisecond))
	return nil
}

// moveQueue moves topic's replica on the owner of its partition 0 to the
// running node that holds none, through POST /api/v1/moves on another
// node, and waits (bounded) until the move is done. A queue whose replicas
// the controller is moving itself (409 replicas_changing: the rebalancer
// acts on the new node too) is asked again.
func (e *clusterEnv) moveQueue(ctx context.Context, topic string) error {
	type queueView struct {
		Partitions []struct {
			Owner    string   `json:"owner"`
			Replicas []string `json:"replicas"`
		} `json:"partitions"`
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var q queueView
		var via *harness.Broker
		for _, n := range e.nodes {
			if n.Running() && getJSON(n, "/api/v1/queues/"+topic, &q) == nil && len(q.Partitions) > 0 && q.Partitions[0].Owner != "" {
				break
			}
			q = queueView{}
		}
		to, from := "", ""
		if len(q.Partitions) > 0 {
			from = q.Partitions[0].Owner
			for _, n := range e.nodes {
				if n.Running() && !slices.Contains(q.Partitions[0].Replicas, n.Addr()) {
					to = n.Addr()
				}
				if n.Running() && n.Addr() != from {
					via = n
				}
			}
		}
		if to != "" && via != nil {
			body, _ := json.Marshal(map[string]string{"topic": topic, "from": from, "to": to})
			resp, err := adminClient(via).Post("http://"+via.AdminAddr()+"/api/v1/moves", "application/json", bytes.NewReader(body))
			if err != nil {
				return fmt.Errorf("POST /api/v1/moves: %w", err)
			}
			out, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			var m struct {
				ID   uint64 `json:"id"`
				Code string `json:"code"`
			}
			_ = json.Unmarshal(out, &m)
			switch {
			case resp.StatusCode == http.StatusAccepted:
				return e.awaitMove(ctx, via, topic, m.ID, from, to)
			case resp.StatusCode != http.StatusConflict || (m.Code != "replicas_changing" && m.Code != "move_running" && m.Code != "node_not_live"):
				return fmt.Errorf("POST /api/v1/moves %s %s -> %s: %s %s", topic, from, to, resp.Status, out)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("could not start a move of %s within 60 s: %s", topic, queuesJSON(e.nodes[0]))
		}
		time.Sleep(200 * time.Millisecond) // the controller's own move ends first
	}
}

// awaitMove waits (bounded) until move id ends, and fails unless done.
func (e *clusterEnv) awaitMove(ctx context.Context, via *harness.Broker, topic string, id uint64, from, to string) error {
	at := time.Now()
	deadline := at.Add(60 * time.Second)
	var states []string
	for {
		var m struct {
			State   string `json:"state"`
			Reason  string `json:"reason"`
			EndedAt uint64 `json:"ended_at"`
		}
		if err := getJSON(via, fmt.Sprintf("/api/v1/moves/%d", id), &m); err == nil {
			if len(states) == 0 || states[len(states)-1] != m.State {
				states = append(states, m.State)
			}
			if m.EndedAt != 0 {
				if m.State != "done" {
					return fmt.Errorf("move %d of %s ended %s (%s)", id, topic, m.State, m.Reason)
				}
				e.logf("moved %s from %s to %s in %v: %v", topic, from, to, time.Since(at).Round(time.Millisecond), states)
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("move %d of %s has not ended within 60 s: %v", id, topic, states)
		}
		time.Sleep(50 * time.Millisecond) // polling a real process
	}
}
