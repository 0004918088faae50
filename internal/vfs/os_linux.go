//go:build linux

package vfs

import (
	"os"
	"syscall"
)

// datasync calls fdatasync(2): it flushes data and the metadata required to
// read it back (the size), skipping timestamps, which saves a journal commit
// when the size is unchanged.
func datasync(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = syscall.Fdatasync(int(fd))
			if serr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
	}
	return nil
}

// allocate uses fallocate(2) mode 0, which extends the size and reserves
// blocks. File systems without fallocate fall back to ftruncate.
func allocate(f *os.File, size int64) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() >= size {
		return nil
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		for {
			ferr = syscall.Fallocate(int(fd), 0, 0, size)
			if ferr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	if ferr == syscall.EOPNOTSUPP || ferr == syscall.ENOSYS {
		return f.Truncate(size)
	}
	if ferr != nil {
		return &os.PathError{Op: "fallocate", Path: f.Name(), Err: ferr}
	}
	return nil
}
