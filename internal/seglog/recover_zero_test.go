package seglog

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sinewmq/sinew/internal/vfs"
)

// nonZeroEnd on the OS file system, where it skips what the file system
// reports as holes or reserved space: a byte written past a reserved
// (fallocated) range, or past a hole, is still found, and a range of only
// reserved space is all zeros.
func TestNonZeroEndSkipsReservedSpace(t *testing.T) {
	fsys := vfs.OS()
	name := filepath.Join(t.TempDir(), "seg")
	f, err := fsys.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("header and records"), 0); err != nil {
		t.Fatal(err)
	}
	const size = 4 << 20
	if err := vfs.Allocate(f, size); err != nil {
		t.Fatal(err)
	}
	next, ok, err := vfs.NextData(f, 1<<20)
	t.Logf("this file system's SEEK_DATA 1 MiB into the reservation: next %d, data %v, err %v (ext4 and xfs: no data)", next, ok, err)
	if z, err := nonZeroEnd(f, 18, size); err != nil || z != 18 {
		t.Fatalf("reserved tail: nonZeroEnd = %d, %v; want 18", z, err)
	}
	if z, err := nonZeroEnd(f, 0, size); err != nil || z != 18 {
		t.Fatalf("from 0: nonZeroEnd = %d, %v; want 18", z, err)
	}
	// A byte far into the reservation (a torn write that reached it).
	if _, err := f.WriteAt([]byte{7}, 3<<20+5); err != nil {
		t.Fatal(err)
	}
	if z, err := nonZeroEnd(f, 18, size); err != nil || z != 3<<20+6 {
		t.Fatalf("a byte in the reservation: nonZeroEnd = %d, %v; want %d", z, err, 3<<20+6)
	}
	// Past the end of the file through a hole (Truncate grows sparsely).
	if err := f.Truncate(12 << 20); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{9, 0, 0}, 10<<20); err != nil {
		t.Fatal(err)
	}
	if z, err := nonZeroEnd(f, 18, 12<<20); err != nil || z != 10<<20+1 {
		t.Fatalf("a byte past a hole: nonZeroEnd = %d, %v; want %d", z, err, 10<<20+1)
	}
	// The same answers from a file system that cannot tell (MemFS).
	mem := vfs.NewMem()
	mf, err := mem.OpenFile("seg", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mf.WriteAt([]byte{1}, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := mf.WriteAt([]byte{5}, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := mf.Truncate(2 << 20); err != nil {
		t.Fatal(err)
	}
	if z, err := nonZeroEnd(mf, 1, 2<<20); err != nil || z != 1<<20+1 {
		t.Fatalf("MemFS: nonZeroEnd = %d, %v; want %d", z, err, 1<<20+1)
	}
}
