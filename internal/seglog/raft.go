package seglog

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/sinewmq/sinew/internal/vfs"
)

// The raft-facing API: records are raft entries (LSN = raft index), each
// carries its term, a follower can overwrite a conflicting suffix, and a log
// can start after a snapshot at any index.

// ErrCompacted is returned (wrapped) for an index before the log's start
// point: FirstLSN-1 is the last index whose term is still known.
var ErrCompacted = errors.New("seglog: index is before the start of the log")

// ErrBadIndex is returned (wrapped) by AppendAt for an index past NextLSN
// and for a term below the term of the record before it.
var ErrBadIndex = errors.New("seglog: append index or term out of order")

// resetName is the temporary name of the empty segment that ResetTo writes
// before it removes the old segments; see finishReset.
const resetName = "reset.seg.tmp"

// logOp is a TruncateAfter or ResetTo for the committer to run.
type logOp struct {
	reset bool
	index uint64
	term  uint64 // ResetTo only
	done  bool
	err   error
}

// AppendAt appends a record at index with the given term. index == NextLSN
// appends. index < NextLSN first truncates every record >= index, durably,
// as TruncateAfter(index-1) does: a follower overwriting a conflicting
// suffix. index > NextLSN, an index at or before FirstLSN-1, or a term below
// the term of record index-1 returns an error wrapping ErrBadIndex (or
// ErrCompacted). Like Append, the record is durable only after Sync or
// Commit.
func (l *Log) AppendAt(index, term uint64, typ uint8, payload []byte) error {
	if len(payload) > PayloadBytesMax {
		return ErrRecordTooLarge
	}
	if term == 0 || index == 0 {
		return fmt.Errorf("%w: index %d term %d", ErrBadIndex, index, term)
	}
	pc := payloadCRC(payload)
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		if err := l.waitAppendable(); err != nil {
			return err
		}
		if index < l.nextLSN {
			if err := l.runOpLocked(&logOp{index: index - 1}); err != nil {
				return err
			}
			continue // re-check: another appender may have run meanwhile
		}
		break
	}
	if index > l.nextLSN {
		return fmt.Errorf("%w: index %d past the next index %d", ErrBadIndex, index, l.nextLSN)
	}
	if term < l.lastTerm {
		return fmt.Errorf("%w: term %d at index %d below term %d of the record before", ErrBadIndex, term, index, l.lastTerm)
	}
	_, err := l.appendLocked(term, typ, payload, pc)
	return err
}

// TruncateAfter removes every record with an LSN above index, so that the
// next record appended gets index+1. Records appended before the call are
// first written and synced; then later segments are removed (newest first,
// each removal made durable) and the segment holding index+1 is cut and
// synced. The cut is durable when TruncateAfter returns, before any later
// append reaches the disk, so a crash never brings a removed record back.
// index >= NextLSN-1 does nothing; index < FirstLSN-1 returns an error
// wrapping ErrCompacted. Appends wait while it runs. Readers must not read
// records above index concurrently.
func (l *Log) TruncateAfter(index uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.waitAppendable(); err != nil {
		return err
	}
	if index+1 >= l.nextLSN {
		return nil
	}
	return l.runOpLocked(&logOp{index: index})
}

// ResetTo discards the whole log and makes it an empty log that continues
// after a snapshot at (index, term): FirstLSN and NextLSN become index+1 and
// Term(index) returns term. It is durable when it returns: it writes and
// syncs an empty segment under a temporary name, removes every old segment
// and renames the new one into place; Open completes a reset that a crash
// interrupted after the new segment was durable and discards it otherwise.
// The HardState is not changed.
func (l *Log) ResetTo(index, term uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.waitAppendable(); err != nil {
		return err
	}
	return l.runOpLocked(&logOp{reset: true, index: index, term: term})
}

// runOpLocked hands op to the committer and waits for it. Caller holds mu,
// and no other op is pending (waitAppendable).
func (l *Log) runOpLocked(op *logOp) error {
	l.op = op
	l.kickCommitter()
	for !op.done {
		if l.exited {
			if l.op == op {
				l.op = nil
				l.cond.Broadcast()
			}
			return ErrClosed
		}
		l.cond.Wait()
	}
	return op.err
}

// Term returns the term of the record at index, for index in
// [FirstLSN-1, NextLSN-1]; FirstLSN-1 is the start point (the last record
// dropped, or the snapshot given to ResetTo), whose term the log keeps.
// Below that it returns an error wrapping ErrCompacted, above it ErrNotFound.
// It reads no file.
func (l *Log) Term(index uint64) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if index < l.terms[0].first {
		return 0, fmt.Errorf("%w: index %d, log starts after %d", ErrCompacted, index, l.terms[0].first)
	}
	if index >= l.nextLSN {
		return 0, fmt.Errorf("%w: index %d, next is %d", ErrNotFound, index, l.nextLSN)
	}
	return l.termAtLocked(index), nil
}

// LastTerm returns the term of record NextLSN-1 (of the start point when the
// log is empty).
func (l *Log) LastTerm() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastTerm
}

// termAtLocked returns the term of index, which must be in range.
func (l *Log) termAtLocked(index uint64) uint64 {
	i := sort.Search(len(l.terms), func(i int) bool { return l.terms[i].first > index }) - 1
	return l.terms[max(i, 0)].term
}

// trimTermsBefore makes start (with term startTerm) the log's start point
// after DropBefore. Caller holds mu.
func (l *Log) trimTermsBefore(start, startTerm uint64) {
	if start <= l.terms[0].first {
		return
	}
	i := sort.Search(len(l.terms), func(i int) bool { return l.terms[i].first > start })
	l.terms = append([]termRun{{first: start, term: startTerm}}, l.terms[i:]...)
}

// runOp runs a pending TruncateAfter or ResetTo. Committer only: it owns the
// segment files' writes. Everything appended before the op is written and
// synced first, so waiters on those records are answered before the records
// change, and no buffered record is left to write after the cut.
func (l *Log) runOp() {
	l.mu.Lock()
	op := l.op
	l.mu.Unlock()
	if op == nil {
		return
	}
	for l.commitOnce(true) {
	}
	l.mu.Lock()
	if l.err != nil || l.writtenLSN != l.nextLSN-1 || l.durableLSN != l.nextLSN-1 || len(l.buf) > 0 {
		err := l.err
		if err == nil {
			err = failed("truncate", errors.New("records left unsynced before the cut"))
			l.err = err
		}
		op.err, op.done, l.op = err, true, nil
		l.cond.Broadcast()
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()

	l.dropMu.Lock() // no DropBefore while the segment list is rebuilt
	var err error
	if op.reset {
		err = l.reset(op.index, op.term)
	} else {
		err = l.truncate(op.index)
	}
	l.dropMu.Unlock()

	l.mu.Lock()
	if err != nil && !errors.Is(err, ErrCompacted) {
		l.err = failed("truncate", err)
		err = l.err
		l.log.Error("seglog: I/O failure; the log refuses further writes", "err", err)
	}
	op.err, op.done, l.op = err, true, nil
	l.cond.Broadcast()
	l.mu.Unlock()
}

// truncate cuts the log after index. Committer only, under dropMu, with
// every record written and synced.
func (l *Log) truncate(index uint64) error {
	l.segMu.RLock()
	segs := append([]*segment(nil), l.segs...)
	l.segMu.RUnlock()
	if index+1 < segs[0].base {
		return fmt.Errorf("%w: cannot truncate after %d, the log starts at %d", ErrCompacted, index, segs[0].base)
	}
	ci := sort.Search(len(segs), func(i int) bool { return segs[i].base > index+1 }) - 1
	c := segs[ci]
	off, err := l.offsetOf(c, index+1)
	if err != nil {
		return err
	}
	// Newest first, each removal durable before the next, so a crash
	// leaves a log that is a prefix of the old one.
	for j := len(segs) - 1; j > ci; j-- {
		d := segs[j]
		l.segMu.Lock()
		l.segs = l.segs[:j]
		l.segMu.Unlock()
		d.dropped.Store(true)
		if d.refs.Load() == 0 {
			_ = d.closeOnce()
		}
		if err := l.fs.Remove(d.name); err != nil {
			return fmt.Errorf("remove %s: %w", d.name, err)
		}
		if err := l.fs.SyncDir(l.dir); err != nil {
			return fmt.Errorf("sync dir %s: %w", l.dir, err)
		}
	}
	if err := c.f.Truncate(off); err != nil {
		return fmt.Errorf("truncate %s: %w", c.name, err)
	}
	if err := c.f.Sync(); err != nil {
		return fmt.Errorf("fdatasync %s: %w", c.name, err)
	}
	l.segMu.Lock()
	c.size, c.last = off, index
	k := sort.Search(len(c.index), func(i int) bool { return c.index[i].lsn > index })
	c.index = c.index[:k]
	l.segMu.Unlock()
	l.active = c
	l.activeFile = off

	l.mu.Lock()
	l.nextLSN = index + 1
	l.writtenLSN, l.durableLSN = index, index
	l.wantDurable, l.wantWritten = min(l.wantDurable, index), min(l.wantWritten, index)
	l.tailOff = off
	l.lastIdxOff = c.data
	if n := len(c.index); n > 0 {
		l.lastIdxOff = c.index[n-1].off
	}
	i := sort.Search(len(l.terms), func(i int) bool { return l.terms[i].first > index })
	l.terms = l.terms[:max(i, 1)]
	l.lastTerm = l.terms[len(l.terms)-1].term
	l.mu.Unlock()
	return nil
}

// offsetOf returns the file offset of record lsn in s, or s.size when lsn is
// s.last+1. It walks record headers from the nearest index entry.
func (l *Log) offsetOf(s *segment, lsn uint64) (int64, error) {
	l.segMu.RLock()
	e, size, last := s.seek(lsn), s.size, s.last
	l.segMu.RUnlock()
	if lsn == last+1 {
		return size, nil
	}
	hb := s.hdr()
	h := make([]byte, hb)
	off, cur := e.off, e.lsn
	for cur < lsn {
		if _, err := s.f.ReadAt(h, off); err != nil && !errors.Is(err, io.EOF) {
			return 0, fmt.Errorf("read %s: %w", s.name, err)
		}
		off += int64(hb) + int64(headerLength(h))
		cur++
		if off > size {
			return 0, l.readCorrupt(s, off, cur, "record runs past the written data")
		}
	}
	return off, nil
}

// reset replaces the log with an empty one after (index, term). Committer
// only, under dropMu, with every record written and synced.
func (l *Log) reset(index, term uint64) error {
	tmp := filepath.Join(l.dir, resetName)
	f, err := l.fs.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_RDWR, vfs.FilePerm)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	if _, err := f.WriteAt(encodeSegHeader(index+1, term), 0); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("fdatasync %s: %w", tmp, err)
	}
	if err := l.fs.SyncDir(l.dir); err != nil {
		_ = f.Close()
		return fmt.Errorf("sync dir %s: %w", l.dir, err)
	}
	// From here on the reset is decided: Open would complete it.
	if err := l.replaceAllSegments(tmp, index+1); err != nil {
		_ = f.Close()
		return err
	}
	s := &segment{base: index + 1, name: filepath.Join(l.dir, SegmentName(index+1)), f: f, last: index,
		v2: true, data: segHeaderBytes, prevTerm: term, size: segHeaderBytes}
	l.segMu.Lock()
	old := l.segs
	l.segs = []*segment{s}
	l.segMu.Unlock()
	for _, d := range old {
		d.dropped.Store(true)
		if d.refs.Load() == 0 {
			_ = d.closeOnce()
		}
	}
	l.active = s
	l.activeFile = segHeaderBytes

	l.mu.Lock()
	l.nextLSN = index + 1
	l.writtenLSN, l.durableLSN = index, index
	l.wantDurable, l.wantWritten = min(l.wantDurable, index), min(l.wantWritten, index)
	l.tailOff, l.lastIdxOff = segHeaderBytes, segHeaderBytes
	l.terms = []termRun{{first: index, term: term}}
	l.lastTerm = term
	l.mu.Unlock()
	return nil
}
