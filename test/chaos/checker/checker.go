package checker

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// ID names one logical message: the producer that published it and the
// producer's sequence number for it. The workload writes both into the body, so
// a delivery can be traced back to its publish without trusting broker offsets.
type ID struct {
	Producer string
	Seq      uint64
}

func (id ID) String() string { return id.Producer + ":" + strconv.FormatUint(id.Seq, 10) }

// Pos is where the broker stored a message: its partition and offset. A
// message published once has one Pos; a resend the broker failed to
// deduplicate gets a second one.
type Pos struct {
	Partition uint32
	Offset    uint64
}

// idsShownMax bounds how many offending ids a report prints, so that a badly
// broken run still gives a readable failure message.
const idsShownMax = 64

// ErrViolation is matched (errors.Is) by the error Report.Err returns when a
// must-be-zero figure is not zero.
var ErrViolation = errors.New("checker: delivery contract violated")

// msgState is everything recorded about one message.
type msgState struct {
	attempted  bool
	confirmed  bool
	deliveries int
	settled    bool
	// settledAt holds the positions whose ack was confirmed; a delivery of
	// one of them is a settled message delivered again.
	settledAt map[Pos]bool
	// positions are the distinct positions the message was delivered from.
	positions map[Pos]bool
	// ackInDoubt: an ACK was written but its result was lost with the
	// connection and cannot be asked for again (the session was not resumed).
	ackInDoubt bool
	// redeliveredAfterSettle counts deliveries of a position recorded after
	// that position's ack was confirmed.
	redeliveredAfterSettle int
	// redeliveredAt is the position of the first such delivery.
	redeliveredAt Pos
	// trace notes the first few deliveries and settles (time, attempt),
	// printed for a message that breaks the contract.
	trace []traceEv
}

// traceEv is a delivery (attempt > 0, or -1 when unknown) or a settle
// (attempt 0) at atMs.
type traceEv struct {
	atMs    int64
	attempt int64
}

func (e traceEv) String() string {
	switch {
	case e.attempt == 0:
		return fmt.Sprintf("settled t=%dms", e.atMs)
	case e.attempt < 0:
		return fmt.Sprintf("delivered t=%dms", e.atMs)
	}
	return fmt.Sprintf("delivered t=%dms attempt=%d", e.atMs, e.attempt)
}

// traceMax bounds a message's trace.
const traceMax = 6

func (m *msgState) note(atMs, attempt int64) {
	if len(m.trace) < traceMax {
		m.trace = append(m.trace, traceEv{atMs, attempt})
	}
}

// waiting reports whether a drain still waits for m: confirmed, not settled,
// and not delivered with an ack in doubt.
func (m *msgState) waiting() bool {
	return m.confirmed && !m.settled && !(m.ackInDoubt && m.deliveries > 0)
}

// Checker records one workload run. The zero value is not usable; call New.
type Checker struct {
	mu   sync.Mutex
	msgs map[ID]*msgState
	// waiting counts the msgs for which waiting() holds. It is kept up to
	// date by every record so that Outstanding is O(1): a drain polls it
	// while consumers record, and a scan of every message under mu would
	// starve them (hundreds of thousands of messages take tens of ms).
	waiting int

	deliveries int
	corrupt    []string // short descriptions of bodies that failed to verify

	// Delivery timeline, in caller-supplied milliseconds.
	haveDelivery  bool
	firstAtMs     int64
	lastAtMs      int64
	gapMs         int64
	gapFromMs     int64
	gapEndAttempt uint32 // the attempt of the delivery that ended the gap
	settleFailure int    // acks answered with something other than ok
}

// New returns an empty Checker.
func New() *Checker { return &Checker{msgs: make(map[ID]*msgState)} }

func (c *Checker) state(id ID) *msgState {
	m := c.msgs[id]
	if m == nil {
		m = &msgState{}
		c.msgs[id] = m
	}
	return m
}

// update applies f to id's state and keeps c.waiting in step with it.
func (c *Checker) update(id ID, f func(m *msgState)) {
	m := c.state(id)
	before := m.waiting()
	f(m)
	switch after := m.waiting(); {
	case after && !before:
		c.waiting++
	case before && !after:
		c.waiting--
	}
}

// Attempted records that the workload sent a publish of id. A message that was
// attempted but never confirmed may or may not be delivered; both are legal.
func (c *Checker) Attempted(id ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.state(id).attempted = true
}

// Confirmed records that the broker answered a publish of id with PUBLISH_OK
// (a fresh or a duplicate confirm). From here on id must be delivered.
func (c *Checker) Confirmed(id ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.update(id, func(m *msgState) {
		m.attempted = true
		m.confirmed = true
	})
}

// Delivered records that a consumer received a delivery of id from position
// pos at atMs, a time the caller measured on any monotonic scale shared by the
// whole run.
func (c *Checker) Delivered(id ID, pos Pos, atMs int64) {
	c.DeliveredAttempt(id, pos, atMs, 0)
}

// DeliveredAttempt is Delivered with the broker's attempt number of the
// delivery (1 on the first), kept in the trace of an offending message.
func (c *Checker) DeliveredAttempt(id ID, pos Pos, atMs int64, attempt uint32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.update(id, func(m *msgState) {
		a := int64(attempt)
		if attempt == 0 {
			a = -1
		}
		m.note(atMs, a)
		m.deliveries++
		if m.positions == nil {
			m.positions = make(map[Pos]bool, 1)
		}
		m.positions[pos] = true
		if m.settledAt[pos] {
			if m.redeliveredAfterSettle == 0 {
				m.redeliveredAt = pos
			}
			m.redeliveredAfterSettle++
		}
	})
	c.deliveries++
	c.observe(atMs, attempt)
}

// WasSettled reports whether an ack of id was confirmed already (for a
// report that names who delivered it again).
func (c *Checker) WasSettled(id ID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.msgs[id]
	return m != nil && m.settled
}

// Corrupt records a delivery whose body did not verify, at atMs. detail is
// kept for the failure message (bounded).
func (c *Checker) Corrupt(detail string, atMs int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deliveries++
	if len(c.corrupt) < idsShownMax {
		c.corrupt = append(c.corrupt, detail)
	} else if len(c.corrupt) == idsShownMax {
		c.corrupt = append(c.corrupt, "...")
	}
	c.observe(atMs, 0)
}

// observe moves the delivery timeline forward. Records from several consumers
// can arrive slightly out of timestamp order; an earlier time never shrinks
// the timeline.
func (c *Checker) observe(atMs int64, attempt uint32) {
	if !c.haveDelivery {
		c.haveDelivery = true
		c.firstAtMs, c.lastAtMs = atMs, atMs
		return
	}
	if atMs <= c.lastAtMs {
		return
	}
	if gap := atMs - c.lastAtMs; gap > c.gapMs {
		c.gapMs, c.gapFromMs, c.gapEndAttempt = gap, c.lastAtMs, attempt
	}
	c.lastAtMs = atMs
}

// Settled records that the broker answered an ACK of a delivery of id from
// pos with ok: that position is settled and must never be delivered again.
func (c *Checker) Settled(id ID, pos Pos) {
	c.SettledAt(id, pos, -1)
}

// SettledAt is Settled with the time the ack's ok arrived, kept in the
// trace of an offending message.
func (c *Checker) SettledAt(id ID, pos Pos, atMs int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.update(id, func(m *msgState) {
		m.note(atMs, 0)
		m.settled = true
		if m.settledAt == nil {
			m.settledAt = make(map[Pos]bool, 1)
		}
		m.settledAt[pos] = true
	})
}

// AckInDoubt records that an ACK of id was sent but its result was lost with
// the connection and its session is gone, so the workload cannot learn whether
// it took effect. Either outcome is legal: the message is settled, or it comes
// back and is acked again. It only stops Outstanding from waiting for id.
func (c *Checker) AckInDoubt(id ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.update(id, func(m *msgState) { m.ackInDoubt = true })
}

// SettleRefused records an ACK answered with a code other than ok that says
// it did not take effect (stale lease, unknown tag, resource exhausted). It
// is legal and only counted. Refusals that leave the outcome open
// (unavailable from a failed partition) are AckInDoubt instead.
func (c *Checker) SettleRefused() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.settleFailure++
}

// Outstanding returns how many confirmed messages are neither settled nor
// delivered with an ack in doubt. A workload's drain phase waits for it to
// reach zero, polling while consumers record, so it is O(1): it reads a
// count every record keeps current instead of visiting every message.
func (c *Checker) Outstanding() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waiting
}

// Report is the verdict on a run. Lost, SettledRedelivered, Phantom and
// Corrupt must be empty; the rest describe the run.
type Report struct {
	Attempted  int // distinct messages the workload tried to publish
	Confirmed  int // distinct messages the broker confirmed
	Deliveries int // every delivery received, duplicates included
	Delivered  int // distinct messages delivered at least once
	Settled    int // distinct messages whose ack was confirmed
	Duplicates int // Deliveries of known messages minus Delivered
	Unsettled  int // confirmed, delivered, but no ack confirmed by the end
	// DedupMisses counts messages delivered from more than one position: a
	// resend with the same producer id and sequence that the broker stored
	// again instead of recognising it.
	DedupMisses int
	InDoubt     int // of Unsettled: an ack was sent but its result was lost

	SettleRefused int // acks answered with stale_lease, unknown_tag or unavailable

	Lost               []ID // confirmed, never delivered
	SettledRedelivered []ID // delivered again from a position whose ack was confirmed
	// RedeliveredAt maps each of SettledRedelivered to the position it
	// came back from, for looking it up in the broker's log.
	RedeliveredAt map[ID]Pos
	// Traces maps each of SettledRedelivered to its deliveries and settles.
	Traces  map[ID][]string
	Phantom []ID     // delivered, never attempted
	Corrupt []string // bodies that did not verify

	LongestGapMs   int64 // longest stretch between two consecutive deliveries
	LongestGapAtMs int64 // when that stretch began, on the caller's scale
	// LongestGapEndAttempt is the broker's attempt number of the delivery
	// that ended that stretch (0: not known): above 1, a message
	// delivered again, say once its lease ran out.
	LongestGapEndAttempt uint32
	FirstDeliveryMs      int64
	LastDeliveryMs       int64
}

// Report computes the verdict from everything recorded so far.
func (c *Checker) Report() Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := Report{
		Deliveries:           c.deliveries,
		SettleRefused:        c.settleFailure,
		LongestGapMs:         c.gapMs,
		LongestGapAtMs:       c.gapFromMs,
		LongestGapEndAttempt: c.gapEndAttempt,
		FirstDeliveryMs:      c.firstAtMs,
		LastDeliveryMs:       c.lastAtMs,
		Corrupt:              append([]string(nil), c.corrupt...),
	}
	for id, m := range c.msgs {
		if m.attempted {
			r.Attempted++
		}
		if m.confirmed {
			r.Confirmed++
		}
		if m.deliveries > 0 {
			r.Delivered++
			r.Duplicates += m.deliveries - 1
		}
		if len(m.positions) > 1 {
			r.DedupMisses++
		}
		if m.settled {
			r.Settled++
		}
		switch {
		case m.confirmed && m.deliveries == 0:
			r.Lost = append(r.Lost, id)
		case m.confirmed && !m.settled:
			r.Unsettled++
			if m.ackInDoubt {
				r.InDoubt++
			}
		}
		if m.redeliveredAfterSettle > 0 {
			r.SettledRedelivered = append(r.SettledRedelivered, id)
			if r.RedeliveredAt == nil {
				r.RedeliveredAt = map[ID]Pos{}
			}
			r.RedeliveredAt[id] = m.redeliveredAt
			if r.Traces == nil {
				r.Traces = map[ID][]string{}
			}
			for _, e := range m.trace {
				r.Traces[id] = append(r.Traces[id], e.String())
			}
		}
		if m.deliveries > 0 && !m.attempted {
			r.Phantom = append(r.Phantom, id)
		}
	}
	sortIDs(r.Lost)
	sortIDs(r.SettledRedelivered)
	sortIDs(r.Phantom)
	return r
}

func sortIDs(ids []ID) {
	sort.Slice(ids, func(i, j int) bool {
		if ids[i].Producer != ids[j].Producer {
			return ids[i].Producer < ids[j].Producer
		}
		return ids[i].Seq < ids[j].Seq
	})
}

// OK reports whether every must-be-zero figure is zero.
func (r Report) OK() bool {
	return len(r.Lost) == 0 && len(r.SettledRedelivered) == 0 && len(r.Phantom) == 0 && len(r.Corrupt) == 0
}

// Err returns nil when the run kept the contract, and otherwise an error that
// matches ErrViolation and names the offending sequence numbers.
func (r Report) Err() error {
	if r.OK() {
		return nil
	}
	var b strings.Builder
	if len(r.Lost) > 0 {
		fmt.Fprintf(&b, "\n  lost (confirmed, never delivered): %d: %s", len(r.Lost), FormatIDs(r.Lost))
	}
	if len(r.SettledRedelivered) > 0 {
		fmt.Fprintf(&b, "\n  settled-redelivered (delivered after a confirmed ack): %d: %s",
			len(r.SettledRedelivered), FormatIDs(r.SettledRedelivered))
		// Where the first few came back from (partition/offset).
		for i, id := range r.SettledRedelivered[:min(len(r.SettledRedelivered), 8)] {
			pos := r.RedeliveredAt[id]
			if i == 0 {
				b.WriteString("\n    positions:")
			}
			fmt.Fprintf(&b, "\n      %s@%d/%d: %s", id, pos.Partition, pos.Offset, strings.Join(r.Traces[id], ", "))
		}
	}
	if len(r.Phantom) > 0 {
		fmt.Fprintf(&b, "\n  phantom (delivered, never published): %d: %s", len(r.Phantom), FormatIDs(r.Phantom))
	}
	if len(r.Corrupt) > 0 {
		fmt.Fprintf(&b, "\n  corrupt bodies: %d: %s", len(r.Corrupt), strings.Join(r.Corrupt, "; "))
	}
	return fmt.Errorf("%w:%s", ErrViolation, b.String())
}

// String is a one-line summary of the figures, for logs and tables.
func (r Report) String() string {
	return fmt.Sprintf("attempted=%d confirmed=%d deliveries=%d delivered=%d settled=%d lost=%d "+
		"settled_redelivered=%d phantom=%d corrupt=%d duplicates=%d dedup_misses=%d unsettled=%d in_doubt=%d settle_refused=%d longest_gap_ms=%d longest_gap_from_ms=%d longest_gap_end_attempt=%d",
		r.Attempted, r.Confirmed, r.Deliveries, r.Delivered, r.Settled, len(r.Lost),
		len(r.SettledRedelivered), len(r.Phantom), len(r.Corrupt), r.Duplicates, r.DedupMisses, r.Unsettled, r.InDoubt, r.SettleRefused, r.LongestGapMs, r.LongestGapAtMs, r.LongestGapEndAttempt)
}

// FormatIDs prints ids grouped by producer with consecutive sequence numbers
// folded into ranges, e.g. "p0:[3-7,9] p1:[2]". ids must be sorted as Report
// sorts them. At most idsShownMax ranges are printed.
func FormatIDs(ids []ID) string {
	var b strings.Builder
	shown := 0
	for i := 0; i < len(ids); {
		p := ids[i].Producer
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(p)
		b.WriteString(":[")
		first := true
		for i < len(ids) && ids[i].Producer == p {
			lo := ids[i].Seq
			hi := lo
			i++
			for i < len(ids) && ids[i].Producer == p && ids[i].Seq == hi+1 {
				hi = ids[i].Seq
				i++
			}
			if shown == idsShownMax {
				b.WriteString(",...]")
				return b.String()
			}
			shown++
			if !first {
				b.WriteByte(',')
			}
			first = false
			b.WriteString(strconv.FormatUint(lo, 10))
			if hi != lo {
				b.WriteByte('-')
				b.WriteString(strconv.FormatUint(hi, 10))
			}
		}
		b.WriteByte(']')
	}
	return b.String()
}
