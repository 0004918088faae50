package seglog

import (
	"bytes"
	"path/filepath"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
)

// TestFlushWritesWithoutSync: Flush puts appended records in the segment
// file (what a process crash leaves behind) but does not fdatasync them.
func TestFlushWritesWithoutSync(t *testing.T) {
	fs := vfs.NewMem()
	o := memOpts(fs)
	o.Sync = SyncInterval
	o.NewTicker = func(time.Duration) (<-chan time.Time, func()) { return nil, func() {} }
	l := openT(t, o)
	defer l.Close()
	lsn, err := l.Append(7, []byte("flushed payload"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := l.Flush()
	if err != nil || w != lsn {
		t.Fatalf("Flush = %d, %v; want %d", w, err, lsn)
	}
	if d := l.DurableLSN(); d >= lsn {
		t.Fatalf("durable %d after Flush alone", d)
	}
	b, err := fs.ReadFile(filepath.Join("log", SegmentName(1)))
	if err != nil || !bytes.Contains(b, []byte("flushed payload")) {
		t.Fatalf("segment file after Flush lacks the record (%v)", err)
	}
}
