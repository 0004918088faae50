"""Partition hints (docs/protocol.md 5.6, "Partition hints"): a keyless
publish goes to the partition the broker hinted in its answer to the last
one to the same queue, explicitly; resends keep it; a hinted partition that
is gone (not_found) is left for a publish without one.

Against the real broker (Hints) and a scripted peer that writes exact
answers (ScriptedHints)."""

from __future__ import annotations

import asyncio
import unittest

import sinew
from sinew import _wire as w
from sinew.errors import CODE_NOT_FOUND

from test_broker import BrokerCase, within
from test_scripted import handshake, no_sleep, read_frame

WAIT_S = 10.0


class Hints(BrokerCase):
    async def test_keyless_publishes_avoid_a_backlogged_partition(self) -> None:
        # After the first (placed by its hash), each keyless publish goes to
        # the partition hinted in the answer to the one before, the less
        # loaded of two: a partition holding a backlog the others do not
        # receives none of them.
        c = await self.client()
        await within(c.declare_queue("leaning", partitions=4))
        for _ in range(200):
            r = await within(c.publish("leaning", b"waiting", partition=1))
            self.assertEqual(r.partition, 1)
        got = [0] * 4
        for i in range(120):
            r = await within(c.publish("leaning", b"keyless"))
            if i > 0:
                got[r.partition] += 1
        self.assertEqual(got[1], 0, f"keyless publishes per partition {got}: some went to the backlogged one")
        for p in (0, 2, 3):
            self.assertGreater(got[p], 0, f"keyless publishes per partition {got}: partition {p} got none")

    async def test_hinted_partition_gone_is_sent_again_unhinted(self) -> None:
        # The queue deleted and declared again with fewer partitions answers
        # not_found for the hinted one: the publish goes again without it
        # (nothing was stored), the application sees no error, and the
        # message is stored once.
        c = await self.client()
        await within(c.declare_queue("shrinks", partitions=4))
        for i in range(101):
            await within(c.publish("shrinks", b"before"))
            h = c._hints.get(("shrinks", ""))
            if h is not None and h >= 2:
                break
            self.assertLess(i, 100, "no hint of partition 2 or 3 in 100 publishes to 4 partitions")
        await within(c.delete_queue("shrinks"))
        await within(c.declare_queue("shrinks", partitions=2))
        r = await within(c.publish("shrinks", b"after"))
        self.assertIn(r.partition, (0, 1))
        self.assertEqual(await within(c.purge_queue("shrinks")), 1)
        self.assertEqual(c._window.n, 0)


class ScriptedHints(unittest.IsolatedAsyncioTestCase):
    async def serve(self, answer: object) -> str:
        """A peer that records every PUBLISH as (partition, key, seq) in
        self.seen and answers it with answer(publish, connection number), a
        body, or None to drop the connection."""
        self.seen: list[tuple[int, bytes, int]] = []
        self.conns = 0

        async def handle(r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
            self.conns += 1
            n = self.conns
            try:
                await handshake(r, wr)
                while True:
                    op, rid, b = await read_frame(r)
                    if isinstance(b, w.Publish):
                        self.seen.append((b.partition, b.key, b.producer_seq))
                        reply = answer(b, n)  # type: ignore[operator]
                        if reply is None:
                            return
                        wr.write(w.encode_frame(reply, rid))
                    elif op == w.END_SESSION:
                        wr.write(w.encode_frame(w.Ok(), rid))
                        await wr.drain()
                        return
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                wr.transport.abort()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.addCleanup(server.close)
        return "127.0.0.1:%d" % server.sockets[0].getsockname()[1]

    async def test_hints_place_keyless_publishes_and_resends_keep_them(self) -> None:
        cut = [True]

        def answer(p: w.Publish, conn: int) -> w.Body | None:
            if p.body == b"cut" and cut[0]:
                cut[0] = False
                return None  # the socket drops before the confirm
            nxt = 0 if p.body == b"no hint" else 3  # 3: partition 2
            return w.PublishOK(max(p.partition, 0), len(self.seen), False, nxt)

        c = await sinew.connect(await self.serve(answer), sleep=no_sleep)
        self.addAsyncCleanup(c.close)
        await asyncio.wait_for(c.publish("t", b"first"), WAIT_S)  # no hint yet: hashed
        r = await asyncio.wait_for(c.publish("t", b"cut"), WAIT_S)  # hinted, cut, resent
        self.assertEqual(r.partition, 2)
        await asyncio.wait_for(c.publish("t", b"keyed", key=b"k"), WAIT_S)
        await asyncio.wait_for(c.publish("t", b"chosen", partition=0), WAIT_S)
        await asyncio.wait_for(c.publish("t", b"other group", group="g"), WAIT_S)
        await asyncio.wait_for(c.publish("t", b"no hint"), WAIT_S)  # hinted; its answer drops the hint
        await asyncio.wait_for(c.publish("t", b"hashed"), WAIT_S)
        self.assertEqual(self.conns, 2)
        self.assertEqual([(part, key) for part, key, _ in self.seen], [
            (-1, b""),  # first
            (2, b""), (2, b""),  # cut, and its resend on the next connection
            (-1, b"k"),  # a key: never hinted
            (0, b""),  # a partition chosen by the application
            (-1, b""),  # another queue (group g) has no hint
            (2, b""),  # no hint
            (-1, b""),  # the hint was dropped
        ])
        self.assertEqual(self.seen[1][2], self.seen[2][2], "the resend keeps its sequence")

    async def test_not_found_for_a_hinted_partition_is_sent_again_without_it(self) -> None:
        def answer(p: w.Publish, conn: int) -> w.Body | None:
            if p.partition >= 2:
                return w.ErrorBody(CODE_NOT_FOUND, f"partition {p.partition} does not exist", False)
            return w.PublishOK(0, len(self.seen), False, 4)  # 4: partition 3

        c = await sinew.connect(await self.serve(answer), sleep=no_sleep)
        self.addAsyncCleanup(c.close)
        await asyncio.wait_for(c.publish("t", b"a"), WAIT_S)
        r = await asyncio.wait_for(c.publish("t", b"b"), WAIT_S)  # hinted to 3: not_found, sent again
        self.assertEqual(r.partition, 0)
        # An application's own partition that is gone is its error.
        with self.assertRaises(sinew.BrokerError) as cm:
            await asyncio.wait_for(c.publish("t", b"c", partition=2), WAIT_S)
        self.assertEqual(cm.exception.code, CODE_NOT_FOUND)
        self.assertEqual(self.seen[:3], [(-1, b"", 1), (3, b"", 2), (-1, b"", 2)])
        self.assertEqual(self.seen[3][0], 2)
        self.assertEqual((c._window.n, c._window.bytes), (0, 0))

    async def test_not_found_after_a_cut_send_is_the_outcome(self) -> None:
        # The first send to the hinted partition is cut off before its
        # answer: it may have been stored (a node with a newer catalogue),
        # so a not_found for the resend is the publish's outcome, never a
        # second send elsewhere.
        cut = [True]

        def answer(p: w.Publish, conn: int) -> w.Body | None:
            if p.partition == 3 and cut[0]:
                cut[0] = False
                return None
            if p.partition == 3:
                return w.ErrorBody(CODE_NOT_FOUND, "partition 3 does not exist", False)
            return w.PublishOK(0, len(self.seen), False, 4)  # 4: partition 3

        c = await sinew.connect(await self.serve(answer), sleep=no_sleep)
        self.addAsyncCleanup(c.close)
        await asyncio.wait_for(c.publish("t", b"a"), WAIT_S)
        with self.assertRaises(sinew.BrokerError) as cm:
            await asyncio.wait_for(c.publish("t", b"b"), WAIT_S)
        self.assertEqual(cm.exception.code, CODE_NOT_FOUND)
        self.assertEqual([part for part, _, _ in self.seen], [-1, 3, 3])
        self.assertEqual((c._window.n, c._window.bytes), (0, 0))

    async def test_hints_are_bounded_and_start_over(self) -> None:
        def answer(p: w.Publish, conn: int) -> w.Body | None:
            return w.PublishOK(0, len(self.seen), False, 0 if p.body == b"none" else 2)

        c = await sinew.connect(await self.serve(answer), sleep=no_sleep)
        self.addAsyncCleanup(c.close)
        bound = sinew.client.HINTS_MAX
        sinew.client.HINTS_MAX = 2
        self.addCleanup(setattr, sinew.client, "HINTS_MAX", bound)
        for topic in ("a", "b", "a"):  # a known queue past the bound is kept
            await asyncio.wait_for(c.publish(topic, b"x"), WAIT_S)
        self.assertEqual(c._hints, {("a", ""): 1, ("b", ""): 1})
        await asyncio.wait_for(c.publish("c", b"x"), WAIT_S)  # a new one starts over
        self.assertEqual(c._hints, {("c", ""): 1})
        await asyncio.wait_for(c.publish("c", b"none"), WAIT_S)  # no hint in the answer: dropped
        self.assertEqual(c._hints, {})


if __name__ == "__main__":
    unittest.main()
