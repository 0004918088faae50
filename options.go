package sinew

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/sinewmq/sinew/protocol"
)

// Option configures a Client at Dial.
type Option func(*options)

// Clock is the time source of the SDK: backoff sleeps, heartbeats and drain
// bounds all go through it, so tests can drive them with a fake clock. Socket
// deadlines, which the kernel enforces, use real time.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// After returns a channel that receives once d has elapsed.
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// afterFunc calls f on its own goroutine once d has elapsed on clock, unless
// the returned stop is called first. On the real clock it is a
// time.AfterFunc (no goroutine waits); on another clock (a test's) a
// goroutine waits on clock.After, whose timer is registered before
// afterFunc returns. stop may be called more than once.
func afterFunc(clock Clock, d time.Duration, f func()) (stop func()) {
	if _, real := clock.(realClock); real {
		t := time.AfterFunc(d, f)
		return func() { t.Stop() }
	}
	fire := clock.After(d)
	quit := make(chan struct{})
	var once sync.Once
	go func() {
		select {
		case <-fire:
			f()
		case <-quit:
		}
	}()
	return func() { once.Do(func() { close(quit) }) }
}

// ReconcilePolicy says what the broker does, on resume, with subscriptions the
// client holds but the broker does not.
type ReconcilePolicy uint8

const (
	// ReconcileConservative closes client-held subscriptions the broker no
	// longer has; they end with ErrReconciledClosed.
	ReconcileConservative ReconcilePolicy = ReconcilePolicy(protocol.ReconcileConservative)
	// ReconcileRestore asks the broker to recreate them (the default).
	ReconcileRestore ReconcilePolicy = ReconcilePolicy(protocol.ReconcileRestore)
)

// ReconnectPolicy shapes automatic reconnection. Zero fields take the defaults
// shown; the delay before attempt n (counting from 0) is
//
//	min(BaseDelay * Factor^n, MaxDelay) * (1 ± Jitter)
//
// and n returns to 0 once a connection has stayed healthy for ResetAfter.
type ReconnectPolicy struct {
	BaseDelay   time.Duration // 100 ms
	Factor      float64       // 2
	MaxDelay    time.Duration // 30 s
	Jitter      float64       // 0.1, a fraction of the delay, both ways
	ResetAfter  time.Duration // 10 s
	MaxAttempts int           // 0 = unlimited; otherwise give up (ErrDisconnected) after this many failures in a row
	// MaxOutage bounds a reconnect by time: 0 = unlimited; otherwise give up
	// (ErrDisconnected) once attempts have failed in a row for this long. A
	// count alone suits a steady backoff badly: after GOING_AWAY attempts come
	// every BaseDelay, so a count is spent long before a restart completes.
	MaxOutage time.Duration
}

// Defaults of ReconnectPolicy.
const (
	ReconnectBaseDelayDefault  = 100 * time.Millisecond
	ReconnectFactorDefault     = 2.0
	ReconnectMaxDelayDefault   = 30 * time.Second
	ReconnectJitterDefault     = 0.1
	ReconnectResetAfterDefault = 10 * time.Second
)

func (p ReconnectPolicy) withDefaults() ReconnectPolicy {
	if p.BaseDelay <= 0 {
		p.BaseDelay = ReconnectBaseDelayDefault
	}
	if p.Factor < 1 {
		p.Factor = ReconnectFactorDefault
	}
	if p.MaxDelay <= 0 {
		p.MaxDelay = ReconnectMaxDelayDefault
	}
	if p.Jitter <= 0 {
		p.Jitter = ReconnectJitterDefault
	}
	if p.Jitter > 1 {
		p.Jitter = 1
	}
	if p.ResetAfter <= 0 {
		p.ResetAfter = ReconnectResetAfterDefault
	}
	return p
}

// Delay returns the wait before reconnect attempt n (0-based), given r, a
// uniform random number in [0, 1) that places the jitter. It is exported so the
// policy can be inspected and tested without a connection.
func (p ReconnectPolicy) Delay(n int, r float64) time.Duration {
	p = p.withDefaults()
	d := float64(p.BaseDelay)
	for i := 0; i < n && d < float64(p.MaxDelay); i++ {
		d *= p.Factor
	}
	d = min(d, float64(p.MaxDelay))
	d *= 1 + p.Jitter*(2*r-1)
	return time.Duration(d)
}

// ConnectTimeoutDefault bounds Dial's first connect, all attempts and backoff
// sleeps together, unless WithConnectTimeout says otherwise. Dial's context can
// only shorten it.
const ConnectTimeoutDefault = 30 * time.Second

// Limits of the SDK itself.
const (
	// dialTimeoutDefault bounds one TCP (and TLS) connect.
	dialTimeoutDefault = 10 * time.Second
	// handshakeTimeoutDefault bounds the wait for HELLO_OK.
	handshakeTimeoutDefault = 10 * time.Second
	// drainTimeoutDefault bounds how long Close waits for pending confirms and
	// settles, and for unsubscribes.
	drainTimeoutDefault = 5 * time.Second
	// publishInflightDefault is the publish window when the broker announces none.
	publishInflightDefault = 1024
	// publishInflightBytesMax bounds the body bytes of unconfirmed publishes,
	// which the client keeps to send again after a reconnect.
	publishInflightBytesMax = 64 << 20
	// deliveryBufferMax bounds the messages buffered per subscription before the
	// connection's reader waits (pushing back on the broker through TCP).
	deliveryBufferMax = 4096
	// writeQueueMax bounds encoded frames waiting for the connection's writer.
	writeQueueMax = 1024
	// settleBatchDefault caps tags per settle frame when the broker announces none.
	settleBatchDefault = 256
	// writeBufferBytes is the size of the writer's buffer; frames pipeline into
	// it and are flushed together.
	writeBufferBytes = 64 << 10
	// writeYieldRoomBytes is the buffer room below which the writer flushes
	// without first yielding for more frames.
	writeYieldRoomBytes = 8 << 10
)

type options struct {
	clientName       string
	user             string
	credentials      string
	tls              *tls.Config
	reconnect        ReconnectPolicy
	reconcile        ReconcilePolicy
	heartbeat        time.Duration
	logger           *slog.Logger
	dialer           func(ctx context.Context, network, addr string) (net.Conn, error)
	clock            Clock
	rand             func() float64
	dialTimeout      time.Duration
	connectTimeout   time.Duration
	handshakeTimeout time.Duration
	drainTimeout     time.Duration
	producerID       string // "" until Dial picks a random one
	memberID         string // cohort member id; "" until Dial picks a random one
	seeds            []string
	// redirected, set by Dial, is told a GOING_AWAY's non-empty
	// redirect: the stopping node's address and the one to use.
	redirected func(addr, redirect string)
}

func defaultOptions() options {
	var d net.Dialer
	var mu sync.Mutex
	return options{
		clientName: "sinew-go",
		reconcile:  ReconcileRestore,
		logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		dialer:     d.DialContext,
		clock:      realClock{},
		rand: func() float64 {
			mu.Lock()
			defer mu.Unlock()
			return rand.Float64()
		},
		dialTimeout:      dialTimeoutDefault,
		connectTimeout:   ConnectTimeoutDefault,
		handshakeTimeout: handshakeTimeoutDefault,
		drainTimeout:     drainTimeoutDefault,
	}
}

// WithClientName sets the name the broker shows for this client in logs.
func WithClientName(name string) Option { return func(o *options) { o.clientName = name } }

// WithCredentials sets the static token (one of the broker's auth.tokens)
// sent in HELLO. It replaces a WithUser given earlier.
func WithCredentials(token string) Option {
	return func(o *options) { o.user, o.credentials = "", token }
}

// WithUser authenticates as a named user with a password. The password is
// sent in HELLO on every connect, so use WithTLS unless the broker is on
// loopback. It replaces a WithCredentials given earlier. A wrong name or
// password fails Dial with a non-retryable auth_failed (the broker waits a
// second before it answers).
func WithUser(name, password string) Option {
	return func(o *options) { o.user, o.credentials = name, password }
}

// WithTLS connects with TLS using cfg. When cfg.ServerName is empty, the host
// part of the address is used.
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// WithReconnect sets the reconnect policy.
func WithReconnect(p ReconnectPolicy) Option { return func(o *options) { o.reconnect = p } }

// WithReconcilePolicy sets the reconciliation policy used after a resume.
func WithReconcilePolicy(p ReconcilePolicy) Option { return func(o *options) { o.reconcile = p } }

// WithHeartbeat sets how often the client pings an idle connection. The
// broker's announced interval is used when it is shorter, or when d is zero.
// A connection on which nothing arrives for three intervals is treated as dead.
func WithHeartbeat(d time.Duration) Option { return func(o *options) { o.heartbeat = d } }

// WithLogger sets the logger for connection events: each failed connect
// attempt of Dial (Warn, with the reason), connection losses, reconnect
// attempts and resumes (Info), giving up and fatal errors (Warn, Error). By
// default nothing is logged. Payloads and credentials are never logged.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.logger = l
		}
	}
}

// WithDialer replaces the function that opens TCP connections (a test seam,
// also useful for custom networking).
func WithDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) Option {
	return func(o *options) {
		if dial != nil {
			o.dialer = dial
		}
	}
}

// WithClock replaces the clock (a test seam).
func WithClock(c Clock) Option {
	return func(o *options) {
		if c != nil {
			o.clock = c
		}
	}
}

// WithRand replaces the source of backoff jitter (a test seam). r must return
// numbers in [0, 1) and be safe for concurrent use.
func WithRand(r func() float64) Option {
	return func(o *options) {
		if r != nil {
			o.rand = r
		}
	}
}

// WithDialTimeout bounds one connect attempt, TCP and TLS (default 10 s).
func WithDialTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.dialTimeout = d
		}
	}
}

// WithConnectTimeout bounds Dial's first connect, every attempt and backoff
// sleep together (default ConnectTimeoutDefault). It does not bound later
// reconnects, which the ReconnectPolicy governs.
func WithConnectTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.connectTimeout = d
		}
	}
}

// WithProducerID sets the producer id the Client stamps on its confirmed
// publishes (see Client.Publish). By default every Client picks a random one,
// so its sequences never collide with another Client's. Set one only to make
// two Clients one producer on purpose, never two Clients publishing at the
// same time: each Client numbers its sequences from 1, and a broker that
// still remembers the id would answer the second Client's publishes as
// duplicates of the first's. At most 255 bytes.
func WithProducerID(id string) Option { return func(o *options) { o.producerID = id } }

// WithDrainTimeout bounds how long Close waits for pending confirms and
// settles (default 5 s).
func WithDrainTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.drainTimeout = d
		}
	}
}
