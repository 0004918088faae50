//! The fault run: 5,000 numbered messages through connection cuts every
//! 0.25 s, a SIGTERM restart (drain) and a kill -9 restart of the broker.
//! Nothing may be lost, nothing acked may come back, nothing may be stored
//! twice, and the application sees no error.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use sinew::{ConnectOptions, Status, SubscribeOptions};

const N: usize = 5000;
const RUN_LIMIT: Duration = Duration::from_secs(240);
const PACE: Duration = Duration::from_micros(1200);

/// The client's status events, counted as they come.
#[derive(Default)]
struct Events {
    resumed: usize,
    fresh: usize,
    going_away: usize,
    up: bool,
}

impl Events {
    fn note(&mut self, s: Status) {
        match s {
            Status::Connected { resumed } => {
                self.up = true;
                if resumed {
                    self.resumed += 1
                } else {
                    self.fresh += 1
                }
            }
            Status::Disconnected(_) => self.up = false,
            Status::GoingAway => self.going_away += 1,
            _ => {}
        }
    }

    fn take(&mut self, rx: &mut tokio::sync::mpsc::Receiver<Status>) {
        while let Ok(s) = rx.try_recv() {
            self.note(s);
        }
    }

    async fn connected(&mut self, rx: &mut tokio::sync::mpsc::Receiver<Status>) {
        self.take(rx);
        while !self.up {
            match rx.recv().await {
                Some(s) => self.note(s),
                None => return,
            }
        }
    }
}

#[derive(Default)]
struct Tally {
    delivered: HashMap<usize, HashSet<(u32, u64)>>, // number -> the (partition, offset) it came from
    acked: HashSet<usize>,
    redelivered_after_ack: usize,
    deliveries: usize,
    app_errors: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_run_5000_messages_through_cuts_a_drain_and_a_kill() {
    let mut broker = Broker::new(&[]);
    broker.start().await;
    let proxy = FaultProxy::start(&broker.addr).await;
    let c = sinew::connect_with(ConnectOptions::new(proxy.addr.clone()).client_name("fault-run")).await.unwrap();
    let mut status = c.status();
    let mut sub = c.subscribe_with("fault", SubscribeOptions::new().prefetch(64)).await.unwrap();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let started = Instant::now();

    // Publisher: 64 publishes in flight.
    let pc = c.clone();
    let ptally = tally.clone();
    let publisher = tokio::spawn(async move {
        let mut confirms = futures::stream::iter(0..N)
            .map(|i| {
                let pc = pc.clone();
                async move {
                    // Paced over about 6 s, so the cuts and both restarts
                    // fall in the middle of the run.
                    tokio::time::sleep_until(tokio::time::Instant::from_std(started + PACE * i as u32)).await;
                    (i, pc.publish("fault", format!("{}", i)).await)
                }
            })
            .buffer_unordered(64);
        let mut dup = 0;
        while let Some((i, r)) = confirms.next().await {
            match r {
                Ok(conf) => dup += conf.duplicate as usize,
                Err(e) => ptally.lock().unwrap().app_errors.push(format!("publish {}: {}", i, e)),
            }
        }
        dup
    });

    // Consumer: every delivery is settled at once; the settle's outcome is
    // awaited in its own task.
    let ctally = tally.clone();
    let consumer = tokio::spawn(async move {
        while let Some(m) = sub.next().await {
            let m = match m {
                Ok(m) => m,
                Err(e) => {
                    ctally.lock().unwrap().app_errors.push(format!("stream: {}", e));
                    break;
                }
            };
            let n: usize = m.text().unwrap().parse().unwrap();
            {
                let mut t = ctally.lock().unwrap();
                t.deliveries += 1;
                if t.acked.contains(&n) {
                    t.redelivered_after_ack += 1;
                }
                t.delivered.entry(n).or_default().insert((m.partition, m.offset));
            }
            let t2 = ctally.clone();
            let settle = m.complete();
            tokio::spawn(async move {
                match settle.await {
                    Ok(()) => {
                        t2.lock().unwrap().acked.insert(n);
                    }
                    Err(e) => t2.lock().unwrap().app_errors.push(format!("settle {}: {}", n, e)),
                }
            });
        }
        sub
    });

    // Chaos: cuts every 0.25 s; a SIGTERM restart after 1.5 s, a kill -9
    // restart after 3.5 s; cuts go on until everything is acked.
    let mut cuts = 0;
    let mut drained = false;
    let mut killed = false;
    let mut events = Events { up: true, ..Default::default() }; // connected before status()
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        events.take(&mut status); // read every turn: the receiver holds 64
        let (acked, errors) = {
            let t = tally.lock().unwrap();
            (t.acked.len(), t.app_errors.len())
        };
        if acked >= N || errors > 0 || started.elapsed() > RUN_LIMIT {
            break;
        }
        if !drained && started.elapsed() > Duration::from_millis(1500) {
            // SIGTERM with the client connected: it gets GOING_AWAY, lets its
            // work in flight finish, and resumes on the restarted broker.
            drained = true;
            // Wait until the client is connected again after the last cut.
            within(30, events.connected(&mut status)).await;
            within(60, broker.stop()).await;
            broker.start().await;
        } else if drained && !killed && started.elapsed() > Duration::from_millis(3500) {
            killed = true;
            broker.kill().await;
            broker.start().await;
        } else {
            proxy.cut_all();
            cuts += 1;
        }
    }
    // A while longer: an acked message that came back now is counted too.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let dup = within(60, publisher).await.unwrap();
    consumer.abort();
    let elapsed = started.elapsed();
    events.take(&mut status);
    let Events { resumed, fresh, going_away, .. } = events;
    let t = std::mem::take(&mut *tally.lock().unwrap());
    let lost = (0..N).filter(|n| !t.acked.contains(n)).count();
    let stored_twice = t.delivered.values().filter(|s| s.len() > 1).count();
    eprintln!(
        "fault run: {} messages, {:.1} s, {} cuts, drain restart {}, kill -9 restart {}, {} going away, {} resumes, {} fresh sessions, \
         {} deliveries, {} duplicate confirms; lost {}, redelivered after ack {}, stored twice {}, application errors {}",
        N,
        elapsed.as_secs_f64(),
        cuts,
        drained,
        killed,
        going_away,
        resumed,
        fresh,
        t.deliveries,
        dup,
        lost,
        t.redelivered_after_ack,
        stored_twice,
        t.app_errors.len()
    );
    assert!(t.app_errors.is_empty(), "application errors: {:?}", &t.app_errors[..t.app_errors.len().min(10)]);
    assert!(drained && killed, "the run ended before both restarts");
    assert!(going_away >= 1, "the drain restart sent no GOING_AWAY to the client");
    // Every reconnect resumed the session (a cut that finds the client
    // already reconnecting makes no reconnect of its own).
    assert_eq!(fresh, 0, "sessions not resumed");
    assert!(resumed >= 8, "{} resumes for {} cuts and 2 restarts", resumed, cuts);
    assert_eq!(lost, 0, "lost messages");
    assert_eq!(t.redelivered_after_ack, 0, "acked messages delivered again");
    assert_eq!(stored_twice, 0, "messages stored twice");
    assert!(cuts >= 8, "only {} cuts", cuts);
    c.close().await.unwrap();
}
