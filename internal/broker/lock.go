package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/sinewmq/sinew/internal/vfs"
)

// lockFileName is the data dir's lock file. It holds the pid of the process
// holding the lock, as decimal text and a newline, for the error a second
// broker reports. The lock itself is the flock on the open file (vfs.FS.Lock),
// not the file's existence: a broker killed with -9 leaves the file behind,
// unlocked, and the next broker takes it over.
const lockFileName = "LOCK"

// lockPIDBytesMax bounds how much of a lock file is read for the holder's pid.
const lockPIDBytesMax = 32

// DataDirLock is an exclusive lock on a data dir: while one is held, no
// other broker, in this process or another, can lock or open the same dir.
// Take it with LockDataDir; Open takes one itself unless Config.Lock
// carries it in.
type DataDirLock struct {
	f   vfs.File
	dir string
}

// DataDirLockedError reports that another holder has the data dir's lock.
// It matches vfs.ErrLocked with errors.Is.
type DataDirLockedError struct {
	// Dir is the data dir.
	Dir string
	// PID is the holder's process id as its lock file records it; 0 when
	// the file holds none yet (the holder is between locking and writing).
	PID int
}

func (e *DataDirLockedError) Error() string {
	who := "another process"
	switch {
	case e.PID == os.Getpid():
		who = fmt.Sprintf("another broker in this process (pid %d)", e.PID)
	case e.PID > 0:
		who = fmt.Sprintf("another process (pid %d)", e.PID)
	}
	return fmt.Sprintf("data dir %s is locked by %s; stop it or use another data dir", e.Dir, who)
}

// Unwrap makes the error match vfs.ErrLocked.
func (e *DataDirLockedError) Unwrap() error { return vfs.ErrLocked }

// LockDataDir creates dir if needed and takes its exclusive lock, before
// anything in it is read. It fails at once, with a *DataDirLockedError, if
// another holder has the lock. The lock lasts until Release, or until the
// process ends.
func LockDataDir(fsys vfs.FS, dir string) (*DataDirLock, error) {
	if fsys == nil {
		fsys = vfs.OS()
	}
	if err := fsys.MkdirAll(dir, vfs.DirPerm); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	name := filepath.Join(dir, lockFileName)
	f, err := fsys.Lock(name)
	if errors.Is(err, vfs.ErrLocked) {
		return nil, &DataDirLockedError{Dir: dir, PID: readLockPID(fsys, name)}
	}
	if err != nil {
		return nil, fmt.Errorf("data dir lock: %w", err)
	}
	// The pid is advisory (it only names the holder in errors), so it is
	// not synced, and failing to write it (a full disk) does not fail the
	// lock: the flock is what excludes, and a loser then reports no pid.
	pid := []byte(strconv.Itoa(os.Getpid()) + "\n")
	if err := f.Truncate(0); err == nil {
		f.WriteAt(pid, 0)
	}
	return &DataDirLock{f: f, dir: dir}, nil
}

// readLockPID returns the pid recorded in a lock file, or 0.
func readLockPID(fsys vfs.FS, name string) int {
	f, err := fsys.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return 0
	}
	defer f.Close()
	buf := make([]byte, lockPIDBytesMax)
	n, _ := f.ReadAt(buf, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// Dir returns the locked data dir.
func (l *DataDirLock) Dir() string { return l.dir }

// Release gives the lock up. It is safe to call more than once.
func (l *DataDirLock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	f := l.f
	l.f = nil
	return f.Close()
}
