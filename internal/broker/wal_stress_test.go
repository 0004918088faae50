package broker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// crashFS is a MemFS that calls crash just before its n-th durability
// step (a file or directory sync, a rename, a remove) once armed, so a
// crash can fall between any two of them: between a release of the
// journal and the sync it relies on, say.
type crashFS struct {
	*vfs.MemFS
	mu    sync.Mutex
	left  int // steps until the crash; 0: disarmed
	crash func()
}

func (c *crashFS) arm(n int, crash func()) {
	c.mu.Lock()
	c.left, c.crash = n, crash
	c.mu.Unlock()
}

func (c *crashFS) step() {
	c.mu.Lock()
	fire := false
	if c.left > 0 {
		c.left--
		fire = c.left == 0
	}
	crash := c.crash
	c.mu.Unlock()
	if fire {
		crash()
	}
}

func (c *crashFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	f, err := c.MemFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &crashFile{File: f, fs: c}, nil
}
func (c *crashFS) Remove(name string) error { c.step(); return c.MemFS.Remove(name) }
func (c *crashFS) Rename(oldname, newname string) error {
	c.step()
	return c.MemFS.Rename(oldname, newname)
}
func (c *crashFS) SyncDir(dir string) error { c.step(); return c.MemFS.SyncDir(dir) }

type crashFile struct {
	vfs.File
	fs *crashFS
}

func (f *crashFile) Sync() error               { f.fs.step(); return f.File.Sync() }
func (f *crashFile) Allocate(size int64) error { return vfs.Allocate(f.File, size) }

// chanConsumer hands deliveries to the test through a channel; Deliver
// never blocks (a full channel is a test failure).
type chanConsumer struct {
	t  *testing.T
	ch chan Delivery
}

func (c *chanConsumer) Deliver(_ *Subscription, d Delivery) {
	select {
	case c.ch <- d:
	default:
		c.t.Error("delivery channel full")
	}
}
func (c *chanConsumer) Closed(*Subscription, uint8, error) {}

// Power loss (with and without torn writes) in the middle of concurrent
// publishes and ACKs, at a confirm count or just before a random durability
// step, with checkpoints every few records or rarely, small partition
// segments (retention drops them), small journal segments (pressure and
// trimming), a queue created at runtime, and now and then a clean stop
// under load: after each restart every confirmed publish is there unless
// its ACK was sent, and no message whose ACK was confirmed comes back.
func TestWALCrashUnderLoadKeepsConfirmedAndSettled(t *testing.T) {
	seeds := uint64(6)
	if testing.Short() {
		seeds = 2
	}
	for seed := range seeds {
		t.Run("seed="+strconv.FormatUint(seed, 10), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { walStressRun(t, seed) })
		})
	}
}

func walStressRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 11))
	fs := walFS(t)
	var mu sync.Mutex
	confirmed := map[string]bool{} // bodies of confirmed publishes to jobs
	acked := map[string]bool{}     // bodies whose ACK was confirmed
	// doubt holds the bodies whose ACK was sent but not answered before
	// the crash: it may have been applied, so they may be gone.
	doubt := map[string]bool{}
	otherConfirmed := 0
	ctx := context.Background()
	for round := range 6 {
		cfs := &crashFS{MemFS: fs}
		cfg := testConfig(cfs)
		cfg.CheckpointEveryRecords = 8 + rng.IntN(64)
		if rng.IntN(3) == 0 {
			// Rare checkpoints: journal pressure releases it.
			cfg.CheckpointEveryRecords = 1 << 20
		}
		cfg.SegmentBytes = 4 << 10
		cfg.walSegmentBytes = 16 << 10
		b := mustOpen(t, cfg)
		if _, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: "jobs", Partitions: 3, MaxRetries: -1}); err != nil {
			t.Fatal(err)
		}
		if got := readyTotal(t, b, "other"); got < otherConfirmed {
			t.Errorf("round %d: queue other has %d ready, %d confirmed", round, got, otherConfirmed)
		}
		c := &chanConsumer{t: t, ch: make(chan Delivery, 1<<16)}
		s, err := b.Subscribe(&protocol.Subscribe{Topic: "jobs", Partition: -1, Prefetch: 64}, c)
		if err != nil {
			t.Fatal(err)
		}
		// Check: drain the queue, ACKing everything.
		for {
			synctest.Wait()
			n := 0
			for len(c.ch) > 0 {
				d := <-c.ch
				n++
				body := string(d.Body)
				if acked[body] {
					t.Errorf("round %d: %q came back after its ACK was confirmed", round, body)
				}
				if code := settleWait(s, protocol.OpAck, d); code != protocol.CodeOK {
					t.Errorf("round %d: ack %q: %v", round, body, code)
				}
				acked[body] = true
			}
			if n == 0 {
				break
			}
		}
		var lost []string
		for body := range confirmed {
			if !acked[body] && !doubt[body] {
				lost = append(lost, body)
			}
		}
		if len(lost) > 0 {
			slices.Sort(lost)
			t.Errorf("round %d: %d confirmed messages lost: %q", round, len(lost), lost[:min(len(lost), 10)])
		}
		if t.Failed() {
			b.Close()
			return
		}

		// Load: publishers, an ACKer, and a crash (or a clean stop) once
		// target publishes are confirmed, or just before the file
		// system's n-th durability step.
		target := 100 + rng.IntN(600)
		crashAt := make(chan struct{})
		var once sync.Once
		mode := rng.IntN(4) // 0: clean stop, 1: crash at target, 2 and 3: crash at a step
		tear := rng.IntN(2) == 0
		var crashed *vfs.MemFS
		if mode >= 2 {
			target = -1
			crashRng := rand.New(rand.NewPCG(seed, uint64(round)))
			cfs.arm(1+rng.IntN(1500), func() {
				crashed = fs.Crash(crashRng, tear)
				close(crashAt)
			})
		}
		count := 0
		var wg sync.WaitGroup
		for p := range 3 {
			wg.Go(func() {
				for i := 0; ; i++ {
					m := msg("jobs", fmt.Sprintf("r%d-p%d-%d", round, p, i))
					if p == 2 && i%5 == 0 {
						m = msg("other", "x")
					}
					if _, err := publish(t, b, m); err != nil {
						return
					}
					mu.Lock()
					if m.Topic == "other" {
						otherConfirmed++
					} else {
						confirmed[string(m.Body)] = true
					}
					count++
					if target > 0 && count >= target {
						once.Do(func() { close(crashAt) })
					}
					mu.Unlock()
				}
			})
		}
		stop := make(chan struct{})
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case d := <-c.ch:
					mu.Lock()
					doubt[string(d.Body)] = true
					mu.Unlock()
					code := settleWait(s, protocol.OpAck, d)
					mu.Lock()
					if code == protocol.CodeOK {
						acked[string(d.Body)] = true
						delete(doubt, string(d.Body))
					}
					mu.Unlock()
				}
			}
		})
		<-crashAt
		if mode == 0 {
			// A clean stop in the middle of the load (the journal is
			// retired if every partition released it).
			close(stop)
			if err := b.Close(); err != nil {
				t.Errorf("round %d: close: %v", round, err)
			}
			wg.Wait()
			continue
		}
		if mode == 1 {
			crashed = fs.Crash(rng, tear)
		}
		close(stop)
		b.Close() // the crashed file system refuses everything
		wg.Wait()
		fs = crashed
	}
	t.Logf("confirmed %d, acked %d, other %d", len(confirmed), len(acked), otherConfirmed)
}
