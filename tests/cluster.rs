//! Redis Cluster: a real three-master cluster on loopback, created by the test itself. LOCK.*
//! commands declare their keys, so a cluster client routes them; the token counter lives in
//! the lock key's slot; a node answers MOVED for a key it does not serve; and a lock key that
//! migrates keeps its lock while its waiters are redirected, never left hanging.

use std::thread;
use std::time::Duration;

use lock_core::slot::{counter_key, key_slot};
use lock_testkit::*;

const SOON: Duration = Duration::from_secs(5);

/// A key whose slot lies in each third of the slot space: `redis-cli --cluster create` gives
/// each of three masters one third.
fn one_key_per_master() -> Vec<String> {
    [0u16, 5_461, 10_923]
        .into_iter()
        .map(|low| {
            (0..)
                .map(|i| format!("lock:{i}"))
                .find(|k| (low..low + 5_000).contains(&key_slot(k.as_bytes())))
                .unwrap()
        })
        .collect()
}

fn cluster_acquire(
    con: &mut redis::cluster::ClusterConnection,
    key: &str,
    owner: &str,
    wait_ms: Option<u64>,
) -> redis::RedisResult<Option<i64>> {
    let mut cmd = redis::cmd("LOCK.ACQUIRE");
    cmd.arg(key).arg(owner).arg(60_000);
    if let Some(ms) = wait_ms {
        cmd.arg("WAIT").arg(ms);
    }
    cmd.query(con)
}

fn cluster_release(
    con: &mut redis::cluster::ClusterConnection,
    key: &str,
    owner: &str,
) -> Option<i64> {
    redis::cmd("LOCK.RELEASE")
        .arg(key)
        .arg(owner)
        .query(con)
        .unwrap()
}

#[test]
fn locks_wait_and_hand_off_on_every_master_through_a_cluster_client() {
    let cluster = Cluster::start(3);
    let keys = one_key_per_master();
    let mut serving_ports: Vec<u16> = keys
        .iter()
        .map(|k| cluster.node_for_slot(key_slot(k.as_bytes())).port)
        .collect();
    serving_ports.sort();
    serving_ports.dedup();
    assert_eq!(
        serving_ports.len(),
        3,
        "the keys are spread over all masters"
    );

    let mut con = cluster.client();
    for key in &keys {
        let slot = key_slot(key.as_bytes());
        // Our slot function agrees with the server's, for the key and its token counter.
        let node = cluster.node_for_slot(slot);
        let mut direct = node.connect();
        let server_slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut direct)
            .unwrap();
        assert_eq!(server_slot, i64::from(slot));

        let first = cluster_acquire(&mut con, key, "a", None).unwrap().unwrap();
        assert_eq!(cluster_acquire(&mut con, key, "b", None).unwrap(), None);
        // The counter was written on the node that serves the lock key, in the same slot.
        let counter = String::from_utf8(counter_key(slot)).unwrap();
        let counter_slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&counter)
            .query(&mut direct)
            .unwrap();
        assert_eq!(counter_slot, i64::from(slot));
        let exists: i64 = direct.exists(&counter).unwrap();
        assert_eq!(exists, 1, "{counter} on the lock's node");

        // A waiter through its own cluster connection gets the lock at the release.
        let (urls, k) = (cluster.urls(), key.clone());
        let waiter = thread::spawn(move || {
            let mut con = redis::cluster::ClusterClient::new(urls)
                .unwrap()
                .get_connection()
                .unwrap();
            cluster_acquire(&mut con, &k, "b", Some(10_000))
        });
        assert!(eventually(SOON, || waiters(&mut direct) == 1));
        assert_eq!(cluster_release(&mut con, key, "a"), Some(0));
        let second = waiter.join().unwrap().unwrap().expect("granted");
        assert!(second > first);
        assert_eq!(cluster_release(&mut con, key, "b"), Some(0));
    }

    // COMMAND GETKEYS finds the key of every form of every command.
    let mut any = cluster.nodes[0].connect();
    for args in [
        vec!["LOCK.ACQUIRE", "k1", "o", "100", "WAIT", "0"],
        vec!["LOCK.RELEASE", "k1", "o"],
        vec!["LOCK.RENEW", "k1", "o", "100"],
        vec!["LOCK.INFO", "k1"],
        vec!["LOCK.FORCERELEASE", "k1"],
    ] {
        let found: Vec<String> = redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg(&args)
            .query(&mut any)
            .unwrap();
        assert_eq!(found, vec!["k1".to_string()], "{args:?}");
    }

    // A node asked for a key it does not serve answers MOVED, like for any key.
    let key = &keys[0];
    let slot = key_slot(key.as_bytes());
    let owner_port = cluster.node_for_slot(slot).port;
    let other = cluster.nodes.iter().find(|n| n.port != owner_port).unwrap();
    let moved = error_of(
        &mut other.connect(),
        &[b"LOCK.ACQUIRE", key.as_bytes(), b"o", b"1000"],
    );
    assert_eq!(moved, format!("MOVED {slot} 127.0.0.1:{owner_port}"));
}

#[test]
fn a_migrated_lock_keeps_its_holder_and_token_and_its_waiters_follow_it() {
    let cluster = Cluster::start(3);
    let key = "orders:{42}";
    let slot = key_slot(key.as_bytes());
    let source = cluster.node_for_slot(slot);
    let target = cluster
        .nodes
        .iter()
        .find(|n| n.port != source.port)
        .unwrap();
    let (source_id, target_id) = (Cluster::node_id(source), Cluster::node_id(target));
    let mut src = source.connect();
    let mut dst = target.connect();

    let token = acquire(&mut src, key, "holder", 120_000).unwrap();
    let before = stored_lock(&mut src, key);
    // One waiter on a plain connection, one through a cluster client.
    let plain = Waiter::start(source, key, "plain-waiter", 60_000, 0);
    let urls = cluster.urls();
    let follower = thread::spawn(move || {
        let mut con = redis::cluster::ClusterClient::new(urls)
            .unwrap()
            .get_connection()
            .unwrap();
        cluster_acquire(&mut con, key, "cluster-waiter", Some(20_000))
    });
    assert!(eventually(SOON, || waiters(&mut src) == 2));

    // Reshard the slot by hand, as redis-cli --cluster reshard does.
    let setslot = |con: &mut Connection, state: &str, id: &str| {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(state)
            .arg(id)
            .query(con)
            .unwrap();
    };
    setslot(&mut dst, "IMPORTING", &source_id);
    setslot(&mut src, "MIGRATING", &target_id);
    let counter = String::from_utf8(counter_key(slot)).unwrap();
    let _: () = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(target.port)
        .arg("")
        .arg(0)
        .arg(5_000)
        .arg("KEYS")
        .arg(key)
        .arg(&counter)
        .query(&mut src)
        .unwrap();

    // The waiters are answered at once with the redirect, not left hanging, and nobody got a
    // second copy of the lock on the source.
    match plain.answer(SOON) {
        Some(Answer { reply: Err(e), .. }) => assert_eq!(
            format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or("")),
            format!("ASK {slot} 127.0.0.1:{}", target.port)
        ),
        other => panic!("the waiter on the source got {other:?}"),
    }
    // (KEYS, because a key command for a missing key of a migrating slot is answered ASK.)
    let left: Vec<String> = src.keys("orders:*").unwrap();
    assert!(
        left.is_empty(),
        "no lock was granted on the source: {left:?}"
    );
    // The cluster client followed the ASK and now waits on the target.
    assert!(eventually(SOON, || waiters(&mut dst) == 1));

    for con in [&mut dst, &mut src] {
        setslot(con, "NODE", &target_id);
    }
    let third = cluster
        .nodes
        .iter()
        .find(|n| n.port != source.port && n.port != target.port)
        .unwrap();
    setslot(&mut third.connect(), "NODE", &target_id);

    // The lock moved whole: same holder, count, token, absolute lease end.
    assert_eq!(stored_lock(&mut dst, key).fields, before.fields);
    // MIGRATE carries the TTL as relative milliseconds (DUMP/RESTORE), so the absolute lease
    // end may move by the transfer time: a millisecond or two on loopback.
    let drift = stored_lock(&mut dst, key).expires_at - before.expires_at;
    assert!(drift.abs() <= 10, "lease end moved by {drift} ms");
    let info = lock_info(&mut dst, key).unwrap();
    assert_eq!(info_int(&info, "token"), token);
    let moved = error_of(&mut src, &[b"LOCK.RELEASE", key.as_bytes(), b"holder"]);
    assert_eq!(moved, format!("MOVED {slot} 127.0.0.1:{}", target.port));

    // The holder releases on the target; the waiter that followed gets it with a larger token.
    assert_eq!(release(&mut dst, key, "holder"), Some(0));
    let granted = follower
        .join()
        .unwrap()
        .unwrap()
        .expect("granted on the target");
    assert!(granted > token, "{granted} after {token}");
}
