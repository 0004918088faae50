package partition

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
)

// On a group of one, commands that arrive while a sync is under way wait
// for it to return before their turn (deferTurn): nothing of theirs is
// decided while the sync is held, and once it returns they take one turn,
// whose records the next sync carries together.
func TestCommandsWaitForTheSyncUnderWay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(vfs.NewMem())
		hold := make(chan struct{})
		var armed atomic.Bool
		syncs := make(chan int, 64)
		cfg.OnSync = func(records int, _ time.Duration) {
			if armed.CompareAndSwap(true, false) {
				<-hold // the syncer answers only once released
			}
			syncs <- records
		}
		p := mustOpen(t, cfg)
		defer p.Close()
		released := false
		release := func() {
			if !released {
				released = true
				close(hold)
			}
		}
		defer release() // before Close, should the test fail while holding
		mustPublish(t, p, "first", nil)
		synctest.Wait()
		for len(syncs) > 0 {
			<-syncs
		}

		armed.Store(true)
		held := publish(p, "held", nil)
		synctest.Wait() // the syncer is held in OnSync
		before := p.Stats().NextLSN
		const n = 10
		var waiting []chan pubResult
		for i := range n {
			waiting = append(waiting, publish(p, string(rune('a'+i)), nil))
		}
		synctest.Wait() // the actor took them, and waits for the sync
		if got := p.Stats().NextLSN; got != before {
			t.Fatalf("NextLSN moved from %d to %d while the sync was held: commands were decided before it returned", before, got)
		}

		release()
		if r := <-held; r.err != nil {
			t.Fatal(r.err)
		}
		var offsets []uint64
		for _, ch := range waiting {
			r := <-ch
			if r.err != nil {
				t.Fatal(r.err)
			}
			offsets = append(offsets, r.off)
		}
		for i := 1; i < n; i++ {
			if offsets[i] != offsets[i-1]+1 {
				t.Fatalf("offsets %v: want %d consecutive", offsets, n)
			}
		}
		if got := <-syncs; got != 1 {
			t.Fatalf("the held sync carried %d records, want 1", got)
		}
		if got := <-syncs; got != n {
			t.Fatalf("the next sync carried %d records, want the %d commands that waited", got, n)
		}
	})
}
