//! Changes made outside the module (DEL, UNLINK, expiry, eviction, RENAME, FLUSHDB/FLUSHALL,
//! SWAPDB, Redisson's unlock script) must hand a lock to its waiters. Keyspace and server events
//! tell us; the callbacks only note the change (no writes are allowed inside them) and the
//! runtime processes it from a 0 ms timer.

use std::os::raw::{c_char, c_int, c_void};

use lock_core::queue::LockKey;
use redis_module::raw;

use crate::ffi::{api, bytes, selected_db, with_db, Ctx, Key, RawString};
use crate::guard;
use crate::runtime;
use crate::stats::{bump, STATS};
use lock_core::scheduler::{Cause, Change};

/// Subscribes to the key server event where the server has it (not an error on Redis 7.0).
fn subscribe_key_events(ctx: Ctx) {
    let key = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_KEY,
        dataver: 1,
    };
    // SAFETY: ctx is the load context; an unknown event is refused with an error code.
    let subscribed = unsafe {
        { raw::RedisModule_GetKeyNameFromModuleKey }.is_some()
            && { raw::RedisModule_GetDbIdFromModuleKey }.is_some()
            && api!(RedisModule_SubscribeToServerEvent)(ctx, key, Some(on_key_event))
                == raw::REDISMODULE_OK as c_int
    };
    runtime::set_reports_expiries(subscribed);
}

/// A key expired (Redis >= 7.2, Valkey): if it held a lock, a holder's lease ran out. Counted
/// and announced here, while Redis still has the key open; nothing is written.
extern "C" fn on_key_event(
    ctx: Ctx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    guard::callback((), || {
        if subevent != raw::REDISMODULE_SUBEVENT_KEY_EXPIRED || data.is_null() {
            return;
        }
        // SAFETY: for key events Redis passes a RedisModuleKeyInfo whose key is open for the
        // callback's duration.
        let info = unsafe { &*data.cast::<raw::RedisModuleKeyInfo>() };
        Key::with_borrowed(info.key, |key| {
            if !matches!(crate::store::read_lock(key), Ok(Some(_))) {
                return;
            }
            bump(&STATS.expired);
            if let Some((name, db)) = key.name_and_db() {
                with_db(ctx, db, || {
                    crate::notify::event(ctx, c"lock.expired", name.as_ptr());
                });
            }
        });
    });
}

pub fn subscribe(ctx: Ctx) -> bool {
    subscribe_key_events(ctx);
    let types = raw::REDISMODULE_NOTIFY_GENERIC
        | raw::REDISMODULE_NOTIFY_EXPIRED
        | raw::REDISMODULE_NOTIFY_EVICTED;
    let flush = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_FLUSHDB,
        dataver: 1,
    };
    let swap = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_SWAPDB,
        dataver: 1,
    };
    let client = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_CLIENT_CHANGE,
        dataver: 1,
    };
    let role = raw::RedisModuleEvent {
        id: raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
        dataver: 1,
    };
    // SAFETY: ctx is the load context; the callbacks are plain functions that live as long as
    // the module does.
    unsafe {
        api!(RedisModule_SubscribeToKeyspaceEvents)(ctx, types, Some(on_keyspace_event))
            == raw::REDISMODULE_OK as c_int
            && api!(RedisModule_SubscribeToServerEvent)(ctx, flush, Some(on_server_event))
                == raw::REDISMODULE_OK as c_int
            && api!(RedisModule_SubscribeToServerEvent)(ctx, swap, Some(on_server_event))
                == raw::REDISMODULE_OK as c_int
            && api!(RedisModule_SubscribeToServerEvent)(ctx, client, Some(on_client_change))
                == raw::REDISMODULE_OK as c_int
            && api!(RedisModule_SubscribeToServerEvent)(ctx, role, Some(on_role_change))
                == raw::REDISMODULE_OK as c_int
    }
}

extern "C" fn on_keyspace_event(
    ctx: Ctx,
    _type: c_int,
    event: *const c_char,
    key: RawString,
) -> c_int {
    guard::callback((), || {
        // SAFETY: Redis passes the event name as a NUL-terminated C string.
        let event = (!event.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(event) });
        if runtime::any_bound() {
            follow_bound_holds(ctx, event, key);
        }
        // Every generic event in the server comes here: do nothing unless someone waits on a
        // key of this name.
        let name = bytes(key);
        if runtime::may_concern_waiters(name) {
            let key = LockKey::new(selected_db(ctx), name);
            let expired = event == Some(c"expired");
            let cause = if expired {
                Cause::LeaseEnded
            } else {
                Cause::Freed
            };
            runtime::notice(ctx, Change::Key(key, cause));
        }
    });
    raw::REDISMODULE_OK as c_int
}

/// `MOVE` and `RENAME` announce the key leaving (`move_from`, `rename_from`) and then arriving
/// (`move_to`, `rename_to`): the holds bound to connections follow it. The key is only read.
fn follow_bound_holds(ctx: Ctx, event: Option<&std::ffi::CStr>, key: RawString) {
    let Some(event) = event else {
        return;
    };
    if event == c"move_from" || event == c"rename_from" {
        runtime::key_leaving(LockKey::new(selected_db(ctx), bytes(key)));
    } else if event == c"move_to" || event == c"rename_to" {
        let to = LockKey::new(selected_db(ctx), bytes(key));
        let opened = Key::open_read(ctx, key);
        let tokens: Vec<u64> = match crate::store::read_lock(&opened) {
            Ok(Some(stored)) => stored.lock.holds.iter().filter_map(|h| h.token).collect(),
            _ => Vec::new(),
        };
        drop(opened);
        runtime::key_arrived(ctx, to, &tokens);
    }
}

/// A connection closed: its EPHEMERAL holds end (from the inbox timer, see
/// `runtime::connection_closed`).
extern "C" fn on_client_change(
    ctx: Ctx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    guard::callback((), || {
        if subevent != raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED || data.is_null() {
            return;
        }
        // SAFETY: for a client-change event Redis passes a RedisModuleClientInfo (version 1),
        // valid for the duration of the callback.
        let info = unsafe { &*data.cast::<raw::RedisModuleClientInfo>() };
        runtime::connection_closed(ctx, info.id);
    });
}

/// The server became a replica (a failover, REPLICAOF): no connection here binds a hold any
/// more, so a later promotion back does not revive bindings to connections of the past.
extern "C" fn on_role_change(
    ctx: Ctx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    guard::callback((), || {
        if subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_REPLICA {
            runtime::forget_bindings(ctx);
        }
    });
}

extern "C" fn on_server_event(
    ctx: Ctx,
    event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    guard::callback((), || {
        if event.id == raw::REDISMODULE_EVENT_FLUSHDB {
            if subevent != raw::REDISMODULE_SUBEVENT_FLUSHDB_END || data.is_null() {
                return;
            }
            // SAFETY: for FLUSHDB events Redis passes a RedisModuleFlushInfo.
            let info = unsafe { &*data.cast::<raw::RedisModuleFlushInfo>() };
            let (change, db) = if info.dbnum < 0 {
                (Change::All, None)
            } else {
                (Change::Db(info.dbnum), Some(info.dbnum))
            };
            runtime::flushed(ctx, db);
            runtime::notice(ctx, change);
        } else if event.id == raw::REDISMODULE_EVENT_SWAPDB {
            if !data.is_null() {
                // SAFETY: for SWAPDB events Redis passes a RedisModuleSwapDbInfo.
                let info = unsafe { &*data.cast::<raw::RedisModuleSwapDbInfo>() };
                crate::store::swap_databases(info.dbnum_first, info.dbnum_second);
                runtime::databases_swapped(ctx, info.dbnum_first, info.dbnum_second);
            }
            runtime::notice(ctx, Change::All);
        }
    });
}
