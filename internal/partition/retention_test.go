package partition

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/vfs"
)

// delayMaxMs is the longest delay a publisher may ask for (30 days), the
// worst case for retention: a message that waits that long pins the
// segment it was published in.
const delayMaxMs = 30 * 24 * 3600 * 1000

// ackConsumer acks every delivery from its own goroutine and closes done
// once target acks were answered. Its prefetch credit comes back when an
// ack is answered.
type ackConsumer struct {
	p      *Partition
	credit atomic.Int64
	ch     chan Delivery
	acked  atomic.Int64
	target int64
	done   chan struct{}
}

func newAckConsumer(p *Partition, prefetch int, target int64) *ackConsumer {
	c := &ackConsumer{p: p, ch: make(chan Delivery, prefetch), target: target, done: make(chan struct{})}
	c.credit.Store(int64(prefetch))
	return c
}

func (c *ackConsumer) Owner() string { return "acker" }
func (c *ackConsumer) TakeCredit(want int) int {
	for {
		have := c.credit.Load()
		n := min(int64(want), have)
		if n <= 0 {
			return 0
		}
		if c.credit.CompareAndSwap(have, have-n) {
			return int(n)
		}
	}
}
func (c *ackConsumer) RefundCredit(n int)        { c.credit.Add(int64(n)) }
func (c *ackConsumer) Deliver(d Delivery)        { c.ch <- d } // never blocks: at most prefetch outstanding
func (c *ackConsumer) LeaseEnded(uint64, uint64) {}
func (c *ackConsumer) Detached(error)            {}

func (c *ackConsumer) run(t testing.TB, stop <-chan struct{}) {
	for {
		select {
		case d := <-c.ch:
			c.p.SettleFor(c, Ack, d.Offset, d.LeaseID, 0, func(err error) {
				if err != nil {
					t.Errorf("ack %d: %v", d.Offset, err)
				}
				c.credit.Add(1)
				if c.acked.Add(1) == c.target {
					close(c.done)
				}
				c.p.Poke()
			})
		case <-stop:
			return
		}
	}
}

// chanConsumer hands deliveries to a channel.
type chanConsumer struct{ ch chan Delivery }

func (c *chanConsumer) Owner() string             { return "late" }
func (c *chanConsumer) TakeCredit(want int) int   { return min(want, cap(c.ch)-len(c.ch)) }
func (c *chanConsumer) RefundCredit(int)          {}
func (c *chanConsumer) Deliver(d Delivery)        { c.ch <- d }
func (c *chanConsumer) LeaseEnded(uint64, uint64) {}
func (c *chanConsumer) Detached(error)            {}

// retentionCase publishes one message delayed by delayMaxMs, then n small
// messages that a consumer acks as they come, and returns how many
// segments the log keeps once they are all acked, and after a Close and
// reopen (Close relocates and checkpoints once more). It then moves the
// clock past the delay and checks that the delayed message is delivered
// with its body.
func retentionCase(t *testing.T, n int, cfg Config) (running, reopened int) {
	t.Helper()
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	cfg.Now = clk.now
	cfg.Queue.LeaseMs = 3_600_000
	p := mustOpen(t, cfg)
	delayed := mustPublish(t, p, "the delayed one", func(m *queue.Message) {
		m.NotBeforeMs = clk.now().UnixMilli() + delayMaxMs
	})
	c := newAckConsumer(p, 1000, int64(n))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); c.run(t, stop) }()
	if err := p.Attach(c); err != nil {
		t.Fatal(err)
	}
	// Publish with a bounded window, retrying a full inbox.
	window := make(chan struct{}, 2048)
	body := []byte("m")
	var failed atomic.Int64
	for range n {
		window <- struct{}{}
		for {
			errc := make(chan error, 1)
			p.Publish(&queue.Message{Body: body}, func(_ uint64, err error) {
				if err != nil && !errors.Is(err, ErrInboxFull) {
					failed.Add(1)
				}
				if !errors.Is(err, ErrInboxFull) {
					<-window
				}
				errc <- err
			})
			if err := <-errc; !errors.Is(err, ErrInboxFull) {
				break
			}
			runtime.Gosched() // the actor drains the inbox
		}
	}
	if failed.Load() > 0 {
		t.Fatalf("%d publishes failed", failed.Load())
	}
	<-c.done
	inspect(p, func() { running = len(p.log.Segments()) })
	close(stop)
	wg.Wait()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	p = mustOpen(t, cfg)
	defer p.Close()
	inspect(p, func() { reopened = len(p.log.Segments()) })
	clk.advance(delayMaxMs * time.Millisecond)
	late := &chanConsumer{ch: make(chan Delivery, 1)}
	if err := p.Attach(late); err != nil {
		t.Fatal(err)
	}
	d := <-late.ch
	if d.Offset != delayed || string(d.Body) != "the delayed one" {
		t.Fatalf("after the delay got offset %d body %q, want %d %q", d.Offset, d.Body, delayed, "the delayed one")
	}
	return running, reopened
}

// TestRetentionPassesDelayedMessage is the delayed-message retention case:
// one message delayed by the longest allowed delay, then n messages
// published and consumed. Without relocation the delayed message pins
// every segment after its own; with it the log keeps a few segments (those
// since the last checkpoint), and the delayed message is still delivered,
// with its body, when its time comes. SINEW_RETENTION_MESSAGES raises n
// (docs/reliability.md records a run with 1,000,000).
func TestRetentionPassesDelayedMessage(t *testing.T) {
	n := 20_000
	if v := os.Getenv("SINEW_RETENTION_MESSAGES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			t.Fatalf("SINEW_RETENTION_MESSAGES=%q", v)
		}
	}
	base := func() Config {
		cfg := testConfig(vfs.NewMem())
		cfg.SegmentBytes = 16 << 10
		cfg.CheckpointEveryRecords = 3000
		return cfg
	}
	pinnedCfg := base()
	pinnedCfg.relocateLiveFraction = -1 // relocation off: retention as it was
	pinned, _ := retentionCase(t, n, pinnedCfg)
	running, reopened := retentionCase(t, n, base())
	t.Logf("%d messages: without relocation %d segments kept; with it %d running, %d after close and reopen",
		n, pinned, running, reopened)
	// About 130 bytes of log per message cycle in 16 KiB segments; a
	// checkpoint interval of 3000 records is about 8 segments.
	if pinned < n/200 {
		t.Errorf("without relocation only %d segments kept: the delayed message no longer pins them, so this test shows nothing", pinned)
	}
	if running > 12 || reopened > 2 {
		t.Errorf("with relocation %d segments kept running and %d after reopen, want at most 12 and 2", running, reopened)
	}
}

// TestRelocationLeavesBacklogAlone: a backlog nobody consumes is live in
// every segment, so relocating it would only double its disk. The policy
// copies nothing, and retention keeps the backlog's segments.
func TestRelocationLeavesBacklogAlone(t *testing.T) {
	cfg := testConfig(vfs.NewMem())
	cfg.SegmentBytes = 16 << 10
	cfg.CheckpointEveryRecords = 500
	p := mustOpen(t, cfg)
	defer p.Close()
	for i := range 3000 {
		mustPublish(t, p, strconv.Itoa(i), nil)
	}
	var segs int
	inspect(p, func() { segs = len(p.log.Segments()) })
	if st := p.Stats(); st.Relocated != 0 || st.Ready != 3000 {
		t.Fatalf("relocated %d of a 3000-message backlog (ready %d), want 0", st.Relocated, st.Ready)
	}
	if segs < 3 {
		t.Fatalf("backlog spans %d segments; the test needs several", segs)
	}
}

// TestIdleAfterBurstShrinksLog: a partition that processed a burst and then
// went quiet checkpoints after idleCheckpointMs; nothing in its log is
// needed any more, so it starts an empty segment and deletes the full one.
// Its log goes from megabytes to nothing, without a restart.
func TestIdleAfterBurstShrinksLog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(vfs.NewMem()) // default 64 MiB segments
		p := mustOpen(t, cfg)
		defer p.Close()
		const n = 2000
		c := newAckConsumer(p, 100, n)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); c.run(t, stop) }()
		defer func() { close(stop); wg.Wait() }()
		if err := p.Attach(c); err != nil {
			t.Fatal(err)
		}
		body := string(make([]byte, 1024))
		for range n {
			mustPublish(t, p, body, nil)
		}
		<-c.done
		logBytes := func() (total int64, segs int) {
			inspect(p, func() {
				for _, s := range p.log.Segments() {
					total += s.Bytes
					segs++
				}
			})
			return total, segs
		}
		busy, _ := logBytes()
		if busy < n*1024 {
			t.Fatalf("log holds %d bytes after %d 1 KiB messages", busy, n)
		}
		time.Sleep(idleCheckpointMs * time.Millisecond) // the bubble's clock: the partition goes idle
		synctest.Wait()
		idle, segs := logBytes()
		t.Logf("log: %d bytes while busy, %d bytes in %d segment(s) once idle", busy, idle, segs)
		if idle != 0 || segs != 1 {
			t.Fatalf("idle log holds %d bytes in %d segments, want one empty segment", idle, segs)
		}
	})
}
