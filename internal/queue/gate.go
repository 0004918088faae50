package queue

import (
	"errors"
	"fmt"
)

// The gate decides who may lease a partition's messages. It is part of the
// replicated state, so it holds across a failover: the new owner's replica
// applied the same Assign events and admits the same member.
//
//	gate                      who is leased messages
//	------------------------  -------------------------------------------
//	open (Cohort "")          plain consumers (no cohort); cohort members get nothing
//	Cohort c, Member m        the member m of cohort c, and nobody else
//	Cohort c, Member ""       nobody: the cohort holds the partition, no member is assigned
//
// The gate moves only by an Assign event, and Assign is refused while any
// message of the partition is inflight, whoever holds it. So a partition
// passes from one member to the next only after the first member's leases
// ended (settled, released or expired), and every inflight lease was granted
// under the current epoch. Each Assign raises Epoch by one, and a delivery
// carries the epoch it was leased under. Assign also forgets every lease
// that ended without a settle (see Ack): a late ack or fail from an earlier
// assignment of the partition gets ErrStaleLease and changes nothing, so the
// member the partition moved to is never settled for by another.
//
// Under a cohort member the gate also keeps order: Lease hands messages out
// lowest offset first, as always, and never passes a message that came back
// by a retry with a delay (Nack with a not-before) and waits for it. So a
// retried message reaches the member before anything of the partition that
// was not yet delivered. Messages published with a delay are not held back
// that way: they are delivered when they are due.

// Gate is the assignee of a partition's deliveries.
type Gate struct {
	// Cohort is the cohort holding the partition; "" means the gate is
	// open to plain consumers.
	Cohort string
	// Member is the member of Cohort assigned the partition; "" means
	// nobody (the partition is paused).
	Member string
	// Epoch is the assignment epoch: the number of Assign events applied.
	Epoch uint64
}

// Admits reports whether a consumer in cohort (plain: "") under member id
// member may be leased messages through g.
func (g Gate) Admits(cohort, member string) bool {
	if g.Cohort == "" {
		return cohort == ""
	}
	return cohort == g.Cohort && member != "" && member == g.Member
}

// GateFieldMax bounds the cohort and member names an Assign may carry.
const GateFieldMax = 255

var (
	// ErrGateBusy: Assign was called while a message of the partition is
	// inflight. The caller tries again once the leases ended.
	ErrGateBusy = errors.New("queue: gate busy: leases inflight")
)

// Gate returns the partition's gate.
func (s *State) Gate() Gate { return s.gate }

// Assign moves the gate to member of cohort (see Gate). It returns no event
// when the gate is there already, and ErrGateBusy while any message is
// inflight: nothing moves until every lease ended. A member without a
// cohort, or a name longer than GateFieldMax, is refused with
// ErrInvalidMessage.
func (s *State) Assign(dst []Event, cohort, member string, nowMs int64) ([]Event, error) {
	if cohort == "" && member != "" || len(cohort) > GateFieldMax || len(member) > GateFieldMax {
		return dst, fmt.Errorf("%w: assign cohort %q member %q", ErrInvalidMessage, cohort, member)
	}
	if s.gate.Cohort == cohort && s.gate.Member == member {
		return dst, nil
	}
	if n := s.counts[phaseInflight]; n > 0 {
		return dst, fmt.Errorf("assign cohort %q member %q: %d inflight: %w", cohort, member, n, ErrGateBusy)
	}
	return append(dst, Event{Kind: KindAssign, Target: cohort, Owner: member, Epoch: s.gate.Epoch + 1, AtMs: nowMs}), nil
}

// applyAssign folds an Assign event at lsn into the state.
func (s *State) applyAssign(lsn uint64, ev Event) error {
	if ev.Epoch != s.gate.Epoch+1 {
		return fmt.Errorf("%w: lsn %d: assign epoch %d, gate at %d", ErrCorrupt, lsn, ev.Epoch, s.gate.Epoch)
	}
	if s.counts[phaseInflight] != 0 {
		return fmt.Errorf("%w: lsn %d: assign with %d inflight", ErrCorrupt, lsn, s.counts[phaseInflight])
	}
	s.advance(lsn, true)
	s.gate = Gate{Cohort: ev.Target, Member: ev.Owner, Epoch: ev.Epoch}
	// Leases that ended without a settle belong to the earlier assignment:
	// their late settles are stale from now on. Entries only: a plain
	// message never had a lease. O(messages with state), once per move.
	for i := range s.slab {
		if e := &s.slab[i]; e.phase != 0 && e.queued() {
			e.leaseID = 0
		}
	}
	return nil
}

// retryBarrier is the lowest offset of a message that is waiting out a
// retry delay (delayed after at least one delivery), and whether there is
// one. Under a cohort member nothing at or past it is leased. It walks the
// delayed index: O(delayed messages), which under a member is bounded by
// what the member was handed.
func (s *State) retryBarrier() (uint64, bool) {
	if s.counts[phaseDelayed] == 0 {
		return 0, false
	}
	var low uint64
	found := false
	for _, it := range s.delayed.a {
		e, ok := s.live(it, phaseDelayed)
		if !ok || e.attempt == 0 {
			continue
		}
		if !found || e.off < low {
			low, found = e.off, true
		}
	}
	return low, found
}
