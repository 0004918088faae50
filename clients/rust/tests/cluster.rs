//! Cluster routing against three real `sinew serve --cluster` processes on
//! loopback: a publish sent to a node that does not own the partition
//! follows `not_owner` to the owner, the owner killed with SIGKILL while
//! publishing costs the application no error and no message, a client
//! given one node's address learns the others, a subscription receives the
//! partitions of every owner, and settles of deliveries whose owner was
//! killed are applied by the new owner (by lease reference).

// The SERIAL guard is held for a whole test on purpose (see below).
#![allow(clippy::await_holding_lock)]

mod common;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use sinew::{ConnectOptions, QueueOptions, SubscribeOptions};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};

const READY: Duration = Duration::from_secs(30);

// One cluster at a time: the machine's cores are shared. Each test runs its
// own runtime on its own thread, so the guard only orders the threads.
static SERIAL: Mutex<()> = Mutex::new(());

async fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port()
}

struct Node {
    addr: String,
    admin: String,
    gossip: String,
    peer: String,
    data: PathBuf,
    child: Option<Child>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Node {
    /// Starts the node. A port picked free (`free_port`) can be taken by
    /// another socket before the node binds it (an outgoing connection's
    /// ephemeral port): the node then exits with "address already in use",
    /// and it is started again on newly picked ports (at most 4 times).
    async fn start(&mut self, seeds: &[String]) {
        for attempt in 0.. {
            match self.try_start(seeds).await {
                Ok(()) => return,
                Err(log) if attempt < 4 && log.contains("address already in use") => {
                    self.addr = format!("127.0.0.1:{}", free_port().await);
                    self.admin = format!("127.0.0.1:{}", free_port().await);
                    self.gossip = format!("127.0.0.1:{}", free_port().await);
                    self.peer = format!("127.0.0.1:{}", free_port().await);
                    self.log.lock().unwrap().clear();
                }
                Err(log) => panic!("node exited:\n{}", log),
            }
        }
    }

    async fn try_start(&mut self, seeds: &[String]) -> Result<(), String> {
        let bin = tokio::task::spawn_blocking(common::broker_binary).await.unwrap();
        let mut cmd = Command::new(bin);
        cmd.args(["serve", "--listen", &self.addr, "--admin-listen", &self.admin])
            .arg("--data-dir")
            .arg(&self.data)
            .args(["--cluster", "--cluster-profile", "lan"])
            .args(["--cluster-gossip-listen", &self.gossip, "--cluster-peer-listen", &self.peer])
            .args(["--connection-heartbeat-ms", "1000"]);
        if !seeds.is_empty() {
            cmd.args(["--cluster-seeds", &seeds.join(",")]);
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).kill_on_drop(true);
        let mut child = cmd.spawn().expect("start sinew serve --cluster");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let log = self.log.clone();
        let started = tokio::time::timeout(READY, async {
            while let Ok(Some(line)) = lines.next_line().await {
                let serving = line.contains("msg=serving listen=");
                log.lock().unwrap().push(line);
                if serving {
                    return true;
                }
            }
            false
        })
        .await
        .expect("node did not start in time");
        if !started {
            let _ = child.wait().await;
            return Err(self.log.lock().unwrap().join("\n"));
        }
        let log = self.log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let mut l = log.lock().unwrap();
                if l.len() < 10_000 {
                    l.push(line);
                }
            }
        });
        self.child = Some(child);
        Ok(())
    }

    async fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.start_kill();
        }
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

/// GET on a node's admin API, parsed as JSON.
async fn get_json(admin: &str, path: &str) -> Option<serde_json::Value> {
    let mut s = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(admin)).await.ok()?.ok()?;
    let req = format!("GET {} HTTP/1.0\r\nHost: {}\r\n\r\n", path, admin);
    s.write_all(req.as_bytes()).await.ok()?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut out)).await.ok()?.ok()?;
    let text = String::from_utf8_lossy(&out);
    let (head, body) = text.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return None;
    }
    serde_json::from_str(body).ok()
}

struct Cluster {
    nodes: Vec<Node>,
}

impl Cluster {
    /// Three nodes; the first bootstraps the controller, the others join it.
    /// Returns once the controller has a leader and three voters.
    async fn start() -> Cluster {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            nodes.push(Node {
                addr: format!("127.0.0.1:{}", free_port().await),
                admin: format!("127.0.0.1:{}", free_port().await),
                gossip: format!("127.0.0.1:{}", free_port().await),
                peer: format!("127.0.0.1:{}", free_port().await),
                data: common::temp_dir("sinew-rs-cluster"),
                child: None,
                log: Arc::new(Mutex::new(Vec::new())),
            });
        }
        nodes[0].start(&[]).await;
        // Node 0's gossip address, as it started (its ports may have been picked again).
        let first = vec![nodes[0].gossip.clone()];
        for n in nodes.iter_mut().skip(1) {
            n.start(&first).await;
        }
        let c = Cluster { nodes };
        let deadline = Instant::now() + READY;
        loop {
            if let Some(v) = get_json(&c.nodes[0].admin, "/api/v1/nodes").await {
                let ctl = &v["controller"];
                let voters = ctl["voters"].as_array().map_or(0, |a| a.len());
                if ctl["leader"].as_str().map_or(false, |l| !l.is_empty()) && voters == 3 {
                    return c;
                }
            }
            assert!(Instant::now() < deadline, "the controller did not reach three voters:\n{}", c.logs());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.addr.clone()).collect()
    }

    fn index(&self, addr: &str) -> usize {
        self.nodes.iter().position(|n| n.addr == addr).unwrap_or_else(|| panic!("{} is no node of the cluster", addr))
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let l = n.log.lock().unwrap();
            let tail = &l[l.len().saturating_sub(30)..];
            out += &format!("--- node {} ({}):\n{}\n", i, n.addr, tail.join("\n"));
        }
        out
    }
}

fn opts(addrs: &[String]) -> ConnectOptions {
    ConnectOptions::new(addrs[0].clone()).addresses(addrs.to_vec()).connect_timeout(Duration::from_secs(20))
}

/// Declares a one-partition queue through `via` and returns the client
/// address of its owner once the cluster has elected one.
async fn declare_and_find_owner(via: &sinew::Client, topic: &str) -> String {
    via.declare_queue(topic, QueueOptions { partitions: 1, ..Default::default() }).await.expect("declare");
    owner_of(via, topic, None).await
}

/// The owner of the queue's partition 0, as METADATA names it, waiting
/// while there is none (or it is still `not`).
async fn owner_of(via: &sinew::Client, topic: &str, not: Option<&str>) -> String {
    let deadline = Instant::now() + READY;
    loop {
        if let Ok(md) = via.metadata(topic, "").await {
            assert!(md.cluster, "METADATA of a cluster node says cluster = false");
            if let Some(p) = md.partitions.first() {
                if !p.owner.is_empty() && Some(p.owner.as_str()) != not {
                    return p.owner.clone();
                }
            }
        }
        assert!(Instant::now() < deadline, "no owner for {} within {:?}", topic, READY);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads the queue through its owner until `want` distinct bodies arrived
/// (or nothing came for `quiet`); returns body -> the offsets it was stored at.
async fn consume_all(owner: &str, topic: &str, want: usize, quiet: Duration) -> HashMap<String, HashSet<u64>> {
    let c = sinew::connect(owner).await.expect("connect the consumer");
    let mut sub = c.subscribe_with(topic, SubscribeOptions::new().prefetch(1000)).await.expect("subscribe");
    let mut seen: HashMap<String, HashSet<u64>> = HashMap::new();
    while seen.len() < want {
        match tokio::time::timeout(quiet, sub.next()).await {
            Ok(Some(Ok(m))) => {
                seen.entry(m.text().unwrap_or("").to_string()).or_default().insert(m.offset);
                drop(m.complete()); // sent in the next batch
            }
            Ok(Some(Err(e))) => panic!("subscription ended: {}", e),
            Ok(None) | Err(_) => break,
        }
    }
    // Anything more (a second copy) arrives within a short wait.
    while let Ok(Some(Ok(m))) = tokio::time::timeout(Duration::from_millis(500), sub.next()).await {
        seen.entry(m.text().unwrap_or("").to_string()).or_default().insert(m.offset);
        drop(m.complete());
    }
    let _ = c.close().await;
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_publish_through_a_node_that_does_not_own_the_partition() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cl = Cluster::start().await;
    let admin = sinew::connect_with(opts(&cl.addrs())).await.unwrap();
    let owner = declare_and_find_owner(&admin, "routed").await;
    let other = cl.addrs().into_iter().find(|a| *a != owner).unwrap();

    // A client given only a node that does not own the partition.
    let c = sinew::connect_with(opts(std::slice::from_ref(&other))).await.unwrap();
    assert_eq!(c.connected_node(), other);
    let mut offsets = HashSet::new();
    for i in 0..50 {
        let ok = tokio::time::timeout(Duration::from_secs(20), c.publish("routed", format!("r-{}", i)))
            .await
            .expect("publish timed out")
            .unwrap_or_else(|e| panic!("publish {} through {}: {}\n{}", i, other, e, cl.logs()));
        assert_eq!(ok.partition, 0);
        assert!(!ok.duplicate, "publish {} answered as a duplicate", i);
        assert!(offsets.insert(ok.offset), "offset {} confirmed twice", ok.offset);
    }
    assert_eq!(c.connected_node(), owner, "the client did not move to the owner");
    let seen = consume_all(&owner, "routed", 50, Duration::from_secs(10)).await;
    assert_eq!(seen.len(), 50);
    assert!(seen.values().all(|o| o.len() == 1), "a message stored twice");
    c.close().await.unwrap();
    admin.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_client_given_one_address_learns_the_others() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cl = Cluster::start().await;
    let all: HashSet<String> = cl.addrs().into_iter().collect();
    let seed = cl.nodes[0].addr.clone();
    let c = sinew::connect_with(opts(std::slice::from_ref(&seed))).await.unwrap();
    c.declare_queue("learn", QueueOptions { partitions: 1, ..Default::default() }).await.unwrap();
    c.publish("learn", "first").await.unwrap();
    // The publish asked METADATA in the background; its answer names every
    // replica of the queue (three nodes, replication factor 3).
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.nodes().iter().cloned().collect::<HashSet<_>>() != all {
        assert!(Instant::now() < deadline, "known {:?}, want {:?}", c.nodes(), all);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(c.nodes()[0], seed, "the seed comes first");
    assert_eq!(c.nodes().len(), 3);

    // Without the node it was given, it still reaches the cluster.
    cl.nodes[0].kill9().await;
    let ok = tokio::time::timeout(Duration::from_secs(40), c.publish("learn", "second"))
        .await
        .expect("publish after the seed died timed out")
        .unwrap_or_else(|e| panic!("publish after the seed died: {}\n{}", e, cl.logs()));
    assert_eq!(ok.partition, 0);
    assert_ne!(c.connected_node(), seed);
    c.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_owner_kill9_while_publishing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cl = Cluster::start().await;
    let admin = sinew::connect_with(opts(&cl.addrs())).await.unwrap();
    let owner = declare_and_find_owner(&admin, "failover").await;
    let victim = cl.index(&owner);
    // The publisher is given only the owner: it learns the others.
    let publisher = Arc::new(sinew::connect_with(opts(std::slice::from_ref(&owner))).await.unwrap());

    const IN_FLIGHT: usize = 16;
    const BEFORE_KILL: Duration = Duration::from_millis(1500);
    const AFTER_RECOVERY: Duration = Duration::from_secs(1);
    const LIMIT: Duration = Duration::from_secs(40);
    let started = Instant::now();
    let mut killed_at: Option<Instant> = None;
    let mut recovered_at: Option<Instant> = None;
    let mut confirmed: Vec<String> = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    let mut last_confirm = Instant::now();
    let mut longest_pause = Duration::ZERO;
    let mut inflight = FuturesUnordered::new();
    let mut next = 0u64;
    let mut after_kill = 0u64;
    loop {
        let now = Instant::now();
        let stop = now.duration_since(started) > LIMIT
            || recovered_at.map_or(false, |r| now.duration_since(r) > AFTER_RECOVERY);
        if killed_at.is_none() && now.duration_since(started) >= BEFORE_KILL {
            cl.nodes[victim].kill9().await;
            killed_at = Some(Instant::now());
        }
        while !stop && inflight.len() < IN_FLIGHT {
            let body = format!("f-{}", next);
            next += 1;
            let p = publisher.clone();
            let sent = Instant::now();
            inflight.push(async move {
                let r = p.publish("failover", body.clone()).await;
                (body, r, sent, Instant::now())
            });
        }
        let (body, r, sent, at) = match inflight.next().await {
            Some(x) => x,
            None => break,
        };
        match r {
            Ok(_) => {
                confirmed.push(body);
                longest_pause = longest_pause.max(at.saturating_duration_since(last_confirm));
                last_confirm = last_confirm.max(at);
                // Recovered: a publish made after the kill is confirmed.
                if killed_at.map_or(false, |k| sent > k) && recovered_at.is_none() {
                    recovered_at = Some(at);
                }
                if killed_at.map_or(false, |k| sent > k) {
                    after_kill += 1;
                }
            }
            Err(e) => errors.push(format!("{}: {}", body, e)),
        }
    }
    let killed_at = killed_at.expect("the owner was killed");
    let recovered_at = recovered_at.unwrap_or_else(|| panic!("no publish confirmed after the kill:\n{}", cl.logs()));
    assert!(errors.is_empty(), "{} application errors, first: {}", errors.len(), errors[0]);

    assert_ne!(publisher.connected_node(), owner, "the publisher is still on the killed node");
    let new_owner = owner_of(&admin, "failover", Some(&owner)).await;
    let consume_started = Instant::now();
    let seen = consume_all(&new_owner, "failover", confirmed.len(), Duration::from_secs(10)).await;
    println!("failover: consumed in {:?}, test time {:?}", consume_started.elapsed(), started.elapsed());
    let lost: Vec<&String> = confirmed.iter().filter(|b| !seen.contains_key(*b)).collect();
    let duplicates = seen.values().filter(|o| o.len() > 1).count();
    println!(
        "failover: {} published, {} confirmed ({} of them made after the kill), {} lost, {} stored twice, {} application errors; \
         owner {} killed {:?} after the start, first publish made after the kill confirmed {:?} after it; \
         longest pause between confirms {:?}; now owned by {}",
        next,
        confirmed.len(),
        after_kill,
        lost.len(),
        duplicates,
        errors.len(),
        owner,
        killed_at.duration_since(started),
        recovered_at.duration_since(killed_at),
        longest_pause,
        new_owner
    );
    assert!(lost.is_empty(), "{} confirmed messages not consumed, first {}", lost.len(), lost[0]);
    assert_eq!(duplicates, 0, "messages stored twice");
    assert!(seen.len() >= confirmed.len());
    publisher.close().await.unwrap();
    admin.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_subscription_spans_the_owners() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cl = Cluster::start().await;
    let publisher = sinew::connect_with(opts(&cl.addrs())).await.unwrap();
    publisher.declare_queue("spread", QueueOptions { partitions: 4, ..Default::default() }).await.unwrap();
    // Every partition has an owner, and they are not all the same node.
    let deadline = Instant::now() + READY;
    let owners: Vec<String> = loop {
        let md = publisher.metadata("spread", "").await.unwrap();
        let o: Vec<String> = md.partitions.iter().map(|p| p.owner.clone()).collect();
        if o.len() == 4 && o.iter().all(|x| !x.is_empty()) {
            break o;
        }
        assert!(Instant::now() < deadline, "no owners: {:?}", o);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let distinct: HashSet<&String> = owners.iter().collect();
    assert!(distinct.len() >= 2, "the placement gave every partition to one node: {:?}", owners);

    // The subscriber is given one node that does not own partition 0.
    let seed = cl.addrs().into_iter().find(|a| *a != owners[0]).unwrap();
    let sc = sinew::connect_with(opts(std::slice::from_ref(&seed))).await.unwrap();
    let mut sub = sc.subscribe_with("spread", SubscribeOptions::new().prefetch(100)).await.unwrap();

    let mut sent = HashSet::new();
    for p in 0..4u32 {
        for i in 0..25 {
            let body = format!("s-{}-{}", p, i);
            let ok = publisher.publish_with("spread", body.clone(), sinew::PublishOptions::new().partition(p)).await;
            assert_eq!(ok.unwrap_or_else(|e| panic!("publish {}: {}", body, e)).partition, p);
            sent.insert(body);
        }
    }
    let mut got: HashMap<String, u32> = HashMap::new();
    let mut partitions = HashSet::new();
    while got.len() < sent.len() {
        let m = tokio::time::timeout(Duration::from_secs(10), sub.next())
            .await
            .unwrap_or_else(|_| panic!("{} of {} delivered; partitions {:?}", got.len(), sent.len(), partitions))
            .expect("stream ended")
            .expect("subscription error");
        partitions.insert(m.partition);
        *got.entry(m.text().unwrap().to_string()).or_default() += 1;
        m.complete().await.expect("complete on the node that delivered");
    }
    assert_eq!(partitions, (0..4).collect::<HashSet<u32>>());
    assert!(got.values().all(|n| *n == 1), "a message delivered twice");

    // Ownership moves: partition 0's owner is killed; its new owner delivers
    // to the subscription the client holds there.
    let victim = cl.index(&owners[0]);
    cl.nodes[victim].kill9().await;
    for i in 0..10 {
        let body = format!("after-{}", i);
        let ok = tokio::time::timeout(
            Duration::from_secs(30),
            publisher.publish_with("spread", body.clone(), sinew::PublishOptions::new().partition(0)),
        )
        .await
        .expect("publish after the kill timed out");
        ok.unwrap_or_else(|e| panic!("publish {}: {}", body, e));
    }
    let mut after = HashSet::new();
    while after.len() < 10 {
        let m = tokio::time::timeout(Duration::from_secs(20), sub.next())
            .await
            .unwrap_or_else(|_| panic!("{} of 10 delivered after the owner was killed", after.len()))
            .expect("stream ended")
            .expect("subscription error");
        let t = m.text().unwrap().to_string();
        if t.starts_with("after-") {
            assert_eq!(m.partition, 0);
            after.insert(t);
        }
        drop(m.complete());
    }
    sub.unsubscribe().await.unwrap();

    // A subscription to a queue that does not exist yet makes it, as on a
    // single broker, and spans its nodes.
    let mut fresh = tokio::time::timeout(Duration::from_secs(40), sc.subscribe("made-by-subscribe"))
        .await
        .expect("subscribe timed out")
        .unwrap_or_else(|e| panic!("subscribe to a new queue: {}\n{}", e, cl.logs()));
    tokio::time::timeout(Duration::from_secs(30), publisher.publish("made-by-subscribe", "hello"))
        .await
        .expect("publish timed out")
        .unwrap();
    let m = tokio::time::timeout(Duration::from_secs(10), fresh.next()).await.expect("delivery").unwrap().unwrap();
    assert_eq!(m.text(), Some("hello"));
    m.complete().await.unwrap();
    drop(fresh);
    sc.close().await.unwrap();
    publisher.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_settle_follows_the_owner_by_lease_reference() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cl = Cluster::start().await;
    let publisher = sinew::connect_with(opts(&cl.addrs())).await.unwrap();
    let lease = Duration::from_secs(5);
    publisher
        .declare_queue("follow", QueueOptions { partitions: 1, lease: Some(lease), ..Default::default() })
        .await
        .unwrap();
    let owner = owner_of(&publisher, "follow", None).await;
    let seed = cl.addrs().into_iter().find(|a| *a != owner).unwrap();
    let sc = sinew::connect_with(opts(std::slice::from_ref(&seed))).await.unwrap();
    let mut sub = sc.subscribe_with("follow", SubscribeOptions::new().prefetch(10)).await.unwrap();
    for i in 0..5 {
        publisher.publish("follow", format!("l-{}", i)).await.unwrap();
    }
    let mut held = Vec::new();
    while held.len() < 5 {
        let m = tokio::time::timeout(Duration::from_secs(10), sub.next()).await.expect("delivery").unwrap().unwrap();
        assert_eq!(m.attempt, 1);
        held.push(m);
    }
    // The owner that delivered them is killed before they are settled: the
    // settles go to the new owner by lease reference, within the lease.
    let killed = Instant::now();
    let victim = cl.index(&owner);
    cl.nodes[victim].kill9().await;
    // Four are completed, the last one is retried (a NACK).
    let futs: Vec<_> = held.iter().enumerate().map(|(i, m)| if i < 4 { m.complete() } else { m.retry() }).collect();
    let outs = tokio::time::timeout(Duration::from_secs(30), futures::future::join_all(futs))
        .await
        .expect("completes timed out");
    let mut completed = HashSet::new();
    let mut stale = 0;
    let mut retried = false;
    for (m, r) in held.iter().zip(outs) {
        match r {
            Ok(()) if m.text() == Some("l-4") => retried = true,
            Ok(()) => {
                completed.insert(m.text().unwrap().to_string());
            }
            // The new owner does not hold the lease (its grant had not reached
            // a majority before the kill): the message comes again.
            Err(sinew::Error::StaleDelivery) => stale += 1,
            Err(e) => panic!("complete of {} after the owner died: {}\n{}", m.text().unwrap(), e, cl.logs()),
        }
    }
    println!(
        "settle-follow: {} of 4 completes and {} of 1 retry applied by the new owner, {} stale_lease, answered {:?} after the owner was killed",
        completed.len(),
        retried as u8,
        stale,
        killed.elapsed()
    );
    assert!(!completed.is_empty(), "no complete reached the new owner");
    // Completed at the new owner: none comes again once the lease is over.
    let quiet = lease + Duration::from_secs(2);
    let until = Instant::now() + quiet;
    let mut redelivered = false;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, sub.next()).await {
            Err(_) => break,
            Ok(Some(Ok(m))) => {
                let t = m.text().unwrap().to_string();
                if t == "l-4" && retried {
                    assert!(m.attempt >= 2, "the retried message came with attempt {}", m.attempt);
                    redelivered = true;
                }
                assert!(!completed.contains(&t), "{} delivered again (attempt {}) after its complete", t, m.attempt);
                m.complete().await.unwrap();
            }
            Ok(other) => panic!("subscription ended: {:?}", other.map(|r| r.map(|m| m.offset))),
        }
    }
    assert!(!retried || redelivered, "the retried message did not come again");
    sub.unsubscribe().await.unwrap();
    sc.close().await.unwrap();
    publisher.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_extend_follows_the_owner_by_lease_reference() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cl = Cluster::start().await;
    let publisher = sinew::connect_with(opts(&cl.addrs())).await.unwrap();
    let lease = Duration::from_secs(3);
    publisher
        .declare_queue("reextend", QueueOptions { partitions: 1, lease: Some(lease), ..Default::default() })
        .await
        .unwrap();
    let owner = owner_of(&publisher, "reextend", None).await;
    let seed = cl.addrs().into_iter().find(|a| *a != owner).unwrap();
    let sc = sinew::connect_with(opts(std::slice::from_ref(&seed))).await.unwrap();
    let mut sub = sc.subscribe_with("reextend", SubscribeOptions::new().prefetch(10)).await.unwrap();
    publisher.publish("reextend", "x-0").await.unwrap();
    let m = tokio::time::timeout(Duration::from_secs(10), sub.next()).await.expect("delivery").unwrap().unwrap();
    // The lease's grant reaches the replicas, then the owner that delivered
    // it is killed: the extension goes to the new owner by lease reference.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let victim = cl.index(&owner);
    cl.nodes[victim].kill9().await;
    let killed = Instant::now();
    match tokio::time::timeout(Duration::from_secs(30), m.extend(Duration::from_secs(20))).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("extend after the owner died: {}\n{}", e, cl.logs()),
        Err(_) => panic!("extend after the owner died did not return\n{}", cl.logs()),
    }
    println!("extend-follow: applied by the new owner {:?} after the owner was killed", killed.elapsed());
    // Past the lease it had, the message has not come back: the extension holds it.
    if let Ok(Some(Ok(again))) = tokio::time::timeout(lease + Duration::from_secs(2), sub.next()).await {
        panic!("{} delivered again (attempt {}) while extended", again.text().unwrap(), again.attempt);
    }
    m.complete().await.unwrap();
    sub.unsubscribe().await.unwrap();
    sc.close().await.unwrap();
    publisher.close().await.unwrap();
}
