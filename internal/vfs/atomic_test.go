package vfs

import (
	"errors"
	"io/fs"
	"testing"
)

func TestReadFileMax(t *testing.T) {
	fsys := NewMem()
	if err := WriteFileAtomic(fsys, "/f", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if b, err := ReadFileMax(fsys, "/f", 5); err != nil || string(b) != "hello" {
		t.Fatalf("at the bound: %q, %v", b, err)
	}
	if _, err := ReadFileMax(fsys, "/f", 4); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("over the bound: %v, want ErrTooLarge", err)
	}
	if _, err := ReadFileMax(fsys, "/missing", 4); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing: %v, want not-exist", err)
	}
}

func TestWriteFilePrivate(t *testing.T) {
	dir := t.TempDir()
	name := dir + "/secret"
	// A leftover temporary file with a wide mode must not pass it on.
	if err := WriteFileAtomic(OS(), name+".tmp", []byte("old")); err != nil {
		t.Fatal(err)
	}
	if err := WriteFilePrivate(OS(), name, []byte("hash")); err != nil {
		t.Fatal(err)
	}
	fi, err := OS().Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want 0600", fi.Mode().Perm())
	}
	if b, err := ReadFileMax(OS(), name, 16); err != nil || string(b) != "hash" {
		t.Fatalf("read back %q, %v", b, err)
	}
}
