//! Changes made outside the module (DEL, UNLINK, expiry, eviction, RENAME, MOVE, FLUSHDB/FLUSHALL,
//! SWAPDB, Redisson's unlock script) must hand a lock to its waiters, and bound holds must follow
//! their keys. Keyspace and server events tell us (`ffi::events` carries them here); nothing is
//! written inside them: changes are noted and the runtime processes them from a 0 ms timer.

use std::ffi::CStr;

use lock_core::queue::LockKey;
use lock_core::scheduler::{Cause, Change};

use crate::ffi::events::{self as ffi_events, ServerEvents};
use crate::ffi::{bytes_of, selected_db, with_db, Ctx, Key, RawString};
use crate::runtime;
use crate::stats::{bump, STATS};

struct LockEvents;

/// Subscribes to every event the module needs; false if the server refused one.
pub fn subscribe(ctx: Ctx) -> bool {
    let subscribed = ffi_events::subscribe::<LockEvents>(ctx);
    runtime::set_reports_expiries(subscribed.key_events);
    subscribed.all
}

impl ServerEvents for LockEvents {
    fn keyspace(ctx: Ctx, event: Option<&CStr>, key: RawString) {
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

    /// If the key held a lock, a holder's lease ran out: counted and announced here, while
    /// Redis still has the key open.
    fn key_expired(ctx: Ctx, key: &Key) {
        if !matches!(crate::store::read_lock(key, None), Ok(Some(_))) {
            return;
        }
        bump(&STATS.expired);
        if let Some((name, db)) = key.name_and_db() {
            with_db(ctx, db, || {
                crate::notify::event(ctx, c"lock.expired", name.as_ptr());
            });
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
    }

    fn flushed(ctx: Ctx, db: Option<i32>) {
        runtime::flushed(ctx, db);
        runtime::notice(ctx, db.map_or(Change::All, Change::Db));
    }

    fn swapped(ctx: Ctx, a: i32, b: i32) {
        crate::store::swap_databases(a, b);
        runtime::databases_swapped(ctx, a, b);
        runtime::notice(ctx, Change::All);
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
