package budget

import (
	"sync"
	"testing"
)

// fifo is a test cache: entries of a size, oldest first, stamped.
type fifo struct {
	mu    sync.Mutex
	b     *Budget
	share *Share
	ents  []ent
}

type ent struct {
	stamp uint64
	size  int64
}

func newFIFO(b *Budget) *fifo {
	c := &fifo{b: b}
	c.mu.Lock() // Reclaim may call Evict as soon as Join returns
	c.share = b.Join(c)
	c.mu.Unlock()
	return c
}

func (c *fifo) put(size int64) {
	c.mu.Lock()
	c.ents = append(c.ents, ent{c.b.Stamp(), size})
	over := c.share.Add(size)
	c.share.SetColdest(c.ents[0].stamp)
	c.mu.Unlock()
	if over {
		c.b.Reclaim()
	}
}

func (c *fifo) Evict(want int64) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var freed int64
	for freed < want && len(c.ents) > 0 {
		freed += c.ents[0].size
		c.ents = c.ents[1:]
	}
	c.share.Sub(freed)
	c.share.Trim()
	if len(c.ents) > 0 {
		c.share.SetColdest(c.ents[0].stamp)
	} else {
		c.share.SetColdest(0)
	}
	return freed
}

func (c *fifo) held() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for _, e := range c.ents {
		n += e.size
	}
	return n
}

func TestChunkedReservation(t *testing.T) {
	b := New("body", 1<<20) // chunk 4 KiB
	if b.Chunk() != 4<<10 {
		t.Fatalf("chunk %d, want 4096", b.Chunk())
	}
	c := newFIFO(b)
	c.put(100)
	if got := b.Used(); got != 4<<10 {
		t.Fatalf("used after 100 bytes: %d, want one chunk", got)
	}
	for range 39 {
		c.put(100) // 4000 bytes in all: still one chunk
	}
	if got := b.Used(); got != 4<<10 {
		t.Fatalf("used after 4000 bytes: %d, want one chunk", got)
	}
	c.put(200)
	if got := b.Used(); got != 8<<10 {
		t.Fatalf("used after 4200 bytes: %d, want two chunks", got)
	}
	c.mu.Lock()
	c.share.Sub(4200)
	c.mu.Unlock()
	if got := b.Used(); got != 0 {
		t.Fatalf("used once the cache is empty: %d, want 0", got)
	}
}

func TestLimitHeldUnderPressure(t *testing.T) {
	const limit = 1 << 20
	b := New("body", limit)
	caches := make([]*fifo, 8)
	for i := range caches {
		caches[i] = newFIFO(b)
	}
	for i := range 10_000 {
		caches[i%len(caches)].put(1000)
		if u := b.Used(); u > limit {
			t.Fatalf("put %d: used %d above limit %d after reclaim", i, u, limit)
		}
	}
	var held int64
	for _, c := range caches {
		held += c.held()
	}
	if held > limit || held < limit/2 {
		t.Fatalf("caches hold %d bytes, want within (limit/2, limit] of %d", held, limit)
	}
	if b.Evicted() == 0 {
		t.Fatal("nothing was evicted")
	}
}

// TestColdestGivesBack: a cache that stopped putting holds the coldest
// entries and is the one that gives back when another keeps putting.
func TestColdestGivesBack(t *testing.T) {
	const limit = 256 << 10
	b := New("raft", limit)
	idle, busy := newFIFO(b), newFIFO(b)
	for range 100 {
		idle.put(1000)
	}
	for range 100 {
		busy.put(1000)
	}
	if idle.held() != 100_000 || busy.held() != 100_000 {
		t.Fatalf("under the limit nothing is evicted: idle %d busy %d", idle.held(), busy.held())
	}
	for range 100 {
		busy.put(1000)
	}
	if got := busy.held(); got != 200_000 {
		t.Fatalf("busy cache holds %d, want all 200000: the idle one is colder", got)
	}
	if got := idle.held(); got > limit-200_000 {
		t.Fatalf("idle cache holds %d, want it to have given back", got)
	}
	if b.Used() > limit {
		t.Fatalf("used %d above limit", b.Used())
	}
}

func TestLeaveReturnsReservation(t *testing.T) {
	b := New("body", 1<<20)
	c := newFIFO(b)
	c.put(10_000)
	if b.Used() == 0 {
		t.Fatal("nothing reserved")
	}
	c.share.Leave()
	if b.Used() != 0 {
		t.Fatalf("used %d after Leave, want 0", b.Used())
	}
	c.put(10) // a no-op on the budget
	if b.Used() != 0 {
		t.Fatalf("used %d after a put past Leave, want 0", b.Used())
	}
	b.Reclaim() // the left share is not asked
}

func TestZeroLimitKeepsNothing(t *testing.T) {
	b := New("body", 0)
	c := newFIFO(b)
	for range 10 {
		c.put(100)
	}
	if c.held() != 0 || b.Used() != 0 {
		t.Fatalf("held %d used %d with a zero limit", c.held(), b.Used())
	}
}

func TestSetLimitShrinks(t *testing.T) {
	b := New("body", 1<<20)
	c := newFIFO(b)
	for range 500 {
		c.put(1000)
	}
	b.SetLimit(100 << 10)
	b.Reclaim()
	if b.Used() > 100<<10 {
		t.Fatalf("used %d above the lowered limit", b.Used())
	}
}

// TestConcurrent is for the race detector: puts from many goroutines.
func TestConcurrent(t *testing.T) {
	const limit = 512 << 10
	b := New("body", limit)
	var wg sync.WaitGroup
	for range 8 {
		c := newFIFO(b)
		wg.Go(func() {
			for range 2000 {
				c.put(500)
			}
		})
	}
	wg.Wait()
	if b.Used() > limit+8*b.Chunk() {
		t.Fatalf("used %d beyond limit plus one chunk per share", b.Used())
	}
}

// BenchmarkPutManyShares is the body cache's case at scale: a 16 MiB budget
// shared by 4,096 caches, of which 3,072 once held something and are empty
// now (drained partitions) and 1,024 take 1 KiB puts in turn, so the budget
// stays full and every limit/32 bytes put starts a Reclaim. ns/op is per put.
func BenchmarkPutManyShares(b *testing.B) {
	bud := New("body", 16<<20)
	caches := make([]*fifo, 4096)
	for i := range caches {
		caches[i] = newFIFO(bud)
	}
	for _, c := range caches[1024:] {
		c.put(1024)
		c.Evict(1 << 20)
	}
	active := caches[:1024]
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		active[i%len(active)].put(1024)
	}
	b.StopTimer()
	if bud.Used() > bud.Limit()+int64(len(caches))*bud.Chunk() {
		b.Fatalf("used %d over limit %d by more than a chunk per share", bud.Used(), bud.Limit())
	}
}
