package seglog

import (
	"errors"
	"fmt"
)

var (
	// ErrClosed is returned by operations on a closed log.
	ErrClosed = errors.New("seglog: log closed")
	// ErrNotFound is returned by Read for an LSN outside [FirstLSN, NextLSN).
	ErrNotFound = errors.New("seglog: lsn not in log")
	// ErrRecordTooLarge is returned by Append for payloads over PayloadBytesMax.
	ErrRecordTooLarge = errors.New("seglog: record payload too large")
	// ErrFailed marks the sticky failure state: a write or fsync failed, so
	// the log can no longer tell what is durable and refuses all further
	// writes. Errors wrap both ErrFailed and the underlying cause.
	ErrFailed = errors.New("seglog: log failed after an I/O error")
	// ErrInvalidOptions is wrapped by Open for unusable Options.
	ErrInvalidOptions = errors.New("seglog: invalid options")
)

// CorruptionError reports damage found while verifying the log: a record
// whose bytes do not check out, or a segment that does not continue where
// the previous one ended. It is returned by Open under CorruptionStop.
type CorruptionError struct {
	Segment    string // segment file name (base name)
	FileOffset int64  // offset of the first bad byte range in that file
	LSN        uint64 // LSN the record at FileOffset should have carried
	Reason     string
}

// Error describes where the damage is and why it was judged damage.
func (e *CorruptionError) Error() string {
	return fmt.Sprintf("seglog: corruption in segment %s at offset %d (lsn %d): %s",
		e.Segment, e.FileOffset, e.LSN, e.Reason)
}

// failed wraps an I/O error into the sticky failure error.
func failed(op string, err error) error { return fmt.Errorf("%w: %s: %w", ErrFailed, op, err) }
