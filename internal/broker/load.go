package broker

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/internal/partition"
)

// NodeLoad is the node's load as its cluster peers are told it (advisory:
// placement prefers less loaded nodes among equals, see docs/cluster.md,
// "Load signals").
type NodeLoad struct {
	// PartitionsLed is the partitions this node leads (all of them on a
	// single node).
	PartitionsLed uint32
	// Backlog is the ready and in-flight messages of those partitions.
	Backlog uint64
	// AppendRate is the records appended per second on this node since
	// the previous sample (publishes and replicas' appends).
	AppendRate uint32
}

// loadRescanEvery is how many samples may reuse the last partition scan
// while the node's counters show no activity: leadership can move without
// a message moving, so an idle node rescans at least this often.
const loadRescanEvery = 15

// loadSampler keeps what LoadSample needs between calls.
type loadSampler struct {
	mu       sync.Mutex
	at       time.Time
	appended uint64
	sig      uint64
	moved    bool // the counters moved at the previous sample
	skipped  int
	last     NodeLoad
	scans    uint64 // partition scans done (tests)
}

// activity sums the counters that change whenever a partition's ready or
// in-flight counts can change.
func activity(c *partition.Counters) uint64 {
	s := c.Appended.Load() + c.Deliveries.Load() + c.Acks.Load() + c.Nacks.Load() + c.LeaseExpiries.Load() +
		c.Released.Load() + c.Fails.Load() + c.Purged.Load()
	for i := range c.DeadLettered {
		s += c.DeadLettered[i].Load()
	}
	return s
}

// LoadSample returns the node's load. It is meant to be called every
// second or two. The append rate comes from a node-wide counter; the
// partitions led and their backlog come from a scan of the partitions'
// published counters (atomic loads), done only when the node's counters
// moved since the previous sample or the one before it (a partition
// publishes its counters at the end of its turn), and otherwise at most
// every loadRescanEvery samples: an idle node with thousands of
// partitions does not scan them every time.
func (b *Broker) LoadSample() NodeLoad {
	s := &b.load
	s.mu.Lock()
	defer s.mu.Unlock()
	now := b.cfg.Now()
	appended := b.counters.Appended.Load()
	if !s.at.IsZero() {
		if dt := now.Sub(s.at); dt > 0 {
			rate := float64(appended-s.appended) / dt.Seconds()
			s.last.AppendRate = uint32(min(rate, float64(^uint32(0))))
		}
	}
	s.at, s.appended = now, appended
	sig := activity(b.counters)
	moved := sig != s.sig
	if moved || s.moved || s.scans == 0 || s.skipped >= loadRescanEvery-1 {
		s.last.PartitionsLed, s.last.Backlog = b.scanLoad()
		s.scans++
		s.skipped = 0
	} else {
		s.skipped++
	}
	s.sig, s.moved = sig, moved
	return s.last
}

// scanLoad counts the partitions this node leads and their ready and
// in-flight messages.
func (b *Broker) scanLoad() (led uint32, backlog uint64) {
	b.mu.RLock()
	qs := make([]*queueEntry, 0, len(b.queues))
	for _, q := range b.queues {
		qs = append(qs, q)
	}
	b.mu.RUnlock()
	for _, q := range qs {
		for _, p := range q.parts {
			if p.Quarantined() != nil || !q.leadsHere(p) {
				continue
			}
			led++
			backlog += uint64(max(partitionBacklog(p), 0))
		}
	}
	return led, backlog
}

// partitionBacklog is a partition's ready and in-flight messages, as of
// the end of its last turn (an atomic load).
func partitionBacklog(p *partition.Partition) int {
	st := p.Stats()
	return st.Ready + st.Inflight
}

// lighter is the partition a keyless publish without a producer id goes
// to: p, the one the round-robin counter reached (at), or the next
// partition served here after it when that one's backlog (ready and
// in-flight, as of the end of its last turn) is smaller: the power of
// two choices, with round-robin's order among equals. When every
// partition is served here, each is one of the two choices of two counter
// values only, so counters a turn old send it at most twice its share. Keyed and producer-pinned
// publishes never come here.
func (q *queueEntry) lighter(p *partition.Partition, at uint64) *partition.Partition {
	n := uint64(len(q.parts))
	if roundRobinOnly.Load() {
		return p
	}
	for j := uint64(1); j < n; j++ {
		c := q.parts[(at+j)%n]
		if c.Quarantined() != nil || !q.leadsHere(c) {
			continue
		}
		if partitionBacklog(c) < partitionBacklog(p) {
			return c
		}
		return p
	}
	return p
}

// hint is the PUBLISH_OK partition hint for a keyless publish (1 + the
// partition, 0 for none; docs/protocol.md 5.6, "Partition hints"): the
// partition the round-robin counter reaches, or the next one when its
// backlog is smaller, over every partition that is not parked. Unlike
// lighter it does not ask for partitions led here: a client sends a hinted
// publish to the partition's owner, and in a cluster every node holding
// the queue holds a replica of each of its partitions, whose applied
// backlog is near enough the owner's. A queue of one partition, or one
// whose partitions are all parked, gives no hint. Called from partition
// goroutines: atomic loads only.
func (q *queueEntry) hint() uint32 {
	n := uint64(len(q.parts))
	if n < 2 {
		return 0
	}
	start := q.hintRR.Add(1)
	for i := range n {
		at := (start + i) % n
		p := q.parts[at]
		if p.Quarantined() != nil {
			continue
		}
		if roundRobinOnly.Load() {
			return uint32(at) + 1
		}
		for j := uint64(1); j < n; j++ {
			c := q.parts[(at+j)%n]
			if c.Quarantined() != nil {
				continue
			}
			if partitionBacklog(c) < partitionBacklog(p) {
				return uint32((at+j)%n) + 1
			}
			break
		}
		return uint32(at) + 1
	}
	return 0
}

// roundRobinOnly turns lighter off, for tests and benchmarks that compare
// the two in the same run.
var roundRobinOnly atomic.Bool
