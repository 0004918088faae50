// Package ckfile reads and writes Sinew's small checksummed files: the
// users store (internal/auth) and each queue's meta file (internal/broker).
//
// Format: one line of payload (compact JSON, so it holds no newline), then a
// line naming its checksum:
//
//	+----------------------------------------------+
//	| payload (no '\n')                        \n  |  line 1
//	| "crc32c " 8 lowercase hex digits         \n  |  line 2: CRC-32C (Castagnoli) of line 1, without its '\n'
//	+----------------------------------------------+
//
//	{"v":1,"topic":"orders",...}\n
//	crc32c 1a2b3c4d\n
//
// Reading accepts what earlier releases accepted: the second line's '\n' may
// be missing and its hex digits may be upper case or fewer than eight.
// Anything else (no first '\n', no "crc32c " prefix, digits that do not
// parse, a checksum that does not match) is a *CorruptError, which matches
// ErrCorrupt under errors.Is. The payload's own meaning (its JSON, its
// version) is the caller's to check.
//
// Durability: Write and WritePrivate replace the file atomically through
// internal/vfs: the bytes go to name+".tmp", which is fsynced, renamed over
// name, and the directory is fsynced. When they return nil the new contents
// survive a crash; after a crash before that, the file holds either the old
// or the new contents, never a mix. A leftover name+".tmp" is harmless and
// overwritten by the next write.
//
// The package has no goroutines and no state; callers serialise their own
// writes to one file.
package ckfile
