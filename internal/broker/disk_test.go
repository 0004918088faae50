//go:build linux

package broker

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/sinewmq/sinew/internal/wal"
)

// allocatedBytes sums the allocated blocks (st_blocks, not the apparent
// size) of every file and directory under root.
func allocatedBytes(t *testing.T, root string) int64 {
	t.Helper()
	var sum int64
	err := filepath.WalkDir(root, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(path, &st); err != nil {
			return err
		}
		sum += st.Blocks * 512
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return sum
}

// idlePartitionBytesMax is the disk budget of one idle partition holding
// one small message: one reservation step of its active segment (64 KiB),
// its checkpoint, its queue metadata and three directories (a few 4 KiB
// blocks), with room to spare for file systems with larger blocks or
// speculative preallocation (xfs). Before segments were reserved lazily
// each partition held a whole 64 MiB segment.
const idlePartitionBytesMax = 256 << 10

// journalIdleBytesMax is the disk budget of an idle node's journal: its
// active segment and the next one, prepared full of zeros (two segments of
// wal.SegmentBytesDefault), with room for a directory block.
const journalIdleBytesMax = 2*wal.SegmentBytesDefault + 64<<10

// TestIdlePartitionsDiskBudget runs a broker on the real file system with
// 100 queues that each got one message, and checks the blocks allocated
// under the data directory while it runs, after Close and after a restart
// (which must not reserve whole segments again).
func TestIdlePartitionsDiskBudget(t *testing.T) {
	const queues = 100
	dir := t.TempDir()
	cfg := Config{DataDir: filepath.Join(dir, "data")}
	check := func(when string) {
		t.Helper()
		journal := allocatedBytes(t, filepath.Join(cfg.DataDir, "wal"))
		got := allocatedBytes(t, cfg.DataDir) - journal
		t.Logf("%s: %d queues allocate %d KiB, %d KiB per queue; the node journal %d KiB", when, queues, got>>10, got/queues>>10, journal>>10)
		if budget := int64(queues * idlePartitionBytesMax); got > budget {
			t.Fatalf("%s: %d queues allocate %d bytes, budget %d", when, queues, got, budget)
		}
		// The journal is the node's, whatever the queues: its active
		// segment and the one prepared next.
		if journal > journalIdleBytesMax {
			t.Fatalf("%s: the node journal allocates %d bytes, budget %d", when, journal, journalIdleBytesMax)
		}
	}
	b := mustOpen(t, cfg)
	for i := range queues {
		mustPublish(t, b, msg(fmt.Sprintf("idle-%03d", i), "one small message"))
	}
	check("running")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	check("closed")
	b = mustOpen(t, cfg)
	if got := len(b.Stats().Queues); got != queues {
		t.Fatalf("restart found %d queues, want %d", got, queues)
	}
	check("restarted")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
}
