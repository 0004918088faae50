package partition

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/multiraft"
)

// groupTicks sums the raft ticks the up nodes' hosts gave their groups.
func (g *rgroup) groupTicks() uint64 {
	var n uint64
	for _, nd := range g.up() {
		n += nd.host.Stats().GroupTicks
	}
	return n
}

// awaitQuiet runs until no up host ticks the group for 20 ticks in a row
// (bounded in simulated time).
func (g *rgroup) awaitQuiet(what string) {
	g.t.Helper()
	for range 50 {
		before := g.groupTicks()
		g.run(20 * replTick)
		if g.groupTicks() == before {
			return
		}
	}
	g.fatalf("%s: the group never went quiet", what)
}

// An idle group of three stops ticking: its replicas' hosts skip it. A
// publish wakes it (the leader ticks again) and commits; then it is quiet
// again.
func TestReplicaGroupGoesQuietAndAProposalWakesIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newRGroup(t, 21, multiraft.Faults{DelayMinMs: 1, DelayMaxMs: 3}, nil)
		defer g.closeAll()
		l := g.awaitLeader()
		if r, ok := awaitRes(g, publish(l.p, "before", nil), time.Second); !ok || r.err != nil {
			t.Fatalf("publish: %v (answered %v)", r.err, ok)
		}
		g.awaitQuiet("after the first publish")
		for _, n := range g.up() {
			if !n.p.Quiet() {
				t.Fatalf("replica %d is not quiet while its host skips it", n.id)
			}
		}
		before := l.host.Stats().GroupTicks
		r, ok := awaitRes(g, publish(l.p, "wakes", nil), time.Second)
		if !ok || r.err != nil {
			t.Fatalf("publish to a quiet group: %v (answered %v)", r.err, ok)
		}
		g.run(2 * replTick)
		if l.host.Stats().GroupTicks == before {
			t.Fatal("a publish did not wake the quiet leader")
		}
		g.settleReplicas()
		g.checkAgree(l)
		g.awaitQuiet("after the second publish")
	})
}

// A quiet group whose leader's node dies: with the hosts' own liveness
// window too long to notice, the followers stay quiet and follow the dead
// leader; membership reporting the node dead (SetPeerDown) wakes them and
// they elect a new leader, which takes publishes. When the node comes back
// and membership reports it alive, it rejoins as a follower and catches up.
func TestQuietFollowersElectWhenMembershipReportsTheLeaderDead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newRGroup(t, 22, multiraft.Faults{DelayMinMs: 1, DelayMaxMs: 3}, nil)
		g.peerLiveTicks = 1 << 30
		for _, n := range g.nodes[1:] { // restarted with the long window
			_ = n.p.Close()
			n.closeJournal()
			g.start(n)
		}
		defer g.closeAll()
		l := g.awaitLeader()
		if r, ok := awaitRes(g, publish(l.p, "before", nil), time.Second); !ok || r.err != nil {
			t.Fatalf("publish: %v (answered %v)", r.err, ok)
		}
		g.awaitQuiet("before the crash")
		dead := l.id
		g.crash(dead)
		g.run(100 * replTick) // ten election timeouts
		for _, n := range g.up() {
			if id, _ := n.p.Leader(); id != dead || !n.p.Quiet() {
				t.Fatalf("replica %d: leader %d, quiet %v; want it quiet, following %d (nothing told it)", n.id, id, n.p.Quiet(), dead)
			}
		}
		for _, n := range g.up() {
			n.host.SetPeerDown(dead, true)
		}
		nl := g.awaitLeader()
		if nl.id == dead {
			t.Fatal("the dead replica leads")
		}
		r, ok := awaitRes(g, publish(nl.p, "after", nil), time.Second)
		if !ok || r.err != nil {
			t.Fatalf("publish to the new leader: %v (answered %v)", r.err, ok)
		}
		g.restart(dead)
		for _, n := range g.up() {
			n.host.SetPeerDown(dead, false)
		}
		g.settleReplicas()
		g.checkAgree(g.awaitLeader())
		g.awaitQuiet("after the dead node came back")
	})
}

// A follower's node dies: the leader and the other follower, a majority,
// still go quiet, and a publish still commits. When the node comes back,
// the change of its liveness wakes the group and the follower catches up.
func TestQuietGroupLeavesADeadFollowerBehindAndCatchesItUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newRGroup(t, 23, multiraft.Faults{DelayMinMs: 1, DelayMaxMs: 3}, nil)
		defer g.closeAll()
		l := g.awaitLeader()
		var f uint64
		for _, n := range g.up() {
			if n != l {
				f = n.id
				break
			}
		}
		g.crash(f)
		if r, ok := awaitRes(g, publish(l.p, "while-down", nil), time.Second); !ok || r.err != nil {
			t.Fatalf("publish with a follower down: %v (answered %v)", r.err, ok)
		}
		g.awaitQuiet("with a follower down")
		g.restart(f)
		g.settleReplicas()
		g.checkAgree(g.awaitLeader())
		g.awaitQuiet("after the follower came back")
	})
}

// OnStir tells the broker that a quiet group woke, once per waking: a
// publish to a quiet group stirs its leader, and a group that stays quiet
// stirs nothing. QuietPlaced holds for the quiet leader with its own
// placement and not for another.
func TestQuietGroupStirsOncePerWaking(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var stirs [4]atomic.Int32
		g := newRGroup(t, 23, multiraft.Faults{DelayMinMs: 1, DelayMaxMs: 3}, func(c *Config) {
			id := c.RaftID
			c.OnStir = func() { stirs[id].Add(1) }
		})
		defer g.closeAll()
		l := g.awaitLeader()
		if r, ok := awaitRes(g, publish(l.p, "before", nil), time.Second); !ok || r.err != nil {
			t.Fatalf("publish: %v (answered %v)", r.err, ok)
		}
		g.awaitQuiet("after the first publish")
		want := []uint64{l.id}
		for _, n := range g.up() {
			if n.id != l.id {
				want = append(want, n.id)
			}
		}
		if _, err := l.p.Reconfigure(t.Context(), want); err != nil {
			t.Fatal(err)
		}
		g.awaitQuiet("after the placement")
		if !l.p.QuietPlaced(want) {
			t.Fatal("the quiet leader with its placement is not QuietPlaced")
		}
		if l.p.QuietPlaced([]uint64{want[1], want[0], want[2]}) {
			t.Fatal("QuietPlaced with another preferred owner")
		}
		before := stirs[l.id].Load()
		g.run(40 * replTick)
		if got := stirs[l.id].Load(); got != before {
			t.Fatalf("a quiet group stirred %d times", got-before)
		}
		if r, ok := awaitRes(g, publish(l.p, "wakes", nil), time.Second); !ok || r.err != nil {
			t.Fatalf("publish to a quiet group: %v (answered %v)", r.err, ok)
		}
		if got := stirs[l.id].Load(); got != before+1 {
			t.Fatalf("a publish to a quiet group stirred its leader %d times, want 1", got-before)
		}
		g.awaitQuiet("after the second publish")
	})
}
