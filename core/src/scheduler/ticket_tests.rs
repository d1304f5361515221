//! Tickets: the same queue as blocked clients, answers written into the ticket, a grant
//! delivered exactly once (popped, taken by a cancel, or passed on when its connection closes).

use super::testing::*;
use super::*;
use crate::hold::{Family, Hold, Lock};
use crate::ticket::MARKER_TTL_MS;

fn key(name: &str) -> LockKey {
    LockKey::new(0, name.as_bytes())
}

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

fn ticket(
    s: &mut Scheduler<u32>,
    port: &mut FakePort,
    client: ClientId,
    k: &LockKey,
    owner: &str,
    wait: Wait,
) -> Ticket {
    wait_ticket(
        s,
        port,
        client,
        std::slice::from_ref(k),
        owner,
        Mode::Exclusive,
        5_000,
        wait,
        None,
    )
    .unwrap()
}

/// The token the key's hold of `owner` has, if it holds it.
fn token_of(port: &mut FakePort, k: &LockKey, owner: &str) -> Option<u64> {
    port.lock(k).and_then(|l| {
        l.holds
            .iter()
            .find(|h| h.owner.as_slice() == owner.as_bytes())
            .and_then(|h| h.token)
    })
}

fn granted(port: &FakePort, t: &Ticket) -> Option<u64> {
    match ticket_value(port, t) {
        Some(TicketValue::Granted(tokens)) => tokens.first().copied(),
        _ => None,
    }
}

#[test]
fn tickets_and_blocked_clients_share_one_fifo_queue() {
    let (mut s, mut port, k) = setup();
    let t1 = ticket(&mut s, &mut port, 7, &k, "t1", Wait::Forever);
    wait(&mut s, &mut port, 2, &k, "b2", 5_000, Wait::Forever).unwrap();
    let t3 = ticket(&mut s, &mut port, 7, &k, "t3", Wait::Forever);
    assert_eq!(s.waiters_on(&k), 3);
    assert_eq!(s.open_tickets(), 2);
    assert!(port.tickets.is_empty(), "nothing is written while queued");

    release(&mut s, &mut port, &k);
    let token = granted(&port, &t1).expect("t1 granted first");
    assert_eq!(
        token_of(&mut port, &k, "t1"),
        Some(token),
        "written before told"
    );
    assert!(port.answers().is_empty() && granted(&port, &t3).is_none());
    // The grant's ticket expires with its lease.
    let (_, expires_at) = port.tickets[&t1.name];
    assert_eq!(expires_at, port.now + 5_000);

    assert_eq!(
        pop(&mut s, &mut port, &t1.name),
        Some(token.to_string().into_bytes())
    );
    release(&mut s, &mut port, &k);
    assert!(matches!(
        port.answers().as_slice(),
        [(2, Answer::Granted { .. })]
    ));
    release(&mut s, &mut port, &k);
    assert!(granted(&port, &t3).is_some());
    pop(&mut s, &mut port, &t3.name);
    let to = port.now + 10;
    advance_to(&mut s, &mut port, to);
    assert_eq!(s.open_tickets(), 0, "popped grants are done");
    assert!(s.is_idle());
}

#[test]
fn a_ticket_times_out_at_its_deadline_with_a_marker_that_expires() {
    let (mut s, mut port, k) = setup();
    let t = ticket(&mut s, &mut port, 1, &k, "t", Wait::For(200));
    advance_to(&mut s, &mut port, 1_199);
    assert!(port.tickets.is_empty());
    advance_to(&mut s, &mut port, 1_200);
    assert_eq!(ticket_value(&port, &t), Some(TicketValue::TimedOut));
    assert_eq!(port.tickets[&t.name].1, 1_200 + MARKER_TTL_MS);
    assert_eq!(s.waiters_on(&k), 0);
    assert_eq!(s.open_tickets(), 0, "a marker is done once written");
    assert!(s.is_idle());
}

#[test]
fn cancel_takes_a_queued_ticket_out_and_the_next_waiter_is_served() {
    let (mut s, mut port, k) = setup();
    let t1 = ticket(&mut s, &mut port, 1, &k, "t1", Wait::Forever);
    let t2 = ticket(&mut s, &mut port, 1, &k, "t2", Wait::Forever);
    let now = port.now;
    assert_eq!(s.cancel(&mut port, t1.name, now), Cancelled::Left);
    assert_eq!(s.cancel(&mut port, t1.name, now), Cancelled::Nothing);
    release(&mut s, &mut port, &k);
    assert!(granted(&port, &t2).is_some());
    assert!(
        !port.tickets.contains_key(&t1.name),
        "a cancelled ticket is never written"
    );
}

#[test]
fn cancel_hands_over_a_grant_that_was_not_popped_exactly_once() {
    // Decided and not yet written (the outbox), then written and not popped.
    for written in [false, true] {
        let (mut s, mut port, k) = setup();
        port.deliver_max = if written { usize::MAX } else { 0 };
        let t = ticket(&mut s, &mut port, 1, &k, "t", Wait::Forever);
        let next = ticket(&mut s, &mut port, 2, &k, "next", Wait::Forever);
        release(&mut s, &mut port, &k);
        let token = token_of(&mut port, &k, "t").expect("granted");
        assert_eq!(port.tickets.contains_key(&t.name), written);
        let now = port.now;
        assert_eq!(
            s.cancel(&mut port, t.name, now),
            Cancelled::Handed(vec![token])
        );
        assert!(!port.tickets.contains_key(&t.name));
        // Handed once: not written later, not handed again, not passed on at the close.
        port.deliver_max = usize::MAX;
        assert_eq!(s.cancel(&mut port, t.name, now), Cancelled::Nothing);
        s.clients_gone(&mut port, vec![1], now);
        advance_to(&mut s, &mut port, now + 100);
        assert!(!port.tickets.contains_key(&t.name));
        assert_eq!(
            token_of(&mut port, &k, "t"),
            Some(token),
            "the canceller holds it"
        );
        assert!(granted(&port, &next).is_none());
        assert!(s.open_tickets() == 1, "only the next waiter's ticket");
    }
}

#[test]
fn a_popped_grant_is_never_taken_back() {
    let (mut s, mut port, k) = setup();
    let t = ticket(&mut s, &mut port, 1, &k, "t", Wait::Forever);
    let next = ticket(&mut s, &mut port, 2, &k, "next", Wait::Forever);
    release(&mut s, &mut port, &k);
    let token = granted(&port, &t).unwrap();
    pop(&mut s, &mut port, &t.name);
    let now = port.now;
    assert_eq!(s.cancel(&mut port, t.name, now), Cancelled::Nothing);
    s.clients_gone(&mut port, vec![1], now);
    advance_to(&mut s, &mut port, now + 100);
    assert_eq!(token_of(&mut port, &k, "t"), Some(token));
    assert!(granted(&port, &next).is_none());
}

#[test]
fn a_closed_connection_s_queued_tickets_leave_and_its_unpopped_grant_is_passed_on() {
    for written in [false, true] {
        let (mut s, mut port, k) = setup();
        port.deliver_max = if written { usize::MAX } else { 0 };
        let t = ticket(&mut s, &mut port, 1, &k, "t", Wait::Forever);
        let queued = ticket(&mut s, &mut port, 1, &key("other"), "q", Wait::Forever);
        hold(&mut port, &key("other"), "x", 61_000);
        let next = ticket(&mut s, &mut port, 2, &k, "next", Wait::Forever);
        release(&mut s, &mut port, &k);
        assert!(token_of(&mut port, &k, "t").is_some());
        let now = port.now;
        s.clients_gone(&mut port, vec![1], now);
        port.deliver_max = usize::MAX;
        advance_to(&mut s, &mut port, now);
        assert_eq!(s.waiters_on(&key("other")), 0, "its queued ticket left");
        assert!(!port.tickets.contains_key(&queued.name));
        assert!(!port.tickets.contains_key(&t.name), "taken back");
        assert_eq!(token_of(&mut port, &k, "t"), None, "its grant ended");
        assert!(
            granted(&port, &next).is_some(),
            "and went to the next waiter"
        );
        assert!(count_notes(&port, &Note::AbandonedGrant) == 1);
        assert!(
            !port
                .effects
                .iter()
                .any(|e| matches!(e, Effect::Lost { .. })),
            "a grant nobody received is not a lost hold"
        );
    }
}

#[test]
fn a_written_grant_is_forgotten_once_popped_or_answered_expired_at_its_lease_end() {
    let (mut s, mut port, k) = setup();
    let t = ticket(&mut s, &mut port, 1, &k, "t", Wait::Forever);
    release(&mut s, &mut port, &k);
    let now = port.now;
    advance_to(&mut s, &mut port, now + 50);
    assert_eq!(s.open_tickets(), 1, "not popped: still the connection's");
    assert!(pop(&mut s, &mut port, &t.name).is_some());
    advance_to(&mut s, &mut port, now + 70_000);
    assert_eq!(s.open_tickets(), 0);
    assert!(s.is_idle());
    assert_eq!(
        port.tickets.get(&t.name),
        None,
        "a popped grant is never rewritten"
    );
    assert_eq!(count_notes(&port, &Note::GrantLapsed), 0);

    // Never popped: at its lease end the ticket is answered `expired` instead (a client still
    // blocked on it is told), kept for the markers' time.
    let (mut s, mut port, k) = setup();
    let t = ticket(&mut s, &mut port, 1, &k, "t", Wait::Forever);
    release(&mut s, &mut port, &k);
    let granted_at = port.now;
    advance_to(&mut s, &mut port, granted_at + 4_999);
    assert!(matches!(
        port.tickets
            .get(&t.name)
            .map(|(v, _)| TicketValue::decode(v)),
        Some(Some(TicketValue::Granted(_)))
    ));
    advance_to(&mut s, &mut port, granted_at + 5_001);
    assert_eq!(
        port.tickets.get(&t.name),
        Some(&(b"expired".to_vec(), granted_at + 5_001 + MARKER_TTL_MS))
    );
    assert_eq!(count_notes(&port, &Note::GrantLapsed), 1);
    assert_eq!(s.open_tickets(), 0);
    assert!(s.is_idle());
    assert_eq!(pop(&mut s, &mut port, &t.name), Some(b"expired".to_vec()));
}

#[test]
fn a_grant_that_lapses_while_writes_are_paused_is_answered_when_the_pause_ends() {
    let (mut s, mut port, k) = setup();
    let t = ticket(&mut s, &mut port, 1, &k, "t", Wait::Forever);
    release(&mut s, &mut port, &k);
    let granted_at = port.now;
    advance_to(&mut s, &mut port, granted_at + 10);
    port.writes = Writes::Paused;
    advance_to(&mut s, &mut port, granted_at + 6_000);
    assert!(
        !port.ticket_unpopped(&t.name),
        "expired with its lease, not answered yet"
    );
    assert_eq!(s.open_tickets(), 1);
    port.writes = Writes::Allowed;
    advance_to(&mut s, &mut port, granted_at + 6_100);
    assert_eq!(pop(&mut s, &mut port, &t.name), Some(b"expired".to_vec()));
    assert_eq!(s.open_tickets(), 0);
    assert!(s.is_idle());
}

#[test]
fn a_multi_key_ticket_gets_every_token_in_the_order_asked() {
    let mut port = FakePort::default();
    let mut s = Scheduler::default();
    let (a, b) = (key("{t}a"), key("{t}b"));
    hold(&mut port, &b, "x", 61_000);
    let keys = [b.clone(), a.clone()];
    let t = wait_ticket(
        &mut s,
        &mut port,
        1,
        &keys,
        "m",
        Mode::Exclusive,
        5_000,
        Wait::Forever,
        None,
    )
    .unwrap();
    assert_eq!(t.name.shape, Shape::Many);
    assert_eq!(t.name.slot, crate::slot::key_slot(b"{t}a"));
    release(&mut s, &mut port, &b);
    let tokens = vec![
        token_of(&mut port, &b, "m").unwrap(),
        token_of(&mut port, &a, "m").unwrap(),
    ];
    assert_eq!(
        ticket_value(&port, &t),
        Some(TicketValue::Granted(tokens.clone()))
    );
    let now = port.now;
    assert_eq!(s.cancel(&mut port, t.name, now), Cancelled::Handed(tokens));
}

#[test]
fn nothing_is_written_into_tickets_while_writes_are_paused() {
    let (mut s, mut port, k) = setup();
    let t = ticket(&mut s, &mut port, 1, &k, "t", Wait::For(100));
    port.writes = Writes::Paused;
    advance_to(&mut s, &mut port, 1_500);
    assert!(port.tickets.is_empty(), "the timeout waits for the pause");
    assert_eq!(s.waiters_on(&k), 0, "but the ticket left the queue on time");
    port.writes = Writes::Allowed;
    advance_to(&mut s, &mut port, 1_500 + PAUSE_POLL_MS);
    assert_eq!(ticket_value(&port, &t), Some(TicketValue::TimedOut));
}

#[test]
fn a_ticket_replaced_by_its_owner_and_a_redirected_one_are_told_why() {
    let (mut s, mut port, k) = setup();
    let old = ticket(&mut s, &mut port, 1, &k, "o", Wait::Forever);
    let new = ticket(&mut s, &mut port, 1, &k, "o", Wait::Forever);
    assert_eq!(
        ticket_value(&port, &old),
        Some(TicketValue::Refused(REPLACED.to_string()))
    );
    port.keys.remove(&k);
    port.moved
        .insert(k.clone(), "MOVED 1 127.0.0.1:7001".into());
    let now = port.now;
    s.keys_changed(&mut port, vec![Change::Key(k.clone(), Cause::Freed)], now);
    deliver(&mut s, &mut port);
    assert_eq!(
        ticket_value(&port, &new),
        Some(TicketValue::Refused("MOVED 1 127.0.0.1:7001".into()))
    );
    assert_eq!(
        port.tickets[&new.name].0,
        b"-MOVED 1 127.0.0.1:7001".to_vec()
    );
}

#[test]
fn a_storm_of_grants_is_written_so_many_a_turn() {
    let mut port = FakePort::default();
    let mut s = Scheduler::default();
    let k = key("k");
    hold(&mut port, &k, "x", 61_000);
    port.deliver_max = 0;
    let tickets: Vec<Ticket> = (0..1_000)
        .map(|i| {
            wait_ticket(
                &mut s,
                &mut port,
                1,
                std::slice::from_ref(&k),
                &format!("r{i}"),
                Mode::Shared,
                5_000,
                Wait::Forever,
                None,
            )
            .unwrap()
        })
        .collect();
    release(&mut s, &mut port, &k);
    let now = port.now;
    assert_eq!(s.deliver_tickets(&mut port, 300, now), Delivery::More);
    assert_eq!(port.tickets.len(), 300);
    assert_eq!(s.deliver_tickets(&mut port, 800, now), Delivery::Done);
    assert_eq!(port.tickets.len(), 1_000);
    let written: Vec<TicketName> = tickets_written(&port).iter().map(|w| w.0).collect();
    let asked: Vec<TicketName> = tickets.iter().map(|t| t.name).collect();
    assert_eq!(written, asked, "in the order granted");
}

#[test]
fn grants_lapsing_together_are_rewritten_a_batch_a_turn() {
    let mut port = FakePort::default();
    let mut s = Scheduler::default();
    // Shared waiters on several keys (a key takes at most so many holders).
    let keys: Vec<LockKey> = (0..10).map(|i| key(&format!("k{i}"))).collect();
    for k in &keys {
        hold(&mut port, k, "x", 61_000);
    }
    let n = 2 * batch::TURN_START_LIMIT / batch::GRANT_COST + 10;
    for i in 0..n {
        wait_ticket(
            &mut s,
            &mut port,
            1,
            std::slice::from_ref(&keys[i % keys.len()]),
            &format!("r{i}"),
            Mode::Shared,
            5_000,
            Wait::Forever,
            None,
        )
        .unwrap();
    }
    for k in &keys {
        release(&mut s, &mut port, k);
    }
    let granted_at = port.now;
    advance_to(&mut s, &mut port, granted_at + 10);
    assert_eq!(tickets_answered(&port).len(), n);
    assert_eq!(count_notes(&port, &Note::GrantLapsed), 0);
    port.now = granted_at + 5_001;
    s.timer_fired(&mut port, granted_at + 5_001);
    let first = count_notes(&port, &Note::GrantLapsed);
    assert!(
        first > 0 && first <= batch::TURN_START_LIMIT / batch::GRANT_COST,
        "{first}"
    );
    advance_to(&mut s, &mut port, granted_at + 5_100);
    assert_eq!(count_notes(&port, &Note::GrantLapsed), n);
    assert!(s.is_idle());
}

fn count_notes(port: &FakePort, note: &Note) -> usize {
    port.effects
        .iter()
        .filter(|e| matches!(e, Effect::Noted(n) if n == note))
        .count()
}

#[test]
fn a_flood_of_deadlines_due_at_once_is_spread_over_turns_a_millisecond_apart() {
    let (mut s, mut port, k) = setup();
    let n = 2 * batch::TURN_START_LIMIT;
    for i in 0..n {
        let owner = format!("w{i}");
        let keys = [key(&format!("k{i}"))];
        hold(&mut port, &keys[0], "x", 61_000);
        wait_ticket(
            &mut s,
            &mut port,
            1,
            &keys,
            &owner,
            Mode::Exclusive,
            5_000,
            Wait::For(100),
            None,
        )
        .unwrap();
    }
    let _ = k;
    let now = port.now + 100;
    port.now = now;
    s.timer_fired(&mut port, now);
    deliver(&mut s, &mut port);
    let first = tickets_written(&port).len();
    assert!(
        first > 0 && first <= batch::TURN_START_LIMIT,
        "{first} in the first turn"
    );
    assert_eq!(s.next_deadline(), Some(now + batch::CONTINUE_AFTER_MS));
    advance_to(&mut s, &mut port, now + 10);
    assert_eq!(tickets_written(&port).len(), n, "every timeout answered");
    assert!(tickets_written(&port)
        .iter()
        .all(|(_, v, _, _)| *v == TicketValue::TimedOut));
}

/// A storm of lease ends over many keys of ticket waiters: each turn grants about as many as
/// it writes (a run of one key is not split), not the thousands its work limit would allow —
/// every grant's ticket is written within a turn or two of it.
#[test]
fn ticket_waiters_are_granted_no_faster_than_their_answers_are_written() {
    const KEYS: usize = 300;
    const PER_KEY: usize = 10;
    let mut port = FakePort::default();
    let mut s = Scheduler::default();
    port.deliver_max = tickets::TICKETS_PER_TURN;
    let keys: Vec<LockKey> = (0..KEYS).map(|i| key(&format!("k{i}"))).collect();
    for k in &keys {
        hold(&mut port, k, "x", 61_000);
    }
    let mut asked = Vec::new();
    for i in 0..KEYS * PER_KEY {
        let k = std::slice::from_ref(&keys[i % KEYS]);
        let t = wait_ticket(
            &mut s,
            &mut port,
            1,
            k,
            &format!("w{i}"),
            Mode::Shared,
            5_000,
            Wait::Forever,
            None,
        )
        .unwrap();
        asked.push(t.name);
    }
    // Every lease ends at once; the turns follow a millisecond apart.
    let mut now = 61_001;
    let mut turns = 0;
    while s.waiting() > 0 {
        port.now = now;
        let before = tickets_written(&port).len() + s.tickets_unwritten();
        s.timer_fired(&mut port, now);
        let granted = tickets_written(&port).len() + s.tickets_unwritten() - before;
        deliver(&mut s, &mut port);
        assert!(
            granted <= tickets::TICKETS_PER_TURN + PER_KEY,
            "{granted} granted in turn {turns}"
        );
        assert!(
            s.tickets_unwritten() < PER_KEY,
            "{} left unwritten after turn {turns}",
            s.tickets_unwritten()
        );
        turns += 1;
        if s.waiting() > 0 {
            now = s.next_deadline().expect("the rest is scheduled");
            assert_eq!(now, port.now + batch::CONTINUE_AFTER_MS);
        }
    }
    assert!(turns >= KEYS * PER_KEY / (tickets::TICKETS_PER_TURN + PER_KEY));
    let written = tickets_written(&port);
    assert_eq!(written.len(), KEYS * PER_KEY);
    assert!(written
        .iter()
        .all(|(_, v, _, _)| matches!(v, TicketValue::Granted(_))));
    // Key by key in the order the lease checks were due, each key's waiters in their order.
    let mut by_key: Vec<Vec<TicketName>> = vec![Vec::new(); KEYS];
    for (i, name) in asked.iter().enumerate() {
        by_key[i % KEYS].push(*name);
    }
    let order: Vec<TicketName> = by_key.concat();
    assert_eq!(written.iter().map(|w| w.0).collect::<Vec<_>>(), order);
}

#[test]
fn a_flush_answers_the_grants_written_in_its_database_expired() {
    let (mut s, mut port, k) = setup();
    let t = ticket(&mut s, &mut port, 1, &k, "t", Wait::Forever);
    let other = LockKey::new(1, b"k");
    hold(&mut port, &other, "x", 61_000);
    let u = ticket(&mut s, &mut port, 1, &other, "u", Wait::Forever);
    release(&mut s, &mut port, &k);
    release(&mut s, &mut port, &other);
    assert_eq!(s.open_tickets(), 2);
    // FLUSHDB 0: the hold and the ticket go; the ticket is answered `expired` at once.
    port.keys.retain(|key, _| key.db != 0);
    port.tickets.retain(|name, _| name.db != 0);
    let now = port.now;
    s.flushed(Some(0), now);
    advance_to(&mut s, &mut port, now);
    assert_eq!(s.open_tickets(), 1, "db 1's grant is still there");
    assert_eq!(pop(&mut s, &mut port, &t.name), Some(b"expired".to_vec()));
    assert!(matches!(
        port.tickets
            .get(&u.name)
            .map(|(v, _)| TicketValue::decode(v)),
        Some(Some(TicketValue::Granted(_)))
    ));
    port.keys.clear();
    port.tickets.clear();
    s.flushed(None, now);
    advance_to(&mut s, &mut port, now);
    assert_eq!(s.open_tickets(), 0);
    assert_eq!(pop(&mut s, &mut port, &u.name), Some(b"expired".to_vec()));
    assert!(s.is_idle());
}

#[test]
fn a_grant_its_owner_renewed_before_the_pop_stands_until_the_new_lease_end() {
    let (mut s, mut port, k) = setup();
    let t = ticket(&mut s, &mut port, 1, &k, "t", Wait::Forever);
    release(&mut s, &mut port, &k);
    let granted_at = port.now;
    let token = match port
        .tickets
        .get(&t.name)
        .map(|(v, _)| TicketValue::decode(v))
    {
        Some(Some(TicketValue::Granted(tokens))) => tokens[0],
        other => panic!("{other:?}"),
    };
    // `LOCK.RENEW k t 60000` by the owner's name, before anyone popped the grant.
    let renewed_to = granted_at + 60_000;
    if let Some(lock) = port.keys.get_mut(&k) {
        for h in lock.holds.iter_mut() {
            h.expires_at = Some(renewed_to);
        }
    }
    advance_to(&mut s, &mut port, granted_at + 5_001);
    assert_eq!(count_notes(&port, &Note::GrantLapsed), 0);
    assert_eq!(
        port.tickets.get(&t.name),
        Some(&(token.to_string().into_bytes(), renewed_to)),
        "the grant written back, to expire with the renewed lease"
    );
    assert_eq!(s.open_tickets(), 1);
    // Not renewed again: at the new lease end it is answered `expired`.
    advance_to(&mut s, &mut port, renewed_to + 1);
    assert_eq!(count_notes(&port, &Note::GrantLapsed), 1);
    assert_eq!(pop(&mut s, &mut port, &t.name), Some(b"expired".to_vec()));
    assert!(s.is_idle());
}

/// One connection may own any number of tickets: its close ends them a turn at a time
/// (`TICKETS_ENDED_PER_TURN`), the turns a pause check apart, so the server keeps answering
/// (200,000 in one turn took half a second). The other connections' tickets stay queued.
#[test]
fn a_connection_owning_many_tickets_is_ended_a_bounded_batch_a_turn() {
    const KEYS: usize = 10;
    let cap = tickets::TICKETS_ENDED_PER_TURN;
    let many = cap * 2 + cap / 2;
    let mut port = FakePort::default();
    let mut s = Scheduler::default();
    let keys: Vec<LockKey> = (0..KEYS).map(|i| key(&format!("k{i}"))).collect();
    for k in &keys {
        hold(&mut port, k, "x", 600_000);
    }
    for i in 0..many {
        ticket(
            &mut s,
            &mut port,
            1,
            &keys[i % KEYS],
            &format!("w{i}"),
            Wait::Forever,
        );
    }
    let other = ticket(&mut s, &mut port, 2, &keys[0], "other", Wait::Forever);
    assert_eq!(s.waiting(), many + 1);
    let mut now = port.now;
    s.clients_gone(&mut port, vec![1], now);
    let mut ended = count_notes(&port, &Note::Cancelled);
    assert_eq!(ended, cap, "the first turn ends a batch");
    let mut turns = 1;
    while s.waiting() > 1 {
        now = s.next_deadline().expect("the rest is scheduled");
        port.now = now;
        s.timer_fired(&mut port, now);
        let total = count_notes(&port, &Note::Cancelled);
        assert!(
            total - ended <= cap,
            "{} ended in turn {turns}",
            total - ended
        );
        ended = total;
        turns += 1;
        assert!(turns < 10, "the close never finished");
    }
    assert_eq!(ended, many);
    assert_eq!(s.open_tickets(), 1);
    assert_eq!(s.waiters_on(&keys[0]), 1, "{other:?} is still queued");
}
