package e2e_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
)

// The owner of a one-partition queue is stopped (SIGSTOP): its connection
// stays open and says nothing, as when its link is cut without a reset.
// The client's heartbeat is the broker's 10 s, so it would give that
// connection up only after 30 s; the publish sent to the stopped owner is
// nevertheless confirmed, by the new owner, through the hedge, while the
// stopped owner's connection is still held (no "connection lost" for it
// before the confirm). Once the old owner runs again the queue holds the
// message once.
func TestClusterPublishHedgedPastAStoppedOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	nodes, _, _ := startThreeVoting(t, bin)
	byAddr := map[string]*clusterChild{}
	var addrs []string
	for _, c := range nodes {
		byAddr[c.addr] = c
		addrs = append(addrs, c.addr)
	}
	const topic = "hedged"
	ctx, cancel := context.WithTimeout(context.Background(), 2*safetyTimeout)
	defer cancel()
	type view struct {
		Partitions []struct {
			Owner string `json:"owner"`
			Ready int    `json:"ready"`
		} `json:"partitions"`
	}
	declarer, err := sinew.Dial(ctx, addrs[0], fastReconnect(), sinew.WithSeeds(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := declarer.DeclareQueue(ctx, topic, sinew.QueueConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	declarer.Close()
	// The owner every node agrees on (one node's view may still name the
	// leader of an earlier term).
	owner := ""
	for deadline := time.Now().Add(safetyTimeout); owner == ""; {
		for i, c := range nodes {
			var v view
			getJSONInto(t, "http://"+c.admin+"/api/v1/queues/"+topic, &v)
			if len(v.Partitions) != 1 || v.Partitions[0].Owner == "" || (i > 0 && v.Partitions[0].Owner != owner) {
				owner = ""
				break
			}
			owner = v.Partitions[0].Owner
		}
		if owner == "" {
			if time.Now().After(deadline) {
				t.Fatal("the queue has no owner")
			}
			time.Sleep(50 * time.Millisecond) // polling real processes
		}
	}
	dial := addrs[0]
	if dial == owner {
		dial = addrs[1]
	}
	var logs lockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	client, err := sinew.Dial(ctx, dial, fastReconnect(), sinew.WithSeeds(addrs...),
		sinew.WithHeartbeat(time.Hour), sinew.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	const warm = 10
	for i := range warm {
		if _, err := client.Publish(ctx, topic, []byte(fmt.Sprintf("warm-%d", i))); err != nil {
			t.Fatal(err)
		}
	}

	stopped := byAddr[owner]
	if err := stopped.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = stopped.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	defer resume()
	// Bounded below the 30 s after which the stopped owner's connection
	// would be given up: only the hedge can confirm it in time.
	pctx, pcancel := context.WithTimeout(ctx, 20*time.Second)
	res, err := client.Publish(pctx, topic, []byte("hedged"))
	pcancel()
	seen := logs.String()
	if err != nil {
		t.Fatalf("publish with its owner %s stopped: %v\nclient log:\n%s", owner, err, seen)
	}
	for _, line := range strings.Split(seen, "\n") {
		if strings.Contains(line, "connection lost") && strings.Contains(line, owner) {
			t.Fatalf("the stopped owner's connection was given up before the confirm, so the hedge did not confirm it: %s", line)
		}
	}
	if !strings.Contains(seen, "publish hedged") || !strings.Contains(seen, "outcome=won") {
		t.Fatalf("no won hedge in the client log:\n%s", seen)
	}
	t.Logf("confirmed through the hedge at offset %d (duplicate %v)", res.Offset, res.Duplicate)

	// The old owner runs again and rejoins: the queue holds every message
	// once (the hedge was deduplicated or the only copy).
	resume()
	want := warm + 1
	for deadline := time.Now().Add(safetyTimeout); ; {
		total, agreed := -1, true
		for _, c := range nodes {
			var v view
			getJSONInto(t, "http://"+c.admin+"/api/v1/queues/"+topic, &v)
			if len(v.Partitions) != 1 || v.Partitions[0].Owner == "" {
				agreed = false
				continue
			}
			if v.Partitions[0].Ready > want {
				t.Fatalf("node %s holds %d messages, want %d: stored twice", c.addr, v.Partitions[0].Ready, want)
			}
			if v.Partitions[0].Owner == c.addr {
				total = v.Partitions[0].Ready
			}
		}
		if agreed && total == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the owner holds %d messages, want %d", total, want)
		}
		time.Sleep(50 * time.Millisecond) // polling real processes
	}
}
