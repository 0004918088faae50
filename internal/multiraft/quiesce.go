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
//     leadership transfer is running, and every follower on a live node
//     (Host.Live) has matched the last index and has been heard from
//     recently (RecentActive), and those followers and the leader make a
//     majority of the voters. A follower on a node that is not live is
//     left behind: when its node comes back the host reports the change
//     (LivenessWatcher) and the group wakes to catch it up.
//   - A follower is idle when it knows a leader on a live node and has
//     applied everything it knows committed.
//   - A replica goes quiet after IdleTicks idle checks in a row, so an
//     idle leader keeps heartbeating (each heartbeat carries the commit
//     index) for IdleTicks ticks before it falls silent.
//   - Anything but a heartbeat (or its response) wakes it: a proposal
//     (Wake), an append, a vote request. So does a heartbeat from a
//     replica other than the leader it knows. So does a change in the
//     liveness of a node it watched when it went quiet (the leader, for a
//     follower; the followers, for a leader). A follower whose leader's
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
	watch []watched
}

// watched is a node whose liveness kept the replica idle, and that
// liveness.
type watched struct {
	node uint64
	live bool
}

// Quiesced reports whether the replica went quiet and nothing woke it
// since.
func (q *Quiescence) Quiesced() bool { return q.quiet }

// Watched returns the nodes whose liveness the quiet replica depends on.
func (q *Quiescence) Watched() []uint64 {
	out := make([]uint64, len(q.watch))
	for i, w := range q.watch {
		out[i] = w.node
	}
	return out
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
		for _, w := range q.watch {
			if live(w.node) != w.live {
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
		if st.Lead == raft.None || !live(st.Lead) {
			return false
		}
		q.watch = append(q.watch, watched{st.Lead, true})
		return true
	case raft.StateLeader:
		if st.LeadTransferee != raft.None || commit != lastIndex {
			return false
		}
		ok := true
		voters, good := 0, 0
		rn.WithProgress(func(id uint64, typ raft.ProgressType, pr tracker.Progress) {
			voter := typ == raft.ProgressTypePeer
			if voter {
				voters++
			}
			if id == st.ID {
				if voter {
					good++
				}
				return
			}
			l := live(id)
			q.watch = append(q.watch, watched{id, l})
			if !l {
				return // caught up when its node comes back
			}
			if pr.Match != lastIndex || !pr.RecentActive {
				ok = false
			} else if voter {
				good++
			}
		})
		return ok && 2*good > voters
	}
	return false // candidates and pre-candidates need their timers
}
