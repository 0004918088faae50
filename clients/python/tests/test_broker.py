"""The client against a real `sinew serve` child process, directly or through
a loopback fault proxy: cut sockets inside the reconnect grace, a restart with
drain, refused connections with backoff, a fatal handshake error and typed
subscription ends.

Waits are bounded (WAIT_S) and wait for events, never for time to pass.
Backoff sleeps are injected, so no test sleeps for real seconds.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import ssl
import subprocess
import tempfile
import unittest
from collections.abc import Awaitable
from typing import Any, TypeVar

import sinew
from sinew import _wire as w

from harness import Broker, FaultProxy, broker_binary

WAIT_S = 15.0  # bound on any single wait in these tests
T = TypeVar("T")


async def within(aw: Awaitable[T]) -> T:
    return await asyncio.wait_for(aw, WAIT_S)


async def recv(sub: sinew.Subscription) -> sinew.Message:
    return await within(sub.__anext__())


async def until(cond: Any) -> None:
    """Waits (bounded) until cond() holds, yielding to the event loop."""
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.005)
    await within(poll())


class Recorder:
    """An injected backoff sleep: records each delay, waits no real time, and
    runs a hook after a given number of sleeps."""

    def __init__(self, at: int = 0, hook: Any = None) -> None:
        self.delays: list[float] = []
        self.at = at
        self.hook = hook

    async def __call__(self, d: float) -> None:
        self.delays.append(d)
        if self.hook is not None and len(self.delays) == self.at:
            await self.hook()
        await asyncio.sleep(0.001)  # let the loop run; not a wait for a condition


class BrokerCase(unittest.IsolatedAsyncioTestCase):
    broker_args: tuple[str, ...] = ()

    async def asyncSetUp(self) -> None:
        self.broker = Broker(*self.broker_args)
        await self.broker.start()
        self.addCleanup(self.broker.data.cleanup)
        self.proxy = FaultProxy(self.broker.addr)
        await self.proxy.start()
        self.clients: list[sinew.Client] = []

    async def asyncTearDown(self) -> None:
        for c in self.clients:
            await c.close()
        await self.proxy.close()
        await self.broker.kill()

    async def client(self, addr: str | None = None, **kw: Any) -> sinew.Client:
        c = await sinew.connect(addr or self.proxy.addr, **kw)
        self.clients.append(c)
        return c


class Basics(BrokerCase):
    async def test_publish_worker_retry_and_dead_letter(self) -> None:
        c = await self.client()
        d = await c.declare_queue("jobs", max_retries=3, dead_letter_mode=sinew.DEAD_LETTER_QUEUE,
                                  dead_letter_target="jobs-dead")
        self.assertTrue(d.created)
        r = await c.publish("jobs", "resize", headers={"kind": "image"}, key=b"k1")
        self.assertFalse(r.duplicate)
        sub = await c.subscribe("jobs", prefetch=4)
        m = await recv(sub)
        self.assertEqual((m.text, m.attempt, m.offset, m.header("kind")), ("resize", 1, r.offset, "image"))
        await m.retry()
        m2 = await recv(sub)
        self.assertEqual((m2.offset, m2.attempt), (r.offset, 2))
        await m2.fail()
        with self.assertRaises(sinew.AlreadySettledError):
            await m2.complete()
        dead = await c.subscribe("jobs-dead")
        dm = await recv(dead)
        self.assertEqual((dm.text, dm.header("sinew.reason"), dm.header("sinew.source.topic")),
                         ("resize", "failed", "jobs"))
        await dm.complete()

    async def test_publish_resend_is_idempotent(self) -> None:
        c = await self.client()
        r = await c.publish("idem", b"once")
        # The same producer id and sequence sent again, as a resend after a
        # lost confirm would be: stored once, answered with the original.
        again = await c._request(w.Publish("idem", "", -1, b"", [], "", 0, 0, 0, c._producer_id,
                                           c._producer_seq, b"once"))
        self.assertEqual((again.partition, again.offset, again.duplicate), (r.partition, r.offset, True))

    async def test_nack_delay_above_cap_is_refused_and_lease_kept(self) -> None:
        c = await self.client()
        await c.publish("capped", b"x")
        sub = await c.subscribe("capped")
        m = await recv(sub)
        with self.assertRaises(sinew.BrokerError) as cm:
            await m.retry_after(10**15, confirmed=True)
        self.assertEqual(cm.exception.name, "bad_request")
        await m.complete(confirmed=True)  # the lease is still ours


class CutSocket(BrokerCase):
    async def test_cut_inside_grace_no_error_no_redelivery(self) -> None:
        c = await self.client()
        sub = await c.subscribe("cut", prefetch=8)
        await c.publish("cut", b"before")
        held = await recv(sub)
        for round_ in range(3):
            self.proxy.cut_all()
            body = f"after-{round_}".encode()
            r = await within(c.publish("cut", body))  # waits for the resumed session, no error
            m = await recv(sub)
            self.assertEqual((m.body, m.offset, m.attempt), (body, r.offset, 1))
            # Settle sent, then the socket cut before its result: held and
            # sent again on the resumed session.
            done = asyncio.ensure_future(m.complete())
            await asyncio.sleep(0)
            self.proxy.cut_all()
            await within(done)
            self.assertEqual(c.last_outcome, 1)  # resumed
        await held.complete()  # the pre-cut lease is still ours
        await c.publish("cut", b"marker")
        nxt = await recv(sub)
        self.assertEqual(nxt.body, b"marker", "a settled message came back")

    async def test_seeded_cuts_under_load_lose_and_repeat_nothing(self) -> None:
        # Publishes and settles flow while the socket is cut at seeded
        # moments. Every session is resumed, so every publish is confirmed
        # once, every message reaches the application exactly once, and
        # every settle succeeds.
        rng = random.Random(15)
        total = 400
        c = await self.client(sleep=Recorder())
        sub = await c.subscribe("soak", prefetch=32)
        cut_at = set(rng.sample(range(1, total), 12))
        got: dict[int, bytes] = {}

        async def consume() -> None:
            while len(got) < total:
                m = await recv(sub)
                self.assertNotIn(m.offset, got, "a message reached the application twice")
                got[m.offset] = m.body
                await m.complete()

        consumer = asyncio.ensure_future(consume())
        sem = asyncio.Semaphore(64)
        results: list[sinew.PublishResult] = []

        async def pub(i: int) -> None:
            async with sem:
                if i in cut_at:
                    self.proxy.cut_all()
                results.append(await c.publish("soak", b"m%d" % i))

        await within(asyncio.gather(*(pub(i) for i in range(total))))
        await within(consumer)
        self.assertEqual(len({r.offset for r in results}), total)
        self.assertEqual(sorted(got.values()), sorted(b"m%d" % i for i in range(total)))
        self.assertEqual(c.last_outcome, 1)
        self.assertGreaterEqual(self.proxy.accepted, 2)

    async def test_auto_ack_subscription_survives_cuts(self) -> None:
        c = await self.client()
        sub = await c.subscribe("cut-auto", auto_ack=True)
        for i in range(3):
            await within(c.publish("cut-auto", str(i)))
            m = await recv(sub)
            self.assertEqual(m.text, str(i))
            with self.assertRaises(sinew.AlreadySettledError):
                await m.complete()
            self.proxy.cut_all()


class QueueDeletedWhileCut(BrokerCase):
    async def test_subscription_ends_not_found_after_resume(self) -> None:
        admin = await self.client(self.broker.addr)
        await admin.declare_queue("gone")
        c = await self.client(sleep=Recorder())
        sub = await c.subscribe("gone")
        await self.proxy.refuse(True)
        self.proxy.cut_all()
        await admin.delete_queue("gone")
        await self.proxy.refuse(False)
        # The deletion reaches the dormant session; the resumed client hears
        # of it and the subscription ends with a typed reason, not silently.
        with self.assertRaises(sinew.BrokerError) as cm:
            await recv(sub)
        self.assertEqual(cm.exception.name, "not_found")
        self.assertIsInstance(sub.end_reason, sinew.BrokerError)
        await within(c.publish("gone", b"x"))  # the client itself carries on
        self.assertEqual(c.last_outcome, 1)


class Restart(BrokerCase):
    async def test_restart_with_drain(self) -> None:
        fast = Recorder()
        c = await self.client(self.broker.addr, sleep=fast)
        sub = await c.subscribe("drain", prefetch=4)
        r1 = await c.publish("drain", b"one")
        m1 = await recv(sub)
        gen = c.server_generation
        stopping = asyncio.ensure_future(self.broker.stop())
        await until(lambda: c._live is None or c._live.draining)
        # During the drain's first phase the broker still takes settles.
        await within(m1.complete())
        later = asyncio.ensure_future(c.publish("drain", b"two"))  # waits for the next broker
        self.assertEqual(await within(stopping), 0)
        await self.broker.start()
        r2 = await within(later)
        self.assertNotEqual(c.server_generation, gen)
        self.assertEqual(c.last_outcome, 1)  # the session was kept across the planned restart
        self.assertGreater(r2.offset, r1.offset)
        m2 = await recv(sub)  # the subscription carried over the restart
        self.assertEqual((m2.body, m2.attempt), (b"two", 1))
        await m2.complete()
        self.assertTrue(all(d <= 0.5 * 1.1 for d in fast.delays), fast.delays)
        self.assertIsNone(sub.end_reason)


    async def test_kill_9_restart_resumes_the_session(self) -> None:
        c = await self.client(self.broker.addr, sleep=Recorder())
        sub = await c.subscribe("crash", prefetch=4)
        await c.publish("crash", b"held")
        m1 = await recv(sub)
        await self.broker.kill()  # kill -9: no GOING_AWAY
        await self.broker.start()  # sessions are restored from the data directory
        await within(c.publish("crash", b"marker"))
        self.assertEqual(c.last_outcome, 1)  # resumed
        await m1.complete()  # the lease survived the crash
        nxt = await recv(sub)
        self.assertEqual((nxt.body, nxt.attempt), (b"marker", 1), "the held message came back")
        await nxt.complete()
        self.assertIsNone(sub.end_reason)


class LostSession(BrokerCase):
    # A broker that restores no session after a restart.
    broker_args = ("--runtime-seed-connection-restart-grace-ms", "0")

    async def test_lost_session_fails_settles_stale_and_messages_return(self) -> None:
        c = await self.client(self.broker.addr, sleep=Recorder())
        sub = await c.subscribe("lost", prefetch=4)
        await c.publish("lost", b"held")
        m1 = await recv(sub)
        await self.broker.kill()
        await self.broker.start()
        # The client finds its session gone (resume_not_found), subscribes
        # again, and the message it had not settled comes back.
        m1b = await recv(sub)
        self.assertEqual((m1b.body, m1b.attempt), (b"held", 2))
        self.assertEqual(c.last_outcome, 2)
        with self.assertRaises(sinew.StaleDeliveryError):
            await m1.complete()
        await m1b.complete()
        self.assertIsNone(sub.end_reason)


class Backoff(BrokerCase):
    async def test_refused_connection_backs_off_then_connects(self) -> None:
        await self.proxy.refuse(True)
        rec = Recorder(at=4, hook=lambda: self.proxy.refuse(False))
        c = await self.client(sleep=rec, rand=lambda: 0.5)
        self.assertEqual(rec.delays, [0.1, 0.2, 0.4, 0.8])
        await c.publish("b", b"ok")

    async def test_reconnect_backoff_grows_and_resets_after_healthy_period(self) -> None:
        now = [1000.0]
        async def reopen() -> None:
            await self.proxy.refuse(False)
        rec = Recorder(at=3, hook=reopen)
        c = await self.client(sleep=rec, rand=lambda: 0.0, monotonic=lambda: now[0])
        sub = await c.subscribe("bo")
        await self.proxy.refuse(True)
        self.proxy.cut_all()
        await within(c.publish("bo", b"x"))  # waits through the outage, no error
        self.assertEqual([round(d, 6) for d in rec.delays], [0.09, 0.18, 0.36])
        # Healthy for less than reset_after: the next outage continues from
        # the failures so far (two attempts failed before the third worked).
        rec.delays.clear()
        rec.at = 2
        await self.proxy.refuse(True)
        self.proxy.cut_all()
        await within(c.publish("bo", b"y"))
        self.assertEqual([round(d, 6) for d in rec.delays], [0.36, 0.72])
        rec.at = 1
        # Healthy for reset_after (10 s on the injected clock): back to the start.
        now[0] += 10.0
        rec.delays.clear()
        await self.proxy.refuse(True)
        self.proxy.cut_all()
        await within(c.publish("bo", b"z"))
        self.assertEqual([round(d, 6) for d in rec.delays], [0.09])
        self.assertEqual([(await recv(sub)).text for _ in range(3)], ["x", "y", "z"])

    async def test_connect_gives_up_at_its_timeout(self) -> None:
        await self.proxy.refuse(True)
        now = [0.0]
        delays: list[float] = []

        async def sleep(d: float) -> None:
            delays.append(d)
            now[0] += d

        with self.assertRaises(sinew.DisconnectedError) as cm:
            await sinew.connect(self.proxy.addr, sleep=sleep, monotonic=lambda: now[0], rand=lambda: 0.5,
                                connect_timeout_ms=2000)
        self.assertTrue(cm.exception.retryable)
        self.assertEqual(delays, [0.1, 0.2, 0.4, 0.8])  # the next, 1.6 s, would end at 3.1 s

    async def test_long_outage_is_ridden_out_by_default(self) -> None:
        # 40 refused attempts: over 15 minutes of backoff on the injected
        # clock. The default policy never gives up, and the subscription is
        # still there afterwards.
        async def reopen() -> None:
            await self.proxy.refuse(False)
        rec = Recorder(at=40, hook=reopen)
        c = await self.client(sleep=rec, rand=lambda: 0.5)
        sub = await c.subscribe("long")
        await self.proxy.refuse(True)
        self.proxy.cut_all()
        await within(c.publish("long", b"still here"))
        self.assertEqual(len(rec.delays), 40)
        self.assertEqual(max(rec.delays), 30.0)
        self.assertGreater(sum(rec.delays), 15 * 60)
        self.assertEqual((await recv(sub)).body, b"still here")

    def test_policy_delays(self) -> None:
        p = sinew.ReconnectPolicy()
        self.assertEqual([round(p.delay(n, 0.5), 6) for n in range(10)],
                         [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0])
        self.assertEqual(p.delay(1000, 0.5), 30.0)
        self.assertAlmostEqual(p.delay(0, 0.0), 0.09)
        self.assertAlmostEqual(p.delay(20, 0.999999), 33.0, places=3)

    async def test_gives_up_after_max_attempts_and_ends_subscriptions(self) -> None:
        c = await self.client(sleep=Recorder(), reconnect=sinew.ReconnectPolicy(max_attempts=2))
        sub = await c.subscribe("gu")
        await self.proxy.refuse(True)
        self.proxy.cut_all()
        with self.assertRaises(sinew.DisconnectedError) as cm:
            await recv(sub)
        self.assertTrue(cm.exception.retryable)
        self.assertIsInstance(sub.end_reason, sinew.DisconnectedError)
        with self.assertRaises(sinew.DisconnectedError):
            await within(c.publish("gu", b"x"))  # one fresh attempt, refused
        await self.proxy.refuse(False)
        await within(c.publish("gu", b"y"))  # the next operation connects again


class Handshake(BrokerCase):
    broker_args = ("--auth-tokens", "s3cret-token-0123456789abcdef0123456789")

    async def test_fatal_handshake_error_is_not_retried(self) -> None:
        rec = Recorder()
        with self.assertRaises(sinew.BrokerError) as cm:
            await sinew.connect(self.proxy.addr, credentials="wrong", sleep=rec)
        self.assertEqual(cm.exception.name, "auth_failed")
        self.assertFalse(cm.exception.retryable)
        self.assertEqual(rec.delays, [])
        c = await self.client(credentials="s3cret-token-0123456789abcdef0123456789")
        await c.publish("auth", b"ok")


class UserLogin(unittest.IsolatedAsyncioTestCase):
    """A user created in the data dir with `sinew admin user add --data-dir`
    (the offline bootstrap) makes the loopback broker require credentials;
    the client logs in with user= and the password in credentials."""

    async def test_user_and_password(self) -> None:
        b = Broker()
        self.addAsyncCleanup(b.close)
        binary = await asyncio.to_thread(broker_binary)
        await asyncio.to_thread(lambda: subprocess.run(
            [binary, "admin", "user", "add", "alice", "--data-dir", b.data.name,
                             # manage: her publish creates the queue "auth"
                             "--publish", "*", "--consume", "*", "--manage", "auth", "--password-stdin"],
            input=b"correct horse\n", check=True, capture_output=True))
        addr = await b.start()
        logins: tuple[dict[str, Any], ...] = (
            {"user": "alice", "credentials": "wrong horse"}, {"user": "mallory", "credentials": "correct horse"}, {})
        for kw in logins:
            rec = Recorder()
            with self.assertRaises(sinew.BrokerError) as cm:
                await within(sinew.connect(addr, sleep=rec, **kw))
            self.assertEqual(cm.exception.name, "auth_failed")
            self.assertFalse(cm.exception.retryable)
            self.assertEqual(rec.delays, [])  # not retried
        c = await within(sinew.connect(addr, user="alice", credentials="correct horse"))
        try:
            await within(c.publish("auth", b"as alice"))
        finally:
            await c.close()


class TLS(unittest.IsolatedAsyncioTestCase):
    async def test_tls_listener(self) -> None:
        d = tempfile.TemporaryDirectory(prefix="sinew-pytest-tls-")
        self.addCleanup(d.cleanup)
        go = shutil.which("go") or "/usr/local/go/bin/go"
        goroot = subprocess.run([go, "env", "GOROOT"], capture_output=True, text=True, check=True).stdout.strip()
        gen = await asyncio.create_subprocess_exec(
            go, "run", os.path.join(goroot, "src/crypto/tls/generate_cert.go"), "--host", "127.0.0.1",
            cwd=d.name, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.assertEqual(await asyncio.wait_for(gen.wait(), 120), 0)
        cert, key = os.path.join(d.name, "cert.pem"), os.path.join(d.name, "key.pem")
        b = Broker("--tls-cert-file", cert, "--tls-key-file", key)
        await b.start()
        self.addAsyncCleanup(b.close)
        ctx = ssl.create_default_context(cafile=cert)
        async with await sinew.connect(b.addr, ssl=ctx) as c:
            await c.publish("tls", b"sealed")
            m = await recv(await c.subscribe("tls"))
            self.assertEqual(m.body, b"sealed")
            await m.complete()
        # A client that does not trust the certificate fails at once, not retryable.
        rec = Recorder()
        with self.assertRaises(sinew.TLSError) as cm:
            await sinew.connect(b.addr, ssl=ssl.create_default_context(), sleep=rec)
        self.assertIsInstance(cm.exception.__cause__, ssl.SSLCertVerificationError)
        self.assertFalse(sinew.is_retryable(cm.exception))
        self.assertEqual(rec.delays, [])


class MutualTLS(unittest.IsolatedAsyncioTestCase):
    """Certificates from `sinew cert generate`; a broker that requires a
    client certificate and has a user, one with TLS only, and a plaintext
    one."""

    async def asyncSetUp(self) -> None:
        d = tempfile.TemporaryDirectory(prefix="sinew-pytest-mtls-")
        self.addCleanup(d.cleanup)
        binary = await asyncio.to_thread(broker_binary)
        for sub in ("ca", "other"):
            await asyncio.to_thread(lambda: subprocess.run([binary, "cert", "generate", "--dir", os.path.join(d.name, sub)],
                                    check=True, capture_output=True))
        self.ca, self.other = os.path.join(d.name, "ca"), os.path.join(d.name, "other")
        server = ("--tls-cert-file", os.path.join(self.ca, "server.pem"),
                  "--tls-key-file", os.path.join(self.ca, "server-key.pem"))
        self.mtls = Broker(*server, "--tls-client-ca-file", os.path.join(self.ca, "ca.pem"), "--tls-client-auth", "require")
        self.addAsyncCleanup(self.mtls.close)
        await asyncio.to_thread(lambda: subprocess.run(
            [binary, "admin", "user", "add", "alice", "--data-dir", self.mtls.data.name,
                             # manage: her publish creates the queue "mtls"
                             "--publish", "*", "--consume", "*", "--manage", "mtls", "--password-stdin"],
            input=b"correct horse\n", check=True, capture_output=True))
        self.plain = Broker()
        self.addAsyncCleanup(self.plain.close)
        await self.mtls.start()
        await self.plain.start()

    def ctx(self, client_from: str | None) -> ssl.SSLContext:
        c = ssl.create_default_context(cafile=os.path.join(self.ca, "ca.pem"))
        if client_from:
            c.load_cert_chain(os.path.join(client_from, "client.pem"), os.path.join(client_from, "client-key.pem"))
        return c

    async def test_client_certificate_and_user_login(self) -> None:
        async with await within(sinew.connect(self.mtls.addr, ssl=self.ctx(self.ca), user="alice",
                                              credentials="correct horse")) as c:
            await within(c.publish("mtls", b"sealed"))
            m = await recv(await c.subscribe("mtls"))
            self.assertEqual(m.body, b"sealed")
            await m.complete()
        # The right certificate does not stand in for the password.
        wrong: tuple[dict[str, Any], ...] = ({"user": "alice", "credentials": "wrong horse"}, {})
        for kw in wrong:
            rec = Recorder()
            with self.assertRaises(sinew.BrokerError) as cm:
                await within(sinew.connect(self.mtls.addr, ssl=self.ctx(self.ca), sleep=rec, **kw))
            self.assertEqual(cm.exception.name, "auth_failed")
            self.assertEqual(rec.delays, [])

    async def test_missing_or_foreign_client_certificate(self) -> None:
        # Under TLS 1.2 the broker's verdict on the client certificate is part
        # of the handshake: a TLSError at once.
        for client_from in (None, self.other):
            ctx = self.ctx(client_from)
            ctx.maximum_version = ssl.TLSVersion.TLSv1_2
            rec = Recorder()
            with self.assertRaises(sinew.TLSError) as cm:
                await within(sinew.connect(self.mtls.addr, ssl=ctx, user="alice",
                                           credentials="correct horse", sleep=rec))
            self.assertIn("TLS handshake failed", str(cm.exception))
            self.assertIsInstance(cm.exception.__cause__, ssl.SSLError)
            self.assertEqual(rec.delays, [], "not retried")
        # Under TLS 1.3 the verdict follows the handshake, and the broker's
        # close can reset the connection before the client reads it: then the
        # attempt looks like a network failure and is retried. Either way the
        # client never gets in.
        for client_from in (None, self.other):
            with self.assertRaises((sinew.TLSError, sinew.DisconnectedError)):
                await within(sinew.connect(self.mtls.addr, ssl=self.ctx(client_from), user="alice",
                                           credentials="correct horse", sleep=Recorder()))

    async def test_tls_client_on_plaintext_port(self) -> None:
        rec = Recorder()
        with self.assertRaises(sinew.TLSError) as cm:
            await within(sinew.connect(self.plain.addr, ssl=self.ctx(None), sleep=rec))
        self.assertIn("did not speak TLS", str(cm.exception))
        self.assertEqual(rec.delays, [], "not retried until the connect timeout")

    async def test_plaintext_client_on_tls_port(self) -> None:
        rec = Recorder()
        with self.assertRaises(sinew.BrokerError) as cm:
            await within(sinew.connect(self.mtls.addr, sleep=rec))
        self.assertEqual(cm.exception.name, "bad_request")
        self.assertIn("this port requires TLS", str(cm.exception))
        self.assertEqual(rec.delays, [])


class SubscriptionEnds(BrokerCase):
    async def test_typed_subscription_ends(self) -> None:
        c = await self.client()
        a = await c.subscribe("ends-a")
        await a.unsubscribe()
        self.assertEqual([m async for m in a], [])
        self.assertIsInstance(a.end_reason, sinew.UnsubscribedError)

        await c.declare_queue("ends-b")
        b = await c.subscribe("ends-b")
        await c.delete_queue("ends-b")
        with self.assertRaises(sinew.BrokerError) as cm:
            await recv(b)
        self.assertEqual(cm.exception.name, "not_found")

        d = await c.subscribe("ends-d")
        await c.close()
        self.assertEqual([m async for m in d], [])
        self.assertIsInstance(d.end_reason, sinew.ClientClosedError)
        with self.assertRaises(sinew.ClientClosedError):
            await c.publish("ends-d", b"x")

    async def test_concurrent_closes_both_wait_for_the_end(self) -> None:
        c = await self.client()
        sub = await c.subscribe("cc")
        await within(asyncio.gather(c.close(), c.close()))
        self.assertIsInstance(sub.end_reason, sinew.ClientClosedError)
        with self.assertRaises(sinew.ClientClosedError):
            await c.publish("cc", b"x")

    async def test_close_ends_session_and_releases_leases(self) -> None:
        c1 = await self.client()
        await c1.publish("rel", b"m")
        s1 = await c1.subscribe("rel")
        m = await recv(s1)
        await c1.close()
        with self.assertRaises(sinew.ClientClosedError):
            await m.complete()
        c2 = await self.client()
        s2 = await c2.subscribe("rel")
        again = await recv(s2)  # END_SESSION released it at once, not after the grace
        self.assertEqual((again.body, again.attempt), (b"m", 2))
        await again.complete()


if __name__ == "__main__":
    unittest.main()
