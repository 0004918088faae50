//! Encoder and decoder of the Sinew wire protocol, version 1 (docs/protocol.md).
//!
//! Every frame is a big-endian `u32` length (the 12 header bytes after it plus
//! the body), the version byte, the op byte, `u16` flags, a `u64` request id and
//! the body. Each body is a fixed sequence of fields in wire order; fields that
//! were appended to an op after it shipped may be absent on decode, and bytes
//! after the known fields are ignored (protocol section 2, "Body evolution").

use std::fmt;

/// The protocol version this crate speaks.
pub const VERSION: u8 = 1;
/// Header bytes after the length prefix, before the body.
pub const HEADER_BYTES: usize = 12;
/// Frame bound before `HELLO_OK` announces `frame_bytes_max`.
pub const FRAME_BYTES_DEFAULT: usize = 1 << 20;
/// The `NO_REPLY` flag bit.
pub const FLAG_NO_REPLY: u16 = 0x0001;
/// A decoded list never claims more items than this.
const LIST_ITEMS_MAX: u64 = 1 << 20;

/// Operation codes (protocol section 4).
#[allow(missing_docs)]
pub mod op {
    pub const HELLO: u8 = 0x01;
    pub const HELLO_OK: u8 = 0x02;
    pub const PING: u8 = 0x03;
    pub const PONG: u8 = 0x04;
    pub const ERROR: u8 = 0x05;
    pub const OK: u8 = 0x06;
    pub const DECLARE_QUEUE: u8 = 0x10;
    pub const DECLARE_OK: u8 = 0x11;
    pub const PUBLISH: u8 = 0x12;
    pub const PUBLISH_OK: u8 = 0x13;
    pub const DELETE_QUEUE: u8 = 0x14;
    pub const PURGE_QUEUE: u8 = 0x15;
    pub const PURGE_OK: u8 = 0x16;
    pub const SUBSCRIBE: u8 = 0x20;
    pub const SUBSCRIBE_OK: u8 = 0x21;
    pub const UNSUBSCRIBE: u8 = 0x22;
    pub const SUB_CLOSED: u8 = 0x23;
    pub const DELIVER: u8 = 0x24;
    pub const ASSIGNMENT: u8 = 0x25;
    pub const ACK: u8 = 0x30;
    pub const NACK: u8 = 0x31;
    pub const FAIL: u8 = 0x32;
    pub const SETTLE_RESULT: u8 = 0x33;
    pub const EXTEND: u8 = 0x34;
    pub const GOING_AWAY: u8 = 0x40;
    pub const RECONCILE: u8 = 0x41;
    pub const RECONCILE_RESULT: u8 = 0x42;
    pub const END_SESSION: u8 = 0x43;
    pub const INFLIGHT: u8 = 0x44;
    pub const INFLIGHT_RESULT: u8 = 0x45;
    pub const METADATA: u8 = 0x50;
    pub const METADATA_RESULT: u8 = 0x51;
}

/// A malformed frame or field: the broker's `bad_frame`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub String);

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "bad frame: {}", self.0)
    }
}

impl std::error::Error for WireError {}

type Result<T> = std::result::Result<T, WireError>;

// --- primitive encoders ------------------------------------------------------

/// Appends an unsigned LEB128 varint.
pub fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends a zig-zag signed varint.
pub fn put_varint(out: &mut Vec<u8>, v: i64) {
    put_uvarint(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// Appends a length-prefixed byte string.
pub fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_uvarint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Appends a length-prefixed UTF-8 string.
pub fn put_str(out: &mut Vec<u8>, s: &str) {
    put_bytes(out, s.as_bytes());
}

fn put_bool(out: &mut Vec<u8>, b: bool) {
    out.push(b as u8);
}

// --- reader --------------------------------------------------------------------

/// Reads the primitive fields of one body.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    field: &'static str,
}

impl<'a> Reader<'a> {
    /// A reader over one body.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0, field: "" }
    }

    fn fail(&self, why: &str) -> WireError {
        WireError(format!("field {}: {}", self.field, why))
    }

    fn at(&mut self, field: &'static str) -> &mut Self {
        self.field = field;
        self
    }

    fn at_end(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn uvarint(&mut self) -> Result<u64> {
        let mut v: u64 = 0;
        let mut shift = 0u32;
        for i in 0..10 {
            let b = match self.buf.get(self.pos) {
                Some(b) => *b,
                None => return Err(self.fail("truncated")),
            };
            self.pos += 1;
            if i == 9 && b > 1 {
                return Err(self.fail("uvarint overflows 64 bits"));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
            shift += 7;
        }
        Err(self.fail("uvarint overflows 64 bits"))
    }

    fn varint(&mut self) -> Result<i64> {
        let u = self.uvarint()?;
        Ok(((u >> 1) as i64) ^ -((u & 1) as i64))
    }

    fn u8(&mut self) -> Result<u8> {
        match self.buf.get(self.pos) {
            Some(b) => {
                self.pos += 1;
                Ok(*b)
            }
            None => Err(self.fail("truncated")),
        }
    }

    fn boolean(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.fail("bool is not 0 or 1")),
        }
    }

    fn u16(&mut self) -> Result<u16> {
        let v = self.uvarint()?;
        u16::try_from(v).map_err(|_| self.fail("out of range"))
    }

    fn u32(&mut self) -> Result<u32> {
        let v = self.uvarint()?;
        u32::try_from(v).map_err(|_| self.fail("out of range"))
    }

    fn i32(&mut self) -> Result<i32> {
        let v = self.varint()?;
        i32::try_from(v).map_err(|_| self.fail("out of range"))
    }

    fn raw(&mut self) -> Result<&'a [u8]> {
        let n = self.uvarint()?;
        if n > (self.buf.len() - self.pos) as u64 {
            return Err(self.fail("length beyond the body"));
        }
        let b = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(b)
    }

    fn bytes(&mut self) -> Result<Vec<u8>> {
        Ok(self.raw()?.to_vec())
    }

    fn string(&mut self) -> Result<String> {
        let b = self.raw()?;
        match std::str::from_utf8(b) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(self.fail("invalid UTF-8")),
        }
    }

    fn count(&mut self, item_bytes_min: u64) -> Result<usize> {
        let n = self.uvarint()?;
        // Each item takes at least item_bytes_min bytes: a count the body
        // cannot hold is malformed before anything is allocated.
        if n > LIST_ITEMS_MAX || n.saturating_mul(item_bytes_min) > (self.buf.len() - self.pos) as u64 {
            return Err(self.fail("list longer than the body"));
        }
        Ok(n as usize)
    }

    fn headers(&mut self) -> Result<Vec<(String, String)>> {
        let n = self.count(2)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let k = self.string()?;
            let v = self.string()?;
            out.push((k, v));
        }
        Ok(out)
    }

    fn uvarints(&mut self) -> Result<Vec<u64>> {
        let n = self.count(1)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.uvarint()?);
        }
        Ok(out)
    }

    fn list<T>(&mut self, min: u64, f: impl Fn(&mut Self) -> Result<T>) -> Result<Vec<T>> {
        let n = self.count(min)?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(f(self)?);
        }
        Ok(out)
    }
}

fn put_headers(out: &mut Vec<u8>, hs: &[(String, String)]) {
    put_uvarint(out, hs.len() as u64);
    for (k, v) in hs {
        put_str(out, k);
        put_str(out, v);
    }
}

fn put_uvarints(out: &mut Vec<u8>, vs: &[u64]) {
    put_uvarint(out, vs.len() as u64);
    for v in vs {
        put_uvarint(out, *v);
    }
}

// --- structs embedded in bodies -------------------------------------------------

/// The session identity a client presents on reconnect (protocol section 3).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResumeIdentity {
    pub client_id: String,
    pub owner_id: String,
    pub token: Vec<u8>,
}

impl ResumeIdentity {
    fn encode(&self, out: &mut Vec<u8>) {
        put_str(out, &self.client_id);
        put_str(out, &self.owner_id);
        put_bytes(out, &self.token);
    }
    fn decode(r: &mut Reader) -> Result<Self> {
        Ok(ResumeIdentity {
            client_id: r.at("resume.client_id").string()?,
            owner_id: r.at("resume.owner_id").string()?,
            token: r.at("resume.token").bytes()?,
        })
    }
}

/// Limits the broker announces in `HELLO_OK`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    pub frame_bytes_max: u32,
    pub body_bytes_max: u32,
    pub prefetch_max: u32,
    pub settle_batch_max: u32,
    pub publish_inflight_max: u32,
    pub subscriptions_max: u32,
}

/// Names exactly one lease of one message (protocol section 5.8).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseRef {
    pub sub_id: u64,
    pub partition: u32,
    pub offset: u64,
    pub lease_id: u64,
    pub epoch: u64,
}

impl LeaseRef {
    /// Appends the five fields.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_uvarint(out, self.sub_id);
        put_uvarint(out, u64::from(self.partition));
        put_uvarint(out, self.offset);
        put_uvarint(out, self.lease_id);
        put_uvarint(out, self.epoch);
    }
    fn decode(r: &mut Reader) -> Result<Self> {
        Ok(LeaseRef {
            sub_id: r.at("sub_id").uvarint()?,
            partition: r.at("partition").u32()?,
            offset: r.at("offset").uvarint()?,
            lease_id: r.at("lease_id").uvarint()?,
            epoch: r.at("epoch").uvarint()?,
        })
    }
}

/// A subscription as `RECONCILE` describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubView {
    pub sub_id: u64,
    pub topic: String,
    pub group: String,
    pub partition: i32,
    pub ack_mode: u8,
    pub prefetch: u32,
}

impl SubView {
    fn encode(&self, out: &mut Vec<u8>) {
        put_uvarint(out, self.sub_id);
        put_str(out, &self.topic);
        put_str(out, &self.group);
        put_varint(out, i64::from(self.partition));
        out.push(self.ack_mode);
        put_uvarint(out, u64::from(self.prefetch));
    }
    fn decode(r: &mut Reader) -> Result<Self> {
        Ok(SubView {
            sub_id: r.at("sub_id").uvarint()?,
            topic: r.at("topic").string()?,
            group: r.at("group").string()?,
            partition: r.at("partition").i32()?,
            ack_mode: r.at("ack_mode").u8()?,
            prefetch: r.at("prefetch").u32()?,
        })
    }
}

/// The cohort and member of one subscription, as `RECONCILE` lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubCohort {
    pub sub_id: u64,
    pub cohort: String,
    pub member: String,
}

/// One decision of `RECONCILE_RESULT`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileEntry {
    pub action: u8,
    pub client_sub_id: u64,
    pub server_sub_id: u64,
    pub client: SubView,
    pub server: SubView,
    pub reason: String,
}

/// A delivery the client still holds, as `INFLIGHT` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InflightEntry {
    pub tag: u64,
    pub lease: LeaseRef,
}

/// One partition's owner and replicas, as `METADATA_RESULT` lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionMeta {
    pub partition: u32,
    pub owner: String,
    pub epoch: u64,
    pub replicas: Vec<String>,
}

// --- op bodies -------------------------------------------------------------------

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hello {
    pub protocol_version: u16,
    pub client_name: String,
    pub client_version: String,
    pub credentials: String,
    pub resume: ResumeIdentity,
    pub user: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HelloOk {
    pub protocol_version: u16,
    pub server_version: String,
    pub resume: ResumeIdentity,
    pub outcome: u8,
    pub server_generation: u64,
    pub heartbeat_ms: u32,
    pub reconnect_grace_ms: u32,
    pub limits: Limits,
    pub cluster: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorBody {
    pub code: u16,
    pub message: String,
    pub fatal: bool,
    pub owner: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeclareQueue {
    pub topic: String,
    pub group: String,
    pub partitions: u32,
    pub dead_letter_mode: u8,
    pub dead_letter_target: String,
    pub max_retries: i32,
    pub default_ttl_ms: i64,
    pub lease_ms: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeclareOk {
    pub partitions: u32,
    pub created: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Publish {
    pub topic: String,
    pub group: String,
    pub partition: i32,
    pub key: Vec<u8>,
    pub headers: Vec<(String, String)>,
    pub content_type: String,
    pub delay_ms: i64,
    pub not_before_ms: i64,
    pub ttl_ms: i64,
    pub producer_id: String,
    pub producer_seq: u64,
    pub body: Vec<u8>,
    pub producer_prev: u64,
}

impl Publish {
    /// Encodes the fields before `producer_seq`: what a producer repeats.
    pub fn encode_head(&self, out: &mut Vec<u8>) {
        put_str(out, &self.topic);
        put_str(out, &self.group);
        put_varint(out, i64::from(self.partition));
        put_bytes(out, &self.key);
        put_headers(out, &self.headers);
        put_str(out, &self.content_type);
        put_varint(out, self.delay_ms);
        put_varint(out, self.not_before_ms);
        put_varint(out, self.ttl_ms);
        put_str(out, &self.producer_id);
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishOk {
    pub partition: u32,
    pub offset: u64,
    pub duplicate: bool,
    pub next: u32,
}

/// The body of `DELETE_QUEUE`, `PURGE_QUEUE` and `METADATA`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueRef {
    pub topic: String,
    pub group: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subscribe {
    pub topic: String,
    pub group: String,
    pub partition: i32,
    pub ack_mode: u8,
    pub prefetch: u32,
    pub cohort: String,
    pub member: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscribeOk {
    pub sub_id: u64,
    pub partitions: Vec<u32>,
    pub prefetch: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubClosed {
    pub sub_id: u64,
    pub reason: u8,
    pub code: u16,
    pub message: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deliver {
    pub sub_id: u64,
    pub tag: u64,
    pub partition: u32,
    pub offset: u64,
    pub attempt: u32,
    pub published_at_ms: i64,
    pub key: Vec<u8>,
    pub headers: Vec<(String, String)>,
    pub content_type: String,
    pub body: Vec<u8>,
    pub topic: String,
    pub group: String,
    pub lease_id: u64,
    pub epoch: u64,
    pub lease_ms: u32,
    pub assignment: u64,
}

impl Deliver {
    /// The delivery's lease reference.
    pub fn lease(&self) -> LeaseRef {
        LeaseRef {
            sub_id: self.sub_id,
            partition: self.partition,
            offset: self.offset,
            lease_id: self.lease_id,
            epoch: self.epoch,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assignment {
    pub sub_id: u64,
    pub partition: u32,
    pub epoch: u64,
    pub state: u8,
}

/// The body of `ACK`, `NACK` and `FAIL`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settle {
    pub tags: Vec<u64>,
    pub delay_ms: i64,
    pub leases: Vec<LeaseRef>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extend {
    pub tags: Vec<u64>,
    pub extend_ms: i64,
    pub leases: Vec<LeaseRef>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SettleResult {
    pub codes: Vec<u16>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GoingAway {
    pub deadline_ms: i64,
    pub grace_ms: u32,
    pub reason: String,
    pub redirect: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconcile {
    pub policy: u8,
    pub subs: Vec<SubView>,
    pub inflight_follows: bool,
    pub cohorts: Vec<SubCohort>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReconcileResult {
    pub entries: Vec<ReconcileEntry>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inflight {
    pub entries: Vec<InflightEntry>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InflightResult {
    pub stale: Vec<u64>,
    pub resent: u64,
    pub kept: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetadataResult {
    pub cluster: bool,
    pub partitions: Vec<PartitionMeta>,
}

/// A decoded body, one variant per op.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Body {
    Hello(Hello),
    HelloOk(HelloOk),
    Ping,
    Pong,
    Error(ErrorBody),
    Ok,
    DeclareQueue(DeclareQueue),
    DeclareOk(DeclareOk),
    Publish(Publish),
    PublishOk(PublishOk),
    DeleteQueue(QueueRef),
    PurgeQueue(QueueRef),
    PurgeOk(u64),
    Subscribe(Subscribe),
    SubscribeOk(SubscribeOk),
    Unsubscribe(u64),
    SubClosed(SubClosed),
    Deliver(Deliver),
    Assignment(Assignment),
    Ack(Settle),
    Nack(Settle),
    Fail(Settle),
    SettleResult(SettleResult),
    Extend(Extend),
    GoingAway(GoingAway),
    Reconcile(Reconcile),
    ReconcileResult(ReconcileResult),
    EndSession,
    Inflight(Inflight),
    InflightResult(InflightResult),
    Metadata(QueueRef),
    MetadataResult(MetadataResult),
}

fn enc_settle(out: &mut Vec<u8>, tags: &[u64], delay: i64, leases: &[LeaseRef]) {
    put_uvarints(out, tags);
    put_varint(out, delay);
    put_uvarint(out, leases.len() as u64);
    for l in leases {
        l.encode(out);
    }
}

fn dec_leases(r: &mut Reader) -> Result<Vec<LeaseRef>> {
    r.at("leases").list(5, LeaseRef::decode)
}

impl Body {
    /// The op code this body is sent with.
    pub fn op(&self) -> u8 {
        use op::*;
        match self {
            Body::Hello(_) => HELLO,
            Body::HelloOk(_) => HELLO_OK,
            Body::Ping => PING,
            Body::Pong => PONG,
            Body::Error(_) => ERROR,
            Body::Ok => OK,
            Body::DeclareQueue(_) => DECLARE_QUEUE,
            Body::DeclareOk(_) => DECLARE_OK,
            Body::Publish(_) => PUBLISH,
            Body::PublishOk(_) => PUBLISH_OK,
            Body::DeleteQueue(_) => DELETE_QUEUE,
            Body::PurgeQueue(_) => PURGE_QUEUE,
            Body::PurgeOk(_) => PURGE_OK,
            Body::Subscribe(_) => SUBSCRIBE,
            Body::SubscribeOk(_) => SUBSCRIBE_OK,
            Body::Unsubscribe(_) => UNSUBSCRIBE,
            Body::SubClosed(_) => SUB_CLOSED,
            Body::Deliver(_) => DELIVER,
            Body::Assignment(_) => ASSIGNMENT,
            Body::Ack(_) => ACK,
            Body::Nack(_) => NACK,
            Body::Fail(_) => FAIL,
            Body::SettleResult(_) => SETTLE_RESULT,
            Body::Extend(_) => EXTEND,
            Body::GoingAway(_) => GOING_AWAY,
            Body::Reconcile(_) => RECONCILE,
            Body::ReconcileResult(_) => RECONCILE_RESULT,
            Body::EndSession => END_SESSION,
            Body::Inflight(_) => INFLIGHT,
            Body::InflightResult(_) => INFLIGHT_RESULT,
            Body::Metadata(_) => METADATA,
            Body::MetadataResult(_) => METADATA_RESULT,
        }
    }

    /// Appends the encoded body.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Body::Hello(h) => {
                put_uvarint(out, u64::from(h.protocol_version));
                put_str(out, &h.client_name);
                put_str(out, &h.client_version);
                put_str(out, &h.credentials);
                h.resume.encode(out);
                put_str(out, &h.user);
            }
            Body::HelloOk(h) => {
                put_uvarint(out, u64::from(h.protocol_version));
                put_str(out, &h.server_version);
                h.resume.encode(out);
                out.push(h.outcome);
                put_uvarint(out, h.server_generation);
                put_uvarint(out, u64::from(h.heartbeat_ms));
                put_uvarint(out, u64::from(h.reconnect_grace_ms));
                let l = &h.limits;
                for v in [
                    l.frame_bytes_max,
                    l.body_bytes_max,
                    l.prefetch_max,
                    l.settle_batch_max,
                    l.publish_inflight_max,
                    l.subscriptions_max,
                ] {
                    put_uvarint(out, u64::from(v));
                }
                put_bool(out, h.cluster);
            }
            Body::Ping | Body::Pong | Body::Ok | Body::EndSession => {}
            Body::Error(e) => {
                put_uvarint(out, u64::from(e.code));
                put_str(out, &e.message);
                put_bool(out, e.fatal);
                put_str(out, &e.owner);
            }
            Body::DeclareQueue(d) => {
                put_str(out, &d.topic);
                put_str(out, &d.group);
                put_uvarint(out, u64::from(d.partitions));
                out.push(d.dead_letter_mode);
                put_str(out, &d.dead_letter_target);
                put_varint(out, i64::from(d.max_retries));
                put_varint(out, d.default_ttl_ms);
                put_varint(out, d.lease_ms);
            }
            Body::DeclareOk(d) => {
                put_uvarint(out, u64::from(d.partitions));
                put_bool(out, d.created);
            }
            Body::Publish(p) => {
                p.encode_head(out);
                put_uvarint(out, p.producer_seq);
                put_bytes(out, &p.body);
                put_uvarint(out, p.producer_prev);
            }
            Body::PublishOk(p) => {
                put_uvarint(out, u64::from(p.partition));
                put_uvarint(out, p.offset);
                put_bool(out, p.duplicate);
                if p.next != 0 {
                    put_uvarint(out, u64::from(p.next));
                }
            }
            Body::DeleteQueue(q) | Body::PurgeQueue(q) | Body::Metadata(q) => {
                put_str(out, &q.topic);
                put_str(out, &q.group);
            }
            Body::PurgeOk(n) => put_uvarint(out, *n),
            Body::Subscribe(s) => {
                put_str(out, &s.topic);
                put_str(out, &s.group);
                put_varint(out, i64::from(s.partition));
                out.push(s.ack_mode);
                put_uvarint(out, u64::from(s.prefetch));
                if !s.cohort.is_empty() || !s.member.is_empty() {
                    put_str(out, &s.cohort);
                    put_str(out, &s.member);
                }
            }
            Body::SubscribeOk(s) => {
                put_uvarint(out, s.sub_id);
                put_uvarint(out, s.partitions.len() as u64);
                for p in &s.partitions {
                    put_uvarint(out, u64::from(*p));
                }
                put_uvarint(out, u64::from(s.prefetch));
            }
            Body::Unsubscribe(id) => put_uvarint(out, *id),
            Body::SubClosed(s) => {
                put_uvarint(out, s.sub_id);
                out.push(s.reason);
                put_uvarint(out, u64::from(s.code));
                put_str(out, &s.message);
            }
            Body::Deliver(d) => {
                put_uvarint(out, d.sub_id);
                put_uvarint(out, d.tag);
                put_uvarint(out, u64::from(d.partition));
                put_uvarint(out, d.offset);
                put_uvarint(out, u64::from(d.attempt));
                put_varint(out, d.published_at_ms);
                put_bytes(out, &d.key);
                put_headers(out, &d.headers);
                put_str(out, &d.content_type);
                put_bytes(out, &d.body);
                put_str(out, &d.topic);
                put_str(out, &d.group);
                put_uvarint(out, d.lease_id);
                put_uvarint(out, d.epoch);
                put_uvarint(out, u64::from(d.lease_ms));
                put_uvarint(out, d.assignment);
            }
            Body::Assignment(a) => {
                put_uvarint(out, a.sub_id);
                put_uvarint(out, u64::from(a.partition));
                put_uvarint(out, a.epoch);
                out.push(a.state);
            }
            Body::Ack(s) | Body::Nack(s) | Body::Fail(s) => enc_settle(out, &s.tags, s.delay_ms, &s.leases),
            Body::Extend(e) => enc_settle(out, &e.tags, e.extend_ms, &e.leases),
            Body::SettleResult(s) => {
                put_uvarint(out, s.codes.len() as u64);
                for c in &s.codes {
                    put_uvarint(out, u64::from(*c));
                }
            }
            Body::GoingAway(g) => {
                put_varint(out, g.deadline_ms);
                put_uvarint(out, u64::from(g.grace_ms));
                put_str(out, &g.reason);
                put_str(out, &g.redirect);
            }
            Body::Reconcile(rc) => {
                out.push(rc.policy);
                put_uvarint(out, rc.subs.len() as u64);
                for s in &rc.subs {
                    s.encode(out);
                }
                put_bool(out, rc.inflight_follows);
                if !rc.cohorts.is_empty() {
                    put_uvarint(out, rc.cohorts.len() as u64);
                    for c in &rc.cohorts {
                        put_uvarint(out, c.sub_id);
                        put_str(out, &c.cohort);
                        put_str(out, &c.member);
                    }
                }
            }
            Body::ReconcileResult(rr) => {
                put_uvarint(out, rr.entries.len() as u64);
                for e in &rr.entries {
                    out.push(e.action);
                    put_uvarint(out, e.client_sub_id);
                    put_uvarint(out, e.server_sub_id);
                    e.client.encode(out);
                    e.server.encode(out);
                    put_str(out, &e.reason);
                }
            }
            Body::Inflight(i) => {
                put_uvarint(out, i.entries.len() as u64);
                for e in &i.entries {
                    put_uvarint(out, e.tag);
                    e.lease.encode(out);
                }
            }
            Body::InflightResult(i) => {
                put_uvarints(out, &i.stale);
                put_uvarint(out, i.resent);
                put_uvarint(out, i.kept);
            }
            Body::MetadataResult(m) => {
                put_bool(out, m.cluster);
                put_uvarint(out, m.partitions.len() as u64);
                for p in &m.partitions {
                    put_uvarint(out, u64::from(p.partition));
                    put_str(out, &p.owner);
                    put_uvarint(out, p.epoch);
                    put_uvarint(out, p.replicas.len() as u64);
                    for x in &p.replicas {
                        put_str(out, x);
                    }
                }
            }
        }
    }

    /// Decodes the body of `op`.
    pub fn decode(op_code: u8, body: &[u8]) -> Result<Body> {
        use op::*;
        let mut r = Reader::new(body);
        let r = &mut r;
        let b = match op_code {
            HELLO => {
                let mut h = Hello {
                    protocol_version: r.at("protocol_version").u16()?,
                    client_name: r.at("client_name").string()?,
                    client_version: r.at("client_version").string()?,
                    credentials: r.at("credentials").string()?,
                    resume: ResumeIdentity::decode(r)?,
                    user: String::new(),
                };
                if !r.at_end() {
                    h.user = r.at("user").string()?;
                }
                Body::Hello(h)
            }
            HELLO_OK => {
                let mut h = HelloOk {
                    protocol_version: r.at("protocol_version").u16()?,
                    server_version: r.at("server_version").string()?,
                    resume: ResumeIdentity::decode(r)?,
                    outcome: r.at("outcome").u8()?,
                    server_generation: r.at("server_generation").uvarint()?,
                    heartbeat_ms: r.at("heartbeat_ms").u32()?,
                    reconnect_grace_ms: r.at("reconnect_grace_ms").u32()?,
                    limits: Limits {
                        frame_bytes_max: r.at("frame_bytes_max").u32()?,
                        body_bytes_max: r.at("body_bytes_max").u32()?,
                        prefetch_max: r.at("prefetch_max").u32()?,
                        settle_batch_max: r.at("settle_batch_max").u32()?,
                        publish_inflight_max: r.at("publish_inflight_max").u32()?,
                        subscriptions_max: r.at("subscriptions_max").u32()?,
                    },
                    cluster: false,
                };
                if !r.at_end() {
                    h.cluster = r.at("cluster").boolean()?;
                }
                Body::HelloOk(h)
            }
            PING => Body::Ping,
            PONG => Body::Pong,
            OK => Body::Ok,
            END_SESSION => Body::EndSession,
            ERROR => {
                let mut e = ErrorBody {
                    code: r.at("code").u16()?,
                    message: r.at("message").string()?,
                    fatal: r.at("fatal").boolean()?,
                    owner: String::new(),
                };
                if !r.at_end() {
                    e.owner = r.at("owner").string()?;
                }
                Body::Error(e)
            }
            DECLARE_QUEUE => Body::DeclareQueue(DeclareQueue {
                topic: r.at("topic").string()?,
                group: r.at("group").string()?,
                partitions: r.at("partitions").u32()?,
                dead_letter_mode: r.at("dead_letter_mode").u8()?,
                dead_letter_target: r.at("dead_letter_target").string()?,
                max_retries: r.at("max_retries").i32()?,
                default_ttl_ms: r.at("default_ttl_ms").varint()?,
                lease_ms: r.at("lease_ms").varint()?,
            }),
            DECLARE_OK => Body::DeclareOk(DeclareOk {
                partitions: r.at("partitions").u32()?,
                created: r.at("created").boolean()?,
            }),
            PUBLISH => {
                let mut p = Publish {
                    topic: r.at("topic").string()?,
                    group: r.at("group").string()?,
                    partition: r.at("partition").i32()?,
                    key: r.at("key").bytes()?,
                    headers: r.at("headers").headers()?,
                    content_type: r.at("content_type").string()?,
                    delay_ms: r.at("delay_ms").varint()?,
                    not_before_ms: r.at("not_before_ms").varint()?,
                    ttl_ms: r.at("ttl_ms").varint()?,
                    producer_id: r.at("producer_id").string()?,
                    producer_seq: r.at("producer_seq").uvarint()?,
                    body: r.at("body").bytes()?,
                    producer_prev: 0,
                };
                if !r.at_end() {
                    p.producer_prev = r.at("producer_prev").uvarint()?;
                }
                Body::Publish(p)
            }
            PUBLISH_OK => Body::PublishOk(decode_publish_ok(r)?),
            DELETE_QUEUE | PURGE_QUEUE | METADATA => {
                let q = QueueRef { topic: r.at("topic").string()?, group: r.at("group").string()? };
                match op_code {
                    DELETE_QUEUE => Body::DeleteQueue(q),
                    PURGE_QUEUE => Body::PurgeQueue(q),
                    _ => Body::Metadata(q),
                }
            }
            PURGE_OK => Body::PurgeOk(r.at("purged").uvarint()?),
            SUBSCRIBE => {
                let mut s = Subscribe {
                    topic: r.at("topic").string()?,
                    group: r.at("group").string()?,
                    partition: r.at("partition").i32()?,
                    ack_mode: r.at("ack_mode").u8()?,
                    prefetch: r.at("prefetch").u32()?,
                    cohort: String::new(),
                    member: String::new(),
                };
                if !r.at_end() {
                    s.cohort = r.at("cohort").string()?;
                    if !r.at_end() {
                        s.member = r.at("member").string()?;
                    }
                }
                Body::Subscribe(s)
            }
            SUBSCRIBE_OK => Body::SubscribeOk(SubscribeOk {
                sub_id: r.at("sub_id").uvarint()?,
                partitions: r.at("partitions").list(1, |r| r.u32())?,
                prefetch: r.at("prefetch").u32()?,
            }),
            UNSUBSCRIBE => Body::Unsubscribe(r.at("sub_id").uvarint()?),
            SUB_CLOSED => Body::SubClosed(SubClosed {
                sub_id: r.at("sub_id").uvarint()?,
                reason: r.at("reason").u8()?,
                code: r.at("code").u16()?,
                message: r.at("message").string()?,
            }),
            DELIVER => Body::Deliver(decode_deliver_from(r)?),
            ASSIGNMENT => {
                let a = Assignment {
                    sub_id: r.at("sub_id").uvarint()?,
                    partition: r.at("partition").u32()?,
                    epoch: r.at("epoch").uvarint()?,
                    state: r.at("state").u8()?,
                };
                if a.state != 1 && a.state != 2 {
                    return Err(r.fail("out of range"));
                }
                Body::Assignment(a)
            }
            ACK | NACK | FAIL => {
                let mut s =
                    Settle { tags: r.at("tags").uvarints()?, delay_ms: r.at("delay_ms").varint()?, leases: Vec::new() };
                if !r.at_end() {
                    s.leases = dec_leases(r)?;
                }
                match op_code {
                    ACK => Body::Ack(s),
                    NACK => Body::Nack(s),
                    _ => Body::Fail(s),
                }
            }
            EXTEND => Body::Extend(Extend {
                tags: r.at("tags").uvarints()?,
                extend_ms: r.at("extend_ms").varint()?,
                leases: dec_leases(r)?,
            }),
            SETTLE_RESULT => Body::SettleResult(SettleResult { codes: r.at("codes").list(1, |r| r.u16())? }),
            GOING_AWAY => Body::GoingAway(GoingAway {
                deadline_ms: r.at("deadline_ms").varint()?,
                grace_ms: r.at("grace_ms").u32()?,
                reason: r.at("reason").string()?,
                redirect: r.at("redirect").string()?,
            }),
            RECONCILE => {
                let mut rc = Reconcile {
                    policy: r.at("policy").u8()?,
                    subs: r.at("subs").list(6, SubView::decode)?,
                    inflight_follows: false,
                    cohorts: Vec::new(),
                };
                if !r.at_end() {
                    rc.inflight_follows = r.at("inflight_follows").boolean()?;
                    if !r.at_end() {
                        rc.cohorts = r.at("cohorts").list(3, |r| {
                            Ok(SubCohort {
                                sub_id: r.at("sub_id").uvarint()?,
                                cohort: r.at("cohort").string()?,
                                member: r.at("member").string()?,
                            })
                        })?;
                    }
                }
                Body::Reconcile(rc)
            }
            RECONCILE_RESULT => Body::ReconcileResult(ReconcileResult {
                entries: r.at("entries").list(16, |r| {
                    Ok(ReconcileEntry {
                        action: r.at("action").u8()?,
                        client_sub_id: r.at("client_sub_id").uvarint()?,
                        server_sub_id: r.at("server_sub_id").uvarint()?,
                        client: SubView::decode(r)?,
                        server: SubView::decode(r)?,
                        reason: r.at("reason").string()?,
                    })
                })?,
            }),
            INFLIGHT => Body::Inflight(Inflight {
                entries: r
                    .at("entries")
                    .list(6, |r| Ok(InflightEntry { tag: r.at("tag").uvarint()?, lease: LeaseRef::decode(r)? }))?,
            }),
            INFLIGHT_RESULT => Body::InflightResult(InflightResult {
                stale: r.at("stale").uvarints()?,
                resent: r.at("resent").uvarint()?,
                kept: r.at("kept").uvarint()?,
            }),
            METADATA_RESULT => Body::MetadataResult(MetadataResult {
                cluster: r.at("cluster").boolean()?,
                partitions: r.at("partitions").list(4, |r| {
                    Ok(PartitionMeta {
                        partition: r.at("partition").u32()?,
                        owner: r.at("owner").string()?,
                        epoch: r.at("epoch").uvarint()?,
                        replicas: r.at("replicas").list(1, |r| r.string())?,
                    })
                })?,
            }),
            other => return Err(WireError(format!("unknown op 0x{:02x}", other))),
        };
        Ok(b)
    }
}

fn decode_publish_ok(r: &mut Reader) -> Result<PublishOk> {
    let mut p = PublishOk {
        partition: r.at("partition").u32()?,
        offset: r.at("offset").uvarint()?,
        duplicate: r.at("duplicate").boolean()?,
        next: 0,
    };
    if !r.at_end() {
        p.next = r.at("next").u32()?;
    }
    Ok(p)
}

/// Decodes a `PUBLISH_OK` body.
pub fn decode_publish_ok_body(body: &[u8]) -> Result<PublishOk> {
    decode_publish_ok(&mut Reader::new(body))
}

/// Decodes a `DELIVER` body.
pub fn decode_deliver(body: &[u8]) -> Result<Deliver> {
    decode_deliver_from(&mut Reader::new(body))
}

fn decode_deliver_from(r: &mut Reader) -> Result<Deliver> {
    let mut d = Deliver {
        sub_id: r.at("sub_id").uvarint()?,
        tag: r.at("tag").uvarint()?,
        partition: r.at("partition").u32()?,
        offset: r.at("offset").uvarint()?,
        attempt: r.at("attempt").u32()?,
        published_at_ms: r.at("published_at_ms").varint()?,
        key: r.at("key").bytes()?,
        headers: r.at("headers").headers()?,
        content_type: r.at("content_type").string()?,
        body: r.at("body").bytes()?,
        topic: r.at("topic").string()?,
        group: r.at("group").string()?,
        ..Deliver::default()
    };
    if !r.at_end() {
        d.lease_id = r.at("lease_id").uvarint()?;
        if !r.at_end() {
            d.epoch = r.at("epoch").uvarint()?;
            if !r.at_end() {
                d.lease_ms = r.at("lease_ms").u32()?;
                if !r.at_end() {
                    d.assignment = r.at("assignment").uvarint()?;
                }
            }
        }
    }
    Ok(d)
}

/// A frame's header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Body bytes after the 16-byte header.
    pub body_len: usize,
    pub ver: u8,
    pub op: u8,
    pub flags: u16,
    pub req_id: u64,
}

/// Checks a frame's 16 header bytes against the frame limit.
pub fn parse_header(h: &[u8], frame_bytes_max: usize) -> Result<Header> {
    if h.len() < 16 {
        return Err(WireError("shorter than its header".into()));
    }
    let length = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
    if length < HEADER_BYTES {
        return Err(WireError(format!("length {} below the header size", length)));
    }
    if length + 4 > frame_bytes_max {
        return Err(WireError(format!("frame of {} bytes exceeds the limit of {}", length + 4, frame_bytes_max)));
    }
    let ver = h[4];
    if ver != VERSION {
        return Err(WireError(format!("protocol version {}", ver)));
    }
    Ok(Header {
        body_len: length - HEADER_BYTES,
        ver,
        op: h[5],
        flags: u16::from_be_bytes([h[6], h[7]]),
        req_id: u64::from_be_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]),
    })
}

/// Appends a 16-byte header whose length field is patched by [`finish_frame`].
pub fn start_frame(out: &mut Vec<u8>, op_code: u8, flags: u16, req_id: u64) -> usize {
    let at = out.len();
    out.extend_from_slice(&[0, 0, 0, 0, VERSION, op_code]);
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&req_id.to_be_bytes());
    at
}

/// Patches the length of the frame started at `at`.
pub fn finish_frame(out: &mut [u8], at: usize) {
    let n = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&n.to_be_bytes());
}

/// One whole frame, length prefix included.
pub fn encode_frame(body: &Body, req_id: u64, flags: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    let at = start_frame(&mut out, body.op(), flags, req_id);
    body.encode(&mut out);
    finish_frame(&mut out, at);
    out
}

/// Parses one whole frame held in `data` (tests and the wire vectors).
pub fn split_frame(data: &[u8]) -> Result<(Header, &[u8])> {
    let h = parse_header(data, usize::MAX)?;
    if data.len() != 16 + h.body_len {
        return Err(WireError("length prefix does not match the data".into()));
    }
    Ok((h, &data[16..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip() {
        for v in [0u64, 1, 127, 128, 300, u64::MAX, 1 << 63] {
            let mut out = Vec::new();
            put_uvarint(&mut out, v);
            assert_eq!(Reader::new(&out).uvarint().unwrap(), v);
        }
        for v in [0i64, -1, 1, i64::MIN, i64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(Reader::new(&out).varint().unwrap(), v);
        }
        // Eleven bytes, or a tenth byte above 1, overflow 64 bits.
        assert!(Reader::new(&[0xff; 11]).uvarint().is_err());
        let mut ten = vec![0xffu8; 9];
        ten.push(2);
        assert!(Reader::new(&ten).uvarint().is_err());
    }

    #[test]
    fn random_bodies_never_panic() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for op_code in 0u8..=0x60 {
            for _ in 0..300 {
                let n = rng.gen_range(0..64);
                let body: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
                // Either a body or a WireError, never a panic; what decodes
                // encodes again without one.
                if let Ok(b) = Body::decode(op_code, &body) {
                    let f = encode_frame(&b, 1, 0);
                    assert_eq!(split_frame(&f).unwrap().0.op, b.op());
                }
            }
        }
        // A list that claims more items than its body could hold is refused
        // before anything is allocated.
        assert!(Body::decode(op::SETTLE_RESULT, &[0xff, 0xff, 0xff, 0x7f]).is_err());
    }

    #[test]
    fn truncated_bodies_are_refused() {
        let d = Body::Deliver(Deliver {
            sub_id: 1,
            tag: 2,
            body: b"hello".to_vec(),
            topic: "t".into(),
            ..Default::default()
        });
        let f = encode_frame(&d, 0, 0);
        let body = &f[16..];
        // Every cut before the appended fields is malformed, never a panic.
        for n in 0..body.len() - 4 {
            assert!(Body::decode(op::DELIVER, &body[..n]).is_err(), "cut at {}", n);
        }
    }
}
