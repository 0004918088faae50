package clusternode

import (
	"github.com/sinewmq/sinew/internal/admin"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/controller"
	"github.com/sinewmq/sinew/internal/membership"
)

// ReportLoad makes membership send b's load to the peers every
// membership.LoadIntervalDefault (docs/cluster.md, "Load signals"); nil
// stops the reports.
func (n *Node) ReportLoad(b *broker.Broker) {
	if b == nil {
		n.m.SetLoadSource(nil)
		return
	}
	n.m.SetLoadSource(func() membership.Load {
		l := b.LoadSample()
		return membership.Load{PartitionsLed: l.PartitionsLed, Backlog: l.Backlog, AppendRate: l.AppendRate}
	})
}

// nodeLoads is the fresh load reports by raft id, this node's own
// included, for placement: a node missing has none (or a stale one) and
// placement falls back to spread-first among its equals.
func (n *Node) nodeLoads() controller.NodeLoads {
	out := controller.NodeLoads{}
	if l, ok := n.m.LocalLoad(); ok {
		out[n.raftID] = controllerLoad(l)
	}
	for name, pl := range n.m.FreshLoads() {
		if rid, err := controller.RaftIDOf(name); err == nil {
			out[rid] = controllerLoad(pl.Load)
		}
	}
	return out
}

func controllerLoad(l membership.Load) controller.NodeLoad {
	return controller.NodeLoad{PartitionsLed: l.PartitionsLed, Backlog: l.Backlog, AppendRate: l.AppendRate}
}

// peerLoadViews is each alive peer's last report for GET /api/v1/nodes.
func (n *Node) peerLoadViews() map[string]*admin.NodeLoadView {
	stale := n.m.LoadStaleAfter()
	out := map[string]*admin.NodeLoadView{}
	for name, pl := range n.m.Loads() {
		out[name] = &admin.NodeLoadView{PartitionsLed: pl.PartitionsLed, Backlog: pl.Backlog, AppendRate: pl.AppendRate,
			AgeMs: pl.Age.Milliseconds(), Stale: pl.Age > stale}
	}
	return out
}
