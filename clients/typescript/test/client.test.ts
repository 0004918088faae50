// The client against a real `sinew serve`, through a fault proxy: the same
// scenarios as the Go SDK's fault tests.
import { test, before, after } from "node:test";
import { strict as assert } from "node:assert";
import { Broker, sinewBin } from "./broker.js";
import { execFileSync } from "node:child_process";
import { FaultProxy } from "./faultproxy.js";
import {
  connect,
  BrokerError,
  DisconnectedError,
  StaleDeliveryError,
  SubscriptionEndedError,
  type Client,
  type Message,
} from "../src/index.js";

// Every scenario is bounded; none waits on a real clock for a condition.
const T = { timeout: 20_000 };

let broker: Broker;

before(async () => {
  broker = new Broker();
  await broker.start();
});
after(async () => {
  await broker.destroy();
});

/** Records events and lets a test wait for one without sleeping. */
function events() {
  const seen: Array<[string, Record<string, unknown>]> = [];
  const waiters: Array<[string, () => void]> = [];
  return {
    seen,
    log: (e: string, d: Record<string, unknown>) => {
      seen.push([e, d]);
      for (const [name, wake] of waiters.splice(0)) {
        if (name === e) wake();
        else waiters.push([name, wake]);
      }
    },
    next: (e: string) => new Promise<void>((r) => waiters.push([e, r])),
    count: (e: string) => seen.filter(([n]) => n === e).length,
  };
}

/** Takes n messages from an iterator. */
async function take(it: AsyncIterator<Message>, n: number): Promise<Message[]> {
  const out: Message[] = [];
  while (out.length < n) {
    const r = await it.next();
    if (r.done) throw new Error(`subscription ended after ${out.length} of ${n}`);
    out.push(r.value);
  }
  return out;
}

test("publish resolves on confirm; consume and complete", T, async () => {
  const c = await connect(broker.addr);
  try {
    const r = await c.publish("ts-basic", "hello", { key: "k", headers: { a: "b" }, contentType: "text/plain" });
    assert.equal(typeof r.offset, "number");
    assert.equal(r.duplicate, false);
    const sub = await c.subscribe("ts-basic", { prefetch: 8 });
    const [m] = await take(sub[Symbol.asyncIterator](), 1);
    assert.equal(m!.text, "hello");
    assert.equal(m!.header("a"), "b");
    assert.equal(m!.contentType, "text/plain");
    assert.equal(m!.offset, r.offset);
    assert.equal(m!.attempt, 1);
    await m!.complete();
    await assert.rejects(m!.complete(), { name: "AlreadySettledError" });
    assert.equal(await c.purgeQueue("ts-basic"), 0);
  } finally {
    await c.close();
  }
});

test("a prefetch above the broker's maximum is clamped", T, async () => {
  const c = await connect(broker.addr);
  try {
    const sub = await c.subscribe("ts-clamp", { prefetch: 1_000_000 });
    assert.equal(sub.prefetch, 10_000);
  } finally {
    await c.close();
  }
});

test("a cut socket inside the grace: no error reaches the application, no redelivery", T, async () => {
  const proxy = new FaultProxy({ host: "127.0.0.1", port: broker.port });
  await proxy.start();
  const ev = events();
  const c = await connect(proxy.addr, { log: ev.log, reconnect: { baseDelayMs: 20 } });
  try {
    const sub = await c.subscribe("ts-cut", { prefetch: 16 });
    const it = sub[Symbol.asyncIterator]();
    const first = await Promise.all(Array.from({ length: 20 }, (_, i) => c.publish("ts-cut", `m${i}`)));
    const got = await take(it, 10);
    const resumed = ev.next("session_resumed");
    assert.ok(proxy.cut() >= 1);
    // Settles, publishes and receives made while the socket is down wait for the resumed session.
    const settles = got.map((m) => m.complete());
    const more = Array.from({ length: 20 }, (_, i) => c.publish("ts-cut", `n${i}`));
    await resumed;
    await Promise.all(settles);
    const second = await Promise.all(more);
    // Settle as they come: prefetch (16) bounds what the broker sends ahead.
    const rest: Message[] = [];
    const restSettles: Promise<void>[] = [];
    while (rest.length < 30) {
      const [m] = await take(it, 1);
      rest.push(m!);
      restSettles.push(m!.complete());
    }
    await Promise.all(restSettles);
    const all = [...got, ...rest];
    const offsets = new Set(all.map((m) => `${m.partition}/${m.offset}`));
    assert.equal(offsets.size, 40, "every message exactly once");
    assert.deepEqual([...new Set(all.map((m) => m.attempt))], [1], "no redelivery");
    assert.equal(first.length + second.length, 40);
    assert.ok(second.every((r) => !r.duplicate));
    assert.equal(ev.count("session_resumed"), 1);
    assert.equal(ev.count("session_not_resumed"), 0);
    assert.equal(await c.purgeQueue("ts-cut"), 0, "nothing went back to the queue");
  } finally {
    await c.close();
    await proxy.close();
  }
});

test("a restart with drain: publishes and settles across it succeed", T, async () => {
  const b = new Broker();
  await b.start();
  const ev = events();
  const c = await connect(b.addr, { log: ev.log, reconnect: { baseDelayMs: 20 } });
  try {
    const sub = await c.subscribe("ts-restart", { prefetch: 8 });
    const it = sub[Symbol.asyncIterator]();
    await c.publish("ts-restart", "before");
    const [held] = await take(it, 1);
    const away = ev.next("going_away");
    const stopped = b.stop();
    await away;
    // The application still holds a delivery; settling it during the drain works.
    await held!.complete();
    await stopped;
    const during = c.publish("ts-restart", "during"); // waits for the broker to come back
    await b.start();
    const r = await during;
    assert.equal(typeof r.offset, "number");
    const [m] = await take(it, 1);
    assert.equal(m!.text, "during");
    await m!.complete();
    assert.ok(ev.count("reconnected") >= 1);
    assert.equal(ev.count("fatal"), 0);
  } finally {
    await c.close();
    await b.destroy();
  }
});

test("a refused connection is retried with backoff, without real sleeps", T, async () => {
  const proxy = new FaultProxy({ host: "127.0.0.1", port: broker.port });
  await proxy.start();
  await proxy.refuse(true);
  try {
    const slept: number[] = [];
    await assert.rejects(
      connect(proxy.addr, {
        random: () => 0.5,
        sleep: async (ms) => {
          slept.push(ms);
        },
        reconnect: { maxAttempts: 4 },
      }),
      (e: unknown) => e instanceof DisconnectedError && e.retryable,
    );
    assert.deepEqual(slept, [100, 200, 400]);

    const slept2: number[] = [];
    const c = await connect(proxy.addr, {
      random: () => 0,
      sleep: async (ms) => {
        slept2.push(ms);
        if (slept2.length === 3) await proxy.refuse(false);
      },
    });
    assert.deepEqual(slept2, [90, 180, 360]);
    await c.close();
  } finally {
    await proxy.close();
  }
});

test("a fatal handshake error fails at once, without retrying", T, async () => {
  const b = new Broker(["--auth-tokens", "secret-token-0123456789abcdef0123456789"]);
  await b.start();
  try {
    const slept: number[] = [];
    await assert.rejects(
      connect(b.addr, { credentials: "wrong", sleep: async (ms) => void slept.push(ms) }),
      (e: unknown) => e instanceof BrokerError && e.codeName === "auth_failed" && !e.retryable,
    );
    assert.deepEqual(slept, []);
    const ok = await connect(b.addr, { credentials: "secret-token-0123456789abcdef0123456789" });
    await ok.close();
  } finally {
    await b.destroy();
  }
});

test("a user created offline logs in with user and password", T, async () => {
  const b = new Broker();
  // The offline bootstrap: a user in the data dir makes the loopback
  // broker require credentials. Manage on "auth": her publish creates it.
  execFileSync(sinewBin(), ["admin", "user", "add", "alice", "--data-dir", b.dataDir, "--publish", "*", "--manage", "auth", "--password-stdin"], {
    input: "correct horse\n",
    stdio: ["pipe", "ignore", "pipe"],
  });
  await b.start();
  try {
    for (const o of [{ user: "alice", credentials: "wrong horse" }, { user: "mallory", credentials: "correct horse" }, {}]) {
      const slept: number[] = [];
      await assert.rejects(
        connect(b.addr, { ...o, sleep: async (ms) => void slept.push(ms) }),
        (e: unknown) => e instanceof BrokerError && e.codeName === "auth_failed" && !e.retryable,
      );
      assert.deepEqual(slept, []);
    }
    const c = await connect(b.addr, { user: "alice", credentials: "correct horse" });
    await c.publish("auth", "as alice");
    await c.close();
  } finally {
    await b.destroy();
  }
});

test("subscriptions end with a typed reason", T, async () => {
  const c: Client = await connect(broker.addr);
  try {
    // Unsubscribe: the loop ends normally.
    const a = await c.subscribe("ts-end-a");
    const loopA = (async () => {
      for await (const m of a) void m;
    })();
    await a.unsubscribe();
    await loopA;
    assert.equal(a.endReason?.reason, "unsubscribed");

    // The queue is deleted: the loop throws the reason.
    await c.declareQueue("ts-end-b");
    const b = await c.subscribe("ts-end-b");
    const loopB = (async () => {
      for await (const m of b) void m;
    })().then(
      () => null,
      (e: unknown) => e,
    );
    await c.deleteQueue("ts-end-b");
    const endB = await loopB;
    assert.ok(endB instanceof SubscriptionEndedError && endB.reason === "queue_deleted", String(endB));
    assert.ok(endB.cause instanceof BrokerError && endB.cause.codeName === "not_found");

    // Closing the client: the loop ends normally, the reason says so.
    const d = await c.subscribe("ts-end-d");
    const loopD = (async () => {
      for await (const m of d) void m;
    })();
    await c.close();
    await loopD;
    assert.equal(d.endReason?.reason, "client_closed");
    await assert.rejects(c.publish("ts-end-d", "x"), { name: "ClientClosedError" });
  } finally {
    await c.close();
  }
});

test("retry, retryAfter and fail; dead letters carry the reason", T, async () => {
  const c = await connect(broker.addr);
  try {
    await c.declareQueue("ts-dlq-src", { deadLetter: "queue", deadLetterTarget: "ts-dlq", maxRetries: 5 });
    await c.publish("ts-dlq-src", "job");
    const sub = await c.subscribe("ts-dlq-src");
    const it = sub[Symbol.asyncIterator]();
    const [m1] = await take(it, 1);
    await m1!.retry();
    const [m2] = await take(it, 1);
    assert.equal(m2!.attempt, 2);
    await m2!.retryAfter(10);
    const [m3] = await take(it, 1);
    assert.equal(m3!.attempt, 3);
    await m3!.fail();
    await assert.rejects(m3!.complete(), { name: "AlreadySettledError" });
    const dead = await c.subscribe("ts-dlq");
    const [d] = await take(dead[Symbol.asyncIterator](), 1);
    assert.equal(d!.text, "job");
    assert.equal(d!.header("sinew.reason"), "failed");
    await d!.complete();
  } finally {
    await c.close();
  }
});

test("a session the broker lost: held settles fail as stale, the subscription comes back", T, async () => {
  const b = new Broker(["--runtime-seed-connection-reconnect-grace-ms", "0"]);
  await b.start();
  const proxy = new FaultProxy({ host: "127.0.0.1", port: b.port });
  await proxy.start();
  const ev = events();
  const c = await connect(proxy.addr, { log: ev.log, reconnect: { baseDelayMs: 20 } });
  try {
    const sub = await c.subscribe("ts-lost", { prefetch: 4 });
    const it = sub[Symbol.asyncIterator]();
    await c.publish("ts-lost", "x");
    const [m] = await take(it, 1);
    const fresh = ev.next("session_not_resumed");
    proxy.cut();
    await fresh;
    await assert.rejects(m!.complete(), (e: unknown) => e instanceof StaleDeliveryError);
    const [again] = await take(it, 1);
    assert.equal(again!.text, "x");
    assert.equal(again!.attempt, 2);
    await again!.complete();
  } finally {
    await c.close();
    await proxy.close();
    await b.destroy();
  }
});

test("backoff grows across short-lived connections and resets after 10 s healthy", T, async () => {
  const proxy = new FaultProxy({ host: "127.0.0.1", port: broker.port });
  await proxy.start();
  const ev = events();
  let now = 0;
  let slept: number[] = [];
  let reopenAfter = 0;
  const c = await connect(proxy.addr, {
    log: ev.log,
    now: () => now,
    random: () => 0.5,
    sleep: async (ms) => {
      slept.push(ms);
      if (slept.length === reopenAfter) await proxy.refuse(false);
    },
  });
  const breakFor = async (sleeps: number) => {
    slept = [];
    reopenAfter = sleeps;
    const back = ev.next("reconnected");
    await proxy.refuse(true);
    proxy.cut();
    await back;
    return slept;
  };
  try {
    now = 1_000;
    assert.deepEqual(await breakFor(3), [100, 200, 400]);
    // Two attempts failed. The new connection lived 1 s: the count goes on from 2.
    now = 2_000;
    assert.deepEqual(await breakFor(1), [400]);
    now = 12_000; // 10 s healthy: the count starts again
    assert.deepEqual(await breakFor(1), [100]);
    await c.publish("ts-backoff", "still works");
  } finally {
    await c.close();
    await proxy.close();
  }
});

test("connect's AbortSignal stops the first connect", T, async () => {
  const proxy = new FaultProxy({ host: "127.0.0.1", port: broker.port });
  await proxy.start();
  await proxy.refuse(true);
  try {
    const ac = new AbortController();
    const reason = new Error("caller gave up");
    let attempts = 0;
    await assert.rejects(
      connect(proxy.addr, {
        signal: ac.signal,
        sleep: async () => {
          if (++attempts === 2) ac.abort(reason);
        },
      }),
      (e: unknown) => e === reason,
    );
    assert.equal(attempts, 2);
  } finally {
    await proxy.close();
  }
});
