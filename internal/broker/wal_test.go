package broker

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"testing/synctest"

	"github.com/sinewmq/sinew/internal/partition"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/internal/wal"
	"github.com/sinewmq/sinew/protocol"
)

// Through the node journal, every confirmed publish survives a power loss (MemFS
// crash with torn writes) across several partitions, over repeated crashes,
// and a deleted queue's WAL group does not bring it back.
func TestWALCrashKeepsConfirmed(t *testing.T) {
	for seed := range uint64(8) {
		t.Run("seed="+strconv.FormatUint(seed, 10), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 3))
				fs := vfs.NewMem()
				if err := fs.MkdirAll("data", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := fs.SyncDir("."); err != nil {
					t.Fatal(err)
				}
				confirmed := 0
				for round := range 3 {
					cfg := testConfig(fs)
					b := mustOpen(t, cfg)
					if b.wal == nil {
						t.Fatal("broker opened without its WAL")
					}
					if got := readyTotal(t, b, "jobs"); got != confirmed {
						t.Fatalf("round %d: %d ready after crash, %d confirmed", round, got, confirmed)
					}
					if _, ok := qstats(b, "gone", ""); ok {
						t.Fatalf("round %d: deleted queue came back", round)
					}
					ctx := context.Background()
					if _, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: "jobs", Partitions: 4, MaxRetries: -1}); err != nil {
						t.Fatal(err)
					}
					if round == 0 {
						mustPublish(t, b, msg("gone", "x"))
						if err := b.Delete(ctx, &protocol.DeleteQueue{Topic: "gone"}); err != nil {
							t.Fatal(err)
						}
					}
					for i := range 10 + rng.IntN(30) {
						p := msg("jobs", strconv.Itoa(i))
						p.Partition = int32(i % 4)
						mustPublish(t, b, p)
						confirmed++
					}
					crashed := fs.Crash(rng, true)
					b.Close() // the crashed FS refuses everything
					fs = crashed
				}
				cfg := testConfig(fs)
				b := mustOpen(t, cfg)
				defer b.Close()
				if got := readyTotal(t, b, "jobs"); got != confirmed {
					t.Fatalf("%d ready after the last crash, %d confirmed", got, confirmed)
				}
			})
		})
	}
}

func readyTotal(t *testing.T, b *Broker, topic string) int {
	t.Helper()
	q, ok := qstats(b, topic, "")
	if !ok {
		return 0
	}
	n := 0
	for _, p := range q.Partitions {
		n += int(p.Ready)
	}
	return n
}

// After a power loss the journal holds records no partition log has; the
// next start replays them, and a clean stop then retires the journal: the
// directory opens again with every message and no segment left behind.
func TestJournalRetiredAfterACleanStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := walFS(t)
		b := mustOpen(t, walConfig(fs))
		for i := range 5 {
			mustPublish(t, b, msg("jobs", strconv.Itoa(i)))
		}
		crashed := fs.Crash(rand.New(rand.NewPCG(9, 9)), false)
		b.Close()
		b = mustOpen(t, walConfig(crashed))
		if got := readyTotal(t, b, "jobs"); got != 5 {
			t.Fatalf("%d ready after a power loss, want 5", got)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if has, err := wal.HasSegments(crashed, "data/wal"); has || err != nil {
			t.Fatalf("after a clean stop the journal still has segments (%v, %v)", has, err)
		}
		b = mustOpen(t, walConfig(crashed))
		defer b.Close()
		if got := readyTotal(t, b, "jobs"); got != 5 {
			t.Fatalf("%d ready after the journal was retired, want 5", got)
		}
	})
}

// A clean stop does not retire a journal that holds a quarantined
// partition's records: the next start replays them again.
func TestJournalKeptForAQuarantinedPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := walFS(t)
		b := mustOpen(t, walConfig(fs))
		mustPublish(t, b, msg("q", "x"))
		crashed := fs.Crash(rand.New(rand.NewPCG(4, 4)), false)
		b.Close()
		cp := filepath.Join("data", queuesDir, escapeName("q"), escapeName(""), "p0", "checkpoint")
		if err := partition.WriteFileAtomic(crashed, cp, []byte("not a checkpoint")); err != nil {
			t.Fatal(err)
		}
		b = mustOpen(t, walConfig(crashed))
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if has, err := wal.HasSegments(crashed, "data/wal"); !has || err != nil {
			t.Fatalf("the journal holding a quarantined partition's records was deleted (%v, %v)", has, err)
		}
	})
}

// walFS returns a MemFS with a durable data directory.
func walFS(t *testing.T) *vfs.MemFS {
	t.Helper()
	fs := vfs.NewMem()
	if err := fs.MkdirAll("data", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := fs.SyncDir("."); err != nil {
		t.Fatal(err)
	}
	return fs
}

func walConfig(fs vfs.FS) Config { return testConfig(fs) }

// publishUntil publishes messages of almost 1 MiB to topic until done.
func publishUntil(t *testing.T, b *Broker, topic string, done func() bool) {
	t.Helper()
	body := bytes.Repeat([]byte("x"), 1<<20-4096)
	for i := 0; !done(); i++ {
		if i > 2000 {
			t.Fatal("the condition never came")
		}
		p := msg(topic, "")
		p.Body = body
		mustPublish(t, b, p)
	}
}

// The WAL asks for release while recovery has not opened every queue: a
// group whose queue is not open yet keeps its entries (its partition
// releases them once merged), and a record confirmed only in the WAL
// survives a power loss.
func TestWALPressureDuringRecoveryKeepsUnopenedGroups(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := walFS(t)
		b := mustOpen(t, walConfig(fs))
		mustPublish(t, b, msg("a", "warm")) // "a" opens first at recovery
		mustPublish(t, b, msg("z", "confirmed"))
		publishUntil(t, b, "a", func() bool { n, _ := b.wal.Segments(); return n >= 4 })
		crashed := fs.Crash(rand.New(rand.NewPCG(5, 5)), false)
		b.Close()
		b = mustOpen(t, walConfig(crashed))
		defer b.Close()
		if got := readyTotal(t, b, "z"); got != 1 {
			t.Fatalf("queue z has %d ready after a power loss, 1 confirmed", got)
		}
	})
}

// A queue deleted and created again under the same name gets WAL groups of
// its own: the old queue's released indexes do not release the new one's
// entries, whose only durable copy may be the WAL, and none of the old
// queue's messages come back.
func TestWALRecreatedQueueKeepsConfirmed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := walFS(t)
		b := mustOpen(t, walConfig(fs))
		ctx := context.Background()
		for range 20 {
			mustPublish(t, b, msg("jobs", "old"))
		}
		if err := b.Delete(ctx, &protocol.DeleteQueue{Topic: "jobs"}); err != nil {
			t.Fatal(err)
		}
		mustPublish(t, b, msg("jobs", "new")) // created again on first use
		first := "wal-0000000000000001.log"
		publishUntil(t, b, "other", func() bool {
			names, _ := fs.ReadDir("data/wal")
			return !slices.Contains(names, first)
		})
		crashed := fs.Crash(rand.New(rand.NewPCG(7, 7)), false)
		b.Close()
		b = mustOpen(t, walConfig(crashed))
		defer b.Close()
		if got := readyTotal(t, b, "jobs"); got != 1 {
			t.Fatalf("the queue created again has %d ready after a power loss, 1 confirmed", got)
		}
	})
}

// A queue deleted and declared again before a crash is empty after it: the
// WAL's entries of the deleted queue are not merged into the new one.
func TestWALDeletedQueueStaysDeleted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := walFS(t)
		b := mustOpen(t, walConfig(fs))
		ctx := context.Background()
		for i := range 5 {
			mustPublish(t, b, msg("jobs", "old"+strconv.Itoa(i)))
		}
		if err := b.Delete(ctx, &protocol.DeleteQueue{Topic: "jobs"}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: "jobs", MaxRetries: -1}); err != nil {
			t.Fatal(err)
		}
		crashed := fs.Crash(rand.New(rand.NewPCG(1, 2)), false)
		b.Close()
		b = mustOpen(t, walConfig(crashed))
		defer b.Close()
		if got := readyTotal(t, b, "jobs"); got != 0 {
			t.Fatalf("the new queue holds %d messages of the deleted one after a crash", got)
		}
	})
}

// A quarantined partition keeps its WAL entries through pressure: once the
// damage is repaired, the records confirmed only through the WAL are there.
func TestWALQuarantinedPartitionKeepsItsEntries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := walFS(t)
		b := mustOpen(t, walConfig(fs))
		for i := range 3 {
			mustPublish(t, b, msg("q", strconv.Itoa(i)))
		}
		crashed := fs.Crash(rand.New(rand.NewPCG(3, 3)), false)
		b.Close()
		fs = crashed

		// Damage: a checkpoint that does not verify.
		cp := filepath.Join("data", queuesDir, escapeName("q"), escapeName(""), "p0", "checkpoint")
		saved, readErr := vfs.ReadFileMax(fs, cp, 1<<20)
		if err := partition.WriteFileAtomic(fs, cp, []byte("not a checkpoint")); err != nil {
			t.Fatal(err)
		}
		b = mustOpen(t, walConfig(fs))
		if qs, ok := qstats(b, "q", ""); !ok || !qs.Partitions[0].Quarantined {
			t.Fatalf("queue q is not quarantined: %+v", qs)
		}
		start := newestWALSegment(t, fs)
		publishUntil(t, b, "other", func() bool { return newestWALSegment(t, fs) >= start+8 })
		synctest.Wait() // pressure calls run on their own goroutines
		// Its segments stay; the others' are still asked for and go.
		if n, _ := b.wal.Segments(); n > 8 {
			t.Errorf("%d WAL segments kept with one partition quarantined", n)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}

		// Repair: the checkpoint as it was (or none, if there was none).
		if readErr == nil {
			err := partition.WriteFileAtomic(fs, cp, saved)
			if err != nil {
				t.Fatal(err)
			}
		} else if err := fs.Remove(cp); err != nil {
			t.Fatal(err)
		}
		b = mustOpen(t, walConfig(fs))
		defer b.Close()
		if got := readyTotal(t, b, "q"); got != 3 {
			t.Fatalf("after the repair q has %d ready, 3 confirmed", got)
		}
	})
}

// newestWALSegment returns the sequence number of the newest WAL segment.
func newestWALSegment(t *testing.T, fs vfs.FS) uint64 {
	t.Helper()
	names, err := fs.ReadDir("data/wal")
	if err != nil {
		t.Fatal(err)
	}
	var newest uint64
	for _, n := range names {
		var seq uint64
		if _, err := fmt.Sscanf(n, "wal-%016x.log", &seq); err == nil {
			newest = max(newest, seq)
		}
	}
	return newest
}
