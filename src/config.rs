//! Module options, registered through Redis's module config API: settable as `loadmodule`
//! arguments, read and changed with `CONFIG GET/SET lock.<name>`, written by `CONFIG REWRITE`.

use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, Ordering};
use std::sync::Mutex;

use redis_module::configuration::{ConfigurationContext, ConfigurationValue};
use redis_module::{raw, RedisError, RedisString};

use crate::ffi::OwnedString;

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
pub static UNLOCK_CHANNEL_PREFIX: StringOption = StringOption::new();
pub const DEFAULT_UNLOCK_CHANNEL_PREFIX: &str = "redisson_lock__channel";

/// `lock.unlock-message`: the message published when a lock becomes free (Redisson's is `0`).
pub static UNLOCK_MESSAGE: StringOption = StringOption::new();
pub const DEFAULT_UNLOCK_MESSAGE: &str = "0";

/// `lock.lost-channel-prefix`: a holder that loses its hold by anything but its own release is
/// told on `<prefix>:{<key>}` (the unlock channel's naming); empty disables these messages.
pub static LOST_CHANNEL_PREFIX: StringOption = StringOption::new();
pub const DEFAULT_LOST_CHANNEL_PREFIX: &str = "lock.lost";

/// `lock.leader-channel-prefix`: observers of an election key hear each new leader and each
/// proclamation on `<prefix>:{<key>}`; empty disables these messages.
pub static LEADER_CHANNEL_PREFIX: StringOption = StringOption::new();
pub const DEFAULT_LEADER_CHANNEL_PREFIX: &str = "lock.leader";

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

/// A string option. Redis 7.0 copies the string a getter returns and never frees it, so the
/// option keeps one Redis string of its value and hands out that same string on every
/// `CONFIG GET` (a new string per call leaked its size each time). The text is kept beside it
/// for the module's own use.
pub struct StringOption {
    text: Mutex<String>,
    /// Owned by this option; replaced (and the old one freed) on set, freed at unload.
    shown: AtomicPtr<raw::RedisModuleString>,
}

impl StringOption {
    pub const fn new() -> Self {
        StringOption {
            text: Mutex::new(String::new()),
            shown: AtomicPtr::new(ptr::null_mut()),
        }
    }

    pub fn text(&self) -> String {
        self.with_text(str::to_string)
    }

    /// Runs `f` on the value, without copying it (the hot path: every release publishes).
    pub fn with_text<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        match self.text.lock() {
            Ok(t) => f(&t),
            Err(poisoned) => f(&poisoned.into_inner()),
        }
    }

    /// The value as the Redis string the option keeps (created once; replaced only by a
    /// `CONFIG SET`, which cannot run while a command or timer of the module runs).
    pub fn as_redis_string(&self) -> crate::ffi::RawString {
        let shown = self.shown.load(Ordering::Relaxed);
        if !shown.is_null() {
            return shown;
        }
        self.replace_shown(Some(OwnedString::new(self.text().as_bytes())));
        self.shown.load(Ordering::Relaxed)
    }

    fn replace_shown(&self, new: Option<OwnedString>) {
        let new = new.map_or(ptr::null_mut(), OwnedString::into_raw);
        // Dropping the adopted old string frees it.
        drop(OwnedString::adopt(self.shown.swap(new, Ordering::Relaxed)));
    }
}

impl ConfigurationValue<RedisString> for StringOption {
    fn get(&self, _ctx: &ConfigurationContext) -> RedisString {
        // Not retained: Redis copies the value and the option keeps its one reference.
        RedisString::from_redis_module_string(ptr::null_mut(), self.as_redis_string())
    }

    fn set(&self, _ctx: &ConfigurationContext, value: RedisString) -> Result<(), RedisError> {
        let text = value.try_as_str()?.to_string();
        self.replace_shown(Some(OwnedString::new(text.as_bytes())));
        match self.text.lock() {
            Ok(mut t) => *t = text,
            Err(poisoned) => *poisoned.into_inner() = text,
        }
        Ok(())
    }
}

/// Frees the strings the options keep for Redis (module unload).
pub fn release_strings() {
    UNLOCK_CHANNEL_PREFIX.replace_shown(None);
    UNLOCK_MESSAGE.replace_shown(None);
    LOST_CHANNEL_PREFIX.replace_shown(None);
    LEADER_CHANNEL_PREFIX.replace_shown(None);
}

/// The prefix and message, copied out (only on a full release).
pub fn unlock_publication() -> (String, String) {
    (UNLOCK_CHANNEL_PREFIX.text(), UNLOCK_MESSAGE.text())
}

pub fn describe() -> String {
    let (prefix, message) = unlock_publication();
    format!(
        "max-lease-ms={} max-waiters-per-key={} unlock-channel-prefix='{}' unlock-message='{}' lost-channel-prefix='{}' leader-channel-prefix='{}' keyspace-events={}",
        max_lease_ms(),
        max_waiters_per_key(),
        prefix,
        message,
        LOST_CHANNEL_PREFIX.text(),
        LEADER_CHANNEL_PREFIX.text(),
        if keyspace_events() { "yes" } else { "no" }
    )
}
