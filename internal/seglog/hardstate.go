package seglog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/vfs"
)

// HardState file. Raft's HardState (term, vote, commit) and the ConfState
// live in one small file next to the segments, named hardStateName, holding
// two fixed slots:
//
//	offset 0                      hsSlotBytes                  2*hsSlotBytes
//	+-----------------------------+-----------------------------+
//	| slot 0                      | slot 1                      |
//	+-----------------------------+-----------------------------+
//
//	slot:  0        4        8          16     24     32       40
//	       +--------+--------+----------+------+------+--------+==========+
//	       | crc32c | length | sequence | term | vote | commit | confstate|
//	       | u32 LE | u32 LE |  u64 LE  | u64  | u64  |  u64   | protobuf |
//	       +--------+--------+----------+------+------+--------+==========+
//	       crc32c covers bytes [4, 8+length); length counts from byte 8.
//
// Open takes the valid slot with the higher sequence. A write always goes to
// the slot that does not hold the last synced state, so a torn write leaves
// that state intact: after a crash the file yields the old state or the new
// one, never a mix. A file with no valid slot (never written, or its first
// write torn) is the empty HardState.
//
// What is durable when (this is raft's own rule, raft.MustSync):
//   - a change of Term or Vote, and SetConfState: synced before the call
//     returns;
//   - a change of Commit alone: written to the OS on return and synced by the
//     next synced change, SyncHardState or Close. A crash can roll Commit
//     back; raft re-learns it (a group of one re-commits its log when it is
//     elected again), so it never needs to be durable at once.
const (
	hardStateName  = "hardstate"
	hsSlotBytes    = 4096
	hsFixedBytes   = 40
	hsConfBytesMax = hsSlotBytes - hsFixedBytes
)

// ErrConfStateTooLarge is returned by SetConfState when the encoded
// ConfState does not fit its slot (about 500 members).
var ErrConfStateTooLarge = errors.New("seglog: conf state too large")

// hardStateFile is the open HardState file. mu guards everything; it is
// never held together with Log.mu or Log.segMu.
type hardStateFile struct {
	mu      sync.Mutex
	fs      vfs.FS
	name    string
	f       vfs.File // nil until the first write when the file did not exist
	closed  bool
	seq     uint64 // sequence of the last slot written
	durSlot int    // slot holding the last synced state
	// cur is the latest state set; dur the latest synced one.
	cur, dur hsState
	dirty    bool // cur was written but not synced
}

type hsState struct {
	term, vote, commit uint64
	conf               []byte // encoded ConfState
}

// open reads the file if it exists; a log that never stored a HardState
// has none (so logs used only through Append carry no extra file).
// durable says the file system was synced whole since the last process
// wrote it (Options.SurvivorsDurable).
func (h *hardStateFile) open(fsys vfs.FS, dir string, durable bool) error {
	name := filepath.Join(dir, hardStateName)
	h.fs, h.name, h.durSlot = fsys, name, 1 // no valid slot: the first write goes to slot 0
	if _, err := fsys.Stat(name); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	f, err := fsys.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("seglog: open %s: %w", name, err)
	}
	buf := make([]byte, 2*hsSlotBytes)
	k, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		_ = f.Close()
		return fmt.Errorf("seglog: read %s: %w", name, err)
	}
	buf = buf[:k]
	h.f = f
	for slot := range 2 {
		lo := slot * hsSlotBytes
		if lo >= len(buf) {
			break
		}
		seq, st, ok := decodeHSSlot(buf[lo:min(len(buf), lo+hsSlotBytes)])
		if ok && seq > h.seq {
			h.seq, h.durSlot, h.cur = seq, slot, st
		}
	}
	h.dur = h.cur
	// What we read may be an unsynced survivor of a process crash: sync it
	// before anyone relies on it (unless the whole file system was).
	if h.seq > 0 && !durable {
		if err := f.Sync(); err != nil {
			_ = f.Close()
			return fmt.Errorf("seglog: fdatasync %s: %w", name, err)
		}
	}
	return nil
}

// decodeHSSlot decodes one slot; ok is false for a slot that does not verify.
func decodeHSSlot(b []byte) (seq uint64, st hsState, ok bool) {
	if len(b) < hsFixedBytes {
		return 0, hsState{}, false
	}
	n := int(binary.LittleEndian.Uint32(b[4:8]))
	if n < hsFixedBytes-8 || 8+n > len(b) || 8+n > hsSlotBytes {
		return 0, hsState{}, false
	}
	if crc32cOf(b[4:8+n]) != binary.LittleEndian.Uint32(b[0:4]) {
		return 0, hsState{}, false
	}
	seq = binary.LittleEndian.Uint64(b[8:16])
	if seq == 0 {
		return 0, hsState{}, false
	}
	st = hsState{
		term:   binary.LittleEndian.Uint64(b[16:24]),
		vote:   binary.LittleEndian.Uint64(b[24:32]),
		commit: binary.LittleEndian.Uint64(b[32:40]),
		conf:   append([]byte(nil), b[40:8+n]...),
	}
	return seq, st, true
}

// encodeHSSlot encodes one HardState file slot; conf is the encoded
// ConfState.
func encodeHSSlot(seq, term, vote, commit uint64, conf []byte) []byte {
	b := make([]byte, hsFixedBytes+len(conf))
	binary.LittleEndian.PutUint32(b[4:8], uint32(len(b)-8))
	binary.LittleEndian.PutUint64(b[8:16], seq)
	binary.LittleEndian.PutUint64(b[16:24], term)
	binary.LittleEndian.PutUint64(b[24:32], vote)
	binary.LittleEndian.PutUint64(b[32:40], commit)
	copy(b[40:], conf)
	binary.LittleEndian.PutUint32(b[0:4], crc32cOf(b[4:]))
	return b
}

// write stores st in the slot that does not hold the synced state, and
// syncs it if sync is set. Caller holds mu.
func (h *hardStateFile) write(st hsState, sync bool) error {
	if h.f == nil {
		f, err := h.fs.OpenFile(h.name, os.O_CREATE|os.O_RDWR, vfs.FilePerm)
		if err != nil {
			return fmt.Errorf("%w: create hardstate: %w", ErrFailed, err)
		}
		if err := h.fs.SyncDir(filepath.Dir(h.name)); err != nil {
			_ = f.Close()
			return fmt.Errorf("%w: sync dir: %w", ErrFailed, err)
		}
		h.f = f
	}
	slot := 1 - h.durSlot
	b := encodeHSSlot(h.seq+1, st.term, st.vote, st.commit, st.conf)
	if _, err := h.f.WriteAt(b, int64(slot*hsSlotBytes)); err != nil {
		return fmt.Errorf("%w: write hardstate: %w", ErrFailed, err)
	}
	h.seq++
	h.cur = st
	h.dirty = true
	if sync {
		return h.syncLocked()
	}
	return nil
}

func (h *hardStateFile) syncLocked() error {
	if !h.dirty {
		return nil
	}
	if err := h.f.Sync(); err != nil {
		return fmt.Errorf("%w: fdatasync hardstate: %w", ErrFailed, err)
	}
	h.durSlot = 1 - h.durSlot
	h.dur = h.cur
	h.dirty = false
	return nil
}

func (h *hardStateFile) close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	if h.f == nil {
		return nil
	}
	err := h.syncLocked()
	if cerr := h.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// SetHardState stores raft's HardState. A change of Term or Vote is durable
// when it returns; a change of Commit alone is written to the OS and becomes
// durable with the next synced change, SyncHardState or Close (see the
// HardState file notes in hardstate.go). nil is the empty HardState.
func (l *Log) SetHardState(hs *raftpb.HardState) error {
	h := &l.hs
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	st := h.cur
	st.term, st.vote, st.commit = 0, 0, 0
	if hs != nil {
		st.term, st.vote, st.commit = hs.Term, hs.Vote, hs.Commit
	}
	if st.term == h.cur.term && st.vote == h.cur.vote && st.commit == h.cur.commit {
		return nil
	}
	return h.write(st, st.term != h.dur.term || st.vote != h.dur.vote)
}

// SetHardStateJournaled is SetHardState for a HardState made durable
// elsewhere (the node journal, in the same fsync as the entries it goes
// with): it is written to the OS without an fdatasync, and counts as
// durable for later commit-only changes. It becomes durable in this file
// with the next synced change, SyncHardState or Close; until then recovery
// takes it from the journal.
func (l *Log) SetHardStateJournaled(hs *raftpb.HardState) error {
	h := &l.hs
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	st := h.cur
	st.term, st.vote, st.commit = hs.Term, hs.Vote, hs.Commit
	if st.term == h.cur.term && st.vote == h.cur.vote && st.commit == h.cur.commit {
		return nil
	}
	if err := h.write(st, false); err != nil {
		return err
	}
	h.dur.term, h.dur.vote = st.term, st.vote
	return nil
}

// HardState returns the HardState last set (or read at Open), as a new
// message the caller owns.
func (l *Log) HardState() *raftpb.HardState {
	h := &l.hs
	h.mu.Lock()
	defer h.mu.Unlock()
	return &raftpb.HardState{Term: h.cur.term, Vote: h.cur.vote, Commit: h.cur.commit}
}

// SetConfState stores the raft group's configuration; it is durable when it
// returns. ConfStates larger than a slot fail with ErrConfStateTooLarge.
func (l *Log) SetConfState(cs *raftpb.ConfState) error {
	b, err := cs.Marshal()
	if err != nil {
		return fmt.Errorf("seglog: encode conf state: %w", err)
	}
	if len(b) > hsConfBytesMax {
		return fmt.Errorf("%w: %d bytes", ErrConfStateTooLarge, len(b))
	}
	h := &l.hs
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	st := h.cur
	st.conf = b
	return h.write(st, true)
}

// ConfState returns the ConfState last set (empty if none), as a new message
// the caller owns.
func (l *Log) ConfState() (*raftpb.ConfState, error) {
	h := &l.hs
	h.mu.Lock()
	b := h.cur.conf
	h.mu.Unlock()
	cs := &raftpb.ConfState{}
	if err := cs.Unmarshal(b); err != nil {
		return nil, fmt.Errorf("seglog: decode conf state: %w", err)
	}
	return cs, nil
}

// SyncHardState makes the last HardState set durable.
func (l *Log) SyncHardState() error {
	h := &l.hs
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	return h.syncLocked()
}
