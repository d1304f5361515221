//! `LOCK.INFO key`: nil when free; else a map (RESP3) or flat name/value array (RESP2) of
//! owner, count, ttl (ms left, -1 without a lease), token (nil if taken outside the module) and
//! waiters.

use std::os::raw::c_int;

use lock_core::args::{parse_key_only, parse_positive};
use lock_core::queue::LockKey;
use lock_core::state::FENCE_FIELD;
use lock_core::LockError;

use crate::ffi::{self, now_ms, reply, Ctx, Key, KeyKind, RawString};
use crate::{guard, runtime};

pub extern "C" fn info(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || run(ctx, argv, argc))
}

fn run(ctx: Ctx, argv: *mut RawString, argc: c_int) -> Result<(), LockError> {
    let args = ffi::args(argv, argc);
    let name = parse_key_only(&args)?;
    let key = Key::open_read(ctx, ffi::arg(argv, argc, 1));
    match key.kind() {
        KeyKind::Missing => {
            reply::null(ctx);
            return Ok(());
        }
        KeyKind::Hash => {}
        KeyKind::String | KeyKind::Other => return Err(LockError::WrongType),
    }
    let fields = key.hash_fields();
    let mut token = None;
    let mut holder = None;
    for (field, value) in &fields {
        if field.as_slice() == FENCE_FIELD {
            token = Some(parse_positive(value).ok_or(LockError::NotALock)?);
        } else if holder.is_some() {
            return Err(LockError::NotALock);
        } else {
            holder = Some((field, parse_positive(value).ok_or(LockError::NotALock)?));
        }
    }
    let (owner, count) = holder.ok_or(LockError::NotALock)?;
    let ttl = match key.expires_at() {
        Some(at) => i64::try_from(at.saturating_sub(now_ms())).unwrap_or(i64::MAX),
        None => -1,
    };
    let waiters = runtime::waiters_on(&LockKey::new(ffi::selected_db(ctx), name));

    reply::map(ctx, 5);
    reply::bulk(ctx, b"owner");
    reply::bulk(ctx, owner);
    reply::bulk(ctx, b"count");
    reply::integer(ctx, i64::try_from(count).unwrap_or(i64::MAX));
    reply::bulk(ctx, b"ttl");
    reply::integer(ctx, ttl);
    reply::bulk(ctx, b"token");
    match token {
        Some(t) => reply::integer(ctx, i64::try_from(t).unwrap_or(i64::MAX)),
        None => reply::null(ctx),
    }
    reply::bulk(ctx, b"waiters");
    reply::integer(ctx, i64::try_from(waiters).unwrap_or(i64::MAX));
    Ok(())
}
