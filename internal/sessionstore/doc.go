// Package sessionstore keeps the little that a broker restart needs to know
// about sessions: for each live session its client id, a hash of its resume
// token, the owner id that issued it, the principal that owns it (the
// authenticated identity of the connection that opened it), and each
// subscription's stable
// identity (id, topic, group, partition, ack mode, prefetch). It also keeps
// the highest subscription id ever handed out, so ids are never reused
// across restarts, and a boot counter.
//
// Leases are not here: they are in the partition logs, recorded under their
// subscription's owner, which the session layer derives from the owner id,
// the client id and the subscription id (all three stable). Nothing is
// written per message: the store is written when a session is created, a
// subscription is opened or closed, and a session ends.
//
// # Layout
//
//	DataDir/sessions/log/         a seglog of records (see record.go)
//	DataDir/sessions/checkpoint   the state as of some LSN (see checkpoint.go)
//
// Open restores the checkpoint, replays the log from the LSN it covers,
// adds one to the boot counter, writes a fresh checkpoint and drops the log
// segments it covers. While running, a checkpoint is written every
// CheckpointEveryRecords records, so the log stays short.
//
// # What is durable when
//
// Subscribe returns once its record is fsynced (with every record before
// it): a client is told about a subscription only after a restart would
// find it. Create, Unsubscribe and End hand their record to the OS (it
// survives a kill of the process) and reach the disk with the next sync;
// losing one to a power cut costs a session that is not restored, or a
// restored subscription whose leases were already released, both of which
// the client reconciles. Persist makes every record durable and writes a
// checkpoint; a planned restart calls it (through the session registry)
// before it stops.
//
// # Goroutines and locks
//
// A Store has no goroutine of its own besides its log's committer. mu
// guards the state and every append, so a checkpoint sees exactly the
// records before the LSN it covers. It is a leaf lock: the session registry
// calls in while holding its own.
package sessionstore
