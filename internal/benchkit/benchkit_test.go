package benchkit

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"
)

// memBroker is an in-memory broker for driving the engine inside a synctest
// bubble: a publish is confirmed after confirmDelay of (fake) time, and consumers
// receive bodies in publish order.
type memBroker struct {
	confirmDelay time.Duration
	deliverDelay time.Duration // before each delivery: a slow consumer side
	failAll      error

	mu     sync.Mutex
	queues map[string]chan []byte
}

func newMemBroker(delay time.Duration) *memBroker {
	return &memBroker{confirmDelay: delay, queues: map[string]chan []byte{}}
}

func (m *memBroker) Name() string { return "mem" }

func (m *memBroker) Prepare(_ context.Context, topic string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.queues[topic]; !ok {
		m.queues[topic] = make(chan []byte, 1<<16)
	}
	return nil
}

func (m *memBroker) queue(topic string) chan []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.queues[topic]
}

func (m *memBroker) Connect(context.Context) (Conn, error) { return &memConn{m: m}, nil }

type memConn struct{ m *memBroker }

func (c *memConn) Publish(ctx context.Context, topic string, body []byte) error {
	if c.m.failAll != nil {
		return c.m.failAll
	}
	time.Sleep(c.m.confirmDelay) // the simulated fsync; fake time inside the bubble
	select {
	case c.m.queue(topic) <- slices.Clone(body):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *memConn) Consume(_ context.Context, topic string, _ int, handle func([]byte)) (Subscription, error) {
	q := c.m.queue(topic)
	s := &memSub{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			select {
			case <-s.stop:
				return
			case b := <-q:
				time.Sleep(c.m.deliverDelay)
				handle(b)
			}
		}
	}()
	return s, nil
}

func (c *memConn) Close() error { return nil }

type memSub struct{ stop, done chan struct{} }

func (s *memSub) Stop() error { close(s.stop); <-s.done; return nil }

func TestPublishWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var progress bytes.Buffer
		res, err := Run(t.Context(), newMemBroker(time.Millisecond), Config{
			Mode: ModePublish, Topic: "t", Window: 4, Connections: 2,
			Duration: time.Second, Warmup: 100 * time.Millisecond, Progress: &progress,
		})
		if err != nil {
			t.Fatal(err)
		}
		// 4 in flight, 1 ms each, for 1 s: 4000 confirms, give or take the ones
		// at the edges of the measured phase.
		if res.Messages < 3990 || res.Messages > 4010 {
			t.Errorf("messages = %d, want about 4000", res.Messages)
		}
		if res.Latency == nil || res.Latency.P50 < 1 || res.Latency.P99 > 1.01 {
			t.Errorf("latency = %+v, want 1 ms", res.Latency)
		}
		if res.MBPerSec <= 0 || res.Errors != 0 {
			t.Errorf("result = %+v", res)
		}
		if !strings.Contains(progress.String(), "mem publish") {
			t.Errorf("progress output %q lacks a publish line", progress.String())
		}
	})
}

func TestDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		res, err := Run(t.Context(), newMemBroker(time.Millisecond), Config{
			Mode: ModeDrain, Topic: "t", Count: 1000, Window: 10, Connections: 3,
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.Messages != 1000 || res.Prefill == nil || res.Prefill.Messages != 1000 {
			t.Errorf("result = %+v, prefill %+v", res, res.Prefill)
		}
		// 1000 publishes, 10 in flight, 1 ms each.
		if got := res.Prefill.Seconds; got < 0.099 || got > 0.101 {
			t.Errorf("prefill took %vs, want 0.1", got)
		}
	})
}

func TestMixedLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		res, err := Run(t.Context(), newMemBroker(2*time.Millisecond), Config{
			Mode: ModeMixed, Topic: "t", RatePerSec: 1000, Window: 8,
			Duration: time.Second, Warmup: 200 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.Messages != 1000 || res.Missing != 0 {
			t.Errorf("messages = %d missing = %d, want 1000 and 0", res.Messages, res.Missing)
		}
		// Delivery follows the 2 ms confirm; the pacer's 1 ms tick adds up to 1 ms.
		if l := res.Latency; l == nil || l.P50 < 2 || l.Max > 3.05 {
			t.Errorf("latency = %+v, want 2..3 ms", res.Latency)
		}
	})
}

func TestMixedFallingBehindShowsInLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// One publish in flight at 10 ms each can do 100 msg/s; asking for 200
		// must show a growing backlog in the latency, not a flattering figure.
		res, err := Run(t.Context(), newMemBroker(10*time.Millisecond), Config{
			Mode: ModeMixed, Topic: "t", RatePerSec: 200, Window: 1, Duration: time.Second,
		})
		if l := res.Latency; l == nil || l.Max < 400 {
			t.Errorf("latency = %+v, want max >= 400 ms", res.Latency)
		}
		// The pacer stops 250 ms after the end of the phase: 125 of the 200 due
		// were sent, about 75 never were.
		if !errors.Is(err, ErrIncomplete) || res.Unsent < 70 || res.Unsent > 80 || res.Missing < res.Unsent {
			t.Errorf("err = %v, unsent %d, missing %d; want ErrIncomplete and about 75", err, res.Unsent, res.Missing)
		}
	})
}

func TestAllPublishesFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newMemBroker(0)
		b.failAll = errors.New("disk on fire")
		res, err := Run(t.Context(), b, Config{Mode: ModePublish, Topic: "t", Window: 3})
		if err == nil || !strings.Contains(err.Error(), "disk on fire") {
			t.Fatalf("err = %v", err)
		}
		if res.Errors < errorsMax || res.Errors > errorsMax+3 {
			t.Errorf("errors = %d, want about %d", res.Errors, errorsMax)
		}
	})
}

func TestCancelStopsRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		res, err := Run(ctx, newMemBroker(time.Millisecond), Config{Mode: ModePublish, Topic: "t", Duration: time.Minute})
		if !errors.Is(err, ErrIncomplete) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v", err)
		}
		if res.Messages == 0 {
			t.Error("no messages measured before the cancel")
		}
	})
}

func TestDrainDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &stingyBroker{memBroker: newMemBroker(0)}
		res, err := Run(t.Context(), b, Config{Mode: ModeDrain, Topic: "t", Count: 10, Duration: time.Second})
		if !errors.Is(err, ErrIncomplete) {
			t.Fatalf("err = %v", err)
		}
		if res.Messages != 0 {
			t.Errorf("messages = %d", res.Messages)
		}
	})
}

// TestDrainOutlastsDurationWhileProgressing: a prefill and a consume that
// each take three times Duration but never stop progressing run to the end,
// so a large Count works on a slow machine without raising Duration.
func TestDrainOutlastsDurationWhileProgressing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newMemBroker(time.Millisecond)
		b.deliverDelay = time.Millisecond
		res, err := Run(t.Context(), b, Config{Mode: ModeDrain, Topic: "t", Count: 3000, Window: 1, Duration: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if res.Messages != 3000 || res.Prefill == nil || res.Prefill.Messages != 3000 {
			t.Errorf("result = %+v, prefill %+v", res, res.Prefill)
		}
	})
}

// TestProgressSkipsZero: while a phase has measured nothing (the first
// delivery is 1.5 s away), no "0 msgs 0 msg/s" progress line is printed; the
// lines start with the first message.
func TestProgressSkipsZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newMemBroker(time.Millisecond)
		b.deliverDelay = 1500 * time.Millisecond
		var progress bytes.Buffer
		_, err := Run(t.Context(), b, Config{Mode: ModeDrain, Topic: "t", Count: 2, Window: 1, Duration: 5 * time.Second, Progress: &progress})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(progress.String(), " 0 msgs") || !strings.Contains(progress.String(), "mem drain") {
			t.Errorf("progress:\n%s", progress.String())
		}
	})
}

// TestDrainPrefillStall: a prefill that stops getting confirms ends once a
// Duration passes without one, with what it confirmed.
func TestDrainPrefillStall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &stallingBroker{memBroker: newMemBroker(time.Millisecond), after: 100}
		res, err := Run(t.Context(), b, Config{Mode: ModeDrain, Topic: "t", Count: 1000, Window: 1, Duration: time.Second})
		if !errors.Is(err, ErrIncomplete) || !strings.Contains(err.Error(), "prefill confirmed 100 of 1000 messages, then none for 1s") {
			t.Fatalf("err = %v", err)
		}
		if res.Messages != 0 || res.Prefill == nil || res.Prefill.Messages != 100 {
			t.Errorf("result = %+v, prefill %+v", res, res.Prefill)
		}
	})
}

// stallingBroker confirms its first publishes, then holds every later one
// until the publisher gives up.
type stallingBroker struct {
	*memBroker
	after int
	n     atomic.Int64
}

func (s *stallingBroker) Connect(ctx context.Context) (Conn, error) {
	c, _ := s.memBroker.Connect(ctx)
	return stallingConn{c, s}, nil
}

type stallingConn struct {
	Conn
	b *stallingBroker
}

func (c stallingConn) Publish(ctx context.Context, topic string, body []byte) error {
	if c.b.n.Add(1) > int64(c.b.after) {
		<-ctx.Done()
		return ctx.Err()
	}
	return c.Conn.Publish(ctx, topic, body)
}

// stingyBroker confirms publishes but never delivers.
type stingyBroker struct{ *memBroker }

func (s *stingyBroker) Connect(ctx context.Context) (Conn, error) {
	c, _ := s.memBroker.Connect(ctx)
	return stingyConn{c}, nil
}

type stingyConn struct{ Conn }

func (stingyConn) Consume(context.Context, string, int, func([]byte)) (Subscription, error) {
	return nopSub{}, nil
}

type nopSub struct{}

func (nopSub) Stop() error { return nil }

func TestUnreadablePIDFailsBeforeTheRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, err := Run(t.Context(), newMemBroker(0), Config{Mode: ModePublish, Topic: "t", PID: 42, ProcFS: fstest.MapFS{}})
		if !errors.Is(err, ErrProc) {
			t.Fatalf("err = %v, want ErrProc", err)
		}
	})
}

func TestProcReport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		procFS := fstest.MapFS{
			"42/status": {Data: []byte("VmHWM:\t2048 kB\nVmRSS:\t1024 kB\n")},
			"42/stat":   {Data: []byte("42 (srv) S 1 42 42 0 -1 0 0 0 0 0 10 5 0 0\n")},
		}
		res, err := Run(t.Context(), newMemBroker(time.Millisecond), Config{Mode: ModeDrain, Topic: "t", Count: 100, PID: 42, ProcFS: procFS})
		if err != nil {
			t.Fatal(err)
		}
		p := res.Proc
		if p == nil || p.RSSStartBytes != 1<<20 || p.RSSBacklogBytes != 1<<20 || p.RSSPeakBytes != 2<<20 || p.CPUPercent != 0 {
			t.Errorf("proc = %+v", p)
		}
	})
}

func TestConfigValidation(t *testing.T) {
	for _, c := range []Config{
		{Mode: ModePublish},
		{Mode: "bogus", Topic: "t"},
		{Mode: ModePublish, Topic: "t", SizeBytes: 4},
		{Mode: ModePublish, Topic: "t", Window: windowMax + 1},
		{Mode: ModePublish, Topic: "t", Duration: time.Hour},
		{Mode: ModeDrain, Topic: "t", Count: -1},
	} {
		if _, err := Run(t.Context(), newMemBroker(0), c); !errors.Is(err, ErrConfig) {
			t.Errorf("Run(%+v) err = %v, want ErrConfig", c, err)
		}
	}
}

func TestProcSample(t *testing.T) {
	stat := func(ut, st int) *fstest.MapFile {
		// comm with a space and a parenthesis, as a hostile process name could be.
		return &fstest.MapFile{Data: []byte("42 (my (srv) x) S 1 42 42 0 -1 4194560 100 0 0 0 " +
			strconv.Itoa(ut) + " " + strconv.Itoa(st) + " 0 0 20 0 8 0 123 456789 1234 18446744073709551615\n")}
	}
	status := &fstest.MapFile{Data: []byte("Name:\tsrv\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\nThreads:\t8\n")}
	t0 := time.Unix(1000, 0)
	a, err := ReadProc(fstest.MapFS{"42/status": status, "42/stat": stat(150, 50)}, 42, t0)
	if err != nil {
		t.Fatal(err)
	}
	if a.RSSBytes != 10<<20 || a.HWMBytes != 20<<20 || a.CPU != 2*time.Second {
		t.Errorf("sample = %+v", a)
	}
	b, err := ReadProc(fstest.MapFS{"42/status": status, "42/stat": stat(250, 50)}, 42, t0.Add(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got := CPUPercent(a, b); got != 50 {
		t.Errorf("CPUPercent = %v, want 50", got)
	}
	if _, err := ReadProc(fstest.MapFS{}, 7, t0); !errors.Is(err, ErrProc) {
		t.Errorf("missing pid: err = %v, want ErrProc", err)
	}
	bad := fstest.MapFS{"42/status": status, "42/stat": {Data: []byte("42 (x) S 1 2")}}
	if _, err := ReadProc(bad, 42, t0); !errors.Is(err, ErrProc) {
		t.Errorf("short stat: err = %v, want ErrProc", err)
	}
}

func TestHistogramQuantiles(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		vals := rapid.SliceOfN(rapid.Int64Range(0, int64(time.Hour)), 1, 500).Draw(t, "vals")
		var h Histogram
		for _, v := range vals {
			h.Record(time.Duration(v))
		}
		sorted := slices.Clone(vals)
		slices.Sort(sorted)
		for _, q := range []float64{0, 0.5, 0.9, 0.99, 1} {
			rank := int(q * float64(len(sorted)))
			if float64(rank) < q*float64(len(sorted)) {
				rank++
			}
			rank = max(rank, 1)
			exact := sorted[rank-1]
			got := int64(h.Quantile(q))
			// Never below the exact value, at most one bucket width (< 1/128) above.
			if got < exact || float64(got-exact) > float64(exact)/histSubBuckets+1 {
				t.Fatalf("q%.2f = %d, exact %d", q, got, exact)
			}
		}
		if h.Max() != time.Duration(sorted[len(sorted)-1]) || h.Count() != uint64(len(vals)) {
			t.Fatalf("max %v count %d", h.Max(), h.Count())
		}
	})
}

func TestHistogramBuckets(t *testing.T) {
	// Every bucket's high edge maps back to it, and the next value to the next one.
	for i := 0; i < histBuckets-1; i++ {
		hi := bucketHigh(i)
		if bucketOf(hi) != i || bucketOf(hi+1) != i+1 {
			t.Fatalf("bucket %d: high %d maps to %d, next to %d", i, hi, bucketOf(hi), bucketOf(hi+1))
		}
	}
	var h Histogram
	if h.Quantile(0.99) != 0 || h.Mean() != 0 {
		t.Error("empty histogram not zero")
	}
	h.Record(-5)
	if h.Max() != 0 {
		t.Error("negative duration not clamped")
	}
}

func BenchmarkHistogramRecord(b *testing.B) {
	var h Histogram
	d := 1234567 * time.Nanosecond
	for b.Loop() {
		h.Record(d)
	}
}
