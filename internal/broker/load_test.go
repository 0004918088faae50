package broker

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// keyFor returns a key that hashes to partition want of n.
func keyFor(t testing.TB, want, n int) []byte {
	for i := range 10000 {
		k := []byte(fmt.Sprintf("k%d", i))
		if keyPartition(k, n) == want {
			return k
		}
	}
	t.Fatalf("no key for partition %d of %d", want, n)
	return nil
}

// TestKeylessPrefersLessBacklog: with a backlog on partition 1, keyless
// publishes go to the other partitions; keyed and producer-pinned
// publishes go where their hash says whatever the backlogs.
func TestKeylessPrefersLessBacklog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		if _, err := b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "t", Partitions: 4, MaxRetries: -1}); err != nil {
			t.Fatal(err)
		}
		heavy := keyFor(t, 1, 4)
		for range 20 {
			p := msg("t", "v")
			p.Key = heavy
			mustPublish(t, b, p)
		}
		synctest.Wait()
		counts := make([]int, 4)
		for range 40 {
			counts[mustPublish(t, b, msg("t", "v")).Partition]++
			synctest.Wait()
		}
		if counts[1] != 0 || counts[0]+counts[2]+counts[3] != 40 {
			t.Fatalf("keyless counts %v with 20 waiting on partition 1: want none on 1", counts)
		}
		for i := range 8 {
			p := msg("t", "v")
			p.Key = heavy
			if r := mustPublish(t, b, p); r.Partition != 1 {
				t.Fatalf("keyed publish went to %d, want its hash's 1", r.Partition)
			}
			p = msg("t", "v")
			p.ProducerID, p.ProducerSeq = "prod", uint64(i+1)
			if r, want := mustPublish(t, b, p), producerPartition("prod", uint64(i+1), 4); int(r.Partition) != want {
				t.Fatalf("producer seq %d went to %d, want its hash's %d", i+1, r.Partition, want)
			}
		}
	})
}

// skewedBacklogs publishes n keyless messages to a queue of four
// partitions whose "consumer" takes every message of partitions 1 to 3 at
// once and one message of partition 0 every eighth publish (a slow
// consumer there), and returns each partition's backlog at the end.
func skewedBacklogs(t testing.TB, n int) []int {
	b := mustOpen(t, testConfig(vfs.NewMem()))
	defer b.Close()
	if _, err := b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "s", Partitions: 4, MaxRetries: -1}); err != nil {
		t.Fatal(err)
	}
	discard := func(part uint32, off uint64) {
		ch := make(chan error, 1)
		b.Discard("s", "", part, off, func(err error) { ch <- err })
		if err := <-ch; err != nil {
			t.Fatalf("discard %d/%d: %v", part, off, err)
		}
	}
	var slow []uint64 // partition 0's waiting offsets, oldest first
	for i := range n {
		r := mustPublish(t, b, msg("s", "v"))
		if r.Partition == 0 {
			slow = append(slow, r.Offset)
		} else {
			discard(r.Partition, r.Offset)
		}
		if i%8 == 7 && len(slow) > 0 {
			discard(0, slow[0])
			slow = slow[1:]
		}
		synctest.Wait()
	}
	st, err := b.QueueStatsOf("s", "")
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int, len(st.Partitions))
	for i, p := range st.Partitions {
		out[i] = p.Ready + p.Inflight
	}
	return out
}

// TestKeylessSkewedConsumerEvensOut: behind a slow consumer on one
// partition, round-robin piles the backlog up there (a quarter of the
// publishes arrive, an eighth leave); choosing the less backlogged of two
// keeps it near the others'.
func TestKeylessSkewedConsumerEvensOut(t *testing.T) {
	const n = 800
	var rr, p2c []int
	synctest.Test(t, func(t *testing.T) {
		roundRobinOnly.Store(true)
		defer roundRobinOnly.Store(false)
		rr = skewedBacklogs(t, n)
	})
	synctest.Test(t, func(t *testing.T) { p2c = skewedBacklogs(t, n) })
	t.Logf("backlogs after %d publishes: round-robin %v, less backlog of two %v", n, rr, p2c)
	if rr[0] < n/8-2 {
		t.Fatalf("round-robin left %d on the slow partition, want about %d", rr[0], n/8)
	}
	if p2c[0] > 4 {
		t.Fatalf("choosing by backlog left %d on the slow partition, want at most 4", p2c[0])
	}
}

// BenchmarkKeylessPick compares keyless publishes with and without the
// backlog choice, interleaved in one run (-count > 1 alternates them).
func BenchmarkKeylessPick(b *testing.B) {
	for _, mode := range []struct {
		name string
		rr   bool
	}{{"round-robin", true}, {"by-backlog", false}} {
		b.Run(mode.name, func(b *testing.B) {
			roundRobinOnly.Store(mode.rr)
			defer roundRobinOnly.Store(false)
			br := mustOpen(b, Config{DataDir: b.TempDir(), DefaultLeaseMs: 10_000})
			defer br.Close()
			if _, err := br.Declare(context.Background(), &protocol.DeclareQueue{Topic: "b", Partitions: 8, MaxRetries: -1}); err != nil {
				b.Fatal(err)
			}
			body := make([]byte, 256)
			const window = 256
			sem := make(chan struct{}, window)
			errs := make(chan error, 1)
			b.SetBytes(int64(len(body)))
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				sem <- struct{}{}
				br.Publish(&protocol.Publish{Topic: "b", Partition: -1, Body: body}, func(_ protocol.PublishOK, err error) {
					if err != nil {
						select {
						case errs <- err:
						default:
						}
					}
					<-sem
				})
			}
			for range window {
				sem <- struct{}{}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
			select {
			case err := <-errs:
				b.Fatal(err)
			default:
			}
		})
	}
}

// TestLoadSample: the node's load counts the partitions led (all, on one
// node) and their backlog, the append rate over the interval, and an idle
// node rescans its partitions only every loadRescanEvery samples.
func TestLoadSample(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		if _, err := b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "t", Partitions: 3, MaxRetries: -1}); err != nil {
			t.Fatal(err)
		}
		first := b.LoadSample()
		if first.PartitionsLed != 3 || first.Backlog != 0 || first.AppendRate != 0 {
			t.Fatalf("first sample %+v, want 3 led, nothing waiting", first)
		}
		for range 10 {
			mustPublish(t, b, msg("t", "v"))
		}
		synctest.Wait()
		time.Sleep(2 * time.Second) // the fake clock of the bubble
		l := b.LoadSample()
		if l.PartitionsLed != 3 || l.Backlog != 10 || l.AppendRate != 5 {
			t.Fatalf("after 10 publishes in 2 s: %+v, want 3 led, 10 waiting, 5/s", l)
		}
		// Idle: one more scan (the counters moved at the previous
		// sample), then none until loadRescanEvery samples went by.
		b.LoadSample()
		scans := b.load.scans
		for range loadRescanEvery - 1 {
			time.Sleep(2 * time.Second)
			if l := b.LoadSample(); l.Backlog != 10 || l.AppendRate != 0 {
				t.Fatalf("idle sample %+v", l)
			}
		}
		if b.load.scans != scans {
			t.Fatalf("an idle node scanned %d times in %d samples", b.load.scans-scans, loadRescanEvery-1)
		}
		b.LoadSample()
		if b.load.scans != scans+1 {
			t.Fatalf("no rescan after %d idle samples", loadRescanEvery)
		}
	})
}

// TestPublishOKHintsTheLighterPartition: the answer to a keyless publish
// names a partition (PublishOK.Next, 1 + its index) chosen by round-robin
// and the less backlogged of two, so a partition holding a backlog is not
// hinted while its neighbours are emptier; a keyed publish gets no hint,
// and neither does a queue of one partition.
func TestPublishOKHintsTheLighterPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		ctx := context.Background()
		for _, d := range []*protocol.DeclareQueue{{Topic: "h", Partitions: 4, MaxRetries: -1}, {Topic: "one", Partitions: 1, MaxRetries: -1}} {
			if _, err := b.Declare(ctx, d); err != nil {
				t.Fatal(err)
			}
		}
		for range 50 {
			p := msg("h", "heavy")
			p.Partition = 2
			mustPublish(t, b, p)
		}
		synctest.Wait()
		hinted := make([]int, 4)
		for i := range 40 {
			p := msg("h", "v")
			p.ProducerID, p.ProducerSeq = "hint-test", uint64(i+1)
			ok := mustPublish(t, b, p)
			if ok.Next < 1 || ok.Next > 4 {
				t.Fatalf("publish %d: next %d, want 1 to 4", i, ok.Next)
			}
			hinted[ok.Next-1]++
			synctest.Wait()
		}
		if hinted[2] != 0 {
			t.Fatalf("hints per partition %v: the backlogged partition 2 was hinted", hinted)
		}
		for _, n := range []int{0, 1, 3} {
			if hinted[n] == 0 {
				t.Fatalf("hints per partition %v: partition %d never hinted", hinted, n)
			}
		}
		keyed := msg("h", "v")
		keyed.Key = []byte("k")
		if ok := mustPublish(t, b, keyed); ok.Next != 0 {
			t.Fatalf("keyed publish got hint %d, want none", ok.Next)
		}
		if ok := mustPublish(t, b, msg("one", "v")); ok.Next != 0 {
			t.Fatalf("publish to a queue of one partition got hint %d, want none", ok.Next)
		}
	})
}
