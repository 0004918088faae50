package seglog

import (
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
)

// fileSize returns the apparent size of the segment whose first LSN is base.
func fileSize(t *testing.T, fs vfs.FS, dir string, base uint64) int64 {
	t.Helper()
	fi, err := fs.Stat(filepath.Join(dir, SegmentName(base)))
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestReserveGrowsInSteps checks the PreallocReserve layout: an empty
// segment holds nothing, the reservation grows by the segment's own size
// from reserveStepMinBytes up, never past SegmentBytes, is cut at Close and
// is not taken again by a reopen.
func TestReserveGrowsInSteps(t *testing.T) {
	fs := vfs.NewMem()
	o := Options{FS: fs, Dir: "log", SegmentBytes: 1 << 20}
	l := openT(t, o)
	if got := fileSize(t, fs, "log", 1); got != segHeaderBytes {
		t.Fatalf("empty segment is %d bytes, want its header's %d", got, segHeaderBytes)
	}
	payload := make([]byte, 1024-headerBytes) // 1 KiB records after the header
	if _, err := l.Commit(1, payload); err != nil {
		t.Fatal(err)
	}
	if got := fileSize(t, fs, "log", 1); got != reserveStepMinBytes {
		t.Fatalf("after one record: %d bytes, want %d", got, reserveStepMinBytes)
	}
	// Fill past 64 KiB: the next step doubles the reservation to 128 KiB.
	for range 64 {
		if _, err := l.Commit(1, payload); err != nil {
			t.Fatal(err)
		}
	}
	if got := fileSize(t, fs, "log", 1); got != 2*reserveStepMinBytes {
		t.Fatalf("after 65 records: %d bytes, want %d", got, 2*reserveStepMinBytes)
	}
	// Past 512 KiB the step would reach 1 MiB; it stops at SegmentBytes.
	for range 600 {
		if _, err := l.Append(1, payload); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if got := fileSize(t, fs, "log", 1); got != o.SegmentBytes {
		t.Fatalf("after 665 records: %d bytes, want SegmentBytes %d", got, o.SegmentBytes)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	data := int64(segHeaderBytes + 665<<10)
	if got := fileSize(t, fs, "log", 1); got != data {
		t.Fatalf("after Close: %d bytes, want the records' %d", got, data)
	}
	l = openT(t, o)
	if got := fileSize(t, fs, "log", 1); got != data {
		t.Fatalf("after reopen: %d bytes, want %d (no reservation before a write)", got, data)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestReserveRecordLargerThanStep: a record larger than the next step gets
// a reservation that covers it, and not much more.
func TestReserveRecordLargerThanStep(t *testing.T) {
	fs := vfs.NewMem()
	l := openT(t, Options{FS: fs, Dir: "log", SegmentBytes: 64 << 20})
	big := make([]byte, 300<<10)
	if _, err := l.Commit(1, big); err != nil {
		t.Fatal(err)
	}
	// Steps double from 64 KiB until they cover the record: 512 KiB.
	rec := int64(headerBytes + len(big))
	if got := fileSize(t, fs, "log", 1); got < rec || got > 2*rec {
		t.Fatalf("segment is %d bytes, want between the record's %d and twice that", got, rec)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestIdleLogAllocatesKilobytes measures allocated blocks (st_blocks), not
// apparent size, on the real file system: a log holding one small record
// must hold about one reservation step, and a reopen must not reserve a
// whole segment again.
func TestIdleLogAllocatesKilobytes(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("st_blocks layout checked on Linux only")
	}
	dir := t.TempDir()
	o := Options{FS: vfs.OS(), Dir: dir}
	l := openT(t, o)
	if _, err := l.Commit(1, []byte("one small record")); err != nil {
		t.Fatal(err)
	}
	const budget = 2 * reserveStepMinBytes
	if got := allocated(t, dir); got > budget {
		t.Fatalf("open log with one record allocates %d bytes, want <= %d", got, budget)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openT(t, o)
	if got := allocated(t, dir); got > budget {
		t.Fatalf("reopened log allocates %d bytes, want <= %d", got, budget)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// allocated sums st_blocks*512 of the segment files in dir.
func allocated(t *testing.T, dir string) int64 {
	t.Helper()
	names, err := vfs.OS().ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, n := range names {
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(dir, n), &st); err != nil {
			t.Fatal(err)
		}
		sum += st.Blocks * 512
	}
	return sum
}
