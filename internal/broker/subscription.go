package broker

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/internal/cohort"
	"github.com/sinewmq/sinew/internal/partition"
	"github.com/sinewmq/sinew/internal/queue"
	"github.com/sinewmq/sinew/protocol"
)

// Subscription is one consumer's attachment to a queue: to one partition or
// to all of them, sharing one prefetch budget.
//
// Credit. credit counts deliveries the subscription may still receive. A
// partition reserves credit before leasing (TakeCredit) and refunds what it
// did not use. A delivered lease stays in outstanding until either the
// consumer's settle is answered or the partition reports the lease ended
// (LeaseEnded: expired, released, dead-lettered); whichever removes it from
// outstanding gives its credit back, so each delivery returns credit exactly
// once. So the deliveries handed to the consumer and still current never
// exceed the prefetch. A partition that finds no credit sets starved; whoever next
// returns credit pokes the subscription's partitions, so none waits for
// credit that came back while it was not looking.
//
// Room. For a consumer that implements PausableConsumer, TakeCredit also
// keeps the deliveries in transit (reserved by TakeCredit, not yet handed to
// Deliver nor refunded) within the consumer's RoomBytes, counting each at the
// running average size of past deliveries (one at a time until the first is
// seen). Without room it returns 0 and sets starved; the consumer's Wake, and
// a delivery that leaves transit while starved, poke the partitions the same
// way returned credit does. Credit a partition carries over from a settle
// (CarryCredit) is spent without this check: it follows a settle, so the
// consumer is reading.
type Subscription struct {
	b     *Broker
	id    uint64
	owner string
	view  protocol.SubView
	q     *queueEntry
	c     Consumer
	pause PausableConsumer // c, when it can pause; nil otherwise
	atts  []*attachment

	credit  atomic.Int64
	starved atomic.Bool
	// inTransit and avgBytes serve the room check (pausable consumers only).
	inTransit   atomic.Int64
	avgBytes    atomic.Int64
	roomStarved atomic.Bool // a partition found no room (not no credit)
	closed      atomic.Bool
	// adopted counts the recovered leases SubscribeWith adopted (written
	// before it returns).
	adopted int
	// cohort and member: the cohort the subscription is a member of, and
	// its member id (cohorts.go); "" for a plain one. joined once the
	// broker counts it as a member.
	cohort, member string
	joined         bool

	mu sync.Mutex
	// outstanding holds the deliveries not yet settled; true marks one
	// whose credit a partition already carried over to the next lease
	// (CarryCredit), so removing it returns nothing.
	outstanding map[leaseKey]bool
}

type leaseKey struct {
	partition uint32
	offset    uint64
	leaseID   uint64
}

// attachment is the subscription as one partition sees it.
type attachment struct {
	s   *Subscription
	idx uint32
	p   *partition.Partition
	// told, assigned and epoch: what the consumer was last told of its
	// assignment of this partition (cohorts.go). Partition goroutine only.
	told, assigned bool
	epoch          uint64
}

// Subscribe attaches c to one partition of a queue, or to all of them when
// req.Partition < 0 (skipping quarantined and failed ones). The queue is
// created on first use. A partition that serves nothing (quarantined or
// failed) is CodeUnavailable at once, saying which and why, as is a
// subscription to every partition when none serves. Prefetch 0 means PrefetchDefault (capped at PrefetchMax);
// above PrefetchMax is CodeLimitExceeded.
func (b *Broker) Subscribe(req *protocol.Subscribe, c Consumer) (*Subscription, error) {
	return b.SubscribeWith(req, c, SubscribeOptions{})
}

// SubscribeOptions give a subscription a stable identity (see
// SubscribeWith) and decide whether it may create its queue. The zero value
// is what Subscribe uses.
type SubscribeOptions struct {
	// ID, when not 0, is the subscription's id instead of a fresh one: a
	// subscription restored after a restart keeps the id its client knows.
	// It must not be in use (CodeBadRequest otherwise); ReserveSubIDs keeps
	// fresh ids away from it.
	ID uint64
	// OwnerPrefix, when set, makes the lease owner OwnerPrefix + "/" + the
	// id, instead of a name carrying this process's start time. The caller
	// derives it from things stable across restarts (the session layer:
	// owner id and client id), so that the owner recorded in the partition
	// logs names the same subscription after a restart.
	OwnerPrefix string
	// Adopt, after attaching, takes back on each partition the leases
	// recovered from the log under this subscription's owner (see
	// partition.Partition.Adopt): they count against the prefetch and are
	// delivered again, same lease id and attempt, before SubscribeWith
	// returns. Subscription.Adopted says how many.
	Adopt bool
	// MayCreate, when set, decides whether this subscription may create
	// its queue on first use (see CreateCheck); nil lets it.
	MayCreate CreateCheck
}

// ReserveSubIDs makes every id that Subscribe hands out from now on at
// least next: ids recorded before a restart are never reused.
func (b *Broker) ReserveSubIDs(next uint64) {
	for {
		cur := b.nextSub.Load()
		if cur+1 >= next || b.nextSub.CompareAndSwap(cur, next-1) {
			return
		}
	}
}

// adoptWaitMs bounds how long SubscribeWith waits for the partitions to
// adopt their recovered leases; a partition that does not answer in time
// keeps them for the grace, after which they are released.
const adoptWaitMs = 10_000

// SubscribeWith is Subscribe with a stable identity; see SubscribeOptions.
func (b *Broker) SubscribeWith(req *protocol.Subscribe, c Consumer, opts SubscribeOptions) (*Subscription, error) {
	if b.closed.Load() {
		return nil, ErrShuttingDown
	}
	if err := validName("topic", req.Topic, false); err != nil {
		return nil, err
	}
	if err := validName("group", req.Group, true); err != nil {
		return nil, err
	}
	if req.AckMode != protocol.AckManual && req.AckMode != protocol.AckAuto {
		return nil, protocol.Errorf(protocol.CodeBadRequest, "unknown ack mode %d", req.AckMode)
	}
	prefetch := int64(req.Prefetch)
	switch {
	case prefetch == 0:
		prefetch = min(PrefetchDefault, int64(b.cfg.PrefetchMax))
	case prefetch > int64(b.cfg.PrefetchMax):
		return nil, protocol.Errorf(protocol.CodeLimitExceeded, "prefetch %d is above %d", prefetch, b.cfg.PrefetchMax)
	}
	q, err := b.lookupOrCreate(req.Topic, req.Group, opts.MayCreate)
	if err != nil {
		return nil, err
	}
	id := opts.ID
	if id == 0 {
		id = b.nextSub.Add(1)
	}
	owner := b.owner + "." + strconv.FormatUint(id, 10)
	if opts.OwnerPrefix != "" {
		owner = opts.OwnerPrefix + "/" + strconv.FormatUint(id, 10)
	}
	s := &Subscription{
		b: b, id: id, q: q, c: c,
		owner: owner,
		view: protocol.SubView{SubID: id, Topic: req.Topic, Group: req.Group, Partition: req.Partition,
			AckMode: req.AckMode, Prefetch: uint32(prefetch)},
		outstanding: make(map[leaseKey]bool),
		cohort:      req.Cohort,
		member:      req.Member,
	}
	if (s.cohort == "") != (s.member == "") {
		return nil, protocol.Errorf(protocol.CodeBadRequest, "a cohort member needs both a cohort and a member id")
	}
	if s.cohort != "" {
		if err := cohort.ValidName(s.cohort); err != nil {
			return nil, protocol.Errorf(protocol.CodeBadRequest, "cohort %q: %v", s.cohort, err)
		}
		if err := cohort.ValidMemberID(s.member); err != nil {
			return nil, protocol.Errorf(protocol.CodeBadRequest, "member %q: %v", s.member, err)
		}
	}
	s.view.Partition = max(req.Partition, -1)
	s.pause, _ = c.(PausableConsumer)
	s.credit.Store(prefetch)
	if opts.Adopt {
		// No delivery until every partition has handed back the leases
		// to adopt: they count against the prefetch first, or a
		// partition attached before the others answered could lease past
		// it. adopt gives the prefetch back once they have.
		s.credit.Store(0)
	}
	switch {
	case req.Partition >= 0:
		if int(req.Partition) >= len(q.parts) {
			return nil, protocol.Errorf(protocol.CodeNotFound, "queue %q group %q has no partition %d", req.Topic, req.Group, req.Partition)
		}
		p := q.parts[req.Partition]
		if p.Unavailable() != nil {
			return nil, unavailableError(q, uint32(req.Partition))
		}
		s.atts = []*attachment{{s: s, idx: uint32(req.Partition), p: p}}
	default:
		for i, p := range q.parts {
			if p.Unavailable() == nil {
				s.atts = append(s.atts, &attachment{s: s, idx: uint32(i), p: p})
			}
		}
		if len(s.atts) == 0 {
			return nil, protocol.Errorf(protocol.CodeUnavailable,
				"queue %q group %q: none of its %d partitions is served (quarantined or failed)", req.Topic, req.Group, len(q.parts))
		}
	}
	b.subsMu.Lock()
	if b.closed.Load() {
		b.subsMu.Unlock()
		return nil, ErrShuttingDown
	}
	if q.deleted.Load() {
		// Delete took the queue away after lookup found it, and has
		// already looked for its subscriptions.
		b.subsMu.Unlock()
		return nil, errDeletedMeanwhile(q.key)
	}
	if _, taken := b.subs[id]; taken {
		b.subsMu.Unlock()
		return nil, protocol.Errorf(protocol.CodeBadRequest, "subscription id %d is in use", id)
	}
	b.subs[id] = s
	b.subsMu.Unlock()
	if err := b.joinCohort(s); err != nil {
		b.unregister(s)
		return nil, err
	}
	s.joined = s.cohort != ""
	for i, a := range s.atts {
		if err := a.p.Attach(a); err != nil {
			for _, a := range s.atts[:i] {
				a.p.Detach(a)
			}
			b.unregister(s)
			return nil, b.partitionError("subscribe", q, a.idx, err)
		}
	}
	if opts.Adopt {
		s.adopt()
		s.returnCredit(int(prefetch))
	}
	return s, nil
}

// adopt asks every partition to hand back the subscription's recovered
// leases and waits, bounded, for the answers.
func (s *Subscription) adopt() {
	got := make(chan int, len(s.atts))
	for _, a := range s.atts {
		a.p.Adopt(a, func(n int) { got <- n })
	}
	timeout := time.NewTimer(adoptWaitMs * time.Millisecond)
	defer timeout.Stop()
	for range s.atts {
		select {
		case n := <-got:
			s.adopted += n
		case <-timeout.C:
			s.b.logger.Warn("partitions did not answer an adoption in time", "topic", s.view.Topic, "group", s.view.Group, "sub_id", s.id)
			return
		}
	}
}

// Adopted returns how many recovered leases SubscribeWith adopted.
func (s *Subscription) Adopted() int { return s.adopted }

// AdoptCredit implements partition.Adopter: adopted leases count against
// the prefetch like any delivery, so the credit goes down (below zero if
// the prefetch shrank across the restart) and comes back with each settle.
func (a *attachment) AdoptCredit(n int) { a.s.credit.Add(-int64(n)) }

// Partitions lists the partitions the subscription is attached to.
func (s *Subscription) Partitions() []uint32 {
	out := make([]uint32, len(s.atts))
	for i, a := range s.atts {
		out[i] = a.idx
	}
	return out
}

// ID returns the broker-assigned subscription id, unique within the process.
func (s *Subscription) ID() uint64 { return s.id }

// View describes the subscription: topic, group, partition (-1 = all), ack
// mode and the prefetch in force.
func (s *Subscription) View() protocol.SubView { return s.view }

// Settle acks (protocol.OpAck), requeues (OpNack, not before delayMs from
// now) or fails (OpFail) one lease. done gets CodeOK once the settle record
// is durable; CodeOK as well for an ACK or FAIL of a lease that ended
// without a settle (expired, released) while the message has not been
// leased again, which is applied, and for a NACK of one, which has nothing
// left to do; CodeStaleLease if the message was leased again or settled
// since (the session answers its own repeated settles);
// CodeBadRequest for a NACK delay above Config.NackDelayMsMax (the lease
// stays held), or the code of a partition error (unavailable, resource
// exhausted: retry). done must not
// block; it may run before Settle returns. A settle of a delivery this
// subscription holds frees its prefetch credit.
func (s *Subscription) Settle(kind protocol.Op, partitionIdx uint32, offset, leaseID uint64, delayMs int64, done func(protocol.Code)) {
	var op partition.SettleOp
	switch kind {
	case protocol.OpExtend:
		s.extend(partitionIdx, offset, leaseID, delayMs, done)
		return
	case protocol.OpAck:
		op = partition.Ack
	case protocol.OpNack:
		op = partition.Nack
	case protocol.OpFail:
		op = partition.Fail
	default:
		done(protocol.CodeBadRequest)
		return
	}
	if int(partitionIdx) >= len(s.q.parts) {
		done(protocol.CodeNotFound)
		return
	}
	if s.b.fenced() {
		done(protocol.CodeFenced)
		return
	}
	if kind == protocol.OpNack && delayMs > s.b.cfg.NackDelayMsMax {
		// Refused, not clamped (caps.go); the lease stays held.
		done(protocol.CodeBadRequest)
		return
	}
	var notBefore int64
	if kind == protocol.OpNack && delayMs > 0 {
		notBefore = s.b.cfg.Now().UnixMilli() + delayMs
	}
	k := leaseKey{partitionIdx, offset, leaseID}
	// The attachment lets the partition carry the freed credit over to
	// this subscription's next lease (CarryCredit).
	var by partition.Consumer
	for _, a := range s.atts {
		if a.idx == partitionIdx {
			by = a
			break
		}
	}
	p := s.q.parts[partitionIdx]
	p.SettleFor(by, op, offset, leaseID, notBefore, func(err error) {
		code := settleCode(kind, err)
		if err != nil && s.q.self != 0 && (errors.Is(err, partition.ErrNotLeader) || !s.q.leadsHere(p)) {
			// A replica that does not lead (any more) settles nothing:
			// the lease is the owner's to settle, and the client sends
			// the settle there by its lease reference.
			code = protocol.CodeFenced
		}
		refund := false
		if code != protocol.CodeResourceExhausted {
			// Settled, stale or refused for good: the delivery is no
			// longer outstanding. Whoever removes it from outstanding
			// (this settle or the partition's LeaseEnded) returns its
			// credit, so it comes back exactly once, unless the
			// partition carried it over to a lease already.
			held, carried := s.forget(k)
			refund = held && !carried
		}
		// The consumer learns of the settle before the credit it frees
		// can bring a new delivery, so it never sees more than prefetch.
		done(code)
		if refund {
			s.returnCredit(1)
		}
	})
}

// extend is Settle's EXTEND: the lease's deadline becomes the owner's now
// plus extendMs. done gets CodeOK once the Extend record is durable;
// CodeStaleLease when the lease is not current (ended, settled, leased
// again); CodeBadRequest for extendMs below 1 or above a queue's longest
// lease (the server bounds it by queue.lease_ms_max before); CodeFenced
// from a replica that does not lead the partition; or a partition error's
// code. The delivery stays outstanding: its prefetch credit is not freed.
func (s *Subscription) extend(partitionIdx uint32, offset, leaseID uint64, extendMs int64, done func(protocol.Code)) {
	if int(partitionIdx) >= len(s.q.parts) {
		done(protocol.CodeNotFound)
		return
	}
	if extendMs < 1 || extendMs > queue.LeaseMsMax {
		done(protocol.CodeBadRequest)
		return
	}
	if s.b.fenced() {
		done(protocol.CodeFenced)
		return
	}
	var by partition.Consumer
	for _, a := range s.atts {
		if a.idx == partitionIdx {
			by = a
			break
		}
	}
	p := s.q.parts[partitionIdx]
	p.ExtendFor(by, offset, leaseID, extendMs, func(err error) {
		code := extendCode(err)
		if err != nil && s.q.self != 0 && (errors.Is(err, partition.ErrNotLeader) || !s.q.leadsHere(p)) {
			code = protocol.CodeFenced
		}
		done(code)
	})
}

// extendCode maps a partition's answer to an EXTEND.
func extendCode(err error) protocol.Code {
	switch {
	case err == nil:
		return protocol.CodeOK
	case errors.Is(err, queue.ErrAlreadySettled), errors.Is(err, queue.ErrStaleLease), errors.Is(err, queue.ErrUnknownOffset):
		return protocol.CodeStaleLease
	case errors.Is(err, queue.ErrInvalidDeadline):
		return protocol.CodeBadRequest
	}
	return protocol.CodeOf(err)
}

// Serves reports whether this node serves partition partitionIdx now under
// epoch (the owner's raft term a delivery carried; 0 matches any): on a
// single node always; in a cluster while this node's replica leads the
// partition in that term (session.OwnerChecker).
func (s *Subscription) Serves(partitionIdx uint32, epoch uint64) bool {
	if int(partitionIdx) >= len(s.q.parts) {
		return false
	}
	p := s.q.parts[partitionIdx]
	if s.q.self == 0 {
		return true
	}
	lead, term := p.Leader()
	return lead == s.q.self && (epoch == 0 || epoch == term)
}

// LeaseCurrent reports whether a settle of offset in partitionIdx by
// leaseID would still take effect (see partition.Partition.LeaseCurrent).
func (s *Subscription) LeaseCurrent(ctx context.Context, partitionIdx uint32, offset, leaseID uint64) (bool, error) {
	if int(partitionIdx) >= len(s.q.parts) {
		return false, nil
	}
	return s.q.parts[partitionIdx].LeaseCurrent(ctx, offset, leaseID)
}

// forget removes k from the outstanding deliveries and says whether it was
// there and whether its credit was carried over (CarryCredit).
func (s *Subscription) forget(k leaseKey) (held, carried bool) {
	s.mu.Lock()
	carried, held = s.outstanding[k]
	delete(s.outstanding, k)
	s.mu.Unlock()
	return held, carried
}

// settleCode maps a partition's answer to a settle. A message already
// settled is stale_lease, except an ACK by the lease that ACKed it, which
// the partition answers ok itself from its bounded memory of recent ACKs
// (a repeat whose answer was lost, even across a crash); the session also
// answers its own recent repeats ok before they get here. A lease
// that ended without a settle, the message queued again, is ok for a NACK
// (the queue applies an ACK or FAIL of it).
func settleCode(kind protocol.Op, err error) protocol.Code {
	switch {
	case err == nil:
		return protocol.CodeOK
	case errors.Is(err, queue.ErrAlreadyRequeued):
		return protocol.CodeOK
	case errors.Is(err, queue.ErrAlreadySettled), errors.Is(err, queue.ErrStaleLease), errors.Is(err, queue.ErrUnknownOffset):
		return protocol.CodeStaleLease
	}
	return protocol.CodeOf(err)
}

// Close detaches the subscription: no delivery starts after it, and every
// lease it still holds goes back to ready at once (on each partition's next
// turn). A Deliver already under way may still complete. Close is
// idempotent and may be called from Consumer methods. The consumer's
// Closed is not called.
func (s *Subscription) Close() { s.end(0, nil, true) }

// end closes the subscription once; with notify the consumer is not told
// (the caller closed it), otherwise Closed(reason, err) is called. release
// hands the leases back at once.
func (s *Subscription) end(reason uint8, err error, release bool) {
	if s.closed.Swap(true) {
		return
	}
	if release {
		for _, a := range s.atts {
			a.p.Detach(a)
		}
	}
	s.b.unregister(s)
	s.mu.Lock()
	clear(s.outstanding)
	s.mu.Unlock()
	if reason != 0 {
		s.c.Closed(s, reason, err)
	}
}

func (b *Broker) unregister(s *Subscription) {
	b.subsMu.Lock()
	delete(b.subs, s.id)
	b.subsMu.Unlock()
	b.leaveCohort(s)
}

// returnCredit gives n deliveries back and wakes partitions that found the
// budget empty.
func (s *Subscription) returnCredit(n int) {
	s.credit.Add(int64(n))
	if s.starved.Load() && s.starved.Swap(false) {
		for _, a := range s.atts {
			a.p.Poke()
		}
	}
}

// Wake tells the subscription that its consumer, paused until now (see
// PausableConsumer), takes deliveries again: partitions that found it paused
// look again. It never blocks and may be called from any goroutine.
func (s *Subscription) Wake() { s.returnCredit(0) }

// Owner implements partition.Consumer.
func (a *attachment) Owner() string { return a.s.owner }

// TakeCredit implements partition.Consumer.
func (a *attachment) TakeCredit(want int) int {
	s := a.s
	if s.closed.Load() {
		return 0
	}
	if s.pause != nil {
		fit := s.fits(want)
		if fit == 0 {
			s.roomStarved.Store(true)
			s.starved.Store(true)
			// A Wake between the check and the store found starved
			// unset and poked nobody: look again.
			if fit = s.fits(want); fit == 0 {
				return 0
			}
		}
		want = fit
	}
	for {
		c := s.credit.Load()
		if c <= 0 {
			s.starved.Store(true)
			// Credit returned between the load and the store found
			// starved unset and woke nobody: look again.
			if s.credit.Load() <= 0 {
				return 0
			}
			continue
		}
		n := min(c, int64(want))
		if s.credit.CompareAndSwap(c, c-n) {
			if s.pause != nil {
				s.inTransit.Add(n)
			}
			return int(n)
		}
	}
}

// fits returns how many of want deliveries fit in the consumer's room beside
// those in transit (see Room in the type's doc).
func (s *Subscription) fits(want int) int {
	room := s.pause.RoomBytes()
	if room <= 0 {
		return 0
	}
	inTransit := s.inTransit.Load()
	avg := s.avgBytes.Load()
	if avg <= 0 {
		// No size seen yet: one at a time until one is.
		if inTransit > 0 {
			return 0
		}
		return 1
	}
	n := room/avg - inTransit
	if n <= 0 {
		if inTransit > 0 {
			return 0
		}
		n = 1 // room for part of one: let it through, the cap absorbs it
	}
	return int(min(n, int64(want)))
}

// leftTransit notes that n reserved deliveries were handed over or refunded,
// and pokes the partitions if one found no room meanwhile.
func (s *Subscription) leftTransit(n int64) {
	for {
		v := s.inTransit.Load()
		// Deliveries of carried credit were never counted in.
		d := min(v, n)
		if d <= 0 || s.inTransit.CompareAndSwap(v, v-d) {
			break
		}
	}
	if s.roomStarved.Load() && s.roomStarved.Swap(false) {
		s.returnCredit(0)
	}
}

// RefundCredit implements partition.Consumer.
func (a *attachment) RefundCredit(n int) {
	if a.s.pause != nil {
		a.s.leftTransit(int64(n))
	}
	a.s.returnCredit(n)
}

// Deliver implements partition.Consumer.
func (a *attachment) Deliver(d partition.Delivery) {
	s := a.s
	if s.closed.Load() {
		return // the lease is released when the detach is processed
	}
	s.mu.Lock()
	s.outstanding[leaseKey{a.idx, d.Offset, d.LeaseID}] = false
	s.mu.Unlock()
	if s.pause != nil {
		n := int64(len(d.Body) + len(d.Key) + len(d.ContentType) + len(s.view.Topic) + len(s.view.Group) + deliveryOverheadBytes)
		for _, h := range d.Headers {
			n += int64(len(h.Key) + len(h.Value) + 8)
		}
		// A running average over about the last eight deliveries.
		if avg := s.avgBytes.Load(); avg <= 0 {
			s.avgBytes.Store(n)
		} else {
			s.avgBytes.Store(avg + (n-avg)/8)
		}
	}
	d.Partition, d.Topic, d.Group = a.idx, s.view.Topic, s.view.Group
	s.c.Deliver(s, d)
	if s.pause != nil {
		// After Deliver, so the consumer's room already counts it.
		s.leftTransit(1)
	}
}

// deliveryOverheadBytes is what the room check charges a delivery on top of
// its payload and names: the frame header, fixed fields and the structs that
// carry it (the session charges the same).
const deliveryOverheadBytes = 128

// LeaseEnded implements partition.Consumer: the lease is no longer current
// (settled, expired, released, dead-lettered). If the consumer still holds
// the delivery, its credit comes back now, so a consumer that missed a
// delivery (its frame died with a socket, say) is not starved of the
// redelivery; a later settle of that lease gets CodeStaleLease and returns
// nothing more.
func (a *attachment) LeaseEnded(offset, leaseID uint64) {
	s := a.s
	held, carried := s.forget(leaseKey{a.idx, offset, leaseID})
	if !held {
		return
	}
	if lc, ok := s.c.(LeaseEndedConsumer); ok && !s.closed.Load() {
		lc.LeaseEnded(s, a.idx, offset, leaseID)
	}
	if !carried {
		s.returnCredit(1)
	}
}

// CarryCredit implements partition.CreditCarrier: this subscription's
// settle of a delivery it holds was just appended, so the partition may
// spend the delivery's credit on the next lease of the same stage, whose
// delivery comes after the settle's answer. The delivery stays outstanding
// until that answer; marked carried, its removal returns no credit.
//
// A consumer with no room (paused, at its outbound byte cap, or on a broker
// that is draining) carries nothing: carried credit skips the room check
// that every other lease passes, so a consumer settling steadily would
// otherwise keep being leased new messages while the broker drains, and the
// drain could never find it idle. Its credit comes back the usual way and
// waits for room.
func (a *attachment) CarryCredit(offset, leaseID uint64) bool {
	s := a.s
	if s.closed.Load() {
		return false
	}
	if s.pause != nil && s.pause.RoomBytes() <= 0 {
		return false
	}
	k := leaseKey{a.idx, offset, leaseID}
	s.mu.Lock()
	defer s.mu.Unlock()
	carried, held := s.outstanding[k]
	if !held || carried {
		return false
	}
	s.outstanding[k] = true
	return true
}

// forgetPartition drops the outstanding deliveries of partition idx and
// returns their credit, for a replica that stopped leading.
func (s *Subscription) forgetPartition(idx uint32) {
	s.mu.Lock()
	n := int64(0)
	for k, carried := range s.outstanding {
		if k.partition == idx {
			if !carried {
				n++
			}
			delete(s.outstanding, k)
		}
	}
	s.mu.Unlock()
	if n > 0 {
		s.credit.Add(n)
	}
}

// Detached implements partition.Consumer: a partition failed, so the
// subscription ends with SubClosedError and CodeUnavailable. (A replica
// that lost the lead in a cluster keeps the subscription instead.) The consumer
// is told which partition failed, not the cause, which names server paths;
// the partition logged it. Its leases on the other partitions stay its own
// for endedSubLeaseKeepMs, then go back to the queue.
func (a *attachment) Detached(err error) {
	s := a.s
	if errors.Is(err, partition.ErrNotLeader) && s.b.cfg.Cluster != nil && !s.closed.Load() {
		// In a cluster the replica lost the lead to another node: the
		// subscription stays, attached to the replica again (served
		// once it leads again), and the deliveries it held from this
		// partition are let go: their leases are the new owner's to
		// end, and their settles here are refused.
		s.forgetPartition(a.idx)
		if a.p.Attach(a) == nil {
			return
		}
	}
	// Detach from the healthy partitions; the failed one dropped us.
	if s.closed.Swap(true) {
		return
	}
	reason := protocol.SubClosedError
	switch {
	case errors.Is(err, partition.ErrClosed) && s.q.deleted.Load():
		reason, err = protocol.SubClosedQueueDeleted, errDeletedMeanwhile(s.q.key)
	case errors.Is(err, partition.ErrClosed):
		reason, err = protocol.SubClosedShutdown, ErrShuttingDown
	default:
		err = unavailableError(s.q, a.idx)
	}
	for _, o := range s.atts {
		if o != a {
			// Not Detach: the consumer has not heard yet that the
			// subscription ended, and may still be reading deliveries
			// of these partitions. Released at once, one of them could
			// be delivered to a competing consumer and ACKed ok before
			// this client reads its copy: a message would reach a
			// client after its ACK was answered ok. Kept, its late ACK
			// (through the session's ended table) settles it instead.
			o.p.DetachKeeping(o, endedSubLeaseKeepMs)
		}
	}
	s.b.unregister(s)
	s.c.Closed(s, reason, err)
}

// endedSubLeaseKeepMs is how long the leases of a subscription the broker
// ended because one of its partitions failed stay with it on its other
// partitions (partition.Partition.DetachKeeping): long enough for its client
// to read the deliveries already sent and settle them late, after which those
// still unsettled go back to the queue as a release.
const endedSubLeaseKeepMs = 5_000
