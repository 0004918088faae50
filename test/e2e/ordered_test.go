package e2e_test

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/internal/testkit"
)

// storedMsg is a message as its first delivery showed where it is stored.
type storedMsg struct {
	partition uint32
	offset    uint64
	body      string
}

// storedInOrder subscribes to topic through client and completes messages
// until want distinct bodies were delivered (bounded by ctx); it returns
// them as stored, sorted by partition and offset. A body delivered at two
// positions fails the test: it was stored twice.
func storedInOrder(t *testing.T, ctx context.Context, client *sinew.Client, topic string, want int) []storedMsg {
	t.Helper()
	sub, err := client.Subscribe(ctx, topic, sinew.WithPrefetch(256))
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe(context.WithoutCancel(ctx))
	at := map[string]storedMsg{}
	for len(at) < want {
		select {
		case m, ok := <-sub.Messages():
			if !ok {
				t.Fatalf("subscription to %s ended: %v", topic, sub.Err())
			}
			s := storedMsg{m.Partition, m.Offset, string(m.Body)}
			if prev, seen := at[s.body]; seen && (prev.partition != s.partition || prev.offset != s.offset) {
				t.Fatalf("%s: %q stored twice, at %d/%d and %d/%d", topic, s.body, prev.partition, prev.offset, s.partition, s.offset)
			}
			at[s.body] = s
			if err := m.Complete(ctx); err != nil {
				t.Fatalf("complete: %v", err)
			}
		case <-ctx.Done():
			t.Fatalf("%s: %d of %d messages delivered", topic, len(at), want)
		}
	}
	out := make([]storedMsg, 0, len(at))
	for _, s := range at {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b storedMsg) int {
		return cmp.Or(cmp.Compare(a.partition, b.partition), cmp.Compare(a.offset, b.offset))
	})
	return out
}

// awaitOwner waits (bounded) until some node names an owner of topic's
// partition 0, and returns its client address.
func awaitOwner(t *testing.T, nodes []*clusterChild, topic string) string {
	t.Helper()
	deadline := time.Now().Add(safetyTimeout)
	for time.Now().Before(deadline) {
		for _, c := range nodes {
			if o := queuePartition(t, c, topic).Owner; o != "" {
				return o
			}
		}
		time.Sleep(20 * time.Millisecond) // polling real processes
	}
	t.Fatalf("no owner of %s within %v", topic, safetyTimeout)
	return ""
}

// The case: `printf 'a\nb\nc\n' | sinew publish` through a node
// that does not own the queue's partition, for several topics of one
// partition on a three-node cluster. The non-owner answers not_owner to each
// of the three, the client sends each to the owner on its own, and the owner
// stores them in the order sent: a, b, c.
func TestClusterOrderedPublishThroughNonOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	nodes, _, _ := startThreeVoting(t, bin)
	byAddr, _, client := seededClient(t, nodes, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const topics = 5
	for i := range topics {
		topic := "abc-" + strconv.Itoa(i)
		if _, err := client.DeclareQueue(ctx, topic, sinew.QueueConfig{Partitions: 1}); err != nil {
			t.Fatal(err)
		}
		owner := awaitOwner(t, nodes, topic)
		var via *clusterChild
		for a, c := range byAddr {
			if a != owner {
				via = c
				break
			}
		}
		cmd := exec.CommandContext(ctx, bin, "publish", "--topic", topic, "--addr", via.addr)
		cmd.Stdin = strings.NewReader("a\nb\nc\n")
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "confirmed 3, failed 0") {
			t.Fatalf("sinew publish to %s through %s (owner %s): %v\n%s", topic, via.addr, owner, err, out)
		}
		got := storedInOrder(t, ctx, client, topic, 3)
		var bodies []string
		for _, s := range got {
			bodies = append(bodies, s.body)
		}
		if strings.Join(bodies, " ") != "a b c" {
			t.Errorf("%s published through %s (owner %s): stored as %v, want a b c", topic, via.addr, owner, bodies)
		}
	}
}

// Producers publish numbered messages, pipelined, to queues whose owners
// are spread over a three-node cluster, each producer dialled through a
// fault proxy in front of one node (the others its seeds, also proxied), so
// its publishes go through redirects (not_owner), while a chaos loop cuts a
// proxy's connections, or holds a node's answers back for longer than the
// hedge delay (the client hedges, then gives the connection up and resends
// through the cluster); midway the owner of one queue is killed with -9.
// Every producer's messages must be stored in the
// order it sent them: per partition for the keyless queues of one
// partition, per key for the keyed queue of three.
func TestClusterOrderedPublishUnderRedirectsAndCuts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	nodes, _, _ := startThreeVoting(t, bin)
	_, _, admin := seededClient(t, nodes, 0) // its seeds find the queues after the kill
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 28))
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	proxies := make([]*testkit.Proxy, len(nodes))
	var paddrs []string
	for i, n := range nodes {
		p, err := testkit.NewProxy(n.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		proxies[i] = p
		paddrs = append(paddrs, p.Addr())
	}
	type queueSpec struct {
		topic string
		parts int
		keys  int // 0: keyless
	}
	queues := []queueSpec{{"ord-a", 1, 0}, {"ord-b", 1, 0}, {"ord-c", 1, 0}, {"ord-keyed", 3, 4}}
	for _, q := range queues {
		if _, err := admin.DeclareQueue(ctx, q.topic, sinew.QueueConfig{Partitions: q.parts}); err != nil {
			t.Fatal(err)
		}
		awaitOwner(t, nodes, q.topic)
	}

	// Each round runs fresh producers (new clients: they know only the
	// proxies, so their publishes meet the faults and the redirects again;
	// once a client learns an owner from not_owner it reaches it directly,
	// past the proxies).
	const rounds, producers, perProducer, pipeline = 8, 3, 150, 32
	stop := make(chan struct{})
	var chaos sync.WaitGroup
	chaos.Add(1)
	cuts, holds := 0, 0
	chaosRng := rand.New(rand.NewPCG(uint64(seed), 1<<32))
	go func() {
		defer chaos.Done()
		for range 2000 { // bounded; ends when the producers are done
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(20+chaosRng.IntN(150)) * time.Millisecond):
			}
			p := proxies[chaosRng.IntN(len(proxies))]
			if chaosRng.IntN(4) == 0 {
				// Requests arrive and take effect, answers do not: past
				// the hedge delay, then the connection is cut.
				p.SetDownStalled(true)
				select {
				case <-stop:
				case <-time.After(1200 * time.Millisecond):
				}
				p.SetDownStalled(false)
				p.CutAll()
				holds++
				continue
			}
			p.CutAll()
			cuts++
		}
	}()

	var mu sync.Mutex
	perQueue := map[string]int{}
	var firstErr error
	// In round killRound the owner of the first queue is killed with -9
	// while the producers publish: the cluster elects another, and the
	// producers resend what the dead node had not confirmed.
	const killRound = rounds / 2
	killed := -1
	for round := range rounds {
		var wg sync.WaitGroup
		if round == killRound {
			owner := awaitOwner(t, nodes, queues[0].topic)
			killed = slices.IndexFunc(nodes, func(c *clusterChild) bool { return c.addr == owner })
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(100 * time.Millisecond) // amid the round's publishes
				if err := nodes[killed].cmd.Process.Kill(); err != nil {
					t.Error(err)
				}
				nodes[killed].cmd.Wait()
			}()
		}
		live := slices.Clone(paddrs)
		if killed >= 0 {
			live = slices.Delete(live, killed, killed+1)
		}
		for pi := range producers {
			dial := rng.IntN(len(live))
			seeds := slices.Concat(live[:dial], live[dial+1:])
			order := rand.New(rand.NewPCG(uint64(seed), uint64(round*producers+pi)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				fail := func(err error) {
					mu.Lock()
					defer mu.Unlock()
					if firstErr == nil {
						firstErr = err
					}
				}
				// A cut may land on the dial itself: retried (bounded).
				var c *sinew.Client
				var err error
				for range 20 {
					dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
					c, err = sinew.Dial(dctx, live[dial], fastReconnect(), sinew.WithSeeds(seeds...))
					dcancel()
					if err == nil {
						break
					}
				}
				if err != nil {
					fail(fmt.Errorf("round %d producer %d: dial: %w", round, pi, err))
					return
				}
				defer c.Close()
				var inflight []*sinew.PublishFuture
				for n := range perProducer {
					q := queues[order.IntN(len(queues))]
					var opts []sinew.PublishOption
					lane := fmt.Sprintf("r%dp%d", round, pi)
					if q.keys > 0 {
						k := "k" + strconv.Itoa(order.IntN(q.keys))
						opts = append(opts, sinew.WithKey([]byte(k)))
						lane += "-" + k
					}
					mu.Lock()
					perQueue[q.topic]++
					mu.Unlock()
					body := fmt.Sprintf("%s-%d", lane, n)
					inflight = append(inflight, c.PublishAsync(ctx, q.topic, []byte(body), opts...))
					if len(inflight) == pipeline {
						if _, err := inflight[0].Wait(ctx); err != nil {
							fail(fmt.Errorf("round %d producer %d, a publish before %s: %w", round, pi, body, err))
							return
						}
						inflight = inflight[1:]
					}
					time.Sleep(time.Millisecond) // pacing, so the faults land amid the publishes
				}
				for _, f := range inflight {
					if _, err := f.Wait(ctx); err != nil {
						fail(fmt.Errorf("round %d producer %d: %w", round, pi, err))
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	close(stop)
	chaos.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	t.Logf("%d rounds of %d producers x %d publishes confirmed through %d cuts, %d held answers and the kill of %s (round %d)",
		rounds, producers, perProducer, cuts, holds, nodes[killed].addr, killRound)

	total := 0
	for _, q := range queues {
		got := storedInOrder(t, ctx, admin, q.topic, perQueue[q.topic])
		total += len(got)
		// last: per partition and lane (round, producer and key), the
		// last number stored.
		last := map[string]int{}
		for _, s := range got {
			i := strings.LastIndexByte(s.body, '-')
			n, err := strconv.Atoi(s.body[i+1:])
			if err != nil {
				t.Fatalf("%s: body %q", q.topic, s.body)
			}
			lane := fmt.Sprintf("%d/%s", s.partition, s.body[:i])
			if prev, ok := last[lane]; ok && n <= prev {
				t.Errorf("%s partition %d: %q stored after %s-%d", q.topic, s.partition, s.body, s.body[:i], prev)
			}
			last[lane] = n
		}
	}
	if total != rounds*producers*perProducer {
		t.Fatalf("%d messages stored, want %d", total, rounds*producers*perProducer)
	}
}
