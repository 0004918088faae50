package partition

import (
	"path/filepath"
	"testing"

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
