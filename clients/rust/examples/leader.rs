//! A candidate of an election, as a process of its own: it campaigns, leads, and on each line of
//! its standard input acts as a leader does (the election tests kill and pause it).
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p redis-lock-client --example leader -- KEY LEASE_MS
//! #   prints "leading <epoch>" once elected (EPHEMERAL), then for each line of stdin:
//! #   "proclaim V" -> "proclaimed <true|false> lost <reason|none>"
//! #   "write"      -> "write <1|0>": a fenced write of the key "fence" (1: accepted, 0: refused,
//! #                   the resource has seen a higher epoch)
//! #   end of input -> resigns, prints "resigned"
//! ```

use std::io::{BufRead, Write};
use std::time::Duration;

use redis_lock_client::{LockClient, LockError};

/// A resource that accepts a write only with an epoch at least the highest it has seen.
const FENCED_WRITE: &str = r#"
local seen = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) < seen then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"#;

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into());
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [key, lease_ms] = args.as_slice() else {
        eprintln!("usage: leader KEY LEASE_MS");
        std::process::exit(2);
    };
    let lease = Duration::from_millis(lease_ms.parse().unwrap_or(30_000));
    let client = LockClient::open(&url).await?;
    let mut raw = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let mut leadership = client.election(key).lease(lease).campaign().await?;
    say(&format!("leading {}", leadership.epoch()));
    let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    while let Some(line) = lines.recv().await {
        if let Some(value) = line.strip_prefix("proclaim ") {
            let proclaimed = leadership.proclaim(value).await?;
            let lost = leadership
                .lost_reason()
                .map_or("none".to_string(), |r| format!("{r:?}"));
            say(&format!("proclaimed {proclaimed} lost {lost}"));
        } else if line == "write" {
            let accepted: i64 = redis::cmd("EVAL")
                .arg(FENCED_WRITE)
                .arg(1)
                .arg("fence")
                .arg(leadership.epoch())
                .query_async(&mut raw)
                .await?;
            say(&format!("write {accepted}"));
        }
    }
    let _ = leadership.resign().await;
    say("resigned");
    Ok(())
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
