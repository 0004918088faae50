package multiraft

import (
	"container/heap"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// Faults says what the in-process Network does to each envelope. The zero
// value is a perfect network: no loss, no delay, in order.
type Faults struct {
	// DropPermille is the chance, per mille, that an envelope is lost.
	DropPermille int
	// DupPermille is the chance, per mille, that an envelope that is not
	// lost arrives twice.
	DupPermille int
	// DelayMinMs and DelayMaxMs bound each envelope's delay, drawn
	// uniformly from [DelayMinMs, DelayMaxMs].
	DelayMinMs, DelayMaxMs int
	// Reorder lets envelopes on one link overtake each other (each is
	// delayed on its own). Without it a link is FIFO like one TCP stream:
	// an envelope never arrives before one sent earlier on the same link.
	Reorder bool
}

// NetStats counts what a Network did.
type NetStats struct {
	// Sent is envelopes handed to Send.
	Sent uint64
	// Delivered is envelopes handed to a Receiver, duplicates included.
	Delivered uint64
	// Dropped is envelopes lost by the DropPermille fault.
	Dropped uint64
	// Duplicated is extra copies made by the DupPermille fault.
	Duplicated uint64
	// Cut is envelopes lost because their link was cut, at send or at
	// delivery time.
	Cut uint64
	// Overflow is envelopes lost because pendingEnvelopesMax were already
	// in flight.
	Overflow uint64
	// Unattached is envelopes addressed to a node with no Receiver.
	Unattached uint64
}

// pendingEnvelopesMax bounds the envelopes in flight inside a Network, so a
// test that stops delivering cannot grow it without bound.
const pendingEnvelopesMax = 1 << 20

type link struct{ from, to uint64 }

type pending struct {
	due  time.Time
	seq  uint64 // send order, the tie-break that keeps delivery deterministic
	from uint64
	to   uint64
	env  Envelope
}

type pendingHeap []pending

func (h pendingHeap) Len() int { return len(h) }
func (h pendingHeap) Less(i, j int) bool {
	if !h[i].due.Equal(h[j].due) {
		return h[i].due.Before(h[j].due)
	}
	return h[i].seq < h[j].seq
}
func (h pendingHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *pendingHeap) Push(x any)   { *h = append(*h, x.(pending)) }
func (h *pendingHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Network is an in-process transport between nodes that can drop, delay,
// duplicate and reorder envelopes and cut links, all decided by a seeded
// random source and an injected clock, so a run is repeated by its seed.
//
// Nothing moves by itself: Send schedules each envelope at now+delay, and
// DeliverDue hands every envelope that is due to its receiver. A test
// drives the clock and calls DeliverDue; Network starts no goroutine.
// All methods are safe for concurrent use; receivers are called without
// the Network's lock held.
type Network struct {
	mu      sync.Mutex
	now     func() time.Time
	rng     *rand.Rand
	faults  Faults
	nodes   map[uint64]Receiver
	cut     map[link]bool
	q       pendingHeap
	seq     uint64
	lastDue map[link]time.Time // per link, for FIFO when !faults.Reorder
	stats   NetStats
}

// NewNetwork returns a network whose faults are drawn from a PCG source
// seeded with seed and whose delays are measured on now.
func NewNetwork(seed uint64, now func() time.Time, f Faults) *Network {
	return &Network{
		now:     now,
		rng:     rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		faults:  f,
		nodes:   make(map[uint64]Receiver),
		cut:     make(map[link]bool),
		lastDue: make(map[link]time.Time),
	}
}

// Attach makes r the receiver of everything sent to node.
func (n *Network) Attach(node uint64, r Receiver) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nodes[node] = r
}

// Detach removes node's receiver: envelopes to it are lost until it is
// attached again (a crashed node).
func (n *Network) Detach(node uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.nodes, node)
}

// SetFaults replaces the faults applied to envelopes sent from now on.
func (n *Network) SetFaults(f Faults) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.faults = f
}

// Endpoint returns node's side of the network: the Transport its host
// sends with.
func (n *Network) Endpoint(node uint64) Transport { return endpoint{n: n, from: node} }

type endpoint struct {
	n    *Network
	from uint64
}

func (e endpoint) Send(to uint64, batch []Envelope) { e.n.send(e.from, to, batch) }

// Cut breaks the links between a and b in both directions.
func (n *Network) Cut(a, b uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[link{a, b}] = true
	n.cut[link{b, a}] = true
}

// CutOneWay breaks the link from -> to only (an asymmetric partition).
func (n *Network) CutOneWay(from, to uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[link{from, to}] = true
}

// Isolate cuts node off from every node in others.
func (n *Network) Isolate(node uint64, others []uint64) {
	for _, o := range others {
		if o != node {
			n.Cut(node, o)
		}
	}
}

// Split cuts every link between nodes of different sides.
func (n *Network) Split(sides ...[]uint64) {
	for i, a := range sides {
		for _, b := range sides[i+1:] {
			for _, x := range a {
				for _, y := range b {
					n.Cut(x, y)
				}
			}
		}
	}
}

// Heal restores every cut link. Envelopes lost to a cut stay lost.
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.cut)
}

// Stats returns the counters so far.
func (n *Network) Stats() NetStats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stats
}

// InFlight returns the number of envelopes sent and not yet delivered or lost.
func (n *Network) InFlight() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.q)
}

func (n *Network) send(from, to uint64, batch []Envelope) {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := n.now()
	l := link{from, to}
	for _, env := range batch {
		n.stats.Sent++
		if n.cut[l] {
			n.stats.Cut++
			continue
		}
		if n.chance(n.faults.DropPermille) {
			n.stats.Dropped++
			continue
		}
		copies := 1
		if n.chance(n.faults.DupPermille) {
			copies = 2
			n.stats.Duplicated++
		}
		for range copies {
			if len(n.q) >= pendingEnvelopesMax {
				n.stats.Overflow++
				continue
			}
			due := now.Add(n.delay())
			if !n.faults.Reorder {
				// FIFO per link: never earlier than the last one queued.
				if last := n.lastDue[l]; due.Before(last) {
					due = last
				}
				n.lastDue[l] = due
			}
			n.seq++
			heap.Push(&n.q, pending{due: due, seq: n.seq, from: from, to: to, env: env})
		}
	}
}

func (n *Network) chance(permille int) bool {
	return permille > 0 && n.rng.IntN(1000) < permille
}

func (n *Network) delay() time.Duration {
	lo, hi := n.faults.DelayMinMs, n.faults.DelayMaxMs
	if hi <= lo {
		return time.Duration(max(lo, 0)) * time.Millisecond
	}
	return time.Duration(lo+n.rng.IntN(hi-lo+1)) * time.Millisecond
}

// NextDue returns when the earliest envelope in flight is due, and false
// when none is in flight.
func (n *Network) NextDue() (time.Time, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.q) == 0 {
		return time.Time{}, false
	}
	return n.q[0].due, true
}

// DeliverDue hands every envelope due at or before now to its receiver,
// in due order, consecutive envelopes of one link in one batch. An
// envelope whose link was cut while it was in flight is lost. It returns
// the number of envelopes delivered.
func (n *Network) DeliverDue(now time.Time) int {
	type out struct {
		r        Receiver
		from, to uint64
		batch    []Envelope
	}
	var outs []out
	n.mu.Lock()
	for len(n.q) > 0 && !n.q[0].due.After(now) {
		p := heap.Pop(&n.q).(pending)
		if n.cut[link{p.from, p.to}] {
			n.stats.Cut++
			continue
		}
		r, ok := n.nodes[p.to]
		if !ok {
			n.stats.Unattached++
			continue
		}
		n.stats.Delivered++
		if k := len(outs) - 1; k >= 0 && outs[k].to == p.to && outs[k].from == p.from {
			outs[k].batch = append(outs[k].batch, p.env)
			continue
		}
		outs = append(outs, out{r: r, from: p.from, to: p.to, batch: []Envelope{p.env}})
	}
	n.mu.Unlock()
	delivered := 0
	for _, o := range outs {
		delivered += len(o.batch)
		o.r.Deliver(o.from, slices.Clip(o.batch))
	}
	return delivered
}
