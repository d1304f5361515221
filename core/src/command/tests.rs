//! The commands' rules, table-driven, on locks as the store reads them: Redisson's layout (the
//! exclusive lock's O(1) read) and the multi-hold layout give one model, and every command's
//! outcome — write, reply, event, counters, bindings, room for waiters — is stated here.

use super::*;
use crate::args::{Reentry, Wait, Waiting};
use crate::hold::{decode, decode_rlock, Family, Hold};
use crate::kind::Mode;

const NOW: UnixMs = 1_700_000_000_000;

/// A server that answers as told: tokens count up from 100.
#[derive(Default)]
struct Server {
    out_of_memory: bool,
    bound: Option<u64>,
    cannot_block: bool,
    replica: bool,
    tokens_taken: u64,
}

impl Facts for Server {
    fn out_of_memory(&self) -> bool {
        self.out_of_memory
    }
    fn bound_client(&self, token: u64) -> Option<ClientId> {
        (self.bound == Some(token)).then_some(7)
    }
    fn next_token(&mut self) -> Result<u64, LockError> {
        self.tokens_taken += 1;
        Ok(99 + self.tokens_taken)
    }
    fn can_block(&self) -> bool {
        !self.cannot_block
    }
    fn is_replica(&self) -> bool {
        self.replica
    }
}

fn hold(owner: &str, kind: HoldKind, count: u64, expires_at: UnixMs, token: Option<u64>) -> Hold {
    Hold {
        owner: owner.as_bytes().to_vec().into(),
        kind,
        count,
        expires_at: Some(expires_at),
        token,
    }
}

/// Redisson's layout: `owner` holds it `count` times, lease ending at `expires_at`.
fn rlock(owner: &str, count: u64, expires_at: UnixMs, token: Option<u64>) -> Live {
    let lock = Lock {
        family: Family::ReadWrite,
        holds: smallvec::smallvec![hold(owner, HoldKind::Exclusive, count, expires_at, token)],
    };
    stored(lock, Some(expires_at))
}

fn stored(lock: Lock, expires_at: Option<UnixMs>) -> Live {
    Live::new(
        Some(StoredLock {
            lock,
            expires_at,
            names: Default::default(),
        }),
        NOW,
    )
}

fn missing() -> Live {
    Live::new(None, NOW)
}

fn request(owner: &str, mode: Mode) -> AcquireRequest<'_> {
    AcquireRequest {
        key: b"k",
        owner: owner.as_bytes(),
        lease_ms: 5_000,
        wait: Wait::No,
        waiting: Waiting::Blocked,
        reentry: Reentry::Counted,
        mode,
        binding: Binding::Lease,
    }
}

fn counters(outcome: &Outcome) -> Vec<Counter> {
    outcome.counters.iter().collect()
}

#[test]
fn the_rlock_layout_is_read_by_one_rule() {
    type Case = (
        &'static [(&'static [u8], &'static [u8])],
        Option<(u64, Option<u64>)>,
    );
    let cases: [Case; 12] = [
        (&[(b"me", b"3"), (b"__fence__", b"17")], Some((3, Some(17)))),
        // Taken by Redisson's own script: no fence.
        (&[(b"me", b"1")], Some((1, None))),
        (
            &[(b"me", b"9223372036854775807")],
            Some((i64::MAX as u64, None)),
        ),
        // Not locks: two holders, a bad count, a bad fence, only a fence, two fences, a plain
        // hash of user data, the mode field as a holder.
        (&[(b"a", b"1"), (b"b", b"1")], None),
        (&[(b"me", b"0")], None),
        (&[(b"me", b"-1")], None),
        (&[(b"me", b"1"), (b"__fence__", b"x")], None),
        (&[(b"__fence__", b"5")], None),
        (
            &[(b"__fence__", b"5"), (b"__fence__", b"6"), (b"me", b"1")],
            None,
        ),
        (&[(b"name", b"ada")], None),
        (&[(b"__mode__", b"5")], None),
        (&[], None),
    ];
    for (fields, expected) in cases {
        let got = decode_rlock(fields.iter().copied(), Some(NOW))
            .ok()
            .map(|lock| {
                let only = lock.holds.first().cloned();
                assert_eq!(lock.holds.len(), 1);
                let only = only.unwrap_or_else(|| hold("", HoldKind::Exclusive, 0, 0, None));
                assert_eq!(only.expires_at, Some(NOW));
                (only.count, only.token)
            });
        assert_eq!(got, expected, "{fields:?}");
        // The whole-hash decoder (the store's other read) agrees.
        let owned: Vec<(Vec<u8>, Vec<u8>)> = fields
            .iter()
            .map(|(f, v)| (f.to_vec(), v.to_vec()))
            .collect();
        assert_eq!(
            decode(&owned, Some(NOW)).ok().map(|l| l.holds.len()),
            expected.map(|_| 1),
            "{fields:?}"
        );
    }
}

#[test]
fn a_lone_exclusive_hold_in_the_multi_hold_layout_is_not_a_lock() {
    // The module stores a lone exclusive hold in Redisson's layout; this hash was made by hand,
    // and reading it as a lock would write Redisson's fields beside its own.
    let fields = vec![
        (b"__mode__".to_vec(), b"rw".to_vec()),
        (b"x:bob".to_vec(), format!("1:{NOW}:5").into_bytes()),
    ];
    assert_eq!(decode(&fields, Some(NOW)), Err(LockError::NotALock));
}

#[test]
fn acquire_outcomes() {
    let later = NOW + 10_000;
    // (what the key holds, who asks, waiters queued, reply, event, counters, writes?)
    type Case = (
        Live,
        &'static str,
        Queue,
        Reply,
        Option<LockEvent>,
        Vec<Counter>,
        bool,
    );
    let cases: Vec<Case> = vec![
        (
            missing(),
            "me",
            Queue::Empty,
            Reply::Integer(100),
            Some(LockEvent::Acquired),
            vec![Counter::Acquired],
            true,
        ),
        // Waiters come first: a newcomer never barges past the queue.
        (
            missing(),
            "me",
            Queue::Waiting,
            Reply::Null,
            None,
            vec![Counter::Contended, Counter::AcquireNil],
            false,
        ),
        (
            rlock("other", 1, later, Some(9)),
            "me",
            Queue::Empty,
            Reply::Null,
            None,
            vec![Counter::Contended, Counter::AcquireNil],
            false,
        ),
        // The holder re-enters even with waiters queued, and keeps its token.
        (
            rlock("me", 2, later, Some(9)),
            "me",
            Queue::Waiting,
            Reply::Integer(9),
            Some(LockEvent::Reentered),
            vec![Counter::Reentered],
            true,
        ),
        // A hold Redisson's script took has no token: its re-entry gets one.
        (
            rlock("me", 1, later, None),
            "me",
            Queue::Empty,
            Reply::Integer(100),
            Some(LockEvent::Reentered),
            vec![Counter::Reentered],
            true,
        ),
    ];
    for (live, owner, queue, reply, event, expected_counters, writes) in cases {
        let mut server = Server::default();
        let outcome = acquire(
            &live,
            &request(owner, Mode::Exclusive),
            queue,
            NOW,
            &mut server,
        )
        .unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(outcome.reply, reply, "{live:?} {owner} {queue:?}");
        assert_eq!(outcome.event, event);
        assert_eq!(counters(&outcome), expected_counters);
        assert_eq!(outcome.write.is_some(), writes);
        if let Some(new) = &outcome.write {
            assert!(
                new.is_rlock_layout(),
                "an exclusive lock stays in Redisson's layout"
            );
            let held = new.holds.first().cloned();
            let held = held.unwrap_or_else(|| hold("", HoldKind::Exclusive, 0, 0, None));
            assert_eq!(held.expires_at, Some(NOW + 5_000), "the lease is reset");
            assert_eq!(outcome.lease_end, Some(Some(NOW + 5_000)));
            assert_eq!(Reply::Integer(held.token.unwrap_or(0)), reply);
        }
    }
}

#[test]
fn a_busy_acquire_waits_only_when_it_asked_and_may() {
    let held = rlock("other", 1, NOW + 10_000, Some(9));
    let mut waiting = request("me", Mode::Exclusive);
    waiting.wait = Wait::For(1_000);
    let seen = Seen::Held {
        next_lease_end: Some(NOW + 10_000),
    };
    let mut server = Server::default();
    let outcome = acquire(&held, &waiting, Queue::Empty, NOW, &mut server).unwrap();
    assert_eq!(outcome.reply, Reply::Wait(seen));
    assert_eq!(counters(&outcome), vec![Counter::Contended]);
    // In MULTI or a script it cannot block: nil.
    let mut server = Server {
        cannot_block: true,
        ..Server::default()
    };
    let outcome = acquire(&held, &waiting, Queue::Empty, NOW, &mut server).unwrap();
    assert_eq!(outcome.reply, Reply::Null);
    // A writable replica would queue a waiter nothing there can grant.
    let mut server = Server {
        replica: true,
        ..Server::default()
    };
    assert_eq!(
        acquire(&held, &waiting, Queue::Empty, NOW, &mut server),
        Err(LockError::WaitOnReplica)
    );
    // A free key with waiters queued: the waiter saw it free.
    let mut server = Server::default();
    let outcome = acquire(&missing(), &waiting, Queue::Waiting, NOW, &mut server).unwrap();
    assert_eq!(outcome.reply, Reply::Wait(Seen::Free));
}

#[test]
fn memory_and_bindings_are_asked_only_when_they_matter() {
    let oom = || Server {
        out_of_memory: true,
        ..Server::default()
    };
    // A new hold takes memory: refused over maxmemory, and no token is taken.
    let mut server = oom();
    assert_eq!(
        acquire(
            &missing(),
            &request("me", Mode::Exclusive),
            Queue::Empty,
            NOW,
            &mut server
        ),
        Err(LockError::OutOfMemory)
    );
    assert_eq!(server.tokens_taken, 0);
    // A re-entry does not: it goes on.
    let mut server = oom();
    let reentered = acquire(
        &rlock("me", 1, NOW + 10, Some(9)),
        &request("me", Mode::Exclusive),
        Queue::Empty,
        NOW,
        &mut server,
    );
    assert_eq!(reentered.map(|o| o.reply), Ok(Reply::Integer(9)));
    // A re-entry keeps what the hold is: EPHEMERAL with EPHEMERAL, plain without.
    let ephemeral = Server {
        bound: Some(9),
        ..Server::default()
    };
    let held = rlock("me", 1, NOW + 10, Some(9));
    let mut plain = request("me", Mode::Exclusive);
    let mut bound = request("me", Mode::Exclusive);
    bound.binding = Binding::Connection;
    let mut server = ephemeral;
    assert_eq!(
        acquire(&held, &plain, Queue::Empty, NOW, &mut server),
        Err(LockError::HoldIsEphemeral)
    );
    let mut server = Server::default();
    assert_eq!(
        acquire(&held, &bound, Queue::Empty, NOW, &mut server),
        Err(LockError::HoldIsNotEphemeral)
    );
    // A new EPHEMERAL hold is bound to the caller's connection.
    plain.binding = Binding::Connection;
    let mut server = Server::default();
    let outcome = acquire(&missing(), &plain, Queue::Empty, NOW, &mut server).unwrap();
    assert_eq!(outcome.bind, Some((HoldKind::Exclusive, 100)));
}

#[test]
fn once_re_takes_a_held_lock_without_counting() {
    let held = rlock("me", 3, NOW + 10, Some(9));
    let mut once = request("me", Mode::Exclusive);
    once.reentry = Reentry::Once;
    let mut server = Server::default();
    let outcome = acquire(&held, &once, Queue::Empty, NOW, &mut server).unwrap();
    assert_eq!(outcome.reply, Reply::Integer(9));
    let new = outcome.write.unwrap();
    assert_eq!(new.holds.first().map(|h| h.count), Some(3));
    assert_eq!(
        new.holds.first().and_then(|h| h.expires_at),
        Some(NOW + 5_000)
    );
}

#[test]
fn release_outcomes() {
    let later = NOW + 10_000;
    // (lock, who releases, reply, left for waiters, unbound tokens, counters)
    type Case = (
        Live,
        &'static str,
        Reply,
        Option<Left>,
        Vec<u64>,
        Vec<Counter>,
    );
    let shared = stored(
        Lock {
            family: Family::ReadWrite,
            holds: smallvec::smallvec![
                hold("a", HoldKind::Shared, 1, later, Some(4)),
                hold("b", HoldKind::Shared, 1, later, Some(5)),
            ],
        },
        Some(later),
    );
    let cases: Vec<Case> = vec![
        (
            rlock("me", 2, later, Some(9)),
            "me",
            Reply::Integer(1),
            None,
            vec![],
            vec![Counter::ReleasedPartial],
        ),
        (
            rlock("me", 1, later, Some(9)),
            "me",
            Reply::Integer(0),
            Some(Left::Nothing),
            vec![9],
            vec![Counter::Released],
        ),
        (
            rlock("other", 1, later, Some(9)),
            "me",
            Reply::Null,
            None,
            vec![],
            vec![Counter::ReleaseNotOwner],
        ),
        (
            missing(),
            "me",
            Reply::Null,
            None,
            vec![],
            vec![Counter::ReleaseNotOwner],
        ),
        (
            shared,
            "a",
            Reply::Integer(0),
            Some(Left::OtherHolds),
            vec![4],
            vec![Counter::Released],
        ),
    ];
    for (live, owner, reply, freed, unbind, expected_counters) in cases {
        let outcome = release(&live, owner.as_bytes(), None).unwrap();
        assert_eq!(outcome.reply, reply, "{live:?} {owner}");
        assert_eq!(outcome.freed, freed);
        assert_eq!(outcome.unbind.tokens(), unbind.as_slice());
        assert_eq!(counters(&outcome), expected_counters);
        assert_eq!(outcome.write.is_some(), reply != Reply::Null);
        // An owner's own release tells nobody they lost anything.
        assert!(outcome.lost.is_empty());
    }
}

#[test]
fn holds_whose_lease_ended_are_removed_counted_and_make_room() {
    let later = NOW + 10_000;
    let live = stored(
        Lock {
            family: Family::Semaphore { limit: 2 },
            holds: smallvec::smallvec![
                hold("a", HoldKind::Permit, 1, NOW - 1, Some(4)),
                hold("b", HoldKind::Permit, 1, later, Some(5)),
            ],
        },
        Some(later),
    );
    assert_eq!(live.ended.len(), 1);
    assert_eq!(live.lock().holds.len(), 1);
    // A renew by the live holder writes the lock without the ended hold, and the room it left
    // goes to the waiters.
    let outcome = renew(&live, b"b", 1_000, NOW).unwrap();
    assert_eq!(outcome.ended, 1);
    // Its holder is told it lost it to its lease.
    assert_eq!(
        outcome.lost,
        vec![Lost {
            reason: LostReason::Expired,
            owner: b"a".to_vec(),
            token: Some(4),
        }]
    );
    assert_eq!(outcome.freed, Some(Left::OtherHolds));
    assert_eq!(outcome.write.map(|l| l.holds.len()), Some(1));
    // A refused command writes nothing, so removes nothing.
    let outcome = renew(&live, b"a", 1_000, NOW).unwrap();
    assert_eq!(outcome.reply, Reply::Integer(0));
    assert_eq!((outcome.ended, outcome.write), (0, None));
}

#[test]
fn renew_extends_every_hold_of_the_owner_only() {
    let live = rlock("me", 2, NOW + 10, Some(9));
    let outcome = renew(&live, b"me", 60_000, NOW).unwrap();
    assert_eq!(outcome.reply, Reply::Integer(1));
    assert_eq!(outcome.event, Some(LockEvent::Renewed));
    assert_eq!(outcome.lease_end, Some(Some(NOW + 60_000)));
    let outcome = renew(&live, b"other", 60_000, NOW).unwrap();
    assert_eq!(outcome.reply, Reply::Integer(0));
    assert_eq!(counters(&outcome), vec![Counter::RenewNotOwner]);
    assert_eq!(outcome.write, None);
}

#[test]
fn force_release_removes_every_hold_and_forgets_every_binding() {
    let live = stored(
        Lock {
            family: Family::ReadWrite,
            holds: smallvec::smallvec![
                hold("a", HoldKind::Shared, 1, NOW - 1, Some(4)),
                hold("b", HoldKind::Shared, 2, NOW + 10, Some(5)),
            ],
        },
        Some(NOW + 10),
    );
    let outcome = force_release(&live);
    assert_eq!(outcome.reply, Reply::Integer(1));
    // The ended hold's binding goes too, but it is not counted as a lease end.
    assert_eq!(outcome.unbind.tokens(), [4, 5]);
    // Every holder is told: the one whose lease had ended that it ran out, the other that it
    // was taken.
    let told: Vec<(LostReason, Option<u64>)> =
        outcome.lost.iter().map(|l| (l.reason, l.token)).collect();
    assert_eq!(
        told,
        vec![
            (LostReason::Expired, Some(4)),
            (LostReason::ForceReleased, Some(5))
        ]
    );
    assert_eq!(outcome.ended, 0);
    assert_eq!(outcome.freed, Some(Left::Nothing));
    assert_eq!(outcome.write, Some(Lock::free()));
    assert_eq!(force_release(&missing()).reply, Reply::Integer(0));
    assert_eq!(force_release(&missing()).write, None);
}

#[test]
fn a_downgrade_of_a_hold_without_token_or_lease_is_refused_and_writes_nothing() {
    // Taken by Redisson's own script (no token), or PERSISTed (no lease): the multi-hold layout
    // stores both for every hold, so the downgrade would write a key nothing reads back.
    let no_token = rlock("me", 1, NOW + 10_000, None);
    let mut no_lease = rlock("me", 1, NOW + 10_000, Some(9));
    if let Some(stored) = no_lease.stored.as_mut() {
        stored.expires_at = None;
        if let Some(hold) = stored.lock.holds.first_mut() {
            hold.expires_at = None;
        }
    }
    for live in [no_token, no_lease] {
        let mut server = Server::default();
        assert_eq!(
            acquire(
                &live,
                &request("me", Mode::Shared),
                Queue::Empty,
                NOW,
                &mut server
            ),
            Err(LockError::DowngradeNeedsLease),
            "{live:?}"
        );
        assert_eq!(server.tokens_taken, 0);
    }
    // With both, the exclusive holder takes it SHARED too.
    let mut server = Server::default();
    let outcome = acquire(
        &rlock("me", 1, NOW + 10_000, Some(9)),
        &request("me", Mode::Shared),
        Queue::Empty,
        NOW,
        &mut server,
    )
    .unwrap();
    assert_eq!(outcome.write.as_ref().map(|l| l.holds.len()), Some(2));
    assert!(counters(&outcome).contains(&Counter::Downgraded));
}
