//! The client against a real three-master Redis Cluster (the test kit's `Cluster`, created the
//! way a user does it): commands routed by key on every master, a waiting acquire and an
//! `EPHEMERAL` hold on connections of their own to the key's node, `ASK` followed while a slot
//! migrates, and the lost-hold signal heard with `SSUBSCRIBE` on the key's node.

use std::time::{Duration, Instant};

use lock_testkit::Cluster;
use redis::cluster_async::ClusterConnection;
use redis::Value;
use redis_lock_client::{LockClient, LostReason, Release};

/// A key whose slot lies in each third of the slot space (one per master of a fresh cluster).
fn one_key_per_master() -> Vec<String> {
    [0u16, 5_461, 10_923]
        .into_iter()
        .map(|low| {
            (0..)
                .map(|i| format!("lock:{i}"))
                .find(|k| (low..low + 5_000).contains(&slot(k)))
                .unwrap()
        })
        .collect()
}

fn slot(key: &str) -> u16 {
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{}/", PORT.with(|p| p.get())))
        .unwrap()
        .get_connection()
        .unwrap();
    let n: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut con)
        .unwrap();
    u16::try_from(n).unwrap()
}

thread_local! {
    static PORT: std::cell::Cell<u16> = const { std::cell::Cell::new(0) };
}

async fn raw(cluster: &Cluster) -> ClusterConnection {
    redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap()
}

async fn info(con: &mut ClusterConnection, key: &str) -> Value {
    redis::cmd("LOCK.INFO")
        .arg(key)
        .query_async(con)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_wait_and_are_lost_on_every_master() {
    let cluster = Cluster::start(3);
    PORT.with(|p| p.set(cluster.nodes[0].port));
    let keys = one_key_per_master();
    let client = LockClient::cluster_builder(cluster.urls())
        .unwrap()
        .listen_for_lost_signal()
        .build()
        .await
        .unwrap();
    assert!(client.is_cluster());
    let mut con = raw(&cluster).await;
    for key in &keys {
        // Routed by key: acquire, exclusion, a waiter on its own connection to the key's node.
        let held = client.lock(key).acquire().await.unwrap();
        assert!(client.lock(key).try_acquire().await.unwrap().is_none());
        let waiter = client.lock(key).wait_timeout(Duration::from_secs(10));
        let task = tokio::spawn(async move { waiter.acquire().await.map(|g| g.token()) });
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!task.is_finished(), "the waiter waits in the server");
        let mut held = held;
        assert_eq!(held.release().await.unwrap(), Release::Released);
        let token = task.await.unwrap().expect("granted on the key's node");
        assert!(token > held.token());

        // The lost-hold signal through SSUBSCRIBE on the key's node.
        let guard = client.lock(key).acquire().await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await; // the subscription
        let started = Instant::now();
        let _: i64 = redis::cmd("LOCK.FORCERELEASE")
            .arg(key)
            .query_async(&mut con)
            .await
            .unwrap();
        let reason = tokio::time::timeout(Duration::from_secs(1), guard.lost())
            .await
            .expect("the signal arrives");
        assert_eq!(reason, LostReason::ForceReleased, "{key}");
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ephemeral_holds_live_on_a_connection_to_the_keys_node() {
    let cluster = Cluster::start(3);
    PORT.with(|p| p.set(cluster.nodes[0].port));
    let keys = one_key_per_master();
    let client = LockClient::cluster(cluster.urls()).await.unwrap();
    let mut con = raw(&cluster).await;
    for key in &keys {
        let guard = client.lock(key).ephemeral().acquire().await.unwrap();
        let Value::Array(fields) = info(&mut con, key).await else {
            panic!("{key} is held");
        };
        let id = fields
            .chunks(2)
            .find_map(|p| match p {
                [Value::BulkString(n), Value::Int(id)] if n == b"ephemeral" => Some(*id),
                _ => None,
            })
            .expect("bound to a connection");
        // That connection is on the key's node: CLIENT KILL there ends the hold at once.
        let node = cluster.node_for_slot(slot(key));
        let mut direct = redis::Client::open(node.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(id)
            .query(&mut direct)
            .unwrap();
        assert_eq!(killed, 1, "the hold's connection is on {key}'s node");
        let reason = tokio::time::timeout(Duration::from_secs(1), guard.lost())
            .await
            .expect("lost at once");
        assert_eq!(reason, LostReason::ConnectionClosed);
        assert_eq!(info(&mut con, key).await, Value::Nil);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_on_its_own_connection_follows_ask_while_the_slot_migrates() {
    let cluster = Cluster::start(3);
    PORT.with(|p| p.set(cluster.nodes[0].port));
    let key = &one_key_per_master()[0];
    let slot = slot(key);
    let source = cluster.node_for_slot(slot);
    let target = cluster
        .nodes
        .iter()
        .find(|n| n.port != source.port)
        .unwrap();
    let (source_id, target_id) = (Cluster::node_id(source), Cluster::node_id(target));
    let setslot = |node: &lock_testkit::Server, state: &str, id: &str| {
        let mut c = redis::Client::open(node.url())
            .unwrap()
            .get_connection()
            .unwrap();
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(state)
            .arg(id)
            .query(&mut c)
            .unwrap();
    };
    // Mid-migration: the source answers ASK for a key it does not have.
    setslot(target, "IMPORTING", &source_id);
    setslot(source, "MIGRATING", &target_id);
    let client = LockClient::cluster(cluster.urls()).await.unwrap();
    let guard = client
        .lock(key)
        .wait_timeout(Duration::from_secs(2))
        .acquire()
        .await
        .expect("granted by the importing node after ASK");
    let mut on_target = redis::Client::open(target.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("ASKING").query(&mut on_target).unwrap();
    let there: Value = redis::cmd("LOCK.INFO")
        .arg(key)
        .query(&mut on_target)
        .unwrap();
    assert_ne!(there, Value::Nil, "the hold is on the importing node");
    assert!(guard.token() > 0);
}
