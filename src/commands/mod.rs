//! LOCK.* commands: each parses its arguments, reads the key's lock, asks
//! `lock_core::command` what to do, and hands the outcome to [`outcome::carry_out`], the one
//! place that writes, replicates, notifies, counts, hands off and replies.

use lock_core::LockError;
use redis_module::raw;

use crate::ffi::command_info::{arg, ArgDoc, ArgKind, CommandSpec};
use crate::ffi::Ctx;

mod acquire;
mod cancel;
mod election;
mod fence;
mod info;
mod multi;
mod outcome;
mod release;
mod renew;

/// Every command, each by its one spec (name, handler, flags, docs, key spec) written above
/// its handler.
const SPECS: [&CommandSpec; 14] = [
    &acquire::SPEC,
    &release::SPEC,
    &renew::SPEC,
    &info::SPEC,
    &release::FORCE_SPEC,
    &multi::ACQUIRE_SPEC,
    &multi::RELEASE_SPEC,
    &multi::RENEW_SPEC,
    &election::CAMPAIGN_SPEC,
    &election::PROCLAIM_SPEC,
    &election::LEADER_SPEC,
    &fence::GUARD_SPEC,
    &fence::CHECK_SPEC,
    &cancel::SPEC,
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

/// Redis postpones write commands while it pauses writes, so a LOCK.* write runs during a pause
/// only when a transaction queued it behind the `CLIENT PAUSE` itself. Writing then could hit a
/// key that expired during the pause (Redis keeps it until the pause ends): refuse instead.
fn refuse_while_paused() -> Result<(), LockError> {
    if crate::ffi::writes_paused() {
        return Err(LockError::WritesPaused);
    }
    Ok(())
}

/// Whether clients wait on `key` (an acquire must not pass them).
fn queue_at(key: &lock_core::queue::LockKey) -> lock_core::kind::Queue {
    if crate::runtime::waiters_on(key) > 0 {
        lock_core::kind::Queue::Waiting
    } else {
        lock_core::kind::Queue::Empty
    }
}

/// Whether the calling context may block: not inside MULTI, Lua/functions, or a module call.
fn can_block(ctx: Ctx) -> bool {
    let flags = crate::ffi::context_flags(ctx);
    let denied = raw::REDISMODULE_CTX_FLAGS_MULTI
        | raw::REDISMODULE_CTX_FLAGS_LUA
        | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING;
    flags & denied == 0
}
