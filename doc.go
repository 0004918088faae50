// Package sinew is the Go client for the Sinew message broker.
//
// A Client holds one logical connection per broker address. The socket under it
// may break; the client then reconnects with exponential backoff and jitter,
// presents its resume identity so the broker reattaches the same session, and
// reconciles its subscriptions with the broker's view. If the session could
// not be resumed it starts a fresh one and subscribes again; messages it had
// not settled are then delivered again by the broker (delivery is at least
// once).
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
// idempotent publishes). Each live socket has a reader (decodes frames,
// resolves requests, hands deliveries to subscriptions), a writer (batches
// queued frames into one flush), a settler (batches settles into one frame)
// and, when the broker announces heartbeats, a heartbeat goroutine. Each
// subscription has a pump goroutine feeding Messages. Close stops them all.
//
// # What is durable when
//
// Publish and PublishFuture return only after the broker has made the message
// durable. Complete, Retry, RetryAfter and Fail return only after the broker
// has made the settle durable. Nothing is durable on the client side: a
// request in flight when the socket breaks fails with ErrConnectionLost and
// may or may not have taken effect; it is not resent, except a publish carrying
// WithProducerSequence, which the broker deduplicates.
//
// # Errors
//
// Operations return typed errors: sentinels (ErrClientClosed, ErrNotConnected,
// ErrConnectionLost, ...) for errors.Is, and *BrokerError for codes the broker
// sent. IsRetryable classifies any of them. A subscription's Err says why it
// ended: ErrUnsubscribed, ErrClientClosed, ErrReconciledClosed, ErrRecreated,
// ErrDisconnected or a *BrokerError.
//
// # Reconnect classification
//
// Network timeouts, refused or reset connections and DNS failures are retried
// with the ReconnectPolicy (base 100 ms, factor 2, cap 30 s, ±10 % jitter,
// reset after 10 s of health; unlimited attempts unless MaxAttempts is set). A
// rejected handshake (auth_failed, unsupported_version), a protocol violation
// or another non-retryable refusal is fatal: Dial returns it, and a running
// client ends its subscriptions with it and stops reconnecting.
package sinew
