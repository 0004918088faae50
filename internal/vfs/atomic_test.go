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
