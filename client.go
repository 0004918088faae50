package sinew

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// Client is a connection to a Sinew broker that survives socket failures: it
// reconnects with backoff, resumes its session and restores its subscriptions.
// A Client is safe for concurrent use. Close it when done.
type Client struct {
	o    options
	pool *pool
	ep   *endpoint
	rt   *router
	// seq numbers the Client's confirmed publishes under o.producerID.
	seq atomic.Uint64
	// lanes order the publishes seq numbers (order.go).
	lanes lanes
	// hints are the brokers' last partition hints per queue (hint.go).
	hints hints
	// spans are the live spanning subscriptions, which Close ends;
	// closed refuses new ones. Guarded by spansMu.
	spansMu sync.Mutex
	spans   map[*span]struct{}
	closed  bool
}

// addSpan registers sp with the client; false once Close has begun.
func (c *Client) addSpan(sp *span) bool {
	c.spansMu.Lock()
	defer c.spansMu.Unlock()
	if c.closed {
		return false
	}
	if c.spans == nil {
		c.spans = make(map[*span]struct{})
	}
	c.spans[sp] = struct{}{}
	return true
}

// isClosed reports whether Close has begun.
func (c *Client) isClosed() bool {
	c.spansMu.Lock()
	defer c.spansMu.Unlock()
	return c.closed
}

func (c *Client) removeSpan(sp *span) {
	c.spansMu.Lock()
	delete(c.spans, sp)
	c.spansMu.Unlock()
}

// Dial connects to the broker at addr (host:port) and completes the
// handshake. Retryable failures (refused, reset, timeouts, DNS) are retried
// with the reconnect policy's backoff until ctx ends, the connect timeout
// (ConnectTimeoutDefault, or WithConnectTimeout) passes or MaxAttempts is
// reached; each failed attempt is logged with its reason (WithLogger). A fatal
// failure (auth_failed, unsupported_version, a protocol violation, a TLS
// certificate error) is returned at once.
func Dial(ctx context.Context, addr string, opts ...Option) (*Client, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	o.reconnect = o.reconnect.withDefaults()
	if len(o.seeds) > 0 && o.heartbeat == 0 {
		// In a cluster a silent connection (its node cut off) must be
		// given up soon, so that the client goes to the new owner.
		o.heartbeat = clusterHeartbeatDefault
	}
	if o.producerID == "" {
		o.producerID = randomProducerID()
	}
	if o.memberID == "" {
		o.memberID = "m-" + randomProducerID()
	}
	c := &Client{o: o}
	c.pool = newPool(&c.o)
	c.ep = c.pool.get(addr)
	c.rt = newRouter(c, o.seeds)
	c.pool.protected = c.rt.protected
	c.pool.forget = c.rt.unlearn
	c.o.redirected = c.rt.away
	// The connect timeout is real time, like the socket deadlines it bounds.
	ctx, cancel := context.WithTimeout(ctx, o.connectTimeout)
	defer cancel()
	if err := c.ep.openOnce(ctx); err != nil {
		c.ep.shutdown()
		return nil, err
	}
	return c, nil
}

// Close stops the client: new operations fail with ErrClientClosed, pending
// publish confirms and settles are awaited (bounded by the drain timeout, and
// across a reconnect in progress), the session is ended on the broker with
// END_SESSION so that its unsettled messages go to other consumers at once
// instead of after the broker's reconnect grace, subscriptions end with
// ErrClientClosed, and every goroutine the client started has returned when
// Close does. If no connection is up when the drain ends, the broker's session
// stays dormant until its grace runs out. Close is safe to call more than once.
func (c *Client) Close() error {
	c.spansMu.Lock()
	c.closed = true
	c.spansMu.Unlock()
	// No endpoint is retired once the drain begins.
	c.pool.stop()
	for _, e := range c.pool.all() {
		e.drainAndClose()
	}
	// Spanning subscriptions end with their parts; one left without any
	// (all its nodes were away) is ended here, and its loop awaited.
	c.spansMu.Lock()
	spans := make([]*span, 0, len(c.spans))
	for sp := range c.spans {
		spans = append(spans, sp)
	}
	c.spansMu.Unlock()
	wait := time.NewTimer(c.o.drainTimeout)
	defer wait.Stop()
	for _, sp := range spans {
		sp.end(ErrClientClosed)
		select {
		case <-sp.ran:
		case <-wait.C:
			return nil
		}
	}
	return nil
}

// drainAndClose implements Close for one endpoint.
func (e *endpoint) drainAndClose() {
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		e.shutdown()
		return
	}
	e.closing = true
	e.live.Store(nil)
	e.mu.Unlock()

	// The drain bound is real time, not the injected clock: it guarantees
	// Close returns, even in a test whose fake clock stands still.
	drainTimer := time.NewTimer(e.o.drainTimeout)
	defer drainTimer.Stop()
	deadline := drainTimer.C
	timedOut := false
	for _, idle := range []func() <-chan struct{}{e.window.idle, e.busy.idle} {
		for ch := idle(); ch != nil && !timedOut; ch = idle() {
			select {
			case <-ch:
			case <-deadline:
				timedOut = true
			}
		}
	}
	if timedOut {
		e.o.logger.Warn("sinew: close: drain timed out", "addr", e.addr)
	}

	// End the session on the broker so that it hands unsettled messages to
	// other consumers now rather than after the session's reconnect grace.
	e.mu.Lock()
	e.ending = true
	c := e.conn
	var ids []uint64
	for s := range e.subs {
		if s.serverID != 0 {
			ids = append(ids, s.serverID)
		}
		s.endLocked(ErrClientClosed)
	}
	e.mu.Unlock()
	if c != nil && !c.isClosed() && !timedOut {
		// The drain deadline is bridged into a context by a helper goroutine
		// that is gone before we go on.
		ctx, cancel := context.WithCancel(context.Background())
		exited := make(chan struct{})
		go func() {
			defer close(exited)
			select {
			case <-deadline:
				cancel()
			case <-ctx.Done():
			}
		}()
		e.endSession(ctx, c, ids)
		cancel()
		<-exited
	}
	e.shutdown()
}

// endSession ends the broker's session with END_SESSION. Frames queued before
// it (NO_REPLY publishes and settles included) reach the broker first, since
// the connection keeps their order. A broker that does not know the op answers
// an error: the client then unsubscribes each subscription and pings, which
// returns the subscriptions' messages to the queue at once, though the session
// itself stays dormant for the broker's grace.
func (e *endpoint) endSession(ctx context.Context, c *conn, subIDs []uint64) {
	reply, err := c.roundTrip(ctx, &protocol.EndSession{}, nil)
	if err == nil {
		if _, ok := reply.(*protocol.OK); ok {
			e.o.logger.Info("sinew: session ended", "addr", e.addr, "client_id", c.hello.Resume.ClientID)
			return
		}
		err = fmt.Errorf("%w: %s in answer to END_SESSION", ErrProtocol, reply.Op())
	}
	if !isBrokerErr(err) {
		e.o.logger.Info("sinew: could not end the session", "addr", e.addr, "client_id", c.hello.Resume.ClientID, "err", err)
		return // the connection failed or the drain ran out
	}
	e.o.logger.Info("sinew: broker refused END_SESSION, unsubscribing instead", "addr", e.addr, "err", err)
	for _, id := range subIDs {
		if _, err := c.roundTrip(ctx, &protocol.Unsubscribe{SubID: id}, nil); err != nil {
			return
		}
	}
	_, _ = c.roundTrip(ctx, &protocol.Ping{}, nil)
}

// Err returns the fatal error that stopped the client (a rejected handshake, a
// protocol violation), or nil.
func (c *Client) Err() error {
	c.ep.mu.Lock()
	defer c.ep.mu.Unlock()
	return c.ep.fatal
}

// DeadLetter says where a queue's dead messages go.
type DeadLetter uint8

// Dead-letter modes.
const (
	DeadLetterDefault DeadLetter = DeadLetter(protocol.DeadLetterDefault) // the broker's configured default
	DeadLetterDiscard DeadLetter = DeadLetter(protocol.DeadLetterDiscard) // drop them
	DeadLetterGlobal  DeadLetter = DeadLetter(protocol.DeadLetterGlobal)  // the broker-wide dead-letter queue
	DeadLetterQueue   DeadLetter = DeadLetter(protocol.DeadLetterQueue)   // the queue named in QueueConfig.DeadLetterTopic
)

// RetriesNone, as QueueConfig.MaxRetries, dead-letters a message on its first
// Retry (zero means the broker's default).
const RetriesNone = -1

// QueueConfig is the configuration of a queue for DeclareQueue. Zero fields
// take the broker's defaults.
type QueueConfig struct {
	Group           string
	Partitions      int
	DeadLetter      DeadLetter
	DeadLetterTopic string        // for DeadLetterQueue
	MaxRetries      int           // 0 = broker default; RetriesNone = none
	TTL             time.Duration // default message TTL; 0 = none
	Lease           time.Duration // how long a delivery stays leased; 0 = broker default
}

// QueueInfo is the broker's answer to DeclareQueue.
type QueueInfo struct {
	Partitions int
	Created    bool // false when the queue already existed
}

// DeclareQueue creates the queue topic (in cfg.Group) or checks that the
// existing one is compatible: a different partition count is a conflict
// (*BrokerError with protocol.CodeConflict); retries, TTL, lease and dead-letter
// settings are updated. In a cluster the node the client is connected to
// takes the declaration whether or not it holds a replica of the queue.
func (c *Client) DeclareQueue(ctx context.Context, topic string, cfg QueueConfig) (QueueInfo, error) {
	retries := int32(-1)
	switch {
	case cfg.MaxRetries == RetriesNone:
		retries = 0
	case cfg.MaxRetries > 0:
		retries = int32(min(cfg.MaxRetries, 1<<31-1))
	}
	body := &protocol.DeclareQueue{
		Topic: topic, Group: cfg.Group, Partitions: uint32(max(0, cfg.Partitions)),
		DeadLetterMode: uint8(cfg.DeadLetter), DeadLetterTarget: cfg.DeadLetterTopic,
		MaxRetries: retries, DefaultTTLMs: cfg.TTL.Milliseconds(), LeaseMs: cfg.Lease.Milliseconds(),
	}
	reply, err := c.ep.request(ctx, body)
	if err != nil {
		return QueueInfo{}, err
	}
	ok, isOK := reply.(*protocol.DeclareOK)
	if !isOK {
		return QueueInfo{}, fmt.Errorf("%w: %s in answer to DECLARE_QUEUE", ErrProtocol, reply.Op())
	}
	return QueueInfo{Partitions: int(ok.Partitions), Created: ok.Created}, nil
}

// request sends body on the current connection and waits for the reply.
func (e *endpoint) request(ctx context.Context, body protocol.Body) (protocol.Body, error) {
	type result struct {
		b   protocol.Body
		err error
	}
	ch := make(chan result, 1)
	e.submit(ctx, &call{body: body, done: func(b protocol.Body, err error) { ch <- result{b, err} }})
	select {
	case r := <-ch:
		return r.b, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// randomProducerID returns 16 random bytes in hex: a producer id no other
// Client picks.
func randomProducerID() string {
	var b [16]byte
	crand.Read(b[:]) // never fails (crypto/rand's documented contract)
	return hex.EncodeToString(b[:])
}

// ProducerID returns the producer id the Client stamps on its confirmed
// publishes: the one given WithProducerID, or a random one.
func (c *Client) ProducerID() string { return c.o.producerID }
