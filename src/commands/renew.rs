//! `LOCK.RENEW key owner lease-ms`: a new lease for every hold of the owner on the key.

use std::os::raw::c_int;

use lock_core::args::parse_renew;
use lock_core::command;
use lock_core::LockError;

use redis_module::raw;

use super::outcome::{self, Target};
use super::{KEY, LEASE, OWNER};
use crate::ffi::command_info::CommandSpec;
use crate::ffi::{self, now_ms, Args, Ctx, RawString};
use crate::store::OwnLease;
use crate::{config, guard};

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
    guard::command(ctx, || ffi::with_args(argv, argc, |args| run(ctx, args)))
}

fn run(ctx: Ctx, args: &Args<'_>) -> Result<(), LockError> {
    let request = parse_renew(args, config::max_lease_ms())?;
    super::refuse_while_paused()?;
    let now = now_ms();
    let target = Target::open(ctx, args, request.key, Some(OwnLease::Replaced));
    let live = target.read(now)?;
    let outcome = command::renew(&live, request.owner, request.lease_ms, now)?;
    outcome::carry_out(ctx, target, &live, outcome).map(drop)
}
