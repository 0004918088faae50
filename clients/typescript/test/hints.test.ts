// Partition hints (docs/protocol.md 5.6): keyless publishes go to the
// partition the broker hinted in its answer to the one before, against a
// real `sinew serve`; the hint map's bound, without a broker.
import { test, before, after } from "node:test";
import { strict as assert } from "node:assert";
import { Broker } from "./broker.js";
import { FaultProxy } from "./faultproxy.js";
import * as net from "node:net";
import { connect, BrokerError } from "../src/index.js";
import { Code } from "../src/errors.js";
import { FrameSplitter, Op, decodeBody, encodeFrame, type Body } from "../src/codec.js";
import { PartitionHints, HINTS_MAX, queueKey } from "../src/hints.js";

const T = { timeout: 30_000 };

let broker: Broker;
before(async () => {
  broker = new Broker();
  await broker.start();
});
after(async () => {
  await broker.destroy();
});

/** Waits until cond holds, polling, for at most ms. */
async function until(cond: () => boolean, ms: number, what: string): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

test("keyless publishes lean away from a backlogged partition", T, async (t) => {
  const c = await connect(broker.addr);
  try {
    await c.declareQueue("ts-leaning", { partitions: 4 });
    await Promise.all(Array.from({ length: 200 }, () => c.publish("ts-leaning", "waiting", { partition: 1 })));
    const got = [0, 0, 0, 0];
    for (let i = 0; i < 120; i++) {
      const r = await c.publish("ts-leaning", "keyless");
      // The first is placed by its hash, unless the explicit ones left a hint.
      if (i > 0) got[r.partition]!++;
    }
    t.diagnostic(`keyless publishes after the first, per partition: ${got}`);
    assert.equal(got[1], 0, `keyless publishes per partition ${got}: partition 1 holds 200 waiting`);
    for (const p of [0, 2, 3]) assert.ok(got[p]! > 0, `keyless publishes per partition ${got}: partition ${p} got none`);
  } finally {
    await c.close();
  }
});

test("a hinted partition that is gone: the publish is sent again without it", T, async () => {
  // A window of one: a slot the resend leaked would stop the next publish.
  const c = await connect(broker.addr, { publishWindow: 1 });
  try {
    await c.declareQueue("ts-shrinks", { partitions: 4 });
    for (let i = 0; ; i++) {
      await c.publish("ts-shrinks", "before");
      if ((c.partitionHint("ts-shrinks") ?? -1) >= 2) break;
      assert.ok(i < 100, "no hint of partition 2 or 3 in 100 publishes to 4 partitions");
    }
    await c.deleteQueue("ts-shrinks");
    await c.declareQueue("ts-shrinks", { partitions: 2 });
    const r = await c.publish("ts-shrinks", "after");
    assert.ok(r.partition <= 1, `stored in partition ${r.partition} of 2`);
    assert.equal(await c.purgeQueue("ts-shrinks"), 1, "the queue holds the one message");
    // The resend's window slot was freed: publishes still go.
    const more = await Promise.all(Array.from({ length: 4 }, () => c.publish("ts-shrinks", "more", { timeoutMs: 5_000 })));
    assert.ok(more.every((x) => x.partition <= 1));
    assert.equal(await c.purgeQueue("ts-shrinks"), 4);
  } finally {
    await c.close();
  }
});

test("publishes with a key or a partition are not hinted", T, async () => {
  const c = await connect(broker.addr);
  try {
    await c.declareQueue("ts-placed", { partitions: 4 });
    await Promise.all(Array.from({ length: 200 }, () => c.publish("ts-placed", "waiting", { partition: 3 })));
    for (let i = 0; i < 20; i++) {
      assert.notEqual(c.partitionHint("ts-placed"), undefined, "a keyless answer leaves a hint");
      assert.equal((await c.publish("ts-placed", "explicit", { partition: 3 })).partition, 3);
    }
    const keyed = new Set<number>();
    for (let i = 0; i < 20; i++) keyed.add((await c.publish("ts-placed", "keyed", { key: "k" })).partition);
    assert.equal(keyed.size, 1, `one key in partitions ${[...keyed]}`);
  } finally {
    await c.close();
  }
});

test("a hinted publish cut off by a broken connection is sent again to the same partition", T, async () => {
  const proxy = new FaultProxy({ host: "127.0.0.1", port: broker.port });
  await proxy.start();
  const c = await connect(proxy.addr, { reconnect: { baseDelayMs: 20 } });
  try {
    await c.declareQueue("ts-resent", { partitions: 4 });
    let stored = 0;
    for (let i = 0; ; i++) {
      await c.publish("ts-resent", "before");
      stored++;
      if (c.partitionHint("ts-resent") !== undefined) break;
      assert.ok(i < 100, "no hint in 100 publishes");
    }
    // Eight rounds: a resend placed by its hash would land in the hinted
    // partition by chance in about one round of four.
    for (let round = 0; round < 8; round++) {
      const hint = c.partitionHint("ts-resent");
      assert.notEqual(hint, undefined, "a keyless answer leaves a hint");
      proxy.hold(true); // the answer waits in the proxy
      const sentBefore = proxy.upBytes;
      const p = c.publish("ts-resent", `cut off ${round}`);
      await until(() => proxy.upBytes > sentBefore, 5000, "the publish to reach the broker");
      assert.ok(proxy.cut() >= 1);
      proxy.hold(false);
      const r = await p;
      stored++;
      assert.equal(r.partition, hint, `round ${round}: the resend keeps the hinted partition`);
    }
    assert.equal(await c.purgeQueue("ts-resent"), stored, "stored once");
  } finally {
    await c.close();
    await proxy.close();
  }
});

test("the hint map is bounded: full, a new queue starts it over", () => {
  const h = new PartitionHints();
  for (let i = 0; i < HINTS_MAX; i++) h.note(queueKey(`q${i}`, ""), 1 + (i % 4));
  assert.equal(h.size, HINTS_MAX);
  assert.equal(h.take(queueKey("q7", "")), 3);
  h.note(queueKey("q7", ""), 1); // a known queue: kept in place
  assert.equal(h.size, HINTS_MAX);
  assert.equal(h.take(queueKey("q7", "")), 0);
  h.note(queueKey("new", ""), 2);
  assert.equal(h.size, 1);
  assert.equal(h.take(queueKey("new", "")), 1);
  assert.equal(h.take(queueKey("q7", "")), undefined);
  h.note(queueKey("new", ""), 0); // no hint: dropped
  assert.equal(h.take(queueKey("new", "")), undefined);
  h.note(queueKey("big", ""), 2 ** 31); // out of range: dropped
  assert.equal(h.take(queueKey("big", "")), undefined);
  // Topic and group do not run together.
  h.note(queueKey("ab", "c"), 1);
  assert.equal(h.take(queueKey("a", "bc")), undefined);
});

test("a not_found after a send that was cut off is the publish's outcome", T, async () => {
  // The first send to the hinted partition is cut off before its answer:
  // it may have been stored (by a node whose catalogue is newer), so the
  // resend's not_found fails the publish instead of a second send elsewhere.
  const seen: number[] = [];
  let cut = true;
  const socks: net.Socket[] = [];
  const server = net.createServer((s) => {
    socks.push(s);
    const split = new FrameSplitter();
    s.on("error", () => {});
    s.on("data", (chunk: Buffer) => {
      for (const f of split.push(new Uint8Array(chunk))) {
        const body = decodeBody(f.op, f.body);
        const reply = (op: number, b: Body) => s.write(encodeFrame(op, f.requestId, b));
        if (f.op === Op.HELLO) {
          reply(Op.HELLO_OK, {
            protocol_version: 1, server_version: "scripted",
            resume: { client_id: "c-1", owner_id: "o-1", token: new Uint8Array([1]) },
            outcome: 0, server_generation: 1n, heartbeat_ms: 0, reconnect_grace_ms: 30_000,
            limits: { frame_bytes_max: 1 << 20, body_bytes_max: 1 << 20, prefetch_max: 1000, settle_batch_max: 256, publish_inflight_max: 64, subscriptions_max: 64 },
          });
        } else if (f.op === Op.PUBLISH) {
          const part = body.partition as number;
          seen.push(part);
          if (part === 3 && cut) {
            cut = false;
            s.destroy();
            return;
          }
          if (part === 3) reply(Op.ERROR, { code: Code.NOT_FOUND, message: "partition 3 does not exist", fatal: false, owner: "" });
          else reply(Op.PUBLISH_OK, { partition: 0, offset: BigInt(seen.length), duplicate: false, next: 4 });
        } else if (f.op === Op.END_SESSION) {
          reply(Op.OK, {});
        }
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", () => r()));
  const c = await connect(`127.0.0.1:${(server.address() as net.AddressInfo).port}`, { sleep: () => Promise.resolve(), handshakeTimeoutMs: 5_000, drainTimeoutMs: 100 });
  try {
    await c.publish("t", "a");
    await assert.rejects(c.publish("t", "b"), (e: unknown) => e instanceof BrokerError && e.code === Code.NOT_FOUND);
    assert.deepEqual(seen, [-1, 3, 3]);
  } finally {
    await c.close();
    for (const s of socks) s.destroy();
    await new Promise<void>((r) => server.close(() => r()));
  }
});
