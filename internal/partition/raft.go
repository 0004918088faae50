package partition

import (
	"fmt"
	"io"
	"log"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/raftlog"
)

// The partition's log is a raft log (internal/raftlog over seglog v2): one
// queue event per entry, offset = raft index. A single node runs each
// partition as a raft group of one, which campaigns at Open and needs no
// ticks.
//
// The leader decides on a state that includes what it has proposed and not
// yet seen committed (the decider applies as it decides), so it never
// leases or settles the same message twice. Proposals wait in the decider's
// out list until no sync is under way; then they go to raft together, and
// the Ready that carries them is appended and handed to the syncer. When
// the sync returns the driver advances raft, which commits them (a group
// of one commits what its own log holds), and the stage that decided them
// is released: replies, confirms and deliveries leave at commit.

// raftLogger keeps etcd raft's own log lines out of the broker's log.
var raftLogger = &raft.DefaultLogger{Logger: log.New(io.Discard, "", 0)}

// Raft limits.
const (
	raftMsgBytesMax            = 1 << 20
	raftInflightMsgsMax        = 256
	raftUncommittedBytesMax    = 64 << 20
	raftCommittedPerReadyBytes = 16 << 20
)

// startRaft starts the partition's raft node over its recovered log and
// elects it: a group of one campaigns at once. Everything the recovered
// log holds is applied to the state already (recover); in a group of one it
// is all committed, since no other replica can have a different suffix, so
// the commit index is raised to the end of the log before raft starts.
func (p *Partition) startRaft() error {
	id := max(p.cfg.RaftID, 1)
	peers := p.cfg.RaftPeers
	if len(peers) == 0 {
		peers = []uint64{id}
	}
	if len(peers) > 1 {
		return fmt.Errorf("partition %s: raft groups of %d replicas are not supported yet", p, len(peers))
	}
	s := raftlog.New(p.log, raftlog.Options{})
	last := p.log.NextLSN() - 1
	if hs := p.log.HardState(); hs.GetCommit() > last {
		// Committed entries are gone: only CorruptionTruncate cuts
		// records, at the operator's request; anything else is damage.
		if p.log.Report().Corruption == nil {
			return fmt.Errorf("%w: partition %s: raft commit index %d is past the end of the log (%d)", ErrDamaged, p, hs.GetCommit(), last)
		}
		p.logger.Warn("log truncated below the raft commit index", "commit", hs.GetCommit(), "last", last)
		if err := s.SetHardState(&raftpb.HardState{Term: new(hs.GetTerm()), Vote: new(hs.GetVote()), Commit: new(last)}); err != nil {
			return fmt.Errorf("partition %s: raft state: %w", p, err)
		}
	}
	hs, cs, err := s.InitialState()
	if err != nil {
		return fmt.Errorf("partition %s: raft state: %w", p, err)
	}
	if len(cs.GetVoters()) == 0 {
		if err := s.SetConfState(&raftpb.ConfState{Voters: peers}); err != nil {
			return fmt.Errorf("partition %s: raft configuration: %w", p, err)
		}
	}
	if hs.GetCommit() < last {
		term := max(hs.GetTerm(), p.log.LastTerm())
		if err := s.SetHardState(&raftpb.HardState{Term: new(term), Vote: new(hs.GetVote()), Commit: new(last)}); err != nil {
			return fmt.Errorf("partition %s: raft state: %w", p, err)
		}
	}
	rn, err := raft.NewRawNode(&raft.Config{
		ID:                        id,
		ElectionTick:              10,
		HeartbeatTick:             1,
		Storage:                   s,
		Applied:                   last,
		MaxSizePerMsg:             raftMsgBytesMax,
		MaxInflightMsgs:           raftInflightMsgsMax,
		MaxUncommittedEntriesSize: raftUncommittedBytesMax,
		MaxCommittedSizePerReady:  raftCommittedPerReadyBytes,
		PreVote:                   true,
		CheckQuorum:               len(peers) > 1,
		Logger:                    raftLogger,
	})
	if err != nil {
		return fmt.Errorf("partition %s: raft: %w", p, err)
	}
	p.rn, p.rs = rn, s
	p.nextLSN, p.lastLSN = last+1, last
	if err := rn.Campaign(); err != nil {
		return fmt.Errorf("partition %s: campaign: %w", p, err)
	}
	return p.drainInline()
}

// proposeOut hands the decided records to raft, in order. raft numbers
// each at its last index plus one, which is the LSN the decider gave it:
// nothing else is proposed on this node.
func (p *Partition) proposeOut() error {
	for i := range p.out {
		r := &p.out[i]
		payload := p.payloadOf(r)
		data := make([]byte, 1+len(payload))
		data[0] = r.typ
		copy(data[1:], payload)
		if err := p.rn.Propose(data); err != nil {
			p.taken()
			p.flushed = 0
			return fmt.Errorf("propose lsn %d: %w", r.lsn, err)
		}
	}
	p.taken()
	p.flushed = 0
	return nil
}

// takeReady takes raft's Ready, appends its entries and stores its
// HardState (a new term or vote is durable on return; entries after the
// next sync), applies its committed entries and returns it. The caller
// syncs if it holds entries, then calls rn.Advance.
func (p *Partition) takeReady() (raft.Ready, error) {
	rd := p.rn.Ready()
	if err := p.rs.Append(rd.Entries); err != nil {
		return rd, fmt.Errorf("raft append: %w", err)
	}
	if rd.HardState != nil && !raft.IsEmptyHardState(rd.HardState) {
		if err := p.rs.SetHardState(rd.HardState); err != nil {
			return rd, fmt.Errorf("raft hard state: %w", err)
		}
	}
	if n := len(rd.Entries); n > 0 {
		last := rd.Entries[n-1].GetIndex()
		if want := p.nextLSN - 1; last != want && rd.Entries[0].GetIndex() <= want {
			// A proposal was numbered other than decided: the state
			// would disagree with the log.
			return rd, fmt.Errorf("raft appended up to index %d, the decider decided up to %d", last, want)
		}
	}
	p.applyCommitted(rd.CommittedEntries)
	return rd, nil
}

// applyCommitted takes note of committed entries. Those this node decided
// are in the state already (the decider applied them); any other entry (a
// leader's no-op, an entry of a former leader) is applied now: a queue event
// with Apply, anything else as a settled gap. Stages whose records are all
// committed are released.
func (p *Partition) applyCommitted(ents []*raftpb.Entry) {
	for _, e := range ents {
		idx := e.GetIndex()
		p.committed = idx
		if idx < p.nextLSN {
			continue
		}
		data := e.GetData()
		if e.GetType() == raftpb.EntryNormal && len(data) > 0 && queue.IsEventType(data[0]) {
			ev, err := queue.DecodeEvent(data[0], data[1:])
			if err == nil {
				err = p.st.Apply(idx, ev)
			}
			if err != nil {
				panic(fmt.Sprintf("partition %s: committed entry %d: %v", p, idx, err))
			}
			p.replayed(idx, &ev)
		} else if err := p.st.ApplyGap(idx); err != nil {
			panic(fmt.Sprintf("partition %s: committed gap %d: %v", p, idx, err))
		}
		p.nextLSN, p.lastLSN = idx+1, idx
	}
	if len(ents) > 0 {
		p.rs.SetApplied(p.committed)
	}
	if p.syncWaits && p.committed >= p.syncing.last {
		p.syncWaits = false
		p.releaseStage(&p.syncing)
	}
}

// replayed updates what the actor keeps beside the queue state for an
// event it did not decide itself (recovery, or an entry of another
// leader): the ACK memory and the dedup window.
func (p *Partition) replayed(lsn uint64, ev *queue.Event) {
	switch ev.Kind {
	case queue.KindAck:
		p.acked.put(ev.Offset, ev.LeaseID)
	case queue.KindEnqueue:
		// Only a durable record is replayed, so only a durable store is
		// remembered as seen.
		p.dd.Record(ev.Msg.ProducerID, ev.Msg.ProducerSeq, lsn, ev.Msg.PublishedAtMs)
	}
}

// drainInline proposes what the decider decided and runs raft's Ready loop
// on the calling goroutine, syncing inline, until raft has nothing more to
// do. Open uses it for the election, Close for its last records.
func (p *Partition) drainInline() error {
	if err := p.proposeOut(); err != nil {
		return err
	}
	for p.rn.HasReady() {
		rd, err := p.takeReady()
		if err != nil {
			return err
		}
		if len(rd.Entries) > 0 {
			if _, err := p.log.Sync(); err != nil {
				return fmt.Errorf("sync: %w", err)
			}
		}
		p.rn.Advance(rd)
	}
	return nil
}

// pumpReady handles the Readies that follow an Advance: committed entries
// and commit-index changes. A Ready with entries (an election's no-op) is
// synced inline.
func (p *Partition) pumpReady() error {
	for p.rn.HasReady() {
		rd, err := p.takeReady()
		if err != nil {
			return err
		}
		if len(rd.Entries) > 0 {
			if _, err := p.persist(); err != nil {
				return err
			}
		}
		p.rn.Advance(rd)
	}
	return nil
}
