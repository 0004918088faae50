"""The asyncio client: one logical connection to one broker address.

A :class:`Client` owns a session (its resume identity, subscriptions and
delivery tags) that outlives any one socket. A supervisor task watches the
current connection; when it breaks, it reconnects with backoff, resumes the
session (or starts a fresh one), reconciles subscriptions and in-flight
deliveries, resends settles and publishes that were cut off, and only then
lets new operations use the connection.

Everything runs on one event loop, so state needs no locks: the connection's
reader task applies each frame to the client's state before reading the next.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import collections
import logging
import os
import random
import re
import ssl as _ssl
import time
import warnings
import weakref
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from . import _span
from . import _wire as w
from .errors import (
    CODE_INTERNAL,
    CODE_NOT_FOUND,
    CODE_NOT_OWNER,
    CODE_SHUTTING_DOWN,
    CODE_STALE_LEASE,
    CODE_UNKNOWN_TAG,
    AlreadySettledError,
    BrokerError,
    ClientClosedError,
    ConnectionLostError,
    DisconnectedError,
    HeartbeatTimeoutError,
    InvalidArgumentError,
    NotConnectedError,
    ProtocolError,
    QueueDeletedError,
    ReconciledClosedError,
    RecreatedError,
    ServerNotTLSError,
    SinewError,
    StaleDeliveryError,
    TLSError,
    UnknownTagError,
    UnsubscribedError,
    broker_error,
    is_retryable,
)

CLIENT_VERSION = "0.1.0"
"""The library version sent in HELLO."""

log = logging.getLogger("sinew")
log.addHandler(logging.NullHandler())  # the application decides what is shown

RECONCILE_CONSERVATIVE = 0
"""On resume, close client-held subscriptions the broker no longer has."""
RECONCILE_RESTORE = 1
"""On resume, ask the broker to recreate them (the default)."""

DEAD_LETTER_DEFAULT, DEAD_LETTER_DISCARD, DEAD_LETTER_GLOBAL, DEAD_LETTER_QUEUE = 0, 1, 2, 3

# Limits of the client itself.
DIAL_TIMEOUT_MS = 10_000  # one TCP (and TLS) connect
HANDSHAKE_TIMEOUT_MS = 10_000  # the wait for HELLO_OK
CONNECT_TIMEOUT_MS = 30_000  # connect(): no backoff sleep starts that would end past it
DRAIN_TIMEOUT_MS = 5_000  # close(): the wait for pending confirms and settles
STATUS_BUFFER_MAX = 64  # status events kept per status() iterator; the oldest are dropped beyond
END_SESSION_TIMEOUT_S = 2.0  # close(): the wait for END_SESSION's OK
PUBLISH_INFLIGHT_DEFAULT = 1024  # publish window when the broker announces none
PUBLISH_INFLIGHT_BYTES_MAX = 64 << 20  # body bytes of unconfirmed publishes, kept for resending
SETTLE_BATCH_DEFAULT = 256  # tags per settle frame when the broker announces no limit
DELIVERY_BUFFER_MAX = 4096  # messages buffered per subscription before the reader waits
ASSIGNMENT_BUFFER_MAX = 256  # assignment events kept per subscription; the oldest are dropped beyond
WRITE_COALESCE_BYTES_MAX = 64 << 10  # frames gathered for one socket write before it is made
READ_CHUNK_BYTES = 256 << 10  # most bytes taken from the socket per read
READ_BUFFER_BYTES = 1 << 20  # the stream's buffer pauses reading past twice this
PUBLISH_HEADS_CACHED = 256  # encoded publish heads kept for reuse
HINTS_MAX = 4096  # queues whose partition hint a client keeps; past it the hints start over
# Cluster routing (see Client._refused): at most LEARNED_MAX addresses are
# learned besides the one dialled, at most PROBES_MAX METADATA requests ask
# whether the broker is clustered, the pause before leaving a node that
# refused a publish grows from MOVE_PAUSE_MIN_S to MOVE_PAUSE_MAX_S with each
# refusal in a row, and a refused publish goes from node to node for at most
# MOVE_BUDGET_S.
LEARNED_MAX = 64
PROBES_MAX = 16
MOVE_PAUSE_MIN_S = 0.02
MOVE_PAUSE_MAX_S = 1.0
MOVE_BUDGET_S = 60.0
SHUN_S = 1.0  # a node that refused a publish is not moved to again for this long while another has not
REDIRECT_MAX = 512
_CODE_UNKNOWN_OP = 4
_CODE_UNAVAILABLE = 15
_CODE_FENCED = 25
GOING_AWAY_WAIT_MAX_S = 30.0  # how long a draining connection is kept for work in flight
GOING_AWAY_POLL_S = 0.01  # how often a draining connection is checked for idleness
GOING_AWAY_BACKOFF_MAX_S = 0.5  # reconnect delay cap after a planned stop


_I32_MAX = (1 << 31) - 1
_U32_MAX = (1 << 32) - 1
_I64_MAX = (1 << 63) - 1
_HEADERS_MAX = 256  # headers per message, as the protocol bounds them


# Argument checks. Every public call checks (and encodes) its arguments
# before it changes any state, so a bad one raises InvalidArgumentError at the
# call and leaves nothing behind: no request registered, no window slot taken,
# no sequence number used.

def _check_str(name: str, v: object) -> None:
    if not isinstance(v, str):
        raise InvalidArgumentError(name, f"want a str, got {v!r}")


# A cohort name or member id: 1 to 128 of A-Z a-z 0-9 . _ : - (docs/protocol.md 5.7).
_COHORT_NAME = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def _check_cohort_name(name: str, v: object) -> None:
    if not isinstance(v, str) or not _COHORT_NAME.fullmatch(v):
        raise InvalidArgumentError(name, f"want 1 to 128 characters of A-Z a-z 0-9 . _ : -, got {v!r}")


def _check_int(name: str, v: object, lo: int, hi: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise InvalidArgumentError(name, f"want an int from {lo} to {hi}, got {v!r}")


def _bytes_arg(name: str, v: object) -> bytes:
    if isinstance(v, str):
        return v.encode("utf-8")
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    raise InvalidArgumentError(name, f"want bytes or a str, got {type(v).__name__}")


def _headers_arg(headers: object) -> list[tuple[str, str]]:
    if isinstance(headers, Mapping):
        items: list[Any] = list(headers.items())
    elif isinstance(headers, (str, bytes)) or not isinstance(headers, Iterable):
        raise InvalidArgumentError("headers", f"want a mapping or (key, value) pairs, got {type(headers).__name__}")
    else:
        items = list(headers)
    out: list[tuple[str, str]] = []
    for item in items:
        if not isinstance(item, (tuple, list)) or len(item) != 2:
            raise InvalidArgumentError("headers", f"want (key, value) pairs, got {item!r}")
        k, v = item
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidArgumentError("headers", f"keys and values must be str, got {item!r}")
        if k.startswith("sinew."):
            raise InvalidArgumentError("headers", f"key {k!r}: keys starting with 'sinew.' are reserved for the broker")
        out.append((k, v))
    if len(out) > _HEADERS_MAX:
        raise InvalidArgumentError("headers", f"at most {_HEADERS_MAX} headers, got {len(out)}")
    return out


def _ms_arg(name: str, ms: object, old: str, s: object, default: int, stacklevel: int = 3) -> int:
    """An integer-milliseconds argument with its deprecated float-seconds
    alias: the alias, when given, warns (DeprecationWarning) and is converted."""
    if s is None:
        if ms is None:
            return default
        _check_int(name, ms, 0, _I64_MAX)
        assert isinstance(ms, int)
        return ms
    if ms is not None:
        raise InvalidArgumentError(old, f"give {name} or its deprecated alias {old}, not both")
    warnings.warn(f"sinew: {old} is deprecated; use {name} (integer milliseconds)", DeprecationWarning,
                  stacklevel=stacklevel)
    if not isinstance(s, (int, float)) or isinstance(s, bool) or not 0 <= s < float("inf"):
        raise InvalidArgumentError(old, f"want a non-negative number of seconds, got {s!r}")
    return round(s * 1000)


@dataclass(frozen=True)
class ReconnectPolicy:
    """Shapes automatic reconnection. The delay before attempt n (from 0) is
    ``min(base_delay_ms * factor**n, max_delay_ms) * (1 ± jitter)``, and n goes
    back to 0 once a connection has stayed up for ``reset_after_ms``.

    ``base_delay_s``, ``max_delay_s`` and ``reset_after_s`` (float seconds)
    are deprecated aliases of the ``_ms`` fields: given, they warn
    (DeprecationWarning) and set the ``_ms`` field."""

    base_delay_ms: int = 100
    factor: float = 2.0
    max_delay_ms: int = 30_000
    jitter: float = 0.1
    reset_after_ms: int = 10_000
    max_attempts: int = 0
    """0: reconnect forever; otherwise give up (DisconnectedError) after this
    many failures in a row."""
    base_delay_s: float | None = None
    max_delay_s: float | None = None
    reset_after_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("factor", "jitter"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < float("inf"):
                raise InvalidArgumentError(name, f"want a non-negative number, got {v!r}")
        for ms_name, s_name, default in (("base_delay_ms", "base_delay_s", 100), ("max_delay_ms", "max_delay_s", 30_000),
                                         ("reset_after_ms", "reset_after_s", 10_000)):
            ms = getattr(self, ms_name)
            s = getattr(self, s_name)
            if s is not None:
                # The alias wins over the field's default; both given explicitly is refused
                # only when they disagree, as a dataclass cannot tell a default from a value.
                v = _ms_arg(ms_name, None, s_name, s, default, stacklevel=4)
                if ms != default and ms != v:
                    raise InvalidArgumentError(s_name, f"give {ms_name} or its deprecated alias {s_name}, not both")
                object.__setattr__(self, ms_name, v)
                object.__setattr__(self, s_name, None)
            else:
                _check_int(ms_name, ms, 0, _I64_MAX)
        _check_int("max_attempts", self.max_attempts, 0, _I64_MAX)

    def delay(self, n: int, r: float) -> float:
        """The wait before attempt ``n`` in seconds, as the injected ``sleep``
        (``asyncio.sleep``) takes it; ``r`` in [0, 1) places the jitter."""
        d = float(self.base_delay_ms)
        for _ in range(n):
            if d >= self.max_delay_ms:
                break
            d *= self.factor
        d = min(d, float(self.max_delay_ms))
        return d * (1 + self.jitter * (2 * r - 1)) / 1000


@dataclass(frozen=True)
class PublishResult:
    """Where a confirmed message was stored."""

    partition: int
    offset: int
    duplicate: bool
    """The broker had already stored this publish (a resend); offset is the original's."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe data: ``{"partition", "offset", "duplicate"}``."""
        return {"partition": self.partition, "offset": self.offset, "duplicate": self.duplicate}


@dataclass(frozen=True)
class DeclareResult:
    """The answer to declare_queue."""

    partitions: int
    created: bool

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe data: ``{"partitions", "created"}``."""
        return {"partitions": self.partitions, "created": self.created}


def _publish_ok(raw: bytes) -> w.PublishOK:
    """A PUBLISH_OK body (partition:u32 offset:uvarint duplicate:bool, then
    the appended next:u32 when the broker names a partition hint), decoded
    as PublishOK's generic decoder would, with the usual bodies written out."""
    n = len(raw)
    if n >= 3 and raw[0] < 0x80:
        # One-byte partition, then the offset, duplicate and a one-byte next
        # or none: the usual body.
        r = w.Reader(raw)
        r.pos = 1
        r.field = "offset"
        offset = r.uvarint()
        pos = r.pos
        if pos == n - 1 and raw[pos] <= 1:
            return w.PublishOK(raw[0], offset, raw[pos] == 1)
        if pos == n - 2 and raw[pos] <= 1 and raw[pos + 1] < 0x80:
            return w.PublishOK(raw[0], offset, raw[pos] == 1, raw[pos + 1])
    return w.PublishOK.decode(raw)  # type: ignore[no-any-return]


STATUS_DISCONNECTED = "disconnected"
STATUS_RECONNECTING = "reconnecting"
STATUS_RECONNECTED = "reconnected"
STATUS_GOING_AWAY = "going_away"
STATUS_CLOSED = "closed"


@dataclass(frozen=True)
class StatusEvent:
    """A change of the client's connection, as :meth:`Client.status` and the
    ``on_status`` option report it. ``type`` (named as in the TypeScript
    client) is one of:

    - ``"disconnected"``: the connection broke (``error`` says why), or the
      client gave up reconnecting (``error`` is a DisconnectedError);
    - ``"reconnecting"``: attempt ``attempt`` (from 1) starts after
      ``delay_ms``;
    - ``"reconnected"``: a connection is up again and restored; ``resumed``
      says whether the broker kept the session (else leases held before are
      gone and their settles fail with StaleDeliveryError);
    - ``"going_away"``: the broker announced a planned stop (GOING_AWAY);
      new operations wait for the next connection;
    - ``"closed"``: the client closed (``error`` set when a fatal error
      closed it). The last event.
    """

    type: str
    error: BaseException | None = None
    attempt: int = 0
    delay_ms: int = 0
    resumed: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe data; ``error`` as its class name and text."""
        return {"type": self.type, "error": None if self.error is None else str(self.error),
                "error_type": None if self.error is None else type(self.error).__name__,
                "attempt": self.attempt, "delay_ms": self.delay_ms, "resumed": self.resumed}


class StatusStream:
    """The events of :meth:`Client.status`: ``async for ev in client.status()``.

    Each stream keeps at most ``STATUS_BUFFER_MAX`` (64) events not yet read;
    beyond that the oldest are dropped and counted in :attr:`dropped`. It
    stops after the ``"closed"`` event. Leaving the loop unregisters it: the
    client holds streams weakly, so one nobody refers to any more gets no
    events; ``aclose()`` (or ``async with``) unregisters it at once.
    """

    def __init__(self, client: Client) -> None:
        self._client = client
        self._buf: collections.deque[StatusEvent] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        self.dropped = 0
        """Events dropped because the buffer was full."""

    def _push(self, ev: StatusEvent) -> None:
        if self._ended:
            return
        if len(self._buf) >= STATUS_BUFFER_MAX:
            self._buf.popleft()
            self.dropped += 1
        self._buf.append(ev)
        if ev.type == STATUS_CLOSED:
            self._ended = True
            self._client._status_streams.discard(self)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> StatusStream:
        return self

    async def __anext__(self) -> StatusEvent:
        while not self._buf:
            if self._ended:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._buf.popleft()

    async def aclose(self) -> None:
        """Unregisters the stream; iteration stops after what is buffered."""
        self._ended = True
        self._client._status_streams.discard(self)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def __aenter__(self) -> StatusStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


ASSIGNED = "assigned"
REVOKED = "revoked"


@dataclass(frozen=True)
class AssignmentEvent:
    """A partition assigned to or revoked from a cohort subscription (the
    broker's ASSIGNMENT), as :meth:`Subscription.assignments` yields it.

    ``state`` is ``"assigned"`` (the partition's deliveries come to this
    subscription now) or ``"revoked"`` (they go to another member, or nowhere
    until the next plan). ``epoch`` is the partition's assignment epoch after
    the move: deliveries made under this assignment carry it as
    :attr:`Message.assignment`. ``dropped`` is how many events were dropped
    just before this one because the buffer was full."""

    partition: int
    epoch: int
    state: str
    dropped: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe data: ``{"partition", "epoch", "state", "dropped"}``."""
        return {"partition": self.partition, "epoch": self.epoch, "state": self.state, "dropped": self.dropped}


class AssignmentStream:
    """The assignment events of one subscription: ``async for ev in sub.assignments()``.

    Every :meth:`Subscription.assignments` call reads the same buffer, which
    keeps events from the moment the broker accepted the subscription (so
    the first reader also sees those that came before it asked) and holds at
    most ``ASSIGNMENT_BUFFER_MAX`` (256) unread ones: beyond that the oldest
    are dropped, counted in :attr:`Subscription.assignments_dropped` and in
    ``dropped`` of the next event read. One reader at a time. Leaving the loop
    only stops reading; iteration stops when the subscription ends and the
    buffer is empty."""

    def __init__(self) -> None:
        self._buf: collections.deque[AssignmentEvent] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False
        self._missed = 0  # dropped since the last event read
        self.dropped = 0
        """Events dropped because the buffer was full, in all."""

    def _push(self, ev: AssignmentEvent) -> None:
        if self._ended:
            return
        if len(self._buf) >= ASSIGNMENT_BUFFER_MAX:
            self._buf.popleft()
            self._missed += 1
            self.dropped += 1
        self._buf.append(ev)
        self._wake()

    def _end(self) -> None:
        self._ended = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def __aiter__(self) -> AssignmentStream:
        return self

    async def __anext__(self) -> AssignmentEvent:
        while not self._buf:
            if self._ended:
                raise StopAsyncIteration
            if self._waiter is not None:
                raise RuntimeError("sinew: a subscription's assignments have one reader at a time")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        ev = self._buf.popleft()
        if self._missed:
            ev = dataclasses.replace(ev, dropped=self._missed)
            self._missed = 0
        return ev


class _ConnClosed(Exception):
    """The connection closed before the request could be written."""


class _Call:
    """One request awaiting its reply. ``kind`` decides what happens to it
    when its connection breaks: publishes are sent again on the next
    connection, settles are held for the resumed session, the rest fail."""

    __slots__ = ("body", "fut", "kind", "hook", "nbytes", "flags", "head", "seq", "data", "refused_at", "uncertain")

    def __init__(self, body: w.Body | None, kind: str = "", hook: Callable[[Any], None] | None = None,
                 nbytes: int = 0) -> None:
        self.body = body
        self.fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.refused_at: float | None = None  # when a cluster node first refused it (a publish)
        # A send of it (a publish) was cut off before its answer: that send
        # may have stored it.
        self.uncertain = False
        self.kind = kind
        self.hook = hook
        self.nbytes = nbytes
        self.flags = 0
        # A publish carries its fields encoded once, up to producer_seq.
        self.head = b""
        self.seq = 0
        self.data = b""

    def frame(self, rid: int) -> bytes:
        if self.body is None:
            return w.publish_frame(rid, self.head, self.seq, self.data, self.flags)
        return w.encode_frame(self.body, rid, self.flags)

    def resolve(self, value: Any) -> None:
        if not self.fut.done():
            self.fut.set_result(value)

    def fail(self, exc: BaseException) -> None:
        if not self.fut.done():
            self.fut.set_exception(exc)


class _Window:
    """Bounds unconfirmed publishes, in count and in body bytes."""

    def __init__(self, n: int) -> None:
        self.max = n
        self.n = 0
        self.bytes = 0
        self._waiters: list[asyncio.Future[None]] = []

    def _room(self, nbytes: int) -> bool:
        # A single publish larger than the byte bound still goes, alone.
        return self.n < self.max and (self.n == 0 or self.bytes + nbytes <= PUBLISH_INFLIGHT_BYTES_MAX)

    async def acquire(self, nbytes: int) -> None:
        while self._waiters or not self._room(nbytes):
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            except BaseException:
                if fut in self._waiters:
                    self._waiters.remove(fut)
                elif fut.done() and not fut.cancelled():
                    self._wake()  # woken, but leaving: the wake goes to the next
                raise
            if self._room(nbytes):
                break
        self.n += 1
        self.bytes += nbytes
        if self._waiters and self._room(0):
            self._wake()  # room for more than this one

    def release(self, nbytes: int) -> None:
        self.n -= 1
        self.bytes -= nbytes
        if self._waiters:
            self._wake()

    def set_max(self, n: int) -> None:
        self.max = n if n > 0 else PUBLISH_INFLIGHT_DEFAULT
        if self._waiters:
            self._wake()

    def _wake(self) -> None:
        """Wakes the longest waiter; it takes its slot or waits again."""
        while self._waiters:
            fut = self._waiters.pop(0)
            if not fut.done():
                fut.set_result(None)
                return


class _Done:
    """An awaitable that is already done: what a fast settle returns."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # a generator that returns at once


_DONE = _Done()


class _Failed:
    """An awaitable that raises ``exc``: a settle refused at the call raises
    where it is awaited, as a coroutine's error would."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __await__(self) -> Generator[Any, None, None]:
        raise self.exc
        yield  # a generator that raises at once


class Message:
    """A delivery. Manual-ack messages must be settled once, with
    :meth:`complete`, :meth:`retry`, :meth:`retry_after` or :meth:`fail`, or
    inside ``async with msg.process():``.

    **Fast settles.** By default a settle returns as soon as it is queued:
    the client sends the settles of one turn of the event loop in one frame,
    holds them across a cut connection and sends them again on the resumed
    session, and :meth:`Client.close` waits for them. A settle that fails
    later (the lease was lost, a delay above the broker's cap) is logged on
    the ``sinew`` logger and passed to the ``on_settle_error`` callback of
    :func:`connect`; a retryable failure leaves the message unsettled, so it
    may be settled again. With ``confirmed=True`` the call returns once the
    broker has made the settle durable and raises its error instead.
    """

    __slots__ = ("topic", "group", "partition", "offset", "attempt", "published_at_ms", "lease_ms", "key",
                 "headers", "content_type", "body", "tag", "_assignment", "_lease_sub", "_lease_id", "_lease_epoch", "_lease_raw",
                 "_sub", "_epoch", "_settled", "_stale")

    @classmethod
    def _of(cls, sub: Subscription, f: tuple[Any, ...], epoch: int) -> Message:
        """A message from w.Deliver.fields(): the consumer's hot path, with no Deliver object."""
        m = cls.__new__(cls)
        (m._lease_sub, m.tag, m.partition, m.offset, m.attempt, m.published_at_ms, m.key, m.headers,
         m.content_type, m.body, m.topic, m.group, m._lease_id, m._lease_epoch, m.lease_ms, m._assignment,
         m._lease_raw) = f
        if not m.topic:
            m.topic = sub.topic
        if not m._lease_raw:  # a broker that sends no lease_id: the reference by position
            m._lease_raw = w.LeaseRef(m._lease_sub, m.partition, m.offset, 0, 0).encode()
        m._sub = sub
        m._epoch = epoch
        m._settled = sub.auto_ack
        m._stale = False
        return m

    def __init__(self, sub: Subscription, d: w.Deliver, epoch: int) -> None:
        self.topic = d.topic or sub.topic
        self.group = d.group
        self.partition = d.partition
        self.offset = d.offset
        self.attempt = d.attempt
        self.published_at_ms = d.published_at_ms
        self.lease_ms = d.lease_ms
        """The lease the broker granted with this delivery (0: not announced)."""
        self.key = d.key
        self.headers: list[tuple[str, str]] = d.headers
        """The headers in order, as (key, value) pairs; a key may repeat."""
        self.content_type = d.content_type
        self.body = d.body
        self.tag = d.tag
        self._assignment = d.assignment
        self._lease_sub, self._lease_id, self._lease_epoch = d.sub_id, d.lease_id, d.epoch
        self._lease_raw = d.lease_raw or w.LeaseRef(d.sub_id, d.partition, d.offset, d.lease_id, d.epoch).encode()
        self._sub = sub
        self._epoch = epoch
        self._settled = sub.auto_ack
        self._stale = False

    @property
    def assignment(self) -> int:
        """The partition's assignment epoch when this delivery was leased
        (DELIVER's ``assignment``, read-only): it rises each time the
        partition moves from one cohort member to another, and is 0 while no
        cohort ever held the partition. Compare it with the ``epoch`` of
        :meth:`Subscription.assignments` events."""
        return self._assignment

    @property
    def lease(self) -> w.LeaseRef:
        """The lease_ref that names this delivery (protocol section 5.8)."""
        return w.LeaseRef(self._lease_sub, self.partition, self.offset, self._lease_id, self._lease_epoch,
                          self._lease_raw)

    @property
    def text(self) -> str:
        """The body decoded as UTF-8."""
        return self.body.decode("utf-8")

    def header(self, name: str, default: str | None = None) -> str | None:
        """The value of the first header named ``name``, or ``default``."""
        for k, v in self.headers:
            if k == name:
                return v
        return default

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe data: the message's fields, ``headers`` as a list
        of ``[key, value]`` pairs, and ``key`` and ``body`` as base64 text
        (``key_base64``, ``body_base64``)."""
        return {"topic": self.topic, "group": self.group, "partition": self.partition, "offset": self.offset,
                "attempt": self.attempt, "published_at_ms": self.published_at_ms, "lease_ms": self.lease_ms,
                "assignment": self._assignment, "key_base64": base64.b64encode(self.key).decode("ascii"),
                "headers": [[k, v] for k, v in self.headers], "content_type": self.content_type,
                "body_base64": base64.b64encode(self.body).decode("ascii")}

    def complete(self, *, confirmed: bool = False) -> Awaitable[None]:
        """ACK: the message is done and will not be delivered again. Returns
        once queued (see the class doc), or with ``confirmed=True`` once the
        broker has made it durable."""
        return self._sub._client._settle(self, w.ACK, 0, confirmed)

    def retry(self, *, confirmed: bool = False) -> Awaitable[None]:
        """NACK: deliver the message again (uses one of the queue's retries)."""
        return self._sub._client._settle(self, w.NACK, 0, confirmed)

    def retry_after(self, delay_ms: int, *, confirmed: bool = False) -> Awaitable[None]:
        """NACK with a delay: deliver again no earlier than ``delay_ms``
        (an int, in milliseconds, 0 or more) from now. Anything else raises
        InvalidArgumentError and settles nothing. A delay above the broker's
        cap is refused (``bad_request``) and the lease stays held."""
        return self._sub._client._settle(self, w.NACK, delay_ms, confirmed)

    def fail(self, *, confirmed: bool = False) -> Awaitable[None]:
        """FAIL: a terminal failure; the broker dead-letters the message."""
        return self._sub._client._settle(self, w.FAIL, 0, confirmed)

    async def extend(self, extend_ms: int) -> None:
        """Extends the lease: the broker keeps the message for this consumer
        until ``extend_ms`` (an int, in milliseconds, above 0) from now, so a
        long handler is not redelivered elsewhere. Returns once the broker
        has answered; raises StaleDeliveryError when the lease is already
        gone, AlreadySettledError after a settle."""
        await self._sub._client._extend(self, extend_ms)

    def process(self, *, retry_delay_ms: int = 0, reraise: bool = False) -> Processing:
        """A context manager that settles the message when its block ends::

            async with msg.process():
                await handle(msg)

        On normal exit it completes the message; when the block raises an
        ``Exception`` it retries it (after ``retry_delay_ms``), logs the
        exception on the ``sinew`` logger and, unless ``reraise`` is true,
        swallows it, so a worker loop carries on with the next message. A
        message the block settled itself is left as it is. Cancellation and
        other ``BaseException`` leave the message unsettled and propagate (the
        broker takes it back when the subscription or client ends, or the
        lease runs out). Its settles are fast (see the class doc); one that
        cannot be made (the lease is gone, the client closed) is reported to
        ``on_settle_error`` and the log, not raised."""
        _check_int("retry_delay_ms", retry_delay_ms, 0, _I64_MAX)
        return Processing(self, retry_delay_ms, reraise)


class Processing:
    """What :meth:`Message.process` returns."""

    __slots__ = ("msg", "retry_delay_ms", "reraise")

    def __init__(self, msg: Message, retry_delay_ms: int, reraise: bool) -> None:
        self.msg = msg
        self.retry_delay_ms = retry_delay_ms
        self.reraise = reraise

    async def __aenter__(self) -> Message:
        return self.msg

    async def __aexit__(self, et: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool:
        m = self.msg
        client = m._sub._client
        if et is not None and not issubclass(et, Exception):
            return False
        if et is not None:
            log.error("sinew: handler failed on %s partition %d offset %d (attempt %d); retrying", m.topic,
                      m.partition, m.offset, m.attempt, exc_info=(et, exc, tb) if exc is not None else None)
        if not m._settled:
            try:
                if et is None:
                    await m.complete()
                else:
                    await m.retry_after(self.retry_delay_ms)
            except SinewError as e:
                # e.g. the session was not resumed (the message comes back
                # anyway) or the client closed meanwhile (it was released)
                client._settle_failed(m, e)
        return et is not None and not self.reraise


_END = object()


class _Buffer:
    """The messages of a subscription waiting for the application: a deque
    bounded at ``maxsize`` for the one writer (the connection's reader, which
    waits in :meth:`put` when it is full), read by any number of tasks.
    asyncio.Queue does the same at about twice the cost per message."""

    __slots__ = ("_q", "_max", "_getters", "_putter")

    def __init__(self, maxsize: int) -> None:
        self._q: collections.deque[Any] = collections.deque()
        self._max = maxsize
        self._getters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._putter: asyncio.Future[None] | None = None

    def qsize(self) -> int:
        return len(self._q)

    def empty(self) -> bool:
        return not self._q

    def _wake_getter(self) -> None:
        while self._getters:
            g = self._getters.popleft()
            if not g.done():
                g.set_result(None)
                return

    def put_nowait(self, item: Any) -> None:
        """Appends item; raises asyncio.QueueFull at the bound."""
        if len(self._q) >= self._max:
            raise asyncio.QueueFull
        self.force(item)

    def force(self, item: Any) -> None:
        """Appends item even at the bound (the end marker)."""
        self._q.append(item)
        if self._getters:
            self._wake_getter()

    async def put(self, item: Any) -> None:
        while len(self._q) >= self._max:
            self._putter = asyncio.get_running_loop().create_future()
            try:
                await self._putter
            finally:
                self._putter = None
        self.force(item)

    def get_nowait(self) -> Any:
        if not self._q:
            raise asyncio.QueueEmpty
        item = self._q.popleft()
        p = self._putter
        if p is not None and not p.done():
            p.set_result(None)
        return item

    async def get(self) -> Any:
        while not self._q:
            g = asyncio.get_running_loop().create_future()
            self._getters.append(g)
            try:
                await g
            except BaseException:
                g.cancel()
                if self._q and not g.cancelled():
                    self._wake_getter()  # it was woken for an item it will not take
                raise
        return self.get_nowait()

    def clear(self) -> None:
        self._q.clear()
        p = self._putter
        if p is not None and not p.done():
            p.set_result(None)


class Subscription:
    """Messages of one queue, in arrival order: ``async for msg in sub``.

    Iteration stops when the subscription ends. It ends cleanly (iteration
    just stops) after :meth:`unsubscribe` or the client's close; for any other
    reason iteration raises the reason, which :attr:`end_reason` also holds:
    :class:`ReconciledClosedError`, :class:`RecreateFailedError`, a
    :class:`BrokerError` (``not_found`` when the queue was deleted),
    :class:`DisconnectedError` or a fatal error of the client.
    """

    def __init__(self, client: Client, topic: str, group: str, partition: int, prefetch: int,
                 auto_ack: bool, cohort: str = "", member_id: str = "") -> None:
        self._client = client
        self.topic = topic
        self.group = group
        self.partition = partition
        self.prefetch = prefetch
        self.auto_ack = auto_ack
        self.cohort = cohort
        """The cohort (consumer group) this subscription is a member of; "" for a plain consumer."""
        self.member_id = member_id
        """The member id it joined the cohort with; "" for a plain consumer."""
        self._assignments = AssignmentStream()
        self._server_id = 0
        self._recreating = False
        self._buf = _Buffer(DELIVERY_BUFFER_MAX)
        self._held: dict[int, Message] = {}  # manual-ack deliveries of the current epoch, unsettled
        self._end: BaseException | None = None
        self._span: _span.Span | None = None  # in a cluster: the parts on every replica node

    @property
    def end_reason(self) -> BaseException | None:
        """Why the subscription ended, or None while it runs."""
        return self._end

    def assignments(self) -> AssignmentStream:
        """The partitions assigned to and revoked from this cohort
        subscription, in the order the broker sent them::

            async for ev in sub.assignments():
                print(ev.partition, ev.state, ev.epoch)

        Bounded and kept from the start (see :class:`AssignmentStream`). A
        plain subscription (no cohort) gets no events."""
        return self._assignments

    @property
    def assignments_dropped(self) -> int:
        """Assignment events dropped because the buffer (256) was full, in all."""
        return self._assignments.dropped

    def _assign(self, a: w.Assignment) -> None:
        if self._end is not None:
            return
        self._assignments._push(AssignmentEvent(a.partition, a.epoch,
                                                ASSIGNED if a.state == w.ASSIGNMENT_ASSIGNED else REVOKED))

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Message:
        try:
            item = self._buf.get_nowait()  # the common case under load: no suspension
        except asyncio.QueueEmpty:
            item = await self._buf.get()
        if item is _END:
            self._buf.force(_END)  # later calls stop too
            if isinstance(self._end, (UnsubscribedError, ClientClosedError)):
                raise StopAsyncIteration
            assert self._end is not None
            raise self._end
        return item  # type: ignore[no-any-return]

    async def unsubscribe(self) -> None:
        """Ends the subscription. Settles already made go out first; the
        broker then returns every delivery of the subscription that is still
        unsettled to the queue at once, without using a retry (prefetched
        messages not yet handed out included, which the client drops)."""
        await self._client._unsubscribe(self)

    async def aclose(self) -> None:
        """Ends the subscription, as :meth:`unsubscribe` does, and never
        raises: the way out of an ``async for`` loop that stops early.
        ``contextlib.aclosing(sub)`` and ``async with sub`` call it."""
        try:
            await self._client._unsubscribe(self)
        except SinewError:
            pass  # ended here regardless; the broker ends it with the session

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def run(self, handler: Callable[[Message], Awaitable[None]], *, concurrency: int = 1,
                  retry_delay_ms: int = 0) -> None:
        """Calls ``handler`` for every message, each inside
        :meth:`Message.process` (completed when it returns, retried when it
        raises), with up to ``concurrency`` handlers running at once. Returns
        when the subscription ends cleanly (unsubscribe, close) and raises the
        end reason otherwise, as ``async for`` does. Cancelling ``run`` ends the
        subscription, as leaving the loop with ``async with`` does."""
        _check_int("concurrency", concurrency, 1, 1 << 16)
        _check_int("retry_delay_ms", retry_delay_ms, 0, _I64_MAX)

        async def worker() -> None:
            async for m in self:
                async with m.process(retry_delay_ms=retry_delay_ms):
                    await handler(m)

        try:
            if concurrency == 1:
                await worker()
            else:
                await asyncio.gather(*(worker() for _ in range(concurrency)))
        except asyncio.CancelledError:
            await asyncio.shield(self.aclose())
            raise

    def _view(self) -> w.SubView:
        return w.SubView(self._server_id, self.topic, self.group, self.partition, 1 if self.auto_ack else 0,
                         self.prefetch)

    def _deliver(self, f: tuple[Any, ...], epoch: int) -> Message | None:
        """Buffers a delivery (w.Deliver.fields()); returns the message when
        the buffer is full, for the reader to wait with (:meth:`_deliver_wait`)."""
        if self._end is not None:
            return None
        if not self.auto_ack:
            tag = f[1]
            if tag in self._held:
                return None  # a re-send of a delivery the application already has
            m = Message._of(self, f, epoch)
            self._held[tag] = m
        else:
            m = Message._of(self, f, epoch)
        try:
            self._buf.put_nowait(m)
        except asyncio.QueueFull:
            return m
        return None

    async def _deliver_wait(self, m: Message) -> None:
        await self._buf.put(m)  # the reader waits: backpressure on the broker

    def _purge(self) -> None:
        """Drops buffered deliveries and held leases of a session that is gone."""
        self._buf.clear()
        self._held.clear()

    def _finish(self, reason: BaseException) -> None:
        if self._end is not None:
            return
        self._end = reason
        self._purge()
        self._buf.force(_END)
        self._assignments._end()
        self._client._subs.discard(self)


class _Conn:
    """One socket: its reader, heartbeat and requests in flight."""

    def __init__(self, client: Client, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 hello: w.HelloOK, epoch: int, subs: dict[int, Subscription]) -> None:
        self.client = client
        self.reader = reader
        self.writer = writer
        self.hello = hello
        self.epoch = epoch
        self.subs = subs
        self.pending: dict[int, _Call] = {}
        self.next_id = 2  # HELLO was 1
        self.closed = False
        self.close_exc: BaseException | None = None
        self.done = asyncio.Event()
        self.going_away = asyncio.Event()
        self.draining = False
        self.away_deadline_ms = 0
        self.frame_max = hello.limits.frame_bytes_max or w.FRAME_BYTES_DEFAULT
        self.last_read = time.monotonic()
        self.tasks: list[asyncio.Task[None]] = []
        self.out = bytearray()  # frames written this turn of the loop, sent together
        self.flush_scheduled = False

    def run(self) -> None:
        self.tasks.append(asyncio.create_task(self._read_loop()))
        hb = self.hello.heartbeat_ms / 1000
        if self.client._heartbeat_s:
            hb = min(hb, self.client._heartbeat_s) if hb else self.client._heartbeat_s
        if hb > 0:
            self.tasks.append(asyncio.create_task(self._heartbeat(hb)))

    def start(self, call: _Call) -> None:
        """Writes the request; raises _ConnClosed if the socket is gone. The
        frame is encoded before the request is registered: one that cannot
        be encoded, or exceeds the broker's frame limit, fails the call and
        leaves nothing behind to be sent again."""
        if self.closed:
            raise _ConnClosed
        rid = self.next_id
        if call.body is None:  # a publish: written straight into the outgoing buffer
            tail = bytearray()
            w.put_uvarint(tail, call.seq)
            w.put_uvarint(tail, len(call.data))
            length = w.HEADER_BYTES + len(call.head) + len(tail) + len(call.data)
            if length + 4 > self.frame_max:
                call.fail(InvalidArgumentError("body", f"a frame of {length + 4} bytes exceeds the broker's "
                                                       f"frame limit of {self.frame_max} bytes"))
                return
            self.next_id += 1
            self.pending[rid] = call
            out = self.out
            out += w.frame_head(length, w.PUBLISH, call.flags, rid)
            out += call.head
            out += tail
            out += call.data
            if len(out) >= WRITE_COALESCE_BYTES_MAX:
                self.flush()
            elif not self.flush_scheduled:
                self.flush_scheduled = True
                asyncio.get_running_loop().call_soon(self.flush)
            return
        try:
            frame = call.frame(rid)
        except InvalidArgumentError as e:
            call.fail(e)
            return
        if len(frame) > self.frame_max:
            call.fail(InvalidArgumentError("body", f"a frame of {len(frame)} bytes exceeds the broker's "
                                                   f"frame limit of {self.frame_max} bytes"))
            return
        self.next_id += 1
        self.pending[rid] = call
        self.write(frame)

    def write(self, frame: bytes) -> None:
        """Queues a frame. The frames of one turn of the event loop go out in
        one socket write, which is what lets a window of publishes or a burst
        of settles cost one syscall instead of one each."""
        self.out += frame
        if len(self.out) >= WRITE_COALESCE_BYTES_MAX:
            self.flush()
        elif not self.flush_scheduled:
            self.flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.flush_scheduled = False
        if self.out and not self.closed:
            self.writer.write(bytes(self.out))
        self.out.clear()

    def backlogged(self) -> bool:
        """Whether a writer should wait in drain(): many frames gathered, or
        the transport's buffer past its high-water mark."""
        return len(self.out) >= WRITE_COALESCE_BYTES_MAX // 2 or \
            self.writer.transport.get_write_buffer_size() >= WRITE_COALESCE_BYTES_MAX

    async def drain(self) -> None:
        # The transport's buffer bounds what waits to be written: past its
        # high-water mark the writer waits here.
        if len(self.out) >= WRITE_COALESCE_BYTES_MAX // 2:
            self.flush()
        try:
            await self.writer.drain()
        except (ConnectionError, OSError):
            pass  # the reader sees the break and closes the connection

    def close(self, exc: BaseException) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_exc = exc
        self.writer.transport.abort()
        pending = list(self.pending.values())
        self.pending.clear()
        self.client._orphaned(self, pending)
        for t in self.tasks:
            if t is not asyncio.current_task():
                t.cancel()
        self.done.set()

    async def wait_closed(self) -> None:
        await self.done.wait()
        for t in self.tasks:
            if t is not asyncio.current_task():
                try:
                    await t
                except (asyncio.CancelledError, Exception):
                    pass

    async def _heartbeat(self, hb: float) -> None:
        while not self.closed:
            await asyncio.sleep(hb)
            if time.monotonic() - self.last_read > 3 * hb:
                self.close(HeartbeatTimeoutError("sinew: nothing heard from the broker for three heartbeats"))
                return
            if not self.closed:
                rid = self.next_id
                self.next_id += 1
                self.write(w.encode_frame(w.Ping(), rid))

    async def _read_loop(self) -> None:
        deliver_fields = w.Deliver.fields
        fast_replies = {w.PUBLISH_OK: _publish_ok, w.SETTLE_RESULT: w.SettleResult.decode}
        try:
            buf = b""
            while True:
                # Read what is there (up to READ_CHUNK_BYTES) and dispatch
                # every whole frame in it; a frame's length is checked against
                # the limit before its body is awaited.
                chunk = await self.reader.read(READ_CHUNK_BYTES)
                if not chunk:
                    raise EOFError("connection closed by the broker")
                buf = buf + chunk if buf else chunk
                self.last_read = time.monotonic()
                pos = 0
                while len(buf) - pos >= 16:
                    n, _, op, _, rid = w.parse_header(buf, self.frame_max, pos)
                    if len(buf) - pos - 16 < n:
                        break
                    if op == w.DELIVER:  # the hot path: no coroutine per message
                        f = deliver_fields(w.Reader(buf[pos + 16:pos + 16 + n]))
                        sub = self.subs.get(f[0])
                        if sub is not None:
                            full = sub._deliver(f, self.epoch)
                            if full is not None:
                                await sub._deliver_wait(full)
                    elif op in fast_replies and (call := self.pending.get(rid)) is not None and call.hook is None:
                        # PUBLISH_OK and SETTLE_RESULT: no coroutine per reply
                        reply = fast_replies[op](buf[pos + 16:pos + 16 + n])
                        del self.pending[rid]
                        call.resolve(reply)
                    else:
                        await self._dispatch(op, rid, buf[pos + 16:pos + 16 + n])
                    pos += 16 + n
                buf = buf[pos:]
        except asyncio.CancelledError:
            raise
        except SinewError as e:
            self.close(e)
        except (EOFError, OSError) as e:
            self.close(ConnectionLostError(f"sinew: connection lost: {e!r}"))
        except Exception as e:  # a bug in dispatch must not leave the socket half-alive
            self.close(ProtocolError(f"sinew: cannot process frame: {e!r}"))

    async def _dispatch(self, op: int, rid: int, raw: bytes) -> None:
        if op == w.PING:
            self.write(w.encode_frame(w.Pong(), rid))
            return
        if op == w.PONG:
            return
        body = w.decode_body(op, raw)
        if isinstance(body, w.Deliver):
            sub = self.subs.get(body.sub_id)
            if sub is not None:
                full = sub._deliver(tuple(getattr(body, x.name) for x in dataclasses.fields(body)), self.epoch)
                if full is not None:
                    await sub._deliver_wait(full)
            return
        if isinstance(body, w.SubClosed):
            self.client._sub_closed(self, body)
            return
        if isinstance(body, w.Assignment):
            sub = self.subs.get(body.sub_id)
            if sub is not None:  # an unknown sub_id is ignored
                sub._assign(body)
            return
        if isinstance(body, w.GoingAway):
            self.draining = True
            self.away_deadline_ms = body.deadline_ms
            self.going_away.set()
            if body.redirect and len(body.redirect) <= REDIRECT_MAX:
                # A cluster node names one that stays up: the next
                # connection goes there, not back to this node.
                self.client._redirect(body.redirect)
            return
        if isinstance(body, w.ErrorBody):
            err = broker_error(body.code, body.message, body.owner)
            call = self.pending.pop(rid, None) if rid else None
            if call is not None:
                if call.kind == "publish" and not body.fatal and body.code == CODE_SHUTTING_DOWN:
                    # Nothing was stored; the publish goes again on the next
                    # connection, under the same producer sequence.
                    self.client._replay.append(call)
                elif call.kind == "publish" and not body.fatal and self.client._refused(self, call, body, err):
                    pass  # a cluster node that cannot take it: sent to another node
                else:
                    call.fail(err)
            if body.fatal:
                self.close(err)
            return
        if op in (w.HELLO, w.DECLARE_QUEUE, w.PUBLISH, w.SUBSCRIBE, w.ACK, w.NACK, w.FAIL, w.EXTEND,
                  w.RECONCILE, w.INFLIGHT, w.END_SESSION, w.DELETE_QUEUE, w.PURGE_QUEUE, w.UNSUBSCRIBE):
            raise ProtocolError(f"sinew: broker sent client op {w.OP_NAMES[op]}")
        call = self.pending.pop(rid, None)
        if call is None:
            return  # a reply to a request that was given up (timed out)
        if call.hook is not None:
            call.hook(body)
        call.resolve(body)


class Client:
    """A connection to one Sinew broker. Make one with :func:`connect`."""

    def __init__(self, addr: str, *, client_name: str, credentials: str, user: str, reconnect: ReconnectPolicy,
                 reconcile: int, ssl: _ssl.SSLContext | None, heartbeat_s: float,
                 dial_timeout_s: float, handshake_timeout_s: float, drain_timeout_s: float,
                 sleep: Callable[[float], Awaitable[None]], monotonic: Callable[[], float],
                 rand: Callable[[], float], on_status: Callable[[StatusEvent], None] | None = None,
                 on_settle_error: Callable[[Message, SinewError], None] | None = None,
                 member_id: str | None = None) -> None:
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"sinew: address {addr!r} is not host:port")
        self.addr = addr
        self._host, self._port = host.strip("[]"), int(port)
        self._name = client_name
        self._credentials = credentials
        self._user = user
        self._policy = reconnect
        self._reconcile_policy = reconcile
        self._ssl = ssl
        self._heartbeat_s = heartbeat_s
        self._dial_timeout = dial_timeout_s
        self._handshake_timeout = handshake_timeout_s
        self._drain_timeout = drain_timeout_s
        self._sleep = sleep
        self._monotonic = monotonic
        self._rand = rand
        self._identity = w.ResumeIdentity()
        self._epoch = 0
        self._subs: set[Subscription] = set()
        self._replay: list[_Call] = []  # publishes cut off from their connection
        self._held: list[_Call] = []  # settles cut off from their connection
        self._conn: _Conn | None = None  # the connection being restored or in use
        self._live: _Conn | None = None  # the connection operations may use
        self._wake = asyncio.Event()
        self._closing = False  # new operations are refused
        self._close_started = False  # close() has begun (it drains before refusing)
        self._closed = asyncio.Event()  # close() has finished
        self._fatal: BaseException | None = None
        self._gave_up: BaseException | None = None
        self._kick = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None
        self._window = _Window(PUBLISH_INFLIGHT_DEFAULT)
        self._settling = 0  # settles queued or sent, not yet answered
        self._settle_q: list[tuple[Message, int, int, asyncio.Future[None] | None]] = []
        self._settle_task: asyncio.Task[None] | None = None  # waits for a connection for the queued settles
        self._settle_scheduled = False  # a send of the queued settles is scheduled for this turn
        self._on_status = on_status
        self._on_settle_error = on_settle_error
        self._status_streams: weakref.WeakSet[StatusStream] = weakref.WeakSet()
        self._producer_id = "py-" + os.urandom(8).hex()
        self.member_id = member_id if member_id is not None else "m-py-" + os.urandom(16).hex()
        """The member id of this client's cohort subscriptions that name none:
        the ``member_id`` of :func:`connect`, else random per client; the same
        across reconnects."""
        self._producer_seq = 0
        self._heads: dict[tuple[Any, ...] | None, bytes] = {}  # encoded publish heads by their fields
        self._hints: dict[tuple[str, str], int] = {}  # the broker's partition hint by (topic, group)
        self._frame_max = w.FRAME_BYTES_DEFAULT  # the broker's frame limit at the last handshake
        # Cluster routing: the client keeps one connection, but in a cluster
        # (METADATA says so, or GOING_AWAY names a redirect) it is not
        # pinned to the address it dialled (see _refused).
        self._learned: list[str] = []  # nodes learned besides addr, oldest first
        self._target = addr  # what the next connect dials
        self._clustered: bool | None = None  # None until the broker said
        self._probes = 0
        self._probe_task: asyncio.Task[None] | None = None
        self._moving: asyncio.TimerHandle | None = None
        self._refusals = 0  # refusals since the last confirmed publish
        self._refused_by: dict[str, float] = {}  # when each node last refused a publish (monotonic s)
        # Spanning subscriptions (see _span): a part client is the connection
        # of one of them to one replica node, made with this client's options.
        self._spans: set[_span.Span] = set()
        self._part_of: _span.Span | None = None
        self._options = dict(client_name=client_name, credentials=credentials, user=user, reconnect=reconnect,
                             reconcile=reconcile, ssl=ssl, heartbeat_s=heartbeat_s, dial_timeout_s=dial_timeout_s,
                             handshake_timeout_s=handshake_timeout_s, drain_timeout_s=drain_timeout_s,
                             sleep=sleep, monotonic=monotonic, rand=rand, member_id=self.member_id)
        self.server_generation = 0
        """The broker process's generation at the last handshake."""
        self.last_outcome = 0
        """The resume outcome of the last handshake (0 new, 1 resumed, 2 not found, 3 rejected)."""

    # --- lifecycle -----------------------------------------------------------

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _notify(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    async def _open(self, connect_timeout_s: float) -> None:
        pol = self._policy
        failures = 0
        deadline = self._monotonic() + connect_timeout_s
        while True:
            try:
                await self._attempt()
                break
            except Exception as e:
                if not is_retryable(e):
                    log.warning("sinew: connect %s failed, not retryable: %s", self.addr, e)
                    raise
                failures += 1
                if pol.max_attempts and failures >= pol.max_attempts:
                    raise DisconnectedError(f"sinew: connect {self.addr}: {failures} attempts: {e}") from e
                d = pol.delay(failures - 1, self._rand())
                if self._monotonic() + d > deadline:
                    raise DisconnectedError(f"sinew: connect {self.addr}: out of time after "
                                            f"{failures} attempts: {e}") from e
                log.warning("sinew: connect %s failed, retrying in %.3fs: %s", self.addr, d, e)
                await self._sleep(d)
        self._supervisor = asyncio.create_task(self._supervise())

    async def _attempt(self) -> None:
        try:
            conn = await self._connect()
        except BaseException:
            self._notify()
            raise
        self._gave_up = None
        self._live = conn
        self._kick.clear()
        self._notify()

    async def _connect(self) -> _Conn:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self._host, self._port, ssl=self._ssl,
                                        server_hostname=self._host if self._ssl else None,
                                        limit=READ_BUFFER_BYTES),
                self._dial_timeout)
        except _ssl.SSLError as e:
            if is_retryable(e):
                raise
            raise self._tls_error(e) from e
        ident = self._identity
        try:
            hello = await asyncio.wait_for(self._handshake(reader, writer, ident), self._handshake_timeout)
        except _ssl.SSLError as e:
            # TLS 1.3 sends the verdict on the client's certificate after the
            # handshake, so it arrives while waiting for HELLO_OK.
            writer.transport.abort()
            if is_retryable(e):
                raise
            raise self._tls_error(e) from e
        except BaseException:
            writer.transport.abort()
            raise
        resumed = hello.outcome == 1 and ident.client_id != ""
        self._identity = hello.resume
        self.server_generation = hello.server_generation
        self.last_outcome = hello.outcome
        stale: list[_Call] = []
        if not resumed:
            self._epoch += 1
            stale, self._held = self._held, []  # their leases ended with the old session
            for s in self._subs:
                s._server_id = 0
                s._purge()
            if ident.client_id:
                log.warning("sinew: session not resumed (outcome %d); starting a fresh one", hello.outcome)
        subs = {s._server_id: s for s in self._subs if s._server_id}
        self._window.set_max(hello.limits.publish_inflight_max)
        self._frame_max = hello.limits.frame_bytes_max or w.FRAME_BYTES_DEFAULT
        for c in stale:
            c.fail(StaleDeliveryError("sinew: session was not resumed; the lease is gone"))
        conn = _Conn(self, reader, writer, hello, self._epoch, subs)
        self._conn = conn
        conn.run()
        try:
            await self._restore(conn, resumed)
        except BaseException as e:
            conn.close(e if isinstance(e, SinewError) else ConnectionLostError(repr(e)))
            await conn.wait_closed()
            if self._conn is conn:
                self._conn = None
            raise
        return conn

    def _tls_error(self, e: _ssl.SSLError) -> TLSError:
        """The TLSError for a handshake that failed with e, naming the likely cause."""
        where = f"sinew: connect {self._host}:{self._port}"
        if getattr(e, "reason", "") in ("WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE"):
            return ServerNotTLSError(f"{where}: the broker did not speak TLS (is it a plaintext port?): {e}")
        return TLSError(f"{where}: TLS handshake failed: {e}")

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         ident: w.ResumeIdentity) -> w.HelloOK:
        hello = w.Hello(w.VERSION, self._name, CLIENT_VERSION, self._credentials, ident, self._user)
        writer.write(w.encode_frame(hello, 1))
        await writer.drain()
        head = await reader.readexactly(16)
        n, _, op, _, _ = w.parse_header(head, w.FRAME_BYTES_DEFAULT)
        body = w.decode_body(op, await reader.readexactly(n))
        if isinstance(body, w.HelloOK):
            if body.protocol_version != w.VERSION:
                raise ProtocolError(f"sinew: broker chose protocol version {body.protocol_version}")
            return body
        if isinstance(body, w.ErrorBody):
            raise broker_error(body.code, body.message, body.owner)
        raise ProtocolError(f"sinew: {w.OP_NAMES.get(op, op)} in answer to HELLO")

    async def _round_trip(self, conn: _Conn, body: w.Body, hook: Callable[[Any], None] | None = None) -> Any:
        call = _Call(body, hook=hook)
        try:
            conn.start(call)
        except _ConnClosed:
            raise ConnectionLostError(f"sinew: connection lost: {conn.close_exc}") from None
        return await call.fut

    async def _restore(self, conn: _Conn, resumed: bool) -> None:
        if resumed:
            manual = [s for s in self._subs if not s.auto_ack]
            await self._reconcile(conn)
            await self._reconcile_inflight(conn, manual)
        for s in [s for s in self._subs if s._server_id == 0]:
            try:
                await self._subscribe_on(conn, s)
            except BrokerError as e:
                if s._recreating:
                    err: BaseException = RecreatedError(f"sinew: could not recreate subscription: {e}")
                    err.__cause__ = e
                else:
                    err = e
                s._finish(err)
        held, self._held = self._held, []
        for i, c in enumerate(held):
            try:
                conn.start(c)
            except _ConnClosed:
                self._held = held[i:] + self._held
                raise ConnectionLostError("sinew: connection lost while restoring") from None
        replay, self._replay = self._replay, []
        for i, c in enumerate(replay):
            try:
                conn.start(c)
            except _ConnClosed:
                self._replay = replay[i:] + self._replay
                raise ConnectionLostError("sinew: connection lost while restoring") from None
        await conn.drain()

    async def _reconcile(self, conn: _Conn) -> None:
        by_id = {s._server_id: s for s in self._subs if s._server_id}
        views = [s._view() for s in by_id.values()]
        # So that a subscription the broker recreates joins its cohort again.
        cohorts = [w.SubCohort(i, s.cohort, s.member_id) for i, s in by_id.items() if s.cohort]

        # Applied by the reader as soon as the result arrives, before any
        # DELIVER that follows it, so re-sends reach the right subscription.
        def hook(rr: Any) -> None:
            if not isinstance(rr, w.ReconcileResult):
                return
            for x in rr.entries:
                s = by_id.get(x.client_sub_id)
                if s is None or x.client_sub_id == 0:
                    continue
                if x.action == 1:  # keep
                    if x.server_sub_id and x.server_sub_id != s._server_id:
                        conn.subs.pop(s._server_id, None)
                        s._server_id = x.server_sub_id
                        conn.subs[s._server_id] = s
                elif x.action == 2:  # close client side
                    conn.subs.pop(s._server_id, None)
                    s._server_id = 0
                    s._finish(ReconciledClosedError(f"sinew: subscription closed by reconciliation: {x.reason}"))
                elif x.action == 4:  # recreate
                    conn.subs.pop(s._server_id, None)
                    if x.server_sub_id:
                        s._server_id = x.server_sub_id
                        conn.subs[s._server_id] = s
                    else:
                        s._server_id = 0
                        s._recreating = True

        reply = await self._round_trip(conn, w.Reconcile(self._reconcile_policy, views, True, cohorts), hook)
        if not isinstance(reply, w.ReconcileResult):
            raise ProtocolError("sinew: unexpected answer to RECONCILE")

    async def _reconcile_inflight(self, conn: _Conn, subs: list[Subscription]) -> None:
        entries = [w.InflightEntry(m.tag, m.lease) for s in subs for m in s._held.values()
                   if m._epoch == conn.epoch]
        try:
            reply = await self._round_trip(conn, w.Inflight(entries))
        except BrokerError as e:
            # A broker without INFLIGHT re-sends every unsettled delivery
            # instead; the subscriptions drop the ones they hold by tag.
            log.info("sinew: broker did not reconcile in-flight deliveries: %s", e)
            return
        if not isinstance(reply, w.InflightResult):
            raise ProtocolError("sinew: unexpected answer to INFLIGHT")
        stale = set(reply.stale)
        for s in subs:
            for tag in [t for t in s._held if t in stale]:
                s._held.pop(tag)._stale = True

    async def _supervise(self) -> None:
        pol = self._policy
        failures = 0
        while True:
            conn = self._live
            assert conn is not None
            connected_at = self._monotonic()
            planned = await self._watch(conn)
            if self._closing:
                return
            exc = conn.close_exc
            if self._live is conn:
                self._live = None
            if self._conn is conn:
                self._conn = None
            await conn.wait_closed()
            self._emit(StatusEvent(STATUS_DISCONNECTED, exc))
            if exc is not None and not is_retryable(exc):
                self._fail_fatal(exc)
                return
            if self._monotonic() - connected_at >= pol.reset_after_ms / 1000:
                failures = 0
            log.info("sinew: connection to %s lost (%s); reconnecting", self.addr, exc)
            immediate = planned
            while True:
                d = 0.0
                if not immediate:
                    d = pol.delay(failures, self._rand())
                    if planned:
                        d = min(d, GOING_AWAY_BACKOFF_MAX_S)
                self._emit(StatusEvent(STATUS_RECONNECTING, attempt=failures + 1, delay_ms=round(d * 1000)))
                if not immediate:
                    await self._sleep(d)
                    if self._closing:
                        return
                immediate = False
                try:
                    await self._attempt()
                    log.info("sinew: reconnected to %s", self.addr)
                    self._emit(StatusEvent(STATUS_RECONNECTED, resumed=self.last_outcome == 1))
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    if self._closing:
                        return
                    if not is_retryable(e):
                        self._fail_fatal(e)
                        return
                    failures += 1
                    log.info("sinew: reconnect attempt %d to %s failed: %s", failures, self._target, e)
                    self._rotate_target(failures)
                    if pol.max_attempts and failures >= pol.max_attempts:
                        self._give_up(DisconnectedError(
                            f"sinew: {self.addr}: gave up after {failures} attempts: {e}"))
                        await self._kick.wait()  # an operation asks for one fresh attempt
                        self._kick.clear()
                        immediate = True

    async def _watch(self, conn: _Conn) -> bool:
        """Waits until conn is finished. After GOING_AWAY, new operations wait
        for the next connection while work in flight finishes here; then the
        client closes conn itself. Returns whether that was a planned stop."""
        done = asyncio.create_task(conn.done.wait())
        away = asyncio.create_task(conn.going_away.wait())
        try:
            await asyncio.wait({done, away}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            done.cancel()
            away.cancel()
        if conn.closed and not conn.going_away.is_set():
            return False
        self._emit(StatusEvent(STATUS_GOING_AWAY))
        wait_s = max(0.0, min(conn.away_deadline_ms / 1000 - time.time(), GOING_AWAY_WAIT_MAX_S))
        until = time.monotonic() + wait_s
        going = BrokerError(CODE_SHUTTING_DOWN, "broker going away")
        while not conn.closed:
            if self._away_idle(conn) or time.monotonic() >= until:
                conn.close(going)
                break
            await asyncio.sleep(GOING_AWAY_POLL_S)
        return True

    def _away_idle(self, conn: _Conn) -> bool:
        if conn.pending or self._settling:
            return False
        return not any(m._epoch == conn.epoch for s in self._subs for m in s._held.values())

    def _orphaned(self, conn: _Conn, calls: list[_Call]) -> None:
        """Takes the requests of a connection that closed: publishes wait for
        the next connection, settles for the resumed session, the rest fail."""
        for c in calls:
            if c.fut.done():
                continue
            if self._closing or self._fatal is not None:
                c.fail(self._fatal or ClientClosedError("sinew: client closed"))
            elif c.kind == "publish":
                c.uncertain = True
                self._replay.append(c)
            elif c.kind == "settle":
                self._held.append(c)
            else:
                c.fail(ConnectionLostError(f"sinew: connection lost: {conn.close_exc}"))

    def _fail_fatal(self, exc: BaseException) -> None:
        log.error("sinew: fatal error, not reconnecting: %s", exc)
        self._fatal = exc
        self._live = None
        self._end_all(exc)
        self._notify()
        self._emit(StatusEvent(STATUS_CLOSED, exc))

    def _give_up(self, exc: BaseException) -> None:
        log.warning("sinew: %s", exc)
        self._gave_up = exc
        self._end_all(exc)
        self._notify()
        self._emit(StatusEvent(STATUS_DISCONNECTED, exc))

    def _end_all(self, exc: BaseException) -> None:
        for s in list(self._subs):
            s._finish(exc)
        calls = self._replay + self._held
        self._replay, self._held = [], []
        for c in calls:
            c.fail(exc)

    async def _acquire(self, for_settle: bool = False) -> _Conn:
        """The connection for a new operation, waiting while the client reconnects."""
        kicked = False
        while True:
            if self._closing:
                raise ClientClosedError("sinew: client closed")
            if self._fatal is not None:
                raise self._fatal
            c = self._live
            if c is not None and not c.closed and (for_settle or not c.draining):
                return c
            wake = self._wake
            if self._gave_up is not None:
                if kicked:
                    err = NotConnectedError(f"sinew: not connected: {self._gave_up}")
                    err.__cause__ = self._gave_up
                    raise err
                kicked = True
                self._kick.set()
            await wake.wait()

    # --- operations ------------------------------------------------------------

    async def publish(self, topic: str, body: bytes | str, *, group: str = "", partition: int = -1,
                      key: bytes = b"", headers: Mapping[str, str] | Iterable[tuple[str, str]] = (),
                      content_type: str = "", delay_ms: int = 0, not_before_ms: int = 0,
                      ttl_ms: int = 0) -> PublishResult:
        """Publishes one message and returns once the broker has it on disk.

        Each publish carries this client's producer id and a new sequence, so
        one resent after a reconnect is stored once: a resend that finds the
        original answers with its position and ``duplicate=True``. Cut-off
        publishes are resent automatically; this call does not fail because a
        connection broke.

        A publish with no ``key`` and no ``partition`` goes to the partition
        the broker hinted in its answer to the last one to the queue (the
        less loaded of two), explicitly, so its resends keep it; without a
        hint the broker places it by its hash.
        """
        # Every argument is checked and encoded before anything changes: a
        # bad one raises InvalidArgumentError here and leaves no trace.
        if self._closing:
            raise ClientClosedError("sinew: client closed")
        if self._fatal is not None:
            raise self._fatal
        _check_str("topic", topic)
        data = _bytes_arg("body", body)
        _check_str("group", group)
        _check_int("partition", partition, -1, _I32_MAX)
        key_b = _bytes_arg("key", key)
        hs = _headers_arg(headers) if headers != () else []
        _check_str("content_type", content_type)
        _check_int("delay_ms", delay_ms, 0, _I64_MAX)
        _check_int("not_before_ms", not_before_ms, 0, _I64_MAX)
        _check_int("ttl_ms", ttl_ms, 0, _I64_MAX)
        # A keyless publish goes to the partition the broker hinted in its
        # answer to the last one to this queue, explicitly (docs/protocol.md
        # 5.6, "Partition hints"): its resends keep the partition, so the
        # broker's deduplication holds. Without a hint the broker hashes it.
        hkey = (topic, group)
        hinted = False
        if partition == -1 and not key_b:
            h = self._hints.get(hkey)
            if h is not None:
                partition, hinted = h, True
        ck = (topic, group, partition, key_b, content_type, delay_ms, not_before_ms, ttl_ms) if not hs else None
        head_b = self._heads.get(ck) if ck is not None else None
        if head_b is None:
            head_b = self._publish_head(topic, group, partition, key_b, hs, content_type, delay_ms,
                                        not_before_ms, ttl_ms)
        if 16 + len(head_b) + 20 + len(data) > self._frame_max:
            raise InvalidArgumentError("body", f"a message of {len(data)} bytes exceeds the broker's frame "
                                               f"limit of {self._frame_max} bytes")
        self._probe(topic, group)
        call = _Call(None, kind="publish", nbytes=len(data))
        call.head, call.data = head_b, data
        win = self._window
        if not win._waiters and win._room(len(data)):  # room: no coroutine
            win.n += 1
            win.bytes += len(data)
        else:
            await win.acquire(len(data))
        try:
            self._producer_seq += 1
            call.seq = self._producer_seq
            while True:
                while True:
                    conn = self._live
                    if conn is None or conn.closed or conn.draining or self._closing or self._fatal is not None:
                        conn = await self._acquire()
                    try:
                        conn.start(call)
                        break
                    except _ConnClosed:
                        continue
                if conn.backlogged():
                    await conn.drain()
                try:
                    ok = await call.fut
                    break
                except BrokerError as e:
                    if not hinted or e.code != CODE_NOT_FOUND or call.uncertain:
                        raise
                # The hinted partition is gone (the queue was deleted and
                # declared again with fewer) and no send of it was cut off
                # (one could have reached a node that stored it): the
                # publish goes again, under the same sequence and window
                # slot, without a partition, and the hint is dropped.
                hinted = False
                self._hints.pop(hkey, None)
                again = _Call(None, kind="publish", nbytes=len(data))
                again.head = self._publish_head(topic, group, -1, key_b, hs, content_type, delay_ms,
                                                not_before_ms, ttl_ms)
                again.seq, again.data = call.seq, data
                call = again
        finally:
            self._window.release(len(data))
        self._refusals = 0
        if not key_b:
            nxt = ok.next
            if 0 < nxt <= _I32_MAX and (hkey in self._hints or len(self._hints) < HINTS_MAX):
                self._hints[hkey] = nxt - 1  # the usual case of _note_hint, written out
            else:
                self._note_hint(hkey, nxt)
        return PublishResult(ok.partition, ok.offset, ok.duplicate)

    def _publish_head(self, topic: str, group: str, partition: int, key_b: bytes, hs: list[tuple[str, str]],
                      content_type: str, delay_ms: int, not_before_ms: int, ttl_ms: int) -> bytes:
        """The fields of a publish before producer_seq, encoded once per
        distinct set (a publisher usually repeats them)."""
        ck = (topic, group, partition, key_b, content_type, delay_ms, not_before_ms, ttl_ms) if not hs else None
        head_b = self._heads.get(ck) if ck is not None else None
        if head_b is None:
            head = bytearray()
            w.Publish(topic, group, partition, key_b, hs, content_type, delay_ms, not_before_ms, ttl_ms,
                      self._producer_id).encode_head(head)
            head_b = bytes(head)
            if ck is not None:
                if len(self._heads) >= PUBLISH_HEADS_CACHED:
                    self._heads.clear()
                self._heads[ck] = head_b
        return head_b

    def _note_hint(self, hkey: tuple[str, str], nxt: int) -> None:
        """Keeps the partition hint of the answer to a keyless publish: nxt
        is PUBLISH_OK's next (1 + the partition; 0, none, drops the hint)."""
        hints = self._hints
        if nxt == 0 or nxt > _I32_MAX:
            hints.pop(hkey, None)
            return
        if len(hints) >= HINTS_MAX and hkey not in hints:
            hints.clear()
        hints[hkey] = nxt - 1

    # --- cluster routing -------------------------------------------------------

    def _learn(self, *addrs: str) -> None:
        for a in addrs:
            if not a or a == self.addr or a in self._learned:
                continue
            if len(self._learned) >= LEARNED_MAX:
                self._learned.pop(0)
            self._learned.append(a)

    def _rotate_target(self, failures: int) -> None:
        """In a cluster, after two failed attempts in a row at the node it
        dials, the next attempt goes to the next node it knows: a node that
        died is not redialled for ever while the others serve (its session is
        lost with it; a node that only dropped the socket is back at the
        first redial, and its session resumes)."""
        if self._clustered is not True or not self._learned or failures % 2:
            return
        nodes = [self.addr, *self._learned]
        i = nodes.index(self._target) if self._target in nodes else -1
        nxt = nodes[(i + 1) % len(nodes)]
        log.info("sinew: %s does not answer; trying %s", self._target, nxt)
        self._set_target(nxt)

    def _set_target(self, addr: str) -> None:
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit():
            return  # not host:port: ignored
        self._target = addr
        self._host, self._port = host.strip("[]"), int(port)

    def _probe(self, topic: str, group: str) -> None:
        """Asks the broker in the background, once, whether it is clustered,
        and learns the nodes holding the queue's replicas."""
        if self._clustered is not None or self._probes >= PROBES_MAX or self._closing:
            return
        if self._probe_task is not None and not self._probe_task.done():
            return
        conn = self._conn
        if conn is not None and not conn.hello.cluster:
            # HELLO_OK said the node runs alone: nothing to ask.
            self._clustered = False
            return
        self._probes += 1
        self._probe_task = asyncio.get_running_loop().create_task(self._probe_once(topic, group))

    async def _probe_once(self, topic: str, group: str) -> None:
        try:
            md = await asyncio.wait_for(self._request(w.Metadata(topic, group)), 5.0)
        except BrokerError as e:
            if e.code == _CODE_UNKNOWN_OP:
                self._clustered = False
            return
        except (SinewError, asyncio.TimeoutError, ConnectionError, OSError):
            return
        self._clustered = bool(md.cluster)
        if md.cluster:
            for pm in md.partitions:
                self._learn(pm.owner, *pm.replicas)
            log.info("sinew: %s is clustered; %d nodes known", self.addr, 1 + len(self._learned))

    def _redirect(self, addr: str) -> None:
        self._clustered = True
        self._learn(addr)
        self._set_target(addr)

    def _refused(self, conn: _Conn, call: _Call, body: w.ErrorBody, err: BaseException) -> bool:
        """A cluster node refused a publish (unavailable, fenced, not_owner):
        keeps it for the next connection and moves the connection, after a
        short pause, to the owner named or else the next known node, where
        it is sent again under the same producer sequence (stored once).
        False when the refusal is the publish's outcome (a single broker's,
        nowhere else to go, or past MOVE_BUDGET_S). While the broker has not
        said yet whether it is clustered, the publish waits for that answer
        and fails with err if it is not."""
        if self._closing or body.code not in (_CODE_UNAVAILABLE, _CODE_FENCED, CODE_NOT_OWNER):
            return False
        probe = self._probe_task
        if self._clustered is None and probe is not None and not probe.done():
            def decide(_: object) -> None:
                if not self._refused(conn, call, body, err):
                    call.fail(err)
            probe.add_done_callback(decide)
            return True
        if self._clustered is not True:
            return False
        owner = body.owner if body.code == CODE_NOT_OWNER else ""
        if not owner and not self._learned:
            return False
        now = self._monotonic()
        first = call.refused_at
        if first is None:
            call.refused_at = first = now
        if now - first > MOVE_BUDGET_S:
            return False
        if not owner:
            self._refused_by.pop(self._target, None)
            self._refused_by[self._target] = now
            if len(self._refused_by) > LEARNED_MAX + 1:
                self._refused_by.pop(next(iter(self._refused_by)))
        self._replay.append(call)
        self._replay.sort(key=lambda c: getattr(c, "seq", 0))
        self._move_off(conn, owner)
        return True

    def _move_off(self, conn: _Conn, owner: str) -> None:
        if self._moving is not None or self._live is not conn or conn.closed:
            return
        now = self._monotonic()

        def fresh(a: str) -> bool:
            at = self._refused_by.get(a)
            return at is None or now - at >= SHUN_S

        nodes = [self.addr, *self._learned]
        nxt = owner if owner and owner != self._target and fresh(owner) else ""
        if nxt:
            self._learn(nxt)
        else:
            i = nodes.index(self._target) if self._target in nodes else -1
            order = nodes[i + 1:] + nodes[:i + 1]
            nxt = next((a for a in order if a != self._target and fresh(a)), order[0])
        pause = min(MOVE_PAUSE_MIN_S * 2 ** min(self._refusals, 10), MOVE_PAUSE_MAX_S)
        self._refusals += 1
        log.info("sinew: leaving %s, which refused a publish, for %s in %.3fs", self._target, nxt, pause)

        def move() -> None:
            self._moving = None
            if self._closing or self._live is not conn or conn.closed:
                return
            self._set_target(nxt)
            conn.close(ConnectionLostError(f"sinew: leaving a node that refused a publish for {nxt}"))

        self._moving = asyncio.get_running_loop().call_later(pause, move)

    async def _request(self, body: w.Body) -> Any:
        body.encode()  # checks every field (InvalidArgumentError) before anything happens
        conn = await self._acquire()
        return await self._round_trip(conn, body)

    async def declare_queue(self, topic: str, *, group: str = "", partitions: int = 0,
                            dead_letter_mode: int = DEAD_LETTER_DEFAULT, dead_letter_target: str = "",
                            max_retries: int = -1, default_ttl_ms: int = 0, lease_ms: int = 0) -> DeclareResult:
        """Creates a queue or changes its settings (section 5.5 of the protocol).
        A connection lost meanwhile raises ConnectionLostError (retryable)."""
        _check_str("topic", topic)
        _check_str("group", group)
        _check_int("partitions", partitions, 0, _U32_MAX)
        _check_int("dead_letter_mode", dead_letter_mode, DEAD_LETTER_DEFAULT, DEAD_LETTER_QUEUE)
        _check_str("dead_letter_target", dead_letter_target)
        _check_int("max_retries", max_retries, -1, _I32_MAX)
        _check_int("default_ttl_ms", default_ttl_ms, 0, _I64_MAX)
        _check_int("lease_ms", lease_ms, 0, _I64_MAX)
        ok = await self._request(w.DeclareQueue(topic, group, partitions, dead_letter_mode, dead_letter_target,
                                                max_retries, default_ttl_ms, lease_ms))
        return DeclareResult(ok.partitions, ok.created)

    async def delete_queue(self, topic: str, *, group: str = "") -> None:
        """Deletes a queue and everything in it; its subscriptions end with not_found."""
        await self._request(w.DeleteQueue(topic, group))

    async def purge_queue(self, topic: str, *, group: str = "") -> int:
        """Discards the queue's queued messages; returns how many."""
        ok = await self._request(w.PurgeQueue(topic, group))
        return int(ok.purged)

    async def subscribe(self, topic: str, *, group: str = "", partition: int = -1, prefetch: int = 0,
                        auto_ack: bool = False, cohort: str | None = None,
                        member_id: str | None = None) -> Subscription:
        """Subscribes to a queue. The subscription survives reconnects: it is
        kept on a resumed session and made again on a fresh one.

        With ``cohort`` it joins that cohort (consumer group): the queue's
        partitions are shared among the cohort's members, each delivered to
        one member at a time, in offset order (see :meth:`Subscription.assignments`).
        ``member_id`` defaults to the client's :attr:`Client.member_id`. Both
        are 1 to 128 characters of ``A-Z a-z 0-9 . _ : -``; anything else,
        or a ``member_id`` without a ``cohort``, raises InvalidArgumentError,
        as does a ``member_id`` other than the one this client's live cohort
        subscriptions use (a broker session holds one member id)."""
        _check_str("topic", topic)
        _check_str("group", group)
        _check_int("partition", partition, -1, _I32_MAX)
        _check_int("prefetch", prefetch, 0, _U32_MAX)
        if not isinstance(auto_ack, bool):
            raise InvalidArgumentError("auto_ack", f"want a bool, got {auto_ack!r}")
        if cohort is not None:
            _check_cohort_name("cohort", cohort)
        if member_id is not None:
            _check_cohort_name("member_id", member_id)
            if cohort is None:
                raise InvalidArgumentError("member_id", "a member id needs a cohort")
        member = "" if cohort is None else (member_id if member_id is not None else self.member_id)
        if member:
            # A broker session uses one member id: refuse a second one here
            # rather than have the broker refuse it (bad_request).
            for other in self._subs:
                if other.member_id and other.member_id != member:
                    raise InvalidArgumentError("member_id", f"this client's cohort subscriptions are member "
                                                            f"{other.member_id!r}; a session uses one member id")
        if self._part_of is None:
            conn = await self._acquire()
            if conn.hello.cluster:
                # In a cluster: a subscription on every node that holds a
                # replica of the queue, so that every partition is delivered.
                s = Subscription(self, topic, group, partition, prefetch, auto_ack, cohort or "", member)
                if await _span.subscribe_span(self, s) is not None:
                    return s
        return await self._subscribe_here(topic, group, partition, prefetch, auto_ack, cohort or "", member)

    async def _subscribe_here(self, topic: str, group: str, partition: int, prefetch: int, auto_ack: bool,
                              cohort: str, member: str) -> Subscription:
        """Subscribes on this client's own connection."""
        s = Subscription(self, topic, group, partition, prefetch, auto_ack, cohort, member)
        while True:
            conn = await self._acquire()
            try:
                await self._subscribe_on(conn, s)
                return s
            except ConnectionLostError:
                # The reply was lost with the socket; if the broker made the
                # subscription, reconciliation on resume drops it.
                continue

    async def _subscribe_on(self, conn: _Conn, s: Subscription) -> None:
        body = w.Subscribe(s.topic, s.group, s.partition, 1 if s.auto_ack else 0, s.prefetch, s.cohort, s.member_id)

        def hook(ok: Any) -> None:  # registered before the first DELIVER is read
            if isinstance(ok, w.SubscribeOK):
                s._server_id = ok.sub_id
                s.prefetch = ok.prefetch
                s._recreating = False
                conn.subs[ok.sub_id] = s
                self._subs.add(s)

        await self._round_trip(conn, body, hook)

    def _part_client(self, addr: str, span: _span.Span) -> Client:
        """A client with this one's options, for one part of span on the node at addr."""
        c = Client(addr, **self._options)
        c._part_of = span
        return c

    async def _unsubscribe(self, s: Subscription) -> None:
        if s._span is not None:
            if s._end is None:
                s._finish(UnsubscribedError("sinew: unsubscribed"))
            await s._span.close()
            return
        if s._end is not None:
            return
        conn = self._live
        sid, s._server_id = s._server_id, 0
        # Ended here first: deliveries that arrive meanwhile are dropped (the
        # broker takes them back) and a reconnect does not restore it.
        s._finish(UnsubscribedError("sinew: unsubscribed"))
        if conn is None or not sid or conn.closed:
            return  # a resumed session drops it in reconciliation
        # Settles made before this call reach the broker first, so that it
        # takes back only what is still unsettled. One turn of the loop lets
        # a settle just scheduled as a task (not awaited) join the queue.
        await asyncio.sleep(0)
        if conn.closed:
            return  # a resumed session drops it in reconciliation
        self._send_settles(conn)
        try:
            await self._round_trip(conn, w.Unsubscribe(sid))
        except ConnectionLostError:
            pass  # a resumed session drops it in reconciliation
        finally:
            conn.subs.pop(sid, None)

    def _sub_closed(self, conn: _Conn, b: w.SubClosed) -> None:
        s = conn.subs.pop(b.sub_id, None)
        if s is None:
            return
        s._server_id = 0
        if b.reason == 5:
            return  # broker shutdown: made again on the next connection
        if b.reason == 1:
            s._finish(UnsubscribedError("sinew: unsubscribed"))
        elif b.reason == 2:
            s._finish(ReconciledClosedError(f"sinew: subscription closed by reconciliation: {b.message}"))
        elif b.reason == 3:
            s._finish(QueueDeletedError(b.message))
        else:
            s._finish(broker_error(b.code or CODE_INTERNAL, b.message))

    def _settle(self, m: Message, kind: int, delay_ms: int, confirmed: bool, direct: bool = False) -> Awaitable[None]:
        """Queues a settle and returns what the caller awaits: nothing to wait
        for, or with ``confirmed`` the settle's outcome. Refusals known at the
        call (a bad delay, settled before, a lease the client knows is gone, a
        closed client) raise where the result is awaited and queue nothing.
        Not a coroutine, so a fast settle costs no coroutine or future."""
        try:
            _check_int("delay_ms", delay_ms, 0, _I64_MAX)
            if not isinstance(confirmed, bool):
                raise InvalidArgumentError("confirmed", f"want a bool, got {confirmed!r}")
            if m._settled and not direct:
                raise AlreadySettledError("sinew: message already settled" +
                                          (" (auto-ack subscription)" if m._sub.auto_ack else ""))
            sp = self._part_of
            if sp is not None and not direct:
                # A delivery of a spanning subscription: settled through
                # it, so that it follows the partition's owner.
                if sp.parent._closing or sp.stopped:
                    raise ClientClosedError("sinew: client closed")
                m._settled = True
                sfut: asyncio.Future[None] | None = asyncio.get_running_loop().create_future() if confirmed else None
                sp.settle(m, kind, delay_ms, sfut)
                return _DONE if sfut is None else sfut
            if m._stale or m._epoch != self._epoch:
                raise StaleDeliveryError("sinew: the delivery's lease is no longer held")
            if self._closing:
                raise ClientClosedError("sinew: client closed")
            if self._fatal is not None:
                raise self._fatal
        except Exception as e:
            return _Failed(e)
        m._settled = True
        fut: asyncio.Future[None] | None = asyncio.get_running_loop().create_future() if confirmed else None
        self._settle_q.append((m, kind, delay_ms, fut))
        self._settling += 1
        if not self._settle_scheduled:
            self._settle_scheduled = True
            asyncio.get_running_loop().call_soon(self._kick_settles)
        return _DONE if fut is None else fut

    def _settle_done(self, m: Message, fut: asyncio.Future[None] | None, code: int,
                     exc: BaseException | None) -> None:
        """Applies the outcome of one settle: a broker code, or an exception
        that failed the whole frame. Called once per settle."""
        self._settling -= 1
        err: BaseException | None = None
        if exc is not None:
            err = exc
            if isinstance(exc, StaleDeliveryError):
                m._sub._held.pop(m.tag, None)
            else:
                m._settled = False  # e.g. the client gave up reconnecting: may be settled again
        elif code == 0:
            m._sub._held.pop(m.tag, None)
        elif code == CODE_STALE_LEASE:
            m._sub._held.pop(m.tag, None)
            err = StaleDeliveryError("sinew: broker: stale_lease")
        elif code == CODE_UNKNOWN_TAG:
            m._sub._held.pop(m.tag, None)
            err = UnknownTagError("sinew: broker: unknown_tag")
        else:
            m._settled = False  # e.g. a NACK delay above the cap: the lease is still held
            err = broker_error(code, "settle refused")
        if fut is not None:
            if fut.done():
                return
            if err is None:
                fut.set_result(None)
            else:
                fut.set_exception(err)
        elif err is not None:
            self._settle_failed(m, err)

    def _settle_failed(self, m: Message, err: BaseException) -> None:
        """Reports a fast settle that failed: the ``sinew`` logger and the
        ``on_settle_error`` callback."""
        log.warning("sinew: settle of %s partition %d offset %d failed: %s", m.topic, m.partition, m.offset, err)
        if self._on_settle_error is not None and isinstance(err, SinewError):
            try:
                self._on_settle_error(m, err)
            except Exception:
                log.exception("sinew: on_settle_error raised")

    def _kick_settles(self) -> None:
        """Sends the settles queued this turn on the live connection, or
        leaves them to a task that waits for one."""
        self._settle_scheduled = False
        if not self._settle_q:
            return
        c = self._live
        if c is not None and not c.closed and self._settle_task is None:
            self._send_settles(c)
            return
        if self._settle_task is None:
            self._settle_task = asyncio.create_task(self._flush_settles())

    async def _flush_settles(self) -> None:
        """Waits for a connection (the client is reconnecting) and sends the
        queued settles on it."""
        try:
            while self._settle_q:
                try:
                    conn = await self._acquire(for_settle=True)
                except BaseException as e:
                    items, self._settle_q = self._settle_q, []
                    for m, _, _, f in items:
                        self._settle_done(m, f, 0, e)
                    if isinstance(e, asyncio.CancelledError):
                        raise
                    continue
                self._send_settles(conn)
                await conn.drain()
        finally:
            self._settle_task = None

    def _send_settles(self, conn: _Conn) -> None:
        """Starts the queued settles on conn: one frame per op and delay, of
        up to the broker's settle_batch_max tags."""
        items, self._settle_q = self._settle_q, []
        if not items:
            return
        batch_max = conn.hello.limits.settle_batch_max or SETTLE_BATCH_DEFAULT
        groups: dict[tuple[int, int], list[tuple[Message, asyncio.Future[None] | None]]] = {}
        for m, kind, delay, f in items:
            if m._epoch != self._epoch:
                self._settle_done(m, f, 0, StaleDeliveryError("sinew: session was not resumed; the lease is gone"))
                continue
            groups.setdefault((kind, delay), []).append((m, f))
        for (kind, delay), group in groups.items():
            for i in range(0, len(group), batch_max):
                chunk = group[i:i + batch_max]
                # The lease_refs as their DELIVERs encoded them, no LeaseRef objects.
                body = w.Settle([m.tag for m, _ in chunk], delay, [], kind,
                                leases_raw=[m._lease_raw for m, _ in chunk])
                call = _Call(body, kind="settle")
                call.fut.add_done_callback(self._batch_done(chunk))
                try:
                    conn.start(call)
                except _ConnClosed:
                    self._orphaned(conn, [call])  # held for the resumed session

    def _batch_done(self, chunk: list[tuple[Message, asyncio.Future[None] | None]]
                    ) -> Callable[[asyncio.Future[Any]], None]:
        """Hands each settle of a frame its own code from the frame's result."""

        def done(call: asyncio.Future[Any]) -> None:
            if call.cancelled():
                exc: BaseException | None = ClientClosedError("sinew: settle cancelled")
                codes: list[int] = []
            else:
                exc = call.exception()
                codes = [] if exc is not None else call.result().codes
            if exc is None and len(codes) == len(chunk):
                for (m, f), code in zip(chunk, codes):
                    if code == 0 and f is None:  # the usual outcome, applied inline
                        self._settling -= 1
                        m._sub._held.pop(m.tag, None)
                    else:
                        self._settle_done(m, f, code, None)
                return
            for i, (m, f) in enumerate(chunk):
                self._settle_done(m, f, codes[i] if exc is None and i < len(codes) else CODE_INTERNAL, exc)

        return done

    async def _extend(self, m: Message, extend_ms: int, direct: bool = False) -> None:
        _check_int("extend_ms", extend_ms, 1, _I64_MAX)
        if m._sub.auto_ack:
            raise AlreadySettledError("sinew: message already settled (auto-ack subscription)")
        if m._settled:
            raise AlreadySettledError("sinew: message already settled")
        sp = self._part_of
        if sp is not None and not direct:
            # A delivery of a spanning subscription: extended through it,
            # so that the extension follows the partition's owner.
            if sp.parent._closing or sp.stopped:
                raise ClientClosedError("sinew: client closed")
            await sp.extend(m, extend_ms)
            return
        if m._stale or m._epoch != self._epoch:
            raise StaleDeliveryError("sinew: the delivery's lease is no longer held")
        body = w.Extend([m.tag], extend_ms, [m.lease])
        call = _Call(body, kind="settle")  # cut off, it is held and sent again on the resumed session
        while True:
            conn = await self._acquire(for_settle=True)
            if m._epoch != self._epoch:
                raise StaleDeliveryError("sinew: session was not resumed; the lease is gone")
            try:
                conn.start(call)
                break
            except _ConnClosed:
                continue
        res = await call.fut
        code = res.codes[0] if res.codes else CODE_INTERNAL
        if code == 0:
            return
        if code == CODE_STALE_LEASE:
            raise StaleDeliveryError("sinew: broker: stale_lease")
        if code == CODE_UNKNOWN_TAG:
            raise UnknownTagError("sinew: broker: unknown_tag")
        raise broker_error(code, "extend refused")

    # --- connection status -------------------------------------------------------

    def status(self) -> StatusStream:
        """The client's connection events from now on, as an async iterator
        of :class:`StatusEvent`::

            async for ev in client.status():
                print(ev.type, ev.error)

        Bounded (the oldest of more than 64 unread events are dropped);
        leaving the loop unregisters it. After close() it yields ``"closed"``
        and stops."""
        st = StatusStream(self)
        if self._closed.is_set() or self._fatal is not None:
            st._push(StatusEvent(STATUS_CLOSED, self._fatal))
        else:
            self._status_streams.add(st)
        return st

    def _emit(self, ev: StatusEvent) -> None:
        if self._on_status is not None:
            try:
                self._on_status(ev)
            except Exception:
                log.exception("sinew: on_status raised")
        for st in list(self._status_streams):
            st._push(ev)

    async def close(self) -> None:
        """Waits (bounded) for pending confirms and settles, ends the session
        with END_SESSION so unsettled deliveries go back at once, and closes."""
        if self._close_started:
            await self._closed.wait()  # the first call finishes the job
            return
        self._close_started = True
        if self._spans:
            # Settles made before the close go out first; then every part's
            # connection closes.
            await asyncio.gather(*(sp.close() for sp in list(self._spans)), return_exceptions=True)
        if self._moving is not None:
            self._moving.cancel()
            self._moving = None
        if self._probe_task is not None and not self._probe_task.done():
            self._probe_task.cancel()
        try:
            await self._close()
        finally:
            self._closed.set()

    async def _close(self) -> None:
        until = time.monotonic() + self._drain_timeout
        while (self._window.n or self._settling) and time.monotonic() < until and self._fatal is None:
            await asyncio.sleep(GOING_AWAY_POLL_S)
        self._closing = True
        self._notify()
        conn = self._live
        if conn is not None and not conn.closed:
            try:
                await asyncio.wait_for(self._round_trip(conn, w.EndSession()), END_SESSION_TIMEOUT_S)
            except (SinewError, asyncio.TimeoutError, OSError):
                pass
        if self._supervisor is not None:
            self._supervisor.cancel()
            try:
                await self._supervisor
            except (asyncio.CancelledError, Exception):
                pass
        for c in (self._live, self._conn):
            if c is not None:
                c.close(ClientClosedError("sinew: client closed"))
                await c.wait_closed()
        self._live = self._conn = None
        self._end_all(ClientClosedError("sinew: client closed"))
        if self._fatal is None:
            self._emit(StatusEvent(STATUS_CLOSED))


async def connect(addr: str, *, client_name: str = "sinew-python", credentials: str = "", user: str = "",
                  reconnect: ReconnectPolicy | None = None, reconcile: int = RECONCILE_RESTORE,
                  ssl: _ssl.SSLContext | None = None, heartbeat_ms: int | None = None,
                  connect_timeout_ms: int | None = None, dial_timeout_ms: int | None = None,
                  handshake_timeout_ms: int | None = None, drain_timeout_ms: int | None = None,
                  on_status: Callable[[StatusEvent], None] | None = None,
                  on_settle_error: Callable[[Message, SinewError], None] | None = None,
                  member_id: str | None = None,
                  sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                  monotonic: Callable[[], float] = time.monotonic,
                  rand: Callable[[], float] = random.random,
                  heartbeat_s: float | None = None, connect_timeout_s: float | None = None,
                  dial_timeout_s: float | None = None, handshake_timeout_s: float | None = None,
                  drain_timeout_s: float | None = None) -> Client:
    """Connects to the broker at ``addr`` ("host:port") and returns a Client.

    Retryable failures (refused, reset, ``shutting_down`` ...) are retried with
    the reconnect policy's backoff; once the next sleep would end more than
    ``connect_timeout_ms`` after the call began, connect raises
    DisconnectedError instead (each attempt is bounded by the dial and
    handshake timeouts on top of that). A fatal one
    (``auth_failed``, a protocol violation) raises at once. ``sleep``
    (seconds, as ``asyncio.sleep``), ``monotonic`` and ``rand`` drive the
    backoff and exist so tests need not wait real seconds. Use it as
    ``async with await sinew.connect(addr) as c``.

    ``credentials`` is a static token (``auth.tokens`` on the broker), or, with
    ``user`` set, that user's password. A wrong one raises ``auth_failed``
    (after the broker's one-second delay) and is not retried.

    Durations are integers of milliseconds. ``heartbeat_s``,
    ``connect_timeout_s``, ``dial_timeout_s``, ``handshake_timeout_s`` and
    ``drain_timeout_s`` (float seconds) are deprecated aliases: they still
    work and warn with a DeprecationWarning.

    ``on_status`` is called (on the event loop; it must not block) with every
    :class:`StatusEvent`; ``on_settle_error`` with every fast settle that
    failed (see :class:`Message`).

    ``member_id`` is the member id of the client's cohort subscriptions (the
    Go SDK's ``WithMemberID``): 1 to 128 characters of ``A-Z a-z 0-9 . _ : -``;
    by default a random one, drawn once per client and kept across reconnects.
    """
    _check_str("addr", addr)
    for name, v in (("client_name", client_name), ("credentials", credentials), ("user", user)):
        _check_str(name, v)
    if reconnect is not None and not isinstance(reconnect, ReconnectPolicy):
        raise InvalidArgumentError("reconnect", f"want a ReconnectPolicy, got {reconnect!r}")
    if reconcile not in (RECONCILE_CONSERVATIVE, RECONCILE_RESTORE) or isinstance(reconcile, bool):
        raise InvalidArgumentError("reconcile", f"want RECONCILE_CONSERVATIVE or RECONCILE_RESTORE, got {reconcile!r}")
    if member_id is not None:
        _check_cohort_name("member_id", member_id)
    if ssl is not None and not isinstance(ssl, _ssl.SSLContext):
        raise InvalidArgumentError("ssl", f"want an ssl.SSLContext, got {ssl!r}")
    for name, cb in (("on_status", on_status), ("on_settle_error", on_settle_error)):
        if cb is not None and not callable(cb):
            raise InvalidArgumentError(name, f"want a callable, got {cb!r}")
    heartbeat = _ms_arg("heartbeat_ms", heartbeat_ms, "heartbeat_s", heartbeat_s, 0)
    connect_timeout = _ms_arg("connect_timeout_ms", connect_timeout_ms, "connect_timeout_s", connect_timeout_s,
                              CONNECT_TIMEOUT_MS)
    dial_timeout = _ms_arg("dial_timeout_ms", dial_timeout_ms, "dial_timeout_s", dial_timeout_s, DIAL_TIMEOUT_MS)
    handshake_timeout = _ms_arg("handshake_timeout_ms", handshake_timeout_ms, "handshake_timeout_s",
                                handshake_timeout_s, HANDSHAKE_TIMEOUT_MS)
    drain_timeout = _ms_arg("drain_timeout_ms", drain_timeout_ms, "drain_timeout_s", drain_timeout_s,
                            DRAIN_TIMEOUT_MS)
    c = Client(addr, client_name=client_name, credentials=credentials, user=user,
               reconnect=reconnect or ReconnectPolicy(),
               reconcile=reconcile, ssl=ssl, heartbeat_s=heartbeat / 1000, dial_timeout_s=dial_timeout / 1000,
               handshake_timeout_s=handshake_timeout / 1000, drain_timeout_s=drain_timeout / 1000, sleep=sleep,
               monotonic=monotonic, rand=rand, on_status=on_status, on_settle_error=on_settle_error,
               member_id=member_id)
    await c._open(connect_timeout / 1000)
    return c
