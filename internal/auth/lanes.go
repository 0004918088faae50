package auth

import (
	"context"
	"sync"
)

// Lanes serialises password checks per source address. A password check
// costs an argon2id hash (tens of milliseconds of CPU and 19 MiB), so peers
// guessing passwords in a loop could otherwise keep every hash slot busy and
// starve the broker's work. A caller holds its address's lane for the check
// and, when the check fails, through the failure delay too: one address then
// gets at most one wrong password per failure delay, however many
// connections it opens, while other addresses are not slowed.
//
// A lane exists only while someone holds or waits for it, so the table is
// bounded by the callers in flight (the handshakes in progress). Lanes is
// safe for concurrent use.
type Lanes struct {
	mu    sync.Mutex
	lanes map[string]*lane
}

type lane struct {
	token chan struct{} // cap 1: full while held
	users int           // holders and waiters; the lane goes at 0
}

// Acquire waits for key's lane and returns the function that releases it.
// It returns ctx's error, holding nothing, if ctx ends first.
func (l *Lanes) Acquire(ctx context.Context, key string) (release func(), err error) {
	l.mu.Lock()
	if l.lanes == nil {
		l.lanes = make(map[string]*lane)
	}
	ln := l.lanes[key]
	if ln == nil {
		ln = &lane{token: make(chan struct{}, 1)}
		l.lanes[key] = ln
	}
	ln.users++
	l.mu.Unlock()
	select {
	case ln.token <- struct{}{}:
	case <-ctx.Done():
		l.leave(key, ln)
		return nil, ctx.Err()
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			<-ln.token
			l.leave(key, ln)
		})
	}, nil
}

func (l *Lanes) leave(key string, ln *lane) {
	l.mu.Lock()
	if ln.users--; ln.users == 0 {
		delete(l.lanes, key)
	}
	l.mu.Unlock()
}

// Len returns the number of lanes held or waited for.
func (l *Lanes) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lanes)
}
