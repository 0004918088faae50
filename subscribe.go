package sinew

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// SubscribeOption configures Subscribe.
type SubscribeOption func(*subscribeConfig)

type subscribeConfig struct {
	group     string
	partition int32
	prefetch  uint32
	autoAck   bool
	// cohort and member: the cohort the subscription joins (WithCohort)
	// and the client's member id; "" for a plain subscription.
	cohort, member string
}

// WithPrefetch sets the most unsettled deliveries the broker sends this
// subscription at once (0 = the broker's default; above the broker's
// PrefetchMax is a limit_exceeded error).
func WithPrefetch(n int) SubscribeOption {
	return func(c *subscribeConfig) { c.prefetch = uint32(max(0, n)) }
}

// WithAutoAck makes the broker settle each delivery as soon as it is sent. The
// messages' settle methods then do nothing. Use it only where losing a message
// to a crash is acceptable.
func WithAutoAck() SubscribeOption { return func(c *subscribeConfig) { c.autoAck = true } }

// WithSubscribeGroup consumes from the queue's group g instead of the default group.
func WithSubscribeGroup(g string) SubscribeOption { return func(c *subscribeConfig) { c.group = g } }

// WithSubscribePartition consumes only partition p (by default, all of them).
func WithSubscribePartition(p int) SubscribeOption {
	return func(c *subscribeConfig) { c.partition = int32(p) }
}

// Subscription is a consumer attached to one queue. It survives reconnects:
// after a resume the broker keeps it, after a fresh session the client
// subscribes again. It ends only through Unsubscribe, Client.Close, the broker
// ending it, or a connection failure the client cannot recover from; Err then
// says which.
//
// Messages are buffered per subscription (bounded); when the application falls
// behind, the buffer fills and the connection stops reading, which pushes back
// on the broker. A buffered message whose lease the broker reports ended for
// good when the client resumes (another consumer got the message since, or it
// was settled) is dropped before the application sees it.
type Subscription struct {
	e     *endpoint
	topic string
	cfg   subscribeConfig

	buf  chan *Message // filled by the connection's reader
	out  chan *Message // Messages(); closed when the subscription ends
	done chan struct{}

	// Guarded by e.mu.
	serverID   uint64
	partitions []uint32
	prefetch   uint32
	recreating bool
	ended      bool
	err        error

	// held are the tags of manual-ack deliveries handed to the application and
	// not yet settled, in the session epoch heldEpoch. After a resume the broker
	// sends every delivery it still holds unsettled again; one whose tag is held
	// was already delivered here and is dropped. At most heldMax tags are kept
	// (twice the prefetch in force): more are possible only when leases expired
	// unsettled, and then the oldest is forgotten. heldMu is taken after e.mu.
	heldMu    sync.Mutex
	held      map[uint64]*Message
	heldEpoch uint64
	heldMax   int

	// pumpDone is closed when pump returns.
	pumpDone chan struct{}
	// assigns holds the assignment events of a cohort subscription for the
	// application (Assignments); bounded, oldest dropped.
	assigns        chan Assignment
	assignsDropped atomic.Uint64
	// held is what the broker's subscription behind this one was assigned
	// (partition -> epoch), so that losing that subscription revokes it.
	assignMu  sync.Mutex
	heldParts map[uint32]uint64
	// parent is the spanning subscription this one delivers for (nil for
	// a subscription on one node); span is set on a spanning one.
	parent *Subscription
	span   *span
}

// heldSlackTags is added to the held-tag bound so that a tiny prefetch still
// leaves room for deliveries whose settle is in flight.
const heldSlackTags = 16

// hold records m, delivered with tag in epoch, and reports false when the tag
// already was (a delivery the broker re-sent after a resume).
func (s *Subscription) hold(epoch, tag uint64, m *Message) bool {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	if s.held == nil || s.heldEpoch != epoch {
		// A fresh session numbers its tags from the start again.
		s.held, s.heldEpoch = make(map[uint64]*Message), epoch
	}
	if _, dup := s.held[tag]; dup {
		return false
	}
	if len(s.held) >= max(s.heldMax, heldSlackTags) {
		oldest := tag
		for t := range s.held {
			oldest = min(oldest, t)
		}
		delete(s.held, oldest)
	}
	s.held[tag] = m
	return true
}

// inflight appends the deliveries of epoch held unsettled, for INFLIGHT.
func (s *Subscription) inflight(epoch uint64, dst []protocol.InflightEntry) []protocol.InflightEntry {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	if s.heldEpoch != epoch {
		return dst
	}
	for tag, m := range s.held {
		if m != nil {
			dst = append(dst, protocol.InflightEntry{Tag: tag, Lease: m.lease})
		}
	}
	return dst
}

// markStale ends the held deliveries of epoch whose tags the broker reported
// stale after a resume: a later settle of one fails at once with
// ErrStaleDelivery. It returns how many it ended.
func (s *Subscription) markStale(epoch uint64, stale map[uint64]bool) int {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	if s.heldEpoch != epoch {
		return 0
	}
	n := 0
	for tag, m := range s.held {
		if stale[tag] {
			if m != nil {
				m.stale.Store(true)
			}
			delete(s.held, tag)
			n++
		}
	}
	return n
}

// release forgets a settled tag.
func (s *Subscription) release(epoch, tag uint64) {
	s.heldMu.Lock()
	if s.heldEpoch == epoch {
		delete(s.held, tag)
	}
	s.heldMu.Unlock()
}

// Subscribe attaches a consumer to topic. It returns once the broker accepted
// the subscription; messages then arrive on Messages (or through All). While
// the client reconnects it waits for the connection, and a SUBSCRIBE whose
// reply was lost in a cut is sent again on the next one.
//
// With WithSeeds, or once a client without seeds learned that its node is
// clustered (it asks on its first Subscribe or publish; see WithSeeds), the
// client is in a cluster, where each partition has one owner: the
// subscription then spans the queue's replicas (see span.go), so it
// receives every partition from whichever node owns it, and follows
// ownership as it moves. Subscribe first asks the cluster (METADATA) where
// the replicas are; while no node gives an answer (all unreachable, or an
// election under way) it asks again, with backoff from 50 ms to 1 s on the
// client's clock, until ctx ends, or for 30 s when ctx has no deadline. The
// error then wraps the last answer (ErrNotConnected when no node answered)
// and, when ctx ended the retries, ctx's error.
func (c *Client) Subscribe(ctx context.Context, topic string, opts ...SubscribeOption) (*Subscription, error) {
	cfg := subscribeConfig{partition: -1}
	for _, o := range opts {
		o(&cfg)
	}
	if err := c.checkCohort(&cfg); err != nil {
		return nil, err
	}
	if len(c.rt.seeds) > 0 || c.rt.clusteredFor(ctx, topic, cfg.group) {
		if s, err, ok := c.subscribeSpan(ctx, topic, cfg); ok {
			return s, err
		}
	}
	return c.subscribeAt(ctx, c.ep, topic, cfg, nil)
}

// subscribeAt subscribes on endpoint e; with a parent the subscription is
// one of a spanning subscription's, delivering into the parent's channel.
func (c *Client) subscribeAt(ctx context.Context, e *endpoint, topic string, cfg subscribeConfig, parent *Subscription) (*Subscription, error) {
	bufN := deliveryBufferMax
	if cfg.prefetch > 0 {
		bufN = min(int(cfg.prefetch)*2, deliveryBufferMax)
	}
	s := &Subscription{
		e: e, topic: topic, cfg: cfg,
		buf:      make(chan *Message, bufN),
		out:      make(chan *Message),
		done:     make(chan struct{}),
		pumpDone: make(chan struct{}),
		assigns:  make(chan Assignment, assignmentBufferMax),
	}
	if parent != nil {
		s.parent, s.out = parent, parent.out
	}
	for {
		conn, err := e.acquire(ctx, false)
		if err != nil {
			return nil, err
		}
		err = e.subscribeOn(ctx, conn, s)
		if err != nil {
			e.mu.Lock()
			_, registered := e.subs[s]
			e.mu.Unlock()
			if !registered && ctx.Err() == nil && (errors.Is(err, errConnClosed) || errors.Is(err, ErrConnectionLost)) {
				// No reply came: subscribe on the next connection. A
				// subscription the broker made anyway is one the client
				// does not list when it reconciles, so the broker drops it.
				continue
			}
			if !registered && ctx.Err() == nil && errors.Is(err, errShuttingDown) {
				// It crossed GOING_AWAY: the broker made nothing. Leave the
				// draining connection and subscribe on the next one.
				conn.goAway(e.o.clock.Now().Add(goingAwayWaitMax).UnixMilli())
				continue
			}
			// The broker may have accepted it (the reply raced ctx or the
			// connection): take it back rather than leave it consuming.
			if registered {
				uctx, cancel := context.WithTimeout(context.Background(), e.o.drainTimeout)
				_ = s.Unsubscribe(uctx)
				cancel()
			}
			return nil, err
		}
		return s, nil
	}
}

// subscribeOn sends SUBSCRIBE for s on c. The reply's hook registers the new
// broker id on the reader goroutine, before any delivery for it is read.
func (e *endpoint) subscribeOn(ctx context.Context, c *conn, s *Subscription) error {
	ackMode := protocol.AckManual
	if s.cfg.autoAck {
		ackMode = protocol.AckAuto
	}
	body := &protocol.Subscribe{Topic: s.topic, Group: s.cfg.group, Partition: s.cfg.partition,
		AckMode: ackMode, Prefetch: s.cfg.prefetch, Cohort: s.cfg.cohort, Member: s.cfg.member}
	var orphan uint64
	var closing bool
	hook := func(b protocol.Body) {
		ok, isOK := b.(*protocol.SubscribeOK)
		if !isOK {
			return
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		if s.ended || e.closing {
			orphan, closing = ok.SubID, e.closing
			return
		}
		c.mu.Lock()
		c.subs[ok.SubID] = s
		c.mu.Unlock()
		s.serverID = ok.SubID
		s.partitions = ok.Partitions
		s.prefetch = ok.Prefetch
		s.heldMu.Lock()
		s.heldMax = 2*int(ok.Prefetch) + heldSlackTags
		s.heldMu.Unlock()
		s.recreating = false
		// A subscription made again (its session ended, or reconciliation
		// dropped it) starts with no partitions: the old one's are revoked.
		s.revokeHeld()
		// A new subscription joins the endpoint here, on the reader, so a
		// reconnect that starts after this reply always knows about it.
		if _, known := e.subs[s]; !known {
			e.subs[s] = struct{}{}
			e.wg.Add(1)
			go s.pump()
		}
	}
	reply, err := c.roundTrip(ctx, body, hook)
	if err != nil {
		return err
	}
	if _, ok := reply.(*protocol.SubscribeOK); !ok {
		return fmt.Errorf("%w: %s in answer to SUBSCRIBE", ErrProtocol, reply.Op())
	}
	if orphan != 0 {
		c.send(protocol.FlagNoReply, &protocol.Unsubscribe{SubID: orphan})
		if closing {
			return ErrClientClosed
		}
	}
	return nil
}

func (s *Subscription) view() protocol.SubView {
	ack := protocol.AckManual
	if s.cfg.autoAck {
		ack = protocol.AckAuto
	}
	return protocol.SubView{SubID: s.serverID, Topic: s.topic, Group: s.cfg.group,
		Partition: s.cfg.partition, AckMode: ack, Prefetch: s.cfg.prefetch}
}

// push hands a delivery to the subscription, waiting while its buffer is full.
// It reports whether the delivery was buffered.
func (s *Subscription) push(m *Message, connDone <-chan struct{}) bool {
	select {
	case s.buf <- m:
		return true
	case <-s.done:
	case <-connDone:
	}
	return false
}

// purge drops buffered deliveries of an ended session.
func (s *Subscription) purge() {
	for {
		select {
		case <-s.buf:
		default:
			return
		}
	}
}

// pump moves messages from the internal buffer to Messages, and closes
// Messages when the subscription ends.
func (s *Subscription) pump() {
	defer s.e.wg.Done()
	if s.pumpDone != nil {
		defer close(s.pumpDone)
	}
	if s.parent == nil {
		// A spanning subscription's channel is closed by its own loop.
		defer close(s.out)
	}
	for {
		select {
		case <-s.done:
			return
		case m := <-s.buf:
			if m.stale.Load() {
				// The broker said after a resume that it no longer holds
				// the lease: the application never sees it.
				continue
			}
			var expired <-chan time.Time
			var timer *time.Timer
			if !m.leaseEnds.IsZero() {
				timer = time.NewTimer(time.Until(m.leaseEnds))
				expired = timer.C
			}
			select {
			case s.out <- m:
			case <-expired:
				// Its lease ran out before the application took it: the
				// message is back in the queue (perhaps leased to another
				// consumer already), so handing it over now would only
				// have it processed twice.
				m.stale.Store(true)
				s.release(m.epoch, m.tag)
				s.e.o.logger.Debug("sinew: delivery dropped, its lease ran out before the application took it",
					"topic", m.Topic, "partition", m.Partition, "offset", m.Offset)
			case <-s.done:
				if timer != nil {
					timer.Stop()
				}
				return
			}
			if timer != nil {
				timer.Stop()
			}
		}
	}
}

// endLocked ends the subscription with err (e.mu held). Only the first reason
// counts.
func (s *Subscription) endLocked(err error) {
	if s.ended {
		return
	}
	s.ended = true
	s.err = err
	close(s.done)
	delete(s.e.subs, s)
}

// Topic returns the subscribed topic.
func (s *Subscription) Topic() string { return s.topic }

// Partitions returns the partitions the broker assigned, as of the last
// (re)subscribe.
func (s *Subscription) Partitions() []uint32 {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	return append([]uint32(nil), s.partitions...)
}

// Prefetch returns the prefetch in force after the broker's clamping.
func (s *Subscription) Prefetch() int {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	return int(s.prefetch)
}

// Messages returns the channel of delivered messages. It is closed when the
// subscription ends; Err then says why.
func (s *Subscription) Messages() <-chan *Message { return s.out }

// Done is closed when the subscription ends.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Err returns nil while the subscription is active, and afterwards why it
// ended: ErrUnsubscribed, ErrClientClosed, ErrReconciledClosed, ErrRecreated,
// ErrDisconnected (each possibly wrapped with detail), or a *BrokerError.
func (s *Subscription) Err() error {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	return s.err
}

// All returns an iterator over the subscription's messages. It yields
// (message, nil) for each delivery; when the subscription ends it yields
// (nil, reason) once and stops, and when ctx ends it yields (nil, ctx.Err())
// and stops, leaving the subscription active.
func (s *Subscription) All(ctx context.Context) iter.Seq2[*Message, error] {
	return func(yield func(*Message, error) bool) {
		for {
			select {
			case m, ok := <-s.out:
				if !ok {
					yield(nil, s.Err())
					return
				}
				if m.stale.Load() {
					continue // see pump
				}
				if !yield(m, nil) {
					return
				}
			case <-ctx.Done():
				yield(nil, ctx.Err())
				return
			}
		}
	}
}

// Unsubscribe ends the subscription. The broker returns its unsettled messages
// to the queue at once; settling them afterwards fails. While the client
// reconnects it returns at once: the resumed session's reconciliation drops
// the subscription on the broker, and a fresh session never had it.
// Unsubscribing an ended subscription is a no-op.
func (s *Subscription) Unsubscribe(ctx context.Context) error {
	if s.span != nil {
		return s.span.unsubscribe(ctx)
	}
	e := s.e
	e.mu.Lock()
	if s.ended {
		e.mu.Unlock()
		return nil
	}
	id := s.serverID
	c := e.conn
	s.serverID = 0
	s.endLocked(ErrUnsubscribed)
	if c != nil && id != 0 {
		c.mu.Lock()
		delete(c.subs, id)
		c.mu.Unlock()
	}
	e.mu.Unlock()
	if c == nil || id == 0 || c.isClosed() {
		// Not attached: a resumed session drops it during reconciliation, a
		// fresh one never had it.
		return nil
	}
	reply, err := c.roundTrip(ctx, &protocol.Unsubscribe{SubID: id}, nil)
	if err != nil {
		if errors.Is(err, ErrConnectionLost) {
			return nil
		}
		return err
	}
	if _, ok := reply.(*protocol.OK); !ok {
		return fmt.Errorf("%w: %s in answer to UNSUBSCRIBE", ErrProtocol, reply.Op())
	}
	return nil
}

// Header is one message header.
type Header struct{ Key, Value string }

// Message is one delivery. Its fields are the message's metadata and payload;
// its methods settle it. A manual-ack message must be settled exactly once
// (Complete, Retry, RetryAfter or Fail) before its lease expires, or the broker
// delivers it again. Settle methods may be called from any goroutine.
type Message struct {
	Topic       string
	Group       string
	Partition   uint32
	Offset      uint64
	Attempt     uint32 // 1 on the first delivery
	Key         []byte
	Headers     []Header
	ContentType string
	Body        []byte
	PublishedAt time.Time
	// Assignment is the partition's assignment epoch when the message was
	// leased (see Assignment); 0 while no cohort ever held the partition.
	Assignment uint64

	sub     *Subscription
	tag     uint64
	lease   protocol.LeaseRef // names the lease in every settle of this message
	epoch   uint64
	autoAck bool
	settled chan struct{} // holds a token while unsettled; taken by a settle
	stale   atomic.Bool   // the broker no longer holds the lease for this session
	// leaseEnds is when the lease runs out, from the DELIVER's lease_ms
	// (zero when the broker gave none): a message the application has
	// not taken by then is dropped, since the queue has it back.
	leaseEnds time.Time
}

func newMessage(s *Subscription, epoch uint64, d *protocol.Deliver) *Message {
	m := &Message{
		Topic: d.Topic, Group: d.Group, Partition: d.Partition, Offset: d.Offset, Attempt: d.Attempt,
		Key: d.Key, ContentType: d.ContentType, Body: d.Body,
		PublishedAt: time.UnixMilli(d.PublishedAtMs), Assignment: d.Assignment,
		sub: s, tag: d.Tag, epoch: epoch, autoAck: s.cfg.autoAck,
		lease: protocol.LeaseRef{SubID: d.SubID, Partition: d.Partition, Offset: d.Offset,
			LeaseID: d.LeaseID, Epoch: d.Epoch},
		settled: make(chan struct{}, 1),
	}
	if d.LeaseMs > 0 {
		m.leaseEnds = time.Now().Add(time.Duration(d.LeaseMs) * time.Millisecond)
	}
	if m.Topic == "" {
		m.Topic = s.topic
	}
	if len(d.Headers) > 0 {
		m.Headers = make([]Header, len(d.Headers))
		for i, h := range d.Headers {
			m.Headers[i] = Header{h.Key, h.Value}
		}
	}
	m.settled <- struct{}{}
	return m
}

// Header returns the value of the first header named key.
func (m *Message) Header(key string) (string, bool) {
	for _, h := range m.Headers {
		if h.Key == key {
			return h.Value, true
		}
	}
	return "", false
}

// Text returns the body as a string.
func (m *Message) Text() string { return string(m.Body) }

// DecodeJSON unmarshals the body into v.
func (m *Message) DecodeJSON(v any) error { return json.Unmarshal(m.Body, v) }

// Complete settles the message as done (ACK). It returns once the broker has
// made the settle durable.
func (m *Message) Complete(ctx context.Context) error { return m.settle(ctx, protocol.OpAck, 0) }

// Retry returns the message to the queue for another attempt (NACK). A NACK
// counts as a failed delivery: once the queue's max retries have been used,
// the next one dead-letters the message instead. (A delivery left unsettled
// because the consumer went away does not count; see docs/protocol.md.)
func (m *Message) Retry(ctx context.Context) error { return m.settle(ctx, protocol.OpNack, 0) }

// RetryAfter is Retry with a delay before the message is delivered again.
// The broker caps the delay (queue.nack_delay_ms_max, 30 days by default): a
// longer one is refused with a bad_request *BrokerError naming the cap, and
// the message stays unsettled, so it may be settled again.
func (m *Message) RetryAfter(ctx context.Context, d time.Duration) error {
	return m.settle(ctx, protocol.OpNack, max(0, d.Milliseconds()))
}

// Fail settles the message as failed for good: it is dead-lettered (FAIL).
func (m *Message) Fail(ctx context.Context) error { return m.settle(ctx, protocol.OpFail, 0) }

// Extend renews the message's lease (EXTEND): the broker moves its deadline
// to d from now, on the partition owner's clock, so a handler that runs
// longer than the queue's lease keeps the message. The new deadline replaces
// the old one, even when it is earlier. It is not a settle: the message
// stays unsettled, its attempt does not change, and Complete, Retry or Fail
// still apply to the same lease afterwards. Extend early (every third of the
// lease, say): an extension that arrives after the deadline finds the
// lease ended.
//
// d is sent in whole milliseconds; below 1 ms, or above the broker's
// maximum (queue.lease_ms_max, 12 h by default), it is refused with a
// bad_request *BrokerError and the lease is unchanged. Like a settle, an
// extension whose connection breaks is held and sent again on the resumed
// session, and one for a spanning subscription in a cluster goes to the
// partition's current owner by lease reference. Errors are as for
// Complete: ErrStaleDelivery when the lease has ended (expired, settled, or
// the session was not resumed), ErrAlreadySettled once the message is
// settled or a settle of it is under way (and for an auto-ack message,
// which holds no lease), a retryable error when the outcome is unknown.
func (m *Message) Extend(ctx context.Context, d time.Duration) error {
	return m.settle(ctx, protocol.OpExtend, d.Milliseconds())
}

// CompleteAsync settles the message as done (ACK) without waiting for the
// broker: the settle is queued for the connection's settler, which sends
// every settle queued at that moment in one ACK frame, and the returned
// future resolves when the broker has made it durable (or it failed).
// While the client reconnects it waits for the connection.
//
// A consumer loop that calls CompleteAsync for each message and moves on keeps
// the whole prefetch window busy from one goroutine, which Complete cannot do
// because it waits one fsync per call. Errors are as for Complete; a settle
// that failed retryably may be repeated. Client.Close waits (bounded by the
// drain timeout) for queued settles.
func (m *Message) CompleteAsync() *SettleFuture {
	f := &SettleFuture{done: make(chan struct{})}
	m.settleAsync(context.Background(), protocol.OpAck, 0, f.resolve)
	return f
}

// SettleFuture is the pending result of CompleteAsync.
type SettleFuture struct {
	done chan struct{}
	err  error
}

func (f *SettleFuture) resolve(err error) {
	f.err = err
	close(f.done)
}

// Done is closed when the settle is durable or has failed.
func (f *SettleFuture) Done() <-chan struct{} { return f.done }

// Err returns the outcome once Done is closed, and nil before.
func (f *SettleFuture) Err() error {
	select {
	case <-f.done:
		return f.err
	default:
		return nil
	}
}

// Wait waits for the outcome. A ctx error only stops the waiting; the settle
// itself goes on.
func (f *SettleFuture) Wait(ctx context.Context) error {
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// settle sends one settle through the connection's batching settler and waits
// for its result. A settle that fails with a retryable error may be repeated.
// A settle whose connection breaks is held and sent again on the resumed
// session (see the package doc); it fails with ErrStaleDelivery when the
// session was not resumed.
func (m *Message) settle(ctx context.Context, kind protocol.Op, delayMs int64) error {
	res := make(chan error, 1)
	m.settleAsync(ctx, kind, delayMs, func(err error) { res <- err })
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		// The settle goes on; the message stays settled-or-settling. A
		// caller that retries gets ErrAlreadySettled unless it failed.
		return ctx.Err()
	}
}

// settleAsync queues one settle and calls fin exactly once with its outcome,
// possibly before returning. While the client reconnects it waits for the
// connection (bounded by ctx and the reconnect policy). A retryable failure,
// or ctx ending before the settle was queued, gives the message back its
// settle token, so it may be settled again.
func (m *Message) settleAsync(ctx context.Context, kind protocol.Op, delayMs int64, fin func(error)) {
	extend := kind == protocol.OpExtend
	switch {
	case extend && m.autoAck:
		fin(fmt.Errorf("%w: an auto-ack message holds no lease to extend", ErrAlreadySettled))
		return
	case m.autoAck:
		fin(nil)
		return
	case extend:
		// An extension settles nothing: it leaves the settle token
		// where it is, and is refused once a settle took it.
		if len(m.settled) == 0 {
			fin(ErrAlreadySettled)
			return
		}
	default:
		select {
		case <-m.settled:
		default:
			fin(ErrAlreadySettled)
			return
		}
	}
	e := m.sub.e
	e.busy.add(1)
	var finish func(error)
	done := func(err error) {
		if extend {
			// The message is as it was: held, or ended by the broker.
			e.busy.add(-1)
			fin(err)
			return
		}
		if err != nil && (IsRetryable(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
			kind == protocol.OpNack && errors.Is(err, &BrokerError{Code: protocol.CodeBadRequest})) {
			// A refused NACK delay (the only bad_request a NACK of a
			// valid tag gets) leaves the lease held: settle it again.
			m.settled <- struct{}{} // allow another try
		} else {
			m.sub.release(m.epoch, m.tag)
		}
		e.busy.add(-1)
		fin(err)
	}
	finish = done
	hedge := func() {}
	if sp := m.sub.parent; sp != nil {
		// A message of a spanning subscription: a settle its node could
		// not take goes to the partition's owner instead; so does one
		// its node has not answered within settleHedgeAfter (a node cut
		// off goes silent long before the connection is given up, and
		// the lease may run out meanwhile). Settles are idempotent by
		// lease, so the first outcome of either path is the outcome.
		var routed atomic.Bool
		var stopTimer atomic.Pointer[func()]
		reroute := func(cause error) {
			go sp.span.resettle(m, kind, delayMs, cause, done)
		}
		finish = func(err error) {
			if stop := stopTimer.Load(); stop != nil {
				(*stop)()
			}
			if routed.Swap(true) {
				return // the rerouted settle gives the outcome
			}
			// A message the broker already declared stale has no lease
			// left to settle anywhere.
			if err != nil && resettleable(err) && !(errors.Is(err, ErrStaleDelivery) && m.stale.Load()) {
				reroute(err)
				return
			}
			done(err)
		}
		hedge = func() {
			if kind != protocol.OpAck {
				// Only an ACK repeated by lease is answered ok again: a
				// NACK or FAIL repeated after it took effect is
				// stale_lease, so it is not raced against a slow node.
				return
			}
			// On the client's clock, like every other wait of the SDK.
			stop := afterFunc(e.o.clock, settleHedgeAfter, func() {
				if !routed.Swap(true) {
					reroute(fmt.Errorf("%w: %s did not answer the settle within %v", ErrConnectionLost, e.addr, settleHedgeAfter))
				}
			})
			stopTimer.Store(&stop)
			if routed.Load() {
				// The outcome came while the timer was being set.
				stop()
			}
		}
	}
	r := &settleReq{kind: kind, delay: delayMs, m: m, fin: finish}
	for {
		if m.stale.Load() {
			finish(ErrStaleDelivery)
			return
		}
		if epoch := e.currentEpoch(); epoch != m.epoch {
			finish(ErrStaleDelivery)
			return
		}
		if m.sub.parent != nil {
			if c := e.live.Load(); c == nil || c.isClosed() {
				// Its node is away: the owner may be another by now.
				finish(fmt.Errorf("%w: %s", ErrNotConnected, e.addr))
				return
			}
		}
		c, err := e.acquire(ctx, true)
		if err != nil {
			finish(err)
			return
		}
		// Checked again after the wait: a connection is handed out only
		// once its restore, INFLIGHT included, is done.
		if c.epoch != m.epoch || m.stale.Load() {
			finish(ErrStaleDelivery)
			return
		}
		if c.queueSettle(r) {
			hedge()
			return
		}
		// The connection closed between acquire and queueing: wait for the
		// next one.
	}
}

func (e *endpoint) currentEpoch() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.epoch
}
