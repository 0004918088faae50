package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
)

// Open opens (creating if needed) the WAL in opts.Dir, replays it, truncates
// a torn tail, starts a new segment and the writer goroutine. Replayed data is
// available through Take.
func Open(opts Options) (*WAL, error) {
	if opts.FS == nil || opts.Dir == "" {
		return nil, fmt.Errorf("%w: FS and Dir are required", ErrInvalid)
	}
	if opts.SegmentBytes <= 0 {
		opts.SegmentBytes = SegmentBytesDefault
	}
	if opts.PendingBytesMax <= 0 {
		opts.PendingBytesMax = PendingBytesMaxDefault
	}
	if opts.CommittersMax <= 0 {
		opts.CommittersMax = CommittersMaxDefault
	}
	if opts.PressureSegments == 0 {
		opts.PressureSegments = 4
	}
	if opts.NewTicker == nil {
		opts.NewTicker = func(d time.Duration) (<-chan time.Time, func()) {
			t := time.NewTicker(d)
			return t.C, t.Stop
		}
	}
	if opts.Prepare == PrepareOnDisk {
		opts.Prepare = PrepareNever
		if vfs.IsOS(opts.FS) {
			opts.Prepare = PrepareAlways
		}
	}
	w := &WAL{
		opts:        opts,
		ids:         map[string]uint32{},
		hs:          map[string]HardState{},
		released:    map[string]uint64{},
		forgotten:   map[string]bool{},
		lowered:     map[string]uint64{},
		replayed:    map[string]*Group{},
		writerDone:  make(chan struct{}),
		removals:    make(chan []uint64, removalsMax),
		removerDone: make(chan struct{}),
	}
	w.cond = sync.NewCond(&w.mu)
	fs := opts.FS
	if err := fs.MkdirAll(opts.Dir, vfs.DirPerm); err != nil {
		return nil, err
	}
	if err := fs.SyncDir(opts.Dir); err != nil {
		return nil, err
	}
	if err := fs.SyncDir(filepath.Dir(opts.Dir)); err != nil {
		return nil, err
	}
	names, err := fs.ReadDir(opts.Dir)
	if err != nil {
		return nil, err
	}
	var seqs []uint64
	for _, n := range names {
		if s, ok := parseSegName(n); ok {
			seqs = append(seqs, s)
		}
		if n == preparedName {
			if err := fs.Remove(filepath.Join(opts.Dir, n)); err != nil {
				return nil, err
			}
		}
	}
	slices.Sort(seqs)
	next := uint64(1)
	for i, s := range seqs {
		last := i == len(seqs)-1
		info, err := w.replaySegment(s, last)
		if err != nil {
			return nil, err
		}
		if info != nil {
			w.segs = append(w.segs, info)
		}
		next = s + 1
	}
	if err := w.roll(next); err != nil {
		return nil, err
	}
	if w.opts.Prepare == PrepareAlways {
		// The segment Open starts is only reserved; the writer moves to
		// a prepared one as soon as it is ready.
		w.startPreparing()
	}
	go w.remove()
	go w.run()
	if opts.SyncIntervalMs > 0 {
		w.stopTick, w.tickDone = make(chan struct{}), make(chan struct{})
		c, stop := opts.NewTicker(time.Duration(opts.SyncIntervalMs) * time.Millisecond)
		go func() {
			defer close(w.tickDone)
			defer stop()
			for {
				select {
				case <-w.stopTick:
					return
				case <-c:
				}
				w.mu.Lock()
				w.syncDue, w.kick = true, true
				w.cond.Broadcast()
				w.mu.Unlock()
			}
		}()
	}
	return w, nil
}

// replaySegment reads one segment into w.replayed. It returns nil info if
// the segment was a torn creation that it removed.
func (w *WAL) replaySegment(seq uint64, last bool) (*segInfo, error) {
	fs, name := w.opts.FS, segName(seq)
	path := filepath.Join(w.opts.Dir, name)
	f, err := fs.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	data := make([]byte, fi.Size())
	if _, err := f.ReadAt(data, 0); err != nil && err != io.EOF {
		return nil, err
	}
	damaged := func(off int64, reason string) error {
		return &DamagedError{Segment: name, Offset: off, Reason: reason}
	}
	hseq, why := checkSegHeader(data)
	if why != "" {
		// A new segment's header is synced before its name; a last segment
		// without a good header was being created when the crash came.
		if last && (len(data) < segHeaderBytes || allZero(data)) {
			if err := fs.Remove(path); err != nil {
				return nil, err
			}
			return nil, fs.SyncDir(w.opts.Dir)
		}
		return nil, damaged(0, why)
	}
	if hseq != seq {
		return nil, damaged(0, fmt.Sprintf("header seq %d does not match name", hseq))
	}
	info := &segInfo{seq: seq, maxIndex: map[string]uint64{}}
	local := map[uint32]string{}
	off := segHeaderBytes
	for off < len(data) {
		r, err := decodeRec(data[off:])
		if err != nil {
			if allZero(data[off:]) {
				break // reserved tail or clean end
			}
			// Torn: the record runs past the end, or nothing but the
			// reserved zeros follows the extent its length claims.
			torn := err == errShort
			if !torn && len(data)-off >= recHeaderBytes {
				end := off + recHeaderBytes + int(binary.LittleEndian.Uint32(data[off+4:off+8]))
				torn = end <= len(data) && allZero(data[end:])
			}
			if !last || !torn {
				return nil, damaged(int64(off), err.Error())
			}
			if err := f.Truncate(int64(off)); err != nil {
				return nil, err
			}
			if err := f.Sync(); err != nil {
				return nil, err
			}
			break
		}
		switch r.kind {
		case kindDeclare:
			local[r.gid] = string(r.payload)
		case kindReset:
			g, ok := local[r.gid]
			if !ok {
				return nil, damaged(int64(off), fmt.Sprintf("group id %d not declared in this segment", r.gid))
			}
			if grp := w.replayed[g]; grp != nil {
				grp.Entries = nil
			}
			w.voidLocked(g, info)
		case kindEntry, kindHardState:
			g, ok := local[r.gid]
			if !ok {
				return nil, damaged(int64(off), fmt.Sprintf("group id %d not declared in this segment", r.gid))
			}
			grp := w.replayed[g]
			if grp == nil {
				grp = &Group{}
				w.replayed[g] = grp
			}
			if r.kind == kindHardState {
				grp.HardState = HardState{Term: r.term, Vote: binary.LittleEndian.Uint64(r.payload), Commit: r.index}
				grp.HasHardState = true
				w.hs[g] = grp.HardState
				break
			}
			e := Entry{Index: r.index, Term: r.term, Type: r.typ, Payload: slices.Clone(r.payload)}
			if n := len(grp.Entries); n > 0 {
				first, lastIdx := grp.Entries[0].Index, grp.Entries[n-1].Index
				switch {
				case e.Index > lastIdx+1 || e.Index < first:
					grp.Entries = grp.Entries[:0]
				case e.Index <= lastIdx:
					grp.Entries = grp.Entries[:e.Index-first]
				}
			}
			grp.Entries = append(grp.Entries, e)
			info.maxIndex[g] = max(info.maxIndex[g], e.Index)
		}
		off += r.size
	}
	info.size = int64(off)
	return info, nil
}

// Take returns and forgets what replay found for group (ok false if
// nothing). The entries are owned by the caller.
func (w *WAL) Take(group string) (Group, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	g, ok := w.replayed[group]
	if !ok {
		return Group{}, false
	}
	delete(w.replayed, group)
	return *g, true
}

// Replayed returns the names of the groups whose replayed data was not
// taken yet, sorted.
func (w *WAL) Replayed() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for k := range w.replayed {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// HasSegments reports whether dir holds a WAL segment. A missing dir holds
// none; any other error reading it is returned.
func HasSegments(fsys vfs.FS, dir string) (bool, error) {
	names, err := fsys.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, n := range names {
		if _, ok := parseSegName(n); ok {
			return true, nil
		}
	}
	return false, nil
}
