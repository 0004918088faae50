package sinew

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/sinewmq/sinew/protocol"
)

// Sentinel errors. Every error the SDK returns either is one of these, wraps one
// of them, or is a *BrokerError, so callers can branch with errors.Is and
// errors.As.
var (
	// ErrClientClosed is returned by operations after Client.Close, and is the
	// termination reason of subscriptions ended by Close.
	ErrClientClosed = errors.New("sinew: client closed")
	// ErrUnsubscribed is the termination reason of a subscription ended by
	// Unsubscribe (or by the broker on the client's request).
	ErrUnsubscribed = errors.New("sinew: unsubscribed")
	// ErrReconciledClosed ends a subscription that the broker dropped while
	// reconciling a resumed session (it no longer matched the broker's view).
	ErrReconciledClosed = errors.New("sinew: subscription closed by reconciliation")
	// ErrRecreated ends a subscription that reconciliation asked the client to
	// recreate, when recreating it failed.
	ErrRecreated = errors.New("sinew: subscription could not be recreated")
	// ErrDisconnected means the client gave up reconnecting after
	// ReconnectPolicy.MaxAttempts failed attempts: it fails the operations that
	// were waiting for the connection, held publishes and settles, and ends
	// subscriptions. It wraps the last attempt's error. It is retryable: a
	// later operation makes a fresh attempt.
	ErrDisconnected = errors.New("sinew: disconnected, gave up reconnecting")
	// ErrConnectionLost fails a request that was in flight on a connection that
	// broke and that the client does not send again: DeclareQueue, PurgeQueue,
	// DeleteQueue. The request may or may not have taken effect. Publishes,
	// settles and subscribes are sent again on the next connection instead.
	// Retryable.
	ErrConnectionLost = errors.New("sinew: connection lost")
	// ErrNotConnected is returned when an operation found the client given up
	// (after ReconnectPolicy.MaxAttempts failed attempts) and the one fresh
	// attempt it asked for failed too. It wraps that attempt's error.
	// Retryable.
	ErrNotConnected = errors.New("sinew: not connected")
	// ErrProtocol marks a protocol violation by the broker (a malformed or
	// unexpected frame). It is fatal: the client does not reconnect.
	ErrProtocol = errors.New("sinew: protocol violation")
	// ErrStaleDelivery is returned when settling a message whose lease the
	// client no longer holds, so the settle had no effect and the broker
	// delivers (or has delivered) the message again: the session could not be
	// resumed after a cut (resume_not_found, resume_rejected, a restarted
	// broker), the broker reported after a resume that it no longer holds the
	// delivery for this session, or it refused the settle with stale_lease
	// (the lease ended and the message was leased again). The last case also
	// matches errors.Is(err, &BrokerError{Code: protocol.CodeStaleLease}).
	ErrStaleDelivery = errors.New("sinew: delivery is stale: its lease is no longer held")
	// ErrUnknownTag is returned when the broker's session never issued the
	// settled delivery (protocol code unknown_tag). It also matches
	// errors.Is(err, &BrokerError{Code: protocol.CodeUnknownTag}).
	ErrUnknownTag = errors.New("sinew: delivery tag unknown to the broker's session")
	// ErrAlreadySettled is returned by a second settle of the same message.
	ErrAlreadySettled = errors.New("sinew: message already settled")
	// ErrServerNotTLS means the client connected with TLS (WithTLS) and the
	// broker answered in plaintext: the port does not speak TLS. It wraps
	// the TLS error and is fatal: no retry changes what the port speaks.
	ErrServerNotTLS = errors.New("sinew: server did not speak TLS (is the port plaintext?)")
	// ErrHeartbeatTimeout closes a connection on which nothing arrived for three
	// heartbeat intervals. Retryable.
	ErrHeartbeatTimeout = errors.New("sinew: heartbeat timeout")
	// ErrPermissionDenied matches (with errors.Is) a request the broker
	// refused because the connection's user lacks the publish, consume or
	// manage permission on the request's topic: a *BrokerError with code
	// permission_denied. Only that request failed; the connection, the
	// session and its other subscriptions carry on. Not retryable.
	ErrPermissionDenied = errors.New("sinew: permission denied")

	// ErrInvalidArgument reports an argument the client refuses before
	// sending anything (a malformed cohort name or member id).
	ErrInvalidArgument = errors.New("sinew: invalid argument")
)

// BrokerError is an error reported by the broker: an ERROR frame, a failed
// settle code or a subscription the broker ended. It wraps the corresponding
// *protocol.Error, so errors.Is(err, &protocol.Error{Code: c}) matches too.
type BrokerError struct {
	Code    protocol.Code
	Message string
	// Owner is set with CodeNotOwner: the address of the cluster node
	// that owns the partition, where the same request succeeds.
	Owner string
}

func (e *BrokerError) Error() string {
	if e.Message == "" {
		return "sinew: broker: " + e.Code.String()
	}
	return "sinew: broker: " + e.Code.String() + ": " + e.Message
}

// Unwrap exposes the protocol-level error.
func (e *BrokerError) Unwrap() error {
	return &protocol.Error{Code: e.Code, Message: e.Message, Owner: e.Owner}
}

// Is matches another *BrokerError with the same code (and, when the target has
// one, the same message), so errors.Is(err, &BrokerError{Code: c}) works. A
// permission_denied error also matches ErrPermissionDenied.
func (e *BrokerError) Is(target error) bool {
	if target == ErrPermissionDenied {
		return e.Code == protocol.CodePermissionDenied
	}
	t, ok := target.(*BrokerError)
	return ok && t.Code == e.Code && (t.Message == "" || t.Message == e.Message)
}

// Retryable reports whether the same request may succeed if sent again later.
func (e *BrokerError) Retryable() bool { return e.Code.Retryable() }

func brokerErr(pe *protocol.Error) *BrokerError {
	return &BrokerError{Code: pe.Code, Message: pe.Message, Owner: pe.Owner}
}

// IsRetryable reports whether err is transient: the operation (or a reconnect)
// may succeed later. Network failures (timeouts, resets, refusals, DNS
// failures), lost connections and broker codes marked retryable are; rejected
// handshakes, protocol violations, bad requests, TLS certificate failures (ours
// or an alert from the broker refusing our certificate) and
// a closed client are not.
func IsRetryable(err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, ErrClientClosed), errors.Is(err, ErrProtocol), errors.Is(err, ErrServerNotTLS),
		errors.Is(err, ErrStaleDelivery), errors.Is(err, ErrAlreadySettled), errors.Is(err, ErrUnknownTag):
		return false
	case errors.Is(err, ErrConnectionLost), errors.Is(err, ErrNotConnected),
		errors.Is(err, ErrDisconnected), errors.Is(err, ErrHeartbeatTimeout):
		return true
	}
	var be *BrokerError
	if errors.As(err, &be) {
		return be.Code.Retryable()
	}
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return pe.Code.Retryable()
	}
	// TLS failures come wrapped in net.OpError too; they are configuration
	// problems that no retry fixes, so test for them first.
	var (
		certErr    *tls.CertificateVerificationError
		unknownCA  x509.UnknownAuthorityError
		hostErr    x509.HostnameError
		recordErr  tls.RecordHeaderError
		alertErr   tls.AlertError
		invalidErr x509.CertificateInvalidError
	)
	if errors.As(err, &certErr) || errors.As(err, &unknownCA) || errors.As(err, &hostErr) ||
		errors.As(err, &recordErr) || errors.As(err, &alertErr) || errors.As(err, &invalidErr) || isRemoteTLSAlert(err) {
		return false
	}
	var dnsErr *net.DNSError
	var opErr *net.OpError
	var netErr net.Error
	switch {
	case errors.As(err, &dnsErr), errors.As(err, &opErr), errors.As(err, &netErr):
		return true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE),
		errors.Is(err, syscall.ETIMEDOUT), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH):
		return true
	}
	return false
}

// isRemoteTLSAlert reports an alert the broker sent during or right after the
// TLS handshake, such as "certificate required" or "bad certificate" when it
// refuses the client certificate. crypto/tls reports it as a *net.OpError
// with Op "remote error" (its alert type is unexported); under TLS 1.3 it
// arrives at the first read after the handshake, so it reaches the client
// while reading HELLO_OK.
func isRemoteTLSAlert(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "remote error"
}
