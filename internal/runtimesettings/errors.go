package runtimesettings

import "errors"

var (
	// ErrUnknownKey: a change or a document names a key that is not a runtime
	// setting.
	ErrUnknownKey = errors.New("unknown runtime setting")
	// ErrOutOfRange: a value is outside its key's range.
	ErrOutOfRange = errors.New("runtime setting out of range")
	// ErrVersionConflict: Update was based on a version that is no longer the
	// current one.
	ErrVersionConflict = errors.New("runtime settings version conflict")
	// ErrNoChange: Update was given no values.
	ErrNoChange = errors.New("no runtime settings given")
	// ErrNotCommitted: in a cluster, the change was not seen committed by
	// the controller in time (no leader, or a slow quorum). It may still
	// take effect: read the settings again before retrying.
	ErrNotCommitted = errors.New("runtime settings change not committed by the cluster")
	// ErrCorrupt: the document on disk cannot be trusted.
	ErrCorrupt = errors.New("runtime settings document is corrupt")
)

// KeyError is a bad key or value; it matches ErrUnknownKey or ErrOutOfRange
// with errors.Is.
type KeyError struct {
	Key string
	Err error
	Msg string
}

func (e *KeyError) Error() string { return e.Key + ": " + e.Msg }

// Unwrap returns ErrUnknownKey or ErrOutOfRange.
func (e *KeyError) Unwrap() error { return e.Err }

// ConflictError is returned by Update when the expected version is not the
// current one; it matches ErrVersionConflict and carries the current document
// so the caller can retry from it.
type ConflictError struct {
	Expected uint64
	Current  Doc
}

func (e *ConflictError) Error() string {
	return "runtime settings version conflict: expected version " + u64(e.Expected) + ", current is " + u64(e.Current.Version)
}

// Unwrap returns ErrVersionConflict.
func (e *ConflictError) Unwrap() error { return ErrVersionConflict }
