//! How the module fits Redis operations: INFO, keyspace events, ACL, CONFIG, COMMAND DOCS, logs.

use std::process::Command;
use std::time::Duration;

use lock_testkit::*;

#[test]
fn info_lock_counts_every_kind_of_event_exactly() {
    let server = Server::start();
    let mut con = server.connect();
    acquire(&mut con, "a", "o1", 60_000).unwrap(); // acquired
    acquire(&mut con, "a", "o1", 60_000).unwrap(); // reentered
    assert_eq!(acquire(&mut con, "a", "o2", 60_000), None); // contended, nil
    release(&mut con, "a", "o1"); // partial
    release(&mut con, "a", "o1"); // released
    release(&mut con, "a", "o1"); // not owner
    acquire(&mut con, "b", "o1", 60_000).unwrap(); // acquired
    let _: i64 = redis::cmd("LOCK.RENEW")
        .arg("b")
        .arg("o1")
        .arg(1000)
        .query(&mut con)
        .unwrap();
    let _: i64 = redis::cmd("LOCK.RENEW")
        .arg("b")
        .arg("o2")
        .arg(1000)
        .query(&mut con)
        .unwrap();
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("b")
        .query(&mut con)
        .unwrap();
    let _ = error_of(&mut con, &[b"LOCK.ACQUIRE", b"a", b"o", b"x"]);
    // One timed-out waiter and one handoff through an expired lease.
    acquire(&mut con, "c", "o1", 200).unwrap();
    let mut other = server.connect();
    assert_eq!(acquire_wait(&mut other, "c", "o2", 60_000, 50), None);
    assert!(acquire_wait(&mut other, "c", "o3", 60_000, 5_000).is_some());
    let expect = [
        ("acquired", 3),
        ("reentered", 1),
        ("contended", 3),
        ("acquire_nil", 1),
        ("waits_started", 2),
        ("handoffs", 1),
        ("released", 1),
        ("released_partial", 1),
        ("release_not_owner", 1),
        ("renewed", 1),
        ("renew_not_owner", 1),
        ("force_released", 1),
        ("expired_with_waiters", 1),
        ("wait_timeouts", 1),
        ("wait_cancelled", 0),
        ("errors", 1),
        ("waiters", 0),
        ("locks_with_waiters", 0),
    ];
    for (name, want) in expect {
        assert_eq!(lock_stat(&mut con, name), want, "lock_{name}");
    }
    let waited = lock_stat(&mut con, "wait_time_ms");
    assert!(waited >= 100, "wait_time_ms {waited}");
    let everything: String = redis::cmd("INFO")
        .arg("everything")
        .query(&mut con)
        .unwrap();
    assert!(
        everything.contains("# lock\r\nlock_acquired:3"),
        "INFO everything includes the section"
    );
}

#[test]
fn lock_events_reach_keyspace_subscribers() {
    let server = Server::start();
    let mut con = server.connect();
    notify_keyspace_events(&mut con, "Kh");
    let mut sub = server.connect();
    let mut pubsub = keyspace_subscriber(&mut sub, "k", Duration::from_secs(2));
    acquire(&mut con, "k", "a", 60_000).unwrap();
    acquire(&mut con, "k", "a", 60_000).unwrap();
    let _: i64 = redis::cmd("LOCK.RENEW")
        .arg("k")
        .arg("a")
        .arg(300)
        .query(&mut con)
        .unwrap();
    release(&mut con, "k", "a");
    let mut waiter = server.connect();
    assert!(acquire_wait(&mut waiter, "k", "b", 60_000, 5_000).is_some()); // a's lease ends
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("k")
        .query(&mut con)
        .unwrap();
    acquire(&mut con, "k", "c", 60_000).unwrap();
    release(&mut con, "k", "c");
    let mut seen = Vec::new();
    while let Ok(msg) = pubsub.get_message() {
        let event: String = msg.get_payload().unwrap();
        seen.push(event);
        if seen.last().map(String::as_str) == Some("lock.released") && seen.len() > 6 {
            break;
        }
    }
    assert_eq!(
        seen,
        [
            "lock.acquired",
            "lock.reentered",
            "lock.renewed",
            "lock.expired",
            "lock.handoff",
            "lock.forcereleased",
            "lock.acquired",
            "lock.released"
        ]
    );
}

#[test]
fn keyspace_events_can_be_switched_off() {
    let server = Server::start_with_module_args(&["keyspace-events", "no"]);
    let mut con = server.connect();
    notify_keyspace_events(&mut con, "KA");
    let mut sub = server.connect();
    let mut pubsub = sub.as_pubsub();
    pubsub.psubscribe("__keyspace@0__:*").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    acquire(&mut con, "k", "a", 60_000).unwrap();
    assert!(pubsub.get_message().is_err(), "no event was expected");
}

/// The `ACL SETUSER` lines of docs/operations.md (section *ACL*, moved there from the README)
/// for the data servers, each split into its arguments: the tests create users exactly as the
/// docs tell readers to. (The page's `lock-sentinel` line is for Sentinels, whose commands a
/// data server does not have: `clients/rust/tests/acl.rs` runs it on a Sentinel set.)
fn documented_acl_lines() -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .expect("docs/operations.md");
    let lines: Vec<Vec<String>> = doc
        .lines()
        .filter(|l| l.starts_with("ACL SETUSER ") && !l.starts_with("ACL SETUSER lock-sentinel "))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    let users: Vec<&str> = lines.iter().map(|l| l[2].as_str()).collect();
    assert_eq!(
        users,
        ["app", "observer", "ops"],
        "the ACL lines of docs/operations.md"
    );
    lines
}

/// Runs the `ACL SETUSER` lines of docs/operations.md.
fn create_users_as_the_docs_say(admin: &mut Connection) {
    for line in documented_acl_lines() {
        let _: () = redis::cmd(&line[0])
            .arg(&line[1..])
            .query(admin)
            .unwrap_or_else(|e| panic!("{}: {e}", line.join(" ")));
    }
}

fn connect_as(server: &Server, user: &str, password: &str) -> Connection {
    redis::Client::open(format!(
        "redis://{user}:{password}@127.0.0.1:{}/",
        server.port
    ))
    .unwrap()
    .get_connection()
    .unwrap()
}

#[test]
fn acl_confines_applications_to_their_keys_and_can_deny_force_release() {
    let server = Server::start();
    let mut admin = server.connect();
    create_users_as_the_docs_say(&mut admin);
    let mut app = connect_as(&server, "app", "app-secret");
    assert!(acquire(&mut app, "app:orders", "w1", 10_000).is_some());
    let outside = error_of(&mut app, &[b"LOCK.ACQUIRE", b"billing:1", b"w1", b"100"]);
    assert!(outside.starts_with("NOPERM"), "{outside}");
    // Every key of a multi-key command is checked: one outside the pattern refuses it whole.
    let tokens: Vec<i64> = redis::cmd("LOCK.MACQUIRE")
        .arg(2)
        .arg(&["app:a", "app:b"])
        .arg("w1")
        .arg(10_000)
        .query(&mut app)
        .unwrap();
    assert_eq!(tokens.len(), 2);
    let mixed = error_of(
        &mut app,
        &[
            b"LOCK.MACQUIRE",
            b"2",
            b"app:c",
            b"billing:1",
            b"w1",
            b"100",
        ],
    );
    assert!(mixed.starts_with("NOPERM"), "{mixed}");
    assert!(!admin.exists::<_, bool>("app:c").unwrap());
    let force = error_of(&mut app, &[b"LOCK.FORCERELEASE", b"app:orders"]);
    assert!(force.starts_with("NOPERM"), "{force}");
    let mut ops = connect_as(&server, "ops", "ops-secret");
    let denied = error_of(&mut ops, &[b"LOCK.ACQUIRE", b"app:orders", b"w1", b"100"]);
    assert!(denied.starts_with("NOPERM"), "{denied}");
    let removed: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("app:orders")
        .query(&mut ops)
        .unwrap();
    assert_eq!(removed, 1);
}

/// Issue 18, finding 7: the README granted the application `&redisson_lock__channel:*`, so with
/// SUBSCRIBE or PSUBSCRIBE it saw the unlock messages, and so the key names, of every tenant's
/// locks (`redisson_lock__channel:{billing:payroll-run-2026-11}`). The user docs/operations.md
/// now creates gets its own keys' channels only: it receives its own unlock messages, and
/// SUBSCRIBE and PSUBSCRIBE to another tenant's channels are refused for the channel's sake.
#[test]
fn acl_confines_applications_to_their_own_unlock_channels() {
    let server = Server::start();
    let mut admin = server.connect();
    create_users_as_the_docs_say(&mut admin);
    // docs/operations.md, *Unlock channels*: what a client that waits as Redisson does adds.
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "app",
            "&redisson_lock__channel:{app:*}",
            "&redisson_lock__channel:app:*",
            "+psubscribe",
            "+punsubscribe",
        ])
        .query(&mut admin)
        .unwrap();
    let mut app = connect_as(&server, "app", "app-secret");
    let theirs = "redisson_lock__channel:{billing:payroll-run-2026-11}";
    for (command, channel) in [
        ("SUBSCRIBE", theirs),
        ("SUBSCRIBE", "redisson_lock__channel:billing:{payroll}:run"),
        ("PSUBSCRIBE", theirs),
        ("PSUBSCRIBE", "redisson_lock__channel:*"),
        ("PSUBSCRIBE", "redisson_lock__channel:{*}"),
        ("PSUBSCRIBE", "redisson_lock__channel:{billing:*}"),
        ("PSUBSCRIBE", "redisson_lock__channel:{app*"),
        ("PSUBSCRIBE", "*"),
    ] {
        let e = error_of(&mut app, &[command.as_bytes(), channel.as_bytes()]);
        // Refused for the channel, not for the command: the user may subscribe to its own.
        assert!(
            e.starts_with("NOPERM") && e.contains("channel"),
            "{command} {channel}: {e}"
        );
    }

    let mut pubsub = app.as_pubsub();
    pubsub
        .subscribe("redisson_lock__channel:{app:orders}")
        .unwrap();
    pubsub.psubscribe("redisson_lock__channel:{app:*}").unwrap();
    pubsub.psubscribe("redisson_lock__channel:app:*").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    // Another tenant's locks go first, then the app's own (one with a hash tag), then a marker
    // the app may receive: whatever came before it is all the app was sent.
    let mut holder = connect_as(&server, "app", "app-secret");
    for key in ["billing:payroll-run-2026-11", "billing:{payroll}:run"] {
        acquire(&mut admin, key, "w1", 10_000).unwrap();
        release(&mut admin, key, "w1").unwrap();
    }
    for key in ["app:orders", "app:{orders}:1"] {
        acquire(&mut holder, key, "w1", 10_000).unwrap();
        release(&mut holder, key, "w1").unwrap();
    }
    let _: i64 = redis::cmd("PUBLISH")
        .arg("redisson_lock__channel:{app:end}")
        .arg("end")
        .query(&mut admin)
        .unwrap();
    let mut got = Vec::new();
    loop {
        let msg = pubsub.get_message().expect("a message");
        let pattern: Option<String> = msg.get_pattern().unwrap();
        let payload: String = msg.get_payload().unwrap();
        if payload == "end" {
            break;
        }
        got.push((msg.get_channel_name().to_string(), pattern, payload));
    }
    let own = |channel: &str, pattern: Option<&str>| {
        (
            channel.to_string(),
            pattern.map(str::to_string),
            "0".to_string(),
        )
    };
    assert_eq!(
        got,
        [
            own("redisson_lock__channel:{app:orders}", None),
            own(
                "redisson_lock__channel:{app:orders}",
                Some("redisson_lock__channel:{app:*}")
            ),
            own(
                "redisson_lock__channel:app:{orders}:1",
                Some("redisson_lock__channel:app:*")
            ),
        ]
    );
}

/// `redis.conf.example` (what `make run` starts) lists every option of the module, each with
/// its default: the module loaded from it has exactly these options, with these values, and a
/// server without the file's options has the same values.
#[test]
fn the_example_config_lists_every_option_with_its_default() {
    let example =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/redis.conf.example"))
            .expect("redis.conf.example");
    let listed: std::collections::BTreeMap<String, String> = example
        .lines()
        .filter(|l| l.starts_with("lock."))
        .map(|l| {
            let (name, value) = l.split_once(' ').expect("name value");
            (name.to_string(), value.to_string())
        })
        .collect();
    let options: String = example
        .lines()
        .filter(|l| l.starts_with("lock."))
        .map(|l| format!("{l}\n"))
        .collect();
    let config_get = |server: &Server| -> std::collections::BTreeMap<String, String> {
        let pairs: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("lock.*")
            .query(&mut server.connect())
            .unwrap();
        pairs
            .chunks(2)
            .map(|p| (p[0].clone(), p[1].clone()))
            .collect()
    };
    let from_example = Server::start_from_config(&options);
    assert_eq!(config_get(&from_example), listed, "the example as loaded");
    assert_eq!(config_get(&Server::start()), listed, "the defaults");
}

#[test]
fn config_is_validated_and_written_by_config_rewrite() {
    let server = Server::start_from_config("lock.max-lease-ms 60000\n");
    let conf = server
        .config_path()
        .expect("started from a file")
        .to_path_buf();
    let mut con = server.connect();
    let lease: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("lock.max-lease-ms")
        .query(&mut con)
        .unwrap();
    assert_eq!(lease[1], "60000", "read from redis.conf");
    for (name, bad) in [
        ("lock.max-lease-ms", "0"),
        ("lock.max-waiters-per-key", "-1"),
        ("lock.keyspace-events", "maybe"),
        ("lock.max-lease-ms", "soon"),
    ] {
        let r = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(bad)
            .query::<()>(&mut con);
        assert!(r.is_err(), "{name} {bad} must be refused");
    }
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.max-waiters-per-key")
        .arg(7)
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.unlock-channel-prefix")
        .arg("app-locks")
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("CONFIG").arg("REWRITE").query(&mut con).unwrap();
    let written = std::fs::read_to_string(&conf).unwrap();
    assert!(written.contains("lock.max-waiters-per-key 7"), "{written}");
    assert!(
        written.contains("lock.unlock-channel-prefix \"app-locks\"")
            || written.contains("lock.unlock-channel-prefix app-locks"),
        "{written}"
    );
}

#[test]
fn the_waiter_limit_per_key_refuses_with_a_clear_error() {
    let server = Server::start_with_module_args(&["max-waiters-per-key", "2"]);
    let mut con = server.connect();
    acquire(&mut con, "k", "holder", 60_000).unwrap();
    let mut blocked = Vec::new();
    for i in 0..2 {
        let mut c = server.connect();
        let owner = format!("w{i}");
        blocked.push(std::thread::spawn(move || {
            acquire_wait(&mut c, "k", &owner, 1000, 2_000)
        }));
        assert!(eventually(Duration::from_secs(3), || waiters(&mut con) == i + 1));
    }
    assert_eq!(
        error_of(
            &mut con,
            &[b"LOCK.ACQUIRE", b"k", b"w3", b"1000", b"WAIT", b"0"]
        ),
        "ERR too many waiters on this lock (lock.max-waiters-per-key is 2)"
    );
    assert_eq!(waiters(&mut con), 2);
    for b in blocked {
        assert_eq!(b.join().unwrap(), None);
    }
}

#[test]
fn command_docs_and_key_specs_describe_every_command() {
    let server = Server::start();
    let mut con = server.connect();
    for cmd in [
        "lock.acquire",
        "lock.release",
        "lock.renew",
        "lock.info",
        "lock.forcerelease",
        "lock.macquire",
        "lock.mrelease",
        "lock.mrenew",
        "lock.campaign",
        "lock.proclaim",
        "lock.leader",
    ] {
        let multi = matches!(cmd, "lock.macquire" | "lock.mrelease" | "lock.mrenew");
        let out = Command::new(cli_bin())
            .args(["-p", &server.port.to_string(), "COMMAND", "DOCS", cmd])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        for field in [
            "summary",
            "since",
            "complexity",
            "arguments",
            "key_spec_index",
        ] {
            assert!(text.contains(field), "{cmd} docs lack {field}: {text}");
        }
        if multi {
            // numkeys first: tests/multikey.rs checks several keys.
            let keys: Vec<String> = redis::cmd("COMMAND")
                .arg("GETKEYS")
                .arg(cmd)
                .arg(1)
                .arg("the-key")
                .arg("o")
                .arg(5)
                .query(&mut con)
                .unwrap();
            assert_eq!(keys, ["the-key"], "{cmd}");
            continue;
        }
        let keys: Vec<String> = redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg(cmd)
            .arg("the-key")
            .arg("o")
            .arg(5)
            .arg("WAIT")
            .arg(1)
            .query(&mut con)
            .or_else(|_| {
                redis::cmd("COMMAND")
                    .arg("GETKEYS")
                    .arg(cmd)
                    .arg("the-key")
                    .arg("o")
                    .arg(5)
                    .query(&mut con)
            })
            .or_else(|_| {
                redis::cmd("COMMAND")
                    .arg("GETKEYS")
                    .arg(cmd)
                    .arg("the-key")
                    .arg("o")
                    .arg(5)
                    .arg("v")
                    .query(&mut con)
            })
            .or_else(|_| {
                redis::cmd("COMMAND")
                    .arg("GETKEYS")
                    .arg(cmd)
                    .arg("the-key")
                    .arg("o")
                    .query(&mut con)
            })
            .or_else(|_| {
                redis::cmd("COMMAND")
                    .arg("GETKEYS")
                    .arg(cmd)
                    .arg("the-key")
                    .query(&mut con)
            })
            .unwrap();
        assert_eq!(keys, ["the-key"], "{cmd}");
    }
    let info = Command::new(cli_bin())
        .args([
            "-p",
            &server.port.to_string(),
            "COMMAND",
            "INFO",
            "lock.info",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(
        text.contains("readonly") && text.contains("RO") && text.contains("access"),
        "{text}"
    );
    let info = Command::new(cli_bin())
        .args([
            "-p",
            &server.port.to_string(),
            "COMMAND",
            "INFO",
            "lock.acquire",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&info.stdout);
    // Not denyoom: under maxmemory a holder still re-enters (LOCK.ACQUIRE refuses only a new
    // lock, with Redis's OOM error). Blocking: it may block (with WAIT).
    assert!(
        text.contains("write")
            && text.contains("RW")
            && text.contains("blocking")
            && !text.contains("denyoom"),
        "{text}"
    );
}

#[test]
fn the_log_shows_the_configuration_at_load_and_warns_on_lost_leases() {
    let server = Server::start();
    let mut con = server.connect();
    assert!(
        server
            .log()
            .contains("lock module loaded: max-lease-ms=2592000000 max-waiters-per-key=100000"),
        "{}",
        server.log()
    );
    acquire(&mut con, "k", "dying", 100).unwrap();
    let mut w = server.connect();
    assert!(acquire_wait(&mut w, "k", "next", 1000, 5_000).is_some());
    assert!(eventually(Duration::from_secs(2), || server
        .log()
        .contains("a held lease on 'k' ran out with waiters queued")));
}

/// Where the server reports every key that expires (the key server event: Redis >= 7.2,
/// Valkey), every held lease that runs out is counted (`lock_expired`) and announced
/// (`lock.expired`), waiters or not. Redis 7.0 has no such event: there the field is absent
/// and a lease that runs out with nobody waiting is only Redis's own `expired`.
#[test]
fn held_leases_that_run_out_are_counted_where_the_server_reports_expiries() {
    let server = Server::start();
    let mut con = server.connect();
    let about = server_info();
    let reports_expiries = about.kind == ServerKind::Valkey || about.version >= (7, 2, 0);
    notify_keyspace_events(&mut con, "KEh");
    let mut listener = server.connect();
    let mut events = listener.as_pubsub();
    events.subscribe("__keyevent@0__:lock.expired").unwrap();
    events
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    acquire(&mut con, "a", "o", 100).unwrap();
    acquire(&mut con, "b", "o", 100).unwrap();
    let _: () = redis::cmd("SET")
        .arg("not-a-lock")
        .arg("x")
        .arg("PX")
        .arg(100)
        .query(&mut con)
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // Touching the keys expires them now, whatever the server's active expiry did.
    let _: i64 = redis::cmd("EXISTS")
        .arg("a")
        .arg("b")
        .arg("not-a-lock")
        .query(&mut con)
        .unwrap();
    let mut announced: Vec<String> = std::iter::from_fn(|| events.get_message().ok())
        .filter_map(|m| m.get_payload::<String>().ok())
        .collect();
    announced.sort();
    let counted = info_field(&mut con, "lock", "lock_expired");
    if reports_expiries {
        assert_eq!(counted.as_deref(), Some("2"));
        assert_eq!(announced, ["a", "b"]);
    } else {
        assert_eq!(counted, None, "no count where expiries are not seen");
        assert!(announced.is_empty(), "{announced:?}");
    }
}

/// docs/operations.md, *Elections*: the permissions it names are enough to campaign, proclaim,
/// renew and resign, and to observe the key's leader channel; nothing else is needed.
#[test]
fn acl_permissions_the_docs_name_for_elections_are_enough() {
    let server = Server::start();
    let mut admin = server.connect();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "cand",
            "on",
            ">c",
            "~app:*",
            "resetchannels",
            "+lock.campaign",
            "+lock.proclaim",
            "+lock.renew",
            "+lock.release",
        ])
        .query(&mut admin)
        .unwrap();
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "obs",
            "on",
            ">o",
            "~app:*",
            "resetchannels",
            "&lock.leader:{app:*}",
            "&lock.leader:app:*",
            "+lock.leader",
            "+subscribe",
        ])
        .query(&mut admin)
        .unwrap();
    let mut cand = connect_as(&server, "cand", "c");
    let mut obs = connect_as(&server, "obs", "o");
    let mut observer = connect_as(&server, "obs", "o");
    let mut pubsub = observer.as_pubsub();
    pubsub.subscribe("lock.leader:{app:svc}").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let epoch: i64 = redis::cmd("LOCK.CAMPAIGN")
        .arg(&["app:svc", "node-a", "10000", "VALUE", "v1"])
        .query(&mut cand)
        .unwrap();
    let message: String = pubsub.get_message().unwrap().get_payload().unwrap();
    assert_eq!(message, format!("elected 0 {epoch} 7 app:svc node-a"));
    let proclaimed: i64 = redis::cmd("LOCK.PROCLAIM")
        .arg("app:svc")
        .arg("node-a")
        .arg(epoch)
        .arg("v2")
        .query(&mut cand)
        .unwrap();
    assert_eq!(proclaimed, 1);
    let renewed: i64 = redis::cmd("LOCK.RENEW")
        .arg(&["app:svc", "node-a", "10000"])
        .query(&mut cand)
        .unwrap();
    assert_eq!(renewed, 1);
    let leader: (String, i64, String) = redis::cmd("LOCK.LEADER")
        .arg("app:svc")
        .query(&mut obs)
        .unwrap();
    assert_eq!(leader, ("node-a".into(), epoch, "v2".into()));
    let denied = error_of(&mut obs, &[b"LOCK.CAMPAIGN", b"app:svc", b"o", b"100"]);
    assert!(denied.starts_with("NOPERM"), "{denied}");
    assert_eq!(release(&mut cand, "app:svc", "node-a"), Some(0));
}
