package broker

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// memberRec is a rec that also records its assignment events.
type memberRec struct {
	rec
	amu    sync.Mutex
	events []string // "+p@epoch" assigned, "-p@epoch" revoked
}

func (r *memberRec) Assignment(s *Subscription, partition uint32, epoch uint64, assigned bool) {
	r.amu.Lock()
	defer r.amu.Unlock()
	sign := "-"
	if assigned {
		sign = "+"
	}
	r.events = append(r.events, sign+strconv.Itoa(int(partition))+"@"+strconv.FormatUint(epoch, 10))
}

func (r *memberRec) assignmentEvents() []string {
	r.amu.Lock()
	defer r.amu.Unlock()
	return slices.Clone(r.events)
}

// partitionsOf lists the partitions r was delivered from.
func partitionsOf(ds []Delivery) []uint32 {
	var ps []uint32
	for _, d := range ds {
		if !slices.Contains(ps, d.Partition) {
			ps = append(ps, d.Partition)
		}
	}
	slices.Sort(ps)
	return ps
}

// TestCohortSharesPartitionsExclusively: two members of a cohort split a
// queue's four partitions two and two, each sees only its own, in offset
// order; a plain consumer and a second cohort get nothing; when a member
// leaves, its partitions pass to the other once its leases ended, and both
// hear of it.
func TestCohortSharesPartitionsExclusively(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		if _, err := b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "orders", Partitions: 4, MaxRetries: -1}); err != nil {
			t.Fatal(err)
		}
		for i := range 40 {
			p := msg("orders", strconv.Itoa(i))
			p.Partition = int32(i % 4)
			mustPublish(t, b, p)
		}
		join := func(member string, r Consumer) (*Subscription, error) {
			return b.Subscribe(&protocol.Subscribe{Topic: "orders", Partition: -1, Prefetch: 100, Cohort: "billing", Member: member}, r)
		}
		m1, m2 := &memberRec{}, &memberRec{}
		s1, err := join("m1", m1)
		if err != nil {
			t.Fatal(err)
		}
		s2, err := join("m2", m2)
		if err != nil {
			t.Fatal(err)
		}
		// A plain consumer that comes after the cohort gets nothing.
		plain := &rec{}
		if _, err := b.Subscribe(&protocol.Subscribe{Topic: "orders", Partition: -1, Prefetch: 100}, plain); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Subscribe(&protocol.Subscribe{Topic: "orders", Partition: -1, Cohort: "audit", Member: "a1"}, &rec{}); protocol.CodeOf(err) != protocol.CodeConflict {
			t.Fatalf("a second cohort on the queue: %v, want conflict", err)
		}
		for _, bad := range []protocol.Subscribe{
			{Topic: "orders", Partition: -1, Cohort: "billing"},
			{Topic: "orders", Partition: -1, Cohort: "bill ing", Member: "m3"},
			{Topic: "orders", Partition: -1, Cohort: "billing", Member: string(make([]byte, 129))},
		} {
			if _, err := b.Subscribe(&bad, &rec{}); protocol.CodeOf(err) != protocol.CodeBadRequest {
				t.Fatalf("subscribe %+v: %v, want bad_request", bad, err)
			}
		}
		time.Sleep(time.Second) // the planner's delay
		synctest.Wait()
		p1, p2 := partitionsOf(m1.deliveries()), partitionsOf(m2.deliveries())
		if len(p1) != 2 || len(p2) != 2 || slices.ContainsFunc(p1, func(p uint32) bool { return slices.Contains(p2, p) }) {
			t.Fatalf("m1 served partitions %v, m2 %v: want two each, disjoint", p1, p2)
		}
		if n := len(plain.deliveries()); n != 0 {
			t.Fatalf("a plain consumer got %d deliveries from a cohort's queue", n)
		}
		for _, m := range []*memberRec{m1, m2} {
			if got := len(m.deliveries()); got != 20 {
				t.Fatalf("a member got %d deliveries, want 20", got)
			}
			// Each partition's messages in offset order.
			last := map[uint32]uint64{}
			for _, d := range m.deliveries() {
				if d.Offset <= last[d.Partition] {
					t.Fatalf("partition %d: offset %d after %d", d.Partition, d.Offset, last[d.Partition])
				}
				last[d.Partition] = d.Offset
				if d.Assignment == 0 {
					t.Fatalf("delivery without an assignment epoch: %+v", d)
				}
			}
			if ev := m.assignmentEvents(); len(ev) != 2 || ev[0][0] != '+' || ev[1][0] != '+' {
				t.Fatalf("assignment events %v, want two assigned", ev)
			}
		}

		// m1 leaves holding its 20 deliveries: Close releases them, and its
		// partitions pass to m2, which gets them again.
		s1.Close()
		time.Sleep(time.Second)
		synctest.Wait()
		if got := partitionsOf(m2.deliveries()); len(got) != 4 {
			t.Fatalf("after m1 left, m2 served %v, want all four", got)
		}
		if got := len(m2.deliveries()); got != 40 {
			t.Fatalf("m2 got %d deliveries, want 40", got)
		}
		if n := len(plain.deliveries()); n != 0 {
			t.Fatalf("a plain consumer got %d deliveries", n)
		}
		// The last member leaves: the partitions open to plain consumers.
		s2.Close()
		time.Sleep(time.Second)
		synctest.Wait()
		if got := len(plain.deliveries()); got != 40 {
			t.Fatalf("the plain consumer got %d deliveries once the cohort left, want 40", got)
		}
		// The second cohort may join now.
		if _, err := b.Subscribe(&protocol.Subscribe{Topic: "orders", Partition: -1, Cohort: "audit", Member: "a1"}, &rec{}); err != nil {
			t.Fatalf("a cohort on a queue no cohort holds: %v", err)
		}
	})
}
