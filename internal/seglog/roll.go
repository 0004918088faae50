package seglog

import (
	"os"
	"path/filepath"

	"github.com/sinewmq/sinew/internal/vfs"
)

// reserve extends the active segment's PreallocReserve reservation so that
// it covers need bytes, by one step (see PreallocReserve). The new size is
// made durable by the fdatasync that follows the write. Committer only.
func (l *Log) reserve(need int64) error {
	if l.opts.Preallocate != PreallocReserve || need <= l.activeFile {
		return nil
	}
	target := l.activeFile
	for target < need && target < l.opts.SegmentBytes {
		if target < l.opts.reserveStepMin {
			target = l.opts.reserveStepMin // a new segment holds just its header
		} else {
			target += min(target, reserveStepMaxBytes)
		}
	}
	target = max(min(target, l.opts.SegmentBytes), need) // need > SegmentBytes: one huge record
	if err := vfs.Allocate(l.active.f, target); err != nil {
		return failed("preallocate "+l.active.name, err)
	}
	l.activeFile = target
	return nil
}

// Rotate seals the active segment and starts an empty one at NextLSN, so
// that DropBefore(NextLSN) can then delete every record written so far. A
// caller whose records are all settled uses it to stop a large, idle active
// segment from holding disk. It waits until every record appended before
// the call is durable and the new segment exists; it does nothing when the
// active segment is empty. Records appended meanwhile go to the old segment
// first, then the rotation happens. A failure is sticky, as for any write.
func (l *Log) Rotate() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.waitLocked(l.nextLSN-1, true); err != nil {
		return err
	}
	if l.tailOff == segHeaderBytes {
		return nil // the active segment is empty already
	}
	l.rotating = true
	l.kickCommitter()
	for l.rotating {
		switch {
		case l.err != nil:
			return l.err
		case l.exited:
			return ErrClosed
		}
		l.cond.Wait()
	}
	return l.err
}

// rotateIfAsked performs a requested Rotate once everything appended is
// written. The next append then starts at offset 0 of the new segment.
// Committer only.
func (l *Log) rotateIfAsked() {
	l.mu.Lock()
	if !l.rotating || l.err != nil {
		l.mu.Unlock()
		return
	}
	if len(l.buf) > 0 || l.writtenLSN != l.nextLSN-1 {
		// Appended after the last batch: write those first (rotating
		// makes them urgent), then come back here.
		l.kickCommitter()
		l.mu.Unlock()
		return
	}
	base, prevTerm := l.nextLSN, l.lastTerm
	empty := l.tailOff == segHeaderBytes
	l.tailOff, l.lastIdxOff = segHeaderBytes, segHeaderBytes
	l.mu.Unlock()
	var err error
	if !empty {
		// Appends arriving now see an empty active segment and are
		// written after the roll, into the new segment, whose base is
		// their LSN.
		err = l.roll(base, prevTerm)
	}
	l.mu.Lock()
	l.rotating = false
	if err != nil {
		l.err = err
		l.log.Error("seglog: I/O failure; the log refuses further writes", "err", err)
	} else if !empty {
		// roll synced the old segment, which holds every written record.
		l.durableLSN = max(l.durableLSN, base-1)
	}
	l.cond.Broadcast()
	l.mu.Unlock()
}

// roll seals the active segment and starts a new one whose first record is
// base and whose header records prevTerm. Order matters for crash safety: the old segment's data is synced
// (and trimmed to its records) before the new file's name becomes durable,
// so recovery never sees a newer segment after an incomplete older one.
func (l *Log) roll(base, prevTerm uint64) error {
	old := l.active
	if err := old.f.Sync(); err != nil {
		return failed("fdatasync "+old.name, err)
	}
	if l.activeFile > old.size { // preallocated: drop the zero tail
		if err := old.f.Truncate(old.size); err != nil {
			return failed("truncate "+old.name, err)
		}
		if err := old.f.Sync(); err != nil {
			return failed("fdatasync "+old.name, err)
		}
	}
	s, err := l.createSegment(base, prevTerm)
	if err != nil {
		return err
	}
	l.segMu.Lock()
	l.segs = append(l.segs, s)
	l.segMu.Unlock()
	l.active = s
	// Sealed segments are only read from now on; the handle stays open for
	// Read and Scan.
	return nil
}

// createSegment creates an empty version-2 segment file whose first record
// is base, writes and syncs its header, lays out its space per Preallocate
// and makes its name durable.
func (l *Log) createSegment(base, prevTerm uint64) (*segment, error) {
	name := filepath.Join(l.dir, SegmentName(base))
	hdr := encodeSegHeader(base, prevTerm)
	var f vfs.File
	l.activeFile = 0
	if l.prepared != nil { // PreallocZero after Open: take the prepared file
		p := <-l.prepared
		l.prepared = nil
		if p.err != nil {
			return nil, failed("prepare "+preparedName, p.err)
		}
		// The header is durable before the name is.
		if _, err := p.f.WriteAt(hdr, 0); err != nil {
			_ = p.f.Close()
			return nil, failed("write header "+preparedName, err)
		}
		if err := p.f.Sync(); err != nil {
			_ = p.f.Close()
			return nil, failed("fdatasync "+preparedName, err)
		}
		if err := l.fs.Rename(filepath.Join(l.dir, preparedName), name); err != nil {
			_ = p.f.Close()
			return nil, failed("rename to "+name, err)
		}
		f, l.activeFile = p.f, l.opts.SegmentBytes
	} else {
		var err error
		f, err = l.fs.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_RDWR, vfs.FilePerm)
		if err != nil {
			return nil, failed("create "+name, err)
		}
		if _, err := f.WriteAt(hdr, 0); err != nil {
			_ = f.Close()
			return nil, failed("write header "+name, err)
		}
		if err := f.Sync(); err != nil {
			_ = f.Close()
			return nil, failed("fdatasync "+name, err)
		}
		l.activeFile = segHeaderBytes
		// PreallocReserve reserves lazily, as writes arrive (reserve):
		// an empty segment holds only its header.
	}
	if err := l.fs.SyncDir(l.dir); err != nil {
		_ = f.Close()
		return nil, failed("sync dir "+l.dir, err)
	}
	l.startPreparing()
	return &segment{base: base, name: name, f: f, last: base - 1, v2: true, data: segHeaderBytes,
		prevTerm: prevTerm, size: segHeaderBytes}, nil
}

// preparedFile is the result of a preparer goroutine.
type preparedFile struct {
	f   vfs.File
	err error
}

// startPreparing launches the goroutine that zero-fills the next segment,
// if PreallocZero is on and none is in flight. Committer (or Open) only.
func (l *Log) startPreparing() {
	if l.opts.Preallocate != PreallocZero || l.prepared != nil {
		return
	}
	ch := make(chan preparedFile, 1)
	l.prepared = ch
	go func() { ch <- l.prepare() }()
}

// prepare writes preparedName full of zeros and syncs it. Its name need not
// be durable: a crash loses at most the preparation.
func (l *Log) prepare() preparedFile {
	name := filepath.Join(l.dir, preparedName)
	f, err := l.fs.OpenFile(name, os.O_CREATE|os.O_TRUNC|os.O_RDWR, vfs.FilePerm)
	if err != nil {
		return preparedFile{err: err}
	}
	if err := zeroFill(f, 0, l.opts.SegmentBytes); err != nil {
		_ = f.Close()
		return preparedFile{err: err}
	}
	return preparedFile{f: f}
}

// zeroFill writes zeros over [from, to) of f and syncs it.
func zeroFill(f vfs.File, from, to int64) error {
	zero := make([]byte, min(max(to-from, 0), readChunkBytes))
	for off := from; off < to; off += int64(len(zero)) {
		n := min(int64(len(zero)), to-off)
		if _, err := f.WriteAt(zero[:n], off); err != nil {
			return err
		}
		// Each chunk reaches the device before the next is written, so
		// the zeros never queue ahead of a concurrent fdatasync in bulk.
		if err := vfs.WriteBehind(f, off, n, true); err != nil {
			return err
		}
	}
	return f.Sync()
}

// discardPrepared waits for an in-flight preparer and deletes its file; it
// would be redone at the next Open anyway.
func (l *Log) discardPrepared() {
	if l.prepared == nil {
		return
	}
	p := <-l.prepared
	l.prepared = nil
	if p.f != nil {
		_ = p.f.Close()
		_ = l.fs.Remove(filepath.Join(l.dir, preparedName))
	}
}
