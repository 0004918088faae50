// Package seglog is Sinew's durable log: a directory of segment files holding
// CRC32C-checked records with dense LSNs, written with group commit and
// verified in full on every Open. It is also a raft log: the LSN is the raft
// index, every record carries the raft term that wrote it, a follower can
// overwrite a conflicting suffix (AppendAt, TruncateAfter), the log can start
// after a snapshot at any index (ResetTo), and it keeps raft's HardState and
// ConfState (SetHardState, SetConfState).
//
// # Formats
//
// The record format is drawn in record.go, the segment header and file naming
// in segment.go, the HardState file in hardstate.go and the
// torn-tail/corruption rules in recover.go.
//
// # Format versions
//
// Version 2 (written now) has a segment header (magic, version, base LSN, term
// before the segment) and a term in every record. Version-1 logs (no header,
// no term) are read in place, not migrated and not refused: their records
// read back with term 1, Open seals a version-1 active segment and starts a
// version-2 one, so a version-1 data directory keeps working and retention
// (DropBefore) retires the version-1 files as usual. A segment with the magic
// but another version is refused as corruption.
//
// # Goroutines
//
// Open starts one committer goroutine per Log; Close stops it. Callers append
// into an in-memory buffer under Log.mu. The committer alone writes segment
// files: it takes the whole buffer, issues one write per segment touched,
// rolls segments when full, calls fdatasync and then wakes everyone whose
// record is covered. Concurrent Commit callers therefore share one fdatasync
// per batch. TruncateAfter and ResetTo are run by the committer too, while
// appends wait. Readers (Read, Scan) pin the segments they read, so
// DropBefore closes a file only after its last reader is done. Log.mu and
// Log.segMu are never held together; the HardState file has its own mutex,
// never held with either. Lock order where two are taken: dropMu, then mu or
// segMu.
//
// # What is durable when
//
//   - Append and AppendAt: in memory only. Lost on any crash.
//   - Commit under SyncAlways (the default), and Sync under either policy:
//     durable when they return nil. DurableLSN reports the watermark.
//   - Commit under SyncInterval: in the OS page cache when it returns;
//     durable within SyncIntervalMs. A power loss can lose up to one interval
//     of acknowledged records.
//   - TruncateAfter and ResetTo (and the truncation AppendAt does below
//     NextLSN): durable when they return, before any later append reaches
//     the disk; a crash never brings a removed record back.
//   - SetHardState: a change of Term or Vote is durable when it returns; a
//     change of Commit alone is written to the OS and made durable by the
//     next synced HardState change, SyncHardState or Close (raft's own
//     MustSync rule: a lost commit index is learned again). SetConfState is
//     durable when it returns.
//   - Segment creation and deletion: the directory is fsynced before the
//     change is relied on; a segment's header is synced before its name.
//   - After a failed write or fdatasync the log refuses all further writes
//     (errors wrap ErrFailed): the kernel may have dropped the dirty pages,
//     so nothing after DurableLSN can be vouched for. Reopen to recover.
//
// # Recovery
//
// Open verifies every record of every segment (length, CRC32C, LSN and term
// order) and rebuilds the sparse index and the in-memory term index (one
// entry per term change), so Term never reads a file. A torn tail at the end
// of the last segment is truncated; any other damage returns
// *CorruptionError, or is cut under CorruptionTruncate. Open can replay
// records to the caller during that same pass (Options.Replay, from
// Options.ReplayFrom) so state rebuild costs no second read.
package seglog
