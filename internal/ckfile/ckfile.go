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
