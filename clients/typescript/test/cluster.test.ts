// Cluster routing against scripted nodes (a node that refuses publishes while
// it still answers cannot be made from one real broker): a client dialled
// with one address learns the cluster's nodes from METADATA, a refusal
// (unavailable, fenced, not_owner) moves it to another node where the
// publish is stored once, GOING_AWAY's redirect is followed, and a single
// broker's refusal still rejects the publish.
import { test } from "node:test";
import { strict as assert } from "node:assert";
import * as net from "node:net";
import { connect } from "../src/client.js";
import { BrokerError } from "../src/errors.js";
import { FrameSplitter, encodeFrame, decodeBody, Op, type Body } from "../src/codec.js";

const FENCED = 25;
const UNAVAILABLE = 15;

/** A scripted node: it answers HELLO, PING, METADATA and PUBLISH. */
class Node {
  private server = net.createServer((s) => this.serve(s));
  private socks = new Set<net.Socket>();
  port = 0;
  publishes: Body[] = [];
  stored: Body[] = [];
  /** The error code every publish is refused with (0: stored). */
  refuse = 0;
  owner = "";
  /** METADATA's answer; null answers unknown_op. */
  metadata: Body | null = null;

  async start(): Promise<this> {
    await new Promise<void>((r) => this.server.listen(0, "127.0.0.1", () => r()));
    this.port = (this.server.address() as net.AddressInfo).port;
    return this;
  }
  get addr(): string {
    return `127.0.0.1:${this.port}`;
  }
  async stop(): Promise<void> {
    for (const s of this.socks) s.destroy();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
  goingAway(redirect: string): void {
    for (const s of this.socks) {
      s.write(encodeFrame(Op.GOING_AWAY, 0n, { deadline_ms: BigInt(Date.now() + 60_000), grace_ms: 0, reason: "test", redirect }));
    }
  }

  private serve(s: net.Socket): void {
    this.socks.add(s);
    s.on("close", () => this.socks.delete(s));
    s.on("error", () => {});
    const split = new FrameSplitter();
    s.on("data", (chunk) => {
      for (const f of split.push(chunk)) {
        const b = decodeBody(f.op, f.body);
        const reply = (op: number, body: Body) => s.write(encodeFrame(op, f.requestId, body));
        switch (f.op) {
          case Op.HELLO:
            reply(Op.HELLO_OK, {
              protocol_version: 1, server_version: "scripted", outcome: 0, server_generation: 1n,
              resume: { client_id: `c-${this.port}`, owner_id: "o", token: new Uint8Array(1) },
              heartbeat_ms: 0, reconnect_grace_ms: 0,
              limits: { frame_bytes_max: 1 << 20, body_bytes_max: 1 << 19, prefetch_max: 100, settle_batch_max: 64, publish_inflight_max: 64, subscriptions_max: 8 },
              // A node that answers METADATA as a cluster node says it is one.
              cluster: !!(this.metadata && this.metadata.cluster),
            });
            break;
          case Op.PING:
            reply(Op.PONG, {});
            break;
          case Op.METADATA:
            if (this.metadata) reply(Op.METADATA_RESULT, this.metadata);
            else reply(Op.ERROR, { code: 4, message: "unknown op", fatal: false, owner: "" });
            break;
          case Op.PUBLISH:
            this.publishes.push(b);
            if (this.refuse) reply(Op.ERROR, { code: this.refuse, message: "refused", fatal: false, owner: this.owner });
            else {
              this.stored.push(b);
              reply(Op.PUBLISH_OK, { partition: 0, offset: BigInt(this.stored.length - 1), duplicate: false });
            }
            break;
          case Op.END_SESSION:
            reply(Op.OK, {});
            s.end();
            break;
          default:
            reply(Op.OK, {});
        }
      }
    });
  }
}

function clusterOf(...addrs: string[]): Body {
  return { cluster: true, partitions: [{ partition: 0, owner: addrs[0], epoch: 2n, replicas: addrs }] };
}

for (const [name, code] of [["fenced", FENCED], ["unavailable", UNAVAILABLE]] as const) {
  test(`a client with one address learns the cluster; ${name} sends the publish to another node`, async () => {
    const a = await new Node().start();
    const b = await new Node().start();
    a.metadata = clusterOf(a.addr, a.addr, b.addr);
    const c = await connect(a.addr);
    try {
      await c.publish("orders", "one"); // stored on a; METADATA says a is clustered
      for (let i = 0; i < 10_000 && (c as unknown as { clustered: boolean | null }).clustered !== true; i++) {
        await new Promise((r) => setTimeout(r, 1));
      }
      a.refuse = code;
      const r = await c.publish("orders", "two", { timeoutMs: 10_000 });
      assert.equal(r.duplicate, false);
      assert.equal(a.publishes.length, 2, "the refusing node got the publish once");
      assert.equal(b.stored.length, 1);
      assert.equal(b.stored[0]!.producer_seq, a.publishes[1]!.producer_seq, "sent again with the same sequence");
    } finally {
      await c.close();
      await a.stop();
      await b.stop();
    }
  });
}

test("not_owner naming the owner moves the client there", async () => {
  const a = await new Node().start();
  const b = await new Node().start();
  a.metadata = clusterOf(b.addr, a.addr, b.addr);
  const c = await connect(a.addr);
  try {
    a.refuse = 24;
    a.owner = b.addr;
    // The first publish's refusal may come before the METADATA answer: it
    // waits for it.
    await c.publish("orders", "x", { timeoutMs: 10_000 });
    assert.equal(b.stored.length, 1);
  } finally {
    await c.close();
    await a.stop();
    await b.stop();
  }
});

test("a node naming as owner a node that just refused is passed over", async () => {
  const a = await new Node().start();
  const b = await new Node().start();
  const d = await new Node().start();
  a.metadata = clusterOf(a.addr, a.addr, b.addr, d.addr);
  const c = await connect(a.addr);
  try {
    await c.publish("orders", "one");
    for (let i = 0; i < 10_000 && (c as unknown as { clustered: boolean | null }).clustered !== true; i++) {
      await new Promise((r) => setTimeout(r, 1));
    }
    a.refuse = FENCED;
    b.refuse = 24;
    b.owner = a.addr; // an older view
    await c.publish("orders", "two", { timeoutMs: 10_000 });
    assert.deepEqual([a.publishes.length, b.publishes.length, d.stored.length], [2, 1, 1]);
  } finally {
    await c.close();
    await a.stop();
    await b.stop();
    await d.stop();
  }
});

test("a single broker's refusal still rejects the publish", async () => {
  const a = await new Node().start();
  a.metadata = { cluster: false, partitions: [] };
  const c = await connect(a.addr);
  try {
    await c.publish("orders", "one");
    a.refuse = UNAVAILABLE;
    await assert.rejects(c.publish("orders", "two", { timeoutMs: 10_000 }), (e) => e instanceof BrokerError && e.code === UNAVAILABLE);
    assert.equal(a.publishes.length, 2);
  } finally {
    await c.close();
    await a.stop();
  }
});

test("GOING_AWAY's redirect sends new work to the node it names", async () => {
  const a = await new Node().start();
  const b = await new Node().start();
  const c = await connect(a.addr);
  try {
    await c.publish("orders", "before");
    a.goingAway(b.addr);
    for (let i = 0; i < 10_000 && (c as unknown as { target: string }).target !== b.addr; i++) {
      await new Promise((r) => setTimeout(r, 1));
    }
    const r = await c.publish("orders", "after", { timeoutMs: 10_000 });
    assert.equal(r.offset, 0);
    assert.equal(a.stored.length, 1);
    assert.equal(b.stored.length, 1);
  } finally {
    await c.close();
    await a.stop();
    await b.stop();
  }
});
