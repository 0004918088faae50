// Package raftlog implements etcd raft's Storage (go.etcd.io/raft/v3) over a
// seglog.Log, so a partition's log is its raft log: LSN = raft index, one
// record per entry.
//
// # Entries and records
//
//	raft entry                       seglog record
//	-------------------------------  ---------------------------------------
//	EntryNormal, Data = typ ++ body  Type = typ (a queue event kind), Payload = body
//	EntryNormal, empty Data          Type = TypeNoop, empty payload (leader no-op)
//	EntryConfChange                  Type = TypeConfChange, Payload = Data
//	EntryConfChangeV2                Type = TypeConfChangeV2, Payload = Data
//
// The reserved types sit at the top of the byte range, away from the queue's
// event kinds; the queue treats any record type it does not know as a settled
// gap, so no-ops and configuration entries take raft indexes without
// disturbing it. A normal entry whose first byte is a reserved type is
// refused (ErrReservedType).
//
// # The hot path reads no file
//
// raft reads committed entries back through Entries after they are
// persisted, to hand them to the application. Storage keeps the entries it
// appended in memory (the un-applied tail) until the application reports
// them applied (SetApplied), bounded by Options.CacheBytesMax (data bytes
// plus a fixed cost per entry): when the tail outgrows it, the oldest
// entries leave the cache and are read from the segment files if asked for
// again. With Options.Budget the cache also counts against a node-wide
// budget shared with other groups (internal/budget): when the budget is
// full, the group whose oldest cached entry is the coldest drops entries
// the same way, and Close gives its share back. Term, LastIndex and
// FirstIndex are answered from memory by seglog itself.
//
// # Goroutines and durability
//
// Storage is safe for concurrent use; raft calls it from the goroutine that
// drives the RawNode, and so does the writer (Append, Sync, SetHardState,
// ApplySnapshot) in the usual Ready loop. Append buffers entries; they are
// durable after Sync. SetHardState and SetConfState follow seglog's rules: a
// new term or vote, and any ConfState, are durable on return; a commit index
// alone becomes durable with the next synced change (raft.MustSync). The
// application must persist entries before a HardState whose commit index
// covers them, which the Ready order already gives.
//
// # Snapshots
//
// The snapshot data (the queue checkpoint plus live message bodies) belongs
// to the partition. Storage keeps the metadata: the log starts after the
// snapshot index (ApplySnapshot calls seglog's ResetTo), and the ConfState is
// persisted with the HardState. Options.Snapshot is the hook through which
// the partition supplies a snapshot when raft needs one for a lagging
// follower; CreateSnapshot records one made by the application.
package raftlog
