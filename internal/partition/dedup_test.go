package partition

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"testing"
	"testing/synctest"

	"github.com/sinewmq/sinew/internal/dedup"
	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/vfs"
)

type onceResult struct {
	off uint64
	dup bool
	err error
}

func publishOnce(p *Partition, producer string, seq uint64, body string) chan onceResult {
	ch := make(chan onceResult, 1)
	m := &queue.Message{Body: []byte(body), ProducerID: producer, ProducerSeq: seq}
	p.PublishOnce(m, func(off uint64, dup bool, err error) { ch <- onceResult{off, dup, err} })
	return ch
}

func mustOnce(t testing.TB, p *Partition, producer string, seq uint64, body string) onceResult {
	t.Helper()
	r := <-publishOnce(p, producer, seq, body)
	if r.err != nil {
		t.Fatalf("publish %s/%d: %v", producer, seq, r.err)
	}
	return r
}

// TestPublishOnceAnswersDuplicates: a repeated (producer, sequence) is
// answered with the original offset and duplicate = true and stores
// nothing, whether the original is durable already or in the same stage;
// a sequence below the window is refused with ErrSequenceTooOld.
func TestPublishOnceAnswersDuplicates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(vfs.NewMem())
		cfg.Dedup = dedup.Config{WindowSeqs: 2}
		p := mustOpen(t, cfg)
		defer p.Close()
		first := mustOnce(t, p, "p", 1, "one")
		if first.dup {
			t.Fatalf("first publish answered as a duplicate")
		}
		next := p.Stats().NextLSN
		again := mustOnce(t, p, "p", 1, "one again")
		if !again.dup || again.off != first.off {
			t.Fatalf("resend: %+v, want offset %d duplicate", again, first.off)
		}
		if other := mustOnce(t, p, "q", 1, "q's one"); other.dup {
			t.Fatalf("another producer's sequence 1 answered as a duplicate: %+v", other)
		}
		// Two sends of one sequence in flight together: one store.
		a, b := publishOnce(p, "p", 2, "two"), publishOnce(p, "p", 2, "two")
		ra, rb := <-a, <-b
		if ra.err != nil || rb.err != nil || ra.off != rb.off || ra.dup || !rb.dup {
			t.Fatalf("concurrent sends: %+v %+v", ra, rb)
		}
		mustOnce(t, p, "p", 3, "three") // the window (2) now holds 2 and 3
		if r := <-publishOnce(p, "p", 1, "one, third time"); !errors.Is(r.err, ErrSequenceTooOld) {
			t.Fatalf("sequence below the window: %+v, want ErrSequenceTooOld", r)
		}
		st := p.Stats()
		if st.Duplicates != 2 || st.Dedup.Producers != 2 {
			t.Fatalf("stats: duplicates %d dedup %+v", st.Duplicates, st.Dedup)
		}
		// one, q's one, two, three: four Enqueue records after the first.
		if got := st.NextLSN - next; got != 3 {
			t.Fatalf("%d records appended after the first publish, want 3", got)
		}
		c := &tconsumer{owner: "c", credit: -1}
		if err := p.Attach(c); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got := bodies(c.deliveries()); len(got) != 4 {
			t.Fatalf("delivered %q, want one copy of each of 4 messages", got)
		}
	})
}

// TestDedupSurvivesAckRetentionAndRestart: a message is acked, retention
// drops the segment holding it, the partition restarts from its
// checkpoint, and a resend of its sequence still gets the original offset.
func TestDedupSurvivesAckRetentionAndRestart(t *testing.T) {
	cfg := testConfig(vfs.NewMem())
	cfg.SegmentBytes = 16 << 10
	cfg.CheckpointEveryRecords = 500
	p := mustOpen(t, cfg)
	orig := mustOnce(t, p, "p", 7, "the original")
	c := &tconsumer{owner: "c", credit: -1}
	if err := p.Attach(c); err != nil {
		t.Fatal(err)
	}
	filler := make([]byte, 200)
	const n = 2000
	for i := range n {
		mustOnce(t, p, "filler", uint64(i+1), string(filler))
	}
	acked := 0
	for acked < n+1 {
		for _, d := range c.deliveries()[acked:] {
			if err := settle(p, Ack, d, 0); err != nil {
				t.Fatalf("ack %d: %v", d.Offset, err)
			}
			acked++
		}
		inspect(p, func() {})
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = mustOpen(t, cfg)
	defer p.Close()
	var first uint64
	inspect(p, func() { first = p.log.FirstLSN() })
	if first <= orig.off {
		t.Fatalf("log still starts at %d, at or before the original's offset %d: retention did not drop it", first, orig.off)
	}
	r := mustOnce(t, p, "p", 7, "resent")
	if !r.dup || r.off != orig.off {
		t.Fatalf("resend after ack, retention and restart: %+v, want offset %d duplicate", r, orig.off)
	}
	if st := p.Stats(); st.Ready+st.Inflight != 0 {
		t.Fatalf("resend stored a second copy: %+v", st.Stats)
	}
}

// TestDedupOnlyDurableCounts: the machine crashes while the original's
// record is being synced and a resend of it waits in the next stage.
// Neither is confirmed; after the restart the sequence is new, not a
// duplicate of a store that never became durable.
func TestDedupOnlyDurableCounts(t *testing.T) {
	mem := vfs.NewMem()
	gfs := &gatedFS{MemFS: mem}
	cfg := testConfig(mem)
	cfg.FS = gfs
	p := mustOpen(t, cfg)
	before := mustOnce(t, p, "p", 1, "durable")

	entered, release := gfs.hold()
	a := publishOnce(p, "p", 2, "lost")
	<-entered // its sync is under way
	b := publishOnce(p, "p", 2, "lost, resent")
	inspect(p, func() {})
	inspect(p, func() {}) // b was taken and answered into the open stage
	crashed := mem.Crash(rand.New(rand.NewPCG(3, 4)), true)
	release()
	if r := <-a; r.err == nil {
		t.Fatalf("original confirmed after the machine crashed: %+v", r)
	}
	if r := <-b; r.err == nil {
		t.Fatalf("resend confirmed (duplicate %v) after the machine crashed with the original undurable", r.dup)
	}
	p.Close()

	cfg.FS = crashed
	p = mustOpen(t, cfg)
	defer p.Close()
	if r := mustOnce(t, p, "p", 1, "durable, resent"); !r.dup || r.off != before.off {
		t.Fatalf("durable sequence after the crash: %+v, want offset %d duplicate", r, before.off)
	}
	if r := mustOnce(t, p, "p", 2, "lost, resent after restart"); r.dup {
		t.Fatalf("sequence whose store never became durable answered as a duplicate of offset %d", r.off)
	}
}

// TestCheckpointVersion1StillOpens: a checkpoint written before the dedup
// section existed restores, with an empty window, and the log after it
// still replays into the window.
func TestCheckpointVersion1StillOpens(t *testing.T) {
	cfg := testConfig(vfs.NewMem())
	p := mustOpen(t, cfg)
	a := mustPublish(t, p, "a", nil)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := readFile(cfg.FS, p.ckptPath())
	if err != nil || raw == nil {
		t.Fatalf("read checkpoint: %v", err)
	}
	covers, snap, _, err := decodeCheckpoint(raw)
	if err != nil {
		t.Fatal(err)
	}
	v1 := append([]byte(ckptMagic), 1)
	v1 = binary.LittleEndian.AppendUint64(v1, covers)
	v1 = binary.LittleEndian.AppendUint32(v1, uint32(len(snap)))
	v1 = append(v1, snap...)
	v1 = binary.LittleEndian.AppendUint32(v1, crc32.Checksum(v1, castagnoli))
	if err := WriteFileAtomic(cfg.FS, p.ckptPath(), v1); err != nil {
		t.Fatal(err)
	}
	p = mustOpen(t, cfg)
	r := mustOnce(t, p, "p", 1, "b")
	if st := p.Stats(); st.Ready != 2 || r.off <= a {
		t.Fatalf("after a v1 checkpoint: ready %d, new offset %d after %d", st.Ready, r.off, a)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p = mustOpen(t, cfg) // now from a v2 checkpoint
	defer p.Close()
	if again := mustOnce(t, p, "p", 1, "b"); !again.dup || again.off != r.off {
		t.Fatalf("resend after reopen: %+v, want offset %d duplicate", again, r.off)
	}
}
