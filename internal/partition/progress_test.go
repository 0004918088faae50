package partition

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/sinewmq/sinew/internal/multiraft"
)

// progressOf asks replica n for replica id's progress.
func (g *rgroup) progressOf(n *rnode, id uint64) (match, commit uint64, ok bool) {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), inspectWaitMax)
	defer cancel()
	match, commit, ok, err := n.p.ReplicaProgress(ctx, id)
	if err != nil {
		g.fatalf("ReplicaProgress on %d for %d: %v", n.id, id, err)
	}
	return match, commit, ok
}

// TestReplicaProgress: the leader knows how far each replica's log matches
// its own (all of it once they caught up; less for a replica that is down
// while it appends); a follower, and a replica the group does not hold,
// report nothing.
func TestReplicaProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newRGroup(t, 31, multiraft.Faults{DelayMinMs: 1, DelayMaxMs: 5}, nil)
		defer g.closeAll()
		l := g.awaitLeader()
		g.publishN(l.p, "m", 20)
		g.run(3 * replTick)
		for _, id := range others(l.id) {
			match, commit, ok := g.progressOf(l, id)
			if !ok || commit == 0 || match != commit {
				t.Fatalf("leader's view of %d: match %d commit %d (%v), want caught up", id, match, commit, ok)
			}
			var follower *rnode
			for _, n := range g.up() {
				if n.id == id {
					follower = n
				}
			}
			if _, _, ok := g.progressOf(follower, l.id); ok {
				t.Fatalf("follower %d reported progress", id)
			}
		}
		if _, _, ok := g.progressOf(l, 99); ok {
			t.Fatal("progress of a replica the group does not hold")
		}
		down := others(l.id)[0]
		g.crash(down)
		g.publishN(l.p, "n", 20)
		g.run(3 * replTick)
		match, commit, ok := g.progressOf(l, down)
		if !ok || match >= commit {
			t.Fatalf("leader's view of %d, down while it appended: match %d commit %d (%v), want behind", down, match, commit, ok)
		}
	})
}
