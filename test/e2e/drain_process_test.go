package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/protocol"
)

// termChild sends SIGTERM to c and waits for it to exit; it returns the exit
// status and how long the exit took.
func termChild(t *testing.T, c *child) (status int, took time.Duration) {
	t.Helper()
	start := time.Now()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	return waitChild(t, c), time.Since(start)
}

// waitChild waits (bounded by safetyTimeout) for c to exit and returns its
// exit status.
func waitChild(t testing.TB, c *child) int {
	t.Helper()
	select {
	case <-c.done: // stderr read to its end: the process closed it on exit
	case <-time.After(safetyTimeout):
		t.Fatalf("sinew serve did not exit:\n%s", c.log())
	}
	err := c.cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("wait: %v", err)
	return -1
}

// rollingSettings are the knobs of TestRollingRestartUnderLoad; the long
// variant runs with SINEW_DRAIN_SOAK=1.
func rollingSettings() (restarts int, between time.Duration) {
	if os.Getenv("SINEW_DRAIN_SOAK") != "" {
		return 10, 3 * time.Second
	}
	return 3, time.Second
}

// TestRollingRestartUnderLoad restarts a real `sinew serve` process with
// SIGTERM (drain) several times while an SDK client publishes 2,000 messages a
// second and consumes them. Neither side may see an error, every confirmed
// message must arrive exactly once with attempt 1 (none lost, none
// redelivered), and every drain must end in exit status 0. It logs the longest
// pause seen by the publisher (between two confirms) and by the consumer
// (between two deliveries), and each drain's and restart's duration.
func TestRollingRestartUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	const ratePerSec, tickMs = 2000, 10
	restarts, between := rollingSettings()
	bin := buildSinew(t)
	dir := t.TempDir()
	srv := startChildArgs(t, bin, dir, "--runtime-seed-connection-drain-timeout-ms", "10000")
	addr := srv.addr

	c := sdkDial(t, addr, sinew.WithLogger(slog.New(slog.DiscardHandler)))
	// The run itself takes (restarts+1)*between; every wait within it is
	// bounded by safetyTimeout on top.
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(restarts+1)*between+safetyTimeout)
	defer cancel()
	if _, err := c.DeclareQueue(ctx, "roll", sinew.QueueConfig{Partitions: 2, Lease: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	sub, err := c.Subscribe(ctx, "roll", sinew.WithPrefetch(64))
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var appErrs []error
	confirmed := map[string]bool{}
	seen := map[string]int{}
	redelivered := 0
	var lastConfirm, lastRecv time.Time
	var pubGap, recvGap time.Duration
	target := -1 // confirmed total, once publishing is over
	allIn := make(chan struct{})
	fail := func(err error) {
		mu.Lock()
		if len(appErrs) < 20 {
			appErrs = append(appErrs, err)
		}
		mu.Unlock()
	}
	checkAllIn := func() { // mu held
		if target >= 0 && len(seen) >= target {
			for body := range confirmed {
				if seen[body] == 0 {
					return
				}
			}
			select {
			case <-allIn:
			default:
				close(allIn)
			}
		}
	}

	settles := make(chan *sinew.SettleFuture, 1<<16)
	settleDone := make(chan struct{})
	go func() { // settle results
		defer close(settleDone)
		for f := range settles {
			if err := f.Wait(ctx); err != nil {
				fail(fmt.Errorf("complete: %w", err))
			}
		}
	}()
	consumeDone := make(chan struct{})
	go func() { // consumer
		defer close(consumeDone)
		defer close(settles)
		for {
			select {
			case m, ok := <-sub.Messages():
				if !ok {
					fail(fmt.Errorf("subscription ended: %w", sub.Err()))
					return
				}
				now := time.Now()
				mu.Lock()
				if !lastRecv.IsZero() {
					recvGap = max(recvGap, now.Sub(lastRecv))
				}
				lastRecv = now
				seen[m.Text()]++
				if m.Attempt != 1 || seen[m.Text()] > 1 {
					redelivered++
				}
				checkAllIn()
				mu.Unlock()
				settles <- m.CompleteAsync()
			case <-allIn:
				return
			case <-ctx.Done():
				return
			}
		}
	}()

	stopPub := make(chan struct{})
	futures := make(chan struct {
		body string
		f    *sinew.PublishFuture
	}, 1<<16)
	pubDone := make(chan struct{})
	go func() { // publisher: ratePerSec, in bursts every tickMs
		defer close(futures)
		tick := time.NewTicker(tickMs * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; {
			select {
			case <-stopPub:
				return
			case <-tick.C:
			}
			for range ratePerSec * tickMs / 1000 {
				body := fmt.Sprintf("m-%07d", i)
				i++
				futures <- struct {
					body string
					f    *sinew.PublishFuture
				}{body, c.PublishAsync(ctx, "roll", []byte(body))}
			}
		}
	}()
	go func() { // confirms
		defer close(pubDone)
		for p := range futures {
			if _, err := p.f.Wait(ctx); err != nil {
				fail(fmt.Errorf("publish %s: %w", p.body, err))
				continue
			}
			now := time.Now()
			mu.Lock()
			if !lastConfirm.IsZero() {
				pubGap = max(pubGap, now.Sub(lastConfirm))
			}
			lastConfirm = now
			confirmed[p.body] = true
			mu.Unlock()
		}
	}()

	pace := func() {
		select {
		case <-time.After(between):
		case <-ctx.Done():
			t.Fatal("out of time")
		}
	}
	var drains, recoveries []time.Duration
	for range restarts {
		pace()
		status, took := termChild(t, srv)
		if status != 0 {
			t.Fatalf("drain ended with exit status %d:\n%s", status, srv.log())
		}
		if !strings.Contains(srv.log(), "msg=\"drain phase 2: closing connections\"") || strings.Contains(srv.log(), "timed_out=true") {
			t.Fatalf("the drain did not end because work settled:\n%s", srv.log())
		}
		drains = append(drains, took)
		start := time.Now()
		srv = startChildArgs(t, bin, dir, "--runtime-seed-connection-drain-timeout-ms", "10000", "--listen", addr)
		recoveries = append(recoveries, time.Since(start))
	}
	pace()
	close(stopPub)
	<-pubDone
	mu.Lock()
	target = len(confirmed)
	checkAllIn()
	mu.Unlock()
	select {
	case <-allIn:
	case <-ctx.Done():
	}
	<-consumeDone
	<-settleDone

	mu.Lock()
	defer mu.Unlock()
	lost := 0
	for body := range confirmed {
		if seen[body] == 0 {
			lost++
		}
	}
	t.Logf("%d restarts; %d confirmed, %d distinct received, lost %d, redelivered %d; longest pause: publish %v, consume %v; drains %v; restarts to serving %v",
		restarts, len(confirmed), len(seen), lost, redelivered, pubGap.Round(time.Millisecond), recvGap.Round(time.Millisecond), drains, recoveries)
	if len(appErrs) > 0 {
		t.Fatalf("the application saw errors: %v", appErrs)
	}
	if lost != 0 || redelivered != 0 {
		t.Fatalf("lost %d, redelivered %d; want 0 and 0", lost, redelivered)
	}
	if err := c.Err(); err != nil {
		t.Fatalf("client: %v", err)
	}
	stopChild(t, srv)
}

// TestSecondSigtermExitsAtOnce: while a drain waits for a delivery a consumer
// holds (its deadline two minutes away), a second SIGTERM ends the process at
// once with status 1, and a restart finds every confirmed message.
func TestSecondSigtermExitsAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	const total = 50
	bin := buildSinew(t)
	dir := t.TempDir()
	srv := startChildArgs(t, bin, dir, "--runtime-seed-connection-drain-timeout-ms", "120000")
	c := dial(t, srv.addr)
	for i := range total {
		c.publish(&protocol.Publish{Topic: "sigterm2", Partition: -1, Body: body(fmt.Sprint(i))})
	}
	c.subscribe(&protocol.Subscribe{Topic: "sigterm2", Partition: -1, Prefetch: 1})
	c.next() // held unsettled: the drain cannot finish before its deadline

	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	expect[*protocol.GoingAway](c) // the drain has begun
	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// safetyTimeout (30 s) is well inside the drain's two minutes: exiting
	// within it is exiting at once.
	if status := waitChild(t, srv); status != 1 {
		t.Fatalf("exit status %d after the second SIGTERM, want 1:\n%s", status, srv.log())
	}
	if !strings.Contains(srv.log(), "second signal during the drain") {
		t.Fatalf("no log of the second signal:\n%s", srv.log())
	}

	b, err := broker.Open(broker.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	n := 0
	for _, q := range b.Stats().Queues {
		if q.Topic != "sigterm2" {
			continue
		}
		for _, p := range q.Partitions {
			if p.Quarantined {
				t.Fatalf("partition %d quarantined after the second SIGTERM: %s", p.Partition, p.Err)
			}
			n += p.Ready + p.Inflight + p.Delayed
		}
	}
	if n != total {
		t.Fatalf("%d messages after the restart, want all %d confirmed", n, total)
	}
}
