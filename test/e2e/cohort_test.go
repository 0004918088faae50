package e2e_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sinewmq/sinew"
)

// cohortMember is one member's subscription and what it saw.
type cohortMember struct {
	name  string
	sub   *sinew.Subscription
	owned map[uint32]bool
	// last is the offset last delivered per partition (first deliveries
	// only, attempt 1).
	last map[uint32]uint64
	got  int
}

// takeAssignments applies the assignment events m's subscription has
// pending.
func (m *cohortMember) takeAssignments() {
	for {
		select {
		case a := <-m.sub.Assignments():
			if a.Assigned {
				m.owned[a.Partition] = true
			} else {
				delete(m.owned, a.Partition)
			}
		default:
			return
		}
	}
}

// waitOwned waits until every member owns the number of partitions want
// gives it.
func waitOwned(t *testing.T, want map[*cohortMember]int) {
	t.Helper()
	deadline := time.Now().Add(safetyTimeout)
	for {
		ok := true
		for m, n := range want {
			m.takeAssignments()
			ok = ok && len(m.owned) == n
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			for m := range want {
				t.Logf("%s owns %v", m.name, m.owned)
			}
			t.Fatal("cohort assignments did not settle")
		}
		time.Sleep(20 * time.Millisecond) // polling channels fed by real processes
	}
}

// TestClusterCohortSharesPartitionsAcrossNodes: on a three-node cluster,
// two cohort members, each connected through a different node, split a
// four-partition queue two and two as the controller's plan says; each
// gets only its own partitions, in offset order. When one member ends, the
// other is assigned its partitions and receives their messages.
func TestClusterCohortSharesPartitionsAcrossNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the sinew binary")
	}
	bin := buildSinew(t)
	nodes, _, _ := startThreeVoting(t, bin)
	var addrs []string
	for _, c := range nodes {
		addrs = append(addrs, c.addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*safetyTimeout)
	defer cancel()
	dial := func(i int, opts ...sinew.Option) *sinew.Client {
		t.Helper()
		c, err := sinew.Dial(ctx, addrs[i], append([]sinew.Option{fastReconnect(), sinew.WithSeeds(addrs...)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	const topic, parts = "cohort-spread", 4
	producer := dial(0)
	if _, err := producer.DeclareQueue(ctx, topic, sinew.QueueConfig{Partitions: parts}); err != nil {
		t.Fatal(err)
	}
	join := func(i int, name string) (*sinew.Client, *cohortMember) {
		t.Helper()
		c := dial(i, sinew.WithMemberID(name))
		sub, err := c.Subscribe(ctx, topic, sinew.WithCohort("billing"), sinew.WithPrefetch(64))
		if err != nil {
			t.Fatalf("%s: subscribe: %v", name, err)
		}
		return c, &cohortMember{name: name, sub: sub, owned: map[uint32]bool{}, last: map[uint32]uint64{}}
	}
	c1, m1 := join(1, "worker-1")
	_, m2 := join(2, "worker-2")
	waitOwned(t, map[*cohortMember]int{m1: 2, m2: 2})

	const n = 80
	for i := range n {
		if _, err := producer.Publish(ctx, topic, fmt.Appendf(nil, "m-%d", i), sinew.WithPartition(i%parts)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	receive := func(ms []*cohortMember, total int) {
		t.Helper()
		deadline := time.After(safetyTimeout)
		for got := 0; got < total; {
			for _, m := range ms {
				select {
				case msg := <-m.sub.Messages():
					m.takeAssignments()
					if !m.owned[msg.Partition] {
						t.Fatalf("%s got a message of partition %d, assigned %v", m.name, msg.Partition, m.owned)
					}
					if msg.Attempt == 1 {
						if msg.Offset <= m.last[msg.Partition] {
							t.Fatalf("%s: partition %d offset %d after %d", m.name, msg.Partition, msg.Offset, m.last[msg.Partition])
						}
						m.last[msg.Partition] = msg.Offset
					}
					if err := msg.Complete(ctx); err != nil {
						t.Fatalf("%s: complete: %v", m.name, err)
					}
					m.got++
					got++
				default:
				}
			}
			select {
			case <-deadline:
				t.Fatalf("received %d of %d", m1.got+m2.got, total)
			case <-time.After(time.Millisecond):
			}
		}
	}
	receive([]*cohortMember{m1, m2}, n)
	if m1.got != n/2 || m2.got != n/2 {
		t.Fatalf("worker-1 got %d, worker-2 %d: want %d each", m1.got, m2.got, n/2)
	}

	// worker-1 ends its session: worker-2 takes all four partitions.
	c1.Close()
	waitOwned(t, map[*cohortMember]int{m2: parts})
	for i := range n {
		if _, err := producer.Publish(ctx, topic, fmt.Appendf(nil, "after-%d", i), sinew.WithPartition(i%parts)); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	m2.got = 0
	receive([]*cohortMember{m2}, n)
}
