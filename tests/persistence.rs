//! Persistence and restarts: a server killed hard (SIGKILL) with locks held and waiters queued
//! comes back, from its AOF or its RDB snapshot, with every held lock as it was (owner, count,
//! token, absolute lease end); a lease that ended while it was down is free; tokens keep rising.
//! And MODULE UNLOAD with waiters queued is refused, without harm.

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use lock_testkit::*;

const SOON: Duration = Duration::from_secs(5);

/// Locks held for a long time, a lock whose lease ends while the server is down, and two
/// waiters queued. Returns the stored state of the long-held locks and every token so far.
struct Scene {
    held: Vec<(&'static str, StoredLock)>,
    tokens: HashMap<&'static str, i64>,
    short_lease_ends: Instant,
    waiters: Vec<Waiter>,
}

fn set_the_scene(server: &Server) -> Scene {
    let mut con = server.connect();
    let mut tokens = HashMap::new();
    tokens.insert("jobs:1", acquire(&mut con, "jobs:1", "a", 600_000).unwrap());
    acquire(&mut con, "jobs:1", "a", 600_000).unwrap(); // count 2
    tokens.insert(
        "{tenant}:jobs:2",
        acquire(&mut con, "{tenant}:jobs:2", "b", 300_000).unwrap(),
    );
    tokens.insert("short", acquire(&mut con, "short", "c", 1_000).unwrap());
    let short_lease_ends = Instant::now() + Duration::from_millis(1_000);
    // Some turnover, so that counters are not at their first value.
    for round in 0..3 {
        let owner = format!("turn-{round}");
        tokens.insert(
            "turnover",
            acquire(&mut con, "turnover", &owner, 600_000).unwrap(),
        );
        release(&mut con, "turnover", &owner).unwrap();
    }
    let waiters = vec![
        Waiter::start(server, "jobs:1", "w1", 60_000, 0),
        Waiter::start(server, "jobs:1", "w2", 60_000, 0),
    ];
    let held = ["jobs:1", "{tenant}:jobs:2"]
        .into_iter()
        .map(|k| (k, stored_lock(&mut con, k)))
        .collect();
    Scene {
        held,
        tokens,
        short_lease_ends,
        waiters,
    }
}

fn check_after_restart(server: &mut Server, scene: Scene) {
    // The waiters' connections died with the server: they got an error, not a lock.
    for waiter in &scene.waiters {
        match waiter.answer(SOON) {
            Some(Answer { reply: Err(_), .. }) => {}
            other => panic!("a waiter of the killed server got {other:?}"),
        }
    }
    let wait_for = scene
        .short_lease_ends
        .saturating_duration_since(Instant::now());
    thread::sleep(wait_for + Duration::from_millis(100));
    server.restart();
    let mut con = server.connect();
    for (key, before) in &scene.held {
        assert_eq!(&stored_lock(&mut con, key), before, "{key} after restart");
    }
    let info = lock_info(&mut con, "jobs:1").expect("held after restart");
    assert_eq!(info_int(&info, "count"), 2);
    assert_eq!(info_int(&info, "token"), scene.tokens["jobs:1"]);
    assert_eq!(info_int(&info, "waiters"), 0, "queues are not persisted");
    assert!(
        lock_info(&mut con, "short").is_none(),
        "a lease that ended while the server was down is free"
    );
    // Holders carry on; every new hold gets a larger token than before the crash.
    assert_eq!(release(&mut con, "jobs:1", "a"), Some(1));
    assert_eq!(release(&mut con, "jobs:1", "a"), Some(0));
    for key in ["jobs:1", "short", "turnover"] {
        let token = acquire(&mut con, key, "after", 10_000).unwrap();
        assert!(
            token > scene.tokens[key],
            "{key}: {token} after {}",
            scene.tokens[key]
        );
    }
    assert_eq!(acquire(&mut con, "{tenant}:jobs:2", "after", 10_000), None);
}

#[test]
fn the_aof_brings_back_every_held_lock_after_sigkill() {
    let mut server = Server::start_with(&["--appendonly", "yes"]);
    let scene = set_the_scene(&server);
    server.kill_hard();
    check_after_restart(&mut server, scene);
}

#[test]
fn an_rdb_snapshot_brings_back_every_held_lock_after_sigkill() {
    let mut server = Server::start();
    let mut scene = set_the_scene(&server);
    let mut con = server.connect();
    let _: () = redis::cmd("SAVE").query(&mut con).unwrap();
    // A grant after the snapshot is lost in the crash, token counter included; tokens handed
    // out after the restart must still be above it.
    let lost = acquire(&mut con, "turnover", "after-the-snapshot", 60_000).unwrap();
    assert!(lost > scene.tokens["turnover"]);
    scene.tokens.insert("turnover", lost);
    server.kill_hard();
    check_after_restart(&mut server, scene);
}

#[test]
fn the_aof_holds_only_plain_commands_with_absolute_times() {
    let server = Server::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut con = server.connect();
    acquire(&mut con, "k", "a", 60_000).unwrap();
    acquire(&mut con, "k", "a", 60_000).unwrap();
    let _: i64 = redis::cmd("LOCK.RENEW")
        .arg("k")
        .arg("a")
        .arg(90_000)
        .query(&mut con)
        .unwrap();
    release(&mut con, "k", "a").unwrap();
    release(&mut con, "k", "a").unwrap();
    let dir = server.dir.path().join("appendonlydir");
    let mut aof = String::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.to_string_lossy().ends_with(".incr.aof") {
            aof.push_str(&String::from_utf8_lossy(&std::fs::read(path).unwrap()));
        }
    }
    let upper = aof.to_uppercase();
    assert!(!upper.contains("LOCK."), "a LOCK.* command reached the AOF");
    assert!(
        !upper.contains("\r\nPEXPIRE\r\n"),
        "a relative expiry reached the AOF"
    );
    for effect in ["HSET", "PEXPIREAT", "SET", "DEL"] {
        assert!(
            upper.contains(&format!("\r\n{effect}\r\n")),
            "no {effect} in the AOF"
        );
    }
}

#[test]
fn module_unload_is_refused_while_clients_wait_and_works_once_they_are_gone() {
    let server = Server::start_with(&["--enable-module-command", "yes"]);
    let mut con = server.connect();
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    let waiter = Waiter::start(&server, "k", "w", 60_000, 0);
    let timed = Waiter::start(&server, "k", "t", 60_000, 30_000);
    let refused = error_of(&mut con, &[b"MODULE", b"UNLOAD", b"lock"]);
    assert!(
        refused.starts_with("ERR") && refused.contains("blocked clients"),
        "{refused}"
    );
    // Nothing was harmed: the queue still works.
    assert_eq!(release(&mut con, "k", "holder"), Some(0));
    waiter.token(SOON).expect("the head waiter gets the lock");
    let _: () = redis::cmd("CLIENT")
        .arg("UNBLOCK")
        .arg(timed.id)
        .query(&mut con)
        .unwrap();
    assert!(matches!(
        timed.answer(SOON),
        Some(Answer {
            reply: Ok(None),
            ..
        })
    ));
    assert!(eventually(SOON, || waiters(&mut con) == 0));

    // With nobody waiting, unloading works, and loading again gives a working module.
    let _: () = redis::cmd("MODULE")
        .arg("UNLOAD")
        .arg("lock")
        .query(&mut con)
        .unwrap();
    let gone = error_of(&mut con, &[b"LOCK.INFO", b"k"]);
    assert!(gone.contains("unknown command"), "{gone}");
    let _: () = redis::cmd("MODULE")
        .arg("LOAD")
        .arg(module_path().to_string_lossy().as_ref())
        .query(&mut con)
        .unwrap();
    let info = lock_info(&mut con, "k").expect("the lock outlived the module: it is plain data");
    let owner: String = redis::from_redis_value(&info["owner"]).unwrap();
    assert_eq!(owner, "w");
    assert_eq!(release(&mut con, "k", "w"), Some(0));
    acquire(&mut con, "k2", "x", 60_000).unwrap();
    let waiter = Waiter::start(&server, "k2", "y", 60_000, 0);
    assert_eq!(release(&mut con, "k2", "x"), Some(0));
    waiter.token(SOON).expect("waiting works after a reload");
}

/// Redis 7.0 and Valkey 8 keep a pointer to every client's last command, and a transaction
/// keeps its queued commands: after an unload those point at freed memory (`CLIENT LIST`
/// crashed Redis in the adversarial test; `EXEC` ran a freed LOCK.INFO). The module refuses
/// to be unloaded until no client can reach its commands that way.
#[test]
fn module_unload_waits_until_no_client_points_at_a_lock_command() {
    let server = Server::start_with(&["--enable-module-command", "yes"]);
    let mut admin = server.connect();
    let mut user = server.connect();
    let _: Value = redis::cmd("LOCK.INFO").arg("k").query(&mut user).unwrap();
    let refused = error_of(&mut admin, &[b"MODULE", b"UNLOAD", b"lock"]);
    assert!(refused.starts_with("ERR"), "{refused}");
    assert!(server.log().contains("last command was a LOCK.* command"));
    // Once that client has moved on, a transaction in progress holds the unload too.
    let _: () = redis::cmd("PING").query(&mut user).unwrap();
    let _: () = redis::cmd("MULTI").query(&mut user).unwrap();
    let refused = error_of(&mut admin, &[b"MODULE", b"UNLOAD", b"lock"]);
    assert!(refused.starts_with("ERR"), "{refused}");
    let _: () = redis::cmd("DISCARD").query(&mut user).unwrap();
    let _: () = redis::cmd("MODULE")
        .arg("UNLOAD")
        .arg("lock")
        .query(&mut admin)
        .unwrap();
    // The server is sound: every client can be listed.
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut admin).unwrap();
    assert!(!list.contains("cmd=lock."), "{list}");
}

/// A FLUSHALL takes the token counters: the module writes back those it had written, with the
/// highest token it handed out (so a later grant, here or on the node a slot moves to, stays
/// above); a `DEBUG RELOAD`, which empties the databases and loads them again, finds its own
/// counters and the module writes nothing into the emptied databases (the load would find the
/// key twice and stop the server).
#[test]
fn a_flush_writes_the_token_counters_back_and_a_reload_is_left_alone() {
    let server = Server::start_with(&["--enable-debug-command", "yes"]);
    let mut con = server.connect();
    let last = acquire(&mut con, "k", "o", 60_000).unwrap();
    release(&mut con, "k", "o").unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    let counters = || counter_names(&mut server.connect());
    assert!(
        eventually(Duration::from_secs(5), || counters().len() == 1),
        "the counter was not written back"
    );
    let name = counters().remove(0);
    let stored: i64 = redis::cmd("GET").arg(&name).query(&mut con).unwrap();
    assert!(stored >= last, "{stored} < {last}");
    assert!(acquire(&mut con, "k", "o", 60_000).unwrap() > last);
    release(&mut con, "k", "o").unwrap();
    let before: i64 = redis::cmd("GET").arg(&name).query(&mut con).unwrap();
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut con).unwrap();
    thread::sleep(Duration::from_millis(100));
    let after: i64 = redis::cmd("GET").arg(&name).query(&mut con).unwrap();
    assert_eq!(after, before);
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
}
