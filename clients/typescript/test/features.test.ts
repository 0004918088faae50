// Fast and confirmed settles, per-operation abort and timeout, connection
// status events and the shared vocabulary (text, header pairs, number
// offsets, Go-named errors), against a real `sinew serve`. A fault proxy
// holds the broker's replies where a test needs a request to stay in flight.
import { test, before, after } from "node:test";
import { strict as assert } from "node:assert";
import { Broker } from "./broker.js";
import { FaultProxy } from "./faultproxy.js";
import {
  connect,
  AbortError,
  TimeoutError,
  QueueDeletedError,
  UnsubscribedError,
  SubscriptionEndedError,
  StaleDeliveryError,
  type Message,
  type StatusEvent,
} from "../src/index.js";

const T = { timeout: 20_000 };

let broker: Broker;
before(async () => {
  broker = new Broker();
  await broker.start();
});
after(async () => {
  await broker.destroy();
});

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

/** p's outcome, or "pending" if it has not settled within ms (a bound on
 * a failure, not a measured duration). */
async function within<T>(p: Promise<T>, ms: number): Promise<T | "pending"> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<"pending">((r) => {
    timer = setTimeout(() => r("pending"), ms);
  });
  try {
    return await Promise.race([p, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** Waits until cond holds, polling, for at most ms. */
async function until(cond: () => boolean, ms: number, what: string): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

test("settles return once queued; confirmed ones wait for the broker's answer", T, async () => {
  const proxy = new FaultProxy({ host: "127.0.0.1", port: broker.port });
  await proxy.start();
  const c = await connect(proxy.addr);
  try {
    await c.declareQueue("ts-fast", { partitions: 1 });
    for (let i = 0; i < 3; i++) await c.publish("ts-fast", `m${i}`);
    const sub = await c.subscribe("ts-fast", { prefetch: 8 });
    const [a, b, d] = await take(sub[Symbol.asyncIterator](), 3);
    proxy.hold(true); // the broker's SETTLE_RESULTs wait in the proxy
    // Fast: resolves with no answer from the broker.
    assert.equal(await within(a!.complete(), 5000), undefined);
    assert.equal(await within(b!.retryAfter(60_000), 5000), undefined);
    // Confirmed: still waiting once its ACK went up.
    const before = proxy.upBytes;
    const confirmed = d!.complete({ confirmed: true });
    let done = false;
    void confirmed.then(() => (done = true));
    await until(() => proxy.upBytes > before, 5000, "the ACK to reach the proxy");
    assert.equal(await within(confirmed, 200), "pending");
    assert.equal(done, false);
    proxy.hold(false);
    await confirmed;
    // Every settle reached the broker: only the delayed retry waits in the queue.
    assert.equal(await c.purgeQueue("ts-fast"), 1);
  } finally {
    await c.close();
    await proxy.close();
  }
});

test("close() sends the settles still queued before it ends the session", T, async () => {
  const c = await connect(broker.addr);
  await c.declareQueue("ts-close-flush", { partitions: 1, maxRetries: 5 });
  await c.publish("ts-close-flush", "job");
  const sub = await c.subscribe("ts-close-flush", { prefetch: 4 });
  const [m] = await take(sub[Symbol.asyncIterator](), 1);
  void m!.complete(); // queued, not yet written
  await c.close();
  const c2 = await connect(broker.addr);
  try {
    await c2.publish("ts-close-flush", "marker");
    const sub2 = await c2.subscribe("ts-close-flush", { prefetch: 4 });
    const [first] = await take(sub2[Symbol.asyncIterator](), 1);
    assert.equal(first!.text, "marker", "the completed job came back: its ACK went out after END_SESSION");
    await first!.complete({ confirmed: true });
  } finally {
    await c2.close();
  }
});

test("a confirmed settle of a lost lease rejects with the typed error", T, async () => {
  const c = await connect(broker.addr);
  try {
    await c.declareQueue("ts-confirmed-stale", { partitions: 1, leaseMs: 200, maxRetries: 5 });
    await c.publish("ts-confirmed-stale", "x");
    const sub = await c.subscribe("ts-confirmed-stale", { prefetch: 1 });
    const it = sub[Symbol.asyncIterator]();
    const [m] = await take(it, 1);
    const [again] = await take(it, 1); // the lease ran out and the message came back
    assert.equal(again!.attempt, 2);
    await assert.rejects(m!.complete({ confirmed: true }), (e: unknown) => e instanceof StaleDeliveryError);
    await again!.complete({ confirmed: true });
  } finally {
    await c.close();
  }
});

test("publish: an abort while waiting for the window takes no slot", T, async () => {
  const proxy = new FaultProxy({ host: "127.0.0.1", port: broker.port });
  await proxy.start();
  const c = await connect(proxy.addr, { publishWindow: 1 });
  try {
    await c.publish("ts-abort", "warm");
    proxy.hold(true);
    const first = c.publish("ts-abort", "first"); // takes the only slot, waits for its confirm
    const ac = new AbortController();
    const second = c.publish("ts-abort", "second", { signal: ac.signal });
    ac.abort(new Error("caller gave up"));
    await assert.rejects(second, (e: unknown) => e instanceof AbortError && !(e instanceof TimeoutError) && e.sent === false);
    await assert.rejects(c.publish("ts-abort", "third", { timeoutMs: 50 }), (e: unknown) => e instanceof TimeoutError && e.sent === false);
    await assert.rejects(c.declareQueue("ts-abort-q", { timeoutMs: 50 }), (e: unknown) => e instanceof TimeoutError && e.sent === true);
    proxy.hold(false);
    await first;
    // The window has its slot back: a publish goes through.
    const r = await c.publish("ts-abort", "fourth", { timeoutMs: 5000 });
    assert.equal(typeof r.offset, "number");
    // Aborted before the call: nothing happens.
    await assert.rejects(c.publish("ts-abort", "x", { signal: AbortSignal.abort() }), (e: unknown) => e instanceof AbortError && e.sent === false);
  } finally {
    await c.close();
    await proxy.close();
  }
});

test("subscribe, confirmed settles and extend take a signal and a timeout", T, async () => {
  const proxy = new FaultProxy({ host: "127.0.0.1", port: broker.port });
  await proxy.start();
  const c = await connect(proxy.addr);
  try {
    await c.publish("ts-abort-sub", "x");
    const sub = await c.subscribe("ts-abort-sub", { prefetch: 4 });
    const [m] = await take(sub[Symbol.asyncIterator](), 1);
    proxy.hold(true);
    await assert.rejects(c.subscribe("ts-abort-sub2", { timeoutMs: 50 }), (e: unknown) => e instanceof TimeoutError);
    const ac = new AbortController();
    const ext = m!.extend(30_000, { signal: ac.signal });
    ac.abort();
    await assert.rejects(ext, (e: unknown) => e instanceof AbortError);
    await assert.rejects(m!.complete({ confirmed: true, timeoutMs: 50 }), (e: unknown) => e instanceof TimeoutError);
    // The settle itself goes on: a second one is refused.
    await assert.rejects(m!.complete(), { name: "AlreadySettledError" });
    proxy.hold(false);
    assert.equal(await c.purgeQueue("ts-abort-sub"), 0);
  } finally {
    await c.close();
    await proxy.close();
  }
});

test("status(): disconnected, reconnecting, reconnected, closed; bounded; leaving unregisters", T, async () => {
  const proxy = new FaultProxy({ host: "127.0.0.1", port: broker.port });
  await proxy.start();
  const seen: StatusEvent[] = [];
  const c = await connect(proxy.addr, { reconnect: { baseDelayMs: 20 }, onStatus: (e) => seen.push(e) });
  const sinks = () => (c as unknown as { statusSinks: Set<unknown> }).statusSinks.size;
  const all = c.status();
  const small = c.status({ bufferSize: 2 });
  try {
    proxy.cut();
    const got: StatusEvent[] = [];
    for await (const e of all) {
      got.push(e);
      if (e.type === "reconnected") break;
    }
    assert.deepEqual(
      got.map((e) => e.type),
      ["disconnected", "reconnecting", "reconnected"],
    );
    assert.equal((got[2] as { resumed: boolean }).resumed, true);
    assert.equal(sinks(), 1, "leaving the loop unregistered the first iterator");
    // The small one kept the last two of three and says it missed one.
    const first = await small.next();
    assert.equal(first.value?.type, "reconnecting");
    assert.equal(first.value?.dropped, 1);
    assert.equal((await small.next()).value?.type, "reconnected");
    await c.close();
    const last = await small.next();
    assert.equal(last.value?.type, "closed");
    assert.equal((await small.next()).done, true, "the iterator ends after closed");
    assert.deepEqual(
      seen.map((e) => e.type),
      ["disconnected", "reconnecting", "reconnected", "closed"],
    );
  } finally {
    await c.close();
    await proxy.close();
  }
});

test("vocabulary: text, header pairs with repeats, number offsets, JSON-safe results", T, async () => {
  const c = await connect(broker.addr);
  try {
    const r = await c.publish("ts-vocab", "héllo", {
      headers: [
        ["trace", "a"],
        ["trace", "b"],
        ["x", "1"],
      ],
    });
    assert.equal(typeof r.offset, "number");
    assert.deepEqual(JSON.parse(JSON.stringify(r)), { partition: r.partition, offset: r.offset, duplicate: false });
    await c.publish("ts-vocab", "obj", { headers: { k: "v" } });
    const sub = await c.subscribe("ts-vocab");
    const [m, n] = await take(sub[Symbol.asyncIterator](), 2);
    assert.equal(m!.text, "héllo");
    assert.equal(m!.offset, r.offset);
    assert.deepEqual(
      m!.headers.filter(([k]) => !k.startsWith("sinew.")),
      [
        ["trace", "a"],
        ["trace", "b"],
        ["x", "1"],
      ],
    );
    assert.equal(m!.header("trace"), "a");
    assert.equal(m!.header("nope"), undefined);
    assert.equal(n!.header("k"), "v");
    await m!.complete();
    await n!.complete();
  } finally {
    await c.close();
  }
});

test("subscription ends carry Go-named error classes", T, async () => {
  const c = await connect(broker.addr);
  try {
    await c.declareQueue("ts-del", { partitions: 1 });
    const sub = await c.subscribe("ts-del");
    const it = sub[Symbol.asyncIterator]();
    const ended = it.next().then(
      () => null,
      (e: unknown) => e,
    );
    await c.deleteQueue("ts-del");
    const e = await ended;
    assert.ok( e instanceof QueueDeletedError && e instanceof SubscriptionEndedError && e.reason === "queue_deleted", String(e));
    const sub2 = await c.subscribe("ts-other");
    await sub2.unsubscribe();
    assert.ok(sub2.endReason instanceof UnsubscribedError);
  } finally {
    await c.close();
  }
});

test("extend: a handler that takes 3x the lease, extending as it goes, is never redelivered", { timeout: 30_000 }, async () => {
  const leaseMs = 1000;
  const c = await connect(broker.addr);
  try {
    await c.declareQueue("ts-extend", { partitions: 1, leaseMs, maxRetries: 5 });
    // Room for a second delivery: a message whose lease runs out comes back here.
    const sub = await c.subscribe("ts-extend", { prefetch: 2 });
    const it = sub[Symbol.asyncIterator]();
    const buffered = () => (sub as unknown as { buf: Message[] }).buf;
    await c.publish("ts-extend", "slow job");
    const [m] = await take(it, 1);
    // The handler works 3 leases long and extends by two leases every third of one.
    const end = Date.now() + 3 * leaseMs;
    while (Date.now() < end) {
      await m!.extend(2 * leaseMs, { timeoutMs: 5000 });
      await new Promise((r) => setTimeout(r, leaseMs / 3));
    }
    assert.equal(buffered().length, 0, "the message came back: its lease ran out");
    // Still this consumer's lease: a confirmed ACK is ok, not stale_lease.
    await m!.complete({ confirmed: true });

    // The control: a message not extended does come back, and its extend is stale.
    await c.publish("ts-extend", "forgotten job");
    const [f] = await take(it, 1);
    const [back] = await take(it, 1);
    assert.equal(back!.text, "forgotten job");
    assert.equal(back!.attempt, 2);
    await assert.rejects(f!.extend(leaseMs), (e: unknown) => e instanceof StaleDeliveryError);
    await back!.complete({ confirmed: true });
  } finally {
    await c.close();
  }
});

test("extend refuses a zero, a settled message and an auto-ack one", T, async () => {
  const c = await connect(broker.addr);
  try {
    await c.publish("ts-extend-args", "x");
    const sub = await c.subscribe("ts-extend-args");
    const [m] = await take(sub[Symbol.asyncIterator](), 1);
    await assert.rejects(m!.extend(0), { name: "InvalidArgumentError" });
    await assert.rejects(m!.extend(Number.NaN), { name: "InvalidArgumentError" });
    await m!.complete();
    await assert.rejects(m!.extend(1000), { name: "AlreadySettledError" });
  } finally {
    await c.close();
  }
});
