package partition

import (
	"testing"
)

// The inbox hands commands out oldest first, refuses past its bound, keeps
// a ready token while commands wait (a partial take puts it back), and
// lets go of a large buffer once it empties.
func TestInboxOrderBoundAndShrink(t *testing.T) {
	b := newInbox(600)
	for i := range 600 {
		if !b.put(command{offset: uint64(i)}) {
			t.Fatalf("put %d refused below the bound", i)
		}
	}
	if b.put(command{offset: 600}) {
		t.Fatal("put past the bound accepted")
	}
	if b.len() != 600 {
		t.Fatalf("len %d, want 600", b.len())
	}
	next := uint64(0)
	for b.len() > 0 {
		select {
		case <-b.ready:
		default:
			t.Fatalf("%d commands wait without a ready token", b.len())
		}
		got := b.take(nil, 250)
		for _, c := range got {
			if c.offset != next {
				t.Fatalf("took offset %d, want %d", c.offset, next)
			}
			next++
		}
	}
	if next != 600 {
		t.Fatalf("took %d commands, want 600", next)
	}
	select {
	case <-b.ready:
		t.Fatal("a ready token with nothing waiting after the last take")
	default:
	}
	if b.q != nil {
		t.Fatalf("an emptied inbox keeps a buffer of %d slots, want none above %d", cap(b.q), inboxShrinkCap)
	}
	// Room again, and the front that was taken is reused before growing.
	for round := range 3 {
		for i := range 100 {
			if !b.put(command{offset: uint64(i)}) {
				t.Fatalf("round %d: put %d refused", round, i)
			}
		}
		if got := b.take(nil, 60); len(got) != 60 || got[0].offset != 0 {
			t.Fatalf("round %d: took %d from %v", round, len(got), got[0].offset)
		}
		if got := b.take(nil, 1000); len(got) != 40 || got[0].offset != 60 {
			t.Fatalf("round %d: took %d more, first %d", round, len(got), got[0].offset)
		}
	}
	if cap(b.q) > inboxShrinkCap {
		t.Fatalf("a small inbox grew to %d slots", cap(b.q))
	}
}
