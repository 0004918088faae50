package admin

import (
	"net/http"

	"github.com/sinewmq/sinew/internal/partition"
)

// OverviewView is the JSON of GET /api/v1/overview.
type OverviewView struct {
	Version     string   `json:"version"`
	API         string   `json:"api"`
	OwnerID     string   `json:"owner_id"`
	Generation  uint64   `json:"generation"`
	StartedAtMs int64    `json:"started_at_ms"`
	UptimeMs    int64    `json:"uptime_ms"`
	Ready       bool     `json:"ready"`
	Problems    []string `json:"problems"`
	Draining    bool     `json:"draining"`
	Queues      int      `json:"queues"`
	Partitions  int      `json:"partitions"`
	Totals      Totals   `json:"totals"`
	// Counters are monotonic since the process started, by the names
	// docs/operations.md lists; a counter this handler cannot read (no
	// server, say) is absent.
	Counters map[string]uint64 `json:"counters"`
	// DeadLetteredByReason splits counters.dead_lettered.
	DeadLetteredByReason map[string]uint64 `json:"dead_lettered_by_reason"`
	// Budgets are the node-wide memory budgets by name (body_cache,
	// raft_cache): their limit and what the partitions' caches use now.
	Budgets map[string]BudgetView `json:"budgets"`
}

// BudgetView is one node-wide memory budget in the overview.
type BudgetView struct {
	LimitBytes   int64 `json:"limit_bytes"`
	UsedBytes    int64 `json:"used_bytes"`
	EvictedBytes int64 `json:"evicted_bytes"`
}

// Totals are gauges summed over the broker, read now.
type Totals struct {
	Ready            int   `json:"ready"`
	Delayed          int   `json:"delayed"`
	Inflight         int   `json:"inflight"`
	DeadLettering    int   `json:"dead_lettering"`
	Consumers        int   `json:"consumers"`
	BytesOnDisk      int64 `json:"bytes_on_disk"`
	ConnectionsOpen  int   `json:"connections_open"`
	Sessions         int   `json:"sessions"`
	SessionsAttached int   `json:"sessions_attached"`
	SessionsDormant  int   `json:"sessions_dormant"`
	Subscriptions    int   `json:"subscriptions"`
}

func (a *api) overview(w http.ResponseWriter, _ *http.Request) {
	now := a.cfg.Now()
	v := OverviewView{Version: a.cfg.Version, API: APIVersion, OwnerID: a.cfg.OwnerID, Problems: []string{},
		Counters: map[string]uint64{}, DeadLetteredByReason: map[string]uint64{}, Budgets: map[string]BudgetView{}}
	if !a.cfg.StartedAt.IsZero() {
		v.StartedAtMs = a.cfg.StartedAt.UnixMilli()
		v.UptimeMs = now.Sub(a.cfg.StartedAt).Milliseconds()
	}
	v.Ready = a.cfg.Ready != nil && a.cfg.Ready()
	if p := a.problems(); len(p) > 0 {
		v.Problems = p
	}
	if b := a.cfg.Broker; b != nil {
		bs := b.Stats()
		v.Queues, v.Totals.Subscriptions = len(bs.Queues), bs.Subscriptions
		for _, q := range bs.Queues {
			for _, p := range q.Partitions {
				v.Partitions++
				v.Totals.Ready += p.Ready
				v.Totals.Delayed += p.Delayed
				v.Totals.Inflight += p.Inflight
				v.Totals.DeadLettering += p.DeadLettering
				v.Totals.Consumers += p.Consumers
				v.Totals.BytesOnDisk += p.BytesOnDisk
			}
		}
		for _, s := range b.Budgets() {
			v.Budgets[s.Name] = BudgetView{LimitBytes: s.Limit, UsedBytes: s.Used, EvictedBytes: s.Evicted}
		}
		c := b.Counters()
		var dead uint64
		for _, r := range partition.DeadLetterReasons {
			n := c.DeadLetteredBy(r)
			v.DeadLetteredByReason[r.String()] = n
			dead += n
		}
		for k, n := range map[string]uint64{
			"appended": c.Appended.Load(), "deliveries": c.Deliveries.Load(), "redeliveries": c.Redeliveries.Load(),
			"acks": c.Acks.Load(), "nacks": c.Nacks.Load(), "fails": c.Fails.Load(), "lease_expiries": c.LeaseExpiries.Load(),
			"released": c.Released.Load(), "purged": c.Purged.Load(), "dead_lettered": dead,
		} {
			v.Counters[k] = n
		}
	}
	if s := a.cfg.Server; s != nil {
		v.Generation, v.Draining = s.Generation(), s.Draining()
		st := s.Stats()
		ss := &st.Sessions
		v.Totals.ConnectionsOpen = st.ConnectionsOpen
		v.Totals.Sessions, v.Totals.SessionsDormant = ss.Sessions, ss.Dormant
		v.Totals.SessionsAttached = ss.Sessions - ss.Dormant
		for k, n := range map[string]uint64{
			"publishes": st.Publishes, "publish_errors": st.PublishErrors, "confirms": st.PublishConfirms, "settles": st.Settles,
			"connections_accepted": st.ConnectionsAccepted, "connections_rejected": st.ConnectionsRejected,
			"resumes_resumed": ss.Resumed, "resumes_not_found": ss.ResumeNotFound, "resumes_rejected": ss.ResumeRejected,
			"grace_entered": ss.GraceEntered, "grace_expired": ss.GraceExpired, "grace_requeued": ss.GraceRequeued,
			"sessions_ended": ss.SessionsEnded,
			"reconcile_keep": ss.ReconcileKeep, "reconcile_close_client_side": ss.ReconcileCloseClient,
			"reconcile_close_server_side": ss.ReconcileCloseServer, "reconcile_recreate_client": ss.ReconcileRecreate,
			"inflight_resent": ss.InflightResent, "inflight_stale": ss.InflightStale, "inflight_kept": ss.InflightKept,
			"late_settles_accepted": ss.LateSettleAccepted, "late_settles_stale_lease": ss.LateSettleStale,
			"late_settles_unknown_tag": ss.LateSettleUnknownTag, "late_settles_other": ss.LateSettleOther,
			"settles_repeated":  ss.SettleRepeated,
			"sessions_restored": ss.Restored, "resumed_after_restart": ss.ResumedAfterRestart,
			"restart_expired": ss.RestartExpired, "leases_reclaimed": ss.LeasesReclaimed,
			"leases_restart_released": ss.RestartReleased, "session_store_errors": ss.StoreErrors,
		} {
			v.Counters[k] = n
		}
	}
	writeJSON(w, http.StatusOK, v)
}
