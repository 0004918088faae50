package sinew

import (
	"context"
	"sync"
)

// window bounds unconfirmed publishes per endpoint: their count to the broker's
// announced PublishInflightMax, and their body bytes to publishInflightBytesMax.
// Unconfirmed publishes are what the client holds across a reconnect (they are
// sent again on the next connection), so this is also the bound on what a cut
// makes the client keep in memory. A single body larger than the byte bound is
// let through alone. Waiters block on a broadcast channel that is replaced on
// every release, so a release wakes all of them and each re-checks.
type window struct {
	mu      sync.Mutex
	n       int
	max     int
	bytes   int           // body bytes of the n publishes
	waiters int           // acquirers blocked on wake; releases broadcast only to them
	wake    chan struct{} // closed and replaced by a release while waiters > 0
	zero    chan struct{} // closed and replaced when n drops to zero while watched
	watched bool          // idle handed out zero
}

func newWindow(max int) *window {
	return &window{max: max, wake: make(chan struct{}), zero: make(chan struct{})}
}

func (w *window) setMax(max int) {
	if max <= 0 {
		max = publishInflightDefault
	}
	w.mu.Lock()
	grew := max > w.max
	w.max = max
	if grew {
		close(w.wake)
		w.wake = make(chan struct{})
	}
	w.mu.Unlock()
}

// acquire takes a slot for a publish of size body bytes, waiting while the
// window is full.
func (w *window) acquire(ctx context.Context, quit <-chan struct{}, size int) error {
	for {
		w.mu.Lock()
		if w.n < w.max && (w.n == 0 || w.bytes+size <= publishInflightBytesMax) {
			w.n++
			w.bytes += size
			w.mu.Unlock()
			return nil
		}
		wake := w.wake
		w.waiters++
		w.mu.Unlock()
		var err error
		select {
		case <-wake:
		case <-ctx.Done():
			err = ctx.Err()
		case <-quit:
			err = ErrClientClosed
		}
		w.mu.Lock()
		w.waiters--
		w.mu.Unlock()
		if err != nil {
			return err
		}
	}
}

// tryAcquire takes a slot for a publish of size body bytes if one is free
// now, without waiting (a hedged publish is sent only where there is room).
func (w *window) tryAcquire(size int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n < w.max && (w.n == 0 || w.bytes+size <= publishInflightBytesMax) {
		w.n++
		w.bytes += size
		return true
	}
	return false
}

// count returns how many publishes hold a slot.
func (w *window) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.n
}

func (w *window) release(size int) {
	w.mu.Lock()
	w.n--
	w.bytes -= size
	if w.n < 0 {
		panic("sinew: publish window released more often than acquired")
	}
	// Channels are replaced only when someone waits on them, so a window
	// that never fills allocates nothing per publish.
	if w.waiters > 0 {
		close(w.wake)
		w.wake = make(chan struct{})
	}
	if w.n == 0 && w.watched {
		close(w.zero)
		w.zero = make(chan struct{})
		w.watched = false
	}
	w.mu.Unlock()
}

// idle returns nil when nothing is in flight, or a channel closed when that
// next becomes true.
func (w *window) idle() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n == 0 {
		return nil
	}
	w.watched = true
	return w.zero
}

// tracker counts operations in progress (settles) so Close can wait for them.
type tracker struct {
	mu   sync.Mutex
	n    int
	zero chan struct{}
}

func newTracker() *tracker { return &tracker{zero: make(chan struct{})} }

func (t *tracker) add(d int) {
	t.mu.Lock()
	t.n += d
	if t.n < 0 {
		panic("sinew: operation tracker went negative")
	}
	if t.n == 0 {
		close(t.zero)
		t.zero = make(chan struct{})
	}
	t.mu.Unlock()
}

func (t *tracker) idle() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		return nil
	}
	return t.zero
}

// count returns how many operations are in progress.
func (t *tracker) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}
