//! `LOCK.INFO key`: nil when free; else a map (RESP3) or flat name/value array (RESP2) of
//! owner, count, ttl (ms left, -1 without a lease), token (nil if taken outside the module) and
//! waiters.

use std::os::raw::c_int;

use lock_core::args::parse_key_only;
use lock_core::queue::LockKey;
use lock_core::LockError;

use crate::ffi::{self, now_ms, reply, Ctx, Key, RawString};
use crate::{guard, runtime, store};

pub extern "C" fn info(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || run(ctx, argv, argc))
}

fn run(ctx: Ctx, argv: *mut RawString, argc: c_int) -> Result<(), LockError> {
    let args = ffi::args(argv, argc);
    let name = parse_key_only(&args)?;
    let key = Key::open_read(ctx, ffi::arg(argv, argc, 1));
    let Some(holder) = store::holder_of(&key)? else {
        reply::null(ctx);
        return Ok(());
    };
    let ttl = match key.expires_at() {
        Some(at) => i64::try_from(at.saturating_sub(now_ms())).unwrap_or(i64::MAX),
        None => -1,
    };
    let waiters = runtime::waiters_on(&LockKey::new(ffi::selected_db(ctx), name));
    // Converted before the reply starts: an error after the map header would break the reply.
    let count = store::stored_integer(holder.count)?;
    let token = holder.token.map(store::stored_integer).transpose()?;

    reply::map(ctx, 5);
    reply::bulk(ctx, b"owner");
    reply::bulk(ctx, &holder.owner);
    reply::bulk(ctx, b"count");
    reply::integer(ctx, count);
    reply::bulk(ctx, b"ttl");
    reply::integer(ctx, ttl);
    reply::bulk(ctx, b"token");
    match token {
        Some(t) => reply::integer(ctx, t),
        None => reply::null(ctx),
    }
    reply::bulk(ctx, b"waiters");
    reply::integer(ctx, i64::try_from(waiters).unwrap_or(i64::MAX));
    Ok(())
}
