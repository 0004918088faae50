package clusternode

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/sinewmq/sinew/internal/admin"
	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/controller"
	"github.com/sinewmq/sinew/internal/membership"
)

// moveNodePrefixMin is the shortest node id prefix a move may name a node
// by.
const moveNodePrefixMin = 4

// adminMoves wires the operator moves (internal/controller/moves.go) into
// the admin API (its Broker, read at each request, shows the steps).
func (n *Node) adminMoves(acfg *admin.Config) {
	b := func() *broker.Broker { return acfg.Broker }
	acfg.Moves = func(ctx context.Context) admin.MovesView {
		st := n.ctl.Status()
		v := admin.MovesView{Cluster: true, Moves: []admin.MoveView{}, Pinned: []admin.QueueRef{}}
		// Newest first: the running ones are the operator's concern.
		for i := len(st.Table.Moves) - 1; i >= 0; i-- {
			v.Moves = append(v.Moves, moveView(ctx, st.Table, st.Table.Moves[i], b()))
		}
		for _, q := range st.Table.Queues {
			if q.Pinned {
				v.Pinned = append(v.Pinned, admin.QueueRef{Topic: q.Topic, Group: q.Group})
			}
		}
		return v
	}
	acfg.StartMove = func(ctx context.Context, r admin.MoveRequest) (admin.MoveView, error) {
		tbl := n.ctl.Status().Table
		to, err := resolveMoveNode(tbl, "to", r.To)
		if err != nil {
			return admin.MoveView{}, err
		}
		var from uint64
		if strings.TrimSpace(r.From) != "" {
			if from, err = resolveMoveNode(tbl, "from", r.From); err != nil {
				return admin.MoveView{}, err
			}
		}
		part := -1
		if r.Partition != nil {
			part = *r.Partition
		}
		m, err := n.ctl.StartMove(ctx, controller.MoveRequest{Topic: r.Topic, Group: r.Group, Partition: part, From: from, To: to, Live: n.aliveNow})
		if errors.Is(err, controller.ErrMoveNodeNotLive) {
			return admin.MoveView{}, &admin.Error{Status: http.StatusConflict, Code: controller.ErrMoveNodeNotLive.Code,
				Msg: fmt.Sprintf("the target node %s is not alive in this node's membership view (sinew admin nodes shows it); a node that just joined is seen within a few seconds", r.To)}
		}
		if err != nil {
			return admin.MoveView{}, moveAPIError(err)
		}
		n.logger.Info("cluster: operator move started", "move", m.ID, "topic", m.Topic, "group", m.Group, "from", m.From, "to", m.To)
		st := n.ctl.Status()
		return moveView(ctx, st.Table, m, b()), nil
	}
	acfg.UnpinQueue = func(ctx context.Context, topic, group string) error {
		if err := n.ctl.UnpinQueue(ctx, topic, group); err != nil {
			return moveAPIError(err)
		}
		n.logger.Info("cluster: queue unpinned: the rebalancer may move its replicas again", "topic", topic, "group", group)
		return nil
	}
	acfg.CancelMove = func(ctx context.Context, id uint64, reason string) (admin.MoveView, error) {
		if reason == "" {
			reason = "cancelled by an operator"
		}
		m, err := n.ctl.CancelMove(ctx, id, reason)
		if err != nil {
			return admin.MoveView{}, moveAPIError(err)
		}
		n.logger.Info("cluster: operator move cancelled", "move", m.ID, "topic", m.Topic, "group", m.Group, "state", m.State)
		st := n.ctl.Status()
		return moveView(ctx, st.Table, m, b()), nil
	}
}

// aliveNow reports whether this node's membership holds node raftID alive
// now (this node is).
func (n *Node) aliveNow(raftID uint64) bool {
	if raftID == n.raftID {
		return true
	}
	for _, p := range n.m.Members() {
		if rid, err := controller.RaftIDOf(p.Name); err == nil && rid == raftID {
			return p.State == membership.StateAlive
		}
	}
	return false
}

// resolveMoveNode finds the node a move names (what: from or to): by node
// id, by a prefix of it naming one node, or by client address.
func resolveMoveNode(tbl *controller.Table, what, s string) (uint64, error) {
	s = strings.TrimSpace(s)
	var found []controller.Node
	for _, nd := range tbl.Nodes {
		if strings.EqualFold(nd.ID, s) || nd.ClientAddr == s {
			return nd.RaftID, nil
		}
		if len(s) >= moveNodePrefixMin && strings.HasPrefix(nd.ID, strings.ToLower(s)) {
			found = append(found, nd)
		}
	}
	switch len(found) {
	case 1:
		return found[0].RaftID, nil
	case 0:
		return 0, &admin.Error{Status: http.StatusNotFound, Code: "unknown_node",
			Msg: fmt.Sprintf("%s: no node %q in the cluster's table (name it by its node id, a prefix of %d or more of its digits, or its client address; sinew admin nodes lists them)", what, s, moveNodePrefixMin)}
	}
	return 0, &admin.Error{Status: http.StatusBadRequest, Code: "ambiguous_node",
		Msg: fmt.Sprintf("%s: %q is the start of %d node ids; give more of it", what, s, len(found))}
}

// moveAPIError answers a controller refusal with its status and code.
func moveAPIError(err error) error {
	var me *controller.MoveError
	switch {
	case errors.Is(err, controller.ErrNoQueue):
		return &admin.Error{Status: http.StatusNotFound, Code: "not_found", Msg: err.Error()}
	case errors.Is(err, controller.ErrNoLeader):
		return &admin.Error{Status: http.StatusServiceUnavailable, Code: "unavailable", Msg: err.Error() + ": the controller has no leader; retry"}
	case errors.As(err, &me):
		status := http.StatusConflict
		switch me.Code {
		case controller.ErrMoveNoPartition.Code, controller.ErrMoveNoNode.Code, controller.ErrMoveUnknown.Code:
			status = http.StatusNotFound
		case controller.ErrMovePerQueue.Code:
			status = http.StatusBadRequest
		}
		return &admin.Error{Status: status, Code: me.Code, Msg: me.Msg}
	}
	return err
}

// moveView is the admin API's view of move m, with each partition's step
// as this node's replica of the queue sees it (b nil or holding none: no
// steps).
func moveView(ctx context.Context, tbl *controller.Table, m controller.Move, b *broker.Broker) admin.MoveView {
	v := admin.MoveView{ID: m.ID, Topic: m.Topic, Group: m.Group, State: m.State, Reason: m.Reason,
		Cancellable: m.State == controller.MoveCatchingUp, StartedAt: m.ID, EndedAt: m.EndedAt}
	if m.Partition >= 0 {
		p := m.Partition
		v.Partition = &p
	}
	if nd, ok := tbl.Node(m.From); ok {
		v.From, v.FromAddr = nd.ID, nd.ClientAddr
	}
	if nd, ok := tbl.Node(m.To); ok {
		v.To, v.ToAddr = nd.ID, nd.ClientAddr
	}
	if !m.Running() || b == nil {
		return v
	}
	q, ok := tbl.Queue(m.Topic, m.Group)
	if !ok {
		return v
	}
	steps := b.MoveSteps(ctx, m.Topic, m.Group, m.From, m.To, m.State == controller.MoveCuttingOver)
	if len(steps) != len(q.Partitions) {
		return v
	}
	count := map[string]int{}
	for i, s := range steps {
		pv := admin.MovePartitionView{Partition: s.Partition, Moving: q.Partitions[i].Moving, Step: s.Step, Owner: s.Owner}
		if s.Progress {
			match, commit, lag := s.Match, s.Commit, uint64(0)
			if commit > match {
				lag = commit - match
			}
			pv.Applied, pv.Commit, pv.Lag = &match, &commit, &lag
		}
		count[s.Step]++
		v.Partitions = append(v.Partitions, pv)
	}
	// The move's state in the words of its steps, where this node knows
	// them: pending until a partition has the target, transferring while
	// a source still leads, removing until the groups vote without it.
	switch {
	case m.State == controller.MoveCatchingUp && count[broker.MoveStepAdding] == len(steps):
		v.State = "pending"
	case m.State == controller.MoveCuttingOver && count[broker.MoveStepTransferring] > 0:
		v.State = "transferring"
	case m.State == controller.MoveCuttingOver:
		v.State = "removing"
	}
	return v
}
