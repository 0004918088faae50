package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/partition"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// Cluster links a broker to its cluster (Config.Cluster; nil on a single
// node). With it every queue is in the controller's catalogue, and each of
// its partitions is a raft group over the nodes its placement names: this
// node opens the replicas placed on it, and only a partition's raft leader
// (its owner) serves publishes, deliveries and settles.
type Cluster interface {
	// CreateQueue places a new queue's partitions and commits it to the
	// catalogue; it returns once this node applied the entry. A queue the
	// catalogue holds already is returned as it is.
	CreateQueue(ctx context.Context, topic, group string, settings []byte, partitions int) (CatalogueQueue, error)
	// Self is this node's raft id.
	Self() uint64
	// ReplicationWant is how many replicas a queue should have now (the
	// replication factor, capped by the cluster's nodes); a queue with
	// fewer is under-replicated until the controller adds them.
	ReplicationWant() int
	// Sender returns the function that carries raft group id's messages.
	Sender(group uint64) func([]*raftpb.Message)
	// AddGroup registers a replica with the node's raft host; RemoveGroup
	// takes it off.
	AddGroup(group uint64, p *partition.Partition) error
	RemoveGroup(group uint64)
	// ClientAddr is where clients reach node raftID ("" when unknown).
	ClientAddr(raftID uint64) string
	// Fenced reports whether this node sees a majority of the cluster's
	// nodes dead: it then refuses publishes and settles at once (a quorum
	// could not confirm them anyway) so that clients go elsewhere.
	Fenced() bool
	// PeerAlive reports whether this node's membership does not hold node
	// raftID dead, suspect of a failure or gone (a node it knows nothing
	// of counts as alive). A leader hands its partition back to the
	// preferred owner only while that node is alive: a node that sees a
	// majority dead (fenced) is seen dead by them in turn, and a lead
	// given to it would come straight back.
	PeerAlive(raftID uint64) bool
	// Lookup returns the catalogue's entry for a queue, if it holds one.
	Lookup(topic, group string) (CatalogueQueue, bool)
	// DeleteQueue removes a queue from the catalogue and returns once
	// this node applied that; found is false when the catalogue does not
	// hold it.
	DeleteQueue(ctx context.Context, topic, group string) (found bool, err error)
	// UpdateQueue replaces a queue's settings in the catalogue and returns
	// once this node applied that; found as for DeleteQueue.
	UpdateQueue(ctx context.Context, topic, group string, settings []byte) (found bool, err error)
	// PlacementDone reports, from a partition's owner, that its group's
	// voters are exactly the replicas placed (so a replica moved away may
	// drop its files). It does not wait.
	PlacementDone(topic, group string, partition int, raftGroup uint64, replicas []uint64)
	// PurgeQueue records a purge of a queue in the catalogue and returns
	// its sequence once this node applied it; found as for DeleteQueue.
	PurgeQueue(ctx context.Context, topic, group string) (seq uint64, found bool, err error)
	// PurgeDone reports, from a partition's owner, that it carried out
	// purge seq, discarding count messages. It does not wait.
	PurgeDone(topic, group string, partition int, seq, count uint64)
}

// CatalogueQueue is a queue as the controller's catalogue holds it.
type CatalogueQueue struct {
	Topic, Group string
	// Settings is the queue's metadata as the creating node encoded it.
	Settings []byte
	// Partitions is each partition's raft group and replicas (raft ids,
	// preferred owner first).
	Partitions []RaftPlacement
	// PurgeSeq is the queue's last purge (0: none); PurgeDone[i] the last
	// one partition i's owner carried out, discarding PurgeCount[i].
	PurgeSeq              uint64
	PurgeDone, PurgeCount []uint64
}

// RaftPlacement is one partition's raft group and replicas.
type RaftPlacement struct {
	RaftGroup uint64   `json:"raft_group"`
	Replicas  []uint64 `json:"replicas"`
	// Bootstrap are the group's first voters; a replica placed later
	// joins the running group.
	Bootstrap []uint64 `json:"bootstrap,omitempty"`
	// Moving is set while the group's voters are not yet Replicas (a
	// replica move under way). It is the catalogue's, and not recorded
	// with the queue.
	Moving bool `json:"-"`
}

// clusterCreateTimeout bounds how long a first use of a queue waits for the
// controller to commit it.
const clusterCreateTimeout = 10 * time.Second

// settingsOf encodes m for the catalogue: its declaration without this
// node's placement or incarnation.
func settingsOf(m *queueMeta) []byte {
	c := *m
	c.Raft, c.Incarnation = nil, ""
	b, err := json.Marshal(&c)
	if err != nil {
		panic("broker: queue metadata does not marshal: " + err.Error())
	}
	return b
}

// placedElsewhere is createInCluster's error for a queue committed to the
// catalogue with no replica on this node (placement picked other nodes).
// It wraps the not_owner that a request needing a replica here (a first
// publish or subscribe) is answered; a declaration is a success
// (Declare), since the queue exists now.
type placedElsewhere struct {
	err error
	// mine is set when the catalogue's entry carries the settings this
	// node proposed: its proposal created the queue.
	mine bool
}

func (e *placedElsewhere) Error() string { return e.err.Error() }
func (e *placedElsewhere) Unwrap() error { return e.err }

// placedOn reports whether every partition of cq is placed on node self
// (a node holds all of a queue's partitions or none).
func placedOn(cq *CatalogueQueue, self uint64) bool {
	for _, p := range cq.Partitions {
		if !slices.Contains(p.Replicas, self) {
			return false
		}
	}
	return true
}

// createInCluster commits a new queue to the catalogue, then opens the
// replicas placed on this node. A queue placed on other nodes only is
// a *placedElsewhere. createMu is held.
func (b *Broker) createInCluster(k queueKey, want *queueMeta) (*queueEntry, error) {
	ctx, cancel := context.WithTimeout(context.Background(), clusterCreateTimeout)
	defer cancel()
	settings := settingsOf(want)
	cq, err := b.cfg.Cluster.CreateQueue(ctx, k.topic, k.group, settings, int(want.Partitions))
	if err != nil {
		return nil, protocol.Errorf(protocol.CodeUnavailable, "queue %q group %q: the cluster did not commit it: %v; retry", k.topic, k.group, err)
	}
	if !placedOn(&cq, b.cfg.Cluster.Self()) {
		return nil, &placedElsewhere{err: b.elsewhereError(k, &cq), mine: bytes.Equal(cq.Settings, settings)}
	}
	q, err := b.openCatalogueQueue(cq)
	if err != nil {
		return nil, err
	}
	// A new group elects its preferred owner within a few raft ticks; the
	// request that created the queue waits for it (bounded) rather than
	// be answered "no owner" by a queue it just made.
	for _, p := range q.parts {
		for lead, _ := p.Leader(); lead == 0 && ctx.Err() == nil; lead, _ = p.Leader() {
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	return q, nil
}

// openCatalogueQueue opens this node's replicas of a catalogue queue (all
// of its partitions: a node either holds every partition of a queue or
// none). A queue placed elsewhere is answered not_owner. createMu is held.
func (b *Broker) openCatalogueQueue(cq CatalogueQueue) (*queueEntry, error) {
	k := queueKey{cq.Topic, cq.Group}
	b.mu.RLock()
	q := b.queues[k]
	b.mu.RUnlock()
	if q != nil {
		return q, nil
	}
	if !placedOn(&cq, b.cfg.Cluster.Self()) {
		return nil, b.elsewhereError(k, &cq)
	}
	var m queueMeta
	if err := json.Unmarshal(cq.Settings, &m); err != nil || m.Topic != cq.Topic || m.Group != cq.Group ||
		int(m.Partitions) != len(cq.Partitions) {
		return nil, b.internalError("open replica", k, fmt.Errorf("catalogue settings do not describe the queue: %v", err))
	}
	m.Version = metaVersion
	m.Raft = cq.Partitions
	root := filepath.Join(b.cfg.DataDir, queuesDir)
	tdir := filepath.Join(root, dirName(k.topic))
	dir := filepath.Join(tdir, dirName(k.group))
	if err := b.cfg.FS.MkdirAll(dir, vfs.DirPerm); err != nil {
		return nil, b.internalError("open replica", k, err)
	}
	if err := writeMeta(b.cfg.FS, filepath.Join(dir, metaFile), &m); err != nil {
		return nil, b.internalError("open replica", k, err)
	}
	if err := syncDirs(b.cfg.FS, tdir, root); err != nil {
		return nil, b.internalError("open replica", k, err)
	}
	q, err := b.openQueue(dir, &m, false)
	if err != nil {
		return nil, b.internalError("open replica", k, err)
	}
	b.mu.Lock()
	b.queues[k] = q
	b.mu.Unlock()
	if b.leaving.Load() {
		// Opened while the node stops (HandOverForStop): it takes no
		// lead either.
		for _, p := range q.parts {
			p.StopLeading()
		}
	}
	b.logger.Info("queue replicas opened", "topic", k.topic, "group", k.group, "partitions", len(cq.Partitions))
	return q, nil
}

// SyncCatalogue brings this node's queues in line with the catalogue: it
// drops the queues the catalogue no longer holds (deleted, or deleted and
// created again: other raft groups) and those whose replicas were all moved
// to other nodes once the move is done, applies changed settings, records
// new placements, and opens the replicas placed on this node that it does
// not hold yet (created through another node, or while this one was
// down). It is idempotent. placedBelow is the catalogue's next raft group
// id: a queue whose groups the catalogue never placed (a catalogue behind
// this node's files) is kept, and logged, rather than dropped.
func (b *Broker) SyncCatalogue(queues []CatalogueQueue, placedBelow uint64) {
	if b.cfg.Cluster == nil || b.closed.Load() {
		return
	}
	self := b.cfg.Cluster.Self()
	byKey := make(map[queueKey]*CatalogueQueue, len(queues))
	for i := range queues {
		byKey[queueKey{queues[i].Topic, queues[i].Group}] = &queues[i]
	}
	for _, q := range b.queueEntries() {
		raft := q.meta.Load().Raft
		if len(raft) == 0 {
			continue // not a catalogue queue
		}
		cq := byKey[q.key]
		why := ""
		switch {
		case raft[0].RaftGroup >= placedBelow:
			if !q.unknownLogged.Swap(true) {
				b.logger.Error("a queue held here has raft groups the cluster's catalogue never placed; it is kept as it is (was the controller's directory replaced?)",
					"topic", q.key.topic, "group", q.key.group, "raft_group", raft[0].RaftGroup, "catalogue_next_group", placedBelow)
			}
			continue
		case cq == nil || len(cq.Partitions) != len(raft) || cq.Partitions[0].RaftGroup != raft[0].RaftGroup:
			why = "deleted"
		case movedAway(cq, self):
			why = "moved"
		}
		if why == "" {
			b.applySettings(q, cq.Settings)
			b.carryPurges(q, cq)
			continue
		}
		if err := b.dropLocal(q.key, why, false); err != nil && protocol.CodeOf(err) != protocol.CodeNotFound && protocol.CodeOf(err) != protocol.CodeUnavailable {
			b.logger.Error("cannot drop a queue's replicas", "topic", q.key.topic, "group", q.key.group, "why", why, "err", err)
		}
	}
	for _, cq := range queues {
		k := queueKey{cq.Topic, cq.Group}
		b.mu.RLock()
		q := b.queues[k]
		b.mu.RUnlock()
		if q != nil {
			b.notePlacement(q, cq.Partitions)
			continue
		}
		if movedAway(&cq, self) {
			continue
		}
		b.createMu.Lock()
		if !b.closed.Load() {
			_, err := b.openCatalogueQueue(cq)
			var pe *protocol.Error
			if err != nil && !(errors.As(err, &pe) && pe.Code == protocol.CodeNotOwner) {
				b.logger.Error("cannot open the replicas of a queue", "topic", cq.Topic, "group", cq.Group, "err", err)
			}
		}
		b.createMu.Unlock()
	}
}

// movedAway reports whether no partition of cq is placed on node self any
// more and every move is done (the groups' voters are the placed replicas,
// so this node's replicas are no longer needed).
func movedAway(cq *CatalogueQueue, self uint64) bool {
	for _, p := range cq.Partitions {
		if p.Moving || slices.Contains(p.Replicas, self) {
			return false
		}
	}
	return true
}

// catalogueElsewhere returns, in a cluster, the catalogue's declaration of
// a queue this node holds no replica of (ok false otherwise: a single node,
// a queue held here, placed here, or not in the catalogue).
func (b *Broker) catalogueElsewhere(topic, group string) (queueMeta, bool) {
	if b.cfg.Cluster == nil {
		return queueMeta{}, false
	}
	b.mu.RLock()
	q := b.queues[queueKey{topic, group}]
	b.mu.RUnlock()
	if q != nil {
		return queueMeta{}, false
	}
	cq, ok := b.cfg.Cluster.Lookup(topic, group)
	if !ok {
		return queueMeta{}, false
	}
	for _, p := range cq.Partitions {
		if slices.Contains(p.Replicas, b.cfg.Cluster.Self()) {
			return queueMeta{}, false // placed here: opened on first use
		}
	}
	var m queueMeta
	if err := json.Unmarshal(cq.Settings, &m); err != nil || m.Topic != topic || m.Group != group {
		return queueMeta{}, false
	}
	return m, true
}

// declareElsewhere is Declare for a queue of the catalogue that this node
// holds no replica of: the declaration is checked against the catalogue's
// and a change committed there (every node holding a replica applies it).
// handled is false when the queue is not such a queue.
func (b *Broker) declareElsewhere(d *protocol.DeclareQueue) (ok protocol.DeclareOK, handled bool, err error) {
	cur, found := b.catalogueElsewhere(d.Topic, d.Group)
	if !found {
		return protocol.DeclareOK{}, false, nil
	}
	want, err := b.metaFor(d)
	if err != nil {
		return protocol.DeclareOK{}, true, err
	}
	if d.Partitions != 0 && d.Partitions != cur.Partitions {
		return protocol.DeclareOK{}, true, protocol.Errorf(protocol.CodeConflict,
			"queue %q group %q has %d partitions, not %d", d.Topic, d.Group, cur.Partitions, d.Partitions)
	}
	want.Version, want.Partitions = cur.Version, cur.Partitions
	want.DeadLetterQueue = want.DeadLetterQueue || cur.DeadLetterQueue
	if sameMeta(want, &cur) {
		return protocol.DeclareOK{Partitions: cur.Partitions}, true, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterCreateTimeout)
	defer cancel()
	changed, err := b.cfg.Cluster.UpdateQueue(ctx, d.Topic, d.Group, settingsOf(want))
	switch {
	case err != nil:
		return protocol.DeclareOK{}, true, protocol.Errorf(protocol.CodeUnavailable, "queue %q group %q: the cluster did not commit the new settings: %v; retry", d.Topic, d.Group, err)
	case !changed:
		return protocol.DeclareOK{}, true, errDeletedMeanwhile(queueKey{d.Topic, d.Group})
	}
	return protocol.DeclareOK{Partitions: cur.Partitions}, true, nil
}

// applySettings brings queue q's declaration to the catalogue's (a change
// committed through another node).
func (b *Broker) applySettings(q *queueEntry, settings []byte) {
	var m queueMeta
	if err := json.Unmarshal(settings, &m); err != nil {
		b.logger.Error("catalogue settings of a queue do not decode", "topic", q.key.topic, "group", q.key.group, "err", err)
		return
	}
	cur := q.meta.Load()
	m.Version, m.Raft, m.Incarnation, m.Partitions = cur.Version, cur.Raft, cur.Incarnation, cur.Partitions
	if m.Topic != cur.Topic || m.Group != cur.Group || sameMeta(&m, cur) {
		return
	}
	b.createMu.Lock()
	defer b.createMu.Unlock()
	if q.deleted.Load() || q.meta.Load() != cur {
		return // changed meanwhile; the next sync looks again
	}
	if err := b.storeSettings(q, &m); err != nil {
		b.logger.Error("cannot apply a queue's new settings", "topic", q.key.topic, "group", q.key.group, "err", err)
		return
	}
	b.logger.Info("queue settings changed through the cluster", "topic", q.key.topic, "group", q.key.group)
}

// storeSettings records want as q's declaration and hands the partitions
// their new configuration. createMu is held.
func (b *Broker) storeSettings(q *queueEntry, want *queueMeta) error {
	if err := writeMeta(b.cfg.FS, filepath.Join(q.dir, metaFile), want); err != nil {
		return err
	}
	q.meta.Store(want)
	qc := b.queueConfig(want)
	for _, p := range q.parts {
		p.SetConfig(qc)
	}
	return nil
}

// elsewhereError is the error for a request that needs a replica of
// catalogue queue k, which is placed on other nodes only: not_owner naming
// its partition 0's preferred owner (unavailable when that is unknown).
func (b *Broker) elsewhereError(k queueKey, cq *CatalogueQueue) error {
	owner := uint64(0)
	if len(cq.Partitions) > 0 && len(cq.Partitions[0].Replicas) > 0 {
		owner = cq.Partitions[0].Replicas[0]
	}
	return b.notOwner(k, 0, owner)
}

// notOwner is the error for a request this node cannot serve because
// partition idx of queue k is owned by node owner (0: unknown).
func (b *Broker) notOwner(k queueKey, idx uint32, owner uint64) error {
	addr := ""
	if owner != 0 {
		addr = b.cfg.Cluster.ClientAddr(owner)
	}
	if addr == "" {
		return protocol.Errorf(protocol.CodeUnavailable, "queue %q group %q partition %d has no owner right now (an election is under way); retry",
			k.topic, k.group, idx)
	}
	return &protocol.Error{Code: protocol.CodeNotOwner, Owner: addr,
		Message: fmt.Sprintf("queue %q group %q partition %d is served by %s", k.topic, k.group, idx, addr)}
}

// leadsHere reports whether this node's replica of p leads its group (a
// single node leads every partition).
func (q *queueEntry) leadsHere(p *partition.Partition) bool {
	if q.self == 0 {
		return true
	}
	lead, _ := p.Leader()
	return lead == q.self
}

// sameMeta compares two declarations, placements included.
func sameMeta(a, b *queueMeta) bool {
	return a.Version == b.Version && a.Topic == b.Topic && a.Group == b.Group && a.Partitions == b.Partitions &&
		a.LeaseMs == b.LeaseMs && a.MaxRetries == b.MaxRetries && a.DefaultTTLMs == b.DefaultTTLMs &&
		a.DeadLetterMode == b.DeadLetterMode && a.DeadLetterTarget == b.DeadLetterTarget &&
		a.DeadLetterQueue == b.DeadLetterQueue && a.Incarnation == b.Incarnation && slices.EqualFunc(a.Raft, b.Raft, func(p, q RaftPlacement) bool {
		return p.RaftGroup == q.RaftGroup && slices.Equal(p.Replicas, q.Replicas) && slices.Equal(p.Bootstrap, q.Bootstrap)
	})
}

// ownerError turns a replica's ErrNotLeader into not_owner.
func (b *Broker) ownerError(q *queueEntry, p *partition.Partition) error {
	lead, _ := p.Leader()
	if lead == b.cfg.Cluster.Self() {
		lead = 0 // it lost the lead meanwhile: no owner known yet
	}
	return b.notOwner(q.key, p.Index(), lead)
}

// partitionOwner reports p's raft leader's client address and
// its term, for the operations API ("" without a cluster or a leader).
func (b *Broker) partitionOwner(p *partition.Partition) (addr string, term uint64) {
	if b.cfg.Cluster == nil {
		return "", 0
	}
	lead, term := p.Leader()
	if lead == 0 {
		return "", term
	}
	return b.cfg.Cluster.ClientAddr(lead), term
}

// notePlacement records a queue's new placement (the recovery plan moved
// its replicas) in its metadata; the owners' Reconfigure then carries it
// out.
func (b *Broker) notePlacement(q *queueEntry, pl []RaftPlacement) {
	cur := q.meta.Load()
	if len(cur.Raft) != len(pl) {
		return
	}
	want := *cur
	want.Raft = pl
	if sameMeta(&want, cur) {
		return
	}
	b.createMu.Lock()
	defer b.createMu.Unlock()
	if err := writeMeta(b.cfg.FS, filepath.Join(q.dir, metaFile), &want); err != nil {
		b.logger.Error("cannot record a queue's new placement", "topic", q.key.topic, "group", q.key.group, "err", err)
		return
	}
	q.meta.Store(&want)
	b.logger.Info("queue placement changed", "topic", q.key.topic, "group", q.key.group)
}

// Reconfigure moves the replicas of every partition this node owns one
// step toward its placement (partition.Partition.Reconfigure). The cluster
// wiring calls it periodically. A fenced node instead hands the lead of
// every partition it owns to a caught-up voter (partition.HandLeadOver):
// it stops leading while it sees a majority of the cluster dead.
//
// It reports whether the node is settled: every group of the node is
// quiet, every one it owns already has its placement (nothing to step),
// and no queue it holds is moving or purging in the catalogue. Until a
// group wakes (PlacementStirred) or the catalogue changes, another pass
// would then do nothing, so the caller may wait longer for the next.
func (b *Broker) Reconfigure(ctx context.Context) (settled bool) {
	if b.cfg.Cluster == nil || b.closed.Load() {
		return false
	}
	if b.fenced() {
		b.HandLeadsOver(ctx, "this node is fenced")
		return false
	}
	settled = true
	qs := b.queueEntries()
	for _, q := range qs {
		raft := q.meta.Load().Raft
		var cq CatalogueQueue
		inCatalogue, looked := false, false
		lookup := func() {
			if !looked {
				cq, inCatalogue = b.cfg.Cluster.Lookup(q.key.topic, q.key.group)
				looked = true
			}
		}
		for i, p := range q.parts {
			if i >= len(raft) {
				continue
			}
			if !q.leadsHere(p) {
				settled = settled && p.Quiet()
				continue
			}
			if p.QuietPlaced(raft[i].Replicas) {
				// Already placed, so no step to take; only the catalogue
				// can still be waiting for its report (a move's end).
				lookup()
				if inCatalogue && i < len(cq.Partitions) && cq.Partitions[i].Moving {
					settled = false
					b.reportPlaced(q, &cq, i, p)
				}
				continue
			}
			settled = false
			lookup()
			what, err := p.Reconfigure(ctx, raft[i].Replicas)
			switch {
			case err != nil && !errors.Is(err, partition.ErrNotLeader):
				b.logger.Warn("partition replicas not changed", "topic", q.key.topic, "group", q.key.group, "partition", i, "err", err)
			case what != "":
				b.logger.Info("partition replicas changing", "topic", q.key.topic, "group", q.key.group, "partition", i, "step", what)
			case err == nil && inCatalogue:
				b.reportPlaced(q, &cq, i, p)
			}
		}
		lookup()
		if inCatalogue && b.carryPurges(q, &cq) {
			settled = false
		}
	}
	return settled
}

// stirPlacement is every partition's OnStir: a quiet group woke.
func (b *Broker) stirPlacement() {
	select {
	case b.stir <- struct{}{}:
	default:
	}
}

// PlacementStirred is signalled (at most one signal waits) when a quiet
// group of this node wakes: after a settled Reconfigure, the next pass is
// due again.
func (b *Broker) PlacementStirred() <-chan struct{} { return b.stir }

// HandLeadsOver hands the lead of every partition this node owns to a
// caught-up voter of its group (partition.HandLeadOver), and reports
// whether it owns none any more. A fenced node calls it (through
// Reconfigure) so that it stops leading; a node that leaves with no spare
// to hand its replicas to calls it before it drains, so that its exit
// costs its partitions no election. A single node owns what it holds.
func (b *Broker) HandLeadsOver(ctx context.Context, why string) bool {
	if b.cfg.Cluster == nil {
		return false
	}
	none := true
	for _, q := range b.queueEntries() {
		raft := q.meta.Load().Raft
		for i, p := range q.parts {
			if i >= len(raft) || !q.leadsHere(p) {
				continue
			}
			none = false
			what, err := p.HandLeadOver(ctx, raft[i].Replicas, why)
			if err != nil && !errors.Is(err, partition.ErrNotLeader) {
				b.logger.Warn("partition lead not handed over", "topic", q.key.topic, "group", q.key.group, "partition", i, "why", why, "err", err)
			} else if what != "" {
				b.logger.Info("partition lead handed over", "topic", q.key.topic, "group", q.key.group, "partition", i, "why", why, "step", what)
			}
		}
	}
	return none
}

// stopHandOverPollMs is how often a stopping node looks whether its
// partitions' leads have moved (partition.HandOver asks again for those
// that have not every few looks).
const stopHandOverPollMs = 10

// HandOverForStop is the first step of a cluster node's planned stop: from
// now on no replica of this node takes a lead (partition.StopLeading:
// neither by a transfer nor by an election), and the lead of every
// partition it owns is handed to a caught-up voter of its group, the first
// its placement names, all groups at once (partition.HandOver). It returns
// once no partition is owned here any more, or when ctx ends (its deadline
// bounds the step): what is still owned here is left to the election that
// follows this node's exit. Meanwhile a publish for a partition already
// handed over is answered not_owner with its new owner, and one for a
// partition whose lead is moving unavailable (retryable; nothing stored).
// A single node has nothing to hand over: it returns an empty report.
func (b *Broker) HandOverForStop(ctx context.Context) partition.HandoverReport {
	if b.cfg.Cluster == nil {
		return partition.HandoverReport{}
	}
	// Set before the queues are listed; a queue opened meanwhile looks at
	// it once it is listed (openCatalogueQueue).
	b.leaving.Store(true)
	var hs []partition.Handover
	for _, q := range b.queueEntries() {
		raft := q.meta.Load().Raft
		for i, p := range q.parts {
			if i < len(raft) {
				hs = append(hs, partition.Handover{P: p, Want: raft[i].Replicas})
			} else {
				p.StopLeading()
			}
		}
	}
	return partition.HandOver(ctx, hs, "this node is stopping", stopHandOverPollMs*time.Millisecond)
}

// reportPlaced tells the controller, while the catalogue shows partition i
// of q moving, once the group's voters are exactly its placed replicas and
// it has no learner: the replicas moved away may then drop their files.
func (b *Broker) reportPlaced(q *queueEntry, cq *CatalogueQueue, i int, p *partition.Partition) {
	if i >= len(cq.Partitions) || !cq.Partitions[i].Moving {
		return
	}
	pl := cq.Partitions[i]
	voters, learners := p.RaftConf()
	if len(learners) > 0 || len(voters) != len(pl.Replicas) {
		return
	}
	for _, r := range pl.Replicas {
		if !slices.Contains(voters, r) {
			return
		}
	}
	b.cfg.Cluster.PlacementDone(q.key.topic, q.key.group, i, pl.RaftGroup, pl.Replicas)
}

// errFenced answers a write on a fenced node.
var errFenced = protocol.Errorf(protocol.CodeFenced,
	"this node is fenced: it sees a majority of the cluster's nodes dead, so it takes no writes; retry through another node")

// Metadata says where each partition of a queue is served: on a single node
// by this node; in a cluster by its owner (the raft leader, with its term as
// the epoch), among the replicas the catalogue places it on. A node that
// holds no replica of the queue knows its replicas but not its owner. A
// queue that does not exist is not_found: Metadata never creates one.
func (b *Broker) Metadata(topic, group string) (protocol.MetadataResult, error) {
	k := queueKey{topic, group}
	b.mu.RLock()
	q := b.queues[k]
	b.mu.RUnlock()
	if b.cfg.Cluster == nil {
		if q == nil {
			return protocol.MetadataResult{}, protocol.Errorf(protocol.CodeNotFound, "no queue %q group %q", topic, group)
		}
		res := protocol.MetadataResult{Partitions: make([]protocol.PartitionMeta, len(q.parts))}
		for i := range q.parts {
			res.Partitions[i].Partition = uint32(i)
		}
		return res, nil
	}
	var raft []RaftPlacement
	if q != nil {
		raft = q.meta.Load().Raft
	} else if cq, ok := b.cfg.Cluster.Lookup(topic, group); ok {
		raft = cq.Partitions
	} else {
		return protocol.MetadataResult{}, protocol.Errorf(protocol.CodeNotFound, "no queue %q group %q in the cluster's catalogue", topic, group)
	}
	res := protocol.MetadataResult{Cluster: true, Partitions: make([]protocol.PartitionMeta, len(raft))}
	for i, pl := range raft {
		pm := &res.Partitions[i]
		pm.Partition = uint32(i)
		for _, r := range pl.Replicas {
			if a := b.cfg.Cluster.ClientAddr(r); a != "" {
				pm.Replicas = append(pm.Replicas, a)
			}
		}
		if q != nil && i < len(q.parts) {
			pm.Owner, pm.Epoch = b.partitionOwner(q.parts[i])
		}
	}
	return res, nil
}

// fenced reports whether this node is a fenced cluster node.
func (b *Broker) fenced() bool { return b.cfg.Cluster != nil && b.cfg.Cluster.Fenced() }

// HandedOver reports whether this node's replicas are no longer needed:
// for every partition it holds, the placement no longer names this node,
// every replica the placement names is a voter of the group (caught up
// and promoted), so that this node leaving costs no partition its quorum,
// and this node's replica no longer leads the group (it handed the lead
// to a wanted voter: Partition.Reconfigure) unless it was removed from
// the group already, so that this node leaving costs no partition an
// election. It returns false and a partition still waiting otherwise. A
// single node has nothing to hand over.
func (b *Broker) HandedOver() (bool, string) {
	if b.cfg.Cluster == nil {
		return true, ""
	}
	self := b.cfg.Cluster.Self()
	qs := b.queueEntries()
	for _, q := range qs {
		raft := q.meta.Load().Raft
		for i, p := range q.parts {
			if i >= len(raft) {
				continue
			}
			want := raft[i].Replicas
			where := fmt.Sprintf("queue %q group %q partition %d", q.key.topic, q.key.group, i)
			if slices.Contains(want, self) {
				return false, where + ": still placed here"
			}
			voters, _ := p.RaftConf()
			for _, r := range want {
				if !slices.Contains(voters, r) {
					return false, where + ": a new replica is not a voter yet"
				}
			}
			if lead, _ := p.Leader(); lead == self && slices.Contains(voters, self) {
				return false, where + ": this node still leads it"
			}
		}
	}
	return true, ""
}

// queueEntries returns the queues this node holds, as of now.
func (b *Broker) queueEntries() []*queueEntry {
	b.mu.RLock()
	defer b.mu.RUnlock()
	qs := make([]*queueEntry, 0, len(b.queues))
	for _, q := range b.queues {
		qs = append(qs, q)
	}
	return qs
}

// purgeMemo is what this node, as a partition's owner, did of the
// catalogue's purge seq: carried out (count discarded) or under way. It is
// not persisted: an owner that restarts, or a new owner, carries out a
// purge whose completion the catalogue does not show.
type purgeMemo struct {
	seq, count uint64
	running    bool
}

// carryPurges carries out, on every partition of q this node owns, the
// catalogue's last purge when the catalogue does not show it done, and
// reports it done (again, until the catalogue shows it). It reports
// whether any such purge is still pending.
func (b *Broker) carryPurges(q *queueEntry, cq *CatalogueQueue) (pending bool) {
	seq := cq.PurgeSeq
	if seq == 0 || len(cq.PurgeDone) != len(q.parts) {
		return false
	}
	for i, p := range q.parts {
		if cq.PurgeDone[i] >= seq || !q.leadsHere(p) {
			continue
		}
		pending = true
		q.purgeMu.Lock()
		if q.purges == nil {
			q.purges = map[int]purgeMemo{}
		}
		m := q.purges[i]
		if m.seq == seq {
			q.purgeMu.Unlock()
			if !m.running {
				b.cfg.Cluster.PurgeDone(q.key.topic, q.key.group, i, seq, m.count)
			}
			continue
		}
		q.purges[i] = purgeMemo{seq: seq, running: true}
		q.purgeMu.Unlock()
		p.Purge(func(n uint64, err error) {
			q.purgeMu.Lock()
			if err != nil {
				delete(q.purges, i) // tried again on the next pass
			} else {
				q.purges[i] = purgeMemo{seq: seq, count: n}
			}
			q.purgeMu.Unlock()
			if err != nil {
				b.logger.Warn("purge of a partition failed; retrying", "topic", q.key.topic, "group", q.key.group, "partition", i, "err", err)
				return
			}
			b.cfg.Cluster.PurgeDone(q.key.topic, q.key.group, i, seq, n)
		})
	}
	return pending
}

// clusterPurgeWait bounds how long a purge in a cluster waits for every
// partition's owner to report it done.
const clusterPurgeWait = 30 * time.Second

// purgeInCluster commits a purge of q to the catalogue, carries it out on
// the partitions this node owns, and answers once every partition's owner
// reported it done, with the sum of their counts.
func (b *Broker) purgeInCluster(pq *protocol.PurgeQueue, done func(protocol.PurgeOK, error)) {
	ctx, cancel := context.WithTimeout(context.Background(), clusterCreateTimeout)
	seq, found, err := b.cfg.Cluster.PurgeQueue(ctx, pq.Topic, pq.Group)
	cancel()
	switch {
	case err != nil:
		done(protocol.PurgeOK{}, protocol.Errorf(protocol.CodeUnavailable, "queue %q group %q: the cluster did not commit the purge: %v; retry", pq.Topic, pq.Group, err))
		return
	case !found:
		done(protocol.PurgeOK{}, protocol.Errorf(protocol.CodeNotFound, "no queue %q group %q in the cluster's catalogue", pq.Topic, pq.Group))
		return
	}
	k := queueKey{pq.Topic, pq.Group}
	b.mu.RLock()
	q := b.queues[k]
	b.mu.RUnlock()
	if cq, ok := b.cfg.Cluster.Lookup(pq.Topic, pq.Group); ok && q != nil {
		b.carryPurges(q, &cq)
	}
	go func() {
		deadline := time.Now().Add(clusterPurgeWait)
		for {
			cq, ok := b.cfg.Cluster.Lookup(pq.Topic, pq.Group)
			if !ok || cq.PurgeSeq < seq {
				done(protocol.PurgeOK{}, errDeletedMeanwhile(k))
				return
			}
			var sum uint64
			left := 0
			for i, d := range cq.PurgeDone {
				if d >= seq {
					sum += cq.PurgeCount[i]
				} else {
					left++
				}
			}
			if left == 0 {
				b.logger.Info("queue purged", "topic", pq.Topic, "group", pq.Group, "purged", sum)
				done(protocol.PurgeOK{Purged: sum}, nil)
				return
			}
			if b.closed.Load() || time.Now().After(deadline) {
				done(protocol.PurgeOK{Purged: sum}, protocol.Errorf(protocol.CodeUnavailable,
					"queue %q group %q: the purge is committed, and %d of %d partitions have not reported it done yet (%d messages purged so far); their owners carry it out when they can",
					pq.Topic, pq.Group, left, len(cq.PurgeDone), sum))
				return
			}
			time.Sleep(clusterPurgePoll)
		}
	}()
}

// clusterPurgePoll is how often a purge in a cluster looks at the
// catalogue for its partitions' reports.
const clusterPurgePoll = 20 * time.Millisecond

// inCatalogue reports whether, in a cluster, the controller's catalogue
// holds queue k: opening this node's replicas of it is not a creation.
func (b *Broker) inCatalogue(k queueKey) bool {
	if b.cfg.Cluster == nil {
		return false
	}
	_, ok := b.cfg.Cluster.Lookup(k.topic, k.group)
	return ok
}
