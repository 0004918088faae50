package partition

import (
	"path/filepath"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
)

// processCrash returns what a restarted process would find on fs: every
// file as the OS holds it (written, synced or not), since only the process
// died and the kernel's page cache survived. Contrast MemFS.Crash, which
// models power loss and keeps only synced data.
func processCrash(t *testing.T, fs *vfs.MemFS) *vfs.MemFS {
	t.Helper()
	img := vfs.NewMem()
	var walk func(dir string)
	walk = func(dir string) {
		names, err := fs.ReadDir(dir)
		if err != nil {
			t.Fatalf("readdir %s: %v", dir, err)
		}
		for _, n := range names {
			name := filepath.Join(dir, n)
			fi, err := fs.Stat(name)
			if err != nil {
				t.Fatalf("stat %s: %v", name, err)
			}
			if fi.IsDir() {
				if err := img.MkdirAll(name, 0o755); err != nil {
					t.Fatal(err)
				}
				walk(name)
				continue
			}
			b, err := fs.ReadFile(name)
			if err != nil {
				t.Fatalf("read %s: %v", name, err)
			}
			if err := img.WriteFile(name, b); err != nil {
				t.Fatal(err)
			}
		}
	}
	walk(".")
	return img
}

// TestSyncIntervalConfirmsOnlyWrittenRecords: under SyncInterval a publish
// is confirmed only once its record is in the OS, so a process crash at the
// very moment of the confirmation (the image is taken inside the callback)
// keeps it, although no fdatasync has run.
func TestSyncIntervalConfirmsOnlyWrittenRecords(t *testing.T) {
	fs := vfs.NewMem()
	cfg := testConfig(fs)
	cfg.Sync = seglog.SyncInterval
	cfg.SyncIntervalMs = 3_600_000 // no background sync during the test
	p := mustOpen(t, cfg)
	type outcome struct {
		off uint64
		err error
		img *vfs.MemFS
	}
	ch := make(chan outcome, 1)
	p.Publish(&queue.Message{Body: []byte("survives a process crash")}, func(off uint64, err error) {
		// On the actor goroutine, right at confirmation: crash now.
		ch <- outcome{off, err, processCrash(t, fs)}
	})
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.FS = r.img
	p = mustOpen(t, cfg)
	defer p.Close()
	inspect(p, func() {
		in, ok := p.st.Lookup(r.off, p.nowMs())
		if !ok || in.State != queue.StateReady {
			t.Errorf("confirmed offset %d after a process crash: %+v, %v", r.off, in, ok)
			return
		}
		m, err := p.message(r.off)
		if err != nil || string(m.Body) != "survives a process crash" {
			t.Errorf("body %v, %v", m, err)
		}
	})
}

// fakeClock is an injected clock the test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// leaseAndRestart publishes one message per owner, leases each to its own
// consumer and closes the partition with the leases outstanding.
func leaseAndRestart(t *testing.T, cfg Config, owners ...string) {
	t.Helper()
	p := mustOpen(t, cfg)
	for _, o := range owners {
		mustPublish(t, p, "for-"+o, nil)
		c := &tconsumer{owner: o, credit: 1}
		p.Attach(c)
		synctest.Wait()
		if len(c.deliveries()) != 1 {
			t.Fatalf("%s got %d deliveries", o, len(c.deliveries()))
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRecoveredLeasesReleasedAfterGrace: leases found by recovery keep
// their (gone) holders for RecoveredLeaseGraceMs of the injected clock, then
// go back to ready with the attempt counted, except those claimed by owner.
func TestRecoveredLeasesReleasedAfterGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := &fakeClock{t: time.UnixMilli(1_700_000_000_000)}
		cfg := testConfig(vfs.NewMem())
		cfg.Now = clk.now
		cfg.Queue.LeaseMs = 3_600_000 // far beyond the grace: only the grace can free them
		cfg.RecoveredLeaseGraceMs = 5000
		leaseAndRestart(t, cfg, "old-a", "old-b")

		p := mustOpen(t, cfg)
		defer p.Close()
		claimed := make(chan []queue.Info, 1)
		p.ClaimRecovered("old-a", func(in []queue.Info) { claimed <- in })
		if in := <-claimed; len(in) != 1 || in[0].Owner != "old-a" || in[0].Attempt != 1 {
			t.Fatalf("claimed %+v, want old-a's one lease", in)
		}
		c := &tconsumer{owner: "new", credit: -1}
		p.Attach(c)
		clk.advance(4999 * time.Millisecond)
		p.Poke()
		synctest.Wait()
		if ds := c.deliveries(); len(ds) != 0 {
			t.Fatalf("released before the grace ended: %v", bodies(ds))
		}
		clk.advance(time.Millisecond)
		p.Poke()
		synctest.Wait()
		ds := c.deliveries()
		if len(ds) != 1 || string(ds[0].Body) != "for-old-b" || ds[0].Attempt != 2 {
			t.Fatalf("after the grace: %+v, want for-old-b at attempt 2", ds)
		}
		if st := p.Stats(); st.Inflight != 2 || st.Ready != 0 {
			t.Fatalf("stats %+v: want the claimed lease and the new one inflight", st)
		}
		p.ClaimRecovered("old-b", func(in []queue.Info) { claimed <- in })
		if in := <-claimed; len(in) != 0 {
			t.Fatalf("claim after the grace got %+v", in)
		}
	})
}

// TestRecoveredLeasesReleasedAtStartup: with no grace (the default) every
// recovered lease is ready again on the first turn after Open.
func TestRecoveredLeasesReleasedAtStartup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := &fakeClock{t: time.UnixMilli(1_700_000_000_000)}
		cfg := testConfig(vfs.NewMem())
		cfg.Now = clk.now
		cfg.Queue.LeaseMs = 3_600_000
		leaseAndRestart(t, cfg, "x", "y", "z")
		p := mustOpen(t, cfg)
		defer p.Close()
		synctest.Wait()
		if st := p.Stats(); st.Inflight != 0 || st.Ready != 3 {
			t.Fatalf("after restart: %+v, want 3 ready", st)
		}
		c := &tconsumer{owner: "new", credit: -1}
		p.Attach(c)
		synctest.Wait()
		for _, d := range c.deliveries() {
			if d.Attempt != 2 {
				t.Errorf("%s redelivered at attempt %d, want 2", d.Body, d.Attempt)
			}
		}
		if n := len(c.deliveries()); n != 3 {
			t.Fatalf("%d redelivered, want 3", n)
		}
	})
}
