// A real three-node cluster of `sinew serve --cluster --cluster-profile lan`
// processes on free loopback ports, built from this repository.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { freePort, sinewBin } from "./broker.js";

/** Bounds a node's start and the controller's election. */
const READY_MS = 20_000;

export class ClusterNode {
  proc: ChildProcess | null = null;
  log = "";
  readonly dataDir = mkdtempSync(path.join(os.tmpdir(), "sinew-ts-cluster-"));
  constructor(
    readonly addr: string,
    readonly admin: string,
    readonly gossip: string,
    readonly peer: string,
  ) {}

  async start(seeds: string[]): Promise<void> {
    const args = ["serve", "--listen", this.addr, "--admin-listen", this.admin, "--data-dir", this.dataDir];
    args.push("--cluster", "--cluster-profile", "lan", "--cluster-gossip-listen", this.gossip, "--cluster-peer-listen", this.peer);
    args.push("--connection-heartbeat-ms", "1000");
    if (seeds.length > 0) args.push("--cluster-seeds", seeds.join(","));
    const p = spawn(sinewBin(), args, { stdio: ["ignore", "ignore", "pipe"] });
    this.proc = p;
    await new Promise<void>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`node ${this.addr} did not start:\n${this.log}`)), READY_MS);
      p.stderr!.on("data", (b: Buffer) => {
        if (this.log.length < 1 << 20) this.log += b.toString();
        if (this.log.includes("msg=serving listen=")) {
          clearTimeout(t);
          resolve();
        }
      });
      p.once("exit", () => {
        clearTimeout(t);
        reject(new Error(`node ${this.addr} exited:\n${this.log}`));
      });
    });
  }

  /** SIGKILL, and wait for the exit. */
  async kill9(): Promise<void> {
    const p = this.proc;
    this.proc = null;
    if (!p || p.exitCode !== null || p.signalCode !== null) return;
    const exited = new Promise((r) => p.once("exit", r));
    p.kill("SIGKILL");
    await exited;
  }

  async destroy(): Promise<void> {
    await this.kill9();
    rmSync(this.dataDir, { recursive: true, force: true });
  }
}

/** GET on a node's admin API, parsed as JSON; null when it does not answer 200. */
export async function adminGet(admin: string, p: string): Promise<any> {
  try {
    const r = await fetch(`http://${admin}${p}`, { signal: AbortSignal.timeout(2_000) });
    if (r.status !== 200) return null;
    return await r.json();
  } catch {
    return null;
  }
}

export class Cluster {
  constructor(readonly nodes: ClusterNode[]) {}

  /** Three nodes; the first bootstraps the controller, the others join it.
   * Resolves once the controller has a leader and three voters. */
  static async start(): Promise<Cluster> {
    const nodes: ClusterNode[] = [];
    const c = new Cluster(nodes);
    try {
      for (let i = 0; i < 3; i++) {
        // A port picked free can be taken by another socket (an outgoing
        // connection's ephemeral port) before the node binds it: the node
        // then exits with "address already in use" and starts again on
        // newly picked ports (at most 4 times).
        for (let attempt = 0; ; attempt++) {
          const port = async () => `127.0.0.1:${await freePort()}`;
          const n = new ClusterNode(await port(), await port(), await port(), await port());
          try {
            await n.start(i === 0 ? [] : [nodes[0]!.gossip]);
            nodes.push(n);
            break;
          } catch (e) {
            await n.destroy();
            if (attempt >= 4 || !n.log.includes("address already in use")) throw e;
          }
        }
      }
      const until = Date.now() + READY_MS;
      for (;;) {
        const v = await adminGet(nodes[0]!.admin, "/api/v1/nodes");
        if (v?.controller?.leader && (v.controller.voters ?? []).length === 3) return c;
        if (Date.now() > until) throw new Error(`the controller did not reach three voters:\n${c.logs()}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    } catch (e) {
      await c.destroy();
      throw e;
    }
  }

  node(addr: string): ClusterNode {
    const n = this.nodes.find((x) => x.addr === addr);
    if (!n) throw new Error(`${addr} is no node of the cluster`);
    return n;
  }

  /** partitions[].owner of topic, from a live node's admin API ("" while none). */
  async owners(topic: string): Promise<string[] | null> {
    for (const n of this.nodes) {
      if (!n.proc) continue;
      const v = await adminGet(n.admin, `/api/v1/queues/${encodeURIComponent(topic)}`);
      if (v?.partitions) return (v.partitions as Array<{ owner?: string }>).map((p) => p.owner ?? "");
    }
    return null;
  }

  logs(): string {
    return this.nodes.map((n, i) => `--- node ${i} (${n.addr}):\n${n.log.split("\n").slice(-30).join("\n")}`).join("\n");
  }

  async destroy(): Promise<void> {
    await Promise.all(this.nodes.map((n) => n.destroy()));
  }
}
