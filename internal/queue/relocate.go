package queue

import (
	"fmt"
	"slices"
)

// Body locations. A message's body lives in its Enqueue record, at the LSN
// that is its offset, until a Relocate event copies it to the log's tail:
// the partition does that for the few live messages left in old log
// segments, so that retention can drop those segments. The offset stays
// the message's identity; only where its body is read from changes. The
// lowest LSN any unsettled message's body lives at is BodyFloor, which is
// at or above Frontier: segments below it hold no live body.

// BodyLoc says where the record holding a message's body is: LSN equals
// Offset for the message's own Enqueue record, or is the LSN of the
// Relocate record that last copied it.
type BodyLoc struct{ Offset, LSN uint64 }

// Relocate returns the event that moves the body of the unsettled message
// at offset to the record the event will be appended as. The caller sets
// the event's Msg to the message read from its current location (BodyLSN),
// so that the new record carries the whole body; Apply keeps only the
// location. Errors: ErrAlreadySettled, ErrUnknownOffset.
func (s *State) Relocate(dst []Event, offset uint64) ([]Event, error) {
	if offset >= s.nextLSN {
		return dst, fmt.Errorf("%w: relocate offset %d, next lsn %d", ErrUnknownOffset, offset, s.nextLSN)
	}
	if !s.bits.isLive(offset) {
		return dst, fmt.Errorf("%w: relocate offset %d", ErrAlreadySettled, offset)
	}
	return append(dst, Event{Kind: KindRelocate, Offset: offset}), nil
}

// BodyLSN returns the LSN of the record holding the body of the unsettled
// message at offset: offset itself unless the body was relocated. For an
// offset that is not an unsettled message it returns offset.
func (s *State) BodyLSN(offset uint64) uint64 {
	if at, ok := s.moved[offset]; ok {
		return at
	}
	return offset
}

// BodyFloor is the lowest LSN at which an unsettled message's body lives
// (NextLSN when none is unsettled). No log record below it is needed to
// deliver anything. It costs O(relocated messages) at most.
func (s *State) BodyFloor() uint64 {
	floor := s.nextLSN
	if off, ok := s.nextUnmoved(0); ok {
		floor = off
	}
	if j := s.nextMoved(s.movedHead); j < len(s.movedLog) {
		s.movedHead = j // everything before j is stale for good
		floor = min(floor, s.movedLog[j].LSN)
	}
	return floor
}

// OldestBodies appends to dst the locations of unsettled messages whose
// body lives below the LSN below, lowest body LSN first, at most max of
// them.
func (s *State) OldestBodies(dst []BodyLoc, below uint64, max int) []BodyLoc {
	off, inPlace := s.nextUnmoved(0)
	j := s.nextMoved(s.movedHead)
	for n := 0; n < max; n++ {
		in := inPlace && off < below
		moved := j < len(s.movedLog) && s.movedLog[j].LSN < below
		switch {
		case in && (!moved || off < s.movedLog[j].LSN):
			dst = append(dst, BodyLoc{Offset: off, LSN: off})
			off, inPlace = s.nextUnmoved(off + 1)
		case moved:
			dst = append(dst, s.movedLog[j])
			j = s.nextMoved(j + 1)
		default:
			return dst
		}
	}
	return dst
}

// nextUnmoved returns the lowest unsettled offset at or after from whose
// body was not relocated.
func (s *State) nextUnmoved(from uint64) (uint64, bool) {
	for {
		off, ok := s.bits.nextOf(from, anyLive)
		if !ok {
			return 0, false
		}
		if _, moved := s.moved[off]; !moved {
			return off, true
		}
		from = off + 1
	}
}

// nextMoved returns the first movedLog index at or after j that is still
// current, or len(s.movedLog).
func (s *State) nextMoved(j int) int {
	for ; j < len(s.movedLog); j++ {
		if loc := s.movedLog[j]; s.moved[loc.Offset] == loc.LSN {
			return j
		}
	}
	return j
}

// moveBody records that the body of the unsettled message at offset now
// lives at lsn, and drops stale relocations from the log once they
// outnumber the current ones.
func (s *State) moveBody(offset, lsn uint64) {
	s.moved[offset] = lsn
	s.movedLog = append(s.movedLog, BodyLoc{Offset: offset, LSN: lsn})
	if len(s.movedLog)-s.movedHead > 2*len(s.moved)+s.slack {
		live := s.movedLog[:0]
		for _, loc := range s.movedLog[s.movedHead:] {
			if s.moved[loc.Offset] == loc.LSN {
				live = append(live, loc)
			}
		}
		clear(s.movedLog[len(live):])
		s.movedLog, s.movedHead = live, 0
	}
}

// rebuildMovedLog orders the relocations of a restored state by LSN.
func (s *State) rebuildMovedLog() {
	s.movedLog, s.movedHead = s.movedLog[:0], 0
	for off, at := range s.moved {
		s.movedLog = append(s.movedLog, BodyLoc{Offset: off, LSN: at})
	}
	slices.SortFunc(s.movedLog, func(a, b BodyLoc) int { return cmpU64(a.LSN, b.LSN) })
}
