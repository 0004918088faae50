//! Throughput of the Rust client against a running broker, beside the Go SDK
//! (`sinew bench`) on the same broker in the same run.
//!
//!     cargo run --release --example bench -- publish --addr 127.0.0.1:7654 --window 64 --duration 5
//!     cargo run --release --example bench -- drain --addr 127.0.0.1:7654 --count 50000 --prefetch 1000
//!     cargo run --release --example bench -- compare --addr 127.0.0.1:7654 --sinew ./sinew --rounds 3
//!
//! `publish` keeps --window publishes in flight, each waiting for its
//! confirm, for --duration seconds after a 1 s warm-up. `drain` prefills
//! --count messages (256 in flight), then consumes them with --prefetch and
//! completes each without waiting for the answer (as `sinew bench drain`
//! does with `CompleteAsync`), and stops the clock once every settle is
//! answered. `compare` runs `sinew bench publish` and `sinew bench drain`
//! (the Go SDK) and the two workloads above in turns, --rounds times, and
//! prints each figure, the medians and the Rust/Go ratios.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use sinew::SubscribeOptions;

struct Args {
    mode: String,
    addr: String,
    window: usize,
    duration: f64,
    count: usize,
    prefetch: u32,
    size: usize,
    sinew: String,
    rounds: usize,
}

fn parse() -> Args {
    let mut a = Args {
        mode: String::new(),
        addr: "127.0.0.1:7654".into(),
        window: 64,
        duration: 5.0,
        count: 50_000,
        prefetch: 1000,
        size: 1024,
        sinew: "sinew".into(),
        rounds: 3,
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{} needs a value", x));
        match x.as_str() {
            "--addr" => a.addr = val(),
            "--window" => a.window = val().parse().expect("--window"),
            "--duration" => a.duration = val().parse().expect("--duration"),
            "--count" => a.count = val().parse().expect("--count"),
            "--prefetch" => a.prefetch = val().parse().expect("--prefetch"),
            "--size" => a.size = val().parse().expect("--size"),
            "--sinew" => a.sinew = val(),
            "--rounds" => a.rounds = val().parse().expect("--rounds"),
            m if !m.starts_with('-') && a.mode.is_empty() => a.mode = m.to_string(),
            other => panic!("unknown argument {}", other),
        }
    }
    if !["publish", "drain", "compare"].contains(&a.mode.as_str()) {
        eprintln!("usage: bench <publish|drain|compare> [--addr A] [--window N] [--duration S] [--count N] [--prefetch N] [--size B] [--sinew PATH] [--rounds N]");
        std::process::exit(2);
    }
    a
}

fn body(size: usize) -> Vec<u8> {
    (0..size).map(|_| rand::random::<u8>()).collect()
}

async fn publish(addr: &str, topic: &str, window: usize, duration: f64, size: usize) -> f64 {
    let c = sinew::connect(addr).await.expect("connect");
    let data = body(size);
    let count = Arc::new(AtomicU64::new(0));
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..window {
        let (c, count, measuring, stop, data, topic) =
            (c.clone(), count.clone(), measuring.clone(), stop.clone(), data.clone(), topic.to_string());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                c.publish(&topic, data.clone()).await.expect("publish");
                if measuring.load(Ordering::Relaxed) {
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await; // warm-up
    measuring.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(duration)).await;
    measuring.store(false, Ordering::Relaxed);
    let el = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    c.delete_queue(topic, "").await.expect("delete queue"); // as `sinew bench` deletes its fresh queue
    c.close().await.unwrap();
    let n = count.load(Ordering::Relaxed);
    let rate = n as f64 / el;
    println!("rust   publish window={} size={}: {:.0} msg/s, {} msgs in {:.2} s", window, size, rate, n, el);
    rate
}

async fn drain(addr: &str, topic: &str, count: usize, prefetch: u32, size: usize) -> f64 {
    let c = sinew::connect(addr).await.expect("connect");
    let data = body(size);
    futures::stream::iter(0..count)
        .map(|_| c.publish(topic, data.clone()))
        .buffer_unordered(256)
        .for_each(|r| {
            r.expect("prefill");
            async {}
        })
        .await;
    let t0 = Instant::now();
    let mut sub = c.subscribe_with(topic, SubscribeOptions::new().prefetch(prefetch)).await.expect("subscribe");
    let mut settles = Vec::with_capacity(count);
    let mut n = 0;
    while let Some(m) = sub.next().await {
        settles.push(m.expect("delivery").complete()); // sent at once; the answer is awaited below
        n += 1;
        if n == count {
            break;
        }
    }
    for s in settles {
        s.await.expect("settle");
    }
    let el = t0.elapsed().as_secs_f64();
    drop(sub);
    c.delete_queue(topic, "").await.expect("delete queue");
    c.close().await.unwrap();
    let rate = count as f64 / el;
    println!("rust   drain count={} prefetch={} size={}: {:.0} msg/s in {:.2} s", count, prefetch, size, rate, el);
    rate
}

fn go_bench(a: &Args, mode: &str) -> f64 {
    let mut args: Vec<String> = vec!["bench".into(), mode.into()];
    if mode == "publish" {
        args.extend([
            "--window".into(),
            a.window.to_string(),
            "--duration".into(),
            format!("{}s", a.duration),
            "--warmup".into(),
            "1s".into(),
        ]);
    } else {
        args.extend(["--count".into(), a.count.to_string(), "--prefetch".into(), a.prefetch.to_string()]);
    }
    args.extend(["--addr".into(), a.addr.clone(), "--size".into(), a.size.to_string(), "--json".into()]);
    let out = Command::new(&a.sinew).args(&args).output().expect("run sinew bench");
    assert!(out.status.success(), "sinew bench: {}", String::from_utf8_lossy(&out.stderr));
    let doc = String::from_utf8_lossy(&out.stdout);
    // The one figure needed from the JSON result: "msg_per_sec": <number>.
    let i = doc.find("\"msg_per_sec\"").expect("msg_per_sec in sinew bench --json");
    let rest = doc[i + 13..].trim_start_matches(|c: char| c == ':' || c.is_whitespace());
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '-' || c == '+'))
        .unwrap_or(rest.len());
    let rate: f64 = rest[..end].parse().expect("msg_per_sec number");
    println!("go     {}: {:.0} msg/s  ({} {})", mode, rate, a.sinew, args.join(" "));
    rate
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[tokio::main]
async fn main() {
    let a = parse();
    let pid = std::process::id();
    match a.mode.as_str() {
        "publish" => {
            publish(&a.addr, &format!("rsbench-pub-{}", pid), a.window, a.duration, a.size).await;
        }
        "drain" => {
            drain(&a.addr, &format!("rsbench-drain-{}", pid), a.count, a.prefetch, a.size).await;
        }
        _ => {
            let (mut gp, mut rp, mut gd, mut rd) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for r in 0..a.rounds {
                gp.push(go_bench(&a, "publish"));
                rp.push(publish(&a.addr, &format!("rsbench-pub-{}-{}", pid, r), a.window, a.duration, a.size).await);
                gd.push(go_bench(&a, "drain"));
                rd.push(drain(&a.addr, &format!("rsbench-drain-{}-{}", pid, r), a.count, a.prefetch, a.size).await);
            }
            for (k, v) in [("go publish", &gp), ("rust publish", &rp), ("go drain", &gd), ("rust drain", &rd)] {
                let xs: Vec<String> = v.iter().map(|x| format!("{:.0}", x)).collect();
                println!("{:13} {}  median {:.0} msg/s", k, xs.join(" / "), median(v));
            }
            println!("ratio publish rust/go {:.2} (goal >= 0.8)", median(&rp) / median(&gp));
            println!("ratio drain   rust/go {:.2} (goal >= 0.8)", median(&rd) / median(&gd));
        }
    }
}
