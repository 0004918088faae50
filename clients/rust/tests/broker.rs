//! The client against a real `sinew serve` built from this tree, through a
//! loopback fault proxy.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use sinew::{Code, ConnectOptions, DeadLetter, Error, PublishOptions, QueueOptions, Status, SubscribeOptions};

async fn setup() -> (Broker, FaultProxy) {
    let mut b = Broker::new(&[]);
    let addr = b.start().await;
    let p = FaultProxy::start(&addr).await;
    (b, p)
}

async fn next(sub: &mut sinew::Subscription) -> sinew::Message {
    within(10, sub.next()).await.expect("stream ended").expect("stream error")
}

#[tokio::test]
async fn publish_worker_retry_and_dead_letter() {
    let (_b, p) = setup().await;
    let c = sinew::connect(p.addr.clone()).await.unwrap();
    let d = c
        .declare_queue(
            "jobs",
            QueueOptions { dead_letter: DeadLetter::Queue("jobs-dead".into()), ..Default::default() },
        )
        .await
        .unwrap();
    assert!(d.created);
    let conf = c.publish_with("jobs", "job-1", PublishOptions::new().header("kind", "demo")).await.unwrap();
    assert!(!conf.duplicate);
    let mut sub = c.subscribe_with("jobs", SubscribeOptions::new().prefetch(8)).await.unwrap();
    let m = next(&mut sub).await;
    assert_eq!((m.body.as_slice(), m.attempt, m.header("kind")), (&b"job-1"[..], 1, Some("demo")));
    assert_eq!((m.partition, m.offset), (conf.partition, conf.offset));
    within(10, m.retry()).await.unwrap();
    let m = next(&mut sub).await;
    assert_eq!(m.attempt, 2);
    within(10, m.fail()).await.unwrap();
    let mut dead = c.subscribe("jobs-dead").await.unwrap();
    let m = next(&mut dead).await;
    assert_eq!(m.body, b"job-1");
    assert_eq!(m.header("sinew.reason"), Some("failed"));
    assert_eq!(m.header("sinew.source.topic"), Some("jobs"));
    within(10, m.complete()).await.unwrap();
    // A settled message cannot be settled again: settling consumes it, and an
    // auto-ack delivery refuses it.
    c.publish("auto", "a").await.unwrap();
    let mut auto = c.subscribe_with("auto", SubscribeOptions::new().auto_ack(true)).await.unwrap();
    let m = next(&mut auto).await;
    assert!(matches!(m.complete().await, Err(Error::AlreadySettled)));
    // Reserved headers are refused before anything is sent.
    let e = c.publish_with("jobs", "x", PublishOptions::new().header("sinew.reason", "x")).await.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { argument: "headers", .. }), "{:?}", e);
    c.close().await.unwrap();
}

#[tokio::test]
async fn publish_resend_after_cut_is_stored_once() {
    let (b, p) = setup().await;
    let c = sinew::connect(p.addr.clone()).await.unwrap();
    // An observer straight on the broker sees each message once it is stored.
    let observer = sinew::connect(b.addr.clone()).await.unwrap();
    let mut seen = observer.subscribe("idem").await.unwrap();
    let first = c.publish("idem", "warm").await.unwrap();
    assert_eq!(next(&mut seen).await.body, b"warm");
    // The broker stores the publish, but its confirm is held in the proxy and
    // lost with the cut: the client sends it again under the same producer
    // id and sequence, and the broker answers with the original.
    p.hold(true);
    let c2 = c.clone();
    let pubf = tokio::spawn(async move { c2.publish("idem", "once").await });
    let stored = next(&mut seen).await;
    assert_eq!(stored.body, b"once");
    p.cut_all();
    p.hold(false);
    let conf = within(20, pubf).await.unwrap().unwrap();
    assert!(conf.duplicate, "the resend was stored again: {:?}", conf);
    assert_eq!((conf.partition, conf.offset), (stored.partition, stored.offset));
    assert!(conf.offset > first.offset);
    // The observer's session ends: its two leases go back to the queue.
    observer.close().await.unwrap();
    let mut sub = c.subscribe("idem").await.unwrap();
    let mut bodies = vec![next(&mut sub).await.body, next(&mut sub).await.body];
    bodies.sort();
    assert_eq!(bodies, vec![b"once".to_vec(), b"warm".to_vec()]);
    assert!(tokio::time::timeout(Duration::from_millis(500), sub.next()).await.is_err(), "a third message");
    c.close().await.unwrap();
}

#[tokio::test]
async fn cut_inside_grace_is_invisible_and_acked_messages_never_return() {
    let (_b, p) = setup().await;
    let c = sinew::connect(p.addr.clone()).await.unwrap();
    let mut status = c.status();
    for i in 0..40 {
        c.publish("grace", format!("{}", i)).await.unwrap();
    }
    let mut sub = c.subscribe_with("grace", SubscribeOptions::new().prefetch(8)).await.unwrap();
    let mut seen: HashMap<String, u32> = HashMap::new();
    for i in 0..40 {
        let m = next(&mut sub).await;
        *seen.entry(m.text().unwrap().to_string()).or_default() += 1;
        // Cut while deliveries and settles are in flight.
        if i % 10 == 5 {
            p.cut_all();
        }
        within(20, m.complete()).await.expect("settle across a cut");
    }
    assert_eq!(seen.len(), 40);
    assert!(seen.values().all(|n| *n == 1), "{:?}", seen);
    assert!(tokio::time::timeout(Duration::from_millis(700), sub.next()).await.is_err(), "an acked message came back");
    let mut resumed = 0;
    while let Ok(s) = status.try_recv() {
        if let Status::Connected { resumed: r } = s {
            assert!(r, "a cut inside the grace must resume the session");
            resumed += 1;
        }
    }
    assert!(resumed >= 3, "{} resumes", resumed);
    c.close().await.unwrap();
}

#[tokio::test]
async fn restart_with_drain_pauses_and_resumes() {
    let mut b = Broker::new(&[]);
    b.start().await;
    let c = sinew::connect(b.addr.clone()).await.unwrap();
    let mut status = c.status();
    let mut sub = c.subscribe_with("drain", SubscribeOptions::new().prefetch(4)).await.unwrap();
    c.publish("drain", "before").await.unwrap();
    let m = next(&mut sub).await;
    within(10, m.complete()).await.unwrap();
    within(40, b.stop()).await; // SIGTERM: GOING_AWAY, drain, exit
                                // A publish now waits for the broker to come back.
    let c2 = c.clone();
    let pubf = tokio::spawn(async move { c2.publish("drain", "during").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.start().await;
    within(30, pubf).await.unwrap().unwrap();
    let m = next(&mut sub).await;
    assert_eq!(m.body, b"during");
    within(10, m.complete()).await.unwrap();
    let mut away = false;
    let mut resumed = false;
    while let Ok(s) = status.try_recv() {
        match s {
            Status::GoingAway => away = true,
            Status::Connected { resumed: r } => resumed |= r,
            _ => {}
        }
    }
    assert!(away && resumed, "going away {} resumed {}", away, resumed);
    assert!(tokio::time::timeout(Duration::from_millis(500), sub.next()).await.is_err());
    c.close().await.unwrap();
}

#[tokio::test]
async fn kill_9_restart_resumes_and_acked_stays_acked() {
    let mut b = Broker::new(&[]);
    b.start().await;
    let c = sinew::connect(b.addr.clone()).await.unwrap();
    let mut sub = c.subscribe_with("crash", SubscribeOptions::new().prefetch(4)).await.unwrap();
    for i in 0..6 {
        c.publish("crash", format!("{}", i)).await.unwrap();
    }
    let mut got = Vec::new();
    for _ in 0..3 {
        let m = next(&mut sub).await;
        got.push(m.text().unwrap().to_string());
        within(10, m.complete()).await.unwrap();
    }
    b.kill().await;
    b.start().await;
    for _ in 0..3 {
        let m = next(&mut sub).await;
        got.push(m.text().unwrap().to_string());
        within(20, m.complete()).await.unwrap();
    }
    got.sort();
    assert_eq!(got, vec!["0", "1", "2", "3", "4", "5"]);
    assert!(tokio::time::timeout(Duration::from_millis(700), sub.next()).await.is_err(), "an acked message came back");
    c.close().await.unwrap();
}

#[tokio::test]
async fn refused_connection_backs_off_on_the_injected_clock() {
    let (_b, mut p) = setup().await;
    p.refuse(true).await;
    let (clock, mut waits) = StepClock::new();
    let opts = ConnectOptions::new(p.addr.clone()).clock(clock.clone()).rand(|| 0.5);
    let connecting = tokio::spawn(sinew::connect_with(opts));
    let mut seen = Vec::new();
    for _ in 0..4 {
        let (d, go) = within(10, waits.recv()).await.unwrap();
        seen.push(d);
        if seen.len() == 4 {
            p.refuse(false).await;
        }
        let _ = go.send(());
    }
    let c = within(10, connecting).await.unwrap().unwrap();
    // rand 0.5 puts the jitter at zero: 100 ms, then x2 each failure.
    let ms: Vec<u128> = seen.iter().map(|d| d.as_millis()).collect();
    assert_eq!(ms, vec![100, 200, 400, 800]);

    // Failures in a row keep growing the wait while the connection has not
    // stayed up for 10 s...
    p.refuse(true).await;
    p.cut_all();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (d, go) = within(10, waits.recv()).await.unwrap();
        seen.push(d.as_millis());
        if seen.len() == 3 {
            p.refuse(false).await;
        }
        let _ = go.send(());
    }
    // The first wait follows the cut; each refusal doubles the next.
    assert_eq!(seen, vec![100, 200, 400]);
    c.publish("bo", "x").await.unwrap();
    p.refuse(true).await;
    p.cut_all();
    let (d, go) = within(10, waits.recv()).await.unwrap();
    // Two failures in a row before the last connection, which did not stay
    // up for 10 s: the count goes on.
    assert_eq!(d.as_millis(), 400, "no reset before 10 s connected");
    p.refuse(false).await;
    let _ = go.send(());
    c.publish("bo", "y").await.unwrap();
    // ...and start over once it has.
    clock.advance(Duration::from_secs(11));
    p.cut_all();
    let (d, go) = within(10, waits.recv()).await.unwrap();
    assert_eq!(d.as_millis(), 100, "reset after 10 s connected");
    let _ = go.send(());
    c.publish("bo", "z").await.unwrap();
    c.close().await.unwrap();

    // Jitter stays within +/-10 %.
    let pol = sinew::ReconnectPolicy::default();
    assert_eq!(pol.delay(0, 0.0).as_millis(), 90);
    assert_eq!(pol.delay(0, 0.999_999).as_millis(), 109);
    assert_eq!(pol.delay(20, 0.5), Duration::from_secs(30));
}

#[tokio::test]
async fn auth_failed_is_fatal_and_typed() {
    let mut b = Broker::new(&[]);
    let bin = tokio::task::spawn_blocking(broker_binary).await.unwrap();
    let mut child = tokio::process::Command::new(bin)
        .args(["admin", "user", "add", "alice", "--data-dir"])
        .arg(&b.data)
        .args(["--publish", "*", "--consume", "*", "--manage", "*", "--password-stdin"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"correct horse\n").await.unwrap();
    }
    assert!(child.wait().await.unwrap().success());
    b.start().await;
    for (user, pass) in [("alice", "wrong horse"), ("mallory", "correct horse"), ("", "")] {
        let clock = Arc::new(RecordClock::default());
        let opts = ConnectOptions::new(b.addr.clone()).user(user, pass).clock(clock.clone());
        let e = within(20, sinew::connect_with(opts)).await.unwrap_err();
        assert_eq!(e.code(), Some(Code::AUTH_FAILED), "{:?}", e);
        assert_eq!(e.code().unwrap().name(), "auth_failed");
        assert!(!e.is_retryable());
        assert!(clock.waits.lock().unwrap().is_empty(), "auth_failed was retried");
    }
    let c = within(20, sinew::connect_with(ConnectOptions::new(b.addr.clone()).user("alice", "correct horse")))
        .await
        .unwrap();
    c.publish("auth", "as alice").await.unwrap();
    c.close().await.unwrap();
}

#[tokio::test]
async fn typed_subscription_ends() {
    let (_b, p) = setup().await;
    let c = sinew::connect(p.addr.clone()).await.unwrap();
    let mut a = c.subscribe("ends-a").await.unwrap();
    assert!(a.end_reason().is_none());
    let a2 = c.subscribe("ends-a2").await.unwrap();
    a2.unsubscribe().await.unwrap();
    // Ended by the broker's queue deletion: the stream yields not_found once.
    c.declare_queue("ends-b", QueueOptions::default()).await.unwrap();
    let mut b = c.subscribe("ends-b").await.unwrap();
    c.delete_queue("ends-b", "").await.unwrap();
    let e = within(10, b.next()).await.unwrap().unwrap_err();
    assert_eq!(e.code(), Some(Code::NOT_FOUND), "{:?}", e);
    assert!(within(10, b.next()).await.is_none());
    // Closing the client ends the others cleanly.
    c.close().await.unwrap();
    assert!(within(10, a.next()).await.is_none());
    assert!(matches!(a.end_reason(), Some(Error::ClientClosed)), "{:?}", a.end_reason());
    assert!(matches!(c.publish("ends-a", "x").await, Err(Error::ClientClosed)));
}

#[tokio::test]
async fn dropping_a_subscription_hands_its_prefetched_messages_back() {
    let (_b, p) = setup().await;
    let c = sinew::connect(p.addr.clone()).await.unwrap();
    for i in 0..5 {
        c.publish("handback", format!("{}", i)).await.unwrap();
    }
    let mut sub = c.subscribe_with("handback", SubscribeOptions::new().prefetch(10)).await.unwrap();
    let first = next(&mut sub).await;
    // Prefetched: the rest are leased to this subscription too.
    tokio::time::sleep(Duration::from_millis(200)).await;
    within(10, first.complete()).await.unwrap();
    drop(sub);
    // The queue's lease is 30 s: getting them at once shows they were released.
    let mut other = c.subscribe("handback").await.unwrap();
    let mut got = Vec::new();
    for _ in 0..4 {
        let m = next(&mut other).await;
        got.push(m.text().unwrap().to_string());
        within(10, m.complete()).await.unwrap();
    }
    got.sort();
    assert_eq!(got, vec!["1", "2", "3", "4"]);
    c.close().await.unwrap();
}

#[tokio::test]
async fn tls_with_a_ca_file_and_typed_tls_failures() {
    let dir = temp_dir("sinew-rs-tls");
    let bin = tokio::task::spawn_blocking(broker_binary).await.unwrap();
    let st = std::process::Command::new(&bin).args(["cert", "generate", "--dir"]).arg(&dir).output().unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let cert = dir.join("server.pem");
    let key = dir.join("server-key.pem");
    let ca = dir.join("ca.pem");
    let mut b = Broker::new(&["--tls-cert-file", cert.to_str().unwrap(), "--tls-key-file", key.to_str().unwrap()]);
    b.start().await;
    let opts = ConnectOptions::new(b.addr.clone()).tls_ca_file(&ca).tls_server_name("localhost");
    let c = within(20, sinew::connect_with(opts)).await.unwrap();
    c.publish("tls", "sealed").await.unwrap();
    let mut sub = c.subscribe("tls").await.unwrap();
    let m = next(&mut sub).await;
    assert_eq!(m.body, b"sealed");
    within(10, m.complete()).await.unwrap();
    c.close().await.unwrap();
    // A certificate from another CA: fatal, typed, not retried.
    let clock = Arc::new(RecordClock::default());
    let opts = ConnectOptions::new(b.addr.clone()).tls_system_roots().tls_server_name("localhost").clock(clock.clone());
    let e = within(20, sinew::connect_with(opts)).await.unwrap_err();
    assert!(matches!(e, Error::Tls(_)), "{:?}", e);
    assert!(!e.is_retryable());
    assert!(clock.waits.lock().unwrap().is_empty());
    // TLS to a plaintext port.
    let mut plain = Broker::new(&[]);
    plain.start().await;
    let opts = ConnectOptions::new(plain.addr.clone()).tls_ca_file(&ca).tls_server_name("localhost");
    let e = within(20, sinew::connect_with(opts)).await.unwrap_err();
    assert!(matches!(e, Error::ServerNotTls | Error::Tls(_)), "{:?}", e);
    assert!(!e.is_retryable());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stand-in broker that greets one client and at once announces a planned
/// stop naming `redirect`: the client must move there.
async fn going_away_server(redirect: String) -> (String, Arc<std::sync::Mutex<u32>>) {
    use sinew::wire::{self, Body};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let accepted = Arc::new(std::sync::Mutex::new(0u32));
    let acc = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            *acc.lock().unwrap() += 1;
            let redirect = redirect.clone();
            tokio::spawn(async move {
                let mut head = [0u8; 16];
                if s.read_exact(&mut head).await.is_err() {
                    return;
                }
                let h = wire::parse_header(&head, wire::FRAME_BYTES_DEFAULT).unwrap();
                let mut body = vec![0u8; h.body_len];
                s.read_exact(&mut body).await.unwrap();
                assert!(matches!(Body::decode(h.op, &body).unwrap(), Body::Hello(_)));
                let ok = wire::HelloOk {
                    protocol_version: 1,
                    server_version: "stand-in".into(),
                    resume: wire::ResumeIdentity {
                        client_id: "c-1".into(),
                        owner_id: "o-1".into(),
                        token: vec![1; 16],
                    },
                    ..Default::default()
                };
                let now =
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
                let away =
                    wire::GoingAway { deadline_ms: now + 5000, grace_ms: 0, reason: "shutdown".into(), redirect };
                let mut out = wire::encode_frame(&Body::HelloOk(ok), h.req_id, 0);
                out.extend(wire::encode_frame(&Body::GoingAway(away), 0, 0));
                s.write_all(&out).await.unwrap();
                // Keep the socket open: the client closes it itself.
                let mut sink = vec![0u8; 4096];
                while let Ok(n) = s.read(&mut sink).await {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

#[tokio::test]
async fn going_away_with_a_redirect_moves_the_client() {
    let (_b, p) = setup().await;
    let (away_addr, accepted) = going_away_server(p.addr.clone()).await;
    let c = sinew::connect(away_addr).await.unwrap();
    let mut status = c.status();
    // The publish waits for the next connection, which goes to the redirect.
    let conf = within(20, c.publish("moved", "here")).await.unwrap();
    assert!(!conf.duplicate);
    let mut sub = c.subscribe("moved").await.unwrap();
    assert_eq!(next(&mut sub).await.body, b"here");
    assert_eq!(*accepted.lock().unwrap(), 1, "the client went back to the node going away");
    let mut connected = false;
    while let Ok(s) = status.try_recv() {
        connected |= matches!(s, Status::Connected { .. });
    }
    assert!(connected);
    c.close().await.unwrap();
}

#[tokio::test]
async fn seed_addresses_are_tried_in_turn() {
    let (_b, p) = setup().await;
    // A port nothing listens on: bound, then closed.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let clock = Arc::new(RecordClock::default());
    let opts = ConnectOptions::new(dead.clone()).addresses([dead, p.addr.clone()]).clock(clock.clone());
    let c = within(20, sinew::connect_with(opts)).await.unwrap();
    assert_eq!(clock.waits.lock().unwrap().len(), 1, "one refused seed, one wait");
    c.publish("seeds", "x").await.unwrap();
    c.close().await.unwrap();
    // Not host:port: refused before anything is dialled.
    let e = sinew::connect("no-port").await.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { argument: "address", .. }), "{:?}", e);
}

#[tokio::test]
async fn silent_connection_is_ended_by_the_heartbeat_and_resumed() {
    let (_b, p) = setup().await;
    let c =
        sinew::connect_with(ConnectOptions::new(p.addr.clone()).heartbeat(Duration::from_millis(200))).await.unwrap();
    let mut status = c.status();
    c.publish("hb", "before").await.unwrap();
    // Nothing from the broker reaches the client any more.
    p.hold(true);
    let why = within(10, async {
        loop {
            if let Some(Status::Disconnected(why)) = status.recv().await {
                return why;
            }
        }
    })
    .await;
    p.hold(false);
    assert!(why.contains("heartbeat"), "{}", why);
    let resumed = within(20, async {
        loop {
            if let Some(Status::Connected { resumed }) = status.recv().await {
                return resumed;
            }
        }
    })
    .await;
    assert!(resumed);
    c.publish("hb", "after").await.unwrap();
    c.close().await.unwrap();
}

#[tokio::test]
async fn mutual_tls_client_certificate() {
    let dir = temp_dir("sinew-rs-mtls");
    let bin = tokio::task::spawn_blocking(broker_binary).await.unwrap();
    let st = std::process::Command::new(&bin).args(["cert", "generate", "--dir"]).arg(&dir).output().unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let f = |n: &str| dir.join(n).to_str().unwrap().to_string();
    let mut b = Broker::new(&[
        "--tls-cert-file",
        &f("server.pem"),
        "--tls-key-file",
        &f("server-key.pem"),
        "--tls-client-ca-file",
        &f("ca.pem"),
        "--tls-client-auth",
        "require",
    ]);
    b.start().await;
    let opts = ConnectOptions::new(b.addr.clone())
        .tls_client_cert(f("ca.pem"), f("client.pem"), f("client-key.pem"))
        .tls_server_name("localhost");
    let c = within(20, sinew::connect_with(opts)).await.unwrap();
    c.publish("mtls", "with a certificate").await.unwrap();
    c.close().await.unwrap();
    // Without a client certificate the broker refuses the handshake: fatal.
    let clock = Arc::new(RecordClock::default());
    let opts =
        ConnectOptions::new(b.addr.clone()).tls_ca_file(f("ca.pem")).tls_server_name("localhost").clock(clock.clone());
    let e = within(20, sinew::connect_with(opts)).await.unwrap_err();
    assert!(matches!(e, Error::Tls(_)), "{:?}", e);
    assert!(clock.waits.lock().unwrap().is_empty());
    // A CA file that does not exist is a typed error before anything is dialled.
    let e = sinew::connect_with(ConnectOptions::new(b.addr.clone()).tls_ca_file(dir.join("missing.pem")))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Tls(_)), "{:?}", e);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn an_outage_past_the_grace_starts_a_fresh_session() {
    let mut b = Broker::new(&[]);
    b.grace_ms = 300;
    b.start().await;
    let mut p = FaultProxy::start(&b.addr).await;
    let c = sinew::connect(p.addr.clone()).await.unwrap();
    let mut status = c.status();
    let mut sub = c.subscribe("fresh").await.unwrap();
    c.publish("fresh", "held").await.unwrap();
    let m = next(&mut sub).await;
    assert_eq!(m.attempt, 1);
    // Away for longer than the broker keeps the session.
    p.refuse(true).await;
    p.cut_all();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    p.refuse(false).await;
    let resumed = within(30, async {
        loop {
            if let Some(Status::Connected { resumed }) = status.recv().await {
                return resumed;
            }
        }
    })
    .await;
    assert!(!resumed, "the session outlived its grace");
    // The old lease is gone: its settle fails, and the message comes again
    // on the subscription the client made again.
    assert!(matches!(m.complete().await, Err(Error::StaleDelivery)));
    let again = next(&mut sub).await;
    assert_eq!((again.body.as_slice(), again.attempt), (&b"held"[..], 2));
    within(10, again.complete()).await.unwrap();
    c.close().await.unwrap();
}

#[tokio::test]
async fn keyless_publishes_follow_the_partition_hint_and_drop_a_stale_one() {
    let (_b, p) = setup().await;
    let c = sinew::connect(p.addr.clone()).await.unwrap();
    c.declare_queue("hints", QueueOptions { partitions: 4, ..Default::default() }).await.unwrap();
    let mut parts = std::collections::HashSet::new();
    for i in 0..40 {
        let hint = c.partition_hint("hints", "");
        let conf = c.publish("hints", format!("{}", i)).await.unwrap();
        if let Some(h) = hint {
            assert_eq!(conf.partition, h, "a keyless publish went elsewhere than its hint");
        }
        parts.insert(conf.partition);
        if c.partition_hint("hints", "").map_or(false, |h| h > 0) && i >= 8 {
            break;
        }
    }
    assert!(parts.len() > 1, "keyless publishes all went to {:?}", parts);
    let hint = c.partition_hint("hints", "").expect("a hint");
    assert!(hint > 0);
    // The queue comes back with one partition: the hinted one is gone, and
    // the publish goes again without it.
    c.delete_queue("hints", "").await.unwrap();
    c.declare_queue("hints", QueueOptions { partitions: 1, ..Default::default() }).await.unwrap();
    let conf = c.publish("hints", "after").await.unwrap();
    assert_eq!(conf.partition, 0);
    assert!(!conf.duplicate);
    c.close().await.unwrap();
}

#[tokio::test]
async fn giving_up_after_max_attempts_ends_subscriptions_typed() {
    let (_b, mut p) = setup().await;
    let clock = Arc::new(RecordClock::default());
    let pol = sinew::ReconnectPolicy { max_attempts: 3, ..Default::default() };
    let c = sinew::connect_with(ConnectOptions::new(p.addr.clone()).reconnect(pol).clock(clock.clone())).await.unwrap();
    let mut sub = c.subscribe("give-up").await.unwrap();
    p.refuse(true).await;
    p.cut_all();
    let e = within(20, sub.next()).await.expect("an end").unwrap_err();
    assert!(matches!(e, Error::Disconnected(_)), "{:?}", e);
    assert!(e.is_retryable());
    assert!(within(10, sub.next()).await.is_none());
    // Three failures, three waits: the one after the cut and two more.
    assert_eq!(clock.waits.lock().unwrap().len(), 3);
    // An operation asks for one fresh attempt, which fails too.
    let e = within(20, c.publish("give-up", "x")).await.unwrap_err();
    assert!(matches!(e, Error::Disconnected(_)), "{:?}", e);
    // Once the broker is reachable again, the next operation's fresh attempt connects.
    p.refuse(false).await;
    within(20, c.publish("give-up", "y")).await.unwrap();
    c.close().await.unwrap();
}

/// A scripted stand-in broker for the reconciliation outcomes a real one
/// gives only in rare states: the first connection takes two subscriptions
/// and is cut; the resumed session's RECONCILE closes the first on the client
/// side and asks the client to recreate the second, whose new SUBSCRIBE is
/// refused.
async fn reconciling_server() -> String {
    use sinew::wire::{self, Body};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let mut conns = 0;
        loop {
            let (mut s, _) = l.accept().await.unwrap();
            conns += 1;
            let first = conns == 1;
            tokio::spawn(async move {
                let mut subscribed = 0;
                loop {
                    let mut head = [0u8; 16];
                    if s.read_exact(&mut head).await.is_err() {
                        return;
                    }
                    let h = wire::parse_header(&head, wire::FRAME_BYTES_DEFAULT).unwrap();
                    let mut body = vec![0u8; h.body_len];
                    s.read_exact(&mut body).await.unwrap();
                    let view = |id: u64, topic: &str| wire::SubView {
                        sub_id: id,
                        topic: topic.into(),
                        partition: -1,
                        ..Default::default()
                    };
                    let answer = match Body::decode(h.op, &body).unwrap() {
                        Body::Hello(hello) => Body::HelloOk(wire::HelloOk {
                            protocol_version: 1,
                            resume: wire::ResumeIdentity {
                                client_id: "c-1".into(),
                                owner_id: "o-1".into(),
                                token: vec![7; 16],
                            },
                            outcome: if hello.resume.client_id.is_empty() { 0 } else { 1 },
                            ..Default::default()
                        }),
                        Body::Subscribe(sb) if first => {
                            subscribed += 1;
                            let id = if sb.topic == "a" { 11 } else { 12 };
                            Body::SubscribeOk(wire::SubscribeOk { sub_id: id, partitions: vec![0], prefetch: 10 })
                        }
                        Body::Subscribe(_) => Body::Error(wire::ErrorBody {
                            code: 9,
                            message: "no such queue".into(),
                            ..Default::default()
                        }),
                        Body::Reconcile(rc) => {
                            assert!(rc.inflight_follows);
                            assert_eq!(rc.subs.len(), 2);
                            Body::ReconcileResult(wire::ReconcileResult {
                                entries: vec![
                                    wire::ReconcileEntry {
                                        action: 2,
                                        client_sub_id: 11,
                                        client: view(11, "a"),
                                        reason: "mismatched".into(),
                                        ..Default::default()
                                    },
                                    wire::ReconcileEntry {
                                        action: 4,
                                        client_sub_id: 12,
                                        client: view(12, "b"),
                                        reason: "missing".into(),
                                        ..Default::default()
                                    },
                                ],
                            })
                        }
                        Body::Inflight(_) => Body::InflightResult(wire::InflightResult::default()),
                        Body::Ping => Body::Pong,
                        _ => Body::Ok,
                    };
                    let out = wire::encode_frame(&answer, h.req_id, 0);
                    if s.write_all(&out).await.is_err() {
                        return;
                    }
                    if first && subscribed == 2 {
                        return; // the cut: the socket closes
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn reconciliation_ends_subscriptions_typed() {
    let addr = reconciling_server().await;
    let c = sinew::connect(addr).await.unwrap();
    let mut a = c.subscribe("a").await.unwrap();
    let mut b = c.subscribe("b").await.unwrap();
    let e = within(20, a.next()).await.expect("an end").unwrap_err();
    assert!(matches!(&e, Error::ReconciledClosed(why) if why == "mismatched"), "{:?}", e);
    assert!(!e.is_retryable());
    let e = within(20, b.next()).await.expect("an end").unwrap_err();
    match &e {
        Error::Recreated(inner) => assert_eq!(inner.code(), Some(Code::NOT_FOUND)),
        other => panic!("{:?}", other),
    }
    assert!(within(10, a.next()).await.is_none());
    assert!(within(10, b.next()).await.is_none());
    c.close().await.unwrap();
}

#[tokio::test]
async fn cohort_members_share_the_partitions() {
    let (_b, p) = setup().await;
    let a = sinew::connect_with(ConnectOptions::new(p.addr.clone()).member_id("member-a")).await.unwrap();
    let b = sinew::connect_with(ConnectOptions::new(p.addr.clone()).member_id("member-b")).await.unwrap();
    assert_eq!(a.member_id(), "member-a");
    a.declare_queue("cohort", QueueOptions { partitions: 2, ..Default::default() }).await.unwrap();
    let opts = SubscribeOptions::new().cohort("billing").prefetch(16);
    let mut sa = a.subscribe_with("cohort", opts.clone()).await.unwrap();
    let mut sb = b.subscribe_with("cohort", opts).await.unwrap();
    assert_eq!((sa.cohort(), sa.member_id()), ("billing", "member-a"));
    // Each member is assigned one of the two partitions.
    let mut held: HashMap<&str, std::collections::HashSet<u32>> = HashMap::new();
    let mut ea = sa.assignments();
    let mut eb = sb.assignments();
    within(20, async {
        while held.get("a").map_or(0, |s| s.len()) + held.get("b").map_or(0, |s| s.len()) < 2
            || held.get("a").map_or(true, |s| s.is_empty())
            || held.get("b").map_or(true, |s| s.is_empty())
        {
            let (who, ev) = tokio::select! {
                Some(ev) = ea.next() => ("a", ev),
                Some(ev) = eb.next() => ("b", ev),
            };
            let set = held.entry(who).or_default();
            if ev.assigned {
                set.insert(ev.partition);
            } else {
                set.remove(&ev.partition);
            }
        }
    })
    .await;
    let (pa, pb) = (held["a"].clone(), held["b"].clone());
    assert!(pa.is_disjoint(&pb), "{:?} {:?}", pa, pb);
    // Keyed messages reach only the member holding their partition.
    for i in 0..20 {
        a.publish_with("cohort", format!("{}", i), PublishOptions::new().key(format!("acct-{}", i % 5))).await.unwrap();
    }
    let mut got = 0;
    within(20, async {
        while got < 20 {
            let (who, m) = tokio::select! {
                Some(m) = sa.next() => ("a", m.unwrap()),
                Some(m) = sb.next() => ("b", m.unwrap()),
            };
            let mine = if who == "a" { &pa } else { &pb };
            assert!(mine.contains(&m.partition), "member {} got partition {}", who, m.partition);
            assert!(m.assignment > 0, "a cohort delivery without its assignment epoch");
            m.complete().await.unwrap();
            got += 1;
        }
    })
    .await;
    // A cut inside the grace moves nothing: the members keep their partitions.
    p.cut_all();
    for i in 20..24 {
        a.publish_with("cohort", format!("{}", i), PublishOptions::new().key(format!("acct-{}", i % 5))).await.unwrap();
    }
    within(20, async {
        while got < 24 {
            let (who, m) = tokio::select! {
                Some(m) = sa.next() => ("a", m.unwrap()),
                Some(m) = sb.next() => ("b", m.unwrap()),
            };
            let mine = if who == "a" { &pa } else { &pb };
            assert!(mine.contains(&m.partition), "after the cut member {} got partition {}", who, m.partition);
            m.complete().await.unwrap();
            got += 1;
        }
    })
    .await;
    // Member b leaves: member a is assigned its partition too.
    b.close().await.unwrap();
    within(20, async {
        let mut mine = pa.clone();
        while mine.len() < 2 {
            let ev = ea.next().await.unwrap();
            if ev.assigned {
                mine.insert(ev.partition);
            }
        }
    })
    .await;
    // Bad names are refused before anything is sent.
    for (c, m) in [("bad name", None), ("ok", Some("bad/member"))] {
        let mut o = SubscribeOptions::new().cohort(c);
        o.member_id = m.map(String::from);
        assert!(matches!(a.subscribe_with("cohort", o).await, Err(Error::InvalidArgument { .. })));
    }
    let e = a.subscribe_with("cohort", SubscribeOptions::new().member_id("x")).await.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { argument: "member_id", .. }), "{:?}", e);
    let e = a.subscribe_with("cohort", SubscribeOptions::new().cohort("billing").member_id("other")).await.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { argument: "member_id", .. }), "{:?}", e);
    drop(ea);
    a.close().await.unwrap();
}

#[tokio::test]
async fn extend_renews_a_lease_and_refusals_are_typed() {
    let (_b, p) = setup().await;
    let c = sinew::connect(p.addr.clone()).await.unwrap();
    c.publish("ext", "long job").await.unwrap();
    let mut sub = c.subscribe("ext").await.unwrap();
    let m = next(&mut sub).await;
    within(10, m.extend(Duration::from_secs(60))).await.unwrap();
    // Above the broker's lease cap (12 h): refused, and the lease is still held.
    let e = within(10, m.extend(Duration::from_secs(13 * 3600))).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::BAD_REQUEST), "{:?}", e);
    assert!(!e.is_retryable());
    // A retry delay above the broker's cap (30 days) is refused too.
    let e = within(10, m.retry_after(Duration::from_secs(31 * 24 * 3600))).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::BAD_REQUEST), "{:?}", e);
    // The refused settle left the lease held: the message can be settled
    // again, and then only once.
    within(10, m.complete()).await.unwrap();
    assert!(matches!(m.complete().await, Err(Error::AlreadySettled)));
    assert!(matches!(m.extend(Duration::from_secs(1)).await, Err(Error::AlreadySettled)));
    assert!(tokio::time::timeout(Duration::from_millis(300), sub.next()).await.is_err());
    c.close().await.unwrap();
}

#[tokio::test]
async fn a_slow_application_is_not_a_silent_broker() {
    let (_b, p) = setup().await;
    let c =
        sinew::connect_with(ConnectOptions::new(p.addr.clone()).heartbeat(Duration::from_millis(100))).await.unwrap();
    let mut status = c.status();
    let n = 6000; // more than a subscription buffers (4096): the reader waits
    futures::stream::iter(0..n)
        .map(|i| c.publish("slow-app", format!("{}", i)))
        .buffer_unordered(64)
        .for_each(|r| {
            r.unwrap();
            async {}
        })
        .await;
    let mut sub = c.subscribe_with("slow-app", SubscribeOptions::new().auto_ack(true)).await.unwrap();
    // The application reads nothing for ten heartbeat intervals.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mut got = 0;
    while got < n {
        within(10, sub.next()).await.unwrap().unwrap();
        got += 1;
    }
    while let Ok(s) = status.try_recv() {
        assert!(!matches!(s, Status::Disconnected(_)), "{:?}", s);
    }
    c.close().await.unwrap();
}

#[tokio::test]
async fn a_delivery_whose_lease_ran_out_unread_is_dropped() {
    use sinew::wire::{self, Body};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // A stand-in broker that, like a cluster node, says how much of each
    // lease is left: 50 ms for the first delivery, nothing for the second.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        loop {
            let mut head = [0u8; 16];
            if s.read_exact(&mut head).await.is_err() {
                return;
            }
            let h = wire::parse_header(&head, wire::FRAME_BYTES_DEFAULT).unwrap();
            let mut body = vec![0u8; h.body_len];
            s.read_exact(&mut body).await.unwrap();
            let mut out = Vec::new();
            match Body::decode(h.op, &body).unwrap() {
                Body::Hello(_) => out.extend(wire::encode_frame(
                    &Body::HelloOk(wire::HelloOk { protocol_version: 1, ..Default::default() }),
                    h.req_id,
                    0,
                )),
                Body::Subscribe(_) => {
                    let ok = wire::SubscribeOk { sub_id: 5, partitions: vec![0], prefetch: 10 };
                    out.extend(wire::encode_frame(&Body::SubscribeOk(ok), h.req_id, 0));
                    for (tag, lease_ms, text) in [(1u64, 50u32, "expired"), (2, 0, "fresh")] {
                        let d = wire::Deliver {
                            sub_id: 5,
                            tag,
                            offset: tag,
                            attempt: 1,
                            body: text.as_bytes().to_vec(),
                            topic: "lease".into(),
                            lease_id: 100 + tag,
                            lease_ms,
                            ..Default::default()
                        };
                        out.extend(wire::encode_frame(&Body::Deliver(d), 0, 0));
                    }
                }
                _ => out.extend(wire::encode_frame(&Body::Ok, h.req_id, 0)),
            }
            if s.write_all(&out).await.is_err() {
                return;
            }
        }
    });
    let c = sinew::connect(addr).await.unwrap();
    let mut sub = c.subscribe("lease").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await; // the application is busy
    let m = next(&mut sub).await;
    assert_eq!(m.body, b"fresh");
    assert!(tokio::time::timeout(Duration::from_millis(200), sub.next()).await.is_err());
    drop(sub);
    drop(c);
}
