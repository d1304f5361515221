//! What the module tells the outside world: keyspace events on the lock key, and the unlock
//! message on the lock's channel (Redisson's naming, so Redisson waiters wake up too).

use std::ffi::CStr;
use std::os::raw::c_int;

use lock_core::channel::unlock_channel;
use redis_module::raw;

use crate::config;
use crate::ffi::{api, Ctx, OwnedString, RawString};

/// Emits `event` on the lock key as a hash-class keyspace event (`notify-keyspace-events` with
/// `h`, or `A`, delivers it).
pub fn event(ctx: Ctx, event: &CStr, key_name: RawString) {
    if !config::keyspace_events() {
        return;
    }
    // SAFETY: ctx and key_name are live; Redis copies the event name and key.
    unsafe {
        api!(RedisModule_NotifyKeyspaceEvent)(
            ctx,
            raw::REDISMODULE_NOTIFY_HASH as c_int,
            event.as_ptr(),
            key_name,
        );
    }
}

/// Publishes the unlock message when a lock becomes free and nobody waits for it.
pub fn publish_unlock(ctx: Ctx, _key_name: RawString, name: &[u8]) {
    let (prefix, message) = config::unlock_publication();
    let Some(channel) = unlock_channel(prefix.as_bytes(), name) else {
        return;
    };
    let channel = OwnedString::new(&channel);
    let message = OwnedString::new(message.as_bytes());
    // SAFETY: both strings are live for the call; Redis copies what it delivers.
    unsafe {
        api!(RedisModule_PublishMessage)(ctx, channel.as_ptr(), message.as_ptr());
    }
}
