use super::testing::*;
use super::*;
use crate::hold::{Family, Hold, Lock};

fn key(name: &str) -> LockKey {
    LockKey::new(0, name.as_bytes())
}

fn granted(token: u64, k: &LockKey, owner: &str) -> Answer {
    granted_as(token, k, owner, HoldKind::Exclusive)
}

fn granted_as(token: u64, k: &LockKey, owner: &str, kind: HoldKind) -> Answer {
    Answer::Granted {
        token,
        key: k.clone(),
        owner: owner.as_bytes().into(),
        kind,
    }
}

fn undelivered(k: &LockKey, token: u64) -> GrantRef {
    GrantRef {
        key: k.clone(),
        kind: HoldKind::Exclusive,
        token,
    }
}

/// The lease end of the key's only hold.
fn lease_end(port: &FakePort, k: &LockKey) -> Option<UnixMs> {
    port.keys[k].holds[0].expires_at
}

fn set_lease_end(port: &mut FakePort, k: &LockKey, at: Option<UnixMs>) {
    port.keys.get_mut(k).unwrap().holds[0].expires_at = at;
}

/// A lock held by `owner` until `expires_at`, as a client's acquire leaves it.
fn hold(port: &mut FakePort, k: &LockKey, owner: &str, expires_at: UnixMs) {
    port.last_token += 1;
    port.keys.insert(
        k.clone(),
        Lock {
            family: Family::ReadWrite,
            holds: smallvec::smallvec![Hold {
                owner: owner.as_bytes().to_vec().into(),
                kind: HoldKind::Exclusive,
                count: 1,
                expires_at: Some(expires_at),
                token: Some(port.last_token),
            }],
        },
    );
}

fn setup() -> (Scheduler<u32>, FakePort, LockKey) {
    let mut port = FakePort::default();
    let k = key("k");
    hold(&mut port, &k, "holder", 61_000);
    (Scheduler::default(), port, k)
}

#[test]
fn a_release_hands_over_to_the_head_waiter_in_arrival_order() {
    let (mut s, mut port, k) = setup();
    for h in 1..=3 {
        wait(
            &mut s,
            &mut port,
            h,
            &k,
            &format!("w{h}"),
            5_000,
            Wait::Forever,
        )
        .unwrap();
    }
    release(&mut s, &mut port, &k);
    release(&mut s, &mut port, &k);
    release(&mut s, &mut port, &k);
    release(&mut s, &mut port, &k);
    assert_eq!(
        port.answers(),
        [
            (1, granted(2, &k, "w1")),
            (2, granted(3, &k, "w2")),
            (3, granted(4, &k, "w3")),
        ]
    );
    // Exactly one wake-up per release, and the last release (nobody waits) publishes.
    assert_eq!(
        port.effects.last(),
        Some(&Effect::Published { key: k.clone() })
    );
}

#[test]
fn a_lease_end_hands_off_just_after_it_and_is_noted_as_lost() {
    let (mut s, mut port, k) = setup();
    wait(&mut s, &mut port, 1, &k, "w", 5_000, Wait::Forever).unwrap();
    assert_eq!(
        s.next_deadline(),
        Some(61_001),
        "checked at lease end + 1 ms"
    );
    advance_to(&mut s, &mut port, 61_000);
    assert!(port.answers().is_empty(), "not before the lease ends");
    advance_to(&mut s, &mut port, 61_001);
    assert_eq!(port.answers(), [(1, granted(2, &k, "w"))]);
    assert!(port
        .effects
        .contains(&Effect::Noted(Note::ExpiredWithWaiters { key: k.clone() })));
    // The new holder's lease starts at the handoff.
    assert_eq!(lease_end(&port, &k), Some(66_001));
}

#[test]
fn a_renewed_lease_moves_the_check_later_and_a_shortened_one_earlier() {
    let (mut s, mut port, k) = setup();
    wait(&mut s, &mut port, 1, &k, "w", 5_000, Wait::Forever).unwrap();
    // Renewed further: the early check finds the key held and re-arms for the new end.
    set_lease_end(&mut port, &k, Some(90_000));
    advance_to(&mut s, &mut port, 61_001);
    assert!(port.answers().is_empty());
    assert_eq!(s.next_deadline(), Some(90_001));
    // Shortened: the check moves to the new end at once.
    set_lease_end(&mut port, &k, Some(62_000));
    s.lease_changed(&k, Some(62_000), port.now);
    assert_eq!(s.next_deadline(), Some(62_001));
    advance_to(&mut s, &mut port, 62_001);
    assert_eq!(port.answers(), [(1, granted(2, &k, "w"))]);
}

#[test]
fn wait_timeouts_answer_nil_on_time_and_leave_the_rest_of_the_queue() {
    let (mut s, mut port, k) = setup();
    wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::For(100)).unwrap();
    wait(&mut s, &mut port, 2, &k, "b", 5_000, Wait::For(50_000)).unwrap();
    advance_to(&mut s, &mut port, 1_099);
    assert!(port.answers().is_empty());
    advance_to(&mut s, &mut port, 1_100);
    assert_eq!(port.answers(), [(1, Answer::TimedOut)]);
    release(&mut s, &mut port, &k);
    assert_eq!(port.answers()[1], (2, granted(2, &k, "b")));
    // Its timeout was cancelled with the grant.
    advance_to(&mut s, &mut port, 60_000);
    assert_eq!(port.answers().len(), 2);
}

#[test]
fn a_waiter_that_left_is_skipped_and_its_deadlines_cancelled() {
    let (mut s, mut port, k) = setup();
    wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::For(100)).unwrap();
    wait(&mut s, &mut port, 2, &k, "b", 5_000, Wait::Forever).unwrap();
    assert!(s.waiter_left(&mut port, 1, 1_000));
    assert!(!s.waiter_left(&mut port, 1, 1_000), "only once");
    release(&mut s, &mut port, &k);
    assert_eq!(port.answers(), [(2, granted(2, &k, "b"))]);
    // Once the last waiter is gone, nothing is left scheduled: the module can unload.
    assert!(!s.waiter_left(&mut port, 99, 1_000));
    release(&mut s, &mut port, &k);
    advance_to(&mut s, &mut port, 1_000_000);
    assert!(s.is_idle());
}

#[test]
fn an_undelivered_grant_goes_to_the_next_waiter_or_frees_the_key() {
    let (mut s, mut port, k) = setup();
    wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::Forever).unwrap();
    wait(&mut s, &mut port, 2, &k, "b", 5_000, Wait::Forever).unwrap();
    release(&mut s, &mut port, &k);
    assert_eq!(port.answers(), [(1, granted(2, &k, "a"))]);
    // Client 1 vanished before its reply: the server says so from its free callback.
    s.grant_undelivered(undelivered(&k, 2), port.now);
    let now = port.now;
    advance_to(&mut s, &mut port, now);
    assert!(port.effects.contains(&Effect::Removed {
        key: k.clone(),
        token: 2
    }));
    assert_eq!(port.answers()[1], (2, granted(3, &k, "b")));
    // The same for b: nobody waits now, so the key is freed and the unlock published.
    s.grant_undelivered(undelivered(&k, 3), port.now);
    advance_to(&mut s, &mut port, now);
    assert!(!port.keys.contains_key(&k));
    assert_eq!(
        port.effects.last(),
        Some(&Effect::Published { key: k.clone() })
    );
    // A grant the holder already released (or re-entered) is left alone.
    hold(&mut port, &k, "c", 99_000);
    s.grant_undelivered(undelivered(&k, 3), port.now);
    advance_to(&mut s, &mut port, now);
    assert_eq!(port.keys[&k].holds[0].owner, b"c");
}

#[test]
fn outside_changes_hand_off_once_per_key() {
    let (mut s, mut port, k) = setup();
    let other = LockKey::new(1, b"k");
    hold(&mut port, &other, "x", 61_000);
    wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::Forever).unwrap();
    wait(&mut s, &mut port, 2, &other, "b", 5_000, Wait::Forever).unwrap();
    // DEL k in db 0, noticed twice.
    port.keys.remove(&k);
    let now = port.now;
    s.keys_changed(
        &mut port,
        vec![
            Change::Key(k.clone(), Cause::Freed),
            Change::Key(k.clone(), Cause::Freed),
        ],
        now,
    );
    assert_eq!(port.answers(), [(1, granted(3, &k, "a"))]);
    // FLUSHDB 1.
    port.keys.remove(&other);
    s.keys_changed(&mut port, vec![Change::Db(1)], now);
    assert_eq!(port.answers()[1], (2, granted(4, &other, "b")));
}

#[test]
fn nothing_is_written_while_writes_are_paused_and_handoffs_follow_the_pause() {
    let (mut s, mut port, k) = setup();
    wait(&mut s, &mut port, 1, &k, "w", 5_000, Wait::Forever).unwrap();
    wait(&mut s, &mut port, 2, &k, "t", 5_000, Wait::For(61_500)).unwrap();
    port.writes = Writes::Paused;
    // The lease ends during the pause: the key stays (Redis keeps it) and nothing is
    // written (the fake port panics on any write while paused).
    advance_to(&mut s, &mut port, 62_000);
    assert!(port.answers().is_empty());
    // A timeout is still answered during the pause: it writes nothing.
    advance_to(&mut s, &mut port, 62_500);
    assert_eq!(port.answers(), [(2, Answer::TimedOut)]);
    advance_to(&mut s, &mut port, 63_000);
    port.writes = Writes::Allowed;
    advance_to(&mut s, &mut port, 63_000 + PAUSE_POLL_MS);
    assert_eq!(port.answers()[1], (1, granted(2, &k, "w")));
    assert!(port
        .effects
        .contains(&Effect::Noted(Note::ExpiredWithWaiters { key: k.clone() })));
}

#[test]
fn an_undelivered_grant_waits_for_the_pause_to_end() {
    let (mut s, mut port, k) = setup();
    wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::Forever).unwrap();
    release(&mut s, &mut port, &k);
    port.writes = Writes::Paused;
    s.grant_undelivered(undelivered(&k, 2), port.now);
    let now = port.now;
    advance_to(&mut s, &mut port, now + 100);
    assert!(port.keys.contains_key(&k));
    port.writes = Writes::Allowed;
    advance_to(&mut s, &mut port, now + 100 + PAUSE_POLL_MS);
    assert!(!port.keys.contains_key(&k));
}

#[test]
fn a_replica_never_grants() {
    let (mut s, mut port, k) = setup();
    wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::Forever).unwrap();
    port.writes = Writes::Replica;
    release(&mut s, &mut port, &k);
    advance_to(&mut s, &mut port, 100_000);
    assert!(port.answers().is_empty());
}

#[test]
fn waiters_of_a_key_that_left_with_its_slot_are_redirected_but_not_on_a_command() {
    let (mut s, mut port, k) = setup();
    wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::Forever).unwrap();
    wait(&mut s, &mut port, 2, &k, "b", 5_000, Wait::Forever).unwrap();
    port.moved
        .insert(k.clone(), "ASK 1 127.0.0.1:7001".to_string());
    // MIGRATE deleted the key here; the event reaches the scheduler.
    port.keys.remove(&k);
    let now = port.now;
    s.keys_changed(&mut port, vec![Change::Key(k.clone(), Cause::Freed)], now);
    let ask = Answer::Refused("ASK 1 127.0.0.1:7001".to_string());
    assert_eq!(port.answers(), [(1, ask.clone()), (2, ask)]);
    // A command on this node means the slot is served here: no route check then.
    wait(&mut s, &mut port, 3, &k, "c", 5_000, Wait::Forever).unwrap();
    let now = port.now;
    s.freed(&mut port, &k, Left::Nothing, now);
    assert!(matches!(
        port.answers().last(),
        Some((3, Answer::Granted { .. }))
    ));
    // Handed off, so not published.
    assert!(!port
        .effects
        .iter()
        .any(|e| matches!(e, Effect::Published { .. })));
}

#[test]
fn when_tokens_run_out_every_waiter_is_told_instead_of_left_waiting() {
    let (mut s, mut port, k) = setup();
    wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::Forever).unwrap();
    wait(&mut s, &mut port, 2, &k, "b", 5_000, Wait::Forever).unwrap();
    port.tokens_exhausted = true;
    release(&mut s, &mut port, &k);
    let refused = Answer::Refused(LockError::TokensExhausted.reply());
    assert_eq!(port.answers(), [(1, refused.clone()), (2, refused)]);
    assert_eq!(s.gauges(), (0, 0));
}

#[test]
fn a_waiter_queued_on_a_free_key_is_looked_at_at_once() {
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let k = key("k");
    // Between an outside DEL and its recheck, an acquire may find the key free but queue
    // behind the waiters; the scheduler looks again on the next timer.
    wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::Forever).unwrap();
    assert_eq!(s.next_deadline(), Some(port.now));
    let now = port.now;
    advance_to(&mut s, &mut port, now);
    assert_eq!(port.answers(), [(1, granted(1, &k, "a"))]);
}

#[test]
fn an_overdue_lease_is_looked_at_again_shortly_not_in_a_loop() {
    let (mut s, mut port, k) = setup();
    wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::Forever).unwrap();
    // The key outlives its lease end (as while clients are paused by CLIENT PAUSE in
    // another form): the check comes back after OVERDUE_RECHECK_MS, not at once.
    set_lease_end(&mut port, &k, None);
    advance_to(&mut s, &mut port, 61_001);
    assert_eq!(s.next_deadline(), None, "no lease: nothing to check");
    set_lease_end(&mut port, &k, Some(50_000));
    s.lease_changed(&k, Some(50_000), port.now);
    assert_eq!(s.next_deadline(), Some(61_001 + OVERDUE_RECHECK_MS));
}

#[test]
fn a_full_queue_refuses_before_the_client_is_blocked() {
    let (mut s, mut port, k) = setup();
    assert_eq!(s.has_room(&k, b"a", 1), Ok(()));
    wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::Forever).unwrap();
    assert_eq!(
        s.has_room(&k, b"b", 1),
        Err(LockError::TooManyWaiters { max: 1 })
    );
    // The owner already waiting may still ask again: it only changes places with itself.
    assert_eq!(s.has_room(&k, b"a", 1), Ok(()));
}

#[test]
fn an_owner_asking_again_takes_its_own_place_and_the_stale_wait_is_answered() {
    let (mut s, mut port, k) = setup();
    wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::For(100)).unwrap();
    wait(&mut s, &mut port, 2, &k, "b", 5_000, Wait::Forever).unwrap();
    // Client 1 gave up (its own timeout) but kept its connection; it asks again as 3.
    wait(&mut s, &mut port, 3, &k, "a", 7_000, Wait::Forever).unwrap();
    assert_eq!(port.answers(), [(1, Answer::Refused(REPLACED.to_string()))]);
    assert_eq!(s.waiters_on(&k), 2);
    // The old timeout went with the old request: no nil for 3 at 1,100.
    advance_to(&mut s, &mut port, 2_000);
    assert_eq!(port.answers().len(), 1);
    // Same place in the queue (ahead of b), the new request's lease.
    release(&mut s, &mut port, &k);
    assert_eq!(port.answers()[1], (3, granted(2, &k, "a")));
    assert_eq!(lease_end(&port, &k), Some(2_000 + 7_000));
    assert!(
        !s.waiter_left(&mut port, 1, 1_000),
        "the old handle is not queued any more"
    );
}
// ---- the lock family: shared holds, permits, mismatches, bound holds ----

/// Who was answered what, without the tokens (checked on their own: they only rise).
fn who(port: &FakePort) -> Vec<(u32, String, HoldKind, UnixMs)> {
    port.answers_at()
        .into_iter()
        .filter_map(|(h, a, at)| match a {
            Answer::Granted { owner, kind, .. } => {
                Some((h, String::from_utf8_lossy(&owner).into_owned(), kind, at))
            }
            _ => None,
        })
        .collect()
}

fn granted_tokens(port: &FakePort) -> Vec<u64> {
    port.answers()
        .into_iter()
        .filter_map(|(_, a)| match a {
            Answer::Granted { token, .. } => Some(token),
            _ => None,
        })
        .collect()
}

fn assert_tokens_rise(port: &FakePort) {
    let tokens = granted_tokens(port);
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

fn notes(port: &FakePort) -> Vec<Note> {
    port.effects
        .iter()
        .filter_map(|e| match e {
            Effect::Noted(n) => Some(n.clone()),
            _ => None,
        })
        .collect()
}

fn count_notes(port: &FakePort, note: &Note) -> usize {
    notes(port).iter().filter(|n| *n == note).count()
}

/// The key's holders as (owner, kind), ended holds dropped.
fn holders(port: &mut FakePort, k: &LockKey) -> Vec<(String, HoldKind)> {
    port.lock(k).map_or_else(Vec::new, |l| {
        l.holds
            .iter()
            .map(|h| (String::from_utf8_lossy(&h.owner).into_owned(), h.kind))
            .collect()
    })
}

fn take(port: &mut FakePort, k: &LockKey, owner: &str, mode: Mode, lease_ms: u64) -> u64 {
    port.acquire(k, owner, mode, lease_ms, false)
        .unwrap()
        .expect("granted")
}

fn queue(s: &mut Scheduler<u32>, port: &mut FakePort, k: &LockKey, waiters: &[(u32, &str, Mode)]) {
    for (h, owner, mode) in waiters {
        wait_as(s, port, *h, k, owner, *mode, 60_000, Wait::Forever, None).unwrap();
    }
}

#[test]
fn a_released_writer_lets_in_the_shared_waiters_up_to_the_next_writer_at_once() {
    use HoldKind::{Exclusive as X, Shared as S};
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let k = key("k");
    take(&mut port, &k, "writer", Mode::Exclusive, 60_000);
    queue(
        &mut s,
        &mut port,
        &k,
        &[
            (1, "r1", Mode::Shared),
            (2, "r2", Mode::Shared),
            (3, "r3", Mode::Shared),
            (4, "w2", Mode::Exclusive),
            (5, "r4", Mode::Shared),
        ],
    );
    advance_to(&mut s, &mut port, 2_000);
    release_owner(&mut s, &mut port, &k, b"writer");
    assert_eq!(
        who(&port),
        [
            (1, "r1".into(), S, 2_000),
            (2, "r2".into(), S, 2_000),
            (3, "r3".into(), S, 2_000),
        ]
    );
    assert_eq!(s.waiters_on(&k), 2, "the run stops at the next writer");
    // The writer waits for every reader; the reader behind it waits for the writer.
    release_owner(&mut s, &mut port, &k, b"r1");
    release_owner(&mut s, &mut port, &k, b"r2");
    assert_eq!(port.answers().len(), 3);
    advance_to(&mut s, &mut port, 3_000);
    release_owner(&mut s, &mut port, &k, b"r3");
    assert_eq!(who(&port)[3], (4, "w2".into(), X, 3_000));
    advance_to(&mut s, &mut port, 4_000);
    release_owner(&mut s, &mut port, &k, b"w2");
    assert_eq!(who(&port)[4], (5, "r4".into(), S, 4_000));
    let handles: Vec<u32> = port.answers().iter().map(|(h, _)| *h).collect();
    assert_eq!(handles, [1, 2, 3, 4, 5], "one answer per waiter, in order");
    assert_tokens_rise(&port);
    assert_eq!(
        count_notes(
            &port,
            &Note::HandedOff {
                key: k.clone(),
                waited_ms: 1_000
            }
        ),
        3
    );
}

#[test]
fn a_shared_newcomer_queues_behind_a_waiting_writer_instead_of_barging() {
    use HoldKind::{Exclusive as X, Shared as S};
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let k = key("k");
    take(&mut port, &k, "r1", Mode::Shared, 60_000);
    queue(&mut s, &mut port, &k, &[(1, "w", Mode::Exclusive)]);
    let waiting = s.waiters_on(&k) > 0;
    assert_eq!(
        port.acquire(&k, "r2", Mode::Shared, 60_000, waiting),
        Ok(None),
        "no barging past the writer"
    );
    assert!(
        port.acquire(&k, "r1", Mode::Shared, 60_000, waiting)
            .unwrap()
            .is_some(),
        "a re-entry is granted"
    );
    queue(&mut s, &mut port, &k, &[(2, "r2", Mode::Shared)]);
    release_owner(&mut s, &mut port, &k, b"r1");
    assert!(port.answers().is_empty(), "r1 still holds it once");
    release_owner(&mut s, &mut port, &k, b"r1");
    assert_eq!(who(&port), [(1, "w".into(), X, 1_000)]);
    assert_eq!(holders(&mut port, &k), [("w".into(), X)]);
    release_owner(&mut s, &mut port, &k, b"w");
    assert_eq!(who(&port)[1], (2, "r2".into(), S, 1_000));
    assert_tokens_rise(&port);
}

#[test]
fn when_the_writer_at_the_head_leaves_the_shared_waiters_behind_it_join_the_readers_at_once() {
    use HoldKind::Shared as S;
    enum Departure {
        TimesOut,
        Leaves,
    }
    for departure in [Departure::TimesOut, Departure::Leaves] {
        let mut s = Scheduler::default();
        let mut port = FakePort::default();
        let k = key("k");
        take(&mut port, &k, "r1", Mode::Shared, 60_000);
        wait_as(
            &mut s,
            &mut port,
            1,
            &k,
            "w",
            Mode::Exclusive,
            5_000,
            Wait::For(100),
            None,
        )
        .unwrap();
        queue(
            &mut s,
            &mut port,
            &k,
            &[
                (2, "r2", Mode::Shared),
                (3, "r3", Mode::Shared),
                (4, "w2", Mode::Exclusive),
                (5, "r4", Mode::Shared),
            ],
        );
        let (at, first) = match departure {
            Departure::TimesOut => {
                // The timeout and the 0 ms recheck it arms fire at the same moment.
                advance_to(&mut s, &mut port, 1_100);
                (1_100, vec![(1, Answer::TimedOut, 1_100)])
            }
            Departure::Leaves => {
                advance_to(&mut s, &mut port, 1_050);
                assert!(s.waiter_left(&mut port, 1, 1_050));
                assert!(port.answers().is_empty(), "nothing written where it left");
                // The adapter's 0 ms timer.
                advance_to(&mut s, &mut port, 1_050);
                (1_050, vec![])
            }
        };
        let answers = port.answers_at();
        assert_eq!(answers[..first.len()], first[..]);
        assert_eq!(
            who(&port),
            [(2, "r2".into(), S, at), (3, "r3".into(), S, at)],
            "granted right away, not at r1's lease end"
        );
        assert_eq!(s.waiters_on(&k), 2, "the run stops at the next writer");
        assert_eq!(
            holders(&mut port, &k),
            [("r1".into(), S), ("r2".into(), S), ("r3".into(), S)]
        );
    }
}

#[test]
fn permits_go_strictly_in_arrival_order_and_never_past_the_limit() {
    use HoldKind::Permit as P;
    let limit = Mode::Limit(2);
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let k = key("k");
    let within_limit = |port: &mut FakePort| {
        let n = holders(port, &k).len();
        assert!(n <= 2, "{n} permits held");
    };
    take(&mut port, &k, "a", limit, 10_000);
    take(&mut port, &k, "b", limit, 60_000);
    queue(
        &mut s,
        &mut port,
        &k,
        &[
            (1, "w1", limit),
            (2, "w2", limit),
            (3, "w3", limit),
            (4, "w4", limit),
            (5, "w5", limit),
        ],
    );
    // A release frees one permit: the head takes it, the rest wait.
    advance_to(&mut s, &mut port, 2_000);
    release_owner(&mut s, &mut port, &k, b"b");
    within_limit(&mut port);
    assert_eq!(who(&port), [(1, "w1".into(), P, 2_000)]);
    // A's lease ends at 11,000: its permit goes on at 11,001.
    assert_eq!(s.next_deadline(), Some(11_001));
    advance_to(&mut s, &mut port, 11_000);
    assert_eq!(port.answers().len(), 1);
    advance_to(&mut s, &mut port, 11_001);
    within_limit(&mut port);
    assert_eq!(who(&port)[1], (2, "w2".into(), P, 11_001));
    assert_eq!(
        count_notes(&port, &Note::ExpiredWithWaiters { key: k.clone() }),
        1
    );
    // An outside DEL frees both permits: the next two get them in the same moment.
    advance_to(&mut s, &mut port, 12_000);
    port.keys.remove(&k);
    s.keys_changed(
        &mut port,
        vec![Change::Key(k.clone(), Cause::Freed)],
        12_000,
    );
    within_limit(&mut port);
    assert_eq!(
        who(&port)[2..],
        [(3, "w3".into(), P, 12_000), (4, "w4".into(), P, 12_000)]
    );
    assert_eq!(s.waiters_on(&k), 1);
    release_owner(&mut s, &mut port, &k, b"w3");
    within_limit(&mut port);
    assert_eq!(who(&port)[4], (5, "w5".into(), P, 12_000));
    let handles: Vec<u32> = port.answers().iter().map(|(h, _)| *h).collect();
    assert_eq!(handles, [1, 2, 3, 4, 5]);
    assert_tokens_rise(&port);
}

#[test]
fn a_writer_behind_readers_is_granted_just_after_the_last_of_their_lease_ends() {
    use HoldKind::{Exclusive as X, Shared as S};
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let k = key("k");
    take(&mut port, &k, "r1", Mode::Shared, 1_000); // ends at 2,000
    take(&mut port, &k, "r2", Mode::Shared, 3_000); // ends at 4,000
    take(&mut port, &k, "r3", Mode::Shared, 2_000); // ends at 3,000
    queue(&mut s, &mut port, &k, &[(1, "w", Mode::Exclusive)]);
    // The lease check follows the earliest lease end among the holds that are left.
    let steps = [
        (2_001, vec![("r2", S), ("r3", S)], Some(3_001)),
        (3_001, vec![("r2", S)], Some(4_001)),
    ];
    assert_eq!(s.next_deadline(), Some(2_001));
    for (at, left, next) in steps {
        advance_to(&mut s, &mut port, at - 1);
        assert!(port.answers().is_empty(), "nothing before {at}");
        advance_to(&mut s, &mut port, at);
        assert!(port.answers().is_empty(), "still held at {at}");
        let left: Vec<(String, HoldKind)> = left
            .into_iter()
            .map(|(o, kind)| (o.to_string(), kind))
            .collect();
        assert_eq!(holders(&mut port, &k), left, "at {at}");
        assert_eq!(s.next_deadline(), next, "at {at}");
    }
    advance_to(&mut s, &mut port, 4_000);
    assert!(port.answers().is_empty(), "not before the last lease ends");
    advance_to(&mut s, &mut port, 4_001);
    assert_eq!(who(&port), [(1, "w".into(), X, 4_001)]);
    assert_eq!(
        count_notes(&port, &Note::ExpiredWithWaiters { key: k.clone() }),
        1
    );
    assert_eq!(holders(&mut port, &k), [("w".into(), X)]);
}

#[test]
fn a_permit_whose_lease_ends_goes_to_the_next_waiter_just_after_its_own_end() {
    use HoldKind::Permit as P;
    let limit = Mode::Limit(2);
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let k = key("k");
    take(&mut port, &k, "a", limit, 1_000); // ends at 2,000
    take(&mut port, &k, "b", limit, 4_000); // ends at 5,000
    queue(&mut s, &mut port, &k, &[(1, "w1", limit), (2, "w2", limit)]);
    assert_eq!(s.next_deadline(), Some(2_001));
    advance_to(&mut s, &mut port, 2_000);
    assert!(port.answers().is_empty());
    advance_to(&mut s, &mut port, 2_001);
    assert_eq!(who(&port), [(1, "w1".into(), P, 2_001)]);
    assert_eq!(s.next_deadline(), Some(5_001), "b's lease end, before w1's");
    advance_to(&mut s, &mut port, 5_000);
    assert_eq!(port.answers().len(), 1);
    advance_to(&mut s, &mut port, 5_001);
    assert_eq!(who(&port)[1], (2, "w2".into(), P, 5_001));
    assert_eq!(
        count_notes(&port, &Note::ExpiredWithWaiters { key: k.clone() }),
        2
    );
    assert_tokens_rise(&port);
}

#[test]
fn a_waiter_whose_request_no_longer_fits_the_key_is_refused_and_the_next_one_served() {
    let cases = [
        (
            "exclusive waiter, the key became a semaphore",
            Mode::Exclusive,
            Mode::Limit(2),
            Mode::Limit(2),
            LockError::IsSemaphore { limit: 2 },
        ),
        (
            "shared waiter, the key became a semaphore",
            Mode::Shared,
            Mode::Limit(2),
            Mode::Limit(2),
            LockError::IsSemaphore { limit: 2 },
        ),
        (
            "permit waiter, the key became a semaphore of another limit",
            Mode::Limit(3),
            Mode::Limit(2),
            Mode::Limit(2),
            LockError::IsSemaphore { limit: 2 },
        ),
        (
            "permit waiter, the key became a read-write lock",
            Mode::Limit(2),
            Mode::Shared,
            Mode::Shared,
            LockError::IsReadWrite,
        ),
    ];
    for (case, first, taken_as, next, error) in cases {
        let mut s = Scheduler::default();
        let mut port = FakePort::default();
        let k = key("k");
        // Queued while the key was free (between an outside DEL and its recheck), then the
        // key was taken as the other kind before the recheck ran.
        wait_as(
            &mut s,
            &mut port,
            1,
            &k,
            "x",
            first,
            5_000,
            Wait::Forever,
            None,
        )
        .unwrap();
        take(&mut port, &k, "holder", taken_as, 60_000);
        wait_as(
            &mut s,
            &mut port,
            2,
            &k,
            "y",
            next,
            5_000,
            Wait::Forever,
            None,
        )
        .unwrap();
        let now = port.now;
        advance_to(&mut s, &mut port, now);
        assert_eq!(
            port.answers(),
            [
                (1, Answer::Refused(error.reply())),
                (2, granted_as(2, &k, "y", next.kind())),
            ],
            "{case}"
        );
        assert_eq!(count_notes(&port, &Note::Mismatched), 1, "{case}");
        assert_eq!(s.waiters_on(&k), 0, "{case}");
    }
}

#[test]
fn a_closed_connection_ends_its_bound_holds_whatever_their_count_and_hands_each_key_on() {
    use HoldKind::{Exclusive as X, Permit as P, Shared as S};
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let [k1, k2, k3, k4, k5] = ["k1", "k2", "k3", "k4", "k5"].map(key);
    // k1: held three times by a, two writers waiting.
    let t1 = take(&mut port, &k1, "a", Mode::Exclusive, 60_000);
    take(&mut port, &k1, "a", Mode::Exclusive, 60_000);
    take(&mut port, &k1, "a", Mode::Exclusive, 60_000);
    s.bind(&mut port, 7, &k1, X, t1, 1_000);
    queue(
        &mut s,
        &mut port,
        &k1,
        &[(1, "w1", Mode::Exclusive), (2, "w2", Mode::Exclusive)],
    );
    // k2: a reads beside b; a writer waits for both.
    let t2 = take(&mut port, &k2, "a", Mode::Shared, 60_000);
    take(&mut port, &k2, "b", Mode::Shared, 60_000);
    s.bind(&mut port, 7, &k2, S, t2, 1_000);
    queue(&mut s, &mut port, &k2, &[(3, "w3", Mode::Exclusive)]);
    // k3: a permit nobody waits for.
    let t3 = take(&mut port, &k3, "a", Mode::Limit(2), 60_000);
    s.bind(&mut port, 7, &k3, P, t3, 1_000);
    // k4: bound when a waiter with the connection's binding was granted.
    take(&mut port, &k4, "h", Mode::Exclusive, 60_000);
    wait_as(
        &mut s,
        &mut port,
        4,
        &k4,
        "e",
        Mode::Exclusive,
        60_000,
        Wait::Forever,
        Some(7),
    )
    .unwrap();
    release_owner(&mut s, &mut port, &k4, b"h");
    let Some((4, Answer::Granted { token: t4, .. })) = port.answers().last().cloned() else {
        panic!("e was not granted k4: {:?}", port.answers());
    };
    // k5: another connection's hold.
    let t5 = take(&mut port, &k5, "z", Mode::Exclusive, 60_000);
    s.bind(&mut port, 8, &k5, X, t5, 1_000);
    for (k, t) in [(&k1, t1), (&k2, t2), (&k3, t3), (&k4, t4)] {
        assert_eq!(s.bound_client(k, t), Some(7), "{k:?}");
    }
    assert_eq!(s.bound_client(&k5, t5), Some(8));
    assert_eq!(s.bound_client(&k1, t5), None, "the key is part of the name");
    assert_eq!(s.bound_holds(), 5);

    let before = port.effects.len();
    let now = port.now;
    s.clients_gone(&mut port, vec![7], now);
    let effects = port.effects[before..].to_vec();

    let ended: HashSet<LockKey> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Removed { key, .. } => Some(key.clone()),
            _ => None,
        })
        .collect();
    let expected: HashSet<LockKey> = [&k1, &k2, &k3, &k4].into_iter().cloned().collect();
    assert_eq!(ended, expected);
    let disconnected: Vec<LockKey> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Noted(Note::Disconnected { key }) => Some(key.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(disconnected.len(), 4, "one note per hold");
    assert_eq!(disconnected.into_iter().collect::<HashSet<_>>(), expected);
    // Each holder is told it lost its hold to the closed connection, with its token.
    let told: HashSet<(LockKey, Option<u64>)> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Lost { key, lost } if lost.reason == LostReason::Disconnected => {
                Some((key.clone(), lost.token))
            }
            _ => None,
        })
        .collect();
    let bound: HashSet<(LockKey, Option<u64>)> = [(&k1, t1), (&k2, t2), (&k3, t3), (&k4, t4)]
        .into_iter()
        .map(|(k, t)| (k.clone(), Some(t)))
        .collect();
    assert_eq!(told, bound);
    let published: HashSet<LockKey> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Published { key } => Some(key.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        published,
        [k3.clone(), k4.clone()].into_iter().collect(),
        "only the keys that became free with nobody waiting"
    );
    // k1 goes to its head waiter, all three re-entries gone at once; k2 stays b's.
    assert_eq!(holders(&mut port, &k1), [("w1".into(), X)]);
    assert_eq!(s.waiters_on(&k1), 1);
    assert_eq!(holders(&mut port, &k2), [("b".into(), S)]);
    assert_eq!(s.waiters_on(&k2), 1);
    assert!(port.lock(&k3).is_none() && port.lock(&k4).is_none());
    assert_eq!(holders(&mut port, &k5), [("z".into(), X)]);
    for (k, t) in [(&k1, t1), (&k2, t2), (&k3, t3), (&k4, t4)] {
        assert_eq!(s.bound_client(k, t), None, "{k:?}");
    }
    assert_eq!(s.bound_holds(), 1);
    // Nothing more happens when the connection's close is reported twice.
    let before = port.effects.len();
    s.clients_gone(&mut port, vec![7], now);
    assert_eq!(port.effects.len(), before);
}

#[test]
fn a_connection_closed_while_writes_are_paused_ends_its_holds_after_the_pause() {
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let k = key("k");
    let t = take(&mut port, &k, "a", Mode::Exclusive, 60_000);
    take(&mut port, &k, "a", Mode::Exclusive, 60_000);
    s.bind(&mut port, 7, &k, HoldKind::Exclusive, t, 1_000);
    queue(&mut s, &mut port, &k, &[(1, "w", Mode::Exclusive)]);
    port.writes = Writes::Paused;
    let before = port.effects.len();
    // The fake port panics on any write while paused.
    s.clients_gone(&mut port, vec![7], 1_000);
    assert_eq!(
        port.effects.len(),
        before,
        "nothing written during the pause"
    );
    assert_eq!(s.next_deadline(), Some(1_000 + PAUSE_POLL_MS));
    advance_to(&mut s, &mut port, 1_000 + PAUSE_POLL_MS);
    assert_eq!(port.effects.len(), before, "still paused");
    assert_eq!(holders(&mut port, &k), [("a".into(), HoldKind::Exclusive)]);
    port.writes = Writes::Allowed;
    advance_to(&mut s, &mut port, 1_000 + 2 * PAUSE_POLL_MS);
    let effects = &port.effects[before..];
    assert_eq!(
        effects.first(),
        Some(&Effect::Removed {
            key: k.clone(),
            token: t
        })
    );
    assert!(effects.contains(&Effect::Noted(Note::Disconnected { key: k.clone() })));
    assert_eq!(
        who(&port),
        [(
            1,
            "w".into(),
            HoldKind::Exclusive,
            1_000 + 2 * PAUSE_POLL_MS
        )],
        "handed on after the pause"
    );
    assert_eq!(s.bound_client(&k, t), None);
}

#[test]
fn a_hold_unbound_after_its_release_is_left_alone_when_its_connection_closes() {
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let k = key("k");
    let t = take(&mut port, &k, "a", Mode::Exclusive, 60_000);
    s.bind(&mut port, 7, &k, HoldKind::Exclusive, t, 1_000);
    assert_eq!(s.bound_client(&k, t), Some(7));
    // The owner's last release ends the hold; the adapter unbinds it.
    release_owner(&mut s, &mut port, &k, b"a");
    s.unbind(&k, t);
    assert_eq!(s.bound_client(&k, t), None);
    assert_eq!(s.bound_holds(), 0);
    assert!(s.is_idle(), "nothing kept for a hold that is gone");
    take(&mut port, &k, "b", Mode::Exclusive, 60_000);
    let before = port.effects.len();
    let now = port.now;
    s.clients_gone(&mut port, vec![7], now);
    assert_eq!(port.effects.len(), before);
    assert_eq!(holders(&mut port, &k), [("b".into(), HoldKind::Exclusive)]);
}

#[test]
fn a_hold_whose_lease_ended_under_waiters_is_told_it_was_lost() {
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let k = key("k");
    // Two shared holds; a writer waits behind them; one lease ends first.
    let short = take(&mut port, &k, "a", Mode::Shared, 1_000);
    take(&mut port, &k, "b", Mode::Shared, 60_000);
    queue(&mut s, &mut port, &k, &[(1, "w", Mode::Exclusive)]);
    let end = port.now + 1_002;
    advance_to(&mut s, &mut port, end);
    let told: Vec<(LostReason, Vec<u8>, Option<u64>)> = port
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Lost { lost, .. } => Some((lost.reason, lost.owner.clone(), lost.token)),
            _ => None,
        })
        .collect();
    assert_eq!(
        told,
        vec![(LostReason::Expired, b"a".to_vec(), Some(short))]
    );
    // b still holds it: the writer waits on.
    assert_eq!(s.waiters_on(&k), 1);
}
