package server

import (
	"bufio"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/session"
	"github.com/sinewmq/sinew/protocol"
)

// conn is one client connection.
type conn struct {
	srv  *Server
	id   uint64
	nc   net.Conn
	log  *slog.Logger
	w    *writer
	sess *session.Session // set by the reader at HELLO; read by teardown after the reader exits

	established     atomic.Bool // HELLO_OK was queued
	handshaking     bool        // counted in Server.handshakes; reader goroutine only, changed under Server.mu
	addrKey         string      // source IP (connKey); "" when the remote address is not an IP
	resendDue       bool        // reader only: resumed, and no request handled since
	inflightDue     bool        // reader only: a RECONCILE said INFLIGHT follows; re-sends wait for it
	publishInflight atomic.Int64
	settleInflight  atomic.Int64
	// topicOps counts, per topic, this connection's declares and deletes
	// under way off the reader (a declare in a cluster waits for the
	// controller and the new partitions' elections): a later request
	// naming that topic waits for them, one naming another topic does
	// not. The reader adds, the op's goroutine removes, under opsMu.
	opsMu       sync.Mutex
	topicOps    map[string]int
	opsN        atomic.Int64  // sum of topicOps, read without opsMu on the reader's fast path
	readerWake  chan struct{} // cap 1: a resource the reader may wait for was released
	closeReason atomic.Value  // string
	opened      time.Time     // when accepted; for Server.Connections
	loopback    bool          // accepted on a loopback-only listener
	// peerCertName is the user name the verified client certificate
	// carries (tls.client_cert_user), "" without one; read at HELLO.
	peerCertName string
	// principal is who the peer authenticated as; set by the reader at
	// HELLO, before any request is handled, and never changed.
	principal auth.Principal
}

// topicOpsMax bounds a connection's declares and deletes under way at
// once; the reader waits for one to end before it starts another.
const topicOpsMax = 8

// topicBusy reports whether a declare or delete of topic is under way on
// this connection, or, for topic "", whether any is.
func (c *conn) topicBusy(topic string) bool {
	if c.opsN.Load() == 0 {
		return false // nearly always: no lock on a publish's path
	}
	if topic == "" {
		return true
	}
	c.opsMu.Lock()
	defer c.opsMu.Unlock()
	return c.topicOps[topic] > 0
}

// awaitTopic makes the reader wait while a declare or delete of topic (of
// any topic, for "") is under way on this connection, so that requests
// about one queue take effect in the order they were sent.
func (c *conn) awaitTopic(topic string) error {
	for c.topicBusy(topic) {
		if err := c.awaitWake(); err != nil {
			return err
		}
	}
	return nil
}

// awaitWake blocks the reader until something it may wait for was released
// (signalReader), or the connection's writer ended.
func (c *conn) awaitWake() error {
	select {
	case <-c.readerWake:
		return nil
	case <-c.w.done:
		return io.EOF
	}
}

// startTopicOp runs op off the reader as a declare or delete of topic,
// once fewer than topicOpsMax are under way.
func (c *conn) startTopicOp(topic string, op func()) error {
	for {
		c.opsMu.Lock()
		if c.opsN.Load() < topicOpsMax {
			if c.topicOps == nil {
				c.topicOps = map[string]int{}
			}
			c.topicOps[topic]++
			c.opsN.Add(1)
			c.opsMu.Unlock()
			break
		}
		c.opsMu.Unlock()
		if err := c.awaitWake(); err != nil {
			return err
		}
	}
	go func() {
		defer func() {
			c.opsMu.Lock()
			if c.topicOps[topic]--; c.topicOps[topic] == 0 {
				delete(c.topicOps, topic)
			}
			c.opsN.Add(-1)
			c.opsMu.Unlock()
			c.signalReader()
		}()
		op()
	}()
	return nil
}

// requestTopic is the topic a request names, for the ordering of
// awaitTopic; "" with ok for END_SESSION, which waits for every one.
func requestTopic(body any) (topic string, ok bool) {
	switch b := body.(type) {
	case *protocol.DeclareQueue:
		return b.Topic, true
	case *protocol.DeleteQueue:
		return b.Topic, true
	case *protocol.PurgeQueue:
		return b.Topic, true
	case *protocol.Publish:
		return b.Topic, true
	case *protocol.Subscribe:
		return b.Topic, true
	case *protocol.Metadata:
		return b.Topic, true
	case *protocol.EndSession:
		return "", true
	}
	return "", false
}

func (c *conn) signalReader() {
	select {
	case c.readerWake <- struct{}{}:
	default:
	}
}

func (c *conn) noteWriteError(err error) {
	c.closeReason.CompareAndSwap(nil, "write: "+err.Error())
}

// reply queues o on this connection, or runs its Dropped hook when the connection
// no longer accepts frames.
func (c *conn) reply(o session.Outbound) {
	if !c.w.Send(o) && o.Dropped != nil {
		o.Dropped()
	}
}

// replyErr answers request reqID with an ERROR frame.
func (c *conn) replyErr(reqID uint64, err error) {
	c.srv.stats.requestErrors.Add(1)
	c.w.Send(session.Outbound{RequestID: reqID, Body: errorBody(err)})
}

// errorBody turns err into an ERROR body: its protocol code and its message
// without the "sinew: code:" prefix. An error without a code is a failure
// inside the broker whose text may name server paths: the peer gets internal
// with a fixed message, and the caller logs err (see logInternal).
func errorBody(err error) *protocol.ErrorBody {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return &protocol.ErrorBody{Code: pe.Code, Message: pe.Message, Owner: pe.Owner}
	}
	return &protocol.ErrorBody{Code: protocol.CodeInternal, Message: "internal error; the broker log has the cause"}
}

// logInternal logs err, with the request's context, when it carries no
// protocol code: errorBody hid its text from the peer. Coded errors were
// chosen for the peer, and the broker logs its own internal ones.
func (c *conn) logInternal(op protocol.Op, reqID uint64, err error, attrs ...any) {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return
	}
	c.log.Error("request failed inside the broker", append([]any{"op", op.String(), "request", reqID, "err", err}, attrs...)...)
}

// fatalError is returned by handlers for conditions that end the connection.
type fatalError struct {
	code protocol.Code
	msg  string
}

func (e *fatalError) Error() string { return e.code.String() + ": " + e.msg }

func fatal(code protocol.Code, format string, args ...any) error {
	return &fatalError{code: code, msg: fmt.Sprintf(format, args...)}
}

// serve runs the reader loop in the calling goroutine, then tears the connection
// down: the writer is flushed (after a fatal error) or stopped, the socket closed,
// and the session told which frames never left.
func (c *conn) serve() {
	go c.w.run()
	err := c.readLoop()
	var fe *fatalError
	if errors.Is(err, errSessionEnded) {
		c.closeReason.CompareAndSwap(nil, "session ended by the client")
		c.w.finish()
	} else if errors.As(err, &fe) {
		c.srv.stats.fatalErrors.Add(1)
		c.closeReason.CompareAndSwap(nil, fe.Error())
		c.w.Send(session.Outbound{Body: &protocol.ErrorBody{Code: fe.code, Message: fe.msg, Fatal: true}})
		c.w.finish()
	} else {
		if err != nil && !errors.Is(err, io.EOF) {
			c.closeReason.CompareAndSwap(nil, "read: "+err.Error())
		} else {
			c.closeReason.CompareAndSwap(nil, "peer closed")
		}
		c.w.abort()
	}
	<-c.w.done
	c.nc.Close()
	unsent := c.w.takeUnsent()
	if c.sess != nil {
		c.sess.Detach(c.w, unsent)
	} else {
		for _, o := range unsent {
			if o.Dropped != nil {
				o.Dropped()
			}
		}
	}
	reason, _ := c.closeReason.Load().(string)
	c.log.Debug("connection closed", "reason", reason, "unsent", len(unsent))
}

// readerPool recycles the readers' 64 KiB buffers: peers that connect and
// are cut at once (garbage, wrong credentials, a reconnect loop) would
// otherwise allocate one per connection and make the collector run for them.
var readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, readBufferBytes) }}

// readLoop reads and handles frames until the peer goes or a fatal error.
func (c *conn) readLoop() error {
	cfg := &c.srv.cfg
	br := readerPool.Get().(*bufio.Reader)
	br.Reset(c.nc)
	defer func() {
		// Nothing keeps a reference into br once the loop ends: frames are
		// copied out of it into buf.
		br.Reset(nil)
		readerPool.Put(br)
	}()
	var buf []byte
	if cfg.HandshakeTimeoutMs > 0 {
		c.nc.SetReadDeadline(time.Now().Add(time.Duration(cfg.HandshakeTimeoutMs) * time.Millisecond))
	}
	hb := time.Duration(cfg.HeartbeatMs) * time.Millisecond
	var deadlineSetAt time.Time
	for {
		if err := c.waitForCredit(); err != nil {
			return err
		}
		if c.sess != nil && hb > 0 {
			// Refresh the silence deadline only now and then: the deadline is
			// 3 intervals out, so a quarter-interval of slack costs nothing.
			if now := time.Now(); now.Sub(deadlineSetAt) > hb/4 {
				c.nc.SetReadDeadline(now.Add(heartbeatMissesMax * hb))
				deadlineSetAt = now
			}
		}
		var f protocol.Frame
		var err error
		// Until HELLO_OK announces frame_bytes_max, a peer may send no more
		// than the protocol's default limit; checking the larger limit here
		// would leave a slightly oversized first frame waiting for its body
		// until the handshake timeout.
		frameMax := cfg.FrameBytesMax
		if c.sess == nil {
			frameMax = min(frameMax, protocol.FrameBytesDefault)
		}
		f, buf, err = protocol.ReadFrame(br, frameMax, buf)
		if err != nil {
			var pe *protocol.Error
			switch {
			case errors.As(err, &pe):
				return fatal(pe.Code, "%s", pe.Message)
			case errors.Is(err, os.ErrDeadlineExceeded):
				if c.sess == nil {
					c.srv.stats.handshakeTimeouts.Add(1)
					return fatal(protocol.CodeHandshakeTimeout, "no HELLO within %d ms", cfg.HandshakeTimeoutMs)
				}
				return fatal(protocol.CodeHeartbeatTimeout, "nothing received for %d ms", heartbeatMissesMax*cfg.HeartbeatMs)
			case errors.Is(err, io.ErrUnexpectedEOF):
				return fatal(protocol.CodeBadFrame, "connection closed inside a frame")
			}
			return err
		}
		c.srv.stats.framesIn.Add(1)
		if len(buf) > 4*readBufferBytes && len(f.Body) < readBufferBytes {
			buf = nil // one large frame should not pin its buffer for the connection's life
		}
		if err := c.handle(f); err != nil {
			return err
		}
		if c.handshaking && c.sess != nil {
			c.srv.handshakeDone(c)
		}
	}
}

// waitForCredit blocks while the connection has too much in flight.
func (c *conn) waitForCredit() error {
	cfg := &c.srv.cfg
	for {
		if c.publishInflight.Load() < int64(cfg.PublishInflightMax) &&
			c.settleInflight.Load() < settleInflightMax &&
			c.w.queued() < readerQueueFramesMax {
			return nil
		}
		c.srv.stats.readerPauses.Add(1)
		if h := c.srv.testHookReaderPaused; h != nil {
			h()
		}
		if err := c.awaitWake(); err != nil {
			return err
		}
	}
}

// clientOps are the ops a client may send after HELLO.
func clientOp(op protocol.Op) bool {
	switch op {
	case protocol.OpHello, protocol.OpPing, protocol.OpPong, protocol.OpDeclareQueue, protocol.OpPublish,
		protocol.OpSubscribe, protocol.OpUnsubscribe, protocol.OpAck, protocol.OpNack, protocol.OpFail, protocol.OpExtend,
		protocol.OpReconcile, protocol.OpDeleteQueue, protocol.OpPurgeQueue, protocol.OpEndSession, protocol.OpInflight,
		protocol.OpMetadata:
		return true
	}
	return false
}

func (c *conn) handle(f protocol.Frame) error {
	if c.sess == nil {
		if f.Op != protocol.OpHello {
			return fatal(protocol.CodeHandshakeRequired, "first frame must be HELLO, got %s", f.Op)
		}
		return c.hello(f)
	}
	if c.resendDue {
		// Deliveries the previous socket may have lost go out again: after the
		// RECONCILE_RESULT when the client reconciles first (Reconcile sends
		// them, unless INFLIGHT follows; the deferred call covers a RECONCILE
		// that failed), only those the client lacks when it sends INFLIGHT,
		// otherwise before the answer to whatever it asked first.
		c.resendDue = false
		switch f.Op {
		case protocol.OpReconcile:
			defer func() {
				if !c.inflightDue {
					c.sess.Resend()
				}
			}()
		case protocol.OpInflight:
		default:
			c.sess.Resend()
		}
	} else if c.inflightDue {
		// RECONCILE promised INFLIGHT next; anything else gets the re-sends first.
		c.inflightDue = false
		if f.Op != protocol.OpInflight {
			c.sess.Resend()
		}
	}
	if !clientOp(f.Op) {
		c.replyErr(f.RequestID, protocol.Errorf(protocol.CodeUnknownOp, "op %s is not a client request", f.Op))
		return nil
	}
	body, err := protocol.Decode(f)
	if err != nil {
		return fatal(protocol.CodeOf(err), "%s", errorBody(err).Message)
	}
	noReply := f.Flags&protocol.FlagNoReply != 0
	if topic, ok := requestTopic(body); ok {
		if err := c.awaitTopic(topic); err != nil {
			return err
		}
	}
	switch b := body.(type) {
	case *protocol.Hello:
		return fatal(protocol.CodeHandshakeRequired, "HELLO sent twice")
	case *protocol.Ping:
		c.w.Send(session.Outbound{RequestID: f.RequestID, Body: &protocol.Pong{}})
	case *protocol.Pong:
	case *protocol.DeclareQueue:
		return c.declare(f.RequestID, b)
	case *protocol.Publish:
		c.publish(f.RequestID, noReply, b)
	case *protocol.DeleteQueue:
		return c.deleteQueue(f.RequestID, b)
	case *protocol.PurgeQueue:
		c.purgeQueue(f.RequestID, b)
	case *protocol.Subscribe:
		if c.srv.isDraining() {
			c.replyErr(f.RequestID, errDraining)
		} else if err := c.permit(auth.ActionConsume, b.Topic); err != nil {
			c.replyErr(f.RequestID, err)
		} else if err := c.sess.SubscribeChecked(c.w, f.RequestID, *b, c.mayCreate(b.Topic)); err != nil {
			c.logInternal(f.Op, f.RequestID, err, "topic", b.Topic, "group", b.Group)
			c.replyErr(f.RequestID, err)
		}
	case *protocol.Unsubscribe:
		if err := c.sess.Unsubscribe(b.SubID); err != nil {
			c.replyErr(f.RequestID, err)
		} else if !noReply {
			c.w.Send(session.Outbound{RequestID: f.RequestID, Body: &protocol.OK{}})
		}
	case *protocol.Settle:
		c.settle(f.RequestID, noReply, b)
	case *protocol.Extend:
		c.extend(f.RequestID, noReply, b)
	case *protocol.Metadata:
		c.metadata(f.RequestID, b)
	case *protocol.Reconcile:
		allow := func(topic string) error { return c.permit(auth.ActionConsume, topic) }
		if err := c.sess.ReconcileWith(c.w, f.RequestID, b, allow, c.createCheck); err != nil {
			c.replyErr(f.RequestID, err)
		} else {
			c.inflightDue = b.InflightFollows
		}
	case *protocol.Inflight:
		if err := c.sess.Inflight(c.w, f.RequestID, b); err != nil {
			c.replyErr(f.RequestID, err)
		}
	case *protocol.EndSession:
		c.sess.End(c.w)
		c.w.Send(session.Outbound{RequestID: f.RequestID, Body: &protocol.OK{}})
		return errSessionEnded
	}
	return nil
}

// errSessionEnded ends the reader after END_SESSION: the writer flushes the
// OK, then the connection closes.
var errSessionEnded = errors.New("session ended by the client")

var errDraining = protocol.Errorf(protocol.CodeShuttingDown, "broker is draining")

func (c *conn) hello(f protocol.Frame) error {
	cfg := &c.srv.cfg
	body, err := protocol.Decode(f)
	if err != nil {
		return fatal(protocol.CodeOf(err), "%s", errorBody(err).Message)
	}
	h := body.(*protocol.Hello)
	if h.ProtocolVersion != protocol.Version {
		return fatal(protocol.CodeUnsupportedVer, "protocol version %d, this server speaks %d", h.ProtocolVersion, protocol.Version)
	}
	c.peerCertName = peerCertName(c.nc)
	p, err := c.authenticate(h)
	if err != nil {
		return err
	}
	c.principal = p
	if c.srv.isDraining() {
		return fatal(protocol.CodeShuttingDown, "broker is draining")
	}
	hb := cfg.HeartbeatMs
	if hb < 0 {
		hb = 0
	}
	helloOK := func(id protocol.ResumeIdentity, outcome protocol.ResumeOutcome) session.Outbound {
		return session.Outbound{RequestID: f.RequestID, Body: &protocol.HelloOK{
			ProtocolVersion: protocol.Version, ServerVersion: cfg.ServerVersion, Resume: id, Outcome: outcome,
			ServerGeneration: c.srv.generation, HeartbeatMs: uint32(hb), ReconnectGraceMs: uint32(c.srv.reg.ReconnectGraceMs()),
			Limits: cfg.limits(), Cluster: cfg.Cluster,
		}}
	}
	sess, outcome, err := c.srv.reg.Open(h.Resume, c.principal.Owner(), c.w, c.id, helloOK)
	if err != nil {
		return fatal(protocol.CodeOf(err), "%v", err)
	}
	c.sess = sess
	c.resendDue = outcome == protocol.ResumeResumed
	c.established.Store(true)
	c.log = c.log.With("client_id", sess.ClientID())
	c.log.Debug("handshake done", "client_name", h.ClientName, "client_version", h.ClientVersion, "outcome", outcome.String(),
		"principal", c.principal.Name, "principal_kind", c.principal.Kind.String())
	if cfg.HeartbeatMs <= 0 {
		c.nc.SetReadDeadline(time.Time{})
	}
	return nil
}

// logNameBytesMax bounds a peer-chosen user name in a log record.
const logNameBytesMax = 64

// authenticate decides who the HELLO's sender is (docs/protocol.md 5.1).
// Every refusal waits AuthFailureDelayMs and then gives the same fatal
// auth_failed; the log records the remote address (on c.log), the user name
// and the reason, never the credential.
func (c *conn) authenticate(h *protocol.Hello) (auth.Principal, error) {
	cfg := &c.srv.cfg
	var reason string
	switch {
	case h.User != "":
		if cfg.Users == nil {
			reason = "no users configured"
			break
		}
		release, err := c.loginLane()
		if err != nil {
			return auth.Principal{}, err
		}
		// Held through the failure delay below when the check fails.
		defer release()
		// The hash slot is waited for until the handshake deadline, no
		// longer: past it the client is told the broker is busy, which is
		// no wrong password, so it is neither delayed nor counted as one.
		ctx, cancel := context.WithDeadline(context.Background(), c.handshakeDeadline())
		p, err := cfg.Users.VerifyFrom(ctx, c.addrKey, h.User, h.Credentials)
		cancel()
		if errors.Is(err, auth.ErrBusy) {
			c.srv.stats.handshakeTimeouts.Add(1)
			c.log.Warn("login not checked: no password hash slot free before the handshake deadline",
				"user", truncate(h.User, logNameBytesMax), "handshake_timeout_ms", cfg.HandshakeTimeoutMs)
			return auth.Principal{}, fatal(protocol.CodeHandshakeTimeout,
				"the broker is busy checking other logins: no password check could start within the %d ms handshake timeout; retry", cfg.HandshakeTimeoutMs)
		}
		if err == nil {
			return p, nil
		}
		reason = "unknown user or wrong password"
	case h.Credentials != "":
		// A token check is cheap, but a guess must cost as much as a
		// password guess: one at a time per source address, a wrong one
		// holding the address through the failure delay below.
		release, err := c.loginLane()
		if err != nil {
			return auth.Principal{}, err
		}
		defer release()
		match := -1
		for i, t := range cfg.AuthTokens {
			// Every token is compared, so the time taken does not say
			// which one matched.
			if subtle.ConstantTimeCompare([]byte(h.Credentials), []byte(t)) == 1 {
				match = i
			}
		}
		if match >= 0 {
			return auth.TokenPrincipal(match), nil
		}
		reason = "token matches none of auth.tokens"
	case c.peerCertName != "":
		// The certificate speaks for the peer only when HELLO names no
		// user or token: explicit credentials win.
		if cfg.Users != nil {
			if p, err := cfg.Users.Certificate(c.peerCertName); err == nil {
				return p, nil
			}
		}
		reason = "client certificate names no user: " + truncate(c.peerCertName, logNameBytesMax)
	default:
		configured := len(cfg.AuthTokens) > 0 || (cfg.Users != nil && cfg.Users.Len() > 0)
		if auth.AnonymousAllowed(cfg.AllowAnonymous, c.loopback, configured) {
			return auth.Anonymous(), nil
		}
		reason = "no credentials"
	}
	c.srv.stats.authFailures.Add(1)
	c.log.Warn("authentication failed", "user", truncate(h.User, logNameBytesMax), "reason", reason, "client_name", truncate(h.ClientName, logNameBytesMax))
	if d := cfg.AuthFailureDelayMs; d > 0 {
		t := time.NewTimer(time.Duration(d) * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
		case <-c.w.done: // the server closed the connection meanwhile
		}
	}
	return auth.Principal{}, fatal(protocol.CodeAuthFailed, "authentication failed")
}

// certNamer is implemented by connections from a TLS listener that can name
// the user of a verified client certificate (tlsconf.Conn).
type certNamer interface{ PeerCertName() string }

// peerCertName is nc's client certificate user, "" for any other connection.
// The TLS handshake ran at the first read, before HELLO was decoded.
func peerCertName(nc net.Conn) string {
	if cn, ok := nc.(certNamer); ok {
		return cn.PeerCertName()
	}
	return ""
}

// loginLane waits for this connection's source address to have no other
// password or token check in progress (auth.Lanes), at most until the
// handshake timeout, and returns the function that lets the next one go.
func (c *conn) loginLane() (func(), error) {
	if c.addrKey == "" {
		return func() {}, nil
	}
	ctx, cancel := context.WithDeadline(context.Background(), c.handshakeDeadline())
	defer cancel()
	release, err := c.srv.logins.Acquire(ctx, c.addrKey)
	if err != nil {
		c.srv.stats.handshakeTimeouts.Add(1)
		return nil, fatal(protocol.CodeHandshakeTimeout, "login still waiting behind other logins from this address after %d ms", c.srv.cfg.HandshakeTimeoutMs)
	}
	return release, nil
}

// handshakeDeadline is when the connection's handshake times out: the
// waits of a login (its address's lane, a hash slot) end there.
func (c *conn) handshakeDeadline() time.Time {
	return c.opened.Add(time.Duration(c.srv.cfg.HandshakeTimeoutMs) * time.Millisecond)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// declare runs off the reader (startTopicOp): in a cluster it waits for
// the controller and for the new partitions to elect, and the
// connection's requests about other queues go on meanwhile; those about
// this topic wait for it.
func (c *conn) declare(reqID uint64, d *protocol.DeclareQueue) error {
	if c.srv.isDraining() {
		c.replyErr(reqID, errDraining)
		return nil
	}
	if err := c.permitDeclare(d); err != nil {
		c.replyErr(reqID, err)
		return nil
	}
	return c.startTopicOp(d.Topic, func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(c.srv.cfg.DeclareTimeoutMs)*time.Millisecond)
		defer cancel()
		ok, err := c.srv.cfg.Backend.Declare(ctx, d)
		if err != nil {
			c.logInternal(protocol.OpDeclareQueue, reqID, err, "topic", d.Topic, "group", d.Group)
			c.replyErr(reqID, err)
			return
		}
		c.w.Send(session.Outbound{RequestID: reqID, Body: &ok})
	})
}

// deleteQueue runs off the reader, like declare, and answers once the
// delete is durable.
func (c *conn) deleteQueue(reqID uint64, d *protocol.DeleteQueue) error {
	if c.srv.isDraining() {
		c.replyErr(reqID, errDraining)
		return nil
	}
	if err := c.permit(auth.ActionManage, d.Topic); err != nil {
		c.replyErr(reqID, err)
		return nil
	}
	return c.startTopicOp(d.Topic, func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(c.srv.cfg.DeclareTimeoutMs)*time.Millisecond)
		defer cancel()
		if err := c.srv.cfg.Backend.DeleteQueue(ctx, d); err != nil {
			c.logInternal(protocol.OpDeleteQueue, reqID, err, "topic", d.Topic, "group", d.Group)
			c.replyErr(reqID, err)
			return
		}
		c.w.Send(session.Outbound{RequestID: reqID, Body: &protocol.OK{}})
	})
}

// metadata answers METADATA: where the queue's partitions are served. A
// principal that may publish to or consume from the topic may ask.
func (c *conn) metadata(reqID uint64, m *protocol.Metadata) {
	mb, ok := c.srv.cfg.Backend.(session.MetadataBackend)
	if !ok {
		c.replyErr(reqID, protocol.Errorf(protocol.CodeUnknownOp, "this server does not answer METADATA"))
		return
	}
	if !c.principal.Allows(auth.ActionPublish, m.Topic) {
		if err := c.permit(auth.ActionConsume, m.Topic); err != nil {
			c.replyErr(reqID, err)
			return
		}
	}
	res, err := mb.Metadata(m)
	if err != nil {
		c.replyErr(reqID, err)
		return
	}
	c.w.Send(session.Outbound{RequestID: reqID, Body: &res})
}

// purgeQueue hands the purge to the backend and answers from its callback.
// Each purge holds a settle slot until it is answered, so a peer cannot
// pile up unanswered purges beyond the settle bound.
func (c *conn) purgeQueue(reqID uint64, pq *protocol.PurgeQueue) {
	if c.srv.isDraining() {
		c.replyErr(reqID, errDraining)
		return
	}
	if err := c.permit(auth.ActionManage, pq.Topic); err != nil {
		c.replyErr(reqID, err)
		return
	}
	c.settleInflight.Add(1)
	release := func() {
		c.settleInflight.Add(-1)
		c.signalReader()
	}
	topic, group := pq.Topic, pq.Group
	c.srv.cfg.Backend.PurgeQueue(pq, func(ok protocol.PurgeOK, err error) {
		if err != nil {
			c.logInternal(protocol.OpPurgeQueue, reqID, err, "topic", topic, "group", group)
			c.reply(session.Outbound{RequestID: reqID, Body: errorBody(err), AfterWrite: release, Dropped: release})
			return
		}
		c.reply(session.Outbound{RequestID: reqID, Body: &ok, AfterWrite: release, Dropped: release})
	})
}

func (c *conn) publish(reqID uint64, noReply bool, p *protocol.Publish) {
	srv := c.srv
	if srv.isDraining() {
		c.replyErr(reqID, errDraining)
		return
	}
	if err := c.permitPublish(p.Topic); err != nil {
		// Even with NO_REPLY: failures still produce ERROR (protocol 5.6).
		c.replyErr(reqID, err)
		return
	}
	if len(p.Body) > srv.cfg.BodyBytesMax {
		c.replyErr(reqID, protocol.Errorf(protocol.CodeMessageTooLarge, "body of %d bytes exceeds %d", len(p.Body), srv.cfg.BodyBytesMax))
		return
	}
	c.publishInflight.Add(1)
	srv.inflight.Add(1)
	srv.stats.publishes.Add(1)
	var released atomic.Bool
	release := func() {
		if released.CompareAndSwap(false, true) {
			c.publishInflight.Add(-1)
			srv.releaseInflight()
			c.signalReader()
		}
	}
	topic, group := p.Topic, p.Group // not p: its body aliases the read buffer
	c.backendPublish(p, func(ok protocol.PublishOK, err error) {
		if err != nil {
			srv.stats.publishErrors.Add(1)
			c.logInternal(protocol.OpPublish, reqID, err, "topic", topic, "group", group)
			c.reply(session.Outbound{RequestID: reqID, Body: errorBody(err), AfterWrite: release, Dropped: release})
			return
		}
		srv.stats.publishConfirms.Add(1)
		if noReply {
			release()
			return
		}
		c.reply(session.Outbound{RequestID: reqID, Body: &ok, AfterWrite: release, Dropped: release})
	})
}

func (c *conn) settle(reqID uint64, noReply bool, st *protocol.Settle) {
	if len(st.Tags) > c.srv.cfg.SettleBatchMax {
		c.replyErr(reqID, protocol.Errorf(protocol.CodeLimitExceeded, "%d tags in one settle, limit %d", len(st.Tags), c.srv.cfg.SettleBatchMax))
		return
	}
	if len(st.Tags) == 0 {
		c.replyErr(reqID, protocol.Errorf(protocol.CodeBadRequest, "settle without tags"))
		return
	}
	delay := st.DelayMs
	if st.Kind != protocol.OpNack || delay < 0 {
		delay = 0
	}
	c.settleInflight.Add(1)
	c.srv.stats.settles.Add(uint64(len(st.Tags)))
	release := func() {
		c.settleInflight.Add(-1)
		c.signalReader()
	}
	c.sess.Settle(st.Kind, st.Tags, st.Leases, delay, func(codes []protocol.Code) {
		c.settleResult(reqID, noReply, codes, "settled", release)
	})
}

// settleResult answers a settle or an EXTEND with its codes: SETTLE_RESULT,
// or with NO_REPLY nothing when every code is ok and otherwise an ERROR with
// the first code that is not. release runs once the answer is written or
// dropped (at once when there is none).
func (c *conn) settleResult(reqID uint64, noReply bool, codes []protocol.Code, verb string, release func()) {
	if noReply {
		failed, first := 0, protocol.CodeOK
		for _, code := range codes {
			if code != protocol.CodeOK {
				if failed == 0 {
					first = code
				}
				failed++
			}
		}
		if failed > 0 {
			c.reply(session.Outbound{RequestID: reqID, Body: &protocol.ErrorBody{Code: first,
				Message: fmt.Sprintf("%d of %d tags not %s", failed, len(codes), verb)}, AfterWrite: release, Dropped: release})
			return
		}
		release()
		return
	}
	c.reply(session.Outbound{RequestID: reqID, Body: &protocol.SettleResult{Codes: codes}, AfterWrite: release, Dropped: release})
}

// extend handles EXTEND: the tag count is checked as for a settle, an
// extend_ms outside 1..LeaseMsMax is bad_request for every tag, and the
// rest is the session's (session.Session.Extend). It takes a settle slot,
// so a drain waits for its answer as for a settle's.
func (c *conn) extend(reqID uint64, noReply bool, ex *protocol.Extend) {
	if len(ex.Tags) > c.srv.cfg.SettleBatchMax {
		c.replyErr(reqID, protocol.Errorf(protocol.CodeLimitExceeded, "%d tags in one EXTEND, limit %d", len(ex.Tags), c.srv.cfg.SettleBatchMax))
		return
	}
	if len(ex.Tags) == 0 {
		c.replyErr(reqID, protocol.Errorf(protocol.CodeBadRequest, "EXTEND without tags"))
		return
	}
	c.settleInflight.Add(1)
	release := func() {
		c.settleInflight.Add(-1)
		c.signalReader()
	}
	done := func(codes []protocol.Code) { c.settleResult(reqID, noReply, codes, "extended", release) }
	if ex.ExtendMs < 1 || ex.ExtendMs > c.srv.cfg.LeaseMsMax {
		codes := make([]protocol.Code, len(ex.Tags))
		for i := range codes {
			codes[i] = protocol.CodeBadRequest
		}
		if noReply {
			// The ERROR names the bound, which the codes alone cannot.
			c.reply(session.Outbound{RequestID: reqID, Body: &protocol.ErrorBody{Code: protocol.CodeBadRequest,
				Message: fmt.Sprintf("EXTEND extend_ms %d is outside 1..%d (queue.lease_ms_max)", ex.ExtendMs, c.srv.cfg.LeaseMsMax)},
				AfterWrite: release, Dropped: release})
			return
		}
		done(codes)
		return
	}
	c.sess.Extend(ex.Tags, ex.Leases, ex.ExtendMs, done)
}
