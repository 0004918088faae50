package wal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
)

// Defaults for Options.
const (
	// SegmentBytesDefault is the default Options.SegmentBytes.
	SegmentBytesDefault = 16 << 20
	// PendingBytesMaxDefault is the default Options.PendingBytesMax.
	PendingBytesMaxDefault = 16 << 20
	// CommittersMaxDefault is the default Options.CommittersMax.
	CommittersMaxDefault = 4096
	// reserveStepBytes is how far ahead the active segment is allocated.
	reserveStepBytes = 4 << 20
	// keepBufBytes is the write buffer the writer keeps whatever the
	// batches (a larger one goes once batches are small again).
	keepBufBytes = 1 << 20
)

// Options configure Open. FS and Dir are required.
type Options struct {
	FS  vfs.FS
	Dir string
	// SegmentBytes is the size past which the writer starts a new segment
	// before its next batch. Default 16 MiB.
	SegmentBytes int64
	// PendingBytesMax bounds the encoded bytes queued for the writer; a
	// Commit that would pass it waits (a batch alone may exceed it).
	// Default 16 MiB.
	PendingBytesMax int64
	// CommittersMax bounds the Commit calls queued at once. Default 4096.
	CommittersMax int
	// PressureSegments: when a segment kept is this many segments behind
	// the active one, OnPressure is called (once) for the groups pinning
	// it. Default 4.
	PressureSegments uint64
	// OnPressure asks a group to make its own files durable up to index and
	// then Release it. Called on its own goroutine. Nil: no pressure calls.
	OnPressure func(group string, index uint64)
	// Prepare says whether the next segment is written full of zeros and
	// synced in the background before it is needed (see PrepareMode).
	// Default PrepareOnDisk.
	Prepare PrepareMode
	// SyncIntervalMs > 0 trades durability for speed (storage.sync =
	// interval): Commit returns once its batch is written to the OS, and
	// the writer fsyncs every SyncIntervalMs, at each roll and at Close. A
	// process crash loses nothing committed; a power loss may lose up to
	// one interval. 0 (the default): Commit returns after the fdatasync.
	SyncIntervalMs int
	// NewTicker drives SyncIntervalMs; default time.NewTicker. Tests
	// inject their own.
	NewTicker func(d time.Duration) (c <-chan time.Time, stop func())
}

// PrepareMode says how new segments get their space.
type PrepareMode int

const (
	// PrepareOnDisk (the default): PrepareAlways on the operating system's
	// file system (vfs.OS), PrepareNever on any other (tests' MemFS, where
	// zeros would only cost memory).
	PrepareOnDisk PrepareMode = iota
	// PrepareAlways: once the active segment is half full, a goroutine
	// writes the next one (preparedName) full of zeros and syncs it; the
	// roll writes its header and renames it into place. Batches then
	// overwrite written blocks, and fdatasync flushes data only, where a
	// reserved (fallocated) block's first write makes ext4 and xfs journal
	// an extent conversion with it (docs/benchmarks.md). The cost: one
	// extra write of every segment, and up to two segments of disk.
	PrepareAlways
	// PrepareNever: segments are reserved ahead in steps (vfs.Allocate).
	PrepareNever
)

// preparedName is the file PrepareAlways fills ahead of time; a leftover
// one is deleted at Open.
const preparedName = "wal-prepared.tmp"

// prepared is a preparer goroutine's result.
type prepared struct {
	f   vfs.File
	err error
}

// Entry is one raft entry of a group.
type Entry struct {
	Index, Term uint64
	Type        uint8
	Payload     []byte
}

// HardState is raft's durable state of a group.
type HardState struct{ Term, Vote, Commit uint64 }

// Batch is what one Commit makes durable for one group.
type Batch struct {
	Entries []Entry
	// HardState, if not nil, is written with the entries.
	HardState *HardState
	// Reset voids every entry of the group committed before this batch:
	// replay forgets them, and they no longer keep a segment on disk. A
	// group whose own files were replaced by a snapshot commits it once
	// the snapshot is durable, so that no older entry is ever merged
	// into the new store.
	Reset bool
}

// Group is what replay found for one group.
type Group struct {
	// Entries are the group's entries still in the WAL, dense in index.
	Entries []Entry
	// HardState is the last one found; valid if HasHardState.
	HardState    HardState
	HasHardState bool
}

// segInfo is what the WAL knows of one segment file.
type segInfo struct {
	seq  uint64
	size int64
	// maxIndex is the highest entry index per group in the segment.
	maxIndex map[string]uint64
	// declared maps group name -> id, for the active segment only.
	declared map[string]uint32
	// pressed: OnPressure was called for the groups pinning it.
	pressed bool
}

type waiter struct {
	group string
	buf   []byte
	max   uint64 // highest index in the batch (0 if none)
	hs    *HardState
	reset bool
	gen   uint64
}

// WAL is a per-node write-ahead log; see the package doc.
type WAL struct {
	opts Options

	mu   sync.Mutex
	cond *sync.Cond
	// queue holds the batches waiting for the writer; queued their bytes.
	queue  []*waiter
	queued int64
	// gen counts batches handed out; done the last written and synced.
	gen, done uint64
	err       error // sticky
	closed    bool
	kick      bool
	// ids maps group name -> id used in records (process-wide).
	ids      map[string]uint32
	nextID   uint32
	hs       map[string]HardState // latest durable HardState per group
	released map[string]uint64
	// forgotten holds the groups Forget dropped whose names are still
	// tracked (ids, released); trim stops tracking one once no segment
	// holds its entries, so churn of short-lived groups stays bounded.
	forgotten map[string]bool
	// lowered counts, per group, the commits that lowered its release
	// mark (entries at indexes it had released): see Mark.
	lowered  map[string]uint64
	segs     []*segInfo // oldest first; the last is active
	replayed map[string]*Group

	// writer-owned
	active   vfs.File
	reserved int64
	// preparing delivers the zero-filled next segment (PrepareAlways);
	// nil when none is being prepared. rolledPrepared counts the rolls
	// that took one.
	preparing      chan prepared
	rolledPrepared int
	// dirty: written since the last fsync (SyncIntervalMs only).
	dirty bool
	// syncDue is set by the interval ticker, under mu.
	syncDue  bool
	stopTick chan struct{}
	tickDone chan struct{}
	// ready is a prepared segment taken from preparing before it was
	// needed; activePrepared (written under mu, read by the writer
	// without it) tells whether the active segment was one.
	ready          *prepared
	activePrepared bool

	writerDone chan struct{}
	pressWG    sync.WaitGroup
	// removals carries the trimmed segments to the remover goroutine,
	// which deletes them oldest first off the writer's path (deleting a
	// 16 MiB file and syncing the directory took milliseconds the
	// writer's next fsync waited for); removerDone closes when it ends.
	removals    chan []uint64
	removerDone chan struct{}
}

// removalsMax bounds the trims waiting for the remover; a writer that
// trims faster than files can be deleted waits.
const removalsMax = 16

// remove deletes trimmed segments in the order trim gave them, and syncs
// the directory after each batch. A segment left behind by a crash before
// its deletion is replayed as one whose groups have all released it, as it
// would have been before the trim.
func (w *WAL) remove() {
	defer close(w.removerDone)
	for drop := range w.removals {
		var err error
		for _, s := range drop {
			if err = w.opts.FS.Remove(filepath.Join(w.opts.Dir, segName(s))); err != nil {
				break
			}
		}
		if err == nil {
			err = w.opts.FS.SyncDir(w.opts.Dir)
		}
		if err != nil {
			w.fail("remove trimmed segment", err)
		}
	}
}

func segName(seq uint64) string { return fmt.Sprintf("wal-%016x.log", seq) }

func parseSegName(n string) (uint64, bool) {
	if !strings.HasPrefix(n, "wal-") || !strings.HasSuffix(n, ".log") || len(n) != 4+16+4 {
		return 0, false
	}
	v, err := strconv.ParseUint(n[4:20], 16, 64)
	return v, err == nil
}

// roll creates segment seq with the header and every known group's latest
// HardState, syncs it and the directory, and makes it active. Called by Open
// and by the writer.
func (w *WAL) roll(seq uint64) error {
	buf := encodeSegHeader(seq)
	info := &segInfo{seq: seq, maxIndex: map[string]uint64{}, declared: map[string]uint32{}}
	w.mu.Lock()
	groups := make([]string, 0, len(w.hs))
	for g := range w.hs {
		groups = append(groups, g)
	}
	slices.Sort(groups)
	for _, g := range groups {
		buf = w.declareLocked(buf, info, g)
		buf = appendHardState(buf, w.ids[g], w.hs[g])
	}
	w.mu.Unlock()
	path := filepath.Join(w.opts.Dir, segName(seq))
	var f vfs.File
	var reserved int64
	if w.ready == nil && w.preparing != nil {
		p := <-w.preparing
		w.ready = &p
	}
	if w.ready != nil && w.ready.err != nil {
		// Preparing is an optimisation: a failure (a full disk) costs
		// nothing confirmed, and the segment is reserved instead.
		w.ready, w.preparing = nil, nil
		_ = w.opts.FS.Remove(filepath.Join(w.opts.Dir, preparedName))
	}
	isPrepared := w.ready != nil
	if w.ready != nil {
		// The prepared file is zeros from end to end, synced: the header
		// goes at its start and it takes the segment's name.
		p := *w.ready
		w.ready, w.preparing = nil, nil
		f, reserved = p.f, w.opts.SegmentBytes
		w.rolledPrepared++
		err := w.opts.FS.Rename(filepath.Join(w.opts.Dir, preparedName), path)
		if err != nil {
			f.Close()
			return err
		}
	} else {
		var err error
		f, err = w.opts.FS.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR, vfs.FilePerm)
		if err != nil {
			return err
		}
		reserved = max(int64(len(buf)), reserveStepBytes)
		if err := vfs.Allocate(f, reserved); err != nil {
			f.Close()
			return err
		}
	}
	_, err := f.WriteAt(buf, 0)
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = w.opts.FS.SyncDir(w.opts.Dir)
	}
	if err != nil {
		f.Close()
		return err
	}
	if w.active != nil {
		if w.dirty {
			// Under SyncIntervalMs the old segment's last batches are
			// made durable before the new one takes over.
			if err := w.active.Sync(); err != nil {
				f.Close()
				return err
			}
			w.dirty = false
		}
		if err := w.active.Close(); err != nil {
			f.Close()
			return err
		}
	}
	w.active, w.reserved = f, reserved
	info.size = int64(len(buf))
	w.mu.Lock()
	w.activePrepared = isPrepared
	w.segs = append(w.segs, info)
	w.mu.Unlock()
	return nil
}

// declareLocked appends a declare record for g if the segment lacks one.
func (w *WAL) declareLocked(buf []byte, info *segInfo, g string) []byte {
	if _, ok := info.declared[g]; ok {
		return buf
	}
	id, ok := w.ids[g]
	if !ok {
		w.nextID++
		id = w.nextID
		w.ids[g] = id
	}
	info.declared[g] = id
	return appendRec(buf, kindDeclare, id, 0, 0, 0, []byte(g))
}

// Commit makes b durable for group: when it returns nil, the entries and the
// HardState are fsynced and will be replayed after a crash until released.
func (w *WAL) Commit(group string, b Batch) error {
	if group == "" {
		return fmt.Errorf("%w: empty group name", ErrInvalid)
	}
	if len(b.Entries) == 0 && b.HardState == nil && !b.Reset {
		return nil
	}
	w.mu.Lock()
	id, ok := w.ids[group]
	if !ok {
		w.nextID++
		id = w.nextID
		w.ids[group] = id
	}
	// In use again: trim must not drop the id the records carry.
	delete(w.forgotten, group)
	w.mu.Unlock()
	size := 0
	var maxIdx uint64
	minIdx := ^uint64(0)
	for _, e := range b.Entries {
		if len(e.Payload) > PayloadBytesMax {
			return ErrRecordTooLarge
		}
		if e.Index == 0 {
			return fmt.Errorf("%w: entry index 0", ErrInvalid)
		}
		size += recHeaderBytes + len(e.Payload)
		maxIdx = max(maxIdx, e.Index)
		minIdx = min(minIdx, e.Index)
	}
	buf := make([]byte, 0, size+2*recHeaderBytes+8)
	if b.Reset {
		buf = appendRec(buf, kindReset, id, 0, 0, 0, nil)
	}
	for _, e := range b.Entries {
		buf = appendRec(buf, kindEntry, id, e.Index, e.Term, e.Type, e.Payload)
	}
	var hs *HardState
	if b.HardState != nil {
		h := *b.HardState
		hs = &h
		buf = appendHardState(buf, id, h)
	}
	wt := &waiter{group: group, buf: buf, max: maxIdx, hs: hs, reset: b.Reset}
	w.mu.Lock()
	defer w.mu.Unlock()
	if minIdx <= w.released[group] {
		// Entries at released indexes replace what the group's own files
		// hold (a follower's overwritten suffix, or a group name used
		// again after Forget): they are not released until the group says
		// so again.
		w.released[group] = minIdx - 1
		w.lowered[group]++
	}
	for w.err == nil && !w.closed && len(w.queue) > 0 &&
		(w.queued+int64(len(buf)) > w.opts.PendingBytesMax || len(w.queue) >= w.opts.CommittersMax) {
		w.cond.Wait()
	}
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return ErrClosed
	}
	w.gen++
	wt.gen = w.gen
	w.queue = append(w.queue, wt)
	w.queued += int64(len(buf))
	w.cond.Broadcast()
	for w.done < wt.gen && w.err == nil {
		w.cond.Wait()
	}
	if w.done >= wt.gen {
		return nil
	}
	return w.err
}

// Segments returns the number of segment files and their total bytes
// written (excluding the reserved tail).
func (w *WAL) Segments() (n int, bytes int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range w.segs {
		bytes += s.size
	}
	return len(w.segs), bytes
}

func (w *WAL) fail(op string, err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = fmt.Errorf("%w: %s: %w", ErrFailed, op, err)
	}
	w.cond.Broadcast()
	w.mu.Unlock()
}

// run is the writer goroutine.
func (w *WAL) run() {
	defer close(w.writerDone)
	var buf []byte
	for {
		w.mu.Lock()
		for len(w.queue) == 0 && !w.kick && !w.closed && w.err == nil {
			w.cond.Wait()
		}
		if w.err != nil || (w.closed && len(w.queue) == 0) {
			w.mu.Unlock()
			return
		}
		batch := w.queue
		w.queue = nil
		w.queued = 0
		w.kick = false
		syncDue := w.syncDue
		w.syncDue = false
		w.cond.Broadcast() // room in the queue
		w.mu.Unlock()

		if syncDue && w.dirty {
			if err := w.active.Sync(); err != nil {
				w.fail("sync", err)
				return
			}
			w.dirty = false
		}

		if len(batch) > 0 {
			if err := w.write(batch, &buf); err != nil {
				w.fail("write", err)
				return
			}
			// A buffer grown by a burst (up to PendingBytesMax) is let go
			// once batches are small again, so an idle node holds little.
			if cap(buf) > keepBufBytes && len(buf) < cap(buf)/4 {
				buf = nil
			}
		}
		if err := w.trim(); err != nil {
			w.fail("trim", err)
			return
		}
	}
}

func (w *WAL) write(batch []*waiter, bufp *[]byte) error {
	if w.preparing != nil && w.ready == nil {
		select {
		case p := <-w.preparing:
			w.ready = &p
		default:
		}
	}
	w.mu.Lock()
	act := w.segs[len(w.segs)-1]
	full := act.size >= w.opts.SegmentBytes
	w.mu.Unlock()
	// A segment that was only reserved gives way to a prepared one as
	// soon as it is ready.
	if full || !w.activePrepared && w.ready != nil && w.ready.err == nil {
		if err := w.roll(act.seq + 1); err != nil {
			return err
		}
	}
	if w.opts.Prepare == PrepareAlways && w.preparing == nil && act.size >= w.opts.SegmentBytes/2 {
		w.startPreparing()
	}
	w.mu.Lock()
	act = w.segs[len(w.segs)-1]
	buf := (*bufp)[:0]
	for _, wt := range batch {
		buf = w.declareLocked(buf, act, wt.group)
		buf = append(buf, wt.buf...)
	}
	w.mu.Unlock()
	*bufp = buf
	off := act.size
	if need := off + int64(len(buf)); need > w.reserved {
		r := max(need, w.reserved+reserveStepBytes)
		if err := vfs.Allocate(w.active, r); err != nil {
			return err
		}
		w.reserved = r
	}
	if _, err := w.active.WriteAt(buf, off); err != nil {
		return err
	}
	if w.opts.SyncIntervalMs > 0 {
		w.dirty = true
	} else if err := w.active.Sync(); err != nil {
		return err
	}
	w.mu.Lock()
	act.size += int64(len(buf))
	for _, wt := range batch {
		if wt.reset {
			w.voidLocked(wt.group, act)
		}
		if wt.max > 0 {
			act.maxIndex[wt.group] = max(act.maxIndex[wt.group], wt.max)
		}
		if wt.hs != nil {
			w.hs[wt.group] = *wt.hs
		}
		w.done = max(w.done, wt.gen)
	}
	w.cond.Broadcast()
	w.mu.Unlock()
	return nil
}

// startPreparing launches the goroutine that writes the next segment full
// of zeros and syncs it. Writer only.
// prepareChunkBytes is how much of a segment being prepared is written to
// the device at a time.
const prepareChunkBytes = 1 << 20

func (w *WAL) startPreparing() {
	ch := make(chan prepared, 1)
	w.preparing = ch
	size := w.opts.SegmentBytes
	go func() {
		name := filepath.Join(w.opts.Dir, preparedName)
		f, err := w.opts.FS.OpenFile(name, os.O_CREATE|os.O_TRUNC|os.O_RDWR, vfs.FilePerm)
		if err != nil {
			ch <- prepared{err: err}
			return
		}
		// The zeros go out a chunk at a time, each written to the device
		// before the next is written, so preparing never puts the whole
		// segment in the disk's queue ahead of the journal's own fsyncs.
		zero := make([]byte, min(size, prepareChunkBytes))
		for off := int64(0); off < size && err == nil; off += int64(len(zero)) {
			n := min(int64(len(zero)), size-off)
			if _, err = f.WriteAt(zero[:n], off); err == nil {
				err = vfs.WriteBehind(f, off, n, true)
			}
		}
		if err == nil {
			err = f.Sync()
		}
		if err != nil {
			f.Close()
			ch <- prepared{err: err}
			return
		}
		ch <- prepared{f: f}
	}()
}

// dropPrepared closes and removes a prepared segment, if any. Writer (or
// Close, after the writer stopped) only.
func (w *WAL) dropPrepared() error {
	if w.ready == nil && w.preparing != nil {
		p := <-w.preparing
		w.ready = &p
	}
	if w.ready == nil {
		return nil
	}
	p := *w.ready
	w.ready, w.preparing = nil, nil
	if p.err != nil {
		return nil // nothing to keep; Open removes a leftover
	}
	p.f.Close()
	return w.opts.FS.Remove(filepath.Join(w.opts.Dir, preparedName))
}

// Close waits for queued commits, stops the writer and closes the active
// segment. It returns the sticky error, if any.
func (w *WAL) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return ErrClosed
	}
	w.closed = true
	w.cond.Broadcast()
	w.mu.Unlock()
	<-w.writerDone
	close(w.removals)
	<-w.removerDone
	if w.stopTick != nil {
		close(w.stopTick)
		<-w.tickDone
	}
	w.pressWG.Wait()
	err := w.dropPrepared()
	if w.active != nil {
		if w.dirty {
			err = errors.Join(err, w.active.Sync())
			w.dirty = false
		}
		err = errors.Join(err, w.active.Close())
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return w.err
	}
	return err
}
