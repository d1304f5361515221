//! Waiting with tickets: a waiting acquire asks with `... WAIT ms TICKET` on the client's shared
//! connection, and the client's waiting connection (one per 100 tickets) pops every ticket's
//! answer (`BLPOP`).
//! Real servers (the test kit), real connections: what the server sees is read with `CLIENT
//! LIST`, `INFO lock` and `INFO commandstats`.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Value;
use redis_lock_client::{LockClient, LockError};
use support::{bound_to, calls, raw, Server};
use tokio::time::Instant;

/// A client of `server` with the default settings but for the lost-hold signal (so that its
/// connections are the shared one and, while tickets wait, the waiting one).
async fn client_of(server: &Server, tickets: Option<bool>) -> LockClient {
    let mut builder =
        LockClient::builder(redis::Client::open(server.url()).unwrap()).without_lost_signal();
    if let Some(on) = tickets {
        builder = builder.wait_with_tickets(on);
    }
    builder.build().await.unwrap()
}

/// A counter of `INFO lock`.
async fn stat(raw: &mut MultiplexedConnection, name: &str) -> i64 {
    let info: String = redis::cmd("INFO")
        .arg("lock")
        .query_async(raw)
        .await
        .unwrap();
    let prefix = format!("{name}:");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or_else(|| panic!("INFO lock has no {name}"))
}

/// `CLIENT LIST` lines of the connections named `name`.
async fn connections(raw: &mut MultiplexedConnection, name: &str) -> Vec<String> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(raw)
        .await
        .unwrap();
    let field = format!(" name={name} ");
    list.lines()
        .filter(|l| l.contains(&field))
        .map(str::to_string)
        .collect()
}

/// The connections named `name` once one of them runs `BLPOP` (bounded wait).
async fn until_popping(raw: &mut MultiplexedConnection, name: &str) -> Vec<String> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let conns = connections(raw, name).await;
        if conns.iter().any(|c| c.contains(" cmd=blpop ")) {
            return conns;
        }
        assert!(
            Instant::now() < until,
            "no waiting connection pops: {conns:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn id_of(line: &str) -> i64 {
    line.split(' ')
        .find_map(|f| f.strip_prefix("id="))
        .unwrap()
        .parse()
        .unwrap()
}

fn name_of(client: &LockClient) -> String {
    format!("redis-lock-client:{}", client.id())
}

/// The number of waiters `LOCK.INFO key` reports (0 when the key is free).
async fn waiters(raw: &mut MultiplexedConnection, key: &str) -> i64 {
    let info: Value = redis::cmd("LOCK.INFO")
        .arg(key)
        .query_async(raw)
        .await
        .unwrap();
    let Value::Array(fields) = info else { return 0 };
    let mut it = fields.iter();
    while let Some(f) = it.next() {
        let v = it.next();
        if matches!(f, Value::BulkString(b) if b == b"waiters") {
            if let Some(Value::Int(n)) = v {
                return *n;
            }
        }
    }
    0
}

/// Waits (bounded) until `LOCK.INFO key` counts `n` waiters.
async fn until_waiters(raw: &mut MultiplexedConnection, key: &str, n: i64) {
    let until = Instant::now() + Duration::from_secs(10);
    while waiters(raw, key).await != n {
        assert!(Instant::now() < until, "{n} waiters never queued on {key}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether `key` is free (`LOCK.INFO` nil or no holder).
async fn is_free(raw: &mut MultiplexedConnection, key: &str) -> bool {
    let info: Value = redis::cmd("LOCK.INFO")
        .arg(key)
        .query_async(raw)
        .await
        .unwrap();
    match info {
        Value::Nil => true,
        Value::Array(fields) => {
            let mut it = fields.iter();
            while let Some(f) = it.next() {
                let v = it.next();
                if matches!(f, Value::BulkString(b) if b == b"holders") {
                    return matches!(v, Some(Value::Array(h)) if h.is_empty())
                        || matches!(v, Some(Value::Map(h)) if h.is_empty());
                }
            }
            false
        }
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_waits_with_a_ticket_by_default() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let client = client_of(&server, None).await;
    let mut held = client.lock("k").acquire().await.unwrap();
    let waiter = client.lock("k").wait_timeout(Duration::from_secs(20));
    let task = tokio::spawn(async move { waiter.acquire().await });
    until_waiters(&mut raw, "k", 1).await;
    assert_eq!(stat(&mut raw, "lock_waits_ticketed").await, 1);
    let name = name_of(&client);
    let conns = until_popping(&mut raw, &name).await;
    assert!(
        !conns
            .iter()
            .any(|c| c.contains(" cmd=lock.acquire ") && c.contains(" flags=b")),
        "no connection blocks in LOCK.ACQUIRE: {conns:?}"
    );
    held.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("granted")
        .unwrap()
        .expect("granted");
    assert!(guard.token() > held.token());
    assert_eq!(stat(&mut raw, "lock_tickets").await, 0);
    // The waiting connection closes when no ticket waits.
    let until = Instant::now() + Duration::from_secs(10);
    while connections(&mut raw, &name).await.len() > 1 {
        assert!(
            Instant::now() < until,
            "the idle waiting connection stays open"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tickets_a_wait_blocks_on_a_connection_of_its_own() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let client = client_of(&server, Some(false)).await;
    let mut held = client.lock("k").acquire().await.unwrap();
    let waiter = client.lock("k").wait_timeout(Duration::from_secs(20));
    let task = tokio::spawn(async move { waiter.acquire().await });
    until_waiters(&mut raw, "k", 1).await;
    assert_eq!(stat(&mut raw, "lock_waits_ticketed").await, 0);
    let conns = connections(&mut raw, &name_of(&client)).await;
    assert!(
        conns.iter().any(|c| c.contains(" cmd=lock.acquire ")),
        "{conns:?}"
    );
    held.release().await.unwrap();
    let guard = task.await.unwrap().expect("granted");
    assert!(guard.token() > held.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waits_of_one_client_share_one_waiting_connection() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let client = client_of(&server, None).await;
    let holder = client_of(&server, Some(false)).await;
    let mut held = Vec::new();
    for i in 0..8 {
        held.push(holder.lock(format!("k{i}")).acquire().await.unwrap());
    }
    // Eight waits, four of them on one key and one on each of four others.
    let mut tasks = Vec::new();
    for i in 0..8 {
        let key = if i < 4 {
            "k0".to_string()
        } else {
            format!("k{i}")
        };
        let lock = client.lock(key).wait_timeout(Duration::from_secs(30));
        tasks.push(tokio::spawn(async move {
            let mut guard = lock.acquire().await?;
            guard.release().await
        }));
    }
    until_waiters(&mut raw, "k0", 4).await;
    for i in 4..8 {
        until_waiters(&mut raw, &format!("k{i}"), 1).await;
    }
    assert_eq!(stat(&mut raw, "lock_waits_ticketed").await, 8);
    let conns = until_popping(&mut raw, &name_of(&client)).await;
    // The shared connection and one waiting connection, whatever the number of waits.
    assert_eq!(conns.len(), 2, "{conns:?}");
    assert_eq!(
        conns.iter().filter(|c| c.contains(" cmd=blpop ")).count(),
        1,
        "{conns:?}"
    );
    for mut guard in held {
        guard.release().await.unwrap();
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("granted")
            .unwrap()
            .expect("granted and released");
    }
}

/// The number of keys each `BLPOP` in the slow log named (the log keeps 32 arguments, the last
/// saying how many more there were).
async fn blpop_key_counts(raw: &mut MultiplexedConnection) -> Vec<usize> {
    let entries: Value = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query_async(raw)
        .await
        .unwrap();
    let Value::Array(entries) = entries else {
        panic!("SLOWLOG GET answered {entries:?}")
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).to_string(),
        Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    };
    let mut counts = Vec::new();
    for entry in entries {
        let Value::Array(fields) = entry else {
            continue;
        };
        let Some(Value::Array(args)) = fields.get(3) else {
            continue;
        };
        if args.first().map(text).map(|a| a.to_uppercase()) != Some("BLPOP".into()) {
            continue;
        }
        let mut argc = args.len();
        let last = args.last().map(text).unwrap_or_default();
        if let Some(more) = last
            .strip_prefix("... (")
            .and_then(|m| m.strip_suffix(" more arguments)"))
        {
            argc = args.len() - 1 + more.parse::<usize>().unwrap();
        }
        // BLPOP and its timeout.
        counts.push(argc - 2);
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_250_pop_on_three_connections_of_at_most_100_tickets_in_arrival_order() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    for (name, value) in [
        ("slowlog-log-slower-than", "0"),
        ("slowlog-max-len", "1000000"),
    ] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query_async(&mut raw)
            .await
            .unwrap();
    }
    let _: () = redis::cmd("SLOWLOG")
        .arg("RESET")
        .query_async(&mut raw)
        .await
        .unwrap();
    let client = client_of(&server, None).await;
    let holder = client_of(&server, Some(false)).await;
    let mut held = holder.lock("k").acquire().await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..250 {
        let lock = client.lock("k").wait_timeout(Duration::from_secs(120));
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let mut guard = lock.acquire().await.unwrap();
            order.lock().unwrap().push(i);
            guard.release().await.unwrap();
        }));
        until_waiters(&mut raw, "k", i + 1).await;
    }
    assert_eq!(stat(&mut raw, "lock_waits_ticketed").await, 250);
    // The shared connection and three waiting connections (100, 100 and 50 tickets).
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let conns = connections(&mut raw, &name_of(&client)).await;
        let popping = conns.iter().filter(|c| c.contains(" cmd=blpop ")).count();
        if popping == 3 {
            assert_eq!(conns.len(), 4, "{conns:?}");
            break;
        }
        assert!(Instant::now() < until, "{popping} BLPOPs: {conns:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held.release().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("every waiter served")
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..250).collect::<Vec<i64>>());
    let counts = blpop_key_counts(&mut raw).await;
    assert_eq!(counts.iter().max(), Some(&100), "{counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticket_waits_are_granted_in_arrival_order() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let client = client_of(&server, None).await;
    let mut held = client.lock("k").acquire().await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let lock = client.lock("k").wait_timeout(Duration::from_secs(30));
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let mut guard = lock.acquire().await.unwrap();
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await.unwrap();
        }));
        until_waiters(&mut raw, "k", i + 1).await;
    }
    assert_eq!(stat(&mut raw, "lock_waits_ticketed").await, 5);
    held.release().await.unwrap();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("every waiter served")
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_release_wakes_one_ticket_waiter() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let client = client_of(&server, None).await;
    let inside = Arc::new(AtomicU64::new(0));
    let sections = Arc::new(AtomicU64::new(0));
    let blpops_before = calls(&mut raw, "blpop").await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let lock = client.lock("k").lease(Duration::from_secs(10));
        let (inside, sections) = (inside.clone(), sections.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..50 {
                let mut guard = lock.acquire().await.unwrap();
                assert_eq!(
                    inside.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                tokio::task::yield_now().await;
                inside.fetch_sub(1, Ordering::SeqCst);
                sections.fetch_add(1, Ordering::SeqCst);
                guard.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(120), task)
            .await
            .expect("the sections end")
            .unwrap();
    }
    assert_eq!(sections.load(Ordering::SeqCst), 400);
    let ticketed = stat(&mut raw, "lock_waits_ticketed").await;
    assert!(ticketed > 0, "some acquires had to wait");
    assert_eq!(stat(&mut raw, "lock_tickets").await, 0);
    assert_eq!(calls(&mut raw, "lock.cancel").await, 0, "no wait gave up");
    // Every ticket is popped once; a BLPOP answered nil (interrupted to add a ticket) is sent
    // again, so there are fewer than three BLPOPs per ticket: no waiter is woken for nothing.
    let blpops = calls(&mut raw, "blpop").await - blpops_before;
    assert!(
        blpops >= ticketed as u64 && blpops <= 3 * ticketed as u64,
        "{blpops} BLPOPs for {ticketed} tickets"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_wait_times_out_and_leaves_nothing() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let client = client_of(&server, None).await;
    let _held = client.lock("k").acquire().await.unwrap();
    let start = Instant::now();
    let err = client
        .lock("k")
        .wait_timeout(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(stat(&mut raw, "lock_waits_ticketed").await, 1);
    assert_eq!(waiters(&mut raw, "k").await, 0);
    assert_eq!(stat(&mut raw, "lock_tickets").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_ticket_wait_is_withdrawn() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let client = client_of(&server, None).await;
    let mut held = client.lock("k").acquire().await.unwrap();
    let waiter = client.lock("k");
    let gave_up = tokio::time::timeout(Duration::from_millis(300), waiter.acquire()).await;
    assert!(gave_up.is_err(), "still waiting when dropped");
    let until = Instant::now() + Duration::from_secs(5);
    while calls(&mut raw, "lock.cancel").await != 1 {
        assert!(Instant::now() < until, "the ticket is withdrawn");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(waiters(&mut raw, "k").await, 0);
    held.release().await.unwrap();
    assert!(is_free(&mut raw, "k").await, "nobody was granted the key");
    // The handle acquires again at once.
    assert!(waiter.try_acquire().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_given_up_as_it_is_granted_gets_the_grant_once() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let client = client_of(&server, None).await;
    let holder = client_of(&server, Some(false)).await;
    let mut won = 0;
    for round in 0..24u64 {
        let mut held = holder.lock("k").acquire().await.unwrap();
        let waiter = client.lock("k");
        let give_up = Duration::from_millis(100 + (round % 8) * 2);
        let task =
            tokio::spawn(async move { tokio::time::timeout(give_up, waiter.acquire()).await });
        until_waiters(&mut raw, "k", 1).await;
        // Released about when the waiter gives up: the grant goes to the pop or to the
        // cancel, and whoever takes it without a caller releases it.
        tokio::time::sleep(Duration::from_millis(60 + (round % 5) * 10)).await;
        held.release().await.unwrap();
        match task.await.unwrap() {
            Ok(Ok(mut guard)) => {
                won += 1;
                guard.release().await.unwrap();
            }
            Ok(Err(e)) => panic!("{e:?}"),
            Err(_) => {}
        }
        // Free again soon, in every case: no grant is left with nobody.
        let until = Instant::now() + Duration::from_secs(5);
        while !is_free(&mut raw, "k").await {
            assert!(Instant::now() < until, "round {round}: a grant leaked");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert_eq!(stat(&mut raw, "lock_waits_ticketed").await, 24);
    assert_eq!(stat(&mut raw, "lock_tickets").await, 0);
    eprintln!("{won} of 24 waiters got the lock");
}

/// Kills the client's connection that is (`blpop`) or is not its waiting connection, while a
/// ticket waits; the wait still ends with the lock.
async fn killed_connection_while_a_ticket_waits(waiting_one: bool) {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let client = client_of(&server, None).await;
    let holder = client_of(&server, Some(false)).await;
    let mut held = holder.lock("k").acquire().await.unwrap();
    let waiter = client.lock("k").wait_timeout(Duration::from_secs(30));
    let owner = waiter.owner().to_string();
    let task = tokio::spawn(async move { waiter.acquire().await });
    until_waiters(&mut raw, "k", 1).await;
    let name = name_of(&client);
    let until = Instant::now() + Duration::from_secs(5);
    let victim = loop {
        let conns = connections(&mut raw, &name).await;
        let found = conns
            .iter()
            .find(|c| c.contains(" cmd=blpop ") == waiting_one);
        if conns.len() == 2 {
            if let Some(c) = found {
                break id_of(c);
            }
        }
        assert!(Instant::now() < until, "{conns:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(victim)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(killed, 1);
    if !waiting_one {
        // The server dropped the ticket with its asking connection; the library asks again.
        let until = Instant::now() + Duration::from_secs(10);
        while stat(&mut raw, "lock_waits_ticketed").await < 2 {
            assert!(Instant::now() < until, "the acquire is asked again");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    until_waiters(&mut raw, "k", 1).await;
    held.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the wait ends")
        .unwrap()
        .expect("granted");
    let holders: Value = redis::cmd("LOCK.CHECK")
        .arg("k")
        .arg(&owner)
        .arg(guard.token())
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(holders, Value::Int(1), "the guard's hold is the server's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_asking_connection_makes_the_wait_ask_again() {
    killed_connection_while_a_ticket_waits(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_waiting_connection_is_replaced() {
    killed_connection_while_a_ticket_waits(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_key_acquire_waits_with_a_ticket() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let client = client_of(&server, None).await;
    let mut held = client.lock("{s}:b").acquire().await.unwrap();
    let waiter = client
        .multi_lock(["{s}:a", "{s}:b"])
        .wait_timeout(Duration::from_secs(20));
    let task = tokio::spawn(async move { waiter.acquire().await });
    until_waiters(&mut raw, "{s}:b", 1).await;
    assert_eq!(stat(&mut raw, "lock_waits_ticketed").await, 1);
    held.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("granted")
        .unwrap()
        .expect("granted");
    assert_eq!(guard.tokens().len(), 2);
    assert!(!is_free(&mut raw, "{s}:a").await && !is_free(&mut raw, "{s}:b").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_waits_with_a_ticket() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let client = client_of(&server, None).await;
    let mut leader = client
        .election("e")
        .not_ephemeral()
        .campaign()
        .await
        .unwrap();
    let candidate = client
        .election("e")
        .not_ephemeral()
        .wait_timeout(Duration::from_secs(20));
    let task = tokio::spawn(async move { candidate.campaign().await });
    until_waiters(&mut raw, "e", 1).await;
    assert_eq!(stat(&mut raw, "lock_waits_ticketed").await, 1);
    leader.resign().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("elected")
        .unwrap()
        .expect("elected");
    assert!(next.epoch() > leader.epoch());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_wait_longer_than_the_lease_is_confirmed_at_the_grant() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let client = client_of(&server, None).await;
    let lease = Duration::from_millis(1_000);
    let mut held = client.lock("k").acquire().await.unwrap();
    let waiter = client.lock("k").lease(lease);
    let task = tokio::spawn(async move { waiter.acquire().await });
    until_waiters(&mut raw, "k", 1).await;
    // A wait of more than 0.9 of the waiter's lease.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(stat(&mut raw, "lock_waits_ticketed").await, 1);
    let renewals = calls(&mut raw, "lock.renew").await;
    held.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("granted")
        .unwrap()
        .expect("granted");
    assert!(
        calls(&mut raw, "lock.renew").await > renewals,
        "confirmed by a renewal before it was handed out"
    );
    // Its deadline counts from the grant: held, not lost, well past a lease from the ask.
    assert!(guard.lost_reason().is_none());
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(guard.lost_reason().is_none(), "{:?}", guard.lost_reason());
    assert!(!is_free(&mut raw, "k").await);
}

/// A client of `server` as `user` (password `pw`), without the lost-hold signal.
async fn client_as(server: &Server, user: &str) -> LockClient {
    let url = server
        .url()
        .replacen("redis://", &format!("redis://{user}:pw@"), 1);
    LockClient::builder(redis::Client::open(url).unwrap())
        .without_lost_signal()
        .build()
        .await
        .unwrap()
}

/// `ACL SETUSER user` with every command but `BLPOP` (`pop`: with it too).
async fn allow_pop(raw: &mut MultiplexedConnection, user: &str, pop: bool) {
    let rule = if pop { "+blpop" } else { "-blpop" };
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(user)
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg(rule)
        .query_async(raw)
        .await
        .unwrap();
}

/// A ticket wait whose client cannot pop (its user may not `BLPOP`, until the test allows it)
/// while the lock is granted with a 300 ms lease: the grant lapses into `expired`. Popped
/// `pop_after` after the ask, within a wait of `wait`.
async fn a_grant_that_lapsed_before_the_pop(
    wait: Duration,
    pop_after: Duration,
) -> (
    Result<redis_lock_client::LockGuard, LockError>,
    MultiplexedConnection,
    String,
    Server,
) {
    let server = Server::start();
    let mut raw = raw(&server).await;
    allow_pop(&mut raw, "waiter", false).await;
    let client = client_as(&server, "waiter").await;
    let holder = client_of(&server, Some(false)).await;
    let mut held = holder.lock("k").acquire().await.unwrap();
    let waiter = client
        .lock("k")
        .lease(Duration::from_millis(300))
        .wait_timeout(wait);
    let owner = waiter.owner().to_string();
    let asked = Instant::now();
    let task = tokio::spawn(async move { waiter.acquire().await });
    until_waiters(&mut raw, "k", 1).await;
    held.release().await.unwrap();
    // Granted into the ticket, nobody pops it: its lease ends and the ticket says `expired`.
    let until = Instant::now() + Duration::from_secs(10);
    while stat(&mut raw, "lock_ticket_grants_lapsed").await < 1 {
        assert!(Instant::now() < until, "the grant lapses");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep_until(asked + pop_after).await;
    allow_pop(&mut raw, "waiter", true).await;
    let acquired = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("the wait ends")
        .unwrap();
    (acquired, raw, owner, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_popped_expired_grant_is_asked_again_while_the_wait_lasts() {
    let (acquired, mut raw, owner, _server) =
        a_grant_that_lapsed_before_the_pop(Duration::from_secs(30), Duration::ZERO).await;
    let guard = acquired.expect("asked again, and granted: the key is free");
    let alive: Value = redis::cmd("LOCK.CHECK")
        .arg("k")
        .arg(&owner)
        .arg(guard.token())
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(alive, Value::Int(1), "the guard's hold is the server's");
    assert_eq!(stat(&mut raw, "lock_ticket_grants_lapsed").await, 1);
    assert_eq!(
        calls(&mut raw, "lock.acquire").await,
        3,
        "holder, ask, ask again"
    );
    assert_eq!(stat(&mut raw, "lock_tickets").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_popped_expired_grant_after_the_wait_is_the_timeout() {
    // Popped after the 1 s wait passed (and before the library gives the ticket up, 2 s later).
    let (acquired, mut raw, _, _server) =
        a_grant_that_lapsed_before_the_pop(Duration::from_secs(1), Duration::from_millis(1_500))
            .await;
    assert!(
        matches!(acquired, Err(LockError::Timeout { .. })),
        "{:?}",
        acquired.map(|g| g.token())
    );
    assert_eq!(calls(&mut raw, "lock.acquire").await, 2, "not asked again");
    assert_eq!(
        calls(&mut raw, "lock.cancel").await,
        0,
        "popped, not withdrawn"
    );
    assert!(is_free(&mut raw, "k").await);
}

/// `LOCK.INFO key`'s `ephemeral`: the id of the connection the hold is bound to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_wait_takes_a_ticket_and_its_hold_dies_with_the_asking_connection() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let client = client_of(&server, None).await;
    let holder = client_of(&server, Some(false)).await;
    let mut held = holder.lock("k").acquire().await.unwrap();
    // Two EPHEMERAL waits (a lock and a campaign): tickets, popped on one waiting connection,
    // nothing blocked in a LOCK.* command.
    let waiter = client
        .lock("k")
        .ephemeral()
        .wait_timeout(Duration::from_secs(20));
    let task = tokio::spawn(async move { waiter.acquire().await });
    let mut leader = holder.election("e").campaign().await.unwrap();
    let candidate = client.election("e").wait_timeout(Duration::from_secs(20));
    let campaign = tokio::spawn(async move { candidate.campaign().await });
    until_waiters(&mut raw, "k", 1).await;
    until_waiters(&mut raw, "e", 1).await;
    assert_eq!(stat(&mut raw, "lock_waits_ticketed").await, 2);
    let name = name_of(&client);
    let conns = until_popping(&mut raw, &name).await;
    assert!(
        !conns
            .iter()
            .any(|c| c.contains(" cmd=lock.") && c.contains(" flags=b")),
        "no connection blocks in a LOCK.* command: {conns:?}"
    );
    assert_eq!(
        conns.iter().filter(|c| c.contains(" cmd=blpop ")).count(),
        1,
        "{conns:?}"
    );
    // Granted: each hold is bound to the connection that asked for it, the guard's own.
    held.release().await.unwrap();
    leader.resign().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("granted")
        .unwrap()
        .expect("granted");
    let leadership = tokio::time::timeout(Duration::from_secs(10), campaign)
        .await
        .expect("elected")
        .unwrap()
        .expect("elected");
    assert!(leadership.epoch() > leader.epoch());
    let id = bound_to(&mut raw, "k").await.expect("an EPHEMERAL hold");
    let asked_on = connections(&mut raw, &name)
        .await
        .into_iter()
        .find(|c| id_of(c) == id)
        .expect("bound to one of the client's connections");
    assert!(asked_on.contains(" cmd=lock.acquire "), "{asked_on}");
    // That connection closes: the hold ends at once, and the guard knows.
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(killed, 1);
    let reason = tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost at once");
    assert_eq!(reason, redis_lock_client::LostReason::ConnectionClosed);
    assert!(is_free(&mut raw, "k").await);
    assert!(
        bound_to(&mut raw, "e").await.is_some(),
        "the leader's hold is EPHEMERAL"
    );
    assert_eq!(stat(&mut raw, "lock_tickets").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_ephemeral_asking_connection_makes_the_wait_ask_again_on_a_new_one() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let client = client_of(&server, None).await;
    let holder = client_of(&server, Some(false)).await;
    let mut held = holder.lock("k").acquire().await.unwrap();
    let waiter = client
        .lock("k")
        .ephemeral()
        .wait_timeout(Duration::from_secs(30));
    let task = tokio::spawn(async move { waiter.acquire().await });
    until_waiters(&mut raw, "k", 1).await;
    let name = name_of(&client);
    // The shared connection (made first), the one the wait asked on, the waiting one (made
    // once the ticket came).
    let conns = until_popping(&mut raw, &name).await;
    let asked_on = conns
        .iter()
        .filter(|c| !c.contains(" cmd=blpop "))
        .map(|c| id_of(c))
        .max()
        .unwrap();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(asked_on)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(killed, 1);
    // The server dropped the ticket with its connection; the library asks again on a new one.
    let until = Instant::now() + Duration::from_secs(10);
    while stat(&mut raw, "lock_waits_ticketed").await < 2 {
        assert!(Instant::now() < until, "the acquire is asked again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until_waiters(&mut raw, "k", 1).await;
    held.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the wait ends")
        .unwrap()
        .expect("granted");
    let id = bound_to(&mut raw, "k").await.expect("an EPHEMERAL hold");
    assert!(id > asked_on, "bound to the new connection");
    let alive: Value = redis::cmd("LOCK.CHECK")
        .arg("k")
        .arg(guard.owner())
        .arg(guard.token())
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(alive, Value::Int(1));
}

/// Review: the group's interrupt (`CLIENT UNBLOCK` of its own `BLPOP`) while writes are paused
/// (`CLIENT PAUSE WRITE`, as every failover does). `BLPOP` is a write: re-sent during the pause it
/// is postponed, and `CLIENT UNBLOCK` of a postponed client kills Redis 7.0 (Debian's 7.0.15:
/// "Guru Meditation: Unknown btype in replyToBlockedClientTimedOut()"). A waiter giving up
/// during the pause is enough: the server goes down with every lock on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_giving_up_during_a_write_pause_do_not_bring_the_server_down() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let client = client_of(&server, Some(true)).await;
    let holder = client_of(&server, Some(false)).await;
    let _held = holder.lock("k").acquire().await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let waiter = client.lock("k").wait_timeout(Duration::from_secs(60));
        tasks.push(tokio::spawn(async move { waiter.acquire().await }));
    }
    until_waiters(&mut raw, "k", 3).await;
    until_popping(&mut raw, &name_of(&client)).await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(8_000)
        .arg("WRITE")
        .query_async(&mut raw)
        .await
        .unwrap();
    // One gives up: the group interrupts its BLPOP (not yet postponed) and sends it again for
    // the two left, which the pause postpones. Then another gives up.
    tasks.remove(0).abort();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    tasks.remove(0).abort();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let mut fresh = super_raw(&server).await;
    let pong: redis::RedisResult<String> = redis::cmd("PING").query_async(&mut fresh).await;
    assert_eq!(pong.ok().as_deref(), Some("PONG"), "the server is down");
    // Nor is the interrupt sent again and again through the pause: each waits for its end.
    let unblocks = calls(&mut fresh, "client|unblock").await;
    eprintln!("{unblocks} CLIENT UNBLOCK calls");
    assert!(
        unblocks < 50,
        "{unblocks} CLIENT UNBLOCK calls during the pause"
    );
    let _: redis::RedisResult<()> = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut raw)
        .await;
}

/// A fresh connection (the shared one may have died with the server).
async fn super_raw(server: &Server) -> MultiplexedConnection {
    match tokio::time::timeout(Duration::from_secs(2), async {
        redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
    })
    .await
    {
        Ok(Ok(con)) => con,
        _ => panic!("the server is down: no connection"),
    }
}

/// A client whose user may not run `command` (`MULTI` or `DEL`) cannot send `CLIENT UNBLOCK` in
/// its fenced transaction: it never sends it at all, and its waiting connection pops with short
/// `BLPOP`s (a second at most), so that a ticket asked while one runs is still popped soon.
async fn a_ticket_asked_while_a_pop_runs_is_popped_without(command: &str) {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("waiter")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg(format!("-{command}"))
        .query_async(&mut raw)
        .await
        .unwrap();
    let client = client_as(&server, "waiter").await;
    let holder = client_of(&server, Some(false)).await;
    let _a = holder.lock("a").acquire().await.unwrap();
    let mut b = holder.lock("b").acquire().await.unwrap();
    // No deadline: the first pop's `BLPOP` would otherwise block until a grant.
    let first = client.lock("a");
    let _first = tokio::spawn(async move { first.acquire().await });
    until_waiters(&mut raw, "a", 1).await;
    until_popping(&mut raw, &name_of(&client)).await;
    let second = client.lock("b");
    let second = tokio::spawn(async move { second.acquire().await });
    until_waiters(&mut raw, "b", 1).await;
    b.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the second ticket is popped although the first pop could not be interrupted")
        .unwrap();
    assert!(granted.is_ok(), "{:?}", granted.map(|g| g.token()));
    assert_eq!(calls(&mut raw, "client|unblock").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_multi_a_ticket_asked_while_a_pop_runs_is_popped_and_nothing_unblocked() {
    a_ticket_asked_while_a_pop_runs_is_popped_without("multi").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_del_a_ticket_asked_while_a_pop_runs_is_popped_and_nothing_unblocked() {
    a_ticket_asked_while_a_pop_runs_is_popped_without("del").await;
}

/// The interrupt's fence (`DEL` of `__lock_fence__unblock{<tag>}`, a key that never exists)
/// changes nothing: no key event, nothing replicated, no key left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_interrupts_fence_raises_no_key_event_and_replicates_nothing() {
    let server = Server::start();
    let replica = Server::replica_of(&server);
    let mut raw = raw(&server).await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("KEA")
        .query_async(&mut raw)
        .await
        .unwrap();
    // Key events about the fence key, collected on a thread while the waits run.
    let mut sub = server.connect();
    let (ready, is_ready) = std::sync::mpsc::channel();
    let events = std::thread::spawn(move || {
        let mut pubsub = sub.as_pubsub();
        pubsub.psubscribe("__key*__:*").unwrap();
        pubsub
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let _ = ready.send(());
        let mut seen = Vec::new();
        let until = std::time::Instant::now() + Duration::from_secs(6);
        while std::time::Instant::now() < until {
            if let Ok(m) = pubsub.get_message() {
                let payload: String = m.get_payload().unwrap_or_default();
                let about = format!("{} {payload}", m.get_channel_name());
                if about.contains("unblock") {
                    seen.push(about);
                }
            }
        }
        seen
    });
    is_ready.recv().unwrap();
    let client = client_of(&server, Some(true)).await;
    let holder = client_of(&server, Some(false)).await;
    let _a = holder.lock("a").acquire().await.unwrap();
    let mut b = holder.lock("b").acquire().await.unwrap();
    let first = client.lock("a");
    let _first = tokio::spawn(async move { first.acquire().await });
    until_waiters(&mut raw, "a", 1).await;
    until_popping(&mut raw, &name_of(&client)).await;
    // A second ticket interrupts the first pop: a fenced `CLIENT UNBLOCK`.
    let second = client.lock("b");
    let second = tokio::spawn(async move { second.acquire().await });
    until_waiters(&mut raw, "b", 1).await;
    b.release().await.unwrap();
    let granted = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the second wait is granted")
        .unwrap();
    assert!(granted.is_ok());
    assert!(calls(&mut raw, "client|unblock").await >= 1);
    assert!(calls(&mut raw, "del").await >= 1, "the fence was sent");
    let fences: Vec<String> = redis::cmd("KEYS")
        .arg("__lock_fence__unblock*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(fences.is_empty(), "{fences:?}");
    let seen = tokio::task::spawn_blocking(move || events.join().unwrap())
        .await
        .unwrap();
    assert!(seen.is_empty(), "key events about the fence: {seen:?}");
    // The same transaction sent by hand moves the replication offset by nothing (tried a few
    // times: the master's own pings to its replica move it now and then).
    let mut replica_raw = super_raw(&replica).await;
    let _: Value = redis::cmd("PING")
        .query_async(&mut replica_raw)
        .await
        .unwrap();
    let offset = |info: String| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("master_repl_offset:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    };
    let mut unchanged = false;
    for _ in 0..3 {
        let before = offset(
            redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut raw)
                .await
                .unwrap(),
        );
        let replies: Vec<Value> = redis::pipe()
            .cmd("MULTI")
            .cmd("DEL")
            .arg("__lock_fence__unblock{b}")
            .cmd("CLIENT")
            .arg("UNBLOCK")
            .arg(1_000_000)
            .cmd("EXEC")
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(
            replies.last(),
            Some(&Value::Array(vec![Value::Int(0), Value::Int(0)]))
        );
        let after = offset(
            redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut raw)
                .await
                .unwrap(),
        );
        if after == before {
            unchanged = true;
            break;
        }
    }
    assert!(unchanged, "the fenced unblock was replicated");
}
