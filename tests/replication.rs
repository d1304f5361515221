//! A master and a replica, both with the module loaded: every kind of lock change reaches the
//! replica as its effect with absolute times, a failover keeps owners, tokens and lease ends,
//! `WAIT numreplicas` confirms a grant, and a replica refuses LOCK.* writes.

use std::collections::HashMap;
use std::time::Duration;

use lock_testkit::*;

const SOON: Duration = Duration::from_secs(5);

fn holder(con: &mut Connection, key: &str) -> Option<(String, i64, i64)> {
    lock_info(con, key).map(|info| {
        let owner: String = redis::from_redis_value(&info["owner"]).unwrap();
        (owner, info_int(&info, "count"), info_int(&info, "token"))
    })
}

/// `REPLICAOF NO ONE`: the server is a master.
fn promote(con: &mut Connection) {
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(con)
        .unwrap();
}

/// `REPLICAOF` a port nothing listens on: the server follows no reachable master and keeps
/// its data (a replica cut off from its master, a demoted master no resync reached).
fn follow_nobody(con: &mut Connection) {
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(free_port())
        .query(con)
        .unwrap();
}

#[test]
fn the_replica_matches_the_master_after_every_kind_of_change() {
    let master = Server::start();
    let replica = Server::replica_of(&master);
    let (mut m, mut r) = (master.connect(), replica.connect());

    // Acquire, re-entry, count-down, renew.
    acquire(&mut m, "k", "a", 60_000).unwrap();
    assert_replica_matches(&mut m, &mut r, "k");
    assert!(stored_lock(&mut r, "k").expires_at > 0);
    acquire(&mut m, "k", "a", 90_000).unwrap();
    assert_replica_matches(&mut m, &mut r, "k");
    assert_eq!(release(&mut m, "k", "a"), Some(1));
    assert_replica_matches(&mut m, &mut r, "k");
    let renewed: i64 = redis::cmd("LOCK.RENEW")
        .arg("k")
        .arg("a")
        .arg(120_000)
        .query(&mut m)
        .unwrap();
    assert_eq!(renewed, 1);
    assert_replica_matches(&mut m, &mut r, "k");

    // Handoff to a waiter inside the release.
    let waiter = Waiter::start(&master, "k", "b", 45_000, 0);
    assert_eq!(release(&mut m, "k", "a"), Some(0));
    let token_b = waiter.token(SOON).expect("granted");
    assert_replica_matches(&mut m, &mut r, "k");
    assert_eq!(holder(&mut r, "k"), Some(("b".into(), 1, token_b)));

    // A held lease runs out with a waiter queued: the grant made by the module's timer.
    acquire(&mut m, "short", "x", 300).unwrap();
    let waiter = Waiter::start(&master, "short", "y", 30_000, 0);
    let token_y = waiter.token(SOON).expect("granted at the lease end");
    assert_replica_matches(&mut m, &mut r, "short");
    assert_eq!(holder(&mut r, "short"), Some(("y".into(), 1, token_y)));

    // A lease runs out with nobody waiting: Redis's own expiry, propagated as a DEL.
    acquire(&mut m, "gone", "z", 100).unwrap();
    assert!(eventually(SOON, || {
        let exists: i64 = m.exists("gone").unwrap();
        exists == 0
    }));
    assert_replica_matches(&mut m, &mut r, "gone");
    assert_eq!(stored_lock(&mut r, "gone").fields, vec![]);

    // Force release, with and without a waiter.
    let waiter = Waiter::start(&master, "k", "c", 30_000, 0);
    let removed: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("k")
        .query(&mut m)
        .unwrap();
    assert_eq!(removed, 1);
    let token_c = waiter.token(SOON).expect("granted after force release");
    assert!(token_c > token_b);
    assert_replica_matches(&mut m, &mut r, "k");
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("k")
        .query(&mut m)
        .unwrap();
    assert_replica_matches(&mut m, &mut r, "k");
    assert!(lock_info(&mut r, "k").is_none());
}

#[test]
fn after_failover_locks_keep_owner_token_and_lease_end_and_tokens_keep_rising() {
    let mut master = Server::start();
    let replica = Server::replica_of(&master);
    let mut m = master.connect();
    // The highest token handed out per key: tokens rise per key (counters are per slot).
    let mut highest: HashMap<&str, i64> = HashMap::new();
    let mut note = |key: &'static str, token: i64| {
        let h = highest.entry(key).or_default();
        *h = (*h).max(token);
    };
    for (i, key) in ["orders:1", "orders:2", "{user:7}:profile"]
        .into_iter()
        .enumerate()
    {
        note(
            key,
            acquire(&mut m, key, &format!("owner-{i}"), 120_000).unwrap(),
        );
    }
    acquire(&mut m, "orders:1", "owner-0", 120_000).unwrap(); // count 2
                                                              // A waiter's grant, then a release with nobody waiting, to move the counters along.
    note(
        "handoff",
        acquire(&mut m, "handoff", "first", 60_000).unwrap(),
    );
    let waiter = Waiter::start(&master, "handoff", "second", 120_000, 0);
    release(&mut m, "handoff", "first").unwrap();
    note("handoff", waiter.token(SOON).unwrap());
    note(
        "released",
        acquire(&mut m, "released", "r", 60_000).unwrap(),
    );
    release(&mut m, "released", "r").unwrap();

    // The pattern docs/guarantees.md documents: WAIT 1 after the acquire confirms the grant.
    assert_eq!(wait_replicas(&mut m, 1, 5_000), 1);
    let all_keys = ["orders:1", "orders:2", "{user:7}:profile", "handoff"];
    let before: Vec<StoredLock> = all_keys.iter().map(|k| stored_lock(&mut m, k)).collect();

    // The master dies; the replica is promoted and the clients move to it.
    master.kill_hard();
    let mut r = replica.connect();
    promote(&mut r);
    let after: Vec<StoredLock> = all_keys.iter().map(|k| stored_lock(&mut r, k)).collect();
    assert_eq!(after, before, "locks changed across failover");
    assert_eq!(
        holder(&mut r, "orders:1").map(|(o, c, _)| (o, c)),
        Some(("owner-0".to_string(), 2))
    );

    // The same owners keep working on the new master...
    assert_eq!(release(&mut r, "orders:1", "owner-0"), Some(1));
    assert_eq!(release(&mut r, "orders:1", "owner-0"), Some(0));
    assert_eq!(acquire(&mut r, "orders:2", "someone-else", 1_000), None);
    // ...and every new hold of a key gets a token above any handed out for it before.
    for key in all_keys.into_iter().chain(["released"]) {
        let _: i64 = redis::cmd("LOCK.FORCERELEASE")
            .arg(key)
            .query(&mut r)
            .unwrap();
        let token = acquire(&mut r, key, "new-owner", 10_000).unwrap();
        assert!(token > highest[key], "{key}: {token} <= {}", highest[key]);
    }
}

#[test]
fn wait_numreplicas_confirms_a_grant_or_says_it_is_not_safe_yet() {
    let master = Server::start();
    let replica = Server::replica_of(&master);
    let (mut m, mut r) = (master.connect(), replica.connect());
    let token = acquire(&mut m, "k", "a", 60_000).unwrap();
    assert_eq!(wait_replicas(&mut m, 1, 5_000), 1);
    assert_eq!(holder(&mut r, "k"), Some(("a".into(), 1, token)));

    // With the replica stalled, WAIT answers 0: the grant is not yet safe against failover.
    replica.signal(Signal::Stop);
    let token = acquire(&mut m, "k2", "b", 60_000).unwrap();
    let acked = wait_replicas(&mut m, 1, 300);
    replica.signal(Signal::Cont);
    assert_eq!(acked, 0);
    assert_eq!(wait_replicas(&mut m, 1, 5_000), 1);
    let mut r = replica.connect();
    assert_eq!(holder(&mut r, "k2"), Some(("b".into(), 1, token)));
}

#[test]
fn a_replica_refuses_lock_writes_and_answers_lock_info() {
    let master = Server::start();
    let replica = Server::replica_of(&master);
    let mut m = master.connect();
    let token = acquire(&mut m, "k", "a", 60_000).unwrap();
    assert_eq!(wait_replicas(&mut m, 1, 5_000), 1);
    let mut r = replica.connect();
    let readonly = "READONLY You can't write against a read only replica.";
    let writes: [&[&[u8]]; 5] = [
        &[b"LOCK.ACQUIRE", b"other", b"a", b"1000"],
        &[b"LOCK.ACQUIRE", b"other", b"a", b"1000", b"WAIT", b"0"],
        &[b"LOCK.RELEASE", b"k", b"a"],
        &[b"LOCK.RENEW", b"k", b"a", b"1000"],
        &[b"LOCK.FORCERELEASE", b"k"],
    ];
    for args in writes {
        assert_eq!(error_of(&mut r, args), readonly);
    }
    assert_eq!(holder(&mut r, "k"), Some(("a".into(), 1, token)));
    assert_eq!(waiters(&mut r), 0);
}

#[test]
fn tokens_rise_after_failover_even_past_grants_the_replica_never_received() {
    let mut master = Server::start();
    let replica = Server::replica_of(&master);
    let mut m = master.connect();
    acquire(&mut m, "k", "a", 60_000).unwrap();
    release(&mut m, "k", "a").unwrap();
    assert_eq!(wait_replicas(&mut m, 1, 5_000), 1);
    // The replica loses its link (pointed at a master that is not there: it keeps its data);
    // the master hands out more tokens, then dies before they ever reach the replica.
    let mut r = replica.connect();
    follow_nobody(&mut r);
    let mut unreplicated = 0;
    for round in 0..50 {
        let owner = format!("lost-{round}");
        unreplicated = acquire(&mut m, "k", &owner, 60_000).unwrap();
        release(&mut m, "k", &owner).unwrap();
    }
    master.kill_hard();
    promote(&mut r);
    assert!(lock_info(&mut r, "k").is_none());
    let token = acquire(&mut r, "k", "after-failover", 60_000).unwrap();
    assert!(
        token > unreplicated,
        "{token} <= {unreplicated}: a token was handed out twice"
    );
}

/// Two failovers that each lose writes, as the partition test met them (`{plain:b}`, seed 2):
/// replica B is promoted and grants, then B fails too, and replica C — which never got
/// anything B wrote — is promoted. Both promoted replicas find the same counter, the first
/// master's reservation, and go above it; C's tokens must still be above B's. With a window of
/// a minute they were B's again (both started at that reservation + 1); with a second, C's
/// clock is past B's tokens by then. The pauses stand for the Sentinels noticing each failure
/// (`down-after-milliseconds`: 1 s here, a third of the 3 s docs/sentinel.md advises).
#[test]
fn tokens_rise_through_two_failovers_the_second_replica_missing_the_first_ones_writes() {
    let mut a = Server::start();
    let b = Server::replica_of(&a);
    let c = Server::replica_of(&a);
    let mut on_a = a.connect();
    let first = acquire(&mut on_a, "k", "a", 60_000).unwrap();
    release(&mut on_a, "k", "a").unwrap();
    assert_eq!(wait_replicas(&mut on_a, 2, 5_000), 2);
    // C loses its link (pointed at a master that is not there: it keeps its data).
    let mut on_c = c.connect();
    follow_nobody(&mut on_c);
    a.kill_hard();
    std::thread::sleep(Duration::from_secs(1));
    let mut on_b = b.connect();
    promote(&mut on_b);
    let mut from_b = Vec::new();
    for round in 0..20 {
        let owner = format!("b-{round}");
        from_b.push(acquire(&mut on_b, "k", &owner, 60_000).unwrap());
        release(&mut on_b, "k", &owner).unwrap();
    }
    assert!(
        from_b.iter().all(|t| *t > first),
        "{from_b:?} after {first}"
    );
    // B fails before C got anything from it; C is promoted a down-after later.
    drop(on_b);
    drop(b);
    std::thread::sleep(Duration::from_secs(1));
    promote(&mut on_c);
    let last_of_b = *from_b.last().unwrap();
    let token = acquire(&mut on_c, "k", "c", 60_000).unwrap();
    assert!(
        token > last_of_b,
        "{token} <= B's {last_of_b} (B handed out {from_b:?}): a token handed out again"
    );
}

/// A master that follows another for a while (no resync reaching it: its data stays its own)
/// and is promoted again does not trust the token window it reserved before: the other master
/// may have gone above it with writes this server never got. Its next token is above the bound
/// its counter holds. Before, it handed out tokens from that window, below the other master's
/// (an adversarial review: a restart, a failover to B and back, B's reservation lost).
#[test]
fn a_master_demoted_and_promoted_again_goes_above_its_old_window() {
    let server = Server::start();
    let mut con = server.connect();
    let first = acquire(&mut con, "k", "a", 60_000).unwrap();
    release(&mut con, "k", "a").unwrap();
    let counter = counter_names(&mut con).pop().expect("a counter");
    let window: i64 = con.get(&counter).unwrap();
    assert!(window > first);
    // Follows a master that is not there (keeps its data), then is promoted again.
    follow_nobody(&mut con);
    promote(&mut con);
    let token = acquire(&mut con, "k", "b", 60_000).unwrap();
    assert!(
        token > window,
        "{token} is inside the window up to {window} it reserved before it followed another"
    );
}

/// Found by an adversarial review: a token counter given a TTL by hand kept it on the master
/// (the module writes the counter in place) but lost it on the replica and in the AOF, which
/// got a plain SET. The write is replicated with KEEPTTL now.
#[test]
fn a_counter_with_a_ttl_keeps_it_on_the_replica() {
    let master = Server::start();
    let replica = Server::replica_of(&master);
    let mut m = master.connect();
    let mut r = replica.connect();
    acquire(&mut m, "k", "a", 60_000).unwrap();
    release(&mut m, "k", "a");
    let counter = counter_names(&mut m).pop().expect("a counter");
    let _: () = redis::cmd("SET")
        .arg(&counter)
        .arg(5)
        .arg("PX")
        .arg(100_000)
        .query(&mut m)
        .unwrap();
    // The bound it holds is not this process's: the next grant writes a new one.
    acquire(&mut m, "k", "b", 60_000).unwrap();
    assert_eq!(wait_replicas(&mut m, 1, 5_000), 1);
    let on_master: i64 = m.pttl(&counter).unwrap();
    let on_replica: i64 = r.pttl(&counter).unwrap();
    assert!(on_master > 90_000, "{on_master}");
    assert!(
        on_replica > 90_000,
        "the replica lost the TTL: {on_replica}"
    );
    let value_m: String = m.get(&counter).unwrap();
    let value_r: String = r.get(&counter).unwrap();
    assert_eq!(value_m, value_r);
}

/// A key in the old layout (`__fence__`, `__mode__`) converted by its next write: the rename
/// reaches the replica as the master did it (HSET of `mode`, HDEL of the old field).
#[test]
fn converting_a_key_from_the_old_layout_reaches_the_replica() {
    let master = Server::start();
    let replica = Server::replica_of(&master);
    let (mut m, mut r) = (master.connect(), replica.connect());
    let now: Vec<i64> = redis::cmd("TIME").query(&mut m).unwrap();
    let end = now[0] * 1000 + now[1] / 1000 + 60_000;
    let _: () = redis::cmd("HSET")
        .arg("x")
        .arg("a")
        .arg(1)
        .arg("__fence__")
        .arg(42)
        .query(&mut m)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg("s")
        .arg("__mode__")
        .arg("rw")
        .arg("s:a")
        .arg(format!("1:{end}:43"))
        .query(&mut m)
        .unwrap();
    for key in ["x", "s"] {
        let _: i64 = redis::cmd("PEXPIREAT")
            .arg(key)
            .arg(end)
            .query(&mut m)
            .unwrap();
    }
    assert_replica_matches(&mut m, &mut r, "x");
    assert_eq!(acquire(&mut m, "x", "a", 30_000), Some(42));
    acquire_with(&mut m, "s", "b", 30_000, &["SHARED"])
        .unwrap()
        .unwrap();
    for key in ["x", "s"] {
        assert_replica_matches(&mut m, &mut r, key);
        let fields: Vec<String> = r.hkeys(key).unwrap();
        assert!(
            fields.contains(&"mode".to_string())
                && !fields.iter().any(|f| f == "__fence__" || f == "__mode__"),
            "{key}: {fields:?}"
        );
    }
}
