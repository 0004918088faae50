package testkit

import (
	"context"
	"sort"
	"sync"
	"time"
)

// Clock is a fake clock. Time stands still until Advance moves it; timers
// created with After fire when the clock reaches their deadline. Every After
// call is recorded so tests can check the waits a component asked for.
type Clock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*fakeTimer
	waits   []time.Duration
	changed chan struct{} // closed and replaced whenever a timer is added
}

type fakeTimer struct {
	at time.Time
	d  time.Duration
	ch chan time.Time
}

// NewClock returns a fake clock reading start.
func NewClock(start time.Time) *Clock { return &Clock{now: start, changed: make(chan struct{})} }

// Now returns the fake time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After returns a channel that receives the fake time once the clock has been
// advanced by d. A non-positive d fires at once.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	c.waits = append(c.waits, d)
	close(c.changed)
	c.changed = make(chan struct{})
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.timers = append(c.timers, &fakeTimer{at: c.now.Add(d), d: d, ch: ch})
	return ch
}

// Advance moves the clock forward by d and fires every timer that is due, in
// deadline order.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	sort.SliceStable(c.timers, func(i, j int) bool { return c.timers[i].at.Before(c.timers[j].at) })
	keep := c.timers[:0]
	for _, t := range c.timers {
		if !t.at.After(c.now) {
			t.ch <- c.now
		} else {
			keep = append(keep, t)
		}
	}
	c.timers = keep
}

// Waits returns every duration passed to After so far, in call order.
func (c *Clock) Waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waits...)
}

// Pending returns the durations of the timers that have not fired, in
// creation order.
func (c *Clock) Pending() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]time.Duration, len(c.timers))
	for i, t := range c.timers {
		out[i] = t.d
	}
	return out
}

// WaitForWaits blocks until After has been called at least n times in total,
// or ctx ends. It returns the recorded durations.
func (c *Clock) WaitForWaits(ctx context.Context, n int) ([]time.Duration, error) {
	for {
		c.mu.Lock()
		if len(c.waits) >= n {
			out := append([]time.Duration(nil), c.waits...)
			c.mu.Unlock()
			return out, nil
		}
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return c.Waits(), ctx.Err()
		}
	}
}
