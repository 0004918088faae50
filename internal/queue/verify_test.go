package queue

import (
	"fmt"
	"math/bits"
)

// verify checks the internal invariants of s that the observations in the
// model test cannot see directly: the bitmap's counters, cursors and slab
// positions, the slab and its free list, the owners' lists and the counts.
func (s *State) verify() error {
	b := &s.bits
	if b.head > len(b.chunks) || b.plainHead < b.head && b.head < len(b.chunks) {
		return fmt.Errorf("head %d, plain head %d, %d chunks", b.head, b.plainHead, len(b.chunks))
	}
	if b.head < len(b.chunks) && b.chunks[b.head].nLive == 0 {
		return fmt.Errorf("head chunk %d is empty", b.head)
	}
	var live, plain, fresh, empty int
	used := map[uint32]bool{}
	for i := b.head; i < len(b.chunks); i++ {
		c := &b.chunks[i]
		if i > b.head && c.base <= b.chunks[i-1].base || c.base%chunkLSNs != 0 {
			return fmt.Errorf("chunk %d base %d after %d", i, c.base, b.chunks[i-1].base)
		}
		var nl, np, nf, ns int
		for w := range chunkWords {
			if c.plain[w]&^c.live[w] != 0 || c.fresh[w]&^(c.live[w]&^c.plain[w]) != 0 {
				return fmt.Errorf("chunk %d word %d: plain or fresh bits outside live ones", i, w)
			}
			nl += bits.OnesCount64(c.live[w])
			np += bits.OnesCount64(c.plain[w])
			nf += bits.OnesCount64(c.fresh[w])
			ns += bits.OnesCount64(c.live[w] &^ c.plain[w])
		}
		if nl != int(c.nLive) || np != int(c.nPlain) || nf != int(c.nFresh) || ns != len(c.pos) {
			return fmt.Errorf("chunk %d counts live %d/%d plain %d/%d fresh %d/%d pos %d/%d",
				i, nl, c.nLive, np, c.nPlain, nf, c.nFresh, ns, len(c.pos))
		}
		if nl == 0 {
			empty++
		}
		if i < b.plainHead && (np > 0 || nf > 0) {
			return fmt.Errorf("chunk %d below plain head %d holds waiting bits", i, b.plainHead)
		}
		if c.base >= s.nextLSN && nl > 0 {
			return fmt.Errorf("chunk %d at %d holds bits at or above next lsn %d", i, c.base, s.nextLSN)
		}
		live, plain, fresh = live+nl, plain+np, fresh+nf
	}
	if empty != b.empty {
		return fmt.Errorf("%d empty chunks, counted %d", empty, b.empty)
	}
	if live != s.nLive || plain != s.nPlain || fresh != s.nFresh {
		return fmt.Errorf("bits live %d plain %d fresh %d, counters %d %d %d", live, plain, fresh, s.nLive, s.nPlain, s.nFresh)
	}
	var counts [phaseCount]int
	counts[phaseReady] = plain
	for off, pos := range b.states() {
		if int(pos) >= len(s.slab) || used[pos] {
			return fmt.Errorf("offset %d at slab position %d (len %d), used twice: %v", off, pos, len(s.slab), used[pos])
		}
		used[pos] = true
		e := &s.slab[pos]
		if e.off != off || e.phase == 0 {
			return fmt.Errorf("offset %d at slab position %d holds offset %d in phase %v", off, pos, e.off, e.phase)
		}
		if e.fresh != s.bitSet(off, true) {
			return fmt.Errorf("offset %d: fresh %v, bit %v", off, e.fresh, !e.fresh)
		}
		if e.fresh && (e.phase != phaseReady || e.attempt != 0 || e.notBeforeMs != 0) {
			return fmt.Errorf("offset %d fresh in phase %v attempt %d", off, e.phase, e.attempt)
		}
		counts[e.phase]++
	}
	if counts != s.counts {
		return fmt.Errorf("counts %v, entries say %v", s.counts, counts)
	}
	for _, pos := range s.free {
		if used[pos] || s.slab[pos].phase != 0 {
			return fmt.Errorf("free slab position %d in use", pos)
		}
	}
	if len(used)+len(s.free) != len(s.slab) {
		return fmt.Errorf("slab %d: %d used, %d free", len(s.slab), len(used), len(s.free))
	}
	linked := 0
	for owner, pos := range s.owners {
		prev := uint32(noPos)
		for ; pos != noPos; pos = s.slab[pos].ownNext {
			e := &s.slab[pos]
			if e.phase != phaseInflight || e.owner != owner || e.ownPrev != prev {
				return fmt.Errorf("owner %q list: offset %d %v owner %q", owner, e.off, e.phase, e.owner)
			}
			prev = pos
			linked++
		}
	}
	if linked != s.counts[phaseInflight] {
		return fmt.Errorf("%d leases linked to owners, %d inflight", linked, s.counts[phaseInflight])
	}
	return nil
}

// bitSet reports whether off's fresh bit is set (fresh) or its plain bit.
func (s *State) bitSet(off uint64, fresh bool) bool {
	i := s.bits.find(off)
	if i < 0 {
		return false
	}
	w, m := wordBit(off)
	if fresh {
		return s.bits.chunks[i].fresh[w]&m != 0
	}
	return s.bits.chunks[i].plain[w]&m != 0
}
