//! `LOCK.ACQUIRE key owner lease-ms [SHARED | LIMIT n] [EPHEMERAL] [ONCE] [WAIT timeout-ms]`
//!
//! An exclusive request on a free key or one in Redisson's `RLock` layout takes the O(1) path
//! of `lock_core::state`; every other request (shared, semaphore, or a key holding several
//! holds) reads the key's holds and asks `lock_core::hold`.

use std::os::raw::c_int;

use lock_core::args::{parse_acquire, AcquireRequest, Binding, Wait};
use lock_core::hold::{self, Decision, HoldKind, How, Mode};
use lock_core::queue::LockKey;
use lock_core::scheduler::Seen;
use lock_core::state::{decide_acquire, AcquireDecision, Queue, View};
use lock_core::LockError;

use redis_module::raw;

use super::{KEY, LEASE, OWNER};
use crate::ffi::command_info::{ArgDoc, ArgKind, CommandSpec};
use crate::ffi::{self, now_ms, reply, Ctx, Key, RawString};
use crate::runtime::{self, Left};
use crate::stats::{bump, STATS};
use crate::{config, guard, notify, store};

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
    guard::command(ctx, || run(ctx, argv, argc))
}

/// The parsed request and the Redis strings of its key and owner.
struct Call<'a> {
    request: AcquireRequest<'a>,
    key_name: RawString,
    owner: RawString,
    now: u64,
    /// Some when clients wait on this key (built only then).
    waiting_key: Option<LockKey>,
}

impl Call<'_> {
    fn queue(&self) -> Queue {
        if self.waiting_key.is_some() {
            Queue::Waiting
        } else {
            Queue::Empty
        }
    }
}

fn run(ctx: Ctx, argv: *mut RawString, argc: c_int) -> Result<(), LockError> {
    let args = ffi::args(argv, argc);
    let request = parse_acquire(&args, config::max_lease_ms())?;
    super::refuse_while_paused()?;
    if request.binding == Binding::Connection && ffi::in_script(ctx) {
        return Err(LockError::EphemeralInScript);
    }
    // Only build the queue key when somebody waits somewhere: the common case skips it.
    let waiting_key = runtime::anyone_waiting()
        .then(|| LockKey::new(ffi::selected_db(ctx), request.key))
        .filter(|key| runtime::waiters_on(key) > 0);
    let call = Call {
        request,
        key_name: ffi::arg(argv, argc, 1),
        owner: ffi::arg(argv, argc, 2),
        now: now_ms(),
        waiting_key,
    };
    if call.request.mode == Mode::Exclusive {
        match store::read_for_owner(ctx, call.key_name, call.owner) {
            Ok(lock) => return exclusive(ctx, &call, lock),
            // Maybe a key with several holds: the general path reads all of it.
            Err(LockError::NotALock) => {}
            Err(e) => return Err(e),
        }
    }
    general(ctx, &call)
}

/// The exclusive lock on a free key or Redisson's `RLock` layout: O(1).
fn exclusive(ctx: Ctx, call: &Call<'_>, lock: store::LockRead) -> Result<(), LockError> {
    let request = &call.request;
    match decide_acquire(
        lock.view,
        call.queue(),
        request.lease_ms,
        request.reentry,
        call.now,
    )? {
        AcquireDecision::Take { expires_at } => {
            // A new lock takes memory: refused over maxmemory like any deny-oom command. A
            // re-entry, renew or release must keep working then (the command is not flagged
            // deny-oom for their sake).
            if ffi::out_of_memory(ctx) {
                return Err(LockError::OutOfMemory);
            }
            let token = store::next_token(ctx, request.key, call.now)?;
            let reply_token = store::stored_integer(token)?;
            store::write_hold(
                ctx,
                store::Hold {
                    key_name: call.key_name,
                    owner: call.owner,
                    count: 1,
                    new_token: Some(token),
                    expires_at,
                    key: &lock.key,
                },
            )?;
            drop(lock);
            if request.binding == Binding::Connection {
                runtime::bind(ctx, request.key, HoldKind::Exclusive, token);
            }
            notify::event(ctx, c"lock.acquired", call.key_name);
            bump(&STATS.acquired);
            reply::integer(ctx, reply_token);
        }
        AcquireDecision::Reenter {
            count,
            token,
            expires_at,
        } => {
            check_binding(ctx, request, token)?;
            // A hold taken by Redisson's own script has no token yet: give it one now.
            let new_token = match token {
                Some(_) => None,
                None => Some(store::next_token(ctx, request.key, call.now)?),
            };
            let reply_token = store::stored_integer(token.or(new_token).unwrap_or_default())?;
            store::write_hold(
                ctx,
                store::Hold {
                    key_name: call.key_name,
                    owner: call.owner,
                    count,
                    new_token,
                    expires_at,
                    key: &lock.key,
                },
            )?;
            drop(lock);
            // The lease may now end earlier than the waiters' lease check.
            runtime::lease_changed(ctx, request.key, Some(expires_at));
            notify::event(ctx, c"lock.reentered", call.key_name);
            bump(&STATS.reentered);
            reply::integer(ctx, reply_token);
        }
        AcquireDecision::Busy => {
            let seen = if lock.view == View::Free {
                Seen::Free
            } else {
                Seen::Held {
                    next_lease_end: lock.key.expires_at(),
                }
            };
            drop(lock);
            busy(ctx, call, seen)?;
        }
    }
    Ok(())
}

/// Every other request: shared holds, permits, and keys holding several holds.
fn general(ctx: Ctx, call: &Call<'_>) -> Result<(), LockError> {
    let request = &call.request;
    let key = Key::open(ctx, call.key_name);
    let store::LiveLock {
        stored,
        lock,
        ended,
    } = store::read_live(&key, call.now)?;
    let decision = hold::decide(
        &lock,
        request.owner,
        request.mode,
        request.lease_ms,
        request.reentry,
        call.queue(),
        call.now,
    )?;
    let granted = match decision {
        Decision::Grant(granted) => granted,
        Decision::Busy => {
            // Holds whose lease ended stay until a write or the waiters' lease check removes
            // them: a refused acquire writes nothing.
            let seen = if lock.holds.is_empty() {
                Seen::Free
            } else {
                Seen::Held {
                    next_lease_end: lock.next_lease_end(),
                }
            };
            drop(key);
            return busy(ctx, call, seen);
        }
    };
    if granted.how == How::Reentered {
        check_binding(ctx, request, granted.token)?;
    } else if ffi::out_of_memory(ctx) {
        return Err(LockError::OutOfMemory);
    }
    let token = match granted.token {
        Some(token) => token,
        None => store::next_token(ctx, request.key, call.now)?,
    };
    let reply_token = store::stored_integer(token)?;
    let new = hold::apply(&lock, request.owner, request.mode, &granted, token);
    store::write_lock(ctx, &key, call.key_name, stored.as_ref(), &new)?;
    drop(key);
    if granted.how != How::Reentered && request.binding == Binding::Connection {
        runtime::bind(ctx, request.key, granted.kind, token);
    }
    super::note_ended(ctx, call.key_name, ended);
    match granted.how {
        How::Reentered => {
            notify::event(ctx, c"lock.reentered", call.key_name);
            bump(&STATS.reentered);
        }
        How::New | How::Downgraded => {
            notify::event(ctx, c"lock.acquired", call.key_name);
            bump(&STATS.acquired);
            match granted.kind {
                HoldKind::Shared => bump(&STATS.acquired_shared),
                HoldKind::Permit => bump(&STATS.acquired_permits),
                HoldKind::Exclusive => {}
            }
            if granted.how == How::Downgraded {
                bump(&STATS.downgraded);
            }
        }
    }
    runtime::lease_changed(ctx, request.key, new.next_lease_end());
    if ended > 0 {
        // Holds that ended made room: the waiters ahead get it first.
        runtime::lock_freed(ctx, call.key_name, request.key, Left::OtherHolds);
    }
    reply::integer(ctx, reply_token);
    Ok(())
}

/// A re-entry keeps what the hold is: an `EPHEMERAL` hold is re-entered with `EPHEMERAL`, a
/// plain one without (a hold taken before a restart or failover is bound to nothing).
fn check_binding(
    ctx: Ctx,
    request: &AcquireRequest<'_>,
    token: Option<u64>,
) -> Result<(), LockError> {
    let bound = token.and_then(|t| runtime::bound_client(ctx, request.key, t));
    match (bound, request.binding) {
        (Some(_), Binding::Lease) => Err(LockError::HoldIsEphemeral),
        (None, Binding::Connection) => Err(LockError::HoldIsNotEphemeral),
        _ => Ok(()),
    }
}

/// Not granted now: nil, or queue the client when it asked to wait.
fn busy(ctx: Ctx, call: &Call<'_>, seen: Seen) -> Result<(), LockError> {
    let request = &call.request;
    bump(&STATS.contended);
    if request.wait == Wait::No || !super::can_block(ctx) {
        bump(&STATS.acquire_nil);
        reply::null(ctx);
        return Ok(());
    }
    if ffi::is_replica(ctx) {
        // A writable replica would queue a waiter that nothing there can ever grant.
        return Err(LockError::WaitOnReplica);
    }
    let key = call
        .waiting_key
        .clone()
        .unwrap_or_else(|| LockKey::new(ffi::selected_db(ctx), request.key));
    let bind = (request.binding == Binding::Connection).then(|| ffi::client_id(ctx));
    runtime::enqueue(
        ctx,
        key,
        runtime::Request {
            owner: request.owner,
            lease_ms: request.lease_ms,
            wait: request.wait,
            mode: request.mode,
            bind,
        },
        seen,
    )
}
