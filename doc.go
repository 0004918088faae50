// Package sinew is the Go client for the Sinew message broker.
//
// A Client holds one logical connection per broker address. The socket under it
// may break; the client then reconnects with exponential backoff and jitter,
// presents its resume identity so the broker reattaches the same session, and
// reconciles its subscriptions and its unsettled deliveries with the broker's
// view. A break the session survives (shorter than the broker's reconnect
// grace) is invisible to the application: operations wait for the reconnect
// instead of failing, and settles and publishes that were in flight are sent
// again. If the session could not be resumed the client starts a fresh one and
// subscribes again; messages it had not settled are then delivered again by
// the broker (delivery is at least once), and settling the old deliveries
// fails with ErrStaleDelivery.
//
//	c, err := sinew.Dial(ctx, "127.0.0.1:7654", sinew.WithClientName("billing"))
//	if err != nil {
//		return err
//	}
//	defer c.Close()
//
//	res, err := c.Publish(ctx, "orders", []byte(`{"id":1}`), sinew.WithKey([]byte("customer-7")))
//
//	sub, err := c.Subscribe(ctx, "orders", sinew.WithPrefetch(64))
//	for msg, err := range sub.All(ctx) {
//		if err != nil {
//			return err // why the subscription ended, or ctx's error
//		}
//		if handle(msg) != nil {
//			msg.RetryAfter(ctx, 5*time.Second)
//			continue
//		}
//		msg.Complete(ctx)
//	}
//
// # Goroutines and ownership
//
// Each broker address has an endpoint with one supervisor goroutine: it owns
// reconnection (backoff sleeps, handshake, resume, reconciliation, resending
// held publishes and settles). Each live socket has a reader (decodes frames,
// resolves requests, hands deliveries to subscriptions), a writer (batches
// queued frames into one flush), a settler (batches settles into one frame)
// and, when the broker announces heartbeats, a heartbeat goroutine. Each
// subscription has a pump goroutine feeding Messages. Close stops them all.
//
// # What is durable when
//
// Publish and PublishFuture return only after the broker has made the message
// durable. Complete, Retry, RetryAfter and Fail return only after the broker
// has made the settle durable, and Extend after it has made the lease's new
// deadline durable. Nothing is durable on the client side.
//
// # Across a reconnect
//
// While the client reconnects, Publish, PublishAsync, Subscribe and the settle
// methods wait for the next connection, bounded by their context (Unsubscribe
// returns at once, see below); they never make a connect attempt of their own,
// so a blip costs one reconnect at the backoff's pace. They fail only when the client is closed
// (ErrClientClosed), a fatal error stops it, or ReconnectPolicy.MaxAttempts
// attempts failed in a row or failed for ReconnectPolicy.MaxOutage (ErrDisconnected; after that, an operation asks for
// one fresh attempt and reports its failure as ErrNotConnected).
//
// What was in flight on the broken socket is held and sent again on the next
// connection, in order, before any new operation:
//
//   - unconfirmed publishes (at most the broker's PublishInflightMax, and 64 MiB
//     of bodies). Each carries the Client's producer id and its sequence, so
//     the broker answers a resend of one it already stored with the original
//     partition and offset (PublishResult.Duplicate) instead of storing it
//     twice, also after its own restart (see Client.PublishAsync for what is
//     not deduplicated);
//   - settles. Every settle carries the lease reference of its delivery, and
//     the broker treats a repeated settle of the same lease as the original
//     one, so sending it again is always safe. A held settle fails only when
//     the session was not resumed (ErrStaleDelivery), when the broker judges
//     its lease stale (ErrStaleDelivery: the lease ended during the break and
//     the message was leased again), or when the client closes or gives up.
//     Lease extensions (Message.Extend) are held and sent again the same way;
//   - an Unsubscribe is not resent: the resumed session's reconciliation drops
//     every subscription the client no longer lists.
//
// After a resume the client sends RECONCILE (subscriptions) and then INFLIGHT
// (the deliveries it holds unsettled). The broker re-sends the deliveries the
// client lacks, which the client de-duplicates by tag, and names those it no
// longer holds for the session; settling one of those fails at once with
// ErrStaleDelivery. The broker keeps deliveries for re-sending up to its
// limits.resend_bytes_max; one it did not keep that the client lacks comes
// back when its lease expires.
//
// # Across a planned restart
//
// When the broker announces a planned stop (GOING_AWAY), the client sends no
// new requests on that connection: new publishes, subscriptions and other
// operations wait for the next connection, in the order each caller made
// them, bounded by the publish window and by their contexts. Settles still go
// out on it, and confirms and settle results still arrive. Once nothing is in
// flight (no reply awaited, no settle queued, no delivery held unsettled by
// the application), or at the broker's deadline, the client closes the
// connection and reconnects: at once, then every base delay of the reconnect
// policy (jittered) for 30 attempts, then with the policy's backoff capped at
// 500 ms, until the broker is back. Then it restores its session as after any
// break and sends what it held. A publish or a Subscribe that crossed
// GOING_AWAY on the wire and was refused with shutting_down (the broker made
// nothing) is held the same way, and the refusal makes the client leave that
// connection as GOING_AWAY would. The application sees a pause, not an error.
//
// The client tells a broker restart (planned or not) from a network break by
// the server generation in HELLO_OK, which changes with every broker process.
// After a restart it sends again only what is safe: held publishes with a
// producer id (every publish, unless WithProducerSequence gave it an empty
// id), which the broker deduplicates; held settles, when the session was
// resumed (they fail with ErrStaleDelivery otherwise); and its subscriptions,
// through reconciliation or a new SUBSCRIBE. A held publish without a producer
// id fails with ErrConnectionLost instead: the broker process that is gone may
// have stored it, and the new one could not recognise a resend.
//
// sinew serve keeps sessions across its own restarts, planned or kill -9, for
// connection.restart_grace_ms (30 s by default): a client back within it
// resumes its session, and the deliveries its application holds unsettled
// stay its own (same leases, nobody else gets them), so their settles are
// accepted. After the window the session is gone (resume_not_found) and
// those deliveries went back to the queue.
//
// Close ends the broker's session with END_SESSION, so its unsettled messages
// go to other consumers at once instead of after the reconnect grace.
//
// # Publish order
//
// The publishes of one Client that go to one partition are stored in the
// order they were made, through redirects to the partition's owner,
// hedges, cut connections and a new owner after a failover: a publish
// whose PublishAsync (or Publish) returned before another's began is
// stored before it. Publishes made concurrently, from goroutines sharing
// the Client, are not ordered against each other. Which publishes go to
// one partition: those with the same explicit partition (WithPartition),
// those with the same key (WithKey, so order per key), and the keyless ones
// of a queue of one partition. Keyless publishes on a queue of several
// partitions are spread by the broker and not ordered against each other;
// publishes from different Clients, or numbered by the application
// (WithProducerSequence), are not ordered either.
//
// Where a keyless publish goes: the first to a queue is placed by the
// broker by the hash of the Client's producer id and its sequence; each
// answer then names the partition the broker would choose next, the less
// loaded of two (docs/protocol.md 5.6, "Partition hints"), and the Client
// sends its next keyless publish to that queue there, explicitly, so that
// a resend keeps it. A partition with a backlog the others lack thus gets
// fewer new keyless messages.
//
// The Client does it as an idempotent producer would: every send of a
// publish names the highest sequence of the same key or partition that is
// still unconfirmed and was sent already (PUBLISH producer_prev,
// docs/protocol.md 5.6), and the partition stores it only after that one,
// answering out_of_sequence otherwise. The Client then waits until that
// publish is queued again when it was itself refused, redirected or cut
// off (so a burst of followers of one refused publish goes again in one
// round), or else for its outcome (at most 200 ms at a time), and sends
// again. A publish
// that failed releases the ones after it: they are stored without it. The
// cost is one map entry per publish in flight and, when publishes arrive out
// of order, a refusal and a resend each; on one connection to the owner
// they arrive in order and nothing is refused.
//
// # Errors
//
// Operations return typed errors: sentinels (ErrClientClosed, ErrStaleDelivery,
// ErrDisconnected, ...) for errors.Is, and *BrokerError for codes the broker
// sent. IsRetryable classifies any of them. A subscription's Err, and the last
// value All yields, say why it ended: ErrUnsubscribed, ErrClientClosed,
// ErrReconciledClosed (the broker no longer held it when the session resumed,
// under ReconcileConservative), ErrRecreated, ErrDisconnected or a
// *BrokerError.
//
// # Authentication
//
// WithUser logs in as a named user with its password; WithCredentials sends
// a static token (one of the broker's auth.tokens). With neither, the client
// connects anonymously, which a broker accepts only on a loopback listener
// with no users and no tokens, or with auth.allow_anonymous. The credentials
// are sent again on every reconnect, and a resumed session must be presented
// by the user (or token) that opened it: another one gets a fresh session
// (resume_rejected). Use WithTLS unless the broker is on loopback: the
// password travels in the handshake.
//
// A request the connection's user lacks the permission for (publish to,
// subscribe to, or declare, purge or delete a topic outside its patterns)
// fails with a *BrokerError that matches ErrPermissionDenied and is not
// retryable; only that request fails, and the client, its session and its
// other subscriptions carry on.
//
// # Reconnect classification
//
// Network timeouts, refused or reset connections and DNS failures are retried
// with the ReconnectPolicy (base 100 ms, factor 2, cap 30 s, ±10 % jitter,
// reset after 10 s of health; unlimited attempts unless MaxAttempts or MaxOutage is set).
// Dial's first connect is also bounded by ConnectTimeoutDefault (or
// WithConnectTimeout) and logs each failed attempt with its reason. A
// rejected handshake (auth_failed, unsupported_version), a protocol violation
// or another non-retryable refusal is fatal: Dial returns it, and a running
// client ends its subscriptions with it and stops reconnecting.
package sinew
