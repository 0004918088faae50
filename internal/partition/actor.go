package partition

import (
	"fmt"
	"runtime"
	"slices"
	"time"
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
	defer func() {
		if p.syncerUp {
			// A sync under way finishes first; its answer waits in
			// synced.
			close(p.syncReq)
			p.syncerUp = false
		}
		if p.syncerDone != nil {
			<-p.syncerDone
		}
		p.awaitSnapshotBuild()
		// Close writes the last checkpoint itself: the one under way
		// is awaited first.
		if p.ckptBusy {
			p.checkpointed(<-p.ckptDone)
		}
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	// On the heap: a command array in this frame would make every
	// actor's stack 32 KiB for good, idle or not. Made at the first
	// command: a partition that never gets one keeps none.
	var batch []command
	for {
		inbox := p.inbox.ready
		if len(p.open.replies) >= stageCommandsMax || len(p.committing) >= committingStagesMax {
			// Backpressure: the open stage is full until the sync under
			// way returns, or too many stages wait for a quorum; the
			// bounded inbox absorbs the rest.
			inbox = nil
		}
		if p.ckptHold {
			if p.leads && p.st.NextLSN() > p.committed+1 {
				// A due checkpoint waits for the quorum to catch up
				// (replicatedCheckpoint); the bounded inbox absorbs
				// the commands meanwhile.
				inbox = nil
			} else {
				p.ckptHold = false
			}
		}
		fromInbox := false
		select {
		case <-inbox:
			if batch == nil {
				batch = newBatch()
			}
			batch = p.inbox.take(batch, batchMax-len(batch))
			fromInbox = true
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
			for _, c := range batch {
				refuse(c, ErrClosed) // kept for a turn that will not come
			}
			p.drainClosed()
			refuseControl(p.takeControl(), ErrClosed)
			p.finishStages()
			p.refusePurges(ErrClosed)
			return
		}
		if inbox != nil && len(batch) < batchMax {
			batch = p.inbox.take(batch, batchMax-len(batch))
		}
		if fromInbox && p.deferTurn(len(batch)) {
			// Kept for the turn after the sync under way.
			continue
		}
		p.turn(batch)
		clear(batch) // drop references to payloads and callbacks
		if cap(batch) > batchKeepCap && len(batch) < cap(batch)/8 {
			// A burst grew it and the load fell: let it go.
			batch = newBatch()
		} else {
			batch = batch[:0]
		}
		p.startSync()
		p.afterTurn()
		p.arm(timer)
	}
}

// newBatch returns the actor's command batch, allocated on the heap.
//
//go:noinline
func newBatch() []command { return make([]command, 0, 16) }

// batchKeepCap is the batch capacity an actor keeps however light its
// load; a larger one goes once a turn uses less than an eighth of it.
const batchKeepCap = 64

// deferTurn reports whether the commands taken so far (n of them) wait
// for the sync under way to return before their turn, on a group of one.
// Every command records something, and its record could not join that
// sync: it waits for the next one either way. One turn for all of them
// then costs one proposal and one raft round instead of one per handful
// of commands (the publishers answered by a sync come back a few at a
// time). A replicated group proposes at once, so that its followers
// write while the leader syncs.
func (p *Partition) deferTurn(n int) bool {
	return p.single && p.syncBusy && n < batchMax && p.failed == nil
}

// afterTurn starts due dead-letter copies, checkpoints when due and
// publishes the counters.
func (p *Partition) afterTurn() {
	if p.failed != nil {
		return
	}
	now := p.nowMs()
	p.expireSnapshot()
	p.checkSnapshotsSent(now)
	p.startDeadLetters(now)
	// A leader handing its lead over proposes nothing, and relocation
	// would (transferTurn).
	if !p.ckptBusy && p.checkpointDue(now) && now >= p.ckptRetryAtMs && !p.transferring() {
		p.periodicCheckpoint()
	}
	p.cache.dropBelow(p.st.Frontier()) // settled bodies give their budget back
	// Once quiet, after the idle checkpoint (whose relocation may grow
	// buffers once more) is written.
	if now-p.lastBusyMs >= idleCheckpointMs && !p.ckptBusy && p.idleShrunkMs != p.lastBusyMs {
		p.idleShrunkMs = p.lastBusyMs
		p.shrinkIdle()
	}
	p.publishStats()
}

// drainClosed refuses whatever is left in the inbox once Close has stopped
// new sends.
func (p *Partition) drainClosed() {
	for {
		cs := p.inbox.take(nil, batchMax)
		if len(cs) == 0 {
			return
		}
		for _, c := range cs {
			refuse(c, ErrClosed)
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
		case ctlAdopt:
			m.adopted(0)
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
	if p.transferring() {
		// A leader handing its lead over decides nothing and does not
		// checkpoint (transferTurn, afterTurn): the raft ticks that end
		// the transfer wake it.
		return
	}
	now := p.nowMs()
	var at int64
	ok := false
	if p.leads {
		// A follower acts on no queue deadline: it decides nothing.
		at, ok = p.st.NextDeadlineMs()
		for _, d := range p.deadLetters {
			if !d.inflight && (!ok || d.retryAtMs < at) {
				at, ok = d.retryAtMs, true
			}
		}
		if len(p.recovered) > 0 && (!ok || p.recoveredDueMs < at) {
			at, ok = p.recoveredDueMs, true
		}
		if len(p.kept) > 0 && (!ok || p.kept[0].dueMs < at) {
			at, ok = p.kept[0].dueMs, true
		}
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
		// Nothing due: the partition is idle until a command, a control
		// message or raft wakes it.
		p.stopSyncer()
		return
	}
	if at <= now {
		p.Poke()
		return
	}
	timer.Reset(time.Duration(at-now) * time.Millisecond)
}

// turn runs one turn: the decider decides on the control messages, the
// batch and the clock, and the driver appends what it decided (flush). The
// control messages that need the log (adoption, inspection) run in their
// place in the control list, after the records decided before them are
// appended.
func (p *Partition) turn(batch []command) {
	if p.failed != nil {
		refuseControl(p.takeControl(), ErrUnavailable)
		for _, c := range batch {
			refuse(c, ErrUnavailable)
		}
		return
	}
	if err := p.raftTurn(); err != nil {
		p.fail(err, batch)
		return
	}
	if !p.leads {
		p.followerTurn(batch)
		return
	}
	if p.transferring() {
		p.transferTurn(p.takeControl(), batch)
		return
	}
	now := p.nowMs()
	before := p.nextLSN
	ctl := p.takeControl()
	for i, m := range ctl {
		if p.transferring() {
			// The inspection before this one (Reconfigure) started a
			// leadership transfer: raft takes no proposal now.
			p.transferTurn(ctl[i:], batch)
			return
		}
		switch m.kind {
		case ctlDeadLettered:
			if p.deadLetterDone(m, now) {
				p.deadLetterSettled(m.offset, now)
			}
		case ctlDetachKeep:
			p.detachKeeping(m.c, m.keepMs, p.undelivered(m.c), now)
		case ctlAdopt, ctlInspect:
			if err := p.flush(); err != nil {
				p.fail(err, batch)
				return
			}
			if m.kind == ctlAdopt {
				m.adopted(p.adopt(m.c, now))
			} else {
				m.fn()
			}
		default:
			p.onControl(m, now)
		}
	}
	if p.transferring() {
		p.transferTurn(nil, batch)
		return
	}
	p.decide(batch, now)
	if err := p.flush(); err != nil {
		p.fail(err, nil)
		return
	}
	if len(batch) > 0 || p.nextLSN > before {
		p.lastBusyMs = now
	}
}

// flush hands the records the decider decided to raft, which appends them
// to the log (propose). A failure fails the partition (the caller's
// business): the state already reflects those records.
func (p *Partition) flush() error {
	if len(p.out) > 0 && p.out[0].lsn != p.log.NextLSN() {
		return fmt.Errorf("the decider numbered lsn %d, the log continues at %d", p.out[0].lsn, p.log.NextLSN())
	}
	return p.propose()
}

// transferTurn is a turn of a leader that is handing its lead over
// (transferring): raft drops every proposal until the transferee leads
// (this replica then steps down) or the transfer is abandoned, within an
// election timeout. It decides nothing meanwhile: commands are refused with
// ErrNotLeader, which clients take as an election under way and retry
// (a publish refused here was not stored); control messages that decide
// nothing are served, and the others (detach, dead-letter confirmations,
// adoption) wait in the control list for the turn after the transfer; the
// queue's deadlines and dispatch wait too (arm does not wake the actor for
// them: the raft ticks that end the transfer do).
func (p *Partition) transferTurn(ctl []control, batch []command) {
	now := p.nowMs()
	var held []control
	for _, m := range ctl {
		switch m.kind {
		case ctlAttach, ctlSetConfig, ctlClaim, ctlSteer:
			p.onControl(m, now)
		case ctlInspect:
			m.fn()
		default:
			held = append(held, m)
		}
	}
	if len(held) > 0 {
		p.ctlMu.Lock()
		p.ctl = append(held, p.ctl...)
		p.ctlMu.Unlock()
	}
	for _, c := range batch {
		refuse(c, ErrNotLeader)
	}
}

// followerTurn is a turn of a replica that does not lead: it decides
// nothing. Commands are refused with ErrNotLeader; consumers may attach
// and detach (they are served once this replica leads); inspection runs.
func (p *Partition) followerTurn(batch []command) {
	for _, m := range p.takeControl() {
		switch m.kind {
		case ctlAttach:
			if !slices.Contains(p.consumers, m.c) {
				p.consumers = append(p.consumers, m.c)
			}
		case ctlDetach, ctlDetachKeep:
			if i := slices.Index(p.consumers, m.c); i >= 0 {
				p.consumers = slices.Delete(p.consumers, i, i+1)
			}
		case ctlSetConfig:
			p.st.SetConfig(m.cfg)
		case ctlSteer:
			p.onControl(m, 0)
		case ctlClaim:
			m.claimed(nil)
		case ctlAdopt:
			m.adopted(0)
		case ctlInspect:
			m.fn()
		}
	}
	for _, c := range batch {
		refuse(c, ErrNotLeader)
	}
}

func (p *Partition) takeControl() []control {
	p.ctlMu.Lock()
	m := p.ctl
	p.ctl = nil
	p.ctlMu.Unlock()
	return m
}

// fail stops the partition after an I/O error: its in-memory state may be
// ahead of the disk, so it must not answer from it again. Everything waiting
// (both pipeline stages and the turn's batch, when the decider had not yet
// taken it) is refused and consumers are told. batch is nil once the
// decider has taken it: its commands have their replies in the open stage.
func (p *Partition) fail(err error, batch []command) {
	p.failed = err
	// Stats report the failure before anyone can learn of it otherwise
	// (a refused or failed request), so a caller that was refused and then
	// reads Stats sees why.
	p.publishStats()
	p.down.Store(&err)
	p.logger.Error("partition failed; it serves nothing until restarted", "err", err)
	// The syncing stage keeps waiting for its own sync's outcome (synced1).
	safe := min(p.durableLSN(), p.committed)
	for i := range p.committing {
		p.failStage(&p.committing[i], safe, ErrUnavailable)
	}
	p.committing = p.committing[:0]
	p.failStage(&p.open, safe, ErrUnavailable)
	if !p.syncBusy {
		p.failStage(&p.syncing, safe, ErrUnavailable)
	}
	for _, c := range batch {
		refuse(c, ErrUnavailable)
	}
	p.refusePurges(ErrUnavailable)
	for _, c := range p.consumers {
		c.Detached(fmt.Errorf("%w: %w", ErrUnavailable, err))
	}
	p.consumers = nil
	clear(p.holders)
	p.publishStats()
}
