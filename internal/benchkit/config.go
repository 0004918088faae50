package benchkit

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"
)

// Mode selects a workload.
type Mode string

// Workloads.
const (
	// ModePublish keeps Window publishes in flight, each waiting for its confirm,
	// for Duration after Warmup. Latency is publish to confirm.
	ModePublish Mode = "publish"
	// ModeDrain prefills Count messages, then consumes and acknowledges them with
	// Prefetch per consumer. The rate is Count over the time to consume them all.
	ModeDrain Mode = "drain"
	// ModeMixed publishes at RatePerSec with live consumers. Latency is from the
	// moment a message was due to be published (stamped in its body) to its
	// delivery, so a publisher that falls behind shows up in the latency instead
	// of hiding it.
	ModeMixed Mode = "mixed"
)

// Limits on a configuration. They keep a mistyped flag from running for hours or
// exhausting memory on a shared machine.
const (
	sizeBytesMax    = 16 << 20
	sizeBytesMin    = stampBytes // mixed and drain stamp a header into the body
	durationMax     = 10 * time.Minute
	connectionsMax  = 64
	windowMax       = 4096
	prefetchMax     = 65536
	ratePerSecMax   = 1_000_000
	countMax        = 10_000_000
	errorsMax       = 100              // failed publishes tolerated before a run stops
	settleTimeMax   = 10 * time.Second // mixed: how long to wait for in-flight deliveries after the end
	progressEvery   = time.Second
	defaultDuration = 10 * time.Second
)

// Config describes one workload run. Zero values take the defaults noted.
type Config struct {
	Mode        Mode
	Topic       string        // required: the queue to use; engines give each run its own
	SizeBytes   int           // message body size; default 1024
	Duration    time.Duration // measured phase; for drain, how long prefill or consume may go without progress; default 10 s
	Warmup      time.Duration // unmeasured lead-in (publish, mixed); default 0
	Connections int           // client connections, shared by publishers and consumers; default 1
	Window      int           // publishes in flight across all connections; default 1 (publish), 256 (mixed, drain prefill)
	Prefetch    int           // per consumer (drain, mixed); default 256
	RatePerSec  int           // mixed: publish rate; default 20000
	Count       int           // drain: messages to prefill; default 100000
	PID         int           // broker process to sample (RSS, CPU); 0 = none

	Progress io.Writer // one line per second while running; nil = silent
	Clock    Clock     // nil = the real clock
	ProcFS   fs.FS     // procfs for PID; nil = os.DirFS("/proc")
}

// Clock is the engine's source of time. Production uses the real clock; tests run
// the engine inside a testing/synctest bubble or pass their own.
type Clock interface {
	Now() time.Time
	// After returns a channel that receives once d has passed.
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// withDefaults returns c with defaults applied, or an ErrConfig error.
func (c Config) withDefaults() (Config, error) {
	if c.Topic == "" {
		return c, fmt.Errorf("%w: topic is empty", ErrConfig)
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.SizeBytes, 1024)
	def(&c.Connections, 1)
	def(&c.Prefetch, 256)
	def(&c.RatePerSec, 20000)
	def(&c.Count, 100000)
	if c.Mode == ModePublish {
		def(&c.Window, 1)
	} else {
		def(&c.Window, 256)
	}
	if c.Duration == 0 {
		c.Duration = defaultDuration
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	if c.ProcFS == nil {
		c.ProcFS = os.DirFS("/proc")
	}
	switch c.Mode {
	case ModePublish, ModeDrain, ModeMixed:
	default:
		return c, fmt.Errorf("%w: unknown mode %q (want publish, drain or mixed)", ErrConfig, c.Mode)
	}
	checks := []struct {
		name      string
		v, lo, hi int64
	}{
		{"size", int64(c.SizeBytes), sizeBytesMin, sizeBytesMax},
		{"duration", int64(c.Duration), int64(time.Millisecond), int64(durationMax)},
		{"warmup", int64(c.Warmup), 0, int64(durationMax)},
		{"connections", int64(c.Connections), 1, connectionsMax},
		{"window", int64(c.Window), 1, windowMax},
		{"prefetch", int64(c.Prefetch), 1, prefetchMax},
		{"rate", int64(c.RatePerSec), 1, ratePerSecMax},
		{"count", int64(c.Count), 1, countMax},
		{"pid", int64(c.PID), 0, 1 << 22},
	}
	for _, k := range checks {
		if k.v < k.lo || k.v > k.hi {
			if k.name == "duration" || k.name == "warmup" {
				return c, fmt.Errorf("%w: %s %v out of range [%v, %v]", ErrConfig, k.name,
					time.Duration(k.v), time.Duration(k.lo), time.Duration(k.hi))
			}
			return c, fmt.Errorf("%w: %s %d out of range [%d, %d]", ErrConfig, k.name, k.v, k.lo, k.hi)
		}
	}
	return c, nil
}
