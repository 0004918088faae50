// Package runtimesettings keeps the broker's runtime settings: values an
// operator changes on a running broker (through the admin API) that take effect
// without a restart and survive one.
//
// The settings live in one small document in the data directory,
// runtime-settings.json, with a version that goes up by one on every accepted
// change. A change names the version it was based on, so two operators racing
// cannot silently overwrite each other: the second gets ErrVersionConflict.
//
// The document is seeded once: when the data directory has none, Open writes one
// from the seed it is given (the runtime_seed section of the startup
// configuration) at version 1. From then on the document wins; a seed that
// differs from it is logged and not applied. A key the document lacks (one added
// by a later release) is filled from the seed, and the version bumped.
//
//	runtime-settings.json (indentation is not significant)
//	{
//	  "crc32c": 2864434397,
//	  "settings": {"format": 1, "version": 3, "values": {"connection.reconnect_grace_ms": 5000}}
//	}
//
// crc32c (Castagnoli) covers the compact JSON encoding of "settings" (the form
// json.Compact gives). A document that does not parse, fails its checksum, has
// an unknown format, an unknown key or a value out of its key's range is
// ErrCorrupt: Open fails, and the broker does not start, rather than silently
// resetting the settings to the seed.
//
// Durability: Update writes the new document with vfs.WriteFileAtomic (temporary
// file, fsync, rename, fsync of the directory) before the new values become
// visible and before it returns, so a value a caller was told about is on disk.
//
// Concurrency: a Store has no goroutine. Readers (Int, Snapshot) load an
// immutable snapshot through an atomic pointer and never block; Update holds
// Store.mu across validation, the write and the swap, so changes are serialised.
package runtimesettings
