package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sinewmq/sinew/internal/broker"
)

// The node-wide memory budgets (storage.body_cache_bytes,
// storage.raft_cache_bytes), in the metric table of docs/operations.md.
var budgetMetrics = []struct{ name, help string }{
	{"sinew_memory_budget_bytes", "Limit of a node-wide memory budget, by budget: body_cache (recently published bodies, storage.body_cache_bytes), raft_cache (raft entries not yet applied, storage.raft_cache_bytes)."},
	{"sinew_memory_budget_used_bytes", "Bytes the partitions' caches hold against a node-wide memory budget (plus at most one small reservation chunk per partition), by budget."},
	{"sinew_memory_budget_evicted_bytes_total", "Bytes the coldest caches gave back because a node-wide memory budget was full, by budget."},
}

var (
	budgetLimitDesc   = prometheus.NewDesc(budgetMetrics[0].name, budgetMetrics[0].help, []string{"budget"}, nil)
	budgetUsedDesc    = prometheus.NewDesc(budgetMetrics[1].name, budgetMetrics[1].help, []string{"budget"}, nil)
	budgetEvictedDesc = prometheus.NewDesc(budgetMetrics[2].name, budgetMetrics[2].help, []string{"budget"}, nil)
)

// budgetCollector exports the broker's memory budgets at scrape time.
type budgetCollector struct{ b *broker.Broker }

// Describe implements prometheus.Collector.
func (c budgetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- budgetLimitDesc
	ch <- budgetUsedDesc
	ch <- budgetEvictedDesc
}

// Collect implements prometheus.Collector.
func (c budgetCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.b.Budgets() {
		ch <- prometheus.MustNewConstMetric(budgetLimitDesc, prometheus.GaugeValue, float64(s.Limit), s.Name)
		ch <- prometheus.MustNewConstMetric(budgetUsedDesc, prometheus.GaugeValue, float64(s.Used), s.Name)
		ch <- prometheus.MustNewConstMetric(budgetEvictedDesc, prometheus.CounterValue, float64(s.Evicted), s.Name)
	}
}

// bodyCacheBytes maps storage.body_cache_bytes (0: no cache) to
// broker.Config.BodyCacheBytes (negative: no cache, 0: the default).
func bodyCacheBytes(v int64) int {
	if v == 0 {
		return -1
	}
	return int(v)
}
