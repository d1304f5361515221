//! LOCK.ACQUIRE / RELEASE / RENEW / INFO / FORCERELEASE against a real server: replies, storage
//! layout, fencing tokens, the unlock channel, and bad input.

use std::time::Duration;

use lock_testkit::*;

#[test]
fn acquire_stores_redissons_layout_with_a_lease() {
    let server = Server::start();
    let mut con = server.connect();
    let token = acquire(&mut con, "orders:1", "svc-a:thread-7", 10_000).unwrap();
    assert!(token > 0);
    let count: String = con.hget("orders:1", "svc-a:thread-7").unwrap();
    assert_eq!(count, "1");
    let mode: String = con.hget("orders:1", "mode").unwrap();
    assert_eq!(
        mode,
        format!("exclusive:{token}"),
        "the token, in Redisson's mode field"
    );
    let len: i64 = con.hlen("orders:1").unwrap();
    assert_eq!(len, 2);
    let pttl: i64 = con.pttl("orders:1").unwrap();
    assert!(pttl > 9_000 && pttl <= 10_000, "pttl {pttl}");
}

#[test]
fn same_owner_reenters_and_keeps_its_token_others_get_nil() {
    let server = Server::start();
    let mut con = server.connect();
    let t1 = acquire(&mut con, "k", "a", 5_000).unwrap();
    let t2 = acquire(&mut con, "k", "a", 20_000).unwrap();
    assert_eq!(
        t1, t2,
        "a re-entrant acquire returns the current hold's token"
    );
    let count: i64 = con.hget("k", "a").unwrap();
    assert_eq!(count, 2);
    let pttl: i64 = con.pttl("k").unwrap();
    assert!(pttl > 15_000, "re-entry resets the lease, pttl {pttl}");
    assert_eq!(acquire(&mut con, "k", "b", 5_000), None);
}

#[test]
fn release_counts_down_then_frees() {
    let server = Server::start();
    let mut con = server.connect();
    acquire(&mut con, "k", "a", 5_000).unwrap();
    acquire(&mut con, "k", "a", 5_000).unwrap();
    assert_eq!(release(&mut con, "k", "b"), None, "not the owner");
    assert_eq!(release(&mut con, "k", "a"), Some(1));
    assert_eq!(release(&mut con, "k", "a"), Some(0));
    let exists: bool = con.exists("k").unwrap();
    assert!(!exists);
    assert_eq!(release(&mut con, "k", "a"), None, "released already");
}

#[test]
fn renew_resets_only_the_owners_lease() {
    let server = Server::start();
    let mut con = server.connect();
    acquire(&mut con, "k", "a", 1_000).unwrap();
    let renewed: i64 = redis::cmd("LOCK.RENEW")
        .arg("k")
        .arg("a")
        .arg(60_000)
        .query(&mut con)
        .unwrap();
    assert_eq!(renewed, 1);
    let pttl: i64 = con.pttl("k").unwrap();
    assert!(pttl > 59_000, "pttl {pttl}");
    let other: i64 = redis::cmd("LOCK.RENEW")
        .arg("k")
        .arg("b")
        .arg(60_000)
        .query(&mut con)
        .unwrap();
    assert_eq!(other, 0);
    let free: i64 = redis::cmd("LOCK.RENEW")
        .arg("nope")
        .arg("a")
        .arg(60_000)
        .query(&mut con)
        .unwrap();
    assert_eq!(free, 0);
}

#[test]
fn info_reports_owner_count_ttl_token_and_waiters() {
    let server = Server::start();
    let mut con = server.connect();
    assert!(lock_info(&mut con, "k").is_none());
    let token = acquire(&mut con, "k", "a", 8_000).unwrap();
    acquire(&mut con, "k", "a", 8_000).unwrap();
    let info = lock_info(&mut con, "k").unwrap();
    let owner: String = redis::from_redis_value(&info["owner"]).unwrap();
    assert_eq!(owner, "a");
    assert_eq!(info_int(&info, "count"), 2);
    assert_eq!(info_int(&info, "token"), token);
    assert_eq!(info_int(&info, "waiters"), 0);
    let ttl = info_int(&info, "ttl");
    assert!(ttl > 7_000 && ttl <= 8_000, "ttl {ttl}");
}

#[test]
fn info_is_a_map_in_resp3() {
    let server = Server::start();
    let mut con = server.connect();
    acquire(&mut con, "k", "a", 8_000).unwrap();
    // The redis crate 0.23 speaks RESP2 only; redis-cli shows the RESP3 map.
    let out = std::process::Command::new(cli_bin())
        .args([
            "-p",
            &server.port.to_string(),
            "-3",
            "--no-raw",
            "LOCK.INFO",
            "k",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("1# \"owner\" => \"a\""), "{text}");
    assert!(text.contains("\"waiters\" => (integer) 0"), "{text}");
}

#[test]
fn force_release_removes_any_hold() {
    let server = Server::start();
    let mut con = server.connect();
    acquire(&mut con, "k", "a", 5_000).unwrap();
    acquire(&mut con, "k", "a", 5_000).unwrap();
    let removed: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("k")
        .query(&mut con)
        .unwrap();
    assert_eq!(removed, 1);
    let again: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("k")
        .query(&mut con)
        .unwrap();
    assert_eq!(again, 0);
    assert!(acquire(&mut con, "k", "b", 5_000).is_some());
}

#[test]
fn tokens_strictly_increase_across_release_expiry_and_force_release() {
    let server = Server::start();
    let mut con = server.connect();
    let mut last = 0;
    for round in 0..3 {
        let t = acquire(&mut con, "k", "a", 5_000).unwrap();
        assert!(t > last, "round {round}: {t} after {last}");
        last = t;
        release(&mut con, "k", "a").unwrap();
    }
    let t = acquire(&mut con, "k", "a", 50).unwrap();
    assert!(t > last);
    last = t;
    std::thread::sleep(Duration::from_millis(120));
    let t = acquire(&mut con, "k", "b", 5_000).unwrap();
    assert!(t > last, "after lease expiry: {t} after {last}");
    last = t;
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("k")
        .query(&mut con)
        .unwrap();
    let t = acquire(&mut con, "k", "c", 5_000).unwrap();
    assert!(t > last, "after force release: {t} after {last}");
}

#[test]
fn the_token_counter_lives_in_the_lock_keys_slot() {
    let server = Server::start();
    let mut con = server.connect();
    acquire(&mut con, "{user:42}:lock", "a", 5_000).unwrap();
    let keys: Vec<String> = con.keys("__lock_fence__*").unwrap();
    assert_eq!(keys.len(), 1);
    // CLUSTER KEYSLOT needs cluster mode; lock_core's slot function is checked against it in
    // its unit tests and in tests/cluster.rs.
    let lock_slot = lock_core::slot::key_slot(b"{user:42}:lock");
    assert_eq!(lock_core::slot::key_slot(keys[0].as_bytes()), lock_slot);
}

#[test]
fn unlock_publishes_on_redissons_channel() {
    let server = Server::start();
    let mut sub_con = server.connect();
    let mut con = server.connect();
    let mut pubsub = sub_con.as_pubsub();
    pubsub
        .subscribe("redisson_lock__channel:{orders:9}")
        .unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    acquire(&mut con, "orders:9", "a", 5_000).unwrap();
    acquire(&mut con, "orders:9", "a", 5_000).unwrap();
    release(&mut con, "orders:9", "a").unwrap(); // count-down: no message
    release(&mut con, "orders:9", "a").unwrap();
    let msg = pubsub.get_message().unwrap();
    assert_eq!(msg.get_channel_name(), "redisson_lock__channel:{orders:9}");
    let payload: String = msg.get_payload().unwrap();
    assert_eq!(payload, "0");
    // Only the full release published.
    pubsub
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    assert!(pubsub.get_message().is_err());
}

#[test]
fn the_unlock_channel_and_message_are_configurable() {
    let server = Server::start_with_module_args(&[
        "unlock-channel-prefix",
        "locks",
        "unlock-message",
        "free",
    ]);
    let mut sub_con = server.connect();
    let mut con = server.connect();
    let prefix: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("lock.unlock-channel-prefix")
        .query(&mut con)
        .unwrap();
    assert_eq!(prefix, ["lock.unlock-channel-prefix", "locks"]);
    let mut pubsub = sub_con.as_pubsub();
    pubsub.subscribe("locks:{k}").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    acquire(&mut con, "k", "a", 5_000).unwrap();
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("k")
        .query(&mut con)
        .unwrap();
    let payload: String = pubsub.get_message().unwrap().get_payload().unwrap();
    assert_eq!(payload, "free");
    // CONFIG SET at runtime.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.unlock-message")
        .arg("gone")
        .query(&mut con)
        .unwrap();
    acquire(&mut con, "k", "a", 5_000).unwrap();
    release(&mut con, "k", "a").unwrap();
    let payload: String = pubsub.get_message().unwrap().get_payload().unwrap();
    assert_eq!(payload, "gone");
}

#[test]
fn binary_keys_and_owners_and_megabyte_owners_work() {
    let server = Server::start();
    let mut con = server.connect();
    let key: &[u8] = b"k\0with\xffbytes";
    let owner: &[u8] = b"\0own\0er\n";
    let token = raw(&mut con, &[b"LOCK.ACQUIRE", key, owner, b"5000"]).unwrap();
    assert!(matches!(token, Value::Int(t) if t > 0));
    assert_eq!(
        raw(&mut con, &[b"LOCK.ACQUIRE", key, b"\0own\0er", b"5000"]).unwrap(),
        Value::Nil
    );
    assert_eq!(
        raw(&mut con, &[b"LOCK.RELEASE", key, owner]).unwrap(),
        Value::Int(0)
    );
    let big = vec![b'x'; 1 << 20];
    let token = raw(&mut con, &[b"LOCK.ACQUIRE", b"big", &big, b"5000"]).unwrap();
    assert!(matches!(token, Value::Int(_)));
    assert_eq!(
        raw(&mut con, &[b"LOCK.RELEASE", b"big", &big]).unwrap(),
        Value::Int(0)
    );
}

#[test]
fn bad_input_gets_redis_style_errors_and_changes_nothing() {
    let server = Server::start();
    let mut con = server.connect();
    acquire(&mut con, "held", "a", 60_000).unwrap();
    let _: () = con.set("str", "x").unwrap();
    let _: () = con
        .hset_multiple("notalock", &[("a", "1"), ("b", "1")])
        .unwrap();
    let _: () = con.hset("badcount", "a", "x").unwrap();
    let max = "ERR lease must be between 1 and 2592000000 milliseconds";
    let cases: Vec<(Vec<&[u8]>, &str)> = vec![
        (
            vec![b"LOCK.ACQUIRE", b"held"],
            "ERR wrong number of arguments for 'lock.acquire' command",
        ),
        (
            vec![b"LOCK.RELEASE", b"held"],
            "ERR wrong number of arguments for 'lock.release' command",
        ),
        (
            vec![b"LOCK.RELEASE", b"held", b"a", b"x"],
            "ERR syntax error",
        ),
        (
            vec![b"LOCK.RELEASE", b"held", b"a", b"TOKEN", b"1", b"x"],
            "ERR wrong number of arguments for 'lock.release' command",
        ),
        (
            vec![b"LOCK.RENEW", b"held", b"a"],
            "ERR wrong number of arguments for 'lock.renew' command",
        ),
        (
            vec![b"LOCK.INFO"],
            "ERR wrong number of arguments for 'lock.info' command",
        ),
        (
            vec![b"LOCK.FORCERELEASE", b"held", b"x"],
            "ERR wrong number of arguments for 'lock.forcerelease' command",
        ),
        (
            vec![b"LOCK.ACQUIRE", b"held", b"b", b"ten"],
            "ERR value is not an integer or out of range",
        ),
        (
            vec![b"LOCK.ACQUIRE", b"held", b"b", b"1.5"],
            "ERR value is not an integer or out of range",
        ),
        (vec![b"LOCK.ACQUIRE", b"held", b"b", b"0"], max),
        (vec![b"LOCK.ACQUIRE", b"held", b"b", b"-5"], max),
        (vec![b"LOCK.ACQUIRE", b"held", b"b", b"2592000001"], max),
        (
            vec![b"LOCK.ACQUIRE", b"held", b"b", b"99999999999999999999"],
            "ERR value is not an integer or out of range",
        ),
        (
            vec![b"LOCK.ACQUIRE", b"held", b"", b"10"],
            "ERR owner must not be empty",
        ),
        (
            vec![b"LOCK.ACQUIRE", b"held", b"__fence__", b"10"],
            "ERR owners 'mode', '__fence__' and '__mode__' are reserved for the lock's own fields",
        ),
        (
            vec![b"LOCK.ACQUIRE", b"held", b"mode", b"10"],
            "ERR owners 'mode', '__fence__' and '__mode__' are reserved for the lock's own fields",
        ),
        (
            vec![b"LOCK.ACQUIRE", b"held", b"b", b"10", b"NOWAIT"],
            "ERR syntax error",
        ),
        (
            vec![b"LOCK.ACQUIRE", b"held", b"b", b"10", b"WAIT"],
            "ERR syntax error",
        ),
        (
            vec![
                b"LOCK.ACQUIRE",
                b"held",
                b"b",
                b"10",
                b"WAIT",
                b"1",
                b"WAIT",
                b"1",
            ],
            "ERR syntax error",
        ),
        (
            vec![b"LOCK.ACQUIRE", b"held", b"b", b"10", b"WAIT", b"-1"],
            "ERR timeout is negative or out of range",
        ),
        (
            vec![b"LOCK.ACQUIRE", b"held", b"b", b"10", b"WAIT", b"soon"],
            "ERR value is not an integer or out of range",
        ),
        (
            vec![b"LOCK.ACQUIRE", b"str", b"b", b"10"],
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
        (
            vec![b"LOCK.RELEASE", b"str", b"b"],
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
        (
            vec![b"LOCK.INFO", b"str"],
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
        (
            vec![b"LOCK.FORCERELEASE", b"str"],
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
        (vec![b"LOCK.ACQUIRE", b"notalock", b"a", b"10"], NOT_A_LOCK),
        (vec![b"LOCK.RELEASE", b"notalock", b"a"], NOT_A_LOCK),
        (vec![b"LOCK.FORCERELEASE", b"notalock"], NOT_A_LOCK),
        (vec![b"LOCK.INFO", b"notalock"], NOT_A_LOCK),
        (vec![b"LOCK.RELEASE", b"badcount", b"a"], NOT_A_LOCK),
    ];
    for (args, want) in &cases {
        assert_eq!(
            &error_of(&mut con, args),
            want,
            "{:?}",
            args.iter()
                .map(|a| String::from_utf8_lossy(a))
                .collect::<Vec<_>>()
        );
    }
    // Nothing changed.
    let info = lock_info(&mut con, "held").unwrap();
    assert_eq!(info_int(&info, "count"), 1);
    let s: String = con.get("str").unwrap();
    assert_eq!(s, "x");
    let n: i64 = con.hlen("notalock").unwrap();
    assert_eq!(n, 2);
    let errors = info_field(&mut con, "errorstats", "errorstat_ERR").unwrap_or_default();
    assert!(
        errors.starts_with("count="),
        "errorstats groups by the ERR code: {errors}"
    );
}

#[test]
fn the_max_lease_is_configurable() {
    let server = Server::start_with_module_args(&["max-lease-ms", "1000"]);
    let mut con = server.connect();
    assert_eq!(
        error_of(&mut con, &[b"LOCK.ACQUIRE", b"k", b"a", b"1001"]),
        "ERR lease must be between 1 and 1000 milliseconds"
    );
    assert!(acquire(&mut con, "k", "a", 1000).is_some());
    let bad = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.max-lease-ms")
        .arg("0")
        .query::<()>(&mut con);
    assert!(bad.is_err(), "0 is below the minimum");
}

#[test]
fn tokens_keep_rising_after_flushall_or_a_deleted_counter() {
    let server = Server::start();
    let mut con = server.connect();
    let mut last = 0;
    for _ in 0..50 {
        last = acquire(&mut con, "k", "a", 5_000).unwrap();
        release(&mut con, "k", "a").unwrap();
    }
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    std::thread::sleep(Duration::from_millis(2));
    let after_flush = acquire(&mut con, "k", "a", 5_000).unwrap();
    assert!(after_flush > last, "{after_flush} after {last}");
    release(&mut con, "k", "a").unwrap();
    let counters: Vec<String> = con.keys("__lock_fence__*").unwrap();
    let _: i64 = con.del(&counters).unwrap();
    std::thread::sleep(Duration::from_millis(2));
    let after_delete = acquire(&mut con, "k", "a", 5_000).unwrap();
    assert!(
        after_delete > after_flush,
        "{after_delete} after {after_flush}"
    );
    assert!(after_delete < 1 << 53);
}

#[test]
fn the_token_counter_holds_a_reserved_bound_written_once_per_window() {
    let server = Server::start();
    let mut con = server.connect();
    let first = acquire(&mut con, "k", "a", 5_000).unwrap();
    release(&mut con, "k", "a").unwrap();
    let counter = counter_names(&mut con).pop().expect("a counter");
    let bound: i64 = con.get(&counter).unwrap();
    assert!(
        bound > first,
        "the stored bound is above the tokens handed out"
    );
    let mut last = first;
    // Twenty grants take some 20 ms, well inside the window (a second of clock).
    for _ in 0..20 {
        let token = acquire(&mut con, "k", "a", 5_000).unwrap();
        release(&mut con, "k", "a").unwrap();
        assert!(
            token > last && token <= bound,
            "{token} after {last}, bound {bound}"
        );
        last = token;
    }
    let unchanged: i64 = con.get(&counter).unwrap();
    assert_eq!(unchanged, bound, "grants inside the window write nothing");
    // A bound moved by someone else is not trusted: the next token goes above it.
    let _: () = con.set(&counter, bound + 5).unwrap();
    let token = acquire(&mut con, "k", "b", 5_000).unwrap();
    assert!(token > bound + 5, "{token} after a bound of {}", bound + 5);
}

/// `LOCK.RELEASE key owner TOKEN t` releases only the owner's hold under that token: safe to
/// send again after a lost reply or a failover, since a later hold of the same owner (another
/// token) is never the one it counts down.
#[test]
fn a_release_with_a_token_takes_only_the_hold_under_that_token() {
    let server = Server::start();
    let mut con = server.connect();
    let first = acquire(&mut con, "k", "o", 60_000).unwrap();
    let release_token = |con: &mut Connection, token: i64| -> Option<i64> {
        redis::cmd("LOCK.RELEASE")
            .arg("k")
            .arg("o")
            .arg("TOKEN")
            .arg(token)
            .query(con)
            .unwrap()
    };
    assert_eq!(release_token(&mut con, first), Some(0));
    let second = acquire(&mut con, "k", "o", 60_000).unwrap();
    assert!(second > first);
    // The first hold's release sent again: nothing happens to the second.
    assert_eq!(release_token(&mut con, first), None);
    assert_eq!(
        lock_info(&mut con, "k").map(|i| info_int(&i, "token")),
        Some(second)
    );
    assert_eq!(release_token(&mut con, second), Some(0));
    assert!(lock_info(&mut con, "k").is_none());
    let bad = error_of(&mut con, &[b"LOCK.RELEASE", b"k", b"o", b"TOKEN", b"x"]);
    assert_eq!(bad, "ERR value is not an integer or out of range");
    let bad = error_of(&mut con, &[b"LOCK.RELEASE", b"k", b"o", b"TOKENS", b"1"]);
    assert_eq!(bad, "ERR syntax error");
}
