package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/session"
	"github.com/sinewmq/sinew/protocol"
)

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = errors.New("server: closed")

// Server runs the Sinew protocol on accepted connections.
type Server struct {
	cfg        Config
	reg        *session.Registry
	generation uint64

	mu         sync.Mutex
	conns      map[*conn]struct{}
	perAddr    map[string]int // open connections by source IP (connKey)
	handshakes int            // connections in conns whose HELLO has not succeeded
	// logins serialises password checks per source address.
	logins    auth.Lanes
	listeners map[net.Listener]struct{}
	draining  bool
	connWG    sync.WaitGroup

	nextConnID atomic.Uint64
	inflight   atomic.Int64  // unconfirmed publishes over every connection
	drainWake  chan struct{} // cap 1: inflight reached zero while draining
	stats      counters

	// testHookReaderPaused, when set, runs each time a reader stops for
	// backpressure.
	testHookReaderPaused func()
}

type counters struct {
	connsAccepted, connsRejected, framesIn, framesOut, publishes, publishErrors atomic.Uint64
	// expiredUnsent counts DELIVERs dropped unwritten because their lease
	// ran out while they waited (replicated partitions only).
	expiredUnsent                                                   atomic.Uint64
	settles, requestErrors, fatalErrors, authFailures, readerPauses atomic.Uint64
	writerPauses, slowConsumers                                     atomic.Uint64
	publishConfirms                                                 atomic.Uint64
	permissionDenials                                               atomic.Uint64
	// Connections refused, by the limit that refused them.
	refusedConns, refusedPerAddr, refusedHandshakes atomic.Uint64
	handshakeTimeouts                               atomic.Uint64
}

// New validates cfg and returns a server that is not yet serving.
func New(cfg Config) (*Server, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	reg, err := session.NewRegistry(session.Config{
		Backend: cfg.Backend, OwnerID: cfg.OwnerID, Rand: cfg.Rand, ReconnectGraceMs: cfg.ReconnectGraceMs,
		ReconnectGraceMsLive: cfg.ReconnectGraceMsLive, AfterFunc: cfg.AfterFunc, Logger: cfg.Logger, PrefetchDefault: cfg.PrefetchDefault,
		PrefetchMax: cfg.PrefetchMax, SubscriptionsMax: cfg.SubscriptionsMax,
		DormantBytesMax: cfg.OutboundBytesMax, ResendBytesMax: cfg.ResendBytesMax, DormantSessionsMax: cfg.DormantSessionsMax,
		Store: cfg.SessionStore, RestartGraceMs: cfg.RestartGraceMs, Epochs: cfg.Cluster,
	})
	if err != nil {
		return nil, err
	}
	gen := cfg.Generation
	for gen == 0 {
		var b [8]byte
		if _, err := io.ReadFull(cfg.Rand, b[:]); err != nil {
			return nil, fmt.Errorf("server: draw generation: %w", err)
		}
		gen = binary.BigEndian.Uint64(b[:])
	}
	return &Server{
		cfg: cfg, reg: reg, generation: gen,
		conns: make(map[*conn]struct{}), perAddr: make(map[string]int), listeners: make(map[net.Listener]struct{}),
		drainWake: make(chan struct{}, 1),
	}, nil
}

// Generation returns the value announced in HELLO_OK.
func (s *Server) Generation() uint64 { return s.generation }

// Registry returns the session registry.
func (s *Server) Registry() *session.Registry { return s.reg }

// Serve accepts connections on ln until Shutdown or an accept error that is not
// temporary. It closes ln on return.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.listeners[ln] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, ln)
		s.mu.Unlock()
		ln.Close()
	}()
	// Whether anonymous peers may connect depends on the listener, not on
	// the address a peer reached: a loopback connection through a
	// listener bound to every interface is still on a public listener.
	loopback := auth.LoopbackAddr(ln.Addr())
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.isDraining() {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// Resource exhaustion (EMFILE and friends) surfaces here;
				// back off, bounded, instead of spinning.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		go s.serveConn(nc, loopback)
	}
}

// ServeConn runs the protocol on nc until it closes, and returns after the
// connection is fully torn down. Serve calls it for every accepted connection;
// tests call it directly with one end of a net.Pipe. For the anonymous-access
// rule the connection counts as on a loopback listener when its local
// address is loopback or not an IP address (auth.LoopbackAddr).
func (s *Server) ServeConn(nc net.Conn) {
	s.serveConn(nc, auth.LoopbackAddr(nc.LocalAddr()))
}

func (s *Server) serveConn(nc net.Conn, loopback bool) {
	id := s.nextConnID.Add(1)
	c := &conn{srv: s, id: id, nc: nc, readerWake: make(chan struct{}, 1), opened: time.Now(), loopback: loopback}
	c.log = s.cfg.Logger.With("conn_id", id, "remote", remoteAddr(nc))
	c.w = newWriter(c)

	key := connKey(nc)
	c.addrKey = key
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		s.reject(nc, protocol.CodeShuttingDown, "broker is draining")
		return
	}
	if msg := s.admitLocked(key); msg != "" {
		s.mu.Unlock()
		s.stats.connsRejected.Add(1)
		c.log.Debug("connection refused", "reason", msg)
		s.reject(nc, protocol.CodeTooManyConns, msg)
		return
	}
	s.conns[c] = struct{}{}
	if key != "" {
		s.perAddr[key]++
	}
	s.handshakes++
	c.handshaking = true
	s.connWG.Add(1)
	s.mu.Unlock()
	s.stats.connsAccepted.Add(1)
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		if key != "" {
			if s.perAddr[key]--; s.perAddr[key] <= 0 {
				delete(s.perAddr, key)
			}
		}
		if c.handshaking {
			s.handshakes--
		}
		s.mu.Unlock()
		s.connWG.Done()
	}()
	c.serve()
}

// admitLocked checks the connection limits for one more connection from
// key, counts a refusal by its limit, and returns why it is refused ("" to
// admit). The total comes first, so a full broker says so whoever asks.
func (s *Server) admitLocked(key string) string {
	switch {
	case len(s.conns) >= s.cfg.ConnectionsMax:
		s.stats.refusedConns.Add(1)
		return fmt.Sprintf("connection limit %d reached (limits.connections_max)", s.cfg.ConnectionsMax)
	case key != "" && s.perAddr[key] >= s.cfg.ConnectionsPerAddressMax:
		s.stats.refusedPerAddr.Add(1)
		return fmt.Sprintf("connection limit %d per source address reached (limits.connections_per_address_max)", s.cfg.ConnectionsPerAddressMax)
	case s.handshakes >= s.cfg.HandshakesMax:
		s.stats.refusedHandshakes.Add(1)
		return fmt.Sprintf("%d handshakes already in progress (limits.handshakes_max)", s.cfg.HandshakesMax)
	}
	return ""
}

// handshakeDone takes c out of the handshakes in progress once its HELLO
// succeeded. The reader calls it; teardown covers a handshake that failed.
func (s *Server) handshakeDone(c *conn) {
	s.mu.Lock()
	if c.handshaking {
		c.handshaking = false
		s.handshakes--
	}
	s.mu.Unlock()
}

// connKey is the source IP of nc, the key of the per-address limit, or ""
// when its remote address is not an IP (a net.Pipe in tests): such
// connections count only towards the total.
func connKey(nc net.Conn) string {
	a := nc.RemoteAddr()
	if a == nil {
		return ""
	}
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil || net.ParseIP(host) == nil {
		return ""
	}
	return host
}

func remoteAddr(nc net.Conn) string {
	if a := nc.RemoteAddr(); a != nil {
		return a.String()
	}
	return ""
}

// reject writes one fatal ERROR (bounded in time) and closes nc.
func (s *Server) reject(nc net.Conn, code protocol.Code, msg string) {
	defer nc.Close()
	// Both directions: on a TLS listener the write first runs the handshake,
	// which reads, and a refused peer that sends nothing must not hold the
	// goroutine (refused connections are in no count).
	nc.SetDeadline(time.Now().Add(rejectWriteTimeoutMs * time.Millisecond))
	nc.Write(protocol.AppendFrame(nil, 0, 0, &protocol.ErrorBody{Code: code, Message: msg, Fatal: true}))
}

func (s *Server) isDraining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining
}

func (s *Server) releaseInflight() {
	if s.inflight.Add(-1) == 0 {
		select {
		case s.drainWake <- struct{}{}:
		default:
		}
	}
}

// goingAwayGraceMs is how long a session stays resumable once the broker
// is back: the restart grace of the next process when sessions are persisted
// for it, and 0 when they are not. The reconnect grace does not apply: a
// draining broker ends every session at its disconnect.
func (s *Server) goingAwayGraceMs() int64 {
	if s.cfg.SessionStore == nil {
		return 0
	}
	if s.cfg.RestartGraceMsNext != nil {
		return min(max(s.cfg.RestartGraceMsNext(), 0), math.MaxUint32)
	}
	return min(max(s.cfg.RestartGraceMs, 0), math.MaxUint32)
}

// Shutdown drains the server in two phases.
//
// Phase 1 (settle): it stops accepting, sends GOING_AWAY (deadline: ctx's, or
// DrainTimeoutMsDefault from now) to every connection, refuses new publishes,
// subscriptions and queue changes (shutting_down), and leases nothing new to any
// subscription. Settles are still taken and confirms and settle results still
// sent, so work in flight finishes. The phase ends when nothing is in flight
// (no unconfirmed publish, no settle awaiting its result, no delivery held
// unsettled by a session) or when ctx is done, whichever comes first. A client
// that leaves on its own (as the SDK does once its work is done) takes its
// session's deliveries with it.
//
// Phase 2 (close): every connection's queued frames are flushed (bounded by
// drainFlushMs) before its socket closes, and every session is cleaned up. The
// socket is never closed before phase 1 ends. Shutdown returns ctx.Err() if
// phase 1 ran out of time.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	already := s.draining
	s.draining = true
	for ln := range s.listeners {
		ln.Close()
	}
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	// Before any session ends: what shutdown does to sessions from here on
	// is not recorded, so a restarted broker restores them and their leases.
	_ = s.reg.PersistForRestart()
	s.reg.Drain()

	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(DrainTimeoutMsDefault * time.Millisecond)
	}
	if !already {
		// Redirect names a cluster node that stays up; a single broker
		// knows no other endpoint and sends it empty.
		redirect := ""
		if s.cfg.Cluster && s.cfg.Redirect != nil {
			redirect = s.cfg.Redirect()
		}
		away := &protocol.GoingAway{DeadlineMs: deadline.UnixMilli(), GraceMs: uint32(s.goingAwayGraceMs()), Reason: "broker shutting down",
			Redirect: redirect}
		for _, c := range conns {
			c.w.Send(session.Outbound{Body: away})
		}
	}
	start := time.Now()
	s.cfg.Logger.Info("drain phase 1: GOING_AWAY sent; settling work in flight", "connections", len(conns),
		"inflight_publishes", s.inflight.Load(), "unsettled_deliveries", s.reg.Unsettled(), "deadline_ms", deadline.UnixMilli())

	var err error
	poll := time.NewTicker(drainPollMs * time.Millisecond)
	defer poll.Stop()
	for !s.quiescent() && err == nil {
		select {
		case <-s.drainWake:
		case <-poll.C:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	s.mu.Lock()
	open := len(s.conns)
	s.mu.Unlock()
	s.cfg.Logger.Info("drain phase 2: closing connections", "phase1_ms", time.Since(start).Milliseconds(), "timed_out", err != nil,
		"connections", open, "inflight_publishes", s.inflight.Load(), "unsettled_deliveries", s.reg.Unsettled())
	s.mu.Lock()
	for c := range s.conns {
		c.w.finish()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.connWG.Wait(); close(done) }()
	flush := time.NewTimer(drainFlushMs * time.Millisecond)
	defer flush.Stop()
	select {
	case <-done:
	case <-flush.C:
		s.mu.Lock()
		for c := range s.conns {
			c.w.abort()
		}
		s.mu.Unlock()
		<-done
	}
	s.reg.CloseAll()
	s.cfg.Logger.Info("drained", "took_ms", time.Since(start).Milliseconds(), "err", err)
	return err
}

// quiescent reports whether nothing is in flight: no publish awaits its
// confirm, no settle its result, and no session holds a delivery unsettled.
func (s *Server) quiescent() bool {
	if s.inflight.Load() > 0 {
		return false
	}
	s.mu.Lock()
	for c := range s.conns {
		if c.settleInflight.Load() > 0 {
			s.mu.Unlock()
			return false
		}
	}
	s.mu.Unlock()
	return s.reg.Unsettled() == 0
}

// Stats are the server's counters.
type Stats struct {
	ConnectionsOpen     int
	ConnectionsAccepted uint64
	ConnectionsRejected uint64 // refused by any connection limit; Refused says which
	Refused             Refusals
	FramesIn, FramesOut uint64
	Publishes           uint64
	PublishErrors       uint64
	PublishConfirms     uint64 // publishes stored durably (answered PUBLISH_OK, or would have been)
	PublishesInflight   int64
	Settles             uint64
	RequestErrors       uint64
	FatalErrors         uint64
	AuthFailures        uint64
	ReaderPauses        uint64
	WriterPauses        uint64 // times a connection's outbound queue reached OutboundBytesMax
	SlowConsumers       uint64 // connections closed with slow_consumer
	PermissionDenials   uint64 // requests answered permission_denied
	Sessions            session.Stats
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	open := len(s.conns)
	s.mu.Unlock()
	st := &s.stats
	return Stats{
		ConnectionsOpen: open, ConnectionsAccepted: st.connsAccepted.Load(), ConnectionsRejected: st.connsRejected.Load(),
		FramesIn: st.framesIn.Load(), FramesOut: st.framesOut.Load(), Publishes: st.publishes.Load(),
		PublishErrors: st.publishErrors.Load(), PublishConfirms: st.publishConfirms.Load(), PublishesInflight: s.inflight.Load(), Settles: st.settles.Load(),
		RequestErrors: st.requestErrors.Load(), FatalErrors: st.fatalErrors.Load(), AuthFailures: st.authFailures.Load(),
		ReaderPauses: st.readerPauses.Load(), WriterPauses: st.writerPauses.Load(), SlowConsumers: st.slowConsumers.Load(),
		PermissionDenials: st.permissionDenials.Load(),
		Sessions:          s.reg.Stats(),
		Refused: Refusals{
			Connections: st.refusedConns.Load(), ConnectionsPerAddress: st.refusedPerAddr.Load(),
			Handshakes: st.refusedHandshakes.Load(), HandshakeTimeouts: st.handshakeTimeouts.Load(),
		},
	}
}

// Refusals count the connections a limit refused or closed, by limit.
// Subscriptions refused at SubscriptionsMax are in Stats.Sessions.
type Refusals struct {
	Connections           uint64 // at ConnectionsMax
	ConnectionsPerAddress uint64 // at ConnectionsPerAddressMax
	Handshakes            uint64 // at HandshakesMax
	HandshakeTimeouts     uint64 // closed with handshake_timeout: no HELLO within HandshakeTimeoutMs
}
