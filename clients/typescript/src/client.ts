// The client: one logical connection (a broker session) to one broker address.
//
// Node runs this on one thread, so there are no locks: every state change
// happens in one callback. A Conn is one socket; the Client outlives sockets.
// When a socket breaks the Client reconnects with backoff, offers its resume
// identity, reconciles subscriptions and in-flight deliveries, and sends again
// what was in flight (unconfirmed publishes, settles) before any new request.

import * as net from "node:net";
import * as tls from "node:tls";
import { randomUUID } from "node:crypto";
import {
  FLAG_NO_REPLY,
  FRAME_BYTES_DEFAULT,
  FrameSplitter,
  Op,
  PROTOCOL_VERSION,
  decodeBody,
  describe,
  encodeFrame,
  encodePublishFrame,
  encodePublishHead,
  opName,
  ASSIGNMENT_ASSIGNED,
  type Body,
  type Frame,
} from "./codec.js";
import { backoffDelay, reconnectPolicy, type ReconnectPolicy } from "./backoff.js";
import { PartitionHints, queueKey } from "./hints.js";
import {
  AbortError,
  AlreadySettledError,
  BrokerError,
  HeartbeatTimeoutError,
  TimeoutError,
  brokerError,
  safeNumber,
  subscriptionEnded,
  ClientClosedError,
  Code,
  ConnectionLostError,
  DisconnectedError,
  InvalidArgumentError,
  ProtocolError,
  SinewError,
  TLSError,
  StaleDeliveryError,
  SubscriptionEndedError,
  isRetryable,
  type SubscriptionEndReason,
} from "./errors.js";

/** Version of this package, sent in HELLO. */
export const CLIENT_VERSION = "0.1.0";

// Bounds of the client itself.
/** Publish window when neither the option nor the broker sets one. */
const PUBLISH_WINDOW_DEFAULT = 1024;
/** Body bytes of unconfirmed publishes kept for resending. */
const PUBLISH_INFLIGHT_BYTES_MAX = 64 << 20;
/** Messages buffered per subscription before the socket stops being read. */
const DELIVERY_BUFFER_MAX = 4096;
/** Assignment events buffered per cohort subscription before the oldest are dropped. */
const ASSIGNMENT_BUFFER_MAX = 256;
/** A cohort name or member id: 1 to 128 of A-Z a-z 0-9 . _ : - (docs/protocol.md 5.7). */
const COHORT_NAME = /^[A-Za-z0-9._:-]{1,128}$/;
/** Settle tags per frame when the broker announces no limit. */
const SETTLE_BATCH_DEFAULT = 256;
/** Settle frames awaiting their SETTLE_RESULT at once: while they are out,
 * further settles gather into the next frame (a full batch goes anyway). */
const SETTLE_FRAMES_MAX = 1;
/** At most this many cluster addresses are learned besides the one dialled. */
const LEARNED_MAX = 64;
/** At most this many METADATA requests ask whether the broker is clustered. */
const PROBES_MAX = 16;
/** The pause before leaving a node that refused a publish grows from the
 * first to the second bound with each refusal in a row. */
const MOVE_PAUSE_MIN_MS = 20;
const MOVE_PAUSE_MAX_MS = 1_000;
/** A refused publish goes from node to node for at most this long. */
const MOVE_BUDGET_MS = 60_000;
/** A node that refused a publish is not moved to again for this long while
 * another known node has not refused one. */
const SHUN_MS = 1_000;

/** Protocol codes the routing below reads (docs/protocol.md §6). */
const CODE_UNKNOWN_OP = 4;
const CODE_UNAVAILABLE = 15;

/** The owner named by a not_owner error, kept beside the error. */
const ownerOf = new WeakMap<object, string>();

/** How long a connection that got GOING_AWAY waits for work in flight at most. */
const GOING_AWAY_WAIT_MAX_MS = 30_000;
/** How often such a connection checks whether its work in flight finished. */
const GOING_AWAY_POLL_MS = 10;
/** Reconnect delay cap after a planned stop: the broker is restarting. */
const GOING_AWAY_BACKOFF_MAX_MS = 500;

/** Options of connect. */
export interface ConnectOptions {
  /** Aborts the first connect (all attempts and backoff sleeps). */
  signal?: AbortSignal;
  /** Name the broker logs for this client (default "sinew-ts"). */
  clientName?: string;
  /** Auth token sent in HELLO (one of the broker's auth.tokens), or the
   * password when `user` is set. */
  credentials?: string;
  /** Log in as this user, with `credentials` as its password. Use TLS
   * unless the broker is on loopback: the password travels in HELLO. */
  user?: string;
  /** Connect with TLS (1.2 or later): `true` verifies the broker against
   * Node's default CAs; an object sets a private CA, a client certificate
   * (mutual TLS) and the name to verify. Unset: plaintext. */
  tls?: TLSOptions | true;
  /** Reconnect backoff; unset fields take the defaults (100 ms → 30 s, ×2, ±10 %, reset after 10 s, unlimited). */
  reconnect?: Partial<ReconnectPolicy>;
  /** What the broker does on resume with subscriptions it no longer holds:
   * "restore" recreates them (default), "conservative" ends them. */
  reconcilePolicy?: "restore" | "conservative";
  /** Producer id stamped on publishes for deduplication (default: random per client). */
  producerId?: string;
  /** The member id of this client's cohort subscriptions (the Go SDK's
   * WithMemberID), 1 to 128 of A-Z a-z 0-9 . _ : - (default: random per
   * client, kept across reconnects). A broker session uses one member id. */
  memberId?: string;
  /** Most unconfirmed publishes at once (default 1024, never above the broker's limit). */
  publishWindow?: number;
  /** Bounds the first connect, attempts and sleeps together (default 30 000 ms). */
  connectTimeoutMs?: number;
  /** Bounds one TCP connect (default 10 000 ms). */
  dialTimeoutMs?: number;
  /** Bounds the wait for HELLO_OK (default 10 000 ms). */
  handshakeTimeoutMs?: number;
  /** Bounds how long close() waits for confirms and settles (default 5000 ms). */
  drainTimeoutMs?: number;
  /** Idle interval before the client pings (default: the broker's). */
  heartbeatMs?: number;
  /** Test seam: waits ms milliseconds (backoff). */
  sleep?: (ms: number, signal?: AbortSignal) => Promise<void>;
  /** Test seam: a uniform random number in [0, 1) for jitter. */
  random?: () => number;
  /** Test seam: the current time in ms. */
  now?: () => number;
  /** Receives connection events (attempts, losses, resumes); payloads never. */
  log?: (event: string, detail: Record<string, unknown>) => void;
  /** Called with every connection status event (see Client.status()). An
   * exception it throws is ignored. */
  onStatus?: (event: StatusEvent) => void;
  /** Called when a fast settle (complete, retry, retryAfter or fail without
   * `confirmed: true`) fails at the broker or cannot be delivered, with the
   * message and the error. Without it such failures go to `log` as
   * "settle_failed". */
  onSettleError?: (msg: Message, err: unknown) => void;
}

/** Per-operation options: abort and time limit. Either one rejects the call
 * with AbortError (TimeoutError for timeoutMs). */
export interface OperationOptions {
  /** Gives up the operation when it aborts. */
  signal?: AbortSignal;
  /** Gives up the operation after this many milliseconds. */
  timeoutMs?: number;
}

/** Options of complete, retry, retryAfter and fail. */
export interface SettleOptions extends OperationOptions {
  /** Wait for the broker's answer (SETTLE_RESULT) and reject with its typed
   * error, instead of returning once the settle is queued (default false).
   * `signal` and `timeoutMs` bound only that wait: the settle goes on. */
  confirmed?: boolean;
}

/** A change of the connection, from Client.status() and the onStatus option. */
export type StatusEvent =
  | { type: "disconnected"; error: unknown; dropped?: number }
  | { type: "reconnecting"; attempt: number; delayMs: number; dropped?: number }
  | { type: "reconnected"; resumed: boolean; dropped?: number }
  | { type: "going_away"; reason: string; deadlineMs: number; dropped?: number }
  | { type: "closed"; error: unknown; dropped?: number };

/** Events buffered per status() iterator before the oldest are dropped. */
const STATUS_BUFFER_DEFAULT = 64;

/** TLS settings of connect. Certificates and keys are PEM contents, not
 * file names: read them with `fs.readFileSync`. */
export interface TLSOptions {
  /** The CA certificate(s) that signed the broker's certificate, in place of
   * Node's default CAs (for example `ca.pem` of `sinew cert generate`). */
  ca?: string | Buffer | Array<string | Buffer>;
  /** The client certificate chain, for a broker with `tls.client_ca_file`
   * (mutual TLS). Goes with `key`. */
  cert?: string | Buffer;
  /** The private key of `cert`. */
  key?: string | Buffer;
  /** The name the broker's certificate must carry (default: the host of the
   * address). Sent as SNI when it is a DNS name. */
  servername?: string;
}

/** Message headers: an object, or [key, value] pairs (which may repeat a key). */
export type HeadersInit = Record<string, string> | Iterable<readonly [string, string]>;

/** Options of one publish. */
export interface PublishOptions extends OperationOptions {
  /** Queue group (default ""). */
  group?: string;
  /** Partition; -1 (default) lets the broker choose. */
  partition?: number;
  /** Partition key. */
  key?: Uint8Array | string;
  /** Message headers, an object or [key, value] pairs in order (a key may
   * repeat); keys starting with "sinew." are reserved. */
  headers?: HeadersInit;
  /** Content type. */
  contentType?: string;
  /** Deliver no earlier than now + delayMs. */
  delayMs?: number;
  /** Time to live; 0 = the queue's default. */
  ttlMs?: number;
}

/** Where a confirmed message is stored. */
export interface PublishResult {
  partition: number;
  /** A number: offsets above Number.MAX_SAFE_INTEGER reject with UnsafeIntegerError. */
  offset: number;
  /** The broker had stored this publish already (a resend); offset is the original's. */
  duplicate: boolean;
}

/** Options of subscribe. */
export interface SubscribeOptions extends OperationOptions {
  group?: string;
  /** One partition, or -1 (default) for all. */
  partition?: number;
  /** Most unsettled deliveries at once; 0 = the broker's default. Clamped to the broker's maximum. */
  prefetch?: number;
  /** The broker settles each delivery when it sends it. */
  autoAck?: boolean;
  /** Join this cohort (consumer group): the queue's partitions are shared
   * among the cohort's members, each partition delivered to one member at a
   * time, in offset order. 1 to 128 of A-Z a-z 0-9 . _ : - */
  cohort?: string;
  /** The member id within the cohort (same alphabet); default: the client's
   * `memberId`, random per client and kept across reconnects. Only with `cohort`. */
  memberId?: string;
}

/** A partition assigned to or revoked from a cohort subscription (the
 * ASSIGNMENT push), from Subscription.assignments(). */
export interface AssignmentEvent {
  readonly partition: number;
  /** The partition's assignment epoch after the move; deliveries made under
   * this assignment carry it as Message.assignment. Reading it throws
   * UnsafeIntegerError above Number.MAX_SAFE_INTEGER. */
  readonly epoch: number;
  /** "assigned": the partition's deliveries come to this subscription now;
   * "revoked": they go to another member (or nowhere until the next plan). */
  readonly state: "assigned" | "revoked";
  /** Events dropped just before this one because the buffer was full. */
  readonly dropped?: number;
}

/** Settings of declareQueue; unset means the broker's default. */
export interface QueueOptions extends OperationOptions {
  group?: string;
  partitions?: number;
  /** "default", "discard", "global" or "queue" (then deadLetterTarget names it). */
  deadLetter?: "default" | "discard" | "global" | "queue";
  deadLetterTarget?: string;
  maxRetries?: number;
  defaultTtlMs?: number;
  leaseMs?: number;
}

type Resume = { client_id: string; owner_id: string; token: Uint8Array };

interface PendingPublish {
  /** Written to a socket at least once. */
  sent: boolean;
  /** The encoded fields before producer_seq. */
  head: Uint8Array;
  seq: bigint;
  payload: Uint8Array;
  bytes: number;
  resolve(r: PublishResult): void;
  reject(e: unknown): void;
  /** When a node first refused it (unavailable, fenced, not_owner), in ms; 0 if none did. */
  refusedAt?: number;
  /** A keyless publish: its queue's key in the partition hints (hints.ts). */
  queue?: string;
  /** Sent to a hinted partition: its fields with the application's
   * partition (-1), to encode the head again if that partition is gone. */
  unhinted?: Body;
  /** A send of it was cut off before its answer: that send may have
   * stored it, so a not_found later does not send it unhinted. */
  uncertain?: boolean;
}

interface SettleReq {
  op: number;
  msg: Message;
  delayMs: number;
  resolve(): void;
  reject(e: unknown): void;
}

interface PendingCall {
  op: number;
  resolve(f: { op: number; body: Body }): void;
  reject(e: unknown): void;
  /** Decides what happens when the connection breaks first. */
  lost(err: unknown): void;
  /** Runs with the reply before any later frame is handled (a promise's
   * continuation would run only after the rest of the chunk). */
  hook?: (op: number, body: Body) => void;
}

const utf8 = new TextEncoder();
const utf8dec = new TextDecoder();

function toBytes(v: Uint8Array | string | undefined): Uint8Array {
  if (v === undefined) return new Uint8Array(0);
  return typeof v === "string" ? utf8.encode(v) : v;
}

function defaultSleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** A promise with its resolvers, for waiters. */
function deferred<T>(): { promise: Promise<T>; resolve(v: T): void; reject(e: unknown): void } {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((a, b) => {
    resolve = a;
    reject = b;
  });
  return { promise, resolve, reject };
}

/** One socket and the requests in flight on it. */
class Conn {
  readonly splitter: FrameSplitter;
  readonly pending = new Map<bigint, PendingCall>();
  readonly subs = new Map<bigint, Subscription>();
  hello!: Body;
  nextId = 1n;
  closed = false;
  closeErr: unknown = null;
  draining = false;
  awayDeadline = 0;
  lastRead = 0;
  lastWrite = 0;
  private corked = false;
  private heartbeat: NodeJS.Timeout | null = null;
  private settleQueue: SettleReq[] = [];
  private settleScheduled = false;
  readonly done = deferred<void>();
  pausedBy = new Set<Subscription>();

  constructor(
    readonly client: Client,
    readonly sock: net.Socket,
    readonly epoch: number,
  ) {
    this.splitter = new FrameSplitter(FRAME_BYTES_DEFAULT);
    sock.on("data", (chunk: Buffer) => this.onData(chunk));
    sock.on("error", (err) => this.close(err));
    sock.on("close", () => this.close(new ConnectionLostError("connection closed by the peer")));
  }

  write(frame: Uint8Array): void {
    if (this.closed) return;
    // Frames written in one turn of the event loop go out in one write.
    if (!this.corked) {
      this.corked = true;
      this.sock.cork();
      process.nextTick(() => {
        this.corked = false;
        this.sock.uncork();
      });
    }
    this.lastWrite = Date.now();
    this.sock.write(frame);
  }

  /** Sends what write() corked now, rather than at the end of the turn. */
  push(): void {
    if (!this.corked || this.closed) return;
    this.corked = false;
    this.sock.uncork();
  }

  /** Sends a request; the promise settles with its reply. The frame is
   * encoded before the request is registered: one that cannot be encoded,
   * or exceeds the broker's frame limit, rejects and leaves nothing behind. */
  call(
    op: number,
    body: Body | ((requestId: bigint) => Uint8Array),
    lost?: (err: unknown) => void,
    hook?: (op: number, body: Body) => void,
  ): Promise<{ op: number; body: Body }> {
    const d = deferred<{ op: number; body: Body }>();
    if (this.closed) {
      (lost ?? d.reject)(this.lostError());
      return d.promise;
    }
    const id = this.nextId;
    let frame: Uint8Array;
    try {
      frame = typeof body === "function" ? body(id) : encodeFrame(op, id, body);
    } catch (e) {
      return Promise.reject(e);
    }
    if (frame.length > this.frameMax()) {
      return Promise.reject(new InvalidArgumentError("body", `a ${opName(op)} frame of ${frame.length} bytes exceeds the broker's frame limit of ${this.frameMax()} bytes`));
    }
    this.nextId++;
    this.pending.set(id, { op, resolve: d.resolve, reject: d.reject, lost: lost ?? ((e) => d.reject(e)), hook });
    this.write(frame);
    return d.promise;
  }

  /** The largest frame the broker takes (HELLO_OK's frame_bytes_max). */
  frameMax(): number {
    return (this.hello?.limits?.frame_bytes_max as number | undefined) || FRAME_BYTES_DEFAULT;
  }

  lostError(): ConnectionLostError {
    return new ConnectionLostError(`connection lost: ${String((this.closeErr as Error)?.message ?? this.closeErr)}`, this.closeErr);
  }

  /** Queues a settle; settles of one turn go out batched by op and delay. */
  settle(r: SettleReq): void {
    this.settleQueue.push(r);
    if (this.settleQueue.length >= this.settleBatchMax()) {
      // A full batch goes out at once.
      this.flushSettles(true);
      this.push();
      return;
    }
    if (!this.settleScheduled) {
      this.settleScheduled = true;
      setImmediate(() => {
        this.settleScheduled = false;
        this.flushSettles(false);
      });
    }
  }

  /** Settle frames sent and not yet answered. */
  private settleFrames = 0;

  settleBatchMax(): number {
    return (this.hello?.limits?.settle_batch_max as number | undefined) || SETTLE_BATCH_DEFAULT;
  }

  settlesQueued(): number {
    return this.settleQueue.length;
  }

  /** Sends the queued settles: with force now (before an UNSUBSCRIBE or an
   * END_SESSION, so that they reach the broker first), else unless
   * SETTLE_FRAMES_MAX frames are out, whose answers then send them. Batching
   * on answers lets a busy consumer put many tags in each frame, which the
   * broker makes durable at once. */
  flushSettles(force = true): void {
    if (!force && !this.closed && this.settleFrames >= SETTLE_FRAMES_MAX) return;
    const q = this.settleQueue;
    this.settleQueue = [];
    if (this.closed) {
      this.client.holdSettles(q);
      return;
    }
    if (q.length === 0) return;
    const max = this.settleBatchMax();
    const groups = new Map<string, SettleReq[]>();
    for (const r of q) {
      const k = `${r.op}/${r.delayMs}`;
      const g = groups.get(k);
      if (g) g.push(r);
      else groups.set(k, [r]);
    }
    for (const g of groups.values()) {
      for (let i = 0; i < g.length; i += max) this.sendSettles(g.slice(i, i + max));
    }
  }

  private sendSettles(batch: SettleReq[]): void {
    const ms = BigInt(batch[0]!.delayMs);
    const tags = batch.map((r) => r.msg.tag);
    const leases = batch.map((r) => r.msg.lease);
    const body = batch[0]!.op === Op.EXTEND ? { tags, extend_ms: ms, leases } : { tags, delay_ms: ms, leases };
    this.settleFrames++;
    const answered = () => {
      this.settleFrames--;
      if (this.settleQueue.length > 0) this.flushSettles(false);
    };
    this.call(batch[0]!.op, body, () => {
      this.settleFrames--;
      this.client.holdSettles(batch);
    }).then(
      (reply) => {
        answered();
        if (reply.op !== Op.SETTLE_RESULT || reply.body.codes.length !== batch.length) {
          this.close(new ProtocolError(`${opName(reply.op)} in answer to a settle`));
          for (const r of batch) r.reject(new ProtocolError("bad settle result"));
          return;
        }
        batch.forEach((r, i) => this.client.settled(r, reply.body.codes[i] as number));
      },
      (err) => {
        answered();
        for (const r of batch) this.client.settleFailed(r, err);
      },
    );
  }

  startHeartbeat(brokerMs: number, ownMs: number | undefined): void {
    let every = brokerMs;
    if (ownMs && ownMs > 0 && (every === 0 || ownMs < every)) every = ownMs;
    if (every <= 0) return;
    // Heartbeats run on real timers, so they measure real time too (the
    // injectable clock is for backoff and drain decisions).
    this.heartbeat = setInterval(() => {
      const now = Date.now();
      if (now - this.lastRead >= 3 * every) {
        this.close(new HeartbeatTimeoutError());
        return;
      }
      if (now - this.lastWrite >= every) this.call(Op.PING, {}, () => {}).catch(() => {});
    }, every);
    this.heartbeat.unref();
  }

  private onData(chunk: Buffer): void {
    this.lastRead = Date.now();
    let frames: Frame[];
    try {
      frames = this.splitter.push(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength));
    } catch (e) {
      this.close(new ProtocolError(`bad frame from the broker: ${(e as Error).message}`, e));
      return;
    }
    for (const f of frames) {
      if (this.closed) return;
      let body: Body;
      try {
        body = decodeBody(f.op, f.body);
      } catch (e) {
        this.close(new ProtocolError(`bad ${opName(f.op)} from the broker: ${(e as Error).message}`, e));
        return;
      }
      this.onFrame(f, body);
    }
  }

  private onFrame(f: Frame, body: Body): void {
    switch (f.op) {
      case Op.DELIVER:
        this.subs.get(body.sub_id as bigint)?.deliver(this, body);
        return;
      case Op.ASSIGNMENT:
        this.subs.get(body.sub_id as bigint)?.assignment(body); // an unknown sub_id is ignored
        return;
      case Op.SUB_CLOSED:
        this.client.subClosed(this, body);
        return;
      case Op.GOING_AWAY:
        this.client.goingAway(this, body);
        return;
      case Op.PING:
        this.write(encodeFrame(Op.PONG, f.requestId, {}));
        return;
    }
    if (f.op === Op.ERROR && f.requestId === 0n) {
      this.close(brokerError(body.code, body.message));
      return;
    }
    const p = this.pending.get(f.requestId);
    if (!p) return; // a reply to a request given up on (a PING, say)
    this.pending.delete(f.requestId);
    if (f.op === Op.ERROR) {
      const err = brokerError(body.code, body.message);
      if (body.owner) ownerOf.set(err, String(body.owner));
      p.reject(err);
      if (body.fatal) this.close(err);
      return;
    }
    p.hook?.(f.op, body);
    p.resolve({ op: f.op, body });
  }

  /** Ends the connection; requests in flight go to their lost handlers. */
  close(err: unknown): void {
    if (this.closed) return;
    this.closed = true;
    this.closeErr = err;
    if (this.heartbeat) clearInterval(this.heartbeat);
    this.sock.destroy();
    const pending = [...this.pending.values()];
    this.pending.clear();
    for (const p of pending) p.lost(err);
    const q = this.settleQueue;
    this.settleQueue = [];
    if (q.length) this.client.holdSettles(q);
    this.done.resolve();
    this.client.connClosed(this, err);
  }
}

/**
 * A Sinew client. Create one with connect(). It keeps one broker session
 * across socket breaks; see the package README for what it guarantees.
 */
export class Client {
  readonly addr: string;
  readonly producerId: string;
  /** The member id of this client's cohort subscriptions that name none:
   * the `memberId` option, else random per client; the same across reconnects. */
  readonly memberId: string;
  private readonly o: ConnectOptions;
  private readonly policy: ReconnectPolicy;
  private readonly sleep: (ms: number, signal?: AbortSignal) => Promise<void>;
  private readonly random: () => number;
  /** @internal */
  readonly now: () => number;
  private readonly log: (event: string, detail: Record<string, unknown>) => void;

  private conn: Conn | null = null;
  private identity: Resume = { client_id: "", owner_id: "", token: new Uint8Array(0) };
  /** @internal */
  epoch = 0;
  private seq = 0n;
  /** @internal */
  readonly subs = new Set<Subscription>();
  /** The broker's frame limit at the last handshake. */
  private frameMax = FRAME_BYTES_DEFAULT;
  private replay: PendingPublish[] = [];
  private held: SettleReq[] = [];
  private inflight = new Set<PendingPublish>();
  private inflightBytes = 0;
  private windowMax: number;
  /** Publishes waiting for the window, in order, from windowHead on (an
   * aborted one is marked gone and skipped): taking the first is O(1). */
  private windowWaiters: Array<(() => void) & { bytes: number; gone?: boolean }> = [];
  private windowHead = 0;
  private connWaiters: Array<{ resolve(c: Conn): void; reject(e: unknown): void }> = [];
  private closing = false;
  private closed = false;
  private fatal: unknown = null;
  private gaveUp: unknown = null;
  private reconnecting = false;
  private readonly stop = new AbortController();

  /** @internal Use connect(). */
  constructor(addr: string, o: ConnectOptions) {
    checkConnectOptions(addr, o);
    this.addr = addr;
    this.target = addr;
    this.o = o;
    this.policy = reconnectPolicy(o.reconnect);
    this.sleep = o.sleep ?? defaultSleep;
    this.random = o.random ?? Math.random;
    this.now = o.now ?? Date.now;
    const log = o.log;
    // The application's logger must not break the connection's state changes.
    this.log = log
      ? (e, d) => {
          try {
            log(e, d);
          } catch {
            // ignored
          }
        }
      : () => {};
    this.producerId = o.producerId ?? `ts-${randomUUID()}`;
    this.memberId = o.memberId ?? `m-ts-${randomUUID()}`;
    this.windowMax = o.publishWindow && o.publishWindow > 0 ? o.publishWindow : PUBLISH_WINDOW_DEFAULT;
  }

  /** @internal First connect: retry retryable failures with backoff. */
  async open(): Promise<void> {
    const limit = AbortSignal.timeout(this.o.connectTimeoutMs ?? 30_000);
    const signal = this.o.signal ? AbortSignal.any([this.o.signal, limit]) : limit;
    for (let failures = 0; ; ) {
      try {
        await this.attempt(signal);
        return;
      } catch (err) {
        if (signal.aborted) {
          this.shutdownNow(new ClientClosedError());
          throw signal.reason instanceof Error && this.o.signal?.aborted
            ? signal.reason
            : new DisconnectedError(`connect ${this.addr}: timed out after ${failures + 1} attempts`, err);
        }
        if (!isRetryable(err)) {
          this.log("connect_failed_fatal", { addr: this.addr, err: String(err) });
          this.shutdownNow(err);
          throw err;
        }
        failures++;
        if (this.policy.maxAttempts > 0 && failures >= this.policy.maxAttempts) {
          this.shutdownNow(new ClientClosedError());
          throw new DisconnectedError(`connect ${this.addr}: ${failures} attempts failed`, err);
        }
        const d = backoffDelay(this.policy, failures - 1, this.random());
        this.log("connect_failed", { addr: this.addr, attempt: failures, delayMs: d, err: String(err) });
        try {
          await this.sleep(d, signal);
        } catch {
          this.shutdownNow(new ClientClosedError());
          throw this.o.signal?.aborted ? this.o.signal.reason : new DisconnectedError(`connect ${this.addr}: timed out`, err);
        }
      }
    }
  }

  /** One connect attempt: dial, handshake, restore the session. */
  private async attempt(signal?: AbortSignal): Promise<Conn> {
    const [host, port] = splitAddr(this.target);
    const tlsOpts = this.o.tls === true ? {} : this.o.tls;
    const sock = await dial(host, port, this.o.dialTimeoutMs ?? 10_000, signal, tlsOpts);
    const c = new Conn(this, sock, this.epoch);
    const hello = await this.handshake(c);
    const offered = this.identity.client_id !== "";
    const resumed = hello.outcome === 1 && offered;
    this.identity = hello.resume as Resume;
    if (!resumed) {
      this.epoch++;
      const stale = this.held;
      this.held = [];
      for (const r of stale) r.reject(new StaleDeliveryError("session not resumed: the broker will deliver the message again"));
      for (const s of this.subs) s.resetForFreshSession();
    }
    (c as { epoch: number }).epoch = this.epoch;
    this.log(offered ? (resumed ? "session_resumed" : "session_not_resumed") : "session_started", {
      addr: this.addr,
      clientId: this.identity.client_id,
      outcome: hello.outcome,
    });
    if (hello.limits.publish_inflight_max > 0) {
      this.windowMax = Math.min(this.o.publishWindow || PUBLISH_WINDOW_DEFAULT, hello.limits.publish_inflight_max);
    }
    c.splitter.frameBytesMax = hello.limits.frame_bytes_max || FRAME_BYTES_DEFAULT;
    this.frameMax = c.frameMax();
    c.startHeartbeat(hello.heartbeat_ms, this.o.heartbeatMs);
    try {
      await this.restore(c, resumed);
    } catch (e) {
      c.close(e);
      throw e;
    }
    if (this.closed) {
      c.close(new ClientClosedError());
      throw new ClientClosedError();
    }
    if (c.closed) throw c.closeErr;
    this.conn = c;
    this.gaveUp = null;
    this.connectedAt = this.now();
    // Settles and publishes made between restore's last step and now.
    this.flushHeld(c);
    const w = this.connWaiters;
    this.connWaiters = [];
    for (const x of w) x.resolve(c);
    return c;
  }

  private handshake(c: Conn): Promise<Body> {
    const timeoutMs = this.o.handshakeTimeoutMs ?? 10_000;
    return new Promise<Body>((resolve, reject) => {
      const t = setTimeout(() => c.close(new SinewError(`no HELLO_OK within ${timeoutMs} ms`, true)), timeoutMs);
      c.call(Op.HELLO, {
        protocol_version: PROTOCOL_VERSION,
        client_name: this.o.clientName ?? "sinew-ts",
        client_version: CLIENT_VERSION,
        credentials: this.o.credentials ?? "",
        resume: this.identity,
        user: this.o.user ?? "",
      }).then(
        (r) => {
          clearTimeout(t);
          if (r.op !== Op.HELLO_OK) {
            const err = new ProtocolError(`${opName(r.op)} in answer to HELLO`);
            c.close(err);
            return reject(err);
          }
          if (r.body.protocol_version !== PROTOCOL_VERSION) {
            const err = new ProtocolError(`broker chose protocol version ${r.body.protocol_version}`);
            c.close(err);
            return reject(err);
          }
          c.hello = r.body;
          resolve(r.body);
        },
        (e) => {
          clearTimeout(t);
          c.close(e);
          const cause = e instanceof ConnectionLostError && e.cause ? e.cause : e;
          reject(this.o.tls && isTLSFailure(cause) ? tlsError(this.addr, cause) : cause);
        },
      );
    });
  }

  /** Brings a new connection up to the client's state, before any new request. */
  private async restore(c: Conn, resumed: boolean): Promise<void> {
    if (resumed) {
      const manual = [...this.subs].filter((s) => !s.autoAck && s.serverId !== null);
      for (const s of this.subs) if (s.serverId !== null) c.subs.set(s.serverId, s);
      await this.reconcile(c);
      await this.reconcileInflight(c, manual);
    }
    for (const s of [...this.subs]) {
      if (s.serverId !== null || s.ended) continue;
      try {
        await this.subscribeOn(c, s);
      } catch (e) {
        if (e instanceof BrokerError) s.end(s.recreating ? "recreate_failed" : "broker_error", e);
        else throw e;
      }
    }
    this.flushHeld(c);
  }

  /** Sends what waited for a connection: settles first, then publishes in sequence order. */
  private flushHeld(c: Conn): void {
    const held = this.held;
    this.held = [];
    for (const r of held) this.routeSettle(r, c);
    const replay = this.replay;
    this.replay = [];
    for (const p of replay) this.sendPublish(p, c);
  }

  private async reconcile(c: Conn): Promise<void> {
    const byId = new Map<bigint, Subscription>();
    const subs = [];
    const cohorts = [];
    for (const s of this.subs) {
      if (s.serverId === null) continue;
      byId.set(s.serverId, s);
      subs.push(s.view());
      // So that a subscription the broker recreates joins its cohort again.
      if (s.cohort) cohorts.push({ sub_id: s.serverId, cohort: s.cohort, member: s.memberId });
    }
    const policy = this.o.reconcilePolicy === "conservative" ? 0 : 1;
    // Applied in the hook: deliveries of a recreated subscription follow the result.
    const hook = (op: number, b: Body) => {
      if (op === Op.RECONCILE_RESULT) this.applyReconcile(c, byId, b.entries as Body[]);
    };
    const r = await c.call(Op.RECONCILE, { policy, subs, inflight_follows: true, cohorts }, undefined, hook);
    if (r.op !== Op.RECONCILE_RESULT) throw new ProtocolError(`${opName(r.op)} in answer to RECONCILE`);
  }

  private applyReconcile(c: Conn, byId: Map<bigint, Subscription>, entries: Body[]): void {
    for (const x of entries) {
      const s = byId.get(x.client_sub_id);
      if (!s || x.client_sub_id === 0n) continue;
      switch (x.action) {
        case 1: // keep, perhaps under a new id
          if (x.server_sub_id !== 0n && x.server_sub_id !== s.serverId) {
            c.subs.delete(s.serverId!);
            s.serverId = x.server_sub_id;
            c.subs.set(s.serverId!, s);
          }
          break;
        case 2: // close client side
          c.subs.delete(s.serverId!);
          s.serverId = null;
          s.end("reconciled_closed", new SinewError(`closed by reconciliation: ${x.reason}`, false));
          break;
        case 4: // recreate client side
          c.subs.delete(s.serverId!);
          if (x.server_sub_id !== 0n) {
            s.serverId = x.server_sub_id;
            c.subs.set(s.serverId!, s);
          } else {
            s.serverId = null;
            s.recreating = true;
          }
          break;
      }
    }
  }

  private async reconcileInflight(c: Conn, manual: Subscription[]): Promise<void> {
    const entries = manual.flatMap((s) => s.inflightEntries(c.epoch));
    let r;
    try {
      r = await c.call(Op.INFLIGHT, { entries });
    } catch (e) {
      if (e instanceof BrokerError) return; // a broker without INFLIGHT re-sends everything; the tag check drops copies
      throw e;
    }
    if (r.op !== Op.INFLIGHT_RESULT) throw new ProtocolError(`${opName(r.op)} in answer to INFLIGHT`);
    const stale = new Set<bigint>(r.body.stale as bigint[]);
    if (stale.size) for (const s of manual) s.markStale(c.epoch, stale);
    this.log("inflight_reconciled", { reported: entries.length, stale: stale.size, resent: r.body.resent, kept: r.body.kept });
  }

  /** The connection for new requests, or null while (re)connecting or draining. */
  private usable(): Conn | null {
    const c = this.conn;
    return c && !c.closed && !c.draining ? c : null;
  }

  /** Waits for a usable connection. */
  private ready(): Promise<Conn> {
    const err = this.stateError();
    if (err) return Promise.reject(err);
    const c = this.usable();
    if (c) return Promise.resolve(c);
    if (this.gaveUp) this.kick();
    const d = deferred<Conn>();
    this.connWaiters.push(d);
    return d.promise;
  }

  private stateError(): unknown {
    if (this.closing || this.closed) return new ClientClosedError();
    if (this.fatal) return this.fatal;
    return null;
  }

  // ----- publishing -----

  /**
   * Publishes one message and resolves once the broker has made it durable.
   * Across a reconnect the publish is held and sent again with the same
   * producer id and sequence, so the broker stores it once.
   */
  async publish(topic: string, body: Uint8Array | string, opts: PublishOptions = {}): Promise<PublishResult> {
    // Every argument is checked and encoded before anything changes: a bad
    // one throws InvalidArgumentError here and leaves no trace.
    const err = this.stateError();
    if (err) throw err;
    const { head, payload, queue, unhinted } = encodePublish(topic, body, opts, this.producerId, this.hints);
    const oo = operationOptions(opts, "opts");
    const frameBytes = 16 + head.length + 10 + 10 + payload.length + 1;
    if (frameBytes > this.frameMax) {
      throw new InvalidArgumentError("body", `a message of ${payload.length} bytes exceeds the broker's frame limit of ${this.frameMax} bytes`);
    }
    const state = { sent: false };
    this.probe(topic, opts.group ?? "");
    return abortable("publish", oo, state, (signal) => this.publishOn(head, payload, queue, unhinted, signal, state));
  }

  /** The last partition hint per queue (hints.ts). */
  private readonly hints = new PartitionHints();

  /** @internal The partition the next keyless publish to the queue goes to,
   * as the broker hinted; undefined if none. */
  partitionHint(topic: string, group = ""): number | undefined {
    return this.hints.take(queueKey(topic, group));
  }

  // ----- cluster routing -----
  //
  // The client keeps one connection. In a cluster (the broker's METADATA
  // says so, or a GOING_AWAY names a redirect) it is not pinned to the
  // address it dialled: it learns the nodes holding a queue's replicas
  // (at most LEARNED_MAX), and a publish a node refuses (unavailable,
  // fenced, not_owner) is held and the connection moves, after a short
  // pause, to the owner the refusal names or else to the next known node,
  // where the publish is sent again with the same producer id and
  // sequence (the cluster stores it once). A single broker's refusal
  // still rejects the publish.

  /** Cluster nodes learned besides this.addr, oldest first. */
  private learned: string[] = [];
  /** The address the next connect attempt dials. */
  private target: string;
  /** Whether the broker is a cluster node; null until it said. */
  private clustered: boolean | null = null;
  private probes = 0;
  /** The METADATA request in flight asking whether the broker is clustered. */
  private probing: Promise<void> | null = null;
  /** When each node last refused a publish (ms; at most LEARNED_MAX + 1 kept). */
  private refusedBy = new Map<string, number>();
  /** A move to another node is pending. */
  private moving = false;
  /** Refusals since the last confirmed publish. */
  private refusals = 0;

  private learn(...addrs: string[]): void {
    for (const a of addrs) {
      if (!a || a === this.addr || this.learned.includes(a)) continue;
      if (this.learned.length >= LEARNED_MAX) this.learned.shift();
      this.learned.push(a);
    }
  }

  /** Asks the broker, once, whether it is clustered, and learns the queue's nodes. */
  private probe(topic: string, group: string): void {
    if (this.clustered !== null || this.probing || this.probes >= PROBES_MAX) return;
    if (this.conn?.hello && !this.conn.hello.cluster) {
      // HELLO_OK said the node runs alone: nothing to ask.
      this.clustered = false;
      return;
    }
    this.probes++;
    this.probing = this.request("metadata", { timeoutMs: 5_000 }, Op.METADATA, { topic, group }).then(
      (b) => {
        this.probing = null;
        this.clustered = !!b.cluster;
        if (!b.cluster) return;
        for (const pm of (b.partitions ?? []) as Body[]) this.learn(String(pm.owner ?? ""), ...((pm.replicas ?? []) as string[]));
        this.log("clustered", { addr: this.addr, nodes: 1 + this.learned.length });
      },
      (e) => {
        this.probing = null;
        if (e instanceof BrokerError && e.code === CODE_UNKNOWN_OP) this.clustered = false;
      },
    );
  }

  /**
   * Node c refused publish p: in a cluster p is held and the connection
   * moves; false when the refusal is p's outcome (the caller fails it). While
   * the broker has not said yet whether it is clustered, p waits for that
   * answer and fail runs if it is not.
   */
  private refused(e: unknown, c: Conn, p: PendingPublish, fail: () => void): boolean {
    if (this.closing || this.closed) return false;
    if (!(e instanceof BrokerError) || ![CODE_UNAVAILABLE, Code.FENCED, Code.NOT_OWNER].includes(e.code)) return false;
    if (this.clustered === null && this.probing) {
      this.probing.then(() => {
        if (!this.refused(e, c, p, fail)) fail();
      });
      return true;
    }
    if (this.clustered !== true) return false;
    const owner = ownerOf.get(e) ?? "";
    if (!owner && this.learned.length === 0) return false; // nowhere else to go
    const now = this.now();
    p.refusedAt ||= now;
    if (now - p.refusedAt > MOVE_BUDGET_MS) return false;
    if (e.code !== Code.NOT_OWNER || !owner) {
      this.refusedBy.delete(this.target);
      this.refusedBy.set(this.target, now);
      if (this.refusedBy.size > LEARNED_MAX + 1) this.refusedBy.delete(this.refusedBy.keys().next().value!);
    }
    this.holdPublish(p);
    this.moveOff(c, owner);
    return true;
  }

  /** Moves the connection off c: to owner if named and it has not refused a
   * publish lately, else to the next known node that has not (else the next). */
  private moveOff(c: Conn, owner: string): void {
    if (this.moving || this.conn !== c || c.closed) return;
    this.moving = true;
    const now = this.now();
    const fresh = (a: string) => now - (this.refusedBy.get(a) ?? -Infinity) >= SHUN_MS;
    const all = [this.addr, ...this.learned];
    let next = owner && owner !== this.target && fresh(owner) ? owner : "";
    if (next) this.learn(next);
    else {
      const i = all.indexOf(this.target);
      const order = [...all.slice(i + 1), ...all.slice(0, i + 1)];
      next = order.find((a) => a !== this.target && fresh(a)) ?? order[0]!;
    }
    const pause = Math.min(MOVE_PAUSE_MIN_MS * 2 ** Math.min(this.refusals, 10), MOVE_PAUSE_MAX_MS);
    this.refusals++;
    this.log("moving", { from: this.target, to: next, pauseMs: pause });
    setTimeout(() => {
      this.moving = false;
      if (this.closed || this.conn !== c || c.closed) return;
      this.target = next;
      c.close(new ConnectionLostError(`leaving a node that refused a publish for ${next}`));
    }, pause).unref?.();
  }

  private async publishOn(
    head: Uint8Array,
    payload: Uint8Array,
    queue: string | undefined,
    unhinted: Body | undefined,
    signal: AbortSignal | undefined,
    state: { sent: boolean },
  ): Promise<PublishResult> {
    await this.windowAcquire(payload.length, signal);
    const err2 = this.stateError();
    if (err2) {
      this.windowRelease(payload.length);
      throw err2;
    }
    this.seq++;
    const d = deferred<PublishResult>();
    const p: PendingPublish = { sent: false, head, seq: this.seq, payload, bytes: payload.length, resolve: d.resolve, reject: d.reject, queue, unhinted };
    this.inflight.add(p);
    const c = this.usable();
    if (c) this.sendPublish(p, c);
    else {
      this.replay.push(p);
      if (this.gaveUp) this.kick();
    }
    state.sent = p.sent;
    if (signal) {
      // Given up: a publish waiting for a connection is dropped and frees its
      // slot; one already written waits for its answer, which frees it.
      const onAbort = () => {
        state.sent = p.sent;
        const i = this.replay.indexOf(p);
        if (i >= 0) {
          this.replay.splice(i, 1);
          this.inflight.delete(p);
          this.windowRelease(p.bytes);
        }
      };
      signal.addEventListener("abort", onAbort, { once: true });
      d.promise.then(
        () => signal.removeEventListener("abort", onAbort),
        () => signal.removeEventListener("abort", onAbort),
      );
    }
    return d.promise;
  }

  private sendPublish(p: PendingPublish, c: Conn): void {
    p.sent = true;
    const finish = () => {
      this.inflight.delete(p);
      this.windowRelease(p.bytes);
    };
    const cut = () => {
      p.uncertain = true;
      this.holdPublish(p);
    };
    c.call(Op.PUBLISH, (id) => encodePublishFrame(id, p.head, p.seq, p.payload), cut).then(
      (r) => {
        if (r.op !== Op.PUBLISH_OK) {
          finish();
          p.reject(new ProtocolError(`${opName(r.op)} in answer to PUBLISH`));
          return;
        }
        finish();
        this.refusals = 0;
        if (p.queue !== undefined) this.hints.note(p.queue, r.body.next);
        let offset: number;
        try {
          offset = safeNumber("offset", r.body.offset);
        } catch (e) {
          p.reject(e);
          return;
        }
        p.resolve({ partition: r.body.partition, offset, duplicate: r.body.duplicate });
      },
      (e) => {
        if (e instanceof BrokerError && e.code === Code.SHUTTING_DOWN && !this.closing) {
          // Refused by a draining broker: nothing was stored. Send it on the next connection.
          this.holdPublish(p);
          return;
        }
        if (p.unhinted && !p.uncertain && e instanceof BrokerError && e.code === Code.NOT_FOUND) {
          // The hinted partition is gone (the queue was declared again with
          // fewer) and no send of it was cut off (one could have reached a
          // node that stored it): the publish goes again as the
          // application sent it, without a partition, in the same window
          // slot and with the same sequence.
          this.hints.drop(p.queue!);
          p.head = encodePublishHead(p.unhinted);
          p.unhinted = undefined;
          const next = this.usable();
          if (next) this.sendPublish(p, next);
          else this.holdPublish(p);
          return;
        }
        // A cluster node that cannot take it: held, and sent to another node.
        if (this.refused(e, c, p, () => { finish(); p.reject(e); })) return;
        finish();
        p.reject(e);
      },
    );
  }

  /** Keeps a publish cut off from its connection for the next one, in sequence order. */
  private holdPublish(p: PendingPublish): void {
    const err = this.closed ? new ClientClosedError() : this.fatal;
    if (err) {
      this.inflight.delete(p);
      this.windowRelease(p.bytes);
      p.reject(err);
      return;
    }
    let i = this.replay.length;
    while (i > 0 && this.replay[i - 1]!.seq > p.seq) i--;
    this.replay.splice(i, 0, p);
  }

  private windowAcquire(bytes: number, signal?: AbortSignal): Promise<void> {
    if (this.windowHead === this.windowWaiters.length && this.fits(bytes)) {
      this.inflightBytes += bytes;
      this.windowCount++;
      return Promise.resolve();
    }
    return new Promise((resolve, reject) => {
      const w: (() => void) & { bytes: number; gone?: boolean } = Object.assign(
        () => {
          signal?.removeEventListener("abort", onAbort);
          this.inflightBytes += bytes;
          this.windowCount++;
          resolve();
        },
        { bytes },
      );
      // Given up while waiting: leave the queue without taking a slot, and
      // let the next waiter in if this one held it back.
      const onAbort = () => {
        if (w.gone) return;
        w.gone = true;
        this.pumpWindow();
        reject(signal!.reason);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.windowWaiters.push(w);
    });
  }
  private windowCount = 0;
  private fits(bytes: number): boolean {
    return this.windowCount < this.windowMax && (this.inflightBytes + bytes <= PUBLISH_INFLIGHT_BYTES_MAX || this.windowCount === 0);
  }
  private windowRelease(bytes: number): void {
    this.windowCount--;
    this.inflightBytes -= bytes;
    this.pumpWindow();
  }
  private pumpWindow(): void {
    const q = this.windowWaiters;
    while (this.windowHead < q.length) {
      const w = q[this.windowHead]!;
      if (!w.gone) {
        if (!this.fits(w.bytes)) break;
        w.gone = true;
        w();
      }
      q[this.windowHead++] = undefined as never;
    }
    if (this.windowHead === q.length) {
      q.length = 0;
      this.windowHead = 0;
    } else if (this.windowHead >= 1024 && this.windowHead * 2 >= q.length) {
      q.splice(0, this.windowHead);
      this.windowHead = 0;
    }
  }

  // ----- queues -----

  /** Creates a queue or checks an existing one. Resolves with its partition count and whether it was created. */
  async declareQueue(topic: string, opts: QueueOptions = {}): Promise<{ partitions: number; created: boolean }> {
    const o = options(opts, "opts");
    checkString("topic", topic);
    checkString("opts.group", o.group);
    checkInt("opts.partitions", o.partitions, 0, 0xffffffff);
    const modes: Record<string, number> = { default: 0, discard: 1, global: 2, queue: 3 };
    const mode = modes[o.deadLetter ?? "default"];
    if (mode === undefined || typeof o.deadLetter !== "string" && o.deadLetter !== undefined) {
      throw new InvalidArgumentError("opts.deadLetter", `want "default", "discard", "global" or "queue", got ${describe(o.deadLetter)}`);
    }
    checkString("opts.deadLetterTarget", o.deadLetterTarget);
    checkInt("opts.maxRetries", o.maxRetries, -1, 2 ** 31 - 1);
    checkInt("opts.defaultTtlMs", o.defaultTtlMs, 0, Number.MAX_SAFE_INTEGER);
    checkInt("opts.leaseMs", o.leaseMs, 0, Number.MAX_SAFE_INTEGER);
    const r = await this.request("declareQueue", operationOptions(o, "opts"), Op.DECLARE_QUEUE, {
      topic,
      group: o.group ?? "",
      partitions: o.partitions ?? 0,
      dead_letter_mode: mode,
      dead_letter_target: o.deadLetterTarget ?? "",
      max_retries: o.maxRetries ?? -1,
      default_ttl_ms: BigInt(o.defaultTtlMs ?? 0),
      lease_ms: BigInt(o.leaseMs ?? 0),
    });
    return { partitions: r.partitions, created: r.created };
  }

  /** Deletes a queue with all its messages; its subscriptions end with reason "queue_deleted". */
  async deleteQueue(topic: string, group = "", opts: OperationOptions = {}): Promise<void> {
    await this.request("deleteQueue", operationOptions(opts, "opts"), Op.DELETE_QUEUE, { topic, group });
  }

  /** Discards a queue's ready and delayed messages; resolves with how many
   * (UnsafeIntegerError above Number.MAX_SAFE_INTEGER). */
  async purgeQueue(topic: string, group = "", opts: OperationOptions = {}): Promise<number> {
    return safeNumber("purged", (await this.request("purgeQueue", operationOptions(opts, "opts"), Op.PURGE_QUEUE, { topic, group })).purged);
  }

  /** A request that is not sent again after a cut (ConnectionLostError).
   * The body is encoded, and so checked, before anything else happens. */
  private async request(what: string, o: OperationOptions, op: number, body: Body): Promise<Body> {
    encodeFrame(op, 0n, body);
    const state = { sent: false };
    return abortable(what, o, state, async (signal) => {
      const c = await this.ready();
      if (signal?.aborted) throw signal.reason; // given up while waiting for a connection: not sent
      state.sent = true;
      return (await c.call(op, body)).body;
    });
  }

  // ----- subscriptions -----

  /** Attaches a consumer to a queue. Resolves once the broker accepted it. */
  async subscribe(topic: string, opts: SubscribeOptions = {}): Promise<Subscription> {
    const o = options(opts, "opts");
    checkString("topic", topic);
    checkString("opts.group", o.group);
    checkInt("opts.partition", o.partition, -1, 2 ** 31 - 1);
    checkInt("opts.prefetch", o.prefetch, 0, 0xffffffff);
    if (o.autoAck !== undefined && typeof o.autoAck !== "boolean") throw new InvalidArgumentError("opts.autoAck", `want a boolean, got ${describe(o.autoAck)}`);
    checkCohortName("opts.cohort", o.cohort);
    checkCohortName("opts.memberId", o.memberId);
    if (o.memberId !== undefined && o.cohort === undefined) throw new InvalidArgumentError("opts.memberId", "a member id needs a cohort (opts.cohort)");
    if (o.cohort !== undefined) {
      // A broker session uses one member id: refuse a second one here
      // rather than have the broker refuse it (bad_request).
      const member = o.memberId ?? this.memberId;
      for (const s of this.subs) {
        if (s.memberId && s.memberId !== member) {
          throw new InvalidArgumentError("opts.memberId", `this client's cohort subscriptions are member ${JSON.stringify(s.memberId)}; a session uses one member id`);
        }
      }
    }
    const oo = operationOptions(o, "opts");
    const err = this.stateError();
    if (err) throw err;
    const state = { sent: false };
    // Given up: a subscription the broker still accepts is ended at once.
    return abortable("subscribe", oo, state, (signal) => this.subscribeAny(topic, o, state, signal), (p) =>
      p.then(
        (s) => s.unsubscribe().catch(() => {}),
        () => {},
      ),
    );
  }

  /** In a cluster a spanning subscription (see Span), else one on this connection. */
  private async subscribeAny(topic: string, o: SubscribeOptions, state: { sent: boolean }, signal: AbortSignal | undefined): Promise<Subscription> {
    const c = await this.ready();
    if (signal?.aborted) throw signal.reason;
    if (c.hello?.cluster) {
      const s = await Span.subscribe(this, topic, o, state, signal);
      if (s) return s;
    }
    return this.subscribeNew(topic, o, state, signal);
  }

  /** @internal Subscribes on this client's node; with a parent, as one part of
   * a spanning subscription, delivering into the parent. */
  async subscribeNew(
    topic: string,
    o: SubscribeOptions,
    state: { sent: boolean },
    signal: AbortSignal | undefined,
    parent: Subscription | null = null,
  ): Promise<Subscription> {
    const s = new Subscription(this, topic, o);
    s.parent = parent;
    this.subs.add(s);
    for (;;) {
      let c: Conn;
      try {
        c = await this.ready();
      } catch (e) {
        this.subs.delete(s);
        throw e;
      }
      if (signal?.aborted) {
        this.subs.delete(s);
        throw signal.reason; // given up while waiting for a connection: not sent
      }
      try {
        state.sent = true;
        await this.subscribeOn(c, s);
        return s;
      } catch (e) {
        if (e instanceof ConnectionLostError) {
          if (s.serverId !== null) return s; // a reconnect restored it meanwhile
          continue;
        }
        this.subs.delete(s);
        throw e;
      }
    }
  }

  private async subscribeOn(c: Conn, s: Subscription): Promise<void> {
    // Registered in the hook: the broker's first deliveries may follow
    // SUBSCRIBE_OK in the same chunk.
    const hook = (op: number, b: Body) => {
      if (op !== Op.SUBSCRIBE_OK) return;
      s.serverId = b.sub_id;
      s.prefetch = b.prefetch;
      s.partitions = b.partitions;
      s.recreating = false;
      c.subs.set(b.sub_id, s);
    };
    const body = {
      topic: s.topic,
      group: s.group,
      partition: s.partition,
      ack_mode: s.autoAck ? 1 : 0,
      prefetch: s.prefetchAsked,
      cohort: s.cohort,
      member: s.memberId,
    };
    const r = await c.call(Op.SUBSCRIBE, body, undefined, hook);
    if (r.op !== Op.SUBSCRIBE_OK) throw new ProtocolError(`${opName(r.op)} in answer to SUBSCRIBE`);
  }

  /** @internal */
  async unsubscribe(s: Subscription): Promise<void> {
    if (s.span) return s.span.unsubscribe();
    this.subs.delete(s);
    const c = this.usable() ?? (this.conn && !this.conn.closed ? this.conn : null);
    const id = s.serverId;
    s.end("unsubscribed", null);
    if (!c || id === null) return; // reconciliation drops it on the next connection
    // Settles made before this call go out first: the broker takes back
    // only what is still unsettled.
    c.flushSettles();
    try {
      await c.call(Op.UNSUBSCRIBE, { sub_id: id });
    } catch (e) {
      if (!(e instanceof ConnectionLostError)) throw e;
    } finally {
      c.subs.delete(id);
    }
  }

  /** @internal The broker ended a subscription. */
  subClosed(c: Conn, b: Body): void {
    const s = c.subs.get(b.sub_id);
    c.subs.delete(b.sub_id);
    if (!s) return;
    s.serverId = null;
    switch (b.reason) {
      case 5: // broker stopping: restored on the next connection
        return;
      case 1:
        s.end("unsubscribed", null);
        return;
      case 2:
        s.end("reconciled_closed", new SinewError(b.message, false));
        return;
      case 3:
        s.end("queue_deleted", new BrokerError(Code.NOT_FOUND, `queue deleted: ${b.message}`));
        return;
      default:
        s.end("broker_error", brokerError(b.code || Code.INTERNAL, b.message));
    }
  }

  // ----- settling -----

  /** @internal Settles (ACK, NACK, FAIL) and extends (EXTEND) a message. A
   * settle returns once queued unless opts.confirmed; an extend always waits
   * for the broker's answer. */
  settle(msg: Message, op: number, delayMs: number, opts: SettleOptions | undefined): Promise<void> {
    if (!Number.isSafeInteger(delayMs) || delayMs < 0) {
      return Promise.reject(new InvalidArgumentError("ms", `want a number of milliseconds from 0 to ${Number.MAX_SAFE_INTEGER}, got ${describe(delayMs)}`));
    }
    let o: Partial<SettleOptions>;
    let oo: OperationOptions;
    try {
      o = options(opts, "opts");
      if (o.confirmed !== undefined && typeof o.confirmed !== "boolean") throw new InvalidArgumentError("opts.confirmed", `want a boolean, got ${describe(o.confirmed)}`);
      oo = operationOptions(o, "opts");
    } catch (e) {
      return Promise.reject(e);
    }
    const extend = op === Op.EXTEND;
    if (extend && delayMs < 1) return Promise.reject(new InvalidArgumentError("ms", `want at least 1 ms, got ${describe(delayMs)}`));
    if (extend && msg.sub.autoAck) return Promise.reject(new InvalidArgumentError("msg", "an auto-ack message holds no lease to extend"));
    if (msg.settledBy) return Promise.reject(new AlreadySettledError());
    if (this.closed) return Promise.reject(new ClientClosedError());
    if (!extend) msg.settledBy = op;
    if (msg.sub.autoAck) return Promise.resolve();
    const span = msg.sub.parent?.span;
    if (span && !extend) return span.settle(this, msg, op, delayMs, o.confirmed === true, oo);
    if (span) return span.extend(this, msg, delayMs, oo);
    if (msg.stale || msg.epoch !== this.epoch) {
      if (!extend) msg.sub.release(msg);
      return Promise.reject(new StaleDeliveryError());
    }
    const confirmed = extend || o.confirmed === true;
    let r: SettleReq;
    let done: Promise<void> | null = null;
    if (confirmed) {
      const d = deferred<void>();
      r = { op, msg, delayMs, resolve: d.resolve, reject: d.reject };
      done = d.promise;
    } else {
      r = { op, msg, delayMs, resolve: () => {}, reject: (e) => this.settleError(e, msg) };
    }
    const c = this.conn && !this.conn.closed ? this.conn : null; // a draining connection still takes settles
    if (c) c.settle(r);
    else this.held.push(r);
    if (!done) return Promise.resolve();
    const p = done;
    return abortable(extend ? "extend" : "settle", oo, { sent: true }, () => p);
  }

  /** @internal Queues settle r on the connection, or holds it for the next one. */
  sendSettle(r: SettleReq): void {
    const c = this.conn && !this.conn.closed ? this.conn : null; // a draining connection still takes settles
    if (c) c.settle(r);
    else this.held.push(r);
  }

  /** @internal The session epoch (it changes when a session is not resumed). */
  sessionEpoch(): number {
    return this.epoch;
  }

  /** @internal The connection, if one is up. */
  liveConn(): Conn | null {
    return this.conn && !this.conn.closed ? this.conn : null;
  }

  /** @internal Whether this client can no longer be used. */
  dead(): boolean {
    return this.closed || this.closing || this.fatal !== null || this.gaveUp !== null;
  }

  /** @internal METADATA on this client's connection, if it is up (not waited for). */
  async askMetadata(topic: string, group: string, timeoutMs: number): Promise<Body> {
    const c = this.usable();
    if (!c) throw new ConnectionLostError(`${this.addr}: not connected`);
    return abortable("metadata", { timeoutMs }, { sent: true }, async () => (await c.call(Op.METADATA, { topic, group })).body);
  }

  /** Clients on the other cluster nodes a spanning subscription holds parts on, by address. */
  private nodeClients = new Map<string, Client>();
  private nodeOpening = new Map<string, Promise<Client>>();
  /** @internal A client a spanning subscription opened on one node: it
   * stays on that node (a redirect is not followed; another part serves). */
  pinned = false;
  /** @internal Spanning subscriptions alive. */
  readonly spans = new Set<Span>();

  /** @internal The client (its own connection and session) on the node at addr. */
  nodeClient(addr: string): Promise<Client> {
    // The node this client dialled gets its own client too: this one's
    // connection moves to follow publishes.
    if (this.closed || this.closing) return Promise.reject(new ClientClosedError());
    const have = this.nodeClients.get(addr);
    if (have && !have.dead()) return Promise.resolve(have);
    const opening = this.nodeOpening.get(addr);
    if (opening) return opening;
    if (have) {
      this.nodeClients.delete(addr);
      void have.close().catch(() => {});
    }
    if (this.nodeClients.size >= SPAN_PARTS_MAX) return Promise.reject(new InvalidArgumentError("addr", `more than ${SPAN_PARTS_MAX} cluster nodes`));
    const nc = new Client(addr, {
      ...this.o,
      signal: undefined,
      memberId: this.memberId,
      connectTimeoutMs: Math.min(this.o.connectTimeoutMs ?? 30_000, PART_OPEN_MS),
    });
    nc.pinned = true;
    const p = nc.open().then(
      () => {
        this.nodeOpening.delete(addr);
        if (this.closed || this.closing) {
          void nc.close().catch(() => {});
          throw new ClientClosedError();
        }
        this.nodeClients.set(addr, nc);
        return nc;
      },
      (e) => {
        this.nodeOpening.delete(addr);
        throw e;
      },
    );
    this.nodeOpening.set(addr, p);
    return p;
  }

  /** @internal The clients on the cluster's nodes that are up, this one first. */
  nodeClientsUp(): Client[] {
    return [this, ...[...this.nodeClients.values()].filter((c) => !c.dead())];
  }

  /** @internal A fast settle failed: tell the application. */
  settleError(err: unknown, msg: Message): void {
    const h = this.o.onSettleError;
    if (h) {
      try {
        h(msg, err);
      } catch {
        // The handler's own failure is not the client's to report.
      }
      return;
    }
    this.log("settle_failed", { addr: this.addr, topic: msg.topic, partition: msg.partition, err: String((err as Error)?.message ?? err) });
  }

  private routeSettle(r: SettleReq, c: Conn): void {
    if (r.msg.epoch !== this.epoch) {
      r.msg.sub.release(r.msg);
      r.reject(new StaleDeliveryError("session not resumed: the broker will deliver the message again"));
      return;
    }
    c.settle(r);
  }

  /** @internal Settles cut off from their connection wait for the resumed session. */
  holdSettles(rs: SettleReq[]): void {
    const err = this.closed ? new ClientClosedError() : this.fatal ?? this.gaveUp;
    for (const r of rs) {
      if (err) r.reject(err);
      else this.held.push(r);
    }
  }

  /** @internal */
  settled(r: SettleReq, code: number): void {
    // An extend leaves the message held, unless its lease is gone.
    if (r.op !== Op.EXTEND || code !== Code.OK) r.msg.sub.release(r.msg);
    if (code === Code.OK) r.resolve();
    else if (code === Code.STALE_LEASE) r.reject(new StaleDeliveryError("the broker judged the lease stale"));
    else r.reject(brokerError(code, r.op === Op.EXTEND ? "extend refused" : "settle refused"));
  }

  /** @internal */
  settleFailed(r: SettleReq, err: unknown): void {
    if (r.op !== Op.EXTEND) r.msg.sub.release(r.msg);
    r.reject(err);
  }

  // ----- connection status -----

  private statusSinks = new Set<EventSink<StatusEvent>>();

  /** @internal Tells onStatus and every status() iterator. */
  emitStatus(ev: StatusEvent): void {
    const h = this.o.onStatus;
    if (h) {
      try {
        h(ev);
      } catch {
        // A failing callback must not break the connection's state changes.
      }
    }
    for (const sink of this.statusSinks) sink.push(ev);
  }

  /**
   * The connection's status changes as an async iterator: "disconnected"
   * (`error`: why the connection broke, or the DisconnectedError of giving
   * up after reconnect.maxAttempts), "reconnecting" (each attempt, from 1,
   * with its backoff delay), "reconnected" (`resumed` says whether the
   * broker session survived), "going_away" (a planned broker stop) and
   * "closed" (`error` set when a fatal error closed the client), after which
   * the iterator ends. Each iterator buffers at most `bufferSize` events
   * (default 64): when the reader falls behind the oldest are dropped and
   * the next event carries `dropped`, how many.
   * Leaving the loop (break, return, a throw) unregisters the iterator.
   */
  status(opts: { bufferSize?: number } = {}): AsyncIterableIterator<StatusEvent> {
    const o = options(opts, "opts");
    checkInt("opts.bufferSize", o.bufferSize, 1, 1 << 20);
    const sink = new EventSink<StatusEvent>(o.bufferSize ?? STATUS_BUFFER_DEFAULT, () => this.statusSinks.delete(sink));
    if (this.closed) sink.push({ type: "closed", error: this.fatal ?? new ClientClosedError() });
    else this.statusSinks.add(sink);
    return sink;
  }

  // ----- connection lifecycle -----

  /** @internal */
  goingAway(c: Conn, b: Body): void {
    if (c.draining) return;
    c.draining = true;
    c.awayDeadline = Number(b.deadline_ms);
    this.log("going_away", { addr: this.addr, reason: b.reason, redirect: b.redirect });
    if (!this.pinned && typeof b.redirect === "string" && b.redirect !== "" && b.redirect.length <= 512) {
      // A cluster node names one that stays up: the next connection goes
      // there, not back to this node.
      this.clustered = true;
      this.learn(b.redirect);
      this.target = b.redirect;
    }
    this.emitStatus({ type: "going_away", reason: b.reason, deadlineMs: Number(b.deadline_ms) });
    const wait = Math.max(0, Math.min(c.awayDeadline - this.now(), GOING_AWAY_WAIT_MAX_MS));
    const deadline = setTimeout(() => c.close(new BrokerError(Code.SHUTTING_DOWN, "broker going away")), wait);
    const poll = setInterval(() => {
      if (c.closed) {
        clearInterval(poll);
        clearTimeout(deadline);
        return;
      }
      if (c.pending.size === 0 && c.settlesQueued() === 0 && this.unsettled(c.epoch) === 0) {
        clearInterval(poll);
        clearTimeout(deadline);
        c.close(new BrokerError(Code.SHUTTING_DOWN, "broker going away"));
      }
    }, GOING_AWAY_POLL_MS);
  }

  private unsettled(epoch: number): number {
    let n = 0;
    for (const s of this.subs) n += s.heldCount(epoch);
    return n;
  }

  /** @internal A connection ended. */
  connClosed(c: Conn, err: unknown): void {
    for (const s of [...c.pausedBy]) s.unpauseConn(c);
    if (this.conn !== c) return;
    this.conn = null;
    if (this.closed || this.closing) return;
    if (!isRetryable(err)) {
      this.failFatal(err);
      return;
    }
    this.log("connection_lost", { addr: this.addr, err: String((err as Error)?.message ?? err) });
    this.emitStatus({ type: "disconnected", error: err });
    void this.reconnect(c.draining);
  }

  private connectedAt = 0;
  private failures = 0;

  /** Reconnects with backoff until it succeeds, a fatal error, close, or maxAttempts. */
  private async reconnect(planned: boolean): Promise<void> {
    if (this.reconnecting) return;
    this.reconnecting = true;
    try {
      // The attempt count starts again only after a connection that stayed healthy.
      if (this.now() - this.connectedAt >= this.policy.resetAfterMs) this.failures = 0;
      let immediate = planned;
      for (;;) {
        let d = 0;
        if (!immediate) {
          d = backoffDelay(this.policy, this.failures, this.random());
          if (planned) d = Math.min(d, GOING_AWAY_BACKOFF_MAX_MS);
        }
        this.emitStatus({ type: "reconnecting", attempt: this.failures + 1, delayMs: d });
        if (!immediate) {
          try {
            await this.sleep(d, this.stop.signal);
          } catch {
            return;
          }
        }
        immediate = false;
        if (this.closed) return;
        try {
          const epoch = this.epoch;
          await this.attempt(this.stop.signal);
          this.log("reconnected", { addr: this.addr });
          this.emitStatus({ type: "reconnected", resumed: this.epoch === epoch });
          return;
        } catch (err) {
          if (this.closed) return;
          if (!isRetryable(err)) {
            this.failFatal(err);
            return;
          }
          this.failures++;
          this.log("reconnect_failed", { addr: this.addr, attempt: this.failures, err: String((err as Error)?.message ?? err) });
          this.rotateTarget();
          if (this.policy.maxAttempts > 0 && this.failures >= this.policy.maxAttempts) {
            this.giveUp(new DisconnectedError(`${this.addr}: ${this.failures} attempts failed`, err));
            return;
          }
        }
      }
    } finally {
      this.reconnecting = false;
    }
  }

  /** In a cluster, after two failed attempts in a row at the node it dials,
   * the next attempt goes to the next node it knows: a node that died is
   * not redialled for ever while the others serve (its session is lost
   * with it; a node that only dropped the socket is back at the first
   * redial, and its session resumes). */
  private rotateTarget(): void {
    if (this.clustered !== true || this.learned.length === 0 || this.failures % 2 !== 0) return;
    const all = [this.addr, ...this.learned];
    const next = all[(all.indexOf(this.target) + 1) % all.length]!;
    this.log("moving", { from: this.target, to: next, reason: "unreachable" });
    this.target = next;
  }

  /** After giving up, an operation asks for a fresh round of attempts. */
  private kick(): void {
    if (this.reconnecting || this.closed || this.fatal) return;
    this.gaveUp = null;
    this.failures = 0;
    void this.reconnect(false);
  }

  private giveUp(err: DisconnectedError): void {
    this.log("gave_up", { addr: this.addr, err: err.message });
    this.emitStatus({ type: "disconnected", error: err });
    this.gaveUp = err;
    this.failAll(err, "disconnected");
  }

  private failFatal(err: unknown): void {
    this.log("fatal", { addr: this.addr, err: String((err as Error)?.message ?? err) });
    this.fatal = err;
    this.failAll(err, "fatal");
    for (const sp of [...this.spans]) sp.stop("fatal", err);
    for (const nc of this.nodeClients.values()) void nc.close().catch(() => {});
    this.endStatus(err);
  }

  /** The last status event: every iterator ends after it. */
  private endStatus(err: unknown): void {
    if (this.statusEnded) return;
    this.statusEnded = true;
    this.emitStatus({ type: "closed", error: err });
    for (const sink of this.statusSinks) sink.end();
    this.statusSinks.clear();
  }
  private statusEnded = false;

  private failAll(err: unknown, reason: SubscriptionEndReason): void {
    const w = this.connWaiters;
    this.connWaiters = [];
    for (const x of w) x.reject(err);
    const replay = this.replay;
    this.replay = [];
    for (const p of replay) {
      this.inflight.delete(p);
      this.windowRelease(p.bytes);
      p.reject(err);
    }
    const held = this.held;
    this.held = [];
    for (const r of held) r.reject(err);
    for (const s of [...this.subs]) s.end(reason, err);
    if (reason !== "disconnected") this.subs.clear();
  }

  private shutdownNow(err: unknown): void {
    this.closed = true;
    this.stop.abort();
    for (const sp of [...this.spans]) sp.stop(err instanceof ClientClosedError ? "client_closed" : "fatal", err);
    for (const nc of this.nodeClients.values()) void nc.close().catch(() => {});
    this.conn?.close(err);
    this.failAll(err, err instanceof ClientClosedError ? "client_closed" : "fatal");
    this.endStatus(err instanceof ClientClosedError ? null : err);
  }

  /**
   * Closes the client: waits (up to drainTimeoutMs) for unconfirmed publishes
   * and settles in flight, ends the broker session with END_SESSION so its
   * unsettled messages go to other consumers at once, and ends every
   * subscription with reason "client_closed".
   */
  async close(): Promise<void> {
    if (this.closing || this.closed) return;
    this.closing = true;
    // Spanning subscriptions stop looking for nodes; the clients on the
    // other nodes close (settles out first, then END_SESSION) alongside.
    for (const sp of [...this.spans]) sp.stop("client_closed", new ClientClosedError());
    const others = Promise.all([...this.nodeClients.values()].map((c) => c.close().catch(() => {})));
    const limit = this.now() + (this.o.drainTimeoutMs ?? 5000);
    // Queued settles go out now, and are waited for like publishes.
    this.conn?.flushSettles();
    while (
      (this.inflight.size > 0 || this.held.length > 0 || (this.conn?.pending.size ?? 0) > 0 || (this.conn?.settlesQueued() ?? 0) > 0) &&
      this.now() < limit
    ) {
      if (!this.conn || this.conn.closed) break;
      await new Promise((r) => setTimeout(r, 5));
    }
    this.conn?.flushSettles();
    const c = this.conn;
    if (c && !c.closed) {
      const t = setTimeout(() => c.close(new ClientClosedError()), Math.max(0, limit - this.now()) + 1000);
      try {
        await c.call(Op.END_SESSION, {});
        await c.done.promise;
      } catch {
        // The session ends at the broker when its grace runs out instead.
      } finally {
        clearTimeout(t);
      }
    }
    await others;
    this.nodeClients.clear();
    this.shutdownNow(new ClientClosedError());
  }
}

/**
 * A consumer attached to one queue. Iterate it with `for await`; the loop
 * ends when the subscription ends: normally after unsubscribe() or close(),
 * by throwing a SubscriptionEndedError for every other reason.
 * It survives reconnects: the client restores it on the next connection.
 */
export class Subscription implements AsyncIterable<Message> {
  readonly topic: string;
  readonly group: string;
  readonly partition: number;
  readonly autoAck: boolean;
  readonly prefetchAsked: number;
  /** The prefetch in force, after the broker's default and clamp. */
  prefetch = 0;
  /** The partitions the broker assigned. */
  partitions: number[] = [];
  /** The cohort this subscription is a member of; "" for a plain consumer. */
  readonly cohort: string;
  /** The member id it joined the cohort with; "" for a plain consumer. */
  readonly memberId: string;
  /** Assignment events dropped because the buffer (256) was full, in all. */
  assignmentsDropped = 0;
  /** @internal */ serverId: bigint | null = null;
  /** @internal */ recreating = false;
  /** @internal In a cluster: the spanning subscription this part delivers into. */ parent: Subscription | null = null;
  /** @internal In a cluster: the parts of this spanning subscription. */ span: Span | null = null;
  /** Set once the subscription ended: why. */
  endReason: SubscriptionEndedError | null = null;
  private buf: Message[] = [];
  private waiter: { resolve(r: IteratorResult<Message>): void; reject(e: unknown): void } | null = null;
  private held = new Map<bigint, Message>();
  private pausedConns = new Set<Conn>();
  private assigned: EventSink<AssignmentEvent> = new EventSink(ASSIGNMENT_BUFFER_MAX, () => {}, "an assignments iterator");

  /** @internal */
  constructor(
    private readonly client: Client,
    topic: string,
    o: SubscribeOptions,
  ) {
    this.topic = topic;
    this.group = o.group ?? "";
    this.partition = o.partition ?? -1;
    this.autoAck = o.autoAck ?? false;
    this.prefetchAsked = o.prefetch ?? 0;
    this.cohort = o.cohort ?? "";
    this.memberId = o.cohort === undefined ? "" : (o.memberId ?? client.memberId);
    this.assigned.onDrop = () => this.assignmentsDropped++;
  }

  /**
   * The partitions assigned to and revoked from this cohort subscription, in
   * the order the broker sent them, as an async iterator of AssignmentEvent.
   * Events are kept from the moment the broker accepted the subscription, so
   * the first iterator also sees those that came before it was made. The
   * buffer holds 256 unread events; beyond that the oldest are dropped,
   * counted in `assignmentsDropped` and in `dropped` of the next event read.
   * One reader at a time. Leaving the loop stops reading (the subscription
   * goes on; a later call reads on from there); the iterator ends when the
   * subscription ends. A plain subscription (no cohort) gets no events.
   */
  assignments(): AsyncIterableIterator<AssignmentEvent> {
    const sink = this.assigned;
    return {
      next: () => sink.next(),
      return: () => {
        sink.detach();
        return Promise.resolve({ value: undefined, done: true });
      },
      [Symbol.asyncIterator]() {
        return this;
      },
    };
  }

  /** @internal An ASSIGNMENT for this subscription. */
  assignment(b: Body): void {
    if (this.ended) return;
    if (this.parent) {
      this.parent.assignment(b);
      return;
    }
    const epoch = b.epoch as bigint;
    const ev: { partition: number; epoch: number; state: "assigned" | "revoked" } = {
      partition: b.partition,
      epoch: 0,
      state: b.state === ASSIGNMENT_ASSIGNED ? "assigned" : "revoked",
    };
    if (epoch <= BigInt(Number.MAX_SAFE_INTEGER)) ev.epoch = Number(epoch);
    else Object.defineProperty(ev, "epoch", { enumerable: true, get: () => safeNumber("epoch", epoch) });
    this.assigned.push(ev);
  }

  /** Whether the subscription has ended. */
  get ended(): boolean {
    return this.endReason !== null;
  }

  /** @internal */
  view(): Body {
    return {
      sub_id: this.serverId,
      topic: this.topic,
      group: this.group,
      partition: this.partition,
      ack_mode: this.autoAck ? 1 : 0,
      prefetch: this.prefetchAsked,
    };
  }

  /** @internal A DELIVER for this subscription. */
  deliver(c: Conn, d: Body): void {
    if (this.ended) return;
    if (!this.autoAck && this.held.has(d.tag)) return; // a re-send of a delivery already held
    const m = new Message(this, c.epoch, d);
    if (!this.autoAck) this.held.set(d.tag, m);
    if (this.parent) {
      this.parent.span?.noteOwner(m.partition, this.client.addr, d.epoch as bigint);
      this.parent.enqueue(c, m);
      return;
    }
    this.enqueue(c, m);
  }

  /** @internal The address of the node this subscription is held on. */
  nodeAddr(): string {
    return this.client.addr;
  }

  /** @internal The live connection this subscription is held on, if any. */
  liveConn(): Conn | null {
    return this.client.liveConn();
  }

  /** @internal Hands m to the application, or buffers it. */
  enqueue(c: Conn, m: Message): void {
    if (this.ended) return;
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = null;
      w.resolve({ value: m, done: false });
      return;
    }
    this.buf.push(m);
    if (this.buf.length >= DELIVERY_BUFFER_MAX && !this.pausedConns.has(c)) {
      // Push back on the broker through TCP until the application catches up
      // (in a cluster, on every node's connection that delivers meanwhile).
      this.pausedConns.add(c);
      c.pausedBy.add(this);
      c.sock.pause();
    }
  }

  /** @internal */
  unpause(): void {
    const cs = [...this.pausedConns];
    this.pausedConns.clear();
    for (const c of cs) {
      c.pausedBy.delete(this);
      if (c.pausedBy.size === 0 && !c.closed) c.sock.resume();
    }
  }

  /** @internal Unpauses c only (its connection ended). */
  unpauseConn(c: Conn): void {
    if (!this.pausedConns.delete(c)) return;
    c.pausedBy.delete(this);
  }

  /** @internal */
  heldCount(epoch: number): number {
    let n = 0;
    for (const m of this.held.values()) if (m.epoch === epoch && !m.settledBy) n++;
    return n;
  }

  /** @internal */
  release(m: Message): void {
    if (this.held.get(m.tag) === m) this.held.delete(m.tag);
  }

  /** @internal Unsettled deliveries of the epoch, for INFLIGHT. */
  inflightEntries(epoch: number): Body[] {
    const out: Body[] = [];
    for (const m of this.held.values()) if (m.epoch === epoch) out.push({ tag: m.tag, lease: m.lease });
    return out;
  }

  /** @internal The broker no longer holds these for the session. */
  markStale(epoch: number, stale: Set<bigint>): void {
    for (const m of this.held.values()) {
      if (m.epoch === epoch && stale.has(m.tag)) {
        m.stale = true;
        this.held.delete(m.tag);
      }
    }
    this.buf = this.buf.filter((m) => !m.stale);
  }

  /** @internal A fresh session: the old deliveries are gone, subscribe again. */
  resetForFreshSession(): void {
    this.serverId = null;
    this.held.clear();
    this.buf = []; // not yet seen by the application: the broker delivers them again
    this.unpause();
  }

  /** @internal */
  end(reason: SubscriptionEndReason, cause: unknown): void {
    if (this.endReason) return;
    const msg = (cause as Error | null)?.message ?? reason;
    this.endReason = subscriptionEnded(reason, msg, cause ?? undefined);
    this.client.subs.delete(this);
    this.assigned.end();
    if (reason === "unsubscribed") {
      // The broker takes these back; handing them out would only lead to
      // settles that fail.
      for (const m of this.buf) this.held.delete(m.tag);
      this.buf = [];
    }
    this.unpause();
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = null;
      if (reason === "unsubscribed" || reason === "client_closed") w.resolve({ value: undefined, done: true });
      else w.reject(this.endReason);
    }
  }

  /** The next message; done once the subscription ended. */
  next(): Promise<IteratorResult<Message>> {
    const m = this.buf.shift();
    if (m) {
      if (this.buf.length <= DELIVERY_BUFFER_MAX / 2) this.unpause();
      return Promise.resolve({ value: m, done: false });
    }
    if (this.endReason) {
      const r = this.endReason.reason;
      if (r === "unsubscribed" || r === "client_closed") return Promise.resolve({ value: undefined, done: true });
      return Promise.reject(this.endReason);
    }
    if (this.waiter) return Promise.reject(new Error("sinew: a subscription has one reader at a time"));
    return new Promise((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
  }

  /**
   * The subscription as an async iterator. Leaving a `for await` loop early
   * (`break`, `return`, or an exception in its body) calls the iterator's
   * `return()`, which ends the subscription like unsubscribe(): the broker
   * takes back at once, without using a retry, every message of it that was
   * not settled, including those prefetched and never handed out, so another
   * consumer gets them now rather than after the lease.
   */
  [Symbol.asyncIterator](): AsyncIterator<Message> {
    return {
      next: () => this.next(),
      return: async () => {
        try {
          await this.unsubscribe();
        } catch {
          // The subscription has ended here regardless; a failed UNSUBSCRIBE
          // (the client closed meanwhile, say) leaves the broker to end it
          // with the session.
        }
        return { value: undefined, done: true };
      },
    };
  }

  /** Ends the subscription. Settles already made go out first; the broker
   * then returns every message of the subscription that is still unsettled
   * to the queue at once, without using a retry. Messages buffered here and
   * not yet handed out are dropped (the broker has them back). */
  unsubscribe(): Promise<void> {
    if (this.ended) return Promise.resolve();
    return this.client.unsubscribe(this);
  }
}

/** One delivered message. Settle it once with complete, retry, retryAfter or fail. */
export class Message {
  readonly topic: string;
  readonly group: string;
  readonly partition: number;
  /** The message's offset in its partition. Reading it throws
   * UnsafeIntegerError in the (theoretical) case it exceeds
   * Number.MAX_SAFE_INTEGER. */
  readonly offset!: number;
  /** 1 on first delivery, +1 on each redelivery. */
  readonly attempt: number;
  readonly publishedAtMs: number;
  /** The lease the broker granted, in ms (0 if the broker did not say). */
  readonly leaseMs: number;
  /** @internal DELIVER's assignment field. */
  readonly assignmentEpoch: bigint;
  readonly key: Uint8Array;
  /** Headers as [key, value] pairs in the order published (a key may repeat),
   * then the broker's `sinew.*` headers. */
  readonly headers: ReadonlyArray<readonly [string, string]>;
  readonly contentType: string;
  readonly body: Uint8Array;
  /** @internal */ readonly tag: bigint;
  /** @internal */ readonly lease: Body;
  /** @internal */ readonly epoch: number;
  /** @internal */ settledBy = 0;
  /** @internal */ stale = false;

  /** @internal */
  constructor(
    readonly sub: Subscription,
    epoch: number,
    d: Body,
  ) {
    this.epoch = epoch;
    this.tag = d.tag;
    this.lease = { sub_id: d.sub_id, partition: d.partition, offset: d.offset, lease_id: d.lease_id, epoch: d.epoch };
    this.topic = d.topic;
    this.group = d.group;
    this.partition = d.partition;
    if (d.offset <= BigInt(Number.MAX_SAFE_INTEGER)) this.offset = Number(d.offset);
    else {
      const big = d.offset as bigint;
      Object.defineProperty(this, "offset", {
        enumerable: true,
        get: () => safeNumber("offset", big),
      });
    }
    this.attempt = d.attempt;
    this.publishedAtMs = Number(d.published_at_ms);
    this.leaseMs = d.lease_ms;
    this.assignmentEpoch = d.assignment;
    this.key = d.key;
    this.headers = (d.headers as Array<{ key: string; value: string }>).map((h) => [h.key, h.value] as const);
    this.contentType = d.content_type;
    this.body = d.body;
  }

  /** The partition's assignment epoch when this delivery was leased (0
   * while no cohort ever held the partition), read-only: compare it with the
   * `epoch` of Subscription.assignments() events. Reading it throws
   * UnsafeIntegerError above Number.MAX_SAFE_INTEGER. */
  get assignment(): number {
    return safeNumber("assignment", this.assignmentEpoch);
  }

  /** The body as UTF-8 text. */
  get text(): string {
    return utf8dec.decode(this.body);
  }

  /** The first value of header `name`, or undefined. */
  header(name: string): string | undefined {
    for (const [k, v] of this.headers) if (k === name) return v;
    return undefined;
  }

  /** The body parsed as JSON. */
  json<T = unknown>(): T {
    return JSON.parse(this.text) as T;
  }

  /** Done (ACK). Resolves once the settle is queued: it goes out batched
   * with the others of this turn, and is held and sent again across a
   * reconnect. With `{ confirmed: true }` it resolves once the broker made
   * it durable and rejects with the broker's typed error. */
  complete(opts?: SettleOptions): Promise<void> {
    return this.sub["client"].settle(this, Op.ACK, 0, opts);
  }

  /** Back to the queue for another attempt (NACK); counts against the
   * queue's max retries. Queued or confirmed as for complete(). */
  retry(opts?: SettleOptions): Promise<void> {
    return this.sub["client"].settle(this, Op.NACK, 0, opts);
  }

  /** Like retry, delivered again no earlier than ms milliseconds from now.
   * ms is a non-negative number (a fraction of a millisecond is dropped);
   * anything else rejects with InvalidArgumentError and settles nothing. */
  retryAfter(ms: number, opts?: SettleOptions): Promise<void> {
    return this.sub["client"].settle(this, Op.NACK, typeof ms === "number" && Number.isFinite(ms) && ms >= 0 ? Math.floor(ms) : ms, opts);
  }

  /** Terminal failure (FAIL): the broker dead-letters the message. Queued
   * or confirmed as for complete(). */
  fail(opts?: SettleOptions): Promise<void> {
    return this.sub["client"].settle(this, Op.FAIL, 0, opts);
  }

  /** Extends the message's lease: the broker keeps it from other consumers
   * until ms milliseconds from now (EXTEND). Resolves once the broker
   * agreed; rejects with StaleDeliveryError when the lease is already gone,
   * AlreadySettledError after a settle, and the broker's typed error
   * otherwise. Call it before the lease runs out (the queue's leaseMs). */
  extend(ms: number, opts?: OperationOptions): Promise<void> {
    return this.sub["client"].settle(this, Op.EXTEND, typeof ms === "number" && Number.isFinite(ms) && ms >= 0 ? Math.floor(ms) : ms, opts);
  }
}

// ----- argument checks -----
// Every public call checks (and encodes) its arguments before it changes any
// state, so a bad one throws InvalidArgumentError at the call and leaves
// nothing behind: no request registered, no window slot taken, no sequence
// number used.

/** An options argument: undefined or an object. */
function options<T extends object>(v: T | undefined, name: string): Partial<T> {
  if (v === undefined) return {};
  if (typeof v !== "object" || v === null || Array.isArray(v)) throw new InvalidArgumentError(name, `want an object, got ${describe(v)}`);
  return v;
}

function checkString(name: string, v: unknown): void {
  if (v !== undefined && typeof v !== "string") throw new InvalidArgumentError(name, `want a string, got ${describe(v)}`);
}

/** A cohort name or member id: unset, or 1 to 128 of A-Z a-z 0-9 . _ : - */
function checkCohortName(name: string, v: unknown): void {
  if (v === undefined) return;
  if (typeof v !== "string" || !COHORT_NAME.test(v)) {
    throw new InvalidArgumentError(name, `want 1 to 128 characters of A-Z a-z 0-9 . _ : -, got ${describe(v)}`);
  }
}

function checkInt(name: string, v: unknown, min: number, max: number): void {
  if (v === undefined) return;
  if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) {
    throw new InvalidArgumentError(name, `want an integer from ${min} to ${max}, got ${describe(v)}`);
  }
}

function checkDuration(name: string, v: unknown): void {
  if (v !== undefined && (typeof v !== "number" || !Number.isFinite(v) || v < 0)) {
    throw new InvalidArgumentError(name, `want a non-negative number of milliseconds, got ${describe(v)}`);
  }
}

/** Checks signal and timeoutMs of an options object. */
function operationOptions(o: Partial<OperationOptions>, name: string): OperationOptions {
  if (o.signal !== undefined && !(o.signal instanceof AbortSignal)) throw new InvalidArgumentError(`${name}.signal`, `want an AbortSignal, got ${describe(o.signal)}`);
  checkInt(`${name}.timeoutMs`, o.timeoutMs, 0, 2 ** 31 - 1);
  return { signal: o.signal, timeoutMs: o.timeoutMs };
}

/**
 * Runs an operation that o's signal or timeoutMs may give up. Giving up
 * rejects at once with AbortError (TimeoutError for the timeout), aborts the
 * signal handed to run (so that the operation can leave its queues) and
 * hands the operation's own promise to abandon. state.sent, read after that
 * abort, says whether the request may have reached the broker.
 */
function abortable<T>(
  what: string,
  o: OperationOptions,
  state: { sent: boolean },
  run: (signal: AbortSignal | undefined) => Promise<T>,
  abandon?: (p: Promise<T>) => void,
): Promise<T> {
  if (!o.signal && o.timeoutMs === undefined) return run(undefined);
  if (o.signal?.aborted) return Promise.reject(new AbortError(`${what}: aborted before it started`, false, o.signal.reason));
  const inner = new AbortController();
  return new Promise<T>((resolve, reject) => {
    let over = false;
    let timer: NodeJS.Timeout | undefined;
    const finish = () => {
      over = true;
      clearTimeout(timer);
      o.signal?.removeEventListener("abort", onAbort);
    };
    const giveUp = (make: (sent: boolean) => AbortError) => {
      if (over) return;
      finish();
      inner.abort(); // the operation leaves its queues first, and updates state.sent
      reject(make(state.sent));
      abandon?.(p);
    };
    const onAbort = () => giveUp((sent) => new AbortError(`${what}: aborted${sent ? " (it may still take effect)" : ""}`, sent, o.signal!.reason));
    o.signal?.addEventListener("abort", onAbort, { once: true });
    if (o.timeoutMs !== undefined) {
      const ms = o.timeoutMs;
      timer = setTimeout(() => giveUp((sent) => new TimeoutError(`${what}: no result within ${ms} ms${sent ? " (it may still take effect)" : ""}`, sent)), ms);
    }
    const p = run(inner.signal);
    p.then(
      (v) => {
        if (!over) {
          finish();
          resolve(v);
        }
      },
      (e) => {
        if (!over) {
          finish();
          reject(e);
        }
      },
    );
  });
}

/** Events for one reader, bounded: past `max` unread the oldest are
 * dropped, and the next event read carries `dropped`, how many. Used by
 * status() iterators and a subscription's assignments. */
class EventSink<T extends { dropped?: number }> implements AsyncIterableIterator<T> {
  private buf: T[] = [];
  private missed = 0;
  private ended = false;
  private waiter: ((r: IteratorResult<T>) => void) | null = null;
  /** Called for each event dropped. */
  onDrop: () => void = () => {};

  constructor(
    private readonly max: number,
    private readonly unregister: () => void,
    private readonly what = "a status iterator",
  ) {}

  push(ev: T): void {
    if (this.ended) return;
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = null;
      w({ value: this.withMissed(ev), done: false });
      return;
    }
    if (this.buf.length >= this.max) {
      this.buf.shift();
      this.missed++;
      this.onDrop();
    }
    this.buf.push(ev);
  }

  /** The reader left: a waiting next() ends, the events stay buffered. */
  detach(): void {
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = null;
      w({ value: undefined, done: true });
    }
  }

  private withMissed(ev: T): T {
    if (this.missed === 0) return ev;
    const out = { ...ev, dropped: this.missed };
    this.missed = 0;
    return out;
  }

  /** No more events: the iterator ends once its buffer is read. */
  end(): void {
    this.ended = true;
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = null;
      w({ value: undefined, done: true });
    }
  }

  next(): Promise<IteratorResult<T>> {
    const ev = this.buf.shift();
    if (ev) return Promise.resolve({ value: this.withMissed(ev), done: false });
    if (this.ended) return Promise.resolve({ value: undefined, done: true });
    if (this.waiter) return Promise.reject(new Error(`sinew: ${this.what} has one reader at a time`));
    return new Promise((resolve) => {
      this.waiter = resolve;
    });
  }

  return(): Promise<IteratorResult<T>> {
    this.unregister();
    this.buf = [];
    this.end();
    return Promise.resolve({ value: undefined, done: true });
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<T> {
    return this;
  }
}

/** Headers per message, as the protocol bounds them. */
const HEADERS_MAX = 256;

/** Checks a publish and encodes its fields before producer_seq. A keyless
 * publish whose partition the application left to the broker goes to the
 * queue's hinted partition, if hints holds one: unhinted keeps its fields
 * as the application gave them. queue is set for every keyless publish. */
function encodePublish(
  topic: string,
  body: Uint8Array | string,
  opts: PublishOptions,
  producerId: string,
  hints: PartitionHints,
): { head: Uint8Array; payload: Uint8Array; queue?: string; unhinted?: Body } {
  const o = options(opts, "opts");
  checkString("topic", topic);
  if (typeof body !== "string" && !(body instanceof Uint8Array)) throw new InvalidArgumentError("body", `want a Uint8Array or a string, got ${describe(body)}`);
  checkString("opts.group", o.group);
  checkInt("opts.partition", o.partition, -1, 2 ** 31 - 1);
  if (o.key !== undefined && typeof o.key !== "string" && !(o.key instanceof Uint8Array)) {
    throw new InvalidArgumentError("opts.key", `want a Uint8Array or a string, got ${describe(o.key)}`);
  }
  const headers: Array<{ key: string; value: string }> = [];
  if (o.headers !== undefined) {
    if (typeof o.headers !== "object" || o.headers === null) {
      throw new InvalidArgumentError("opts.headers", `want an object of strings or [key, value] pairs, got ${describe(o.headers)}`);
    }
    let entries: Array<readonly [unknown, unknown]>;
    if (typeof (o.headers as { [Symbol.iterator]?: unknown })[Symbol.iterator] === "function") {
      entries = [];
      for (const pair of o.headers as Iterable<unknown>) {
        if (!Array.isArray(pair) || pair.length !== 2) throw new InvalidArgumentError("opts.headers", `want [key, value] pairs, got ${describe(pair)}`);
        entries.push([pair[0], pair[1]]);
        if (entries.length > HEADERS_MAX) break;
      }
    } else {
      entries = Object.entries(o.headers);
    }
    for (const [key, value] of entries) {
      if (typeof key !== "string") throw new InvalidArgumentError("opts.headers", `want string keys, got ${describe(key)}`);
      if (typeof value !== "string") throw new InvalidArgumentError(`opts.headers[${JSON.stringify(key)}]`, `want a string, got ${describe(value)}`);
      if (key.startsWith("sinew.")) throw new InvalidArgumentError(`opts.headers[${JSON.stringify(key)}]`, `keys starting with "sinew." are reserved for the broker`);
      headers.push({ key, value });
    }
    if (entries.length > HEADERS_MAX) throw new InvalidArgumentError("opts.headers", `at most ${HEADERS_MAX} headers`);
  }
  checkString("opts.contentType", o.contentType);
  checkInt("opts.delayMs", o.delayMs, 0, Number.MAX_SAFE_INTEGER);
  checkInt("opts.ttlMs", o.ttlMs, 0, Number.MAX_SAFE_INTEGER);
  const fields: Body = {
    topic,
    group: o.group ?? "",
    partition: o.partition ?? -1,
    key: toBytes(o.key),
    headers,
    content_type: o.contentType ?? "",
    delay_ms: o.delayMs ?? 0,
    not_before_ms: 0,
    ttl_ms: o.ttlMs ?? 0,
    producer_id: producerId,
  };
  const payload = toBytes(body);
  if ((fields.key as Uint8Array).length > 0) return { head: encodePublishHead(fields), payload };
  // Keyless: the client numbers every publish with its own producer id, so
  // one the application left unplaced may take the queue's hint.
  const queue = queueKey(topic, fields.group as string);
  const hint = fields.partition === -1 ? hints.take(queue) : undefined;
  if (hint === undefined) return { head: encodePublishHead(fields), payload, queue };
  return { head: encodePublishHead({ ...fields, partition: hint }), payload, queue, unhinted: fields };
}

/** Checks connect's arguments, so that a bad one fails connect() at once
 * instead of every handshake. */
function checkConnectOptions(addr: string, opts: ConnectOptions): void {
  checkString("addr", addr);
  const o = options(opts, "opts");
  for (const k of ["clientName", "credentials", "user", "producerId"] as const) checkString(`opts.${k}`, o[k]);
  if (o.producerId !== undefined && utf8.encode(o.producerId).length > 255) {
    throw new InvalidArgumentError("opts.producerId", "at most 255 bytes");
  }
  checkCohortName("opts.memberId", o.memberId);
  if (o.reconcilePolicy !== undefined && o.reconcilePolicy !== "restore" && o.reconcilePolicy !== "conservative") {
    throw new InvalidArgumentError("opts.reconcilePolicy", `want "restore" or "conservative", got ${describe(o.reconcilePolicy)}`);
  }
  checkInt("opts.publishWindow", o.publishWindow, 0, 0xffffffff);
  if (o.reconnect !== undefined) {
    const r = options(o.reconnect, "opts.reconnect");
    for (const [k, v] of Object.entries(r)) {
      if (v !== undefined && (typeof v !== "number" || Number.isNaN(v))) throw new InvalidArgumentError(`opts.reconnect.${k}`, `want a number, got ${describe(v)}`);
    }
  }
  if (o.tls !== undefined && o.tls !== true && (typeof o.tls !== "object" || o.tls === null)) {
    throw new InvalidArgumentError("opts.tls", `want true or an object, got ${describe(o.tls)}`);
  }
  if (o.signal !== undefined && !(o.signal instanceof AbortSignal)) throw new InvalidArgumentError("opts.signal", `want an AbortSignal, got ${describe(o.signal)}`);
  for (const k of ["sleep", "random", "now", "log"] as const) {
    if (o[k] !== undefined && typeof o[k] !== "function") throw new InvalidArgumentError(`opts.${k}`, `want a function, got ${describe(o[k])}`);
  }
  for (const k of ["connectTimeoutMs", "dialTimeoutMs", "handshakeTimeoutMs", "drainTimeoutMs", "heartbeatMs"] as const) {
    checkDuration(`opts.${k}`, o[k]);
  }
}

function splitAddr(addr: string): [string, number] {
  const i = addr.lastIndexOf(":");
  if (i < 0) throw new SinewError(`address ${addr}: want host:port`, false);
  let host = addr.slice(0, i);
  if (host.startsWith("[") && host.endsWith("]")) host = host.slice(1, -1);
  const port = Number(addr.slice(i + 1));
  if (!Number.isInteger(port) || port <= 0 || port > 65535) throw new SinewError(`address ${addr}: bad port`, false);
  return [host || "127.0.0.1", port];
}

/**
 * Opens a TCP connection, and with t a TLS session over it; resolves once
 * the TLS handshake is done. TLS failures become a TLSError; plain network
 * errors keep their code so that isRetryable can judge them.
 */
function dial(host: string, port: number, timeoutMs: number, signal?: AbortSignal, t?: TLSOptions): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    let sock: net.Socket;
    if (t) {
      if (!t.cert !== !t.key) {
        reject(new TLSError(`connect ${host}:${port}: tls.cert and tls.key go together`));
        return;
      }
      const name = t.servername || host;
      const o: tls.ConnectionOptions = {
        host,
        port,
        minVersion: "TLSv1.2",
        // Checked against name rather than host, so that servername works for an IP address too.
        checkServerIdentity: (_h, cert) => tls.checkServerIdentity(name, cert),
      };
      if (net.isIP(name) === 0) o.servername = name; // SNI carries DNS names only
      if (t.ca !== undefined) o.ca = t.ca;
      if (t.cert !== undefined) o.cert = t.cert;
      if (t.key !== undefined) o.key = t.key;
      sock = tls.connect(o);
    } else {
      sock = net.connect({ host, port, noDelay: true });
    }
    const fail = (e: unknown) => {
      cleanup();
      sock.destroy();
      // A network error stays retryable: a broker restarting mid-handshake
      // is no reason to give up.
      reject(t && isTLSFailure(e) ? tlsError(`${host}:${port}`, e) : e);
    };
    const timer = setTimeout(() => fail(Object.assign(new Error(`connect ${host}:${port}: timed out`), { code: "ETIMEDOUT" })), timeoutMs);
    const onAbort = () => fail(signal!.reason);
    const onErr = (e: Error) => fail(e);
    const onClose = () => fail(Object.assign(new Error("the connection closed during the TLS handshake"), { code: "ECONNRESET" }));
    const cleanup = () => {
      clearTimeout(timer);
      sock.off("error", onErr);
      sock.off("close", onClose);
      signal?.removeEventListener("abort", onAbort);
    };
    sock.once("error", onErr);
    if (t) sock.once("close", onClose);
    signal?.addEventListener("abort", onAbort, { once: true });
    sock.once(t ? "secureConnect" : "connect", () => {
      cleanup();
      if (t) sock.setNoDelay(true);
      resolve(sock);
    });
  });
}

/** Whether err comes from TLS (OpenSSL or certificate verification), not
 * from the network. */
function isTLSFailure(err: unknown): boolean {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code !== "string") return false;
  return code.startsWith("ERR_SSL_") || code.startsWith("ERR_TLS_") || /CERT|SELF_SIGNED|UNABLE_TO_/.test(code);
}

/** The TLSError for a failed handshake with addr, naming the likely cause. */
function tlsError(addr: string, err: unknown): TLSError {
  const e = err as { code?: unknown; reason?: unknown; message?: unknown } | null;
  if (e?.code === "ERR_SSL_WRONG_VERSION_NUMBER" || e?.code === "ERR_SSL_PACKET_LENGTH_TOO_LONG") {
    return new TLSError(`connect ${addr}: the broker did not speak TLS (is it a plaintext port?)`, err);
  }
  // OpenSSL's own message carries its source file and line; its reason reads better.
  const why = typeof e?.reason === "string" ? e.reason : String(e?.message ?? err);
  return new TLSError(`connect ${addr}: TLS handshake failed: ${why} (${String(e?.code)})`, err);
}

/**
 * Connects to a broker at addr ("host:port"). Retryable failures (refused,
 * reset, timed out) are retried with the reconnect backoff until
 * opts.signal aborts, connectTimeoutMs passes or reconnect.maxAttempts
 * attempts failed; a rejected handshake (auth_failed, unsupported_version)
 * fails at once with a BrokerError.
 */
export async function connect(addr: string, opts: ConnectOptions = {}): Promise<Client> {
  const c = new Client(addr, opts);
  await c.open();
  return c;
}

// ----- spanning subscriptions (cluster) -----
//
// In a cluster each partition of a queue is served by its owner, one of the
// nodes holding a replica; the owner changes when a node fails. A spanning
// subscription holds one subscription (a part) on every node holding a
// replica of the queue, each on that node's own connection and session
// (with the client's resume and reconnect behaviour): only the owner
// delivers, and a replica that becomes the owner delivers to the part it
// already holds. The parts deliver into the one subscription the
// application iterates.
//
// A settle goes to the node that delivered the message. When that node is
// gone, does not answer within SETTLE_HEDGE_MS, or answers fenced or
// not_owner, the settle is sent again to the partition's current owner, by
// its lease reference (partition, offset, lease id, epoch) on the part held
// there, with tag 0: the new owner has the lease in its replicated state.
// The application sees one outcome.

/** How often a spanning subscription reads the queue's replica set again. */
const SPAN_REFRESH_MS = 2_000;
/** At most this many nodes (parts) per spanning subscription. */
const SPAN_PARTS_MAX = 64;
/** Sends of one settle after its node was lost, with backoff between them
 * (about 30 s in all, past the default lease). */
const RESETTLE_HOPS_MAX = 64;
const RESETTLE_BACKOFF_MIN_MS = 20;
const RESETTLE_BACKOFF_MAX_MS = 500;
/** A settle unanswered this long is also sent to the partition's owner. */
const SETTLE_HEDGE_MS = 1_000;
/** How long one node is given to answer METADATA before the next is asked. */
const METADATA_ASK_MS = 1_000;
/** Bounds connecting to a node and subscribing there. */
const PART_OPEN_MS = 5_000;

/** Whether a settle that failed with err may succeed at the partition's owner. */
function resettleable(err: unknown): boolean {
  if (err instanceof BrokerError) {
    return err.code === Code.FENCED || err.code === Code.NOT_OWNER || err.code === CODE_UNAVAILABLE || err.code === Code.SHUTTING_DOWN;
  }
  return (
    err instanceof ConnectionLostError ||
    err instanceof DisconnectedError ||
    err instanceof HeartbeatTimeoutError ||
    err instanceof StaleDeliveryError
  );
}

/** p, or a ConnectionLostError when it has not settled within ms. */
function hedged<T>(p: Promise<T>, ms: number, addr: string): Promise<T> {
  p.catch(() => {}); // a late answer is dropped
  let t: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    t = setTimeout(() => reject(new ConnectionLostError(`${addr} did not answer the settle within ${ms} ms`)), ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(t));
}

/** @internal The parts of a spanning subscription. */
class Span {
  private readonly parts = new Map<string, Subscription>();
  private readonly opening = new Map<string, Promise<Subscription | null>>();
  private readonly owners = new Map<number, { addr: string; epoch: bigint }>();
  private timer: NodeJS.Timeout | null = null;
  private looking: Promise<void> | null = null;
  private stopped = false;
  private readonly done = deferred<void>();

  private constructor(
    private readonly client: Client,
    private readonly s: Subscription,
    private readonly o: SubscribeOptions,
  ) {}

  /** Subscribes on every node holding a replica of topic; null when the
   * broker does not answer METADATA as a cluster node (the caller then
   * subscribes on its own node). */
  static async subscribe(
    client: Client,
    topic: string,
    o: SubscribeOptions,
    state: { sent: boolean },
    signal: AbortSignal | undefined,
  ): Promise<Subscription | null> {
    const group = o.group ?? "";
    let md: Body;
    try {
      md = await Span.metadata(client, topic, group);
    } catch (e) {
      if (e instanceof BrokerError && e.code === CODE_UNKNOWN_OP) return null;
      if (!(e instanceof BrokerError && e.code === Code.NOT_FOUND)) throw e;
      // A first SUBSCRIBE makes the queue, as on a single node; then its
      // replicas are known.
      const first = await client.subscribeNew(topic, o, state, signal);
      await first.unsubscribe().catch(() => {});
      md = await Span.metadata(client, topic, group);
    }
    if (!md.cluster) return null;
    if (signal?.aborted) throw signal.reason;
    const s = new Subscription(client, topic, o);
    const sp = new Span(client, s, o);
    s.span = sp;
    client.spans.add(sp);
    sp.learn(md);
    state.sent = true;
    const results = await Promise.allSettled(sp.replicas(md).map((addr) => sp.open(addr)));
    if (sp.parts.size === 0) {
      sp.stop("unsubscribed", null);
      const failed = results.find((r) => r.status === "rejected") as PromiseRejectedResult | undefined;
      throw failed?.reason ?? new DisconnectedError(`no node holding a replica of ${JSON.stringify(topic)} answered`);
    }
    sp.schedule();
    return s;
  }

  /** METADATA from the first node that answers, each given METADATA_ASK_MS. */
  private static async metadata(client: Client, topic: string, group: string): Promise<Body> {
    let last: unknown = new DisconnectedError("no node of the cluster answered METADATA");
    for (const c of client.nodeClientsUp()) {
      try {
        return await c.askMetadata(topic, group, METADATA_ASK_MS);
      } catch (e) {
        if (e instanceof BrokerError && !e.retryable) throw e;
        last = e;
      }
    }
    throw last;
  }

  /** Records md's owners and the partitions subscribed. */
  private learn(md: Body): void {
    const parts: number[] = [];
    for (const p of (md.partitions ?? []) as Body[]) {
      parts.push(p.partition);
      const cur = this.owners.get(p.partition);
      const epoch = BigInt(p.epoch ?? 0);
      if (p.owner && (!cur || epoch >= cur.epoch)) this.owners.set(p.partition, { addr: String(p.owner), epoch });
    }
    this.s.partitions = this.s.partition >= 0 ? [this.s.partition] : parts;
  }

  /** The nodes holding a replica of the partitions subscribed, at most SPAN_PARTS_MAX. */
  private replicas(md: Body): string[] {
    const out: string[] = [];
    for (const p of (md.partitions ?? []) as Body[]) {
      if (this.s.partition >= 0 && p.partition !== this.s.partition) continue;
      for (const r of (p.replicas ?? []) as string[]) {
        if (r && !out.includes(r) && out.length < SPAN_PARTS_MAX) out.push(r);
      }
    }
    return out;
  }

  /** Subscribes on the node at addr, unless a live part is there. */
  private open(addr: string): Promise<Subscription | null> {
    const have = this.parts.get(addr);
    if (have && !have.ended) return Promise.resolve(have);
    const busy = this.opening.get(addr);
    if (busy) return busy;
    if (this.stopped) return Promise.resolve(null);
    const p = (async () => {
      const nc = await this.client.nodeClient(addr);
      const state = { sent: false };
      const part = await abortable("subscribe", { timeoutMs: PART_OPEN_MS }, state, (signal) =>
        nc.subscribeNew(this.s.topic, this.o, state, signal, this.s),
      );
      if (this.stopped) {
        await part.unsubscribe().catch(() => {});
        return null;
      }
      this.parts.set(addr, part);
      if (!this.s.prefetch) this.s.prefetch = part.prefetch;
      return part;
    })().finally(() => this.opening.delete(addr));
    this.opening.set(addr, p);
    return p;
  }

  private schedule(): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      void this.refresh().finally(() => this.schedule());
    }, SPAN_REFRESH_MS);
    this.timer.unref();
  }

  /** Forgets the parts that ended, reads the replica set again, subscribes
   * on new replica nodes and leaves nodes that no longer hold one. */
  private async refresh(): Promise<void> {
    if (this.stopped) return;
    for (const [addr, part] of this.parts) {
      const end = part.endReason;
      if (!end) continue;
      this.parts.delete(addr);
      // Something final for the whole subscription ends it; the rest (a
      // node given up on, reconciled away) is subscribed to again below.
      const cause = end.cause;
      if (end.reason === "queue_deleted" || (end.reason === "broker_error" && cause instanceof BrokerError && !cause.retryable && cause.code !== Code.NOT_OWNER)) {
        this.stop(end.reason, cause);
        return;
      }
    }
    let md: Body;
    try {
      md = await Span.metadata(this.client, this.s.topic, this.s.group);
    } catch (e) {
      if (e instanceof BrokerError && e.code === Code.NOT_FOUND) this.stop("queue_deleted", e);
      return;
    }
    if (this.stopped) return;
    this.learn(md);
    const replicas = this.replicas(md);
    if (replicas.length > 0) {
      for (const [addr, part] of this.parts) {
        if (replicas.includes(addr)) continue;
        this.parts.delete(addr);
        await part.unsubscribe().catch(() => {});
      }
    }
    await Promise.allSettled(replicas.map((addr) => this.open(addr)));
  }

  /** Ends the spanning subscription and its parts. */
  stop(reason: SubscriptionEndReason, cause: unknown): void {
    if (this.stopped) return;
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.client.spans.delete(this);
    this.s.end(reason, cause);
    const parts = [...this.parts.values()];
    this.parts.clear();
    void Promise.allSettled([...parts.map((p) => p.unsubscribe()), ...this.opening.values()]).then(() => this.done.resolve());
  }

  /** unsubscribe() of the spanning subscription. */
  unsubscribe(): Promise<void> {
    this.stop("unsubscribed", null);
    return this.done.promise;
  }

  /** addr delivered partition p under epoch. */
  noteOwner(p: number, addr: string, epoch: bigint): void {
    const cur = this.owners.get(p);
    if (!cur || (epoch >= cur.epoch && cur.addr !== addr)) this.owners.set(p, { addr, epoch });
  }

  private forgetOwner(p: number, addr: string): void {
    const cur = this.owners.get(p);
    if (cur && cur.addr === addr) cur.addr = "";
  }

  /** The part on p's owner as last known, if it is subscribed and connected. */
  private ownerPart(p: number): Subscription | null {
    const o = this.owners.get(p);
    const part = o?.addr ? this.parts.get(o.addr) : undefined;
    return part && !part.ended && part.serverId !== null && part.liveConn() ? part : null;
  }

  /** Asks METADATA for p's owner (concurrent lookups share one request) and
   * returns the part there, subscribing on that node if needed. */
  private async lookupOwner(p: number): Promise<Subscription | null> {
    if (!this.looking) {
      this.looking = Span.metadata(this.client, this.s.topic, this.s.group)
        .then((md) => this.learn(md), () => {})
        .finally(() => {
          this.looking = null;
        });
    }
    await this.looking;
    const addr = this.owners.get(p)?.addr;
    if (!addr) return null;
    try {
      return await this.open(addr);
    } catch {
      return null;
    }
  }

  /** A settle of a message a part delivered: see the comment above. */
  settle(nc: Client, msg: Message, op: number, delayMs: number, confirmed: boolean, oo: OperationOptions): Promise<void> {
    const done = this.settleOutcome(nc, msg, op, delayMs).finally(() => msg.sub.release(msg));
    if (!confirmed) {
      done.catch((e) => nc.settleError(e, msg));
      return Promise.resolve();
    }
    return abortable("settle", oo, { sent: true }, () => done);
  }

  /** An extend of a message a part delivered: sent where the message came
   * from, and to the partition's current owner by lease reference when that
   * node is gone, refuses it or does not answer in time, as a settle is. */
  extend(nc: Client, msg: Message, ms: number, oo: OperationOptions): Promise<void> {
    const done = this.settleOutcome(nc, msg, Op.EXTEND, ms);
    return abortable("extend", oo, { sent: true }, () => done);
  }

  private async settleOutcome(nc: Client, msg: Message, op: number, delayMs: number): Promise<void> {
    let first: Promise<void>;
    if (msg.stale || msg.epoch !== nc.sessionEpoch()) {
      first = Promise.reject(new StaleDeliveryError("session not resumed on the node that delivered the message"));
    } else if (!nc.liveConn()) {
      // The node is gone (or its connection is being restored): the owner,
      // which may be another node by now, takes the settle by reference.
      first = Promise.reject(new ConnectionLostError(`${nc.addr}: not connected`));
    } else {
      const d = deferred<void>();
      nc.sendSettle({ op, msg, delayMs, resolve: d.resolve, reject: d.reject });
      first = d.promise;
    }
    try {
      await hedged(first, SETTLE_HEDGE_MS, nc.addr);
      return;
    } catch (e) {
      if (!resettleable(e)) throw e;
      return this.resettle(msg, op, delayMs, e, nc.addr);
    }
  }

  /** Sends the settle to the partition's current owner by lease reference
   * until an answer is final. */
  private async resettle(msg: Message, op: number, delayMs: number, cause: unknown, from: string): Promise<void> {
    let last = cause;
    this.forgetOwner(msg.partition, from);
    for (let hop = 0; hop < RESETTLE_HOPS_MAX; hop++) {
      if (hop > 0) await new Promise((r) => setTimeout(r, Math.min(RESETTLE_BACKOFF_MIN_MS << Math.min(hop, 8), RESETTLE_BACKOFF_MAX_MS)));
      if (this.stopped) {
        throw new StaleDeliveryError(`the subscription ended before the settle reached the partition's owner: ${String((last as Error)?.message ?? last)}`);
      }
      const part = this.ownerPart(msg.partition) ?? (await this.lookupOwner(msg.partition));
      const c = part?.liveConn();
      const id = part?.serverId ?? null;
      if (!part || !c || id === null) {
        if (part) this.forgetOwner(msg.partition, part.nodeAddr());
        continue;
      }
      const leases = [{ ...msg.lease, sub_id: id }];
      const body = op === Op.EXTEND ? { tags: [0n], extend_ms: BigInt(delayMs), leases } : { tags: [0n], delay_ms: BigInt(delayMs), leases };
      let code: number;
      try {
        const reply = await hedged(c.call(op, body), SETTLE_HEDGE_MS, part.nodeAddr());
        if (reply.op !== Op.SETTLE_RESULT || reply.body.codes.length !== 1) throw new ProtocolError(`${opName(reply.op)} in answer to a settle`);
        code = reply.body.codes[0] as number;
      } catch (e) {
        if (!resettleable(e)) throw e;
        last = e;
        this.forgetOwner(msg.partition, part.nodeAddr());
        continue;
      }
      if (code === Code.OK) return;
      if (code === Code.STALE_LEASE) {
        // A NACK or FAIL repeated after a first send that took effect
        // before its connection broke is stale_lease: its outcome is the
        // first send's, unknown.
        // (An EXTEND repeated finds the lease it extended, or none.)
        if (op !== Op.ACK && op !== Op.EXTEND && (cause instanceof ConnectionLostError || cause instanceof HeartbeatTimeoutError)) throw cause;
        throw new StaleDeliveryError("the partition's owner judged the lease stale");
      }
      const err = brokerError(code, "settle refused");
      if (!resettleable(err)) throw err;
      last = err;
      this.forgetOwner(msg.partition, part.nodeAddr());
    }
    throw last;
  }
}
