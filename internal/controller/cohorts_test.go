package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/cohort"
)

// TestCohortCommands: reports are kept per node, queue and cohort (an
// empty one removes its entry); a plan applies only with a generation
// above the committed one; bad or misdirected entries apply as nothing;
// a deleted queue drops its reports and plans, a node that leaves its
// reports; the snapshot carries both.
func TestCohortCommands(t *testing.T) {
	tb := &Table{}
	apply := func(index uint64, c command) {
		t.Helper()
		data, err := encode(c)
		if err != nil {
			t.Fatal(err)
		}
		cmd, err := decode(data)
		if err != nil {
			t.Fatal(err)
		}
		if err := tb.apply(index, cmd); err != nil {
			t.Fatal(err)
		}
	}
	for id := uint64(1); id <= 3; id++ {
		n := nodeOf(id)
		apply(id, command{Op: opJoin, Node: &n})
	}
	three := func(n int) []Placement {
		ps := make([]Placement, n)
		for i := range ps {
			ps[i] = Placement{Replicas: []uint64{1, 2, 3}}
		}
		return ps
	}
	apply(10, command{Op: opCreateQueue, Queue: &Queue{Topic: "q", Partitions: three(4)}})
	apply(11, command{Op: opCreateQueue, Queue: &Queue{Topic: "r", Partitions: three(2)}})
	report := func(index, node uint64, topic string, createdAt uint64, name string, members ...string) {
		apply(index, command{Op: opCohortReport, RaftID: node, Queue: &Queue{Topic: topic, CreatedAt: createdAt}, Cohort: name, Members: members})
	}
	plan := func(index uint64, topic, name string, gen uint64, owners ...string) {
		apply(index, command{Op: opCohortPlan, Queue: &Queue{Topic: topic}, Cohort: name, Generation: gen, Owners: owners})
	}
	report(12, 2, "q", 10, "billing", "b", "a", "b")
	report(13, 1, "q", 0, "billing", "c")
	report(14, 1, "r", 0, "billing", "c")
	report(15, 1, "q", 0, "audit", "d")
	// Applied as nothing: another incarnation, no such queue, a node
	// not in the table, a bad id, a bad cohort name, too many members.
	report(16, 3, "q", 9, "billing", "x")
	report(17, 3, "nope", 0, "billing", "x")
	report(18, 9, "q", 0, "billing", "x")
	report(19, 3, "q", 0, "billing", "x y")
	report(20, 3, "q", 0, "bill/ing", "x")
	many := make([]string, CohortMembersMax+1)
	for i := range many {
		many[i] = fmt.Sprint("m", i)
	}
	report(21, 3, "q", 0, "billing", many...)
	want := []CohortReport{
		{Node: 1, Topic: "q", Cohort: "audit", Members: []string{"d"}},
		{Node: 1, Topic: "q", Cohort: "billing", Members: []string{"c"}},
		{Node: 2, Topic: "q", Cohort: "billing", Members: []string{"a", "b"}},
		{Node: 1, Topic: "r", Cohort: "billing", Members: []string{"c"}},
	}
	checkReports := func(what string, want []CohortReport) {
		t.Helper()
		if !slices.EqualFunc(tb.CohortReports, want, func(a, b CohortReport) bool {
			return a.Node == b.Node && a.Topic == b.Topic && a.Group == b.Group && a.Cohort == b.Cohort && slices.Equal(a.Members, b.Members)
		}) {
			t.Fatalf("%s: reports %+v, want %+v", what, tb.CohortReports, want)
		}
	}
	checkReports("after the reports", want)
	report(22, 1, "q", 0, "audit")
	checkReports("after an empty report", slices.Delete(slices.Clone(want), 0, 1))
	report(23, 1, "q", 0, "audit", "d")

	// Plans: fenced by generation.
	checkPlan := func(what, topic, name string, gen uint64, owners ...string) {
		t.Helper()
		p, ok := tb.CohortPlan(topic, "", name)
		if gen == 0 {
			if ok {
				t.Fatalf("%s: plan %+v, want none", what, p)
			}
			return
		}
		if !ok || p.Generation != gen || !slices.Equal(p.Owners, owners) {
			t.Fatalf("%s: plan %+v (%v), want generation %d owners %v", what, p, ok, gen, owners)
		}
	}
	seq := tb.plansSeq
	plan(30, "q", "billing", 2, "a", "b", "a", "b")
	checkPlan("first plan", "q", "billing", 2, "a", "b", "a", "b")
	if tb.plansSeq == seq {
		t.Fatal("a committed plan did not count as a change")
	}
	plan(31, "q", "billing", 2, "c", "c", "c", "c")
	plan(32, "q", "billing", 1, "c", "c", "c", "c")
	checkPlan("equal and older generations", "q", "billing", 2, "a", "b", "a", "b")
	plan(33, "q", "billing", 3, "c", "c", "c")        // wrong partition count
	plan(34, "q", "billing", 3, "c", "c", "c", "c d") // bad id
	plan(35, "nope", "billing", 3, "c")
	checkPlan("misdirected plans", "q", "billing", 2, "a", "b", "a", "b")
	plan(36, "q", "billing", 3, "a", "b", "c", "")
	checkPlan("a newer generation", "q", "billing", 3, "a", "b", "c", "")
	plan(37, "r", "billing", 1, "c", "c")
	plan(38, "q", "audit", 1, "d", "d", "d", "d")

	// The snapshot carries reports and plans.
	b, err := encodeSnap(snap{Index: 38, Term: 1, Table: *tb.clone()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := decodeSnap(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Table.CohortReports) != 4 || len(s.Table.CohortPlans) != 3 {
		t.Fatalf("snapshot holds %d reports and %d plans, want 4 and 3", len(s.Table.CohortReports), len(s.Table.CohortPlans))
	}
	if p, ok := s.Table.CohortPlan("q", "", "billing"); !ok || p.Generation != 3 || !slices.Equal(p.Owners, []string{"a", "b", "c", ""}) {
		t.Fatalf("snapshot's plan: %+v", p)
	}
	if !slices.Equal(s.Table.cohortReport(2, "q", "", "billing"), []string{"a", "b"}) {
		t.Fatalf("snapshot's reports: %+v", s.Table.CohortReports)
	}

	// A deleted queue drops its reports and plans; a node that leaves,
	// its reports.
	apply(40, command{Op: opDeleteQueue, Queue: &Queue{Topic: "q"}})
	checkReports("after q's delete", []CohortReport{{Node: 1, Topic: "r", Cohort: "billing", Members: []string{"c"}}})
	checkPlan("after q's delete", "q", "billing", 0)
	checkPlan("after q's delete", "r", "billing", 1, "c", "c")
	apply(41, command{Op: opLeave, RaftID: 1})
	checkReports("after node 1 left", nil)
	report(42, 1, "r", 0, "billing", "c")
	checkReports("a report from a node that left", nil)

	// Entries without their keys are refused.
	for _, bad := range []command{
		{Op: opCohortReport, Queue: &Queue{Topic: "r"}, Cohort: "x"},
		{Op: opCohortReport, RaftID: 2, Cohort: "x"},
		{Op: opCohortPlan, Queue: &Queue{Topic: "r"}, Cohort: "x"},
		{Op: opCohortPlan, Queue: &Queue{Topic: "r"}, Generation: 4},
	} {
		if err := tb.apply(50, bad); !errors.Is(err, ErrCommand) {
			t.Errorf("apply(%+v) = %v, want ErrCommand", bad, err)
		}
	}
}

// cohortCluster starts three controllers and creates queue q with
// partitions partitions through node 1.
func cohortCluster(t *testing.T, partitions int) *cluster {
	t.Helper()
	c := newCluster(t)
	c.start(1, true)
	c.start(2, false)
	c.start(3, false)
	three := []uint64{1, 2, 3}
	c.until("three voters", c.agreed(three, nil, three, nil))
	ps := make([]Placement, partitions)
	for i := range ps {
		ps[i] = Placement{Replicas: three}
	}
	createQueue(t, c, c.node(1), Queue{Topic: "q", Partitions: ps})
	return c
}

func (c *cluster) node(id uint64) *Controller {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id]
}

// createQueue creates q through n while the cluster runs.
func createQueue(t *testing.T, c *cluster, n *Controller, q Queue) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := n.CreateQueue(ctx, q)
		done <- err
	}()
	c.until("the queue is created", func() bool {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			return true
		default:
			return false
		}
	})
}

// planIs reports whether every running node holds plan gen/owners for
// q's cohort name.
func (c *cluster) planIs(name string, gen uint64, owners []string) func() bool {
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, n := range c.nodes {
			p, ok := n.CohortPlan("q", "", name)
			if !ok || p.Generation != gen || !slices.Equal(p.Owners, owners) {
				return false
			}
		}
		return true
	}
}

func report(t *testing.T, n *Controller, name string, members ...string) {
	t.Helper()
	if err := n.ReportCohort("q", "", name, members); err != nil {
		t.Fatal(err)
	}
}

// TestCohortPlansThroughTheGroup: members reported on three nodes get a
// sticky plan, one generation per change, visible on every node with a
// change notification. Then the controller's leader changes with the
// same reports: the new leader starts from the committed plan, which is
// not the plan it would compute from scratch, and bumps nothing.
func TestCohortPlansThroughTheGroup(t *testing.T) {
	c := cohortCluster(t, 6)
	n1, n2, n3 := c.node(1), c.node(2), c.node(3)
	changed := n3.CohortsChanged()
	report(t, n1, "billing", "a")
	c.until("a alone holds every partition", c.planIs("billing", 1, []string{"a", "a", "a", "a", "a", "a"}))
	// The status is published before the channel is closed: wait.
	select {
	case <-changed:
	case <-time.After(untilPatience):
		t.Fatal("CohortsChanged not closed by a new plan")
	}
	report(t, n2, "billing", "b")
	c.until("b takes half", c.planIs("billing", 2, []string{"a", "a", "a", "b", "b", "b"}))
	report(t, n3, "billing", "c")
	sticky := []string{"a", "a", "c", "b", "b", "c"}
	c.until("c takes its third", c.planIs("billing", 3, sticky))
	// The test means something only if a leader planning from scratch
	// would choose otherwise.
	if fresh := cohort.Next(cohort.Plan{}, 6, []string{"a", "b", "c"}); slices.Equal(fresh.Owners, sticky) {
		t.Fatalf("precondition: the fresh plan %v is the sticky one", fresh.Owners)
	}
	if ps := n2.CohortPlans(); len(ps) != 1 || ps[0].Topic != "q" || ps[0].Cohort != "billing" || ps[0].Generation != 3 {
		t.Fatalf("CohortPlans = %+v", ps)
	}

	// A leader change with the same reports.
	lead := n1.Status().Leader
	c.mu.Lock()
	c.cut[lead] = true
	c.mu.Unlock()
	newLead := uint64(0)
	c.until("a new leader among the other two", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for id, n := range c.nodes {
			if id == lead {
				continue
			}
			st := n.Status()
			if st.Leader == 0 || st.Leader == lead {
				return false
			}
			newLead = st.Leader
		}
		return true
	})
	c.mu.Lock()
	c.cut[lead] = false
	c.mu.Unlock()
	three := []uint64{1, 2, 3}
	c.until("all follow the new leader", c.agreed(three, nil, three, nil))
	// Let the new leader plan for a while (its first run is never
	// skipped), then look again.
	for range 200 {
		c.round(time.Millisecond)
	}
	if !c.planIs("billing", 3, sticky)() {
		p, _ := c.node(newLead).CohortPlan("q", "", "billing")
		t.Fatalf("after a leader change with the same reports: plan %+v, want generation 3 %v", p, sticky)
	}
	// The new leader does plan: a change of reports is planned.
	report(t, n3, "billing", "c", "d")
	c.until("d joins", c.planIs("billing", 4, []string{"a", "a", "c", "b", "b", "d"}))
}

// TestCohortPlanFollowsLiveNodes: a node membership holds dead is left
// out of the plans (its report stays, and counts again once it is
// live); a node that leaves has its reports dropped; a deleted queue
// drops its plans.
func TestCohortPlanFollowsLiveNodes(t *testing.T) {
	c, n1 := fourNodesWithQueue(t, Placement{Replicas: []uint64{1, 2, 3}}, Placement{Replicas: []uint64{1, 2, 3}},
		Placement{Replicas: []uint64{1, 2, 3}}, Placement{Replicas: []uint64{1, 2, 3}})
	report(t, c.node(3), "billing", "m3")
	c.until("m3 alone", c.planIs("billing", 1, []string{"m3", "m3", "m3", "m3"}))
	report(t, c.node(4), "billing", "m4")
	c.until("m3 and m4 share", c.planIs("billing", 2, []string{"m3", "m3", "m4", "m4"}))
	c.mu.Lock()
	c.dead[4] = true
	c.mu.Unlock()
	c.until("node 4 dead: m3 alone", c.planIs("billing", 3, []string{"m3", "m3", "m3", "m3"}))
	if len(n1.Status().Table.CohortReports) != 2 {
		t.Fatalf("a dead node's report was dropped: %+v", n1.Status().Table.CohortReports)
	}
	c.mu.Lock()
	c.dead[4] = false
	c.mu.Unlock()
	c.until("node 4 back: m4 takes its half", c.planIs("billing", 4, []string{"m3", "m3", "m4", "m4"}))
	c.stop(4)
	c.until("node 4 left: its report dropped, m3 alone", func() bool {
		return len(n1.Status().Table.CohortReports) == 1 && c.planIs("billing", 5, []string{"m3", "m3", "m3", "m3"})()
	}, 4)
	// The last member goes: the plan stays, with nobody, so that its
	// generation never goes back.
	report(t, c.node(3), "billing")
	c.until("no members: nobody", c.planIs("billing", 6, []string{"", "", "", ""}), 4)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	deleted := make(chan error, 1)
	go func() { deleted <- n1.DeleteQueue(ctx, "q", "") }()
	c.until("the queue and its plan are gone", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, n := range c.nodes {
			if tb := n.Status().Table; len(tb.CohortPlans) != 0 || len(tb.CohortReports) != 0 {
				return false
			}
		}
		return true
	}, 4)
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
}

// TestReportCohort: ReportCohort checks its input; an empty report removes the node's entry; a report made before its queue
// exists is committed once it does; and the reports and plans come back
// from a snapshot after a restart.
func TestReportCohort(t *testing.T) {
	c := newCluster(t)
	c.snapEvery = 8
	c.start(1, true)
	c.start(2, false)
	c.start(3, false)
	three := []uint64{1, 2, 3}
	c.until("three voters", c.agreed(three, nil, three, nil))
	n2 := c.node(2)
	for _, bad := range []struct {
		topic, name string
		members     []string
	}{
		{"", "x", []string{"a"}},
		{"q", "", []string{"a"}},
		{"q", "x y", []string{"a"}},
		{"q", "x", []string{"a", ""}},
		{"q", "x", []string{strings.Repeat("a", 129)}},
	} {
		if err := n2.ReportCohort(bad.topic, "", bad.name, bad.members); !errors.Is(err, ErrCohortReport) {
			t.Errorf("ReportCohort(%q, %q, %q) = %v, want ErrCohortReport", bad.topic, bad.name, bad.members, err)
		}
	}
	// Before the queue exists: waits.
	report(t, n2, "early", "e")
	ps := make([]Placement, 3)
	for i := range ps {
		ps[i] = Placement{Replicas: three}
	}
	createQueue(t, c, c.node(1), Queue{Topic: "q", Partitions: ps})
	c.until("the early report is committed and planned", c.planIs("early", 1, []string{"e", "e", "e"}))

	report(t, n2, "early")
	c.until("the empty report removes the entry", func() bool {
		return n2.Status().Table.cohortReport(2, "q", "", "early") == nil
	})
	c.until("the early cohort has nobody", c.planIs("early", 2, []string{"", "", ""}))

	// Enough entries for snapshots (every 8), then restart node 3 from
	// its snapshot and log.
	for i := range 10 {
		report(t, n2, "keep", "k", fmt.Sprint("k", i))
		c.until(fmt.Sprint("report ", i), func() bool {
			return slices.Equal(c.node(3).Status().Table.cohortReport(2, "q", "", "keep"), []string{"k", fmt.Sprint("k", i)})
		})
	}
	c.stop(3)
	tb := c.start(3, false).Status().Table
	if p, ok := tb.CohortPlan("q", "", "early"); !ok || p.Generation != 2 {
		t.Fatalf("node 3 restarted with plan %+v, %v", p, ok)
	}
	if got := tb.cohortReport(2, "q", "", "keep"); !slices.Equal(got, []string{"k", "k9"}) {
		t.Fatalf("node 3 restarted with report %v", got)
	}
	if c.node(3).snap.Index == 0 {
		t.Fatal("node 3 restarted without a snapshot")
	}
}

// TestReportCohortCoalesces: while a report cannot commit (the leader that
// makes it is cut off from its followers, and no tick passes, so it keeps
// its lead and does not propose again), a burst of changing reports keeps
// one proposal in flight; once healed, that one commits and then the
// latest: two entries for the whole burst.
func TestReportCohortCoalesces(t *testing.T) {
	c := cohortCluster(t, 2)
	lead := c.node(1).Status().Leader
	n := c.node(lead)
	c.mu.Lock()
	for id := range c.nodes {
		c.cut[id] = id != lead
	}
	c.mu.Unlock()
	before := n.reportEntries.Load()
	const calls = 100
	for i := range calls {
		changed := n.Changed()
		report(t, n, "burst", fmt.Sprint("m", i))
		// Give the controller's goroutine a turn (a proposal changes
		// its status; a coalesced report does not, hence the bound).
		select {
		case <-changed:
		case <-time.After(2 * time.Millisecond):
		}
	}
	last := []string{fmt.Sprint("m", calls-1)}
	c.mu.Lock()
	clear(c.cut)
	c.mu.Unlock()
	c.until("the last report is committed", func() bool {
		return slices.Equal(n.Status().Table.cohortReport(lead, "q", "", "burst"), last)
	})
	if got := n.reportEntries.Load() - before; got != 2 {
		t.Fatalf("%d report entries for a burst of %d reports, want 2 (the one in flight, then the last)", got, calls)
	}
}

// TestCohortPlanningIdles: once the plans are settled and no proposal is
// in flight, the leader's cohort planning is skipped at every turn while
// neither the table nor the view changes; a change of the view is planned.
// The harness's rounds can outpace the heartbeats, so the leader may
// change now and then: only a window whose leader, term and table stayed
// the same since proposeRetryTicks rounds before it counts, and the test
// tries at most ten windows.
func TestCohortPlanningIdles(t *testing.T) {
	c := cohortCluster(t, 4)
	report(t, c.node(2), "billing", "a")
	report(t, c.node(3), "billing", "b")
	c.until("a and b share", func() bool {
		p, ok := c.node(1).CohortPlan("q", "", "billing")
		return ok && slices.Contains(p.Owners, "a") && slices.Contains(p.Owners, "b")
	})
	rounds := func(k int) {
		for range k {
			c.round(time.Millisecond)
		}
	}
	same := func(a, b Status) bool { return a.Leader == b.Leader && a.Term == b.Term && a.Applied == b.Applied }
	for try := 0; ; try++ {
		if try == 10 {
			t.Fatal("no quiet window in ten tries")
		}
		n := c.node(c.node(1).Status().Leader)
		if n == nil {
			rounds(10)
			continue
		}
		st0 := n.Status()
		// Past proposeRetryTicks, every proposal made has left
		// c.proposed.
		rounds(2 * proposeRetryTicks)
		st1, runs := n.Status(), n.cohortPlanRuns.Load()
		rounds(100)
		st2 := n.Status()
		if st0.Leader != n.cfg.Self.RaftID || !same(st0, st1) || !same(st1, st2) {
			continue
		}
		if got := n.cohortPlanRuns.Load(); got != runs {
			t.Fatalf("cohort planning ran %d times in 100 idle rounds", got-runs)
		}
		break
	}
	c.mu.Lock()
	c.dead[3] = true
	c.mu.Unlock()
	c.until("a changed view is planned", func() bool {
		p, ok := c.node(1).CohortPlan("q", "", "billing")
		return ok && !slices.Contains(p.Owners, "b")
	})
}
