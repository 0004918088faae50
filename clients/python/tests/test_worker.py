"""The worker API against a real `sinew serve`: fast settles (returned once
queued, held across cuts, flushed by close), confirmed settles, process(),
Subscription.run(), connection status events, the millisecond vocabulary
with its deprecated aliases, ordered headers and JSON-safe results.

The proxy's hold() keeps the broker's answers from the client, so a test can
tell "queued" from "answered" without measuring time.
"""

from __future__ import annotations

import asyncio
import gc
import json
import warnings
from typing import Any

import sinew
from sinew import _wire as w

from test_broker import BrokerCase, Recorder, recv, until, within


async def turns(n: int = 20) -> None:
    """Lets the event loop run n turns (not a wait for time to pass)."""
    for _ in range(n):
        await asyncio.sleep(0)


class FastSettles(BrokerCase):
    async def test_settles_return_once_queued_and_confirmed_waits_for_the_broker(self) -> None:
        c = await self.client()
        sub = await c.subscribe("fast", prefetch=8)
        for i in range(4):
            await c.publish("fast", f"m{i}")
        ms = [await recv(sub) for _ in range(4)]
        self.proxy.hold(True)  # the broker's SETTLE_RESULTs cannot reach the client
        await within(ms[0].complete())
        await within(ms[1].retry_after(60_000))
        await within(ms[2].fail())
        self.assertEqual(c._settling, 3, "the fast settles returned before their results")
        confirmed = asyncio.ensure_future(ms[3].complete(confirmed=True))
        await turns()
        self.assertFalse(confirmed.done(), "a confirmed settle returned without the broker's answer")
        self.proxy.hold(False)
        await within(confirmed)
        await until(lambda: c._settling == 0)
        for m in ms:
            with self.assertRaises(sinew.AlreadySettledError):
                await m.complete()
        # Nothing comes back: the ACKs and the FAIL took effect, the NACK waits 60 s.
        await c.publish("fast", b"marker")
        self.assertEqual((await recv(sub)).body, b"marker")

    async def test_worker_loop_with_fast_settles_survives_cuts(self) -> None:
        errors: list[tuple[sinew.Message, sinew.SinewError]] = []
        c = await self.client(sleep=Recorder(), on_settle_error=lambda m, e: errors.append((m, e)))
        sub = await c.subscribe("fast-cut", prefetch=16)
        total = 60
        for i in range(total):
            await c.publish("fast-cut", b"%d" % i)
        seen: list[bytes] = []
        async for msg in sub:
            seen.append(msg.body)
            await msg.complete()
            if len(seen) % 15 == 0:
                await asyncio.sleep(0)  # the settles of this turn go out ...
                self.proxy.cut_all()  # ... and the socket is cut before their results
            if len(seen) == total:
                break
        await until(lambda: c._settling == 0)
        self.assertEqual(errors, [])
        self.assertEqual(sorted(seen), sorted(b"%d" % i for i in range(total)))
        self.assertEqual(c.last_outcome, 1)
        await c.publish("fast-cut", b"marker")
        self.assertEqual((await recv(sub)).body, b"marker", "a completed message came back")

    async def test_close_flushes_queued_settles(self) -> None:
        c = await self.client()
        await c.declare_queue("flush", max_retries=5, lease_ms=60_000)
        sub = await c.subscribe("flush", prefetch=8)
        for i in range(5):
            await c.publish("flush", f"m{i}")
        ms = [await recv(sub) for _ in range(5)]
        self.proxy.hold(True)
        for m in ms:
            await within(m.complete())
        closing = asyncio.ensure_future(c.close())
        await turns()
        self.assertFalse(closing.done(), "close() did not wait for the queued settles")
        self.proxy.hold(False)
        await within(closing)
        self.assertEqual(c._settling, 0)
        # Completed, not released by END_SESSION: a new consumer sees only the marker.
        c2 = await self.client()
        await c2.publish("flush", b"marker")
        m = await recv(await c2.subscribe("flush"))
        self.assertEqual((m.body, m.attempt), (b"marker", 1))

    async def test_failed_fast_settle_is_reported(self) -> None:
        errors: list[tuple[sinew.Message, sinew.SinewError]] = []
        c = await self.client(on_settle_error=lambda m, e: errors.append((m, e)))
        await c.publish("fast-err", b"x")
        sub = await c.subscribe("fast-err")
        m = await recv(sub)
        await m.retry_after(10**15)  # above the broker's cap: refused later, lease kept
        await until(lambda: len(errors) == 1)
        self.assertIs(errors[0][0], m)
        self.assertIsInstance(errors[0][1], sinew.BrokerError)
        self.assertEqual(errors[0][1].name, "bad_request")  # type: ignore[attr-defined]
        await m.complete(confirmed=True)  # a refused settle leaves the message unsettled


class Process(BrokerCase):
    async def test_process_completes_retries_and_swallows(self) -> None:
        c = await self.client()
        await c.declare_queue("proc", max_retries=5)
        sub = await c.subscribe("proc", prefetch=4)
        await c.publish("proc", b"ok")
        await c.publish("proc", b"boom")
        m = await recv(sub)
        async with m.process() as got:
            self.assertIs(got, m)
        m = await recv(sub)
        with self.assertLogs("sinew", "ERROR"):
            async with m.process():
                raise RuntimeError("handler failed")  # swallowed: the loop carries on
        again = await recv(sub)
        self.assertEqual((again.body, again.attempt), (b"boom", 2), "retried, not completed")
        with self.assertLogs("sinew", "ERROR"), self.assertRaises(KeyError):
            async with again.process(reraise=True):
                raise KeyError("x")
        third = await recv(sub)
        self.assertEqual(third.attempt, 3)
        async with third.process():
            await third.fail()  # settled inside: left as it is
        await c.publish("proc", b"marker")
        self.assertEqual((await recv(sub)).body, b"marker", "ok was not completed")

    async def test_cancellation_leaves_the_message_unsettled(self) -> None:
        c = await self.client()
        await c.publish("proc-cancel", b"x")
        sub = await c.subscribe("proc-cancel")
        m = await recv(sub)
        started = asyncio.Event()

        async def handler() -> None:
            async with m.process():
                started.set()
                await asyncio.Event().wait()

        t = asyncio.ensure_future(handler())
        await within(started.wait())
        t.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await t
        self.assertFalse(m._settled)
        await m.complete(confirmed=True)

    async def test_run_calls_the_handler_and_returns_on_unsubscribe(self) -> None:
        c = await self.client()
        await c.declare_queue("run", max_retries=5)
        for i in range(6):
            await c.publish("run", f"m{i}")
        sub = await c.subscribe("run", prefetch=8)
        done: list[str] = []
        attempts: dict[str, int] = {}

        async def handler(m: sinew.Message) -> None:
            attempts[m.text] = m.attempt
            if m.text == "m2" and m.attempt == 1:
                raise RuntimeError("flaky")
            done.append(m.text)
            if len(done) == 6:
                asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(sub.unsubscribe()))

        with self.assertLogs("sinew", "ERROR"):
            await within(sub.run(handler, concurrency=3))
        self.assertEqual(sorted(done), [f"m{i}" for i in range(6)])
        self.assertEqual(attempts["m2"], 2)
        self.assertIsInstance(sub.end_reason, sinew.UnsubscribedError)

    async def test_run_raises_the_end_reason(self) -> None:
        c = await self.client()
        await c.declare_queue("run-gone")
        sub = await c.subscribe("run-gone")

        async def handler(m: sinew.Message) -> None:
            pass

        running = asyncio.ensure_future(sub.run(handler))
        await turns()
        await c.delete_queue("run-gone")
        with self.assertRaises(sinew.QueueDeletedError) as cm:
            await within(running)
        self.assertIsInstance(cm.exception, sinew.BrokerError)
        self.assertEqual(cm.exception.name, "not_found")


class Status(BrokerCase):
    async def test_cut_and_close_events(self) -> None:
        seen: list[sinew.StatusEvent] = []
        c = await self.client(sleep=Recorder(), rand=lambda: 0.5, on_status=seen.append)
        st = c.status()
        self.proxy.cut_all()
        kinds = []
        async for ev in st:
            kinds.append(ev.type)
            if ev.type == "reconnected":
                self.assertTrue(ev.resumed)
                break
        self.assertEqual(kinds, ["disconnected", "reconnecting", "reconnected"])
        self.assertEqual([e.type for e in seen], kinds)
        self.assertEqual((seen[1].attempt, seen[1].delay_ms), (1, 100))
        self.assertIsInstance(seen[0].error, sinew.ConnectionLostError)
        json.dumps([e.to_dict() for e in seen])
        del ev
        del st
        gc.collect()
        self.assertEqual(len(c._status_streams), 0, "leaving the loop did not unregister the stream")
        st2 = c.status()
        await c.close()
        self.assertEqual([e.type async for e in st2], ["closed"])
        self.assertEqual(seen[-1].type, "closed")
        self.assertEqual([e.type async for e in c.status()], ["closed"])  # after close: closed, then the end

    async def test_going_away_on_a_planned_stop(self) -> None:
        c = await self.client(self.broker.addr, sleep=Recorder())
        kinds: list[str] = []
        c2 = c.status()
        stopping = asyncio.ensure_future(self.broker.stop())
        async for ev in c2:
            kinds.append(ev.type)
            if ev.type == "disconnected":
                break
        self.assertEqual(kinds, ["going_away", "disconnected"])
        self.assertEqual(await within(stopping), 0)
        await self.broker.start()
        async for ev in c2:
            if ev.type == "reconnected":
                break
        await c2.aclose()
        self.assertEqual(len(c._status_streams), 0)

    async def test_buffer_is_bounded(self) -> None:
        c = await self.client()
        st = c.status()
        for i in range(sinew.client.STATUS_BUFFER_MAX + 10):
            c._emit(sinew.StatusEvent("reconnecting", attempt=i + 1))
        self.assertEqual(st.dropped, 10)
        first = await st.__anext__()
        self.assertEqual(first.attempt, 11)
        await st.aclose()


class Vocabulary(BrokerCase):
    async def test_deprecated_seconds_still_work_and_warn(self) -> None:
        with self.assertWarns(DeprecationWarning):
            c = await self.client(drain_timeout_s=1.5, heartbeat_s=2)
        self.assertEqual((c._drain_timeout, c._heartbeat_s), (1.5, 2.0))
        with self.assertWarns(DeprecationWarning):
            p = sinew.ReconnectPolicy(base_delay_s=0.25, max_delay_s=5)
        self.assertEqual((p.base_delay_ms, p.max_delay_ms, p.reset_after_ms), (250, 5000, 10_000))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            c2 = await self.client(drain_timeout_ms=1500, heartbeat_ms=2000,
                                   reconnect=sinew.ReconnectPolicy(base_delay_ms=250))
        self.assertEqual((c2._drain_timeout, c2._heartbeat_s), (1.5, 2.0))
        with self.assertRaises(sinew.InvalidArgumentError) as cm:
            await sinew.connect(self.proxy.addr, drain_timeout_ms=1.5)  # type: ignore[arg-type]
        self.assertEqual(cm.exception.argument, "drain_timeout_ms")
        with self.assertRaises(sinew.InvalidArgumentError), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            await sinew.connect(self.proxy.addr, drain_timeout_ms=1500, drain_timeout_s=1.5)

    async def test_ordered_headers_and_json_safe_results(self) -> None:
        c = await self.client()
        r = await c.publish("vocab", b"\x00\xffbody", key=b"k\x01",
                            headers=[("a", "1"), ("b", "2"), ("a", "3")])
        m = await recv(await c.subscribe("vocab"))
        self.assertEqual(m.headers, [("a", "1"), ("b", "2"), ("a", "3")])
        self.assertEqual((m.header("a"), m.header("c"), m.header("c", "-")), ("1", None, "-"))
        d = json.loads(json.dumps({"confirm": r.to_dict(), "message": m.to_dict()}))
        self.assertEqual(d["confirm"], {"partition": r.partition, "offset": r.offset, "duplicate": False})
        self.assertEqual(d["message"]["headers"], [["a", "1"], ["b", "2"], ["a", "3"]])
        self.assertEqual((d["message"]["body_base64"], d["message"]["key_base64"]), ("AP9ib2R5", "awE="))
        self.assertEqual((d["message"]["offset"], d["message"]["attempt"]), (r.offset, 1))
        self.assertIn("lease_ms", d["message"])  # 0: a single node announces none
        await m.complete()

    def test_error_names_follow_the_go_sdk(self) -> None:
        # Go's ErrX is XError here; the broker codes with a Go sentinel get their class.
        self.assertIsInstance(sinew.errors.broker_error(23, "no"), sinew.PermissionDeniedError)
        self.assertIsInstance(sinew.PermissionDeniedError(), sinew.BrokerError)
        self.assertEqual(sinew.errors.broker_error(25).name, "fenced")
        self.assertTrue(sinew.errors.broker_error(25).retryable)
        self.assertEqual(sinew.errors.broker_error(24, "", "10.0.0.2:7654").owner, "10.0.0.2:7654")
        self.assertIs(sinew.RecreateFailedError, sinew.RecreatedError)
        self.assertTrue(issubclass(sinew.NotConnectedError, sinew.DisconnectedError))
        self.assertTrue(issubclass(sinew.ServerNotTLSError, sinew.TLSError))
        self.assertEqual(sinew.QueueDeletedError("q").name, "not_found")


class Extend(BrokerCase):
    LEASE_MS = 500

    async def test_extending_handler_is_never_redelivered(self) -> None:
        c = await self.client(self.broker.addr)
        await c.declare_queue("ext", max_retries=5, lease_ms=self.LEASE_MS)
        sub = await c.subscribe("ext", prefetch=1)
        await c.publish("ext", b"slow")
        m = await recv(sub)
        other = await (await self.client(self.broker.addr)).subscribe("ext", prefetch=1)

        loop = asyncio.get_running_loop()
        start = loop.time()
        extensions = 0
        while loop.time() - start < 3 * self.LEASE_MS / 1000:  # the handler's work: three leases
            # Twice the lease from now, a third of a lease apart: a slow round
            # trip on a busy machine does not let it run out.
            await within(m.extend(2 * self.LEASE_MS))
            extensions += 1
            await asyncio.sleep(self.LEASE_MS / 3 / 1000)
        self.assertGreaterEqual(extensions, 3)
        await within(m.complete(confirmed=True))  # still our lease: not stale
        await c.publish("ext", b"marker")
        first = await recv(other)
        self.assertEqual((first.body, first.attempt), (b"marker", 1), "the extended message was delivered again")
        await first.complete()

        # Without extending, the lease runs out while the handler works and
        # the message is delivered again (the lease is short enough to show it).
        await c.declare_queue("ext-control", max_retries=5, lease_ms=self.LEASE_MS)
        sub2 = await c.subscribe("ext-control", prefetch=1)
        await c.publish("ext-control", b"slow")
        m2 = await recv(sub2)
        back = await recv(sub2)
        self.assertEqual((m2.attempt, back.body, back.attempt), (1, b"slow", 2))
        with self.assertRaises(sinew.StaleDeliveryError):
            await within(m2.extend(self.LEASE_MS))
        await back.complete(confirmed=True)


class ExtendEncoding(BrokerCase):
    async def test_extend_sends_the_extend_op(self) -> None:
        # The frame the client writes for msg.extend(), checked at the
        # client's own write (the broker's answer is tested where it has EXTEND).
        c = await self.client()
        await c.publish("ext-enc", b"x")
        sub = await c.subscribe("ext-enc")
        m = await recv(sub)
        conn = c._live
        assert conn is not None
        sent: list[bytes] = []
        real = conn.write

        def spy(frame: bytes) -> None:
            sent.append(bytes(frame))
            real(frame)

        setattr(conn, "write", spy)
        t = asyncio.ensure_future(m.extend(30_000))
        await until(lambda: bool(sent))
        f = w.split_frame(sent[0])
        self.assertEqual(f.op, w.EXTEND)
        self.assertEqual(w.decode_body(f.op, f.body), w.Extend([m.tag], 30_000, [m.lease]))
        t.cancel()
        with self.assertRaises(sinew.InvalidArgumentError):
            await m.extend(0)
        with self.assertRaises(sinew.InvalidArgumentError):
            await m.extend(1.5)  # type: ignore[arg-type]
        await m.complete(confirmed=True)
        with self.assertRaises(sinew.AlreadySettledError):
            await m.extend(1000)


if __name__ == "__main__":
    import unittest

    unittest.main()
