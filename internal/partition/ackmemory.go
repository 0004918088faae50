package partition

import "math/bits"

// ackMemoryMax bounds the ACKs a partition remembers by lease (Partition.acked).
const ackMemoryMax = 1 << 16

// ackMemory maps offsets to the lease that ACKed them, oldest forgotten
// first past ackMemoryMax. Actor only (and Open's replay, before the actor
// starts).
//
// It is an open-addressing table (linear probing, deletion by backward
// shift) rather than a Go map: an ACK is on the hot path of every drain,
// and the hash keeps each run of eight consecutive offsets in neighbouring
// slots, so a consumer acking in offset order touches memory in order. The
// table doubles as it fills, up to twice ackMemoryMax slots.
type ackMemory struct {
	// slots holds offset+1 (0 is empty) and the lease; its length is a
	// power of two, at least twice n.
	slots []ackSlot
	n     int
	shift uint // 64 - log2(len(slots)/ackRun)
	// order holds the remembered offsets oldest first from head on, as a
	// ring once it reaches ackMemoryMax: re-slicing a plain queue copied
	// the whole backlog on every growth, on the hot ACK path.
	order []uint64
	head  int
	// packed, when not nil, holds every entry sorted by key instead of
	// slots and order, at half the memory: a partition gone quiet packs
	// its memory (memory.go) and the next put unpacks it.
	packed []ackSlot
}

type ackSlot struct{ key, lease uint64 }

func newAckMemory() ackMemory {
	return ackMemory{slots: make([]ackSlot, ackSlotsMin), shift: 64 - uint(bits.Len(ackSlotsMin/ackRun)-1)}
}

// home is the slot a key is looked for first.
func (a *ackMemory) home(key uint64) int {
	run := ((key / ackRun) * 0x9E3779B97F4A7C15) >> a.shift
	return int(run*ackRun + key%ackRun)
}

// find returns the slot holding key, or the empty slot where it would go.
func (a *ackMemory) find(key uint64) (int, bool) {
	mask := len(a.slots) - 1
	for i := a.home(key); ; i = (i + 1) & mask {
		switch a.slots[i].key {
		case key:
			return i, true
		case 0:
			return i, false
		}
	}
}

func (a *ackMemory) put(offset, leaseID uint64) {
	if a.packed != nil {
		a.unpack()
	}
	if a.slots == nil {
		*a = newAckMemory()
	}
	key := offset + 1
	i, ok := a.find(key)
	if ok {
		a.slots[i].lease = leaseID
		return
	}
	if len(a.order) >= ackMemoryMax {
		a.remove(a.order[a.head] + 1)
		a.order[a.head] = offset
		a.head = (a.head + 1) % ackMemoryMax
	} else {
		a.order = append(a.order, offset)
	}
	if 2*(a.n+1) > len(a.slots) {
		a.grow()
	}
	i, _ = a.find(key)
	a.slots[i] = ackSlot{key, leaseID}
	a.n++
}

// remove deletes key, shifting back the entries its slot was holding up.
func (a *ackMemory) remove(key uint64) {
	i, ok := a.find(key)
	if !ok {
		return
	}
	mask := len(a.slots) - 1
	for j := (i + 1) & mask; a.slots[j].key != 0; j = (j + 1) & mask {
		// The entry at j may move back to i if its home is not in
		// (i, j], cyclically.
		h := a.home(a.slots[j].key)
		if (j-h)&mask >= (j-i)&mask {
			a.slots[i] = a.slots[j]
			i = j
		}
	}
	a.slots[i] = ackSlot{}
	a.n--
}

func (a *ackMemory) grow() {
	old := a.slots
	a.slots = make([]ackSlot, 2*len(old))
	a.shift--
	for _, s := range old {
		if s.key != 0 {
			i, _ := a.find(s.key)
			a.slots[i] = s
		}
	}
}

// by reports whether leaseID is the lease that ACKed offset.
func (a *ackMemory) by(offset, leaseID uint64) bool {
	if a.packed != nil {
		return leaseID != 0 && a.packedBy(offset+1, leaseID)
	}
	if a.slots == nil || leaseID == 0 {
		return false
	}
	i, ok := a.find(offset + 1)
	return ok && a.slots[i].lease == leaseID
}
