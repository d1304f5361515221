//! The server's lost-hold signal through the client: on by default, each message acted on only
//! when it is about the hold's own database and key, a whole-key message or a flush checked with
//! one read before anything is reported. Against a real redis-server with the module loaded
//! (one per test); the copies and whole-key removals are seen by the server only where it has
//! key events (Redis >= 7.2, Valkey: `eval "$(bash scripts/server-deps.sh redis8)"`).

mod support;

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;
use redis_lock_client::{blocking, LockClient, LostReason};
use support::{calls, raw, reports_key_events, subscribers, wait_subscribers, Server};

/// `LOCK.INFO key`'s holders as (owner, token) pairs (RESP2), empty when the key is free.
async fn holders(raw: &mut MultiplexedConnection, key: &str) -> Vec<(Vec<u8>, i64)> {
    let reply: Value = redis::cmd("LOCK.INFO")
        .arg(key)
        .query_async(raw)
        .await
        .unwrap();
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

async fn publish(raw: &mut MultiplexedConnection, channel: &str, payload: &str) {
    let _: i64 = redis::cmd("PUBLISH")
        .arg(channel)
        .arg(payload)
        .query_async(raw)
        .await
        .unwrap();
}

/// A guard is handed out once the server confirmed the subscription to its key's channel (as
/// in the Python library): a loss right after the acquire returns is heard through the signal,
/// not at the next renewal (10 s on). Before, the subscription was made in the background, and
/// the client's first one (its subscriber connection still being opened) came after a
/// `LOCK.FORCERELEASE` sent at once: the loss was reported 10 s late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_right_after_the_acquire_is_heard_through_the_signal() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    for round in 0..5 {
        let client = LockClient::open(&server.url()).await.unwrap();
        let key = format!("{{right-after}}:{round}");
        let guard = client.lock(key.as_str()).acquire().await.unwrap();
        let _: i64 = redis::cmd("LOCK.FORCERELEASE")
            .arg(&key)
            .query_async(&mut raw)
            .await
            .unwrap();
        let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("heard through the signal, not at the renewal 10 s on");
        assert_eq!(reason, LostReason::ForceReleased, "round {round}");
    }
}

/// A second reader of a key the client already watches, taken as its server comes back: the
/// listener's connection had dropped and was being made again after pauses growing to 2 s, and
/// the guard was handed out on the confirmation the closed connection got, unsubscribed (after
/// a failover, every key with two holders in the process): a loss right after it was heard
/// only at the next renewal. Now a watch with no connection subscribes every channel at once.
/// Before the fix: no subscriber at the hand-out (the listener's next try ~1.8 s away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_reader_taken_as_the_server_comes_back_is_subscribed_when_handed_out() {
    let mut server = Server::start();
    let client = LockClient::open(&server.url()).await.unwrap();
    let first = client.read_lock("{back}").acquire().await.unwrap();
    wait_subscribers(&mut raw(&server).await, "lock.lost:{back}", 1).await;
    server.kill_hard();
    // The listener tries again after 50 ms doubling: after 3.3 s, its next try is at 5.15 s.
    tokio::time::sleep(Duration::from_millis(3300)).await;
    server.restart();
    let mut raw = raw(&server).await;
    let second = client.read_lock("{back}").acquire().await.unwrap();
    assert_eq!(
        subscribers(&mut raw, "lock.lost:{back}").await,
        1,
        "handed out before its lost-hold channel was subscribed again"
    );
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("{back}")
        .query_async(&mut raw)
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(5), second.lost())
        .await
        .expect("heard through the signal, not at the renewal 10 s on");
    assert_eq!(reason, LostReason::ForceReleased);
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lost_signal_is_on_by_default_and_can_be_turned_off() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    // `open`: the default client hears the server's reason at once (the lease is 30 s: not the
    // watchdog).
    let client = LockClient::open(&server.url()).await.unwrap();
    let guard = client.lock("k").acquire().await.unwrap();
    wait_subscribers(&mut raw, "lock.lost:{k}", 1).await;
    wait_subscribers(&mut raw, "lock.lost:flush", 1).await;
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("k")
        .query_async(&mut raw)
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_millis(500), guard.lost())
        .await
        .expect("the signal arrives within 500 ms");
    assert_eq!(reason, LostReason::ForceReleased);
    drop(guard);
    wait_subscribers(&mut raw, "lock.lost:{k}", 0).await;

    // `without_lost_signal`: no pub/sub connection at all.
    let quiet = LockClient::builder(redis::Client::open(server.url()).unwrap())
        .without_lost_signal()
        .build()
        .await
        .unwrap();
    let _guard = quiet
        .lock("q")
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    wait_subscribers(&mut raw, "lock.lost:{q}", 0).await;
    drop(client);
    wait_subscribers(&mut raw, "lock.lost:flush", 0).await;

    // The blocking client's `open` listens too.
    let url = server.url();
    let thread = std::thread::spawn(move || {
        let client = blocking::LockClient::open(&url).unwrap();
        let guard = client.lock("b").acquire().unwrap();
        let mut raw = redis::Client::open(url).unwrap().get_connection().unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let n: Vec<Value> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg("lock.lost:{b}")
                .query(&mut raw)
                .unwrap();
            if n.get(1) == Some(&Value::Int(1)) {
                break;
            }
            assert!(Instant::now() < deadline, "never subscribed");
            std::thread::sleep(Duration::from_millis(10));
        }
        let _: i64 = redis::cmd("LOCK.FORCERELEASE")
            .arg("b")
            .query(&mut raw)
            .unwrap();
        guard.wait_lost(Duration::from_millis(500))
    });
    let heard = tokio::task::spawn_blocking(move || thread.join().unwrap())
        .await
        .unwrap();
    assert_eq!(heard, Some(LostReason::ForceReleased));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_key_message_is_checked_and_only_holds_really_gone_are_reported() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let client = LockClient::open(&server.url()).await.unwrap();
    // Two holds of one semaphore (the server names no hold when such a key is removed).
    let a = client.semaphore("s", 2).acquire().await.unwrap();
    let b = client.semaphore("s", 2).acquire().await.unwrap();
    wait_subscribers(&mut raw, "lock.lost:{s}", 1).await;

    // A whole-key message while both holds are alive (published by hand): checked with one
    // LOCK.CHECK per hold, and nothing reported.
    let before = calls(&mut raw, "lock.check").await;
    publish(&mut raw, "lock.lost:{s}", "deleted 0 * 1 s").await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while calls(&mut raw, "lock.check").await < before + 2 {
        assert!(Instant::now() < deadline, "the holds were never checked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!((a.lost_reason(), b.lost_reason()), (None, None));
    // About another database, or another key of the channel: not even checked.
    let before = calls(&mut raw, "lock.check").await;
    publish(&mut raw, "lock.lost:{s}", "deleted 1 * 1 s").await;
    publish(&mut raw, "lock.lost:{s}", "deleted 0 * 3 {s}").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(calls(&mut raw, "lock.check").await, before);

    // The key removed: on a server with key events its DEL publishes the whole-key message;
    // on one without, the same message by hand. Both holds are reported, with its reason.
    let _: i64 = redis::cmd("DEL")
        .arg("s")
        .query_async(&mut raw)
        .await
        .unwrap();
    if !reports_key_events() {
        publish(&mut raw, "lock.lost:{s}", "deleted 0 * 1 s").await;
    }
    for guard in [&a, &b] {
        let reason = tokio::time::timeout(Duration::from_millis(500), guard.lost())
            .await
            .expect("reported within 500 ms");
        assert_eq!(reason, LostReason::Deleted);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_copy_of_a_lock_does_not_lose_the_original() {
    // A backup copy in another database, and a copy under `{k}` (the same channel as `k`),
    // each deleted: the server names the copy's database and key, not the original's.
    let server = Server::start();
    let mut raw = raw(&server).await;
    let mut db1 = redis::Client::open(format!("{}1", server.url()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let client = LockClient::open(&server.url()).await.unwrap();
    let lease = Duration::from_secs(3);
    let guard = client.lock("k").lease(lease).acquire().await.unwrap();
    wait_subscribers(&mut raw, "lock.lost:{k}", 1).await;
    for copy in [&["COPY", "k", "k", "DB", "1"][..], &["COPY", "k", "{k}"]] {
        // A connection of its own: Valkey 8.1 leaves the one that ran `COPY ... DB 1` on
        // database 1 (docs/guarantees.md).
        let copied: i64 = redis::cmd(copy[0])
            .arg(&copy[1..])
            .query_async(&mut support::raw(&server).await)
            .await
            .unwrap();
        assert_eq!(copied, 1, "{copy:?}");
    }
    let _: i64 = redis::cmd("DEL")
        .arg("k")
        .query_async(&mut db1)
        .await
        .unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg("{k}")
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("x")
        .query_async(&mut db1)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        guard.lost_reason(),
        None,
        "a copy's end reported as the original's"
    );
    // Still held and renewed, past its lease.
    tokio::time::sleep(lease + lease / 3).await;
    assert_eq!(guard.lost_reason(), None);
    let held = holders(&mut raw, "k").await;
    assert!(
        held.iter()
            .any(|(o, t)| o == guard.owner().as_bytes() && *t == guard.token() as i64),
        "{held:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_of_another_database_is_not_even_checked() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let client = LockClient::open(&server.url()).await.unwrap();
    let guard = client.lock("k").acquire().await.unwrap();
    wait_subscribers(&mut raw, "lock.lost:flush", 1).await;
    let before = calls(&mut raw, "lock.check").await;
    let mut db3 = redis::Client::open(format!("{}3", server.url()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("FLUSHDB").query_async(&mut db3).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(calls(&mut raw, "lock.check").await, before);
    assert_eq!(guard.lost_reason(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_taken_again_soon_is_not_subscribed_again_and_is_unsubscribed_once_idle() {
    let (_server, client, mut raw) = support::setup().await;
    let lock = client.lock("k");
    for _ in 0..20 {
        let mut guard = lock.try_acquire().await.unwrap().expect("free");
        wait_subscribers(&mut raw, "lock.lost:{k}", 1).await;
        guard.release().await.unwrap();
    }
    // One SUBSCRIBE for the key's channel and one for the flush channel, not one per hold.
    assert_eq!(calls(&mut raw, "subscribe").await, 2);
    assert_eq!(calls(&mut raw, "unsubscribe").await, 0);
    // Held by nobody for a moment: unsubscribed.
    wait_subscribers(&mut raw, "lock.lost:{k}", 0).await;
    assert_eq!(calls(&mut raw, "unsubscribe").await, 1);
}

/// A connection as a user that may only `PUBLISH` on `channel`: no keys, no `LOCK.*` command.
async fn publisher_only(
    server: &Server,
    raw: &mut MultiplexedConnection,
    channel: &str,
) -> MultiplexedConnection {
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "forger",
            "on",
            ">pw",
            "resetkeys",
            "resetchannels",
        ])
        .arg(format!("&{channel}"))
        .arg("+publish")
        .query_async(raw)
        .await
        .unwrap();
    redis::Client::open(format!("redis://forger:pw@127.0.0.1:{}/", server.port))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// `LOCK.CHECK key owner token`.
async fn server_checks(raw: &mut MultiplexedConnection, key: &str, owner: &str, token: u64) -> i64 {
    redis::cmd("LOCK.CHECK")
        .arg(key)
        .arg(owner)
        .arg(token)
        .query_async(raw)
        .await
        .unwrap()
}

/// A message is a hint, never evidence: a lost message naming exactly a live hold (database,
/// key, owner, token: all of it readable with LOCK.INFO), published by a user who may do
/// nothing but publish on the channel, makes the library read the hold (LOCK.CHECK); the server
/// still holds it, so nothing changes: not lost, renewed past its lease. The server's own
/// message for a real force release is still reported at once (its read finds the hold gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_lost_message_is_checked_and_a_live_hold_stays_held_and_renewed() {
    let server = Server::start();
    let mut raw = raw(&server).await;
    let mut forger = publisher_only(&server, &mut raw, "lock.lost:{k}").await;
    let client = LockClient::open(&server.url()).await.unwrap();
    let lease = Duration::from_millis(900);
    let guard = client.lock("k").lease(lease).acquire().await.unwrap();
    let (owner, token) = (guard.owner().to_string(), guard.token());
    wait_subscribers(&mut raw, "lock.lost:{k}", 1).await;
    let checks = calls(&mut raw, "lock.check").await;
    for reason in ["forcereleased", "disconnected", "expired", "deleted"] {
        publish(
            &mut forger,
            "lock.lost:{k}",
            &format!("{reason} 0 {token} 1 k {owner}"),
        )
        .await;
    }
    // Each message is checked with a read (the library's own renewals check too: at least 4).
    let deadline = Instant::now() + Duration::from_secs(2);
    while calls(&mut raw, "lock.check").await < checks + 4 {
        assert!(
            Instant::now() < deadline,
            "the forged messages were never checked (guard: {:?})",
            guard.lost_reason()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(guard.lost_reason(), None, "a message alone reported a loss");
    assert_eq!(server_checks(&mut raw, "k", &owner, token).await, 1);
    // Renewed past its lease: the watchdog goes on.
    let renewals = calls(&mut raw, "lock.renew").await;
    tokio::time::sleep(lease * 2).await;
    assert_eq!(guard.lost_reason(), None);
    assert!(calls(&mut raw, "lock.renew").await >= renewals + 3);
    assert_eq!(server_checks(&mut raw, "k", &owner, token).await, 1);
    // The real thing: reported at once, with the server's reason.
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("k")
        .query_async(&mut raw)
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_millis(300), guard.lost())
        .await
        .expect("reported within 300 ms");
    assert_eq!(reason, LostReason::ForceReleased);
}
