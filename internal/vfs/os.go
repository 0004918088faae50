package vfs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
)

// OS returns the real file system. What it creates is private to the
// broker's user whatever the process umask: every file it creates
// (OpenFile with os.O_CREATE, Lock) is FilePerm and every directory
// (MkdirAll) DirPerm, or narrower when perm asks for less. A file opened
// with os.O_CREATE that exists already is brought to that mode too.
func OS() FS { return osFS{} }

type osFS struct{}

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	mode := perm & FilePerm
	f, err := os.OpenFile(name, flag, mode)
	if err != nil {
		return nil, err
	}
	if flag&os.O_CREATE != 0 {
		if err := chmodOpen(f, mode); err != nil {
			f.Close()
			return nil, err
		}
	}
	return &osFile{File: f}, nil
}

// chmodOpen sets f's permission bits to mode exactly: the umask narrows what
// open(2) creates, and only ever clears bits, so an explicit chmod is what
// makes the mode hold whatever the umask. The fstat first spares the
// chmod on the common path. A file this process just created is its own,
// so the chmod cannot be refused; one that existed and belongs to another
// user (which the broker may still write through its group) keeps its
// mode rather than fail the open: the start-up check reports it.
func chmodOpen(f *os.File, mode os.FileMode) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Mode().Perm() == mode {
		return nil
	}
	if err := f.Chmod(mode); err != nil && !errors.Is(err, fs.ErrPermission) {
		return err
	}
	return nil
}

func (osFS) Remove(name string) error             { return os.Remove(name) }
func (osFS) Rename(oldname, newname string) error { return os.Rename(oldname, newname) }

// MkdirAll is os.MkdirAll, except that each directory it creates is given
// perm & DirPerm exactly, whatever the umask. Directories that exist are
// left as they are (MakePrivate tightens a data dir an older version made).
func (osFS) MkdirAll(dir string, perm os.FileMode) error {
	return mkdirAll(filepath.Clean(dir), perm&DirPerm)
}

func mkdirAll(dir string, mode os.FileMode) error {
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return &os.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirAll(parent, mode); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, mode); err != nil {
		// Created meanwhile by someone else: as os.MkdirAll, that is fine
		// when it is a directory, and its mode is its creator's.
		if fi, serr := os.Lstat(dir); serr == nil && fi.IsDir() {
			return nil
		}
		return err
	}
	return os.Chmod(dir, mode)
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
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, FilePerm)
	if err != nil {
		return nil, err
	}
	if err := chmodOpen(f, FilePerm); err != nil {
		f.Close()
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

func (f *osFile) SeekData(off int64) (int64, bool, error) { return seekData(f.File, off) }

func (f *osFile) WriteBehind(off, n int64, wait bool) error {
	return writeBehind(f.File, off, n, wait)
}

// SyncAll calls syncfs(2) on the file system holding dir (Linux; elsewhere
// errors.ErrUnsupported).
func (osFS) SyncAll(dir string) error { return syncAll(dir) }

// IsOS reports whether fsys is the operating system's file system (OS).
func IsOS(fsys FS) bool {
	_, ok := fsys.(osFS)
	return ok
}
