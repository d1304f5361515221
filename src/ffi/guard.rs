//! Every entry point from Redis goes through here. A Rust panic that unwinds into Redis aborts
//! the whole server; these guards turn it into an `ERR internal error` reply (commands) or a
//! logged warning (callbacks), and map `LockError` to its exact reply in one place.

use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use lock_core::LockError;
use redis_module::raw;

use crate::ffi::{reply, Ctx};
use crate::stats::{bump, STATS};

/// Runs a command body. The body replies on success; errors are replied here.
pub fn command(ctx: Ctx, body: impl FnOnce() -> Result<(), LockError>) -> c_int {
    let error = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(_) => Some(LockError::Internal),
    };
    if let Some(e) = error {
        bump(&STATS.errors);
        reply::error(ctx, &e.reply());
    }
    raw::REDISMODULE_OK as c_int
}

/// Runs a callback body; a panic is logged and swallowed, returning `fallback`.
pub fn callback<R>(fallback: R, body: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| {
        crate::log::warning("internal error in a callback (recovered)");
        fallback
    })
}
