package vfs

import (
	"os"
	"path/filepath"
	"slices"
)

// OS returns the real file system.
func OS() FS { return osFS{} }

type osFS struct{}

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &osFile{File: f}, nil
}

func (osFS) Remove(name string) error             { return os.Remove(name) }
func (osFS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }
func (osFS) MkdirAll(dir string, perm os.FileMode) error {
	return os.MkdirAll(dir, perm)
}
func (osFS) Stat(name string) (os.FileInfo, error) { return os.Stat(name) }

func (osFS) ReadDir(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	slices.Sort(names) // os.ReadDir sorts already; keep the contract explicit.
	return names, nil
}

func (osFS) SyncDir(dir string) error {
	d, err := os.Open(filepath.Clean(dir))
	if err != nil {
		return err
	}
	serr := d.Sync() // a directory needs a full fsync: its entries are metadata.
	cerr := d.Close()
	if serr != nil {
		return serr
	}
	return cerr
}

func (osFS) Lock(name string) (File, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := lockFile(f); err != nil {
		f.Close()
		return nil, err
	}
	return &osFile{File: f}, nil
}

// osFile adds data-only sync and preallocation to *os.File.
type osFile struct {
	*os.File
}

func (f *osFile) Sync() error { return datasync(f.File) }

func (f *osFile) Allocate(size int64) error { return allocate(f.File, size) }
