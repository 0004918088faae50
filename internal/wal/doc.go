// Package wal is the node journal: a per-node write-ahead log shared by many
// raft groups, with group commit. Every group's entries and HardState
// changes (a partition's term and vote) go through one append stream and one
// fdatasync per batch, instead of one fdatasync stream per group. The groups keep their own files
// (seglog) for reads, retention and snapshots; the WAL only holds what those
// files may not have made durable yet, and forgets it once a group releases
// it.
//
// # Files
//
// The WAL lives in a directory of its own (one per node: the broker's is
// DataDir/wal, which every partition commits through; see
// partition.Config.WAL for how a partition uses it) of segment files named
// wal-<seq>.log, seq a 16-digit hex number that grows by one per segment.
// Each segment starts with a header and holds records (format drawn in
// format.go). Segments are written append-only. On disk (Options.Prepare)
// the next segment is written full of zeros and synced by a goroutine of its
// own once the active one is half full (wal-prepared.tmp, renamed into place
// at the roll), a megabyte at a time, each written out to the device before
// the next (vfs.WriteBehind), so that it never queues megabytes ahead of the
// writer's fsyncs; a batch then overwrites written blocks and fdatasync
// flushes data only; otherwise the active one is reserved in steps with
// vfs.Allocate so a data sync need not commit a size change. Either way the
// tail past the data reads as zeros.
//
// # Group keys
//
// A group is named by a stable string, its partition's directory
// ("queues/<topic>/<group>/p3"). Records carry a small uint32 id instead of
// the name. An id means something only inside one segment: the first record
// of a group in a segment is preceded, in the same write, by a declare record
// (id -> name). Every segment therefore reads alone, ids can be reassigned
// freely after a restart, and deleting any released segment loses no
// mapping.
//
// # Group commit
//
// Commit encodes the batch in the caller's goroutine and queues it. One
// writer goroutine takes every queued batch, writes them with one write call,
// runs one fdatasync and wakes all their callers. Queued bytes are bounded by
// Options.PendingBytesMax and waiting callers by Options.CommittersMax; a
// Commit over either bound waits for the writer. A failed write or sync fails
// every waiter and the WAL itself: all later calls return an error wrapping
// ErrFailed (the kernel may have dropped the dirty pages, so nothing unsynced
// can be vouched for). Reopen to recover.
//
// # HardState
//
// A Batch may carry the group's HardState (term, vote, commit); it becomes
// durable with the batch's entries, in the same fdatasync. When the writer
// opens a new segment it first writes, in the segment's first synced write,
// the latest HardState of every group it knows. So the newest segment always
// holds every group's latest HardState, and a HardState never keeps an old
// segment alive.
//
// # Release, trim and pressure
//
// Release(group, index) tells the WAL that the group's own files hold entries
// up to index durably (fsynced). Segments are deleted oldest first (then the
// directory synced): the oldest one other than the active one goes once
// every group's entries in it are released. Never one from the middle: what
// replay finds for a group is then one unbroken stretch of its writes up to
// the last one, so the entry it gives for an index is the newest write of
// it, and a group's files can be repaired from it whatever they hold. A
// Batch with Reset writes a reset record: the group's earlier entries are
// void, replay forgets them and they no longer keep segments (a group whose
// files were replaced by a snapshot).
//
// A group that never releases would pin its segments, and every later one,
// forever, so the WAL watches its span: when a segment kept is
// Options.PressureSegments behind the active one, it calls
// Options.OnPressure(group, index), once per segment and on a goroutine of
// its own, for every group that pins that segment, asking it to sync its
// files up to index and Release. A group that cannot (a quarantined
// partition keeps its entries until repaired; the broker commits them again
// at the head with Reset, so they stop pinning old segments) does not stop
// the others from being asked about later segments. With a handler that
// does so, the WAL holds about PressureSegments+1 segments whatever the
// groups do. Forget drops a group altogether (its queue was deleted).
//
// # What is durable when
//
//   - Commit: durable (fdatasync) when it returns nil, HardState included.
//   - A new segment: its header and carried HardStates are synced, then the
//     directory, before any batch is written to it.
//   - Segment deletion: a goroutine of its own (the remover) deletes the
//     segments a trim dropped, oldest first, and syncs the directory after
//     each batch; a crash before that leaves some released segments, which
//     replay harmlessly.
//
// # Replay
//
// Open reads every segment in order and keeps, per group, the entries still
// in the WAL and the last HardState. An entry at an index at or below the
// group's last one replaces that suffix (a raft leader overwrote it); an
// entry past a gap starts the group's list afresh (what came before was
// released), and a reset record empties it. A torn tail in the last segment is truncated: a record that
// runs past the end of the file, or one that fails its checksum with only
// zeros after it, or an incomplete header of a last segment that was being
// created. Any other damage (a bad record with data after it, or any fault
// in an earlier segment) makes Open fail with a *DamagedError wrapping
// ErrDamaged. Open then starts a new segment; replayed data is handed out by
// Take.
//
// # Goroutines and locks
//
// One writer goroutine per WAL writes, syncs, rolls and trims; the remover
// deletes what trims dropped, and the preparer zeroes the next segment. WAL.mu guards
// the queue, the group table and the segment table; it is never held during
// file I/O except by Open and Close. OnPressure runs on its own goroutine,
// without the lock, so it may call Release.
package wal
