package multiraft

import (
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// IdleTicksDefault is Quiescence.IdleTicks when left zero.
const IdleTicksDefault = 10

// Quiescence decides when a replica of a group of more than one, driven by
// a raft.RawNode, may skip its ticks: a Group's Quiet method asks it once
// per host tick. A quiet group sends no heartbeats and runs no election
// timer, so an idle group costs the host one check per tick.
//
// The rules (after CockroachDB's quiescence, with the host's per-node
// liveness in place of its node liveness):
//
//   - A leader is idle when its whole log is committed and applied, no
//     leadership transfer is running, and every follower has matched the
//     last index, has been heard from recently (RecentActive) and sits on
//     a live node (Host.Live).
//   - A follower is idle when it knows a leader on a live node and has
//     applied everything it knows committed.
//   - A replica goes quiet after IdleTicks idle checks in a row, so an
//     idle leader keeps heartbeating (each heartbeat carries the commit
//     index) for IdleTicks ticks before it falls silent.
//   - Anything but a heartbeat (or its response) wakes it: a proposal
//     (Wake), an append, a vote request. So does a heartbeat from a
//     replica other than the leader it knows. A follower whose leader's
//     node stops being live is no longer idle and ticks, so its election
//     timer runs and the group elects a new leader; a restarted leader's
//     replica campaigns, and its vote requests wake the others.
//
// Quiescence only changes when ticks happen, never what raft decides, so
// safety does not depend on it; liveness depends on Host.Live noticing a
// dead node. Zero value ready to use; one per replica, used from the host
// loop only.
type Quiescence struct {
	// IdleTicks is how many idle checks in a row make the replica quiet;
	// 0 means IdleTicksDefault.
	IdleTicks int
	idle      int
	// quiet is set once the replica went quiet; until something wakes it,
	// Quiet only checks that the nodes in watch (the leader, or the
	// followers) are still live, and asks raft nothing.
	quiet bool
	watch []uint64
}

// Wake makes the replica tick again until it is idle for IdleTicks checks:
// call it on every proposal.
func (q *Quiescence) Wake() { q.idle, q.quiet = 0, false }

// Observe looks at an inbound message before it is stepped; lead is the
// leader the replica knows (BasicStatus().Lead).
func (q *Quiescence) Observe(m *raftpb.Message, lead uint64) {
	switch m.Type {
	case raftpb.MsgHeartbeatResp:
		return // the leader's own heartbeats coming back
	case raftpb.MsgHeartbeat:
		if m.From == lead {
			return
		}
	}
	q.Wake()
}

// Quiet reports whether the replica may skip this tick. lastIndex is the
// last index in the replica's log (its Storage's LastIndex); live reports
// whether a node is up (Host.Live).
func (q *Quiescence) Quiet(rn *raft.RawNode, lastIndex uint64, live func(node uint64) bool) bool {
	if q.quiet {
		for _, n := range q.watch {
			if !live(n) {
				q.Wake()
				return false
			}
		}
		return true
	}
	if !q.idleNow(rn, lastIndex, live) {
		q.idle = 0
		return false
	}
	n := q.IdleTicks
	if n <= 0 {
		n = IdleTicksDefault
	}
	if q.idle < n {
		q.idle++
		return false
	}
	q.quiet = true
	return true
}

// idleNow applies the idle rules and leaves in q.watch the nodes whose
// liveness keeps the replica idle.
func (q *Quiescence) idleNow(rn *raft.RawNode, lastIndex uint64, live func(uint64) bool) bool {
	q.watch = q.watch[:0]
	st := rn.BasicStatus()
	commit := st.HardState.Commit
	if st.Applied < commit {
		return false
	}
	switch st.RaftState {
	case raft.StateFollower:
		q.watch = append(q.watch, st.Lead)
		return st.Lead != raft.None && live(st.Lead)
	case raft.StateLeader:
		if st.LeadTransferee != raft.None || commit != lastIndex {
			return false
		}
		ok := true
		rn.WithProgress(func(id uint64, _ raft.ProgressType, pr tracker.Progress) {
			if id == st.ID {
				return
			}
			q.watch = append(q.watch, id)
			if pr.Match != lastIndex || !pr.RecentActive || !live(id) {
				ok = false
			}
		})
		return ok
	}
	return false // candidates and pre-candidates need their timers
}
