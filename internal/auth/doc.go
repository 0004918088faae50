// Package auth decides who a peer is and what it may do.
//
// A connection authenticates once, in HELLO, and the server keeps the
// resulting Principal for the life of the connection (and records its owner
// name with the session it opens). A Principal is either anonymous (only where
// the startup rule allows it), a named user from the Users store, a static
// token from auth.tokens, or a client certificate subject.
//
// Users is the store of named users. It lives in one file under the data
// directory (DATA_DIR/meta/users), a checksummed file (internal/ckfile)
// replaced atomically (temporary file created 0600, fsync, rename,
// directory fsync) on every change, and read and verified once at open with
// a size bound; a file that fails its checksum or checks is ErrCorrupt.
// Passwords are kept only as argon2id hashes with a per-user random salt, and
// each hash records the parameters it was made with, so the defaults can be
// raised later without invalidating stored hashes.
//
// Concurrency: Users is safe for concurrent use. Mutations are serialised by
// one lock held across the file write; lookups take a read lock on the
// in-memory table only for the time it takes to copy a record, so a slow
// hash or fsync never blocks a verification. At most UsersOptions.HashesMax
// hashes run at once, which bounds the memory argon2id takes under a flood
// of handshakes; a check waits for a slot until its context ends, and sources
// whose check failed lately wait behind the others (hashslots.go).
package auth
