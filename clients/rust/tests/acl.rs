//! The library run as the users of docs/operations.md (*ACL*), their `ACL SETUSER` lines read
//! from that file: the application user holds, waits (tickets and blocking), shares, takes
//! several keys, campaigns, fences writes and hears the lost-hold signal (the flush channel
//! too); the observer user follows the election; the operator force-releases. A refusal of the
//! ACL is `LockError::NoPermission` naming the command, at once: never a lost hold
//! (`Unreachable`) nor a connection error.

mod support;

use std::time::Duration;

use redis::aio::MultiplexedConnection;
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
            let LockError::NoPermission { command, message } = &e else {
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
