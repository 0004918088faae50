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

	"github.com/sinewmq/sinew/internal/delivery"
	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/wal"
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

// syncer makes stages durable (persist) on request, so the actor can run
// the next turns while fdatasync runs. At most one request is outstanding.
// It runs from the first sync after the partition was idle until it is
// idle again (stopSyncer): an idle partition keeps no syncer.
func (p *Partition) syncer(req <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	for range req {
		// The actor does not touch the syncing stage until it has the
		// answer, so reading its size here is safe.
		records, start := p.syncing.records, time.Now()
		lsn, err := p.persist(&p.syncing)
		if err == nil {
			p.observeSync(records, start)
		}
		p.synced <- syncResult{lsn, err}
	}
}

// startSync hands the open stage to the syncer when no sync is under way.
// A stage that appended no entries needs no sync: it only has to wait for
// the stages before it, so it joins the committing ones at once (its
// storage responses, a commit index or a vote already written, are
// delivered now).
func (p *Partition) startSync() {
	if p.syncBusy || p.failed != nil {
		return
	}
	if p.open.entries == 0 && p.open.hs == nil {
		st := p.takeOpen()
		resps := st.resps
		st.resps = nil
		if !st.idle() {
			p.committing = append(p.committing, st)
		}
		if err := p.stepResponses(resps); err != nil {
			p.fail(err, nil)
			return
		}
		p.releaseCommitted()
		return
	}
	p.syncing = p.takeOpen()
	p.syncBusy = true
	if !p.syncerUp {
		p.syncReq, p.syncerDone = make(chan struct{}, 1), make(chan struct{})
		p.syncerUp = true
		go p.syncer(p.syncReq, p.syncerDone)
	}
	p.syncReq <- struct{}{}
}

// stopSyncer ends the syncer goroutine when no sync is under way (actor
// only): the partition is idle, or stopping. The next startSync starts
// another.
func (p *Partition) stopSyncer() {
	if p.syncerUp && !p.syncBusy {
		close(p.syncReq)
		p.syncerUp = false
	}
}

// synced1 handles the syncer's answer for the syncing stage: its storage
// responses are delivered to raft, and it joins the stages waiting for
// their entries to be committed (at once, in a group of one). Its outcome
// is the stage's own even when the partition failed meanwhile, and answers
// whose records reached the disk before a failure are given truthfully
// (deliveries are dropped, since a failed partition has no consumers).
func (p *Partition) synced1(res syncResult) {
	p.syncBusy = false
	if res.err == nil && p.cfg.WAL != nil {
		p.walDurable = max(p.walDurable, res.lsn)
	}
	if res.err == nil && p.failed == nil {
		st := p.syncing
		p.syncing = stage{}
		resps := st.resps
		st.resps = nil
		if !st.idle() {
			// A follower's stages, and a leader's with nothing to
			// answer, need not wait in line.
			p.committing = append(p.committing, st)
		}
		if err := p.stepResponses(resps); err != nil {
			p.fail(err, nil)
		}
		return
	}
	// The partition failed (or the sync did): what is durable here is
	// true only as far as it is committed, which in a larger group takes
	// a quorum this failed replica will not hear from again.
	safe := max(res.lsn, p.durableLSN())
	if !p.single {
		safe = min(safe, p.committed)
	}
	if res.err != nil && p.failed == nil {
		p.fail(res.err, nil)
	}
	p.failStage(&p.syncing, safe, ErrUnavailable)
}

// finishStages completes the pipeline at Close: the sync under way is
// awaited and the leader's last records are made durable and committed, so
// that every command the actor took gets its true answer. What a larger
// group could not commit meanwhile is answered ErrClosed: its outcome is
// unknown.
func (p *Partition) finishStages() {
	if p.syncBusy {
		p.synced1(<-p.synced)
	}
	if p.failed != nil {
		return
	}
	if p.leads && p.single {
		if err := p.settleInline(); err != nil {
			p.fail(err, nil)
			return
		}
	}
	for i := range p.committing {
		p.failStage(&p.committing[i], 0, ErrClosed)
	}
	p.committing = p.committing[:0]
	p.failStage(&p.open, 0, ErrClosed)
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
	for _, n := range st.gates {
		for _, c := range p.consumers {
			if w, ok := c.(GateWatcher); ok && (n.c == nil || n.c == c) {
				w.GateMoved(n.g)
			}
		}
	}
	clear(st.gates)
	st.gates = st.gates[:0]
	st.entries = 0
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
	if p.leads && !p.single {
		p.replicatedCheckpoint()
		return
	}
	if !p.leads {
		// Only the leader decides records; a follower's checkpoints
		// follow what it applied.
	} else if _, err := p.relocate(); err != nil {
		p.fail(err, nil)
		return
	}
	if err := p.flushHardState(); err != nil {
		p.fail(err, nil)
		return
	}
	j, ok := p.takeCheckpoint()
	if !ok {
		return
	}
	p.startCheckpoint(j)
}

// replicatedCheckpoint is periodicCheckpoint on the leader of a larger
// group. Its checkpoint may claim only committed entries, and under load
// the leader always has some that are not: so once a checkpoint is due the
// actor takes no new command (ckptHold; see run) until the quorum has
// caught up, which takes one replication round, and then checkpoints.
// Relocation follows the checkpoint (its records are the next one's), so
// that its own appends do not keep the checkpoint waiting.
func (p *Partition) replicatedCheckpoint() {
	if err := p.flushHardState(); err != nil {
		p.fail(err, nil)
		return
	}
	j, ok := p.takeCheckpoint()
	if !ok {
		p.ckptHold = p.st.NextLSN() > p.committed+1
		return
	}
	p.ckptHold = false
	p.startCheckpoint(j)
	if _, err := p.relocate(); err != nil {
		p.fail(err, nil)
	}
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

// undelivered returns the leases granted to c whose deliveries wait in a
// stage, not yet handed to c: offset to lease id.
func (p *Partition) undelivered(c Consumer) map[uint64]uint64 {
	var m map[uint64]uint64
	add := func(st *stage) {
		for _, d := range st.deliveries {
			if d.c == c {
				if m == nil {
					m = make(map[uint64]uint64)
				}
				m[d.offset] = d.leaseID
			}
		}
	}
	add(&p.open)
	if p.syncBusy {
		// The syncer reads only the stage's records and WAL entries.
		add(&p.syncing)
	}
	for i := range p.committing {
		add(&p.committing[i])
	}
	return m
}

// deadLetterDone books the confirmation of a dead-letter copy and reports
// whether the copy is durable, so its message is settled; a failed copy is
// retried after deadLetterRetryMs.
func (p *Partition) deadLetterDone(m control, now int64) bool {
	d, ok := p.deadLetters[m.offset]
	if !ok {
		return false
	}
	d.inflight = false
	p.dlInflight--
	if m.err != nil {
		d.retryAtMs = now + deadLetterRetryMs
		p.logger.Warn("dead-letter copy failed; will retry", "offset", m.offset, "err", m.err)
		return false
	}
	delete(p.deadLetters, m.offset)
	return true
}

// persist makes the records appended so far as safe as the sync policy
// promises before anything is confirmed: fdatasync'd under SyncAlways,
// written to the OS (surviving a process crash, durable within the
// interval) under SyncInterval. With Config.WAL, st's entries are made
// durable by one journal commit; the log writes them later.
//
// It returns the LSN up to which that promise holds (also on error).
func (p *Partition) persist(st *stage) (uint64, error) {
	if p.cfg.WAL != nil {
		// The log holds the entries for reads and writes them to the OS
		// in its own time; the journal makes them durable with other
		// partitions' in one fdatasync.
		ents := st.wal
		if err := p.cfg.WAL.Commit(p.cfg.WALGroup, wal.Batch{Entries: ents, HardState: st.hs}); err != nil {
			return 0, fmt.Errorf("wal: %w", err)
		}
		if len(ents) == 0 {
			return 0, nil
		}
		return ents[len(ents)-1].Index, nil
	}
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

// durableLSN is the last index known durable, in the log's own files or in
// the WAL.
func (p *Partition) durableLSN() uint64 {
	return max(p.log.DurableLSN(), p.walDurable)
}

// adopt makes c the holder of its recovered leases and delivers them (see
// Partition.Adopt). It appends nothing: the leases are in the log already.
func (p *Partition) adopt(c Consumer, now int64) int {
	mine := p.adoptable(c, now)
	if len(mine) == 0 {
		return 0
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
			PublishedAtMs: m.PublishedAtMs, Key: m.Key, Headers: delivery.Headers(m.Headers),
			ContentType: m.ContentType, Body: m.Body,
			Assignment: p.st.Gate().Epoch, // every inflight lease is under the current assignment
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
		var expires int64
		var term uint64
		if !p.single {
			if in, ok := p.st.Lookup(d.offset, p.nowMs()); ok && in.LeaseID == d.leaseID {
				expires = in.DeadlineMs
			}
			term = p.term.Load()
		}
		d.c.Deliver(Delivery{
			Offset: d.offset, LeaseID: d.leaseID, Attempt: d.attempt,
			PublishedAtMs: m.PublishedAtMs, Key: m.Key, Headers: delivery.Headers(m.Headers),
			ContentType: m.ContentType, Body: m.Body, ExpiresAtMs: expires, Epoch: term,
			Assignment: d.assignment,
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
// true answer, the rest err. Deliveries and dead letters are dropped.
func (p *Partition) failStage(st *stage, safe uint64, err error) {
	for _, r := range st.replies {
		switch {
		case r.lsn <= safe && r.published != nil:
			r.published(r.offset, r.duplicate, r.err)
		case r.lsn <= safe:
			r.settled(r.err)
		case r.published != nil:
			r.published(0, false, err)
		default:
			r.settled(err)
		}
	}
	clear(st.replies)
	st.replies = st.replies[:0]
	refundCarried(st)
	clear(st.deliveries)
	st.deliveries = st.deliveries[:0]
	clear(st.ended)
	st.ended = st.ended[:0]
	clear(st.gates)
	st.gates = st.gates[:0]
	st.newDead = st.newDead[:0]
	st.records, st.entries = 0, 0
	clear(st.resps)
	st.resps = st.resps[:0]
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
