package sinew

import (
	"testing"

	"github.com/sinewmq/sinew/protocol"
)

// resendHeld has the fake broker write the DELIVER of every lease the session
// holds again, as a broker does after a resume.
func (b *fakeBroker) resendHeld() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range b.sessions {
		for tag := uint64(1); tag <= s.nextTag; tag++ {
			l := s.tags[tag]
			if l == nil || s.conn == nil {
				continue
			}
			s.conn.write(0, 0, &protocol.Deliver{SubID: l.sub.id, Tag: tag, Offset: l.msg.offset,
				Attempt: l.msg.attempt, Body: l.msg.pub.Body, Topic: l.sub.q.name})
		}
	}
}

// TestResentDeliveryIsDeduplicatedByTag: a DELIVER whose tag the client already
// holds unsettled does not reach the application again; once settled, the tag
// is forgotten.
func TestResentDeliveryIsDeduplicatedByTag(t *testing.T) {
	b := newFakeBroker(t)
	c := dialT(t, b.addr())
	ctx := testCtx(t)
	sub, err := c.Subscribe(ctx, "dedupe", WithPrefetch(8))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"one", "two"} {
		if _, err := c.PublishText(ctx, "dedupe", s); err != nil {
			t.Fatal(err)
		}
	}
	m1, m2 := recv(t, sub), recv(t, sub)
	if m1.Text() != "one" || m2.Text() != "two" {
		t.Fatalf("got %q, %q", m1.Text(), m2.Text())
	}
	if err := m1.Complete(ctx); err != nil {
		t.Fatal(err)
	}
	b.resendHeld() // tag of "two" again: held, so dropped
	if _, err := c.PublishText(ctx, "dedupe", "three"); err != nil {
		t.Fatal(err)
	}
	// Frames on one connection keep their order: a duplicate of "two" would
	// come before "three".
	if m := recv(t, sub); m.Text() != "three" {
		t.Fatalf("after the re-send got %q (tag %d), want three", m.Text(), m.tag)
	}
	if err := m2.Complete(ctx); err != nil {
		t.Fatalf("Complete of the held delivery: %v", err)
	}
	sub.heldMu.Lock()
	n := len(sub.held)
	sub.heldMu.Unlock()
	if n != 1 {
		t.Fatalf("%d tags held, want 1 (three)", n)
	}
}

// TestHeldTagsBounded: deliveries never settled (their leases expired) do not
// grow the held set past its bound; the oldest tag goes first.
func TestHeldTagsBounded(t *testing.T) {
	s := &Subscription{heldMax: 4}
	for tag := uint64(1); tag <= 100; tag++ {
		if !s.hold(1, tag, nil) {
			t.Fatalf("tag %d reported as a duplicate", tag)
		}
	}
	if len(s.held) != heldSlackTags {
		t.Fatalf("held %d tags, want the bound %d", len(s.held), heldSlackTags)
	}
	if s.hold(1, 100, nil) {
		t.Fatal("a held tag was not reported as a duplicate")
	}
	if !s.hold(1, 1, nil) {
		t.Fatal("the oldest tag should have been forgotten")
	}
	// A new session epoch starts over.
	if !s.hold(2, 100, nil) || len(s.held) != 1 {
		t.Fatalf("new epoch: held %v", s.held)
	}
	s.release(1, 100) // stale epoch: ignored
	if len(s.held) != 1 {
		t.Fatal("release from an old epoch removed a tag")
	}
}
