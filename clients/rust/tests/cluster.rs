//! The client against a real three-master Redis Cluster (the test kit's `Cluster`, created the
//! way a user does it): commands routed by key on every master, a waiting acquire and an
//! `EPHEMERAL` hold on connections of their own to the key's node, `ASK` followed while a slot
//! migrates, and the lost-hold signal heard with `SSUBSCRIBE` on the key's node.

use std::time::{Duration, Instant};

use lock_testkit::Cluster;
use redis::cluster_async::ClusterConnection;
use redis::Value;
use redis_lock_client::{LockClient, LostReason, Release};
use tokio::runtime::Handle;

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
        // Seen on the hold's own connection, or told by the server's signal: whichever is first.
        assert!(
            matches!(
                reason,
                LostReason::ConnectionClosed | LostReason::Disconnected
            ),
            "{reason:?}"
        );
        assert_eq!(info(&mut con, key).await, Value::Nil);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_on_its_own_connection_follows_ask_while_the_slot_migrates() {
    follows_ask_while_the_slot_migrates(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_ask_follows_ask_while_the_slot_migrates() {
    follows_ask_while_the_slot_migrates(true).await;
}

/// A waiting acquire (with a ticket, or blocking on a connection of its own) while the key's
/// slot migrates: the source answers ASK, the acquire is granted by the importing node.
async fn follows_ask_while_the_slot_migrates(tickets: bool) {
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
    // The slot has had a grant: its token counter is on the source.
    let mut on_source = redis::Client::open(source.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: i64 = redis::cmd("LOCK.ACQUIRE")
        .arg(key)
        .arg("before")
        .arg(1_000)
        .query(&mut on_source)
        .unwrap();
    let _: i64 = redis::cmd("LOCK.RELEASE")
        .arg(key)
        .arg("before")
        .query(&mut on_source)
        .unwrap();
    // Mid-migration: the source answers ASK for a key it does not have. The counter moved
    // first (a node mints a slot's tokens only from the counter while the slot moves: the
    // importing node answers TRYAGAIN until it has it).
    setslot(target, "IMPORTING", &source_id);
    setslot(source, "MIGRATING", &target_id);
    let counter: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(10)
        .query(&mut on_source)
        .unwrap();
    assert_eq!(counter.len(), 1, "{counter:?}");
    let _: () = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(target.port)
        .arg("")
        .arg(0)
        .arg(5_000)
        .arg("KEYS")
        .arg(&counter[0])
        .query(&mut on_source)
        .unwrap();
    let client = LockClient::cluster_builder(cluster.urls())
        .unwrap()
        .wait_with_tickets(tickets)
        .build()
        .await
        .unwrap();
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

/// Moves `slot` from `from` (the node that serves it) to `to`, the way `redis-cli --cluster reshard`
/// does (IMPORTING, MIGRATING, MIGRATE of its keys, then `SETSLOT NODE` on every node), and
/// waits (bounded) until every node names `to` as its master.
fn move_slot(cluster: &Cluster, slot: u16, from: &lock_testkit::Server, to: &lock_testkit::Server) {
    // As the module's tests move slots (tests/cluster.rs): only once every node agrees on the
    // config epochs, then BUMPEPOCH on the target, so no node bumps to an epoch another master
    // already has and loses the slot back to it (Valkey 9.1: the target answered MOVED).
    poll_until(
        || cluster.epochs_agreed(),
        "the nodes do not agree on the config epochs",
    );
    let (from_id, to_id) = (Cluster::node_id(from), Cluster::node_id(to));
    let setslot = |node: &lock_testkit::Server, args: &[&str]| {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(args)
            .query(&mut direct(node))
            .unwrap();
    };
    setslot(to, &["IMPORTING", &from_id]);
    setslot(from, &["MIGRATING", &to_id]);
    // The slot's keys: the module's fencing-token counter (no lock is held while it moves).
    let keys: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(100)
        .query(&mut direct(from))
        .unwrap();
    if !keys.is_empty() {
        let _: () = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(to.port)
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query(&mut direct(from))
            .unwrap();
    }
    for node in [to, from] {
        setslot(node, &["NODE", &to_id]);
    }
    for node in &cluster.nodes {
        if node.port != to.port && node.port != from.port {
            setslot(node, &["NODE", &to_id]);
        }
    }
    let _: String = redis::cmd("CLUSTER")
        .arg("BUMPEPOCH")
        .query(&mut direct(to))
        .unwrap();
    poll_until(
        || cluster.all_name_owner(slot, &to_id),
        "not every node names the target as the slot's master",
    );
    poll_until(
        || {
            cluster
                .nodes
                .iter()
                .all(|n| master_port_seen_by(n, slot) == Some(to.port))
        },
        "the nodes' CLUSTER SLOTS never agreed",
    );
}

/// Polls `done` every 20 ms for up to 20 s, failing with `what` if it never holds.
fn poll_until(done: impl Fn() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn direct(node: &lock_testkit::Server) -> redis::Connection {
    redis::Client::open(node.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

/// The port of `slot`'s master in `node`'s own `CLUSTER SLOTS`.
fn master_port_seen_by(node: &lock_testkit::Server, slot: u16) -> Option<u16> {
    let Value::Array(ranges) = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query::<Value>(&mut direct(node))
        .unwrap()
    else {
        return None;
    };
    ranges.iter().find_map(|range| match range {
        Value::Array(f) => match f.as_slice() {
            [Value::Int(lo), Value::Int(hi), Value::Array(master), ..]
                if (*lo..=*hi).contains(&i64::from(slot)) =>
            {
                match master.get(1) {
                    Some(Value::Int(port)) => u16::try_from(*port).ok(),
                    _ => None,
                }
            }
            _ => None,
        },
        _ => None,
    })
}

/// How many `MOVED` errors `node` has answered (`INFO errorstats`).
fn moved_count(node: &lock_testkit::Server) -> u64 {
    error_count(node, "MOVED")
}

/// How many errors starting with `code` `node` has answered (`INFO errorstats`).
fn error_count(node: &lock_testkit::Server, code: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("errorstats")
        .query(&mut direct(node))
        .unwrap();
    let prefix = format!("errorstat_{code}:count=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map(|n| n.trim().parse().unwrap())
        .unwrap_or(0)
}

/// `LOCK.INFO key` asked of `node` itself (no redirect followed).
fn info_on(node: &lock_testkit::Server, key: &str) -> Value {
    redis::cmd("LOCK.INFO")
        .arg(key)
        .query(&mut direct(node))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_connections_follow_moved_after_the_slot_moved() {
    follow_moved_after_the_slot_moved(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticket_asks_follow_moved_after_the_slot_moved() {
    follow_moved_after_the_slot_moved(true).await;
}

/// The library keeps its copy of the slot map for the connections of its own (a waiting
/// acquire's, or the one tickets are asked on; an EPHEMERAL hold's). Once the key's slot
/// moves, that copy names the old node: its MOVED must be followed, and the copy read again.
async fn follow_moved_after_the_slot_moved(tickets: bool) {
    let cluster = Cluster::start(3);
    PORT.with(|p| p.set(cluster.nodes[0].port));
    let key = &one_key_per_master()[0];
    let slot = slot(key);
    let first = cluster.node_for_slot(slot);
    let second = cluster.nodes.iter().find(|n| n.port != first.port).unwrap();
    // Only the own connections here: the signal's SSUBSCRIBE would count MOVEDs of its own.
    let client = LockClient::cluster_builder(cluster.urls())
        .unwrap()
        .without_lost_signal()
        .wait_with_tickets(tickets)
        .build()
        .await
        .unwrap();
    let waiting = client.lock(key).wait_timeout(Duration::from_secs(2));

    // The map is read, and names `first`.
    waiting.acquire().await.unwrap().release().await.unwrap();

    // A waiting acquire after the move: MOVED from `first`, granted by `second`.
    move_slot(&cluster, slot, first, second);
    let moved_before = moved_count(first);
    let mut guard = waiting.acquire().await.expect("granted after MOVED");
    assert_eq!(
        moved_count(first),
        moved_before + 1,
        "first answered MOVED once"
    );
    assert_ne!(
        info_on(second, key),
        Value::Nil,
        "the hold is on the new node"
    );
    // The ordinary commands (the redis crate's cluster connection) follow it too.
    assert!(client.lock(key).try_acquire().await.unwrap().is_none());
    assert_eq!(guard.release().await.unwrap(), Release::Released);

    // The map was read again after the MOVED: it names `second` now, and an acquire goes there
    // at once.
    let moved_before = moved_count(first);
    waiting.acquire().await.unwrap().release().await.unwrap();
    assert_eq!(
        moved_count(first),
        moved_before,
        "no MOVED: the map was read again"
    );

    // An EPHEMERAL acquire after the slot moves back: MOVED from `second`, the hold bound to
    // a connection to `first` (CLIENT KILL there ends it at once). The nodes now name no host
    // (`MOVED <slot> :<port>`, `?` in CLUSTER SLOTS: the host is the one the client used).
    for node in &cluster.nodes {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-preferred-endpoint-type")
            .arg("unknown-endpoint")
            .query(&mut direct(node))
            .unwrap();
    }
    move_slot(&cluster, slot, second, first);
    let moved_before = moved_count(second);
    let guard = client
        .lock(key)
        .ephemeral()
        .acquire()
        .await
        .expect("granted after MOVED");
    assert_eq!(
        moved_count(second),
        moved_before + 1,
        "second answered MOVED once"
    );
    let Value::Array(fields) = info_on(first, key) else {
        panic!("the hold is on the node the slot moved back to");
    };
    let id = fields
        .chunks(2)
        .find_map(|p| match p {
            [Value::BulkString(n), Value::Int(id)] if n == b"ephemeral" => Some(*id),
            _ => None,
        })
        .expect("bound to a connection");
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query(&mut direct(first))
        .unwrap();
    assert_eq!(killed, 1, "the hold's connection is on the new node");
    let reason = tokio::time::timeout(Duration::from_secs(1), guard.lost())
        .await
        .expect("lost at once");
    assert_eq!(reason, LostReason::ConnectionClosed);
    assert_eq!(info_on(first, key), Value::Nil);
}

/// `INFO commandstats` calls of `LOCK.CHECK` on `node`.
fn check_calls(node: &lock_testkit::Server) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut direct(node))
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_lock.check:calls="))
        .and_then(|rest| rest.split(',').next())
        .map(|n| n.parse().unwrap())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_of_one_node_reports_only_the_holds_it_emptied() {
    // The flushed node PUBLISHes `flushed all` on lock.lost:flush (classic pub/sub, heard on
    // every node); the client checks each of its holds with LOCK.CHECK on the hold's own node and
    // reports only the hold that is gone. The leases are long: not the watchdog.
    let cluster = Cluster::start(3);
    PORT.with(|p| p.set(cluster.nodes[0].port));
    let keys = one_key_per_master();
    let client = LockClient::cluster_builder(cluster.urls())
        .unwrap()
        .listen_for_lost_signal()
        .build()
        .await
        .unwrap();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(client.lock(key).acquire().await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // the subscriptions
    let nodes: Vec<&lock_testkit::Server> = keys
        .iter()
        .map(|k| cluster.node_for_slot(slot(k)))
        .collect();
    let before: Vec<u64> = nodes.iter().map(|n| check_calls(n)).collect();
    let _: () = redis::cmd("FLUSHALL").query(&mut direct(nodes[0])).unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(1), guards[0].lost())
        .await
        .expect("the flush is reported within 1 s");
    assert_eq!(reason, LostReason::Flushed);
    // The holds on the other nodes were checked there, and are still held.
    let deadline = Instant::now() + Duration::from_secs(2);
    for (i, node) in nodes.iter().enumerate().skip(1) {
        while check_calls(node) <= before[i] {
            assert!(Instant::now() < deadline, "{} was never checked", keys[i]);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    for (guard, key) in guards.iter().zip(&keys).skip(1) {
        assert_eq!(guard.lost_reason(), None, "{key}");
        assert_ne!(info_on(cluster.node_for_slot(slot(key)), key), Value::Nil);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_key_holds_go_to_the_slots_master_and_crossslot_is_the_servers_error() {
    let cluster = Cluster::start(3);
    PORT.with(|p| p.set(cluster.nodes[0].port));
    let client = LockClient::cluster_builder(cluster.urls())
        .unwrap()
        .listen_for_lost_signal()
        .build()
        .await
        .unwrap();
    let mut con = raw(&cluster).await;
    // Keys of different slots: the server's CROSSSLOT, nothing held.
    let keys = one_key_per_master();
    let err = client
        .multi_lock([&keys[0], &keys[1]])
        .try_acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, redis_lock_client::LockError::Server(t) if t.starts_with("CROSSSLOT")),
        "{err}"
    );
    assert_eq!(info(&mut con, &keys[0]).await, Value::Nil);

    // One slot (a hash tag), whose number (as a key) lies on another master: sent to the tag's
    // master directly, no MOVED.
    let tagged = ["{wh}:east", "{wh}:west"];
    let moved_before: u64 = cluster.nodes.iter().map(moved_count).sum();
    let lock = client.multi_lock(tagged).lease(Duration::from_millis(600));
    let guard = lock.acquire().await.unwrap();
    assert_eq!(guard.tokens().len(), 2);
    for key in tagged {
        assert_ne!(info(&mut con, key).await, Value::Nil, "{key} held");
    }
    // A waiter on a connection of its own to that master.
    let waiter = client
        .multi_lock(["{wh}:west", "{wh}:north"])
        .wait_timeout(Duration::from_secs(10));
    let task = tokio::spawn(async move { waiter.acquire().await.map(|g| g.tokens().to_vec()) });
    tokio::time::sleep(Duration::from_millis(700)).await; // a renewal or two (LOCK.MRENEW)
    assert!(!task.is_finished());
    assert_eq!(guard.lost_reason(), None);
    // Each key's signal is heard (SSUBSCRIBE on the slot's master).
    let lost = guard.lost();
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("{wh}:east")
        .query_async(&mut con)
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_millis(150), lost)
        .await
        .expect("lost on the signal, before the next renewal");
    assert_eq!(reason, LostReason::ForceReleased);
    drop(guard); // releases {wh}:west
    let tokens = tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the waiter is granted")
        .unwrap()
        .unwrap();
    assert_eq!(tokens.len(), 2);
    let moved_after: u64 = cluster.nodes.iter().map(moved_count).sum();
    assert_eq!(moved_after, moved_before, "no MOVED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_goes_to_the_keys_master_and_an_observer_follows_it_there() {
    let cluster = Cluster::start(3);
    PORT.with(|p| p.set(cluster.nodes[0].port));
    let client = LockClient::cluster(cluster.urls()).await.unwrap();
    let keys = one_key_per_master();
    let key = &keys[2]; // on the third master
    let moved_before: u64 = cluster.nodes.iter().map(moved_count).sum();
    let election = client.election(key);
    let mut observer = election.observe();
    let mut first = election.campaign_with_value("a").await.unwrap();
    // Subscribed before or after the campaign: the value is seen either way.
    let mut seen = next_leader(&mut observer).await;
    if seen.value.is_none() {
        seen = next_leader(&mut observer).await;
    }
    assert_eq!(seen.epoch, first.epoch());
    assert_eq!(seen.value.as_deref(), Some(&b"a"[..]));
    // The second candidate waits on its own connection to the key's master.
    let second = client.election(key);
    let waiting = tokio::spawn(async move { second.campaign_with_value("b").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished());
    first.resign().await.unwrap();
    let b = waiting.await.unwrap().unwrap();
    // Elected with its value at the grant: the read after the messages finds both.
    let elected = next_leader(&mut observer).await;
    assert_eq!(
        (elected.epoch, elected.value.as_deref()),
        (b.epoch(), Some(&b"b"[..]))
    );
    assert!(b.epoch() > first.epoch());
    let moved_after: u64 = cluster.nodes.iter().map(moved_count).sum();
    assert_eq!(moved_after, moved_before, "no MOVED");
    // SSUBSCRIBE on the key's master.
    let channel = redis_lock_client::leader_channel(key.as_bytes());
    let owner = cluster
        .nodes
        .iter()
        .find(|n| master_port_seen_by(n, slot(key)) == Some(n.port))
        .expect("the key's master");
    let subs: Vec<Value> = redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(&channel)
        .query(&mut direct(owner))
        .unwrap();
    assert_eq!(subs.get(1), Some(&Value::Int(1)), "{subs:?}");
}

async fn next_leader(observer: &mut redis_lock_client::Observer) -> redis_lock_client::Leader {
    tokio::time::timeout(Duration::from_secs(5), observer.next())
        .await
        .expect("a leader within 5 s")
        .expect("the observer runs")
}

/// `PUBSUB SHARDNUMSUB channel` on `node`.
fn shard_subscribers(node: &lock_testkit::Server, channel: &str) -> i64 {
    let reply: Vec<Value> = redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(channel)
        .query(&mut direct(node))
        .unwrap();
    match reply.get(1) {
        Some(Value::Int(n)) => *n,
        _ => 0,
    }
}

/// `INFO commandstats` calls of `command` on `node`.
fn calls_on(node: &lock_testkit::Server, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut direct(node))
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map(|n| n.parse().unwrap())
        .unwrap_or(0)
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_whose_slot_moves_is_not_lost_and_is_renewed_on_its_new_node() {
    // A reshard MIGRATEs the held key: on a server with key events the old node publishes
    // `moved 0 * <len> <key>` (not a loss). The library looks for the hold where the key is now
    // (found: same owner and token), moves its subscription there, and keeps renewing it there.
    let cluster = Cluster::start(3);
    PORT.with(|p| p.set(cluster.nodes[0].port));
    let key = &one_key_per_master()[0];
    let channel = format!("lock.lost:{{{key}}}");
    let slot = slot(key);
    let from = cluster.node_for_slot(slot);
    let to = cluster.nodes.iter().find(|n| n.port != from.port).unwrap();
    let key_events = {
        let info = lock_testkit::server_info();
        info.kind == lock_testkit::ServerKind::Valkey || info.version >= (7, 2, 0)
    };
    let client = LockClient::cluster(cluster.urls()).await.unwrap();
    let lease = Duration::from_secs(3);
    let guard = client.lock(key).lease(lease).acquire().await.unwrap();
    wait_until("never subscribed on the old node", || {
        shard_subscribers(from, &channel) == 1
    })
    .await;
    let checks = check_calls(to);
    move_slot(&cluster, slot, from, to);
    if key_events {
        wait_until("the hold was not looked for on its new node", || {
            check_calls(to) > checks
        })
        .await;
    }
    // The subscription follows the key: on the `moved` message, and in any case when the old
    // node drops it (`sunsubscribe`) once the slot is gone.
    wait_until("the subscription did not follow the key", || {
        shard_subscribers(to, &channel) == 1
    })
    .await;
    // Past its lease: renewed on the new node, never reported lost.
    tokio::time::sleep(lease + lease / 3).await;
    assert_eq!(
        guard.lost_reason(),
        None,
        "reported lost after its slot moved"
    );
    assert!(
        calls_on(to, "lock.renew") >= 2,
        "not renewed on the new node"
    );
    let Value::Array(fields) = info_on(to, key) else {
        panic!("the hold is not on the new node");
    };
    let field = |name: &[u8]| {
        fields.chunks(2).find_map(|p| match p {
            [Value::BulkString(n), v] if n == name => Some(v.clone()),
            _ => None,
        })
    };
    assert_eq!(
        field(b"owner"),
        Some(Value::BulkString(guard.owner().into()))
    );
    assert_eq!(field(b"token"), Some(Value::Int(guard.token() as i64)));
    {
        // The subscription is on the new node: its FORCERELEASE, sent right after a renewal
        // (the next is a third of a lease away), is heard with the server's reason.
        let renewals = calls_on(to, "lock.renew");
        wait_until("no renewal", || calls_on(to, "lock.renew") > renewals).await;
        let _: i64 = redis::cmd("LOCK.FORCERELEASE")
            .arg(key)
            .query(&mut direct(to))
            .unwrap();
        let reason = tokio::time::timeout(Duration::from_millis(500), guard.lost())
            .await
            .expect("heard on the new node");
        assert_eq!(reason, LostReason::ForceReleased);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_command_goes_to_the_lock_keys_master() {
    let cluster = Cluster::start(3);
    PORT.with(|p| p.set(cluster.nodes[0].port));
    let client = LockClient::cluster_builder(cluster.urls())
        .unwrap()
        .without_lost_signal()
        .build()
        .await
        .unwrap();
    let mut con = raw(&cluster).await;
    let moved_before: u64 = cluster.nodes.iter().map(moved_count).sum();
    for key in one_key_per_master() {
        // The lock key and its data share a hash tag, so a slot and a master.
        let lock_key = format!("{{{key}}}");
        let data = format!("{{{key}}}:data");
        let guard = client.lock(&lock_key).acquire().await.unwrap();
        let n: i64 = guard.fenced(redis::cmd("INCR").arg(&data)).await.unwrap();
        assert_eq!(n, 1);
        let node = cluster.node_for_slot(slot(&key));
        let stored: String = redis::cmd("GET")
            .arg(&data)
            .query(&mut direct(node))
            .unwrap();
        assert_eq!(stored, "1", "written on the lock key's master");
        // A data key of another slot: the server's CROSSSLOT; the hold is untouched.
        let err = guard
            .fenced::<i64>(redis::cmd("INCR").arg("untagged"))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, redis_lock_client::LockError::Server(t) if t.starts_with("CROSSSLOT")),
            "{err}"
        );
        assert_eq!(guard.lost_reason(), None);
        let _: i64 = redis::cmd("LOCK.FORCERELEASE")
            .arg(&lock_key)
            .query_async(&mut con)
            .await
            .unwrap();
        let refused = guard.fenced::<i64>(redis::cmd("INCR").arg(&data)).await;
        assert!(
            matches!(
                refused,
                Err(redis_lock_client::LockError::Fenced {
                    lost: LostReason::HoldGone
                })
            ),
            "{refused:?}"
        );
        let stored: String = redis::cmd("GET")
            .arg(&data)
            .query(&mut direct(node))
            .unwrap();
        assert_eq!(stored, "1", "the refused command did not run");
    }
    let moved_after: u64 = cluster.nodes.iter().map(moved_count).sum();
    assert_eq!(moved_after, moved_before, "no MOVED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_hold_whose_slot_moves_lives_on_unbound_and_is_renewed_there() {
    // The new node has the hold, bound to nothing (its connection is to the old node): it is
    // not lost, it is renewed (and released) where the key is now, a lease hold from here.
    let cluster = Cluster::start(3);
    PORT.with(|p| p.set(cluster.nodes[0].port));
    let key = &one_key_per_master()[1];
    let slot = slot(key);
    let from = cluster.node_for_slot(slot);
    let to = cluster.nodes.iter().find(|n| n.port != from.port).unwrap();
    let client = LockClient::cluster(cluster.urls()).await.unwrap();
    let lease = Duration::from_secs(3);
    let mut guard = client
        .lock(key)
        .lease(lease)
        .ephemeral()
        .acquire()
        .await
        .unwrap();
    move_slot(&cluster, slot, from, to);
    tokio::time::sleep(lease + lease / 3).await;
    assert_eq!(
        guard.lost_reason(),
        None,
        "reported lost after its slot moved"
    );
    assert!(
        calls_on(to, "lock.renew") >= 2,
        "not renewed on the new node"
    );
    assert_ne!(info_on(to, key), Value::Nil);
    // A fenced command and the release go where the key is.
    let n: i64 = guard
        .fenced(redis::cmd("INCR").arg(format!("{{{key}}}:n")))
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(guard.release().await.unwrap(), Release::Released);
    assert_eq!(info_on(to, key), Value::Nil);
}

// ---- Waiting with tickets in a cluster ----

/// Two keys whose slots differ and are served by the same master (the first third of the slot
/// space), and one served by another master.
fn two_slots_on_one_node_and_another() -> (String, String, String) {
    let mut first_third = (0..)
        .map(|i| format!("lock:{i}"))
        .filter(|k| slot(k) < 5_000);
    let a = first_third.next().unwrap();
    let b = first_third.find(|k| slot(k) != slot(&a)).unwrap();
    (a, b, one_key_per_master()[1].clone())
}

/// A cluster client with the default settings but for the lost-hold signal (so that its
/// connections to a node are the asking one and, while tickets wait, the waiting ones).
async fn ticket_client(cluster: &Cluster, tickets: bool) -> LockClient {
    LockClient::cluster_builder(cluster.urls())
        .unwrap()
        .without_lost_signal()
        .wait_with_tickets(tickets)
        .build()
        .await
        .unwrap()
}

/// `CLIENT LIST` lines of `node` (of the connections named `name`, when given).
fn client_list(node: &lock_testkit::Server, name: Option<&str>) -> Vec<String> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut direct(node))
        .unwrap();
    let field = name.map(|n| format!(" name={n} "));
    list.lines()
        .filter(|l| field.as_ref().is_none_or(|f| l.contains(f.as_str())))
        .map(str::to_string)
        .collect()
}

fn popping(lines: &[String]) -> usize {
    lines.iter().filter(|l| l.contains(" cmd=blpop ")).count()
}

/// Whether any connection of any node is blocked in a LOCK.* command.
fn blocked_in_lock(cluster: &Cluster) -> Vec<String> {
    cluster
        .nodes
        .iter()
        .flat_map(|n| client_list(n, None))
        .filter(|l| l.contains(" flags=b") && l.contains(" cmd=lock."))
        .collect()
}

/// A counter of `INFO lock` on `node`.
fn lock_stat(node: &lock_testkit::Server, name: &str) -> i64 {
    let info: String = redis::cmd("INFO")
        .arg("lock")
        .query(&mut direct(node))
        .unwrap();
    let prefix = format!("{name}:");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or_else(|| panic!("INFO lock has no {name}"))
}

/// `LOCK.INFO key`'s `waiters` on `node` (`ASKING` first: the slot may be importing there; 0
/// where the key is not served).
fn waiters_on(node: &lock_testkit::Server, key: &str) -> i64 {
    let mut con = direct(node);
    let _: () = redis::cmd("ASKING").query(&mut con).unwrap();
    // A node the key left answers a redirect: no waiters there.
    let Ok(Value::Array(fields)) = redis::cmd("LOCK.INFO").arg(key).query::<Value>(&mut con) else {
        return 0;
    };
    fields
        .chunks(2)
        .find_map(|p| match p {
            [Value::BulkString(n), Value::Int(w)] if n == b"waiters" => Some(*w),
            _ => None,
        })
        .unwrap_or(0)
}

fn client_name(client: &LockClient) -> String {
    format!("redis-lock-client:{}", client.id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_waits_take_tickets_one_blpop_per_slot_in_arrival_order() {
    let cluster = Cluster::start(3);
    PORT.with(|p| p.set(cluster.nodes[0].port));
    let (a, b, c) = two_slots_on_one_node_and_another();
    let node = cluster.node_for_slot(slot(&a));
    let other = cluster.node_for_slot(slot(&c));
    assert_eq!(cluster.node_for_slot(slot(&b)).port, node.port);
    assert_ne!(other.port, node.port);
    let client = ticket_client(&cluster, true).await;
    let holder = ticket_client(&cluster, true).await;
    let mut held = Vec::new();
    for key in [&a, &b, &c] {
        held.push(holder.lock(key).acquire().await.unwrap());
    }
    // Four waits on `a`, one after the other; two on `b` (another slot of the same node); one
    // on `c` (another node).
    let (granted, mut order) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for (i, key) in [&a, &a, &a, &a, &b, &b, &c].into_iter().enumerate() {
        let lock = client.lock(key).wait_timeout(Duration::from_secs(30));
        let granted = granted.clone();
        let key_node = cluster.node_for_slot(slot(key));
        let before = waiters_on(key_node, key);
        tasks.push(tokio::spawn(async move {
            let mut guard = lock.acquire().await?;
            let _ = granted.send(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
            guard.release().await
        }));
        wait_until("the wait queues", || {
            waiters_on(key_node, key) == before + 1
        })
        .await;
    }
    assert_eq!(lock_stat(node, "lock_waits_ticketed"), 6);
    assert_eq!(lock_stat(other, "lock_waits_ticketed"), 1);
    // One BLPOP per slot with waits: two on `node` for six waits, one on `other`.
    let name = client_name(&client);
    wait_until("one BLPOP per slot", || {
        popping(&client_list(node, Some(&name))) == 2
            && popping(&client_list(other, Some(&name))) == 1
    })
    .await;
    assert!(
        blocked_in_lock(&cluster).is_empty(),
        "{:?}",
        blocked_in_lock(&cluster)
    );
    // Released: `a`'s waiters are granted in the order they came, then the others.
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
    drop(granted);
    let mut on_a = Vec::new();
    while let Some(i) = order.recv().await {
        if i < 4 {
            on_a.push(i);
        }
    }
    assert_eq!(on_a, vec![0, 1, 2, 3], "arrival order");
    for n in &cluster.nodes {
        assert_eq!(lock_stat(n, "lock_tickets"), 0);
    }
    // The waiting connections close when no ticket waits.
    wait_until("the waiting connections close", || {
        popping(&client_list(node, Some(&name))) == 0 && client_list(node, Some(&name)).len() <= 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_wait_across_a_slot_migration_is_granted_once() {
    // Two ticket waits while the key's slot migrates: the first waits (BLPOP on the source)
    // before it starts, the second comes during it (its BLPOP, with the first's, is redirected
    // by the server: ASK, TRYAGAIN on the importing node until the tickets arrive). Each
    // ticket is told the redirect when the lock leaves, each waiter asks again on the target,
    // and each is granted there once, after the holder.
    let cluster = Cluster::start(3);
    PORT.with(|p| p.set(cluster.nodes[0].port));
    let key = one_key_per_master()[0].clone();
    let slot = slot(&key);
    let source = cluster.node_for_slot(slot);
    let target = cluster
        .nodes
        .iter()
        .find(|n| n.port != source.port)
        .unwrap();
    let (source_id, target_id) = (Cluster::node_id(source), Cluster::node_id(target));
    let client = ticket_client(&cluster, true).await;
    let holder = ticket_client(&cluster, false).await;
    let mut held = holder.lock(&key).acquire().await.unwrap();
    let waiter = |owner_lock: redis_lock_client::Lock| {
        tokio::spawn(async move {
            let mut guard = owner_lock.acquire().await?;
            let token = guard.token();
            tokio::time::sleep(Duration::from_millis(100)).await;
            guard.release().await?;
            Ok::<u64, redis_lock_client::LockError>(token)
        })
    };
    let w1 = waiter(client.lock(&key).wait_timeout(Duration::from_secs(60)));
    let name = client_name(&client);
    wait_until("the first wait pops on the source", || {
        waiters_on(source, &key) == 1 && popping(&client_list(source, Some(&name))) == 1
    })
    .await;
    let setslot = |node: &lock_testkit::Server, args: &[&str]| {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(args)
            .query(&mut direct(node))
            .unwrap();
    };
    setslot(target, &["IMPORTING", &source_id]);
    setslot(source, &["MIGRATING", &target_id]);
    let w2 = waiter(client.lock(&key).wait_timeout(Duration::from_secs(60)));
    wait_until("the second wait queues on the source", || {
        waiters_on(source, &key) == 2
    })
    .await;
    // The reshard: every key of the slot (the lock, its counter, then the tickets the module
    // answered with the redirect), until none is left.
    let mut quiet = 0;
    while quiet < 3 {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100)
            .query(&mut direct(source))
            .unwrap();
        if keys.is_empty() {
            quiet += 1;
        } else {
            quiet = 0;
            let _: () = redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(target.port)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys)
                .query(&mut direct(source))
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Both asked again on the target (ASKING: still importing), once each: after the redirect
    // their tickets answered, not after the server redirected a BLPOP.
    wait_until("both waits queue on the target", || {
        waiters_on(target, &key) == 2
    })
    .await;
    assert_eq!(lock_stat(source, "lock_waits_ticketed"), 2);
    assert_eq!(lock_stat(target, "lock_waits_ticketed"), 2);
    for node in [target, source] {
        setslot(node, &["NODE", &target_id]);
    }
    for node in &cluster.nodes {
        if node.port != target.port && node.port != source.port {
            setslot(node, &["NODE", &target_id]);
        }
    }
    assert!(
        blocked_in_lock(&cluster).is_empty(),
        "{:?}",
        blocked_in_lock(&cluster)
    );
    held.release().await.unwrap();
    let mut tokens = Vec::new();
    for task in [w1, w2] {
        let token = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("granted")
            .unwrap()
            .expect("granted on the target");
        assert!(token > held.token(), "{token} after {}", held.token());
        tokens.push(token);
    }
    assert_ne!(tokens[0], tokens[1], "two grants, one each");
    // Exactly once each: nothing queued, held or left in a ticket on either node.
    for node in [source, target] {
        assert_eq!(lock_stat(node, "lock_tickets"), 0);
        assert_eq!(waiters_on(node, &key), 0);
    }
    assert_eq!(info_on(target, &key), Value::Nil, "the key is free");
    let left: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(100)
        .query(&mut direct(source))
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_ticket_wait_given_up_leaks_nothing() {
    let cluster = Cluster::start(3);
    PORT.with(|p| p.set(cluster.nodes[0].port));
    let key = one_key_per_master()[2].clone();
    let node = cluster.node_for_slot(slot(&key));
    let client = ticket_client(&cluster, true).await;
    let holder = ticket_client(&cluster, false).await;
    // Dropped while it waits: withdrawn (LOCK.CANCEL, on the key's node).
    let mut held = holder.lock(&key).acquire().await.unwrap();
    let waiter = client.lock(&key);
    let gave_up = tokio::time::timeout(Duration::from_millis(300), waiter.acquire()).await;
    assert!(gave_up.is_err(), "still waiting when dropped");
    wait_until("the ticket is withdrawn", || {
        calls_on(node, "lock.cancel") == 1
    })
    .await;
    assert_eq!(waiters_on(node, &key), 0);
    held.release().await.unwrap();
    assert_eq!(
        info_on(node, &key),
        Value::Nil,
        "nobody was granted the key"
    );
    // Given up about when it is granted: the grant goes to the pop or to the cancel, and is
    // released either way.
    for round in 0..8u64 {
        let mut held = holder.lock(&key).acquire().await.unwrap();
        let waiter = client.lock(&key);
        let give_up = Duration::from_millis(100 + round * 3);
        let task =
            tokio::spawn(async move { tokio::time::timeout(give_up, waiter.acquire()).await });
        wait_until("the wait queues", || waiters_on(node, &key) == 1).await;
        tokio::time::sleep(Duration::from_millis(60 + round * 7)).await;
        held.release().await.unwrap();
        if let Ok(got) = task.await.unwrap() {
            got.expect("granted").release().await.unwrap();
        }
        wait_until("no grant leaked", || info_on(node, &key) == Value::Nil).await;
    }
    assert_eq!(lock_stat(node, "lock_tickets"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_asking_connection_to_a_node_makes_the_wait_ask_again() {
    let cluster = Cluster::start(3);
    PORT.with(|p| p.set(cluster.nodes[0].port));
    let key = one_key_per_master()[1].clone();
    let node = cluster.node_for_slot(slot(&key));
    let client = ticket_client(&cluster, true).await;
    let holder = ticket_client(&cluster, false).await;
    let mut held = holder.lock(&key).acquire().await.unwrap();
    let waiter = client.lock(&key).wait_timeout(Duration::from_secs(30));
    let owner = waiter.owner().to_string();
    let task = tokio::spawn(async move { waiter.acquire().await });
    let name = client_name(&client);
    wait_until("the wait pops", || {
        popping(&client_list(node, Some(&name))) == 1
    })
    .await;
    // The client's other connection to the node is the one that asked.
    let asking = client_list(node, Some(&name))
        .into_iter()
        .find(|l| !l.contains(" cmd=blpop "))
        .expect("the asking connection");
    let id: i64 = asking
        .split(' ')
        .find_map(|f| f.strip_prefix("id="))
        .unwrap()
        .parse()
        .unwrap();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query(&mut direct(node))
        .unwrap();
    assert_eq!(killed, 1);
    // The server dropped the ticket with its connection; the library asks again.
    wait_until("the acquire is asked again", || {
        lock_stat(node, "lock_waits_ticketed") == 2 && waiters_on(node, &key) == 1
    })
    .await;
    held.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the wait ends")
        .unwrap()
        .expect("granted");
    let alive: i64 = redis::cmd("LOCK.CHECK")
        .arg(&key)
        .arg(&owner)
        .arg(guard.token())
        .query(&mut direct(node))
        .unwrap();
    assert_eq!(alive, 1, "the guard's hold is the server's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_wait_in_a_cluster_takes_a_ticket_on_the_keys_node() {
    let cluster = Cluster::start(3);
    PORT.with(|p| p.set(cluster.nodes[0].port));
    let key = one_key_per_master()[2].clone();
    let node = cluster.node_for_slot(slot(&key));
    let client = ticket_client(&cluster, true).await;
    let holder = ticket_client(&cluster, false).await;
    let mut held = holder.lock(&key).acquire().await.unwrap();
    let waiter = client
        .lock(&key)
        .ephemeral()
        .wait_timeout(Duration::from_secs(20));
    let task = tokio::spawn(async move { waiter.acquire().await });
    let name = client_name(&client);
    wait_until("the wait pops on the key's node", || {
        waiters_on(node, &key) == 1 && popping(&client_list(node, Some(&name))) == 1
    })
    .await;
    assert_eq!(lock_stat(node, "lock_waits_ticketed"), 1);
    assert!(
        blocked_in_lock(&cluster).is_empty(),
        "{:?}",
        blocked_in_lock(&cluster)
    );
    held.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("granted")
        .unwrap()
        .expect("granted");
    // Bound to the connection that asked: killed, the hold ends at once.
    let Value::Array(fields) = info_on(node, &key) else {
        panic!("held");
    };
    let id = fields
        .chunks(2)
        .find_map(|p| match p {
            [Value::BulkString(n), Value::Int(id)] if n == b"ephemeral" => Some(*id),
            _ => None,
        })
        .expect("bound to a connection");
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query(&mut direct(node))
        .unwrap();
    assert_eq!(killed, 1);
    let reason = tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost at once");
    assert_eq!(reason, LostReason::ConnectionClosed);
    assert_eq!(info_on(node, &key), Value::Nil);
    assert_eq!(lock_stat(node, "lock_tickets"), 0);
}

/// Review: in a cluster the group interrupts its `BLPOP` with `CLIENT UNBLOCK` on the asking
/// connection to the node, which a write pause does not hold up (`LOCK.CANCEL` goes on the
/// cluster connection). While writes are paused (`CLIENT PAUSE WRITE`; a manual `CLUSTER
/// FAILOVER` pauses the old master's writes too) a re-sent `BLPOP` is postponed, and `CLIENT
/// UNBLOCK` of a postponed client kills Redis 7.0 (Debian's 7.0.15: "Guru Meditation: Unknown
/// btype in replyToBlockedClientTimedOut()"). Two waiters giving up during the pause suffice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_waiters_giving_up_during_a_write_pause_do_not_bring_the_node_down() {
    let cluster = Cluster::start(3);
    PORT.with(|p| p.set(cluster.nodes[0].port));
    let key = one_key_per_master()[1].clone();
    let node = cluster.node_for_slot(slot(&key));
    let client = ticket_client(&cluster, true).await;
    let holder = ticket_client(&cluster, false).await;
    let _held = holder.lock(&key).acquire().await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let waiter = client.lock(&key).wait_timeout(Duration::from_secs(60));
        tasks.push(tokio::spawn(async move { waiter.acquire().await }));
    }
    wait_until("three wait", || waiters_on(node, &key) == 3).await;
    let name = client_name(&client);
    wait_until("the wait pops", || {
        popping(&client_list(node, Some(&name))) == 1
    })
    .await;
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(8_000)
        .arg("WRITE")
        .query(&mut direct(node))
        .unwrap();
    tasks.remove(0).abort();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    tasks.remove(0).abort();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let alive = redis::Client::open(node.url())
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(2))
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
    let log = node.log();
    let crash: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("Guru Meditation"))
        .collect();
    assert!(alive.is_ok(), "the node is down: {alive:?} {crash:?}");
    // Where it survives (Redis 8.2.3: the unblock of a postponed BLPOP answers 0), the group
    // sends `CLIENT UNBLOCK` again every 5 ms until the pause ends (329 calls in 2.5 s here).
    let unblocks = calls_on(node, "client|unblock");
    eprintln!("{unblocks} CLIENT UNBLOCK calls");
    assert!(
        unblocks < 50,
        "{unblocks} CLIENT UNBLOCK calls during the pause"
    );
    let _: redis::RedisResult<()> = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut direct(node));
}

/// A cluster failover (`CLUSTER FAILOVER` on the key's master's replica) while a ticket waits.
/// The queue lived in the old master's memory only, and the asking connection to the old node
/// still lives: the old node, now a replica, ends the `BLPOP` (`UNBLOCKED`; a `BLPOP` sent there
/// later is `MOVED`), and that voids the tickets asked there. The wait asks again (`ONCE`), on
/// the new master, and is granted there once the lock is free: not after its whole wait (or
/// never, with no timeout), as it was when the `BLPOP` just followed the redirect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_wait_across_a_cluster_failover_is_asked_again_on_the_new_master() {
    wait_across_a_cluster_failover(true).await;
}

/// The same with a blocking wait (the role change unblocks it: it ends with the error). Not on
/// Valkey: there a wait blocked in the module is not ended when its node becomes a replica (it
/// waits out its timeout); the ticket wait above, the default, is asked again there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_wait_across_a_cluster_failover_is_asked_again_on_the_new_master() {
    if std::env::var("LOCK_SERVER").is_ok_and(|s| s.contains("valkey")) {
        eprintln!("skipped on Valkey: a module-blocked wait outlives its node's role change");
        return;
    }
    wait_across_a_cluster_failover(false).await;
}

async fn wait_across_a_cluster_failover(tickets: bool) {
    let cluster = Cluster::start(3);
    PORT.with(|p| p.set(cluster.nodes[0].port));
    let key = one_key_per_master()[1].clone();
    let master = cluster.node_for_slot(slot(&key));
    let replica = cluster.add_replica(master);
    let client = ticket_client(&cluster, tickets).await;
    let holder = ticket_client(&cluster, false).await;
    let mut held = holder.lock(&key).acquire().await.unwrap();
    let waiter = client.lock(&key).wait_timeout(Duration::from_secs(60));
    let task = tokio::spawn(async move { waiter.acquire().await });
    wait_until("the wait queues", || waiters_on(master, &key) == 1).await;
    let _: () = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .query(&mut direct(&replica))
        .unwrap();
    // Both ends of the failover (a bound against a hang): the replica leads, and the old master
    // has stepped down, so that the holder's release is not sent into the manual failover's
    // write pause (which can outlast the command timeout on a loaded machine).
    let is_master = |node: &lock_testkit::Server| {
        let role: Vec<Value> = redis::cmd("ROLE").query(&mut direct(node)).unwrap();
        matches!(role.first(), Some(Value::BulkString(r)) if r == b"master")
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !is_master(&replica) || is_master(master) {
        assert!(Instant::now() < deadline, "the failover did not complete");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The holder releases on the new master (MOVED from the old one): the lock is free there.
    // Once: a guard's release is never retried (a second call answers AlreadyReleased).
    assert_eq!(held.release().await.unwrap(), Release::Released);
    // Granted there, or ended with an error (a blocking wait ends with `UNBLOCKED`): either way
    // promptly, not after the whole wait (or never, with no timeout).
    let ended = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("the wait ends (the lock is free on the new master)")
        .unwrap();
    eprintln!("the wait ended: {:?}", ended.as_ref().map(|g| g.token()));
    if tickets {
        // Asked again on the new master, and granted there after the holder.
        let guard = ended.expect("granted on the new master");
        assert!(guard.token() > held.token());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_key_release_caught_by_a_half_moved_slot_is_sent_again() {
    release_caught_by_a_half_moved_slot(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_multi_key_release_caught_by_a_half_moved_slot_is_sent_again() {
    release_caught_by_a_half_moved_slot(true).await;
}

/// One key of a held pair moved, the other not: the source answers the release `TRYAGAIN`
/// (nothing ran). The release is sent again after growing pauses; the move ends meanwhile and
/// the release is answered where the keys are.
async fn release_caught_by_a_half_moved_slot(ephemeral: bool) {
    let cluster = Cluster::start(3);
    PORT.with(|p| p.set(cluster.nodes[0].port));
    let (a, b) = ("{reltryagain}:a", "{reltryagain}:b");
    let slot = slot(a);
    let source = cluster.node_for_slot(slot);
    let target = cluster
        .nodes
        .iter()
        .find(|n| n.port != source.port)
        .unwrap();
    let client = LockClient::cluster_builder(cluster.urls())
        .unwrap()
        .build()
        .await
        .unwrap();
    let mut lock = client.multi_lock([a, b]).lease(Duration::from_secs(30));
    if ephemeral {
        lock = lock.ephemeral();
    }
    let mut guard = lock.acquire().await.unwrap();
    // Half moved: IMPORTING/MIGRATING, and `a` alone migrated.
    let (source_id, target_id) = (Cluster::node_id(source), Cluster::node_id(target));
    for (node, state, id) in [
        (target, "IMPORTING", &source_id),
        (source, "MIGRATING", &target_id),
    ] {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(state)
            .arg(id)
            .query(&mut direct(node))
            .unwrap();
    }
    let _: () = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(target.port)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(a)
        .query(&mut direct(source))
        .unwrap();
    let before = error_count(source, "TRYAGAIN");
    // The move ends meanwhile (the rest of the keys, then the slot the target's everywhere).
    let released = std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            move_slot(&cluster, slot, source, target);
        });
        tokio::task::block_in_place(|| Handle::current().block_on(guard.release()))
    });
    assert_eq!(released.unwrap(), Release::Released);
    assert!(error_count(source, "TRYAGAIN") > before);
    assert_eq!(info_on(target, a), Value::Nil);
    assert_eq!(info_on(target, b), Value::Nil);
}
