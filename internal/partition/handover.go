package partition

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// handOverParallelMax bounds the replicas HandOver asks at once (each ask
// waits for its replica's actor to run it between two turns).
const handOverParallelMax = 32

// handOverAskEvery: HandOver asks a group still led here again at every
// handOverAskEvery-th look.
const handOverAskEvery = 5

// StopLeading makes this replica refuse the lead from now on, for a node
// that is stopping: a leadership transfer to it (raft's MsgTimeoutNow) is
// ignored, so the leader that asked abandons it after an election timeout,
// and it starts no election (its pre-vote requests are not sent). It still
// votes and follows, so its group elects without it as before. A lead it
// holds it keeps: HandOver hands that over. It is not undone: the node is
// stopping.
func (p *Partition) StopLeading() { p.leaving.Store(true) }

// Handover is a replica of a node that is stopping, and the raft ids its
// lead may go to, preferred first (its placement's replicas; the replica
// itself is skipped).
type Handover struct {
	P    *Partition
	Want []uint64
}

// HandoverReport is what HandOver did with the groups it was given.
type HandoverReport struct {
	// Led counts the groups whose replica led when HandOver began.
	Led int
	// HandedOver counts those led at the end by a replica the lead was
	// handed to (a raft leadership transfer), Elected those led by
	// another replica (an election made it leader), and Left those still
	// led here, or with no leader known, when the time was up: they are
	// left to the normal election once the node is gone.
	HandedOver, Elected, Left int
	// Alone counts the groups of one replica this node leads: there is no
	// one to hand their lead to. They are not in Led.
	Alone int
	// NewLeaders counts the groups of Led that another replica leads at
	// the end (handed over or elected), by its raft id.
	NewLeaders map[uint64]int
	// Err is the first error a replica answered (nil for none); the
	// replica is asked again with the others still led here.
	Err error
}

// HandOver, for a node that is stopping, stops every replica of hs from
// taking the lead (StopLeading), then hands the lead of each that leads to
// a caught-up voter of its group (HandLeadOver), all at once rather than
// one group after the other, and waits, looking every poll, until another
// replica leads every group that was led here or ctx ends, whose deadline
// bounds the whole. Every handOverAskEvery looks a group still led here is
// asked again: a transfer raft abandoned (the voter did not take it within
// an election timeout), or one that found no voter caught up yet, starts
// again. What is still led here when ctx ends is left to the normal
// election.
func HandOver(ctx context.Context, hs []Handover, why string, poll time.Duration) HandoverReport {
	rep := HandoverReport{NewLeaders: map[uint64]int{}}
	type group struct {
		h    Handover
		self uint64
		to   []uint64 // the voters its lead was handed to
	}
	var led []*group
	for _, h := range hs {
		h.P.StopLeading()
		lead, _ := h.P.Leader()
		if lead == 0 || lead != h.P.raftID || h.P.Unavailable() != nil {
			continue
		}
		if h.P.single {
			rep.Alone++
			continue
		}
		led = append(led, &group{h: h, self: lead})
	}
	rep.Led = len(led)
	// moved reports whether another replica leads g.
	moved := func(g *group) bool {
		lead, _ := g.h.P.Leader()
		return lead != 0 && lead != g.self
	}
	var mu sync.Mutex
	ask := func(pending []*group) {
		sem := make(chan struct{}, handOverParallelMax)
		var wg sync.WaitGroup
		for _, g := range pending {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				_, to, err := g.h.P.handLeadOver(ctx, g.h.Want, why)
				mu.Lock()
				defer mu.Unlock()
				if to != 0 && !slices.Contains(g.to, to) {
					g.to = append(g.to, to)
				}
				if err != nil && !errors.Is(err, ErrNotLeader) && ctx.Err() == nil && rep.Err == nil {
					rep.Err = err
				}
			}()
		}
		wg.Wait()
	}
	pending := slices.Clone(led)
	for look := 0; len(pending) > 0 && ctx.Err() == nil; look++ {
		if look%handOverAskEvery == 0 {
			ask(pending)
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		pending = slices.DeleteFunc(pending, moved)
	}
	for _, g := range led {
		lead, _ := g.h.P.Leader()
		switch {
		case lead == 0 || lead == g.self:
			rep.Left++
			continue
		case slices.Contains(g.to, lead):
			rep.HandedOver++
		default:
			rep.Elected++
		}
		rep.NewLeaders[lead]++
	}
	return rep
}
