package seglog

import (
	"fmt"
	"path/filepath"
	"sort"
	"sync"
)

// Reads see every record written to the OS, which includes records not yet
// durable; compare with DurableLSN where that matters. A record appended but
// still in the append buffer is first pushed to the OS by Read and Scan.

// SegmentInfo describes one retained segment as its records stand in the
// file (records still in the append buffer are not counted).
type SegmentInfo struct {
	// Base is the LSN of the segment's first record; Last that of its last
	// written record (Base-1 when it has none).
	Base, Last uint64
	// Bytes is the size of its written records.
	Bytes int64
}

// Segments lists the retained segments, oldest first; the last one is the
// active segment. Retention policies use it to see what each segment pins.
func (l *Log) Segments() []SegmentInfo {
	l.segMu.RLock()
	defer l.segMu.RUnlock()
	out := make([]SegmentInfo, len(l.segs))
	for i, s := range l.segs {
		out[i] = SegmentInfo{Base: s.base, Last: s.last, Bytes: s.size - s.data}
	}
	return out
}

// Buffered returns the bytes of records appended and not yet written to
// the segment files.
func (l *Log) Buffered() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int64(len(l.buf))
}

// ensureWritten makes sure records up to lsn are in the segment files.
func (l *Log) ensureWritten(lsn uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closing {
		return ErrClosed
	}
	if lsn <= l.writtenLSN {
		return nil
	}
	return l.waitLocked(lsn, false)
}

// acquire finds the segment holding lsn and pins it for reading. It returns
// the index entry to start from and the segment's current written size.
func (l *Log) acquire(lsn uint64) (*segment, indexEntry, int64, bool) {
	l.segMu.RLock()
	defer l.segMu.RUnlock()
	i := sort.Search(len(l.segs), func(i int) bool { return l.segs[i].base > lsn }) - 1
	if i < 0 || lsn > l.segs[i].last {
		return nil, indexEntry{}, 0, false
	}
	s := l.segs[i]
	s.refs.Add(1)
	return s, s.seek(lsn), s.size, true
}

// Read returns the record with the given LSN as an owned copy. It finds the
// nearest sparse-index entry and scans forward at most IndexIntervalBytes
// plus one record, re-verifying the CRC of the record it returns.
func (l *Log) Read(lsn uint64) (Record, error) {
	if lsn == 0 {
		return Record{}, ErrNotFound
	}
	l.mu.Lock()
	next, closing := l.nextLSN, l.closing
	l.mu.Unlock()
	if closing {
		return Record{}, ErrClosed
	}
	if lsn >= next {
		return Record{}, ErrNotFound
	}
	if err := l.ensureWritten(lsn); err != nil {
		return Record{}, err
	}
	s, e, limit, ok := l.acquire(lsn)
	if !ok {
		return Record{}, ErrNotFound
	}
	defer s.release()
	var hbuf [headerBytes]byte
	hb := s.hdr()
	h := hbuf[:hb]
	off, cur := e.off, e.lsn
	for {
		if off+int64(hb) > limit {
			return Record{}, l.readCorrupt(s, off, cur, "index points past the written data")
		}
		if _, err := s.f.ReadAt(h, off); err != nil {
			return Record{}, fmt.Errorf("seglog: read %s: %w", s.name, err)
		}
		n := headerLength(h)
		if n > PayloadBytesMax || off+int64(hb)+int64(n) > limit {
			return Record{}, l.readCorrupt(s, off, cur, fmt.Sprintf("length %d out of range", n))
		}
		if cur < lsn {
			off += int64(hb) + int64(n)
			cur++
			continue
		}
		b := make([]byte, hb+int(n))
		if _, err := s.f.ReadAt(b, off); err != nil {
			return Record{}, fmt.Errorf("seglog: read %s: %w", s.name, err)
		}
		rec, _, err := s.decode(b)
		if err != nil {
			return Record{}, l.readCorrupt(s, off, cur, err.Error())
		}
		if rec.LSN != lsn {
			return Record{}, l.readCorrupt(s, off, cur, fmt.Sprintf("record carries lsn %d", rec.LSN))
		}
		return rec, nil
	}
}

func (l *Log) readCorrupt(s *segment, off int64, lsn uint64, reason string) error {
	return &CorruptionError{Segment: filepath.Base(s.name), FileOffset: off, LSN: lsn, Reason: reason}
}

var readerPool = sync.Pool{New: func() any { return &reader{buf: make([]byte, readChunkBytes)} }}

// Scan calls fn for every record from LSN from (0: the first retained) up to
// the last record appended before the call, in order, verifying each CRC. The
// payload is valid only during fn. An error from fn stops the scan and is
// returned. from below FirstLSN (other than 0) returns ErrNotFound, since
// those records were dropped. fn must not call DropBefore or Close.
func (l *Log) Scan(from uint64, fn func(Record) error) error {
	l.mu.Lock()
	upto, closing := l.nextLSN-1, l.closing
	l.mu.Unlock()
	if closing {
		return ErrClosed
	}
	return l.scan(from, upto, fn)
}

// ScanRange is Scan limited to LSNs [from, upto]: it pushes to the OS only
// the buffered records it needs, so a reader of old records does not make
// the committer write the newest ones early. upto beyond the last appended
// record is clamped to it.
func (l *Log) ScanRange(from, upto uint64, fn func(Record) error) error {
	l.mu.Lock()
	upto, closing := min(upto, l.nextLSN-1), l.closing
	l.mu.Unlock()
	if closing {
		return ErrClosed
	}
	return l.scan(from, upto, fn)
}

func (l *Log) scan(from, upto uint64, fn func(Record) error) error {
	if err := l.ensureWritten(upto); err != nil {
		return err
	}
	type pinned struct {
		s     *segment
		start indexEntry
		size  int64
	}
	var segs []pinned
	l.segMu.RLock()
	first := l.segs[0].base
	if from == 0 {
		from = first
	}
	if from < first {
		l.segMu.RUnlock()
		return fmt.Errorf("%w: lsn %d was dropped (first is %d)", ErrNotFound, from, first)
	}
	for _, s := range l.segs {
		if s.last < from || s.base > upto || s.last < s.base {
			continue
		}
		s.refs.Add(1)
		segs = append(segs, pinned{s: s, start: s.seek(max(from, s.base)), size: s.size})
	}
	l.segMu.RUnlock()
	defer func() {
		for _, p := range segs {
			p.s.release()
		}
	}()

	r := readerPool.Get().(*reader)
	defer func() { r.f = nil; readerPool.Put(r) }()
	for _, p := range segs {
		r.reset(p.s.f, p.size)
		off, lsn := p.start.off, p.start.lsn
		hb := p.s.hdr()
		for off < p.size && lsn <= upto {
			h, err := r.window(off, hb)
			if err != nil {
				return fmt.Errorf("seglog: read %s: %w", p.s.name, err)
			}
			if len(h) < hb {
				return l.readCorrupt(p.s, off, lsn, "header runs past written data")
			}
			n := headerLength(h)
			if n > PayloadBytesMax {
				return l.readCorrupt(p.s, off, lsn, fmt.Sprintf("length %d out of range", n))
			}
			b, err := r.window(off, hb+int(n))
			if err != nil {
				return fmt.Errorf("seglog: read %s: %w", p.s.name, err)
			}
			rec, size, err := p.s.decode(b)
			if err != nil {
				return l.readCorrupt(p.s, off, lsn, err.Error())
			}
			if rec.LSN != lsn {
				return l.readCorrupt(p.s, off, lsn, fmt.Sprintf("record carries lsn %d", rec.LSN))
			}
			if lsn >= from {
				if err := fn(rec); err != nil {
					return err
				}
			}
			off += int64(size)
			lsn++
		}
	}
	return nil
}

// DropBefore deletes whole segments, oldest first, whose every record has an
// LSN below lsn. The active segment is never deleted. Each removal is made
// durable (SyncDir) before the next, so a crash leaves the log missing only a
// prefix. It returns how many segments were removed.
func (l *Log) DropBefore(lsn uint64) (int, error) {
	l.dropMu.Lock()
	defer l.dropMu.Unlock()
	l.mu.Lock()
	closing := l.closing
	l.mu.Unlock()
	if closing {
		return 0, ErrClosed
	}
	l.segMu.Lock()
	var victims []*segment
	for len(l.segs) > 1 && l.segs[1].base <= lsn {
		victims = append(victims, l.segs[0])
		l.segs[0] = nil
		l.segs = l.segs[1:]
	}
	for _, v := range victims {
		v.dropped.Store(true)
	}
	newFirst, startTerm := l.segs[0].base, l.segs[0].prevTerm
	l.segMu.Unlock()
	if len(victims) > 0 {
		l.mu.Lock()
		l.trimTermsBefore(newFirst-1, startTerm)
		l.mu.Unlock()
	}
	for i, v := range victims {
		if v.refs.Load() == 0 {
			_ = v.closeOnce() // read-only; nothing durable depends on it
		}
		if err := l.fs.Remove(v.name); err != nil {
			return i, fmt.Errorf("seglog: remove %s: %w", v.name, err)
		}
		if err := l.fs.SyncDir(l.dir); err != nil {
			return i, fmt.Errorf("seglog: sync dir %s: %w", l.dir, err)
		}
	}
	return len(victims), nil
}
