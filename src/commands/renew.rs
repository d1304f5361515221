//! `LOCK.RENEW key owner lease-ms`: a new lease for every hold of the owner on the key.

use std::os::raw::c_int;

use lock_core::args::parse_renew;
use lock_core::hold;
use lock_core::state::{decide_renew, RenewDecision};
use lock_core::LockError;

use redis_module::raw;

use super::{KEY, LEASE, OWNER};
use crate::ffi::command_info::CommandSpec;
use crate::ffi::{self, now_ms, reply, Ctx, Key, RawString};
use crate::runtime::{self, Left};
use crate::stats::{bump, STATS};
use crate::{config, guard, notify, store};

pub const SPEC: CommandSpec = CommandSpec {
    name: c"lock.renew",
    handler: renew,
    flags: c"write fast",
    summary: c"Resets the lease of a lock the owner holds.",
    complexity: c"O(1)",
    arity: 4,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE,
    args: &[KEY, OWNER, LEASE],
};

pub extern "C" fn renew(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || run(ctx, argv, argc))
}

fn run(ctx: Ctx, argv: *mut RawString, argc: c_int) -> Result<(), LockError> {
    let args = ffi::args(argv, argc);
    let request = parse_renew(&args, config::max_lease_ms())?;
    let key_name = ffi::arg(argv, argc, 1);
    let owner = ffi::arg(argv, argc, 2);
    super::refuse_while_paused()?;
    let now = now_ms();
    let lock = match store::read_for_owner(ctx, key_name, owner) {
        Ok(lock) => lock,
        Err(LockError::NotALock) => {
            return renew_general(
                ctx,
                key_name,
                request.owner,
                request.key,
                request.lease_ms,
                now,
            )
        }
        Err(e) => return Err(e),
    };
    match decide_renew(lock.view, request.lease_ms, now) {
        RenewDecision::NotOwner => {
            bump(&STATS.renew_not_owner);
            reply::integer(ctx, 0);
        }
        RenewDecision::Extend { expires_at } => {
            store::set_lease_end(ctx, &lock.key, key_name, expires_at)?;
            drop(lock);
            // A shorter lease must move the waiters' lease check earlier.
            runtime::lease_changed(ctx, request.key, Some(expires_at));
            notify::event(ctx, c"lock.renewed", key_name);
            bump(&STATS.renewed);
            reply::integer(ctx, 1);
        }
    }
    Ok(())
}

fn renew_general(
    ctx: Ctx,
    key_name: RawString,
    owner: &[u8],
    name: &[u8],
    lease_ms: u64,
    now: u64,
) -> Result<(), LockError> {
    let key = Key::open(ctx, key_name);
    let store::LiveLock {
        stored,
        lock,
        ended,
    } = store::read_live(&key, now)?;
    let Some(new) = hold::renew(&lock, owner, lease_ms, now) else {
        drop(key);
        bump(&STATS.renew_not_owner);
        reply::integer(ctx, 0);
        return Ok(());
    };
    store::write_lock(ctx, &key, key_name, stored.as_ref(), &new)?;
    drop(key);
    super::note_ended(ctx, key_name, ended);
    runtime::lease_changed(ctx, name, new.next_lease_end());
    notify::event(ctx, c"lock.renewed", key_name);
    bump(&STATS.renewed);
    if ended > 0 {
        runtime::lock_freed(ctx, key_name, name, Left::OtherHolds);
    }
    reply::integer(ctx, 1);
    Ok(())
}
