//! Measurements for the closing note (issue #20), run by hand:
//! `cargo test --release -p redis-lock-client --test measure -- --ignored --nocapture --test-threads 1`
//! (set LOCK_SERVER/LOCK_CLI/LOCK_MODULE as `make test-valkey9` does for the DEL figure). The
//! assertions only bound the figures generously, to catch hangs and gross regressions.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use redis::Value;
use redis_lock_client::{LockClient, LostReason};
use support::{calls, ephemeral_connection, raw, Server};

const TRIALS: usize = 100;

async fn signal_client(server: &Server) -> LockClient {
    LockClient::builder(redis::Client::open(server.url()).unwrap())
        .listen_for_lost_signal()
        .build()
        .await
        .unwrap()
}

fn percentiles(name: &str, mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    let (p50, p99) = (at(0.50), at(0.99));
    println!(
        "{name}: n={} p50={:.3} ms p99={:.3} ms max={:.3} ms",
        samples.len(),
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3,
        samples[samples.len() - 1].as_secs_f64() * 1e3
    );
    (p50, p99)
}

/// From sending `end` to the guard's `lost()` resolving with `want`, `TRIALS` times.
async fn signal_latency(name: &str, end: &[&str], want: &[LostReason], ephemeral: bool) {
    let server = Server::start();
    let client = signal_client(&server).await;
    let mut con = raw(&server).await;
    let mut samples = Vec::new();
    for _ in 0..TRIALS {
        let lock = client.lock("k");
        let lock = if ephemeral { lock.ephemeral() } else { lock };
        let guard = lock.acquire().await.unwrap();
        // The subscription (one SUBSCRIBE per key held) is confirmed in well under this.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let lost = guard.lost();
        let mut cmd = redis::cmd(end[0]);
        for arg in &end[1..] {
            if *arg == "$ID" {
                cmd.arg(ephemeral_connection(&mut con, "k").await);
            } else {
                cmd.arg(*arg);
            }
        }
        let started = Instant::now();
        let _: Value = cmd.query_async(&mut con).await.unwrap();
        let reason = tokio::time::timeout(Duration::from_secs(2), lost)
            .await
            .expect("reported");
        samples.push(started.elapsed());
        assert!(want.contains(&reason), "{reason:?}");
    }
    let (_, p99) = percentiles(name, samples);
    assert!(p99 < Duration::from_millis(500));
}

#[ignore]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_signal_latency_forcerelease() {
    signal_latency(
        "FORCERELEASE",
        &["LOCK.FORCERELEASE", "k"],
        &[LostReason::ForceReleased],
        false,
    )
    .await;
}

#[ignore]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_signal_latency_del() {
    assert!(
        support::reports_key_events(),
        "DEL is signalled by Redis >= 7.2 and Valkey only: run with LOCK_SERVER=valkey 9 or redis 8"
    );
    signal_latency("DEL", &["DEL", "k"], &[LostReason::Deleted], false).await;
}

#[ignore]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_signal_latency_flushall() {
    signal_latency("FLUSHALL", &["FLUSHALL"], &[LostReason::Flushed], false).await;
}

#[ignore]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_signal_latency_ephemeral_peer_close() {
    // The server closes the hold's connection (CLIENT KILL): whichever comes first, the guard's
    // own connection closing (ConnectionClosed) or the server's `disconnected` message.
    signal_latency(
        "EPHEMERAL peer close",
        &["CLIENT", "KILL", "ID", "$ID"],
        &[LostReason::ConnectionClosed, LostReason::Disconnected],
        true,
    )
    .await;
}

#[ignore]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_signal_latency_lease_end_with_waiters() {
    // A shared hold whose lease ends while a writer waits: the module sees it end and sends
    // `expired`. A fixed lease's guard reports LeaseEnded from its own clock a tenth early, so
    // the signal is timed from the server's lease end: a raw subscriber's arrival minus the
    // lease end (acquire's send + lease, as the server counts).
    let server = Server::start();
    let mut con = raw(&server).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let config = redis::AsyncConnectionConfig::new().set_push_sender(tx);
    let mut sub = redis::Client::open(format!("{}?protocol=resp3", server.url()))
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    sub.subscribe("lock.lost:{k}").await.unwrap();
    let lease = Duration::from_millis(50);
    let mut samples = Vec::new();
    for i in 0..TRIALS {
        let _: Value = redis::cmd("LOCK.ACQUIRE")
            .arg("k")
            .arg("long")
            .arg(60_000)
            .arg("SHARED")
            .query_async(&mut con)
            .await
            .unwrap();
        let owner = format!("short-{i}");
        let sent = Instant::now();
        let _: Value = redis::cmd("LOCK.ACQUIRE")
            .arg("k")
            .arg(&owner)
            .arg(lease.as_millis() as u64)
            .arg("SHARED")
            .query_async(&mut con)
            .await
            .unwrap();
        let mut waiter = raw(&server).await;
        let writer = tokio::spawn(async move {
            let _: Value = redis::cmd("LOCK.ACQUIRE")
                .arg("k")
                .arg("writer")
                .arg(60_000)
                .arg("WAIT")
                .arg(300)
                .query_async(&mut waiter)
                .await
                .unwrap();
        });
        loop {
            let push = tokio::time::timeout(Duration::from_secs(2), rx.recv())
                .await
                .expect("expired message")
                .unwrap();
            if let [_, Value::BulkString(payload), ..] = push.data.as_slice() {
                if payload.starts_with(b"expired ") && payload.ends_with(owner.as_bytes()) {
                    samples.push(sent.elapsed().saturating_sub(lease));
                    break;
                }
            }
        }
        writer.await.unwrap();
        let _: Value = redis::cmd("DEL")
            .arg("k")
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let (_, p99) = percentiles("lease end with waiters (server expired message)", samples);
    assert!(p99 < Duration::from_millis(500));
}

#[ignore]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_keeps_a_one_second_lease_for_a_minute_on_a_loaded_runtime() {
    let server = Server::start();
    let client = LockClient::open(&server.url()).await.unwrap();
    let mut con = raw(&server).await;
    // Busy tasks: eight CPU loops on the two workers, each yielding only every ~10 ms.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let until = Instant::now() + Duration::from_millis(10);
                    while Instant::now() < until {
                        std::hint::spin_loop();
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    let before = calls(&mut con, "lock.renew").await;
    let mut guard = client
        .lock("k")
        .lease(Duration::from_secs(1))
        .acquire()
        .await
        .unwrap();
    let mut min_ttl = i64::MAX;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            guard.lost_reason(),
            None,
            "lost after {:?}",
            started.elapsed()
        );
        let ttl: i64 = redis::cmd("PTTL")
            .arg("k")
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(ttl > 0, "the key expired");
        min_ttl = min_ttl.min(ttl);
    }
    guard.release().await.unwrap();
    let renewals = calls(&mut con, "lock.renew").await - before;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = calls(&mut con, "lock.renew").await - before;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for b in busy {
        b.await.unwrap();
    }
    println!(
        "watchdog: 60 s held with a 1 s lease under 8 busy tasks on 2 workers; {renewals} renewals, \
         lowest PTTL seen {min_ttl} ms; renewals in the 3 s after release: {}",
        after - renewals
    );
    assert_eq!(after, renewals, "no renewal after the release");
    assert!(renewals >= 150);
}

#[ignore]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn library_acquire_release_overhead_over_raw_commands() {
    // Sequential acquire+release pairs on one connection each way, 20,000 of each, alternating
    // rounds so that drift hits both alike. The reported figure is `make bench`'s scenario 9
    // (three runtimes, client CPU, block-wise medians); this is the quick check.
    let server = Server::start();
    let client = LockClient::open(&server.url()).await.unwrap();
    let mut con = raw(&server).await;
    let lock = client.lock("lib").lease(Duration::from_secs(30));
    let (mut lib, mut raw_time) = (Duration::ZERO, Duration::ZERO);
    const ROUNDS: usize = 10;
    const PER_ROUND: usize = 2_000;
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..PER_ROUND {
            let mut g = lock.try_acquire().await.unwrap().unwrap();
            g.release().await.unwrap();
        }
        lib += t.elapsed();
        let t = Instant::now();
        for _ in 0..PER_ROUND {
            let _: Value = redis::cmd("LOCK.ACQUIRE")
                .arg("raw")
                .arg("owner")
                .arg(30_000)
                .arg("ONCE")
                .query_async(&mut con)
                .await
                .unwrap();
            let _: Value = redis::cmd("LOCK.RELEASE")
                .arg("raw")
                .arg("owner")
                .query_async(&mut con)
                .await
                .unwrap();
        }
        raw_time += t.elapsed();
    }
    let n = (ROUNDS * PER_ROUND) as f64;
    let (l, r) = (
        lib.as_secs_f64() / n * 1e6,
        raw_time.as_secs_f64() / n * 1e6,
    );
    println!(
        "acquire+release: library {l:.1} us, raw LOCK.ACQUIRE/RELEASE {r:.1} us, overhead {:+.1} %",
        (l / r - 1.0) * 100.0
    );
    assert!(l < r * 3.0);
}

/// The child of `a_killed_holders_waiter_is_granted_at_once`: holds an EPHEMERAL lock through the
/// library, says so on stdout, and waits to be killed.
#[ignore]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_holder() {
    let Ok(url) = std::env::var("LOCK_CHILD_URL") else {
        panic!("run by a_killed_holders_waiter_is_granted_at_once only");
    };
    let client = LockClient::open(&url).await.unwrap();
    let _guard = client.lock("k").ephemeral().acquire().await.unwrap();
    println!("HELD");
    tokio::time::sleep(Duration::from_secs(60)).await;
}

#[ignore]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_waiter_is_granted_at_once() {
    use tokio::io::AsyncBufReadExt;
    let server = Server::start();
    let client = LockClient::open(&server.url()).await.unwrap();
    let mut samples = Vec::new();
    for _ in 0..20 {
        let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_holder", "--ignored", "--nocapture"])
            .env("LOCK_CHILD_URL", server.url())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        while let Some(line) = lines.next_line().await.unwrap() {
            if line.contains("HELD") {
                break;
            }
        }
        let waiter = client.lock("k").wait_timeout(Duration::from_secs(10));
        let granted = tokio::spawn(async move {
            let g = waiter.acquire().await;
            (Instant::now(), g)
        });
        tokio::time::sleep(Duration::from_millis(50)).await; // the waiter is queued
        let killed = Instant::now();
        child.start_kill().unwrap(); // SIGKILL
        let (at, guard) = granted.await.unwrap();
        guard.unwrap();
        samples.push(at.saturating_duration_since(killed));
        let _ = child.wait().await;
    }
    let (_, p99) = percentiles(
        "SIGKILLed EPHEMERAL holder -> library waiter granted",
        samples,
    );
    assert!(p99 < Duration::from_secs(1));
}
