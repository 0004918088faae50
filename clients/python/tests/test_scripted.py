"""Client behaviour on input the real broker never sends: a scripted peer on
loopback writes exact bytes (frames split across reads, an oversized frame).
Everything the real broker can do is tested against it in test_broker.py."""

from __future__ import annotations

import asyncio
import struct
import unittest
from collections.abc import Awaitable, Callable

import sinew
from sinew import _wire as w

WAIT_S = 10.0

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_frame(r: asyncio.StreamReader) -> tuple[int, int, w.Body]:
    head = await r.readexactly(16)
    n, _, op, _, rid = w.parse_header(head, w.FRAME_BYTES_DEFAULT)
    return op, rid, w.decode_body(op, await r.readexactly(n))


async def handshake(r: asyncio.StreamReader, wr: asyncio.StreamWriter, frame_bytes_max: int = 65536) -> None:
    op, rid, _ = await read_frame(r)
    assert op == w.HELLO
    ok = w.HelloOK(1, "scripted", w.ResumeIdentity("c-1", "o-1", b"t"), 0, 1, 0, 0,
                   w.Limits(frame_bytes_max, 1 << 20, 1000, 256, 64, 16))
    wr.write(w.encode_frame(ok, rid))


class Scripted(unittest.IsolatedAsyncioTestCase):
    async def serve(self, script: Script) -> str:
        self.accepted = 0

        async def handle(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
            self.accepted += 1
            try:
                await script(r, wr)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                wr.transport.abort()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.addCleanup(self.server.close)
        return "127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]

    async def test_frames_split_and_coalesced_are_all_read(self) -> None:
        async def script(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
            await handshake(r, wr)
            op, rid, _ = await read_frame(r)
            assert op == w.SUBSCRIBE
            out = w.encode_frame(w.SubscribeOK(9, [0], 10), rid)
            for tag in (1, 2, 3):  # three deliveries in one write with the reply
                out += w.encode_frame(w.Deliver(9, tag, 0, tag, 1, 0, b"", [], "", b"m%d" % tag, "t", "", tag), 0)
            wr.write(out)
            last = w.encode_frame(w.Deliver(9, 4, 0, 4, 1, 0, b"", [("h", "v")], "", b"x" * 3000, "t", "", 4), 0)
            for i in range(len(last)):  # and one a byte at a time
                wr.write(last[i:i + 1])
                await wr.drain()
                await asyncio.sleep(0)
            while True:  # until the client ends its session
                op, rid, _ = await read_frame(r)
                if op == w.END_SESSION:
                    wr.write(w.encode_frame(w.Ok(), rid))
                    await wr.drain()
                    return

        c = await sinew.connect(await self.serve(script))
        self.addAsyncCleanup(c.close)
        sub = await c.subscribe("t")
        got = [await asyncio.wait_for(sub.__anext__(), WAIT_S) for _ in range(4)]
        self.assertEqual([m.body for m in got], [b"m1", b"m2", b"m3", b"x" * 3000])
        self.assertEqual(got[3].header("h"), "v")

    async def test_oversized_frame_is_fatal_and_not_reconnected(self) -> None:
        async def script(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
            await handshake(r, wr, frame_bytes_max=65536)
            op, rid, _ = await read_frame(r)
            wr.write(w.encode_frame(w.SubscribeOK(9, [0], 10), rid))
            # A header announcing a body beyond the limit; the body never comes.
            wr.write(struct.pack(">IBBHQ", 1 << 20, 1, w.DELIVER, 0, 0))
            await r.read()

        sleeps: list[float] = []

        async def sleep(d: float) -> None:
            sleeps.append(d)

        c = await sinew.connect(await self.serve(script), sleep=sleep)
        self.addAsyncCleanup(c.close)
        sub = await c.subscribe("t")
        with self.assertRaises(sinew.ProtocolError):
            await asyncio.wait_for(sub.__anext__(), WAIT_S)
        with self.assertRaises(sinew.ProtocolError):
            await c.publish("t", b"x")
        self.assertEqual((self.accepted, sleeps), (1, []))

    async def test_unsupported_version_in_hello_ok_is_fatal(self) -> None:
        async def script(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
            _, rid, _ = await read_frame(r)
            wr.write(w.encode_frame(w.HelloOK(protocol_version=2), rid))
            await r.read()

        with self.assertRaises(sinew.ProtocolError):
            await sinew.connect(await self.serve(script))
        self.assertEqual(self.accepted, 1)


    async def test_publish_cut_before_confirm_is_resent_with_the_same_sequence(self) -> None:
        seen: list[tuple[str, int, bytes]] = []

        async def script(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
            await handshake(r, wr)
            while True:
                op, rid, b = await read_frame(r)
                if isinstance(b, w.Publish):
                    seen.append((b.producer_id, b.producer_seq, b.body))
                    if len(seen) == 1:
                        return  # the socket drops before the confirm
                    wr.write(w.encode_frame(w.PublishOK(0, 41, True), rid))
                elif op == w.END_SESSION:
                    wr.write(w.encode_frame(w.Ok(), rid))
                    await wr.drain()
                    return

        c = await sinew.connect(await self.serve(script), sleep=no_sleep)
        self.addAsyncCleanup(c.close)
        r = await asyncio.wait_for(c.publish("t", b"once"), WAIT_S)
        self.assertEqual((r.offset, r.duplicate), (41, True))
        self.assertEqual(len(seen), 2)
        self.assertEqual(seen[0], seen[1])
        self.assertTrue(seen[0][0].startswith("py-") and seen[0][1] == 1)

    async def test_shutting_down_publish_goes_to_the_next_connection(self) -> None:
        conns: list[int] = []

        async def script(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
            conns.append(1)
            await handshake(r, wr)
            if len(conns) == 1:
                wr.write(w.encode_frame(w.GoingAway(2**62, 30_000, "shutdown", ""), 0))
            while True:
                op, rid, b = await read_frame(r)
                if isinstance(b, w.Publish) and len(conns) == 1:
                    wr.write(w.encode_frame(w.ErrorBody(16, "draining", False), rid))
                elif isinstance(b, w.Publish):
                    wr.write(w.encode_frame(w.PublishOK(0, 7, False), rid))
                elif op == w.END_SESSION:
                    wr.write(w.encode_frame(w.Ok(), rid))
                    await wr.drain()
                    return

        c = await sinew.connect(await self.serve(script), sleep=no_sleep)
        self.addAsyncCleanup(c.close)
        # Sent before GOING_AWAY is read: refused with shutting_down, kept,
        # and sent again once the client has left the draining connection.
        r = await asyncio.wait_for(c.publish("t", b"x"), WAIT_S)
        self.assertEqual(r.offset, 7)
        self.assertEqual(len(conns), 2)

    async def test_silent_peer_is_left_after_three_heartbeats(self) -> None:
        async def script(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
            await handshake(r, wr)
            if self.accepted == 1:
                await r.read()  # says nothing, answers no PING, until the client leaves
                return
            while True:
                op, rid, _ = await read_frame(r)
                if op == w.PUBLISH:
                    wr.write(w.encode_frame(w.PublishOK(0, 1, False), rid))
                elif op == w.END_SESSION:
                    wr.write(w.encode_frame(w.Ok(), rid))
                    await wr.drain()
                    return

        c = await sinew.connect(await self.serve(script), heartbeat_ms=20, sleep=no_sleep)
        self.addAsyncCleanup(c.close)
        await asyncio.wait_for(c.publish("t", b"x"), WAIT_S)  # answered on the second connection
        self.assertEqual(self.accepted, 2)

    async def test_reconcile_decisions_and_stale_inflight(self) -> None:
        # Decisions the real broker makes only in rare states (a subscription
        # lost while its session was kept): close client side, recreate
        # (which succeeds for one and fails for another), keep, and an
        # in-flight delivery the broker no longer holds.
        seen: dict[str, object] = {}

        async def script(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
            op, rid, hello = await read_frame(r)
            assert isinstance(hello, w.Hello)
            limits = w.Limits(65536, 1 << 20, 1000, 256, 64, 16)
            ident = w.ResumeIdentity("c-1", "o-1", b"t")
            if self.accepted == 1:
                wr.write(w.encode_frame(w.HelloOK(1, "s", ident, 0, 1, 0, 30_000, limits), rid))
                for sub_id in (1, 2, 3, 4):
                    op, rid, _ = await read_frame(r)
                    assert op == w.SUBSCRIBE
                    wr.write(w.encode_frame(w.SubscribeOK(sub_id, [0], 10), rid))
                wr.write(w.encode_frame(w.Deliver(3, 77, 0, 5, 1, 0, b"", [], "", b"held", "t3", "", 9), 0))
                await wr.drain()
                await r.read(1)  # the client reads the delivery, then the test cuts
                return
            seen["resume"] = hello.resume
            wr.write(w.encode_frame(w.HelloOK(1, "s", ident, 1, 1, 0, 30_000, limits), rid))
            op, rid, rec = await read_frame(r)
            assert isinstance(rec, w.Reconcile)
            seen["reconcile"] = sorted(v.sub_id for v in rec.subs)
            entries = [w.ReconcileEntry(2, 1, 0, reason="mismatched"), w.ReconcileEntry(4, 2, 0, reason="missing"),
                       w.ReconcileEntry(1, 3, 3, reason="matched"), w.ReconcileEntry(4, 4, 0, reason="missing")]
            wr.write(w.encode_frame(w.ReconcileResult(entries), rid))
            op, rid, inf = await read_frame(r)
            assert isinstance(inf, w.Inflight)
            seen["inflight"] = [e.tag for e in inf.entries]
            wr.write(w.encode_frame(w.InflightResult([77], 0, 0), rid))
            while True:
                op, rid, b = await read_frame(r)
                if isinstance(b, w.Subscribe) and b.topic == "t2":
                    wr.write(w.encode_frame(w.SubscribeOK(8, [0], 10), rid))
                elif isinstance(b, w.Subscribe):
                    wr.write(w.encode_frame(w.ErrorBody(20, "prefetch above the limit", False), rid))
                elif isinstance(b, w.Publish):
                    wr.write(w.encode_frame(w.PublishOK(0, 1, False), rid))
                    wr.write(w.encode_frame(w.Deliver(8, 78, 0, 1, 1, 0, b"", [], "", b"new", "t2", "", 1), 0))
                elif op == w.END_SESSION:
                    wr.write(w.encode_frame(w.Ok(), rid))
                    await wr.drain()
                    return

        addr = await self.serve(script)
        c = await sinew.connect(addr, sleep=no_sleep)
        self.addAsyncCleanup(c.close)
        subs = [await c.subscribe(f"t{i}") for i in (1, 2, 3, 4)]
        held = await asyncio.wait_for(subs[2].__anext__(), WAIT_S)
        assert c._live is not None
        c._live.close(sinew.ConnectionLostError("cut by the test"))
        with self.assertRaises(sinew.ReconciledClosedError):
            await asyncio.wait_for(subs[0].__anext__(), WAIT_S)
        with self.assertRaises(sinew.RecreatedError) as cm:
            await asyncio.wait_for(subs[3].__anext__(), WAIT_S)
        self.assertIsInstance(cm.exception.__cause__, sinew.BrokerError)
        await asyncio.wait_for(c.publish("t2", b"new"), WAIT_S)
        m = await asyncio.wait_for(subs[1].__anext__(), WAIT_S)  # recreated under its new id
        self.assertEqual(m.body, b"new")
        with self.assertRaises(sinew.StaleDeliveryError):
            await held.complete()  # the broker said it no longer holds it
        self.assertIsNone(subs[2].end_reason)  # kept
        self.assertEqual(seen["resume"], w.ResumeIdentity("c-1", "o-1", b"t"))
        self.assertEqual(seen["reconcile"], [1, 2, 3, 4])
        self.assertEqual(seen["inflight"], [77])


async def no_sleep(d: float) -> None:
    """An injected backoff sleep that waits no real time."""
    await asyncio.sleep(0)


if __name__ == "__main__":
    unittest.main()
