package session

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sinewmq/sinew/internal/sessionstore"
	"github.com/sinewmq/sinew/protocol"
)

// Defaults for Config fields left zero.
const (
	// PrefetchDefaultDefault is the prefetch of a subscription that asks for 0.
	PrefetchDefaultDefault = 100
	// PrefetchMaxDefault is the largest prefetch a subscription may get.
	PrefetchMaxDefault = 10_000
	// SubscriptionsMaxDefault bounds the subscriptions of one session.
	SubscriptionsMaxDefault = 256
	// DormantBytesMaxDefault bounds the bytes of pushes a session without a
	// connection buffers for its next one.
	DormantBytesMaxDefault = 1 << 20
	// ResendBytesMaxDefault bounds the bytes of unsettled deliveries a session
	// keeps for re-sending after a resume.
	ResendBytesMaxDefault = 1 << 20
	// DormantSessionsMaxDefault bounds the sessions waiting out their grace.
	DormantSessionsMaxDefault = 10_000
	// SettleMemoryMaxDefault bounds each of a session's tables of recently
	// settled and recently ended leases.
	SettleMemoryMaxDefault = 1024
	// ClosedSubscriptionsMaxDefault bounds the closed subscriptions the
	// registry remembers for settles that name a lease by reference.
	ClosedSubscriptionsMaxDefault = 4096
	// pendingSlackFrames is the "small constant" on top of the summed prefetch that
	// bounds a dormant session's buffer: one SUB_CLOSED per subscription fits in it
	// together with the subscription count, so this only covers races.
	pendingSlackFrames = 64
	// tokenBytes is the size of a resume token.
	tokenBytes = 32
	// clientIDBytes is the number of random bytes in a client id.
	clientIDBytes = 8
	// idAttemptsMax bounds retries when a freshly drawn client id collides.
	idAttemptsMax = 8
)

// AfterFunc schedules f after d and returns a function that cancels it (reporting
// whether it did). time.AfterFunc fits through a small adapter; tests inject fakes.
type AfterFunc func(d time.Duration, f func()) (stop func() bool)

// RealAfterFunc is the AfterFunc backed by the process clock.
func RealAfterFunc(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop }

// Config configures a Registry.
type Config struct {
	// Backend is the broker that sessions subscribe and settle through.
	Backend Backend
	// OwnerID identifies the broker that issues identities. It must stay the same
	// across restarts of the same broker so that a stale identity is recognised as
	// not found rather than foreign.
	OwnerID string
	// Rand is the source of client ids and resume tokens (crypto/rand.Reader in
	// production).
	Rand io.Reader
	// ReconnectGraceMs is how long a dropped session stays resumable; 0 cleans up
	// at once.
	ReconnectGraceMs int64
	// ReconnectGraceMsLive, when set, replaces ReconnectGraceMs: it is called
	// at each disconnect (and by Registry.ReconnectGraceMs), so a change of the
	// runtime setting applies to later disconnects, never to sessions already
	// dormant. A negative result counts as 0.
	ReconnectGraceMsLive func() int64
	// AfterFunc runs the grace timer; default RealAfterFunc.
	AfterFunc AfterFunc
	// Now reads the clock for the grace deadlines that Sessions reports;
	// default time.Now. It only informs operators: AfterFunc ends grace.
	Now func() time.Time
	// Logger receives session lifecycle records; default discards.
	Logger *slog.Logger
	// PrefetchDefault is used when a SUBSCRIBE asks for 0 (default 100).
	PrefetchDefault uint32
	// PrefetchMax clamps requested prefetch (default 10000).
	PrefetchMax uint32
	// SubscriptionsMax bounds subscriptions per session (default 256).
	SubscriptionsMax int
	// Epochs: deliveries may carry non-zero epochs (a cluster node's
	// replicated partitions), so lease references naming one are judged;
	// without it such a reference names no delivery of this broker.
	Epochs bool
	// DormantBytesMax bounds, in Outbound.Bytes, the pushes a dormant session
	// buffers; at the bound its subscriptions are paused until a resume. It
	// bounds the same way the deliveries a subscription holds before its
	// SUBSCRIBE_OK is sent (default DormantBytesMaxDefault).
	DormantBytesMax int64
	// ResendBytesMax bounds, in Outbound.Bytes, the unsettled manual-ack
	// deliveries a session keeps for re-sending after a resume; deliveries
	// beyond it are not re-sent, and come back by lease expiry instead
	// (default ResendBytesMaxDefault).
	ResendBytesMax int64
	// DormantSessionsMax bounds the sessions waiting out their grace; a
	// disconnect beyond it cleans the session up at once, so a later resume
	// gets resume_not_found (default DormantSessionsMaxDefault).
	DormantSessionsMax int
	// SettleMemoryMax bounds, in entries, each of a session's two tables of
	// leases it no longer holds: those it settled (so a repeated settle gets
	// its original outcome) and those that ended without a settle (so a late
	// ACK or FAIL still reaches the broker). Default SettleMemoryMaxDefault.
	SettleMemoryMax int
	// ClosedSubscriptionsMax bounds the closed subscriptions remembered so a
	// settle naming a lease only by reference (after the session that got it
	// ended) can still reach its queue. Default ClosedSubscriptionsMaxDefault.
	ClosedSubscriptionsMax int
	// RestartGraceMs is how long, after NewRegistry, the sessions restored
	// from Store wait for their clients (see restore.go); 0 restores none.
	// sinew serve passes the runtime setting connection.restart_grace_ms
	// as it stands at startup.
	RestartGraceMs int64
	// Store, when set, is where sessions are recorded for a restart: each
	// session's creation, its subscriptions opened and closed, and its end
	// (see package sessionstore). Nil keeps sessions in memory only.
	Store *sessionstore.Store
}

// Stats are the registry's counters since it started.
type Stats struct {
	Sessions       int    // live sessions, attached or dormant
	Dormant        int    // sessions waiting out their grace
	Issued         uint64 // identities issued
	Resumed        uint64 // resumes accepted
	ResumeRejected uint64 // resumes refused (wrong token or owner)
	ResumeNotFound uint64 // resumes of unknown or expired identities
	GraceExpired   uint64 // dormant sessions cleaned up by their timer
	Requeued       uint64 // leases given back by session cleanup
	PendingDropped uint64 // pushes dropped because a dormant buffer was full
	Resent         uint64 // unsettled deliveries sent again after a resume
	DormantCapped  uint64 // disconnects cleaned up at once because DormantSessionsMax sessions were dormant
	DormantPaused  uint64 // times a dormant session's buffer reached DormantBytesMax and paused its subscriptions
	ResendUnkept   uint64 // deliveries not kept for re-send because ResendBytesMax was reached
	// SubscriptionsRefused counts SUBSCRIBEs refused with limit_exceeded
	// because the session had SubscriptionsMax subscriptions.
	SubscriptionsRefused uint64

	GraceEntered  uint64 // disconnects that left the session dormant for its grace
	GraceRequeued uint64 // leases given back because a session's grace expired
	SessionsEnded uint64 // sessions ended at once by the client (END_SESSION)
	// Restart restore (see restore.go): sessions restored from the store
	// at startup, leases they took back, restored sessions resumed by
	// their clients, restored sessions cleaned up when the window ended,
	// and the leases those released.
	Restored            uint64
	LeasesReclaimed     uint64
	ResumedAfterRestart uint64
	RestartExpired      uint64
	RestartReleased     uint64
	// StoreErrors counts session store writes that failed; the session
	// goes on, but a restart may not restore it as it is.
	StoreErrors uint64

	// Reconciliation decisions (RECONCILE_RESULT entries), by action.
	ReconcileKeep        uint64
	ReconcileCloseClient uint64
	ReconcileCloseServer uint64
	ReconcileRecreate    uint64

	// Late settles: settles of a delivery made before the session's latest
	// resume, of a lease that ended without a settle, or named only by its
	// lease reference. Accepted ones were applied (or, for a NACK of a
	// message already back in the queue, answered ok); rejected ones are
	// counted by the code they got.
	LateSettleAccepted   uint64
	LateSettleStale      uint64 // rejected: stale_lease
	LateSettleUnknownTag uint64 // rejected: unknown_tag
	LateSettleOther      uint64 // failed with another code (unavailable, bad_request ...)
	// SettleRepeated counts settles answered from the session's table of
	// recent outcomes: the same settle of the same lease sent again.
	SettleRepeated uint64

	// Inflight reconciliation (INFLIGHT_RESULT), by action, in deliveries.
	InflightResent uint64
	InflightStale  uint64
	InflightKept   uint64
}

// Registry issues session identities and finds them again on resume.
type Registry struct {
	cfg Config
	log *slog.Logger
	// members holds the cohort member ids in use (cohort.go).
	members members

	mu       sync.Mutex
	sessions map[string]*Session
	draining atomic.Bool // written under mu; read without it by isDraining
	// persisted is set by PersistForRestart: from then on only a client's
	// own END_SESSION or UNSUBSCRIBE changes the store, and the cleanup of
	// shutdown leaves subscriptions (and so their leases) in place for
	// the restart.
	persisted atomic.Bool
	// windowOpen is set while restored sessions wait for their clients;
	// windowStop cancels its timer. Both under mu.
	windowOpen bool
	windowStop func() bool

	// subsMu guards subs and closedSubs. It is a leaf: taken under
	// Session.mu, never the other way round.
	subsMu     sync.Mutex
	subs       map[uint64]subOwner
	closedSubs []uint64 // closed subscriptions still in subs, oldest first

	dormant                                         atomic.Int64
	issued, resumed, rejected, notFound, graceFired atomic.Uint64
	requeued, pendingDropped, resent                atomic.Uint64
	dormantCapped, dormantPaused, resendUnkept      atomic.Uint64
	graceEntered, graceRequeued, ended              atomic.Uint64
	recKeep, recCloseClient, recCloseServer, recNew atomic.Uint64
	lateOK, lateStale, lateUnknown, lateOther       atomic.Uint64
	settleRepeated, storeErrors                     atomic.Uint64
	// epochs is set once a delivery carried a non-zero epoch (a replicated
	// partition): lease references naming an epoch are judged from then on.
	epochs                                      atomic.Bool
	restored, reclaimed, resumedAfterRestart    atomic.Uint64
	restartExpired, restartReleased             atomic.Uint64
	inflightResent, inflightStale, inflightKept atomic.Uint64
	subsRefused                                 atomic.Uint64
}

// NewRegistry returns an empty registry.
func NewRegistry(cfg Config) (*Registry, error) {
	if cfg.Backend == nil {
		return nil, errors.New("session: Config.Backend is required")
	}
	if cfg.Rand == nil {
		return nil, errors.New("session: Config.Rand is required")
	}
	if cfg.OwnerID == "" {
		return nil, errors.New("session: Config.OwnerID is required")
	}
	if cfg.ReconnectGraceMs < 0 {
		return nil, fmt.Errorf("session: ReconnectGraceMs %d is negative", cfg.ReconnectGraceMs)
	}
	if cfg.AfterFunc == nil {
		cfg.AfterFunc = RealAfterFunc
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.PrefetchMax == 0 {
		cfg.PrefetchMax = PrefetchMaxDefault
	}
	if cfg.PrefetchDefault == 0 {
		cfg.PrefetchDefault = min(PrefetchDefaultDefault, cfg.PrefetchMax)
	}
	if cfg.SubscriptionsMax <= 0 {
		cfg.SubscriptionsMax = SubscriptionsMaxDefault
	}
	if cfg.DormantBytesMax <= 0 {
		cfg.DormantBytesMax = DormantBytesMaxDefault
	}
	if cfg.ResendBytesMax <= 0 {
		cfg.ResendBytesMax = ResendBytesMaxDefault
	}
	if cfg.DormantSessionsMax <= 0 {
		cfg.DormantSessionsMax = DormantSessionsMaxDefault
	}
	if cfg.SettleMemoryMax <= 0 {
		cfg.SettleMemoryMax = SettleMemoryMaxDefault
	}
	if cfg.ClosedSubscriptionsMax <= 0 {
		cfg.ClosedSubscriptionsMax = ClosedSubscriptionsMaxDefault
	}
	r := &Registry{cfg: cfg, log: cfg.Logger, sessions: make(map[string]*Session), subs: make(map[uint64]subOwner)}
	if cfg.Store != nil {
		r.restore()
	}
	return r, nil
}

// OwnerID returns the owner id that this registry issues identities under.
func (r *Registry) OwnerID() string { return r.cfg.OwnerID }

// ReconnectGraceMs returns the grace a disconnect now would get.
func (r *Registry) ReconnectGraceMs() int64 {
	if r.cfg.ReconnectGraceMsLive != nil {
		return max(r.cfg.ReconnectGraceMsLive(), 0)
	}
	return r.cfg.ReconnectGraceMs
}

// Stats returns the registry's counters.
func (r *Registry) Stats() Stats {
	r.mu.Lock()
	n := len(r.sessions)
	r.mu.Unlock()
	return Stats{
		Sessions: n, Dormant: int(r.dormant.Load()),
		Issued: r.issued.Load(), Resumed: r.resumed.Load(), ResumeRejected: r.rejected.Load(),
		SubscriptionsRefused: r.subsRefused.Load(),
		ResumeNotFound:       r.notFound.Load(), GraceExpired: r.graceFired.Load(), Requeued: r.requeued.Load(),
		PendingDropped: r.pendingDropped.Load(), Resent: r.resent.Load(),
		DormantCapped: r.dormantCapped.Load(), DormantPaused: r.dormantPaused.Load(), ResendUnkept: r.resendUnkept.Load(),
		GraceEntered: r.graceEntered.Load(), GraceRequeued: r.graceRequeued.Load(), SessionsEnded: r.ended.Load(),
		ReconcileKeep: r.recKeep.Load(), ReconcileCloseClient: r.recCloseClient.Load(),
		ReconcileCloseServer: r.recCloseServer.Load(), ReconcileRecreate: r.recNew.Load(),
		LateSettleAccepted: r.lateOK.Load(), LateSettleStale: r.lateStale.Load(),
		LateSettleUnknownTag: r.lateUnknown.Load(), LateSettleOther: r.lateOther.Load(), SettleRepeated: r.settleRepeated.Load(),
		InflightResent: r.inflightResent.Load(), InflightStale: r.inflightStale.Load(), InflightKept: r.inflightKept.Load(),
		StoreErrors: r.storeErrors.Load(),
		Restored:    r.restored.Load(), LeasesReclaimed: r.reclaimed.Load(), ResumedAfterRestart: r.resumedAfterRestart.Load(),
		RestartExpired: r.restartExpired.Load(), RestartReleased: r.restartReleased.Load(),
	}
}

// Hello builds the first frame of a connection (HELLO_OK) from the identity and
// outcome Open settled on. Open sends it through the sink before anything the
// session had buffered.
type Hello func(id protocol.ResumeIdentity, outcome protocol.ResumeOutcome) Outbound

// ErrDraining is returned by Open while the registry is draining.
var ErrDraining = protocol.Errorf(protocol.CodeShuttingDown, "broker is draining")

// Open attaches sink to a session: the one named by offer when offer is valid,
// that session is still alive and principal owns it, a fresh one owned by
// principal otherwise. principal is the connection's authenticated identity
// (auth.Principal.Owner); a resume by a different one is resume_rejected, so a
// stolen resume token is useless without its owner's credentials. hello builds
// the HELLO_OK that is sent first. connID only labels log records.
func (r *Registry) Open(offer protocol.ResumeIdentity, principal string, sink Sink, connID uint64, hello Hello) (*Session, protocol.ResumeOutcome, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.draining.Load() {
		return nil, 0, ErrDraining
	}
	outcome := protocol.ResumeNew
	if offer.ClientID != "" || offer.OwnerID != "" || len(offer.Token) > 0 {
		var reason string
		s := r.sessions[offer.ClientID]
		switch {
		case offer.OwnerID != r.cfg.OwnerID:
			outcome, reason = protocol.ResumeRejected, "owner mismatch"
		case s == nil:
			outcome, reason = protocol.ResumeNotFound, "unknown or expired client id"
		case s.restored && !s.restoredTokenOK(offer.Token):
			outcome, reason = protocol.ResumeRejected, "token mismatch"
		case !s.restored && subtle.ConstantTimeCompare(offer.Token, s.token) != 1:
			outcome, reason = protocol.ResumeRejected, "token mismatch"
		case s.principal != "" && s.principal != principal:
			// The token is right but the peer is not the session's
			// owner: it stays the owner's, and this peer gets its own.
			outcome, reason = protocol.ResumeRejected, "another principal's session"
		default:
			restored := s.restored
			if restored {
				// The store kept only the token's hash; the client just
				// proved it holds the token.
				s.token = append([]byte(nil), offer.Token...)
				s.restored = false
			}
			if s.attach(sink, connID, hello, protocol.ResumeResumed) {
				r.resumed.Add(1)
				if restored {
					r.resumedAfterRestart.Add(1)
					r.log.Info("session resumed after restart", "client_id", s.clientID, "conn_id", connID)
				}
				return s, protocol.ResumeResumed, nil
			}
			outcome, reason = protocol.ResumeNotFound, "session closed"
		}
		if outcome == protocol.ResumeRejected {
			r.rejected.Add(1)
			r.log.Warn("resume rejected", "client_id", offer.ClientID, "conn_id", connID, "reason", reason)
		} else {
			r.notFound.Add(1)
			r.log.Info("resume not found", "client_id", offer.ClientID, "conn_id", connID, "reason", reason)
		}
	}
	s, err := r.newSessionLocked(principal)
	if err != nil {
		return nil, 0, err
	}
	s.attach(sink, connID, hello, outcome)
	r.issued.Add(1)
	r.log.Info("session identity issued", "client_id", s.clientID, "conn_id", connID, "outcome", outcome.String())
	return s, outcome, nil
}

// newSessionLocked draws a fresh identity, owned by principal, and registers
// it.
func (r *Registry) newSessionLocked(principal string) (*Session, error) {
	for range idAttemptsMax {
		var raw [clientIDBytes + tokenBytes]byte
		if _, err := io.ReadFull(r.cfg.Rand, raw[:]); err != nil {
			return nil, fmt.Errorf("session: draw identity: %w", err)
		}
		id := "c-" + hex.EncodeToString(raw[:clientIDBytes])
		if _, taken := r.sessions[id]; taken {
			continue
		}
		s := newSession(r, id, append([]byte(nil), raw[clientIDBytes:]...))
		s.principal = principal
		r.sessions[id] = s
		if st := r.cfg.Store; st != nil {
			// Only the token's hash is stored: the file never holds
			// what a resume needs to present.
			r.storeErr(st.Create(id, r.cfg.OwnerID, principal, sha256.Sum256(s.token)), "create", id)
		}
		return s, nil
	}
	return nil, errors.New("session: could not draw an unused client id")
}

// storeErr counts and logs a failed session store write.
func (r *Registry) storeErr(err error, op, clientID string) {
	if err == nil {
		return
	}
	r.storeErrors.Add(1)
	r.log.Warn("session store write failed; a restart may not restore this session as it is", "op", op, "client_id", clientID, "err", err)
}

// PersistForRestart prepares the registry for a planned restart: every
// session record becomes durable and the store writes a checkpoint (see
// sessionstore.Store.Persist). From then on the cleanup of sessions that
// shutdown causes (drain, disconnects, CloseAll) neither records their end
// nor closes their subscriptions, so their leases stay in the partition
// logs under their stable owners and a restarted broker restores them; only
// a client's own END_SESSION or UNSUBSCRIBE is still recorded. Call it
// before the connections close (phase 2 of a drain, or at shutdown); it is
// idempotent. Without a store it does nothing: nothing could be restored,
// so shutdown hands every lease back as before.
func (r *Registry) PersistForRestart() error {
	if r.cfg.Store == nil {
		return nil
	}
	r.persisted.Store(true)
	err := r.cfg.Store.Persist()
	if err != nil {
		r.storeErrors.Add(1)
		r.log.Error("session store persist failed; sessions may not be restored after the restart", "err", err)
		return err
	}
	r.log.Info("sessions persisted for restart", "sessions", r.cfg.Store.Len())
	return nil
}

// remove forgets s (called by its cleanup).
func (r *Registry) remove(s *Session) {
	r.mu.Lock()
	if r.sessions[s.clientID] == s {
		delete(r.sessions, s.clientID)
	}
	r.mu.Unlock()
}

// Drain stops issuing and resuming sessions and makes every later disconnect clean
// up at once, whatever the grace. Sessions that are dormant now are cleaned up.
// From here no subscription has room (see Pauser), so a backend that honours
// it leases nothing new; settles of what was leased before are still taken.
func (r *Registry) Drain() {
	r.mu.Lock()
	r.draining.Store(true)
	var dormant []*Session
	for _, s := range r.sessions {
		dormant = append(dormant, s)
	}
	r.mu.Unlock()
	for _, s := range dormant {
		s.cleanupIfDormant("drain")
	}
}

// Unsettled returns how many deliveries the sessions hold unsettled, auto-ack
// deliveries not yet written included. A drain waits for it to reach zero
// before it closes connections, so that a consumer's acks of what it already
// has are not cut off.
func (r *Registry) Unsettled() int {
	r.mu.Lock()
	all := make([]*Session, 0, len(r.sessions))
	for _, s := range r.sessions {
		all = append(all, s)
	}
	r.mu.Unlock()
	n := 0
	for _, s := range all {
		s.mu.Lock()
		n += len(s.tags)
		s.mu.Unlock()
	}
	return n
}

// CloseAll cleans up every session: subscriptions closed, leases back to ready.
func (r *Registry) CloseAll() {
	r.mu.Lock()
	r.draining.Store(true)
	if r.windowStop != nil {
		r.windowStop()
		r.windowStop = nil
	}
	all := make([]*Session, 0, len(r.sessions))
	for _, s := range r.sessions {
		all = append(all, s)
	}
	r.mu.Unlock()
	for _, s := range all {
		s.cleanup("shutdown")
	}
}

// isDraining reads the flag without r.mu: sessions call it holding their own
// mu, and Open holds r.mu while it takes a session's mu (attach), so taking
// r.mu here would invert the lock order.
func (r *Registry) isDraining() bool { return r.draining.Load() }

// subOwner is a subscription and the session that holds it; owner is nil
// once the subscription is closed. principal is the owning session's, kept
// after the close: a settle by reference through a closed subscription is
// taken only from a session of that same principal.
type subOwner struct {
	sub       Subscription
	owner     *Session
	principal string
	stale     bool // closed by reconciliation: no settle by reference reaches it
}

// subOpened registers a live subscription of s.
func (r *Registry) subOpened(id uint64, sub Subscription, s *Session) {
	r.subsMu.Lock()
	r.subs[id] = subOwner{sub: sub, owner: s, principal: s.principal}
	r.subsMu.Unlock()
}

// subClosed marks a subscription closed (stale: by reconciliation); the
// oldest closed ones are forgotten past ClosedSubscriptionsMax.
func (r *Registry) subClosed(id uint64, stale bool) {
	r.subsMu.Lock()
	defer r.subsMu.Unlock()
	so, ok := r.subs[id]
	if !ok || so.owner == nil {
		return
	}
	r.subs[id] = subOwner{sub: so.sub, principal: so.principal, stale: stale}
	r.closedSubs = append(r.closedSubs, id)
	for len(r.closedSubs) > r.cfg.ClosedSubscriptionsMax {
		delete(r.subs, r.closedSubs[0])
		r.closedSubs = r.closedSubs[1:]
	}
}

// subFor returns the subscription through which s may settle by lease
// reference: one of s's own, or a closed one that a session of s's
// principal held (the same client back on a fresh session after its grace
// ran out; its leases have no holder left). Anything else is nil, answered
// like an unknown lease: a live subscription of another session, and a
// closed one of another principal, whose leases a settle must never reach.
func (r *Registry) subFor(id uint64, s *Session) Subscription {
	r.subsMu.Lock()
	defer r.subsMu.Unlock()
	so, ok := r.subs[id]
	if !ok || so.stale || so.owner != nil && so.owner != s || so.owner == nil && so.principal != s.principal {
		return nil
	}
	return so.sub
}
