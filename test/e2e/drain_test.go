package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/internal/server"
)

// logRecorder keeps the messages of the log records an SDK client writes.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.msgs = append(r.msgs, rec.Message)
	r.mu.Unlock()
	return nil
}
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *logRecorder) WithGroup(string) slog.Handler      { return r }

func (r *logRecorder) saw(msg string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if m == msg {
			return true
		}
	}
	return false
}

// TestDrainRestartRedeliversUnacked: a planned stop (Server.Shutdown, what
// SIGTERM runs in sinew serve) sends GOING_AWAY; the SDK client reconnects to
// the broker restarted on the same data directory and address without
// surfacing an error to the application, and the message it held unsettled is
// delivered again (at least once). The held message keeps the drain open until
// its deadline (one second here).
func TestDrainRestartRedeliversUnacked(t *testing.T) {
	n := startNodeOpts(t, t.TempDir(), nil, nodeOpts{server: func(c *server.Config) { c.ReconnectGraceMs = 30_000 }, drain: time.Second})
	n.opts.addr = n.addr // the restarted broker listens where the client dials
	logs := &logRecorder{}
	c := sdkDial(t, n.addr, sinew.WithLogger(slog.New(logs)))
	ctx := sdkCtx(t)
	if _, err := c.DeclareQueue(ctx, "drain", sinew.QueueConfig{Partitions: 1, Lease: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, "drain", sinew.WithPrefetch(4))
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.PublishText(ctx, "drain", "unacked")
	if err != nil {
		t.Fatal(err)
	}
	held := sdkRecv(t, sub)
	if held.Text() != "unacked" || held.Attempt != 1 {
		t.Fatalf("got %q attempt %d", held.Text(), held.Attempt)
	}

	n = n.restart() // Shutdown (GOING_AWAY, drain), broker closed, reopened

	// The lease is ten minutes: the message comes back because the restarted
	// broker releases the leases it recovered, not because one expired.
	again := sdkRecv(t, sub)
	if again.Text() != "unacked" || again.Offset != r.Offset || again.Attempt < 2 {
		t.Fatalf("after restart got %q offset %d attempt %d, want the unacked message again", again.Text(), again.Offset, again.Attempt)
	}
	if err := again.Complete(ctx); err != nil {
		t.Fatalf("Complete after restart: %v", err)
	}
	// The first delivery belonged to the session the restart ended.
	if err := held.Complete(ctx); !errors.Is(err, sinew.ErrStaleDelivery) {
		t.Fatalf("Complete of the pre-restart delivery: %v, want ErrStaleDelivery", err)
	}
	if err := sub.Err(); err != nil {
		t.Fatalf("subscription surfaced %v", err)
	}
	if err := c.Err(); err != nil {
		t.Fatalf("client surfaced %v", err)
	}
	if !logs.saw("sinew: broker going away") {
		t.Fatal("the client never saw GOING_AWAY")
	}
	// The client carries on: a new message flows on the same subscription.
	if _, err := c.PublishText(ctx, "drain", "after"); err != nil {
		t.Fatal(err)
	}
	if m := sdkRecv(t, sub); m.Text() != "after" {
		t.Fatalf("got %q, want after", m.Text())
	}
}

// TestDrainUnderLoadIsAPause: a planned restart while an SDK client publishes
// and consumes without pause. The drain leases nothing new, takes the acks of
// what the consumer holds and confirms what was published, then the client
// leaves, reconnects to the restarted broker and carries on. Neither side sees
// an error, every confirmed message arrives exactly once, and the drain ends
// because nothing is in flight, not at its deadline (stop checks that).
func TestDrainUnderLoadIsAPause(t *testing.T) {
	const before, after = 300, 300
	n := startNodeOpts(t, t.TempDir(), nil, nodeOpts{})
	n.opts.addr = n.addr
	c := sdkDial(t, n.addr)
	ctx := sdkCtx(t)
	if _, err := c.DeclareQueue(ctx, "load", sinew.QueueConfig{Partitions: 2, Lease: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, "load", sinew.WithPrefetch(16))
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	confirmed := map[string]bool{}
	seen := map[string]int{}
	var appErrs []error
	fail := func(err error) {
		mu.Lock()
		appErrs = append(appErrs, err)
		mu.Unlock()
	}
	allIn := make(chan struct{}) // closed once every confirmed message arrived, publishing done
	pubDone := make(chan struct{})
	restartAt := make(chan struct{})
	go func() { // consumer
		for m := range sub.Messages() {
			if m.Attempt != 1 {
				fail(fmt.Errorf("%s delivered with attempt %d", m.Text(), m.Attempt))
			}
			if err := m.Complete(ctx); err != nil {
				fail(fmt.Errorf("complete %s: %w", m.Text(), err))
			}
			mu.Lock()
			seen[m.Text()]++
			done := len(seen) == before+after
			mu.Unlock()
			if done {
				close(allIn)
				return
			}
		}
	}()
	go func() { // publisher
		defer close(pubDone)
		for i := range before + after {
			body := fmt.Sprintf("m-%04d", i)
			if _, err := c.PublishText(ctx, "load", body); err != nil {
				fail(fmt.Errorf("publish %s: %w", body, err))
				return
			}
			mu.Lock()
			confirmed[body] = true
			mu.Unlock()
			if i == before {
				close(restartAt)
			}
		}
	}()
	select {
	case <-restartAt:
	case <-ctx.Done():
		t.Fatal("publisher stalled before the restart")
	}
	n = n.restart() // drain while both keep going
	select {
	case <-allIn:
	case <-ctx.Done():
		mu.Lock()
		t.Fatalf("received %d of %d; errors %v", len(seen), before+after, appErrs)
	}
	<-pubDone
	mu.Lock()
	defer mu.Unlock()
	if len(appErrs) > 0 {
		t.Fatalf("the application saw errors: %v", appErrs)
	}
	for body := range confirmed {
		if seen[body] != 1 {
			t.Fatalf("%s received %d times, want once", body, seen[body])
		}
	}
	if len(confirmed) != before+after {
		t.Fatalf("%d confirmed, want %d", len(confirmed), before+after)
	}
	if err := c.Err(); err != nil {
		t.Fatalf("client: %v", err)
	}
}
