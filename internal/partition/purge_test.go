package partition

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

func purge(p *Partition) (uint64, error) {
	type res struct {
		n   uint64
		err error
	}
	ch := make(chan res, 1)
	p.Purge(func(n uint64, err error) { ch <- res{n, err} })
	r := <-ch
	return r.n, r.err
}

// Purge discards ready and delayed messages over several bounded turns,
// leaves inflight ones with their holder, survives a reopen, and does not
// touch messages published after it.
func TestPurgeQueuedMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		cfg := testConfig(fs)
		cfg.Queue.DeadLetter.Target = "dlq" // purged messages are never copied
		var copies int
		cfg.DeadLetter = func(string, *queue.Message, func(error)) { copies++ }
		p := mustOpen(t, cfg)
		const queued = purgePerTurnMax*2 + 10
		for i := range queued {
			p.Publish(&queue.Message{Body: []byte("m")}, func(uint64, error) {})
			if i%1000 == 999 {
				synctest.Wait() // keep the inbox from filling
			}
		}
		mustPublish(t, p, "delayed", func(m *queue.Message) { m.NotBeforeMs = time.Now().Add(time.Hour).UnixMilli() })
		c := &tconsumer{owner: "c", credit: 3}
		if err := p.Attach(c); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := len(c.deliveries()); got != 3 {
			t.Fatalf("leased %d before the purge, want 3", got)
		}
		n, err := purge(p)
		if err != nil {
			t.Fatal(err)
		}
		if want := uint64(queued + 1 - 3); n != want {
			t.Fatalf("purged %d, want %d", n, want)
		}
		st := p.Stats()
		if st.Ready != 0 || st.Delayed != 0 || st.Inflight != 3 || st.DeadLettering != 0 {
			t.Fatalf("after purge: %+v", st.Stats)
		}
		// The holder still settles what it holds.
		if err := settle(p, Ack, c.deliveries()[0], 0); err != nil {
			t.Fatalf("ack after purge: %v", err)
		}
		after := mustPublish(t, p, "after", nil)
		if n, err := purge(p); err != nil || n != 1 {
			t.Fatalf("second purge: %d %v, want 1", n, err)
		}
		mustPublish(t, p, "kept", nil)
		p.Detach(c)
		synctest.Wait()
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if copies != 0 {
			t.Fatalf("%d dead-letter copies of purged messages", copies)
		}
		// Reopened: the purge is durable. The two inflight messages were
		// released by the detach and are ready again, with "kept".
		p = mustOpen(t, cfg)
		defer p.Close()
		synctest.Wait()
		if st := p.Stats(); st.Ready != 3 || st.Delayed != 0 || st.Inflight != 0 {
			t.Fatalf("after reopen: %+v", st.Stats)
		}
		if info, _ := p.st.Lookup(after, 0); info.State != queue.StateSettled {
			t.Fatalf("purged offset %d is %v after reopen", after, info.State)
		}
	})
}

func TestPurgeOfFailedPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		p := mustOpen(t, testConfig(fs))
		mustPublish(t, p, "x", nil)
		fs.SetSyncError(errors.New("disk on fire"))
		if n, err := purge(p); protocol.CodeOf(err) != protocol.CodeUnavailable {
			t.Fatalf("purge with failing fsync: %d %v", n, err)
		}
		if n, err := purge(p); protocol.CodeOf(err) != protocol.CodeUnavailable {
			t.Fatalf("purge of a failed partition: %d %v", n, err)
		}
		fs.SetSyncError(nil)
		p.Close()
	})
}

// A failed partition refuses an attach at once, and reports it through
// Unavailable; before the failure it reports nil.
func TestAttachToFailedPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		p := mustOpen(t, testConfig(fs))
		defer p.Close()
		if err := p.Unavailable(); err != nil {
			t.Fatalf("healthy partition: Unavailable = %v", err)
		}
		fs.SetSyncError(errors.New("disk on fire"))
		<-publish(p, "lost", nil)
		synctest.Wait()
		if p.Unavailable() == nil {
			t.Fatal("failed partition: Unavailable = nil")
		}
		c := &tconsumer{owner: "late", credit: -1}
		if err := p.Attach(c); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("attach to a failed partition: %v", err)
		}
		fs.SetSyncError(nil)
	})
}

// An attach that reaches the actor after it failed (it passed the
// Unavailable check just before the failure) is answered with Detached, not
// left waiting for deliveries that never come.
func TestAttachQueuedBeforeFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		p := mustOpen(t, testConfig(fs))
		defer p.Close()
		fs.SetSyncError(errors.New("disk on fire"))
		<-publish(p, "lost", nil)
		synctest.Wait()
		c := &tconsumer{owner: "racing", credit: -1}
		if err := p.control(control{kind: ctlAttach, c: c}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		c.mu.Lock()
		det := c.detached
		c.mu.Unlock()
		if !errors.Is(det, ErrUnavailable) {
			t.Fatalf("late attach: Detached(%v), want ErrUnavailable", det)
		}
		fs.SetSyncError(nil)
	})
}
