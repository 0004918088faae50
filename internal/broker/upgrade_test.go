package broker

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/internal/wal"
)

// copyTree copies the directory src into dst with private modes.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(to, 0o700)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A data directory written by the release before the node journal (each
// partition fsyncing its own log; testdata/datadir-own-logs: "orders" got
// a, b, c, d and a was consumed and acknowledged, "jobs" got e, then the
// process was killed with kill -9) opens as it is: every confirmed message
// is there, the journal starts empty, new publishes go through it, and a
// clean stop retires it again.
func TestOpensADataDirectoryOfOwnLogs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	copyTree(t, filepath.Join("testdata", "datadir-own-logs"), dir)
	cfg := Config{DataDir: dir, FS: vfs.OS(), DefaultLeaseMs: 10_000}
	b := mustOpen(t, cfg)
	if got := readyTotal(t, b, "orders"); got != 3 {
		t.Fatalf("orders has %d ready, want the 3 not acknowledged", got)
	}
	if got := readyTotal(t, b, "jobs"); got != 1 {
		t.Fatalf("jobs has %d ready, want 1", got)
	}
	mustPublish(t, b, msg("orders", "f"))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if has, err := wal.HasSegments(vfs.OS(), filepath.Join(dir, "wal")); has || err != nil {
		t.Fatalf("a clean stop left the journal (%v, %v)", has, err)
	}
	b = mustOpen(t, cfg)
	defer b.Close()
	if got := readyTotal(t, b, "orders"); got != 4 {
		t.Fatalf("orders has %d ready after a restart, want 4", got)
	}
}
