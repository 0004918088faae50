package controller

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/sinewmq/sinew/internal/cohort"
)

// Cohorts (consumer groups). Each node reports, for every cohort of a
// queue it serves locally, the ids of the members connected to it
// (cohort_report; ReportCohort). The leader plans each cohort of a queue
// over the members reported by the nodes that are live (cohort.Next, from
// the committed plan) and commits the plan when its generation would
// change (cohort_plan). A plan is applied only with a generation above the
// committed one, so a late or repeated proposal changes nothing; since the
// leader always plans from the committed plan, a new leader with the same
// reports computes the same plan and commits nothing.
//
// A plan stays in the table when its cohort's reports are gone (its owners
// all empty), so that its generation never goes back; it goes with its
// queue.

// CohortReport is the member ids one node serves locally for one cohort of
// one queue.
type CohortReport struct {
	// Node is the reporting node's raft id.
	Node   uint64 `json:"node"`
	Topic  string `json:"topic"`
	Group  string `json:"group,omitempty"`
	Cohort string `json:"cohort"`
	// Members is sorted and holds no duplicates.
	Members []string `json:"members"`
}

// CohortPlan is the committed plan of one cohort of one queue:
// Owners[i] is the member meant to consume partition i ("" for none).
type CohortPlan struct {
	Topic  string `json:"topic"`
	Group  string `json:"group,omitempty"`
	Cohort string `json:"cohort"`
	cohort.Plan
}

// Bounds of the cohort entries. A report or plan beyond them is applied
// as nothing.
const (
	// CohortMembersMax bounds the members of one report.
	CohortMembersMax = 1024
	// CohortReportsMax bounds the reports in the table, and
	// CohortReportMembersMax the members they hold in all.
	CohortReportsMax       = 10_000
	CohortReportMembersMax = 65_536
	// CohortPlansMax bounds the plans in the table, and
	// CohortPlanOwnersMax the partitions they assign in all.
	CohortPlansMax      = 10_000
	CohortPlanOwnersMax = 131_072
	// cohortLocalMax bounds the reports one node keeps to propose
	// (ReportCohort).
	cohortLocalMax = 4096
)

// ErrCohortReport is returned by ReportCohort for a report it refuses:
// bad names or ids, too many members or too many cohorts.
var ErrCohortReport = errors.New("controller: cohort report refused")

func cohortKeyCmp(topicA, groupA, cohortA, topicB, groupB, cohortB string) int {
	return cmp.Or(cmp.Compare(topicA, topicB), cmp.Compare(groupA, groupB), cmp.Compare(cohortA, cohortB))
}

func (t *Table) findReport(topic, group, name string, node uint64) (int, bool) {
	i := sort.Search(len(t.CohortReports), func(i int) bool {
		r := &t.CohortReports[i]
		return cmp.Or(cohortKeyCmp(r.Topic, r.Group, r.Cohort, topic, group, name), cmp.Compare(r.Node, node)) >= 0
	})
	if i < len(t.CohortReports) {
		r := &t.CohortReports[i]
		return i, r.Topic == topic && r.Group == group && r.Cohort == name && r.Node == node
	}
	return i, false
}

func (t *Table) findPlan(topic, group, name string) (int, bool) {
	i := sort.Search(len(t.CohortPlans), func(i int) bool {
		p := &t.CohortPlans[i]
		return cohortKeyCmp(p.Topic, p.Group, p.Cohort, topic, group, name) >= 0
	})
	if i < len(t.CohortPlans) {
		p := &t.CohortPlans[i]
		return i, p.Topic == topic && p.Group == group && p.Cohort == name
	}
	return i, false
}

// CohortPlan returns the committed plan of cohort name of queue
// topic/group.
func (t *Table) CohortPlan(topic, group, name string) (CohortPlan, bool) {
	i, ok := t.findPlan(topic, group, name)
	if !ok {
		return CohortPlan{}, false
	}
	return t.CohortPlans[i], true
}

// cohortReport returns node's committed members for a cohort (nil: none).
func (t *Table) cohortReport(node uint64, topic, group, name string) []string {
	if i, ok := t.findReport(topic, group, name, node); ok {
		return t.CohortReports[i].Members
	}
	return nil
}

// normalizeMembers checks member ids (cohort.ValidMemberID) and returns
// them sorted, without duplicates; at most CohortMembersMax.
func normalizeMembers(members []string) ([]string, error) {
	if len(members) > 2*CohortMembersMax {
		return nil, fmt.Errorf("%w: %d members, at most %d", ErrCohortReport, len(members), CohortMembersMax)
	}
	for _, m := range members {
		if err := cohort.ValidMemberID(m); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrCohortReport, err)
		}
	}
	ms := slices.Compact(slices.Sorted(slices.Values(members)))
	if len(ms) > CohortMembersMax {
		return nil, fmt.Errorf("%w: %d members, at most %d", ErrCohortReport, len(ms), CohortMembersMax)
	}
	if len(ms) == 0 {
		return nil, nil
	}
	return ms, nil
}

// applyCohortReport replaces a node's members of a cohort (none: removes
// its report). It is applied as nothing, the same way on every replica,
// for a queue the catalogue does not hold (or holds as another
// incarnation), a node that is not a member, bad names or ids, or beyond
// the bounds.
func (t *Table) applyCohortReport(c *command) error {
	if c.Queue == nil || c.Queue.Topic == "" || c.Cohort == "" || c.RaftID == 0 {
		return errCommandf("cohort_report without a queue, cohort or node")
	}
	qi, ok := t.findQueue(c.Queue.Topic, c.Queue.Group)
	if !ok || !sameQueue(c, &t.Queues[qi]) {
		return nil
	}
	if n, ok := t.Node(c.RaftID); !ok || n.Left || cohort.ValidName(c.Cohort) != nil {
		return nil
	}
	ms, err := normalizeMembers(c.Members)
	if err != nil {
		return nil
	}
	i, found := t.findReport(c.Queue.Topic, c.Queue.Group, c.Cohort, c.RaftID)
	if len(ms) == 0 {
		if found {
			t.CohortReports = slices.Delete(slices.Clone(t.CohortReports), i, i+1) // a Status may share the old slice
		}
		return nil
	}
	total := len(ms)
	for j := range t.CohortReports {
		if j != i || !found {
			total += len(t.CohortReports[j].Members)
		}
	}
	if total > CohortReportMembersMax || !found && len(t.CohortReports) >= CohortReportsMax {
		return nil
	}
	r := CohortReport{Node: c.RaftID, Topic: c.Queue.Topic, Group: c.Queue.Group, Cohort: c.Cohort, Members: ms}
	rs := slices.Clone(t.CohortReports)
	if found {
		rs[i] = r
	} else {
		rs = slices.Insert(rs, i, r)
	}
	t.CohortReports = rs
	return nil
}

// applyCohortPlan commits a cohort's plan when its generation is above
// the committed one (or none is committed): an older or equal one is
// applied as nothing, as is one for a queue the catalogue does not hold
// (or holds as another incarnation), one whose owners do not match the
// queue's partitions or are not valid member ids, or one beyond the
// bounds.
func (t *Table) applyCohortPlan(c *command) error {
	if c.Queue == nil || c.Queue.Topic == "" || c.Cohort == "" || c.Generation == 0 {
		return errCommandf("cohort_plan without a queue, cohort or generation")
	}
	qi, ok := t.findQueue(c.Queue.Topic, c.Queue.Group)
	if !ok || !sameQueue(c, &t.Queues[qi]) || len(c.Owners) != len(t.Queues[qi].Partitions) || cohort.ValidName(c.Cohort) != nil {
		return nil
	}
	for _, o := range c.Owners {
		if o != "" && cohort.ValidMemberID(o) != nil {
			return nil
		}
	}
	i, found := t.findPlan(c.Queue.Topic, c.Queue.Group, c.Cohort)
	if found && c.Generation <= t.CohortPlans[i].Generation {
		return nil
	}
	total := len(c.Owners)
	for j := range t.CohortPlans {
		if j != i || !found {
			total += len(t.CohortPlans[j].Owners)
		}
	}
	if total > CohortPlanOwnersMax || !found && len(t.CohortPlans) >= CohortPlansMax {
		return nil
	}
	p := CohortPlan{Topic: c.Queue.Topic, Group: c.Queue.Group, Cohort: c.Cohort,
		Plan: cohort.Plan{Generation: c.Generation, Owners: slices.Clone(c.Owners)}}
	ps := slices.Clone(t.CohortPlans)
	if found {
		ps[i] = p
	} else {
		ps = slices.Insert(ps, i, p)
	}
	t.CohortPlans = ps
	t.plansSeq++
	return nil
}

// dropCohorts removes the reports and plans of queue topic/group (it was
// deleted).
func (t *Table) dropCohorts(topic, group string) {
	if slices.ContainsFunc(t.CohortReports, func(r CohortReport) bool { return r.Topic == topic && r.Group == group }) {
		t.CohortReports = slices.DeleteFunc(slices.Clone(t.CohortReports), func(r CohortReport) bool { return r.Topic == topic && r.Group == group })
	}
	if slices.ContainsFunc(t.CohortPlans, func(p CohortPlan) bool { return p.Topic == topic && p.Group == group }) {
		t.CohortPlans = slices.DeleteFunc(slices.Clone(t.CohortPlans), func(p CohortPlan) bool { return p.Topic == topic && p.Group == group })
		t.plansSeq++
	}
}

// dropReportsOf removes node's reports (it left the cluster).
func (t *Table) dropReportsOf(node uint64) {
	if slices.ContainsFunc(t.CohortReports, func(r CohortReport) bool { return r.Node == node }) {
		t.CohortReports = slices.DeleteFunc(slices.Clone(t.CohortReports), func(r CohortReport) bool { return r.Node == node })
	}
}

// planCohorts proposes, as leader, a plan for every cohort of a queue
// with reports or a committed plan, when cohort.Next from the committed
// plan, over the members the live nodes report (not dead or gone in the
// view, not left in the table), changes its generation. It is skipped
// while neither the table, the view nor the proposals in flight changed
// since a run that proposed nothing, and without a view (who is live is
// not known yet).
func (c *Controller) planCohorts(view []Member) error {
	if len(view) == 0 {
		return nil
	}
	sig := viewSignature(view)
	if c.cohortIdle && c.cohortApplied == c.applied && c.cohortView == sig && len(c.proposed) == 0 {
		return nil
	}
	proposed := false
	defer func() {
		c.cohortApplied, c.cohortView, c.cohortIdle = c.applied, sig, !proposed
	}()
	c.cohortPlanRuns.Add(1)
	t := c.table
	if len(t.CohortReports) == 0 && len(t.CohortPlans) == 0 {
		return nil
	}
	down := map[uint64]bool{}
	for _, m := range view {
		if m.Dead || m.Gone {
			down[m.RaftID] = true
		}
	}
	for _, n := range t.Nodes {
		if n.Left {
			down[n.RaftID] = true
		}
	}
	// Walk both sorted lists together, one cohort at a time.
	ri, pi := 0, 0
	var members []string
	for ri < len(t.CohortReports) || pi < len(t.CohortPlans) {
		var topic, group, name string
		switch {
		case pi >= len(t.CohortPlans):
			r := &t.CohortReports[ri]
			topic, group, name = r.Topic, r.Group, r.Cohort
		case ri >= len(t.CohortReports):
			p := &t.CohortPlans[pi]
			topic, group, name = p.Topic, p.Group, p.Cohort
		default:
			r, p := &t.CohortReports[ri], &t.CohortPlans[pi]
			topic, group, name = r.Topic, r.Group, r.Cohort
			if cohortKeyCmp(p.Topic, p.Group, p.Cohort, topic, group, name) < 0 {
				topic, group, name = p.Topic, p.Group, p.Cohort
			}
		}
		members = members[:0]
		for ; ri < len(t.CohortReports); ri++ {
			r := &t.CohortReports[ri]
			if r.Topic != topic || r.Group != group || r.Cohort != name {
				break
			}
			if !down[r.Node] {
				members = append(members, r.Members...)
			}
		}
		var prev cohort.Plan
		if pi < len(t.CohortPlans) {
			if p := &t.CohortPlans[pi]; p.Topic == topic && p.Group == group && p.Cohort == name {
				prev = p.Plan
				pi++
			}
		}
		q, ok := t.Queue(topic, group)
		if !ok {
			continue
		}
		next := cohort.Next(prev, len(q.Partitions), members)
		if next.Generation == prev.Generation {
			continue
		}
		ok, err := c.proposeOnce(fmt.Sprintf("cohort/%q/%q/%q/%d", topic, group, name, next.Generation),
			command{Op: opCohortPlan, Queue: &Queue{Topic: topic, Group: group, CreatedAt: q.CreatedAt},
				Cohort: name, Generation: next.Generation, Owners: next.Owners})
		if err != nil {
			return err
		}
		proposed = proposed || ok
	}
	return nil
}

type cohortKey struct{ topic, group, name string }

// localReport is what this node reports for one cohort: the members it
// wants committed, and the proposal in flight (at most one).
type localReport struct {
	members  []string
	flying   bool
	inflight []string
	at       uint64 // tick of the proposal in flight
}

// ReportCohort records the ids of the members of cohort name of queue
// topic/group that this node serves (none: it serves none). The
// controller's goroutine proposes the report when it differs from this
// node's committed one, with at most one proposal in flight per cohort
// (later calls are coalesced: the latest members follow once it is
// committed, or after proposeRetryTicks if it was lost), and proposes
// again until the table shows it. A report for a queue the catalogue does
// not hold waits for the queue. A report stands until replaced: report
// none once the node serves no member of the cohort (after its queue was
// deleted too), which also frees its place among the 4,096. It returns an error wrapping
// ErrCohortReport for an empty topic, a name cohort.ValidName refuses, an
// id cohort.ValidMemberID refuses, more than CohortMembersMax members, or
// more than 4,096 cohorts with reports to make on this node.
func (c *Controller) ReportCohort(topic, group, name string, members []string) error {
	if topic == "" {
		return fmt.Errorf("%w: no topic", ErrCohortReport)
	}
	if err := cohort.ValidName(name); err != nil {
		return fmt.Errorf("%w: %w", ErrCohortReport, err)
	}
	ms, err := normalizeMembers(members)
	if err != nil {
		return err
	}
	k := cohortKey{topic, group, name}
	c.rmu.Lock()
	r, ok := c.reports[k]
	if !ok {
		if len(c.reports) >= cohortLocalMax {
			c.rmu.Unlock()
			return fmt.Errorf("%w: more than %d cohorts on this node", ErrCohortReport, cohortLocalMax)
		}
		r = &localReport{}
		c.reports[k] = r
	}
	r.members = ms
	c.rmu.Unlock()
	c.reportsDirty.Store(true)
	c.poke()
	return nil
}

// syncReports proposes, on the controller's goroutine, the reports of
// ReportCohort that differ from this node's committed ones, while this
// node is a member of the table. It runs when a report was made, the
// table changed, or a proposal's retry is due; it reports whether it
// proposed.
func (c *Controller) syncReports() bool {
	if !c.reportsDirty.Swap(false) && c.reportsApplied == c.applied && (c.reportsRetry == 0 || c.tickN < c.reportsRetry) {
		return false
	}
	c.reportsApplied, c.reportsRetry = c.applied, 0
	self := c.cfg.Self.RaftID
	if n, ok := c.table.Node(self); !ok || n.Left {
		// Not a member (yet, or any more): a report would apply as
		// nothing. A join changes the table, which runs this again.
		return false
	}
	proposed := false
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for k, r := range c.reports {
		committed := c.table.cohortReport(self, k.topic, k.group, k.name)
		q, ok := c.table.Queue(k.topic, k.group)
		if r.flying {
			if !ok || slices.Equal(committed, r.inflight) || c.tickN >= r.at+proposeRetryTicks {
				r.flying = false
			} else {
				c.retryAt(r.at + proposeRetryTicks)
				continue
			}
		}
		if slices.Equal(committed, r.members) || !ok {
			if len(r.members) == 0 {
				delete(c.reports, k)
			}
			continue
		}
		data, err := encode(command{Op: opCohortReport, RaftID: self, Queue: &Queue{Topic: k.topic, Group: k.group, CreatedAt: q.CreatedAt},
			Cohort: k.name, Members: r.members})
		if err != nil {
			continue // not reached: the members are bounded
		}
		if err := c.rn.Propose(data); err != nil {
			c.retryAt(c.tickN + 1) // no leader yet
			continue
		}
		r.flying, r.inflight, r.at = true, r.members, c.tickN
		c.retryAt(r.at + proposeRetryTicks)
		proposed = true
	}
	return proposed
}

// retryAt makes syncReports run again at tick at (the earliest asked).
func (c *Controller) retryAt(at uint64) {
	if c.reportsRetry == 0 || at < c.reportsRetry {
		c.reportsRetry = at
	}
}

// CohortPlan returns the committed plan of cohort name of queue
// topic/group, as this node applied it, and whether there is one.
func (c *Controller) CohortPlan(topic, group, name string) (cohort.Plan, bool) {
	p, ok := c.Status().Table.CohortPlan(topic, group, name)
	if !ok {
		return cohort.Plan{}, false
	}
	return cohort.Plan{Generation: p.Generation, Owners: slices.Clone(p.Owners)}, true
}

// CohortPlans returns every committed plan, sorted by topic, group then
// cohort (copies the caller may keep).
func (c *Controller) CohortPlans() []CohortPlan {
	ps := slices.Clone(c.Status().Table.CohortPlans)
	for i := range ps {
		ps[i].Owners = slices.Clone(ps[i].Owners)
	}
	return ps
}

// CohortsChanged returns a channel closed when the committed plans next
// change (a plan committed, or dropped with its queue, or a snapshot
// installed): a waiter reads CohortPlan or CohortPlans again, then waits
// on a fresh channel.
func (c *Controller) CohortsChanged() <-chan struct{} {
	c.changedMu.Lock()
	defer c.changedMu.Unlock()
	return c.cohortsCh
}
