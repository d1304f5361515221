//! `LOCK.ACQUIRE key owner lease-ms [SHARED | LIMIT n] [EPHEMERAL] [ONCE] [WAIT timeout-ms]`
//!
//! Parse, read the key's lock (O(1) in Redisson's layout), decide (`lock_core::command::acquire`)
//! and carry the outcome out (`super::outcome`); queue the client when it waits.

use std::os::raw::c_int;

use lock_core::args::{parse_acquire, Binding};
use lock_core::command;
use lock_core::kind::Queue;
use lock_core::queue::LockKey;
use lock_core::ticket::Shape;
use lock_core::LockError;

use redis_module::raw;

use super::outcome::{self, CommandFacts, Target};
use super::{KEY, LEASE, OWNER};
use crate::ffi::command_info::{ArgDoc, ArgKind, CommandSpec};
use crate::ffi::{self, now_ms, Args, Ctx, RawString};
use crate::store::OwnLease;
use crate::{config, guard, runtime};

pub const SPEC: CommandSpec = CommandSpec {
    name: c"lock.acquire",
    handler: acquire,
    // Not deny-oom: under maxmemory a holder must still re-enter, renew and release. A new
    // lock is refused with Redis's own OOM error inside LOCK.ACQUIRE.
    flags: c"write blocking",
    summary: c"Takes or re-enters a hold (exclusive, SHARED or a LIMIT n permit) and returns its fencing token; with WAIT, blocks in FIFO order until granted or timed out.",
    complexity: c"O(1) for an exclusive lock; O(N) in the key's holders for shared and semaphore keys.",
    arity: -4,
    // Redis allows one of INSERT/UPDATE/DELETE; an acquire updates (or creates) the hold.
    key_flags: raw::REDISMODULE_CMD_KEY_RW
        | raw::REDISMODULE_CMD_KEY_ACCESS
        | raw::REDISMODULE_CMD_KEY_UPDATE,
    args: &[
        KEY,
        OWNER,
        LEASE,
        ArgDoc {
            name: c"timeout-ms",
            kind: ArgKind::Tokened(c"WAIT"),
            optional: true,
            summary: c"Block up to this many milliseconds for the lock (0 = forever).",
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
            summary: c"A shared (read) hold: any number of owners hold the key SHARED together; not with LIMIT.",
        },
        ArgDoc {
            name: c"limit",
            kind: ArgKind::Tokened(c"LIMIT"),
            optional: true,
            summary: c"A semaphore permit: at most this many owners (1 to 10000) hold the key at once; not with SHARED.",
        },
        ArgDoc {
            name: c"ephemeral",
            kind: ArgKind::Flag(c"EPHEMERAL"),
            optional: true,
            summary: c"Bind the hold to this connection: it ends when the connection closes, or at its lease end.",
        },
        ArgDoc {
            name: c"once",
            kind: ArgKind::Flag(c"ONCE"),
            optional: true,
            summary: c"If the owner holds the lock already, return its token and reset the lease without counting a re-entry (safe to retry).",
        },
    ],
};

pub extern "C" fn acquire(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || ffi::with_args(argv, argc, |args| run(ctx, args)))
}

fn run(ctx: Ctx, args: &Args<'_>) -> Result<(), LockError> {
    let request = parse_acquire(args, config::max_lease_ms())?;
    super::refuse_while_paused()?;
    if request.binding == Binding::Connection && ffi::in_script(ctx) {
        return Err(LockError::EphemeralInScript);
    }
    // Only build the queue key when somebody waits somewhere: the common case skips it.
    let waiting_key = runtime::anyone_waiting()
        .then(|| LockKey::new(ffi::selected_db(ctx), request.key))
        .filter(|key| runtime::waiters_on(key) > 0);
    let queue = match waiting_key {
        Some(_) => Queue::Waiting,
        None => Queue::Empty,
    };
    let now = now_ms();
    let own_lease = OwnLease::of_acquire(request.mode);
    let target = Target::open(ctx, args, request.key, Some(own_lease));
    let live = target.read(now)?;
    let mut facts = CommandFacts {
        ctx,
        name: request.key,
        now,
    };
    let outcome = command::acquire(&live, &request, queue, now, &mut facts)?;
    let Some(seen) = outcome::carry_out(ctx, target, &live, outcome)? else {
        return Ok(());
    };
    // Not granted, and the client asked to wait and may: queue it.
    let key = waiting_key.unwrap_or_else(|| LockKey::new(ffi::selected_db(ctx), request.key));
    runtime::enqueue(
        ctx,
        &[(key, seen)],
        runtime::Request::of(ctx, &request, None, Shape::One),
    )
}
