package partition

// bodyCache keeps the encoded Enqueue payloads of recently published
// messages so that a consumer keeping up with producers is served without a
// log read. It is bounded in bytes and in entries and evicts oldest first.
// Owned by the actor goroutine; payloads are never modified once cached.
type bodyCache struct {
	bytesMax int
	bytes    int
	m        map[uint64][]byte
	fifo     []uint64 // insertion order; fifo[head:] are live or evicted lazily
	head     int
}

// cacheEntriesMax bounds the entry count, so tiny messages cannot make the
// index outgrow the byte budget.
const cacheEntriesMax = 1 << 16

func newBodyCache(bytesMax int) bodyCache {
	return bodyCache{bytesMax: bytesMax, m: make(map[uint64][]byte)}
}

func (c *bodyCache) put(off uint64, payload []byte) {
	if c.bytesMax <= 0 || len(payload) > c.bytesMax/4 {
		return
	}
	c.m[off] = payload
	c.fifo = append(c.fifo, off)
	c.bytes += len(payload)
	for c.bytes > c.bytesMax || len(c.m) > cacheEntriesMax {
		old := c.fifo[c.head]
		c.head++
		if b, ok := c.m[old]; ok {
			c.bytes -= len(b)
			delete(c.m, old)
		}
	}
	if c.head > len(c.fifo)/2 && c.head > 1024 {
		c.fifo = append(c.fifo[:0], c.fifo[c.head:]...)
		c.head = 0
	}
}

func (c *bodyCache) get(off uint64) ([]byte, bool) {
	b, ok := c.m[off]
	return b, ok
}
