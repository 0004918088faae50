// Spanning subscriptions against a real three-node cluster: a consumer
// connected to one node receives every partition of a queue whose owners are
// spread over the nodes, keeps receiving a partition whose owner is killed
// with SIGKILL (through the new owner, without redelivering what it
// completed), and a settle whose node died is applied at the new owner by
// lease reference.
import { test } from "node:test";
import { strict as assert } from "node:assert";
import { connect, type Client, type Message, type Subscription } from "../src/client.js";
import { Cluster } from "./cluster3.js";

const T = { timeout: 60_000 };

/** Waits (bounded) until every partition of topic has an owner and the
 * owners are not all one node. */
async function spreadOwners(cl: Cluster, topic: string, n: number): Promise<string[]> {
  const until = Date.now() + 20_000;
  for (;;) {
    const o = await cl.owners(topic);
    if (o && o.length === n && o.every((a) => a !== "") && new Set(o).size >= 2) return o;
    if (Date.now() > until) throw new Error(`owners of ${topic}: ${JSON.stringify(o)}\n${cl.logs()}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Waits (bounded) until no partition of topic is owned by gone (nor by nobody). */
async function newOwners(cl: Cluster, topic: string, gone: string): Promise<boolean> {
  const end = Date.now() + 20_000;
  for (;;) {
    const o = await cl.owners(topic);
    if (o && o.every((a) => a !== "" && a !== gone)) return true;
    if (Date.now() > end) return false;
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Waits (bounded by ms) until cond holds; false if it never did. */
async function until(cond: () => boolean, ms: number): Promise<boolean> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) return false;
    await new Promise((r) => setTimeout(r, 20));
  }
  return true;
}

/** Reads sub in the background, calling on for each message. */
function reader(sub: Subscription, on: (m: Message) => void): Promise<unknown> {
  return (async () => {
    for await (const m of sub) on(m);
  })().catch((e) => e);
}

async function publishAll(c: Client, topic: string, bodies: string[], partition?: number): Promise<Map<string, number>> {
  const at = new Map<string, number>();
  await Promise.all(
    bodies.map(async (b) => {
      const r = await c.publish(topic, b, { timeoutMs: 30_000, ...(partition === undefined ? {} : { partition }) });
      at.set(b, r.partition);
    }),
  );
  return at;
}

test("a consumer connected to one node receives every partition of a queue owned by three nodes, once", T, async () => {
  const cl = await Cluster.start();
  const clients: Client[] = [];
  try {
    const pub = await connect(cl.nodes[0]!.addr, { connectTimeoutMs: 20_000 });
    clients.push(pub);
    await pub.declareQueue("spread", { partitions: 6 });
    const owners = await spreadOwners(cl, "spread", 6);
    const home = owners[0]!;
    const c = await connect(home, { connectTimeoutMs: 20_000 });
    clients.push(c);
    const sub = await c.subscribe("spread");
    const bodies = Array.from({ length: 60 }, (_, i) => `m-${i}`);
    const at = await publishAll(pub, "spread", bodies);
    const elsewhere = bodies.filter((b) => owners[at.get(b)!] !== home).length;
    assert.ok(elsewhere > 0, `every message went to partitions ${home} owns: ${JSON.stringify(owners)}`);
    const seen = new Map<string, number>();
    const done = reader(sub, (m) => {
      seen.set(m.text, (seen.get(m.text) ?? 0) + 1);
      void m.complete();
    });
    const all = await until(() => seen.size === bodies.length, 20_000);
    await new Promise((r) => setTimeout(r, 1_000)); // a redelivery would come now
    const missing = bodies.filter((b) => !seen.has(b));
    const twice = [...seen].filter(([, n]) => n > 1);
    console.log(`spread: published ${bodies.length} (${elsewhere} on partitions of other nodes), received ${seen.size}, missing ${missing.length}, twice ${twice.length}`);
    assert.ok(all, `missing ${missing.length} of ${bodies.length}: ${missing.slice(0, 10)}; owners ${JSON.stringify(owners)}, consumer on ${home}`);
    assert.deepEqual(twice, []);
    await sub.unsubscribe();
    await done;
    // No part outlives the subscription: a part left on a node would take
    // these, and another consumer would get them only after the lease.
    const later = Array.from({ length: 12 }, (_, i) => `later-${i}`);
    await publishAll(pub, "spread", later);
    const other = await connect(cl.nodes.find((n) => n.addr !== home)!.addr, { connectTimeoutMs: 20_000 });
    clients.push(other);
    const sub2 = await other.subscribe("spread");
    const got2 = new Set<string>();
    const done2 = reader(sub2, (m) => {
      got2.add(m.text);
      void m.complete();
    });
    assert.ok(await until(() => got2.size === later.length, 10_000), `the second consumer got ${got2.size} of ${later.length}`);
    await sub2.unsubscribe();
    await done2;
    // Closing the client closes the connections it opened to the other nodes.
    const nodes = (c as unknown as { nodeClients: Map<string, { dead(): boolean }> }).nodeClients;
    const opened = [...nodes.values()];
    assert.ok(opened.length >= 2, `connections to ${opened.length} nodes`);
    await c.close();
    assert.ok(opened.every((n) => n.dead()), "a node's connection is still open after close()");
  } finally {
    await Promise.all(clients.map((c) => c.close().catch(() => {})));
    await cl.destroy();
  }
});

test("the owner of a partition killed with SIGKILL while consuming: its messages come through the new owner, completes are not redelivered", T, async () => {
  const cl = await Cluster.start();
  const clients: Client[] = [];
  try {
    const leaseMs = 4_000;
    const admin = await connect(cl.nodes[0]!.addr, { connectTimeoutMs: 20_000 });
    clients.push(admin);
    await admin.declareQueue("failover", { partitions: 6, leaseMs });
    const owners = await spreadOwners(cl, "failover", 6);
    const home = owners[0]!;
    const victim = owners.find((o) => o !== home)!;
    const victimParts = owners.flatMap((o, i) => (o === victim ? [i] : []));
    const survivor = cl.nodes.find((n) => n.addr !== victim)!.addr;
    const pub = await connect(survivor, { connectTimeoutMs: 20_000 });
    clients.push(pub);
    const c = await connect(home, { connectTimeoutMs: 20_000 });
    clients.push(c);
    const sub = await c.subscribe("failover", { prefetch: 2 });
    const before = Array.from({ length: 60 }, (_, i) => `b-${i}`);
    await publishAll(pub, "failover", before);

    const seen = new Map<string, number>();
    const completed = new Set<string>();
    let completeFailed = 0;
    let killedAt = 0;
    let victimAfterKill = 0;
    let killing: Promise<void> | null = null;
    const done = reader(sub, (m) => {
      const first = !seen.has(m.text);
      seen.set(m.text, (seen.get(m.text) ?? 0) + 1);
      if (killedAt && first && victimParts.includes(m.partition)) victimAfterKill++;
      if (!killing && seen.size >= 15) {
        killedAt = Date.now();
        killing = cl.node(victim).kill9();
      }
      m.complete({ confirmed: true, timeoutMs: 30_000 }).then(
        () => completed.add(m.text),
        () => completeFailed++,
      );
    });
    assert.ok(await until(() => killedAt > 0, 20_000), "fewer than 15 messages arrived before the kill");
    await killing;
    // Published once every partition has an owner again.
    assert.ok((await newOwners(cl, "failover", victim)), `no new owners:\n${cl.logs()}`);
    const after = Array.from({ length: 30 }, (_, i) => `a-${i}`);
    // A fresh publisher: this test is about the consumer (a publisher that
    // followed not_owner to the killed node dials that node again).
    const pub2 = await connect(survivor, { connectTimeoutMs: 20_000 });
    clients.push(pub2);
    await publishAll(pub2, "failover", after);
    const all = [...before, ...after];
    const got = await until(() => all.every((b) => seen.has(b)), 30_000);
    await new Promise((r) => setTimeout(r, leaseMs + 1_000)); // a redelivery would come now
    const lost = all.filter((b) => !seen.has(b));
    const redelivered = [...seen].filter(([b, n]) => n > 1 && completed.has(b)).length;
    const again = [...seen].filter(([, n]) => n > 1).length;
    console.log(
      `failover: published ${all.length} (${after.length} after the kill), received ${seen.size}, lost ${lost.length}, ` +
        `completed ${completed.size}, complete failed ${completeFailed}, received twice ${again} (of them completed before: ${redelivered}), ` +
        `victim ${victim} partitions ${JSON.stringify(victimParts)}, first seen after the kill on them ${victimAfterKill}`,
    );
    assert.ok(got, `lost ${lost.length}: ${lost.slice(0, 10)}`);
    assert.ok(victimAfterKill > 0, "no message of the killed owner's partitions arrived after the kill");
    assert.equal(redelivered, 0, "completed messages were delivered again");
    assert.equal(completeFailed, 0, "completes failed");
    await sub.unsubscribe();
    await done;
  } finally {
    await Promise.all(clients.map((c) => c.close().catch(() => {})));
    await cl.destroy();
  }
});

test("a settle whose node died is applied at the new owner by lease reference", T, async () => {
  const cl = await Cluster.start();
  const clients: Client[] = [];
  try {
    const leaseMs = 10_000;
    const admin = await connect(cl.nodes[0]!.addr, { connectTimeoutMs: 20_000 });
    clients.push(admin);
    await admin.declareQueue("resettle", { partitions: 6, leaseMs });
    const owners = await spreadOwners(cl, "resettle", 6);
    const home = owners[0]!;
    const p = owners.findIndex((o) => o !== home);
    const victim = owners[p]!;
    const c = await connect(home, { connectTimeoutMs: 20_000 });
    clients.push(c);
    const sub = await c.subscribe("resettle");
    const bodies = Array.from({ length: 12 }, (_, i) => `r-${i}`);
    await publishAll(admin, "resettle", bodies, p);
    const held: Message[] = [];
    const seen = new Map<string, number>();
    const done = reader(sub, (m) => {
      seen.set(m.text, (seen.get(m.text) ?? 0) + 1);
      held.push(m);
    });
    assert.ok(await until(() => held.length === bodies.length, 20_000), `received ${held.length} of ${bodies.length}`);
    assert.ok(held.every((m) => m.partition === p));
    await cl.node(victim).kill9();
    const t0 = Date.now();
    const outcomes = await Promise.allSettled(held.map((m) => m.complete({ confirmed: true, timeoutMs: 30_000 })));
    const failed = outcomes.filter((o) => o.status === "rejected");
    const took = Date.now() - t0;
    const owner = (await cl.owners("resettle"))?.[p];
    // Unsettled leases would expire and be delivered again by now.
    await new Promise((r) => setTimeout(r, leaseMs - (Date.now() - t0) + 2_000));
    const again = [...seen].filter(([, n]) => n > 1).length;
    console.log(`resettle: ${held.length} completes after ${victim} was killed, ${failed.length} failed, all answered in ${took} ms; new owner ${owner}; delivered again ${again}`);
    assert.deepEqual(failed.map((f) => String((f as PromiseRejectedResult).reason)), []);
    assert.notEqual(owner, victim);
    assert.equal(again, 0, "a completed message was delivered again");
    await sub.unsubscribe();
    await done;
  } finally {
    await Promise.all(clients.map((c) => c.close().catch(() => {})));
    await cl.destroy();
  }
});

test("an extend whose node died is applied at the new owner by lease reference", T, async () => {
  const cl = await Cluster.start();
  const clients: Client[] = [];
  try {
    const leaseMs = 3_000;
    const admin = await connect(cl.nodes[0]!.addr, { connectTimeoutMs: 20_000 });
    clients.push(admin);
    await admin.declareQueue("reextend", { partitions: 6, leaseMs });
    const owners = await spreadOwners(cl, "reextend", 6);
    const home = owners[0]!;
    const p = owners.findIndex((o) => o !== home);
    const victim = owners[p]!;
    const c = await connect(home, { connectTimeoutMs: 20_000 });
    clients.push(c);
    const sub = await c.subscribe("reextend");
    await publishAll(admin, "reextend", ["x-0"], p);
    const held: Message[] = [];
    const done = reader(sub, (m) => {
      held.push(m);
    });
    assert.ok(await until(() => held.length === 1, 20_000), `received ${held.length} of 1`);
    await cl.node(victim).kill9();
    // Extended after its node died, well past the 3 s lease: by lease
    // reference at the new owner.
    await held[0]!.extend(20_000, { timeoutMs: 30_000 });
    // Past the lease it had, it has not come back: the extension holds it.
    await new Promise((r) => setTimeout(r, leaseMs + 2_000));
    assert.equal(held.length, 1, `delivered again while extended: ${held.map((m) => `${m.text} attempt ${m.attempt}`).join(", ")}`);
    await held[0]!.complete({ confirmed: true, timeoutMs: 30_000 });
    await sub.unsubscribe();
    await done;
  } finally {
    await Promise.all(clients.map((c) => c.close().catch(() => {})));
    await cl.destroy();
  }
});

test("a publisher whose node was killed moves to another node it knows", T, async () => {
  const cl = await Cluster.start();
  const clients: Client[] = [];
  try {
    const admin = await connect(cl.nodes[0]!.addr, { connectTimeoutMs: 20_000 });
    clients.push(admin);
    await admin.declareQueue("hop", { partitions: 1 });
    // Connected to the partition's owner, which is then killed.
    let home = "";
    for (const end = Date.now() + 20_000; !home && Date.now() < end; await new Promise((r) => setTimeout(r, 50))) {
      home = (await cl.owners("hop"))?.[0] ?? "";
    }
    assert.ok(home, `no owner of hop\n${cl.logs()}`);
    const pub = await connect(home, { connectTimeoutMs: 20_000 });
    clients.push(pub);
    // The first publishes let it learn the cluster's nodes (METADATA).
    await pub.publish("hop", "before-1");
    await new Promise((r) => setTimeout(r, 500));
    await pub.publish("hop", "before-2");
    await cl.node(home).kill9();
    const t0 = Date.now();
    await pub.publish("hop", "after", { timeoutMs: 20_000 });
    console.log(`hop: a publish after ${home} was killed confirmed in ${Date.now() - t0} ms`);
  } finally {
    await Promise.all(clients.map((c) => c.close().catch(() => {})));
    await cl.destroy();
  }
});

test("a cohort subscription in a cluster gets every partition assigned and delivered, from each owner", T, async () => {
  const cl = await Cluster.start();
  const clients: Client[] = [];
  try {
    const pub = await connect(cl.nodes[0]!.addr, { connectTimeoutMs: 20_000 });
    clients.push(pub);
    await pub.declareQueue("cohorts", { partitions: 6 });
    const owners = await spreadOwners(cl, "cohorts", 6);
    const c = await connect(owners[0]!, { connectTimeoutMs: 20_000 });
    clients.push(c);
    const sub = await c.subscribe("cohorts", { cohort: "workers" });
    const assigned = new Map<number, number>();
    void (async () => {
      for await (const ev of sub.assignments()) if (ev.state === "assigned") assigned.set(ev.partition, (assigned.get(ev.partition) ?? 0) + 1);
    })();
    const bodies = Array.from({ length: 60 }, (_, i) => `c-${i}`);
    await publishAll(pub, "cohorts", bodies);
    const seen = new Map<string, number>();
    const done = reader(sub, (m) => {
      seen.set(m.text, (seen.get(m.text) ?? 0) + 1);
      void m.complete();
    });
    const all = await until(() => seen.size === bodies.length && assigned.size === 6, 20_000);
    console.log(`cohorts: received ${seen.size} of ${bodies.length}; partitions assigned ${JSON.stringify([...assigned].sort((a, b) => a[0] - b[0]))}`);
    assert.ok(all, `received ${seen.size} of ${bodies.length}, assigned ${[...assigned.keys()]}`);
    assert.deepEqual([...seen].filter(([, n]) => n > 1), []);
    await sub.unsubscribe();
    await done;
  } finally {
    await Promise.all(clients.map((c) => c.close().catch(() => {})));
    await cl.destroy();
  }
});
