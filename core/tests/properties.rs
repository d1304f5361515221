//! Property tests for everything in lock-core that reads client input or stored data: the
//! argument parser, the classification of a stored hash, the acquire/release/renew decisions
//! and the token counter. Random inputs (biased towards the edge values that broke things
//! before) must never panic, and every accepted result must respect the limits the module
//! relies on when it writes. Bounded: a few thousand cases, a second or two.

use lock_core::args::{parse_acquire, parse_key_only, parse_release, parse_renew, Wait};
use lock_core::layout::{is_reserved_key, FENCE_FIELD, MAX_STORED_INTEGER, MODE_FIELD};
use lock_core::state::{
    classify, decide_acquire, decide_release, decide_renew, may_be_a_lock, AcquireDecision, Queue,
    ReleaseDecision, RenewDecision, Stored, StoredHolder, View,
};
use lock_core::token::SlotMemory;
use lock_core::LockError;
use proptest::prelude::*;

const MAX_LEASE: u64 = 2_592_000_000;

/// One argument: mostly the words and numbers that matter, sometimes any bytes.
fn word() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"".to_vec()),
        Just(b"WAIT".to_vec()),
        Just(b"wait".to_vec()),
        Just(b"0".to_vec()),
        Just(b"1".to_vec()),
        Just(b"-1".to_vec()),
        Just(b"-0".to_vec()),
        Just(b"+5".to_vec()),
        Just(b"007".to_vec()),
        Just(b"2592000000".to_vec()),
        Just(b"2592000001".to_vec()),
        Just(b"9223372036854775807".to_vec()),
        Just(b"9223372036854775808".to_vec()),
        Just(b"-9223372036854775808".to_vec()),
        Just(b"99999999999999999999".to_vec()),
        Just(b"3153600000000".to_vec()),
        Just(b"3153600000001".to_vec()),
        Just(FENCE_FIELD.to_vec()),
        Just(b"__lock_fence__{foo}".to_vec()),
        Just(b"__lock_fence__".to_vec()),
        Just(b"k".to_vec()),
        Just(b"owner".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..24),
        "[0-9]{1,21}".prop_map(String::into_bytes),
    ]
}

fn command_line() -> impl Strategy<Value = Vec<Vec<u8>>> {
    (
        prop_oneof![
            Just(b"LOCK.ACQUIRE".to_vec()),
            Just(b"lock.release".to_vec()),
            Just(b"LOCK.RENEW".to_vec()),
            Just(b"LOCK.INFO".to_vec()),
        ],
        proptest::collection::vec(word(), 0..9),
    )
        .prop_map(|(name, mut rest)| {
            rest.insert(0, name);
            rest
        })
}

fn positive_text() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"1".to_vec()),
        Just(b"0".to_vec()),
        Just(b"-3".to_vec()),
        Just(b"x".to_vec()),
        Just(b"9223372036854775807".to_vec()),
        Just(b"9223372036854775808".to_vec()),
        (1u64..=MAX_STORED_INTEGER).prop_map(|n| n.to_string().into_bytes()),
        proptest::collection::vec(any::<u8>(), 0..12),
    ]
}

/// A stored hash: its field count, the fence value, and the holder's field name, count and
/// whether the holder is the requester.
type StoredHash = (usize, Option<Vec<u8>>, Option<(Vec<u8>, Vec<u8>, bool)>);

fn field_name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"owner".to_vec()),
        Just(MODE_FIELD.to_vec()),
        proptest::collection::vec(any::<u8>(), 1..12),
    ]
}

fn stored() -> impl Strategy<Value = StoredHash> {
    (
        prop_oneof![Just(0usize), Just(1), Just(2), Just(3), any::<usize>()],
        proptest::option::of(positive_text()),
        proptest::option::of((field_name(), positive_text(), any::<bool>())),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4_000, ..ProptestConfig::default() })]

    /// The parser never panics, and what it accepts is what the module may act on: a key
    /// outside the counter namespace, a real owner, a lease within bounds, a bounded wait.
    #[test]
    fn the_parser_accepts_only_what_the_module_can_act_on(line in command_line()) {
        let argv: Vec<&[u8]> = line.iter().map(Vec::as_slice).collect();
        if let Ok(r) = parse_acquire(&argv, MAX_LEASE) {
            prop_assert!(!is_reserved_key(r.key));
            prop_assert!(!r.owner.is_empty() && r.owner != FENCE_FIELD);
            prop_assert!((1..=MAX_LEASE).contains(&r.lease_ms));
            if let Wait::For(ms) = r.wait {
                prop_assert!(ms > 0 && ms <= lock_core::args::MAX_WAIT_TIMEOUT_MS);
            }
            prop_assert!(argv.len() == 4 || argv.len() == 6);
        }
        if let Ok(r) = parse_release(&argv) {
            prop_assert!(!is_reserved_key(r.key) && !r.owner.is_empty());
            prop_assert_eq!(argv.len(), 3);
        }
        if let Ok(r) = parse_renew(&argv, MAX_LEASE) {
            prop_assert!(!is_reserved_key(r.key));
            prop_assert!((1..=MAX_LEASE).contains(&r.lease_ms));
        }
        if let Ok(key) = parse_key_only(&argv) {
            prop_assert!(!is_reserved_key(key));
            prop_assert_eq!(argv.len(), 2);
        }
        // Every refusal has a one-line reply starting with a Redis error code.
        for e in [
            parse_acquire(&argv, MAX_LEASE).err(),
            parse_release(&argv).err(),
            parse_renew(&argv, MAX_LEASE).err(),
            parse_key_only(&argv).err(),
        ].into_iter().flatten() {
            let reply = e.reply();
            prop_assert!(reply.starts_with("ERR ") || reply.starts_with("WRONGTYPE "));
            prop_assert!(!reply.contains('\r') && !reply.contains('\n'));
        }
    }

    /// Classification never panics, refuses any hash that cannot be a lock, and reports
    /// counts and tokens the module can store and send back.
    #[test]
    fn classification_is_total_and_within_limits((fields, fence, holder) in stored()) {
        let view = classify(Stored::Hash {
            fields,
            fence: fence.as_deref(),
            holder: holder.as_ref().map(|(field, count, is_requester)| StoredHolder {
                field,
                count,
                is_requester: *is_requester,
            }),
        });
        match view {
            Ok(View::Free) => prop_assert!(false, "a hash is never free"),
            Ok(View::HeldByRequester { count, token }) | Ok(View::HeldByOther { count, token }) => {
                prop_assert!(may_be_a_lock(fields));
                prop_assert!(holder.as_ref().is_some_and(|(field, _, _)| field.as_slice() != MODE_FIELD));
                prop_assert!((1..=MAX_STORED_INTEGER).contains(&count));
                prop_assert!(token.is_none_or(|t| (1..=MAX_STORED_INTEGER).contains(&t)));
                prop_assert_eq!(fields, 1 + usize::from(token.is_some()));
            }
            Err(e) => prop_assert_eq!(e, LockError::NotALock),
        }
    }

    /// The decisions never panic and never produce a count, token or time the store cannot
    /// hold: a re-entry at the limit is an error, never a saturated count.
    #[test]
    fn decisions_stay_within_limits(
        count in prop_oneof![1u64..5, (MAX_STORED_INTEGER - 3)..=MAX_STORED_INTEGER],
        token in proptest::option::of(1u64..=MAX_STORED_INTEGER),
        mine in any::<bool>(),
        waiting in any::<bool>(),
        lease in 1u64..=MAX_LEASE,
        now in 0u64..=4_102_444_800_000,
    ) {
        let view = if mine {
            View::HeldByRequester { count, token }
        } else {
            View::HeldByOther { count, token }
        };
        let queue = if waiting { Queue::Waiting } else { Queue::Empty };
        match decide_acquire(view, queue, lease, lock_core::args::Reentry::Counted, now) {
            Ok(AcquireDecision::Reenter { count: next, expires_at, .. }) => {
                prop_assert!(mine);
                prop_assert_eq!(next, count + 1);
                prop_assert!(next <= MAX_STORED_INTEGER);
                prop_assert_eq!(expires_at, now + lease);
            }
            Ok(AcquireDecision::Busy) => prop_assert!(!mine),
            Ok(AcquireDecision::Take { .. }) => prop_assert!(false, "a held lock is never taken"),
            Err(e) => {
                prop_assert_eq!(e, LockError::CountOverflow);
                prop_assert_eq!(count, MAX_STORED_INTEGER);
            }
        }
        match decide_release(view) {
            ReleaseDecision::CountDown { remaining } => prop_assert!(mine && remaining == count - 1),
            ReleaseDecision::Free => prop_assert!(mine && count == 1),
            ReleaseDecision::NotOwner => prop_assert!(!mine),
        }
        match decide_renew(view, lease, now) {
            RenewDecision::Extend { expires_at } => prop_assert!(mine && expires_at == now + lease),
            RenewDecision::NotOwner => prop_assert!(!mine),
        }
    }

    /// Model: one slot's counters in two databases, which anyone may overwrite, flush, roll
    /// back or swap (SWAPDB, told to the memory or not), a process that may restart, a clock
    /// that may step back. Tokens handed out by one process only ever rise — across both
    /// databases, so a key's tokens rise whatever moved it — never pass the integer limit, and
    /// are refused rather than repeated.
    #[test]
    fn tokens_rise_until_refused_whatever_happens_to_the_counters(
        steps in proptest::collection::vec((0u8..12, 0u64..3_000, 0usize..2), 1..300),
        start in prop_oneof![Just(None), Just(Some(MAX_STORED_INTEGER - 50)), (1u64..1u64 << 62).prop_map(Some)],
    ) {
        let mut stored: [Option<u64>; 2] = [start, None];
        let mut memory = SlotMemory::default();
        let mut snapshot = stored;
        let mut highest: Option<u64> = None;
        let mut now: u64 = 1_700_000_000_000;
        for (op, arg, db) in steps {
            match op {
                0 => stored[db] = None,                       // FLUSHALL / DEL of the counter
                1 => snapshot = stored,                       // an RDB snapshot
                2 => stored = snapshot,                       // a rollback (old snapshot loaded)
                3 => stored[db] = Some(arg.max(1)),           // a client SET the counter low
                4 => now = now.saturating_sub(arg % 50),      // the clock steps back a little
                5 => {                                        // SWAPDB, seen by the module
                    stored.swap(0, 1);
                    memory.swap_databases(0, 1);
                }
                6 => stored.swap(0, 1),                       // SWAPDB, event missed
                _ => now += arg % 7,
            }
            match memory.next_token(db as i32, stored[db], now) {
                Ok(grant) => {
                    prop_assert!(grant.token <= MAX_STORED_INTEGER);
                    prop_assert!(highest.is_none_or(|h| grant.token > h),
                        "token {} after {:?}", grant.token, highest);
                    highest = Some(grant.token);
                    if let Some(bound) = grant.store_bound {
                        prop_assert!(bound >= grant.token && bound <= MAX_STORED_INTEGER);
                        stored[db] = Some(bound);
                    }
                }
                Err(e) => {
                    prop_assert_eq!(e, LockError::TokensExhausted);
                    // Only reachable once the process itself (or the counter) is at the limit.
                    prop_assert!(highest == Some(MAX_STORED_INTEGER)
                        || stored[db].is_some_and(|s| s >= MAX_STORED_INTEGER));
                }
            }
        }
    }
}
