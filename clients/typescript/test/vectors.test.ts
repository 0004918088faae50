// The shared wire vectors (protocol/testdata/vectors/frames.json): every frame
// decodes to its fields, and the fields encode to the same bytes.
import { test } from "node:test";
import { strict as assert } from "node:assert";
import { readFileSync } from "node:fs";
import { DecodeError, Op, decodeBody, encodeFrame, encodePublishFrame, encodePublishHead, parseFrame, schemas, type Schema, type WireType } from "../src/codec.js";
import { codeName } from "../src/errors.js";

interface Vector {
  name: string;
  op: number;
  flags: number;
  request_id: string;
  fields: Record<string, unknown> | null;
  decode_only?: boolean;
  error?: string;
  hex: string;
}

const file = new URL("../../../../protocol/testdata/vectors/frames.json", import.meta.url);
const vectors = (JSON.parse(readFileSync(file, "utf8")) as { format: number; vectors: Vector[] }).vectors;

const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");
const unhex = (s: string) => new Uint8Array(Buffer.from(s, "hex"));

/** A decoded value in the vector file's JSON form. */
function toJSON(t: WireType, v: unknown): unknown {
  if (typeof t === "object") {
    if ("list" in t) return (v as unknown[]).map((x) => toJSON(t.list, x));
    return fieldsToJSON(t.record, v as Record<string, unknown>);
  }
  switch (t) {
    case "uvarint":
    case "varint":
      return (v as bigint).toString();
    case "bytes":
      return hex(v as Uint8Array);
    default:
      return v;
  }
}
function fieldsToJSON(s: Schema, b: Record<string, unknown>): Record<string, unknown> {
  const o: Record<string, unknown> = {};
  for (const [n, t] of s) o[n] = toJSON(t, b[n]);
  return o;
}

/** The vector file's JSON form back to a body the encoder takes. */
function fromJSON(t: WireType, v: unknown): unknown {
  if (typeof t === "object") {
    if ("list" in t) return (v as unknown[]).map((x) => fromJSON(t.list, x));
    return fieldsFromJSON(t.record, v as Record<string, unknown>);
  }
  switch (t) {
    case "uvarint":
    case "varint":
      return BigInt(v as string);
    case "bytes":
      return unhex(v as string);
    default:
      return v;
  }
}
function fieldsFromJSON(s: Schema, j: Record<string, unknown>): Record<string, unknown> {
  const o: Record<string, unknown> = {};
  for (const [n, t] of s) o[n] = fromJSON(t, j[n]);
  return o;
}

/** JSON with sorted keys, to compare objects whatever their key order. */
function canon(v: unknown): string {
  return JSON.stringify(v, (_k, x) =>
    x && typeof x === "object" && !Array.isArray(x) ? Object.fromEntries(Object.entries(x).sort(([a], [b]) => (a < b ? -1 : 1))) : x,
  );
}

// EXTEND's body is NACK's with delay_ms replaced by extend_ms: the bytes of
// the shared vector nack/delay with the op byte 0x31 changed to 0x34.
const extendHex = "0000001b01340000000000000000000f0104b8170105014d80808080802000";
const extendBody = {
  tags: [4n],
  extend_ms: 1500n,
  leases: [{ sub_id: 5n, partition: 1, offset: 77n, lease_id: 1099511627776n, epoch: 0n }],
};

test("EXTEND encodes as NACK's layout with extend_ms, and decodes back", () => {
  assert.equal(hex(encodeFrame(Op.EXTEND, 15n, extendBody)), extendHex);
  const nack = vectors.find((v) => v.name === "nack/delay")!;
  assert.equal(extendHex, nack.hex.slice(0, 10) + "34" + nack.hex.slice(12));
  const f = parseFrame(unhex(extendHex));
  assert.equal(f.op, Op.EXTEND);
  assert.equal(canon(fieldsToJSON(schemas[Op.EXTEND]!, decodeBody(f.op, f.body))), canon(fieldsToJSON(schemas[Op.EXTEND]!, extendBody)));
});

test("the vector file covers every op this codec knows", () => {
  const ops = new Set(vectors.filter((v) => !v.error).map((v) => v.op));
  for (const op of Object.keys(schemas).map(Number)) assert.ok(ops.has(op), `no vector for op 0x${op.toString(16)}`);
  assert.ok(vectors.length >= 60, `only ${vectors.length} vectors`);
});

for (const v of vectors) {
  test(`vector ${v.name}`, () => {
    const frame = unhex(v.hex);
    const f = parseFrame(frame);
    assert.equal(f.op, v.op);
    assert.equal(f.flags, v.flags);
    assert.equal(f.requestId.toString(), v.request_id);
    if (v.error) {
      assert.throws(
        () => decodeBody(f.op, f.body),
        (e: unknown) => e instanceof DecodeError && codeName(e.code) === v.error,
      );
      return;
    }
    const body = decodeBody(f.op, f.body);
    const schema = schemas[f.op]!;
    assert.equal(canon(fieldsToJSON(schema, body)), canon(v.fields));
    const again = encodeFrame(f.op, f.requestId, fieldsFromJSON(schema, v.fields!), f.flags);
    if (v.decode_only) assert.notEqual(hex(again), v.hex);
    else assert.equal(hex(again), v.hex);
    if (f.op === Op.PUBLISH && !v.decode_only) {
      // The client's publish path: the head encoded once, the sequence and body added per send.
      const b = fieldsFromJSON(schema, v.fields!);
      const viaHead = encodePublishFrame(f.requestId, encodePublishHead(b), b.producer_seq as bigint, b.body as Uint8Array, f.flags, b.producer_prev as bigint);
      assert.equal(hex(viaHead), v.hex);
    }
  });
}

test("SUBSCRIBE's cohort and RECONCILE's cohorts are written only when set", () => {
  const plain = { topic: "t", group: "", partition: -1, ack_mode: 0, prefetch: 5 };
  const plainHex = hex(encodeFrame(Op.SUBSCRIBE, 1n, plain)).slice(32);
  assert.equal(plainHex, "0174000100" + "05");
  const f = parseFrame(encodeFrame(Op.SUBSCRIBE, 1n, plain));
  assert.deepEqual(decodeBody(f.op, f.body), { ...plain, cohort: "", member: "" });
  const cohort = hex(encodeFrame(Op.SUBSCRIBE, 1n, { ...plain, cohort: "billing", member: "m-1" })).slice(32);
  assert.equal(cohort, plainHex + "0762696c6c696e67" + "036d2d31");
  assert.equal(hex(encodeFrame(Op.RECONCILE, 1n, { policy: 1, subs: [], inflight_follows: true, cohorts: [] })).slice(32), "010001");
  assert.equal(
    hex(encodeFrame(Op.RECONCILE, 1n, { policy: 1, subs: [], inflight_follows: true, cohorts: [{ sub_id: 3n, cohort: "c", member: "m" }] })).slice(32),
    "010001" + "0103" + "0163" + "016d",
  );
});

test("ASSIGNMENT with a state other than assigned or revoked is bad_frame", () => {
  for (const state of [0, 3, 255]) {
    assert.throws(() => decodeBody(Op.ASSIGNMENT, new Uint8Array([1, 0, 1, state])), DecodeError);
  }
  assert.throws(() => decodeBody(Op.ASSIGNMENT, new Uint8Array([1, 0, 1])), DecodeError);
  assert.deepEqual(decodeBody(Op.ASSIGNMENT, new Uint8Array([1, 0, 1, 2])), { sub_id: 1n, partition: 0, epoch: 1n, state: 2 });
});
