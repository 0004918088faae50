package sinew

import (
	"errors"
	"testing"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// extendTestLease is the queue lease of the Extend tests: short, so a
// handler that outlives it several times over takes about a second.
const extendTestLease = 300 * time.Millisecond

// declareShortLease declares topic with extendTestLease.
func declareShortLease(t *testing.T, c *Client, topic string) {
	t.Helper()
	if _, err := c.DeclareQueue(testCtx(t), topic, QueueConfig{Lease: extendTestLease}); err != nil {
		t.Fatal(err)
	}
}

// handleExtending plays a handler that works for span, extending m every
// third of the lease, by twice the lease (a slow round trip on a busy
// machine does not lose it).
func handleExtending(t *testing.T, m *Message, span time.Duration) {
	t.Helper()
	ctx := testCtx(t)
	for start := time.Now(); time.Since(start) < span; {
		if err := m.Extend(ctx, 2*extendTestLease); err != nil {
			t.Fatalf("Extend after %v: %v", time.Since(start), err)
		}
		time.Sleep(extendTestLease / 3) // the handler's work
	}
}

// nextIsSentinel publishes a sentinel and checks that it is the next
// delivery: a copy of an earlier message let go by the broker would come
// first.
func nextIsSentinel(t *testing.T, c *Client, sub *Subscription, topic string) {
	t.Helper()
	ctx := testCtx(t)
	if _, err := c.PublishText(ctx, topic, "sentinel"); err != nil {
		t.Fatal(err)
	}
	m := recv(t, sub)
	if m.Text() != "sentinel" || m.Attempt != 1 {
		t.Fatalf("next delivery %q attempt %d, want the sentinel", m.Text(), m.Attempt)
	}
	if err := m.Complete(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRealExtendOutlivesTheLease: a handler that takes three leases' time
// and extends as it goes keeps its message: it is never delivered again,
// and Complete of it is ok.
func TestRealExtendOutlivesTheLease(t *testing.T) {
	rb := startRealBroker(t, nil)
	c := dialT(t, rb.Addr)
	declareShortLease(t, c, "ext-sdk")
	sub, err := c.Subscribe(testCtx(t), "ext-sdk", WithPrefetch(1))
	if err != nil {
		t.Fatal(err)
	}
	publishRetrying(t, c, "ext-sdk", "slow")
	m := recv(t, sub)
	handleExtending(t, m, 3*extendTestLease)
	if err := m.Complete(testCtx(t)); err != nil {
		t.Fatalf("Complete after the extensions: %v", err)
	}
	nextIsSentinel(t, c, sub, "ext-sdk")
}

// TestRealExtendHeldAcrossACut: an Extend whose connection is cut is held
// and sent again on the resumed session, and applies there.
func TestRealExtendHeldAcrossACut(t *testing.T) {
	rb := startRealBroker(t, nil)
	p := proxyT(t, rb.Addr)
	c := dialT(t, p.Addr(), WithReconnect(ReconnectPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond}))
	declareShortLease(t, c, "ext-cut")
	sub, err := c.Subscribe(testCtx(t), "ext-cut", WithPrefetch(1))
	if err != nil {
		t.Fatal(err)
	}
	publishRetrying(t, c, "ext-cut", "held")
	m := recv(t, sub)
	for range 3 {
		p.CutAll()
		// Long enough to outlast the reconnect and the handler's work below.
		if err := m.Extend(testCtx(t), 10*extendTestLease); err != nil {
			t.Fatalf("Extend across a cut: %v", err)
		}
		time.Sleep(extendTestLease) // the handler's work, past the first lease
	}
	if err := m.Complete(testCtx(t)); err != nil {
		t.Fatalf("Complete after extensions across cuts: %v", err)
	}
	nextIsSentinel(t, c, sub, "ext-cut")
}

// TestRealExtendErrors: the typed errors of Extend.
func TestRealExtendErrors(t *testing.T) {
	rb := startRealBroker(t, nil)
	c := dialT(t, rb.Addr)
	ctx := testCtx(t)
	declareShortLease(t, c, "ext-err")
	sub, err := c.Subscribe(ctx, "ext-err", WithPrefetch(1))
	if err != nil {
		t.Fatal(err)
	}
	publishRetrying(t, c, "ext-err", "m")
	m := recv(t, sub)
	badRequest := &BrokerError{Code: protocol.CodeBadRequest}
	for _, d := range []time.Duration{0, time.Microsecond, -time.Second, 12*time.Hour + time.Millisecond} {
		if err := m.Extend(ctx, d); !errors.Is(err, badRequest) {
			t.Fatalf("Extend(%v) = %v, want bad_request", d, err)
		}
	}
	// Refused extensions change nothing: the lease is still held.
	if err := m.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := m.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := m.Extend(ctx, time.Minute); !errors.Is(err, ErrAlreadySettled) {
		t.Fatalf("Extend after Complete = %v, want ErrAlreadySettled", err)
	}

	// A lease that ended: the message came back; its old copy cannot be
	// extended, the new one can.
	publishRetrying(t, c, "ext-err", "expires")
	old := recv(t, sub)
	again := recv(t, sub) // after the lease ran out
	if again.Offset != old.Offset || again.Attempt != old.Attempt+1 {
		t.Fatalf("redelivery %d attempt %d of %d attempt %d", again.Offset, again.Attempt, old.Offset, old.Attempt)
	}
	if err := old.Extend(ctx, time.Minute); !errors.Is(err, ErrStaleDelivery) {
		t.Fatalf("Extend of the expired lease = %v, want ErrStaleDelivery", err)
	}
	if err := again.Extend(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := again.Complete(ctx); err != nil {
		t.Fatal(err)
	}

	// An auto-ack message holds no lease.
	auto, err := c.Subscribe(ctx, "ext-auto", WithAutoAck())
	if err != nil {
		t.Fatal(err)
	}
	publishRetrying(t, c, "ext-auto", "a")
	if err := recv(t, auto).Extend(ctx, time.Minute); !errors.Is(err, ErrAlreadySettled) {
		t.Fatalf("Extend of an auto-ack message = %v, want ErrAlreadySettled", err)
	}
}
