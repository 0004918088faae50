package sinew

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestRealCohortSplitsPartitionsAndSurvivesACut: against the real broker,
// two cohort members split a four-partition queue, each sees only its own
// partitions in offset order and hears its assignments; a cut inside the
// grace moves nothing; when one member closes, the other takes over its
// partitions, and a bad cohort name fails at the call.
func TestRealCohortSplitsPartitionsAndSurvivesACut(t *testing.T) {
	rb := startRealBroker(t, nil)
	ctx := testCtx(t)
	admin := dialT(t, rb.Addr)
	if _, err := admin.DeclareQueue(ctx, "cohort-q", QueueConfig{Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	p := proxyT(t, rb.Addr)
	c1 := dialT(t, p.Addr(), WithMemberID("worker-1"))
	c2 := dialT(t, rb.Addr, WithMemberID("worker-2"))
	if _, err := c1.Subscribe(ctx, "cohort-q", WithCohort("bad name")); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad cohort name: %v, want ErrInvalidArgument", err)
	}
	s1, err := c1.Subscribe(ctx, "cohort-q", WithCohort("billing"), WithPrefetch(64))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := c2.Subscribe(ctx, "cohort-q", WithCohort("billing"), WithPrefetch(64))
	if err != nil {
		t.Fatal(err)
	}
	// Wait until all four partitions are assigned, two each.
	owned := map[*Subscription]map[uint32]bool{s1: {}, s2: {}}
	waitAssigned := func(want map[*Subscription]int) {
		t.Helper()
		deadline := time.After(20 * time.Second)
		for {
			ok := true
			for s, n := range want {
				if len(owned[s]) != n {
					ok = false
				}
			}
			if ok {
				return
			}
			select {
			case a := <-s1.Assignments():
				if a.Assigned {
					owned[s1][a.Partition] = true
				} else {
					delete(owned[s1], a.Partition)
				}
			case a := <-s2.Assignments():
				if a.Assigned {
					owned[s2][a.Partition] = true
				} else {
					delete(owned[s2], a.Partition)
				}
			case <-deadline:
				t.Fatalf("assignments: worker-1 %v, worker-2 %v", owned[s1], owned[s2])
			}
		}
	}
	waitAssigned(map[*Subscription]int{s1: 2, s2: 2})

	// 40 keyed messages: each member gets those of its partitions, in order.
	const n = 40
	for i := range n {
		if _, err := admin.Publish(ctx, "cohort-q", fmt.Appendf(nil, "%d", i), WithKey(fmt.Appendf(nil, "k%d", i%8))); err != nil {
			t.Fatal(err)
		}
	}
	got := map[*Subscription][]*Message{}
	for len(got[s1])+len(got[s2]) < n {
		select {
		case m := <-s1.Messages():
			got[s1] = append(got[s1], m)
		case m := <-s2.Messages():
			got[s2] = append(got[s2], m)
		case <-time.After(20 * time.Second):
			t.Fatalf("got %d + %d of %d", len(got[s1]), len(got[s2]), n)
		}
	}
	for s, ms := range got {
		last := map[uint32]uint64{}
		for _, m := range ms {
			if !owned[s][m.Partition] {
				t.Fatalf("a member got a message of partition %d, which is not its own (%v)", m.Partition, owned[s])
			}
			if m.Offset <= last[m.Partition] {
				t.Fatalf("partition %d: offset %d after %d", m.Partition, m.Offset, last[m.Partition])
			}
			last[m.Partition] = m.Offset
			if m.Assignment == 0 {
				t.Fatalf("message without an assignment epoch")
			}
			if err := m.Complete(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	// A cut inside the grace moves nothing: worker-1's partitions wait for it.
	p.CutAll()
	if _, err := admin.Publish(ctx, "cohort-q", []byte("after-cut"), WithKey([]byte("k0"))); err != nil {
		t.Fatal(err)
	}
	var m *Message
	select {
	case m = <-s1.Messages():
	case m = <-s2.Messages():
	case <-time.After(20 * time.Second):
		t.Fatal("nothing delivered after the cut")
	}
	if err := m.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-s1.Assignments():
		t.Fatalf("worker-1 got assignment %+v after a cut inside the grace", a)
	case a := <-s2.Assignments():
		t.Fatalf("worker-2 got assignment %+v after a cut inside the grace", a)
	default:
	}

	// worker-1 leaves: worker-2 takes its partitions.
	mine := slices.Collect(func(yield func(uint32) bool) {
		for p := range owned[s1] {
			if !yield(p) {
				return
			}
		}
	})
	if err := s1.Unsubscribe(ctx); err != nil {
		t.Fatal(err)
	}
	owned[s1] = nil
	waitAssigned(map[*Subscription]int{s2: 4})
	for _, p := range mine {
		if !owned[s2][p] {
			t.Fatalf("worker-2 was not assigned worker-1's partition %d", p)
		}
	}
}

// TestRealCohortMemberTakeover: a client that comes back with its member id
// while its old session still waits out the grace takes the id over: the old
// subscription ends with conflict and the new one gets the partitions.
func TestRealCohortMemberTakeover(t *testing.T) {
	rb := startRealBroker(t, nil)
	ctx := testCtx(t)
	p := proxyT(t, rb.Addr)
	old := dialT(t, p.Addr(), WithMemberID("worker-1"))
	s1, err := old.Subscribe(ctx, "takeover-q", WithCohort("billing"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-s1.Assignments():
	case <-time.After(20 * time.Second):
		t.Fatal("the first member was never assigned")
	}
	// The old process vanishes: its socket goes, its session waits.
	p.Close()
	fresh := dialT(t, rb.Addr, WithMemberID("worker-1"))
	s2, err := fresh.Subscribe(ctx, "takeover-q", WithCohort("billing"))
	if err != nil {
		t.Fatalf("subscribe with a member id held by a dormant session: %v", err)
	}
	if _, err := fresh.Publish(ctx, "takeover-q", []byte("x")); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-s2.Messages():
		if err := m.Complete(ctx); err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the new member got nothing")
	}
}
