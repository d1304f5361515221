//! `LOCK.RENEW key owner lease-ms`

use std::os::raw::c_int;

use lock_core::args::parse_renew;
use lock_core::state::{decide_renew, RenewDecision};
use lock_core::LockError;

use crate::ffi::{self, now_ms, reply, Ctx, RawString};
use crate::stats::{bump, STATS};
use crate::{config, guard, notify, runtime, store};

pub extern "C" fn renew(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || run(ctx, argv, argc))
}

fn run(ctx: Ctx, argv: *mut RawString, argc: c_int) -> Result<(), LockError> {
    let args = ffi::args(argv, argc);
    let request = parse_renew(&args, config::max_lease_ms())?;
    let key_name = ffi::arg(argv, argc, 1);
    let owner = ffi::arg(argv, argc, 2);
    super::refuse_while_paused()?;
    let lock = store::read_for_owner(ctx, key_name, owner)?;
    match decide_renew(lock.view, request.lease_ms, now_ms()) {
        RenewDecision::NotOwner => {
            bump(&STATS.renew_not_owner);
            reply::integer(ctx, 0);
        }
        RenewDecision::Extend { expires_at } => {
            store::set_lease_end(ctx, &lock.key, key_name, expires_at)?;
            drop(lock);
            // A shorter lease must move the waiters' lease check earlier.
            runtime::lease_changed(ctx, request.key, expires_at);
            notify::event(ctx, c"lock.renewed", key_name);
            bump(&STATS.renewed);
            reply::integer(ctx, 1);
        }
    }
    Ok(())
}
