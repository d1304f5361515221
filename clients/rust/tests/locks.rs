//! The client against a real redis-server with the module loaded (one per test).

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;
use redis_lock_client::{LockClient, LockError, LostReason, Release};
use support::{calls, setup, setup_without_signal, Server};

/// One field of `LOCK.INFO` (RESP2 flat array), or None when the lock is free or lacks it.
async fn info_field(raw: &mut MultiplexedConnection, key: &str, field: &str) -> Option<Value> {
    let reply: Value = redis::cmd("LOCK.INFO")
        .arg(key)
        .query_async(raw)
        .await
        .expect("LOCK.INFO");
    let Value::Array(items) = reply else {
        return None;
    };
    items.chunks(2).find_map(|pair| match pair {
        [Value::BulkString(name), value] if name == field.as_bytes() => Some(value.clone()),
        _ => None,
    })
}

async fn is_free(raw: &mut MultiplexedConnection, key: &str) -> bool {
    let reply: Value = redis::cmd("LOCK.INFO")
        .arg(key)
        .query_async(raw)
        .await
        .expect("LOCK.INFO");
    reply == Value::Nil
}

/// Waits (bounded) until `key` is free.
async fn wait_free(raw: &mut MultiplexedConnection, key: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while !is_free(raw, key).await {
        assert!(
            Instant::now() < deadline,
            "{key} still held after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_is_none_while_another_handle_holds() {
    let (_server, client, _raw) = setup().await;
    let a = client.lock("k");
    let b = client.lock("k");
    assert_ne!(a.owner(), b.owner());
    let mut ga = a.try_acquire().await.unwrap().expect("free key is granted");
    assert!(b.try_acquire().await.unwrap().is_none(), "busy → None");
    assert_eq!(ga.release().await.unwrap(), Release::Released);
    let gb = b
        .try_acquire()
        .await
        .unwrap()
        .expect("granted after release");
    assert!(gb.token() > ga.token(), "tokens rise");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_waits_and_is_granted_on_release() {
    let (_server, client, _raw) = setup().await;
    let mut held = client.lock("k").acquire().await.unwrap();
    let waiter = client.lock("k").wait_timeout(Duration::from_secs(10));
    // Counted from before the spawn: the task may start late on a loaded machine, and the
    // release comes 300 ms after this instant at the earliest.
    let start = Instant::now();
    let task = tokio::spawn(async move {
        let g = waiter.acquire().await;
        (g, start.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished());
    held.release().await.unwrap();
    let (g, waited) = task.await.unwrap();
    let g = g.expect("granted");
    assert!(g.token() > held.token());
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_times_out_in_the_server() {
    let (_server, client, mut raw) = setup().await;
    let _held = client.lock("k").acquire().await.unwrap();
    let start = Instant::now();
    let err = client
        .lock("k")
        .wait_timeout(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(matches!(err, LockError::Timeout { waited } if waited == Duration::from_millis(300)));
    // The server counts the wait from its millisecond clock, truncated when the wait began: the
    // nil can come up to a millisecond before 300 ms of this process's clock.
    assert!(
        took >= Duration::from_millis(298) && took < Duration::from_secs(2),
        "{took:?}"
    );
    assert_eq!(
        info_field(&mut raw, "k", "waiters").await,
        Some(Value::Int(0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_through_one_handle_shares_the_hold() {
    let (_server, client, mut raw) = setup().await;
    let lock = client.lock("k");
    let mut g1 = lock.acquire().await.unwrap();
    let mut g2 = lock.try_acquire().await.unwrap().expect("re-entry");
    assert_eq!(g1.token(), g2.token());
    // The server sees one hold (every acquire carries ONCE); the handle counts the guards.
    assert_eq!(
        info_field(&mut raw, "k", "count").await,
        Some(Value::Int(1))
    );
    assert_eq!(g1.release().await.unwrap(), Release::StillHeld);
    assert!(client.lock("k").try_acquire().await.unwrap().is_none());
    assert_eq!(g2.release().await.unwrap(), Release::Released);
    assert!(is_free(&mut raw, "k").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_exclude_a_writer() {
    let (_server, client, _raw) = setup().await;
    let mut r1 = client
        .read_lock("cfg")
        .try_acquire()
        .await
        .unwrap()
        .expect("r1");
    let mut r2 = client
        .read_lock("cfg")
        .try_acquire()
        .await
        .unwrap()
        .expect("r2");
    let writer = client.lock("cfg");
    assert!(writer.try_acquire().await.unwrap().is_none());
    r1.release().await.unwrap();
    assert!(writer.try_acquire().await.unwrap().is_none());
    r2.release().await.unwrap();
    let w = writer
        .try_acquire()
        .await
        .unwrap()
        .expect("writer after readers");
    assert!(client
        .read_lock("cfg")
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    drop(w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_grants_limit_permits() {
    let (_server, client, _raw) = setup().await;
    let mut p1 = client
        .semaphore("gpus", 2)
        .try_acquire()
        .await
        .unwrap()
        .expect("p1");
    let _p2 = client
        .semaphore("gpus", 2)
        .try_acquire()
        .await
        .unwrap()
        .expect("p2");
    let third = client.semaphore("gpus", 2);
    assert!(third.try_acquire().await.unwrap().is_none());
    p1.release().await.unwrap();
    assert!(third.try_acquire().await.unwrap().is_some());
    // Another limit on the same key is the server's error, with its text.
    let err = client.semaphore("gpus", 3).try_acquire().await.unwrap_err();
    assert!(
        matches!(&err, LockError::Server(t) if t.contains("LIMIT 2")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_keeps_a_short_lease_while_the_task_is_busy() {
    let (_server, client, mut raw) = setup().await;
    let lock = client.lock("k").lease(Duration::from_millis(300));
    let guard = lock.acquire().await.unwrap();
    // Block this worker thread (a busy application task), then sleep: 6 leases in all.
    std::thread::sleep(Duration::from_millis(900));
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(guard.lost_reason(), None);
    assert_eq!(
        info_field(&mut raw, "k", "owner").await,
        Some(Value::BulkString(lock.owner().as_bytes().to_vec()))
    );
    assert!(client.lock("k").try_acquire().await.unwrap().is_none());
    let renewals = calls(&mut raw, "lock.renew").await;
    assert!(renewals >= 10, "renewals: {renewals}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_renewal_after_release_or_drop() {
    let (_server, client, mut raw) = setup().await;
    let lock = client.lock("k").lease(Duration::from_millis(300));
    let mut guard = lock.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(guard.release().await.unwrap(), Release::Released);
    let after_release = calls(&mut raw, "lock.renew").await;
    assert!(after_release >= 2, "the watchdog ran: {after_release}");

    let guard = lock.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    drop(guard);
    wait_free(&mut raw, "k", Duration::from_secs(1)).await;
    let after_drop = calls(&mut raw, "lock.renew").await;

    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        calls(&mut raw, "lock.renew").await,
        after_drop,
        "a RENEW after release"
    );
    assert!(after_drop > after_release);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forcerelease_is_reported_lost_by_the_watchdog() {
    let (_server, client, mut raw) = setup_without_signal().await;
    let mut guard = client
        .lock("k")
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    let lost = guard.lost();
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("k")
        .query_async(&mut raw)
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(2), lost)
        .await
        .expect("lost within a renewal interval");
    assert_eq!(reason, LostReason::HoldGone);
    assert_eq!(guard.lost_reason(), Some(LostReason::HoldGone));
    let err = guard.release().await.unwrap_err();
    assert!(matches!(
        err,
        LockError::NotHeld {
            lost: Some(LostReason::HoldGone)
        }
    ));
    assert_eq!(guard.release().await.unwrap(), Release::AlreadyReleased);
    assert_eq!(
        calls(&mut raw, "lock.release").await,
        0,
        "nothing to release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_answers_no_renewal_for_a_lease_is_reported_unreachable() {
    let (_server, client, mut raw) = setup().await;
    let mut guard = client
        .lock("k")
        .lease(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    let lost = guard.lost();
    // Every command, RENEW included, waits out the pause: no renewal answers for 3 leases.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(900)
        .arg("ALL")
        .query_async(&mut raw)
        .await
        .unwrap();
    let start = Instant::now();
    let reason = tokio::time::timeout(Duration::from_millis(800), lost)
        .await
        .expect("lost before the pause ends");
    assert_eq!(reason, LostReason::Unreachable);
    assert!(
        start.elapsed() <= Duration::from_millis(300),
        "{:?}",
        start.elapsed()
    );
    assert!(matches!(
        guard.release().await,
        Err(LockError::NotHeld {
            lost: Some(LostReason::Unreachable)
        })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_is_idempotent() {
    let (_server, client, mut raw) = setup().await;
    let mut guard = client.lock("k").acquire().await.unwrap();
    assert_eq!(guard.release().await.unwrap(), Release::Released);
    assert_eq!(guard.release().await.unwrap(), Release::AlreadyReleased);
    drop(guard);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(calls(&mut raw, "lock.release").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ephemeral_hold_is_lost_when_its_connection_is_killed() {
    let (_server, client, mut raw) = setup().await;
    let lock = client.lock("k").ephemeral();
    let mut guard = lock.acquire().await.unwrap();
    let Some(Value::Int(conn_id)) = info_field(&mut raw, "k", "ephemeral").await else {
        panic!("the hold is bound to a connection");
    };
    // Re-entry goes on the hold's own connection and keeps the binding.
    let mut again = lock.try_acquire().await.unwrap().expect("re-entry");
    assert_eq!(
        info_field(&mut raw, "k", "ephemeral").await,
        Some(Value::Int(conn_id))
    );
    let lost = guard.lost();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(conn_id)
        .query_async(&mut raw)
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(1), lost)
        .await
        .expect("lost at once");
    // Seen on the hold's own connection, or told by the server's signal: whichever is first.
    assert!(
        matches!(
            reason,
            LostReason::ConnectionClosed | LostReason::Disconnected
        ),
        "{reason:?}"
    );
    assert!(is_free(&mut raw, "k").await, "the server ended the hold");
    assert!(client.lock("k").try_acquire().await.unwrap().is_some());
    assert!(matches!(
        again.release().await,
        Err(LockError::NotHeld { lost: Some(r) }) if r == reason
    ));
    assert!(guard.release().await.is_err());
    // The handle takes a new hold on a new connection.
    drop(guard);
    drop(again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_on_one_handle_does_not_block_other_commands() {
    let (_server, client, mut raw) = setup().await;
    let mut held = client.lock("busy").acquire().await.unwrap();
    let waiter = client.lock("busy").wait_timeout(Duration::from_secs(5));
    let task = tokio::spawn(async move { waiter.acquire().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        info_field(&mut raw, "busy", "waiters").await,
        Some(Value::Int(1))
    );
    let start = Instant::now();
    for i in 0..20 {
        let mut g = client.lock(format!("other{i}")).acquire().await.unwrap();
        g.release().await.unwrap();
    }
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert!(!task.is_finished());
    held.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .expect("granted on release")
        .unwrap()
        .unwrap();
    assert!(g.token() > held.token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_guard_releases() {
    let (_server, client, mut raw) = setup().await;
    {
        let _guard = client.lock("k").acquire().await.unwrap();
        assert!(!is_free(&mut raw, "k").await);
    }
    wait_free(&mut raw, "k", Duration::from_secs(1)).await;
    assert!(client.lock("k").try_acquire().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_dropped_outside_the_runtime_releases_through_it() {
    let (_server, client, mut raw) = setup().await;
    let guard = client.lock("k").acquire().await.unwrap();
    std::thread::spawn(move || drop(guard)).join().unwrap();
    wait_free(&mut raw, "k", Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_lease_is_reported_lost_at_its_end_and_never_renewed() {
    let (_server, client, mut raw) = setup().await;
    let guard = client
        .lock("k")
        .fixed_lease(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(1), guard.lost())
        .await
        .expect("lost at the lease end");
    assert_eq!(reason, LostReason::LeaseEnded);
    assert_eq!(calls(&mut raw, "lock.renew").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_signal_message_for_this_hold_is_checked_and_only_a_real_loss_reported() {
    // The test publishes the messages itself: whoever sends one, the library acts only on a
    // message naming this very hold, and then only after a read of the server.
    let (_server, client, mut raw) = setup().await;
    let guard = client.lock("orders:42").acquire().await.unwrap();
    let channel = "lock.lost:{orders:42}";
    // Wait for the subscription.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let n: Vec<Value> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(&mut raw)
            .await
            .unwrap();
        if n.get(1) == Some(&Value::Int(1)) {
            break;
        }
        assert!(Instant::now() < deadline, "never subscribed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut stats = raw.clone();
    let publish = |payload: String| {
        let mut raw = raw.clone();
        async move {
            let _: i64 = redis::cmd("PUBLISH")
                .arg(channel)
                .arg(payload)
                .query_async(&mut raw)
                .await
                .unwrap();
        }
    };
    let (token, owner) = (guard.token(), guard.owner().to_string());
    // Another owner's, another token's, another database's or another key's message (`k` and
    // `{k}` share the channel) is not ours.
    for other in [
        format!("forcereleased 0 {token} 9 orders:42 someone-else"),
        format!("deleted 0 {} 9 orders:42 {owner}", token + 1),
        format!("forcereleased 1 {token} 9 orders:42 {owner}"),
        format!("forcereleased 0 {token} 11 {{orders:42}} {owner}"),
        // The old form, without database and key.
        format!("forcereleased {token} {owner}"),
    ] {
        publish(other).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(guard.lost_reason(), None);
    // Ours, published by hand while the server holds it: a hint, checked with one LOCK.CHECK,
    // which finds the hold: nothing changes.
    let checks = calls(&mut stats, "lock.check").await;
    publish(format!("forcereleased 0 {token} 9 orders:42 {owner}")).await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while calls(&mut stats, "lock.check").await == checks {
        assert!(Instant::now() < deadline, "never checked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(guard.lost_reason(), None);
    // The server's own message, the hold gone: reported with its reason.
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("orders:42")
        .query_async(&mut stats)
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_millis(500), guard.lost())
        .await
        .expect("lost on the message");
    assert_eq!(reason, LostReason::ForceReleased);
    drop(guard);
    // The client unsubscribes when it has held nothing on the key for a moment (a second).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n: Vec<Value> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(&mut raw)
            .await
            .unwrap();
        if n.get(1) == Some(&Value::Int(0)) {
            break;
        }
        assert!(Instant::now() < deadline, "never unsubscribed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The server's own signal reports `want` within 100 ms after `end` ends the hold. The lease is
/// long, so the watchdog cannot be what notices. Where the module cannot see the cause (a key
/// removed or replaced by another command, on Redis 7.0: `observed_everywhere` false), nothing
/// may be reported within 300 ms either: no false reason, and the watchdog stays the backstop.
async fn lost_by_signal_after(end: &[&str], want: LostReason, observed_everywhere: bool) {
    let (_server, client, mut raw) = setup().await;
    let guard = client.lock("k").acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await; // the subscription
    let lost = guard.lost();
    let _: Value = redis::cmd(end[0])
        .arg(&end[1..])
        .query_async(&mut raw)
        .await
        .unwrap();
    if observed_everywhere || support::reports_key_events() {
        let reason = tokio::time::timeout(Duration::from_millis(100), lost)
            .await
            .expect("the signal arrives within 100 ms");
        assert_eq!(reason, want);
    } else {
        let quiet = tokio::time::timeout(Duration::from_millis(300), lost).await;
        assert!(
            quiet.is_err(),
            "reported {quiet:?} on a server without key events"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_reports_forcerelease() {
    lost_by_signal_after(&["LOCK.FORCERELEASE", "k"], LostReason::ForceReleased, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_reports_del() {
    lost_by_signal_after(&["DEL", "k"], LostReason::Deleted, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_reports_overwrite() {
    lost_by_signal_after(&["SET", "k", "v"], LostReason::Overwritten, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_reports_rename() {
    lost_by_signal_after(&["RENAME", "k", "k2"], LostReason::Deleted, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_runs() {
    let server = Server::start();
    // `cargo test` builds the examples beside the test binaries' deps/ folder.
    let exe = std::env::current_exe().unwrap();
    let example = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("examples/critical_section"))
        .unwrap();
    assert!(
        example.exists(),
        "{example:?} missing: run through cargo test"
    );
    let out = tokio::process::Command::new(&example)
        .env("REDIS_URL", server.url())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("counter = 30\n"), "{stdout}");
    assert!(
        stdout.contains("the server refused the stale token: fenced out"),
        "{stdout}"
    );
    assert!(stdout.contains("Some(HoldGone)"), "{stdout}");
    assert!(
        stdout.contains("counter = 31 (the stale write did not land)"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_reports_a_flush_of_the_holds_database_only() {
    // The server sends one `flushed <db>` on lock.lost:flush; the client checks each hold in
    // that database (LOCK.CHECK) and reports those gone. The lease is long: not the watchdog.
    let server = Server::start();
    let open = |db: u8| {
        LockClient::builder(redis::Client::open(format!("{}{db}", server.url())).unwrap())
            .listen_for_lost_signal()
            .build()
    };
    let (in_db0, in_db1) = (open(0).await.unwrap(), open(1).await.unwrap());
    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let g0 = in_db0.lock("k").acquire().await.unwrap();
    let g1 = in_db1.lock("k").acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await; // the subscriptions
    let _: () = redis::cmd("FLUSHDB").query_async(&mut raw).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_millis(500), g0.lost())
        .await
        .expect("the flush is reported within 500 ms");
    assert_eq!(reason, LostReason::Flushed);
    // Db 1 was not flushed: its holder checked nothing (another db) and still holds.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(g1.lost_reason(), None);
    let _: () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_millis(500), g1.lost())
        .await
        .expect("FLUSHALL is reported within 500 ms");
    assert_eq!(reason, LostReason::Flushed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_message_does_not_report_a_hold_that_is_still_there() {
    // The message is only a cue: a hold the check still finds is not reported (here the message
    // is published by hand, with nothing flushed).
    let (_server, client, mut raw) = setup().await;
    let guard = client.lock("k").acquire().await.unwrap();
    let semaphore = client.semaphore("s", 2).acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = calls(&mut raw, "lock.check").await;
    let _: i64 = redis::cmd("PUBLISH")
        .arg("lock.lost:flush")
        .arg("flushed all")
        .query_async(&mut raw)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while calls(&mut raw, "lock.check").await < before + 2 {
        assert!(Instant::now() < deadline, "the holds were never checked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(guard.lost_reason(), None);
    assert_eq!(semaphore.lost_reason(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_returns_the_works_output_and_releases() {
    let (_server, client, mut raw) = setup().await;
    let lock = client.lock("k");
    let token = lock
        .run(|token, lost| async move {
            assert_eq!(lost.reason(), None);
            token
        })
        .await
        .unwrap();
    assert!(token > 0);
    assert!(is_free(&mut raw, "k").await, "released after the work");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_drops_the_work_when_the_hold_is_lost() {
    struct Dropped(Arc<AtomicBool>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let (_server, client, mut raw) = setup().await;
    let dropped = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let (d, f) = (dropped.clone(), finished.clone());
    let work = tokio::spawn({
        let lock = client.lock("k");
        async move {
            lock.run(|_token, _lost| async move {
                let _witness = Dropped(d);
                tokio::time::sleep(Duration::from_secs(10)).await;
                f.store(true, Ordering::SeqCst);
            })
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await; // held, subscribed
    let started = Instant::now();
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("k")
        .query_async(&mut raw)
        .await
        .unwrap();
    let result = tokio::time::timeout(Duration::from_secs(2), work)
        .await
        .expect("run ends on the loss, not after the work")
        .unwrap();
    assert!(
        matches!(
            result,
            Err(LockError::NotHeld {
                lost: Some(LostReason::ForceReleased)
            })
        ),
        "{result:?}"
    );
    assert!(
        dropped.load(Ordering::SeqCst),
        "the work's future was dropped"
    );
    assert!(!finished.load(Ordering::SeqCst));
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_lost_signal_prefix_is_listened_to() {
    // The server publishes on `app.lost:{k}` and `app.lost:flush`: a client built with that
    // prefix hears the server's reason at once; one on the default prefix hears nothing, and
    // only its watchdog (every 200 ms here) finds the hold gone.
    let (server, default_prefix, mut raw) = setup().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("lock.lost-channel-prefix")
        .arg("app.lost")
        .query_async(&mut raw)
        .await
        .unwrap();
    let url = server.url();
    let prefixed = LockClient::builder(redis::Client::open(url.as_str()).unwrap())
        .lost_signal_prefix("app.lost")
        .build()
        .await
        .unwrap();

    let heard = prefixed.lock("a").acquire().await.unwrap();
    let unheard = default_prefix
        .lock("b")
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await; // the subscriptions
    for key in ["a", "b"] {
        let _: i64 = redis::cmd("LOCK.FORCERELEASE")
            .arg(key)
            .query_async(&mut raw)
            .await
            .unwrap();
    }
    let reason = tokio::time::timeout(Duration::from_millis(100), heard.lost())
        .await
        .expect("the signal arrives within 100 ms");
    assert_eq!(reason, LostReason::ForceReleased);
    let reason = tokio::time::timeout(Duration::from_secs(2), unheard.lost())
        .await
        .expect("the watchdog finds it gone");
    assert_eq!(
        reason,
        LostReason::HoldGone,
        "not the server's reason: unheard"
    );

    // The flush message on `app.lost:flush`.
    let flushed = prefixed.lock("c").acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_millis(500), flushed.lost())
        .await
        .expect("the flush is reported within 500 ms");
    assert_eq!(reason, LostReason::Flushed);

    // An empty prefix (the server's signal off) is refused.
    let refused = LockClient::builder(redis::Client::open(url.as_str()).unwrap())
        .lost_signal_prefix("")
        .build()
        .await;
    assert!(matches!(refused, Err(LockError::InvalidArgument(_))));
}

#[test]
fn holds_taken_on_a_second_runtime_are_kept_after_the_first_one_ended() {
    // A client's holds are renewed by a keeper task per runtime. The first runtime (where the
    // client connected and its first keeper started) ends; a hold then taken on a second
    // runtime is kept by a keeper there.
    let server = Server::start();
    let one_worker = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };
    let first = one_worker();
    let client = first
        .block_on(LockClient::open(&server.url()))
        .expect("client");
    first.block_on(async {
        let mut guard = client.lock("warm").acquire().await.unwrap();
        guard.release().await.unwrap();
    });
    drop(first);
    let second = one_worker();
    second.block_on(async {
        let mut raw = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let before = calls(&mut raw, "lock.renew").await;
        let mut guard = client
            .lock("k")
            .lease(Duration::from_millis(300))
            .acquire()
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(1000)).await; // 3 leases
        assert_eq!(guard.lost_reason(), None);
        let renewals = calls(&mut raw, "lock.renew").await - before;
        assert!(renewals >= 5, "renewals: {renewals}");
        assert_eq!(guard.release().await.unwrap(), Release::Released);
    });
}
