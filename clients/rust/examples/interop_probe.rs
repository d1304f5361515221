//! A probe for the cross-library interop tests of the Python library
//! (clients/python/tests/test_interop.py): one lock operation through this crate, its outcome
//! on stdout, one line each.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p redis-lock-client --example interop_probe -- try KEY
//! #   "busy" when another owner holds KEY, else "acquired <token>" (then released)
//! REDIS_URL=... cargo run -p redis-lock-client --example interop_probe -- hold KEY MS
//! #   waits for KEY, prints "held <token>", holds it MS milliseconds, releases, prints "released"
//! ```

use std::io::Write;
use std::time::Duration;

use redis_lock_client::{LockClient, LockError};

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let args: Vec<String> = std::env::args().skip(1).collect();
    let client = LockClient::open(&url).await?;
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["try", key] => match client.lock(*key).try_acquire().await? {
            None => println!("busy"),
            Some(mut guard) => {
                println!("acquired {}", guard.token());
                guard.release().await?;
            }
        },
        ["hold", key, ms] => {
            let ms: u64 = ms.parse().unwrap_or(1000);
            let mut guard = client
                .lock(*key)
                .wait_timeout(Duration::from_secs(10))
                .acquire()
                .await?;
            println!("held {}", guard.token());
            let _ = std::io::stdout().flush();
            tokio::time::sleep(Duration::from_millis(ms)).await;
            guard.release().await?;
            println!("released");
        }
        _ => eprintln!("usage: interop_probe try KEY | hold KEY MS"),
    }
    Ok(())
}
