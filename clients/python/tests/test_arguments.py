"""Bad arguments are refused at the call with InvalidArgumentError, before
anything changes: no request is left registered to be resent at the next
cut, no publish-window slot or sequence number is used, and the client
carries on. Against a real `sinew serve` through a loopback fault proxy."""

from __future__ import annotations

from typing import Any

import sinew

from test_broker import BrokerCase, Recorder, recv, within


class Arguments(BrokerCase):
    async def refused(self, aw: Any, argument: str) -> None:
        with self.assertRaises(sinew.InvalidArgumentError) as cm:
            await within(aw)
        self.assertEqual(cm.exception.argument, argument)
        self.assertIsInstance(cm.exception, ValueError)
        self.assertFalse(cm.exception.retryable)

    async def refused_then_cut(self, **bad: Any) -> None:
        """A publish with a bad argument, then a cut: the session resumes and
        the next publish is stored; the bad one was neither kept nor resent."""
        c = await self.client(sleep=Recorder())
        await c.declare_queue("py-args-cut", partitions=2)
        with self.assertRaises(Exception) as cm:
            await within(c.publish("py-args-cut", b"x", **bad))
        self.proxy.cut_all()
        r = await within(c.publish("py-args-cut", b"after the cut", partition=1))
        self.assertEqual(r.partition, 1)
        self.assertEqual(c.last_outcome, 1)  # resumed
        self.assertIsNone(c._fatal)
        self.assertIsInstance(cm.exception, sinew.InvalidArgumentError)

    async def test_partition_2_31_is_not_resent_at_the_next_cut(self) -> None:
        await self.refused_then_cut(partition=2**31)

    async def test_float_delay_is_not_resent_at_the_next_cut(self) -> None:
        await self.refused_then_cut(delay_ms=500.0)

    async def test_bad_arguments_are_refused_and_the_client_carries_on(self) -> None:
        c = await self.client(sleep=Recorder())
        await c.declare_queue("py-args", partitions=2)
        seq = c._producer_seq
        for _ in range(3):
            await self.refused(c.publish("py-args", b"x", partition=2**31), "partition")
            await self.refused(c.publish("py-args", b"x", partition=0.5), "partition")  # type: ignore[arg-type]
            await self.refused(c.publish("py-args", b"x", partition=-2), "partition")
            await self.refused(c.publish("py-args", b"x", delay_ms=500.0), "delay_ms")  # type: ignore[arg-type]
            await self.refused(c.publish("py-args", b"x", ttl_ms=1.5), "ttl_ms")  # type: ignore[arg-type]
            await self.refused(c.publish("py-args", b"x", delay_ms=-1), "delay_ms")
        await self.refused(c.publish("py-args", 42), "body")  # type: ignore[arg-type]
        await self.refused(c.publish(7, b"x"), "topic")  # type: ignore[arg-type]
        await self.refused(c.publish("py-args", b"x", key=5), "key")  # type: ignore[arg-type]
        await self.refused(c.publish("py-args", b"x", headers={"a": 1}), "headers")  # type: ignore[arg-type]
        await self.refused(c.publish("py-args", b"x", headers={"sinew.reason": "x"}), "headers")
        await self.refused(c.publish("py-args", b"x", headers=[(f"h{i}", "v") for i in range(257)]), "headers")
        await self.refused(c.publish("py-args", bytes(2 << 20)), "body")
        await self.refused(c.subscribe("py-args", partition=2**31), "partition")
        await self.refused(c.subscribe("py-args", prefetch=-1), "prefetch")
        await self.refused(c.subscribe("py-args", auto_ack="yes"), "auto_ack")  # type: ignore[arg-type]
        await self.refused(c.declare_queue("py-args", max_retries=1.5), "max_retries")  # type: ignore[arg-type]
        await self.refused(c.declare_queue("py-args", dead_letter_mode=9), "dead_letter_mode")
        await self.refused(c.declare_queue("py-args", lease_ms=2**63), "lease_ms")
        await self.refused(c.delete_queue("py-args", group=3), "group")  # type: ignore[arg-type]
        await self.refused(sinew.connect(self.proxy.addr, heartbeat_ms=-1), "heartbeat_ms")
        await self.refused(sinew.connect(self.proxy.addr, client_name=7), "client_name")  # type: ignore[arg-type]
        with self.assertRaises(sinew.InvalidArgumentError):
            sinew.ReconnectPolicy(factor="2")  # type: ignore[arg-type]
        self.assertEqual(c._producer_seq, seq, "a refused publish used a sequence number")
        self.assertEqual(c._window.n, 0, "a refused publish kept a window slot")

        # The next good calls work.
        r = await within(c.publish("py-args", b"a", partition=1))
        self.assertEqual(r.partition, 1)
        await within(c.publish("py-args", b"b", partition=1, delay_ms=0, ttl_ms=60_000))
        sub = await c.subscribe("py-args", partition=1, prefetch=4)
        m = await recv(sub)
        await self.refused(m.retry_after(500.0), "delay_ms")  # type: ignore[arg-type]
        await self.refused(m.retry_after(-5), "delay_ms")
        await within(m.complete())  # the refused settles did not count

        # A cut: nothing refused earlier is sent again, and the client stays healthy.
        self.proxy.cut_all()
        r2 = await within(c.publish("py-args", b"c", partition=0))
        self.assertEqual(r2.partition, 0)
        self.assertEqual(c.last_outcome, 1)  # resumed
        m2 = await recv(sub)
        self.assertEqual(m2.body, b"b")
        await within(m2.complete())
        self.assertIsNone(c._fatal)
