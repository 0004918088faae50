package sinew

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/server"
	"github.com/sinewmq/sinew/internal/testkit"
	"github.com/sinewmq/sinew/protocol"
)

// These tests run the SDK against the real broker (internal/broker on an
// in-memory file system) behind the real wire server (internal/server), over
// loopback, with the testkit proxy in between where faults are injected.

// startRealBroker runs broker + server in process on 127.0.0.1:0, with a
// reconnect grace long enough that cut sessions resume.
func startRealBroker(t *testing.T, tune func(*server.Config)) *testkit.Broker {
	t.Helper()
	return testkit.StartBroker(t,
		testkit.WithServerConfig(func(c *server.Config) { c.ReconnectGraceMs = 30_000 }),
		testkit.WithServerConfig(tune))
}

// publishRetrying publishes, retrying retryable failures a bounded number of
// times (a publish racing a cut socket may fail with ErrConnectionLost).
func publishRetrying(t *testing.T, c *Client, topic, body string) PublishResult {
	t.Helper()
	ctx := testCtx(t)
	for i := 0; ; i++ {
		r, err := c.Publish(ctx, topic, []byte(body))
		if err == nil {
			return r
		}
		if !IsRetryable(err) || i >= 20 {
			t.Fatalf("publish %q: %v", body, err)
		}
	}
}

func TestRealCutSocketReconnectsAndSubscriptionFlows(t *testing.T) {
	rb := startRealBroker(t, nil)
	p := proxyT(t, rb.Addr)
	c := dialT(t, p.Addr())
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "real-flow", WithPrefetch(16))
	if err != nil {
		t.Fatal(err)
	}
	publishRetrying(t, c, "real-flow", "before")
	before := recv(t, sub)
	if before.Text() != "before" {
		t.Fatalf("got %q", before.Text())
	}
	for round := range 3 {
		p.CutAll()
		body := fmt.Sprintf("after-%d", round)
		r := publishRetrying(t, c, "real-flow", body)
		m := recv(t, sub)
		if m.Text() != body || m.Offset != r.Offset {
			t.Fatalf("round %d: got %q at %d, want %q at %d", round, m.Text(), m.Offset, body, r.Offset)
		}
		if err := m.Complete(ctx); err != nil {
			t.Fatalf("round %d: Complete: %v", round, err)
		}
	}
	// The session was resumed each time, so the first lease is still ours.
	if err := before.Complete(ctx); err != nil {
		t.Fatalf("Complete of the pre-cut delivery: %v", err)
	}
	if err := sub.Unsubscribe(ctx); err != nil {
		t.Fatal(err)
	}
	if err := waitDone(t, sub); !errors.Is(err, ErrUnsubscribed) {
		t.Fatalf("Err = %v", err)
	}
}

func TestRealRefusedConnectionBacksOffByPolicy(t *testing.T) {
	rb := startRealBroker(t, nil)
	p := proxyT(t, rb.Addr)
	clk := testkit.NewClock(time.Unix(1_700_000_000, 0))
	c := dialT(t, p.Addr(), WithClock(clk), WithRand(func() float64 { return 0.5 }),
		WithHeartbeat(time.Hour)) // keep heartbeat timers out of the recorded waits
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "real-backoff")
	if err != nil {
		t.Fatal(err)
	}
	mark := len(clk.Waits())
	p.SetRefuse(true)
	p.CutAll()
	want := []time.Duration{100, 200, 400, 800, 1600, 3200}
	for i, w := range want {
		waits, err := clk.WaitForWaits(ctx, mark+i+1)
		if err != nil {
			t.Fatalf("backoff %d: %v", i, err)
		}
		// Skip heartbeat timers of the dead connection, if any were recorded.
		got := waits[mark+i]
		if got == 30*time.Minute {
			mark++
			waits, err = clk.WaitForWaits(ctx, mark+i+1)
			if err != nil {
				t.Fatal(err)
			}
			got = waits[mark+i]
		}
		if got != w*time.Millisecond {
			t.Fatalf("backoff %d = %v, want %v (all %v)", i, got, w*time.Millisecond, waits[mark:])
		}
		if i == len(want)-1 {
			p.SetRefuse(false)
		}
		clk.Advance(got)
	}
	r := publishRetrying(t, c, "real-backoff", "back")
	if m := recv(t, sub); m.Offset != r.Offset {
		t.Fatalf("got offset %d, want %d", m.Offset, r.Offset)
	}
}

func TestRealWrongTokenIsFatal(t *testing.T) {
	rb := startRealBroker(t, func(c *server.Config) { c.AuthTokens = []string{"secret"} })
	p := proxyT(t, rb.Addr)
	_, err := Dial(testCtx(t), p.Addr(), WithCredentials("wrong"))
	if !errors.Is(err, &BrokerError{Code: protocol.CodeAuthFailed}) || IsRetryable(err) {
		t.Fatalf("Dial = %v, want a non-retryable auth_failed", err)
	}
	if n := p.Accepted(); n != 1 {
		t.Fatalf("client connected %d times, want 1 (no retry)", n)
	}
	c := dialT(t, p.Addr(), WithCredentials("secret"))
	publishRetrying(t, c, "auth", "ok")
}

// TestRealUserPassword: against the real server, WithUser logs in with the
// right password; a wrong password, an unknown user and no credentials at all
// (a user exists, so loopback needs them too) fail Dial with a non-retryable
// auth_failed after one attempt each; a static token still works beside users.
func TestRealUserPassword(t *testing.T) {
	rb := startRealBroker(t, func(c *server.Config) { c.AuthTokens, c.AuthFailureDelayMs = []string{"machine"}, -1 })
	if err := rb.Broker.Users().Add("alice", "correct horse", auth.Permissions{Publish: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	p := proxyT(t, rb.Addr)
	for i, opts := range [][]Option{
		{WithUser("alice", "wrong horse")},
		{WithUser("mallory", "correct horse")},
		{},
		{WithUser("alice", "correct horse"), WithCredentials("not-a-token")}, // the later option wins
	} {
		_, err := Dial(testCtx(t), p.Addr(), opts...)
		if !errors.Is(err, &BrokerError{Code: protocol.CodeAuthFailed}) || IsRetryable(err) {
			t.Fatalf("case %d: Dial = %v, want a non-retryable auth_failed", i, err)
		}
		if n := p.Accepted(); n != i+1 {
			t.Fatalf("case %d: %d connections, want %d (no retry)", i, n, i+1)
		}
	}
	// The token first: it creates the queue, which alice (no manage) may not.
	m := dialT(t, p.Addr(), WithCredentials("machine"))
	publishRetrying(t, m, "auth", "as a token")
	c := dialT(t, p.Addr(), WithCredentials("not-a-token"), WithUser("alice", "correct horse"))
	publishRetrying(t, c, "auth", "as alice")
}

func TestRealAsyncPublishPipeline(t *testing.T) {
	rb := startRealBroker(t, func(c *server.Config) { c.PublishInflightMax = 512 })
	c := dialT(t, rb.Addr)
	ctx := testCtx(t)
	if _, err := c.DeclareQueue(ctx, "real-pipe", QueueConfig{Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	const n = 10_000
	futures := make([]*PublishFuture, n)
	body := make([]byte, 100)
	for i := range futures {
		futures[i] = c.PublishAsync(ctx, "real-pipe", body)
	}
	seen := make(map[[2]uint64]bool, n)
	for i, f := range futures {
		r, err := f.Wait(ctx)
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		k := [2]uint64{uint64(r.Partition), r.Offset}
		if seen[k] {
			t.Fatalf("position %v confirmed twice", k)
		}
		seen[k] = true
	}
	sub, err := c.Subscribe(ctx, "real-pipe", WithPrefetch(256))
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		m := recv(t, sub)
		if !seen[[2]uint64{uint64(m.Partition), m.Offset}] {
			t.Fatalf("message %d at %d/%d was never confirmed", i, m.Partition, m.Offset)
		}
		if err := m.Complete(ctx); err != nil {
			t.Fatalf("Complete %d: %v", i, err)
		}
	}
}

func TestRealTerminationReasons(t *testing.T) {
	rb := startRealBroker(t, nil)
	t.Run("unsubscribed and client closed", func(t *testing.T) {
		c, err := Dial(testCtx(t), rb.Addr)
		if err != nil {
			t.Fatal(err)
		}
		ctx := testCtx(t)
		a, err := c.Subscribe(ctx, "real-term")
		if err != nil {
			t.Fatal(err)
		}
		b, err := c.Subscribe(ctx, "real-term")
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Unsubscribe(ctx); err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
		if err := waitDone(t, a); !errors.Is(err, ErrUnsubscribed) {
			t.Fatalf("a: %v", err)
		}
		if err := waitDone(t, b); !errors.Is(err, ErrClientClosed) {
			t.Fatalf("b: %v", err)
		}
	})
	t.Run("bad request", func(t *testing.T) {
		c := dialT(t, rb.Addr)
		_, err := c.Subscribe(testCtx(t), "")
		var be *BrokerError
		if !errors.As(err, &be) || be.Code != protocol.CodeBadRequest {
			t.Fatalf("Subscribe(\"\") = %v, want bad_request", err)
		}
	})
	t.Run("fresh session after grace resubscribes", func(t *testing.T) {
		rb := startRealBroker(t, func(c *server.Config) { c.ReconnectGraceMs = 0 })
		p := proxyT(t, rb.Addr)
		c := dialT(t, p.Addr())
		ctx := testCtx(t)
		sub, err := c.Subscribe(ctx, "real-fresh")
		if err != nil {
			t.Fatal(err)
		}
		publishRetrying(t, c, "real-fresh", "x")
		old := recv(t, sub)
		p.CutAll()
		again := recv(t, sub) // redelivered on the new session
		if again.Offset != old.Offset || again.Attempt < 2 {
			t.Fatalf("redelivery %+v after %+v", again, old)
		}
		if err := old.Complete(ctx); !errors.Is(err, ErrStaleDelivery) {
			t.Fatalf("Complete of old-session delivery = %v", err)
		}
		if err := again.Complete(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// TestRealCompleteAsyncDrain drains a backlog from one goroutine with
// CompleteAsync: every settle resolves without error, settling twice is
// refused, and the queue is empty afterwards (a new subscriber's first message
// is one published after the drain).
func TestRealCompleteAsyncDrain(t *testing.T) {
	rb := startRealBroker(t, nil)
	c := dialT(t, rb.Addr)
	ctx := testCtx(t)
	if _, err := c.DeclareQueue(ctx, "real-async-ack", QueueConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	const n = 2_000
	for i := range n {
		if _, err := c.Publish(ctx, "real-async-ack", []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := c.Subscribe(ctx, "real-async-ack", WithPrefetch(64))
	if err != nil {
		t.Fatal(err)
	}
	var last *Message
	futures := make([]*SettleFuture, 0, n)
	for i := range n {
		m := recv(t, sub)
		if m.Text() != fmt.Sprint(i) {
			t.Fatalf("message %d is %q", i, m.Text())
		}
		futures = append(futures, m.CompleteAsync())
		last = m
	}
	for i, f := range futures {
		if err := f.Wait(ctx); err != nil {
			t.Fatalf("settle %d: %v", i, err)
		}
	}
	if err := last.CompleteAsync().Wait(ctx); !errors.Is(err, ErrAlreadySettled) {
		t.Fatalf("second settle: %v, want ErrAlreadySettled", err)
	}
	if err := sub.Unsubscribe(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, "real-async-ack", []byte("after")); err != nil {
		t.Fatal(err)
	}
	sub2, err := c.Subscribe(ctx, "real-async-ack")
	if err != nil {
		t.Fatal(err)
	}
	if m := recv(t, sub2); m.Text() != "after" {
		t.Fatalf("first message after the drain is %q, want \"after\"", m.Text())
	}
}

// TestRealRetryAfterBeyondCap: a RetryAfter above the broker's NACK delay
// cap (30 days by default) is a bad_request naming the cap, and the message
// stays unsettled, so a shorter retry still works.
func TestRealRetryAfterBeyondCap(t *testing.T) {
	rb := startRealBroker(t, nil)
	c := dialT(t, rb.Addr)
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "nack-cap", WithPrefetch(1))
	if err != nil {
		t.Fatal(err)
	}
	publishRetrying(t, c, "nack-cap", "x")
	m := recv(t, sub)
	err = m.RetryAfter(ctx, 31*24*time.Hour)
	if !errors.Is(err, &BrokerError{Code: protocol.CodeBadRequest}) || !strings.Contains(err.Error(), "nack_delay_ms_max") {
		t.Fatalf("RetryAfter(31 days) = %v, want bad_request naming the cap", err)
	}
	if err := m.Retry(ctx); err != nil {
		t.Fatalf("Retry after a refused RetryAfter: %v", err)
	}
	again := recv(t, sub)
	if again.Offset != m.Offset || again.Attempt != 2 {
		t.Fatalf("redelivery: offset %d attempt %d, want offset %d attempt 2", again.Offset, again.Attempt, m.Offset)
	}
	if err := again.Complete(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRealLostConfirmResendIsDuplicate: the broker stores a publish but its
// confirm is lost in a cut; the Client sends it again on the next connection
// with the same producer id and sequence, and the real broker answers with
// the original offset and Duplicate set. The consumer gets one copy.
func TestRealLostConfirmResendIsDuplicate(t *testing.T) {
	rb := startRealBroker(t, nil)
	p := proxyT(t, rb.Addr)
	c := dialT(t, p.Addr())
	watcher := dialT(t, rb.Addr) // not behind the proxy
	ctx := testCtx(t)
	sub, err := watcher.Subscribe(ctx, "real-idem", WithPrefetch(16))
	if err != nil {
		t.Fatal(err)
	}
	p.SetDownStalled(true)
	f := c.PublishAsync(ctx, "real-idem", []byte("once"))
	stored := recv(t, sub) // the broker stored it; its confirm is held in the proxy
	p.CutAll()
	p.SetDownStalled(false)
	r, err := f.Wait(ctx)
	if err != nil {
		t.Fatalf("publish across the cut: %v", err)
	}
	if !r.Duplicate || r.Offset != stored.Offset || r.Partition != stored.Partition {
		t.Fatalf("resend answered %+v, want the original %d/%d with Duplicate", r, stored.Partition, stored.Offset)
	}
	if err := stored.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	// One partition, delivered in order: a second copy would come first.
	marker := publishRetrying(t, c, "real-idem", "marker")
	if m := recv(t, sub); m.Text() != "marker" || m.Offset != marker.Offset {
		t.Fatalf("after the resend got %q at %d, want only the marker at %d", m.Text(), m.Offset, marker.Offset)
	}
	// An application-numbered sequence is deduplicated the same way.
	a, err := c.Publish(ctx, "real-idem", []byte("numbered"), WithProducerSequence("app", 9))
	if err != nil || a.Duplicate {
		t.Fatalf("first numbered publish: %+v %v", a, err)
	}
	b, err := c.Publish(ctx, "real-idem", []byte("numbered"), WithProducerSequence("app", 9))
	if err != nil || !b.Duplicate || b.Offset != a.Offset {
		t.Fatalf("repeated numbered publish: %+v %v, want offset %d duplicate", b, err, a.Offset)
	}
	if c.ProducerID() == "" || c.ProducerID() == watcher.ProducerID() {
		t.Fatalf("producer ids %q and %q: want random and distinct", c.ProducerID(), watcher.ProducerID())
	}
}
