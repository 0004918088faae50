package queue

import (
	"iter"
	"math/bits"
	"slices"
)

// The unsettled set as bits. Every unsettled message has its bit set in
// live; a plain one (see State) also in plain. The others, messages with
// state of their own, have an entry in the State's slab, and the chunk
// holding their bit lists the entries' slab positions in offset order, so
// finding a message's entry is a chunk lookup and a popcount, with no hash
// table. A run of messages published and never touched costs two bits
// each, plus a chunk header per chunkLSNs LSNs, whatever else took LSNs
// between them (leases, acks, leader no-ops), instead of a record per
// message.
//
//	chunks (ascending base, each base a multiple of chunkLSNs):
//	  +------+----------------+-----------------+-----------------+-------+--------+--------+--------------+
//	  | base | live [4]uint64 | plain [4]uint64 | fresh [4]uint64 | nLive | nPlain | nFresh | pos []uint32 |
//	  +------+----------------+-----------------+-----------------+-------+--------+--------+--------------+
//	  bit i of word w describes LSN base + 64*w + i. pos[k] is the slab
//	  position of the k-th message with state (live and not plain) in the
//	  chunk. fresh marks the messages with state that are still as
//	  enqueued, ready and never leased, but have a TTL (see State).
//
// Bits are only ever set at the top (an enqueue takes the next LSN, above
// every unsettled one), so chunks are created by appending. A chunk whose
// last live bit is cleared stays in place, empty, until empty chunks
// outnumber the others; the chunks before head are all empty and the one
// at head, if any, is not. Empty chunks are therefore bounded by the live
// ones plus the slack, and memory by the number of distinct chunks that
// hold an unsettled message: at most one 144-byte chunk (plus 4 bytes per
// message with state) per unsettled message, however sparse, and about
// half a byte per message for a dense run.

const (
	chunkShift = 8
	chunkLSNs  = 1 << chunkShift // LSNs one chunk covers
	chunkWords = chunkLSNs / 64
	// bitmapSlack is how many empty chunks may wait beyond the live ones
	// before the chunk list is compacted.
	bitmapSlack = 64
)

type chunk struct {
	base                  uint64
	live, plain, fresh    [chunkWords]uint64
	nLive, nPlain, nFresh uint32
	pos                   []uint32
}

// word returns word w of the bits of the kind asked.
func (c *chunk) word(w, kind int) uint64 {
	switch kind {
	case anyLive:
		return c.live[w]
	case onlyPlain:
		return c.plain[w]
	case waiting:
		return c.plain[w] | c.fresh[w]
	}
	return c.live[w] &^ c.plain[w]
}

// has reports whether c may hold a bit of the kind asked.
func (c *chunk) has(kind int) bool {
	switch kind {
	case onlyPlain:
		return c.nPlain > 0
	case waiting:
		return c.nPlain+c.nFresh > 0
	case withState:
		return c.nLive > c.nPlain
	}
	return c.nLive > 0
}

// rank is the number of messages with state in c below bit m of word w.
func (c *chunk) rank(w int, m uint64) int {
	n := 0
	for i := range w {
		n += bits.OnesCount64(c.live[i] &^ c.plain[i])
	}
	return n + bits.OnesCount64((c.live[w]&^c.plain[w])&(m-1))
}

type bitmap struct {
	chunks []chunk
	head   int // chunks[:head] are empty; chunks[head] is not (if any)
	// plainHead: no chunk in [head, plainHead) holds a plain or fresh
	// bit. Valid because the lowest such offset never goes down: those
	// bits are cleared anywhere but set only at the top, by an enqueue.
	plainHead int
	empty     int // empty chunks in chunks[head:]
	slack     int // bitmapSlack; tests lower it to make compaction frequent
}

func chunkBase(off uint64) uint64 { return off &^ (chunkLSNs - 1) }

func wordBit(off uint64) (int, uint64) {
	i := off & (chunkLSNs - 1)
	return int(i / 64), 1 << (i % 64)
}

// find returns the index of the chunk holding off, or -1.
func (b *bitmap) find(off uint64) int {
	i := b.search(chunkBase(off))
	if i < len(b.chunks) && b.chunks[i].base == chunkBase(off) {
		return i
	}
	return -1
}

// search returns the index of the first chunk in chunks[head:] whose base
// is >= base. Chunks are mostly contiguous (a backlog fills every chunk),
// so the index is guessed from the distance to the head chunk first, and
// the ends are checked (enqueues touch the last chunk, settles mostly the
// first); a binary search is the fallback.
func (b *bitmap) search(base uint64) int {
	n := len(b.chunks)
	if b.head >= n {
		return n
	}
	h := &b.chunks[b.head]
	if base <= h.base {
		return b.head
	}
	if base > b.chunks[n-1].base {
		return n
	}
	if d := (base - h.base) / chunkLSNs; d < uint64(n-b.head) {
		if i := b.head + int(d); b.chunks[i].base == base {
			return i
		}
	}
	i, _ := slices.BinarySearchFunc(b.chunks[b.head:], base, func(c chunk, base uint64) int { return cmpU64(c.base, base) })
	return b.head + i
}

// add sets off's live bit, and its plain bit if plain; otherwise pos is
// the slab position of its entry. off must lie above every bit set so far.
func (b *bitmap) add(off uint64, plain bool, pos uint32) {
	base := chunkBase(off)
	n := len(b.chunks)
	if n == b.head || b.chunks[n-1].base != base {
		// Chunks before head may share the base; they are never searched.
		b.chunks = append(b.chunks, chunk{base: base})
		n++
	} else if b.chunks[n-1].nLive == 0 {
		// An empty last chunk beyond head (the one at head is never
		// empty) was counted as empty; it holds a bit again.
		b.empty--
	}
	c := &b.chunks[n-1]
	w, m := wordBit(off)
	c.live[w] |= m
	c.nLive++
	if plain {
		c.plain[w] |= m
		c.nPlain++
	} else {
		c.pos = append(c.pos, pos) // the highest bit: last in rank
	}
}

// lookup returns the slab position of off's entry when it has state
// (withState), or says it is plain (onlyPlain), or not live (anyLive).
func (b *bitmap) lookup(off uint64) (uint32, int) {
	i := b.find(off)
	if i < 0 {
		return 0, anyLive
	}
	c := &b.chunks[i]
	w, m := wordBit(off)
	switch {
	case c.plain[w]&m != 0:
		return 0, onlyPlain
	case c.live[w]&m != 0:
		return c.pos[c.rank(w, m)], withState
	}
	return 0, anyLive
}

// setFresh and clearFresh set and clear the fresh bit of off, which has
// state.
func (b *bitmap) setFresh(off uint64) {
	c := &b.chunks[b.find(off)]
	w, m := wordBit(off)
	c.fresh[w] |= m
	c.nFresh++
}

func (b *bitmap) clearFresh(off uint64) {
	c := &b.chunks[b.find(off)]
	w, m := wordBit(off)
	c.fresh[w] &^= m
	c.nFresh--
	b.skipPlain()
}

// setPos changes the slab position recorded for off, which has state.
func (b *bitmap) setPos(off uint64, pos uint32) {
	c := &b.chunks[b.find(off)]
	w, m := wordBit(off)
	c.pos[c.rank(w, m)] = pos
}

// isLive reports whether off's live bit is set.
func (b *bitmap) isLive(off uint64) bool {
	i := b.find(off)
	if i < 0 {
		return false
	}
	w, m := wordBit(off)
	return b.chunks[i].live[w]&m != 0
}

// unplain clears off's plain bit, which must be set: the message got state
// of its own, an entry at slab position pos.
func (b *bitmap) unplain(off uint64, pos uint32) {
	c := &b.chunks[b.find(off)]
	w, m := wordBit(off)
	c.plain[w] &^= m
	c.nPlain--
	c.pos = slices.Insert(c.pos, c.rank(w, m), pos)
	b.skipPlain()
}

// remove clears off's live bit (and plain bit, or entry position), which
// must be set.
func (b *bitmap) remove(off uint64) {
	i := b.find(off)
	w, m := wordBit(off)
	c := &b.chunks[i]
	if c.plain[w]&m != 0 {
		c.plain[w] &^= m
		c.nPlain--
	} else {
		c.pos = slices.Delete(c.pos, c.rank(w, m), c.rank(w, m)+1)
		if c.fresh[w]&m != 0 {
			c.fresh[w] &^= m
			c.nFresh--
		}
	}
	c.live[w] &^= m
	c.nLive--
	if c.nLive > 0 {
		b.skipPlain()
		return
	}
	c.pos = nil
	if i != b.head {
		b.empty++
	} else {
		for b.head++; b.head < len(b.chunks) && b.chunks[b.head].nLive == 0; b.head++ {
			b.empty--
		}
	}
	b.plainHead = max(b.plainHead, b.head)
	live := len(b.chunks) - b.head - b.empty
	switch {
	case b.head > b.slack && b.head > len(b.chunks)-b.head:
		b.compact()
	case b.empty > live+b.slack:
		b.compact()
	}
	b.skipPlain()
}

// skipPlain moves plainHead past chunks without plain or fresh bits. The
// last chunk is never skipped: the next enqueue may add a bit to it.
func (b *bitmap) skipPlain() {
	for b.plainHead < len(b.chunks)-1 && !b.chunks[b.plainHead].has(waiting) {
		b.plainHead++
	}
}

// compact drops every empty chunk, and gives memory back once the list is
// mostly unused capacity.
func (b *bitmap) compact() {
	n := 0
	for i := b.head; i < len(b.chunks); i++ {
		if b.chunks[i].nLive > 0 {
			b.chunks[n] = b.chunks[i]
			n++
		}
	}
	clear(b.chunks[n:])
	b.chunks = b.chunks[:n]
	if n*4 < cap(b.chunks) && cap(b.chunks) > 4*b.slack {
		b.chunks = slices.Clone(b.chunks)
	}
	b.head, b.plainHead, b.empty = 0, 0, 0
	b.skipPlain()
}

// Which bits next looks for.
const (
	anyLive   = iota // live
	onlyPlain        // plain
	withState        // live and not plain
	waiting          // plain or fresh: never leased, ready, no not-before
)

// nextOf returns the lowest offset >= from of the kind asked, and false
// when there is none.
func (b *bitmap) nextOf(from uint64, kind int) (uint64, bool) {
	start := b.head
	if kind == onlyPlain || kind == waiting {
		start = b.plainHead
	}
	if start >= len(b.chunks) {
		return 0, false
	}
	i := start
	if b.chunks[i].base+chunkLSNs <= from {
		// The first chunk ending after from.
		i = max(b.search(chunkBase(from)), start)
	}
	for ; i < len(b.chunks); i++ {
		c := &b.chunks[i]
		if !c.has(kind) {
			continue
		}
		w, sh := 0, uint(0)
		if from > c.base {
			d := from - c.base
			w, sh = int(d/64), uint(d%64)
		}
		for ; w < chunkWords; w, sh = w+1, 0 {
			if x := c.word(w, kind) >> sh << sh; x != 0 {
				return c.base + uint64(w)*64 + uint64(bits.TrailingZeros64(x)), true
			}
		}
	}
	return 0, false
}

// from yields, in ascending order, the offsets >= start of the kind asked.
// It walks the chunks in sequence, O(1) per word, so a full pass costs
// O(chunks + offsets). The bitmap must not change during the walk.
func (b *bitmap) from(start uint64, kind int) iter.Seq[uint64] {
	return func(yield func(uint64) bool) {
		first, ok := b.nextOf(start, kind)
		if !ok {
			return
		}
		i := b.find(first)
		for ; i < len(b.chunks); i++ {
			c := &b.chunks[i]
			if !c.has(kind) {
				continue
			}
			for w := range chunkWords {
				x := c.word(w, kind)
				base := c.base + uint64(w)*64
				if base+63 < first {
					continue
				}
				if base < first {
					x = x >> (first - base) << (first - base)
				}
				for x != 0 {
					if !yield(base + uint64(bits.TrailingZeros64(x))) {
						return
					}
					x &= x - 1
				}
			}
		}
	}
}

// states yields every message with state, by offset, with the slab
// position of its entry.
func (b *bitmap) states() iter.Seq2[uint64, uint32] {
	return func(yield func(uint64, uint32) bool) {
		for i := b.head; i < len(b.chunks); i++ {
			c := &b.chunks[i]
			k := 0
			for w := range chunkWords {
				x := c.live[w] &^ c.plain[w]
				for x != 0 {
					if !yield(c.base+uint64(w)*64+uint64(bits.TrailingZeros64(x)), c.pos[k]) {
						return
					}
					k++
					x &= x - 1
				}
			}
		}
	}
}

// first returns the lowest live offset.
func (b *bitmap) first() (uint64, bool) {
	if b.head >= len(b.chunks) {
		return 0, false
	}
	return b.nextOf(b.chunks[b.head].base, anyLive)
}
