// Unit tests without a broker: backoff, the error table against the spec, and
// the frame splitter's bounds.
import { test } from "node:test";
import { strict as assert } from "node:assert";
import { readFileSync } from "node:fs";
import { backoffDelay, RECONNECT_DEFAULTS } from "../src/backoff.js";
import { CODES, isRetryable, BrokerError, InvalidArgumentError } from "../src/errors.js";
import { FrameSplitter, encodeFrame, Op } from "../src/codec.js";

test("backoff: 100 ms doubling to 30 s, ±10 % jitter", () => {
  const mid = [0, 1, 2, 3, 8, 9, 20, 1000].map((n) => backoffDelay({}, n, 0.5));
  assert.deepEqual(mid, [100, 200, 400, 800, 25_600, 30_000, 30_000, 30_000]);
  assert.ok(Math.abs(backoffDelay({}, 0, 0) - 90) < 1e-9);
  assert.ok(Math.abs(backoffDelay({}, 0, 0.999999) - 110) < 1e-3);
  assert.equal(backoffDelay({}, 50, 0), 27_000);
  assert.equal(RECONNECT_DEFAULTS.resetAfterMs, 10_000);
  assert.equal(RECONNECT_DEFAULTS.maxAttempts, 0);
  assert.equal(backoffDelay({ baseDelayMs: 10, factor: 3, maxDelayMs: 50, jitter: 0.2 }, 2, 0.5), 50);
});

test("error codes match docs/protocol.md section 6", () => {
  const spec = readFileSync(new URL("../../../../docs/protocol.md", import.meta.url), "utf8");
  const rows = [...spec.matchAll(/^\| (\d+) \| `([a-z_]+)` \| (yes|no|–) \|/gm)].map((m) => [Number(m[1]), m[2], m[3] === "yes"]);
  assert.deepEqual(CODES.map((c) => [...c]), rows);
});

test("retryable classification", () => {
  assert.equal(isRetryable(Object.assign(new Error("x"), { code: "ECONNREFUSED" })), true);
  assert.equal(isRetryable(new BrokerError(7, "")), false);
  assert.equal(isRetryable(new BrokerError(16, "")), true);
  assert.equal(isRetryable(new Error("other")), false);
});

test("frame splitter: frames split across chunks, limit checked before buffering", () => {
  const a = encodeFrame(Op.PUBLISH_OK, 7n, { partition: 1, offset: 2n, duplicate: false });
  const b = encodeFrame(Op.PING, 8n, {});
  const all = new Uint8Array([...a, ...b]);
  const sp = new FrameSplitter();
  const got = [];
  for (let i = 0; i < all.length; i += 3) got.push(...sp.push(all.subarray(i, i + 3)));
  assert.deepEqual(got.map((f) => [f.op, f.requestId]), [[Op.PUBLISH_OK, 7n], [Op.PING, 8n]]);
  const small = new FrameSplitter(64);
  assert.throws(() => small.push(new Uint8Array([0, 0, 1, 0])), /exceeds limit/);
});

test("the encoder refuses values it cannot encode exactly, naming the field", () => {
  const bad: Array<[number, Record<string, unknown>, string]> = [
    [Op.PUBLISH, { partition: 0.5 }, "partition"],
    [Op.PUBLISH, { partition: 2 ** 31 }, "partition"],
    [Op.PUBLISH, { delay_ms: 1.5 }, "delay_ms"],
    [Op.PUBLISH, { ttl_ms: Number.MAX_SAFE_INTEGER + 2 }, "ttl_ms"],
    [Op.PUBLISH, { topic: 5 }, "topic"],
    [Op.PUBLISH, { key: "k" }, "key"],
    [Op.SUBSCRIBE, { prefetch: -1 }, "prefetch"],
    [Op.SUBSCRIBE, { ack_mode: 256 }, "ack_mode"],
    [Op.UNSUBSCRIBE, { sub_id: -1n }, "sub_id"],
    [Op.UNSUBSCRIBE, { sub_id: 1n << 64n }, "sub_id"],
    [Op.RECONCILE, { inflight_follows: 1 }, "inflight_follows"],
  ];
  for (const [op, body, field] of bad) {
    assert.throws(() => encodeFrame(op, 1n, body), (e: unknown) => e instanceof InvalidArgumentError && e.argument === field, `${field}: ${String(body[field])}`);
  }
  assert.doesNotThrow(() => encodeFrame(Op.PUBLISH, 1n, { partition: 2 ** 31 - 1, delay_ms: 0, ttl_ms: 5n }));
});
