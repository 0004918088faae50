package main

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

type nopCohortConsumer struct{}

func (nopCohortConsumer) Deliver(*broker.Subscription, broker.Delivery) {}
func (nopCohortConsumer) Closed(*broker.Subscription, uint8, error)     {}

// gatherCohorts returns the cohort families' samples, keyed by name and
// labels (name{topic,group,cohort}).
func gatherCohorts(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetValue())
			}
			key := mf.GetName()
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			v := m.GetGauge().GetValue()
			if m.GetCounter() != nil {
				v = m.GetCounter().GetValue()
			}
			out[key] = v
		}
	}
	return out
}

// TestCohortMetrics: on a single node the cohort families count the local
// planner's plans and moves, the members served here and the partitions
// paused, per cohort; a cohort whose members all left has no series.
func TestCohortMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := broker.Open(broker.Config{DataDir: "data", FS: vfs.NewMem(), DefaultLeaseMs: 10_000})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		reg := prometheus.NewRegistry()
		reg.MustRegister(cohortCollector{b})
		if got := gatherCohorts(t, reg); len(got) != 2 || got[cohortPlansName] != 0 || got[cohortMovedName] != 0 {
			t.Fatalf("no cohorts: %v", got)
		}
		if _, err := b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "orders", Group: "eu", Partitions: 4, MaxRetries: -1}); err != nil {
			t.Fatal(err)
		}
		var subs []*broker.Subscription
		for _, m := range []string{"m1", "m2"} {
			s, err := b.Subscribe(&protocol.Subscribe{Topic: "orders", Group: "eu", Partition: -1, Prefetch: 1, Cohort: "billing", Member: m}, nopCohortConsumer{})
			if err != nil {
				t.Fatal(err)
			}
			subs = append(subs, s)
		}
		synctest.Wait() // the gates are held for the cohort; no plan yet
		members, paused := cohortMembersName+"{billing,eu,orders}", cohortPausedName+"{billing,eu,orders}"
		if got := gatherCohorts(t, reg); got[members] != 2 || got[paused] != 4 || got[cohortPlansName] != 0 {
			t.Fatalf("before the first plan: %v", got)
		}
		time.Sleep(time.Second) // the planner's delay
		synctest.Wait()
		if got := gatherCohorts(t, reg); got[members] != 2 || got[paused] != 0 || got[cohortPlansName] != 1 || got[cohortMovedName] != 4 {
			t.Fatalf("after the first plan: %v", got)
		}
		subs[1].Close()
		time.Sleep(time.Second)
		synctest.Wait()
		if got := gatherCohorts(t, reg); got[members] != 1 || got[paused] != 0 || got[cohortPlansName] != 2 || got[cohortMovedName] != 6 {
			t.Fatalf("after m2 left: %v", got)
		}
		subs[0].Close()
		time.Sleep(time.Second)
		synctest.Wait()
		if got := gatherCohorts(t, reg); len(got) != 2 {
			t.Fatalf("after every member left: %v, want the two counters only", got)
		}
	})
}
