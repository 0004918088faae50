package sinew

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// errConnClosed tells a caller that the connection it picked closed before the
// request was registered; nothing was sent, so it may pick another.
var errConnClosed = errors.New("sinew: connection already closed")

// call is one request waiting for its reply.
type call struct {
	body  protocol.Body
	flags uint16
	// replay marks a publish: when the connection breaks before its confirm it
	// is resent on the next one instead of failing. Delivery is at least once,
	// so a publish stored twice is within the promise; failing it would turn a
	// blip into an application error.
	replay bool
	// hook, when set, runs on the reader goroutine with the reply before done,
	// so that bookkeeping (a new subscription id) is in place before the next
	// frame (a delivery for that id) is read.
	hook func(protocol.Body)
	// done receives the reply or the failure, exactly once. It runs on the
	// reader goroutine (or the goroutine closing the connection) and must not
	// block.
	done func(protocol.Body, error)
	// reroute, when set on a publish, is offered the call when its
	// connection broke before the confirm: returning true takes it over
	// (the router sends it through another node), and done is then never
	// called. Unset, the call waits for this endpoint's next connection.
	reroute func(cause error) bool
	id      uint64 // request id on the connection it was last sent on
	// uncertain is set when the call is sent again after its connection
	// broke before the answer: an earlier send may have taken effect.
	uncertain bool
}

// conn is one socket and the goroutines that serve it:
//
//   - the reader owns the socket's read side: it decodes frames, resolves
//     pending calls and hands deliveries to subscriptions;
//   - the writer owns the write side: it drains out, batching frames into one
//     flush;
//   - the heartbeat pings an idle connection and closes a silent one;
//   - the settler batches settles into ACK/NACK/FAIL frames.
//
// mu guards pending, subs and closed. Lock order: endpoint.mu before conn.mu.
type conn struct {
	ep        *endpoint
	nc        net.Conn
	hello     protocol.HelloOK
	epoch     uint64 // session epoch; changes only when a fresh session starts
	frameMax  int
	settleMax int
	interval  time.Duration // heartbeat ping interval; 0 = none

	out chan []byte

	// The settler's queue (see queueSettle). settleMu is a leaf lock.
	settleMu   sync.Mutex
	settleQ    []*settleReq
	settleShut bool          // the settler stopped; queueSettle refuses
	settleWake chan struct{} // cap 1: settleQ is not empty

	nextID atomic.Uint64 // last request id handed out
	// closedFlag mirrors closed for lock-free readers (isClosed).
	closedFlag atomic.Bool

	mu      sync.Mutex
	pending map[uint64]*call
	// refused are replayable publishes the broker answered shutting_down:
	// it stored nothing, so close hands them to the endpoint to be sent on
	// the next connection, in request order with the calls still pending.
	refused []*call
	subs    map[uint64]*Subscription // broker sub id -> subscription
	closed  bool
	err     error

	done         chan struct{}
	awayOnce     sync.Once
	goingAway    chan struct{}
	awayDeadline atomic.Int64 // Unix ms from GOING_AWAY
	draining     atomic.Bool
	lastRead     atomic.Int64 // clock Unix nanos
	lastWrite    atomic.Int64
	wg           sync.WaitGroup
}

func newConn(ep *endpoint, nc net.Conn, hello protocol.HelloOK, epoch uint64, subs map[uint64]*Subscription) *conn {
	c := &conn{
		ep: ep, nc: nc, hello: hello, epoch: epoch,
		frameMax:   int(hello.Limits.FrameBytesMax),
		settleMax:  int(hello.Limits.SettleBatchMax),
		out:        make(chan []byte, writeQueueMax),
		settleWake: make(chan struct{}, 1),
		pending:    make(map[uint64]*call),
		subs:       subs,
		done:       make(chan struct{}),
		goingAway:  make(chan struct{}),
	}
	c.nextID.Store(1) // 1 was the HELLO
	if c.frameMax < protocol.FrameBytesMin {
		c.frameMax = protocol.FrameBytesDefault
	}
	if c.settleMax <= 0 {
		c.settleMax = settleBatchDefault
	}
	hb := time.Duration(hello.HeartbeatMs) * time.Millisecond
	if ep.o.heartbeat > 0 && (hb == 0 || ep.o.heartbeat < hb) {
		hb = ep.o.heartbeat
	}
	c.interval = hb
	now := ep.o.clock.Now().UnixNano()
	c.lastRead.Store(now)
	c.lastWrite.Store(now)
	return c
}

func (c *conn) run() {
	c.wg.Add(3)
	go c.readLoop()
	go c.writeLoop()
	go c.settleLoop()
	if c.interval > 0 {
		c.wg.Add(1)
		go c.heartbeatLoop()
	}
}

// isClosed reports whether close has begun. It reads the flag rather than
// done, which closes only after pending calls are resolved, so that callers
// never pick a connection that already refuses requests.
func (c *conn) isClosed() bool { return c.closedFlag.Load() }

// closeErr returns why the connection closed (valid once done is closed).
func (c *conn) closeErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// close shuts the connection once. Pending calls fail with ErrConnectionLost,
// except replayable publishes, which go back to the endpoint to be resent, and
// settles, which their done hands to the endpoint to hold (holdSettles).
func (c *conn) close(err error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.closedFlag.Store(true)
	c.err = err
	pending := c.pending
	c.pending = nil
	refused := c.refused
	c.refused = nil
	c.mu.Unlock()
	_ = c.nc.Close()

	lost := fmt.Errorf("%w: %w", ErrConnectionLost, err)
	replay := refused
	for _, cl := range pending {
		if cl.replay && IsRetryable(err) {
			cl.uncertain = true
			replay = append(replay, cl)
			continue
		}
		cl.done(nil, lost)
	}
	slices.SortFunc(replay, func(a, b *call) int { return compareU64(a.id, b.id) })
	c.ep.requeue(replay, err)
	close(c.done)
}

func compareU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// start registers cl and queues its frame. It returns an error only when cl.done
// has not been and will not be called: errConnClosed when the connection was
// already closed, or a local validation or context error.
func (c *conn) start(ctx context.Context, cl *call) error {
	if c.isClosed() {
		return errConnClosed
	}
	// Encoding happens outside mu: with many publishers sharing the
	// connection, copying bodies under the lock serialised them.
	id := c.newID()
	cl.id = id
	frame := protocol.AppendFrame(nil, cl.flags, id, cl.body)
	if len(frame) > c.frameMax {
		return fmt.Errorf("sinew: %s frame of %d bytes exceeds the broker's frame limit %d: %w",
			cl.body.Op(), len(frame), c.frameMax, &protocol.Error{Code: protocol.CodeMessageTooLarge})
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errConnClosed
	}
	c.pending[id] = cl
	c.mu.Unlock()
	select {
	case c.out <- frame:
		return nil
	case <-c.done:
		return nil // close resolved (or requeued) the call
	case <-ctx.Done():
		if c.take(id) != nil {
			return ctx.Err()
		}
		return nil
	}
}

// send queues a frame that expects no reply (PONG, PING, NO_REPLY settles).
func (c *conn) send(flags uint16, body protocol.Body) {
	c.sendFrame(protocol.AppendFrame(nil, flags, c.newID(), body))
}

// newID returns a request id for a frame that is not tracked as pending.
func (c *conn) newID() uint64 { return c.nextID.Add(1) }

func (c *conn) sendFrame(frame []byte) {
	select {
	case c.out <- frame:
	case <-c.done:
	}
}

// redirectMax bounds the length of a GOING_AWAY redirect the client takes
// (a host:port); a longer one is ignored.
const redirectMax = 512

// goAway marks c as draining: new operations wait for the next connection and
// the endpoint's watch closes c once its work is done, or at deadlineMs (Unix
// ms).
func (c *conn) goAway(deadlineMs int64) {
	c.awayDeadline.Store(deadlineMs)
	c.draining.Store(true)
	c.awayOnce.Do(func() { close(c.goingAway) })
}

// refuse keeps cl, a replayable call the broker refused while draining, for
// close to requeue. It reports false when c is already closed (the caller
// fails cl then; close has requeued everything else).
func (c *conn) refuse(cl *call) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.refused = append(c.refused, cl)
	return true
}

// take removes and returns the pending call with id, or nil.
func (c *conn) take(id uint64) *call {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.pending[id]
	delete(c.pending, id)
	return cl
}

// settlesQueued returns how many settles wait for the settler.
func (c *conn) settlesQueued() int {
	c.settleMu.Lock()
	defer c.settleMu.Unlock()
	return len(c.settleQ)
}

func (c *conn) pendingCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

func (c *conn) readLoop() {
	defer c.wg.Done()
	r := bufio.NewReaderSize(c.nc, writeBufferBytes)
	for {
		// A nil buffer gives every frame its own allocation, so message bodies
		// handed to the application never alias a reused buffer.
		f, _, err := protocol.ReadFrame(r, c.frameMax, nil)
		if err != nil {
			var pe *protocol.Error
			if errors.As(err, &pe) {
				err = fmt.Errorf("%w: %w", ErrProtocol, err)
			}
			c.close(err)
			return
		}
		c.lastRead.Store(c.ep.o.clock.Now().UnixNano())
		if err := c.dispatch(f); err != nil {
			c.close(err)
			return
		}
	}
}

func (c *conn) dispatch(f protocol.Frame) error {
	body, err := protocol.Decode(f)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	switch b := body.(type) {
	case *protocol.Ping:
		c.sendFrame(protocol.AppendFrame(nil, 0, f.RequestID, &protocol.Pong{}))
	case *protocol.Deliver:
		c.deliver(b)
	case *protocol.SubClosed:
		c.ep.subClosed(c, b)
	case *protocol.Assignment:
		c.ep.assignment(c, b)
	case *protocol.GoingAway:
		c.goAway(b.DeadlineMs)
		c.ep.o.logger.Info("sinew: broker going away", "addr", c.ep.addr, "reason", b.Reason, "grace_ms", b.GraceMs,
			"redirect", b.Redirect)
		if b.Redirect != "" && len(b.Redirect) <= redirectMax && c.ep.o.redirected != nil {
			// A cluster node names one that stays up: new work for the
			// partitions it owned is routed through the cluster now,
			// not held for its return.
			c.ep.o.redirected(c.ep.addr, b.Redirect)
		}
	case *protocol.ErrorBody:
		be := brokerErr(b.Err())
		var cl *call
		if f.RequestID != 0 {
			cl = c.take(f.RequestID)
		}
		if cl != nil && cl.replay && cl.reroute == nil && !b.Fatal && b.Code == protocol.CodeShuttingDown && c.refuse(cl) {
			// A publish that crossed GOING_AWAY on the wire: the broker
			// refused it before storing anything, so it waits for the next
			// connection instead of failing. The broker is draining even if
			// its GOING_AWAY is still on the way: leave once the work in
			// flight is done, within goingAwayWaitMax until it says more.
			c.goAway(c.ep.o.clock.Now().Add(goingAwayWaitMax).UnixMilli())
			break
		}
		if cl != nil && cl.reroute != nil && !b.Fatal && b.Code == protocol.CodeShuttingDown && !c.draining.Load() {
			// The same in a cluster, where another node takes the publish
			// at once (the router sends it there): the connection is
			// still left once its work in flight is done.
			c.goAway(c.ep.o.clock.Now().Add(goingAwayWaitMax).UnixMilli())
		}
		if cl != nil {
			cl.done(nil, be)
		} else {
			// Connection-level, or the answer to a request nobody waits for
			// (a NO_REPLY publish or a cancelled request).
			c.ep.o.logger.Warn("sinew: broker reported an error", "addr", c.ep.addr, "request", f.RequestID, "err", be)
		}
		if b.Fatal {
			return be
		}
	case *protocol.Pong, *protocol.OK, *protocol.DeclareOK, *protocol.PublishOK, *protocol.PurgeOK,
		*protocol.SubscribeOK, *protocol.SettleResult, *protocol.ReconcileResult, *protocol.InflightResult, *protocol.MetadataResult:
		if cl := c.take(f.RequestID); cl != nil {
			if cl.hook != nil {
				cl.hook(body)
			}
			cl.done(body, nil)
		}
	default:
		return fmt.Errorf("%w: unexpected %s from the broker", ErrProtocol, f.Op)
	}
	return nil
}

func (c *conn) deliver(d *protocol.Deliver) {
	c.mu.Lock()
	s := c.subs[d.SubID]
	c.mu.Unlock()
	if s == nil {
		// The subscription ended on this side while the broker was sending.
		// Hand the lease back at once instead of letting it time out.
		c.send(protocol.FlagNoReply, &protocol.Settle{Kind: protocol.OpNack, Tags: []uint64{d.Tag}})
		return
	}
	if s.parent != nil {
		s.parent.span.noteOwner(d.Partition, c.ep.addr, d.Epoch)
	}
	m := newMessage(s, c.epoch, d)
	if !s.cfg.autoAck && !s.hold(c.epoch, d.Tag, m) {
		return // re-sent after a resume, and already delivered here
	}
	if !s.push(m, c.done) && !s.cfg.autoAck {
		// Never reached the application: a re-send must not be dropped.
		s.release(c.epoch, d.Tag)
	}
}

func (c *conn) writeLoop() {
	defer c.wg.Done()
	w := bufio.NewWriterSize(c.nc, writeBufferBytes)
	for {
		var f []byte
		select {
		case f = <-c.out:
		case <-c.done:
			return
		}
		_, err := w.Write(f)
		// Take whatever else is queued so that pipelined frames share a flush.
		// When the queue runs dry, yield once before flushing: goroutines
		// that were just woken (publishers whose confirms arrived in one
		// read) get to queue their next frame, and the batch leaves in one
		// write syscall instead of one each. With nothing else runnable the
		// yield returns at once.
		yielded := false
	more:
		for err == nil {
			select {
			case f = <-c.out:
				_, err = w.Write(f)
			default:
				if yielded || w.Available() < writeYieldRoomBytes {
					break more
				}
				yielded = true
				runtime.Gosched()
			}
		}
		if err == nil {
			err = w.Flush()
		}
		if err != nil {
			c.close(err)
			return
		}
		c.lastWrite.Store(c.ep.o.clock.Now().UnixNano())
	}
}

// heartbeatLoop wakes every half interval: it pings when nothing was written
// for an interval and closes the connection when nothing was read for three.
func (c *conn) heartbeatLoop() {
	defer c.wg.Done()
	clock := c.ep.o.clock
	for {
		select {
		case <-clock.After(c.interval / 2):
		case <-c.done:
			return
		}
		now := clock.Now().UnixNano()
		if time.Duration(now-c.lastRead.Load()) >= 3*c.interval {
			c.close(fmt.Errorf("%w: nothing from %s for %v", ErrHeartbeatTimeout, c.ep.addr, 3*c.interval))
			return
		}
		if time.Duration(now-c.lastWrite.Load()) >= c.interval/2 {
			c.send(0, &protocol.Ping{})
		}
	}
}

// settleReq is one message's settle waiting for the settler.
type settleReq struct {
	kind  protocol.Op
	delay int64
	m     *Message
	// fin receives the outcome exactly once: from the SETTLE_RESULT, or from
	// the endpoint when the settle can no longer be sent (the session was not
	// resumed, the client closed or stopped). A settle whose connection broke
	// is not finished: the endpoint holds it and sends it again on the
	// resumed session (see endpoint.holdSettles). fin runs on the reader, the
	// closer, the settler or the supervisor and must not block.
	fin func(error)
	// routed marks a settle sent by lease reference to a partition's owner
	// after the node that delivered the message was lost (span.resettle):
	// it carries tag 0 and lease, which names the client's subscription on
	// the node it is sent to. A routed settle is never held for a resume.
	routed bool
	lease  protocol.LeaseRef
}

// spanned reports whether r settles a message of a spanning subscription:
// when its connection breaks it is not held for that node's resume, but
// finished, and its message's settle is sent to the partition's owner.
func (r *settleReq) spanned() bool { return r.routed || r.m.sub.parent != nil }

// queueSettle hands r to the settler. It reports false, without calling
// r.fin, when the connection's settler has already stopped. The queue needs no
// bound of its own: each queued request is an unsettled delivery, and the
// broker never has more of those outstanding than the subscriptions' prefetch.
func (c *conn) queueSettle(r *settleReq) bool {
	c.settleMu.Lock()
	if c.settleShut {
		c.settleMu.Unlock()
		return false
	}
	c.settleQ = append(c.settleQ, r)
	c.settleMu.Unlock()
	select {
	case c.settleWake <- struct{}{}:
	default:
	}
	return true
}

// settleLoop batches settles: it takes every request already queued (so a busy
// consumer gets many tags per frame and an idle one pays no extra latency) and
// sends one frame per kind and delay. When the connection closes it fails what
// is still queued.
func (c *conn) settleLoop() {
	defer c.wg.Done()
	var spare []*settleReq
	for {
		select {
		case <-c.settleWake:
		case <-c.done:
			c.settleMu.Lock()
			c.settleShut = true
			left := c.settleQ
			c.settleQ = nil
			c.settleMu.Unlock()
			c.ep.holdSettles(left)
			return
		}
		// A consumer settling a burst of deliveries queues them one after
		// another: yield once so that the burst shares a frame.
		runtime.Gosched()
		c.settleMu.Lock()
		batch := c.settleQ
		c.settleQ = spare[:0]
		c.settleMu.Unlock()
		for len(batch) > 0 {
			k, d := batch[0].kind, batch[0].delay
			group := make([]*settleReq, 0, min(len(batch), c.settleMax))
			rest := batch[:0]
			for _, r := range batch {
				if r.kind == k && r.delay == d && len(group) < c.settleMax {
					group = append(group, r)
				} else {
					rest = append(rest, r)
				}
			}
			c.sendSettle(group)
			batch = rest
		}
		spare = batch[:0]
		clear(spare[:cap(spare)]) // do not pin settled messages until reuse
	}
}

func (c *conn) sendSettle(group []*settleReq) {
	tags := make([]uint64, len(group))
	leases := make([]protocol.LeaseRef, len(group))
	for i, r := range group {
		if r.routed {
			leases[i] = r.lease
			continue
		}
		tags[i] = r.m.tag
		leases[i] = r.m.lease
	}
	// The lease references make a resent settle name exactly the lease it
	// meant, even where the broker's session forgot the tag.
	var body protocol.Body = &protocol.Settle{Kind: group[0].kind, Tags: tags, DelayMs: group[0].delay, Leases: leases}
	if group[0].kind == protocol.OpExtend {
		body = &protocol.Extend{Tags: tags, ExtendMs: group[0].delay, Leases: leases}
	}
	cl := &call{
		body: body,
		done: func(b protocol.Body, err error) {
			if errors.Is(err, ErrConnectionLost) {
				// The reply was lost with the socket. Settles are idempotent
				// by lease, so the endpoint sends them again on the resumed
				// session.
				c.ep.holdSettles(group)
				return
			}
			var codes []protocol.Code
			if err == nil {
				sr, ok := b.(*protocol.SettleResult)
				if !ok || len(sr.Codes) != len(group) {
					err = fmt.Errorf("%w: settle result does not match the request", ErrProtocol)
				} else {
					codes = sr.Codes
				}
			}
			for i, r := range group {
				switch {
				case err != nil:
					r.fin(err)
				case codes[i] == protocol.CodeOK:
					r.fin(nil)
				case codes[i] == protocol.CodeBadRequest && r.kind == protocol.OpNack:
					// SETTLE_RESULT carries codes only; this is the one
					// bad_request a NACK of a delivery tag can get.
					r.fin(&BrokerError{Code: codes[i], Message: fmt.Sprintf(
						"NACK delay %d ms refused: above the broker's maximum NACK delay (queue.nack_delay_ms_max, 30 days by default)", r.delay)})
				case codes[i] == protocol.CodeBadRequest && r.kind == protocol.OpExtend:
					// The one bad_request an EXTEND of a delivery tag can get
					// (the SDK always sends a leases list of the right length).
					r.fin(&BrokerError{Code: codes[i], Message: fmt.Sprintf(
						"EXTEND by %d ms refused: outside 1 ms to the broker's maximum extension (queue.lease_ms_max, 12 h by default)", r.delay)})
				case codes[i] == protocol.CodeStaleLease:
					r.fin(fmt.Errorf("%w: %w", ErrStaleDelivery, &BrokerError{Code: codes[i],
						Message: "the lease ended and the message was leased again or settled another way"}))
				case codes[i] == protocol.CodeUnknownTag:
					r.fin(fmt.Errorf("%w: %w", ErrUnknownTag, &BrokerError{Code: codes[i]}))
				default:
					r.fin(&BrokerError{Code: codes[i]})
				}
			}
		},
	}
	if err := c.start(context.Background(), cl); err != nil {
		if errors.Is(err, errConnClosed) {
			c.ep.holdSettles(group)
			return
		}
		cl.done(nil, err)
	}
}
