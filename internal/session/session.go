package session

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/internal/sessionstore"
	"github.com/sinewmq/sinew/protocol"
)

type state uint8

const (
	stateAttached state = iota // a sink is attached
	stateDormant               // no sink; waiting out the grace
	stateClosed                // cleaned up; terminal
)

// Session is one client's logical connection. See the package documentation.
type Session struct {
	reg      *Registry
	clientID string
	token    []byte
	// tokenHash and restored: a session restored from the store after a
	// restart knows only its token's hash until its client resumes it
	// (restored is then cleared and token set). Both under Registry.mu.
	tokenHash [32]byte
	restored  bool
	// principal owns the session (auth.Principal.Owner of the connection
	// that opened it): a resume presented by any other principal is
	// rejected. "" only for a session restored from a store written before
	// sessions recorded it, which any principal holding the token may
	// resume. Set at creation or restore, then read-only.
	principal string

	mu sync.Mutex
	// member is the member id of the session's cohort subscriptions, once
	// it opened one (cohort.go).
	member    string
	state     state
	sink      Sink
	connID    uint64
	pending   []Outbound // pushes waiting for a sink, oldest first
	graceStop func() bool
	inGrace   bool   // counted in Registry.dormant
	graceGen  uint64 // bumped on every attach/detach so a stale timer does nothing
	subs      map[uint64]*subState
	subsOpen  int // subscriptions being created (counted against the limit)
	tags      map[uint64]tagEntry
	lastTag   uint64
	// attachGen counts attaches; a tag delivered under an earlier one is
	// settled "late" (see Stats).
	attachGen uint64
	// ended holds the leases that ended without a settle while the session
	// held them, outcomes the leases the session settled; both bounded by
	// Config.SettleMemoryMax (see settle.go).
	ended, outcomes tagMemory
	prefetches      uint64 // summed prefetch of subs, bounds pending
	// resendTags are the tags whose DELIVER may have died with the previous
	// socket, noted at a resume and re-sent by Resend. Bounded by tags.
	resendTags []uint64
	// pendingBytes is the Outbound.Bytes of pending; at DormantBytesMax the
	// subscriptions pause (dormantFull) until a sink takes them.
	pendingBytes atomic.Int64 // changed under mu
	// heldBytes is the Outbound.Bytes of the DELIVERs tags keep for re-send,
	// bounded by ResendBytesMax; resendFullLogged says the bound was logged.
	heldBytes        int64
	resendFullLogged bool

	// throttle is the attached sink's Throttle (nil without a sink or when
	// the sink has none); dormantFull is set while pending is at its bound.
	// Both are read without mu by roomBytes, from partition goroutines.
	throttle    atomic.Pointer[Throttle]
	dormantFull atomic.Bool
	// restoring is set (under mu) from a restore until the first attach:
	// the deliveries of adopted leases are then noted for re-send, never
	// buffered, since the client may hold them already (see restore.go).
	restoring bool
	// fromRestart is set (under mu) from a restore until the first
	// INFLIGHT: a reported delivery the session does not hold is then not
	// called stale, since its lease may have been settled by the client's
	// own ACK whose answer died with the old process (restore.go).
	fromRestart bool
	// detached is set while no sink is attached (dormant): the session's
	// subscriptions then take no new deliveries, so a live consumer of the
	// same queue gets them instead. Read without mu by roomBytes.
	detached atomic.Bool
	// graceUntil is when the grace under way ends (for Registry.Sessions).
	graceUntil time.Time
	// brokerClosed holds the SUB_CLOSED of the subscriptions the broker
	// ended (queue deleted, error) since the last reconciliation, oldest
	// first, at most SubscriptionsMax: the frame may have gone to a socket
	// that was already dead, so Reconcile sends it again for a subscription
	// the client still lists instead of recreating it.
	brokerClosed []*protocol.SubClosed
}

// subState is the session's record of one subscription.
type subState struct {
	sub       Subscription // set once the backend returned it
	id        uint64
	view      protocol.SubView
	parts     []uint32
	autoAck   bool
	prefetch  uint32
	announced bool       // SUBSCRIBE_OK (or RECONCILE_RESULT) is queued; deliveries may follow
	early     []Outbound // deliveries that arrived before the announcement
	// earlyBytes is the Outbound.Bytes of early; at DormantBytesMax the
	// subscription pauses (earlyFull, read without mu) until announced.
	earlyBytes atomic.Int64 // changed under mu
	earlyFull  atomic.Bool
	closed     bool
	// reconciled: reconciliation closed it. Its deliveries are then stale
	// for good, as the client was told the subscription is gone (see
	// forgetSubLocked).
	reconciled bool
	// cohort and member: the cohort the subscription is a member of, and
	// its member id (cohort.go); "" for a plain one.
	cohort, member string
}

// tagEntry is what a delivery tag stands for.
type tagEntry struct {
	st        *subState
	partition uint32
	offset    uint64
	leaseID   uint64
	gen       uint64 // Session.attachGen when delivered
	// d is the DELIVER as first sent, kept so that a resume can send it again
	// with the same tag, lease and attempt. Bodies are shared, never copied.
	// Nil for auto-ack deliveries, and when ResendBytesMax was reached.
	d *protocol.Deliver
	// bytes is d's share of heldBytes (0 when d is nil).
	bytes int64
	// adopted: a lease taken back after a restart, under a fresh tag that
	// INFLIGHT may replace with the one the client holds.
	adopted bool
	// notAfterMs is the delivery's Outbound.NotAfterMs, kept for re-sends.
	notAfterMs int64
	// epoch is the DELIVER's epoch (0 on a single node): a lease reference
	// naming another epoch does not name this delivery.
	epoch uint64
}

func newSession(r *Registry, id string, token []byte) *Session {
	return &Session{
		reg: r, clientID: id, token: token, state: stateDormant,
		subs: make(map[uint64]*subState), tags: make(map[uint64]tagEntry),
		ended: tagMemory{max: r.cfg.SettleMemoryMax}, outcomes: tagMemory{max: r.cfg.SettleMemoryMax},
	}
}

// ClientID returns the session's client id.
func (s *Session) ClientID() string { return s.clientID }

// Identity returns the resume identity to hand to the client.
func (s *Session) Identity() protocol.ResumeIdentity {
	return protocol.ResumeIdentity{ClientID: s.clientID, OwnerID: s.reg.cfg.OwnerID, Token: append([]byte(nil), s.token...)}
}

func (s *Session) logger() *slog.Logger {
	return s.reg.log.With("client_id", s.clientID, "conn_id", s.connID)
}

// attach makes sink the session's transport, sends HELLO_OK and then whatever was
// buffered. It reports false when the session is already closed.
func (s *Session) attach(sink Sink, connID uint64, hello Hello, outcome protocol.ResumeOutcome) bool {
	s.mu.Lock()
	if s.state == stateClosed {
		s.mu.Unlock()
		return false
	}
	old := s.sink
	s.sink, s.connID, s.state = sink, connID, stateAttached
	s.restoring = false
	s.attachGen++
	if t, ok := sink.(Throttle); ok {
		t.SetOnDrain(s.wake)
		s.throttle.Store(&t)
	} else {
		s.throttle.Store(nil)
	}
	wasFull := s.dormantFull.Swap(false)
	wasDetached := s.detached.Swap(false)
	s.graceGen++
	if s.graceStop != nil {
		s.graceStop()
		s.graceStop = nil
	}
	if s.inGrace {
		s.inGrace = false
		s.reg.dormant.Add(-1)
	}
	if hello != nil {
		sink.Send(hello(s.Identity(), outcome))
	}
	pending := s.pending
	s.pending = nil
	s.pendingBytes.Store(0)
	if outcome == protocol.ResumeResumed {
		s.noteResendLocked(pending)
	}
	for _, o := range pending {
		if d, ok := o.Body.(*protocol.Deliver); ok {
			e, held := s.tags[d.Tag]
			if !held {
				o.drop() // its lease ended meanwhile (see leaseEnded)
				continue
			}
			if !s.servesLocked(e) {
				s.dropTagLocked(d.Tag, e)
				o.drop()
				continue
			}
		}
		s.emitLocked(o)
	}
	if outcome == protocol.ResumeResumed {
		s.logger().Info("resume accepted", "flushed", len(pending), "subscriptions", len(s.subs), "tags", len(s.tags),
			"to_resend", len(s.resendTags), "took_over", old != nil)
	}
	s.mu.Unlock()
	if old != nil && old != sink {
		old.Kick()
	}
	if wasFull || wasDetached {
		s.wake() // paused while dormant; the new sink takes deliveries
	}
	return true
}

// noteResendLocked records, at a resume, every manual-ack delivery the session
// still holds unsettled whose DELIVER was handed to an earlier socket: it may have
// been written and then lost with that socket. Deliveries still in pending (never
// written) or waiting for their subscription's announcement are sent anyway and
// are left out. Auto-ack deliveries leave the tag table once written, so any
// still held was never written. Resend sends the noted ones.
func (s *Session) noteResendLocked(pending []Outbound) {
	unsent := make(map[uint64]bool, len(pending))
	for _, o := range pending {
		if d, ok := o.Body.(*protocol.Deliver); ok {
			unsent[d.Tag] = true
		}
	}
	s.resendTags = s.resendTags[:0]
	for tag, e := range s.tags {
		if e.d == nil || e.st.autoAck || !e.st.announced || unsent[tag] {
			continue
		}
		s.resendTags = append(s.resendTags, tag)
	}
	slices.Sort(s.resendTags) // first delivered, first re-sent
}

// Resend sends again, through the current sink, the DELIVER of every delivery
// noted at the last resume that the session still holds: same tag, same lease,
// same attempt. Deliveries settled, or whose subscription was closed (for
// example by reconciliation) since the resume, are skipped. The server calls it
// right after RECONCILE_RESULT (Reconcile does so itself), or before handling the
// first request after a resume that is not a RECONCILE. Later calls do nothing
// until the next resume. Clients de-duplicate by tag.
func (s *Session) Resend() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resendLocked()
}

func (s *Session) resendLocked() {
	if len(s.resendTags) == 0 || s.state == stateClosed {
		s.resendTags = nil
		return
	}
	n := 0
	for _, tag := range s.resendTags {
		e, ok := s.tags[tag]
		if !ok || e.st.closed {
			continue
		}
		if !s.servesLocked(e) {
			s.dropTagLocked(tag, e)
			continue
		}
		s.emitLocked(Outbound{Body: e.d, NotAfterMs: e.notAfterMs})
		n++
	}
	s.resendTags = nil
	s.reg.resent.Add(uint64(n))
	s.logger().Info("unsettled deliveries re-sent after resume", "count", n)
}

// Detach tells the session that sink's connection is gone. unsent are the frames
// its writer never wrote: pushes among them are kept for the next sink, the rest are
// dropped. With no grace (or while draining) the session is cleaned up at once;
// otherwise it goes dormant until a resume or the grace timer.
func (s *Session) Detach(sink Sink, unsent []Outbound) {
	s.mu.Lock()
	if s.state == stateClosed || s.sink != sink {
		// Either cleaned up already, or taken over by a newer connection: hand
		// surviving pushes to whoever is current.
		for _, o := range unsent {
			if s.state != stateClosed && o.isPush() {
				s.emitLocked(o)
			} else {
				o.drop()
			}
		}
		s.mu.Unlock()
		return
	}
	s.sink = nil
	s.throttle.Store(nil)
	s.detached.Store(true)
	keep := make([]Outbound, 0, len(unsent)+len(s.pending))
	for _, o := range unsent {
		if o.isPush() {
			keep = append(keep, o)
			s.pendingBytes.Add(int64(o.Bytes()))
		} else {
			o.drop()
		}
	}
	s.pending = append(keep, s.pending...)
	s.notePendingLocked()
	grace := s.reg.ReconnectGraceMs()
	if grace <= 0 || s.reg.isDraining() {
		s.mu.Unlock()
		s.cleanup("disconnect")
		return
	}
	if n := s.reg.dormant.Load(); n >= int64(s.reg.cfg.DormantSessionsMax) {
		// A flood of dropped connections must not pin unbounded state:
		// past the bound a disconnect is final, and a resume of this
		// session gets resume_not_found.
		s.mu.Unlock()
		s.reg.dormantCapped.Add(1)
		s.reg.log.Warn("dormant session limit reached; session closed instead of entering grace",
			"client_id", s.clientID, "dormant", n, "dormant_sessions_max", s.reg.cfg.DormantSessionsMax)
		s.cleanup("dormant session limit")
		return
	}
	s.state = stateDormant
	s.inGrace = true
	s.reg.dormant.Add(1)
	s.reg.graceEntered.Add(1)
	s.graceGen++
	gen := s.graceGen
	s.graceUntil = s.reg.cfg.Now().Add(time.Duration(grace) * time.Millisecond)
	s.graceStop = s.reg.cfg.AfterFunc(time.Duration(grace)*time.Millisecond, func() { s.graceExpired(gen) })
	s.logger().Info("session entered grace", "grace_ms", grace, "subscriptions", len(s.subs), "tags", len(s.tags), "pending", len(s.pending))
	s.mu.Unlock()
}

func (s *Session) graceExpired(gen uint64) {
	s.mu.Lock()
	live := s.state == stateDormant && s.graceGen == gen
	s.mu.Unlock()
	if !live {
		return
	}
	s.reg.graceFired.Add(1)
	held := s.cleanup("grace expired")
	s.reg.graceRequeued.Add(uint64(held))
	s.logger().Info("grace expired; unsettled deliveries requeued", "requeued", held)
}

// cleanupIfDormant cleans up a session that has no sink (used by drain).
func (s *Session) cleanupIfDormant(reason string) {
	s.mu.Lock()
	dormant := s.state == stateDormant
	s.mu.Unlock()
	if dormant {
		s.cleanup(reason)
	}
}

// cleanup ends the session: every subscription is closed, so every lease it held
// goes back to ready. It is the single path for immediate disconnects, grace expiry
// and shutdown.
//
// It returns how many unsettled deliveries the session held (0 when it was
// already closed).
func (s *Session) cleanup(reason string) int { return s.cleanupAs(reason, false) }

// cleanupAs is cleanup; byClient says the client ended the session itself
// (END_SESSION), which is recorded even after PersistForRestart.
func (s *Session) cleanupAs(reason string, byClient bool) int {
	s.mu.Lock()
	if s.state == stateClosed {
		s.mu.Unlock()
		return 0
	}
	if s.graceStop != nil {
		s.graceStop()
		s.graceStop = nil
	}
	if s.inGrace {
		s.inGrace = false
		s.reg.dormant.Add(-1)
	}
	s.state = stateClosed
	sink := s.sink
	s.sink = nil
	subs := make([]*subState, 0, len(s.subs))
	for _, st := range s.subs {
		st.closed = true
		s.reg.subClosed(st.id, false)
		s.releaseMember(st.member)
		subs = append(subs, st)
	}
	held := len(s.tags)
	s.subs, s.tags = map[uint64]*subState{}, map[uint64]tagEntry{}
	s.ended, s.outcomes = tagMemory{}, tagMemory{}
	pending := s.pending
	s.pending, s.heldBytes = nil, 0
	s.pendingBytes.Store(0)
	s.resendTags = nil
	s.throttle.Store(nil)
	s.dormantFull.Store(false)
	s.mu.Unlock()

	for _, o := range pending {
		o.drop()
	}
	s.reg.remove(s)
	if keep := s.reg.persisted.Load() && !byClient; keep {
		// A planned restart: the store keeps the session and the partition
		// logs its leases, under owners the restarted broker derives again.
		s.logger().Info("session kept for restart", "reason", reason, "subscriptions", len(subs), "leases", held)
		if sink != nil {
			sink.Kick()
		}
		return held
	}
	if st := s.reg.cfg.Store; st != nil {
		s.reg.storeErr(st.End(s.clientID), "end", s.clientID)
	}
	for _, st := range subs {
		st.sub.Close()
	}
	s.reg.requeued.Add(uint64(held))
	s.logger().Info("session closed", "reason", reason, "subscriptions", len(subs), "requeued", held)
	if sink != nil {
		sink.Kick()
	}
	return held
}

// Close ends the session at once, whatever the grace.
func (s *Session) Close() { s.cleanup("closed") }

// End ends the session at the client's request (END_SESSION), whatever the
// grace: its subscriptions close, its leases go back to the queue as
// releases (no retry used) and its identity stops resuming. sink, the
// connection that asked, is detached without being kicked, so it can still
// write its answer; the caller closes it.
func (s *Session) End(sink Sink) {
	s.mu.Lock()
	closed := s.state == stateClosed
	if s.sink == sink {
		s.sink = nil
		s.throttle.Store(nil)
	}
	s.mu.Unlock()
	if closed {
		return
	}
	s.reg.ended.Add(1)
	s.cleanupAs("ended by client", true)
}

// emitLocked sends o through the sink, or keeps it for the next sink when it is a
// push and none is attached.
func (s *Session) emitLocked(o Outbound) {
	if s.sink != nil && s.sink.Send(o) {
		return
	}
	if s.state == stateClosed || !o.isPush() {
		o.drop()
		return
	}
	if uint64(len(s.pending)) >= s.prefetches+uint64(len(s.subs))+pendingSlackFrames {
		// Deliveries are bounded by prefetch, so this means the bound was broken
		// elsewhere; the lease comes back by expiry, so dropping is safe.
		s.reg.pendingDropped.Add(1)
		s.logger().Error("dormant buffer full; dropping push", "op", o.Body.Op().String(), "pending", len(s.pending))
		o.drop()
		return
	}
	s.pending = append(s.pending, o)
	s.pendingBytes.Add(int64(o.Bytes()))
	s.notePendingLocked()
}

// notePendingLocked pauses the subscriptions while the dormant buffer is at
// its byte bound (and only then), so a session without a connection holds at
// most DormantBytesMax of pushes plus what was already leased.
func (s *Session) notePendingLocked() {
	full := s.pendingBytes.Load() >= s.reg.cfg.DormantBytesMax
	if full && !s.dormantFull.Swap(true) {
		s.reg.dormantPaused.Add(1)
		s.logger().Info("dormant buffer at its byte limit; deliveries paused until a resume",
			"pending", len(s.pending), "pending_bytes", s.pendingBytes.Load(), "dormant_bytes_max", s.reg.cfg.DormantBytesMax)
	}
	if !full {
		s.dormantFull.Store(false)
	}
}

// roomBytes is the room of st's consumer (see Pauser): none while the registry
// drains; otherwise the attached sink's
// (Throttle), or, with no sink, what is left of the dormant buffer's bound; and
// while st is not yet announced, no more than what is left of the bound on
// its early deliveries. Called without mu from partition goroutines.
func (s *Session) roomBytes(st *subState) int64 {
	limit := s.reg.cfg.DormantBytesMax
	// A draining registry starts no new deliveries: what is leased settles,
	// and nothing new is leased to a session about to lose its socket.
	if st.earlyFull.Load() || s.detached.Load() || s.reg.isDraining() {
		return 0
	}
	room := limit - st.earlyBytes.Load()
	if t := s.throttle.Load(); t != nil {
		return min(room, (*t).RoomBytes())
	}
	if s.dormantFull.Load() {
		return 0
	}
	return min(room, limit-s.pendingBytes.Load())
}

// wake tells every subscription that the session takes deliveries again. It is
// the drain callback of a throttled sink, and runs after a resume that ends a
// dormant pause. It never holds mu while calling the backend.
func (s *Session) wake() {
	s.mu.Lock()
	subs := make([]Subscription, 0, len(s.subs))
	for _, st := range s.subs {
		if st.sub != nil && !st.closed {
			subs = append(subs, st.sub)
		}
	}
	s.mu.Unlock()
	wakeSubs(subs...)
}

// dropTagLocked forgets tag and what it kept for re-send.
// servesLocked reports whether this node still serves e's partition
// under the epoch e was delivered in (OwnerChecker; always on a single
// node).
func (s *Session) servesLocked(e tagEntry) bool {
	if e.st == nil || e.st.sub == nil {
		return true
	}
	oc, ok := e.st.sub.(OwnerChecker)
	return !ok || oc.Serves(e.partition, e.epoch)
}

func (s *Session) dropTagLocked(tag uint64, e tagEntry) {
	delete(s.tags, tag)
	s.heldBytes -= e.bytes
}

// subConsumer receives one subscription's deliveries.
type subConsumer struct {
	s  *Session
	st *subState
}

func (c *subConsumer) Deliver(sub Subscription, d Delivery) { c.s.deliver(c.st, sub, d) }

// RoomBytes implements Pauser.
func (c *subConsumer) RoomBytes() int64 { return c.s.roomBytes(c.st) }
func (c *subConsumer) Closed(sub Subscription, reason uint8, err error) {
	c.s.backendClosed(c.st, sub, reason, err)
}

// LeaseEnded implements LeaseEnder.
func (c *subConsumer) LeaseEnded(sub Subscription, partition uint32, offset, leaseID uint64) {
	c.s.leaseEnded(c.st, partition, offset, leaseID)
}

// leaseEnded moves the tag of a delivery whose lease expired or was released
// while this session held it to the ended table: a late ACK or FAIL of it
// still reaches the broker (which applies it while the message is not leased
// again), but its DELIVER is never sent again (from the dormant buffer, or as
// a re-send after a resume), since the message may since have been settled
// under a later lease. Rare (a lease outlived its holder's attention), so a
// scan of the tags is fine.
func (s *Session) leaseEnded(st *subState, partition uint32, offset, leaseID uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for tag, e := range s.tags {
		if e.st == st && e.partition == partition && e.offset == offset && e.leaseID == leaseID {
			s.endLeaseLocked(tag, e)
			if n := len(s.pending); n > 0 {
				s.pending = dropDeliver(s.pending, tag)
				if len(s.pending) != n {
					var n int64
					for i := range s.pending {
						n += int64(s.pending[i].Bytes())
					}
					s.pendingBytes.Store(n)
					s.notePendingLocked()
				}
			}
			st.early = dropDeliver(st.early, tag)
			return
		}
	}
}

// dropDeliver removes the DELIVER of tag from os, if there.
func dropDeliver(os []Outbound, tag uint64) []Outbound {
	return slices.DeleteFunc(os, func(o Outbound) bool {
		d, ok := o.Body.(*protocol.Deliver)
		if ok && d.Tag == tag {
			o.drop()
			return true
		}
		return false
	})
}

func (s *Session) deliver(st *subState, sub Subscription, d Delivery) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.closed || s.state == stateClosed {
		return // Close hands the lease back
	}
	if st.sub == nil {
		st.sub, st.id = sub, sub.ID()
	}
	s.lastTag++
	tag := s.lastTag
	body := &protocol.Deliver{
		SubID: st.id, Tag: tag, Partition: d.Partition, Offset: d.Offset, Attempt: d.Attempt,
		PublishedAtMs: d.PublishedAtMs, Key: d.Key, Headers: d.Headers, ContentType: d.ContentType,
		Body: d.Body, Topic: d.Topic, Group: d.Group, LeaseID: d.LeaseID, Epoch: d.Epoch, // 0 on a single node
		Assignment: d.Assignment,
	}
	o := Outbound{Body: body, NotAfterMs: d.ExpiresAtMs}
	e := tagEntry{st: st, partition: d.Partition, offset: d.Offset, leaseID: d.LeaseID, gen: s.attachGen, notAfterMs: d.ExpiresAtMs, epoch: d.Epoch}
	if st.autoAck {
		o.AfterWrite = func() { s.autoAck(tag) }
	} else if n := int64(o.Bytes()); s.heldBytes+n <= s.reg.cfg.ResendBytesMax {
		e.d, e.bytes = body, n
		s.heldBytes += n
	} else {
		// Keeping it would pin its body until settled: past the bound a
		// delivery lost with its socket comes back by lease expiry, not
		// by a re-send.
		s.reg.resendUnkept.Add(1)
		if !s.resendFullLogged {
			s.resendFullLogged = true
			s.logger().Warn("re-send buffer at its byte limit; further unsettled deliveries are not kept for re-send after a resume",
				"held_bytes", s.heldBytes, "resend_bytes_max", s.reg.cfg.ResendBytesMax, "tags", len(s.tags))
		}
	}
	if s.restoring {
		// An adopted lease: re-sent after the resume unless the client
		// reports it in INFLIGHT (restore.go).
		e.adopted = true
		s.tags[tag] = e
		return
	}
	s.tags[tag] = e
	if !st.announced {
		s.holdEarlyLocked(st, o)
		return
	}
	s.emitLocked(o)
}

// holdEarlyLocked keeps o until st is announced. The subscription pauses once
// what it holds reaches the byte bound, as a full sink would pause it.
func (s *Session) holdEarlyLocked(st *subState, o Outbound) {
	st.early = append(st.early, o)
	if st.earlyBytes.Add(int64(o.Bytes())) >= s.reg.cfg.DormantBytesMax {
		st.earlyFull.Store(true)
	}
}

// autoAck settles an auto-ack delivery once its frame reached the socket.
func (s *Session) autoAck(tag uint64) {
	s.mu.Lock()
	e, ok := s.tags[tag]
	if ok {
		s.dropTagLocked(tag, e)
	}
	s.mu.Unlock()
	if ok {
		e.st.sub.Settle(protocol.OpAck, e.partition, e.offset, e.leaseID, 0, func(protocol.Code) {})
	}
}

func (s *Session) backendClosed(st *subState, sub Subscription, reason uint8, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.closed || s.state == stateClosed {
		return
	}
	if st.sub == nil {
		st.sub, st.id = sub, sub.ID()
	}
	st.closed = true
	s.forgetSubLocked(st)
	code := protocol.CodeOf(err)
	msg := ""
	if pe, ok := err.(*protocol.Error); ok {
		msg = pe.Message // the code travels beside it: no "sinew: <code>:" prefix twice
	} else if err != nil {
		msg = err.Error()
	}
	closed := &protocol.SubClosed{SubID: st.id, Reason: reason, Code: code, Message: msg}
	if reason != protocol.SubClosedShutdown {
		if len(s.brokerClosed) >= s.reg.cfg.SubscriptionsMax {
			s.brokerClosed = slices.Delete(s.brokerClosed, 0, 1)
		}
		c := *closed
		s.brokerClosed = append(s.brokerClosed, &c)
	}
	o := Outbound{Body: closed}
	s.logger().Info("subscription closed by broker", "sub_id", st.id, "reason", reason, "code", code.String())
	if !st.announced {
		s.holdEarlyLocked(st, o)
		return
	}
	s.emitLocked(o)
}

// forgetSubLocked drops st from the session's maps. Its held leases go back
// to the queue with the subscription (at once, or after a while when the
// broker ended it because a partition failed), so their tags move to the ended table
// (a late ACK of one applies while the message is not leased again), unless
// reconciliation closed it: client and server disagreed about it, the
// client was told it is gone, and its deliveries are stale whatever is sent
// for them, by tag or by lease reference.
func (s *Session) forgetSubLocked(st *subState) {
	if s.subs[st.id] == st {
		delete(s.subs, st.id)
		s.releaseMember(st.member)
		s.prefetches -= uint64(st.prefetch)
		if store := s.reg.cfg.Store; store != nil && !s.reg.persisted.Load() {
			s.reg.storeErr(store.Unsubscribe(s.clientID, st.id), "unsubscribe", s.clientID)
		}
	}
	s.reg.subClosed(st.id, st.reconciled)
	for t, e := range s.tags {
		if e.st != st {
			continue
		}
		if st.reconciled {
			s.dropTagLocked(t, e)
		} else {
			s.endLeaseLocked(t, e)
		}
	}
}

// ErrClosed is returned for requests on a session that was cleaned up.
var ErrClosed = protocol.Errorf(protocol.CodeShuttingDown, "session closed")

// openSub creates a subscription that is registered but not yet announced.
// mayCreate decides whether it may create its queue (stable backends only:
// others are test fakes).
func (s *Session) openSub(req protocol.Subscribe, mayCreate MayCreate) (*subState, error) {
	if req.AckMode != protocol.AckManual && req.AckMode != protocol.AckAuto {
		return nil, protocol.Errorf(protocol.CodeBadRequest, "ack mode %d", req.AckMode)
	}
	cfg := &s.reg.cfg
	switch {
	case req.Prefetch == 0:
		req.Prefetch = cfg.PrefetchDefault
	case req.Prefetch > cfg.PrefetchMax:
		req.Prefetch = cfg.PrefetchMax
	}
	s.mu.Lock()
	if s.state == stateClosed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	if len(s.subs)+s.subsOpen >= cfg.SubscriptionsMax {
		s.mu.Unlock()
		s.reg.subsRefused.Add(1)
		return nil, protocol.Errorf(protocol.CodeLimitExceeded, "session already has %d subscriptions", cfg.SubscriptionsMax)
	}
	s.subsOpen++
	s.mu.Unlock()
	if err := s.checkCohort(&req); err != nil {
		s.mu.Lock()
		s.subsOpen--
		s.mu.Unlock()
		return nil, err
	}

	st := &subState{autoAck: req.AckMode == protocol.AckAuto, prefetch: req.Prefetch, cohort: req.Cohort, member: req.Member}
	var sub Subscription
	var err error
	if sb, ok := cfg.Backend.(StableBackend); ok {
		// Leases recorded under an owner a restarted broker derives again.
		sub, _, err = sb.SubscribeStable(&req, &subConsumer{s: s, st: st}, StableSub{OwnerPrefix: s.ownerPrefix(), MayCreate: mayCreate})
	} else {
		sub, err = cfg.Backend.Subscribe(&req, &subConsumer{s: s, st: st})
	}

	s.mu.Lock()
	s.subsOpen--
	if err != nil {
		s.mu.Unlock()
		s.releaseMember(st.member)
		return nil, err
	}
	st.sub, st.id, st.view, st.parts = sub, sub.ID(), sub.View(), sub.Partitions()
	if st.view.Prefetch != 0 && st.view.Prefetch < st.prefetch {
		st.prefetch = st.view.Prefetch
	}
	if s.state == stateClosed {
		s.mu.Unlock()
		s.releaseMember(st.member)
		sub.Close()
		return nil, ErrClosed
	}
	if st.closed {
		s.releaseMember(st.member)
	} else {
		s.subs[st.id] = st
		s.prefetches += uint64(st.prefetch)
		s.reg.subOpened(st.id, sub, s)
	}
	closed := st.closed
	s.mu.Unlock()
	if store := s.reg.cfg.Store; store != nil && !closed {
		// Durable before the client hears of it (SUBSCRIBE_OK or
		// RECONCILE_RESULT), so a restart finds every subscription a
		// client may name. Outside mu: it waits for an fsync.
		s.reg.storeErr(store.Subscribe(s.clientID, sessionstore.Sub{
			ID: st.id, Topic: st.view.Topic, Group: st.view.Group, Partition: st.view.Partition,
			AckMode: st.view.AckMode, Prefetch: st.prefetch, Cohort: st.cohort, Member: st.member,
		}), "subscribe", s.clientID)
	}
	return st, nil
}

// announceLocked marks st announced and releases the deliveries that waited for
// it. It returns st's subscription when it had paused on them, for the caller
// to wake once mu is released.
func (s *Session) announceLocked(st *subState) Subscription {
	st.announced = true
	early := st.early
	st.early = nil
	st.earlyBytes.Store(0)
	for _, o := range early {
		s.emitLocked(o)
	}
	if st.earlyFull.Swap(false) && !st.closed {
		return st.sub
	}
	return nil
}

// wakeSubs wakes each subscription in subs that can be woken (see Waker).
// Call without mu.
func wakeSubs(subs ...Subscription) {
	for _, sub := range subs {
		if w, ok := sub.(Waker); ok {
			w.Wake()
		}
	}
}

// Subscribe attaches a new subscription and sends SUBSCRIBE_OK (request reqID)
// through sink, ahead of the subscription's first delivery. The reply is dropped
// if sink is no longer the session's transport.
func (s *Session) Subscribe(sink Sink, reqID uint64, req protocol.Subscribe) error {
	return s.SubscribeChecked(sink, reqID, req, nil)
}

// SubscribeChecked is Subscribe where a queue that does not exist is
// created only when mayCreate allows (nil: always); otherwise its error is
// returned, as for any subscription that fails.
func (s *Session) SubscribeChecked(sink Sink, reqID uint64, req protocol.Subscribe, mayCreate MayCreate) error {
	st, err := s.openSub(req, mayCreate)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.sink == sink && sink != nil {
		sink.Send(Outbound{RequestID: reqID, Body: &protocol.SubscribeOK{SubID: st.id, Partitions: st.parts, Prefetch: st.prefetch}})
	}
	wake := s.announceLocked(st)
	s.mu.Unlock()
	wakeSubs(wake)
	return nil
}

// Unsubscribe closes one subscription; its leases go back to ready.
func (s *Session) Unsubscribe(subID uint64) error {
	s.mu.Lock()
	st := s.subs[subID]
	if st == nil || st.closed {
		s.mu.Unlock()
		return protocol.Errorf(protocol.CodeNotFound, "no subscription %d on this session", subID)
	}
	st.closed = true
	s.forgetSubLocked(st)
	s.mu.Unlock()
	st.sub.Close()
	return nil
}

// Info is a snapshot of a session for tests and diagnostics.
type Info struct {
	ClientID      string
	Attached      bool
	Closed        bool
	Subscriptions int
	Tags          int
	Pending       int
}

// Info returns a snapshot of the session.
func (s *Session) Info() Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Info{ClientID: s.clientID, Attached: s.state == stateAttached, Closed: s.state == stateClosed,
		Subscriptions: len(s.subs), Tags: len(s.tags), Pending: len(s.pending)}
}

func (s *Session) String() string { return fmt.Sprintf("session(%s)", s.clientID) }
