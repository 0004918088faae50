package benchkit

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Every body starts with a stamp so a consumer can tell when the message was due:
//
//	 0                8                      SizeBytes
//	+----------------+----------------------+
//	| due (int64 BE) | filler (0x61 'a')    |
//	+----------------+----------------------+
//	  nanoseconds since the engine's epoch (its clock at Run start)
const stampBytes = 8

// Result is what one run measured. Field names and JSON keys are stable: scripts
// read them.
type Result struct {
	Broker      string  `json:"broker"`
	Mode        Mode    `json:"mode"`
	Topic       string  `json:"topic"`
	SizeBytes   int     `json:"size_bytes"`
	Connections int     `json:"connections"`
	Window      int     `json:"window"`
	Prefetch    int     `json:"prefetch,omitempty"`
	RatePerSec  int     `json:"rate_per_sec,omitempty"`
	Count       int     `json:"count,omitempty"`
	Seconds     float64 `json:"seconds"` // length of the measured phase
	Messages    uint64  `json:"messages"`
	MsgPerSec   float64 `json:"msg_per_sec"`
	MBPerSec    float64 `json:"mb_per_sec"` // body bytes, 10^6 per MB

	// Latency is publish to confirm (publish), due time to delivery (mixed), and
	// absent for drain.
	Latency *LatencySummary `json:"latency,omitempty"`
	// Prefill describes drain's publish phase.
	Prefill *PhaseResult `json:"prefill,omitempty"`
	// Missing counts mixed-mode messages due in the measured phase that were not
	// delivered before the settle bound ran out, Unsent among them.
	Missing uint64 `json:"missing,omitempty"`
	// Unsent counts mixed-mode messages due in the measured phase that the
	// publishers could not even send before the phase ended: the broker could
	// not confirm at the offered rate with Window publishes in flight.
	Unsent     uint64      `json:"unsent,omitempty"`
	Errors     uint64      `json:"errors"`
	FirstError string      `json:"first_error,omitempty"`
	Proc       *ProcReport `json:"broker_process,omitempty"`
}

// PhaseResult is a secondary phase of a run.
type PhaseResult struct {
	Messages  uint64  `json:"messages"`
	Seconds   float64 `json:"seconds"`
	MsgPerSec float64 `json:"msg_per_sec"`
}

// ProcReport is what the broker process used, sampled from procfs.
type ProcReport struct {
	PID int `json:"pid"`
	// RSSStartBytes is the resident set before the workload ran (after Prepare).
	RSSStartBytes uint64 `json:"rss_start_bytes"`
	// RSSBacklogBytes is the resident set with drain's prefilled backlog waiting.
	RSSBacklogBytes uint64 `json:"rss_backlog_bytes,omitempty"`
	// RSSEndBytes is the resident set when the measured phase ended.
	RSSEndBytes uint64 `json:"rss_end_bytes"`
	// RSSPeakBytes is the process's high-water mark (VmHWM) since it started.
	RSSPeakBytes uint64 `json:"rss_peak_bytes"`
	// CPUPercent is CPU time over wall time in the measured phase; 100 = one core.
	CPUPercent float64 `json:"cpu_percent"`
}

// Run executes one workload against b and returns what it measured. It opens and
// closes its own connections, never runs past cfg.Duration plus warmup and the
// bounded settle phase (drain: its prefill and consume phases end once a
// cfg.Duration passes without progress), and stops early when ctx is done. A run that
// could not finish its work returns the partial Result together with an error.
func Run(ctx context.Context, b Broker, cfg Config) (Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return Result{}, err
	}
	r := &runner{cfg: cfg, b: b, clock: cfg.Clock}
	r.epoch = r.clock.Now()
	r.res = Result{
		Broker: b.Name(), Mode: cfg.Mode, Topic: cfg.Topic, SizeBytes: cfg.SizeBytes,
		Connections: cfg.Connections, Window: cfg.Window,
	}
	switch cfg.Mode {
	case ModeDrain:
		r.res.Prefetch, r.res.Count = cfg.Prefetch, cfg.Count
	case ModeMixed:
		r.res.Prefetch, r.res.RatePerSec = cfg.Prefetch, cfg.RatePerSec
	}
	if err := b.Prepare(ctx, cfg.Topic); err != nil {
		return r.res, fmt.Errorf("benchkit: prepare %s: %w", cfg.Topic, err)
	}
	if err := r.connect(ctx); err != nil {
		r.closeConns()
		return r.res, err
	}
	defer r.closeConns()
	if err := r.procStart(); err != nil {
		return r.res, err
	}
	switch cfg.Mode {
	case ModePublish:
		err = r.publish(ctx)
	case ModeDrain:
		err = r.drain(ctx)
	case ModeMixed:
		err = r.mixed(ctx)
	}
	r.res.Errors = r.errs.Load()
	if e := r.firstErr.Load(); e != nil {
		r.res.FirstError = (*e).Error()
	}
	if err == nil && r.res.Errors > 0 && r.res.Messages == 0 {
		err = fmt.Errorf("benchkit: every publish failed: %s", r.res.FirstError)
	}
	return r.res, err
}

type runner struct {
	cfg   Config
	b     Broker
	clock Clock
	epoch time.Time
	conns []Conn
	res   Result

	hist     Histogram
	done     atomic.Uint64 // messages counted in the current measured phase
	errs     atomic.Uint64
	firstErr atomic.Pointer[error]

	procBefore ProcSample
	procOK     bool
}

func (r *runner) connect(ctx context.Context) error {
	for i := 0; i < r.cfg.Connections; i++ {
		c, err := r.b.Connect(ctx)
		if err != nil {
			return fmt.Errorf("benchkit: connect %d of %d: %w", i+1, r.cfg.Connections, err)
		}
		r.conns = append(r.conns, c)
	}
	return nil
}

func (r *runner) closeConns() {
	for _, c := range r.conns {
		_ = c.Close() // best effort: the run's figures are already taken
	}
	r.conns = nil
}

// since is the engine's monotonic timestamp for a body stamp.
func (r *runner) since() time.Duration { return r.clock.Now().Sub(r.epoch) }

func (r *runner) body(due time.Duration) []byte {
	b := make([]byte, r.cfg.SizeBytes)
	for i := stampBytes; i < len(b); i++ {
		b[i] = 'a'
	}
	binary.BigEndian.PutUint64(b, uint64(due))
	return b
}

func (r *runner) fail(err error) {
	if r.errs.Add(1) == 1 {
		r.firstErr.Store(&err)
	}
}

func (r *runner) tooManyErrors() bool { return r.errs.Load() >= errorsMax }

// procStart samples the broker before the measured work. A pid that cannot be
// read fails the run before it starts: figures without the footprint that was
// asked for would be easy to misread.
func (r *runner) procStart() error {
	if r.cfg.PID == 0 {
		return nil
	}
	s, err := ReadProc(r.cfg.ProcFS, r.cfg.PID, r.clock.Now())
	if err != nil {
		return err
	}
	r.procBefore, r.procOK = s, true
	r.res.Proc = &ProcReport{PID: r.cfg.PID, RSSStartBytes: s.RSSBytes}
	return nil
}

// procMark resets the CPU baseline at the start of the measured phase.
func (r *runner) procMark() {
	if !r.procOK {
		return
	}
	if s, err := ReadProc(r.cfg.ProcFS, r.cfg.PID, r.clock.Now()); err == nil {
		r.procBefore = s
	}
}

// procEnd samples the broker at the end of the measured phase.
func (r *runner) procEnd() {
	if !r.procOK {
		return
	}
	s, err := ReadProc(r.cfg.ProcFS, r.cfg.PID, r.clock.Now())
	if err != nil {
		r.fail(err)
		return
	}
	r.res.Proc.RSSEndBytes = s.RSSBytes
	r.res.Proc.RSSPeakBytes = s.HWMBytes
	r.res.Proc.CPUPercent = CPUPercent(r.procBefore, s)
}

// finish fills the throughput fields for a measured phase of length elapsed.
func (r *runner) finish(n uint64, elapsed time.Duration) {
	r.res.Messages = n
	r.res.Seconds = elapsed.Seconds()
	if elapsed > 0 {
		r.res.MsgPerSec = float64(n) / elapsed.Seconds()
		r.res.MBPerSec = r.res.MsgPerSec * float64(r.cfg.SizeBytes) / 1e6
	}
}

// startProgress prints one line per second until the returned stop function is
// called; stop waits for the printer to exit. label names the phase.
func (r *runner) startProgress(label func() string, count func() uint64, withLatency bool) (stop func()) {
	if r.cfg.Progress == nil {
		return func() {}
	}
	quit, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		r.progress(quit, label, count, withLatency)
	}()
	return func() { close(quit); <-exited }
}

func (r *runner) progress(stop <-chan struct{}, label func() string, count func() uint64, withLatency bool) {
	start := r.clock.Now()
	last, lastN := start, count()
	for {
		select {
		case <-stop:
			return
		case <-r.clock.After(progressEvery):
		}
		now, n := r.clock.Now(), count()
		if n == 0 {
			// Nothing measured yet (a consumer still subscribing, a
			// broker still starting): a "0 msg/s" line would read as a
			// rate.
			last = now
			continue
		}
		rate := 0.0
		if dt := now.Sub(last); dt > 0 {
			rate = float64(n-lastN) / dt.Seconds()
		}
		line := fmt.Sprintf("%s %s %5.0fs %10d msgs %9.0f msg/s", r.b.Name(), label(), now.Sub(start).Seconds(), n, rate)
		if withLatency {
			line += fmt.Sprintf("  p50 %.2f ms  p99 %.2f ms", MillisOf(r.hist.Quantile(0.5)), MillisOf(r.hist.Quantile(0.99)))
		}
		if e := r.errs.Load(); e > 0 {
			line += fmt.Sprintf("  errors %d", e)
		}
		fmt.Fprintln(r.cfg.Progress, line)
		last, lastN = now, n
	}
}

// publishers runs window goroutines, spread over the connections. Each owns one
// body buffer (Publish returns only after the confirm, so the buffer is free to
// reuse) and calls next to stamp it until next reports false, then after with the
// publish's start time and result. It returns when all are done.
func (r *runner) publishers(ctx context.Context, window int, next func(body []byte) bool, after func(start time.Time, err error)) {
	var wg sync.WaitGroup
	for g := 0; g < window; g++ {
		c := r.conns[g%len(r.conns)]
		body := r.body(0)
		wg.Go(func() {
			for ctx.Err() == nil && !r.tooManyErrors() {
				if !next(body) {
					return
				}
				t0 := r.clock.Now()
				err := c.Publish(ctx, r.cfg.Topic, body)
				if err != nil && ctx.Err() == nil {
					r.fail(err)
				}
				after(t0, err)
			}
		})
	}
	wg.Wait()
}

// publish is ModePublish: a closed loop of Window publishers.
func (r *runner) publish(ctx context.Context) error {
	var measuring atomic.Bool
	var measureStart time.Time
	start := r.clock.Now()
	end := start.Add(r.cfg.Warmup + r.cfg.Duration)
	stop := r.startProgress(func() string {
		if measuring.Load() {
			return "publish"
		}
		return "warmup "
	}, r.done.Load, true)
	defer stop()

	var once sync.Once
	beginMeasure := func() {
		once.Do(func() {
			r.procMark()
			measureStart = r.clock.Now()
			measuring.Store(true)
		})
	}
	if r.cfg.Warmup == 0 {
		beginMeasure()
	}
	var ended atomic.Bool
	r.publishers(ctx, r.cfg.Window, func([]byte) bool {
		now := r.clock.Now()
		if !now.Before(end) {
			ended.Store(true)
			return false
		}
		if !measuring.Load() && !now.Before(start.Add(r.cfg.Warmup)) {
			beginMeasure()
		}
		return true
	}, func(t0 time.Time, err error) {
		if err != nil || !measuring.Load() {
			return
		}
		now := r.clock.Now()
		if now.After(end) {
			return
		}
		r.hist.Record(now.Sub(t0))
		r.done.Add(1)
	})
	if !measuring.Load() {
		return fmt.Errorf("%w: stopped during warmup: %v", ErrIncomplete, ctx.Err())
	}
	stopAt := r.clock.Now()
	if stopAt.After(end) {
		stopAt = end
	}
	r.procEnd()
	r.finish(r.done.Load(), stopAt.Sub(measureStart))
	r.res.Latency = ptr(r.hist.Summary())
	if !ended.Load() && ctx.Err() != nil {
		return fmt.Errorf("%w: %w", ErrIncomplete, ctx.Err())
	}
	return nil
}

// watchProgress calls giveUp once a whole Duration passes in which count did
// not move, and stops when ctx ends. The returned channel closes when it has
// stopped.
func (r *runner) watchProgress(ctx context.Context, count func() uint64, giveUp func()) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		seen := count()
		for {
			select {
			case <-ctx.Done():
				return
			case <-r.clock.After(r.cfg.Duration):
			}
			n := count()
			if n == seen {
				giveUp()
				return
			}
			seen = n
		}
	}()
	return done
}

// drain is ModeDrain: prefill, sample the backlog, consume it all.
func (r *runner) drain(ctx context.Context) error {
	// Prefill. Its length grows with Count and the machine's speed, so it is
	// bounded by progress, not by a total: it gives up once a whole Duration
	// passes without a confirm, and a large Count on a busy machine still runs.
	var issued atomic.Int64
	var confirmed atomic.Uint64
	pctx, cancel := context.WithCancel(ctx)
	stalled := r.watchProgress(pctx, confirmed.Load, cancel)
	stop := r.startProgress(func() string { return "prefill" }, confirmed.Load, false)
	t0 := r.clock.Now()
	r.publishers(pctx, r.cfg.Window, func([]byte) bool {
		return issued.Add(1) <= int64(r.cfg.Count)
	}, func(_ time.Time, err error) {
		if err == nil {
			confirmed.Add(1)
		}
	})
	cancel()
	stop()
	<-stalled
	pd := r.clock.Now().Sub(t0)
	r.res.Prefill = &PhaseResult{Messages: confirmed.Load(), Seconds: pd.Seconds()}
	if pd > 0 {
		r.res.Prefill.MsgPerSec = float64(confirmed.Load()) / pd.Seconds()
	}
	want := confirmed.Load()
	if want < uint64(r.cfg.Count) {
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %w", ErrIncomplete, ctx.Err())
		}
		return fmt.Errorf("%w: prefill confirmed %d of %d messages, then none for %v", ErrIncomplete, want, r.cfg.Count, r.cfg.Duration)
	}
	if r.procOK {
		if s, err := ReadProc(r.cfg.ProcFS, r.cfg.PID, r.clock.Now()); err == nil {
			r.res.Proc.RSSBacklogBytes = s.RSSBytes
		}
	}

	// Consume. The last delivery closes all. Like the prefill, the phase is
	// bounded by progress: a whole Duration without a delivery ends it, which
	// catches a broker that loses or withholds messages however long the
	// backlog is.
	all := make(chan struct{})
	var allOnce sync.Once
	var lastAt atomic.Int64 // engine-relative ns of the latest delivery
	r.procMark()
	start := r.clock.Now()
	stop = r.startProgress(func() string { return "drain  " }, r.done.Load, false)
	defer stop()
	var subs []Subscription
	defer func() {
		for _, s := range subs {
			_ = s.Stop() // best effort: the measurement is over
		}
	}()
	for _, c := range r.conns {
		s, err := c.Consume(ctx, r.cfg.Topic, r.cfg.Prefetch, func([]byte) {
			n := r.done.Add(1)
			lastAt.Store(int64(r.since()))
			if n >= want {
				allOnce.Do(func() { close(all) })
			}
		})
		if err != nil {
			return fmt.Errorf("benchkit: consume: %w", err)
		}
		subs = append(subs, s)
	}
	var err error
	seen := r.done.Load()
wait:
	for {
		select {
		case <-all:
			break wait
		case <-r.clock.After(r.cfg.Duration):
			if n := r.done.Load(); n != seen {
				seen = n
				continue
			}
			err = fmt.Errorf("%w: drained %d of %d messages, then none for %v", ErrIncomplete, r.done.Load(), want, r.cfg.Duration)
			break wait
		case <-ctx.Done():
			err = fmt.Errorf("%w: %w", ErrIncomplete, ctx.Err())
			break wait
		}
	}
	r.procEnd()
	n := min(r.done.Load(), want)
	elapsed := r.epoch.Add(time.Duration(lastAt.Load())).Sub(start)
	if n == 0 {
		elapsed = r.clock.Now().Sub(start)
	}
	r.finish(n, elapsed)
	return err
}

// mixed is ModeMixed: paced publishers and live consumers, latency due-to-delivery.
func (r *runner) mixed(ctx context.Context) error {
	warm := r.cfg.Warmup
	total := warm + r.cfg.Duration
	var delivered atomic.Uint64 // every delivery, warmup included
	var measuredSent atomic.Uint64
	var measuredGot atomic.Uint64

	// Stamps are engine-relative; base is where the paced schedule starts.
	base := r.since()
	var subs []Subscription
	defer func() {
		for _, s := range subs {
			_ = s.Stop() // best effort: the measurement is over
		}
	}()
	for _, c := range r.conns {
		s, err := c.Consume(ctx, r.cfg.Topic, r.cfg.Prefetch, func(body []byte) {
			delivered.Add(1)
			if len(body) < stampBytes {
				return
			}
			due := time.Duration(binary.BigEndian.Uint64(body))
			if rel := due - base; rel < warm || rel >= total {
				return
			}
			r.hist.Record(r.since() - due)
			measuredGot.Add(1)
		})
		if err != nil {
			return fmt.Errorf("benchkit: consume: %w", err)
		}
		subs = append(subs, s)
	}

	// The pacer hands out due times; a publisher stamps the due time into the body.
	// Waking once per pacerTick and releasing everything due keeps timer load low
	// at high rates. It stops at the end of the phase even when publishers fell
	// behind, so a slow broker cannot stretch the run; what was due but never sent
	// is reported as Unsent. The grace lets the last due messages go out when the
	// pacer or a publisher was scheduled late, without letting a slow broker
	// stretch the phase by more than that.
	const pacerTick = time.Millisecond
	const pacerGrace = 250 * time.Millisecond
	tickets := make(chan time.Duration, r.cfg.Window)
	interval := time.Second / time.Duration(r.cfg.RatePerSec)
	phaseEnd := r.clock.After(total + pacerGrace - (r.since() - base))
	go func() {
		defer close(tickets)
		var i int64
		for {
			now := r.since() - base
			for ; ; i++ {
				due := time.Duration(i) * interval
				if due >= total || due > now {
					break
				}
				select {
				case tickets <- base + due:
				case <-phaseEnd:
					return
				case <-ctx.Done():
					return
				}
			}
			if time.Duration(i)*interval >= total {
				return
			}
			select {
			case <-r.clock.After(pacerTick):
			case <-phaseEnd:
				return
			case <-ctx.Done():
				return
			}
		}
	}()
	measureAt := r.epoch.Add(base + warm)
	stop := r.startProgress(func() string {
		if r.clock.Now().Before(measureAt) {
			return "warmup "
		}
		return "mixed  "
	}, delivered.Load, true)
	defer stop()

	var marked sync.Once
	r.publishers(ctx, r.cfg.Window, func(body []byte) bool {
		due, ok := <-tickets
		if !ok {
			return false
		}
		if due-base >= warm {
			marked.Do(r.procMark)
			measuredSent.Add(1)
		}
		binary.BigEndian.PutUint64(body, uint64(due))
		return true
	}, func(time.Time, error) {})
	for range tickets { // the pacer stops on ctx; drain what it queued
	}

	// Let in-flight deliveries arrive, bounded.
	settleBy := r.clock.Now().Add(settleTimeMax)
	for measuredGot.Load() < measuredSent.Load() && r.clock.Now().Before(settleBy) && ctx.Err() == nil {
		<-r.clock.After(10 * time.Millisecond)
	}
	r.procEnd()
	// Messages due in [warm, total): indexes ceil(warm/interval) .. ceil(total/interval)-1.
	ceilDiv := func(a, b time.Duration) uint64 { return uint64((a + b - 1) / b) }
	due := ceilDiv(total, interval) - ceilDiv(warm, interval)
	sent, got := measuredSent.Load(), measuredGot.Load()
	r.finish(got, r.cfg.Duration)
	if due > sent {
		r.res.Unsent = due - sent
	}
	if due > got {
		r.res.Missing = due - got
	}
	r.res.Latency = ptr(r.hist.Summary())
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", ErrIncomplete, ctx.Err())
	}
	if r.res.Missing > 0 {
		return fmt.Errorf("%w: %d of %d messages due in the measured phase not delivered (%d never sent: the broker confirmed too slowly for the rate)",
			ErrIncomplete, r.res.Missing, due, r.res.Unsent)
	}
	return nil
}

func ptr[T any](v T) *T { return &v }
