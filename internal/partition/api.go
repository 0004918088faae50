package partition

import (
	"errors"

	"github.com/sinewmq/sinew/internal/queue"
)

// Index returns the partition number.
func (p *Partition) Index() uint32 { return p.cfg.Index }

// Quarantined returns why the partition is parked, or nil.
func (p *Partition) Quarantined() error { return p.parked }

// Unavailable returns why the partition serves nothing: it is quarantined
// (parked at Open) or it failed at run time. nil while it serves. Safe from
// any goroutine.
func (p *Partition) Unavailable() error {
	if p.parked != nil {
		return p.parked
	}
	if e := p.down.Load(); e != nil {
		return *e
	}
	return nil
}

// Stats returns the counters as of the end of the last turn.
func (p *Partition) Stats() Stats { return *p.stats.Load() }

// Poke makes the actor run a turn soon: it re-reads the clock, runs due
// timers and dispatches to consumers with credit. Safe from any goroutine.
func (p *Partition) Poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Publish enqueues m. m is only read during the call (its payload is
// encoded into a private buffer), so the caller may reuse it at once.
// PublishedAtMs defaults to now and ExpiresAtMs to PublishedAtMs plus the
// queue's default TTL. done is called once: from the partition goroutine
// after the Enqueue record is durable, or before Publish returns when the
// partition cannot take the message (ErrInboxFull, ErrClosed,
// ErrUnavailable).
func (p *Partition) Publish(m *queue.Message, done func(offset uint64, err error)) {
	p.PublishOnce(m, func(offset uint64, _ bool, err error) { done(offset, err) })
}

// PublishOnce is Publish with producer deduplication made visible. When
// m.ProducerID is set and the partition remembers m.ProducerSeq from that
// producer, nothing is stored: done gets the original offset and
// duplicate = true, once the original's record is durable. A sequence below
// the producer's window gets ErrSequenceTooOld. Otherwise m is stored and
// its sequence remembered (see internal/dedup for the window's bounds).
func (p *Partition) PublishOnce(m *queue.Message, done func(offset uint64, duplicate bool, err error)) {
	p.PublishAfter(m, 0, done)
}

// PublishAfter is PublishOnce for a publish that must follow the same
// producer's sequence prev (0: none) in this partition. After the duplicate
// and too-old checks, a prev the partition does not hold (dedup.Table.Holds)
// gets ErrOutOfSequence and nothing is stored.
func (p *Partition) PublishAfter(m *queue.Message, prev uint64, done func(offset uint64, duplicate bool, err error)) {
	if p.parked != nil {
		done(0, false, ErrUnavailable)
		return
	}
	qc := p.qcfg.Load()
	c := *m
	c.Body, c.Key, c.Headers = nil, nil, nil
	if c.PublishedAtMs == 0 {
		c.PublishedAtMs = p.cfg.Now().UnixMilli()
	}
	if c.ExpiresAtMs == 0 && qc.DefaultTTLMs > 0 {
		c.ExpiresAtMs = c.PublishedAtMs + qc.DefaultTTLMs
	}
	full := *m
	full.PublishedAtMs, full.ExpiresAtMs = c.PublishedAtMs, c.ExpiresAtMs
	ev := queue.Event{Kind: queue.KindEnqueue, Msg: &full}
	// Encoded behind the record type byte, as the raft entry carries it,
	// so that the actor proposes it without a copy.
	framed := ev.Marshal(append(make([]byte, 0, 65+len(m.Body)+len(m.Key)), uint8(queue.KindEnqueue)))
	p.send(command{kind: cmdPublish, msg: c, payload: framed[1:], framed: framed, published: done, prev: prev}, func(err error) { done(0, false, err) })
}

// Settle settles the lease leaseID on offset. notBeforeMs applies to Nack
// (0: redeliver at once). done gets nil once the settle record is durable,
// or an error wrapping queue.ErrStaleLease, queue.ErrAlreadySettled,
// queue.ErrAlreadyRequeued (a Nack of a lease that ended without a settle,
// the message queued again: nothing left to do), queue.ErrUnknownOffset, or
// one of this package's errors (possibly before Settle returns). An Ack or
// Fail of a lease that ended without a settle is applied while the message
// has not been leased again (see queue.State.Ack).
func (p *Partition) Settle(op SettleOp, offset, leaseID uint64, notBeforeMs int64, done func(error)) {
	p.SettleFor(nil, op, offset, leaseID, notBeforeMs, done)
}

// SettleFor is Settle on behalf of by, the attached consumer that was
// delivered the lease (nil: unknown). When by implements CreditCarrier and
// the settle ends by's lease, the credit it frees may lease by its next
// message in the same stage (see CreditCarrier).
func (p *Partition) SettleFor(by Consumer, op SettleOp, offset, leaseID uint64, notBeforeMs int64, done func(error)) {
	if p.parked != nil {
		done(ErrUnavailable)
		return
	}
	p.send(command{kind: cmdSettle, op: op, offset: offset, leaseID: leaseID, notBeforeMs: notBeforeMs, settled: done, by: by}, done)
}

// ExtendFor moves the deadline of the current lease leaseID on offset to
// the actor's now plus extendMs (1 or more), on behalf of by (nil:
// unknown). Nothing else changes: not the lease id, not the attempt. done
// gets nil once the Extend record is durable (replicated, in a cluster), or
// an error wrapping queue.ErrStaleLease, queue.ErrAlreadySettled or
// queue.ErrUnknownOffset when the lease is not current, queue.ErrInvalidDeadline
// for extendMs below 1, or one of this package's errors, as for Settle.
func (p *Partition) ExtendFor(by Consumer, offset, leaseID uint64, extendMs int64, done func(error)) {
	if p.parked != nil {
		done(ErrUnavailable)
		return
	}
	p.send(command{kind: cmdSettle, op: Extend, offset: offset, leaseID: leaseID, notBeforeMs: extendMs, settled: done, by: by}, done)
}

func (p *Partition) send(c command, refuse func(error)) {
	p.sendMu.RLock()
	if p.closed {
		p.sendMu.RUnlock()
		refuse(ErrClosed)
		return
	}
	ok := p.inbox.put(c)
	p.sendMu.RUnlock()
	if !ok {
		refuse(ErrInboxFull)
	}
}

// Steer asks the partition to move its gate (queue.Gate) to member of
// cohort (cohort "": open it to plain consumers; member "": hold it for
// the cohort, delivering to nobody). While the gate is not there yet, the
// partition leases nothing, and the move is made, as one durable Assign
// record, once nothing of the partition is inflight: the holder's leases
// end by settles, releases or expiry. A later Steer replaces an earlier
// one. Only the group's leader acts on it; every replica keeps the latest
// so that a new leader carries it on. A failed partition ignores it.
func (p *Partition) Steer(cohort, member string) {
	_ = p.control(control{kind: ctlSteer, gate: queue.Gate{Cohort: cohort, Member: member}})
}

// Attach adds a consumer; the actor starts dispatching to it on its next
// turn. A parked or failed partition refuses at once with ErrUnavailable; one
// that fails before the attach is processed calls c.Detached instead, so an
// attached consumer always either is served or hears why not.
func (p *Partition) Attach(c Consumer) error {
	if p.Unavailable() != nil {
		return ErrUnavailable
	}
	return p.control(control{kind: ctlAttach, c: c})
}

// Detach removes a consumer and hands every lease it holds back to the
// queue (ready at once). It does not wait: the actor processes it at the
// start of its next turn and delivers nothing to c afterwards, releasing
// even leases granted to c in the turn under way. It is safe to call from
// c's own methods. Detaching an unknown consumer is a no-op.
func (p *Partition) Detach(c Consumer) {
	if p.parked != nil {
		return
	}
	_ = p.control(control{kind: ctlDetach, c: c})
}

// DetachKeeping removes a consumer like Detach, but leaves the leases it
// holds in place for keepMs (capped at detachKeepMsMax) instead of handing
// them back at once: a settle of one of them still applies as a settle of
// the current lease, and no other consumer can be leased the message
// meanwhile. Those still unsettled when keepMs has passed go back to the
// queue as a release (no retry used); one whose own deadline comes first
// expires as usual.
//
// It is for a consumer that ends while its client may still hold
// deliveries it has not read yet: a subscription that the broker ended
// because another partition failed. Released at once, such a message could
// be delivered to a competing consumer, which settles it, before the first
// client reads its copy, so a message whose ACK was answered ok would reach
// a client again. Like Detach it does not wait, is safe to call from c's own
// methods, and is a no-op for an unknown consumer.
func (p *Partition) DetachKeeping(c Consumer, keepMs int64) {
	if p.parked != nil {
		return
	}
	_ = p.control(control{kind: ctlDetachKeep, c: c, keepMs: min(max(keepMs, 0), detachKeepMsMax)})
}

// Purge discards every message that is queued (ready or delayed) when the
// actor reaches it and was published before the actor took the purge, at
// most purgePerTurnMax per turn, without dead-letter copies. Inflight
// messages stay with their holders; one that comes back to the queue while
// the purge is still under way is purged too. done gets the number purged
// once every discard is durable, or an error (ErrInboxFull, ErrClosed,
// ErrUnavailable, possibly before Purge returns; messages purged before a
// failure stay purged).
func (p *Partition) Purge(done func(purged uint64, err error)) {
	if p.parked != nil {
		done(0, ErrUnavailable)
		return
	}
	p.send(command{kind: cmdPurge, published: func(n uint64, _ bool, err error) { done(n, err) }},
		func(err error) { done(0, err) })
}

// SetConfig changes the queue configuration for future commands (lease
// length, retries, TTL, dead-letter target). Recorded events are not
// affected.
func (p *Partition) SetConfig(cfg queue.Config) {
	if p.parked != nil {
		return
	}
	q := cfg
	p.qcfg.Store(&q)
	_ = p.control(control{kind: ctlSetConfig, cfg: cfg})
}

// ClaimRecovered is the seam for session restore. Recovery finds leases
// whose holders were sessions of the previous process; unless claimed, they
// are released once Config.RecoveredLeaseGraceMs has passed. A session that
// resumes within the grace under its old owner id claims its leases here:
// they leave the release list and stay leased to owner until they are
// settled, expire at their own deadline, or a consumer whose Owner is owner
// detaches (which releases them like any lease it holds). done receives the
// claimed leases by offset, from the actor goroutine, and must not block;
// it receives none once the grace has ended (they were released) or when
// the partition is parked, failed or closed.
func (p *Partition) ClaimRecovered(owner string, done func([]queue.Info)) {
	if p.parked != nil {
		done(nil)
		return
	}
	if err := p.control(control{kind: ctlClaim, owner: owner, claimed: done}); err != nil {
		done(nil)
	}
}

// Adopter may be implemented by a Consumer that counts deliveries against a
// budget: Adopt calls AdoptCredit(n) before it hands over n adopted leases,
// which were granted before the consumer existed and took no credit.
type Adopter interface {
	AdoptCredit(n int)
}

// Adopt hands c, an attached consumer, the leases recovered from the log
// that are recorded under c.Owner(), still current and inside their
// deadline: they leave the list of recovered leases (so the grace does not
// release them), c becomes their holder (a Detach of c releases them, an
// expiry or settle ends them as for any lease) and each is delivered to c
// again, same lease id and attempt, on the actor goroutine. This is how a
// session restored after a restart takes back its leases: its owner string
// is derived from stable things, so it is the one in the log. Leases past
// their deadline are left to expire as usual. done gets the number adopted
// and must not block; 0 when c is not attached, or the partition is parked,
// failed or closed.
func (p *Partition) Adopt(c Consumer, done func(n int)) {
	if p.parked != nil {
		done(0)
		return
	}
	if err := p.control(control{kind: ctlAdopt, c: c, adopted: done}); err != nil {
		done(0)
	}
}

func (p *Partition) control(m control) error {
	p.sendMu.RLock()
	defer p.sendMu.RUnlock()
	if p.closed {
		return ErrClosed
	}
	p.ctlMu.Lock()
	if len(p.ctl) >= controlMax {
		p.ctlMu.Unlock()
		return ErrInboxFull
	}
	p.ctl = append(p.ctl, m)
	p.ctlMu.Unlock()
	p.Poke()
	return nil
}

// Close stops the actor: commands still in the inbox are refused with
// ErrClosed, live bodies in sparse old segments are relocated, a final
// checkpoint is written and the log is closed.
// Consumers get no callback; the caller tells them.
func (p *Partition) Close() error {
	p.sendMu.Lock()
	if p.closed {
		p.sendMu.Unlock()
		<-p.stopped
		return nil
	}
	p.closed = true
	p.sendMu.Unlock()
	if p.parked != nil {
		return nil
	}
	close(p.stop)
	<-p.stopped
	var errs []error
	if p.failed == nil && p.leads && p.single {
		// A group of one moves the last live bodies of sparse segments
		// and sees its last records committed before the checkpoint. A
		// larger group cannot count on its peers now: what they did not
		// commit stays in the log, for the next leader to decide on.
		if _, err := p.relocate(); err != nil {
			errs = append(errs, err)
		} else if err := p.settleInline(); err != nil {
			errs = append(errs, err)
		}
	}
	if p.failed == nil && len(errs) == 0 {
		if err := p.flushHardState(); err != nil {
			errs = append(errs, err)
		} else if err := p.checkpoint(); err != nil {
			errs = append(errs, err)
		}
	}
	p.cache.close()
	if p.rs != nil {
		p.rs.Close()
	}
	if err := p.log.Close(); err != nil && p.failed == nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
