"""Cluster routing against scripted nodes (a node that refuses publishes
while it still answers cannot be made from one real broker): a client dialled
with one address learns the cluster's nodes from METADATA, a refusal
(unavailable, fenced, not_owner) moves it to another node where the publish
is stored once, GOING_AWAY's redirect is followed, and a single broker's
refusal is still the publish's outcome."""

from __future__ import annotations

import asyncio
import unittest

import sinew
from sinew import _wire as w

WAIT_S = 10.0
FENCED, UNAVAILABLE, NOT_OWNER = 25, 15, 24


async def read_frame(r: asyncio.StreamReader) -> tuple[int, int, w.Body]:
    head = await r.readexactly(16)
    n, _, op, _, rid = w.parse_header(head, w.FRAME_BYTES_DEFAULT)
    return op, rid, w.decode_body(op, await r.readexactly(n))


class Node:
    """A scripted node: answers HELLO, PING, METADATA, PUBLISH, END_SESSION."""

    def __init__(self) -> None:
        self.publishes: list[w.Publish] = []
        self.stored: list[w.Publish] = []
        self.refuse = 0  # the code every publish is refused with (0: stored)
        self.owner = ""
        self.metadata: w.MetadataResult | None = None  # None: unknown_op
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self) -> Node:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.addr = "127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        for wr in self.writers:
            wr.transport.abort()
        self.server.close()

    def going_away(self, redirect: str) -> None:
        for wr in self.writers:
            wr.write(w.encode_frame(w.GoingAway(2**62, 0, "test", redirect), 0))

    async def handle(self, r: asyncio.StreamReader, wr: asyncio.StreamWriter) -> None:
        self.writers.append(wr)
        try:
            while True:
                op, rid, body = await read_frame(r)
                if op == w.HELLO:
                    # A node that answers METADATA as a cluster node says it is one.
                    ok = w.HelloOK(1, "scripted", w.ResumeIdentity("c-" + self.addr, "o", b"t"), 0, 1, 0, 0,
                                   w.Limits(65536, 1 << 20, 1000, 256, 64, 16),
                                   cluster=bool(self.metadata is not None and getattr(self.metadata, "cluster", False)))
                    wr.write(w.encode_frame(ok, rid))
                elif op == w.PING:
                    wr.write(w.encode_frame(w.Pong(), rid))
                elif op == w.METADATA:
                    if self.metadata is None:
                        wr.write(w.encode_frame(w.ErrorBody(4, "unknown op", False), rid))
                    else:
                        wr.write(w.encode_frame(self.metadata, rid))
                elif op == w.PUBLISH:
                    assert isinstance(body, w.Publish)
                    self.publishes.append(body)
                    if self.refuse:
                        wr.write(w.encode_frame(w.ErrorBody(self.refuse, "refused", False, self.owner), rid))
                    else:
                        self.stored.append(body)
                        wr.write(w.encode_frame(w.PublishOK(0, len(self.stored) - 1, False), rid))
                elif op == w.END_SESSION:
                    wr.write(w.encode_frame(w.Ok(), rid))
                    await wr.drain()
                    return
                else:
                    wr.write(w.encode_frame(w.Ok(), rid))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            wr.transport.abort()


def cluster_of(owner: str, *replicas: str) -> w.MetadataResult:
    return w.MetadataResult(True, [w.PartitionMeta(0, owner, 2, list(replicas))])


async def until(cond, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not cond():
        if loop.time() > deadline:
            raise AssertionError("timed out waiting until " + what)
        await asyncio.sleep(0.001)


class ClusterRouting(unittest.IsolatedAsyncioTestCase):
    async def nodes(self, n: int) -> list[Node]:
        out = []
        for _ in range(n):
            node = await Node().start()
            self.addCleanup(node.stop)
            out.append(node)
        return out

    async def test_refusal_moves_the_publish_to_another_node(self) -> None:
        for code in (FENCED, UNAVAILABLE):
            with self.subTest(code=code):
                a, b = await self.nodes(2)
                a.metadata = cluster_of(a.addr, a.addr, b.addr)
                c = await sinew.connect(a.addr)
                try:
                    await c.publish("orders", b"one")  # METADATA says a is clustered
                    await until(lambda: c._clustered is True, "the client learns the cluster")
                    a.refuse = code
                    r = await asyncio.wait_for(c.publish("orders", b"two"), WAIT_S)
                    self.assertFalse(r.duplicate)
                    self.assertEqual(len(a.publishes), 2, "the refusing node got the publish once")
                    self.assertEqual(len(b.stored), 1)
                    self.assertEqual(b.stored[0].producer_seq, a.publishes[1].producer_seq)
                finally:
                    await c.close()

    async def test_not_owner_moves_to_the_owner(self) -> None:
        a, b = await self.nodes(2)
        a.metadata = cluster_of(b.addr, a.addr, b.addr)
        c = await sinew.connect(a.addr)
        try:
            a.refuse, a.owner = NOT_OWNER, b.addr
            # The first publish's refusal may come before the METADATA
            # answer: it waits for it.
            await asyncio.wait_for(c.publish("orders", b"x"), WAIT_S)
            self.assertEqual(len(b.stored), 1)
        finally:
            await c.close()

    async def test_a_node_naming_a_refusing_node_as_owner_is_passed_over(self) -> None:
        a, b, d = await self.nodes(3)
        a.metadata = cluster_of(a.addr, a.addr, b.addr, d.addr)
        c = await sinew.connect(a.addr)
        try:
            await c.publish("orders", b"one")
            await until(lambda: c._clustered is True, "the client learns the cluster")
            a.refuse = FENCED
            b.refuse, b.owner = NOT_OWNER, a.addr  # an older view
            await asyncio.wait_for(c.publish("orders", b"two"), WAIT_S)
            self.assertEqual((len(a.publishes), len(b.publishes), len(d.stored)), (2, 1, 1))
        finally:
            await c.close()

    async def test_single_broker_refusal_is_the_outcome(self) -> None:
        (a,) = await self.nodes(1)
        a.metadata = w.MetadataResult(False, [])
        c = await sinew.connect(a.addr)
        try:
            await c.publish("orders", b"one")
            await until(lambda: c._clustered is False, "the client learns it is a single broker")
            a.refuse = UNAVAILABLE
            with self.assertRaises(sinew.BrokerError) as cm:
                await asyncio.wait_for(c.publish("orders", b"two"), WAIT_S)
            self.assertEqual(cm.exception.code, UNAVAILABLE)
            self.assertEqual(len(a.publishes), 2)
        finally:
            await c.close()

    async def test_going_away_redirect_sends_new_work_there(self) -> None:
        a, b = await self.nodes(2)
        c = await sinew.connect(a.addr)
        try:
            await c.publish("orders", b"before")
            a.going_away(b.addr)
            await until(lambda: c._target == b.addr, "the client takes the redirect")
            r = await asyncio.wait_for(c.publish("orders", b"after"), WAIT_S)
            self.assertEqual(r.offset, 0)
            self.assertEqual((len(a.stored), len(b.stored)), (1, 1))
        finally:
            await c.close()


if __name__ == "__main__":
    unittest.main()
