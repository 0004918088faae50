package seglog

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
)

// Record framing. Every record in a segment file is laid out as:
//
//	 0        4        8                       16   17
//	 +--------+--------+------------------------+----+====================+
//	 | crc32c | length |          lsn           |type| payload            |
//	 | u32 LE | u32 LE |         u64 LE         | u8 | length bytes       |
//	 +--------+--------+------------------------+----+====================+
//	          |<------------ covered by crc32c, after the payload ------->|
//
//	crc32c = CRC-32C (Castagnoli) of payload, continued over header bytes [4,17).
//
// The CRC covers the payload first so appenders can checksum their payload
// outside the log's lock and add the 13 header bytes (which carry the LSN
// assigned under the lock) afterwards. Storing the LSN in every record ties a
// record to its position: a stale or misplaced record fails the LSN check even
// when its CRC is fine. An all-zero header never verifies (the CRC of 13 zero
// bytes is not zero), which is what lets recovery tell a preallocated zero
// tail from a record.
const (
	headerBytes = 17
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
	LSN     uint64 // position in the log, dense from 1
	Type    uint8  // caller-defined record kind; the log does not interpret it
	Payload []byte // caller bytes, at most PayloadBytesMax
}

// payloadCRC is the first half of a record's checksum; see recordCRC.
func payloadCRC(payload []byte) uint32 { return crc32.Checksum(payload, castagnoli) }

// recordCRC finishes a checksum begun with payloadCRC over the header tail.
func recordCRC(pc uint32, hdrTail []byte) uint32 { return crc32.Update(pc, castagnoli, hdrTail) }

// appendRecord encodes one record onto dst; pc must be payloadCRC(payload).
func appendRecord(dst []byte, lsn uint64, typ uint8, payload []byte, pc uint32) []byte {
	var h [headerBytes]byte
	binary.LittleEndian.PutUint32(h[4:8], uint32(len(payload)))
	binary.LittleEndian.PutUint64(h[8:16], lsn)
	h[16] = typ
	binary.LittleEndian.PutUint32(h[0:4], recordCRC(pc, h[4:]))
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

// AppendRecord encodes one record onto dst in the segment format and returns
// the extended slice. It panics if payload exceeds PayloadBytesMax, which
// callers check first (Append returns ErrRecordTooLarge).
func AppendRecord(dst []byte, lsn uint64, typ uint8, payload []byte) []byte {
	if len(payload) > PayloadBytesMax {
		panic("seglog: AppendRecord payload exceeds PayloadBytesMax")
	}
	return appendRecord(dst, lsn, typ, payload, payloadCRC(payload))
}

// DecodeRecord decodes the record at the start of b and returns it with its
// encoded size. The payload aliases b. Errors: ErrShortRecord when b ends
// early, ErrBadLength, ErrBadChecksum. It never panics on any input.
func DecodeRecord(b []byte) (Record, int, error) {
	if len(b) < headerBytes {
		return Record{}, 0, ErrShortRecord
	}
	n := binary.LittleEndian.Uint32(b[4:8])
	if n > PayloadBytesMax {
		return Record{}, 0, ErrBadLength
	}
	size := headerBytes + int(n)
	if len(b) < size {
		return Record{}, 0, ErrShortRecord
	}
	payload := b[headerBytes:size:size]
	if recordCRC(payloadCRC(payload), b[4:headerBytes]) != binary.LittleEndian.Uint32(b[0:4]) {
		return Record{}, 0, ErrBadChecksum
	}
	return Record{
		LSN:     binary.LittleEndian.Uint64(b[8:16]),
		Type:    b[16],
		Payload: payload,
	}, size, nil
}

// headerLength returns the length field of an encoded header.
func headerLength(h []byte) uint32 { return binary.LittleEndian.Uint32(h[4:8]) }
