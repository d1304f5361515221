//! `LOCK.INFO key`: nil when free; else a map (RESP3) or flat name/value array (RESP2):
//! `owner`, `count`, `ttl` (ms left, -1 without a lease), `token` (nil if taken outside the
//! module) and `ephemeral` (the bound client id, or nil) of the exclusive hold when there is
//! one; then `waiters`, `mode` (`exclusive`, `shared`, `semaphore`), `limit` (semaphores) and
//! `holders`: one map per hold with `owner`, `mode`, `count`, `ttl`, `token`, `ephemeral`.

use std::os::raw::c_int;

use lock_core::args::parse_key_only;
use lock_core::hold::{Family, Hold};
use lock_core::queue::LockKey;
use lock_core::LockError;

use redis_module::raw;

use super::KEY;
use crate::ffi::command_info::CommandSpec;
use crate::ffi::{self, now_ms, reply, Args, Ctx, Key, RawString};
use crate::{guard, runtime, store};

pub const SPEC: CommandSpec = CommandSpec {
    name: c"lock.info",
    handler: info,
    flags: c"readonly fast",
    summary: c"Returns a lock's owner, re-entry count, remaining lease, fencing token and number of waiters.",
    complexity: c"O(1)",
    arity: 2,
    key_flags: raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
    args: &[KEY],
};

pub extern "C" fn info(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || ffi::with_args(argv, argc, |args| run(ctx, args)))
}

/// One hold as INFO shows it, converted before the reply starts: an error after a map header
/// would break the reply.
struct Shown<'a> {
    hold: &'a Hold,
    count: i64,
    ttl: i64,
    token: Option<i64>,
    ephemeral: Option<i64>,
}

fn run(ctx: Ctx, args: &Args<'_>) -> Result<(), LockError> {
    let name = parse_key_only(args)?;
    let key = Key::open_read(ctx, args.string(1));
    let now = now_ms();
    // A hold whose lease ended is gone, whether or not the module removed it yet.
    let live = store::read_live(&key, None, now)?;
    let lock = live.lock();
    drop(key);
    if lock.holds.is_empty() {
        reply::null(ctx);
        return Ok(());
    }
    let waiters = runtime::waiters_on(&LockKey::new(ffi::selected_db(ctx), name));
    let shown = lock
        .holds
        .iter()
        .map(|hold| {
            let ttl = match hold.expires_at {
                Some(at) => i64::try_from(at.saturating_sub(now)).unwrap_or(i64::MAX),
                None => -1,
            };
            let ephemeral = hold
                .token
                .and_then(|t| runtime::bound_client(ctx, name, t))
                .map(|id| i64::try_from(id).unwrap_or(i64::MAX));
            Ok(Shown {
                hold,
                count: store::stored_integer(hold.count)?,
                ttl,
                token: hold.token.map(store::stored_integer).transpose()?,
                ephemeral,
            })
        })
        .collect::<Result<Vec<_>, LockError>>()?;
    let exclusive = shown
        .iter()
        .find(|s| s.hold.kind == lock_core::hold::HoldKind::Exclusive);
    let limit = match lock.family {
        Family::Semaphore { limit } => Some(store::stored_integer(limit)?),
        Family::ReadWrite => None,
    };

    let pairs = 3 + if exclusive.is_some() { 5 } else { 0 } + i64::from(limit.is_some());
    reply::map(ctx, pairs);
    if let Some(x) = exclusive {
        hold_fields(ctx, x, Mode::Omitted);
    }
    reply::bulk(ctx, b"waiters");
    reply::integer(ctx, i64::try_from(waiters).unwrap_or(i64::MAX));
    reply::bulk(ctx, b"mode");
    reply::bulk(ctx, lock.mode_name().name().as_bytes());
    if let Some(limit) = limit {
        reply::bulk(ctx, b"limit");
        reply::integer(ctx, limit);
    }
    reply::bulk(ctx, b"holders");
    reply::array(ctx, i64::try_from(shown.len()).unwrap_or(i64::MAX));
    for s in &shown {
        reply::map(ctx, 6);
        hold_fields(ctx, s, Mode::Shown);
    }
    Ok(())
}

/// Whether a hold's fields include its `mode` (in `holders`; the top-level fields of the
/// exclusive hold keep their old five).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Shown,
    Omitted,
}

/// `owner`, [`mode`], `count`, `ttl`, `token`, `ephemeral` of one hold, as name/value pairs.
fn hold_fields(ctx: Ctx, s: &Shown<'_>, mode: Mode) {
    reply::bulk(ctx, b"owner");
    reply::bulk(ctx, &s.hold.owner);
    if mode == Mode::Shown {
        reply::bulk(ctx, b"mode");
        reply::bulk(ctx, s.hold.kind.name().as_bytes());
    }
    reply::bulk(ctx, b"count");
    reply::integer(ctx, s.count);
    reply::bulk(ctx, b"ttl");
    reply::integer(ctx, s.ttl);
    reply::bulk(ctx, b"token");
    optional(ctx, s.token);
    reply::bulk(ctx, b"ephemeral");
    optional(ctx, s.ephemeral);
}

fn optional(ctx: Ctx, value: Option<i64>) {
    match value {
        Some(v) => reply::integer(ctx, v),
        None => reply::null(ctx),
    }
}
