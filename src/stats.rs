//! Counters for `INFO lock`. Updated on Redis's main thread only; atomics keep them `Sync`
//! without locks (a relaxed add costs a few cycles).

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($name:ident: $doc:literal,)*) => {
        pub struct Stats { $(#[doc = $doc] pub $name: AtomicU64,)* }
        pub static STATS: Stats = Stats { $($name: AtomicU64::new(0),)* };
        impl Stats {
            /// (field name, value) for every counter, in declaration order.
            pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name.load(Ordering::Relaxed)),)*]
            }

            fn zero(&self) {
                $(self.$name.store(0, Ordering::Relaxed);)*
            }
        }
    };
}

counters! {
    acquired: "Holds taken at once (not through a wait), of every kind.",
    acquired_shared: "Of those, shared holds (SHARED).",
    acquired_permits: "Of those, semaphore permits (LIMIT n).",
    downgraded: "Exclusive holders that also took their key SHARED.",
    reentered: "Re-entrant acquires by the current holder.",
    contended: "LOCK.ACQUIRE calls that found the lock held by another owner or waiters queued.",
    acquire_nil: "Non-blocking LOCK.ACQUIRE calls answered nil.",
    waits_started: "LOCK.ACQUIRE ... WAIT calls that blocked.",
    waits_ticketed: "LOCK.ACQUIRE/MACQUIRE/CAMPAIGN ... WAIT ... TICKET calls that queued a ticket.",
    tickets_taken: "Ticket grants LOCK.CANCEL took before they were popped (the canceller holds them).",
    ticket_grants_lapsed: "Ticket grants nobody popped before their lease ended (the ticket says expired).",
    handoffs: "Locks handed to the head waiter on release, expiry or removal.",
    released: "Full releases (the last re-entry released).",
    released_partial: "Releases that counted one re-entry down.",
    release_not_owner: "LOCK.RELEASE calls answered nil (the caller did not hold the lock).",
    renewed: "Successful LOCK.RENEW calls.",
    renew_not_owner: "LOCK.RENEW calls answered 0 (the caller did not hold the lock: often a lost lease).",
    force_released: "Locks removed by LOCK.FORCERELEASE.",
    expired: "Held leases that ran out (only on servers with the key server event: Redis >= 7.2, Valkey).",
    expired_with_waiters: "Held leases that ran out while waiters were queued (the holder lost the lock).",
    holds_expired: "Holds of shared or semaphore keys whose own lease ran out (removed by the module; the other holds stay).",
    disconnected: "EPHEMERAL holds ended because their connection closed.",
    wait_timeouts: "Waiters answered nil because their WAIT timeout passed.",
    wait_cancelled: "Waiters that left the queue by disconnect or CLIENT UNBLOCK.",
    wait_replaced: "Waiters whose owner asked again for the same lock while they waited (a client that gave up and retried): the newer request took their place.",
    wait_redirected: "Waiters answered ASK/MOVED because their lock key left this node with its cluster slot.",
    abandoned_grants: "Grants whose client vanished before the reply; the lock went on.",
    wait_time_ms: "Total milliseconds waiters spent queued before being granted.",
    guarded: "LOCK.GUARD calls whose hold admitted the token: the command was run (or refused by Redis's own rules: ACL, script rules, maxmemory).",
    fenced: "LOCK.GUARD calls refused FENCED (the hold gone or its token not current): nothing ran.",
    errors: "LOCK.* calls refused with an error.",
}

/// Zeroes every counter at load: a library reloaded by MODULE UNLOAD/LOAD may keep its statics,
/// and INFO's counters are "since the module was loaded".
pub fn reset() {
    STATS.zero();
}

pub fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

pub fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// What INFO shows of the waiting: waiters (blocked and tickets), locks with waiters, holds
/// bound to connections, tickets not yet done.
pub struct Gauges {
    pub waiters: usize,
    pub keys: usize,
    pub bound: usize,
    pub tickets: usize,
}

/// Writes the `lock` section of INFO: the counters, then the gauges the caller read (clients
/// blocked in LOCK.ACQUIRE ... WAIT right now, and on how many locks).
pub fn write_info(
    ctx: *mut redis_module::raw::RedisModuleInfoCtx,
    gauges: Gauges,
    counts_expiries: bool,
) {
    use redis_module::raw;
    if raw::add_info_section(ctx, None) != raw::Status::Ok {
        return;
    }
    for (name, value) in STATS.snapshot() {
        // Without the key server event (Redis 7.0) expiries are not seen: no field, rather
        // than a 0 that would look like a count.
        if name == "expired" && !counts_expiries {
            continue;
        }
        raw::add_info_field_unsigned_long_long(ctx, name, value);
    }
    raw::add_info_field_unsigned_long_long(ctx, "waiters", gauges.waiters as u64);
    raw::add_info_field_unsigned_long_long(ctx, "locks_with_waiters", gauges.keys as u64);
    raw::add_info_field_unsigned_long_long(ctx, "ephemeral_holds", gauges.bound as u64);
    raw::add_info_field_unsigned_long_long(ctx, "tickets", gauges.tickets as u64);
}
