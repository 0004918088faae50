package partition

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"testing/synctest"

	"github.com/sinewmq/sinew/internal/vfs"
)

// An ACK whose answer was lost is answered ok when repeated after several
// crashes, each restart taking a checkpoint (the idle one of its first
// turn) before the next crash: the ACK memory is written with every
// checkpoint, so one taken after the ACK does not make it forgotten.
// Through the node journal (the broker's setup) and without it.
func TestAckMemorySurvivesRestartsAndCheckpoints(t *testing.T) {
	for _, withWAL := range []bool{true, false} {
		for seed := range uint64(4) {
			t.Run(fmt.Sprint("wal=", withWAL, "/seed=", seed), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) { ackAcrossRestarts(t, seed, withWAL) })
			})
		}
	}
}

func ackAcrossRestarts(t *testing.T, seed uint64, withWAL bool) {
	rng := rand.New(rand.NewPCG(seed, 11))
	fs := vfs.NewMem()
	cfg := testConfig(fs)
	cfg.Queue.LeaseMs = 3_600_000
	cfg.RecoveredLeaseGraceMs = 600_000 // the recovered leases stay held
	open := func() *Partition {
		if withWAL {
			openWAL(t, cfg.FS, &cfg)
		}
		return mustOpen(t, cfg)
	}
	p := open()
	for i := range 40 {
		mustPublish(t, p, fmt.Sprint("m", i), nil)
	}
	c := &tconsumer{owner: "o", credit: 32}
	p.Attach(c)
	synctest.Wait()
	ds := c.deliveries()
	if len(ds) != 32 {
		t.Fatalf("%d deliveries, want 32", len(ds))
	}
	settle := func(d Delivery) error {
		ch := make(chan error, 1)
		p.Settle(Ack, d.Offset, d.LeaseID, 0, func(err error) { ch <- err })
		return <-ch
	}
	var acked []Delivery
	for round := range 4 {
		// Eight more ACKs applied and durable, their answers "lost".
		for _, d := range ds[round*8 : round*8+8] {
			if err := settle(d); err != nil {
				t.Fatalf("round %d: ack of %d: %v", round, d.Offset, err)
			}
			acked = append(acked, d)
		}
		img := fs.Crash(rng, rng.IntN(2) == 0)
		p.Close()
		fs, cfg.FS = img, img
		p = open()
		for _, d := range acked {
			if cur, err := p.LeaseCurrent(context.Background(), d.Offset, d.LeaseID); err != nil || !cur {
				t.Errorf("round %d: the lease that ACKed offset %d is not current after a restart (%v, %v)", round, d.Offset, cur, err)
			}
			if err := settle(d); err != nil {
				t.Errorf("round %d: the repeated ACK of offset %d: %v, want ok", round, d.Offset, err)
			}
		}
		// A lease that did not ACK the message is still refused.
		if d := acked[0]; settle(Delivery{Offset: d.Offset, LeaseID: d.LeaseID ^ 1}) == nil {
			t.Errorf("round %d: an ACK of offset %d by another lease was answered ok", round, d.Offset)
		}
	}
	p.Close()
}

// The file form of the ACK memory gives back the same memory, in the same
// order of eviction, whether the memory was a table, a full ring or packed;
// a damaged file is refused with an error, never a panic.
func TestAckMemoryFileRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, n := range []int{0, 1, 100, ackPackThreshold + 3, ackMemoryMax + 500} {
		for _, packed := range []bool{false, true} {
			a := newAckMemory()
			for i := range n {
				a.put(uint64(i)*3+uint64(rng.IntN(3)), rng.Uint64N(1<<63)+1)
			}
			want := newAckMemory()
			for i := range len(a.order) {
				off := a.order[(a.head+i)%len(a.order)]
				j, _ := a.find(off + 1)
				want.put(off, a.slots[j].lease)
			}
			if packed {
				a.pack()
			}
			b := a.encode()
			got, err := decodeAckMemory(b)
			if err != nil {
				t.Fatalf("n=%d packed=%v: %v", n, packed, err)
			}
			if got.n != want.n {
				t.Fatalf("n=%d packed=%v: %d entries back, want %d", n, packed, got.n, want.n)
			}
			for i := range len(want.order) {
				off := want.order[(want.head+i)%len(want.order)]
				j, _ := want.find(off + 1)
				if !got.by(off, want.slots[j].lease) {
					t.Fatalf("n=%d packed=%v: offset %d lost", n, packed, off)
				}
				if g := got.order[(got.head+i)%len(got.order)]; g != off {
					t.Fatalf("n=%d packed=%v: eviction order differs at %d: %d, want %d", n, packed, i, g, off)
				}
			}
			if n == 100 {
				for cut := range len(b) {
					if _, err := decodeAckMemory(b[:cut]); err == nil {
						t.Fatalf("a file cut to %d of %d bytes was accepted", cut, len(b))
					}
				}
				for i := range len(b) {
					bad := append([]byte(nil), b...)
					bad[i] ^= 0x10
					if _, err := decodeAckMemory(bad); err == nil {
						t.Fatalf("a file with byte %d flipped was accepted", i)
					}
				}
			}
		}
	}
}

// A damaged ACK memory file does not stop the partition from opening: it
// opens with what the log replays.
func TestAckMemoryFileDamagedIsNotFatal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		cfg := testConfig(fs)
		p := mustOpen(t, cfg)
		mustPublish(t, p, "a", nil)
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if err := WriteFileAtomic(fs, p.ackPath(), []byte("SNWA\x01garbage")); err != nil {
			t.Fatal(err)
		}
		p = mustOpen(t, cfg)
		defer p.Close()
		if got := p.Stats().Ready; got != 1 {
			t.Fatalf("%d ready after reopening with a damaged ACK memory, want 1", got)
		}
	})
}
