//! `LOCK.RELEASE key owner` and `LOCK.FORCERELEASE key`

use std::os::raw::c_int;

use lock_core::args::{parse_key_only, parse_release};
use lock_core::hold;
use lock_core::state::{decide_release, ReleaseDecision, View};
use lock_core::LockError;

use redis_module::raw;

use super::{KEY, OWNER};
use crate::ffi::command_info::CommandSpec;
use crate::ffi::{self, now_ms, reply, Ctx, Key, RawString};
use crate::runtime::{self, Left};
use crate::stats::{bump, STATS};
use crate::{guard, notify, store};

pub const SPEC: CommandSpec = CommandSpec {
    name: c"lock.release",
    handler: release,
    flags: c"write fast",
    summary:
        c"Releases one re-entry of a lock; at zero the lock is freed or handed to the next waiter.",
    complexity: c"O(1)",
    arity: 3,
    key_flags: raw::REDISMODULE_CMD_KEY_RW
        | raw::REDISMODULE_CMD_KEY_ACCESS
        | raw::REDISMODULE_CMD_KEY_DELETE,
    args: &[KEY, OWNER],
};

pub const FORCE_SPEC: CommandSpec = CommandSpec {
    name: c"lock.forcerelease",
    handler: force_release,
    flags: c"write fast",
    summary: c"Administrative: removes a lock whoever holds it; it goes to the next waiter.",
    complexity: c"O(1)",
    arity: 2,
    key_flags: raw::REDISMODULE_CMD_KEY_RM | raw::REDISMODULE_CMD_KEY_DELETE,
    args: &[KEY],
};

pub extern "C" fn release(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || run_release(ctx, argv, argc))
}

pub extern "C" fn force_release(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || run_force_release(ctx, argv, argc))
}

fn run_release(ctx: Ctx, argv: *mut RawString, argc: c_int) -> Result<(), LockError> {
    let args = ffi::args(argv, argc);
    let request = parse_release(&args)?;
    let key_name = ffi::arg(argv, argc, 1);
    let owner = ffi::arg(argv, argc, 2);
    super::refuse_while_paused()?;

    let lock = match store::read_for_owner(ctx, key_name, owner) {
        Ok(lock) => lock,
        // Maybe a key with several holds.
        Err(LockError::NotALock) => {
            return release_general(ctx, key_name, request.owner, request.key)
        }
        Err(e) => return Err(e),
    };
    match decide_release(lock.view) {
        ReleaseDecision::NotOwner => {
            bump(&STATS.release_not_owner);
            reply::null(ctx);
        }
        ReleaseDecision::CountDown { remaining } => {
            let reply_count = store::stored_integer(remaining)?;
            store::write_count(ctx, &lock.key, key_name, owner, remaining)?;
            bump(&STATS.released_partial);
            reply::integer(ctx, reply_count);
        }
        ReleaseDecision::Free => {
            let token = match lock.view {
                View::HeldByRequester { token, .. } => token,
                _ => None,
            };
            store::delete(ctx, &lock.key, key_name);
            drop(lock);
            if let Some(token) = token {
                runtime::unbind(ctx, request.key, token);
            }
            notify::event(ctx, c"lock.released", key_name);
            bump(&STATS.released);
            runtime::lock_freed(ctx, key_name, request.key, Left::Nothing);
            reply::integer(ctx, 0);
        }
    }
    Ok(())
}

/// Release on a key holding several holds: the owner's exclusive hold counts down first, then
/// its shared hold or permit. Replies with the owner's remaining re-entries on the key.
fn release_general(
    ctx: Ctx,
    key_name: RawString,
    owner: &[u8],
    name: &[u8],
) -> Result<(), LockError> {
    let key = Key::open(ctx, key_name);
    let store::LiveLock {
        stored,
        lock,
        ended,
    } = store::read_live(&key, now_ms())?;
    let Some((new, remaining)) = hold::release(&lock, owner) else {
        drop(key);
        bump(&STATS.release_not_owner);
        reply::null(ctx);
        return Ok(());
    };
    let reply_count = store::stored_integer(remaining)?;
    // The owner's hold that this release ended (counted down to zero), if any: one release
    // changes one hold, so only the owner's own holds (two at most) are looked for in `new`.
    let gone = lock
        .holds
        .iter()
        .filter(|h| h.owner == owner)
        .find(|h| {
            !new.holds
                .iter()
                .any(|n| n.kind == h.kind && n.owner == owner)
        })
        .map(|h| h.token);
    store::write_lock(ctx, &key, key_name, stored.as_ref(), &new)?;
    drop(key);
    if let Some(Some(token)) = gone {
        runtime::unbind(ctx, name, token);
    }
    super::note_ended(ctx, key_name, ended);
    if gone.is_none() {
        bump(&STATS.released_partial);
    } else {
        notify::event(ctx, c"lock.released", key_name);
        bump(&STATS.released);
    }
    if gone.is_some() || ended > 0 {
        let left = if new.holds.is_empty() {
            Left::Nothing
        } else {
            Left::OtherHolds
        };
        runtime::lock_freed(ctx, key_name, name, left);
    }
    reply::integer(ctx, reply_count);
    Ok(())
}

fn run_force_release(ctx: Ctx, argv: *mut RawString, argc: c_int) -> Result<(), LockError> {
    let args = ffi::args(argv, argc);
    let name = parse_key_only(&args)?;
    let key_name = ffi::arg(argv, argc, 1);
    super::refuse_while_paused()?;
    let key = Key::open(ctx, key_name);
    // Only a lock is removed: any other hash is an error and stays as it is.
    let Some(stored) = store::read_lock(&key)? else {
        reply::integer(ctx, 0);
        return Ok(());
    };
    store::delete(ctx, &key, key_name);
    drop(key);
    for token in stored.lock.holds.iter().filter_map(|h| h.token) {
        runtime::unbind(ctx, name, token);
    }
    notify::event(ctx, c"lock.forcereleased", key_name);
    bump(&STATS.force_released);
    runtime::lock_freed(ctx, key_name, name, Left::Nothing);
    reply::integer(ctx, 1);
    Ok(())
}
