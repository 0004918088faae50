package e2e_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/sinewmq/sinew"
)

// consumed is one line of `sinew consume --json`.
type consumed struct {
	Partition uint32 `json:"partition"`
	Offset    uint64 `json:"offset"`
	Attempt   uint32 `json:"attempt"`
	Body      string `json:"body"`
}

// consumeJSON runs `sinew consume --json` with args and parses its output.
func consumeJSON(t *testing.T, bin, addr, topic string, args ...string) []consumed {
	t.Helper()
	args = append([]string{"consume", "--addr", addr, "--topic", topic, "--json"}, args...)
	code, out, errOut := runSinew(t, bin, "", args...)
	if code != 0 {
		t.Fatalf("sinew %v: exit %d\n%s", args, code, errOut)
	}
	var got []consumed
	for line := range strings.Lines(out) {
		var c consumed
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("consume output line %q: %v", line, err)
		}
		got = append(got, c)
	}
	return got
}

// TestConsumeCountOneSixTimes: a consumer that prefetches a backlog, reads
// one message and exits hands the rest back unread. That must not use up
// their retries: after six such runs (one more than the default max
// retries) nothing is in the dead-letter queue, every message can still be
// consumed, and the attempt number shows each delivery.
func TestConsumeCountOneSixTimes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	dir := t.TempDir()
	srv := startChild(t, bin, dir)

	const n, runs = 60, 6
	code, out, errOut := runSinew(t, bin, "", "publish", "--addr", srv.addr, "--topic", "backlog", "--count", strconv.Itoa(n))
	if code != 0 || out != fmt.Sprintf("published to backlog: confirmed %d, failed 0\n", n) {
		t.Fatalf("publish: exit %d, out %q, err %q", code, out, errOut)
	}
	seen := map[uint64]bool{}
	for run := 1; run <= runs; run++ {
		// Default prefetch (64): the whole backlog is leased to this run.
		got := consumeJSON(t, bin, srv.addr, "backlog", "--count", "1")
		if len(got) != 1 {
			t.Fatalf("run %d consumed %d messages, want 1", run, len(got))
		}
		// Each earlier run held this message unread and went away, so this
		// is its run-th delivery.
		if got[0].Attempt != uint32(run) {
			t.Fatalf("run %d: offset %d at attempt %d, want %d", run, got[0].Offset, got[0].Attempt, run)
		}
		seen[got[0].Offset] = true
	}
	// --idle-exit: if messages were lost, report how many rather than hang.
	rest := consumeJSON(t, bin, srv.addr, "backlog", "--count", strconv.Itoa(n-runs), "--idle-exit", "5s")
	for _, c := range rest {
		if seen[c.Offset] {
			t.Fatalf("offset %d consumed twice", c.Offset)
		}
		seen[c.Offset] = true
		if c.Attempt != runs+1 {
			t.Errorf("offset %d at attempt %d, want %d: it was handed out and back %d times", c.Offset, c.Attempt, runs+1, runs)
		}
	}
	if len(seen) != n {
		t.Fatalf("%d distinct messages consumed, want all %d", len(seen), n)
	}
	stopChild(t, srv)
	ready, _ := queueCounts(t, dir)
	if ready["sinew.dead-letter"] != 0 || ready["backlog"] != 0 {
		t.Fatalf("after consuming everything: %d in sinew.dead-letter, %d left in backlog; want 0 and 0", ready["sinew.dead-letter"], ready["backlog"])
	}
	if strings.Contains(srv.log(), "retries_exhausted") {
		t.Fatalf("broker log mentions retries_exhausted:\n%s", srv.log())
	}
}

// TestDeadLetterQueueReadWithoutAck: the global dead-letter queue never
// drops what it holds. Its messages are read and walked away from six times
// (one more than the default max retries), NACKed and FAILed as well, and
// every one of them is still there to be completed.
func TestDeadLetterQueueReadWithoutAck(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	dir := t.TempDir()
	srv := startChild(t, bin, dir)
	ctx := sdkCtx(t)

	const n = 10
	bodies := map[string]bool{}
	c := sdkDial(t, srv.addr)
	for i := range n {
		b := fmt.Sprintf("poison-%d", i)
		bodies[b] = true
		if _, err := c.Publish(ctx, "work", []byte(b)); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := c.Subscribe(ctx, "work", sinew.WithPrefetch(n))
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := sdkRecv(t, sub).Fail(ctx); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()

	// Rounds against the dead-letter queue: walk away six times, with a
	// NACK round and a FAIL round among them. After a NACK or FAIL the
	// dead letters come straight back to the same subscription (a
	// dead-letter queue drops nothing), are received again and then walked
	// away from too.
	const dlq = "sinew.dead-letter"
	plan := []string{"leave", "leave", "nack", "leave", "fail", "leave", "leave", "leave"}
	want := uint32(1) // attempt of the next delivery
	for round, how := range plan {
		c := sdkDial(t, srv.addr)
		sub, err := c.Subscribe(ctx, dlq, sinew.WithPrefetch(n))
		if err != nil {
			t.Fatal(err)
		}
		receive := func() []*sinew.Message {
			got := map[string]bool{}
			var ms []*sinew.Message
			for range n {
				m := sdkRecv(t, sub)
				got[m.Text()] = true
				ms = append(ms, m)
				if m.Attempt != want {
					t.Errorf("round %d (%s): %q at attempt %d, want %d", round, how, m.Text(), m.Attempt, want)
				}
			}
			if len(got) != n {
				t.Fatalf("round %d: %d distinct dead letters, want %d", round, len(got), n)
			}
			want++
			return ms
		}
		ms := receive()
		if how != "leave" {
			for _, m := range ms {
				if how == "nack" {
					err = m.Retry(ctx)
				} else {
					err = m.Fail(ctx)
				}
				if err != nil {
					t.Fatalf("round %d: %s: %v", round, how, err)
				}
			}
			receive()
		}
		c.Close()
	}

	rest := consumeJSON(t, bin, srv.addr, dlq, "--count", strconv.Itoa(n), "--idle-exit", "5s")
	for _, m := range rest {
		if !bodies[m.Body] {
			t.Errorf("unexpected or repeated dead letter %q", m.Body)
		}
		delete(bodies, m.Body)
	}
	if len(bodies) != 0 {
		t.Fatalf("dead letters lost: %v", bodies)
	}
	if !strings.Contains(srv.log(), "dead-letter queue keeps every message") {
		t.Errorf("broker did not log that the dead-letter queue keeps its messages:\n%s", srv.log())
	}
	stopChild(t, srv)
}
