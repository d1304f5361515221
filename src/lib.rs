//! `lock`: native distributed locks for Redis.
//!
//! This file only registers: the module, its options, its INFO section, its commands and the
//! events it listens to. The lock rules live in the `lock-core` crate; see `commands/` for the
//! adapters, `runtime` for waiters and handoff, `wait/` for the blocking FFI.

#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::panic
    )
)]

use redis_module::configuration::ConfigurationFlags;
use redis_module::{redis_module, Context, InfoContext, RedisResult, RedisString, Status};

mod commands;
mod config;
mod events;
mod ffi;
mod guard;
mod log;
mod notify;
mod runtime;
mod stats;
mod store;
mod wait;

fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    guard::callback(Status::Err, || {
        let raw = ctx.ctx;
        if !required_api_present() {
            log::warning(
                "this Redis lacks module APIs the lock module needs (Redis >= 7.0 required)",
            );
            return Status::Err;
        }
        runtime::reset();
        stats::reset();
        log::attach(raw);
        if !commands::register(raw) || !events::subscribe(raw) {
            log::warning("could not register LOCK.* commands or events");
            log::detach();
            return Status::Err;
        }
        log::notice(&format!("lock module loaded: {}", config::describe()));
        Status::Ok
    })
}

fn required_api_present() -> bool {
    use redis_module::raw;
    // SAFETY: reading (copying) the API table RedisModule_Init filled in, on the main thread at
    // load. Every function the module calls through `api!` is in this list, so after a
    // successful load no call can find its pointer missing.
    unsafe {
        [
            { raw::RedisModule_AvoidReplicaTraffic }.is_some(),
            { raw::RedisModule_BlockClient }.is_some(),
            { raw::RedisModule_Call }.is_some(),
            { raw::RedisModule_CallReplyStringPtr }.is_some(),
            { raw::RedisModule_CloseKey }.is_some(),
            { raw::RedisModule_CreateCommand }.is_some(),
            { raw::RedisModule_CreateString }.is_some(),
            { raw::RedisModule_CreateStringFromLongLong }.is_some(),
            { raw::RedisModule_CreateTimer }.is_some(),
            { raw::RedisModule_DeleteKey }.is_some(),
            { raw::RedisModule_FreeCallReply }.is_some(),
            { raw::RedisModule_FreeString }.is_some(),
            { raw::RedisModule_FreeThreadSafeContext }.is_some(),
            { raw::RedisModule_GetAbsExpire }.is_some(),
            { raw::RedisModule_GetBlockedClientHandle }.is_some(),
            { raw::RedisModule_GetBlockedClientPrivateData }.is_some(),
            { raw::RedisModule_GetCommand }.is_some(),
            { raw::RedisModule_GetContextFlags }.is_some(),
            { raw::RedisModule_GetDetachedThreadSafeContext }.is_some(),
            { raw::RedisModule_GetSelectedDb }.is_some(),
            { raw::RedisModule_HashGet }.is_some(),
            { raw::RedisModule_HashSet }.is_some(),
            { raw::RedisModule_KeyType }.is_some(),
            { raw::RedisModule_Log }.is_some(),
            { raw::RedisModule_Milliseconds }.is_some(),
            { raw::RedisModule_NotifyKeyspaceEvent }.is_some(),
            { raw::RedisModule_OpenKey }.is_some(),
            { raw::RedisModule_PublishMessage }.is_some(),
            { raw::RedisModule_Replicate }.is_some(),
            { raw::RedisModule_ReplyWithError }.is_some(),
            { raw::RedisModule_ReplyWithLongLong }.is_some(),
            { raw::RedisModule_ReplyWithMap }.is_some(),
            { raw::RedisModule_ReplyWithArray }.is_some(),
            { raw::RedisModule_GetClientId }.is_some(),
            { raw::RedisModule_ReplyWithNull }.is_some(),
            { raw::RedisModule_ReplyWithStringBuffer }.is_some(),
            { raw::RedisModule_ScanCursorCreate }.is_some(),
            { raw::RedisModule_ScanCursorDestroy }.is_some(),
            { raw::RedisModule_ScanKey }.is_some(),
            { raw::RedisModule_SelectDb }.is_some(),
            { raw::RedisModule_SetAbsExpire }.is_some(),
            { raw::RedisModule_SetCommandInfo }.is_some(),
            { raw::RedisModule_SetDisconnectCallback }.is_some(),
            { raw::RedisModule_StopTimer }.is_some(),
            { raw::RedisModule_StringDMA }.is_some(),
            { raw::RedisModule_StringPtrLen }.is_some(),
            { raw::RedisModule_StringSet }.is_some(),
            { raw::RedisModule_StringTruncate }.is_some(),
            { raw::RedisModule_SubscribeToKeyspaceEvents }.is_some(),
            { raw::RedisModule_SubscribeToServerEvent }.is_some(),
            { raw::RedisModule_UnblockClient }.is_some(),
            { raw::RedisModule_ValueLength }.is_some(),
        ]
        .iter()
        .all(|present| *present)
    }
}

/// Refuses MODULE UNLOAD while clients wait or deadlines are pending: their callbacks point into
/// this library.
fn deinit(ctx: &Context) -> Status {
    guard::callback(Status::Err, || {
        if !runtime::idle() {
            log::warning("MODULE UNLOAD refused: clients are waiting for locks");
            return Status::Err;
        }
        if let Some(why) = ffi::client_list(ctx.ctx)
            .as_deref()
            .and_then(lock_core::unload::blocker)
        {
            log::warning(&format!("MODULE UNLOAD refused: {why}"));
            return Status::Err;
        }
        store::release_cached_names();
        config::release_strings();
        log::detach();
        Status::Ok
    })
}

fn lock_info(ctx: &InfoContext, _for_crash_report: bool) {
    guard::callback((), || {
        stats::write_info(
            ctx.ctx,
            runtime::waiting_gauges(),
            runtime::reports_expiries(),
        )
    });
}

redis_module! {
    name: "lock",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    init: init,
    deinit: deinit,
    info: lock_info,
    configurations: [
        i64: [
            ["max-lease-ms", &config::MAX_LEASE_MS, config::DEFAULT_MAX_LEASE_MS, 1, config::CEILING_MAX_LEASE_MS, ConfigurationFlags::DEFAULT, None],
            ["max-waiters-per-key", &config::MAX_WAITERS_PER_KEY, config::DEFAULT_MAX_WAITERS_PER_KEY, 1, 100_000_000, ConfigurationFlags::DEFAULT, None],
        ],
        string: [
            ["unlock-channel-prefix", &config::UNLOCK_CHANNEL_PREFIX, config::DEFAULT_UNLOCK_CHANNEL_PREFIX, ConfigurationFlags::DEFAULT, None],
            ["unlock-message", &config::UNLOCK_MESSAGE, config::DEFAULT_UNLOCK_MESSAGE, ConfigurationFlags::DEFAULT, None],
        ],
        bool: [
            ["keyspace-events", &config::KEYSPACE_EVENTS, true, ConfigurationFlags::DEFAULT, None],
        ],
        enum: [],
        module_args_as_configuration: true,
    ]
}
