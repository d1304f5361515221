//! LOCK.* commands: thin adapters that parse, read the key, ask `lock_core` what to do, then
//! write, replicate, notify and reply.

use std::ffi::CStr;

use lock_core::LockError;
use redis_module::raw;

use crate::ffi::{self, Ctx, RawString};

mod acquire;
mod docs;
mod info;
mod release;
mod renew;

/// (name, handler, flags). Every command has its key at position 1.
const COMMANDS: [(&CStr, ffi::CommandHandler, &CStr); 5] = [
    // Not deny-oom: under maxmemory a holder must still re-enter, renew and release. A new
    // lock is refused with Redis's own OOM error inside LOCK.ACQUIRE.
    (c"lock.acquire", acquire::acquire, c"write blocking"),
    (c"lock.release", release::release, c"write fast"),
    (c"lock.renew", renew::renew, c"write fast"),
    (c"lock.info", info::info, c"readonly fast"),
    (c"lock.forcerelease", release::force_release, c"write fast"),
];

pub fn register(ctx: Ctx) -> bool {
    let registered = COMMANDS
        .iter()
        .all(|(name, handler, flags)| ffi::create_command(ctx, name, *handler, flags));
    if registered && !docs::attach(ctx) {
        crate::log::warning("could not attach COMMAND DOCS to LOCK.* commands");
    }
    registered
}

/// Redis postpones write commands while it pauses writes, so a LOCK.* write runs during a pause
/// only when a transaction queued it behind the `CLIENT PAUSE` itself. Writing then could hit a
/// key that expired during the pause (Redis keeps it until the pause ends): refuse instead.
/// Holds whose lease ended were removed by this command's write: count them and announce it.
fn note_ended(ctx: Ctx, key_name: RawString, ended: usize) {
    if ended > 0 {
        crate::stats::add(&crate::stats::STATS.holds_expired, ended as u64);
        crate::notify::event(ctx, c"lock.expired", key_name);
    }
}

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
