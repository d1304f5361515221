//! Multi-key holds (`LOCK.MACQUIRE`) through the client, against a real redis-server with the
//! module loaded (one per test).

mod support;

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;
use redis_lock_client::{blocking, LockClient, LockError, LostReason, Release};
use support::{calls, raw, setup, Server};

/// `LOCK.INFO key`'s `owner` and `token` (RESP2 flat array), or None when the key is free.
async fn holder(raw: &mut MultiplexedConnection, key: &str) -> Option<(Vec<u8>, i64)> {
    let reply: Value = redis::cmd("LOCK.INFO")
        .arg(key)
        .query_async(raw)
        .await
        .expect("LOCK.INFO");
    let Value::Array(items) = reply else {
        return None;
    };
    let field = |name: &str| {
        items.chunks(2).find_map(|pair| match pair {
            [Value::BulkString(n), v] if n == name.as_bytes() => Some(v.clone()),
            _ => None,
        })
    };
    match (field("owner"), field("token")) {
        (Some(Value::BulkString(owner)), Some(Value::Int(token))) => Some((owner, token)),
        _ => None,
    }
}

async fn wait_free(raw: &mut MultiplexedConnection, key: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while holder(raw, key).await.is_some() {
        assert!(
            Instant::now() < deadline,
            "{key} still held after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_lock_takes_every_key_with_a_token_each_or_none() {
    let (_server, client, mut raw) = setup().await;
    // Another owner holds b: nothing is taken, a is untouched.
    let mut other = client.lock("b").acquire().await.unwrap();
    let both = client.multi_lock(["a", "b"]);
    assert!(both.try_acquire().await.unwrap().is_none());
    assert_eq!(holder(&mut raw, "a").await, None, "a was not touched");
    other.release().await.unwrap();

    let guard = both.try_acquire().await.unwrap().expect("both free");
    assert_eq!(guard.keys(), vec![&b"a"[..], &b"b"[..]]);
    let tokens = guard.tokens().to_vec();
    assert_eq!(tokens.len(), 2);
    for (key, token) in ["a", "b"].iter().zip(&tokens) {
        let (owner, t) = holder(&mut raw, key).await.expect("held");
        assert_eq!(owner, guard.owner().as_bytes());
        assert_eq!(u64::try_from(t).unwrap(), *token, "{key}'s token, in order");
    }
    assert!(
        tokens[1] > other.token(),
        "b's token rose past the last holder's"
    );
    assert_eq!(calls(&mut raw, "lock.macquire").await, 2);
    assert!(client.lock("a").try_acquire().await.unwrap().is_none());

    // Keys are checked before anything is sent.
    let too_many: Vec<String> = (0..65).map(|i| format!("k{i}")).collect();
    let bad: [Vec<String>; 3] = [vec![], vec!["x".into(), "x".into()], too_many];
    for keys in bad {
        let err = client.multi_lock(keys).try_acquire().await.unwrap_err();
        assert!(matches!(err, LockError::InvalidArgument(_)), "{err}");
    }
    assert_eq!(calls(&mut raw, "lock.macquire").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_multi_holds_share_and_exclude_a_writer() {
    let (_server, client, _raw) = setup().await;
    let r1 = client.multi_lock(["a", "b"]).shared();
    let r2 = client.multi_lock(["b", "a"]).shared();
    let g1 = r1.try_acquire().await.unwrap().expect("shared");
    let g2 = r2
        .try_acquire()
        .await
        .unwrap()
        .expect("shared with the first");
    assert!(client.lock("a").try_acquire().await.unwrap().is_none());
    assert!(client
        .multi_lock(["a", "b"])
        .try_acquire()
        .await
        .unwrap()
        .is_none());
    drop((g1, g2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_acquire_waits_for_every_key_and_is_granted_when_the_held_one_frees() {
    let (_server, client, mut raw) = setup().await;
    let mut held = client.lock("b").acquire().await.unwrap();
    let waiter = client
        .multi_lock(["a", "b"])
        .wait_timeout(Duration::from_secs(10));
    let task = tokio::spawn(async move { waiter.acquire().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished(), "waits in the server");
    // Queued on a too: nobody barges past it.
    assert!(client.lock("a").try_acquire().await.unwrap().is_none());
    held.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("granted on the release")
        .unwrap()
        .unwrap();
    assert!(guard.tokens()[1] > held.token());
    assert_eq!(
        calls(&mut raw, "lock.macquire").await,
        1,
        "one command, no polling"
    );

    // A wait that passes leaves every queue.
    let timeout = client
        .multi_lock(["b", "c"])
        .wait_timeout(Duration::from_millis(200));
    let err = timeout.acquire().await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    let c = client.lock("c").try_acquire().await.unwrap();
    assert!(c.is_some(), "c is not held by the timed-out request");

    // Opposite orders all finish.
    drop((guard, c));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let keys = if i % 2 == 0 { ["x", "y"] } else { ["y", "x"] };
        let lock = client
            .multi_lock(keys)
            .wait_timeout(Duration::from_secs(10));
        tasks.push(tokio::spawn(async move {
            let mut g = lock.acquire().await?;
            tokio::time::sleep(Duration::from_millis(10)).await;
            g.release().await
        }));
    }
    for task in tasks {
        let r = tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("no deadlock")
            .unwrap();
        assert_eq!(r.unwrap(), Release::Released);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_watchdog_renews_every_key_with_mrenew() {
    let (_server, client, mut raw) = setup().await;
    let lock = client
        .multi_lock(["a", "b", "c"])
        .lease(Duration::from_millis(300));
    let mut guard = lock.acquire().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await; // four leases
    assert_eq!(guard.lost_reason(), None);
    for key in ["a", "b", "c"] {
        assert!(holder(&mut raw, key).await.is_some(), "{key} kept");
    }
    let renewals = calls(&mut raw, "lock.mrenew").await;
    assert!(renewals >= 6, "MRENEW calls: {renewals}");
    assert_eq!(calls(&mut raw, "lock.renew").await, 0, "no per-key renewal");
    assert_eq!(guard.release().await.unwrap(), Release::Released);
    let after = calls(&mut raw, "lock.mrenew").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        calls(&mut raw, "lock.mrenew").await,
        after,
        "renewed after release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forcerelease_of_one_key_loses_the_hold_and_the_release_frees_the_others() {
    // Without the signal: the watchdog's LOCK.MRENEW answers 0 for b.
    let (_server, client, mut raw) = support::setup_without_signal().await;
    let mut guard = client
        .multi_lock(["a", "b", "c"])
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    let lost = guard.lost();
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("b")
        .query_async(&mut raw)
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(3), lost)
        .await
        .expect("lost at the next renewal");
    assert_eq!(reason, LostReason::HoldGone);
    assert!(
        holder(&mut raw, "a").await.is_some(),
        "still held until the release"
    );
    let err = guard.release().await.unwrap_err();
    assert!(
        matches!(
            err,
            LockError::NotHeld {
                lost: Some(LostReason::HoldGone)
            }
        ),
        "{err}"
    );
    for key in ["a", "c"] {
        assert_eq!(
            holder(&mut raw, key).await,
            None,
            "{key} freed by the release"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_signal_on_any_key_loses_the_hold_and_a_drop_frees_the_others() {
    let server = Server::start();
    let client = LockClient::builder(redis::Client::open(server.url()).unwrap())
        .listen_for_lost_signal()
        .build()
        .await
        .unwrap();
    let mut raw = raw(&server).await;
    let guard = client.multi_lock(["a", "b"]).acquire().await.unwrap();
    // Wait for both subscriptions.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let n: Vec<Value> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("lock.lost:{a}")
            .arg("lock.lost:{b}")
            .query_async(&mut raw)
            .await
            .unwrap();
        if n.get(1) == Some(&Value::Int(1)) && n.get(3) == Some(&Value::Int(1)) {
            break;
        }
        assert!(Instant::now() < deadline, "never subscribed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lost = guard.lost();
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("b")
        .query_async(&mut raw)
        .await
        .unwrap();
    // The lease is 30 s: only the signal can tell this fast.
    let reason = tokio::time::timeout(Duration::from_millis(500), lost)
        .await
        .expect("lost on b's signal");
    assert_eq!(reason, LostReason::ForceReleased);
    drop(guard);
    wait_free(&mut raw, "a", Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_frees_every_key_with_one_mrelease() {
    // Without the signal: the release's own reply tells that a key is gone.
    let (_server, client, mut raw) = support::setup_without_signal().await;
    let lock = client.multi_lock(["a", "b"]);
    let mut guard = lock.acquire().await.unwrap();
    assert_eq!(guard.release().await.unwrap(), Release::Released);
    assert_eq!(calls(&mut raw, "lock.mrelease").await, 1);
    assert_eq!(calls(&mut raw, "lock.release").await, 0);
    for key in ["a", "b"] {
        assert_eq!(holder(&mut raw, key).await, None);
    }
    // The server no longer had one key: NotHeld, and the other is released all the same.
    let mut guard = lock.acquire().await.unwrap();
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("a")
        .query_async(&mut raw)
        .await
        .unwrap();
    let err = guard.release().await.unwrap_err();
    assert!(matches!(err, LockError::NotHeld { lost: None }), "{err}");
    assert_eq!(holder(&mut raw, "b").await, None);
    // A drop releases too.
    let guard = lock.acquire().await.unwrap();
    drop(guard);
    wait_free(&mut raw, "a", Duration::from_secs(2)).await;
    wait_free(&mut raw, "b", Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_returns_the_same_tokens_and_one_hold() {
    let (_server, client, mut raw) = setup().await;
    let lock = client.multi_lock(["a", "b"]);
    let mut outer = lock.acquire().await.unwrap();
    let mut inner = lock.try_acquire().await.unwrap().expect("re-entry");
    assert_eq!(inner.tokens(), outer.tokens());
    assert_eq!(inner.release().await.unwrap(), Release::StillHeld);
    assert!(holder(&mut raw, "a").await.is_some());
    assert_eq!(outer.release().await.unwrap(), Release::Released);
    assert_eq!(
        holder(&mut raw, "a").await,
        None,
        "one hold (ONCE): one release ends it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_multi_hold_ends_with_its_connection() {
    let (_server, client, mut raw) = setup().await;
    let guard = client
        .multi_lock(["a", "b"])
        .ephemeral()
        .acquire()
        .await
        .unwrap();
    let lost = guard.lost();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("SKIPME")
        .arg("yes")
        .arg("TYPE")
        .arg("normal")
        .query_async(&mut raw)
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(2), lost)
        .await
        .expect("lost when its connection closed");
    // Seen on the hold's own connection, or told by the server's signal: whichever is first.
    assert!(
        matches!(
            reason,
            LostReason::ConnectionClosed | LostReason::Disconnected
        ),
        "{reason:?}"
    );
    for key in ["a", "b"] {
        assert_eq!(
            holder(&mut raw, key).await,
            None,
            "{key} ended with the connection"
        );
    }
}

#[test]
fn the_blocking_multi_lock_takes_and_releases_every_key() {
    let server = Server::start();
    let client = blocking::LockClient::open(&server.url()).unwrap();
    let lock = client.multi_lock(["a", "b"]);
    let mut guard = lock.acquire().unwrap();
    assert_eq!(guard.tokens().len(), 2);
    assert!(client
        .multi_lock(["b", "c"])
        .try_acquire()
        .unwrap()
        .is_none());
    assert_eq!(guard.release().unwrap(), Release::Released);
    let guard = client
        .multi_lock(["b", "c"])
        .try_acquire()
        .unwrap()
        .expect("free after the release");
    drop(guard); // waits for the release
    assert!(client.lock("c").try_acquire().unwrap().is_some());
}
