package chaos_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
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
// latest after a restart. A partition whose write or fsync failed serves
// nothing until the process restarts (its memory may be ahead of its disk),
// so a partition still refusing with "unavailable" once space is back is
// restarted too: otherwise the leases it holds could never be settled and the
// drain would wait for nothing.
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
			return restartIfFailed(e)
		},
		heal: func(e *env) error {
			err := os.Remove(filepath.Join(e.fsDir, "chaos-ballast"))
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			return restartIfFailed(e)
		}})
}

// restartIfFailed restarts the broker when it exited, when no publish is
// confirmed any more, or when its admin API reports a failed partition (a
// write error; only a restart brings it back).
func restartIfFailed(e *env) error {
	if !e.broker.Running() {
		e.logf("broker exited on a full disk; restarting")
		return e.broker.Restart()
	}
	why := ""
	if !confirmsResume(e, 3*time.Second) {
		why = "no confirms after freeing space"
	} else if failed, err := failedPartitions(e.broker.AdminAddr()); err != nil {
		why = fmt.Sprintf("admin API unreadable (%v)", err)
	} else if len(failed) > 0 {
		why = fmt.Sprintf("failed partitions %v", failed)
	} else {
		return nil
	}
	e.logf("%s; restarting", why)
	if err := e.broker.Kill(); err != nil {
		return err
	}
	return e.broker.Restart()
}

// adminTimeout bounds one admin API request.
const adminTimeout = 2 * time.Second

// failedPartitions asks the admin API (GET /api/v1/queues) which partitions
// report an error: quarantined at start, or failed by a write or fsync
// error. It returns them as "topic/group/pN: error".
func failedPartitions(adminAddr string) ([]string, error) {
	c := http.Client{Timeout: adminTimeout}
	resp, err := c.Get("http://" + adminAddr + "/api/v1/queues")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("admin API: %s", resp.Status)
	}
	var st struct {
		Queues []struct {
			Topic, Group string
			Partitions   []struct {
				Partition uint32
				Err       string
			}
		}
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&st); err != nil {
		return nil, fmt.Errorf("admin API: %w", err)
	}
	var failed []string
	for _, q := range st.Queues {
		for _, p := range q.Partitions {
			if p.Err != "" {
				failed = append(failed, fmt.Sprintf("%s/%s/p%d: %s", q.Topic, q.Group, p.Partition, p.Err))
			}
		}
	}
	return failed, nil
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
