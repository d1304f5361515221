//! All FFI of keyspace and server events: the subscriptions and the callbacks Redis calls. The
//! callbacks read Redis's event data and hand plain values to a [`ServerEvents`] (the module's
//! `events`), which decides what they mean for locks.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};

use redis_module::raw;

use super::guard;
use super::{api, Ctx, Key, RawString};

/// What the module does with the events it subscribes to. Every method runs inside Redis's
/// callback: it may read keys, and must not write any.
pub trait ServerEvents {
    /// A keyspace event of the generic, expired or evicted class (`del`, `expired`,
    /// `move_from`, ...) on `key`, in the context's selected database.
    fn keyspace(ctx: Ctx, event: Option<&CStr>, key: RawString);
    /// A key is about to go (Redis >= 7.2, Valkey): it is still open, and readable, for the call.
    fn key_removed(ctx: Ctx, key: &Key, why: KeyRemoved);
    /// A client connection closed.
    fn client_closed(ctx: Ctx, client: u64);
    /// The server became a replica.
    fn became_replica(ctx: Ctx);
    /// `FLUSHDB` (Some) or `FLUSHALL` (None) is about to empty the database(s): still readable.
    fn flushing(ctx: Ctx, db: Option<i32>);
    /// `FLUSHDB` (Some) or `FLUSHALL` (None) finished.
    fn flushed(ctx: Ctx, db: Option<i32>);
    /// `SWAPDB a b`.
    fn swapped(ctx: Ctx, a: i32, b: i32);
    /// A replica's full sync loaded into databases of its own while the old ones were served
    /// (`repl-diskless-load swapdb`), and has just put them in place of every database: no
    /// flush or `SWAPDB` event says so. (An async load that starts changes nothing yet, and
    /// one that is aborted leaves the old databases as they were: neither is reported.)
    fn databases_replaced(ctx: Ctx);
}

/// Why a key goes (the key server event's subevent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRemoved {
    /// A command removed it (`DEL`, `UNLINK`, `RENAME`/`MOVE` taking it away), or the module did.
    Deleted,
    Expired,
    Evicted,
    /// A command replaced its value (`SET`, `RESTORE ... REPLACE`, a `RENAME` onto it).
    Overwritten,
}

/// What [`subscribe`] got.
pub struct Subscribed {
    /// Every subscription the module needs was accepted.
    pub all: bool,
    /// The key server event (Redis >= 7.2, Valkey): every key expiry is reported.
    pub key_events: bool,
}

fn event(id: u64) -> raw::RedisModuleEvent {
    raw::RedisModuleEvent { id, dataver: 1 }
}

pub fn subscribe<E: ServerEvents>(ctx: Ctx) -> Subscribed {
    // SAFETY: ctx is the load context; an event the server does not know is refused with an
    // error code (Redis 7.0 has no key event); the callbacks are plain functions that live as
    // long as the module does.
    unsafe {
        let ok = raw::REDISMODULE_OK as c_int;
        let server = |id, callback: raw::RedisModuleEventCallback| {
            api!(RedisModule_SubscribeToServerEvent)(ctx, event(id), callback) == ok
        };
        let key_events = { raw::RedisModule_GetKeyNameFromModuleKey }.is_some()
            && { raw::RedisModule_GetDbIdFromModuleKey }.is_some()
            && server(raw::REDISMODULE_EVENT_KEY, Some(on_key_event::<E>));
        let types = raw::REDISMODULE_NOTIFY_GENERIC
            | raw::REDISMODULE_NOTIFY_EXPIRED
            | raw::REDISMODULE_NOTIFY_EVICTED;
        let all =
            api!(RedisModule_SubscribeToKeyspaceEvents)(ctx, types, Some(on_keyspace_event::<E>))
                == ok
                && server(raw::REDISMODULE_EVENT_FLUSHDB, Some(on_server_event::<E>))
                && server(raw::REDISMODULE_EVENT_SWAPDB, Some(on_server_event::<E>))
                && server(
                    raw::REDISMODULE_EVENT_CLIENT_CHANGE,
                    Some(on_client_change::<E>),
                )
                && server(
                    raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
                    Some(on_role_change::<E>),
                )
                && server(
                    raw::REDISMODULE_EVENT_REPL_ASYNC_LOAD,
                    Some(on_async_load::<E>),
                );
        Subscribed { all, key_events }
    }
}

/// Tells the server that the module follows a replica's async load
/// ([`ServerEvents::databases_replaced`]): without this, Redis and Valkey refuse
/// `repl-diskless-load swapdb` (a replica flushes its data and answers `LOADING` through a full
/// sync instead of serving the old data while it loads the new).
pub fn declare_async_load_aware(ctx: Ctx) {
    // SAFETY: ctx is the load context; the call only sets the module's option bits.
    unsafe {
        api!(RedisModule_SetModuleOptions)(
            ctx,
            raw::REDISMODULE_OPTIONS_HANDLE_REPL_ASYNC_LOAD as c_int,
        );
    }
}

extern "C" fn on_key_event<E: ServerEvents>(
    ctx: Ctx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    guard::callback((), || {
        let why = match subevent {
            raw::REDISMODULE_SUBEVENT_KEY_DELETED => KeyRemoved::Deleted,
            raw::REDISMODULE_SUBEVENT_KEY_EXPIRED => KeyRemoved::Expired,
            raw::REDISMODULE_SUBEVENT_KEY_EVICTED => KeyRemoved::Evicted,
            raw::REDISMODULE_SUBEVENT_KEY_OVERWRITTEN => KeyRemoved::Overwritten,
            _ => return,
        };
        if data.is_null() {
            return;
        }
        // SAFETY: for key events Redis passes a RedisModuleKeyInfo whose key is open for the
        // callback's duration.
        let info = unsafe { &*data.cast::<raw::RedisModuleKeyInfo>() };
        Key::with_borrowed(info.key, |key| E::key_removed(ctx, key, why));
    });
}

extern "C" fn on_keyspace_event<E: ServerEvents>(
    ctx: Ctx,
    _type: c_int,
    event: *const c_char,
    key: RawString,
) -> c_int {
    guard::callback((), || {
        // SAFETY: Redis passes the event name as a NUL-terminated C string.
        let event = (!event.is_null()).then(|| unsafe { CStr::from_ptr(event) });
        E::keyspace(ctx, event, key);
        keep_the_movers_database(ctx, event);
    });
    raw::REDISMODULE_OK as c_int
}

thread_local! {
    /// The database of the last `move_from` event: the database `MOVE` ran in.
    static MOVED_FROM_DB: std::cell::Cell<Option<i32>> = const { std::cell::Cell::new(None) };
}

/// Valkey 8.1 (valkey-io/valkey#1819, fixed by #4024) runs keyspace callbacks on the client
/// executing the command, selects the event's database on it and never selects back: after
/// `MOVE k 1` that connection is left on database 1. `move_from` comes first, in the database
/// `MOVE` ran in, so on `move_to` that database is selected again. (Where callbacks get a
/// temporary client — Redis, other Valkey versions — this selects on that client: harmless.)
/// `COPY ... DB n` sends only `copy_to`, in the destination: that one cannot be undone here
/// (docs/guarantees.md).
fn keep_the_movers_database(ctx: Ctx, event: Option<&CStr>) {
    if event == Some(c"move_from") {
        MOVED_FROM_DB.with(|db| db.set(Some(super::selected_db(ctx))));
    } else if event == Some(c"move_to") {
        if let Some(db) = MOVED_FROM_DB.with(|db| db.take()) {
            // SAFETY: ctx is live for this callback; db is a database Redis itself selected.
            unsafe { api!(RedisModule_SelectDb)(ctx, db) };
        }
    }
}

extern "C" fn on_client_change<E: ServerEvents>(
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
        E::client_closed(ctx, info.id);
    });
}

extern "C" fn on_role_change<E: ServerEvents>(
    ctx: Ctx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    guard::callback((), || {
        if subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_REPLICA {
            E::became_replica(ctx);
        }
    });
}

extern "C" fn on_async_load<E: ServerEvents>(
    ctx: Ctx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    guard::callback((), || {
        if subevent == raw::REDISMODULE_SUBEVENT_REPL_ASYNC_LOAD_COMPLETED {
            E::databases_replaced(ctx);
        }
    });
}

extern "C" fn on_server_event<E: ServerEvents>(
    ctx: Ctx,
    event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    guard::callback((), || {
        if event.id == raw::REDISMODULE_EVENT_FLUSHDB {
            if data.is_null() {
                return;
            }
            // SAFETY: for FLUSHDB events Redis passes a RedisModuleFlushInfo.
            let info = unsafe { &*data.cast::<raw::RedisModuleFlushInfo>() };
            let db = (info.dbnum >= 0).then_some(info.dbnum);
            match subevent {
                raw::REDISMODULE_SUBEVENT_FLUSHDB_START => E::flushing(ctx, db),
                raw::REDISMODULE_SUBEVENT_FLUSHDB_END => E::flushed(ctx, db),
                _ => {}
            }
        } else if event.id == raw::REDISMODULE_EVENT_SWAPDB && !data.is_null() {
            // SAFETY: for SWAPDB events Redis passes a RedisModuleSwapDbInfo.
            let info = unsafe { &*data.cast::<raw::RedisModuleSwapDbInfo>() };
            E::swapped(ctx, info.dbnum_first, info.dbnum_second);
        }
    });
}
