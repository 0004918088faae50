package queue

import (
	"errors"
	"fmt"
)

// Commands validate against the current state and append the events that
// carry them out to dst; they never change what the state reports. The
// caller appends each returned event to the log, in order, and applies it
// with Apply before issuing the next command. Every returned event must be
// applied, whatever command returned it: a Lease may also return
// DeadLetter events for expired messages it came across.

// Enqueue validates m and returns its Enqueue event. m.PublishedAtMs defaults
// to nowMs and m.ExpiresAtMs to PublishedAtMs+DefaultTTLMs when the config has
// one. The event's Msg is m itself when no default applies, otherwise a
// shallow copy; the caller must not modify either until it is encoded.
func (s *State) Enqueue(dst []Event, m *Message, nowMs int64) ([]Event, error) {
	if m == nil {
		return dst, fmt.Errorf("%w: nil message", ErrInvalidMessage)
	}
	if m.NotBeforeMs < 0 || m.ExpiresAtMs < 0 || m.PublishedAtMs < 0 {
		return dst, fmt.Errorf("%w: negative time (not_before %d, expires_at %d, published_at %d)",
			ErrInvalidMessage, m.NotBeforeMs, m.ExpiresAtMs, m.PublishedAtMs)
	}
	if m.PublishedAtMs == 0 || m.ExpiresAtMs == 0 && s.cfg.DefaultTTLMs > 0 {
		c := *m
		if c.PublishedAtMs == 0 {
			c.PublishedAtMs = max(nowMs, 0)
		}
		if c.ExpiresAtMs == 0 && s.cfg.DefaultTTLMs > 0 {
			c.ExpiresAtMs = c.PublishedAtMs + s.cfg.DefaultTTLMs
		}
		m = &c
	}
	return append(dst, Event{Kind: KindEnqueue, Msg: m}), nil
}

// Lease hands up to max ready messages (at most LeaseBatchMax), lowest
// offset first, to owner until nowMs+LeaseMs. Delayed messages whose
// not-before has come are ready. Lease ids come from the source given to
// SetLeaseIDs (random, so that nobody can guess another consumer's lease);
// without one they are consecutive after the highest one applied, and must
// then be applied in the order returned. An expired message met on the way
// is dead-lettered (ReasonExpired) instead of leased. Lease serves a plain
// consumer: it returns nothing while a cohort holds the gate (see LeaseAs).
func (s *State) Lease(dst []Event, owner string, max int, nowMs int64) []Event {
	return s.LeaseAs(dst, owner, "", "", max, nowMs)
}

// LeaseAs is Lease for a consumer that is member of cohort (plain: both
// ""). It returns nothing unless the gate admits the consumer, and under a
// cohort member it stops at a message waiting out a retry delay, so the
// member receives the partition's messages in order (see Gate).
func (s *State) LeaseAs(dst []Event, owner, cohort, member string, max int, nowMs int64) []Event {
	if max <= 0 || !s.gate.Admits(cohort, member) {
		return dst
	}
	max = min(max, LeaseBatchMax)
	s.promote(nowMs)
	barrier, barred := uint64(0), false
	if cohort != "" {
		barrier, barred = s.retryBarrier()
	}
	popped := s.scratch[:0]
	leased, expired := 0, 0
	// Two sources, merged by offset: ready entries in their index, and
	// waiting messages in the bitmap: plain ones (ready, attempt 0, no
	// TTL) and fresh entries (the same with a TTL).
	waitOff, waitOK := uint64(0), false
	if s.nPlain+s.nFresh > 0 {
		waitOff, waitOK = s.bits.nextOf(0, waiting)
	}
	for leased < max && expired < leaseExpiredScanMax {
		it, e, ok := s.top(&s.ready, phaseReady)
		if waitOK && (!ok || waitOff < it.off) {
			if barred && waitOff > barrier {
				break
			}
			off := waitOff
			waitOff, waitOK = s.bits.nextOf(off+1, waiting)
			_, w, _ := s.get(off)
			if s.expired(w, nowMs) {
				expired++
				dst = append(dst, s.deadLetter(off, 0, ReasonExpired, nowMs))
				continue
			}
			leased++
			dst = append(dst, Event{
				Kind:       KindLease,
				Offset:     off,
				LeaseID:    s.nextLeaseID(leased, w),
				Owner:      owner,
				DeadlineMs: nowMs + s.cfg.LeaseMs,
				Attempt:    nextAttempt(w.attempt),
				AtMs:       nowMs,
			})
			continue
		}
		if !ok || barred && it.off > barrier {
			break
		}
		// Take the item out so the next one surfaces; it goes back below.
		popped = append(popped, s.ready.pop())
		off := it.off
		if s.expired(e, nowMs) {
			expired++
			dst = append(dst, s.deadLetter(off, 0, ReasonExpired, nowMs))
			continue
		}
		leased++
		dst = append(dst, Event{
			Kind:       KindLease,
			Offset:     off,
			LeaseID:    s.nextLeaseID(leased, e),
			Owner:      owner,
			DeadlineMs: nowMs + s.cfg.LeaseMs,
			Attempt:    nextAttempt(e.attempt),
			AtMs:       nowMs,
		})
	}
	for _, it := range popped {
		s.ready.push(it)
	}
	s.scratch = popped[:0]
	return dst
}

// nextLeaseID is the id of the n-th lease (from 1) of the batch under way,
// a lease of e. A drawn id is never 0 and never e's last lease, whose late
// settle must not reach the new one.
func (s *State) nextLeaseID(n int, e *entry) uint64 {
	if s.leaseIDs == nil {
		return s.leaseSeq + uint64(n)
	}
	for {
		if id := s.leaseIDs(); id != 0 && id != e.leaseID {
			return id
		}
	}
}

// expired reports whether e's TTL has passed and is enforced.
func (s *State) expired(e *entry, nowMs int64) bool {
	return e.expiresAtMs > 0 && e.expiresAtMs <= nowMs && !s.cfg.DeadLetter.Keep
}

func (s *State) deadLetter(off, leaseID uint64, r Reason, nowMs int64) Event {
	return Event{Kind: KindDeadLetter, Offset: off, LeaseID: leaseID, Reason: r,
		Target: s.cfg.DeadLetter.Target, AtMs: nowMs}
}

// leased finds the inflight message offset under leaseID or says why not.
func (s *State) leased(op string, offset, leaseID uint64) (*entry, error) {
	if offset >= s.nextLSN {
		return nil, fmt.Errorf("%s offset %d (next lsn %d): %w", op, offset, s.nextLSN, ErrUnknownOffset)
	}
	_, e, ok := s.get(offset)
	if !ok {
		return nil, fmt.Errorf("%s offset %d: %w", op, offset, ErrAlreadySettled)
	}
	if e.phase != phaseInflight || e.leaseID != leaseID {
		return nil, fmt.Errorf("%s offset %d lease %d (message is %v, lease %d): %w",
			op, offset, leaseID, e.phase, e.leaseID, ErrStaleLease)
	}
	return e, nil
}

// ended finds the queued message offset whose last lease, leaseID, ended
// without a settle and has not been followed by another lease. err is what
// leased said about it, returned when it is not such a message.
func (s *State) ended(offset, leaseID uint64, err error) (*entry, error) {
	if !errors.Is(err, ErrStaleLease) {
		return nil, err
	}
	if _, e, ok := s.get(offset); ok && e.queued() && e.settleable(leaseID) {
		return e, nil
	}
	return nil, err
}

// Ack completes the message under its current lease: it becomes settled. The
// lease that last ended without a settle (expired or released) counts as
// current while the message waits to be leased again: the holder's late ack
// is the message's latest attempt, and nobody else holds it.
func (s *State) Ack(dst []Event, offset, leaseID uint64) ([]Event, error) {
	if _, err := s.leased("ack", offset, leaseID); err != nil {
		if _, err := s.ended(offset, leaseID, err); err != nil {
			return dst, err
		}
	}
	return append(dst, Event{Kind: KindAck, Offset: offset, LeaseID: leaseID}), nil
}

// errRequeued reports a Nack or Release of a lease that already ended
// without a settle, the message waiting to be leased again.
func (s *State) errRequeued(op string, offset, leaseID uint64, err error) error {
	if _, notEnded := s.ended(offset, leaseID, err); notEnded == nil {
		return fmt.Errorf("%s offset %d lease %d: %w", op, offset, leaseID, ErrAlreadyRequeued)
	}
	return err
}

// requeue ends the lease on e: back to the queue not before notBeforeMs, or to
// the dead-letter path when the retries are used up or the TTL has passed. A
// release (r == ReasonReleased) is not a failed delivery and never uses up a
// retry, unless the message has already had ReleasesUncountedMax of them.
func (s *State) requeue(dst []Event, off uint64, e *entry, r Reason, notBeforeMs, nowMs int64) []Event {
	counted := r != ReasonReleased || e.released >= ReleasesUncountedMax
	switch {
	case counted && !s.cfg.UnlimitedRetries && e.countedAttempts() >= int64(max(s.cfg.MaxRetries, 0))+1:
		return append(dst, s.deadLetter(off, e.leaseID, ReasonRetriesExhausted, nowMs))
	case s.expired(e, nowMs):
		return append(dst, s.deadLetter(off, e.leaseID, ReasonExpired, nowMs))
	}
	if notBeforeMs <= nowMs {
		notBeforeMs = 0
	}
	return append(dst, Event{Kind: KindRequeue, Offset: off, LeaseID: e.leaseID, Reason: r,
		NotBeforeMs: notBeforeMs, AtMs: nowMs})
}

// Nack gives the message back for redelivery, not before notBeforeMs (<= now:
// at once). It is dead-lettered instead when its retries are used up
// (ReasonRetriesExhausted) or its TTL has passed (ReasonExpired).
//
// A Nack of a lease that ended without a settle, the message not leased
// since, returns ErrAlreadyRequeued: the message is back already.
func (s *State) Nack(dst []Event, offset, leaseID uint64, notBeforeMs, nowMs int64) ([]Event, error) {
	e, err := s.leased("nack", offset, leaseID)
	if err != nil {
		return dst, s.errRequeued("nack", offset, leaseID, err)
	}
	return s.requeue(dst, offset, e, ReasonNack, notBeforeMs, nowMs), nil
}

// Release hands the message back because its consumer went away; it is ready
// at once. Unlike Nack it does not count towards MaxRetries (up to
// ReleasesUncountedMax releases per message), so a consumer that exits
// holding unread prefetched messages costs them no retries; the next
// delivery's Attempt still rises. The TTL limit applies as for Nack.
func (s *State) Release(dst []Event, offset, leaseID uint64, nowMs int64) ([]Event, error) {
	e, err := s.leased("release", offset, leaseID)
	if err != nil {
		return dst, s.errRequeued("release", offset, leaseID, err)
	}
	return s.requeue(dst, offset, e, ReasonReleased, 0, nowMs), nil
}

// Fail dead-letters the message at once (ReasonFailed): the consumer says no
// retry can succeed. In a DeadLetter.Keep queue nothing is dead-lettered:
// Fail requeues the message at once, recorded as a Nack. Like Ack, Fail
// applies to the lease that ended without a settle while the message waits
// to be leased again; in a Keep queue that returns ErrAlreadyRequeued.
func (s *State) Fail(dst []Event, offset, leaseID uint64, nowMs int64) ([]Event, error) {
	e, err := s.leased("fail", offset, leaseID)
	if err != nil {
		if _, err := s.ended(offset, leaseID, err); err != nil {
			return dst, err
		}
		if s.cfg.DeadLetter.Keep {
			return dst, fmt.Errorf("fail offset %d lease %d: %w", offset, leaseID, ErrAlreadyRequeued)
		}
		return append(dst, s.deadLetter(offset, leaseID, ReasonFailed, nowMs)), nil
	}
	if s.cfg.DeadLetter.Keep {
		return s.requeue(dst, offset, e, ReasonNack, 0, nowMs), nil
	}
	return append(dst, s.deadLetter(offset, leaseID, ReasonFailed, nowMs)), nil
}

// Extend moves the deadline of the current lease leaseID on offset to
// deadlineMs, earlier or later: nothing else changes (not the attempt, not
// the lease id, not the retries), so the holder's later settle of the same
// lease still applies. Only a lease that is current can be extended: one
// that ended (expired, released, settled) or was followed by another lease
// returns an error wrapping ErrStaleLease (or ErrAlreadySettled,
// ErrUnknownOffset), since the message is no longer held. A deadline not
// after nowMs is refused with ErrInvalidDeadline: the caller bounds it.
func (s *State) Extend(dst []Event, offset, leaseID uint64, deadlineMs, nowMs int64) ([]Event, error) {
	if deadlineMs <= nowMs {
		return dst, fmt.Errorf("extend offset %d lease %d to %d at %d: %w", offset, leaseID, deadlineMs, nowMs, ErrInvalidDeadline)
	}
	if _, err := s.leased("extend", offset, leaseID); err != nil {
		return dst, err
	}
	return append(dst, Event{Kind: KindExtend, Offset: offset, LeaseID: leaseID, DeadlineMs: deadlineMs, AtMs: nowMs}), nil
}

// Tick returns what the passage of time to nowMs causes, at most
// TickEventsMax events: leases past their deadline are requeued (or
// dead-lettered, as for Nack: an expired lease counts as a failed delivery,
// since its holder is still there but did not settle), oldest deadline first; then queued messages
// past their TTL are dead-lettered, oldest expiry first. Inflight messages
// are never expired; their TTL is checked when they come back.
func (s *State) Tick(dst []Event, nowMs int64) []Event {
	s.promote(nowMs)
	n := 0
	popped := s.scratch[:0]
	for n < TickEventsMax {
		it, e, ok := s.top(&s.leases, phaseInflight)
		if !ok || it.key > nowMs {
			break
		}
		popped = append(popped, s.leases.pop())
		dst = s.requeue(dst, it.off, e, ReasonLeaseExpired, 0, nowMs)
		n++
	}
	for _, it := range popped {
		s.leases.push(it)
	}
	popped = popped[:0]
	for n < TickEventsMax && !s.cfg.DeadLetter.Keep {
		it, _, ok := s.top(&s.ttl, 0)
		if !ok || it.key > nowMs {
			break
		}
		popped = append(popped, s.ttl.pop())
		dst = append(dst, s.deadLetter(it.off, 0, ReasonExpired, nowMs))
		n++
	}
	for _, it := range popped {
		s.ttl.push(it)
	}
	s.scratch = popped[:0]
	return dst
}

// DeadLettered records that the dead-letter copy of offset is durable in its
// target; the message becomes settled.
func (s *State) DeadLettered(dst []Event, offset uint64, nowMs int64) ([]Event, error) {
	if offset >= s.nextLSN {
		return dst, fmt.Errorf("dead-lettered offset %d (next lsn %d): %w", offset, s.nextLSN, ErrUnknownOffset)
	}
	_, e, ok := s.get(offset)
	if !ok {
		return dst, fmt.Errorf("dead-lettered offset %d: %w", offset, ErrAlreadySettled)
	}
	if e.phase != phaseDeadLettering {
		return dst, fmt.Errorf("dead-lettered offset %d (message is %v): %w", offset, e.phase, ErrNotDeadLettering)
	}
	return append(dst, Event{Kind: KindDeadLetterDone, Offset: offset, AtMs: nowMs}), nil
}

// Purge discards up to max queued (ready or delayed) messages whose offset
// is below `below`, lowest offset first: each gets a DeadLetter event with
// ReasonPurged and no target, so it is settled without a copy whatever the
// dead-letter policy says. Inflight and dead-lettering messages are left
// alone. A caller purging a whole backlog calls Purge again (after applying
// the events) until it returns fewer than max events; below, fixed when the
// purge began, keeps messages published meanwhile out of it. The walk is
// O(max + the unsettled messages below the last one purged that are not
// queued), so the cost of one call stays bounded by max and the consumers'
// leases.
func (s *State) Purge(dst []Event, below uint64, max int, nowMs int64) []Event {
	n := 0
	for off := range s.bits.from(0, anyLive) {
		if off >= below || n >= max {
			break
		}
		if _, e, _ := s.get(off); !e.queued() {
			continue
		}
		dst = append(dst, Event{Kind: KindDeadLetter, Offset: off, Reason: ReasonPurged, AtMs: nowMs})
		n++
	}
	return dst
}
