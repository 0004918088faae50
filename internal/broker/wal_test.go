package broker

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"
	"testing/synctest"

	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// With the node WAL on, every confirmed publish survives a power loss (MemFS
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
					cfg.NodeWAL = true
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
				cfg.NodeWAL = true
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

// A data directory that has a node WAL is refused without Config.NodeWAL:
// records confirmed through the WAL may be in no partition's own log yet.
// With it, the same directory opens and holds every confirmed message.
func TestNodeWALDirectoryNeedsNodeWAL(t *testing.T) {
	fs := vfs.NewMem()
	if err := fs.MkdirAll("data", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := fs.SyncDir("."); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(fs)
	cfg.NodeWAL = true
	b := mustOpen(t, cfg)
	for i := range 5 {
		mustPublish(t, b, msg("jobs", strconv.Itoa(i)))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	off := testConfig(fs)
	if b, err := Open(off); !errors.Is(err, ErrNodeWAL) {
		if err == nil {
			b.Close()
		}
		t.Fatalf("open without the node WAL: %v, want ErrNodeWAL", err)
	}
	b = mustOpen(t, cfg)
	defer b.Close()
	if got := readyTotal(t, b, "jobs"); got != 5 {
		t.Fatalf("%d ready after reopening with the WAL, want 5", got)
	}
}
