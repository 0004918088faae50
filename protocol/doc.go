// Package protocol defines Sinew's wire format, version 1: frame header, op codes,
// typed bodies and the error-code table. It does no I/O beyond reading and writing
// frames on a caller-supplied reader or writer, keeps no goroutines and reads no
// clock, so it can be fuzzed and reused by the server and by every client.
//
// A frame on the wire:
//
//	 0               4       5       6               8                      16
//	+---------------+-------+-------+---------------+-----------------------+------------
//	| length (u32)  | ver   | op    | flags (u16)   | request id (u64)      | body ...
//	+---------------+-------+-------+---------------+-----------------------+------------
//	  big-endian; length counts every byte after itself (12-byte header + body)
//
// Bodies are a fixed sequence of fields per op, each field one of: uvarint, zig-zag
// varint, u8, bool (u8 0/1), bytes (uvarint length + data), string (same as bytes,
// UTF-8), or a list (uvarint count + items). Fields are only ever appended to a body
// within a protocol version; a decoder ignores bytes after the fields it knows, so an
// older peer can read a newer peer's frames. Removing or reordering a field needs a
// new protocol version, negotiated in HELLO. See docs/protocol.md for the full
// specification.
package protocol
