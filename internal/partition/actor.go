package partition

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sinewmq/sinew/internal/dedup"
	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/seglog"
)

// run is the actor loop. Each turn takes a batch from the inbox, applies
// control messages, decides and appends events for every command, ticks the
// queue's timers and dispatches to consumers with credit; the turn's replies,
// deliveries and dead-letter starts go into the open stage. The open stage
// is handed to the syncer goroutine as soon as no sync is running, and
// released (replies, deliveries) when that sync returns, so the next turns
// run while the disk syncs. See "The pipeline" in doc.go.
func (p *Partition) run() {
	defer close(p.stopped)
	syncerDone := make(chan struct{})
	go p.syncer(syncerDone)
	ckptDone := make(chan struct{})
	go p.checkpointer(ckptDone)
	defer func() {
		close(p.syncReq)
		<-syncerDone
		// Close writes the last checkpoint itself: the one under way
		// is awaited first.
		if p.ckptBusy {
			p.checkpointed(<-p.ckptDone)
		}
		close(p.ckptReq)
		<-ckptDone
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	batch := make([]command, 0, 64)
	for {
		batch = batch[:0]
		inbox := p.inbox
		if len(p.open.replies) >= stageCommandsMax {
			// Backpressure: the open stage is full until the sync under
			// way returns; the bounded inbox absorbs the rest.
			inbox = nil
		}
		select {
		case c := <-inbox:
			batch = append(batch, c)
		case res := <-p.synced:
			p.synced1(res)
			// The stage just released woke its publishers and settlers,
			// most of whom answer with their next command at once. Let
			// them run before this turn takes the inbox and starts the
			// next sync: the commands then share that sync instead of
			// waiting a whole sync for the one after it (measured in
			// docs/benchmarks.md).
			runtime.Gosched()
		case res := <-p.ckptDone:
			p.checkpointed(res)
		case <-p.wake:
		case <-timer.C:
		case <-p.stop:
			p.drainClosed()
			refuseControl(p.takeControl(), ErrClosed)
			p.finishStages()
			p.refusePurges(ErrClosed)
			return
		}
	fill:
		for inbox != nil && len(batch) < batchMax {
			select {
			case c := <-inbox:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		p.turn(batch)
		clear(batch) // drop references to payloads and callbacks
		p.startSync()
		p.afterTurn()
		p.arm(timer)
	}
}

// syncer makes stages durable (persist) on request, so the actor can run
// the next turns while fdatasync runs. At most one request is outstanding.
func (p *Partition) syncer(done chan<- struct{}) {
	defer close(done)
	for range p.syncReq {
		// The actor does not touch the syncing stage until it has the
		// answer, so reading its size here is safe.
		records, start := p.syncing.records, time.Now()
		lsn, err := p.persist()
		if err == nil {
			p.observeSync(records, start)
		}
		p.synced <- syncResult{lsn, err}
	}
}

// startSync hands the open stage to the syncer when no sync is under way.
// A stage without records needs no sync: it only had to wait for the stages
// before it, so it is released at once.
func (p *Partition) startSync() {
	if p.syncBusy || p.failed != nil {
		return
	}
	if p.open.records == 0 {
		p.releaseStage(&p.open)
		return
	}
	p.open, p.syncing = p.syncing, p.open
	p.syncBusy = true
	p.syncReq <- struct{}{}
}

// synced1 handles the syncer's answer for the syncing stage. Its outcome
// is the stage's own even when the partition failed meanwhile, and answers
// whose records reached the disk before a failure are given truthfully
// (deliveries are dropped, since a failed partition has no consumers).
func (p *Partition) synced1(res syncResult) {
	p.syncBusy = false
	if res.err == nil {
		p.releaseStage(&p.syncing)
		return
	}
	if p.failed == nil {
		p.fail(res.err, nil)
	}
	p.failStage(&p.syncing, max(res.lsn, p.log.DurableLSN()))
}

// finishStages completes the pipeline at Close: the sync under way is
// awaited and the open stage is made durable, so that every command the
// actor took gets its true answer.
func (p *Partition) finishStages() {
	if p.syncBusy {
		p.synced1(<-p.synced)
	}
	if p.failed != nil {
		return
	}
	if p.open.records > 0 {
		if _, err := p.persist(); err != nil {
			p.fail(err, nil)
			return
		}
	}
	p.releaseStage(&p.open)
}

// releaseStage answers the stage's commands and hands its deliveries over:
// everything in it is as durable as the policy promises.
func (p *Partition) releaseStage(st *stage) {
	for _, r := range st.replies {
		if r.published != nil {
			r.published(r.offset, r.duplicate, r.err)
		} else {
			r.settled(r.err)
		}
	}
	clear(st.replies)
	st.replies = st.replies[:0]
	refundCarried(st)
	p.deliver(st.deliveries)
	clear(st.deliveries)
	st.deliveries = st.deliveries[:0]
	for _, e := range st.ended {
		if slices.Contains(p.consumers, e.c) {
			e.c.LeaseEnded(e.offset, e.leaseID)
		}
	}
	clear(st.ended)
	st.ended = st.ended[:0]
	if len(st.newDead) > 0 {
		now := p.nowMs()
		for _, off := range st.newDead {
			p.deadLetters[off] = &deadLetter{retryAtMs: now}
		}
		st.newDead = st.newDead[:0]
	}
	st.records = 0
}

// afterTurn starts due dead-letter copies, checkpoints when due and
// publishes the counters.
func (p *Partition) afterTurn() {
	if p.failed != nil {
		return
	}
	now := p.nowMs()
	p.startDeadLetters(now)
	if !p.ckptBusy && p.checkpointDue(now) && now >= p.ckptRetryAtMs {
		p.periodicCheckpoint()
	}
	p.publishStats()
}

// checkpointDue reports whether CheckpointEveryRecords records were
// appended since the last checkpoint, or some were and the partition has
// been idle for idleCheckpointMs.
func (p *Partition) checkpointDue(now int64) bool {
	return p.sinceCkpt >= p.cfg.CheckpointEveryRecords ||
		p.sinceCkpt > 0 && now-p.lastBusyMs >= idleCheckpointMs
}

// periodicCheckpoint relocates the live bodies of sparse old segments,
// takes a checkpoint and hands it to the checkpointer goroutine, which
// writes it while the actor goes on (at most one is under way).
func (p *Partition) periodicCheckpoint() {
	if _, err := p.relocate(); err != nil {
		p.fail(err, nil)
		return
	}
	j, ok := p.takeCheckpoint()
	if !ok {
		return
	}
	p.ckptBusy = true
	p.ckptReq <- j
}

// checkpointed handles the checkpointer's answer. A failure backs off: the
// wait doubles with each consecutive failure from checkpointRetryMinMs up
// to checkpointRetryMaxMs. Each failure is counted
// (Stats.CheckpointFailures) and logged once, with the wait before the next
// attempt.
func (p *Partition) checkpointed(res ckptResult) {
	p.ckptBusy = false
	if res.err == nil {
		p.checkpointWritten(res.job)
		if p.ckptStreak > 0 {
			p.logger.Info("checkpoint succeeded after failures", "failures", p.ckptStreak)
		}
		p.ckptStreak, p.ckptRetryAtMs = 0, 0
		return
	}
	p.ckptFailures++
	p.ckptStreak++
	wait := int64(checkpointRetryMaxMs)
	if p.ckptStreak <= 20 { // beyond that the shift would pass the cap anyway
		wait = min(int64(checkpointRetryMinMs)<<(p.ckptStreak-1), checkpointRetryMaxMs)
	}
	p.ckptRetryAtMs = p.nowMs() + wait
	p.logger.Error("checkpoint failed; retrying after a backoff", "err", res.err,
		"consecutive_failures", p.ckptStreak, "retry_in_ms", wait)
}

// drainClosed refuses whatever is left in the inbox once Close has stopped
// new sends.
func (p *Partition) drainClosed() {
	for {
		select {
		case c := <-p.inbox:
			refuse(c, ErrClosed)
		default:
			return
		}
	}
}

// refuseControl answers the control messages that expect an answer when
// the actor will not act on them (failed or stopped): a claim gets nothing,
// and a consumer whose attach came too late is told it will not be served.
func refuseControl(ms []control, err error) {
	for _, m := range ms {
		switch m.kind {
		case ctlClaim:
			m.claimed(nil)
		case ctlAttach:
			m.c.Detached(err)
		}
	}
}

// refusePurges answers the purges under way with err; what they purged so
// far stays purged.
func (p *Partition) refusePurges(err error) {
	for _, j := range p.purges {
		j.done(0, false, err)
	}
	p.purges = nil
}

func refuse(c command, err error) {
	switch c.kind {
	case cmdPublish, cmdPurge:
		c.published(0, false, err)
	case cmdSettle, cmdDiscard:
		c.settled(err)
	}
}

// arm sets the timer for the queue's next deadline or the next dead-letter
// retry, or wakes the loop at once when a bounded turn left work behind.
func (p *Partition) arm(timer *time.Timer) {
	timer.Stop()
	if p.failed != nil {
		return
	}
	if p.more {
		p.more = false
		p.Poke()
		return
	}
	now := p.nowMs()
	at, ok := p.st.NextDeadlineMs()
	for _, d := range p.deadLetters {
		if !d.inflight && (!ok || d.retryAtMs < at) {
			at, ok = d.retryAtMs, true
		}
	}
	if len(p.recovered) > 0 && (!ok || p.recoveredDueMs < at) {
		at, ok = p.recoveredDueMs, true
	}
	// The idle checkpoint, or its retry after a failure. While one is
	// under way its answer wakes the actor instead.
	if p.sinceCkpt > 0 && !p.ckptBusy {
		idle := max(p.lastBusyMs+idleCheckpointMs, p.ckptRetryAtMs)
		if !ok || idle < at {
			at, ok = idle, true
		}
	}
	if !ok {
		return
	}
	if at <= now {
		p.Poke()
		return
	}
	timer.Reset(time.Duration(at-now) * time.Millisecond)
}

func (p *Partition) turn(batch []command) {
	if p.failed != nil {
		refuseControl(p.takeControl(), ErrUnavailable)
		for _, c := range batch {
			refuse(c, ErrUnavailable)
		}
		return
	}
	now := p.nowMs()
	p.evs = p.evs[:0]
	p.turnReplies = len(p.open.replies)
	appended := 0

	for _, m := range p.takeControl() {
		switch m.kind {
		case ctlAttach:
			if !slices.Contains(p.consumers, m.c) {
				p.consumers = append(p.consumers, m.c)
			}
		case ctlDetach:
			if i := slices.Index(p.consumers, m.c); i >= 0 {
				p.consumers = slices.Delete(p.consumers, i, i+1)
			}
			for _, in := range p.st.Inflight(m.c.Owner()) {
				evs, err := p.st.Release(p.evs[:0], in.Offset, in.LeaseID, now)
				if err != nil {
					continue
				}
				n, err := p.appendAll(evs, nil)
				appended += n
				if err != nil {
					p.fail(err, batch)
					return
				}
			}
		case ctlDeadLettered:
			d, ok := p.deadLetters[m.offset]
			if !ok {
				break
			}
			d.inflight = false
			p.dlInflight--
			if m.err != nil {
				d.retryAtMs = now + deadLetterRetryMs
				p.logger.Warn("dead-letter copy failed; will retry", "offset", m.offset, "err", m.err)
				break
			}
			delete(p.deadLetters, m.offset)
			evs, err := p.st.DeadLettered(p.evs[:0], m.offset, now)
			if err != nil {
				break // settled by an earlier confirmation
			}
			n, err := p.appendAll(evs, nil)
			appended += n
			if err != nil {
				p.fail(err, batch)
				return
			}
		case ctlSetConfig:
			p.st.SetConfig(m.cfg)
		case ctlClaim:
			var mine []queue.Info
			p.recovered = slices.DeleteFunc(p.recovered, func(in queue.Info) bool {
				if in.Owner != m.owner {
					return false
				}
				mine = append(mine, in)
				return true
			})
			m.claimed(mine)
		case ctlAdopt:
			m.adopted(p.adopt(m.c, now))
		case ctlInspect:
			m.fn()
		}
	}

	if len(p.recovered) > 0 && now >= p.recoveredDueMs {
		n, err := p.releaseRecovered(now)
		appended += n
		if err != nil {
			p.fail(err, batch)
			return
		}
	}

	for i := range batch {
		c := &batch[i]
		switch c.kind {
		case cmdPublish:
			m := c.msg
			if m.ProducerID != "" {
				// Answered like any other reply of this stage, so never
				// before the original's record (lsn = its offset) is
				// durable; a failed sync fails the partition first.
				switch v, off := p.dd.Check(m.ProducerID, m.ProducerSeq, now); v {
				case dedup.Duplicate:
					p.duplicates++
					p.open.replies = append(p.open.replies, reply{published: c.published, offset: off,
						duplicate: true, lsn: off})
					continue
				case dedup.TooOld:
					p.open.replies = append(p.open.replies, reply{published: c.published, lsn: p.lastLSN,
						err: fmt.Errorf("%w: producer %q sequence %d", ErrSequenceTooOld, m.ProducerID, m.ProducerSeq)})
					continue
				}
			}
			evs, err := p.st.Enqueue(p.evs[:0], &m, now)
			if err != nil {
				p.open.replies = append(p.open.replies, reply{published: c.published, err: err, lsn: p.lastLSN})
				continue
			}
			if len(evs) != 1 || evs[0].Msg != &m {
				// The queue filled in a default the caller did not: the
				// pre-encoded payload no longer matches. Publish fills
				// every default first, so this is a broken invariant.
				panic("partition: Enqueue changed a fully defaulted message")
			}
			lsn, err := p.log.Append(uint8(queue.KindEnqueue), c.payload)
			if err == nil {
				p.lastLSN = lsn
				err = p.st.Apply(lsn, evs[0])
			}
			if err != nil {
				p.fail(err, batch)
				return
			}
			appended++
			p.cfg.Counters.count(&evs[0])
			p.dd.Record(m.ProducerID, m.ProducerSeq, lsn, m.PublishedAtMs)
			p.cache.put(lsn, c.payload)
			p.open.replies = append(p.open.replies, reply{published: c.published, offset: lsn, lsn: lsn})
		case cmdSettle:
			var evs []queue.Event
			var err error
			switch c.op {
			case Ack:
				evs, err = p.st.Ack(p.evs[:0], c.offset, c.leaseID)
			case Nack:
				evs, err = p.st.Nack(p.evs[:0], c.offset, c.leaseID, c.notBeforeMs, now)
			case Fail:
				evs, err = p.st.Fail(p.evs[:0], c.offset, c.leaseID, now)
			default:
				err = fmt.Errorf("partition: unknown settle op %d", c.op)
			}
			if c.op == Ack && errors.Is(err, queue.ErrAlreadySettled) && p.acked.by(c.offset, c.leaseID) {
				// The same ACK again: it took effect already.
				err = nil
				evs = evs[:0]
			}
			if err == nil {
				h, held := p.holders[c.offset]
				held = held && c.by != nil && h.c == c.by && h.leaseID == c.leaseID
				var n int
				n, err = p.appendAll(evs, nil)
				appended += n
				if err != nil {
					p.fail(err, batch)
					return
				}
				if _, still := p.holders[c.offset]; held && !still {
					p.carryCredit(h.c, c.offset, c.leaseID)
				}
			}
			p.open.replies = append(p.open.replies, reply{settled: c.settled, err: err, lsn: p.lastLSN})
		case cmdPurge:
			p.purges = append(p.purges, purgeJob{below: p.st.NextLSN(), done: c.published})
		case cmdDiscard:
			evs, err := p.discard(c.offset, now)
			if err == nil {
				var n int
				n, err = p.appendAll(evs, nil)
				appended += n
				if err != nil {
					p.fail(err, batch)
					return
				}
			}
			p.open.replies = append(p.open.replies, reply{settled: c.settled, err: err, lsn: p.lastLSN})
		}
	}

	if len(p.purges) > 0 {
		n, err := p.purgeStep(now)
		appended += n
		if err != nil {
			p.fail(err, batch)
			return
		}
	}

	// Timers: lease expiry, delays, TTL.
	evs := p.st.Tick(p.evs[:0], now)
	if len(evs) == queue.TickEventsMax {
		p.more = true
	}
	n, err := p.appendAll(evs, nil)
	appended += n
	if err != nil {
		p.fail(err, batch)
		return
	}

	n, err = p.dispatch(now)
	appended += n
	if err != nil {
		p.fail(err, batch)
		return
	}

	p.open.records += appended
	p.sinceCkpt += appended
	if len(batch) > 0 || appended > 0 {
		p.lastBusyMs = now
	}
}

// purgeStep carries the purges under way forward by at most
// purgePerTurnMax messages. A purge that found fewer than its budget is
// complete: its answer joins the open stage, given once its discards are
// durable. Otherwise another turn is scheduled at once.
func (p *Partition) purgeStep(now int64) (int, error) {
	appended := 0
	for len(p.purges) > 0 {
		budget := purgePerTurnMax - appended
		if budget <= 0 {
			p.more = true
			break
		}
		j := &p.purges[0]
		evs := p.st.Purge(p.evs[:0], j.below, budget, now)
		n, err := p.appendAll(evs, nil)
		appended += n
		j.n += uint64(n)
		if err != nil {
			return appended, err
		}
		if n == budget {
			p.more = true
			break
		}
		p.open.replies = append(p.open.replies, reply{published: j.done, offset: j.n, lsn: p.lastLSN})
		p.purges[0] = purgeJob{}
		p.purges = p.purges[1:]
	}
	if len(p.purges) == 0 {
		p.purges = nil
	}
	return appended, nil
}

// persist makes the records appended so far as safe as the sync policy
// promises before anything is confirmed: fdatasync'd under SyncAlways,
// written to the OS (surviving a process crash, durable within the
// interval) under SyncInterval.
//
// It returns the LSN up to which that promise holds (also on error).
func (p *Partition) persist() (uint64, error) {
	if p.cfg.Sync == seglog.SyncInterval {
		lsn, err := p.log.Flush()
		if err != nil {
			return lsn, fmt.Errorf("flush: %w", err)
		}
		return lsn, nil
	}
	lsn, err := p.log.Sync()
	if err != nil {
		return lsn, fmt.Errorf("sync: %w", err)
	}
	return lsn, nil
}

// releaseRecovered hands recovered leases back to the queue once their
// grace has ended, at most recoveredReleasePerTurnMax per turn. A lease
// that was settled, expired or released meanwhile is no longer current and
// is skipped.
func (p *Partition) releaseRecovered(now int64) (int, error) {
	k := min(len(p.recovered), recoveredReleasePerTurnMax)
	appended, released := 0, 0
	for _, in := range p.recovered[:k] {
		evs, err := p.st.Release(p.evs[:0], in.Offset, in.LeaseID, now)
		if err != nil {
			continue
		}
		n, err := p.appendAll(evs, nil)
		appended += n
		if err != nil {
			return appended, err
		}
		released++
	}
	if released > 0 {
		// Leases no restored session took back within the grace.
		p.logger.Info("recovered leases released", "released", released, "grace_ms", p.cfg.RecoveredLeaseGraceMs)
	}
	p.recovered = p.recovered[k:]
	if len(p.recovered) > 0 {
		p.more = true
	} else {
		p.recovered = nil
	}
	return appended, nil
}

// adopt makes c the holder of its recovered leases and delivers them (see
// Partition.Adopt). It appends nothing: the leases are in the log already.
func (p *Partition) adopt(c Consumer, now int64) int {
	if !slices.Contains(p.consumers, c) {
		return 0
	}
	var mine []queue.Info
	for _, in := range p.st.Inflight(c.Owner()) {
		if _, held := p.holders[in.Offset]; held || in.DeadlineMs <= now {
			continue
		}
		mine = append(mine, in)
	}
	if len(mine) == 0 {
		return 0
	}
	p.recovered = slices.DeleteFunc(p.recovered, func(in queue.Info) bool {
		return slices.ContainsFunc(mine, func(x queue.Info) bool { return x.Offset == in.Offset })
	})
	if len(p.recovered) == 0 {
		p.recovered = nil
	}
	if a, ok := c.(Adopter); ok {
		a.AdoptCredit(len(mine))
	}
	n := 0
	for _, in := range mine {
		m, err := p.message(in.Offset)
		if err != nil {
			// The lease stands and expires; the consumer never sees it.
			p.logger.Error("cannot read adopted message", "offset", in.Offset, "err", err)
			c.RefundCredit(1)
			continue
		}
		p.holders[in.Offset] = holder{c: c, leaseID: in.LeaseID}
		c.Deliver(Delivery{
			Offset: in.Offset, LeaseID: in.LeaseID, Attempt: in.Attempt,
			PublishedAtMs: m.PublishedAtMs, Key: m.Key, Headers: m.Headers,
			ContentType: m.ContentType, Body: m.Body,
		})
		n++
	}
	p.logger.Info("recovered leases adopted", "owner", c.Owner(), "adopted", n)
	return n
}

func (p *Partition) takeControl() []control {
	p.ctlMu.Lock()
	m := p.ctl
	p.ctl = nil
	p.ctlMu.Unlock()
	return m
}

// appendAll appends and applies evs in order. Lease events are recorded as
// deliveries to c (which must be non-nil if evs holds any); DeadLetter events
// with a target are remembered so the copy starts once they are durable.
func (p *Partition) appendAll(evs []queue.Event, c Consumer) (int, error) {
	for i := range evs {
		ev := &evs[i]
		p.buf = ev.Marshal(p.buf[:0])
		lsn, err := p.log.Append(uint8(ev.Kind), p.buf)
		if err != nil {
			return i, fmt.Errorf("append %v: %w", ev.Kind, err)
		}
		p.lastLSN = lsn
		if err := p.st.Apply(lsn, *ev); err != nil {
			// The queue rejected an event it just produced.
			panic(fmt.Sprintf("partition %s: apply of own %v event at lsn %d: %v", p, ev.Kind, lsn, err))
		}
		p.cfg.Counters.count(ev)
		switch ev.Kind {
		case queue.KindAck:
			p.acked.put(ev.Offset, ev.LeaseID)
			p.leaseEnded(ev.Offset, ev.LeaseID)
		case queue.KindLease:
			if c == nil {
				panic("partition: lease event without a consumer")
			}
			p.holders[ev.Offset] = holder{c: c, leaseID: ev.LeaseID}
			p.open.deliveries = append(p.open.deliveries, pending{c: c, offset: ev.Offset, leaseID: ev.LeaseID, attempt: ev.Attempt})
		case queue.KindRequeue:
			p.leaseEnded(ev.Offset, ev.LeaseID)
		case queue.KindDeadLetter:
			if ev.LeaseID != 0 {
				p.leaseEnded(ev.Offset, ev.LeaseID)
			}
			if ev.Target != "" {
				p.open.newDead = append(p.open.newDead, ev.Offset)
			}
		}
	}
	p.evs = evs[:0] // keep the grown buffer for the next command
	return len(evs), nil
}

// leaseEnded notes that the lease leaseID on offset ended. Its holder, if
// an attached consumer holds it, is told once the ending record is durable
// (after the stage's deliveries, so never before the Deliver it ends).
// Leases found by recovery have no holder.
func (p *Partition) leaseEnded(offset, leaseID uint64) {
	h, ok := p.holders[offset]
	if !ok || h.leaseID != leaseID {
		return
	}
	delete(p.holders, offset)
	p.open.ended = append(p.open.ended, pending{c: h.c, offset: offset, leaseID: leaseID})
}

// dispatch leases ready messages to consumers with credit, round-robin in
// chunks of at most fairChunkMax so competing consumers share the queue.
func (p *Partition) dispatch(now int64) (int, error) {
	appended, leased := 0, 0
	for leased < dispatchPerTurnMax && len(p.consumers) > 0 {
		progress := false
		for range len(p.consumers) {
			p.rr = (p.rr + 1) % len(p.consumers)
			c := p.consumers[p.rr]
			want := min(fairChunkMax, dispatchPerTurnMax-leased)
			// Credit carried by this stage's settles first: it is
			// spent only on this stage's leases.
			carried := p.takeCarried(c, want)
			got := carried
			if got < want {
				got += c.TakeCredit(want - got)
			}
			if got == 0 {
				continue
			}
			before := len(p.open.deliveries)
			evs := p.st.Lease(p.evs[:0], c.Owner(), got, now)
			n, err := p.appendAll(evs, c)
			appended += n
			k := len(p.open.deliveries) - before
			if k < got {
				// Unspent carried credit stays with the stage; the
				// rest goes back to the consumer now.
				back := min(carried, got-k)
				if back > 0 {
					p.addCarried(c, back)
				}
				if got-k-back > 0 {
					c.RefundCredit(got - k - back)
				}
			}
			if err != nil {
				return appended, err
			}
			leased += k
			if len(evs) > 0 {
				progress = true
			}
			if leased >= dispatchPerTurnMax {
				p.more = true
				break
			}
		}
		if !progress {
			break
		}
	}
	return appended, nil
}

// deliver hands durable leases to their consumers, reading each payload
// from the cache or the log.
func (p *Partition) deliver(ds []pending) {
	p.readAhead(ds)
	defer clear(p.loaded)
	for _, d := range ds {
		if !slices.Contains(p.consumers, d.c) {
			continue // detached meanwhile; its leases were released
		}
		if h, ok := p.holders[d.offset]; !ok || h.leaseID != d.leaseID {
			// The lease ended (expired, say) in a turn after the one that
			// granted it: its message is ready again, so handing it over
			// would only cost a stale settle. Its credit comes back here;
			// LeaseEnded will find nothing outstanding.
			d.c.RefundCredit(1)
			continue
		}
		m, err := p.message(d.offset)
		if err != nil {
			// The lease stands and expires; the consumer never sees it.
			p.logger.Error("cannot read leased message", "offset", d.offset, "err", err)
			d.c.RefundCredit(1)
			continue
		}
		d.c.Deliver(Delivery{
			Offset: d.offset, LeaseID: d.leaseID, Attempt: d.attempt,
			PublishedAtMs: m.PublishedAtMs, Key: m.Key, Headers: m.Headers,
			ContentType: m.ContentType, Body: m.Body,
		})
	}
}

// readAhead loads the payloads of ds that the body cache lacks into
// p.loaded, reading each run of nearby offsets (at most readGapMax apart)
// with one sequential ScanRange instead of one Read per message: a backlog
// drained in offset order costs a few large reads. Offsets it cannot load
// are left to message, which reads them one by one and reports errors.
func (p *Partition) readAhead(ds []pending) {
	miss := p.missing[:0]
	for _, d := range ds {
		// A relocated body is not at its offset: message reads it alone.
		if _, ok := p.cache.get(d.offset); !ok && p.st.BodyLSN(d.offset) == d.offset {
			miss = append(miss, d.offset)
		}
	}
	p.missing = miss
	if len(miss) < 2 {
		return
	}
	slices.Sort(miss)
	miss = slices.Compact(miss)
	for i := 0; i < len(miss); {
		j := i + 1
		for j < len(miss) && miss[j]-miss[j-1] <= readGapMax {
			j++
		}
		run := miss[i:j]
		i = j
		if len(run) < 2 {
			continue
		}
		k := 0
		err := p.log.ScanRange(run[0], run[len(run)-1], func(r seglog.Record) error {
			for k < len(run) && run[k] < r.LSN {
				k++
			}
			if k < len(run) && run[k] == r.LSN && queue.Kind(r.Type) == queue.KindEnqueue {
				p.loaded[r.LSN] = bytes.Clone(r.Payload)
			}
			return nil
		})
		if err != nil {
			p.logger.Warn("read-ahead of leased messages failed; reading them one by one", "from", run[0], "err", err)
		}
	}
}

// message returns the published message at offset; Key and Body alias a
// buffer nobody modifies.
func (p *Partition) message(offset uint64) (*queue.Message, error) {
	m, _, err := p.messageSized(offset)
	return m, err
}

// messageSized is message that also returns the size of the payload the
// message was decoded from. The body is read from the cache, from what
// readAhead loaded, or from the log at its current location: its Enqueue
// record, or the Relocate record that last copied it forward.
func (p *Partition) messageSized(offset uint64) (*queue.Message, int, error) {
	payload, ok := p.cache.get(offset)
	if !ok {
		payload, ok = p.loaded[offset]
	}
	if ok {
		ev, err := queue.DecodeEvent(uint8(queue.KindEnqueue), payload)
		if err != nil {
			return nil, 0, err
		}
		return ev.Msg, len(payload), nil
	}
	r, err := p.log.Read(p.st.BodyLSN(offset))
	if err != nil {
		return nil, 0, err
	}
	m, err := bodyMessage(offset, r.Type, r.LSN, r.Payload)
	return m, len(r.Payload), err
}

// Reserved headers on dead-letter copies.
const (
	HeaderSourceTopic     = "sinew.source.topic"
	HeaderSourceGroup     = "sinew.source.group"
	HeaderSourcePartition = "sinew.source.partition"
	HeaderSourceOffset    = "sinew.source.offset"
	HeaderRetries         = "sinew.retries"
	HeaderReason          = "sinew.reason"
	HeaderDeadLetteredAt  = "sinew.dead_lettered_at_ms"
	// ReservedHeaderPrefix starts every header name the broker owns.
	ReservedHeaderPrefix = "sinew."
)

// startDeadLetters starts copies for dead-lettering messages that are due,
// up to deadLetterInflightMax at a time, lowest offset first.
func (p *Partition) startDeadLetters(now int64) {
	if len(p.deadLetters) == 0 || p.dlInflight >= deadLetterInflightMax {
		return
	}
	due := make([]uint64, 0, min(len(p.deadLetters), deadLetterInflightMax))
	for off, d := range p.deadLetters {
		if !d.inflight && d.retryAtMs <= now {
			due = append(due, off)
		}
	}
	slices.Sort(due)
	for _, off := range due {
		if p.dlInflight >= deadLetterInflightMax {
			p.more = true
			return
		}
		info, ok := p.st.Lookup(off, now)
		if !ok || info.State != queue.StateDeadLettering {
			delete(p.deadLetters, off)
			continue
		}
		d := p.deadLetters[off]
		m, err := p.message(off)
		if err != nil {
			p.logger.Error("cannot read dead-lettered message", "offset", off, "err", err)
			d.retryAtMs = now + deadLetterRetryMs
			continue
		}
		cp := p.deadLetterCopy(m, info)
		d.inflight = true
		p.dlInflight++
		if p.cfg.DeadLetter == nil {
			p.deadLettered(off, errors.New("no dead-letter publisher configured"))
			continue
		}
		p.cfg.DeadLetter(info.Target, cp, func(err error) { p.deadLettered(off, err) })
	}
}

func (p *Partition) deadLettered(off uint64, err error) {
	_ = p.control(control{kind: ctlDeadLettered, offset: off, err: err})
}

func (p *Partition) deadLetterCopy(m *queue.Message, info queue.Info) *queue.Message {
	hs := make([]queue.Header, 0, len(m.Headers)+7)
	for _, h := range m.Headers {
		if !strings.HasPrefix(h.Key, ReservedHeaderPrefix) {
			hs = append(hs, h)
		}
	}
	hs = append(hs,
		queue.Header{Key: HeaderSourceTopic, Value: p.cfg.Topic},
		queue.Header{Key: HeaderSourceGroup, Value: p.cfg.Group},
		queue.Header{Key: HeaderSourcePartition, Value: strconv.FormatUint(uint64(p.cfg.Index), 10)},
		queue.Header{Key: HeaderSourceOffset, Value: strconv.FormatUint(info.Offset, 10)},
		queue.Header{Key: HeaderRetries, Value: strconv.FormatUint(uint64(info.Attempt), 10)},
		queue.Header{Key: HeaderReason, Value: info.Reason.String()},
		queue.Header{Key: HeaderDeadLetteredAt, Value: strconv.FormatInt(info.DeadlineMs, 10)},
	)
	return &queue.Message{
		Key: m.Key, Headers: hs, ContentType: m.ContentType, Body: m.Body,
	}
}

// failStage answers the commands of st after a failure: those whose
// records (and the records before them) are durable up to safe get their
// true answer, the rest ErrUnavailable. Deliveries and dead letters are
// dropped.
func (p *Partition) failStage(st *stage, safe uint64) {
	for _, r := range st.replies {
		switch {
		case r.lsn <= safe && r.published != nil:
			r.published(r.offset, r.duplicate, r.err)
		case r.lsn <= safe:
			r.settled(r.err)
		case r.published != nil:
			r.published(0, false, ErrUnavailable)
		default:
			r.settled(ErrUnavailable)
		}
	}
	clear(st.replies)
	st.replies = st.replies[:0]
	refundCarried(st)
	clear(st.deliveries)
	st.deliveries = st.deliveries[:0]
	clear(st.ended)
	st.ended = st.ended[:0]
	st.newDead = st.newDead[:0]
	st.records = 0
}

// carryCredit asks c, whose lease on offset a settle it sent just ended in
// the open stage, for that lease's credit (CreditCarrier); the stage's
// dispatch may spend it.
func (p *Partition) carryCredit(c Consumer, offset, leaseID uint64) {
	cc, ok := c.(CreditCarrier)
	if !ok || !cc.CarryCredit(offset, leaseID) {
		return
	}
	p.addCarried(c, 1)
}

// addCarried adds n to the credit the open stage carries for c.
func (p *Partition) addCarried(c Consumer, n int) {
	for i := range p.open.carried {
		if p.open.carried[i].c == c {
			p.open.carried[i].n += n
			return
		}
	}
	p.open.carried = append(p.open.carried, carry{c: c, n: n})
}

// takeCarried removes up to want credit carried for c in the open stage
// and returns it.
func (p *Partition) takeCarried(c Consumer, want int) int {
	for i := range p.open.carried {
		if cr := &p.open.carried[i]; cr.c == c {
			n := min(cr.n, want)
			cr.n -= n
			return n
		}
	}
	return 0
}

// refundCarried gives the credit st carried but did not spend back to its
// consumers. It runs after st's replies, so the settles that freed it are
// answered before it can pay for a delivery elsewhere.
func refundCarried(st *stage) {
	for _, cr := range st.carried {
		if cr.n > 0 {
			cr.c.RefundCredit(cr.n)
		}
	}
	clear(st.carried)
	st.carried = st.carried[:0]
}

// fail stops the partition after an I/O error: its in-memory state may be
// ahead of the disk, so it must not answer from it again. Everything waiting
// (both pipeline stages and the rest of the turn's batch) is refused and
// consumers are told. batch is the turn's batch, nil outside a turn.
func (p *Partition) fail(err error, batch []command) {
	p.failed = err
	p.down.Store(&err)
	p.logger.Error("partition failed; it serves nothing until restarted", "err", err)
	// Each command of this turn before len(open.replies) has a reply; the
	// rest of the batch was never looked at.
	// The syncing stage keeps waiting for its own sync's outcome (synced1).
	looked := len(p.open.replies) - p.turnReplies
	safe := p.log.DurableLSN()
	p.failStage(&p.open, safe)
	if !p.syncBusy {
		p.failStage(&p.syncing, safe)
	}
	if batch != nil {
		for _, c := range batch[min(looked, len(batch)):] {
			refuse(c, ErrUnavailable)
		}
	}
	p.refusePurges(ErrUnavailable)
	for _, c := range p.consumers {
		c.Detached(fmt.Errorf("%w: %w", ErrUnavailable, err))
	}
	p.consumers = nil
	clear(p.holders)
	p.publishStats()
}
