package sinew

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sinewmq/sinew/internal/testkit"
	"github.com/sinewmq/sinew/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testTimeout bounds every wait in these tests; it is a failsafe, not a timing
// assertion.
const testTimeout = 20 * time.Second

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

func dialT(t *testing.T, addr string, opts ...Option) *Client {
	t.Helper()
	c, err := Dial(testCtx(t), addr, opts...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func proxyT(t *testing.T, target string) *testkit.Proxy {
	t.Helper()
	p, err := testkit.NewProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func recv(t *testing.T, sub *Subscription) *Message {
	t.Helper()
	select {
	case m, ok := <-sub.Messages():
		if !ok {
			t.Fatalf("subscription ended: %v", sub.Err())
		}
		return m
	case <-time.After(testTimeout):
		t.Fatal("no message arrived")
	}
	return nil
}

func waitDone(t *testing.T, sub *Subscription) error {
	t.Helper()
	select {
	case <-sub.Done():
		return sub.Err()
	case <-time.After(testTimeout):
		t.Fatal("subscription did not end")
	}
	return nil
}

func TestPublishSubscribeSettle(t *testing.T) {
	b := newFakeBroker(t)
	c := dialT(t, b.addr(), WithClientName("t1"))
	ctx := testCtx(t)
	if info, err := c.DeclareQueue(ctx, "orders", QueueConfig{Partitions: 1}); err != nil || !info.Created {
		t.Fatalf("DeclareQueue = %+v, %v", info, err)
	}
	r1, err := c.PublishText(ctx, "orders", "one", WithKey([]byte("k")), WithHeader("h", "v"))
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.PublishJSON(ctx, "orders", map[string]int{"n": 2})
	if err != nil {
		t.Fatal(err)
	}
	if r2.Offset <= r1.Offset {
		t.Fatalf("offsets %d then %d", r1.Offset, r2.Offset)
	}
	sub, err := c.Subscribe(ctx, "orders", WithPrefetch(8))
	if err != nil {
		t.Fatal(err)
	}
	m1 := recv(t, sub)
	if m1.Text() != "one" || string(m1.Key) != "k" || m1.ContentType != "text/plain; charset=utf-8" || m1.Attempt != 1 {
		t.Fatalf("first message %+v", m1)
	}
	if v, ok := m1.Header("h"); !ok || v != "v" {
		t.Fatalf("header h = %q, %v", v, ok)
	}
	if err := m1.Complete(ctx); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if err := m1.Complete(ctx); !errors.Is(err, ErrAlreadySettled) {
		t.Fatalf("second Complete = %v, want ErrAlreadySettled", err)
	}
	m2 := recv(t, sub)
	var v map[string]int
	if err := m2.DecodeJSON(&v); err != nil || v["n"] != 2 || m2.ContentType != "application/json" {
		t.Fatalf("second message %+v (%v)", m2, err)
	}
	if err := m2.Retry(ctx); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	m3 := recv(t, sub)
	if m3.Offset != m2.Offset || m3.Attempt != 2 {
		t.Fatalf("redelivery %+v, want offset %d attempt 2", m3, m2.Offset)
	}
	if err := m3.Fail(ctx); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	if err := sub.Unsubscribe(ctx); err != nil {
		t.Fatal(err)
	}
	if err := waitDone(t, sub); !errors.Is(err, ErrUnsubscribed) {
		t.Fatalf("Err = %v, want ErrUnsubscribed", err)
	}
	if _, ok := <-sub.Messages(); ok {
		t.Fatal("Messages still open after Unsubscribe")
	}
}

func TestSettleBatchesManyTags(t *testing.T) {
	b := newFakeBroker(t)
	c := dialT(t, b.addr())
	ctx := testCtx(t)
	const n = 200
	for i := range n {
		c.PublishAsync(ctx, "batch", fmt.Appendf(nil, "m%d", i))
	}
	sub, err := c.Subscribe(ctx, "batch", WithPrefetch(n))
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, n)
	for range n {
		m := recv(t, sub)
		go func() { errs <- m.Complete(ctx) }()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("Complete: %v", err)
		}
	}
	b.mu.Lock()
	acked := b.queues["batch"].acked
	b.mu.Unlock()
	if acked != n {
		t.Fatalf("broker saw %d acks, want %d", acked, n)
	}
}

func TestAsyncPublishPipeline(t *testing.T) {
	b := newFakeBroker(t)
	b.set(func(b *fakeBroker) { b.inflight = 128 })
	c := dialT(t, b.addr())
	ctx := testCtx(t)
	const n = 10_000
	futures := make([]*PublishFuture, n)
	body := make([]byte, 64)
	for i := range futures {
		futures[i] = c.PublishAsync(ctx, "pipe", body)
	}
	seen := make(map[uint64]bool, n)
	for i, f := range futures {
		r, err := f.Wait(ctx)
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		if seen[r.Offset] {
			t.Fatalf("offset %d confirmed twice", r.Offset)
		}
		seen[r.Offset] = true
	}
	if ch := c.ep.window.idle(); ch != nil {
		t.Fatal("publish window not empty after every confirm")
	}
}

func TestCutSocketReconnectsAndSubscriptionFlows(t *testing.T) {
	b := newFakeBroker(t)
	p := proxyT(t, b.addr())
	c := dialT(t, p.Addr())
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "flow")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, "flow", []byte("before")); err != nil {
		t.Fatal(err)
	}
	before := recv(t, sub)

	p.CutAll()
	// The next operation finds the connection gone (or learns it on the way)
	// and reconnects; a publish racing the cut may fail with a retryable error.
	var res PublishResult
	for i := 0; ; i++ {
		res, err = c.Publish(ctx, "flow", []byte("after"))
		if err == nil {
			break
		}
		if !IsRetryable(err) || i >= 20 {
			t.Fatalf("publish after cut: %v", err)
		}
	}
	after := recv(t, sub)
	if after.Text() != "after" || after.Offset != res.Offset {
		t.Fatalf("after reconnect got %q at %d, want %q at %d", after.Text(), after.Offset, "after", res.Offset)
	}
	// The session was resumed: the message leased before the cut settles.
	if err := before.Complete(ctx); err != nil {
		t.Fatalf("Complete of pre-cut delivery after resume: %v", err)
	}
	h := b.lastHello()
	if h.Resume.ClientID == "" || len(h.Resume.Token) == 0 {
		t.Fatalf("reconnect HELLO carried no resume identity: %+v", h.Resume)
	}
	if err := after.Complete(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestFreshSessionResubscribesAndStalesOldDeliveries(t *testing.T) {
	b := newFakeBroker(t)
	c := dialT(t, b.addr())
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "fresh")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, "fresh", []byte("x")); err != nil {
		t.Fatal(err)
	}
	m := recv(t, sub)
	b.forgetSessions() // the broker lost the session: resume_not_found next
	again := recv(t, sub)
	if again.Offset != m.Offset || again.Attempt != 2 {
		t.Fatalf("redelivery %+v, want offset %d attempt 2", again, m.Offset)
	}
	if err := m.Complete(ctx); !errors.Is(err, ErrStaleDelivery) {
		t.Fatalf("Complete of old-session delivery = %v, want ErrStaleDelivery", err)
	}
	if err := again.Complete(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestInFlightPublishesAreResentAfterCut: publishes whose confirm was lost in
// a cut are sent again on the next connection, by the supervisor alone, and
// confirmed there; the application sees no error.
func TestInFlightPublishesAreResentAfterCut(t *testing.T) {
	b := newFakeBroker(t)
	p := proxyT(t, b.addr())
	c := dialT(t, p.Addr())
	ctx := testCtx(t)
	p.SetStalled(true)
	idem := c.PublishAsync(ctx, "idem", []byte("once"), WithProducerSequence("p1", 1))
	plain := c.PublishAsync(ctx, "idem", []byte("maybe"))
	p.CutAll()
	p.SetStalled(false)
	for name, f := range map[string]*PublishFuture{"idempotent": idem, "plain": plain} {
		if _, err := f.Wait(ctx); err != nil {
			t.Fatalf("%s in-flight publish: %v", name, err)
		}
	}
	// Whether a resend is recognised as a duplicate is the broker's part:
	// TestRealLostConfirmResendIsDuplicate tests it against the real one.
}

func TestBackoffDelaysFollowPolicyOnRefusal(t *testing.T) {
	b := newFakeBroker(t)
	p := proxyT(t, b.addr())
	p.SetRefuse(true)
	clk := testkit.NewClock(time.Unix(1_700_000_000, 0))
	const attempts = 7
	done := make(chan error, 1)
	go func() {
		_, err := Dial(context.Background(), p.Addr(), WithClock(clk), WithRand(func() float64 { return 1 }),
			WithReconnect(ReconnectPolicy{MaxAttempts: attempts}))
		done <- err
	}()
	ctx := testCtx(t)
	for i := 1; i < attempts; i++ {
		waits, err := clk.WaitForWaits(ctx, i)
		if err != nil {
			t.Fatalf("waiting for backoff %d: %v", i, err)
		}
		clk.Advance(waits[i-1])
	}
	err := <-done
	if !errors.Is(err, ErrDisconnected) || !IsRetryable(err) {
		t.Fatalf("Dial = %v, want ErrDisconnected", err)
	}
	// r = 1 places the jitter at +10 %: 110, 220, 440 ... ms.
	want := []time.Duration{110, 220, 440, 880, 1760, 3520}
	got := clk.Waits()
	if len(got) != len(want) {
		t.Fatalf("waits %v, want %d of them", got, len(want))
	}
	for i := range want {
		if got[i] != want[i]*time.Millisecond {
			t.Fatalf("wait %d = %v, want %v (all: %v)", i, got[i], want[i]*time.Millisecond, got)
		}
	}
	if p.Accepted() != attempts {
		t.Fatalf("proxy saw %d connects, want %d", p.Accepted(), attempts)
	}
}

func TestBackoffOfRunningClientAndGiveUp(t *testing.T) {
	b := newFakeBroker(t)
	p := proxyT(t, b.addr())
	clk := testkit.NewClock(time.Unix(1_700_000_000, 0))
	c := dialT(t, p.Addr(), WithClock(clk), WithRand(func() float64 { return 0 }),
		WithReconnect(ReconnectPolicy{MaxAttempts: 4}))
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	mark := len(clk.Waits())
	p.SetRefuse(true)
	p.CutAll()
	// r = 0 places the jitter at -10 %: 90, 180, 360, 720 ms, then give up
	// after the fourth failed attempt.
	want := []time.Duration{90, 180, 360, 720}
	for i, w := range want {
		waits, err := clk.WaitForWaits(ctx, mark+i+1)
		if err != nil {
			t.Fatal(err)
		}
		if got := waits[mark+i]; got != w*time.Millisecond {
			t.Fatalf("backoff %d = %v, want %v", i, got, w*time.Millisecond)
		}
		clk.Advance(w * time.Millisecond)
	}
	if err := waitDone(t, sub); !errors.Is(err, ErrDisconnected) {
		t.Fatalf("subscription ended with %v, want ErrDisconnected", err)
	}
	// A new operation makes one fresh attempt and reports its failure.
	if _, err := c.Publish(ctx, "gone", nil); !errors.Is(err, ErrNotConnected) || !IsRetryable(err) {
		t.Fatalf("Publish while given up = %v, want ErrNotConnected", err)
	}
	// ... and once the broker is reachable again, that attempt succeeds.
	p.SetRefuse(false)
	if _, err := c.Publish(ctx, "gone", []byte("back")); err != nil {
		t.Fatalf("Publish after recovery: %v", err)
	}
}

func TestWrongTokenIsFatalAndNotRetried(t *testing.T) {
	b := newFakeBroker(t)
	b.set(func(b *fakeBroker) { b.token = "secret" })
	_, err := Dial(testCtx(t), b.addr(), WithCredentials("wrong"))
	var be *BrokerError
	if !errors.As(err, &be) || be.Code != protocol.CodeAuthFailed {
		t.Fatalf("Dial = %v, want auth_failed", err)
	}
	if IsRetryable(err) {
		t.Fatal("auth failure classified as retryable")
	}
	if !errors.Is(err, &protocol.Error{Code: protocol.CodeAuthFailed}) {
		t.Fatal("BrokerError does not wrap protocol.Error")
	}
	if n := b.helloCount(); n != 1 {
		t.Fatalf("broker saw %d HELLOs, want 1", n)
	}
	c := dialT(t, b.addr(), WithCredentials("secret"))
	_ = c
}

func TestFatalOnReconnectEndsSubscriptions(t *testing.T) {
	b := newFakeBroker(t)
	b.set(func(b *fakeBroker) { b.token = "secret" })
	c := dialT(t, b.addr(), WithCredentials("secret"))
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "auth")
	if err != nil {
		t.Fatal(err)
	}
	b.set(func(b *fakeBroker) { b.token = "rotated" })
	b.cutAll()
	err = waitDone(t, sub)
	if !errors.Is(err, &BrokerError{Code: protocol.CodeAuthFailed}) {
		t.Fatalf("subscription ended with %v, want auth_failed", err)
	}
	if !errors.Is(c.Err(), &BrokerError{Code: protocol.CodeAuthFailed}) {
		t.Fatalf("Client.Err = %v", c.Err())
	}
	if _, err := c.Publish(ctx, "auth", nil); !errors.Is(err, &BrokerError{Code: protocol.CodeAuthFailed}) {
		t.Fatalf("Publish after fatal = %v", err)
	}
}

func TestTerminationReasons(t *testing.T) {
	t.Run("client closed", func(t *testing.T) {
		b := newFakeBroker(t)
		c := dialT(t, b.addr())
		sub, err := c.Subscribe(testCtx(t), "q")
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
		if err := waitDone(t, sub); !errors.Is(err, ErrClientClosed) {
			t.Fatalf("Err = %v", err)
		}
		if _, err := c.Publish(testCtx(t), "q", nil); !errors.Is(err, ErrClientClosed) {
			t.Fatalf("Publish after Close = %v", err)
		}
	})
	t.Run("reconciled closed", func(t *testing.T) {
		b := newFakeBroker(t)
		c := dialT(t, b.addr(), WithReconcilePolicy(ReconcileConservative))
		sub, err := c.Subscribe(testCtx(t), "q")
		if err != nil {
			t.Fatal(err)
		}
		b.set(func(b *fakeBroker) { // the broker lost the subscription but kept the session
			for _, s := range b.sessions {
				s.subs = map[uint64]*fSub{}
			}
		})
		b.cutAll()
		if err := waitDone(t, sub); !errors.Is(err, ErrReconciledClosed) {
			t.Fatalf("Err = %v", err)
		}
	})
	t.Run("restored by reconciliation", func(t *testing.T) {
		b := newFakeBroker(t)
		c := dialT(t, b.addr())
		ctx := testCtx(t)
		sub, err := c.Subscribe(ctx, "q")
		if err != nil {
			t.Fatal(err)
		}
		b.set(func(b *fakeBroker) {
			for _, s := range b.sessions {
				s.subs = map[uint64]*fSub{}
			}
		})
		b.cutAll()
		var r PublishResult
		for i := 0; ; i++ {
			if r, err = c.Publish(ctx, "q", []byte("hi")); err == nil || !IsRetryable(err) || i > 20 {
				break
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		if m := recv(t, sub); m.Offset != r.Offset {
			t.Fatalf("got offset %d, want %d", m.Offset, r.Offset)
		}
	})
	t.Run("recreated, or not", func(t *testing.T) {
		b := newFakeBroker(t)
		c := dialT(t, b.addr())
		ctx := testCtx(t)
		ok, err := c.Subscribe(ctx, "q-ok")
		if err != nil {
			t.Fatal(err)
		}
		bad, err := c.Subscribe(ctx, "q-bad")
		if err != nil {
			t.Fatal(err)
		}
		b.set(func(b *fakeBroker) {
			for _, s := range b.sessions {
				s.subs = map[uint64]*fSub{}
			}
			b.recreate = true
			b.refuseSubs = map[string]bool{"q-bad": true}
		})
		b.cutAll()
		if err := waitDone(t, bad); !errors.Is(err, ErrRecreated) || !errors.Is(err, &BrokerError{Code: protocol.CodeUnavailable}) {
			t.Fatalf("bad: Err = %v, want ErrRecreated wrapping unavailable", err)
		}
		r := publishRetrying(t, c, "q-ok", "still here")
		if m := recv(t, ok); m.Offset != r.Offset {
			t.Fatalf("recreated subscription got offset %d, want %d", m.Offset, r.Offset)
		}
	})
	t.Run("broker error", func(t *testing.T) {
		b := newFakeBroker(t)
		c := dialT(t, b.addr())
		sub, err := c.Subscribe(testCtx(t), "q")
		if err != nil {
			t.Fatal(err)
		}
		b.set(func(b *fakeBroker) {
			for _, s := range b.sessions {
				for id := range s.subs {
					s.conn.write(0, 0, &protocol.SubClosed{SubID: id, Reason: protocol.SubClosedError,
						Code: protocol.CodeUnavailable, Message: "quarantined"})
				}
			}
		})
		err = waitDone(t, sub)
		var be *BrokerError
		if !errors.As(err, &be) || be.Code != protocol.CodeUnavailable {
			t.Fatalf("Err = %v", err)
		}
	})
	t.Run("iterator reports the reason", func(t *testing.T) {
		b := newFakeBroker(t)
		c := dialT(t, b.addr())
		ctx := testCtx(t)
		sub, err := c.Subscribe(ctx, "q")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Publish(ctx, "q", []byte("a")); err != nil {
			t.Fatal(err)
		}
		var got []string
		var final error
		for m, err := range sub.All(ctx) {
			if err != nil {
				final = err
				break
			}
			got = append(got, m.Text())
			if err := m.Complete(ctx); err != nil {
				t.Fatal(err)
			}
			if err := sub.Unsubscribe(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if len(got) != 1 || got[0] != "a" || !errors.Is(final, ErrUnsubscribed) {
			t.Fatalf("iterated %v, final %v", got, final)
		}
	})
}

func TestGoingAwayReconnectsAndResumes(t *testing.T) {
	b := newFakeBroker(t)
	c := dialT(t, b.addr())
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "away")
	if err != nil {
		t.Fatal(err)
	}
	b.goingAway(0) // deadline already passed: close and reconnect now
	if _, err := c.Publish(ctx, "away", []byte("x")); err != nil && !IsRetryable(err) {
		t.Fatal(err)
	}
	for i := 0; b.helloCount() < 2; i++ {
		if _, err := c.Publish(ctx, "away", []byte("y")); err != nil && !IsRetryable(err) {
			t.Fatal(err)
		}
		if i > 20 {
			t.Fatal("client did not reconnect after GOING_AWAY")
		}
	}
	m := recv(t, sub)
	if err := m.Complete(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestReconnectPolicyDelay(t *testing.T) {
	var p ReconnectPolicy
	cases := []struct {
		n    int
		r    float64
		want time.Duration
	}{
		{0, 0.5, 100 * time.Millisecond},
		{1, 0.5, 200 * time.Millisecond},
		{3, 0.5, 800 * time.Millisecond},
		{8, 0.5, 25600 * time.Millisecond},
		{9, 0.5, 30 * time.Second},
		{1000, 0.5, 30 * time.Second},
		{0, 0, 90 * time.Millisecond},
		{9, 1, 33 * time.Second},
	}
	for _, tc := range cases {
		if got := p.Delay(tc.n, tc.r); got != tc.want {
			t.Errorf("Delay(%d, %v) = %v, want %v", tc.n, tc.r, got, tc.want)
		}
	}
}

func TestIsRetryable(t *testing.T) {
	cases := []struct {
		err  error
		want bool
	}{
		{ErrConnectionLost, true},
		{fmt.Errorf("x: %w", ErrNotConnected), true},
		{&BrokerError{Code: protocol.CodeShuttingDown}, true},
		{&BrokerError{Code: protocol.CodeAuthFailed}, false},
		{&BrokerError{Code: protocol.CodeUnsupportedVer}, false},
		{fmt.Errorf("%w: bad", ErrProtocol), false},
		{ErrClientClosed, false},
		{errors.New("mystery"), false},
	}
	for _, tc := range cases {
		if got := IsRetryable(tc.err); got != tc.want {
			t.Errorf("IsRetryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestHeartbeatSilenceClosesAndReconnects(t *testing.T) {
	b := newFakeBroker(t)
	b.set(func(b *fakeBroker) { b.heartbeat = 1000 })
	p := proxyT(t, b.addr())
	clk := testkit.NewClock(time.Unix(1_700_000_000, 0))
	c := dialT(t, p.Addr(), WithClock(clk), WithRand(func() float64 { return 0.5 }))
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "hb")
	if err != nil {
		t.Fatal(err)
	}
	p.SetStalled(true) // the broker hangs: nothing arrives any more
	// The heartbeat wakes every 500 ms (half the interval) and gives up after
	// 3 s of silence; the supervisor then asks for a 100 ms backoff.
	n := len(clk.Waits())
	var last time.Duration
	for i := 0; ; i++ {
		if i > 10 {
			t.Fatal("heartbeat never declared the connection dead")
		}
		clk.Advance(500 * time.Millisecond)
		waits, err := clk.WaitForWaits(ctx, n+1)
		if err != nil {
			t.Fatal(err)
		}
		n = len(waits)
		if last = waits[n-1]; last != 500*time.Millisecond {
			break
		}
	}
	if last != 100*time.Millisecond {
		t.Fatalf("after heartbeat timeout the client waited %v, want the 100 ms backoff", last)
	}
	p.SetStalled(false)
	clk.Advance(last)
	if _, err := c.Publish(ctx, "hb", []byte("alive")); err != nil {
		t.Fatalf("publish after reconnect: %v", err)
	}
	if m := recv(t, sub); m.Text() != "alive" {
		t.Fatalf("got %q", m.Text())
	}
	if h := b.lastHello(); h.Resume.ClientID == "" {
		t.Fatal("reconnect did not offer the resume identity")
	}
}

// TestReconnectGiveUpByOutage: with MaxOutage and no count, the client gives
// up once attempts have failed for that long: 90+180+360 ms (630 ms) is not
// enough for a 1 s bound, the fourth failure at 1350 ms is.
func TestReconnectGiveUpByOutage(t *testing.T) {
	b := newFakeBroker(t)
	p := proxyT(t, b.addr())
	clk := testkit.NewClock(time.Unix(1_700_000_000, 0))
	c := dialT(t, p.Addr(), WithClock(clk), WithRand(func() float64 { return 0 }),
		WithReconnect(ReconnectPolicy{MaxOutage: time.Second}))
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	mark := len(clk.Waits())
	p.SetRefuse(true)
	p.CutAll()
	for i, w := range []time.Duration{90, 180, 360, 720} {
		if _, err := clk.WaitForWaits(ctx, mark+i+1); err != nil {
			t.Fatal(err)
		}
		select {
		case <-sub.Done():
			t.Fatalf("gave up after %d attempts, before the outage bound", i)
		default:
		}
		clk.Advance(w * time.Millisecond)
	}
	if err := waitDone(t, sub); !errors.Is(err, ErrDisconnected) {
		t.Fatalf("subscription ended with %v, want ErrDisconnected", err)
	}
}
