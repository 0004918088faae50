package seglog

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
)

// Record framing (format version 2). Every record in a version-2 segment file
// is laid out as:
//
//	 0        4        8                16               24   25
//	 +--------+--------+----------------+----------------+----+=============+
//	 | crc32c | length |      lsn       |      term      |type| payload     |
//	 | u32 LE | u32 LE |     u64 LE     |     u64 LE     | u8 | length bytes|
//	 +--------+--------+----------------+----------------+----+=============+
//	          |<----------- covered by crc32c, after the payload ---------->|
//
//	crc32c = CRC-32C (Castagnoli) of payload, continued over header bytes [4,25).
//
// Version 1 (segments without a header, see segment.go) used the same layout
// without the term field: a 17-byte header, crc32c continued over [4,17).
// Version-1 records read back with term 1.
//
// The CRC covers the payload first so appenders can checksum their payload
// outside the log's lock and add the header bytes (which carry the LSN
// assigned under the lock) afterwards. Storing the LSN in every record ties a
// record to its position: a stale or misplaced record fails the LSN check even
// when its CRC is fine. The term is the raft term of the leader that created
// the entry; a record rewritten at the same LSN by a later leader differs in
// its term and CRC. An all-zero header never verifies (the CRC of zero bytes
// is not zero), which is what lets recovery tell a preallocated zero tail from
// a record.
const (
	headerBytes   = 25 // version 2
	headerBytesV1 = 17
	// PayloadBytesMax bounds one record's payload. Larger payloads are
	// rejected with ErrRecordTooLarge; recovery treats a larger length field
	// as damage.
	PayloadBytesMax = 16 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors from DecodeRecord.
var (
	// ErrShortRecord: the buffer ends before the header or payload does.
	ErrShortRecord = errors.New("seglog: record extends past end of data")
	// ErrBadLength: the length field exceeds PayloadBytesMax.
	ErrBadLength = errors.New("seglog: record length out of range")
	// ErrBadChecksum: the record's CRC32C does not match its bytes.
	ErrBadChecksum = errors.New("seglog: record checksum mismatch")
)

// Record is one log entry. Payload ownership depends on where it came from:
// Read returns an owned copy; Scan and Replay lend a slice valid only during
// the callback.
type Record struct {
	LSN     uint64 // position in the log (the raft index), dense
	Term    uint64 // raft term that wrote it; 1 for version-1 records
	Type    uint8  // caller-defined record kind; the log does not interpret it
	Payload []byte // caller bytes, at most PayloadBytesMax
}

// payloadCRC is the first half of a record's checksum; see recordCRC.
func payloadCRC(payload []byte) uint32 { return crc32.Checksum(payload, castagnoli) }

// recordCRC finishes a checksum begun with payloadCRC over the header tail.
func recordCRC(pc uint32, hdrTail []byte) uint32 { return crc32.Update(pc, castagnoli, hdrTail) }

// appendRecord encodes one version-2 record onto dst; pc must be
// payloadCRC(payload).
func appendRecord(dst []byte, lsn, term uint64, typ uint8, payload []byte, pc uint32) []byte {
	var h [headerBytes]byte
	binary.LittleEndian.PutUint32(h[4:8], uint32(len(payload)))
	binary.LittleEndian.PutUint64(h[8:16], lsn)
	binary.LittleEndian.PutUint64(h[16:24], term)
	h[24] = typ
	binary.LittleEndian.PutUint32(h[0:4], recordCRC(pc, h[4:]))
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

// AppendRecord encodes one record onto dst in the version-2 segment format
// and returns the extended slice. It panics if payload exceeds
// PayloadBytesMax, which callers check first (Append returns
// ErrRecordTooLarge).
func AppendRecord(dst []byte, lsn, term uint64, typ uint8, payload []byte) []byte {
	if len(payload) > PayloadBytesMax {
		panic("seglog: AppendRecord payload exceeds PayloadBytesMax")
	}
	return appendRecord(dst, lsn, term, typ, payload, payloadCRC(payload))
}

// DecodeRecord decodes the version-2 record at the start of b and returns it
// with its encoded size. The payload aliases b. Errors: ErrShortRecord when b
// ends early, ErrBadLength, ErrBadChecksum. It never panics on any input.
func DecodeRecord(b []byte) (Record, int, error) { return decodeRecord(b, true) }

// DecodeRecordV1 decodes a version-1 record (no term; Term is reported as 1)
// like DecodeRecord.
func DecodeRecordV1(b []byte) (Record, int, error) { return decodeRecord(b, false) }

// recHeaderBytes is the record header size of a format.
func recHeaderBytes(v2 bool) int {
	if v2 {
		return headerBytes
	}
	return headerBytesV1
}

func decodeRecord(b []byte, v2 bool) (Record, int, error) {
	hb := recHeaderBytes(v2)
	if len(b) < hb {
		return Record{}, 0, ErrShortRecord
	}
	n := binary.LittleEndian.Uint32(b[4:8])
	if n > PayloadBytesMax {
		return Record{}, 0, ErrBadLength
	}
	size := hb + int(n)
	if len(b) < size {
		return Record{}, 0, ErrShortRecord
	}
	payload := b[hb:size:size]
	if recordCRC(payloadCRC(payload), b[4:hb]) != binary.LittleEndian.Uint32(b[0:4]) {
		return Record{}, 0, ErrBadChecksum
	}
	rec := Record{LSN: binary.LittleEndian.Uint64(b[8:16]), Term: 1, Type: b[hb-1], Payload: payload}
	if v2 {
		rec.Term = binary.LittleEndian.Uint64(b[16:24])
	}
	return rec, size, nil
}

// headerLength returns the length field of an encoded header (either format).
func headerLength(h []byte) uint32 { return binary.LittleEndian.Uint32(h[4:8]) }

// crc32cOf is CRC-32C of b.
func crc32cOf(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }
