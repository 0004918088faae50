package vfs

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
)

func mustWrite(t *testing.T, fs FS, name string, data []byte, sync bool) File {
	t.Helper()
	f, err := fs.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func readAll(t *testing.T, fs FS, name string) ([]byte, bool) {
	t.Helper()
	f, err := fs.OpenFile(name, os.O_RDONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return b, true
}

func TestMemCrashKeepsOnlySyncedDataAndEntries(t *testing.T) {
	m := NewMem()
	if err := m.MkdirAll("d", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir("."); err != nil {
		t.Fatal(err)
	}
	// a: synced data, synced entry -> survives whole.
	f := mustWrite(t, m, "d/a", []byte("hello"), true)
	// b: synced data but the entry is never synced -> gone.
	if err := m.SyncDir("d"); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, m, "d/b", []byte("lost"), true)
	// a gets an unsynced append -> not in the image.
	if _, err := f.Write([]byte(" world")); err != nil {
		t.Fatal(err)
	}

	c := m.Crash(rand.New(rand.NewPCG(1, 2)), false)
	if got, ok := readAll(t, c, "d/a"); !ok || string(got) != "hello" {
		t.Fatalf("d/a = %q, %v; want synced prefix only", got, ok)
	}
	if _, ok := readAll(t, c, "d/b"); ok {
		t.Fatal("d/b survived without a SyncDir")
	}
	if _, err := f.Write([]byte("x")); !errors.Is(err, ErrCrashed) {
		t.Fatalf("write after crash: %v, want ErrCrashed", err)
	}
	if _, err := m.Stat("d/a"); !errors.Is(err, ErrCrashed) {
		t.Fatalf("stat after crash: %v, want ErrCrashed", err)
	}
}

func TestMemCrashDirectoryNeedsParentSync(t *testing.T) {
	m := NewMem()
	if err := m.MkdirAll("x/y", 0o755); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, m, "x/y/f", []byte("data"), true)
	if err := m.SyncDir("x/y"); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir("x"); err != nil {
		t.Fatal(err)
	}
	// "." was never synced, so x (and everything below it) is lost.
	c := m.Crash(rand.New(rand.NewPCG(1, 1)), false)
	if _, err := c.Stat("x"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("x after crash: %v, want not exist", err)
	}
}

func TestMemCrashRemoveAndRenameNeedSyncDir(t *testing.T) {
	m := NewMem()
	mustWrite(t, m, "old", []byte("v1"), true)
	mustWrite(t, m, "gone", []byte("g"), true)
	if err := m.SyncDir("."); err != nil {
		t.Fatal(err)
	}
	if err := m.Rename("old", "new"); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove("gone"); err != nil {
		t.Fatal(err)
	}
	before := m.Crash(rand.New(rand.NewPCG(3, 3)), false)
	names, err := before.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, []string{"gone", "old"}) {
		t.Fatalf("unsynced rename/remove: entries %v, want [gone old]", names)
	}

	m2 := before
	if err := m2.Rename("old", "new"); err != nil {
		t.Fatal(err)
	}
	if err := m2.Remove("gone"); err != nil {
		t.Fatal(err)
	}
	if err := m2.SyncDir("."); err != nil {
		t.Fatal(err)
	}
	after := m2.Crash(rand.New(rand.NewPCG(3, 3)), false)
	names, err = after.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, []string{"new"}) {
		t.Fatalf("synced rename/remove: entries %v, want [new]", names)
	}
	if got, _ := readAll(t, after, "new"); string(got) != "v1" {
		t.Fatalf("new = %q, want v1", got)
	}
}

func TestMemCrashTearKeepsPrefixOfUnsyncedWrites(t *testing.T) {
	synced := []byte("base:")
	w1 := bytes.Repeat([]byte{'a'}, 64)
	w2 := bytes.Repeat([]byte{'b'}, 64)
	full := slices.Concat(synced, w1, w2)
	seen := map[int]bool{}
	for seed := range uint64(200) {
		m := NewMem()
		f := mustWrite(t, m, "f", synced, true)
		if err := m.SyncDir("."); err != nil {
			t.Fatal(err)
		}
		for _, w := range [][]byte{w1, w2} {
			if _, err := f.Write(w); err != nil {
				t.Fatal(err)
			}
		}
		c := m.Crash(rand.New(rand.NewPCG(seed, 7)), true)
		got, ok := readAll(t, c, "f")
		if !ok {
			t.Fatal("file lost")
		}
		if !bytes.HasPrefix(full, got) || len(got) < len(synced) {
			t.Fatalf("seed %d: image %q is not a prefix of the writes extending the synced data", seed, got)
		}
		seen[len(got)] = true
	}
	if len(seen) < 10 {
		t.Fatalf("tearing produced only %d distinct lengths over 200 seeds", len(seen))
	}
}

func TestMemCrashIsDeterministicPerSeed(t *testing.T) {
	image := func() []byte {
		m := NewMem()
		f := mustWrite(t, m, "f", []byte("s"), true)
		_ = m.SyncDir(".")
		for i := range 20 {
			_, _ = f.Write(bytes.Repeat([]byte{byte('a' + i)}, 10))
		}
		got, _ := readAll(t, m.Crash(rand.New(rand.NewPCG(42, 42)), true), "f")
		return got
	}
	if a, b := image(), image(); !bytes.Equal(a, b) {
		t.Fatalf("same seed, different images: %q vs %q", a, b)
	}
}

func TestMemFaults(t *testing.T) {
	m := NewMem()
	f := mustWrite(t, m, "f", []byte("ok"), true)
	full := errors.New("disk full")
	m.SetWriteError(full)
	if _, err := f.Write([]byte("x")); !errors.Is(err, full) {
		t.Fatalf("write: %v, want disk full", err)
	}
	if err := f.Truncate(0); !errors.Is(err, full) {
		t.Fatalf("truncate: %v, want disk full", err)
	}
	m.SetWriteError(nil)
	if _, err := f.Write([]byte("y")); err != nil {
		t.Fatal(err)
	}
	eio := errors.New("EIO")
	m.SetSyncError(eio)
	if err := f.Sync(); !errors.Is(err, eio) {
		t.Fatalf("sync: %v, want EIO", err)
	}
	if err := m.SyncDir("."); !errors.Is(err, eio) {
		t.Fatalf("syncdir: %v, want EIO", err)
	}
	m.SetSyncError(nil)
	_ = m.SyncDir(".")
	// The failed sync persisted nothing.
	got, _ := readAll(t, m.Crash(rand.New(rand.NewPCG(1, 1)), false), "f")
	if string(got) != "ok" {
		t.Fatalf("after failed sync image = %q, want ok", got)
	}
}

func TestMemCorruptionHelpers(t *testing.T) {
	m := NewMem()
	if err := m.WriteFile("f", []byte{0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	if err := m.FlipBit("f", 2, 3); err != nil {
		t.Fatal(err)
	}
	if err := m.TruncateFile("f", 3); err != nil {
		t.Fatal(err)
	}
	c := m.Crash(rand.New(rand.NewPCG(1, 1)), false)
	got, _ := c.ReadFile("f")
	if !bytes.Equal(got, []byte{0, 0, 8}) {
		t.Fatalf("got % x, want 00 00 08 (durable flip + truncate)", got)
	}
	if err := c.ZeroRange("f", 1, 10); err != nil {
		t.Fatal(err)
	}
	if got, _ := c.ReadFile("f"); !bytes.Equal(got, []byte{0, 0, 0}) {
		t.Fatalf("after ZeroRange % x", got)
	}
	if err := c.FlipBit("f", 99, 0); err == nil {
		t.Fatal("FlipBit past EOF succeeded")
	}
}

func TestMemFileSemantics(t *testing.T) {
	m := NewMem()
	if _, err := m.OpenFile("nodir/f", os.O_CREATE|os.O_RDWR, 0o644); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("create in missing dir: %v", err)
	}
	f := mustWrite(t, m, "f", []byte("abc"), false)
	if _, err := m.OpenFile("f", os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644); !errors.Is(err, os.ErrExist) {
		t.Fatalf("O_EXCL on existing: %v", err)
	}
	if _, err := f.WriteAt([]byte("Z"), 5); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8)
	n, err := f.ReadAt(buf, 0)
	if n != 6 || err != io.EOF || !bytes.Equal(buf[:6], []byte("abc\x00\x00Z")) {
		t.Fatalf("ReadAt = %d, %v, % x", n, err, buf[:n])
	}
	if err := Allocate(f, 10); err != nil {
		t.Fatal(err)
	}
	if fi, _ := f.Stat(); fi.Size() != 10 {
		t.Fatalf("size after Allocate = %d", fi.Size())
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Read(buf); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("read after close: %v", err)
	}
	if err := m.MkdirAll("a/b", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove("a"); err == nil {
		t.Fatal("removed a non-empty directory")
	}
	names, _ := m.ReadDir(".")
	if !slices.Equal(names, []string{"a", "f"}) {
		t.Fatalf("ReadDir = %v", names)
	}
}

// TestOSFS exercises the real implementation in a temporary directory.
func TestOSFS(t *testing.T) {
	fs := OS()
	dir := t.TempDir()
	name := dir + "/f"
	f := mustWrite(t, fs, name, []byte("hello"), true)
	if err := Allocate(f, 4096); err != nil {
		t.Fatal(err)
	}
	if fi, err := f.Stat(); err != nil || fi.Size() != 4096 {
		t.Fatalf("after Allocate: %v, %v", fi, err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := fs.SyncDir(dir); err != nil {
		t.Fatal(err)
	}
	if err := fs.Rename(name, dir+"/g"); err != nil {
		t.Fatal(err)
	}
	names, err := fs.ReadDir(dir)
	if err != nil || !slices.Equal(names, []string{"g"}) {
		t.Fatalf("ReadDir = %v, %v", names, err)
	}
	if err := fs.Remove(dir + "/g"); err != nil {
		t.Fatal(err)
	}
}

func TestMemConcurrentUse(t *testing.T) {
	m := NewMem()
	f := mustWrite(t, m, "f", nil, false)
	done := make(chan struct{})
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 100 {
				_, _ = f.WriteAt([]byte{byte(g)}, int64(g*100+i))
				_ = f.Sync()
				_, _ = m.ReadDir(".")
			}
		}()
	}
	for range 4 {
		<-done
	}
	if fi, _ := f.Stat(); fi.Size() != 400 {
		t.Fatalf("size = %d, want 400", fi.Size())
	}
}

// SyncAll makes every file's data and every directory's entries durable,
// as a sync of each would: all of it survives a crash.
func TestMemSyncAll(t *testing.T) {
	m := NewMem()
	if err := m.MkdirAll("a/b", DirPerm); err != nil {
		t.Fatal(err)
	}
	f, err := m.OpenFile("a/b/f", os.O_RDWR|os.O_CREATE, FilePerm)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("unsynced"), 0); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove("a/b/f"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.OpenFile("a/g", os.O_RDWR|os.O_CREATE, FilePerm); err != nil {
		t.Fatal(err)
	}
	if ok, err := SyncAll(m, "a"); !ok || err != nil {
		t.Fatalf("SyncAll = %v, %v", ok, err)
	}
	c := m.Crash(rand.New(rand.NewPCG(1, 2)), true)
	if _, err := c.Stat("a/b/f"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a file removed before SyncAll is back after a crash: %v", err)
	}
	if _, err := c.Stat("a/g"); err != nil {
		t.Fatalf("a file created before SyncAll is lost in a crash: %v", err)
	}
	// And data written before SyncAll survives.
	m2 := NewMem()
	f2, err := m2.OpenFile("x", os.O_RDWR|os.O_CREATE, FilePerm)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f2.WriteAt([]byte("kept"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := SyncAll(m2, "."); err != nil {
		t.Fatal(err)
	}
	c2 := m2.Crash(rand.New(rand.NewPCG(3, 4)), true)
	g, err := c2.OpenFile("x", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if n, _ := g.ReadAt(buf, 0); n != 4 || string(buf) != "kept" {
		t.Fatalf("after SyncAll and a crash the file holds %q", buf[:n])
	}
}
