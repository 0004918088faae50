package dedup

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
)

// Defaults and limits.
const (
	// WindowSeqsDefault is Config.WindowSeqs when left zero. It equals the
	// broker's default publish_inflight_max, the most publishes the Go SDK
	// keeps unconfirmed on one connection.
	WindowSeqsDefault = 4096
	// ProducersMaxDefault is Config.ProducersMax when left zero.
	ProducersMaxDefault = 1024
	// EntriesMaxDefault is Config.EntriesMax when left zero: about 4 MiB of
	// remembered sequences per partition.
	EntriesMaxDefault = 1 << 18
	// IdleMsDefault is Config.IdleMs when left zero: one day.
	IdleMsDefault = 24 * 60 * 60 * 1000
	// ProducerIDBytesMax bounds a producer id; longer ones are refused
	// before they reach the table.
	ProducerIDBytesMax = 255
)

// ErrCorrupt: a snapshot is malformed.
var ErrCorrupt = errors.New("dedup: corrupt snapshot")

// Config bounds a Table. Zero fields take their defaults.
type Config struct {
	// WindowSeqs is how many of a producer's highest sequences are
	// remembered.
	WindowSeqs int
	// ProducersMax is how many producers are remembered.
	ProducersMax int
	// EntriesMax bounds the sequences remembered over all producers.
	EntriesMax int
	// IdleMs: a producer with no record for this long is forgotten.
	IdleMs int64
}

func (c Config) normalized() Config {
	if c.WindowSeqs <= 0 {
		c.WindowSeqs = WindowSeqsDefault
	}
	if c.ProducersMax <= 0 {
		c.ProducersMax = ProducersMaxDefault
	}
	if c.EntriesMax <= 0 {
		c.EntriesMax = EntriesMaxDefault
	}
	if c.IdleMs <= 0 {
		c.IdleMs = IdleMsDefault
	}
	// One producer alone must fit in the entry budget.
	c.WindowSeqs = min(c.WindowSeqs, c.EntriesMax)
	return c
}

// Verdict is Check's answer.
type Verdict uint8

// Verdicts.
const (
	Fresh     Verdict = iota + 1 // not seen: store it, then Record it
	Duplicate                    // stored before, at the returned offset
	TooOld                       // below the window: it may have been stored; refuse it
)

var verdictNames = [...]string{"", "fresh", "duplicate", "too_old"}

// String returns the verdict's snake_case name.
func (v Verdict) String() string {
	if v >= Fresh && v <= TooOld {
		return verdictNames[v]
	}
	return "verdict(" + strconv.Itoa(int(v)) + ")"
}

// Stats are the table's counters. Evictions count since the Table was made
// or restored, those made while replaying the log included.
type Stats struct {
	Producers    int
	Entries      int
	EvictedIdle  uint64 // producers forgotten after IdleMs without a record
	EvictedLimit uint64 // producers forgotten to stay within ProducersMax or EntriesMax
}

type entry struct{ seq, offset uint64 }

type producer struct {
	id     string
	seqs   []entry // ascending seq, at most WindowSeqs
	floor  uint64  // highest sequence that left the window; 0: none
	lastMs int64
	// prev and next link the producers in order of their last record,
	// least recent first.
	prev, next *producer
}

// Table is one partition's deduplication state. It is not safe for
// concurrent use: the partition actor owns it.
type Table struct {
	cfg        Config
	byID       map[string]*producer
	head, tail *producer // least and most recently recorded
	entries    int
	clockMs    int64 // highest publish time recorded
	stats      Stats
}

// New returns an empty table.
func New(cfg Config) *Table {
	return &Table{cfg: cfg.normalized(), byID: make(map[string]*producer)}
}

// Check says whether (id, seq) was stored, without changing the table. nowMs
// is the caller's clock, used only to treat an idle producer as forgotten.
// An empty id is never deduplicated: Check returns Fresh.
func (t *Table) Check(id string, seq uint64, nowMs int64) (Verdict, uint64) {
	p := t.byID[id]
	if id == "" || p == nil || p.lastMs+t.cfg.IdleMs <= nowMs {
		return Fresh, 0
	}
	if i, ok := p.find(seq); ok {
		return Duplicate, p.seqs[i].offset
	}
	if seq <= p.floor {
		return TooOld, 0
	}
	return Fresh, 0
}

// Holds reports whether the partition holds (id, seq) as far as a link
// from a later publish is concerned (see Ordered publish in
// docs/protocol.md): seq is remembered, or at or below the producer's floor
// (it left the window: stored, or refused as too old should it come now).
// An unknown or idle-expired producer holds nothing. It changes nothing.
func (t *Table) Holds(id string, seq uint64, nowMs int64) bool {
	p := t.byID[id]
	if id == "" || p == nil || p.lastMs+t.cfg.IdleMs <= nowMs {
		return false
	}
	if seq <= p.floor {
		return true
	}
	_, ok := p.find(seq)
	return ok
}

func (p *producer) find(seq uint64) (int, bool) {
	return slices.BinarySearchFunc(p.seqs, seq, func(e entry, s uint64) int {
		switch {
		case e.seq < s:
			return -1
		case e.seq > s:
			return 1
		}
		return 0
	})
}

// Record remembers that (id, seq) was stored at offset, published at atMs.
// The partition calls it for every Enqueue record with a producer id as it
// applies it, and again in the same order during replay; it never fails. A
// sequence already remembered keeps its first offset. An empty id is
// ignored.
func (t *Table) Record(id string, seq, offset uint64, atMs int64) {
	if id == "" {
		return
	}
	t.clockMs = max(t.clockMs, atMs)
	for t.head != nil && t.head.lastMs+t.cfg.IdleMs <= t.clockMs {
		t.drop(t.head)
		t.stats.EvictedIdle++
	}
	p := t.byID[id]
	if p == nil {
		if len(t.byID) >= t.cfg.ProducersMax {
			t.drop(t.head)
			t.stats.EvictedLimit++
		}
		p = &producer{id: id}
		t.byID[id] = p
	} else {
		t.unlink(p)
	}
	t.link(p)
	p.lastMs = t.clockMs
	switch i, ok := p.find(seq); {
	case ok:
	case seq <= p.floor:
		// It left the window already (a replay of a record Check refused
		// would not exist); nothing to remember.
	default:
		p.seqs = slices.Insert(p.seqs, i, entry{seq, offset})
		t.entries++
		if len(p.seqs) > t.cfg.WindowSeqs {
			p.floor = max(p.floor, p.seqs[0].seq)
			p.seqs = p.seqs[1:]
			t.entries--
		}
	}
	for t.entries > t.cfg.EntriesMax && t.head != p {
		t.drop(t.head)
		t.stats.EvictedLimit++
	}
}

func (t *Table) link(p *producer) {
	p.prev, p.next = t.tail, nil
	if t.tail != nil {
		t.tail.next = p
	} else {
		t.head = p
	}
	t.tail = p
}

func (t *Table) unlink(p *producer) {
	if p.prev != nil {
		p.prev.next = p.next
	} else {
		t.head = p.next
	}
	if p.next != nil {
		p.next.prev = p.prev
	} else {
		t.tail = p.prev
	}
	p.prev, p.next = nil, nil
}

func (t *Table) drop(p *producer) {
	t.unlink(p)
	delete(t.byID, p.id)
	t.entries -= len(p.seqs)
}

// Stats returns the table's counters.
func (t *Table) Stats() Stats {
	s := t.stats
	s.Producers, s.Entries = len(t.byID), t.entries
	return s
}

// Snapshot layout (version 1). uv = unsigned varint, v = signed varint,
// str = uv length + bytes. The partition's checkpoint frame carries the
// checksum.
//
//	+--------+-----+---------+------------+-----------------------+
//	| "SNWD" | ver | clockMs | nProducers | producer * nProducers |
//	| 4 B    | u8  | v       | uv         |                       |
//	+--------+-----+---------+------------+-----------------------+
//
//	producer, least recently recorded first:
//	  id     str     1..ProducerIDBytesMax bytes, unique
//	  lastMs v
//	  floor  uv
//	  n      uv      remembered sequences
//	  n * (seqDelta uv | offset uv)   seq - previous seq (first: seq - floor); > 0
const (
	snapshotMagic   = "SNWD"
	snapshotVersion = 1
	// snapProducerBytesMin is the smallest encoded producer; it bounds the
	// count a snapshot of a given size can claim.
	snapProducerBytesMin = 5
)

// Snapshot appends the encoded table to dst.
func (t *Table) Snapshot(dst []byte) []byte {
	dst = append(dst, snapshotMagic...)
	dst = append(dst, snapshotVersion)
	dst = binary.AppendVarint(dst, t.clockMs)
	dst = binary.AppendUvarint(dst, uint64(len(t.byID)))
	for p := t.head; p != nil; p = p.next {
		dst = binary.AppendUvarint(dst, uint64(len(p.id)))
		dst = append(dst, p.id...)
		dst = binary.AppendVarint(dst, p.lastMs)
		dst = binary.AppendUvarint(dst, p.floor)
		dst = binary.AppendUvarint(dst, uint64(len(p.seqs)))
		prev := p.floor
		for _, e := range p.seqs {
			dst = binary.AppendUvarint(dst, e.seq-prev)
			dst = binary.AppendUvarint(dst, e.offset)
			prev = e.seq
		}
	}
	return dst
}

// Restore decodes a Snapshot under cfg. A snapshot that holds more than cfg
// allows (the bounds were lowered) is trimmed as Record would: the least
// recently recorded producers go first, and each window keeps its highest
// sequences.
func Restore(cfg Config, b []byte) (*Table, error) {
	t := New(cfg)
	d := decoder{b: b}
	if len(b) < len(snapshotMagic)+1 || string(b[:len(snapshotMagic)]) != snapshotMagic {
		return nil, fmt.Errorf("%w: bad magic", ErrCorrupt)
	}
	if v := b[len(snapshotMagic)]; v != snapshotVersion {
		return nil, fmt.Errorf("%w: version %d, want %d", ErrCorrupt, v, snapshotVersion)
	}
	d.b = b[len(snapshotMagic)+1:]
	t.clockMs = d.varint()
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)/snapProducerBytesMin) {
		return nil, fmt.Errorf("%w: %d producers in %d bytes", ErrCorrupt, n, len(d.b))
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		idLen := d.uvarint()
		if d.err == nil && (idLen == 0 || idLen > ProducerIDBytesMax) {
			return nil, fmt.Errorf("%w: producer id of %d bytes", ErrCorrupt, idLen)
		}
		id := string(d.bytes(int(idLen)))
		p := &producer{id: id, lastMs: d.varint(), floor: d.uvarint()}
		k := d.uvarint()
		if d.err == nil && k > uint64(len(d.b)/2) {
			return nil, fmt.Errorf("%w: producer %q claims %d sequences in %d bytes", ErrCorrupt, id, k, len(d.b))
		}
		if d.err != nil {
			break
		}
		if _, dup := t.byID[id]; dup {
			return nil, fmt.Errorf("%w: producer %q twice", ErrCorrupt, id)
		}
		if p.lastMs > t.clockMs || (t.tail != nil && p.lastMs < t.tail.lastMs) {
			return nil, fmt.Errorf("%w: producer %q last seen at %d, out of order", ErrCorrupt, id, p.lastMs)
		}
		p.seqs = make([]entry, 0, k)
		prev := p.floor
		for range k {
			delta, off := d.uvarint(), d.uvarint()
			if d.err != nil {
				break
			}
			if delta == 0 || prev+delta < prev {
				return nil, fmt.Errorf("%w: producer %q: sequence after %d not ascending", ErrCorrupt, id, prev)
			}
			prev += delta
			p.seqs = append(p.seqs, entry{prev, off})
		}
		if over := len(p.seqs) - t.cfg.WindowSeqs; over > 0 {
			p.floor = p.seqs[over-1].seq
			p.seqs = p.seqs[over:]
		}
		t.byID[id] = p
		t.link(p)
		t.entries += len(p.seqs)
	}
	if d.err != nil {
		return nil, fmt.Errorf("%w: %w", ErrCorrupt, d.err)
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(d.b))
	}
	for t.head != nil && (len(t.byID) > t.cfg.ProducersMax || t.entries > t.cfg.EntriesMax) {
		t.drop(t.head)
		t.stats.EvictedLimit++
	}
	return t, nil
}

type decoder struct {
	b   []byte
	err error
}

var errShort = errors.New("truncated")

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errShort
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errShort
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.b) {
		d.err = errShort
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}
