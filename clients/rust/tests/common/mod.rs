//! Test harness: a real `sinew serve` child process built from this tree, a
//! loopback fault proxy that can cut, refuse and hold connections, and a
//! clock that records the client's backoff waits instead of sleeping them.
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub const START_TIMEOUT: Duration = Duration::from_secs(60);
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);

static BIN: Mutex<Option<PathBuf>> = Mutex::new(None);

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// Builds the broker once per test binary (or takes $SINEW_BIN).
pub fn broker_binary() -> PathBuf {
    let mut b = BIN.lock().unwrap();
    if let Some(p) = &*b {
        return p.clone();
    }
    if let Ok(p) = std::env::var("SINEW_BIN") {
        *b = Some(PathBuf::from(p));
        return b.clone().unwrap();
    }
    // In cargo's scratch directory for integration tests (target/tmp), so
    // runs reuse it instead of leaving a binary behind each time; go build
    // rebuilds it when the tree changed.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("sinew");
    let tmp = dir.join(format!("sinew.{}.tmp", std::process::id()));
    let go =
        if Path::new("/usr/local/go/bin/go").exists() { "/usr/local/go/bin/go".to_string() } else { "go".to_string() };
    let st = std::process::Command::new(go)
        .args(["build", "-o"])
        .arg(&tmp)
        .arg("./cmd/sinew")
        .current_dir(repo())
        .status()
        .expect("go build");
    assert!(st.success(), "go build failed");
    // Renamed into place: a broker another test process runs keeps its file.
    std::fs::rename(&tmp, &out).unwrap();
    *b = Some(out.clone());
    out
}

pub fn temp_dir(prefix: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("{}-{}-{:016x}", prefix, std::process::id(), rand::random::<u64>()));
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// A `sinew serve` child process on a loopback port the kernel chose (kept
/// across restarts).
pub struct Broker {
    pub addr: String,
    pub data: PathBuf,
    extra: Vec<String>,
    pub grace_ms: u64,
    child: Option<Child>,
    pub log: Arc<Mutex<Vec<String>>>,
    pump: Option<JoinHandle<()>>,
}

impl Broker {
    pub fn new(extra: &[&str]) -> Broker {
        Broker {
            addr: "127.0.0.1:0".into(),
            data: temp_dir("sinew-rs-data"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            grace_ms: 30_000,
            child: None,
            log: Arc::new(Mutex::new(Vec::new())),
            pump: None,
        }
    }

    /// Starts (or restarts, on the same port and data) the broker.
    pub async fn start(&mut self) -> String {
        let bin = tokio::task::spawn_blocking(broker_binary).await.unwrap();
        let mut cmd = Command::new(bin);
        cmd.args(["serve", "--listen", &self.addr, "--admin-listen", ""])
            .arg("--data-dir")
            .arg(&self.data)
            .args(["--runtime-seed-connection-reconnect-grace-ms", &self.grace_ms.to_string()])
            .args(["--runtime-seed-connection-drain-timeout-ms", "5000"])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("start sinew serve");
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        let log = self.log.clone();
        let addr = tokio::time::timeout(START_TIMEOUT, async {
            while let Ok(Some(line)) = lines.next_line().await {
                log.lock().unwrap().push(line.clone());
                if let Some(i) = line.find("msg=serving listen=") {
                    let rest = &line[i + "msg=serving listen=".len()..];
                    return rest.split_whitespace().next().unwrap().to_string();
                }
            }
            panic!("broker exited:\n{}", log.lock().unwrap().join("\n"));
        })
        .await
        .expect("broker did not start in time");
        let log = self.log.clone();
        self.pump = Some(tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let mut l = log.lock().unwrap();
                if l.len() < 10_000 {
                    l.push(line);
                }
            }
        }));
        self.child = Some(child);
        self.addr = addr.clone();
        addr
    }

    /// SIGTERM: the broker drains (GOING_AWAY) and exits.
    pub async fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = c.id().expect("pid");
            std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap();
            tokio::time::timeout(STOP_TIMEOUT, c.wait()).await.expect("broker did not stop").unwrap();
        }
    }

    /// SIGKILL: no drain, no GOING_AWAY.
    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.start_kill();
        }
        if let Some(p) = self.pump.take() {
            p.abort();
        }
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

/// A TCP proxy on loopback between the client and the broker. `cut_all`
/// resets every proxied connection; `refuse(true)` closes the listener so
/// connects are refused, `refuse(false)` listens again on the same port;
/// `hold(true)` stops passing what the broker sends until `hold(false)`.
pub struct FaultProxy {
    pub addr: String,
    target: String,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    listener: Option<JoinHandle<()>>,
    flowing: watch::Sender<bool>,
    pub accepted: Arc<Mutex<u64>>,
}

impl FaultProxy {
    pub async fn start(target: &str) -> FaultProxy {
        let mut p = FaultProxy {
            addr: "127.0.0.1:0".into(),
            target: target.into(),
            conns: Arc::new(Mutex::new(Vec::new())),
            listener: None,
            flowing: watch::channel(true).0,
            accepted: Arc::new(Mutex::new(0)),
        };
        p.listen().await;
        p
    }

    async fn listen(&mut self) {
        let l = TcpListener::bind(&self.addr).await.expect("proxy bind");
        self.addr = l.local_addr().unwrap().to_string();
        let target = self.target.clone();
        let conns = self.conns.clone();
        let accepted = self.accepted.clone();
        let flow_rx = self.flowing.subscribe();
        self.listener = Some(tokio::spawn(async move {
            loop {
                let (c, _) = match l.accept().await {
                    Ok(x) => x,
                    Err(_) => continue,
                };
                *accepted.lock().unwrap() += 1;
                let target = target.clone();
                let flow = flow_rx.clone();
                let h = tokio::spawn(async move {
                    let b = match TcpStream::connect(&target).await {
                        Ok(b) => b,
                        Err(_) => {
                            let _ = c.set_linger(Some(Duration::ZERO));
                            return;
                        }
                    };
                    let _ = c.set_linger(Some(Duration::ZERO));
                    let _ = b.set_linger(Some(Duration::ZERO));
                    let _ = c.set_nodelay(true);
                    let _ = b.set_nodelay(true);
                    let (mut cr, mut cw) = c.into_split();
                    let (mut br, mut bw) = b.into_split();
                    let up = async move {
                        let mut buf = vec![0u8; 65536];
                        loop {
                            let n = match cr.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            if bw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    let down = async move {
                        let mut flow = flow;
                        let mut buf = vec![0u8; 65536];
                        loop {
                            let n = match br.read(&mut buf).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            while !*flow.borrow() {
                                if flow.changed().await.is_err() {
                                    return;
                                }
                            }
                            if cw.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    // Either direction ending ends both: the pair is dropped
                    // with a reset.
                    tokio::select! {
                        _ = up => {},
                        _ = down => {},
                    }
                });
                let mut cs = conns.lock().unwrap();
                cs.retain(|h| !h.is_finished());
                cs.push(h);
            }
        }));
    }

    pub fn cut_all(&self) {
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }

    pub async fn refuse(&mut self, on: bool) {
        if on {
            if let Some(l) = self.listener.take() {
                l.abort();
                let _ = l.await;
            }
        } else if self.listener.is_none() {
            self.listen().await;
        }
    }

    pub fn hold(&self, on: bool) {
        self.flowing.send_replace(!on);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(l) = self.listener.take() {
            l.abort();
        }
        self.cut_all();
    }
}

/// A clock whose sleeps are reported to the test and wait for its go: the
/// test sees each backoff wait and decides when it ends. `now` advances by
/// each wait, and by `advance`.
pub struct StepClock {
    base: Instant,
    offset: Mutex<Duration>,
    waits: mpsc::UnboundedSender<(Duration, tokio::sync::oneshot::Sender<()>)>,
}

impl StepClock {
    pub fn new() -> (Arc<StepClock>, mpsc::UnboundedReceiver<(Duration, tokio::sync::oneshot::Sender<()>)>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Arc::new(StepClock { base: Instant::now(), offset: Mutex::new(Duration::ZERO), waits: tx }), rx)
    }

    pub fn advance(&self, d: Duration) {
        *self.offset.lock().unwrap() += d;
    }
}

impl sinew::Clock for StepClock {
    fn now(&self) -> Instant {
        self.base + *self.offset.lock().unwrap()
    }
    fn sleep(&self, d: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        *self.offset.lock().unwrap() += d;
        let _ = self.waits.send((d, tx));
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

/// A clock that records every wait and returns at once.
#[derive(Default)]
pub struct RecordClock {
    pub waits: Mutex<Vec<Duration>>,
}

impl sinew::Clock for RecordClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn sleep(&self, d: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        self.waits.lock().unwrap().push(d);
        Box::pin(tokio::task::yield_now())
    }
}

/// Bounds a test step.
pub async fn within<T>(secs: u64, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(secs), f).await.expect("step timed out")
}
