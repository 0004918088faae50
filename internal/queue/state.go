package queue

import (
	"fmt"
	"math"
	"slices"
)

// Limits and defaults. Every loop a command runs is bounded by one of these.
const (
	// DefaultMaxRetries is Config.MaxRetries when left zero.
	DefaultMaxRetries = 5
	// NoRetries as Config.MaxRetries dead-letters a message on its first
	// failed delivery.
	NoRetries = -1
	// MaxRetriesMax caps Config.MaxRetries so Attempt can never wrap.
	MaxRetriesMax = 1_000_000
	// ReleasesUncountedMax caps the releases of one message that do not
	// count towards MaxRetries. A message handed back this many times by
	// consumers that went away counts its later releases like a NACK, so a
	// consumer that connects, prefetches and vanishes forever cannot keep a
	// message cycling without bound, and Attempt stays far from wrapping.
	ReleasesUncountedMax = 1_000_000
	// DefaultLeaseMs is Config.LeaseMs when left zero.
	DefaultLeaseMs = 30_000
	// LeaseMsMax caps Config.LeaseMs: a week is already a lease nobody will
	// wait for, and the cap keeps nowMs+LeaseMs far from overflow.
	LeaseMsMax = 7 * 24 * 3600 * 1000
	// LeaseBatchMax caps the messages one Lease call hands out.
	LeaseBatchMax = 1024
	// TickEventsMax caps the events one Tick returns. When a Tick returns
	// this many, more may be due: NextDeadlineMs then reports a time <= now.
	TickEventsMax = 1024
	// leaseExpiredScanMax caps how many expired messages one Lease call
	// dead-letters on its way to live ones.
	leaseExpiredScanMax = 256
	// attemptMax is the highest Attempt a message can reach. With a retry
	// limit it is never hit: a requeue dead-letters once the counted
	// deliveries (Attempt minus uncounted releases) reach MaxRetries+1, and
	// at most ReleasesUncountedMax releases go uncounted. With
	// UnlimitedRetries Attempt saturates here instead of wrapping.
	attemptMax = MaxRetriesMax + 1 + ReleasesUncountedMax
	// garbageSlack is how much lazy-deletion garbage an index may carry
	// beyond its live size before it is compacted.
	garbageSlack = 1024
)

// DeadLetterPolicy says where failed messages go.
type DeadLetterPolicy struct {
	// Target is the queue that receives a copy of each dead-lettered
	// message; "" discards them. The partition resolves symbolic policies
	// ("global") into a concrete queue name before handing the config over,
	// and events record the resolved name so replay never consults config.
	Target string
	// Keep makes a queue that never dead-letters or discards anything: a
	// message leaves it only by Ack. Dead-letter queues run this way, so
	// nothing in them is lost without an explicit complete or purge. Keep
	// implies UnlimitedRetries, clears Target and DefaultTTLMs, and changes
	// three commands: Fail requeues the message at once like a Nack
	// (ReasonNack in the log), TTLs are not enforced (Tick, Lease and
	// requeues ignore ExpiresAtMs, and NextDeadlineMs does not report it),
	// and no requeue dead-letters.
	Keep bool
}

// Config holds the knobs commands consult. Apply never reads it: every
// decision is recorded in the events, so changing Config never changes what a
// replay produces.
type Config struct {
	// MaxRetries is how many failed deliveries a message may have after its
	// first one before a requeue turns into a dead-letter
	// (ReasonRetriesExhausted). A delivery fails when it ends in a NACK or
	// in lease expiry; one that ends because its holder went away (Release:
	// a disconnect, an unsubscribe, a lease recovered after a restart) is
	// not counted, up to ReleasesUncountedMax per message. 0 means
	// DefaultMaxRetries; NoRetries means none.
	MaxRetries int
	// UnlimitedRetries, when set, overrides MaxRetries: a requeue never
	// dead-letters for retries, whatever Attempt has reached. Dead-letter
	// queues use it, so nothing in them is lost to a retry limit.
	UnlimitedRetries bool
	// LeaseMs is how long a consumer holds a message before it is requeued.
	// 0 means DefaultLeaseMs.
	LeaseMs int64
	// DefaultTTLMs, when > 0, gives messages published without ExpiresAtMs
	// one of PublishedAtMs+DefaultTTLMs.
	DefaultTTLMs int64
	// DeadLetter is where failed messages go.
	DeadLetter DeadLetterPolicy
}

func (c Config) normalized() Config {
	switch {
	case c.MaxRetries == 0:
		c.MaxRetries = DefaultMaxRetries
	case c.MaxRetries < 0:
		c.MaxRetries = NoRetries
	case c.MaxRetries > MaxRetriesMax:
		c.MaxRetries = MaxRetriesMax
	}
	if c.LeaseMs <= 0 {
		c.LeaseMs = DefaultLeaseMs
	}
	c.LeaseMs = min(c.LeaseMs, LeaseMsMax)
	c.DefaultTTLMs = max(c.DefaultTTLMs, 0)
	if c.DeadLetter.Keep {
		c.UnlimitedRetries = true
		c.DeadLetter.Target = ""
		c.DefaultTTLMs = 0
	}
	return c
}

// phase is where an unsettled message sits internally. Ready and delayed
// together are "queued"; which of the two depends on the clock, see promote.
type phase uint8

const (
	phaseReady phase = 1 + iota
	phaseDelayed
	phaseInflight
	phaseDeadLettering
	phaseCount
)

// entry is the metadata of one message with state of its own (see State);
// 80 bytes, no payload.
type entry struct {
	off         uint64
	notBeforeMs int64
	expiresAtMs int64
	deadlineMs  int64 // inflight: lease deadline; dead-lettering: when
	// leaseID is the current lease when inflight. When queued it is the
	// lease that ended without a settle (expiry or release) and brought the
	// message back, so a late Ack or Fail of it still applies; 0 when the
	// message is new or came back by a Nack.
	leaseID uint64
	owner   string // inflight: lease owner; dead-lettering: target
	attempt uint32
	// gen is bumped on every transition and survives the slot's reuse, so
	// an index item pushed for an earlier transition or an earlier
	// occupant never matches; see item.
	gen    uint32
	phase  phase
	reason Reason // dead-lettering only
	// fresh: ready, never leased, no not-before, only a TTL. Lease finds
	// it by its fresh bit, in offset order with the plain messages, so it
	// needs no item in the ready index.
	fresh bool
	// released counts the deliveries that ended in a Release and did not
	// count towards MaxRetries (at most ReleasesUncountedMax).
	released uint32
	// ownPrev and ownNext link the inflight entries of one owner (noPos
	// ends the list), so detaching a consumer walks its own leases only.
	ownPrev, ownNext uint32
}

// noPos is the null slab position.
const noPos = math.MaxUint32

// countedAttempts is the number of deliveries that count towards
// MaxRetries, the current one included when inflight.
func (e *entry) countedAttempts() int64 { return int64(e.attempt) - int64(e.released) }

func (e *entry) queued() bool { return e.phase == phaseReady || e.phase == phaseDelayed }

// State is one partition's queue. It is not safe for concurrent use: the
// partition actor's goroutine owns it. Queries may reorganise internal indexes
// (dropping garbage, moving due messages to the ready index) but never change
// what any query or command observes.
type State struct {
	cfg Config

	nextLSN  uint64
	leaseSeq uint64 // highest lease id applied
	gate     Gate   // who may lease (see Gate)

	// leaseIDs draws the id of each new lease (SetLeaseIDs); nil numbers
	// them consecutively after leaseSeq.
	leaseIDs func() uint64

	// Unsettled messages. Every one has its live bit in bits. A plain one
	// (enqueued without a not-before or a TTL and never leased since) is
	// nothing more than its plain bit: it is ready, attempt 0, and leased
	// lowest offset first like any other. The first event that gives a
	// message state of its own (a lease, mostly) moves it to the slab, and
	// so does an enqueue with a delay or TTL. A backlog nobody consumes thus
	// costs a few bits per message, and the per-message records follow
	// what consumers hold, not what waits. Settled history needs no record:
	// every LSN below nextLSN without a live bit is settled.
	bits   bitmap
	nLive  int // unsettled messages
	nPlain int // of them plain
	nFresh int // entries that are fresh (see entry.fresh)

	// Messages with state: bits maps the offset to the slab position. Free
	// positions are reused; once they outnumber the used ones (plus slack)
	// compact packs the slab and rebuilds the indexes, so memory follows
	// the number of messages with state.
	slab []entry
	free []uint32

	// owners maps a lease owner to the first entry of its inflight list.
	owners map[string]uint32

	// Time- and offset-ordered indexes over slab positions.
	ready   minHeap // phaseReady entries by offset (key 0)
	delayed minHeap // phaseDelayed by not-before
	leases  minHeap // phaseInflight by lease deadline
	ttl     minHeap // queued with a TTL, by expiry

	counts        [phaseCount]int // phaseReady includes the plain messages
	ttlLive       int             // queued entries with expiresAtMs > 0
	settledRanges int
	deadLetters   map[uint64]struct{} // offsets in phaseDeadLettering

	// Bodies copied forward by Relocate (see relocate.go): moved maps the
	// offset of an unsettled message to the LSN of the Relocate record now
	// holding its body, movedLog lists relocations in LSN order from
	// movedHead on, with stale ones (settled or moved again) skipped
	// lazily. Relocations are few (the stragglers of old segments), so a
	// map beside the slab costs nothing on the hot path.
	moved     map[uint64]uint64
	movedLog  []BodyLoc
	movedHead int

	// promotedMs is the latest clock reading at which due delayed messages
	// were moved to ready. Internal only: it never changes an observation
	// as long as the clock does not step back.
	promotedMs int64

	scratch []item
	plainE  entry // what get returns for a plain message; never stored

	// slack is garbageSlack; tests lower it to make compaction frequent.
	slack int
}

// New returns an empty queue whose first event may have any LSN.
func New(cfg Config) *State {
	return &State{
		bits:        bitmap{slack: bitmapSlack},
		cfg:         cfg.normalized(),
		owners:      make(map[string]uint32),
		deadLetters: make(map[uint64]struct{}),
		moved:       make(map[uint64]uint64),
		promotedMs:  math.MinInt64,
		slack:       garbageSlack,
	}
}

// SetLeaseIDs makes Lease draw each lease id from next instead of counting
// up from the highest one applied. A lease reference travels to the client
// and back in a settle, which the broker accepts on the strength of the id:
// drawn from a source nobody else can predict, an id cannot be guessed by a
// client that was never given it. Only the lease that a command creates
// draws; Apply takes the id from the event, so a replica or a replay needs
// no source. next is called on the goroutine that owns the State.
func (s *State) SetLeaseIDs(next func() uint64) { s.leaseIDs = next }

// SetConfig replaces the configuration used by future commands.
func (s *State) SetConfig(cfg Config) { s.cfg = cfg.normalized() }

// Config returns the effective (defaulted and clamped) configuration;
// passing it back to SetConfig changes nothing.
func (s *State) Config() Config { return s.cfg }

// NextLSN is one past the highest LSN applied: the LSN the next event will
// get at the earliest.
func (s *State) NextLSN() uint64 { return s.nextLSN }

// Frontier is the lowest LSN that is not settled (NextLSN when all are).
// Everything below it is settled, so the log below it is only history. It
// never decreases.
func (s *State) Frontier() uint64 {
	if off, ok := s.bits.first(); ok {
		return off
	}
	return s.nextLSN
}

// get finds the unsettled message at off. A message with state returns its
// slab position and entry; a plain one returns position -1 and an entry
// that describes it (ready, attempt 0), which must not be modified: Apply
// materializes it first.
func (s *State) get(off uint64) (int, *entry, bool) {
	switch pos, kind := s.bits.lookup(off); kind {
	case withState:
		return int(pos), &s.slab[pos], true
	case onlyPlain:
		s.plainE = entry{off: off, phase: phaseReady, ownPrev: noPos, ownNext: noPos}
		return -1, &s.plainE, true
	}
	return 0, nil, false
}

// isSettled reports whether x is a settled LSN.
func (s *State) isSettled(x uint64) bool {
	return x < s.nextLSN && !s.bits.isLive(x)
}

// Apply folds the event ev, appended to the log at lsn, into the state. LSNs
// below NextLSN were applied already and are ignored, so replaying an
// overlapping stretch of log is harmless. LSNs above NextLSN are allowed: the
// skipped LSNs were records that are not queue events and count as settled.
// An event that contradicts the state (a lease of a message that is not
// queued, an ack with the wrong lease, ...) returns an error wrapping
// ErrCorrupt and leaves the state untouched.
func (s *State) Apply(lsn uint64, ev Event) error {
	if lsn < s.nextLSN {
		return nil
	}
	if lsn == math.MaxUint64 {
		return fmt.Errorf("%w: lsn %d out of range", ErrCorrupt, lsn)
	}
	if ev.Kind == KindEnqueue {
		if ev.Msg == nil {
			return fmt.Errorf("%w: lsn %d: enqueue without message", ErrCorrupt, lsn)
		}
		s.advance(lsn, false)
		s.insert(lsn, ev.Msg.NotBeforeMs, ev.Msg.ExpiresAtMs)
		return nil
	}
	if ev.Kind == KindAssign {
		return s.applyAssign(lsn, ev)
	}
	pos, e, ok := s.get(ev.Offset)
	if !ok {
		return fmt.Errorf("%w: lsn %d: %v of offset %d, which is not an unsettled message",
			ErrCorrupt, lsn, ev.Kind, ev.Offset)
	}
	if why := s.check(e, ev); why != "" {
		return fmt.Errorf("%w: lsn %d: %v of offset %d: %s", ErrCorrupt, lsn, ev.Kind, ev.Offset, why)
	}
	s.advance(lsn, true)
	if pos < 0 {
		switch {
		case ev.Kind == KindRelocate:
			// Where the body lives is kept beside the message, not in it.
		case ev.Kind == KindDeadLetter && ev.Target == "":
			// Discarded while plain (a purge): nothing to materialize.
			s.counts[phaseReady]--
			s.settle(-1, ev.Offset)
			return nil
		default:
			pos, e = s.materialize(ev.Offset)
		}
	}
	switch ev.Kind {
	case KindLease:
		s.leaveQueued(pos, e)
		e.phase = phaseInflight
		e.attempt = ev.Attempt
		e.leaseID = ev.LeaseID
		e.owner = ev.Owner
		e.deadlineMs = ev.DeadlineMs
		e.notBeforeMs = 0
		s.counts[phaseInflight]++
		s.leaseSeq = max(s.leaseSeq, ev.LeaseID)
		s.link(pos, e)
		s.pushIndex(&s.leases, item{key: e.deadlineMs, off: e.off, pos: uint32(pos), gen: e.gen}, phaseInflight)
	case KindAck:
		if e.phase == phaseInflight {
			s.leaveInflight(e)
		} else {
			s.leaveQueued(pos, e) // a late ack of the lease that ended
		}
		s.settle(pos, ev.Offset)
	case KindRequeue:
		s.leaveInflight(e)
		if ev.Reason == ReasonReleased && e.released < ReleasesUncountedMax {
			// The holder went away: this delivery does not count towards
			// MaxRetries. Counted here, from the event, so a replay agrees.
			e.released++
		}
		s.enterQueued(pos, e, ev.NotBeforeMs, endedLease(ev))
	case KindDeadLetter:
		if e.phase == phaseInflight {
			s.leaveInflight(e)
		} else {
			s.leaveQueued(pos, e)
		}
		if ev.Target == "" {
			s.settle(pos, ev.Offset)
			break
		}
		e.phase = phaseDeadLettering
		e.owner = ev.Target
		e.reason = ev.Reason
		e.deadlineMs = ev.AtMs
		e.leaseID, e.notBeforeMs = 0, 0
		s.counts[phaseDeadLettering]++
		s.deadLetters[ev.Offset] = struct{}{}
	case KindDeadLetterDone:
		s.counts[phaseDeadLettering]--
		delete(s.deadLetters, ev.Offset)
		s.settle(pos, ev.Offset)
	case KindRelocate:
		s.moveBody(ev.Offset, lsn)
	case KindExtend:
		// A new generation retires the lease's old deadline item.
		e.gen++
		e.deadlineMs = ev.DeadlineMs
		s.pushIndex(&s.leases, item{key: e.deadlineMs, off: e.off, pos: uint32(pos), gen: e.gen}, phaseInflight)
	}
	return nil
}

// ApplyGap records that lsn holds no queue event (a raft leader's no-op, a
// configuration change, another record type): it is settled at once and
// costs nothing. Apply of a later LSN settles skipped LSNs the same way;
// ApplyGap lets the caller move NextLSN past a gap that no event follows
// yet. LSNs below NextLSN are ignored, as in Apply.
func (s *State) ApplyGap(lsn uint64) error {
	if lsn < s.nextLSN {
		return nil
	}
	if lsn == math.MaxUint64 {
		return fmt.Errorf("%w: lsn %d out of range", ErrCorrupt, lsn)
	}
	s.advance(lsn, true)
	return nil
}

// check validates ev against e without changing anything; it returns why the
// event does not fit, or "".
func (s *State) check(e *entry, ev Event) string {
	switch ev.Kind {
	case KindLease:
		if !e.queued() {
			return "message is " + e.phase.String()
		}
		// Ids are consecutive or drawn at random (SetLeaseIDs), so the
		// only lease id that can be told wrong here is 0 or the message's
		// own last one, which a late settle of that lease would match.
		if ev.LeaseID == 0 || ev.LeaseID == e.leaseID {
			return fmt.Sprintf("lease id %d: zero or the message's last lease", ev.LeaseID)
		}
		if want := nextAttempt(e.attempt); ev.Attempt != want {
			return fmt.Sprintf("attempt %d, want %d", ev.Attempt, want)
		}
	case KindAck:
		if !e.settleable(ev.LeaseID) {
			return fmt.Sprintf("message is %v with lease %d, event has lease %d", e.phase, e.leaseID, ev.LeaseID)
		}
	case KindRequeue:
		if e.phase != phaseInflight || e.leaseID != ev.LeaseID {
			return fmt.Sprintf("message is %v with lease %d, event has lease %d", e.phase, e.leaseID, ev.LeaseID)
		}
	case KindDeadLetter:
		if ev.LeaseID == 0 && !e.queued() || ev.LeaseID != 0 && !e.settleable(ev.LeaseID) {
			return fmt.Sprintf("message is %v with lease %d, event has lease %d", e.phase, e.leaseID, ev.LeaseID)
		}
	case KindDeadLetterDone:
		if e.phase != phaseDeadLettering {
			return "message is " + e.phase.String()
		}
	case KindRelocate:
		// Any unsettled message has a body to move.
	case KindExtend:
		if e.phase != phaseInflight || e.leaseID != ev.LeaseID {
			return fmt.Sprintf("message is %v with lease %d, event has lease %d", e.phase, e.leaseID, ev.LeaseID)
		}
	default:
		return "unknown event kind"
	}
	return ""
}

// settleable reports whether an Ack or Fail naming leaseID applies to e: its
// current lease, or the lease that ended without a settle when e has not
// been leased since.
func (e *entry) settleable(leaseID uint64) bool {
	return leaseID != 0 && e.leaseID == leaseID && (e.phase == phaseInflight || e.queued())
}

// endedLease is the lease a Requeue leaves on the message for a late Ack or
// Fail: the one that expired or was released. A Nack is a settle, so after
// one no earlier lease applies.
func endedLease(ev Event) uint64 {
	if ev.Reason == ReasonNack {
		return 0
	}
	return ev.LeaseID
}

// nextAttempt is the Attempt of the next lease of a message leased attempt
// times so far: one more, saturating at attemptMax.
func nextAttempt(attempt uint32) uint32 { return min(attempt+1, attemptMax) }

func (p phase) String() string {
	switch p {
	case phaseReady:
		return "ready"
	case phaseDelayed:
		return "delayed"
	case phaseInflight:
		return "inflight"
	case phaseDeadLettering:
		return "dead_lettering"
	}
	return "free"
}

// advance moves NextLSN past lsn. LSNs skipped on the way are settled, and so
// is lsn itself unless it is an enqueue (msg). Settled runs are counted as
// they grow: a new settled LSN starts a run unless the LSN before it is
// settled too.
func (s *State) advance(lsn uint64, settled bool) {
	if lsn > s.nextLSN {
		s.appendSettled(lsn)
	}
	if settled {
		s.appendSettled(lsn + 1)
	} else {
		s.nextLSN = lsn + 1
	}
}

// appendSettled marks [nextLSN, end) settled and moves NextLSN to end.
func (s *State) appendSettled(end uint64) {
	if s.nextLSN == 0 || !s.isSettled(s.nextLSN-1) {
		s.settledRanges++
	}
	s.nextLSN = end
}

// insert adds the message enqueued at off: a plain bit when it has neither
// a not-before nor a TTL, an entry otherwise.
func (s *State) insert(off uint64, notBeforeMs, expiresAtMs int64) {
	s.nLive++
	if notBeforeMs <= 0 && expiresAtMs <= 0 {
		s.bits.add(off, true, 0)
		s.nPlain++
		s.counts[phaseReady]++
		return
	}
	pos, e := s.alloc(off)
	s.bits.add(off, false, uint32(pos))
	e.expiresAtMs = max(expiresAtMs, 0)
	if notBeforeMs <= 0 {
		s.enterFresh(pos, e)
		return
	}
	s.enterQueued(pos, e, notBeforeMs, 0)
}

// enterFresh makes the new entry at pos, which has a TTL and nothing else,
// a fresh one: ready, ordered for Lease by its bit like a plain message
// instead of by an item in the ready index, and in the TTL index.
func (s *State) enterFresh(pos int, e *entry) {
	e.gen++
	e.phase = phaseReady
	e.fresh = true
	s.bits.setFresh(e.off)
	s.nFresh++
	s.counts[phaseReady]++
	s.ttlLive++
	s.pushIndex(&s.ttl, item{key: e.expiresAtMs, off: e.off, pos: uint32(pos), gen: e.gen}, 0)
}

// alloc gives off a fresh entry in the slab, reusing a free position; the
// caller records the position in bits.
func (s *State) alloc(off uint64) (int, *entry) {
	var pos int
	var gen uint32
	if n := len(s.free); n > 0 {
		pos = int(s.free[n-1])
		s.free = s.free[:n-1]
		gen = s.slab[pos].gen + 1
	} else {
		if len(s.slab) >= noPos {
			panic("queue: more than 2^32-1 messages with state")
		}
		pos = len(s.slab)
		s.slab = append(s.slab, entry{})
	}
	e := &s.slab[pos]
	*e = entry{off: off, gen: gen, ownPrev: noPos, ownNext: noPos}
	return pos, e
}

// materialize moves the plain message at off into the slab, as a ready
// entry that is in no index yet; the caller changes its phase at once. Its
// ready count stays.
func (s *State) materialize(off uint64) (int, *entry) {
	pos, e := s.alloc(off)
	s.bits.unplain(off, uint32(pos))
	s.nPlain--
	e.phase = phaseReady
	return pos, e
}

// enterQueued puts e into the ready or delayed index. Where it goes depends
// on the last clock reading promote saw; either way promote and the query
// methods classify it by the clock they are given. ended is the lease that
// ended without a settle, if any (see entry.leaseID).
func (s *State) enterQueued(pos int, e *entry, notBeforeMs int64, ended uint64) {
	e.gen++
	e.notBeforeMs = max(notBeforeMs, 0)
	e.leaseID, e.owner, e.deadlineMs = ended, "", 0
	p := uint32(pos)
	if e.notBeforeMs > s.promotedMs && e.notBeforeMs > 0 {
		e.phase = phaseDelayed
		s.counts[phaseDelayed]++
		s.pushIndex(&s.delayed, item{key: e.notBeforeMs, off: e.off, pos: p, gen: e.gen}, phaseDelayed)
	} else {
		e.phase = phaseReady
		s.counts[phaseReady]++
		s.pushIndex(&s.ready, item{off: e.off, pos: p, gen: e.gen}, phaseReady)
	}
	if e.expiresAtMs > 0 {
		s.ttlLive++
		s.pushIndex(&s.ttl, item{key: e.expiresAtMs, off: e.off, pos: p, gen: e.gen}, 0)
	}
}

// leaveQueued takes a queued entry out of the queued counts and bumps its
// generation, which retires its ready/delayed/ttl items. The common case, a
// lease of the lowest ready offset, finds its item on top and drops it at
// once instead of leaving garbage.
func (s *State) leaveQueued(pos int, e *entry) {
	if e.fresh {
		e.fresh = false
		s.bits.clearFresh(e.off)
		s.nFresh--
	} else if e.phase == phaseReady && s.ready.len() > 0 {
		if top := s.ready.peek(); int(top.pos) == pos && top.gen == e.gen {
			s.ready.pop()
		}
	}
	s.counts[e.phase]--
	if e.expiresAtMs > 0 {
		s.ttlLive--
	}
	e.gen++
}

func (s *State) leaveInflight(e *entry) {
	s.counts[phaseInflight]--
	s.unlink(e)
	e.gen++
}

// link puts the inflight entry at pos at the head of its owner's list.
func (s *State) link(pos int, e *entry) {
	head, ok := s.owners[e.owner]
	if !ok {
		head = noPos
	}
	e.ownPrev, e.ownNext = noPos, head
	if head != noPos {
		s.slab[head].ownPrev = uint32(pos)
	}
	s.owners[e.owner] = uint32(pos)
}

// unlink takes e out of its owner's list.
func (s *State) unlink(e *entry) {
	if e.ownPrev != noPos {
		s.slab[e.ownPrev].ownNext = e.ownNext
	} else if e.ownNext != noPos {
		s.owners[e.owner] = e.ownNext
	} else {
		delete(s.owners, e.owner)
	}
	if e.ownNext != noPos {
		s.slab[e.ownNext].ownPrev = e.ownPrev
	}
	e.ownPrev, e.ownNext = noPos, noPos
}

// settle forgets the message at off (slab position pos, or -1 when plain),
// whose phase counts were already released.
func (s *State) settle(pos int, off uint64) {
	if pos >= 0 {
		gen := s.slab[pos].gen
		s.slab[pos] = entry{gen: gen}
		s.free = append(s.free, uint32(pos))
	} else {
		s.nPlain--
	}
	s.bits.remove(off)
	s.nLive--
	if len(s.moved) > 0 {
		delete(s.moved, off)
	}

	// Settling off joins the settled runs on either side of it.
	left := off > 0 && s.isSettled(off-1)
	right := s.isSettled(off + 1)
	switch {
	case left && right:
		s.settledRanges--
	case !left && !right:
		s.settledRanges++
	}

	if used := len(s.slab) - len(s.free); len(s.free) > used+s.slack {
		s.compact()
	}
}

// compact packs the entries with state into a fresh slab, in offset order,
// and rebuilds every index over the new positions. It runs once free
// positions outnumber used ones (plus slack), so its O(entries) cost is paid
// for by the settles that freed them.
func (s *State) compact() {
	slab := make([]entry, 0, len(s.slab)-len(s.free))
	for off, pos := range s.bits.states() {
		e := s.slab[pos]
		e.gen = 0
		slab = append(slab, e)
		s.bits.setPos(off, uint32(len(slab)-1))
	}
	s.slab, s.free = slab, s.free[:0]
	if cap(s.free) > 4*garbageSlack {
		s.free = nil
	}
	s.relink()
	s.reindex()
}

// relink rebuilds the owners' inflight lists.
func (s *State) relink() {
	clear(s.owners)
	for i := range s.slab {
		e := &s.slab[i]
		e.ownPrev, e.ownNext = noPos, noPos
		if e.phase == phaseInflight {
			s.link(i, e)
		}
	}
}

// reindex rebuilds the four heaps from the entries, dropping all garbage.
func (s *State) reindex() {
	ready := s.counts[phaseReady] - s.nPlain - s.nFresh
	reset := func(h *minHeap, n int) {
		// Exact size for a restore; shrink after a large backlog drained.
		if cap(h.a) < n || cap(h.a) > 4*n+garbageSlack {
			h.a = make([]item, 0, n)
		}
		h.a = h.a[:0]
	}
	reset(&s.ready, ready)
	reset(&s.delayed, s.counts[phaseDelayed])
	reset(&s.leases, s.counts[phaseInflight])
	reset(&s.ttl, s.ttlLive)
	for i := range s.slab {
		e := &s.slab[i]
		p := uint32(i)
		switch e.phase {
		case phaseReady:
			if !e.fresh {
				s.ready.a = append(s.ready.a, item{off: e.off, pos: p, gen: e.gen})
			}
		case phaseDelayed:
			s.delayed.a = append(s.delayed.a, item{key: e.notBeforeMs, off: e.off, pos: p, gen: e.gen})
		case phaseInflight:
			s.leases.a = append(s.leases.a, item{key: e.deadlineMs, off: e.off, pos: p, gen: e.gen})
		}
		if e.queued() && e.expiresAtMs > 0 {
			s.ttl.a = append(s.ttl.a, item{key: e.expiresAtMs, off: e.off, pos: p, gen: e.gen})
		}
	}
	s.ready.init()
	s.delayed.init()
	s.leases.init()
	s.ttl.init()
}

// live reports whether it still describes its entry in phase p (0: any
// queued phase, for the ttl index).
func (s *State) live(it item, p phase) (*entry, bool) {
	e := &s.slab[it.pos]
	if e.gen != it.gen || e.phase == 0 || e.off != it.off {
		return nil, false
	}
	if p == 0 {
		return e, e.queued()
	}
	return e, e.phase == p
}

// pushIndex adds it to h and compacts h when garbage dominates.
func (s *State) pushIndex(h *minHeap, it item, p phase) {
	h.push(it)
	liveN := s.ttlLive
	if p == phaseReady {
		liveN = s.counts[p] - s.nPlain - s.nFresh
	} else if p != 0 {
		liveN = s.counts[p]
	}
	if h.len() > 2*liveN+s.slack {
		h.filter(func(it item) bool { _, ok := s.live(it, p); return ok })
	}
}

// top drops garbage from the top of h and returns the first live item.
func (s *State) top(h *minHeap, p phase) (item, *entry, bool) {
	for h.len() > 0 {
		it := h.peek()
		if e, ok := s.live(it, p); ok {
			return it, e, true
		}
		h.pop()
	}
	return item{}, nil, false
}

// promote moves delayed messages whose not-before is <= nowMs to the ready
// index. If the clock steps back, messages found due stay due.
func (s *State) promote(nowMs int64) {
	s.promotedMs = max(s.promotedMs, nowMs)
	for {
		it, e, ok := s.top(&s.delayed, phaseDelayed)
		if !ok || it.key > nowMs {
			return
		}
		s.delayed.pop()
		s.counts[phaseDelayed]--
		e.phase = phaseReady
		s.counts[phaseReady]++
		s.pushIndex(&s.ready, item{off: e.off, pos: it.pos, gen: e.gen}, phaseReady)
	}
}

// Lookup reports the state of offset at nowMs. Offsets below NextLSN that are
// not unsettled messages report StateSettled; offsets at or above NextLSN
// report false.
func (s *State) Lookup(offset uint64, nowMs int64) (Info, bool) {
	if offset >= s.nextLSN {
		return Info{}, false
	}
	_, e, ok := s.get(offset)
	if !ok {
		return Info{Offset: offset, State: StateSettled}, true
	}
	s.promote(nowMs)
	return s.info(offset, e), true
}

func (s *State) info(off uint64, e *entry) Info {
	in := Info{Offset: off, Attempt: e.attempt, Released: e.released, NotBeforeMs: e.notBeforeMs, ExpiresAtMs: e.expiresAtMs}
	switch e.phase {
	case phaseReady:
		in.State, in.EndedLeaseID = StateReady, e.leaseID
	case phaseDelayed:
		in.State, in.EndedLeaseID = StateDelayed, e.leaseID
	case phaseInflight:
		in.State = StateInflight
		in.LeaseID, in.Owner, in.DeadlineMs = e.leaseID, e.owner, e.deadlineMs
	case phaseDeadLettering:
		in.State = StateDeadLettering
		in.Reason, in.Target, in.DeadlineMs = e.reason, e.owner, e.deadlineMs
	default:
		panic(fmt.Sprintf("queue: offset %d indexed in phase %d", off, e.phase))
	}
	return in
}

// Stats returns the counters at nowMs.
func (s *State) Stats(nowMs int64) Stats {
	s.promote(nowMs)
	return Stats{
		NextLSN:       s.nextLSN,
		Frontier:      s.Frontier(),
		Ready:         s.counts[phaseReady],
		Delayed:       s.counts[phaseDelayed],
		Inflight:      s.counts[phaseInflight],
		DeadLettering: s.counts[phaseDeadLettering],
		SettledRanges: s.settledRanges,
	}
}

// Inflight lists the leases held by owner, by offset. It walks the owner's
// own list, so it costs O(k log k) for the k leases owner holds, whatever
// the rest of the partition holds; the partition calls it when a consumer
// goes away or resumes, not per delivery.
func (s *State) Inflight(owner string) []Info {
	var out []Info
	pos, ok := s.owners[owner]
	for ok && pos != noPos {
		e := &s.slab[pos]
		out = append(out, s.info(e.off, e))
		pos = e.ownNext
	}
	slices.SortFunc(out, func(a, b Info) int { return cmpU64(a.Offset, b.Offset) })
	return out
}

// PendingDeadLetters lists the messages whose dead-letter copy is still to
// be made, by offset. After a restart the partition redoes each copy and
// then calls DeadLettered.
func (s *State) PendingDeadLetters() []Info {
	out := make([]Info, 0, len(s.deadLetters))
	for off := range s.deadLetters {
		_, e, _ := s.get(off)
		out = append(out, s.info(off, e))
	}
	slices.SortFunc(out, func(a, b Info) int { return cmpU64(a.Offset, b.Offset) })
	return out
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// NextDeadlineMs is the earliest time at which Tick or Lease would act on
// their own: a lease deadline, a not-before, or a TTL. false when nothing is
// scheduled. A result <= now means work is already due.
func (s *State) NextDeadlineMs() (int64, bool) {
	var at int64
	found := false
	for _, c := range [...]struct {
		h *minHeap
		p phase
	}{{&s.leases, phaseInflight}, {&s.delayed, phaseDelayed}, {&s.ttl, 0}} {
		if c.h == &s.ttl && s.cfg.DeadLetter.Keep {
			continue // TTLs are not enforced
		}
		if it, _, ok := s.top(c.h, c.p); ok && (!found || it.key < at) {
			at, found = it.key, true
		}
	}
	return at, found
}
