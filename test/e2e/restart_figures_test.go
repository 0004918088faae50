package e2e_test

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
)

// TestRestartFigures measures what a consumer sees across broker restarts
// (docs/reliability.md, "Restart and drain"). It is slow, so it runs only
// with SINEW_RESTART_FIGURES=1. For each restart window (0: the behaviour
// without session restore, and 30 s) and each signal, cycles times: the
// consumer holds held deliveries unsettled, the broker is stopped and
// started again at the same address, and the consumer ACKs what it holds.
// It logs the ACKs accepted and refused, the messages delivered again, the
// broker's start-up time, and the longest pause (stop signal to the last
// ACK answered).
func TestRestartFigures(t *testing.T) {
	if os.Getenv("SINEW_RESTART_FIGURES") == "" {
		t.Skip("set SINEW_RESTART_FIGURES=1 to measure restart figures")
	}
	const cycles, held = 10, 20
	bin := buildSinew(t)
	for _, grace := range []int{0, 30_000} {
		for _, sig := range []os.Signal{syscall.SIGTERM, syscall.SIGKILL} {
			t.Run(fmt.Sprintf("grace=%d/%v", grace, sig), func(t *testing.T) {
				restartFigures(t, bin, grace, sig, cycles, held)
			})
		}
	}
}

func restartFigures(t *testing.T, bin string, graceMs int, sig os.Signal, cycles, held int) {
	dir := t.TempDir()
	addr := freeAddr(t)
	args := []string{"--listen", addr, "--runtime-seed-connection-restart-grace-ms", fmt.Sprint(graceMs)}
	srv := startChildArgs(t, bin, dir, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c, err := sinew.Dial(ctx, addr, fastReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sub, err := c.Subscribe(ctx, "figures", sinew.WithPrefetch(held))
	if err != nil {
		t.Fatal(err)
	}
	var accepted, refused, redelivered int
	var startMax, startSum, pauseMax time.Duration
	seen := map[string]bool{}
	for cycle := range cycles {
		for i := range held {
			if _, err := c.PublishText(ctx, "figures", fmt.Sprintf("c%d-m%d", cycle, i)); err != nil {
				t.Fatal(err)
			}
		}
		var hold []*sinew.Message
		for len(hold) < held {
			m := <-sub.Messages()
			if seen[m.Text()] {
				redelivered++
				m.Complete(ctx)
				continue
			}
			seen[m.Text()] = true
			hold = append(hold, m)
		}
		t0 := time.Now()
		signalChild(t, srv, sig)
		t1 := time.Now()
		srv = startChildArgs(t, bin, dir, args...)
		start := time.Since(t1)
		startSum += start
		startMax = max(startMax, start)
		for _, m := range hold {
			if err := m.Complete(ctx); err != nil {
				refused++
			} else {
				accepted++
			}
		}
		pauseMax = max(pauseMax, time.Since(t0))
		// Whatever was released comes back before this cycle's sentinel.
		sentinel := fmt.Sprintf("c%d-sentinel", cycle)
		if _, err := c.PublishText(ctx, "figures", sentinel); err != nil {
			t.Fatal(err)
		}
		for {
			m := <-sub.Messages()
			if err := m.Complete(ctx); err != nil {
				t.Fatalf("ack of %s: %v", m.Text(), err)
			}
			if m.Text() == sentinel {
				break
			}
			if seen[m.Text()] {
				redelivered++
			}
		}
	}
	signalChild(t, srv, syscall.SIGTERM)
	t.Logf("restart_grace_ms=%d signal=%v cycles=%d held=%d: acks accepted %d, refused %d; delivered again %d; start-up mean %v max %v; longest pause (signal to last ack) %v",
		graceMs, sig, cycles, held, accepted, refused, redelivered, (startSum / time.Duration(cycles)).Round(time.Millisecond),
		startMax.Round(time.Millisecond), pauseMax.Round(time.Millisecond))
}
