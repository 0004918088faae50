// Cohort subscriptions against a scripted broker on loopback: what the client
// sends (SUBSCRIBE's cohort and member, RECONCILE's cohorts) and what it does
// with ASSIGNMENT pushes and DELIVER's assignment field.
import { test } from "node:test";
import { strict as assert } from "node:assert";
import * as net from "node:net";
import { FrameSplitter, Op, decodeBody, encodeFrame, type Body } from "../src/codec.js";
import { connect, InvalidArgumentError, type AssignmentEvent, type Client } from "../src/index.js";

const T = { timeout: 20_000 };

interface Received {
  conn: number;
  op: number;
  rid: bigint;
  body: Body;
}

/** A scripted broker: answers HELLO (outcome `outcome(conn)`), SUBSCRIBE
 * (sub ids from 100), RECONCILE (`reconcileEntries`), INFLIGHT and
 * END_SESSION, and records every frame it gets. */
class FakeBroker {
  readonly got: Received[] = [];
  readonly socks: net.Socket[] = [];
  private server = net.createServer((s) => this.accept(s));
  private waiters: Array<{ pred: (r: Received) => boolean; wake: (r: Received) => void }> = [];
  private nextSub = 100n;
  outcome: (conn: number) => number = () => 0;
  reconcileEntries: (body: Body) => Body[] = () => [];
  port = 0;

  async start(): Promise<string> {
    await new Promise<void>((r) => this.server.listen(0, "127.0.0.1", () => r()));
    this.port = (this.server.address() as net.AddressInfo).port;
    return `127.0.0.1:${this.port}`;
  }

  async stop(): Promise<void> {
    for (const s of this.socks) s.destroy();
    await new Promise<void>((r) => this.server.close(() => r()));
  }

  /** The first frame received (now or later) that pred accepts; bounded. */
  waitFor(pred: (r: Received) => boolean, what: string): Promise<Received> {
    const r = this.got.find(pred);
    if (r) return Promise.resolve(r);
    return new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`fake broker: no ${what} within 10 s`)), 10_000);
      this.waiters.push({
        pred,
        wake: (x) => {
          clearTimeout(t);
          resolve(x);
        },
      });
    });
  }

  /** Writes a push frame (request id 0) to the latest connection. */
  push(op: number, body: Body): void {
    this.socks.at(-1)!.write(encodeFrame(op, 0n, body));
  }

  private accept(s: net.Socket): void {
    const conn = this.socks.length;
    this.socks.push(s);
    const split = new FrameSplitter();
    s.on("error", () => {});
    s.on("data", (chunk: Buffer) => {
      for (const f of split.push(new Uint8Array(chunk))) {
        const body = decodeBody(f.op, f.body);
        const r = { conn, op: f.op, rid: f.requestId, body };
        this.got.push(r);
        this.answer(s, conn, r);
        for (const w of this.waiters.filter((w) => w.pred(r))) {
          this.waiters.splice(this.waiters.indexOf(w), 1);
          w.wake(r);
        }
      }
    });
  }

  private answer(s: net.Socket, conn: number, r: Received): void {
    const reply = (op: number, body: Body) => s.write(encodeFrame(op, r.rid, body));
    switch (r.op) {
      case Op.HELLO:
        reply(Op.HELLO_OK, {
          protocol_version: 1,
          server_version: "fake",
          resume: { client_id: "c-1", owner_id: "o-1", token: new Uint8Array([1]) },
          outcome: this.outcome(conn),
          server_generation: 1n,
          heartbeat_ms: 0,
          reconnect_grace_ms: 30_000,
          limits: { frame_bytes_max: 1 << 20, body_bytes_max: 1 << 20, prefetch_max: 1000, settle_batch_max: 256, publish_inflight_max: 64, subscriptions_max: 64 },
        });
        return;
      case Op.SUBSCRIBE:
        reply(Op.SUBSCRIBE_OK, { sub_id: this.nextSub++, partitions: [0, 1], prefetch: 10 });
        return;
      case Op.RECONCILE:
        reply(Op.RECONCILE_RESULT, { entries: this.reconcileEntries(r.body) });
        return;
      case Op.INFLIGHT:
        reply(Op.INFLIGHT_RESULT, { stale: [], resent: 0n, kept: 0n });
        return;
      case Op.END_SESSION:
      case Op.UNSUBSCRIBE:
        reply(Op.OK, {});
        return;
    }
  }
}

async function setup(opts: { memberId?: string } = {}): Promise<{ fb: FakeBroker; c: Client; done: () => Promise<void> }> {
  const fb = new FakeBroker();
  const addr = await fb.start();
  const c = await connect(addr, { sleep: () => Promise.resolve(), handshakeTimeoutMs: 5_000, drainTimeoutMs: 100, ...opts });
  return {
    fb,
    c,
    done: async () => {
      await c.close();
      await fb.stop();
    },
  };
}

test("subscribe sends the cohort and member: the client's default id, the connect option, or the one given", T, async () => {
  const { fb, c, done } = await setup();
  const c2 = await connect(`127.0.0.1:${fb.port}`, { memberId: "worker-7", drainTimeoutMs: 100 });
  const c3 = await connect(`127.0.0.1:${fb.port}`, { drainTimeoutMs: 100 });
  try {
    assert.match(c.memberId, /^[A-Za-z0-9._:-]{1,128}$/);
    assert.notEqual(c.memberId, c3.memberId);
    assert.equal(c2.memberId, "worker-7");
    const plain = await c.subscribe("orders");
    const a = await c.subscribe("orders", { cohort: "billing" });
    const b = await c.subscribe("orders", { cohort: "audit" });
    const d = await c2.subscribe("orders", { cohort: "billing" });
    const e = await c3.subscribe("orders", { cohort: "billing", memberId: "w-3" });
    const subs = fb.got.filter((r) => r.op === Op.SUBSCRIBE).map((r) => r.body);
    assert.deepEqual(
      subs.map((x) => [x.cohort, x.member]),
      [
        ["", ""],
        ["billing", c.memberId],
        ["audit", c.memberId],
        ["billing", "worker-7"],
        ["billing", "w-3"],
      ],
    );
    assert.deepEqual([plain.cohort, plain.memberId], ["", ""]);
    assert.deepEqual([a.cohort, a.memberId], ["billing", c.memberId]);
    assert.deepEqual([b.cohort, b.memberId], ["audit", c.memberId]);
    assert.deepEqual([d.cohort, d.memberId], ["billing", "worker-7"]);
    assert.deepEqual([e.cohort, e.memberId], ["billing", "w-3"]);
    // A session uses one member id: a second one is refused at the call.
    await assert.rejects(() => c3.subscribe("jobs", { cohort: "billing" }), InvalidArgumentError);
    await assert.rejects(() => c.subscribe("jobs", { cohort: "billing", memberId: "w-4" }), InvalidArgumentError);
    assert.equal(fb.got.filter((r) => r.op === Op.SUBSCRIBE).length, 5);
    await assert.rejects(() => connect(`127.0.0.1:${fb.port}`, { memberId: "bad id" }), InvalidArgumentError);
  } finally {
    await c2.close();
    await c3.close();
    await done();
  }
});

test("bad cohort names and member ids throw InvalidArgumentError at the call and send nothing", T, async () => {
  const { fb, c, done } = await setup();
  try {
    const bad: Array<[Record<string, unknown>, string]> = [
      [{ cohort: "" }, "opts.cohort"],
      [{ cohort: "bill ing" }, "opts.cohort"],
      [{ cohort: "x".repeat(129) }, "opts.cohort"],
      [{ cohort: "grüße" }, "opts.cohort"],
      [{ cohort: "a/b" }, "opts.cohort"],
      [{ cohort: 7 }, "opts.cohort"],
      [{ cohort: "billing", memberId: "" }, "opts.memberId"],
      [{ cohort: "billing", memberId: "w\n1" }, "opts.memberId"],
      [{ cohort: "billing", memberId: "y".repeat(129) }, "opts.memberId"],
      [{ memberId: "worker-1" }, "opts.memberId"],
    ];
    for (const [opts, field] of bad) {
      await assert.rejects(
        () => c.subscribe("orders", opts as never),
        (e: unknown) => e instanceof InvalidArgumentError && e.message.includes(field),
        JSON.stringify(opts),
      );
    }
    // The longest valid names pass.
    await c.subscribe("orders", { cohort: "A-z_0.9:" + "c".repeat(120), memberId: "m".repeat(128) });
    assert.equal(fb.got.filter((r) => r.op === Op.SUBSCRIBE).length, 1, "a refused subscribe sent SUBSCRIBE");
  } finally {
    await done();
  }
});

test("ASSIGNMENT pushes reach the subscription they name, in order; unknown ids are ignored", T, async () => {
  const { fb, c, done } = await setup();
  try {
    const a = await c.subscribe("orders", { cohort: "billing" }); // sub id 100
    const b = await c.subscribe("orders", { cohort: "billing" }); // sub id 101
    // Before anyone reads: the events are kept for the first reader.
    fb.push(Op.ASSIGNMENT, { sub_id: 101n, partition: 3, epoch: 7n, state: 1 });
    fb.push(Op.ASSIGNMENT, { sub_id: 999n, partition: 5, epoch: 1n, state: 1 }); // nobody's
    fb.push(Op.ASSIGNMENT, { sub_id: 100n, partition: 1, epoch: 2n, state: 1 });
    fb.push(Op.ASSIGNMENT, { sub_id: 101n, partition: 3, epoch: 8n, state: 2 });
    fb.push(Op.DELIVER, { sub_id: 100n, tag: 1n, partition: 1, offset: 0n, attempt: 1, topic: "orders", lease_id: 5n, epoch: 0n, lease_ms: 0, assignment: 2n });
    const it = b.assignments();
    const first = await it.next();
    const second = await it.next();
    assert.deepEqual([first.value, second.value], [
      { partition: 3, epoch: 7, state: "assigned" },
      { partition: 3, epoch: 8, state: "revoked" },
    ]);
    const ia = a.assignments()[Symbol.asyncIterator]();
    assert.deepEqual((await ia.next()).value, { partition: 1, epoch: 2, state: "assigned" });
    const m = (await a[Symbol.asyncIterator]().next()).value!;
    assert.equal(m.assignment, 2);
    assert.throws(() => ((m as unknown as { assignment: number }).assignment = 3), TypeError, "assignment is read-only");
    // The iterator ends with the subscription.
    const pending = ia.next();
    await a.unsubscribe();
    assert.deepEqual(await pending, { value: undefined, done: true });
    assert.equal(a.assignmentsDropped + b.assignmentsDropped, 0);
  } finally {
    await done();
  }
});

test("assignment events are bounded: the oldest are dropped and counted", T, async () => {
  const { fb, c, done } = await setup();
  try {
    const a = await c.subscribe("orders", { cohort: "billing" });
    for (let i = 0; i < 300; i++) fb.push(Op.ASSIGNMENT, { sub_id: 100n, partition: i, epoch: BigInt(i + 1), state: 1 });
    fb.push(Op.DELIVER, { sub_id: 100n, tag: 1n, partition: 0, offset: 0n, attempt: 1, topic: "orders", lease_id: 5n, assignment: 1n });
    await a[Symbol.asyncIterator]().next(); // the pushes before it were read
    assert.equal(a.assignmentsDropped, 44);
    const got: AssignmentEvent[] = [];
    for await (const ev of a.assignments()) {
      got.push(ev);
      if (got.length === 256) break;
    }
    assert.deepEqual(got[0], { partition: 44, epoch: 45, state: "assigned", dropped: 44 });
    assert.equal(got[255]!.partition, 299);
    assert.equal(got[1]!.dropped, undefined);
  } finally {
    await done();
  }
});

test("a resumed session's RECONCILE lists the cohort of each cohort subscription; one recreated subscribes with its cohort", T, async () => {
  const { fb, c, done } = await setup({ memberId: "w-2" });
  try {
    fb.outcome = (conn) => (conn === 0 ? 0 : 1);
    // The broker lost sub 101 and asks the client to subscribe it again.
    fb.reconcileEntries = (body) =>
      (body.subs as Body[]).map((v) =>
        v.sub_id === 101n
          ? { action: 4, client_sub_id: v.sub_id, server_sub_id: 0n, client: v, server: {}, reason: "missing" }
          : { action: 1, client_sub_id: v.sub_id, server_sub_id: v.sub_id, client: v, server: v, reason: "matched" },
      );
    await c.subscribe("plain");
    await c.subscribe("orders", { cohort: "billing" });
    await c.subscribe("orders", { cohort: "audit", memberId: "w-2" });
    assert.equal(c.memberId, "w-2");
    fb.socks[0]!.destroy();
    const rec = await fb.waitFor((r) => r.op === Op.RECONCILE, "RECONCILE");
    assert.equal(rec.conn, 1);
    assert.deepEqual(
      (rec.body.subs as Body[]).map((v) => v.sub_id),
      [100n, 101n, 102n],
    );
    assert.deepEqual(rec.body.cohorts, [
      { sub_id: 101n, cohort: "billing", member: "w-2" },
      { sub_id: 102n, cohort: "audit", member: "w-2" },
    ]);
    const again = await fb.waitFor((r) => r.op === Op.SUBSCRIBE && r.conn === 1, "SUBSCRIBE on the new connection");
    assert.deepEqual([again.body.topic, again.body.cohort, again.body.member], ["orders", "billing", "w-2"]);
  } finally {
    await done();
  }
});

test("a fresh session subscribes every cohort subscription again with its cohort and member", T, async () => {
  const { fb, c, done } = await setup();
  try {
    await c.subscribe("orders", { cohort: "billing" });
    await c.subscribe("jobs", { cohort: "audit" });
    fb.socks[0]!.destroy(); // outcome stays 0: the session is not resumed
    await fb.waitFor((r) => r.op === Op.SUBSCRIBE && r.conn === 1 && r.body.topic === "jobs", "SUBSCRIBE of jobs");
    await fb.waitFor((r) => r.op === Op.SUBSCRIBE && r.conn === 1 && r.body.topic === "orders", "SUBSCRIBE of orders");
    const again = fb.got.filter((r) => r.op === Op.SUBSCRIBE && r.conn === 1).map((r) => [r.body.topic, r.body.cohort, r.body.member]);
    assert.deepEqual(again.sort(), [
      ["jobs", "audit", c.memberId],
      ["orders", "billing", c.memberId],
    ]);
    assert.equal(fb.got.filter((r) => r.op === Op.RECONCILE).length, 0);
  } finally {
    await done();
  }
});

/** Reads assignment events until `done` says the picture is complete; bounded. */
async function readAssignments(it: AsyncIterator<AssignmentEvent>, owned: Map<number, number>, done: () => boolean): Promise<void> {
  const until = Date.now() + 15_000;
  while (!done()) {
    const left = until - Date.now();
    if (left <= 0) throw new Error(`assignments incomplete: ${JSON.stringify([...owned])}`);
    let t: NodeJS.Timeout | undefined;
    const r = await Promise.race([
      it.next(),
      new Promise<never>((_, reject) => {
        t = setTimeout(() => reject(new Error(`no assignment event; owned ${JSON.stringify([...owned])}`)), left);
      }),
    ]).finally(() => clearTimeout(t));
    if (r.done) throw new Error("assignments ended");
    if (r.value.state === "assigned") owned.set(r.value.partition, r.value.epoch);
    else owned.delete(r.value.partition);
  }
}

test("real broker: two cohort subscriptions of one client each get their queue's partitions; a second member takes half", T, async () => {
  const { Broker } = await import("./broker.js");
  const broker = new Broker();
  await broker.start();
  const a = await connect(broker.addr, { memberId: "worker-a", drainTimeoutMs: 1_000 });
  const b = await connect(broker.addr, { memberId: "worker-b", drainTimeoutMs: 1_000 });
  try {
    await a.declareQueue("ts-cohort-1", { partitions: 2 });
    await a.declareQueue("ts-cohort-2", { partitions: 2 });
    const s1 = await a.subscribe("ts-cohort-1", { cohort: "billing", prefetch: 16 });
    const s2 = await a.subscribe("ts-cohort-2", { cohort: "audit", prefetch: 16 });
    const owned1 = new Map<number, number>();
    const owned2 = new Map<number, number>();
    const it1 = s1.assignments()[Symbol.asyncIterator]();
    await readAssignments(it1, owned1, () => owned1.size === 2);
    await readAssignments(s2.assignments()[Symbol.asyncIterator](), owned2, () => owned2.size === 2);
    // Each subscription gets its own queue's messages, under the epoch it was told.
    for (const [q, k] of [
      ["ts-cohort-1", "x"],
      ["ts-cohort-1", "y"],
      ["ts-cohort-2", "z"],
    ] as const) {
      await a.publish(q, `${q}/${k}`, { key: k, partition: k === "y" ? 1 : 0 });
    }
    const got1 = [];
    const it = s1[Symbol.asyncIterator]();
    for (let i = 0; i < 2; i++) got1.push((await it.next()).value!);
    const m2 = (await s2[Symbol.asyncIterator]().next()).value!;
    assert.deepEqual(got1.map((m) => m.text).sort(), ["ts-cohort-1/x", "ts-cohort-1/y"]);
    assert.equal(m2.text, "ts-cohort-2/z");
    for (const m of got1) assert.equal(m.assignment, owned1.get(m.partition), `partition ${m.partition}`);
    assert.equal(m2.assignment, owned2.get(m2.partition));
    for (const m of [...got1, m2]) await m.complete({ confirmed: true });
    // A second member of "billing": one partition moves to it, and worker-a hears the revoke.
    const sb = await b.subscribe("ts-cohort-1", { cohort: "billing", prefetch: 16 });
    const ownedB = new Map<number, number>();
    await readAssignments(sb.assignments()[Symbol.asyncIterator](), ownedB, () => ownedB.size === 1);
    await readAssignments(it1, owned1, () => owned1.size === 1);
    const [pb] = [...ownedB.keys()];
    assert.ok(!owned1.has(pb!), `partition ${pb} held by both members`);
    assert.ok(ownedB.get(pb!)! > 0);
    assert.equal(s1.assignmentsDropped + s2.assignmentsDropped + sb.assignmentsDropped, 0);
  } finally {
    await a.close();
    await b.close();
    await broker.destroy();
  }
});
