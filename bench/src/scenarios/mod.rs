//! The five scenarios of issue 6, and three for the lock family of docs/lock-family.md
//! (read-write lock, semaphore, holder crashes). Each one starts its own server, measures every
//! approach on it, and returns its results with a Markdown section (and the targets it judges).

pub mod contention;
pub mod crash;
pub mod deadlines;
pub mod family;
pub mod memory;
pub mod scaling;
pub mod throughput;
