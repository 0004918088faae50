package protocol

import (
	"errors"
	"fmt"
)

// Code is a stable numeric error code carried in ERROR frames and settle results.
// Codes are never renumbered or reused; new codes are appended to the table.
type Code uint16

// The error-code table. Every wire code, its name and whether a client may retry
// the same request come from here; docs/protocol.md lists the same table and a test
// keeps the two in step.
const (
	CodeOK                Code = 0
	CodeBadFrame          Code = 1  // the frame or one of its fields could not be parsed
	CodeFrameTooLarge     Code = 2  // the frame exceeds the announced frame limit
	CodeUnsupportedVer    Code = 3  // no protocol version in common
	CodeUnknownOp         Code = 4  // the op code is not defined, or not valid in this direction
	CodeHandshakeRequired Code = 5  // the first frame was not HELLO, or HELLO was sent twice
	CodeHandshakeTimeout  Code = 6  // HELLO did not arrive in time
	CodeAuthFailed        Code = 7  // credentials were missing or wrong
	CodeBadRequest        Code = 8  // a field has an invalid value (empty topic, bad partition ...)
	CodeNotFound          Code = 9  // no such queue, partition or subscription
	CodeMessageTooLarge   Code = 10 // a message body or header set exceeds the limit
	CodeTooManyConns      Code = 11 // the connection limit is reached
	CodeStaleLease        Code = 12 // the delivery tag's lease is no longer current
	CodeUnknownTag        Code = 13 // the delivery tag was never issued on this session
	CodeInternal          Code = 14 // the broker failed; the request may or may not have taken effect
	CodeUnavailable       Code = 15 // the partition is quarantined or not served here
	CodeShuttingDown      Code = 16 // the broker is draining and accepts no new work
	CodeHeartbeatTimeout  Code = 17 // nothing arrived within the heartbeat timeout
	CodeResourceExhausted Code = 18 // a bounded queue is full; back off and retry
	CodeConflict          Code = 19 // a declaration contradicts the existing queue
	CodeLimitExceeded     Code = 20 // a requested value is above the announced limit
	CodeSlowConsumer      Code = 21 // the connection did not read what it was sent in time
	CodeSequenceTooOld    Code = 22 // the producer sequence is below the broker's deduplication window
	CodePermissionDenied  Code = 23 // the connection's principal may not do this to this topic
	CodeNotOwner          Code = 24 // another node owns the partition; Error.Owner says where it is reached
	CodeFenced            Code = 25 // this node may not serve the partition now (it lost its lead, or is cut off from its cluster); nothing took effect
	CodeOutOfSequence     Code = 26 // the publish named by producer_prev is not stored in the partition yet; nothing was stored, send it again after that one
)

type codeInfo struct {
	name      string
	retryable bool
}

var codeTable = map[Code]codeInfo{
	CodeOK:                {"ok", false},
	CodeBadFrame:          {"bad_frame", false},
	CodeFrameTooLarge:     {"frame_too_large", false},
	CodeUnsupportedVer:    {"unsupported_version", false},
	CodeUnknownOp:         {"unknown_op", false},
	CodeHandshakeRequired: {"handshake_required", false},
	CodeHandshakeTimeout:  {"handshake_timeout", true},
	CodeAuthFailed:        {"auth_failed", false},
	CodeBadRequest:        {"bad_request", false},
	CodeNotFound:          {"not_found", false},
	CodeMessageTooLarge:   {"message_too_large", false},
	CodeTooManyConns:      {"too_many_connections", true},
	CodeStaleLease:        {"stale_lease", false},
	CodeUnknownTag:        {"unknown_tag", false},
	CodeInternal:          {"internal", true},
	CodeUnavailable:       {"unavailable", true},
	CodeShuttingDown:      {"shutting_down", true},
	CodeHeartbeatTimeout:  {"heartbeat_timeout", true},
	CodeResourceExhausted: {"resource_exhausted", true},
	CodeConflict:          {"conflict", false},
	CodeLimitExceeded:     {"limit_exceeded", false},
	CodeSlowConsumer:      {"slow_consumer", true},
	CodeSequenceTooOld:    {"sequence_too_old", false},
	CodePermissionDenied:  {"permission_denied", false},
	CodeNotOwner:          {"not_owner", true},
	CodeFenced:            {"fenced", true},
	CodeOutOfSequence:     {"out_of_sequence", true},
}

// Codes returns every defined code in ascending order.
func Codes() []Code {
	out := make([]Code, 0, len(codeTable))
	for c := Code(0); int(c) < 1<<16; c++ {
		if _, ok := codeTable[c]; ok {
			out = append(out, c)
		}
		if len(out) == len(codeTable) {
			break
		}
	}
	return out
}

// String returns the code's stable name, such as "stale_lease".
func (c Code) String() string {
	if info, ok := codeTable[c]; ok {
		return info.name
	}
	return fmt.Sprintf("code_%d", uint16(c))
}

// Retryable reports whether the same request may succeed if sent again later.
func (c Code) Retryable() bool { return codeTable[c].retryable }

// Error is a protocol-level error: a code from the table plus a human-readable
// message. It is what an ERROR frame carries and what decoders return.
type Error struct {
	Code    Code
	Message string
	// Owner is the client address of the node that owns the partition
	// (CodeNotOwner only): the request succeeds when sent there.
	Owner string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "sinew: " + e.Code.String()
	}
	return "sinew: " + e.Code.String() + ": " + e.Message
}

// Is makes errors.Is(err, &Error{Code: c}) match on the code alone.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && (t.Message == "" || t.Message == e.Message)
}

// Errorf builds an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// CodeOf extracts the protocol code from err, or CodeInternal if err carries none.
func CodeOf(err error) Code {
	if err == nil {
		return CodeOK
	}
	var pe *Error
	if errors.As(err, &pe) {
		return pe.Code
	}
	return CodeInternal
}
