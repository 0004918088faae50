package partition

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/vfs"
)

func discard(p *Partition, off uint64) error {
	ch := make(chan error, 1)
	p.Discard(off, func(err error) { ch <- err })
	return <-ch
}

// Peek shows unsettled messages with their state and changes nothing: the
// stats and the log's next offset are the same after it, and a consumer
// still gets every message. Discard removes a queued message durably (it
// stays gone after a crash of the file system), and refuses a leased one.
// The counters count what happened.
func TestPeekAndDiscard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		cfg := testConfig(fs)
		counters := new(Counters)
		cfg.Counters = counters
		p := mustOpen(t, cfg)
		defer func() { p.Close() }()
		a := mustPublish(t, p, "a", nil)
		b := mustPublish(t, p, "b", func(m *queue.Message) { m.Key = []byte{0xff, 0} })
		c := mustPublish(t, p, "c", nil)
		before := p.Stats()

		ctx := context.Background()
		for range 2 {
			r, err := p.Peek(ctx, 0, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Messages) != 3 || r.Next != r.NextLSN || r.NextLSN != before.NextLSN {
				t.Fatalf("peek: %+v", r)
			}
			m := r.Messages[1]
			if m.Info.Offset != b || m.Info.State != queue.StateReady || string(m.Msg.Body) != "b" || string(m.Msg.Key) != "\xff\x00" || m.Msg.Headers[0].Value != "b" {
				t.Fatalf("peeked %+v %+v", m.Info, m.Msg)
			}
		}
		if r, err := p.Peek(ctx, b, 1); err != nil || len(r.Messages) != 1 || r.Messages[0].Info.Offset != b || r.Next != b+1 {
			t.Fatalf("peek from %d limit 1: %+v %v", b, r, err)
		}
		// The queue's state and its log are as they were (the size on
		// disk is left out: a stats snapshot may predate the last write).
		if after := p.Stats(); after.Stats != before.Stats {
			t.Fatalf("peek changed the partition: %+v, was %+v", after.Stats, before.Stats)
		}

		// Lease a; then discard b (queued: ok) and a (leased: refused).
		cons := &tconsumer{owner: "o", credit: 1}
		p.Attach(cons)
		synctest.Wait()
		if d := cons.deliveries(); len(d) != 1 || d[0].Offset != a {
			t.Fatalf("deliveries %+v", d)
		}
		if r, _ := p.Peek(ctx, 0, 10); r.Messages[0].Info.State != queue.StateInflight || r.Messages[0].Info.Attempt != 1 {
			t.Fatalf("a leased message peeks as %+v", r.Messages[0].Info)
		}
		if err := discard(p, b); err != nil {
			t.Fatalf("discard of a queued message: %v", err)
		}
		if err := discard(p, a); !errors.Is(err, ErrNotQueued) {
			t.Fatalf("discard of a leased message: %v, want ErrNotQueued", err)
		}
		if err := discard(p, b); !errors.Is(err, ErrNotQueued) {
			t.Fatalf("second discard: %v, want ErrNotQueued", err)
		}
		if got := counters.Purged.Load(); got != 1 {
			t.Fatalf("purged counter %d, want 1", got)
		}
		if got := counters.Appended.Load(); got != 3 {
			t.Fatalf("appended counter %d, want 3", got)
		}
		if got := counters.Deliveries.Load(); got != 1 {
			t.Fatalf("deliveries counter %d, want 1", got)
		}

		// The discard was answered, so it is durable: it survives a crash.
		img := fs.Crash(nil, false)
		p.Close()
		cfg.FS = img
		p = mustOpen(t, cfg)
		r, err := p.Peek(ctx, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		var offs []uint64
		for _, m := range r.Messages {
			offs = append(offs, m.Info.Offset)
		}
		if len(offs) != 2 || offs[0] != a || offs[1] != c {
			t.Fatalf("after the crash the partition holds %v, want [%d %d] (%d discarded)", offs, a, c, b)
		}
	})
}

// LeaseCurrent says whether a settle by a lease would still take effect:
// yes while it is held, after it expired until the message is leased again,
// and for the lease that ACKed it (a repeat is answered ok); no for any
// other lease once the message was settled or went to a newer lease.
func TestLeaseCurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		p := mustOpen(t, testConfig(fs)) // leases last 10s
		defer func() { p.Close() }()
		ctx := context.Background()
		mustPublish(t, p, "a", nil)
		mustPublish(t, p, "b", nil)
		cons := &tconsumer{owner: "o", credit: 2}
		p.Attach(cons)
		synctest.Wait()
		d := cons.deliveries()
		if len(d) != 2 {
			t.Fatalf("deliveries %+v", d)
		}
		a, b := d[0], d[1]
		check := func(what string, d Delivery, want bool) {
			t.Helper()
			got, err := p.LeaseCurrent(ctx, d.Offset, d.LeaseID)
			if err != nil || got != want {
				t.Fatalf("%s: LeaseCurrent(%d, lease %d) = %v, %v; want %v", what, d.Offset, d.LeaseID, got, err, want)
			}
		}
		check("held", a, true)
		check("held, another lease id", Delivery{Offset: a.Offset, LeaseID: a.LeaseID + 100}, false)
		if err := settle(p, Ack, a, 0); err != nil {
			t.Fatal(err)
		}
		// Acked: a repeat of that ACK is answered ok, so the lease still
		// counts; another lease of the same offset does not.
		check("acked, by the lease that acked it", a, true)
		check("acked, another lease", Delivery{Offset: a.Offset, LeaseID: a.LeaseID + 1}, false)
		// b's lease expires: a settle by it still applies, until the
		// message is leased again.
		time.Sleep(11 * time.Second)
		synctest.Wait()
		check("expired, not leased again", b, true)
		cons.RefundCredit(1)
		p.Poke()
		synctest.Wait()
		d = cons.deliveries()
		if len(d) != 3 || d[2].Offset != b.Offset {
			t.Fatalf("after the expiry: deliveries %+v", d)
		}
		check("leased again: the old lease", b, false)
		check("leased again: the new lease", d[2], true)
	})
}
