"""Sinew client for Python: asyncio, standard library only.

::

    async with await sinew.connect("127.0.0.1:7654") as client:
        await client.publish("orders", b"hello")
        sub = await client.subscribe("orders", prefetch=16)
        async for msg in sub:
            await msg.complete()  # returns once queued; complete(confirmed=True) waits for the broker
"""

from .client import (
    ASSIGNED,
    CLIENT_VERSION,
    DEAD_LETTER_DEFAULT,
    DEAD_LETTER_DISCARD,
    DEAD_LETTER_GLOBAL,
    DEAD_LETTER_QUEUE,
    RECONCILE_CONSERVATIVE,
    RECONCILE_RESTORE,
    REVOKED,
    AssignmentEvent,
    AssignmentStream,
    Client,
    DeclareResult,
    Message,
    STATUS_CLOSED,
    STATUS_DISCONNECTED,
    STATUS_GOING_AWAY,
    STATUS_RECONNECTED,
    STATUS_RECONNECTING,
    Processing,
    PublishResult,
    ReconnectPolicy,
    StatusEvent,
    StatusStream,
    Subscription,
    connect,
)
from .errors import (
    AlreadySettledError,
    BrokerError,
    ClientClosedError,
    ConnectionLostError,
    DisconnectedError,
    HeartbeatTimeoutError,
    InvalidArgumentError,
    NotConnectedError,
    PermissionDeniedError,
    ProtocolError,
    QueueDeletedError,
    ReconciledClosedError,
    RecreatedError,
    RecreateFailedError,
    ServerNotTLSError,
    SettleError,
    SinewError,
    StaleDeliveryError,
    TLSError,
    SubscriptionEnded,
    UnknownTagError,
    UnsubscribedError,
    is_retryable,
)

__all__ = [
    "ASSIGNED", "REVOKED", "AssignmentEvent", "AssignmentStream", "CLIENT_VERSION", "DEAD_LETTER_DEFAULT", "DEAD_LETTER_DISCARD", "DEAD_LETTER_GLOBAL", "DEAD_LETTER_QUEUE",
    "RECONCILE_CONSERVATIVE", "RECONCILE_RESTORE", "Client", "DeclareResult", "Message", "PublishResult",
    "ReconnectPolicy", "Subscription", "connect", "Processing", "StatusEvent", "StatusStream",
    "STATUS_CLOSED", "STATUS_DISCONNECTED", "STATUS_GOING_AWAY", "STATUS_RECONNECTED", "STATUS_RECONNECTING",
    "AlreadySettledError", "BrokerError", "ClientClosedError", "ConnectionLostError", "DisconnectedError",
    "HeartbeatTimeoutError", "InvalidArgumentError", "NotConnectedError", "PermissionDeniedError", "ProtocolError",
    "QueueDeletedError", "ReconciledClosedError", "RecreatedError", "RecreateFailedError", "ServerNotTLSError",
    "SettleError", "SinewError", "StaleDeliveryError", "TLSError", "SubscriptionEnded", "UnknownTagError",
    "UnsubscribedError",
    "is_retryable",
]
