package queue

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
)

// Snapshot layout (version 6). uv = unsigned varint, v = signed varint,
// str = uv length + bytes. Settled LSNs are not listed: every LSN below
// nextLSN that is neither an entry nor in a plain run is settled, so the
// snapshot is as large as the unsettled set, however long the history, and
// a backlog of plain messages takes a few bytes per run of them.
//
//	+--------+-----+---------+----------+-------+-------------+----------+---------+-------+------+--------+-------+------+--------+
//	| "SNWQ" | ver | nextLSN | leaseSeq | nStrs | str * nStrs | nEntries | entries | nRuns | runs | nMoved | moved | gate | crc32c |
//	| 4 B    | u8  | uv      | uv       | uv    |             | uv       |         | uv    |      | uv     |       |      | u32 LE |
//	+--------+-----+---------+----------+-------+-------------+----------+---------+-------+------+--------+-------+------+--------+
//	crc32c (Castagnoli) covers every byte before it. nMoved and moved are in
//	version >= 3 only, nRuns and runs in version >= 5 only, gate in version
//	>= 6 only: epoch uv | cohort str | member str (see Gate).
//
//	entry, one per message with state of its own, in ascending offset order:
//	  offDelta uv      offset - previous offset (first: offset itself); > 0 after the first
//	  phase    u8      1 queued | 3 inflight | 4 dead-lettering
//	  attempt  uv
//	  released uv      version >= 2 only: uncounted releases (version 1: 0)
//	  notBefore v
//	  expiresAt v
//	  queued only:          endedLease uv   version >= 4 only (older: 0); see entry.leaseID
//	  inflight only:        leaseID uv | owner strIdx uv | deadline v
//	  dead-lettering only:  reason u8  | target strIdx uv | at v
//
//	run, one per maximal run of consecutive plain messages (ready,
//	attempt 0, no not-before, no TTL, no ended lease), in ascending order:
//	  gap uv           first offset - end of the previous run (first: first offset); > 0 after the first
//	  len uv           messages in the run; > 0
//
//	moved, one per relocated body, in ascending offset order:
//	  offDelta uv      offset - previous offset (first: offset itself); an entry's offset
//	  lsnDelta uv      LSN of the Relocate record holding its body, minus the offset; > 0
//
// Owners and targets repeat across many entries, so each distinct string is
// stored once in the string table and entries refer to it by index.
//
// Versions: 1 had no released field; Restore still reads it, and its
// messages start with no uncounted releases. 2 added released. 3 added
// moved; versions 1 and 2 restore with every body at its offset. 4 added
// endedLease to queued entries; older versions restore with none, so a late
// ack of a lease that ended before the checkpoint is stale. 5 moved plain
// messages from entries to runs; an older snapshot's queued entry that is
// plain restores as a plain message, which nothing can tell apart. 6 added
// the gate; older versions restore it open at epoch 0. Snapshot always
// writes the current version.
const (
	snapshotMagic   = "SNWQ"
	snapshotVersion = 6
	// snapshotVersionMin is the oldest version Restore reads.
	snapshotVersionMin = 1
	snapQueued         = 1
	snapInflight       = 3
	snapDeadLetter     = 4
	// snapEntryBytesMin is the smallest encoded entry in any version; it
	// bounds the entry count a snapshot of a given size can claim.
	snapEntryBytesMin = 5
)

// restorePlainMax bounds the plain messages a snapshot may claim. Runs
// make a large backlog's snapshot small, so its size no longer bounds what
// it describes; a claim beyond this (2^32 messages, 2.3 GiB of bitmap) is
// taken for corruption rather than allocated. A variable so that the fuzz
// test can lower it.
var restorePlainMax uint64 = 1 << 32

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Snapshot appends a checkpoint of the state to dst. It covers every LSN
// below NextLSN: Restore of it plus Apply of the events from NextLSN on gives
// the same state as applying the whole log. Config is not included.
func (s *State) Snapshot(dst []byte) []byte {
	start := len(dst)
	dst = append(dst, snapshotMagic...)
	dst = append(dst, snapshotVersion)
	dst = binary.AppendUvarint(dst, s.nextLSN)
	dst = binary.AppendUvarint(dst, s.leaseSeq)

	strIdx := map[string]uint64{}
	var strs []string
	intern := func(v string) uint64 {
		i, ok := strIdx[v]
		if !ok {
			i = uint64(len(strs))
			strIdx[v] = i
			strs = append(strs, v)
		}
		return i
	}
	for i := range s.slab {
		if e := &s.slab[i]; e.phase == phaseInflight || e.phase == phaseDeadLettering {
			intern(e.owner)
		}
	}
	dst = binary.AppendUvarint(dst, uint64(len(strs)))
	for _, v := range strs {
		dst = appendStr(dst, v)
	}

	dst = binary.AppendUvarint(dst, uint64(s.nLive-s.nPlain))
	var prev uint64
	for off, pos := range s.bits.states() {
		e := &s.slab[pos]
		dst = binary.AppendUvarint(dst, off-prev)
		prev = off
		switch e.phase {
		case phaseReady, phaseDelayed:
			dst = append(dst, snapQueued)
		case phaseInflight:
			dst = append(dst, snapInflight)
		case phaseDeadLettering:
			dst = append(dst, snapDeadLetter)
		}
		dst = binary.AppendUvarint(dst, uint64(e.attempt))
		dst = binary.AppendUvarint(dst, uint64(e.released))
		dst = binary.AppendVarint(dst, e.notBeforeMs)
		dst = binary.AppendVarint(dst, e.expiresAtMs)
		switch e.phase {
		case phaseReady, phaseDelayed:
			dst = binary.AppendUvarint(dst, e.leaseID)
		case phaseInflight:
			dst = binary.AppendUvarint(dst, e.leaseID)
			dst = binary.AppendUvarint(dst, strIdx[e.owner])
			dst = binary.AppendVarint(dst, e.deadlineMs)
		case phaseDeadLettering:
			dst = append(dst, byte(e.reason))
			dst = binary.AppendUvarint(dst, strIdx[e.owner])
			dst = binary.AppendVarint(dst, e.deadlineMs)
		}
	}

	// Plain runs. Their count is known only at the end, so they are
	// collected first: one pair per run, few for a backlog.
	var runs []uint64
	var runStart, runEnd uint64
	inRun := false
	for off := range s.bits.from(0, onlyPlain) {
		if inRun && off == runEnd {
			runEnd++
			continue
		}
		if inRun {
			runs = append(runs, runStart, runEnd)
		}
		runStart, runEnd, inRun = off, off+1, true
	}
	if inRun {
		runs = append(runs, runStart, runEnd)
	}
	dst = binary.AppendUvarint(dst, uint64(len(runs)/2))
	prev = 0
	for i := 0; i < len(runs); i += 2 {
		dst = binary.AppendUvarint(dst, runs[i]-prev)
		dst = binary.AppendUvarint(dst, runs[i+1]-runs[i])
		prev = runs[i+1]
	}

	dst = binary.AppendUvarint(dst, uint64(len(s.moved)))
	if len(s.moved) > 0 {
		moved := make([]BodyLoc, 0, len(s.moved))
		for off, at := range s.moved {
			moved = append(moved, BodyLoc{Offset: off, LSN: at})
		}
		slices.SortFunc(moved, func(a, b BodyLoc) int { return cmpU64(a.Offset, b.Offset) })
		prev = 0
		for _, m := range moved {
			dst = binary.AppendUvarint(dst, m.Offset-prev)
			dst = binary.AppendUvarint(dst, m.LSN-m.Offset)
			prev = m.Offset
		}
	}
	dst = binary.AppendUvarint(dst, s.gate.Epoch)
	dst = appendStr(dst, s.gate.Cohort)
	dst = appendStr(dst, s.gate.Member)
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// Restore rebuilds a state from a Snapshot. It checks the checksum and every
// field (offsets ascending and below NextLSN, lease ids not above the lease
// counter, reasons known, release counts within the attempts) and returns an
// error wrapping ErrCorrupt for anything else; it never panics. It reads
// every version from snapshotVersionMin on. Cost is O(n) in the unsettled messages,
// plus O(n) heap construction for the time-ordered indexes.
func Restore(cfg Config, b []byte) (*State, error) {
	if len(b) < len(snapshotMagic)+1+4 || string(b[:len(snapshotMagic)]) != snapshotMagic {
		return nil, fmt.Errorf("%w: not a queue snapshot", ErrCorrupt)
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return nil, fmt.Errorf("%w: snapshot checksum mismatch", ErrCorrupt)
	}
	d := decoder{b: body, off: len(snapshotMagic)}
	ver := d.byte()
	if ver < snapshotVersionMin || ver > snapshotVersion {
		return nil, fmt.Errorf("%w: snapshot version %d, want %d to %d", ErrCorrupt, ver, snapshotVersionMin, snapshotVersion)
	}
	s := New(cfg)
	s.nextLSN = d.uvarint()
	s.leaseSeq = d.uvarint()
	if d.err == nil && s.nextLSN == math.MaxUint64 {
		d.fail("next lsn %d out of range", s.nextLSN)
	}

	nStrs := d.uvarint()
	if nStrs > uint64(d.remaining()) {
		d.fail("string count %d exceeds snapshot", nStrs)
	}
	var strs []string
	if d.err == nil {
		strs = make([]string, nStrs)
		for i := range strs {
			strs[i] = string(d.bytes())
		}
	}
	str := func() string {
		i := d.uvarint()
		if d.err == nil && i >= uint64(len(strs)) {
			d.fail("string index %d of %d", i, len(strs))
			return ""
		}
		if d.err != nil {
			return ""
		}
		return strs[i]
	}

	n := d.uvarint()
	if n > uint64(d.remaining()/snapEntryBytesMin) || n > math.MaxUint32 {
		d.fail("entry count %d exceeds snapshot", n)
	}
	if d.err != nil {
		return nil, fmt.Errorf("restore: %w", d.err)
	}
	// Entries are read into a slab in offset order; the ones an older
	// version wrote for plain messages are only noted, as plain.
	ents := make([]entry, 0, n)
	var plainOld []uint64

	var off uint64
	for i := uint64(0); i < n; i++ {
		delta := d.uvarint()
		if d.err == nil && (i > 0 && delta == 0 || delta > math.MaxUint64-off) {
			d.fail("offset delta %d after %d", delta, off)
		}
		off += delta
		if d.err == nil && off >= s.nextLSN {
			d.fail("offset %d at or above next lsn %d", off, s.nextLSN)
		}
		e := entry{off: off, ownPrev: noPos, ownNext: noPos}
		ph := d.byte()
		a := d.uvarint()
		if a > attemptMax {
			d.fail("attempt %d out of range", a)
		}
		e.attempt = uint32(a)
		if ver >= 2 {
			r := d.uvarint()
			if d.err == nil && (r > ReleasesUncountedMax || r > a) {
				d.fail("offset %d: %d releases with attempt %d", off, r, a)
			}
			e.released = uint32(r)
		}
		e.notBeforeMs = d.varint()
		e.expiresAtMs = d.varint()
		switch ph {
		case snapQueued:
			// Everything with a not-before waits in the delayed index until
			// the first clock reading promotes it.
			e.notBeforeMs = max(e.notBeforeMs, 0)
			e.phase = phaseReady
			if e.notBeforeMs > 0 {
				e.phase = phaseDelayed
			}
			if ver >= 4 {
				e.leaseID = d.uvarint()
				if d.err == nil && (e.leaseID > s.leaseSeq || e.leaseID != 0 && e.attempt == 0) {
					d.fail("offset %d: ended lease %d (counter %d) attempt %d", off, e.leaseID, s.leaseSeq, e.attempt)
				}
			}
		case snapInflight:
			e.phase = phaseInflight
			e.leaseID = d.uvarint()
			e.owner = str()
			e.deadlineMs = d.varint()
			// The current delivery has not ended, so it cannot be among
			// the released ones.
			if d.err == nil && (e.leaseID == 0 || e.leaseID > s.leaseSeq || e.attempt == 0 || e.released >= e.attempt) {
				d.fail("offset %d: lease %d (counter %d) attempt %d", off, e.leaseID, s.leaseSeq, e.attempt)
			}
		case snapDeadLetter:
			e.phase = phaseDeadLettering
			e.reason = Reason(d.byte())
			e.owner = str()
			e.deadlineMs = d.varint()
			if d.err == nil && !isDeadLetterReason(e.reason) {
				d.fail("offset %d: dead-letter reason %d", off, e.reason)
			}
		default:
			d.fail("offset %d: phase %d", off, ph)
		}
		if d.err != nil {
			return nil, fmt.Errorf("restore: %w", d.err)
		}
		if ver < 5 && e.phase == phaseReady && e == (entry{off: off, phase: phaseReady, ownPrev: noPos, ownNext: noPos}) {
			plainOld = append(plainOld, off)
			continue
		}
		ents = append(ents, e)
	}

	// Plain runs (version 5), as [start, end) pairs.
	var runs []uint64
	if ver >= 5 {
		nRuns := d.uvarint()
		if nRuns > uint64(d.remaining()/2) {
			d.fail("run count %d exceeds snapshot", nRuns)
		}
		var end, total uint64
		for i := uint64(0); i < nRuns && d.err == nil; i++ {
			gap, length := d.uvarint(), d.uvarint()
			if d.err != nil {
				break
			}
			if i > 0 && gap == 0 || length == 0 || gap > s.nextLSN-end || length > s.nextLSN-end-gap {
				d.fail("plain run %d+%d after %d (next lsn %d)", gap, length, end, s.nextLSN)
				break
			}
			if total += length; total > restorePlainMax {
				d.fail("plain runs hold more than %d messages", restorePlainMax)
				break
			}
			runs = append(runs, end+gap, end+gap+length)
			end += gap + length
		}
	} else {
		for _, o := range plainOld {
			if k := len(runs); k > 0 && runs[k-1] == o {
				runs[k-1]++
			} else {
				runs = append(runs, o, o+1)
			}
		}
	}
	if d.err != nil {
		return nil, fmt.Errorf("restore: %w", d.err)
	}

	// Set the bits in offset order, merging entries and runs; an offset in
	// both is corrupt.
	s.slab = ents
	ri := 0
	addRuns := func(below uint64) bool {
		for ; ri < len(runs) && runs[ri] < below; ri += 2 {
			if runs[ri+1] > below {
				d.fail("plain run [%d, %d) holds entry %d", runs[ri], runs[ri+1], below)
				return false
			}
			for o := runs[ri]; o < runs[ri+1]; o++ {
				s.bits.add(o, true, 0)
			}
			n := int(runs[ri+1] - runs[ri])
			s.nPlain += n
			s.nLive += n
			s.counts[phaseReady] += n
		}
		return true
	}
	for i := range s.slab {
		e := &s.slab[i]
		if !addRuns(e.off) {
			break
		}
		if ri < len(runs) && runs[ri] == e.off {
			d.fail("plain run at entry %d", e.off)
			break
		}
		s.bits.add(e.off, false, uint32(i))
		s.nLive++
		s.counts[e.phase]++
		if e.phase == phaseReady && e.attempt == 0 && e.leaseID == 0 && e.notBeforeMs == 0 {
			// As enqueued, with a TTL: fresh (see entry.fresh).
			e.fresh = true
			s.bits.setFresh(e.off)
			s.nFresh++
		}
		switch e.phase {
		case phaseDeadLettering:
			s.deadLetters[e.off] = struct{}{}
		case phaseReady, phaseDelayed:
			if e.expiresAtMs > 0 {
				s.ttlLive++
			}
		}
	}
	if d.err == nil {
		addRuns(math.MaxUint64)
	}
	if d.err != nil {
		return nil, fmt.Errorf("restore: %w", d.err)
	}
	if ver >= 3 {
		restoreMoved(s, &d)
	}
	if ver >= 6 && d.err == nil {
		s.gate.Epoch = d.uvarint()
		s.gate.Cohort = string(d.bytes())
		s.gate.Member = string(d.bytes())
		if g := s.gate; d.err == nil && (len(g.Cohort) > GateFieldMax || len(g.Member) > GateFieldMax || g.Cohort == "" && g.Member != "") {
			d.fail("gate cohort %q member %q", g.Cohort, g.Member)
		}
	}
	if d.err == nil && d.remaining() != 0 {
		d.fail("%d trailing bytes", d.remaining())
	}
	if d.err != nil {
		return nil, fmt.Errorf("restore: %w", d.err)
	}
	s.rebuildMovedLog()
	s.relink()
	s.reindex()

	// Count the settled runs: the gaps between unsettled offsets, and the
	// tail between the last one and nextLSN.
	var next uint64 // lowest LSN not yet accounted for
	for o := range s.bits.from(0, anyLive) {
		if o > next {
			s.settledRanges++
		}
		next = o + 1
	}
	if s.nextLSN > next {
		s.settledRanges++
	}
	return s, nil
}

// restoreMoved reads the moved section: each offset must be an unsettled
// message, listed once in ascending order, and its body LSN must lie above
// it and below NextLSN.
func restoreMoved(s *State, d *decoder) {
	n := d.uvarint()
	if n > uint64(d.remaining()/2) || n > uint64(s.nLive) {
		d.fail("moved count %d exceeds snapshot", n)
	}
	var off uint64
	for i := uint64(0); i < n && d.err == nil; i++ {
		delta, lsnDelta := d.uvarint(), d.uvarint()
		if d.err != nil {
			return
		}
		if i > 0 && delta == 0 || delta > math.MaxUint64-off {
			d.fail("moved offset delta %d after %d", delta, off)
			return
		}
		off += delta
		if _, _, ok := s.get(off); !ok {
			d.fail("moved offset %d is not an unsettled message", off)
			return
		}
		if lsnDelta == 0 || lsnDelta >= s.nextLSN-off {
			d.fail("offset %d: body lsn %d+%d out of range (next lsn %d)", off, off, lsnDelta, s.nextLSN)
			return
		}
		s.moved[off] = off + lsnDelta
	}
}
