//! A replica on `repl-diskless-load swapdb` (its master on `repl-diskless-sync yes`) with the
//! module loaded: a full sync loads into databases of the replica's own while it keeps serving
//! the old ones (Redis's async load), then swaps them in with no flush or `SWAPDB` event. The
//! module declares that it follows this (Redis otherwise falls back to a disk load that flushes
//! first and answers `LOADING`), and what it keeps about the data — bindings, token windows,
//! waiters — follows the swap: after a promotion the replica holds what the master held, its
//! tokens rise above every token the master gave, and nothing is bound to its own connections.

use std::collections::BTreeMap;
use std::thread;
use std::time::{Duration, Instant};

use lock_core::slot::{counter_key, key_slot};
use lock_testkit::*;

const SOON: Duration = Duration::from_secs(10);
/// What Redis logs when a loaded module has not declared that it follows an async load.
const SKIPPING: &str = "Skipping diskless-load";
/// What a replica logs when it swaps the databases it loaded in place of the old ones.
const SWAPPING: &str = "Swapping active DB with loaded DB";

fn master() -> Server {
    Server::start_with(&[
        "--repl-diskless-sync",
        "yes",
        "--repl-diskless-sync-delay",
        "0",
    ])
}

/// A replica of `master` on `repl-diskless-load <load>`, once its first sync is done and the
/// master counts it in `WAIT` (`Server::wait_replicas_acknowledge`). It answers clients after
/// every KiB it loads (`loading-process-events-interval-bytes`), so that a test sees it serve
/// during a sync of little data. `extra`: more server arguments.
fn replica(master: &Server, load: &str, extra: &[&str]) -> Server {
    let port = master.port.to_string();
    let mut args = vec![
        "--repl-diskless-load",
        load,
        "--loading-process-events-interval-bytes",
        "1024",
        "--replicaof",
        "127.0.0.1",
        &port,
    ];
    args.extend_from_slice(extra);
    let replica = Server::start_with(&args);
    let mut con = replica.connect();
    assert!(
        eventually(SOON, || synced(&mut con)),
        "the replica did not sync; log:\n{}",
        replica.log()
    );
    master.wait_replicas_acknowledge(master.connected_replicas());
    replica
}

/// The replica's link is up and no sync or load is in progress.
fn synced(con: &mut Connection) -> bool {
    info_field(con, "replication", "master_link_status").as_deref() == Some("up")
        && info_field(con, "replication", "master_sync_in_progress").as_deref() == Some("0")
        && info_field(con, "persistence", "loading").as_deref() == Some("0")
        && info_field(con, "persistence", "async_loading").as_deref() == Some("0")
}

fn full_syncs(master: &mut Connection) -> i64 {
    info_field(master, "stats", "sync_full")
        .and_then(|v| v.parse().ok())
        .expect("sync_full")
}

/// Drops the master's replica link and overflows its backlog, in one transaction with
/// `writes`: the replica comes back with the master's replication id and an offset the backlog
/// no longer has, so it gets a full sync it may load asynchronously (the way Redis's own test
/// of async loading does it). `writes` are made while the link is down: the replica sees them
/// only through that sync.
fn force_full_sync(master: &mut Connection, writes: &[redis::Cmd]) {
    let mut pipe = redis::pipe();
    pipe.atomic();
    pipe.cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .ignore();
    pipe.cmd("CONFIG")
        .arg("SET")
        .arg("repl-backlog-size")
        .arg(16_384)
        .ignore();
    for i in 0..10 {
        pipe.cmd("SET")
            .arg(format!("overflow:{i}"))
            .arg(vec![b'o'; 16_384])
            .ignore();
    }
    for write in writes {
        pipe.add_command(write.clone());
    }
    let _: Vec<Value> = pipe.query(master).expect("MULTI ... EXEC");
}

/// Every key of databases 0 and 1 with its type, content and absolute expiry.
fn dump(con: &mut Connection) -> BTreeMap<(u8, Vec<u8>), (String, Value, i64)> {
    let mut all = BTreeMap::new();
    for db in [0u8, 1] {
        let _: () = redis::cmd("SELECT").arg(db).query(con).unwrap();
        let keys: Vec<Vec<u8>> = con.keys("*").unwrap();
        for key in keys {
            let kind: String = redis::cmd("TYPE").arg(&key).query(con).unwrap();
            let content: Value = match kind.as_str() {
                "hash" => {
                    let mut fields: Vec<(Vec<u8>, Vec<u8>)> = con.hgetall(&key).unwrap();
                    fields.sort();
                    Value::Bulk(
                        fields
                            .into_iter()
                            .flat_map(|(f, v)| [Value::Data(f), Value::Data(v)])
                            .collect(),
                    )
                }
                _ => con.get(&key).unwrap(),
            };
            let at: i64 = redis::cmd("PEXPIRETIME").arg(&key).query(con).unwrap();
            all.insert((db, key), (kind, content, at));
        }
    }
    let _: () = redis::cmd("SELECT").arg(0).query(con).unwrap();
    all
}

fn command(name: &str, args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd(name);
    for arg in args {
        cmd.arg(*arg);
    }
    cmd
}

fn leader(con: &mut Connection, key: &str) -> Value {
    redis::cmd("LOCK.LEADER").arg(key).query(con).unwrap()
}

/// The tokens of the holds on `key` (`LOCK.INFO`'s holders, and its top-level token), sorted.
fn tokens_of(con: &mut Connection, key: &str) -> Vec<i64> {
    let Some(info) = lock_info(con, key) else {
        return Vec::new();
    };
    let mut tokens = Vec::new();
    if let Some(Value::Bulk(holders)) = info.get("holders") {
        for holder in holders {
            if let Value::Bulk(fields) = holder {
                for pair in fields.chunks(2) {
                    if redis::from_redis_value::<String>(&pair[0]).ok().as_deref() == Some("token")
                    {
                        tokens.extend(redis::from_redis_value::<i64>(&pair[1]).ok());
                    }
                }
            }
        }
    }
    tokens.extend(redis::from_redis_value::<i64>(info.get("token").unwrap_or(&Value::Nil)).ok());
    tokens.sort();
    tokens.dedup();
    tokens
}

/// A full sync while the master holds locks of every kind and has waiters: the replica loads
/// it asynchronously — never "Skipping diskless-load", serving the old data, not `LOADING`,
/// while it loads — ends equal to the master, and once promoted gives tokens above every token
/// the master gave, shows the master's leader and value, grants its own waiters and has
/// nothing bound.
#[test]
fn a_full_sync_loads_asynchronously_and_the_promoted_replica_carries_on() {
    let master = master();
    let mut m = master.connect();
    // Every token the master gives, with its key.
    let mut given: Vec<(String, i64)> = Vec::new();
    let mut bound = master.connect();
    for (key, owner, options) in [
        ("x", "a", &[][..]),
        ("rw", "r1", &["SHARED"][..]),
        ("rw", "r2", &["SHARED"][..]),
        ("sem", "s1", &["LIMIT", "2"][..]),
        ("sem", "s2", &["LIMIT", "2"][..]),
    ] {
        let token = acquire_with(&mut m, key, owner, 60_000, options)
            .unwrap()
            .unwrap();
        given.push((key.to_string(), token));
    }
    let token = acquire_with(&mut bound, "eph", "e", 60_000, &["EPHEMERAL"])
        .unwrap()
        .unwrap();
    given.push(("eph".into(), token));
    let epoch: i64 = command(
        "LOCK.CAMPAIGN",
        &["svc", "node-a", "60000", "VALUE", "10.0.0.1"],
    )
    .query(&mut m)
    .unwrap();
    given.push(("svc".into(), epoch));
    let _: () = redis::cmd("SELECT").arg(1).query(&mut m).unwrap();
    given.push(("x".into(), acquire(&mut m, "x", "db1", 60_000).unwrap()));
    let _: () = redis::cmd("SELECT").arg(0).query(&mut m).unwrap();
    // Waiters on the master, of every kind, queued through the sync.
    let waiters = [
        Waiter::request(&master, "x", "w-x", 60_000, 30_000).start(),
        Waiter::request(&master, "rw", "w-rw", 60_000, 30_000).start(),
        Waiter::request(&master, "sem", "w-sem", 60_000, 30_000)
            .options(&["LIMIT", "2"])
            .start(),
        Waiter::request(&master, "svc", "node-b", 60_000, 30_000)
            .options(&["ONCE"])
            .start(),
    ];
    // Enough data that the master's RDB takes about two seconds (10 ms a key), uncompressed
    // so that it reaches the replica as it is made.
    let mut fill = redis::pipe();
    for i in 0..200 {
        fill.cmd("SET")
            .arg(format!("fill:{i}"))
            .arg(vec![b'f'; 20_000])
            .ignore();
    }
    fill.cmd("CONFIG")
        .arg("SET")
        .arg("rdbcompression")
        .arg("no")
        .ignore();
    let _: () = fill.query(&mut m).unwrap();

    let replica = replica(&master, "swapdb", &[]);
    let mut r = replica.connect();
    assert_eq!(
        lock_info(&mut r, "x").map(|i| info_int(&i, "token")),
        Some(given[0].1)
    );

    // A second full sync, with the master's replication id: loaded asynchronously. Meanwhile
    // the master moves on: `x` changes hands, which the replica learns only from the sync.
    let _: () = command("CONFIG", &["SET", "rdb-key-save-delay", "10000"])
        .query(&mut m)
        .unwrap();
    let syncs = full_syncs(&mut m);
    force_full_sync(&mut m, &[command("LOCK.FORCERELEASE", &["x"])]);
    let x_after: i64 = waiters[0].token(SOON).expect("x went to its waiter");
    given.push(("x".into(), x_after));
    // While it loads, the replica answers from the old data: `x` still held by `a`.
    let loading =
        |r: &mut Connection| info_field(r, "persistence", "async_loading").as_deref() == Some("1");
    let mut served_while_loading = 0;
    let mut refused = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let before = loading(&mut r);
        let reply = redis::cmd("LOCK.INFO").arg("x").query::<Value>(&mut r);
        let during = before && loading(&mut r);
        match reply {
            Ok(Value::Bulk(info)) if during => {
                served_while_loading += 1;
                let token = info
                    .chunks(2)
                    .find(|pair| pair[0] == Value::Data(b"token".to_vec()))
                    .map(|pair| pair[1].clone());
                assert_eq!(token, Some(Value::Int(given[0].1)), "not the old data");
            }
            Ok(_) => {}
            Err(e) => refused.push(e.to_string()),
        }
        if full_syncs(&mut m) > syncs && synced(&mut r) {
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
    eprintln!("LOCK.INFO answered {served_while_loading} times during the async load");
    let log = replica.log();
    assert!(
        !log.contains(SKIPPING),
        "the replica refused async loading:\n{log}"
    );
    assert!(
        served_while_loading > 0,
        "the replica never loaded asynchronously:\n{log}"
    );
    assert!(
        log.contains(SWAPPING),
        "no swap in the replica's log:\n{log}"
    );
    assert!(refused.is_empty(), "refused during the sync: {refused:?}");
    assert!(
        synced(&mut r),
        "the replica did not finish its sync:\n{log}"
    );
    let _: () = command("CONFIG", &["SET", "rdb-key-save-delay", "0"])
        .query(&mut m)
        .unwrap();

    // Equal to the master, the new holder of `x` included.
    assert_eq!(wait_replicas(&mut m, 1, 5_000), 1);
    let on_master = dump(&mut m);
    assert!(
        eventually(SOON, || dump(&mut r) == on_master),
        "the replica differs"
    );
    assert_eq!(
        lock_info(&mut r, "x").map(|i| info_int(&i, "token")),
        Some(x_after)
    );
    assert_eq!(leader(&mut r, "svc"), leader(&mut m, "svc"));
    for key in ["rw", "sem", "svc"] {
        assert_eq!(
            key_waiters(&mut m, key),
            1,
            "{key}'s waiter left the master"
        );
    }

    // Promoted: nothing bound here, the leader and its value are the master's, the leader
    // goes on proclaiming, tokens rise above the master's in every slot, and waiting works.
    let _: () = command("REPLICAOF", &["NO", "ONE"]).query(&mut r).unwrap();
    assert_eq!(bound_to(&mut r, "eph"), None);
    assert_eq!(lock_stat(&mut r, "ephemeral_holds"), 0);
    let expected = Value::Bulk(vec![
        Value::Data(b"node-a".to_vec()),
        Value::Int(epoch),
        Value::Data(b"10.0.0.1".to_vec()),
    ]);
    assert_eq!(leader(&mut r, "svc"), expected);
    let proclaimed: i64 = command(
        "LOCK.PROCLAIM",
        &["svc", "node-a", &epoch.to_string(), "10.0.0.2"],
    )
    .query(&mut r)
    .unwrap();
    assert_eq!(proclaimed, 1);
    for key in ["x", "rw", "sem", "eph", "svc"] {
        let highest = given
            .iter()
            .filter(|(k, _)| key_slot(k.as_bytes()) == key_slot(key.as_bytes()))
            .map(|(_, t)| *t)
            .chain(tokens_of(&mut m, key))
            .max()
            .unwrap();
        let fresh = acquire(&mut r, &format!("{{{key}}}fresh"), "f", 60_000).unwrap();
        assert!(fresh > highest, "{key}: {fresh} <= {highest}");
    }
    let waiter = Waiter::request(&replica, "x", "w-r", 60_000, 10_000).start();
    let _: i64 = command("LOCK.RELEASE", &["x", "w-x"])
        .query(&mut r)
        .unwrap();
    let granted = waiter
        .token(SOON)
        .expect("the promoted replica grants its waiter");
    assert!(granted > x_after, "{granted} <= {x_after}");
    drop(waiters);
    drop(bound);
}

/// The replica's own state, made while it was a writable replica, is about data the load
/// replaces. Its client took an `EPHEMERAL` hold with token T on `{t}e` (reserving a token
/// window ending at B); the master, with the link down, gave T on `{t}e` to another owner and
/// T+1 on `{t}f` (its counter holding the same B: both read the same counter). After the
/// async load, the replica's `{t}e` is the master's: the binding must not end the master's
/// holder when the replica's client leaves, and the next token must not repeat T+1 — the
/// counter reads B, but that window is not the replica's any more.
#[test]
fn bindings_and_token_windows_of_data_an_async_load_replaced_are_forgotten() {
    replaced_data_is_forgotten("swapdb");
}

/// The same through a load from disk, which flushes the old data first (`FLUSHALL`'s event).
#[test]
fn bindings_and_token_windows_of_data_a_disk_load_replaced_are_forgotten() {
    replaced_data_is_forgotten("disabled");
}

fn replaced_data_is_forgotten(load: &str) {
    let master = master();
    let mut m = master.connect();
    let replica = replica(&master, load, &["--replica-read-only", "no"]);
    let mut r = replica.connect();
    // Both servers' tokens come from this counter, far above the clock.
    let counter = counter_key(key_slot(b"{t}"));
    let now_ms = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()) as i64;
    let start = now_ms * 1_000 + 1_000_000_000_000;
    let _: () = m.set(&counter, start).unwrap();
    assert_eq!(wait_replicas(&mut m, 1, 5_000), 1);
    let mut client = replica.connect();
    let t = acquire_with(
        &mut client,
        "{t}e",
        "replica-client",
        60_000,
        &["EPHEMERAL"],
    )
    .unwrap()
    .unwrap();
    assert_eq!(t, start + 1);
    assert_eq!(lock_stat(&mut r, "ephemeral_holds"), 1);

    let syncs = full_syncs(&mut m);
    force_full_sync(
        &mut m,
        &[
            command("LOCK.ACQUIRE", &["{t}e", "master-owner", "60000"]),
            command("LOCK.ACQUIRE", &["{t}f", "master-owner", "60000"]),
        ],
    );
    assert!(eventually(SOON, || full_syncs(&mut m) > syncs && synced(&mut r)));
    let log = replica.log();
    assert!(
        !log.contains(SKIPPING),
        "the replica refused async loading:\n{log}"
    );
    if load == "swapdb" {
        assert_eq!(log.matches(SWAPPING).count(), 2, "{log}");
    }
    let master_tokens = [tokens_of(&mut m, "{t}e"), tokens_of(&mut m, "{t}f")].concat();
    assert_eq!(master_tokens, vec![t, t + 1]);
    assert_eq!(tokens_of(&mut r, "{t}e"), vec![t]);
    assert_eq!(
        lock_stat(&mut r, "ephemeral_holds"),
        0,
        "a binding outlived its data"
    );

    let _: () = command("REPLICAOF", &["NO", "ONE"]).query(&mut r).unwrap();
    let client_id = client_id(&mut client);
    drop(client);
    assert!(eventually(SOON, || {
        let list: String = command("CLIENT", &["LIST"]).query(&mut r).unwrap();
        !list.contains(&format!("id={client_id} "))
    }));
    // A closed connection's holds end from a 0 ms timer: a round trip or two later.
    thread::sleep(Duration::from_millis(300));
    let info = lock_info(&mut r, "{t}e").expect("{t}e was released by a stale binding");
    let owner: String = redis::from_redis_value(&info["owner"]).unwrap();
    assert_eq!(owner, "master-owner");
    assert_eq!(lock_stat(&mut r, "disconnected"), 0);
    let next = acquire(&mut r, "{t}g", "promoted", 60_000).unwrap();
    assert!(
        next > t + 1,
        "token {next} repeats or falls below the master's {}",
        t + 1
    );
}

/// An async load that fails (the master link drops mid-load) leaves the old databases, and the
/// module's memory of them, as they were: the writable replica's `EPHEMERAL` hold is still
/// there and still bound to its connection.
#[test]
fn an_aborted_async_load_leaves_everything_as_it_was() {
    let master = master();
    let mut m = master.connect();
    let mut fill = redis::pipe();
    for i in 0..200 {
        fill.cmd("SET")
            .arg(format!("fill:{i}"))
            .arg(vec![b'f'; 20_000])
            .ignore();
    }
    let _: () = fill.query(&mut m).unwrap();
    let replica = replica(&master, "swapdb", &["--replica-read-only", "no"]);
    let mut r = replica.connect();
    let mut client = replica.connect();
    let token = acquire_with(
        &mut client,
        "mine",
        "replica-client",
        60_000,
        &["EPHEMERAL"],
    )
    .unwrap()
    .unwrap();
    let id = client_id(&mut client);

    let _: () = command("CONFIG", &["SET", "rdbcompression", "no"])
        .query(&mut m)
        .unwrap();
    let _: () = command("CONFIG", &["SET", "rdb-key-save-delay", "10000"])
        .query(&mut m)
        .unwrap();
    force_full_sync(&mut m, &[]);
    let loading =
        |r: &mut Connection| info_field(r, "persistence", "async_loading").as_deref() == Some("1");
    assert!(eventually(SOON, || loading(&mut r)), "{}", replica.log());
    let _: i64 = command("CLIENT", &["KILL", "TYPE", "replica"])
        .query(&mut m)
        .unwrap();
    assert!(eventually(SOON, || !loading(&mut r)));
    // The replica reconnects and syncs again (slowly): look before that one swaps.
    assert_eq!(bound_to(&mut r, "mine"), Some(id));
    assert_eq!(tokens_of(&mut r, "mine"), vec![token]);
    assert_eq!(lock_stat(&mut r, "ephemeral_holds"), 1);
    let log = replica.log();
    assert_eq!(log.matches(SWAPPING).count(), 1, "{log}");
    let _: () = command("CONFIG", &["SET", "rdb-key-save-delay", "0"])
        .query(&mut m)
        .unwrap();
}
