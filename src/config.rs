//! Module options, registered through Redis's module config API: settable as `loadmodule`
//! arguments, read and changed with `CONFIG GET/SET lock.<name>`, written by `CONFIG REWRITE`.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;

/// `lock.max-lease-ms`: the longest lease a client may ask for (default 30 days).
pub static MAX_LEASE_MS: AtomicI64 = AtomicI64::new(DEFAULT_MAX_LEASE_MS);
pub const DEFAULT_MAX_LEASE_MS: i64 = 30 * 24 * 3600 * 1000;
/// Hard ceiling for `lock.max-lease-ms`: 100 years.
pub const CEILING_MAX_LEASE_MS: i64 = 100 * 365 * 24 * 3600 * 1000;

/// `lock.max-waiters-per-key`: beyond it `LOCK.ACQUIRE ... WAIT` is refused with an error.
pub static MAX_WAITERS_PER_KEY: AtomicI64 = AtomicI64::new(DEFAULT_MAX_WAITERS_PER_KEY);
pub const DEFAULT_MAX_WAITERS_PER_KEY: i64 = 100_000;

/// `lock.unlock-channel-prefix`: the unlock channel is `<prefix>:{<key>}` (Redisson's naming);
/// empty disables publishing.
pub static UNLOCK_CHANNEL_PREFIX: Mutex<String> = Mutex::new(String::new());
pub const DEFAULT_UNLOCK_CHANNEL_PREFIX: &str = "redisson_lock__channel";

/// `lock.unlock-message`: the message published when a lock becomes free (Redisson's is `0`).
pub static UNLOCK_MESSAGE: Mutex<String> = Mutex::new(String::new());
pub const DEFAULT_UNLOCK_MESSAGE: &str = "0";

/// `lock.keyspace-events`: emit `lock.*` keyspace events (delivered when
/// `notify-keyspace-events` enables hash events, `h`).
pub static KEYSPACE_EVENTS: AtomicBool = AtomicBool::new(true);

pub fn max_lease_ms() -> u64 {
    u64::try_from(MAX_LEASE_MS.load(Ordering::Relaxed)).unwrap_or(1)
}

pub fn max_waiters_per_key() -> u64 {
    u64::try_from(MAX_WAITERS_PER_KEY.load(Ordering::Relaxed)).unwrap_or(1)
}

pub fn keyspace_events() -> bool {
    KEYSPACE_EVENTS.load(Ordering::Relaxed)
}

/// The prefix and message, copied out (only on a full release).
pub fn unlock_publication() -> (String, String) {
    let prefix = UNLOCK_CHANNEL_PREFIX
        .lock()
        .map(|p| p.clone())
        .unwrap_or_else(|p| p.into_inner().clone());
    let message = UNLOCK_MESSAGE
        .lock()
        .map(|m| m.clone())
        .unwrap_or_else(|m| m.into_inner().clone());
    (prefix, message)
}

pub fn describe() -> String {
    let (prefix, message) = unlock_publication();
    format!(
        "max-lease-ms={} max-waiters-per-key={} unlock-channel-prefix='{}' unlock-message='{}' keyspace-events={}",
        max_lease_ms(),
        max_waiters_per_key(),
        prefix,
        message,
        if keyspace_events() { "yes" } else { "no" }
    )
}
