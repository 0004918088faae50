"""Spanning subscriptions against three real `sinew serve --cluster` processes
on loopback: a consumer connected to one node gets every partition of a
queue whose partitions are owned by different nodes, keeps getting a
partition whose owner is killed (through the new owner), and a settle whose
node died is applied at the new owner by lease reference.

Each test starts its own cluster (about 2 s) and is bounded by TEST_LIMIT_S."""

from __future__ import annotations

import asyncio
import json
import socket
import unittest
import urllib.request

import sinew
from sinew import _wire as w

from harness import Broker

READY_S = 30.0  # a cluster (controller leader, three voters) or an owner must be there by then
TEST_LIMIT_S = 50.0
PARTITIONS = 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(admin: str, path: str) -> object | None:
    try:
        with urllib.request.urlopen(f"http://{admin}{path}", timeout=2) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


class Cluster:
    """Three nodes; the first bootstraps the controller, the others join it."""

    def __init__(self) -> None:
        self.nodes: list[Broker] = []
        self.admins: list[str] = []

    async def start(self) -> Cluster:
        first_gossip = ""
        for i in range(3):
            # A port picked free can be taken by another socket (an outgoing
            # connection's ephemeral port) before the node binds it: the node
            # then exits with "address already in use" and starts again on
            # newly picked ports (at most 4 times).
            for attempt in range(5):
                listen, admin, gossip, peer = (free_port() for _ in range(4))
                args = ["--admin-listen", f"127.0.0.1:{admin}", "--cluster", "--cluster-profile", "lan",
                        "--cluster-gossip-listen", f"127.0.0.1:{gossip}", "--cluster-peer-listen", f"127.0.0.1:{peer}",
                        "--connection-heartbeat-ms", "1000"]
                if i:
                    args += ["--cluster-seeds", first_gossip]
                b = Broker(*args)
                b.addr = f"127.0.0.1:{listen}"
                try:
                    await b.start()
                except RuntimeError:
                    if attempt < 4 and "address already in use" in "".join(b.log):
                        b.data.cleanup()
                        continue
                    raise
                break
            if not i:
                first_gossip = f"127.0.0.1:{gossip}"
            self.nodes.append(b)
            self.admins.append(f"127.0.0.1:{admin}")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + READY_S
        while True:
            v = await asyncio.to_thread(get_json, self.admins[0], "/api/v1/nodes")
            ctl = v.get("controller", {}) if isinstance(v, dict) else {}
            if ctl.get("leader") and len(ctl.get("voters") or []) == 3:
                return self
            if loop.time() > deadline:
                raise AssertionError("the controller did not reach three voters:\n" + self.logs())
            await asyncio.sleep(0.05)

    @property
    def addrs(self) -> list[str]:
        return [b.addr for b in self.nodes]

    def node(self, addr: str) -> Broker:
        return next(b for b in self.nodes if b.addr == addr)

    def logs(self) -> str:
        return "\n".join(f"--- {b.addr}\n" + "".join(b.log[-15:]) for b in self.nodes)

    async def close(self) -> None:
        for b in self.nodes:
            await b.close()


async def owners(c: sinew.Client, topic: str, not_on: str = "", partition: int = -1) -> dict[int, str]:
    """The queue's partition owners as METADATA names them, waiting while a
    partition has none (or, for partition, while it is still not_on)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_S
    while True:
        try:
            md = await asyncio.wait_for(c._request(w.Metadata(topic, "")), 2.0)
            got = {p.partition: p.owner for p in md.partitions}
            if len(got) == PARTITIONS and all(got.values()) and \
                    (partition < 0 or got[partition] != not_on):
                return got
        except (sinew.SinewError, asyncio.TimeoutError):
            pass
        if loop.time() > deadline:
            raise AssertionError(f"no owners for {topic} within {READY_S}s")
        await asyncio.sleep(0.1)


async def publish(cl: Cluster, own: dict[int, str], topic: str, n: int, start: int = 0) -> None:
    """Publishes n messages round-robin over the partitions, each through its owner."""
    pubs = {a: await sinew.connect(a) for a in set(own.values())}
    try:
        for i in range(start, start + n):
            p = i % PARTITIONS
            await asyncio.wait_for(pubs[own[p]].publish(topic, f"m{i}", partition=p), 10.0)
    finally:
        for c in pubs.values():
            await c.close()


class Spanning(unittest.IsolatedAsyncioTestCase):
    async def asyncSetUp(self) -> None:
        self.cl = await Cluster().start()
        self.addAsyncCleanup(self.cl.close)

    async def spread_queue(self, topic: str, lease_ms: int = 0) -> tuple[sinew.Client, dict[int, str]]:
        """Declares a queue of PARTITIONS partitions; returns an admin client
        and the owners, which must be on more than one node."""
        admin = await sinew.connect(self.cl.addrs[0])
        self.addAsyncCleanup(admin.close)
        await admin.declare_queue(topic, partitions=PARTITIONS, lease_ms=lease_ms)
        own = await owners(admin, topic)
        self.assertGreater(len(set(own.values())), 1, f"every partition owned by one node: {own}")
        return admin, own

    async def test_a_consumer_on_one_node_gets_every_partition(self) -> None:
        async def body() -> None:
            admin, own = await self.spread_queue("spread")
            await publish(self.cl, own, "spread", 60)
            # The consumer dials the first node only.
            c = await sinew.connect(self.cl.addrs[0])
            self.addAsyncCleanup(c.close)
            sub = await c.subscribe("spread", prefetch=100)
            seen: list[tuple[int, int, str]] = []
            while len({b for _, _, b in seen}) < 60:
                try:
                    m = await asyncio.wait_for(sub.__anext__(), 10.0)
                except asyncio.TimeoutError:
                    break
                seen.append((m.partition, m.offset, m.text))
                await m.complete(confirmed=True)
            # A quiet second more: nothing is delivered twice.
            try:
                m = await asyncio.wait_for(sub.__anext__(), 1.0)
                seen.append((m.partition, m.offset, m.text))
            except asyncio.TimeoutError:
                pass
            bodies = [b for _, _, b in seen]
            print(f"\nspread: owners {sorted(set(own.values()))}, published 60, delivered {len(seen)}, "
                  f"distinct {len(set(bodies))}, partitions {sorted({p for p, _, _ in seen})}")
            self.assertEqual(sorted(set(bodies)), sorted(f"m{i}" for i in range(60)), "every message delivered")
            self.assertEqual(len(bodies), 60, "each exactly once")
            self.assertEqual({p for p, _, _ in seen}, set(range(PARTITIONS)))
            # Closing the client closes every part's connection and ends the iteration.
            parts = [p.client for p in sub._span.parts.values()]
            md = await admin._request(w.Metadata("spread", ""))
            replicas = {r for pm in md.partitions for r in pm.replicas}
            self.assertEqual({pc.addr for pc in parts}, replicas, "one part per replica node")
            await c.close()
            self.assertTrue(all(pc._closed.is_set() and pc._live is None for pc in parts))
            with self.assertRaises(StopAsyncIteration):
                await asyncio.wait_for(sub.__anext__(), 5.0)

        await asyncio.wait_for(body(), TEST_LIMIT_S)

    async def test_owner_killed_while_consuming(self) -> None:
        async def body() -> None:
            admin, own = await self.spread_queue("failover")
            dialled = self.cl.addrs[0]
            victim = next(a for a in own.values() if a != dialled)
            lost_parts = sorted(p for p, a in own.items() if a == victim)
            await publish(self.cl, own, "failover", 60)
            c = await sinew.connect(dialled)
            self.addAsyncCleanup(c.close)
            sub = await c.subscribe("failover", prefetch=10)
            completed: set[str] = set()
            delivered: list[str] = []
            redelivered_after_complete: list[str] = []

            async def take(until: int, limit_s: float) -> None:
                while len(completed) < until:
                    m = await asyncio.wait_for(sub.__anext__(), limit_s)
                    delivered.append(m.text)
                    if m.text in completed:
                        redelivered_after_complete.append(m.text)
                        await m.complete()
                        continue
                    try:
                        await m.complete(confirmed=True)
                        completed.add(m.text)
                    except sinew.StaleDeliveryError:
                        pass  # the lease was lost with the node: it is delivered again

            await take(30, 10.0)
            await self.cl.node(victim).kill()
            new = await owners(admin, "failover")  # the partitions' new owners
            for p in lost_parts:
                new = await owners(admin, "failover", not_on=victim, partition=p)
            await publish(self.cl, new, "failover", 60, start=60)
            await take(120, 20.0)
            print(f"\nfailover: killed {victim} (partitions {lost_parts}), published 120, delivered "
                  f"{len(delivered)}, completed {len(completed)}, lost {120 - len(completed)}, "
                  f"redelivered after a complete {len(redelivered_after_complete)}")
            self.assertEqual(completed, {f"m{i}" for i in range(120)})
            self.assertEqual(redelivered_after_complete, [])
            # The killed node's partitions kept arriving after the kill.
            after = {int(t[1:]) % PARTITIONS for t in delivered[30:] if int(t[1:]) >= 60}
            self.assertTrue(set(lost_parts) <= after, f"{lost_parts} not delivered after the kill")

        await asyncio.wait_for(body(), TEST_LIMIT_S)

    async def test_settle_whose_node_died_applies_at_new_owner(self) -> None:
        async def body() -> None:
            # A short lease: a message whose settle was lost comes back soon.
            admin, own = await self.spread_queue("resettle", lease_ms=3000)
            dialled = self.cl.addrs[0]
            victim = next(a for a in own.values() if a != dialled)
            part = next(p for p, a in own.items() if a == victim)
            pub = await sinew.connect(victim)
            for i in range(2):
                await pub.publish("resettle", f"r{i}", partition=part)
            await pub.close()
            c = await sinew.connect(dialled)
            self.addAsyncCleanup(c.close)
            sub = await c.subscribe("resettle", prefetch=10)
            got = {}
            while len(got) < 2:
                m = await asyncio.wait_for(sub.__anext__(), 10.0)
                got[m.text] = m
            await self.cl.node(victim).kill()
            await owners(admin, "resettle", not_on=victim, partition=part)
            # r0 is completed after its node died: by lease reference at the new
            # owner. r1 is left unsettled, so the lease's expiry brings it back.
            with self.assertLogs("sinew", "INFO") as logs:
                await asyncio.wait_for(got["r0"].complete(confirmed=True), 15.0)
            self.assertTrue(any("by lease reference" in line for line in logs.output), logs.output)
            again: list[str] = []
            loop = asyncio.get_running_loop()
            end = loop.time() + 8.0  # past the 3 s lease
            while loop.time() < end:
                try:
                    m = await asyncio.wait_for(sub.__anext__(), end - loop.time())
                except asyncio.TimeoutError:
                    break
                again.append(m.text)
                await m.complete(confirmed=True)
            print(f"\nresettle: killed {victim} (partition {part}); {logs.output[-1]}; delivered again: {again}")
            self.assertIn("r1", again, "the unsettled message came back (the check can see a redelivery)")
            self.assertNotIn("r0", again, "the settle made after the node died was applied")

        await asyncio.wait_for(body(), TEST_LIMIT_S)

    async def test_extend_whose_node_died_applies_at_new_owner(self) -> None:
        async def body() -> None:
            admin, own = await self.spread_queue("reextend", lease_ms=3000)
            dialled = self.cl.addrs[0]
            victim = next(a for a in own.values() if a != dialled)
            part = next(p for p, a in own.items() if a == victim)
            pub = await sinew.connect(victim)
            await pub.publish("reextend", "x0", partition=part)
            await pub.close()
            c = await sinew.connect(dialled)
            self.addAsyncCleanup(c.close)
            sub = await c.subscribe("reextend", prefetch=10)
            m = await asyncio.wait_for(sub.__anext__(), 10.0)
            await self.cl.node(victim).kill()
            await owners(admin, "reextend", not_on=victim, partition=part)
            # Extended after its node died: by lease reference at the new
            # owner, well past the 3 s lease.
            with self.assertLogs("sinew", "INFO") as logs:
                await asyncio.wait_for(m.extend(20_000), 15.0)
            self.assertTrue(any("extend of" in line and "by lease reference" in line for line in logs.output),
                            logs.output)
            # Past the lease it had, the message has not come back: the
            # extension holds it.
            try:
                again = await asyncio.wait_for(sub.__anext__(), 5.0)
                self.fail(f"delivered again while extended: {again.text} attempt {again.attempt}")
            except asyncio.TimeoutError:
                pass
            await asyncio.wait_for(m.complete(confirmed=True), 15.0)

        await asyncio.wait_for(body(), TEST_LIMIT_S)

    async def test_publisher_whose_node_was_killed_moves_on(self) -> None:
        async def body() -> None:
            admin = await sinew.connect(self.cl.addrs[0])
            self.addAsyncCleanup(admin.close)
            await admin.declare_queue("hop", partitions=PARTITIONS)
            home = (await owners(admin, "hop"))[0]
            # Connected to the partition's owner, which is then killed.
            pub = await sinew.connect(home)
            self.addAsyncCleanup(pub.close)
            await pub.publish("hop", "before-1", partition=0)  # it learns the cluster's nodes
            await asyncio.sleep(0.5)
            await pub.publish("hop", "before-2", partition=0)
            await self.cl.node(home).kill()
            t0 = asyncio.get_running_loop().time()
            await asyncio.wait_for(pub.publish("hop", "after", partition=0), 20.0)
            print(f"\nhop: a publish after {home} was killed confirmed in "
                  f"{asyncio.get_running_loop().time() - t0:.3f}s")

        await asyncio.wait_for(body(), TEST_LIMIT_S)

    async def test_subscribe_before_the_queue_exists(self) -> None:
        async def body() -> None:
            c = await sinew.connect(self.cl.addrs[0])
            self.addAsyncCleanup(c.close)
            # The first SUBSCRIBE makes the queue, as on a single node; then
            # the subscription spans its replicas.
            sub = await asyncio.wait_for(c.subscribe("later"), 15.0)
            self.assertIsNotNone(sub._span, "a subscription on a cluster node spans its replicas")
            self.assertGreaterEqual(len(sub._span.parts), 1)
            pub = await sinew.connect(self.cl.addrs[1])
            self.addAsyncCleanup(pub.close)
            await asyncio.wait_for(pub.publish("later", "hello"), 10.0)
            m = await asyncio.wait_for(sub.__anext__(), 10.0)
            self.assertEqual(m.text, "hello")
            await m.complete(confirmed=True)
            await sub.unsubscribe()
            self.assertEqual(sub._span.parts, {}, "unsubscribe closes every part")

        await asyncio.wait_for(body(), TEST_LIMIT_S)

    async def test_cohort_members_share_every_partition(self) -> None:
        async def body() -> None:
            _, own = await self.spread_queue("shared")
            await publish(self.cl, own, "shared", 60)
            subs = []
            for i in range(2):
                c = await sinew.connect(self.cl.addrs[0])
                self.addAsyncCleanup(c.close)
                subs.append(await c.subscribe("shared", cohort="g", prefetch=100))
            seen: list[list[str]] = [[], []]

            async def take(i: int) -> None:
                while True:
                    try:
                        m = await asyncio.wait_for(subs[i].__anext__(), 3.0)
                    except asyncio.TimeoutError:
                        return
                    seen[i].append(m.text)
                    await m.complete(confirmed=True)

            await asyncio.gather(take(0), take(1))
            both = seen[0] + seen[1]
            print(f"\ncohort: published 60, member 0 got {len(seen[0])}, member 1 got {len(seen[1])}, "
                  f"distinct {len(set(both))}")
            self.assertEqual(sorted(set(both)), sorted(f"m{i}" for i in range(60)))
            self.assertEqual(len(both), 60, "each exactly once")

        await asyncio.wait_for(body(), TEST_LIMIT_S)


if __name__ == "__main__":
    unittest.main()
