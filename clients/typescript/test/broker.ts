// Starts a real `sinew serve` for the tests, built from this repository.
import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync, existsSync } from "node:fs";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../..");

let builtBin: string | null = null;

/** The sinew binary: $SINEW_BIN, or built once per test process with go build. */
export function sinewBin(): string {
  if (process.env.SINEW_BIN) return process.env.SINEW_BIN;
  if (builtBin && existsSync(builtBin)) return builtBin;
  const dir = mkdtempSync(path.join(os.tmpdir(), "sinew-ts-bin-"));
  const bin = path.join(dir, "sinew");
  execFileSync("go", ["build", "-o", bin, "./cmd/sinew"], { cwd: repoRoot, stdio: "inherit" });
  builtBin = bin;
  return bin;
}

export async function freePort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", () => r()));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

/** A broker process on a fixed port and data directory, so it can be restarted. */
export class Broker {
  proc: ChildProcess | null = null;
  port = 0;
  readonly dataDir = mkdtempSync(path.join(os.tmpdir(), "sinew-ts-data-"));
  stderr = "";

  constructor(readonly extraArgs: string[] = []) {}

  get addr(): string {
    return `127.0.0.1:${this.port}`;
  }

  async start(): Promise<void> {
    if (!this.port) this.port = await freePort();
    const args = ["serve", "--listen", this.addr, "--admin-listen", "", "--data-dir", this.dataDir, "--log-level", "warn", ...this.extraArgs];
    const p = spawn(sinewBin(), args, { stdio: ["ignore", "ignore", "pipe"] });
    p.stderr!.on("data", (b: Buffer) => {
      this.stderr += b.toString();
    });
    this.proc = p;
    // Ready when the port accepts; bounded to 15 s.
    const until = Date.now() + 15_000;
    for (;;) {
      if (p.exitCode !== null) throw new Error(`sinew serve exited: ${this.stderr}`);
      if (await canConnect(this.port)) return;
      if (Date.now() > until) throw new Error(`sinew serve not ready: ${this.stderr}`);
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  /** SIGTERM (a planned stop: GOING_AWAY and drain) and wait for the exit. */
  async stop(): Promise<number | null> {
    const p = this.proc;
    if (!p || p.exitCode !== null) return p?.exitCode ?? null;
    const exited = new Promise<number | null>((r) => p.once("exit", (code) => r(code)));
    p.kill("SIGTERM");
    this.proc = null;
    return exited;
  }

  async destroy(): Promise<void> {
    const p = this.proc;
    if (p && p.exitCode === null) {
      const exited = new Promise((r) => p.once("exit", r));
      p.kill("SIGKILL");
      await exited;
    }
    this.proc = null;
    rmSync(this.dataDir, { recursive: true, force: true });
  }
}

function canConnect(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect({ host: "127.0.0.1", port });
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
  });
}
