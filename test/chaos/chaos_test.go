package chaos_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew/test/chaos/checker"
	"github.com/sinewmq/sinew/test/chaos/faultproxy"
	"github.com/sinewmq/sinew/test/chaos/harness"
	"github.com/sinewmq/sinew/test/chaos/workload"
)

// Environment knobs. All are optional; the defaults make the short run.
const (
	// envBinary names a prebuilt sinew binary to use instead of building one.
	envBinary = "SINEW_CHAOS_BINARY"
	// envRace builds the broker with the race detector when "1".
	envRace = "SINEW_CHAOS_RACE"
	// envSeconds is the fault phase of each scenario in seconds (long run).
	envSeconds = "SINEW_CHAOS_SECONDS"
	// envSummary names a file that receives one tab-separated line per scenario.
	envSummary = "SINEW_CHAOS_SUMMARY"
	// envKeep names a directory under which each scenario's data dir and
	// broker logs are kept after the run, for inspecting a failure.
	envKeep = "SINEW_CHAOS_KEEP"
)

// Bounds of one scenario.
const (
	startupTimeout    = 30 * time.Second
	drainTimeoutShort = 30 * time.Second
	// drainTimeoutLong bounds the drain of a long run. With leaseMs
	// leases a healthy broker drains in seconds; a drain that needs longer
	// is a finding in itself (reported in the summary), not a reason to
	// wait minutes.
	drainTimeoutLong = 60 * time.Second
	termDrainTimeout = 20 * time.Second
	leaseMs          = 2000
)

// serveArgs are the broker settings of every scenario: heartbeats fast
// enough that a stalled link is noticed within the run, a reconnect grace so
// sessions can be resumed, small segments so the log rolls often (and fits
// the disk-full scenario's tmpfs), and debug logs for failure reports.
var serveArgs = []string{
	"--connection-heartbeat-ms", "1000",
	"--runtime-seed-connection-reconnect-grace-ms", "5000",
	"--runtime-seed-connection-drain-timeout-ms", "5000",
	"--storage-segment-bytes", "1048576",
	"--log-level", "debug",
}

var (
	buildOnce sync.Once
	binPath   string
	binErr    error
	buildDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	for _, d := range []string{buildDir, previousDir} {
		if d != "" {
			os.RemoveAll(d)
		}
	}
	os.Exit(code)
}

// binary builds cmd/sinew once per test binary, or skips the test when the
// tree has no serve command yet.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if p := os.Getenv(envBinary); p != "" {
			binPath = p
		} else {
			root, err := harness.RepoRoot()
			if err != nil {
				binErr = err
				return
			}
			buildDir, binErr = os.MkdirTemp("", "sinew-chaos-bin-")
			if binErr != nil {
				return
			}
			binPath, binErr = harness.Build(root, buildDir, os.Getenv(envRace) == "1")
			if binErr != nil {
				return
			}
		}
		binErr = harness.CheckServe(binPath)
	})
	if errors.Is(binErr, harness.ErrNoServe) {
		t.Skipf("chaos scenarios need `sinew serve`: %v", binErr)
	}
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// env is what a nemesis acts on.
type env struct {
	t       *testing.T
	broker  *harness.Broker
	proxy   *faultproxy.Proxy // nil unless the scenario asked for one
	dataDir string
	fsDir   string // the file system holding dataDir (a tmpfs in the disk-full scenario)
	run     *workload.Run
	faults  int // faults injected, for the report
}

func (e *env) logf(format string, args ...any) {
	e.t.Logf("t=%dms "+format, append([]any{e.run.SinceMs()}, args...)...)
}

// scenario is one nemesis with its workload shape.
type scenario struct {
	name       string
	proxy      bool
	sdk        bool // drive the broker through the Go SDK instead of raw frames
	tmpfsBytes int64
	// every is the spacing of faults within the fault phase.
	every time.Duration
	// fault injects one fault and undoes it (restart, unstall ...). An error
	// fails the test: the broker did not behave (for example, a drain that
	// did not exit 0).
	fault func(ctx context.Context, e *env) error
	// heal brings everything back after the fault phase (optional).
	heal func(e *env) error
}

// faultPhase is how long faults are injected while producers run.
func faultPhase() time.Duration {
	if s, err := strconv.Atoi(os.Getenv(envSeconds)); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if testing.Short() {
		return time.Second
	}
	return 2 * time.Second
}

func long() bool { return os.Getenv(envSeconds) != "" }

// result is one scenario's summary row.
type result struct {
	name   string
	faults int
	rep    checker.Report
	stats  workload.Counters
	// unsettled counts confirmed messages still unsettled when the drain
	// ended (0 unless it timed out).
	unsettled int
	// status is "ok", "FAIL" or "skipped".
	status string
}

// recordAtEnd makes the scenario leave its summary row *res when the test
// ends, also when it fails half way.
func recordAtEnd(t *testing.T, res *result) {
	t.Cleanup(func() {
		switch {
		case t.Failed():
			res.status = "FAIL"
		case t.Skipped():
			res.status = "skipped"
		}
		record(t, *res)
	})
}

// scenarioDir is where a scenario's data and logs go: a temporary
// directory, or one under SINEW_CHAOS_KEEP that is kept.
func scenarioDir(t *testing.T, name string) string {
	keep := os.Getenv(envKeep)
	if keep == "" {
		return t.TempDir()
	}
	base, err := os.MkdirTemp(keep, name+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("data and logs kept in %s", base)
	return base
}

func runScenario(t *testing.T, sc scenario) {
	res := result{name: sc.name, status: "unfinished"}
	recordAtEnd(t, &res)
	bin := binary(t)
	base := scenarioDir(t, sc.name)
	dataDir := filepath.Join(base, "data")
	fsDir := base
	if sc.tmpfsBytes > 0 {
		// The data dir sits inside the tmpfs; the ballast goes beside it.
		fsDir = filepath.Join(base, "fs")
		dataDir = filepath.Join(fsDir, "data")
		unmount, err := harness.MountTmpfs(fsDir, sc.tmpfsBytes)
		if errors.Is(err, harness.ErrMountNotPermitted) {
			t.Skipf("disk-full scenario needs to mount a tmpfs (run as root with CAP_SYS_ADMIN): %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unmount() })
	}
	b, err := harness.New(harness.Config{Binary: bin, DataDir: dataDir, LogDir: base, ReadyTimeout: startupTimeout,
		ExtraArgs: serveArgs})
	if err != nil {
		t.Fatal(err)
	}
	// Registered after the unmount, so it runs first: the broker dies before
	// its data dir goes away.
	t.Cleanup(func() { _ = b.Close() })
	if err := b.Start(); err != nil {
		t.Fatalf("start broker: %v\nstderr:\n%s", err, b.StderrTail())
	}
	e := &env{t: t, broker: b, dataDir: dataDir, fsDir: fsDir}
	addr := b.Addr()
	if sc.proxy {
		p, err := faultproxy.Start("127.0.0.1:0", b.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		e.proxy, addr = p, p.Addr()
	}

	phase := faultPhase()
	// Producers publish through the whole fault phase (the phase ends them);
	// the cap only bounds a run on an unexpectedly fast machine.
	perProducer := uint64(100_000)
	if long() {
		perProducer = 1 << 40
	}
	ck := checker.New()
	ctx, cancel := context.WithTimeout(context.Background(), startupTimeout)
	defer cancel()
	run, err := workload.Start(ctx, workload.Config{
		Addr: addr, Topic: "chaos-" + sc.name, Partitions: 2, LeaseMs: leaseMs,
		Producers: 2, Consumers: 2, MessagesPerProducer: perProducer, PublishWindow: 32, Prefetch: 32,
		Resume: true, SDK: sc.sdk, Checker: ck, Logf: t.Logf,
	})
	if err != nil {
		t.Fatalf("workload: %v\nstderr:\n%s", err, b.StderrTail())
	}
	e.run = run
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = run.Stop()
		}
	})

	// Fault phase: one fault every sc.every until the phase ends.
	faultErr := nemesis(e, sc, phase)
	if sc.heal != nil {
		if err := sc.heal(e); err != nil && faultErr == nil {
			faultErr = fmt.Errorf("heal: %w", err)
		}
	}
	if !b.Running() {
		if err := b.Restart(); err != nil && faultErr == nil {
			faultErr = fmt.Errorf("final restart: %w", err)
		}
	}
	res, drainErr, stopErr := finishRun(run, ck, sc.name, phase, e.faults)
	stopped = true
	rep := res.rep
	t.Logf("%s: faults=%d %s", sc.name, e.faults, rep)
	t.Logf("%s: workload %s", sc.name, run.Stats())
	if drainErr != nil {
		t.Logf("%s: %v; queues: %s", sc.name, drainErr, queuesJSON(b))
	}
	if stopErr != nil {
		t.Fatalf("%s: %v", sc.name, stopErr)
	}
	if err := rep.Err(); err != nil {
		t.Fatalf("%s: %v\nbroker stderr (tail):\n%s", sc.name, err, b.StderrTail())
	}
	if faultErr != nil {
		t.Fatalf("%s: %v\nbroker stderr (tail):\n%s", sc.name, faultErr, b.StderrTail())
	}
	if rep.DedupMisses > 0 {
		// Every workload publish carries a producer id and sequence and is
		// resent with them, and the broker deduplicates them: a message
		// stored at two positions is a broken promise, not at-least-once.
		t.Fatalf("%s: %d messages stored twice (dedup misses)\nbroker stderr (tail):\n%s", sc.name, rep.DedupMisses, b.StderrTail())
	}
	if rep.Confirmed == 0 {
		t.Fatalf("%s: nothing was confirmed; the scenario tested nothing\nbroker stderr (tail):\n%s", sc.name, b.StderrTail())
	}
}

// finishRun gives the producers a moment to publish against the healed
// broker, stops them, drains (bounded), stops the workload and returns the
// scenario's result.
func finishRun(run *workload.Run, ck *checker.Checker, name string, phase time.Duration, faults int) (res result, drainErr, stopErr error) {
	select {
	case <-run.ProducersDone():
	case <-time.After(min(phase/4, 5*time.Second)):
	}
	stopErr = run.StopProducers()
	drain := drainTimeoutShort
	if long() {
		drain = drainTimeoutLong
	}
	drainErr = run.Drain(drain)
	unsettled := ck.Outstanding()
	stopErr = errors.Join(stopErr, run.Stop())
	res = result{name: name, faults: faults, rep: ck.Report(), stats: run.Stats().Snapshot(), unsettled: unsettled, status: "ok"}
	return res, drainErr, stopErr
}

// nemesis injects faults every sc.every for phase, and returns the first
// error a fault reported.
func nemesis(e *env, sc scenario, phase time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), phase)
	defer cancel()
	// The first fault comes by mid-phase at the latest, so even the shortest
	// phase injects at least one.
	next := time.NewTimer(min(sc.every, phase/2))
	defer next.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-next.C:
			next.Reset(sc.every)
		}
		e.faults++
		if err := sc.fault(ctx, e); err != nil {
			return fmt.Errorf("fault #%d: %w", e.faults, err)
		}
	}
}

// hold waits d or until ctx ends; the fault stays in place meanwhile.
func hold(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// adminClient is an HTTP client of b's admin API, dialing the way the
// harness reaches b (from inside its network namespace, when it has one).
func adminClient(b *harness.Broker) *http.Client {
	return &http.Client{Timeout: adminTimeout,
		Transport: &http.Transport{DialContext: b.DialContext, DisableKeepAlives: true}}
}

var summaryMu sync.Mutex

// record appends a scenario's row to the summary file when one is asked for.
func record(t *testing.T, r result) {
	path := os.Getenv(envSummary)
	if path == "" {
		return
	}
	summaryMu.Lock()
	defer summaryMu.Unlock()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Errorf("summary: %v", err)
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", r.name, r.status, r.faults, r.rep.Confirmed, r.rep.Deliveries,
		len(r.rep.Lost), len(r.rep.SettledRedelivered), r.rep.Duplicates, r.rep.DedupMisses, r.rep.LongestGapMs,
		len(r.rep.Phantom)+len(r.rep.Corrupt), r.rep.InDoubt, r.unsettled)
}

// queuesJSON returns the broker's queue statistics from its admin API, for a
// report, or why they could not be read.
func queuesJSON(b *harness.Broker) string {
	resp, err := adminClient(b).Get("http://" + b.AdminAddr() + "/api/v1/queues")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return err.Error()
	}
	return string(body)
}
