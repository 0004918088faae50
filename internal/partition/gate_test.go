package partition

import (
	"slices"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/internal/vfs"
)

// member is a tconsumer that consumes as a cohort member and records where
// it was told the gate stands.
type member struct {
	tconsumer
	cohort, id string
	gmu        sync.Mutex
	gates      []queue.Gate
}

func (m *member) Cohort() (string, string) { return m.cohort, m.id }
func (m *member) GateMoved(g queue.Gate) {
	m.gmu.Lock()
	defer m.gmu.Unlock()
	m.gates = append(m.gates, g)
}
func (m *member) lastGate() queue.Gate {
	m.gmu.Lock()
	defer m.gmu.Unlock()
	if len(m.gates) == 0 {
		return queue.Gate{}
	}
	return m.gates[len(m.gates)-1]
}

// TestSteerPassesThePartitionBetweenMembers: a steered partition delivers
// only to its member; a move waits until the first member's leases ended,
// delivers nothing meanwhile, and both members hear where the gate went.
// The gate and its epoch survive a reopen.
func TestSteerPassesThePartitionBetweenMembers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := vfs.NewMem()
		p := mustOpen(t, testConfig(fs))
		for _, b := range []string{"a", "b", "c", "d"} {
			mustPublish(t, p, b, nil)
		}
		plain := &tconsumer{owner: "plain", credit: 0}
		m1 := &member{tconsumer: tconsumer{owner: "s1", credit: 2}, cohort: "billing", id: "m1"}
		m2 := &member{tconsumer: tconsumer{owner: "s2", credit: -1}, cohort: "billing", id: "m2"}
		for _, c := range []Consumer{plain, m1, m2} {
			if err := p.Attach(c); err != nil {
				t.Fatal(err)
			}
		}
		p.Steer("billing", "m1")
		synctest.Wait()
		if got := bodies(m1.deliveries()); !slices.Equal(got, []string{"a", "b"}) {
			t.Fatalf("m1 got %v, want [a b] (prefetch 2)", got)
		}
		if n := len(m2.deliveries()); n != 0 {
			t.Fatalf("m2 got %d deliveries while m1 holds the partition", n)
		}
		if g := m2.lastGate(); g.Member != "m1" || g.Epoch != 1 {
			t.Fatalf("m2 was told gate %+v, want m1 at epoch 1", g)
		}
		if d := m1.deliveries()[0]; d.Assignment != 1 {
			t.Fatalf("delivery assignment %d, want 1", d.Assignment)
		}
		// Plain consumers are shut out while a cohort holds the gate.
		plain.addCredit(10)
		p.Poke()

		// The move to m2 waits for m1's two leases; nothing is leased
		// meanwhile, not even to m1 with new credit.
		p.Steer("billing", "m2")
		m1.addCredit(5)
		p.Poke()
		synctest.Wait()
		if got := len(m1.deliveries()); got != 2 {
			t.Fatalf("m1 got %d deliveries while its partition is being moved, want 2", got)
		}
		if n := len(m2.deliveries()); n != 0 {
			t.Fatalf("m2 got %d deliveries before m1's leases ended", n)
		}
		first := m1.deliveries()
		if err := settle(p, Ack, first[0], 0); err != nil {
			t.Fatal(err)
		}
		if err := settle(p, Nack, first[1], 0); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		// b came back by a retry: it reaches m2 before c and d.
		if got := bodies(m2.deliveries()); !slices.Equal(got, []string{"b", "c", "d"}) {
			t.Fatalf("m2 got %v, want [b c d]", got)
		}
		if g := m1.lastGate(); g.Member != "m2" || g.Epoch != 2 {
			t.Fatalf("m1 was told gate %+v, want m2 at epoch 2", g)
		}
		if n := len(plain.deliveries()); n != 0 {
			t.Fatalf("plain consumer got %d deliveries from a cohort's partition", n)
		}
		if g := p.Stats().Gate; g != (queue.Gate{Cohort: "billing", Member: "m2", Epoch: 2}) {
			t.Fatalf("stats gate %+v", g)
		}
		p.Close()

		p = mustOpen(t, testConfig(fs))
		defer p.Close()
		if g := p.Stats().Gate; g != (queue.Gate{Cohort: "billing", Member: "m2", Epoch: 2}) {
			t.Fatalf("gate after reopen %+v", g)
		}
		// Opening the gate again serves plain consumers.
		mustPublish(t, p, "e", nil)
		plain2 := &tconsumer{owner: "plain2", credit: -1}
		if err := p.Attach(plain2); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if n := len(plain2.deliveries()); n != 0 {
			t.Fatalf("plain consumer got %d deliveries while the cohort holds the gate", n)
		}
		p.Steer("", "")
		synctest.Wait()
		// b, c, d are leased to m2's old session (recovered, released after the
		// grace) or ready; e is ready: the plain consumer gets what is ready.
		if got := bodies(plain2.deliveries()); !slices.Contains(got, "e") {
			t.Fatalf("plain consumer got %v after the gate opened, want e among them", got)
		}
	})
}
