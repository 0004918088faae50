"""Codec tests: primitives against Go's encoding/binary, round trips with edge
values, malformed input, and the shared wire vectors of protocol/testdata."""

from __future__ import annotations

import json
import os
import unittest
from pathlib import Path
from typing import Any

import sinew
from sinew import _wire as w
from sinew.errors import ProtocolError

VECTORS = Path(os.environ.get("SINEW_VECTORS") or
               Path(__file__).resolve().parents[3] / "protocol" / "testdata" / "vectors" / "frames.json")


def uv(v: int) -> bytes:
    out = bytearray()
    w.put_uvarint(out, v)
    return bytes(out)


def sv(v: int) -> bytes:
    out = bytearray()
    w.put_varint(out, v)
    return bytes(out)


class Primitives(unittest.TestCase):
    def test_uvarint_matches_go(self) -> None:
        # Values from Go's binary.AppendUvarint.
        self.assertEqual(uv(0), b"\x00")
        self.assertEqual(uv(127), b"\x7f")
        self.assertEqual(uv(128), b"\x80\x01")
        self.assertEqual(uv(300), b"\xac\x02")
        self.assertEqual(uv(2**64 - 1), b"\xff" * 9 + b"\x01")

    def test_varint_zigzag_matches_go(self) -> None:
        self.assertEqual(sv(0), b"\x00")
        self.assertEqual(sv(-1), b"\x01")
        self.assertEqual(sv(1), b"\x02")
        self.assertEqual(sv(-64), b"\x7f")
        self.assertEqual(sv(-(2**63)), b"\xff" * 9 + b"\x01")
        self.assertEqual(sv(2**63 - 1), b"\xfe" + b"\xff" * 8 + b"\x01")
        for v in (0, 1, -1, 2**31, -(2**31), 2**63 - 1, -(2**63)):
            self.assertEqual(w.Reader(sv(v)).varint(), v)

    def test_uvarint_overflow_is_malformed(self) -> None:
        with self.assertRaises(ProtocolError):
            w.Reader(b"\xff" * 9 + b"\x02").uvarint()
        with self.assertRaises(ProtocolError):
            w.Reader(b"\x80" * 11).uvarint()

    def test_out_of_range_values_are_not_encoded(self) -> None:
        with self.assertRaises(ValueError):
            w.Subscribe(prefetch=2**32).encode()
        with self.assertRaises(ValueError):
            w.Publish(partition=2**31).encode()
        with self.assertRaises(ValueError):
            w.put_uvarint(bytearray(), -1)
        # Floats, bools and other types are refused, not coerced.
        for bad in (w.Subscribe(prefetch=1.0), w.Subscribe(ack_mode=True), w.Subscribe(topic=b"t"),  # type: ignore[arg-type]
                    w.DeclareQueue(lease_ms=500.0), w.Reconcile(inflight_follows=1)):  # type: ignore[arg-type]
            with self.subTest(bad), self.assertRaises(sinew.InvalidArgumentError):
                bad.encode()


class Bodies(unittest.TestCase):
    def roundtrip(self, body: w.Body) -> None:
        frame = w.encode_frame(body, 2**64 - 1, w.FLAG_NO_REPLY)
        f = w.split_frame(frame)
        self.assertEqual((f.op, f.flags, f.req_id), (w.op_of(body), w.FLAG_NO_REPLY, 2**64 - 1))
        self.assertEqual(w.decode_body(f.op, f.body), body)

    def test_every_op_round_trips_with_edge_values(self) -> None:
        ref = w.LeaseRef(2**64 - 1, 2**32 - 1, 2**64 - 1, 1, 0)
        view = w.SubView(7, "t", "g", -1, 1, 2**32 - 1)
        bodies: list[w.Body] = [
            w.Hello(1, "grüße 🚀", "0.1.0", "", w.ResumeIdentity("c", "o", bytes(range(256)))),
            w.HelloOK(1, "s", w.ResumeIdentity(), 3, 2**64 - 1, 0, 2**32 - 1, w.Limits(1, 2, 3, 4, 5, 2**32 - 1)),
            w.Ping(), w.Pong(), w.Ok(), w.EndSession(),
            w.ErrorBody(22, "x", True),
            w.DeclareQueue("t", "", 2**32 - 1, 3, "dlq", -(2**31), -(2**63), 2**63 - 1),
            w.DeclareOK(1, True),
            w.Publish("t", "g", -1, b"\x00\xff", [("a", ""), ("", "é")], "text/plain", -1, 2**63 - 1, 0,
                      "p", 2**64 - 1, b""),
            w.PublishOK(2**32 - 1, 2**64 - 1, True),
            w.DeleteQueue("t", "g"), w.PurgeQueue("t", ""), w.PurgeOK(2**64 - 1),
            w.Subscribe("t", "g", 2**31 - 1, 0, 0), w.Subscribe("t", "", -1, 1, 3, "billing", "a.b:c-d_1"),
            w.Assignment(2**64 - 1, 2**32 - 1, 2**64 - 1, w.ASSIGNMENT_REVOKED), w.Assignment(1, 0, 0, w.ASSIGNMENT_ASSIGNED),
            w.SubscribeOK(1, [], 0), w.SubscribeOK(1, [0, 2**32 - 1], 5),
            w.Unsubscribe(2**64 - 1),
            w.SubClosed(1, 4, 15, "gone"),
            w.Deliver(1, 2, 3, 4, 5, -6, b"k", [("h", "v")], "ct", b"body", "t", "g", 9, 0),
            w.Deliver(1, 2, 3, 4, 5, -6, b"k", [("h", "v")], "ct", b"body", "t", "g", 9, 0, 2**32 - 1, 2**64 - 1),
            w.Settle([1, 2**64 - 1], 0, [ref, ref], w.ACK), w.Settle([], -1, [], w.NACK),
            w.Settle([3], 0, [], w.FAIL),
            w.SettleResult([0, 12, 13]),
            w.Extend([1, 2**64 - 1], 2**63 - 1, [ref, ref]), w.Extend([], 0, []),
            w.GoingAway(2**63 - 1, 0, "shutdown", ""),
            w.Reconcile(1, [view, w.SubView()], True),
            w.Reconcile(0, [view], False, [w.SubCohort(7, "billing", "m"), w.SubCohort(2**64 - 1, "é", "x" * 128)]),
            w.ReconcileResult([w.ReconcileEntry(4, 1, 2, view, w.SubView(), "missing")]),
            w.Inflight([w.InflightEntry(5, ref)]), w.Inflight(),
            w.InflightResult([1, 2], 3, 4),
            w.Metadata("t", "é"), w.MetadataResult(),
            w.MetadataResult(True, [w.PartitionMeta(2**32 - 1, "10.0.0.1:7600", 2**64 - 1, ["a:1", ""]), w.PartitionMeta()]),
        ]
        seen = set()
        for b in bodies:
            with self.subTest(op=w.OP_NAMES[w.op_of(b)]):
                self.roundtrip(b)
                seen.add(w.op_of(b))
        self.assertEqual(seen, set(w.OP_NAMES), "an op has no round-trip case")

    def test_appended_fields_may_be_absent(self) -> None:
        full = w.Deliver(1, 2, 3, 4, 5, 6, b"", [], "", b"b", "t", "g", 77, 0, 0, 9).encode()
        old = full[:-4]  # a broker from before lease_id, epoch, lease_ms and assignment
        self.assertEqual(w.Deliver.decode(old), w.Deliver(1, 2, 3, 4, 5, 6, b"", [], "", b"b", "t", "g", 0, 0))
        self.assertEqual(w.Deliver.decode(full[:-2]), w.Deliver(1, 2, 3, 4, 5, 6, b"", [], "", b"b", "t", "g", 77, 0))
        self.assertEqual(w.Deliver.decode(full[:-1]).assignment, 0)
        self.assertEqual(w.Deliver.decode(full).assignment, 9)
        # SUBSCRIBE's cohort and member and RECONCILE's cohorts are written
        # only when set, so a plain subscription is the bytes an older
        # broker knows; absent, they decode as unset.
        plain = w.Subscribe("t", "", -1, 0, 5)
        self.assertEqual(plain.encode(), b"\x01t\x00\x01\x00\x05")
        self.assertEqual(w.Subscribe.decode(plain.encode()), plain)
        cohort = w.Subscribe("t", "", -1, 0, 5, "billing", "m-1")
        self.assertEqual(cohort.encode(), plain.encode() + b"\x07billing\x03m-1")
        self.assertEqual(w.Reconcile(1, [], True).encode(), b"\x01\x00\x01")
        self.assertEqual(w.Reconcile(1, [], True, [w.SubCohort(3, "c", "m")]).encode(), b"\x01\x00\x01\x01\x03\x01c\x01m")
        s = w.Settle([1], 5, [], w.ACK).encode()
        self.assertEqual(w.decode_body(w.NACK, s[:-1]), w.Settle([1], 5, [], w.NACK))

    def test_fast_deliver_decoder_agrees_with_the_field_table(self) -> None:
        # Deliver and SettleResult decode on a hand-written path; it must give
        # what the generic decoder gives from the field table, refuse what it
        # refuses, and lease_raw must be the lease_ref's own encoding.
        import random
        rng = random.Random(29)
        generic = w.Body._decode_from.__func__  # type: ignore[attr-defined]

        def bits(*choices: int) -> int:
            return rng.getrandbits(rng.choice(choices))

        for i in range(300):
            d = w.Deliver(bits(3, 10, 64), bits(3, 20, 64), bits(3, 32), bits(3, 20, 64), bits(3, 32),
                          rng.choice([-1, 0, 1]) * bits(3, 41, 63), bytes(bits(3)), [("k%d" % j, "é" * j) for j in range(bits(2))],
                          "ct", os.urandom(bits(3, 9)), "t", "g", bits(1, 64), bits(1, 40), bits(3, 32), bits(1, 3, 64))
            raw = d.encode()
            got = w.Deliver.decode(raw)
            self.assertEqual(got, d)
            ref = w.LeaseRef(d.sub_id, d.partition, d.offset, d.lease_id, d.epoch)
            self.assertEqual(got.lease_raw, ref.encode())
            # A settle sends those bytes as its lease_ref: the same frame as from the LeaseRef.
            self.assertEqual(w.Settle([d.tag, 1], 5, [], w.NACK, leases_raw=[got.lease_raw, got.lease_raw]).encode(),
                             w.Settle([d.tag, 1], 5, [ref, ref], w.NACK).encode())
            for cut in sorted({len(raw) - 1, len(raw) - 3, rng.randrange(len(raw)), 3, 1}):
                try:
                    want: Any = generic(w.Deliver, w.Reader(raw[:cut]))
                except ProtocolError:
                    want = ProtocolError
                try:
                    have: Any = w.Deliver.decode(raw[:cut])
                except ProtocolError:
                    have = ProtocolError
                self.assertEqual(have, want, f"case {i} cut at {cut}")
        for codes in ([], [0] * 300, [0, 12, 13, 25], [300, 0]):
            body = w.SettleResult(codes).encode()
            self.assertEqual(w.SettleResult.decode(body), generic(w.SettleResult, w.Reader(body)))
            with self.assertRaises(ProtocolError):
                w.SettleResult.decode(body[:-1] if codes else b"\x01")

    def test_publish_ok_fast_path_agrees(self) -> None:
        from sinew.client import _publish_ok
        for part, off, dup in ((0, 0, False), (1, 127, True), (200, 2**64 - 1, False), (2**32 - 1, 128, True)):
            for nxt in (0, 1, 4, 127, 128, 2**32 - 1):
                body = w.PublishOK(part, off, dup, nxt).encode()
                # Fields appended after next are ignored (next is 0 if absent).
                for extra in (b"", b"\x01", b"\x00\x05") if nxt else (b"",):
                    got = _publish_ok(body + extra)
                    self.assertEqual(got, w.PublishOK(part, off, dup, nxt))
                    self.assertEqual(w.decode_body(w.PUBLISH_OK, body + extra), got)
        for bad in (b"\x01\x02\x02", b"\x01\x80", b"", b"\x01\x02\x00\x80", b"\x01\x02\x00" + b"\xff" * 5 + b"\x0f"):
            with self.assertRaises(ProtocolError):
                _publish_ok(bad)

    def test_extend_is_nack_with_extend_ms(self) -> None:
        # EXTEND (0x34) has NACK's layout (docs/protocol.md 5.9) with
        # extend_ms where NACK has delay_ms, byte for byte.
        ref = w.LeaseRef(3, 1, 300, 2**40, 2)
        ext = w.Extend([7, 300], 30_000, [ref, ref])
        nack = w.Settle([7, 300], 30_000, [ref, ref], w.NACK)
        self.assertEqual(ext.encode(), nack.encode())
        lease = uv(3) + uv(1) + uv(300) + uv(2**40) + uv(2)
        self.assertEqual(ext.encode(), uv(2) + uv(7) + uv(300) + sv(30_000) + uv(2) + lease + lease)
        frame = w.encode_frame(ext, 9)
        self.assertEqual(frame[:16].hex(), "%08x" % (12 + len(ext.encode())) + "0134" + "0000" + "%016x" % 9)
        self.assertEqual(w.decode_body(w.EXTEND, frame[16:]), ext)
        with self.assertRaises(sinew.InvalidArgumentError):
            w.Extend([1], 1.5, []).encode()  # type: ignore[arg-type]

    def test_trailing_bytes_are_ignored(self) -> None:
        body = w.PublishOK(1, 2, False, 5).encode() + b"\x01\x02\x03"
        self.assertEqual(w.decode_body(w.PUBLISH_OK, body), w.PublishOK(1, 2, False, 5))

    def test_malformed_bodies_are_protocol_errors(self) -> None:
        cases = {
            "bool 2": (w.DECLARE_OK, b"\x01\x02"),
            "truncated string": (w.PURGE_QUEUE, b"\x05ab"),
            "invalid utf-8": (w.DELETE_QUEUE, b"\x02\xc3\x28\x00"),
            "u32 too big": (w.PUBLISH_OK, uv(2**32) + b"\x00\x00"),
            "list beyond body": (w.SETTLE_RESULT, uv(1000) + b"\x00"),
            "i32 too big": (w.SUBSCRIBE, b"\x01t\x00" + sv(2**31) + b"\x00\x00"),
            "missing field": (w.ERROR, b"\x01"),
            "assignment state 0": (w.ASSIGNMENT, b"\x01\x00\x01\x00"),
            "assignment state 3": (w.ASSIGNMENT, b"\x01\x00\x01\x03"),
            "assignment truncated": (w.ASSIGNMENT, b"\x01\x00\x01"),
            "reconcile cohorts beyond body": (w.RECONCILE, b"\x01\x00\x01" + uv(1000) + b"\x00"),
            "unknown op": (0x7F, b""),
        }
        for name, (op, body) in cases.items():
            with self.subTest(name), self.assertRaises(ProtocolError):
                w.decode_body(op, body)

    def test_bad_headers(self) -> None:
        with self.assertRaises(ProtocolError):
            w.parse_header(b"\x00\x00\x00\x0b" + bytes(12), w.FRAME_BYTES_DEFAULT)  # length below 12
        with self.assertRaises(ProtocolError):
            w.parse_header(b"\x00\x10\x00\x00\x01\x01" + bytes(10), 65536)  # above the limit
        with self.assertRaises(ProtocolError):
            w.parse_header(b"\x00\x00\x00\x0c\x02\x01" + bytes(10), 65536)  # version 2


# --- shared vectors ----------------------------------------------------------

def from_json(typ: Any, v: Any) -> Any:
    if isinstance(typ, tuple):
        return [from_json(typ[1], x) for x in v]
    if isinstance(typ, type) and issubclass(typ, w.Body):
        return typ(**{n: from_json(t, v[n]) for n, t in typ._FIELDS})
    if typ in ("uvarint", "varint"):
        return int(v)
    if typ == "bytes":
        return bytes.fromhex(v)
    if typ == "header":
        return (v["key"], v["value"])
    return v


def to_json(typ: Any, v: Any) -> Any:
    if isinstance(typ, tuple):
        return [to_json(typ[1], x) for x in v]
    if isinstance(typ, type) and issubclass(typ, w.Body):
        return {n: to_json(t, getattr(v, n)) for n, t in typ._FIELDS}
    if typ in ("uvarint", "varint"):
        return str(v)
    if typ == "bytes":
        return v.hex()
    if typ == "header":
        return {"key": v[0], "value": v[1]}
    return v


class Vectors(unittest.TestCase):
    def test_shared_wire_vectors(self) -> None:
        self.assertTrue(VECTORS.exists(), f"no wire vectors at {VECTORS}")
        doc = json.loads(VECTORS.read_text())
        self.assertEqual(doc["format"], 1)
        ops = set()
        for v in doc["vectors"]:
            with self.subTest(v["name"]):
                raw = bytes.fromhex(v["hex"])
                if v.get("error"):
                    self.assertEqual(v["error"], "bad_frame")
                    with self.assertRaises(ProtocolError):
                        f = w.split_frame(raw)
                        w.decode_body(f.op, f.body)
                    continue
                f = w.split_frame(raw)
                self.assertEqual((f.op, f.flags, f.req_id), (v["op"], v["flags"], int(v["request_id"])))
                cls = w.BODIES[f.op]
                got = w.decode_body(f.op, f.body)
                self.assertEqual(to_json(cls, got), v["fields"])
                ops.add(f.op)
                if v.get("decode_only"):
                    continue
                body = from_json(cls, v["fields"])
                if isinstance(body, w.Settle):
                    body.kind = f.op
                self.assertEqual(w.encode_frame(body, int(v["request_id"]), v["flags"]).hex(), v["hex"])
                if isinstance(body, w.Publish):
                    # The client's publish path: the head encoded once, the
                    # sequence and body added per send.
                    head = bytearray()
                    body.encode_head(head)
                    frame = w.publish_frame(int(v["request_id"]), bytes(head), body.producer_seq, body.body, v["flags"], body.producer_prev)
                    self.assertEqual(frame.hex(), v["hex"])
        self.assertEqual(ops, set(w.OP_NAMES), "the vectors do not cover every op")


if __name__ == "__main__":
    unittest.main()
