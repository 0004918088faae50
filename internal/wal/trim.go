package wal

import (
	"path/filepath"
	"slices"
)

// Release says group's own files hold its entries up to index durably; WAL
// segments holding nothing else unreleased are deleted by the writer.
func (w *WAL) Release(group string, index uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if index > w.released[group] {
		w.released[group] = index
		w.kick = true
		w.cond.Broadcast()
	}
}

// Mark returns a token for ReleaseSince: take it before syncing the
// group's own files when that runs beside the group's commits.
func (w *WAL) Mark(group string) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lowered[group]
}

// ReleaseSince is Release for a caller that synced the group's own files
// while the group kept committing: it does nothing if a commit since mark
// rewrote indexes the group had released (a replica overwriting its
// suffix), since the sync may predate the rewrite.
func (w *WAL) ReleaseSince(group string, index, mark uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lowered[group] != mark {
		return
	}
	if index > w.released[group] {
		w.released[group] = index
		w.kick = true
		w.cond.Broadcast()
	}
}

// Forget drops group: its entries are released and its HardState is no
// longer carried into new segments.
func (w *WAL) Forget(group string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.released[group] = ^uint64(0)
	w.forgotten[group] = true
	delete(w.hs, group)
	delete(w.replayed, group)
	w.kick = true
	w.cond.Broadcast()
}

// Retire closes the WAL and, when every entry it holds is released (each
// group's own files hold it durably) and every replayed group was taken,
// deletes its segments: the directory then holds no WAL, so a node may
// start without one. Otherwise the segments stay and retired is false.
// After a crash in the middle some released segments may remain; replay
// finds nothing in them that the groups lack.
func (w *WAL) Retire() (retired bool, err error) {
	if err := w.Close(); err != nil {
		return false, err
	}
	w.mu.Lock()
	ok := len(w.replayed) == 0
	for _, s := range w.segs {
		ok = ok && w.releasedLocked(s)
	}
	segs := slices.Clone(w.segs)
	w.mu.Unlock()
	if !ok {
		return false, nil
	}
	for _, s := range segs {
		if err := w.opts.FS.Remove(filepath.Join(w.opts.Dir, segName(s.seq))); err != nil {
			return false, err
		}
	}
	if err := w.opts.FS.SyncDir(w.opts.Dir); err != nil {
		return false, err
	}
	return true, nil
}

// trim deletes released segments and, under pressure, asks the groups
// pinning the oldest segment to release it.
func (w *WAL) trim() error {
	w.mu.Lock()
	// Only the oldest segments go, in order: what replay finds for a
	// group is then one unbroken stretch of its writes, ending with the
	// last one, so an entry it holds is always the newest write of its
	// index. Deleting a released segment from the middle could leave an
	// older write of an index after a gap, to be taken for the newest.
	var drop []uint64
	n := 0
	for n < len(w.segs)-1 && w.releasedLocked(w.segs[n]) {
		drop = append(drop, w.segs[n].seq)
		n++
	}
	w.segs = slices.Clone(w.segs[n:])
	w.untrackForgottenLocked()
	// Every segment PressureSegments behind the active one is asked for
	// once, not only the oldest: a group that cannot release (a
	// quarantined partition) must not stop the others from being asked.
	ask := map[string]uint64{}
	newest := w.segs[len(w.segs)-1].seq
	for _, s := range w.segs {
		if w.opts.OnPressure == nil || newest-s.seq < w.opts.PressureSegments {
			break
		}
		if s.pressed {
			continue
		}
		s.pressed = true
		for g, idx := range s.maxIndex {
			if idx > w.released[g] {
				ask[g] = max(ask[g], idx)
			}
		}
	}
	w.mu.Unlock()
	for g, idx := range ask {
		w.pressWG.Add(1)
		go func() {
			defer w.pressWG.Done()
			w.opts.OnPressure(g, idx)
		}()
	}
	if len(drop) > 0 {
		w.removals <- drop
	}
	return nil
}

// untrackForgottenLocked stops tracking forgotten groups that no segment
// holds entries of and no queued commit names. Called by the writer, so
// no batch is being written meanwhile.
func (w *WAL) untrackForgottenLocked() {
	active := w.segs[len(w.segs)-1]
next:
	for g := range w.forgotten {
		for _, s := range w.segs {
			if _, ok := s.maxIndex[g]; ok {
				continue next
			}
		}
		for _, wt := range w.queue {
			if wt.group == g {
				continue next
			}
		}
		delete(w.forgotten, g)
		delete(w.lowered, g)
		delete(w.released, g)
		delete(w.ids, g)
		// A later commit under the name declares its new id again.
		delete(active.declared, g)
	}
}

// voidLocked forgets group's entries in every segment up to and including
// upTo: a reset record in upTo voided them. Entries later in upTo's batch
// are counted again by the caller.
func (w *WAL) voidLocked(group string, upTo *segInfo) {
	for _, s := range w.segs {
		delete(s.maxIndex, group)
		if s == upTo {
			return
		}
	}
	delete(upTo.maxIndex, group)
}

func (w *WAL) releasedLocked(s *segInfo) bool {
	for g, idx := range s.maxIndex {
		if idx > w.released[g] {
			return false
		}
	}
	return true
}
