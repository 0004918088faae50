package queue

// item is one entry of an index heap: a message's slab position, ordered by
// key, then offset, so ties go to the lowest offset however the slab is
// laid out. gen is the entry generation the item was pushed for; a state change
// bumps the entry's generation, which turns every item pushed before it into
// garbage that is dropped when it surfaces (lazy deletion). That keeps every
// transition O(log n) without searching a heap for the item to remove.
type item struct {
	key int64
	off uint64
	pos uint32
	gen uint32
}

func (a item) less(b item) bool {
	if a.key != b.key {
		return a.key < b.key
	}
	return a.off < b.off
}

// minHeap is a binary min-heap of items. Hand-rolled rather than
// container/heap so the hot path has no interface calls or boxing.
type minHeap struct{ a []item }

func (h *minHeap) len() int { return len(h.a) }

func (h *minHeap) peek() item { return h.a[0] }

func (h *minHeap) push(it item) {
	h.a = append(h.a, it)
	h.up(len(h.a) - 1)
}

func (h *minHeap) pop() item {
	top := h.a[0]
	n := len(h.a) - 1
	h.a[0] = h.a[n]
	h.a = h.a[:n]
	if n > 0 {
		h.down(0)
	}
	return top
}

func (h *minHeap) up(i int) {
	a := h.a
	it := a[i]
	for i > 0 {
		p := (i - 1) / 2
		if !it.less(a[p]) {
			break
		}
		a[i] = a[p]
		i = p
	}
	a[i] = it
}

func (h *minHeap) down(i int) {
	a := h.a
	n := len(a)
	it := a[i]
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && a[r].less(a[c]) {
			c = r
		}
		if !a[c].less(it) {
			break
		}
		a[i] = a[c]
		i = c
	}
	a[i] = it
}

// init restores the heap property over arbitrary contents in O(n).
func (h *minHeap) init() {
	for i := len(h.a)/2 - 1; i >= 0; i-- {
		h.down(i)
	}
}

// filter keeps the items for which keep returns true and re-heapifies. Used
// to drop accumulated garbage in O(n) once it outweighs live items, which
// keeps the amortized cost per transition O(log n) and memory O(live).
func (h *minHeap) filter(keep func(item) bool) {
	out := h.a[:0]
	for _, it := range h.a {
		if keep(it) {
			out = append(out, it)
		}
	}
	clear(h.a[len(out):])
	h.a = out
	h.init()
}
