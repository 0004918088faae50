package partition

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/vfs"
)

// adopter is a tconsumer that records AdoptCredit.
type adopter struct {
	tconsumer
	adopted int
}

func (a *adopter) AdoptCredit(n int) {
	a.mu.Lock()
	a.adopted += n
	a.mu.Unlock()
}

// TestAdoptRecoveredLeases: after a restart, a consumer whose owner is the
// one in the log takes back its leases (same lease id and attempt,
// delivered again, credit taken through Adopter), keeps them past the
// grace that releases everyone else's, and can settle them; a consumer of
// another owner adopts nothing; a lease already past its deadline is left
// to expire.
func TestAdoptRecoveredLeases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := &fakeClock{t: time.UnixMilli(1_700_000_000_000)}
		cfg := testConfig(vfs.NewMem())
		cfg.Now = clk.now
		cfg.Queue.LeaseMs = 3_600_000
		cfg.RecoveredLeaseGraceMs = 5000

		p := mustOpen(t, cfg)
		mustPublish(t, p, "a1", nil)
		mustPublish(t, p, "a2", nil)
		old := &tconsumer{owner: "own/c-1/7", credit: 2}
		p.Attach(old)
		synctest.Wait()
		mustPublish(t, p, "b1", nil)
		other := &tconsumer{owner: "own/c-2/8", credit: 1}
		p.Attach(other)
		synctest.Wait()
		before := old.deliveries()
		if len(before) != 2 || len(other.deliveries()) != 1 {
			t.Fatalf("before restart: %d and %d deliveries", len(before), len(other.deliveries()))
		}
		if err := p.Close(); err != nil { // no Detach: the leases stay in the log
			t.Fatal(err)
		}

		p = mustOpen(t, cfg)
		defer p.Close()
		stranger := &adopter{tconsumer: tconsumer{owner: "own/c-9/9", credit: 0}}
		back := &adopter{tconsumer: tconsumer{owner: "own/c-1/7", credit: 0}}
		p.Attach(stranger)
		p.Attach(back)
		got := make(chan int, 2)
		p.Adopt(stranger, func(n int) { got <- n })
		p.Adopt(back, func(n int) { got <- n })
		if n := <-got; n != 0 {
			t.Fatalf("a consumer of another owner adopted %d", n)
		}
		if n := <-got; n != 2 {
			t.Fatalf("adopted %d, want 2", n)
		}
		ds := back.deliveries()
		if back.adopted != 2 || len(ds) != 2 {
			t.Fatalf("AdoptCredit %d, deliveries %d; want 2 and 2", back.adopted, len(ds))
		}
		for i, d := range ds {
			if d.Offset != before[i].Offset || d.LeaseID != before[i].LeaseID || d.Attempt != before[i].Attempt || string(d.Body) != string(before[i].Body) {
				t.Fatalf("adopted %+v, want the lease as first delivered %+v", d, before[i])
			}
		}

		// The grace ends: b1 (never adopted) is released to the stranger,
		// who has credit now; a1 and a2 stay with their owner.
		stranger.addCredit(5)
		clk.advance(5 * time.Second)
		p.Poke()
		synctest.Wait()
		if sd := stranger.deliveries(); len(sd) != 1 || string(sd[0].Body) != "b1" {
			t.Fatalf("after the grace the stranger got %v, want only b1", bodies(sd))
		}
		if err := settle(p, Ack, ds[0], 0); err != nil {
			t.Fatalf("ack of an adopted lease: %v", err)
		}
		if st := p.Stats(); st.Inflight != 2 {
			t.Fatalf("inflight %d, want 2 (a2 with its owner, b1 with the stranger)", st.Inflight)
		}
		// Detach of the owner releases what it adopted, like any lease.
		p.Detach(back)
		synctest.Wait()
		if sd := stranger.deliveries(); len(sd) != 2 || string(sd[1].Body) != "a2" {
			t.Fatalf("after the owner detached the stranger got %v, want b1 then a2", bodies(sd))
		}
	})
}

// TestAdoptSkipsExpiredLeases: a recovered lease whose deadline passed
// while the broker was down is not adopted; it expires into ready.
func TestAdoptSkipsExpiredLeases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := &fakeClock{t: time.UnixMilli(1_700_000_000_000)}
		cfg := testConfig(vfs.NewMem())
		cfg.Now = clk.now
		cfg.Queue.LeaseMs = 1000
		cfg.RecoveredLeaseGraceMs = 60_000
		leaseAndRestart(t, cfg, "own/c-1/1")
		clk.advance(2 * time.Second)
		p := mustOpen(t, cfg)
		defer p.Close()
		c := &adopter{tconsumer: tconsumer{owner: "own/c-1/1", credit: 0}}
		p.Attach(c)
		got := make(chan int, 1)
		p.Adopt(c, func(n int) { got <- n })
		if n := <-got; n != 0 {
			t.Fatalf("adopted %d leases past their deadline", n)
		}
		synctest.Wait()
		if st := p.Stats(); st.Inflight != 0 || st.Ready != 1 {
			t.Fatalf("stats %+v, want the expired lease ready", st)
		}
	})
}

// TestRepeatedAckAfterCrash: an ACK whose answer was lost (here: in a power
// cut right after it was durable) is sent again after the restart; the
// partition remembers which lease ACKed the offset and answers ok, applying
// nothing. An ACK naming another lease of that offset is still refused.
func TestRepeatedAckAfterCrash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		cfg := testConfig(fs)
		p := mustOpen(t, cfg)
		mustPublish(t, p, "x", nil)
		c := &tconsumer{owner: "o", credit: 1}
		p.Attach(c)
		synctest.Wait()
		d := c.deliveries()[0]
		if err := settle(p, Ack, d, 0); err != nil {
			t.Fatal(err)
		}
		img := fs.Crash(nil, false)
		p.Close()

		cfg.FS = img
		p = mustOpen(t, cfg)
		defer p.Close()
		if err := settle(p, Ack, d, 0); err != nil {
			t.Fatalf("the same ACK after the crash: %v, want ok", err)
		}
		other := d
		other.LeaseID++
		if err := settle(p, Ack, other, 0); !errors.Is(err, queue.ErrAlreadySettled) {
			t.Fatalf("an ACK of another lease: %v, want already settled", err)
		}
		if st := p.Stats(); st.Ready != 0 || st.Inflight != 0 {
			t.Fatalf("stats %+v: nothing may come back", st)
		}
	})
}
