package seglog

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
)

// SyncPolicy says when Commit may return.
type SyncPolicy int

const (
	// SyncAlways (the default): Commit and Sync return only after fdatasync
	// has covered the record. Concurrent callers share one fdatasync per
	// batch (group commit).
	SyncAlways SyncPolicy = iota
	// SyncInterval: Commit returns once the record is written to the OS;
	// fdatasync runs every SyncIntervalMs. A process crash loses nothing,
	// but power loss loses up to one interval of acknowledged records.
	SyncInterval
	// SyncManual: for a log whose records are made durable elsewhere (the
	// node journal). Records are written to the OS in large batches: when
	// half the buffer is full, every SyncIntervalMs, when read, and on
	// Flush. fdatasync runs only on Sync, at a segment roll and at Close;
	// the writeback of what is written starts every 1 MiB (writeBehind), so
	// that sync has little left to write. Commit returns once the record is
	// written to the OS.
	SyncManual
)

// CorruptionPolicy says what Open does when verification finds damage that
// is not a torn tail.
type CorruptionPolicy int

const (
	// CorruptionStop (the default): Open fails with *CorruptionError and
	// changes nothing on disk.
	CorruptionStop CorruptionPolicy = iota
	// CorruptionTruncate: Open cuts the log at the first bad record,
	// deleting it and everything after it, logs an error and reports the
	// cut in RecoveryReport. Acknowledged records after the damage are lost.
	CorruptionTruncate
)

// PreallocMode says how a segment's SegmentBytes are laid out before
// records are written into them. When the size is already final, fdatasync
// need not commit a size change with every batch.
type PreallocMode int

const (
	// PreallocReserve (the default): fallocate(2) the active segment ahead
	// of its writes in growing steps: nothing when it is created, then
	// whenever a write would pass the reservation, a step as large as the
	// segment already is (at least reserveStepMinBytes, at most
	// reserveStepMaxBytes, never past SegmentBytes unless one record needs
	// it). The size then changes once per step instead of once per batch,
	// while an idle or empty segment holds kilobytes, not SegmentBytes.
	// On ext4/xfs the first write to each block still converts an
	// "unwritten" extent, which fdatasync must journal (measured in
	// docs/benchmarks.md). The unused reservation is cut at roll and Close.
	PreallocReserve PreallocMode = iota
	// PreallocNone: segments grow with each write.
	PreallocNone
	// PreallocZero: a background goroutine writes the next segment full of
	// zeros and syncs it before it is needed, so appends overwrite
	// allocated, written blocks and fdatasync flushes data only. It costs
	// one extra write of every segment, and every open log holds two whole
	// segments of disk (the active one, zero-filled at Open, and the
	// prepared next one) however little it stores.
	PreallocZero
)

// preparedName is the file PreallocZero fills ahead of time; it is renamed
// to its segment name at roll. A leftover one is deleted at Open.
const preparedName = "next.seg.tmp"

// Defaults and bounds for Options.
const (
	// SegmentBytesDefault is the default Options.SegmentBytes.
	SegmentBytesDefault = 64 << 20
	segmentBytesMin     = 4 << 10
	// IndexIntervalBytesDefault is the default Options.IndexIntervalBytes.
	IndexIntervalBytesDefault = 4 << 10
	// SyncIntervalMsDefault is the default Options.SyncIntervalMs.
	SyncIntervalMsDefault = 100
	// BufferBytesDefault is the default Options.BufferBytes.
	BufferBytesDefault = 4 << 20
	// readChunkBytes is the unit of sequential reads in recovery and Scan.
	readChunkBytes = 1 << 20
	// reserveStepMinBytes and reserveStepMaxBytes bound one PreallocReserve
	// step. The step is the segment's current size, so the number of size
	// changes per segment is logarithmic up to the maximum and then one per
	// reserveStepMaxBytes (about 14 per 64 MiB segment), and the unused
	// reservation never exceeds what the segment already holds (or the
	// minimum).
	reserveStepMinBytes = 64 << 10
	reserveStepMaxBytes = 8 << 20
)

// Options configure Open. FS and Dir are required.
type Options struct {
	// FS is the file system; Dir the log's directory, created if missing.
	FS  vfs.FS
	Dir string
	// SegmentBytes is the size at which the active segment rolls. A record
	// larger than this gets a segment of its own. Default 64 MiB, min 4 KiB.
	SegmentBytes int64
	// IndexIntervalBytes is the spacing of the sparse in-memory index, which
	// bounds how far Read scans. Default 4 KiB.
	IndexIntervalBytes int
	// Sync picks the durability policy; SyncIntervalMs applies to
	// SyncInterval (default 100).
	Sync SyncPolicy
	// SyncIntervalMs is the fsync period under SyncInterval.
	SyncIntervalMs int
	// Preallocate picks how segment files get their space; see
	// PreallocMode. Default PreallocReserve.
	Preallocate PreallocMode
	// SurvivorsDurable says that everything in the log's directory is
	// already durable (the node synced its whole file system at start,
	// vfs.SyncAll), so what a crashed process left need not be synced
	// file by file at Open.
	SurvivorsDurable bool
	// BufferBytes bounds the records appended but not yet handed to the OS;
	// Append blocks while the buffer is full. Default 4 MiB.
	BufferBytes int
	// Corruption picks what Open does on damage; see CorruptionPolicy.
	Corruption CorruptionPolicy
	// ReplayFrom: during Open's verification scan every record with
	// LSN >= ReplayFrom is passed to Replay, in LSN order. The payload is
	// valid only during the call; an error aborts Open. A checkpointed
	// caller sets it just past its checkpoint to skip replay cost.
	ReplayFrom uint64
	// Replay is the callback described with ReplayFrom; nil skips replay.
	Replay func(Record) error
	// Logger receives recovery warnings; default discards.
	Logger *slog.Logger
	// NewTicker drives SyncInterval; default time.NewTicker. Tests inject
	// their own to avoid the real clock.
	NewTicker func(d time.Duration) (c <-chan time.Time, stop func())

	// reserveStepMin overrides reserveStepMinBytes (tests: many small
	// steps in small segments).
	reserveStepMin int64
}

func (o *Options) normalize() error {
	if o.FS == nil || o.Dir == "" {
		return fmt.Errorf("%w: FS and Dir are required", ErrInvalidOptions)
	}
	if o.SegmentBytes == 0 {
		o.SegmentBytes = SegmentBytesDefault
	}
	if o.SegmentBytes < segmentBytesMin {
		return fmt.Errorf("%w: SegmentBytes %d < %d", ErrInvalidOptions, o.SegmentBytes, segmentBytesMin)
	}
	if o.IndexIntervalBytes <= 0 {
		o.IndexIntervalBytes = IndexIntervalBytesDefault
	}
	if o.SyncIntervalMs <= 0 {
		o.SyncIntervalMs = SyncIntervalMsDefault
	}
	if o.BufferBytes <= 0 {
		o.BufferBytes = BufferBytesDefault
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.reserveStepMin <= 0 {
		o.reserveStepMin = reserveStepMinBytes
	}
	if o.NewTicker == nil {
		o.NewTicker = func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		}
	}
	return nil
}

// RecoveryReport describes what Open found.
type RecoveryReport struct {
	Segments          int    // segment files retained
	Records           uint64 // records verified
	Bytes             int64  // bytes of verified records
	FirstLSN, LastLSN uint64 // LastLSN = FirstLSN-1 when the log is empty
	Replayed          uint64 // records passed to Replay
	// TornBytes counts the non-zero bytes cut from the end of the last
	// segment by the torn-tail rule (an interrupted, never-acknowledged write).
	TornBytes int64
	// Truncated is true when Open cut anything: a torn tail or, under
	// CorruptionTruncate, damage.
	Truncated bool
	// Corruption is the damage that CorruptionTruncate cut at, else nil.
	Corruption *CorruptionError
	// DroppedSegments counts segment files deleted by CorruptionTruncate.
	DroppedSegments int
}

// mark records a position inside the append buffer: where an index entry
// falls, and whether a new segment starts there.
type mark struct {
	pos    int    // offset in the buffer
	lsn    uint64 // LSN of the record at pos
	off    int64  // offset of that record in its segment file
	newSeg bool   // the record at pos is the first of a new segment
	// prevTerm is the term of the record before pos (newSeg marks only):
	// the new segment's header carries it.
	prevTerm uint64
}

// termRun says that records from first on have term, up to the next run.
type termRun struct{ first, term uint64 }

// Log is a segmented, checksummed, append-only log.
//
// Goroutines and locks. Any goroutine may append, commit and read. Appends
// are encoded into an in-memory buffer under mu. One committer goroutine,
// started by Open and stopped by Close, owns the active segment file's
// writes: it swaps the buffer out, writes it with one WriteAt per segment,
// rolls segments, calls fdatasync, and then advances writtenLSN/durableLSN
// and wakes waiters. segMu guards the segment list and each segment's
// size/last/index; readers take it briefly to find their bytes and then read
// the file without it. The two locks are never held together.
type Log struct {
	opts Options
	fs   vfs.FS
	dir  string
	log  *slog.Logger

	mu          sync.Mutex
	cond        sync.Cond // on mu: written/durable advanced, buffer drained, failure, exit
	buf         []byte    // encoded records not yet taken by the committer
	marks       []mark
	nextLSN     uint64
	tailOff     int64 // active-segment offset where the next appended record goes
	lastIdxOff  int64 // tailOff when the last index mark was made
	wantWritten uint64
	wantDurable uint64
	writtenLSN  uint64 // records <= this are in the OS (visible to reads)
	durableLSN  uint64 // records <= this survived fdatasync
	err         error  // sticky; wraps ErrFailed
	closing     bool
	exited      bool // the committer has returned
	// rotating asks the committer to seal the active segment and start an
	// empty one once everything appended is written (Rotate).
	rotating bool
	// op is a TruncateAfter or ResetTo waiting for the committer; appends
	// wait while one is pending.
	op *logOp
	// terms maps LSNs to terms: terms[0].first is FirstLSN-1 (the record
	// or snapshot the log starts after); later runs start where the term
	// changes. It holds one entry per term change in the retained log
	// (each new leader's term starts with its no-op), trimmed by
	// DropBefore, TruncateAfter and ResetTo: a few entries in practice,
	// at most one per record.
	terms []termRun
	// lastTerm is the term of record nextLSN-1 (of the start point when the
	// log is empty); old-API appends take it (at least 1).
	lastTerm uint64

	kick chan struct{} // cap 1: "there may be work"
	// running is set while the committer goroutine runs (under mu): it
	// ends once the log is clean and nothing waits on it, and the next
	// kick starts it again, so an idle log holds no goroutine.
	running bool
	done    chan struct{} // closed when the committer returns

	segMu sync.RWMutex
	segs  []*segment // ascending base; the last is active

	dropMu sync.Mutex // serialises DropBefore

	// Owned by the committer goroutine (and by Open before it starts).
	// prepared delivers the zero-filled next segment (PreallocZero); the
	// committer starts one preparer at a time and Close waits for it.
	prepared   chan preparedFile
	spare      []byte
	spareMarks []mark
	active     *segment
	activeFile int64 // active file's current size on disk (>= active.size when preallocated)
	// behindSeg and behindOff: how far writeBehind has started writeback
	// of the active segment (committer only).
	behindSeg *segment
	behindOff int64

	report RecoveryReport

	hs hardStateFile // guarded by its own mutex; see hardstate.go
}

// Open opens (or creates) the log in opts.Dir, verifies every record of every
// segment, repairs a torn tail and starts the committer.
func Open(opts Options) (*Log, error) {
	if err := opts.normalize(); err != nil {
		return nil, err
	}
	l := &Log{
		opts: opts,
		fs:   opts.FS,
		dir:  filepath.Clean(opts.Dir),
		log:  opts.Logger,
		kick: make(chan struct{}, 1),
		done: make(chan struct{}),
	}
	l.cond.L = &l.mu
	if err := l.ensureDir(); err != nil {
		return nil, err
	}
	if err := l.recover(); err != nil {
		l.discardPrepared()
		l.closeFiles()
		return nil, err
	}
	if err := l.hs.open(l.fs, l.dir, l.opts.SurvivorsDurable); err != nil {
		l.discardPrepared()
		l.closeFiles()
		return nil, err
	}
	return l, nil
}

// ensureDir creates the log directory if needed and makes the new entries
// durable, from the top down.
func (l *Log) ensureDir() error {
	var missing []string
	for p := l.dir; ; p = filepath.Dir(p) {
		if _, err := l.fs.Stat(p); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("seglog: stat %s: %w", p, err)
		}
		missing = append(missing, p)
		if filepath.Dir(p) == p {
			break
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := l.fs.MkdirAll(l.dir, vfs.DirPerm); err != nil {
		return fmt.Errorf("seglog: mkdir %s: %w", l.dir, err)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := l.fs.SyncDir(filepath.Dir(missing[i])); err != nil {
			return fmt.Errorf("seglog: sync dir %s: %w", filepath.Dir(missing[i]), err)
		}
	}
	return nil
}

// Report returns what Open found.
func (l *Log) Report() RecoveryReport { return l.report }

// FirstLSN returns the LSN of the oldest retained record (NextLSN if the log
// holds none).
func (l *Log) FirstLSN() uint64 {
	l.segMu.RLock()
	defer l.segMu.RUnlock()
	return l.segs[0].base
}

// NextLSN returns the LSN the next Append will get.
func (l *Log) NextLSN() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.nextLSN
}

// DurableLSN returns the highest LSN known to have survived fdatasync.
func (l *Log) DurableLSN() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.durableLSN
}

// Append adds a record and returns its LSN. The record is buffered in memory
// and NOT durable; use Commit or Sync for that. Safe for concurrent use;
// blocks while the append buffer is full.
func (l *Log) Append(typ uint8, payload []byte) (uint64, error) {
	if len(payload) > PayloadBytesMax {
		return 0, ErrRecordTooLarge
	}
	pc := payloadCRC(payload) // outside the lock: it is the per-byte cost
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.appendLocked(0, typ, payload, pc)
}

// Commit appends a record and waits until it is durable (SyncAlways) or
// written to the OS (SyncInterval). Concurrent commits share one fdatasync.
func (l *Log) Commit(typ uint8, payload []byte) (uint64, error) {
	if len(payload) > PayloadBytesMax {
		return 0, ErrRecordTooLarge
	}
	pc := payloadCRC(payload)
	l.mu.Lock()
	defer l.mu.Unlock()
	lsn, err := l.appendLocked(0, typ, payload, pc)
	if err != nil {
		return 0, err
	}
	if l.opts.Sync == SyncAlways {
		return lsn, l.waitLocked(lsn, true)
	}
	return lsn, l.waitLocked(lsn, false)
}

// Sync makes every record appended so far durable, regardless of policy,
// and returns the durable LSN.
func (l *Log) Sync() (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.waitLocked(l.nextLSN-1, true); err != nil {
		return l.durableLSN, err
	}
	return l.durableLSN, nil
}

// Flush hands every record appended so far to the OS (written to the
// segment files, so a process crash no longer loses them) without waiting
// for fdatasync, regardless of policy, and returns the highest LSN written.
// Under SyncInterval that is the point at which a record may be
// acknowledged; it becomes durable within SyncIntervalMs.
func (l *Log) Flush() (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.waitLocked(l.nextLSN-1, false); err != nil {
		return l.writtenLSN, err
	}
	return l.writtenLSN, nil
}

// waitAppendable waits until an append may go into the buffer.
func (l *Log) waitAppendable() error {
	for {
		if l.err != nil {
			return l.err
		}
		if l.closing {
			return ErrClosed
		}
		if len(l.buf) < l.opts.BufferBytes && l.op == nil {
			return nil
		}
		l.kickCommitter()
		l.cond.Wait()
	}
}

// appendLocked appends one record with the given term (0: the current term,
// lastTerm or 1). Caller holds mu.
func (l *Log) appendLocked(term uint64, typ uint8, payload []byte, pc uint32) (uint64, error) {
	if err := l.waitAppendable(); err != nil {
		return 0, err
	}
	if term == 0 {
		term = max(l.lastTerm, 1)
	}
	lsn := l.nextLSN
	recBytes := int64(headerBytes + len(payload))
	switch {
	case l.tailOff > segHeaderBytes && l.tailOff+recBytes > l.opts.SegmentBytes:
		l.marks = append(l.marks, mark{pos: len(l.buf), lsn: lsn, off: segHeaderBytes, newSeg: true, prevTerm: l.lastTerm})
		l.tailOff, l.lastIdxOff = segHeaderBytes, segHeaderBytes
	case l.tailOff == segHeaderBytes || l.tailOff-l.lastIdxOff >= int64(l.opts.IndexIntervalBytes):
		l.marks = append(l.marks, mark{pos: len(l.buf), lsn: lsn, off: l.tailOff})
		l.lastIdxOff = l.tailOff
	}
	wasClean := len(l.buf) == 0
	l.buf = appendRecord(l.buf, lsn, term, typ, payload, pc)
	l.tailOff += recBytes
	l.nextLSN++
	if term != l.lastTerm {
		l.terms = append(l.terms, termRun{first: lsn, term: term})
		l.lastTerm = term
	}
	if len(l.buf) >= l.opts.BufferBytes/2 || wasClean && l.opts.Sync != SyncAlways {
		// Start writing early so appenders rarely block; or, on a log
		// that writes on its interval, have the committer watch its
		// ticker now that something waits (a clean log does not wake).
		l.kickCommitter()
	}
	return lsn, nil
}

// waitLocked waits until lsn is durable (or written, if !durable). The
// record's own success wins over a later failure: a caller whose record made
// it to disk before an fsync failed later is told the truth.
func (l *Log) waitLocked(lsn uint64, durable bool) error {
	if durable {
		l.wantDurable = max(l.wantDurable, lsn)
	} else {
		l.wantWritten = max(l.wantWritten, lsn)
	}
	kicked := false
	for {
		reached := l.writtenLSN
		if durable {
			reached = l.durableLSN
		}
		switch {
		case reached >= lsn:
			return nil
		case l.err != nil:
			return l.err
		case l.exited:
			return ErrClosed
		}
		if !kicked {
			l.kickCommitter()
			kicked = true
		}
		l.cond.Wait()
	}
}

func (l *Log) kickCommitter() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
	if !l.running {
		l.running = true
		go l.run()
	}
}

// idleLocked reports whether the committer has nothing to do and nothing
// to wait for: nothing buffered, written or synced short of what was
// asked, no op or rotation pending, not closing and no kick waiting.
// Caller holds mu.
func (l *Log) idleLocked() bool {
	if l.err != nil {
		return !l.closing
	}
	return len(l.buf) == 0 && len(l.kick) == 0 && l.op == nil && !l.rotating && !l.closing &&
		l.wantWritten <= l.writtenLSN && l.wantDurable <= l.durableLSN &&
		(l.opts.Sync != SyncInterval || l.writtenLSN <= l.durableLSN)
}

// run is the committer goroutine. It owns writes to segment files.
//
// It runs while there is work: once the log is clean and nothing waits on
// it (idleLocked), it ends, and the next kick starts it again (the append
// that dirties a clean log kicks), so an idle partition's log holds no
// goroutine and takes no tick. Close's kick runs it one last time.
func (l *Log) run() {
	var tick <-chan time.Time
	if l.opts.Sync == SyncInterval || l.opts.Sync == SyncManual {
		c, stop := l.opts.NewTicker(time.Duration(l.opts.SyncIntervalMs) * time.Millisecond)
		defer stop()
		tick = c
	}
	for {
		force := false
		l.mu.Lock()
		if l.idleLocked() {
			l.running = false
			l.mu.Unlock()
			return
		}
		dirty := len(l.buf) > 0 || l.opts.Sync == SyncInterval && l.writtenLSN > l.durableLSN
		l.mu.Unlock()
		// The ticker matters only while something waits to be written
		// or synced.
		tickC := tick
		if !dirty {
			tickC = nil
		}
		select {
		case <-l.kick:
		case <-tickC:
			force = true
		}
		for l.commitOnce(force) {
			force = false
			// Let the committers just woken by the fsync append their next
			// records before the next batch is taken: measured 1.3-2x more
			// throughput with 8-64 concurrent committers on 2 cores.
			runtime.Gosched()
		}
		l.rotateIfAsked()
		l.runOp()
		l.mu.Lock()
		if l.closing {
			// Close may have come after the last commitOnce saw nothing
			// urgent: what is still buffered is written and synced now
			// (closing makes it urgent), or a clean Close would lose it.
			l.mu.Unlock()
			for l.commitOnce(false) {
			}
			l.mu.Lock()
			l.exited = true
			l.running = false
			l.cond.Broadcast()
			l.mu.Unlock()
			close(l.done)
			return
		}
		l.mu.Unlock()
	}
}

// commitOnce writes and/or syncs whatever is due and reports whether it did
// any I/O (the caller loops until it did none).
func (l *Log) commitOnce(force bool) bool {
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return false
	}
	urgent := force || l.closing || l.rotating || l.wantDurable > l.writtenLSN || l.wantWritten > l.writtenLSN
	doWrite := len(l.buf) > 0 && (urgent || len(l.buf) >= l.opts.BufferBytes/2)
	target := l.writtenLSN
	if doWrite {
		target = l.nextLSN - 1
	}
	doSync := target > l.durableLSN &&
		(l.opts.Sync == SyncAlways || force && l.opts.Sync == SyncInterval || l.closing || l.op != nil || l.wantDurable > l.durableLSN)
	if !doWrite && !doSync {
		l.mu.Unlock()
		return false
	}
	var batch []byte
	var marks []mark
	first := l.writtenLSN + 1
	if doWrite {
		batch, marks = l.buf, l.marks
		l.buf, l.marks = l.spare[:0], l.spareMarks[:0]
		l.cond.Broadcast() // appenders blocked on a full buffer may go on
	}
	l.mu.Unlock()

	var err error
	if doWrite {
		err = l.writeBatch(batch, marks, first, target)
	}
	if err == nil && doSync {
		if serr := l.active.f.Sync(); serr != nil {
			err = failed("fdatasync "+l.active.name, serr)
		}
	}

	l.mu.Lock()
	if doWrite {
		l.spare, l.spareMarks = batch[:0], marks[:0]
		if cap(batch) > bufferKeepBytes && len(batch) < cap(batch)/8 {
			// A burst grew the buffer and the load fell: let it go
			// rather than hold it for good; append grows a new one
			// as needed.
			l.spare, l.spareMarks = nil, nil
		}
	}
	if err != nil {
		l.err = err
		l.log.Error("seglog: I/O failure; the log refuses further writes", "err", err)
	} else {
		l.writtenLSN = target
		if doSync {
			l.durableLSN = target
		}
	}
	l.cond.Broadcast()
	l.mu.Unlock()
	return err == nil
}

// writeBatch writes encoded records first..last to the segment files, one
// WriteAt per segment touched, rolling segments at newSeg marks. Committer
// only. It publishes each chunk to readers once it is written.
// writeBehindBytes: a log that does not sync every commit starts the
// writeback of what it has written each time this much has gathered, so
// the disk takes its writes a megabyte at a time rather than all at a
// checkpoint's or a roll's fdatasync, in front of the node journal's.
const writeBehindBytes = 1 << 20

// writeBehind starts writeback of s's bytes written since the last call,
// once there are writeBehindBytes of them. It does not wait, and an error is
// left for the sync that makes the bytes durable to report.
func (l *Log) writeBehind(s *segment) {
	if l.behindSeg != s {
		l.behindSeg, l.behindOff = s, 0
	}
	if s.size-l.behindOff < writeBehindBytes {
		return
	}
	_ = vfs.WriteBehind(s.f, l.behindOff, s.size-l.behindOff, false)
	l.behindOff = s.size
}

func (l *Log) writeBatch(batch []byte, marks []mark, first, last uint64) error {
	pos := 0
	for pos < len(batch) {
		if len(marks) > 0 && marks[0].newSeg && marks[0].pos == pos {
			if err := l.roll(marks[0].lsn, marks[0].prevTerm); err != nil {
				return err
			}
		}
		// This chunk runs to the next segment start or the batch end.
		end, endLSN := len(batch), last+1
		j := 0
		for ; j < len(marks); j++ {
			if marks[j].newSeg && marks[j].pos > pos {
				end, endLSN = marks[j].pos, marks[j].lsn
				break
			}
		}
		chunkMarks := marks[:j]
		marks = marks[j:]
		s := l.active
		if err := l.reserve(s.size + int64(end-pos)); err != nil {
			return err
		}
		if _, err := s.f.WriteAt(batch[pos:end], s.size); err != nil {
			return failed("write "+s.name, err)
		}
		l.segMu.Lock()
		for _, m := range chunkMarks {
			s.index = append(s.index, indexEntry{lsn: m.lsn, off: m.off})
		}
		s.size += int64(end - pos)
		s.last = endLSN - 1
		l.segMu.Unlock()
		l.activeFile = max(l.activeFile, s.size)
		pos = end
		if l.opts.Sync != SyncAlways {
			l.writeBehind(s)
		}
	}
	if l.active.last != last {
		panic(fmt.Sprintf("seglog: batch ended at lsn %d, want %d (first %d)", l.active.last, last, first))
	}
	return nil
}

// Close flushes and syncs everything appended, stops the committer and
// closes the files. Appends after Close fail with ErrClosed. Close returns
// the sticky failure, if any.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closing {
		l.mu.Unlock()
		<-l.done
		return ErrClosed
	}
	l.closing = true
	l.kickCommitter()
	l.mu.Unlock()
	<-l.done

	l.mu.Lock()
	err := l.err
	l.mu.Unlock()
	// Trim a preallocated active segment so a cleanly closed log has no
	// zero tail to skip over at the next Open.
	if err == nil && l.activeFile > l.active.size {
		if terr := l.active.f.Truncate(l.active.size); terr == nil {
			_ = l.active.f.Sync()
		}
	}
	if herr := l.hs.close(); err == nil && herr != nil {
		err = herr
	}
	l.discardPrepared()
	if cerr := l.closeFiles(); err == nil && cerr != nil {
		err = cerr
	}
	return err
}

func (l *Log) closeFiles() error {
	l.segMu.Lock()
	defer l.segMu.Unlock()
	var first error
	for _, s := range l.segs {
		s.dropped.Store(true)
		if s.refs.Load() == 0 {
			if err := s.closeOnce(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// bufferKeepBytes is the append buffer a log keeps however little it is
// used; a larger one grown during a burst goes once batches are small again
// (commitOnce) or the owner says the log is idle (ShrinkBuffers).
const bufferKeepBytes = 64 << 10

// ShrinkBuffers lets go of append buffers grown past bufferKeepBytes during a
// burst, when nothing is buffered. The owner calls it once the log has gone
// quiet; appends afterwards grow new ones as needed.
func (l *Log) ShrinkBuffers() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) == 0 && cap(l.buf) > bufferKeepBytes {
		l.buf, l.marks = nil, nil
	}
	if cap(l.spare) > bufferKeepBytes {
		l.spare, l.spareMarks = nil, nil
	}
}
