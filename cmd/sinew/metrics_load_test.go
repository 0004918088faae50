package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
	"github.com/sinewmq/sinew/protocol"
)

// loadMessages is the size of the load in TestMetricsMoveUnderLoad.
const loadMessages = 300

// Every sinew_* family is registered (it has a TYPE in the exposition), and
// under a load that publishes, delivers, acks, nacks, fails, lets leases
// expire, lets messages expire, exhausts retries and cuts a socket, every
// family that such a load can reach moves. The ones it cannot reach are
// listed with the reason.
func TestMetricsMoveUnderLoad(t *testing.T) {
	timers := make(chan graceTimer, 64)
	serveAfterFunc = func(d time.Duration, f func()) func() bool {
		timers <- graceTimer{d, f}
		return func() bool { return true }
	}
	t.Cleanup(func() { serveAfterFunc = nil })
	// A cluster of one, so that the cluster families are served too.
	cfg := testServeConfig(t)
	cfg.Cluster.Enabled, cfg.Cluster.GossipListen, cfg.Cluster.PeerListen = true, "127.0.0.1:0", "127.0.0.1:0"
	addr, adminAddr, _ := runServeAdmin(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeoutMs*time.Millisecond)
	defer cancel()
	before, _ := scrape(t, adminAddr)

	c, err := sinew.Dial(ctx, addr, sinew.WithClientName("metrics-load"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, q := range []struct {
		topic string
		cfg   sinew.QueueConfig
	}{
		{"load", sinew.QueueConfig{Partitions: 2, MaxRetries: 3}},
		{"exhaust", sinew.QueueConfig{MaxRetries: sinew.RetriesNone}},
		{"lease", sinew.QueueConfig{Lease: time.Millisecond}},
		{"ttl", sinew.QueueConfig{}},
		{"cohort", sinew.QueueConfig{}},
	} {
		if _, err := c.DeclareQueue(ctx, q.topic, q.cfg); err != nil {
			t.Fatalf("declare %s: %v", q.topic, err)
		}
	}
	futures := make([]*sinew.PublishFuture, 0, loadMessages)
	for i := range loadMessages {
		futures = append(futures, c.PublishAsync(ctx, "load", []byte(fmt.Sprintf("m%d", i))))
	}
	for _, f := range futures {
		if _, err := f.Wait(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Ack most, fail every tenth, nack every tenth once.
	sub, err := c.Subscribe(ctx, "load", sinew.WithPrefetch(50))
	if err != nil {
		t.Fatal(err)
	}
	for settled := 0; settled < loadMessages; {
		m := nextMessage(t, sub)
		var n int
		fmt.Sscanf(string(m.Body), "m%d", &n)
		switch {
		case n%10 == 0:
			err = m.Fail(ctx)
			settled++
		case n%10 == 1 && m.Attempt == 1:
			err = m.Retry(ctx)
		default:
			err = m.Complete(ctx)
			settled++
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// Retries exhausted: a NACK on a queue without retries.
	if _, err := c.PublishText(ctx, "exhaust", "x"); err != nil {
		t.Fatal(err)
	}
	ex, err := c.Subscribe(ctx, "exhaust")
	if err != nil {
		t.Fatal(err)
	}
	if err := nextMessage(t, ex).Retry(ctx); err != nil {
		t.Fatal(err)
	}
	// A lease of 1 ms expires; the redelivery is acked.
	if _, err := c.PublishText(ctx, "lease", "x"); err != nil {
		t.Fatal(err)
	}
	// Not waited for: a 1 ms lease can expire before its delivery is
	// released (then it is not sent), and again on every redelivery while
	// fsyncs take longer than that; either way the expiry is counted.
	if _, err := c.Subscribe(ctx, "lease", sinew.WithPrefetch(1)); err != nil {
		t.Fatal(err)
	}
	// A cohort member: the per-cohort gauges get their series.
	if _, err := c.Subscribe(ctx, "cohort", sinew.WithCohort("billing")); err != nil {
		t.Fatal(err)
	}
	// A message with a 1 ms TTL and no consumer expires.
	if _, err := c.PublishText(ctx, "ttl", "x", sinew.WithTTL(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	// A cut socket leaves a dormant session.
	nc, _ := hello(t, addr, protocol.ResumeIdentity{})
	nc.Close()
	<-timers

	var after map[string]float64
	var types map[string]string
	apiPoll(t, "lease expiry and TTL expiry counted", func() bool {
		after, types = scrape(t, adminAddr)
		return after["sinew_lease_expiries_total"] > 0 && after[`sinew_dead_lettered_total{reason="expired"}`] > 0
	})

	for _, f := range sinewFamilies() {
		if types[f.name] == "" {
			t.Errorf("%s is not registered (no TYPE in /metrics)", f.name)
		}
	}
	// Families this load cannot move, and why.
	still := map[string]string{
		"sinew_connections_rejected_total":           "needs limits.connections_max reached",
		"sinew_admin_auth_refusals_total":            "needs an admin request without valid credentials (TestServeAdminAuthTokens)",
		"sinew_tls_reloads_total":                    "needs TLS and a certificate reload (TestServeTLSReloadKeepsConnections)",
		"sinew_tls_handshake_failures_total":         "needs TLS and a refused handshake (TestServeMutualTLSBothListeners)",
		"sinew_limit_refusals_total":                 "needs a connection or subscription limit reached (internal/server TestLimit*)",
		"sinew_publish_errors_total":                 "needs a refused publish",
		"sinew_fatal_errors_total":                   "needs a protocol violation",
		"sinew_auth_failures_total":                  "needs a refused HELLO (TestServeUserLoginAndCLI)",
		"sinew_permission_denials_total":             "needs a user without a permission (TestAdminUserLifecycle)",
		"sinew_request_errors_total":                 "needs a refused request",
		"sinew_reader_pauses_total":                  "needs limits.publish_inflight_max reached",
		"sinew_writer_pauses_total":                  "needs limits.outbound_bytes_max reached",
		"sinew_slow_consumers_total":                 "needs a client that stops reading",
		"sinew_sessions_resume_rejected_total":       "needs a resume with a wrong token (TestMetricsNamesAndReconnectCounters)",
		"sinew_sessions_grace_expired_total":         "grace timers are faked here (TestMetricsNamesAndReconnectCounters fires one)",
		"sinew_sessions_requeued_total":              "needs a session cleanup holding leases",
		"sinew_sessions_resent_total":                "needs a resume (TestMetricsNamesAndReconnectCounters)",
		"sinew_sessions_resumed_total":               "needs a resume (TestMetricsNamesAndReconnectCounters)",
		"sinew_sessions_dormant_capped_total":        "needs limits.dormant_sessions_max reached",
		"sinew_sessions_dormant_paused_total":        "needs a full dormant buffer",
		"sinew_sessions_resend_unkept_total":         "needs limits.resend_bytes_max reached",
		"sinew_sessions_grace_requeued_total":        "grace timers are faked here",
		"sinew_sessions_ended_total":                 "needs END_SESSION",
		"sinew_reconcile_actions_total":              "needs a RECONCILE after a resume",
		"sinew_inflight_reconcile_total":             "needs an INFLIGHT after a resume",
		"sinew_late_settles_accepted_total":          "needs a settle after a resume",
		"sinew_late_settles_rejected_total":          "needs a stale settle (TestMetricsNamesAndReconnectCounters)",
		"sinew_settles_repeated_total":               "needs a repeated settle (TestMetricsNamesAndReconnectCounters)",
		"sinew_session_resumes_total":                "needs a resume (TestMetricsNamesAndReconnectCounters)",
		"sinew_leases_released_total":                "needs a consumer that goes away holding leases",
		"sinew_lease_extensions_total":               "needs an EXTEND (test/e2e TestExtendKeepsLeaseOnRealBroker)",
		"sinew_messages_purged_total":                "needs a purge (TestAdminAPI)",
		"sinew_queue_dedup_evicted_idle_total":       "needs a producer idle past its window",
		"sinew_queue_dedup_evicted_limit_total":      "needs more producers than the window holds",
		"sinew_queue_publish_duplicates_total":       "needs a resent publish",
		"sinew_publishes_inflight":                   "a gauge that is back at 0 once every confirm arrived",
		"sinew_sessions_restored_total":              "needs a restart (test/e2e TestRestartKeepsConsumerLease)",
		"sinew_sessions_resumed_after_restart_total": "needs a restart",
		"sinew_sessions_restart_expired_total":       "needs a restart whose clients do not come back",
		"sinew_leases_reclaimed_total":               "needs a restart with leases held",
		"sinew_leases_restart_released_total":        "needs a restart whose clients do not come back",
		"sinew_session_store_errors_total":           "needs a failing session store",
		"sinew_cluster_nodes":                        "needs other cluster nodes (test/e2e TestClusterNodesFindEachOtherLeaveAndDie)",
		"sinew_cluster_fenced":                       "needs other cluster nodes, dead (test/e2e TestClusterNodesFindEachOtherLeaveAndDie)",
		"sinew_queues_under_replicated":              "moves while a cluster grows a queue (internal/controller TestRecoveryPlanGrowsAQueueToTheReplicationFactor counts it; test/e2e TestClusterQueueCreatedWhileFormingGrowsToThreeReplicas sees it at 0 after)",
		"sinew_controller_leader":                    "settled at start: a node alone leads from its first moment (test/e2e TestClusterControllerGroup)",
		"sinew_controller_has_leader":                "settled at start (test/e2e TestClusterControllerGroup)",
		"sinew_controller_term":                      "moves with controller elections (test/e2e TestClusterControllerGroup)",
		"sinew_controller_members":                   "moves with nodes joining and leaving (test/e2e TestClusterControllerGroup)",
		"sinew_raft_messages_dropped_total":          "needs a cluster whose raft queues overflow",
		"sinew_memory_budget_bytes":                  "a configured limit (TestMemoryBudgetsServed)",
		"sinew_memory_budget_evicted_bytes_total":    "needs a full budget (internal/partition TestPartitionsShareBodyBudget)",
		"sinew_cohort_plans_total":                   "a cluster node counts the committed plans after the first (TestCohortMetrics counts a single node's)",
		"sinew_cohort_partitions_moved_total":        "0 on a cluster node, where the controller plans (TestCohortMetrics counts a single node's)",
	}
	for _, f := range sinewFamilies() {
		if _, ok := still[f.name]; ok {
			continue
		}
		if !moved(before, after, f.name) {
			t.Errorf("%s did not move under load", f.name)
		}
	}
	for series, minimum := range map[string]float64{
		"sinew_publish_confirms_total":                          loadMessages + 3,
		"sinew_acks_total":                                      loadMessages - loadMessages/10,
		"sinew_nacks_total":                                     loadMessages / 10, // the NACK on exhaust dead-letters instead
		"sinew_fails_total":                                     loadMessages / 10,
		"sinew_redeliveries_total":                              loadMessages / 10,
		"sinew_deliveries_total":                                loadMessages + loadMessages/10 + 2,
		`sinew_dead_lettered_total{reason="failed"}`:            loadMessages / 10,
		`sinew_dead_lettered_total{reason="retries_exhausted"}`: 1,
		`sinew_sessions_by_state{state="dormant"}`:              1,
		"sinew_fsync_batch_records_count":                       1,
	} {
		if after[series] < minimum {
			t.Errorf("%s = %v, want at least %v", series, after[series], minimum)
		}
	}
}

// moved reports whether any series of family name differs between two
// scrapes, or appeared in the second.
func moved(before, after map[string]float64, name string) bool {
	for series, v := range after {
		base, _, _ := strings.Cut(series, "{")
		base = strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(base, "_bucket"), "_sum"), "_count")
		if base != name {
			continue
		}
		if old, ok := before[series]; !ok || old != v {
			return true
		}
	}
	return false
}

// metrics.queue_depth = off leaves out the per-partition depth gauges and
// keeps the rest, the per-partition deduplication counters included.
func TestMetricsQueueDepthOff(t *testing.T) {
	cfg := testServeConfig(t)
	cfg.Metrics.QueueDepth = "off"
	addr, adminAddr, _ := runServeAdmin(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), safetyTimeoutMs*time.Millisecond)
	defer cancel()
	c, err := sinew.Dial(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.PublishText(ctx, "depth", "x"); err != nil {
		t.Fatal(err)
	}
	_, types := scrape(t, adminAddr)
	for name := range depthGauges {
		if types[name] != "" {
			t.Errorf("%s served with metrics.queue_depth = off", name)
		}
	}
	for _, name := range []string{"sinew_queue_dedup_producers", "sinew_acks_total", "sinew_bytes_on_disk", "sinew_fsync_duration_seconds"} {
		if types[name] == "" {
			t.Errorf("%s missing with metrics.queue_depth = off", name)
		}
	}
}

// log_format = json writes one JSON object per record.
func TestLogFormatJSON(t *testing.T) {
	var b strings.Builder
	newLogger(&b, "json", slog.LevelInfo).Info("session entered grace", "client_id", "c-1", "conn_id", 7)
	var rec map[string]any
	if err := json.Unmarshal([]byte(b.String()), &rec); err != nil || rec["msg"] != "session entered grace" || rec["client_id"] != "c-1" || rec["conn_id"] != float64(7) {
		t.Fatalf("json log line %q: %v %v", b.String(), rec, err)
	}
	b.Reset()
	newLogger(&b, "text", slog.LevelInfo).Info("x", "client_id", "c-1")
	if !strings.Contains(b.String(), `msg=x client_id=c-1`) {
		t.Fatalf("text log line %q", b.String())
	}
}

// nextMessage is the subscription's next delivery, failing the test rather
// than hanging when none comes within the safety timeout.
func nextMessage(t *testing.T, sub *sinew.Subscription) *sinew.Message {
	t.Helper()
	select {
	case m, ok := <-sub.Messages():
		if !ok {
			t.Fatalf("subscription closed: %v", sub.Err())
		}
		return m
	case <-time.After(safetyTimeoutMs * time.Millisecond):
		t.Fatal("no delivery within the safety timeout")
		return nil
	}
}
