package broker

import (
	"cmp"
	"maps"
	"slices"

	"github.com/sinewmq/sinew/internal/cohort"
)

// CohortView is one cohort of one queue as this node sees it (Cohorts).
type CohortView struct {
	Topic, Group, Cohort string
	// Members are the ids of the members whose subscriptions are open on
	// this node, sorted. In a cluster the other nodes serve the rest.
	Members []string
	// Clustered is set on a cluster node: the plan is the controller's
	// committed plan. Otherwise it is this node's own (the local planner).
	Clustered bool
	// Plan is the plan this node steers the queue's partitions to: its
	// generation and the member meant for each partition (Owners[i], ""
	// for none). The zero Plan while none was made or committed yet.
	Plan cohort.Plan
	// Partitions has one entry per partition of the queue, by index.
	Partitions []CohortPartitionView
}

// CohortPartitionView is one partition of a cohort's queue.
type CohortPartitionView struct {
	Partition uint32
	// Planned is the member the plan names for the partition ("" none).
	Planned string
	// Held is set when the partition's gate names this cohort: its
	// messages go to Member, or to nobody while Member is "".
	Held bool
	// Member is the member the gate admits (when Held), and Epoch the
	// partition's assignment epoch: the number of gate moves so far.
	Member string
	Epoch  uint64
	// Owned is set when this node owns the partition (a single node owns
	// every partition; in a cluster, the raft leader of its group does):
	// the gate and counts are the owner's. On another replica they are
	// that replica's applied state, which may lag. Owner is, in a
	// cluster, the owner's client address ("" while none is known).
	Owned bool
	Owner string
	// Paused is set when the partition delivers to no member of the
	// cohort: its gate holds it for the cohort with no member, or the
	// plan names a member the gate has not moved to yet (the previous
	// holder's leases have not ended).
	Paused bool
	// Lag is the partition's unsettled messages: ready, delayed and
	// inflight.
	Lag int
}

// Cohorts returns the cohorts this node knows, ordered by topic, group
// and cohort: those with members whose subscriptions are open here, those
// whose plan assigns a partition of a queue this node holds (committed by
// the controller in a cluster), and those named by the gate of a
// partition this node holds (say, a cohort whose last member left, while
// its partitions wait for the leases to end before they open). A cluster
// node does not list cohorts of queues it holds no replica of. Reading
// it moves nothing.
func (b *Broker) Cohorts() []CohortView {
	b.mu.RLock()
	queues := maps.Clone(b.queues)
	b.mu.RUnlock()

	type entry struct {
		members []string
		plan    cohort.Plan
	}
	found := map[cohortKey]*entry{}
	get := func(k cohortKey) *entry {
		e := found[k]
		if e == nil {
			e = &entry{}
			found[k] = e
		}
		return e
	}
	cc := b.cohortCluster()
	c := &b.cohorts
	c.mu.Lock()
	for k, g := range c.groups {
		e := get(k)
		e.members = slices.Sorted(maps.Keys(g.members))
		if cc == nil {
			e.plan = clonePlan(g.plan)
		}
	}
	c.mu.Unlock()
	if cc != nil {
		// A plan that assigns nothing (its cohort left) is listed only
		// while a member or a gate still names its cohort (below).
		for _, pl := range cc.CohortPlans() {
			k := cohortKey{q: queueKey{topic: pl.Topic, group: pl.Group}, cohort: pl.Cohort}
			if queues[k.q] != nil {
				get(k).plan = clonePlan(pl.Plan)
			}
		}
	}
	// Gates: every cohort a partition held here is held by.
	gated := map[cohortKey]bool{}
	for qk, q := range queues {
		for _, p := range q.parts {
			if g := p.Stats().Gate; g.Cohort != "" {
				gated[cohortKey{q: qk, cohort: g.Cohort}] = true
			}
		}
	}

	out := make([]CohortView, 0, len(found)+len(gated))
	for k := range gated {
		get(k)
	}
	for k, e := range found {
		q := queues[k.q]
		if q == nil || q.deleted.Load() {
			continue
		}
		if len(e.members) == 0 && !e.plan.Assigned() && !gated[k] {
			continue // a plan with nothing to show: its cohort left, its gates opened
		}
		v := CohortView{Topic: k.q.topic, Group: k.q.group, Cohort: k.cohort, Members: e.members,
			Clustered: cc != nil, Plan: e.plan, Partitions: make([]CohortPartitionView, 0, len(q.parts))}
		if v.Members == nil {
			v.Members = []string{}
		}
		if v.Plan.Owners == nil {
			v.Plan.Owners = []string{}
		}
		for i, p := range q.parts {
			st := p.Stats()
			pv := CohortPartitionView{Partition: p.Index(), Epoch: st.Gate.Epoch, Owned: q.leadsHere(p),
				Lag: st.Ready + st.Delayed + st.Inflight}
			pv.Owner, _ = b.partitionOwner(p)
			if i < len(e.plan.Owners) {
				pv.Planned = e.plan.Owners[i]
			}
			if st.Gate.Cohort == k.cohort {
				pv.Held, pv.Member = true, st.Gate.Member
			}
			pv.Paused = pv.Held && pv.Member == "" || pv.Planned != "" && (!pv.Held || pv.Member != pv.Planned)
			v.Partitions = append(v.Partitions, pv)
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, c CohortView) int {
		return cmp.Or(cmp.Compare(a.Topic, c.Topic), cmp.Compare(a.Group, c.Group), cmp.Compare(a.Cohort, c.Cohort))
	})
	return out
}

// CohortCounters returns how many plans changed an assignment and how many
// partitions they moved, since the broker opened. On a single node they
// count the plans of the local planner; on a cluster node plans counts the
// committed plans it applied with a new generation after the first it saw
// for the queue, and moved stays 0 (the controller plans the moves).
func (b *Broker) CohortCounters() (plans, moved uint64) {
	return b.cohorts.plans.Load(), b.cohorts.moves.Load()
}

func clonePlan(p cohort.Plan) cohort.Plan {
	return cohort.Plan{Generation: p.Generation, Owners: slices.Clone(p.Owners)}
}
