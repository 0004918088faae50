package sinew

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/server"
	"github.com/sinewmq/sinew/internal/testkit"
	"github.com/sinewmq/sinew/protocol"
)

// These tests check, against the real broker behind the testkit fault proxy,
// that a cut the session survives is invisible to the application: operations
// wait for the reconnect instead of failing, settles in flight are sent again,
// and nothing acked is delivered again. Backoff runs on a fake clock.

// until spins (yielding, never sleeping) until cond holds, failing the test
// after testTimeout. It waits for a state inside the SDK that no channel
// announces.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		runtime.Gosched()
	}
}

// nextBackoff waits until the client asks the fake clock for a reconnect
// backoff (a wait under a second; heartbeat timers are longer) recorded after
// index *mark, advances *mark past it and returns it.
func nextBackoff(t *testing.T, clk *testkit.Clock, mark *int) time.Duration {
	t.Helper()
	ctx := testCtx(t)
	for {
		waits, err := clk.WaitForWaits(ctx, *mark+1)
		if err != nil {
			t.Fatalf("waiting for a backoff: %v (waits %v)", err, waits)
		}
		d := waits[*mark]
		*mark++
		if d < time.Second {
			return d
		}
	}
}

// TestRealCutDuringCompleteIsInvisible: a Complete whose ACK is lost in a cut
// returns nil once the session is resumed, the ack counts (the message is not
// delivered again, to this consumer or the next), and no error reaches the
// application.
func TestRealCutDuringCompleteIsInvisible(t *testing.T) {
	rb := startRealBroker(t, nil)
	p := proxyT(t, rb.Addr)
	c := dialT(t, p.Addr())
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "cut-ack", WithPrefetch(4))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, "cut-ack", []byte("one")); err != nil {
		t.Fatal(err)
	}
	m := recv(t, sub)
	// Hold the ACK in the proxy, then cut: it is lost with the socket.
	p.SetStalled(true)
	f := m.CompleteAsync()
	until(t, "the settle is in progress", func() bool { return c.ep.busy.count() == 1 })
	p.CutAll()
	p.SetStalled(false)
	if err := f.Wait(ctx); err != nil {
		t.Fatalf("Complete across the cut: %v", err)
	}
	// A message published after the cut is the next delivery: "one" was not
	// delivered again.
	if _, err := c.Publish(ctx, "cut-ack", []byte("two")); err != nil {
		t.Fatalf("Publish after the cut: %v", err)
	}
	if m2 := recv(t, sub); m2.Text() != "two" {
		t.Fatalf("after the cut got %q (attempt %d), want \"two\"", m2.Text(), m2.Attempt)
	} else if err := m2.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	// The ack is durable on the broker: a new consumer finds nothing but a
	// marker published now.
	if err := sub.Unsubscribe(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, "cut-ack", []byte("marker")); err != nil {
		t.Fatal(err)
	}
	sub2, err := c.Subscribe(ctx, "cut-ack")
	if err != nil {
		t.Fatal(err)
	}
	if m3 := recv(t, sub2); m3.Text() != "marker" {
		t.Fatalf("a new consumer got %q (attempt %d), want \"marker\"", m3.Text(), m3.Attempt)
	}
}

// TestRealOperationsWaitForTheReconnect: Publish, Subscribe, Complete and Retry
// issued while the broker is unreachable wait (through a failed attempt) and
// succeed on the next connection, and an Unsubscribe takes effect there; the
// client connects only when its backoff says so.
func TestRealOperationsWaitForTheReconnect(t *testing.T) {
	rb := startRealBroker(t, nil)
	p := proxyT(t, rb.Addr)
	clk := testkit.NewClock(time.Unix(1_700_000_000, 0))
	c := dialT(t, p.Addr(), WithClock(clk), WithRand(func() float64 { return 0.5 }), WithHeartbeat(time.Hour))
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "wait-ops", WithPrefetch(8))
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.Subscribe(ctx, "wait-other")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"ack-me", "retry-me"} {
		if _, err := c.Publish(ctx, "wait-ops", []byte(b)); err != nil {
			t.Fatal(err)
		}
	}
	ackMe, retryMe := recv(t, sub), recv(t, sub)

	mark := len(clk.Waits())
	dials := p.Accepted()
	p.SetRefuse(true)
	p.CutAll()
	if d := nextBackoff(t, clk, &mark); d != 100*time.Millisecond {
		t.Fatalf("first backoff %v, want 100ms", d)
	}

	results := make(chan error, 4)
	var wg sync.WaitGroup
	var late *Subscription
	run := func(f func() error) {
		wg.Add(1)
		go func() { defer wg.Done(); results <- f() }()
	}
	run(func() error { _, err := c.Publish(ctx, "wait-ops", []byte("during")); return err })
	run(func() error { var err error; late, err = c.Subscribe(ctx, "wait-late"); return err })
	run(func() error { return ackMe.Complete(ctx) })
	run(func() error { return retryMe.Retry(ctx) })
	// Unsubscribe needs no connection: the resumed session's reconciliation
	// drops the subscription the client no longer lists.
	if err := other.Unsubscribe(ctx); err != nil {
		t.Fatalf("Unsubscribe during the outage: %v", err)
	}
	until(t, "the publish and the settles wait", func() bool { return c.ep.window.count() == 1 && c.ep.busy.count() == 2 })

	// One attempt at the backoff's end, still refused: nothing fails.
	clk.Advance(100 * time.Millisecond)
	if d := nextBackoff(t, clk, &mark); d != 200*time.Millisecond {
		t.Fatalf("second backoff %v, want 200ms", d)
	}
	select {
	case err := <-results:
		t.Fatalf("an operation ended during the outage: %v", err)
	default:
	}
	p.SetRefuse(false)
	clk.Advance(200 * time.Millisecond)
	wg.Wait()
	close(results)
	for err := range results {
		if err != nil {
			t.Fatalf("operation across the outage: %v", err)
		}
	}
	if n := p.Accepted() - dials; n != 2 {
		t.Fatalf("%d connects during the outage, want 2 (one refused, one that succeeded)", n)
	}
	if err := waitDone(t, other); !errors.Is(err, ErrUnsubscribed) {
		t.Fatalf("unsubscribed during the outage: Err = %v", err)
	}
	// "retry-me" comes back for a second attempt, then "during"; "ack-me" never.
	seen := map[string]uint32{}
	for range 2 {
		m := recv(t, sub)
		seen[m.Text()] = m.Attempt
		if err := m.Complete(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(seen) != 2 || seen["retry-me"] != 2 || seen["during"] != 1 {
		t.Fatalf("after the outage got %v, want retry-me (attempt 2) and during (attempt 1)", seen)
	}
	if _, err := c.Publish(ctx, "wait-late", []byte("late")); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, late); m.Text() != "late" {
		t.Fatalf("subscription made during the outage got %q", m.Text())
	}
}

// TestRealBlipUnderPublishLoop: a short outage under a running publish loop
// costs the application no error, and the client reconnects once.
func TestRealBlipUnderPublishLoop(t *testing.T) {
	rb := startRealBroker(t, nil)
	p := proxyT(t, rb.Addr)
	clk := testkit.NewClock(time.Unix(1_700_000_000, 0))
	c := dialT(t, p.Addr(), WithClock(clk), WithRand(func() float64 { return 0.5 }), WithHeartbeat(time.Hour))
	ctx := testCtx(t)
	if _, err := c.DeclareQueue(ctx, "blip", QueueConfig{Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	const publishers, each = 4, 500
	var (
		mu     sync.Mutex
		done   int
		failed []error
		wg     sync.WaitGroup
	)
	for g := range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				_, err := c.Publish(ctx, "blip", []byte(fmt.Sprintf("%d-%d", g, i)))
				mu.Lock()
				done++
				if err != nil {
					failed = append(failed, err)
				}
				mu.Unlock()
			}
		}()
	}
	progress := func() int { mu.Lock(); defer mu.Unlock(); return done }
	until(t, "the loop is running", func() bool { return progress() >= publishers*each/4 })
	mark := len(clk.Waits())
	dials := p.Accepted()
	// The blip: the broker is unreachable from the cut until the backoff ends.
	p.SetRefuse(true)
	p.CutAll()
	d := nextBackoff(t, clk, &mark)
	p.SetRefuse(false)
	clk.Advance(d)
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("%d publishes failed across the blip, first: %v", len(failed), failed[0])
	}
	if n := p.Accepted() - dials; n != 1 {
		t.Fatalf("%d reconnect attempts for one blip, want 1", n)
	}
	// Every message is stored (a publish whose confirm was lost may be stored
	// twice: at least once).
	sub, err := c.Subscribe(ctx, "blip", WithPrefetch(256))
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[string]bool, publishers*each)
	for len(seen) < publishers*each {
		m := recv(t, sub)
		seen[m.Text()] = true
		m.CompleteAsync()
	}
}

// TestRealCloseEndsTheSession: Close ends the broker's session at once, so
// another consumer gets the unsettled messages now, although the grace is far
// longer than the test, and the old resume identity no longer resumes.
func TestRealCloseEndsTheSession(t *testing.T) {
	rb := testkit.StartBroker(t, testkit.WithServerConfig(func(c *server.Config) { c.ReconnectGraceMs = 3_600_000 }))
	ctx := testCtx(t)
	a, err := Dial(ctx, rb.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	subA, err := a.Subscribe(ctx, "close-ends", WithPrefetch(8))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := a.Publish(ctx, "close-ends", []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		recv(t, subA) // held unsettled
	}
	b := dialT(t, rb.Addr)
	subB, err := b.Subscribe(ctx, "close-ends", WithPrefetch(8))
	if err != nil {
		t.Fatal(err)
	}
	a.ep.mu.Lock()
	ident := a.ep.identity
	a.ep.mu.Unlock()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		m := recv(t, subB)
		if err := m.Complete(ctx); err != nil {
			t.Fatal(err)
		}
	}
	nc, err := net.Dial("tcp", rb.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	o := defaultOptions()
	hello, err := handshake(ctx, nc, &o, ident)
	if err != nil {
		t.Fatal(err)
	}
	if hello.Outcome != protocol.ResumeNotFound {
		t.Fatalf("resume after Close: outcome %v, want resume_not_found", hello.Outcome)
	}
}

// TestRealResumeImpossibleStalesHeldSettles: when the session cannot be
// resumed (no grace), a settle held across the cut fails with
// ErrStaleDelivery, and the broker delivers the message again.
func TestRealResumeImpossibleStalesHeldSettles(t *testing.T) {
	rb := startRealBroker(t, func(c *server.Config) { c.ReconnectGraceMs = 0 })
	p := proxyT(t, rb.Addr)
	c := dialT(t, p.Addr())
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "no-resume", WithPrefetch(4))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, "no-resume", []byte("x")); err != nil {
		t.Fatal(err)
	}
	m := recv(t, sub)
	p.SetStalled(true)
	f := m.CompleteAsync()
	until(t, "the settle is in progress", func() bool { return c.ep.busy.count() == 1 })
	p.CutAll()
	p.SetStalled(false)
	err = f.Wait(ctx)
	var be *BrokerError
	if !errors.Is(err, ErrStaleDelivery) || errors.As(err, &be) || IsRetryable(err) {
		t.Fatalf("held settle after a fresh session = %v, want ErrStaleDelivery", err)
	}
	again := recv(t, sub)
	if again.Offset != m.Offset {
		t.Fatalf("redelivered offset %d, want %d", again.Offset, m.Offset)
	}
	if err := again.Complete(ctx); err != nil {
		t.Fatal(err)
	}
}

// reportWrongSubID makes the client report, at its next resume, a
// subscription id the broker does not hold, as a client would whose broker
// lost the subscription while the socket was down: the broker's own
// subscription is then server-only and closed, which hands its deliveries
// back to the queue.
func reportWrongSubID(c *Client, sub *Subscription) {
	c.ep.mu.Lock()
	sub.serverID += 1000
	c.ep.mu.Unlock()
}

// TestRealReconcileConservativeClosesWithReason: under the conservative
// policy a subscription the broker no longer holds ends with
// ErrReconciledClosed on its receive surface, and the deliveries it held are
// reported stale by INFLIGHT_RESULT, so settling them fails at once.
func TestRealReconcileConservativeClosesWithReason(t *testing.T) {
	rb := startRealBroker(t, nil)
	p := proxyT(t, rb.Addr)
	c := dialT(t, p.Addr(), WithReconcilePolicy(ReconcileConservative))
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "rec-cons", WithPrefetch(4))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, "rec-cons", []byte("held")); err != nil {
		t.Fatal(err)
	}
	m := recv(t, sub)
	reportWrongSubID(c, sub)
	p.CutAll()
	var ended error
	for _, err := range sub.All(ctx) {
		ended = err
		if err != nil {
			break
		}
	}
	if !errors.Is(ended, ErrReconciledClosed) {
		t.Fatalf("receive surface ended with %v, want ErrReconciledClosed", ended)
	}
	// Ended locally by INFLIGHT_RESULT: the settle fails without asking the
	// broker (no *BrokerError inside).
	var be *BrokerError
	if err := m.Complete(ctx); !errors.Is(err, ErrStaleDelivery) || errors.As(err, &be) {
		t.Fatalf("Complete of a delivery of the closed subscription = %v, want a local ErrStaleDelivery", err)
	}
	// The message went back to the queue: a new subscription gets it.
	sub2, err := c.Subscribe(ctx, "rec-cons")
	if err != nil {
		t.Fatal(err)
	}
	if again := recv(t, sub2); again.Offset != m.Offset {
		t.Fatalf("got offset %d, want %d", again.Offset, m.Offset)
	} else if err := again.Complete(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRealReconcileRestoreRemapsRecreated: under the restore policy the
// broker recreates the subscription under a new id; the client remaps to it
// and the same Subscription keeps receiving, without subscribing twice.
func TestRealReconcileRestoreRemapsRecreated(t *testing.T) {
	rb := startRealBroker(t, nil)
	p := proxyT(t, rb.Addr)
	c := dialT(t, p.Addr(), WithReconcilePolicy(ReconcileRestore))
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "rec-restore", WithPrefetch(4))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, "rec-restore", []byte("held")); err != nil {
		t.Fatal(err)
	}
	m := recv(t, sub)
	c.ep.mu.Lock()
	before := sub.serverID
	c.ep.mu.Unlock()
	reportWrongSubID(c, sub)
	p.CutAll()
	// The old subscription's lease went back to the queue and the recreated
	// subscription receives the message again.
	again := recv(t, sub)
	if again.Offset != m.Offset {
		t.Fatalf("after the recreate got offset %d, want %d", again.Offset, m.Offset)
	}
	var be *BrokerError
	if err := m.Complete(ctx); !errors.Is(err, ErrStaleDelivery) || errors.As(err, &be) {
		t.Fatalf("Complete of the old subscription's delivery = %v, want a local ErrStaleDelivery", err)
	}
	if err := again.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	c.ep.mu.Lock()
	after := sub.serverID
	nsubs := len(c.ep.subs)
	c.ep.mu.Unlock()
	if after == before || after == before+1000 || after == 0 || nsubs != 1 {
		t.Fatalf("server id %d -> %d with %d subscriptions, want a new id and one subscription", before, after, nsubs)
	}
	if _, err := c.Publish(ctx, "rec-restore", []byte("next")); err != nil {
		t.Fatal(err)
	}
	if n := recv(t, sub); n.Text() != "next" {
		t.Fatalf("got %q, want \"next\"", n.Text())
	}
	select {
	case <-sub.Done():
		t.Fatalf("subscription ended: %v", sub.Err())
	default:
	}
}

// records is a slog handler that keeps every record.
type records struct {
	mu    sync.Mutex
	msgs  []string
	errs  []string
	attrs []map[string]string
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	errText := ""
	attrs := map[string]string{}
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "err" {
			errText = a.Value.String()
		}
		attrs[a.Key] = a.Value.String()
		return true
	})
	r.errs = append(r.errs, errText)
	r.attrs = append(r.attrs, attrs)
	return nil
}

// TestDialConnectTimeoutLogsAttempts: with unlimited attempts, Dial still
// ends at its connect timeout, and each failed attempt is logged with its
// reason. The backoff runs on a fake clock that stands still, so only the
// timeout can end the wait.
func TestDialConnectTimeoutLogsAttempts(t *testing.T) {
	b := newFakeBroker(t)
	p := proxyT(t, b.addr())
	p.SetRefuse(true)
	rec := &records{}
	clk := testkit.NewClock(time.Unix(1_700_000_000, 0))
	_, err := Dial(testCtx(t), p.Addr(), WithConnectTimeout(50*time.Millisecond), WithClock(clk),
		WithLogger(slog.New(rec)))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial = %v, want the connect timeout (context.DeadlineExceeded)", err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.msgs) == 0 {
		t.Fatal("no failed attempt was logged")
	}
	for i, m := range rec.msgs {
		if !strings.Contains(m, "connect attempt failed") || rec.errs[i] == "" {
			t.Fatalf("log %d: %q with reason %q, want a failed attempt with its reason", i, m, rec.errs[i])
		}
	}
	if p.Accepted() != len(rec.msgs) {
		t.Fatalf("%d attempts, %d logged", p.Accepted(), len(rec.msgs))
	}
}

// TestRealResumeRejectedStartsFresh: when the broker rejects the resume (here
// a token that does not match, as a forged identity would), the client starts
// a fresh session: the subscription is restored, the old delivery's settle
// fails with ErrStaleDelivery, and the message is delivered again.
func TestRealResumeRejectedStartsFresh(t *testing.T) {
	// The old session stays dormant, holding the lease, until its grace ends.
	rb := startRealBroker(t, func(c *server.Config) { c.ReconnectGraceMs = 200 })
	p := proxyT(t, rb.Addr)
	rec := &records{}
	c := dialT(t, p.Addr(), WithLogger(slog.New(rec)))
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "rejected", WithPrefetch(4))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, "rejected", []byte("x")); err != nil {
		t.Fatal(err)
	}
	m := recv(t, sub)
	c.ep.mu.Lock()
	c.ep.identity.Token = append([]byte("forged-"), c.ep.identity.Token...)
	c.ep.mu.Unlock()
	p.CutAll()
	again := recv(t, sub) // once the old session's grace has let the lease go
	if again.Offset != m.Offset {
		t.Fatalf("got offset %d, want %d", again.Offset, m.Offset)
	}
	if err := m.Complete(ctx); !errors.Is(err, ErrStaleDelivery) {
		t.Fatalf("Complete of the old session's delivery = %v, want ErrStaleDelivery", err)
	}
	if err := again.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if !slices.Contains(rec.msgs, "sinew: session not resumed, starting a fresh one") {
		t.Fatalf("no log of the rejected resume in %q", rec.msgs)
	}
}

// TestRealLateSettleAfterRedeliveryIsStale: a settle of a lease that ended
// (released by Unsubscribe) and was leased again to another consumer is refused with the typed
// ErrStaleDelivery (stale_lease), and the other consumer's settle wins.
func TestRealLateSettleAfterRedeliveryIsStale(t *testing.T) {
	rb := startRealBroker(t, nil)
	ctx := testCtx(t)
	a := dialT(t, rb.Addr)
	b := dialT(t, rb.Addr)
	if _, err := a.DeclareQueue(ctx, "late", QueueConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	subA, err := a.Subscribe(ctx, "late", WithPrefetch(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Publish(ctx, "late", []byte("x")); err != nil {
		t.Fatal(err)
	}
	m := recv(t, subA)
	if err := subA.Unsubscribe(ctx); err != nil { // releases the lease; A's settle comes late
		t.Fatal(err)
	}
	subB, err := b.Subscribe(ctx, "late", WithPrefetch(1))
	if err != nil {
		t.Fatal(err)
	}
	other := recv(t, subB) // leased again
	if other.Offset != m.Offset {
		t.Fatalf("B got offset %d, want %d", other.Offset, m.Offset)
	}
	err = m.Complete(ctx)
	if !errors.Is(err, ErrStaleDelivery) || !errors.Is(err, &BrokerError{Code: protocol.CodeStaleLease}) {
		t.Fatalf("late Complete = %v, want ErrStaleDelivery (stale_lease)", err)
	}
	if err := other.Complete(ctx); err != nil {
		t.Fatalf("the current holder's Complete: %v", err)
	}
}

// find returns the attributes of the first record with message msg.
func (r *records) find(msg string) (map[string]string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, m := range r.msgs {
		if m == msg {
			return r.attrs[i], true
		}
	}
	return nil, false
}

// TestRealInflightReconciliation: after a resume the client reports the
// delivery it holds unsettled (kept: not sent again), and a delivery lost
// with the old socket reaches the application once; nothing is delivered
// twice and both settles succeed.
func TestRealInflightReconciliation(t *testing.T) {
	rb := startRealBroker(t, nil)
	p := proxyT(t, rb.Addr)
	rec := &records{}
	c := dialT(t, p.Addr(), WithLogger(slog.New(rec)))
	direct := dialT(t, rb.Addr)
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "inflight", WithPrefetch(8))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Publish(ctx, "inflight", []byte("held")); err != nil {
		t.Fatal(err)
	}
	held := recv(t, sub)
	// "lost" is published while the socket is stalled: its DELIVER is either
	// held in the proxy and lost with the cut, or not yet written.
	p.SetStalled(true)
	if _, err := direct.Publish(ctx, "inflight", []byte("lost")); err != nil {
		t.Fatal(err)
	}
	p.CutAll()
	p.SetStalled(false)
	lost := recv(t, sub)
	if lost.Text() != "lost" {
		t.Fatalf("after the resume got %q, want \"lost\"", lost.Text())
	}
	if _, err := direct.Publish(ctx, "inflight", []byte("marker")); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, sub); m.Text() != "marker" {
		t.Fatalf("got %q (attempt %d), want \"marker\": a delivery came twice", m.Text(), m.Attempt)
	}
	for _, m := range []*Message{held, lost} {
		if err := m.Complete(ctx); err != nil {
			t.Fatalf("Complete %q: %v", m.Text(), err)
		}
	}
	attrs, ok := rec.find("sinew: in-flight deliveries reconciled")
	if !ok {
		t.Fatal("no INFLIGHT_RESULT was logged")
	}
	// The held delivery is always reported. "lost" (when its DELIVER was
	// still in the session's outbox) and "marker" can reach the
	// application over the new connection before INFLIGHT is sent; then
	// they are reported too. Whatever was reported, the broker keeps it all.
	if attrs["reported"] == "0" || attrs["kept"] != attrs["reported"] || attrs["stale"] != "0" {
		t.Fatalf("INFLIGHT_RESULT %v, want every reported delivery kept and none stale", attrs)
	}
}

// TestRealCloseDuringACutSendsHeldSettles: Close called while the socket is
// down waits (bounded by the drain timeout) for the reconnect, lets the held
// settle through and then ends the session; the ack counts.
func TestRealCloseDuringACutSendsHeldSettles(t *testing.T) {
	rb := startRealBroker(t, nil)
	p := proxyT(t, rb.Addr)
	ctx := testCtx(t)
	c, err := Dial(ctx, p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, "close-cut", WithPrefetch(4))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, "close-cut", []byte("x")); err != nil {
		t.Fatal(err)
	}
	m := recv(t, sub)
	p.SetStalled(true)
	f := m.CompleteAsync()
	until(t, "the settle is in progress", func() bool { return c.ep.busy.count() == 1 })
	p.CutAll()
	p.SetStalled(false)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Wait(ctx); err != nil {
		t.Fatalf("settle held across the cut and Close: %v", err)
	}
	other := dialT(t, rb.Addr)
	if _, err := other.Publish(ctx, "close-cut", []byte("marker")); err != nil {
		t.Fatal(err)
	}
	sub2, err := other.Subscribe(ctx, "close-cut")
	if err != nil {
		t.Fatal(err)
	}
	if got := recv(t, sub2); got.Text() != "marker" {
		t.Fatalf("after Close the queue held %q (attempt %d): the ack was lost", got.Text(), got.Attempt)
	}
}

// restartFake simulates a broker process restart on the fake: a new server
// generation, no session survives, every connection dropped, publishes
// answered again.
func restartFake(b *fakeBroker, gen uint64) {
	b.mu.Lock()
	b.generation = gen
	b.holdPublishes = false
	b.sessions = map[string]*fSession{}
	for c := range b.conns {
		_ = c.nc.Close()
	}
	b.mu.Unlock()
}

// After a restart (a new generation in HELLO_OK) the client resends the held
// publishes the broker can deduplicate (those with a producer id, the
// default) and fails, as ErrConnectionLost, the one without a producer id,
// whose outcome the new broker process cannot settle. After a mere break
// (same generation) both are resent.
func TestGenerationChangeResendsOnlyIdempotentPublishes(t *testing.T) {
	for _, tc := range []struct {
		name      string
		gen       uint64
		plainSent bool
	}{{"restart", 2, false}, {"break", 1, true}} {
		t.Run(tc.name, func(t *testing.T) {
			b := newFakeBroker(t)
			c := dialT(t, b.addr())
			ctx := testCtx(t)
			b.mu.Lock()
			b.holdPublishes = true
			b.mu.Unlock()
			idem := c.PublishAsync(ctx, "gen", []byte("idempotent"))
			plain := c.PublishAsync(ctx, "gen", []byte("plain"), WithProducerSequence("", 0))
			until(t, "both publishes reached the broker", func() bool {
				b.mu.Lock()
				defer b.mu.Unlock()
				return len(b.heldPublishes) == 2
			})
			restartFake(b, tc.gen)

			if r, err := idem.Wait(ctx); err != nil || r.Duplicate {
				t.Fatalf("idempotent publish after %s: %+v %v", tc.name, r, err)
			}
			_, err := plain.Wait(ctx)
			if tc.plainSent && err != nil {
				t.Fatalf("publish without producer id after a break: %v", err)
			}
			if !tc.plainSent && (!errors.Is(err, ErrConnectionLost) || !IsRetryable(err)) {
				t.Fatalf("publish without producer id after a restart: %v, want a retryable ErrConnectionLost", err)
			}
			b.mu.Lock()
			defer b.mu.Unlock()
			q := b.queues["gen"]
			var stored []string
			for _, m := range q.ready {
				stored = append(stored, string(m.pub.Body))
			}
			want := []string{"idempotent"}
			if tc.plainSent {
				want = append(want, "plain")
			}
			if !slices.Equal(stored, want) {
				t.Fatalf("stored %q, want %q", stored, want)
			}
		})
	}
}

// A publish the broker refuses with shutting_down (it crossed GOING_AWAY on
// the wire; nothing was stored) is not an application error: the client
// leaves the draining connection, and the publish is sent again, once, on
// the next one.
func TestShuttingDownPublishIsHeldForTheNextConnection(t *testing.T) {
	b := newFakeBroker(t)
	c := dialT(t, b.addr())
	ctx := testCtx(t)
	b.mu.Lock()
	b.refusePublishes = 1
	b.mu.Unlock()
	r, err := c.Publish(ctx, "drain", []byte("crossed"))
	if err != nil {
		t.Fatalf("publish refused while draining surfaced %v", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.queues["drain"]
	if q == nil || len(q.ready) != 1 || string(q.ready[0].pub.Body) != "crossed" || r.Offset != q.ready[0].offset {
		t.Fatalf("stored %+v, result %+v; want the publish once", q, r)
	}
	if len(b.hellos) != 2 {
		t.Fatalf("%d handshakes, want 2: the client leaves the draining connection", len(b.hellos))
	}
}

// A SUBSCRIBE the broker refuses with shutting_down made nothing: Subscribe
// leaves the draining connection and subscribes on the next one, and the
// application gets a working subscription, not an error.
func TestShuttingDownSubscribeWaitsForTheNextConnection(t *testing.T) {
	b := newFakeBroker(t)
	c := dialT(t, b.addr())
	ctx := testCtx(t)
	b.mu.Lock()
	b.refuseSubscribes = 1
	b.mu.Unlock()
	sub, err := c.Subscribe(ctx, "drain-sub")
	if err != nil {
		t.Fatalf("subscribe refused while draining surfaced %v", err)
	}
	if _, err := c.Publish(ctx, "drain-sub", []byte("after")); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, sub); m.Text() != "after" {
		t.Fatalf("got %q", m.Text())
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.hellos) != 2 {
		t.Fatalf("%d handshakes, want 2: the client leaves the draining connection", len(b.hellos))
	}
}
