"""Ending an `async for` early ends the subscription: `async with sub`,
`sub.aclose()` (and so `contextlib.aclosing(sub)`) unsubscribe, and the broker
hands the messages the subscription had prefetched to the next consumer at
once, without using a retry."""

from __future__ import annotations

import asyncio
import contextlib

import sinew

from test_broker import BrokerCase, recv, until, within

HANDOVER_S = 3.0  # the next consumer gets the released messages within this


class LeavingTheLoop(BrokerCase):
    async def prepare(self, c: sinew.Client, topic: str) -> None:
        # No retries and a long lease: a message that came back by using a
        # retry would be dead-lettered, and none comes back by lease expiry here.
        await c.declare_queue(topic, partitions=1, max_retries=0, lease_ms=60_000)
        for i in range(4):
            await c.publish(topic, f"m{i}")

    async def handed_over(self, c: sinew.Client, topic: str) -> list[str]:
        sub = await c.subscribe(topic, prefetch=16)
        got = [await asyncio.wait_for(sub.__anext__(), HANDOVER_S) for _ in range(3)]
        for m in got:
            await within(m.complete())
        return sorted(m.text for m in got)

    async def test_async_with_releases_prefetched_messages(self) -> None:
        c, c2 = await self.client(), await self.client()
        await self.prepare(c, "py-loop-with")
        completed = None
        async with await c.subscribe("py-loop-with", prefetch=16) as sub:
            async for m in sub:
                self.assertEqual(m.text, "m0")
                await until(lambda: sub._buf.qsize() >= 3)  # the other three are prefetched
                # Not awaited: it must still reach the broker before the release.
                completed = asyncio.ensure_future(m.complete())
                break
        assert completed is not None
        await within(completed)
        self.assertIsInstance(sub.end_reason, sinew.UnsubscribedError)
        self.assertEqual(await self.handed_over(c2, "py-loop-with"), ["m1", "m2", "m3"])
        self.assertEqual(await c.purge_queue("py-loop-with"), 0)

    async def test_aclosing_releases_prefetched_messages(self) -> None:
        c, c2 = await self.client(), await self.client()
        await self.prepare(c, "py-loop-aclose")
        sub = await c.subscribe("py-loop-aclose", prefetch=16)
        async with contextlib.aclosing(sub):
            async for m in sub:
                await until(lambda: sub._buf.qsize() >= 3)
                await m.complete()
                break
        self.assertEqual(await self.handed_over(c2, "py-loop-aclose"), ["m1", "m2", "m3"])
        await sub.aclose()  # a second close is harmless
        with self.assertRaises(StopAsyncIteration):
            await sub.__anext__()

    async def test_exception_in_async_with_ends_the_subscription(self) -> None:
        c = await self.client()
        await self.prepare(c, "py-loop-raise")
        with self.assertRaises(RuntimeError):
            async with await c.subscribe("py-loop-raise", prefetch=16) as sub:
                async for m in sub:
                    await m.complete()
                    raise RuntimeError("handler failed")
        self.assertIsInstance(sub.end_reason, sinew.UnsubscribedError)
        self.assertEqual(await self.handed_over(c, "py-loop-raise"), ["m1", "m2", "m3"])
