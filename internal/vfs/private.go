package vfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
)

// The modes of what the broker stores. Messages, session state, settings,
// identities and password hashes are nobody else's business on a shared
// machine, so every file the broker creates under its data dir is readable
// and writable by the broker's user only, and every directory is usable by
// that user only. OS applies them whatever the umask.
const (
	// FilePerm is the mode of every file the broker creates.
	FilePerm os.FileMode = 0o600
	// DirPerm is the mode of every directory the broker creates.
	DirPerm os.FileMode = 0o700
)

// MakePrivate brings, on the real file system, the directory root itself
// and each of its entries named in entries, with everything under them, to
// the broker's modes: it clears group and other bits (the owner's bits are
// the owner's), so directories end at most DirPerm and files at most
// FilePerm. Entries that do not exist are skipped; symbolic links and
// other special files are left alone and not followed. Only the named
// entries are walked, so a data dir pointed at a directory that holds
// other things (a home directory) has only the broker's files changed.
// It returns the paths it changed, for the caller to report: a data dir an
// older version created under a umask of 022 holds world-readable
// messages. A path it cannot change (another owner) is an error naming it,
// after the rest were done.
func MakePrivate(root string, entries []string) (changed []string, err error) {
	if runtime.GOOS == "windows" {
		return nil, nil // permission bits do not describe access there
	}
	var errs []error
	tighten := func(path string, fi fs.FileInfo) {
		perm := fi.Mode().Perm()
		if perm&0o077 == 0 {
			return
		}
		if err := os.Chmod(path, perm&^0o077); err != nil {
			errs = append(errs, err)
			return
		}
		changed = append(changed, path)
	}
	fi, err := os.Lstat(root)
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		tighten(root, fi)
	}
	for _, e := range entries {
		walkPrivate(filepath.Join(root, e), tighten, &errs)
	}
	return changed, errors.Join(errs...)
}

// walkPrivate calls tighten on every directory and regular file at or under
// top, collecting the errors of the walk in errs.
func walkPrivate(top string, tighten func(string, fs.FileInfo), errs *[]error) {
	werr := filepath.WalkDir(top, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // an entry this version does not have, or removed meanwhile
			}
			*errs = append(*errs, err)
			if d != nil && d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) { // removed meanwhile
				*errs = append(*errs, err)
			}
			return nil
		}
		tighten(path, fi)
		return nil
	})
	if werr != nil && !errors.Is(werr, fs.ErrNotExist) {
		*errs = append(*errs, werr)
	}
}

// ErrNotPrivate is wrapped by CheckPrivate's error for a secret that users
// other than its owner may read.
var ErrNotPrivate = errors.New("readable by group or others")

// CheckPrivate returns an error wrapping ErrNotPrivate when name, a secret
// the broker reads (a private key, a gossip key), grants any permission to
// group or others: anyone who can read it can impersonate the broker or
// join its cluster, so the broker refuses it rather than start with it.
// The error gives the mode and the fix, naming the file in the fix; the
// caller prefixes the setting that names it. Other failures (a
// missing file) are the FS's, for the caller's usual read error to report.
// On Windows, where permission bits do not describe access, it checks
// nothing.
func CheckPrivate(fsys FS, name string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	fi, err := fsys.Stat(name)
	if err != nil {
		return err
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("%w (mode %04o): run chmod 600 %s", ErrNotPrivate, perm, name)
	}
	return nil
}
