"""Cohort subscriptions against a scripted broker on loopback: what the
client sends (SUBSCRIBE's cohort and member, RECONCILE's cohorts) and what it
does with ASSIGNMENT pushes and DELIVER's assignment field."""

from __future__ import annotations

import asyncio
import unittest
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sinew
from sinew import _wire as w

from harness import Broker

WAIT_S = 10.0


async def no_sleep(_: float) -> None:
    await asyncio.sleep(0)


@dataclass
class Received:
    conn: int
    op: int
    rid: int
    body: Any


class FakeBroker:
    """Answers HELLO (outcome ``outcome(conn)``), SUBSCRIBE (sub ids from
    100), RECONCILE (``reconcile_entries``), INFLIGHT, UNSUBSCRIBE and
    END_SESSION, and records every frame it gets."""

    def __init__(self) -> None:
        self.got: list[Received] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.outcome: Callable[[int], int] = lambda conn: 0
        self.reconcile_entries: Callable[[w.Reconcile], list[w.ReconcileEntry]] = lambda body: []
        self.next_sub = 100
        self.changed = asyncio.Event()
        self.handlers: set[asyncio.Task[Any]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return "127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        for wr in self.writers:
            wr.transport.abort()
        self.server.close()
        if self.handlers:
            await asyncio.wait(self.handlers, timeout=WAIT_S)  # each ends at its connection's end

    def push(self, body: w.Body) -> None:
        self.writers[-1].write(w.encode_frame(body, 0))

    async def wait_for(self, pred: Callable[[Received], bool], what: str) -> Received:
        async def find() -> Received:
            while True:
                for r in self.got:
                    if pred(r):
                        return r
                self.changed.clear()
                await self.changed.wait()
        try:
            return await asyncio.wait_for(find(), WAIT_S)
        except asyncio.TimeoutError:
            raise AssertionError(f"fake broker: no {what} within {WAIT_S} s") from None

    async def handle(self, r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
        conn = len(self.writers)
        self.writers.append(wr)
        task = asyncio.current_task()
        assert task is not None
        self.handlers.add(task)
        try:
            while True:
                head = await r.readexactly(16)
                n, _, op, _, rid = w.parse_header(head, w.FRAME_BYTES_DEFAULT)
                body = w.decode_body(op, await r.readexactly(n))
                self.got.append(Received(conn, op, rid, body))
                self.answer(wr, conn, op, rid, body)
                self.changed.set()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            wr.transport.abort()

    def answer(self, wr: asyncio.StreamWriter, conn: int, op: int, rid: int, body: Any) -> None:
        def reply(b: w.Body) -> None:
            wr.write(w.encode_frame(b, rid))

        if op == w.HELLO:
            reply(w.HelloOK(1, "fake", w.ResumeIdentity("c-1", "o-1", b"t"), self.outcome(conn), 1, 0, 30_000,
                            w.Limits(1 << 20, 1 << 20, 1000, 256, 64, 64)))
        elif op == w.SUBSCRIBE:
            reply(w.SubscribeOK(self.next_sub, [0, 1], 10))
            self.next_sub += 1
        elif op == w.RECONCILE:
            reply(w.ReconcileResult(self.reconcile_entries(body)))
        elif op == w.INFLIGHT:
            reply(w.InflightResult([], 0, 0))
        elif op in (w.END_SESSION, w.UNSUBSCRIBE):
            reply(w.Ok())


def deliver(sub_id: int, tag: int, assignment: int) -> w.Deliver:
    return w.Deliver(sub_id, tag, 1, tag, 1, 0, b"", [], "", b"m", "orders", "", 5, 0, 0, assignment)


class Cohorts(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.fb = FakeBroker()
        self.addr = await self.fb.start()
        self.c = await sinew.connect(self.addr, sleep=no_sleep, drain_timeout_ms=100)
        self.more: list[sinew.Client] = []

    async def asyncTearDown(self) -> None:
        for c in [self.c, *self.more]:
            await c.close()
        await self.fb.stop()

    async def connect(self, **kw: Any) -> sinew.Client:
        c = await sinew.connect(self.addr, sleep=no_sleep, drain_timeout_ms=100, **kw)
        self.more.append(c)
        return c

    def subscribes(self, conn: int | None = None) -> list[w.Subscribe]:
        return [r.body for r in self.fb.got if r.op == w.SUBSCRIBE and (conn is None or r.conn == conn)]

    async def test_subscribe_sends_cohort_and_member(self) -> None:
        c = self.c
        c2 = await self.connect(member_id="worker-7")
        c3 = await self.connect()
        self.assertRegex(c.member_id, r"^[A-Za-z0-9._:-]{1,128}$")
        self.assertNotEqual(c.member_id, c3.member_id)
        self.assertEqual(c2.member_id, "worker-7")
        plain = await c.subscribe("orders")
        a = await c.subscribe("orders", cohort="billing")
        b = await c.subscribe("orders", cohort="audit")
        d = await c2.subscribe("orders", cohort="billing")
        e = await c3.subscribe("orders", cohort="billing", member_id="w-3")
        want = [("", ""), ("billing", c.member_id), ("audit", c.member_id), ("billing", "worker-7"), ("billing", "w-3")]
        self.assertEqual([(s.cohort, s.member) for s in self.subscribes()], want)
        self.assertEqual([(s.cohort, s.member_id) for s in (plain, a, b, d, e)], want)
        # A session uses one member id: a second one is refused at the call.
        with self.assertRaises(sinew.InvalidArgumentError):
            await c3.subscribe("jobs", cohort="billing")
        with self.assertRaises(sinew.InvalidArgumentError):
            await c.subscribe("jobs", cohort="billing", member_id="w-4")
        self.assertEqual(len(self.subscribes()), 5)
        with self.assertRaises(sinew.InvalidArgumentError) as cm:
            await sinew.connect(self.addr, member_id="bad id")
        self.assertEqual(cm.exception.argument, "member_id")

    async def test_bad_names_are_refused_at_the_call_and_send_nothing(self) -> None:
        bad: list[tuple[dict[str, Any], str]] = [
            ({"cohort": ""}, "cohort"),
            ({"cohort": "bill ing"}, "cohort"),
            ({"cohort": "x" * 129}, "cohort"),
            ({"cohort": "grüße"}, "cohort"),
            ({"cohort": "a/b"}, "cohort"),
            ({"cohort": 7}, "cohort"),
            ({"cohort": b"billing"}, "cohort"),
            ({"cohort": "billing", "member_id": ""}, "member_id"),
            ({"cohort": "billing", "member_id": "w\n1"}, "member_id"),
            ({"cohort": "billing", "member_id": "y" * 129}, "member_id"),
            ({"member_id": "worker-1"}, "member_id"),
        ]
        for kw, arg in bad:
            with self.subTest(kw), self.assertRaises(sinew.InvalidArgumentError) as cm:
                await self.c.subscribe("orders", **kw)
            self.assertEqual(cm.exception.argument, arg)
        self.assertEqual(self.c._subs, set())
        # The longest valid names pass.
        await self.c.subscribe("orders", cohort="A-z_0.9:" + "c" * 120, member_id="m" * 128)
        self.assertEqual(len(self.subscribes()), 1, "a refused subscribe sent SUBSCRIBE")

    async def test_assignments_reach_their_subscription_in_order(self) -> None:
        a = await self.c.subscribe("orders", cohort="billing")  # sub id 100
        b = await self.c.subscribe("orders", cohort="billing")  # sub id 101
        # Before anyone reads: the events are kept for the first reader.
        self.fb.push(w.Assignment(101, 3, 7, w.ASSIGNMENT_ASSIGNED))
        self.fb.push(w.Assignment(999, 5, 1, w.ASSIGNMENT_ASSIGNED))  # nobody's: ignored
        self.fb.push(w.Assignment(100, 1, 2, w.ASSIGNMENT_ASSIGNED))
        self.fb.push(w.Assignment(101, 3, 8, w.ASSIGNMENT_REVOKED))
        self.fb.push(deliver(100, 1, 2))
        m = await asyncio.wait_for(a.__anext__(), WAIT_S)
        self.assertEqual(m.assignment, 2)
        self.assertEqual(m.to_dict()["assignment"], 2)
        with self.assertRaises(AttributeError):
            m.assignment = 3  # type: ignore[misc]
        it = b.assignments()
        got = [await asyncio.wait_for(it.__anext__(), WAIT_S) for _ in range(2)]
        self.assertEqual(got, [sinew.AssignmentEvent(3, 7, sinew.ASSIGNED), sinew.AssignmentEvent(3, 8, sinew.REVOKED)])
        ia = a.assignments()
        self.assertEqual(await asyncio.wait_for(ia.__anext__(), WAIT_S), sinew.AssignmentEvent(1, 2, "assigned"))
        # The stream stops when the subscription ends.
        nxt = asyncio.ensure_future(ia.__anext__())
        await asyncio.sleep(0)
        await a.unsubscribe()
        with self.assertRaises(StopAsyncIteration):
            await asyncio.wait_for(nxt, WAIT_S)
        self.assertEqual(a.assignments_dropped + b.assignments_dropped, 0)

    async def test_assignment_events_are_bounded(self) -> None:
        a = await self.c.subscribe("orders", cohort="billing")
        for i in range(300):
            self.fb.push(w.Assignment(100, i, i + 1, w.ASSIGNMENT_ASSIGNED))
        self.fb.push(deliver(100, 1, 1))
        await asyncio.wait_for(a.__anext__(), WAIT_S)  # every push before it was read
        self.assertEqual(a.assignments_dropped, 44)
        got = []
        async for ev in a.assignments():
            got.append(ev)
            if len(got) == 256:
                break
        self.assertEqual(got[0], sinew.AssignmentEvent(44, 45, "assigned", dropped=44))
        self.assertEqual(got[1].dropped, 0)
        self.assertEqual(got[-1].partition, 299)

    async def test_resumed_session_reconciles_cohorts_and_recreates_with_cohort(self) -> None:
        fb = self.fb
        fb.outcome = lambda conn: 0 if conn < 2 else 1  # connection 2: c's second
        c = await self.connect(member_id="w-2")

        def entries(body: w.Reconcile) -> list[w.ReconcileEntry]:
            # The broker lost sub 101 and asks the client to subscribe it again.
            return [w.ReconcileEntry(4, v.sub_id, 0, v, w.SubView(), "missing") if v.sub_id == 101 else
                    w.ReconcileEntry(1, v.sub_id, v.sub_id, v, v, "matched") for v in body.subs]

        fb.reconcile_entries = entries
        await c.subscribe("plain")
        await c.subscribe("orders", cohort="billing")
        await c.subscribe("orders", cohort="audit", member_id="w-2")
        fb.writers[1].transport.abort()  # connection 0 is self.c's
        rec = await fb.wait_for(lambda r: r.op == w.RECONCILE, "RECONCILE")
        self.assertEqual(rec.conn, 2)
        self.assertEqual(sorted(v.sub_id for v in rec.body.subs), [100, 101, 102])
        self.assertEqual(sorted(rec.body.cohorts, key=lambda x: x.sub_id),
                         [w.SubCohort(101, "billing", "w-2"), w.SubCohort(102, "audit", "w-2")])
        again = await fb.wait_for(lambda r: r.op == w.SUBSCRIBE and r.conn == 2, "SUBSCRIBE on the new connection")
        self.assertEqual((again.body.topic, again.body.cohort, again.body.member), ("orders", "billing", "w-2"))

    async def test_fresh_session_subscribes_again_with_cohort(self) -> None:
        await self.c.subscribe("orders", cohort="billing")
        await self.c.subscribe("jobs", cohort="billing")
        self.fb.writers[0].transport.abort()  # outcome stays 0: the session is not resumed
        await self.fb.wait_for(lambda r: r.op == w.SUBSCRIBE and r.conn == 1 and r.body.topic == "jobs", "SUBSCRIBE")
        await self.fb.wait_for(lambda r: r.op == w.SUBSCRIBE and r.conn == 1 and r.body.topic == "orders", "SUBSCRIBE")
        self.assertEqual(sorted((s.topic, s.cohort, s.member) for s in self.subscribes(1)),
                         [("jobs", "billing", self.c.member_id), ("orders", "billing", self.c.member_id)])
        self.assertFalse(any(r.op == w.RECONCILE for r in self.fb.got))


async def read_assignments(it: sinew.AssignmentStream, owned: dict[int, int], done: Callable[[], bool]) -> None:
    """Applies assignment events to owned (partition -> epoch) until done(); bounded."""
    async def run() -> None:
        while not done():
            ev = await it.__anext__()
            if ev.state == sinew.ASSIGNED:
                owned[ev.partition] = ev.epoch
            else:
                owned.pop(ev.partition, None)
    try:
        await asyncio.wait_for(run(), 15.0)
    except asyncio.TimeoutError:
        raise AssertionError(f"assignments incomplete: {owned}") from None


class RealBroker(unittest.IsolatedAsyncioTestCase):
    async def test_two_cohort_subscriptions_of_one_client_then_a_second_member(self) -> None:
        broker = Broker()
        await broker.start()
        self.addCleanup(broker.data.cleanup)
        self.addAsyncCleanup(broker.kill)
        a = await sinew.connect(broker.addr, member_id="worker-a", drain_timeout_ms=1000)
        self.addAsyncCleanup(a.close)
        b = await sinew.connect(broker.addr, member_id="worker-b", drain_timeout_ms=1000)
        self.addAsyncCleanup(b.close)
        await a.declare_queue("py-cohort-1", partitions=2)
        await a.declare_queue("py-cohort-2", partitions=2)
        s1 = await a.subscribe("py-cohort-1", cohort="billing", prefetch=16)
        s2 = await a.subscribe("py-cohort-2", cohort="audit", prefetch=16)
        owned1: dict[int, int] = {}
        owned2: dict[int, int] = {}
        await read_assignments(s1.assignments(), owned1, lambda: len(owned1) == 2)
        await read_assignments(s2.assignments(), owned2, lambda: len(owned2) == 2)
        # Each subscription gets its own queue's messages, under the epoch it was told.
        await a.publish("py-cohort-1", "1/x", partition=0)
        await a.publish("py-cohort-1", "1/y", partition=1)
        await a.publish("py-cohort-2", "2/z", partition=0)
        got1 = [await asyncio.wait_for(s1.__anext__(), WAIT_S) for _ in range(2)]
        m2 = await asyncio.wait_for(s2.__anext__(), WAIT_S)
        self.assertEqual(sorted(m.text for m in got1), ["1/x", "1/y"])
        self.assertEqual(m2.text, "2/z")
        for m in got1:
            self.assertEqual(m.assignment, owned1[m.partition])
        self.assertEqual(m2.assignment, owned2[m2.partition])
        for m in [*got1, m2]:
            await m.complete(confirmed=True)
        # A second member of "billing": one partition moves to it, and worker-a hears the revoke.
        sb = await b.subscribe("py-cohort-1", cohort="billing", prefetch=16)
        owned_b: dict[int, int] = {}
        await read_assignments(sb.assignments(), owned_b, lambda: len(owned_b) == 1)
        await read_assignments(s1.assignments(), owned1, lambda: len(owned1) == 1)
        (pb,) = owned_b
        self.assertNotIn(pb, owned1)
        self.assertGreater(owned_b[pb], 0)
        self.assertEqual(s1.assignments_dropped + s2.assignments_dropped + sb.assignments_dropped, 0)


if __name__ == "__main__":
    unittest.main()
