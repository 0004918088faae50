//go:build unix

package vfs

import (
	"os"
	"syscall"
)

// lockFile takes flock(LOCK_EX|LOCK_NB) on f. The lock belongs to the open
// file description: it conflicts with every other open of the file, in this
// process or another, and the kernel drops it when f is closed or the
// process dies (kill -9 included), so a crash never leaves a stale lock.
func lockFile(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var lerr error
	if err := rc.Control(func(fd uintptr) {
		for {
			lerr = syscall.Flock(int(fd), syscall.LOCK_EX|syscall.LOCK_NB)
			if lerr != syscall.EINTR {
				return
			}
		}
	}); err != nil {
		return err
	}
	switch {
	case lerr == syscall.EWOULDBLOCK:
		return &os.PathError{Op: "flock", Path: f.Name(), Err: ErrLocked}
	case lerr != nil:
		return &os.PathError{Op: "flock", Path: f.Name(), Err: lerr}
	}
	return nil
}
