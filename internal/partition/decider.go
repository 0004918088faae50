package partition

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"slices"

	"github.com/sinewmq/sinew/internal/dedup"
	"github.com/sinewmq/sinew/internal/queue"
)

// The decider and the driver. A turn has two halves:
//
//   - the decider (this file) makes every decision: it turns control
//     messages, commands and the clock into queue events, applies them to
//     the queue state, numbers the records they become, and collects in the
//     open stage what must happen once those records are durable (replies,
//     deliveries, ended leases, dead letters, carried credit). It does no
//     I/O, starts no goroutine and reads no clock: the time comes in as
//     nowMs, and consumers are asked for credit through the Consumer
//     interface only. Its outcome depends on its inputs alone, which
//     decider_test.go checks with datadriven scenarios
//     (testdata/decider).
//   - the driver (actor.go) does the I/O around it: it takes the inbox,
//     appends the decided records to the log (flush), syncs stages, reads
//     bodies for deliveries, dead-letter copies, adoption and relocation,
//     and checkpoints.
//
// The driver appends a turn's records before anything reads them, and
// before it runs anything that reads the log (adoption, inspection,
// relocation), so the decider may run ahead of the log only within one
// turn.

// record is one log record the decider decided on; the driver appends it
// and checks the log gives it the LSN decided.
type record struct {
	lsn uint64
	typ uint8
	// payload is a publish's pre-encoded payload (kept as is, and put in
	// the body cache once appended); nil means arena[start:end]. framed
	// is the record as a raft entry's data: its type byte, then the
	// payload (the publish's buffer, or arena[start-1:end]).
	payload    []byte
	framed     []byte
	start, end int
}

// decider is the deterministic half of the actor: see above. It is owned by
// the actor goroutine (and by Open's recovery before the actor starts).
type decider struct {
	st       *queue.State
	dd       *dedup.Table
	counters *Counters
	logger   *slog.Logger
	// graceMs is Config.RecoveredLeaseGraceMs, for the log line of
	// releaseRecovered.
	graceMs int64

	consumers []Consumer
	rr        int
	// holders maps the offset of every message leased to an attached
	// consumer to that lease, so the consumer is told when the lease
	// ends (Consumer.LeaseEnded). Bounded by the consumers' prefetch.
	holders map[uint64]holder
	// acked remembers the lease that ACKed each recently settled offset,
	// bounded by ackMemoryMax, so that the same ACK sent again (its answer
	// lost, say in a crash) is answered ok rather than stale_lease. It is
	// filled by ACKs decided and, at Open, from the memory the last
	// checkpoint wrote (ackfile.go) and the ACKs replayed after it.
	acked ackMemory
	// recovered lists the leases found by recovery that are still waiting
	// for the grace to end, by offset; recoveredDueMs is when it ends.
	recovered      []queue.Info
	recoveredDueMs int64
	// kept lists the leases of consumers detached with DetachKeeping, in
	// the order of their due times: each goes back to the queue (a
	// release) at its due time unless it ended otherwise before. Bounded
	// by the detached consumers' prefetch.
	kept []keptLease
	// purges are the purges under way, oldest first (see purgeStep).
	purges []purgeJob
	// open is the stage the current turns fill (see "The pipeline" in
	// doc.go); the driver swaps it with the syncing stage.
	open stage
	// nextLSN is the LSN the next decided record gets; lastLSN the last
	// one given. out holds the records decided and not yet appended, in
	// LSN order, their payloads in arena.
	nextLSN uint64
	lastLSN uint64
	out     []record
	arena   []byte
	evs     []queue.Event
	// more: a bounded step left work behind; the driver runs another
	// turn at once.
	more bool
	// duplicates counts publishes answered from the dedup window.
	duplicates uint64
	// steer is where Steer last asked the gate to go (Epoch unused;
	// steerSet once it did). While the gate is elsewhere the partition
	// leases nothing until the move is made.
	steer    queue.Gate
	steerSet bool
}

// keptLease is a lease of a consumer detached with DetachKeeping, released
// at dueMs if it is still current then.
type keptLease struct {
	offset, leaseID uint64
	dueMs           int64
}

// onControl applies one control message that needs no I/O: attach,
// detach, a configuration change, a claim of recovered leases.
func (d *decider) onControl(m control, now int64) {
	switch m.kind {
	case ctlAttach:
		if !slices.Contains(d.consumers, m.c) {
			d.consumers = append(d.consumers, m.c)
			if _, ok := m.c.(GateWatcher); ok {
				d.open.gates = append(d.open.gates, gateNote{c: m.c, g: d.st.Gate()})
			}
		}
	case ctlSteer:
		d.steer, d.steerSet = m.gate, true
	case ctlDetach:
		if i := slices.Index(d.consumers, m.c); i >= 0 {
			d.consumers = slices.Delete(d.consumers, i, i+1)
		}
		for _, in := range d.st.Inflight(m.c.Owner()) {
			evs, err := d.st.Release(d.evs[:0], in.Offset, in.LeaseID, now)
			if err != nil {
				continue
			}
			d.emit(evs, nil)
		}
	case ctlDetachKeep:
		d.detachKeeping(m.c, m.keepMs, nil, now)
	case ctlSetConfig:
		d.st.SetConfig(m.cfg)
	case ctlClaim:
		var mine []queue.Info
		d.recovered = slices.DeleteFunc(d.recovered, func(in queue.Info) bool {
			if in.Owner != m.owner {
				return false
			}
			mine = append(mine, in)
			return true
		})
		m.claimed(mine)
	default:
		panic(fmt.Sprintf("partition: control %d is the driver's", m.kind))
	}
}

// deadLetterSettled settles offset once its dead-letter copy is
// confirmed; an offset settled by an earlier confirmation is left alone.
func (d *decider) deadLetterSettled(offset uint64, now int64) {
	evs, err := d.st.DeadLettered(d.evs[:0], offset, now)
	if err != nil {
		return
	}
	d.emit(evs, nil)
}

// decide makes the decisions of one turn after its control messages:
// recovered leases whose grace ended, the batch's commands, purges under
// way, the queue's timers and dispatch to consumers with credit.
func (d *decider) decide(batch []command, now int64) {
	if len(d.recovered) > 0 && now >= d.recoveredDueMs {
		d.releaseRecovered(now)
	}
	if len(d.kept) > 0 && now >= d.kept[0].dueMs {
		d.releaseKept(now)
	}
	for i := range batch {
		d.command(&batch[i], now)
	}
	if len(d.purges) > 0 {
		d.purgeStep(now)
	}
	// Timers: lease expiry, delays, TTL.
	evs := d.st.Tick(d.evs[:0], now)
	if len(evs) == queue.TickEventsMax {
		d.more = true
	}
	d.emit(evs, nil)
	if d.steerSet && !d.steerGate(now) {
		return // the holder's leases are still out: nothing more is leased
	}
	d.dispatch(now)
}

// steerGate moves the gate where Steer asked once nothing is inflight, and
// reports whether it is there.
func (d *decider) steerGate(now int64) bool {
	evs, err := d.st.Assign(d.evs[:0], d.steer.Cohort, d.steer.Member, now)
	if errors.Is(err, queue.ErrGateBusy) {
		return false
	}
	if err != nil {
		d.steerSet = false
		d.logger.Error("cannot steer the gate", "cohort", d.steer.Cohort, "member", d.steer.Member, "err", err)
		return true
	}
	if len(evs) > 0 {
		d.emit(evs, nil)
		d.open.gates = append(d.open.gates, gateNote{g: d.st.Gate()})
		d.logger.Debug("partition assigned", "cohort", d.steer.Cohort, "member", d.steer.Member, "epoch", d.st.Gate().Epoch)
	}
	return true
}

// command decides one inbox command. Every command but a purge gets its
// reply in the open stage, with the last LSN decided so far: it is given
// only once that record is durable, even when it is an error or an
// idempotent success that decided nothing itself.
func (d *decider) command(c *command, now int64) {
	switch c.kind {
	case cmdPublish:
		m := c.msg
		if m.ProducerID != "" {
			// Answered like any other reply of this stage, so never
			// before the original's record (lsn = its offset) is
			// durable; a failed sync fails the partition first.
			switch v, off := d.dd.Check(m.ProducerID, m.ProducerSeq, now); v {
			case dedup.Duplicate:
				d.duplicates++
				d.open.replies = append(d.open.replies, reply{published: c.published, offset: off,
					duplicate: true, lsn: off})
				return
			case dedup.TooOld:
				d.open.replies = append(d.open.replies, reply{published: c.published, lsn: d.lastLSN,
					err: fmt.Errorf("%w: producer %q sequence %d", ErrSequenceTooOld, m.ProducerID, m.ProducerSeq)})
				return
			}
			if c.prev != 0 && !d.dd.Holds(m.ProducerID, c.prev, now) {
				d.open.replies = append(d.open.replies, reply{published: c.published, lsn: d.lastLSN,
					err: fmt.Errorf("%w: producer %q sequence %d follows %d", ErrOutOfSequence, m.ProducerID, m.ProducerSeq, c.prev)})
				return
			}
		}
		evs, err := d.st.Enqueue(d.evs[:0], &m, now)
		if err != nil {
			d.open.replies = append(d.open.replies, reply{published: c.published, err: err, lsn: d.lastLSN})
			return
		}
		if len(evs) != 1 || evs[0].Msg != &m {
			// The queue filled in a default the caller did not: the
			// pre-encoded payload no longer matches. Publish fills
			// every default first, so this is a broken invariant.
			panic("partition: Enqueue changed a fully defaulted message")
		}
		lsn := d.take(uint8(queue.KindEnqueue), c.payload)
		d.out[len(d.out)-1].framed = c.framed
		d.apply(lsn, &evs[0])
		d.dd.Record(m.ProducerID, m.ProducerSeq, lsn, m.PublishedAtMs)
		d.open.replies = append(d.open.replies, reply{published: c.published, offset: lsn, lsn: lsn})
	case cmdSettle:
		var evs []queue.Event
		var err error
		switch c.op {
		case Ack:
			evs, err = d.st.Ack(d.evs[:0], c.offset, c.leaseID)
		case Nack:
			evs, err = d.st.Nack(d.evs[:0], c.offset, c.leaseID, c.notBeforeMs, now)
		case Fail:
			evs, err = d.st.Fail(d.evs[:0], c.offset, c.leaseID, now)
		case Extend:
			evs, err = d.st.Extend(d.evs[:0], c.offset, c.leaseID, now+min(c.notBeforeMs, queue.LeaseMsMax), now)
		default:
			err = fmt.Errorf("partition: unknown settle op %d", c.op)
		}
		if c.op == Ack && errors.Is(err, queue.ErrAlreadySettled) && d.acked.by(c.offset, c.leaseID) {
			// The same ACK again: it took effect already.
			err = nil
			evs = evs[:0]
		}
		if err == nil {
			h, held := d.holders[c.offset]
			held = held && c.by != nil && h.c == c.by && h.leaseID == c.leaseID
			d.emit(evs, nil)
			if _, still := d.holders[c.offset]; held && !still {
				d.carryCredit(h.c, c.offset, c.leaseID)
			}
		}
		d.open.replies = append(d.open.replies, reply{settled: c.settled, err: err, lsn: d.lastLSN})
	case cmdPurge:
		d.purges = append(d.purges, purgeJob{below: d.st.NextLSN(), done: c.published})
	case cmdDiscard:
		evs, err := d.discard(c.offset, now)
		if err == nil {
			d.emit(evs, nil)
		}
		d.open.replies = append(d.open.replies, reply{settled: c.settled, err: err, lsn: d.lastLSN})
	}
}

// discard decides a Discard: the events that remove offset, or
// ErrNotQueued.
func (d *decider) discard(offset uint64, now int64) ([]queue.Event, error) {
	info, ok := d.st.Lookup(offset, now)
	if !ok || (info.State != queue.StateReady && info.State != queue.StateDelayed) {
		return nil, ErrNotQueued
	}
	return append(d.evs[:0], queue.Event{Kind: queue.KindDeadLetter, Offset: offset, Reason: queue.ReasonPurged, AtMs: now}), nil
}

// purgeStep carries the purges under way forward by at most
// purgePerTurnMax messages. A purge that found fewer than its budget is
// complete: its answer joins the open stage, given once its discards are
// durable. Otherwise another turn is scheduled at once.
func (d *decider) purgeStep(now int64) {
	done := 0
	for len(d.purges) > 0 {
		budget := purgePerTurnMax - done
		if budget <= 0 {
			d.more = true
			break
		}
		j := &d.purges[0]
		evs := d.st.Purge(d.evs[:0], j.below, budget, now)
		n := d.emit(evs, nil)
		done += n
		j.n += uint64(n)
		if n == budget {
			d.more = true
			break
		}
		d.open.replies = append(d.open.replies, reply{published: j.done, offset: j.n, lsn: d.lastLSN})
		d.purges[0] = purgeJob{}
		d.purges = d.purges[1:]
	}
	if len(d.purges) == 0 {
		d.purges = nil
	}
}

// releaseRecovered hands recovered leases back to the queue once their
// grace has ended, at most recoveredReleasePerTurnMax per turn. A lease
// that was settled, expired or released meanwhile is no longer current and
// is skipped.
func (d *decider) releaseRecovered(now int64) {
	k := min(len(d.recovered), recoveredReleasePerTurnMax)
	released := 0
	for _, in := range d.recovered[:k] {
		evs, err := d.st.Release(d.evs[:0], in.Offset, in.LeaseID, now)
		if err != nil {
			continue
		}
		d.emit(evs, nil)
		released++
	}
	if released > 0 {
		// Leases no restored session took back within the grace.
		d.logger.Info("recovered leases released", "released", released, "grace_ms", d.graceMs)
	}
	d.recovered = d.recovered[k:]
	if len(d.recovered) > 0 {
		d.more = true
	} else {
		d.recovered = nil
	}
}

// detachKeeping detaches c and keeps its leases until now+keepMs (see
// Partition.DetachKeeping), except those in undelivered (offset to lease
// id): their deliveries were never handed to c, so they go back to the
// queue at once, as Detach does.
func (d *decider) detachKeeping(c Consumer, keepMs int64, undelivered map[uint64]uint64, now int64) {
	if i := slices.Index(d.consumers, c); i >= 0 {
		d.consumers = slices.Delete(d.consumers, i, i+1)
	}
	due := now + keepMs
	for _, in := range d.st.Inflight(c.Owner()) {
		if l, ok := undelivered[in.Offset]; ok && l == in.LeaseID {
			if evs, err := d.st.Release(d.evs[:0], in.Offset, in.LeaseID, now); err == nil {
				d.emit(evs, nil)
			}
			continue
		}
		// The lease stays; nobody is told when it ends (the consumer
		// is gone), and its message goes to nobody else until it does.
		if h, ok := d.holders[in.Offset]; ok && h.c == c {
			delete(d.holders, in.Offset)
		}
		d.kept = append(d.kept, keptLease{offset: in.Offset, leaseID: in.LeaseID, dueMs: due})
	}
	// Each call's due time is its own now plus its own keep: keep the
	// list in due order.
	slices.SortStableFunc(d.kept, func(a, b keptLease) int { return cmp.Compare(a.dueMs, b.dueMs) })
}

// releaseKept hands the kept leases (DetachKeeping) that are due back to
// the queue, at most recoveredReleasePerTurnMax per turn. A lease settled,
// expired or released meanwhile is no longer current and is skipped.
func (d *decider) releaseKept(now int64) {
	k := 0
	for k < len(d.kept) && k < recoveredReleasePerTurnMax && d.kept[k].dueMs <= now {
		kl := d.kept[k]
		if evs, err := d.st.Release(d.evs[:0], kl.offset, kl.leaseID, now); err == nil {
			d.emit(evs, nil)
		}
		k++
	}
	d.kept = slices.Delete(d.kept, 0, k)
	if len(d.kept) > 0 && d.kept[0].dueMs <= now {
		d.more = true
	}
	if len(d.kept) == 0 {
		d.kept = nil
	}
}

// adoptable lists the leases recorded under c's owner that c may adopt:
// still current, inside their deadline and held by no attached consumer.
// They leave the list of recovered leases. None when c is not attached.
func (d *decider) adoptable(c Consumer, now int64) []queue.Info {
	if !slices.Contains(d.consumers, c) {
		return nil
	}
	var mine []queue.Info
	for _, in := range d.st.Inflight(c.Owner()) {
		if _, held := d.holders[in.Offset]; held || in.DeadlineMs <= now {
			continue
		}
		mine = append(mine, in)
	}
	if len(mine) == 0 {
		return nil
	}
	d.recovered = slices.DeleteFunc(d.recovered, func(in queue.Info) bool {
		return slices.ContainsFunc(mine, func(x queue.Info) bool { return x.Offset == in.Offset })
	})
	if len(d.recovered) == 0 {
		d.recovered = nil
	}
	return mine
}

// take numbers a record with the next LSN and queues it for the driver.
// payload nil means the record's bytes are arena[start:] as the caller
// just appended them.
func (d *decider) take(typ uint8, payload []byte) uint64 {
	lsn := d.nextLSN
	d.nextLSN++
	d.lastLSN = lsn
	d.out = append(d.out, record{lsn: lsn, typ: typ, payload: payload})
	return lsn
}

// apply applies an event the decider just produced at lsn and counts it.
func (d *decider) apply(lsn uint64, ev *queue.Event) {
	if err := d.st.Apply(lsn, *ev); err != nil {
		// The queue rejected an event it just produced.
		panic(fmt.Sprintf("partition: apply of own %v event at lsn %d: %v", ev.Kind, lsn, err))
	}
	d.counters.count(ev)
}

// emit numbers, encodes and applies evs in order and returns how many
// there were. Lease events are recorded as deliveries to c (which must be
// non-nil if evs holds any); DeadLetter events with a target are
// remembered so the copy starts once they are durable.
func (d *decider) emit(evs []queue.Event, c Consumer) int {
	for i := range evs {
		ev := &evs[i]
		d.arena = append(d.arena, uint8(ev.Kind))
		start := len(d.arena)
		d.arena = ev.Marshal(d.arena)
		lsn := d.take(uint8(ev.Kind), nil)
		r := &d.out[len(d.out)-1]
		r.start, r.end = start, len(d.arena)
		d.apply(lsn, ev)
		switch ev.Kind {
		case queue.KindAck:
			d.acked.put(ev.Offset, ev.LeaseID)
			d.leaseEnded(ev.Offset, ev.LeaseID)
		case queue.KindLease:
			if c == nil {
				panic("partition: lease event without a consumer")
			}
			d.holders[ev.Offset] = holder{c: c, leaseID: ev.LeaseID}
			d.open.deliveries = append(d.open.deliveries, pending{c: c, offset: ev.Offset, leaseID: ev.LeaseID,
				attempt: ev.Attempt, assignment: d.st.Gate().Epoch})
		case queue.KindRequeue:
			d.leaseEnded(ev.Offset, ev.LeaseID)
		case queue.KindDeadLetter:
			if ev.LeaseID != 0 {
				d.leaseEnded(ev.Offset, ev.LeaseID)
			}
			if ev.Target != "" {
				d.open.newDead = append(d.open.newDead, ev.Offset)
			}
		}
	}
	d.evs = evs[:0] // keep the grown buffer for the next command
	return len(evs)
}

// payloadOf returns the bytes of a record in out.
func (d *decider) payloadOf(r *record) []byte {
	if r.payload != nil {
		return r.payload
	}
	return d.arena[r.start:r.end]
}

// framedOf returns a record in out as a raft entry's data: its type byte,
// then its payload.
func (d *decider) framedOf(r *record) []byte {
	if r.framed != nil {
		return r.framed
	}
	if r.payload == nil {
		return d.arena[r.start-1 : r.end]
	}
	b := make([]byte, 1+len(r.payload))
	b[0] = r.typ
	copy(b[1:], r.payload)
	return b
}

// taken forgets the records in out once the driver appended them.
func (d *decider) taken() {
	clear(d.out) // drop references to publish payloads
	d.out = d.out[:0]
	d.arena = d.arena[:0]
}

// leaseEnded notes that the lease leaseID on offset ended. Its holder, if
// an attached consumer holds it, is told once the ending record is durable
// (after the stage's deliveries, so never before the Deliver it ends).
// Leases found by recovery have no holder.
func (d *decider) leaseEnded(offset, leaseID uint64) {
	h, ok := d.holders[offset]
	if !ok || h.leaseID != leaseID {
		return
	}
	delete(d.holders, offset)
	d.open.ended = append(d.open.ended, pending{c: h.c, offset: offset, leaseID: leaseID})
}

// dispatch leases ready messages to consumers with credit, round-robin in
// chunks of at most fairChunkMax so competing consumers share the queue.
func (d *decider) dispatch(now int64) {
	leased := 0
	for leased < dispatchPerTurnMax && len(d.consumers) > 0 {
		progress := false
		for range len(d.consumers) {
			d.rr = (d.rr + 1) % len(d.consumers)
			c := d.consumers[d.rr]
			cohort, member := "", ""
			if cm, ok := c.(CohortMember); ok {
				cohort, member = cm.Cohort()
			}
			if !d.st.Gate().Admits(cohort, member) {
				// Not its turn: asking for credit would only take it
				// from the consumer's other partitions.
				continue
			}
			want := min(fairChunkMax, dispatchPerTurnMax-leased)
			// Credit carried by this stage's settles first: it is
			// spent only on this stage's leases.
			carried := d.takeCarried(c, want)
			got := carried
			if got < want {
				got += c.TakeCredit(want - got)
			}
			if got == 0 {
				continue
			}
			before := len(d.open.deliveries)
			evs := d.st.LeaseAs(d.evs[:0], c.Owner(), cohort, member, got, now)
			d.emit(evs, c)
			k := len(d.open.deliveries) - before
			if k < got {
				// Unspent carried credit stays with the stage; the
				// rest goes back to the consumer now.
				back := min(carried, got-k)
				if back > 0 {
					d.addCarried(c, back)
				}
				if got-k-back > 0 {
					c.RefundCredit(got - k - back)
				}
			}
			leased += k
			if len(evs) > 0 {
				progress = true
			}
			if leased >= dispatchPerTurnMax {
				d.more = true
				break
			}
		}
		if !progress {
			break
		}
	}
}

// carryCredit asks c, whose lease on offset a settle it sent just ended in
// the open stage, for that lease's credit (CreditCarrier); the stage's
// dispatch may spend it.
func (d *decider) carryCredit(c Consumer, offset, leaseID uint64) {
	cc, ok := c.(CreditCarrier)
	if !ok || !cc.CarryCredit(offset, leaseID) {
		return
	}
	d.addCarried(c, 1)
}

// addCarried adds n to the credit the open stage carries for c.
func (d *decider) addCarried(c Consumer, n int) {
	for i := range d.open.carried {
		if d.open.carried[i].c == c {
			d.open.carried[i].n += n
			return
		}
	}
	d.open.carried = append(d.open.carried, carry{c: c, n: n})
}

// takeCarried removes up to want credit carried for c in the open stage
// and returns it.
func (d *decider) takeCarried(c Consumer, want int) int {
	for i := range d.open.carried {
		if cr := &d.open.carried[i]; cr.c == c {
			n := min(cr.n, want)
			cr.n -= n
			return n
		}
	}
	return 0
}
