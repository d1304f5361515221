//! Three workers take turns on one lock and increment a counter kept in Redis, each increment
//! through the guard's fence (`guard.fenced(...)`, the server's `LOCK.GUARD`): it lands only
//! while the worker's hold is the server's, checked in the same step as the write. Then a holder
//! whose hold ended without its knowing (force-released while it was not listening to the
//! lost-hold signal, as a process paused past its lease would be) tries to write: the server
//! refuses, and nothing lands.
//!
//! Run against a server with the module loaded:
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p redis-lock-client --example critical_section
//! ```

use std::time::Duration;

use redis_lock_client::{LockClient, LockError};

/// The lock and the data it protects share a hash tag (one slot in a cluster).
const LOCK: &str = "{example}:lock";
const COUNTER: &str = "{example}:counter";

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let client = LockClient::open(&url).await?;
    let mut raw = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let _: () = redis::cmd("DEL").arg(COUNTER).query_async(&mut raw).await?;

    let mut workers = Vec::new();
    for _ in 0..3 {
        let lock = client
            .lock(LOCK)
            .lease(Duration::from_secs(5))
            .wait_timeout(Duration::from_secs(10));
        workers.push(tokio::spawn(async move {
            for _ in 0..10 {
                let mut guard = lock.acquire().await?;
                // INCR runs only while this hold is the server's (else LockError::Fenced).
                let _: i64 = guard.fenced(redis::cmd("INCR").arg(COUNTER)).await?;
                guard.release().await?;
            }
            Ok::<(), LockError>(())
        }));
    }
    for worker in workers {
        match worker.await {
            Ok(result) => result?,
            Err(e) => eprintln!("worker failed: {e}"),
        }
    }
    let value: i64 = redis::cmd("GET").arg(COUNTER).query_async(&mut raw).await?;
    println!("counter = {value}");

    // A holder that does not hear the lost-hold signal, whose hold an operator ends.
    let deaf = LockClient::builder(redis::Client::open(url.as_str())?)
        .without_lost_signal()
        .build()
        .await?;
    let stale = deaf.lock(LOCK).acquire().await?;
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg(LOCK)
        .query_async(&mut raw)
        .await?;
    let mut newer = client.lock(LOCK).acquire().await?;
    let _: i64 = newer.fenced(redis::cmd("INCR").arg(COUNTER)).await?;
    match stale.fenced::<i64>(redis::cmd("INCR").arg(COUNTER)).await {
        Err(e @ LockError::Fenced { .. }) => {
            println!("the server refused the stale token: {e}");
            println!("the stale guard reports: {:?}", stale.lost_reason());
        }
        other => println!("the stale write was not refused (unexpected): {other:?}"),
    }
    newer.release().await?;
    let value: i64 = redis::cmd("GET").arg(COUNTER).query_async(&mut raw).await?;
    println!("counter = {value} (the stale write did not land)");
    Ok(())
}
