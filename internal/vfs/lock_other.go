//go:build !unix

package vfs

import "os"

// lockFile does nothing where flock(2) is missing: the file is opened but
// nothing is excluded (see FS.Lock).
func lockFile(*os.File) error { return nil }
