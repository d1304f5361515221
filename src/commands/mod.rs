//! LOCK.* commands: thin adapters that parse, read the key, ask `lock_core` what to do, then
//! write, replicate, notify and reply.

use lock_core::LockError;
use redis_module::raw;

use crate::ffi::command_info::{arg, ArgDoc, ArgKind, CommandSpec};
use crate::ffi::{Ctx, RawString};

mod acquire;
mod info;
mod release;
mod renew;

/// Every command, each by its one spec (name, handler, flags, docs, key spec) written above
/// its handler.
const SPECS: [&CommandSpec; 5] = [
    &acquire::SPEC,
    &release::SPEC,
    &renew::SPEC,
    &info::SPEC,
    &release::FORCE_SPEC,
];

/// The arguments several commands share, as COMMAND DOCS shows them.
const KEY: ArgDoc = arg(c"key", ArgKind::Key, c"The lock's key.");
const OWNER: ArgDoc = arg(
    c"owner",
    ArgKind::Text,
    c"Who takes or holds the lock (e.g. a client id plus thread id).",
);
const LEASE: ArgDoc = arg(
    c"lease-ms",
    ArgKind::Integer,
    c"Lease in milliseconds, 1 to lock.max-lease-ms.",
);

pub fn register(ctx: Ctx) -> bool {
    crate::ffi::command_info::register(ctx, &SPECS)
}

/// Holds whose lease ended were removed by this command's write: count them and announce it.
fn note_ended(ctx: Ctx, key_name: RawString, ended: usize) {
    if ended > 0 {
        crate::stats::add(&crate::stats::STATS.holds_expired, ended as u64);
        crate::notify::event(ctx, c"lock.expired", key_name);
    }
}

/// Redis postpones write commands while it pauses writes, so a LOCK.* write runs during a pause
/// only when a transaction queued it behind the `CLIENT PAUSE` itself. Writing then could hit a
/// key that expired during the pause (Redis keeps it until the pause ends): refuse instead.
fn refuse_while_paused() -> Result<(), LockError> {
    if crate::ffi::writes_paused() {
        return Err(LockError::WritesPaused);
    }
    Ok(())
}

/// Whether the calling context may block: not inside MULTI, Lua/functions, or a module call.
fn can_block(ctx: Ctx) -> bool {
    let flags = crate::ffi::context_flags(ctx);
    let denied = raw::REDISMODULE_CTX_FLAGS_MULTI
        | raw::REDISMODULE_CTX_FLAGS_LUA
        | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING;
    flags & denied == 0
}
