package seglog

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
)

// TestRotateLetsDropBeforeEmptyTheLog: after Rotate the active segment is
// a new, empty one at NextLSN, so DropBefore(NextLSN) deletes every record
// written; appends then continue in the new segment, and the layout
// survives a crash.
func TestRotateLetsDropBeforeEmptyTheLog(t *testing.T) {
	fs := vfs.NewMem()
	o := Options{FS: fs, Dir: "log", SegmentBytes: 1 << 20}
	l := openT(t, o)
	for i := uint64(1); i <= 100; i++ {
		if _, err := l.Append(1, payloadFor(i, 500)); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Rotate(); err != nil {
		t.Fatal(err)
	}
	if d := l.DurableLSN(); d != 100 {
		t.Fatalf("durable %d after Rotate, want 100", d)
	}
	segs := l.Segments()
	if len(segs) != 2 || segs[1].Base != 101 || segs[1].Bytes != 0 {
		t.Fatalf("segments after Rotate: %+v", segs)
	}
	if err := l.Rotate(); err != nil { // the active segment is empty: nothing to do
		t.Fatal(err)
	}
	if n := len(l.Segments()); n != 2 {
		t.Fatalf("a second Rotate made %d segments", n)
	}
	if n, err := l.DropBefore(l.NextLSN()); err != nil || n != 1 {
		t.Fatalf("DropBefore = %d, %v", n, err)
	}
	if got := fileSize(t, fs, "log", 101); got != segHeaderBytes {
		t.Fatalf("new segment is %d bytes, want just its header", got)
	}
	if lsn, err := l.Commit(1, payloadFor(101, 500)); err != nil || lsn != 101 {
		t.Fatalf("Commit after rotate = %d, %v", lsn, err)
	}
	if r, err := l.Read(101); err != nil || r.LSN != 101 {
		t.Fatalf("Read(101) = %+v, %v", r, err)
	}
	crashed := fs.Crash(rand.New(rand.NewPCG(1, 2)), false)
	_ = l.Close()
	o.FS = crashed
	l = openT(t, o)
	defer l.Close()
	if l.FirstLSN() != 101 || l.NextLSN() != 102 {
		t.Fatalf("after crash first %d next %d, want 101, 102", l.FirstLSN(), l.NextLSN())
	}
}

// TestRotateWithConcurrentAppends: appends racing with Rotate all land,
// densely, on one side of the rotation or the other.
func TestRotateWithConcurrentAppends(t *testing.T) {
	fs := vfs.NewMem()
	o := Options{FS: fs, Dir: "log", SegmentBytes: 64 << 10}
	l := openT(t, o)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				if _, err := l.Commit(uint8(w), payloadFor(uint64(w*1000+i), 100)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for range 20 {
		if err := l.Rotate(); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openT(t, o)
	defer l.Close()
	if rep := l.Report(); rep.Records != 800 || rep.Truncated {
		t.Fatalf("reopen: %+v, want 800 records, no damage", rep)
	}
}
