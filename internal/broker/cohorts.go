package broker

import (
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/internal/cohort"
	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/protocol"
)

// Cohorts (consumer groups). A subscription that names a cohort is a member
// of it: the partitions of its queue are shared among the cohort's members,
// one member per partition at a time. Each partition enforces that itself,
// with the gate in its replicated state (queue.Gate); the broker only
// decides where the gates should go (a plan, from cohort.Next: sticky,
// spread, balanced by count) and steers them there (partition.Steer). A
// gate moves once its previous member's leases ended, so a plan that is
// late or stale costs balance, never exclusivity.
//
// Membership follows the subscription: a member is counted while any of its
// subscriptions to the queue is open, and a subscription lives through its
// session's reconnect grace and, restored, through a restart. A queue is
// consumed by one cohort at a time: a subscription naming a second cohort
// while the first has members gets conflict. Plain subscriptions get the
// partitions no cohort holds; once a cohort's last member leaves, its
// partitions open to them again.

// cohortPlanDelay coalesces membership changes into one plan: members that
// join or leave together move partitions once.
const cohortPlanDelay = 100 * time.Millisecond

// cohortSweepDelay is when, after Open, partitions whose gate names a cohort
// that has no member are opened again: the sessions restored at startup
// have subscribed by then.
const cohortSweepDelay = 2 * time.Second

// CohortCluster is implemented by a Cluster that plans cohorts across its
// nodes: each node reports the members it serves, the controller plans
// every cohort over the members of the live nodes and commits the plan
// with a generation, and every node steers its replicas to the committed
// plans. A clustered node whose Cluster does not implement it refuses
// cohort subscriptions.
type CohortCluster interface {
	// ReportCohort reports the members of cohort name on queue
	// topic/group that this node serves (none: the cohort left it).
	ReportCohort(topic, group, name string, members []string) error
	// CohortPlans returns every committed plan.
	CohortPlans() []CohortPlan
	// CohortsChanged returns a channel closed when the plans next change.
	CohortsChanged() <-chan struct{}
}

// CohortPlan is the committed plan of cohort Cohort on queue Topic/Group.
type CohortPlan struct {
	Topic, Group, Cohort string
	cohort.Plan
}

// AssignmentConsumer may be implemented by a Consumer: a cohort
// subscription's consumer is told when one of its partitions is assigned to
// it or revoked from it (after the move is durable). Called from partition
// goroutines; must not block.
type AssignmentConsumer interface {
	Assignment(s *Subscription, partition uint32, epoch uint64, assigned bool)
}

type cohortKey struct {
	q      queueKey
	cohort string
}

// cohortGroup is one cohort on one queue.
type cohortGroup struct {
	members map[string]int // member id -> open subscriptions
	plan    cohort.Plan
}

// cohorts is the broker's view of its cohorts, and the planner that steers
// their partitions.
type cohorts struct {
	mu     sync.Mutex
	groups map[cohortKey]*cohortGroup
	dirty  map[cohortKey]bool
	wake   chan struct{}
	stop   chan struct{}
	done   chan struct{}
	// plans counts plans that changed an assignment; moves the partitions
	// they moved.
	plans, moves atomic.Uint64
	// applied is the generation of each committed plan this node steered
	// its replicas to (clustered nodes), with the queue it steered.
	applied map[cohortKey]appliedPlan
}

type appliedPlan struct {
	q          *queueEntry
	generation uint64
}

func (c *cohorts) init() {
	c.groups = make(map[cohortKey]*cohortGroup)
	c.dirty = make(map[cohortKey]bool)
	c.wake = make(chan struct{}, 1)
	c.stop = make(chan struct{})
	c.done = make(chan struct{})
}

// join counts s as a member of its cohort, or refuses it.
func (b *Broker) joinCohort(s *Subscription) error {
	if s.cohort == "" {
		return nil
	}
	cc := b.cohortCluster()
	if b.cfg.Cluster != nil && cc == nil {
		return protocol.Errorf(protocol.CodeBadRequest, "this node's cluster does not plan cohorts")
	}
	if cc != nil {
		for _, pl := range cc.CohortPlans() {
			if pl.Topic == s.q.key.topic && pl.Group == s.q.key.group && pl.Cohort != s.cohort && pl.Assigned() {
				return protocol.Errorf(protocol.CodeConflict, "queue %q group %q is consumed by cohort %q", pl.Topic, pl.Group, pl.Cohort)
			}
		}
	}
	c := &b.cohorts
	k := cohortKey{q: s.q.key, cohort: s.cohort}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.groups == nil {
		return ErrShuttingDown
	}
	for o, g := range c.groups {
		if o.q == k.q && o.cohort != k.cohort && len(g.members) > 0 {
			return protocol.Errorf(protocol.CodeConflict, "queue %q group %q is consumed by cohort %q", k.q.topic, k.q.group, o.cohort)
		}
	}
	g := c.groups[k]
	if g == nil {
		// A cohort new here: its plan starts from where the gates stand
		// (a restart finds its members' partitions where they were), and
		// the partitions it does not hold yet are closed to plain
		// consumers at once, ahead of any attach that follows.
		g = &cohortGroup{members: make(map[string]int), plan: cohort.Plan{Owners: make([]string, len(s.q.parts))}}
		for i, p := range s.q.parts {
			if gate := p.Stats().Gate; gate.Cohort == k.cohort {
				g.plan.Owners[i] = gate.Member
			} else {
				p.Steer(k.cohort, "")
			}
		}
		c.groups[k] = g
	}
	if g.members[s.member]++; g.members[s.member] == 1 {
		c.dirty[k] = true
		c.poke()
	}
	return nil
}

// leaveCohort stops counting s as a member.
func (b *Broker) leaveCohort(s *Subscription) {
	if s.cohort == "" || !s.joined {
		return
	}
	c := &b.cohorts
	k := cohortKey{q: s.q.key, cohort: s.cohort}
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.groups[k]
	if g == nil {
		return
	}
	if g.members[s.member]--; g.members[s.member] <= 0 {
		delete(g.members, s.member)
		c.dirty[k] = true
		c.poke()
	}
}

func (c *cohorts) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// cohortCluster is the node's CohortCluster, nil on a single node.
func (b *Broker) cohortCluster() CohortCluster {
	cc, _ := b.cfg.Cluster.(CohortCluster)
	return cc
}

// runCohorts is the planner: it plans the cohorts whose members changed,
// coalescing changes that come together (on a clustered node: reports
// them), and once after startup opens the gates of cohorts that have no
// member any more. On a clustered node it also steers the replicas to the
// committed plans as they change.
func (b *Broker) runCohorts() {
	c := &b.cohorts
	defer close(c.done)
	cc := b.cohortCluster()
	var sweepC <-chan time.Time
	var changed <-chan struct{}
	if cc == nil {
		sweep := time.NewTimer(cohortSweepDelay)
		defer sweep.Stop()
		sweepC = sweep.C
	} else {
		changed = cc.CohortsChanged()
		b.applyCohortPlans(cc.CohortPlans())
	}
	for {
		select {
		case <-c.stop:
			return
		case <-sweepC:
			b.sweepCohorts()
			continue
		case <-changed:
			changed = cc.CohortsChanged()
			b.applyCohortPlans(cc.CohortPlans())
			continue
		case <-c.wake:
		}
		select {
		case <-c.stop:
			return
		case <-time.After(cohortPlanDelay):
		}
		c.mu.Lock()
		keys := slices.Collect(maps.Keys(c.dirty))
		clear(c.dirty)
		c.mu.Unlock()
		for _, k := range keys {
			b.planCohort(k)
		}
	}
}

// stopCohorts ends the planner: from then on nothing is steered, so the
// subscriptions a shutdown ends do not move any partition.
func (b *Broker) stopCohorts() {
	c := &b.cohorts
	if c.stop == nil {
		return // never started
	}
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	<-c.done
}

// planCohort plans cohort k from its members now and steers the queue's
// partitions accordingly. A cohort without members lets its partitions go
// back to plain consumers.
func (b *Broker) planCohort(k cohortKey) {
	b.mu.RLock()
	q := b.queues[k.q]
	b.mu.RUnlock()
	c := &b.cohorts
	c.mu.Lock()
	g := c.groups[k]
	if g == nil {
		c.mu.Unlock()
		return
	}
	if q == nil || q.deleted.Load() {
		delete(c.groups, k)
		c.mu.Unlock()
		return
	}
	members := slices.Collect(maps.Keys(g.members))
	if cc := b.cohortCluster(); cc != nil {
		if len(members) == 0 {
			delete(c.groups, k)
		}
		c.mu.Unlock()
		slices.Sort(members)
		if err := cc.ReportCohort(k.q.topic, k.q.group, k.cohort, members); err != nil {
			b.logger.Warn("cohort members not reported", "topic", k.q.topic, "group", k.q.group, "cohort", k.cohort, "err", err)
		}
		return
	}
	prev := g.plan
	next := cohort.Next(prev, len(q.parts), members)
	g.plan = next
	if len(members) == 0 {
		delete(c.groups, k)
	}
	c.mu.Unlock()

	if next.Generation != prev.Generation {
		c.plans.Add(1)
		moved := 0
		for i, o := range next.Owners {
			if i >= len(prev.Owners) || prev.Owners[i] != o {
				moved++
			}
		}
		c.moves.Add(uint64(moved))
		b.logger.Info("cohort plan", "topic", k.q.topic, "group", k.q.group, "cohort", k.cohort,
			"members", len(members), "generation", next.Generation, "moved", moved)
	}
	for i, p := range q.parts {
		switch {
		case len(members) == 0:
			p.Steer("", "")
		case i < len(next.Owners):
			p.Steer(k.cohort, next.Owners[i])
		}
	}
}

// applyCohortPlans steers this node's replicas to the committed plans whose
// generation it has not applied yet. A plan that assigns nothing (its
// cohort has no member left) opens the partitions to plain consumers.
func (b *Broker) applyCohortPlans(plans []CohortPlan) {
	c := &b.cohorts
	for _, pl := range plans {
		k := cohortKey{q: queueKey{topic: pl.Topic, group: pl.Group}, cohort: pl.Cohort}
		b.mu.RLock()
		q := b.queues[k.q]
		b.mu.RUnlock()
		if q == nil {
			continue // no replica here
		}
		c.mu.Lock()
		if c.applied == nil {
			c.applied = make(map[cohortKey]appliedPlan)
		}
		was := c.applied[k]
		if was.q == q && was.generation == pl.Generation {
			c.mu.Unlock()
			continue
		}
		c.applied[k] = appliedPlan{q: q, generation: pl.Generation}
		c.mu.Unlock()
		if was.q == q {
			c.plans.Add(1)
		}
		for i, p := range q.parts {
			switch {
			case !pl.Assigned():
				p.Steer("", "")
			case i < len(pl.Owners):
				p.Steer(pl.Cohort, pl.Owners[i])
			}
		}
		b.logger.Info("cohort plan applied", "topic", pl.Topic, "group", pl.Group, "cohort", pl.Cohort, "generation", pl.Generation)
	}
}

// sweepCohorts opens every partition whose gate names a cohort that has no
// member on this broker: its members ended while the broker was down.
func (b *Broker) sweepCohorts() {
	b.mu.RLock()
	qs := slices.Collect(maps.Values(b.queues))
	b.mu.RUnlock()
	c := &b.cohorts
	for _, q := range qs {
		for _, p := range q.parts {
			g := p.Stats().Gate
			if g.Cohort == "" {
				continue
			}
			c.mu.Lock()
			_, live := c.groups[cohortKey{q: q.key, cohort: g.Cohort}]
			c.mu.Unlock()
			if !live {
				p.Steer("", "")
			}
		}
	}
}

// Cohort implements partition.CohortMember.
func (a *attachment) Cohort() (string, string) { return a.s.cohort, a.s.member }

// GateMoved implements partition.GateWatcher: a cohort subscription's
// consumer hears when the partition becomes its, and when it stops being.
func (a *attachment) GateMoved(g queue.Gate) {
	s := a.s
	if s.cohort == "" || s.closed.Load() {
		return
	}
	mine := g.Cohort == s.cohort && g.Member == s.member
	if a.told && mine == a.assigned && (!mine || g.Epoch == a.epoch) {
		return
	}
	first := !a.told
	a.told, a.assigned, a.epoch = true, mine, g.Epoch
	if first && !mine {
		return // never had it: nothing to revoke
	}
	if ac, ok := s.c.(AssignmentConsumer); ok {
		ac.Assignment(s, a.idx, g.Epoch, mine)
	}
}
