package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// ErrMountNotPermitted is returned by MountTmpfs when the process may not
// mount file systems (not root, or no CAP_SYS_ADMIN in a container).
var ErrMountNotPermitted = errors.New("harness: mounting tmpfs is not permitted")

// ballastChunkBytes is the write size used to fill a file system.
const ballastChunkBytes = 64 << 10

// MountTmpfs mounts a tmpfs of sizeBytes on dir (created if missing). The
// returned function unmounts it (lazily, so a lingering open file cannot block
// cleanup).
func MountTmpfs(dir string, sizeBytes int64) (unmount func() error, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", sizeBytes)); err != nil {
		if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EACCES) {
			return nil, fmt.Errorf("%w: %v", ErrMountNotPermitted, err)
		}
		return nil, fmt.Errorf("harness: mount tmpfs on %s: %w", dir, err)
	}
	return func() error { return syscall.Unmount(dir, syscall.MNT_DETACH) }, nil
}

// FillDisk writes a ballast file under dir until the file system is full
// (ENOSPC) or bytesMax bytes were written, and returns the file's path and its
// size. Removing the file frees the space again.
func FillDisk(dir string, bytesMax int64) (path string, written int64, err error) {
	path = filepath.Join(dir, "chaos-ballast")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return path, 0, err
	}
	defer f.Close()
	chunk := make([]byte, ballastChunkBytes)
	for written < bytesMax {
		n, werr := f.Write(chunk[:min(int64(len(chunk)), bytesMax-written)])
		written += int64(n)
		if werr != nil {
			if errors.Is(werr, syscall.ENOSPC) {
				return path, written, nil
			}
			return path, written, werr
		}
	}
	return path, written, nil
}

// FreeBytes reports the free bytes of the file system holding dir.
func FreeBytes(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}
