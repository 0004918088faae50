package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/protocol"
)

// handoverPartitions is the partitions of the queue a stop trial publishes
// to: spread-first placement prefers another node as each one's owner.
const handoverPartitions = 3

// stopTrial is one run of an owner's SIGTERM under load (runStopTrial).
type stopTrial struct {
	nodes   []*clusterChild
	stopped *clusterChild // the node sent SIGTERM
	led     int           // partitions it owned when stopped
	status  int           // its exit status
	exit    time.Duration // from SIGTERM to its exit
	// pause is the longest time one publisher waited for a confirm from
	// the SIGTERM to the end of publishing (counted from its last confirm
	// before the SIGTERM).
	pause     time.Duration
	confirmed map[string]bool
	errs      []string
}

// partitionsOf returns every partition of topic's queue as node c shows it.
func partitionsOf(t *testing.T, c *clusterChild, topic string) []partitionView {
	t.Helper()
	var q struct {
		Partitions []partitionView `json:"partitions"`
	}
	getJSONInto(t, "http://"+c.admin+"/api/v1/queues/"+topic, &q)
	return q.Partitions
}

// awaitPreferredOwners waits until every partition of topic's queue (of
// handoverPartitions) is owned by its preferred owner as node c shows it:
// each partition's first leader hands the lead to the placement's first
// replica within a second or two. It returns the partitions.
func awaitPreferredOwners(t *testing.T, c *clusterChild, topic string) []partitionView {
	t.Helper()
	deadline := time.Now().Add(safetyTimeout)
	for {
		parts := partitionsOf(t, c, topic)
		settled := len(parts) == handoverPartitions
		for _, p := range parts {
			settled = settled && p.Owner != "" && len(p.Replicas) == 3 && p.Owner == p.Replicas[0]
		}
		if settled {
			return parts
		}
		if time.Now().After(deadline) {
			t.Fatalf("the partitions' owners did not settle on their preferred owners: %+v", parts)
		}
		time.Sleep(50 * time.Millisecond) // polling real processes
	}
}

// runStopTrial starts three cluster nodes of bin, declares a queue of
// handoverPartitions partitions, and waits until each is owned by its
// preferred owner. One publisher per partition then publishes without a
// break (an SDK client seeded with every node); the node owning the most
// partitions gets SIGTERM, and publishing goes on for after past its exit.
// Every publish error is recorded, not fatal.
func runStopTrial(t *testing.T, bin, topic string, after time.Duration) *stopTrial {
	t.Helper()
	nodes, ids, _ := startThreeVoting(t, bin)
	byAddr, _, client := seededClient(t, nodes, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := client.DeclareQueue(ctx, topic, sinew.QueueConfig{Partitions: handoverPartitions}); err != nil {
		t.Fatal(err)
	}
	parts := awaitPreferredOwners(t, nodes[0], topic)
	owned := map[string]int{}
	for _, p := range parts {
		owned[p.Owner]++
	}
	tr := &stopTrial{nodes: nodes, confirmed: map[string]bool{}}
	// The node owning the most partitions; of those, the controller's
	// leader if it is one, so that its lead is handed over too.
	ctlLeader := nodesOf(t, nodes[0].admin).Controller.Leader
	for _, a := range slices.Sorted(maps.Keys(owned)) {
		if owned[a] > tr.led || owned[a] == tr.led && ids[byAddr[a]] == ctlLeader {
			tr.stopped, tr.led = byAddr[a], owned[a]
		}
	}

	var (
		mu       sync.Mutex
		stop     atomic.Bool
		termAt   atomic.Int64 // Unix ns of the SIGTERM; 0 before
		wg       sync.WaitGroup
		sent     atomic.Int64
		maxPause time.Duration
	)
	for i := range handoverPartitions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := time.Now()
			for n := 0; !stop.Load(); n++ {
				body := fmt.Sprintf("p%d-%d", i, n)
				_, err := client.Publish(ctx, topic, []byte(body), sinew.WithPartition(i))
				now := time.Now()
				mu.Lock()
				if err != nil {
					tr.errs = append(tr.errs, fmt.Sprintf("%s: %v", body, err))
				} else {
					tr.confirmed[body] = true
					if at := termAt.Load(); at != 0 && now.UnixNano() > at && now.Sub(last) > maxPause {
						maxPause = now.Sub(last)
					}
					last = now
				}
				mu.Unlock()
				if err != nil {
					return
				}
				sent.Add(1)
				time.Sleep(2 * time.Millisecond) // a steady stream, not a flood
			}
		}()
	}
	// Under way on every partition before the stop.
	for deadline := time.Now().Add(safetyTimeout); sent.Load() < 300 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	termAt.Store(time.Now().UnixNano())
	tr.status, tr.exit = termChild(t, tr.stopped.child)
	time.Sleep(after) // publishing goes on
	stop.Store(true)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	tr.pause = maxPause
	return tr
}

// Three `sinew serve --cluster` processes and a queue of three partitions,
// each owned by its preferred owner. One SDK publisher per partition
// publishes without a break while the node owning the most partitions gets
// SIGTERM. Before it drains, that node hands the lead of every partition
// it owns to another replica (a raft leadership transfer, no election), so
// that: no publish returns an error to the application; once it exited,
// every partition has an owner on another node; its log line counts every
// partition it owned as handed over (none elected, none left to an
// election); and every confirmed message is stored once: draining the
// queue delivers each exactly once, and nothing else. The longest wait for
// a confirm around the stop is logged, not asserted.
func TestClusterSIGTERMHandsLeadsOver(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	const topic = "handover"
	tr := runStopTrial(t, bin, topic, time.Second)
	x := tr.stopped
	t.Logf("SIGTERM to %s (owner of %d of %d partitions): exited %d after %v; longest wait for a confirm from the SIGTERM on: %v; %d confirmed",
		x.addr, tr.led, handoverPartitions, tr.status, tr.exit.Round(time.Millisecond), tr.pause.Round(time.Millisecond), len(tr.confirmed))
	if tr.status != 0 {
		t.Fatalf("the stopped node exited %d:\n%s", tr.status, x.log())
	}
	if len(tr.errs) > 0 {
		t.Fatalf("%d publishes returned an error to the application, e.g. %v", len(tr.errs), tr.errs[:min(5, len(tr.errs))])
	}
	stay := otherThan(tr.nodes, x)
	// The survivors see the new owners at once when the leads were handed
	// over; the bound is for a loaded machine.
	deadline := time.Now().Add(safetyTimeout)
	for {
		parts := partitionsOf(t, stay, topic)
		ok := len(parts) == handoverPartitions
		for _, p := range parts {
			ok = ok && p.Owner != "" && p.Owner != x.addr
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partitions after the stop: %+v; want every one owned by a node other than %s", parts, x.addr)
		}
		time.Sleep(50 * time.Millisecond) // polling real processes
	}
	// The stopped node's log: every partition it owned handed over.
	const line = "cluster: stopping; leads handed over"
	field := func(key string) string { return logField(t, x.child, line, key) }
	led, _ := strconv.Atoi(field("partitions_led"))
	if led != tr.led || field("handed_over") != strconv.Itoa(tr.led) || field("elected") != "0" || field("left_to_election") != "0" {
		t.Fatalf("the stopped node's handover line does not count its %d partitions handed over:\n%s", tr.led, x.log())
	}
	if field("controller_led") == "true" && field("controller_handed_over") != "true" {
		t.Fatalf("the stopped node led the controller and did not hand it over:\n%s", x.log())
	}
	if r := field("redirect"); r == "" || r == x.addr {
		t.Fatalf("the stopped node's GOING_AWAY redirect is %q, want another node's address", r)
	}
	drainExactlyOnce(t, tr.nodes, x, topic, tr.confirmed)
}

// The admin API's planned stop (POST /api/v1/drain, which `sinew admin
// drain` sends) on a partition owner hands its leads over as SIGTERM does,
// and the GOING_AWAY its clients receive names another node in redirect.
func TestClusterAdminDrainHandsLeadsOverAndRedirects(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	nodes, _, _ := startThreeVoting(t, bin)
	byAddr, addrs, client := seededClient(t, nodes, 0)
	const topic = "admin-drain"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := client.DeclareQueue(ctx, topic, sinew.QueueConfig{Partitions: handoverPartitions}); err != nil {
		t.Fatal(err)
	}
	parts := awaitPreferredOwners(t, nodes[0], topic)
	x := byAddr[parts[0].Owner]
	c, err := net.DialTimeout("tcp", x.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(safetyTimeout))
	br := bufio.NewReader(c)
	read := func() protocol.Body {
		f, _, err := protocol.ReadFrame(br, protocol.FrameBytesDefault, nil)
		if err != nil {
			t.Fatalf("read from the draining node: %v", err)
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
	if code, body := adminDo(t, "POST", "http://"+x.admin+"/api/v1/drain", nil); code/100 != 2 {
		t.Fatalf("POST /api/v1/drain: %d %s", code, body)
	}
	var away *protocol.GoingAway
	for away == nil {
		away, _ = read().(*protocol.GoingAway)
	}
	if away.Redirect == "" || away.Redirect == x.addr || !slices.Contains(addrs, away.Redirect) {
		t.Fatalf("GOING_AWAY redirect %q from %s, want another node's client address (of %v)", away.Redirect, x.addr, addrs)
	}
	if status := waitChild(t, x.child); status != 0 {
		t.Fatalf("the drained node exited %d:\n%s", status, x.log())
	}
	const line = "cluster: stopping; leads handed over"
	if led := logField(t, x.child, line, "partitions_led"); led == "0" || logField(t, x.child, line, "handed_over") != led {
		t.Fatalf("the drained node's handover line does not count its partitions handed over:\n%s", x.log())
	}
	if got := logField(t, x.child, line, "redirect"); got != away.Redirect {
		t.Fatalf("the log names redirect %s, GOING_AWAY %s", got, away.Redirect)
	}
	stay := otherThan(nodes, x)
	for deadline := time.Now().Add(safetyTimeout); ; {
		p := partitionsOf(t, stay, topic)[0]
		if p.Owner != "" && p.Owner != x.addr {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition 0 after the drain: %+v; want it owned by another node than %s", p, x.addr)
		}
		time.Sleep(50 * time.Millisecond) // polling real processes
	}
}

// drainExactlyOnce consumes topic through a client seeded with every node
// but gone, completing each message, until every confirmed body arrived
// and nothing more came for a second; each body must arrive exactly once
// as a first delivery (a body stored twice would arrive twice), and
// nothing unpublished may arrive.
func drainExactlyOnce(t *testing.T, nodes []*clusterChild, gone *clusterChild, topic string, confirmed map[string]bool) {
	t.Helper()
	var addrs []string
	for _, c := range nodes {
		if c != gone {
			addrs = append(addrs, c.addr)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	consumer, err := sinew.Dial(ctx, addrs[0], fastReconnect(), sinew.WithSeeds(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	sub, err := consumer.Subscribe(ctx, topic, sinew.WithPrefetch(256))
	if err != nil {
		t.Fatal(err)
	}
	first := map[string]int{}
	quiet := time.NewTimer(time.Hour)
	defer quiet.Stop()
	for {
		select {
		case m, ok := <-sub.Messages():
			if !ok {
				t.Fatalf("subscription ended: %v", sub.Err())
			}
			b := string(m.Body)
			if !confirmed[b] {
				t.Fatalf("delivered %q, never confirmed (every publish was)", b)
			}
			if m.Attempt == 1 {
				first[b]++
			}
			if err := m.Complete(ctx); err != nil {
				t.Fatalf("complete: %v", err)
			}
			if len(first) == len(confirmed) {
				quiet.Reset(time.Second)
			}
			continue
		case <-quiet.C:
		case <-ctx.Done():
			var missing []string
			for b := range confirmed {
				if first[b] == 0 {
					missing = append(missing, b)
				}
			}
			sort.Strings(missing)
			t.Fatalf("%d of %d confirmed messages not delivered, e.g. %v", len(missing), len(confirmed), missing[:min(10, len(missing))])
		}
		break
	}
	for b, n := range first {
		if n != 1 {
			t.Errorf("%q delivered %d times as a first delivery: stored more than once", b, n)
		}
	}
}

// TestClusterSIGTERMPauseFigures measures the longest wait for a confirm
// around an owner's SIGTERM (runStopTrial), this build against the one at
// SINEW_HANDOVER_BASE_BIN (a sinew binary built from an earlier commit),
// interleaved: SINEW_HANDOVER_TRIALS (default 3) trials of each, taking
// turns at going first. It runs only with SINEW_HANDOVER_FIGURES=1;
// scripts/bench-sigterm-handover builds the base binary and runs it.
func TestClusterSIGTERMPauseFigures(t *testing.T) {
	if os.Getenv("SINEW_HANDOVER_FIGURES") == "" {
		t.Skip("set SINEW_HANDOVER_FIGURES=1 (scripts/bench-sigterm-handover)")
	}
	base := os.Getenv("SINEW_HANDOVER_BASE_BIN")
	if base == "" {
		t.Fatal("SINEW_HANDOVER_BASE_BIN names no binary")
	}
	trials := 3
	if v, err := strconv.Atoi(os.Getenv("SINEW_HANDOVER_TRIALS")); err == nil && v > 0 {
		trials = v
	}
	bins := map[string]string{"base": base, "head": buildSinew(t)}
	pauses := map[string][]time.Duration{}
	for i := range trials {
		order := []string{"base", "head"}
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for _, name := range order {
			t.Run(fmt.Sprintf("%s-%d", name, i), func(t *testing.T) {
				tr := runStopTrial(t, bins[name], fmt.Sprintf("figures-%d", i), 2*time.Second)
				pauses[name] = append(pauses[name], tr.pause)
				t.Logf("%s trial %d: longest confirm pause %v; the stopped node owned %d partitions, exited %d after %v; %d errors, %d confirmed",
					name, i, tr.pause.Round(time.Millisecond), tr.led, tr.status, tr.exit.Round(time.Millisecond), len(tr.errs), len(tr.confirmed))
			})
		}
	}
	for _, name := range []string{"base", "head"} {
		ps := slices.Sorted(slices.Values(pauses[name]))
		if len(ps) == 0 {
			continue
		}
		var all []string
		for _, d := range ps {
			all = append(all, d.Round(time.Millisecond).String())
		}
		t.Logf("%s: %d trials, longest confirm pause: median %v, max %v (all: %s)",
			name, len(ps), ps[len(ps)/2].Round(time.Millisecond), ps[len(ps)-1].Round(time.Millisecond), strings.Join(all, " "))
	}
}
