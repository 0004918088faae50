// Leaving a `for await` loop ends the subscription: the iterator's return()
// unsubscribes, and the broker hands the messages it had prefetched to the
// next consumer at once, without using a retry.
import { test, before, after } from "node:test";
import { strict as assert } from "node:assert";
import { Broker } from "./broker.js";
import { connect, type Message } from "../src/index.js";

const T = { timeout: 20_000 };

let broker: Broker;
before(async () => {
  broker = new Broker();
  await broker.start();
});
after(async () => {
  await broker.destroy();
});

/** Takes n messages from it, or fails after ms. */
async function takeWithin(it: AsyncIterator<Message>, n: number, ms: number): Promise<Message[]> {
  const out: Message[] = [];
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`got ${out.length} of ${n} messages in ${ms} ms`)), ms);
  });
  try {
    while (out.length < n) {
      const r = await Promise.race([it.next(), late]);
      if (r.done) throw new Error(`subscription ended after ${out.length} of ${n}`);
      out.push(r.value);
    }
  } finally {
    clearTimeout(timer);
  }
  return out;
}

test("break out of for await ends the subscription and releases its prefetched messages at once", T, async () => {
  const c = await connect(broker.addr);
  const c2 = await connect(broker.addr);
  try {
    // No retries and a long lease: a message that came back by using a
    // retry would be dead-lettered, and none comes back by lease expiry here.
    await c.declareQueue("ts-loop", { partitions: 1, maxRetries: 0, leaseMs: 60_000 });
    for (let i = 0; i < 4; i++) await c.publish("ts-loop", `m${i}`);
    const sub = await c.subscribe("ts-loop", { prefetch: 16 });
    let completed: Promise<void> | null = null;
    for await (const m of sub) {
      assert.equal(m.text, "m0");
      // Wait until the other three sit in the client's buffer, prefetched.
      const until = Date.now() + 5000;
      while ((sub as unknown as { buf: Message[] }).buf.length < 3 && Date.now() < until) await new Promise((r) => setTimeout(r, 5));
      completed = m.complete(); // not awaited: it must still reach the broker before the release
      break;
    }
    await completed;

    const next = await c2.subscribe("ts-loop", { prefetch: 16 });
    const got = await takeWithin(next[Symbol.asyncIterator](), 3, 3000);
    assert.deepEqual(got.map((m) => m.text).sort(), ["m1", "m2", "m3"]);
    assert.equal(sub.ended, true);
    assert.equal(sub.endReason?.reason, "unsubscribed");
    await Promise.all(got.map((m) => m.complete()));
    assert.equal(await c.purgeQueue("ts-loop"), 0);
  } finally {
    await c.close();
    await c2.close();
  }
});

test("an exception thrown in the loop body ends the subscription too", T, async () => {
  const c = await connect(broker.addr);
  try {
    await c.declareQueue("ts-loop-throw", { partitions: 1, maxRetries: 0, leaseMs: 60_000 });
    for (let i = 0; i < 2; i++) await c.publish("ts-loop-throw", `m${i}`);
    const sub = await c.subscribe("ts-loop-throw", { prefetch: 4 });
    await assert.rejects(
      (async () => {
        for await (const m of sub) {
          await m.complete();
          throw new Error("handler failed");
        }
      })(),
      /handler failed/,
    );
    const again = await c.subscribe("ts-loop-throw", { prefetch: 4 });
    const [m] = await takeWithin(again[Symbol.asyncIterator](), 1, 3000);
    assert.equal(m!.text, "m1");
    await m!.complete();
    assert.equal(sub.endReason?.reason, "unsubscribed");
  } finally {
    await c.close();
  }
});
