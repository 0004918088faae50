// Package budget is Sinew's node-wide memory accountant: named budgets with
// a byte limit, shared by the caches of every partition on the node, so that
// the memory of a cache no longer multiplies with the partition count.
//
// # Shape
//
// A Budget has a limit and a used figure. Each cache (one per partition)
// joins it as a Share. The cache accounts its own bytes with Share.Add and
// Share.Sub, which touch only the share's own fields: the share reserves
// from the budget in chunks (Budget.Chunk bytes, one atomic add per chunk),
// so the hot path takes no global lock and touches the shared counter once
// per chunk, not once per entry. Used is therefore the sum of the chunks
// reserved, at most one chunk per share above what the caches hold.
//
// When a reservation takes the budget past its limit, Add reports it and the
// caller, once it has let go of its own cache's lock, calls Budget.Reclaim.
// Reclaim (serialised by the budget's lock, taken only when over the limit)
// orders the shares by the stamp of their oldest entry, in one pass, and
// asks the coldest to give back bytes, then the next coldest, until
// the budget is a thirty-second below its limit (so a full budget reclaims
// once per that much reserved, not once per chunk) or nothing more can be
// freed. Each cache
// stamps its entries with Budget.Stamp, a logical clock that advances once per
// chunk reserved anywhere, and publishes the stamp of its oldest entry with
// Share.SetColdest; a share holding nothing is the coldest of all and gives
// back its spare chunk first. Eviction is the cache's own (Cache.Evict), run
// under the cache's own lock from the reclaiming goroutine.
//
// The limit is a target, not a hard wall: between a reservation and the
// Reclaim that follows it the budget may be over by the chunks reserved
// meanwhile (at most one per share), and a cache may keep one entry larger
// than what Reclaim asks of it. Both are bounded.
package budget

import (
	"container/heap"
	"sync"
	"sync/atomic"
)

// Chunk sizes.
const (
	chunkMin = 4 << 10
	chunkMax = 256 << 10
	// chunkDivisor: a budget reserves in chunks of limit/chunkDivisor,
	// clamped to [chunkMin, chunkMax].
	chunkDivisor = 256
	// reclaimDivisor: Reclaim frees down to limit - limit/reclaimDivisor.
	reclaimDivisor = 32
)

// Cache is what a share's owner implements so that Reclaim can make it give
// memory back. Evict is called from any goroutine, never concurrently with
// itself for one share; it takes the cache's own lock, frees about want bytes
// of its oldest entries (it may free less when it holds less), subtracts them
// from its share with Share.Sub, updates Share.SetColdest, and returns the
// bytes it freed.
type Cache interface {
	Evict(want int64) int64
}

// Budget is one named node-wide limit. Its methods are safe for concurrent
// use.
type Budget struct {
	name  string
	limit atomic.Int64
	chunk atomic.Int64
	used  atomic.Int64 // sum of the shares' reservations
	clock atomic.Uint64

	mu     sync.Mutex // guards shares and heap; serialises Reclaim
	shares map[*Share]struct{}
	heap   coldHeap // Reclaim's scratch, kept between calls (no share pointers left in it)
	// evictions counts bytes given back under pressure.
	evicted atomic.Int64
}

// New returns a budget named name with limit bytes (at least 0).
func New(name string, limit int64) *Budget {
	b := &Budget{name: name, shares: make(map[*Share]struct{})}
	b.SetLimit(limit)
	return b
}

// Name returns the budget's name.
func (b *Budget) Name() string { return b.name }

// Limit returns the budget's limit in bytes.
func (b *Budget) Limit() int64 { return b.limit.Load() }

// Used returns the bytes reserved by every share.
func (b *Budget) Used() int64 { return b.used.Load() }

// Evicted returns the bytes given back under pressure since New.
func (b *Budget) Evicted() int64 { return b.evicted.Load() }

// Chunk returns the reservation granularity.
func (b *Budget) Chunk() int64 { return b.chunk.Load() }

// SetLimit changes the limit (negative is taken as 0). A lower limit takes
// effect at the next Reclaim; the caller may call Reclaim itself.
func (b *Budget) SetLimit(limit int64) {
	limit = max(limit, 0)
	b.limit.Store(limit)
	b.mu.Lock()
	b.resizeChunk()
	b.mu.Unlock()
}

// resizeChunk sets the chunk to limit/chunkDivisor, smaller when many shares
// joined (at most a quarter of the limit spare over all shares), clamped to
// [chunkMin, chunkMax] and to at most limit/8. Caller holds mu.
func (b *Budget) resizeChunk() {
	limit := b.limit.Load()
	div := max(int64(chunkDivisor), 4*int64(len(b.shares)))
	// Never above an eighth of the limit, so a small budget still holds
	// something.
	b.chunk.Store(max(min(max(limit/div, chunkMin), chunkMax, limit/8), 1))
}

// Stamp returns the budget's logical clock, for a cache to stamp an entry
// with when it puts it. It advances once per chunk reserved on the budget,
// so entries put in the same chunk's time share a stamp.
func (b *Budget) Stamp() uint64 { return b.clock.Load() }

// Over reports whether the budget is past its limit.
func (b *Budget) Over() bool { return b.used.Load() > b.limit.Load() }

// Join registers a cache and returns its share. The owner must call Leave
// when the cache goes away. Reclaim may call c.Evict as soon as Join
// returns, so the owner stores the share under the lock Evict takes.
func (b *Budget) Join(c Cache) *Share {
	s := &Share{b: b, c: c}
	b.mu.Lock()
	b.shares[s] = struct{}{}
	b.resizeChunk()
	b.mu.Unlock()
	return s
}

// Reclaim makes the coldest caches give back memory until the budget is
// within its limit, or no cache frees anything. Call it without holding any
// cache's lock, after Share.Add reported the budget over its limit.
func (b *Budget) Reclaim() {
	if !b.Over() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	// Reclaim down to a little below the limit, so that a full budget
	// reclaims once per limit/reclaimDivisor bytes reserved, not once
	// per chunk.
	target := func() int64 { l := b.limit.Load(); return l - l/reclaimDivisor }
	if b.used.Load() <= target() {
		return
	}
	// One pass over the shares builds a heap ordered by coldest stamp;
	// each round evicts from its top. A share that frees something goes
	// back in at its new coldest stamp while it still holds entries; one
	// that frees nothing, or is left empty, leaves the heap. So a reclaim
	// costs one pass plus a logarithmic step per round, however many
	// shares joined (most of them empty, on a node of many idle
	// partitions), and it ends: every round frees something or shrinks
	// the heap.
	h := b.heap[:0]
	for s := range b.shares {
		h = append(h, coldShare{s, s.coldest.Load()})
	}
	heap.Init(&h)
	for over := b.used.Load() - target(); over > 0 && len(h) > 0; over = b.used.Load() - target() {
		s := h[0].s
		freed := s.c.Evict(over)
		if freed > 0 {
			b.evicted.Add(freed)
		}
		if c := s.coldest.Load(); freed > 0 && c != 0 {
			h[0].cold = c
			heap.Fix(&h, 0)
		} else {
			// Drop the top without heap.Pop, whose any result allocates.
			last := len(h) - 1
			h[0], h[last] = h[last], coldShare{}
			if h = h[:last]; len(h) > 0 {
				heap.Fix(&h, 0)
			}
		}
	}
	clear(h) // dropped slots were zeroed as they went
	b.heap = h[:0]
}

// coldShare is a share in Reclaim's heap, with the coldest stamp it had
// when it went in.
type coldShare struct {
	s    *Share
	cold uint64
}

// coldHeap is a min-heap of shares by coldest stamp (container/heap).
type coldHeap []coldShare

func (h coldHeap) Len() int           { return len(h) }
func (h coldHeap) Less(i, j int) bool { return h[i].cold < h[j].cold }
func (h coldHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *coldHeap) Push(x any)        { *h = append(*h, x.(coldShare)) }
func (h *coldHeap) Pop() any { // heap.Interface's; Reclaim drops the top itself
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = coldShare{}
	*h = old[:len(old)-1]
	return x
}

// Share is one cache's part of a budget. Add, Sub and Leave must be called
// under the cache's own lock (or from its single owner goroutine, if Evict
// takes the same lock), so that they never run at once for one share.
type Share struct {
	b        *Budget
	c        Cache
	used     int64 // bytes the cache holds
	reserved int64 // bytes reserved from b: used <= reserved < used+chunk, after Add
	// coldest is the stamp of the cache's oldest entry; 0 when it holds
	// nothing, so an empty share is asked first (for its spare chunk).
	coldest atomic.Uint64
	left    bool
}

// Budget returns the share's budget.
func (s *Share) Budget() *Budget { return s.b }

// Used returns the bytes the cache accounted (under the cache's lock).
func (s *Share) Used() int64 { return s.used }

// Add accounts n more bytes held by the cache. It reports whether the budget
// is now over its limit: the caller should then call Budget.Reclaim once it
// has released the cache's lock.
func (s *Share) Add(n int64) (over bool) {
	s.used += n
	if s.used <= s.reserved || s.left {
		return false
	}
	chunk := s.b.chunk.Load()
	grab := (s.used - s.reserved + chunk - 1) / chunk * chunk
	s.reserved += grab
	used := s.b.used.Add(grab)
	s.b.clock.Add(1)
	return used > s.b.limit.Load()
}

// Sub accounts n bytes the cache no longer holds. The share keeps at most one
// chunk spare; the rest goes back to the budget.
func (s *Share) Sub(n int64) {
	s.used -= n
	if s.used < 0 {
		s.used = 0 // a cache accounting bug must not poison the budget
	}
	if s.left {
		return
	}
	if spare := s.reserved - s.used; spare > s.b.chunk.Load() {
		give := spare - s.b.chunk.Load()
		if s.used == 0 {
			give = spare // an emptied cache keeps nothing back
		}
		s.reserved -= give
		s.b.used.Add(-give)
	}
}

// Trim gives back the share's spare reservation (what it reserved beyond
// what the cache holds). Evict implementations call it after freeing.
func (s *Share) Trim() {
	if s.left {
		return
	}
	if spare := s.reserved - s.used; spare > 0 {
		s.reserved -= spare
		s.b.used.Add(-spare)
	}
}

// SetColdest publishes the stamp of the cache's oldest entry (0 when empty).
func (s *Share) SetColdest(stamp uint64) { s.coldest.Store(stamp) }

// Leave unregisters the share and returns its reservation. Unlike Add and
// Sub it must be called WITHOUT the cache's lock held (it waits for a Reclaim
// that may be evicting from the cache), by the owner once it no longer adds.
// Add and Sub are no-ops on the budget afterwards.
func (s *Share) Leave() {
	s.b.mu.Lock()
	delete(s.b.shares, s)
	s.b.resizeChunk()
	s.b.mu.Unlock()
	if s.left {
		return
	}
	s.left = true
	s.b.used.Add(-s.reserved)
	s.reserved, s.used = 0, 0
}
