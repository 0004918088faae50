"""Spanning subscriptions: one subscription over every node of a cluster.

In a cluster each partition of a queue is served by its owner, one of the
nodes holding a replica; the owner changes when a node fails. A spanning
subscription holds one subscription on every replica node (a part), each on
its own connection to that node (a part client, which reconnects and resumes
as any client does): only the owner delivers, and a replica that becomes the
owner starts delivering to the subscription it already holds. The parts'
deliveries are merged into the one subscription the application iterates.

A settle goes to the node that delivered the message. When that node is gone,
answers ``fenced`` or ``not_owner``, or has not answered within
SETTLE_HEDGE_AFTER_S, the settle is sent again to the partition's current
owner by its lease reference (partition, offset, lease id, epoch) on the part
held there (tag 0, protocol section 5.9): the new owner has the lease in its
replicated state, so the settle applies as it would have at the old owner.
The application sees one outcome.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
import logging
from typing import TYPE_CHECKING, Any

from . import _wire as w
from .errors import (
    CODE_NOT_FOUND,
    CODE_NOT_OWNER,
    CODE_SHUTTING_DOWN,
    CODE_STALE_LEASE,
    BrokerError,
    ClientClosedError,
    ConnectionLostError,
    DisconnectedError,
    HeartbeatTimeoutError,
    NotConnectedError,
    QueueDeletedError,
    SinewError,
    StaleDeliveryError,
    UnsubscribedError,
    broker_error,
)

if TYPE_CHECKING:
    from .client import Client, Message, Subscription

log = logging.getLogger("sinew")

# Bounds of a spanning subscription.
SPAN_REFRESH_EVERY_S = 2.0  # the replica set is read again this often
SPAN_PARTS_MAX = 64  # nodes one spanning subscription subscribes on
RESETTLE_HOPS_MAX = 64  # sends of one settle after its node was lost (about 30 s with the backoff)
RESETTLE_BACKOFF_MIN_S = 0.02
RESETTLE_BACKOFF_MAX_S = 0.5
SETTLE_HEDGE_AFTER_S = 1.0  # a settle unanswered this long is also sent to the owner
METADATA_ASK_TIMEOUT_S = 1.0  # one node's answer to METADATA before the next is asked
PART_OPEN_TIMEOUT_S = 5.0  # connect and SUBSCRIBE on one replica node
METADATA_RETRY_S = 30.0  # subscribe: how long METADATA is asked again while no node answers

_CODE_UNKNOWN_OP = 4
_CODE_UNAVAILABLE = 15
_CODE_FENCED = 25
_RESETTLE_CODES = (_CODE_FENCED, _CODE_UNAVAILABLE, CODE_NOT_OWNER, CODE_SHUTTING_DOWN)


def resettleable(err: BaseException) -> bool:
    """Whether a settle that failed with err may succeed at the partition's
    owner: its node went away, no longer owns the partition, or the session
    there was not resumed."""
    if isinstance(err, BrokerError):
        return err.code in _RESETTLE_CODES
    return isinstance(err, (ConnectionLostError, DisconnectedError, StaleDeliveryError, HeartbeatTimeoutError,
                            asyncio.TimeoutError))


class _Part:
    __slots__ = ("addr", "client", "sub", "pump")

    def __init__(self, addr: str, client: Client, sub: Subscription) -> None:
        self.addr = addr
        self.client = client
        self.sub = sub
        self.pump: asyncio.Task[None] | None = None

    def live(self) -> bool:
        return self.sub._end is None


class Span:
    """The state of a spanning subscription (see the module doc)."""

    def __init__(self, parent: Client, s: Subscription) -> None:
        self.parent = parent
        self.s = s
        self.parts: dict[str, _Part] = {}
        self.owners: dict[int, tuple[str, int]] = {}  # partition -> (addr, epoch)
        self.opening: dict[str, asyncio.Task[Any]] = {}
        self.poke = asyncio.Event()
        self.stopped = False
        self.runner: asyncio.Task[None] | None = None
        self.settles: set[asyncio.Task[None]] = set()
        self.background: set[asyncio.Task[Any]] = set()
        self.look = asyncio.Lock()  # one owner lookup at a time: the settles of one failover share it

    # --- the replica set --------------------------------------------------------

    def learn(self, md: w.MetadataResult) -> None:
        for p in md.partitions:
            known = self.owners.get(p.partition)
            if p.owner and (known is None or p.epoch >= known[1]):
                self.owners[p.partition] = (p.owner, p.epoch)
            self.parent._learn(p.owner, *p.replicas)

    def replicas(self, md: w.MetadataResult) -> list[str]:
        out: list[str] = []
        for p in md.partitions:
            if self.s.partition >= 0 and p.partition != self.s.partition:
                continue
            for r in p.replicas:
                if r and r not in out and len(out) < SPAN_PARTS_MAX:
                    out.append(r)
        return out

    async def metadata(self, avoid: str = "") -> w.MetadataResult | None:
        """METADATA for the queue from the first node that answers: the
        parent's, then the parts' (avoid, a node that just failed, last)."""
        clients: list[Client] = [self.parent, *(p.client for p in self.parts.values())]
        clients.sort(key=lambda c: c.addr == avoid)
        for c in clients:
            conn = c._live
            if conn is None or conn.closed:
                continue
            try:
                md = await asyncio.wait_for(c._round_trip(conn, w.Metadata(self.s.topic, self.s.group)),
                                            METADATA_ASK_TIMEOUT_S)
            except BrokerError as e:
                if e.code in (CODE_NOT_FOUND, _CODE_UNKNOWN_OP):
                    raise
                continue
            except (SinewError, asyncio.TimeoutError, OSError):
                continue
            if isinstance(md, w.MetadataResult):
                self.learn(md)
                return md
        return None

    async def open(self, addr: str) -> _Part | None:
        """Subscribes on the node at addr, unless a live part is there."""
        p = self.parts.get(addr)
        if p is not None and p.live():
            return p
        t = self.opening.get(addr)
        if t is None:
            t = asyncio.get_running_loop().create_task(self._open(addr))
            self.opening[addr] = t
            t.add_done_callback(lambda _: self.opening.pop(addr, None))
        try:
            return await asyncio.shield(t)
        except (SinewError, asyncio.TimeoutError, OSError) as e:
            log.debug("sinew: no subscription on replica node %s of %s yet: %s", addr, self.s.topic, e)
            return None

    async def _open(self, addr: str) -> _Part | None:
        if self.stopped:
            return None
        c = self.parent._part_client(addr, self)
        try:
            await asyncio.wait_for(c._open(PART_OPEN_TIMEOUT_S), PART_OPEN_TIMEOUT_S)
            s = self.s
            sub = await asyncio.wait_for(
                c.subscribe(s.topic, group=s.group, partition=s.partition, prefetch=s.prefetch,
                            auto_ack=s.auto_ack, cohort=s.cohort or None,
                            member_id=s.member_id or None), PART_OPEN_TIMEOUT_S)
        except BaseException:
            self._later(c.close())
            raise
        if self.stopped:
            self._later(self._close_part(_Part(addr, c, sub)))
            return None
        old = self.parts.get(addr)
        if old is not None:
            self._later(self._close_part(old))
        # A cohort part's assignment events go to the spanning subscription's stream.
        sub._assign = s._assign  # type: ignore[method-assign]
        p = _Part(addr, c, sub)
        self.parts[addr] = p
        if not s.prefetch:
            s.prefetch = sub.prefetch
        p.pump = asyncio.get_running_loop().create_task(self._pump(p))
        return p

    async def _pump(self, p: _Part) -> None:
        """Moves the part's deliveries into the spanning subscription."""
        err: BaseException | None = None
        try:
            async for m in p.sub:
                self.note_owner(m.partition, p.addr, m._lease_epoch)
                if self.s._end is not None:
                    break
                await self.s._buf.put(m)
        except SinewError as e:
            err = e
        if self.stopped or err is None:
            self.poke.set()
            return
        if isinstance(err, QueueDeletedError) or (isinstance(err, BrokerError) and not err.retryable
                                                  and err.code != CODE_NOT_OWNER):
            self.end(err)  # final for the whole subscription
            return
        # Reconnects given up, reconciled away: another node serves
        # meanwhile, and the next look subscribes again.
        self.poke.set()

    def _later(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self.background.add(t)
        t.add_done_callback(self.background.discard)

    async def _close_part(self, p: _Part) -> None:
        try:
            await asyncio.wait_for(p.sub.unsubscribe(), self.parent._drain_timeout)
        except (SinewError, asyncio.TimeoutError, OSError):
            pass
        await p.client.close()

    async def run(self) -> None:
        """Keeps a part on every replica node until the subscription ends."""
        while not self.stopped:
            try:
                await asyncio.wait_for(self.poke.wait(), SPAN_REFRESH_EVERY_S)
            except asyncio.TimeoutError:
                pass
            self.poke.clear()
            if self.stopped:
                return
            for addr, p in list(self.parts.items()):
                if not p.live():
                    del self.parts[addr]
                    self._later(self._close_part(p))
            try:
                md = await self.metadata()
            except BrokerError as e:
                if e.code == CODE_NOT_FOUND:
                    self.end(QueueDeletedError(str(e)))
                    return
                md = None
            if md is None:
                continue
            reps = self.replicas(md)
            if reps:
                for addr, p in list(self.parts.items()):
                    if addr not in reps:  # the replica moved away: the part would deliver nothing
                        del self.parts[addr]
                        self._later(self._close_part(p))
            await asyncio.gather(*(self.open(a) for a in reps))

    def end(self, err: BaseException) -> None:
        """Ends the spanning subscription with err; its parts close in the background."""
        if self.s._end is None:
            self.s._finish(err)
        if not self.stopped:
            self._later(self.close())

    async def close(self) -> None:
        """Closes every part and waits (bounded by each part's drain) until they are gone."""
        if self.stopped:
            return
        # Settles made before the close go out first.
        if self.settles:
            await asyncio.wait(list(self.settles), timeout=self.parent._drain_timeout)
        self.stopped = True
        self.poke.set()
        for t in list(self.opening.values()):
            t.cancel()
        parts, self.parts = list(self.parts.values()), {}
        await asyncio.gather(*(self._close_part(p) for p in parts), return_exceptions=True)
        for p in parts:
            if p.pump is not None:
                p.pump.cancel()
        if self.runner is not None and self.runner is not asyncio.current_task():
            self.runner.cancel()
        self.parent._spans.discard(self)

    # --- settles ------------------------------------------------------------------

    def note_owner(self, partition: int, addr: str, epoch: int) -> None:
        known = self.owners.get(partition)
        if known is None or epoch >= known[1]:
            self.owners[partition] = (addr, epoch)

    def forget_owner(self, partition: int, addr: str) -> None:
        known = self.owners.get(partition)
        if known is not None and known[0] == addr:
            self.owners[partition] = ("", known[1])

    def owner_part(self, partition: int) -> _Part | None:
        known = self.owners.get(partition)
        p = self.parts.get(known[0]) if known else None
        return p if p is not None and p.live() else None

    async def lookup_owner(self, partition: int, avoid: str) -> _Part | None:
        async with self.look:
            p = self.owner_part(partition)
            if p is not None:
                return p
            try:
                md = await self.metadata(avoid)
            except BrokerError:
                return None
            if md is None:
                return None
            addr = self.owners.get(partition, ("", 0))[0]
            return await self.open(addr) if addr else None

    def settle(self, m: Message, kind: int, delay_ms: int, fut: asyncio.Future[None] | None) -> None:
        """Starts m's settle; its outcome goes to fut, or to the parent's
        settle error report when fut is None."""
        parent = self.parent
        parent._settling += 1
        t = asyncio.get_running_loop().create_task(self._settle(m, kind, delay_ms))

        def done(t: asyncio.Task[None]) -> None:
            parent._settling -= 1
            self.settles.discard(t)
            err: BaseException | None = ClientClosedError("sinew: settle cancelled") if t.cancelled() else t.exception()
            if err is None:
                m._settled = True
            elif not isinstance(err, StaleDeliveryError):
                m._settled = False  # may be settled again
            if fut is not None:
                if not fut.done():
                    fut.set_result(None) if err is None else fut.set_exception(err)
            elif err is not None:
                parent._settle_failed(m, err)

        self.settles.add(t)
        t.add_done_callback(done)

    async def _settle(self, m: Message, kind: int, delay_ms: int) -> None:
        part_client = m._sub._client
        await self._here_then_owner(m, kind, delay_ms,
                                    part_client._settle(m, kind, delay_ms, True, direct=True), "settle")

    async def extend(self, m: Message, extend_ms: int) -> None:
        """Extends m's lease where its delivery came from, and at the
        partition's current owner by lease reference when that node went
        away, no longer owns the partition or did not answer in time, as a
        settle is (EXTEND has NACK's layout, with extend_ms for delay_ms)."""
        part_client = m._sub._client
        await self._here_then_owner(m, w.EXTEND, extend_ms,
                                    part_client._extend(m, extend_ms, direct=True), "extend")

    async def _here_then_owner(self, m: Message, kind: int, delay_ms: int, here: Awaitable[None],
                               what: str) -> None:
        """Awaits here, the request sent to the node that delivered m; when
        that fails in a way the owner may change, or has not answered within
        SETTLE_HEDGE_AFTER_S, sends it to the partition's current owner by
        lease reference (_resettle)."""
        part_client = m._sub._client
        first = asyncio.ensure_future(here)
        done, _ = await asyncio.wait({first}, timeout=SETTLE_HEDGE_AFTER_S)
        if first in done:
            exc = first.exception()
            if exc is None:
                return
            if not resettleable(exc):
                raise exc
            cause: BaseException = exc
        else:
            # No answer (a node cut off says nothing until its connection
            # is given up): also send it to the owner. A late answer is
            # dropped; a settle or an extend applied twice is harmless.
            first.add_done_callback(lambda f: f.cancelled() or f.exception())
            cause = ConnectionLostError(f"sinew: {part_client.addr} did not answer the {what} within "
                                        f"{SETTLE_HEDGE_AFTER_S}s")
        await self._resettle(m, kind, delay_ms, cause, part_client.addr)

    async def _resettle(self, m: Message, kind: int, delay_ms: int, cause: BaseException, gone: str) -> None:
        """Sends m's settle to its partition's current owner by lease reference,
        until an answer is final."""
        last = cause
        self.forget_owner(m.partition, gone)
        for hop in range(RESETTLE_HOPS_MAX):
            if hop:
                # The client's sleep (injected in tests).
                await self.parent._sleep(min(RESETTLE_BACKOFF_MIN_S * 2 ** min(hop, 8), RESETTLE_BACKOFF_MAX_S))
            if self.stopped:
                raise StaleDeliveryError("sinew: the subscription ended before the settle reached the "
                                         f"partition's owner: {last}")
            p = self.owner_part(m.partition) or await self.lookup_owner(m.partition, gone)
            if p is None:
                continue
            conn, sid = p.client._live, p.sub._server_id
            if conn is None or conn.closed or not sid:
                self.forget_owner(m.partition, p.addr)
                continue
            ref = w.LeaseRef(sid, m.partition, m.offset, m._lease_id, m._lease_epoch).encode()
            body = w.Settle([0], delay_ms, [], kind, leases_raw=[ref])
            try:
                res = await asyncio.wait_for(p.client._round_trip(conn, body), SETTLE_HEDGE_AFTER_S)
                code = res.codes[0] if res.codes else 14
            except BrokerError as e:
                code = e.code
            except (ConnectionLostError, DisconnectedError, HeartbeatTimeoutError, asyncio.TimeoutError) as e:
                last = e
                self.forget_owner(m.partition, p.addr)
                continue
            if code == 0:
                log.info("sinew: %s of %s partition %d offset %d applied at %s by lease reference (%s)",
                         "extend" if kind == w.EXTEND else "settle", m.topic, m.partition, m.offset, p.addr, cause)
                return
            if code in _RESETTLE_CODES:
                last = broker_error(code, "settle refused")
                self.forget_owner(m.partition, p.addr)
                continue
            if code == CODE_STALE_LEASE:
                if kind not in (w.ACK, w.EXTEND) and isinstance(cause, (ConnectionLostError, HeartbeatTimeoutError)):
                    # The first send may have taken effect before its
                    # connection broke: a NACK or FAIL repeated after that is
                    # stale_lease, which would misreport it. Its outcome is
                    # unknown, as the first send's error said. (An EXTEND
                    # repeated finds the lease it extended, or none.)
                    raise cause
                raise StaleDeliveryError("sinew: broker: stale_lease")
            raise broker_error(code, "settle refused")
        raise last


async def subscribe_span(parent: Client, s: Subscription) -> Subscription | None:
    """Makes s a spanning subscription over the queue's replica nodes. None
    when the broker is not in a cluster (or predates METADATA): the caller
    subscribes on its own node."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + METADATA_RETRY_S
    sp = Span(parent, s)
    created = False
    delay = 0.05
    while True:
        try:
            md = await sp.metadata()
        except BrokerError as e:
            if e.code == _CODE_UNKNOWN_OP:
                return None
            if e.code != CODE_NOT_FOUND or created:
                raise
            # A first SUBSCRIBE creates the queue (as on a single node); then its replicas are known.
            created = True
            first = await parent._subscribe_here(s.topic, s.group, s.partition, s.prefetch, s.auto_ack,
                                                 s.cohort, s.member_id)
            await first.unsubscribe()
            continue
        if md is not None:
            break
        if loop.time() + delay > give_up:
            raise NotConnectedError(f"sinew: no node answered METADATA for {s.topic!r} within {METADATA_RETRY_S}s")
        await parent._sleep(delay)
        delay = min(delay * 2, 1.0)
    if not md.cluster:
        return None
    s._span = sp
    results = await asyncio.gather(*(sp.open(a) for a in sp.replicas(md)))
    if not any(results):
        await sp.close()
        raise NotConnectedError(f"sinew: no node holding a replica of {s.topic!r} answered")
    parent._subs.add(s)
    parent._spans.add(sp)
    sp.runner = loop.create_task(sp.run())
    return s
