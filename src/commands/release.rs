//! `LOCK.RELEASE key owner` and `LOCK.FORCERELEASE key`

use std::os::raw::c_int;

use lock_core::args::{parse_key_only, parse_release};
use lock_core::command;
use lock_core::LockError;

use redis_module::raw;

use super::outcome::{self, Target};
use super::{KEY, OWNER};
use crate::ffi::command_info::{ArgDoc, ArgKind, CommandSpec};
use crate::ffi::{self, now_ms, Args, Ctx, RawString};
use crate::guard;
use crate::store::OwnLease;

pub const SPEC: CommandSpec = CommandSpec {
    name: c"lock.release",
    handler: release,
    flags: c"write fast",
    summary:
        c"Releases one re-entry of a lock (with TOKEN, only of the owner's hold under that token); at zero the lock is freed or handed to the next waiter.",
    complexity: c"O(1)",
    arity: -3,
    key_flags: raw::REDISMODULE_CMD_KEY_RW
        | raw::REDISMODULE_CMD_KEY_ACCESS
        | raw::REDISMODULE_CMD_KEY_DELETE,
    args: &[
        KEY,
        OWNER,
        ArgDoc {
            name: c"token",
            kind: ArgKind::Tokened(c"TOKEN"),
            optional: true,
            summary: c"Release only the owner's hold under this fencing token (nil if it has none): safe to send again after a failover or a lost reply.",
        },
    ],
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
    guard::command(ctx, || {
        ffi::with_args(argv, argc, |args| run_release(ctx, args))
    })
}

pub extern "C" fn force_release(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || {
        ffi::with_args(argv, argc, |args| run_force_release(ctx, args))
    })
}

fn run_release(ctx: Ctx, args: &Args<'_>) -> Result<(), LockError> {
    let request = parse_release(args)?;
    super::refuse_while_paused()?;
    let target = Target::open(ctx, args, request.key, Some(OwnLease::Replaced));
    let live = target.read(now_ms())?;
    let outcome = command::release(&live, request.owner, request.token)?;
    outcome::carry_out(ctx, target, &live, outcome).map(drop)
}

fn run_force_release(ctx: Ctx, args: &Args<'_>) -> Result<(), LockError> {
    let name = parse_key_only(args)?;
    super::refuse_while_paused()?;
    let target = Target::open(ctx, args, name, None);
    // Only a lock is removed: any other hash is an error and stays as it is.
    let live = target.read(now_ms())?;
    let outcome = command::force_release(&live);
    outcome::carry_out(ctx, target, &live, outcome).map(drop)
}
