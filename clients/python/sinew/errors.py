"""Exceptions raised by the Sinew client.

Everything the client raises is a :class:`SinewError`. Each one says whether
it is retryable: whether the same operation (or a reconnect) may succeed
later. The hierarchy::

    SinewError
    ├── BrokerError            the broker answered with an error code (``code``, ``name``)
    │   ├── PermissionDeniedError  code permission_denied (Go: ErrPermissionDenied)
    │   └── QueueDeletedError      code not_found: the subscription's queue was deleted
    ├── ConnectionLostError    a request was cut off with its connection; it may or may not have taken effect
    ├── DisconnectedError      the client gave up reconnecting (ReconnectPolicy.max_attempts)
    │   └── NotConnectedError    an operation's fresh attempt after giving up failed too
    ├── HeartbeatTimeoutError  nothing arrived for three heartbeat intervals
    ├── ProtocolError          the broker broke the protocol; fatal
    ├── TLSError               the TLS handshake failed; fatal
    │   └── ServerNotTLSError    the port does not speak TLS
    ├── ClientClosedError      the client was closed
    ├── InvalidArgumentError   an argument refused before anything was sent (also a ValueError)
    ├── SettleError            a settle had no effect
    │   ├── StaleDeliveryError   the lease is no longer held; the message comes back
    │   ├── UnknownTagError      the broker's session never issued the delivery
    │   └── AlreadySettledError  the message was settled before
    └── SubscriptionEnded      why a subscription ended
        ├── UnsubscribedError
        ├── ReconciledClosedError
        └── RecreatedError       (also named RecreateFailedError)

Each class is named after the Go SDK's sentinel error (``ErrX`` is ``XError``).
"""

from __future__ import annotations

# code -> (name, retryable); one table, the same as protocol/errors.go.
CODES: dict[int, tuple[str, bool]] = {
    0: ("ok", False),
    1: ("bad_frame", False),
    2: ("frame_too_large", False),
    3: ("unsupported_version", False),
    4: ("unknown_op", False),
    5: ("handshake_required", False),
    6: ("handshake_timeout", True),
    7: ("auth_failed", False),
    8: ("bad_request", False),
    9: ("not_found", False),
    10: ("message_too_large", False),
    11: ("too_many_connections", True),
    12: ("stale_lease", False),
    13: ("unknown_tag", False),
    14: ("internal", True),
    15: ("unavailable", True),
    16: ("shutting_down", True),
    17: ("heartbeat_timeout", True),
    18: ("resource_exhausted", True),
    19: ("conflict", False),
    20: ("limit_exceeded", False),
    21: ("slow_consumer", True),
    22: ("sequence_too_old", False),
    23: ("permission_denied", False),
    24: ("not_owner", True),
    25: ("fenced", True),
    26: ("out_of_sequence", True),
}

CODE_OK = 0
CODE_AUTH_FAILED = 7
CODE_NOT_FOUND = 9
CODE_STALE_LEASE = 12
CODE_UNKNOWN_TAG = 13
CODE_INTERNAL = 14
CODE_SHUTTING_DOWN = 16
CODE_PERMISSION_DENIED = 23
CODE_NOT_OWNER = 24


def code_name(code: int) -> str:
    """The stable name of an error code, such as ``"stale_lease"``."""
    return CODES.get(code, (f"code_{code}", False))[0]


class SinewError(Exception):
    """Base of every exception the client raises."""

    retryable: bool = False
    """Whether the same operation may succeed if tried again later."""


class BrokerError(SinewError):
    """An error the broker reported: an ERROR frame, a settle code, or a
    subscription the broker ended."""

    def __init__(self, code: int, message: str = "", owner: str = "") -> None:
        self.code = code
        self.name = code_name(code)
        self.message = message
        self.owner = owner
        """With ``not_owner``: the address of the node that owns the partition."""
        self.retryable = CODES.get(code, ("", False))[1]
        super().__init__(f"sinew: broker: {self.name}" + (f": {message}" if message else ""))


class PermissionDeniedError(BrokerError):
    """The broker refused a request because the user lacks the publish,
    consume or manage permission on its topic (code ``permission_denied``).
    Only that request failed. Go: ``ErrPermissionDenied``."""

    def __init__(self, message: str = "", owner: str = "") -> None:
        super().__init__(CODE_PERMISSION_DENIED, message, owner)


class QueueDeletedError(BrokerError):
    """A subscription's end reason when its queue was deleted: a
    :class:`BrokerError` with code ``not_found``, as the Go SDK reports it."""

    def __init__(self, message: str = "") -> None:
        super().__init__(CODE_NOT_FOUND, "queue deleted" + (f": {message}" if message else ""))


def broker_error(code: int, message: str = "", owner: str = "") -> BrokerError:
    """The BrokerError for a code, of the subclass that names it when there is one."""
    if code == CODE_PERMISSION_DENIED:
        return PermissionDeniedError(message, owner)
    return BrokerError(code, message, owner)


class ConnectionLostError(SinewError):
    """A request was in flight on a connection that broke and the client does
    not send it again (queue declarations, purges, deletions). It may or may
    not have taken effect."""

    retryable = True


class DisconnectedError(SinewError):
    """The client gave up reconnecting after ``ReconnectPolicy.max_attempts``
    failures in a row. Operations waiting for a connection fail with it."""

    retryable = True


class NotConnectedError(DisconnectedError):
    """An operation found the client given up (after
    ``ReconnectPolicy.max_attempts`` failures), asked for one fresh attempt,
    and that failed too. Go: ``ErrNotConnected``."""


class HeartbeatTimeoutError(SinewError):
    """Nothing arrived on a connection for three heartbeat intervals."""

    retryable = True


class ProtocolError(SinewError):
    """The broker sent a malformed or unexpected frame. The client stops."""


class TLSError(SinewError):
    """The TLS handshake failed: the broker's certificate did not verify
    (another CA, expired, another name), the broker refused the client's
    certificate or asked for one it did not get, or the port does not speak
    TLS. Not retryable: trying again fails the same way. ``__cause__`` is the
    :class:`ssl.SSLError`."""


class ServerNotTLSError(TLSError):
    """The client spoke TLS and the port answered in plaintext. Go:
    ``ErrServerNotTLS``."""


class ClientClosedError(SinewError):
    """The client was closed; also the end reason of its subscriptions."""


class InvalidArgumentError(SinewError, ValueError):
    """An argument the client refused before doing anything: a value of the
    wrong type or out of range (a partition of ``2**31``, a delay of
    ``500.0``), a header key the broker reserves, or a message larger than
    the broker's frame limit. Nothing was sent and no state changed: the
    client carries on. ``argument`` names the argument at fault. Also a
    :class:`ValueError`."""

    def __init__(self, argument: str, why: str) -> None:
        self.argument = argument
        super().__init__(f"sinew: invalid argument {argument}: {why}")


class SettleError(SinewError):
    """A settle (complete, retry, fail) had no effect."""


class StaleDeliveryError(SettleError):
    """The client no longer holds the delivery's lease: the session was not
    resumed after a cut, the broker reported after a resume that it no longer
    holds the delivery, or it answered ``stale_lease``. The message is (or
    will be) delivered again."""


class UnknownTagError(SettleError):
    """The broker's session never issued the settled delivery."""


class AlreadySettledError(SettleError):
    """The message was settled before."""


class SubscriptionEnded(SinewError):
    """Base of the reasons a subscription ends other than a broker error."""


class UnsubscribedError(SubscriptionEnded):
    """The application unsubscribed, or the broker did on its request."""


class ReconciledClosedError(SubscriptionEnded):
    """The broker dropped the subscription while reconciling a resumed
    session: it no longer matched the broker's view."""


class RecreatedError(SubscriptionEnded):
    """Reconciliation asked the client to recreate the subscription and the
    new subscribe failed; ``__cause__`` holds why. Go: ``ErrRecreated``."""


RecreateFailedError = RecreatedError
"""The earlier name of :class:`RecreatedError`."""


def is_retryable(exc: BaseException) -> bool:
    """Whether ``exc`` is transient: the operation or a reconnect may succeed
    later. Network failures (refused, reset, timed out, closed early) are;
    rejected handshakes, protocol violations, bad requests, certificate
    failures, other TLS failures and a closed client are not."""
    import ssl

    if isinstance(exc, SinewError):
        return exc.retryable
    # A TLS session cut short (EOF, a socket error) is the network's doing; any
    # other SSLError is a verdict (a certificate, an alert, bytes that are not
    # TLS) that a retry would meet again.
    if isinstance(exc, ssl.SSLError) and not isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)):
        return False
    if isinstance(exc, (ConnectionError, TimeoutError, EOFError, OSError)):
        return True
    import asyncio

    return isinstance(exc, asyncio.IncompleteReadError)
