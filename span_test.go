package sinew

import (
	"context"
	"sync"
	"testing"
)

// newTestSpan makes a spanning subscription on c without asking METADATA
// (the fake broker does not answer it), as subscribeSpan does after it.
func newTestSpan(t *testing.T, c *Client, topic string) *span {
	t.Helper()
	s := &Subscription{e: c.ep, topic: topic, cfg: subscribeConfig{partition: -1},
		out: make(chan *Message), done: make(chan struct{}), pumpDone: make(chan struct{})}
	sp := &span{c: c, s: s, poke: make(chan struct{}, 1), stop: make(chan struct{}),
		ran: make(chan struct{}), parts: map[string]*Subscription{}, owners: map[uint32]owned{}}
	s.span = sp
	if !c.addSpan(sp) {
		t.Fatal("client closed")
	}
	return sp
}

// Concurrent opens on one node (the refresh loop and the settles of a
// failover all open parts) make one subscription there, and after the
// spanning subscription ends nothing is delivered into its closed channel.
func TestSpanOpensOnePartPerNodeAndClosesAfterItsPumps(t *testing.T) {
	b := newFakeBroker(t)
	c := dialT(t, b.addr())
	ctx := testCtx(t)
	sp := newTestSpan(t, c, "span")
	go sp.run()
	var wg sync.WaitGroup
	parts := make([]*Subscription, 8)
	for i := range parts {
		wg.Go(func() {
			p, err := sp.open(ctx, c.ep.addr)
			if err != nil {
				t.Errorf("open: %v", err)
			}
			parts[i] = p
		})
	}
	wg.Wait()
	for _, p := range parts[1:] {
		if p != parts[0] {
			t.Fatalf("concurrent opens on one node made different subscriptions")
		}
	}
	b.mu.Lock()
	subs := 0
	for _, s := range b.sessions {
		subs += len(s.subs)
	}
	b.mu.Unlock()
	if subs != 1 {
		t.Fatalf("the broker holds %d subscriptions, want 1", subs)
	}
	if _, err := c.Publish(ctx, "span", []byte("a")); err != nil {
		t.Fatal(err)
	}
	if m := recv(t, sp.s); string(m.Body) != "a" {
		t.Fatalf("delivered %q", m.Body)
	}
	if err := sp.s.Unsubscribe(ctx); err != nil {
		t.Fatal(err)
	}
	// Messages published after the end reach no one: the channel is
	// closed once every part's pump stopped, never sent on after.
	for range 20 {
		if _, err := c.Publish(ctx, "span", []byte("late")); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := <-sp.s.Messages(); ok {
		t.Fatal("a message arrived after Unsubscribe")
	}
	select {
	case <-sp.ran:
	case <-ctx.Done():
		t.Fatal("the span's loop did not end")
	}
	if _, err := sp.open(context.Background(), c.ep.addr); err == nil {
		t.Fatal("open after the end made a part")
	}
}

// Close ends a spanning subscription that has no part left.
func TestCloseEndsASpanWithoutParts(t *testing.T) {
	b := newFakeBroker(t)
	c := dialT(t, b.addr())
	sp := newTestSpan(t, c, "empty")
	go sp.run()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-sp.ran:
	default:
		t.Fatal("Close returned before the span's loop ended")
	}
	if _, ok := <-sp.s.Messages(); ok {
		t.Fatal("Messages still open after Close")
	}
	if err := sp.s.Err(); err != ErrClientClosed {
		t.Fatalf("Err = %v, want ErrClientClosed", err)
	}
}
