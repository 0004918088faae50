package raftlog

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/budget"
	"github.com/sinewmq/sinew/internal/seglog"
)

// Record types reserved for raft entries that are not queue events.
const (
	TypeNoop         uint8 = 0xF0 // an empty EntryNormal: a new leader's no-op
	TypeConfChange   uint8 = 0xF1 // EntryConfChange
	TypeConfChangeV2 uint8 = 0xF2 // EntryConfChangeV2
	typeReservedMin  uint8 = 0xF0 // types from here up belong to raftlog
)

// CacheBytesMaxDefault is the default Options.CacheBytesMax.
const CacheBytesMaxDefault = 16 << 20

// ErrReservedType is returned by Append for a normal entry whose first data
// byte is a record type reserved by this package.
var ErrReservedType = errors.New("raftlog: entry uses a reserved record type")

// ErrBadEntry is returned (wrapped) by Append for entries that are not a
// contiguous run continuing the log.
var ErrBadEntry = errors.New("raftlog: entries out of order")

// Options configure New.
type Options struct {
	// CacheBytesMax bounds the memory of un-applied entries kept in the
	// cache: their data bytes plus cacheEntryBytes each. Default
	// CacheBytesMaxDefault, or with Budget set, no bound but the
	// budget's.
	CacheBytesMax int
	// Budget, when set, is a node-wide budget the cache shares with the
	// caches of other groups: its entries count against it, and when it
	// is full the group whose oldest cached entry is the coldest drops
	// entries from the front (they are read from the log if raft wants
	// them again).
	Budget *budget.Budget
	// Snapshot, if set, supplies a snapshot (metadata and data) when raft
	// asks for one; it may return raft.ErrSnapshotTemporarilyUnavailable.
	Snapshot func() (*raftpb.Snapshot, error)
}

// Storage is raft's Storage over a seglog.Log, plus the write side raft's
// Ready loop needs. See the package documentation.
type Storage struct {
	log  *seglog.Log
	opts Options

	mu sync.Mutex
	// cache holds the entries from cache[0].Index to the last index, in
	// order, when not empty; cacheBytes is their cost (cost).
	cache      []raftpb.Entry
	cacheBytes int
	// stamps[i] is the budget's stamp when cache[i] was put (only with
	// a budget); share is the cache's part of it, joined at the first
	// put and left by Close.
	stamps []uint64
	share  *budget.Share
	// deadFront counts the slots dropped from the front of cache's array
	// since it was last allocated: their data stays reachable until then.
	deadFront int
	// snap is the last snapshot applied or created, nil if none.
	snap *raftpb.Snapshot
	// diskReads and memReads count Entries calls that had to read
	// segment files and those served from the cache alone (tests and
	// benchmarks check the hot path stays in memory).
	diskReads, memReads uint64
}

var _ raft.Storage = (*Storage)(nil)

// New returns a Storage over log. The log's records are taken as raft
// entries; the cache starts empty, so entries written before the restart are
// read from the files once.
func New(log *seglog.Log, opts Options) *Storage {
	if opts.CacheBytesMax <= 0 {
		opts.CacheBytesMax = CacheBytesMaxDefault
		if opts.Budget != nil {
			opts.CacheBytesMax = int(min(opts.Budget.Limit(), 1<<40))
		}
	}
	return &Storage{log: log, opts: opts}
}

// InitialState returns the persisted HardState and ConfState. It refuses a
// HardState whose commit index is past the last entry, which raft could not
// start from.
func (s *Storage) InitialState() (raftpb.HardState, raftpb.ConfState, error) {
	hs := s.log.HardState()
	cs, err := s.log.ConfState()
	if err != nil {
		return raftpb.HardState{}, raftpb.ConfState{}, err
	}
	if last := s.log.NextLSN() - 1; hs.Commit > last {
		return raftpb.HardState{}, raftpb.ConfState{}, fmt.Errorf("raftlog: stored commit index %d is past the last entry %d", hs.Commit, last)
	}
	return *hs, *cs, nil
}

// FirstIndex returns the first index whose entry is available.
func (s *Storage) FirstIndex() (uint64, error) { return s.log.FirstLSN(), nil }

// LastIndex returns the index of the last entry (FirstIndex-1 when empty).
func (s *Storage) LastIndex() (uint64, error) { return s.log.NextLSN() - 1, nil }

// Term returns the term of entry i, for i in [FirstIndex-1, LastIndex].
func (s *Storage) Term(i uint64) (uint64, error) {
	t, err := s.log.Term(i)
	switch {
	case err == nil:
		return t, nil
	case errors.Is(err, seglog.ErrCompacted):
		return 0, raft.ErrCompacted
	case errors.Is(err, seglog.ErrNotFound):
		return 0, raft.ErrUnavailable
	}
	return 0, err
}

// Entries returns entries [lo, hi), at most maxSize bytes of them (by their
// encoded size, as raft counts) but at least one. Entries still in the cache
// come from memory; older ones are read from the segment files.
func (s *Storage) Entries(lo, hi, maxSize uint64) ([]raftpb.Entry, error) {
	first, next := s.log.FirstLSN(), s.log.NextLSN()
	if lo < first {
		return nil, raft.ErrCompacted
	}
	if hi > next || lo >= hi {
		if lo == hi && hi <= next {
			return nil, nil
		}
		return nil, raft.ErrUnavailable
	}
	s.mu.Lock()
	cacheFirst := next
	if n := len(s.cache); n > 0 && s.cache[0].Index+uint64(n) == next {
		cacheFirst = s.cache[0].Index // the cache ends at the last index, as it should
	}
	if lo >= cacheFirst {
		ents := s.cache[lo-cacheFirst : hi-cacheFirst]
		s.memReads++
		s.mu.Unlock()
		ents = limitSize(ents, maxSize)
		return ents[:len(ents):len(ents)], nil
	}
	s.diskReads++
	// The cache may be replaced while the files are read; take the part
	// of it needed now.
	var tail []raftpb.Entry
	if hi > cacheFirst {
		tail = s.cache[: hi-cacheFirst : hi-cacheFirst]
	}
	s.mu.Unlock()

	var out []raftpb.Entry
	var size uint64
	stop := errors.New("stop")
	err := s.log.ScanRange(lo, min(hi, cacheFirst)-1, func(r seglog.Record) error {
		e := recordToEntry(r)
		n := uint64(e.Size())
		if len(out) > 0 && size+n > maxSize {
			return stop
		}
		out = append(out, e)
		size += n
		return nil
	})
	switch {
	case errors.Is(err, stop):
		return out, nil
	case errors.Is(err, seglog.ErrNotFound):
		return nil, raft.ErrCompacted // dropped while we read
	case err != nil:
		return nil, err
	}
	if uint64(len(out)) != min(hi, cacheFirst)-lo {
		return nil, raft.ErrUnavailable // truncated while we read
	}
	for _, e := range tail {
		n := uint64(e.Size())
		if size+n > maxSize {
			break
		}
		out = append(out, e)
		size += n
	}
	return out, nil
}

// limitSize returns the longest prefix of ents within maxSize encoded bytes,
// and at least one entry.
func limitSize(ents []raftpb.Entry, maxSize uint64) []raftpb.Entry {
	if len(ents) == 0 || maxSize == noLimit {
		return ents
	}
	size := uint64(ents[0].Size())
	for i := 1; i < len(ents); i++ {
		size += uint64(ents[i].Size())
		if size > maxSize {
			return ents[:i]
		}
	}
	return ents
}

// noLimit is raft's "no size limit" (math.MaxUint64).
const noLimit = ^uint64(0)

// Snapshot returns the most recent snapshot: the one from Options.Snapshot
// if set, else the last one applied or created, else (for a log that still
// starts at index 1) an empty one. A log that starts later without a
// snapshot source has no data to send: raft.ErrSnapshotTemporarilyUnavailable.
func (s *Storage) Snapshot() (raftpb.Snapshot, error) {
	s.mu.Lock()
	snap, src := s.snap, s.opts.Snapshot
	s.mu.Unlock()
	if src != nil {
		sn, err := src()
		if err != nil {
			return raftpb.Snapshot{}, err
		}
		return *sn, nil
	}
	if snap != nil {
		return *CloneSnapshot(snap), nil
	}
	if s.log.FirstLSN() == 1 {
		cs, err := s.log.ConfState()
		if err != nil {
			return raftpb.Snapshot{}, err
		}
		return raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{ConfState: *cs}}, nil
	}
	return raftpb.Snapshot{}, raft.ErrSnapshotTemporarilyUnavailable
}

// CloneSnapshot returns a copy of snap that shares nothing the caller may
// change: the data is shared (nobody writes it once made), the
// configuration's id lists are copied.
func CloneSnapshot(snap *raftpb.Snapshot) *raftpb.Snapshot {
	c := *snap
	c.Metadata.ConfState = CloneConfState(snap.Metadata.ConfState)
	return &c
}

// CloneConfState returns a deep copy of cs.
func CloneConfState(cs raftpb.ConfState) raftpb.ConfState {
	return raftpb.ConfState{
		Voters:         slices.Clone(cs.Voters),
		Learners:       slices.Clone(cs.Learners),
		VotersOutgoing: slices.Clone(cs.VotersOutgoing),
		LearnersNext:   slices.Clone(cs.LearnersNext),
		AutoLeave:      cs.AutoLeave,
	}
}

// SetSnapshotSource sets (or, with nil, clears) the hook Snapshot calls, as
// Options.Snapshot does, for a partition that can make snapshots only once
// it is running.
func (s *Storage) SetSnapshotSource(fn func() (*raftpb.Snapshot, error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.Snapshot = fn
}

// Append writes entries to the log (buffered: durable after Sync). The run
// must be contiguous and start at or before LastIndex+1; entries from its
// first index on replace what the log holds there (a follower's conflicting
// suffix). Entries at or before FirstIndex-1 are skipped, as raft may resend
// a prefix the log has compacted.
func (s *Storage) Append(ents []raftpb.Entry) error {
	if len(ents) == 0 {
		return nil
	}
	first := s.log.FirstLSN()
	if ents[len(ents)-1].Index < first {
		return nil
	}
	if k := ents[0].Index; k < first {
		ents = ents[first-k:]
	}
	s.mu.Lock()
	over := false
	defer func() {
		s.mu.Unlock()
		if over {
			s.opts.Budget.Reclaim()
		}
	}()
	for i := range ents {
		e := &ents[i]
		if i > 0 && e.Index != ents[i-1].Index+1 {
			return fmt.Errorf("%w: index %d after %d", ErrBadEntry, e.Index, ents[i-1].Index)
		}
		typ, payload, err := entryToRecord(e)
		if err != nil {
			return err
		}
		if err := s.log.AppendAt(e.Index, e.Term, typ, payload); err != nil {
			if errors.Is(err, seglog.ErrBadIndex) {
				return fmt.Errorf("%w: %w", ErrBadEntry, err)
			}
			return err
		}
		over = s.cachePut(e) || over
	}
	return nil
}

// cacheEntryBytes is what one cached entry costs besides its data: the
// Entry in the slice and its share of the array's spare room. Counting it keeps
// a tail of tiny entries (acks) within CacheBytesMax too.
const cacheEntryBytes = 64

// cost is an entry's share of CacheBytesMax.
func cost(e *raftpb.Entry) int { return cacheEntryBytes + len(e.Data) }

// cachePut adds e (just appended at its index) to the cache, dropping any
// cached entries at or after its index first. Caller holds mu. It reports
// whether the budget is over its limit (the caller reclaims once it has
// released mu).
func (s *Storage) cachePut(e *raftpb.Entry) (over bool) {
	idx := e.Index
	if n := len(s.cache); n > 0 {
		c0 := s.cache[0].Index
		switch {
		case idx < c0:
			s.dropCache()
		case idx <= c0+uint64(n)-1:
			k := int(idx - c0)
			freed := 0
			for i := range s.cache[k:] {
				freed += cost(&s.cache[k+i])
			}
			s.cacheBytes -= freed
			s.charge(-freed)
			// A fresh array: entries handed out by Entries must not change.
			s.cache = append([]raftpb.Entry(nil), s.cache[:k]...)
			s.deadFront = 0
			if s.stamps != nil {
				s.stamps = append([]uint64(nil), s.stamps[:k]...)
			}
		case idx > c0+uint64(n):
			s.dropCache() // cannot happen for a contiguous log
		}
	}
	if len(s.cache) == cap(s.cache) {
		s.deadFront = 0 // append allocates a new array
	}
	s.cache = append(s.cache, *e)
	c := cost(e)
	s.cacheBytes += c
	if b := s.opts.Budget; b != nil {
		if s.share == nil {
			s.share = b.Join(s)
		}
		s.stamps = append(s.stamps, b.Stamp())
		over = s.share.Add(int64(c))
	}
	if s.cacheBytes > s.opts.CacheBytesMax && len(s.cache) > 1 {
		s.dropFront(s.cacheBytes-s.opts.CacheBytesMax, 1)
	}
	s.setColdest()
	return over
}

// charge accounts n more (or, negative, fewer) cached bytes against the
// budget. Caller holds mu.
func (s *Storage) charge(n int) {
	switch {
	case s.share == nil || n == 0:
	case n > 0:
		s.share.Add(int64(n))
	default:
		s.share.Sub(int64(-n))
	}
}

// dropCache empties the cache. Caller holds mu.
func (s *Storage) dropCache() {
	s.charge(-s.cacheBytes)
	s.cache, s.cacheBytes, s.stamps, s.deadFront = nil, 0, nil, 0
	s.setColdest()
}

// dropFront drops entries from the front of the cache until want bytes are
// freed, keeping at least keep entries, and returns the bytes freed. Caller
// holds mu.
//
// The dropped slots are not cleared: Entries hands out sub-slices of the
// array, and raft keeps them (in its log and in messages still on their way
// to a follower), so a slot must never change once handed out. Their data
// stays reachable until the array goes; so once the dead prefix outgrows the
// live entries, the live ones move to a fresh array and the old one goes as
// soon as raft lets go of what it was handed.
func (s *Storage) dropFront(want, keep int) int {
	k, freed := 0, 0
	for freed < want && len(s.cache)-k > keep {
		freed += cost(&s.cache[k])
		k++
	}
	if k == 0 {
		return 0
	}
	s.cacheBytes -= freed
	s.charge(-freed)
	s.cache = s.cache[k:]
	s.deadFront += k
	if s.stamps != nil {
		s.stamps = s.stamps[k:]
	}
	switch {
	case len(s.cache) == 0:
		s.cache, s.stamps, s.deadFront = nil, nil, 0 // let the array go
	case s.deadFront > len(s.cache) && s.deadFront >= deadFrontMin:
		s.cache = append(make([]raftpb.Entry, 0, len(s.cache)+len(s.cache)/4), s.cache...)
		if s.stamps != nil {
			s.stamps = append(make([]uint64, 0, cap(s.cache)), s.stamps...)
		}
		s.deadFront = 0
	}
	s.setColdest()
	return freed
}

// deadFrontMin is the dead prefix below which the array is kept.
const deadFrontMin = 1024

// setColdest publishes the oldest cached entry's stamp to the budget.
// Caller holds mu.
func (s *Storage) setColdest() {
	if s.share == nil {
		return
	}
	if len(s.stamps) > 0 {
		s.share.SetColdest(s.stamps[0])
	} else {
		s.share.SetColdest(0)
	}
}

// Evict is budget.Cache's: the budget is full and this cache holds the
// coldest entries. It drops about want bytes from the front.
func (s *Storage) Evict(want int64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	freed := s.dropFront(int(min(want, int64(s.cacheBytes))), 0)
	if s.share != nil {
		s.share.Trim()
	}
	return int64(freed)
}

// Close leaves the budget (if any) and drops the cache. The Storage must
// not be used afterwards.
func (s *Storage) Close() {
	s.mu.Lock()
	s.dropCache()
	sh := s.share
	s.share = nil
	s.mu.Unlock()
	if sh != nil {
		sh.Leave()
	}
}

// Sync makes every appended entry durable.
func (s *Storage) Sync() error {
	_, err := s.log.Sync()
	return err
}

// SetHardState stores hs; see the package documentation for when it is
// durable.
func (s *Storage) SetHardState(hs *raftpb.HardState) error { return s.log.SetHardState(hs) }

// SetConfState stores the group's configuration durably (after a
// configuration change is applied, or to bootstrap a new group's voters).
func (s *Storage) SetConfState(cs *raftpb.ConfState) error { return s.log.SetConfState(cs) }

// SetApplied tells the Storage that entries up to index are applied: they
// leave the in-memory cache.
func (s *Storage) SetApplied(index uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.cache) == 0 {
		return
	}
	c0 := s.cache[0].Index
	if index < c0 {
		return
	}
	k := min(index-c0+1, uint64(len(s.cache)))
	bytes := 0
	for i := range k {
		bytes += cost(&s.cache[i])
	}
	// See dropFront on the slots dropped.
	s.dropFront(bytes, 0)
}

// ApplySnapshot replaces the log with an empty one that continues after the
// snapshot, durably, and stores its ConfState. A snapshot not newer than the
// current start point returns raft.ErrSnapOutOfDate.
func (s *Storage) ApplySnapshot(snap *raftpb.Snapshot) error {
	md := snap.Metadata
	if first := s.log.FirstLSN(); md.Index < first-1 || (md.Index == first-1 && first > 1) {
		return raft.ErrSnapOutOfDate
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.log.ResetTo(md.Index, md.Term); err != nil {
		return err
	}
	if err := s.log.SetConfState(&md.ConfState); err != nil {
		return err
	}
	s.dropCache()
	s.snap = CloneSnapshot(snap)
	return nil
}

// InstallSnapshot records snap as installed when the caller has itself
// made the log continue after snap's index: the log may keep entries at and
// below that index (committed ones, identical to the leader's), which raft
// may still read. The cache is dropped and the ConfState stored.
func (s *Storage) InstallSnapshot(snap *raftpb.Snapshot) error {
	md := snap.Metadata
	if next := s.log.NextLSN(); next != md.Index+1 {
		return fmt.Errorf("%w: log continues at %d, snapshot is at %d", ErrBadEntry, next, md.Index)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.log.SetConfState(&md.ConfState); err != nil {
		return err
	}
	s.dropCache()
	s.snap = CloneSnapshot(snap)
	return nil
}

// CreateSnapshot records a snapshot the application made at index i (which
// must be in the log) with configuration cs and data, for Snapshot to
// return. The log itself is not compacted; retention calls Compact.
func (s *Storage) CreateSnapshot(i uint64, cs *raftpb.ConfState, data []byte) (*raftpb.Snapshot, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snap != nil && i <= s.snap.Metadata.Index {
		return nil, raft.ErrSnapOutOfDate
	}
	term, err := s.Term(i)
	if err != nil {
		return nil, err
	}
	s.snap = &raftpb.Snapshot{
		Data:     data,
		Metadata: raftpb.SnapshotMetadata{Index: i, Term: term, ConfState: CloneConfState(*cs)},
	}
	return CloneSnapshot(s.snap), nil
}

// Compact lets the log drop whole segments whose entries are all before
// index (seglog.DropBefore); FirstIndex moves to the first kept entry.
// The application must have a snapshot covering what is dropped.
func (s *Storage) Compact(index uint64) error {
	_, err := s.log.DropBefore(index)
	return err
}

// DiskReads returns how many Entries calls read segment files.
func (s *Storage) DiskReads() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.diskReads
}

// MemReads returns how many Entries calls were served from memory alone.
func (s *Storage) MemReads() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.memReads
}

// entryToRecord maps a raft entry to a record type and payload.
func entryToRecord(e *raftpb.Entry) (uint8, []byte, error) {
	switch e.Type {
	case raftpb.EntryNormal:
		if len(e.Data) == 0 {
			return TypeNoop, nil, nil
		}
		if e.Data[0] >= typeReservedMin {
			return 0, nil, fmt.Errorf("%w: 0x%02x at index %d", ErrReservedType, e.Data[0], e.Index)
		}
		return e.Data[0], e.Data[1:], nil
	case raftpb.EntryConfChange:
		return TypeConfChange, e.Data, nil
	case raftpb.EntryConfChangeV2:
		return TypeConfChangeV2, e.Data, nil
	}
	return 0, nil, fmt.Errorf("%w: entry type %v at index %d", ErrBadEntry, e.Type, e.Index)
}

// recordToEntry maps a record back to the raft entry it was written from.
// The record's payload is copied: Scan lends it only for the callback.
func recordToEntry(r seglog.Record) raftpb.Entry {
	e := raftpb.Entry{Index: r.LSN, Term: r.Term}
	switch r.Type {
	case TypeNoop:
		e.Type = raftpb.EntryNormal
	case TypeConfChange:
		e.Type = raftpb.EntryConfChange
		e.Data = append([]byte(nil), r.Payload...)
	case TypeConfChangeV2:
		e.Type = raftpb.EntryConfChangeV2
		e.Data = append([]byte(nil), r.Payload...)
	default:
		e.Type = raftpb.EntryNormal
		e.Data = make([]byte, 1+len(r.Payload))
		e.Data[0] = r.Type
		copy(e.Data[1:], r.Payload)
	}
	return e
}
