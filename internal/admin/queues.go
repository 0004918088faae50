package admin

import (
	"fmt"
	"net/http"

	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/protocol"
)

// QueueList is the JSON of GET /api/v1/queues.
type QueueList struct {
	Queues []QueueView `json:"queues"`
}

// QueueView is one queue: its configuration, its state and its counts
// summed over its partitions, and each partition.
type QueueView struct {
	Topic           string          `json:"topic"`
	Group           string          `json:"group"`
	PartitionCount  int             `json:"partition_count"`
	DeadLetterQueue bool            `json:"dead_letter_queue"`
	Config          QueueConfigView `json:"config"`
	// State is the worst of its partitions' states.
	State         string `json:"state"`
	Ready         int    `json:"ready"`
	Delayed       int    `json:"delayed"`
	Inflight      int    `json:"inflight"`
	DeadLettering int    `json:"dead_lettering"`
	Consumers     int    `json:"consumers"`
	BytesOnDisk   int64  `json:"bytes_on_disk"`
	// Replication is, in a cluster, how many replicas the queue has
	// against how many it should have; absent on a single node.
	Replication *ReplicationView `json:"replication,omitempty"`
	Partitions  []PartitionView  `json:"partitions"`
}

// ReplicationView is a queue's replication in a cluster.
type ReplicationView struct {
	// Factor is how many replicas the queue should have: the replication
	// factor, capped by the cluster's nodes.
	Factor int `json:"factor"`
	// Replicas is how many nodes the placement names for it.
	Replicas int `json:"replicas"`
	// UnderReplicated is set while Replicas is below Factor, or a
	// partition's raft group (as this node applied it) does not yet vote
	// with exactly its placed replicas: the controller is adding or moving
	// one.
	UnderReplicated bool `json:"under_replicated"`
}

// QueueConfigView is a queue's stored declaration.
type QueueConfigView struct {
	DeadLetterMode   string `json:"dead_letter_mode"`
	DeadLetterTarget string `json:"dead_letter_target"`
	MaxRetries       int    `json:"max_retries"`
	DefaultTTLMs     int64  `json:"default_ttl_ms"`
	LeaseMs          int64  `json:"lease_ms"`
}

// PartitionView is one partition's state and counts.
type PartitionView struct {
	Partition          uint32 `json:"partition"`
	State              string `json:"state"`
	Reason             string `json:"reason"`
	Ready              int    `json:"ready"`
	Delayed            int    `json:"delayed"`
	Inflight           int    `json:"inflight"`
	DeadLettering      int    `json:"dead_lettering"`
	Consumers          int    `json:"consumers"`
	NextOffset         uint64 `json:"next_offset"`
	SettledFrontier    uint64 `json:"settled_frontier"`
	BytesOnDisk        int64  `json:"bytes_on_disk"`
	CheckpointFailures uint64 `json:"checkpoint_failures"`
	Relocated          uint64 `json:"relocated"`
	// In a cluster only: the partition's raft group, the client addresses
	// of its replicas (preferred owner first), its owner's (the raft
	// leader; empty during an election) and the raft term.
	RaftGroup uint64   `json:"raft_group,omitempty"`
	Replicas  []string `json:"replicas,omitempty"`
	Owner     string   `json:"owner,omitempty"`
	Term      uint64   `json:"term,omitempty"`
	// Voters and Learners are the raft group's configuration as this
	// replica applied it: where the partition is, while Replicas is where
	// the placement wants it (they differ while the recovery plan runs).
	Voters   []string `json:"voters,omitempty"`
	Learners []string `json:"learners,omitempty"`
}

// Partition states.
const (
	stateOK          = "ok"
	stateQuarantined = "quarantined"
	stateFailed      = "failed"
	// stateRemote: in a cluster, this node holds no replica of the
	// partition; its counts are known to the nodes in replicas.
	stateRemote = "remote"
)

var deadLetterModes = []struct {
	name string
	mode uint8
}{
	{"default", protocol.DeadLetterDefault},
	{"discard", protocol.DeadLetterDiscard},
	{"global", protocol.DeadLetterGlobal},
	{"queue", protocol.DeadLetterQueue},
}

func deadLetterModeName(m uint8) string {
	for _, d := range deadLetterModes {
		if d.mode == m {
			return d.name
		}
	}
	return fmt.Sprintf("mode(%d)", m)
}

func deadLetterModeOf(name string) (uint8, bool) {
	for _, d := range deadLetterModes {
		if d.name == name {
			return d.mode, true
		}
	}
	return 0, false
}

func partitionState(p *broker.PartitionStats) string {
	switch {
	case p.Elsewhere:
		return stateRemote
	case p.Quarantined:
		return stateQuarantined
	case p.Err != "":
		return stateFailed
	}
	return stateOK
}

func rank(state string) int {
	switch state {
	case stateFailed:
		return 2
	case stateQuarantined:
		return 1
	}
	return 0
}

func queueView(qs broker.QueueStats, cfg broker.QueueConfig) QueueView {
	v := QueueView{Topic: qs.Topic, Group: qs.Group, PartitionCount: len(qs.Partitions), DeadLetterQueue: cfg.DeadLetterQueue,
		Config: QueueConfigView{DeadLetterMode: deadLetterModeName(cfg.DeadLetterMode), DeadLetterTarget: cfg.DeadLetterTarget,
			MaxRetries: cfg.MaxRetries, DefaultTTLMs: cfg.DefaultTTLMs, LeaseMs: cfg.LeaseMs},
		State: stateOK, Partitions: make([]PartitionView, 0, len(qs.Partitions))}
	if len(qs.Partitions) > 0 && qs.Partitions[0].Elsewhere {
		v.State = stateRemote // a node holds all of a queue's partitions or none
	}
	for i := range qs.Partitions {
		p := &qs.Partitions[i]
		st := partitionState(p)
		if rank(st) > rank(v.State) {
			v.State = st
		}
		v.Ready += p.Ready
		v.Delayed += p.Delayed
		v.Inflight += p.Inflight
		v.DeadLettering += p.DeadLettering
		v.Consumers += p.Consumers
		v.BytesOnDisk += p.BytesOnDisk
		v.Partitions = append(v.Partitions, PartitionView{Partition: p.Partition, State: st, Reason: p.Err,
			Ready: p.Ready, Delayed: p.Delayed, Inflight: p.Inflight, DeadLettering: p.DeadLettering, Consumers: p.Consumers,
			NextOffset: p.NextLSN, SettledFrontier: p.Frontier, BytesOnDisk: p.BytesOnDisk,
			CheckpointFailures: p.CheckpointFailures, Relocated: p.Relocated,
			RaftGroup: p.RaftGroup, Replicas: p.Replicas, Owner: p.Owner, Term: p.Term,
			Voters: p.Voters, Learners: p.Learners})
	}
	if qs.ReplicationWant > 0 && len(qs.Partitions) > 0 {
		r := &ReplicationView{Factor: qs.ReplicationWant, Replicas: len(qs.Partitions[0].Replicas)}
		r.UnderReplicated = r.Replicas < r.Factor
		for _, p := range qs.Partitions {
			if !p.Elsewhere && (len(p.Learners) > 0 || len(p.Voters) != len(p.Replicas)) {
				r.UnderReplicated = true
			}
		}
		v.Replication = r
	}
	return v
}

func (a *api) listQueues(w http.ResponseWriter, _ *http.Request) {
	b := a.cfg.Broker
	out := QueueList{Queues: []QueueView{}}
	for _, qs := range b.Stats().Queues {
		cfg, err := b.Config(qs.Topic, qs.Group)
		if err != nil {
			continue // deleted since Stats
		}
		out.Queues = append(out.Queues, queueView(qs, cfg))
	}
	writeJSON(w, http.StatusOK, out)
}

// queueName reads the queue named by a request: the topic from the path,
// the group from the query.
func queueName(r *http.Request) (topic, group string) {
	return r.PathValue("topic"), r.URL.Query().Get("group")
}

// queueOf answers the current view of one queue, or writes the error.
func (a *api) queueOf(w http.ResponseWriter, topic, group string) (QueueView, bool) {
	b := a.cfg.Broker
	qs, err := b.QueueStatsOf(topic, group)
	if err != nil {
		writeBrokerError(w, err)
		return QueueView{}, false
	}
	cfg, err := b.Config(topic, group)
	if err != nil {
		writeBrokerError(w, err)
		return QueueView{}, false
	}
	return queueView(qs, cfg), true
}

func (a *api) getQueue(w http.ResponseWriter, r *http.Request) {
	topic, group := queueName(r)
	if v, ok := a.queueOf(w, topic, group); ok {
		writeJSON(w, http.StatusOK, v)
	}
}

// QueueDeclare is the body of PUT and PATCH /api/v1/queues/{topic}. A nil
// field takes the broker's default (PUT) or keeps its value (PATCH).
type QueueDeclare struct {
	Partitions       *uint32 `json:"partitions"`
	DeadLetterMode   *string `json:"dead_letter_mode"`
	DeadLetterTarget *string `json:"dead_letter_target"`
	MaxRetries       *int32  `json:"max_retries"`
	DefaultTTLMs     *int64  `json:"default_ttl_ms"`
	LeaseMs          *int64  `json:"lease_ms"`
}

// apply writes the fields that are set into d.
func (q *QueueDeclare) apply(d *protocol.DeclareQueue) error {
	if q.Partitions != nil {
		d.Partitions = *q.Partitions
	}
	if q.DeadLetterMode != nil {
		m, ok := deadLetterModeOf(*q.DeadLetterMode)
		if !ok {
			return fmt.Errorf("dead_letter_mode %q is not one of default, discard, global, queue", *q.DeadLetterMode)
		}
		d.DeadLetterMode = m
		if m != protocol.DeadLetterQueue && q.DeadLetterTarget == nil {
			d.DeadLetterTarget = ""
		}
	}
	if q.DeadLetterTarget != nil {
		d.DeadLetterTarget = *q.DeadLetterTarget
	}
	if q.MaxRetries != nil {
		d.MaxRetries = *q.MaxRetries
	}
	if q.DefaultTTLMs != nil {
		d.DefaultTTLMs = *q.DefaultTTLMs
	}
	if q.LeaseMs != nil {
		d.LeaseMs = *q.LeaseMs
	}
	return nil
}

func (a *api) declareQueue(w http.ResponseWriter, r *http.Request) {
	topic, group := queueName(r)
	var req QueueDeclare
	if !decodeBody(w, r, &req, true) {
		return
	}
	d := protocol.DeclareQueue{Topic: topic, Group: group, MaxRetries: -1}
	if err := req.apply(&d); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	a.declare(w, r, &d)
}

func (a *api) patchQueue(w http.ResponseWriter, r *http.Request) {
	topic, group := queueName(r)
	var req QueueDeclare
	if !decodeBody(w, r, &req, false) {
		return
	}
	if req.Partitions != nil {
		writeError(w, http.StatusBadRequest, "bad_request", "partitions cannot be changed on an existing queue")
		return
	}
	cur, err := a.cfg.Broker.Config(topic, group)
	if err != nil {
		writeBrokerError(w, err)
		return
	}
	d := cur.Declaration(topic, group)
	if err := req.apply(&d); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	a.declare(w, r, &d)
}

func (a *api) declare(w http.ResponseWriter, r *http.Request, d *protocol.DeclareQueue) {
	ctx, cancel := requestContext(r)
	defer cancel()
	ok, err := a.cfg.Broker.Declare(ctx, d)
	if err != nil {
		writeBrokerError(w, err)
		return
	}
	v, found := a.queueOf(w, d.Topic, d.Group)
	if !found {
		return
	}
	status := http.StatusOK
	if ok.Created {
		status = http.StatusCreated
	}
	writeJSON(w, status, v)
}

// DeleteView is the JSON of a DELETE of a queue.
type DeleteView struct {
	Deleted bool `json:"deleted"`
}

func (a *api) deleteQueue(w http.ResponseWriter, r *http.Request) {
	topic, group := queueName(r)
	ctx, cancel := requestContext(r)
	defer cancel()
	if err := a.cfg.Broker.Delete(ctx, &protocol.DeleteQueue{Topic: topic, Group: group}); err != nil {
		writeBrokerError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, DeleteView{Deleted: true})
}

// PurgeView is the JSON of a purge.
type PurgeView struct {
	Purged uint64 `json:"purged"`
}

func (a *api) purgeQueue(w http.ResponseWriter, r *http.Request) {
	topic, group := queueName(r)
	ctx, cancel := requestContext(r)
	defer cancel()
	type answer struct {
		ok  protocol.PurgeOK
		err error
	}
	ch := make(chan answer, 1)
	a.cfg.Broker.Purge(&protocol.PurgeQueue{Topic: topic, Group: group}, func(ok protocol.PurgeOK, err error) { ch <- answer{ok, err} })
	select {
	case res := <-ch:
		if res.err != nil {
			writeBrokerError(w, res.err)
			return
		}
		writeJSON(w, http.StatusOK, PurgeView{Purged: res.ok.Purged})
	case <-ctx.Done():
		writeBrokerError(w, ctx.Err())
	}
}
