package partition

import (
	"slices"
	"sort"
)

// Memory a quiet partition gives back. A burst grows buffers that steady
// work never needs again: the decider's record arena (relocation encodes
// thousands of bodies in one turn), the log's append buffers, the ACK
// memory's hash table. Once the partition has been idle for
// idleCheckpointMs (the wake of the idle checkpoint), shrinkIdle lets them
// go; the next burst grows them again. Nothing here runs on the hot path.

// Sizes a quiet partition keeps.
const (
	arenaKeepBytes   = 64 << 10
	outKeepRecords   = 1024
	ackPackThreshold = 1024 // smaller ACK memories are not worth packing
)

// shrinkIdle gives back memory grown during a burst. Actor only, after a
// turn (nothing decided is waiting to be appended).
func (p *Partition) shrinkIdle() {
	d := &p.decider
	if len(d.out) == 0 {
		if cap(d.arena) > arenaKeepBytes {
			d.arena = nil
		}
		if cap(d.out) > outKeepRecords {
			d.out = nil
		}
	}
	d.acked.pack()
	p.log.ShrinkBuffers()
}

// pack moves the entries into packed, sorted by key: 16 bytes each instead
// of the table's 32 or more plus 8 for the order. The order of arrival is
// not kept: unpack restores it as the offsets' order, which is how a
// consumer mostly acks, so the oldest offset is the next forgotten.
func (a *ackMemory) pack() {
	if a.packed != nil || a.n < ackPackThreshold {
		return
	}
	packed := make([]ackSlot, 0, a.n)
	for _, s := range a.slots {
		if s.key != 0 {
			packed = append(packed, s)
		}
	}
	slices.SortFunc(packed, func(x, y ackSlot) int {
		switch {
		case x.key < y.key:
			return -1
		case x.key > y.key:
			return 1
		}
		return 0
	})
	*a = ackMemory{n: len(packed), packed: packed}
}

// unpack rebuilds the table from packed.
func (a *ackMemory) unpack() {
	packed := a.packed
	*a = newAckMemory()
	for _, s := range packed {
		a.put(s.key-1, s.lease)
	}
}

// packedBy is by on a packed memory.
func (a *ackMemory) packedBy(key, leaseID uint64) bool {
	i := sort.Search(len(a.packed), func(i int) bool { return a.packed[i].key >= key })
	return i < len(a.packed) && a.packed[i].key == key && a.packed[i].lease == leaseID
}
