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
mod election;
mod events;
mod ffi;
use ffi::guard;
use ffi::log;
mod notify;
mod runtime;
mod stats;
mod store;

/// The module's version as `MODULE LIST` shows it: `major * 10000 + minor * 100 + patch` of the
/// crate's version (0.2.0 is 200).
const MODULE_VERSION: i32 = version_number(
    env!("CARGO_PKG_VERSION_MAJOR"),
    env!("CARGO_PKG_VERSION_MINOR"),
    env!("CARGO_PKG_VERSION_PATCH"),
);

const fn version_number(major: &str, minor: &str, patch: &str) -> i32 {
    // Evaluated at compile time: a version part that is not digits fails the build.
    const fn number(text: &str) -> i32 {
        let mut digits = text.as_bytes();
        let mut value = 0;
        while let [digit, rest @ ..] = digits {
            assert!(digit.is_ascii_digit(), "a version part is not a number");
            value = value * 10 + (*digit - b'0') as i32;
            digits = rest;
        }
        value
    }
    number(major) * 10_000 + number(minor) * 100 + number(patch)
}

fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    guard::callback(Status::Err, || {
        let raw = ctx.ctx;
        if !ffi::required_api_present() {
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
        // Subscribed to the async load's end (`events`: `databases_replaced`): a replica may
        // load a full sync beside the data it serves (`repl-diskless-load swapdb`).
        ffi::events::declare_async_load_aware(raw);
        log::notice(&format!("lock module loaded: {}", config::describe()));
        Status::Ok
    })
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
    version: MODULE_VERSION,
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
            ["lost-channel-prefix", &config::LOST_CHANNEL_PREFIX, config::DEFAULT_LOST_CHANNEL_PREFIX, ConfigurationFlags::DEFAULT, None],
            ["leader-channel-prefix", &config::LEADER_CHANNEL_PREFIX, config::DEFAULT_LEADER_CHANNEL_PREFIX, ConfigurationFlags::DEFAULT, None],
        ],
        bool: [
            ["keyspace-events", &config::KEYSPACE_EVENTS, true, ConfigurationFlags::DEFAULT, None],
        ],
        enum: [],
        module_args_as_configuration: true,
    ]
}
