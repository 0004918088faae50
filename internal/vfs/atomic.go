package vfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// WriteFileAtomic replaces name with data durably: write a temporary file
// (name + ".tmp"), sync it, rename it over name and sync the directory. After a
// crash, name holds either its old contents or data, never a mix; a leftover
// temporary file is overwritten by the next call.
func WriteFileAtomic(fsys FS, name string, data []byte) error {
	return writeFileAtomic(fsys, name, data, FilePerm)
}

// WriteFilePrivate is WriteFileAtomic for secrets (such as password hashes):
// the file is created readable and writable by its owner only (0600). A
// leftover temporary file is removed first, because reopening it would keep
// whatever mode it had.
func WriteFilePrivate(fsys FS, name string, data []byte) error {
	if err := fsys.Remove(name + ".tmp"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return writeFileAtomic(fsys, name, data, FilePerm)
}

func writeFileAtomic(fsys FS, name string, data []byte, perm os.FileMode) error {
	tmp := name + ".tmp"
	f, err := fsys.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := fsys.Rename(tmp, name); err != nil {
		return err
	}
	return fsys.SyncDir(filepath.Dir(name))
}

// ErrTooLarge is wrapped by ReadFileMax when a file holds more than the
// caller's bound.
var ErrTooLarge = errors.New("file larger than its bound")

// ReadFileMax returns the whole of name, reading at most max+1 bytes: a file
// larger than max is an error wrapping ErrTooLarge, so a damaged or hostile
// file never makes the caller allocate more than its bound. A missing file is
// the FS's not-exist error.
func ReadFileMax(fsys FS, name string, max int) ([]byte, error) {
	f, err := fsys.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// Size the buffer from Stat so a large checkpoint is read in place, not
	// through repeated growth; the limited read still bounds a file that
	// grows meanwhile.
	size := 512
	if fi, err := f.Stat(); err == nil {
		if fi.Size() > int64(max) {
			return nil, fmt.Errorf("%s: %w (%d bytes)", name, ErrTooLarge, max)
		}
		size = int(fi.Size()) + 1
	}
	data := make([]byte, 0, size)
	r := io.LimitReader(f, int64(max)+1)
	for {
		if len(data) == cap(data) {
			data = append(data, 0)[:len(data)]
		}
		n, err := r.Read(data[len(data):cap(data)])
		data = data[:len(data)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if len(data) > max {
		return nil, fmt.Errorf("%s: %w (%d bytes)", name, ErrTooLarge, max)
	}
	return data, nil
}
