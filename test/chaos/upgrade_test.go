package chaos_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/test/chaos/harness"
)

// envPrevious names the commit a rolling upgrade starts from instead of
// testdata/previous-release.
const envPrevious = "SINEW_CHAOS_PREVIOUS"

var (
	previousOnce sync.Once
	previousBin  string
	previousErr  error
	previousDir  string // removed by TestMain
)

// previousCommit is the commit of the previous release: SINEW_CHAOS_PREVIOUS,
// else the first line of testdata/previous-release that is not a comment.
func previousCommit() (string, error) {
	if c := os.Getenv(envPrevious); c != "" {
		return c, nil
	}
	f, err := os.Open(filepath.Join("testdata", "previous-release"))
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			return l, nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("testdata/previous-release names no commit")
}

// previousBinary builds the previous release's sinew (once per test
// binary), from its commit in this repository's history. A tree without
// that history (a shallow clone, an exported tree) skips the test with
// the reason.
func previousBinary(t *testing.T) string {
	t.Helper()
	previousOnce.Do(func() {
		commit, err := previousCommit()
		if err != nil {
			previousErr = err
			return
		}
		root, err := harness.RepoRoot()
		if err != nil {
			previousErr = err
			return
		}
		previousDir, previousErr = os.MkdirTemp("", "sinew-chaos-previous-")
		if previousErr != nil {
			return
		}
		start := time.Now()
		previousBin, previousErr = harness.BuildCommit(root, previousDir, commit)
		if previousErr == nil {
			t.Logf("built the previous release (%s) in %v", commit, time.Since(start).Round(time.Millisecond))
		}
	})
	if errors.Is(previousErr, harness.ErrNoCommit) {
		t.Skipf("the previous release cannot be built here: %v", previousErr)
	}
	if previousErr != nil {
		t.Fatal(previousErr)
	}
	return previousBin
}

// TestClusterRollingUpgrade starts the cluster on the previous release
// and upgrades it to this tree's binary one node at a time under load: a
// SIGTERM (the planned stop: leads handed over, then a drain), then a
// start of the new binary on the same data directory. Between the steps
// the cluster runs both releases; each step also creates a queue (through
// whichever node leads the controller) and publishes to it. The checker
// judges the whole run, and the confirm watch's pauses must meet the
// issue's goals.
func TestClusterRollingUpgrade(t *testing.T) {
	clusterScenariosMore(t)
	const every = 8 * time.Second
	// A step may take a dozen seconds (the new queue's voters): the short
	// phase leaves room for three, and the run fails unless all three
	// nodes were upgraded.
	runClusterScenario(t, clusterScenario{name: "cluster-rolling-upgrade", every: every,
		shortPhase: clusterNodes*every + 24*time.Second, fault: rollingUpgrade, pauseGoals: true,
		firstBinary: previousBinary, check: func(e *clusterEnv) error {
			if e.upgraded < len(e.nodes) {
				return fmt.Errorf("the fault phase ended with %d of %d nodes upgraded", e.upgraded, len(e.nodes))
			}
			return nil
		}})
}

// rollingUpgrade upgrades the next node still on the previous release
// (in order); once every node runs this tree's binary it restarts them in
// turn, as rollingRestart does.
func rollingUpgrade(ctx context.Context, e *clusterEnv) error {
	if e.upgraded == len(e.nodes) {
		return rollingRestart(ctx, e)
	}
	i := e.upgraded
	n := e.nodes[i]
	took, err := e.plannedStop(i, " (previous release)")
	if err != nil {
		return err
	}
	n.SetBinary(e.bin)
	if err := n.Restart(); err != nil {
		return fmt.Errorf("node %d on this release: %w\n%s", i+1, err, n.StderrTail())
	}
	if err := n.WaitReady(startupTimeout); err != nil {
		return fmt.Errorf("node %d after its upgrade: %w", i+1, err)
	}
	e.upgraded++
	// A queue made in the mixed cluster: its creation goes through the
	// controller's leader, whichever release it runs, and every node
	// must apply the entry.
	topic := fmt.Sprintf("%s-upgraded-%d", e.topic, e.faults)
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	made := time.Now()
	if _, err := e.probe.DeclareQueue(cctx, topic, sinew.QueueConfig{Partitions: 2}); err != nil {
		return fmt.Errorf("a new queue after node %d's upgrade: %w", i+1, err)
	}
	for p := range 2 {
		if _, err := e.probe.Publish(cctx, topic, []byte("mixed"), sinew.WithPartition(p)); err != nil {
			return fmt.Errorf("publish to the new queue %s (partition %d) after node %d's upgrade: %w", topic, p, i+1, err)
		}
	}
	if _, err := e.awaitVoters("", made, topic); err != nil {
		return fmt.Errorf("after node %d's upgrade: %w", i+1, err)
	}
	e.logf("upgraded node %d: SIGTERM on the previous release, a publish to partition 0 confirmed %v after the signal, restarted on this release; queue %s made and written in the mixed cluster, three voters on each partition %v after the declare",
		i+1, took.Round(time.Millisecond), topic, time.Since(made).Round(time.Millisecond))
	return nil
}
