package vfs

import (
	"os"
	"path/filepath"
)

// WriteFileAtomic replaces name with data durably: write a temporary file
// (name + ".tmp"), sync it, rename it over name and sync the directory. After a
// crash, name holds either its old contents or data, never a mix; a leftover
// temporary file is overwritten by the next call.
func WriteFileAtomic(fsys FS, name string, data []byte) error {
	tmp := name + ".tmp"
	f, err := fsys.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
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
