//! What the module tells the outside world: keyspace events on the lock key, the unlock message
//! on the lock's channel (Redisson's naming, so Redisson waiters wake up too), and the lost-hold
//! message to a holder that lost its hold.

use std::cell::RefCell;
use std::ffi::CStr;

use lock_core::channel::write_unlock_channel;
use lock_core::hold::Lost;
use lock_core::signal::{self, KeyGone};

use crate::config::{self, StringOption};
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
///
/// Where Redisson listens decides how. Redisson 3.x (`PublishSubscribeService.subscribeNoTimeout`
/// in `redisson/src/main/java/org/redisson/pubsub/PublishSubscribeService.java`, which the
/// `LockPubSub` of an `RLock` waiter goes through) sends `SSUBSCRIBE` when its
/// `shardingSupported` flag is set and `SUBSCRIBE` otherwise; only `ClusterConnectionManager` sets
/// the flag, so a standalone, sentinel or replicated Redisson always uses `SUBSCRIBE`. In cluster
/// mode Redisson 3.22.0 to 3.28 set it when a Redis 7.0 command answers at connect (`SPUBLISH ""
/// ""`, later `PUBSUB SHARDNUMSUB`); since 3.29.0 the cluster setting `shardedSubscriptionMode`
/// decides: `AUTO` (the default: that probe), `ON` or `OFF`. So:
/// - standalone: `PUBLISH` only, as before (no Redisson client shard-subscribes there);
/// - cluster: `SPUBLISH` for Redisson ≥ 3.22 with sharding, which `SSUBSCRIBE`s on the node
///   that serves the channel's slot, the lock key's slot (`prefix:{key}` hashes like the key,
///   unless the key has a stray `{` or `}` and no hash tag: Redisson's own unlock script, which
///   declares key and channel, is refused `CROSSSLOT` for such a key);
///   and `PUBLISH` as well, for Redisson before 3.22 or with `shardedSubscriptionMode = OFF` and
///   other clients that `SUBSCRIBE`. A client subscribed both ways would get the message twice.
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
        if ffi::is_cluster(ctx) {
            ffi::publish_shard(ctx, channel.as_ptr(), message);
        }
    });
}

/// Tells the holder of a hold it lost (by anything but its own `LOCK.RELEASE`): on
/// `<lock.lost-channel-prefix>:{<key>}` (the unlock channel's naming, so the channel hashes to
/// the key's slot), the message `<reason> <db> <token> <keylen> <key> <owner>`
/// (`lock_core::signal`). `PUBLISH` on a standalone server; in cluster mode `SPUBLISH` only, so
/// it goes to the key's shard and is never broadcast to every node (clients `SSUBSCRIBE` on the
/// key's node). Pub/sub delivers at most once: a client library still renews and treats a
/// refused renewal as the loss.
///
/// Not on a replica or while the server loads its data. Only the rare paths call this (a force
/// release, a lease end, a closed connection, a key removed or replaced from outside): a release
/// by the owner publishes nothing here.
pub fn publish_lost(ctx: Ctx, db: i32, name: &[u8], lost: &Lost) {
    // A replica applies its master's effects (the master told the holders already), and a
    // server loading its data replays history: neither tells anyone anything.
    if !may_tell(ctx) {
        return;
    }
    let message = signal::lost_hold(db, name, lost);
    publish_on_key_channel(ctx, &config::LOST_CHANNEL_PREFIX, name, &message);
}

/// Tells every holder of a key that went from outside the module (or, `KeyGone::Moved`, left
/// this node with its slot) with one message, `<reason> <db> * <keylen> <key>`, however many
/// holds it had: the holders check theirs with a read. Same channel and rules as
/// [`publish_lost`].
pub fn publish_key_gone(ctx: Ctx, db: i32, name: &[u8], why: KeyGone) {
    if !may_tell(ctx) {
        return;
    }
    let message = signal::key_gone(db, name, why);
    publish_on_key_channel(ctx, &config::LOST_CHANNEL_PREFIX, name, &message);
}

/// Whether this server tells anyone anything: a replica applies its master's effects (the
/// master told them already), and a server loading its data replays history.
fn may_tell(ctx: Ctx) -> bool {
    !ffi::is_replica(ctx) && !ffi::is_loading(ctx)
}

/// Publishes `message` on `<prefix>:{<key>}` (nothing when the prefix is empty): `PUBLISH` on a
/// standalone server, `SPUBLISH` in cluster mode, to the key's shard only.
fn publish_on_key_channel(ctx: Ctx, prefix: &StringOption, name: &[u8], message: &[u8]) {
    let mut channel = Vec::new();
    if !prefix.with_text(|prefix| write_unlock_channel(prefix.as_bytes(), name, &mut channel)) {
        return;
    }
    let channel = OwnedString::new(&channel);
    let message = OwnedString::new(message);
    if ffi::is_cluster(ctx) {
        ffi::publish_shard(ctx, channel.as_ptr(), message.as_ptr());
    } else {
        ffi::publish(ctx, channel.as_ptr(), message.as_ptr());
    }
}

/// Tells every holder in a flushed database that its holds may be gone: one message
/// `flushed <db>` (`flushed all` for `FLUSHALL`) on `<lock.lost-channel-prefix>:flush`. A flush
/// names no keys, and walking the keyspace for locks would stall the server, so the message names
/// none either: a library that hears it checks each of its holds in that database with one read
/// (`LOCK.INFO`). The channel has no `{`, and a key's channel always has one, so no key's channel
/// can be this one. `PUBLISH` in cluster mode too (a broadcast to every node): a flush is rare,
/// it flushes one node, and any node's subscribers hear it wherever they subscribed.
///
/// Not on a replica (its master told the holders) or while the server loads its data.
pub fn publish_flushed(ctx: Ctx, db: Option<i32>) {
    if !may_tell(ctx) {
        return;
    }
    let Some(channel) = config::LOST_CHANNEL_PREFIX
        .with_text(|prefix| (!prefix.is_empty()).then(|| format!("{prefix}:flush").into_bytes()))
    else {
        return;
    };
    let message = match db {
        Some(db) => format!("flushed {db}"),
        None => "flushed all".to_string(),
    };
    let channel = OwnedString::new(&channel);
    let message = OwnedString::new(message.as_bytes());
    ffi::publish(ctx, channel.as_ptr(), message.as_ptr());
}

/// Tells the observers of an election key (`elected <db> <epoch> <keylen> <key> <candidate>`,
/// `proclaimed <db> <epoch> <keylen> <key> <value>`, built by `lock_core::signal`) on
/// `<lock.leader-channel-prefix>:{<key>}`: `PUBLISH` on a standalone server,
/// `SPUBLISH` in cluster mode (to the key's shard only, as the lost-hold message). Messages of
/// one key are published in the order its leaders changed, by the one thread that changes them.
/// Not on a replica (its master told the observers) or while the server loads its data.
pub fn publish_leader(ctx: Ctx, name: &[u8], message: &[u8]) {
    if may_tell(ctx) {
        publish_on_key_channel(ctx, &config::LEADER_CHANNEL_PREFIX, name, message);
    }
}

/// Whether lost-hold messages are sent (`lock.lost-channel-prefix` is not empty).
pub fn lost_enabled() -> bool {
    config::LOST_CHANNEL_PREFIX.with_text(|prefix| !prefix.is_empty())
}

thread_local! {
    /// The unlock channel's name, built here for each publish.
    static CHANNEL: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}
