package main

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sinewmq/sinew/internal/admin"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/server"
)

// statMetric is one sample read from the server's counters at scrape time.
type statMetric struct {
	name, help string
	typ        prometheus.ValueType
	labels     []string // label names; values come from value's order
	values     func(st *server.Stats) []labeled
}

// labeled is one sample of a family: its label values and its value.
type labeled struct {
	labels []string
	v      float64
}

func one(v float64) []labeled { return []labeled{{v: v}} }

// statMetrics lists every metric that reads server.Stats. The counters live in
// the server and the session registry as atomics; this table only names them,
// so a scrape costs one Stats call and no locks on the hot paths.
var statMetrics = []statMetric{
	gauge("sinew_connections_open", "Open client connections.", func(st *server.Stats) float64 { return float64(st.ConnectionsOpen) }),
	counter("sinew_connections_accepted_total", "Client connections accepted.", func(st *server.Stats) uint64 { return st.ConnectionsAccepted }),
	counter("sinew_connections_rejected_total", "Connections refused at a connection limit (total, per source address or handshakes in progress).", func(st *server.Stats) uint64 { return st.ConnectionsRejected }),
	{
		name: "sinew_limit_refusals_total", help: "Requests and connections a limit refused, by limit: connections_max, connections_per_address_max, handshakes_max (refused with too_many_connections), handshake_timeout_ms (closed with handshake_timeout), subscriptions_max (refused with limit_exceeded).",
		typ: prometheus.CounterValue, labels: []string{"limit"},
		values: func(st *server.Stats) []labeled {
			r := &st.Refused
			return []labeled{
				{[]string{"connections_max"}, float64(r.Connections)},
				{[]string{"connections_per_address_max"}, float64(r.ConnectionsPerAddress)},
				{[]string{"handshakes_max"}, float64(r.Handshakes)},
				{[]string{"handshake_timeout_ms"}, float64(r.HandshakeTimeouts)},
				{[]string{"subscriptions_max"}, float64(st.Sessions.SubscriptionsRefused)},
			}
		},
	},
	counter("sinew_frames_in_total", "Frames read from clients.", func(st *server.Stats) uint64 { return st.FramesIn }),
	counter("sinew_frames_out_total", "Frames written to clients.", func(st *server.Stats) uint64 { return st.FramesOut }),
	counter("sinew_publishes_total", "Publish requests received.", func(st *server.Stats) uint64 { return st.Publishes }),
	counter("sinew_publish_errors_total", "Publishes answered with an error.", func(st *server.Stats) uint64 { return st.PublishErrors }),
	counter("sinew_publish_confirms_total", "Publishes stored durably and confirmed (PUBLISH_OK sent, or due when the publish asked for no reply).", func(st *server.Stats) uint64 { return st.PublishConfirms }),
	gauge("sinew_publishes_inflight", "Publishes awaiting their confirm.", func(st *server.Stats) float64 { return float64(st.PublishesInflight) }),
	counter("sinew_settles_total", "Delivery tags settled by clients.", func(st *server.Stats) uint64 { return st.Settles }),
	counter("sinew_request_errors_total", "Requests answered with an ERROR.", func(st *server.Stats) uint64 { return st.RequestErrors }),
	counter("sinew_fatal_errors_total", "Connections closed for a protocol violation or timeout.", func(st *server.Stats) uint64 { return st.FatalErrors }),
	counter("sinew_auth_failures_total", "HELLOs refused with auth_failed.", func(st *server.Stats) uint64 { return st.AuthFailures }),
	counter("sinew_permission_denials_total", "Requests refused with permission_denied.", func(st *server.Stats) uint64 { return st.PermissionDenials }),
	counter("sinew_reader_pauses_total", "Times a connection reader paused for backpressure.", func(st *server.Stats) uint64 { return st.ReaderPauses }),
	gauge("sinew_sessions", "Live sessions, attached or dormant.", func(st *server.Stats) float64 { return float64(st.Sessions.Sessions) }),
	gauge("sinew_sessions_dormant", "Sessions waiting out their reconnect grace.", func(st *server.Stats) float64 { return float64(st.Sessions.Dormant) }),
	{
		name: "sinew_sessions_by_state", help: "Live sessions by state: attached (a connection serves it) or dormant (waiting out its reconnect grace).",
		typ: prometheus.GaugeValue, labels: []string{"state"},
		values: func(st *server.Stats) []labeled {
			ss := &st.Sessions
			return []labeled{{[]string{"attached"}, float64(ss.Sessions - ss.Dormant)}, {[]string{"dormant"}, float64(ss.Dormant)}}
		},
	},
	counter("sinew_sessions_resumed_total", "Resumes accepted.", func(st *server.Stats) uint64 { return st.Sessions.Resumed }),
	counter("sinew_sessions_resume_rejected_total", "Resumes refused.", func(st *server.Stats) uint64 { return st.Sessions.ResumeRejected }),
	counter("sinew_sessions_grace_expired_total", "Sessions cleaned up when their grace ran out.", func(st *server.Stats) uint64 { return st.Sessions.GraceExpired }),
	counter("sinew_sessions_requeued_total", "Leases handed back by session cleanup.", func(st *server.Stats) uint64 { return st.Sessions.Requeued }),
	counter("sinew_sessions_resent_total", "Unsettled deliveries sent again after a resume.", func(st *server.Stats) uint64 { return st.Sessions.Resent }),
	counter("sinew_writer_pauses_total", "Times a connection's outbound queue reached limits.outbound_bytes_max and its deliveries paused.", func(st *server.Stats) uint64 { return st.WriterPauses }),
	counter("sinew_slow_consumers_total", "Connections closed with slow_consumer.", func(st *server.Stats) uint64 { return st.SlowConsumers }),
	counter("sinew_sessions_dormant_capped_total", "Disconnects that ended the session at once because limits.dormant_sessions_max sessions were dormant.", func(st *server.Stats) uint64 { return st.Sessions.DormantCapped }),
	counter("sinew_sessions_dormant_paused_total", "Times a dormant session's buffer reached its byte limit and paused its deliveries.", func(st *server.Stats) uint64 { return st.Sessions.DormantPaused }),
	counter("sinew_sessions_resend_unkept_total", "Deliveries not kept for re-send after a resume because limits.resend_bytes_max was reached.", func(st *server.Stats) uint64 { return st.Sessions.ResendUnkept }),

	// Reconnect and reconciliation.
	{
		name: "sinew_session_resumes_total", help: "HELLOs that offered a resume identity, by outcome: resumed, not_found (unknown or expired session), rejected (wrong token or another broker's identity).",
		typ: prometheus.CounterValue, labels: []string{"outcome"},
		values: func(st *server.Stats) []labeled {
			ss := &st.Sessions
			return []labeled{
				{[]string{"resumed"}, float64(ss.Resumed)},
				{[]string{"not_found"}, float64(ss.ResumeNotFound)},
				{[]string{"rejected"}, float64(ss.ResumeRejected)},
			}
		},
	},
	counter("sinew_sessions_grace_entered_total", "Disconnects that left the session dormant for its reconnect grace.", func(st *server.Stats) uint64 { return st.Sessions.GraceEntered }),
	counter("sinew_sessions_grace_requeued_total", "Leases handed back to their queue because a session's grace ran out.", func(st *server.Stats) uint64 { return st.Sessions.GraceRequeued }),
	counter("sinew_sessions_ended_total", "Sessions ended at once by their client (END_SESSION).", func(st *server.Stats) uint64 { return st.Sessions.SessionsEnded }),
	counter("sinew_sessions_restored_total", "Sessions restored from the session store at startup, waiting for their clients for connection.restart_grace_ms.", func(st *server.Stats) uint64 { return st.Sessions.Restored }),
	counter("sinew_sessions_resumed_after_restart_total", "Restored sessions resumed by their clients within the restart window.", func(st *server.Stats) uint64 { return st.Sessions.ResumedAfterRestart }),
	counter("sinew_sessions_restart_expired_total", "Restored sessions cleaned up because the restart window ended before their clients came back.", func(st *server.Stats) uint64 { return st.Sessions.RestartExpired }),
	counter("sinew_leases_reclaimed_total", "Leases found in the log at startup that restored sessions took back.", func(st *server.Stats) uint64 { return st.Sessions.LeasesReclaimed }),
	counter("sinew_leases_restart_released_total", "Leases of restored sessions released when the restart window ended.", func(st *server.Stats) uint64 { return st.Sessions.RestartReleased }),
	counter("sinew_session_store_errors_total", "Session store writes that failed; a restart may not restore those sessions as they were.", func(st *server.Stats) uint64 { return st.Sessions.StoreErrors }),
	{
		name: "sinew_reconcile_actions_total", help: "Subscription reconciliation decisions after a resume (RECONCILE_RESULT entries), by action.",
		typ: prometheus.CounterValue, labels: []string{"action"},
		values: func(st *server.Stats) []labeled {
			ss := &st.Sessions
			return []labeled{
				{[]string{"keep"}, float64(ss.ReconcileKeep)},
				{[]string{"close_client_side"}, float64(ss.ReconcileCloseClient)},
				{[]string{"close_server_side"}, float64(ss.ReconcileCloseServer)},
				{[]string{"recreate_client"}, float64(ss.ReconcileRecreate)},
			}
		},
	},
	{
		name: "sinew_inflight_reconcile_total", help: "Deliveries in inflight reconciliation after a resume (INFLIGHT_RESULT), by action: resent, stale, kept.",
		typ: prometheus.CounterValue, labels: []string{"action"},
		values: func(st *server.Stats) []labeled {
			ss := &st.Sessions
			return []labeled{
				{[]string{"resent"}, float64(ss.InflightResent)},
				{[]string{"stale"}, float64(ss.InflightStale)},
				{[]string{"kept"}, float64(ss.InflightKept)},
			}
		},
	},
	counter("sinew_late_settles_accepted_total", "Late settles applied: of a delivery made before the session's latest resume, of a lease that ended unsettled and was not leased again, or named only by its lease reference.", func(st *server.Stats) uint64 { return st.Sessions.LateSettleAccepted }),
	{
		name: "sinew_late_settles_rejected_total", help: "Late settles refused, by reason: stale_lease (the lease ended and the message was leased again or settled by another), unknown_tag, other.",
		typ: prometheus.CounterValue, labels: []string{"reason"},
		values: func(st *server.Stats) []labeled {
			ss := &st.Sessions
			return []labeled{
				{[]string{"stale_lease"}, float64(ss.LateSettleStale)},
				{[]string{"unknown_tag"}, float64(ss.LateSettleUnknownTag)},
				{[]string{"other"}, float64(ss.LateSettleOther)},
			}
		},
	},
	counter("sinew_settles_repeated_total", "Settles answered with their earlier outcome: the same settle of the same lease sent again.", func(st *server.Stats) uint64 { return st.Sessions.SettleRepeated }),
}

func gauge(name, help string, v func(*server.Stats) float64) statMetric {
	return statMetric{name: name, help: help, typ: prometheus.GaugeValue, values: func(st *server.Stats) []labeled { return one(v(st)) }}
}

func counter(name, help string, v func(*server.Stats) uint64) statMetric {
	return statMetric{name: name, help: help, typ: prometheus.CounterValue, values: func(st *server.Stats) []labeled { return one(float64(v(st))) }}
}

// queueGauges are per-partition gauges and counters read from broker.Stats.
var queueGauges = []struct {
	name, help string
	v          func(p *broker.PartitionStats) float64
	typ        prometheus.ValueType
}{
	{"sinew_queue_ready", "Messages ready for delivery.", func(p *broker.PartitionStats) float64 { return float64(p.Ready) }, prometheus.GaugeValue},
	{"sinew_queue_delayed", "Messages waiting for their delay.", func(p *broker.PartitionStats) float64 { return float64(p.Delayed) }, prometheus.GaugeValue},
	{"sinew_queue_inflight", "Messages leased to consumers.", func(p *broker.PartitionStats) float64 { return float64(p.Inflight) }, prometheus.GaugeValue},
	{"sinew_queue_consumers", "Subscriptions attached.", func(p *broker.PartitionStats) float64 { return float64(p.Consumers) }, prometheus.GaugeValue},
	{"sinew_queue_bytes_on_disk", "Bytes of the partition's log segments on disk.", func(p *broker.PartitionStats) float64 { return float64(p.BytesOnDisk) }, prometheus.GaugeValue},
	{"sinew_queue_dedup_producers", "Producers whose sequences the partition's deduplication window remembers.",
		func(p *broker.PartitionStats) float64 { return float64(p.DedupProducers) }, prometheus.GaugeValue},
	{"sinew_queue_dedup_evicted_idle_total", "Producers the deduplication window forgot after their idle time, since the partition opened.",
		func(p *broker.PartitionStats) float64 { return float64(p.DedupEvictedIdle) }, prometheus.CounterValue},
	{"sinew_queue_dedup_evicted_limit_total", "Producers the deduplication window forgot to stay within its producer or entry bound, since the partition opened.",
		func(p *broker.PartitionStats) float64 { return float64(p.DedupEvictedLimit) }, prometheus.CounterValue},
	{"sinew_queue_publish_duplicates_total", "Publishes answered with the offset of an earlier store of the same producer sequence, since the partition opened.",
		func(p *broker.PartitionStats) float64 { return float64(p.Duplicates) }, prometheus.CounterValue},
}

var queueLabels = []string{"topic", "group", "partition"}

// depthGauges are the queueGauges that metrics.queue_depth = off leaves out:
// the per-partition depth, which costs one series per partition. The
// deduplication counters stay, since no broker-wide family replaces them.
var depthGauges = map[string]bool{
	"sinew_queue_ready": true, "sinew_queue_delayed": true, "sinew_queue_inflight": true,
	"sinew_queue_consumers": true, "sinew_queue_bytes_on_disk": true,
}

// statsCollector exports the broker's and server's counters at scrape time.
type statsCollector struct {
	b          *broker.Broker
	srv        *server.Server // nil exports no server metrics
	queueDepth bool           // export depthGauges
	descs      []*prometheus.Desc
	bdesc      []*prometheus.Desc
	qdesc      []*prometheus.Desc
}

func newStatsCollector(b *broker.Broker, srv *server.Server, queueDepth bool) *statsCollector {
	c := &statsCollector{b: b, srv: srv, queueDepth: queueDepth}
	for _, m := range statMetrics {
		c.descs = append(c.descs, prometheus.NewDesc(m.name, m.help, m.labels, nil))
	}
	for _, m := range brokerMetrics {
		c.bdesc = append(c.bdesc, prometheus.NewDesc(m.name, m.help, m.labels, nil))
	}
	for _, q := range queueGauges {
		c.qdesc = append(c.qdesc, prometheus.NewDesc(q.name, q.help, queueLabels, nil))
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
	for _, d := range c.bdesc {
		ch <- d
	}
	for i, d := range c.qdesc {
		if c.queueDepth || !depthGauges[queueGauges[i].name] {
			ch <- d
		}
	}
}

// Collect implements prometheus.Collector.
func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	if c.srv != nil {
		st := c.srv.Stats()
		for i, m := range statMetrics {
			for _, s := range m.values(&st) {
				ch <- prometheus.MustNewConstMetric(c.descs[i], m.typ, s.v, s.labels...)
			}
		}
	}
	bs := c.b.Stats()
	in := brokerInput{c: c.b.Counters(), stats: &bs}
	for i, m := range brokerMetrics {
		for _, s := range m.values(&in) {
			ch <- prometheus.MustNewConstMetric(c.bdesc[i], m.typ, s.v, s.labels...)
		}
	}
	for _, q := range bs.Queues {
		for pi := range q.Partitions {
			p := &q.Partitions[pi]
			part := strconv.FormatUint(uint64(p.Partition), 10)
			for i, g := range queueGauges {
				if !c.queueDepth && depthGauges[g.name] {
					continue
				}
				ch <- prometheus.MustNewConstMetric(c.qdesc[i], g.typ, g.v(p), q.Topic, q.Group, part)
			}
		}
	}
}

// metricsRegistry is what /metrics serves: the broker's and server's
// counters, the fsync histograms (sm, nil for none), and the Go runtime's and
// process's standard metrics. Each serve builds its own, so two brokers in
// one process never share a series.
func metricsRegistry(b *broker.Broker, srv *server.Server, sm *syncMetrics, queueDepth bool, gate *admin.Gate, tlsr tlsReloaders) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newStatsCollector(b, srv, queueDepth), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		tlsCollector{tlsr})
	if gate != nil {
		reg.MustRegister(gateCollector{gate})
	}
	if b != nil {
		reg.MustRegister(budgetCollector{b}, cohortCollector{b})
	}
	if sm != nil {
		reg.MustRegister(sm.batch, sm.latency)
	}
	return reg
}

// The admin listener's authentication refusals.
const (
	adminAuthName = "sinew_admin_auth_refusals_total"
	adminAuthHelp = "Admin HTTP requests the authentication gate refused, by reason: missing (no credentials, 401), failed (wrong credentials, 401 after the fixed delay), denied (a user who may not administer, 403), busy (too many credential checks at once, or a password check that found no hash slot in time, 429), host (a Host header that is not a loopback name on a loopback listener that serves requests without credentials, 403)."
)

var adminAuthDesc = prometheus.NewDesc(adminAuthName, adminAuthHelp, []string{"reason"}, nil)

// gateCollector exports the admin gate's counters at scrape time.
type gateCollector struct{ g *admin.Gate }

// Describe implements prometheus.Collector.
func (c gateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- adminAuthDesc }

// Collect implements prometheus.Collector.
func (c gateCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.g.Stats()
	for _, s := range []struct {
		reason string
		v      uint64
	}{{"missing", st.Missing}, {"failed", st.Failed}, {"denied", st.Denied}, {"busy", st.Busy}, {"host", st.Host}} {
		ch <- prometheus.MustNewConstMetric(adminAuthDesc, prometheus.CounterValue, float64(s.v), s.reason)
	}
}
