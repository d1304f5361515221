//! The five scenarios of issue 6, three for the lock family of docs/lock-family.md (read-write
//! lock, semaphore, holder crashes), and one for the Rust client library. Each one starts its
//! own server, measures every approach on it, and returns its results with a Markdown section
//! (and the targets it judges).

pub mod contention;
pub mod crash;
pub mod deadlines;
pub mod family;
pub mod guard;
pub mod library;
pub mod memory;
pub mod multikey;
pub mod scaling;
pub mod throughput;
pub mod tickets;

use std::time::{Duration, Instant};

/// The critical section of the contention scenarios: busy work for `duration`, holding the CPU
/// as real work would (a sleep would hand it back).
fn spin(duration: Duration) {
    let until = Instant::now() + duration;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}
