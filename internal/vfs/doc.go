// Package vfs is Sinew's file-system seam.
//
// Everything that touches disk (the log, checkpoints, the settings document)
// goes through FS so that tests can swap the real file system for MemFS, an
// in-memory file system that models durability honestly and can be "crashed".
//
// # Durability model
//
// The two implementations agree on what is durable when:
//
//   - File contents are durable once File.Sync has returned nil. OS files use
//     fdatasync on Linux: data and the metadata needed to read it back (size),
//     but not timestamps.
//   - A directory entry (a created, renamed or removed name) is durable once
//     FS.SyncDir of its parent directory has returned nil after the change.
//     Syncing a file does not make its name durable.
//
// MemFS.Crash returns the image a machine would see after power loss: only the
// synced state, optionally with a torn (partially persisted) last write per
// file. Code that passes its crash tests on MemFS therefore does not depend on
// luck with the page cache.
//
// # Concurrency
//
// Both implementations are safe for concurrent use. MemFS serialises every
// operation on one mutex; it is a test tool and favours simplicity over speed.
// A single File must not be used with Read/Write (which move a shared offset)
// from several goroutines at once; ReadAt and WriteAt are fine.
package vfs
