// Package seglog is Sinew's durable log: a directory of segment files holding
// CRC32C-checked records with dense LSNs starting at 1, written with group
// commit and verified in full on every Open.
//
// # Formats
//
// The record format is drawn in record.go, the segment file naming in
// segment.go and the torn-tail/corruption rules in recover.go.
//
// # Goroutines
//
// Open starts one committer goroutine per Log; Close stops it. Callers append
// into an in-memory buffer under Log.mu. The committer alone writes segment
// files: it takes the whole buffer, issues one write per segment touched,
// rolls segments when full, calls fdatasync and then wakes everyone whose
// record is covered. Concurrent Commit callers therefore share one fdatasync
// per batch. Readers (Read, Scan) pin the segments they read, so DropBefore
// closes a file only after its last reader is done. Log.mu and Log.segMu are
// never held together.
//
// # What is durable when
//
//   - Append: in memory only. Lost on any crash.
//   - Commit under SyncAlways (the default), and Sync under either policy:
//     durable when they return nil. DurableLSN reports the watermark.
//   - Commit under SyncInterval: in the OS page cache when it returns;
//     durable within SyncIntervalMs. A power loss can lose up to one interval
//     of acknowledged records.
//   - Segment creation and deletion: the directory is fsynced before the
//     change is relied on.
//   - After a failed write or fdatasync the log refuses all further writes
//     (errors wrap ErrFailed): the kernel may have dropped the dirty pages,
//     so nothing after DurableLSN can be vouched for. Reopen to recover.
//
// # Recovery
//
// Open verifies every record of every segment (length, CRC32C and LSN) and
// rebuilds the sparse index. A torn tail at the end of the last segment is
// truncated; any other damage returns *CorruptionError, or is cut under
// CorruptionTruncate. Open can replay records to the caller during that same
// pass (Options.Replay, from Options.ReplayFrom) so state rebuild costs no
// second read.
package seglog
