//go:build linux

package vfs

import (
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
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

// seekData uses lseek(2) SEEK_DATA: ext4 and xfs skip holes and the
// unwritten extents fallocate reserves (data still only in the page cache
// counts as data). ENXIO means no data at or past off. A file system
// without it answers off itself, which is never wrong.
func seekData(f *os.File, off int64) (int64, bool, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, false, err
	}
	var next int64
	var serr error
	if err := rc.Control(func(fd uintptr) {
		// The file's offset is put back: Write and Read use it.
		cur, err := syscall.Seek(int(fd), 0, io.SeekCurrent)
		if err != nil {
			serr = err
			return
		}
		next, serr = syscall.Seek(int(fd), off, seekDataWhence)
		if _, err := syscall.Seek(int(fd), cur, io.SeekStart); err != nil && serr == nil {
			serr = err
		}
	}); err != nil {
		return 0, false, err
	}
	switch {
	case serr == syscall.ENXIO:
		return 0, false, nil
	case serr == syscall.EINVAL || serr == syscall.EOPNOTSUPP:
		return off, true, nil
	case serr != nil:
		return 0, false, &os.PathError{Op: "lseek SEEK_DATA", Path: f.Name(), Err: serr}
	}
	return next, true, nil
}

// seekDataWhence is SEEK_DATA.
const seekDataWhence = 3

// syncAll calls syncfs(2) on the file system holding dir.
func syncAll(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	rc, err := d.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Syncfs(int(fd)) }); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "syncfs", Path: dir, Err: serr}
	}
	return nil
}

// writeBehind uses sync_file_range(2). It writes dirty pages only: no
// metadata and no device cache flush, so it never stands for a sync. A
// file system without it (or a range it refuses) is left to the next sync.
func writeBehind(f *os.File, off, n int64, wait bool) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	flags := unix.SYNC_FILE_RANGE_WRITE
	if wait {
		flags |= unix.SYNC_FILE_RANGE_WAIT_BEFORE | unix.SYNC_FILE_RANGE_WAIT_AFTER
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = unix.SyncFileRange(int(fd), off, n, flags)
			if serr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	switch serr {
	case nil, syscall.ENOSYS, syscall.EOPNOTSUPP, syscall.EINVAL, syscall.ESPIPE:
		return nil
	}
	return &os.PathError{Op: "sync_file_range", Path: f.Name(), Err: serr}
}
