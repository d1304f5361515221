//! Leader election on a lock key (`LOCK.CAMPAIGN`, `LOCK.PROCLAIM`, `LOCK.LEADER`, the leader
//! channel), with real clients and real processes on real servers: observers hear each leader
//! and each proclamation in order; only the leader of an epoch proclaims; a killed leader's
//! successor leads within milliseconds (EPHEMERAL); a leader stopped past its lease is deposed
//! and its epoch refused; epochs keep rising across a failover; replicas see the value.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use lock_testkit::*;

const SOON: Duration = Duration::from_secs(5);

/// A connection subscribed to the key's leader channel; its messages arrive on the receiver.
fn observe(server: &Server, key: &str) -> mpsc::Receiver<(String, Instant)> {
    let mut con = server.connect();
    let (messages, received) = mpsc::channel();
    let (ready, subscribed) = mpsc::channel();
    let channel = format!("lock.leader:{{{key}}}");
    thread::spawn(move || {
        let mut pubsub = con.as_pubsub();
        pubsub.subscribe(&channel).expect("SUBSCRIBE");
        let _ = ready.send(());
        while let Ok(message) = pubsub.get_message() {
            let payload: String = message.get_payload().unwrap_or_default();
            if messages.send((payload, Instant::now())).is_err() {
                break;
            }
        }
    });
    subscribed.recv_timeout(SOON).expect("subscribed");
    received
}

/// A leader message about `svc` in database 0.
fn said(kind: &str, epoch: i64, rest: &str) -> String {
    format!("{kind} 0 {epoch} 3 svc {rest}")
}

fn next(observer: &mpsc::Receiver<(String, Instant)>) -> String {
    observer.recv_timeout(SOON).expect("a leader message").0
}

fn campaign(con: &mut Connection, key: &str, candidate: &str, opts: &[&str]) -> Option<i64> {
    redis::cmd("LOCK.CAMPAIGN")
        .arg(key)
        .arg(candidate)
        .arg(60_000)
        .arg(opts)
        .query(con)
        .unwrap()
}

fn proclaim(con: &mut Connection, key: &str, candidate: &str, epoch: i64, value: &str) -> i64 {
    redis::cmd("LOCK.PROCLAIM")
        .arg(key)
        .arg(candidate)
        .arg(epoch)
        .arg(value)
        .query(con)
        .unwrap()
}

type Leader = Option<(String, i64, Option<String>)>;

fn leader(con: &mut Connection, key: &str) -> Leader {
    redis::cmd("LOCK.LEADER").arg(key).query(con).unwrap()
}

/// Elections of one key name in two databases, and on `svc` and `{svc}`, share a channel (it is
/// named after the hash tag, and pub/sub has no databases), and their epochs come from one
/// slot counter: each message names its database and key, so an observer follows its own
/// election only.
#[test]
fn each_leader_message_names_its_database_and_key() {
    let server = Server::start();
    let observer = observe(&server, "svc");
    let mut db0 = server.connect();
    let mut db1 = server.connect();
    let _: () = redis::cmd("SELECT").arg(1).query(&mut db1).unwrap();
    let e0 = campaign(&mut db0, "svc", "app0-node", &["VALUE", "a"]).unwrap();
    let e1 = campaign(&mut db1, "svc", "app1-node", &["VALUE", "b"]).unwrap();
    let e2 = campaign(&mut db0, "{svc}", "tagged-node", &[]).unwrap();
    assert_eq!(proclaim(&mut db0, "svc", "app0-node", e0, "a2"), 1);
    let heard: Vec<String> = (0..6).map(|_| next(&observer)).collect();
    assert_eq!(
        heard,
        [
            said("elected", e0, "app0-node"),
            said("proclaimed", e0, "a"),
            format!("elected 1 {e1} 3 svc app1-node"),
            format!("proclaimed 1 {e1} 3 svc b"),
            format!("elected 0 {e2} 5 {{svc}} tagged-node"),
            said("proclaimed", e0, "a2"),
        ]
    );
    // One counter, so the other elections' epochs lie between this one's: only the key and
    // the database tell them apart.
    assert!(e0 < e1 && e1 < e2, "{e0} {e1} {e2}");
}

#[test]
fn observers_hear_each_leader_and_proclamation_in_order() {
    let server = Server::start();
    let observer = observe(&server, "svc");
    let mut a = server.connect();
    assert_eq!(leader(&mut a, "svc"), None);
    let e1 = campaign(&mut a, "svc", "node-a", &["VALUE", "10.0.0.1:80"]).unwrap();
    assert_eq!(next(&observer), said("elected", e1, "node-a"));
    assert_eq!(next(&observer), said("proclaimed", e1, "10.0.0.1:80"));
    assert_eq!(
        leader(&mut a, "svc"),
        Some(("node-a".into(), e1, Some("10.0.0.1:80".into())))
    );
    // Campaigning again while leading keeps the epoch and announces no new election.
    assert_eq!(campaign(&mut a, "svc", "node-a", &[]), Some(e1));
    assert_eq!(proclaim(&mut a, "svc", "node-a", e1, "10.0.0.1:81"), 1);
    assert_eq!(next(&observer), said("proclaimed", e1, "10.0.0.1:81"));
    // Only the leader of this epoch proclaims.
    assert_eq!(proclaim(&mut a, "svc", "node-b", e1, "x"), 0);
    assert_eq!(proclaim(&mut a, "svc", "node-a", e1 - 1, "x"), 0);
    // A candidate waits in line; the release hands over, announced with its value.
    let mut b = server.connect();
    let waiting = thread::spawn(move || {
        campaign(
            &mut b,
            "svc",
            "node-b",
            &["WAIT", "0", "VALUE", "10.0.0.2:80"],
        )
    });
    assert!(eventually(SOON, || waiters(&mut a) == 1));
    assert_eq!(release(&mut a, "svc", "node-a"), Some(0));
    let e2 = waiting.join().unwrap().unwrap();
    assert!(e2 > e1);
    assert_eq!(next(&observer), said("elected", e2, "node-b"));
    assert_eq!(next(&observer), said("proclaimed", e2, "10.0.0.2:80"));
    assert_eq!(
        proclaim(&mut a, "svc", "node-a", e1, "stale"),
        0,
        "a deposed leader's epoch"
    );
    assert!(
        observer.recv_timeout(Duration::from_millis(100)).is_err(),
        "nothing else"
    );
    // A leader that proclaims nothing shows no value of an earlier epoch.
    assert_eq!(release(&mut a, "svc", "node-b"), Some(0));
    let e3 = campaign(&mut a, "svc", "node-c", &[]).unwrap();
    assert_eq!(leader(&mut a, "svc"), Some(("node-c".into(), e3, None)));
}

#[test]
fn a_killed_leaders_successor_leads_within_milliseconds() {
    let server = Server::start();
    let observer = observe(&server, "svc");
    let mut cli = Cli::start(server.port).expect("redis-cli");
    let first = cli.integer("LOCK.CAMPAIGN svc node-a 30000 EPHEMERAL");
    assert_eq!(next(&observer), said("elected", first, "node-a"));
    let mut b = server.connect();
    let successor = thread::spawn(move || {
        (
            campaign(&mut b, "svc", "node-b", &["EPHEMERAL", "WAIT", "0"]),
            Instant::now(),
        )
    });
    let mut con = server.connect();
    assert!(eventually(SOON, || waiters(&mut con) == 1));
    let killed = Instant::now();
    cli.kill();
    let (epoch, granted) = successor.join().unwrap();
    let epoch = epoch.unwrap();
    let (message, heard) = observer.recv_timeout(SOON).expect("elected");
    assert_eq!(message, said("elected", epoch, "node-b"));
    println!(
        "killed leader -> successor granted in {:.2} ms, observers told in {:.2} ms",
        granted.duration_since(killed).as_secs_f64() * 1e3,
        heard.duration_since(killed).as_secs_f64() * 1e3
    );
    // A generous bound, to catch a hang: the lease (30 s) must not be what ended it.
    assert!(granted.duration_since(killed) < Duration::from_secs(2));
}

#[test]
fn a_leader_stopped_past_its_lease_is_deposed_and_its_epoch_refused() {
    let server = Server::start();
    let mut cli = Cli::start(server.port).expect("redis-cli");
    let old = cli.integer("LOCK.CAMPAIGN svc node-a 300 EPHEMERAL");
    cli.signal(Signal::Stop);
    let mut b = server.connect();
    let new =
        campaign(&mut b, "svc", "node-b", &["WAIT", "5000"]).expect("elected at the lease end");
    assert!(new > old, "the new epoch is above the deposed one");
    cli.signal(Signal::Cont);
    // Resumed, the old leader's epoch is refused: by the server...
    let refused = cli.integer(&format!("LOCK.PROCLAIM svc node-a {old} back"));
    assert_eq!(refused, 0);
    // ...and by a resource fenced with epochs, which saw the new leader's.
    let fenced = |resource: &mut Connection, epoch: i64| -> i64 {
        redis::cmd("EVAL")
            .arg("local seen = tonumber(redis.call('get', KEYS[1]) or '0'); if tonumber(ARGV[1]) < seen then return 0 end; redis.call('set', KEYS[1], ARGV[1]); return 1")
            .arg(1)
            .arg("resource:epoch")
            .arg(epoch)
            .query(resource)
            .unwrap()
    };
    assert_eq!(fenced(&mut b, new), 1);
    assert_eq!(fenced(&mut b, old), 0);
    assert_eq!(leader(&mut b, "svc").map(|l| l.1), Some(new));
}

#[test]
fn epochs_keep_rising_across_a_failover_and_replicas_see_the_value() {
    let mut master = Server::start();
    let replica = Server::replica_of(&master);
    let mut con = master.connect();
    let e1 = campaign(&mut con, "svc", "node-a", &["VALUE", "a"]).unwrap();
    assert_eq!(wait_replicas(&mut con, 1, 5_000), 1);
    let mut rcon = replica.connect();
    assert_eq!(
        leader(&mut rcon, "svc"),
        Some(("node-a".into(), e1, Some("a".into())))
    );
    master.kill_hard();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut rcon)
        .unwrap();
    // The old leader's hold came over; once it ends, whoever leads next has a higher epoch.
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("svc")
        .query(&mut rcon)
        .unwrap();
    let e2 = campaign(&mut rcon, "svc", "node-b", &[]).unwrap();
    assert!(e2 > e1, "{e2} after {e1}");
}

#[test]
fn errors() {
    let server = Server::start();
    let mut con = server.connect();
    let long = "x".repeat(4_097);
    let e = error_of(
        &mut con,
        &[
            b"LOCK.CAMPAIGN",
            b"svc",
            b"a",
            b"1000",
            b"VALUE",
            long.as_bytes(),
        ],
    );
    assert_eq!(e, "ERR a proclaimed value is at most 4096 bytes");
    let e = error_of(&mut con, &[b"LOCK.PROCLAIM", b"svc", b"a", b"x", b"v"]);
    assert!(e.contains("not an integer"), "{e}");
    let e = error_of(
        &mut con,
        &[b"LOCK.CAMPAIGN", b"svc", b"a", b"1000", b"SHARED"],
    );
    assert_eq!(e, "ERR syntax error");
    assert!(!con.exists::<_, bool>("svc").unwrap());
}
