package seglog

import (
	"fmt"
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
// A segment is a plain concatenation of records (see record.go); it has no
// file header. The active segment may be preallocated, in which case it ends
// in zero bytes after its last record. Other names in the directory are
// ignored.
const (
	segmentSuffix    = ".seg"
	segmentNameBytes = 20 + len(segmentSuffix)
)

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

	size  int64
	last  uint64 // LSN of the last record, base-1 when empty
	index []indexEntry

	refs    atomic.Int32
	dropped atomic.Bool // no longer in Log.segs; close when refs reach 0
	closed  atomic.Bool
}

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
		return indexEntry{lsn: s.base, off: 0}
	}
	return s.index[lo-1]
}
