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

// TestScanRange: ScanRange visits exactly [from, upto] (clamped to the
// log's end) and writes no more of the buffer than it needs.
func TestScanRange(t *testing.T) {
	fs := vfs.NewMem()
	l := openT(t, memOpts(fs))
	defer l.Close()
	for i := uint64(1); i <= 50; i++ {
		if _, err := l.Append(uint8(i), payloadFor(i, int(i*7%300))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	for i := uint64(51); i <= 60; i++ {
		if _, err := l.Append(uint8(i), payloadFor(i, 10)); err != nil {
			t.Fatal(err)
		}
	}
	var got []uint64
	err := l.ScanRange(20, 35, func(r Record) error {
		if !bytes.Equal(r.Payload, payloadFor(r.LSN, int(r.LSN*7%300))) {
			t.Errorf("lsn %d: wrong payload", r.LSN)
		}
		got = append(got, r.LSN)
		return nil
	})
	if err != nil || len(got) != 16 || got[0] != 20 || got[15] != 35 {
		t.Fatalf("ScanRange(20, 35) = %v, %v", got, err)
	}
	l.mu.Lock()
	written := l.writtenLSN
	l.mu.Unlock()
	if written != 50 {
		t.Fatalf("ScanRange of synced records pushed the buffer: written %d, want 50", written)
	}
	got = got[:0]
	if err := l.ScanRange(58, 1000, func(r Record) error { got = append(got, r.LSN); return nil }); err != nil || len(got) != 3 {
		t.Fatalf("ScanRange(58, 1000) = %v, %v; want 58..60", got, err)
	}
}
