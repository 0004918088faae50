package clusternode

import (
	"context"
	"slices"
	"time"

	"github.com/sinewmq/sinew/internal/broker"
	"github.com/sinewmq/sinew/internal/controller"
	"github.com/sinewmq/sinew/internal/membership"
)

// clusterStopHandoverMs bounds the first step of a cluster node's planned
// stop, before its drain: handing over the lead of every raft group it
// leads. A transfer takes a round trip once a voter has caught up; what is
// not handed over by then is left to the election that follows the exit.
const clusterStopHandoverMs = 5_000

// controllerHandoverPollMs is how often the stop looks whether the
// controller's lead has moved.
const controllerHandoverPollMs = 20

// HandOverForStop is the first step of a planned stop (SIGTERM, the admin
// drain, the end of a leave): this node takes no lead from now on, the
// lead of every partition it owns (broker.HandOverForStop) and of the
// controller group, if it leads it, goes to a caught-up voter, all at once,
// bounded by clusterStopHandoverMs. It logs one line with what moved and
// returns the client address of a node that stays up, for GOING_AWAY's
// redirect (the new owner of most of the partitions this node owned, else
// another live voter of the controller), and how long it took.
func (n *Node) HandOverForStop(b *broker.Broker) (redirect string, took time.Duration) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), clusterStopHandoverMs*time.Millisecond)
	defer cancel()
	// A fenced controller leader hands its lead to a caught-up voter and
	// plans nothing; the run loop keeps it so while the node stops.
	ctlLed := n.ctl.Status().Leader == n.raftID
	n.stopping.Store(true)
	n.ctl.SetFenced(true)
	ctlDone := make(chan bool, 1)
	go func() {
		for ctlLed {
			if l := n.ctl.Status().Leader; l != 0 && l != n.raftID {
				ctlDone <- true
				return
			}
			select {
			case <-ctx.Done():
				ctlDone <- false
				return
			case <-time.After(controllerHandoverPollMs * time.Millisecond):
			}
		}
		ctlDone <- false
	}()
	rep := b.HandOverForStop(ctx)
	ctlHanded := <-ctlDone
	took = time.Since(start)
	redirect = n.stayingNode(rep.NewLeaders)
	attrs := []any{"partitions_led", rep.Led, "handed_over", rep.HandedOver, "elected", rep.Elected, "left_to_election", rep.Left,
		"controller_led", ctlLed, "controller_handed_over", ctlHanded, "redirect", redirect, "took_ms", took.Milliseconds()}
	if rep.Alone > 0 {
		attrs = append(attrs, "single_replica", rep.Alone)
	}
	if rep.Err != nil {
		attrs = append(attrs, "err", rep.Err)
	}
	if rep.Left > 0 || ctlLed && !ctlHanded {
		n.logger.Warn("cluster: stopping; not every lead was handed over in time, the rest is left to an election", attrs...)
	} else {
		n.logger.Info("cluster: stopping; leads handed over", attrs...)
	}
	return redirect, took
}

// stayingNode is the client address of a node that stays up: the one
// leading most of newLeaders (groups by raft id), else the controller's
// leader, else another live voter of the controller ("" when none is
// known).
func (n *Node) stayingNode(newLeaders map[uint64]int) string {
	best, most := uint64(0), 0
	for id, k := range newLeaders {
		if id != n.raftID && (k > most || k == most && id < best) {
			best, most = id, k
		}
	}
	if best != 0 {
		if a := n.ClientAddr(best); a != "" {
			return a
		}
	}
	st := n.ctl.Status()
	if st.Leader != 0 && st.Leader != n.raftID {
		if a := n.ClientAddr(st.Leader); a != "" {
			return a
		}
	}
	alive := map[uint64]bool{}
	for _, p := range n.m.Members() {
		if rid, err := controller.RaftIDOf(p.Name); err == nil && p.State == membership.StateAlive {
			alive[rid] = true
		}
	}
	voters := slices.Sorted(slices.Values(st.Voters))
	for _, id := range voters {
		if id != n.raftID && alive[id] {
			if a := n.ClientAddr(id); a != "" {
				return a
			}
		}
	}
	return ""
}
