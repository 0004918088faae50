package sinewadapter

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/benchkit"
	"github.com/sinewmq/sinew/internal/session/sessiontest"
	"github.com/sinewmq/sinew/internal/testkit"
)

// serve runs the real wire server over the in-memory backend on loopback, so the
// adapter is exercised through the SDK and the protocol end to end.
func serve(t *testing.T) string {
	t.Helper()
	return testkit.StartBroker(t, testkit.WithBackend(sessiontest.New())).Addr
}

// These runs use real time, briefly; they assert what was delivered, never how fast.
func TestWorkloadsEndToEnd(t *testing.T) {
	b := New("sinew", serve(t))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	res, err := benchkit.Run(ctx, b, benchkit.Config{Mode: benchkit.ModePublish, Topic: "p", Window: 8, Connections: 2, Duration: 300 * time.Millisecond})
	if err != nil || res.Messages == 0 || res.Errors != 0 {
		t.Fatalf("publish: %v, %+v", err, res)
	}
	res, err = benchkit.Run(ctx, b, benchkit.Config{Mode: benchkit.ModeDrain, Topic: "d", Count: 2000, Prefetch: 64, Connections: 2, Duration: 30 * time.Second})
	if err != nil || res.Messages != 2000 {
		t.Fatalf("drain: %v, %+v", err, res)
	}
	// A loaded machine may leave a few due messages unsent at the end (the
	// engine reports them as Unsent); every message sent must arrive.
	res, err = benchkit.Run(ctx, b, benchkit.Config{Mode: benchkit.ModeMixed, Topic: "m", RatePerSec: 2000, Window: 16, Duration: 500 * time.Millisecond})
	if (err != nil && !errors.Is(err, benchkit.ErrIncomplete)) || res.Messages == 0 || res.Errors != 0 || res.Missing != res.Unsent {
		t.Fatalf("mixed: %v, %+v", err, res)
	}
}

// Remove deletes the run's queue on the real broker: declaring it again
// afterwards creates a new, empty one.
func TestRemoveDeletesTheQueue(t *testing.T) {
	b := New("sinew", testkit.StartBroker(t).Addr)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	res, err := benchkit.Run(ctx, b, benchkit.Config{Mode: benchkit.ModeDrain, Topic: "gone", Count: 100, Prefetch: 16, Duration: 30 * time.Second})
	if err != nil || res.Messages != 100 {
		t.Fatalf("drain: %v, %+v", err, res)
	}
	if err := b.Remove(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	c, err := b.dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.DeleteQueue(ctx, "gone", ""); err == nil {
		t.Fatal("the queue is still there after Remove: deleting it again succeeded")
	}
}
