//! Redis Cluster: a real three-master cluster on loopback, created by the test itself. LOCK.*
//! commands declare their keys, so a cluster client routes them; the token counter lives in
//! the lock key's slot; a node answers MOVED for a key it does not serve; a lock key that
//! migrates keeps its lock while its waiters are redirected, never left hanging; and the unlock
//! message reaches Redisson's sharded subscribers (`SSUBSCRIBE`) on the key's node.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use lock_core::channel::unlock_channel;
use lock_core::slot::{counter_key, key_slot};
use lock_testkit::*;

const SOON: Duration = Duration::from_secs(5);

/// A key whose slot lies in each third of the slot space: `redis-cli --cluster create` gives
/// each of three masters one third.
fn reports_key_events() -> bool {
    let info = server_info();
    info.kind == ServerKind::Valkey || info.version >= (7, 2, 0)
}

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
    // The holder listens on the source, where its key was.
    let lost_channel =
        String::from_utf8(unlock_channel(b"lock.lost", key.as_bytes()).unwrap()).unwrap();
    let mut holder_hears = ShardSubscriber::start(source.port, &lost_channel);
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
    // The key left with its slot: where the server reports key removals (Redis >= 7.2,
    // Valkey) the holder is told it moved, never that it was deleted; Redis 7.0 says nothing.
    let heard = holder_hears.message(Duration::from_millis(500));
    if reports_key_events() {
        assert_eq!(heard, Some(format!("moved 0 * {} {key}", key.len())));
    } else {
        assert_eq!(heard, None);
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

/// `BLPOP ticket timeout` on `port` (after `ASKING` when `asking`): the element popped, or the
/// error the server answered (a redirect).
fn pop_on(port: u16, ticket: &str, asking: bool) -> Result<Option<String>, String> {
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_connection()
        .unwrap();
    if asking {
        let _: () = redis::cmd("ASKING").query(&mut con).unwrap();
    }
    let popped: redis::RedisResult<Option<(String, String)>> =
        redis::cmd("BLPOP").arg(ticket).arg(10).query(&mut con);
    match popped {
        Ok(p) => Ok(p.map(|(_, v)| v)),
        Err(e) => Err(format!(
            "{} {}",
            e.code().unwrap_or(""),
            e.detail().unwrap_or("")
        )),
    }
}

fn blocked_clients(con: &mut Connection) -> usize {
    info_field(con, "clients", "blocked_clients")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_ticket_in_a_migrating_slot_is_told_the_redirect_and_its_client_asks_again_there() {
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
    let mut asker = source.connect();
    let token = acquire(&mut src, key, "holder", 120_000).unwrap();
    let ask = |owner: &str, asker: &mut Connection| -> String {
        redis::cmd("LOCK.ACQUIRE")
            .arg(key)
            .arg(owner)
            .arg(60_000)
            .arg("WAIT")
            .arg(0)
            .arg("TICKET")
            .query(asker)
            .unwrap()
    };
    let t1 = ask("w1", &mut asker);
    let t2 = ask("w2", &mut asker);
    // A ticket lives in the lock's slot: its pop goes to the node that serves the key.
    assert_eq!(key_slot(t1.as_bytes()), slot);
    let (port, t) = (source.port, t1.clone());
    let popper1 = thread::spawn(move || pop_on(port, &t, false));
    assert!(eventually(SOON, || blocked_clients(&mut src) == 1));
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
    // A pop that starts now, on a ticket not written yet, is sent on by the server itself (a
    // missing key of a migrating slot): it follows the ASK and waits on the target, where the
    // ticket arrives with the rest of the slot. (It must not ask for the lock there: the lock is
    // still on the source.)
    let e = pop_on(source.port, &t2, false).unwrap_err();
    assert_eq!(e, format!("ASK {slot} 127.0.0.1:{}", target.port));
    let (port, t) = (target.port, t2.clone());
    let popper2 = thread::spawn(move || pop_on(port, &t, true));
    assert!(eventually(SOON, || blocked_clients(&mut dst) == 1));

    // The reshard moves the slot's keys: the lock and its counter, then what is left.
    let counter = String::from_utf8(counter_key(slot)).unwrap();
    let migrate = |src: &mut Connection, keys: &[String]| {
        let _: () = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(target.port)
            .arg("")
            .arg(0)
            .arg(5_000)
            .arg("KEYS")
            .arg(keys)
            .query(src)
            .unwrap();
    };
    migrate(&mut src, &[key.to_string(), counter]);
    // Each ticket is told what a blocked waiter is answered: the redirect.
    let redirect = format!("-ASK {slot} 127.0.0.1:{}", target.port);
    assert_eq!(popper1.join().unwrap(), Ok(Some(redirect.clone())));
    assert_eq!(waiters(&mut src), 0);
    assert!(eventually(SOON, || src.exists(&t2).unwrap_or(false)));
    let rest: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(100)
        .query(&mut src)
        .unwrap();
    assert_eq!(rest, vec![t2.clone()], "only the unpopped ticket is left");
    migrate(&mut src, &rest);
    assert_eq!(popper2.join().unwrap(), Ok(Some(redirect)));

    // The client asks again where the lock went (ASKING, as for any ASK), with a new ticket.
    let mut asker = target.connect();
    let _: () = redis::cmd("ASKING").query(&mut asker).unwrap();
    let again = ask("w1", &mut asker);
    for node in &cluster.nodes {
        setslot(&mut node.connect(), "NODE", &target_id);
    }
    assert_eq!(release(&mut dst, key, "holder"), Some(0));
    let granted: i64 = pop_on(target.port, &again, false)
        .unwrap()
        .expect("granted on the target")
        .parse()
        .unwrap();
    assert!(granted > token, "{granted} after {token}");
    let left: Vec<String> = src.keys("*").unwrap();
    assert!(left.is_empty(), "{left:?}");
}

/// A connection `SSUBSCRIBE`d to one channel, as Redisson 3.22+ waits for an unlock on a Redis 7
/// cluster. The redis crate 0.23 has no `SSUBSCRIBE`, so this is a plain socket reading RESP2
/// pushes (`smessage`, channel, payload).
struct ShardSubscriber {
    client: RawClient,
    channel: String,
}

impl ShardSubscriber {
    fn start(port: u16, channel: &str) -> ShardSubscriber {
        let mut client = RawClient::connect(port).expect("connect");
        let reply = client
            .query(redis::cmd("SSUBSCRIBE").arg(channel), SOON)
            .expect("SSUBSCRIBE");
        let subscribed: (String, String, i64) = redis::from_redis_value(&reply).unwrap();
        assert_eq!(subscribed, ("ssubscribe".into(), channel.to_string(), 1));
        ShardSubscriber {
            client,
            channel: channel.to_string(),
        }
    }

    /// The next message's payload; None when none came `within`.
    fn message(&mut self, within: Duration) -> Option<String> {
        let push = self.client.reply(within).ok()?;
        let (kind, channel, payload): (String, String, String) =
            redis::from_redis_value(&push).unwrap();
        assert_eq!(
            (kind.as_str(), channel.as_str()),
            ("smessage", &*self.channel)
        );
        Some(payload)
    }
}

/// Redisson's unlock channel for `key` (the module's default prefix).
fn redisson_channel(key: &str) -> String {
    String::from_utf8(unlock_channel(b"redisson_lock__channel", key.as_bytes()).unwrap()).unwrap()
}

/// Issue #20, gap 2: in a cluster Redisson waits on the lock's channel with `SSUBSCRIBE` on the
/// node that serves it, which a plain `PUBLISH` never reaches. Every freeing that publishes
/// (a release, a force-release, an `EPHEMERAL` hold ended by its connection's close) reaches a
/// sharded subscriber there, and still reaches a classic subscriber on another node.
#[test]
fn unlock_messages_reach_sharded_subscribers_on_the_keys_node() {
    let cluster = Cluster::start(3);
    for key in ["orders:42", "{tenant}:orders"] {
        let channel = redisson_channel(key);
        let slot = key_slot(key.as_bytes());
        let node = cluster.node_for_slot(slot);
        let mut direct = node.connect();
        // The channel hashes to the key's slot: Redisson shard-subscribes on the key's node.
        let channel_slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&channel)
            .query(&mut direct)
            .unwrap();
        assert_eq!(channel_slot, i64::from(slot), "{channel}");
        let mut sharded = ShardSubscriber::start(node.port, &channel);
        let other = cluster.nodes.iter().find(|n| n.port != node.port).unwrap();
        let mut other_con = other.connect();
        let mut classic = other_con.as_pubsub();
        classic.subscribe(&channel).unwrap();
        classic.set_read_timeout(Some(SOON)).unwrap();
        let mut classic_message =
            || -> String { classic.get_message().unwrap().get_payload().unwrap() };

        // A release that frees the lock (a count-down publishes nothing).
        acquire(&mut direct, key, "a", 60_000).unwrap();
        acquire(&mut direct, key, "a", 60_000).unwrap();
        assert_eq!(release(&mut direct, key, "a"), Some(1));
        assert_eq!(release(&mut direct, key, "a"), Some(0));
        assert_eq!(
            sharded.message(SOON).as_deref(),
            Some("0"),
            "{key}: release"
        );
        assert_eq!(classic_message(), "0");

        // A force-release.
        acquire(&mut direct, key, "a", 60_000).unwrap();
        assert_eq!(force_release(&mut direct, key), 1);
        assert_eq!(
            sharded.message(SOON).as_deref(),
            Some("0"),
            "{key}: force-release"
        );
        assert_eq!(classic_message(), "0");

        // An EPHEMERAL hold that the module ends when its connection closes (no command of the
        // key runs: the publish comes from the module's own event).
        let mut holder = node.connect();
        let holder_id = client_id(&mut holder);
        acquire_with(&mut holder, key, "e", 60_000, &["EPHEMERAL"])
            .unwrap()
            .expect("granted");
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("ID")
            .arg(holder_id)
            .query(&mut direct)
            .unwrap();
        assert_eq!(killed, 1);
        assert_eq!(
            sharded.message(SOON).as_deref(),
            Some("0"),
            "{key}: connection closed"
        );
        assert_eq!(classic_message(), "0");
        assert!(lock_info(&mut direct, key).is_none());

        // One message per freeing, no more.
        assert_eq!(sharded.message(Duration::from_millis(300)), None);
    }
}

/// Redisson's `RedissonLock.lock()` against a LOCK.* holder on a cluster: the waiter subscribes
/// to the lock's channel (sharded, as Redisson 3.22+ does on Redis 7), runs Redisson's lock
/// script, and on a pttl waits for the unlock message at most that long before trying again.
/// It must get the lock at the release, not at the end of the 10 s lease.
#[test]
fn a_redisson_waiter_subscribed_sharded_acquires_at_the_lock_release() {
    let cluster = Cluster::start(3);
    let key = "orders:7";
    let node = cluster.node_for_slot(key_slot(key.as_bytes()));
    let mut holder = node.connect();
    acquire(&mut holder, key, "svc", 10_000).unwrap();

    let (port, url) = (node.port, node.url());
    let (tried, first_try) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let mut sub = ShardSubscriber::start(port, &redisson_channel(key));
        let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
        loop {
            match redisson_lock(&mut con, key, "uuid-1:1", 30_000) {
                None => return Instant::now(),
                Some(ttl) => {
                    let _ = tried.send(ttl);
                    sub.message(Duration::from_millis(ttl.max(1) as u64));
                }
            }
        }
    });
    let ttl = first_try.recv_timeout(SOON).expect("the waiter tried");
    assert!(ttl > 9_000, "the holder's lease: {ttl} ms left");
    thread::sleep(Duration::from_millis(500));
    let released = Instant::now();
    assert_eq!(release(&mut holder, key, "svc"), Some(0));
    let acquired = waiter.join().unwrap();
    let latency = acquired.duration_since(released);
    eprintln!("Redisson waiter (SSUBSCRIBE) acquired {latency:?} after LOCK.RELEASE");
    assert!(
        latency < Duration::from_secs(2),
        "acquired {latency:?} after the release, lease 10 s"
    );
    let owner: Vec<String> = holder.hkeys(key).unwrap();
    assert!(owner.contains(&"uuid-1:1".to_string()), "{owner:?}");
}

/// Issue #20, the lost-hold signal in a cluster: it goes to the key's shard only (`SPUBLISH`),
/// so a holder `SSUBSCRIBE`d on the key's node hears it and no other node is sent anything — a
/// cluster of many nodes is never flooded with lost-hold messages.
#[test]
fn lost_hold_messages_go_to_the_keys_shard_only() {
    let cluster = Cluster::start(3);
    for key in ["orders:42", "{tenant}:orders"] {
        let channel =
            String::from_utf8(unlock_channel(b"lock.lost", key.as_bytes()).unwrap()).unwrap();
        let slot = key_slot(key.as_bytes());
        let node = cluster.node_for_slot(slot);
        let mut direct = node.connect();
        let channel_slot: i64 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&channel)
            .query(&mut direct)
            .unwrap();
        assert_eq!(channel_slot, i64::from(slot), "{channel}");
        let mut sharded = ShardSubscriber::start(node.port, &channel);
        // A classic subscriber on the key's node and on another: a PUBLISH would reach both.
        let mut classic_here = node.connect();
        let mut here = classic_here.as_pubsub();
        here.subscribe(&channel).unwrap();
        here.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let other = cluster.nodes.iter().find(|n| n.port != node.port).unwrap();
        let mut classic_there = other.connect();
        let mut there = classic_there.as_pubsub();
        there.subscribe(&channel).unwrap();
        there
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();

        let token = acquire(&mut direct, key, "holder 1", 60_000).unwrap();
        assert_eq!(force_release(&mut direct, key), 1);
        assert_eq!(
            sharded.message(SOON),
            Some(format!(
                "forcereleased 0 {token} {} {key} holder 1",
                key.len()
            )),
            "{key}"
        );
        let mut holder = node.connect();
        let ephemeral = acquire_with(&mut holder, key, "e", 60_000, &["EPHEMERAL"])
            .unwrap()
            .expect("granted");
        drop(holder);
        assert_eq!(
            sharded.message(SOON),
            Some(format!("disconnected 0 {ephemeral} {} {key} e", key.len())),
            "{key}"
        );
        assert!(here.get_message().is_err(), "{key}: no classic PUBLISH");
        assert!(there.get_message().is_err(), "{key}: no broadcast");
    }
}

#[test]
fn a_multi_key_acquire_takes_keys_of_one_slot_and_refuses_others_as_crossslot() {
    let cluster = Cluster::start(3);
    let keys = ["{acct}:1", "{acct}:2"];
    let slot = key_slot(b"acct");
    let mut node = cluster.node_for_slot(slot).connect();
    let tokens: Vec<i64> = redis::cmd("LOCK.MACQUIRE")
        .arg(2)
        .arg(&keys)
        .arg("o")
        .arg(60_000)
        .query(&mut node)
        .unwrap();
    assert_eq!(tokens.len(), 2);
    // Keys of different slots: Redis's own CROSSSLOT, found through the key spec.
    let (a, b) = ("a", "b");
    assert_ne!(key_slot(a.as_bytes()), key_slot(b.as_bytes()));
    let mut on_a = cluster.node_for_slot(key_slot(a.as_bytes())).connect();
    let e = error_of(
        &mut on_a,
        &[
            b"LOCK.MACQUIRE",
            b"2",
            a.as_bytes(),
            b.as_bytes(),
            b"o",
            b"1000",
        ],
    );
    assert!(e.starts_with("CROSSSLOT"), "{e}");
    // And a cluster client routes the command by its keys.
    let mut client = cluster.client();
    let released: Vec<Option<i64>> = redis::cmd("LOCK.MRELEASE")
        .arg(2)
        .arg(&keys)
        .arg("o")
        .query(&mut client)
        .unwrap();
    assert_eq!(released, [Some(0), Some(0)]);
}

/// Leader election in a cluster: observers `SSUBSCRIBE` to the key's leader channel on the
/// key's node and hear each election and proclamation there; nothing is broadcast.
#[test]
fn leader_messages_go_to_the_keys_shard_only() {
    let cluster = Cluster::start(3);
    let key = "service:{billing}";
    let channel =
        String::from_utf8(unlock_channel(b"lock.leader", key.as_bytes()).unwrap()).unwrap();
    let node = cluster.node_for_slot(key_slot(key.as_bytes()));
    let mut sharded = ShardSubscriber::start(node.port, &channel);
    let other = cluster.nodes.iter().find(|n| n.port != node.port).unwrap();
    let mut classic_there = other.connect();
    let mut there = classic_there.as_pubsub();
    there.subscribe(&channel).unwrap();
    there
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut client = cluster.client();
    let epoch: i64 = redis::cmd("LOCK.CAMPAIGN")
        .arg(key)
        .arg("node-a")
        .arg(60_000)
        .arg("VALUE")
        .arg("10.0.0.1:80")
        .query(&mut client)
        .unwrap();
    assert_eq!(
        sharded.message(SOON),
        Some(format!("elected 0 {epoch} {} {key} node-a", key.len()))
    );
    assert_eq!(
        sharded.message(SOON),
        Some(format!(
            "proclaimed 0 {epoch} {} {key} 10.0.0.1:80",
            key.len()
        ))
    );
    let leader: (String, i64, Option<String>) = redis::cmd("LOCK.LEADER")
        .arg(key)
        .query(&mut client)
        .unwrap();
    assert_eq!(leader, ("node-a".into(), epoch, Some("10.0.0.1:80".into())));
    assert!(there.get_message().is_err(), "no broadcast");
}

/// `CLUSTER SETSLOT slot state id` on `con`.
fn set_slot(con: &mut Connection, slot: u16, state: &str, id: &str) {
    let _: () = redis::cmd("CLUSTER")
        .arg("SETSLOT")
        .arg(slot)
        .arg(state)
        .arg(id)
        .query(con)
        .unwrap();
}

/// `MIGRATE` of `keys` from `from` to the node on `to_port` (no `REPLACE`: a key the target
/// already has is a failure, as it is for `redis-cli --cluster reshard`).
fn migrate_keys(from: &mut Connection, to_port: u16, keys: &[String]) {
    let _: () = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(to_port)
        .arg("")
        .arg(0)
        .arg(5_000)
        .arg("KEYS")
        .arg(keys)
        .query(from)
        .unwrap_or_else(|e| panic!("MIGRATE {keys:?}: {e}"));
}

/// The keys `con`'s node holds in `slot` (up to 100).
fn keys_in_slot(con: &mut Connection, slot: u16) -> Vec<String> {
    redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(100)
        .query(con)
        .unwrap()
}

/// The whole of `slot` moved from `from` to `to` as `redis-cli --cluster reshard` moves it:
/// IMPORTING on the target, MIGRATING on the source, its keys migrated, then NODE everywhere.
/// It begins once the nodes agree on the config epochs, and ends once every node names the
/// target (after `BUMPEPOCH` there: gossip sent before cannot take the slot back).
fn move_slot(cluster: &Cluster, slot: u16, from: &Server, to: &Server) {
    assert!(
        eventually(Duration::from_secs(20), || cluster.epochs_agreed()),
        "the nodes do not agree on the config epochs"
    );
    let (from_id, to_id) = (Cluster::node_id(from), Cluster::node_id(to));
    let (mut on_from, mut on_to) = (from.connect(), to.connect());
    set_slot(&mut on_to, slot, "IMPORTING", &from_id);
    set_slot(&mut on_from, slot, "MIGRATING", &to_id);
    let keys = keys_in_slot(&mut on_from, slot);
    if !keys.is_empty() {
        migrate_keys(&mut on_from, to.port, &keys);
    }
    set_slot_everywhere(cluster, slot, &to_id);
    let _: String = redis::cmd("CLUSTER")
        .arg("BUMPEPOCH")
        .query(&mut on_to)
        .unwrap();
    assert!(
        eventually(Duration::from_secs(20), || cluster
            .all_name_owner(slot, &to_id)),
        "not every node names the target as the slot's master"
    );
}

/// A ticket holding a grant nobody popped yet moves with its slot: `MIGRATE` deletes it on the
/// source, which must not take that for a ticket taken away and write it there again (servers
/// with key events tell a pop from a removal, and a removed unpopped ticket is written again).
/// Before, the source wrote the ticket back, and the reshard's next `MIGRATE` of the slot's keys
/// failed `BUSYKEY` (Redis 8.2.3: the Python cluster oracle, 5 seeds of 10).
#[test]
fn an_unpopped_ticket_moved_with_its_slot_is_not_written_again_on_the_source() {
    let cluster = Cluster::start(3);
    let key = "moves:{7}";
    let slot = key_slot(key.as_bytes());
    let source = cluster.node_for_slot(slot);
    let target = cluster
        .nodes
        .iter()
        .find(|n| n.port != source.port)
        .unwrap();
    let mut src = source.connect();
    acquire(&mut src, key, "holder", 120_000).unwrap();
    let ticket: String = redis::cmd("LOCK.ACQUIRE")
        .arg(key)
        .arg("waiter")
        .arg(60_000)
        .arg("WAIT")
        .arg(0)
        .arg("TICKET")
        .query(&mut src)
        .unwrap();
    // Released: the grant is written into the ticket, which nobody pops.
    let _: i64 = redis::cmd("LOCK.RELEASE")
        .arg(key)
        .arg("holder")
        .query(&mut src)
        .unwrap();
    assert!(eventually(SOON, || {
        redis::cmd("LLEN")
            .arg(&ticket)
            .query::<i64>(&mut src)
            .unwrap()
            == 1
    }));
    move_slot(&cluster, slot, source, target);
    // Everything of the slot is on the target, the ticket's grant among it; nothing came back
    // on the source, now or a moment later.
    thread::sleep(Duration::from_millis(300));
    let left = keys_in_slot(&mut src, slot);
    assert!(
        left.is_empty(),
        "the source has keys of the slot again: {left:?}"
    );
    let mut dst = target.connect();
    let popped: Vec<String> = redis::cmd("LRANGE")
        .arg(&ticket)
        .arg(0)
        .arg(-1)
        .query(&mut dst)
        .unwrap();
    assert_eq!(popped.len(), 1, "the ticket moved with its grant");
    assert!(popped[0].parse::<u64>().is_ok(), "{popped:?}");
}

/// `CLUSTER SETSLOT slot NODE id` on every node: the move is over.
fn set_slot_everywhere(cluster: &Cluster, slot: u16, id: &str) {
    for node in &cluster.nodes {
        set_slot(&mut node.connect(), slot, "NODE", id);
    }
}

/// `LOCK.ACQUIRE key owner 60000 [options]` after `ASKING`, as a cluster client sends it to
/// the importing node a redirect named.
fn acquire_asking(
    con: &mut Connection,
    key: &str,
    owner: &str,
    options: &[&str],
) -> redis::RedisResult<Option<i64>> {
    let _: () = redis::cmd("ASKING").query(con).unwrap();
    acquire_with(con, key, owner, 60_000, options)
}

/// A slot moved to another node and back, with grants on both sides and during both moves:
/// every grant of a key gets a token above every earlier grant's, whichever node hands it
/// out. A node mints only from the slot's counter while the slot moves: the importing node
/// refuses (`TRYAGAIN`) until the counter arrives, and the migrating node once it has left.
/// Before, the importing node (which had served the slot before) minted from its own memory
/// and clock, a minute below the tokens the other node had handed out above its counter, and
/// created lock keys and a counter of its own in the slot.
#[test]
fn tokens_of_a_key_never_fall_while_its_slot_moves_back_and_forth() {
    let cluster = Cluster::start(3);
    let key = "{tok}:A";
    let shared_key = "{tok}:B";
    let slot = key_slot(key.as_bytes());
    let counter = String::from_utf8(counter_key(slot)).unwrap();
    let a = cluster.node_for_slot(slot);
    let b = cluster.nodes.iter().find(|n| n.port != a.port).unwrap();
    let (a_id, b_id) = (Cluster::node_id(a), Cluster::node_id(b));
    let (mut on_a, mut on_b) = (a.connect(), b.connect());
    let mut tokens: Vec<(&str, i64)> = Vec::new();
    let grant = |con: &mut Connection, owner: &'static str, tokens: &mut Vec<_>| {
        let token = acquire(con, key, owner, 60_000).expect("granted");
        assert_eq!(release(con, key, owner), Some(0));
        tokens.push((owner, token));
    };

    // On A, then the slot moves to B (the counter with it) and B grants twice: B went above
    // A's reserved bound, a window of clock ahead.
    grant(&mut on_a, "o1", &mut tokens);
    set_slot(&mut on_b, slot, "IMPORTING", &a_id);
    set_slot(&mut on_a, slot, "MIGRATING", &b_id);
    let moving = keys_in_slot(&mut on_a, slot);
    assert_eq!(moving, vec![counter.clone()]);
    migrate_keys(&mut on_a, b.port, &moving);
    set_slot_everywhere(&cluster, slot, &b_id);
    grant(&mut on_b, "o2", &mut tokens);
    grant(&mut on_b, "o3", &mut tokens);
    // A shared hold stays on B while the slot moves back.
    let reader = acquire_with(&mut on_b, shared_key, "r1", 60_000, &["SHARED"])
        .unwrap()
        .expect("shared hold");
    tokens.push(("r1", reader));

    // Back to A. Before any key moved, a grant asked on A (ASKING) has no counter to mint from.
    set_slot(&mut on_a, slot, "IMPORTING", &b_id);
    set_slot(&mut on_b, slot, "MIGRATING", &a_id);
    let previous = tokens.iter().map(|(_, t)| *t).max().unwrap();
    match acquire_asking(&mut on_a, key, "o4", &[]) {
        Err(e) => assert_eq!(e.code(), Some("TRYAGAIN"), "{e}"),
        Ok(Some(token)) => panic!(
            "the importing node granted token {token}, {} below the slot's previous grant ({previous})",
            previous - token
        ),
        Ok(None) => panic!("the importing node found the key busy"),
    }
    assert!(
        keys_in_slot(&mut on_a, slot).is_empty(),
        "the importing node created keys of its own in the slot"
    );

    // The counter moves first. B still serves the shared key, but no longer mints.
    migrate_keys(&mut on_b, a.port, std::slice::from_ref(&counter));
    let refused = acquire_with(&mut on_b, shared_key, "r2", 60_000, &["SHARED"]);
    assert_eq!(
        refused.as_ref().err().and_then(|e| e.code()),
        Some("TRYAGAIN"),
        "the migrating node granted without its counter: {refused:?}"
    );
    assert_eq!(keys_in_slot(&mut on_b, slot), vec![shared_key.to_string()]);
    // The importing node mints above the counter it now holds.
    let token = acquire_asking(&mut on_a, key, "o4", &[])
        .unwrap()
        .expect("granted on the importing node");
    tokens.push(("o4", token));
    let _: () = redis::cmd("ASKING").query(&mut on_a).unwrap();
    assert_eq!(release(&mut on_a, key, "o4"), Some(0));

    // The rest moves with no key the target made meanwhile in the way; then A grants again.
    let rest = keys_in_slot(&mut on_b, slot);
    migrate_keys(&mut on_b, a.port, &rest);
    set_slot_everywhere(&cluster, slot, &a_id);
    let again = acquire_with(&mut on_a, shared_key, "r2", 60_000, &["SHARED"])
        .unwrap()
        .expect("a second shared hold");
    tokens.push(("r2", again));
    grant(&mut on_a, "o5", &mut tokens);

    for pair in tokens.windows(2) {
        assert!(
            pair[1].1 > pair[0].1,
            "a token fell: {:?} then {:?} (all: {tokens:?})",
            pair[0],
            pair[1]
        );
    }
}

/// A flush takes the slot's token counter with the locks, while tokens may run a window ahead
/// of the clock (a hand-over goes above the window the other node reserved). The node
/// writes the counter back from what it handed out, so the node the slot moves to next mints
/// above it, not from its own clock. Before, that node's tokens fell by up to a window per
/// hand-over (the Python cluster oracle: a flushdb, then a migration, then a grant 46 s lower).
#[test]
fn a_flushed_slot_that_moves_keeps_its_tokens_rising() {
    let cluster = Cluster::start(3);
    let key = "{flushed}:A";
    let slot = key_slot(key.as_bytes());
    let counter = String::from_utf8(counter_key(slot)).unwrap();
    let a = cluster.node_for_slot(slot);
    let b = cluster.nodes.iter().find(|n| n.port != a.port).unwrap();
    let (mut on_a, mut on_b) = (a.connect(), b.connect());
    // A to B and back: A's tokens now run a window ahead of the clock.
    let first = acquire(&mut on_a, key, "o1", 60_000).unwrap();
    release(&mut on_a, key, "o1").unwrap();
    move_slot(&cluster, slot, a, b);
    let on_b_token = acquire(&mut on_b, key, "o2", 60_000).unwrap();
    release(&mut on_b, key, "o2").unwrap();
    move_slot(&cluster, slot, b, a);
    let last = acquire(&mut on_a, key, "o3", 60_000).unwrap();
    assert!(first < on_b_token && on_b_token < last);
    // FLUSHALL on A: the counter is written back at the next turn, at or above the last token.
    let _: () = redis::cmd("FLUSHALL").query(&mut on_a).unwrap();
    assert!(
        eventually(SOON, || {
            let stored: Option<i64> = redis::cmd("GET").arg(&counter).query(&mut on_a).unwrap();
            stored.is_some_and(|s| s >= last)
        }),
        "the flushed counter was not written back"
    );
    // The slot moves to B with the counter: B's next token is above A's last.
    move_slot(&cluster, slot, a, b);
    let next = acquire(&mut on_b, key, "o4", 60_000).unwrap();
    assert!(next > last, "a token fell: {next} after {last}");
}

/// A flush writes back what the counter held, not only what this node reserved in it: a slot
/// that came back from another node brings a counter that node raised (its own window above
/// this node's), and the flush may come before any grant here reads it. Before, the node wrote
/// back its own older bound and handed out the other node's tokens again (the Python cluster
/// oracle: a migration back, a flushdb, then tokens falling, handed out twice, and stale
/// writes landing).
#[test]
fn a_flush_writes_back_the_bound_another_node_raised() {
    let cluster = Cluster::start(3);
    let key = "{flushed-back}:A";
    let slot = key_slot(key.as_bytes());
    let a = cluster.node_for_slot(slot);
    let b = cluster.nodes.iter().find(|n| n.port != a.port).unwrap();
    let (mut on_a, mut on_b) = (a.connect(), b.connect());
    // A reserves a window; B, given the slot, reserves the next one above it.
    let first = acquire(&mut on_a, key, "o1", 60_000).unwrap();
    release(&mut on_a, key, "o1").unwrap();
    move_slot(&cluster, slot, a, b);
    let on_b_token = acquire(&mut on_b, key, "o2", 60_000).unwrap();
    release(&mut on_b, key, "o2").unwrap();
    assert!(first < on_b_token);
    // Back to A with B's counter, and flushed there before A grants.
    move_slot(&cluster, slot, b, a);
    let _: () = redis::cmd("FLUSHDB").query(&mut on_a).unwrap();
    let counter = String::from_utf8(counter_key(slot)).unwrap();
    assert!(
        eventually(SOON, || {
            let stored: Option<i64> = redis::cmd("GET").arg(&counter).query(&mut on_a).unwrap();
            stored.is_some()
        }),
        "the flushed counter was not written back"
    );
    let next = acquire(&mut on_a, key, "o3", 60_000).unwrap();
    assert!(
        next > on_b_token,
        "a token fell: {next} after B's {on_b_token}"
    );
}
