//! Multi-key waiters, case by case (the model in `multi_model` covers random mixes).

use super::testing::*;
use super::*;

fn key(name: &str) -> LockKey {
    LockKey::new(0, name.as_bytes())
}

fn exclusive(s: &mut Scheduler<u32>, port: &mut FakePort, h: u32, keys: &[LockKey], owner: &str) {
    wait_multi(
        s,
        port,
        h,
        keys,
        owner,
        Mode::Exclusive,
        1_000,
        Wait::Forever,
        None,
    )
    .unwrap();
}

fn take(port: &mut FakePort, k: &LockKey, owner: &str) -> u64 {
    port.acquire(k, owner, Mode::Exclusive, 60_000, false)
        .unwrap()
        .unwrap()
}

fn all_granted(answer: &Answer) -> Vec<(LockKey, u64)> {
    match answer {
        Answer::GrantedAll { holds, .. } => holds.clone(),
        other => panic!("not a multi-key grant: {other:?}"),
    }
}

#[test]
fn a_multi_key_waiter_gets_every_key_at_once_when_the_last_one_frees() {
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let (a, b) = (key("a"), key("b"));
    take(&mut port, &a, "x");
    take(&mut port, &b, "y");
    exclusive(&mut s, &mut port, 1, &[b.clone(), a.clone()], "m");
    release(&mut s, &mut port, &a);
    assert!(
        port.answers().is_empty(),
        "b is still held: nothing is granted"
    );
    assert!(port.lock(&a).is_none(), "a stays free, written by nobody");
    release(&mut s, &mut port, &b);
    let answers = port.answers();
    assert_eq!(answers.len(), 1);
    let holds = all_granted(&answers[0].1);
    // In the order asked, a token each, and both written before the answer.
    assert_eq!(
        holds.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(),
        [b.clone(), a.clone()]
    );
    for (k, token) in &holds {
        let lock = port.lock(k).cloned().unwrap();
        assert_eq!(lock.holds[0].owner.as_slice(), b"m");
        assert_eq!(lock.holds[0].token, Some(*token));
    }
    assert_eq!(s.waiting(), 0);
}

#[test]
fn nobody_passes_a_multi_key_waiter_on_a_key_it_waits_for() {
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let (a, b) = (key("a"), key("b"));
    take(&mut port, &b, "y");
    exclusive(&mut s, &mut port, 1, &[a.clone(), b.clone()], "m");
    // a is free, but m waits for it: a later waiter on a alone queues behind m...
    wait(&mut s, &mut port, 2, &a, "late", 1_000, Wait::Forever).unwrap();
    advance_to(&mut s, &mut port, 2_000);
    assert!(port.answers().is_empty());
    // ...and a direct acquire sees the queue (the command passes Queue::Waiting).
    assert_eq!(
        port.acquire(&a, "direct", Mode::Exclusive, 1_000, s.waiters_on(&a) > 0),
        Ok(None)
    );
    release(&mut s, &mut port, &b);
    let answers = port.answers();
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0].0, 1);
}

#[test]
fn requests_in_opposite_key_orders_do_not_deadlock() {
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let (a, b) = (key("a"), key("b"));
    take(&mut port, &a, "x");
    exclusive(&mut s, &mut port, 1, &[a.clone(), b.clone()], "first");
    exclusive(&mut s, &mut port, 2, &[b.clone(), a.clone()], "second");
    release(&mut s, &mut port, &a);
    assert_eq!(port.answers().len(), 1, "the first to arrive gets both");
    assert_eq!(port.answers()[0].0, 1);
    release_owner(&mut s, &mut port, &a, b"first");
    assert_eq!(port.answers().len(), 1, "second still needs b");
    release_owner(&mut s, &mut port, &b, b"first");
    assert_eq!(port.answers().len(), 2);
    assert_eq!(port.answers()[1].0, 2);
}

#[test]
fn a_multi_key_waiter_that_times_out_leaves_every_queue_and_the_next_is_looked_at() {
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let (a, b) = (key("a"), key("b"));
    take(&mut port, &a, "x");
    wait_multi(
        &mut s,
        &mut port,
        1,
        &[a.clone(), b.clone()],
        "m",
        Mode::Exclusive,
        1_000,
        Wait::For(50),
        None,
    )
    .unwrap();
    // b is free; this waiter only stands behind m.
    wait(&mut s, &mut port, 2, &b, "behind", 1_000, Wait::Forever).unwrap();
    let deadline = port.now + 50;
    advance_to(&mut s, &mut port, deadline);
    let answers = port.answers();
    assert_eq!(answers[0], (1, Answer::TimedOut));
    assert!(
        matches!(answers[1], (2, Answer::Granted { .. })),
        "{answers:?}"
    );
    assert_eq!(s.waiters_on(&a), 0);
}

#[test]
fn a_shared_multi_key_request_joins_shared_holders() {
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let (a, b) = (key("a"), key("b"));
    port.acquire(&a, "reader", Mode::Shared, 60_000, false)
        .unwrap();
    take(&mut port, &b, "x");
    wait_multi(
        &mut s,
        &mut port,
        1,
        &[a.clone(), b.clone()],
        "m",
        Mode::Shared,
        1_000,
        Wait::Forever,
        None,
    )
    .unwrap();
    release(&mut s, &mut port, &b);
    assert_eq!(port.answers().len(), 1);
    assert_eq!(port.lock(&a).unwrap().holds.len(), 2, "beside the reader");
}

#[test]
fn a_multi_key_request_that_does_not_fit_a_key_is_refused_and_unblocks_the_rest() {
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let (a, b) = (key("a"), key("b"));
    port.acquire(&a, "p", Mode::Limit(2), 60_000, false)
        .unwrap();
    take(&mut port, &b, "x");
    exclusive(&mut s, &mut port, 1, &[a.clone(), b.clone()], "m");
    wait(&mut s, &mut port, 2, &b, "behind", 1_000, Wait::Forever).unwrap();
    release(&mut s, &mut port, &b);
    let answers = port.answers();
    assert!(
        matches!(&answers[0], (1, Answer::Refused(e)) if e.contains("semaphore")),
        "{answers:?}"
    );
    let now = port.now;
    advance_to(&mut s, &mut port, now);
    assert!(matches!(port.answers()[1], (2, Answer::Granted { .. })));
}

#[test]
fn asking_again_for_the_same_keys_keeps_the_place_and_for_other_keys_goes_to_the_tail() {
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let (a, b) = (key("a"), key("b"));
    take(&mut port, &a, "x");
    exclusive(&mut s, &mut port, 1, &[a.clone(), b.clone()], "m");
    exclusive(&mut s, &mut port, 2, std::slice::from_ref(&a), "other");
    exclusive(&mut s, &mut port, 3, &[b.clone(), a.clone()], "m");
    assert_eq!(
        port.answers()[0],
        (1, Answer::Refused(REPLACED.to_string()))
    );
    release(&mut s, &mut port, &a);
    assert_eq!(
        port.answers()[1].0,
        3,
        "same keys: the same place, ahead of 'other'"
    );
    // 'm' asks again for a only: a request for other keys queues at the tail.
    let mut s2 = Scheduler::default();
    let mut port2 = FakePort::default();
    take(&mut port2, &a, "x");
    exclusive(&mut s2, &mut port2, 1, &[a.clone(), b.clone()], "m");
    exclusive(&mut s2, &mut port2, 2, std::slice::from_ref(&a), "other");
    exclusive(&mut s2, &mut port2, 3, std::slice::from_ref(&a), "m");
    assert_eq!(
        port2.answers()[0],
        (1, Answer::Refused(REPLACED.to_string()))
    );
    release(&mut s2, &mut port2, &a);
    assert_eq!(port2.answers()[1].0, 2, "other keys: behind 'other'");
}

#[test]
fn twenty_thousand_multi_key_waiters_are_granted_one_by_one() {
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let (a, b) = (key("a"), key("b"));
    take(&mut port, &a, "x");
    let n = 20_000u32;
    for h in 0..n {
        exclusive(
            &mut s,
            &mut port,
            h,
            &[a.clone(), b.clone()],
            &format!("m{h}"),
        );
    }
    port.effects.clear();
    release(&mut s, &mut port, &a);
    for h in 0..n {
        let answers = port.answers();
        assert_eq!(answers.len(), 1);
        assert_eq!(answers[0].0, h, "in arrival order");
        port.effects.clear();
        let owner = format!("m{h}");
        release_owner(&mut s, &mut port, &a, owner.as_bytes());
        release_owner(&mut s, &mut port, &b, owner.as_bytes());
        let now = port.now;
        advance_to(&mut s, &mut port, now);
    }
    assert_eq!(s.waiting(), 0);
}

/// Review finding: a one-key waiter ahead of a multi-key request is refused (it asks for what
/// the key cannot give it now); the request behind it then heads every queue and fits, and is
/// looked at again at once, not at the next lease end.
#[test]
fn a_multi_key_request_behind_a_refused_waiter_is_looked_at_again() {
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let (a, b) = (key("a"), key("b"));
    take(&mut port, &b, "x");
    // s waits for b exclusively; w (shared, a and b) waits behind it.
    wait(&mut s, &mut port, 1, &b, "s", 1_000, Wait::Forever).unwrap();
    wait_multi(
        &mut s,
        &mut port,
        2,
        &[b.clone(), a.clone()],
        "w",
        Mode::Shared,
        1_000,
        Wait::Forever,
        None,
    )
    .unwrap();
    let now = port.now;
    advance_to(&mut s, &mut port, now);
    assert!(port.answers().is_empty());
    // b becomes a shared key held by s (s may not upgrade) and t, from outside.
    port.keys.remove(&b);
    port.acquire(&b, "s", Mode::Shared, 60_000, false).unwrap();
    port.acquire(&b, "t", Mode::Shared, 60_000, false).unwrap();
    let now = port.now;
    s.keys_changed(&mut port, vec![Change::Key(b.clone(), Cause::Freed)], now);
    advance_to(&mut s, &mut port, now);
    let answers = port.answers();
    assert!(
        matches!(&answers[0], (1, Answer::Refused(_))),
        "{answers:?}"
    );
    assert!(
        matches!(answers.get(1), Some((2, Answer::GrantedAll { .. }))),
        "w heads both queues and fits: {answers:?}"
    );
}

fn shared(s: &mut Scheduler<u32>, port: &mut FakePort, h: u32, keys: &[LockKey], owner: &str) {
    wait_multi(
        s,
        port,
        h,
        keys,
        owner,
        Mode::Shared,
        60_000,
        Wait::Forever,
        None,
    )
    .unwrap();
}

/// Review finding: a run of multi-key shared waiters was granted one request at a time, each
/// grant reading every key again with every holder granted so far (O(N² × keys)). Now the run
/// is one batch: each key read once and written once, every waiter answered in arrival order.
#[test]
fn a_run_of_multi_key_shared_waiters_is_one_batch_reading_and_writing_each_key_once() {
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let keys: Vec<LockKey> = ["a", "b", "c", "d"].into_iter().map(key).collect();
    take(&mut port, &keys[0], "writer");
    let n = 400u32;
    for h in 0..n {
        shared(&mut s, &mut port, h, &keys, &format!("r{h}"));
    }
    port.effects.clear();
    (port.reads, port.key_writes) = (0, 0);
    release(&mut s, &mut port, &keys[0]);
    let answers = port.answers();
    assert_eq!(answers.len(), n as usize, "the whole run in one release");
    for (at, (h, answer)) in answers.iter().enumerate() {
        assert_eq!(*h, at as u32, "arrival order");
        assert_eq!(all_granted(answer).len(), keys.len());
    }
    assert_eq!((port.reads, port.key_writes), (4, 4));
    for k in &keys {
        assert_eq!(port.lock(k).unwrap().holds.len(), n as usize);
    }
    assert_eq!(s.waiting(), 0);
}

/// A run larger than a batch ([`batch::BATCH_HOLDS`] holds) is granted over several turns of
/// the event loop, a millisecond apart, in arrival order; each turn reads and writes each key
/// once. At the caps: 1,000 waiters (the most holders a key may have), each on 64 keys (the
/// most one request may name).
#[test]
fn a_run_larger_than_a_batch_is_granted_over_several_turns_in_arrival_order() {
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let keys: Vec<LockKey> = (0..crate::args::MAX_MULTI_KEYS)
        .map(|i| key(&format!("k{i}")))
        .collect();
    take(&mut port, &keys[0], "writer");
    let n = crate::kind::MAX_HOLDERS as u32;
    for h in 0..n {
        shared(&mut s, &mut port, h, &keys, &format!("r{h}"));
    }
    // (What queueing on free keys scheduled runs first, as it would on the server.)
    let now = port.now;
    advance_to(&mut s, &mut port, now);
    port.effects.clear();
    (port.reads, port.key_writes) = (0, 0);
    release(&mut s, &mut port, &keys[0]);
    let per_turn = batch::BATCH_HOLDS.div_ceil(keys.len());
    let mut turns = 1;
    loop {
        let granted = port.answers().len();
        assert!(granted <= turns * per_turn, "{granted} after {turns} turns");
        assert!(port.reads <= keys.len() && port.key_writes <= keys.len());
        if s.waiting() == 0 {
            break;
        }
        // The rest at the next turn, a millisecond later.
        assert_eq!(s.next_deadline(), Some(port.now + batch::CONTINUE_AFTER_MS));
        (port.reads, port.key_writes) = (0, 0);
        let now = port.now + batch::CONTINUE_AFTER_MS;
        port.now = now;
        s.timer_fired(&mut port, now);
        assert!(port.answers().len() > granted, "each turn grants some");
        turns += 1;
    }
    assert_eq!(turns, (n as usize).div_ceil(per_turn));
    let answers = port.answers();
    let order: Vec<u32> = answers.iter().map(|(h, _)| *h).collect();
    assert_eq!(order, (0..n).collect::<Vec<_>>());
    assert!(answers
        .iter()
        .all(|(_, a)| all_granted(a).len() == keys.len()));
}

/// Review finding: a batch bounded what it granted, not what it read. One grant of a multi-key
/// waiter sends the batch to each of its other keys; a busy multi-key head there reads all of
/// its keys. Here one release grants W0 (A and 16 free keys B), and each Bj is headed by a
/// waiter Vj on Bj and 63 keys of 1,000 shared holds, busy: the batch reads one Vj's keys, then
/// leaves the other Bj to the next turn, instead of reading 16 x 63 keys of 1,000 holds at once.
#[test]
fn a_batch_that_granted_stops_looking_once_it_read_its_share() {
    let mut s = Scheduler::default();
    let mut port = FakePort::default();
    let a = key("a");
    take(&mut port, &a, "writer");
    let bs: Vec<LockKey> = (0..16).map(|j| key(&format!("b{j}"))).collect();
    let mut w0 = vec![a.clone()];
    w0.extend(bs.iter().cloned());
    shared(&mut s, &mut port, 0, &w0, "w0");
    let readers = crate::hold::Lock {
        family: crate::kind::Family::ReadWrite,
        holds: (0..1_000u64)
            .map(|r| crate::hold::Hold {
                owner: format!("r{r}").into_bytes().into(),
                kind: crate::kind::HoldKind::Shared,
                count: 1,
                expires_at: Some(port.now + 60_000),
                token: Some(1 + r),
            })
            .collect(),
    };
    for (j, b) in bs.iter().enumerate() {
        let mut keys = vec![b.clone()];
        for c in 0..63 {
            let k = key(&format!("c{j}-{c}"));
            port.keys.insert(k.clone(), readers.clone());
            keys.push(k);
        }
        exclusive(&mut s, &mut port, 1 + j as u32, &keys, &format!("v{j}"));
    }
    let now = port.now;
    advance_to(&mut s, &mut port, now);
    (port.reads, port.effects) = (0, Vec::new());
    release(&mut s, &mut port, &a);
    assert_eq!(port.answers().len(), 1, "w0 is granted in the release");
    // a and the 16 b keys, then one v's 63 keys: the rest waits for the next turn.
    assert!(
        port.reads <= 1 + 16 + 63,
        "{} keys read in one batch",
        port.reads
    );
    let later = port.now + batch::CONTINUE_AFTER_MS;
    advance_to(&mut s, &mut port, later + 100);
    assert_eq!(s.waiting(), 16, "every v is still busy and still waits");
}
