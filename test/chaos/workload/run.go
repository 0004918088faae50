package workload

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"sync"
	"time"

	"github.com/sinewmq/sinew/protocol"
	"github.com/sinewmq/sinew/test/chaos/checker"
)

// Limits of a run.
const (
	producersMax       = 64
	consumersMax       = 64
	drainPollInterval  = 50 * time.Millisecond
	declareAttemptsMax = 200
	// stopTimeout bounds the wait for producers (and then consumers) to
	// return once stopped; each of their own waits is bounded by ctx or a
	// connection deadline, so this is a backstop that keeps a run finite.
	stopTimeout = 30 * time.Second
)

// Config describes a workload. Zero fields take the defaults in parentheses.
type Config struct {
	Addr                string // broker or proxy address (required)
	Topic               string // queue topic ("chaos")
	Partitions          uint32 // partitions to declare (0: broker default)
	LeaseMs             int64  // lease to declare, so lost deliveries come back soon (3000)
	Producers           int    // producer goroutines (2)
	Consumers           int    // consumer goroutines (2)
	MessagesPerProducer uint64 // sequences 1..N per producer (1000)
	PublishWindow       int    // unconfirmed publishes per producer (32)
	Prefetch            uint32 // per consumer (64)
	PaddingBytes        int    // body padding (64)
	Resume              bool   // raw consumers offer their resume identity on reconnect
	SDK                 bool   // drive the broker through the Go SDK instead of raw frames
	// Seeds are the client addresses of a cluster's nodes (SDK only):
	// every client knows them all (sinew.WithSeeds), and consumer i
	// subscribes through node i mod len(Seeds), so the consumers span
	// the partitions' owners.
	Seeds []string
	// Dial opens every connection of the workload (net.Dialer's by
	// default), for brokers reached another way, such as from inside a
	// network namespace.
	Dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	Checker *checker.Checker // receives every record (required)
	Logf    func(format string, args ...any)

	start time.Time
}

func (c *Config) sinceMs() int64 { return time.Since(c.start).Milliseconds() }

// Counters are the workload's own counts (the checker holds the verdict).
type Counters struct {
	Publishes      int            // PUBLISH frames written, resends included
	Confirms       int            // PUBLISH_OK received
	PublishErrors  map[string]int // ERROR replies to publishes, by code name
	Deliveries     int            // DELIVER frames received
	Acks           int            // tags sent in ACK frames
	AckErrors      map[string]int // SDK acks (Complete) that returned an error, by error
	Connects       int            // successful handshakes
	DialFailures   int            // failed dials or handshakes
	ConnErrors     int            // consumer connections that ended with an error
	GoingAway      int            // GOING_AWAY pushes seen
	ResumeOutcomes map[string]int // consumer HELLO_OK outcomes
}

func (v Counters) String() string {
	return fmt.Sprintf("publishes=%d confirms=%d publish_errors=%v deliveries=%d acks=%d ack_errors=%v connects=%d dial_failures=%d conn_errors=%d going_away=%d resume=%v",
		v.Publishes, v.Confirms, v.PublishErrors, v.Deliveries, v.Acks, v.AckErrors, v.Connects, v.DialFailures, v.ConnErrors, v.GoingAway, v.ResumeOutcomes)
}

// Stats holds a run's Counters; every producer and consumer adds to it.
type Stats struct {
	mu sync.Mutex
	c  Counters
}

func newStats() *Stats {
	return &Stats{c: Counters{PublishErrors: map[string]int{}, AckErrors: map[string]int{}, ResumeOutcomes: map[string]int{}}}
}

func (s *Stats) add(f func(*Counters)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(&s.c)
}

// Snapshot copies the counters.
func (s *Stats) Snapshot() Counters {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.c
	v.PublishErrors = maps.Clone(s.c.PublishErrors)
	v.AckErrors = maps.Clone(s.c.AckErrors)
	v.ResumeOutcomes = maps.Clone(s.c.ResumeOutcomes)
	return v
}

func (s *Stats) String() string { return s.Snapshot().String() }

// Run is a started workload.
type Run struct {
	cfg   Config
	stats *Stats

	stopProducers context.CancelFunc
	stopConsumers context.CancelFunc
	producersWG   sync.WaitGroup
	consumersWG   sync.WaitGroup
	producersDone chan struct{}
}

// ErrStopTimeout is returned by Stop and StopProducers when a producer or
// consumer goroutine did not return within stopTimeout of being stopped.
var ErrStopTimeout = errors.New("workload: stop timed out")

// ErrDrainTimeout is returned by Drain when confirmed messages are still
// unsettled at its deadline.
var ErrDrainTimeout = errors.New("workload: drain timed out")

// Start declares the queue (retrying until ctx ends) and starts consumers and
// producers. ctx bounds only the declaration.
func Start(ctx context.Context, cfg Config) (*Run, error) {
	if cfg.Addr == "" || cfg.Checker == nil {
		return nil, errors.New("workload: Config needs Addr and Checker")
	}
	if cfg.Topic == "" {
		cfg.Topic = "chaos"
	}
	if cfg.LeaseMs == 0 {
		cfg.LeaseMs = 3000
	}
	if cfg.Producers <= 0 {
		cfg.Producers = 2
	}
	if cfg.Consumers <= 0 {
		cfg.Consumers = 2
	}
	cfg.Producers = min(cfg.Producers, producersMax)
	cfg.Consumers = min(cfg.Consumers, consumersMax)
	if cfg.MessagesPerProducer == 0 {
		cfg.MessagesPerProducer = 1000
	}
	if cfg.PublishWindow <= 0 {
		cfg.PublishWindow = 32
	}
	if cfg.Prefetch == 0 {
		cfg.Prefetch = 64
	}
	if cfg.PaddingBytes == 0 {
		cfg.PaddingBytes = 64
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	cfg.start = time.Now()
	if err := declare(ctx, &cfg); err != nil {
		return nil, err
	}
	r := &Run{cfg: cfg, stats: newStats(),
		producersDone: make(chan struct{})}
	cctx, ccancel := context.WithCancel(context.Background())
	pctx, pcancel := context.WithCancel(context.Background())
	r.stopConsumers, r.stopProducers = ccancel, pcancel
	for i := range cfg.Consumers {
		k := &consumer{cfg: &r.cfg, name: fmt.Sprintf("c%d", i), stats: r.stats, index: i}
		r.consumersWG.Add(1)
		run := k.run
		if cfg.SDK {
			run = k.sdkRun
		}
		go func() { defer r.consumersWG.Done(); run(cctx) }()
	}
	for i := range cfg.Producers {
		p := &producer{cfg: &r.cfg, name: fmt.Sprintf("p%d", i), stats: r.stats, index: i}
		r.producersWG.Add(1)
		run := p.run
		if cfg.SDK {
			run = p.sdkRun
		}
		go func() { defer r.producersWG.Done(); run(pctx) }()
	}
	go func() { r.producersWG.Wait(); close(r.producersDone) }()
	return r, nil
}

// declare creates the queue with the configured lease and partitions.
func declare(ctx context.Context, cfg *Config) error {
	var last error
	for n := 0; n < declareAttemptsMax; n++ {
		if last = declareOnce(ctx, cfg); last == nil {
			return nil
		}
		if !backoff(ctx, n) {
			break
		}
	}
	return fmt.Errorf("workload: declare %q: %w", cfg.Topic, last)
}

func declareOnce(ctx context.Context, cfg *Config) error {
	c, err := dial(ctx, cfg, cfg.Addr, "chaos-declare", protocol.ResumeIdentity{})
	if err != nil {
		return err
	}
	defer c.close()
	if _, err := c.send(0, &protocol.DeclareQueue{Topic: cfg.Topic, Partitions: cfg.Partitions,
		MaxRetries: -1, LeaseMs: cfg.LeaseMs}); err != nil {
		return err
	}
	for range 16 { // skip heartbeats, bounded
		_, body, err := c.next()
		if err != nil {
			return err
		}
		switch m := body.(type) {
		case *protocol.DeclareOK:
			return nil
		case *protocol.ErrorBody:
			return m.Err()
		}
	}
	return errors.New("workload: no answer to DECLARE_QUEUE")
}

// Stats returns the workload's counters.
func (r *Run) Stats() *Stats { return r.stats }

// SinceMs is the run's clock: milliseconds since Start, the scale of the
// checker's delivery timestamps.
func (r *Run) SinceMs() int64 { return r.cfg.sinceMs() }

// ProducersDone is closed when every producer has published and had confirmed
// all of its sequences (or was stopped).
func (r *Run) ProducersDone() <-chan struct{} { return r.producersDone }

// StopProducers stops publishing and waits for the producers to return, at
// most stopTimeout. Publishes still unconfirmed stay "attempted": they may
// or may not arrive.
func (r *Run) StopProducers() error {
	r.stopProducers()
	select {
	case <-r.producersDone:
		return nil
	case <-time.After(stopTimeout):
		return fmt.Errorf("%w: producers still running %v after stop", ErrStopTimeout, stopTimeout)
	}
}

// Drain waits until every confirmed message has a confirmed ack, or timeout.
func (r *Run) Drain(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	t := time.NewTicker(drainPollInterval)
	defer t.Stop()
	for {
		n := r.cfg.Checker.Outstanding()
		if n == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w after %v: %d confirmed messages unsettled", ErrDrainTimeout, timeout, n)
		}
		<-t.C
	}
}

// Stop stops producers and consumers and waits for all of them, at most
// stopTimeout for each group. A goroutine still running after that is
// reported (and left behind) rather than waited for, so a run always ends.
func (r *Run) Stop() error {
	perr := r.StopProducers()
	r.stopConsumers()
	done := make(chan struct{})
	go func() { r.consumersWG.Wait(); close(done) }()
	select {
	case <-done:
		return perr
	case <-time.After(stopTimeout):
		return errors.Join(perr, fmt.Errorf("%w: consumers still running %v after stop", ErrStopTimeout, stopTimeout))
	}
}
