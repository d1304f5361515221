//! Three workers take turns on one lock and increment a counter kept by a store that checks
//! fencing tokens; then a stale holder's write is refused.
//!
//! Run against a server with the module loaded:
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p redis-lock-client --example critical_section
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis_lock_client::{LockClient, LockError};

/// A resource that refuses writes carrying a token older than the newest it has seen.
#[derive(Default)]
struct FencedCounter {
    highest_token: u64,
    value: u64,
}

impl FencedCounter {
    fn increment(&mut self, token: u64) -> Result<u64, String> {
        if token < self.highest_token {
            return Err(format!(
                "token {token} is older than {}",
                self.highest_token
            ));
        }
        self.highest_token = token;
        self.value += 1;
        Ok(self.value)
    }
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let client = LockClient::open(&url).await?;
    let store = Arc::new(Mutex::new(FencedCounter::default()));

    let mut workers = Vec::new();
    for _ in 0..3 {
        let lock = client
            .lock("example:counter")
            .lease(Duration::from_secs(5))
            .wait_timeout(Duration::from_secs(10));
        let store = store.clone();
        workers.push(tokio::spawn(async move {
            for _ in 0..10 {
                let mut guard = lock.acquire().await?;
                let token = guard.token();
                tokio::select! {
                    reason = guard.lost() => eprintln!("lost the lock ({reason}); skipping"),
                    _ = tokio::time::sleep(Duration::from_millis(2)) => {
                        let result = store.lock().map(|mut s| s.increment(token));
                        if let Ok(Err(refused)) = result {
                            eprintln!("refused: {refused}");
                        }
                    }
                }
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
    let value = store.lock().map(|s| s.value).unwrap_or_default();
    println!("counter = {value}");

    // A holder whose hold ended (here: released) keeps its old token; a later holder's token is
    // higher, and the store refuses the old one.
    let mut old = client.lock("example:counter").acquire().await?;
    let stale = old.token();
    old.release().await?;
    let mut newer = client.lock("example:counter").acquire().await?;
    let _ = store.lock().map(|mut s| s.increment(newer.token()));
    match store.lock().map(|mut s| s.increment(stale)) {
        Ok(Err(why)) => println!("the store refused the stale token: {why}"),
        _ => println!("the stale token was accepted (unexpected)"),
    }
    newer.release().await?;
    Ok(())
}
