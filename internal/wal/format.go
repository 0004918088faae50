package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Segment header (24 bytes), at offset 0 of every segment file:
//
//	0                8        12               20       24
//	+----------------+--------+----------------+--------+
//	| magic "SNWWAL\r\n" |version |      seq       | crc32c |
//	|     8 bytes    | u32 LE |     u64 LE     | u32 LE |
//	+----------------+--------+----------------+--------+
//	crc32c = CRC-32C of bytes [0,20).
//
// Record (30-byte header + payload), one after another after the header:
//
//	 0        4        8    9        13               21               29   30
//	 +--------+--------+----+--------+----------------+----------------+----+==========+
//	 | crc32c | length |kind|  gid   |     index      |      term      |type| payload  |
//	 | u32 LE | u32 LE | u8 | u32 LE |     u64 LE     |     u64 LE     | u8 | length B |
//	 +--------+--------+----+--------+----------------+----------------+----+==========+
//	          |<------- covered by crc32c (header tail, then payload) ------------->|
//
//	kind 1 declare:   gid -> payload (the group's name); other fields 0.
//	kind 2 entry:     a raft entry of group gid: index, term, type, payload.
//	kind 3 hardstate: index = commit, term = term, payload = vote (u64 LE).
//	kind 4 reset:     group gid's earlier entries are void (its store was
//	                  replaced by a snapshot); other fields 0.
//
// An all-zero header never verifies (kind 0 is invalid), which is how replay
// tells the reserved zero tail of the active segment from a record.
const (
	segHeaderBytes = 24
	recHeaderBytes = 30
	formatVersion  = 1
	// PayloadBytesMax bounds one record's payload; larger ones are refused by
	// Commit and judged damage by replay.
	PayloadBytesMax = 16 << 20

	kindDeclare   = 1
	kindEntry     = 2
	kindHardState = 3
	kindReset     = 4
)

var magic = [8]byte{'S', 'N', 'W', 'W', 'A', 'L', '\r', '\n'}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var (
	// ErrDamaged is wrapped by *DamagedError: the WAL holds bytes that are
	// not a torn tail and do not verify.
	ErrDamaged = errors.New("wal: damaged")
	// ErrFailed marks the sticky failure state after a failed write or sync.
	ErrFailed = errors.New("wal: failed after an I/O error")
	// ErrClosed is returned by operations on a closed WAL.
	ErrClosed = errors.New("wal: closed")
	// ErrRecordTooLarge is returned by Commit for a payload over PayloadBytesMax.
	ErrRecordTooLarge = errors.New("wal: record payload too large")
	// ErrInvalid is returned for unusable options or arguments.
	ErrInvalid = errors.New("wal: invalid argument")
)

// DamagedError says where replay found damage and why it was judged damage
// rather than a torn tail.
type DamagedError struct {
	Segment string // base name of the segment file
	Offset  int64  // offset of the bad header or record
	Reason  string
}

// Error describes the damage.
func (e *DamagedError) Error() string {
	return fmt.Sprintf("wal: damaged segment %s at offset %d: %s", e.Segment, e.Offset, e.Reason)
}

// Unwrap lets errors.Is(err, ErrDamaged) match.
func (e *DamagedError) Unwrap() error { return ErrDamaged }

func encodeSegHeader(seq uint64) []byte {
	b := make([]byte, segHeaderBytes)
	copy(b, magic[:])
	binary.LittleEndian.PutUint32(b[8:12], formatVersion)
	binary.LittleEndian.PutUint64(b[12:20], seq)
	binary.LittleEndian.PutUint32(b[20:24], crc32.Checksum(b[:20], castagnoli))
	return b
}

// checkSegHeader returns the segment's seq or a reason it is not valid.
func checkSegHeader(b []byte) (uint64, string) {
	if len(b) < segHeaderBytes {
		return 0, "short header"
	}
	if [8]byte(b[:8]) != magic {
		return 0, "bad magic"
	}
	if crc32.Checksum(b[:20], castagnoli) != binary.LittleEndian.Uint32(b[20:24]) {
		return 0, "header checksum mismatch"
	}
	if v := binary.LittleEndian.Uint32(b[8:12]); v != formatVersion {
		return 0, fmt.Sprintf("unknown format version %d", v)
	}
	return binary.LittleEndian.Uint64(b[12:20]), ""
}

func appendRec(dst []byte, kind uint8, gid uint32, index, term uint64, typ uint8, payload []byte) []byte {
	var h [recHeaderBytes]byte
	binary.LittleEndian.PutUint32(h[4:8], uint32(len(payload)))
	h[8] = kind
	binary.LittleEndian.PutUint32(h[9:13], gid)
	binary.LittleEndian.PutUint64(h[13:21], index)
	binary.LittleEndian.PutUint64(h[21:29], term)
	h[29] = typ
	c := crc32.Update(crc32.Checksum(h[4:], castagnoli), castagnoli, payload)
	binary.LittleEndian.PutUint32(h[0:4], c)
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

func appendHardState(dst []byte, gid uint32, hs HardState) []byte {
	var v [8]byte
	binary.LittleEndian.PutUint64(v[:], hs.Vote)
	return appendRec(dst, kindHardState, gid, hs.Commit, hs.Term, 0, v[:])
}

// rec is a decoded record; payload aliases the segment buffer.
type rec struct {
	kind        uint8
	gid         uint32
	index, term uint64
	typ         uint8
	payload     []byte
	size        int
}

// errShort: the record runs past the end of the data.
var errShort = errors.New("short")

func decodeRec(b []byte) (rec, error) {
	if len(b) < recHeaderBytes {
		return rec{}, errShort
	}
	n := binary.LittleEndian.Uint32(b[4:8])
	if n > PayloadBytesMax {
		if uint64(len(b)) < uint64(recHeaderBytes)+uint64(n) {
			return rec{}, errShort
		}
		return rec{}, errors.New("length out of range")
	}
	end := recHeaderBytes + int(n)
	if len(b) < end {
		return rec{}, errShort
	}
	c := crc32.Update(crc32.Checksum(b[4:recHeaderBytes], castagnoli), castagnoli, b[recHeaderBytes:end])
	if c != binary.LittleEndian.Uint32(b[0:4]) {
		return rec{}, errors.New("checksum mismatch")
	}
	r := rec{
		kind:    b[8],
		gid:     binary.LittleEndian.Uint32(b[9:13]),
		index:   binary.LittleEndian.Uint64(b[13:21]),
		term:    binary.LittleEndian.Uint64(b[21:29]),
		typ:     b[29],
		payload: b[recHeaderBytes:end],
		size:    end,
	}
	switch r.kind {
	case kindDeclare, kindEntry, kindReset:
	case kindHardState:
		if n != 8 {
			return rec{}, errors.New("hardstate payload is not 8 bytes")
		}
	default:
		return rec{}, fmt.Errorf("unknown record kind %d", r.kind)
	}
	return r, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
