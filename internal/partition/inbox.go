package partition

import "sync"

// inboxShrinkCap is the capacity above which an inbox that empties lets go
// of its buffer: an idle partition holds no more than this many slots, and
// a busy one does not reallocate on every turn.
const inboxShrinkCap = 256

// inbox is the partition's bounded command queue, first in first out. It
// holds up to max commands and grows its buffer only as commands arrive
// (a channel of that bound would reserve it all up front, for every
// partition, idle or not). ready holds a token while commands wait: the
// actor selects on it, and a take that leaves some behind puts it back.
type inbox struct {
	mu    sync.Mutex
	q     []command // waiting, from q[head]
	head  int
	max   int
	ready chan struct{}
}

func newInbox(max int) *inbox {
	return &inbox{max: max, ready: make(chan struct{}, 1)}
}

// put queues c and reports whether there was room.
func (b *inbox) put(c command) bool {
	b.mu.Lock()
	if len(b.q)-b.head >= b.max {
		b.mu.Unlock()
		return false
	}
	if b.head > 0 && len(b.q) == cap(b.q) {
		// Reuse the taken front before growing.
		n := copy(b.q, b.q[b.head:])
		clear(b.q[n:])
		b.q, b.head = b.q[:n], 0
	}
	b.q = append(b.q, c)
	b.mu.Unlock()
	b.signal()
	return true
}

func (b *inbox) signal() {
	select {
	case b.ready <- struct{}{}:
	default:
	}
}

// take appends up to n waiting commands to dst, oldest first, and returns
// it.
func (b *inbox) take(dst []command, n int) []command {
	b.mu.Lock()
	k := min(n, len(b.q)-b.head)
	if k <= 0 {
		b.mu.Unlock()
		return dst
	}
	dst = append(dst, b.q[b.head:b.head+k]...)
	clear(b.q[b.head : b.head+k]) // drop references to payloads and callbacks
	b.head += k
	more := b.head < len(b.q)
	if !more {
		if cap(b.q) > inboxShrinkCap {
			b.q = nil
		} else {
			b.q = b.q[:0]
		}
		b.head = 0
	}
	b.mu.Unlock()
	if more {
		b.signal()
	}
	return dst
}

// len returns how many commands wait.
func (b *inbox) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.q) - b.head
}
