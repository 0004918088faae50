package seglog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/sinewmq/sinew/internal/vfs"
)

// Recovery. Open first finishes an interrupted ResetTo (resetName present
// with a valid header: the reset was decided, so it is completed; otherwise
// the partial file is deleted and the old log stands). Then it reads the
// header of every retained segment:
//
//	segment header                               segment   verdict
//	------------------------------------------   -------   ---------------------------
//	valid version-2 header for the file's base   any       version 2
//	file shorter than a header, all zero or a    last      creation cut short: the
//	  prefix of the magic; or all zero                       header is rewritten
//	magic with a bad CRC, wrong base or an       any       corruption
//	  unknown version
//	anything else                                any       version 1 (records from 0)
//
// and then every record: length in range, CRC32C, the LSN it carries equals
// the next LSN expected (so segments must continue exactly where the previous
// one ended) and its term is not below the term before it (a segment's
// header term counts as the term before its first record). On the first
// record that fails it decides between a torn tail and corruption:
//
//	bytes from the bad record to EOF        segment   verdict
//	-------------------------------------   -------   -------------------------
//	all zero                                 any       clean end (preallocation)
//	header or record runs past EOF           last      torn: truncate there
//	record's own tail is zeros, then only    last      torn: truncate there
//	  zeros to EOF (a cut-short write into
//	  a preallocated file)
//	anything else (complete record with a    any       corruption
//	  bad CRC, a wrong LSN, an impossible
//	  length, data after the bad record)
//
// A torn verdict is overridden to corruption if a valid record with the
// following LSN appears after the bad one: a bad record followed by valid data
// is damage, never a tail. Torn bytes were never acknowledged, because
// acknowledgement waits for fdatasync of every byte up to the record.

// badSpot describes the first record that failed verification.
type badSpot struct {
	off    int64
	lsn    uint64
	reason string
	// pastEOF: the header or the record it declares runs past EOF.
	pastEOF bool
	// recEnd is the end offset the header declares, or -1 if unusable.
	recEnd int64
}

// verdict of verifying one segment.
type segResult struct {
	end  int64    // offset just after the last good record
	bad  *badSpot // nil: clean end
	torn bool     // bad is a torn tail (last segment only)
	z    int64    // end of non-zero data at/after bad.off
}

func (l *Log) recover() error {
	names, err := l.fs.ReadDir(l.dir)
	if err != nil {
		return fmt.Errorf("seglog: read dir %s: %w", l.dir, err)
	}
	var bases []uint64
	for _, n := range names {
		if n == resetName {
			done, err := l.finishReset()
			if err != nil {
				return err
			}
			if done {
				return l.recover() // the directory changed: list it again
			}
			continue
		}
		if b, ok := parseSegmentName(n); ok {
			bases = append(bases, b)
		}
		if n == preparedName { // an unfinished preparation; redone later
			if err := l.fs.Remove(filepath.Join(l.dir, n)); err != nil {
				return fmt.Errorf("seglog: remove %s: %w", n, err)
			}
		}
	}
	rep := &l.report
	if len(bases) == 0 {
		s, err := l.createSegment(1, 0)
		if err != nil {
			return err
		}
		l.segs = []*segment{s}
		l.active = s
		l.nextLSN = 1
		l.terms = []termRun{{first: 0, term: 0}}
		l.tailOff, l.lastIdxOff = s.size, s.size
		*rep = RecoveryReport{Segments: 1, FirstLSN: 1, LastLSN: 0}
		return nil
	}
	for _, b := range bases {
		// Every segment is opened for writing: TruncateAfter may cut a
		// sealed one and make it active again.
		name := filepath.Join(l.dir, SegmentName(b))
		f, err := l.fs.OpenFile(name, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("seglog: open %s: %w", name, err)
		}
		l.segs = append(l.segs, &segment{base: b, name: name, f: f, last: b - 1})
	}

	// The read buffer comes from the pool Scan uses: a node opening
	// thousands of partitions at a restart would otherwise allocate and
	// clear a chunk per partition.
	r := readerPool.Get().(*reader)
	defer func() { r.f = nil; readerPool.Put(r) }()
	for i, s := range l.segs {
		last := i == len(l.segs)-1
		// The term before this segment: known from the previous one, or
		// (for the first) from its header; a version-1 log has term 1
		// throughout, and 0 before lsn 1.
		prevTerm := uint64(1)
		if i > 0 {
			prevTerm = l.lastTerm
		} else if s.base == 1 {
			prevTerm = 0
		}
		if cerr, err := l.readSegHeader(s, last, prevTerm); err != nil {
			return err
		} else if cerr != nil {
			if i == 0 {
				return l.cutAll(cerr)
			}
			return l.cut(i-1, l.segs[i-1].size, cerr)
		}
		if i == 0 {
			l.terms = []termRun{{first: s.base - 1, term: s.prevTerm}}
			l.lastTerm = s.prevTerm
		} else if s.v2 && s.prevTerm != l.lastTerm {
			prev := l.segs[i-1]
			cerr := &CorruptionError{
				Segment: filepath.Base(s.name), FileOffset: 0, LSN: s.base,
				Reason: fmt.Sprintf("segment header says the term before lsn %d is %d, but the previous segment ends in term %d",
					s.base, s.prevTerm, l.lastTerm),
			}
			return l.cut(i-1, prev.size, cerr)
		}
		if i > 0 {
			prev := l.segs[i-1]
			if s.base != prev.last+1 {
				cerr := &CorruptionError{
					Segment: filepath.Base(prev.name), FileOffset: prev.size, LSN: prev.last + 1,
					Reason: fmt.Sprintf("segment ends before lsn %d but the next segment %s starts at lsn %d",
						prev.last+1, filepath.Base(s.name), s.base),
				}
				return l.cut(i-1, prev.size, cerr)
			}
		}
		res, err := l.verifySegment(s, last, r)
		if err != nil {
			return err
		}
		rep.Records += s.last - s.base + 1
		rep.Bytes += s.size - s.data
		if res.bad == nil {
			continue
		}
		if res.torn {
			rep.TornBytes = res.z - res.end
			rep.Truncated = true
			l.log.Warn("seglog: repairing torn tail", "segment", filepath.Base(s.name),
				"offset", res.end, "lsn", res.bad.lsn, "torn_bytes", rep.TornBytes, "reason", res.bad.reason)
			if err := l.truncateSegment(s, res.end); err != nil {
				return err
			}
			break
		}
		cerr := &CorruptionError{Segment: filepath.Base(s.name), FileOffset: res.bad.off, LSN: res.bad.lsn, Reason: res.bad.reason}
		return l.cut(i, res.end, cerr)
	}
	return l.finishRecovery()
}

// cut applies the corruption policy to damage found in segment i at off.
func (l *Log) cut(i int, off int64, cerr *CorruptionError) error {
	if l.opts.Corruption != CorruptionTruncate {
		return cerr
	}
	rep := &l.report
	l.log.Error("seglog: CORRUPTION: cutting the log at the first bad record; every later record is lost",
		"segment", cerr.Segment, "offset", cerr.FileOffset, "lsn", cerr.LSN, "reason", cerr.Reason,
		"dropped_segments", len(l.segs)-i-1)
	rep.Corruption = cerr
	rep.Truncated = true
	s := l.segs[i]
	// Cut the damaged segment first, then delete later ones newest first, so
	// an interrupted cut leaves a log that a second Open cuts the same way.
	if err := l.truncateSegment(s, off); err != nil {
		return err
	}
	for j := len(l.segs) - 1; j > i; j-- {
		d := l.segs[j]
		_ = d.f.Close()
		if err := l.fs.Remove(d.name); err != nil {
			return fmt.Errorf("seglog: remove %s: %w", d.name, err)
		}
		rep.DroppedSegments++
	}
	if len(l.segs)-1 > i {
		if err := l.fs.SyncDir(l.dir); err != nil {
			return fmt.Errorf("seglog: sync dir %s: %w", l.dir, err)
		}
	}
	l.segs = l.segs[:i+1]
	// Records of the cut segment were counted only up to the damage.
	return l.finishRecovery()
}

// cutAll handles damage in the first segment's header: under
// CorruptionTruncate the whole log is cut, leaving an empty log that starts
// where the first segment did.
func (l *Log) cutAll(cerr *CorruptionError) error {
	s := l.segs[0]
	s.v2, s.data, s.size, s.last, s.index = false, 0, 0, s.base-1, nil
	s.prevTerm = 1
	if s.base == 1 {
		s.prevTerm = 0
	}
	l.terms = []termRun{{first: s.base - 1, term: s.prevTerm}}
	l.lastTerm = s.prevTerm
	return l.cut(0, 0, cerr) // finishRecovery rewrites the empty segment as version 2
}

// readSegHeader classifies segment s by its first bytes (see the table at
// the top of this file) and sets s.v2, s.data, s.prevTerm and s.size.
// prevTerm is the term before the segment as far as recovery knows, used for
// version-1 segments and for rewriting a header whose creation was cut
// short. Damage comes back as a *CorruptionError; I/O errors as err.
func (l *Log) readSegHeader(s *segment, last bool, prevTerm uint64) (*CorruptionError, error) {
	fi, err := s.f.Stat()
	if err != nil {
		return nil, fmt.Errorf("seglog: stat %s: %w", s.name, err)
	}
	size := fi.Size()
	b := make([]byte, min(size, segHeaderBytes))
	if k, err := s.f.ReadAt(b, 0); err != nil && !(errors.Is(err, io.EOF) && k == len(b)) {
		return nil, fmt.Errorf("seglog: read %s: %w", s.name, err)
	}
	corrupt := func(reason string) *CorruptionError {
		return &CorruptionError{Segment: filepath.Base(s.name), FileOffset: 0, LSN: s.base, Reason: reason}
	}
	hasMagic := len(b) >= len(segMagic) && [8]byte(b[:8]) == segMagic
	if hasMagic && len(b) == segHeaderBytes {
		base, pt, err := DecodeSegmentHeader(b)
		if err != nil {
			return corrupt("bad segment header: " + err.Error()), nil
		}
		if base != s.base {
			return corrupt(fmt.Sprintf("segment header says base %d", base)), nil
		}
		s.v2, s.data, s.prevTerm, s.size = true, segHeaderBytes, pt, segHeaderBytes
		return nil, nil
	}
	fresh := false
	if last {
		z, err := nonZeroEnd(s.f, 0, size)
		if err != nil {
			return nil, fmt.Errorf("seglog: read %s: %w", s.name, err)
		}
		_, _, v1err := DecodeRecordV1(b)
		fresh = z == 0 || (size < segHeaderBytes && v1err != nil &&
			bytes.HasPrefix(segMagic[:], b[:min(len(b), len(segMagic))]))
	}
	switch {
	case fresh:
		// A new segment whose header never became durable (or an empty,
		// possibly preallocated, version-1 active segment): it holds no
		// record, so it is rewritten as an empty version-2 segment.
		l.log.Warn("seglog: rewriting the header of an empty last segment", "segment", filepath.Base(s.name), "bytes", size)
		if err := s.f.Truncate(0); err != nil {
			return nil, fmt.Errorf("seglog: truncate %s: %w", s.name, err)
		}
		if _, err := s.f.WriteAt(encodeSegHeader(s.base, prevTerm), 0); err != nil {
			return nil, fmt.Errorf("seglog: write header %s: %w", s.name, err)
		}
		if err := s.f.Sync(); err != nil {
			return nil, fmt.Errorf("seglog: fdatasync %s: %w", s.name, err)
		}
		s.v2, s.data, s.prevTerm, s.size = true, segHeaderBytes, prevTerm, segHeaderBytes
	case hasMagic:
		return corrupt("segment header runs past end of file"), nil
	default:
		s.v2, s.data, s.prevTerm, s.size = false, 0, prevTerm, 0
	}
	return nil, nil
}

// finishReset completes or discards an interrupted ResetTo (see log.go) and
// reports whether it completed one.
func (l *Log) finishReset() (bool, error) {
	tmp := filepath.Join(l.dir, resetName)
	f, err := l.fs.OpenFile(tmp, os.O_RDONLY, 0)
	if err != nil {
		return false, fmt.Errorf("seglog: open %s: %w", tmp, err)
	}
	b := make([]byte, segHeaderBytes)
	k, rerr := f.ReadAt(b, 0)
	_ = f.Close()
	base, _, herr := DecodeSegmentHeader(b[:k])
	if rerr != nil && !errors.Is(rerr, io.EOF) {
		return false, fmt.Errorf("seglog: read %s: %w", tmp, rerr)
	}
	if herr != nil {
		// The reset never became durable, so no old segment was removed.
		if err := l.fs.Remove(tmp); err != nil {
			return false, fmt.Errorf("seglog: remove %s: %w", tmp, err)
		}
		return false, nil
	}
	l.log.Warn("seglog: completing an interrupted reset", "base", base)
	return true, l.replaceAllSegments(tmp, base)
}

// replaceAllSegments removes every segment file, newest first, and renames
// tmp (a synced, empty version-2 segment) to the segment name of base.
func (l *Log) replaceAllSegments(tmp string, base uint64) error {
	names, err := l.fs.ReadDir(l.dir)
	if err != nil {
		return fmt.Errorf("seglog: read dir %s: %w", l.dir, err)
	}
	for i := len(names) - 1; i >= 0; i-- {
		if _, ok := parseSegmentName(names[i]); ok {
			if err := l.fs.Remove(filepath.Join(l.dir, names[i])); err != nil {
				return fmt.Errorf("seglog: remove %s: %w", names[i], err)
			}
		}
	}
	if err := l.fs.Rename(tmp, filepath.Join(l.dir, SegmentName(base))); err != nil {
		return fmt.Errorf("seglog: rename %s: %w", tmp, err)
	}
	if err := l.fs.SyncDir(l.dir); err != nil {
		return fmt.Errorf("seglog: sync dir %s: %w", l.dir, err)
	}
	return nil
}

// truncateSegment cuts s's file at off durably.
func (l *Log) truncateSegment(s *segment, off int64) error {
	if err := s.f.Truncate(off); err != nil {
		return fmt.Errorf("seglog: truncate %s: %w", s.name, err)
	}
	if err := s.f.Sync(); err != nil {
		return fmt.Errorf("seglog: fdatasync %s: %w", s.name, err)
	}
	return nil
}

// finishRecovery sets up the append state from the verified segments. A
// version-1 active segment is replaced: rewritten in place as version 2 if
// it holds no record, else sealed and followed by a new version-2 segment,
// so that every record appended from now on is version 2.
func (l *Log) finishRecovery() error {
	s := l.segs[len(l.segs)-1]
	l.active = s
	fi, err := s.f.Stat()
	if err != nil {
		return fmt.Errorf("seglog: stat %s: %w", s.name, err)
	}
	l.activeFile = fi.Size()
	if !s.v2 && s.last < s.base {
		if err := s.f.Truncate(0); err != nil {
			return fmt.Errorf("seglog: truncate %s: %w", s.name, err)
		}
		if _, err := s.f.WriteAt(encodeSegHeader(s.base, s.prevTerm), 0); err != nil {
			return fmt.Errorf("seglog: write header %s: %w", s.name, err)
		}
		if err := s.f.Sync(); err != nil {
			return fmt.Errorf("seglog: fdatasync %s: %w", s.name, err)
		}
		s.v2, s.data, s.size, s.index = true, segHeaderBytes, segHeaderBytes, nil
		l.activeFile = segHeaderBytes
	} else if !s.v2 {
		if err := l.roll(s.last+1, l.lastTerm); err != nil {
			return err
		}
		s = l.active
	}
	// PreallocReserve reserves as writes arrive (reserve), so a restart of
	// an idle log allocates nothing.
	if l.opts.Preallocate == PreallocZero && s.size < l.opts.SegmentBytes {
		// Write the zeros now; the preparer covers the following segments.
		if err := zeroFill(s.f, s.size, l.opts.SegmentBytes); err != nil {
			return fmt.Errorf("seglog: zero-fill %s: %w", s.name, err)
		}
		l.activeFile = max(l.activeFile, l.opts.SegmentBytes)
	}
	l.nextLSN = s.last + 1
	l.writtenLSN, l.durableLSN = s.last, s.last
	l.tailOff = s.size
	l.lastIdxOff = s.data
	if n := len(s.index); n > 0 {
		l.lastIdxOff = s.index[n-1].off
	}
	l.startPreparing()
	rep := &l.report
	rep.Segments = len(l.segs)
	rep.FirstLSN = l.segs[0].base
	rep.LastLSN = s.last
	return nil
}

// verifySegment checks every record of s, fills in s.size, s.last and
// s.index, replays records and classifies the first bad one, if any.
func (l *Log) verifySegment(s *segment, last bool, r *reader) (segResult, error) {
	fi, err := s.f.Stat()
	if err != nil {
		return segResult{}, fmt.Errorf("seglog: stat %s: %w", s.name, err)
	}
	size := fi.Size()
	r.reset(s.f, size)
	off, lsn := s.data, s.base
	lastIdx := s.data
	interval := int64(l.opts.IndexIntervalBytes)
	hb := s.hdr()
	var bad *badSpot
	for {
		h, err := r.window(off, hb)
		if err != nil {
			return segResult{}, fmt.Errorf("seglog: read %s: %w", s.name, err)
		}
		if len(h) == 0 {
			break
		}
		if len(h) < hb {
			bad = &badSpot{off: off, lsn: lsn, reason: "header runs past end of file", pastEOF: true, recEnd: -1}
			break
		}
		n := headerLength(h)
		if n > PayloadBytesMax {
			bad = &badSpot{off: off, lsn: lsn, reason: fmt.Sprintf("length %d out of range", n), recEnd: -1}
			break
		}
		recEnd := off + int64(hb) + int64(n)
		b, err := r.window(off, hb+int(n))
		if err != nil {
			return segResult{}, fmt.Errorf("seglog: read %s: %w", s.name, err)
		}
		if len(b) < hb+int(n) {
			bad = &badSpot{off: off, lsn: lsn, reason: "record runs past end of file", pastEOF: true, recEnd: recEnd}
			break
		}
		rec, _, err := s.decode(b)
		if err != nil {
			bad = &badSpot{off: off, lsn: lsn, reason: "checksum mismatch", recEnd: recEnd}
			break
		}
		if rec.LSN != lsn {
			bad = &badSpot{off: off, lsn: lsn, reason: fmt.Sprintf("record carries lsn %d", rec.LSN), recEnd: recEnd}
			break
		}
		if rec.Term < l.lastTerm {
			bad = &badSpot{off: off, lsn: lsn, reason: fmt.Sprintf("record term %d below the previous term %d", rec.Term, l.lastTerm), recEnd: recEnd}
			break
		}
		if rec.Term != l.lastTerm {
			l.terms = append(l.terms, termRun{first: lsn, term: rec.Term})
			l.lastTerm = rec.Term
		}
		if off == s.data || off-lastIdx >= interval {
			s.index = append(s.index, indexEntry{lsn: lsn, off: off})
			lastIdx = off
		}
		if l.opts.Replay != nil && lsn >= l.opts.ReplayFrom {
			if err := l.opts.Replay(rec); err != nil {
				return segResult{}, fmt.Errorf("seglog: replay lsn %d: %w", lsn, err)
			}
			l.report.Replayed++
		}
		off, lsn = recEnd, lsn+1
	}
	s.size, s.last = off, lsn-1
	res := segResult{end: off, bad: bad}
	if bad == nil {
		return res, nil
	}
	z, err := nonZeroEnd(s.f, off, size)
	if err != nil {
		return segResult{}, fmt.Errorf("seglog: read %s: %w", s.name, err)
	}
	res.z = z
	if z == off { // nothing but zeros from here: a preallocated tail
		res.bad = nil
		return res, nil
	}
	if !last {
		return res, nil
	}
	torn := bad.pastEOF || (bad.recEnd >= 0 && z < bad.recEnd)
	if torn {
		// Beyond z there are only zeros, which never form a record.
		followed, err := validRecordAfter(s.f, off+1, z, lsn+1, s.v2)
		if err != nil {
			return segResult{}, fmt.Errorf("seglog: read %s: %w", s.name, err)
		}
		if followed {
			bad.reason += "; valid records follow"
			torn = false
		}
	}
	res.torn = torn
	return res, nil
}

// zeroChunkBytes is nonZeroEnd's read size; zeroChunk is that many zeros
// to compare with (never written).
const zeroChunkBytes = 256 << 10

var (
	zeroChunk    = make([]byte, zeroChunkBytes)
	zeroReadPool = sync.Pool{New: func() any { b := make([]byte, zeroChunkBytes); return &b }}
)

// nonZeroEnd returns the offset just past the last non-zero byte of f in
// [from, size), or from if the range is all zeros. The holes and the
// reserved, never written space the file system reports (vfs.NextData:
// the tail of a segment whose reservation a crash left in place) are not
// read. The read buffer is pooled: a restart after a crash calls this for
// every partition's active segment.
func nonZeroEnd(f vfs.File, from, size int64) (int64, error) {
	bp := zeroReadPool.Get().(*[]byte)
	defer zeroReadPool.Put(bp)
	buf := *bp
	end := from
	for off := from; off < size; {
		next, ok, err := vfs.NextData(f, off)
		if err != nil {
			return 0, err
		}
		if !ok || next >= size {
			break // zeros up to size
		}
		off = max(off, next)
		n := int(min(int64(len(buf)), size-off))
		k, err := f.ReadAt(buf[:n], off)
		if k < n {
			if err != nil && !errors.Is(err, io.EOF) {
				return 0, err
			}
			n = k
		}
		if n == 0 {
			break
		}
		if !bytes.Equal(buf[:n], zeroChunk[:n]) {
			i := n - 1
			for buf[i] == 0 {
				i--
			}
			end = off + int64(i) + 1
		}
		off += int64(n)
	}
	return end, nil
}

// validRecordAfter reports whether a record carrying lsn, with a good CRC,
// starts anywhere in f at or after from. It looks for the LSN's bytes at a
// header's LSN position and checks candidates, so it reads the range once.
func validRecordAfter(f interface {
	ReadAt([]byte, int64) (int, error)
}, from, size int64, lsn uint64, v2 bool) (bool, error) {
	if size-from < int64(recHeaderBytes(v2)) {
		return false, nil
	}
	data := make([]byte, size-from)
	if k, err := f.ReadAt(data, from); err != nil && !(errors.Is(err, io.EOF) && k == len(data)) {
		return false, err
	}
	var pat [8]byte
	binary.LittleEndian.PutUint64(pat[:], lsn)
	for i := 8; i+8 <= len(data); {
		j := bytes.Index(data[i:], pat[:])
		if j < 0 {
			return false, nil
		}
		start := i + j - 8
		if rec, _, err := decodeRecord(data[start:], v2); err == nil && rec.LSN == lsn {
			return true, nil
		}
		i += j + 1
	}
	return false, nil
}

// reader serves sequential windows of a file from one reusable buffer.
type reader struct {
	f interface {
		ReadAt([]byte, int64) (int, error)
	}
	size  int64
	buf   []byte
	start int64 // file offset of buf[0]
	n     int   // valid bytes in buf
}

func (r *reader) reset(f interface {
	ReadAt([]byte, int64) (int, error)
}, size int64) {
	r.f, r.size, r.start, r.n = f, size, 0, 0
}

// window returns the bytes at [off, off+want), or fewer at EOF. Offsets must
// not go backwards. The slice is valid until the next call.
func (r *reader) window(off int64, want int) ([]byte, error) {
	if off >= r.start && off+int64(want) <= r.start+int64(r.n) {
		i := int(off - r.start)
		return r.buf[i : i+want], nil
	}
	if off >= r.start && off <= r.start+int64(r.n) {
		r.n = copy(r.buf, r.buf[off-r.start:r.n])
	} else {
		r.n = 0
	}
	r.start = off
	if want > len(r.buf) {
		nb := make([]byte, want)
		copy(nb, r.buf[:r.n])
		r.buf = nb
	}
	for r.n < len(r.buf) && r.start+int64(r.n) < r.size {
		m := int(min(int64(len(r.buf)), r.size-r.start))
		k, err := r.f.ReadAt(r.buf[r.n:m], r.start+int64(r.n))
		r.n += k
		if err != nil {
			if errors.Is(err, io.EOF) {
				r.size = r.start + int64(r.n) // the file is shorter than it was
				break
			}
			return nil, err
		}
		if k == 0 {
			break
		}
	}
	return r.buf[:min(want, r.n)], nil
}
