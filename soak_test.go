//go:build soak

package sinew

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/server"
	"github.com/sinewmq/sinew/internal/testkit"
	"github.com/sinewmq/sinew/test/chaos/faultproxy"
)

// TestSoakCutEvery2s is the cut soak of docs/reliability.md ("A cut socket
// under a live consumer"): a consumer (prefetch 64, manual ack) behind a proxy
// that resets its socket every 2 s for 60 s, with the reconnect grace `sinew
// serve` seeds (5 s) and the broker's data on the real file system, while a
// producer on its own connection publishes 20,000 messages at an even pace
// over the same minute. It checks that no error reaches the application, that
// no acked message is delivered again and that every reconnect resumed, and it
// reports the time from each new socket to the first delivery after it.
//
//	go test -tags soak -run TestSoakCutEvery2s -v .
func TestSoakCutEvery2s(t *testing.T) {
	const (
		total    = 20_000
		run      = 60 * time.Second
		cutEvery = 2 * time.Second
		topic    = "soak"
	)
	rb := testkit.StartBroker(t, testkit.WithDataDir(t.TempDir()),
		testkit.WithServerConfig(func(c *server.Config) { c.ReconnectGraceMs = 5000 }))
	p, err := faultproxy.Start("127.0.0.1:0", rb.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), run+60*time.Second)
	defer cancel()

	// New sockets, stamped when the dial returns.
	var dialsMu sync.Mutex
	var dials []time.Time
	var d net.Dialer
	dialer := func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := d.DialContext(ctx, network, addr)
		if err == nil {
			dialsMu.Lock()
			dials = append(dials, time.Now())
			dialsMu.Unlock()
		}
		return nc, err
	}
	rec := &records{}
	c, err := Dial(ctx, p.Addr(), WithDialer(dialer), WithLogger(slog.New(rec)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prod := dialT(t, rb.Addr)
	if _, err := prod.DeclareQueue(ctx, topic, QueueConfig{Partitions: 2}); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, topic, WithPrefetch(64))
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // producer: an even pace over the run
		defer wg.Done()
		const batch = 20
		tick := time.NewTicker(run / (total / batch))
		defer tick.Stop()
		for i := 0; i < total; i += batch {
			<-tick.C
			fs := make([]*PublishFuture, 0, batch)
			for j := i; j < i+batch; j++ {
				// The body carries its publish time, so that a delivery
				// waiting for the producer is not counted as resume time.
				fs = append(fs, prod.PublishAsync(ctx, topic, []byte(fmt.Sprintf("%d %d", j, time.Now().UnixNano()))))
			}
			for _, f := range fs {
				if _, err := f.Wait(ctx); err != nil {
					t.Errorf("publish: %v", err)
					return
				}
			}
		}
	}()
	stopCuts := make(chan struct{})
	go func() { // the fault: a reset every cutEvery until the run ends
		defer wg.Done()
		tick := time.NewTicker(cutEvery)
		defer tick.Stop()
		for time.Since(start) < run {
			select {
			case <-tick.C:
				p.Cut()
			case <-stopCuts:
				return
			}
		}
	}()

	type pos struct {
		part uint32
		off  uint64
	}
	acked := make(map[pos]bool, total)
	// arrival of each delivery, and the later of it and its publish time
	type arrival struct{ at, ready time.Time }
	var arrivals []arrival
	appErrors, ackedAgain := 0, 0
	for len(acked) < total {
		var m *Message
		select {
		case m = <-sub.Messages():
		case <-ctx.Done():
			t.Fatalf("stopped after %d of %d: %v", len(acked), total, ctx.Err())
		}
		if m == nil {
			t.Fatalf("subscription ended: %v", sub.Err())
		}
		var seq, pubNs int64
		if _, err := fmt.Sscanf(m.Text(), "%d %d", &seq, &pubNs); err != nil {
			t.Fatalf("body %q: %v", m.Text(), err)
		}
		arrivals = append(arrivals, arrival{at: time.Now(), ready: time.Unix(0, pubNs)})
		k := pos{m.Partition, m.Offset}
		if acked[k] {
			ackedAgain++
		}
		if err := m.Complete(ctx); err != nil {
			appErrors++
			t.Logf("Complete %v: %v", k, err)
			continue
		}
		acked[k] = true
	}
	close(stopCuts)
	wg.Wait()
	elapsed := time.Since(start)

	// Time from each new socket (after the first) to the first delivery that
	// arrived after it, less any time that delivery's message was not yet
	// published: from max(socket, publish) to arrival.
	dialsMu.Lock()
	sockets := append([]time.Time(nil), dials...)
	dialsMu.Unlock()
	var gaps []time.Duration
	for _, s := range sockets[1:] {
		i, _ := slices.BinarySearchFunc(arrivals, s, func(a arrival, b time.Time) int { return a.at.Compare(b) })
		if i < len(arrivals) {
			from := s
			if arrivals[i].ready.After(from) {
				from = arrivals[i].ready
			}
			gaps = append(gaps, arrivals[i].at.Sub(from))
		}
	}
	slices.Sort(gaps)
	pct := func(q float64) time.Duration {
		if len(gaps) == 0 {
			return 0
		}
		return gaps[min(len(gaps)-1, int(q*float64(len(gaps))))]
	}
	rec.mu.Lock()
	resumed, notResumed := 0, 0
	for _, msg := range rec.msgs {
		switch msg {
		case "sinew: session resumed":
			resumed++
		case "sinew: session not resumed, starting a fresh one":
			notResumed++
		}
	}
	rec.mu.Unlock()
	t.Logf("%d messages in %v; cuts %d, new sockets %d, resumed %d, not resumed %d; application errors %d, acked delivered again %d; socket to first delivery: p50 %v, p99 %v, max %v (n=%d)",
		len(acked), elapsed.Round(time.Millisecond), p.Stats().Cut, len(sockets), resumed, notResumed, appErrors, ackedAgain,
		pct(0.50), pct(0.99), pct(1), len(gaps))
	if appErrors != 0 || ackedAgain != 0 || notResumed != 0 || resumed != len(sockets)-1 {
		t.Fatalf("want 0 errors, 0 acked delivered again and every reconnect resumed")
	}
}

// TestSoakCutLongerThanGrace: a consumer cut off for longer than the reconnect
// grace (5 s, as `sinew serve` seeds) loses its session; its unsettled
// messages reach another consumer once the grace has run out, and its own
// late settles of them fail with ErrStaleDelivery when it comes back. It
// reports the time from the cut to the other consumer holding all of them.
//
//	go test -tags soak -run TestSoakCutLongerThanGrace -v .
func TestSoakCutLongerThanGrace(t *testing.T) {
	const (
		held    = 16
		graceMs = 5000
		topic   = "grace-out"
	)
	rb := testkit.StartBroker(t, testkit.WithDataDir(t.TempDir()),
		testkit.WithServerConfig(func(c *server.Config) { c.ReconnectGraceMs = graceMs }))
	p, err := faultproxy.Start("127.0.0.1:0", rb.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, err := Dial(ctx, p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b := dialT(t, rb.Addr)
	subA, err := a.Subscribe(ctx, topic, WithPrefetch(held))
	if err != nil {
		t.Fatal(err)
	}
	for i := range held {
		if _, err := b.Publish(ctx, topic, []byte(fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	var mine []*Message
	for range held {
		mine = append(mine, recv(t, subA))
	}
	subB, err := b.Subscribe(ctx, topic, WithPrefetch(held))
	if err != nil {
		t.Fatal(err)
	}
	p.Refuse(true)
	cut := time.Now()
	p.Cut()
	var theirs []*Message
	for range held {
		select {
		case m := <-subB.Messages():
			theirs = append(theirs, m)
		case <-ctx.Done():
			t.Fatalf("the other consumer got %d of %d", len(theirs), held)
		}
	}
	took := time.Since(cut)
	p.Refuse(false)
	for _, m := range theirs {
		if err := m.Complete(ctx); err != nil {
			t.Fatalf("the new holder's Complete: %v", err)
		}
	}
	stale := 0
	for _, m := range mine {
		if err := m.Complete(ctx); errors.Is(err, ErrStaleDelivery) {
			stale++
		}
	}
	t.Logf("grace %d ms: the other consumer held all %d messages %v after the cut (goal: within grace + 1 s); late settles stale %d of %d",
		graceMs, held, took.Round(time.Millisecond), stale, held)
	if took > graceMs*time.Millisecond+time.Second || stale != held {
		t.Fatalf("want the messages within grace + 1 s and every late settle stale")
	}
}
