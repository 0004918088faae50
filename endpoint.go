package sinew

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// ClientVersion is the SDK version sent in HELLO.
const ClientVersion = "0.1.0"

// goingAwayWaitMax bounds how long a connection that received GOING_AWAY is
// kept open waiting for outstanding replies before the client reconnects.
const goingAwayWaitMax = 30 * time.Second

// goingAwayPoll is how often a connection that received GOING_AWAY is looked
// at to see whether its work in flight has finished.
const goingAwayPoll = 10 * time.Millisecond

// After a planned stop the broker is expected back soon, so the client looks
// for it often rather than backing off as far as it would from a failure: the
// first goingAwayFastAttempts attempts wait only the policy's base delay
// (jittered), and later ones at most goingAwayBackoffMax.
const (
	goingAwayFastAttempts = 30
	goingAwayBackoffMax   = 500 * time.Millisecond
)

// pool holds one endpoint per broker address. Each endpoint keeps its own
// connection, session and resume identity: an identity is only meaningful to
// the broker that issued it.
//
// In a cluster the client learns addresses as it goes (owners, replicas), and
// nodes come and go. An endpoint nothing uses is retired (its connection and
// reconnects stopped, and it leaves the pool) once it has been idle for
// endpointIdleRetire, unless its address is protected: the client's own, a
// seed, or an owner or replica the router knows now (router.protected). Idle
// means no unconfirmed publish, no subscription, no settle in progress or
// held, and not handed out by get for that long. A later get makes a fresh
// endpoint. Beyond endpointsMax endpoints, unprotected unused ones idle for
// endpointEvictIdle are retired at once, oldest first; the pool exceeds the
// bound only by endpoints in use. A janitor goroutine, started with the
// second endpoint, does this on the client's clock. Lock order: pool.mu,
// then endpoint.mu.
type pool struct {
	o   *options
	mu  sync.Mutex
	eps map[string]*endpoint
	// protected returns the addresses never retired; set by the client
	// before the second endpoint is made.
	protected func() map[string]bool
	// forget is told the address of an endpoint retired while failing
	// (no connection): the router stops offering it as a node.
	forget func(addr string)
	// swept, when set (by a test), runs after each sweep.
	swept   func()
	started bool // the janitor runs
	closed  bool
	kick    chan struct{} // cap 1: the pool is over its bound
	quit    chan struct{}
	wg      sync.WaitGroup
}

// Bounds of the endpoint pool.
const (
	// endpointIdleRetire is how long an endpoint is unused before it is
	// retired.
	endpointIdleRetire = 30 * time.Second
	// endpointSweepEvery is how often the janitor looks.
	endpointSweepEvery = 10 * time.Second
	// endpointsMax bounds the pool (see pool); room for the learned
	// nodes twice over.
	endpointsMax = 2 * learnedMax
	// endpointEvictIdle is how long an endpoint must be unused before it
	// is retired early, to keep the pool within endpointsMax: longer than
	// a caller holds an endpoint from get before it shows as in use.
	endpointEvictIdle = routeOpenTimeout + time.Second
)

func newPool(o *options) *pool {
	return &pool{o: o, eps: make(map[string]*endpoint), kick: make(chan struct{}, 1), quit: make(chan struct{})}
}

// get returns the endpoint for addr, creating it (unconnected) on first use.
func (p *pool) get(addr string) *endpoint {
	p.mu.Lock()
	e, ok := p.eps[addr]
	if !ok {
		e = newEndpoint(addr, p.o)
		if p.closed {
			// Close has taken its list of endpoints: one made now (by a
			// resend or lookup still running) would never be shut, and
			// its supervisor would outlive the client. It is born shut.
			p.mu.Unlock()
			e.shutdown()
			return e
		}
		p.eps[addr] = e
	}
	e.usedAt.Store(p.o.clock.Now().UnixNano())
	start := !p.started && !p.closed && len(p.eps) > 1 && p.protected != nil
	if start {
		p.started = true
		p.wg.Add(1)
	}
	over := len(p.eps) > endpointsMax
	p.mu.Unlock()
	if start {
		go p.janitor()
	}
	if over {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
	return e
}

func (p *pool) all() []*endpoint {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*endpoint, 0, len(p.eps))
	for _, e := range p.eps {
		out = append(out, e)
	}
	return out
}

// size returns how many endpoints the pool holds.
func (p *pool) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.eps)
}

// stop ends the janitor and waits for it (Close, before the endpoints are
// drained).
func (p *pool) stop() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.quit)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// janitor retires idle endpoints (see pool) until the client closes.
func (p *pool) janitor() {
	defer p.wg.Done()
	for {
		select {
		case <-p.o.clock.After(endpointSweepEvery):
			p.sweep(false)
		case <-p.kick:
			p.sweep(true)
		case <-p.quit:
			return
		}
	}
}

// sweep retires the endpoints idle for endpointIdleRetire, and with over
// also the oldest idle for endpointEvictIdle while the pool is above
// endpointsMax.
func (p *pool) sweep(over bool) {
	keep := p.protected()
	now := p.o.clock.Now().UnixNano()
	var gone, spare []*endpoint
	p.mu.Lock()
	for addr, e := range p.eps {
		if keep[addr] || e.inUse() {
			continue
		}
		switch idle := now - e.usedAt.Load(); {
		case idle >= int64(endpointIdleRetire):
			gone = append(gone, e)
			delete(p.eps, addr)
		case over && idle >= int64(endpointEvictIdle):
			spare = append(spare, e)
		}
	}
	if n := len(p.eps) - endpointsMax; n > 0 && len(spare) > 0 {
		slices.SortFunc(spare, func(a, b *endpoint) int { return compareU64(uint64(a.usedAt.Load()), uint64(b.usedAt.Load())) })
		for _, e := range spare[:min(n, len(spare))] {
			gone = append(gone, e)
			delete(p.eps, e.addr)
		}
	}
	p.mu.Unlock()
	for _, e := range gone {
		failing := e.live.Load() == nil
		p.o.logger.Info("sinew: endpoint retired", "addr", e.addr, "connected", !failing)
		e.shutdown()
		if failing && p.forget != nil {
			p.forget(e.addr)
		}
	}
	if p.swept != nil {
		p.swept()
	}
}

// inUse reports whether anything depends on e: an unconfirmed publish, a
// settle in progress or held for a resume, a subscription, a call kept
// for the next connection.
func (e *endpoint) inUse() bool {
	if e.window.count() > 0 || e.busy.count() > 0 {
		return true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.subs) > 0 || len(e.replay) > 0 || len(e.held) > 0
}

// endpoint is the client's logical connection to one broker address: the
// session (resume identity, epoch, subscriptions) that outlives any one socket.
//
// One supervisor goroutine per endpoint watches the current connection and,
// when it breaks, reconnects with backoff, resumes or restarts the session and
// restores subscriptions. Operations pick the current connection with acquire.
// mu guards every field below it; lock order is endpoint.mu, then conn.mu.
type endpoint struct {
	addr string
	// single is set while the last HELLO_OK said the node runs alone
	// (its cluster field false or absent).
	single atomic.Bool
	o      *options
	window *window
	busy   *tracker // settles in progress, for Close's drain
	quit   chan struct{}
	ctx    context.Context // cancelled by shutdown, aborts dials
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// live mirrors conn for acquire's lock-free fast path; it is nil whenever
	// conn is, and also once Close has begun or a fatal error stopped the
	// client, so a non-nil live needs no further check under mu.
	live atomic.Pointer[conn]

	mu          sync.Mutex
	conn        *conn
	identity    protocol.ResumeIdentity
	epoch       uint64
	generation  uint64 // the broker process's, from the last HELLO_OK; 0 before the first
	subs        map[*Subscription]struct{}
	replay      []*call
	held        []*settleReq // settles cut off from their connection, for the resumed session
	closing     bool         // Close has begun: no new operations
	ending      bool         // Close has drained and is ending the session: no more reconnects
	connSeq     uint64       // connections made, for logs
	closed      bool
	fatal       error
	attemptDone chan struct{} // closed and replaced after every connect attempt
	attemptErr  error
	attempts    uint64        // connect attempts finished
	gaveUp      error         // set while the supervisor has given up (MaxAttempts, MaxOutage), until a connect succeeds
	kick        chan struct{} // asks the supervisor for an attempt now

	// openMu serialises openOnce; opened is set once the endpoint has
	// connected (and its supervisor runs).
	openMu sync.Mutex
	opened atomic.Bool
	// usedAt is when pool.get last handed the endpoint out (clock unix ns).
	usedAt atomic.Int64
}

func newEndpoint(addr string, o *options) *endpoint {
	ctx, cancel := context.WithCancel(context.Background())
	return &endpoint{
		addr: addr, o: o,
		window:      newWindow(publishInflightDefault),
		busy:        newTracker(),
		quit:        make(chan struct{}),
		ctx:         ctx,
		cancel:      cancel,
		subs:        make(map[*Subscription]struct{}),
		attemptDone: make(chan struct{}),
		kick:        make(chan struct{}, 1),
	}
}

// open connects for the first time, retrying retryable failures with backoff
// until ctx ends or the policy's MaxAttempts is reached, then starts the
// supervisor.
func (e *endpoint) open(ctx context.Context) error {
	pol := e.o.reconnect
	for failures := 0; ; {
		c, err := e.attempt(ctx)
		if err == nil {
			e.wg.Add(1)
			go e.supervise(c)
			return nil
		}
		if ctx.Err() != nil {
			e.o.logger.Warn("sinew: connect attempt failed, out of time", "addr", e.addr, "attempt", failures+1, "err", err)
			return fmt.Errorf("sinew: connect %s: %w (last error: %w)", e.addr, ctx.Err(), err)
		}
		if !IsRetryable(err) {
			e.o.logger.Warn("sinew: connect attempt failed, not retryable", "addr", e.addr, "attempt", failures+1, "err", err)
			return fmt.Errorf("sinew: connect %s: %w", e.addr, err)
		}
		failures++
		if pol.MaxAttempts > 0 && failures >= pol.MaxAttempts {
			e.o.logger.Warn("sinew: connect attempt failed, giving up", "addr", e.addr, "attempt", failures, "err", err)
			return fmt.Errorf("%w: connect %s: %d attempts: %w", ErrDisconnected, e.addr, failures, err)
		}
		d := pol.Delay(failures-1, e.o.rand())
		e.o.logger.Warn("sinew: connect attempt failed, backing off", "addr", e.addr, "attempt", failures, "delay", d, "err", err)
		select {
		case <-e.o.clock.After(d):
		case <-ctx.Done():
			return fmt.Errorf("sinew: connect %s: %w (last error: %w)", e.addr, ctx.Err(), err)
		}
	}
}

// supervise owns reconnection for the endpoint's lifetime.
func (e *endpoint) supervise(c *conn) {
	defer e.wg.Done()
	pol := e.o.reconnect
	failures := 0
	for {
		connectedAt := e.o.clock.Now()
		immediate := e.watch(c)
		planned := immediate
		if e.stopping() {
			return
		}
		e.mu.Lock()
		ending := e.ending
		e.mu.Unlock()
		if ending {
			// Close is ending the session (the broker closes the socket
			// after END_SESSION): nothing to reconnect for.
			<-e.quit
			return
		}
		err := c.closeErr()
		e.mu.Lock()
		if e.conn == c {
			e.conn = nil
			e.live.Store(nil)
		}
		e.mu.Unlock()
		c.wg.Wait()
		if !IsRetryable(err) {
			e.failFatal(err)
			return
		}
		if e.o.clock.Now().Sub(connectedAt) >= pol.ResetAfter {
			failures = 0
		}
		e.o.logger.Info("sinew: connection lost, reconnecting", "addr", e.addr, "err", err)
		outageFrom := e.o.clock.Now()
		for c = nil; c == nil; {
			if !immediate {
				d := pol.Delay(failures, e.o.rand())
				if planned && failures < goingAwayFastAttempts {
					d = pol.Delay(0, e.o.rand())
				} else if planned {
					d = min(d, goingAwayBackoffMax)
				}
				// Operations wait for this attempt rather than ask for an
				// earlier one: a blip must not turn into a burst of connects.
				select {
				case <-e.o.clock.After(d):
				case <-e.quit:
					return
				}
			}
			immediate = false
			var err error
			c, err = e.attempt(e.ctx)
			if err == nil {
				e.o.logger.Info("sinew: reconnected", "addr", e.addr, "outcome", c.hello.Outcome)
				break
			}
			if e.stopping() {
				return
			}
			if !IsRetryable(err) {
				e.failFatal(err)
				return
			}
			failures++
			e.o.logger.Info("sinew: reconnect attempt failed", "addr", e.addr, "attempt", failures, "err", err)
			outage := e.o.clock.Now().Sub(outageFrom)
			if (pol.MaxAttempts > 0 && failures >= pol.MaxAttempts) || (pol.MaxOutage > 0 && outage >= pol.MaxOutage) {
				e.giveUp(fmt.Errorf("%w: %s: %d attempts in %v: %w", ErrDisconnected, e.addr, failures, outage.Round(time.Millisecond), err))
				// Stay idle until an operation asks for a connection.
				select {
				case <-e.kick:
					immediate = true
					outageFrom = e.o.clock.Now()
				case <-e.quit:
					return
				}
			}
		}
	}
}

// watch waits until c is finished. After GOING_AWAY new operations wait for
// the next connection (acquire passes over a draining one) while the work in
// flight on c finishes: confirms, settle results, and the deliveries the
// application holds unsettled, which it may still settle here. Once none is
// left, or at the announced deadline, watch closes c itself. It reports
// whether the next connect should start at once (a planned stop, not a
// failure).
func (e *endpoint) watch(c *conn) (immediate bool) {
	select {
	case <-c.done:
		return false
	case <-e.quit:
		return false
	case <-c.goingAway:
	}
	wait := time.Duration(c.awayDeadline.Load()-e.o.clock.Now().UnixMilli()) * time.Millisecond
	deadline := e.o.clock.After(max(0, min(wait, goingAwayWaitMax)))
	for {
		if e.awayIdle(c) {
			e.o.logger.Info("sinew: work in flight finished; leaving the broker that is going away", "addr", e.addr)
			c.close(&BrokerError{Code: protocol.CodeShuttingDown, Message: "broker going away"})
			return true
		}
		select {
		case <-c.done:
			return true
		case <-deadline:
			e.o.logger.Info("sinew: broker's going-away deadline reached with work in flight", "addr", e.addr,
				"pending", c.pendingCount(), "unsettled", e.unsettled(c.epoch))
			c.close(&BrokerError{Code: protocol.CodeShuttingDown, Message: "broker going away"})
			return true
		case <-e.o.clock.After(goingAwayPoll):
		case <-e.quit:
			return true
		}
	}
}

// awayIdle reports whether nothing is in flight on c: no request awaits its
// reply, no settle is queued or in progress, and the application holds no
// delivery of c's session epoch unsettled.
func (e *endpoint) awayIdle(c *conn) bool {
	if c.pendingCount() > 0 || c.settlesQueued() > 0 || e.busy.idle() != nil {
		return false
	}
	return e.unsettled(c.epoch) == 0
}

// unsettled counts the manual-ack deliveries of epoch the subscriptions hold
// unsettled.
func (e *endpoint) unsettled(epoch uint64) int {
	e.mu.Lock()
	subs := make([]*Subscription, 0, len(e.subs))
	for s := range e.subs {
		subs = append(subs, s)
	}
	e.mu.Unlock()
	n := 0
	for _, s := range subs {
		s.heldMu.Lock()
		if s.heldEpoch == epoch {
			n += len(s.held)
		}
		s.heldMu.Unlock()
	}
	return n
}

func (e *endpoint) stopping() bool {
	select {
	case <-e.quit:
		return true
	default:
		return false
	}
}

// attempt makes one connect attempt and publishes its outcome to operations
// waiting in acquire.
func (e *endpoint) attempt(ctx context.Context) (*conn, error) {
	c, err := e.connect(ctx)
	e.mu.Lock()
	if err == nil && e.closed {
		e.mu.Unlock()
		c.close(ErrClientClosed)
		c.wg.Wait()
		e.mu.Lock()
		err = ErrClientClosed
	}
	if err == nil {
		e.conn = c
		e.gaveUp = nil
		if !e.closing {
			e.live.Store(c)
		}
		select { // a kick that raced with this attempt is satisfied by it
		case <-e.kick:
		default:
		}
	} else {
		c = nil
	}
	e.attemptErr = err
	e.attempts++
	close(e.attemptDone)
	e.attemptDone = make(chan struct{})
	e.mu.Unlock()
	return c, err
}

// connect dials, handshakes and restores the session on a new connection. The
// connection is returned only once subscriptions are restored and in-flight
// idempotent publishes resent, so operations never overtake the restore.
func (e *endpoint) connect(ctx context.Context) (*conn, error) {
	dctx, cancel := context.WithTimeout(ctx, e.o.dialTimeout)
	defer cancel()
	nc, err := e.o.dialer(dctx, "tcp", e.addr)
	if err != nil {
		return nil, err
	}
	if e.o.tls != nil {
		cfg := e.o.tls.Clone()
		if cfg.ServerName == "" {
			host, _, _ := net.SplitHostPort(e.addr)
			cfg.ServerName = host
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(dctx); err != nil {
			_ = nc.Close()
			// A plaintext broker answers a ClientHello with a Sinew
			// ERROR frame, which is no TLS record.
			var rh tls.RecordHeaderError
			if errors.As(err, &rh) {
				return nil, fmt.Errorf("%w: %w", ErrServerNotTLS, err)
			}
			return nil, err
		}
		nc = tc
	}
	e.mu.Lock()
	ident := e.identity
	e.mu.Unlock()
	hello, err := handshake(ctx, nc, e.o, ident)
	if err != nil {
		_ = nc.Close()
		return nil, err
	}

	e.mu.Lock()
	resumed := hello.Outcome == protocol.ResumeResumed && ident.ClientID != ""
	e.identity = hello.Resume
	prevGen := e.generation
	restarted := prevGen != 0 && hello.ServerGeneration != prevGen
	e.generation = hello.ServerGeneration
	var unsafe []*call
	if restarted {
		e.replay, unsafe = splitIdempotent(e.replay)
	}
	var stale []*settleReq
	if !resumed {
		e.epoch++
		// The leases these settles name ended with the old session.
		stale = e.takeHeldLocked()
	}
	subs := make(map[uint64]*Subscription)
	for s := range e.subs {
		if !resumed {
			s.serverID = 0
			s.purge()
		} else if s.serverID != 0 {
			subs[s.serverID] = s
		}
	}
	e.window.setMax(int(hello.Limits.PublishInflightMax))
	epoch := e.epoch
	e.connSeq++
	seq := e.connSeq
	nsubs := len(e.subs)
	e.mu.Unlock()
	switch {
	case ident.ClientID == "":
		e.o.logger.Info("sinew: session started", "addr", e.addr, "client_id", hello.Resume.ClientID, "conn", seq,
			"grace_ms", hello.ReconnectGraceMs)
	case resumed:
		e.o.logger.Info("sinew: session resumed", "addr", e.addr, "client_id", hello.Resume.ClientID, "conn", seq,
			"subscriptions", nsubs)
	default:
		// resume_not_found (grace over, or a restarted broker) or
		// resume_rejected: the old session's leases are gone.
		e.o.logger.Warn("sinew: session not resumed, starting a fresh one", "addr", e.addr,
			"old_client_id", ident.ClientID, "client_id", hello.Resume.ClientID, "conn", seq,
			"outcome", hello.Outcome, "subscriptions", nsubs, "stale_settles", len(stale))
	}
	for _, r := range stale {
		r.fin(ErrStaleDelivery)
	}
	if restarted {
		e.o.logger.Info("sinew: broker restarted (new server generation)", "addr", e.addr,
			"old_generation", prevGen, "generation", hello.ServerGeneration, "outcome", hello.Outcome,
			"publishes_not_resent", len(unsafe))
	}
	for _, cl := range unsafe {
		// It may have been stored by the broker process that is gone, and
		// the new one cannot recognise a resend of it: its outcome is
		// unknown, which the application is told (ErrConnectionLost is
		// retryable) rather than have it stored twice behind its back.
		cl.done(nil, fmt.Errorf("%w: the broker restarted (generation %d) before confirming a publish without a producer id; it may or may not be stored, and is not sent again",
			ErrConnectionLost, hello.ServerGeneration))
	}

	c := newConn(e, nc, hello, epoch, subs)
	// The node says whether it runs in a cluster: a single broker needs
	// no METADATA probe (router.probeNow).
	e.single.Store(!hello.Cluster)
	c.run()
	if err := e.restore(ctx, c, resumed); err != nil {
		c.close(err)
		c.wg.Wait()
		return nil, err
	}
	return c, nil
}

// handshake sends HELLO and waits for HELLO_OK on a connection no goroutine
// reads yet. ctx and the handshake timeout both abort it through the socket's
// deadline.
func handshake(ctx context.Context, nc net.Conn, o *options, ident protocol.ResumeIdentity) (protocol.HelloOK, error) {
	hctx, cancel := context.WithTimeout(ctx, o.handshakeTimeout)
	defer cancel()
	stop := context.AfterFunc(hctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	defer func() {
		if stop() {
			_ = nc.SetDeadline(time.Time{})
		}
	}()
	hello := &protocol.Hello{
		ProtocolVersion: protocol.Version,
		ClientName:      o.clientName,
		ClientVersion:   ClientVersion,
		Credentials:     o.credentials,
		Resume:          ident,
		User:            o.user,
	}
	if _, err := nc.Write(protocol.AppendFrame(nil, 0, 1, hello)); err != nil {
		return protocol.HelloOK{}, ctxOr(ctx, err)
	}
	f, _, err := protocol.ReadFrame(nc, protocol.FrameBytesDefault, nil)
	if err != nil {
		var pe *protocol.Error
		if errors.As(err, &pe) {
			return protocol.HelloOK{}, fmt.Errorf("%w: %w", ErrProtocol, err)
		}
		return protocol.HelloOK{}, ctxOr(ctx, err)
	}
	body, err := protocol.Decode(f)
	if err != nil {
		return protocol.HelloOK{}, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	switch b := body.(type) {
	case *protocol.HelloOK:
		if b.ProtocolVersion != protocol.Version {
			return protocol.HelloOK{}, fmt.Errorf("%w: broker chose protocol version %d", ErrProtocol, b.ProtocolVersion)
		}
		return *b, nil
	case *protocol.ErrorBody:
		return protocol.HelloOK{}, brokerErr(b.Err())
	}
	return protocol.HelloOK{}, fmt.Errorf("%w: %s in answer to HELLO", ErrProtocol, f.Op)
}

// ctxOr prefers the caller's context error over the socket error it caused.
func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// restore brings a new connection up to the client's state: reconcile after a
// resume, resubscribe whatever the broker does not hold, resend held settles
// and in-flight publishes (after a broker restart, connect has already failed
// those that are not idempotent).
func (e *endpoint) restore(ctx context.Context, c *conn, resumed bool) error {
	if resumed {
		// Listed before RECONCILE: the deliveries of a subscription that
		// reconciliation ends are reported too, and come back stale.
		manual := e.manualSubs()
		if err := e.reconcile(ctx, c); err != nil {
			return err
		}
		if err := e.reconcileInflight(ctx, c, manual); err != nil {
			return err
		}
	}
	e.mu.Lock()
	var todo []*Subscription
	for s := range e.subs {
		if s.serverID == 0 {
			todo = append(todo, s)
		}
	}
	e.mu.Unlock()
	for _, s := range todo {
		err := e.subscribeOn(ctx, c, s)
		if err == nil {
			continue
		}
		if IsRetryable(err) && !isBrokerErr(err) || errors.Is(err, errShuttingDown) {
			// The new connection failed too, or the broker began a drain
			// right after the handshake: restore on the next one.
			return err
		}
		e.mu.Lock()
		if s.recreating {
			err = fmt.Errorf("%w: %w", ErrRecreated, err)
		}
		s.endLocked(err)
		e.mu.Unlock()
	}
	e.mu.Lock()
	replay := e.replay
	e.replay = nil
	held := e.takeHeldLocked()
	e.mu.Unlock()
	// Settles cut off from the previous socket go first, before any new
	// operation can use this connection. On a fresh session there are none
	// (connect failed them as stale).
	if len(held) > 0 {
		e.o.logger.Info("sinew: resending settles held across the reconnect", "addr", e.addr,
			"client_id", c.hello.Resume.ClientID, "settles", len(held))
	}
	for i, r := range held {
		if !c.queueSettle(r) {
			e.holdSettles(held[i:])
			return fmt.Errorf("%w: %w", ErrConnectionLost, c.closeErr())
		}
	}
	for i, cl := range replay {
		if err := c.start(ctx, cl); err != nil {
			if errors.Is(err, errConnClosed) {
				e.requeue(replay[i:], c.closeErr())
				return fmt.Errorf("%w: %w", ErrConnectionLost, c.closeErr())
			}
			cl.done(nil, err)
		}
	}
	return nil
}

// splitIdempotent splits held calls into those safe to send to a restarted
// broker (publishes with a producer id, which it deduplicates, and anything
// that is not a publish) and publishes without one.
func splitIdempotent(calls []*call) (safe, unsafe []*call) {
	for _, cl := range calls {
		if p, ok := cl.body.(*protocol.Publish); ok && p.ProducerID == "" {
			unsafe = append(unsafe, cl)
			continue
		}
		safe = append(safe, cl)
	}
	return safe, unsafe
}

// errShuttingDown matches a broker's shutting_down refusal (errors.Is).
var errShuttingDown = &BrokerError{Code: protocol.CodeShuttingDown}

func isBrokerErr(err error) bool {
	var be *BrokerError
	return errors.As(err, &be)
}

// reconcile tells the broker which subscriptions the client still holds and
// applies its decisions.
func (e *endpoint) reconcile(ctx context.Context, c *conn) error {
	e.mu.Lock()
	byID := make(map[uint64]*Subscription)
	var views []protocol.SubView
	var cohorts []protocol.SubCohort
	for s := range e.subs {
		if s.serverID != 0 {
			byID[s.serverID] = s
			views = append(views, s.view())
			if s.cfg.cohort != "" {
				cohorts = append(cohorts, protocol.SubCohort{SubID: s.serverID, Cohort: s.cfg.cohort, Member: s.cfg.member})
			}
		}
	}
	e.mu.Unlock()
	// RECONCILE goes out even with nothing to list: a SUBSCRIBE whose reply
	// was lost in the cut, or an Unsubscribe made while the socket was down,
	// left a subscription only the broker holds, and this is what drops it.
	hook := func(b protocol.Body) {
		rr, ok := b.(*protocol.ReconcileResult)
		if !ok {
			return
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, x := range rr.Entries {
			s := byID[x.ClientSubID]
			if s == nil || x.ClientSubID == 0 {
				continue // server-only, or not ours: the broker closed it
			}
			switch x.Action {
			case protocol.ActionKeep:
				if x.ServerSubID != 0 && x.ServerSubID != s.serverID {
					delete(c.subs, s.serverID)
					s.serverID = x.ServerSubID
					c.subs[s.serverID] = s
				}
			case protocol.ActionCloseClientSide:
				delete(c.subs, s.serverID)
				s.serverID = 0
				s.endLocked(fmt.Errorf("%w: %s", ErrReconciledClosed, x.Reason))
			case protocol.ActionRecreateClient:
				delete(c.subs, s.serverID)
				if x.ServerSubID != 0 {
					// The broker recreated it (restore policy) under a new
					// id; its deliveries follow the result.
					s.serverID = x.ServerSubID
					c.subs[s.serverID] = s
					s.revokeHeld()
				} else {
					// Resubscribe in restore, before the connection is used.
					s.serverID = 0
					s.recreating = true
				}
			}
		}
	}
	body := &protocol.Reconcile{Policy: uint8(e.o.reconcile), Subs: views, InflightFollows: true, Cohorts: cohorts}
	reply, err := c.roundTrip(ctx, body, hook)
	if err != nil {
		return err
	}
	rr, ok := reply.(*protocol.ReconcileResult)
	if !ok {
		return fmt.Errorf("%w: %s in answer to RECONCILE", ErrProtocol, reply.Op())
	}
	var counts [5]int
	for _, x := range rr.Entries {
		if int(x.Action) < len(counts) {
			counts[x.Action]++
		}
	}
	e.o.logger.Info("sinew: session resumed and reconciled", "addr", e.addr, "client_id", c.hello.Resume.ClientID,
		"subscriptions", len(views), "keep", counts[protocol.ActionKeep], "close_client_side", counts[protocol.ActionCloseClientSide],
		"close_server_side", counts[protocol.ActionCloseServerSide], "recreate", counts[protocol.ActionRecreateClient])
	return nil
}

// manualSubs returns the manual-ack subscriptions.
func (e *endpoint) manualSubs() []*Subscription {
	e.mu.Lock()
	defer e.mu.Unlock()
	subs := make([]*Subscription, 0, len(e.subs))
	for s := range e.subs {
		if !s.cfg.autoAck {
			subs = append(subs, s)
		}
	}
	return subs
}

// reconcileInflight tells the broker which manual-ack deliveries the client
// still holds unsettled (INFLIGHT, right after RECONCILE) and ends locally the
// ones the broker no longer holds for the session, so that their settle fails
// at once with ErrStaleDelivery. The broker re-sends the deliveries the client
// lacks before its answer; the reader drops any it already holds, by tag.
// Settles held across the cut are sent afterwards whatever the answer: the
// broker judges each by its lease.
func (e *endpoint) reconcileInflight(ctx context.Context, c *conn, subs []*Subscription) error {
	var entries []protocol.InflightEntry
	for _, s := range subs {
		entries = s.inflight(c.epoch, entries)
	}
	reply, err := c.roundTrip(ctx, &protocol.Inflight{Entries: entries}, nil)
	if err != nil {
		if isBrokerErr(err) {
			// A broker without INFLIGHT (unknown_op) re-sends every
			// unsettled delivery instead, which the reader de-duplicates by
			// tag; a refusal costs no more than that either. Settles are
			// still judged by their lease.
			e.o.logger.Info("sinew: broker did not reconcile in-flight deliveries", "addr", e.addr, "err", err)
			return nil
		}
		return err
	}
	ir, ok := reply.(*protocol.InflightResult)
	if !ok {
		return fmt.Errorf("%w: %s in answer to INFLIGHT", ErrProtocol, reply.Op())
	}
	ended := 0
	if len(ir.Stale) > 0 {
		stale := make(map[uint64]bool, len(ir.Stale))
		for _, t := range ir.Stale {
			stale[t] = true
		}
		for _, s := range subs {
			ended += s.markStale(c.epoch, stale)
		}
	}
	e.o.logger.Info("sinew: in-flight deliveries reconciled", "addr", e.addr, "client_id", c.hello.Resume.ClientID,
		"reported", len(entries), "kept", ir.Kept, "stale", len(ir.Stale), "ended", ended, "resent", ir.Resent)
	return nil
}

// roundTrip sends body on c and waits for the reply.
func (c *conn) roundTrip(ctx context.Context, body protocol.Body, hook func(protocol.Body)) (protocol.Body, error) {
	type result struct {
		b   protocol.Body
		err error
	}
	ch := make(chan result, 1)
	cl := &call{body: body, hook: hook, done: func(b protocol.Body, err error) { ch <- result{b, err} }}
	if err := c.start(ctx, cl); err != nil {
		if errors.Is(err, errConnClosed) {
			err = fmt.Errorf("%w: %w", ErrConnectionLost, c.closeErr())
		}
		return nil, err
	}
	select {
	case r := <-ch:
		return r.b, r.err
	case <-ctx.Done():
		c.take(cl.id)
		return nil, ctx.Err()
	}
}

// acquire returns a connection for a new operation. While the client is
// reconnecting it waits for the supervisor's attempts (which keep to the
// reconnect policy's backoff) until one succeeds, ctx ends, the client closes,
// a fatal error stops it, or the policy's MaxAttempts is exhausted. Only once
// the supervisor has given up does an operation ask for an attempt of its own:
// one, whose failure it reports as ErrNotConnected. forSettle accepts a
// connection that is draining after GOING_AWAY: settles finish existing work.
func (e *endpoint) acquire(ctx context.Context, forSettle bool) (*conn, error) {
	// Fast path: every publish and settle comes through here, so the common
	// case takes no lock.
	if c := e.live.Load(); c != nil && !c.isClosed() && (forSettle || !c.draining.Load()) {
		return c, nil
	}
	waited, kicked := false, false
	var kickedAt uint64
	for {
		e.mu.Lock()
		switch {
		case e.closing:
			e.mu.Unlock()
			return nil, ErrClientClosed
		case e.fatal != nil:
			err := e.fatal
			e.mu.Unlock()
			return nil, err
		}
		if c := e.conn; c != nil && !c.isClosed() && (forSettle || !c.draining.Load()) {
			e.mu.Unlock()
			return c, nil
		}
		gaveUp, lastErr, attempts := e.gaveUp, e.attemptErr, e.attempts
		wait := e.attemptDone
		e.mu.Unlock()
		if gaveUp != nil {
			switch {
			case kicked && attempts > kickedAt:
				// The attempt this operation asked for failed.
				return nil, fmt.Errorf("%w: %s: %w", ErrNotConnected, e.addr, lastErr)
			case kicked:
				// Woken by something else (the supervisor giving up again
				// after an earlier attempt): wait for ours.
			case waited:
				// This operation waited through the attempts that exhausted
				// the policy.
				return nil, gaveUp
			default:
				select {
				case e.kick <- struct{}{}:
				default:
				}
				kicked, kickedAt = true, attempts
			}
		}
		select {
		case <-wait:
			waited = true
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-e.quit:
			return nil, ErrClientClosed
		}
	}
}

// submit sends a call on the current connection, waiting for one while the
// client reconnects, and guarantees cl.done runs exactly once.
func (e *endpoint) submit(ctx context.Context, cl *call) {
	for {
		c, err := e.acquire(ctx, false)
		if err != nil {
			cl.done(nil, err)
			return
		}
		err = c.start(ctx, cl)
		if errors.Is(err, errConnClosed) {
			continue // lost a race with the connection closing; wait for the next
		}
		if err != nil {
			cl.done(nil, err)
		}
		return
	}
}

// submitNow sends a call on the current connection if there is one, and
// fails it with ErrNotConnected otherwise instead of waiting for a
// reconnect (the router then sends it elsewhere). cl.done runs exactly once.
func (e *endpoint) submitNow(ctx context.Context, cl *call) {
	c := e.live.Load()
	if c == nil || c.isClosed() || c.draining.Load() {
		cl.done(nil, fmt.Errorf("%w: %s", ErrNotConnected, e.addr))
		return
	}
	if err := c.start(ctx, cl); err != nil {
		if errors.Is(err, errConnClosed) {
			err = fmt.Errorf("%w: %w", ErrConnectionLost, c.closeErr())
		}
		cl.done(nil, err)
	}
}

// requeue keeps replayable publishes from a broken connection for the next
// one, or fails them when there will be none.
func (e *endpoint) requeue(calls []*call, cause error) {
	if len(calls) == 0 {
		return
	}
	e.mu.Lock()
	var fail error
	switch {
	case e.closed:
		fail = ErrClientClosed
	case e.fatal != nil:
		fail = e.fatal
	}
	if fail == nil {
		keep := make([]*call, 0, len(calls))
		var rerouted []*call
		for _, cl := range calls {
			if cl.reroute != nil {
				rerouted = append(rerouted, cl)
			} else {
				keep = append(keep, cl)
			}
		}
		e.replay = append(keep, e.replay...)
		e.mu.Unlock()
		for _, cl := range rerouted {
			if !cl.reroute(cause) {
				cl.done(nil, fmt.Errorf("%w: %w", ErrConnectionLost, cause))
			}
		}
		return
	}
	e.mu.Unlock()
	for _, cl := range calls {
		cl.done(nil, fmt.Errorf("%w: %w", ErrConnectionLost, fail))
	}
}

// openOnce connects the endpoint the first time it is used (Dial does it
// for the client's own address; the router for owners and seeds). A failed
// first connect leaves it unopened, for a later try.
func (e *endpoint) openOnce(ctx context.Context) error {
	e.openMu.Lock()
	defer e.openMu.Unlock()
	if e.opened.Load() {
		return nil
	}
	e.mu.Lock()
	closing := e.closing || e.closed
	e.mu.Unlock()
	if closing {
		return ErrClientClosed
	}
	if err := e.open(ctx); err != nil {
		return err
	}
	e.opened.Store(true)
	return nil
}

// wasOpened reports whether the endpoint ever connected.
func (e *endpoint) wasOpened() bool { return e.opened.Load() }

// holdSettles keeps settles whose connection broke before their result came
// for the resumed session (restore sends them again), or fails them when there
// will be none. What is held is bounded by the deliveries the broker had
// outstanding, which their subscriptions' prefetch bounds.
func (e *endpoint) holdSettles(rs []*settleReq) {
	if len(rs) == 0 {
		return
	}
	e.mu.Lock()
	var fail error
	switch {
	case e.closed:
		fail = ErrClientClosed
	case e.fatal != nil:
		fail = e.fatal
	case e.gaveUp != nil:
		fail = e.gaveUp
	}
	// A spanning subscription's settles go to the partition's owner,
	// which may be another node by now, rather than wait for this one.
	var lost []*settleReq
	if fail == nil {
		rs = slices.DeleteFunc(rs, func(r *settleReq) bool {
			if r.spanned() {
				lost = append(lost, r)
				return true
			}
			return false
		})
		e.held = append(e.held, rs...)
		rs = nil
	}
	e.mu.Unlock()
	for _, r := range lost {
		r.fin(fmt.Errorf("%w: %s", ErrConnectionLost, e.addr))
	}
	for _, r := range rs {
		r.fin(fail)
	}
}

// takeHeldLocked removes and returns the held settles (e.mu held).
func (e *endpoint) takeHeldLocked() []*settleReq {
	held := e.held
	e.held = nil
	return held
}

// failFatal makes err the client's permanent state: subscriptions end with it
// and operations return it.
func (e *endpoint) failFatal(err error) {
	e.o.logger.Error("sinew: fatal connection error, not reconnecting", "addr", e.addr, "err", err)
	e.mu.Lock()
	e.fatal = err
	e.live.Store(nil)
	e.attemptErr = err
	e.attempts++
	close(e.attemptDone)
	e.attemptDone = make(chan struct{})
	e.mu.Unlock()
	e.endAll(err)
}

// giveUp ends subscriptions and pending resends after MaxAttempts failures,
// and wakes the operations waiting for a connection so that they fail with err.
func (e *endpoint) giveUp(err error) {
	e.o.logger.Warn("sinew: giving up reconnecting", "addr", e.addr, "err", err)
	e.mu.Lock()
	e.gaveUp = err
	close(e.attemptDone)
	e.attemptDone = make(chan struct{})
	e.mu.Unlock()
	e.endAll(err)
}

func (e *endpoint) endAll(err error) {
	e.mu.Lock()
	for s := range e.subs {
		s.endLocked(err)
	}
	replay := e.replay
	e.replay = nil
	held := e.takeHeldLocked()
	e.mu.Unlock()
	for _, cl := range replay {
		cl.done(nil, err)
	}
	for _, r := range held {
		r.fin(err)
	}
}

// subClosed handles the broker ending a subscription.
func (e *endpoint) subClosed(c *conn, b *protocol.SubClosed) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c.mu.Lock()
	s := c.subs[b.SubID]
	delete(c.subs, b.SubID)
	c.mu.Unlock()
	if s == nil {
		return
	}
	s.serverID = 0
	switch b.Reason {
	case protocol.SubClosedShutdown:
		// The broker is stopping; the subscription is restored on the next
		// connection like any other the broker does not hold.
	case protocol.SubClosedUnsubscribed:
		s.endLocked(ErrUnsubscribed)
	case protocol.SubClosedReconciled:
		s.endLocked(fmt.Errorf("%w: %s", ErrReconciledClosed, b.Message))
	case protocol.SubClosedQueueDeleted:
		s.endLocked(&BrokerError{Code: protocol.CodeNotFound, Message: "queue deleted: " + b.Message})
	default:
		code := b.Code
		if code == protocol.CodeOK {
			code = protocol.CodeInternal
		}
		s.endLocked(&BrokerError{Code: code, Message: b.Message})
	}
}

// shutdown stops the supervisor and the connection. Callers drain first.
func (e *endpoint) shutdown() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		e.wg.Wait()
		return
	}
	e.closing = true
	e.closed = true
	c := e.conn
	e.conn = nil
	e.live.Store(nil)
	close(e.quit)
	e.cancel()
	e.mu.Unlock()
	if c != nil {
		c.close(ErrClientClosed)
		c.wg.Wait()
	}
	e.endAll(ErrClientClosed)
	e.wg.Wait()
}
