package auth

import (
	"container/list"
	"context"
	"sync"
	"time"
)

// Defaults and bounds of the password-hash scheduler.
const (
	// HashesMaxDefault is how many password hashes run at once unless
	// configured (auth.password_hashes_max). Each argon2id hash with the
	// default parameters holds 19 MiB and a core for about 30 ms.
	HashesMaxDefault = 2
	// HashesMaxLimit bounds the setting: 64 hashes at once is 1.2 GiB.
	HashesMaxLimit = 64
	// SuspectWindow is how long a source address whose password check
	// failed waits behind the others for a hash slot.
	SuspectWindow = 10 * time.Minute
	// suspectsMax bounds the table of recently failed source addresses.
	// Past it the oldest entry goes: a guesser with more addresses than
	// this gets some of its guesses through at the ordinary priority,
	// which is what every guess got without the table.
	suspectsMax = 1 << 16
)

// hashSlots bounds the password hashes in progress and decides who goes
// next when all are taken. Waiters form two queues, each first come, first
// served: checks from source addresses with no failed check in the last
// SuspectWindow go before checks from addresses with one. Peers guessing
// passwords fail, so after their first guess they queue behind every
// address that has not failed, and a legitimate login gets the next free
// slot however many addresses are guessing. A waiter leaves when its
// context ends, holding nothing.
type hashSlots struct {
	mu      sync.Mutex
	free    int
	clean   list.List // of *hashWaiter: sources without a recent failure
	suspect list.List // of *hashWaiter: sources with one
}

type hashWaiter struct {
	ready   chan struct{} // closed when the slot is handed over
	granted bool          // under mu
}

func newHashSlots(n int) *hashSlots { return &hashSlots{free: n} }

// acquire waits for a slot. It returns ctx's error, holding nothing, if ctx
// ends first.
func (s *hashSlots) acquire(ctx context.Context, suspect bool) error {
	s.mu.Lock()
	if s.free > 0 {
		// A free slot means nobody waits: release hands slots to waiters
		// before it frees them.
		s.free--
		s.mu.Unlock()
		return nil
	}
	if err := ctx.Err(); err != nil {
		s.mu.Unlock()
		return err
	}
	w := &hashWaiter{ready: make(chan struct{})}
	q := &s.clean
	if suspect {
		q = &s.suspect
	}
	e := q.PushBack(w)
	s.mu.Unlock()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if w.granted {
		// Handed over as ctx ended: the slot is ours, use it.
		return nil
	}
	q.Remove(e)
	return ctx.Err()
}

// release returns a slot: to the first clean waiter, else to the first
// suspect one, else to the free count.
func (s *hashSlots) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range []*list.List{&s.clean, &s.suspect} {
		if e := q.Front(); e != nil {
			w := q.Remove(e).(*hashWaiter)
			w.granted = true
			close(w.ready)
			return
		}
	}
	s.free++
}

// waiting returns the number of waiters, clean and suspect.
func (s *hashSlots) waiting() (clean, suspect int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clean.Len(), s.suspect.Len()
}

// suspects remembers the source addresses whose password check failed in
// the last SuspectWindow, at most suspectsMax of them.
type suspects struct {
	mu    sync.Mutex
	at    map[string]*list.Element // source -> its entry in order
	order list.List                // of *suspectEntry, by latest failure, oldest first
}

type suspectEntry struct {
	source string
	at     time.Time
}

// note records a failure from source at now.
func (s *suspects) note(source string, now time.Time) {
	if source == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.at == nil {
		s.at = make(map[string]*list.Element)
	}
	if e, ok := s.at[source]; ok {
		e.Value.(*suspectEntry).at = now
		s.order.MoveToBack(e)
	} else {
		s.at[source] = s.order.PushBack(&suspectEntry{source, now})
	}
	s.prune(now)
}

// is reports whether source failed within SuspectWindow of now.
func (s *suspects) is(source string, now time.Time) bool {
	if source == "" {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.prune(now)
	_, ok := s.at[source]
	return ok
}

// prune drops the entries older than the window, and the oldest past
// suspectsMax.
func (s *suspects) prune(now time.Time) {
	for e := s.order.Front(); e != nil; e = s.order.Front() {
		se := e.Value.(*suspectEntry)
		if now.Sub(se.at) < SuspectWindow && s.order.Len() <= suspectsMax {
			return
		}
		s.order.Remove(e)
		delete(s.at, se.source)
	}
}

// len returns the number of addresses remembered.
func (s *suspects) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.at)
}
