package e2e_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
)

// agreedOwner waits until every node names the same owner of partition 0
// of topic, and returns it.
func agreedOwner(t *testing.T, nodes []*clusterChild, topic string) string {
	t.Helper()
	deadline := time.Now().Add(safetyTimeout)
	for {
		owner := queuePartition(t, nodes[0], topic).Owner
		for _, c := range nodes[1:] {
			if queuePartition(t, c, topic).Owner != owner {
				owner = ""
			}
		}
		if owner != "" {
			return owner
		}
		if time.Now().After(deadline) {
			t.Fatalf("the nodes name no common owner of %s", topic)
		}
		time.Sleep(50 * time.Millisecond) // polling real processes
	}
}

// A client dialled with ONE address, the owner of a one-partition queue,
// learns the cluster's nodes from it (METADATA) on its first publish.
// The owner is then stopped (SIGSTOP) for a few seconds while a publisher
// goes on: the client keeps its connection to the owner (it says nothing;
// the heartbeat would give it up only after 30 s), yet every publish is
// confirmed, by the new owner, with no error reaching the application.
// Once the old owner runs again and the nodes agree, the queue holds every
// confirmed message exactly once. The longest pause between two confirms
// is logged (not asserted: the machine may be loaded).
func TestClusterClientWithOneAddressGoesOnPastAStoppedOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	nodes, _, _ := startThreeVoting(t, bin)
	byAddr, addrs, declarer := seededClient(t, nodes, 0)
	const topic = "oneaddr"
	ctx, cancel := context.WithTimeout(context.Background(), 4*safetyTimeout)
	defer cancel()
	if _, err := declarer.DeclareQueue(ctx, topic, sinew.QueueConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	owner := agreedOwner(t, nodes, topic)

	var logs lockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	client, err := sinew.Dial(ctx, owner, fastReconnect(), sinew.WithLogger(logger))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	pub := startPublisher(ctx, client, topic)
	defer pub.stop()
	waitFor := func(what string, bound time.Duration, cond func() bool) {
		t.Helper()
		pub.waitFor(t, what, bound, &logs, cond)
	}
	count := pub.count
	waitFor("the client learns the cluster from its one node", safetyTimeout, func() bool {
		return strings.Contains(logs.String(), "the node is clustered") && count() >= 20
	})

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
	stoppedAt, before := time.Now(), count()
	var others []*clusterChild
	for _, c := range nodes {
		if c != stopped {
			others = append(others, c)
		}
	}
	newOwner := ""
	waitFor("another node owns the queue and confirms publishes", safetyTimeout, func() bool {
		if newOwner == "" {
			if o := queuePartition(t, others[0], topic).Owner; o != "" && o != owner &&
				queuePartition(t, others[1], topic).Owner == o {
				newOwner = o
			}
		}
		// The owner stays stopped for 3 s at least: a few seconds of
		// fault, whatever the machine's speed.
		return newOwner != "" && count() >= before+20 && time.Since(stoppedAt) >= 3*time.Second
	})
	t.Logf("owner %s stopped for %v; %d publishes confirmed meanwhile, new owner %s",
		owner, time.Since(stoppedAt).Round(time.Millisecond), count()-before, newOwner)
	resume()
	after := count()
	waitFor("publishes go on after the old owner runs again", safetyTimeout, func() bool { return count() >= after+20 })
	want, pause := pub.finish(t, &logs)
	t.Logf("%d publishes confirmed, no error; longest pause between confirms %v (addresses %v)",
		len(want), pause.Round(time.Millisecond), addrs)

	// Stored exactly once: the owner every node agrees on holds as many
	// messages as were confirmed, and a consumer receives each once.
	final := agreedOwner(t, nodes, topic)
	checkStoredOnce(t, ctx, topic, want, func() (int, bool) {
		var v struct {
			Partitions []struct {
				Ready int `json:"ready"`
			} `json:"partitions"`
		}
		getJSONInto(t, "http://"+byAddr[final].admin+"/api/v1/queues/"+topic, &v)
		if len(v.Partitions) != 1 {
			return 0, false
		}
		return v.Partitions[0].Ready, true
	}, func() (*sinew.Client, error) {
		return sinew.Dial(ctx, final, fastReconnect(), sinew.WithSeeds(addrs...))
	})
}

// publisher publishes one message at a time ("m-0" and on), each bounded
// generously, and records every error and the longest pause between two
// confirms; it stops at its first error.
type publisher struct {
	mu        sync.Mutex
	confirmed []string
	errs      []error
	longest   time.Duration
	quit      chan struct{}
	done      chan struct{}
	once      sync.Once
}

func startPublisher(ctx context.Context, client *sinew.Client, topic string) *publisher {
	p := &publisher{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		last := time.Now()
		for i := 0; ; i++ {
			select {
			case <-p.quit:
				return
			default:
			}
			body := fmt.Sprintf("m-%d", i)
			pctx, pcancel := context.WithTimeout(ctx, safetyTimeout)
			_, err := client.Publish(pctx, topic, []byte(body))
			pcancel()
			now := time.Now()
			p.mu.Lock()
			if err != nil {
				p.errs = append(p.errs, fmt.Errorf("publish %s: %w", body, err))
			} else {
				p.confirmed = append(p.confirmed, body)
				p.longest = max(p.longest, now.Sub(last))
				last = now
			}
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return p
}

// stop ends the publisher and waits for it.
func (p *publisher) stop() {
	p.once.Do(func() { close(p.quit) })
	<-p.done
}

func (p *publisher) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.confirmed)
}

// waitFor polls cond until it holds, failing the test at the publisher's
// first error or after bound.
func (p *publisher) waitFor(t *testing.T, what string, bound time.Duration, logs *lockedBuffer, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		p.mu.Lock()
		errs := p.errs
		p.mu.Unlock()
		if len(errs) > 0 {
			t.Fatalf("while waiting until %s: %v\nclient log:\n%s", what, errs, logs.String())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v\nclient log:\n%s", what, bound, logs.String())
		}
		time.Sleep(20 * time.Millisecond) // polling a publisher on real processes
	}
}

// finish stops the publisher, fails the test if an error reached it, and
// returns the confirmed bodies and the longest pause between confirms.
func (p *publisher) finish(t *testing.T, logs *lockedBuffer) ([]string, time.Duration) {
	t.Helper()
	p.stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.errs) > 0 {
		t.Fatalf("errors reached the application: %v\nclient log:\n%s", p.errs, logs.String())
	}
	return slices.Clone(p.confirmed), p.longest
}

// checkStoredOnce waits until ready (the agreed owner's ready count) is
// len(want), failing at once if it is more (stored twice), then consumes
// the queue through a client from dial and checks each body arrives once.
func checkStoredOnce(t *testing.T, ctx context.Context, topic string, want []string, ready func() (int, bool), dial func() (*sinew.Client, error)) {
	t.Helper()
	for deadline := time.Now().Add(safetyTimeout); ; {
		n, ok := ready()
		if ok && n == len(want) {
			break
		}
		if ok && n > len(want) {
			t.Fatalf("the owner holds %d messages for %d confirmed: stored twice", n, len(want))
		}
		if time.Now().After(deadline) {
			t.Fatalf("the owner holds %d ready (%v), want %d", n, ok, len(want))
		}
		time.Sleep(50 * time.Millisecond) // polling real processes
	}
	consumer, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	sub, err := consumer.Subscribe(ctx, topic, sinew.WithPrefetch(64))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	cctx, ccancel := context.WithTimeout(ctx, safetyTimeout)
	defer ccancel()
	for len(seen) < len(want) {
		select {
		case m, ok := <-sub.Messages():
			if !ok {
				t.Fatalf("subscription ended: %v", sub.Err())
			}
			seen[string(m.Body)]++
			if err := m.Complete(cctx); err != nil {
				t.Fatalf("complete: %v", err)
			}
		case <-cctx.Done():
			t.Fatalf("%d of %d confirmed messages delivered", len(seen), len(want))
		}
	}
	for _, b := range want {
		if seen[b] != 1 {
			t.Errorf("%s delivered %d times, want once", b, seen[b])
		}
	}
}
