package partition

import (
	"fmt"
	"slices"
	"time"

	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/wal"
)

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
