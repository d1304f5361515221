//! `LOCK.ACQUIRE key owner lease-ms [WAIT timeout-ms]`

use std::os::raw::c_int;

use lock_core::args::{parse_acquire, Wait};
use lock_core::queue::LockKey;
use lock_core::scheduler::Seen;
use lock_core::state::{decide_acquire, AcquireDecision, Queue, View};
use lock_core::LockError;

use crate::ffi::{self, now_ms, reply, Ctx, RawString};
use crate::stats::{bump, STATS};
use crate::{config, guard, notify, runtime, store};

pub extern "C" fn acquire(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || run(ctx, argv, argc))
}

fn run(ctx: Ctx, argv: *mut RawString, argc: c_int) -> Result<(), LockError> {
    let args = ffi::args(argv, argc);
    let request = parse_acquire(&args, config::max_lease_ms())?;
    let key_name = ffi::arg(argv, argc, 1);
    let owner = ffi::arg(argv, argc, 2);
    let now = now_ms();

    super::refuse_while_paused()?;

    let lock = store::read_for_owner(ctx, key_name, owner)?;
    // Only build the queue key when somebody waits somewhere: the common case skips it.
    let waiting_key = runtime::anyone_waiting()
        .then(|| LockKey::new(ffi::selected_db(ctx), request.key))
        .filter(|key| runtime::waiters_on(key) > 0);
    let queue = if waiting_key.is_some() {
        Queue::Waiting
    } else {
        Queue::Empty
    };

    match decide_acquire(lock.view, queue, request.lease_ms, request.reentry, now)? {
        AcquireDecision::Take { expires_at } => {
            // A new lock takes memory: refused over maxmemory like any deny-oom command. A
            // re-entry, renew or release must keep working then (the command is not flagged
            // deny-oom for their sake).
            if ffi::out_of_memory(ctx) {
                return Err(LockError::OutOfMemory);
            }
            let token = store::next_token(ctx, request.key, now)?;
            let reply_token = store::stored_integer(token)?;
            store::write_hold(
                ctx,
                store::Hold {
                    key_name,
                    owner,
                    count: 1,
                    new_token: Some(token),
                    expires_at,
                    key: &lock.key,
                },
            )?;
            drop(lock);
            notify::event(ctx, c"lock.acquired", key_name);
            bump(&STATS.acquired);
            reply::integer(ctx, reply_token);
        }
        AcquireDecision::Reenter {
            count,
            token,
            expires_at,
        } => {
            // A hold taken by Redisson's own script has no token yet: give it one now.
            let new_token = match token {
                Some(_) => None,
                None => Some(store::next_token(ctx, request.key, now)?),
            };
            let reply_token = store::stored_integer(token.or(new_token).unwrap_or_default())?;
            store::write_hold(
                ctx,
                store::Hold {
                    key_name,
                    owner,
                    count,
                    new_token,
                    expires_at,
                    key: &lock.key,
                },
            )?;
            drop(lock);
            // The lease may now end earlier than the waiters' lease check.
            runtime::lease_changed(ctx, request.key, expires_at);
            notify::event(ctx, c"lock.reentered", key_name);
            bump(&STATS.reentered);
            reply::integer(ctx, reply_token);
        }
        AcquireDecision::Busy => {
            bump(&STATS.contended);
            let seen = if lock.view == View::Free {
                Seen::Free
            } else {
                Seen::Held {
                    expires_at: lock.key.expires_at(),
                }
            };
            drop(lock);
            if request.wait == Wait::No || !super::can_block(ctx) {
                bump(&STATS.acquire_nil);
                reply::null(ctx);
            } else if ffi::is_replica(ctx) {
                // A writable replica would queue a waiter that nothing there can ever grant.
                return Err(LockError::WaitOnReplica);
            } else {
                let key =
                    waiting_key.unwrap_or_else(|| LockKey::new(ffi::selected_db(ctx), request.key));
                runtime::enqueue(
                    ctx,
                    key,
                    request.owner,
                    request.lease_ms,
                    request.wait,
                    seen,
                )?;
            }
        }
    }
    Ok(())
}
