//! The multi-key commands, all or nothing:
//!
//! - `LOCK.MACQUIRE numkeys key [key ...] owner lease-ms [SHARED | LIMIT n] [EPHEMERAL] [ONCE]
//!   [WAIT timeout-ms]`: every key at one instant (a token per key) or none; with `WAIT`, one
//!   request queued on every key at once, granted when it heads every queue.
//! - `LOCK.MRELEASE numkeys key [key ...] owner`: `LOCK.RELEASE` on every key.
//! - `LOCK.MRENEW numkeys key [key ...] owner lease-ms`: `LOCK.RENEW` on every key.
//!
//! Each reads every key, decides in core (a key that refuses refuses the command whole, before
//! anything is written), writes every key, then finishes each (`super::outcome`). The server
//! carries one command's writes to replicas and the AOF inside one MULTI/EXEC.

use std::os::raw::c_int;

use lock_core::args::{parse_macquire, parse_mrelease, parse_mrenew, AcquireRequest, Binding};
use lock_core::command::{self, AllOrNothing, Live, Outcome};
use lock_core::kind::Queue;
use lock_core::queue::LockKey;
use lock_core::ticket::Shape;
use lock_core::LockError;

use redis_module::raw;

use super::outcome::{self, CommandFacts, Replied, Target};
use super::{LEASE, OWNER};
use crate::ffi::command_info::{arg, ArgDoc, ArgKind, CommandSpec};
use crate::ffi::{self, now_ms, reply, Args, Ctx, KeyKind, RawString};
use crate::store::OwnLease;
use crate::{config, guard, runtime};

const NUMKEYS: ArgDoc = arg(
    c"numkeys",
    ArgKind::Integer,
    c"How many keys follow (1 to 64).",
);
const KEYS: ArgDoc = arg(
    c"key",
    ArgKind::Keys,
    c"The locks' keys, distinct (in a cluster, in one slot: use a hash tag).",
);

pub const ACQUIRE_SPEC: CommandSpec = CommandSpec {
    name: c"lock.macquire",
    handler: macquire,
    flags: c"write blocking getkeys-api",
    summary: c"Takes every key at one instant or none (a fencing token per key); with WAIT, waits in every key's FIFO queue at once and is granted when it heads them all.",
    complexity: c"O(N) in the keys, plus each key's holders for shared and semaphore keys.",
    arity: -5,
    key_flags: raw::REDISMODULE_CMD_KEY_RW
        | raw::REDISMODULE_CMD_KEY_ACCESS
        | raw::REDISMODULE_CMD_KEY_UPDATE,
    args: &[
        NUMKEYS,
        KEYS,
        OWNER,
        LEASE,
        ArgDoc {
            name: c"timeout-ms",
            kind: ArgKind::Tokened(c"WAIT"),
            optional: true,
            summary: c"Block up to this many milliseconds for every key (0 = forever).",
        },
        ArgDoc {
            name: c"ticket",
            kind: ArgKind::Flag(c"TICKET"),
            optional: true,
            summary: c"With WAIT: reply at once with a ticket key instead of blocking; the answer is pushed there (pop it with BLPOP; withdraw it with LOCK.CANCEL).",
        },
        ArgDoc {
            name: c"shared",
            kind: ArgKind::Flag(c"SHARED"),
            optional: true,
            summary: c"Shared (read) holds on every key; not with LIMIT.",
        },
        ArgDoc {
            name: c"limit",
            kind: ArgKind::Tokened(c"LIMIT"),
            optional: true,
            summary: c"A permit of every key, each a semaphore of this many permits; not with SHARED.",
        },
        ArgDoc {
            name: c"ephemeral",
            kind: ArgKind::Flag(c"EPHEMERAL"),
            optional: true,
            summary: c"Bind every hold to this connection.",
        },
        ArgDoc {
            name: c"once",
            kind: ArgKind::Flag(c"ONCE"),
            optional: true,
            summary: c"Where the owner holds a key already, return its token without counting a re-entry.",
        },
    ],
};

pub const RELEASE_SPEC: CommandSpec = CommandSpec {
    name: c"lock.mrelease",
    handler: mrelease,
    flags: c"write fast getkeys-api",
    summary: c"LOCK.RELEASE on every key: an array of the owner's remaining re-entries per key (nil where it held nothing).",
    complexity: c"O(N) in the keys, plus each key's holders for shared and semaphore keys.",
    arity: -4,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE,
    args: &[NUMKEYS, KEYS, OWNER],
};

pub const RENEW_SPEC: CommandSpec = CommandSpec {
    name: c"lock.mrenew",
    handler: mrenew,
    flags: c"write fast getkeys-api",
    summary: c"LOCK.RENEW on every key: an array of 1 (renewed) or 0 (the owner holds nothing there) per key.",
    complexity: c"O(N) in the keys, plus each key's holders for shared and semaphore keys.",
    arity: -5,
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE,
    args: &[NUMKEYS, KEYS, OWNER, LEASE],
};

pub extern "C" fn macquire(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || {
        ffi::with_args(argv, argc, |args| run(ctx, args, run_acquire))
    })
}

pub extern "C" fn mrelease(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || {
        ffi::with_args(argv, argc, |args| run(ctx, args, run_release))
    })
}

pub extern "C" fn mrenew(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || {
        ffi::with_args(argv, argc, |args| run(ctx, args, run_renew))
    })
}

/// Answers Redis's question where the keys are (`numkeys` at argument 1, the keys after it),
/// or runs the command.
fn run(
    ctx: Ctx,
    args: &Args<'_>,
    command: fn(Ctx, &Args<'_>) -> Result<(), LockError>,
) -> Result<(), LockError> {
    if !ffi::is_keys_position_request(ctx) {
        return command(ctx, args);
    }
    let count = args
        .get(1)
        .and_then(|n| lock_core::args::parse_i64(n))
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0)
        .min(lock_core::args::MAX_MULTI_KEYS);
    for n in 0..count {
        if key_at(n) < args.len() {
            ffi::key_at(ctx, key_at(n));
        }
    }
    Ok(())
}

/// The argument index of the n-th key (after the name and `numkeys`).
fn key_at(n: usize) -> usize {
    n + 2
}

/// Opens and reads every key; the owner stands right after the keys.
fn read_all<'a>(
    ctx: Ctx,
    args: &Args<'_>,
    names: &[&'a [u8]],
    lease: OwnLease,
    now: u64,
) -> Result<(Vec<Target<'a>>, Vec<Live>), LockError> {
    let owner_at = key_at(names.len());
    let targets: Vec<Target<'a>> = names
        .iter()
        .enumerate()
        .map(|(n, name)| Target::open_at(ctx, args, key_at(n), name, Some((owner_at, lease))))
        .collect();
    // Bounded before anything is read (every command's read is O(holders) on a shared key).
    let fields = targets
        .iter()
        .filter(|t| t.key.kind() == KeyKind::Hash)
        .map(|t| t.key.len())
        .sum();
    lock_core::command::readable_together(fields)?;
    let lives = targets
        .iter()
        .map(|target| target.read(now))
        .collect::<Result<Vec<Live>, LockError>>()?;
    Ok((targets, lives))
}

/// Writes every key, then finishes each; the replies in key order.
fn carry_out_all(
    ctx: Ctx,
    targets: Vec<Target<'_>>,
    lives: &[Live],
    outcomes: Vec<Outcome>,
) -> Result<Vec<Replied>, LockError> {
    let mut written = Vec::with_capacity(targets.len());
    for ((target, live), outcome) in targets.into_iter().zip(lives).zip(&outcomes) {
        // Nothing here fails once the core decided (its checks ran on every key first): the
        // only error is a number Redis cannot store, which the core never produces.
        written.push(outcome::write(ctx, target, live, outcome)?);
    }
    let (replies, rooms): (Vec<_>, Vec<_>) = written
        .into_iter()
        .zip(&outcomes)
        .map(|(w, outcome)| outcome::finish(ctx, w, outcome))
        .unzip();
    for room in rooms.into_iter().flatten() {
        outcome::hand_off_after_others(ctx, room);
    }
    Ok(replies)
}

fn reply_all(ctx: Ctx, replies: &[Replied]) {
    reply::array(ctx, replies.len() as i64);
    for replied in replies {
        match replied {
            Replied::Integer(value) => reply::integer(ctx, *value),
            Replied::Null | Replied::Wait(_) => reply::null(ctx),
        }
    }
}

fn run_acquire(ctx: Ctx, args: &Args<'_>) -> Result<(), LockError> {
    let requests = parse_macquire(args, config::max_lease_ms())?;
    super::refuse_while_paused()?;
    let Some(first) = requests.first() else {
        return Err(LockError::Internal);
    };
    if first.binding == Binding::Connection && ffi::in_script(ctx) {
        return Err(LockError::EphemeralInScript);
    }
    let db = ffi::selected_db(ctx);
    let queues: Vec<Queue> = requests
        .iter()
        .map(|r| super::queue_at(&LockKey::new(db, r.key)))
        .collect();
    let now = now_ms();
    let own_lease = OwnLease::of_acquire(first.mode);
    let names: Vec<&[u8]> = requests.iter().map(|r| r.key).collect();
    let (targets, lives) = read_all(ctx, args, &names, own_lease, now)?;
    let mut facts: Vec<CommandFacts<'_>> = requests
        .iter()
        .map(|r| CommandFacts {
            ctx,
            name: r.key,
            now,
        })
        .collect();
    match command::acquire_all(&lives, &requests, &queues, now, &mut facts)? {
        AllOrNothing::Granted(outcomes) => {
            let replies = carry_out_all(ctx, targets, &lives, outcomes)?;
            reply_all(ctx, &replies);
            Ok(())
        }
        AllOrNothing::NotNow { outcome, seen } => {
            drop(targets);
            outcome::count(outcome.counters);
            if !matches!(outcome.reply, command::Reply::Wait(_)) {
                reply::null(ctx);
                return Ok(());
            }
            queue_on_all(ctx, db, first, &requests, seen)
        }
    }
}

/// Not granted, and the client asked to wait and may: one request on every key.
fn queue_on_all(
    ctx: Ctx,
    db: i32,
    first: &AcquireRequest<'_>,
    requests: &[AcquireRequest<'_>],
    seen: Vec<lock_core::scheduler::Seen>,
) -> Result<(), LockError> {
    let keys: Vec<_> = requests
        .iter()
        .map(|r| LockKey::new(db, r.key))
        .zip(seen)
        .collect();
    runtime::enqueue(
        ctx,
        &keys,
        runtime::Request::of(ctx, first, None, Shape::Many),
    )
}

fn run_release(ctx: Ctx, args: &Args<'_>) -> Result<(), LockError> {
    let request = parse_mrelease(args)?;
    super::refuse_while_paused()?;
    let (targets, lives) = read_all(ctx, args, &request.keys, OwnLease::Replaced, now_ms())?;
    let outcomes = lives
        .iter()
        .map(|live| command::release(live, request.owner, None))
        .collect::<Result<Vec<_>, _>>()?;
    let replies = carry_out_all(ctx, targets, &lives, outcomes)?;
    reply_all(ctx, &replies);
    Ok(())
}

fn run_renew(ctx: Ctx, args: &Args<'_>) -> Result<(), LockError> {
    let request = parse_mrenew(args, config::max_lease_ms())?;
    super::refuse_while_paused()?;
    let now = now_ms();
    let (targets, lives) = read_all(ctx, args, &request.keys, OwnLease::Replaced, now)?;
    let outcomes = lives
        .iter()
        .map(|live| command::renew(live, request.owner, request.lease_ms, now))
        .collect::<Result<Vec<_>, _>>()?;
    let replies = carry_out_all(ctx, targets, &lives, outcomes)?;
    reply_all(ctx, &replies);
    Ok(())
}
