package partition

import (
	"slices"
	"sync/atomic"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/multiraft"
)

// quiescer keeps a replicated partition's raft group quiet while it is
// idle (see "Quiet groups" in doc.go). The policy is multiraft.Quiescence,
// run on the actor at each host tick; the host loop reads only quiet, and
// asks for a wake-up through wakeReq.
type quiescer struct {
	// policy is actor-owned.
	policy multiraft.Quiescence
	// quiet is what Quiet reports: the actor set it when the policy found
	// the group idle, and anything that wakes the group clears it.
	quiet atomic.Bool
	// wakeReq asks the actor to wake the policy at its next turn (a node
	// of the group changed liveness: LivenessChanged).
	wakeReq atomic.Bool
	// live is the host's Live (UseLive); nil until the partition is
	// hosted, and a partition without it never goes quiet.
	live atomic.Pointer[func(node uint64) bool]
	// preferred is the preferred owner Reconfigure last named (the
	// actor's preferred, for QuietPlaced).
	preferred atomic.Uint64
	// wake is the host's (UseWake): called when quiet turns false, so
	// that the host ticks the group again.
	wake atomic.Pointer[func()]
}

// UseWake implements multiraft.Waker: the host hands over the function
// that puts the group back among those it ticks.
func (p *Partition) UseWake(wake func()) { p.qz.wake.Store(&wake) }

// unquiet clears quiet and, if it was set, tells the host.
func (p *Partition) unquiet() {
	if p.qz.quiet.Swap(false) {
		if w := p.qz.wake.Load(); w != nil {
			(*w)()
		}
		if p.cfg.OnStir != nil {
			p.cfg.OnStir()
		}
	}
}

// UseLive implements multiraft.LiveUser: the host hands over its Live.
func (p *Partition) UseLive(live func(node uint64) bool) { p.qz.live.Store(&live) }

// Quiet implements multiraft.Quieter: the partition needs no ticks. A group
// of one elects itself and never needs them; a larger group is quiet while
// its replica found it idle and nothing woke it since.
func (p *Partition) Quiet() bool { return p.single || p.qz.quiet.Load() }

// LivenessChanged implements multiraft.LivenessWatcher: a quiet replica
// whose group has a replica on one of nodes wakes at its next turn, so a
// follower whose leader died runs its election timer and a leader whose
// follower came back catches it up.
func (p *Partition) LivenessChanged(nodes []uint64) {
	if p.single || !p.qz.quiet.Load() {
		return
	}
	if cs := p.conf.Load(); cs != nil && !anyIn(nodes, cs.Voters, cs.Learners, cs.VotersOutgoing, cs.LearnersNext) {
		return
	}
	p.qz.wakeReq.Store(true)
	p.unquiet()
	p.Poke()
}

func anyIn(nodes []uint64, sets ...[]uint64) bool {
	for _, s := range sets {
		for _, n := range nodes {
			if slices.Contains(s, n) {
				return true
			}
		}
	}
	return false
}

// wakeQuiet makes the group tick again until it is found idle anew: the
// actor calls it for what needs raft's clock (a proposal, a configuration
// change, a leadership transfer, a placement step).
func (p *Partition) wakeQuiet() {
	p.qz.policy.Wake()
	p.unquiet()
}

// quiesceTurn runs at a turn with host ticks, before raft takes them, and
// reports whether the group is quiet: the ticks are then dropped.
// Responses to the last heartbeats were stepped just before, so a leader
// sees its followers' RecentActive as raft's CheckQuorum left it answered.
func (p *Partition) quiesceTurn() bool {
	live := p.qz.live.Load()
	if live == nil || p.single {
		return false
	}
	if p.quiesceBusy() {
		p.wakeQuiet()
		return false
	}
	last, err := p.rs.LastIndex()
	if err != nil {
		p.wakeQuiet()
		return false
	}
	q := p.qz.policy.Quiet(p.rn, last, *live)
	if q {
		p.qz.quiet.Store(true)
	} else {
		p.unquiet()
	}
	return q
}

// quiesceBusy reports partition work that needs raft's clock whatever the
// log says: stages waiting for a quorum, a leadership transfer, or a
// preferred owner that has caught up and waits out its hold-down (counted
// in ticks) before it is handed the lead.
func (p *Partition) quiesceBusy() bool {
	if len(p.committing) > 0 || p.transferring() {
		return true
	}
	return p.leads && p.preferred != 0 && p.preferred != p.raftID && slices.Contains(p.caught, p.preferred)
}

// quiesceObserve looks at an inbound message before raft steps it: anything
// but the known leader's heartbeats (and their responses) wakes the group.
func (p *Partition) quiesceObserve(m *raftpb.Message) {
	was := p.qz.policy.Quiesced()
	p.qz.policy.Observe(m, p.rn.BasicStatus().Lead)
	if was && !p.qz.policy.Quiesced() {
		p.unquiet()
	}
}

// QuietPlaced reports, without a turn of the actor, that Reconfigure has
// nothing to do: the group is quiet, it already knows want[0] as its
// preferred owner, and its voters are exactly want with no learner. A
// quiet leader has no transfer to its preferred owner waiting either
// (quiesceBusy keeps a leader awake while one is due). So the periodic
// placement pass costs an idle partition no turn.
func (p *Partition) QuietPlaced(want []uint64) bool {
	if len(want) == 0 || p.single || !p.qz.quiet.Load() || p.lead.Load() != p.raftID || p.qz.preferred.Load() != want[0] {
		return false
	}
	cs := p.conf.Load()
	if cs == nil || len(cs.Learners) > 0 || len(cs.VotersOutgoing) > 0 || len(cs.LearnersNext) > 0 || len(cs.Voters) != len(want) {
		return false
	}
	for _, id := range want {
		if !slices.Contains(cs.Voters, id) {
			return false
		}
	}
	return true
}
