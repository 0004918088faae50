package queue

import "errors"

// The errors below are the complete set a queue returns. They are sentinels so
// callers can test with errors.Is; every returned error wraps exactly one of
// them with the offset, lease and state that made the call fail.
var (
	// ErrStaleLease: the lease id does not name the current lease of the
	// message. The lease expired and the message was requeued or leased again,
	// or the caller sent the wrong id. The settle must be dropped; the message
	// is (or will be) delivered again.
	ErrStaleLease = errors.New("queue: stale lease")

	// ErrAlreadySettled: the offset is below NextLSN and not an unsettled
	// message. Acks of such an offset are idempotent successes for callers.
	// Because settled history is kept only as ranges, an LSN that was never a
	// message (a lease or ack record) also reports this error.
	ErrAlreadySettled = errors.New("queue: offset already settled")

	// ErrAlreadyRequeued: the lease ended without a settle (it expired, or
	// was released because its holder went away) and the message is queued
	// again, not leased since. A Nack or Release of that lease has nothing
	// left to do; callers answer it as a success. (An Ack or Fail of it is
	// applied: the lease is still the message's latest attempt.)
	ErrAlreadyRequeued = errors.New("queue: lease ended and message already requeued")

	// ErrUnknownOffset: the offset is at or above NextLSN, so no record
	// exists for it yet.
	ErrUnknownOffset = errors.New("queue: unknown offset")

	// ErrNotDeadLettering: DeadLettered was called for a message that is not
	// waiting for its dead-letter copy.
	ErrNotDeadLettering = errors.New("queue: message is not dead-lettering")

	// ErrInvalidDeadline: Extend was given a deadline that is not after
	// now.
	ErrInvalidDeadline = errors.New("queue: invalid lease deadline")

	// ErrInvalidMessage: Enqueue was given a message it cannot accept.
	ErrInvalidMessage = errors.New("queue: invalid message")

	// ErrCorrupt: an encoded event or snapshot is malformed, or an event
	// contradicts the state it is applied to. Either means the log or the
	// checkpoint cannot be trusted; the partition must stop rather than guess.
	ErrCorrupt = errors.New("queue: corrupt event or snapshot")
)
