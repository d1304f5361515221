//! What each public call answers, and when: one test per row of the README's "Errors" table
//! (the row is named in each test's comment), against a real redis-server with the module
//! loaded. Rows whose outcome other files test in depth name those tests too.

mod support;

use std::time::Duration;

use lock_testkit::Signal;
use redis::aio::MultiplexedConnection;
use redis::Value;
use redis_lock_client::{LockClient, LockError, LostReason, Release};
use support::{ephemeral_connection, kill, raw, setup, setup_without_signal, Server};

fn set(key: &str, value: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(key).arg(value);
    cmd
}

/// A loss the connection's close caused, by whichever path saw it first.
fn closed(reason: Option<LostReason>) -> bool {
    matches!(
        reason,
        Some(LostReason::ConnectionClosed | LostReason::Disconnected)
    )
}

/// Both client set-ups: with the lost-hold signal (its `disconnected` message may come first)
/// and without (the library's own sight of the close alone).
async fn both() -> Vec<(Server, LockClient, MultiplexedConnection)> {
    vec![setup().await, setup_without_signal().await]
}

// Row "proclaim": a leadership whose EPHEMERAL connection closed before the call is over.
// Regression: before, the proclamation ran on the dead connection and answered
// `Connection(broken pipe)`, where the README promises true or false.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaim_after_the_ephemeral_connection_closed_answers_false() {
    for (_server, client, mut raw) in both().await {
        for round in 0..4 {
            let election = client.election("{p}:election");
            let leadership = election.campaign().await.unwrap();
            let id = ephemeral_connection(&mut raw, "{p}:election").await;
            kill(&mut raw, id).await;
            // At once, before anything reported the loss.
            let answer = leadership.proclaim("late").await;
            assert!(matches!(answer, Ok(false)), "round {round}: {answer:?}");
            assert!(closed(leadership.lost_reason()), "round {round}");
        }
    }
}

// Rows "fenced" and "leadership fenced": once the close is seen, nothing is sent and the
// answer is NotHeld with the close as its reason. (A call racing the close, made before the
// library saw it, is sent on the dead connection and answers Connection: the library cannot
// tell whether the server read it. The Python library looks at the socket first.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_command_after_the_ephemeral_connection_closed_is_not_held() {
    for (_server, client, mut raw) in both().await {
        let guard = client.lock("{e}:lock").ephemeral().acquire().await.unwrap();
        let id = ephemeral_connection(&mut raw, "{e}:lock").await;
        kill(&mut raw, id).await;
        let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("the close is seen");
        assert!(closed(Some(reason)));
        let answer = guard.fenced::<String>(&set("{e}:v", "late")).await;
        assert!(
            matches!(answer, Err(LockError::NotHeld { lost }) if closed(lost)),
            "{answer:?}"
        );
        let leadership = client.election("{l}:election").campaign().await.unwrap();
        let id = ephemeral_connection(&mut raw, "{l}:election").await;
        kill(&mut raw, id).await;
        let reason = tokio::time::timeout(Duration::from_secs(5), leadership.lost())
            .await
            .expect("the close is seen");
        assert!(closed(Some(reason)));
        let answer = leadership.fenced::<String>(&set("{l}:v", "late")).await;
        assert!(
            matches!(answer, Err(LockError::NotHeld { lost }) if closed(lost)),
            "{answer:?}"
        );
        let v: Option<String> = redis::cmd("GET")
            .arg("{e}:v")
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(v, None);
    }
}

// -- One test per row of the README's table, in its order ------------------------------------

/// A client with a short command timeout (no answer comes fast) and no lost-hold signal (what
/// the server answers alone tells).
async fn short_client(server: &Server) -> LockClient {
    LockClient::builder(redis::Client::open(server.url()).unwrap())
        .command_timeout(Duration::from_millis(300))
        .without_lost_signal()
        .build()
        .await
        .unwrap()
}

/// The server SIGSTOPped until this is dropped: the kernel accepts what is sent, nothing is
/// answered.
struct Stopped<'a>(&'a Server);

impl<'a> Stopped<'a> {
    fn new(server: &'a Server) -> Stopped<'a> {
        server.signal(Signal::Stop);
        Stopped(server)
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        self.0.signal(Signal::Cont);
    }
}

async fn force_release(raw: &mut MultiplexedConnection, key: &str) {
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg(key)
        .query_async(raw)
        .await
        .unwrap();
}

// Row "acquire": a guard; Timeout, Server, NotSafelyAcquired, Connection, InvalidArgument
// (NoPermission: acl.rs, `the_old_documented_line_is_refused_by_name_at_open`; a lost-hold
// channel refused: acl.rs, `a_refused_lost_signal_channel_fails_the_acquire_at_once_naming_the_rule`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_acquire() {
    let server = Server::start();
    let client = short_client(&server).await;
    let mut raw = raw(&server).await;
    let mut guard = client.lock("{a}:k").acquire().await.unwrap();
    let waited = client
        .lock("{a}:k")
        .wait_timeout(Duration::from_millis(200))
        .acquire()
        .await;
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    let _: () = redis::cmd("SET")
        .arg("{a}:s")
        .arg("x")
        .query_async(&mut raw)
        .await
        .unwrap();
    let wrong = client.lock("{a}:s").acquire().await;
    assert!(
        matches!(&wrong, Err(LockError::Server(t)) if t.starts_with("WRONGTYPE")),
        "{wrong:?}"
    );
    let unsafe_grant = client
        .lock("{a}:r")
        .replicas(1, Duration::from_millis(100))
        .acquire()
        .await;
    assert!(
        matches!(unsafe_grant, Err(LockError::NotSafelyAcquired { .. })),
        "{unsafe_grant:?}"
    );
    let zero = client.lock("{a}:z").lease(Duration::ZERO).acquire().await;
    assert!(
        matches!(zero, Err(LockError::InvalidArgument(_))),
        "{zero:?}"
    );
    guard.release().await.unwrap();
    let stopped = Stopped::new(&server);
    let unanswered = client.lock("{a}:other").acquire().await;
    drop(stopped);
    assert!(
        matches!(unanswered, Err(LockError::Connection(_))),
        "{unanswered:?}"
    );
}

// Row "try_acquire": a guard, or None while busy; acquire's errors but Timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_try_acquire() {
    let server = Server::start();
    let client = short_client(&server).await;
    let mut guard = client.lock("{t}:k").try_acquire().await.unwrap().unwrap();
    assert!(client.lock("{t}:k").try_acquire().await.unwrap().is_none());
    guard.release().await.unwrap();
    let stopped = Stopped::new(&server);
    let unanswered = client.lock("{t}:other").try_acquire().await;
    drop(stopped);
    assert!(
        matches!(unanswered, Err(LockError::Connection(_))),
        "{unanswered:?}"
    );
}

// Row "release": Released, StillHeld, AlreadyReleased; NotHeld with the reason after a loss,
// NotHeld { lost: None } when the server no longer had it; Connection with no answer
// (NoPermission: acl.rs `a_refused_check_is_a_permission_error_naming_lock_check_not_a_loss`;
// EPHEMERAL: locks.rs `ephemeral_hold_is_lost_when_its_connection_is_killed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_release() {
    let server = Server::start();
    let client = short_client(&server).await;
    let mut raw = raw(&server).await;
    let lock = client.lock("{r}:k");
    let mut first = lock.acquire().await.unwrap();
    let mut second = lock.acquire().await.unwrap();
    assert_eq!(second.release().await.unwrap(), Release::StillHeld);
    assert_eq!(first.release().await.unwrap(), Release::Released);
    assert_eq!(first.release().await.unwrap(), Release::AlreadyReleased);
    let mut guard = lock.acquire().await.unwrap();
    force_release(&mut raw, "{r}:k").await;
    let unknown = guard.release().await;
    assert!(
        matches!(unknown, Err(LockError::NotHeld { lost: None })),
        "{unknown:?}"
    );
    let mut guard = lock.acquire().await.unwrap();
    force_release(&mut raw, "{r}:k").await;
    let fenced = guard.fenced::<Value>(redis::cmd("GET").arg("{r}:v")).await;
    assert!(
        matches!(fenced, Err(LockError::Fenced { .. })),
        "{fenced:?}"
    );
    let lost = guard.release().await;
    assert!(
        matches!(
            lost,
            Err(LockError::NotHeld {
                lost: Some(LostReason::HoldGone)
            })
        ),
        "{lost:?}"
    );
    let mut guard = lock.acquire().await.unwrap();
    let stopped = Stopped::new(&server);
    let unanswered = guard.release().await;
    drop(stopped);
    assert!(
        matches!(unanswered, Err(LockError::Connection(_))),
        "{unanswered:?}"
    );
}

// Row "renewal": nothing to call; a renewal answered 0 reports the hold lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_renewal() {
    let (_server, client, mut raw) = setup_without_signal().await;
    let guard = client
        .lock("{n}:k")
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    force_release(&mut raw, "{n}:k").await;
    let reason = tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("the next renewal, 0.2 s on");
    assert_eq!(reason, LostReason::HoldGone);
}

// Row "fenced": the reply; Fenced, NotHeld, Server, Connection (NoPermission: fenced.rs
// `a_user_who_may_not_run_the_command_gets_noperm_and_keeps_the_hold`; EPHEMERAL: above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_fenced() {
    let server = Server::start();
    let client = short_client(&server).await;
    let mut raw = raw(&server).await;
    let mut guard = client.lock("{f}:k").acquire().await.unwrap();
    let ok: String = guard.fenced(&set("{f}:v", "1")).await.unwrap();
    assert_eq!(ok, "OK");
    let own = guard
        .fenced::<Value>(redis::cmd("LPUSH").arg("{f}:v").arg("x"))
        .await;
    assert!(
        matches!(&own, Err(LockError::Server(t)) if t.starts_with("WRONGTYPE")),
        "{own:?}"
    );
    assert_eq!(guard.lost_reason(), None);
    let stopped = Stopped::new(&server);
    let unanswered = guard.fenced::<Value>(&set("{f}:v", "2")).await;
    drop(stopped);
    assert!(
        matches!(unanswered, Err(LockError::Connection(_))),
        "{unanswered:?}"
    );
    force_release(&mut raw, "{f}:k").await;
    let fenced = guard.fenced::<Value>(&set("{f}:v", "3")).await;
    assert!(
        matches!(
            fenced,
            Err(LockError::Fenced {
                lost: LostReason::HoldGone
            })
        ),
        "{fenced:?}"
    );
    let after = guard.fenced::<Value>(&set("{f}:v", "4")).await;
    assert!(matches!(after, Err(LockError::NotHeld { .. })), "{after:?}");
    let _ = guard.release().await;
}

// Row "lost / lost_reason": never an error, before or after a loss or a release (the loss
// here: the next renewal, 0.2 s on, answered 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_lost() {
    let (_server, client, mut raw) = setup_without_signal().await;
    let mut guard = client
        .lock("{o}:k")
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    assert_eq!(guard.lost_reason(), None);
    force_release(&mut raw, "{o}:k").await;
    let reason = tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .unwrap();
    assert_eq!(reason, LostReason::HoldGone);
    assert!(guard.release().await.is_err());
    assert_eq!(guard.lost_reason(), Some(LostReason::HoldGone));
}

// Row "multi-key": InvalidArgument before anything is sent; release answers NotHeld when a
// key was lost and frees the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_multi_key() {
    let (server, client, mut raw) = setup_without_signal().await;
    let many: Vec<String> = (0..65).map(|i| format!("{{m}}:{i}")).collect();
    for keys in [vec![], vec!["{m}:a".to_string(), "{m}:a".to_string()], many] {
        let refused = client.multi_lock(&keys).acquire().await;
        assert!(
            matches!(refused, Err(LockError::InvalidArgument(_))),
            "{keys:?}: {refused:?}"
        );
    }
    let mut guard = client
        .multi_lock(["{m}:a", "{m}:b"])
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    let foreign = guard
        .fenced::<Value>("{m}:c", redis::cmd("GET").arg("{m}:x"))
        .await;
    assert!(
        matches!(foreign, Err(LockError::InvalidArgument(_))),
        "{foreign:?}"
    );
    force_release(&mut raw, "{m}:a").await;
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .unwrap();
    let released = guard.release().await;
    assert!(
        matches!(released, Err(LockError::NotHeld { .. })),
        "{released:?}"
    );
    let info: Value = redis::cmd("LOCK.INFO")
        .arg("{m}:b")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(info, Value::Nil);
    drop(server);
}

// Row "semaphore": a limit outside 1 to 1,000, or other than the holders', is the server's
// refusal (Server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_semaphore() {
    let (_server, client, _raw) = setup().await;
    for limit in [0, 1001] {
        let refused = client.semaphore("{s}:x", limit).acquire().await;
        assert!(
            matches!(refused, Err(LockError::Server(_))),
            "{limit}: {refused:?}"
        );
    }
    let mut guard = client.semaphore("{s}:k", 2).acquire().await.unwrap();
    let other = client.semaphore("{s}:k", 3).acquire().await;
    assert!(
        matches!(&other, Err(LockError::Server(t)) if t.contains("LIMIT 2")),
        "{other:?}"
    );
    guard.release().await.unwrap();
}

// Row "campaign": a Leadership; Timeout, and acquire's errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_campaign() {
    let server = Server::start();
    let client = short_client(&server).await;
    let mut leadership = client.election("{c}:e").campaign().await.unwrap();
    let waited = client
        .election("{c}:e")
        .wait_timeout(Duration::from_millis(200))
        .campaign()
        .await;
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    assert!(client
        .election("{c}:e")
        .try_campaign()
        .await
        .unwrap()
        .is_none());
    leadership.resign().await.unwrap();
    let stopped = Stopped::new(&server);
    let unanswered = client
        .election("{c}:other")
        .not_ephemeral()
        .try_campaign()
        .await;
    drop(stopped);
    assert!(
        matches!(unanswered, Err(LockError::Connection(_))),
        "{unanswered:?}"
    );
}

// Row "proclaim": true; false once over; Server for a value too long; Connection with no
// answer (EPHEMERAL closed: false, above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_proclaim() {
    let server = Server::start();
    let client = short_client(&server).await;
    let mut leadership = client
        .election("{p}:e")
        .not_ephemeral()
        .campaign()
        .await
        .unwrap();
    assert!(matches!(leadership.proclaim("v").await, Ok(true)));
    let long = leadership.proclaim(vec![b'x'; 5000]).await;
    assert!(
        matches!(&long, Err(LockError::Server(t)) if t.contains("4096")),
        "{long:?}"
    );
    let stopped = Stopped::new(&server);
    let unanswered = leadership.proclaim("w").await;
    drop(stopped);
    assert!(
        matches!(unanswered, Err(LockError::Connection(_))),
        "{unanswered:?}"
    );
    leadership.resign().await.unwrap();
    assert!(matches!(leadership.proclaim("v").await, Ok(false)));
}

// Row "resign": as release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_resign() {
    // Lost by the next renewal (0.2 s on), not by the lost-hold signal: a message published
    // before the hold's subscription is in place (a loaded machine) would be missed, and the
    // test would wait for the renewal of a 30 s lease.
    let (_server, client, mut raw) = setup_without_signal().await;
    let election = client.election("{g}:e").lease(Duration::from_millis(600));
    let mut leadership = election.campaign().await.unwrap();
    assert_eq!(leadership.resign().await.unwrap(), Release::Released);
    assert_eq!(leadership.resign().await.unwrap(), Release::AlreadyReleased);
    let mut leadership = election.campaign().await.unwrap();
    force_release(&mut raw, "{g}:e").await;
    tokio::time::timeout(Duration::from_secs(3), leadership.lost())
        .await
        .expect("the next renewal, 0.2 s on");
    let lost = leadership.resign().await;
    assert!(matches!(lost, Err(LockError::NotHeld { .. })), "{lost:?}");
}

// Row "leadership fenced": as a guard's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_leadership_fenced() {
    let (_server, client, mut raw) = setup_without_signal().await;
    let leadership = client.election("{h}:e").campaign().await.unwrap();
    let ok: String = leadership.fenced(&set("{h}:v", "1")).await.unwrap();
    assert_eq!(ok, "OK");
    force_release(&mut raw, "{h}:e").await;
    let fenced = leadership.fenced::<Value>(&set("{h}:v", "2")).await;
    assert!(
        matches!(fenced, Err(LockError::Fenced { .. })),
        "{fenced:?}"
    );
    assert_eq!(leadership.lost_reason(), Some(LostReason::HoldGone));
}

// Row "leader": Some(Leader) or None; Connection with no answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_leader() {
    let server = Server::start();
    let client = short_client(&server).await;
    let election = client.election("{d}:e");
    assert!(election.leader().await.unwrap().is_none());
    let mut leadership = election.campaign_with_value("v").await.unwrap();
    let found = election.leader().await.unwrap().expect("a leader");
    assert_eq!(found.epoch, leadership.epoch());
    let stopped = Stopped::new(&server);
    let unanswered = election.leader().await;
    drop(stopped);
    assert!(
        matches!(unanswered, Err(LockError::Connection(_))),
        "{unanswered:?}"
    );
    leadership.resign().await.unwrap();
}

// Row "observe": no error; a killed connection is connected again (in depth: election.rs,
// `an_observer_whose_connection_was_killed_reads_the_leader_again`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_observe() {
    let (_server, client, mut raw) = setup().await;
    let election = client.election("{b}:e");
    let mut observer = election.observe();
    let leadership = election.campaign().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), observer.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.epoch, leadership.epoch());
    let _: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "pubsub"])
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(leadership.proclaim("after").await.unwrap());
    let seen = tokio::time::timeout(Duration::from_secs(5), observer.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.epoch, leadership.epoch());
    assert_eq!(seen.value.as_deref(), Some(&b"after"[..]));
}
