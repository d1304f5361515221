//! The library's lock API on a server WITHOUT the module, as a managed service runs it, with the
//! redislock Functions library (functions/redislock.lua): the backend found per server, the same
//! lock objects (acquire, waits on the unlock message and the holder's lease, the watchdog, a
//! loss seen by a renewal, release, tokens), a clear NotSupported for what the library cannot
//! do, loading the library (load_functions(true)), and tokens rising across both backends on
//! one key. The Python library's tests/test_functions_backend.py, for this crate.

mod support;

use std::time::{Duration, Instant};

use futures_core::Stream;
use lock_testkit::Options;
use redis::aio::MultiplexedConnection;
use redis::Value;
use redis_lock_client::{Backend, LockClient, LockError, LostReason, Release};
use support::{calls, raw, Server};

/// The version of the library this crate speaks (`local VERSION` of redislock.lua).
const VERSION: i64 = 2;
/// The repository's library.
const LIBRARY: &str = include_str!("../../../functions/redislock.lua");
/// A library of the same name whose version is older than any this crate speaks.
const OLD_LIBRARY: &str = "#!lua name=redislock\nredis.register_function{ function_name = 'lock_version', callback = function() return 0 end, flags = { 'no-writes' } }\n";

/// A plain redis-server, no module (`loaded`: with the library loaded).
async fn start(loaded: bool) -> (Server, MultiplexedConnection) {
    let server = Server::start_options(&Options {
        without_module: true,
        ..Options::default()
    });
    let mut conn = raw(&server).await;
    if loaded {
        load(&mut conn, LIBRARY).await;
    }
    (server, conn)
}

async fn load(conn: &mut MultiplexedConnection, library: &str) {
    let name: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(library)
        .query_async(conn)
        .await
        .expect("FUNCTION LOAD");
    assert_eq!(name, "redislock");
}

async fn client(server: &Server) -> LockClient {
    LockClient::open(&server.url()).await.expect("client")
}

async fn loading_client(server: &Server) -> LockClient {
    LockClient::builder(redis::Client::open(server.url()).expect("url"))
        .load_functions(true)
        .build()
        .await
        .expect("client")
}

/// One field of the library's `lock_info` (RESP2 flat array), or None when the lock is free.
async fn info_field(conn: &mut MultiplexedConnection, key: &str, field: &str) -> Option<Value> {
    let reply: Value = redis::cmd("FCALL_RO")
        .arg("lock_info")
        .arg(1)
        .arg(key)
        .query_async(conn)
        .await
        .expect("lock_info");
    let Value::Array(items) = reply else {
        return None;
    };
    items.chunks(2).find_map(|pair| match pair {
        [Value::BulkString(name), value] if name == field.as_bytes() => Some(value.clone()),
        _ => None,
    })
}

async fn version(conn: &mut MultiplexedConnection) -> i64 {
    redis::cmd("FCALL_RO")
        .arg("lock_version")
        .arg(0)
        .query_async(conn)
        .await
        .expect("lock_version")
}

/// `CLIENT LIST` lines of connections subscribed to a channel (`sub` or `ssub` not 0).
async fn subscribed(conn: &mut MultiplexedConnection) -> Vec<String> {
    let listed: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(conn)
        .await
        .expect("CLIENT LIST");
    listed
        .lines()
        .filter(|l| !(l.contains(" sub=0 ") && l.contains(" ssub=0 ")))
        .map(str::to_string)
        .collect()
}

/// Waits (bounded) until nothing is subscribed.
async fn wait_unsubscribed(conn: &mut MultiplexedConnection) {
    let until = Instant::now() + Duration::from_secs(5);
    while !subscribed(conn).await.is_empty() {
        assert!(
            Instant::now() < until,
            "still subscribed: {:?}",
            subscribed(conn).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn not_supported<T: std::fmt::Debug>(result: Result<T, LockError>, what: &str) {
    match result {
        Err(LockError::NotSupported(message)) => {
            assert!(message.contains(what), "{message}");
        }
        other => panic!("{what}: {other:?}"),
    }
}

// -- the backend -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_is_found_per_server() {
    let (server, _conn) = start(true).await;
    let on_functions = client(&server).await;
    let backend = on_functions.backend().await.expect("backend");
    assert_eq!(backend, Backend::Functions);
    assert!(!backend.supports_ephemeral());
    let module_server = Server::start();
    let on_module = client(&module_server).await;
    let backend = on_module.backend().await.expect("backend");
    assert_eq!(backend, Backend::Module);
    assert!(backend.supports_ephemeral());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_either_is_refused_with_what_to_do() {
    let (server, mut conn) = start(false).await;
    let client = client(&server).await;
    not_supported(client.lock("k").try_acquire().await, "load_functions(true)");
    not_supported(
        client.lock("k").try_acquire().await,
        "neither the LOCK.* module nor the redislock Functions library",
    );
    not_supported(client.backend().await, "load_functions(true)");
    let listed: Vec<Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .query_async(&mut conn)
        .await
        .expect("FUNCTION LIST");
    assert!(listed.is_empty());
    let exists: i64 = redis::cmd("EXISTS")
        .arg("k")
        .query_async(&mut conn)
        .await
        .expect("EXISTS");
    assert_eq!(exists, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_functions_loads_the_library() {
    let (server, mut conn) = start(false).await;
    let client = loading_client(&server).await;
    let mut guard = client.lock("k").acquire().await.expect("acquire");
    assert_eq!(client.backend().await.expect("backend"), Backend::Functions);
    assert_eq!(guard.release().await.expect("release"), Release::Released);
    assert_eq!(version(&mut conn).await, VERSION);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_library_is_refused_or_replaced() {
    let (server, mut conn) = start(false).await;
    load(&mut conn, OLD_LIBRARY).await;
    not_supported(
        client(&server).await.lock("k").try_acquire().await,
        "redislock library version 0",
    );
    let guard = loading_client(&server)
        .await
        .lock("k")
        .acquire()
        .await
        .expect("acquire");
    assert!(guard.token() > 0);
    assert_eq!(version(&mut conn).await, VERSION);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_library_flushed_under_a_hold_is_loaded_again() {
    // FUNCTION FLUSH answers the next FCALL "Function not found": the backend is found again
    // (and, with load_functions, the library loaded again) and the command sent once more.
    let (server, mut conn) = start(false).await;
    let client = loading_client(&server).await;
    let mut guard = client.lock("k").acquire().await.expect("acquire");
    let _: Value = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .expect("FUNCTION FLUSH");
    assert_eq!(guard.release().await.expect("release"), Release::Released);
    assert_eq!(info_field(&mut conn, "k", "owner").await, None);
}

// -- what works --------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_reenter_renew_release() {
    let (server, mut conn) = start(true).await;
    let client = client(&server).await;
    let lock = client.lock("k").lease(Duration::from_millis(600));
    let mut guard = lock.acquire().await.expect("acquire");
    assert_eq!(
        info_field(&mut conn, "k", "owner").await,
        Some(Value::BulkString(lock.owner().as_bytes().to_vec()))
    );
    assert_eq!(
        info_field(&mut conn, "k", "token").await,
        Some(Value::Int(guard.token() as i64))
    );
    {
        // Re-entry: the same hold (ONCE: counted by the handle, not the server).
        let mut inner = lock.acquire().await.expect("re-entry");
        assert_eq!(inner.token(), guard.token());
        assert_eq!(
            info_field(&mut conn, "k", "count").await,
            Some(Value::Int(1))
        );
        assert_eq!(inner.release().await.expect("release"), Release::StillHeld);
    }
    assert!(client.lock("k").try_acquire().await.expect("try").is_none());
    // The watchdog renews it past its lease (every 0.2 s).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(guard.lost_reason(), None);
    match info_field(&mut conn, "k", "ttl").await {
        Some(Value::Int(ttl)) => assert!(0 < ttl && ttl <= 600, "{ttl}"),
        other => panic!("{other:?}"),
    }
    // No lost-hold signal here: the client listens to nothing.
    assert!(subscribed(&mut conn).await.is_empty());
    assert_eq!(guard.release().await.expect("release"), Release::Released);
    assert_eq!(
        guard.release().await.expect("release"),
        Release::AlreadyReleased
    );
    assert_eq!(info_field(&mut conn, "k", "owner").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_across_releases() {
    let (server, mut conn) = start(true).await;
    let a = client(&server).await;
    let b = client(&server).await;
    let mut tokens = Vec::new();
    for client in [&a, &a, &b, &a] {
        let mut guard = client.lock("k").acquire().await.expect("acquire");
        tokens.push(guard.token());
        guard.release().await.expect("release");
    }
    let _: i64 = redis::cmd("DEL")
        .arg("k")
        .query_async(&mut conn)
        .await
        .expect("DEL");
    tokens.push(a.lock("k").acquire().await.expect("acquire").token());
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_granted_promptly_after_the_release() {
    // Two clients: the waiter listens to the unlock message and asks again when it comes (not
    // by polling: a handful of FCALLs over the whole hold).
    let (server, mut conn) = start(true).await;
    let a = client(&server).await;
    let b = client(&server).await;
    let mut held = a.lock("k").acquire().await.expect("acquire");
    let before = calls(&mut conn, "fcall").await;
    let waiter = tokio::spawn(async move {
        let guard = b
            .lock("k")
            .wait_timeout(Duration::from_secs(10))
            .acquire()
            .await
            .expect("granted");
        (Instant::now(), guard.token())
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiter.is_finished());
    assert_eq!(subscribed(&mut conn).await.len(), 1);
    let released = Instant::now();
    held.release().await.expect("release");
    let (granted, token) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("in time")
        .expect("waiter");
    assert!(token > held.token());
    // Measured: a few ms on a loaded two-core machine; bound 0.3 s.
    let after = granted.duration_since(released);
    assert!(after < Duration::from_millis(300), "{after:?}");
    // Its acquires (before, and once released), the release, and the guard's own release
    // when it dropped: no polling (FCALL_RO lock_info is counted apart).
    let fcalls = calls(&mut conn, "fcall").await - before;
    eprintln!("granted {after:?} after the release; {fcalls} FCALLs over the wait");
    assert!(fcalls <= 8, "{fcalls} FCALLs");
    wait_unsubscribed(&mut conn).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_ends_at_its_deadline_and_a_dropped_wait_unsubscribes() {
    let (server, mut conn) = start(true).await;
    let client = client(&server).await;
    let _held = client.lock("k").acquire().await.expect("acquire");
    let start = Instant::now();
    match client
        .lock("k")
        .wait_timeout(Duration::from_millis(500))
        .acquire()
        .await
    {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("{other:?}"),
    }
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_millis(2500),
        "{waited:?}"
    );
    wait_unsubscribed(&mut conn).await;
    // A wait whose future is dropped closes its subscription with it.
    let lock = client.lock("k");
    let waiting = tokio::spawn(async move { lock.acquire().await.map(|g| g.token()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(subscribed(&mut conn).await.len(), 1);
    waiting.abort();
    let _ = waiting.await;
    wait_unsubscribed(&mut conn).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_granted_when_the_holders_lease_ends() {
    // Nothing is published when a lease ends: the waiter asks again at the holder's lease end,
    // which it read.
    let (server, _conn) = start(true).await;
    let client = client(&server).await;
    let held = client
        .lock("k")
        .fixed_lease(Duration::from_millis(500))
        .acquire()
        .await
        .expect("acquire");
    let start = Instant::now();
    let guard = client
        .lock("k")
        .wait_timeout(Duration::from_secs(5))
        .acquire()
        .await
        .expect("granted");
    let waited = start.elapsed();
    assert!(guard.token() > held.token());
    // The lease had under 0.5 s left: asked again right after it.
    assert!(waited < Duration::from_millis(2500), "{waited:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_or_forced_lock_is_reported_lost_by_the_renewal() {
    let (server, mut conn) = start(true).await;
    let client = client(&server).await;
    let mut guard = client
        .lock("k")
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .expect("acquire");
    let _: i64 = redis::cmd("DEL")
        .arg("k")
        .query_async(&mut conn)
        .await
        .expect("DEL");
    let reason = tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lost in time");
    assert_eq!(reason, LostReason::HoldGone);
    match guard.release().await {
        Err(LockError::NotHeld { .. }) => {}
        other => panic!("{other:?}"),
    }
    // A forced release wakes a waiter, and the holder's renewal reports the loss.
    let guard = client
        .lock("f")
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .expect("acquire");
    let other = client.lock("f").wait_timeout(Duration::from_secs(10));
    let waiter = tokio::spawn(async move { other.acquire().await.map(|g| g.token()) });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let forced: i64 = redis::cmd("FCALL")
        .arg("lock_forcerelease")
        .arg(1)
        .arg("f")
        .query_async(&mut conn)
        .await
        .expect("lock_forcerelease");
    assert_eq!(forced, 1);
    let token = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("in time")
        .expect("waiter")
        .expect("granted");
    assert!(token > guard.token());
    let reason = tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lost in time");
    assert_eq!(reason, LostReason::HoldGone);
}

// -- what is refused ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_library_cannot_do_is_refused_before_anything_is_sent() {
    let (server, mut conn) = start(true).await;
    let client = client(&server).await;
    assert_eq!(client.backend().await.expect("backend"), Backend::Functions);
    let before = calls(&mut conn, "fcall").await;
    let words = "need the LOCK.* module";
    not_supported(client.read_lock("k").acquire().await, "shared (read) holds");
    not_supported(client.semaphore("k", 3).try_acquire().await, "semaphores");
    not_supported(
        client.multi_lock(["k", "k:b"]).acquire().await,
        "multi-key locks",
    );
    not_supported(
        client.lock("k").ephemeral().acquire().await,
        "EPHEMERAL holds",
    );
    not_supported(client.lock("k").ephemeral().try_acquire().await, words);
    not_supported(client.election("k").try_campaign().await, "elections");
    not_supported(client.election("k").leader().await, "elections");
    // The observer's stream ends at once.
    let mut observer = client.election("k").observe();
    let next = std::future::poll_fn(|cx| std::pin::Pin::new(&mut observer).poll_next(cx));
    let ended = tokio::time::timeout(Duration::from_secs(5), next)
        .await
        .expect("in time");
    assert!(ended.is_none());
    assert_eq!(calls(&mut conn, "fcall").await, before);
    let signalled = LockClient::builder(redis::Client::open(server.url()).expect("url"))
        .listen_for_lost_signal()
        .build()
        .await
        .expect("client");
    not_supported(
        signalled.lock("k").acquire().await,
        "the lost-hold signal (listen_for_lost_signal",
    );
    let exists: i64 = redis::cmd("EXISTS")
        .arg("k")
        .query_async(&mut conn)
        .await
        .expect("EXISTS");
    assert_eq!(exists, 0);
    let guard = client.lock("k").acquire().await.expect("acquire");
    let mut set = redis::cmd("SET");
    set.arg("k:data").arg("x");
    not_supported(
        guard.fenced::<Value>(&set).await,
        "fenced commands (LockGuard::fenced)",
    );
    assert_eq!(guard.lost_reason(), None);
    let exists: i64 = redis::cmd("EXISTS")
        .arg("k:data")
        .query_async(&mut conn)
        .await
        .expect("EXISTS");
    assert_eq!(exists, 0);
}

// -- a managed service's user ------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_services_user() {
    // `+@all -@dangerous` (no MODULE, CONFIG, DEBUG, ...), the library loaded by the service.
    let (server, mut conn) = start(true).await;
    let _: Value = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "managed",
            "on",
            ">pw",
            "~*",
            "&*",
            "+@all",
            "-@dangerous",
        ])
        .query_async(&mut conn)
        .await
        .expect("ACL SETUSER");
    for refused in [
        &["MODULE", "LIST"][..],
        &["CONFIG", "GET", "maxmemory"],
        &["DEBUG", "SLEEP", "0"],
    ] {
        let verdict: String = redis::cmd("ACL")
            .arg("DRYRUN")
            .arg("managed")
            .arg(refused)
            .query_async(&mut conn)
            .await
            .expect("ACL DRYRUN");
        assert!(verdict.contains("no permissions"), "{refused:?}: {verdict}");
    }
    let url = format!("redis://managed:pw@127.0.0.1:{}/", server.port);
    let a = LockClient::open(&url).await.expect("client");
    let b = LockClient::open(&url).await.expect("client");
    assert_eq!(a.backend().await.expect("backend"), Backend::Functions);
    let mut held = a
        .lock("k")
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .expect("acquire");
    let lock = b.lock("k").wait_timeout(Duration::from_secs(10));
    let waiter = tokio::spawn(async move { lock.acquire().await.map(|g| g.token()) });
    tokio::time::sleep(Duration::from_secs(1)).await; // renewed meanwhile
    assert_eq!(held.lost_reason(), None);
    assert!(!waiter.is_finished());
    held.release().await.expect("release");
    let token = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("in time")
        .expect("waiter")
        .expect("granted");
    assert!(token > held.token());
}

// -- both backends on one key ------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_when_the_module_and_the_library_take_turns_on_one_key() {
    // A server with the module and the library: this client speaks the module (found first);
    // the library's FCALLs on the same key alternate with it, each side sees the other's
    // hold, and every token is above the last, whichever side granted it.
    let server = Server::start();
    let mut conn = raw(&server).await;
    load(&mut conn, LIBRARY).await;
    let client = client(&server).await;
    assert_eq!(client.backend().await.expect("backend"), Backend::Module);
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let mut guard = client.lock("k").acquire().await.expect("acquire");
        tokens.push(guard.token());
        guard.release().await.expect("release");
        let token: i64 = redis::cmd("FCALL")
            .arg("lock_acquire")
            .arg(1)
            .arg("k")
            .arg("script")
            .arg(10_000)
            .query_async(&mut conn)
            .await
            .expect("lock_acquire");
        tokens.push(u64::try_from(token).expect("a token"));
        assert!(client.lock("k").try_acquire().await.expect("try").is_none());
        let _: Value = redis::cmd("FCALL")
            .arg("lock_release")
            .arg(1)
            .arg("k")
            .arg("script")
            .query_async(&mut conn)
            .await
            .expect("lock_release");
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

// -- a cluster ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_the_module_gets_the_library_on_each_master_at_first_use() {
    // Three masters without the module or the library: each gets it loaded (load_functions)
    // when the client first sends a lock command there; locks, a wait across two clients (the
    // unlock message is published cluster-wide) and releases work on every master.
    let cluster = lock_testkit::Cluster::start_without_module(3);
    let mut node_keys: Vec<Option<String>> = vec![None; cluster.nodes.len()];
    for i in 0..1000 {
        let key = format!("orders:{i}");
        let port = cluster.node_for_slot(support::key_slot(&key)).port;
        if let Some(at) = cluster.nodes.iter().position(|n| n.port == port) {
            node_keys[at].get_or_insert(key);
        }
        if node_keys.iter().all(Option::is_some) {
            break;
        }
    }
    let node_keys: Vec<String> = node_keys.into_iter().map(|k| k.expect("a key")).collect();
    let a = LockClient::cluster_builder(cluster.urls())
        .expect("builder")
        .load_functions(true)
        .build()
        .await
        .expect("client");
    let b = LockClient::cluster(cluster.urls()).await.expect("client");
    match a.backend().await {
        Err(LockError::InvalidArgument(_)) => {}
        other => panic!("{other:?}"),
    }
    let mut first = a.lock(&node_keys[0]).acquire().await.expect("acquire");
    let mut loaded = Vec::new();
    for node in &cluster.nodes {
        let listed: Vec<Value> = redis::cmd("FUNCTION")
            .arg("LIST")
            .query_async(&mut raw(node).await)
            .await
            .expect("FUNCTION LIST");
        loaded.push(!listed.is_empty());
    }
    assert_eq!(loaded, [true, false, false], "only the master asked so far");
    for key in &node_keys {
        assert_eq!(
            a.backend_of(key).await.expect("backend"),
            Backend::Functions
        );
    }
    for node in &cluster.nodes {
        assert_eq!(version(&mut raw(node).await).await, VERSION);
    }
    for key in &node_keys[1..] {
        let mut guard = a
            .lock(key)
            .lease(Duration::from_millis(600))
            .acquire()
            .await
            .expect("acquire");
        let lock = b.lock(key).wait_timeout(Duration::from_secs(10));
        let waiter = tokio::spawn(async move { lock.acquire().await.map(|g| g.token()) });
        tokio::time::sleep(Duration::from_secs(1)).await; // renewed meanwhile
        assert_eq!(guard.lost_reason(), None);
        assert!(!waiter.is_finished());
        guard.release().await.expect("release");
        let token = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("in time")
            .expect("waiter")
            .expect("granted");
        assert!(token > guard.token());
    }
    assert_eq!(first.release().await.expect("release"), Release::Released);
}
