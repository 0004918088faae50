package partition

import (
	"context"
	"fmt"
	"slices"

	"github.com/sinewmq/sinew/internal/queue"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// becomeLeader makes this replica the deciding one: its state, which holds
// the committed entries, takes in the rest of its log (entries of earlier
// terms that the new leader's first entry will commit), and the leases in
// it are treated as recovered ones.
func (p *Partition) becomeLeader() error {
	for next := p.applied + 1; next < p.log.NextLSN(); next = p.applied + 1 {
		r, err := p.log.Read(next)
		if err != nil {
			return fmt.Errorf("partition %s: read lsn %d as a new leader: %w", p, next, err)
		}
		e := &raftpb.Entry{Index: next, Term: r.Term, Type: raftpb.EntryNormal}
		if queue.IsEventType(r.Type) {
			e.Data = append([]byte{r.Type}, r.Payload...)
		}
		if err := p.applyEntry(e); err != nil {
			return err
		}
	}
	p.leads = true
	p.nextLSN, p.lastLSN = p.applied+1, p.applied
	// A configuration change an earlier leader proposed may be in the
	// log, uncommitted: as raft does, the next one waits until everything
	// up to here is committed. So does a leadership transfer.
	p.confAt = max(p.confAt, p.lastLSN)
	p.caught, p.preferredSince = p.caught[:0], 0
	p.firstLead = p.isFirstLead()
	// Consumers attached while this replica followed learn where the gate
	// stands (GateWatcher).
	p.open.gates = append(p.open.gates, gateNote{g: p.st.Gate()})
	if !p.single {
		p.recovered = p.st.Leases()
		p.recoveredDueMs = p.nowMs() + max(p.cfg.RecoveredLeaseGraceMs, 0)
		for _, in := range p.st.PendingDeadLetters() {
			p.deadLetters[in.Offset] = &deadLetter{}
		}
		p.logger.Info("partition replica leads", "term", p.term.Load(), "last", p.lastLSN)
	}
	return nil
}

// isFirstLead reports whether this leader's term holds the group's first
// entry: the log was empty, or starts at LSN 1 with an entry of this term.
func (p *Partition) isFirstLead() bool {
	if p.log.FirstLSN() > 1 {
		return false
	}
	if p.log.NextLSN() <= 1 {
		return true
	}
	t, err := p.log.Term(1)
	return err == nil && t == p.rn.BasicStatus().Term
}

// holdTicks is the preferred owner's hold-down on this leader.
func (p *Partition) holdTicks() uint64 {
	if p.firstLead {
		return min(uint64(p.cfg.PreferredOwnerHoldTicks), firstLeadHoldTicks)
	}
	return uint64(p.cfg.PreferredOwnerHoldTicks)
}

// stepDown gives up deciding: what was proposed and not committed may be
// replaced by the next leader, so the state is rebuilt from the checkpoint
// and the log up to the commit index, every request still waiting is
// answered with why (ErrNotLeader: its outcome is unknown), and the
// consumers are detached.
func (p *Partition) stepDown(why error) error {
	p.leads, p.firstLead = false, false
	p.caught, p.preferredSince = p.caught[:0], 0
	// The committing stages' storage responses were delivered already;
	// once answered they hold nothing to release. The syncing and the
	// open stage keep their entries and storage responses: raft learns
	// that those entries are durable when their sync returns, as a
	// follower's.
	for i := range p.committing {
		p.failOutcome(&p.committing[i], why)
	}
	p.committing = p.committing[:0]
	if p.syncBusy {
		p.failOutcome(&p.syncing, why)
	}
	p.failOutcome(&p.open, why)
	p.taken()
	p.refusePurges(why)
	for _, c := range p.consumers {
		c.Detached(why)
	}
	p.consumers = nil
	clear(p.holders)
	p.recovered = nil
	p.kept = nil
	clear(p.deadLetters)
	p.dlInflight = 0
	if p.ckptBusy {
		// The checkpointer may be dropping the segments a rebuild from
		// the checkpoint on disk now would replay: let it finish.
		p.checkpointed(<-p.ckptDone)
	}
	if err := p.rebuild(p.committed); err != nil {
		return err
	}
	p.applied = p.committed
	p.nextLSN, p.lastLSN = p.applied+1, p.applied
	p.logger.Info("partition replica no longer leads", "why", why, "committed", p.committed)
	return nil
}

// failOutcome answers every command of st with err and drops what st
// would have handed to consumers, but keeps what raft is owed: its
// entries, their sync and the storage responses that follow it.
func (p *Partition) failOutcome(st *stage, err error) {
	for _, r := range st.replies {
		if r.published != nil {
			r.published(0, false, err)
		} else {
			r.settled(err)
		}
	}
	clear(st.replies)
	st.replies = st.replies[:0]
	refundCarried(st)
	// The deliveries' credit goes back to their consumers: in a cluster a
	// consumer stays attached to a replica that lost the lead, and would
	// otherwise be short of that credit when it leads again.
	for _, d := range st.deliveries {
		d.c.RefundCredit(1)
	}
	clear(st.deliveries)
	st.deliveries = st.deliveries[:0]
	clear(st.ended)
	st.ended = st.ended[:0]
	st.newDead = st.newDead[:0]
}

// sampleCaughtUp notes, on a leader, which voters are caught up (caught)
// and since when the preferred owner has been one without a break, its
// node alive (Config.PeerAlive) all along (preferredSince). A voter is caught up when raft heard from it within
// the current election timeout, replicates to it (it is not being probed
// or sent a snapshot) and its log holds every committed entry. Entries
// past the commit index need not be there yet: a leadership transfer
// sends them before it hands over (raft's TransferLeader waits for the
// transferee's log to match the leader's last index).
func (p *Partition) sampleCaughtUp() {
	p.wasCaught = append(p.wasCaught[:0], p.caught...)
	p.caught = p.caught[:0]
	if !p.leads || p.single {
		p.preferredSince = 0
		return
	}
	commit := p.rn.BasicStatus().Commit
	p.rn.WithProgress(func(id uint64, typ raft.ProgressType, pr tracker.Progress) {
		if id != p.raftID && typ == raft.ProgressTypePeer && pr.RecentActive &&
			pr.State == tracker.StateReplicate && pr.Match >= commit {
			p.caught = append(p.caught, id)
		}
	})
	for _, id := range p.wasCaught {
		if !slices.Contains(p.caught, id) {
			// A replica fell behind or away: the group is past its
			// forming, and a returning owner waits the whole hold-down.
			p.firstLead = false
		}
	}
	switch {
	case p.preferred == 0 || !slices.Contains(p.caught, p.preferred):
		p.preferredSince = 0
	case p.cfg.PeerAlive != nil && !p.cfg.PeerAlive(p.preferred):
		// Caught up over raft, but the cluster sees its node dead (it is
		// fenced, or its gossip is cut): the hold-down starts again once
		// it is healthy.
		p.preferredSince = 0
	case p.preferredSince == 0:
		p.preferredSince = p.ticked + 1 // 0 means "not caught up"
	}
}

// transferring reports whether this leader is handing its lead over: raft
// then drops every proposal until the transferee leads or the transfer is
// abandoned (after an election timeout), so the actor decides nothing
// meanwhile (transferTurn).
func (p *Partition) transferring() bool {
	return p.leads && !p.single && p.rn.BasicStatus().LeadTransferee != raft.None
}

// transferLead asks raft to hand the lead to voter id and reports it.
func (p *Partition) transferLead(id uint64, why string) (string, error) {
	p.wakeQuiet()
	if err := p.raftSafe(func() error { p.rn.TransferLeader(id); return nil }); err != nil {
		return "", err
	}
	if err := p.pump(); err != nil {
		return "", err
	}
	p.logger.Info("partition replica transfers its lead", "to", id, "why", why, "term", p.term.Load())
	return fmt.Sprintf("transfer leadership to %d (%s)", id, why), nil
}

// Reconfigure moves the group's replicas one step toward want (raft ids,
// preferred owner first), on the leader, and reports the step it took (""
// for none): a wanted replica missing from the group is added as a
// learner; a learner that has caught up (its log matches to the commit
// index) is promoted to voter; once every wanted replica votes, a leader
// that is not wanted hands its lead to a caught-up wanted voter (want[0]
// first; the new leader then removes it), and a replica not wanted is
// removed. With nothing else to do, a leader that is not want[0] hands
// its lead to want[0] once want[0] has been a caught-up voter for
// Config.PreferredOwnerHoldTicks without a break (sampleCaughtUp says
// what caught up means).
//
// One step at a time: while the last configuration change is not
// committed, or a leadership transfer is under way, it does nothing. A
// replica that does not lead answers ErrNotLeader.
func (p *Partition) Reconfigure(ctx context.Context, want []uint64) (string, error) {
	if err := p.Unavailable(); err != nil {
		return "", err
	}
	if p.QuietPlaced(want) {
		return "", nil
	}
	return p.leaderStep(ctx, func() (string, error) {
		if !p.leads || p.single {
			return "", ErrNotLeader
		}
		if len(want) > 0 {
			if p.preferred != want[0] {
				p.preferredSince = 0
				p.wakeQuiet() // the hold-down counts ticks
			}
			p.preferred = want[0]
			p.qz.preferred.Store(want[0])
		}
		if p.committed < p.confAt || p.transferring() {
			return "", nil
		}
		st := p.rn.Status()
		voters, learners := st.Config.Voters[0], st.Config.Learners
		in := func(id uint64) bool {
			_, v := voters[id]
			_, l := learners[id]
			return v || l
		}
		var cc *raftpb.ConfChange
		what := ""
		for _, id := range want {
			if !in(id) {
				cc, what = &raftpb.ConfChange{Type: raftpb.ConfChangeAddLearnerNode, NodeID: id}, fmt.Sprintf("add learner %d", id)
				break
			}
		}
		if cc == nil {
			for _, id := range want {
				if _, l := learners[id]; l && st.Progress[id].Match >= st.Commit {
					cc, what = &raftpb.ConfChange{Type: raftpb.ConfChangeAddNode, NodeID: id}, fmt.Sprintf("promote %d", id)
					break
				}
			}
		}
		allVote := true
		for _, id := range want {
			_, v := voters[id]
			allVote = allVote && v
		}
		if cc == nil && allVote && len(want) > 0 && !slices.Contains(want, p.raftID) {
			// This leader is leaving the group: the lead goes first, to a
			// wanted voter that has caught up, and the new leader removes
			// this replica. None caught up yet: wait.
			for _, id := range want {
				if slices.Contains(p.caught, id) {
					what, err := p.transferLead(id, "this replica is not wanted")
					return what, err
				}
			}
			return "", nil
		}
		if cc == nil {
			for id := range voters {
				if allVote && !slices.Contains(want, id) && id != p.raftID {
					cc, what = &raftpb.ConfChange{Type: raftpb.ConfChangeRemoveNode, NodeID: id}, fmt.Sprintf("remove %d", id)
					break
				}
			}
			for id := range learners {
				if cc == nil && !slices.Contains(want, id) {
					cc, what = &raftpb.ConfChange{Type: raftpb.ConfChangeRemoveNode, NodeID: id}, fmt.Sprintf("remove learner %d", id)
				}
			}
		}
		if cc == nil && len(want) > 0 && want[0] != p.raftID && p.preferredSince != 0 &&
			p.ticked+1-p.preferredSince >= p.holdTicks() && slices.Contains(p.caught, want[0]) {
			// The preferred owner has been caught up for the whole
			// hold-down. A failed transfer (raft gives up after an
			// election timeout) is tried again only after another one.
			p.preferredSince = 0
			what, err := p.transferLead(want[0], "the preferred owner")
			return what, err
		}
		if cc == nil {
			return "", nil
		}
		if err := p.proposeConf(*cc); err != nil {
			return "", err
		}
		return what, nil
	})
}

// HandLeadOver hands the lead of a replica that leads to a caught-up voter
// of its group (the first among want, raft ids, then any), and reports the
// step ("" when none has caught up, or a transfer is already under way).
// A fenced node calls it for every partition it leads, so that it stops
// leading while it sees a majority of the cluster dead (its raft
// messages may still flow when only gossip is cut). A replica that does
// not lead answers ErrNotLeader.
func (p *Partition) HandLeadOver(ctx context.Context, want []uint64, why string) (string, error) {
	what, _, err := p.handLeadOver(ctx, want, why)
	return what, err
}

// handLeadOver is HandLeadOver, which also reports the voter the lead is
// being handed to: the one it chose, or the one of a transfer under way
// (0 for none).
func (p *Partition) handLeadOver(ctx context.Context, want []uint64, why string) (string, uint64, error) {
	if err := p.Unavailable(); err != nil {
		return "", 0, err
	}
	var to uint64
	what, err := p.leaderStep(ctx, func() (string, error) {
		if !p.leads || p.single {
			return "", ErrNotLeader
		}
		p.wakeQuiet()
		if p.transferring() {
			to = p.rn.BasicStatus().LeadTransferee
			return "", nil
		}
		for _, id := range slices.Concat(want, p.caught) {
			if id != p.raftID && slices.Contains(p.caught, id) {
				to = id
				return p.transferLead(id, why)
			}
		}
		return "", nil
	})
	if err != nil {
		// to may be written yet: ctx may have ended before the step ran.
		return "", 0, err
	}
	return what, to, nil
}

// leaderStep runs step on the partition's goroutine (between two turns)
// and returns what it reports, or ctx's error if ctx ends first.
func (p *Partition) leaderStep(ctx context.Context, step func() (string, error)) (string, error) {
	type answer struct {
		what string
		err  error
	}
	ch := make(chan answer, 1)
	if err := p.control(control{kind: ctlInspect, fn: func() {
		what, err := step()
		ch <- answer{what, err}
	}}); err != nil {
		return "", err
	}
	select {
	case a := <-ch:
		return a.what, a.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// proposalDropped undoes what the decider decided for a proposal raft refused:
// the state is rebuilt from the commit index and the requests waiting are
// answered ErrNotLeader (stepDown). raft refuses a proposal when this
// replica lost the lead, and also, while it still leads, during a
// leadership transfer (the actor does not propose then: transferTurn) or
// when a proposal does not fit its limits: a replica that still leads then
// takes its own log back in and goes on leading (becomeLeader), or it
// would refuse everything while raft holds it the leader.
func (p *Partition) proposalDropped(why error) error {
	if err := p.stepDown(why); err != nil {
		return err
	}
	if p.rn.BasicStatus().RaftState == raft.StateLeader {
		return p.becomeLeader()
	}
	return nil
}

// proposeConf proposes a configuration change as leader, between two
// decided batches (the actor flushed its proposals first): its entry takes
// the next index, which the queue state records as a settled gap at once,
// as it records the leader's own decisions.
func (p *Partition) proposeConf(cc raftpb.ConfChange) error {
	idx := p.log.NextLSN()
	if idx != p.lastLSN+1 {
		return fmt.Errorf("partition %s: configuration change at %d while the decider is at %d", p, idx, p.lastLSN)
	}
	p.wakeQuiet()
	if err := p.raftSafe(func() error { return p.rn.ProposeConfChange(cc) }); err != nil {
		return err
	}
	if err := p.pump(); err != nil {
		return err
	}
	if next := p.log.NextLSN(); next != idx+1 {
		return fmt.Errorf("partition %s: raft appended up to %d, not the configuration change at %d", p, next-1, idx)
	}
	if err := p.st.ApplyGap(idx); err != nil {
		return err
	}
	p.applied, p.nextLSN, p.lastLSN, p.confAt = idx, idx+1, idx, idx
	p.logger.Info("partition replica configuration change proposed", "change", cc.Type.String(), "node", cc.NodeID, "index", idx)
	return nil
}
