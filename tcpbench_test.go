package sinew

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sinewmq/sinew/internal/testkit"
)

// These benchmarks drive the real broker, on the real file system (every
// confirm waits for an fsync), behind the real wire server, over loopback, with
// the SDK: the whole end-to-end path in one process, so that CPU, block and
// mutex profiles cover both sides.

// tcpBenchDir is $SINEW_BENCH_DIR when set (a directory on the disk to
// measure), else a temporary directory.
func tcpBenchDir(b *testing.B) string {
	if d := os.Getenv("SINEW_BENCH_DIR"); d != "" {
		dir, err := os.MkdirTemp(d, "tcp-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return b.TempDir()
}

// startTCPBench runs broker and server on a real directory and returns a
// client connected to them. Cleanup closes all three.
func startTCPBench(b *testing.B) *Client {
	b.Helper()
	rb := testkit.StartBroker(b, testkit.WithDataDir(filepath.Join(tcpBenchDir(b), "data")))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, rb.Addr, WithClientName("tcp-bench"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() }) // runs before the server's cleanup
	return c
}

// tcpPublishersPerProc times GOMAXPROCS publishers (64 on two cores) each wait
// for their own confirm, as `sinew bench publish --window 64` does.
const tcpPublishersPerProc = 32

// BenchmarkTCPPublish measures confirmed 1 KiB publishes to a one-partition
// queue from 64 goroutines sharing one client connection.
func BenchmarkTCPPublish(b *testing.B) {
	c := startTCPBench(b)
	ctx := context.Background()
	if _, err := c.DeclareQueue(ctx, "bench", QueueConfig{Partitions: 1}); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(1024)
	b.SetParallelism(tcpPublishersPerProc)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		body := make([]byte, 1024)
		for pb.Next() {
			if _, err := c.Publish(ctx, "bench", body); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// tcpDrainBatch is the backlog each BenchmarkTCPDrain iteration consumes.
const tcpDrainBatch = 20_000

// tcpDrainPrefetch matches `sinew bench drain --prefetch 256`.
const tcpDrainPrefetch = 256

// BenchmarkTCPDrain measures consuming a backlog over TCP: each iteration
// publishes tcpDrainBatch 1 KiB messages (untimed), then times one
// subscription receiving and completing all of them.
func BenchmarkTCPDrain(b *testing.B) {
	c := startTCPBench(b)
	ctx := context.Background()
	if _, err := c.DeclareQueue(ctx, "drain", QueueConfig{Partitions: 1}); err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 1024)
	var n int
	for b.Loop() {
		b.StopTimer()
		fillTCPBacklog(b, c, "drain", body)
		b.StartTimer()
		drainTCP(b, c, "drain", tcpDrainBatch)
		n += tcpDrainBatch
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkTCPDrainAsync is BenchmarkTCPDrain with one goroutine receiving
// and calling CompleteAsync, the pattern the SDK documents for draining.
func BenchmarkTCPDrainAsync(b *testing.B) {
	c := startTCPBench(b)
	ctx := context.Background()
	if _, err := c.DeclareQueue(ctx, "drain", QueueConfig{Partitions: 1}); err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 1024)
	var n int
	for b.Loop() {
		b.StopTimer()
		fillTCPBacklog(b, c, "drain", body)
		b.StartTimer()
		s, err := c.Subscribe(ctx, "drain", WithPrefetch(tcpDrainPrefetch))
		if err != nil {
			b.Fatal(err)
		}
		settles := make([]*SettleFuture, 0, tcpDrainBatch)
		for range tcpDrainBatch {
			settles = append(settles, (<-s.Messages()).CompleteAsync())
		}
		for _, f := range settles {
			if err := f.Wait(ctx); err != nil {
				b.Fatal(err)
			}
		}
		if err := s.Unsubscribe(ctx); err != nil {
			b.Fatal(err)
		}
		n += tcpDrainBatch
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
}

// fillTCPBacklog publishes tcpDrainBatch copies of body to topic and waits
// for every confirm.
func fillTCPBacklog(b *testing.B, c *Client, topic string, body []byte) {
	ctx := context.Background()
	futs := make([]*PublishFuture, 0, tcpDrainBatch)
	for range tcpDrainBatch {
		futs = append(futs, c.PublishAsync(ctx, topic, body))
	}
	for _, f := range futs {
		if _, err := f.Wait(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// drainTCP subscribes to topic and completes count messages from a pool of
// prefetch goroutines each calling Complete.
func drainTCP(b *testing.B, c *Client, topic string, count int) {
	ctx := context.Background()
	s, err := c.Subscribe(ctx, topic, WithPrefetch(tcpDrainPrefetch))
	if err != nil {
		b.Fatal(err)
	}
	settle := make(chan *Message, tcpDrainPrefetch)
	var wg sync.WaitGroup
	for range tcpDrainPrefetch {
		wg.Go(func() {
			for m := range settle {
				if err := m.Complete(ctx); err != nil {
					b.Error(err)
				}
			}
		})
	}
	for range count {
		settle <- <-s.Messages()
	}
	close(settle)
	wg.Wait()
	if err := s.Unsubscribe(ctx); err != nil {
		b.Fatal(err)
	}
}
