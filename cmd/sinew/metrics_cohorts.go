package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sinewmq/sinew/internal/broker"
)

// The cohort (consumer group) families, read from broker.Cohorts and
// broker.CohortCounters at scrape time.
const (
	cohortPlansName = "sinew_cohort_plans_total"
	cohortPlansHelp = "Cohort plans that changed an assignment, since start: on a single node, the plans of its local planner; on a cluster node, the controller's committed plans it applied with a new generation after the first it saw for the queue."
	cohortMovedName = "sinew_cohort_partitions_moved_total"
	cohortMovedHelp = "Partitions whose planned member changed in the plans of this node's local planner, since start. Stays 0 on a cluster node, where the controller plans."

	cohortPausedName  = "sinew_cohort_partitions_paused"
	cohortPausedHelp  = "Partitions of a cohort's queue, as this node sees them, that deliver to no member of the cohort: held for nobody, or not yet moved to their planned member (the previous member's leases have not ended)."
	cohortMembersName = "sinew_cohort_members"
	cohortMembersHelp = "Members of a cohort whose subscriptions are open on this node."
)

// cohortSeriesMax bounds the cohorts given a series in each per-cohort
// family; past it, the later cohorts (in topic, group, cohort order) are
// left out of the scrape. /api/v1/cohorts lists them all.
const cohortSeriesMax = 1000

var (
	cohortLabels      = []string{"topic", "group", "cohort"}
	cohortPlansDesc   = prometheus.NewDesc(cohortPlansName, cohortPlansHelp, nil, nil)
	cohortMovedDesc   = prometheus.NewDesc(cohortMovedName, cohortMovedHelp, nil, nil)
	cohortPausedDesc  = prometheus.NewDesc(cohortPausedName, cohortPausedHelp, cohortLabels, nil)
	cohortMembersDesc = prometheus.NewDesc(cohortMembersName, cohortMembersHelp, cohortLabels, nil)
)

// cohortCollector exports the broker's cohorts.
type cohortCollector struct{ b *broker.Broker }

// Describe implements prometheus.Collector.
func (c cohortCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- cohortPlansDesc
	ch <- cohortMovedDesc
	ch <- cohortPausedDesc
	ch <- cohortMembersDesc
}

// Collect implements prometheus.Collector.
func (c cohortCollector) Collect(ch chan<- prometheus.Metric) {
	plans, moved := c.b.CohortCounters()
	ch <- prometheus.MustNewConstMetric(cohortPlansDesc, prometheus.CounterValue, float64(plans))
	ch <- prometheus.MustNewConstMetric(cohortMovedDesc, prometheus.CounterValue, float64(moved))
	cs := c.b.Cohorts()
	for _, v := range cs[:min(len(cs), cohortSeriesMax)] {
		paused := 0
		for _, p := range v.Partitions {
			if p.Paused {
				paused++
			}
		}
		ch <- prometheus.MustNewConstMetric(cohortPausedDesc, prometheus.GaugeValue, float64(paused), v.Topic, v.Group, v.Cohort)
		ch <- prometheus.MustNewConstMetric(cohortMembersDesc, prometheus.GaugeValue, float64(len(v.Members)), v.Topic, v.Group, v.Cohort)
	}
}
