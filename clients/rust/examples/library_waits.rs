//! One run of `make bench-waits` for the Rust library: waits with tickets (the default) or blocked
//! in the server, on a server `scripts/library-waits.py` started (it interleaves the runs of both
//! libraries and prints the tables). One line out: `rate <grants per second>` or
//! `memory <bytes per waiter>`.
//!
//! ```sh
//! cargo run --release -p redis-lock-client --example library_waits -- \
//!     PORT tickets|blocked loop|queued WAITERS KEYS SECS
//! ```
//!
//! - `loop`: WAITERS tasks, each looping on its key (`i % KEYS`): acquire (waiting up to 60 s),
//!   release, for SECS seconds; grants per second.
//! - `queued`: KEYS locks held, WAITERS tasks (task `i` on key `i % KEYS`) each acquiring once
//!   then releasing, queued behind them: the growth of the server's `used_memory` per waiter,
//!   connections included, read once it holds still; then the holds released, and WAITERS over
//!   the time until the last waiter released.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_lock_client::LockClient;

type R<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

struct Args {
    url: String,
    tickets: bool,
    mode: String,
    waiters: usize,
    keys: usize,
    secs: f64,
}

fn args() -> Result<Args, String> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let [port, kind, mode, waiters, keys, secs] = a.as_slice() else {
        return Err(
            "usage: library_waits PORT tickets|blocked loop|queued WAITERS KEYS SECS".into(),
        );
    };
    let tickets = match kind.as_str() {
        "tickets" => true,
        "blocked" => false,
        other => return Err(format!("tickets or blocked, not {other}")),
    };
    let number = |s: &str| s.parse::<f64>().map_err(|e| format!("{s}: {e}"));
    Ok(Args {
        url: format!("redis://127.0.0.1:{port}/"),
        tickets,
        mode: mode.clone(),
        waiters: number(waiters)? as usize,
        keys: (number(keys)? as usize).max(1),
        secs: number(secs)?,
    })
}

async fn new_client(a: &Args) -> R<LockClient> {
    Ok(LockClient::builder(redis::Client::open(a.url.as_str())?)
        .wait_with_tickets(a.tickets)
        .build()
        .await?)
}

async fn looping(a: &Args) -> R<f64> {
    let client = new_client(a).await?;
    let grants = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + Duration::from_secs_f64(a.secs);
    let began = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..a.waiters {
        let lock = client
            .lock(format!("waits:{}", i % a.keys))
            .wait_timeout(Duration::from_secs(60));
        let grants = grants.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < stop {
                let mut guard = lock.acquire().await?;
                grants.fetch_add(1, Ordering::Relaxed);
                guard.release().await?;
            }
            R::<()>::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(grants.load(Ordering::Relaxed) as f64 / began.elapsed().as_secs_f64())
}

async fn info_int(con: &mut redis::aio::MultiplexedConnection, field: &str) -> R<i64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(con).await?;
    info.lines()
        .find_map(|l| l.strip_prefix(field).and_then(|v| v.strip_prefix(':')))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("no {field} in INFO").into())
}

/// `used_memory` once it holds still.
async fn used_memory(con: &mut redis::aio::MultiplexedConnection) -> R<i64> {
    let mut last = -1;
    for _ in 0..50 {
        let now = info_int(con, "used_memory").await?;
        if now == last {
            return Ok(now);
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(last)
}

async fn queued(con: &mut redis::aio::MultiplexedConnection, keys: usize) -> R<i64> {
    let mut total = 0;
    for k in 0..keys {
        let reply: Vec<redis::Value> = redis::cmd("LOCK.INFO")
            .arg(format!("mem:{k}"))
            .query_async(con)
            .await?;
        let mut it = reply.iter();
        while let (Some(name), Some(value)) = (it.next(), it.next()) {
            let is_waiters = matches!(name, redis::Value::BulkString(b) if b.as_slice() == b"waiters")
                || matches!(name, redis::Value::SimpleString(s) if s == "waiters");
            if let (true, redis::Value::Int(n)) = (is_waiters, value) {
                total += n;
            }
        }
    }
    Ok(total)
}

async fn queued_then_drained(a: &Args) -> R<(f64, f64)> {
    let client = new_client(a).await?;
    let holder = new_client(a).await?;
    // The readings' own connection, with timeouts a loaded machine does not reach (redis's
    // default response timeout is half a second).
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(30)))
        .set_response_timeout(Some(Duration::from_secs(30)));
    let mut con = redis::Client::open(a.url.as_str())?
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    let mut held = Vec::new();
    for k in 0..a.keys {
        held.push(
            holder
                .lock(format!("mem:{k}"))
                .lease(Duration::from_secs(120))
                .acquire()
                .await?,
        );
    }
    let before = used_memory(&mut con).await?;
    let mut tasks = Vec::new();
    for i in 0..a.waiters {
        let lock = client
            .lock(format!("mem:{}", i % a.keys))
            .wait_timeout(Duration::from_secs(120));
        tasks.push(tokio::spawn(async move {
            let mut guard = lock.acquire().await?;
            guard.release().await?;
            R::<()>::Ok(())
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while queued(&mut con, a.keys).await? < a.waiters as i64 {
        if Instant::now() > deadline {
            return Err(format!("not all {} waiters queued in 60 s", a.waiters).into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = used_memory(&mut con).await?;
    let began = Instant::now();
    for mut guard in held {
        guard.release().await?;
    }
    for task in tasks {
        task.await??;
    }
    let rate = a.waiters as f64 / began.elapsed().as_secs_f64();
    Ok(((after - before) as f64 / a.waiters as f64, rate))
}

#[tokio::main]
async fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let out = match a.mode.as_str() {
        "loop" => looping(&a).await.map(|r| format!("rate {r}")),
        "queued" => queued_then_drained(&a)
            .await
            .map(|(m, r)| format!("memory {m} rate {r}")),
        other => Err(format!("no mode {other}").into()),
    };
    match out {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("library_waits: {e}");
            std::process::exit(1);
        }
    }
}
