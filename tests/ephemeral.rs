//! `LOCK.ACQUIRE ... EPHEMERAL`: a hold bound to the connection that took it, which ends when
//! that connection closes (a SIGKILLed process, CLIENT KILL, the server's idle `timeout`, a plain
//! close) or when its lease ends, whichever comes first. The waiters get the key at once, the
//! replica learns it as effects, INFO counts it, and nothing is bound after a failover or a
//! restart.

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use lock_testkit::*;

const SOON: Duration = Duration::from_secs(5);

/// The error of a plain re-entry of an ephemeral hold.
const REENTER_WITH: &str = "ERR the owner's hold is EPHEMERAL; re-enter it with EPHEMERAL";
/// The error of an ephemeral re-entry of a plain hold.
const REENTER_WITHOUT: &str =
    "ERR the owner's hold is not EPHEMERAL; re-enter it without EPHEMERAL";
/// The error of EPHEMERAL inside EVAL or FCALL (the server appends where the script failed).
const IN_SCRIPT: &str =
    "ERR EPHEMERAL cannot be used from a script or function: it has no connection to bind the hold to";

/// A `redis-cli` process holding a connection: what a crashing application looks like when it
/// is SIGKILLed (the kernel closes its socket, no goodbye).
fn cli_holder(server: &Server) -> Cli {
    Cli::start(server.port).expect("spawn redis-cli ($LOCK_CLI)")
}

/// An EPHEMERAL acquire that must be granted: its token.
fn ephemeral(con: &mut Connection, key: &str, owner: &str, lease_ms: u64, more: &[&str]) -> i64 {
    let mut options = vec!["EPHEMERAL"];
    options.extend_from_slice(more);
    acquire_with(con, key, owner, lease_ms, &options)
        .expect("LOCK.ACQUIRE EPHEMERAL")
        .expect("granted")
}

fn owner_of(con: &mut Connection, key: &str) -> Option<String> {
    lock_info(con, key).map(|info| redis::from_redis_value(&info["owner"]).unwrap())
}

/// LOCK.INFO's `holders`: owner → (count, ephemeral).
fn holders(con: &mut Connection, key: &str) -> HashMap<String, (i64, Option<i64>)> {
    let info = lock_info(con, key).unwrap_or_else(|| panic!("{key} is free"));
    let Value::Bulk(entries) = &info["holders"] else {
        panic!("holders: {:?}", info["holders"]);
    };
    entries
        .iter()
        .map(|entry| {
            let Value::Bulk(fields) = entry else {
                panic!("holder entry {entry:?}");
            };
            let map: HashMap<String, Value> = fields
                .chunks(2)
                .map(|p| (redis::from_redis_value(&p[0]).unwrap(), p[1].clone()))
                .collect();
            let owner: String = redis::from_redis_value(&map["owner"]).unwrap();
            let count: i64 = redis::from_redis_value(&map["count"]).unwrap();
            let bound: Option<i64> = redis::from_redis_value(&map["ephemeral"]).unwrap();
            (owner, (count, bound))
        })
        .collect()
}

/// A key's hash (sorted) and absolute lease end.
type HoldState = (Vec<(Vec<u8>, Vec<u8>)>, i64);

/// A key's hash and absolute lease end (the token counters of other keys aside).
fn hold_state(con: &mut Connection, key: &str) -> HoldState {
    let stored = stored_lock(con, key);
    (stored.fields, stored.expires_at)
}

/// Waits until the module has handled the close of connection `closed` (whatever it ended):
/// once the server freed it, a probe connection closes with an EPHEMERAL hold of its own, and
/// the module handles closes in the order the server reports them, so the probe's hold ending
/// (`lock_disconnected` + 1) means the earlier close was handled too.
fn closes_handled(server: &Server, admin: &mut Connection, closed: i64) {
    assert!(
        eventually(SOON, || {
            let list: String = redis::cmd("CLIENT").arg("LIST").query(admin).unwrap();
            !list
                .lines()
                .any(|l| l.starts_with(&format!("id={closed} ")))
        }),
        "the server never freed connection {closed}"
    );
    let mut probe = server.connect();
    ephemeral(&mut probe, "closes-handled-probe", "probe", 30_000, &[]);
    let before = lock_stat(admin, "disconnected");
    drop(probe);
    assert!(eventually(SOON, || lock_stat(admin, "disconnected") == before + 1));
}

fn exists(con: &mut Connection, key: &str) -> bool {
    con.exists(key).expect("EXISTS")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A holder process SIGKILLed while a waiter blocks: the waiter is granted within
/// milliseconds (measured from the kill to the reply on the waiter's side), the replica sees
/// the new owner, tokens rise, `disconnected` counts each.
#[test]
fn a_killed_holder_process_hands_the_key_to_the_waiter_within_milliseconds() {
    const SAMPLES: usize = 20;
    let master = Server::start();
    let replica = Server::replica_of(&master);
    let (mut m, mut r) = (master.connect(), replica.connect());
    let mut latencies = Vec::new();
    for i in 0..SAMPLES {
        let key = format!("crash:{i}");
        let mut holder = cli_holder(&master);
        let holder_id = holder.integer("CLIENT ID");
        let old_token = holder.integer(&format!("LOCK.ACQUIRE {key} h{i} 30000 EPHEMERAL"));
        assert_eq!(bound_to(&mut m, &key), Some(holder_id));
        assert_eq!(lock_stat(&mut m, "ephemeral_holds"), 1);
        let disconnected = lock_stat(&mut m, "disconnected");
        let waiter = Waiter::request(&master, &key, &format!("w{i}"), 30_000, 10_000)
            .keep_connection()
            .start();
        let killed = Instant::now();
        holder.kill();
        let (
            token,
            Answer {
                at: answered,
                con: _con,
                ..
            },
        ) = waiter.granted(SOON);
        latencies.push(answered.duration_since(killed).as_secs_f64() * 1e3);
        assert!(token > old_token, "{token} <= {old_token}");
        assert_eq!(owner_of(&mut m, &key), Some(format!("w{i}")));
        assert_eq!(bound_to(&mut m, &key), None, "a plain waiter is not bound");
        assert_eq!(lock_stat(&mut m, "disconnected"), disconnected + 1);
        assert_eq!(lock_stat(&mut m, "ephemeral_holds"), 0);
    }
    // The replica got the releases and grants as effects.
    assert_eq!(wait_replicas(&mut m, 1, 5_000), 1);
    for i in 0..SAMPLES {
        let key = format!("crash:{i}");
        assert!(
            eventually(SOON, || stored_lock(&mut r, &key)
                == stored_lock(&mut m, &key)),
            "the replica differs for {key}"
        );
        assert_eq!(owner_of(&mut r, &key), Some(format!("w{i}")));
        assert_eq!(holders(&mut r, &key).len(), 1, "the old holder is gone");
    }
    latencies.sort_by(f64::total_cmp);
    let (p50, p99) = (percentile(&latencies, 50.0), percentile(&latencies, 99.0));
    println!(
        "kill -> grant over {SAMPLES} SIGKILLed holders: p50 {p50:.2} ms, p99 {p99:.2} ms, max {:.2} ms",
        latencies[SAMPLES - 1]
    );
    assert!(p99 < 2_000.0, "kill -> grant p99 {p99:.1} ms");
}

/// CLIENT KILL of a holder that re-entered: every re-entry ends at once, the waiter is
/// granted, the `lock.disconnected` event is published.
#[test]
fn client_kill_ends_every_reentry_at_once_and_the_waiter_is_granted() {
    let server = Server::start();
    let mut admin = server.connect();
    notify_keyspace_events(&mut admin, "Kh");
    let mut sub = server.connect();
    let mut pubsub = keyspace_subscriber(&mut sub, "k", Duration::from_millis(500));

    let mut holder = server.connect();
    let holder_id = client_id(&mut holder);
    let token = ephemeral(&mut holder, "k", "h", 30_000, &[]);
    assert_eq!(ephemeral(&mut holder, "k", "h", 30_000, &[]), token);
    assert_eq!(
        ephemeral(&mut holder, "k", "h", 30_000, &["WAIT", "100"]),
        token
    );
    let info = lock_info(&mut admin, "k").unwrap();
    assert_eq!(info_int(&info, "count"), 3);
    assert_eq!(bound_to(&mut admin, "k"), Some(holder_id));
    assert_eq!(lock_stat(&mut admin, "ephemeral_holds"), 1);

    let waiter = Waiter::request(&server, "k", "w", 30_000, 10_000)
        .keep_connection()
        .start();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(holder_id)
        .query(&mut admin)
        .unwrap();
    assert_eq!(killed, 1);
    let (new_token, _answer) = waiter.granted(SOON);
    assert!(new_token > token);
    let info = lock_info(&mut admin, "k").unwrap();
    assert_eq!(owner_of(&mut admin, "k").as_deref(), Some("w"));
    assert_eq!(info_int(&info, "count"), 1);
    assert_eq!(
        holders(&mut admin, "k").len(),
        1,
        "no re-entry of h is left"
    );
    assert_eq!(lock_stat(&mut admin, "disconnected"), 1);
    assert_eq!(lock_stat(&mut admin, "ephemeral_holds"), 0);
    // The holder's connection is really gone.
    assert!(redis::cmd("PING").query::<String>(&mut holder).is_err());

    let mut seen = Vec::new();
    while let Ok(msg) = pubsub.get_message() {
        seen.push(msg.get_payload::<String>().unwrap());
    }
    assert_eq!(
        seen,
        [
            "lock.acquired",
            "lock.reentered",
            "lock.reentered",
            "lock.disconnected",
            "lock.handoff"
        ],
    );
}

/// The server's idle `timeout` closes the holder's connection: its hold ends with it.
#[test]
fn the_servers_idle_timeout_closes_the_holder_and_ends_its_hold() {
    let server = Server::start();
    let mut admin = server.connect();
    let mut holder = server.connect();
    ephemeral(&mut holder, "k", "h", 30_000, &[]);
    // A blocked client is not idle: the waiter stays.
    let waiter = Waiter::request(&server, "k", "w", 30_000, 15_000)
        .keep_connection()
        .start();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("timeout")
        .arg(1)
        .query(&mut admin)
        .unwrap();
    let started = Instant::now();
    let (
        _,
        Answer {
            at: answered,
            con: _con,
            ..
        },
    ) = waiter.granted(Duration::from_secs(10));
    println!(
        "idle timeout 1 s: the holder's hold ended after {:?}",
        answered.duration_since(started)
    );
    // The idle timeout may have closed the admin connection too.
    let mut admin = server.connect();
    assert_eq!(owner_of(&mut admin, "k").as_deref(), Some("w"));
    assert_eq!(lock_stat(&mut admin, "disconnected"), 1);
    assert!(
        redis::cmd("PING").query::<String>(&mut holder).is_err(),
        "the server closed the idle holder"
    );
}

/// One connection with 1,000 ephemeral holds on distinct keys, plus shared holds and
/// permits on single keys, closed at once: every hold ends in one pass. And what a binding
/// costs in memory, next to a plain hold.
#[test]
fn a_thousand_ephemeral_holds_end_together_when_their_connection_closes() {
    const N: usize = 1_000;
    const SHARED: usize = 10;
    const PERMITS: usize = 10;
    let server = Server::start();
    let mut admin = server.connect();
    let mut holder = server.connect();
    let mut pipe = redis::pipe();
    for i in 0..N {
        pipe.cmd("LOCK.ACQUIRE")
            .arg(format!("e:{i:04}"))
            .arg("h")
            .arg(60_000)
            .arg("EPHEMERAL");
    }
    for i in 0..SHARED {
        pipe.cmd("LOCK.ACQUIRE")
            .arg("rw")
            .arg(format!("reader-{i}"))
            .arg(60_000)
            .arg("SHARED")
            .arg("EPHEMERAL");
    }
    for i in 0..PERMITS {
        pipe.cmd("LOCK.ACQUIRE")
            .arg("sem")
            .arg(format!("permit-{i}"))
            .arg(60_000)
            .arg("EPHEMERAL")
            .arg("LIMIT")
            .arg(20);
    }
    let tokens: Vec<Option<i64>> = pipe.query(&mut holder).unwrap();
    assert!(tokens.iter().all(Option::is_some));
    let total = N + SHARED + PERMITS;
    assert_eq!(lock_stat(&mut admin, "ephemeral_holds"), total as i64);
    assert_eq!(holders(&mut admin, "rw").len(), SHARED);
    assert_eq!(holders(&mut admin, "sem").len(), PERMITS);
    let holder_id = client_id(&mut holder);
    assert!(holders(&mut admin, "sem")
        .values()
        .all(|&(_, bound)| bound == Some(holder_id)));

    // Every key at once, in one command: the close is seen all or nothing.
    let mut all = redis::cmd("EXISTS");
    for i in 0..N {
        all.arg(format!("e:{i:04}"));
    }
    all.arg("rw").arg("sem");
    let closed = Instant::now();
    drop(holder);
    let mut partial = Vec::new();
    let gone = eventually(SOON, || {
        let n: i64 = all.query(&mut admin).unwrap();
        if n != 0 && n != (N + 2) as i64 {
            partial.push(n);
        }
        n == 0
    });
    let took = closed.elapsed();
    assert!(gone, "the holds outlived their connection");
    assert!(partial.is_empty(), "seen half-released: {partial:?}");
    println!("{total} ephemeral holds on one connection: all ended within {took:?} of the close");
    assert_eq!(lock_stat(&mut admin, "ephemeral_holds"), 0);
    assert_eq!(lock_stat(&mut admin, "disconnected"), total as i64);
    // Nothing left but the token counters.
    let keys: Vec<String> = admin.keys("*").unwrap();
    assert!(
        keys.iter().all(|k| k.starts_with("__lock_fence__")),
        "{keys:?}"
    );

    // Memory: the same n holds, plain then EPHEMERAL, each on a fresh server.
    for n in [N, 10 * N] {
        let plain = memory_per_hold(n, &[]);
        let bound = memory_per_hold(n, &["EPHEMERAL"]);
        let extra = bound - plain;
        println!(
            "memory per hold ({n} holds): plain {plain:.0} B, EPHEMERAL {bound:.0} B, \
             extra {extra:.0} B per ephemeral hold (budget 64 B)"
        );
        assert!(
            extra <= 64.0,
            "an ephemeral hold costs {extra:.0} B more (budget 64 B)"
        );
    }
}

/// used_memory growth per hold for `n` holds on distinct keys, taken on a fresh server with
/// `options`.
fn memory_per_hold(n: usize, options: &[&str]) -> f64 {
    let server = Server::start();
    let mut probe = server.connect();
    let mut con = server.connect();
    // Warm up (counter table, connection buffers) outside the measured holds.
    acquire_with(&mut con, "warm", "x", 60_000, options).unwrap();
    let before = used_memory(&mut probe);
    // Pipelines of 200 commands fit the server's 16 KB query buffer whether or not they carry
    // EPHEMERAL: a larger buffer for the longer commands would count as the binding's cost.
    for chunk in (0..n).collect::<Vec<_>>().chunks(200) {
        let mut pipe = redis::pipe();
        for i in chunk {
            pipe.cmd("LOCK.ACQUIRE")
                .arg(format!("m:{i:05}"))
                .arg("holder-1")
                .arg(60_000)
                .arg(options)
                .ignore();
        }
        let _: () = pipe.query(&mut con).unwrap();
    }
    let _: String = redis::cmd("PING").query(&mut con).unwrap();
    let after = settled_used_memory(&mut probe);
    (after - before) as f64 / n as f64
}

/// used_memory once it stops moving: while Redis rehashes its keyspace into a larger table
/// (incrementally, from its cron), both tables are counted, and ~20,000 keys is just past a
/// resize.
fn settled_used_memory(con: &mut Connection) -> i64 {
    let mut last = used_memory(con);
    for _ in 0..50 {
        thread::sleep(Duration::from_millis(100));
        let now = used_memory(con);
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// The owner re-enters, renews and releases from another connection; the binding stays
/// with the first connection. Plain and EPHEMERAL re-entries of the other kind are refused.
#[test]
fn the_binding_stays_with_the_first_connection_whatever_the_owner_does_elsewhere() {
    let server = Server::start();
    let mut admin = server.connect();
    let mut first = server.connect();
    let first_id = client_id(&mut first);
    let mut second = server.connect();
    let token = ephemeral(&mut first, "k", "o", 30_000, &[]);
    assert_eq!(ephemeral(&mut second, "k", "o", 30_000, &[]), token);
    let renewed: i64 = redis::cmd("LOCK.RENEW")
        .arg("k")
        .arg("o")
        .arg(90_000)
        .query(&mut second)
        .unwrap();
    assert_eq!(renewed, 1);
    let info = lock_info(&mut admin, "k").unwrap();
    assert_eq!(info_int(&info, "count"), 2);
    assert!(info_int(&info, "ttl") > 60_000);
    assert_eq!(bound_to(&mut admin, "k"), Some(first_id));
    assert_eq!(release(&mut second, "k", "o"), Some(1));

    // Mismatches, from either connection: an error, nothing changed.
    let before = hold_state(&mut admin, "k");
    for con in [&mut first, &mut second] {
        assert_eq!(
            error_of(con, &[b"LOCK.ACQUIRE", b"k", b"o", b"30000"]),
            REENTER_WITH
        );
        assert_eq!(
            error_of(
                con,
                &[b"LOCK.ACQUIRE", b"k", b"o", b"30000", b"WAIT", b"100"]
            ),
            REENTER_WITH
        );
    }
    assert_eq!(hold_state(&mut admin, "k"), before);
    acquire(&mut admin, "plain", "o", 30_000).unwrap();
    let plain_before = hold_state(&mut admin, "plain");
    assert_eq!(
        error_of(
            &mut first,
            &[b"LOCK.ACQUIRE", b"plain", b"o", b"30000", b"EPHEMERAL"]
        ),
        REENTER_WITHOUT
    );
    assert_eq!(hold_state(&mut admin, "plain"), plain_before);
    // The same for a shared hold.
    ephemeral(&mut first, "rw", "r", 30_000, &["SHARED"]);
    acquire_with(&mut admin, "rw", "p", 30_000, &["SHARED"])
        .unwrap()
        .unwrap();
    let rw_before = hold_state(&mut admin, "rw");
    assert_eq!(
        error_of(
            &mut second,
            &[b"LOCK.ACQUIRE", b"rw", b"r", b"30000", b"SHARED"]
        ),
        REENTER_WITH
    );
    assert_eq!(
        error_of(
            &mut second,
            &[
                b"LOCK.ACQUIRE",
                b"rw",
                b"p",
                b"30000",
                b"SHARED",
                b"EPHEMERAL"
            ]
        ),
        REENTER_WITHOUT
    );
    assert_eq!(hold_state(&mut admin, "rw"), rw_before);
    assert_eq!(lock_stat(&mut admin, "ephemeral_holds"), 2);

    // A hold released by its owner elsewhere: closing the first connection later ends nothing
    // (not even a new hold of the key by somebody else).
    ephemeral(&mut first, "gone", "o", 30_000, &[]);
    assert_eq!(release(&mut second, "gone", "o"), Some(0));
    assert_eq!(lock_stat(&mut admin, "ephemeral_holds"), 2);
    acquire(&mut admin, "gone", "someone-else", 30_000).unwrap();

    // Closing the second connection changes nothing (a probe's close, handled after it, is
    // what the module then counts).
    let second_id = client_id(&mut second);
    drop(second);
    closes_handled(&server, &mut admin, second_id);
    assert_eq!(hold_state(&mut admin, "k"), before);
    assert_eq!(bound_to(&mut admin, "k"), Some(first_id));
    assert_eq!(
        lock_stat(&mut admin, "disconnected"),
        1,
        "the probe's hold only"
    );

    // Closing the first ends its holds, the remaining re-entry included.
    drop(first);
    assert!(eventually(SOON, || !exists(&mut admin, "k")));
    assert!(
        eventually(SOON, || holders(&mut admin, "rw").len() == 1),
        "r's shared hold outlived its connection: rw holders {:?}, HGETALL rw {:?}, \
         disconnected {}, ephemeral_holds {}",
        holders(&mut admin, "rw"),
        hold_state(&mut admin, "rw"),
        lock_stat(&mut admin, "disconnected"),
        lock_stat(&mut admin, "ephemeral_holds"),
    );
    assert_eq!(holders(&mut admin, "rw")["p"], (1, None));
    assert_eq!(lock_stat(&mut admin, "disconnected"), 3);
    assert_eq!(lock_stat(&mut admin, "ephemeral_holds"), 0);
    assert_eq!(
        owner_of(&mut admin, "gone").as_deref(),
        Some("someone-else")
    );
    assert_eq!(owner_of(&mut admin, "plain").as_deref(), Some("o"));
}

/// A waiter granted an EPHEMERAL hold while blocked is bound to its own connection.
#[test]
fn a_waiter_granted_an_ephemeral_hold_is_bound_to_its_own_connection() {
    let server = Server::start();
    let mut admin = server.connect();
    acquire(&mut admin, "k", "a", 30_000).unwrap();
    let first = Waiter::request(&server, "k", "b", 30_000, 10_000)
        .options(&["EPHEMERAL"])
        .keep_connection()
        .start();
    let second = Waiter::start(&server, "k", "c", 30_000, 10_000);
    assert_eq!(release(&mut admin, "k", "a"), Some(0));
    let (token_b, answer_b) = first.granted(SOON);
    let con_b = answer_b.connection();
    assert_eq!(owner_of(&mut admin, "k").as_deref(), Some("b"));
    assert_eq!(bound_to(&mut admin, "k"), Some(first.id));
    assert_eq!(lock_stat(&mut admin, "ephemeral_holds"), 1);
    assert!(second.still_blocked());
    drop(con_b);
    let token_c = second
        .token(SOON)
        .expect("granted when b's connection closed");
    assert!(token_c > token_b);
    assert_eq!(owner_of(&mut admin, "k").as_deref(), Some("c"));
    assert_eq!(lock_stat(&mut admin, "disconnected"), 1);
    assert_eq!(lock_stat(&mut admin, "ephemeral_holds"), 0);
}

/// EVAL and FCALL refuse EPHEMERAL (no connection to bind to); MULTI/EXEC binds to the
/// connection that ran it.
#[test]
fn scripts_refuse_ephemeral_and_a_transaction_binds_to_its_caller() {
    let server = Server::start();
    let mut con = server.connect();
    let script = "return redis.call('LOCK.ACQUIRE', KEYS[1], 'o', 30000, 'EPHEMERAL')";
    let err = error_of(&mut con, &[b"EVAL", script.as_bytes(), b"1", b"k"]);
    assert!(err.starts_with(IN_SCRIPT), "{err}");
    let library = "#!lua name=eph\n\
        redis.register_function('eph', function(keys, args) \
        return redis.call('LOCK.ACQUIRE', keys[1], 'o', 30000, 'EPHEMERAL') end)";
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(library)
        .query(&mut con)
        .unwrap();
    let err = error_of(&mut con, &[b"FCALL", b"eph", b"1", b"k"]);
    assert!(err.starts_with(IN_SCRIPT), "{err}");
    assert!(!exists(&mut con, "k"));
    // Without EPHEMERAL the script takes the lock.
    let plain = "return redis.call('LOCK.ACQUIRE', KEYS[1], 'o', 30000)";
    let _: i64 = redis::cmd("EVAL")
        .arg(plain)
        .arg(1)
        .arg("p")
        .query(&mut con)
        .unwrap();
    assert_eq!(lock_stat(&mut con, "ephemeral_holds"), 0);

    let mut tx = server.connect();
    let tx_id = client_id(&mut tx);
    let (token, info): (i64, Value) = redis::pipe()
        .atomic()
        .cmd("LOCK.ACQUIRE")
        .arg("k")
        .arg("o")
        .arg(30_000)
        .arg("EPHEMERAL")
        .cmd("LOCK.INFO")
        .arg("k")
        .query(&mut tx)
        .unwrap();
    assert!(token > 0);
    assert_ne!(info, Value::Nil);
    assert_eq!(bound_to(&mut con, "k"), Some(tx_id));
    let waiter = Waiter::start(&server, "k", "w", 30_000, 10_000);
    drop(tx);
    assert!(
        waiter.token(SOON).is_some(),
        "granted when the caller closed"
    );
    assert_eq!(lock_stat(&mut con, "disconnected"), 1);
}

/// Failover: on the promoted replica nothing is bound; the hold lives until its lease ends,
/// whatever becomes of the connection that took it.
#[test]
fn after_failover_an_ephemeral_hold_lives_until_its_lease_ends() {
    const LEASE_MS: u64 = 4_000;
    let old = Server::start();
    let new = Server::replica_of(&old);
    let mut holder = old.connect();
    let holder_id = client_id(&mut holder);
    let token = ephemeral(&mut holder, "k", "h", LEASE_MS, &[]);
    let lease_ends = Instant::now() + Duration::from_millis(LEASE_MS);
    assert_eq!(bound_to(&mut holder, "k"), Some(holder_id));
    assert_eq!(wait_replicas(&mut holder, 1, 5_000), 1);

    let mut admin = old.connect();
    let _: () = redis::cmd("FAILOVER")
        .arg("TIMEOUT")
        .arg(3_000)
        .query(&mut admin)
        .unwrap();
    let mut n = new.connect();
    assert!(
        eventually(SOON, || {
            info_field(&mut n, "replication", "role").as_deref() == Some("master")
                && info_field(&mut admin, "replication", "role").as_deref() == Some("slave")
                && info_field(&mut admin, "replication", "master_link_status").as_deref()
                    == Some("up")
        }),
        "the failover did not complete"
    );
    assert!(
        Instant::now() + Duration::from_millis(1_000) < lease_ends,
        "the failover took too long for this test's lease"
    );
    let info = lock_info(&mut n, "k").expect("the hold survived the failover");
    assert_eq!(info_int(&info, "token"), token);
    assert_eq!(
        bound_to(&mut n, "k"),
        None,
        "nothing is bound on the promoted replica"
    );
    assert_eq!(holders(&mut n, "k")["h"], (1, None));
    assert_eq!(lock_stat(&mut n, "ephemeral_holds"), 0);

    println!(
        "after FAILOVER, on the demoted old master: LOCK.INFO k ephemeral = {:?}, \
         ephemeral_holds = {}",
        bound_to(&mut admin, "k"),
        lock_stat(&mut admin, "ephemeral_holds")
    );
    // The holder's connection (still open to the old master, now a replica) closes: nothing
    // happens on the new master.
    let waiter = Waiter::request(&new, "k", "w", 30_000, 10_000)
        .keep_connection()
        .start();
    drop(holder);
    thread::sleep(Duration::from_millis(300));
    assert!(waiter.still_blocked(), "granted before the lease ended");
    assert_eq!(owner_of(&mut n, "k").as_deref(), Some("h"));
    assert_eq!(lock_stat(&mut n, "disconnected"), 0);
    // At the lease end it goes to the waiter.
    let (
        new_token,
        Answer {
            at: answered,
            con: _con,
            ..
        },
    ) = waiter.granted(Duration::from_millis(LEASE_MS) + SOON);
    assert!(new_token > token);
    assert!(
        answered + Duration::from_millis(50) >= lease_ends,
        "granted {:?} before the lease end",
        lease_ends.duration_since(answered)
    );
    assert_eq!(owner_of(&mut n, "k").as_deref(), Some("w"));
    // The old master, now a replica, follows.
    assert_eq!(wait_replicas(&mut n, 1, 5_000), 1);
    let mut o = old.connect();
    assert!(eventually(SOON, || owner_of(&mut o, "k").as_deref() == Some("w")));
}

/// After a restart (from the AOF) nothing is bound either: the hold lives until its lease ends.
#[test]
fn after_a_restart_an_ephemeral_hold_lives_until_its_lease_ends() {
    const LEASE_MS: u64 = 2_500;
    let mut server = Server::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut holder = server.connect();
    let token = ephemeral(&mut holder, "k", "h", LEASE_MS, &[]);
    let lease_ends = Instant::now() + Duration::from_millis(LEASE_MS);
    server.restart();
    let mut con = server.connect();
    let info = lock_info(&mut con, "k").expect("the hold survived the restart");
    assert_eq!(info_int(&info, "token"), token);
    assert_eq!(bound_to(&mut con, "k"), None);
    assert_eq!(lock_stat(&mut con, "ephemeral_holds"), 0);
    drop(holder);
    let waiter = Waiter::start(&server, "k", "w", 30_000, 10_000);
    let new_token = waiter.token(Duration::from_millis(LEASE_MS) + SOON);
    assert!(new_token.is_some_and(|t| t > token));
    assert!(Instant::now() + Duration::from_millis(50) >= lease_ends);
    assert_eq!(lock_stat(&mut con, "disconnected"), 0);
}

/// EPHEMERAL with SHARED and LIMIT: a killed permit holder's permit goes to the next waiter;
/// a killed reader's hold ends while the other reader's stays.
#[test]
fn a_killed_permit_or_reader_process_gives_its_room_to_the_next_waiter() {
    let server = Server::start();
    let mut admin = server.connect();

    // Semaphore of 2: a (process, EPHEMERAL) and b (plain) hold the permits, c waits.
    let mut a = cli_holder(&server);
    let a_id = a.integer("CLIENT ID");
    let token_a = a.integer("LOCK.ACQUIRE sem a 30000 LIMIT 2 EPHEMERAL");
    acquire_with(&mut admin, "sem", "b", 30_000, &["LIMIT", "2"])
        .unwrap()
        .unwrap();
    let by_owner = holders(&mut admin, "sem");
    assert_eq!(by_owner["a"], (1, Some(a_id)));
    assert_eq!(by_owner["b"], (1, None));
    let c = Waiter::request(&server, "sem", "c", 30_000, 10_000)
        .options(&["LIMIT", "2"])
        .keep_connection()
        .start();
    a.kill();
    let (token_c, _answer_c) = c.granted(SOON);
    assert!(token_c > token_a);
    let by_owner = holders(&mut admin, "sem");
    assert_eq!(by_owner.len(), 2);
    assert_eq!(by_owner["b"], (1, None));
    assert_eq!(by_owner["c"], (1, None));

    // Read-write: r1 (process, SHARED EPHEMERAL) and r2 (plain SHARED) read, x waits to write.
    let mut r1 = cli_holder(&server);
    r1.integer("LOCK.ACQUIRE rw r1 30000 SHARED EPHEMERAL");
    acquire_with(&mut admin, "rw", "r2", 30_000, &["SHARED"])
        .unwrap()
        .unwrap();
    let x = Waiter::request(&server, "rw", "x", 30_000, 10_000)
        .keep_connection()
        .start();
    r1.kill();
    assert!(eventually(SOON, || holders(&mut admin, "rw").len() == 1));
    assert_eq!(holders(&mut admin, "rw")["r2"], (1, None));
    assert!(x.still_blocked(), "the writer went in while r2 still reads");
    assert_eq!(release(&mut admin, "rw", "r2"), Some(0));
    x.granted(SOON);
    assert_eq!(owner_of(&mut admin, "rw").as_deref(), Some("x"));
    assert_eq!(lock_stat(&mut admin, "disconnected"), 2);
    assert_eq!(lock_stat(&mut admin, "ephemeral_holds"), 0);
}

/// Two holds of one connection on keys of different slots can carry the same token (tokens are
/// per slot; two grants in one millisecond both get `<ms>000`). The owner's release of the
/// second must unbind that one, not the first: otherwise the first outlives its connection.
#[test]
fn releasing_one_hold_keeps_the_binding_of_another_with_the_same_token() {
    let server = Server::start();
    let mut admin = server.connect();
    // Grants in one transaction share a millisecond most of the time: retry until they do.
    for round in 0..50 {
        let (a, b) = (format!("a:{round}"), format!("b:{round}"));
        let mut holder = server.connect();
        let (token_a, token_b): (i64, i64) = redis::pipe()
            .atomic()
            .cmd("LOCK.ACQUIRE")
            .arg(&a)
            .arg("o")
            .arg(30_000)
            .arg("EPHEMERAL")
            .cmd("LOCK.ACQUIRE")
            .arg(&b)
            .arg("o")
            .arg(30_000)
            .arg("EPHEMERAL")
            .query(&mut holder)
            .unwrap();
        if token_a != token_b {
            assert_eq!(release(&mut holder, &a, "o"), Some(0));
            assert_eq!(release(&mut holder, &b, "o"), Some(0));
            continue;
        }
        let holder_id = client_id(&mut holder);
        assert_eq!(release(&mut holder, &b, "o"), Some(0));
        assert_eq!(bound_to(&mut admin, &a), Some(holder_id));
        assert_eq!(lock_stat(&mut admin, "ephemeral_holds"), 1);
        drop(holder);
        assert!(
            eventually(SOON, || !exists(&mut admin, &a)),
            "{a} (token {token_a}) outlived its connection after the release of {b} (same \
             token): LOCK.INFO {a} = {:?}, ephemeral_holds {}",
            lock_info(&mut admin, &a),
            lock_stat(&mut admin, "ephemeral_holds"),
        );
        assert_eq!(lock_stat(&mut admin, "ephemeral_holds"), 0);
        return;
    }
    panic!("no two grants shared a millisecond in 50 rounds");
}

/// A holder whose connection closes while writes are paused (CLIENT PAUSE WRITE, as during a
/// failover): its hold ends when the pause ends, and the waiter gets the key then.
#[test]
fn a_holder_closed_during_a_write_pause_is_released_after_the_pause() {
    let server = Server::start();
    let mut admin = server.connect();
    let mut holder = cli_holder(&server);
    let token = holder.integer("LOCK.ACQUIRE k h 30000 EPHEMERAL");
    let waiter = Waiter::request(&server, "k", "w", 30_000, 10_000)
        .keep_connection()
        .start();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(600)
        .arg("WRITE")
        .query(&mut admin)
        .unwrap();
    let paused = Instant::now();
    holder.kill();
    thread::sleep(Duration::from_millis(200));
    assert!(waiter.still_blocked(), "granted during the pause");
    assert_eq!(owner_of(&mut admin, "k").as_deref(), Some("h"));
    let (
        new_token,
        Answer {
            at: answered,
            con: _con,
            ..
        },
    ) = waiter.granted(SOON);
    assert!(new_token > token);
    assert!(
        answered.duration_since(paused) >= Duration::from_millis(550),
        "granted {:?} into a 600 ms pause",
        answered.duration_since(paused)
    );
    assert_eq!(owner_of(&mut admin, "k").as_deref(), Some("w"));
    assert_eq!(lock_stat(&mut admin, "disconnected"), 1);
    assert_eq!(lock_stat(&mut admin, "ephemeral_holds"), 0);
}

/// Failover and back, with the holder's connection to the first master open all along: the
/// hold lost its binding at the first failover ("after failover nothing is bound"), so closing
/// that connection once the first master is master again must not end the hold either.
#[test]
fn after_failover_and_back_the_old_connection_is_not_bound_any_more() {
    let first = Server::start();
    let second = Server::replica_of(&first);
    let mut holder = first.connect();
    let token = ephemeral(&mut holder, "k", "h", 30_000, &[]);
    assert_eq!(wait_replicas(&mut holder, 1, 5_000), 1);
    let (mut a, mut b) = (first.connect(), second.connect());
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("repl-diskless-sync-delay")
        .arg(0)
        .query(&mut b)
        .unwrap();
    let switched = |from: &mut Connection, to: &mut Connection| {
        let _: () = redis::cmd("FAILOVER").query(from).unwrap();
        assert!(
            eventually(SOON, || {
                info_field(to, "replication", "role").as_deref() == Some("master")
                    && info_field(from, "replication", "master_link_status").as_deref()
                        == Some("up")
            }),
            "the failover did not complete"
        );
    };
    switched(&mut a, &mut b);
    assert_eq!(bound_to(&mut b, "k"), None);
    switched(&mut b, &mut a);
    let bound_after = bound_to(&mut a, "k");
    let gauge_after = lock_stat(&mut a, "ephemeral_holds");
    drop(holder);
    thread::sleep(Duration::from_millis(300));
    let info = lock_info(&mut a, "k");
    assert!(
        info.as_ref().is_some_and(|i| info_int(i, "token") == token),
        "closing the pre-failover connection ended the hold on the first master, master again \
         (before the close: LOCK.INFO ephemeral {bound_after:?}, ephemeral_holds {gauge_after}; \
         after: LOCK.INFO {info:?}, disconnected {})",
        lock_stat(&mut a, "disconnected")
    );
    assert_eq!(bound_after, None);
    assert_eq!(lock_stat(&mut a, "disconnected"), 0);
}
