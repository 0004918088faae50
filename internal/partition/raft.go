package partition

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/raftlog"
	"github.com/sinewmq/sinew/internal/wal"
	"github.com/sinewmq/sinew/protocol"
)

// The partition's log is a raft log (internal/raftlog over seglog v2): one
// queue event per entry, so an offset is a raft index. See "Raft" in doc.go
// for how the actor drives its raft.RawNode.

// ErrNotLeader answers a publish or a settle sent to a replica that does not
// lead its partition's raft group, and the requests a leader was still
// waiting on when it lost the lead: their entries may yet be committed by
// the next leader, or not. Retryable.
var ErrNotLeader = &protocol.Error{Code: protocol.CodeUnavailable, Message: "this replica does not lead the partition"}

// errRaftPanicked marks a panic of etcd raft turned into an error (raftSafe).
var errRaftPanicked = errors.New("raft stopped")

// raftSafe runs f, which calls into etcd raft. raft panics when its storage
// fails (a read error from the disk, say); that must fail this partition,
// which then serves nothing until restarted, and not stop the process with
// every other partition in it.
func (p *Partition) raftSafe(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: partition %s: %v", errRaftPanicked, p, r)
		}
	}()
	return f()
}

// Raft limits and timing.
const (
	// raftMsgBytesMax bounds one append message to a follower.
	raftMsgBytesMax = 1 << 20
	// raftInflightMsgsMax bounds the append messages in flight to one
	// follower.
	raftInflightMsgsMax = 256
	// raftInflightBytesMax bounds the bytes of append messages in flight
	// to one follower. Entries a lagging follower lacks (one that comes
	// back after a cut) are read from the log on the partition's
	// goroutine: without this bound the leader would read up to
	// raftInflightMsgsMax × raftMsgBytesMax at once, long enough to miss
	// its heartbeats and be voted out.
	raftInflightBytesMax = 4 << 20
	// raftCommittedPerReadyBytes bounds the committed entries handed to
	// the actor at once.
	raftCommittedPerReadyBytes = 16 << 20
	// raftInboundMax bounds the messages from other replicas waiting for
	// the actor; beyond it they are dropped, as raft tolerates loss.
	raftInboundMax = 1024
	// raftTicksPerTurnMax bounds the ticks one turn catches up on.
	raftTicksPerTurnMax = 16
	// raftElectionTicks and raftHeartbeatTicks are raft's timing in host
	// ticks.
	raftElectionTicks  = 10
	raftHeartbeatTicks = 1
	// firstLeadHoldTicks is the preferred owner's hold-down under a
	// group's first leader: two election timeouts caught up.
	firstLeadHoldTicks = 2 * raftElectionTicks
	// committingStagesMax bounds the synced stages waiting for their
	// entries to be committed by a quorum; beyond it the actor takes no
	// new commands until one is released.
	committingStagesMax = 8
)

// raftDriver is the partition's raft node and what the actor keeps about
// it. Actor-owned, except the atomics and inbound.
type raftDriver struct {
	rn *raft.RawNode
	rs *raftlog.Storage
	// raftID is this replica's id.
	raftID uint64
	// single: a group of one, which elects itself at Open and needs no
	// ticks.
	single bool
	// leads: this replica leads and decides. Its queue state then runs
	// ahead of the commit index by its own proposals (the overlay).
	leads bool
	// hsCommit is the commit index raft last asked to store; the
	// HardState on disk may hold an older one (storeHardState).
	hsCommit uint64
	// committed is the highest index raft has committed, as far as it
	// was applied; applied is the highest index applied to the queue
	// state (past committed on a leader, by its own proposals).
	committed uint64
	applied   uint64
	// confAt is the index of the last configuration change this replica
	// proposed as leader; the next waits until it is committed.
	confAt uint64
	// committing holds the synced stages that wait for a quorum to commit
	// their entries, oldest first.
	committing []stage
	// inbound holds messages from other replicas (Step); ticks counts
	// host ticks not yet taken (Tick).
	inbound raftInbox
	ticks   atomic.Int32
	// lead and term are what Leader reports.
	lead, term atomic.Uint64
	// conf is the group's configuration, for RaftConf.
	conf atomic.Pointer[raftpb.ConfState]
	// dropped counts inbound messages dropped for lack of room.
	dropped atomic.Uint64
	// ticked counts the raft ticks this replica took: the clock of the
	// preferred owner's hold-down.
	ticked uint64
	// caught lists, on a leader, the voters that were caught up at the
	// last tick (caughtUpVoters); a leadership transfer goes only to one
	// of them.
	caught []uint64
	// wasCaught is caught as of the tick before (sampleCaughtUp).
	wasCaught []uint64
	// preferred is the placement's preferred owner as Reconfigure last
	// named it (0: none yet); preferredSince is the tick count from which
	// it has been in caught without a break, 0 while it is not.
	preferred, preferredSince uint64
	// firstLead is set on a leader that is the group's first (nothing was
	// in the log before its term: it won the group's first election, not
	// one after an owner failed) until one of its caught-up voters falls
	// behind. Its hold-down is short (firstLeadHoldTicks): a preferred
	// owner that opened its replica a moment late, while the cluster
	// formed, gets the lead at once rather than after the hold-down meant
	// for a node back from a crash.
	firstLead bool
	// qz keeps the group quiet while it is idle (quiesce.go).
	qz quiescer
	// leaving is set once this replica's node is stopping (StopLeading):
	// it takes no lead from then on.
	leaving atomic.Bool
}

// startRaft starts the partition's raft node over its recovered log. A
// group of one elects itself at once, on the calling goroutine, so Open
// returns a leader; a larger group waits for ticks and its peers.
func (p *Partition) startRaft(commit uint64) error {
	id := max(p.cfg.RaftID, 1)
	peers := p.cfg.RaftPeers
	if len(peers) == 0 {
		peers = []uint64{id}
	}
	single := p.singleReplica()
	replicated := !single
	s := raftlog.New(p.log, raftlog.Options{CacheBytesMax: p.cfg.raftCacheBytes, Budget: p.cfg.RaftBudget})
	cs, err := p.log.ConfState()
	if err != nil {
		return fmt.Errorf("partition %s: raft configuration: %w", p, err)
	}
	if len(cs.Voters) == 0 {
		if err := s.SetConfState(&raftpb.ConfState{Voters: peers}); err != nil {
			return fmt.Errorf("partition %s: raft configuration: %w", p, err)
		}
	}
	if cs, err := p.log.ConfState(); err == nil && len(cs.Voters) > 0 {
		p.noteConf(cs)
	}
	hs := p.log.HardState()
	if hs.Commit != commit {
		term := max(hs.Term, p.log.LastTerm())
		if err := s.SetHardState(&raftpb.HardState{Term: term, Vote: hs.Vote, Commit: commit}); err != nil {
			return fmt.Errorf("partition %s: raft state: %w", p, err)
		}
	}
	rn, err := raft.NewRawNode(&raft.Config{
		ID:                 id,
		ElectionTick:       raftElectionTicks,
		HeartbeatTick:      raftHeartbeatTicks,
		Storage:            s,
		Applied:            commit,
		AsyncStorageWrites: true,
		MaxSizePerMsg:      raftMsgBytesMax,
		MaxInflightMsgs:    raftInflightMsgsMax,
		MaxInflightBytes:   raftInflightBytesMax,
		// No limit here: the pipeline bounds what is uncommitted
		// (stageCommandsMax per stage, committingStagesMax stages), and a
		// proposal raft dropped would have to be undone.
		MaxUncommittedEntriesSize: 0,
		MaxCommittedSizePerReady:  raftCommittedPerReadyBytes,
		// A replica that lost the lead refuses proposals instead of
		// forwarding them: it decided them on a state it must rebuild.
		DisableProposalForwarding: true,
		PreVote:                   true,
		CheckQuorum:               replicated,
		Logger:                    raftlog.QuietLogger{},
	})
	if err != nil {
		return fmt.Errorf("partition %s: raft: %w", p, err)
	}
	p.rn, p.rs, p.raftID = rn, s, id
	// Leader reports the stored term until raft moves to another one (a
	// Ready carries a HardState only when it changes).
	p.term.Store(rn.BasicStatus().Term)
	if replicated {
		s.SetSnapshotSource(p.makeSnapshot)
	}
	p.single = single
	p.committed, p.applied = commit, commit
	p.nextLSN, p.lastLSN = commit+1, commit
	if !p.single {
		if p.cfg.CampaignAtStart && len(cs.Voters) == 0 {
			if err := p.raftSafe(rn.Campaign); err != nil {
				return fmt.Errorf("partition %s: campaign: %w", p, err)
			}
		}
		return nil
	}
	if err := p.raftSafe(rn.Campaign); err != nil {
		return fmt.Errorf("partition %s: campaign: %w", p, err)
	}
	if err := p.settleInline(); err != nil {
		return err
	}
	if !p.leads {
		return fmt.Errorf("partition %s: a group of one did not elect itself", p)
	}
	return nil
}

// settleInline runs raft on the calling goroutine until it has nothing left
// to do, syncing inline, and releases every stage: Open uses it for a group
// of one's election, Close for the last records.
func (p *Partition) settleInline() error {
	for range 64 {
		if err := p.propose(); err != nil {
			return err
		}
		if err := p.pump(); err != nil {
			return err
		}
		if p.open.entries == 0 && p.open.hs == nil && len(p.open.resps) == 0 && !p.rn.HasReady() {
			p.releaseOpenInline()
			return nil
		}
		if p.open.entries > 0 || p.open.hs != nil {
			lsn, err := p.persist(&p.open)
			if err != nil {
				return err
			}
			if p.cfg.WAL != nil {
				p.walDurable = max(p.walDurable, lsn)
			}
		}
		st := p.takeOpen()
		resps := st.resps
		st.resps = nil
		p.committing = append(p.committing, st)
		if err := p.stepResponses(resps); err != nil {
			return err
		}
	}
	return fmt.Errorf("partition %s: raft did not settle", p)
}

// releaseOpenInline releases the committing stages and then the open one,
// which has no entries, once raft has nothing more to do.
func (p *Partition) releaseOpenInline() {
	p.releaseCommitted()
	if len(p.committing) == 0 {
		p.releaseStage(&p.open)
	}
}

// takeOpen closes the open stage at the log's current end and returns it;
// a fresh open stage reuses a spare one.
func (p *Partition) takeOpen() stage {
	st := p.open
	st.last = p.log.NextLSN() - 1
	p.open = p.spare
	p.spare = stage{}
	return st
}

// propose hands the records the decider decided to raft in one proposal
// and takes the Ready that holds them, which appends them to the log. Each
// must get the index the decider gave it: the leader proposes nothing else.
// A proposal raft refuses (this replica lost the lead meanwhile) leaves the
// state ahead of any log: it is rebuilt (stepDown).
func (p *Partition) propose() error {
	if len(p.out) == 0 {
		return nil
	}
	first := p.out[0].lsn
	ents := make([]raftpb.Entry, len(p.out)) // raft keeps this array
	for i := range p.out {
		r := &p.out[i]
		// raft keeps the data it is given, without copying it (in its
		// log, in the log's entry cache and in messages to followers),
		// and the arena is reused after the turn: a record decided into
		// the arena is copied; a publish's own buffer, which nothing
		// changes, is not.
		d := p.framedOf(r)
		if r.framed == nil && r.payload == nil {
			d = bytes.Clone(d)
		}
		ents[i].Data = d
		if r.payload != nil {
			p.cache.put(r.lsn, r.payload)
		}
	}
	n := len(p.out)
	// The decider applied these already: the entries raft hands back
	// for them are not applied again.
	p.applied = p.lastLSN
	p.taken()
	p.open.records += n
	p.sinceCkpt += n
	p.wakeQuiet()
	err := p.raftSafe(func() error {
		return p.rn.Step(raftpb.Message{Type: raftpb.MsgProp, From: p.raftID, Entries: ents})
	})
	if err != nil {
		if errors.Is(err, raft.ErrProposalDropped) {
			return p.proposalDropped(fmt.Errorf("%w: raft dropped the proposal of lsn %d..%d", ErrNotLeader, first, first+uint64(n)-1))
		}
		return fmt.Errorf("propose lsn %d: %w", first, err)
	}
	if err := p.pump(); err != nil {
		return err
	}
	if next := p.log.NextLSN(); next != first+uint64(n) {
		return fmt.Errorf("partition %s: raft appended up to %d, not lsn %d..%d at once", p, next-1, first, first+uint64(n)-1)
	}
	return nil
}

// pump handles every Ready raft has: messages to peers are sent, entries
// are appended to the log (their acknowledgements wait for the open stage's
// sync), committed entries are applied and the stages they complete are
// released.
func (p *Partition) pump() error {
	for range 1024 {
		if !p.rn.HasReady() {
			return nil
		}
		var rd raft.Ready
		if err := p.raftSafe(func() error { rd = p.rn.Ready(); return nil }); err != nil {
			return err
		}
		if rd.SoftState != nil {
			p.lead.Store(rd.SoftState.Lead)
			leads := rd.SoftState.RaftState == raft.StateLeader
			if leads && !p.leads {
				if err := p.becomeLeader(); err != nil {
					return err
				}
			} else if !leads && p.leads {
				if err := p.stepDown(ErrNotLeader); err != nil {
					return err
				}
			}
		}
		if !raft.IsEmptyHardState(rd.HardState) && rd.Term != 0 {
			p.term.Store(rd.Term)
		}
		var out []*raftpb.Message
		for i := range rd.Messages {
			m := &rd.Messages[i]
			switch m.To {
			case raft.LocalAppendThread:
				if err := p.storageAppend(m); err != nil {
					return err
				}
			case raft.LocalApplyThread:
				if err := p.storageApply(m); err != nil {
					return err
				}
			default:
				if m.Type == raftpb.MsgPreVote && (p.leaving.Load() || p.cfg.Fenced != nil && p.cfg.Fenced()) {
					// A stopping node (StopLeading) and a fenced one
					// (Config.Fenced) start no election.
					continue
				}
				out = append(out, m)
			}
		}
		p.sendRaft(out)
	}
	return fmt.Errorf("partition %s: raft kept producing work", p)
}

// send hands messages to other replicas. A group of one has none.
func (p *Partition) sendRaft(ms []*raftpb.Message) {
	if len(ms) == 0 || p.cfg.Send == nil {
		return
	}
	p.cfg.Send(ms)
	for _, m := range ms {
		if m.Type == raftpb.MsgSnap {
			// Not reported finished here: raft keeps the follower
			// waiting for it (no appends, which would overtake it on
			// the transport's separate snapshot lane and make it ask
			// for another) until the follower's answer after applying
			// it, or a report that it was lost (snapshot.go).
			if p.snapsSent == nil {
				p.snapsSent = map[uint64]int64{}
			}
			p.snapsSent[m.To] = p.nowMs()
		}
	}
}

// storageAppend writes what a MsgStorageAppend carries: entries (buffered;
// durable with the open stage's sync), a snapshot, and the HardState (a new
// term or vote is durable on return, a commit index need not be). Its
// responses are delivered when the open stage is synced, in order.
func (p *Partition) storageAppend(m *raftpb.Message) error {
	if snap := m.Snapshot; snap != nil && !raft.IsEmptySnap(*snap) {
		// With asynchronous storage writes the append side both stores
		// and applies a snapshot.
		if err := p.installSnapshot(snap); err != nil {
			return err
		}
		if err := p.applySnapshot(snap); err != nil {
			return err
		}
	}
	if ents := m.Entries; len(ents) > 0 {
		if err := p.rs.Append(ents); err != nil {
			return fmt.Errorf("raft append: %w", err)
		}
		p.open.entries += len(ents)
		if p.cfg.WAL != nil {
			for _, e := range ents {
				p.open.wal = append(p.open.wal, walEntry(&e))
			}
		}
		if p.leads {
			// The leader's state covers its whole log: its own
			// proposals are applied already, anything else (a new
			// term's empty entry) is applied now.
			for _, e := range ents {
				if e.Index > p.applied {
					if err := p.applyEntry(&e); err != nil {
						return err
					}
				}
			}
			p.nextLSN, p.lastLSN = p.applied+1, p.applied
		} else {
			// A follower proposes nothing, so propose never counts its
			// records: it counts those it appends, or it would never
			// checkpoint, never store its commit index and never drop
			// a segment.
			p.sinceCkpt += len(ents)
			p.lastBusyMs = p.nowMs()
		}
	}
	// raft sets these only when the HardState changed.
	if !raft.IsEmptyHardState(raftpb.HardState{Term: m.Term, Vote: m.Vote, Commit: m.Commit}) {
		if err := p.storeHardState(m.Term, m.Vote, m.Commit); err != nil {
			return err
		}
	}
	for i := range m.Responses {
		p.open.resps = append(p.open.resps, &m.Responses[i])
	}
	return nil
}

// walEntry maps a raft entry to a WAL entry the way raftlog maps it to a
// log record, so recovery can append it to the log as it is. Its data is
// not copied: raft does not change an entry once it is handed out.
func walEntry(e *raftpb.Entry) wal.Entry {
	we := wal.Entry{Index: e.Index, Term: e.Term}
	switch e.Type {
	case raftpb.EntryConfChange:
		we.Type, we.Payload = raftlog.TypeConfChange, e.Data
	case raftpb.EntryConfChangeV2:
		we.Type, we.Payload = raftlog.TypeConfChangeV2, e.Data
	default:
		if len(e.Data) == 0 {
			we.Type = raftlog.TypeNoop
		} else {
			we.Type, we.Payload = e.Data[0], e.Data[1:]
		}
	}
	return we
}

// storeHardState stores raft's HardState. A new term or vote is written
// and synced at once (raft's rule). A commit index alone is only noted, and
// written with the next term or vote, at each checkpoint and at Close: a
// commit index that rolls back in a crash costs nothing but replay, since
// raft learns it again from the leader (a group of one recovers to the end
// of its log), and writing it after every stage cost the pipeline a file
// write per sync. The commit index written is never past what this replica
// applied (see flushHardState): a follower's first append of a new term
// brings the term, entries and a commit index naming them together, and
// the entries are synced only with their stage.
func (p *Partition) storeHardState(term, vote, commit uint64) error {
	cur := p.log.HardState()
	if term == cur.Term && vote == cur.Vote {
		p.hsCommit = commit
		return nil
	}
	p.hsCommit = commit
	hs := &raftpb.HardState{Term: term, Vote: vote, Commit: p.storableCommit(commit)}
	if p.cfg.WAL != nil {
		// Durable with the open stage's journal commit, before its
		// responses (a vote among them) are delivered.
		p.open.hs = &wal.HardState{Term: hs.Term, Vote: hs.Vote, Commit: hs.Commit}
		if err := p.log.SetHardStateJournaled(hs); err != nil {
			return fmt.Errorf("raft hard state: %w", err)
		}
		return nil
	}
	if err := p.rs.SetHardState(hs); err != nil {
		return fmt.Errorf("raft hard state: %w", err)
	}
	return nil
}

// storableCommit bounds a commit index to store by what this replica
// applied and by what its log holds durably (under SyncInterval applied
// entries may be only in the OS): a stored index past the durable log would
// make Open refuse the log after a power loss.
func (p *Partition) storableCommit(commit uint64) uint64 {
	return min(commit, p.committed, p.durableLSN())
}

// flushHardState writes the commit index noted by storeHardState, when it
// moved since the HardState was last written, but never past what this
// replica applied. A follower's noted commit index can name entries that
// came in the same append and are not synced yet; a HardState that outlived
// them in a power loss would claim more than the log holds, and Open refuses
// such a log. raft hands over for applying only entries that are durable.
func (p *Partition) flushHardState() error {
	cur := p.log.HardState()
	commit := p.storableCommit(p.hsCommit)
	if p.rs == nil || commit <= cur.Commit {
		return nil
	}
	hs := &raftpb.HardState{Term: cur.Term, Vote: cur.Vote, Commit: commit}
	if err := p.rs.SetHardState(hs); err != nil {
		return fmt.Errorf("raft hard state: %w", err)
	}
	return nil
}

// storageApply applies committed entries: those the leader decided are in
// its state already; any other is applied now. Stages whose entries are
// all committed are released.
func (p *Partition) storageApply(m *raftpb.Message) error {
	for i := range m.Entries {
		e := &m.Entries[i]
		idx := e.Index
		if idx > p.applied {
			if err := p.applyEntry(e); err != nil {
				return err
			}
		}
		if e.Type == raftpb.EntryConfChange || e.Type == raftpb.EntryConfChangeV2 {
			if err := p.applyConfChange(e); err != nil {
				return err
			}
		}
		p.committed = max(p.committed, idx)
	}
	if n := len(m.Entries); n > 0 {
		p.rs.SetApplied(p.committed)
		if p.leads {
			p.nextLSN, p.lastLSN = p.applied+1, p.applied
		}
	}
	p.releaseCommitted()
	resps := make([]*raftpb.Message, len(m.Responses))
	for i := range m.Responses {
		resps[i] = &m.Responses[i]
	}
	return p.stepResponses(resps)
}

// applyConfChange hands a committed configuration change to raft and
// stores the configuration it yields.
func (p *Partition) applyConfChange(e *raftpb.Entry) error {
	var cc raftpb.ConfChangeI
	if e.Type == raftpb.EntryConfChange {
		var c raftpb.ConfChange
		if err := c.Unmarshal(e.Data); err != nil {
			return fmt.Errorf("%w: partition %s: conf change at %d: %w", ErrDamaged, p, e.Index, err)
		}
		cc = &c
	} else {
		var c raftpb.ConfChangeV2
		if err := c.Unmarshal(e.Data); err != nil {
			return fmt.Errorf("%w: partition %s: conf change at %d: %w", ErrDamaged, p, e.Index, err)
		}
		cc = &c
	}
	// raft panics on a configuration change it cannot apply; one that
	// reached the log that way is damage, for this partition alone.
	var cs *raftpb.ConfState
	if err := p.raftSafe(func() error { cs = p.rn.ApplyConfChange(cc); return nil }); err != nil {
		return fmt.Errorf("%w: conf change at %d: %w", ErrDamaged, e.Index, err)
	}
	p.noteConf(cs)
	return p.rs.SetConfState(cs)
}

// noteConf records the group's configuration for RaftConf.
func (p *Partition) noteConf(cs *raftpb.ConfState) {
	c := raftpb.ConfState{Voters: slices.Clone(cs.Voters), Learners: slices.Clone(cs.Learners)}
	p.conf.Store(&c)
}

// RaftConf returns the group's voters and learners (raft ids) as this
// replica last applied them; empty before it knows any.
func (p *Partition) RaftConf() (voters, learners []uint64) {
	if c := p.conf.Load(); c != nil {
		return c.Voters, c.Learners
	}
	return nil, nil
}

// applyEntry applies one raft entry at the state's next index: a queue
// event, or, for anything else (an empty entry, a configuration change), a
// settled gap. What the partition keeps beside the state (ACK memory,
// dedup window) follows.
func (p *Partition) applyEntry(e *raftpb.Entry) error {
	idx := e.Index
	if idx != p.applied+1 {
		return fmt.Errorf("partition %s: entry %d applied after %d", p, idx, p.applied)
	}
	p.applied = idx
	data := e.Data
	if e.Type != raftpb.EntryNormal || len(data) == 0 || !queue.IsEventType(data[0]) {
		return p.st.ApplyGap(idx)
	}
	ev, err := queue.DecodeEvent(data[0], data[1:])
	if err != nil {
		return fmt.Errorf("%w: partition %s: entry %d: %w", ErrDamaged, p, idx, err)
	}
	if err := p.st.Apply(idx, ev); err != nil {
		return fmt.Errorf("partition %s: entry %d: %w", p, idx, err)
	}
	p.replayed(idx, &ev)
	return nil
}

// replayed updates what the actor keeps beside the queue state for an
// event it did not decide itself (recovery, or another leader's entry): the
// ACK memory and the dedup window.
func (p *Partition) replayed(lsn uint64, ev *queue.Event) {
	switch ev.Kind {
	case queue.KindAck:
		p.acked.put(ev.Offset, ev.LeaseID)
	case queue.KindEnqueue:
		// Only a committed record is replayed, so only a committed store
		// is remembered as seen.
		p.dd.Record(ev.Msg.ProducerID, ev.Msg.ProducerSeq, lsn, ev.Msg.PublishedAtMs)
	}
}

// stepResponses delivers the responses of storage messages whose writes
// are done: those for this replica are stepped, the others sent.
func (p *Partition) stepResponses(ms []*raftpb.Message) error {
	var out []*raftpb.Message
	for _, m := range ms {
		if m.To != p.raftID {
			out = append(out, m)
			continue
		}
		if err := p.raftSafe(func() error { return p.rn.Step(*m) }); err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) {
			return fmt.Errorf("raft step: %w", err)
		}
	}
	p.sendRaft(out)
	return p.pump()
}

// releaseCommitted releases, in order, the synced stages whose entries are
// all committed.
func (p *Partition) releaseCommitted() {
	n := 0
	for n < len(p.committing) && p.committing[n].last <= p.committed {
		p.releaseStage(&p.committing[n])
		n++
	}
	if n > 0 {
		p.committing = slices.Delete(p.committing, 0, n)
	}
}

// Tick advances the partition's raft clock by one tick, on its next turn.
func (p *Partition) Tick() {
	if p.rn == nil || p.single {
		return
	}
	if p.ticks.Add(1) == 1 {
		p.Poke()
	}
}

// Leader returns the raft id of the replica this one believes leads the
// group (0: none known) and the current term.
func (p *Partition) Leader() (id, term uint64) { return p.lead.Load(), p.term.Load() }

// raftTurn takes the messages other replicas sent and the ticks the host
// gave since the last turn.
func (p *Partition) raftTurn() error {
	if p.single {
		return nil
	}
	if p.qz.wakeReq.Swap(false) {
		p.wakeQuiet()
	}
	// Messages that arrive while these are stepped join this turn too, up
	// to raftInboundMax in all, as a channel read until empty would.
	for stepped := 0; stepped < raftInboundMax; {
		msgs := p.inbound.take()
		if len(msgs) == 0 {
			break
		}
		stepped += len(msgs)
		if err := p.stepInbound(msgs); err != nil {
			return err
		}
	}
	if n := p.ticks.Swap(0); n > 0 {
		// Sampled before the ticks: the tick that runs raft's
		// CheckQuorum clears every follower's RecentActive until it
		// answers the heartbeat sent with it.
		p.sampleCaughtUp()
		if p.quiesceTurn() {
			return p.pump()
		}
		for range min(n, raftTicksPerTurnMax) {
			if err := p.raftSafe(func() error { p.rn.Tick(); return nil }); err != nil {
				return err
			}
			p.ticked++
		}
	}
	return p.pump()
}

// Step hands the partition one raft message from another replica. It never
// blocks: when the bounded inbound queue is full the message is dropped
// (raft tolerates loss) and counted.
func (p *Partition) Step(m *raftpb.Message) error {
	if p.rn == nil {
		return ErrUnavailable
	}
	if !p.inbound.put(m) {
		p.dropped.Add(1)
		return ErrInboxFull
	}
	p.Poke()
	return nil
}

// stepInbound steps the messages other replicas sent, in order, and gives
// the slice back to the inbox.
func (p *Partition) stepInbound(msgs []*raftpb.Message) error {
	defer p.inbound.done(msgs)
	for _, m := range msgs {
		if m.Type == raftpb.MsgSnapStatus {
			// The transport dropped a snapshot this replica sent
			// (raftnet: a full queue, a failed write).
			p.snapshotLost(m.From, "the transport dropped it")
			continue
		}
		if m.Type == raftpb.MsgTimeoutNow && p.leaving.Load() {
			// A leadership transfer to a replica whose node is
			// stopping: refused (raft's leader abandons it after an
			// election timeout).
			p.logger.Info("partition replica refuses the lead: its node is stopping", "from", m.From, "term", m.Term)
			continue
		}
		p.quiesceObserve(m)
		err := p.raftSafe(func() error { return p.rn.Step(*m) })
		if errors.Is(err, errRaftPanicked) {
			return err
		}
		if err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) &&
			!errors.Is(err, raft.ErrStepLocalMsg) && !errors.Is(err, raft.ErrProposalDropped) {
			p.logger.Debug("raft message refused", "err", err)
		}
	}
	return nil
}

// raftInbox holds the raft messages other replicas sent a partition until
// its next turn, at most raftInboundMax. It grows with what waits and
// gives its room back once drained, so that thousands of idle partitions
// keep no buffer each (a channel of raftInboundMax pointers was 8 KiB a
// partition for good).
type raftInbox struct {
	mu sync.Mutex
	q  []*raftpb.Message
	// spare is the slice the last turn processed, cleared, to take the
	// next messages without an allocation (at most raftInboxKeepCap).
	spare []*raftpb.Message
}

// raftInboxKeepCap is the largest slice a raftInbox keeps for reuse.
const raftInboxKeepCap = 64

// put queues m; false when raftInboundMax messages already wait.
func (b *raftInbox) put(m *raftpb.Message) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.q) >= raftInboundMax {
		return false
	}
	if b.q == nil && b.spare != nil {
		b.q, b.spare = b.spare, nil
	}
	b.q = append(b.q, m)
	return true
}

// take returns the messages waiting, oldest first, and empties the inbox;
// give the slice back with done once they are processed.
func (b *raftInbox) take() []*raftpb.Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.q
	b.q = nil
	return q
}

// done takes back a slice take returned, for reuse when it is small.
func (b *raftInbox) done(q []*raftpb.Message) {
	clear(q)
	if cap(q) > raftInboxKeepCap {
		return
	}
	b.mu.Lock()
	if b.spare == nil {
		b.spare = q[:0]
	}
	b.mu.Unlock()
}
