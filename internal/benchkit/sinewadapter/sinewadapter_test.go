package sinewadapter

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/benchkit"
	"github.com/sinewmq/sinew/internal/server"
	"github.com/sinewmq/sinew/internal/session/sessiontest"
)

// counter is a deterministic Rand for the server's ids and tokens.
type counter struct {
	mu sync.Mutex
	n  byte
}

func (c *counter) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range p {
		c.n++
		p[i] = c.n
	}
	return len(p), nil
}

// serve runs the real wire server over the in-memory backend on loopback, so the
// adapter is exercised through the SDK and the protocol end to end.
func serve(t *testing.T) string {
	t.Helper()
	srv, err := server.New(server.Config{Backend: sessiontest.New(), OwnerID: "bench-test", Rand: &counter{}, ServerVersion: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, server.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return ln.Addr().String()
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
