package partition

import "sort"

// bodyCache keeps the encoded Enqueue payloads of recently published
// messages so that a consumer keeping up with producers is served without a
// log read. It is bounded in bytes and in entries and evicts oldest first.
// Owned by the actor goroutine; payloads are never modified once cached.
//
// Offsets are put in increasing order (the leader proposes in log order), so
// the entries are a slice sorted by offset, trimmed at the front: a put is an
// append and a lookup a binary search, with no map to grow or rehash. A put
// at or below the last offset (never done today) drops the entries from it
// on, so the order holds.
type bodyCache struct {
	bytesMax int
	bytes    int
	ents     []cachedBody // ents[head:] are live, sorted by offset
	head     int
}

type cachedBody struct {
	off     uint64
	payload []byte
}

// cacheEntriesMax bounds the entry count, so tiny messages cannot make the
// index outgrow the byte budget.
const cacheEntriesMax = 1 << 16

func newBodyCache(bytesMax int) bodyCache {
	return bodyCache{bytesMax: bytesMax}
}

func (c *bodyCache) put(off uint64, payload []byte) {
	if c.bytesMax <= 0 || len(payload) > c.bytesMax/4 {
		return
	}
	if n := len(c.ents); n > c.head && c.ents[n-1].off >= off {
		i := c.search(off)
		for _, e := range c.ents[i:] {
			c.bytes -= len(e.payload)
		}
		clear(c.ents[i:])
		c.ents = c.ents[:i]
	}
	c.ents = append(c.ents, cachedBody{off, payload})
	c.bytes += len(payload)
	for c.bytes > c.bytesMax || len(c.ents)-c.head > cacheEntriesMax {
		c.bytes -= len(c.ents[c.head].payload)
		c.ents[c.head] = cachedBody{}
		c.head++
	}
	if c.head > len(c.ents)/2 && c.head > 1024 {
		n := copy(c.ents, c.ents[c.head:])
		clear(c.ents[n:])
		c.ents = c.ents[:n]
		c.head = 0
	}
}

// search returns the index in ents of the first live entry at or past off.
func (c *bodyCache) search(off uint64) int {
	live := c.ents[c.head:]
	return c.head + sort.Search(len(live), func(i int) bool { return live[i].off >= off })
}

func (c *bodyCache) get(off uint64) ([]byte, bool) {
	if len(c.ents) == c.head || off < c.ents[c.head].off || off > c.ents[len(c.ents)-1].off {
		return nil, false
	}
	if i := c.search(off); i < len(c.ents) && c.ents[i].off == off {
		return c.ents[i].payload, true
	}
	return nil, false
}
