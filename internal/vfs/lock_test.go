package vfs

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

func TestLockExcludesUntilClose(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no flock: OS locks exclude nothing here")
	}
	for _, c := range []struct {
		name string
		fs   FS
		path string
	}{
		{"mem", NewMem(), "LOCK"},
		{"os", OS(), filepath.Join(t.TempDir(), "LOCK")},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := c.fs.Lock(c.path)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write([]byte("42\n")); err != nil {
				t.Fatal(err)
			}
			g, err := c.fs.Lock(c.path)
			if !errors.Is(err, ErrLocked) {
				t.Fatalf("second Lock: file %v, err %v; want ErrLocked", g, err)
			}
			var pe *os.PathError
			if !errors.As(err, &pe) || pe.Path != c.path {
				t.Fatalf("second Lock error %v does not name %s", err, c.path)
			}
			// The loser may still read what the holder wrote.
			r, err := c.fs.OpenFile(c.path, os.O_RDONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 8)
			n, _ := r.ReadAt(buf, 0)
			r.Close()
			if string(buf[:n]) != "42\n" {
				t.Fatalf("lock file reads %q, want %q", buf[:n], "42\n")
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			g, err = c.fs.Lock(c.path)
			if err != nil {
				t.Fatalf("Lock after release: %v", err)
			}
			g.Close()
		})
	}
}

func TestMemLockIsNotInCrashImage(t *testing.T) {
	m := NewMem()
	if _, err := m.Lock("LOCK"); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir("."); err != nil {
		t.Fatal(err)
	}
	c := m.Crash(rand.New(rand.NewPCG(1, 2)), false)
	f, err := c.Lock("LOCK")
	if err != nil {
		t.Fatalf("Lock on the crash image: %v (the crashed holder's lock survived)", err)
	}
	f.Close()
}
