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

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"

	"github.com/sinewmq/sinew/internal/vfs"
)

// ErrCorrupt is matched (errors.Is) by every error that reports a file or
// buffer that is not a well-formed checksummed file.
var ErrCorrupt = errors.New("checksummed file corrupt")

// CorruptError says why bytes failed verification.
type CorruptError struct {
	// Name is the file read ("" when Decode was given a buffer).
	Name string
	// Reason is what failed: "no checksum line", "malformed checksum
	// line", "malformed checksum: ...", "checksum mismatch".
	Reason string
}

func (e *CorruptError) Error() string {
	if e.Name == "" {
		return e.Reason
	}
	return e.Name + ": " + e.Reason
}

// Is makes a *CorruptError match ErrCorrupt.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

const sumPrefix = "crc32c "

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Encode frames payload. payload must not contain '\n' (compact JSON never
// does); Encode panics if it does, since that is a bug in the caller.
func Encode(payload []byte) []byte {
	if bytes.IndexByte(payload, '\n') >= 0 {
		panic("ckfile: payload holds a newline")
	}
	out := make([]byte, 0, len(payload)+len(sumPrefix)+10)
	out = append(out, payload...)
	out = append(out, '\n')
	out = append(out, sumPrefix...)
	out = fmt.Appendf(out, "%08x", crc32.Checksum(payload, castagnoli))
	return append(out, '\n')
}

// Decode verifies b and returns its payload (a sub-slice of b).
func Decode(b []byte) ([]byte, error) {
	payload, rest, ok := bytes.Cut(b, []byte{'\n'})
	if !ok {
		return nil, &CorruptError{Reason: "no checksum line"}
	}
	sum, ok := bytes.CutPrefix(bytes.TrimSuffix(rest, []byte{'\n'}), []byte(sumPrefix))
	if !ok {
		return nil, &CorruptError{Reason: "malformed checksum line"}
	}
	want, err := strconv.ParseUint(string(sum), 16, 32)
	if err != nil {
		return nil, &CorruptError{Reason: "malformed checksum: " + err.Error()}
	}
	if crc32.Checksum(payload, castagnoli) != uint32(want) {
		return nil, &CorruptError{Reason: "checksum mismatch"}
	}
	return payload, nil
}

// Read reads name (at most maxBytes; a larger file is an error wrapping
// vfs.ErrTooLarge) and returns its verified payload. A missing file is the
// FS's not-exist error; a file that fails verification is a *CorruptError
// naming it.
func Read(fsys vfs.FS, name string, maxBytes int) ([]byte, error) {
	b, err := vfs.ReadFileMax(fsys, name, maxBytes)
	if err != nil {
		return nil, err
	}
	payload, err := Decode(b)
	if err != nil {
		ce := err.(*CorruptError)
		ce.Name = name
		return nil, ce
	}
	return payload, nil
}

// Write replaces name atomically with payload framed by Encode (mode
// vfs.FilePerm). The directory must exist.
func Write(fsys vfs.FS, name string, payload []byte) error {
	return vfs.WriteFileAtomic(fsys, name, Encode(payload))
}

// WritePrivate is Write for files that hold secrets (password hashes): the
// file is readable and writable by its owner only (vfs.WriteFilePrivate).
func WritePrivate(fsys vfs.FS, name string, payload []byte) error {
	return vfs.WriteFilePrivate(fsys, name, Encode(payload))
}
