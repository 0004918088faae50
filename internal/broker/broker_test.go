package broker

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"

	"go.uber.org/goleak"

	"github.com/sinewmq/sinew/internal/partition"
	"github.com/sinewmq/sinew/internal/seglog"
	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// rec is a Consumer that records deliveries and checks the prefetch bound.
type rec struct {
	mu          sync.Mutex
	prefetch    int
	outstanding int
	maxSeen     int
	got         []Delivery
	closed      []uint8
}

func (r *rec) Deliver(s *Subscription, d Delivery) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, d)
	r.outstanding++
	r.maxSeen = max(r.maxSeen, r.outstanding)
}
func (r *rec) Closed(s *Subscription, reason uint8, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = append(r.closed, reason)
}
func (r *rec) deliveries() []Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// settle settles d through s and waits for the code.
func (r *rec) settle(s *Subscription, op protocol.Op, d Delivery) protocol.Code {
	ch := make(chan protocol.Code, 1)
	s.Settle(op, d.Partition, d.Offset, d.LeaseID, 0, func(c protocol.Code) {
		r.mu.Lock()
		r.outstanding--
		r.mu.Unlock()
		ch <- c
	})
	return <-ch
}

func testConfig(fs vfs.FS) Config {
	return Config{DataDir: "data", FS: fs, DefaultLeaseMs: 10_000}
}

func mustOpen(t testing.TB, cfg Config) *Broker {
	t.Helper()
	b, err := Open(cfg)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return b
}

func publish(t testing.TB, b *Broker, p *protocol.Publish) (protocol.PublishOK, error) {
	t.Helper()
	type res struct {
		ok  protocol.PublishOK
		err error
	}
	ch := make(chan res, 1)
	b.Publish(p, func(ok protocol.PublishOK, err error) { ch <- res{ok, err} })
	r := <-ch
	return r.ok, r.err
}

func mustPublish(t testing.TB, b *Broker, p *protocol.Publish) protocol.PublishOK {
	t.Helper()
	ok, err := publish(t, b, p)
	if err != nil {
		t.Fatalf("publish: %v", err)
	}
	return ok
}

func msg(topic, body string) *protocol.Publish {
	return &protocol.Publish{Topic: topic, Partition: -1, Body: []byte(body)}
}

func TestDeclareAndFirstUse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		ctx := context.Background()
		ok, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: "orders", Group: "billing", Partitions: 4, MaxRetries: -1})
		if err != nil || !ok.Created || ok.Partitions != 4 {
			t.Fatalf("declare: %+v %v", ok, err)
		}
		ok, err = b.Declare(ctx, &protocol.DeclareQueue{Topic: "orders", Group: "billing", MaxRetries: 3, LeaseMs: 5000})
		if err != nil || ok.Created || ok.Partitions != 4 {
			t.Fatalf("re-declare: %+v %v", ok, err)
		}
		_, err = b.Declare(ctx, &protocol.DeclareQueue{Topic: "orders", Group: "billing", Partitions: 2, MaxRetries: -1})
		if protocol.CodeOf(err) != protocol.CodeConflict {
			t.Fatalf("declare with other partition count: %v", err)
		}
		for _, bad := range []string{"", "a/b", "../x", "tab\there", string(make([]byte, 256))} {
			_, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: bad, MaxRetries: -1})
			if protocol.CodeOf(err) != protocol.CodeBadRequest {
				t.Errorf("topic %q: %v, want bad_request", bad, err)
			}
		}
		// First use creates with the defaults.
		r := mustPublish(t, b, msg("fresh", "x"))
		if r.Partition != 0 || r.Offset == 0 {
			t.Fatalf("first-use publish: %+v", r)
		}
		st := b.Stats()
		if len(st.Queues) != 2 || st.Queues[0].Topic != "fresh" || len(st.Queues[1].Partitions) != 4 {
			t.Fatalf("stats: %+v", st)
		}
		// Reserved headers and oversized bodies are refused.
		p := msg("fresh", "x")
		p.Headers = []protocol.Header{{Key: "sinew.retries", Value: "1"}}
		if _, err := publish(t, b, p); protocol.CodeOf(err) != protocol.CodeBadRequest {
			t.Fatalf("reserved header: %v", err)
		}
		if _, err := publish(t, b, msg("fresh", string(make([]byte, BodyBytesMaxDefault+1)))); protocol.CodeOf(err) != protocol.CodeMessageTooLarge {
			t.Fatalf("large body: %v", err)
		}
	})
}

func TestEscapeName(t *testing.T) {
	seen := map[string]string{}
	for _, n := range []string{"", ".", "..", "a", "A", "a b", "a%20b", "ü", "=", "x.y-z_1"} {
		e := escapeName(n)
		if e == "." || e == ".." || filepath.Base(e) != e {
			t.Errorf("escape(%q) = %q is not a plain file name", n, e)
		}
		if o, dup := seen[e]; dup {
			t.Errorf("escape(%q) = escape(%q) = %q", n, o, e)
		}
		seen[e] = n
	}
}

func TestKeyRoutingAndRoundRobin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "t", Partitions: 4, MaxRetries: -1})
		// Keyless first: with the backlogs even, as round-robin keeps
		// them, the less loaded choice is round-robin's (once each
		// partition published its counters: synctest.Wait).
		counts := make([]int, 4)
		for range 40 {
			counts[mustPublish(t, b, msg("t", "v")).Partition]++
			synctest.Wait()
		}
		if !slices.Equal(counts, []int{10, 10, 10, 10}) {
			t.Fatalf("round-robin counts %v", counts)
		}
		for k := range 20 {
			key := []byte("key-" + strconv.Itoa(k))
			want := uint32(keyPartition(key, 4))
			for range 3 {
				p := msg("t", "v")
				p.Key = key
				if r := mustPublish(t, b, p); r.Partition != want {
					t.Fatalf("key %s went to %d, then %d", key, want, r.Partition)
				}
			}
		}
		p := msg("t", "v")
		p.Partition = 4
		if _, err := publish(t, b, p); protocol.CodeOf(err) != protocol.CodeNotFound {
			t.Fatalf("publish to partition 4 of 4: %v", err)
		}
	})
}

func TestCompetingConsumersFairAndPrefetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "w", Partitions: 3, MaxRetries: -1})
		var rs []*rec
		var subs []*Subscription
		for range 3 {
			r := &rec{prefetch: 5}
			s, err := b.Subscribe(&protocol.Subscribe{Topic: "w", Partition: -1, Prefetch: 5}, r)
			if err != nil {
				t.Fatal(err)
			}
			if v := s.View(); v.Prefetch != 5 || v.Partition != -1 || v.SubID != s.ID() {
				t.Fatalf("view %+v", v)
			}
			rs, subs = append(rs, r), append(subs, s)
		}
		const n = 300
		for i := range n {
			mustPublish(t, b, msg("w", strconv.Itoa(i)))
		}
		// Settle whatever arrives until everything is done; check the bound.
		done := 0
		for done < n {
			synctest.Wait()
			progress := false
			for i, r := range rs {
				for _, d := range r.deliveries()[len(r.deliveries())-r.outstandingCount():] {
					if c := r.settle(subs[i], protocol.OpAck, d); c != protocol.CodeOK {
						t.Fatalf("ack: %v", c)
					}
					done++
					progress = true
				}
			}
			if !progress {
				t.Fatalf("stuck after %d of %d", done, n)
			}
		}
		for i, r := range rs {
			if r.maxSeen > 5 {
				t.Errorf("consumer %d had %d outstanding, prefetch 5", i, r.maxSeen)
			}
			if got := len(r.deliveries()); got < n/3-20 || got > n/3+20 {
				t.Errorf("consumer %d got %d of %d: unfair", i, got, n)
			}
		}
		_, err := b.Subscribe(&protocol.Subscribe{Topic: "w", Partition: -1, Prefetch: PrefetchMaxDefault + 1}, &rec{})
		if protocol.CodeOf(err) != protocol.CodeLimitExceeded {
			t.Fatalf("prefetch above max: %v", err)
		}
	})
}

func (r *rec) outstandingCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.outstanding
}

func TestCloseRequeuesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		a := &rec{}
		sa, err := b.Subscribe(&protocol.Subscribe{Topic: "q", Partition: -1, Prefetch: 10}, a)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			mustPublish(t, b, msg("q", strconv.Itoa(i)))
		}
		synctest.Wait()
		if len(a.deliveries()) != 3 {
			t.Fatalf("a got %d", len(a.deliveries()))
		}
		c := &rec{}
		sc, _ := b.Subscribe(&protocol.Subscribe{Topic: "q", Partition: 0, Prefetch: 10}, c)
		synctest.Wait()
		if len(c.deliveries()) != 0 {
			t.Fatal("c got leased messages")
		}
		sa.Close()
		synctest.Wait() // no time passes: requeue is immediate
		got := c.deliveries()
		if len(got) != 3 || got[0].Attempt != 2 {
			t.Fatalf("after close c got %+v", got)
		}
		// The old lease is stale now; the new one acks.
		if code := a.settle(sa, protocol.OpAck, a.deliveries()[0]); code != protocol.CodeStaleLease {
			t.Fatalf("ack of released lease: %v", code)
		}
		if code := c.settle(sc, protocol.OpAck, got[0]); code != protocol.CodeOK {
			t.Fatalf("ack: %v", code)
		}
		// The partition remembers which lease ACKed the offset: the same
		// ACK again is ok (its answer may have been lost, even in a crash),
		// while an ACK of another lease of it stays stale.
		if code := c.settle(sc, protocol.OpAck, got[0]); code != protocol.CodeOK {
			t.Fatalf("second ack of a settled lease: %v", code)
		}
		if code := a.settle(sa, protocol.OpAck, a.deliveries()[0]); code != protocol.CodeStaleLease {
			t.Fatalf("ack of the released lease after the message was acked: %v", code)
		}
	})
}

func TestRestartRecoversQueuesAndAcks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		cfg := testConfig(fs)
		b := mustOpen(t, cfg)
		ctx := context.Background()
		b.Declare(ctx, &protocol.DeclareQueue{Topic: "jobs", Group: "g/1 ü", Partitions: 2, MaxRetries: 7, LeaseMs: 2000})
		r := &rec{}
		s, err := b.Subscribe(&protocol.Subscribe{Topic: "jobs", Group: "g/1 ü", Partition: -1, Prefetch: 100}, r)
		if err == nil || protocol.CodeOf(err) != protocol.CodeBadRequest {
			t.Fatalf("group with '/': %v", err)
		}
		b.Declare(ctx, &protocol.DeclareQueue{Topic: "jobs", Group: "g 1 ü", Partitions: 2, MaxRetries: 7, LeaseMs: 2000})
		s, err = b.Subscribe(&protocol.Subscribe{Topic: "jobs", Group: "g 1 ü", Partition: -1, Prefetch: 100}, r)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			p := msg("jobs", strconv.Itoa(i))
			p.Group = "g 1 ü"
			mustPublish(t, b, p)
		}
		synctest.Wait()
		ds := r.deliveries()
		acked := map[string]bool{}
		for _, d := range ds[:6] {
			if r.settle(s, protocol.OpAck, d) != protocol.CodeOK {
				t.Fatal("ack failed")
			}
			acked[string(d.Body)] = true
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if reasons := r.closed; len(reasons) != 1 || reasons[0] != protocol.SubClosedShutdown {
			t.Fatalf("consumer told %v at shutdown", reasons)
		}

		b = mustOpen(t, cfg)
		defer b.Close()
		st := b.Stats()
		if len(st.Queues) != 1 || st.Queues[0].Group != "g 1 ü" || len(st.Queues[0].Partitions) != 2 {
			t.Fatalf("recovered %+v", st)
		}
		ok, err := b.Declare(ctx, &protocol.DeclareQueue{Topic: "jobs", Group: "g 1 ü", MaxRetries: 7, LeaseMs: 2000})
		if err != nil || ok.Created || ok.Partitions != 2 {
			t.Fatalf("declare after restart: %+v %v", ok, err)
		}
		r2 := &rec{}
		if _, err := b.Subscribe(&protocol.Subscribe{Topic: "jobs", Group: "g 1 ü", Partition: -1, Prefetch: 100}, r2); err != nil {
			t.Fatal(err)
		}
		// The recovered leases are released at startup (no grace), well
		// before their persisted 2000 ms lease would run out.
		synctest.Wait()
		var got []string
		for _, d := range r2.deliveries() {
			got = append(got, string(d.Body))
			if d.Attempt != 2 {
				t.Errorf("%q redelivered at attempt %d, want 2", d.Body, d.Attempt)
			}
			if acked[string(d.Body)] {
				t.Errorf("acked message %q came back", d.Body)
			}
		}
		if len(got) != 4 {
			t.Fatalf("unsettled after restart: %v, want 4", got)
		}
	})
}

func TestDeadLetterToGlobalQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "src", MaxRetries: 0})
		r := &rec{}
		s, _ := b.Subscribe(&protocol.Subscribe{Topic: "src", Partition: -1, Prefetch: 10}, r)
		dl := &rec{}
		sdl, err := b.Subscribe(&protocol.Subscribe{Topic: DeadLetterTopicDefault, Partition: -1, Prefetch: 10}, dl)
		if err != nil {
			t.Fatal(err)
		}
		p := msg("src", "bad")
		p.Headers = []protocol.Header{{Key: "trace", Value: "42"}}
		off := mustPublish(t, b, p).Offset
		synctest.Wait()
		if code := r.settle(s, protocol.OpNack, r.deliveries()[0]); code != protocol.CodeOK {
			t.Fatal(code)
		}
		synctest.Wait()
		got := dl.deliveries()
		if len(got) != 1 {
			t.Fatalf("dead-letter queue got %d", len(got))
		}
		h := map[string]string{}
		for _, x := range got[0].Headers {
			h[x.Key] = x.Value
		}
		want := map[string]string{"trace": "42", "sinew.source.topic": "src", "sinew.source.group": "",
			"sinew.source.partition": "0", "sinew.source.offset": fmt.Sprint(off), "sinew.retries": "1",
			"sinew.reason": "retries_exhausted"}
		for k, v := range want {
			if h[k] != v {
				t.Errorf("header %s = %q, want %q", k, h[k], v)
			}
		}
		// The dead-letter queue keeps its own failures: FAIL puts the
		// message back, and it is delivered again with a higher attempt.
		if code := dl.settle(sdl, protocol.OpFail, got[0]); code != protocol.CodeOK {
			t.Fatal(code)
		}
		synctest.Wait()
		got = dl.deliveries()
		if len(got) != 2 || got[1].Offset != got[0].Offset || got[1].Attempt != 2 {
			t.Fatalf("dead-letter queue after FAIL delivered %+v, want the same message again at attempt 2", got)
		}
		if code := dl.settle(sdl, protocol.OpAck, got[1]); code != protocol.CodeOK {
			t.Fatal(code)
		}
		synctest.Wait()
		for _, q := range b.Stats().Queues {
			for _, p := range q.Partitions {
				if p.Ready+p.Inflight+p.DeadLettering != 0 {
					t.Errorf("%s p%d not drained: %+v", q.Topic, p.Partition, p)
				}
			}
		}
	})
}

func TestQuarantinedPartitionOthersServe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		cfg := testConfig(fs)
		b := mustOpen(t, cfg)
		b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "t", Partitions: 2, MaxRetries: -1})
		for i := range 6 {
			mustPublish(t, b, msg("t", strconv.Itoa(i)))
		}
		b.Close()
		pdir := filepath.Join("data", queuesDir, escapeName("t"), escapeName(""), "p0")
		fs.Remove(filepath.Join(pdir, "checkpoint"))
		if err := fs.FlipBit(filepath.Join(pdir, "log", seglog.SegmentName(1)), 20, 1); err != nil {
			t.Fatal(err)
		}

		refuse := cfg
		refuse.Quarantine = Refuse
		if _, err := Open(refuse); !errors.Is(err, partition.ErrDamaged) {
			t.Fatalf("open with Refuse: %v", err)
		}

		b = mustOpen(t, cfg)
		p := msg("t", "x")
		p.Partition = 0
		if _, err := publish(t, b, p); protocol.CodeOf(err) != protocol.CodeUnavailable {
			t.Fatalf("publish to quarantined partition: %v", err)
		}
		if _, err := b.Subscribe(&protocol.Subscribe{Topic: "t", Partition: 0}, &rec{}); protocol.CodeOf(err) != protocol.CodeUnavailable {
			t.Fatalf("subscribe to quarantined partition: %v", err)
		}
		for range 4 { // keyless publishes avoid the parked partition
			if r := mustPublish(t, b, msg("t", "y")); r.Partition != 1 {
				t.Fatalf("keyless publish went to %d", r.Partition)
			}
		}
		r := &rec{}
		s, err := b.Subscribe(&protocol.Subscribe{Topic: "t", Partition: -1, Prefetch: 100}, r)
		if err != nil || !slices.Equal(s.Partitions(), []uint32{1}) {
			t.Fatalf("subscribe all: %v %v", s, err)
		}
		synctest.Wait()
		if n := len(r.deliveries()); n != 3+4 {
			t.Fatalf("healthy partition delivered %d, want 7", n)
		}
		qs := b.Stats().Queues[0].Partitions
		if !qs[0].Quarantined || qs[0].Err == "" || qs[1].Quarantined {
			t.Fatalf("stats %+v", qs)
		}
		if ps := b.Problems(); len(ps) != 1 || ps[0].Partition != 0 || ps[0].State != "quarantined" || ps[0].Err == "" {
			t.Fatalf("problems %+v, want partition 0 quarantined", ps)
		}
		b.Close()

		ignore := cfg
		ignore.Quarantine = Ignore
		b = mustOpen(t, ignore)
		defer b.Close()
		if _, err := publish(t, b, p); err != nil {
			t.Fatalf("publish after Ignore reopen: %v", err)
		}
	})
}
