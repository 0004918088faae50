//! The client: one logical connection to a Sinew broker.
//!
//! A [`Client`] owns a session (its resume identity, subscriptions and
//! delivery tags) that outlives any one socket. A supervisor task watches the
//! current connection; when it breaks, it reconnects with backoff, resumes the
//! session (or starts a fresh one), reconciles subscriptions and in-flight
//! deliveries, resends the settles and publishes that were cut off, and only
//! then lets new operations use the connection.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch, Notify, Semaphore};
use tokio::task::JoinHandle;

use crate::error::{Code, Error, Result};
use crate::wire::{self, op, Body, LeaseRef};

/// The library version sent in `HELLO`.
pub const CLIENT_VERSION: &str = env!("CARGO_PKG_VERSION");

const PUBLISH_WINDOW: usize = 1024; // unconfirmed publishes per client
const PUBLISH_WINDOW_BYTES: usize = 64 << 20; // their body bytes, kept for resending
const SETTLE_BATCH_DEFAULT: usize = 256; // tags per settle frame when the broker announces none
const DELIVERY_BUFFER: usize = 4096; // messages buffered per subscription before the reader waits
const WRITE_COALESCE_BYTES: usize = 64 << 10; // frames gathered into one socket write
const READ_CHUNK_BYTES: usize = 256 << 10;
const GOING_AWAY_WAIT_MAX: Duration = Duration::from_secs(30);
const GOING_AWAY_POLL: Duration = Duration::from_millis(10);
const GOING_AWAY_BACKOFF_MAX: Duration = Duration::from_millis(500);
const END_SESSION_TIMEOUT: Duration = Duration::from_secs(2);
const HEADERS_MAX: usize = 256;
const REDIRECT_MAX: usize = 512;
const HINTS_MAX: usize = 4096; // queues whose partition hint a client keeps

// Cluster routing (see `refused`): at most LEARNED_MAX addresses are learned
// besides the seeds; the pause before leaving a node that refused a publish
// grows from MOVE_PAUSE_MIN to MOVE_PAUSE_MAX with each refusal in a row; a
// refused publish goes from node to node for at most MOVE_BUDGET before the
// refusal becomes its outcome; a node that refused one is not moved to again
// for SHUN while another is not; METADATA is asked at most every
// PROBE_EVERY and waited for at most PROBE_TIMEOUT.
const LEARNED_MAX: usize = 64;
const MOVE_PAUSE_MIN: Duration = Duration::from_millis(20);
const MOVE_PAUSE_MAX: Duration = Duration::from_secs(1);
/// How long a publish a cluster refuses (`not_owner`, `fenced`,
/// `unavailable`) is carried from node to node before the refusal is
/// returned to the application.
pub const MOVE_BUDGET: Duration = Duration::from_secs(30);
const SHUN: Duration = Duration::from_secs(1);
const PROBE_EVERY: Duration = Duration::from_millis(500);
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
// A subscription in a cluster (see `subscribe_span`): the wait for METADATA to
// name the queue's nodes, and for the connect to each node.
const SPAN_RESOLVE: Duration = Duration::from_secs(30);
const SPAN_CONNECT: Duration = Duration::from_secs(3);
// A settle of a spanning subscription's message that its node refused
// (`fenced`), could not take (a stale session, a lost connection) or, for an
// ACK, did not answer within SETTLE_RACE goes to the partition's owner by
// lease reference, asking METADATA again for up to SETTLE_FOLLOW.
const SETTLE_RACE: Duration = Duration::from_secs(1);
const SETTLE_FOLLOW: Duration = Duration::from_secs(15);

// --- clock and options -----------------------------------------------------------

/// The time source of reconnect backoff: when to try again and how long a
/// connection has been up. Tests replace it to observe the backoff without
/// waiting (see [`ConnectOptions::clock`]).
pub trait Clock: Send + Sync + 'static {
    /// The current instant.
    fn now(&self) -> Instant;
    /// Waits for `d`.
    fn sleep(&self, d: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// The real clock: [`Instant::now`] and [`tokio::time::sleep`].
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn sleep(&self, d: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(tokio::time::sleep(d))
    }
}

/// Shapes automatic reconnection. The wait before attempt `n` (from 0) is
/// `min(base * factor^n, max) * (1 ± jitter)`, and `n` goes back to 0 once a
/// connection has stayed up for `reset_after`.
#[derive(Debug, Clone, PartialEq)]
pub struct ReconnectPolicy {
    /// The first wait (100 ms).
    pub base: Duration,
    /// The growth per failure (2).
    pub factor: f64,
    /// The longest wait (30 s).
    pub max: Duration,
    /// The spread, as a fraction of the wait (0.1: ±10 %).
    pub jitter: f64,
    /// How long a connection must stay up before the waits start over (10 s).
    pub reset_after: Duration,
    /// 0: reconnect forever; otherwise give up ([`Error::Disconnected`])
    /// after this many failures in a row.
    pub max_attempts: u32,
}

impl Default for ReconnectPolicy {
    fn default() -> Self {
        ReconnectPolicy {
            base: Duration::from_millis(100),
            factor: 2.0,
            max: Duration::from_secs(30),
            jitter: 0.1,
            reset_after: Duration::from_secs(10),
            max_attempts: 0,
        }
    }
}

impl ReconnectPolicy {
    /// The wait before attempt `n`; `r` in `[0, 1)` places the jitter.
    pub fn delay(&self, n: u32, r: f64) -> Duration {
        let max = self.max.as_secs_f64();
        let mut d = self.base.as_secs_f64();
        for _ in 0..n {
            if d >= max {
                break;
            }
            d *= self.factor;
        }
        let d = d.min(max) * (1.0 + self.jitter * (2.0 * r - 1.0));
        Duration::from_secs_f64(d.max(0.0))
    }
}

/// What a resumed session does with subscriptions the broker no longer has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconcilePolicy {
    /// Close them on the client side.
    Conservative,
    /// Ask the broker to recreate them (the default).
    Restore,
}

type RandFn = Arc<dyn Fn() -> f64 + Send + Sync>;

/// How [`connect_with`] connects. Built with [`ConnectOptions::new`] and the
/// builder methods; every setting has a working default.
#[derive(Clone)]
pub struct ConnectOptions {
    addresses: Vec<String>,
    client_name: String,
    user: String,
    credentials: String,
    tls: Option<Arc<rustls::ClientConfig>>,
    tls_server_name: Option<String>,
    tls_error: Option<String>,
    reconnect: ReconnectPolicy,
    reconcile: ReconcilePolicy,
    heartbeat: Option<Duration>,
    connect_timeout: Duration,
    dial_timeout: Duration,
    handshake_timeout: Duration,
    drain_timeout: Duration,
    producer_id: Option<String>,
    member_id: Option<String>,
    clock: Arc<dyn Clock>,
    rand: RandFn,
    /// A client of a spanning subscription: it stays on its one node (it
    /// learns no nodes and does not move).
    pinned: bool,
}

impl fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("addresses", &self.addresses)
            .field("client_name", &self.client_name)
            .field("user", &self.user)
            .field("tls", &self.tls.is_some())
            .field("reconnect", &self.reconnect)
            .finish_non_exhaustive()
    }
}

impl ConnectOptions {
    /// Options for the broker at `address` ("host:port").
    pub fn new(address: impl Into<String>) -> Self {
        ConnectOptions {
            addresses: vec![address.into()],
            client_name: "sinew-rust".into(),
            user: String::new(),
            credentials: String::new(),
            tls: None,
            tls_server_name: None,
            tls_error: None,
            reconnect: ReconnectPolicy::default(),
            reconcile: ReconcilePolicy::Restore,
            heartbeat: None,
            connect_timeout: Duration::from_secs(30),
            dial_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(5),
            producer_id: None,
            member_id: None,
            clock: Arc::new(SystemClock),
            rand: Arc::new(rand::random::<f64>),
            pinned: false,
        }
    }

    /// Several addresses (seeds) of the same broker or cluster: a connect
    /// that fails moves on to the next one.
    pub fn addresses<I, S>(mut self, addrs: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let v: Vec<String> = addrs.into_iter().map(Into::into).collect();
        if !v.is_empty() {
            self.addresses = v;
        }
        self
    }

    /// The name the broker shows for this client in its logs.
    pub fn client_name(mut self, name: impl Into<String>) -> Self {
        self.client_name = name.into();
        self
    }

    /// Authenticates as `user` with `password`. Use TLS on any listener
    /// that is not loopback: the password travels as it is.
    pub fn user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = user.into();
        self.credentials = password.into();
        self
    }

    /// Authenticates with a static token (one of the broker's `auth.tokens`).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.user.clear();
        self.credentials = token.into();
        self
    }

    /// Connects with TLS using `config`.
    pub fn tls_config(mut self, config: Arc<rustls::ClientConfig>) -> Self {
        self.tls = Some(config);
        self
    }

    /// Connects with TLS, trusting the CA certificates in the PEM file at
    /// `ca_file`. A file that cannot be read or holds no certificate makes
    /// [`connect_with`] fail with [`Error::Tls`].
    pub fn tls_ca_file(mut self, ca_file: impl AsRef<std::path::Path>) -> Self {
        match tls_config_from(ca_file.as_ref(), None) {
            Ok(c) => self.tls = Some(Arc::new(c)),
            Err(e) => self.tls_error = Some(e),
        }
        self
    }

    /// Connects with TLS, trusting the CA in `ca_file` and presenting the
    /// client certificate chain `cert_file` with its private key `key_file`
    /// (PEM files).
    pub fn tls_client_cert(
        mut self,
        ca_file: impl AsRef<std::path::Path>,
        cert_file: impl AsRef<std::path::Path>,
        key_file: impl AsRef<std::path::Path>,
    ) -> Self {
        match tls_config_from(ca_file.as_ref(), Some((cert_file.as_ref(), key_file.as_ref()))) {
            Ok(c) => self.tls = Some(Arc::new(c)),
            Err(e) => self.tls_error = Some(e),
        }
        self
    }

    /// Connects with TLS, trusting the system's certificate store.
    pub fn tls_system_roots(mut self) -> Self {
        let mut roots = rustls::RootCertStore::empty();
        match rustls_native_certs::load_native_certs() {
            Ok(certs) => {
                for c in certs {
                    let _ = roots.add(&rustls::Certificate(c.0));
                }
                let cfg = rustls::ClientConfig::builder()
                    .with_safe_defaults()
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                self.tls = Some(Arc::new(cfg));
            }
            Err(e) => self.tls_error = Some(format!("system certificates: {}", e)),
        }
        self
    }

    /// The name the broker's certificate must carry (by default the host of
    /// the address dialled).
    pub fn tls_server_name(mut self, name: impl Into<String>) -> Self {
        self.tls_server_name = Some(name.into());
        self
    }

    /// The reconnect policy (backoff 100 ms to 30 s, ×2, ±10 %, reset after
    /// 10 s connected, reconnecting forever).
    pub fn reconnect(mut self, policy: ReconnectPolicy) -> Self {
        self.reconnect = policy;
        self
    }

    /// The reconciliation policy after a resume ([`ReconcilePolicy::Restore`]).
    pub fn reconcile(mut self, policy: ReconcilePolicy) -> Self {
        self.reconcile = policy;
        self
    }

    /// Pings at least this often (by default as often as the broker asks).
    pub fn heartbeat(mut self, every: Duration) -> Self {
        self.heartbeat = Some(every);
        self
    }

    /// Bounds [`connect_with`]: no backoff wait starts that would end after
    /// it (30 s).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Bounds one TCP (and TLS) connect (10 s).
    pub fn dial_timeout(mut self, d: Duration) -> Self {
        self.dial_timeout = d;
        self
    }

    /// Bounds the wait for `HELLO_OK` (10 s).
    pub fn handshake_timeout(mut self, d: Duration) -> Self {
        self.handshake_timeout = d;
        self
    }

    /// Bounds how long [`Client::close`] waits for pending confirms and
    /// settles (5 s).
    pub fn drain_timeout(mut self, d: Duration) -> Self {
        self.drain_timeout = d;
        self
    }

    /// The producer id stamped on publishes (random per client by default).
    /// A publish resent after a reconnect carries the same producer id and
    /// sequence, so the broker stores it once.
    pub fn producer_id(mut self, id: impl Into<String>) -> Self {
        self.producer_id = Some(id.into());
        self
    }

    /// The member id of this client's cohort subscriptions that name none:
    /// 1 to 128 characters of `A-Z a-z 0-9 . _ : -`. By default a random one,
    /// drawn once per client and kept across reconnects; set a stable one so
    /// a worker restarted under the same name finds its partitions again.
    pub fn member_id(mut self, id: impl Into<String>) -> Self {
        self.member_id = Some(id.into());
        self
    }

    /// Replaces the clock of the reconnect backoff (a test seam).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Replaces the source of backoff jitter; it must return values in
    /// `[0, 1)` (a test seam).
    pub fn rand(mut self, r: impl Fn() -> f64 + Send + Sync + 'static) -> Self {
        self.rand = Arc::new(r);
        self
    }
}

fn tls_config_from(
    ca: &std::path::Path,
    client: Option<(&std::path::Path, &std::path::Path)>,
) -> std::result::Result<rustls::ClientConfig, String> {
    let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("{}: {}", p.display(), e));
    let mut roots = rustls::RootCertStore::empty();
    let pem = read(ca)?;
    let certs = rustls_pemfile::certs(&mut &pem[..]).map_err(|e| format!("{}: {}", ca.display(), e))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate", ca.display()));
    }
    for c in certs {
        roots.add(&rustls::Certificate(c)).map_err(|e| format!("{}: {}", ca.display(), e))?;
    }
    let b = rustls::ClientConfig::builder().with_safe_defaults().with_root_certificates(roots);
    match client {
        None => Ok(b.with_no_client_auth()),
        Some((cert, key)) => {
            let pem = read(cert)?;
            let chain: Vec<rustls::Certificate> = rustls_pemfile::certs(&mut &pem[..])
                .map_err(|e| format!("{}: {}", cert.display(), e))?
                .into_iter()
                .map(rustls::Certificate)
                .collect();
            let pem = read(key)?;
            let mut keys = Vec::new();
            for item in rustls_pemfile::read_all(&mut &pem[..]).map_err(|e| format!("{}: {}", key.display(), e))? {
                match item {
                    rustls_pemfile::Item::PKCS8Key(k)
                    | rustls_pemfile::Item::RSAKey(k)
                    | rustls_pemfile::Item::ECKey(k) => keys.push(k),
                    _ => {}
                }
            }
            let k = keys.into_iter().next().ok_or_else(|| format!("{}: no private key", key.display()))?;
            b.with_single_cert(chain, rustls::PrivateKey(k)).map_err(|e| e.to_string())
        }
    }
}

// --- public data types ------------------------------------------------------------

/// Where a confirmed message was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishConfirm {
    /// The partition that stored it.
    pub partition: u32,
    /// Its offset in that partition.
    pub offset: u64,
    /// The broker had already stored this publish (a resend); `offset` is
    /// the original's.
    pub duplicate: bool,
}

/// Optional fields of a publish, for [`Client::publish_with`].
#[derive(Debug, Clone, Default)]
pub struct PublishOptions {
    /// The queue's group ("" is the default group).
    pub group: String,
    /// An explicit partition; `None` lets the broker place it.
    pub partition: Option<u32>,
    /// The partition key.
    pub key: Vec<u8>,
    /// Headers; keys starting with `sinew.` are reserved for the broker.
    pub headers: Vec<(String, String)>,
    /// The body's content type.
    pub content_type: String,
    /// Deliver no earlier than this from now.
    pub delay: Option<Duration>,
    /// Expire the message after this long (the queue's default otherwise).
    pub ttl: Option<Duration>,
}

impl PublishOptions {
    /// The default options.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the group.
    pub fn group(mut self, g: impl Into<String>) -> Self {
        self.group = g.into();
        self
    }
    /// Sets an explicit partition.
    pub fn partition(mut self, p: u32) -> Self {
        self.partition = Some(p);
        self
    }
    /// Sets the partition key.
    pub fn key(mut self, k: impl Into<Vec<u8>>) -> Self {
        self.key = k.into();
        self
    }
    /// Adds a header.
    pub fn header(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.headers.push((k.into(), v.into()));
        self
    }
    /// Sets the content type.
    pub fn content_type(mut self, c: impl Into<String>) -> Self {
        self.content_type = c.into();
        self
    }
    /// Delays the first delivery.
    pub fn delay(mut self, d: Duration) -> Self {
        self.delay = Some(d);
        self
    }
    /// Sets the time to live.
    pub fn ttl(mut self, d: Duration) -> Self {
        self.ttl = Some(d);
        self
    }
}

/// Options of [`Client::subscribe_with`].
#[derive(Debug, Clone, Default)]
pub struct SubscribeOptions {
    /// The queue's group ("" is the default group).
    pub group: String,
    /// One partition only; `None` consumes from every partition.
    pub partition: Option<u32>,
    /// Most unsettled deliveries at once; 0 takes the broker's default.
    pub prefetch: u32,
    /// The broker settles each delivery once it is sent.
    pub auto_ack: bool,
    /// Joins this cohort (consumer group): the queue's partitions are shared
    /// among its members, each partition delivered to one member at a time,
    /// in offset order (docs/cohorts.md).
    pub cohort: Option<String>,
    /// The member id within the cohort; the client's
    /// ([`ConnectOptions::member_id`]) by default. One session holds one.
    pub member_id: Option<String>,
}

impl SubscribeOptions {
    /// The default options: every partition, the broker's prefetch, manual
    /// settling.
    pub fn new() -> Self {
        Self::default()
    }
    /// Sets the group.
    pub fn group(mut self, g: impl Into<String>) -> Self {
        self.group = g.into();
        self
    }
    /// Consumes one partition only.
    pub fn partition(mut self, p: u32) -> Self {
        self.partition = Some(p);
        self
    }
    /// Sets the prefetch.
    pub fn prefetch(mut self, n: u32) -> Self {
        self.prefetch = n;
        self
    }
    /// Lets the broker settle each delivery as it is sent.
    pub fn auto_ack(mut self, on: bool) -> Self {
        self.auto_ack = on;
        self
    }
    /// Joins a cohort.
    pub fn cohort(mut self, c: impl Into<String>) -> Self {
        self.cohort = Some(c.into());
        self
    }
    /// Sets the member id within the cohort.
    pub fn member_id(mut self, m: impl Into<String>) -> Self {
        self.member_id = Some(m.into());
        self
    }
}

/// Dead-letter policy of [`QueueOptions`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeadLetter {
    /// The broker's default.
    #[default]
    Default,
    /// Failed messages are dropped.
    Discard,
    /// Failed messages go to the broker's global dead-letter queue.
    Global,
    /// Failed messages go to the named queue.
    Queue(String),
}

/// Settings of [`Client::declare_queue`]; zero values take the broker's defaults.
#[derive(Debug, Clone, Default)]
pub struct QueueOptions {
    /// The queue's group.
    pub group: String,
    /// Partition count (0: the broker's default).
    pub partitions: u32,
    /// Where failed messages go.
    pub dead_letter: DeadLetter,
    /// Retries before a message is dead-lettered (`None`: the broker's default).
    pub max_retries: Option<u32>,
    /// Default time to live of messages.
    pub default_ttl: Option<Duration>,
    /// Lease of a delivery before it is delivered again.
    pub lease: Option<Duration>,
}

/// The answer to [`Client::declare_queue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeclareResult {
    /// The queue's partition count.
    pub partitions: u32,
    /// The queue was created by this declaration.
    pub created: bool,
}

/// A partition assigned to or revoked from a cohort subscription (the
/// broker's `ASSIGNMENT`), as [`Subscription::assignments`] yields it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AssignmentEvent {
    /// The partition.
    pub partition: u32,
    /// The partition's assignment epoch after the move; deliveries made
    /// under this assignment carry it as [`Message::assignment`].
    pub epoch: u64,
    /// `true`: the partition's deliveries come to this subscription now;
    /// `false`: revoked, they go to another member (or nowhere until the
    /// next plan).
    pub assigned: bool,
    /// Events dropped just before this one because the buffer was full.
    pub dropped: u64,
}

const ASSIGNMENT_BUFFER: usize = 256; // assignment events kept per subscription

#[derive(Default)]
struct AssignBuf {
    buf: std::collections::VecDeque<AssignmentEvent>,
    missed: u64,
    dropped: u64,
    ended: bool,
    waker: Option<std::task::Waker>,
}

impl AssignBuf {
    fn push(&mut self, ev: AssignmentEvent) {
        if self.ended {
            return;
        }
        if self.buf.len() >= ASSIGNMENT_BUFFER {
            self.buf.pop_front();
            self.missed += 1;
            self.dropped += 1;
        }
        self.buf.push_back(ev);
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
    fn end(&mut self) {
        self.ended = true;
        if let Some(w) = self.waker.take() {
            w.wake();
        }
    }
}

/// The assignment events of one cohort subscription, in the order the
/// broker sent them, as a [`futures_core::Stream`]. Every
/// [`Subscription::assignments`] reads the same buffer, which keeps events
/// from the moment the broker accepted the subscription and holds at most
/// 256 unread ones: beyond that the oldest are dropped and counted in the
/// next event's `dropped`. One reader at a time. It ends when the
/// subscription ends and the buffer is empty.
pub struct Assignments {
    buf: Arc<Mutex<AssignBuf>>,
}

impl fmt::Debug for Assignments {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Assignments").finish_non_exhaustive()
    }
}

impl futures_core::Stream for Assignments {
    type Item = AssignmentEvent;
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<AssignmentEvent>> {
        let mut b = self.buf.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mut ev) = b.buf.pop_front() {
            ev.dropped = std::mem::take(&mut b.missed);
            return Poll::Ready(Some(ev));
        }
        if b.ended {
            return Poll::Ready(None);
        }
        b.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// A connection status change, as [`Client::status`] reports them.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Status {
    /// Connected; `resumed` says whether the broker kept the session.
    Connected {
        /// The broker resumed the session.
        resumed: bool,
    },
    /// The connection broke; the client reconnects.
    Disconnected(String),
    /// The broker announced a planned stop; new operations wait for the
    /// next connection.
    GoingAway,
    /// The client is closed (with the fatal error that closed it, if any).
    Closed(Option<String>),
}

// --- shared state -----------------------------------------------------------------

struct PubCall {
    head: Arc<Vec<u8>>,
    seq: u64,
    body: Arc<Vec<u8>>,
    tx: oneshot::Sender<(Result<wire::PublishOk>, bool)>,
    /// A send of it was cut off before its answer: that send may have stored it.
    uncertain: bool,
    /// When a cluster node first refused it (see `refused`).
    refused_at: Option<Instant>,
}

impl PubCall {
    fn frame(&self, rid: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.head.len() + self.body.len() + 16);
        let at = wire::start_frame(&mut out, op::PUBLISH, 0, rid);
        out.extend_from_slice(&self.head);
        wire::put_uvarint(&mut out, self.seq);
        wire::put_bytes(&mut out, &self.body);
        wire::put_uvarint(&mut out, 0);
        wire::finish_frame(&mut out, at);
        out
    }
}

struct SettleItem {
    local: u64,
    tag: u64,
    lease: LeaseRef,
    epoch: u64,
    tx: Option<oneshot::Sender<Result<()>>>,
    settled: Option<Arc<AtomicBool>>, // the message's flag; None for EXTEND
}

impl SettleItem {
    /// Hands the settle its outcome. A refusal that leaves the lease held
    /// (a broker code such as `bad_request`, giving up reconnecting) lets
    /// the message be settled again.
    fn finish(self, out: Result<()>) {
        if let (Err(e), Some(flag)) = (&out, &self.settled) {
            if !matches!(e, Error::StaleDelivery | Error::UnknownTag | Error::ClientClosed) {
                flag.store(false, Ordering::SeqCst);
            }
        }
        if let Some(tx) = self.tx {
            let _ = tx.send(out);
        }
    }
}

struct SettleBatch {
    op: u8,
    delay: i64,
    items: Vec<SettleItem>,
}

impl SettleBatch {
    fn frame(&self, rid: u64) -> Vec<u8> {
        let s = wire::Settle {
            tags: self.items.iter().map(|i| i.tag).collect(),
            delay_ms: self.delay,
            leases: self.items.iter().map(|i| i.lease).collect(),
        };
        let body = match self.op {
            op::ACK => Body::Ack(s),
            op::NACK => Body::Nack(s),
            op::FAIL => Body::Fail(s),
            _ => Body::Extend(wire::Extend { tags: s.tags, extend_ms: s.delay_ms, leases: s.leases }),
        };
        wire::encode_frame(&body, rid, 0)
    }
}

type Reply = oneshot::Sender<Result<Body>>;

enum Pending {
    Publish(PubCall),
    Settle(SettleBatch),
    Reply(Reply),
    Subscribe { local: u64, new: Option<Box<SubState>>, tx: Reply },
    Reconcile(Reply),
}

struct SubState {
    topic: String,
    group: String,
    partition: i32,
    prefetch: u32,
    auto_ack: bool,
    server_id: u64,
    recreating: bool,
    held: HashMap<u64, LeaseRef>, // manual-ack deliveries of the current epoch, unsettled
    tx: mpsc::Sender<Message>,
    cohort: String,
    member: String,
    assign: Arc<Mutex<AssignBuf>>,
    alive: Arc<AtomicBool>,       // false once ended
    span: Option<Arc<SpanGroup>>, // the spanning subscription it is a member of
}

/// The members of a spanning subscription: each node's client and the
/// subscription's local id there.
struct SpanGroup {
    topic: String,
    group: String,
    members: Vec<(std::sync::Weak<Shared>, u64)>, // weak: each member's state holds the group
}

impl SpanGroup {
    /// Sends the settle to the partition's current owner on the
    /// subscription held there, with tag 0 and the delivery's lease
    /// reference (docs/protocol.md 5.9); asks METADATA for the owner again
    /// with backoff while none answers.
    async fn settle_at_owner(&self, kind: u8, delay: i64, lease: LeaseRef) -> Result<()> {
        let until = Instant::now() + SETTLE_FOLLOW;
        let mut pause = Duration::from_millis(50);
        let q = wire::QueueRef { topic: self.topic.clone(), group: self.group.clone() };
        let mut last = Error::broker(Code::UNAVAILABLE.0, "no owner of the partition answered", "");
        loop {
            let mut owner = String::new();
            let mut members: Vec<(Arc<Shared>, u64)> =
                self.members.iter().filter_map(|(w, l)| w.upgrade().map(|m| (m, *l))).collect();
            // Nodes the client is connected to are asked first.
            members.sort_by_key(|(m, _)| m.lock().live.is_none());
            if members.is_empty() {
                return Err(Error::ClientClosed);
            }
            for (m, _) in &members {
                if let Ok(Ok(md)) = tokio::time::timeout(SPAN_CONNECT, metadata(m, q.clone())).await {
                    if let Some(pm) = md.partitions.iter().find(|p| p.partition == lease.partition) {
                        owner = pm.owner.clone();
                    }
                    break;
                }
            }
            let member = members.iter().find(|(m, _)| !owner.is_empty() && m.opts.addresses[0] == owner);
            if let Some((m, local)) = member {
                let rx = {
                    let mut st = m.lock();
                    let sub_id = st.subs.get(local).map_or(0, |s| s.server_id);
                    if sub_id != 0 && st.live.is_some() && !st.closing {
                        let (tx, rx) = oneshot::channel();
                        let item = SettleItem {
                            local: *local,
                            tag: 0,
                            lease: LeaseRef { sub_id, ..lease },
                            epoch: st.epoch,
                            tx: Some(tx),
                            settled: None,
                        };
                        st.settle_q.push((kind, delay, item));
                        if !st.settle_kicked {
                            st.settle_kicked = true;
                            m.settle_kick.notify_one();
                        }
                        Some(rx)
                    } else {
                        None
                    }
                };
                if let Some(rx) = rx {
                    match rx.await.unwrap_or(Err(Error::ClientClosed)) {
                        Ok(()) => return Ok(()),
                        // The owner's verdict (stale_lease: the lease is gone)
                        // is the outcome; a node that is no longer the owner
                        // or a lost connection sends it on to the next owner.
                        Err(Error::StaleDelivery) => return Err(Error::StaleDelivery),
                        Err(e) if reroutable(&e) => last = e,
                        Err(e) => return Err(e),
                    }
                }
            }
            if Instant::now() + pause > until {
                return Err(last);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MOVE_PAUSE_MAX);
        }
    }
}

/// A settle outcome that another node (the partition's owner) may change.
fn reroutable(e: &Error) -> bool {
    matches!(e, Error::StaleDelivery | Error::ConnectionLost(_) | Error::Disconnected(_))
        || matches!(e.code(), Some(c) if c == Code::FENCED || c == Code::NOT_OWNER || c == Code::UNAVAILABLE)
}

impl SubState {
    fn view(&self) -> wire::SubView {
        wire::SubView {
            sub_id: self.server_id,
            topic: self.topic.clone(),
            group: self.group.clone(),
            partition: self.partition,
            ack_mode: self.auto_ack as u8,
            prefetch: self.prefetch,
        }
    }
}

struct Conn {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    epoch: u64,
    frame_max: usize,
    settle_batch_max: usize,
    draining: AtomicBool,
    away_deadline_ms: AtomicI64,
    last_read: AtomicU64, // ms since `born`
    paused: AtomicBool,   // the reader waits for the application to take deliveries
    born: Instant,
    closed: watch::Sender<bool>,
    away: watch::Sender<bool>,
    reason: Mutex<Option<Error>>,
    /// Closed by the client to move to another cluster node: the next
    /// connect is made at once.
    moved: AtomicBool,
}

impl Conn {
    fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }
    fn send(&self, frame: Vec<u8>) {
        let _ = self.tx.send(frame);
    }
}

struct State {
    live: Option<Arc<Conn>>, // restored: operations may use it
    conn: Option<Arc<Conn>>, // being restored or live: replies are routed here
    pending: HashMap<u64, Pending>,
    next_rid: u64,
    replay: Vec<PubCall>,
    held: Vec<SettleBatch>,
    settle_q: Vec<(u8, i64, SettleItem)>,
    settle_kicked: bool,
    subs: HashMap<u64, SubState>,
    by_server: HashMap<u64, u64>,
    ended: HashMap<u64, Error>,
    next_local: u64,
    identity: wire::ResumeIdentity,
    epoch: u64,
    seq: u64,
    closing: bool,
    fatal: Option<Error>,
    gave_up: Option<Error>,
    target: usize,            // index into the known nodes (seeds, then learned) of the next dial
    redirect: Option<String>, // dialled next instead of the target
    addr: String,             // the node the current connection goes to
    learned: Vec<String>,     // cluster nodes learned besides the seeds, oldest first
    refused_by: HashMap<String, Instant>, // when each node last refused a publish without naming an owner
    refusals: u32,            // refusals since the last confirmed publish
    moving: bool,             // a move to another node is scheduled
    probing: bool,            // a METADATA request is in flight
    probed_at: Option<Instant>,
    probe_wanted: bool, // the nodes known may be out of date: ask METADATA again
    hello: wire::HelloOk,
    status: Vec<mpsc::Sender<Status>>,
    hints: HashMap<(String, String), i32>, // the broker's partition hint per queue
}

struct Shared {
    opts: ConnectOptions,
    stale_gen: AtomicU64, // bumped (under the state lock) when held leases may have gone
    producer_id: String,
    member_id: String,
    st: Mutex<State>,
    changed: watch::Sender<u64>,
    window: Semaphore,
    window_bytes: Semaphore,
    settle_kick: Notify,
    kick: Notify,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    spans: Mutex<Vec<std::sync::Weak<Shared>>>, // the clients of this client's spanning subscriptions
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    fn status(&self, st: &mut State, s: Status) {
        st.status.retain(|tx| match tx.try_send(s.clone()) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => true, // bounded: the oldest unread stay
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
    }
}

/// Keeps the partition hint of the answer to a keyless publish: `next` is
/// `PUBLISH_OK.next`, 1 + the partition; 0 (none) drops the hint.
fn note_hint(hints: &mut HashMap<(String, String), i32>, key: (String, String), next: u32) {
    if next == 0 || next > i32::MAX as u32 {
        hints.remove(&key);
        return;
    }
    if hints.len() >= HINTS_MAX && !hints.contains_key(&key) {
        hints.clear(); // a hint is advice: without one a publish is hashed
    }
    hints.insert(key, (next - 1) as i32);
}

fn rid(st: &mut State) -> u64 {
    let r = st.next_rid;
    st.next_rid += 1;
    r
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

// --- the client -------------------------------------------------------------------

/// A connection to a Sinew broker. Cheap to clone; every clone is the same
/// client. Dropping the last clone closes it at once, without the
/// `END_SESSION` of [`Client::close`]: the broker then keeps the session and
/// its unsettled leases for the reconnect grace. Call `close` to end it
/// cleanly.
#[derive(Clone)]
pub struct Client {
    handle: Arc<Handle>,
}

struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        shutdown(&self.shared, Error::ClientClosed);
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").field("addresses", &self.handle.shared.opts.addresses).finish()
    }
}

/// Connects to the broker at `address` ("host:port") with default options.
pub async fn connect(address: impl Into<String>) -> Result<Client> {
    connect_with(ConnectOptions::new(address)).await
}

/// Connects with `opts`. Retryable failures (refused, reset,
/// `shutting_down` ...) are retried with the reconnect policy's backoff
/// until the connect timeout; a fatal one (`auth_failed`, a TLS failure, a
/// protocol violation) is returned at once.
pub async fn connect_with(opts: ConnectOptions) -> Result<Client> {
    if let Some(e) = &opts.tls_error {
        return Err(Error::Tls(e.clone()));
    }
    for a in &opts.addresses {
        split_addr(a)?;
    }
    let producer_id = opts.producer_id.clone().unwrap_or_else(|| format!("rs-{:016x}", rand::random::<u64>()));
    let (changed, _) = watch::channel(0u64);
    if let Some(m) = &opts.member_id {
        check_cohort_name("member_id", m)?;
    }
    let member_id = opts.member_id.clone().unwrap_or_else(|| format!("m-rs-{:032x}", rand::random::<u128>()));
    let shared = Arc::new(Shared {
        stale_gen: AtomicU64::new(0),
        producer_id,
        member_id,
        st: Mutex::new(State {
            live: None,
            conn: None,
            pending: HashMap::new(),
            next_rid: 2,
            replay: Vec::new(),
            held: Vec::new(),
            settle_q: Vec::new(),
            settle_kicked: false,
            subs: HashMap::new(),
            by_server: HashMap::new(),
            ended: HashMap::new(),
            next_local: 1,
            identity: wire::ResumeIdentity::default(),
            epoch: 0,
            seq: 0,
            closing: false,
            fatal: None,
            gave_up: None,
            target: 0,
            redirect: None,
            addr: String::new(),
            learned: Vec::new(),
            refused_by: HashMap::new(),
            refusals: 0,
            moving: false,
            probing: false,
            probed_at: None,
            probe_wanted: true,
            hello: wire::HelloOk::default(),
            status: Vec::new(),
            hints: HashMap::new(),
        }),
        changed,
        window: Semaphore::new(PUBLISH_WINDOW),
        window_bytes: Semaphore::new(PUBLISH_WINDOW_BYTES),
        settle_kick: Notify::new(),
        kick: Notify::new(),
        tasks: Mutex::new(Vec::new()),
        spans: Mutex::new(Vec::new()),
        opts,
    });
    let clock = shared.opts.clock.clone();
    let pol = shared.opts.reconnect.clone();
    let deadline = clock.now() + shared.opts.connect_timeout;
    let mut failures = 0u32;
    let first = loop {
        match attempt(&shared).await {
            Ok(c) => break c,
            Err(e) => {
                if !e.is_retryable() {
                    shutdown(&shared, e.clone());
                    return Err(e);
                }
                failures += 1;
                if pol.max_attempts > 0 && failures >= pol.max_attempts {
                    shutdown(&shared, Error::ClientClosed);
                    return Err(Error::Disconnected(format!("{} attempts: {}", failures, e)));
                }
                let d = pol.delay(failures - 1, (shared.opts.rand)());
                if clock.now() + d > deadline {
                    shutdown(&shared, Error::ClientClosed);
                    return Err(Error::Disconnected(format!("out of time after {} attempts: {}", failures, e)));
                }
                next_address(&shared);
                clock.sleep(d).await;
            }
        }
    };
    let sup = tokio::spawn(supervise(shared.clone(), first));
    let settler = tokio::spawn(settle_loop(shared.clone()));
    shared.tasks.lock().unwrap_or_else(|e| e.into_inner()).extend([sup, settler]);
    Ok(Client { handle: Arc::new(Handle { shared }) })
}

/// A cohort name or member id: 1 to 128 of `A-Z a-z 0-9 . _ : -`
/// (docs/protocol.md 5.7).
fn check_cohort_name(argument: &'static str, v: &str) -> Result<()> {
    let ok = !v.is_empty()
        && v.len() <= 128
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b':' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(argument, format!("want 1 to 128 characters of A-Z a-z 0-9 . _ : -, got {:?}", v)))
    }
}

fn split_addr(a: &str) -> Result<(String, u16)> {
    let (host, port) =
        a.rsplit_once(':').ok_or_else(|| Error::invalid("address", format!("{:?} is not host:port", a)))?;
    let port: u16 = port.parse().map_err(|_| Error::invalid("address", format!("{:?} is not host:port", a)))?;
    if host.is_empty() {
        return Err(Error::invalid("address", format!("{:?} is not host:port", a)));
    }
    Ok((host.trim_start_matches('[').trim_end_matches(']').to_string(), port))
}

/// The nodes the client knows: its seeds, then the cluster nodes it learned.
fn known_nodes(opts: &ConnectOptions, st: &State) -> Vec<String> {
    opts.addresses.iter().chain(st.learned.iter()).cloned().collect()
}

/// Adds cluster nodes (client addresses) to those known; at most
/// LEARNED_MAX are kept besides the seeds, the oldest dropped first.
fn learn<'a>(opts: &ConnectOptions, st: &mut State, addrs: impl IntoIterator<Item = &'a str>) {
    if opts.pinned {
        return;
    }
    for a in addrs {
        if a.is_empty() || a.len() > REDIRECT_MAX || split_addr(a).is_err() {
            continue;
        }
        if opts.addresses.iter().any(|x| x == a) || st.learned.iter().any(|x| x == a) {
            continue;
        }
        if st.learned.len() >= LEARNED_MAX {
            st.learned.remove(0);
        }
        st.learned.push(a.to_string());
    }
}

fn next_address(shared: &Shared) {
    let mut st = shared.lock();
    if st.redirect.take().is_none() {
        let n = shared.opts.addresses.len() + st.learned.len();
        st.target = (st.target + 1) % n;
    }
}

fn shutdown(shared: &Arc<Shared>, reason: Error) {
    let (conn, tasks) = {
        let mut st = shared.lock();
        st.closing = true;
        let conn = st.conn.take().or_else(|| st.live.take());
        st.live = None;
        (conn, std::mem::take(&mut *shared.tasks.lock().unwrap_or_else(|e| e.into_inner())))
    };
    if let Some(c) = conn {
        close_conn(shared, &c, reason.clone());
    }
    let spans = std::mem::take(&mut *shared.spans.lock().unwrap_or_else(|e| e.into_inner()));
    for s in spans.iter().filter_map(|w| w.upgrade()) {
        shutdown(&s, reason.clone());
    }
    end_all(shared, reason);
    for t in tasks {
        t.abort();
    }
    shared.bump();
}

fn end_all(shared: &Shared, reason: Error) {
    let mut st = shared.lock();
    let locals: Vec<u64> = st.subs.keys().copied().collect();
    for l in locals {
        end_sub(&mut st, l, reason.clone());
    }
    for c in std::mem::take(&mut st.replay) {
        let _ = c.tx.send((Err(reason.clone()), true));
    }
    for b in std::mem::take(&mut st.held) {
        for i in b.items {
            i.finish(Err(reason.clone()));
        }
    }
    for (_, _, i) in std::mem::take(&mut st.settle_q) {
        i.finish(Err(reason.clone()));
    }
    let closed = matches!(reason, Error::ClientClosed);
    let msg = if closed { None } else { Some(reason.to_string()) };
    shared.status(&mut st, Status::Closed(msg));
    st.status.clear();
}

fn end_sub(st: &mut State, local: u64, reason: Error) {
    if let Some(s) = st.subs.remove(&local) {
        s.assign.lock().unwrap_or_else(|e| e.into_inner()).end();
        s.alive.store(false, Ordering::SeqCst);
        if s.server_id != 0 {
            st.by_server.remove(&s.server_id);
        }
        st.ended.insert(local, reason);
    }
}

/// One connect: dial, handshake, restore. Leaves the connection live.
async fn attempt(shared: &Arc<Shared>) -> Result<Arc<Conn>> {
    let addr = {
        let st = shared.lock();
        if st.closing {
            return Err(Error::ClientClosed);
        }
        let nodes = known_nodes(&shared.opts, &st);
        st.redirect.clone().unwrap_or_else(|| nodes[st.target % nodes.len()].clone())
    };
    let (rd, wr, hello) = dial(shared, &addr).await?;
    let (conn, resumed) = {
        let mut st = shared.lock();
        if st.closing {
            return Err(Error::ClientClosed);
        }
        // Reconnects start from this node and go on from it through the
        // known nodes in turn.
        st.redirect = None;
        if hello.cluster {
            learn(&shared.opts, &mut st, [addr.as_str()]);
        }
        let nodes = known_nodes(&shared.opts, &st);
        if let Some(i) = nodes.iter().position(|a| *a == addr) {
            st.target = i;
        }
        st.addr = addr.clone();
        let resumed = hello.outcome == 1 && !st.identity.client_id.is_empty();
        st.identity = hello.resume.clone();
        if !resumed {
            st.epoch += 1;
            shared.stale_gen.fetch_add(1, Ordering::SeqCst);
            // The old session's leases are gone: its settles fail, its
            // buffered deliveries are dropped, its subscriptions are made again.
            for b in std::mem::take(&mut st.held) {
                for i in b.items {
                    i.finish(Err(Error::StaleDelivery));
                }
            }
            let epoch = st.epoch;
            let q = std::mem::take(&mut st.settle_q);
            for (o, d, i) in q {
                if i.epoch != epoch {
                    i.finish(Err(Error::StaleDelivery));
                } else {
                    st.settle_q.push((o, d, i));
                }
            }
            st.by_server.clear();
            for s in st.subs.values_mut() {
                s.server_id = 0;
                s.held.clear();
            }
        }
        let mut hb =
            if hello.heartbeat_ms > 0 { Some(Duration::from_millis(u64::from(hello.heartbeat_ms))) } else { None };
        if let Some(mine) = shared.opts.heartbeat {
            hb = Some(hb.map_or(mine, |b| b.min(mine)));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let conn = Arc::new(Conn {
            tx,
            epoch: st.epoch,
            frame_max: if hello.limits.frame_bytes_max > 0 {
                hello.limits.frame_bytes_max as usize
            } else {
                wire::FRAME_BYTES_DEFAULT
            },
            settle_batch_max: if hello.limits.settle_batch_max > 0 {
                hello.limits.settle_batch_max as usize
            } else {
                SETTLE_BATCH_DEFAULT
            },
            draining: AtomicBool::new(false),
            away_deadline_ms: AtomicI64::new(0),
            last_read: AtomicU64::new(0),
            paused: AtomicBool::new(false),
            born: Instant::now(),
            closed: watch::channel(false).0,
            away: watch::channel(false).0,
            reason: Mutex::new(None),
            moved: AtomicBool::new(false),
        });
        st.conn = Some(conn.clone());
        st.pending.clear();
        st.next_rid = 2;
        st.hello = hello;
        let mut tasks = shared.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(tokio::spawn(write_loop(conn.clone(), wr, rx)));
        tasks.push(tokio::spawn(read_loop(shared.clone(), conn.clone(), rd)));
        if let Some(hb) = hb {
            tasks.push(tokio::spawn(heartbeat(shared.clone(), conn.clone(), hb)));
        }
        (conn, resumed)
    };
    if let Err(e) = restore(shared, &conn, resumed).await {
        close_conn(shared, &conn, e.clone());
        return Err(e);
    }
    let mut st = shared.lock();
    if conn.is_closed() {
        let e = conn.reason.lock().unwrap_or_else(|e| e.into_inner()).clone();
        return Err(e.unwrap_or_else(|| Error::ConnectionLost("closed while restoring".into())));
    }
    st.live = Some(conn.clone());
    st.gave_up = None;
    shared.status(&mut st, Status::Connected { resumed });
    // Settles queued while the client reconnected go out now.
    flush_settles(&mut st, &conn);
    drop(st);
    shared.bump();
    Ok(conn)
}

type Rd = Box<dyn AsyncRead + Unpin + Send>;
type Wr = Box<dyn AsyncWrite + Unpin + Send>;

async fn dial(shared: &Shared, addr: &str) -> Result<(Rd, Wr, wire::HelloOk)> {
    let opts = &shared.opts;
    let (host, _) = split_addr(addr)?;
    let tcp = match tokio::time::timeout(opts.dial_timeout, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(Error::Io(format!("connect {}: {}", addr, e), e.kind())),
        Err(_) => return Err(Error::Io(format!("connect {}: timed out", addr), std::io::ErrorKind::TimedOut)),
    };
    let _ = tcp.set_nodelay(true);
    let (mut rd, mut wr): (Rd, Wr) = match &opts.tls {
        None => {
            let (r, w) = tcp.into_split();
            (Box::new(r), Box::new(w))
        }
        Some(cfg) => {
            let name = opts.tls_server_name.clone().unwrap_or(host);
            let server_name = rustls::ServerName::try_from(name.as_str())
                .map_err(|_| Error::Tls(format!("{:?} is not a valid server name", name)))?;
            let connector = tokio_rustls::TlsConnector::from(cfg.clone());
            let s = match tokio::time::timeout(opts.dial_timeout, connector.connect(server_name, tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return Err(tls_error(e)),
                Err(_) => return Err(Error::Io(format!("TLS {}: timed out", addr), std::io::ErrorKind::TimedOut)),
            };
            let (r, w) = tokio::io::split(s);
            (Box::new(r), Box::new(w))
        }
    };
    let hello = {
        let st = shared.lock();
        wire::Hello {
            protocol_version: u16::from(wire::VERSION),
            client_name: opts.client_name.clone(),
            client_version: CLIENT_VERSION.into(),
            credentials: opts.credentials.clone(),
            resume: st.identity.clone(),
            user: opts.user.clone(),
        }
    };
    let hs = async {
        wr.write_all(&wire::encode_frame(&Body::Hello(hello), 1, 0)).await?;
        wr.flush().await?;
        let mut head = [0u8; 16];
        rd.read_exact(&mut head).await?;
        let h = wire::parse_header(&head, wire::FRAME_BYTES_DEFAULT)?;
        let mut body = vec![0u8; h.body_len];
        rd.read_exact(&mut body).await?;
        match Body::decode(h.op, &body)? {
            Body::HelloOk(ok) => {
                if ok.protocol_version != u16::from(wire::VERSION) {
                    return Err(Error::Protocol(format!("broker chose protocol version {}", ok.protocol_version)));
                }
                Ok(ok)
            }
            Body::Error(e) => Err(Error::broker(e.code, e.message, e.owner)),
            other => Err(Error::Protocol(format!("op 0x{:02x} in answer to HELLO", other.op()))),
        }
    };
    match tokio::time::timeout(opts.handshake_timeout, hs).await {
        Ok(Ok(ok)) => Ok((rd, wr, ok)),
        Ok(Err(Error::Io(m, k))) if k == std::io::ErrorKind::InvalidData && opts.tls.is_some() => Err(Error::Tls(m)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::Io(format!("handshake with {}: timed out", addr), std::io::ErrorKind::TimedOut)),
    }
}

fn tls_error(e: std::io::Error) -> Error {
    if e.kind() != std::io::ErrorKind::InvalidData {
        return e.into(); // the network's doing: retryable
    }
    let inner = e.get_ref().and_then(|x| x.downcast_ref::<rustls::Error>());
    match inner {
        Some(rustls::Error::CorruptMessage) | Some(rustls::Error::CorruptMessagePayload(_)) => Error::ServerNotTls,
        _ => Error::Tls(e.to_string()),
    }
}

// --- connection tasks -------------------------------------------------------------

async fn write_loop(conn: Arc<Conn>, mut wr: Wr, mut rx: mpsc::UnboundedReceiver<Vec<u8>>) {
    let mut closed = conn.closed.subscribe();
    let mut buf: Vec<u8> = Vec::with_capacity(WRITE_COALESCE_BYTES);
    loop {
        let first = tokio::select! {
            f = rx.recv() => match f { Some(f) => f, None => break },
            _ = closed.changed() => break,
        };
        buf.extend_from_slice(&first);
        while buf.len() < WRITE_COALESCE_BYTES {
            match rx.try_recv() {
                Ok(f) => buf.extend_from_slice(&f),
                Err(_) => break,
            }
        }
        let w = async {
            wr.write_all(&buf).await?;
            wr.flush().await
        };
        let res = tokio::select! {
            r = w => r,
            _ = closed.changed() => break,
        };
        if res.is_err() {
            break; // the reader sees the break and closes the connection
        }
        buf.clear();
    }
    // The socket closes when both halves are dropped; the reader's half goes
    // with its task.
}

async fn read_loop(shared: Arc<Shared>, conn: Arc<Conn>, mut rd: Rd) {
    let mut closed = conn.closed.subscribe();
    let mut buf: Vec<u8> = Vec::with_capacity(READ_CHUNK_BYTES);
    let mut start = 0usize;
    let err = loop {
        if buf.len() - start < 16 || buf.capacity() - buf.len() < 4096 {
            // Keep what is unread at the front before reading more.
            buf.drain(..start);
            start = 0;
            if buf.capacity() - buf.len() < 4096 {
                buf.reserve(READ_CHUNK_BYTES);
            }
        }
        let n = tokio::select! {
            r = rd.read_buf(&mut buf) => r,
            _ = closed.changed() => return,
        };
        match n {
            Ok(0) => break Error::ConnectionLost("connection closed by the broker".into()),
            Ok(_) => {}
            Err(e) => break Error::ConnectionLost(e.to_string()),
        }
        conn.last_read.store(conn.born.elapsed().as_millis() as u64, Ordering::Relaxed);
        let mut slow: Vec<(mpsc::Sender<Message>, Message)> = Vec::new();
        let res = {
            let mut st = shared.lock();
            let mut r = Ok(());
            while buf.len() - start >= 16 {
                let h = match wire::parse_header(&buf[start..start + 16], conn.frame_max) {
                    Ok(h) => h,
                    Err(e) => {
                        r = Err(Error::from(e));
                        break;
                    }
                };
                if buf.len() - start - 16 < h.body_len {
                    break;
                }
                let body = &buf[start + 16..start + 16 + h.body_len];
                if let Err(e) = dispatch(&shared, &mut st, &conn, h, body, &mut slow) {
                    r = Err(e);
                    break;
                }
                start += 16 + h.body_len;
            }
            r
        };
        if let Err(e) = res {
            break e;
        }
        // Deliveries a full buffer did not take: the reader waits, which is
        // backpressure on the broker.
        if !slow.is_empty() {
            // Not reading by choice is not a silent broker: the heartbeat
            // check waits while the reader does.
            conn.paused.store(true, Ordering::SeqCst);
            for (tx, m) in slow {
                tokio::select! {
                    _ = tx.send(m) => {},
                    _ = closed.changed() => return,
                }
            }
            conn.last_read.store(conn.born.elapsed().as_millis() as u64, Ordering::Relaxed);
            conn.paused.store(false, Ordering::SeqCst);
        }
    };
    close_conn(&shared, &conn, err);
}

fn dispatch(
    shared: &Arc<Shared>,
    st: &mut State,
    conn: &Arc<Conn>,
    h: wire::Header,
    body: &[u8],
    slow: &mut Vec<(mpsc::Sender<Message>, Message)>,
) -> Result<()> {
    let current = st.conn.as_ref().map_or(false, |c| Arc::ptr_eq(c, conn));
    if !current {
        return Ok(()); // a connection being closed: its frames no longer count
    }
    match h.op {
        op::DELIVER => {
            let d = wire::decode_deliver(body)?;
            deliver(shared, st, conn, d, slow);
        }
        op::PUBLISH_OK => {
            let ok = wire::decode_publish_ok_body(body)?;
            match st.pending.remove(&h.req_id) {
                Some(Pending::Publish(c)) => {
                    st.refusals = 0;
                    let _ = c.tx.send((Ok(ok), c.uncertain));
                }
                Some(_) => return Err(Error::Protocol("PUBLISH_OK in answer to another request".into())),
                None => {}
            }
        }
        op::SETTLE_RESULT => {
            let res = match Body::decode(h.op, body)? {
                Body::SettleResult(r) => r,
                _ => unreachable!(),
            };
            if let Some(p) = st.pending.remove(&h.req_id) {
                match p {
                    Pending::Settle(b) => settle_done(st, b, Some(&res.codes), None),
                    Pending::Reply(tx) => {
                        let _ = tx.send(Ok(Body::SettleResult(res)));
                    }
                    _ => return Err(Error::Protocol("SETTLE_RESULT in answer to another request".into())),
                }
            }
        }
        op::PING => conn.send(wire::encode_frame(&Body::Pong, h.req_id, 0)),
        op::PONG => {}
        _ => {
            let b = Body::decode(h.op, body)?;
            match b {
                Body::Error(e) => {
                    let err = Error::broker(e.code, e.message.clone(), e.owner.clone());
                    if h.req_id != 0 {
                        match st.pending.remove(&h.req_id) {
                            Some(Pending::Publish(c)) if !e.fatal && e.code == Code::SHUTTING_DOWN.0 => {
                                // Nothing was stored; it goes again on the next
                                // connection under the same producer sequence.
                                st.replay.push(c);
                            }
                            Some(Pending::Publish(mut c)) if !e.fatal => {
                                if refused(shared, st, conn, &mut c, &e) {
                                    // A cluster node that cannot take it: it
                                    // goes to another node.
                                    st.replay.push(c);
                                } else {
                                    fail_pending(st, Pending::Publish(c), err.clone());
                                }
                            }
                            Some(p) => fail_pending(st, p, err.clone()),
                            None => {}
                        }
                    }
                    if e.fatal {
                        return Err(err);
                    }
                }
                Body::SubClosed(sc) => sub_closed(st, sc),
                Body::GoingAway(g) => {
                    conn.draining.store(true, Ordering::SeqCst);
                    conn.away_deadline_ms.store(g.deadline_ms, Ordering::SeqCst);
                    if !g.redirect.is_empty() && g.redirect.len() <= REDIRECT_MAX && split_addr(&g.redirect).is_ok() {
                        // A cluster node names one that stays up: the next
                        // connection goes there.
                        st.redirect = Some(g.redirect.clone());
                        learn(&shared.opts, st, [g.redirect.as_str()]);
                    }
                    conn.away.send_replace(true);
                    shared.status(st, Status::GoingAway);
                }
                Body::Assignment(a) => {
                    // An unknown sub_id is ignored.
                    let s = st.by_server.get(&a.sub_id).and_then(|l| st.subs.get(l));
                    if let Some(s) = s {
                        s.assign.lock().unwrap_or_else(|e| e.into_inner()).push(AssignmentEvent {
                            partition: a.partition,
                            epoch: a.epoch,
                            assigned: a.state == 1,
                            dropped: 0,
                        });
                    }
                }
                Body::Hello(_)
                | Body::DeclareQueue(_)
                | Body::Publish(_)
                | Body::Subscribe(_)
                | Body::Ack(_)
                | Body::Nack(_)
                | Body::Fail(_)
                | Body::Extend(_)
                | Body::Reconcile(_)
                | Body::Inflight(_)
                | Body::EndSession
                | Body::DeleteQueue(_)
                | Body::PurgeQueue(_)
                | Body::Unsubscribe(_)
                | Body::Metadata(_) => {
                    return Err(Error::Protocol(format!("broker sent client op 0x{:02x}", h.op)));
                }
                reply => match st.pending.remove(&h.req_id) {
                    Some(Pending::Reply(tx)) => {
                        let _ = tx.send(Ok(reply));
                    }
                    Some(Pending::Subscribe { local, new, tx }) => {
                        if let Body::SubscribeOk(ok) = &reply {
                            if let Some(s) = new {
                                st.subs.insert(local, *s);
                            }
                            if let Some(s) = st.subs.get_mut(&local) {
                                s.server_id = ok.sub_id;
                                s.prefetch = ok.prefetch;
                                s.recreating = false;
                                st.by_server.insert(ok.sub_id, local);
                            }
                        }
                        let _ = tx.send(Ok(reply));
                    }
                    Some(Pending::Reconcile(tx)) => {
                        if let Body::ReconcileResult(rr) = &reply {
                            apply_reconcile(st, rr);
                        }
                        let _ = tx.send(Ok(reply));
                    }
                    Some(p) => fail_pending(st, p, Error::Protocol(format!("op 0x{:02x} in answer", h.op))),
                    None => {}
                },
            }
        }
    }
    Ok(())
}

fn deliver(
    shared: &Arc<Shared>,
    st: &mut State,
    conn: &Conn,
    d: wire::Deliver,
    slow: &mut Vec<(mpsc::Sender<Message>, Message)>,
) {
    let local = match st.by_server.get(&d.sub_id) {
        Some(l) => *l,
        None => return, // an ended subscription: the broker takes it back
    };
    let s = match st.subs.get_mut(&local) {
        Some(s) => s,
        None => return,
    };
    let lease = d.lease();
    if !s.auto_ack {
        if s.held.contains_key(&d.tag) {
            return; // a re-send of a delivery the application already has
        }
        s.held.insert(d.tag, lease);
    }
    let m = Message {
        shared: shared.clone(),
        span: s.span.clone(),
        local,
        epoch: conn.epoch,
        auto_ack: s.auto_ack,
        settled: Arc::new(AtomicBool::new(false)),
        gen: shared.stale_gen.load(Ordering::SeqCst),
        lease_ends: if d.lease_ms > 0 && !s.auto_ack {
            Some(Instant::now() + Duration::from_millis(u64::from(d.lease_ms)))
        } else {
            None
        },
        tag: d.tag,
        lease,
        topic: d.topic,
        group: d.group,
        partition: d.partition,
        offset: d.offset,
        attempt: d.attempt,
        published_at_ms: d.published_at_ms,
        key: d.key,
        headers: d.headers,
        content_type: d.content_type,
        body: d.body,
        assignment: d.assignment,
    };
    if !slow.is_empty() {
        slow.push((s.tx.clone(), m));
        return;
    }
    match s.tx.try_send(m) {
        Ok(()) => {}
        Err(mpsc::error::TrySendError::Full(m)) => slow.push((s.tx.clone(), m)),
        Err(mpsc::error::TrySendError::Closed(_)) => {}
    }
}

fn sub_closed(st: &mut State, sc: wire::SubClosed) {
    let local = match st.by_server.remove(&sc.sub_id) {
        Some(l) => l,
        None => return,
    };
    if let Some(s) = st.subs.get_mut(&local) {
        s.server_id = 0;
    }
    let reason = match sc.reason {
        5 => return, // broker shutdown: made again on the next connection
        1 => Error::Unsubscribed,
        2 => Error::ReconciledClosed(sc.message),
        3 => Error::broker(Code::NOT_FOUND.0, format!("queue deleted: {}", sc.message), ""),
        _ => Error::broker(if sc.code == 0 { Code::INTERNAL.0 } else { sc.code }, sc.message, ""),
    };
    end_sub(st, local, reason);
}

fn apply_reconcile(st: &mut State, rr: &wire::ReconcileResult) {
    for x in &rr.entries {
        if x.client_sub_id == 0 {
            continue;
        }
        let local = match st.by_server.get(&x.client_sub_id) {
            Some(l) => *l,
            None => continue,
        };
        match x.action {
            1 => {
                if x.server_sub_id != 0 && x.server_sub_id != x.client_sub_id {
                    st.by_server.remove(&x.client_sub_id);
                    st.by_server.insert(x.server_sub_id, local);
                    if let Some(s) = st.subs.get_mut(&local) {
                        s.server_id = x.server_sub_id;
                    }
                }
            }
            2 => end_sub(st, local, Error::ReconciledClosed(x.reason.clone())),
            4 => {
                st.by_server.remove(&x.client_sub_id);
                if let Some(s) = st.subs.get_mut(&local) {
                    if x.server_sub_id != 0 {
                        s.server_id = x.server_sub_id;
                        st.by_server.insert(x.server_sub_id, local);
                    } else {
                        s.server_id = 0;
                        s.recreating = true;
                    }
                }
            }
            _ => {}
        }
    }
}

fn fail_pending(st: &mut State, p: Pending, err: Error) {
    match p {
        Pending::Publish(c) => {
            let uncertain = c.uncertain;
            let _ = c.tx.send((Err(err), uncertain));
        }
        Pending::Settle(b) => settle_done(st, b, None, Some(err)),
        Pending::Reply(tx) | Pending::Reconcile(tx) | Pending::Subscribe { tx, .. } => {
            let _ = tx.send(Err(err));
        }
    }
}

fn settle_done(st: &mut State, b: SettleBatch, codes: Option<&[u16]>, err: Option<Error>) {
    for (i, it) in b.items.into_iter().enumerate() {
        let code = match (codes, &err) {
            (Some(c), _) => c.get(i).copied().unwrap_or(Code::INTERNAL.0),
            _ => u16::MAX,
        };
        let forget = code == 0 || code == Code::STALE_LEASE.0 || code == Code::UNKNOWN_TAG.0;
        if forget && b.op != op::EXTEND {
            if let Some(s) = st.subs.get_mut(&it.local) {
                s.held.remove(&it.tag);
            }
        }
        let out = match code {
            0 => Ok(()),
            12 => Err(Error::StaleDelivery),
            13 => Err(Error::UnknownTag),
            u16::MAX => Err(err.clone().unwrap_or_else(|| Error::ConnectionLost("settle".into()))),
            c => Err(Error::broker(c, "settle refused", "")),
        };
        it.finish(out);
    }
}

/// Closes a connection once: its requests go where they belong (publishes
/// to be sent again, settles held for the resumed session, the rest fail).
fn close_conn(shared: &Arc<Shared>, conn: &Arc<Conn>, reason: Error) {
    if conn.closed.send_replace(true) {
        return;
    }
    *conn.reason.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.clone());
    let mut st = shared.lock();
    if st.live.as_ref().map_or(false, |c| Arc::ptr_eq(c, conn)) {
        st.live = None;
    }
    if st.conn.as_ref().map_or(false, |c| Arc::ptr_eq(c, conn)) {
        st.conn = None;
        let pending: Vec<(u64, Pending)> = st.pending.drain().collect();
        let mut pending = pending;
        pending.sort_by_key(|(r, _)| *r);
        let lost = Error::ConnectionLost(reason.to_string());
        for (_, p) in pending {
            if st.closing || st.fatal.is_some() {
                let e = st.fatal.clone().unwrap_or(Error::ClientClosed);
                fail_pending(&mut st, p, e);
                continue;
            }
            match p {
                Pending::Publish(mut c) => {
                    c.uncertain = true;
                    st.replay.push(c);
                }
                Pending::Settle(b) => st.held.push(b),
                other => fail_pending(&mut st, other, lost.clone()),
            }
        }
        shared.status(&mut st, Status::Disconnected(reason.to_string()));
    }
    drop(st);
    shared.bump();
}

// --- cluster routing ------------------------------------------------------------
//
// The client keeps one connection. In a cluster (HELLO_OK says so) it is not
// pinned to the addresses it was given: it learns the cluster's nodes (the
// owners and replicas METADATA lists, owners named by `not_owner`, GOING_AWAY
// redirects), and a publish a node refuses with `not_owner`, `fenced` or
// `unavailable` is kept and the connection moves, after a short pause, to the
// owner the refusal names or else to the next known node, where the publish
// is sent again under the same producer id and sequence (stored once).

/// A cluster node refused a publish: keeps it for the next connection and
/// moves the connection (see above). False when the refusal is the
/// publish's outcome: another code, a single broker, or MOVE_BUDGET spent.
fn refused(shared: &Arc<Shared>, st: &mut State, conn: &Arc<Conn>, c: &mut PubCall, e: &wire::ErrorBody) -> bool {
    let code = Code(e.code);
    if st.closing
        || shared.opts.pinned
        || !st.hello.cluster
        || !(code == Code::NOT_OWNER || code == Code::FENCED || code == Code::UNAVAILABLE)
    {
        return false;
    }
    let now = Instant::now();
    let first = *c.refused_at.get_or_insert(now);
    if now.saturating_duration_since(first) > MOVE_BUDGET {
        return false;
    }
    let owner = if code == Code::NOT_OWNER && split_addr(&e.owner).is_ok() { e.owner.clone() } else { String::new() };
    if owner.is_empty() {
        let here = st.addr.clone();
        st.refused_by.insert(here, now);
        if st.refused_by.len() > LEARNED_MAX + shared.opts.addresses.len() {
            st.refused_by.retain(|_, at| now.saturating_duration_since(*at) < SHUN);
        }
    }
    st.probe_wanted = true;
    move_off(shared, st, conn, owner, now);
    true
}

/// Schedules the move of `conn` to `owner`, or when none is named (or it is
/// the node already dialled, or refused a moment ago) to the next known
/// node that has not refused a publish within SHUN.
fn move_off(shared: &Arc<Shared>, st: &mut State, conn: &Arc<Conn>, owner: String, now: Instant) {
    let current = st.live.as_ref().map_or(false, |c| Arc::ptr_eq(c, conn));
    if st.moving || !current || conn.is_closed() {
        return;
    }
    let fresh = |a: &str| st.refused_by.get(a).map_or(true, |at| now.saturating_duration_since(*at) >= SHUN);
    let nxt = if !owner.is_empty() && owner != st.addr && fresh(&owner) {
        owner
    } else {
        let nodes = known_nodes(&shared.opts, st);
        let i = nodes.iter().position(|a| *a == st.addr).map_or(0, |i| i + 1);
        let order: Vec<&String> = nodes[i..].iter().chain(nodes[..i].iter()).collect();
        order.iter().find(|a| ***a != st.addr && fresh(a)).map(|a| (*a).clone()).unwrap_or_else(|| order[0].clone())
    };
    learn(&shared.opts, st, [nxt.as_str()]);
    let pause = MOVE_PAUSE_MIN.saturating_mul(1u32 << st.refusals.min(10)).min(MOVE_PAUSE_MAX);
    st.refusals = st.refusals.saturating_add(1);
    st.moving = true;
    let (shared, conn) = (shared.clone(), conn.clone());
    let sleep = shared.opts.clock.sleep(pause);
    tokio::spawn(async move {
        sleep.await;
        {
            let mut st = shared.lock();
            st.moving = false;
            let current = st.live.as_ref().map_or(false, |c| Arc::ptr_eq(c, &conn));
            if st.closing || !current || conn.is_closed() {
                return;
            }
            st.redirect = Some(nxt.clone());
            conn.moved.store(true, Ordering::SeqCst);
        }
        close_conn(&shared, &conn, Error::ConnectionLost(format!("leaving a node that refused a publish for {}", nxt)));
    });
}

/// Asks the connected cluster node in the background where the queue's
/// partitions are served, to learn the nodes holding them; at most once
/// per PROBE_EVERY, and only while the nodes known may be out of date.
fn probe(shared: &Arc<Shared>, topic: &str, group: &str) {
    {
        let mut st = shared.lock();
        if shared.opts.pinned || !st.hello.cluster || st.probing || !st.probe_wanted || st.closing {
            return;
        }
        if st.probed_at.map_or(false, |at| at.elapsed() < PROBE_EVERY) {
            return;
        }
        st.probing = true;
        st.probed_at = Some(Instant::now());
    }
    let shared = shared.clone();
    let q = wire::QueueRef { topic: topic.to_string(), group: group.to_string() };
    tokio::spawn(async move {
        let r = tokio::time::timeout(PROBE_TIMEOUT, metadata(&shared, q)).await;
        let mut st = shared.lock();
        st.probing = false;
        if let Ok(Ok(md)) = r {
            if md.cluster {
                st.probe_wanted = false;
            }
        }
    });
}

/// METADATA on the live connection; a cluster's answer teaches the client
/// the nodes it names.
async fn metadata(shared: &Arc<Shared>, q: wire::QueueRef) -> Result<wire::MetadataResult> {
    let conn = acquire(shared, false).await?;
    match reply(start(shared, &conn, &Body::Metadata(q), Pending::Reply)?).await? {
        Body::MetadataResult(md) => {
            if md.cluster {
                let mut st = shared.lock();
                for pm in &md.partitions {
                    learn(
                        &shared.opts,
                        &mut st,
                        std::iter::once(pm.owner.as_str()).chain(pm.replicas.iter().map(|s| s.as_str())),
                    );
                }
            }
            Ok(md)
        }
        _ => Err(Error::Protocol("unexpected answer to METADATA".into())),
    }
}

async fn heartbeat(shared: Arc<Shared>, conn: Arc<Conn>, every: Duration) {
    let mut closed = conn.closed.subscribe();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {},
            _ = closed.changed() => return,
        }
        let idle = (conn.born.elapsed().as_millis() as u64).saturating_sub(conn.last_read.load(Ordering::Relaxed));
        if idle > 3 * every.as_millis() as u64 && !conn.paused.load(Ordering::SeqCst) {
            close_conn(&shared, &conn, Error::HeartbeatTimeout);
            return;
        }
        let mut st = shared.lock();
        if !st.conn.as_ref().map_or(false, |c| Arc::ptr_eq(c, &conn)) {
            return;
        }
        let r = rid(&mut st);
        conn.send(wire::encode_frame(&Body::Ping, r, 0));
    }
}

/// Sends a request on `conn` (which must be the current one) and returns the
/// receiver of its reply.
fn start(
    shared: &Shared,
    conn: &Arc<Conn>,
    body: &Body,
    kind: fn(Reply) -> Pending,
) -> Result<oneshot::Receiver<Result<Body>>> {
    let frame_probe = wire::encode_frame(body, 0, 0);
    if frame_probe.len() > conn.frame_max {
        return Err(Error::invalid(
            "body",
            format!("a frame of {} bytes exceeds the broker's limit of {}", frame_probe.len(), conn.frame_max),
        ));
    }
    let mut st = shared.lock();
    if conn.is_closed() || !st.conn.as_ref().map_or(false, |c| Arc::ptr_eq(c, conn)) {
        return Err(Error::ConnectionLost("connection closed".into()));
    }
    let (tx, rx) = oneshot::channel();
    let r = rid(&mut st);
    let mut frame = frame_probe;
    frame[8..16].copy_from_slice(&r.to_be_bytes());
    st.pending.insert(r, kind(tx));
    conn.send(frame);
    Ok(rx)
}

async fn reply(rx: oneshot::Receiver<Result<Body>>) -> Result<Body> {
    match rx.await {
        Ok(r) => r,
        Err(_) => Err(Error::ConnectionLost("request dropped".into())),
    }
}

async fn restore(shared: &Arc<Shared>, conn: &Arc<Conn>, resumed: bool) -> Result<()> {
    if resumed {
        let (views, cohorts): (Vec<wire::SubView>, Vec<wire::SubCohort>) = {
            let st = shared.lock();
            let live = || st.subs.values().filter(|s| s.server_id != 0);
            (
                live().map(|s| s.view()).collect(),
                // So that a subscription the broker recreates joins its cohort again.
                live()
                    .filter(|s| !s.cohort.is_empty())
                    .map(|s| wire::SubCohort {
                        sub_id: s.server_id,
                        cohort: s.cohort.clone(),
                        member: s.member.clone(),
                    })
                    .collect(),
            )
        };
        if !views.is_empty() {
            let policy = match shared.opts.reconcile {
                ReconcilePolicy::Conservative => 0,
                ReconcilePolicy::Restore => 1,
            };
            let rc = Body::Reconcile(wire::Reconcile { policy, subs: views, inflight_follows: true, cohorts });
            match reply(start(shared, conn, &rc, Pending::Reconcile)?).await? {
                Body::ReconcileResult(_) => {}
                _ => return Err(Error::Protocol("unexpected answer to RECONCILE".into())),
            }
            // The deliveries the client holds unsettled, so the broker
            // re-sends only what it lacks (and binds these tags again after
            // a restart).
            let entries: Vec<wire::InflightEntry> = {
                let st = shared.lock();
                st.subs
                    .values()
                    .filter(|s| !s.auto_ack)
                    .flat_map(|s| s.held.iter().map(|(t, l)| wire::InflightEntry { tag: *t, lease: *l }))
                    .collect()
            };
            match reply(start(shared, conn, &Body::Inflight(wire::Inflight { entries }), Pending::Reply)?).await {
                Ok(Body::InflightResult(ir)) => {
                    let mut st = shared.lock();
                    if !ir.stale.is_empty() {
                        shared.stale_gen.fetch_add(1, Ordering::SeqCst);
                    }
                    for t in ir.stale {
                        for s in st.subs.values_mut() {
                            s.held.remove(&t);
                        }
                    }
                }
                Ok(_) => return Err(Error::Protocol("unexpected answer to INFLIGHT".into())),
                Err(Error::Broker { .. }) => {} // a broker without INFLIGHT re-sends; held tags de-duplicate
                Err(e) => return Err(e),
            }
        }
    }
    // Subscriptions without a server id (a fresh session, a recreate) are made again.
    let todo: Vec<(u64, wire::Subscribe, bool)> = {
        let st = shared.lock();
        st.subs
            .iter()
            .filter(|(_, s)| s.server_id == 0)
            .map(|(l, s)| {
                (
                    *l,
                    wire::Subscribe {
                        topic: s.topic.clone(),
                        group: s.group.clone(),
                        partition: s.partition,
                        ack_mode: s.auto_ack as u8,
                        prefetch: s.prefetch,
                        cohort: s.cohort.clone(),
                        member: s.member.clone(),
                    },
                    s.recreating,
                )
            })
            .collect()
    };
    for (local, body, recreating) in todo {
        let rx = {
            let body = Body::Subscribe(body);
            let frame = wire::encode_frame(&body, 0, 0);
            let mut st = shared.lock();
            if conn.is_closed() {
                return Err(Error::ConnectionLost("closed while restoring".into()));
            }
            let (tx, rx) = oneshot::channel();
            let r = rid(&mut st);
            let mut frame = frame;
            frame[8..16].copy_from_slice(&r.to_be_bytes());
            st.pending.insert(r, Pending::Subscribe { local, new: None, tx });
            conn.send(frame);
            rx
        };
        match reply(rx).await {
            Ok(_) => {}
            Err(e @ Error::Broker { .. }) => {
                let mut st = shared.lock();
                let reason = if recreating { Error::Recreated(Box::new(e)) } else { e };
                end_sub(&mut st, local, reason);
            }
            Err(e) => return Err(e),
        }
    }
    // Settles cut off from the last connection, then publishes, in order.
    let mut st = shared.lock();
    if conn.is_closed() {
        return Err(Error::ConnectionLost("closed while restoring".into()));
    }
    for b in std::mem::take(&mut st.held) {
        let r = rid(&mut st);
        conn.send(b.frame(r));
        st.pending.insert(r, Pending::Settle(b));
    }
    let mut replay = std::mem::take(&mut st.replay);
    replay.sort_by_key(|c| c.seq);
    for c in replay {
        if c.tx.is_closed() {
            // The application dropped the publish: it is not sent again (the
            // cut-off send may or may not have stored it).
            continue;
        }
        let r = rid(&mut st);
        conn.send(c.frame(r));
        st.pending.insert(r, Pending::Publish(c));
    }
    Ok(())
}

/// Watches the live connection and reconnects when it ends.
async fn supervise(shared: Arc<Shared>, first: Arc<Conn>) {
    let pol = shared.opts.reconnect.clone();
    let clock = shared.opts.clock.clone();
    let mut failures = 0u32;
    let mut conn = first;
    loop {
        let connected_at = clock.now();
        let planned = watch_conn(&shared, &conn).await;
        let err = conn
            .reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or(Error::ConnectionLost("closed".into()));
        if shared.lock().closing {
            return;
        }
        if !err.is_retryable() {
            fail_fatal(&shared, err);
            return;
        }
        if clock.now().saturating_duration_since(connected_at) >= pol.reset_after {
            failures = 0;
        }
        let mut immediate = planned;
        loop {
            if !immediate {
                let mut d = pol.delay(failures, (shared.opts.rand)());
                if planned {
                    d = d.min(GOING_AWAY_BACKOFF_MAX);
                }
                clock.sleep(d).await;
                if shared.lock().closing {
                    return;
                }
            }
            immediate = false;
            match attempt(&shared).await {
                Ok(c) => {
                    conn = c;
                    break;
                }
                Err(e) => {
                    if shared.lock().closing {
                        return;
                    }
                    if !e.is_retryable() {
                        fail_fatal(&shared, e);
                        return;
                    }
                    failures += 1;
                    next_address(&shared);
                    if pol.max_attempts > 0 && failures >= pol.max_attempts {
                        give_up(&shared, Error::Disconnected(format!("gave up after {} attempts: {}", failures, e)));
                        // An operation asks for one fresh attempt.
                        shared.kick.notified().await;
                        immediate = true;
                    }
                }
            }
        }
    }
}

/// Waits until `conn` ends. After `GOING_AWAY`, new operations wait for the
/// next connection while work in flight finishes here; then the client
/// closes the connection itself. Returns whether it was a planned stop.
async fn watch_conn(shared: &Arc<Shared>, conn: &Arc<Conn>) -> bool {
    let mut closed = conn.closed.subscribe();
    let mut away = conn.away.subscribe();
    if !conn.is_closed() && !*away.borrow() {
        tokio::select! {
            _ = closed.changed() => {},
            _ = away.changed() => {},
        }
    }
    if !*conn.away.borrow() {
        return conn.moved.load(Ordering::SeqCst);
    }
    shared.bump(); // publishers move to wait for the next connection
    let left = conn.away_deadline_ms.load(Ordering::SeqCst) - now_ms();
    let wait = Duration::from_millis(left.max(0) as u64).min(GOING_AWAY_WAIT_MAX);
    let until = Instant::now() + wait;
    while !conn.is_closed() {
        let idle = {
            let st = shared.lock();
            st.pending.is_empty() && st.settle_q.is_empty() && st.subs.values().all(|s| s.held.is_empty())
        };
        if idle || Instant::now() >= until {
            close_conn(shared, conn, Error::broker(Code::SHUTTING_DOWN.0, "broker going away", ""));
            break;
        }
        tokio::time::sleep(GOING_AWAY_POLL).await;
    }
    true
}

fn fail_fatal(shared: &Arc<Shared>, err: Error) {
    {
        let mut st = shared.lock();
        st.fatal = Some(err.clone());
        st.live = None;
    }
    end_all(shared, err);
    shared.bump();
}

fn give_up(shared: &Arc<Shared>, err: Error) {
    {
        let mut st = shared.lock();
        st.gave_up = Some(err.clone());
        let locals: Vec<u64> = st.subs.keys().copied().collect();
        for l in locals {
            end_sub(&mut st, l, err.clone());
        }
        for c in std::mem::take(&mut st.replay) {
            let _ = c.tx.send((Err(err.clone()), true));
        }
        for b in std::mem::take(&mut st.held) {
            for i in b.items {
                i.finish(Err(err.clone()));
            }
        }
        for (_, _, i) in std::mem::take(&mut st.settle_q) {
            i.finish(Err(err.clone()));
        }
        shared.status(&mut st, Status::Disconnected(err.to_string()));
    }
    shared.bump();
}

/// The live connection for a new operation, waiting while the client
/// reconnects. `for_settle` accepts a draining one.
async fn acquire(shared: &Arc<Shared>, for_settle: bool) -> Result<Arc<Conn>> {
    let mut kicked = false;
    loop {
        let mut rx = {
            let st = shared.lock();
            if st.closing {
                return Err(Error::ClientClosed);
            }
            if let Some(e) = &st.fatal {
                return Err(e.clone());
            }
            if let Some(c) = &st.live {
                if !c.is_closed() && (for_settle || !c.draining.load(Ordering::SeqCst)) {
                    return Ok(c.clone());
                }
            }
            if let Some(e) = &st.gave_up {
                if kicked {
                    return Err(Error::Disconnected(format!("not connected: {}", e)));
                }
                kicked = true;
                shared.kick.notify_one();
            }
            shared.changed.subscribe()
        };
        let _ = rx.changed().await;
    }
}

// --- settles ------------------------------------------------------------------

async fn settle_loop(shared: Arc<Shared>) {
    loop {
        shared.settle_kick.notified().await;
        // One turn for other settles of this moment to join the batch.
        tokio::task::yield_now().await;
        let mut st = shared.lock();
        st.settle_kicked = false;
        if let Some(c) = st.live.clone() {
            if !c.is_closed() {
                flush_settles(&mut st, &c);
            }
        }
    }
}

/// Sends the queued settles on `conn`: one frame per op and delay, of up to
/// the broker's settle_batch_max tags.
fn flush_settles(st: &mut State, conn: &Arc<Conn>) {
    if st.settle_q.is_empty() {
        return;
    }
    let items = std::mem::take(&mut st.settle_q);
    let mut groups: Vec<SettleBatch> = Vec::new();
    for (o, d, it) in items {
        if it.epoch != st.epoch {
            it.finish(Err(Error::StaleDelivery));
            continue;
        }
        match groups.iter_mut().find(|g| g.op == o && g.delay == d && g.items.len() < conn.settle_batch_max) {
            Some(g) => g.items.push(it),
            None => groups.push(SettleBatch { op: o, delay: d, items: vec![it] }),
        }
    }
    for b in groups {
        let r = rid(st);
        conn.send(b.frame(r));
        st.pending.insert(r, Pending::Settle(b));
    }
}

impl Client {
    fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }

    /// Publishes `body` to the default group of `topic` and returns once the
    /// broker has it on disk.
    pub async fn publish(&self, topic: &str, body: impl Into<Vec<u8>>) -> Result<PublishConfirm> {
        self.publish_with(topic, body, PublishOptions::default()).await
    }

    /// Publishes with options. Each publish carries this client's producer
    /// id and a new sequence, so one resent after a reconnect is stored
    /// once: a resend the broker already holds is answered with the
    /// original's position and `duplicate = true`. Cut-off publishes are
    /// resent automatically; this call does not fail because a connection
    /// broke.
    pub async fn publish_with(
        &self,
        topic: &str,
        body: impl Into<Vec<u8>>,
        o: PublishOptions,
    ) -> Result<PublishConfirm> {
        let shared = self.shared();
        let body = body.into();
        if o.headers.len() > HEADERS_MAX {
            return Err(Error::invalid("headers", format!("at most {} headers, got {}", HEADERS_MAX, o.headers.len())));
        }
        if let Some((k, _)) = o.headers.iter().find(|(k, _)| k.starts_with("sinew.")) {
            return Err(Error::invalid("headers", format!("key {:?}: keys starting with \"sinew.\" are reserved", k)));
        }
        let mut partition = match o.partition {
            None => -1,
            Some(p) => {
                i32::try_from(p).map_err(|_| Error::invalid("partition", format!("{} is above {}", p, i32::MAX)))?
            }
        };
        let keyless = o.key.is_empty();
        let hkey = (topic.to_string(), o.group.clone());
        let (frame_max, hint) = {
            let st = shared.lock();
            let fm = if st.hello.limits.frame_bytes_max > 0 {
                st.hello.limits.frame_bytes_max as usize
            } else {
                wire::FRAME_BYTES_DEFAULT
            };
            (fm, if keyless && partition == -1 { st.hints.get(&hkey).copied() } else { None })
        };
        // A keyless publish goes to the partition the broker hinted in its
        // answer to the last one to this queue, explicitly (docs/protocol.md
        // 5.6, "Partition hints"): its resends keep the partition, so the
        // broker's deduplication holds. Without a hint the broker hashes it.
        let mut hinted = false;
        if let Some(h) = hint {
            partition = h;
            hinted = true;
        }
        let mut p = wire::Publish {
            topic: topic.to_string(),
            group: o.group,
            partition,
            key: o.key,
            headers: o.headers,
            content_type: o.content_type,
            delay_ms: o.delay.map_or(0, ms),
            not_before_ms: 0,
            ttl_ms: o.ttl.map_or(0, ms),
            producer_id: shared.producer_id.clone(),
            ..Default::default()
        };
        let mut head = Vec::with_capacity(64);
        p.encode_head(&mut head);
        if 16 + head.len() + 30 + body.len() > frame_max {
            return Err(Error::invalid(
                "body",
                format!("a message of {} bytes exceeds the broker's frame limit of {} bytes", body.len(), frame_max),
            ));
        }
        probe(shared, &p.topic, &p.group);
        let _slot = shared.window.acquire().await.map_err(|_| Error::ClientClosed)?;
        let nbytes = body.len().clamp(1, PUBLISH_WINDOW_BYTES) as u32;
        let _bytes = shared.window_bytes.acquire_many(nbytes).await.map_err(|_| Error::ClientClosed)?;
        let body = Arc::new(body);
        let mut seq = 0u64;
        loop {
            let (tx, rx) = oneshot::channel();
            let pc = PubCall {
                head: Arc::new(head.clone()),
                seq,
                body: body.clone(),
                tx,
                uncertain: false,
                refused_at: None,
            };
            seq = self.send_publish(pc).await?;
            let (res, uncertain) = rx.await.map_err(|_| Error::ClientClosed)?;
            match res {
                Ok(ok) => {
                    if keyless {
                        let mut st = shared.lock();
                        note_hint(&mut st.hints, hkey, ok.next);
                    }
                    return Ok(PublishConfirm { partition: ok.partition, offset: ok.offset, duplicate: ok.duplicate });
                }
                // The hinted partition is gone (the queue was deleted and
                // declared again with fewer) and no send of it was cut off
                // (one could have been stored): it goes again, under the same
                // sequence, without a partition, and the hint is dropped.
                Err(e) if hinted && !uncertain && e.code() == Some(Code::NOT_FOUND) => {
                    shared.lock().hints.remove(&hkey);
                    hinted = false;
                    p.partition = -1;
                    head.clear();
                    p.encode_head(&mut head);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends a publish on the live connection once there is one, numbering
    /// it on its first send; returns its sequence.
    async fn send_publish(&self, pc: PubCall) -> Result<u64> {
        let shared = self.shared();
        let mut call = Some(pc);
        loop {
            let wait = {
                let mut st = shared.lock();
                if st.closing {
                    return Err(Error::ClientClosed);
                }
                if let Some(e) = &st.fatal {
                    return Err(e.clone());
                }
                let live = st.live.clone().filter(|c| !c.is_closed() && !c.draining.load(Ordering::SeqCst));
                match live {
                    Some(c) => {
                        let mut pc = call.take().expect("sent once");
                        if pc.seq == 0 {
                            st.seq += 1;
                            pc.seq = st.seq;
                        }
                        let seq = pc.seq;
                        let r = rid(&mut st);
                        c.send(pc.frame(r));
                        st.pending.insert(r, Pending::Publish(pc));
                        return Ok(seq);
                    }
                    None if st.gave_up.is_some() => None,
                    None => Some(shared.changed.subscribe()),
                }
            };
            match wait {
                Some(mut w) => {
                    let _ = w.changed().await;
                }
                None => {
                    acquire(shared, false).await?;
                }
            }
        }
    }

    async fn request(&self, body: Body) -> Result<Body> {
        let conn = acquire(self.shared(), false).await?;
        reply(start(self.shared(), &conn, &body, Pending::Reply)?).await
    }

    /// Creates a queue or changes its settings. A connection lost meanwhile
    /// gives [`Error::ConnectionLost`] (retryable).
    pub async fn declare_queue(&self, topic: &str, o: QueueOptions) -> Result<DeclareResult> {
        let (mode, target) = match o.dead_letter {
            DeadLetter::Default => (0, String::new()),
            DeadLetter::Discard => (1, String::new()),
            DeadLetter::Global => (2, String::new()),
            DeadLetter::Queue(t) => (3, t),
        };
        let max_retries = match o.max_retries {
            None => -1,
            Some(n) => i32::try_from(n).map_err(|_| Error::invalid("max_retries", "above i32::MAX"))?,
        };
        let b = Body::DeclareQueue(wire::DeclareQueue {
            topic: topic.into(),
            group: o.group,
            partitions: o.partitions,
            dead_letter_mode: mode,
            dead_letter_target: target,
            max_retries,
            default_ttl_ms: o.default_ttl.map_or(0, ms),
            lease_ms: o.lease.map_or(0, ms),
        });
        match self.request(b).await? {
            Body::DeclareOk(ok) => Ok(DeclareResult { partitions: ok.partitions, created: ok.created }),
            _ => Err(Error::Protocol("unexpected answer to DECLARE_QUEUE".into())),
        }
    }

    /// Deletes a queue and everything in it; its subscriptions end with
    /// `not_found`.
    pub async fn delete_queue(&self, topic: &str, group: &str) -> Result<()> {
        self.request(Body::DeleteQueue(wire::QueueRef { topic: topic.into(), group: group.into() })).await.map(|_| ())
    }

    /// Discards the queue's queued messages; returns how many.
    pub async fn purge_queue(&self, topic: &str, group: &str) -> Result<u64> {
        match self.request(Body::PurgeQueue(wire::QueueRef { topic: topic.into(), group: group.into() })).await? {
            Body::PurgeOk(n) => Ok(n),
            _ => Err(Error::Protocol("unexpected answer to PURGE_QUEUE".into())),
        }
    }

    /// Subscribes to the default group of `topic` with manual settling.
    pub async fn subscribe(&self, topic: &str) -> Result<Subscription> {
        self.subscribe_with(topic, SubscribeOptions::default()).await
    }

    /// Subscribes with options. The subscription survives reconnects: it is
    /// kept on a resumed session and made again on a fresh one.
    ///
    /// In a cluster the subscription spans the queue's nodes: the client
    /// asks `METADATA` which nodes hold the queue's replicas and subscribes
    /// on each of them through a connection of its own, so the one stream
    /// receives every partition from whichever node owns it, and goes on
    /// receiving a partition from its new owner when ownership moves. A
    /// message is settled on the connection that delivered it.
    pub async fn subscribe_with(&self, topic: &str, o: SubscribeOptions) -> Result<Subscription> {
        let shared = self.shared();
        let clustered = {
            let st = shared.lock();
            !shared.opts.pinned && st.hello.cluster
        };
        if clustered {
            return self.subscribe_span(topic, o).await;
        }
        self.subscribe_here(topic, o).await
    }

    /// A subscription on each node holding a replica of the queue, merged.
    async fn subscribe_span(&self, topic: &str, o: SubscribeOptions) -> Result<Subscription> {
        let shared = self.shared();
        let q = wire::QueueRef { topic: topic.to_string(), group: o.group.clone() };
        let until = Instant::now() + SPAN_RESOLVE;
        let mut pause = Duration::from_millis(50);
        let mut created = false;
        let nodes = loop {
            let last = match tokio::time::timeout(PROBE_TIMEOUT, metadata(shared, q.clone())).await {
                Ok(Ok(md)) if !md.cluster => return self.subscribe_here(topic, o).await,
                Ok(Ok(md)) => {
                    let mut nodes: Vec<String> = Vec::new();
                    for pm in &md.partitions {
                        for a in std::iter::once(&pm.owner).chain(pm.replicas.iter()) {
                            if !a.is_empty() && split_addr(a).is_ok() && !nodes.contains(a) {
                                nodes.push(a.clone());
                            }
                        }
                    }
                    if !nodes.is_empty() {
                        break nodes;
                    }
                    Error::broker(Code::UNAVAILABLE.0, "no node holds the queue yet", "")
                }
                Ok(Err(e)) if e.code() == Some(Code::NOT_FOUND) && !created => {
                    // SUBSCRIBE creates a queue that does not exist; the
                    // subscription on this node does, then it is dropped.
                    created = true;
                    self.subscribe_here(topic, o.clone()).await?.unsubscribe().await?;
                    continue;
                }
                Ok(Err(e)) if !e.is_retryable() => return Err(e),
                Ok(Err(e)) => e,
                Err(_) => Error::ConnectionLost("METADATA unanswered".into()),
            };
            if Instant::now() + pause > until {
                return Err(last);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MOVE_PAUSE_MAX);
        };
        let mut subs: Vec<(Client, Subscription)> = Vec::new();
        let mut last = None;
        for node in nodes {
            let mut io = shared.opts.clone();
            io.addresses = vec![node];
            io.pinned = true;
            io.member_id = Some(shared.member_id.clone());
            io.connect_timeout = io.connect_timeout.min(SPAN_CONNECT);
            let c = match connect_with(io).await {
                Ok(c) => c,
                Err(e) if e.is_retryable() => {
                    last = Some(e);
                    continue; // a node that does not answer now: the others serve
                }
                Err(e) => return Err(e),
            };
            match c.subscribe_here(topic, o.clone()).await {
                Ok(sub) => subs.push((c, sub)),
                Err(e) if e.is_retryable() => {
                    let _ = c.close().await;
                    last = Some(e);
                }
                Err(e) => {
                    let _ = c.close().await;
                    for (c, _) in subs {
                        let _ = c.close().await;
                    }
                    return Err(e);
                }
            }
        }
        if subs.is_empty() {
            return Err(last.unwrap_or_else(|| Error::broker(Code::UNAVAILABLE.0, "no node took the subscription", "")));
        }
        {
            let mut spans = shared.spans.lock().unwrap_or_else(|e| e.into_inner());
            spans.retain(|w| w.strong_count() > 0);
            spans.extend(subs.iter().map(|(c, _)| Arc::downgrade(c.shared())));
        }
        let group = Arc::new(SpanGroup {
            topic: topic.to_string(),
            group: o.group.clone(),
            members: subs.iter().map(|(c, sub)| (Arc::downgrade(c.shared()), sub.local)).collect(),
        });
        for (c, sub) in &subs {
            if let Some(s) = c.shared().lock().subs.get_mut(&sub.local) {
                s.span = Some(group.clone());
            }
        }
        let mut it = subs.into_iter();
        let (c0, mut first) = it.next().expect("one at least");
        first.span_clients.push(c0);
        for (c, sub) in it {
            first.span_clients.push(c);
            first.span.push(sub);
        }
        Ok(first)
    }

    /// A subscription on the connected node.
    async fn subscribe_here(&self, topic: &str, o: SubscribeOptions) -> Result<Subscription> {
        let shared = self.shared();
        let partition = match o.partition {
            None => -1,
            Some(p) => {
                i32::try_from(p).map_err(|_| Error::invalid("partition", format!("{} is above {}", p, i32::MAX)))?
            }
        };
        if let Some(c) = &o.cohort {
            check_cohort_name("cohort", c)?;
        }
        if let Some(m) = &o.member_id {
            check_cohort_name("member_id", m)?;
            if o.cohort.is_none() {
                return Err(Error::invalid("member_id", "a member id needs a cohort"));
            }
        }
        let cohort = o.cohort.clone().unwrap_or_default();
        let member = match &o.cohort {
            None => String::new(),
            Some(_) => o.member_id.clone().unwrap_or_else(|| shared.member_id.clone()),
        };
        if !member.is_empty() {
            // A broker session holds one member id: refuse a second one here
            // rather than have the broker refuse it.
            let st = shared.lock();
            if let Some(other) = st.subs.values().find(|s| !s.member.is_empty() && s.member != member) {
                return Err(Error::invalid(
                    "member_id",
                    format!("this client's cohort subscriptions are member {:?}; a session uses one", other.member),
                ));
            }
        }
        loop {
            let conn = acquire(shared, false).await?;
            let (mtx, mrx) = mpsc::channel(DELIVERY_BUFFER);
            let assign = Arc::new(Mutex::new(AssignBuf::default()));
            let alive = Arc::new(AtomicBool::new(true));
            let state = SubState {
                span: None,
                alive: alive.clone(),
                cohort: cohort.clone(),
                member: member.clone(),
                assign: assign.clone(),
                topic: topic.into(),
                group: o.group.clone(),
                partition,
                prefetch: o.prefetch,
                auto_ack: o.auto_ack,
                server_id: 0,
                recreating: false,
                held: HashMap::new(),
                tx: mtx,
            };
            let body = Body::Subscribe(wire::Subscribe {
                topic: topic.into(),
                group: o.group.clone(),
                partition,
                ack_mode: o.auto_ack as u8,
                prefetch: o.prefetch,
                cohort: cohort.clone(),
                member: member.clone(),
            });
            let rx = {
                let mut st = shared.lock();
                if conn.is_closed() || !st.conn.as_ref().map_or(false, |c| Arc::ptr_eq(c, &conn)) {
                    continue;
                }
                let local = st.next_local;
                st.next_local += 1;
                let (tx, rx) = oneshot::channel();
                let r = rid(&mut st);
                let mut frame = wire::encode_frame(&body, 0, 0);
                frame[8..16].copy_from_slice(&r.to_be_bytes());
                st.pending.insert(r, Pending::Subscribe { local, new: Some(Box::new(state)), tx });
                conn.send(frame);
                (rx, local)
            };
            match reply(rx.0).await {
                Ok(Body::SubscribeOk(ok)) => {
                    return Ok(Subscription {
                        shared: shared.clone(),
                        local: rx.1,
                        rx: mrx,
                        done: false,
                        topic: topic.into(),
                        partitions: ok.partitions,
                        prefetch: ok.prefetch,
                        cohort: cohort.clone(),
                        member: member.clone(),
                        assign,
                        alive,
                        span: Vec::new(),
                        span_clients: Vec::new(),
                        turn: 0,
                        span_failed: false,
                    })
                }
                Ok(_) => return Err(Error::Protocol("unexpected answer to SUBSCRIBE".into())),
                // The reply was lost with the socket; if the broker made the
                // subscription, reconciliation on resume drops it.
                Err(Error::ConnectionLost(_)) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// The connection events from now on: connected (resumed or not),
    /// disconnected, going away, closed. Bounded: at most 64 unread events
    /// are kept; later ones are dropped until the receiver catches up.
    pub fn status(&self) -> mpsc::Receiver<Status> {
        let (tx, rx) = mpsc::channel(64);
        let mut st = self.shared().lock();
        if st.closing || st.fatal.is_some() {
            let _ = tx.try_send(Status::Closed(st.fatal.as_ref().map(|e| e.to_string())));
        } else {
            st.status.push(tx);
        }
        rx
    }

    /// The reconnect grace the broker announced at the last handshake: how
    /// long it keeps a dropped session resumable.
    pub fn reconnect_grace(&self) -> Duration {
        Duration::from_millis(u64::from(self.shared().lock().hello.reconnect_grace_ms))
    }

    /// The broker's server generation at the last handshake (it changes on
    /// every broker process start).
    pub fn server_generation(&self) -> u64 {
        self.shared().lock().hello.server_generation
    }

    /// The partition the broker hinted for the next keyless publish to
    /// `topic`/`group`, if it did (docs/protocol.md 5.6, "Partition hints").
    pub fn partition_hint(&self, topic: &str, group: &str) -> Option<u32> {
        self.shared().lock().hints.get(&(topic.to_string(), group.to_string())).map(|p| *p as u32)
    }

    /// The member id of this client's cohort subscriptions that name none
    /// (the same across reconnects).
    pub fn member_id(&self) -> &str {
        &self.shared().member_id
    }

    /// The nodes this client knows: the addresses it was given, then (in a
    /// cluster) those it learned, at most 64 of them: the owners and
    /// replicas `METADATA` names, owners named by `not_owner`, `GOING_AWAY`
    /// redirects. A reconnect goes through them in turn.
    pub fn nodes(&self) -> Vec<String> {
        let shared = self.shared();
        let st = shared.lock();
        known_nodes(&shared.opts, &st)
    }

    /// The address of the node the client is connected to (the last one,
    /// while it reconnects).
    pub fn connected_node(&self) -> String {
        self.shared().lock().addr.clone()
    }

    /// Asks the connected node where the queue's partitions are served
    /// (`METADATA`, docs/protocol.md 5.13): on a single broker `cluster` is
    /// false and the owners are empty; a cluster's answer names each
    /// partition's owner and replicas, which the client learns. A queue that
    /// does not exist is `not_found`.
    pub async fn metadata(&self, topic: &str, group: &str) -> Result<wire::MetadataResult> {
        metadata(self.shared(), wire::QueueRef { topic: topic.to_string(), group: group.to_string() }).await
    }

    /// The producer id stamped on this client's publishes.
    pub fn producer_id(&self) -> &str {
        &self.shared().producer_id
    }

    /// Waits (up to the drain timeout) for pending confirms and settles,
    /// ends the session with `END_SESSION` so unsettled deliveries go back at
    /// once, and closes. Subscriptions end cleanly.
    pub async fn close(&self) -> Result<()> {
        let spans = std::mem::take(&mut *self.shared().spans.lock().unwrap_or_else(|e| e.into_inner()));
        for s in spans.iter().filter_map(|w| w.upgrade()) {
            close_one(&s).await;
        }
        close_one(self.shared()).await;
        Ok(())
    }
}

/// Closes one client: waits for its publishes and settles (up to the drain
/// timeout), ends the session, stops.
async fn close_one(shared: &Arc<Shared>) {
    let until = Instant::now() + shared.opts.drain_timeout;
    loop {
        let busy = {
            let st = shared.lock();
            if st.closing || st.fatal.is_some() {
                break;
            }
            shared.window.available_permits() < PUBLISH_WINDOW
                || !st.settle_q.is_empty()
                || !st.held.is_empty()
                || st.pending.values().any(|p| matches!(p, Pending::Settle(_)))
        };
        if !busy || Instant::now() >= until {
            break;
        }
        tokio::time::sleep(GOING_AWAY_POLL).await;
    }
    let live = {
        let st = shared.lock();
        if st.closing {
            None
        } else {
            st.live.clone()
        }
    };
    if let Some(c) = live {
        if let Ok(rx) = start(shared, &c, &Body::EndSession, Pending::Reply) {
            let _ = tokio::time::timeout(END_SESSION_TIMEOUT, rx).await;
        }
    }
    shutdown(shared, Error::ClientClosed);
}

// --- subscriptions and messages ----------------------------------------------------

/// Messages of one queue, in arrival order, as a [`futures_core::Stream`] of
/// `Result<Message>`.
///
/// The stream ends (`None`) after [`Subscription::unsubscribe`] or the
/// client's close. For any other end it yields the reason once, as an
/// error, and then ends: [`Error::ReconciledClosed`], [`Error::Recreated`], a
/// broker error (`not_found` when the queue was deleted),
/// [`Error::Disconnected`], or the client's fatal error.
///
/// Dropping a subscription ends it: the broker takes back its unsettled
/// deliveries at once, prefetched ones not yet handed out included, without
/// using a retry. Settles made before the drop reach the broker first.
pub struct Subscription {
    shared: Arc<Shared>,
    local: u64,
    rx: mpsc::Receiver<Message>,
    done: bool,
    topic: String,
    partitions: Vec<u32>,
    prefetch: u32,
    cohort: String,
    member: String,
    assign: Arc<Mutex<AssignBuf>>,
    alive: Arc<AtomicBool>,
    // In a cluster: the subscriptions on the queue's other nodes, merged
    // into this one, and the clients of all of them (this one's first).
    span: Vec<Subscription>,
    span_clients: Vec<Client>,
    turn: usize,       // the member polled first next time
    span_failed: bool, // a member's end was yielded as an error
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription").field("topic", &self.topic).field("prefetch", &self.prefetch).finish()
    }
}

impl Subscription {
    /// The subscribed topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The partitions the broker assigned when it accepted the subscription.
    pub fn partitions(&self) -> &[u32] {
        &self.partitions
    }

    /// The prefetch in force, after the broker's default and clamp.
    pub fn prefetch(&self) -> u32 {
        self.prefetch
    }

    /// The cohort this subscription is a member of; "" for a plain consumer.
    pub fn cohort(&self) -> &str {
        &self.cohort
    }

    /// The member id it joined its cohort with; "" for a plain consumer.
    pub fn member_id(&self) -> &str {
        &self.member
    }

    /// The partitions assigned to and revoked from this cohort
    /// subscription (see [`Assignments`]). A plain subscription gets none.
    pub fn assignments(&self) -> Assignments {
        Assignments { buf: self.assign.clone() }
    }

    /// Assignment events dropped because the buffer (256) was full, in all.
    pub fn assignments_dropped(&self) -> u64 {
        self.assign.lock().unwrap_or_else(|e| e.into_inner()).dropped
    }

    /// Why the subscription ended, or `None` while it runs.
    pub fn end_reason(&self) -> Option<Error> {
        let st = self.shared.lock();
        if st.subs.contains_key(&self.local) {
            return None;
        }
        Some(st.ended.get(&self.local).cloned().unwrap_or(Error::Unsubscribed))
    }

    /// Ends the subscription and waits for the broker's answer. The broker
    /// returns every delivery of the subscription that is still unsettled
    /// to the queue at once, without using a retry.
    pub async fn unsubscribe(mut self) -> Result<()> {
        let span = std::mem::take(&mut self.span);
        let clients = std::mem::take(&mut self.span_clients);
        let out = self.unsubscribe_here().await;
        for mut s in span {
            let _ = s.unsubscribe_here().await;
        }
        for c in clients {
            let _ = c.close().await;
        }
        out
    }

    async fn unsubscribe_here(&mut self) -> Result<()> {
        let rx = end_local(&self.shared, self.local, Error::Unsubscribed);
        self.done = true;
        if let Some(rx) = rx {
            match reply(rx).await {
                Ok(_) | Err(Error::ConnectionLost(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Ends a subscription on the client side and, when it is on the broker,
/// sends the settles queued so far and then `UNSUBSCRIBE`.
fn end_local(shared: &Arc<Shared>, local: u64, reason: Error) -> Option<oneshot::Receiver<Result<Body>>> {
    let mut st = shared.lock();
    let server_id = match st.subs.get(&local) {
        Some(s) => s.server_id,
        None => {
            st.ended.remove(&local);
            return None;
        }
    };
    end_sub(&mut st, local, reason);
    let conn = st.live.clone()?;
    if server_id == 0 || conn.is_closed() {
        return None; // a resumed session drops it in reconciliation
    }
    flush_settles(&mut st, &conn);
    let (tx, rx) = oneshot::channel();
    let r = rid(&mut st);
    conn.send(wire::encode_frame(&Body::Unsubscribe(server_id), r, 0));
    st.pending.insert(r, Pending::Reply(tx));
    Some(rx)
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if !self.done {
            let _ = end_local(&self.shared, self.local, Error::Unsubscribed);
        }
        self.shared.lock().ended.remove(&self.local);
        if self.span_clients.is_empty() {
            return;
        }
        // The other nodes' subscriptions end the same way; then the clients
        // of a spanning subscription close once their settles went out.
        let span = std::mem::take(&mut self.span);
        let clients = std::mem::take(&mut self.span_clients);
        drop(span);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                for c in clients {
                    let _ = c.close().await;
                }
            });
        }
    }
}

impl futures_core::Stream for Subscription {
    type Item = Result<Message>;

    /// In a cluster the members (one subscription per node) are polled in
    /// turn; the first member's end that is an error is yielded, and the
    /// stream ends once every member ended.
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.span.is_empty() {
            return this.poll_here(cx);
        }
        let n = 1 + this.span.len();
        'again: loop {
            let mut ended = true;
            for k in 0..n {
                let i = (this.turn + k) % n;
                let r = if i == 0 { this.poll_here(cx) } else { Pin::new(&mut this.span[i - 1]).poll_next(cx) };
                match r {
                    Poll::Ready(Some(Ok(m))) => {
                        this.turn = (i + 1) % n;
                        return Poll::Ready(Some(Ok(m)));
                    }
                    Poll::Ready(Some(Err(e))) => {
                        if !this.span_failed {
                            this.span_failed = true;
                            this.turn = (i + 1) % n;
                            return Poll::Ready(Some(Err(e)));
                        }
                        continue 'again; // the member ends on its next poll
                    }
                    Poll::Ready(None) => {}
                    Poll::Pending => ended = false,
                }
            }
            return if ended { Poll::Ready(None) } else { Poll::Pending };
        }
    }
}

impl Subscription {
    fn poll_here(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Message>>> {
        loop {
            if self.done {
                return Poll::Ready(None);
            }
            match self.rx.poll_recv(cx) {
                Poll::Pending => {
                    // An ended subscription whose sender a reader still holds.
                    if self.alive.load(Ordering::SeqCst) {
                        return Poll::Pending;
                    }
                    self.rx.close();
                    continue;
                }
                Poll::Ready(Some(m)) => {
                    if !self.alive.load(Ordering::SeqCst) {
                        self.rx.close();
                        continue; // ended: buffered deliveries are dropped
                    }
                    if let Some(t) = m.lease_ends {
                        if Instant::now() >= t {
                            // Its lease ran out before the application took it:
                            // the message is back in the queue (perhaps leased
                            // to another consumer already), so handing it over
                            // now would only have it processed twice.
                            if let Some(s) = self.shared.lock().subs.get_mut(&self.local) {
                                s.held.remove(&m.tag);
                            }
                            continue;
                        }
                    }
                    // The state is looked at only when leases may have gone
                    // since the delivery (a fresh session, INFLIGHT's stale).
                    if m.auto_ack || m.gen == self.shared.stale_gen.load(Ordering::SeqCst) {
                        return Poll::Ready(Some(Ok(m)));
                    }
                    let st = self.shared.lock();
                    match st.subs.get(&self.local) {
                        None => {
                            drop(st);
                            self.rx.close();
                            continue; // ended: buffered deliveries are dropped
                        }
                        Some(s) => {
                            // A delivery of a session that is gone, or that the
                            // broker reported stale after a resume, comes again.
                            if !m.auto_ack && (m.epoch != st.epoch || !s.held.contains_key(&m.tag)) {
                                continue;
                            }
                        }
                    }
                    return Poll::Ready(Some(Ok(m)));
                }
                Poll::Ready(None) => {
                    self.done = true;
                    let reason = self.shared.lock().ended.get(&self.local).cloned();
                    return match reason {
                        None | Some(Error::Unsubscribed) | Some(Error::ClientClosed) => Poll::Ready(None),
                        Some(e) => Poll::Ready(Some(Err(e))),
                    };
                }
            }
        }
    }
}

/// A delivery. A manual-ack message is settled once, by
/// [`complete`](Message::complete), [`retry`](Message::retry),
/// [`retry_after`](Message::retry_after) or [`fail`](Message::fail); a
/// second settle gets [`Error::AlreadySettled`], unless the first was
/// refused with the lease still held (a `retry_after` delay above the
/// broker's cap, say), which lets it be settled again.
///
/// A settle is queued when the method is called and sent in a batch with
/// others of the same moment; the returned [`SettleFuture`] resolves with
/// the broker's answer once the settle is durable. Dropping the future does
/// not cancel the settle. A settle cut off by a broken connection is held and
/// sent again on the resumed session.
pub struct Message {
    shared: Arc<Shared>,
    span: Option<Arc<SpanGroup>>,
    local: u64,
    epoch: u64,
    auto_ack: bool,
    settled: Arc<AtomicBool>,
    gen: u64,                    // Shared::stale_gen when it was delivered
    lease_ends: Option<Instant>, // from the DELIVER's lease_ms, when given
    tag: u64,
    lease: LeaseRef,
    /// The message's topic.
    pub topic: String,
    /// Its group.
    pub group: String,
    /// The partition it was stored in.
    pub partition: u32,
    /// Its offset in that partition.
    pub offset: u64,
    /// 1 on first delivery, +1 on each redelivery.
    pub attempt: u32,
    /// When the broker stored it (Unix milliseconds).
    pub published_at_ms: i64,
    /// The partition key.
    pub key: Vec<u8>,
    /// Headers, in order; the broker's dead-letter headers start with `sinew.`.
    pub headers: Vec<(String, String)>,
    /// The content type.
    pub content_type: String,
    /// The payload.
    pub body: Vec<u8>,
    /// The partition's assignment epoch when the lease was granted (a
    /// cohort's; 0 while no cohort ever held the partition).
    pub assignment: u64,
}

impl fmt::Debug for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Message")
            .field("topic", &self.topic)
            .field("partition", &self.partition)
            .field("offset", &self.offset)
            .field("attempt", &self.attempt)
            .field("body_len", &self.body.len())
            .finish()
    }
}

/// The pending outcome of a settle; see [`Message`].
#[derive(Debug)]
pub struct SettleFuture {
    inner: SettleInner,
}

#[derive(Debug)]
enum SettleInner {
    Ready(Option<Result<()>>),
    Wait(oneshot::Receiver<Result<()>>),
}

impl Future for SettleFuture {
    type Output = Result<()>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        match &mut self.inner {
            SettleInner::Ready(r) => Poll::Ready(r.take().unwrap_or(Err(Error::AlreadySettled))),
            SettleInner::Wait(rx) => match Pin::new(rx).poll(cx) {
                Poll::Ready(Ok(r)) => Poll::Ready(r),
                Poll::Ready(Err(_)) => Poll::Ready(Err(Error::ClientClosed)),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl Message {
    /// The body as UTF-8 text, if it is.
    pub fn text(&self) -> Option<&str> {
        std::str::from_utf8(&self.body).ok()
    }

    /// The value of the first header named `key`.
    pub fn header(&self, key: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Settles the message as done (`ACK`).
    pub fn complete(&self) -> SettleFuture {
        self.settle(op::ACK, 0)
    }

    /// Returns the message to the queue for another attempt (`NACK`); once
    /// the queue's retries are used up, it is dead-lettered.
    pub fn retry(&self) -> SettleFuture {
        self.settle(op::NACK, 0)
    }

    /// [`retry`](Message::retry) with a delay before the message is delivered
    /// again. The broker caps the delay (30 days by default); one above the
    /// cap is refused with `bad_request`.
    pub fn retry_after(&self, delay: Duration) -> SettleFuture {
        self.settle(op::NACK, ms(delay))
    }

    /// Settles the message as failed for good: it is dead-lettered (`FAIL`).
    pub fn fail(&self) -> SettleFuture {
        self.settle(op::FAIL, 0)
    }

    /// Renews the message's lease to `d` from now (`EXTEND`), without
    /// settling it.
    pub async fn extend(&self, d: Duration) -> Result<()> {
        if self.auto_ack || self.settled.load(Ordering::SeqCst) {
            return Err(Error::AlreadySettled);
        }
        let delay = ms(d).max(1);
        let first = self.queue(op::EXTEND, delay, None);
        self.follow_owner(op::EXTEND, delay, first, None).await
    }

    fn settle(&self, kind: u8, delay: i64) -> SettleFuture {
        if self.auto_ack || self.settled.swap(true, Ordering::SeqCst) {
            return SettleFuture { inner: SettleInner::Ready(Some(Err(Error::AlreadySettled))) };
        }
        let first = self.queue(kind, delay, Some(self.settled.clone()));
        self.follow_owner(kind, delay, first, Some(self.settled.clone()))
    }

    /// A spanning subscription's message: when its node cannot settle or
    /// extend it (or, for an ACK or an EXTEND, does not answer at once) the
    /// request goes to the partition's owner by lease reference. The first
    /// answer that is an outcome counts; an ACK or an EXTEND applied twice
    /// is answered ok twice. `settled`, for a settle, is set once one
    /// applied it.
    fn follow_owner(&self, kind: u8, delay: i64, first: SettleFuture, settled: Option<Arc<AtomicBool>>) -> SettleFuture {
        let (group, rt) = match (&self.span, tokio::runtime::Handle::try_current()) {
            (Some(g), Ok(rt)) => (g.clone(), rt),
            _ => return first,
        };
        let (tx, rx) = oneshot::channel();
        let lease = self.lease;
        let member = self.shared.clone();
        rt.spawn(async move {
            let mut first = first;
            // After the owner's verdict, an error of the first node that
            // another node might change is what the application gets.
            let follow = |e: Error| {
                let g = group.clone();
                async move {
                    match g.settle_at_owner(kind, delay, lease).await {
                        Ok(()) => Ok(()),
                        Err(Error::StaleDelivery) => Err(Error::StaleDelivery),
                        Err(_) => Err(e),
                    }
                }
            };
            let out = match tokio::time::timeout(SETTLE_RACE, &mut first).await {
                Ok(Err(e)) if reroutable(&e) => follow(e).await,
                Ok(r) => r,
                // No answer yet: an ACK or an EXTEND (applying either twice
                // is answered ok twice), or anything whose node is not
                // connected, goes to the owner as well; the first outcome
                // counts.
                Err(_) if kind == op::ACK || kind == op::EXTEND || member.lock().live.is_none() => {
                    let other = group.settle_at_owner(kind, delay, lease);
                    tokio::pin!(other);
                    tokio::select! {
                        r = &mut first => match r {
                            Err(e) if reroutable(&e) => match other.await {
                                Err(oe) if !matches!(oe, Error::StaleDelivery) => Err(e),
                                r => r,
                            },
                            r => r,
                        },
                        r = &mut other => r,
                    }
                }
                Err(_) => match first.await {
                    Err(e) if reroutable(&e) => follow(e).await,
                    r => r,
                },
            };
            if let (true, Some(s)) = (out.is_ok(), &settled) {
                s.store(true, Ordering::SeqCst);
            }
            let _ = tx.send(out);
        });
        SettleFuture { inner: SettleInner::Wait(rx) }
    }

    fn queue(&self, kind: u8, delay: i64, settled: Option<Arc<AtomicBool>>) -> SettleFuture {
        let shared = &self.shared;
        let mut st = shared.lock();
        let err = if st.closing {
            Some(Error::ClientClosed)
        } else if let Some(e) = &st.fatal {
            Some(e.clone())
        } else if self.epoch != st.epoch {
            Some(Error::StaleDelivery)
        } else {
            match st.subs.get(&self.local) {
                Some(s) if s.held.contains_key(&self.tag) => None,
                Some(_) => Some(Error::StaleDelivery),
                // The subscription ended: settle by the lease reference all the same.
                None => None,
            }
        };
        if let Some(e) = err {
            if let Some(f) = &settled {
                f.store(false, Ordering::SeqCst); // nothing was queued
            }
            return SettleFuture { inner: SettleInner::Ready(Some(Err(e))) };
        }
        let (tx, rx) = oneshot::channel();
        let item = SettleItem {
            local: self.local,
            tag: self.tag,
            lease: self.lease,
            epoch: self.epoch,
            tx: Some(tx),
            settled,
        };
        st.settle_q.push((kind, delay, item));
        if !st.settle_kicked {
            st.settle_kicked = true;
            shared.settle_kick.notify_one();
        }
        SettleFuture { inner: SettleInner::Wait(rx) }
    }
}
