package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/internal/benchkit"
	"github.com/sinewmq/sinew/internal/benchkit/sinewadapter"
)

// benchAddrDefault is where `sinew serve` listens unless told otherwise.
const benchAddrDefault = "127.0.0.1:7654"

func init() {
	commands["bench"] = command{
		summary: "measure a broker: publish, drain or mixed workloads",
		run:     runBench,
	}
}

// newBenchBroker builds the broker under test; tests replace it with an
// in-memory one.
var newBenchBroker = func(addr string, opts ...sinew.Option) benchkit.Broker {
	return sinewadapter.New("sinew", addr, opts...)
}

const benchUsage = `usage: sinew bench <publish|drain|mixed> [flags]

  publish  --window N publishes in flight, each waiting for its confirm
  drain    prefill --count messages, then consume and complete them with --prefetch
  mixed    publish at --rate msg/s with live consumers; latency is due time to delivery

Progress goes to stderr once a second; the result to stdout (text, or --json).
`

func runBench(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			fmt.Fprint(stderr, benchUsage)
			return flag.ErrHelp
		}
		fmt.Fprint(stderr, benchUsage)
		return fmt.Errorf("%w: missing workload (publish, drain or mixed)", errUsage)
	}
	mode := benchkit.Mode(args[0])
	switch mode {
	case benchkit.ModePublish, benchkit.ModeDrain, benchkit.ModeMixed:
	default:
		return fmt.Errorf("%w: unknown workload %q (want publish, drain or mixed)", errUsage, args[0])
	}
	fs := newFlagSet("bench "+args[0], stderr)
	addr := fs.String("addr", benchAddrDefault, "broker address `host:port`, or a cluster's nodes comma-separated (the first dialled, the others seeds)")
	topic := fs.String("topic", "", "queue to use (default: bench-<workload>-<unix ms>, a fresh queue per run, deleted at the end unless --keep)")
	keep := fs.Bool("keep", false, "keep the fresh queue the run created, and its messages (a --topic queue is always kept)")
	size := fs.Int("size", 1024, "message body size in `bytes`")
	duration := fs.Duration("duration", 10*time.Second, "measured phase; for drain, how long the prefill or the consume may go without progress before the run gives up (each runs as long as it progresses)")
	warmup := fs.Duration("warmup", 2*time.Second, "unmeasured lead-in before the measured phase (publish, mixed)")
	conns := fs.Int("connections", 1, "client connections")
	window := fs.Int("window", 0, "publishes in flight across all connections (default 1 for publish, 256 otherwise)")
	prefetch := fs.Int("prefetch", 256, "unsettled deliveries per consumer (drain, mixed)")
	rate := fs.Int("rate", 20000, "publish rate in `msg/s` (mixed)")
	count := fs.Int("count", 100000, "messages to prefill (drain)")
	pid := fs.Int("pid", 0, "broker process id: report its RSS and CPU from /proc (0 = do not)")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	cohortName := fs.String("cohort", "", "drain, mixed: each connection's consumer joins this cohort (consumer group) instead of competing for every partition")
	tf := addTLSFlags(fs)
	cf := addCredFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(stderr, benchUsage+"\nflags:\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args[1:]); err != nil {
		return err
	}
	if *duration <= 0 {
		// benchkit takes a zero duration as "the default"; on the
		// command line it is a mistake.
		return fmt.Errorf("%w: --duration must be positive", errUsage)
	}
	fresh := *topic == ""
	if fresh {
		*topic = fmt.Sprintf("bench-%s-%d", mode, time.Now().UnixMilli())
	}
	cfg := benchkit.Config{
		Mode: mode, Topic: *topic, SizeBytes: *size, Duration: *duration, Warmup: *warmup,
		Connections: *conns, Window: *window, Prefetch: *prefetch, RatePerSec: *rate,
		Count: *count, PID: *pid,
	}
	if mode == benchkit.ModeDrain {
		cfg.Warmup = 0 // the prefill is drain's lead-in
	}
	if !*quiet {
		cfg.Progress = stderr
	}
	addrs, err := clientAddrs(*addr)
	if err != nil {
		return err
	}
	cred, err := cf.credentials()
	if err != nil {
		return err
	}
	tcfg, err := tf.config()
	if err != nil {
		return err
	}
	opts := []sinew.Option{cred}
	if tcfg != nil {
		opts = append(opts, sinew.WithTLS(tcfg))
	}
	if len(addrs) > 1 {
		opts = append(opts, sinew.WithSeeds(addrs[1:]...))
	}
	bb := newBenchBroker(addrs[0], opts...)
	if *cohortName != "" {
		cs, ok := bb.(interface{ SetCohort(string) })
		if !ok || mode == benchkit.ModePublish {
			return fmt.Errorf("%w: --cohort is for drain and mixed", errUsage)
		}
		cs.SetCohort(*cohortName)
	}
	res, err := benchkit.Run(ctx, bb, cfg)
	if errors.Is(err, benchkit.ErrConfig) {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if fresh && !*keep {
		removeBenchQueue(bb, *topic, stderr)
	}
	// A partial result (ErrIncomplete) is still worth printing, once
	// something was measured: a drain whose prefill did not finish has no
	// rate, and a "0 msg/s" line would read as one.
	measured := res.Messages > 0 || res.Seconds > 0
	if err == nil || (errors.Is(err, benchkit.ErrIncomplete) && measured) {
		if perr := printBench(stdout, res, *asJSON); perr != nil {
			return errors.Join(err, perr)
		}
	}
	if errors.Is(err, benchkit.ErrIncomplete) && mode == benchkit.ModeDrain && ctx.Err() == nil {
		err = fmt.Errorf("%w (--duration %v bounds how long a phase may go without progress; raise it to wait longer)", err, *duration)
	}
	return err
}

// benchQueueRemover is a bench broker that can delete the queue a run
// created (sinewadapter.Broker).
type benchQueueRemover interface {
	Remove(ctx context.Context, topic string) error
}

// benchRemoveTimeout bounds deleting the run's queue.
const benchRemoveTimeout = 10 * time.Second

// removeBenchQueue deletes the fresh queue a run created, so that runs
// against a broker leave nothing behind. It has its own deadline (the
// run's context may have ended, say on Ctrl-C); a failure is reported on
// stderr and does not fail the run, whose result stands.
func removeBenchQueue(b benchkit.Broker, topic string, stderr io.Writer) {
	r, ok := b.(benchQueueRemover)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), benchRemoveTimeout)
	defer cancel()
	if err := r.Remove(ctx, topic); err != nil {
		fmt.Fprintf(stderr, "sinew bench: the queue %s is left behind: %v\n", topic, err)
	}
}

func printBench(w io.Writer, res benchkit.Result, asJSON bool) error {
	if !asJSON {
		return res.WriteText(w)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(res)
}
