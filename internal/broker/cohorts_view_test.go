package broker

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sinewmq/sinew/internal/vfs"
	"github.com/sinewmq/sinew/protocol"
)

// TestCohortsView: Cohorts shows a cohort's members, plan and gates on a
// single node: partitions held for the cohort before the first plan are
// paused; once planned each has its member, epoch and lag; a partition the
// plan moves while its previous member holds leases is paused until they
// end; when the last member leaves and the gates open the cohort is gone.
// The counters count the plans that changed an assignment and the moves.
func TestCohortsView(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustOpen(t, testConfig(vfs.NewMem()))
		defer b.Close()
		if _, err := b.Declare(context.Background(), &protocol.DeclareQueue{Topic: "orders", Partitions: 4, MaxRetries: -1}); err != nil {
			t.Fatal(err)
		}
		for i := range 8 {
			p := msg("orders", strconv.Itoa(i))
			p.Partition = int32(i % 4)
			mustPublish(t, b, p)
		}
		if v := b.Cohorts(); len(v) != 0 {
			t.Fatalf("cohorts before any member: %+v", v)
		}
		settle := func() {
			time.Sleep(time.Second) // the planner's delay
			synctest.Wait()
		}
		join := func(member string, r Consumer) *Subscription {
			s, err := b.Subscribe(&protocol.Subscribe{Topic: "orders", Partition: -1, Prefetch: 100, Cohort: "billing", Member: member}, r)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		view := func() CohortView {
			t.Helper()
			v := b.Cohorts()
			if len(v) != 1 || v[0].Topic != "orders" || v[0].Group != "" || v[0].Cohort != "billing" || v[0].Clustered || len(v[0].Partitions) != 4 {
				t.Fatalf("cohorts: %+v, want billing on orders with 4 partitions", v)
			}
			return v[0]
		}

		m1 := &memberRec{}
		s1 := join("m1", m1)
		synctest.Wait() // the partitions were steered to the cohort, not planned yet
		v := view()
		if !slices.Equal(v.Members, []string{"m1"}) || v.Plan.Generation != 0 {
			t.Fatalf("before the first plan: %+v", v)
		}
		for _, p := range v.Partitions {
			if !p.Held || p.Member != "" || !p.Paused || !p.Owned || p.Lag != 2 {
				t.Fatalf("before the first plan, partition %+v: want held for nobody, paused, owned, lag 2", p)
			}
		}

		settle()
		v = view()
		if v.Plan.Generation != 1 || !slices.Equal(v.Plan.Owners, []string{"m1", "m1", "m1", "m1"}) {
			t.Fatalf("first plan: %+v", v.Plan)
		}
		for i, p := range v.Partitions {
			if p.Partition != uint32(i) || p.Planned != "m1" || !p.Held || p.Member != "m1" || p.Paused || p.Epoch != 2 || p.Lag != 2 {
				t.Fatalf("m1 alone, partition %+v: want m1's, epoch 2 (held, then assigned), lag 2", p)
			}
		}
		if plans, moved := b.CohortCounters(); plans != 1 || moved != 4 {
			t.Fatalf("counters after the first plan: %d plans, %d moved; want 1, 4", plans, moved)
		}

		// m2 joins while m1 holds every message: the plan gives m2 two
		// partitions, which stay with m1 (paused) until its leases end.
		m2 := &memberRec{}
		s2 := join("m2", m2)
		settle()
		v = view()
		if !slices.Equal(v.Members, []string{"m1", "m2"}) || v.Plan.Generation != 2 {
			t.Fatalf("after m2 joined: %+v", v)
		}
		var toM2 []uint32
		for _, p := range v.Partitions {
			switch p.Planned {
			case "m2":
				toM2 = append(toM2, p.Partition)
				if p.Member != "m1" || !p.Paused {
					t.Fatalf("partition %+v planned for m2 while m1 holds leases: want m1's gate, paused", p)
				}
			case "m1":
				if p.Member != "m1" || p.Paused {
					t.Fatalf("partition %+v: want m1's, flowing", p)
				}
			default:
				t.Fatalf("partition %+v planned for nobody", p)
			}
		}
		if len(toM2) != 2 {
			t.Fatalf("plan %v gives m2 %d partitions, want 2", v.Plan.Owners, len(toM2))
		}
		if plans, moved := b.CohortCounters(); plans != 2 || moved != 6 {
			t.Fatalf("counters after m2 joined: %d plans, %d moved; want 2, 6", plans, moved)
		}
		// m1 acks what it holds of m2's partitions: they move to m2.
		for _, d := range m1.deliveries() {
			if slices.Contains(toM2, d.Partition) {
				if code := m1.settle(s1, protocol.OpAck, d); code != protocol.CodeOK {
					t.Fatalf("ack: %v", code)
				}
			}
		}
		synctest.Wait()
		v = view()
		for _, p := range v.Partitions {
			if slices.Contains(toM2, p.Partition) && (p.Member != "m2" || p.Paused || p.Epoch != 3 || p.Lag != 0) {
				t.Fatalf("partition %+v after m1's leases ended: want m2's, epoch 3, lag 0", p)
			}
		}

		// Both leave: the gates open once the leases are released, and the
		// cohort is no more.
		s1.Close()
		s2.Close()
		settle()
		if v := b.Cohorts(); len(v) != 0 {
			t.Fatalf("cohorts after every member left: %+v", v)
		}
	})
}
