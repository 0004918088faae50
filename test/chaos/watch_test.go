package chaos_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sinewmq/sinew"
)

// watchEvery spaces the confirm watch's publishes: the resolution of the
// pauses it measures, at a load (50 small messages a second into a queue
// nobody reads) that stays bounded over any run.
const watchEvery = 20 * time.Millisecond

// confirmWatch publishes to the probe queue's partition 0, one publish at a
// time every watchEvery, for the whole fault phase, and keeps, per fault,
// the longest gap between two confirms that ended in the fault's window
// (from the fault's start to the next fault's). A fault's own outage (an
// owner's failover) and whatever follows it (a resumed node costing the new
// owner its lead, a lead handed back) both show there.
type confirmWatch struct {
	mu     sync.Mutex
	last   time.Time
	worst  []time.Duration // per window, the open one last
	ends   []time.Time     // when each window's longest gap ended
	errs   int             // publishes that failed (an application error)
	lastEr error
	stop   chan struct{}
	done   chan struct{}
}

// watchConfirms starts the watch on e's probe.
func (e *clusterEnv) watchConfirms() *confirmWatch {
	w := &confirmWatch{last: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	topic := e.topic + "-probe"
	go func() {
		defer close(w.done)
		tick := time.NewTicker(watchEvery)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, err := e.probe.Publish(ctx, topic, []byte("watch"), sinew.WithPartition(0))
			cancel()
			now := time.Now()
			w.mu.Lock()
			if err != nil {
				w.errs++
				w.lastEr = err
			} else {
				if n := len(w.worst); n > 0 && now.Sub(w.last) > w.worst[n-1] {
					w.worst[n-1], w.ends[n-1] = now.Sub(w.last), now
				}
				w.last = now
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// open starts the window of a new fault.
func (w *confirmWatch) open() {
	w.mu.Lock()
	w.worst = append(w.worst, 0)
	w.ends = append(w.ends, time.Time{})
	w.mu.Unlock()
}

// finish stops the watch and returns the longest gap of each fault's
// window, when each ended, the count of failed publishes and the last
// failure.
func (w *confirmWatch) finish() ([]time.Duration, []time.Time, int, error) {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := len(w.worst); n > 0 && time.Since(w.last) > w.worst[n-1] {
		// A gap still open at the end counts against the last window.
		w.worst[n-1], w.ends[n-1] = time.Since(w.last), time.Now()
	}
	return slices.Clone(w.worst), slices.Clone(w.ends), w.errs, w.lastEr
}

// pauseSummary reads per-fault longest gaps as the goals put them:
// the longest, the median, and whether both are within longest and median.
func pauseSummary(gaps []time.Duration, longest, median time.Duration) (string, error) {
	if len(gaps) == 0 {
		return "no fault was injected", nil
	}
	s := slices.Clone(gaps)
	slices.Sort(s)
	top, mid := s[len(s)-1], s[len(s)/2]
	round := make([]time.Duration, len(gaps))
	for i, g := range gaps {
		round[i] = g.Round(time.Millisecond)
	}
	msg := fmt.Sprintf("longest pause in confirms around each fault %v; longest %v (goal %v), median %v (goal %v)",
		round, top.Round(time.Millisecond), longest, mid.Round(time.Millisecond), median)
	if top > longest || mid > median {
		return msg, fmt.Errorf("confirms paused past the goals: %s", msg)
	}
	return msg, nil
}
