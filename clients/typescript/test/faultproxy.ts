// A TCP proxy for loopback fault tests: the client dials the proxy, and the
// test cuts every connection (a reset, as when a NAT drops its state) or
// refuses new ones (the port closed: ECONNREFUSED).
import * as net from "node:net";

export class FaultProxy {
  private server: net.Server | null = null;
  private links = new Set<[net.Socket, net.Socket]>();
  /** Connections accepted so far. */
  accepted = 0;
  /** Bytes passed from clients to the broker so far. */
  upBytes = 0;
  private holding = false;
  port = 0;

  constructor(readonly target: { host: string; port: number }) {}

  get addr(): string {
    return `127.0.0.1:${this.port}`;
  }

  async start(port = 0): Promise<void> {
    const server = net.createServer((client) => this.serve(client));
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, "127.0.0.1", () => resolve());
    });
    this.server = server;
    this.port = (server.address() as net.AddressInfo).port;
  }

  private serve(client: net.Socket): void {
    this.accepted++;
    const up = net.connect(this.target);
    const link: [net.Socket, net.Socket] = [client, up];
    this.links.add(link);
    const drop = () => {
      this.links.delete(link);
      client.destroy();
      up.destroy();
    };
    client.on("error", drop).on("close", drop);
    up.on("error", drop).on("close", drop);
    client.on("data", (b: Buffer) => {
      this.upBytes += b.length;
    });
    client.pipe(up);
    if (!this.holding) up.pipe(client);
  }

  /** hold(true) stops passing the broker's bytes to the clients (they wait
   * in the proxy); hold(false) passes them on again. */
  hold(on: boolean): void {
    this.holding = on;
    for (const [client, up] of this.links) {
      if (on) {
        up.unpipe(client);
        up.pause();
      } else {
        up.pipe(client);
      }
    }
  }

  /** Resets every proxied connection; returns how many. */
  cut(): number {
    const n = this.links.size;
    for (const [a, b] of this.links) {
      a.resetAndDestroy();
      b.resetAndDestroy();
    }
    this.links.clear();
    return n;
  }

  /** refuse(true) closes the listening port, so connects are refused; refuse(false) opens it again. */
  async refuse(on: boolean): Promise<void> {
    if (on && this.server) {
      // close() stops listening at once; its callback would also wait for the
      // proxied connections to end, which cut() does.
      this.server.close();
      this.server = null;
    } else if (!on && !this.server) {
      await this.start(this.port);
    }
  }

  async close(): Promise<void> {
    this.cut();
    await this.refuse(true);
  }
}
