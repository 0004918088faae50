// Package sessiontest provides an in-memory session.Backend for tests of the
// session and server packages: one partition per queue, FIFO dispatch bounded by
// prefetch and paused while the consumer says so (session.Pauser), leases that
// go back to ready on Close or Nack. Everything runs
// synchronously on the caller's goroutine under one mutex; deliveries are handed
// out while that mutex is held, which is allowed because sessions never call the
// backend with their own lock held.
package sessiontest

import (
	"cmp"
	"context"
	"slices"
	"sync"

	"github.com/sinewmq/sinew/internal/session"
	"github.com/sinewmq/sinew/protocol"
)

// Fake is an in-memory backend.
type Fake struct {
	mu        sync.Mutex
	queues    map[[2]string]*queue
	nextSub   uint64
	nextLease uint64
	hold      bool
	held      []func()
	published int
	notReady  bool

	// OnPublish, when set, runs (under the fake's lock) after each accepted
	// publish with the running count. It must not call back into the fake.
	OnPublish func(n int)
	// LeaseExpiresAtMs, when set before a delivery, is the ExpiresAtMs it
	// carries (a replicated partition's lease deadline).
	LeaseExpiresAtMs int64
}

type queue struct {
	// elsewhere: the queue's partition is served by another node now
	// (Serves reports false), as after a cluster failover.
	elsewhere bool
	ready     []*msg
	inflight  map[uint64]*msg
	subs      []*sub
	next      uint64
	rr        int
	acked     int
	failed    int
}

type msg struct {
	off, lease uint64
	attempt    uint32
	body       []byte
	holder     *sub
}

type sub struct {
	f           *Fake
	q           *queue
	id          uint64
	view        protocol.SubView
	c           session.Consumer
	outstanding int
	closed      bool
}

// New returns an empty fake.
func New() *Fake { return &Fake{queues: make(map[[2]string]*queue)} }

// HoldConfirms makes later publishes wait for ReleaseConfirms before done runs.
func (f *Fake) HoldConfirms(hold bool) {
	f.mu.Lock()
	f.hold = hold
	f.mu.Unlock()
}

// ReleaseConfirms runs every held publish completion and reports how many ran.
func (f *Fake) ReleaseConfirms() int {
	f.mu.Lock()
	held := f.held
	f.held = nil
	f.mu.Unlock()
	for _, h := range held {
		h()
	}
	return len(held)
}

// SetReady sets what Ready reports.
func (f *Fake) SetReady(ready bool) {
	f.mu.Lock()
	f.notReady = !ready
	f.mu.Unlock()
}

// Counts reports a queue's ready, inflight, acked and failed counts.
func (f *Fake) Counts(topic, group string) (ready, inflight, acked, failed int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	q := f.queues[[2]string{topic, group}]
	if q == nil {
		return 0, 0, 0, 0
	}
	return len(q.ready), len(q.inflight), q.acked, q.failed
}

// Published reports how many publishes were accepted.
func (f *Fake) Published() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.published
}

func (f *Fake) queueLocked(topic, group string) *queue {
	k := [2]string{topic, group}
	q := f.queues[k]
	if q == nil {
		q = &queue{inflight: make(map[uint64]*msg)}
		f.queues[k] = q
	}
	return q
}

// Declare implements session.Backend.
func (f *Fake) Declare(_ context.Context, d *protocol.DeclareQueue) (protocol.DeclareOK, error) {
	if d.Topic == "" {
		return protocol.DeclareOK{}, protocol.Errorf(protocol.CodeBadRequest, "empty topic")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	_, existed := f.queues[[2]string{d.Topic, d.Group}]
	f.queueLocked(d.Topic, d.Group)
	return protocol.DeclareOK{Partitions: 1, Created: !existed}, nil
}

// Publish implements session.Backend.
func (f *Fake) Publish(p *protocol.Publish, done func(protocol.PublishOK, error)) {
	if p.Topic == "" {
		done(protocol.PublishOK{}, protocol.Errorf(protocol.CodeBadRequest, "empty topic"))
		return
	}
	f.mu.Lock()
	q := f.queueLocked(p.Topic, p.Group)
	m := &msg{off: q.next, body: append([]byte(nil), p.Body...)}
	q.next++
	q.ready = append(q.ready, m)
	f.published++
	if f.OnPublish != nil {
		f.OnPublish(f.published)
	}
	ok := protocol.PublishOK{Offset: m.off}
	f.dispatchLocked(q)
	if f.hold {
		f.held = append(f.held, func() { done(ok, nil) })
		f.mu.Unlock()
		return
	}
	f.mu.Unlock()
	done(ok, nil)
}

// errNotInFake answers the queue operations the fake does not model; tests of
// them run against the real broker (internal/testkit StartBroker).
var errNotInFake = protocol.Errorf(protocol.CodeUnavailable, "the fake backend does not delete or purge queues")

// DeleteQueue implements session.Backend; the fake refuses it.
func (f *Fake) DeleteQueue(context.Context, *protocol.DeleteQueue) error { return errNotInFake }

// PurgeQueue implements session.Backend; the fake refuses it.
func (f *Fake) PurgeQueue(_ *protocol.PurgeQueue, done func(protocol.PurgeOK, error)) {
	done(protocol.PurgeOK{}, errNotInFake)
}

// Subscribe implements session.Backend.
func (f *Fake) Subscribe(req *protocol.Subscribe, c session.Consumer) (session.Subscription, error) {
	if req.Topic == "" {
		return nil, protocol.Errorf(protocol.CodeBadRequest, "empty topic")
	}
	if req.Partition > 0 {
		return nil, protocol.Errorf(protocol.CodeNotFound, "partition %d", req.Partition)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	q := f.queueLocked(req.Topic, req.Group)
	f.nextSub++
	s := &sub{f: f, q: q, id: f.nextSub, c: c, view: protocol.SubView{
		SubID: f.nextSub, Topic: req.Topic, Group: req.Group, Partition: req.Partition, AckMode: req.AckMode, Prefetch: req.Prefetch,
	}}
	q.subs = append(q.subs, s)
	f.dispatchLocked(q)
	return s, nil
}

// Ready implements session.Backend.
func (f *Fake) Ready() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.notReady
}

// dispatchLocked hands ready messages to subscriptions with credit, round-robin.
func (f *Fake) dispatchLocked(q *queue) {
	for len(q.ready) > 0 {
		var target *sub
		for i := range q.subs {
			s := q.subs[(q.rr+i)%len(q.subs)]
			if !s.closed && s.outstanding < int(s.view.Prefetch) && !s.paused() {
				target = s
				q.rr = (q.rr + i + 1) % len(q.subs)
				break
			}
		}
		if target == nil {
			return
		}
		m := q.ready[0]
		q.ready = q.ready[1:]
		f.nextLease++
		m.lease, m.holder = f.nextLease, target
		m.attempt++
		q.inflight[m.off] = m
		target.outstanding++
		target.c.Deliver(target, session.Delivery{
			Offset: m.off, LeaseID: m.lease, Attempt: m.attempt, Body: m.body, Topic: target.view.Topic, Group: target.view.Group,
			ExpiresAtMs: f.LeaseExpiresAtMs,
		})
	}
}

// ExpireLease ends the lease on offset as an expiry would: its holder hears
// of it (when its consumer implements session.LeaseEnder), the message is
// ready again and dispatched. It reports whether offset was inflight.
func (f *Fake) ExpireLease(topic, group string, offset uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	q := f.queues[[2]string{topic, group}]
	if q == nil || q.inflight[offset] == nil {
		return false
	}
	m := q.inflight[offset]
	delete(q.inflight, offset)
	s := m.holder
	m.holder = nil
	s.outstanding--
	if le, ok := s.c.(session.LeaseEnder); ok {
		le.LeaseEnded(s, 0, offset, m.lease)
	}
	q.ready = append(q.ready, m)
	f.dispatchLocked(q)
	return true
}

// CloseFromBroker ends every subscription of a queue as the broker would.
func (f *Fake) CloseFromBroker(topic, group string, reason uint8, err error) {
	f.mu.Lock()
	q := f.queues[[2]string{topic, group}]
	var subs []*sub
	if q != nil {
		for _, s := range q.subs {
			if !s.closed {
				s.closeLocked()
				subs = append(subs, s)
			}
		}
	}
	f.mu.Unlock()
	for _, s := range subs {
		s.c.Closed(s, reason, err)
	}
}

// paused reports whether the consumer has no room for deliveries
// (session.Pauser). The fake delivers synchronously, so it has nothing in
// transit and checks the room before each delivery.
func (s *sub) paused() bool {
	p, ok := s.c.(session.Pauser)
	return ok && p.RoomBytes() <= 0
}

// Wake implements session.Waker: a consumer that was paused takes deliveries
// again.
func (s *sub) Wake() {
	f := s.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if !s.closed {
		f.dispatchLocked(s.q)
	}
}

// ServeElsewhere makes the queue's partition another node's: its
// subscriptions' Serves reports false (session.OwnerChecker).
func (f *Fake) ServeElsewhere(topic, group string) {
	f.mu.Lock()
	f.queueLocked(topic, group).elsewhere = true
	f.mu.Unlock()
}

// Serves implements session.OwnerChecker.
func (s *sub) Serves(uint32, uint64) bool {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	return !s.q.elsewhere
}

func (s *sub) ID() uint64             { return s.id }
func (s *sub) View() protocol.SubView { return s.view }
func (s *sub) Partitions() []uint32   { return []uint32{0} }

func (s *sub) Settle(kind protocol.Op, _ uint32, offset, leaseID uint64, _ int64, done func(protocol.Code)) {
	f := s.f
	f.mu.Lock()
	q := s.q
	m := q.inflight[offset]
	if m == nil || m.lease != leaseID || m.holder != s {
		f.mu.Unlock()
		done(protocol.CodeStaleLease)
		return
	}
	if kind == protocol.OpExtend {
		// The lease stays; the fake keeps no deadlines.
		f.mu.Unlock()
		done(protocol.CodeOK)
		return
	}
	delete(q.inflight, offset)
	s.outstanding--
	m.holder = nil
	switch kind {
	case protocol.OpAck:
		q.acked++
	case protocol.OpFail:
		q.failed++
	default:
		q.ready = append(q.ready, m)
	}
	f.dispatchLocked(q)
	f.mu.Unlock()
	done(protocol.CodeOK)
}

func (s *sub) closeLocked() {
	s.closed = true
	q := s.q
	var back []*msg
	for off, m := range q.inflight {
		if m.holder == s {
			delete(q.inflight, off)
			m.holder = nil
			back = append(back, m)
		}
	}
	slices.SortFunc(back, func(a, b *msg) int { return cmp.Compare(a.off, b.off) })
	q.ready = append(q.ready, back...)
	s.outstanding = 0
	for i, x := range q.subs {
		if x == s {
			q.subs = append(q.subs[:i:i], q.subs[i+1:]...)
			break
		}
	}
}

func (s *sub) Close() {
	f := s.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if s.closed {
		return
	}
	s.closeLocked()
	f.dispatchLocked(s.q)
}
