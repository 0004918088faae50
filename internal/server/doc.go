// Package server accepts Sinew client connections and runs the wire protocol on
// them: it decodes frames, enforces limits and timeouts, and turns requests into
// calls on a session (package session) and on the broker behind it.
//
// Goroutines: Serve runs one accept loop per listener. Each connection gets one
// reader goroutine (the one that called ServeConn) and one writer goroutine.
//
//   - The reader owns the socket's read side, the handshake state and the decode
//     buffer. It does not wait for confirms: publishes, settles and purges complete
//     through callbacks. It does wait, and reads nothing else meanwhile, for
//     DECLARE_QUEUE and DELETE_QUEUE (their context, DeclareTimeoutMs for a declare,
//     is checked only before the broker starts the work), for a PUBLISH or
//     SUBSCRIBE that creates its queue on first use, and, in a cluster, for a
//     PURGE_QUEUE's commit: the broker does that work on the caller's goroutine
//     (files and fsyncs; in a cluster, the controller's commit, up to 10 s). It
//     stops reading (backpressure) while PublishInflightMax publishes
//     await their confirm, while settleInflightMax settle requests await their
//     result, or while the write queue holds readerQueueFramesMax frames.
//   - The writer owns the socket's write side. It takes everything queued, encodes
//     it into one buffer and writes it with one syscall (up to writeBatchBytes), then
//     runs the frames' after-write hooks (auto-ack, confirm credit). It sends PING when
//     it has written nothing for a heartbeat interval.
//
// The write queue is a mutex-guarded slice. Its length is bounded by construction:
// replies the reader causes stop it at readerQueueFramesMax, publish confirms are
// bounded by PublishInflightMax, settle results by settleInflightMax, and deliveries
// by the summed prefetch of the session's subscriptions. Its bytes are bounded by
// OutboundBytesMax: at the cap the writer reports itself full (session.Throttle),
// the session's subscriptions lease nothing more, and once the queue has drained to
// half the cap the writer wakes them. Below the cap a subscription's partitions
// lease only what fits in the room left (sizes estimated from its past
// deliveries), so the queue passes the cap only by an estimate's error, when
// several subscriptions of the session take the same room at once, or by
// credit carried over from settles (the client is reading then). A connection
// that stays at the cap for SlowConsumerTimeoutMs (or whose write times out
// while it is at the cap) is closed as a slow consumer (ERROR slow_consumer
// when the stream is at a frame boundary, a warning, Stats.SlowConsumers); its
// frames go back to the session like those of any dropped connection.
//
// Lock order: session.Session.mu -> writer.mu. Nothing is called while holding
// writer.mu.
//
// Connection limits: ServeConn admits a connection only while the server
// has fewer than ConnectionsMax open, fewer than ConnectionsPerAddressMax
// from its source IP, and fewer than HandshakesMax whose HELLO has not
// succeeded; otherwise it writes a fatal too_many_connections naming the
// limit (bounded by rejectWriteTimeoutMs) and closes it before reading
// anything. The three counts live under Server.mu. A connection leaves the
// handshake count when its HELLO succeeds, or when it closes; the handshake
// timeout bounds how long it can stay. Stats.Refused counts refusals by limit.
// Password and token checks run one at a time per source IP (Server.logins,
// auth.Lanes); a failed one holds the address through the failure delay, so
// one address guesses at most once per delay. A password check waits for an
// argon2id hash slot only until the handshake deadline, then gets
// handshake_timeout.
//
// Permissions: every request that names a topic is checked against the
// connection's auth.Principal (set at HELLO) on the reader before it reaches
// the broker; perm.go has the table of request to action. A denial answers
// that request with permission_denied and the connection carries on.
//
// Errors: every bad input gets a typed ERROR frame with a code from the protocol
// table. Conditions after which the byte stream cannot be trusted or the peer must go
// (bad frame, oversized frame, handshake and heartbeat timeouts, auth failure) are
// Fatal: the ERROR is flushed and the connection closed. Per-request problems
// (unknown op, message too large, not found ...) answer that request and the
// connection carries on. No peer input makes the server panic.
//
// Drain: Shutdown is the planned stop, in two phases. First GOING_AWAY goes to
// every connection, and the server leases nothing new and takes no new
// publishes, subscriptions or connections, while settles, confirms and
// settle results go on until nothing is in flight or the deadline passes.
// Then queued frames are flushed and the sockets closed; never the other way
// round.
//
// Durability: the server stores nothing. A PUBLISH_OK is sent only from the broker's
// completion callback, which runs after the message is durable.
//
// For operators, Connections lists the open connections under the server's
// lock, Draining says whether Shutdown began, and Stats reads the counters
// (atomics) without locks on the hot paths.
package server
