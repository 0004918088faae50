package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sinewmq/sinew/test/chaos/harness"
)

func kill9(ctx context.Context, e *env) error {
	if err := e.broker.Kill(); err != nil {
		return err
	}
	e.logf("killed -9; restarting")
	return e.broker.Restart()
}

func proxyCut(ctx context.Context, e *env) error {
	n := e.proxy.Cut()
	e.proxy.Refuse(true)
	hold(ctx, 100*time.Millisecond)
	e.proxy.Refuse(false)
	e.logf("reset %d connections, refused new ones for 100ms", n)
	return nil
}

func TestKill9(t *testing.T) {
	runScenario(t, scenario{name: "kill9", every: 700 * time.Millisecond, fault: kill9})
}

// TestSDKKill9 is TestKill9 with the Go SDK's own reconnect, resume and
// idempotent resend in the loop.
func TestSDKKill9(t *testing.T) {
	runScenario(t, scenario{name: "sdk-kill9", sdk: true, every: 700 * time.Millisecond, fault: kill9})
}

func TestTermDrain(t *testing.T) {
	runScenario(t, scenario{name: "term", every: time.Second,
		fault: func(ctx context.Context, e *env) error {
			if err := e.broker.Term(termDrainTimeout); err != nil {
				return err
			}
			e.logf("drained and exited 0; restarting")
			return e.broker.Restart()
		}})
}

func TestPause(t *testing.T) {
	runScenario(t, scenario{name: "pause", every: 900 * time.Millisecond,
		fault: func(ctx context.Context, e *env) error {
			if err := e.broker.Pause(); err != nil {
				return err
			}
			hold(ctx, 400*time.Millisecond)
			e.logf("SIGSTOP held; SIGCONT")
			return e.broker.Resume()
		},
		heal: func(e *env) error { return e.broker.Resume() }})
}

func TestProxyCut(t *testing.T) {
	runScenario(t, scenario{name: "proxycut", proxy: true, every: 400 * time.Millisecond, fault: proxyCut,
		heal: func(e *env) error { e.proxy.Refuse(false); return nil }})
}

func TestSDKProxyCut(t *testing.T) {
	runScenario(t, scenario{name: "sdk-proxycut", sdk: true, proxy: true, every: 400 * time.Millisecond, fault: proxyCut,
		heal: func(e *env) error { e.proxy.Refuse(false); return nil }})
}

func TestProxyStall(t *testing.T) {
	runScenario(t, scenario{name: "proxystall", proxy: true, every: time.Second,
		fault: func(ctx context.Context, e *env) error {
			e.proxy.Stall()
			hold(ctx, 600*time.Millisecond)
			e.proxy.Unstall()
			e.logf("stalled 600ms")
			return nil
		},
		heal: func(e *env) error { e.proxy.Unstall(); return nil }})
}

func TestProxyDelay(t *testing.T) {
	runScenario(t, scenario{name: "proxydelay", proxy: true, every: time.Second,
		fault: func(ctx context.Context, e *env) error {
			e.proxy.SetDelay(40 * time.Millisecond)
			hold(ctx, 500*time.Millisecond)
			e.proxy.SetDelay(0)
			e.logf("delayed 40ms for 500ms")
			return nil
		},
		heal: func(e *env) error { e.proxy.SetDelay(0); return nil }})
}

// TestDiskFull fills the data dir's tmpfs while producers run. The broker must
// refuse (not confirm) what it cannot persist, and a message it confirmed must
// survive; after the ballast is removed it must accept publishes again, at the
// latest after a restart.
func TestDiskFull(t *testing.T) {
	const tmpfsBytes = 64 << 20 // room for the run's own data once the ballast is gone
	runScenario(t, scenario{name: "diskfull", tmpfsBytes: tmpfsBytes, every: 1500 * time.Millisecond,
		fault: func(ctx context.Context, e *env) error {
			path, n, err := harness.FillDisk(e.fsDir, tmpfsBytes)
			if err != nil {
				return fmt.Errorf("fill: %w", err)
			}
			before := e.run.Stats().Snapshot().Confirms
			hold(ctx, 700*time.Millisecond)
			during := e.run.Stats().Snapshot().Confirms - before
			if err := os.Remove(path); err != nil {
				return err
			}
			e.logf("disk full for 700ms (ballast %d bytes); %d confirms meanwhile", n, during)
			if !e.broker.Running() {
				e.logf("broker exited on a full disk; restarting")
				return e.broker.Restart()
			}
			if !confirmsResume(e, 3*time.Second) {
				e.logf("no confirms after freeing space; restarting")
				if err := e.broker.Kill(); err != nil {
					return err
				}
				return e.broker.Restart()
			}
			return nil
		},
		heal: func(e *env) error {
			err := os.Remove(filepath.Join(e.fsDir, "chaos-ballast"))
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}})
}

// confirmsResume reports whether the workload got a new confirm within timeout.
func confirmsResume(e *env, timeout time.Duration) bool {
	start := e.run.Stats().Snapshot().Confirms
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if e.run.Stats().Snapshot().Confirms > start {
			return true
		}
		select {
		case <-e.run.ProducersDone():
			return true // nothing left to publish: nothing to wait for
		case <-time.After(50 * time.Millisecond):
		}
	}
	return false
}
