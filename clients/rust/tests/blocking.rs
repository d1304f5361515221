//! The blocking API against a real redis-server with the module loaded (one per test): plain
//! threads, no runtime of the test's own.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use redis::{Connection, Value};
use redis_lock_client::blocking::LockClient;
use redis_lock_client::{LockError, LostReason, Release};
use support::Server;

fn connect(server: &Server) -> Connection {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

fn info(con: &mut Connection, key: &str) -> Value {
    redis::cmd("LOCK.INFO")
        .arg(key)
        .query(con)
        .expect("LOCK.INFO")
}

fn calls(con: &mut Connection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(con)
        .expect("INFO");
    support::calls_in(&info, command)
}

#[test]
fn acquire_excludes_and_dropping_the_guard_releases_before_it_returns() {
    let server = Server::start();
    let mut raw = connect(&server);
    let client = LockClient::open(&server.url()).unwrap();
    let a = client.lock("k");
    let b = client.lock("k");
    let guard = a.acquire().unwrap();
    assert!(guard.token() > 0);
    assert!(b.try_acquire().unwrap().is_none(), "busy → None");
    drop(guard);
    // No background task to wait for: the drop waited for the release's answer.
    assert_eq!(info(&mut raw, "k"), Value::Nil);
    let mut again = b.try_acquire().unwrap().expect("free after the drop");
    assert_eq!(again.release().unwrap(), Release::Released);
    assert_eq!(again.release().unwrap(), Release::AlreadyReleased);
}

#[test]
fn acquire_waits_in_the_server_and_times_out() {
    let server = Server::start();
    let client = LockClient::open(&server.url()).unwrap();
    let held = client.lock("k").acquire().unwrap();
    let waiter = client.lock("k").wait_timeout(Duration::from_millis(300));
    let err = waiter.acquire().unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    let waiter = client.lock("k").wait_timeout(Duration::from_secs(10));
    let granted = thread::spawn(move || waiter.acquire().map(|g| g.token()));
    thread::sleep(Duration::from_millis(200));
    let first = held.token();
    drop(held);
    let token = granted.join().unwrap().expect("granted on release");
    assert!(token > first);
}

#[test]
fn the_watchdog_renews_while_the_calling_thread_is_busy() {
    let server = Server::start();
    let mut raw = connect(&server);
    let client = LockClient::open(&server.url()).unwrap();
    let guard = client
        .lock("k")
        .lease(Duration::from_millis(300))
        .acquire()
        .unwrap();
    // The calling thread does nothing the library could run on for four leases.
    thread::sleep(Duration::from_millis(1_200));
    assert_eq!(guard.lost_reason(), None);
    assert_ne!(info(&mut raw, "k"), Value::Nil, "still held");
    assert!(calls(&mut raw, "lock.renew") >= 3);
    drop(guard);
    let after = calls(&mut raw, "lock.renew");
    thread::sleep(Duration::from_millis(400));
    assert_eq!(
        calls(&mut raw, "lock.renew"),
        after,
        "no renewal after the drop"
    );
}

#[test]
fn wait_lost_reports_a_forced_release_with_the_servers_reason() {
    let server = Server::start();
    let mut raw = connect(&server);
    let client = LockClient::from_builder(
        redis_lock_client::LockClient::builder(redis::Client::open(server.url()).unwrap())
            .listen_for_lost_signal(),
    )
    .unwrap();
    let guard = client.lock("k").acquire().unwrap();
    assert_eq!(guard.wait_lost(Duration::from_millis(200)), None, "held");
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("k")
        .query(&mut raw)
        .unwrap();
    let started = Instant::now();
    assert_eq!(
        guard.wait_lost(Duration::from_secs(2)),
        Some(LostReason::ForceReleased)
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(guard.lost_reason(), Some(LostReason::ForceReleased));
}

#[test]
fn run_releases_after_the_work_and_reports_a_loss_during_it() {
    let server = Server::start();
    let mut raw = connect(&server);
    let client = LockClient::from_builder(
        redis_lock_client::LockClient::builder(redis::Client::open(server.url()).unwrap())
            .without_lost_signal(),
    )
    .unwrap();
    let lock = client.lock("k").lease(Duration::from_millis(300));
    assert!(lock.run(|guard| guard.token() > 0).unwrap());
    assert_eq!(info(&mut raw, "k"), Value::Nil);
    let result = lock.run(|guard| {
        let _: i64 = redis::cmd("LOCK.FORCERELEASE")
            .arg("k")
            .query(&mut connect(&server))
            .unwrap();
        // The watchdog is the one to notice here (no signal): wait for it.
        guard.wait_lost(Duration::from_secs(5))
    });
    assert!(
        matches!(
            result,
            Err(LockError::NotHeld {
                lost: Some(LostReason::HoldGone)
            })
        ),
        "{result:?}"
    );
}

#[test]
fn blocking_calls_from_async_code_are_refused_not_deadlocked() {
    let server = Server::start();
    let client = LockClient::open(&server.url()).unwrap();
    let lock = client.lock("k");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = runtime.block_on(async { lock.acquire().unwrap_err() });
    assert!(matches!(err, LockError::InvalidArgument(_)), "{err:?}");
}
