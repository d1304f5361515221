//! `LOCK.RELEASE key owner` and `LOCK.FORCERELEASE key`

use std::os::raw::c_int;

use lock_core::args::{parse_key_only, parse_release};
use lock_core::state::{decide_release, ReleaseDecision};
use lock_core::LockError;

use crate::ffi::{self, reply, Ctx, Key, RawString};
use crate::stats::{bump, STATS};
use crate::{guard, notify, runtime, store};

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

    let lock = store::read_for_owner(ctx, key_name, owner)?;
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
            store::delete(ctx, &lock.key, key_name);
            drop(lock);
            notify::event(ctx, c"lock.released", key_name);
            bump(&STATS.released);
            runtime::lock_freed(ctx, key_name, request.key);
            reply::integer(ctx, 0);
        }
    }
    Ok(())
}

fn run_force_release(ctx: Ctx, argv: *mut RawString, argc: c_int) -> Result<(), LockError> {
    let args = ffi::args(argv, argc);
    let name = parse_key_only(&args)?;
    let key_name = ffi::arg(argv, argc, 1);
    super::refuse_while_paused()?;
    let key = Key::open(ctx, key_name);
    // Only a lock is removed: any other hash is an error and stays as it is.
    if store::holder_of(&key)?.is_none() {
        reply::integer(ctx, 0);
        return Ok(());
    }
    store::delete(ctx, &key, key_name);
    drop(key);
    notify::event(ctx, c"lock.forcereleased", key_name);
    bump(&STATS.force_released);
    runtime::lock_freed(ctx, key_name, name);
    reply::integer(ctx, 1);
    Ok(())
}
