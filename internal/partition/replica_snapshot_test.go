package partition

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/multiraft"
	"github.com/sinewmq/sinew/internal/vfs"
)

// A follower caught up by a raft snapshot loses power between two steps of
// the install (the checkpoint replaced but the log not reset, the log reset
// but not synced, ...). It restarts without damage, finishes the install
// from the pending snapshot, and ends up holding what the leader holds.
func TestReplicaSnapshotInstallSurvivesAPowerLoss(t *testing.T) {
	for _, step := range []string{"pending", "checkpoint", "appended", "synced"} {
		t.Run(step, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var g *rgroup
				var lag uint64
				var image *vfs.MemFS
				g = newRGroup(t, 3, multiraft.Faults{}, func(c *Config) {
					c.CheckpointEveryRecords = 20
					c.SegmentBytes = 4096
					id := c.RaftID
					c.snapshotStep = func(s string) {
						if id == lag && s == step && image == nil {
							image = g.nodes[id].fs.Crash(g.rng, true)
						}
					}
				})
				defer g.closeAll()
				l := g.awaitLeader()
				for _, n := range g.up() {
					if n != l {
						lag = n.id
						break
					}
				}
				others := []uint64{}
				for id := uint64(1); id <= 3; id++ {
					if id != lag {
						others = append(others, id)
					}
				}
				g.net.Isolate(lag, others)
				// The leader's checkpoints drop the segments the cut-off
				// follower would need.
				for round := range 20 {
					for i := range 10 {
						ch := g.hist.publish(l.p, fmt.Sprintf("r%d-%d", round, i))
						if r, ok := awaitRes(g, ch, time.Second); !ok || r.err != nil {
							t.Fatalf("publish: %v (answered %v)", r.err, ok)
						}
					}
					g.ackAll(l, 5)
				}
				if first := l.p.log.FirstLSN(); first <= 2 {
					t.Fatalf("the leader's log still starts at %d: retention did not run", first)
				}
				g.net.Heal()
				for range 300 {
					if image != nil {
						break
					}
					g.run(replTick)
				}
				if image == nil {
					t.Fatalf("replica %d was never sent a snapshot", lag)
				}
				// The power loss: what the install's step left on disk.
				n := g.nodes[lag]
				g.net.Detach(lag)
				_ = n.p.Close()
				n.closeJournal()
				n.fs, n.host, n.p, n.down = image, nil, nil, true
				synctest.Wait()
				pending := filepath.Join(n.cfg.Dir, snapshotPendingFile)
				if _, err := image.Stat(pending); err != nil {
					t.Fatalf("no pending snapshot on the disk after the power loss: %v", err)
				}
				g.restart(lag)
				if err := n.p.Unavailable(); err != nil {
					t.Fatalf("replica %d after the power loss: %v", lag, err)
				}
				if _, err := image.Stat(pending); !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("the pending snapshot is still there after the restart: %v", err)
				}
				l = g.awaitLeader()
				g.settleReplicas()
				g.checkAgree(l)
				g.drain(l)
			})
		})
	}
}
