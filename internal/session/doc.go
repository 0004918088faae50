// Package session implements Sinew's logical connection: the state a client keeps
// on the broker across sockets.
//
// A Session owns a client's identity (a server-issued client id, an opaque resume
// token and the owner id of the broker that issued them), its subscriptions and its
// delivery tags. It writes through a replaceable Sink, which the server's
// per-connection writer implements. When the socket goes, the sink is detached and
// pushes (DELIVER, SUB_CLOSED) wait in a buffer bounded by the session's summed
// prefetch plus a small constant, and in bytes by DormantBytesMax; a resume attaches
// a new sink and the buffer drains into it in order.
//
// Room: the Consumer a session hands the backend implements Pauser. Its room in
// bytes is the attached sink's (Throttle: what is left of the server writer's
// outbound cap, none while it is full), or none at all with no sink (a dormant
// session takes no new deliveries, so a live consumer of the same queue gets
// them) or once the registry drains (Drain: a planned stop leases nothing
// new), and, while a subscription is not yet
// announced, no more than what is left of DormantBytesMax for its early
// deliveries. A backend that honours it leases only what fits and nothing at
// all without room; the sink's drain callback, a resume and an announcement wake
// the subscriptions again (Waker). Replies to requests (PUBLISH_OK, SETTLE_RESULT ...) belong to the
// connection that asked and are dropped with it.
//
// Identity and resume: the Registry issues identities and looks them up by client id
// when a HELLO offers one. The owner id must be this broker's, the token is
// compared in constant time, and the connection's principal (who it
// authenticated as) must be the one that opened the session; anything else
// yields a fresh session with the outcome resume_not_found or resume_rejected.
// Tokens are 32 bytes from Config.Rand (crypto/rand in production), stored
// only as SHA-256 hashes and never logged.
//
//	resume identity, as issued in HELLO_OK and offered in HELLO
//	+----------------------+-------------------------+--------------------------+
//	| client_id (string)   | owner_id (string)       | token (bytes)            |
//	| "c-" + 16 hex digits | the broker's stable id  | 32 random bytes          |
//	+----------------------+-------------------------+--------------------------+
//
// Grace: with a reconnect grace above zero a dropped session goes dormant. Its
// subscriptions and leases stay, but it takes no new deliveries; the buffer
// holds only the pushes the old socket never wrote. Settles that arrive after a
// resume still find their tags. When the grace timer fires the session runs
// exactly the cleanup an immediate disconnect runs: every subscription is
// closed, which puts its leases back to ready as releases (no retry used).
// END_SESSION (End) runs the same cleanup at once.
// The grace is read at each disconnect (Config.ReconnectGraceMsLive when set, the
// runtime setting in sinew serve), so a change applies to later disconnects and a
// session already dormant keeps the timer it started with.
//
// Settles: see settle.go for the table. In short, a settle reaches the broker
// for a lease the session holds, or held until it ended without a settle
// (the queue applies an ACK or FAIL of it while the message is not leased
// again); a repeat of a settle the session made answers its original ok; a
// lease named only by its reference reaches the broker when the subscription
// is the session's own or closed, never another live session's. Two bounded
// tables per session (SettleMemoryMax) and one per registry
// (ClosedSubscriptionsMax) hold what this needs.
//
// Re-sends: a DELIVER that reached the old socket may have died in it. At a resume
// the session notes every manual-ack tag it still holds whose frame is not in the
// buffer, and Resend sends those DELIVERs again, unchanged: Reconcile calls it after
// RECONCILE_RESULT, and the server calls it before the first other request. When
// the client says INFLIGHT follows, Inflight re-sends only the noted deliveries
// the client did not report, and reports as stale the reported tags the session
// no longer holds. The
// client drops a DELIVER whose tag it already holds. Each tag keeps a pointer to
// its DELIVER body for this, so unsettled bodies stay in memory, bounded by
// prefetch and, in bytes, by ResendBytesMax: past it a delivery is not kept (a
// warning is logged once per session and Stats.ResendUnkept counts them), and if
// its frame is lost with a socket it comes back by lease expiry instead.
//
// Dormant sessions are bounded in number too: when DormantSessionsMax sessions are
// already dormant, a disconnect cleans the session up at once, with a warning and
// Stats.DormantCapped; a later resume of it gets resume_not_found.
//
// Goroutines and locks: a Session has no goroutine of its own. Its methods are called
// by the connection's reader goroutine, by broker partition goroutines (Deliver,
// Closed, settle and publish completions) and by the grace timer. Session.mu guards
// all session state; while holding it the session calls only Sink.Send, which must not
// block, so the lock order is Registry.mu -> Session.mu -> (the sink's own lock).
// Registry.subsMu (the subscriptions a settle by lease reference may reach) is a
// leaf, taken under Session.mu.
// Broker methods (Subscribe, Settle, Close) are always called without Session.mu
// held, because a broker may call back into the session from its own goroutines.
//
// Observability: the registry's Stats counts sessions restored after a
// restart, leases they reclaimed, resumes after a restart, sessions and
// leases released when the restart window ended, store write failures,
// resume outcomes, grace entered and
// expired, leases requeued at grace expiry, reconcile and inflight decisions by
// action, late settles accepted and rejected by code, and repeated settles. Each
// of these events is also logged with the client id, the connection id and
// counts, never payloads or tokens.
//
// Durability: with Config.Store set, the registry records in the session
// store (package sessionstore) what a restart needs and nothing per
// delivery: a session when it is created (client id, a SHA-256 of its
// resume token, the owner id, the owning principal), each subscription when it opens (durable
// before SUBSCRIBE_OK or RECONCILE_RESULT names it) and closes, and the
// session when it ends. PersistForRestart, which shutdown calls before any
// connection closes, makes the store durable and stops recording the ends
// that shutdown itself causes: those sessions keep their subscriptions, and
// their leases stay in the partition logs. Tags, buffers and settle tables
// stay in memory. At startup the registry restores the stored sessions for
// Config.RestartGraceMs (restore.go has the steps): dormant, with their
// subscriptions under the same ids and lease owners, holding the leases
// their partitions adopted; a resume within the window is resumed (counted
// in Stats.ResumedAfterRestart), and the rest are cleaned up when it ends. Without a store nothing is durable: a restart ends every
// session, and a client that resumes afterwards gets resume_not_found and
// rebuilds its subscriptions (see Reconcile).
//
// Registry.Sessions gives operators a snapshot of every live session,
// attached or dormant with the grace it has left (Config.Now reads the
// clock for that; the grace itself is ended by AfterFunc), its
// subscriptions and unsettled deliveries. It takes the registry's lock,
// then each session's lock in turn, never two sessions' at once.
package session
