package partition

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/multiraft"
)

// The tests in this file move a partition's lead with Reconfigure, on the
// three-replica group of replica_test.go (synctest bubble, in-process
// network, simulated time).

// reconfigure runs one Reconfigure step on replica n.
func (g *rgroup) reconfigure(n *rnode, want []uint64) (string, error) {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), inspectWaitMax)
	defer cancel()
	return n.p.Reconfigure(ctx, want)
}

// stepUntilTransfer steps l toward want every 5 ticks (the broker calls
// Reconfigure every 10 ticks of its 50 ms) for at most ticks ticks,
// calling before(k) ahead of tick k, and returns the tick of its first
// step, which must be a transfer of the lead to want[0]; -1 for none.
func (g *rgroup) stepUntilTransfer(l *rnode, want []uint64, ticks int, before func(k int)) int {
	g.t.Helper()
	for k := 0; k < ticks; k++ {
		if before != nil {
			before(k)
		}
		if k%5 == 0 {
			what, err := g.reconfigure(l, want)
			if err != nil {
				g.t.Fatalf("tick %d: Reconfigure: %v", k, err)
			}
			if what != "" {
				if !strings.HasPrefix(what, fmt.Sprintf("transfer leadership to %d", want[0])) {
					g.t.Fatalf("tick %d: step %q, want a transfer to %d", k, what, want[0])
				}
				return k
			}
		}
		g.run(replTick)
	}
	return -1
}

// others returns the ids of the group other than id, in order.
func others(id uint64) []uint64 {
	var out []uint64
	for o := uint64(1); o <= 3; o++ {
		if o != id {
			out = append(out, o)
		}
	}
	return out
}

// awaitNewLeader runs until a replica other than old leads and every up
// replica follows it (bounded in simulated time).
func (g *rgroup) awaitNewLeader(old uint64) *rnode {
	g.t.Helper()
	for range 100 {
		if l := g.awaitLeader(); l.id != old {
			return l
		}
		g.run(replTick)
	}
	g.fatalf("replica %d still leads after 1s of simulated time", old)
	return nil
}

// publishN publishes n messages named prefix0.. through p and fails the
// test unless each is confirmed.
func (g *rgroup) publishN(p *Partition, prefix string, n int) {
	g.t.Helper()
	for i := range n {
		body := fmt.Sprint(prefix, i)
		if r, ok := awaitRes(g, g.hist.publish(p, body), time.Second); !ok || r.err != nil {
			g.fatalf("publish %s: %v (answered %v)", body, r.err, ok)
		}
	}
}

// A leader the placement no longer names hands its lead to the first
// wanted voter, and the new leader then removes it from the group.
// Publishes in flight at the transfer, and those sent while it is under
// way, are each answered: confirmed, or refused with ErrNotLeader (which
// clients retry); every confirmed one is on the new leader.
func TestReplicaGroupUnwantedLeaderHandsOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newRGroup(t, 21, multiraft.Faults{DelayMinMs: 1, DelayMaxMs: 5}, nil)
		defer g.closeAll()
		l := g.awaitLeader()
		want := others(l.id)
		g.publishN(l.p, "m", 20)
		g.run(3 * replTick) // the leader notes its caught-up voters at its ticks

		var answers []chan pubResult
		for i := range 5 {
			answers = append(answers, g.hist.publish(l.p, fmt.Sprint("before", i)))
		}
		what, err := g.reconfigure(l, want)
		if err != nil || !strings.HasPrefix(what, fmt.Sprintf("transfer leadership to %d", want[0])) {
			t.Fatalf("Reconfigure on the unwanted leader: %q, %v; want a transfer to %d", what, err, want[0])
		}
		for i := range 5 {
			answers = append(answers, g.hist.publish(l.p, fmt.Sprint("during", i)))
		}
		nl := g.awaitNewLeader(l.id)
		if nl.id != want[0] {
			t.Fatalf("replica %d leads, want %d", nl.id, want[0])
		}
		for i, ch := range answers {
			r, ok := awaitRes(g, ch, time.Second)
			if !ok {
				t.Fatalf("publish %d around the transfer not answered", i)
			}
			if r.err != nil && !errors.Is(r.err, ErrNotLeader) {
				t.Fatalf("publish %d around the transfer: %v, want ok or ErrNotLeader", i, r.err)
			}
		}
		// The old leader's actor serves on: it refuses at once.
		if r, ok := awaitRes(g, g.hist.publish(l.p, "after"), time.Second); !ok || !errors.Is(r.err, ErrNotLeader) {
			t.Fatalf("publish to the former leader: %v (answered %v), want ErrNotLeader", r.err, ok)
		}
		if _, err := g.reconfigure(l, want); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("Reconfigure on the former leader: %v, want ErrNotLeader", err)
		}

		// The new leader removes the old replica, once its first entry
		// is committed.
		var step string
		for range 100 {
			if step, err = g.reconfigure(nl, want); err != nil {
				t.Fatal(err)
			}
			if step != "" {
				break
			}
			g.run(replTick)
		}
		if step != fmt.Sprintf("remove %d", l.id) {
			t.Fatalf("the new leader's step: %q, want remove %d", step, l.id)
		}
		for range 100 {
			if v, _ := nl.p.RaftConf(); slices.Equal(slices.Sorted(slices.Values(v)), want) {
				break
			}
			g.run(replTick)
		}
		if v, _ := nl.p.RaftConf(); !slices.Equal(slices.Sorted(slices.Values(v)), want) {
			t.Fatalf("voters %v after the removal, want %v", v, want)
		}
		if step, err := g.reconfigure(nl, want); step != "" || err != nil {
			t.Fatalf("Reconfigure once placed: %q, %v; want nothing", step, err)
		}
		g.publishN(nl.p, "next", 10)
		g.drain(nl)
	})
}

// A transfer that does not complete (the transferee is cut off) is
// abandoned by raft after an election timeout: the leader refuses
// publishes meanwhile, then takes them again.
func TestReplicaGroupAbandonedTransferResumes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newRGroup(t, 22, multiraft.Faults{DelayMinMs: 1, DelayMaxMs: 5}, nil)
		defer g.closeAll()
		l := g.awaitLeader()
		want := others(l.id)
		g.publishN(l.p, "m", 10)
		g.run(3 * replTick)
		what, err := g.reconfigure(l, want)
		if err != nil || !strings.HasPrefix(what, "transfer leadership") {
			t.Fatalf("Reconfigure: %q, %v; want a transfer", what, err)
		}
		g.net.Cut(l.id, want[0])
		r, ok := awaitRes(g, g.hist.publish(l.p, "during"), 2*replTick)
		if !ok || !errors.Is(r.err, ErrNotLeader) {
			t.Fatalf("publish during the transfer: %v (answered %v), want ErrNotLeader", r.err, ok)
		}
		if id, _ := l.p.Leader(); id != l.id {
			t.Fatalf("replica %d leads during the transfer, want %d still", id, l.id)
		}
		// A second step while the transfer is under way does nothing.
		if what, err := g.reconfigure(l, want); what != "" || err != nil {
			t.Fatalf("Reconfigure during the transfer: %q, %v; want nothing", what, err)
		}
		g.run(raftElectionTicks * 2 * replTick)
		if id, _ := l.p.Leader(); id != l.id {
			t.Fatalf("replica %d leads after the abandoned transfer, want %d", id, l.id)
		}
		g.publishN(l.p, "resumed", 10)
		g.net.Heal()
		g.settleReplicas()
		g.drain(g.awaitLeader())
	})
}

// The lead returns to the placement's preferred owner once it has been a
// caught-up voter for the hold-down, and not before: here the preferred
// owner crashes, the others go on, and it restarts and catches up.
func TestReplicaGroupLeadReturnsToPreferredOwner(t *testing.T) {
	const hold = 100 // raft ticks
	synctest.Test(t, func(t *testing.T) {
		g := newRGroup(t, 23, multiraft.Faults{DelayMinMs: 1, DelayMaxMs: 5}, func(c *Config) {
			c.PreferredOwnerHoldTicks = hold
		})
		defer g.closeAll()
		l := g.awaitLeader()
		o := others(l.id)
		pref := o[0]
		want := []uint64{pref, l.id, o[1]}
		g.publishN(l.p, "m", 10)
		g.crash(pref)
		g.run(20 * replTick)
		g.publishN(l.p, "without", 10)
		g.restart(pref)

		// The broker calls Reconfigure every 500 ms, 10 ticks of its
		// 50 ms; here every 5 ticks.
		transferAt := -1
		for k := 0; k < hold+100; k++ {
			if k%5 == 0 {
				what, err := g.reconfigure(l, want)
				if err != nil {
					t.Fatalf("tick %d: Reconfigure: %v", k, err)
				}
				if what != "" {
					if !strings.HasPrefix(what, fmt.Sprintf("transfer leadership to %d", pref)) {
						t.Fatalf("tick %d: step %q, want a transfer to %d", k, what, pref)
					}
					transferAt = k
					break
				}
			}
			if id, _ := l.p.Leader(); id != l.id {
				t.Fatalf("tick %d: replica %d leads before the hold-down passed", k, id)
			}
			g.run(replTick)
		}
		// The restarted replica catches up within a few ticks; the
		// transfer follows the hold-down at the next step.
		if transferAt < hold || transferAt > hold+30 {
			t.Fatalf("transfer at tick %d after the restart, want within [%d, %d]", transferAt, hold, hold+30)
		}
		nl := g.awaitNewLeader(l.id)
		if nl.id != pref {
			t.Fatalf("replica %d leads after the transfer, want %d", nl.id, pref)
		}
		// The preferred owner leads: nothing more to do, on either side.
		g.run(hold * 2 * replTick)
		if what, err := g.reconfigure(nl, want); what != "" || err != nil {
			t.Fatalf("Reconfigure on the preferred owner: %q, %v; want nothing", what, err)
		}
		if _, err := g.reconfigure(l, want); !errors.Is(err, ErrNotLeader) {
			t.Fatalf("Reconfigure on the former leader: %v, want ErrNotLeader", err)
		}
		g.publishN(nl.p, "after", 10)
		g.drain(nl)
	})
}

// A queue made while its cluster forms: the preferred owner's replica
// opens late, after the others elected the group's first leader. Under
// that first leader, whose voters have not fallen behind, the lead goes to
// the preferred owner after the short hold-down (firstLeadHoldTicks), not
// the one meant for a node back from a crash.
func TestReplicaGroupLateFirstOwnerGetsTheLeadSoon(t *testing.T) {
	const hold = 400 // raft ticks
	synctest.Test(t, func(t *testing.T) {
		g := newRGroup(t, 29, multiraft.Faults{DelayMinMs: 1, DelayMaxMs: 5}, func(c *Config) {
			c.PreferredOwnerHoldTicks = hold
		})
		defer g.closeAll()
		const pref = 3
		g.crash(pref) // before the group's first election: it never had a replica
		l := g.awaitLeader()
		if l.id == pref {
			t.Fatalf("replica %d leads while down", pref)
		}
		g.publishN(l.p, "m", 10)
		g.restart(pref)
		want := []uint64{pref, others(pref)[0], others(pref)[1]}
		transferAt := g.stepUntilTransfer(l, want, hold, nil)
		if transferAt < firstLeadHoldTicks || transferAt > firstLeadHoldTicks+30 {
			t.Fatalf("transfer at tick %d after the late replica opened, want within [%d, %d]", transferAt, firstLeadHoldTicks, firstLeadHoldTicks+30)
		}
		nl := g.awaitNewLeader(l.id)
		if nl.id != pref {
			t.Fatalf("replica %d leads after the transfer, want %d", nl.id, pref)
		}
		g.publishN(nl.p, "after", 10)
		g.drain(nl)
	})
}

// A leader whose node is fenced hands its lead to a caught-up voter
// (HandLeadOver), the first the placement names; a replica that does not
// lead answers ErrNotLeader, and the new leader serves publishes.
func TestReplicaGroupHandLeadOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newRGroup(t, 23, multiraft.Faults{DelayMinMs: 1, DelayMaxMs: 5}, nil)
		defer g.closeAll()
		l := g.awaitLeader()
		g.publishN(l.p, "m", 10)
		g.run(3 * replTick) // the leader notes its caught-up voters at its ticks
		want := append([]uint64{l.id}, others(l.id)...)
		slices.Reverse(want[1:]) // the last other first: not merely the lowest id
		ctx, cancel := context.WithTimeout(context.Background(), inspectWaitMax)
		defer cancel()
		for _, n := range g.nodes[1:] {
			if n.id == l.id {
				continue
			}
			if _, err := n.p.HandLeadOver(ctx, want, "test"); !errors.Is(err, ErrNotLeader) {
				t.Fatalf("HandLeadOver on follower %d: %v, want ErrNotLeader", n.id, err)
			}
		}
		what, err := l.p.HandLeadOver(ctx, want, "test")
		if err != nil || !strings.HasPrefix(what, fmt.Sprintf("transfer leadership to %d", want[1])) {
			t.Fatalf("HandLeadOver on the leader: %q, %v; want a transfer to %d", what, err, want[1])
		}
		nl := g.awaitNewLeader(l.id)
		if nl.id != want[1] {
			t.Fatalf("replica %d leads, want %d", nl.id, want[1])
		}
		g.publishN(nl.p, "next", 10)
		g.drain(nl)
	})
}

// A preferred owner that is caught up over raft while the cluster's
// membership sees its node dead (fenced, or its gossip cut) does not get
// the lead back: its hold-down counts only from when its node is alive
// again (Config.PeerAlive), so the lead does not go to it only to be
// handed over again.
func TestReplicaGroupLeadStaysWhileThePreferredOwnerIsSeenDead(t *testing.T) {
	const hold = 60 // raft ticks
	synctest.Test(t, func(t *testing.T) {
		var prefDown atomic.Bool
		const pref = 3
		prefDown.Store(true)
		g := newRGroup(t, 31, multiraft.Faults{DelayMinMs: 1, DelayMaxMs: 5}, func(c *Config) {
			c.PreferredOwnerHoldTicks = hold
			c.PeerAlive = func(id uint64) bool { return id != pref || !prefDown.Load() }
		})
		defer g.closeAll()
		l := g.awaitLeader()
		if l.id == pref {
			g.crash(pref)
			l = g.awaitNewLeader(pref)
			g.restart(pref)
		}
		want := []uint64{pref, others(pref)[0], others(pref)[1]}
		g.publishN(l.p, "m", 10)
		const aliveAt = 2 * hold
		transferAt := g.stepUntilTransfer(l, want, aliveAt+hold+400, func(k int) {
			if k == aliveAt {
				prefDown.Store(false)
			}
		})
		if transferAt < aliveAt+hold {
			t.Fatalf("transfer at tick %d; the preferred owner's node was seen alive from tick %d, hold-down %d", transferAt, aliveAt, hold)
		}
		nl := g.awaitNewLeader(l.id)
		if nl.id != pref {
			t.Fatalf("replica %d leads after the transfer, want %d", nl.id, pref)
		}
	})
}

// A replica on a fenced node (Config.Fenced) never campaigns, but still
// votes: with the leader crashed, the other replica is elected with its
// vote, whichever of the two would have timed out first. Several seeds,
// so that the fenced replica would have won some of the elections.
func TestReplicaGroupFencedReplicaDoesNotCampaign(t *testing.T) {
	for seed := uint64(41); seed < 49; seed++ {
		synctest.Test(t, func(t *testing.T) {
			var fenced [4]atomic.Bool
			g := newRGroup(t, seed, multiraft.Faults{DelayMinMs: 1, DelayMaxMs: 5}, func(c *Config) {
				id := c.RaftID
				c.Fenced = func() bool { return fenced[id].Load() }
			})
			defer g.closeAll()
			l := g.awaitLeader()
			f, other := others(l.id)[0], others(l.id)[1]
			fenced[f].Store(true)
			g.crash(l.id)
			nl := g.awaitNewLeader(l.id)
			if nl.id != other {
				g.fatalf("replica %d leads with replica %d's node fenced, want %d", nl.id, f, other)
			}
			g.run(2 * time.Second)
			if id, _ := g.nodes[f].p.Leader(); id != other {
				g.fatalf("fenced replica %d follows %d, want %d", f, id, other)
			}
			// Unfenced, it campaigns again: with the leader crashed too,
			// it is elected once the first leader is back.
			g.restart(l.id)
			fenced[f].Store(false)
			g.crash(other)
			if nl := g.awaitNewLeader(other); nl.id != f && nl.id != l.id {
				g.fatalf("replica %d leads, want %d or %d", nl.id, f, l.id)
			}
		})
	}
}
