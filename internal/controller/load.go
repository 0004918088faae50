package controller

import (
	"cmp"
	"maps"
	"slices"
	"strings"
)

// NodeLoad is what a node last reported of its load (membership's load
// report), for placement. It is advisory: it only breaks ties that
// spread-first placement (replicas held) leaves.
type NodeLoad struct {
	PartitionsLed uint32
	Backlog       uint64
	AppendRate    uint32
}

// compare orders reports: by records appended per second (the work the
// node does now), then by backlog (the work waiting), then by partitions
// led.
func (l NodeLoad) compare(o NodeLoad) int {
	switch {
	case l.AppendRate != o.AppendRate:
		return cmp.Compare(l.AppendRate, o.AppendRate)
	case l.Backlog != o.Backlog:
		return cmp.Compare(l.Backlog, o.Backlog)
	}
	return cmp.Compare(l.PartitionsLed, o.PartitionsLed)
}

// NodeLoads maps a node's raft id to its fresh report. A node missing has
// no usable report (none yet, or a stale one).
type NodeLoads map[uint64]NodeLoad

// orderBy sorts ids least loaded first: by replicas held (spread first),
// then, within each run of ids holding as many replicas, by reported load
// when every id of that run has a report in loads, and otherwise in the
// order ids had (stable). With no loads it is exactly the spread-first
// order. It is a pure function of its inputs.
func orderBy(ids []uint64, replicas map[uint64]int, loads NodeLoads) {
	slices.SortStableFunc(ids, func(a, b uint64) int { return replicas[a] - replicas[b] })
	if len(loads) == 0 {
		return
	}
	for i := 0; i < len(ids); {
		j := i + 1
		for j < len(ids) && replicas[ids[j]] == replicas[ids[i]] {
			j++
		}
		run := ids[i:j]
		all := true
		for _, id := range run {
			if _, ok := loads[id]; !ok {
				all = false
				break
			}
		}
		if all && len(run) > 1 {
			slices.SortStableFunc(run, func(a, b uint64) int { return loads[a].compare(loads[b]) })
		}
		i = j
	}
}

// SetNodeLoads hands the controller the nodes' fresh load reports (this
// node's own included). Only the leader's plans read them, when they
// choose the node that takes a replica among nodes holding as many
// replicas; no applied entry depends on them. Nil or empty: plans are
// spread-first alone.
func (c *Controller) SetNodeLoads(l NodeLoads) {
	c.mu.Lock()
	c.loads = maps.Clone(l)
	c.mu.Unlock()
}

// planLoads returns the loads the recovery plan uses this turn. They are
// refreshed from SetNodeLoads only while no replica change the plan
// proposed is waiting, so that a change of loads does not make the plan
// name another target for a move it already proposed.
func (c *Controller) planLoads() NodeLoads {
	for k := range c.proposed {
		if strings.HasPrefix(k, "replace/") || strings.HasPrefix(k, "add/") || strings.HasPrefix(k, "rebalance/") {
			return c.usedLoads
		}
	}
	c.mu.Lock()
	c.usedLoads = c.loads
	c.mu.Unlock()
	return c.usedLoads
}
