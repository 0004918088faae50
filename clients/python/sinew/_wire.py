"""Encoder and decoder for the Sinew wire protocol, version 1 (docs/protocol.md).

Every body is a fixed sequence of fields. Each message class lists its fields
in wire order in ``_FIELDS``; ``_APPENDED`` is the index of the first field
that was appended to the op after it shipped, which a decoder must accept as
absent. Bytes after the known fields are ignored (protocol section 2, "Body
evolution").

Frame layout (big-endian)::

     0               4       5       6               8                      16
    +---------------+-------+-------+---------------+-----------------------+------
    | length  (u32) | ver   | op    | flags  (u16)  | request id  (u64)     | body
    +---------------+-------+-------+---------------+-----------------------+------

``length`` counts the 12 header bytes after it plus the body.
"""

from __future__ import annotations

import dataclasses
import re
import struct
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .errors import InvalidArgumentError, ProtocolError

VERSION = 1
HEADER_BYTES = 12  # bytes after the length prefix, before the body
FRAME_BYTES_DEFAULT = 1 << 20  # bound before HELLO_OK announces frame_bytes_max
FLAG_NO_REPLY = 0x0001
LIST_ITEMS_MAX = 1 << 20  # a decoded list never claims more items than this

# Operation codes (protocol section 4).
HELLO, HELLO_OK, PING, PONG, ERROR, OK = 0x01, 0x02, 0x03, 0x04, 0x05, 0x06
DECLARE_QUEUE, DECLARE_OK, PUBLISH, PUBLISH_OK = 0x10, 0x11, 0x12, 0x13
DELETE_QUEUE, PURGE_QUEUE, PURGE_OK = 0x14, 0x15, 0x16
SUBSCRIBE, SUBSCRIBE_OK, UNSUBSCRIBE, SUB_CLOSED, DELIVER, ASSIGNMENT = 0x20, 0x21, 0x22, 0x23, 0x24, 0x25
ACK, NACK, FAIL, SETTLE_RESULT, EXTEND = 0x30, 0x31, 0x32, 0x33, 0x34
GOING_AWAY, RECONCILE, RECONCILE_RESULT, END_SESSION, INFLIGHT, INFLIGHT_RESULT = (
    0x40, 0x41, 0x42, 0x43, 0x44, 0x45)
METADATA, METADATA_RESULT = 0x50, 0x51

# ASSIGNMENT states (protocol section 5.7a).
ASSIGNMENT_ASSIGNED, ASSIGNMENT_REVOKED = 1, 2

U32_MAX = 0xFFFFFFFF
U64_MAX = 0xFFFFFFFFFFFFFFFF


# --- primitive encoders ---------------------------------------------------

def put_uvarint(out: bytearray, v: int) -> None:
    if v < 0 or v > U64_MAX:
        raise ValueError(f"uvarint out of range: {v}")
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def put_varint(out: bytearray, v: int) -> None:
    if v < -(1 << 63) or v >= (1 << 63):
        raise ValueError(f"varint out of range: {v}")
    put_uvarint(out, ((v << 1) ^ (v >> 63)) & U64_MAX)


def put_bytes(out: bytearray, b: bytes) -> None:
    put_uvarint(out, len(b))
    out += b


def put_str(out: bytearray, s: str) -> None:
    put_bytes(out, s.encode("utf-8"))


# A uvarint's bytes: up to nine with the continuation bit, then one without.
_UVARINT = re.compile(rb"[\x80-\xff]{0,9}[\x00-\x7f]")


def _mask(group: int, width: int, shift: int) -> int:
    return sum(group << (k * width + shift) for k in range(160 // width))


# Masks that squeeze the 7-bit groups of a little-endian integer of up to ten
# uvarint bytes together in four steps: pairs, fours, eights, then all ten.
_M7 = _mask(0x7F, 8, 0)
_L1, _H1 = _mask(0x7F, 16, 0), _mask(0x7F, 16, 8)
_L2, _H2 = _mask(0x3FFF, 32, 0), _mask(0x3FFF, 32, 16)
_L3, _H3 = _mask(0x0FFFFFFF, 64, 0), _mask(0x0FFFFFFF, 64, 32)
_M56 = (1 << 56) - 1


def _uvarint_at(buf: bytes, pos: int, r: Reader) -> tuple[int, int]:
    """A uvarint at buf[pos:] and the position after it; failures are r's."""
    if pos + 2 < len(buf):  # one to three bytes, unrolled
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
        c = buf[pos + 1]
        if c < 0x80:
            return (b & 0x7F) | c << 7, pos + 2
        d = buf[pos + 2]
        if d < 0x80:
            return (b & 0x7F) | (c & 0x7F) << 7 | d << 14, pos + 3
        m = _UVARINT.match(buf, pos)
        if m is not None:  # four to ten bytes, without a loop per byte
            end = m.end()
            x = int.from_bytes(buf[pos:end], "little") & _M7
            x = (x & _L1) | (x & _H1) >> 1
            x = (x & _L2) | (x & _H2) >> 2
            x = (x & _L3) | (x & _H3) >> 4
            x = (x & _M56) | (x >> 8 & ~_M56)
            if x >> 64:
                raise r.fail("uvarint overflows 64 bits")
            return x, end
    v = 0
    shift = 0
    for i in range(10):
        if pos >= len(buf):
            raise r.fail("truncated")
        b = buf[pos]
        pos += 1
        if i == 9 and b > 1:
            raise r.fail("uvarint overflows 64 bits")
        v |= (b & 0x7F) << shift
        if b < 0x80:
            return v, pos
        shift += 7
    raise r.fail("uvarint overflows 64 bits")


class Reader:
    """Reads primitive fields from one body; every failure is a ProtocolError."""

    __slots__ = ("buf", "pos", "field")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0
        self.field = ""

    def fail(self, why: str) -> ProtocolError:
        return ProtocolError(f"bad frame: field {self.field}: {why}")

    def at_end(self) -> bool:
        return self.pos >= len(self.buf)

    def uvarint(self) -> int:
        pos = self.pos
        if pos < len(self.buf) and self.buf[pos] < 0x80:  # one byte: most values
            self.pos = pos + 1
            return self.buf[pos]
        v, self.pos = _uvarint_at(self.buf, pos, self)
        return v

    def varint(self) -> int:
        u = self.uvarint()
        return (u >> 1) ^ -(u & 1)

    def u8(self) -> int:
        if self.pos >= len(self.buf):
            raise self.fail("truncated")
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def boolean(self) -> bool:
        b = self.u8()
        if b > 1:
            raise self.fail("bool is not 0 or 1")
        return b == 1

    def u32(self) -> int:
        v = self.uvarint()
        if v > U32_MAX:
            raise self.fail("out of range")
        return v

    def u16(self) -> int:
        v = self.uvarint()
        if v > 0xFFFF:
            raise self.fail("out of range")
        return v

    def i32(self) -> int:
        v = self.varint()
        if v < -(1 << 31) or v >= (1 << 31):
            raise self.fail("out of range")
        return v

    def raw(self) -> bytes:
        n = self.uvarint()
        if n > len(self.buf) - self.pos:
            raise self.fail("length beyond the body")
        b = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return b

    def str(self) -> str:
        try:
            return self.raw().decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail("invalid UTF-8") from None

    def count(self, item_bytes_min: int) -> int:
        n = self.uvarint()
        # Each item takes at least item_bytes_min bytes, so a count the body
        # cannot hold is malformed before anything is allocated.
        if n > LIST_ITEMS_MAX or n * item_bytes_min > len(self.buf) - self.pos:
            raise self.fail("list longer than the body")
        return n


# --- field types ------------------------------------------------------------
# A field type is a string naming a primitive, a message class (a struct
# embedded field by field), or ("list", type).

_ITEM_MIN = {"uvarint": 1, "varint": 1, "u8": 1, "bool": 1, "u32": 1, "u16": 1, "i32": 1,
             "bytes": 1, "str": 1, "header": 2}


def _want_int(v: Any) -> None:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"want an int, got {v!r}")


def _enc(out: bytearray, typ: Any, v: Any) -> None:
    # Values are checked, never coerced: a float, a bool where an int
    # belongs or a number out of the type's range is refused.
    if isinstance(typ, tuple):
        put_uvarint(out, len(v))
        for x in v:
            _enc(out, typ[1], x)
    elif isinstance(typ, type):
        v._encode_into(out)
    elif typ in ("uvarint", "u32", "u16"):
        _want_int(v)
        if typ == "u32" and v > U32_MAX or typ == "u16" and v > 0xFFFF:
            raise ValueError(f"{typ} out of range: {v}")
        put_uvarint(out, v)
    elif typ in ("varint", "i32"):
        _want_int(v)
        if typ == "i32" and not -(1 << 31) <= v < (1 << 31):
            raise ValueError(f"i32 out of range: {v}")
        put_varint(out, v)
    elif typ == "u8":
        _want_int(v)
        if not 0 <= v <= 255:
            raise ValueError(f"u8 out of range: {v}")
        out.append(v)
    elif typ == "bool":
        if not isinstance(v, bool):
            raise TypeError(f"want a bool, got {v!r}")
        out.append(1 if v else 0)
    elif typ == "bytes":
        if not isinstance(v, (bytes, bytearray, memoryview)):
            raise TypeError(f"want bytes, got {type(v).__name__}")
        put_bytes(out, bytes(v))
    elif typ == "str":
        if not isinstance(v, str):
            raise TypeError(f"want a str, got {v!r}")
        put_str(out, v)
    elif typ == "header":
        if not isinstance(v, tuple) or len(v) != 2 or not isinstance(v[0], str) or not isinstance(v[1], str):
            raise TypeError(f"want a (str, str) pair, got {v!r}")
        put_str(out, v[0])
        put_str(out, v[1])
    else:  # pragma: no cover - a broken field table
        raise AssertionError(typ)


def _dec(r: Reader, typ: Any) -> Any:
    if isinstance(typ, tuple):
        item: Any = typ[1]
        n = r.count(_ITEM_MIN[item] if isinstance(item, str) else item._bytes_min())
        return [_dec(r, item) for _ in range(n)]
    if isinstance(typ, type):
        struct_type: Any = typ
        return struct_type._decode_from(r)
    if typ == "header":
        return (r.str(), r.str())
    return getattr(r, "raw" if typ == "bytes" else "boolean" if typ == "bool" else typ)()


class Body:
    """A message body: a dataclass whose fields are listed in wire order."""

    OP: ClassVar[int] = 0
    _FIELDS: ClassVar[tuple[tuple[str, Any], ...]] = ()
    _APPENDED: ClassVar[int | None] = None  # index of the first appended field
    # Index of the first appended field that is written only when it or a
    # field after it is set (not zero or empty), as the protocol asks of
    # SUBSCRIBE's cohort and RECONCILE's cohorts.
    _WRITTEN_IF_SET: ClassVar[int | None] = None

    def _encode_into(self, out: bytearray) -> None:
        for i, (name, typ) in enumerate(self._FIELDS):
            if i == self._WRITTEN_IF_SET and not any(getattr(self, n) for n, _ in self._FIELDS[i:]):
                return
            try:
                _enc(out, typ, getattr(self, name))
            except InvalidArgumentError:
                raise
            except (TypeError, ValueError, AttributeError, OverflowError, UnicodeError) as e:
                raise InvalidArgumentError(name, str(e)) from None

    def encode(self) -> bytes:
        out = bytearray()
        self._encode_into(out)
        return bytes(out)

    @classmethod
    def _decode_from(cls, r: Reader) -> Any:
        vals: dict[str, Any] = {}
        for i, (name, typ) in enumerate(cls._FIELDS):
            if cls._APPENDED is not None and i >= cls._APPENDED and r.at_end():
                break  # an older peer: the appended fields it lacks keep their defaults
            r.field = name
            vals[name] = _dec(r, typ)
        return cls(**vals)

    @classmethod
    def _bytes_min(cls) -> int:
        return sum(_ITEM_MIN.get(t, 1) if isinstance(t, str) else 1 for _, t in cls._FIELDS)

    @classmethod
    def decode(cls, body: bytes) -> Any:
        return cls._decode_from(Reader(body))


def _body(op: int, fields: str, appended: int | None = None, written_if_set: int | None = None) -> Any:
    """Class decorator: attaches the op code and the wire field table.

    ``fields`` is "name:type name:type ..." in wire order; struct types are
    resolved by name from this module at first use. ``written_if_set`` (at
    or after ``appended``) is the index of the first field the encoder
    leaves out, with those after it, when none of them is set.
    """

    def wrap(cls: Any) -> Any:
        cls.OP = op
        cls._FIELD_SPEC = fields
        cls._APPENDED = appended
        cls._WRITTEN_IF_SET = written_if_set
        return cls

    return wrap


def _resolve() -> None:
    g = globals()
    for cls in list(g.values()):
        if isinstance(cls, type) and issubclass(cls, Body) and hasattr(cls, "_FIELD_SPEC"):
            out = []
            for part in cls._FIELD_SPEC.split():
                name, typ = part.split(":")
                if typ.startswith("list<"):
                    inner = typ[5:-1]
                    out.append((name, ("list", g.get(inner, inner))))
                else:
                    out.append((name, g.get(typ, typ)))
            cls._FIELDS = tuple(out)


# --- structs embedded in bodies ---------------------------------------------

@_body(0, "client_id:str owner_id:str token:bytes")
@dataclass
class ResumeIdentity(Body):
    """The session identity a client presents on reconnect (section 3)."""
    client_id: str = ""
    owner_id: str = ""
    token: bytes = b""


@_body(0, "frame_bytes_max:u32 body_bytes_max:u32 prefetch_max:u32 settle_batch_max:u32 "
          "publish_inflight_max:u32 subscriptions_max:u32")
@dataclass
class Limits(Body):
    """Limits the broker announces in HELLO_OK."""
    frame_bytes_max: int = 0
    body_bytes_max: int = 0
    prefetch_max: int = 0
    settle_batch_max: int = 0
    publish_inflight_max: int = 0
    subscriptions_max: int = 0


@_body(0, "sub_id:uvarint partition:u32 offset:uvarint lease_id:uvarint epoch:uvarint")
@dataclass
class LeaseRef(Body):
    """Names exactly one lease of one message (section 5.8)."""
    sub_id: int = 0
    partition: int = 0
    offset: int = 0
    lease_id: int = 0
    epoch: int = 0
    raw: bytes = field(default=b"", compare=False, repr=False)
    """The five fields as the DELIVER that named them encoded them, when it
    did: a settle sends these bytes instead of encoding them again."""


@_body(0, "sub_id:uvarint topic:str group:str partition:i32 ack_mode:u8 prefetch:u32")
@dataclass
class SubView(Body):
    """A subscription as RECONCILE describes it."""
    sub_id: int = 0
    topic: str = ""
    group: str = ""
    partition: int = 0
    ack_mode: int = 0
    prefetch: int = 0


@_body(0, "sub_id:uvarint cohort:str member:str")
@dataclass
class SubCohort(Body):
    """The cohort and member of one subscription, as RECONCILE lists them."""
    sub_id: int = 0
    cohort: str = ""
    member: str = ""


@_body(0, "action:u8 client_sub_id:uvarint server_sub_id:uvarint client:SubView server:SubView reason:str")
@dataclass
class ReconcileEntry(Body):
    """One decision of RECONCILE_RESULT."""
    action: int = 0
    client_sub_id: int = 0
    server_sub_id: int = 0
    client: SubView = field(default_factory=SubView)
    server: SubView = field(default_factory=SubView)
    reason: str = ""


@_body(0, "tag:uvarint lease:LeaseRef")
@dataclass
class InflightEntry(Body):
    """A delivery the client still holds, as INFLIGHT reports it."""
    tag: int = 0
    lease: LeaseRef = field(default_factory=LeaseRef)


# --- op bodies ----------------------------------------------------------------

@_body(HELLO, "protocol_version:u16 client_name:str client_version:str credentials:str resume:ResumeIdentity "
             "user:str", appended=5)
@dataclass
class Hello(Body):
    """HELLO (0x01). ``credentials`` is the password when ``user`` is set,
    otherwise a static token."""
    protocol_version: int = VERSION
    client_name: str = ""
    client_version: str = ""
    credentials: str = ""
    resume: ResumeIdentity = field(default_factory=ResumeIdentity)
    user: str = ""


@_body(HELLO_OK, "protocol_version:u16 server_version:str resume:ResumeIdentity outcome:u8 "
                 "server_generation:uvarint heartbeat_ms:u32 reconnect_grace_ms:u32 limits:Limits "
                 "cluster:bool", appended=8)
@dataclass
class HelloOK(Body):
    """HELLO_OK (0x02)."""
    protocol_version: int = VERSION
    server_version: str = ""
    resume: ResumeIdentity = field(default_factory=ResumeIdentity)
    outcome: int = 0
    server_generation: int = 0
    heartbeat_ms: int = 0
    reconnect_grace_ms: int = 0
    limits: Limits = field(default_factory=Limits)
    cluster: bool = False  # appended: the node runs in a cluster


@_body(PING, "")
@dataclass
class Ping(Body):
    """PING (0x03)."""


@_body(PONG, "")
@dataclass
class Pong(Body):
    """PONG (0x04)."""


@_body(ERROR, "code:u16 message:str fatal:bool owner:str", appended=3)
@dataclass
class ErrorBody(Body):
    """ERROR (0x05). owner (appended) names the owner's address of a not_owner error."""
    code: int = 0
    message: str = ""
    fatal: bool = False
    owner: str = ""


@_body(OK, "")
@dataclass
class Ok(Body):
    """OK (0x06)."""


@_body(DECLARE_QUEUE, "topic:str group:str partitions:u32 dead_letter_mode:u8 dead_letter_target:str "
                      "max_retries:i32 default_ttl_ms:varint lease_ms:varint")
@dataclass
class DeclareQueue(Body):
    """DECLARE_QUEUE (0x10)."""
    topic: str = ""
    group: str = ""
    partitions: int = 0
    dead_letter_mode: int = 0
    dead_letter_target: str = ""
    max_retries: int = -1
    default_ttl_ms: int = 0
    lease_ms: int = 0


@_body(DECLARE_OK, "partitions:u32 created:bool")
@dataclass
class DeclareOK(Body):
    """DECLARE_OK (0x11)."""
    partitions: int = 0
    created: bool = False


@_body(PUBLISH, "topic:str group:str partition:i32 key:bytes headers:list<header> content_type:str "
                "delay_ms:varint not_before_ms:varint ttl_ms:varint producer_id:str producer_seq:uvarint body:bytes "
                "producer_prev:uvarint", appended=12)
@dataclass
class Publish(Body):
    """PUBLISH (0x12)."""
    topic: str = ""
    group: str = ""
    partition: int = -1
    key: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    content_type: str = ""
    delay_ms: int = 0
    not_before_ms: int = 0
    ttl_ms: int = 0
    producer_id: str = ""
    producer_seq: int = 0
    body: bytes = b""
    # appended: the producer's publish this one must follow in its
    # partition; 0 asks for no order (docs/protocol.md 5.6). The client
    # sends 0.
    producer_prev: int = 0

    def _encode_into(self, out: bytearray) -> None:
        self.encode_head(out)
        put_uvarint(out, self.producer_seq)
        put_bytes(out, self.body)
        put_uvarint(out, self.producer_prev)

    def encode_head(self, out: bytearray) -> None:
        """Encodes the fields before producer_seq. The hot path of a
        publisher, written out; the field table above stays the reference
        and the wire vectors check both agree. The client checks every
        value before it gets here."""
        put_str(out, self.topic)
        put_str(out, self.group)
        _enc(out, "i32", self.partition)
        put_bytes(out, self.key)
        put_uvarint(out, len(self.headers))
        for k, v in self.headers:
            put_str(out, k)
            put_str(out, v)
        put_str(out, self.content_type)
        put_varint(out, self.delay_ms)
        put_varint(out, self.not_before_ms)
        put_varint(out, self.ttl_ms)
        put_str(out, self.producer_id)


@_body(PUBLISH_OK, "partition:u32 offset:uvarint duplicate:bool next:u32", appended=3, written_if_set=3)
@dataclass
class PublishOK(Body):
    """PUBLISH_OK (0x13). ``next`` is the broker's partition hint (1 +
    partition, 0 for none), where the client sends its next keyless publish
    to the queue."""
    partition: int = 0
    offset: int = 0
    duplicate: bool = False
    next: int = 0

    @classmethod
    def _decode_from(cls, r: Reader) -> Any:
        # The hot path of a publisher, written out.
        r.field = "publish_ok"
        ok = cls(r.u32(), r.uvarint(), r.boolean())
        if not r.at_end():
            ok.next = r.u32()
        return ok


@_body(DELETE_QUEUE, "topic:str group:str")
@dataclass
class DeleteQueue(Body):
    """DELETE_QUEUE (0x14)."""
    topic: str = ""
    group: str = ""


@_body(PURGE_QUEUE, "topic:str group:str")
@dataclass
class PurgeQueue(Body):
    """PURGE_QUEUE (0x15)."""
    topic: str = ""
    group: str = ""


@_body(PURGE_OK, "purged:uvarint")
@dataclass
class PurgeOK(Body):
    """PURGE_OK (0x16)."""
    purged: int = 0


@_body(SUBSCRIBE, "topic:str group:str partition:i32 ack_mode:u8 prefetch:u32 cohort:str member:str",
       appended=5, written_if_set=5)
@dataclass
class Subscribe(Body):
    """SUBSCRIBE (0x20). ``cohort`` and ``member`` (appended) are written
    only when one is set: a member of that cohort (section 5.7a)."""
    topic: str = ""
    group: str = ""
    partition: int = -1
    ack_mode: int = 0
    prefetch: int = 0
    cohort: str = ""
    member: str = ""


@_body(ASSIGNMENT, "sub_id:uvarint partition:u32 epoch:uvarint state:u8")
@dataclass
class Assignment(Body):
    """ASSIGNMENT (0x25, push): a partition assigned to (state 1) or revoked
    from (state 2) a cohort subscription; any other state is malformed."""
    sub_id: int = 0
    partition: int = 0
    epoch: int = 0
    state: int = 0

    @classmethod
    def _decode_from(cls, r: Reader) -> Any:
        m = super()._decode_from(r)
        if m.state not in (ASSIGNMENT_ASSIGNED, ASSIGNMENT_REVOKED):
            r.field = "state"
            raise r.fail("out of range")
        return m


@_body(SUBSCRIBE_OK, "sub_id:uvarint partitions:list<u32> prefetch:u32")
@dataclass
class SubscribeOK(Body):
    """SUBSCRIBE_OK (0x21)."""
    sub_id: int = 0
    partitions: list[int] = field(default_factory=list)
    prefetch: int = 0


@_body(UNSUBSCRIBE, "sub_id:uvarint")
@dataclass
class Unsubscribe(Body):
    """UNSUBSCRIBE (0x22)."""
    sub_id: int = 0


@_body(SUB_CLOSED, "sub_id:uvarint reason:u8 code:u16 message:str")
@dataclass
class SubClosed(Body):
    """SUB_CLOSED (0x23)."""
    sub_id: int = 0
    reason: int = 0
    code: int = 0
    message: str = ""


@_body(DELIVER, "sub_id:uvarint tag:uvarint partition:u32 offset:uvarint attempt:u32 published_at_ms:varint "
                "key:bytes headers:list<header> content_type:str body:bytes topic:str group:str "
                "lease_id:uvarint epoch:uvarint lease_ms:u32 assignment:uvarint", appended=12)
@dataclass
class Deliver(Body):
    """DELIVER (0x24)."""
    sub_id: int = 0
    tag: int = 0
    partition: int = 0
    offset: int = 0
    attempt: int = 0
    published_at_ms: int = 0
    key: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    content_type: str = ""
    body: bytes = b""
    topic: str = ""
    group: str = ""
    lease_id: int = 0
    epoch: int = 0
    lease_ms: int = 0
    assignment: int = 0
    """The partition's assignment epoch when the lease was granted (appended; 0
    while no cohort ever held the partition)."""
    lease_raw: bytes = field(default=b"", compare=False, repr=False)
    """sub_id, partition, offset, lease_id and epoch as encoded in this
    frame: the bytes of the lease_ref that names this delivery (LeaseRef.raw)."""

    @classmethod
    def _decode_from(cls, r: Reader) -> Any:
        return cls(*cls.fields(r))

    @staticmethod
    def fields(r: Reader) -> tuple[Any, ...]:
        """The fields in order (lease_raw last), as the constructor takes
        them: what a consumer needs without a Deliver object.

        The hot path of a consumer, written out field by field with the
        one-byte case of each uvarint inline; the field table above stays
        the reference, and the wire vectors and a test of random and
        truncated bodies check that both agree."""
        buf = r.buf
        if not isinstance(buf, bytes):
            buf = bytes(buf)
        end = len(buf)
        p = r.pos
        uv = _uvarint_at
        r.field = "deliver"
        try:
            s0 = p
            b = buf[p]
            if b < 0x80:
                sub_id = b
                p += 1
            else:
                sub_id, p = uv(buf, p, r)
            t0 = p
            b = buf[p]
            if b < 0x80:
                tag = b
                p += 1
            else:
                tag, p = uv(buf, p, r)
            s1 = p
            b = buf[p]
            if b < 0x80:
                partition = b
                p += 1
            else:
                partition, p = uv(buf, p, r)
            b = buf[p]
            if b < 0x80:
                offset = b
                p += 1
            else:
                offset, p = uv(buf, p, r)
            s2 = p
            b = buf[p]
            if b < 0x80:
                attempt = b
                p += 1
            else:
                attempt, p = uv(buf, p, r)
            if partition > U32_MAX or attempt > U32_MAX:
                raise r.fail("out of range")
            pub, p = uv(buf, p, r)
            pub = (pub >> 1) ^ -(pub & 1)
            n = buf[p]
            if n < 0x80:
                p += 1
            else:
                n, p = uv(buf, p, r)
            if n > end - p:
                raise r.fail("length beyond the body")
            key = buf[p:p + n]
            p += n
            nh = buf[p]
            if nh < 0x80:
                p += 1
            else:
                nh, p = uv(buf, p, r)
            headers: list[tuple[str, str]] = []
            if nh:
                if nh > LIST_ITEMS_MAX or 2 * nh > end - p:
                    raise r.fail("list longer than the body")
                kv: list[str] = []
                for _ in range(2 * nh):
                    n = buf[p]
                    if n < 0x80:
                        p += 1
                    else:
                        n, p = uv(buf, p, r)
                    if n > end - p:
                        raise r.fail("length beyond the body")
                    kv.append(buf[p:p + n].decode("utf-8"))
                    p += n
                headers = list(zip(kv[::2], kv[1::2]))
            n = buf[p]
            if n < 0x80:
                p += 1
            else:
                n, p = uv(buf, p, r)
            if n > end - p:
                raise r.fail("length beyond the body")
            content_type = buf[p:p + n].decode("utf-8") if n else ""
            p += n
            n = buf[p]
            if n < 0x80:
                p += 1
            else:
                n, p = uv(buf, p, r)
            if n > end - p:
                raise r.fail("length beyond the body")
            body = buf[p:p + n]
            p += n
            n = buf[p]
            if n < 0x80:
                p += 1
            else:
                n, p = uv(buf, p, r)
            if n > end - p:
                raise r.fail("length beyond the body")
            topic = buf[p:p + n].decode("utf-8")
            p += n
            n = buf[p]
            if n < 0x80:
                p += 1
            else:
                n, p = uv(buf, p, r)
            if n > end - p:
                raise r.fail("length beyond the body")
            group = buf[p:p + n].decode("utf-8") if n else ""
            p += n
        except IndexError:
            raise r.fail("truncated") from None
        except UnicodeDecodeError:
            raise r.fail("invalid UTF-8") from None
        lease_id = epoch = lease_ms = assignment = 0
        lease_raw = b""
        if p < end:
            r.field = "lease_id"
            s3 = p
            lease_id, p = uv(buf, p, r)
            if p < end:
                r.field = "epoch"
                if buf[p] < 0x80:
                    epoch = buf[p]
                    p += 1
                else:
                    epoch, p = uv(buf, p, r)
            # sub_id, then partition and offset (after the tag), then lease_id and epoch.
            lease_raw = buf[s0:t0] + buf[s1:s2] + buf[s3:p]
            if p < end:
                r.field = "lease_ms"
                if buf[p] < 0x80:
                    lease_ms = buf[p]
                    p += 1
                else:
                    lease_ms, p = uv(buf, p, r)
                    if lease_ms > U32_MAX:
                        raise r.fail("out of range")
                if p < end:
                    r.field = "assignment"
                    if buf[p] < 0x80:
                        assignment = buf[p]
                        p += 1
                    else:
                        assignment, p = uv(buf, p, r)
        r.pos = p
        return (sub_id, tag, partition, offset, attempt, pub, key, headers, content_type, body, topic, group,
                lease_id, epoch, lease_ms, assignment, lease_raw)


@_body(ACK, "tags:list<uvarint> delay_ms:varint leases:list<LeaseRef>", appended=2)
@dataclass
class Settle(Body):
    """ACK (0x30), NACK (0x31) and FAIL (0x32) share this body; ``kind`` is the op."""
    tags: list[int] = field(default_factory=list)
    delay_ms: int = 0
    leases: list[LeaseRef] = field(default_factory=list)
    kind: int = ACK
    leases_raw: list[bytes] = field(default_factory=list, compare=False, repr=False)
    """In place of ``leases``: each lease_ref already encoded (LeaseRef.raw)."""

    def _encode_into(self, out: bytearray) -> None:
        # The hot path of settles, written out; put_uvarint range-checks.
        for t in self.tags:
            _want_int(t)
        _want_int(self.delay_ms)
        try:
            put_uvarint(out, len(self.tags))
            for t in self.tags:
                put_uvarint(out, t)
            put_varint(out, self.delay_ms)
            if self.leases_raw:
                put_uvarint(out, len(self.leases_raw))
                out += b"".join(self.leases_raw)
                return
            put_uvarint(out, len(self.leases))
            for x in self.leases:
                if x.raw:
                    out += x.raw
                    continue
                if x.partition > U32_MAX:
                    raise ValueError(f"u32 out of range: {x.partition}")
                put_uvarint(out, x.sub_id)
                put_uvarint(out, x.partition)
                put_uvarint(out, x.offset)
                put_uvarint(out, x.lease_id)
                put_uvarint(out, x.epoch)
        except (TypeError, ValueError) as e:
            raise InvalidArgumentError("settle", str(e)) from None


@_body(EXTEND, "tags:list<uvarint> extend_ms:varint leases:list<LeaseRef>")
@dataclass
class Extend(Body):
    """EXTEND (0x34): renews the leases of deliveries the client holds to
    ``extend_ms`` from now; answered by SETTLE_RESULT. The layout of NACK
    with ``delay_ms`` replaced by ``extend_ms``."""
    tags: list[int] = field(default_factory=list)
    extend_ms: int = 0
    leases: list[LeaseRef] = field(default_factory=list)


@_body(SETTLE_RESULT, "codes:list<u16>")
@dataclass
class SettleResult(Body):
    """SETTLE_RESULT (0x33)."""
    codes: list[int] = field(default_factory=list)

    @classmethod
    def _decode_from(cls, r: Reader) -> Any:
        # Every code below 128 (all of them today) is one byte: a whole
        # result of ok codes is its bytes.
        r.field = "codes"
        n = r.count(1)
        chunk = r.buf[r.pos:r.pos + n]
        if len(chunk) == n and max(chunk, default=0) < 0x80:
            r.pos += n
            return cls(list(chunk))
        return cls([r.u16() for _ in range(n)])


@_body(GOING_AWAY, "deadline_ms:varint grace_ms:u32 reason:str redirect:str")
@dataclass
class GoingAway(Body):
    """GOING_AWAY (0x40)."""
    deadline_ms: int = 0
    grace_ms: int = 0
    reason: str = ""
    redirect: str = ""


@_body(RECONCILE, "policy:u8 subs:list<SubView> inflight_follows:bool cohorts:list<SubCohort>",
       appended=2, written_if_set=3)
@dataclass
class Reconcile(Body):
    """RECONCILE (0x41). ``cohorts`` (appended, written only when not empty)
    names the cohort and member of each listed subscription that has one."""
    policy: int = 0
    subs: list[SubView] = field(default_factory=list)
    inflight_follows: bool = False
    cohorts: list[SubCohort] = field(default_factory=list)


@_body(RECONCILE_RESULT, "entries:list<ReconcileEntry>")
@dataclass
class ReconcileResult(Body):
    """RECONCILE_RESULT (0x42)."""
    entries: list[ReconcileEntry] = field(default_factory=list)


@_body(END_SESSION, "")
@dataclass
class EndSession(Body):
    """END_SESSION (0x43)."""


@_body(INFLIGHT, "entries:list<InflightEntry>")
@dataclass
class Inflight(Body):
    """INFLIGHT (0x44)."""
    entries: list[InflightEntry] = field(default_factory=list)


@_body(INFLIGHT_RESULT, "stale:list<uvarint> resent:uvarint kept:uvarint")
@dataclass
class InflightResult(Body):
    """INFLIGHT_RESULT (0x45)."""
    stale: list[int] = field(default_factory=list)
    resent: int = 0
    kept: int = 0


@_body(0, "partition:u32 owner:str epoch:uvarint replicas:list<str>")
@dataclass
class PartitionMeta(Body):
    """One partition's owner and replicas, as METADATA_RESULT lists them."""
    partition: int = 0
    owner: str = ""
    epoch: int = 0
    replicas: list[str] = field(default_factory=list)


@_body(METADATA, "topic:str group:str")
@dataclass
class Metadata(Body):
    """METADATA (0x50)."""
    topic: str = ""
    group: str = ""


@_body(METADATA_RESULT, "cluster:bool partitions:list<PartitionMeta>")
@dataclass
class MetadataResult(Body):
    """METADATA_RESULT (0x51)."""
    cluster: bool = False
    partitions: list[PartitionMeta] = field(default_factory=list)


_resolve()

_OP_BODIES: tuple[type[Body], ...] = (
    Hello, HelloOK, Ping, Pong, ErrorBody, Ok, DeclareQueue, DeclareOK, Publish, PublishOK, DeleteQueue, PurgeQueue,
    PurgeOK, Subscribe, SubscribeOK, Unsubscribe, SubClosed, Deliver, Assignment, Extend, SettleResult, GoingAway, Reconcile,
    ReconcileResult, EndSession, Inflight, InflightResult, Metadata, MetadataResult)
BODIES: dict[int, type[Body]] = {c.OP: c for c in _OP_BODIES}
BODIES[ACK] = Settle
BODIES[NACK] = Settle
BODIES[FAIL] = Settle

OP_NAMES = {
    HELLO: "HELLO", HELLO_OK: "HELLO_OK", PING: "PING", PONG: "PONG", ERROR: "ERROR", OK: "OK",
    DECLARE_QUEUE: "DECLARE_QUEUE", DECLARE_OK: "DECLARE_OK", PUBLISH: "PUBLISH", PUBLISH_OK: "PUBLISH_OK",
    DELETE_QUEUE: "DELETE_QUEUE", PURGE_QUEUE: "PURGE_QUEUE", PURGE_OK: "PURGE_OK", SUBSCRIBE: "SUBSCRIBE",
    SUBSCRIBE_OK: "SUBSCRIBE_OK", UNSUBSCRIBE: "UNSUBSCRIBE", SUB_CLOSED: "SUB_CLOSED", DELIVER: "DELIVER",
    ASSIGNMENT: "ASSIGNMENT",
    ACK: "ACK", NACK: "NACK", FAIL: "FAIL", SETTLE_RESULT: "SETTLE_RESULT", EXTEND: "EXTEND", GOING_AWAY: "GOING_AWAY",
    RECONCILE: "RECONCILE", RECONCILE_RESULT: "RECONCILE_RESULT", END_SESSION: "END_SESSION",
    INFLIGHT: "INFLIGHT", INFLIGHT_RESULT: "INFLIGHT_RESULT", METADATA: "METADATA", METADATA_RESULT: "METADATA_RESULT",
}


def op_of(body: Body) -> int:
    """The op code a body is sent with (settles carry theirs in ``kind``)."""
    return body.kind if isinstance(body, Settle) else body.OP


def encode_frame(body: Body, req_id: int, flags: int = 0) -> bytes:
    """One whole frame, length prefix included."""
    payload = body.encode()
    head = struct.pack(">IBBHQ", HEADER_BYTES + len(payload), VERSION, op_of(body), flags, req_id)
    return head + payload


def publish_frame(req_id: int, head: bytes, seq: int, data: bytes, flags: int = 0, prev: int = 0) -> bytes:
    """A PUBLISH frame from the encoded fields before producer_seq (see
    Publish.encode_head), the sequence, the message body and producer_prev:
    the same bytes encode_frame makes of the whole Publish."""
    out = bytearray(struct.pack(">IBBHQ", 0, VERSION, PUBLISH, flags, req_id))
    out += head
    put_uvarint(out, seq)
    put_bytes(out, data)
    put_uvarint(out, prev)
    struct.pack_into(">I", out, 0, len(out) - 4)
    return bytes(out)


@dataclass
class Frame:
    """A frame as read off the wire, body still encoded."""
    op: int
    flags: int
    req_id: int
    body: bytes
    ver: int = VERSION


_HEADER = struct.Struct(">IBBHQ")


def frame_head(length: int, op: int, flags: int, req_id: int) -> bytes:
    """The 16 bytes before a body: ``length`` counts the 12 after the prefix plus the body."""
    return _HEADER.pack(length, VERSION, op, flags, req_id)


def parse_header(head: bytes, frame_bytes_max: int, at: int = 0) -> tuple[int, int, int, int, int]:
    """Checks a frame's 16 header bytes (at ``at`` in ``head``); returns
    (body_len, ver, op, flags, req_id)."""
    length, ver, op, flags, req_id = _HEADER.unpack_from(head, at)
    if length < HEADER_BYTES:
        raise ProtocolError(f"bad frame: length {length} below the header size")
    if length + 4 > frame_bytes_max:
        raise ProtocolError(f"frame of {length + 4} bytes exceeds the limit of {frame_bytes_max}")
    if ver != VERSION:
        raise ProtocolError(f"bad frame: protocol version {ver}")
    return length - HEADER_BYTES, ver, op, flags, req_id


def split_frame(data: bytes, frame_bytes_max: int = FRAME_BYTES_DEFAULT) -> Frame:
    """Parses one whole frame held in ``data`` (used by tests and the vectors)."""
    if len(data) < 4 + HEADER_BYTES:
        raise ProtocolError("bad frame: shorter than its header")
    n, ver, op, flags, req_id = parse_header(data[:16], frame_bytes_max)
    if len(data) != 16 + n:
        raise ProtocolError("bad frame: length prefix does not match the data")
    return Frame(op, flags, req_id, bytes(data[16:]), ver)


def decode_body(op: int, body: bytes) -> Body:
    """Decodes the body of an op; an unknown op or bad body is a ProtocolError."""
    cls = BODIES.get(op)
    if cls is None:
        raise ProtocolError(f"unknown op 0x{op:02x}")
    msg: Body = cls.decode(body)
    if isinstance(msg, Settle):
        msg.kind = op
    return msg


def as_dict(body: Body) -> dict[str, Any]:
    """The body's fields as plain data (for tests and logs)."""
    return dataclasses.asdict(body)
