package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
)

// moveView is the part of GET /api/v1/moves/{id} the tests read.
type moveView struct {
	ID          uint64 `json:"id"`
	Topic       string `json:"topic"`
	From        string `json:"from"`
	To          string `json:"to"`
	State       string `json:"state"`
	Reason      string `json:"reason"`
	Cancellable bool   `json:"cancellable"`
	EndedAt     uint64 `json:"ended_at"`
	Partitions  []struct {
		Step string  `json:"step"`
		Lag  *uint64 `json:"lag"`
	} `json:"partitions"`
}

// startMove asks node c's API to move topic's replica from node from
// (""): the controller picks) to node to, and returns the move.
func startMove(t *testing.T, c *clusterChild, topic, from, to string) moveView {
	t.Helper()
	code, body := adminDo(t, http.MethodPost, "http://"+c.admin+"/api/v1/moves", map[string]any{"topic": topic, "from": from, "to": to})
	if code != http.StatusAccepted {
		t.Fatalf("POST /api/v1/moves %s %s -> %s: %d %s", topic, from, to, code, body)
	}
	var m moveView
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// awaitMove polls move id on node c until it ends (bounded) and returns it
// with the states it was seen in, in order.
func awaitMove(t *testing.T, c *clusterChild, id uint64, bound time.Duration) (moveView, []string) {
	t.Helper()
	var seen []string
	deadline := time.Now().Add(bound)
	for {
		var m moveView
		code, body := adminDo(t, http.MethodGet, fmt.Sprintf("http://%s/api/v1/moves/%d", c.admin, id), nil)
		if code == http.StatusOK {
			if err := json.Unmarshal(body, &m); err != nil {
				t.Fatal(err)
			}
			step := m.State
			for _, p := range m.Partitions {
				if p.Lag != nil {
					step += fmt.Sprintf("(lag %d)", *p.Lag)
				}
			}
			if len(seen) == 0 || seen[len(seen)-1] != step {
				seen = append(seen, step)
			}
			if m.EndedAt != 0 {
				return m, seen
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("move %d has not ended within %v on %s: states seen %v; last answer %d %s", id, bound, c.addr, seen, code, body)
		}
		time.Sleep(20 * time.Millisecond) // polling a real process
	}
}

// queueOwner returns the client address of topic's partition 0 owner as
// node c sees it, and its replicas.
func queueOwner(t *testing.T, c *clusterChild, topic string) (string, []string, []string, []string) {
	t.Helper()
	var v struct {
		Partitions []struct {
			Owner    string   `json:"owner"`
			Replicas []string `json:"replicas"`
			Voters   []string `json:"voters"`
			Learners []string `json:"learners"`
		} `json:"partitions"`
	}
	getJSONInto(t, "http://"+c.admin+"/api/v1/queues/"+topic, &v)
	if len(v.Partitions) == 0 {
		return "", nil, nil, nil
	}
	p := v.Partitions[0]
	return p.Owner, p.Replicas, p.Voters, p.Learners
}

// confirms records, per topic, when each publish was confirmed.
type confirms struct {
	mu     sync.Mutex
	at     map[string][]time.Time
	bodies []string
	errs   []error
}

// gapsIn returns the longest gap between two confirms of any topic that
// ends within [from, to].
func (c *confirms) longestGap(from, to time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var worst time.Duration
	for _, ts := range c.at {
		for i := 1; i < len(ts); i++ {
			if ts[i].Before(from) || ts[i].After(to) {
				continue
			}
			worst = max(worst, ts[i].Sub(ts[i-1]))
		}
	}
	return worst
}

// threeWithQueuesThenSpare starts three voting nodes, creates the queues
// (topic: partitions) on them, then starts a fourth node, which holds no
// replica, and waits until every controller holds it; it returns the four
// (the spare last) and the spare.
func threeWithQueuesThenSpare(t *testing.T, bin string, queues map[string]int) ([]*clusterChild, *clusterChild) {
	t.Helper()
	nodes, _, _ := startThreeVoting(t, bin)
	for topic, parts := range queues {
		if code, body := adminDo(t, http.MethodPut, "http://"+nodes[0].admin+"/api/v1/queues/"+topic, map[string]any{"partitions": parts}); code != http.StatusCreated {
			t.Fatalf("PUT queue %s: %d %s", topic, code, body)
		}
	}
	spare := startClusterChild(t, bin, t.TempDir(), nodes[0].gossip)
	spareID := nodesOf(t, spare.admin).Self.ID
	all := append(slices.Clone(nodes), spare)
	awaitAll(t, all, "every node's controller holds the fourth node, and every other node sees it alive", func(c *clusterChild) bool {
		v := nodesOf(t, c.admin)
		return v.Controller != nil && slices.Contains(slices.Concat(v.Controller.Voters, v.Controller.Learners), spareID) &&
			(c == spare || v.state(spareID) == "alive")
	})
	return all, spare
}

// TestClusterOperatorMovesUnderLoad: three nodes hold three queues of one
// partition each; a producer per queue publishes and a consumer completes
// throughout. A fourth node joins, and an operator moves each queue's
// owner replica to it, one after the other (POST /api/v1/moves): the
// target is added as a learner, catches up and votes, the source hands its
// lead over and is removed. No publish fails, nothing confirmed is lost,
// nothing is stored twice or delivered again after its complete; the
// longest pause in confirms around each move is measured (goal: at most
// 2 s, median at most 1 s). The rebalancer leaves the moved (pinned)
// queues alone afterwards.
func TestClusterOperatorMovesUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	nodes, id, _ := startThreeVoting(t, bin)
	byAddr, _, client := seededClient(t, nodes, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	topics := []string{"move-a", "move-b", "move-c"}
	for _, topic := range topics {
		if _, err := client.DeclareQueue(ctx, topic, sinew.QueueConfig{Partitions: 1}); err != nil {
			t.Fatal(err)
		}
	}

	// One producer per queue until told to stop.
	cf := &confirms{at: map[string][]time.Time{}}
	stop := make(chan struct{})
	var pubs sync.WaitGroup
	for _, topic := range topics {
		pubs.Add(1)
		go func() {
			defer pubs.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				b := fmt.Sprintf("%s-%d", topic, i)
				pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
				_, err := client.Publish(pctx, topic, []byte(b))
				pcancel()
				now := time.Now()
				cf.mu.Lock()
				if err != nil {
					cf.errs = append(cf.errs, fmt.Errorf("publish %s: %w", b, err))
					cf.mu.Unlock()
					return
				}
				cf.at[topic] = append(cf.at[topic], now)
				cf.bodies = append(cf.bodies, b)
				cf.mu.Unlock()
			}
		}()
	}
	// One consumer completes everything, through its own connection.
	consumer, err := sinew.Dial(ctx, nodes[1].addr, fastReconnect(), sinew.WithSeeds(nodes[0].addr, nodes[1].addr, nodes[2].addr))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	type delivery struct {
		partition uint32
		offset    uint64
		attempt   uint32
	}
	var cmu sync.Mutex
	got := map[string][]delivery{}
	completed := map[string]bool{}
	settledAgain := 0
	var consumeErrs []error
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	var cons sync.WaitGroup
	for _, topic := range topics {
		sub, err := consumer.Subscribe(ctx, topic, sinew.WithPrefetch(64))
		if err != nil {
			t.Fatal(err)
		}
		cons.Add(1)
		go func() {
			defer cons.Done()
			for {
				select {
				case m, ok := <-sub.Messages():
					if !ok {
						cmu.Lock()
						consumeErrs = append(consumeErrs, fmt.Errorf("subscription to %s ended: %v", topic, sub.Err()))
						cmu.Unlock()
						return
					}
					b := string(m.Body)
					cmu.Lock()
					got[b] = append(got[b], delivery{m.Partition, m.Offset, m.Attempt})
					if completed[b] {
						settledAgain++
					}
					cmu.Unlock()
					if err := m.Complete(cctx); err != nil {
						if cctx.Err() != nil {
							return
						}
						cmu.Lock()
						consumeErrs = append(consumeErrs, fmt.Errorf("complete %s: %w", b, err))
						cmu.Unlock()
						continue
					}
					cmu.Lock()
					completed[b] = true
					cmu.Unlock()
				case <-cctx.Done():
					return
				}
			}
		}()
	}

	// The fourth node joins under load.
	time.Sleep(time.Second) // let the load run before the join
	spare := startClusterChild(t, bin, t.TempDir(), nodes[0].gossip)
	spareID := nodesOf(t, spare.admin).Self.ID
	all := append(slices.Clone(nodes), spare)
	awaitAll(t, all, "every node's controller holds the fourth node, and every other node sees it alive", func(c *clusterChild) bool {
		v := nodesOf(t, c.admin)
		return v.Controller != nil && slices.Contains(slices.Concat(v.Controller.Voters, v.Controller.Learners), spareID) &&
			(c == spare || v.state(spareID) == "alive")
	})

	// Move each queue's owner replica to the new node, one at a time.
	type moved struct {
		topic      string
		took       time.Duration
		longestGap time.Duration
		states     []string
	}
	var results []moved
	for _, topic := range topics {
		owner, _, _, _ := queueOwner(t, nodes[0], topic)
		src := byAddr[owner]
		if src == nil {
			t.Fatalf("%s: owner %q is none of the three nodes", topic, owner)
		}
		start := time.Now()
		m := startMove(t, nodes[2], topic, id[src], spareID)
		if m.State != "catching_up" && m.State != "pending" || !m.Cancellable {
			t.Fatalf("a move just started: %+v", m)
		}
		end, states := awaitMove(t, src, m.ID, 60*time.Second)
		if end.State != "done" {
			t.Fatalf("move of %s ended %s (%s); states seen %v", topic, end.State, end.Reason, states)
		}
		took := time.Since(start)
		time.Sleep(time.Second) // confirms after the move count toward its pause
		results = append(results, moved{topic, took, cf.longestGap(start, time.Now()), states})
		// The new node votes in the queue's group, the source is gone.
		awaitAll(t, all, topic+" votes on the new node and not on its source", func(c *clusterChild) bool {
			_, reps, voters, learners := queueOwner(t, c, topic)
			if len(reps) != 3 || !slices.Contains(reps, spare.addr) || slices.Contains(reps, src.addr) {
				return false
			}
			if c == src || (c != spare && len(voters) == 0 && !slices.Contains(reps, c.addr)) {
				return true // a node holding no replica knows no configuration
			}
			return slices.Contains(voters, spare.addr) && !slices.Contains(voters, src.addr) && len(voters) == 3 && len(learners) == 0
		})
	}
	time.Sleep(2 * time.Second) // the load runs on after the moves
	close(stop)
	pubs.Wait()
	cf.mu.Lock()
	published, perrs := slices.Clone(cf.bodies), slices.Clone(cf.errs)
	cf.mu.Unlock()
	for _, err := range perrs {
		t.Error(err)
	}

	// Every confirmed message reaches the consumer.
	deadline := time.Now().Add(60 * time.Second)
	for {
		cmu.Lock()
		missing := 0
		for _, b := range published {
			if len(got[b]) == 0 {
				missing++
			}
		}
		cmu.Unlock()
		if missing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d confirmed messages never delivered", missing, len(published))
		}
		time.Sleep(50 * time.Millisecond) // the consumer runs on its own
	}
	time.Sleep(500 * time.Millisecond) // a late redelivery would show
	ccancel()
	cons.Wait()
	cmu.Lock()
	defer cmu.Unlock()
	storedTwice, redelivered := 0, 0
	for _, b := range published {
		ds := got[b]
		offsets := map[[2]uint64]bool{}
		for _, d := range ds {
			offsets[[2]uint64{uint64(d.partition), d.offset}] = true
		}
		if len(offsets) > 1 {
			storedTwice++
		}
		if len(ds) > 1 {
			redelivered++
		}
	}
	isPublished := make(map[string]bool, len(published))
	for _, b := range published {
		isPublished[b] = true
	}
	for b := range got {
		if !isPublished[b] && len(perrs) == 0 {
			t.Errorf("delivered %q, never confirmed", b)
		}
	}
	gaps := make([]time.Duration, len(results))
	for i, r := range results {
		gaps[i] = r.longestGap
		t.Logf("move of %s: %v to done; longest pause in confirms around it %v; states seen %v", r.topic, r.took.Round(time.Millisecond),
			r.longestGap.Round(time.Millisecond), r.states)
	}
	sort.Slice(gaps, func(i, j int) bool { return gaps[i] < gaps[j] })
	t.Logf("published and confirmed %d; lost 0 of them; stored twice %d; delivered again after a complete %d; delivered more than once %d; publish errors %d, consumer errors %d; longest pause %v, median of the moves' longest pauses %v",
		len(published), storedTwice, settledAgain, redelivered, len(perrs), len(consumeErrs), gaps[len(gaps)-1].Round(time.Millisecond), gaps[len(gaps)/2].Round(time.Millisecond))
	if storedTwice != 0 || settledAgain != 0 || len(consumeErrs) != 0 {
		t.Errorf("stored twice %d, settled again %d, consumer errors %v", storedTwice, settledAgain, consumeErrs)
	}
	if gaps[len(gaps)-1] > 2*time.Second || gaps[len(gaps)/2] > time.Second {
		t.Errorf("longest pause %v (goal <= 2 s), median %v (goal <= 1 s)", gaps[len(gaps)-1], gaps[len(gaps)/2])
	}
	// The moved queues are pinned: nothing moves them back once every
	// node has been live for the rebalancer's hold-off.
	type pinnedView struct {
		Moves  []moveView `json:"moves"`
		Pinned []struct {
			Topic string `json:"topic"`
		} `json:"pinned"`
	}
	var mv pinnedView
	getJSONInto(t, "http://"+spare.admin+"/api/v1/moves", &mv)
	if len(mv.Moves) != len(topics) || len(mv.Pinned) != len(topics) {
		t.Errorf("the new node lists %d moves and %d pinned queues, want %d of each: %+v", len(mv.Moves), len(mv.Pinned), len(topics), mv)
	}
	// An operator hands one back to the rebalancer through the CLI.
	if out, err := exec.Command(bin, "admin", "partition", "unpin", "--admin-addr", nodes[1].admin, "--topic", topics[0]).CombinedOutput(); err != nil {
		t.Fatalf("sinew admin partition unpin: %v\n%s", err, out)
	}
	getJSONInto(t, "http://"+nodes[1].admin+"/api/v1/moves", &mv)
	for _, p := range mv.Pinned {
		if p.Topic == topics[0] {
			t.Errorf("%s is still pinned after the unpin: %+v", topics[0], mv.Pinned)
		}
	}
	if len(mv.Pinned) != len(topics)-1 {
		t.Errorf("pinned after one unpin: %+v, want %d", mv.Pinned, len(topics)-1)
	}
	out, err := exec.Command(bin, "admin", "partition", "moves", "--admin-addr", nodes[1].admin).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "pinned (") || !strings.Contains(string(out), "done") {
		t.Errorf("sinew admin partition moves: %v\n%s", err, out)
	}
	t.Logf("sinew admin partition moves:\n%s", out)
}

// TestClusterOperatorMoveCancelAndBadInput: a move is cancelled while it
// catches up (its target is frozen, so it cannot catch up): the queue keeps
// its three replicas, the target's learner is removed, and the target
// holds nothing of it. Bad requests get typed errors over HTTP and from
// the CLI (a non-zero exit with a clear message).
func TestClusterOperatorMoveCancelAndBadInput(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	const topic = "cancelled"
	nodes, spare := threeWithQueuesThenSpare(t, bin, map[string]int{topic: 1, "wide": 2})
	three := nodes[:3]
	spareID := nodesOf(t, spare.admin).Self.ID
	_, _, client := seededClient(t, three, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	confirmed := publishNumbered(t, ctx, client, topic, "before", 200)

	// Bad input over HTTP: each gets its status and code.
	api := "http://" + nodes[0].admin + "/api/v1/moves"
	for _, tc := range []struct {
		body   map[string]any
		status int
		code   string
	}{
		{map[string]any{"to": spareID}, 400, "bad_request"},
		{map[string]any{"topic": topic}, 400, "bad_request"},
		{map[string]any{"topic": topic, "to": spareID, "bogus": 1}, 400, "bad_request"},
		{map[string]any{"topic": "nope", "to": spareID}, 404, "not_found"},
		{map[string]any{"topic": topic, "to": "ffffffffffff"}, 404, "unknown_node"},
		{map[string]any{"topic": topic, "to": spareID, "partition": 3}, 404, "unknown_partition"},
		{map[string]any{"topic": "wide", "to": spareID, "partition": 1}, 400, "partition_move_per_queue"},
		{map[string]any{"topic": topic, "to": nodes[1].addr}, 409, "already_a_replica"},
		{map[string]any{"topic": topic, "from": spare.addr, "to": spare.addr}, 409, "already_a_replica"},
	} {
		code, body := adminDo(t, http.MethodPost, api, tc.body)
		var eb struct {
			Code  string `json:"code"`
			Error string `json:"error"`
		}
		if err := json.Unmarshal(body, &eb); err != nil || code != tc.status || eb.Code != tc.code || eb.Error == "" {
			t.Errorf("POST %v: %d %s, want %d %s", tc.body, code, body, tc.status, tc.code)
		}
	}
	for _, tc := range []struct{ method, path string }{
		{http.MethodGet, "/api/v1/moves/12345678"},
		{http.MethodPost, "/api/v1/moves/12345678/cancel"},
	} {
		if code, body := adminDo(t, tc.method, "http://"+nodes[0].admin+tc.path, nil); code != 404 || !strings.Contains(string(body), "unknown_move") {
			t.Errorf("%s %s: %d %s, want 404 unknown_move", tc.method, tc.path, code, body)
		}
	}
	// The CLI: non-zero exits with the API's code in one line.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--topic", topic, "--to", "ffffffffffff"}, "unknown_node (HTTP 404)"},
		{[]string{"--topic", "wide", "--partition", "1", "--to", spareID}, "partition_move_per_queue (HTTP 400)"},
		{[]string{"--topic", topic, "--to", nodes[1].addr}, "already_a_replica (HTTP 409)"},
		{[]string{"--to", spareID}, "--topic is required"},
	} {
		cmd := exec.Command(bin, append([]string{"admin", "partition", "move", "--admin-addr", nodes[0].admin}, tc.args...)...)
		out, err := cmd.CombinedOutput()
		if err == nil || strings.Contains(string(out), "panic") || !strings.Contains(string(out), tc.want) {
			t.Errorf("sinew admin partition move %v: %v\n%s\nwant a failure with %q", tc.args, err, out, tc.want)
		}
	}

	// Freeze the target, then move to it and cancel: it cannot catch up.
	if err := spare.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	m := startMove(t, nodes[0], topic, "", spareID)
	code, body := adminDo(t, http.MethodPost, fmt.Sprintf("%s/%d/cancel", api, m.ID), map[string]any{"reason": "test"})
	if err := spare.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if code != http.StatusOK {
		t.Fatalf("cancel: %d %s", code, body)
	}
	var cm moveView
	if err := json.Unmarshal(body, &cm); err != nil || cm.State != "cancelled" || cm.Reason != "test" {
		t.Fatalf("cancel answered %s, want the move cancelled", body)
	}
	// Cancelling again is refused: the move ended.
	if code, body := adminDo(t, http.MethodPost, fmt.Sprintf("%s/%d/cancel", api, m.ID), nil); code != 409 || !strings.Contains(string(body), "move_ended") {
		t.Errorf("a second cancel: %d %s, want 409 move_ended", code, body)
	}
	awaitAll(t, three, "the queue votes on its three nodes, with no learner", func(c *clusterChild) bool {
		_, reps, voters, learners := queueOwner(t, c, topic)
		return len(reps) == 3 && len(voters) == 3 && len(learners) == 0 && !slices.Contains(voters, spare.addr) && !slices.Contains(reps, spare.addr)
	})
	// The CLI lists it.
	out, err := exec.Command(bin, "admin", "partition", "moves", "--admin-addr", nodes[1].admin).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "cancelled (test)") {
		t.Errorf("sinew admin partition moves: %v\n%s", err, out)
	}
	maps := publishNumbered(t, ctx, client, topic, "after", 50)
	for b := range maps {
		confirmed[b] = true
	}
	drainWith(t, ctx, client, topic, confirmed)
}

// TestClusterOperatorMoveSurvivesAKilledController: the node leading the
// controller is killed with -9 while a move runs and started again; a new
// controller leader carries the move to its end, and every confirmed
// message is still there. The CLI starts the move and waits for it.
func TestClusterOperatorMoveSurvivesAKilledController(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	moveThroughAKill(t, victimController)
}

// TestClusterOperatorMoveSurvivesAKilledSource: the move's source, the
// queue's owner, is killed with -9 mid-move and started again: the
// partition elects another owner, which carries the move on, and the
// source is removed as planned.
func TestClusterOperatorMoveSurvivesAKilledSource(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	moveThroughAKill(t, victimSource)
}

// TestClusterOperatorMoveSurvivesAKilledTarget: the move's target is
// killed with -9 while it catches up and started again at once: the move
// goes on and ends done, or, if the controller's leader held the target
// dead past the grace meanwhile, ends failed with the queue on its old
// replicas. Either way the placement agrees with the outcome and every
// confirmed message is there.
func TestClusterOperatorMoveSurvivesAKilledTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	moveThroughAKill(t, victimTarget)
}

// Which node moveThroughAKill kills.
const (
	victimController = iota // the controller's leader
	victimSource            // the queue's owner, named as the move's source
	victimTarget            // the move's target
)

// moveThroughAKill freezes a spare node, starts a move of a queue to it
// through the CLI (--wait), kills a node with -9 (see victim*), lets the
// spare go, starts the killed node again, and checks the move's outcome
// against the queue's placement, with every confirmed message there.
func moveThroughAKill(t *testing.T, victim int) {
	bin := buildSinew(t)
	const topic = "survivor"
	nodes, spare := threeWithQueuesThenSpare(t, bin, map[string]int{topic: 1})
	three := nodes[:3]
	spareID := nodesOf(t, spare.admin).Self.ID
	_, _, client := seededClient(t, nodes, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	confirmed := publishNumbered(t, ctx, client, topic, "before", 500)
	args := []string{"admin", "partition", "move", "--topic", topic, "--to", spareID[:12], "--wait", "--wait-timeout", "90s"}
	var killed *clusterChild
	switch victim {
	case victimController:
		v := nodesOf(t, nodes[0].admin)
		for _, c := range three {
			if nodesOf(t, c.admin).Self.ID == v.Controller.Leader {
				killed = c
			}
		}
		if killed == nil {
			t.Fatalf("the controller's leader %q is none of the three", v.Controller.Leader)
		}
	case victimSource:
		owner, _, _, _ := queueOwner(t, nodes[0], topic)
		for _, c := range three {
			if c.addr == owner {
				killed = c
			}
		}
		if killed == nil {
			t.Fatalf("the queue's owner %q is none of the three", owner)
		}
		args = append(args, "--from", killed.addr)
	case victimTarget:
		killed = spare
	}
	var other *clusterChild
	for _, c := range three {
		if c != killed {
			other = c
			break
		}
	}
	// Freeze the target so that the move is caught mid-way, start it
	// through the CLI, kill the victim, then let the target go.
	if err := spare.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cli := exec.Command(bin, append(args, "--admin-addr", other.admin)...)
	var out strings.Builder
	cli.Stdout, cli.Stderr = &out, &out
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	var mv struct {
		Moves []moveView `json:"moves"`
	}
	for deadline := time.Now().Add(20 * time.Second); len(mv.Moves) == 0; {
		if time.Now().After(deadline) {
			spare.cmd.Process.Signal(syscall.SIGCONT)
			t.Fatalf("the move did not start: %s", out.String())
		}
		time.Sleep(20 * time.Millisecond) // polling a real process
		getJSONInto(t, "http://"+other.admin+"/api/v1/moves", &mv)
	}
	if err := killed.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	waitChild(t, killed.child)
	if killed != spare {
		if err := spare.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	restarted := startClusterChild(t, bin, killed.dir, other.gossip)
	target := spare
	if killed == spare {
		target = restarted
	}
	cliErr := cli.Wait()
	t.Logf("the CLI's view of the move (exit %v):\n%s", cliErr, out.String())
	done := cliErr == nil && strings.Contains(out.String(), "done")
	switch {
	case done:
	case victim == victimTarget && cliErr != nil && strings.Contains(out.String(), "ended failed") && strings.Contains(out.String(), "is dead"):
		t.Logf("the target stayed dead past the grace: the move failed, the queue keeps its replicas")
	default:
		t.Fatalf("the move did not end done: %v\n%s", cliErr, out.String())
	}
	live := []*clusterChild{restarted}
	for _, c := range nodes {
		if c != killed {
			live = append(live, c)
		}
	}
	awaitAll(t, live, "the queue votes on three nodes as the move's outcome says (as every node holding a replica sees it)", func(c *clusterChild) bool {
		_, reps, voters, learners := queueOwner(t, c, topic)
		if len(reps) != 3 || slices.Contains(reps, target.addr) != done {
			return false
		}
		if !slices.Contains(reps, c.addr) {
			return len(voters) == 0 // a node holding no replica knows no configuration
		}
		return len(voters) == 3 && len(learners) == 0 && slices.Contains(voters, target.addr) == done
	})
	_, _, c2 := seededClient(t, live, 0)
	drainWith(t, ctx, c2, topic, confirmed)
}
