package broker

import (
	"context"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// creditRec is a Consumer that checks, at every delivery and every lease
// end, that the subscription's credit and outstanding set stay within its
// prefetch, and remembers which leases the broker says ended.
type creditRec struct {
	t        *testing.T
	prefetch int
	mu       sync.Mutex
	got      []Delivery
	ended    map[leaseKey]bool
	s        *Subscription
}

func (r *creditRec) check(s *Subscription, where string) {
	s.mu.Lock()
	n := len(s.outstanding)
	s.mu.Unlock()
	if c := s.credit.Load(); n > r.prefetch || c < 0 || c > int64(r.prefetch) {
		r.t.Errorf("%s: %d outstanding, credit %d, prefetch %d", where, n, c, r.prefetch)
	}
}

func (r *creditRec) Deliver(s *Subscription, d Delivery) {
	r.check(s, "deliver")
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, d)
}

func (r *creditRec) LeaseEnded(s *Subscription, partition uint32, offset, leaseID uint64) {
	r.check(s, "lease ended")
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended[leaseKey{partition, offset, leaseID}] = true
}

func (r *creditRec) Closed(s *Subscription, reason uint8, err error) {}

func (r *creditRec) deliveries() []Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

func settleWait(s *Subscription, op protocol.Op, d Delivery) protocol.Code {
	ch := make(chan protocol.Code, 1)
	s.Settle(op, d.Partition, d.Offset, d.LeaseID, 0, func(c protocol.Code) { ch <- c })
	return <-ch
}

// A consumer with prefetch 1 that never settles its delivery (its frame
// was lost, say) gets the message again when the lease expires, and the
// late settle of the first lease is stale and returns no credit.
func TestExpiredLeaseReturnsCredit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		r := &creditRec{t: t, prefetch: 1, ended: map[leaseKey]bool{}}
		s, err := b.Subscribe(&protocol.Subscribe{Topic: "q", Partition: -1, Prefetch: 1}, r)
		if err != nil {
			t.Fatal(err)
		}
		off := mustPublish(t, b, msg("q", "a")).Offset
		mustPublish(t, b, msg("q", "b"))
		synctest.Wait()
		if got := r.deliveries(); len(got) != 1 || got[0].Offset != off || got[0].Attempt != 1 {
			t.Fatalf("first delivery: %+v", got)
		}
		time.Sleep(10 * time.Second) // the default lease in testConfig
		synctest.Wait()
		got := r.deliveries()
		if len(got) != 2 || got[1].Offset != off || got[1].Attempt != 2 {
			t.Fatalf("after expiry: %+v, want the same message again, attempt 2", got)
		}
		if !r.ended[leaseKey{got[0].Partition, off, got[0].LeaseID}] {
			t.Fatalf("the consumer was not told the first lease ended")
		}
		if code := settleWait(s, protocol.OpAck, got[0]); code != protocol.CodeStaleLease {
			t.Fatalf("late ack of the expired lease: %v, want stale_lease", code)
		}
		synctest.Wait()
		if c := s.credit.Load(); c != 0 {
			t.Fatalf("credit %d after a stale ack, want 0 (one delivery outstanding)", c)
		}
		if n := len(r.deliveries()); n != 2 {
			t.Fatalf("a stale ack brought a delivery: %d deliveries", n)
		}
		if code := settleWait(s, protocol.OpAck, got[1]); code != protocol.CodeOK {
			t.Fatalf("ack of the current lease: %v", code)
		}
		synctest.Wait()
		if got := r.deliveries(); len(got) != 3 || string(got[2].Body) != "b" || got[2].Attempt != 1 {
			t.Fatalf("after the ack: %+v, want b", got)
		}
	})
}

// A randomized run of acks, nacks, forgotten deliveries, late acks and
// expiring leases on a two-partition queue: credit and outstanding stay
// within the prefetch at every delivery and lease end, add up to it
// whenever the broker is idle, credit left over means nothing is ready (no
// starvation), and every message ends acked.
func TestCreditRandomized(t *testing.T) {
	for seed := range uint64(4) {
		t.Run("seed="+strconv.FormatUint(seed, 10), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { creditRun(t, seed) })
		})
	}
}

func creditRun(t *testing.T, seed uint64) {
	const (
		prefetch = 3
		messages = 60
		leaseMs  = 1000
		stepsMax = 3000
	)
	rng := rand.New(rand.NewPCG(seed, 0x5157))
	b := mustOpen(t, testConfig(vfs.NewMem()))
	defer b.Close()
	ctx := context.Background()
	if _, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: "r", Partitions: 2, MaxRetries: 1000, LeaseMs: leaseMs}); err != nil {
		t.Fatal(err)
	}
	r := &creditRec{t: t, prefetch: prefetch, ended: map[leaseKey]bool{}}
	s, err := b.Subscribe(&protocol.Subscribe{Topic: "r", Partition: -1, Prefetch: prefetch}, r)
	if err != nil {
		t.Fatal(err)
	}
	for i := range messages {
		mustPublish(t, b, msg("r", strconv.Itoa(i)))
	}
	acked := map[[2]uint64]bool{} // (partition, offset)
	seen := 0                     // deliveries already looked at
	var held []Delivery           // delivered, not settled by the test
	stale := 0
	for step := 0; len(acked) < messages; step++ {
		if step >= stepsMax {
			t.Fatalf("stuck: %d of %d acked after %d steps", len(acked), messages, step)
		}
		synctest.Wait()
		r.check(s, "quiescent")
		// Quiescent: no credit is reserved, so credit and outstanding
		// add up to the prefetch, and credit left over means the
		// partitions have nothing ready for it.
		s.mu.Lock()
		out := len(s.outstanding)
		s.mu.Unlock()
		credit := s.credit.Load()
		if int(credit)+out != prefetch {
			t.Fatalf("step %d: credit %d + outstanding %d != prefetch %d", step, credit, out, prefetch)
		}
		if credit > 0 {
			for _, ps := range queueStats(t, b, "r") {
				if ps.Ready > 0 {
					t.Fatalf("step %d: credit %d but %d ready: consumer starved", step, credit, ps.Ready)
				}
			}
		}
		ds := r.deliveries()
		held = append(held, ds[seen:]...)
		seen = len(ds)
		if len(held) == 0 {
			time.Sleep(leaseMs * time.Millisecond)
			continue
		}
		i := rng.IntN(len(held))
		d := held[i]
		switch k := rng.IntN(20); {
		case k < 12: // ack
			code := settleWait(s, protocol.OpAck, d)
			switch {
			case code == protocol.CodeOK:
				acked[[2]uint64{uint64(d.Partition), d.Offset}] = true
			case code == protocol.CodeStaleLease:
				stale++
			default:
				t.Fatalf("ack: %v", code)
			}
			held = slices.Delete(held, i, i+1)
		case k < 14: // nack: redelivered at once
			if code := settleWait(s, protocol.OpNack, d); code != protocol.CodeOK && code != protocol.CodeStaleLease {
				t.Fatalf("nack: %v", code)
			}
			held = slices.Delete(held, i, i+1)
		case k < 17: // let time pass; some leases expire in the consumer's hands
			time.Sleep(time.Duration(rng.IntN(3*leaseMs/2)) * time.Millisecond)
		default: // forget the delivery: it is only ever settled late, if at all
			held = slices.Delete(held, i, i+1)
			if rng.IntN(2) == 0 {
				time.Sleep(leaseMs * time.Millisecond)
				synctest.Wait()
				if code := settleWait(s, protocol.OpAck, d); code != protocol.CodeStaleLease && code != protocol.CodeOK {
					t.Fatalf("late ack: %v", code)
				} else if code == protocol.CodeOK {
					acked[[2]uint64{uint64(d.Partition), d.Offset}] = true
				}
			}
		}
	}
	synctest.Wait()
	for _, ps := range queueStats(t, b, "r") {
		if ps.Ready+ps.Inflight+ps.Delayed != 0 {
			t.Fatalf("left over after every message was acked: %+v", ps)
		}
	}
	if stale == 0 {
		t.Logf("seed %d: no stale ack happened", seed)
	}
}

func queueStats(t *testing.T, b *Broker, topic string) []PartitionStats {
	t.Helper()
	for _, q := range b.Stats().Queues {
		if q.Topic == topic {
			return q.Partitions
		}
	}
	t.Fatalf("no queue %q in stats", topic)
	return nil
}

// syncCountFS counts File.Sync calls (the partitions' fsyncs).
type syncCountFS struct {
	vfs.FS
	syncs atomic.Int64
}

func (f *syncCountFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &syncCountFile{File: file, n: &f.syncs}, nil
}

type syncCountFile struct {
	vfs.File
	n *atomic.Int64
}

func (f *syncCountFile) Sync() error { f.n.Add(1); return f.File.Sync() }

// observer is a consumer that acks every delivery as it arrives and
// counts what it holds as it sees it: a delivery counts from Deliver until
// its ack is answered (or the broker says its lease ended).
type observer struct {
	t        *testing.T
	prefetch int
	mu       sync.Mutex
	held     map[leaseKey]bool
	maxHeld  int
	acked    int
}

func (o *observer) Deliver(s *Subscription, d Delivery) {
	k := leaseKey{d.Partition, d.Offset, d.LeaseID}
	o.mu.Lock()
	o.held[k] = true
	if len(o.held) > o.maxHeld {
		o.maxHeld = len(o.held)
	}
	if len(o.held) > o.prefetch {
		o.t.Errorf("delivery of offset %d: the consumer holds %d, prefetch %d", d.Offset, len(o.held), o.prefetch)
	}
	o.mu.Unlock()
	s.Settle(protocol.OpAck, d.Partition, d.Offset, d.LeaseID, 0, func(c protocol.Code) {
		if c != protocol.CodeOK {
			o.t.Errorf("ack of offset %d: %v", d.Offset, c)
		}
		o.mu.Lock()
		delete(o.held, k)
		o.acked++
		o.mu.Unlock()
	})
}

func (o *observer) LeaseEnded(s *Subscription, partition uint32, offset, leaseID uint64) {
	o.mu.Lock()
	delete(o.held, leaseKey{partition, offset, leaseID})
	o.mu.Unlock()
}

func (o *observer) Closed(s *Subscription, reason uint8, err error) {}

// An ack's freed credit leases the consumer's next message in the same
// sync (partition.CreditCarrier), and the consumer still never holds more
// than its prefetch as it observes deliveries and ack answers: the ack is
// answered before the delivery its credit paid for. Draining a backlog
// then costs one sync per prefetch-sized round, not two.
func TestSettleCarriesCreditWithinPrefetch(t *testing.T) {
	for _, parts := range []uint32{1, 3} {
		t.Run("partitions="+strconv.Itoa(int(parts)), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const (
					prefetch = 2
					messages = 40
				)
				fs := &syncCountFS{FS: vfs.NewMem()}
				b := mustOpen(t, testConfig(fs))
				defer b.Close()
				if _, err := b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "c", Partitions: parts}); err != nil {
					t.Fatal(err)
				}
				for i := range messages {
					mustPublish(t, b, msg("c", strconv.Itoa(i)))
				}
				synctest.Wait()
				before := fs.syncs.Load()
				o := &observer{t: t, prefetch: prefetch, held: map[leaseKey]bool{}}
				s, err := b.Subscribe(&protocol.Subscribe{Topic: "c", Partition: -1, Prefetch: prefetch}, o)
				if err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				o.mu.Lock()
				acked, held, maxHeld := o.acked, len(o.held), o.maxHeld
				o.mu.Unlock()
				if acked != messages || held != 0 {
					t.Fatalf("acked %d of %d, %d still held", acked, messages, held)
				}
				if maxHeld != prefetch {
					t.Errorf("the consumer held at most %d, want the prefetch %d", maxHeld, prefetch)
				}
				if c := s.credit.Load(); c != prefetch {
					t.Errorf("credit %d after the drain, want %d", c, prefetch)
				}
				syncs := fs.syncs.Load() - before
				// Carried credit: every sync after the first lease holds
				// the acks of one round and the leases of the next.
				if parts == 1 && syncs > messages/prefetch+2 {
					t.Errorf("drain of %d messages at prefetch %d took %d syncs, want at most %d", messages, prefetch, syncs, messages/prefetch+2)
				}
				t.Logf("%d syncs", syncs)
			})
		})
	}
}

// pausingRec is a creditRec that can be paused (PausableConsumer).
type pausingRec struct {
	creditRec
	paused atomic.Bool
}

func (r *pausingRec) RoomBytes() int64 {
	if r.paused.Load() {
		return 0
	}
	return 1 << 30
}

// A paused consumer is leased nothing, however much credit it has; Wake
// after it unpauses brings the backlog.
func TestPausedConsumerGetsNothingUntilWake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		r := &pausingRec{creditRec: creditRec{t: t, prefetch: 10, ended: map[leaseKey]bool{}}}
		r.paused.Store(true)
		s, err := b.Subscribe(&protocol.Subscribe{Topic: "q", Partition: -1, Prefetch: 10}, r)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			mustPublish(t, b, msg("q", strconv.Itoa(i)))
		}
		synctest.Wait()
		if n := len(r.deliveries()); n != 0 {
			t.Fatalf("%d deliveries while paused", n)
		}
		r.paused.Store(false)
		s.Wake()
		synctest.Wait()
		if n := len(r.deliveries()); n != 5 {
			t.Fatalf("%d deliveries after Wake, want 5", n)
		}
		// Paused again mid-stream: what is published meanwhile waits.
		r.paused.Store(true)
		for i := range 3 {
			mustPublish(t, b, msg("q", "more"+strconv.Itoa(i)))
		}
		synctest.Wait()
		if n := len(r.deliveries()); n != 5 {
			t.Fatalf("%d deliveries, want still 5 while paused", n)
		}
		r.paused.Store(false)
		s.Wake()
		synctest.Wait()
		if n := len(r.deliveries()); n != 8 {
			t.Fatalf("%d deliveries after the second Wake, want 8", n)
		}
	})
}

// roomRec is a consumer whose room is a byte budget that its deliveries use
// up, as a connection's write queue is used up by DELIVER frames.
type roomRec struct {
	creditRec
	capBytes int64
	used     atomic.Int64
}

func (r *roomRec) RoomBytes() int64 { return r.capBytes - r.used.Load() }

func (r *roomRec) Deliver(s *Subscription, d Delivery) {
	r.used.Add(int64(len(d.Body)) + deliveryOverheadBytes + int64(len(s.view.Topic)))
	r.creditRec.Deliver(s, d)
}

// A consumer with a large prefetch and a backlog gets only what fits its
// byte room, not a whole dispatch turn, and the rest once it has room again.
func TestRoomBoundsLeasesInTransit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		body := strings.Repeat("x", 1<<10)
		for range 500 {
			mustPublish(t, b, msg("q", body))
		}
		const capBytes = 16 << 10
		r := &roomRec{creditRec: creditRec{t: t, prefetch: 1000, ended: map[leaseKey]bool{}}, capBytes: capBytes}
		s, err := b.Subscribe(&protocol.Subscribe{Topic: "q", Partition: -1, Prefetch: 1000}, r)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		per := int64(1<<10 + deliveryOverheadBytes + 1)
		got := len(r.deliveries())
		// The room, plus the one let through on a partial fit.
		if most := int(capBytes/per) + 1; got == 0 || got > most {
			t.Fatalf("%d deliveries into a %d-byte room; want 1..%d", got, capBytes, most)
		}
		r.used.Store(0)
		s.Wake()
		synctest.Wait()
		if n := len(r.deliveries()); n <= got || n > 2*got+1 {
			t.Fatalf("%d deliveries after freeing the room once, had %d", n, got)
		}
		for len(r.deliveries()) < 500 {
			before := len(r.deliveries())
			r.used.Store(0)
			s.Wake()
			synctest.Wait()
			if len(r.deliveries()) == before {
				t.Fatalf("stuck at %d deliveries with room", before)
			}
		}
	})
}

// pausingObserver acks every delivery (Subscription.Settle, which carries
// the freed credit) and pauses itself, as a session does when its broker
// starts draining, just before it acks delivery number pauseAt.
type pausingObserver struct {
	observer
	pauseAt   int
	delivered atomic.Int64
	paused    atomic.Bool
}

func (o *pausingObserver) RoomBytes() int64 {
	if o.paused.Load() {
		return 0
	}
	return 1 << 30
}

func (o *pausingObserver) Deliver(s *Subscription, d Delivery) {
	if o.delivered.Add(1) == int64(o.pauseAt) {
		o.paused.Store(true)
	}
	o.observer.Deliver(s, d)
}

// A consumer that pauses (its broker drains) while it settles steadily is
// leased nothing new: the credit its settles free is not carried past the
// room check, so the drain finds it idle once it has settled what it held.
func TestPausedConsumerCarriesNoCredit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const prefetch, messages, pauseAt = 4, 40, 10
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		for i := range messages {
			mustPublish(t, b, msg("d", strconv.Itoa(i)))
		}
		synctest.Wait()
		o := &pausingObserver{observer: observer{t: t, prefetch: prefetch, held: map[leaseKey]bool{}}, pauseAt: pauseAt}
		s, err := b.Subscribe(&protocol.Subscribe{Topic: "d", Partition: -1, Prefetch: prefetch}, o)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		// Leases decided before the pause may still arrive (at most a
		// prefetch more); nothing after them, however long it stays paused.
		time.Sleep(time.Minute)
		synctest.Wait()
		o.mu.Lock()
		acked, held := o.acked, len(o.held)
		o.mu.Unlock()
		if held != 0 {
			t.Fatalf("%d deliveries still held after their acks were answered", held)
		}
		if acked < pauseAt || acked > pauseAt+prefetch {
			t.Fatalf("%d delivered while pausing at delivery %d with prefetch %d, want %d..%d",
				acked, pauseAt, prefetch, pauseAt, pauseAt+prefetch)
		}
		o.paused.Store(false)
		s.Wake()
		synctest.Wait()
		o.mu.Lock()
		acked = o.acked
		o.mu.Unlock()
		if acked != messages {
			t.Fatalf("acked %d of %d after the pause ended", acked, messages)
		}
	})
}
