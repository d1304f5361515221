//! Changes made outside the module (DEL, UNLINK, expiry, eviction, RENAME, MOVE, FLUSHDB/FLUSHALL,
//! SWAPDB, Redisson's unlock script) must hand a lock to its waiters, and bound holds must follow
//! their keys, and holders whose key is removed or replaced from outside (or whose database is
//! flushed) must be told they lost it. Keyspace and server events tell us (`ffi::events` carries them here); nothing is written
//! inside them: changes are noted and the runtime processes them from a 0 ms timer (a lost-hold
//! message is published at once: it writes no key).

use std::ffi::CStr;

use lock_core::hold::{Lost, LostReason};
use lock_core::layout::is_reserved_key;
use lock_core::queue::LockKey;
use lock_core::scheduler::{Cause, Change};
use lock_core::signal::KeyGone;

use crate::ffi::events::{self as ffi_events, KeyRemoved, ServerEvents};
use crate::ffi::{bytes_of, now_ms, selected_db, with_db, Ctx, Key, KeyKind, RawString};
use crate::runtime::TicketGone;
use crate::stats::{bump, STATS};
use crate::{notify, runtime, store};

struct LockEvents;

/// Subscribes to every event the module needs; false if the server refused one.
pub fn subscribe(ctx: Ctx) -> bool {
    let subscribed = ffi_events::subscribe::<LockEvents>(ctx);
    runtime::set_reports_expiries(subscribed.key_events);
    subscribed.all
}

impl ServerEvents for LockEvents {
    fn keyspace(ctx: Ctx, event: Option<&CStr>, key: RawString) {
        // The module's own keys (token counters, proclamations, tickets) are never locks. A
        // ticket that goes (`del`) was delivered, where the server cannot tell a pop that took
        // its last element from a client's `DEL` (Redis 7.0); elsewhere `key_removed` tells.
        if is_reserved_key(bytes_of(&key)) {
            if event == Some(c"del") && !runtime::reports_expiries() {
                runtime::ticket_gone(ctx, bytes_of(&key), TicketGone::Popped);
            }
            return;
        }
        if runtime::any_bound() {
            follow_bound_holds(ctx, event, key);
        }
        // Every generic event in the server comes here: do nothing unless someone waits on a
        // key of this name.
        let name = bytes_of(&key);
        if runtime::may_concern_waiters(name) {
            let key = LockKey::new(selected_db(ctx), name);
            let cause = if event == Some(c"expired") {
                Cause::LeaseEnded
            } else {
                Cause::Freed
            };
            runtime::notice(ctx, Change::Key(key, cause));
        }
    }

    /// A key goes (Redis >= 7.2, Valkey), still open here. If it held a lock: an expiry is
    /// counted and announced, and — unless the module itself is deleting it (a release, a
    /// force release or a handoff tells its holders itself) — its holders are told: the one
    /// hold of a small key by name, the holds of a key with several by one message for the key
    /// (read in O(1): this runs inside the command that removes the key, which may remove many).
    /// A key that leaves with its slot (`MIGRATE` in a cluster reshard) is not lost: its
    /// holders are told it moved.
    fn key_removed(ctx: Ctx, key: &Key, why: KeyRemoved) {
        // A ticket (a list) going, still open here: emptied by a pop, or moved with its slot,
        // its grant was delivered; still holding its element (`DEL`, `UNLINK`, `RENAME`,
        // overwritten, evicted), it was taken away unpopped. One that expires reaches its lease end (the scheduler's own
        // deadline looks at it).
        if why != KeyRemoved::Expired
            && runtime::any_tickets()
            && !store::deleting()
            && key.kind() == KeyKind::List
        {
            if let Some((name, db)) = key.name_and_db() {
                // One deleted with its element because its slot left (`MIGRATE` in a reshard)
                // went on with its grant: popped on the node it moved to, as delivered here.
                // Written again here, it would stand beside the moved one (the reshard's next
                // `MIGRATE` of the slot's keys then fails `BUSYKEY`).
                let moved =
                    why == KeyRemoved::Deleted && runtime::slot_left(ctx, name.bytes()).is_some();
                let gone = if key.len() == 0 || moved {
                    TicketGone::Popped
                } else {
                    TicketGone::TakenAway
                };
                with_db(ctx, db, || runtime::ticket_gone(ctx, name.bytes(), gone));
            }
            return;
        }
        let expired = why == KeyRemoved::Expired;
        let tell = !store::deleting() && notify::lost_enabled();
        if !expired && !tell {
            return;
        }
        let Some(peek) = store::peek_lock(key) else {
            return;
        };
        let Some((name, db)) = key.name_and_db() else {
            return;
        };
        if is_reserved_key(name.bytes()) {
            return;
        }
        if expired {
            bump(&STATS.expired);
            with_db(ctx, db, || {
                notify::event(ctx, c"lock.expired", name.as_ptr());
            });
        }
        if !tell {
            return;
        }
        let gone = match why {
            KeyRemoved::Deleted if runtime::slot_left(ctx, name.bytes()).is_some() => {
                KeyGone::Moved
            }
            KeyRemoved::Deleted => KeyGone::Deleted,
            KeyRemoved::Expired => KeyGone::Expired,
            KeyRemoved::Evicted => KeyGone::Evicted,
            KeyRemoved::Overwritten => KeyGone::Overwritten,
        };
        match (peek, gone.lost_reason()) {
            (store::Peek::Lock(lock), Some(reason)) => {
                let now = now_ms();
                for hold in &lock.holds {
                    // A hold whose own lease had ended was lost to that, whatever removes it now.
                    let reason = if hold.ended(now) {
                        LostReason::Expired
                    } else {
                        reason
                    };
                    notify::publish_lost(ctx, db, name.bytes(), &Lost::of(hold, reason));
                }
            }
            (store::Peek::Lock(lock), None) if lock.holds.is_empty() => {}
            _ => notify::publish_key_gone(ctx, db, name.bytes(), gone),
        }
    }

    /// Its EPHEMERAL holds end (from the inbox timer, see `runtime::connection_closed`).
    fn client_closed(ctx: Ctx, client: u64) {
        runtime::connection_closed(ctx, client);
    }

    /// A failover or REPLICAOF: no connection here binds a hold any more, so a later promotion
    /// back does not revive bindings to connections of the past.
    fn became_replica(ctx: Ctx) {
        runtime::forget_bindings(ctx);
        store::forget_windows();
    }

    /// What the token counters about to go hold is kept, to write back after the flush.
    fn flushing(ctx: Ctx, db: Option<i32>) {
        store::flushing(ctx, db);
    }

    /// The flush names no keys: the holders hear one message per flush and check their holds.
    fn flushed(ctx: Ctx, db: Option<i32>) {
        notify::publish_flushed(ctx, db);
        store::flushed(db);
        runtime::flushed(ctx, db);
        runtime::notice(ctx, db.map_or(Change::All, Change::Db));
    }

    fn swapped(ctx: Ctx, a: i32, b: i32) {
        crate::store::swap_databases(a, b);
        runtime::databases_swapped(ctx, a, b);
        runtime::notice(ctx, Change::All);
    }

    /// What the module keeps about the data goes with it, as after `FLUSHALL`: the bindings
    /// of holds in the old databases and the token windows reserved in their counters (a
    /// hold or counter of the master's data that looks the same is not the one they were
    /// about), and waiters look at their keys again. A replica publishes nothing.
    fn databases_replaced(ctx: Ctx) {
        Self::flushed(ctx, None);
    }
}

/// `MOVE` and `RENAME` announce the key leaving (`move_from`, `rename_from`) and then arriving
/// (`move_to`, `rename_to`): the holds bound to connections follow it. The key is only read.
fn follow_bound_holds(ctx: Ctx, event: Option<&CStr>, key: RawString) {
    let Some(event) = event else {
        return;
    };
    if event == c"move_from" || event == c"rename_from" {
        runtime::key_leaving(LockKey::new(selected_db(ctx), bytes_of(&key)));
    } else if event == c"move_to" || event == c"rename_to" {
        let to = LockKey::new(selected_db(ctx), bytes_of(&key));
        let opened = Key::open_read(ctx, key);
        let tokens: Vec<u64> = match crate::store::read_lock(&opened, None) {
            Ok(Some(stored)) => stored.lock.holds.iter().filter_map(|h| h.token).collect(),
            _ => Vec::new(),
        };
        drop(opened);
        runtime::key_arrived(ctx, to, &tokens);
    }
}
