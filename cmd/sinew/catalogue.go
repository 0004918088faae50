package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/controller"
	"github.com/sinewmq/sinew/internal/membership"
	"github.com/sinewmq/sinew/internal/partition"
)

// replicationFactor is how many replicas a partition gets where there are
// that many live nodes.
const replicationFactor = 3

// clusterNode is the broker's broker.Cluster.
var _ broker.Cluster = (*clusterNode)(nil)

// CreateQueue places a new queue's partitions spread first over the live
// nodes (this one and every peer membership sees alive that the table
// holds) and commits it to the controller's catalogue.
func (n *clusterNode) CreateQueue(ctx context.Context, topic, group string, settings []byte, partitions int) (broker.CatalogueQueue, error) {
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
	placement := controller.Place(st.Table, live, partitions, replicationFactor)
	if placement == nil {
		return broker.CatalogueQueue{}, errors.New("no node of the controller's table is alive to hold it (has this node joined the controller yet?)")
	}
	q, err := n.ctl.CreateQueue(ctx, controller.Queue{Topic: topic, Group: group, Settings: settings, Partitions: placement})
	if err != nil {
		return broker.CatalogueQueue{}, err
	}
	return catalogueQueue(q), nil
}

// Lookup returns the catalogue's entry for a queue as this node applied it.
func (n *clusterNode) Lookup(topic, group string) (broker.CatalogueQueue, bool) {
	q, ok := n.ctl.Status().Table.Queue(topic, group)
	if !ok {
		return broker.CatalogueQueue{}, false
	}
	return catalogueQueue(q), true
}

func catalogueQueue(q controller.Queue) broker.CatalogueQueue {
	out := broker.CatalogueQueue{Topic: q.Topic, Group: q.Group, Settings: q.Settings}
	for _, p := range q.Partitions {
		out.Partitions = append(out.Partitions, broker.RaftPlacement{RaftGroup: p.RaftGroup, Replicas: p.Replicas, Bootstrap: p.Bootstrap})
	}
	return out
}

// Self is this node's raft id.
func (n *clusterNode) Self() uint64 { return n.raftID }

// Sender carries a partition group's raft messages through the host.
func (n *clusterNode) Sender(group uint64) func([]*raftpb.Message) { return n.host.Sender(group) }

// AddGroup registers a partition replica with the raft host.
func (n *clusterNode) AddGroup(group uint64, p *partition.Partition) error {
	if group < controller.FirstPartitionGroup {
		return fmt.Errorf("cluster: raft group %d is not a partition's", group)
	}
	return n.host.AddGroup(group, p)
}

// RemoveGroup takes a partition replica off the raft host.
func (n *clusterNode) RemoveGroup(group uint64) {
	if group >= controller.FirstPartitionGroup {
		n.host.RemoveGroup(group)
	}
}

// ClientAddr is node raftID's client address in the committed table.
func (n *clusterNode) ClientAddr(raftID uint64) string {
	nd, ok := n.ctl.Status().Table.Node(raftID)
	if !ok || nd.Left {
		return ""
	}
	return nd.ClientAddr
}

// Fenced reports whether membership holds a majority of the peers dead.
func (n *clusterNode) Fenced() bool { return n.m != nil && n.m.Fenced() }

// syncCatalogue hands the broker every new state of the catalogue, so it
// opens the replicas placed on this node and records moved ones, and every
// reconfigureEvery asks it to carry placements out on the partitions this
// node owns, until ctx ends.
func (n *clusterNode) syncCatalogue(ctx context.Context, b *broker.Broker) {
	applied := uint64(0)
	tick := time.NewTicker(reconfigureEvery)
	defer tick.Stop()
	for {
		changed := n.ctl.Changed()
		st := n.ctl.Status()
		if st.Applied != applied {
			applied = st.Applied
			qs := make([]broker.CatalogueQueue, 0, len(st.Table.Queues))
			for _, q := range st.Table.Queues {
				qs = append(qs, catalogueQueue(q))
			}
			b.SyncCatalogue(qs)
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-tick.C:
			rctx, cancel := context.WithTimeout(ctx, reconfigureEvery)
			b.Reconfigure(rctx)
			cancel()
		}
	}
}

// reconfigureEvery is how often the partitions this node owns are moved a
// step toward their placement.
const reconfigureEvery = 500 * time.Millisecond
