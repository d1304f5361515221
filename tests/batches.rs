//! Batches: one command, event or timer that grants or ends many holds at once must not stall
//! the server. Each batch runs at the module's caps — 1,000 holders of a key (a semaphore's
//! largest `LIMIT` too), 64 keys per multi-key command — while a connection of its own PINGs in
//! a loop and keeps its slowest round trip, which must stay under `ping_bound()`:
//! - a `LOCK.RELEASE` that grants a run of shared waiters, and a `LOCK.FORCERELEASE` that hands
//!   a full semaphore's permits to its queue;
//! - a `LOCK.RELEASE` that grants a run of multi-key shared waiters, each on 64 keys;
//! - `LOCK.MRENEW`, `LOCK.MACQUIRE ... SHARED` and `LOCK.MRELEASE` on 64 keys of 1,000 holders
//!   each, and a `DEL` of those keys (which tells their holders, on servers with key events);
//! - `CLIENT KILL` of the connections of thousands of `EPHEMERAL` readers of one key;
//! - one connection closing with thousands of owners' `EPHEMERAL` holds on one key.
//!
//! And the bindings of `EPHEMERAL` holds, which `lock_ephemeral_holds` counts: a hold granted
//! through `WAIT` and ended by its lease leaves them while its connection stays open; `COPY`
//! makes a plain hold, `MOVE` and `SWAPDB` take the binding along with the key.
//!
//! `LOCK_BATCH_N=<n>` runs the batches with n holders instead of 1,000 (a module whose batch
//! costs the square of n shows it in seconds at 1,000). Some setups cost the square of n
//! whatever the batch does: every command on a key reads all of its holds, so N holds taken one
//! by one (the semaphore's, the one connection's) or N waiters queued behind N permits read
//! N²/2 or N² holds. The others queue their waiters behind one exclusive hold and cost N. A
//! process may open 20,000 files here (`ulimit -n`, a hard limit): each batch test holds up to
//! 1,000 sockets, and the tests of this file run one at a time, since they measure how long the
//! server goes without answering; with a lower limit the batches shrink to fit, and say so.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use lock_testkit::*;

/// Holders per batch: the module's cap on one key's holders (`MAX_HOLDERS`) and on a
/// semaphore's `LIMIT` (`MAX_LIMIT`).
const CAP: usize = 1_000;
/// The most keys of one multi-key command (`MAX_MULTI_KEYS`).
const MULTI_KEYS: usize = 64;
/// A reply this late is a stall, far past `ping_bound()`: the test stops waiting for it.
const STALL: Duration = Duration::from_secs(10);
/// A whole batch, from its trigger to its outcome: a generous bound that catches a hang.
const BATCH_BOUND: Duration = Duration::from_secs(60);
/// Setting a batch up is slow on a debug build, where a command on a key with h holders reads
/// all h at about 5 µs each (N holders taken one by one read N²/2 holds).
/// A bound per setup step (a pipeline's reply, a chunk of waiters queueing) that only catches a
/// hang.
const SETUP_STEP: Duration = Duration::from_secs(300);
/// Waiters are sent this many at a time, each chunk queued before the next: the server then
/// never spends one event-loop turn on all of them.
const CHUNK: usize = 1_000;
/// The batch tests' leases: no hold may end by its lease while a test runs, however long its
/// setup takes (a batch granted during the setup starts every lease at once).
const LEASE_MS: u64 = 3_600_000;
/// Files this process needs besides a batch's sockets.
const SPARE_FILES: u64 = 256;
const SOON: Duration = Duration::from_secs(5);

/// One test at a time: the batch tests hold up to 1,000 sockets each and measure how long the
/// server goes without answering, which a neighbour's batch would blur.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The batch size: `LOCK_BATCH_N`, else the cap; fewer (and said so) if this process may not
/// open that many sockets.
fn batch_size() -> usize {
    let wanted = match std::env::var("LOCK_BATCH_N") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("LOCK_BATCH_N={v:?} is not a number")),
        Err(_) => CAP,
    };
    assert!(
        (1..=CAP).contains(&wanted),
        "LOCK_BATCH_N must be 1 ..= {CAP} (a key has at most {CAP} holders)"
    );
    let limit = open_files_limit().expect("the open files limit, from /proc/self/limits");
    let fits = usize::try_from(limit.saturating_sub(SPARE_FILES)).unwrap_or(usize::MAX);
    if fits < wanted {
        eprintln!(
            "batches: WARNING: ulimit -n is {limit}, too low for {wanted} sockets: batches of \
             {fits} instead"
        );
        fits
    } else {
        wanted
    }
}

/// A server that takes thousands of clients (Redis lowers `maxclients` to what the open files
/// limit allows, 19,968 here).
fn batch_server() -> Server {
    Server::start_with(&["--maxclients", "20000", "--tcp-backlog", "4096"])
}

/// A connection that gives up on a reply after `STALL`: opened for the batch, once it is set
/// up.
fn connect_admin(server: &Server) -> Connection {
    let con = server.connect();
    con.set_read_timeout(Some(STALL)).expect("read timeout");
    con
}

/// A connection for setting a batch up, whose replies may take long on a debug build.
fn connect_setup(server: &Server) -> Connection {
    let con = server.connect();
    con.set_read_timeout(Some(SETUP_STEP))
        .expect("read timeout");
    con
}

fn acquire_cmd(key: &str, owner: &str, options: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(LEASE_MS).arg(options);
    cmd
}

/// `n` clients on sockets of their own, client i blocked in `wait(i)` (a `LOCK.ACQUIRE ...
/// WAIT`), queued in the order of i.
fn waiting_clients(
    server: &Server,
    setup: &mut Connection,
    n: usize,
    wait: impl Fn(usize) -> redis::Cmd,
) -> Vec<RawClient> {
    let mut clients = Vec::with_capacity(n);
    for i in 0..n {
        let mut client = RawClient::connect(server.port)
            .unwrap_or_else(|e| panic!("connecting client {i} of {n}: {e}"));
        client.send(&[&wait(i)]).expect("send");
        clients.push(client);
        if (i + 1) % CHUNK == 0 || i + 1 == n {
            let want = (i + 1) as i64;
            assert!(
                eventually(SETUP_STEP, || waiters(setup) == want),
                "{} of {want} waiters queued",
                waiters(setup)
            );
        }
    }
    clients
}

/// Acquires `n` holds on one connection, pipelined, and returns their tokens.
fn pipelined_holds(con: &mut RawClient, n: usize, cmd: impl Fn(usize) -> redis::Cmd) -> Vec<i64> {
    let mut tokens = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(CHUNK) {
        let cmds: Vec<redis::Cmd> = chunk.iter().map(|&i| cmd(i)).collect();
        con.send(&cmds.iter().collect::<Vec<_>>())
            .expect("send the pipeline");
        for &i in chunk {
            match con.reply(SETUP_STEP) {
                Ok(Value::Int(token)) if token > 0 => tokens.push(token),
                other => panic!("hold {i} of {n}: {other:?}"),
            }
        }
    }
    tokens
}

/// Reads one token from each client (waiting at most `within` for each); a stall fails the
/// test with the pinger's figures.
fn tokens_of(clients: &mut [RawClient], within: Duration, pinger: Option<&Pinger>) -> Vec<i64> {
    let n = clients.len();
    clients
        .iter_mut()
        .enumerate()
        .map(|(i, client)| match client.reply(within) {
            Ok(Value::Int(token)) if token > 0 => token,
            other => panic!(
                "client {i} of {n}: {other:?}; the pinger so far: {:?}",
                pinger.map(Pinger::so_far)
            ),
        })
        .collect()
}

/// How long the server ran `CLIENT KILL` (its SLOWLOG entry, which logs every command here).
fn kill_duration_ms(admin: &mut Connection) -> f64 {
    let entries: Vec<Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(128)
        .query(admin)
        .unwrap();
    entries
        .iter()
        .find_map(|entry| {
            let Value::Bulk(fields) = entry else {
                return None;
            };
            let micros: i64 = redis::from_redis_value(fields.get(2)?).ok()?;
            let Value::Bulk(args) = fields.get(3)? else {
                return None;
            };
            let first: String = redis::from_redis_value(args.first()?).ok()?;
            first
                .eq_ignore_ascii_case("client")
                .then_some(micros as f64 / 1e3)
        })
        .expect("CLIENT KILL in the slow log")
}

/// LOCK.INFO's `mode`, `waiters` and the owners of its `holders`; None when the key is free.
fn holding(con: &mut Connection, key: &str) -> Option<(String, i64, Vec<String>)> {
    let info = lock_info(con, key)?;
    let mode: String = redis::from_redis_value(&info["mode"]).expect("mode");
    let Value::Bulk(entries) = &info["holders"] else {
        panic!("holders: {:?}", info["holders"]);
    };
    let owners = entries
        .iter()
        .map(|entry| {
            let Value::Bulk(fields) = entry else {
                panic!("holder entry {entry:?}");
            };
            fields
                .chunks(2)
                .find(|pair| matches!(&pair[0], Value::Data(name) if name == b"owner"))
                .map(|pair| redis::from_redis_value(&pair[1]).expect("owner"))
                .expect("an owner field")
        })
        .collect();
    Some((mode, info_int(&info, "waiters"), owners))
}

/// Every token positive, none twice, all above `above`.
fn assert_fresh_tokens(tokens: &[i64], above: i64) {
    let distinct: BTreeSet<i64> = tokens.iter().copied().collect();
    assert_eq!(distinct.len(), tokens.len(), "a token was handed out twice");
    assert!(
        tokens.iter().all(|&t| t > above),
        "a grant's token is not above the earlier hold's {above}"
    );
}

/// Runs the command that sets the batch off; a stall fails the test with the pinger's figures.
fn trigger(con: &mut Connection, cmd: &redis::Cmd, pinger: &Pinger, n: usize) -> Value {
    cmd.query(con).unwrap_or_else(|e| {
        panic!(
            "the trigger (N = {n}) got no answer: {e}; the pinger so far: {:?}",
            pinger.so_far()
        )
    })
}

/// Polls `done` until it holds (within `BATCH_BOUND`); a stall fails the test with the pinger's
/// figures.
fn until(
    admin: &mut Connection,
    pinger: &Pinger,
    what: &str,
    mut done: impl FnMut(&mut Connection) -> redis::RedisResult<bool>,
) {
    let finished = eventually(BATCH_BOUND, || {
        done(admin).unwrap_or_else(|e| {
            panic!(
                "waiting for {what}: {e}; the pinger so far: {:?}",
                pinger.so_far()
            )
        })
    });
    assert!(
        finished,
        "{what} did not happen within {BATCH_BOUND:?}; the pinger: {:?}",
        pinger.so_far()
    );
}

fn report(what: &str, n: usize, setup: Duration, pings: &Pings, took: Duration) {
    eprintln!(
        "batches: {what}: N = {n}, worst PING {:.1} ms over {} PINGs (bound {} ms), batch done \
         in {:.1} ms (set up in {:.1} s)",
        pings.worst.as_secs_f64() * 1e3,
        pings.answered,
        ping_bound().as_millis(),
        took.as_secs_f64() * 1e3,
        setup.as_secs_f64()
    );
}

fn assert_answering(what: &str, n: usize, pings: &Pings) {
    assert!(
        pings.failed.is_none() && pings.worst < ping_bound(),
        "{what}: with N = {n} the server went {:?} without answering PING (bound {:?}); \
         {}",
        pings.worst,
        ping_bound(),
        pings
            .failed
            .as_deref()
            .unwrap_or("every PING was answered, late")
    );
}

/// Sends `trigger` (which hands the key to every one of `waiting`) with the pinger running,
/// collects the waiters' tokens and reports: (the trigger's reply, the tokens, the pings, how
/// long until every waiter had its token).
fn grant_batch(
    server: &Server,
    admin: &mut Connection,
    trigger_cmd: &redis::Cmd,
    waiting: &mut [RawClient],
    what: &str,
    setup_took: Duration,
) -> (Value, Vec<i64>, Pings, Duration) {
    let n = waiting.len();
    let pinger = Pinger::start(server);
    let started = Instant::now();
    let reply = trigger(admin, trigger_cmd, &pinger, n);
    let tokens = tokens_of(waiting, STALL, Some(&pinger));
    let took = started.elapsed();
    let pings = pinger.stop();
    report(what, n, setup_took, &pings, took);
    (reply, tokens, pings, took)
}

/// One exclusive holder, N shared waiters behind it; its release grants them all at once.
#[test]
fn a_release_that_grants_a_run_of_shared_waiters_keeps_the_server_answering() {
    let _one = one_at_a_time();
    let n = batch_size();
    let server = batch_server();
    let set_up = Instant::now();
    let mut setup = connect_setup(&server);
    let first = acquire(&mut setup, "rw", "holder", LEASE_MS).expect("granted");
    let mut readers = waiting_clients(&server, &mut setup, n, |i| {
        acquire_cmd("rw", &format!("reader-{i}"), &["SHARED", "WAIT", "0"])
    });
    let setup_took = set_up.elapsed();

    let mut admin = connect_admin(&server);
    let (left, tokens, pings, took) = grant_batch(
        &server,
        &mut admin,
        redis::cmd("LOCK.RELEASE").arg("rw").arg("holder"),
        &mut readers,
        "one release grants a run of shared waiters",
        setup_took,
    );

    assert_eq!(left, Value::Int(0));
    assert_fresh_tokens(&tokens, first);
    let (mode, waiting, owners) = holding(&mut admin, "rw").expect("held");
    assert_eq!((mode.as_str(), waiting), ("shared", 0));
    assert_eq!(owners.len(), n, "every reader holds the key");
    assert_eq!(waiters(&mut admin), 0);
    assert!(took < BATCH_BOUND, "the batch took {took:?}");
    assert_answering("a release granting a run of shared waiters", n, &pings);
}

/// A `LIMIT N` semaphore with its N permits held and N more waiters; `LOCK.FORCERELEASE` hands
/// all N permits to the queue at once.
#[test]
fn a_forcerelease_that_hands_a_full_semaphore_to_its_queue_keeps_the_server_answering() {
    let _one = one_at_a_time();
    let n = batch_size();
    let server = batch_server();
    let set_up = Instant::now();
    let mut setup = connect_setup(&server);
    let limit = n.to_string();
    let mut holder = RawClient::connect(server.port).expect("connect");
    let held = pipelined_holds(&mut holder, n, |i| {
        acquire_cmd("sem", &format!("p-{i}"), &["LIMIT", &limit])
    });
    let last_held = held.iter().copied().max().expect("held");
    let mut waiting = waiting_clients(&server, &mut setup, n, |i| {
        acquire_cmd("sem", &format!("q-{i}"), &["LIMIT", &limit, "WAIT", "0"])
    });
    let setup_took = set_up.elapsed();

    let mut admin = connect_admin(&server);
    let (removed, tokens, pings, took) = grant_batch(
        &server,
        &mut admin,
        redis::cmd("LOCK.FORCERELEASE").arg("sem"),
        &mut waiting,
        "a FORCERELEASE hands a full semaphore to its queue",
        setup_took,
    );

    assert_eq!(removed, Value::Int(1));
    assert_fresh_tokens(&tokens, last_held);
    let (mode, queue, owners) = holding(&mut admin, "sem").expect("held");
    assert_eq!((mode.as_str(), queue), ("semaphore", 0));
    assert_eq!(owners.len(), n, "every waiter holds a permit");
    assert!(
        owners.iter().all(|o| o.starts_with("q-")),
        "a p-* permit is left"
    );
    assert_eq!(waiters(&mut admin), 0);
    assert!(took < BATCH_BOUND, "the batch took {took:?}");
    assert_answering("a FORCERELEASE handing a full semaphore over", n, &pings);
}

/// The keys of the multi-key batches: `MULTI_KEYS` keys of one hash tag (one slot).
fn multi_keys() -> Vec<String> {
    (0..MULTI_KEYS).map(|i| format!("{{m}}:{i}")).collect()
}

/// One exclusive holder of one key, N multi-key shared waiters behind it, each on `MULTI_KEYS`
/// keys; its release grants them all, in batches that read and write each key once.
#[test]
fn a_release_that_grants_a_run_of_multi_key_shared_waiters_keeps_the_server_answering() {
    let _one = one_at_a_time();
    let n = batch_size();
    let server = batch_server();
    let set_up = Instant::now();
    let mut setup = connect_setup(&server);
    let keys = multi_keys();
    let first = acquire(&mut setup, &keys[0], "holder", LEASE_MS).expect("granted");
    let mut readers = waiting_clients(&server, &mut setup, n, |i| {
        let mut cmd = redis::cmd("LOCK.MACQUIRE");
        cmd.arg(keys.len())
            .arg(&keys)
            .arg(format!("reader-{i}"))
            .arg(LEASE_MS)
            .arg(&["SHARED", "WAIT", "0"]);
        cmd
    });
    let setup_took = set_up.elapsed();

    let mut admin = connect_admin(&server);
    let pinger = Pinger::start(&server);
    let started = Instant::now();
    let left = trigger(
        &mut admin,
        redis::cmd("LOCK.RELEASE").arg(&keys[0]).arg("holder"),
        &pinger,
        n,
    );
    let grants: Vec<Vec<i64>> = readers
        .iter_mut()
        .enumerate()
        .map(|(i, client)| match client.reply(STALL) {
            Ok(reply) => redis::from_redis_value(&reply)
                .unwrap_or_else(|e| panic!("reader {i}: {reply:?}: {e}")),
            Err(e) => panic!("reader {i}: {e}; the pinger: {:?}", pinger.so_far()),
        })
        .collect();
    let took = started.elapsed();
    let pings = pinger.stop();
    report(
        "one release grants a run of multi-key shared waiters on 64 keys",
        n,
        setup_took,
        &pings,
        took,
    );

    assert_eq!(left, Value::Int(0));
    for tokens in &grants {
        assert_eq!(tokens.len(), keys.len());
        assert!(tokens.iter().all(|&t| t > first));
    }
    for key in [&keys[0], &keys[MULTI_KEYS - 1]] {
        let (mode, waiting, owners) = holding(&mut admin, key).expect("held");
        assert_eq!((mode.as_str(), waiting, owners.len()), ("shared", 0, n));
    }
    assert_eq!(waiters(&mut admin), 0);
    assert!(took < BATCH_BOUND, "the batch took {took:?}");
    assert_answering(
        "a release granting a run of multi-key shared waiters",
        n,
        &pings,
    );
}

/// `MULTI_KEYS` keys of N shared holds each (written in the documented layout: taking them
/// through LOCK.ACQUIRE one by one reads N²/2 holds a key): one `LOCK.MRENEW`, one
/// `LOCK.MACQUIRE ... SHARED` and one `LOCK.MRELEASE` on all of them, then one `DEL` of all of
/// them (on a server with key events, each key's holders are told inside the DEL), each while
/// the pinger runs.
#[test]
fn multi_key_commands_on_keys_at_the_cap_keep_the_server_answering() {
    let _one = one_at_a_time();
    let n = batch_size();
    let server = batch_server();
    let set_up = Instant::now();
    let mut setup = connect_setup(&server);
    let keys = multi_keys();
    let lease_end = now_ms(&mut setup) + LEASE_MS;
    for key in &keys {
        let mut hset = redis::cmd("HSET");
        hset.arg(key).arg("mode").arg("rw");
        for i in 0..n - 1 {
            hset.arg(format!("s:o{i}"))
                .arg(format!("1:{lease_end}:{}", 1_000 + i));
        }
        let _: i64 = hset.query(&mut setup).unwrap();
        let _: i64 = redis::cmd("PEXPIREAT")
            .arg(key)
            .arg(lease_end)
            .query(&mut setup)
            .unwrap();
    }
    let setup_took = set_up.elapsed();
    let multi = |name: &str, rest: &[String]| {
        let mut cmd = redis::cmd(name);
        cmd.arg(keys.len()).arg(&keys).arg(rest);
        cmd
    };
    let lease = LEASE_MS.to_string();
    let commands = [
        (
            "LOCK.MRENEW",
            multi("LOCK.MRENEW", &["o5".into(), lease.clone()]),
        ),
        (
            "LOCK.MACQUIRE ... SHARED",
            multi(
                "LOCK.MACQUIRE",
                &["newcomer".into(), lease, "SHARED".into()],
            ),
        ),
        (
            "LOCK.MRELEASE",
            multi("LOCK.MRELEASE", &["newcomer".into()]),
        ),
    ];
    let mut admin = connect_admin(&server);
    for (what, cmd) in &commands {
        let pinger = Pinger::start(&server);
        let started = Instant::now();
        let reply = trigger(&mut admin, cmd, &pinger, n);
        let took = started.elapsed();
        let pings = pinger.stop();
        report(&format!("{what} on 64 keys"), n, setup_took, &pings, took);
        let replies: Vec<i64> = redis::from_redis_value(&reply).expect(what);
        assert_eq!(replies.len(), keys.len(), "{what}");
        assert!(replies.iter().all(|&r| r >= 0), "{what}: {replies:?}");
        assert_answering(what, n, &pings);
    }
    let (_, _, owners) = holding(&mut admin, &keys[0]).expect("held");
    assert_eq!(owners.len(), n - 1, "the newcomer came and went");
    let pinger = Pinger::start(&server);
    let started = Instant::now();
    let deleted = trigger(&mut admin, redis::cmd("DEL").arg(&keys), &pinger, n);
    let took = started.elapsed();
    let pings = pinger.stop();
    report("DEL of 64 keys", n, setup_took, &pings, took);
    assert_eq!(deleted, Value::Int(MULTI_KEYS as i64));
    assert_answering("a DEL of the 64 keys", n, &pings);
}

/// The server's clock, in ms.
fn now_ms(con: &mut Connection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query(con).unwrap();
    secs * 1_000 + micros / 1_000
}

/// N connections, each with one `EPHEMERAL` shared hold of one key, killed by one `CLIENT KILL`.
#[test]
fn client_kill_of_thousands_of_ephemeral_readers_of_one_key_keeps_the_server_answering() {
    let _one = one_at_a_time();
    let n = batch_size();
    let server = batch_server();
    let set_up = Instant::now();
    let mut setup = connect_setup(&server);
    // The readers are granted through WAIT, in one batch: N acquires one after another would
    // each read the key's holds (N²/2 hold reads).
    acquire(&mut setup, "rw", "gate", LEASE_MS).expect("granted");
    let mut readers = waiting_clients(&server, &mut setup, n, |i| {
        acquire_cmd(
            "rw",
            &format!("r-{i}"),
            &["SHARED", "EPHEMERAL", "WAIT", "0"],
        )
    });
    assert_eq!(release(&mut setup, "rw", "gate"), Some(0));
    tokens_of(&mut readers, SETUP_STEP, None);
    assert_eq!(lock_stat(&mut setup, "ephemeral_holds"), n as i64);
    let setup_took = set_up.elapsed();
    drop(setup);

    let mut admin = connect_admin(&server);
    let pinger = Pinger::start(&server);
    // The setup's connection is gone: the readers, the admin and the pinger are left.
    assert!(
        eventually(SOON, || info_field(
            &mut admin,
            "clients",
            "connected_clients"
        ) == Some((n + 2).to_string())),
        "connected_clients: {:?}",
        info_field(&mut admin, "clients", "connected_clients")
    );
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(0)
        .query::<()>(&mut admin)
        .unwrap();
    redis::cmd("SLOWLOG")
        .arg("RESET")
        .query::<()>(&mut admin)
        .unwrap();
    let started = Instant::now();
    // SKIPME yes (the default) spares the admin; the pinger is a pub/sub client.
    let killed = trigger(
        &mut admin,
        redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("normal"),
        &pinger,
        n,
    );
    // Redis frees the N connections inside CLIENT KILL itself (about 20 µs each, module or not:
    // 216 ms for 10,000 idle connections holding nothing, measured on 7.0.15): that much of
    // the pinger's wait is the server's own, whatever the module does. The module only notes
    // the closes there and ends the holds afterwards, from a timer (in the same turn of the
    // event loop, before the replies go out): the wait beyond the command is its batch.
    let kill = Duration::from_secs_f64(kill_duration_ms(&mut admin) / 1e3);
    until(&mut admin, &pinger, "every hold to end", |con| {
        let exists: bool = con.exists("rw")?;
        Ok(!exists && lock_stat(con, "ephemeral_holds") == 0)
    });
    let took = started.elapsed();
    let pings = pinger.stop();
    report(
        "CLIENT KILL ends the EPHEMERAL holds of N connections on one key",
        n,
        setup_took,
        &pings,
        took,
    );

    eprintln!(
        "batches: (CLIENT KILL itself ran {:.1} ms inside Redis, freeing the {n} connections; \
         the worst PING waited {:.1} ms beyond it)",
        kill.as_secs_f64() * 1e3,
        pings.worst.saturating_sub(kill).as_secs_f64() * 1e3
    );
    assert_eq!(
        killed,
        Value::Int(n as i64),
        "CLIENT KILL killed the readers"
    );
    assert_eq!(lock_stat(&mut admin, "disconnected"), n as i64);
    drop(readers);
    let beyond_the_kill = Pings {
        worst: pings.worst.saturating_sub(kill),
        ..pings
    };
    assert_answering(
        "CLIENT KILL of EPHEMERAL readers (beyond the command's own run)",
        n,
        &beyond_the_kill,
    );
}

/// One connection holding N owners' `EPHEMERAL` shared holds of one key, closed.
#[test]
fn one_connection_closing_with_thousands_of_ephemeral_holds_on_one_key_keeps_the_server_answering()
{
    let _one = one_at_a_time();
    let n = batch_size();
    let server = batch_server();
    let set_up = Instant::now();
    let mut setup = connect_setup(&server);
    let mut holder = RawClient::connect(server.port).expect("connect");
    pipelined_holds(&mut holder, n, |i| {
        acquire_cmd("rw", &format!("o-{i}"), &["SHARED", "EPHEMERAL"])
    });
    assert_eq!(lock_stat(&mut setup, "ephemeral_holds"), n as i64);
    let (_, _, owners) = holding(&mut setup, "rw").expect("held");
    assert_eq!(owners.len(), n);
    let setup_took = set_up.elapsed();
    drop(setup);

    let mut admin = connect_admin(&server);
    let pinger = Pinger::start(&server);
    let started = Instant::now();
    drop(holder);
    until(&mut admin, &pinger, "every hold to end", |con| {
        let exists: bool = con.exists("rw")?;
        Ok(!exists && lock_stat(con, "ephemeral_holds") == 0)
    });
    let took = started.elapsed();
    let pings = pinger.stop();
    report(
        "one connection closes with N EPHEMERAL holds on one key",
        n,
        setup_took,
        &pings,
        took,
    );

    assert_eq!(lock_stat(&mut admin, "disconnected"), n as i64);
    assert_answering("closing a connection with N EPHEMERAL holds", n, &pings);
}

/// A long-lived connection is granted `EPHEMERAL` holds through `WAIT`, one after another, and
/// each ends by its 50 ms lease, never by a release: the bindings go with the holds, not with
/// the connection.
#[test]
fn ephemeral_holds_granted_through_wait_and_ended_by_their_lease_leave_the_bindings() {
    const GRANTS: usize = 300;
    let _one = one_at_a_time();
    let server = Server::start();
    let mut admin = connect_admin(&server);
    let mut holder = connect_admin(&server);
    let keys: Vec<String> = (0..GRANTS).map(|i| format!("leak:{i}")).collect();
    let mut pipe = redis::pipe();
    for key in &keys {
        pipe.cmd("LOCK.ACQUIRE").arg(key).arg("h").arg(60_000);
    }
    let held: Vec<Option<i64>> = pipe.query(&mut holder).unwrap();
    assert!(held.iter().all(Option::is_some));

    // The worker asks for every key in turn; each request blocks until the holder lets go.
    let mut worker = RawClient::connect(server.port).expect("connect");
    let worker_id = match worker.query(redis::cmd("CLIENT").arg("ID"), SOON) {
        Ok(Value::Int(id)) => id,
        other => panic!("CLIENT ID: {other:?}"),
    };
    let requests: Vec<redis::Cmd> = keys
        .iter()
        .map(|key| {
            let mut cmd = redis::cmd("LOCK.ACQUIRE");
            cmd.arg(key)
                .arg("w")
                .arg(50)
                .arg("EPHEMERAL")
                .arg("WAIT")
                .arg(5_000);
            cmd
        })
        .collect();
    worker
        .send(&requests.iter().collect::<Vec<_>>())
        .expect("send");
    for key in &keys {
        assert!(
            eventually(SOON, || lock_info(&mut admin, key)
                .is_some_and(|info| info_int(&info, "waiters") == 1)),
            "the worker does not wait on {key}"
        );
        assert_eq!(release(&mut holder, key, "h"), Some(0));
        match worker.reply(SOON) {
            Ok(Value::Int(token)) if token > 0 => {}
            other => panic!("the worker's grant of {key}: {other:?}"),
        }
    }
    // Every grant came through WAIT.
    assert_eq!(lock_stat(&mut admin, "waits_started"), GRANTS as i64);
    assert_eq!(lock_stat(&mut admin, "handoffs"), GRANTS as i64);

    // The leases end; Redis removes the keys.
    let mut all = redis::cmd("EXISTS");
    all.arg(&keys);
    assert!(
        eventually(SOON, || all.query::<i64>(&mut admin).unwrap() == 0),
        "the worker's holds outlived their 50 ms leases"
    );
    let bound = lock_stat(&mut admin, "ephemeral_holds");
    eprintln!(
        "batches: {GRANTS} EPHEMERAL holds granted through WAIT, all ended by their leases, no \
         lock key left: lock_ephemeral_holds {bound}"
    );
    assert!(
        eventually(SOON, || lock_stat(&mut admin, "ephemeral_holds") == 0),
        "lock_ephemeral_holds is {} with every hold ended by its lease and no lock key left \
         (the worker's connection, client {worker_id}, is open)",
        lock_stat(&mut admin, "ephemeral_holds")
    );
    // The worker's connection was open all along.
    assert!(matches!(worker.query(&redis::cmd("PING"), SOON), Ok(Value::Status(s)) if s == "PONG"));
}

/// `COPY` of an `EPHEMERAL`-held key, and the copy released: the original is still bound to
/// its connection and ends with it.
#[test]
fn releasing_the_copy_of_an_ephemeral_hold_leaves_the_original_bound() {
    let _one = one_at_a_time();
    let server = Server::start();
    let mut admin = connect_admin(&server);
    let mut con = server.connect();
    let id = client_id(&mut con);
    acquire_with(&mut con, "{job}1", "worker", 60_000, &["EPHEMERAL"])
        .unwrap()
        .expect("granted");
    let copied: i64 = redis::cmd("COPY")
        .arg("{job}1")
        .arg("{job}copy")
        .query(&mut admin)
        .unwrap();
    assert_eq!(copied, 1);
    assert_eq!(release(&mut admin, "{job}copy", "worker"), Some(0));
    assert!(!admin.exists::<_, bool>("{job}copy").unwrap());

    assert_eq!(
        bound_to(&mut admin, "{job}1"),
        Some(id),
        "the original is no longer bound to its connection"
    );
    assert_eq!(lock_stat(&mut admin, "ephemeral_holds"), 1);
    drop(con);
    assert!(
        eventually(SOON, || !admin.exists::<_, bool>("{job}1").unwrap()),
        "the original hold outlived its connection"
    );
    assert_eq!(lock_stat(&mut admin, "ephemeral_holds"), 0);
}

/// The copy of an `EPHEMERAL` hold is a plain hold: shown unbound, re-entered without
/// `EPHEMERAL`, and it stays when the original's connection closes.
#[test]
fn the_copy_of_an_ephemeral_hold_is_a_plain_hold() {
    let _one = one_at_a_time();
    let server = Server::start();
    let mut admin = connect_admin(&server);
    let mut con = server.connect();
    let id = client_id(&mut con);
    let token = acquire_with(&mut con, "{job}1", "worker", 60_000, &["EPHEMERAL"])
        .unwrap()
        .expect("granted");
    let copied: i64 = redis::cmd("COPY")
        .arg("{job}1")
        .arg("{job}copy")
        .query(&mut admin)
        .unwrap();
    assert_eq!(copied, 1);

    assert_eq!(bound_to(&mut admin, "{job}copy"), None, "the copy is bound");
    assert_eq!(bound_to(&mut admin, "{job}1"), Some(id));
    match acquire_with(&mut admin, "{job}copy", "worker", 60_000, &[]) {
        Ok(Some(reentered)) => assert_eq!(reentered, token, "the copy's token"),
        other => panic!("a plain re-entry of the copy: {other:?}"),
    }
    assert_eq!(lock_stat(&mut admin, "ephemeral_holds"), 1);
    drop(con);
    assert!(
        eventually(SOON, || !admin.exists::<_, bool>("{job}1").unwrap()),
        "the original hold outlived its connection"
    );
    let info = lock_info(&mut admin, "{job}copy").expect("the copy stays");
    assert_eq!(info_int(&info, "count"), 2);
    assert_eq!(bound_to(&mut admin, "{job}copy"), None);
    assert_eq!(lock_stat(&mut admin, "ephemeral_holds"), 0);
}

fn connect_db(server: &Server, db: u8) -> Connection {
    let con = redis::Client::open(format!("{}{db}", server.url()))
        .expect("url")
        .get_connection()
        .expect("connect");
    con.set_read_timeout(Some(STALL)).expect("read timeout");
    con
}

/// `MOVE` of an `EPHEMERAL`-held key to db 1: the hold there is still bound to its connection
/// and ends with it.
#[test]
fn a_moved_ephemeral_hold_ends_with_its_connection() {
    let _one = one_at_a_time();
    let server = Server::start();
    let (mut db0, mut db1) = (connect_db(&server, 0), connect_db(&server, 1));
    let mut con = server.connect();
    let id = client_id(&mut con);
    acquire_with(&mut con, "k", "worker", 60_000, &["EPHEMERAL"])
        .unwrap()
        .expect("granted");
    let moved: i64 = redis::cmd("MOVE").arg("k").arg(1).query(&mut db0).unwrap();
    assert_eq!(moved, 1);
    // Valkey 8.1.8 leaves the client that ran MOVE selected on the destination database (see
    // the caution in docs/operations.md): this connection reads db 0 again whatever the server.
    redis::cmd("SELECT").arg(0).query::<()>(&mut db0).unwrap();

    assert!(lock_info(&mut db0, "k").is_none());
    assert_eq!(bound_to(&mut db1, "k"), Some(id));
    assert_eq!(lock_stat(&mut db0, "ephemeral_holds"), 1);
    drop(con);
    assert!(
        eventually(SOON, || !db1.exists::<_, bool>("k").unwrap()),
        "the hold moved to db 1 outlived its connection"
    );
    assert_eq!(lock_stat(&mut db0, "disconnected"), 1);
    assert_eq!(lock_stat(&mut db0, "ephemeral_holds"), 0);
}

/// `SWAPDB 0 1` with an `EPHEMERAL` hold in each database: each stays bound to its own
/// connection and ends with it, in the database it is in now.
#[test]
fn swapped_ephemeral_holds_end_with_their_connections() {
    let _one = one_at_a_time();
    let server = Server::start();
    let (mut db0, mut db1) = (connect_db(&server, 0), connect_db(&server, 1));
    let (mut c0, mut c1) = (connect_db(&server, 0), connect_db(&server, 1));
    let (id0, id1) = (client_id(&mut c0), client_id(&mut c1));
    acquire_with(&mut c0, "k0", "worker-0", 60_000, &["EPHEMERAL"])
        .unwrap()
        .expect("granted");
    acquire_with(&mut c1, "k1", "worker-1", 60_000, &["EPHEMERAL"])
        .unwrap()
        .expect("granted");
    let _: () = redis::cmd("SWAPDB").arg(0).arg(1).query(&mut db0).unwrap();

    assert!(lock_info(&mut db0, "k0").is_none());
    assert!(lock_info(&mut db1, "k1").is_none());
    assert_eq!(bound_to(&mut db1, "k0"), Some(id0));
    assert_eq!(bound_to(&mut db0, "k1"), Some(id1));
    assert_eq!(lock_stat(&mut db0, "ephemeral_holds"), 2);

    drop(c0);
    assert!(
        eventually(SOON, || !db1.exists::<_, bool>("k0").unwrap()),
        "the hold swapped into db 1 outlived its connection"
    );
    assert!(db0.exists::<_, bool>("k1").unwrap(), "the other hold ended");
    assert_eq!(lock_stat(&mut db0, "ephemeral_holds"), 1);
    drop(c1);
    assert!(
        eventually(SOON, || !db0.exists::<_, bool>("k1").unwrap()),
        "the hold swapped into db 0 outlived its connection"
    );
    assert_eq!(lock_stat(&mut db0, "disconnected"), 2);
    assert_eq!(lock_stat(&mut db0, "ephemeral_holds"), 0);
}
