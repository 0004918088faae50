package seglog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"github.com/sinewmq/sinew/internal/vfs"
)

// Segment files. The log directory holds one file per segment, named after
// the LSN of its first record, zero-padded to 20 digits so that a plain sort
// of the names is the LSN order:
//
//	<dir>/
//	  00000000000000000001.seg    records 1 .. 41 736
//	  00000000000000041737.seg    records 41 737 .. 83 500
//	  00000000000000083501.seg    active: appends go here
//
// A version-2 segment starts with a fixed header and continues with a plain
// concatenation of records (see record.go):
//
//	0          8         12        16            24            32       36      40
//	+----------+---------+---------+-------------+-------------+--------+-------+
//	| magic    | version | flags   | base        | prev term   | crc32c | zero  |
//	| SINEWLOG | u32 = 2 | u32 = 0 | u64 LE      | u64 LE      | u32 LE | u32   |
//	+----------+---------+---------+-------------+-------------+--------+-------+
//	crc32c = CRC-32C of bytes [0,32).
//
// base repeats the file name's LSN; prev term is the term of the record at
// base-1 (the record before the segment, or the snapshot the log starts
// after), which is what Term(FirstLSN-1) answers once older segments are
// gone. The header is written and synced before the segment's name is made
// durable, so recovery never sees a durable name without its header, except
// for a new, still empty segment whose creation a crash cut short.
//
// A version-1 segment (written before the header existed) has no header:
// it starts with its first record. Recovery tells them apart by the magic.
// Only the oldest segments of a log can be version 1: every segment created
// now is version 2, and Open seals a version-1 active segment and starts a
// version-2 one.
//
// The active segment may be preallocated, in which case it ends in zero bytes
// after its last record. Other names in the directory are ignored.
const (
	segmentSuffix    = ".seg"
	segmentNameBytes = 20 + len(segmentSuffix)
	// segHeaderBytes is the size of a version-2 segment header.
	segHeaderBytes = 40
	// FormatVersion is the segment format this package writes.
	FormatVersion = 2
)

// segMagic opens every version-2 segment file.
var segMagic = [8]byte{'S', 'I', 'N', 'E', 'W', 'L', 'O', 'G'}

// encodeSegHeader returns the header of a version-2 segment.
func encodeSegHeader(base, prevTerm uint64) []byte {
	h := make([]byte, segHeaderBytes)
	copy(h, segMagic[:])
	binary.LittleEndian.PutUint32(h[8:12], FormatVersion)
	binary.LittleEndian.PutUint64(h[16:24], base)
	binary.LittleEndian.PutUint64(h[24:32], prevTerm)
	binary.LittleEndian.PutUint32(h[32:36], crc32.Checksum(h[:32], castagnoli))
	return h
}

// DecodeSegmentHeader parses a version-2 segment header at the start of b
// and returns the segment's base LSN and the term of the record at base-1.
// It never panics on any input.
func DecodeSegmentHeader(b []byte) (base, prevTerm uint64, err error) {
	if len(b) < segHeaderBytes {
		return 0, 0, ErrShortRecord
	}
	if [8]byte(b[:8]) != segMagic {
		return 0, 0, errors.New("seglog: no segment magic")
	}
	if crc32.Checksum(b[:32], castagnoli) != binary.LittleEndian.Uint32(b[32:36]) {
		return 0, 0, ErrBadChecksum
	}
	if v := binary.LittleEndian.Uint32(b[8:12]); v != FormatVersion {
		return 0, 0, fmt.Errorf("seglog: segment format version %d; this build reads versions 1 and %d", v, FormatVersion)
	}
	if binary.LittleEndian.Uint32(b[12:16]) != 0 || binary.LittleEndian.Uint32(b[36:40]) != 0 {
		return 0, 0, errors.New("seglog: segment header has unknown flags")
	}
	base = binary.LittleEndian.Uint64(b[16:24])
	if base == 0 {
		return 0, 0, errors.New("seglog: segment base 0")
	}
	return base, binary.LittleEndian.Uint64(b[24:32]), nil
}

// SegmentName returns the file name of the segment whose first LSN is base.
func SegmentName(base uint64) string { return fmt.Sprintf("%020d%s", base, segmentSuffix) }

// parseSegmentName returns the base LSN encoded in a segment file name.
func parseSegmentName(name string) (uint64, bool) {
	if len(name) != segmentNameBytes || filepath.Ext(name) != segmentSuffix {
		return 0, false
	}
	base, err := strconv.ParseUint(name[:20], 10, 64)
	if err != nil || base == 0 {
		return 0, false
	}
	return base, true
}

// indexEntry maps an LSN to the file offset of its record. Each segment keeps
// a sparse, LSN-ordered list of them: one at offset 0 and then roughly one per
// IndexIntervalBytes.
type indexEntry struct {
	lsn uint64
	off int64
}

// segment is one segment file. base, name and f never change. size, last
// and index describe the records written to the file so far; they grow only
// at the end and are guarded by Log.segMu. refs counts readers using f
// outside segMu so that DropBefore can defer closing the file until they are
// done.
type segment struct {
	base uint64
	name string // full path
	f    vfs.File
	// v2 is the format; data is the offset of the first record (the header
	// size, 0 for version 1); prevTerm the term of the record at base-1.
	v2       bool
	data     int64
	prevTerm uint64

	size  int64
	last  uint64 // LSN of the last record, base-1 when empty
	index []indexEntry

	refs    atomic.Int32
	dropped atomic.Bool // no longer in Log.segs; close when refs reach 0
	closed  atomic.Bool
}

// hdr is the record header size of the segment's format.
func (s *segment) hdr() int { return recHeaderBytes(s.v2) }

// decode decodes a record in the segment's format.
func (s *segment) decode(b []byte) (Record, int, error) { return decodeRecord(b, s.v2) }

// closeOnce closes the file exactly once, whoever gets there first.
func (s *segment) closeOnce() error {
	if s.closed.CompareAndSwap(false, true) {
		return s.f.Close()
	}
	return nil
}

// release drops a reader's reference taken by Log.acquire.
func (s *segment) release() {
	if s.refs.Add(-1) == 0 && s.dropped.Load() {
		_ = s.closeOnce() // read-only by now; a close error changes nothing durable
	}
}

// seek returns the index entry at or before lsn. Caller holds segMu.
func (s *segment) seek(lsn uint64) indexEntry {
	lo, hi := 0, len(s.index) // find the first entry with lsn > target
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if s.index[mid].lsn <= lsn {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == 0 {
		return indexEntry{lsn: s.base, off: s.data}
	}
	return s.index[lo-1]
}
