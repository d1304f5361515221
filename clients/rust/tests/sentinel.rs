//! Through Sentinel, and grants acknowledged by replicas: real `redis-server` processes (a
//! master, two replicas, three Sentinels from the test kit's `SentinelSet`), failovers made by
//! killing or pausing the master, or asked for (`SENTINEL FAILOVER`).

mod support;

use std::time::{Duration, Instant};

use lock_testkit::{SentinelOptions, SentinelProcess, SentinelSet, Server, Signal};
use redis::aio::MultiplexedConnection;
use redis::Value;
use redis_lock_client::{LockClient, LockError, LostReason, Release};

async fn on(port: u16) -> MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// `SENTINEL FAILOVER name` on the Sentinel on `port`, until it answers OK: a Sentinel refuses
/// (NOGOODSLAVE) until it has heard from a replica lately, so it is asked again (for 30 s).
async fn ask_failover(port: u16, name: &str) {
    let mut asked = on(port).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reply: redis::RedisResult<String> = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(name)
            .query_async(&mut asked)
            .await;
        match reply {
            Ok(ok) => {
                assert_eq!(ok, "OK");
                return;
            }
            Err(e) => assert!(Instant::now() < deadline, "SENTINEL FAILOVER: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether the server on `port` holds `key` for (`owner`, `token`) (`LOCK.CHECK`).
async fn holds(port: u16, key: &str, owner: &str, token: u64) -> bool {
    let n: i64 = redis::cmd("LOCK.CHECK")
        .arg(key)
        .arg(owner)
        .arg(token)
        .query_async(&mut on(port).await)
        .await
        .unwrap();
    n == 1
}

/// Waits (bounded) until both replicas of the master on `port` have everything written so far.
async fn replicated(port: u16) {
    let n: i64 = redis::cmd("WAIT")
        .arg(2)
        .arg(5_000)
        .query_async(&mut on(port).await)
        .await
        .unwrap();
    assert_eq!(n, 2, "both replicas acknowledged");
}

async fn within<T>(what: &str, limit: Duration, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, f)
        .await
        .unwrap_or_else(|_| panic!("{what} within {limit:?}"))
}

/// The set on a thread of its own (its start blocks), with its Sentinels' URLs.
async fn sentinel_set() -> SentinelSet {
    tokio::task::spawn_blocking(SentinelSet::start)
        .await
        .unwrap()
}

async fn failover(set: &mut SentinelSet, kill: bool) -> ((String, u16), (String, u16)) {
    let old = if kill {
        set.kill_master()
    } else {
        set.pause_master()
    };
    let new = tokio::task::block_in_place(|| set.wait_failover(&old, Duration::from_secs(60)));
    (old, new)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_client_follows_a_failover() {
    let mut set = sentinel_set().await;
    let client = LockClient::sentinel(set.sentinel_urls(), set.master_name())
        .await
        .unwrap();
    let first = set.master_addr().1;
    // Longer than a failover takes: the hold outlives it. Its deadline (90 % of a lease from
    // the last renewal sent, up to a third of a lease before the kill) must come after the
    // failover and the client's switch, which a loaded machine stretched past 7 s: with 12 s
    // leases the EPHEMERAL hold was once reported Unreachable before the switch said
    // ConnectionClosed (make soak). 20 s leaves 11 s; the EPHEMERAL hold is never renewed
    // after the kill, and gets 30 s.
    let lease = Duration::from_secs(20);
    let held = client.lock("kept").lease(lease).acquire().await.unwrap();
    let ephemeral = client
        .lock("bound")
        .lease(Duration::from_secs(30))
        .ephemeral()
        .acquire()
        .await
        .unwrap();
    assert!(holds(first, "kept", held.owner(), held.token()).await);
    replicated(first).await;

    let (_, new) = failover(&mut set, true).await;
    // The EPHEMERAL hold's connection went with the old master.
    let reason = within(
        "the EPHEMERAL hold reported lost",
        Duration::from_secs(5),
        ephemeral.lost(),
    )
    .await;
    assert_eq!(reason, LostReason::ConnectionClosed);
    // The new master has it, bound to nothing: the library, which no longer believes in it,
    // releases it there (by its token), instead of leaving it to block the key for its lease.
    // Before, it stayed until its lease (12 s) ended.
    let released = Instant::now() + Duration::from_secs(5);
    while holds(new.1, "bound", ephemeral.owner(), ephemeral.token()).await {
        assert!(
            Instant::now() < released,
            "the EPHEMERAL hold the failover left was not released on the new master"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The other hold reached the replicas: the watchdog renews it on the new master.
    let mut raw = on(new.1).await;
    let deadline = Instant::now() + lease;
    while support::calls(&mut raw, "lock.renew").await < 2 {
        assert!(Instant::now() < deadline, "renewed on the new master");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(held.lost_reason(), None);
    assert!(holds(new.1, "kept", held.owner(), held.token()).await);

    // New holds go to the new master; a fenced command too.
    let mut other = client
        .lock("{new}:lock")
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    assert!(holds(new.1, "{new}:lock", other.owner(), other.token()).await);
    let n: i64 = other
        .fenced(redis::cmd("INCR").arg("{new}:n"))
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(other.release().await.unwrap(), Release::Released);

    // The lost-hold signal listens on the new master now.
    let channel = redis_lock_client::lost_signal_channel(b"kept");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let numsub: Vec<Value> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(&mut raw)
            .await
            .unwrap();
        if matches!(numsub.get(1), Some(Value::Int(n)) if *n > 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "subscribed again on the new master"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lost = held.lost();
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("kept")
        .query_async(&mut raw)
        .await
        .unwrap();
    let reason = within(
        "the signal from the new master",
        Duration::from_millis(900),
        lost,
    )
    .await;
    assert_eq!(reason, LostReason::ForceReleased);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_a_failover_left_unanswered_is_sent_again_and_the_next_acquire_gets_a_new_token()
{
    // The master dies under a held lock (replicated: the new master has it). Its release gets
    // no answer; the library sends it again by token in the background until the new master
    // answers, and the handle's next acquire waits for that. Before, the next acquire (ONCE)
    // got the very same hold back, so two guards of one handle carried one fencing token.
    let mut set = sentinel_set().await;
    let client = LockClient::sentinel(set.sentinel_urls(), set.master_name())
        .await
        .unwrap();
    let first = set.master_addr().1;
    let lock = client.lock("handed").lease(Duration::from_secs(30));
    let mut guard = lock.acquire().await.unwrap();
    let old = guard.token();
    replicated(first).await;
    let (_, new) = failover(&mut set, true).await;
    // Through Sentinel the release may find the new master at once; either way the hold must
    // be gone before the handle acquires again.
    let answered = guard.release().await;
    let again = within("the next acquire", Duration::from_secs(40), lock.acquire())
        .await
        .unwrap();
    assert_ne!(
        again.token(),
        old,
        "the next acquire got the old hold back (release answered {answered:?})"
    );
    assert!(holds(new.1, "handed", again.owner(), again.token()).await);
    assert!(!holds(new.1, "handed", again.owner(), old).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_has_a_new_leader_within_seconds_of_a_failover_not_a_lease() {
    // The leader's process lives; its master dies. Its EPHEMERAL leadership reached the new
    // master, bound to nothing: the deposed leader resigns it there (by its token), and the
    // candidate waiting behind it leads at once. Before, nobody led until the leadership's
    // lease (30 s by default) ran out on the new master.
    let mut set = sentinel_set().await;
    let leader_client = LockClient::sentinel(set.sentinel_urls(), set.master_name())
        .await
        .unwrap();
    let other_client = LockClient::sentinel(set.sentinel_urls(), set.master_name())
        .await
        .unwrap();
    let first = set.master_addr().1;
    let leadership = leader_client.election("svc").campaign().await.unwrap();
    replicated(first).await;
    let candidate = other_client.election("svc");
    // One campaign, waiting through the failover: the library asks it again on the new master
    // (before, it answered a connection error, and only a candidate that campaigned again led).
    let waiting = tokio::spawn(async move { candidate.campaign().await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (_, new) = failover(&mut set, true).await;
    let failed_over = Instant::now();
    let reason = within(
        "the leader deposed",
        Duration::from_secs(10),
        leadership.lost(),
    )
    .await;
    assert_eq!(reason, LostReason::ConnectionClosed);
    // Well inside the 30 s lease (the failover itself is over here).
    let next = within("a new leader", Duration::from_secs(15), waiting)
        .await
        .unwrap()
        .unwrap();
    eprintln!("new leader {:?} after the failover", failed_over.elapsed());
    assert!(next.epoch() > leadership.epoch());
    assert!(holds(new.1, "svc", next.candidate(), next.epoch()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_the_new_master_never_received_is_lost_at_the_first_renewal() {
    let mut set = sentinel_set().await;
    let client = LockClient::sentinel(set.sentinel_urls(), set.master_name())
        .await
        .unwrap();
    let master = set.master_addr().1;
    // The replicas are paused and their links closed by the master: the grant never reaches
    // them.
    for server in set.servers.iter().filter(|s| s.port != master) {
        server.signal(Signal::Stop);
    }
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut on(master).await)
        .await
        .unwrap();
    let lease = Duration::from_secs(10); // longer than the failover (down-after 3 s)
    let guard = client
        .lock("unreplicated")
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    let old = set.kill_master();
    for server in set.servers.iter().filter(|s| s.port != master) {
        server.signal(Signal::Cont);
    }
    let new = tokio::task::block_in_place(|| set.wait_failover(&old, Duration::from_secs(60)));
    assert!(!holds(new.1, "unreplicated", guard.owner(), guard.token()).await);
    // The first renewal the new master answers (0): lost, HoldGone.
    let reason = within("reported lost", lease * 3, guard.lost()).await;
    assert_eq!(reason, LostReason::HoldGone);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_grant_whose_confirmation_a_failover_cut_is_released_on_the_new_master() {
    // The failover test's `replicas=1` leader (make test, seed 1795915574): a campaign's grant
    // was refused with `NotHeld(ConnectionClosed)` when the master paused during its WAIT. The
    // master ends an EPHEMERAL hold with its connection, but the replica it reached keeps a
    // copy bound to nothing; promoted, it kept the hold for its lease (the candidate's next
    // campaigns answered `not EPHEMERAL` for 12 s). Such a grant is released like one whose
    // confirmation got no answer: by its token, in the background, on the new master.
    let mut set = sentinel_set().await;
    let client = LockClient::sentinel(set.sentinel_urls(), set.master_name())
        .await
        .unwrap();
    let master = set.master_addr().1;
    let mut raw = on(master).await;
    let lease = Duration::from_secs(30);
    // The replicas are paused: the grant waits in their sockets, and nothing acknowledges it.
    for server in set.servers.iter().filter(|s| s.port != master) {
        server.signal(Signal::Stop);
    }
    let lock = client
        .lock("cut")
        .ephemeral()
        .lease(lease)
        .replicas(1, Duration::from_millis(1_500));
    let asking = tokio::spawn(async move { lock.acquire().await.map(|g| g.token()) });
    // The grant is on the master, its WAIT not answered: the master pauses.
    let granted = Instant::now();
    loop {
        let info: Value = redis::cmd("LOCK.INFO")
            .arg("cut")
            .query_async(&mut raw)
            .await
            .unwrap();
        if info != Value::Nil {
            break;
        }
        assert!(granted.elapsed() < Duration::from_secs(10), "no grant");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let old = set.pause_master();
    // The replicas run again and read the grant from their sockets; one is promoted.
    for server in set.servers.iter().filter(|s| s.port != master) {
        server.signal(Signal::Cont);
    }
    let new = tokio::task::block_in_place(|| set.wait_failover(&old, Duration::from_secs(60)));
    // The acquire goes on (as in the Python library): asked again on the new master once the
    // cut grant is released there, it gets a hold of its own, or a refusal (`replicas=1`: the
    // new master may have no replica yet).
    let answered = within("the acquire answered", Duration::from_secs(60), asking)
        .await
        .unwrap();
    if let Err(e) = &answered {
        assert!(!matches!(e, LockError::NotHeld { .. }), "{answered:?}");
    }
    // The cut grant is gone from the new master within seconds, not at the end of its 30 s
    // lease: the key is free, or held under the new acquire's own token.
    let promoted = Instant::now();
    let mut on_new = on(new.1).await;
    loop {
        let info: Value = redis::cmd("LOCK.INFO")
            .arg("cut")
            .query_async(&mut on_new)
            .await
            .unwrap();
        let token = match &info {
            Value::Array(fields) => fields.chunks(2).find_map(|p| match p {
                [Value::BulkString(n), Value::Int(t)] if n == b"token" => Some(*t as u64),
                _ => None,
            }),
            _ => None,
        };
        if info == Value::Nil || (answered.is_ok() && token == answered.as_ref().ok().copied()) {
            break;
        }
        assert!(
            promoted.elapsed() < lease / 2,
            "the grant is still on the new master {:?} after the failover: {info:?} ({answered:?})",
            promoted.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    set.resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_is_sent_again_to_the_new_master() {
    let mut set = sentinel_set().await;
    let client = LockClient::sentinel(set.sentinel_urls(), set.master_name())
        .await
        .unwrap();
    let master = set.master_addr().1;
    // Longer than a failover takes: the key stays held until the release below.
    let lease = Duration::from_secs(15);
    let mut held = client.lock("queue").lease(lease).acquire().await.unwrap();
    replicated(master).await;
    let waiter = client
        .lock("queue")
        .lease(lease)
        .wait_timeout(Duration::from_secs(60));
    let waiting = tokio::spawn(async move { waiter.acquire().await });
    // An EPHEMERAL one, on a key of its own: its connection goes with the old master, and the
    // library asks it again on a new one to the new master.
    let mut held_e = client.lock("queue-e").lease(lease).acquire().await.unwrap();
    replicated(master).await;
    let ephemeral_waiter = client
        .lock("queue-e")
        .ephemeral()
        .wait_timeout(Duration::from_secs(60));
    let ephemeral_waiting = tokio::spawn(async move { ephemeral_waiter.acquire().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());

    let (_, new) = failover(&mut set, true).await;
    // Both wait in the new master's queue, and are granted there on the releases.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "still waiting for the holder");
    assert!(
        !ephemeral_waiting.is_finished(),
        "the EPHEMERAL acquire still waits: {:?}",
        ephemeral_waiting.await
    );
    assert_eq!(held.release().await.unwrap(), Release::Released);
    assert_eq!(held_e.release().await.unwrap(), Release::Released);
    for (key, waiting, before) in [
        ("queue", waiting, held.token()),
        ("queue-e", ephemeral_waiting, held_e.token()),
    ] {
        let guard = within(
            "granted on the new master",
            Duration::from_secs(10),
            waiting,
        )
        .await
        .unwrap()
        .unwrap();
        assert!(guard.token() > before);
        assert!(holds(new.1, key, guard.owner(), guard.token()).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_master_is_left_for_the_new_one() {
    // A "zombie": paused past down-after-milliseconds, replaced, then continued (the Sentinels
    // make it a replica, closing its clients' connections).
    let mut set = sentinel_set().await;
    let client = LockClient::sentinel(set.sentinel_urls(), set.master_name())
        .await
        .unwrap();
    let lease = Duration::from_secs(15);
    let guard = client.lock("z").lease(lease).acquire().await.unwrap();
    let mut leaders = client.election("ze").observe();
    replicated(set.master_addr().1).await;
    let (old, new) = failover(&mut set, false).await;
    // An observer follows the new master's election (its connection to the paused one is
    // still open).
    let leadership = client
        .election("ze")
        .not_ephemeral()
        .campaign()
        .await
        .unwrap();
    let seen = within(
        "the observer sees the new leader",
        Duration::from_secs(5),
        leaders.next(),
    )
    .await
    .unwrap();
    assert_eq!(seen.epoch, leadership.epoch());
    assert!(holds(new.1, "ze", leadership.candidate(), leadership.epoch()).await);
    // The leader proclaims there, and the observer follows.
    assert!(leadership.proclaim("v2").await.unwrap());
    let seen = within(
        "the observer sees the value",
        Duration::from_secs(5),
        leaders.next(),
    )
    .await
    .unwrap();
    assert_eq!(seen.value.as_deref(), Some(&b"v2"[..]));
    set.resume();
    let deadline = Instant::now() + Duration::from_secs(30);
    while set.role(old.1).as_deref() != Some("slave") {
        assert!(Instant::now() < deadline, "the old master became a replica");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Renewed on the new master (the pause was shorter than the lease).
    let mut raw = on(new.1).await;
    let deadline = Instant::now() + lease;
    while support::calls(&mut raw, "lock.renew").await < 2 {
        assert!(Instant::now() < deadline, "renewed on the new master");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(guard.lost_reason(), None);
    assert!(holds(new.1, "z", guard.owner(), guard.token()).await);
    let mut next = client.lock("z2").try_acquire().await.unwrap().unwrap();
    assert!(holds(new.1, "z2", next.owner(), next.token()).await);
    next.release().await.unwrap();
}

/// A TCP relay to the server on a port: what passes through it, either way, is held while it is
/// shut and goes on once it is open again; its connections stay open meanwhile. A client that
/// reaches the Sentinels through relays learns of a failover only when the test opens them.
struct Relay {
    port: u16,
    open: tokio::sync::watch::Sender<bool>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn to(target: u16) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (open, gate) = tokio::sync::watch::channel(true);
        let accepting = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let gate = gate.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        return;
                    };
                    let (from_client, to_client) = inbound.into_split();
                    let (from_server, to_server) = outbound.into_split();
                    tokio::join!(
                        pass(from_client, to_server, gate.clone()),
                        pass(from_server, to_client, gate)
                    );
                });
            }
        });
        Relay {
            port,
            open,
            accepting,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn shut(&self) {
        self.open.send_replace(false);
    }

    fn reopen(&self) {
        self.open.send_replace(true);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Copies `from` to `to`, each chunk once the gate is open.
async fn pass(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut gate: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if gate.wait_for(|open| *open).await.is_err() || to.write_all(&chunk[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_from_a_master_the_sentinels_no_longer_name_is_no_loss() {
    // Found by the partition test: a master cut off from the Sentinels still serves the clients
    // that reach it, and does not have the holds the new master granted. A fenced write the
    // library sent there (its view of the Sentinels is up to a poll, a second, old) was refused
    // FENCED, and the guard was reported lost while the new master held it. Here the old master
    // stays a master, its clients connected (its ACL refuses the Sentinels' REPLICAOF and CLIENT
    // KILL), after a forced failover. The client's view is held still deterministically: it
    // reaches the Sentinels only through relays, shut before the failover (its polls and their
    // +switch-master message wait in them), so its shared connection stays on the old master,
    // where its write goes. The relays open once the old master has run the write, 200 ms
    // later: the current code has reported the loss by then. Before the fix: Fenced, the guard
    // lost. Now the refusal makes the library ask the Sentinels afresh (that ask waits in the
    // relays until they open): it came from a server they no longer name, so it counts as no
    // answer (Connection), and the next write lands on the new master, which has the hold.
    let set = sentinel_set().await;
    let mut relays = Vec::new();
    for (_, port) in set.sentinel_addrs() {
        relays.push(Relay::to(port).await);
    }
    let client = LockClient::sentinel_builder(
        relays.iter().map(Relay::url).collect::<Vec<_>>(),
        set.master_name(),
    )
    .unwrap()
    .command_timeout(Duration::from_secs(5))
    // Its check of the old master's FORCERELEASE message would go to the old master too: the
    // write alone is under test, as in the Python test (lost_signal=False).
    .without_lost_signal()
    .build()
    .await
    .unwrap();
    // No renewal before the write (one every lease / 3): the old master would answer it 0.
    let guard = client
        .lock("partitioned")
        .lease(Duration::from_secs(120))
        .acquire()
        .await
        .unwrap();
    // The shared connection to the master, warmed by one fenced write.
    let warmed: String = guard
        .fenced(redis::cmd("SET").arg("partitioned:state").arg("0"))
        .await
        .unwrap();
    assert_eq!(warmed, "OK");
    let old = set.master_addr();
    replicated(old.1).await;
    for relay in &relays {
        relay.shut();
    }
    let mut raw_old = on(old.1).await;
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("-replicaof")
        .arg("-slaveof")
        .arg("-client|kill")
        .query_async(&mut raw_old)
        .await
        .unwrap();
    ask_failover(set.sentinels[0].port, set.master_name()).await;
    let new = tokio::task::block_in_place(|| set.wait_failover(&old, Duration::from_secs(60)));
    assert_eq!(
        set.role(old.1).as_deref(),
        Some("master"),
        "two masters now"
    );
    // Gone on the old master, still held on the new one.
    let _: Value = redis::cmd("LOCK.FORCERELEASE")
        .arg("partitioned")
        .query_async(&mut raw_old)
        .await
        .unwrap();
    assert!(holds(new.1, "partitioned", guard.owner(), guard.token()).await);
    let guarded = support::calls(&mut raw_old, "lock.guard").await;
    let mut write = redis::cmd("SET");
    write.arg("partitioned:state").arg("a");
    let (refused, ()) = tokio::join!(guard.fenced::<Value>(&write), async {
        within(
            "the write reaches the old master",
            Duration::from_secs(10),
            async {
                while support::calls(&mut raw_old, "lock.guard").await == guarded {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            },
        )
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        for relay in &relays {
            relay.reopen();
        }
    });
    match refused {
        Err(LockError::Connection(_)) => {}
        other => panic!("no answer, not {other:?}"),
    }
    assert_eq!(guard.lost_reason(), None);
    let landed: String = guard
        .fenced(redis::cmd("SET").arg("partitioned:state").arg("b"))
        .await
        .unwrap();
    assert_eq!(landed, "OK");
    let state: String = redis::cmd("GET")
        .arg("partitioned:state")
        .query_async(&mut on(new.1).await)
        .await
        .unwrap();
    assert_eq!(state, "b");
    let mut guard = guard;
    assert_eq!(guard.release().await.unwrap(), Release::Released);
}

/// `SENTINEL MASTER <name>`'s `config-epoch` on `sentinel` (0 until a failover).
fn config_epoch(sentinel: &SentinelProcess, name: &str) -> u64 {
    sentinel
        .master_field(name, "config-epoch")
        .and_then(|epoch| epoch.parse().ok())
        .expect("the sentinel answers SENTINEL MASTER with a config-epoch")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_sentinel_listed_first_never_leads_the_client_to_an_older_master() {
    // A master and one replica watched by three Sentinels, failed over once (SENTINEL
    // FAILOVER): they name the replica at config-epoch >= 1.
    let options = SentinelOptions {
        replicas: 1,
        ..SentinelOptions::default()
    };
    let (mut set, stale) = tokio::task::spawn_blocking(move || {
        let set = SentinelSet::start_with(&options);
        // A Sentinel that lags behind, modelled by one that monitors an unrelated standalone
        // server under the same name: it names that server at config-epoch 0.
        let stale = Server::start();
        let lagging = SentinelProcess::start_from_config(&format!(
            "sentinel monitor {} 127.0.0.1 {} 1\n",
            set.master_name(),
            stale.port
        ));
        (set, (stale, lagging))
    })
    .await
    .unwrap();
    let (stale, lagging) = stale;
    let name = set.master_name().to_string();
    let old = set.master_addr();
    // The replica is ready to be promoted once it has acknowledged a write.
    let mut raw_old = on(old.1).await;
    let _: () = redis::cmd("SET")
        .arg("before")
        .arg("failover")
        .query_async(&mut raw_old)
        .await
        .unwrap();
    let acknowledged: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5_000)
        .query_async(&mut raw_old)
        .await
        .unwrap();
    assert_eq!(acknowledged, 1, "the replica acknowledged");
    ask_failover(set.sentinels[0].port, &name).await;
    let new = tokio::task::block_in_place(|| set.wait_failover(&old, Duration::from_secs(30)));
    for sentinel in &set.sentinels {
        assert!(config_epoch(sentinel, &name) >= 1);
    }
    assert_eq!(config_epoch(&lagging, &name), 0);
    assert_eq!(
        lagging.master_addr(&name),
        Some(("127.0.0.1".into(), stale.port))
    );

    // The lagging Sentinel first in the list: the client follows the highest epoch.
    let mut urls = vec![lagging.url()];
    urls.extend(set.sentinel_urls());
    let client = LockClient::sentinel(urls, &name).await.unwrap();
    let mut first = client.lock("epoch:1").try_acquire().await.unwrap().unwrap();
    assert!(
        holds(new.1, "epoch:1", first.owner(), first.token()).await,
        "granted on the master of the highest config-epoch (held on the lagging Sentinel's \
         server instead: {})",
        holds(stale.port, "epoch:1", first.owner(), first.token()).await
    );
    assert_eq!(first.release().await.unwrap(), Release::Released);

    // Never backwards: with the up-to-date Sentinels gone, the lagging one is the only one
    // left, and the client keeps the master it follows through the polls (every second).
    let up_to_date: Vec<SentinelProcess> = set.sentinels.drain(..).collect();
    // Dropped: killed and reaped.
    tokio::task::block_in_place(|| drop(up_to_date));
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let mut second = client.lock("epoch:2").try_acquire().await.unwrap().unwrap();
    assert!(
        holds(new.1, "epoch:2", second.owner(), second.token()).await,
        "still granted on the master of the highest config-epoch (held on the lagging \
         Sentinel's server instead: {})",
        holds(stale.port, "epoch:2", second.owner(), second.token()).await
    );
    assert_eq!(second.release().await.unwrap(), Release::Released);

    let mut raw_stale = on(stale.port).await;
    let keys: i64 = redis::cmd("DBSIZE")
        .query_async(&mut raw_stale)
        .await
        .unwrap();
    assert_eq!(keys, 0, "nothing written on the lagging Sentinel's server");
    assert_eq!(support::calls(&mut raw_stale, "lock.acquire").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_master_an_acquire_gives_up_after_the_failover_timeout() {
    let mut set = sentinel_set().await;
    let client = LockClient::sentinel_builder(set.sentinel_urls(), set.master_name())
        .unwrap()
        .failover_timeout(Duration::from_secs(3))
        .build()
        .await
        .unwrap();
    let mut guard = client.lock("k").acquire().await.unwrap();
    guard.release().await.unwrap();
    // Every data server gone: no failover can happen.
    for server in &mut set.servers {
        server.kill_hard();
    }
    for wait in [None, Some(Duration::from_secs(60))] {
        let lock = match wait {
            Some(w) => client.lock("k").wait_timeout(w),
            None => client.lock("k"),
        };
        let started = Instant::now();
        let answer = within("the acquire gives up", Duration::from_secs(20), async {
            match wait {
                Some(_) => lock.acquire().await.map(Some),
                None => lock.try_acquire().await,
            }
        })
        .await;
        assert!(
            matches!(answer, Err(LockError::Connection(_))),
            "{answer:?}"
        );
        assert!(
            started.elapsed() >= Duration::from_millis(2_500),
            "sent again for the failover timeout: {:?}",
            started.elapsed()
        );
    }
    // Only through Sentinel.
    let refused = LockClient::builder(redis::Client::open("redis://127.0.0.1:1/").unwrap())
        .failover_timeout(Duration::from_secs(1))
        .build()
        .await;
    assert!(matches!(refused, Err(LockError::InvalidArgument(_))));
}

// ---------------------------------------------------------------------------------------------
// Grants acknowledged by replicas (a master and a replica, no Sentinel needed)

struct Replicated {
    master: Server,
    replica: Server,
    client: LockClient,
}

async fn replicated_pair() -> Replicated {
    let (master, replica) = tokio::task::spawn_blocking(|| {
        let master = Server::start();
        let replica = Server::replica_of(&master);
        (master, replica)
    })
    .await
    .unwrap();
    let client = LockClient::open(&master.url()).await.unwrap();
    Replicated {
        master,
        replica,
        client,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_1_hands_out_acknowledged_grants_and_refuses_the_others() {
    let r = replicated_pair().await;
    let mut raw = support::raw(&r.master).await;
    let wait = Duration::from_millis(300);
    let lock = r.client.lock("acked").replicas(1, wait);
    let waits = support::calls(&mut raw, "wait").await;
    let mut guard = lock.acquire().await.unwrap();
    assert!(support::calls(&mut raw, "wait").await > waits);
    assert!(holds(r.replica.port, "acked", guard.owner(), guard.token()).await);
    guard.release().await.unwrap();

    // The replica is paused: nothing acknowledges. Every form answers NotSafelyAcquired with
    // the grant's token, and the grant was released.
    r.replica.signal(Signal::Stop);
    let refused = lock.acquire().await;
    let Err(LockError::NotSafelyAcquired {
        tokens,
        acknowledged,
        wanted,
        why,
    }) = refused
    else {
        panic!("{refused:?}")
    };
    assert_eq!(tokens.len(), 1);
    assert!(tokens[0] > guard.token());
    assert_eq!((acknowledged, wanted), (0, 1));
    assert_eq!(why, "0 of 1 replicas acknowledged within 300 ms (WAIT)");
    let info: Value = redis::cmd("LOCK.INFO")
        .arg("acked")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(info, Value::Nil, "released");
    let refused = lock.try_acquire().await;
    assert!(
        matches!(refused, Err(LockError::NotSafelyAcquired { .. })),
        "{refused:?}"
    );
    let refused = r
        .client
        .multi_lock(["{m}:1", "{m}:2"])
        .replicas(1, wait)
        .acquire()
        .await;
    assert!(
        matches!(refused, Err(LockError::NotSafelyAcquired { .. })),
        "{refused:?}"
    );
    let refused = r
        .client
        .election("leader")
        .replicas(1, wait)
        .campaign()
        .await;
    assert!(
        matches!(refused, Err(LockError::NotSafelyAcquired { .. })),
        "{refused:?}"
    );
    for key in ["{m}:1", "{m}:2", "leader"] {
        let info: Value = redis::cmd("LOCK.INFO")
            .arg(key)
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(info, Value::Nil, "{key} released");
    }
    // Acknowledged again once the replica runs.
    r.replica.signal(Signal::Cont);
    let guard = lock.acquire().await.unwrap();
    assert!(holds(r.replica.port, "acked", guard.owner(), guard.token()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_acknowledged_renewals_keep_a_hold() {
    let r = replicated_pair().await;
    let lease = Duration::from_millis(1_500);
    let guard = r
        .client
        .lock("renewed")
        .lease(lease)
        .replicas(1, Duration::from_millis(200))
        .acquire()
        .await
        .unwrap();
    // Acknowledged renewals: held past several leases.
    tokio::time::sleep(lease * 2).await;
    assert_eq!(guard.lost_reason(), None);
    // Unacknowledged: the master renews, but the guard's deadline no longer moves, and the
    // hold is reported lost within a lease for its own reason (the master answered; the
    // replica did not), not Unreachable. The master still has it, so the library releases it
    // (by its token) instead of leaving it to block the key for a lease. Before, it reported
    // Unreachable and left the hold on the master until its lease ended.
    let releases = support::calls(&mut on(r.master.port).await, "lock.release").await;
    r.replica.signal(Signal::Stop);
    let started = Instant::now();
    let reason = within("reported lost", lease * 5, guard.lost()).await;
    assert_eq!(reason, LostReason::Unreplicated);
    assert!(started.elapsed() <= lease * 5, "{:?}", started.elapsed());
    let (owner, token) = (guard.owner().to_string(), guard.token());
    let released = Instant::now() + lease * 5;
    while holds(r.master.port, "renewed", &owner, token).await {
        assert!(
            Instant::now() < released,
            "the abandoned hold was not released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Released (by the library), not left to its lease.
    let now = support::calls(&mut on(r.master.port).await, "lock.release").await;
    assert!(now > releases, "no LOCK.RELEASE reached the master");
    r.replica.signal(Signal::Cont);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledgement_timeout_must_be_below_the_command_timeout() {
    let r = replicated_pair().await;
    let refused = r
        .client
        .lock("k")
        .replicas(1, Duration::from_secs(2))
        .try_acquire()
        .await;
    assert!(
        matches!(refused, Err(LockError::InvalidArgument(_))),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_aof_asks_for_aof_fsyncs_where_the_server_has_waitaof() {
    let info = support::server_info();
    let has_waitaof = info.kind == support::ServerKind::Valkey || info.version >= (7, 2, 0);
    // `appendfsync always`: with the default `everysec` a local fsync may be a second away, past
    // the timeout (Redis 8.2.3 answered 0 local fsyncs within 500 ms in CI).
    let master = tokio::task::spawn_blocking(|| {
        Server::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
    })
    .await
    .unwrap();
    let client = LockClient::open(&master.url()).await.unwrap();
    let lock = client
        .lock("aof")
        .wait_aof(1, 0, Duration::from_millis(900));
    let answer = lock.acquire().await;
    if has_waitaof {
        let mut guard = answer.unwrap();
        guard.release().await.unwrap();
        // No replica to fsync: not safely acquired.
        let refused = client
            .lock("aof")
            .wait_aof(1, 1, Duration::from_millis(200))
            .acquire()
            .await;
        let Err(LockError::NotSafelyAcquired { why, .. }) = refused else {
            panic!("{refused:?}")
        };
        assert!(why.contains("by replicas 0 of 1"), "{why}");
    } else {
        let Err(LockError::NotSafelyAcquired { why, .. }) = answer else {
            panic!("{answer:?}")
        };
        assert!(
            why.starts_with("WAITAOF: server error: ERR unknown command"),
            "{why}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The failover driver (examples/failover_driver.rs)

/// The fields of one flat JSON object line (strings unescaped for `\"` and `\\` only, numbers
/// and `null` as text).
fn fields(line: &str) -> std::collections::HashMap<String, String> {
    let body = line
        .trim()
        .strip_prefix('{')
        .and_then(|l| l.strip_suffix('}'))
        .unwrap_or_else(|| panic!("not an object: {line}"));
    let mut out = std::collections::HashMap::new();
    let mut chars = body.chars().peekable();
    let string = |chars: &mut std::iter::Peekable<std::str::Chars>| {
        assert_eq!(chars.next(), Some('"'), "{line}");
        let mut s = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => s.push(chars.next().unwrap()),
                '"' => return s,
                c => s.push(c),
            }
        }
        panic!("unterminated string: {line}")
    };
    while chars.peek().is_some() {
        let name = string(&mut chars);
        assert_eq!(chars.next(), Some(':'), "{line}");
        let value = if chars.peek() == Some(&'"') {
            string(&mut chars)
        } else {
            let mut v = String::new();
            while let Some(c) = chars.peek().copied().filter(|c| *c != ',') {
                v.push(c);
                chars.next();
            }
            v
        };
        out.insert(name, value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_failover_driver_writes_one_line_per_acknowledged_hold() {
    let mut set = sentinel_set().await;
    let exe = std::env::current_exe()
        .unwrap()
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("examples/failover_driver"))
        .unwrap();
    assert!(
        exe.exists(),
        "{exe:?}: cargo test builds it (--examples for a filtered run)"
    );
    let dir = tempfile_dir();
    let output = dir.join("holds.jsonl");
    let sentinels = set
        .sentinel_addrs()
        .iter()
        .map(|(h, p)| format!("{h}:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let driver = tokio::process::Command::new(&exe)
        .args(["--sentinels", &sentinels, "--master", set.master_name()])
        .args([
            "--exclusive",
            "fx",
            "--shared",
            "fs",
            "--semaphore",
            "fm",
            "--limit",
            "2",
        ])
        .args(["--election", "fe", "--replicas", "1", "--duration", "10"])
        .args(["--lease-ms", "3000", "--wait-ms", "2000"])
        .arg("--output")
        .arg(&output)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    failover(&mut set, true).await;
    let failed_over = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let status = within(
        "the driver ends",
        Duration::from_secs(60),
        driver.wait_with_output(),
    )
    .await
    .unwrap();
    assert!(status.status.success());
    let text = std::fs::read_to_string(&output).unwrap();
    let lines: Vec<_> = text.lines().map(fields).collect();
    let holds: Vec<_> = lines.iter().filter(|l| !l.contains_key("event")).collect();
    for kind in ["exclusive", "shared", "permit", "leader"] {
        assert!(
            holds.iter().any(|h| h["kind"] == kind),
            "a {kind} hold:\n{text}"
        );
    }
    for h in &holds {
        assert_eq!(h["lib"], "rust");
        assert_eq!(h["replicas"], "1");
        let (asked, start, end): (u64, u64, u64) = (
            h["asked_ms"].parse().unwrap(),
            h["start_ms"].parse().unwrap(),
            h["end_ms"].parse().unwrap(),
        );
        assert!(asked <= start && start <= end, "{h:?}");
        assert!(h["token"].parse::<u64>().unwrap() > 0);
        assert!(
            h["end"] == "released" || h["end"] == "run-end" || h["end"].starts_with("lost:"),
            "{h:?}"
        );
        assert_eq!(h["limit"], if h["kind"] == "permit" { "2" } else { "null" });
    }
    // Holds after the failover (on the new master), and every acquire answered.
    assert!(
        holds
            .iter()
            .any(|h| h["start_ms"].parse::<u64>().unwrap() > failed_over),
        "holds after the failover:\n{text}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.get("event").map(String::as_str) == Some("unanswered")),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "failover-driver-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicas_refusal_on_a_master_without_replicas_says_so() {
    // The set-up a failover leaves behind 1 master + 1 replica: a master with no replica. No
    // wait could be acknowledged, and the refusal says why, not only "0 of 1 acknowledged".
    let master = tokio::task::spawn_blocking(Server::start).await.unwrap();
    let client = LockClient::open(&master.url()).await.unwrap();
    let refused = client
        .lock("alone")
        .replicas(1, Duration::from_millis(200))
        .acquire()
        .await;
    match refused {
        Err(LockError::NotSafelyAcquired { why, .. }) => assert!(
            why.starts_with("the master has 0 connected replicas, 1 needed"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    // Released (by its token): the key is free.
    let mut raw = on(master.port).await;
    let info: redis::Value = redis::cmd("LOCK.INFO")
        .arg("alone")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(info, redis::Value::Nil);
}

/// With no Sentinel to subscribe to, the client's Sentinel watch tried again at once: a
/// `tokio::time::interval`'s first tick is immediate, so each failed subscription was followed
/// by a lookup and the next try with no pause, a loop of connection attempts for as long as
/// the Sentinels were unreachable (found reading master.rs). Here the one Sentinel is killed
/// after the client found the master, and its port taken by a listener that accepts
/// connections and closes them at once: in 2 s the watch may try about twice a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_sentinels_are_tried_again_after_a_pause_not_in_a_loop() {
    let mut set = SentinelSet::start_with(&SentinelOptions {
        replicas: 0,
        sentinels: 1,
        ..SentinelOptions::default()
    });
    let client = LockClient::sentinel(set.sentinel_urls(), set.master_name())
        .await
        .unwrap();
    let port = set.sentinels[0].port;
    drop(set.sentinels.pop()); // killed
    let listener = loop {
        match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
            Ok(listener) => break listener,
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    let closer = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            drop(socket);
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let tries = accepted.load(std::sync::atomic::Ordering::Relaxed);
    // A subscription and a lookup a second, each a connection or a few.
    assert!(tries < 50, "{tries} connections to the Sentinel in 2 s");
    drop(client);
    closer.abort();
}
