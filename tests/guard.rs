//! LOCK.GUARD and LOCK.CHECK against a real server: a command runs only while its hold admits
//! the fencing token, and answers its own reply (RESP2 and RESP3); every way a hold ends fences
//! its token; a shared hold reads only; the inner command runs as the calling user, under a
//! script's rules and maxmemory, never on the module's own keys; only its effects reach the AOF
//! and replicas; in a cluster its keys route, CROSSSLOT and MOVED/ASK as one command's; and the
//! documented Lua recipe answers as LOCK.CHECK does, with or without the module.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use lock_core::slot::{counter_key, key_slot};
use lock_testkit::*;

const SOON: Duration = Duration::from_secs(5);
const GONE: &str = "FENCED the hold is gone";
const NOT_CURRENT: &str = "FENCED the token is not current";

fn guard(
    con: &mut Connection,
    key: &str,
    owner: &str,
    token: i64,
    command: &[&str],
) -> redis::RedisResult<Value> {
    redis::cmd("LOCK.GUARD")
        .arg(key)
        .arg(owner)
        .arg(token)
        .arg(command)
        .query(con)
}

/// The error line (`CODE detail`) of a LOCK.GUARD that must be refused.
fn guard_error(
    con: &mut Connection,
    key: &str,
    owner: &str,
    token: i64,
    command: &[&str],
) -> String {
    let token = token.to_string();
    let mut args: Vec<&[u8]> = vec![
        b"LOCK.GUARD",
        key.as_bytes(),
        owner.as_bytes(),
        token.as_bytes(),
    ];
    args.extend(command.iter().map(|a| a.as_bytes()));
    error_of(con, &args)
}

fn check(con: &mut Connection, key: &str, owner: &str, token: i64) -> i64 {
    redis::cmd("LOCK.CHECK")
        .arg(key)
        .arg(owner)
        .arg(token)
        .query(con)
        .expect("LOCK.CHECK")
}

fn get(con: &mut Connection, key: &str) -> Option<String> {
    con.get(key).expect("GET")
}

#[test]
fn a_valid_token_runs_the_command_and_answers_its_reply() {
    let server = Server::start();
    let mut con = server.connect();
    let token = acquire(&mut con, "orders:lock", "worker-1", 30_000).unwrap();
    let set = guard(
        &mut con,
        "orders:lock",
        "worker-1",
        token,
        &["SET", "orders:42", "paid"],
    );
    assert_eq!(set, Ok(Value::Okay));
    assert_eq!(get(&mut con, "orders:42").as_deref(), Some("paid"));
    let read = guard(
        &mut con,
        "orders:lock",
        "worker-1",
        token,
        &["GET", "orders:42"],
    );
    assert_eq!(read, Ok(Value::Data(b"paid".to_vec())));
    let incr = guard(
        &mut con,
        "orders:lock",
        "worker-1",
        token,
        &["INCRBY", "orders:n", "5"],
    );
    assert_eq!(incr, Ok(Value::Int(5)));
    // The inner command's own error is its reply, unchanged.
    let wrong = guard_error(
        &mut con,
        "orders:lock",
        "worker-1",
        token,
        &["INCR", "orders:42"],
    );
    assert_eq!(wrong, "ERR value is not an integer or out of range");
    assert_eq!(check(&mut con, "orders:lock", "worker-1", token), 1);
    assert_eq!(lock_stat(&mut con, "guarded"), 4);
    assert_eq!(lock_stat(&mut con, "fenced"), 0);
    // The lock itself was only read.
    assert_eq!(
        lock_info(&mut con, "orders:lock").map(|i| info_int(&i, "count")),
        Some(1)
    );
}

/// One reply read off a socket, as its bytes (RESP2 or RESP3).
fn read_reply(reader: &mut impl BufRead) -> Vec<u8> {
    let mut out = Vec::new();
    read_frame(reader, &mut out);
    out
}

fn read_frame(reader: &mut impl BufRead, out: &mut Vec<u8>) {
    let start = out.len();
    assert!(reader.read_until(b'\n', out).expect("read") > 0, "closed");
    let line = out[start..].to_vec();
    let n = || -> i64 {
        std::str::from_utf8(&line[1..])
            .unwrap()
            .trim_end()
            .parse()
            .unwrap()
    };
    match line[0] {
        // Bulk, verbatim, blob error: a length, the bytes, CRLF.
        b'$' | b'=' | b'!' if n() >= 0 => {
            let mut body = vec![0; n() as usize + 2];
            reader.read_exact(&mut body).expect("read");
            out.extend_from_slice(&body);
        }
        // Array, set, push: n elements; map, attribute: n pairs.
        b'*' | b'~' | b'>' => (0..n().max(0)).for_each(|_| read_frame(reader, out)),
        b'%' | b'|' => (0..2 * n().max(0)).for_each(|_| read_frame(reader, out)),
        _ => {}
    }
}

fn send(stream: &mut TcpStream, args: &[&str]) {
    let mut cmd = redis::cmd(args[0]);
    cmd.arg(&args[1..]);
    stream.write_all(&cmd.get_packed_command()).expect("write");
}

#[test]
fn replies_come_back_byte_for_byte_in_resp2_and_resp3() {
    let server = Server::start();
    let mut con = server.connect();
    let token = acquire(&mut con, "l", "o", 60_000).unwrap().to_string();
    for setup in [
        &["HSET", "h", "a", "1", "b", "2"][..],
        &["SADD", "s", "x", "y"],
        &["ZADD", "z", "1.5", "m", "2", "n"],
        &["RPUSH", "q", "1", "2", "3"],
        &["SET", "str", "v"],
        &["XADD", "x", "1-1", "f", "v"],
    ] {
        let _: Value = raw(
            &mut con,
            &setup.iter().map(|a| a.as_bytes()).collect::<Vec<_>>(),
        )
        .unwrap();
    }
    let commands: [&[&str]; 13] = [
        &["GET", "str"],
        &["GET", "missing"],
        &["HGETALL", "h"],
        &["HGETALL", "missing"],
        &["SMEMBERS", "s"],
        &["ZSCORE", "z", "m"],
        &["ZRANGE", "z", "0", "-1", "WITHSCORES"],
        &["LRANGE", "q", "0", "-1"],
        &["EXISTS", "str", "h"],
        &["TYPE", "h"],
        &["XRANGE", "x", "-", "+"],
        &["INCR", "str"],
        &["HGET", "str", "f"],
    ];
    for protocol in ["2", "3"] {
        let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        stream.set_read_timeout(Some(SOON)).unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        send(&mut stream, &["HELLO", protocol]);
        read_reply(&mut reader);
        for command in commands {
            send(&mut stream, command);
            let plain = read_reply(&mut reader);
            let mut guarded = vec!["LOCK.GUARD", "l", "o", token.as_str()];
            guarded.extend_from_slice(command);
            send(&mut stream, &guarded);
            let through = read_reply(&mut reader);
            assert_eq!(
                String::from_utf8_lossy(&through),
                String::from_utf8_lossy(&plain),
                "RESP{protocol} {command:?}"
            );
        }
    }
    // RESP3 has its own shapes for these (a map, a set, a double): the test saw them.
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    stream.set_read_timeout(Some(SOON)).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    send(&mut stream, &["HELLO", "3"]);
    read_reply(&mut reader);
    for (command, first) in [("HGETALL", b'%'), ("SMEMBERS", b'~')] {
        let key = if command == "HGETALL" { "h" } else { "s" };
        send(&mut stream, &["LOCK.GUARD", "l", "o", &token, command, key]);
        assert_eq!(read_reply(&mut reader)[0], first, "{command} in RESP3");
    }
    send(
        &mut stream,
        &["LOCK.GUARD", "l", "o", &token, "ZSCORE", "z", "m"],
    );
    assert_eq!(read_reply(&mut reader), b",1.5\r\n");
}

/// How a case ends the hold of `a` on `key` (and what `a`'s old token then gets).
type Ending = fn(&Server, &mut Connection, &str, i64) -> &'static str;

#[test]
fn every_way_a_hold_ends_fences_its_token_and_writes_nothing() {
    let server = Server::start();
    let mut con = server.connect();
    let cases: Vec<(&str, Ending)> = vec![
        ("release", |_, con, key, _| {
            assert_eq!(release(con, key, "a"), Some(0));
            GONE
        }),
        ("force release", |_, con, key, _| {
            assert_eq!(force_release(con, key), 1);
            GONE
        }),
        ("lease end", |_, con, key, token| {
            // The hold's lease is 300 ms (below): once the server says it ended, it fences.
            assert!(eventually(SOON, || check(con, key, "a", token) == 0));
            GONE
        }),
        ("handoff to a waiter", |server, con, key, _| {
            let waiter = Waiter::start(server, key, "b", 60_000, 10_000);
            assert!(eventually(SOON, || key_waiters(con, key) == 1));
            assert_eq!(release(con, key, "a"), Some(0));
            let (next, _) = waiter.granted(SOON);
            // The new holder's token is admitted.
            assert_eq!(check(con, key, "b", next), 1);
            GONE
        }),
        ("DEL of the lock", |_, con, key, _| {
            let _: i64 = con.del(key).unwrap();
            GONE
        }),
        ("a newer hold of the same owner", |_, con, key, token| {
            assert_eq!(release(con, key, "a"), Some(0));
            let newer = acquire(con, key, "a", 60_000).unwrap();
            assert!(newer > token);
            NOT_CURRENT
        }),
    ];
    for (i, (name, end)) in cases.into_iter().enumerate() {
        let (key, data) = (format!("lock:{i}"), format!("data:{i}"));
        let lease = if name == "lease end" { 300 } else { 60_000 };
        let token = acquire(&mut con, &key, "a", lease).unwrap();
        assert_eq!(
            guard(&mut con, &key, "a", token, &["SET", &data, "before"]),
            Ok(Value::Okay),
            "{name}"
        );
        assert_eq!(check(&mut con, &key, "a", token), 1, "{name}");
        let fenced_before = lock_stat(&mut con, "fenced");
        let expected = end(&server, &mut con, &key, token);
        let calls_before = command_calls(&mut con, "set");
        let e = guard_error(&mut con, &key, "a", token, &["SET", &data, "after"]);
        assert!(e.starts_with(expected), "{name}: {e}");
        assert_eq!(get(&mut con, &data).as_deref(), Some("before"), "{name}");
        assert_eq!(
            command_calls(&mut con, "set"),
            calls_before,
            "{name}: SET never ran"
        );
        assert_eq!(check(&mut con, &key, "a", token), 0, "{name}");
        assert_eq!(lock_stat(&mut con, "fenced"), fenced_before + 1, "{name}");
    }
    // A token that was never the hold's, and another owner's claim to the holder's token.
    let token = acquire(&mut con, "lock:x", "a", 60_000).unwrap();
    let e = guard_error(&mut con, "lock:x", "a", token + 1, &["SET", "data:x", "v"]);
    assert!(e.starts_with(NOT_CURRENT), "{e}");
    let e = guard_error(&mut con, "lock:x", "b", token, &["SET", "data:x", "v"]);
    assert!(e.starts_with(GONE), "{e}");
    let e = guard_error(&mut con, "lock:x", "a", 0, &["SET", "data:x", "v"]);
    assert!(e.starts_with(NOT_CURRENT), "{e}");
    assert_eq!(get(&mut con, "data:x"), None);
    // A lock key that is not a lock any more: its error, and nothing runs.
    let _: () = con.set("lock:x", "a string").unwrap();
    let e = guard_error(&mut con, "lock:x", "a", token, &["SET", "data:x", "v"]);
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    assert_eq!(get(&mut con, "data:x"), None);
}

#[test]
fn a_shared_hold_reads_but_never_writes_and_a_permit_writes() {
    let server = Server::start();
    let mut con = server.connect();
    let _: () = con.set("config:data", "v1").unwrap();
    let r1 = acquire_with(&mut con, "config", "reader-1", 60_000, &["SHARED"])
        .unwrap()
        .unwrap();
    let r2 = acquire_with(&mut con, "config", "reader-2", 60_000, &["SHARED"])
        .unwrap()
        .unwrap();
    for (owner, token) in [("reader-1", r1), ("reader-2", r2)] {
        assert_eq!(
            guard(&mut con, "config", owner, token, &["GET", "config:data"]),
            Ok(Value::Data(b"v1".to_vec()))
        );
        for write in [&["SET", "config:data", "v2"][..], &["DEL", "config:data"]] {
            let e = guard_error(&mut con, "config", owner, token, write);
            assert!(
                e.starts_with("ERR a SHARED hold runs only read-only commands"),
                "{e}"
            );
        }
    }
    assert_eq!(get(&mut con, "config:data").as_deref(), Some("v1"));
    assert_eq!(command_calls(&mut con, "del"), 0);

    // A permit of a semaphore writes.
    let p = acquire_with(&mut con, "gpus", "job-1", 60_000, &["LIMIT", "2"])
        .unwrap()
        .unwrap();
    assert_eq!(
        guard(
            &mut con,
            "gpus",
            "job-1",
            p,
            &["SET", "gpus:job-1", "running"]
        ),
        Ok(Value::Okay)
    );

    // An exclusive holder that also took its key SHARED writes with its exclusive token and
    // reads only with its shared one.
    let x = acquire(&mut con, "doc", "editor", 60_000).unwrap();
    let s = acquire_with(&mut con, "doc", "editor", 60_000, &["SHARED"])
        .unwrap()
        .unwrap();
    assert_ne!(x, s);
    assert_eq!(
        guard(&mut con, "doc", "editor", x, &["SET", "doc:body", "draft"]),
        Ok(Value::Okay)
    );
    let e = guard_error(&mut con, "doc", "editor", s, &["SET", "doc:body", "other"]);
    assert!(e.starts_with("ERR a SHARED hold"), "{e}");
    assert_eq!(
        guard(&mut con, "doc", "editor", s, &["GET", "doc:body"]),
        Ok(Value::Data(b"draft".to_vec()))
    );
    assert_eq!(check(&mut con, "doc", "editor", x), 1);
    assert_eq!(check(&mut con, "doc", "editor", s), 1);
    // The exclusive hold released, the shared one stays: only its token is current.
    assert_eq!(release(&mut con, "doc", "editor"), Some(1));
    assert_eq!(check(&mut con, "doc", "editor", x), 0);
    let e = guard_error(&mut con, "doc", "editor", x, &["SET", "doc:body", "late"]);
    assert!(e.starts_with(NOT_CURRENT), "{e}");
    assert_eq!(get(&mut con, "doc:body").as_deref(), Some("draft"));
}

#[test]
fn a_shared_hold_whose_own_lease_ended_is_gone_while_the_key_lives_on() {
    let server = Server::start();
    let mut con = server.connect();
    let short = acquire_with(&mut con, "rw", "short", 200, &["SHARED"])
        .unwrap()
        .unwrap();
    let long = acquire_with(&mut con, "rw", "long", 60_000, &["SHARED"])
        .unwrap()
        .unwrap();
    assert_eq!(check(&mut con, "rw", "short", short), 1);
    std::thread::sleep(Duration::from_millis(300));
    // Still stored (nothing touched the key since), but ended on the server's clock.
    let stored: Vec<String> = con.hkeys("rw").unwrap();
    assert!(stored.contains(&"s:short".to_string()), "{stored:?}");
    assert_eq!(check(&mut con, "rw", "short", short), 0);
    let e = guard_error(&mut con, "rw", "short", short, &["GET", "rw:data"]);
    assert!(e.starts_with(GONE), "{e}");
    assert_eq!(check(&mut con, "rw", "long", long), 1);
}

#[test]
fn refused_inner_commands_change_nothing() {
    let server = Server::start();
    let mut con = server.connect();
    let token = acquire(&mut con, "lock", "a", 60_000).unwrap();
    let _: () = con.set("data", "v").unwrap();
    let _: () = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(
            "#!lua name=guardtest\n\
             redis.register_function('setit', function(keys, args) \
             return redis.call('SET', keys[1], 'changed') end)",
        )
        .query(&mut con)
        .unwrap();
    let counter = String::from_utf8(counter_key(key_slot(b"lock"))).unwrap();
    // (inner command, what refuses it)
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["MULTI"],
            "ERR LOCK.GUARD runs only commands that name keys",
        ),
        (
            vec!["EXEC"],
            "ERR LOCK.GUARD runs only commands that name keys",
        ),
        (vec!["WATCH", "data"], "not allowed"),
        (
            vec![
                "EVAL",
                "return redis.call('SET', KEYS[1], 'changed')",
                "1",
                "data",
            ],
            "not allowed",
        ),
        (vec!["FCALL", "setit", "1", "data"], "not allowed"),
        (
            vec!["SUBSCRIBE", "data"],
            "ERR LOCK.GUARD runs only commands that name keys",
        ),
        (
            vec!["SSUBSCRIBE", "data"],
            "ERR LOCK.GUARD runs only commands that name keys",
        ),
        (
            vec!["PSUBSCRIBE", "*"],
            "ERR LOCK.GUARD runs only commands that name keys",
        ),
        (
            vec!["WAIT", "0", "0"],
            "ERR LOCK.GUARD runs only commands that name keys",
        ),
        (
            vec!["PUBLISH", "data", "m"],
            "ERR LOCK.GUARD runs only commands that name keys",
        ),
        (
            vec!["FLUSHALL"],
            "ERR LOCK.GUARD runs only commands that name keys",
        ),
        (
            vec!["SWAPDB", "0", "1"],
            "ERR LOCK.GUARD runs only commands that name keys",
        ),
        (
            vec!["CONFIG", "SET", "maxmemory", "1"],
            "ERR LOCK.GUARD runs only commands that name keys",
        ),
        (
            vec!["LOCK.RELEASE", "lock", "a"],
            "ERR LOCK.GUARD does not run LOCK.* commands",
        ),
        (
            vec!["lock.forcerelease", "lock"],
            "ERR LOCK.GUARD does not run LOCK.* commands",
        ),
        (
            vec!["LOCK.ACQUIRE", "data", "a", "100"],
            "ERR LOCK.GUARD does not run LOCK.* commands",
        ),
        (
            vec!["DEL", "lock"],
            "ERR LOCK.GUARD never runs a command on the lock's own key",
        ),
        (
            vec!["HSET", "lock", "a", "99"],
            "ERR LOCK.GUARD never runs a command on the lock's own key",
        ),
        (
            vec!["RENAME", "data", "lock"],
            "ERR LOCK.GUARD never runs a command on the lock's own key",
        ),
        (
            vec!["COPY", "data", "lock", "REPLACE"],
            "ERR LOCK.GUARD never runs a command on the lock's own key",
        ),
        (
            vec!["MSET", "data", "x", "lock", "y"],
            "ERR LOCK.GUARD never runs a command on the lock's own key",
        ),
        (
            vec!["SET", &counter, "1"],
            "ERR keys starting with '__lock_fence__' are reserved",
        ),
        (
            vec!["DEL", &counter],
            "ERR keys starting with '__lock_fence__' are reserved",
        ),
        (
            vec!["NOSUCHCOMMAND", "data"],
            "ERR unknown command 'NOSUCHCOMMAND'",
        ),
        (
            vec!["GET"],
            "ERR wrong number of arguments for 'get' command",
        ),
        (
            vec!["SET", "data"],
            "ERR wrong number of arguments for 'set' command",
        ),
    ];
    let lock_before = stored_lock(&mut con, "lock");
    for (command, refusal) in cases {
        let before = dataset(&mut con);
        let name = command[0].to_ascii_lowercase();
        let calls_before = command_calls(&mut con, &name);
        let e = guard_error(&mut con, "lock", "a", token, &command);
        assert_eq!(
            command_calls(&mut con, &name),
            calls_before,
            "{command:?} ran"
        );
        assert!(
            e.starts_with(refusal) || e.contains(refusal),
            "{command:?}: {e}"
        );
        assert_eq!(dataset(&mut con), before, "{command:?} changed the data");
    }
    assert_eq!(stored_lock(&mut con, "lock"), lock_before);
    assert_eq!(get(&mut con, "data").as_deref(), Some("v"));
    // The command is looked at before the hold: a stale token gets the command's own refusal.
    for (command, refusal) in [
        (&["NOSUCHCOMMAND", "data"][..], "ERR unknown command"),
        (&["GET"], "ERR wrong number of arguments"),
        (
            &["PING"],
            "ERR LOCK.GUARD runs only commands that name keys",
        ),
    ] {
        let e = guard_error(&mut con, "lock", "a", token + 1, command);
        assert!(e.starts_with(refusal), "{command:?}: {e}");
    }
    // And LOCK.GUARD itself does not run inside a script or a function.
    let _: () = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(
            "#!lua name=guardinside\n\
             redis.register_function('guarded', function(keys, args) \
             return redis.call('LOCK.GUARD', keys[1], args[1], args[2], 'SET', keys[2], 'x') end)",
        )
        .query(&mut con)
        .unwrap();
    let t = token.to_string();
    let e = error_of(
        &mut con,
        &[
            b"FCALL",
            b"guarded",
            b"2",
            b"lock",
            b"data",
            b"a",
            t.as_bytes(),
        ],
    );
    assert!(e.contains("not allowed from script"), "{e}");
    let e = error_of(
        &mut con,
        &[
            b"EVAL",
            b"return redis.call('LOCK.GUARD', KEYS[1], ARGV[1], ARGV[2], 'SET', KEYS[2], 'x')",
            b"2",
            b"lock",
            b"data",
            b"a",
            token.to_string().as_bytes(),
        ],
    );
    assert!(e.contains("not allowed from script"), "{e}");
    assert_eq!(get(&mut con, "data").as_deref(), Some("v"));
}

#[test]
fn a_blocking_command_through_guard_answers_at_once() {
    let server = Server::start();
    let mut con = server.connect();
    let token = acquire(&mut con, "lock", "a", 60_000).unwrap();
    // BLPOP with no timeout would block forever: through LOCK.GUARD it answers at once (nil,
    // or refused as inside a script, depending on the server) and pops nothing.
    con.set_read_timeout(Some(SOON)).unwrap();
    let started = Instant::now();
    // Redis 7.0 flags BLPOP as a command scripts may not run; later servers run it, at once.
    let info = server_info();
    let refused_as_in_scripts = info.kind == ServerKind::Redis && info.version < (7, 2, 0);
    let blpop = guard(&mut con, "lock", "a", token, &["BLPOP", "queue", "0"]);
    match blpop {
        Err(e) if refused_as_in_scripts => {
            assert!(e.to_string().contains("not allowed on script mode"), "{e}")
        }
        Ok(Value::Nil) if !refused_as_in_scripts => {}
        other => panic!("BLPOP through LOCK.GUARD on {info:?}: {other:?}"),
    }
    for blocking in [
        &["BRPOPLPUSH", "queue", "other", "0"][..],
        &["BZPOPMIN", "zqueue", "0"],
        &["XREAD", "BLOCK", "0", "STREAMS", "stream", "$"],
    ] {
        match guard(&mut con, "lock", "a", token, blocking) {
            Ok(Value::Nil) => {}
            Ok(Value::Bulk(items)) if items.is_empty() => {}
            Err(e) if !e.is_timeout() && !e.is_io_error() => {
                assert!(e.to_string().contains("not allowed"), "{blocking:?}: {e}")
            }
            other => panic!("{blocking:?}: {other:?}"),
        }
    }
    assert!(started.elapsed() < SOON);
    assert_eq!(blocked_client_ids(&mut con), Vec::<i64>::new());
    let blocked: i64 = info_field(&mut con, "clients", "blocked_clients")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(blocked, 0);
    let exists: i64 = con.exists(&["queue", "other", "zqueue", "stream"]).unwrap();
    assert_eq!(exists, 0);
}

#[test]
fn the_inner_command_runs_with_the_callers_acl_and_writes_nothing_it_may_not() {
    let server = Server::start();
    let mut con = server.connect();
    let token = acquire(&mut con, "lock:1", "a", 60_000).unwrap();
    let _: () = con.set("data:1", "v").unwrap();
    let _: () = con.set("other:1", "v").unwrap();
    for rules in [
        &["no-set", "on", ">pw", "~*", "+lock.guard", "+get"][..],
        &["no-data", "on", ">pw", "~lock:*", "~other:*", "+@all"],
        &["read-data", "on", ">pw", "~lock:*", "%R~data:*", "+@all"],
        &["no-lock", "on", ">pw", "~data:*", "+@all"],
    ] {
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(rules)
            .query(&mut con)
            .unwrap();
    }
    let as_user = |user: &str| {
        redis::Client::open(format!("redis://{user}:pw@127.0.0.1:{}/", server.port))
            .unwrap()
            .get_connection()
            .unwrap()
    };
    let t = token.to_string();
    // (user, inner command, allowed)
    let cases = [
        ("no-set", &["SET", "data:1", "x"][..], false),
        ("no-set", &["GET", "data:1"], true),
        ("no-data", &["SET", "data:1", "x"], false),
        ("no-data", &["GET", "data:1"], false),
        ("no-data", &["SET", "other:1", "x"], true),
        ("read-data", &["GET", "data:1"], true),
        ("read-data", &["SET", "data:1", "x"], false),
        ("read-data", &["DEL", "data:1"], false),
        ("no-lock", &["GET", "data:1"], false),
        ("no-lock", &["SET", "data:1", "x"], false),
    ];
    for (user, command, allowed) in cases {
        let mut user_con = as_user(user);
        let before = dataset(&mut con);
        let mut args: Vec<&[u8]> = vec![b"LOCK.GUARD", b"lock:1", b"a", t.as_bytes()];
        args.extend(command.iter().map(|a| a.as_bytes()));
        let result = raw(&mut user_con, &args);
        if allowed {
            assert!(result.is_ok(), "{user} {command:?}: {result:?}");
        } else {
            let e = result.expect_err(&format!("{user} {command:?}"));
            assert_eq!(e.code(), Some("NOPERM"), "{user} {command:?}: {e}");
            assert_eq!(dataset(&mut con), before, "{user} {command:?} wrote");
        }
    }
    assert_eq!(get(&mut con, "data:1").as_deref(), Some("v"));
    assert_eq!(get(&mut con, "other:1").as_deref(), Some("x"));
}

#[test]
fn over_maxmemory_a_guarded_set_is_refused_and_a_guarded_del_runs() {
    let server = Server::start();
    let mut con = server.connect();
    let token = acquire(&mut con, "lock", "a", 60_000).unwrap();
    let _: () = con.set("data", "v").unwrap();
    let config = |con: &mut Connection, name: &str, value: &str| {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query(con)
            .unwrap();
    };
    config(&mut con, "maxmemory-policy", "noeviction");
    config(&mut con, "maxmemory", "1");
    let e = guard_error(
        &mut con,
        "lock",
        "a",
        token,
        &["SET", "data", "bigger value"],
    );
    assert!(e.starts_with("OOM command not allowed"), "{e}");
    assert_eq!(get(&mut con, "data").as_deref(), Some("v"));
    // A command that frees memory is not deny-oom: it runs, through the fence.
    assert_eq!(
        guard(&mut con, "lock", "a", token, &["DEL", "data"]),
        Ok(Value::Int(1))
    );
    assert_eq!(check(&mut con, "lock", "a", token), 1);
    config(&mut con, "maxmemory", "0");
    assert_eq!(get(&mut con, "data"), None);
}

#[test]
fn guard_is_a_write_held_back_by_a_write_pause_and_refused_without_enough_replicas() {
    let server = Server::start();
    let mut con = server.connect();
    let token = acquire(&mut con, "lock", "a", 60_000).unwrap();
    let t = token.to_string();
    // CLIENT PAUSE WRITE: LOCK.GUARD waits for the pause to end.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(10_000)
        .arg("WRITE")
        .query(&mut con)
        .unwrap();
    let mut client = RawClient::connect(server.port).unwrap();
    let mut guarded = redis::cmd("LOCK.GUARD");
    guarded.arg(&["lock", "a", &t, "SET", "data", "v"]);
    client.send(&[&guarded]).unwrap();
    assert!(
        client.reply(Duration::from_millis(300)).is_err(),
        "answered during the pause"
    );
    assert_eq!(get(&mut con, "data"), None);
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut con).unwrap();
    assert_eq!(client.reply(SOON).unwrap(), Value::Okay);
    assert_eq!(get(&mut con, "data").as_deref(), Some("v"));
    // A server that refuses writes refuses LOCK.GUARD, whatever it runs.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("min-replicas-to-write")
        .arg(1)
        .query(&mut con)
        .unwrap();
    for command in [&["SET", "data", "w"][..], &["GET", "data"]] {
        let e = guard_error(&mut con, "lock", "a", token, command);
        assert!(e.starts_with("NOREPLICAS"), "{command:?}: {e}");
    }
    assert_eq!(get(&mut con, "data").as_deref(), Some("v"));
    // LOCK.CHECK reads.
    assert_eq!(check(&mut con, "lock", "a", token), 1);
}

#[test]
fn lock_check_answers_in_scripts_and_functions() {
    let server = Server::start();
    let mut con = server.connect();
    let token = acquire(&mut con, "lock", "a", 60_000).unwrap();
    let check_script = "return redis.call('LOCK.CHECK', KEYS[1], ARGV[1], ARGV[2])";
    let _: () = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(
            "#!lua name=fenced\n\
             redis.register_function{function_name='holds', flags={'no-writes'}, \
             callback=function(keys, args) return redis.call('LOCK.CHECK', keys[1], args[1], args[2]) end}\n\
             redis.register_function('fenced_move', function(keys, args) \
               if redis.call('LOCK.CHECK', keys[1], args[1], args[2]) ~= 1 then \
                 return redis.error_reply('FENCED the hold is gone or its token is not current') \
               end \
               redis.call('DECRBY', keys[2], args[3]) \
               return redis.call('INCRBY', keys[3], args[3]) end)",
        )
        .query(&mut con)
        .unwrap();
    let answers = |con: &mut Connection, token: i64| -> Vec<i64> {
        let mut out = Vec::new();
        for (command, body) in [
            ("EVAL", check_script),
            ("EVAL_RO", check_script),
            ("FCALL", "holds"),
            ("FCALL_RO", "holds"),
        ] {
            let answer: i64 = redis::cmd(command)
                .arg(body)
                .arg(1)
                .arg("lock")
                .arg("a")
                .arg(token)
                .query(con)
                .unwrap();
            out.push(answer);
        }
        out
    };
    assert_eq!(answers(&mut con, token), [1, 1, 1, 1]);
    assert_eq!(answers(&mut con, token + 1), [0, 0, 0, 0]);
    // A fenced update of two keys in one function.
    let _: () = con.set("from", 10).unwrap();
    let moved: i64 = redis::cmd("FCALL")
        .arg("fenced_move")
        .arg(3)
        .arg("lock")
        .arg("from")
        .arg("to")
        .arg("a")
        .arg(token)
        .arg(4)
        .query(&mut con)
        .unwrap();
    assert_eq!(moved, 4);
    assert_eq!(release(&mut con, "lock", "a"), Some(0));
    assert_eq!(answers(&mut con, token), [0, 0, 0, 0]);
    let e = error_of(
        &mut con,
        &[
            b"FCALL",
            b"fenced_move",
            b"3",
            b"lock",
            b"from",
            b"to",
            b"a",
            token.to_string().as_bytes(),
            b"4",
        ],
    );
    assert!(e.contains("FENCED"), "{e}");
    assert_eq!(get(&mut con, "from").as_deref(), Some("6"));
    assert_eq!(get(&mut con, "to").as_deref(), Some("4"));
}

#[test]
fn command_getkeys_lists_the_lock_key_and_the_inner_keys() {
    let server = Server::start();
    let mut con = server.connect();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg(&["LOCK.GUARD", "l", "o", "1", "MSET", "x", "1", "y", "2"])
        .query(&mut con)
        .unwrap();
    assert_eq!(keys, ["l", "x", "y"]);
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg(&["LOCK.GUARD", "l", "o", "1", "LOCK.RELEASE", "x", "o"])
        .query(&mut con)
        .unwrap();
    assert_eq!(keys, ["l"], "a LOCK.* inner command is not looked into");
    // The lock key is read, never written; the inner keys carry the flags Redis gives them.
    let flags: Vec<Value> = redis::cmd("COMMAND")
        .arg("GETKEYSANDFLAGS")
        .arg(&["LOCK.GUARD", "l", "o", "1", "SET", "x", "1"])
        .query(&mut con)
        .unwrap();
    let text = |v: &Value| match v {
        Value::Status(s) => s.clone(),
        other => redis::from_redis_value(other).unwrap(),
    };
    let named: Vec<(String, Vec<String>)> = flags
        .iter()
        .map(|entry| match entry {
            Value::Bulk(pair) => match &pair[..] {
                [key, Value::Bulk(flags)] => (text(key), flags.iter().map(text).collect()),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        named[0],
        (
            "l".to_string(),
            vec!["RO".to_string(), "access".to_string()]
        )
    );
    assert_eq!(named[1].0, "x");
    assert_eq!(named.len(), 2);
    let check: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg(&["LOCK.CHECK", "l", "o", "1"])
        .query(&mut con)
        .unwrap();
    assert_eq!(check, ["l"]);
}

#[test]
fn the_aof_holds_the_inner_commands_and_replays_without_the_module() {
    let mut server = Server::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut con = server.connect();
    let token = acquire(&mut con, "lock", "a", 600_000).unwrap();
    let _: () = con.sadd("s", &["only"]).unwrap();
    for command in [
        &["SET", "data", "v", "EX", "1000"][..],
        &["HSET", "h", "f", "v"],
        &["INCRBY", "n", "7"],
        &["RPUSH", "q", "1", "2"],
        &["SPOP", "s"],
    ] {
        assert!(
            guard(&mut con, "lock", "a", token, command).is_ok(),
            "{command:?}"
        );
    }
    let e = guard_error(&mut con, "lock", "a", token + 1, &["SET", "data", "stale"]);
    assert!(e.starts_with("FENCED"), "{e}");
    let before = dataset(&mut con);
    let aof = aof_text(&server);
    assert!(aof.contains("data") && aof.contains("INCRBY"), "{aof}");
    // As Redis replicates each command: SET ... EX with an absolute time, SPOP as the SREM it did.
    assert!(aof.contains("PXAT") && aof.contains("SREM"), "{aof}");
    assert!(
        !aof.to_ascii_lowercase().contains("lock.guard"),
        "LOCK.GUARD reached the AOF:\n{aof}"
    );
    assert!(!aof.contains("stale"), "the fenced write reached the AOF");
    server.kill_hard();
    // A plain server, without the module, replays it.
    let dir = server.dir.path().to_string_lossy().into_owned();
    let plain = Server::start_options(&Options {
        without_module: true,
        extra: ["--appendonly", "yes", "--dir", &dir]
            .map(String::from)
            .to_vec(),
        ..Options::default()
    });
    let mut plain_con = plain.connect();
    // (Redis 8 and Valkey 9 list built-in modules of their own: not ours.)
    let modules: Value = redis::cmd("MODULE")
        .arg("LIST")
        .query(&mut plain_con)
        .unwrap();
    assert!(!format!("{modules:?}").contains("\"lock\""), "{modules:?}");
    assert_eq!(dataset(&mut plain_con), before);
    assert_eq!(get(&mut plain_con, "data").as_deref(), Some("v"));
}

/// The AOF's text: every file of the append-only directory.
fn aof_text(server: &Server) -> String {
    let dir = server.dir.path().join("appendonlydir");
    let mut text = String::new();
    for entry in std::fs::read_dir(&dir).expect("appendonlydir") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "aof") {
            text.push_str(&String::from_utf8_lossy(&std::fs::read(path).unwrap()));
        }
    }
    text
}

#[test]
fn a_replica_gets_the_inner_commands_effects_and_equals_its_master() {
    let master = Server::start();
    let replica = Server::replica_of(&master);
    let mut con = master.connect();
    let mut rcon = replica.connect();
    let token = acquire(&mut con, "lock", "a", 600_000).unwrap();
    let _: () = con.sadd("set", &["a", "b", "c", "d"]).unwrap();
    for command in [
        &["SET", "data", "v", "EX", "1000"][..],
        &["INCRBYFLOAT", "f", "1.5"],
        &["SPOP", "set"],
        &["LPUSH", "q", "1", "2"],
        &["EXPIRE", "q", "500"],
        &["HINCRBY", "h", "x", "5"],
    ] {
        assert!(
            guard(&mut con, "lock", "a", token, command).is_ok(),
            "{command:?}"
        );
    }
    // Inside MULTI/EXEC too.
    let (first, second): (String, i64) = redis::pipe()
        .atomic()
        .cmd("LOCK.GUARD")
        .arg(&["lock", "a", &token.to_string(), "SET", "m", "1"])
        .cmd("LOCK.GUARD")
        .arg(&["lock", "a", &token.to_string(), "INCR", "m"])
        .query(&mut con)
        .unwrap();
    assert_eq!((first.as_str(), second), ("OK", 2));
    let e = guard_error(&mut con, "lock", "a", token - 1, &["SET", "data", "stale"]);
    assert!(e.starts_with("FENCED"), "{e}");
    assert_eq!(wait_replicas(&mut con, 1, 5_000), 1);
    let on_master = dataset(&mut con);
    assert!(eventually(SOON, || dataset(&mut rcon) == on_master));
    assert_eq!(get(&mut rcon, "data").as_deref(), Some("v"));
    assert_eq!(
        command_calls(&mut rcon, "lock.guard"),
        0,
        "the replica never ran LOCK.GUARD"
    );
    assert!(command_calls(&mut rcon, "set") >= 2 && command_calls(&mut rcon, "incr") == 1);
    // A replica refuses LOCK.GUARD: it writes.
    let e = error_of(
        &mut rcon,
        &[
            b"LOCK.GUARD",
            b"lock",
            b"a",
            token.to_string().as_bytes(),
            b"GET",
            b"data",
        ],
    );
    assert!(e.starts_with("READONLY"), "{e}");
    // LOCK.CHECK reads there.
    assert_eq!(check(&mut rcon, "lock", "a", token), 1);
}

/// The Lua recipe docs/commands.md gives for servers without the module: the ```lua block after
/// its marker.
fn documented_recipe() -> String {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/commands.md"))
        .expect("docs/commands.md");
    let marker = "<!-- LOCK.CHECK in Lua: tests/guard.rs runs this block -->";
    let after = &docs[docs.find(marker).expect("the recipe's marker") + marker.len()..];
    let start = after.find("```lua\n").expect("a lua block") + "```lua\n".len();
    after[start..start + after[start..].find("```").expect("its end")].to_string()
}

#[test]
fn the_documented_lua_recipe_answers_as_lock_check_with_or_without_the_module() {
    let recipe = documented_recipe();
    let server = Server::start();
    let mut con = server.connect();
    let mut cases: Vec<(&str, &str, i64)> = Vec::new();
    // An exclusive lock (Redisson's layout), re-entered.
    let x = acquire(&mut con, "x", "a", 60_000).unwrap();
    acquire(&mut con, "x", "a", 60_000).unwrap();
    cases.extend([
        ("x", "a", x),
        ("x", "a", x + 1),
        ("x", "b", x),
        ("x", "a", 0),
    ]);
    // Two readers, one whose own lease ended (still stored), and a downgraded writer.
    let r1 = acquire_with(&mut con, "rw", "r1", 60_000, &["SHARED"])
        .unwrap()
        .unwrap();
    let r2 = acquire_with(&mut con, "rw", "r2", 150, &["SHARED"])
        .unwrap()
        .unwrap();
    cases.extend([("rw", "r1", r1), ("rw", "r2", r2), ("rw", "r1", r2)]);
    let dx = acquire(&mut con, "down", "w", 60_000).unwrap();
    let ds = acquire_with(&mut con, "down", "w", 60_000, &["SHARED"])
        .unwrap()
        .unwrap();
    cases.extend([("down", "w", dx), ("down", "w", ds), ("down", "v", ds)]);
    // A semaphore.
    let p1 = acquire_with(&mut con, "sem", "p1", 60_000, &["LIMIT", "3"])
        .unwrap()
        .unwrap();
    let p2 = acquire_with(&mut con, "sem", "p2", 60_000, &["LIMIT", "3"])
        .unwrap()
        .unwrap();
    cases.extend([("sem", "p1", p1), ("sem", "p2", p2), ("sem", "p2", p1)]);
    // A released lock, a missing key, an owner with Lua pattern characters.
    let gone = acquire(&mut con, "gone", "a", 60_000).unwrap();
    release(&mut con, "gone", "a");
    let odd = acquire(&mut con, "odd", "a-%.*[", 60_000).unwrap();
    cases.extend([
        ("gone", "a", gone),
        ("missing", "a", 1),
        ("odd", "a-%.*[", odd),
    ]);
    std::thread::sleep(Duration::from_millis(250));

    let by_module: Vec<i64> = cases
        .iter()
        .map(|(key, owner, token)| check(&mut con, key, owner, *token))
        .collect();
    let by_recipe = |con: &mut Connection| -> Vec<i64> {
        cases
            .iter()
            .map(|(key, owner, token)| {
                redis::cmd("EVAL")
                    .arg(&recipe)
                    .arg(1)
                    .arg(key)
                    .arg(owner)
                    .arg(token)
                    .query(con)
                    .unwrap()
            })
            .collect()
    };
    assert_eq!(by_recipe(&mut con), by_module, "cases {cases:?}");
    assert_eq!(
        by_module,
        [1, 0, 0, 0, 1, 0, 0, 1, 1, 0, 1, 1, 0, 0, 0, 1],
        "the cases cover both answers in every layout"
    );

    // The same keys on a server without the module (DUMP/RESTORE with their absolute
    // expiry): the recipe needs nothing but Redis.
    let plain = Server::start_options(&Options {
        without_module: true,
        ..Options::default()
    });
    let mut plain_con = plain.connect();
    for key in ["x", "rw", "down", "sem", "odd"] {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(key).query(&mut con).unwrap();
        let at: i64 = redis::cmd("PEXPIRETIME").arg(key).query(&mut con).unwrap();
        let _: () = redis::cmd("RESTORE")
            .arg(key)
            .arg(at.max(0))
            .arg(dump)
            .arg("ABSTTL")
            .query(&mut plain_con)
            .unwrap();
    }
    assert_eq!(by_recipe(&mut plain_con), by_module);

    // A key in the layout of earlier versions (the token in `__fence__`): LOCK.CHECK reads it,
    // the recipe answers 0 until the key's next write through the module converts it.
    let _: () = redis::cmd("HSET")
        .arg(&["old", "a", "1", "__fence__", "77"])
        .query(&mut con)
        .unwrap();
    let _: () = con.pexpire("old", 60_000).unwrap();
    assert_eq!(check(&mut con, "old", "a", 77), 1);
    let recipe_says: i64 = redis::cmd("EVAL")
        .arg(&recipe)
        .arg(1)
        .arg("old")
        .arg("a")
        .arg(77)
        .query(&mut con)
        .unwrap();
    assert_eq!(recipe_says, 0);
    acquire(&mut con, "old", "a", 60_000).unwrap();
    let recipe_says: i64 = redis::cmd("EVAL")
        .arg(&recipe)
        .arg(1)
        .arg("old")
        .arg("a")
        .arg(77)
        .query(&mut con)
        .unwrap();
    assert_eq!(recipe_says, 1, "converted by the re-entry");
}

// ---- Redis Cluster -------------------------------------------------------------------------

#[test]
fn in_a_cluster_guard_routes_by_all_its_keys_and_follows_a_migration() {
    let cluster = Cluster::start(3);
    let (lock, data) = ("{acct:7}:lock", "{acct:7}:balance");
    let slot = key_slot(lock.as_bytes());
    assert_eq!(key_slot(data.as_bytes()), slot);
    let source = cluster.node_for_slot(slot);
    let mut src = source.connect();

    // A cluster client routes LOCK.GUARD by its keys.
    let mut client = cluster.client();
    let token: i64 = redis::cmd("LOCK.ACQUIRE")
        .arg(lock)
        .arg("a")
        .arg(600_000)
        .query(&mut client)
        .unwrap();
    let set: String = redis::cmd("LOCK.GUARD")
        .arg(&[lock, "a", &token.to_string(), "SET", data, "100"])
        .query(&mut client)
        .unwrap();
    assert_eq!(set, "OK");
    assert_eq!(get(&mut src, data).as_deref(), Some("100"));

    // Every node knows its keys.
    for node in &cluster.nodes {
        let keys: Vec<String> = redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg(&["LOCK.GUARD", lock, "a", "1", "SET", data, "1"])
            .query(&mut node.connect())
            .unwrap();
        assert_eq!(keys, [lock, data]);
    }

    // A data key without the lock key's hash tag: CROSSSLOT, and nothing written.
    let untagged = "balance";
    assert_ne!(key_slot(untagged.as_bytes()), slot);
    let t = token.to_string();
    let e = error_of(
        &mut src,
        &[
            b"LOCK.GUARD",
            lock.as_bytes(),
            b"a",
            t.as_bytes(),
            b"SET",
            untagged.as_bytes(),
            b"1",
        ],
    );
    assert!(e.starts_with("CROSSSLOT"), "{e}");
    let exists: i64 = cluster
        .node_for_slot(key_slot(untagged.as_bytes()))
        .connect()
        .exists(untagged)
        .unwrap();
    assert_eq!(exists, 0);

    // A node that does not serve the slot answers MOVED.
    let other = cluster
        .nodes
        .iter()
        .find(|n| n.port != source.port)
        .unwrap();
    let guarded: [&[u8]; 7] = [
        b"LOCK.GUARD",
        lock.as_bytes(),
        b"a",
        t.as_bytes(),
        b"INCRBY",
        data.as_bytes(),
        b"1",
    ];
    let e = error_of(&mut other.connect(), &guarded);
    assert_eq!(e, format!("MOVED {slot} 127.0.0.1:{}", source.port));

    // Migrate the slot by hand, as redis-cli --cluster reshard does: once the keys left, the
    // source answers ASK; the target runs it for an ASKING client; then MOVED.
    let target = other;
    let (source_id, target_id) = (Cluster::node_id(source), Cluster::node_id(target));
    let mut dst = target.connect();
    let setslot = |con: &mut Connection, state: &str, id: &str| {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(state)
            .arg(id)
            .query(con)
            .unwrap();
    };
    setslot(&mut dst, "IMPORTING", &source_id);
    setslot(&mut src, "MIGRATING", &target_id);
    // Still on the source: it runs there.
    assert_eq!(raw(&mut src, &guarded).unwrap(), Value::Int(101));
    let counter = String::from_utf8(counter_key(slot)).unwrap();
    let _: () = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(target.port)
        .arg("")
        .arg(0)
        .arg(5_000)
        .arg("KEYS")
        .arg(lock)
        .arg(data)
        .arg(&counter)
        .query(&mut src)
        .unwrap();
    let e = error_of(&mut src, &guarded);
    assert_eq!(e, format!("ASK {slot} 127.0.0.1:{}", target.port));
    let (_, asked): (Value, i64) = redis::pipe()
        .cmd("ASKING")
        .cmd("LOCK.GUARD")
        .arg(&guarded[1..])
        .query(&mut dst)
        .unwrap();
    assert_eq!(
        asked, 102,
        "the lock moved with its token: the fence admits it there"
    );
    for node in &cluster.nodes {
        setslot(&mut node.connect(), "NODE", &target_id);
    }
    let e = error_of(&mut src, &guarded);
    assert_eq!(e, format!("MOVED {slot} 127.0.0.1:{}", target.port));
    // And a cluster client follows it.
    let mut client = cluster.client();
    let after: i64 = raw_cluster(&mut client, &guarded);
    assert_eq!(after, 103);
    assert_eq!(get(&mut dst, data).as_deref(), Some("103"));
}

fn raw_cluster(con: &mut redis::cluster::ClusterConnection, args: &[&[u8]]) -> i64 {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(con).unwrap()
}

/// Review finding: GUARD and CHECK read only the owner's own fields of a multi-hold key, so a
/// hash every other command calls "not a lock" (two exclusive holders, a semaphore over its
/// limit, an exclusive hold beside another owner's) admitted writes. A small key is now read
/// whole; a large one is checked in O(1) for what its field count and the owner's own fields
/// show (a semaphore over its limit, an exclusive hold among others).
#[test]
fn a_hash_that_is_not_a_lock_admits_nobody() {
    let server = Server::start();
    let mut con = server.connect();
    let end = now_ms(&mut con) + 600_000;
    let t = (end * 1_000 + 1) as i64;
    let hold = |token: i64| format!("1:{end}:{token}");
    let many = |mode: &str, kind: &str, n: usize| -> Vec<(String, String)> {
        let mut f = vec![("mode".to_string(), mode.to_string())];
        f.extend((0..n).map(|i| (format!("{kind}:o{i}"), hold(t + 10 + i as i64))));
        f
    };
    let mut cases: Vec<(&str, Vec<(String, String)>)> = vec![
        (
            "two exclusive holds",
            vec![
                ("mode".into(), "rw".into()),
                ("x:a".into(), hold(t)),
                ("x:b".into(), hold(t + 1)),
            ],
        ),
        (
            "a semaphore:1 with two permits",
            vec![
                ("mode".into(), "semaphore:1".into()),
                ("p:a".into(), hold(t)),
                ("p:b".into(), hold(t + 1)),
            ],
        ),
        (
            "an exclusive hold beside another owner's shared one",
            vec![
                ("mode".into(), "rw".into()),
                ("x:a".into(), hold(t)),
                ("s:b".into(), hold(t + 1)),
            ],
        ),
    ];
    // Large keys (read by the owner's fields alone).
    let mut over = many("semaphore:20", "p", 30);
    over.push(("p:a".into(), hold(t)));
    cases.push(("a semaphore:20 with 31 permits", over));
    let mut beside = many("rw", "s", 30);
    beside.push(("x:a".into(), hold(t)));
    cases.push(("an exclusive hold among 30 shared ones", beside));
    for (name, fields) in cases {
        let _: i64 = redis::cmd("DEL")
            .arg("k")
            .arg("data")
            .query(&mut con)
            .unwrap();
        let mut hset = redis::cmd("HSET");
        hset.arg("k");
        for (f, v) in &fields {
            hset.arg(f).arg(v);
        }
        let _: i64 = hset.query(&mut con).unwrap();
        let e = guard_error(&mut con, "k", "a", t, &["SET", "data", "a"]);
        assert_eq!(e, NOT_A_LOCK, "{name}: GUARD");
        let e = error_of(
            &mut con,
            &[b"LOCK.CHECK", b"k", b"a", t.to_string().as_bytes()],
        );
        assert_eq!(e, NOT_A_LOCK, "{name}: CHECK");
        assert_eq!(get(&mut con, "data"), None, "{name}: nothing written");
    }
}

fn now_ms(con: &mut Connection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(con).unwrap();
    secs * 1_000 + micros / 1_000
}

/// Review finding: Redis hides MIGRATE's `AUTH` password and `AUTH2` user and password from
/// `MONITOR` and `SLOWLOG`, but LOCK.GUARD's own line carried them in clear. It hides them too,
/// whether the inner MIGRATE runs (here it fails: nothing listens at the target) or is fenced.
#[test]
fn a_guarded_migrate_hides_its_password_from_the_slow_log() {
    let server = Server::start();
    let mut con = server.connect();
    let t = acquire(&mut con, "m:{1}", "w", 60_000).unwrap();
    let _: () = redis::cmd("SET")
        .arg("m:{1}:data")
        .arg("v")
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(0)
        .query(&mut con)
        .unwrap();
    let closed = free_port().to_string();
    for token in [t, t + 1] {
        let _ = guard(
            &mut con,
            "m:{1}",
            "w",
            token,
            &[
                "MIGRATE",
                "127.0.0.1",
                &closed,
                "m:{1}:data",
                "0",
                "100",
                "AUTH",
                "secret-1",
            ],
        );
        let _ = guard(
            &mut con,
            "m:{1}",
            "w",
            token,
            &[
                "MIGRATE",
                "127.0.0.1",
                &closed,
                "",
                "0",
                "100",
                "AUTH2",
                "user-2",
                "secret-2",
                "KEYS",
                "m:{1}:data",
            ],
        );
    }
    let log: Value = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query(&mut con)
        .unwrap();
    let text = format!("{log:?}");
    let guarded = text.matches("LOCK.GUARD").count();
    assert_eq!(guarded, 4, "four LOCK.GUARD entries: {text}");
    for secret in ["secret-1", "secret-2", "user-2"] {
        assert!(!text.contains(secret), "{secret} in the slow log: {text}");
    }
    // Each LOCK.GUARD line hides what its MIGRATE would: 1 + 2 + 1 + 2.
    assert!(text.matches("(redacted)").count() >= 6, "{text}");
}
