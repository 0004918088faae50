package auth

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
)

// One holder per key at a time; other keys are not held up; a waiter whose
// context ends leaves without the lane; the table empties when nobody holds
// or waits.
func TestLanes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var l Lanes
		ctx := context.Background()
		rel1, err := l.Acquire(ctx, "10.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		relOther, err := l.Acquire(ctx, "10.0.0.2") // another address: at once
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan func(), 1)
		go func() {
			rel, err := l.Acquire(ctx, "10.0.0.1")
			if err != nil {
				t.Error(err)
			}
			got <- rel
		}()
		cctx, cancel := context.WithCancel(ctx)
		gaveUp := make(chan error, 1)
		go func() {
			_, err := l.Acquire(cctx, "10.0.0.1")
			gaveUp <- err
		}()
		synctest.Wait()
		select {
		case <-got:
			t.Fatal("a second holder of the same lane")
		default:
		}
		cancel()
		if err := <-gaveUp; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled waiter: %v", err)
		}
		rel1()
		rel1() // a second release is a no-op
		rel2 := <-got
		relOther()
		rel2()
		if n := l.Len(); n != 0 {
			t.Fatalf("%d lanes left", n)
		}
	})
}
