package sinew

import (
	"context"
	"errors"
	"testing"
)

// TestWindowBoundsBytes: the publish window holds at most
// publishInflightBytesMax of bodies, except that one body larger than that
// goes through alone.
func TestWindowBoundsBytes(t *testing.T) {
	w := newWindow(100)
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := w.acquire(ctx, nil, publishInflightBytesMax-1); err != nil {
		t.Fatal(err)
	}
	if err := w.acquire(cancelled, nil, 2); !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire over the byte bound = %v, want it to wait (until ctx ended)", err)
	}
	if err := w.acquire(ctx, nil, 1); err != nil {
		t.Fatalf("acquire up to the byte bound: %v", err)
	}
	w.release(publishInflightBytesMax - 1)
	w.release(1)
	if err := w.acquire(cancelled, nil, 2*publishInflightBytesMax); err != nil {
		t.Fatalf("one oversized body alone: %v", err)
	}
	if err := w.acquire(cancelled, nil, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire beside an oversized body = %v, want it to wait", err)
	}
	w.release(2 * publishInflightBytesMax)
}
