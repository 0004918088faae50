package broker

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/sinewmq/sinew/internal/vfs"
)

// opsFS records every file-system call by name, to show what a broker
// touches.
type opsFS struct {
	*vfs.MemFS
	mu  sync.Mutex
	ops []string
}

func (f *opsFS) rec(op, name string) {
	f.mu.Lock()
	f.ops = append(f.ops, op+" "+name)
	f.mu.Unlock()
}

func (f *opsFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	f.rec("open", name)
	return f.MemFS.OpenFile(name, flag, perm)
}
func (f *opsFS) ReadDir(dir string) ([]string, error) {
	f.rec("readdir", dir)
	return f.MemFS.ReadDir(dir)
}
func (f *opsFS) Stat(name string) (os.FileInfo, error) {
	f.rec("stat", name)
	return f.MemFS.Stat(name)
}
func (f *opsFS) MkdirAll(dir string, perm os.FileMode) error {
	f.rec("mkdir", dir)
	return f.MemFS.MkdirAll(dir, perm)
}
func (f *opsFS) SyncDir(dir string) error { f.rec("syncdir", dir); return f.MemFS.SyncDir(dir) }
func (f *opsFS) Lock(name string) (vfs.File, error) {
	f.rec("lock", name)
	return f.MemFS.Lock(name)
}

func TestSecondOpenOnLockedDirFailsBeforeReading(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &opsFS{MemFS: vfs.NewMem()}
		cfg := testConfig(fs)
		a := mustOpen(t, cfg)
		mustPublish(t, a, msg("jobs", "before"))

		fs.mu.Lock()
		fs.ops = nil
		fs.mu.Unlock()
		b, err := Open(cfg)
		if err == nil {
			b.Close()
			t.Fatal("second Open on a locked data dir succeeded")
		}
		var le *DataDirLockedError
		if !errors.As(err, &le) || !errors.Is(err, vfs.ErrLocked) {
			t.Fatalf("second Open: %v; want a *DataDirLockedError matching vfs.ErrLocked", err)
		}
		pid := strconv.Itoa(os.Getpid())
		if le.PID != os.Getpid() || le.Dir != "data" || !strings.Contains(err.Error(), "pid "+pid) ||
			!strings.Contains(err.Error(), "data dir data") {
			t.Fatalf("error %q (pid %d, dir %q) does not name holder pid %s and dir data", err, le.PID, le.Dir, pid)
		}
		// Nothing but the lock file was looked at: no queue, log or
		// checkpoint was read, let alone repaired.
		want := []string{"mkdir data", "lock data/LOCK", "open data/LOCK"}
		if got := strings.Join(fs.ops, "; "); got != strings.Join(want, "; ") {
			t.Fatalf("losing Open touched %q, want only %q", got, want)
		}

		// The holder is unaffected.
		mustPublish(t, a, msg("jobs", "after"))
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		c := mustOpen(t, cfg) // released by Close
		defer c.Close()
		if got := c.Stats().Queues[0].Partitions[0].Ready; got != 2 {
			t.Fatalf("ready after reopen = %d, want 2", got)
		}
	})
}

func TestOpenTakesOverAGivenLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		lock, err := LockDataDir(fs, "data")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Open(testConfig(fs)); !errors.Is(err, vfs.ErrLocked) {
			t.Fatalf("Open without the held lock: %v, want ErrLocked", err)
		}
		cfg := testConfig(fs)
		cfg.Lock = lock
		b := mustOpen(t, cfg)
		if _, err := LockDataDir(fs, "data"); !errors.Is(err, vfs.ErrLocked) {
			t.Fatalf("LockDataDir while the broker runs: %v, want ErrLocked", err)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		l2, err := LockDataDir(fs, "data")
		if err != nil {
			t.Fatalf("lock not released by Close: %v", err)
		}
		// A failed Open releases the lock it was given.
		cfg.Lock = l2
		cfg.DataDir = "elsewhere"
		if _, err := Open(cfg); err == nil || errors.Is(err, vfs.ErrLocked) {
			t.Fatalf("Open with a lock for another dir: %v, want a mismatch error", err)
		}
		l3, err := LockDataDir(fs, "data")
		if err != nil {
			t.Fatalf("lock not released by a failed Open: %v", err)
		}
		l3.Release()
	})
}

// TestOSLockExcludesSecondBrokerInProcess runs on the real file system:
// flock locks belong to the open file, so even two brokers in one process
// exclude each other.
func TestOSLockExcludesSecondBrokerInProcess(t *testing.T) {
	cfg := Config{DataDir: t.TempDir()}
	a := mustOpen(t, cfg)
	if b, err := Open(cfg); !errors.Is(err, vfs.ErrLocked) {
		if err == nil {
			b.Close()
		}
		t.Fatalf("second Open: %v, want ErrLocked", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b := mustOpen(t, cfg)
	b.Close()
}

// TestLockOnFullDisk: a full disk cannot record the pid, but the lock still
// excludes; the loser reports no pid.
func TestLockOnFullDisk(t *testing.T) {
	fs := vfs.NewMem()
	if err := fs.MkdirAll("data", 0o755); err != nil {
		t.Fatal(err)
	}
	fs.SetWriteError(errors.New("no space left on device"))
	l, err := LockDataDir(fs, "data")
	if err != nil {
		t.Fatalf("lock on a full disk: %v", err)
	}
	defer l.Release()
	_, err = LockDataDir(fs, "data")
	var le *DataDirLockedError
	if !errors.As(err, &le) || le.PID != 0 || !strings.Contains(err.Error(), "locked by another process;") {
		t.Fatalf("second lock: %v; want a lock error with no pid", err)
	}
}
