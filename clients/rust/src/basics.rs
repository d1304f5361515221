//! Two small helpers every layer of the client uses.

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
