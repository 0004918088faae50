package partition

import (
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// The raft inbox keeps messages in order, refuses past raftInboundMax,
// holds no buffer while empty, and reuses only a small slice.
func TestRaftInboxBoundedAndReleased(t *testing.T) {
	var b raftInbox
	if q := b.take(); q != nil {
		t.Fatalf("an empty inbox gave %d messages", len(q))
	}
	for i := range raftInboundMax {
		if !b.put(&raftpb.Message{Index: uint64(i)}) {
			t.Fatalf("put %d refused below the bound", i)
		}
	}
	if b.put(&raftpb.Message{}) {
		t.Fatal("a message past raftInboundMax was taken")
	}
	q := b.take()
	if len(q) != raftInboundMax {
		t.Fatalf("took %d, want %d", len(q), raftInboundMax)
	}
	for i, m := range q {
		if m.Index != uint64(i) {
			t.Fatalf("message %d has index %d: out of order", i, m.Index)
		}
	}
	b.done(q)
	if b.q != nil || b.spare != nil {
		t.Fatalf("a drained inbox keeps %d + %d slots after a burst", cap(b.q), cap(b.spare))
	}
	if !b.put(&raftpb.Message{Index: 7}) {
		t.Fatal("put refused after a drain")
	}
	small := b.take()
	b.done(small)
	if b.spare == nil || len(b.spare) != 0 {
		t.Fatal("a small slice is not kept for reuse")
	}
	if small[0] != nil {
		t.Fatal("a processed slice still references its message")
	}
	b.put(&raftpb.Message{Index: 8})
	if b.spare != nil || cap(b.q) == 0 || b.q[0].Index != 8 {
		t.Fatal("the next message did not reuse the spare slice")
	}
}
