package admin

import (
	"net/http"

	"github.com/sinewmq/sinew/internal/broker"
)

// CohortList is the JSON of GET /api/v1/cohorts and
// GET /api/v1/cohorts/{topic}.
type CohortList struct {
	Cohorts []CohortView `json:"cohorts"`
}

// CohortView is one cohort (consumer group) of one queue as this node sees
// it (broker.Broker.Cohorts).
type CohortView struct {
	Topic  string `json:"topic"`
	Group  string `json:"group"`
	Cohort string `json:"cohort"`
	// Members are the member ids whose subscriptions are open on this
	// node; in a cluster the other nodes serve the rest.
	Members []string `json:"members"`
	// Planner is "local" on a single node (this node plans) and
	// "controller" on a cluster node (the committed plan).
	Planner string `json:"planner"`
	// Generation and Owners are the plan: its generation (0: none yet)
	// and the member meant for each partition ("" for none).
	Generation uint64   `json:"generation"`
	Owners     []string `json:"owners"`
	// Paused counts the partitions that deliver to no member; Lag sums
	// the partitions' lag.
	Paused     int                   `json:"paused"`
	Lag        int                   `json:"lag"`
	Partitions []CohortPartitionView `json:"partitions"`
}

// CohortPartitionView is one partition of a cohort's queue.
type CohortPartitionView struct {
	Partition uint32 `json:"partition"`
	// Planned is the member the plan names ("" for none).
	Planned string `json:"planned"`
	// Held is set when the partition's gate names this cohort; Member is
	// then the member it delivers to ("" for nobody). Epoch is the
	// partition's assignment epoch.
	Held   bool   `json:"held"`
	Member string `json:"member"`
	Epoch  uint64 `json:"epoch"`
	// Paused: the partition delivers to no member of the cohort (held for
	// nobody, or not yet moved to its planned member).
	Paused bool `json:"paused"`
	// Lag is the partition's ready, delayed and inflight messages.
	Lag int `json:"lag"`
	// Owned is set when this node owns the partition, so the gate and
	// lag are the owner's; Owner is the owner's client address in a
	// cluster.
	Owned bool   `json:"owned"`
	Owner string `json:"owner,omitempty"`
}

func cohortView(c broker.CohortView) CohortView {
	v := CohortView{Topic: c.Topic, Group: c.Group, Cohort: c.Cohort, Members: c.Members, Planner: "local",
		Generation: c.Plan.Generation, Owners: c.Plan.Owners, Partitions: make([]CohortPartitionView, 0, len(c.Partitions))}
	if c.Clustered {
		v.Planner = "controller"
	}
	for _, p := range c.Partitions {
		if p.Paused {
			v.Paused++
		}
		v.Lag += p.Lag
		v.Partitions = append(v.Partitions, CohortPartitionView{Partition: p.Partition, Planned: p.Planned, Held: p.Held,
			Member: p.Member, Epoch: p.Epoch, Paused: p.Paused, Lag: p.Lag, Owned: p.Owned, Owner: p.Owner})
	}
	return v
}

func (a *api) listCohorts(w http.ResponseWriter, _ *http.Request) {
	out := CohortList{Cohorts: []CohortView{}}
	for _, c := range a.cfg.Broker.Cohorts() {
		out.Cohorts = append(out.Cohorts, cohortView(c))
	}
	writeJSON(w, http.StatusOK, out)
}

// queueCohorts lists the cohorts of one queue: 404 when the broker has no
// such queue, an empty list when it has no cohort.
func (a *api) queueCohorts(w http.ResponseWriter, r *http.Request) {
	topic, group := queueName(r)
	b := a.cfg.Broker
	if _, err := b.Config(topic, group); err != nil {
		writeBrokerError(w, err)
		return
	}
	out := CohortList{Cohorts: []CohortView{}}
	for _, c := range b.Cohorts() {
		if c.Topic == topic && c.Group == group {
			out.Cohorts = append(out.Cohorts, cohortView(c))
		}
	}
	writeJSON(w, http.StatusOK, out)
}
