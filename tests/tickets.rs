//! Tickets (`LOCK.ACQUIRE/MACQUIRE/CAMPAIGN ... WAIT timeout-ms TICKET`): the request waits in
//! the same queue as a blocked one, the client gets a ticket key at once and pops its answer
//! with `BLPOP`; `LOCK.CANCEL` withdraws it; a grant is delivered exactly once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use lock_core::slot::key_slot;
use lock_testkit::*;

const SOON: Duration = Duration::from_secs(5);

/// What a waiting command with `TICKET` replied.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Asked {
    /// Granted at once: the token (or a token per key).
    Granted(Vec<i64>),
    /// Queued: the ticket to pop.
    Ticket(String),
    /// One attempt, not granted (inside MULTI).
    Nil,
}

fn asked(reply: Value) -> Asked {
    match reply {
        Value::Int(token) => Asked::Granted(vec![token]),
        Value::Bulk(items) => Asked::Granted(
            items
                .into_iter()
                .map(|v| match v {
                    Value::Int(t) => t,
                    other => panic!("not a token: {other:?}"),
                })
                .collect(),
        ),
        Value::Data(name) => Asked::Ticket(String::from_utf8(name).unwrap()),
        Value::Nil => Asked::Nil,
        other => panic!("unexpected reply {other:?}"),
    }
}

/// Runs a command of words and reads its reply as a waiting command's.
fn ask(con: &mut Connection, line: &str) -> Asked {
    let words: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
    asked(raw(con, &words).unwrap_or_else(|e| panic!("{line}: {e}")))
}

fn ticket(con: &mut Connection, line: &str) -> String {
    match ask(con, line) {
        Asked::Ticket(t) => t,
        other => panic!("{line}: {other:?}"),
    }
}

/// `BLPOP ticket timeout`: the element, or None at the timeout.
fn pop(con: &mut Connection, ticket: &str, timeout: f64) -> Option<String> {
    let reply: Option<(String, String)> = redis::cmd("BLPOP")
        .arg(ticket)
        .arg(timeout)
        .query(con)
        .unwrap();
    reply.map(|(key, value)| {
        assert_eq!(key, ticket);
        value
    })
}

/// What the ticket holds now, without popping it.
fn peek(con: &mut Connection, ticket: &str) -> Vec<String> {
    redis::cmd("LRANGE")
        .arg(ticket)
        .arg(0)
        .arg(-1)
        .query(con)
        .unwrap()
}

fn cancel(con: &mut Connection, ticket: &str) -> Value {
    redis::cmd("LOCK.CANCEL").arg(ticket).query(con).unwrap()
}

fn owner_of(con: &mut Connection, key: &str) -> Option<(String, i64)> {
    let info = lock_info(con, key)?;
    let owner = match info.get("owner")? {
        Value::Data(o) => String::from_utf8(o.clone()).unwrap(),
        _ => return None,
    };
    Some((owner, info_int(&info, "token")))
}

/// Whether client `id` is blocked (in `BLPOP`, say).
fn is_blocked(con: &mut Connection, id: i64) -> bool {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(con).unwrap();
    let prefix = format!("id={id} ");
    list.lines().filter(|l| l.starts_with(&prefix)).any(|l| {
        l.split(' ')
            .any(|f| f.starts_with("flags=") && f.contains('b'))
    })
}

fn exists(con: &mut Connection, key: &str) -> bool {
    con.exists(key).unwrap()
}

#[test]
fn a_ticket_waits_in_the_same_queue_as_blocked_clients_and_is_answered_through_blpop() {
    let server = Server::start();
    let mut con = server.connect();
    let mut asker = server.connect();
    let holder = acquire(&mut con, "k", "holder", 60_000).unwrap();
    // Granted at once: the token, as without TICKET.
    assert_eq!(
        ask(&mut asker, "LOCK.ACQUIRE free w 60000 WAIT 0 TICKET"),
        Asked::Granted(vec![owner_of(&mut con, "free").unwrap().1])
    );
    let t1 = ticket(&mut asker, "LOCK.ACQUIRE k w1 60000 WAIT 0 TICKET");
    // In the module's namespace, in the lock key's slot (so a cluster routes the pop there).
    assert!(t1.starts_with("__lock_fence__ticket{"), "{t1}");
    assert_eq!(key_slot(t1.as_bytes()), key_slot(b"k"));
    assert!(!exists(&mut con, &t1), "nothing is written while it waits");
    let w2 = Waiter::start(&server, "k", "w2", 60_000, 0);
    let t3 = ticket(&mut asker, "LOCK.ACQUIRE k w3 30000 WAIT 0 TICKET");
    assert!(eventually(SOON, || key_waiters(&mut con, "k") == 3));
    assert_eq!(lock_stat(&mut con, "waiters"), 3);
    assert_eq!(lock_stat(&mut con, "tickets"), 2);
    assert_eq!(lock_stat(&mut con, "waits_ticketed"), 2);
    assert_eq!(lock_stat(&mut con, "waits_started"), 1);

    let url = server.url();
    let t = t1.clone();
    let popper = thread::spawn(move || {
        let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
        pop(&mut con, &t, 5.0)
    });
    thread::sleep(Duration::from_millis(100));
    release(&mut con, "k", "holder").unwrap();
    let token1: i64 = popper.join().unwrap().expect("popped").parse().unwrap();
    assert!(token1 > holder);
    assert_eq!(owner_of(&mut con, "k"), Some(("w1".into(), token1)));
    assert!(!exists(&mut con, &t1), "a popped ticket is gone");
    assert!(w2.still_blocked());

    release(&mut con, "k", "w1").unwrap();
    let token2 = w2.token(SOON).expect("the blocked waiter next");
    assert!(token2 > token1);
    release(&mut con, "k", "w2").unwrap();
    // Nobody pops t3 yet: the grant waits there, expiring with its lease.
    let held = peek(&mut con, &t3);
    let token3: i64 = held[0].parse().unwrap();
    assert_eq!(held.len(), 1);
    assert!(token3 > token2);
    assert_eq!(owner_of(&mut con, "k"), Some(("w3".into(), token3)));
    let pttl: i64 = con.pttl(&t3).unwrap();
    assert!(pttl > 25_000 && pttl <= 30_000, "{pttl}");
    assert_eq!(pop(&mut con, &t3, 1.0), Some(token3.to_string()));
    assert!(eventually(SOON, || lock_stat(&mut con, "tickets") == 0));
    assert_eq!(lock_stat(&mut con, "handoffs"), 3);
}

#[test]
fn multi_key_and_campaign_tickets_answer_in_their_own_forms() {
    let server = Server::start();
    let mut con = server.connect();
    let mut asker = server.connect();
    acquire(&mut con, "{m}b", "x", 60_000).unwrap();
    let t = ticket(
        &mut asker,
        "LOCK.MACQUIRE 2 {m}a {m}b mover 60000 WAIT 0 TICKET",
    );
    assert!(t.starts_with("__lock_fence__mticket{"), "{t}");
    assert_eq!(key_slot(t.as_bytes()), key_slot(b"{m}a"));
    release(&mut con, "{m}b", "x").unwrap();
    let popped = pop(&mut con, &t, 5.0).expect("granted");
    let tokens: Vec<i64> = popped.split(' ').map(|t| t.parse().unwrap()).collect();
    assert_eq!(
        tokens,
        vec![
            owner_of(&mut con, "{m}a").unwrap().1,
            owner_of(&mut con, "{m}b").unwrap().1
        ],
        "a token per key, in the order asked"
    );
    // Granted and not popped: a cancel hands over the array of tokens.
    acquire(&mut con, "{m}c", "x", 60_000).unwrap();
    let t = ticket(
        &mut asker,
        "LOCK.MACQUIRE 2 {m}c {m}d mover 60000 WAIT 0 TICKET",
    );
    release(&mut con, "{m}c", "x").unwrap();
    let handed = cancel(&mut con, &t);
    let want = vec![
        Value::Int(owner_of(&mut con, "{m}c").unwrap().1),
        Value::Int(owner_of(&mut con, "{m}d").unwrap().1),
    ];
    assert_eq!(handed, Value::Bulk(want));
    // Free keys: granted at once, an array as without TICKET.
    assert!(matches!(
        ask(&mut asker, "LOCK.MACQUIRE 2 {n}a {n}b o 60000 WAIT 0 TICKET"),
        Asked::Granted(ts) if ts.len() == 2
    ));

    acquire(&mut con, "election", "leader-1", 60_000).unwrap();
    let mut listener = server.connect();
    let mut observer = listener.as_pubsub();
    observer.subscribe("lock.leader:{election}").unwrap();
    observer
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let t = ticket(
        &mut asker,
        "LOCK.CAMPAIGN election leader-2 60000 WAIT 0 TICKET VALUE hello",
    );
    let _: i64 = redis::cmd("LOCK.RELEASE")
        .arg("election")
        .arg("leader-1")
        .query(&mut con)
        .unwrap();
    let epoch: i64 = pop(&mut con, &t, 5.0).unwrap().parse().unwrap();
    let leader: (String, i64, Option<String>) = redis::cmd("LOCK.LEADER")
        .arg("election")
        .query(&mut con)
        .unwrap();
    assert_eq!(leader, ("leader-2".into(), epoch, Some("hello".into())));
    // Announced at the grant, as for a blocked candidate.
    let elected: String = observer.get_message().unwrap().get_payload().unwrap();
    assert_eq!(elected, format!("elected 0 {epoch} 8 election leader-2"));
}

#[test]
fn timeouts_replacements_and_refusals_are_written_as_markers() {
    let server = Server::start();
    let mut con = server.connect();
    let mut asker = server.connect();
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    let started = Instant::now();
    let t = ticket(&mut asker, "LOCK.ACQUIRE k w 60000 WAIT 150 TICKET");
    assert_eq!(pop(&mut con, &t, 5.0).as_deref(), Some("timeout"));
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(140) && waited < Duration::from_millis(2_000),
        "{waited:?}"
    );
    assert_eq!(lock_stat(&mut con, "wait_timeouts"), 1);
    assert_eq!(key_waiters(&mut con, "k"), 0);
    // A marker nobody pops expires a minute after it is written.
    let t = ticket(&mut asker, "LOCK.ACQUIRE k w 60000 WAIT 10 TICKET");
    assert!(eventually(SOON, || exists(&mut con, &t)));
    let pttl: i64 = con.pttl(&t).unwrap();
    assert!(pttl > 55_000 && pttl <= 60_000, "{pttl}");
    // The same owner asking again takes the earlier ticket's place; the earlier one is told.
    let first = ticket(&mut asker, "LOCK.ACQUIRE k again 60000 WAIT 0 TICKET");
    let second = ticket(&mut asker, "LOCK.ACQUIRE k again 60000 WAIT 0 TICKET");
    assert_eq!(
        pop(&mut con, &first, 5.0).as_deref(),
        Some("-ERR this WAIT was replaced by a newer LOCK.ACQUIRE ... WAIT of the same owner for this lock")
    );
    assert_eq!(key_waiters(&mut con, "k"), 1);
    assert_eq!(cancel(&mut con, &second), Value::Nil);

    // Refusals.
    assert_eq!(
        error_of(&mut con, &[b"LOCK.ACQUIRE", b"k", b"w", b"100", b"TICKET"]),
        "ERR TICKET is a way to wait: it needs WAIT timeout-ms"
    );
    assert_eq!(
        error_of(&mut con, &[b"LOCK.CANCEL", b"k"]),
        "ERR not a ticket: LOCK.CANCEL takes the ticket a LOCK.* ... WAIT ... TICKET replied"
    );
    // A ticket is never a lock.
    let e = error_of(&mut con, &[b"LOCK.INFO", t.as_bytes()]);
    assert!(e.contains("reserved"), "{e}");
    // Where nothing may block (MULTI, scripts), a wait is one attempt, with or without TICKET.
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("LOCK.ACQUIRE")
        .arg("k")
        .arg("m")
        .arg(1000)
        .arg("WAIT")
        .arg(0)
        .arg("TICKET")
        .query(&mut con)
        .unwrap();
    assert_eq!(replies, vec![Value::Nil]);
    let in_script: Value = redis::cmd("EVAL")
        .arg("return redis.call('LOCK.ACQUIRE', KEYS[1], 's', 1000, 'WAIT', 0, 'TICKET')")
        .arg(1)
        .arg("k")
        .query(&mut con)
        .unwrap();
    assert_eq!(in_script, Value::Nil);
}

#[test]
fn eight_clients_hundred_sections_each_with_tickets_pop_at_most_once_per_release() {
    let server = Server::start();
    let mut admin = server.connect();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut admin)
        .unwrap();
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..8)
        .map(|c| {
            let (url, inside, overlaps) = (server.url(), inside.clone(), overlaps.clone());
            thread::spawn(move || {
                let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
                let owner = format!("client-{c}");
                let mut last_token = 0;
                for _ in 0..100 {
                    let line = format!("LOCK.ACQUIRE counter {owner} 10000 WAIT 0 TICKET");
                    let token = match ask(&mut con, &line) {
                        Asked::Granted(t) => t[0],
                        Asked::Ticket(t) => {
                            pop(&mut con, &t, 10.0).expect("granted").parse().unwrap()
                        }
                        Asked::Nil => panic!("nil"),
                    };
                    assert!(token > last_token);
                    last_token = token;
                    if inside.swap(true, Ordering::SeqCst) {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    thread::sleep(Duration::from_micros(50));
                    inside.store(false, Ordering::SeqCst);
                    let left: Option<i64> = redis::cmd("LOCK.RELEASE")
                        .arg("counter")
                        .arg(&owner)
                        .query(&mut con)
                        .unwrap();
                    assert_eq!(left, Some(0));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two clients inside at once"
    );
    assert_eq!(command_calls(&mut admin, "lock.acquire"), 800);
    assert_eq!(command_calls(&mut admin, "lock.release"), 800);
    let pops = command_calls(&mut admin, "blpop");
    let granted_at_once = lock_stat(&mut admin, "acquired");
    eprintln!("800 sections: {pops} pops, {granted_at_once} acquires granted at once");
    // One pop per ticket, and only tickets pop: exactly one wake-up per release.
    assert!(pops <= 800);
    assert_eq!(pops as i64 + granted_at_once, 800);
    assert_eq!(lock_stat(&mut admin, "waits_ticketed"), pops as i64);
    assert!(eventually(SOON, || lock_stat(&mut admin, "tickets") == 0));
}

#[test]
fn client_kill_while_queued_takes_the_ticket_out_of_the_queue() {
    let server = Server::start();
    let mut con = server.connect();
    let mut asker = server.connect();
    let mut other = server.connect();
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    let gone = ticket(&mut asker, "LOCK.ACQUIRE k gone 60000 WAIT 0 TICKET");
    let next = ticket(&mut other, "LOCK.ACQUIRE k next 60000 WAIT 0 TICKET");
    assert_eq!(key_waiters(&mut con, "k"), 2);
    let id = client_id(&mut asker);
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query(&mut con)
        .unwrap();
    assert!(eventually(SOON, || key_waiters(&mut con, "k") == 1));
    assert_eq!(lock_stat(&mut con, "tickets"), 1);
    assert_eq!(lock_stat(&mut con, "wait_cancelled"), 1);
    release(&mut con, "k", "holder").unwrap();
    let token: i64 = pop(&mut con, &next, 5.0).unwrap().parse().unwrap();
    assert_eq!(owner_of(&mut con, "k"), Some(("next".into(), token)));
    assert!(
        !exists(&mut con, &gone),
        "the killed connection's ticket is never answered"
    );
}

#[test]
fn client_kill_after_the_grant_is_written_and_before_it_is_popped_passes_it_on() {
    let server = Server::start();
    let mut con = server.connect();
    let mut asker = server.connect();
    let mut other = server.connect();
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    let gone = ticket(&mut asker, "LOCK.ACQUIRE k gone 60000 WAIT 0 TICKET");
    let next = ticket(&mut other, "LOCK.ACQUIRE k next 60000 WAIT 0 TICKET");
    release(&mut con, "k", "holder").unwrap();
    let granted: i64 = peek(&mut con, &gone)[0].parse().unwrap();
    assert_eq!(owner_of(&mut con, "k"), Some(("gone".into(), granted)));
    let id = client_id(&mut asker);
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query(&mut con)
        .unwrap();
    // Nobody popped it: taken out of the ticket and passed on to the next waiter.
    let token: i64 = pop(&mut con, &next, 5.0)
        .expect("passed on")
        .parse()
        .unwrap();
    assert!(token > granted);
    assert_eq!(owner_of(&mut con, "k"), Some(("next".into(), token)));
    assert!(!exists(&mut con, &gone));
    assert_eq!(lock_stat(&mut con, "abandoned_grants"), 1);

    // A grant that was popped stays with whoever popped it, whatever its asker does then.
    let mut asker = server.connect();
    let popped = ticket(&mut asker, "LOCK.ACQUIRE k popped 60000 WAIT 0 TICKET");
    release(&mut con, "k", "next").unwrap();
    let token: i64 = pop(&mut con, &popped, 5.0).unwrap().parse().unwrap();
    let id = client_id(&mut asker);
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query(&mut con)
        .unwrap();
    assert!(eventually(SOON, || lock_stat(&mut con, "tickets") == 0));
    thread::sleep(Duration::from_millis(100));
    assert_eq!(owner_of(&mut con, "k"), Some(("popped".into(), token)));
    assert_eq!(lock_stat(&mut con, "abandoned_grants"), 1);
}

#[test]
fn a_grant_nobody_pops_before_its_lease_ends_is_answered_expired() {
    let server = Server::start();
    let replica = Server::replica_of(&server);
    let mut con = server.connect();
    let mut asker = server.connect();
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    let late = ticket(&mut asker, "LOCK.ACQUIRE k late 300 WAIT 0 TICKET");
    release(&mut con, "k", "holder").unwrap();
    let granted: i64 = peek(&mut con, &late)[0].parse().unwrap();
    assert_eq!(owner_of(&mut con, "k"), Some(("late".into(), granted)));
    // Its client stalls past the lease: the hold ends with its lease, and the ticket says so
    // instead of vanishing (a pop with no timeout would block for ever).
    thread::sleep(Duration::from_millis(600));
    assert!(eventually(SOON, || lock_stat(
        &mut con,
        "ticket_grants_lapsed"
    ) == 1));
    assert_eq!(pop(&mut asker, &late, 0.0).as_deref(), Some("expired"));
    assert_eq!(owner_of(&mut con, "k"), None);
    assert_eq!(lock_stat(&mut con, "tickets"), 0);
    // Whoever asks next gets the lock.
    assert!(acquire(&mut con, "k", "next", 60_000).is_some());

    // A client already blocked on its ticket pops the grant itself: nothing is rewritten.
    let mut popper = server.connect();
    let blocked = ticket(&mut asker, "LOCK.ACQUIRE k quick 300 WAIT 0 TICKET");
    let waiting = {
        let blocked = blocked.clone();
        thread::spawn(move || pop(&mut popper, &blocked, 10.0))
    };
    let id_seen = eventually(SOON, || {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut con).unwrap();
        list.contains("cmd=blpop")
    });
    assert!(id_seen);
    release(&mut con, "k", "next").unwrap();
    let token: i64 = waiting.join().unwrap().unwrap().parse().unwrap();
    thread::sleep(Duration::from_millis(600));
    assert!(!exists(&mut con, &blocked));
    assert!(token > granted);
    assert_eq!(lock_stat(&mut con, "ticket_grants_lapsed"), 1);

    // A lease ends unreleased and the lock goes to the next ticket, which nobody pops either.
    // The marker is a plain replicated write: the replica holds the same.
    assert!(acquire(&mut con, "k", "brief", 300).is_some());
    let late2 = ticket(&mut asker, "LOCK.ACQUIRE k late2 300 WAIT 0 TICKET");
    assert!(eventually(SOON, || lock_stat(
        &mut con,
        "ticket_grants_lapsed"
    ) == 2));
    assert_eq!(peek(&mut con, &late2), vec!["expired".to_string()]);
    let mut rcon = replica.connect();
    assert!(eventually(SOON, || peek(&mut rcon, &late2)
        == vec!["expired".to_string()]));
}

/// How one round of the race ended for the waiter.
#[derive(Debug, Default)]
struct RaceEnd {
    popped: Option<i64>,
    cancelled: Option<i64>,
}

#[test]
fn a_cancel_racing_a_grant_delivers_the_token_exactly_once() {
    let server = Server::start();
    let mut con = server.connect();
    let mut asker = server.connect();
    let url = server.url();
    let connect = || {
        redis::Client::open(url.clone())
            .unwrap()
            .get_connection()
            .unwrap()
    };
    let (mut releaser, mut canceller) = (connect(), connect());
    let rounds = 300;
    let mut outcomes = [0usize; 3];
    for round in 0..rounds {
        acquire(&mut con, "k", "holder", 60_000).unwrap();
        let t = ticket(&mut asker, "LOCK.ACQUIRE k w 60000 WAIT 0 TICKET");
        // Every other round somebody is blocked on the ticket, as a client library would be.
        let popper = (round % 2 == 0).then(|| {
            let mut pcon = connect();
            let pid = client_id(&mut pcon);
            let t = t.clone();
            let started = thread::spawn(move || pop(&mut pcon, &t, 10.0));
            assert!(eventually(SOON, || is_blocked(&mut con, pid)));
            (started, pid)
        });
        let barrier = Arc::new(Barrier::new(2));
        let b = barrier.clone();
        let releasing = thread::spawn(move || {
            b.wait();
            release(&mut releaser, "k", "holder");
            releaser
        });
        barrier.wait();
        let cancelled = match cancel(&mut canceller, &t) {
            Value::Int(token) => Some(token),
            Value::Nil => None,
            other => panic!("{other:?}"),
        };
        releaser = releasing.join().unwrap();
        let mut end = RaceEnd {
            cancelled,
            ..RaceEnd::default()
        };
        if let Some((popping, pid)) = popper {
            // The grant, if written, was popped in the turn that wrote it: a pop still blocked
            // now got nothing and is let go.
            let _: i64 = redis::cmd("CLIENT")
                .arg("UNBLOCK")
                .arg(pid)
                .query(&mut con)
                .unwrap();
            end.popped = popping.join().unwrap().map(|v| v.parse().unwrap());
        }
        let owner = owner_of(&mut con, "k");
        match (&end, &owner) {
            (
                RaceEnd {
                    popped: Some(p),
                    cancelled: None,
                },
                Some((o, token)),
            ) => {
                assert_eq!((o.as_str(), token), ("w", p));
                outcomes[0] += 1;
            }
            (
                RaceEnd {
                    popped: None,
                    cancelled: Some(c),
                },
                Some((o, token)),
            ) => {
                assert_eq!((o.as_str(), token), ("w", c));
                outcomes[1] += 1;
            }
            // Cancelled while queued: nobody holds it, and nothing was written.
            (
                RaceEnd {
                    popped: None,
                    cancelled: None,
                },
                None,
            ) => outcomes[2] += 1,
            _ => panic!("round {round}: {end:?} with the lock held by {owner:?}"),
        }
        assert!(
            !exists(&mut con, &t),
            "round {round}: something was left in the ticket"
        );
        if owner.is_some() {
            release(&mut con, "k", "w").unwrap();
        }
    }
    eprintln!(
        "{rounds} races: popped {}, handed to the canceller {}, cancelled while queued {}",
        outcomes[0], outcomes[1], outcomes[2]
    );
    assert!(eventually(SOON, || lock_stat(&mut con, "tickets") == 0));
    assert_eq!(
        lock_stat(&mut con, "tickets_taken"),
        outcomes[1] as i64,
        "every grant a cancel took is counted"
    );
}

#[test]
fn an_ephemeral_ticket_binds_its_hold_to_the_asking_connection() {
    let server = Server::start();
    let mut con = server.connect();
    let mut asker = server.connect();
    let mut popper = server.connect();
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    let t = ticket(&mut asker, "LOCK.ACQUIRE k e 60000 EPHEMERAL WAIT 0 TICKET");
    release(&mut con, "k", "holder").unwrap();
    assert!(pop(&mut popper, &t, 5.0).is_some());
    assert_eq!(bound_to(&mut con, "k"), Some(client_id(&mut asker)));
    // The popping connection is nobody's: closing it changes nothing.
    drop(popper);
    thread::sleep(Duration::from_millis(200));
    assert!(owner_of(&mut con, "k").is_some());
    drop(asker);
    assert!(eventually(SOON, || lock_info(&mut con, "k").is_none()));
    assert_eq!(lock_stat(&mut con, "disconnected"), 1);
}

#[test]
fn ticket_keys_are_plain_replicated_writes_and_an_aof_replays_without_the_module() {
    let master = Server::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let replica = Server::replica_of(&master);
    let mut con = master.connect();
    let mut rcon = replica.connect();
    let mut asker = master.connect();
    acquire(&mut con, "k", "holder", 600_000).unwrap();
    let popped = ticket(&mut asker, "LOCK.ACQUIRE k popped 600000 WAIT 0 TICKET");
    let unpopped = ticket(&mut asker, "LOCK.ACQUIRE k unpopped 600000 WAIT 0 TICKET");
    let taken = ticket(&mut asker, "LOCK.ACQUIRE k taken 600000 WAIT 0 TICKET");
    acquire(&mut con, "j", "holder", 600_000).unwrap();
    let timed_out = ticket(&mut asker, "LOCK.ACQUIRE j t 600000 WAIT 20 TICKET");
    release(&mut con, "k", "holder").unwrap();
    assert!(pop(&mut con, &popped, 5.0).is_some());
    release(&mut con, "k", "popped").unwrap();
    assert_eq!(peek(&mut con, &unpopped).len(), 1);
    release(&mut con, "k", "unpopped").unwrap();
    assert!(matches!(cancel(&mut con, &taken), Value::Int(_)));
    assert!(eventually(SOON, || exists(&mut con, &timed_out)));
    assert!(!exists(&mut con, &popped) && !exists(&mut con, &taken));

    // The replica has exactly what the master has: locks, counters, tickets and expiries.
    let on_master = dataset(&mut con);
    assert!(on_master.contains_key(unpopped.as_bytes()));
    assert!(on_master.contains_key(timed_out.as_bytes()));
    assert!(
        eventually(SOON, || dataset(&mut rcon) == on_master),
        "{:?}\n{:?}",
        dataset(&mut rcon),
        on_master
    );
    // A plain server, without the module, replays the AOF into the same data.
    let aof = std::fs::read_dir(master.dir.path().join("appendonlydir"))
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect::<String>();
    assert!(
        !aof.to_uppercase().contains("LOCK."),
        "a LOCK.* command reached the AOF"
    );
    for effect in ["LPUSH", "PEXPIREAT", "LPOP", "DEL"] {
        assert!(
            aof.to_uppercase().contains(&format!("\r\n{effect}\r\n")),
            "no {effect}"
        );
    }
    let mut master = master;
    master.kill_hard();
    let dir = master.dir.path().to_string_lossy().into_owned();
    let plain = Server::start_options(&Options {
        without_module: true,
        extra: ["--appendonly", "yes", "--dir", &dir]
            .map(String::from)
            .to_vec(),
        ..Options::default()
    });
    assert_eq!(dataset(&mut plain.connect()), on_master);
}

#[test]
fn a_ticket_key_going_away_is_never_a_lost_hold() {
    let server = Server::start();
    let mut con = server.connect();
    let mut asker = server.connect();
    let mut listener = server.connect();
    let mut pubsub = listener.as_pubsub();
    pubsub.psubscribe("lock.lost*").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    let marker = ticket(&mut asker, "LOCK.ACQUIRE k w 60000 WAIT 10 TICKET");
    assert!(eventually(SOON, || exists(&mut con, &marker)));
    let _: i64 = con.del(&marker).unwrap();
    let granted = ticket(&mut asker, "LOCK.ACQUIRE k g 60000 WAIT 0 TICKET");
    release(&mut con, "k", "holder").unwrap();
    let _: () = redis::cmd("SET")
        .arg(&granted)
        .arg("x")
        .query(&mut con)
        .unwrap();
    let _: i64 = con.del(&granted).unwrap();
    // A grant nobody pops expires with its lease, ticket and hold together (and the ticket
    // says `expired` then).
    let short = ticket(&mut asker, "LOCK.ACQUIRE k s 300 WAIT 0 TICKET");
    release(&mut con, "k", "g").unwrap();
    assert!(exists(&mut con, &short));
    assert!(eventually(SOON, || peek(&mut con, &short) == ["expired"]));
    // Nothing about a ticket on any lost-hold channel (on servers that report key removals the
    // module looks at every key that goes).
    while let Ok(msg) = pubsub.get_message() {
        let text: String = msg.get_payload().unwrap();
        assert!(!text.contains("__lock_fence__"), "{text}");
    }
}

#[test]
fn a_user_with_the_documented_rules_waits_with_tickets_and_cancels_them() {
    let server = Server::start();
    let mut admin = server.connect();
    // docs/operations.md, *ACL*: the application's rules plus what tickets need.
    let rules =
        "on >app-secret ~app:* +lock.acquire +lock.release +lock.macquire +blpop +lock.cancel \
                 ~__lock_fence__ticket* ~__lock_fence__mticket*";
    let mut setuser = redis::cmd("ACL");
    setuser.arg("SETUSER").arg("app");
    for rule in rules.split(' ') {
        setuser.arg(rule);
    }
    let _: () = setuser.query(&mut admin).unwrap();
    let url = format!("redis://app:app-secret@127.0.0.1:{}/", server.port);
    let mut app = redis::Client::open(url).unwrap().get_connection().unwrap();
    acquire(&mut admin, "app:k", "holder", 60_000).unwrap();
    let t = ticket(&mut app, "LOCK.ACQUIRE app:k w 60000 WAIT 0 TICKET");
    let m = ticket(&mut app, "LOCK.MACQUIRE 1 app:k m 60000 WAIT 0 TICKET");
    release(&mut admin, "app:k", "holder").unwrap();
    assert!(pop(&mut app, &t, 5.0).is_some());
    assert_eq!(cancel(&mut app, &m), Value::Nil, "still queued behind w");
    // Without the ticket patterns the same user cannot pop.
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("app")
        .arg("resetkeys")
        .arg("~app:*")
        .query(&mut admin)
        .unwrap();
    let e = error_of(&mut app, &[b"BLPOP", t.as_bytes(), b"0.1"]);
    assert!(e.starts_with("NOPERM"), "{e}");
}

#[test]
fn answers_wait_for_a_pause_to_end_and_a_closed_connection_leaves_its_markers() {
    let server = Server::start();
    let mut con = server.connect();
    let mut asker = server.connect();
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    let t = ticket(&mut asker, "LOCK.ACQUIRE k w 60000 WAIT 100 TICKET");
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(3_000)
        .arg("WRITE")
        .query(&mut con)
        .unwrap();
    thread::sleep(Duration::from_millis(400));
    // Out of the queue on time, but nothing written during the pause.
    assert_eq!(key_waiters(&mut con, "k"), 0);
    assert!(!exists(&mut con, &t));
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut con).unwrap();
    assert!(eventually(SOON, || exists(&mut con, &t)));
    // Its connection closes: the answer stays for whoever pops it.
    drop(asker);
    thread::sleep(Duration::from_millis(200));
    assert_eq!(pop(&mut con, &t, 1.0).as_deref(), Some("timeout"));
    // A shell's redis-cli closes its connection right after the reply: its ticket goes at once.
    let out = std::process::Command::new(cli_bin())
        .args(["-p", &server.port.to_string()])
        .args(["LOCK.ACQUIRE", "k", "cli", "60000", "WAIT", "0", "TICKET"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("__lock_fence__ticket{"));
    assert!(eventually(SOON, || key_waiters(&mut con, "k") == 0));
}

#[test]
fn a_replica_refuses_tickets_and_a_restarted_master_hands_over_a_grant_written_before() {
    let mut master = Server::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let writable = Server::start_with(&["--replica-read-only", "no"]);
    let mut rcon = writable.connect();
    // A full sync at once (servers wait 5 s by default for more replicas).
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("repl-diskless-sync-delay")
        .arg(0)
        .query(&mut master.connect())
        .unwrap();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port)
        .query(&mut rcon)
        .unwrap();
    let mut con = master.connect();
    let mut asker = master.connect();
    acquire(&mut con, "k", "holder", 600_000).unwrap();
    assert!(eventually(Duration::from_secs(15), || rcon
        .exists("k")
        .unwrap_or(false)));
    assert_eq!(
        error_of(
            &mut rcon,
            &[
                b"LOCK.ACQUIRE",
                b"k",
                b"w",
                b"1000",
                b"WAIT",
                b"0",
                b"TICKET"
            ]
        ),
        "ERR a replica does not serve LOCK.ACQUIRE ... WAIT: only the master grants locks"
    );
    let t = ticket(&mut asker, "LOCK.MACQUIRE 1 k w 600000 WAIT 0 TICKET");
    release(&mut con, "k", "holder").unwrap();
    let granted: i64 = peek(&mut con, &t)[0].parse().unwrap();
    assert!(eventually(SOON, || rcon.exists(&t).unwrap_or(false)));
    assert_eq!(
        error_of(&mut rcon, &[b"LOCK.CANCEL", t.as_bytes()]),
        "ERR a replica does not serve tickets: only the master grants locks"
    );
    drop(rcon);
    drop(writable);
    // Restarted from its AOF: the queues are gone, the grant written into the ticket is not.
    master.restart();
    let mut con = master.connect();
    assert_eq!(owner_of(&mut con, "k"), Some(("w".into(), granted)));
    assert_eq!(cancel(&mut con, &t), Value::Bulk(vec![Value::Int(granted)]));
    assert!(!exists(&mut con, &t));
}

/// Review: `expired` says "the hold is gone, nothing is held". LOCK.RENEW is owner-based, so the
/// owner's name can extend the lease of a grant still sitting unpopped in its ticket; the
/// ticket's expiry (the old lease end) and the `GrantLapsed` deadline do not follow, and the
/// module writes `expired` while the hold lives on (a false "not granted": the waiter asks
/// again, and under another owner waits behind its own orphaned hold).
#[test]
fn a_grant_renewed_before_its_pop_is_not_answered_expired_while_it_is_held() {
    let server = Server::start();
    let mut con = server.connect();
    let mut asker = server.connect();
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    let late = ticket(&mut asker, "LOCK.ACQUIRE k late 300 WAIT 0 TICKET");
    release(&mut con, "k", "holder").unwrap();
    let granted: i64 = peek(&mut con, &late)[0].parse().unwrap();
    // The owner's name renews the hold before anyone pops the grant.
    let renewed: i64 = redis::cmd("LOCK.RENEW")
        .arg("k")
        .arg("late")
        .arg(60_000)
        .query(&mut con)
        .unwrap();
    assert_eq!(renewed, 1);
    thread::sleep(Duration::from_millis(600));
    let held = owner_of(&mut con, "k");
    let popped = pop(&mut asker, &late, 0.5);
    assert_eq!(held, Some(("late".into(), granted)), "the hold lives on");
    assert_ne!(
        popped.as_deref(),
        Some("expired"),
        "the ticket says `expired` (nothing held) while {held:?} holds the lock"
    );
}

/// Review: a grant written into its ticket and not popped when `FLUSHDB` empties the database
/// (hold and ticket both go) is forgotten as if popped: nothing is written into the ticket, ever,
/// so a client that pops it after the flush with no timeout blocks for ever (and one with a
/// timeout reports a timeout although the key is free). The `expired` rewrite exists for exactly
/// this ("a client that pops late, even with no timeout, is answered").
#[test]
fn a_grant_flushed_before_its_pop_is_answered() {
    let server = Server::start();
    let mut con = server.connect();
    let mut asker = server.connect();
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    let late = ticket(&mut asker, "LOCK.ACQUIRE k late 300 WAIT 0 TICKET");
    release(&mut con, "k", "holder").unwrap();
    assert!(peek(&mut con, &late)[0].parse::<i64>().is_ok());
    let _: () = redis::cmd("FLUSHDB").query(&mut con).unwrap();
    thread::sleep(Duration::from_millis(600));
    assert_eq!(owner_of(&mut con, "k"), None);
    let popped = pop(&mut asker, &late, 2.0);
    assert!(
        popped.is_some(),
        "nothing is ever written into the flushed grant's ticket: a pop with no timeout blocks for ever"
    );
}

/// A client writes into a ticket holding a grant nobody popped (the namespace is reserved,
/// but a plain `LPUSH` can reach it): `LOCK.CANCEL` still hands over the grant the module
/// wrote, never the digits the client pushed, and nothing once the grant's hold is gone.
/// Before, it handed over whatever the ticket's head held.
#[test]
fn a_cancel_hands_over_the_grant_written_never_what_a_client_wrote_into_the_ticket() {
    let server = Server::start();
    let mut con = server.connect();
    let mut asker = server.connect();
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    let t = ticket(&mut asker, "LOCK.ACQUIRE k late 60000 WAIT 0 TICKET");
    release(&mut con, "k", "holder").unwrap();
    let granted: i64 = peek(&mut con, &t)[0].parse().unwrap();
    let _: () = redis::cmd("LPUSH")
        .arg(&t)
        .arg(999)
        .query(&mut con)
        .unwrap();
    assert_eq!(cancel(&mut con, &t), Value::Int(granted));
    assert_eq!(owner_of(&mut con, "k"), Some(("late".into(), granted)));
    assert!(!exists(&mut con, &t));

    // Its hold released by its owner's name before the cancel: nothing to hand over.
    let t = ticket(&mut asker, "LOCK.ACQUIRE k later 60000 WAIT 0 TICKET");
    release(&mut con, "k", "late").unwrap();
    assert!(peek(&mut con, &t)[0].parse::<i64>().is_ok());
    release(&mut con, "k", "later").unwrap();
    assert_eq!(cancel(&mut con, &t), Value::Nil);
    assert!(!exists(&mut con, &t));
}

/// A ticket holding a grant nobody popped is deleted (`DEL`, or `RENAME`d away): the grant was
/// not delivered, so the module writes it into the ticket again while its hold lives, and the
/// waiter popping it gets it. Before, the `del` counted as the pop: the waiter never learnt of
/// its grant, which held the key for its whole lease. Only a server that reports a key's
/// removal with the key still open (Redis >= 7.2, Valkey) tells a `DEL` from a pop; on Redis
/// 7.0 the grant is answered at its lease end (docs/commands.md).
#[test]
fn a_ticket_deleted_before_its_grant_was_popped_is_written_again() {
    let info = server_info();
    if !(info.kind == ServerKind::Valkey || info.version >= (7, 2, 0)) {
        eprintln!("Redis 7.0 cannot tell a DEL of a ticket from its pop: nothing to check here");
        return;
    }
    let server = Server::start();
    let mut con = server.connect();
    let mut asker = server.connect();
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    for how in ["DEL", "UNLINK", "RENAME"] {
        let t = ticket(&mut asker, "LOCK.ACQUIRE k waiter 60000 WAIT 0 TICKET");
        release(&mut con, "k", "holder").unwrap();
        let granted: i64 = peek(&mut con, &t)[0].parse().unwrap();
        let mut cmd = redis::cmd(how);
        cmd.arg(&t);
        if how == "RENAME" {
            cmd.arg("elsewhere");
        }
        let _: () = cmd.query(&mut con).unwrap();
        assert!(
            eventually(SOON, || peek(&mut con, &t) == vec![granted.to_string()]),
            "{how}: the grant was not written again"
        );
        assert_eq!(pop(&mut asker, &t, 1.0), Some(granted.to_string()), "{how}");
        assert_eq!(owner_of(&mut con, "k"), Some(("waiter".into(), granted)));
        // Popped: nothing is written again.
        thread::sleep(Duration::from_millis(100));
        assert!(!exists(&mut con, &t), "{how}");
        release(&mut con, "k", "waiter").unwrap();
        acquire(&mut con, "k", "holder", 60_000).unwrap();
    }
    let _: () = redis::cmd("DEL").arg("elsewhere").query(&mut con).unwrap();
}
