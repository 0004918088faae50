package queue

import (
	"errors"
	"slices"
	"testing"
)

// relocate appends and applies a Relocate of off carrying a small body and
// returns the LSN it got.
func relocate(t *testing.T, h *harness, off uint64) uint64 {
	t.Helper()
	evs, err := h.s.Relocate(nil, off)
	if err != nil {
		t.Fatal(err)
	}
	evs[0].Msg = &Message{Body: []byte("x")}
	return mustApply(t, h, evs)[0]
}

// TestRelocateMovesBodiesNotIdentity: a relocated message keeps its offset,
// state and lease; only its body location moves, the floor follows the
// lowest live body, settling forgets the location, and a snapshot carries
// it.
func TestRelocateMovesBodiesNotIdentity(t *testing.T) {
	h := &harness{s: New(Config{}), nextLSN: 1}
	enqueueN(t, h, 4, 0) // offsets 1..4
	leases := h.s.Lease(nil, "a", 1, 0)
	mustApply(t, h, leases) // offset 1 inflight
	if got := h.s.BodyFloor(); got != 1 {
		t.Fatalf("floor %d, want 1", got)
	}
	at1 := relocate(t, h, 1)
	at2 := relocate(t, h, 2)
	if h.s.BodyLSN(1) != at1 || h.s.BodyLSN(2) != at2 || h.s.BodyLSN(3) != 3 {
		t.Fatalf("bodies at %d %d %d", h.s.BodyLSN(1), h.s.BodyLSN(2), h.s.BodyLSN(3))
	}
	if got := h.s.BodyFloor(); got != 3 {
		t.Fatalf("floor %d after moving 1 and 2, want 3", got)
	}
	if got, want := h.s.OldestBodies(nil, h.s.NextLSN(), 10), []BodyLoc{{3, 3}, {4, 4}, {1, at1}, {2, at2}}; !slices.Equal(got, want) {
		t.Fatalf("oldest bodies %v, want %v", got, want)
	}
	if in, _ := h.s.Lookup(1, 0); in.State != StateInflight || in.LeaseID != leases[0].LeaseID {
		t.Fatalf("relocated message is %+v, want its lease kept", in)
	}
	// Moving a moved body again supersedes the first copy.
	again := relocate(t, h, 1)
	if got, want := h.s.OldestBodies(nil, h.s.NextLSN(), 10), []BodyLoc{{3, 3}, {4, 4}, {2, at2}, {1, again}}; !slices.Equal(got, want) {
		t.Fatalf("oldest bodies %v, want %v", got, want)
	}
	snap := h.s.Snapshot(nil)
	ack, err := h.s.Ack(nil, 1, leases[0].LeaseID)
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, h, ack)
	if h.s.BodyLSN(1) != 1 {
		t.Fatalf("settled offset 1 still reports body at %d", h.s.BodyLSN(1))
	}
	if _, err := h.s.Relocate(nil, 1); !errors.Is(err, ErrAlreadySettled) {
		t.Fatalf("relocate of a settled offset: %v", err)
	}
	if _, err := h.s.Relocate(nil, h.s.NextLSN()); !errors.Is(err, ErrUnknownOffset) {
		t.Fatalf("relocate past the end: %v", err)
	}
	r, err := Restore(Config{}, snap)
	if err != nil {
		t.Fatal(err)
	}
	if r.BodyLSN(1) != again || r.BodyLSN(2) != at2 || r.BodyFloor() != 3 {
		t.Fatalf("restored bodies %d %d floor %d", r.BodyLSN(1), r.BodyLSN(2), r.BodyFloor())
	}
}

// TestRestoreRejectsBadMoves: a moved entry must name an unsettled message
// and a body LSN above it and below NextLSN.
func TestRestoreRejectsBadMoves(t *testing.T) {
	for name, mod := range map[string]func(s *State){
		"settled offset":  func(s *State) { s.moved[1] = 5 },
		"lsn at offset":   func(s *State) { s.moved[2] = 2 },
		"lsn past end":    func(s *State) { s.moved[2] = s.nextLSN },
		"offset past end": func(s *State) { s.moved[s.nextLSN+3] = s.nextLSN + 4 },
	} {
		h := &harness{s: New(Config{}), nextLSN: 1}
		enqueueN(t, h, 3, 0)
		evs := h.s.Lease(nil, "a", 1, 0)
		mustApply(t, h, evs)
		ack, _ := h.s.Ack(nil, evs[0].Offset, evs[0].LeaseID)
		mustApply(t, h, ack) // offset 1 settled
		mod(h.s)
		if _, err := Restore(Config{}, h.s.Snapshot(nil)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: restore err %v, want ErrCorrupt", name, err)
		}
	}
}
