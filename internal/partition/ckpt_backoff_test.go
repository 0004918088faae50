package partition

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
)

// ckptFaultFS fails the checkpoint's temporary file while armed, as a full
// disk would, and counts the attempts; the log itself keeps working.
type ckptFaultFS struct {
	*vfs.MemFS
	armed    atomic.Bool
	attempts atomic.Int32
}

func (f *ckptFaultFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	if strings.HasSuffix(name, checkpointFile+".tmp") {
		f.attempts.Add(1)
		if f.armed.Load() {
			return nil, &os.PathError{Op: "open", Path: name, Err: errors.New("no space left on device")}
		}
	}
	return f.MemFS.OpenFile(name, flag, perm)
}

// countHandler counts log records whose message starts with prefix.
type countHandler struct {
	mu     sync.Mutex
	prefix string
	n      int
}

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		h.mu.Lock()
		h.n++
		h.mu.Unlock()
	}
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }
func (h *countHandler) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// TestCheckpointFailureBacksOff: a failing checkpoint is not retried on
// every turn but after 1 s, 2 s, 4 s...; each failure is counted in Stats
// and logged once; when the disk recovers the next attempt succeeds and
// the backoff resets.
func TestCheckpointFailureBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ffs := &ckptFaultFS{MemFS: vfs.NewMem()}
		cfg := testConfig(ffs)
		clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
		cfg.Now = clk.now
		cfg.CheckpointEveryRecords = 1
		logs := &countHandler{prefix: "checkpoint failed"}
		cfg.Logger = slog.New(logs)
		p := mustOpen(t, cfg)
		defer p.Close()
		ffs.armed.Store(true)

		// step publishes n messages, one turn each, and returns how many
		// checkpoint attempts they caused.
		step := func(n int) int32 {
			before := ffs.attempts.Load()
			for range n {
				mustPublish(t, p, "m", nil)
				// The checkpoint runs beside the actor: let the one
				// this turn started finish before the next turn.
				synctest.Wait()
			}
			return ffs.attempts.Load() - before
		}
		if got := step(10); got != 1 {
			t.Fatalf("10 turns with a failing checkpoint made %d attempts, want 1", got)
		}
		if got := p.Stats().CheckpointFailures; got != 1 {
			t.Fatalf("CheckpointFailures = %d, want 1", got)
		}
		// The waits double: 1 s, then 2 s, then 4 s.
		for i, wait := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
			clk.advance(wait - time.Millisecond)
			if got := step(3); got != 0 {
				t.Fatalf("failure %d: %d attempts 1 ms before the %v backoff ended, want 0", i+1, got, wait)
			}
			clk.advance(time.Millisecond)
			if got := step(3); got != 1 {
				t.Fatalf("failure %d: %d attempts once the %v backoff passed, want 1", i+1, got, wait)
			}
		}
		if got, want := p.Stats().CheckpointFailures, uint64(4); got != want {
			t.Fatalf("CheckpointFailures = %d, want %d", got, want)
		}
		if got := logs.count(); got != 4 {
			t.Fatalf("logged %d checkpoint failures, want 4 (one per attempt)", got)
		}

		// The disk recovers: the attempt after the 8 s wait succeeds, and
		// the next checkpoint is due at once again.
		ffs.armed.Store(false)
		clk.advance(8 * time.Second)
		if got := step(1); got != 1 {
			t.Fatalf("%d attempts after recovery, want 1", got)
		}
		if got := step(2); got != 2 {
			t.Fatalf("%d attempts in 2 turns after a success, want 2 (backoff reset)", got)
		}
		if got := p.Stats().CheckpointFailures; got != 4 {
			t.Fatalf("CheckpointFailures = %d after recovery, want it to stay 4", got)
		}
		var covers uint64
		inspect(p, func() { covers = p.ckptLSN })
		if covers != p.Stats().NextLSN {
			t.Fatalf("checkpoint covers %d, want %d", covers, p.Stats().NextLSN)
		}
	})
}

// ckptGateFS holds the checkpoint's temporary file open until gate is
// closed, as a slow disk would.
type ckptGateFS struct {
	*vfs.MemFS
	gate    chan struct{}
	entered chan struct{}
}

func (f *ckptGateFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	if strings.HasSuffix(name, checkpointFile+".tmp") {
		select {
		case f.entered <- struct{}{}:
		default:
		}
		<-f.gate
	}
	return f.MemFS.OpenFile(name, flag, perm)
}

// TestCheckpointOffActor: while a checkpoint's file write is stuck, the
// partition keeps confirming publishes (the write runs on the checkpointer
// goroutine, not the actor), starts no second checkpoint, and once the
// write finishes the checkpoint covers what it snapshotted and the next one
// picks up the records appended meanwhile.
func TestCheckpointOffActor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gfs := &ckptGateFS{MemFS: vfs.NewMem(), gate: make(chan struct{}), entered: make(chan struct{}, 4)}
		cfg := testConfig(gfs)
		cfg.CheckpointEveryRecords = 3
		p := mustOpen(t, cfg)
		defer p.Close()
		for range 3 {
			mustPublish(t, p, "before", nil)
		}
		<-gfs.entered // the checkpoint of the first 3 records is being written
		var covers uint64
		inspect(p, func() { covers = p.ckptLSN })
		if covers != 0 {
			t.Fatalf("checkpoint covers %d before its write finished, want 0", covers)
		}
		for range 10 { // well past CheckpointEveryRecords again
			mustPublish(t, p, "during", nil)
		}
		synctest.Wait()
		if n := len(gfs.entered); n != 0 {
			t.Fatalf("%d more checkpoints started while one was under way, want 0", n)
		}
		close(gfs.gate)
		synctest.Wait()
		var since int
		inspect(p, func() { covers, since = p.ckptLSN, p.sinceCkpt })
		if covers < 4 || covers > p.Stats().NextLSN {
			t.Fatalf("checkpoint covers %d, want 4..%d", covers, p.Stats().NextLSN)
		}
		// The second checkpoint was due as soon as the first finished.
		if want := p.Stats().NextLSN; covers != want || since != 0 {
			t.Fatalf("after the stuck write: covers %d with %d records since, want %d and 0", covers, since, want)
		}
	})
}

// TestCheckpointAfterLongReplay: a partition that crashed before it ever
// checkpointed replays its whole log at the next open. Those records count
// toward the next checkpoint, so a broker that keeps crashing sooner than
// CheckpointEveryRecords new records still checkpoints after each long
// replay and its recovery time stays bounded, instead of replaying an ever
// longer log.
func TestCheckpointAfterLongReplay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		cfg := testConfig(fs)
		cfg.CheckpointEveryRecords = 1000
		p := mustOpen(t, cfg)
		for range 30 {
			mustPublish(t, p, "x", nil)
		}
		img := fs.Crash(nil, false) // no checkpoint was written
		p.Close()
		if _, err := img.Stat(filepath.Join(cfg.Dir, checkpointFile)); err == nil {
			t.Fatal("a checkpoint exists before the crash; the test needs none")
		}

		cfg.FS = img
		cfg.CheckpointEveryRecords = 20 // fewer than the 30 replayed
		p = mustOpen(t, cfg)
		defer p.Close()
		synctest.Wait()
		if _, err := img.Stat(filepath.Join(cfg.Dir, checkpointFile)); err != nil {
			t.Fatalf("no checkpoint after replaying 30 records with a checkpoint due every 20: %v", err)
		}
		if st := p.Stats(); st.Ready != 30 {
			t.Fatalf("ready %d after recovery, want 30", st.Ready)
		}
	})
}
