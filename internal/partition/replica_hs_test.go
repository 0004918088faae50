package partition

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/multiraft"
	"github.com/sinewmq/sinew/internal/seglog"
)

// Under SyncInterval a replica's applied entries may be only in the OS; a
// HardState synced at a term change must not name them, or the replica's
// log is refused after a power loss.
func TestSyncIntervalHardStateCommitWithinDurableLog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newRGroup(t, 5, multiraft.Faults{}, func(c *Config) {
			c.Sync = seglog.SyncInterval
			c.SyncIntervalMs = 600_000
		})
		defer g.closeAll()
		l := g.awaitLeader()
		for i := range 10 {
			if r, ok := awaitRes(g, g.hist.publish(l.p, fmt.Sprint("m", i)), time.Second); !ok || r.err != nil {
				t.Fatalf("publish: %v %v", r.err, ok)
			}
		}
		g.run(100 * time.Millisecond) // followers apply
		for _, n := range g.up() {
			a, nx := commitIndex(n.p)
			t.Logf("node %d applied %d next %d hs %v", n.id, a, nx, n.p.log.HardState())
		}
		g.crash(l.id)
		nl := g.awaitLeader()
		for _, n := range g.up() {
			t.Logf("after election node %d hs %v", n.id, n.p.log.HardState())
		}
		_ = nl
		for _, n := range g.up() {
			id := n.id
			g.net.Detach(id)
			n.fs = n.fs.Crash(g.rng, true)
			_ = n.p.Close()
			n.closeJournal()
			n.host, n.p, n.down = nil, nil, true
			synctest.Wait()
			n.cfg.FS = n.fs
			g.openJournal(n)
			if rp, err := Open(n.cfg); err != nil {
				t.Errorf("node %d does not reopen after power loss: %v", id, err)
			} else {
				t.Logf("node %d reopened", id)
				_ = rp.Close()
			}
			n.closeJournal()
		}
	})
}
