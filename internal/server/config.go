package server

import (
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/sinewmq/sinew/internal/auth"
	"github.com/sinewmq/sinew/internal/session"
	"github.com/sinewmq/sinew/internal/sessionstore"
	"github.com/sinewmq/sinew/protocol"
)

// Defaults for Config fields left zero.
const (
	FrameBytesMaxDefault      = 1<<20 + 64<<10 // a 1 MiB body plus room for headers
	BodyBytesMaxDefault       = 1 << 20
	SettleBatchMaxDefault     = 4096
	PublishInflightMaxDefault = 4096
	ConnectionsMaxDefault     = 10_000
	// ConnectionsPerAddressMaxDefault bounds the connections from one source
	// IP, so one host cannot take every slot of ConnectionsMax.
	ConnectionsPerAddressMaxDefault = 1000
	// HandshakesMaxDefault bounds the connections that have not finished
	// their HELLO, so peers that connect and stall (or guess credentials)
	// cannot crowd out the handshakes of well-behaved clients.
	HandshakesMaxDefault      = 1000
	HandshakeTimeoutMsDefault = 10_000
	HeartbeatMsDefault        = 10_000
	WriteTimeoutMsDefault     = 30_000
	DrainTimeoutMsDefault     = 10_000
	DeclareTimeoutMsDefault   = 10_000
	// AuthFailureDelayMsDefault slows password guessing to one try per
	// second per connection.
	AuthFailureDelayMsDefault = 1000
	// OutboundBytesMaxDefault bounds what one connection has queued for
	// writing; it also bounds a dormant session's buffer.
	OutboundBytesMaxDefault = 1 << 20
	// SlowConsumerTimeoutMsDefault is how long a connection may stay at its
	// outbound byte cap before it is closed as a slow consumer.
	SlowConsumerTimeoutMsDefault = 30_000
	// LeaseMsMaxDefault bounds an EXTEND's extend_ms: 12 hours.
	LeaseMsMaxDefault = 12 * 3600 * 1000
	// leaseMsMaxMax bounds LeaseMsMax: a week, a queue's longest lease.
	leaseMsMaxMax = 7 * 24 * 3600 * 1000
)

// Internal bounds.
const (
	// readerQueueFramesMax is the write-queue length at which the reader stops
	// reading new requests until the writer catches up.
	readerQueueFramesMax = 1024
	// settleInflightMax bounds settle requests awaiting their result per connection.
	settleInflightMax = 1024
	// writeBatchBytes is the most the writer encodes before one write syscall.
	writeBatchBytes = 256 << 10
	// readBufferBytes is the reader's bufio size.
	readBufferBytes = 64 << 10
	// heartbeatMissesMax is how many heartbeat intervals of silence close a connection.
	heartbeatMissesMax = 3
	// rejectWriteTimeoutMs bounds the ERROR written to a connection over the limit.
	rejectWriteTimeoutMs = 1000
	// drainPollMs is how often a drain's first phase looks whether the
	// deliveries held unsettled have all been settled (confirms wake it at once).
	drainPollMs = 20
	// drainFlushMs bounds the flush of queued frames when a drain closes the
	// connections; a peer that does not read by then is cut.
	drainFlushMs = 2000
)

// Config configures a Server.
type Config struct {
	// Cluster marks a cluster node: its replicated partitions issue
	// deliveries with non-zero epochs (raft terms), which lease references
	// may then name.
	Cluster bool
	// Redirect, on a cluster node, names the client address of a node
	// that stays up, for GOING_AWAY's redirect field; Shutdown calls it
	// once. Nil, or "" from it, sends the field empty (a single broker).
	Redirect func() string
	// Backend is the broker. Required.
	Backend session.Backend
	// OwnerID identifies this broker in resume identities; it must be stable across
	// restarts. Required.
	OwnerID string
	// Rand draws client ids, resume tokens and the server generation
	// (crypto/rand.Reader in production). Required.
	Rand io.Reader
	// Generation is announced in HELLO_OK; 0 draws one from Rand.
	Generation uint64
	// ServerVersion is announced in HELLO_OK.
	ServerVersion string
	// Logger receives connection and session records; default discards.
	Logger *slog.Logger
	// AuthTokens are the static tokens a HELLO may carry as its credentials
	// (each gives every permission). Any token or user makes
	// authentication required (see AllowAnonymous).
	AuthTokens []string
	// Users is the users store a HELLO with a user name is checked against;
	// nil means no users.
	Users *auth.Users
	// AllowAnonymous accepts a HELLO without credentials on every listener,
	// even when users or tokens exist. Without it, such a HELLO is accepted
	// only on a loopback listener of a broker with no users and no tokens
	// (auth.AnonymousAllowed).
	AllowAnonymous bool
	// AuthFailureDelayMs is how long a refused HELLO waits before its
	// auth_failed, the same for every reason; 0 means
	// AuthFailureDelayMsDefault, <0 none.
	AuthFailureDelayMs int64
	// SessionStore, when set, records sessions for a restart (see
	// session.Config.Store); Shutdown persists them before it closes any
	// connection.
	SessionStore *sessionstore.Store
	// RestartGraceMs is how long the sessions restored from SessionStore
	// wait for their clients after New (see session.Config.RestartGraceMs).
	RestartGraceMs int64
	// RestartGraceMsNext, when set, says how long the next process will keep
	// the sessions Shutdown persists, for GOING_AWAY to announce (sinew
	// serve passes the runtime setting connection.restart_grace_ms as it
	// stands at the drain, which is what the next process reads at
	// startup). Nil announces RestartGraceMs.
	RestartGraceMsNext func() int64

	FrameBytesMax   int    // largest frame either side may send
	BodyBytesMax    int    // largest message body
	PrefetchDefault uint32 // prefetch of a SUBSCRIBE that asks for 0
	PrefetchMax     uint32 // largest prefetch per subscription
	SettleBatchMax  int    // most tags in one ACK/NACK/FAIL/EXTEND
	// LeaseMsMax bounds an EXTEND's extend_ms (queue.lease_ms_max); one
	// outside 1..LeaseMsMax is bad_request. 0 means LeaseMsMaxDefault.
	LeaseMsMax         int64
	PublishInflightMax int // unconfirmed publishes per connection before the reader pauses
	SubscriptionsMax   int // subscriptions per session
	ConnectionsMax     int // open connections; more get too_many_connections
	// ConnectionsPerAddressMax bounds the open connections from one source
	// IP address (TCP and TLS connections; a connection whose remote address
	// is not an IP, such as a net.Pipe, is not counted per address). More
	// get too_many_connections.
	ConnectionsPerAddressMax int
	// HandshakesMax bounds the connections accepted whose HELLO has not
	// succeeded yet; each is also bounded in time by HandshakeTimeoutMs. One
	// more gets too_many_connections and is closed at once.
	HandshakesMax int
	// OutboundBytesMax bounds, in session.Outbound.Bytes, the frames queued
	// for one connection's socket; at the bound its deliveries pause. It also
	// bounds a dormant session's buffer.
	OutboundBytesMax int64
	// ResendBytesMax bounds what a session keeps for re-sending unsettled
	// deliveries after a resume (session.Config.ResendBytesMax).
	ResendBytesMax int64
	// DormantSessionsMax bounds the sessions waiting out their grace
	// (session.Config.DormantSessionsMax).
	DormantSessionsMax int

	HandshakeTimeoutMs int64 // HELLO must arrive within this
	HeartbeatMs        int64 // idle interval before PING; 3x silence closes; <0 disables
	WriteTimeoutMs     int64 // a write that makes no progress this long closes the connection
	ReconnectGraceMs   int64 // how long a dropped session stays resumable
	// ReconnectGraceMsLive, when set, replaces ReconnectGraceMs with a live
	// value read at each disconnect and HELLO_OK (sinew serve
	// passes the runtime setting connection.reconnect_grace_ms).
	ReconnectGraceMsLive func() int64
	DeclareTimeoutMs     int64 // bound on one DECLARE_QUEUE
	// SlowConsumerTimeoutMs: a connection whose queue stays at
	// OutboundBytesMax this long is closed with slow_consumer.
	SlowConsumerTimeoutMs int64

	// AfterFunc runs session grace timers; default session.RealAfterFunc.
	AfterFunc session.AfterFunc
}

func (c *Config) fill() error {
	if c.Backend == nil {
		return errors.New("server: Config.Backend is required")
	}
	if c.Rand == nil {
		return errors.New("server: Config.Rand is required")
	}
	if c.OwnerID == "" {
		return errors.New("server: Config.OwnerID is required")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def64 := func(v *int64, d int64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.FrameBytesMax, FrameBytesMaxDefault)
	def(&c.BodyBytesMax, BodyBytesMaxDefault)
	def(&c.SettleBatchMax, SettleBatchMaxDefault)
	def(&c.PublishInflightMax, PublishInflightMaxDefault)
	def(&c.SubscriptionsMax, session.SubscriptionsMaxDefault)
	def(&c.ConnectionsMax, ConnectionsMaxDefault)
	def(&c.ConnectionsPerAddressMax, ConnectionsPerAddressMaxDefault)
	def(&c.HandshakesMax, HandshakesMaxDefault)
	def64(&c.HandshakeTimeoutMs, HandshakeTimeoutMsDefault)
	def64(&c.HeartbeatMs, HeartbeatMsDefault)
	def64(&c.WriteTimeoutMs, WriteTimeoutMsDefault)
	def64(&c.DeclareTimeoutMs, DeclareTimeoutMsDefault)
	def64(&c.AuthFailureDelayMs, AuthFailureDelayMsDefault)
	def64(&c.SlowConsumerTimeoutMs, SlowConsumerTimeoutMsDefault)
	def64(&c.OutboundBytesMax, OutboundBytesMaxDefault)
	def64(&c.LeaseMsMax, LeaseMsMaxDefault)
	if c.PrefetchMax == 0 {
		c.PrefetchMax = session.PrefetchMaxDefault
	}
	if c.PrefetchDefault == 0 {
		c.PrefetchDefault = min(session.PrefetchDefaultDefault, c.PrefetchMax)
	}
	switch {
	case c.FrameBytesMax < protocol.FrameBytesMin:
		return fmt.Errorf("server: FrameBytesMax %d below the protocol minimum %d", c.FrameBytesMax, protocol.FrameBytesMin)
	case c.BodyBytesMax >= c.FrameBytesMax:
		return fmt.Errorf("server: BodyBytesMax %d must be below FrameBytesMax %d", c.BodyBytesMax, c.FrameBytesMax)
	case c.SettleBatchMax > 1<<16:
		return fmt.Errorf("server: SettleBatchMax %d above the decoder's list limit %d", c.SettleBatchMax, 1<<16)
	case c.LeaseMsMax < 1 || c.LeaseMsMax > leaseMsMaxMax:
		return fmt.Errorf("server: LeaseMsMax %d out of range 1..%d", c.LeaseMsMax, int64(leaseMsMaxMax))
	case c.HandshakeTimeoutMs < 0:
		return fmt.Errorf("server: HandshakeTimeoutMs %d is negative", c.HandshakeTimeoutMs)
	case c.OutboundBytesMax < 0:
		return fmt.Errorf("server: OutboundBytesMax %d is negative", c.OutboundBytesMax)
	case c.SlowConsumerTimeoutMs < 0:
		return fmt.Errorf("server: SlowConsumerTimeoutMs %d is negative", c.SlowConsumerTimeoutMs)
	case c.WriteTimeoutMs < 0:
		return fmt.Errorf("server: WriteTimeoutMs %d is negative", c.WriteTimeoutMs)
	case c.ReconnectGraceMs < 0 || c.ReconnectGraceMs > 1<<31:
		return fmt.Errorf("server: ReconnectGraceMs %d out of range", c.ReconnectGraceMs)
	case c.HeartbeatMs > 1<<31:
		return fmt.Errorf("server: HeartbeatMs %d out of range", c.HeartbeatMs)
	}
	return nil
}

func (c *Config) limits() protocol.Limits {
	return protocol.Limits{
		FrameBytesMax: uint32(c.FrameBytesMax), BodyBytesMax: uint32(c.BodyBytesMax), PrefetchMax: c.PrefetchMax,
		SettleBatchMax: uint32(c.SettleBatchMax), PublishInflightMax: uint32(c.PublishInflightMax),
		SubscriptionsMax: uint32(c.SubscriptionsMax),
	}
}
