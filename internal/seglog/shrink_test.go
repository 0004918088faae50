package seglog

import (
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
)

// TestShrinkBuffersAfterBurst: a burst buffered without a write grows the
// append buffer to megabytes; once it is written and the log is idle,
// ShrinkBuffers lets both buffers go, and appends still work afterwards.
func TestShrinkBuffersAfterBurst(t *testing.T) {
	o := memOpts(vfs.NewMem())
	o.Sync = SyncInterval
	o.NewTicker = func(time.Duration) (<-chan time.Time, func()) { return nil, func() {} }
	l := openT(t, o)
	defer l.Close()
	payload := make([]byte, 1024)
	for range 1500 { // 1.5 MiB: below BufferBytes/2, so nothing is written yet
		if _, err := l.Append(7, payload); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	grown := max(cap(l.buf), cap(l.spare))
	l.mu.Unlock()
	if grown < 1<<20 {
		t.Fatalf("the burst grew the buffers to %d bytes only", grown)
	}
	l.ShrinkBuffers()
	l.mu.Lock()
	kept := cap(l.buf) + cap(l.spare)
	l.mu.Unlock()
	if kept > 2*bufferKeepBytes {
		t.Fatalf("after ShrinkBuffers the log keeps %d bytes of buffers", kept)
	}
	lsn, err := l.Append(7, []byte("after"))
	if err != nil {
		t.Fatal(err)
	}
	if w, err := l.Flush(); err != nil || w != lsn {
		t.Fatalf("Flush = %d, %v; want %d", w, err, lsn)
	}
}
