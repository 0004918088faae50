package clusternode

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/controller"
	"github.com/sinewmq/sinew/internal/membership"
	"github.com/sinewmq/sinew/internal/partition"
	"github.com/sinewmq/sinew/internal/runtimesettings"
)

// Node is the broker's broker.Cluster.
var _ broker.Cluster = (*Node)(nil)

// placementWaitMs bounds how long CreateQueue waits for a live node in the
// controller's table.
const placementWaitMs = 5000

// CreateQueue places a new queue's partitions spread first over the live
// nodes (this one and every peer membership sees alive that the table
// holds), the less loaded by their fresh reports first among equals, and
// commits it to the controller's catalogue.
func (n *Node) CreateQueue(ctx context.Context, topic, group string, settings []byte, partitions int) (broker.CatalogueQueue, error) {
	var placement []controller.Placement
	// A node that has just started may not be in the controller's table
	// yet (a cluster's first node commits itself right after it elects
	// itself): wait for it a little, within ctx, rather than refuse.
	wait := time.NewTimer(placementWaitMs * time.Millisecond)
	defer wait.Stop()
	for {
		st := n.ctl.Status()
		if q, ok := st.Table.Queue(topic, group); ok {
			return catalogueQueue(q), nil
		}
		live := []uint64{n.raftID}
		for _, p := range n.m.Members() {
			if p.State != membership.StateAlive {
				continue
			}
			if rid, err := controller.RaftIDOf(p.Name); err == nil {
				live = append(live, rid)
			}
		}
		if placement = controller.PlaceLoaded(st.Table, live, partitions, n.ctl.ReplicationFactor(), n.nodeLoads()); placement != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-wait.C:
		case <-time.After(50 * time.Millisecond):
			continue
		}
		return broker.CatalogueQueue{}, errors.New("no node of the controller's table is alive to hold it (has this node joined the controller yet?)")
	}
	q, err := n.ctl.CreateQueue(ctx, controller.Queue{Topic: topic, Group: group, Settings: settings, Partitions: placement})
	if err != nil {
		return broker.CatalogueQueue{}, err
	}
	return catalogueQueue(q), nil
}

// Lookup returns the catalogue's entry for a queue as this node applied it.
func (n *Node) Lookup(topic, group string) (broker.CatalogueQueue, bool) {
	q, ok := n.ctl.Status().Table.Queue(topic, group)
	if !ok {
		return broker.CatalogueQueue{}, false
	}
	return catalogueQueue(q), true
}

func catalogueQueue(q controller.Queue) broker.CatalogueQueue {
	out := broker.CatalogueQueue{Topic: q.Topic, Group: q.Group, Settings: q.Settings,
		PurgeSeq: q.PurgeSeq, PurgeDone: q.PurgeDone, PurgeCount: q.PurgeCount}
	for _, p := range q.Partitions {
		out.Partitions = append(out.Partitions, broker.RaftPlacement{RaftGroup: p.RaftGroup, Replicas: p.Replicas, Bootstrap: p.Bootstrap, Moving: p.Moving})
	}
	return out
}

// DeleteQueue removes a queue from the catalogue.
func (n *Node) DeleteQueue(ctx context.Context, topic, group string) (bool, error) {
	err := n.ctl.DeleteQueue(ctx, topic, group)
	if errors.Is(err, controller.ErrNoQueue) {
		return false, nil
	}
	return err == nil, err
}

// UpdateQueue replaces a queue's settings in the catalogue.
func (n *Node) UpdateQueue(ctx context.Context, topic, group string, settings []byte) (bool, error) {
	_, err := n.ctl.UpdateQueue(ctx, topic, group, settings)
	if errors.Is(err, controller.ErrNoQueue) {
		return false, nil
	}
	return err == nil, err
}

// PurgeQueue records a purge in the catalogue.
func (n *Node) PurgeQueue(ctx context.Context, topic, group string) (uint64, bool, error) {
	seq, err := n.ctl.PurgeQueue(ctx, topic, group)
	if errors.Is(err, controller.ErrNoQueue) {
		return 0, false, nil
	}
	return seq, err == nil, err
}

// PurgeDone reports a partition's purge carried out.
func (n *Node) PurgeDone(topic, group string, partition int, seq, count uint64) {
	n.ctl.PurgeDone(topic, group, partition, seq, count)
}

// PlacementDone reports a partition whose voters are its placed replicas.
func (n *Node) PlacementDone(topic, group string, partition int, raftGroup uint64, replicas []uint64) {
	n.ctl.PlacementDone(topic, group, partition, raftGroup, replicas)
}

// Self is this node's raft id.
func (n *Node) Self() uint64 { return n.raftID }

// ReplicationWant is how many replicas a queue should have now: the
// replication factor, capped by the nodes of the controller's table that
// have not left.
func (n *Node) ReplicationWant() int {
	return n.ctl.Status().Table.ReplicationWant(n.ctl.ReplicationFactor())
}

// Sender carries a partition group's raft messages through the host.
func (n *Node) Sender(group uint64) func([]*raftpb.Message) { return n.host.Sender(group) }

// AddGroup registers a partition replica with the raft host.
func (n *Node) AddGroup(group uint64, p *partition.Partition) error {
	if group < controller.FirstPartitionGroup {
		return fmt.Errorf("cluster: raft group %d is not a partition's", group)
	}
	return n.host.AddGroup(group, p)
}

// RemoveGroup takes a partition replica off the raft host.
func (n *Node) RemoveGroup(group uint64) {
	if group >= controller.FirstPartitionGroup {
		n.host.RemoveGroup(group)
	}
}

// ClientAddr is node raftID's client address in the committed table.
func (n *Node) ClientAddr(raftID uint64) string {
	nd, ok := n.ctl.Status().Table.Node(raftID)
	if !ok || nd.Left {
		return ""
	}
	return nd.ClientAddr
}

// Fenced reports whether membership holds a majority of the peers dead.
func (n *Node) Fenced() bool { return n.m != nil && n.m.Fenced() }

// PeerAlive reports whether membership does not hold node raftID dead or
// gone (broker.Cluster's). It reads the set watch keeps, without a lock:
// partitions ask it on every tick they lead.
func (n *Node) PeerAlive(raftID uint64) bool {
	if down := n.down.Load(); down != nil {
		_, d := (*down)[raftID]
		return !d
	}
	return true
}

// noteDown recomputes the set of peers membership holds dead or gone
// (PeerAlive), after a membership event.
func (n *Node) noteDown() {
	down := map[uint64]struct{}{}
	for _, p := range n.m.Members() {
		if p.State == membership.StateAlive {
			continue
		}
		if rid, err := controller.RaftIDOf(p.Name); err == nil {
			down[rid] = struct{}{}
		}
	}
	n.down.Store(&down)
}

// SyncCatalogue hands the broker every new state of the catalogue, so it
// opens the replicas placed on this node, records moved ones and drops
// those it no longer needs, and every reconfigureEvery (reconfigureIdleEvery
// while settled) asks it to carry placements out on the partitions this
// node owns, until ctx ends. It also
// adopts the committed runtime settings into rt and, while the controller
// holds none and this node leads it, commits rt's.
func (n *Node) SyncCatalogue(ctx context.Context, b *broker.Broker, rt *runtimesettings.Store) {
	applied := uint64(0)
	// pace is the next placement pass: reconfigureEvery while anything is
	// under way, reconfigureIdleEvery once a pass found the node settled,
	// until a group wakes or the controller's status changes.
	pace := time.NewTimer(reconfigureEvery)
	defer pace.Stop()
	idle := false
	hurry := func() {
		if idle {
			idle = false
			pace.Reset(reconfigureEvery)
		}
	}
	var seeding atomic.Bool
	for {
		changed := n.ctl.Changed()
		st := n.ctl.Status()
		switch r := st.Table.Runtime; {
		case r != nil:
			if err := rt.Adopt(runtimesettings.Doc{Version: r.Version, Values: r.Values}); err != nil {
				n.logger.Error("cannot apply the cluster's runtime settings", "version", r.Version, "err", err)
			}
		case st.Leader == n.raftID && seeding.CompareAndSwap(false, true):
			go func() {
				defer seeding.Store(false)
				d := rt.Snapshot()
				sctx, cancel := context.WithTimeout(ctx, runtimeCommitTimeout)
				defer cancel()
				if _, _, err := n.ctl.SetRuntime(sctx, 0, d.Version, d.Values); err != nil && ctx.Err() == nil {
					n.logger.Warn("cannot commit the runtime settings to the controller yet", "err", err)
				}
			}()
		}
		if st.Applied != applied {
			applied = st.Applied
			qs := make([]broker.CatalogueQueue, 0, len(st.Table.Queues))
			for _, q := range st.Table.Queues {
				qs = append(qs, catalogueQueue(q))
			}
			b.SyncCatalogue(qs, max(st.Table.NextRaftGroup, controller.FirstPartitionGroup))
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
			hurry()
		case <-b.PlacementStirred():
			hurry()
		case <-pace.C:
			rctx, cancel := context.WithTimeout(ctx, reconfigureEvery)
			idle = b.Reconfigure(rctx)
			cancel()
			if idle {
				pace.Reset(reconfigureIdleEvery)
			} else {
				pace.Reset(reconfigureEvery)
			}
		}
	}
}

// runtimeCommitTimeout bounds how long a runtime settings change waits for
// the controller to commit it.
const runtimeCommitTimeout = 10 * time.Second

// CommitRuntime is the runtime settings' Committer in a cluster: it commits
// next to the controller, based on version expected.
func (n *Node) CommitRuntime(expected uint64, next runtimesettings.Doc) (runtimesettings.Doc, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), runtimeCommitTimeout)
	defer cancel()
	if n.ctl.Status().Table.Runtime == nil {
		return runtimesettings.Doc{}, false, errors.New("the cluster holds no runtime settings yet (its controller has not committed the first ones)")
	}
	r, accepted, err := n.ctl.SetRuntime(ctx, expected, next.Version, next.Values)
	if err != nil {
		return runtimesettings.Doc{}, false, err
	}
	return runtimesettings.Doc{Version: r.Version, Values: r.Values}, accepted, nil
}

// reconfigureEvery is how often the partitions this node owns are moved a
// step toward their placement; reconfigureIdleEvery is the pace once a
// pass found nothing to do (broker.Broker.Reconfigure reports it), which a
// group's waking or a change in the controller's status cuts short.
const (
	reconfigureEvery     = 500 * time.Millisecond
	reconfigureIdleEvery = 5 * time.Second
)

var _ broker.CohortCluster = (*Node)(nil)

// ReportCohort reports the cohort members this node serves.
func (n *Node) ReportCohort(topic, group, name string, members []string) error {
	return n.ctl.ReportCohort(topic, group, name, members)
}

// CohortPlans returns the controller's committed cohort plans.
func (n *Node) CohortPlans() []broker.CohortPlan {
	ps := n.ctl.CohortPlans()
	out := make([]broker.CohortPlan, len(ps))
	for i, p := range ps {
		out[i] = broker.CohortPlan{Topic: p.Topic, Group: p.Group, Cohort: p.Cohort, Plan: p.Plan}
	}
	return out
}

// CohortsChanged returns a channel closed when the committed plans change.
func (n *Node) CohortsChanged() <-chan struct{} { return n.ctl.CohortsChanged() }
