//! Small helpers and constants every layer of the client uses.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// Whole milliseconds, at least 1 (the server takes leases and timeouts in ms).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

pub(crate) fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only whole values are stored under these locks: a poisoned one is used as it is.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Through Sentinel, a command whose master failed (an acquire, the release of a grant a
/// failover cut) is sent again after this pause, doubled each time up to
/// [`FAILOVER_PAUSE_MAX`], until the client's failover timeout passes.
pub(crate) const FAILOVER_PAUSE: Duration = Duration::from_millis(50);
/// The cap is how late a retry can come after the Sentinels name the new master: at 1 s the
/// failover test saw grants up to 1 s (2.1 s for a ticketed wait, whose retries paused 1 s each)
/// after the switch; 4 attempts a second while no master answers cost next to nothing.
pub(crate) const FAILOVER_PAUSE_MAX: Duration = Duration::from_millis(250);
