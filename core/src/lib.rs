//! The lock itself, with no Redis in it.
//!
//! Everything here is plain data in, plain data out: the module crate reads what is stored at a
//! key, hands it to these functions together with the request and the server's clock, and then
//! carries out the returned decision. Keeping the rules here lets them be tested table-driven,
//! with an injected clock, without a server and without the Redis allocator.

#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic
    )
)]

pub mod args;
pub mod binding;
pub mod channel;
pub mod cluster;
pub mod command;
pub mod deadlines;
pub mod election;
pub mod error;
pub mod fence;
pub mod hold;
pub mod key;
pub mod kind;
pub mod layout;
pub mod memory;
pub mod queue;
pub mod scheduler;
pub mod signal;
pub mod slot;
pub mod ticket;
pub mod token;
pub mod unload;

pub use error::LockError;

/// Milliseconds since the Unix epoch, as the server's clock reports them.
pub type UnixMs = u64;
