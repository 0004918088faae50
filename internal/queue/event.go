package queue

import "strconv"

// Header is one application header carried with a message.
type Header struct{ Key, Value string }

// Message is what a producer publishes. The queue copies only the small
// metadata it schedules by (NotBeforeMs, ExpiresAtMs) out of it; the key,
// headers and body live in the log and are read back from there for delivery.
type Message struct {
	// Key is the producer's routing/deduplication key; opaque to the queue.
	Key []byte
	// Headers are application headers, delivered as published.
	Headers []Header
	// ContentType describes Body for consumers (e.g. "application/json").
	ContentType string
	// NotBeforeMs delays the first delivery until this Unix millisecond
	// time; 0 means deliverable at once.
	NotBeforeMs int64
	// ExpiresAtMs is the Unix millisecond time after which an undelivered
	// message is dead-lettered with ReasonExpired; 0 means never (unless
	// Config.DefaultTTLMs fills it in).
	ExpiresAtMs int64
	// PublishedAtMs is when the broker accepted the message; Enqueue fills it
	// with nowMs when 0.
	PublishedAtMs int64
	// ProducerID and ProducerSeq identify the publish for producer-side
	// deduplication; opaque to the queue.
	ProducerID  string
	ProducerSeq uint64
	// Body is the payload. Never retained by the queue.
	Body []byte
}

// Reason says why a message left the inflight or queued state other than by
// an ack. It is stored in events, so values are part of the log format and
// must never be renumbered.
type Reason uint8

// Reasons. ReasonNack, ReasonLeaseExpired and ReasonReleased requeue a
// message; the others dead-letter it.
const (
	ReasonNone             Reason = iota // no reason (acks, leases)
	ReasonNack                           // consumer asked for a redelivery
	ReasonLeaseExpired                   // the lease deadline passed without a settle
	ReasonReleased                       // the consumer went away; lease handed back
	ReasonFailed                         // consumer declared the message unprocessable
	ReasonRetriesExhausted               // a NACK or lease expiry was due but counted attempts reached MaxRetries+1
	ReasonExpired                        // ExpiresAtMs passed while the message waited
	ReasonPurged                         // an operator purged the queue; always discarded
	reasonCount
)

var reasonNames = [reasonCount]string{
	"none", "nack", "lease_expired", "released", "failed", "retries_exhausted", "expired", "purged",
}

// String returns the stable snake_case name used in metrics and dead-letter
// headers.
func (r Reason) String() string {
	if r < reasonCount {
		return reasonNames[r]
	}
	return "reason(" + strconv.Itoa(int(r)) + ")"
}

// Kind is the type of a queue event. Its value is the seglog record type
// byte, so values are part of the log format and must never be renumbered.
type Kind uint8

// Event kinds.
const (
	KindEnqueue        Kind = 1 + iota // a message was published; its LSN is its offset
	KindLease                          // a queued message was handed to a consumer
	KindAck                            // the lease holder completed the message: settled
	KindRequeue                        // an inflight message goes back to ready/delayed
	KindDeadLetter                     // a message failed for good: discarded or copying to a target
	KindDeadLetterDone                 // the dead-letter copy is durable: settled
	KindRelocate                       // a live message's body was copied to this record; its offset is unchanged
	KindExtend                         // the lease holder moved its lease's deadline; nothing else changes
	KindAssign                         // the partition's gate moved to another cohort member (see Gate)
	kindEnd
)

var kindNames = [kindEnd]string{
	"", "enqueue", "lease", "ack", "requeue", "dead_letter", "dead_letter_done", "relocate", "extend", "assign",
}

// IsEventType reports whether a seglog record type byte is a queue event
// kind. Other record types may share the log; the queue counts their LSNs
// as settled.
func IsEventType(typ uint8) bool { return typ >= uint8(KindEnqueue) && typ < uint8(kindEnd) }

// String returns the kind's snake_case name.
func (k Kind) String() string {
	if k >= KindEnqueue && k < kindEnd {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Event is one state change of a queue: commands return them, the partition
// appends them to the log and feeds them back through Apply. Only the fields
// listed for a kind are meaningful (and encoded):
//
//	Enqueue         Msg (Offset is implied: it is the event's own LSN)
//	Lease           Offset LeaseID Owner DeadlineMs Attempt AtMs
//	Ack             Offset LeaseID
//	Requeue         Offset LeaseID Reason NotBeforeMs AtMs
//	DeadLetter      Offset LeaseID Reason Target AtMs   (LeaseID 0: message was queued)
//	DeadLetterDone  Offset AtMs
//	Relocate        Offset Msg  (Msg is the body copied; Apply keeps only its new location)
//	Extend          Offset LeaseID DeadlineMs AtMs
//	Assign          Target (the cohort) Owner (the member) Epoch AtMs
type Event struct {
	Kind        Kind
	Offset      uint64
	LeaseID     uint64
	Owner       string
	DeadlineMs  int64
	NotBeforeMs int64
	AtMs        int64
	Attempt     uint32
	Reason      Reason
	Target      string
	Epoch       uint64
	Msg         *Message
}

// MsgState is where a message stands. Every offset below NextLSN is in
// exactly one of these.
type MsgState uint8

// Message states.
const (
	StateReady         MsgState = 1 + iota // deliverable now
	StateDelayed                           // queued, but NotBeforeMs is in the future
	StateInflight                          // leased to a consumer
	StateDeadLettering                     // failed for good; copy to the dead-letter target pending
	StateSettled                           // done (acked, discarded, copied); also every non-message LSN
)

var stateNames = [...]string{"", "ready", "delayed", "inflight", "dead_lettering", "settled"}

// String returns the state's snake_case name.
func (st MsgState) String() string {
	if int(st) < len(stateNames) && st != 0 {
		return stateNames[st]
	}
	return "state(" + strconv.Itoa(int(st)) + ")"
}

// Info describes one offset as the queue sees it.
type Info struct {
	Offset   uint64
	State    MsgState
	Attempt  uint32 // deliveries so far; the current lease's attempt when inflight
	Released uint32 // deliveries that ended in an uncounted Release
	LeaseID  uint64 // inflight only
	// EndedLeaseID (ready or delayed only) is the lease that last ended
	// without a settle, by expiry or release, when the message has not been
	// leased since; 0 otherwise (new, or back by a Nack). An Ack or Fail of
	// it still applies.
	EndedLeaseID uint64
	Owner        string // inflight only
	DeadlineMs   int64  // inflight: lease deadline; dead-lettering: when it was dead-lettered
	NotBeforeMs  int64  // earliest next delivery; 0 when none
	ExpiresAtMs  int64  // TTL deadline; 0 when none
	Reason       Reason // dead-lettering only
	Target       string // dead-lettering only: where the copy goes
}

// Stats are the queue's counters at one instant.
type Stats struct {
	NextLSN       uint64
	Frontier      uint64
	Ready         int
	Delayed       int
	Inflight      int
	DeadLettering int
	// SettledRanges is the number of maximal runs of settled LSNs below
	// NextLSN: the fragmentation that unsettled messages cause.
	SettledRanges int
}
