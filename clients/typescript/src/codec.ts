// Wire codec of protocol version 1 (docs/protocol.md, sections 1, 2 and 5).
//
// Bodies are described by schemas: a list of (field name, wire type) in wire
// order. One encoder and one decoder walk the schemas, so a body's layout is
// written down once. Field names are the protocol's snake_case names, the same
// names the shared wire vectors (protocol/testdata/vectors) use.
//
// Value types in decoded bodies: uvarint and varint fields (64-bit) are
// bigint; u8, u16, u32, i32 and error codes are number; bool is boolean;
// string is string; bytes is Uint8Array; lists are arrays; records are objects.

import { InvalidArgumentError, SinewError } from "./errors.js";

/** Protocol version this codec speaks. @internal */
export const PROTOCOL_VERSION = 1;
/** Bytes of the length prefix. @internal */
export const LENGTH_BYTES = 4;
/** Bytes of the fixed header after the length prefix. @internal */
export const HEADER_BYTES = 12;
/** Frame limit until HELLO_OK announces another. @internal */
export const FRAME_BYTES_DEFAULT = 1 << 20;
/** Header flag: the sender wants no reply. @internal */
export const FLAG_NO_REPLY = 0x0001;

/** Op codes of protocol version 1. @internal */
export const Op = {
  HELLO: 0x01,
  HELLO_OK: 0x02,
  PING: 0x03,
  PONG: 0x04,
  ERROR: 0x05,
  OK: 0x06,
  DECLARE_QUEUE: 0x10,
  DECLARE_OK: 0x11,
  PUBLISH: 0x12,
  PUBLISH_OK: 0x13,
  DELETE_QUEUE: 0x14,
  PURGE_QUEUE: 0x15,
  PURGE_OK: 0x16,
  SUBSCRIBE: 0x20,
  SUBSCRIBE_OK: 0x21,
  UNSUBSCRIBE: 0x22,
  SUB_CLOSED: 0x23,
  DELIVER: 0x24,
  ASSIGNMENT: 0x25,
  ACK: 0x30,
  NACK: 0x31,
  FAIL: 0x32,
  SETTLE_RESULT: 0x33,
  EXTEND: 0x34,
  GOING_AWAY: 0x40,
  RECONCILE: 0x41,
  RECONCILE_RESULT: 0x42,
  END_SESSION: 0x43,
  INFLIGHT: 0x44,
  INFLIGHT_RESULT: 0x45,
  METADATA: 0x50,
  METADATA_RESULT: 0x51,
} as const;

/** Name of an op code, as in docs/protocol.md section 4. @internal */
export function opName(op: number): string {
  for (const [k, v] of Object.entries(Op)) if (v === op) return k;
  return `OP_0x${op.toString(16).padStart(2, "0")}`;
}

// Limits that hold while decoding any body (as in the Go decoder): a list
// count larger than what the remaining bytes can hold is refused before any
// allocation.
const LIST_ITEMS_MAX = 1 << 16;
const HEADERS_MAX = 256;

/** A wire type in a schema. @internal */
export type WireType =
  | "uvarint"
  | "varint"
  | "u16"
  | "u32"
  | "i32"
  | "u8"
  | "bool"
  | "string"
  | "bytes"
  | "code"
  | { list: WireType; max?: number }
  | { record: Schema };

/** A body layout: fields in wire order. `opt` marks the first of the fields
 * appended to the body later; a decoder reads them only when bytes remain.
 * `optSet` marks appended fields the same way, and also tells the encoder to
 * write this field and those after it only when one of them is set (not
 * zero, empty or absent), as the protocol asks of SUBSCRIBE's cohort and
 * RECONCILE's cohorts. @internal */
export type Schema = ReadonlyArray<readonly [string, WireType] | readonly [string, WireType, "opt" | "optSet"]>;

const resume: Schema = [
  ["client_id", "string"],
  ["owner_id", "string"],
  ["token", "bytes"],
];
const header: Schema = [
  ["key", "string"],
  ["value", "string"],
];
const leaseRef: Schema = [
  ["sub_id", "uvarint"],
  ["partition", "u32"],
  ["offset", "uvarint"],
  ["lease_id", "uvarint"],
  ["epoch", "uvarint"],
];
const subView: Schema = [
  ["sub_id", "uvarint"],
  ["topic", "string"],
  ["group", "string"],
  ["partition", "i32"],
  ["ack_mode", "u8"],
  ["prefetch", "u32"],
];
const subCohort: Schema = [
  ["sub_id", "uvarint"],
  ["cohort", "string"],
  ["member", "string"],
];
const settle: Schema = [
  ["tags", { list: "uvarint" }],
  ["delay_ms", "varint"],
  ["leases", { list: { record: leaseRef } }, "opt"],
];

/** Body schema of every op. @internal */
export const schemas: Record<number, Schema> = {
  [Op.HELLO]: [
    ["protocol_version", "u16"],
    ["client_name", "string"],
    ["client_version", "string"],
    ["credentials", "string"],
    ["resume", { record: resume }],
    ["user", "string", "opt"],
  ],
  [Op.HELLO_OK]: [
    ["protocol_version", "u16"],
    ["server_version", "string"],
    ["resume", { record: resume }],
    ["outcome", "u8"],
    ["server_generation", "uvarint"],
    ["heartbeat_ms", "u32"],
    ["reconnect_grace_ms", "u32"],
    [
      "limits",
      {
        record: [
          ["frame_bytes_max", "u32"],
          ["body_bytes_max", "u32"],
          ["prefetch_max", "u32"],
          ["settle_batch_max", "u32"],
          ["publish_inflight_max", "u32"],
          ["subscriptions_max", "u32"],
        ],
      },
    ],
    ["cluster", "bool", "opt"],
  ],
  [Op.PING]: [],
  [Op.PONG]: [],
  [Op.OK]: [],
  [Op.ERROR]: [
    ["code", "code"],
    ["message", "string"],
    ["fatal", "bool"],
    ["owner", "string", "opt"],
  ],
  [Op.DECLARE_QUEUE]: [
    ["topic", "string"],
    ["group", "string"],
    ["partitions", "u32"],
    ["dead_letter_mode", "u8"],
    ["dead_letter_target", "string"],
    ["max_retries", "i32"],
    ["default_ttl_ms", "varint"],
    ["lease_ms", "varint"],
  ],
  [Op.DECLARE_OK]: [
    ["partitions", "u32"],
    ["created", "bool"],
  ],
  [Op.PUBLISH]: [
    ["topic", "string"],
    ["group", "string"],
    ["partition", "i32"],
    ["key", "bytes"],
    ["headers", { list: { record: header }, max: HEADERS_MAX }],
    ["content_type", "string"],
    ["delay_ms", "varint"],
    ["not_before_ms", "varint"],
    ["ttl_ms", "varint"],
    ["producer_id", "string"],
    ["producer_seq", "uvarint"],
    ["body", "bytes"],
    ["producer_prev", "uvarint", "opt"],
  ],
  [Op.PUBLISH_OK]: [
    ["partition", "u32"],
    ["offset", "uvarint"],
    ["duplicate", "bool"],
    // A partition hint (1 + partition, 0 none): the next keyless publish to
    // the queue goes there (hints.ts).
    ["next", "u32", "optSet"],
  ],
  [Op.DELETE_QUEUE]: [
    ["topic", "string"],
    ["group", "string"],
  ],
  [Op.PURGE_QUEUE]: [
    ["topic", "string"],
    ["group", "string"],
  ],
  [Op.PURGE_OK]: [["purged", "uvarint"]],
  [Op.SUBSCRIBE]: [
    ["topic", "string"],
    ["group", "string"],
    ["partition", "i32"],
    ["ack_mode", "u8"],
    ["prefetch", "u32"],
    ["cohort", "string", "optSet"],
    ["member", "string"],
  ],
  [Op.SUBSCRIBE_OK]: [
    ["sub_id", "uvarint"],
    ["partitions", { list: "u32" }],
    ["prefetch", "u32"],
  ],
  [Op.UNSUBSCRIBE]: [["sub_id", "uvarint"]],
  [Op.SUB_CLOSED]: [
    ["sub_id", "uvarint"],
    ["reason", "u8"],
    ["code", "code"],
    ["message", "string"],
  ],
  [Op.DELIVER]: [
    ["sub_id", "uvarint"],
    ["tag", "uvarint"],
    ["partition", "u32"],
    ["offset", "uvarint"],
    ["attempt", "u32"],
    ["published_at_ms", "varint"],
    ["key", "bytes"],
    ["headers", { list: { record: header }, max: HEADERS_MAX }],
    ["content_type", "string"],
    ["body", "bytes"],
    ["topic", "string"],
    ["group", "string"],
    ["lease_id", "uvarint", "opt"],
    ["epoch", "uvarint"],
    ["lease_ms", "u32", "opt"],
    ["assignment", "uvarint", "opt"],
  ],
  [Op.ASSIGNMENT]: [
    ["sub_id", "uvarint"],
    ["partition", "u32"],
    ["epoch", "uvarint"],
    ["state", "u8"], // 1 assigned, 2 revoked; anything else is malformed (bodyChecks)
  ],
  [Op.ACK]: settle,
  [Op.NACK]: settle,
  [Op.FAIL]: settle,
  [Op.EXTEND]: [
    ["tags", { list: "uvarint" }],
    ["extend_ms", "varint"],
    ["leases", { list: { record: leaseRef } }], // required, unlike the settles'
  ],
  [Op.SETTLE_RESULT]: [["codes", { list: "code" }]],
  [Op.GOING_AWAY]: [
    ["deadline_ms", "varint"],
    ["grace_ms", "u32"],
    ["reason", "string"],
    ["redirect", "string"],
  ],
  [Op.RECONCILE]: [
    ["policy", "u8"],
    ["subs", { list: { record: subView } }],
    ["inflight_follows", "bool", "opt"],
    ["cohorts", { list: { record: subCohort } }, "optSet"],
  ],
  [Op.RECONCILE_RESULT]: [
    [
      "entries",
      {
        list: {
          record: [
            ["action", "u8"],
            ["client_sub_id", "uvarint"],
            ["server_sub_id", "uvarint"],
            ["client", { record: subView }],
            ["server", { record: subView }],
            ["reason", "string"],
          ],
        },
      },
    ],
  ],
  [Op.END_SESSION]: [],
  [Op.INFLIGHT]: [
    [
      "entries",
      {
        list: {
          record: [
            ["tag", "uvarint"],
            ["lease", { record: leaseRef }],
          ],
        },
      },
    ],
  ],
  [Op.INFLIGHT_RESULT]: [
    ["stale", { list: "uvarint" }],
    ["resent", "uvarint"],
    ["kept", "uvarint"],
  ],
  [Op.METADATA]: [
    ["topic", "string"],
    ["group", "string"],
  ],
  [Op.METADATA_RESULT]: [
    ["cluster", "bool"],
    [
      "partitions",
      {
        list: {
          record: [
            ["partition", "u32"],
            ["owner", "string"],
            ["epoch", "uvarint"],
            ["replicas", { list: "string" }],
          ],
        },
      },
    ],
  ],
};

/** A decoded or to-be-encoded body: field name to value. @internal */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Body = Record<string, any>;

/** A decoded frame. @internal */
export interface Frame {
  version: number;
  op: number;
  flags: number;
  requestId: bigint;
  body: Uint8Array;
}

/** Error code bad_frame: a frame or field could not be parsed. */
const BAD_FRAME = 1;

function malformed(field: string, what: string): SinewError {
  return new DecodeError(`field ${field}: ${what}`);
}

/** A frame or body that could not be parsed (protocol code bad_frame). */
export class DecodeError extends SinewError {
  /** The protocol error code: always 1, bad_frame. */
  readonly code = BAD_FRAME;
  override readonly name = "DecodeError";
  constructor(message: string) {
    super(message, false);
  }
}

// ----- encoding -----

class Writer {
  buf: Uint8Array;
  n = 0;
  constructor(size = 256) {
    this.buf = new Uint8Array(size);
  }
  private room(k: number): void {
    if (this.n + k <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.n + k) size *= 2;
    const b = new Uint8Array(size);
    b.set(this.buf.subarray(0, this.n));
    this.buf = b;
  }
  u8(v: number): void {
    this.room(1);
    this.buf[this.n++] = v & 0xff;
  }
  uvarint(v: bigint | number): void {
    this.room(10);
    if (typeof v === "number" && v >= 0 && v <= 0xffffffff) {
      while (v >= 0x80) {
        this.buf[this.n++] = (v & 0x7f) | 0x80;
        v = Math.floor(v / 128);
      }
      this.buf[this.n++] = v;
      return;
    }
    let b = BigInt.asUintN(64, BigInt(v));
    while (b >= 0x80n) {
      this.buf[this.n++] = Number(b & 0x7fn) | 0x80;
      b >>= 7n;
    }
    this.buf[this.n++] = Number(b);
  }
  varint(v: bigint | number): void {
    const x = BigInt.asIntN(64, BigInt(v));
    this.uvarint(BigInt.asUintN(64, (x << 1n) ^ (x >> 63n)));
  }
  /** Bytes as they are, without a length. */
  bytesRaw(b: Uint8Array): void {
    this.room(b.length);
    this.buf.set(b, this.n);
    this.n += b.length;
  }
  raw(b: Uint8Array): void {
    this.uvarint(b.length);
    this.room(b.length);
    this.buf.set(b, this.n);
    this.n += b.length;
  }
}

const utf8 = new TextEncoder();
const utf8Strict = new TextDecoder("utf-8", { fatal: true });

/** The value of a field that cannot be encoded: refused, never truncated. */
function unencodable(field: string, want: string, v: unknown): InvalidArgumentError {
  return new InvalidArgumentError(field, `want ${want}, got ${describe(v)}`);
}

/** A short description of a value for error messages. @internal */
export function describe(v: unknown): string {
  if (typeof v === "bigint") return `${v}n`;
  if (typeof v === "string") return JSON.stringify(v.length > 40 ? v.slice(0, 40) + "…" : v);
  if (typeof v === "number" || typeof v === "boolean" || v === undefined || v === null) return String(v);
  if (v instanceof Uint8Array) return `${v.constructor.name}(${v.length})`;
  if (Array.isArray(v)) return "an array";
  return typeof v === "object" ? (v.constructor?.name ?? "an object") : typeof v;
}

const U64_MAX = (1n << 64n) - 1n;
const I64_MIN = -(1n << 63n);
const I64_MAX = (1n << 63n) - 1n;

/** An unsigned integer field of at most max (a number), checked. */
function uint(field: string, v: unknown, max: number): number {
  if (v === undefined) return 0;
  if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v > max) throw unencodable(field, `an integer from 0 to ${max}`, v);
  return v;
}

function encodeValue(w: Writer, t: WireType, v: unknown, field: string): void {
  if (typeof t === "object") {
    if ("list" in t) {
      if (v !== undefined && !Array.isArray(v)) throw unencodable(field, "a list", v);
      const items = (v ?? []) as unknown[];
      if (items.length > (t.max ?? LIST_ITEMS_MAX)) throw new InvalidArgumentError(field, `at most ${t.max ?? LIST_ITEMS_MAX} items, got ${items.length}`);
      w.uvarint(items.length);
      for (const it of items) encodeValue(w, t.list, it, field);
    } else {
      if (v !== undefined && (typeof v !== "object" || v === null)) throw unencodable(field, "a record", v);
      encodeFields(w, t.record, (v ?? {}) as Body);
    }
    return;
  }
  switch (t) {
    case "uvarint":
      if (v === undefined) v = 0;
      if (typeof v === "bigint" ? v < 0n || v > U64_MAX : typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) {
        throw unencodable(field, "an unsigned 64-bit integer", v);
      }
      w.uvarint(v as bigint | number);
      return;
    case "varint":
      if (v === undefined) v = 0;
      if (typeof v === "bigint" ? v < I64_MIN || v > I64_MAX : typeof v !== "number" || !Number.isSafeInteger(v)) {
        throw unencodable(field, "a signed 64-bit integer", v);
      }
      w.varint(v as bigint | number);
      return;
    case "u16":
    case "code":
      w.uvarint(uint(field, v, 0xffff));
      return;
    case "u32":
      w.uvarint(uint(field, v, 0xffffffff));
      return;
    case "i32":
      if (v === undefined) v = 0;
      if (typeof v !== "number" || !Number.isInteger(v) || v < -(2 ** 31) || v > 2 ** 31 - 1) {
        throw unencodable(field, "an integer from -2147483648 to 2147483647", v);
      }
      w.varint(v);
      return;
    case "u8":
      w.u8(uint(field, v, 0xff));
      return;
    case "bool":
      if (v !== undefined && typeof v !== "boolean") throw unencodable(field, "a boolean", v);
      w.u8(v ? 1 : 0);
      return;
    case "string":
      if (v !== undefined && typeof v !== "string") throw unencodable(field, "a string", v);
      w.raw(utf8.encode((v ?? "") as string));
      return;
    case "bytes":
      if (v !== undefined && !(v instanceof Uint8Array)) throw unencodable(field, "a Uint8Array", v);
      w.raw((v ?? new Uint8Array(0)) as Uint8Array);
      return;
  }
  throw new Error(`codec: field ${field}: unknown type ${String(t)}`);
}

/** Whether a value is its type's zero: what an `optSet` field leaves out. */
function isUnset(v: unknown): boolean {
  if (v === undefined || v === null || v === "" || v === 0 || v === 0n || v === false) return true;
  if (Array.isArray(v) || v instanceof Uint8Array) return v.length === 0;
  return false;
}

function encodeFields(w: Writer, schema: Schema, body: Body): void {
  for (let i = 0; i < schema.length; i++) {
    const [name, t, mark] = schema[i]!;
    if (mark === "optSet" && schema.slice(i).every(([n]) => isUnset(body[n]))) return;
    encodeValue(w, t, body[name], name);
  }
}

/** Encodes a complete frame: length prefix, header and body. @internal */
export function encodeFrame(op: number, requestId: bigint, body: Body, flags = 0): Uint8Array {
  const schema = schemas[op];
  if (!schema) throw new Error(`codec: no schema for op 0x${op.toString(16)}`);
  const w = new Writer(64);
  w.n = LENGTH_BYTES + HEADER_BYTES;
  encodeFields(w, schema, body);
  const out = w.buf.subarray(0, w.n);
  const dv = new DataView(out.buffer, out.byteOffset, out.byteLength);
  dv.setUint32(0, w.n - LENGTH_BYTES);
  out[4] = PROTOCOL_VERSION;
  out[5] = op;
  dv.setUint16(6, flags);
  dv.setBigUint64(8, BigInt.asUintN(64, requestId));
  return out;
}

/** The fields of a PUBLISH body before producer_seq, encoded (and so
 * checked) once: the sequence is assigned later, when the publish gets its
 * place in the window, and a resend reuses these bytes. @internal */
export function encodePublishHead(body: Body): Uint8Array {
  const w = new Writer(64);
  encodeFields(w, PUBLISH_HEAD, body);
  return w.buf.slice(0, w.n);
}

const PUBLISH_HEAD: Schema = schemas[Op.PUBLISH]!.slice(0, -3);

/** A PUBLISH frame from its encoded head, sequence and body; the same bytes
 * encodeFrame makes of the whole body. The client sends producer_prev 0:
 * it asks for no ordering link (docs/protocol.md 5.6). @internal */
export function encodePublishFrame(requestId: bigint, head: Uint8Array, seq: bigint, payload: Uint8Array, flags = 0, prev = 0n): Uint8Array {
  const w = new Writer(LENGTH_BYTES + HEADER_BYTES + head.length + payload.length + 21);
  w.n = LENGTH_BYTES + HEADER_BYTES;
  w.bytesRaw(head);
  w.uvarint(seq);
  w.raw(payload);
  w.uvarint(prev);
  const out = w.buf.subarray(0, w.n);
  const dv = new DataView(out.buffer, out.byteOffset, out.byteLength);
  dv.setUint32(0, w.n - LENGTH_BYTES);
  out[4] = PROTOCOL_VERSION;
  out[5] = Op.PUBLISH;
  dv.setUint16(6, flags);
  dv.setBigUint64(8, BigInt.asUintN(64, requestId));
  return out;
}

// ----- decoding -----

class Reader {
  pos = 0;
  constructor(readonly b: Uint8Array) {}
  left(): number {
    return this.b.length - this.pos;
  }
  uvarint(field: string): bigint {
    // Fast path in plain numbers for the common small values.
    let num = 0;
    let mul = 1;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= this.b.length) throw malformed(field, "bad uvarint");
      const c = this.b[this.pos++]!;
      if (i === 9 && c > 1) throw malformed(field, "bad uvarint");
      if (i < 7) {
        num += (c & 0x7f) * mul;
        mul *= 128;
        if (c < 0x80) return BigInt(num);
        continue;
      }
      // Past 49 bits: finish in bigint.
      let big = BigInt(num) + (BigInt(c & 0x7f) << BigInt(7 * i));
      if (c < 0x80) return big;
      for (let j = i + 1; j < 10; j++) {
        if (this.pos >= this.b.length) throw malformed(field, "bad uvarint");
        const d = this.b[this.pos++]!;
        if (j === 9 && d > 1) throw malformed(field, "bad uvarint");
        big += BigInt(d & 0x7f) << BigInt(7 * j);
        if (d < 0x80) return big;
      }
      throw malformed(field, "bad uvarint");
    }
    throw malformed(field, "bad uvarint");
  }
  /** A uvarint as a number, for lengths, counts and narrow fields: exact up
   * to 2^53 - 1, Infinity above (which every bound then refuses). */
  unum(field: string): number {
    const b = this.b;
    let num = 0;
    let mul = 1;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= b.length) throw malformed(field, "bad uvarint");
      const c = b[this.pos++]!;
      if (i === 9 && c > 1) throw malformed(field, "bad uvarint");
      num += (c & 0x7f) * mul;
      mul *= 128;
      if (c < 0x80) return num > Number.MAX_SAFE_INTEGER ? Infinity : num;
    }
    throw malformed(field, "bad uvarint");
  }
  varint(field: string): bigint {
    const u = this.uvarint(field);
    return BigInt.asIntN(64, (u >> 1n) ^ -(u & 1n));
  }
  u8(field: string): number {
    if (this.pos >= this.b.length) throw malformed(field, "truncated");
    return this.b[this.pos++]!;
  }
  bytes(field: string): Uint8Array {
    const v = this.view(field);
    // A copy, so that a message does not keep its whole read chunk alive;
    // Buffer.allocUnsafe takes small ones from Node's pool, which is much
    // cheaper than an ArrayBuffer each.
    const out = Buffer.allocUnsafe(v.length);
    out.set(v);
    return out;
  }
  /** A length-prefixed run of bytes, not copied. */
  view(field: string): Uint8Array {
    const n = this.unum(field);
    if (n > this.left()) throw malformed(field, "length exceeds frame");
    const v = this.b.subarray(this.pos, this.pos + n);
    this.pos += n;
    return v;
  }
}

/** Smallest encoding of a value of type t, in bytes. */
function minBytes(t: WireType): number {
  if (typeof t === "object") {
    if ("list" in t) return 1;
    return t.record.reduce((s, [, ft]) => s + minBytes(ft), 0);
  }
  return 1;
}

function decodeValue(r: Reader, t: WireType, field: string): unknown {
  if (typeof t === "object") {
    if ("list" in t) {
      const n = r.unum(field);
      const max = t.max ?? LIST_ITEMS_MAX;
      if (n > max) throw malformed(field, `list of ${n} items exceeds ${max}`);
      if (n * minBytes(t.list) > r.left()) throw malformed(field, "list longer than frame");
      const out: unknown[] = new Array(n);
      for (let i = 0; i < out.length; i++) out[i] = decodeValue(r, t.list, field);
      return out;
    }
    return decodeFields(r, t.record);
  }
  switch (t) {
    case "uvarint":
      return r.uvarint(field);
    case "varint":
      return r.varint(field);
    case "u16":
    case "code": {
      const v = r.unum(field);
      if (v > 0xffff) throw malformed(field, "out of range");
      return v;
    }
    case "u32": {
      const v = r.unum(field);
      if (v > 0xffffffff) throw malformed(field, "value exceeds 32 bits");
      return v;
    }
    case "i32": {
      const v = r.varint(field);
      if (v < -(2n ** 31n) || v > 2n ** 31n - 1n) throw malformed(field, "value exceeds 32 bits");
      return Number(v);
    }
    case "u8":
      return r.u8(field);
    case "bool": {
      const v = r.u8(field);
      if (v > 1) throw malformed(field, "bool must be 0 or 1");
      return v === 1;
    }
    case "string": {
      const b = r.view(field);
      try {
        return utf8Strict.decode(b);
      } catch {
        throw malformed(field, "string is not valid UTF-8");
      }
    }
    case "bytes":
      return r.bytes(field);
  }
  throw new Error(`codec: field ${field}: unknown type ${String(t)}`);
}

function zeroValue(t: WireType): unknown {
  if (typeof t === "object") {
    if ("list" in t) return [];
    const o: Body = {};
    for (const [n, ft] of t.record) o[n] = zeroValue(ft);
    return o;
  }
  switch (t) {
    case "uvarint":
    case "varint":
      return 0n;
    case "bool":
      return false;
    case "string":
      return "";
    case "bytes":
      return new Uint8Array(0);
    default:
      return 0;
  }
}

function decodeFields(r: Reader, schema: Schema): Body {
  const out: Body = {};
  let absent = false;
  for (const f of schema) {
    const [name, t] = f;
    if ((f[2] === "opt" || f[2] === "optSet") && r.left() === 0) absent = true;
    out[name] = absent ? zeroValue(t) : decodeValue(r, t, name);
  }
  return out;
}

/** Decodes a frame's body by its op code. Bytes after the known fields are
 * ignored (a newer peer's appended fields). @internal */
export function decodeBody(op: number, body: Uint8Array): Body {
  const schema = schemas[op];
  if (!schema) throw new UnknownOpError(op);
  try {
    const out = decodeFields(new Reader(body), schema);
    bodyChecks[op]?.(out);
    return out;
  } catch (e) {
    if (e instanceof DecodeError) throw new DecodeError(`${opName(op)}: ${e.message}`);
    throw e;
  }
}

/** Checks of decoded values beyond their wire types. */
const bodyChecks: Record<number, (b: Body) => void> = {
  [Op.ASSIGNMENT]: (b) => {
    if (b.state !== ASSIGNMENT_ASSIGNED && b.state !== ASSIGNMENT_REVOKED) throw malformed("state", "out of range");
  },
};

/** ASSIGNMENT states (docs/protocol.md 5.7a). @internal */
export const ASSIGNMENT_ASSIGNED = 1;
/** @internal */
export const ASSIGNMENT_REVOKED = 2;

/** An op code this client does not know (protocol code unknown_op). */
export class UnknownOpError extends SinewError {
  /** The protocol error code: 4, unknown_op. */
  readonly code = 4;
  override readonly name = "UnknownOpError";
  constructor(op: number) {
    super(`unknown op 0x${op.toString(16).padStart(2, "0")}`, false);
  }
}

/** Frame header fields of a raw frame (length prefix included). @internal */
export function parseFrame(frame: Uint8Array): Frame {
  if (frame.length < LENGTH_BYTES + HEADER_BYTES) throw new DecodeError("frame shorter than header");
  const dv = new DataView(frame.buffer, frame.byteOffset, frame.byteLength);
  const n = dv.getUint32(0);
  if (n < HEADER_BYTES || n + LENGTH_BYTES !== frame.length) throw new DecodeError(`frame length ${n} does not match`);
  return {
    version: frame[4]!,
    op: frame[5]!,
    flags: dv.getUint16(6),
    requestId: dv.getBigUint64(8),
    body: frame.subarray(LENGTH_BYTES + HEADER_BYTES),
  };
}

/**
 * FrameSplitter turns a byte stream into frames. It checks each length prefix
 * against the frame limit before buffering the body, so a peer cannot make it
 * hold more than one frame's worth of bytes.
 * @internal
 */
export class FrameSplitter {
  private chunks: Uint8Array[] = [];
  private have = 0;
  constructor(public frameBytesMax: number = FRAME_BYTES_DEFAULT) {}

  /** Adds bytes and returns the complete frames now available. */
  push(chunk: Uint8Array): Frame[] {
    this.chunks.push(chunk);
    this.have += chunk.length;
    const out: Frame[] = [];
    for (;;) {
      if (this.have < LENGTH_BYTES) return out;
      const head = this.peek(LENGTH_BYTES);
      const n = new DataView(head.buffer, head.byteOffset, 4).getUint32(0);
      if (n < HEADER_BYTES) throw new DecodeError(`frame length ${n} shorter than header`);
      if (n + LENGTH_BYTES > this.frameBytesMax) {
        throw new SinewError(`frame of ${n + LENGTH_BYTES} bytes exceeds limit ${this.frameBytesMax}`, false);
      }
      if (this.have < n + LENGTH_BYTES) return out;
      const frame = this.take(n + LENGTH_BYTES);
      const f = parseFrame(frame);
      if (f.version !== PROTOCOL_VERSION) {
        throw new SinewError(`frame version ${f.version}, want ${PROTOCOL_VERSION}`, false);
      }
      out.push(f);
    }
  }

  private peek(k: number): Uint8Array {
    if (this.chunks[0]!.length >= k) return this.chunks[0]!;
    const b = new Uint8Array(k);
    let off = 0;
    for (const c of this.chunks) {
      const m = Math.min(c.length, k - off);
      b.set(c.subarray(0, m), off);
      off += m;
      if (off === k) break;
    }
    return b;
  }

  private take(k: number): Uint8Array {
    const first = this.chunks[0]!;
    if (first.length >= k) {
      const out = first.subarray(0, k);
      if (first.length === k) this.chunks.shift();
      else this.chunks[0] = first.subarray(k);
      this.have -= k;
      return out;
    }
    const out = new Uint8Array(k);
    let off = 0;
    while (off < k) {
      const c = this.chunks[0]!;
      const m = Math.min(c.length, k - off);
      out.set(c.subarray(0, m), off);
      off += m;
      if (m === c.length) this.chunks.shift();
      else this.chunks[0] = c.subarray(m);
    }
    this.have -= k;
    return out;
  }
}
