// Package partition runs one queue partition as an actor.
//
// # Goroutines and ownership
//
// Open starts ONE goroutine per partition. It alone owns the partition's
// queue.State, appends to its seglog.Log, keeps its timers, its consumer
// list, its cache of recent payloads and its dead-letter bookkeeping. Other
// goroutines reach it through:
//
//   - the inbox, a bounded channel of publishes and settles. A full inbox is
//     answered at once with ErrInboxFull (CodeResourceExhausted); it never
//     grows.
//   - the control list: attach, detach, dead-letter confirmations and
//     configuration changes, which must not be refused for lack of room.
//     Each comes from a bounded source (one per subscription, or one per
//     in-flight dead-letter copy).
//   - Poke, which asks for a turn (credit came back, the clock moved).
//
// # A turn
//
// The actor takes a batch of commands (at most batchMax) and then:
//
//  1. applies control messages (a detached consumer's leases are released);
//  2. turns every command into queue events, appends each to the log and
//     applies it to the state;
//  3. ticks the queue (lease expiry, delays, TTL);
//  4. dispatches: leases ready messages to consumers with prefetch credit,
//     round-robin in small chunks so competing consumers share the queue;
//  5. makes all of the turn's records durable with ONE log.Sync;
//  6. replies to publishers and settlers, hands deliveries to consumers
//     (payloads come from the cache or from log.Read) and starts dead-letter
//     copies.
//
// # Durability
//
// Nothing is confirmed before its record is fsynced, and nothing is
// delivered before its Enqueue record is: replies and deliveries happen only
// after step 5. Under seglog.SyncInterval step 5 is log.Flush instead: the
// turn's records are written to the OS before anything is confirmed, so a
// process crash loses nothing confirmed, and fdatasync runs every
// SyncIntervalMs, so a power loss can lose up to one interval of confirmed
// records (the risk that policy names). Every CheckpointEveryRecords records
// and at Close the queue snapshot is written to Dir/checkpoint atomically;
// log segments wholly below both the checkpoint and the queue's frontier
// are then deleted. Recovery restores the checkpoint and replays the log
// from the LSN it covers.
//
// # Recovered leases
//
// Leases found in the log at Open were granted to sessions of the previous
// process, which are gone. The actor lists them after recovery and, once
// Config.RecoveredLeaseGraceMs has passed on its clock (on the first turn
// by default), releases every one that is still current: ready again, the
// attempt counted as for any requeue, at most recoveredReleasePerTurnMax
// per turn. ClaimRecovered is the seam for session restore: a resuming
// owner claims its leases within the grace and keeps them.
//
// # Dead letters
//
// When a DeadLetter event with a target is durable, the actor publishes a
// copy (through Config.DeadLetter) carrying the reserved sinew.* headers,
// and records DeadLetterDone once the target confirms it. Copies still
// pending at a crash are redone after recovery (queue.PendingDeadLetters),
// so a copy may be made twice but is never lost.
//
// # Damage
//
// Open returns an error wrapping ErrDamaged when the log or checkpoint fails
// verification. The caller may quarantine the partition (Parked), refuse to
// start, or reopen with seglog.CorruptionTruncate. A write or fsync error
// at run time fails the partition: it refuses everything with
// ErrUnavailable until the process restarts, because its in-memory state
// may be ahead of the disk.
//
// Idempotent publishing (producer id and sequence) will add its own record
// type to the log; recovery already skips record types the queue does not
// know, and Publish is where a duplicate would be answered.
package partition
