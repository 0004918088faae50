package partition

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tconsumer records deliveries. credit < 0 means unlimited.
type tconsumer struct {
	owner string
	mu    sync.Mutex
	// credit is the prefetch left; settles in tests give it back by hand.
	credit   int
	got      []Delivery
	ended    [][2]uint64 // (offset, lease id) from LeaseEnded
	detached error
	hold     chan struct{} // when set, Deliver waits on it (to stall the actor)
}

func (c *tconsumer) Owner() string { return c.owner }
func (c *tconsumer) TakeCredit(max int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.credit < 0 {
		return max
	}
	n := min(max, c.credit)
	c.credit -= n
	return n
}
func (c *tconsumer) RefundCredit(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.credit >= 0 {
		c.credit += n
	}
}
func (c *tconsumer) Deliver(d Delivery) {
	if c.hold != nil {
		<-c.hold
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, d)
}
func (c *tconsumer) LeaseEnded(offset, leaseID uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ended = append(c.ended, [2]uint64{offset, leaseID})
}
func (c *tconsumer) Detached(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.detached = err
}
func (c *tconsumer) deliveries() []Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.got)
}
func (c *tconsumer) addCredit(n int) {
	c.mu.Lock()
	c.credit += n
	c.mu.Unlock()
}

// testConfig returns a configuration for partition 0 in data/p0. The
// broker makes its data directory durable before it opens partitions; so
// does this.
func testConfig(fs vfs.FS) Config {
	if err := fs.MkdirAll("data", 0o755); err != nil {
		panic(err)
	}
	if err := fs.SyncDir("."); err != nil {
		panic(err)
	}
	return Config{Topic: "t", Group: "g", Dir: "data/p0", FS: fs,
		Queue: queue.Config{LeaseMs: 10_000, MaxRetries: 2}}
}

func mustOpen(t testing.TB, cfg Config) *Partition {
	t.Helper()
	p, err := Open(cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return p
}

// publish publishes body and returns a channel that yields the outcome.
type pubResult struct {
	off uint64
	err error
}

func publish(p *Partition, body string, mod func(*queue.Message)) chan pubResult {
	ch := make(chan pubResult, 1)
	m := &queue.Message{Body: []byte(body), Headers: []queue.Header{{Key: "h", Value: body}}}
	if mod != nil {
		mod(m)
	}
	p.Publish(m, func(off uint64, err error) { ch <- pubResult{off, err} })
	return ch
}

func mustPublish(t testing.TB, p *Partition, body string, mod func(*queue.Message)) uint64 {
	t.Helper()
	r := <-publish(p, body, mod)
	if r.err != nil {
		t.Fatalf("publish %q: %v", body, r.err)
	}
	return r.off
}

func settle(p *Partition, op SettleOp, d Delivery, notBeforeMs int64) error {
	ch := make(chan error, 1)
	p.Settle(op, d.Offset, d.LeaseID, notBeforeMs, func(err error) { ch <- err })
	return <-ch
}

func bodies(ds []Delivery) []string {
	var out []string
	for _, d := range ds {
		out = append(out, string(d.Body))
	}
	return out
}

func TestPublishLeaseAck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := mustOpen(t, testConfig(vfs.NewMem()))
		defer p.Close()
		offs := []uint64{mustPublish(t, p, "a", nil), mustPublish(t, p, "b", nil), mustPublish(t, p, "c", nil)}
		if !slices.IsSorted(offs) || offs[0] == 0 {
			t.Fatalf("offsets %v: want increasing, nonzero", offs)
		}
		c := &tconsumer{owner: "c1", credit: 2}
		if err := p.Attach(c); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		got := c.deliveries()
		if want := []string{"a", "b"}; !slices.Equal(bodies(got), want) {
			t.Fatalf("delivered %v, want %v (prefetch 2)", bodies(got), want)
		}
		if got[0].Attempt != 1 || got[0].Offset != offs[0] || got[0].Headers[0].Value != "a" {
			t.Fatalf("delivery %+v", got[0])
		}
		if err := settle(p, Ack, got[0], 0); err != nil {
			t.Fatalf("ack: %v", err)
		}
		// The same ACK again is ok (the partition remembers the lease that
		// ACKed the offset); an ACK of another lease of it, or a FAIL, is not.
		if err := settle(p, Ack, got[0], 0); err != nil {
			t.Fatalf("second ack of the same lease: %v, want ok", err)
		}
		if err := settle(p, Ack, Delivery{Offset: got[0].Offset, LeaseID: got[0].LeaseID + 1}, 0); !errors.Is(err, queue.ErrAlreadySettled) {
			t.Fatalf("ack of another lease: %v, want ErrAlreadySettled", err)
		}
		if err := settle(p, Fail, got[0], 0); !errors.Is(err, queue.ErrAlreadySettled) {
			t.Fatalf("fail after the ack: %v, want ErrAlreadySettled", err)
		}
		if err := settle(p, Ack, Delivery{Offset: got[1].Offset, LeaseID: got[1].LeaseID + 100}, 0); !errors.Is(err, queue.ErrStaleLease) {
			t.Fatalf("ack with wrong lease: %v, want ErrStaleLease", err)
		}
		c.addCredit(1)
		p.Poke()
		synctest.Wait()
		if got := bodies(c.deliveries()); !slices.Equal(got, []string{"a", "b", "c"}) {
			t.Fatalf("after credit: %v", got)
		}
		st := p.Stats()
		if st.Inflight != 2 || st.Ready != 0 || st.Consumers != 1 {
			t.Fatalf("stats %+v", st)
		}
	})
}

func TestNackDelayAndLeaseExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := mustOpen(t, testConfig(vfs.NewMem()))
		defer p.Close()
		c := &tconsumer{owner: "c1", credit: -1}
		p.Attach(c)
		mustPublish(t, p, "a", nil)
		synctest.Wait()
		d := c.deliveries()[0]
		if err := settle(p, Nack, d, time.Now().Add(5*time.Second).UnixMilli()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(4 * time.Second) // fake time: the delay has not passed
		synctest.Wait()
		if n := len(c.deliveries()); n != 1 {
			t.Fatalf("redelivered before the delay: %d deliveries", n)
		}
		time.Sleep(1 * time.Second)
		synctest.Wait()
		ds := c.deliveries()
		if len(ds) != 2 || ds[1].Attempt != 2 || ds[1].Offset != d.Offset {
			t.Fatalf("after delay: %+v", ds)
		}
		// Not settled: the 10 s lease expires and the message comes back.
		time.Sleep(10*time.Second + time.Millisecond)
		synctest.Wait()
		ds = c.deliveries()
		if len(ds) != 3 || ds[2].Attempt != 3 {
			t.Fatalf("after lease expiry: %+v", ds)
		}
		if err := settle(p, Ack, ds[1], 0); !errors.Is(err, queue.ErrStaleLease) {
			t.Fatalf("ack of expired lease: %v, want stale", err)
		}
	})
}

type dlCall struct {
	target string
	msg    *queue.Message
}

type dlRecorder struct {
	mu    sync.Mutex
	calls []dlCall
	fail  int // fail this many calls first
}

func (r *dlRecorder) publish(target string, m *queue.Message, done func(error)) {
	r.mu.Lock()
	fail := r.fail > 0
	if fail {
		r.fail--
	} else {
		r.calls = append(r.calls, dlCall{target, m})
	}
	r.mu.Unlock()
	if fail {
		done(errors.New("target unavailable"))
		return
	}
	done(nil)
}

func (r *dlRecorder) get() []dlCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

func header(m *queue.Message, k string) string {
	for _, h := range m.Headers {
		if h.Key == k {
			return h.Value
		}
	}
	return ""
}

func TestDeadLetterRetriesExhaustedAndFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &dlRecorder{fail: 1}
		cfg := testConfig(vfs.NewMem())
		cfg.Queue.DeadLetter.Target = "dlq"
		cfg.DeadLetter = rec.publish
		p := mustOpen(t, cfg)
		defer p.Close()
		c := &tconsumer{owner: "c1", credit: -1}
		p.Attach(c)
		off := mustPublish(t, p, "poison", nil)
		for i := range 3 { // MaxRetries 2: the third nack dead-letters
			synctest.Wait()
			ds := c.deliveries()
			if len(ds) != i+1 {
				t.Fatalf("round %d: %d deliveries", i, len(ds))
			}
			if err := settle(p, Nack, ds[i], 0); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		// The first copy failed; it is retried after deadLetterRetryMs.
		if n := len(rec.get()); n != 0 {
			t.Fatalf("%d copies before retry", n)
		}
		if st := p.Stats(); st.DeadLettering != 1 {
			t.Fatalf("stats %+v: want 1 dead-lettering", st)
		}
		time.Sleep(deadLetterRetryMs * time.Millisecond)
		synctest.Wait()
		calls := rec.get()
		if len(calls) != 1 {
			t.Fatalf("%d copies, want 1", len(calls))
		}
		m := calls[0].msg
		want := map[string]string{
			HeaderSourceTopic: "t", HeaderSourceGroup: "g", HeaderSourcePartition: "0",
			HeaderSourceOffset: fmt.Sprint(off), HeaderRetries: "3", HeaderReason: "retries_exhausted", "h": "poison",
		}
		for k, v := range want {
			if got := header(m, k); got != v {
				t.Errorf("header %s = %q, want %q", k, got, v)
			}
		}
		if calls[0].target != "dlq" || string(m.Body) != "poison" || header(m, HeaderDeadLetteredAt) == "" {
			t.Fatalf("copy %+v", calls[0])
		}
		if st := p.Stats(); st.DeadLettering != 0 || st.Frontier != st.NextLSN {
			t.Fatalf("stats after copy %+v: want everything settled", st)
		}

		mustPublish(t, p, "bad", nil)
		synctest.Wait()
		ds := c.deliveries()
		if err := settle(p, Fail, ds[len(ds)-1], 0); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		calls = rec.get()
		if len(calls) != 2 || header(calls[1].msg, HeaderReason) != "failed" || header(calls[1].msg, HeaderRetries) != "1" {
			t.Fatalf("fail copy: %+v", calls)
		}
	})
}

func TestTTLExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &dlRecorder{}
		cfg := testConfig(vfs.NewMem())
		cfg.Queue.DeadLetter.Target = "dlq"
		cfg.Queue.DefaultTTLMs = 3000
		cfg.DeadLetter = rec.publish
		p := mustOpen(t, cfg)
		defer p.Close()
		mustPublish(t, p, "old", nil)
		mustPublish(t, p, "explicit", func(m *queue.Message) { m.ExpiresAtMs = time.Now().Add(time.Hour).UnixMilli() })
		time.Sleep(3 * time.Second)
		synctest.Wait()
		calls := rec.get()
		if len(calls) != 1 || string(calls[0].msg.Body) != "old" || header(calls[0].msg, HeaderReason) != "expired" {
			t.Fatalf("copies %+v", calls)
		}
		c := &tconsumer{owner: "c", credit: -1}
		p.Attach(c)
		synctest.Wait()
		if got := bodies(c.deliveries()); !slices.Equal(got, []string{"explicit"}) {
			t.Fatalf("delivered %v", got)
		}
	})
}

func TestDetachReleasesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := mustOpen(t, testConfig(vfs.NewMem()))
		defer p.Close()
		a := &tconsumer{owner: "a", credit: -1}
		p.Attach(a)
		mustPublish(t, p, "x", nil)
		mustPublish(t, p, "y", nil)
		synctest.Wait()
		if len(a.deliveries()) != 2 {
			t.Fatal("a got nothing")
		}
		b := &tconsumer{owner: "b", credit: -1}
		p.Attach(b)
		p.Detach(a)
		synctest.Wait() // no clock movement: the release is immediate
		if got := bodies(b.deliveries()); !slices.Equal(got, []string{"x", "y"}) {
			t.Fatalf("b got %v after a detached", got)
		}
		if ds := b.deliveries(); ds[0].Attempt != 2 {
			t.Fatalf("attempt %d, want 2", ds[0].Attempt)
		}
	})
}

func TestFairDispatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := mustOpen(t, testConfig(vfs.NewMem()))
		defer p.Close()
		for i := range 100 {
			publish(p, fmt.Sprint(i), nil)
		}
		synctest.Wait()
		cs := []*tconsumer{{owner: "a", credit: 30}, {owner: "b", credit: 30}, {owner: "c", credit: 30}}
		for _, c := range cs {
			p.Attach(c)
		}
		synctest.Wait()
		for _, c := range cs {
			if n := len(c.deliveries()); n != 30 {
				t.Errorf("%s got %d, want 30 (its full prefetch)", c.owner, n)
			}
		}
		for _, c := range cs {
			c.addCredit(100)
		}
		p.Poke()
		synctest.Wait()
		total := 0
		for _, c := range cs {
			n := len(c.deliveries())
			total += n
			if n < 30 || n > 40 {
				t.Errorf("%s got %d of the rest unfairly", c.owner, n)
			}
		}
		if total != 100 {
			t.Fatalf("delivered %d, want 100", total)
		}
	})
}

func TestInboxFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(vfs.NewMem())
		cfg.InboxMax = 2
		p := mustOpen(t, cfg)
		defer p.Close()
		hold := make(chan struct{})
		c := &tconsumer{owner: "c", credit: -1, hold: hold}
		p.Attach(c)
		first := publish(p, "stall", nil)
		synctest.Wait() // the actor is stuck in Deliver
		r1, r2 := publish(p, "1", nil), publish(p, "2", nil)
		r3 := publish(p, "3", nil)
		if r := <-r3; !errors.Is(r.err, ErrInboxFull) || protocol.CodeOf(r.err) != protocol.CodeResourceExhausted {
			t.Fatalf("third publish into a full inbox: %v", r.err)
		}
		close(hold)
		for _, ch := range []chan pubResult{first, r1, r2} {
			if r := <-ch; r.err != nil {
				t.Fatal(r.err)
			}
		}
	})
}

func TestReopenRecoversState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		cfg := testConfig(fs)
		cfg.CheckpointEveryRecords = 3
		cfg.SegmentBytes = 4096
		p := mustOpen(t, cfg)
		c := &tconsumer{owner: "c", credit: -1}
		p.Attach(c)
		for i := range 40 {
			mustPublish(t, p, fmt.Sprintf("m%02d-%s", i, bytes.Repeat([]byte("x"), 200)), nil)
		}
		synctest.Wait()
		ds := c.deliveries()
		for _, d := range ds[:30] {
			if err := settle(p, Ack, d, 0); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		names, _ := fs.ReadDir("data/p0/log")
		if len(names) < 2 {
			t.Logf("segments after retention: %v", names)
		}
		if names[0] == seglog.SegmentName(1) {
			t.Errorf("retention kept the first segment: %v", names)
		}
		p = mustOpen(t, cfg)
		defer p.Close()
		st := p.Stats()
		if st.Inflight+st.Ready != 10 {
			t.Fatalf("after reopen: %+v", st)
		}
		// The surviving leases belonged to "c", gone with the old process:
		// they are released at once (no grace) and a new consumer gets them.
		c2 := &tconsumer{owner: "c2", credit: -1}
		p.Attach(c2)
		synctest.Wait()
		got := c2.deliveries()
		if len(got) != 10 || string(got[0].Body[:3]) != "m30" || got[0].Attempt != 2 {
			t.Fatalf("redelivered %d, first %+v", len(got), got[0])
		}
	})
}

func TestFlippedBitQuarantines(t *testing.T) {
	fs := vfs.NewMem()
	cfg := testConfig(fs)
	cfg.Now = func() time.Time { return time.UnixMilli(1_700_000_000_000) }
	p := mustOpen(t, cfg)
	for i := range 5 {
		mustPublish(t, p, fmt.Sprint("message ", i), nil)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// Remove the checkpoint so recovery must read the whole log.
	if err := fs.Remove(filepath.Join(cfg.Dir, checkpointFile)); err != nil {
		t.Fatal(err)
	}
	if err := fs.FlipBit(filepath.Join(cfg.Dir, logDir, seglog.SegmentName(1)), 20, 3); err != nil {
		t.Fatal(err)
	}
	_, err := Open(cfg)
	var ce *seglog.CorruptionError
	if !errors.Is(err, ErrDamaged) || !errors.As(err, &ce) {
		t.Fatalf("open of a damaged log: %v; want ErrDamaged and *seglog.CorruptionError", err)
	}
	if ce.Segment == "" {
		t.Fatalf("corruption error names no segment: %+v", ce)
	}
	parked := Parked(cfg, err)
	r := <-publish(parked, "x", nil)
	if protocol.CodeOf(r.err) != protocol.CodeUnavailable {
		t.Fatalf("publish to parked partition: %v", r.err)
	}
	if err := parked.Attach(&tconsumer{}); protocol.CodeOf(err) != protocol.CodeUnavailable {
		t.Fatalf("attach to parked partition: %v", err)
	}
	if !parked.Stats().Quarantined {
		t.Fatal("stats do not say quarantined")
	}
	parked.Close()

	// Truncate policy: opens, keeping nothing from the bad record on.
	cfg.Corruption = seglog.CorruptionTruncate
	p, err = Open(cfg)
	if err != nil {
		t.Fatalf("open with truncate: %v", err)
	}
	if st := p.Stats(); st.Ready != 0 {
		t.Fatalf("after truncating at the first record: %+v", st)
	}
	p.Close()
}

func TestSyncFailureFailsPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		p := mustOpen(t, testConfig(fs))
		c := &tconsumer{owner: "c", credit: -1}
		p.Attach(c)
		mustPublish(t, p, "ok", nil)
		fs.SetSyncError(errors.New("disk on fire"))
		r := <-publish(p, "lost", nil)
		if protocol.CodeOf(r.err) != protocol.CodeUnavailable {
			t.Fatalf("publish with failing fsync: %v", r.err)
		}
		synctest.Wait()
		c.mu.Lock()
		det := c.detached
		c.mu.Unlock()
		if det == nil {
			t.Fatal("consumer not told about the failure")
		}
		if r := <-publish(p, "after", nil); protocol.CodeOf(r.err) != protocol.CodeUnavailable {
			t.Fatalf("publish after failure: %v", r.err)
		}
		fs.SetSyncError(nil)
		p.Close()
	})
}

func (c *tconsumer) endedLeases() [][2]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.ended)
}

// The holder of a lease is told when it ends, whatever ended it, after the
// Deliver of that lease; a detached consumer is told nothing.
func TestLeaseEndedTellsHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := mustOpen(t, testConfig(vfs.NewMem()))
		defer p.Close()
		c := &tconsumer{owner: "c1", credit: 2}
		p.Attach(c)
		mustPublish(t, p, "a", nil)
		mustPublish(t, p, "b", nil)
		synctest.Wait()
		ds := c.deliveries()
		if len(ds) != 2 || len(c.endedLeases()) != 0 {
			t.Fatalf("deliveries %d, ended %v", len(ds), c.endedLeases())
		}
		if err := settle(p, Ack, ds[0], 0); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if got, want := c.endedLeases(), [][2]uint64{{ds[0].Offset, ds[0].LeaseID}}; !slices.Equal(got, want) {
			t.Fatalf("after ack: ended %v, want %v", got, want)
		}
		time.Sleep(10 * time.Second) // the lease in testConfig
		synctest.Wait()
		want := [][2]uint64{{ds[0].Offset, ds[0].LeaseID}, {ds[1].Offset, ds[1].LeaseID}}
		if got := c.endedLeases(); !slices.Equal(got, want) {
			t.Fatalf("after expiry: ended %v, want %v", got, want)
		}
		// Not leased again yet: a late nack finds the message back already.
		if err := settle(p, Nack, ds[1], 0); !errors.Is(err, queue.ErrAlreadyRequeued) {
			t.Fatalf("late nack: %v, want ErrAlreadyRequeued", err)
		}
		// Credit came back by hand (tconsumer does not count): the
		// redelivery is attempt 2. Detaching releases it without telling.
		c.addCredit(1)
		p.Poke()
		synctest.Wait()
		ds = c.deliveries()
		if len(ds) != 3 || ds[2].Attempt != 2 || ds[2].Offset != want[1][0] {
			t.Fatalf("redelivery: %+v", ds)
		}
		// Leased again: the expired lease is stale.
		if err := settle(p, Ack, ds[1], 0); !errors.Is(err, queue.ErrStaleLease) {
			t.Fatalf("late ack after redelivery: %v, want ErrStaleLease", err)
		}
		p.Detach(c)
		synctest.Wait()
		if got := c.endedLeases(); len(got) != 2 {
			t.Fatalf("detached consumer told of %v", got)
		}
		if st := p.Stats(); st.Ready != 1 || st.Inflight != 0 {
			t.Fatalf("after detach: %+v", st)
		}
	})
}

// carrier is a tconsumer that takes part in carried credit and logs, in
// order, carries, refunds, deliveries and the settle answers a test adds.
type carrier struct {
	tconsumer
	evMu sync.Mutex
	ev   []string
}

func (c *carrier) log(s string) {
	c.evMu.Lock()
	c.ev = append(c.ev, s)
	c.evMu.Unlock()
}

// events returns the log without the credit a turn took and refunded
// unused because nothing was ready (a take followed by its refund).
func (c *carrier) events() []string {
	c.evMu.Lock()
	defer c.evMu.Unlock()
	var out []string
	for i := 0; i < len(c.ev); i++ {
		var n, m int
		if i+1 < len(c.ev) {
			if _, err := fmt.Sscanf(c.ev[i], "take %d", &n); err == nil {
				if _, err := fmt.Sscanf(c.ev[i+1], "refund %d", &m); err == nil && m == n {
					i++
					continue
				}
			}
		}
		out = append(out, c.ev[i])
	}
	return out
}

func (c *carrier) TakeCredit(max int) int {
	n := c.tconsumer.TakeCredit(max)
	if n > 0 {
		c.log(fmt.Sprintf("take %d", n))
	}
	return n
}

func (c *carrier) CarryCredit(offset, leaseID uint64) bool {
	c.log(fmt.Sprintf("carry %d", offset))
	return true
}

func (c *carrier) RefundCredit(n int) {
	c.log(fmt.Sprintf("refund %d", n))
	c.tconsumer.RefundCredit(n)
}

func (c *carrier) Deliver(d Delivery) {
	c.log("deliver " + string(d.Body))
	c.tconsumer.Deliver(d)
}

// A settle sent by the lease's holder carries its credit to the next
// lease of the same stage, which is delivered after the settle's answer;
// credit the stage does not spend goes back after its answers; a settle
// sent by anyone else carries nothing.
func TestSettleForCarriesCredit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := mustOpen(t, testConfig(vfs.NewMem()))
		defer p.Close()
		mustPublish(t, p, "a", nil)
		mustPublish(t, p, "b", nil)
		c := &carrier{tconsumer: tconsumer{owner: "c1", credit: 1}}
		if err := p.Attach(c); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		settleFor := func(by Consumer, d Delivery) {
			p.SettleFor(by, Ack, d.Offset, d.LeaseID, 0, func(err error) {
				if err != nil {
					t.Errorf("ack %q: %v", d.Body, err)
				}
				c.log("acked " + string(d.Body))
			})
			synctest.Wait()
		}
		got := c.deliveries()
		if len(got) != 1 {
			t.Fatalf("deliveries %v, want a (prefetch 1)", bodies(got))
		}
		settleFor(c, got[0])
		want := []string{"take 1", "deliver a", fmt.Sprintf("carry %d", got[0].Offset), "acked a", "deliver b"}
		if ev := c.events(); !slices.Equal(ev, want) {
			t.Fatalf("events %q, want %q", ev, want)
		}
		got = c.deliveries()
		if len(got) != 2 || c.credit != 0 {
			t.Fatalf("deliveries %v, credit %d: want a, b and no credit left", bodies(got), c.credit)
		}
		// Nothing ready: the carried credit goes back after the answer.
		settleFor(c, got[1])
		want = append(want, fmt.Sprintf("carry %d", got[1].Offset), "acked b", "refund 1")
		if ev := c.events(); !slices.Equal(ev, want) {
			t.Fatalf("events %q, want %q", ev, want)
		}
		// A settle from someone other than the holder carries nothing.
		mustPublish(t, p, "c", nil)
		synctest.Wait()
		got = c.deliveries()
		if len(got) != 3 {
			t.Fatalf("deliveries %v, want a, b, c", bodies(got))
		}
		settleFor(&tconsumer{owner: "other"}, got[2])
		want = append(want, "take 1", "deliver c", "acked c")
		if ev := c.events(); !slices.Equal(ev, want) {
			t.Fatalf("events %q, want %q", ev, want)
		}
	})
}
