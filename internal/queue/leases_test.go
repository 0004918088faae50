package queue

import "testing"

// TestLeasesListsEveryOwner: Leases is Inflight without the owner filter,
// and forgets settled and requeued leases.
func TestLeasesListsEveryOwner(t *testing.T) {
	h := &harness{s: New(Config{}), nextLSN: 1}
	enqueueN(t, h, 4, 0)
	mustApply(t, h, h.s.Lease(nil, "a", 2, 0))
	mustApply(t, h, h.s.Lease(nil, "b", 2, 0))
	a := h.s.Inflight("a")
	evs, err := h.s.Ack(nil, a[0].Offset, a[0].LeaseID)
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, h, evs)
	b := h.s.Inflight("b")
	evs, err = h.s.Release(nil, b[1].Offset, b[1].LeaseID, 0)
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, h, evs)
	got := h.s.Leases()
	if len(got) != 2 || got[0] != a[1] || got[1] != b[0] {
		t.Fatalf("Leases() = %+v, want [%+v %+v]", got, a[1], b[0])
	}
}
