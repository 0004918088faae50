//go:build !linux

package vfs

import (
	"errors"
	"os"
)

func datasync(f *os.File) error { return f.Sync() }

func allocate(f *os.File, size int64) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() >= size {
		return nil
	}
	return f.Truncate(size)
}

func seekData(f *os.File, off int64) (int64, bool, error) { return off, true, nil }

func syncAll(string) error { return errors.ErrUnsupported }

func writeBehind(f *os.File, off, n int64, wait bool) error { return nil }
