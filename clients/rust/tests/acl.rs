//! The library run as the users of docs/operations.md (*ACL*), their `ACL SETUSER` lines read
//! from that file: the application user holds, waits (tickets and blocking), shares, takes
//! several keys, campaigns, fences writes and hears the lost-hold signal (the flush channel
//! too); the observer user follows the election; the operator force-releases. A refusal of the
//! ACL is `LockError::NoPermission` naming the command, at once: never a lost hold
//! (`Unreachable`) nor a connection error.

mod support;

use std::time::Duration;

use lock_testkit::SentinelSet;
use redis::aio::MultiplexedConnection;
use redis::Value;
use redis_lock_client::{LockClient, LockError, LostReason};
use support::{raw, Server};

/// The `ACL SETUSER <user> ...` line docs/operations.md prints, split into its arguments.
fn documented(user: &str) -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/operations.md"
    ))
    .expect("docs/operations.md");
    let prefix = format!("ACL SETUSER {user} ");
    let line = doc
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` line in docs/operations.md"));
    line.split_whitespace().map(str::to_string).collect()
}

/// The application line docs/operations.md printed before the libraries' recipe.
const OLD_APP_LINE: &str = "ACL SETUSER app on >app-secret ~app:* resetchannels &redisson_lock__channel:{app:*} &redisson_lock__channel:app:* +lock.acquire +lock.release +lock.renew +lock.info +lock.macquire +lock.mrelease +lock.mrenew +subscribe +unsubscribe +psubscribe +punsubscribe";

async fn run(raw: &mut MultiplexedConnection, line: &[String]) {
    let _: () = redis::cmd(&line[0])
        .arg(&line[1..])
        .query_async(raw)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", line.join(" ")));
}

/// The password of a documented line (`>secret`).
fn password(line: &[String]) -> String {
    line.iter()
        .find_map(|a| a.strip_prefix('>'))
        .expect("a password")
        .to_string()
}

async fn client_as(server: &Server, line: &[String]) -> Result<LockClient, LockError> {
    let url = format!(
        "redis://{}:{}@127.0.0.1:{}/",
        line[2],
        password(line),
        server.port
    );
    LockClient::open(&url).await
}

async fn checks(raw: &mut MultiplexedConnection, key: &str, owner: &str, token: u64) -> i64 {
    redis::cmd("LOCK.CHECK")
        .arg(key)
        .arg(owner)
        .arg(token)
        .query_async(raw)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_application_user_runs_every_part_of_the_library() {
    let server = Server::start();
    let mut admin = raw(&server).await;
    let app = documented("app");
    run(&mut admin, &app).await;
    let client = client_as(&server, &app).await.expect("open as app");

    // A hold kept past its lease: renewed and checked, never reported lost.
    let lease = Duration::from_millis(900);
    let lock = client.lock("app:plain").lease(lease);
    let mut guard = lock.acquire().await.unwrap();
    tokio::time::sleep(lease * 2).await;
    assert_eq!(guard.lost_reason(), None);
    assert_eq!(
        checks(&mut admin, "app:plain", guard.owner(), guard.token()).await,
        1
    );
    // A fenced write (LOCK.GUARD + SET), then the release.
    let _: () = guard
        .fenced(redis::cmd("SET").arg("app:plain:data").arg("v"))
        .await
        .unwrap();
    guard.release().await.unwrap();

    // Waiting, with tickets (the default) and blocking.
    for tickets in [true, false] {
        let waiter = LockClient::builder(
            redis::Client::open(format!(
                "redis://app:{}@127.0.0.1:{}/",
                password(&app),
                server.port
            ))
            .unwrap(),
        )
        .wait_with_tickets(tickets)
        .build()
        .await
        .unwrap();
        let key = format!("app:wait:{tickets}");
        let mut first = client.lock(&key).acquire().await.unwrap();
        let waiting = waiter.lock(&key).wait_timeout(Duration::from_secs(10));
        let second = waiting.acquire();
        let release = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            first.release().await.unwrap();
        };
        let (granted, ()) = tokio::join!(second, release);
        granted
            .unwrap_or_else(|e| panic!("tickets {tickets}: {e}"))
            .release()
            .await
            .unwrap();
    }

    // Shared holds and permits.
    let mut a = client.read_lock("app:shared").acquire().await.unwrap();
    let mut b = client.read_lock("app:shared").acquire().await.unwrap();
    let mut p = client.semaphore("app:sem", 2).acquire().await.unwrap();
    for g in [&mut a, &mut b, &mut p] {
        g.release().await.unwrap();
    }

    // Several keys at once.
    let mut multi = client
        .multi_lock(["app:{m}:1", "app:{m}:2"])
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(lease * 2).await;
    assert_eq!(multi.lost_reason(), None);
    multi.release().await.unwrap();

    // An election, followed by the documented observer.
    let observer_line = documented("observer");
    run(&mut admin, &observer_line).await;
    let watcher = client_as(&server, &observer_line)
        .await
        .expect("open as observer");
    let mut observer = watcher.election("app:svc").observe();
    let mut leadership = client
        .election("app:svc")
        .campaign_with_value("10.0.0.1:80")
        .await
        .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match observer.next().await {
                Some(leader) if leader.epoch == leadership.epoch() => return leader,
                Some(_) => continue,
                None => panic!("the observer ended"),
            }
        }
    })
    .await
    .expect("the observer saw the leader");
    assert_eq!(seen.value_str().as_deref(), Some("10.0.0.1:80"));
    let read = watcher.election("app:svc").leader().await.unwrap().unwrap();
    assert_eq!(read.epoch, leadership.epoch());
    assert!(leadership.proclaim("10.0.0.2:80").await.unwrap());
    leadership.resign().await.unwrap();

    // The lost-hold signal: a flush (its own channel) and a force release by the operator, each
    // reported well before the lease would have.
    let long = client.lock("app:flushed").lease(Duration::from_secs(30));
    let flushed = long.acquire().await.unwrap();
    let _: () = redis::cmd("FLUSHDB").query_async(&mut admin).await.unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(5), flushed.lost())
        .await
        .expect("the flush was heard");
    assert_eq!(reason, LostReason::Flushed);
    let ops = documented("ops");
    run(&mut admin, &ops).await;
    let forced = client.lock("app:forced").acquire().await.unwrap();
    let mut operator = redis::Client::open(format!(
        "redis://ops:{}@127.0.0.1:{}/",
        password(&ops),
        server.port
    ))
    .unwrap()
    .get_multiplexed_async_connection()
    .await
    .unwrap();
    let removed: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("app:forced")
        .query_async(&mut operator)
        .await
        .unwrap();
    assert_eq!(removed, 1);
    let reason = tokio::time::timeout(Duration::from_secs(5), forced.lost())
        .await
        .expect("the force release was heard");
    assert_eq!(reason, LostReason::ForceReleased);
}

/// The application line docs/operations.md printed before: the client cannot open, and says
/// which command the ACL refused (it was a bare server error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_documented_line_is_refused_by_name_at_open() {
    let server = Server::start();
    let mut admin = raw(&server).await;
    let old: Vec<String> = OLD_APP_LINE.split(' ').map(str::to_string).collect();
    run(&mut admin, &old).await;
    match client_as(&server, &old).await {
        Err(e @ LockError::NoPermission { .. }) => {
            let LockError::NoPermission {
                command, message, ..
            } = &e
            else {
                unreachable!()
            };
            assert_eq!(command, "PING", "{e}");
            assert!(message.starts_with("NOPERM"), "{e}");
            assert_eq!(e.missing_rule().as_deref(), Some("+ping"));
        }
        Err(e) => panic!("not a permission error: {e:?}"),
        Ok(_) => panic!("opened"),
    }
}

/// The recipe without `+lock.check`: the first renewal's check is refused, and the hold ends
/// at once as `NoPermission` (released on the server), never `Unreachable` at 90 % of the lease
/// while the server still holds it; the guard's release names `LOCK.CHECK`. The old line with
/// `+ping +client|setname` added did the same (every hold reported `Unreachable`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_check_is_a_permission_error_naming_lock_check_not_a_loss() {
    let server = Server::start();
    let mut admin = raw(&server).await;
    let app = documented("app");
    run(&mut admin, &app).await;
    run(
        &mut admin,
        &["ACL", "SETUSER", "app", "-lock.check"].map(str::to_string),
    )
    .await;
    let client = client_as(&server, &app).await.expect("open as app");
    let lease = Duration::from_millis(1_500);
    let mut guard = client.lock("app:k").lease(lease).acquire().await.unwrap();
    // The first renewal goes at a third of the lease: refused well before 90 % of it.
    let reason = tokio::time::timeout(lease * 8 / 10, guard.lost())
        .await
        .expect("the refusal was said before 80 % of the lease");
    assert_eq!(reason, LostReason::NoPermission);
    match guard.release().await {
        Err(e @ LockError::NoPermission { .. }) => {
            let LockError::NoPermission { command, .. } = &e else {
                unreachable!()
            };
            assert_eq!(command, "LOCK.CHECK", "{e}");
            assert_eq!(e.missing_rule().as_deref(), Some("+lock.check"));
        }
        other => panic!("not a permission error: {other:?}"),
    }
    // Released in the background: nobody waits out a hold this side gave up.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let info: redis::Value = redis::cmd("LOCK.INFO")
            .arg("app:k")
            .query_async(&mut admin)
            .await
            .unwrap();
        if info == redis::Value::Nil {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still held: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn on(port: u16) -> MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// The rules docs/operations.md says a cluster adds to the `app` line ("In a cluster add
/// `...`").
fn documented_cluster_rules() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/operations.md"
    ))
    .expect("docs/operations.md");
    let (_, rest) = doc
        .split_once("In a cluster add `")
        .expect("an `In a cluster add` sentence in docs/operations.md");
    let (rules, _) = rest.split_once('`').expect("its closing backtick");
    rules.split_whitespace().map(str::to_string).collect()
}

/// What the server (or Sentinel) on `port` logged as refused by its ACL (`ACL LOG`):
/// `reason object` per entry. `CLIENT SETINFO`, which the clients send on connecting and whose
/// refusal they ignore (Redis >= 7.2; Redis 7.0 has no such command), is left out.
async fn refusals(port: u16) -> Vec<String> {
    let entries: Vec<Vec<Value>> = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut on(port).await)
        .await
        .unwrap();
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    };
    entries
        .iter()
        .map(|entry| {
            let field = |name: &str| {
                entry
                    .chunks(2)
                    .find(|pair| pair.first().map(text).as_deref() == Some(name))
                    .and_then(|pair| pair.get(1))
                    .map(text)
                    .unwrap_or_default()
            };
            format!("{} {}", field("reason"), field("object"))
        })
        .filter(|e| !e.ends_with("client|setinfo"))
        .collect()
}

/// Through Sentinel, as docs/operations.md's users: its `lock-sentinel` line on every Sentinel
/// and its `app` line on every data server, read from the page. A lock is held past its lease
/// (renewed), released, and after a failover (the master killed) the next acquire is granted
/// by the new master and the hold kept across it is renewed there; no server and no Sentinel
/// logged a refusal (`ACL LOG`: the Sentinel lookups, `SENTINEL MASTER` among them, and the
/// `+switch-master` subscription all passed). The page's line before lacked `+sentinel|master`,
/// which every lookup sends: no master was ever found. Without it the client now fails to
/// build with `NoPermission` naming `SENTINEL|MASTER`, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinel_the_documented_users_lock_and_follow_a_failover() {
    let mut set = tokio::task::spawn_blocking(SentinelSet::start)
        .await
        .unwrap();
    let sentinel_line = documented("lock-sentinel");
    let app = documented("app");
    // First without `+sentinel|master`: the client says which rule the Sentinels lack, at
    // once (measured: a few ms), not "no master" (it did before).
    let short: Vec<String> = sentinel_line
        .iter()
        .filter(|a| *a != "+sentinel|master")
        .cloned()
        .collect();
    assert_eq!(short.len(), sentinel_line.len() - 1);
    for sentinel in &set.sentinels {
        run(&mut on(sentinel.port).await, &short).await;
    }
    for server in &set.servers {
        run(&mut on(server.port).await, &app).await;
    }
    let urls: Vec<String> = set
        .sentinels
        .iter()
        .map(|s| {
            format!(
                "redis://{}:{}@127.0.0.1:{}/",
                sentinel_line[2],
                password(&sentinel_line),
                s.port
            )
        })
        .collect();
    let build = || async {
        LockClient::sentinel_builder(urls.clone(), set.master_name())
            .unwrap()
            .master_settings(
                redis::RedisConnectionInfo::default()
                    .set_username(&app[2])
                    .set_password(password(&app)),
            )
            .build()
            .await
    };
    let started = std::time::Instant::now();
    match build().await {
        Err(e @ LockError::NoPermission { .. }) => {
            assert!(started.elapsed() < Duration::from_secs(1), "{e}");
            let LockError::NoPermission { command, .. } = &e else {
                unreachable!()
            };
            assert_eq!(command, "SENTINEL|MASTER", "{e}");
            assert_eq!(e.missing_rule().as_deref(), Some("+sentinel|master"));
        }
        Err(e) => panic!("not a permission error: {e:?}"),
        Ok(_) => panic!("built without +sentinel|master"),
    }
    for sentinel in &set.sentinels {
        let mut conn = on(sentinel.port).await;
        run(&mut conn, &sentinel_line).await;
        run(&mut conn, &["ACL", "LOG", "RESET"].map(str::to_string)).await;
    }
    let client = build()
        .await
        .expect("a client through the Sentinels as the documented users");

    // Held past its lease (renewed and checked), then released.
    let lease = Duration::from_millis(900);
    let mut guard = client.lock("app:s").lease(lease).acquire().await.unwrap();
    tokio::time::sleep(lease * 2).await;
    assert_eq!(guard.lost_reason(), None);
    guard.release().await.unwrap();

    // A failover: the kept hold is renewed on the new master, the next acquire granted there.
    let kept = client
        .lock("app:kept")
        .lease(Duration::from_secs(15))
        .acquire()
        .await
        .unwrap();
    let old = set.master_addr();
    let acked: i64 = redis::cmd("WAIT")
        .arg(2)
        .arg(5_000)
        .query_async(&mut on(old.1).await)
        .await
        .unwrap();
    assert_eq!(acked, 2, "both replicas have the hold");
    set.kill_master();
    let new = tokio::task::block_in_place(|| set.wait_failover(&old, Duration::from_secs(60)));
    let mut after =
        tokio::time::timeout(Duration::from_secs(30), client.lock("app:after").acquire())
            .await
            .expect("acquired within 30 s of the failover")
            .unwrap();
    let mut on_new = on(new.1).await;
    assert_eq!(
        checks(&mut on_new, "app:after", after.owner(), after.token()).await,
        1,
        "granted by the new master"
    );
    let renewed = tokio::time::Instant::now() + Duration::from_secs(15);
    while support::calls(&mut on_new, "lock.renew").await < 1 {
        assert!(
            tokio::time::Instant::now() < renewed,
            "the kept hold was renewed on the new master"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(kept.lost_reason(), None);
    after.release().await.unwrap();
    let mut kept = kept;
    kept.release().await.unwrap();

    for port in set
        .sentinels
        .iter()
        .map(|s| s.port)
        .chain(set.servers.iter().map(|s| s.port))
        .filter(|port| *port != old.1)
    {
        assert_eq!(
            refusals(port).await,
            Vec::<String>::new(),
            "ACL LOG of {port}"
        );
    }
}

/// In a cluster, as docs/operations.md's `app` user with the rules the page says a cluster
/// adds, on every node of a three-master cluster: a lock on each master held past its lease
/// (renewed), a fenced write, a wait, a multi-key hold, the lost-hold signal (`SSUBSCRIBE`)
/// of a force release, each release; no node logged a refusal (`ACL LOG`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_the_documented_user_with_the_cluster_rules_locks_on_every_master() {
    let cluster = tokio::task::spawn_blocking(|| lock_testkit::Cluster::start(3))
        .await
        .unwrap();
    let mut line = documented("app");
    line.extend(documented_cluster_rules());
    for node in &cluster.nodes {
        run(&mut on(node.port).await, &line).await;
    }
    let urls: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("redis://app:{}@127.0.0.1:{}/", password(&line), n.port))
        .collect();
    let client = LockClient::cluster_builder(urls.clone())
        .unwrap()
        .build()
        .await
        .expect("a cluster client as the documented user");
    let waiter = LockClient::cluster_builder(urls)
        .unwrap()
        .build()
        .await
        .unwrap();
    let keys: Vec<String> = [0u16, 5_461, 10_923]
        .into_iter()
        .filter_map(|low| {
            (0..10_000)
                .map(|i| format!("app:{{c{i}}}"))
                .find(|k| (low..low + 5_000).contains(&support::key_slot(k)))
        })
        .collect();
    assert_eq!(keys.len(), 3);
    let lease = Duration::from_millis(900);
    let mut admin = redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    for key in &keys {
        let mut guard = client.lock(key).lease(lease).acquire().await.unwrap();
        tokio::time::sleep(lease * 2).await;
        assert_eq!(guard.lost_reason(), None, "{key}");
        let _: () = guard
            .fenced(redis::cmd("SET").arg(format!("{key}:data")).arg("v"))
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        let waiting = waiter.lock(key).wait_timeout(Duration::from_secs(10));
        let second = waiting.acquire();
        let release = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            guard.release().await.unwrap();
        };
        let (granted, ()) = tokio::join!(second, release);
        let granted = granted.unwrap_or_else(|e| panic!("{key}: {e}"));
        // The lost-hold signal, through the key's node.
        let removed: i64 = redis::cmd("LOCK.FORCERELEASE")
            .arg(key)
            .query_async(&mut admin)
            .await
            .unwrap();
        assert_eq!(removed, 1);
        let reason = tokio::time::timeout(Duration::from_secs(5), granted.lost())
            .await
            .expect("the force release was heard");
        assert_eq!(reason, LostReason::ForceReleased, "{key}");
    }
    let mut multi = client
        .multi_lock(["app:{m}:1", "app:{m}:2"])
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(lease * 2).await;
    assert_eq!(multi.lost_reason(), None);
    multi.release().await.unwrap();
    for node in &cluster.nodes {
        assert_eq!(
            refusals(node.port).await,
            Vec::<String>::new(),
            "ACL LOG of {}",
            node.port
        );
    }
}

/// The recipe without one of its lost-hold channels (a key's, or the flush channel): the
/// acquire that needs the subscription returns `NoPermission` naming `SUBSCRIBE`, the channel
/// and the rule to add, at once (measured: a few ms), and its grant is released (the key is
/// free); asked again, again at once; with the rule back, the same client acquires. Before,
/// the refusal was dropped: the acquire returned a guard nobody would tell of a loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_lost_signal_channel_fails_the_acquire_at_once_naming_the_rule() {
    for (dropped, channel) in [
        ("&lock.lost:{app:*}", "lock.lost:{app:k}"),
        ("&lock.lost:flush", "lock.lost:flush"),
    ] {
        let server = Server::start();
        let mut admin = raw(&server).await;
        let app = documented("app");
        let line: Vec<String> = app.iter().filter(|a| *a != dropped).cloned().collect();
        assert_eq!(line.len(), app.len() - 1);
        run(&mut admin, &line).await;
        let client = client_as(&server, &line).await.expect("open as app");
        for attempt in 0..2 {
            let started = std::time::Instant::now();
            let acquired = client.lock("app:k").acquire().await;
            let elapsed = started.elapsed();
            match acquired {
                Err(e @ LockError::NoPermission { .. }) => {
                    assert!(
                        elapsed < Duration::from_secs(1),
                        "{dropped}: refused after {elapsed:?} (attempt {attempt})"
                    );
                    let LockError::NoPermission { command, .. } = &e else {
                        unreachable!()
                    };
                    assert_eq!(command, "SUBSCRIBE", "{e}");
                    let rule = format!("&{channel}");
                    assert_eq!(e.missing_rule().as_deref(), Some(rule.as_str()));
                    assert!(e.to_string().contains(&rule), "{e}");
                }
                Err(e) => panic!("{dropped}: not a permission error: {e:?}"),
                Ok(_) => panic!("{dropped}: acquired after {elapsed:?} (attempt {attempt})"),
            }
            let info: Value = redis::cmd("LOCK.INFO")
                .arg("app:k")
                .query_async(&mut admin)
                .await
                .unwrap();
            assert_eq!(info, Value::Nil, "{dropped}: the grant was released");
        }
        // Without the lost-hold signal, nothing is subscribed: the same user acquires.
        let quiet = LockClient::builder(
            redis::Client::open(format!(
                "redis://app:{}@127.0.0.1:{}/",
                password(&line),
                server.port
            ))
            .unwrap(),
        )
        .without_lost_signal()
        .build()
        .await
        .unwrap();
        let mut guard = quiet.lock("app:k").acquire().await.unwrap();
        guard.release().await.unwrap();
        run(
            &mut admin,
            &["ACL", "SETUSER", "app", dropped].map(str::to_string),
        )
        .await;
        let mut guard = client.lock("app:k").acquire().await.unwrap();
        guard.release().await.unwrap();
    }
}
