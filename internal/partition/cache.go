package partition

import (
	"sort"
	"sync"

	"github.com/sinewmq/sinew/internal/budget"
)

// bodyCache keeps the encoded Enqueue payloads of recently published
// messages so that a consumer keeping up with producers is served without a
// log read. Its bytes count against a budget shared by every partition of
// the node (Config.BodyBudget; a private one of Config.BodyCacheBytes when
// none is given): when the budget is full, the partition whose oldest
// entry is the coldest gives back, oldest first. It is also bounded in
// entries. The actor puts and gets; a reclaim running on another
// partition's goroutine may evict, so the entries are under mu (never
// contended but for that). Payloads are never modified once cached.
//
// Offsets are put in increasing order (the leader proposes in log order), so
// the entries are a slice sorted by offset, trimmed at the front: a put is an
// append and a lookup a binary search, with no map to grow or rehash. A put
// at or below the last offset (never done today) drops the entries from it
// on, so the order holds.
type bodyCache struct {
	bud   *budget.Budget // nil: caching disabled
	mu    sync.Mutex
	share *budget.Share // joined at the first put, left by close
	bytes int
	ents  []cachedBody // ents[head:] are live, sorted by offset
	head  int
	// cold is the oldest entry's stamp as last published to the share
	// (an atomic store, made only when it changes).
	cold uint64
}

type cachedBody struct {
	off     uint64
	stamp   uint64 // budget.Stamp when put
	payload []byte
}

// cacheEntriesMax bounds the entry count, so tiny messages cannot make the
// index outgrow the byte budget.
const cacheEntriesMax = 1 << 16

// cacheEntryBytes is what an entry costs besides its payload: its slot in
// ents and the payload's allocation rounding, roughly.
const cacheEntryBytes = 64

// cacheKeepEnts is the capacity an emptied cache keeps; a larger array goes.
const cacheKeepEnts = 256

func entryCost(payload []byte) int { return len(payload) + cacheEntryBytes }

// newBodyCache returns a cache charging bud, or, with bud nil, a private
// budget of bytesMax (none when bytesMax <= 0).
func newBodyCache(bytesMax int, bud *budget.Budget) *bodyCache {
	if bud == nil && bytesMax > 0 {
		bud = budget.New("body_cache", int64(bytesMax))
	}
	return &bodyCache{bud: bud}
}

func (c *bodyCache) put(off uint64, payload []byte) {
	if c.bud == nil || int64(len(payload)) > c.bud.Limit()/4 {
		return
	}
	c.mu.Lock()
	if c.share == nil {
		c.share = c.bud.Join(c)
	}
	if n := len(c.ents); n > c.head && c.ents[n-1].off >= off {
		c.dropFrom(c.search(off))
	}
	c.ents = append(c.ents, cachedBody{off, c.bud.Stamp(), payload})
	cost := entryCost(payload)
	c.bytes += cost
	over := c.share.Add(int64(cost))
	if len(c.ents)-c.head > cacheEntriesMax {
		c.evictLocked(1)
	}
	c.compact()
	c.coldest()
	c.mu.Unlock()
	if over {
		c.bud.Reclaim()
	}
}

// dropFrom drops the entries from index i on. Caller holds mu.
func (c *bodyCache) dropFrom(i int) {
	var freed int
	for _, e := range c.ents[i:] {
		freed += entryCost(e.payload)
	}
	clear(c.ents[i:])
	c.ents = c.ents[:i]
	c.bytes -= freed
	c.share.Sub(int64(freed))
}

// evictLocked drops the oldest entries until want bytes are freed or the
// cache is empty, and returns the bytes freed. Caller holds mu.
func (c *bodyCache) evictLocked(want int) int {
	freed := 0
	for freed < want && c.head < len(c.ents) {
		freed += entryCost(c.ents[c.head].payload)
		c.ents[c.head] = cachedBody{}
		c.head++
	}
	c.bytes -= freed
	if c.share != nil {
		c.share.Sub(int64(freed))
	}
	return freed
}

// compact moves the live entries to the front once the dead prefix is
// large, and lets a large array go once the cache is empty. Caller holds
// mu.
func (c *bodyCache) compact() {
	switch {
	case c.head == len(c.ents):
		if cap(c.ents) > cacheKeepEnts {
			c.ents = nil
		} else {
			c.ents = c.ents[:0]
		}
		c.head = 0
	case c.head > len(c.ents)/2 && c.head > 1024:
		n := copy(c.ents, c.ents[c.head:])
		clear(c.ents[n:])
		c.ents = c.ents[:n]
		c.head = 0
	}
}

// Evict is budget.Cache's: give back about want bytes, oldest first.
func (c *bodyCache) Evict(want int64) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	freed := c.evictLocked(int(min(want, int64(c.bytes))))
	c.compact()
	c.coldest()
	if c.share != nil {
		c.share.Trim()
	}
	return int64(freed)
}

// coldest publishes the oldest entry's stamp. Caller holds mu.
func (c *bodyCache) coldest() {
	if c.share == nil {
		return
	}
	var st uint64
	if c.head < len(c.ents) {
		st = c.ents[c.head].stamp
	}
	if st != c.cold {
		c.cold = st
		c.share.SetColdest(st)
	}
}

// dropBelow forgets the entries below off (settled messages, whose bodies no
// consumer will read again) and gives their bytes back.
func (c *bodyCache) dropBelow(off uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.head == len(c.ents) || c.ents[c.head].off >= off {
		return
	}
	i := c.search(off)
	freed := 0
	for ; c.head < i; c.head++ {
		freed += entryCost(c.ents[c.head].payload)
		c.ents[c.head] = cachedBody{}
	}
	c.bytes -= freed
	c.share.Sub(int64(freed))
	c.compact()
	c.coldest()
}

// reset empties the cache (its entries may belong to a replaced log).
func (c *bodyCache) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.evictLocked(c.bytes)
	c.ents, c.head = nil, 0
	c.coldest()
}

// close empties the cache and leaves the budget.
func (c *bodyCache) close() {
	c.reset()
	c.mu.Lock()
	s := c.share
	c.share = nil
	c.bud = nil // later puts (none expected) cache nothing
	c.mu.Unlock()
	if s != nil {
		s.Leave()
	}
}

// search returns the index in ents of the first live entry at or past off.
func (c *bodyCache) search(off uint64) int {
	live := c.ents[c.head:]
	return c.head + sort.Search(len(live), func(i int) bool { return live[i].off >= off })
}

func (c *bodyCache) get(off uint64) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.ents) == c.head || off < c.ents[c.head].off || off > c.ents[len(c.ents)-1].off {
		return nil, false
	}
	if i := c.search(off); i < len(c.ents) && c.ents[i].off == off {
		return c.ents[i].payload, true
	}
	return nil, false
}
