package partition

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/sinewmq/sinew/internal/budget"
)

func body(off uint64, n int) []byte { return bytes.Repeat([]byte{byte(off)}, n) }

// testEntry is a body size whose entry costs one 4 KiB budget chunk.
const testEntry = 4096 - cacheEntryBytes

func TestBodyCacheKeepsTheNewestWithinItsBounds(t *testing.T) {
	c := newBodyCache(10*4096, nil)
	// Offsets with gaps, as settles and leases take indexes between
	// publishes.
	for off := uint64(1); off <= 300; off += 3 {
		c.put(off, body(off, testEntry))
	}
	// 10 bodies fit: the newest ten, 271..298.
	if c.bytes != 10*4096 || c.bud.Used() != 10*4096 {
		t.Fatalf("bytes = %d, budget used %d, want %d", c.bytes, c.bud.Used(), 10*4096)
	}
	for off := uint64(1); off <= 300; off++ {
		b, ok := c.get(off)
		want := off >= 271 && (off-1)%3 == 0
		if ok != want {
			t.Fatalf("get(%d) ok = %v, want %v", off, ok, want)
		}
		if ok && !bytes.Equal(b, body(off, testEntry)) {
			t.Fatalf("get(%d) returned another body", off)
		}
	}
	// A body over a quarter of the budget is not kept.
	c.put(400, body(400, 10*4096/4+1))
	if _, ok := c.get(400); ok {
		t.Fatal("a body over a quarter of the budget was cached")
	}
}

func TestBodyCacheEntryBoundAndCompaction(t *testing.T) {
	c := newBodyCache(1<<30, nil)
	n := uint64(cacheEntriesMax + 5000)
	for off := uint64(1); off <= n; off++ {
		c.put(off, body(off, 1))
		if live := len(c.ents) - c.head; live > cacheEntriesMax {
			t.Fatalf("%d entries live, bound %d", live, cacheEntriesMax)
		}
	}
	if len(c.ents) > 2*cacheEntriesMax+1024 {
		t.Fatalf("the slice kept %d entries: evicted ones are not compacted away", len(c.ents))
	}
	if _, ok := c.get(n - cacheEntriesMax); ok {
		t.Fatal("an evicted entry is still served")
	}
	for _, off := range []uint64{n - cacheEntriesMax + 1, n - 7, n} {
		if b, ok := c.get(off); !ok || b[0] != byte(off) {
			t.Fatalf("get(%d) = %v, %v", off, b, ok)
		}
	}
	if want := cacheEntriesMax * (1 + cacheEntryBytes); c.bytes != want {
		t.Fatalf("bytes = %d, want %d", c.bytes, want)
	}
}

func TestBodyCachePutAtAnEarlierOffsetDropsLaterOnes(t *testing.T) {
	c := newBodyCache(1<<20, nil)
	for off := uint64(10); off <= 20; off++ {
		c.put(off, body(off, 10))
	}
	c.put(15, []byte("replaced"))
	if b, ok := c.get(15); !ok || string(b) != "replaced" {
		t.Fatalf("get(15) = %q, %v", b, ok)
	}
	for off := uint64(16); off <= 20; off++ {
		if _, ok := c.get(off); ok {
			t.Fatalf("get(%d) still served after an earlier put", off)
		}
	}
	if want := 6*cacheEntryBytes + 5*10 + len("replaced"); c.bytes != want {
		t.Fatalf("bytes = %d, want %d", c.bytes, want)
	}
	c.put(21, body(21, 10))
	if _, ok := c.get(14); !ok {
		t.Fatal("get(14) lost")
	}
}

func TestBodyCacheOff(t *testing.T) {
	c := newBodyCache(0, nil)
	c.put(1, []byte("x"))
	if _, ok := c.get(1); ok {
		t.Fatal("a cache without a budget kept a body")
	}
}

// TestBodyCacheSharedBudget: two partitions' caches on one node budget.
// The one that stopped publishing holds the coldest bodies and gives them
// back to the busy one; the budget never ends a put above its limit.
func TestBodyCacheSharedBudget(t *testing.T) {
	const limit = 64 * 4096
	bud := budget.New("body_cache", limit)
	idle, busy := newBodyCache(0, bud), newBodyCache(0, bud)
	for off := uint64(1); off <= 40; off++ {
		idle.put(off, body(off, testEntry))
	}
	for off := uint64(1); off <= 200; off++ {
		busy.put(off, body(off, testEntry))
		if u := bud.Used(); u > limit {
			t.Fatalf("put %d: budget used %d above %d", off, u, limit)
		}
	}
	if idle.bytes != 0 {
		t.Fatalf("the idle cache kept %d bytes; the busy one needed them", idle.bytes)
	}
	if _, ok := busy.get(200); !ok {
		t.Fatal("the newest body is not cached")
	}
	if busy.bytes < limit/2 {
		t.Fatalf("the busy cache holds only %d bytes of a %d budget", busy.bytes, limit)
	}
	// Settled bodies go, and their bytes go back to the budget.
	busy.dropBelow(201)
	if busy.bytes != 0 || bud.Used() != 0 {
		t.Fatalf("after dropBelow: cache %d bytes, budget used %d", busy.bytes, bud.Used())
	}
	if cap(busy.ents) > cacheKeepEnts {
		t.Fatalf("an emptied cache kept an array of %d entries", cap(busy.ents))
	}
	busy.put(300, body(300, testEntry))
	busy.close()
	idle.close()
	if bud.Used() != 0 {
		t.Fatalf("budget used %d after both caches closed", bud.Used())
	}
}

func BenchmarkBodyCache(b *testing.B) {
	for _, size := range []int{64, 1024} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			c := newBodyCache(64<<20, nil)
			p := make([]byte, size)
			b.ReportAllocs()
			for i := range b.N {
				off := uint64(i)*2 + 1
				c.put(off, p)
				if _, ok := c.get(off - 200); !ok && i > 200 {
					b.Fatal("miss")
				}
			}
		})
	}
}
