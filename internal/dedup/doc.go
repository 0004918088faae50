// Package dedup is the producer deduplication window of one Sinew partition:
// which (producer id, sequence) pairs the partition has stored, and at which
// offset, so that a resent publish is answered with its original position
// instead of being stored twice.
//
// # Shape
//
// The package is pure, in the manner of internal/queue: no goroutines, no
// clock (time arrives as Unix milliseconds), no I/O. Check is the command:
// it looks at the table and returns a Verdict without changing anything.
// Record is the event: the partition calls it when it applies an Enqueue
// record that carries a producer id, live and again during replay, with the
// record's LSN and publish time. Every eviction is decided inside Record from
// the records applied so far, so the table is a function of its snapshot and
// the Enqueue records applied after it, and a replay after a crash arrives at
// the table the crashed process had.
//
// # What is remembered
//
// Per producer, the WindowSeqs highest sequences recorded, each with its
// offset, and a floor: the highest sequence that has left the window. Check
// answers
//
//	sequence                          verdict
//	--------------------------------  ------------------------------------------
//	in the window                     Duplicate, with the original offset
//	not in it, <= floor               TooOld: it may have been stored; the caller
//	                                  must refuse it, never store a second copy
//	not in it, > floor                Fresh
//	producer unknown or idle-expired  Fresh
//
// A sequence enters the window whatever its order, so a producer whose
// publishes reach the partition out of order (several connections) is served
// as long as its reordering stays inside the window. The sequences a
// producer has in flight at once must therefore stay below WindowSeqs; the
// Go SDK's limit (the broker's announced publish_inflight_max) does.
//
// Holds answers the ordering link of a publish (its producer_prev, see
// docs/protocol.md): a sequence remembered or at or below the floor is held;
// one above the floor and not remembered, or of an unknown producer, is not,
// and the partition refuses the follower with out_of_sequence. Holds never
// refuses for good: the producer links only to publishes still unconfirmed,
// and drops the link once that one is confirmed or failed.
//
// The offsets remembered outlive the messages: an acked message whose log
// segment retention has dropped is still answered as a duplicate, because
// the table travels in the partition's checkpoint, not only in the log.
//
// # Bounds
//
// Memory is bounded three ways, each evicting the least recently recorded
// producer first and counting it in Stats.Evictions:
//   - ProducersMax producers;
//   - EntriesMax remembered sequences over all producers;
//   - a producer with no record for IdleMs is forgotten (the clock is the
//     highest publish time applied; Check also treats such a producer as
//     unknown at its own nowMs).
//
// A forgotten producer is unknown: a resend of one of its old sequences is
// then stored again. That is the price of a bounded table, and why the
// defaults keep a producer for a day.
//
// # Durability
//
// The partition records a sequence when it applies the Enqueue record, which
// is before the record is synced. A duplicate answer is released only after
// the stage holding the original (see internal/partition), and a failed sync
// fails the partition, whose table is then rebuilt from the durable log at
// the next open; so only a durable store is ever reported as seen.
package dedup
