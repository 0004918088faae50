package sinew

import (
	"context"
	"testing"
)

// A buffered delivery the broker reported stale after a resume (markStale)
// never reaches the application, through Messages or All; the others do,
// in order.
func TestStaleBufferedDeliveryDropped(t *testing.T) {
	for _, via := range []string{"Messages", "All"} {
		t.Run(via, func(t *testing.T) {
			e := &endpoint{}
			s := &Subscription{e: e, buf: make(chan *Message, 4), out: make(chan *Message), done: make(chan struct{})}
			if via == "Messages" {
				e.wg.Add(1)
				go s.pump()
			}
			var ms []*Message
			for tag := uint64(1); tag <= 3; tag++ {
				m := &Message{tag: tag, epoch: 1}
				if !s.hold(1, tag, m) {
					t.Fatalf("tag %d not held", tag)
				}
				ms = append(ms, m)
			}
			if n := s.markStale(1, map[uint64]bool{2: true}); n != 1 {
				t.Fatalf("markStale ended %d, want 1", n)
			}
			for _, m := range ms {
				s.buf <- m
			}
			var got []uint64
			if via == "Messages" {
				for len(got) < 2 {
					got = append(got, (<-s.Messages()).tag)
				}
			} else {
				// All reads out directly: feed it what pump would.
				go func() {
					for range ms {
						s.out <- <-s.buf
					}
				}()
				for m, err := range s.All(context.Background()) {
					if err != nil {
						t.Fatal(err)
					}
					got = append(got, m.tag)
					if len(got) == 2 {
						break
					}
				}
			}
			if len(got) != 2 || got[0] != 1 || got[1] != 3 {
				t.Fatalf("the application got tags %v, want [1 3]", got)
			}
			close(s.done)
			e.wg.Wait()
		})
	}
}
