//! What the module tells the outside world: keyspace events on the lock key, and the unlock
//! message on the lock's channel (Redisson's naming, so Redisson waiters wake up too).

use std::cell::RefCell;
use std::ffi::CStr;

use lock_core::channel::write_unlock_channel;

use crate::config;
use crate::ffi::{self, Ctx, OwnedString, RawString};

/// Emits `event` on the lock key as a hash-class keyspace event (`notify-keyspace-events` with
/// `h`, or `A`, delivers it).
pub fn event(ctx: Ctx, event: &CStr, key_name: RawString) {
    if !config::keyspace_events() {
        return;
    }
    ffi::notify_hash_event(ctx, event, key_name);
}

/// Publishes the unlock message when a lock becomes free and nobody waits for it. Every release
/// does this, so it allocates one string (the channel's): the name is built in a reused buffer
/// and the message is the Redis string its option keeps.
pub fn publish_unlock(ctx: Ctx, _key_name: RawString, name: &[u8]) {
    CHANNEL.with(|buffer| {
        let mut buffer = buffer.borrow_mut();
        let publish = config::UNLOCK_CHANNEL_PREFIX
            .with_text(|prefix| write_unlock_channel(prefix.as_bytes(), name, &mut buffer));
        if !publish {
            return;
        }
        let channel = OwnedString::new(&buffer);
        let message = config::UNLOCK_MESSAGE.as_redis_string();
        // The message is the option's own string, freed only by a CONFIG SET or unload,
        // neither of which can run during this call.
        ffi::publish(ctx, channel.as_ptr(), message);
    });
}

thread_local! {
    /// The unlock channel's name, built here for each publish.
    static CHANNEL: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}
