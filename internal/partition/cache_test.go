package partition

import (
	"bytes"
	"fmt"
	"testing"
)

func body(off uint64, n int) []byte { return bytes.Repeat([]byte{byte(off)}, n) }

func TestBodyCacheKeepsTheNewestWithinItsBounds(t *testing.T) {
	c := newBodyCache(1000)
	// Offsets with gaps, as settles and leases take indexes between
	// publishes.
	for off := uint64(1); off <= 300; off += 3 {
		c.put(off, body(off, 100))
	}
	// 10 bodies of 100 bytes fit: the newest ten, 271..298.
	if c.bytes != 1000 {
		t.Fatalf("bytes = %d, want 1000", c.bytes)
	}
	for off := uint64(1); off <= 300; off++ {
		b, ok := c.get(off)
		want := off >= 271 && (off-1)%3 == 0
		if ok != want {
			t.Fatalf("get(%d) ok = %v, want %v", off, ok, want)
		}
		if ok && !bytes.Equal(b, body(off, 100)) {
			t.Fatalf("get(%d) returned another body", off)
		}
	}
	// A body over a quarter of the budget is not kept.
	c.put(400, body(400, 251))
	if _, ok := c.get(400); ok {
		t.Fatal("a body over a quarter of the budget was cached")
	}
}

func TestBodyCacheEntryBoundAndCompaction(t *testing.T) {
	c := newBodyCache(1 << 30)
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
	if c.bytes != cacheEntriesMax {
		t.Fatalf("bytes = %d, want %d", c.bytes, cacheEntriesMax)
	}
}

func TestBodyCachePutAtAnEarlierOffsetDropsLaterOnes(t *testing.T) {
	c := newBodyCache(1 << 20)
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
	if want := 5*10 + len("replaced"); c.bytes != want {
		t.Fatalf("bytes = %d, want %d", c.bytes, want)
	}
	c.put(21, body(21, 10))
	if _, ok := c.get(14); !ok {
		t.Fatal("get(14) lost")
	}
}

func TestBodyCacheOff(t *testing.T) {
	c := newBodyCache(0)
	c.put(1, []byte("x"))
	if _, ok := c.get(1); ok {
		t.Fatal("a cache without a budget kept a body")
	}
}

func BenchmarkBodyCache(b *testing.B) {
	for _, size := range []int{64, 1024} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			c := newBodyCache(64 << 20)
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
