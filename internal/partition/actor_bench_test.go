package partition

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/vfs"
)

// The actor's own cost, without a disk: MemFS makes every sync nearly
// free, so these measure the CPU a turn spends per message (deciding,
// appending, releasing), which a real fsync hides in the broker
// benchmarks on a busy machine.

// BenchmarkActorPublishMem: 64 publishers, 1 KiB each, each waiting for
// its confirmation.
func BenchmarkActorPublishMem(b *testing.B) {
	p := mustOpen(b, testConfig(vfs.NewMem()))
	defer p.Close()
	body := make([]byte, 1024)
	var left atomic.Int64
	left.Store(int64(b.N))
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			done := make(chan error, 1)
			for left.Add(-1) >= 0 {
				p.Publish(&queue.Message{Body: body}, func(_ uint64, err error) { done <- err })
				if err := <-done; err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// ackingConsumer acks every delivery at once and takes its credit back
// when the ack is answered: a consumer with prefetch 64.
type ackingConsumer struct {
	p      *Partition
	credit atomic.Int64
	acked  atomic.Int64
	want   int64
	done   chan struct{}
}

func (c *ackingConsumer) Owner() string { return "bench" }
func (c *ackingConsumer) TakeCredit(max int) int {
	n := min(int64(max), c.credit.Load())
	c.credit.Add(-n)
	return int(n)
}
func (c *ackingConsumer) RefundCredit(n int) { c.credit.Add(int64(n)) }
func (c *ackingConsumer) Deliver(d Delivery) {
	c.p.Settle(Ack, d.Offset, d.LeaseID, 0, func(err error) {
		if err != nil {
			panic(err)
		}
		c.credit.Add(1)
		c.p.Poke()
		if c.acked.Add(1) == c.want {
			close(c.done)
		}
	})
}
func (c *ackingConsumer) LeaseEnded(uint64, uint64) {}
func (c *ackingConsumer) Detached(error)            {}

// BenchmarkActorDrainMem: a backlog of b.N 1 KiB messages drained by one
// consumer with prefetch 64 that acks each delivery; with the default
// random lease ids, and with consecutive ones for comparison.
func BenchmarkActorDrainMem(b *testing.B) {
	b.Run("lease-ids=random", func(b *testing.B) { benchActorDrain(b, nil) })
	b.Run("lease-ids=counter", func(b *testing.B) {
		var n uint64
		benchActorDrain(b, func() uint64 { n++; return n })
	})
}

func benchActorDrain(b *testing.B, leaseIDs func() uint64) {
	cfg := testConfig(vfs.NewMem())
	cfg.LeaseIDs = leaseIDs
	p := mustOpen(b, cfg)
	defer p.Close()
	body := make([]byte, 1024)
	var wg sync.WaitGroup
	for i := range b.N {
		wg.Add(1)
		p.Publish(&queue.Message{Body: body}, func(_ uint64, err error) {
			if err != nil {
				panic(err)
			}
			wg.Done()
		})
		if i%1024 == 1023 {
			wg.Wait() // stay within the inbox
		}
	}
	wg.Wait()
	c := &ackingConsumer{p: p, want: int64(b.N), done: make(chan struct{})}
	c.credit.Store(64)
	b.ResetTimer()
	if err := p.Attach(c); err != nil {
		b.Fatal(err)
	}
	<-c.done
	b.StopTimer()
	p.Detach(c)
}
