//! All FFI to Redis's blocking and timer APIs, in one place.
//!
//! A waiter is a client blocked with `RedisModule_BlockClient` (no Redis-side timeout: deadlines
//! are ours, kept precise by one module timer). The lock decisions live in `runtime`; this file
//! only translates between Redis's callbacks and it:
//!
//! - `unblock(handle, Answer)` answers a waiter; Redis then calls `on_reply` in the client's
//!   context, which sends the reply, and `on_free`, which frees the outcome. If the client went
//!   away in between (the reply was never delivered) and the outcome was a grant, `on_free`
//!   tells the runtime, which passes the lock on from a timer (no writes inside `on_free`).
//! - `on_disconnect` (client closed or killed, or `CLIENT UNBLOCK id ERROR`) and `on_timeout`
//!   (`CLIENT UNBLOCK id`) take a still-queued waiter out of its queue and release the handle.
//!   A handle is released (UnblockClient) exactly once: by a grant, a timeout, or one of these.

use std::cell::Cell;
use std::os::raw::{c_int, c_void};
use std::ptr;

use lock_core::binding::GrantRef;
use lock_core::scheduler::Answer;
use redis_module::raw;

use crate::ffi::{api, reply, Ctx, RawString};
use crate::guard;

/// What the blocking and timer callbacks tell the module: the runtime implements it, and the
/// callbacks here are generic over it, so that this FFI layer depends on nothing above it.
pub trait Events {
    /// A waiter left by itself (disconnect, `CLIENT UNBLOCK`): true if it was still queued,
    /// in which case its handle is released here.
    fn waiter_left(ctx: Ctx, handle: Blocked) -> bool;
    /// A grant's reply was never delivered (the client went away first).
    fn grant_undelivered(ctx: Ctx, grant: GrantRef);
    /// The module timer fired.
    fn timer(ctx: Ctx);
    /// The 0 ms timer for changes noticed by events fired.
    fn inbox(ctx: Ctx);
    /// The 0 ms timer for answers not yet given fired.
    fn outbox(ctx: Ctx);
}

/// The server's handle for one blocked client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Blocked(*mut raw::RedisModuleBlockedClient);

/// Carried through Redis from `unblock` to `on_reply` and `on_free`.
struct Delivery {
    outcome: Answer,
    delivered: Cell<bool>,
}

/// Blocks the client running the current command. The caller must queue it (or unblock it) before
/// returning to Redis.
pub fn block<E: Events>(ctx: Ctx) -> Option<Blocked> {
    // SAFETY: ctx is the context of a command that may block (the caller checked the context
    // flags); timeout 0 means Redis never times it out on its own.
    let bc = unsafe {
        api!(RedisModule_BlockClient)(
            ctx,
            Some(on_reply),
            Some(on_timeout::<E>),
            Some(on_free::<E>),
            0,
        )
    };
    if bc.is_null() {
        return None;
    }
    // SAFETY: bc was just returned by BlockClient and is live until UnblockClient.
    unsafe { api!(RedisModule_SetDisconnectCallback)(bc, Some(on_disconnect::<E>)) };
    Some(Blocked(bc))
}

/// Answers a queued waiter. Must be called at most once per handle, and never for one that
/// `on_disconnect`/`on_timeout` already released.
pub fn unblock(handle: Blocked, outcome: Answer) {
    let delivery = Box::new(Delivery {
        outcome,
        delivered: Cell::new(false),
    });
    // SAFETY: the handle is live (still queued, never released); Redis owns the privdata until
    // it passes it to on_free.
    unsafe {
        api!(RedisModule_UnblockClient)(handle.0, Box::into_raw(delivery).cast::<c_void>());
    }
}

/// Releases a handle whose client was already answered (or is gone), with no reply to send.
fn release(handle: Blocked) {
    // SAFETY: called once, from on_timeout/on_disconnect, for a handle still queued; a NULL
    // privdata means on_free gets nothing to free.
    unsafe {
        api!(RedisModule_UnblockClient)(handle.0, ptr::null_mut());
    }
}

extern "C" fn on_reply(ctx: Ctx, _argv: *mut RawString, _argc: c_int) -> c_int {
    guard::callback((), || {
        // SAFETY: ctx is the reply context of a client we unblocked with a Delivery.
        let data = unsafe { api!(RedisModule_GetBlockedClientPrivateData)(ctx) };
        if data.is_null() {
            reply::null(ctx);
            return;
        }
        // SAFETY: the privdata is the Box<Delivery> leaked in `unblock`, still owned by Redis.
        let delivery = unsafe { &*data.cast::<Delivery>() };
        delivery.delivered.set(true);
        match &delivery.outcome {
            // Tokens stop below i64::MAX (the core refuses larger ones); should one get here, the
            // reply is an error rather than a wrapped number.
            Answer::Granted { token, .. } => match i64::try_from(*token) {
                Ok(token) => reply::integer(ctx, token),
                Err(_) => reply::error(ctx, &lock_core::LockError::Internal.reply()),
            },
            Answer::GrantedAll { holds, .. } => {
                let tokens: Option<Vec<i64>> = holds
                    .iter()
                    .map(|(_, token)| i64::try_from(*token).ok())
                    .collect();
                match tokens {
                    Some(tokens) => reply::integers(ctx, &tokens),
                    None => reply::error(ctx, &lock_core::LockError::Internal.reply()),
                }
            }
            Answer::TimedOut => reply::null(ctx),
            Answer::Refused(message) => reply::error(ctx, message),
        }
    });
    raw::REDISMODULE_OK as c_int
}

/// Only `CLIENT UNBLOCK id` (without ERROR) gets here: our blocks have no Redis-side timeout.
extern "C" fn on_timeout<E: Events>(ctx: Ctx, _argv: *mut RawString, _argc: c_int) -> c_int {
    guard::callback((), || {
        // SAFETY: ctx is the timeout context of a blocked client.
        let bc = unsafe { api!(RedisModule_GetBlockedClientHandle)(ctx) };
        reply::null(ctx);
        if !bc.is_null() && E::waiter_left(ctx, Blocked(bc)) {
            release(Blocked(bc));
        }
    });
    raw::REDISMODULE_OK as c_int
}

extern "C" fn on_disconnect<E: Events>(ctx: Ctx, bc: *mut raw::RedisModuleBlockedClient) {
    guard::callback((), || {
        // A waiter we already granted is no longer queued: its handle was released by the grant
        // and `on_free` will see the undelivered reply.
        if !bc.is_null() && E::waiter_left(ctx, Blocked(bc)) {
            release(Blocked(bc));
        }
    });
}

extern "C" fn on_free<E: Events>(ctx: Ctx, privdata: *mut c_void) {
    guard::callback((), || {
        if privdata.is_null() {
            return;
        }
        // SAFETY: privdata is the Box<Delivery> from `unblock`; Redis hands it back exactly once.
        let delivery = unsafe { Box::from_raw(privdata.cast::<Delivery>()) };
        if delivery.delivered.get() {
            return;
        }
        match delivery.outcome {
            Answer::Granted {
                token, key, kind, ..
            } => E::grant_undelivered(ctx, GrantRef { key, kind, token }),
            // Every key of a multi-key grant is passed on.
            Answer::GrantedAll { holds, kind, .. } => {
                for (key, token) in holds {
                    E::grant_undelivered(ctx, GrantRef { key, kind, token });
                }
            }
            Answer::TimedOut | Answer::Refused(_) => {}
        }
    });
}

/// The one module timer that serves every deadline. Returns its id.
pub fn arm_timer<E: Events>(ctx: Ctx, delay_ms: u64) -> u64 {
    let delay = i64::try_from(delay_ms).unwrap_or(i64::MAX);
    // SAFETY: ctx is live; the callback takes no data.
    unsafe { api!(RedisModule_CreateTimer)(ctx, delay, Some(on_timer::<E>), ptr::null_mut()) }
}

pub fn stop_timer(ctx: Ctx, id: u64) {
    let mut data: *mut c_void = ptr::null_mut();
    // SAFETY: stopping an id that already fired is a harmless error return.
    unsafe {
        api!(RedisModule_StopTimer)(ctx, id, &mut data);
    }
}

extern "C" fn on_timer<E: Events>(ctx: Ctx, _data: *mut c_void) {
    guard::callback((), || E::timer(ctx));
}

/// A 0 ms timer that processes changes noticed by keyspace and server events.
pub fn arm_inbox_timer<E: Events>(ctx: Ctx) -> u64 {
    // SAFETY: as in arm_timer.
    unsafe { api!(RedisModule_CreateTimer)(ctx, 0, Some(on_inbox_timer::<E>), ptr::null_mut()) }
}

extern "C" fn on_inbox_timer<E: Events>(ctx: Ctx, _data: *mut c_void) {
    guard::callback((), || E::inbox(ctx));
}

/// A 0 ms timer that gives the answers a turn of the event loop could not.
pub fn arm_outbox_timer<E: Events>(ctx: Ctx) -> u64 {
    // SAFETY: as in arm_timer.
    unsafe { api!(RedisModule_CreateTimer)(ctx, 0, Some(on_outbox_timer::<E>), ptr::null_mut()) }
}

extern "C" fn on_outbox_timer<E: Events>(ctx: Ctx, _data: *mut c_void) {
    guard::callback((), || E::outbox(ctx));
}
