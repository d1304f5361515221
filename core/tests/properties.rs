//! Property tests for everything in lock-core that reads client input or stored data: the
//! argument parser, the decoding of a stored hash, the acquire/release/renew decisions
//! and the token counter. Random inputs (biased towards the edge values that broke things
//! before) must never panic, and every accepted result must respect the limits the module
//! relies on when it writes. Bounded: a few thousand cases, a second or two.

use lock_core::args::{parse_acquire, parse_key_only, parse_release, parse_renew, Wait};
use lock_core::args::{AcquireRequest, Binding, Reentry, Waiting};
use lock_core::command::{self, Facts, Live, Reply};
use lock_core::hold::{self, Family, Hold, HoldKind, Lock, Mode, StoredLock};
use lock_core::key::ClientId;
use lock_core::kind::Queue;
use lock_core::layout::{
    is_reserved_key, is_reserved_owner, FENCE_FIELD, LEGACY_MODE_FIELD, MAX_STORED_INTEGER,
    MODE_FIELD,
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
        (1u64..=MAX_STORED_INTEGER).prop_map(|n| format!("exclusive:{n}").into_bytes()),
        Just(b"exclusive:".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..12),
    ]
}

fn field_name() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(b"owner".to_vec()),
        Just(MODE_FIELD.to_vec()),
        Just(FENCE_FIELD.to_vec()),
        Just(LEGACY_MODE_FIELD.to_vec()),
        proptest::collection::vec(any::<u8>(), 1..12),
    ]
}

/// A small stored hash without the mode field's meaning guaranteed: (field, value) pairs.
fn small_hash() -> impl Strategy<Value = Vec<(Vec<u8>, Vec<u8>)>> {
    proptest::collection::vec((field_name(), positive_text()), 0..4)
}

/// The decisions' answers to the server's questions: room, no bindings, tokens counting up.
struct Server {
    next: u64,
}

impl Facts for Server {
    fn out_of_memory(&self) -> bool {
        false
    }
    fn bound_client(&self, _token: u64) -> Option<ClientId> {
        None
    }
    fn next_token(&mut self) -> Result<u64, LockError> {
        self.next += 1;
        Ok(self.next)
    }
    fn can_block(&self) -> bool {
        true
    }
    fn is_replica(&self) -> bool {
        false
    }
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

    /// Decoding Redisson's layout never panics, refuses any hash that cannot be a lock, and
    /// reports counts and tokens the module can store and send back.
    #[test]
    fn decoding_is_total_and_within_limits(fields in small_hash(), expires in proptest::option::of(1u64..u64::MAX)) {
        let pairs = fields.iter().map(|(f, v)| (f.as_slice(), v.as_slice()));
        match hold::decode_rlock(pairs, expires) {
            Ok(lock) => {
                prop_assert!(lock.is_rlock_layout());
                let [held] = lock.holds.as_slice() else {
                    return Err(TestCaseError::fail("one hold"));
                };
                prop_assert!(!is_reserved_owner(held.owner.as_slice()));
                prop_assert!((1..=MAX_STORED_INTEGER).contains(&held.count));
                prop_assert!(held.token.is_none_or(|t| (1..=MAX_STORED_INTEGER).contains(&t)));
                prop_assert_eq!(fields.len(), 1 + usize::from(held.token.is_some()));
                prop_assert_eq!(held.expires_at, expires);
            }
            Err(e) => prop_assert_eq!(e, LockError::NotALock),
        }
        // The whole decoder agrees or refuses; it never panics.
        if let Ok(lock) = hold::decode(&fields, expires) {
            prop_assert!(lock.holds.len() <= lock_core::hold::MAX_HOLDERS);
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
        let holder: &[u8] = if mine { b"me" } else { b"other" };
        let expires_at = Some(now + 10_000);
        let live = Live::new(
            Some(StoredLock {
                lock: Lock {
                    family: Family::ReadWrite,
                    holds: smallvec::smallvec![Hold { owner: holder.to_vec().into(), kind: HoldKind::Exclusive, count, expires_at, token }],
                },
                expires_at,
                names: Default::default(),
            }),
            now,
        );
        let queue = if waiting { Queue::Waiting } else { Queue::Empty };
        let request = AcquireRequest {
            key: b"k",
            owner: b"me",
            lease_ms: lease,
            wait: Wait::No,
            waiting: Waiting::Blocked,
            reentry: Reentry::Counted,
            mode: Mode::Exclusive,
            binding: Binding::Lease,
        };
        let mut server = Server { next: 0 };
        match command::acquire(&live, &request, queue, now, &mut server) {
            Ok(outcome) if mine => {
                let written = outcome.write.expect("a re-entry writes");
                let [held] = written.holds.as_slice() else {
                    return Err(TestCaseError::fail("one hold"));
                };
                prop_assert_eq!(held.count, count + 1);
                prop_assert!(held.count <= MAX_STORED_INTEGER);
                prop_assert_eq!(held.expires_at, Some(now + lease));
                prop_assert_eq!(outcome.reply, Reply::Integer(token.unwrap_or(1)));
            }
            Ok(outcome) => {
                prop_assert_eq!(outcome.reply, Reply::Null);
                prop_assert!(outcome.write.is_none());
            }
            Err(e) => {
                prop_assert_eq!(e, LockError::CountOverflow);
                prop_assert!(mine && count == MAX_STORED_INTEGER);
            }
        }
        let released = command::release(&live, b"me", None).expect("release never fails");
        if mine {
            prop_assert_eq!(released.reply, Reply::Integer(count - 1));
            let left = released.write.expect("a release writes");
            prop_assert_eq!(left.holds.is_empty(), count == 1);
        } else {
            prop_assert_eq!(released.reply, Reply::Null);
            prop_assert!(released.write.is_none());
        }
        let renewed = command::renew(&live, b"me", lease, now).expect("renew never fails");
        if mine {
            prop_assert_eq!(renewed.reply, Reply::Integer(1));
            let lock = renewed.write.expect("a renew writes");
            prop_assert_eq!(lock.holds.first().and_then(|h| h.expires_at), Some(now + lease));
        } else {
            prop_assert_eq!(renewed.reply, Reply::Integer(0));
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
