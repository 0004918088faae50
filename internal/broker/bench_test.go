package broker

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/protocol"
)

// benchDir is $SINEW_BENCH_DIR/broker when set, else a temporary directory.
func benchDir(b *testing.B) string {
	if d := os.Getenv("SINEW_BENCH_DIR"); d != "" {
		dir, err := os.MkdirTemp(d, "broker-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return b.TempDir()
}

func benchBroker(b *testing.B) *Broker { return benchBrokerCfg(b, Config{}) }

func benchBrokerCfg(b *testing.B, cfg Config) *Broker {
	cfg.DataDir = filepath.Join(benchDir(b), "data")
	br, err := Open(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { br.Close() })
	return br
}

// publishersPerProc times GOMAXPROCS is the number of concurrent
// publishers: 32 x 2 = 64 on the reference machine.
const publishersPerProc = 32

// BenchmarkPublish measures confirmed (fsynced) 1 KiB publishes to one
// single-partition queue from 64 concurrent publishers, each waiting for
// its confirmation: the group commit at work. 64 in flight bounds every
// fsync to 64 records, so the figure is near 64 / (fsync latency).
func BenchmarkPublish(b *testing.B) {
	benchPublish(b, benchBroker(b), 1)
}

// BenchmarkPublishVariants repeats BenchmarkPublish with segments
// pre-zeroed (cheaper fdatasync) and with a 4-partition queue (4 logs
// syncing in parallel, 16 publishers' worth of records each).
func BenchmarkPublishVariants(b *testing.B) {
	b.Run("prealloc=zero", func(b *testing.B) {
		benchPublish(b, benchBrokerCfg(b, Config{Preallocate: seglog.PreallocZero}), 1)
	})
	b.Run("partitions=4", func(b *testing.B) {
		benchPublish(b, benchBroker(b), 4)
	})
	b.Run("window=1", benchPublishOne)
	b.Run("idempotent", func(b *testing.B) {
		benchPublishIdem(b, benchBroker(b), 1, true)
	})
}

// benchPublishOne is one publisher waiting for each confirmation before
// the next publish: the latency of a lone confirmed publish.
func benchPublishOne(b *testing.B) {
	br := benchBroker(b)
	if _, err := br.Declare(context.Background(), &protocol.DeclareQueue{Topic: "bench", Partitions: 1, MaxRetries: -1}); err != nil {
		b.Fatal(err)
	}
	p := &protocol.Publish{Topic: "bench", Partition: -1, Body: make([]byte, 1024)}
	b.SetBytes(int64(len(p.Body)))
	ch := make(chan error, 1)
	for b.Loop() {
		br.Publish(p, func(_ protocol.PublishOK, err error) { ch <- err })
		if err := <-ch; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

func benchPublish(b *testing.B, br *Broker, partitions uint32) {
	benchPublishIdem(b, br, partitions, false)
}

// benchPublishIdem is benchPublish where, with idem, every publisher is a
// producer of its own numbering its publishes, so each one is checked
// against and recorded in the partition's deduplication window.
func benchPublishIdem(b *testing.B, br *Broker, partitions uint32, idem bool) {
	if _, err := br.Declare(context.Background(), &protocol.DeclareQueue{Topic: "bench", Partitions: partitions, MaxRetries: -1}); err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 1024)
	b.SetBytes(int64(len(body)))
	b.SetParallelism(publishersPerProc)
	b.ResetTimer()
	var producers atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		p := &protocol.Publish{Topic: "bench", Partition: -1, Body: body}
		if idem {
			p.ProducerID = "bench-" + strconv.FormatInt(producers.Add(1), 10)
		}
		ch := make(chan error, 1)
		for pb.Next() {
			if idem {
				p.ProducerSeq++
			}
			for {
				br.Publish(p, func(_ protocol.PublishOK, err error) { ch <- err })
				err := <-ch
				if protocol.CodeOf(err) == protocol.CodeResourceExhausted {
					continue
				}
				if err != nil {
					b.Error(err)
					return
				}
				break
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// drainConsumer acks every delivery from its own goroutine.
type drainConsumer struct {
	ch chan Delivery
}

func (c *drainConsumer) Deliver(s *Subscription, d Delivery)             { c.ch <- d }
func (c *drainConsumer) Closed(s *Subscription, reason uint8, err error) {}

// BenchmarkDrain measures consuming a backlog: each iteration publishes
// drainBatch 1 KiB messages (untimed), then times one subscription (prefetch
// 1000) receiving and acking all of them.
func BenchmarkDrain(b *testing.B) { benchDrain(b, 1000) }

// BenchmarkDrainVariants repeats BenchmarkDrain with a small prefetch,
// where the consumer is at its budget most of the time and every message
// cycle waits on syncs (the prefetch a remote consumer would use).
func BenchmarkDrainVariants(b *testing.B) {
	b.Run("prefetch=32", func(b *testing.B) { benchDrain(b, 32) })
}

// BenchmarkDrainPartitions is BenchmarkDrain over a queue of 1 and of 64
// partitions, the backlog spread over them: every partition leases and
// takes acks at once.
func BenchmarkDrainPartitions(b *testing.B) {
	for _, parts := range []uint32{1, 64} {
		b.Run("partitions="+strconv.Itoa(int(parts)), func(b *testing.B) { benchDrainParts(b, 1000, parts) })
	}
}

func benchDrain(b *testing.B, prefetch uint32) { benchDrainParts(b, prefetch, 1) }

func benchDrainParts(b *testing.B, prefetch, partitions uint32) {
	const drainBatch = 10_000
	br := benchBroker(b)
	if _, err := br.Declare(context.Background(), &protocol.DeclareQueue{Topic: "drain", Partitions: partitions, MaxRetries: -1}); err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 1024)
	p := &protocol.Publish{Topic: "drain", Partition: -1, Body: body}
	var n int
	for b.Loop() {
		b.StopTimer()
		// Chunks well below the inbox bound, so no publish is refused.
		var wg sync.WaitGroup
		for i := range drainBatch {
			wg.Add(1)
			br.Publish(p, func(_ protocol.PublishOK, err error) {
				if err != nil {
					b.Error(err)
				}
				wg.Done()
			})
			if i%1000 == 999 {
				wg.Wait()
			}
		}
		wg.Wait()
		b.StartTimer()

		c := &drainConsumer{ch: make(chan Delivery, prefetch)}
		s, err := br.Subscribe(&protocol.Subscribe{Topic: "drain", Partition: -1, Prefetch: prefetch}, c)
		if err != nil {
			b.Fatal(err)
		}
		var acked sync.WaitGroup
		acked.Add(drainBatch)
		for range drainBatch {
			d := <-c.ch
			var retry func(protocol.Code)
			retry = func(code protocol.Code) {
				if code == protocol.CodeResourceExhausted {
					s.Settle(protocol.OpAck, d.Partition, d.Offset, d.LeaseID, 0, retry)
					return
				}
				acked.Done()
			}
			s.Settle(protocol.OpAck, d.Partition, d.Offset, d.LeaseID, 0, retry)
		}
		acked.Wait()
		s.Close()
		n += drainBatch
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
}

// fsyncTableInFlight is the number of confirmed publishes in flight in
// total in BenchmarkPublishPartitions, whatever the partition count.
const fsyncTableInFlight = 256

// BenchmarkPublishPartitions measures aggregate confirmed (fsynced) 1 KiB
// publish throughput into one queue of 1, 4, 16 and 64 partitions with
// fsyncTableInFlight publishes in flight in total. Publisher i publishes to
// partition i mod partitions, so every partition has the same share of the
// 256 in flight and every partition's log runs its own fsync stream. The
// table tells whether separate per-partition fsync streams on one disk add
// up or collapse (docs/benchmarks.md, "fsync across partitions").
func BenchmarkPublishPartitions(b *testing.B) {
	for _, parts := range []uint32{1, 4, 16, 64} {
		b.Run("partitions="+strconv.Itoa(int(parts)), func(b *testing.B) {
			benchPublishSpread(b, benchBroker(b), parts, fsyncTableInFlight)
		})
	}
}

// benchPublishSpread runs inFlight publishers, each waiting for its
// confirmation before the next publish, publisher i pinned to partition
// i mod partitions.
func benchPublishSpread(b *testing.B, br *Broker, partitions uint32, inFlight int) {
	if _, err := br.Declare(context.Background(), &protocol.DeclareQueue{Topic: "bench", Partitions: partitions, MaxRetries: -1}); err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 1024)
	b.SetBytes(int64(len(body)))
	// RunParallel starts SetParallelism x GOMAXPROCS goroutines; round up so
	// at least inFlight run, then let only the first inFlight publish.
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((inFlight + procs - 1) / procs)
	var next atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := next.Add(1) - 1
		if i >= int64(inFlight) {
			// A surplus goroutine would take a share of b.N while
			// adding no publish in flight; refuse rather than mismeasure.
			b.Error("inFlight must be a multiple of GOMAXPROCS")
			return
		}
		p := &protocol.Publish{Topic: "bench", Partition: int32(i % int64(partitions)), Body: body}
		ch := make(chan error, 1)
		for pb.Next() {
			for {
				br.Publish(p, func(_ protocol.PublishOK, err error) { ch <- err })
				err := <-ch
				if protocol.CodeOf(err) == protocol.CodeResourceExhausted {
					continue
				}
				if err != nil {
					b.Error(err)
					return
				}
				break
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
