//! A guard's belief follows the server's truth: a hold granted after a long wait is held (not
//! reported lost at once), and a dropped guard's release never frees the same handle's next hold.
//! Against a real redis-server with the module loaded (one per test).

mod support;

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;
use redis_lock_client::{LockClient, LockGuard, LostReason, Release};
use support::{calls, raw, Server};

/// The lease of the long-wait tests, and how long their acquire waits: longer than nine tenths
/// of the lease, the local bound the acquire's send time gives.
const LEASE: Duration = Duration::from_secs(3);
const WAIT: Duration = Duration::from_millis(2_900);

/// `LOCK.INFO key`'s holders as (owner, token) pairs (RESP2), empty when the key is free.
async fn holders(raw: &mut MultiplexedConnection, key: &str) -> Vec<(Vec<u8>, i64)> {
    let reply: Value = redis::cmd("LOCK.INFO")
        .arg(key)
        .query_async(raw)
        .await
        .expect("LOCK.INFO");
    let field = |items: &[Value], name: &str| {
        items.chunks(2).find_map(|pair| match pair {
            [Value::BulkString(n), v] if n == name.as_bytes() => Some(v.clone()),
            _ => None,
        })
    };
    let Value::Array(items) = reply else {
        return Vec::new();
    };
    let Some(Value::Array(list)) = field(&items, "holders") else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|h| match h {
            Value::Array(h) => match (field(h, "owner"), field(h, "token")) {
                (Some(Value::BulkString(o)), Some(Value::Int(t))) => Some((o, t)),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// Whether the server holds `key` for (`owner`, `token`).
async fn server_holds(raw: &mut MultiplexedConnection, key: &str, owner: &str, token: u64) -> bool {
    holders(raw, key)
        .await
        .iter()
        .any(|(o, t)| o == owner.as_bytes() && u64::try_from(*t).ok() == Some(token))
}

/// A hold of another owner on `key`, released `after` from now by a task.
async fn held_for(client: &LockClient, key: &str, after: Duration) -> tokio::task::JoinHandle<()> {
    let mut guard = client.lock(key).acquire().await.expect("the first holder");
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        guard.release().await.expect("released");
    })
}

/// After a wait of most of the lease the guard says held, the watchdog renews it, and the
/// server holds it a lease later.
async fn held_and_renewed(raw: &mut MultiplexedConnection, guard: &LockGuard, waited: Duration) {
    assert!(
        waited >= WAIT - Duration::from_millis(50),
        "waited {waited:?}"
    );
    assert_eq!(
        guard.lost_reason(),
        None,
        "reported lost right after the grant"
    );
    let key = String::from_utf8_lossy(guard.key()).into_owned();
    let renewals = calls(raw, "lock.renew").await + calls(raw, "lock.mrenew").await;
    tokio::time::sleep(LEASE + LEASE / 3).await;
    assert_eq!(
        guard.lost_reason(),
        None,
        "reported lost while the server holds it"
    );
    assert!(
        server_holds(raw, &key, guard.owner(), guard.token()).await,
        "the server no longer holds it"
    );
    let after = calls(raw, "lock.renew").await + calls(raw, "lock.mrenew").await;
    assert!(after >= renewals + 3, "renewals: {renewals} then {after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_granted_after_a_wait_of_most_of_its_lease_is_held_and_renewed() {
    let server = Server::start();
    let client = LockClient::open(&server.url()).await.unwrap();
    let mut raw = raw(&server).await;
    let first = held_for(&client, "k", WAIT).await;
    let start = Instant::now();
    let mut guard = client.lock("k").lease(LEASE).acquire().await.unwrap();
    let waited = start.elapsed();
    first.await.unwrap();
    held_and_renewed(&mut raw, &guard, waited).await;
    assert_eq!(guard.release().await.unwrap(), Release::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_key_hold_granted_after_a_wait_of_most_of_its_lease_is_held_and_renewed() {
    let server = Server::start();
    let client = LockClient::open(&server.url()).await.unwrap();
    let mut raw = raw(&server).await;
    let first = held_for(&client, "b", WAIT).await;
    let start = Instant::now();
    let mut guard = client
        .multi_lock(["a", "b"])
        .lease(LEASE)
        .acquire()
        .await
        .unwrap();
    let waited = start.elapsed();
    first.await.unwrap();
    assert_eq!(
        guard.lost_reason(),
        None,
        "reported lost right after the grant"
    );
    tokio::time::sleep(LEASE + LEASE / 3).await;
    assert_eq!(
        guard.lost_reason(),
        None,
        "reported lost while the server holds it"
    );
    for (key, token) in ["a", "b"].iter().zip(guard.tokens()) {
        assert!(
            server_holds(&mut raw, key, guard.owner(), *token).await,
            "{key}"
        );
    }
    assert!(
        waited >= WAIT - Duration::from_millis(50),
        "waited {waited:?}"
    );
    assert!(calls(&mut raw, "lock.mrenew").await >= 3);
    assert_eq!(guard.release().await.unwrap(), Release::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_elected_after_a_wait_of_most_of_its_lease_leads_and_can_proclaim() {
    let server = Server::start();
    let client = LockClient::open(&server.url()).await.unwrap();
    let mut raw = raw(&server).await;
    let mut leader = client
        .election("svc")
        .lease(LEASE)
        .campaign()
        .await
        .unwrap();
    let resign = tokio::spawn(async move {
        tokio::time::sleep(WAIT).await;
        leader.resign().await.expect("resigned");
    });
    let start = Instant::now();
    let standby = client.election("svc").lease(LEASE);
    let leadership = standby.campaign().await.unwrap();
    let waited = start.elapsed();
    resign.await.unwrap();
    assert!(
        waited >= WAIT - Duration::from_millis(50),
        "waited {waited:?}"
    );
    assert_eq!(
        leadership.lost_reason(),
        None,
        "deposed right after the election"
    );
    assert!(
        leadership.proclaim("here").await.unwrap(),
        "cannot proclaim"
    );
    tokio::time::sleep(LEASE + LEASE / 3).await;
    assert_eq!(
        leadership.lost_reason(),
        None,
        "deposed while the server says it leads"
    );
    let now = standby.leader().await.unwrap().expect("a leader");
    assert_eq!(now.candidate, standby.candidate().as_bytes());
    assert_eq!(now.epoch, leadership.epoch());
    assert!(leadership.proclaim("still here").await.unwrap());
    assert!(calls(&mut raw, "lock.renew").await >= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_lease_granted_after_a_long_wait_ends_with_the_servers_lease_not_the_waits() {
    // Nothing renews a fixed lease: its confirmation reads the lease the server gives it, and
    // the guard reports its end from that, not from when the wait began.
    let server = Server::start();
    let client = LockClient::open(&server.url()).await.unwrap();
    let mut raw = raw(&server).await;
    let first = held_for(&client, "f", WAIT).await;
    let start = Instant::now();
    let guard = client.lock("f").fixed_lease(LEASE).acquire().await.unwrap();
    let waited = start.elapsed();
    first.await.unwrap();
    assert!(
        waited >= WAIT - Duration::from_millis(50),
        "waited {waited:?}"
    );
    let granted = Instant::now();
    assert_eq!(
        guard.lost_reason(),
        None,
        "reported ended right after the grant"
    );
    tokio::time::sleep(LEASE / 2).await;
    assert_eq!(
        guard.lost_reason(),
        None,
        "reported ended while the server holds it"
    );
    assert!(server_holds(&mut raw, "f", guard.owner(), guard.token()).await);
    let reason = tokio::time::timeout(LEASE, guard.lost())
        .await
        .expect("reported at its end");
    assert_eq!(reason, redis_lock_client::LostReason::LeaseEnded);
    // At nine tenths of the lease the server gave, counted from the read (after the grant).
    assert!(
        granted.elapsed() >= LEASE * 8 / 10,
        "{:?}",
        granted.elapsed()
    );
    assert_eq!(
        calls(&mut raw, "lock.renew").await,
        0,
        "a fixed lease renewed"
    );
}

/// `trials` times: a guard of `lock` dropped, then the same handle acquiring again; counts the
/// new guards that say held while the server does not hold their (owner, token).
async fn drop_then_acquire(server: &Server, waiting: bool, trials: usize) -> usize {
    let client = LockClient::open(&server.url()).await.unwrap();
    let mut raw = raw(server).await;
    let key = if waiting { "w" } else { "t" };
    let lock = client.lock(key);
    let take = || async {
        if waiting {
            lock.acquire().await.unwrap()
        } else {
            lock.try_acquire().await.unwrap().expect("free")
        }
    };
    let mut false_held = 0;
    for _ in 0..trials {
        drop(take().await);
        let mut guard = take().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let held = server_holds(&mut raw, key, guard.owner(), guard.token()).await;
        if !held && guard.lost_reason().is_none() {
            false_held += 1;
            // Free the key for the next trial (the guard's release would answer NotHeld).
            let _: i64 = redis::cmd("LOCK.FORCERELEASE")
                .arg(key)
                .query_async(&mut raw)
                .await
                .unwrap();
        }
        let _ = guard.release().await;
    }
    false_held
}

#[test]
fn a_dropped_guards_release_never_frees_the_next_hold_of_its_handle_current_thread() {
    let server = Server::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for waiting in [false, true] {
        let false_held = runtime.block_on(drop_then_acquire(&server, waiting, 30));
        assert_eq!(
            false_held, 0,
            "waiting {waiting}: {false_held}/30 guards said held over nothing"
        );
    }
}

#[test]
fn a_dropped_guards_release_never_frees_the_next_hold_of_its_handle_multi_thread() {
    let server = Server::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for waiting in [false, true] {
        let false_held = runtime.block_on(drop_then_acquire(&server, waiting, 60));
        assert_eq!(
            false_held, 0,
            "waiting {waiting}: {false_held}/60 guards said held over nothing"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_finds_the_owner_under_another_token_reports_the_hold_gone() {
    // LOCK.RENEW names no token: it renews whatever hold the owner has. The guard's hold is
    // force-released and the same owner takes the key again behind the library's back (as a
    // paused "zombie" master's grant confirmed on the real master, where the owner held another
    // token, in the failover test): a renewal answers 1 for a hold that is not the guard's. The
    // watchdog alone (no lost signal) must report it gone.
    let server = Server::start();
    let mut raw = support::raw(&server).await;
    let client = LockClient::builder(redis::Client::open(server.url()).unwrap())
        .without_lost_signal()
        .build()
        .await
        .unwrap();
    let guard = client
        .lock("k")
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("k")
        .query_async(&mut raw)
        .await
        .unwrap();
    let other: u64 = redis::cmd("LOCK.ACQUIRE")
        .arg("k")
        .arg(guard.owner())
        .arg(30_000)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_ne!(other, guard.token());
    let reason = tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("a hold under another token was taken for the guard's");
    assert_eq!(reason, LostReason::HoldGone);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_hold_whose_renewal_times_out_on_a_live_connection_is_not_reported_lost() {
    // A write pause (every failover pauses writes) postpones the watchdog's renewal past the
    // command timeout: no answer, on a connection that is alive, and the server still holds the
    // hold (bound to that connection). The library reported it lost (ConnectionClosed) on the
    // first renewal without an answer; it must ask the server first, and go on renewing.
    let server = Server::start();
    let mut raw = support::raw(&server).await;
    let client = LockClient::builder(redis::Client::open(server.url()).unwrap())
        .command_timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let lease = Duration::from_secs(4);
    let mut guard = client
        .lock("bound")
        .lease(lease)
        .ephemeral()
        .acquire()
        .await
        .unwrap();
    let (owner, token) = (guard.owner().to_string(), guard.token());
    let renewals = calls(&mut raw, "lock.renew").await;
    // Longer than the renewal interval (a third of the lease): a renewal falls inside it.
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1_600)
        .arg("WRITE")
        .query_async(&mut raw)
        .await
        .unwrap();
    let paused_until = Instant::now() + Duration::from_millis(1_600);
    while Instant::now() < paused_until {
        assert_eq!(guard.lost_reason(), None, "reported lost during the pause");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Renewed again once the pause is over, and held all along.
    let deadline = Instant::now() + Duration::from_secs(3);
    while calls(&mut raw, "lock.renew").await < renewals + 2 {
        assert!(Instant::now() < deadline, "renewed after the pause");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(guard.lost_reason(), None);
    assert!(server_holds(&mut raw, "bound", &owner, token).await);
    assert_eq!(guard.release().await.unwrap(), Release::Released);
}

/// A process paused past its lease (SIGSTOP, a long GC, a blocked runtime thread) reads its
/// guard first thing when it resumes, before the watchdog's wake-up has run: the guard says
/// lost at once (the local deadline passed), and so does a `LostWatch`. Before, it said held
/// until the keeper's next turn (seen in 1 of 4 runs as a user; deterministic here: the one
/// runtime thread is blocked, so nothing else runs between the resume and the read).
#[test]
fn a_guard_read_right_after_a_pause_past_its_lease_says_lost_at_once() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = Server::start();
        let client = LockClient::builder(redis::Client::open(server.url()).unwrap())
            .build()
            .await
            .unwrap();
        let guard = client
            .lock("paused")
            .lease(Duration::from_millis(300))
            .acquire()
            .await
            .unwrap();
        let watch = guard.watch();
        assert_eq!(guard.lost_reason(), None);
        // The runtime's only thread stops for more than the lease: no renewal, no wake-up.
        std::thread::sleep(Duration::from_millis(900));
        assert_eq!(watch.reason(), Some(LostReason::Unreachable));
        assert_eq!(guard.lost_reason(), Some(LostReason::Unreachable));
    });
}

/// How the pause tests stop the process: the runtime's only thread sleeps for three leases, so
/// no renewal, no keeper wake-up and no other task runs between the pause and the read after it.
const PAUSED_LEASE: Duration = Duration::from_millis(300);
const PAUSE: Duration = Duration::from_millis(900);

/// A current-thread runtime (nothing runs while its thread is blocked), a server, a client.
fn paused_test(test: impl AsyncFnOnce(Server, LockClient)) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = Server::start();
        let client = LockClient::builder(redis::Client::open(server.url()).unwrap())
            .build()
            .await
            .unwrap();
        test(server, client).await;
    });
}

/// One poll of `future` here and now (nothing else runs meanwhile): its output if ready.
fn poll_once<F: std::future::Future>(future: std::pin::Pin<&mut F>) -> Option<F::Output> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.poll(&mut cx) {
        std::task::Poll::Ready(output) => Some(output),
        std::task::Poll::Pending => None,
    }
}

/// A `lost()` future made before a pause past the lease (as in `select!` beside the work) is
/// ready at its first poll after the pause, before the keeper has run: each poll looks at the
/// local deadline. Before, it stayed pending until the keeper's wake-up had run.
#[test]
fn a_lost_future_polled_right_after_a_pause_past_its_lease_is_ready_at_once() {
    paused_test(async |_server, client| {
        let guard = client
            .lock("paused-future")
            .lease(PAUSED_LEASE)
            .acquire()
            .await
            .unwrap();
        let mut lost = std::pin::pin!(guard.lost());
        // Polled once while held: pending.
        assert_eq!(poll_once(lost.as_mut()), None);
        std::thread::sleep(PAUSE);
        assert_eq!(poll_once(lost.as_mut()), Some(LostReason::Unreachable));
        // A `LostWatch`'s future, made before the loss too, on a hold nobody else looked at.
        let other = client
            .lock("paused-watch")
            .lease(PAUSED_LEASE)
            .acquire()
            .await
            .unwrap();
        let watch = other.watch();
        let mut watched = std::pin::pin!(watch.lost());
        assert_eq!(poll_once(watched.as_mut()), None);
        std::thread::sleep(PAUSE);
        assert_eq!(poll_once(watched.as_mut()), Some(LostReason::Unreachable));
    });
}

/// A fenced call right after a pause past the lease is refused on this side: `NotHeld` with the
/// watchdog's reason, and nothing reaches the server (no `LOCK.GUARD` counted), not even to be
/// refused by its fence.
#[test]
fn a_fenced_call_right_after_a_pause_past_its_lease_is_refused_without_sending() {
    paused_test(async |server, client| {
        let mut raw = raw(&server).await;
        let guard = client
            .lock("{paused}:lock")
            .lease(PAUSED_LEASE)
            .acquire()
            .await
            .unwrap();
        std::thread::sleep(PAUSE);
        let refused = guard
            .fenced::<String>(redis::cmd("SET").arg("{paused}:data").arg("stale"))
            .await;
        assert!(
            matches!(
                refused,
                Err(redis_lock_client::LockError::NotHeld {
                    lost: Some(LostReason::Unreachable)
                })
            ),
            "{refused:?}"
        );
        assert_eq!(calls(&mut raw, "lock.guard").await, 0);
        let data: Option<String> = redis::cmd("GET")
            .arg("{paused}:data")
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(data, None);
    });
}

/// A fixed lease read right after a pause past it says `LeaseEnded` at once, as the keeper would
/// have; a fenced call is refused with it, nothing sent.
#[test]
fn a_fixed_lease_read_right_after_a_pause_past_it_says_lease_ended_at_once() {
    paused_test(async |server, client| {
        let mut raw = raw(&server).await;
        let guard = client
            .lock("{fixed}:lock")
            .fixed_lease(PAUSED_LEASE)
            .acquire()
            .await
            .unwrap();
        assert_eq!(guard.lost_reason(), None);
        std::thread::sleep(PAUSE);
        assert_eq!(guard.lost_reason(), Some(LostReason::LeaseEnded));
        let refused = guard
            .fenced::<String>(redis::cmd("SET").arg("{fixed}:data").arg("stale"))
            .await;
        assert!(
            matches!(
                refused,
                Err(redis_lock_client::LockError::NotHeld {
                    lost: Some(LostReason::LeaseEnded)
                })
            ),
            "{refused:?}"
        );
        assert_eq!(calls(&mut raw, "lock.guard").await, 0);
    });
}

/// A multi-key guard and a leadership read right after a pause past their lease say lost at
/// once (`Unreachable`); their fenced calls are refused without sending, and the leadership's
/// proclamation answers `false` without sending.
#[test]
fn multi_key_and_leadership_guards_read_right_after_a_pause_say_lost_at_once() {
    paused_test(async |server, client| {
        let mut raw = raw(&server).await;
        let multi = client
            .multi_lock(["{m}:a", "{m}:b"])
            .lease(PAUSED_LEASE)
            .acquire()
            .await
            .unwrap();
        let leadership = client
            .election("{e}:leader")
            .lease(PAUSED_LEASE)
            .campaign()
            .await
            .unwrap();
        assert_eq!(multi.lost_reason(), None);
        assert_eq!(leadership.lost_reason(), None);
        std::thread::sleep(PAUSE);
        assert_eq!(multi.lost_reason(), Some(LostReason::Unreachable));
        assert_eq!(leadership.lost_reason(), Some(LostReason::Unreachable));
        let refused = multi
            .fenced::<String>("{m}:b", redis::cmd("SET").arg("{m}:data").arg("stale"))
            .await;
        assert!(
            matches!(
                refused,
                Err(redis_lock_client::LockError::NotHeld {
                    lost: Some(LostReason::Unreachable)
                })
            ),
            "{refused:?}"
        );
        let refused = leadership
            .fenced::<String>(redis::cmd("SET").arg("{e}:data").arg("stale"))
            .await;
        assert!(
            matches!(
                refused,
                Err(redis_lock_client::LockError::NotHeld {
                    lost: Some(LostReason::Unreachable)
                })
            ),
            "{refused:?}"
        );
        assert!(!leadership.proclaim("stale").await.unwrap());
        assert_eq!(calls(&mut raw, "lock.guard").await, 0);
        assert_eq!(calls(&mut raw, "lock.proclaim").await, 0);
    });
}

/// A guard that says lost only because its local deadline passed (the server may still have
/// the hold) releases it in the background, as the watchdog does: nobody waits it out. Here
/// the server still has it (renewed from outside during the pause).
#[test]
fn a_hold_read_lost_after_a_pause_is_released_in_the_background_if_the_server_still_has_it() {
    paused_test(async |server, client| {
        let mut raw = raw(&server).await;
        let guard = client
            .lock("kept")
            .lease(PAUSED_LEASE)
            .acquire()
            .await
            .unwrap();
        let (owner, token) = (guard.owner().to_owned(), guard.token());
        // Another process renews it on the server while this one is paused (a blocking
        // connection: the runtime's thread is the one that sleeps).
        let mut outside = redis::Client::open(server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let renewed: i64 = redis::cmd("LOCK.RENEW")
            .arg("kept")
            .arg(&owner)
            .arg(60_000)
            .query(&mut outside)
            .unwrap();
        assert_eq!(renewed, 1);
        std::thread::sleep(PAUSE);
        assert_eq!(guard.lost_reason(), Some(LostReason::Unreachable));
        assert!(server_holds(&mut raw, "kept", &owner, token).await);
        let started = Instant::now();
        while server_holds(&mut raw, "kept", &owner, token).await {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the hold was not released"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}
