package vfs

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// WriteBehind on a real file starts writeback and leaves the data as
// written; with wait it returns once the range is out.
func TestWriteBehindOnOSFile(t *testing.T) {
	fsys := OS()
	name := filepath.Join(t.TempDir(), "f")
	f, err := fsys.OpenFile(name, os.O_RDWR|os.O_CREATE, FilePerm)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, ok := f.(WriteBehinder); !ok {
		t.Fatal("an OS file is not a WriteBehinder")
	}
	data := bytes.Repeat([]byte("sinew"), 1<<16)
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := WriteBehind(f, 0, int64(len(data)), false); err != nil {
		t.Fatalf("WriteBehind: %v", err)
	}
	if err := WriteBehind(f, 0, int64(len(data)), true); err != nil {
		t.Fatalf("WriteBehind with wait: %v", err)
	}
	got := make([]byte, len(data))
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back after WriteBehind: %v, equal %v", err, bytes.Equal(got, data))
	}
}

// WriteBehind is pacing, never durability: on MemFS a range written behind
// and never synced is not in the crash image.
func TestWriteBehindIsNotASync(t *testing.T) {
	m := NewMem()
	f := mustWrite(t, m, "a", []byte("synced"), true)
	if err := m.SyncDir("."); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(" and behind"), 6); err != nil {
		t.Fatal(err)
	}
	if err := WriteBehind(f, 0, 17, true); err != nil {
		t.Fatal(err)
	}
	c := m.Crash(rand.New(rand.NewPCG(1, 2)), false)
	if got, ok := readAll(t, c, "a"); !ok || string(got) != "synced" {
		t.Fatalf("a = %q, %v; want only the synced bytes", got, ok)
	}
}
