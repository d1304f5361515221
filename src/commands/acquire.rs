//! `LOCK.ACQUIRE key owner lease-ms [WAIT timeout-ms]`

use std::os::raw::c_int;

use lock_core::args::{parse_acquire, Wait};
use lock_core::queue::LockKey;
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

    match decide_acquire(lock.view, queue, request.lease_ms, now)? {
        AcquireDecision::Take { expires_at } => {
            let token = store::next_token(ctx, request.key, now);
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
            );
            notify::event(ctx, c"lock.acquired", key_name);
            bump(&STATS.acquired);
            reply::integer(ctx, i64::try_from(token).unwrap_or(i64::MAX));
        }
        AcquireDecision::Reenter {
            count,
            token,
            expires_at,
        } => {
            // A hold taken by Redisson's own script has no token yet: give it one now.
            let new_token = match token {
                Some(_) => None,
                None => Some(store::next_token(ctx, request.key, now)),
            };
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
            );
            notify::event(ctx, c"lock.reentered", key_name);
            bump(&STATS.reentered);
            let token = token.or(new_token).unwrap_or_default();
            reply::integer(ctx, i64::try_from(token).unwrap_or(i64::MAX));
        }
        AcquireDecision::Busy => {
            bump(&STATS.contended);
            let lock_is_free = lock.view == View::Free;
            let expires_at = lock.key.expires_at();
            drop(lock);
            if request.wait == Wait::No || !super::can_block(ctx) {
                bump(&STATS.acquire_nil);
                reply::null(ctx);
            } else {
                let key =
                    waiting_key.unwrap_or_else(|| LockKey::new(ffi::selected_db(ctx), request.key));
                runtime::enqueue(
                    ctx,
                    key,
                    request.owner,
                    request.lease_ms,
                    request.wait,
                    expires_at,
                    lock_is_free,
                )?;
            }
        }
    }
    Ok(())
}
