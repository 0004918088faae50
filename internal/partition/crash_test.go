package partition

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/sinewmq/sinew/internal/dedup"
	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/internal/wal"
)

// crashModel is what the test knows was confirmed before a crash.
type crashModel struct {
	mu        sync.Mutex
	attempted map[string]bool   // every body ever published
	confirmed map[uint64]string // offset -> body, publish confirmed
	acked     map[uint64]bool   // ack confirmed
	// ackTried holds offsets an ack was sent for, confirmed or not: an ack
	// answered with an error (the crash came first) may still have reached
	// the disk, like any unconfirmed write, so such an offset may be
	// settled or not. An offset nobody tried to ack must never be settled.
	ackTried map[uint64]bool
	// Producer sequences: seqBody is every sequence published under
	// crashProducer with its body; seqOff the offset its first confirmed
	// answer (stored or duplicate) named, which every later answer and
	// every recovery must repeat.
	seqBody map[uint64]string
	seqOff  map[uint64]uint64
	seqs    []uint64 // keys of seqBody, for random resends
	// seqErr collects answers that contradict seqOff.
	seqErr []string
	dups   int // duplicate answers
}

const crashProducer = "prod"

// answered records a confirmed answer for seq at off.
func (m *crashModel) answered(seq, off uint64, dup bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if was, ok := m.seqOff[seq]; ok && was != off {
		m.seqErr = append(m.seqErr, fmt.Sprintf("seq %d answered at offset %d (duplicate %v), earlier at %d", seq, off, dup, was))
		return
	}
	m.seqOff[seq] = off
	if dup {
		m.dups++
	}
}

// inspect runs fn on the actor goroutine and waits for it.
func inspect(p *Partition, fn func()) {
	done := make(chan struct{})
	if err := p.control(control{kind: ctlInspect, fn: func() { fn(); close(done) }}); err != nil {
		panic(err)
	}
	<-done
}

// TestCrashRecovery runs random publishes and settles against a partition on
// MemFS, crashes the file system (with torn writes) at a random moment while
// work is in flight, reopens, and checks: every confirmed publish is present
// with its bytes, no confirmed ack comes back, nothing appears that was never
// published, nothing is settled that nobody tried to ack, and (with
// retention off) checkpoint + replay equals a replay of the whole log.
// Half the publishes carry a producer sequence and some are resent: every
// confirmed sequence must be remembered at its one offset after recovery,
// and none stored twice.
//
// Some messages are delayed far beyond the run, so they pin old segments
// and the actor relocates their bodies (with a low live fraction in some
// seeds, everything live in sealed segments); the checks above then read
// them from wherever they moved.
func TestCrashRecovery(t *testing.T) {
	seeds := 60
	if testing.Short() {
		seeds = 15
	}
	var relocated uint64
	dups := 0
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r, d := crashRun(t, seed, false)
				relocated += r
				dups += d
			})
		})
	}
	t.Logf("%d bodies relocated and %d resends answered as duplicates over %d seeds", relocated, dups, seeds)
	if relocated == 0 {
		t.Error("no body was relocated: the test no longer exercises relocation")
	}
	if dups == 0 {
		t.Error("no resend was answered as a duplicate: the test no longer exercises deduplication")
	}
}

// TestCrashRecoveryWAL is TestCrashRecovery with the partition's entries
// made durable through a node WAL (Config.WAL) on the same crashable file
// system: a confirm then means the WAL's fdatasync, the partition's own log
// only got the entries to the OS, and recovery must take what the log lost
// from the WAL.
func TestCrashRecoveryWAL(t *testing.T) {
	seeds := 40
	if testing.Short() {
		seeds = 10
	}
	for seed := range uint64(seeds) {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				_, _ = crashRun(t, seed, true)
			})
		})
	}
}

// openWAL opens the node WAL on fs and points cfg at it, with what it
// replayed for the partition.
func openWAL(t *testing.T, fs vfs.FS, cfg *Config) *wal.WAL {
	t.Helper()
	w, err := wal.Open(wal.Options{FS: fs, Dir: "wal", SegmentBytes: 8 << 10})
	if err != nil {
		t.Fatalf("open wal: %v", err)
	}
	t.Cleanup(func() { _ = w.Close() })
	cfg.WAL, cfg.WALGroup, cfg.WALReplay = w, "queues/t/g/p0", nil
	if g, ok := w.Take(cfg.WALGroup); ok {
		cfg.WALReplay = &g
	}
	return w
}

// crashRun runs one seed and returns how many bodies were relocated. With
// withWAL the partition commits through a node WAL.
func crashRun(t *testing.T, seed uint64, withWAL bool) (relocated uint64, dups int) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	fs := vfs.NewMem()
	cfg := testConfig(fs)
	cfg.Queue.LeaseMs = 3_600_000 // no expiry during the run
	cfg.Queue.MaxRetries = 1000
	cfg.CheckpointEveryRecords = 1 + rng.IntN(40)
	cfg.SegmentBytes = 4096
	cfg.BodyCacheBytes = []int{-1, 1 << 10, 1 << 20}[rng.IntN(3)]
	cfg.noRetention = seed%2 == 0
	cfg.relocateLiveFraction = []int{0, 1, 2}[rng.IntN(3)]
	model := &crashModel{attempted: map[string]bool{}, confirmed: map[uint64]string{}, acked: map[uint64]bool{}, ackTried: map[uint64]bool{},
		seqBody: map[uint64]string{}, seqOff: map[uint64]uint64{}}
	next := 0
	var w *wal.WAL
	for round := range 3 {
		if withWAL {
			w = openWAL(t, fs, &cfg)
		}
		p, err := Open(cfg)
		if err != nil {
			t.Fatalf("round %d: reopen after crash: %v", round, err)
		}
		verify(t, p, cfg, model)
		c := &tconsumer{owner: fmt.Sprint("c", round), credit: -1}
		p.Attach(c)
		var wg sync.WaitGroup
		steps := 20 + rng.IntN(60)
		crashAt := rng.IntN(steps)
		settled := map[uint64]bool{}
		for step := range steps {
			if step == crashAt {
				break
			}
			switch rng.IntN(6) {
			case 0, 1:
				for range 1 + rng.IntN(5) {
					body := fmt.Sprintf("r%d-m%d-%s", round, next, bytes.Repeat([]byte{'x'}, rng.IntN(300)))
					next++
					model.mu.Lock()
					model.attempted[body] = true
					model.mu.Unlock()
					m := &queue.Message{Body: []byte(body)}
					if rng.IntN(6) == 0 { // delayed past the run: it pins its segment
						m.NotBeforeMs = p.nowMs() + 24*3600*1000
					}
					var seq uint64
					if rng.IntN(2) == 0 { // under a producer sequence
						seq = uint64(next)
						m.ProducerID, m.ProducerSeq = crashProducer, seq
						model.mu.Lock()
						model.seqBody[seq] = body
						model.seqs = append(model.seqs, seq)
						model.mu.Unlock()
					}
					wg.Add(1)
					p.PublishOnce(m, func(off uint64, dup bool, err error) {
						defer wg.Done()
						if err == nil {
							model.mu.Lock()
							model.confirmed[off] = body
							model.mu.Unlock()
							if seq != 0 {
								model.answered(seq, off, dup)
							}
						}
					})
				}
			case 3:
				// Resend earlier sequences, as a producer does after a
				// lost confirm or a restart.
				model.mu.Lock()
				var seqs []uint64
				for range 1 + rng.IntN(4) {
					if len(model.seqs) > 0 {
						seqs = append(seqs, model.seqs[rng.IntN(len(model.seqs))])
					}
				}
				model.mu.Unlock()
				for _, seq := range seqs {
					model.mu.Lock()
					body := model.seqBody[seq]
					model.mu.Unlock()
					wg.Add(1)
					m := &queue.Message{Body: []byte(body), ProducerID: crashProducer, ProducerSeq: seq}
					p.PublishOnce(m, func(off uint64, dup bool, err error) {
						defer wg.Done()
						if err == nil {
							model.mu.Lock()
							model.confirmed[off] = body
							model.mu.Unlock()
							model.answered(seq, off, dup)
						}
					})
				}
			case 2:
				ds := c.deliveries()
				for range 1 + rng.IntN(8) {
					if len(ds) == 0 {
						break
					}
					d := ds[rng.IntN(len(ds))]
					if settled[d.Offset] {
						continue
					}
					settled[d.Offset] = true
					op := Ack
					if rng.IntN(4) == 0 {
						op = Nack
					}
					if op == Ack {
						model.mu.Lock()
						model.ackTried[d.Offset] = true
						model.mu.Unlock()
					}
					wg.Add(1)
					p.Settle(op, d.Offset, d.LeaseID, 0, func(err error) {
						defer wg.Done()
						if err == nil && op == Ack {
							model.mu.Lock()
							model.acked[d.Offset] = true
							model.mu.Unlock()
						}
					})
				}
			default:
				synctest.Wait()
			}
		}
		// Power loss while work may still be in flight.
		relocated += p.Stats().Relocated
		crashed := fs.Crash(rng, true)
		p.Close() // fails: the old machine's disk is gone
		wg.Wait()
		if w != nil {
			w.Close() // fails too
		}
		fs = crashed
		cfg.FS = fs
	}
	if withWAL {
		w = openWAL(t, fs, &cfg)
		defer w.Close()
	}
	p, err := Open(cfg)
	if err != nil {
		t.Fatalf("final reopen: %v", err)
	}
	verify(t, p, cfg, model)
	t.Logf("confirmed %d publishes, %d acks and %d duplicate answers over 3 crashes; checkpoint every %d records; retention %v",
		len(model.confirmed), len(model.acked), model.dups, cfg.CheckpointEveryRecords, !cfg.noRetention)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	return relocated, model.dups
}

func verify(t *testing.T, p *Partition, cfg Config, model *crashModel) {
	t.Helper()
	model.mu.Lock()
	defer model.mu.Unlock()
	for _, e := range model.seqErr {
		t.Error(e)
	}
	model.seqErr = nil
	inspect(p, func() {
		now := p.nowMs()
		// Every confirmed sequence is remembered at the offset it was
		// confirmed at; a store that never became durable may be
		// forgotten, never remembered elsewhere.
		for seq, off := range model.seqOff {
			if v, got := p.dd.Check(crashProducer, seq, now); v != dedup.Duplicate || got != off {
				t.Errorf("confirmed seq %d (offset %d) after recovery: %v at %d", seq, off, v, got)
			}
		}
		for off, body := range model.confirmed {
			in, ok := p.st.Lookup(off, now)
			if !ok {
				t.Errorf("confirmed offset %d is past the log end %d", off, p.st.NextLSN())
				continue
			}
			if model.acked[off] {
				if in.State != queue.StateSettled {
					t.Errorf("acked offset %d came back as %v", off, in.State)
				}
				continue
			}
			if in.State == queue.StateSettled {
				if !model.ackTried[off] {
					t.Errorf("confirmed offset %d that nobody acked is settled", off)
				}
				continue
			}
			m, err := p.message(off)
			if err != nil {
				t.Errorf("offset %d: %v; want body %q", off, err, body)
			} else if string(m.Body) != body {
				t.Errorf("offset %d: body %q, want %q", off, m.Body, body)
			}
		}
		// Nothing unsettled that nobody published, and no sequence
		// stored twice.
		stored := map[uint64]uint64{}
		err := p.log.Scan(p.log.FirstLSN(), func(r seglog.Record) error {
			if k := queue.Kind(r.Type); k != queue.KindEnqueue && k != queue.KindRelocate {
				return nil
			}
			ev, err := queue.DecodeEvent(r.Type, r.Payload)
			if err != nil {
				return err
			}
			if !model.attempted[string(ev.Msg.Body)] {
				return fmt.Errorf("lsn %d holds a body nobody published: %q", r.LSN, ev.Msg.Body)
			}
			if k := queue.Kind(r.Type); k == queue.KindEnqueue && ev.Msg.ProducerID != "" {
				if first, ok := stored[ev.Msg.ProducerSeq]; ok {
					return fmt.Errorf("seq %d stored twice, at lsn %d and %d", ev.Msg.ProducerSeq, first, r.LSN)
				}
				stored[ev.Msg.ProducerSeq] = r.LSN
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
		if !cfg.noRetention || p.log.FirstLSN() != 1 {
			return
		}
		full := queue.New(cfg.Queue)
		fullDD := dedup.New(cfg.Dedup)
		err = p.log.Scan(1, func(r seglog.Record) error {
			if !queue.IsEventType(r.Type) {
				// A raft leader's no-op: a settled gap.
				return full.ApplyGap(r.LSN)
			}
			ev, err := queue.DecodeEvent(r.Type, r.Payload)
			if err != nil {
				return err
			}
			if ev.Kind == queue.KindEnqueue {
				fullDD.Record(ev.Msg.ProducerID, ev.Msg.ProducerSeq, r.LSN, ev.Msg.PublishedAtMs)
			}
			return full.Apply(r.LSN, ev)
		})
		if err != nil {
			t.Errorf("full replay: %v", err)
			return
		}
		if a, b := p.dd.Snapshot(nil), fullDD.Snapshot(nil); !bytes.Equal(a, b) {
			t.Errorf("checkpoint+replay dedup window differs from full replay (ckpt lsn %d): %+v vs %+v",
				p.ckptLSN, p.dd.Stats(), fullDD.Stats())
		}
		if a, b := p.st.Snapshot(nil), full.Snapshot(nil); !bytes.Equal(a, b) {
			t.Errorf("checkpoint+replay state differs from full replay (ckpt lsn %d): %+v vs %+v",
				p.ckptLSN, p.st.Stats(now), full.Stats(now))
		}
	})
}

// gatedFS holds log fdatasyncs at a gate so a test can crash the machine
// while a sync is under way.
type gatedFS struct {
	*vfs.MemFS
	mu   sync.Mutex
	gate chan struct{} // non-nil: the next log Sync signals entered and waits on it
	in   chan struct{}
}

type gatedFile struct {
	vfs.File
	fs *gatedFS
}

func (g *gatedFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	f, err := g.MemFS.OpenFile(name, flag, perm)
	if err != nil || !strings.Contains(name, logDir) {
		return f, err
	}
	return &gatedFile{File: f, fs: g}, nil
}

// hold makes the next log Sync block until the returned release is called;
// entered is closed when that Sync has started.
func (g *gatedFS) hold() (entered <-chan struct{}, release func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	gate, in := make(chan struct{}), make(chan struct{})
	g.gate, g.in = gate, in
	return in, func() { close(gate) }
}

func (f *gatedFile) Sync() error {
	f.fs.mu.Lock()
	gate, in := f.fs.gate, f.fs.in
	f.fs.gate, f.fs.in = nil, nil
	f.fs.mu.Unlock()
	if gate != nil {
		close(in)
		<-gate
	}
	return f.File.Sync()
}

// TestCrashWhilePipelinedSync crashes the machine while batch N+1 is
// appended and applied but its sync has not completed (batch N's sync
// completed just before): N is confirmed and survives; nothing of N+1 was
// confirmed before the crash, and it is refused afterwards.
func TestCrashWhilePipelinedSync(t *testing.T) {
	mem := vfs.NewMem()
	gfs := &gatedFS{MemFS: mem}
	cfg := testConfig(mem)
	cfg.FS = gfs
	p := mustOpen(t, cfg)
	c := &tconsumer{owner: "c", credit: -1}
	p.Attach(c)

	entered1, release1 := gfs.hold()
	a := publish(p, "batch N", nil)
	<-entered1 // N's fdatasync is under way
	b := publish(p, "batch N+1", nil)
	// Two inspections: the second runs in a turn after the one that took
	// N+1 from the inbox, so N+1 is appended and applied by then.
	inspect(p, func() {})
	var next uint64
	inspect(p, func() { next = p.log.NextLSN() })
	if next < 3 {
		t.Fatalf("batch N+1 not appended while N syncs: next lsn %d", next)
	}
	select {
	case r := <-a:
		t.Fatalf("batch N confirmed before its sync returned: %+v", r)
	case r := <-b:
		t.Fatalf("batch N+1 confirmed before any sync returned: %+v", r)
	default:
	}
	if n := len(c.deliveries()); n != 0 {
		t.Fatalf("%d deliveries before their records were durable", n)
	}

	entered2, release2 := gfs.hold()
	release1()
	ra := <-a // N's sync returned: N is confirmed
	if ra.err != nil {
		t.Fatalf("batch N: %v", ra.err)
	}
	<-entered2 // the sync of N+1 (and of the lease records) is under way
	select {
	case r := <-b:
		t.Fatalf("batch N+1 confirmed before its sync returned: %+v", r)
	default:
	}
	crashed := mem.Crash(rand.New(rand.NewPCG(1, 2)), true)
	release2()
	if rb := <-b; rb.err == nil {
		t.Fatalf("batch N+1 confirmed after the machine crashed: %+v", rb)
	}
	p.Close()

	cfg.FS = crashed
	p = mustOpen(t, cfg)
	defer p.Close()
	inspect(p, func() {
		m, err := p.message(ra.off)
		if err != nil || string(m.Body) != "batch N" {
			t.Errorf("confirmed batch N after the crash: %v, %v", m, err)
		}
	})
}
