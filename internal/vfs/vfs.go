package vfs

import (
	"errors"
	"io"
	"os"
)

// ErrLocked is returned (wrapped in an *os.PathError) by FS.Lock when another
// holder has the lock.
var ErrLocked = errors.New("locked by another holder")

// FS is the set of file-system operations Sinew needs. Names are paths in
// the host's syntax; implementations clean them.
type FS interface {
	// OpenFile opens name with os.O_* flags, like os.OpenFile.
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	// Remove deletes a file or an empty directory. The removal becomes
	// durable only after SyncDir of the parent directory.
	Remove(name string) error
	// Rename atomically replaces newname with oldname. Durable only after
	// SyncDir of both parent directories.
	Rename(oldname, newname string) error
	// MkdirAll creates dir and any missing parents. New directories become
	// durable only after SyncDir of their parents.
	MkdirAll(dir string, perm os.FileMode) error
	// ReadDir returns the sorted base names of the entries in dir.
	ReadDir(dir string) ([]string, error)
	// Stat describes name.
	Stat(name string) (os.FileInfo, error)
	// SyncDir makes the entries of dir durable (fsync on the directory).
	SyncDir(dir string) error
	// Lock opens name for reading and writing, creating it if missing, and
	// takes an exclusive lock on it without waiting: if another holder has
	// it, Lock fails at once with an error matching ErrLocked. Closing the
	// returned file releases the lock; so does the end of the process.
	//
	// OS files use flock(2) on unix systems, so the lock excludes other
	// processes and other opens in this one; elsewhere Lock only opens
	// the file and excludes nothing. MemFS keeps the lock in memory: it
	// excludes other Lock calls on the same MemFS, and a crashed image
	// starts with no locks held, as a rebooted machine would.
	Lock(name string) (File, error)
}

// File is an open file.
type File interface {
	io.Reader
	io.ReaderAt
	io.Writer
	io.WriterAt
	io.Closer
	// Sync makes the file's data durable (fdatasync on Linux for OS files).
	Sync() error
	// Truncate changes the file's size; growing fills with zeros.
	Truncate(size int64) error
	// Stat describes the open file.
	Stat() (os.FileInfo, error)
	// Name returns the name the file was opened with.
	Name() string
}

// Allocator is implemented by files that can reserve space up front. Growing
// a file with Allocate (rather than by appending) means later writes inside
// the allocated range do not change the file's size, so a data sync need not
// also commit a size change.
type Allocator interface {
	// Allocate makes the file at least size bytes long, reserving blocks
	// for the new range, which reads as zeros.
	Allocate(size int64) error
}

// WriteBehinder is implemented by files that can start writing a range of
// their dirty pages to the device ahead of a sync. It is pacing, never
// durability: a range written behind still needs Sync to survive a crash.
// A file written in large batches and synced rarely (a partition's store
// under the node journal, a journal segment being prepared) writes behind
// as it goes, so its Sync is short and the disk never takes megabytes at
// once while the journal waits for a small fsync.
type WriteBehinder interface {
	// WriteBehind starts writeback of [off, off+n). With wait, it first
	// waits for writeback already under way in that range to finish, and
	// returns once the range has reached the device.
	WriteBehind(off, n int64, wait bool) error
}

// WriteBehind calls f's WriteBehind when f has one and does nothing
// otherwise.
func WriteBehind(f File, off, n int64, wait bool) error {
	if w, ok := f.(WriteBehinder); ok {
		return w.WriteBehind(off, n, wait)
	}
	return nil
}

// AllSyncer is implemented by file systems that can make everything
// written to them durable at once (syncfs(2)).
type AllSyncer interface {
	// SyncAll makes every file and directory of the file system that
	// holds dir durable, as a sync of each would.
	SyncAll(dir string) error
}

// SyncAll makes everything written to the file system that holds dir
// durable at once, and reports false when fsys cannot (then nothing was
// done, and each file and directory must be synced on its own).
func SyncAll(fsys FS, dir string) (bool, error) {
	a, ok := fsys.(AllSyncer)
	if !ok {
		return false, nil
	}
	if err := a.SyncAll(dir); err != nil {
		if errors.Is(err, errors.ErrUnsupported) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// DataSeeker is implemented by files that can tell where their data lies:
// the ranges before it are holes (or space reserved and never written),
// which read as zeros.
type DataSeeker interface {
	// SeekData returns the first offset at or after off that may hold
	// data, and ok false when nothing past off does.
	SeekData(off int64) (next int64, ok bool, err error)
}

// NextData returns the first offset at or after off of f that may hold
// data (off itself when f cannot tell), and ok false when f knows that
// nothing past off does: every byte from off to its size reads as zero.
func NextData(f File, off int64) (next int64, ok bool, err error) {
	if d, is := f.(DataSeeker); is {
		return d.SeekData(off)
	}
	return off, true, nil
}

// Allocate grows f to size bytes with Allocator when f supports it and with
// Truncate otherwise. It never shrinks f.
func Allocate(f File, size int64) error {
	if a, ok := f.(Allocator); ok {
		return a.Allocate(size)
	}
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() >= size {
		return nil
	}
	return f.Truncate(size)
}
