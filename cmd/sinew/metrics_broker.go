package main

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/clusternode"
	"github.com/sinewmq/sinew/internal/partition"
)

// brokerInput is what one scrape reads from the broker: the counters its
// partitions share, and the per-partition stats.
type brokerInput struct {
	c     *partition.Counters
	stats *broker.Stats
}

// brokerMetric is one family read from the broker at scrape time.
type brokerMetric struct {
	name, help string
	typ        prometheus.ValueType
	labels     []string
	values     func(in *brokerInput) []labeled
}

func brokerCounter(name, help string, v func(c *partition.Counters) uint64) brokerMetric {
	return brokerMetric{name: name, help: help, typ: prometheus.CounterValue,
		values: func(in *brokerInput) []labeled { return one(float64(v(in.c))) }}
}

// brokerMetrics lists the families that read the partitions' shared
// counters. They count since the broker opened and never go down: a
// deleted queue's counts stay in them.
var brokerMetrics = []brokerMetric{
	brokerCounter("sinew_messages_appended_total", "Messages stored in a partition log: publishes and dead-letter copies.", func(c *partition.Counters) uint64 { return c.Appended.Load() }),
	brokerCounter("sinew_deliveries_total", "Messages leased to consumers, first deliveries and redeliveries.", func(c *partition.Counters) uint64 { return c.Deliveries.Load() }),
	brokerCounter("sinew_redeliveries_total", "Deliveries of a message that had been delivered before (attempt above one).", func(c *partition.Counters) uint64 { return c.Redeliveries.Load() }),
	brokerCounter("sinew_acks_total", "Leases completed by their consumer (ACK).", func(c *partition.Counters) uint64 { return c.Acks.Load() }),
	brokerCounter("sinew_nacks_total", "Leases handed back for a redelivery by their consumer (NACK).", func(c *partition.Counters) uint64 { return c.Nacks.Load() }),
	brokerCounter("sinew_fails_total", "Messages their consumer declared unprocessable (FAIL).", func(c *partition.Counters) uint64 { return c.Fails.Load() }),
	brokerCounter("sinew_lease_expiries_total", "Leases that reached their deadline without a settle; the message went back to its queue.", func(c *partition.Counters) uint64 { return c.LeaseExpiries.Load() }),
	brokerCounter("sinew_lease_extensions_total", "Lease deadlines moved by their consumer (EXTEND) and made durable.", func(c *partition.Counters) uint64 { return c.Extensions.Load() }),
	brokerCounter("sinew_leases_released_total", "Leases handed back because their consumer went away (not counted as an attempt).", func(c *partition.Counters) uint64 { return c.Released.Load() }),
	brokerCounter("sinew_messages_purged_total", "Messages an operator removed: purges and dead-letter copies removed after a replay.", func(c *partition.Counters) uint64 { return c.Purged.Load() }),
	{
		name: "sinew_dead_lettered_total", help: "Messages that failed for good, by reason: failed (FAIL), retries_exhausted, expired (TTL). Each is copied to its dead-letter queue or discarded, as its queue says.",
		typ: prometheus.CounterValue, labels: []string{"reason"},
		values: func(in *brokerInput) []labeled {
			out := make([]labeled, 0, len(partition.DeadLetterReasons))
			for _, r := range partition.DeadLetterReasons {
				out = append(out, labeled{[]string{r.String()}, float64(in.c.DeadLetteredBy(r))})
			}
			return out
		},
	},
	{
		name: "sinew_bytes_on_disk", help: "Bytes of every partition log segment on disk, summed over all queues.",
		typ: prometheus.GaugeValue,
		values: func(in *brokerInput) []labeled {
			var n int64
			for _, q := range in.stats.Queues {
				for _, p := range q.Partitions {
					n += p.BytesOnDisk
				}
			}
			return one(float64(n))
		},
	},
}

// syncMetrics are the fsync histograms: each partition's syncer reports
// every sync that made a stage durable (broker.Config.OnSync).
type syncMetrics struct {
	batch   prometheus.Histogram
	latency prometheus.Histogram
}

// The fsync histograms' names and help.
const (
	syncBatchName   = "sinew_fsync_batch_records"
	syncBatchHelp   = "Log records of a partition made durable by one node journal commit (written, under storage.sync = interval): the partition's batch size."
	syncLatencyName = "sinew_fsync_duration_seconds"
	syncLatencyHelp = "Time one node journal commit of a partition's batch took, its fsync included (written only, under storage.sync = interval)."
)

func newSyncMetrics() *syncMetrics {
	return &syncMetrics{
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    syncBatchName,
			Help:    syncBatchHelp,
			Buckets: prometheus.ExponentialBuckets(1, 4, 9), // 1 .. 65536
		}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    syncLatencyName,
			Help:    syncLatencyHelp,
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16), // 50 µs .. 1.6 s
		}),
	}
}

// observe is the broker's OnSync hook. Histogram observations are atomic
// adds, so it never blocks a syncer.
func (m *syncMetrics) observe(records int, took time.Duration) {
	m.batch.Observe(float64(records))
	m.latency.Observe(took.Seconds())
}

// sinewFamilies lists every sinew_* family /metrics can serve, with its
// help, in table order. docs/operations.md lists the same (a test keeps
// them in step).
func sinewFamilies() []struct{ name, help string } {
	var out []struct{ name, help string }
	add := func(name, help string) { out = append(out, struct{ name, help string }{name, help}) }
	for _, m := range statMetrics {
		add(m.name, m.help)
	}
	for _, m := range brokerMetrics {
		add(m.name, m.help)
	}
	for _, q := range queueGauges {
		add(q.name, q.help)
	}
	add(syncBatchName, syncBatchHelp)
	add(syncLatencyName, syncLatencyHelp)
	add(adminAuthName, adminAuthHelp)
	add(tlsReloadsName, tlsReloadsHelp)
	add(tlsFailuresName, tlsFailuresHelp)
	for _, m := range clusternode.Metrics() {
		add(m.Name, m.Help)
	}
	for _, m := range budgetMetrics {
		add(m.name, m.help)
	}
	add(cohortPlansName, cohortPlansHelp)
	add(cohortMovedName, cohortMovedHelp)
	add(cohortPausedName, cohortPausedHelp)
	add(cohortMembersName, cohortMembersHelp)
	return out
}
