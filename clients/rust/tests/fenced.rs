//! Fenced commands: a guard runs a command through its fence (`LOCK.GUARD key owner token
//! <cmd...>`), which the server runs only while the hold is its own under that token. A `FENCED`
//! refusal reports the hold lost with its reason and answers `LockError::Fenced`; nothing ran.
//! Against a real redis-server with the module loaded (one per test).

mod support;

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Value;
use redis_lock_client::{LockClient, LockError, LostReason, Release};
use support::{calls, ephemeral_connection, setup_without_signal, Server};

async fn get(raw: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET").arg(key).query_async(raw).await.unwrap()
}

/// `LOCK.FORCERELEASE key`: every hold of the key ends.
async fn force_release(raw: &mut MultiplexedConnection, key: &str) {
    let n: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg(key)
        .query_async(raw)
        .await
        .unwrap();
    assert_eq!(n, 1);
}

fn set(key: &str, value: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(key).arg(value);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_command_runs_while_held_and_answers_its_own_reply() {
    let (_server, client, mut raw) = setup_without_signal().await;
    let mut guard = client.lock("{o}:lock").acquire().await.unwrap();
    let fields: i64 = guard
        .fenced(redis::cmd("HSET").arg("{o}:data").arg("status").arg("paid"))
        .await
        .unwrap();
    assert_eq!(fields, 1);
    let ok: String = guard.fenced(&set("{o}:v", "1")).await.unwrap();
    assert_eq!(ok, "OK");
    assert_eq!(get(&mut raw, "{o}:v").await.as_deref(), Some("1"));
    // The raw reply, and a read.
    let reply: Value = guard
        .fenced(redis::cmd("HGET").arg("{o}:data").arg("status"))
        .await
        .unwrap();
    assert_eq!(reply, Value::BulkString(b"paid".to_vec()));
    assert_eq!(calls(&mut raw, "lock.guard").await, 3);
    // A reply that is not the type asked for is the library's error; the hold is untouched.
    let wrong: Result<i64, _> = guard.fenced(redis::cmd("GET").arg("{o}:missing")).await;
    assert!(
        matches!(wrong, Err(LockError::UnexpectedReply(_))),
        "{wrong:?}"
    );
    assert_eq!(guard.lost_reason(), None);
    assert_eq!(guard.release().await.unwrap(), Release::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_command_keeps_the_callers_protocol() {
    let server = Server::start();
    let client = LockClient::open(&format!("{}?protocol=resp3", server.url()))
        .await
        .unwrap();
    let guard = client.lock("{p}:lock").acquire().await.unwrap();
    let _: i64 = guard
        .fenced(redis::cmd("HSET").arg("{p}:h").arg("f").arg("v"))
        .await
        .unwrap();
    let all: Value = guard
        .fenced(redis::cmd("HGETALL").arg("{p}:h"))
        .await
        .unwrap();
    assert!(matches!(all, Value::Map(_)), "{all:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_command_of_a_hold_that_is_gone_does_not_run_and_reports_the_loss() {
    // Without the signal: the guard has not heard of the force-release; the fence tells it.
    let (_server, client, mut raw) = setup_without_signal().await;
    let lock = client.lock("{g}:lock").lease(Duration::from_secs(30));
    let mut stale = lock.acquire().await.unwrap();
    assert!(stale.fenced::<String>(&set("{g}:v", "first")).await.is_ok());
    force_release(&mut raw, "{g}:lock").await;
    // Another owner takes the key and writes.
    let newer = client.lock("{g}:lock").acquire().await.unwrap();
    let _: String = newer.fenced(&set("{g}:v", "newer")).await.unwrap();
    let lost = stale.lost();

    let refused = stale.fenced::<String>(&set("{g}:v", "stale")).await;
    assert!(
        matches!(
            refused,
            Err(LockError::Fenced {
                lost: LostReason::HoldGone
            })
        ),
        "{refused:?}"
    );
    assert_eq!(get(&mut raw, "{g}:v").await.as_deref(), Some("newer"));
    assert_eq!(stale.lost_reason(), Some(LostReason::HoldGone));
    let reason = tokio::time::timeout(Duration::from_secs(1), lost)
        .await
        .expect("lost() resolves");
    assert_eq!(reason, LostReason::HoldGone);

    // Known lost: the next one is refused here, nothing sent.
    let guards = calls(&mut raw, "lock.guard").await;
    let again = stale.fenced::<String>(&set("{g}:v", "stale")).await;
    assert!(
        matches!(
            again,
            Err(LockError::NotHeld {
                lost: Some(LostReason::HoldGone)
            })
        ),
        "{again:?}"
    );
    assert_eq!(calls(&mut raw, "lock.guard").await, guards);
    assert!(matches!(
        stale.release().await,
        Err(LockError::NotHeld { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_command_with_a_token_that_is_not_current_does_not_run() {
    let (_server, client, mut raw) = setup_without_signal().await;
    let guard = client.lock("{t}:lock").acquire().await.unwrap();
    // The hold ends and its owner holds the key again, under a newer token.
    force_release(&mut raw, "{t}:lock").await;
    let newer: u64 = redis::cmd("LOCK.ACQUIRE")
        .arg("{t}:lock")
        .arg(guard.owner())
        .arg(30_000)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(newer > guard.token());
    let refused = guard.fenced::<String>(&set("{t}:v", "stale")).await;
    assert!(
        matches!(
            refused,
            Err(LockError::Fenced {
                lost: LostReason::TokenNotCurrent
            })
        ),
        "{refused:?}"
    );
    assert_eq!(get(&mut raw, "{t}:v").await, None);
    assert_eq!(guard.lost_reason(), Some(LostReason::TokenNotCurrent));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_guard_sends_nothing() {
    let (_server, client, mut raw) = setup_without_signal().await;
    let lock = client.lock("{r}:lock");
    let mut guard = lock.acquire().await.unwrap();
    // A re-entry: one guard released while the other holds.
    let mut other = lock.acquire().await.unwrap();
    assert_eq!(other.release().await.unwrap(), Release::StillHeld);
    let refused = other.fenced::<String>(&set("{r}:v", "x")).await;
    assert!(
        matches!(refused, Err(LockError::NotHeld { lost: None })),
        "{refused:?}"
    );
    assert!(guard.fenced::<String>(&set("{r}:v", "y")).await.is_ok());
    assert_eq!(guard.release().await.unwrap(), Release::Released);
    let refused = guard.fenced::<String>(&set("{r}:v", "z")).await;
    assert!(
        matches!(refused, Err(LockError::NotHeld { lost: None })),
        "{refused:?}"
    );
    assert_eq!(calls(&mut raw, "lock.guard").await, 1);
    assert_eq!(get(&mut raw, "{r}:v").await.as_deref(), Some("y"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commands_own_errors_and_the_fences_refusals_leave_the_hold_alone() {
    let (_server, client, mut raw) = setup_without_signal().await;
    let _: () = redis::cmd("SET")
        .arg("{e}:text")
        .arg("abc")
        .query_async(&mut raw)
        .await
        .unwrap();
    let guard = client.lock("{e}:lock").acquire().await.unwrap();
    let cases: [(redis::Cmd, &str); 4] = [
        (
            redis::cmd("INCR").arg("{e}:text").clone(),
            "ERR value is not an integer",
        ),
        (
            set("{e}:lock", "x"),
            "ERR LOCK.GUARD never runs a command on the lock's own key",
        ),
        (
            redis::cmd("PING").clone(),
            "ERR LOCK.GUARD runs only commands that name keys",
        ),
        (
            redis::cmd("LOCK.INFO").arg("{e}:other").clone(),
            "ERR LOCK.GUARD does not run LOCK.* commands",
        ),
    ];
    for (cmd, want) in cases {
        match guard.fenced::<Value>(&cmd).await {
            Err(LockError::Server(text)) => assert!(text.starts_with(want), "{text}"),
            other => panic!("{want}: {other:?}"),
        }
        assert_eq!(guard.lost_reason(), None, "{want}");
    }
    assert!(guard.fenced::<String>(&set("{e}:v", "1")).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_hold_reads_through_its_fence_and_a_permit_writes() {
    let (_server, client, mut raw) = setup_without_signal().await;
    let _: () = redis::cmd("SET")
        .arg("{s}:v")
        .arg("1")
        .query_async(&mut raw)
        .await
        .unwrap();
    let reader = client.read_lock("{s}:lock").acquire().await.unwrap();
    let other = client.read_lock("{s}:lock").acquire().await.unwrap();
    let read: String = reader.fenced(redis::cmd("GET").arg("{s}:v")).await.unwrap();
    assert_eq!(read, "1");
    assert_eq!(
        other
            .fenced::<String>(redis::cmd("GET").arg("{s}:v"))
            .await
            .unwrap(),
        "1"
    );
    match reader.fenced::<Value>(&set("{s}:v", "2")).await {
        Err(LockError::Server(text)) => {
            assert!(
                text.starts_with("ERR a SHARED hold runs only read-only commands"),
                "{text}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(reader.lost_reason(), None);
    assert_eq!(get(&mut raw, "{s}:v").await.as_deref(), Some("1"));

    let permit = client.semaphore("{s}:sem", 2).acquire().await.unwrap();
    let n: i64 = permit
        .fenced(redis::cmd("INCR").arg("{s}:count"))
        .await
        .unwrap();
    assert_eq!(n, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_key_guard_fences_each_key_with_its_own_token() {
    let (_server, client, mut raw) = setup_without_signal().await;
    let guard = client
        .multi_lock(["{m}:1", "{m}:2"])
        .acquire()
        .await
        .unwrap();
    let a: i64 = guard
        .fenced("{m}:1", redis::cmd("INCRBY").arg("{m}:a").arg(5))
        .await
        .unwrap();
    let b: i64 = guard
        .fenced("{m}:2", redis::cmd("DECRBY").arg("{m}:b").arg(5))
        .await
        .unwrap();
    assert_eq!((a, b), (5, -5));
    let unknown = guard
        .fenced::<i64>("{m}:3", redis::cmd("INCR").arg("{m}:a"))
        .await;
    assert!(
        matches!(unknown, Err(LockError::InvalidArgument(_))),
        "{unknown:?}"
    );
    // One key's hold ends: its fence refuses, and the whole hold is lost.
    force_release(&mut raw, "{m}:2").await;
    let refused = guard
        .fenced::<i64>("{m}:2", redis::cmd("INCR").arg("{m}:b"))
        .await;
    assert!(
        matches!(
            refused,
            Err(LockError::Fenced {
                lost: LostReason::HoldGone
            })
        ),
        "{refused:?}"
    );
    assert_eq!(guard.lost_reason(), Some(LostReason::HoldGone));
    let after = guard
        .fenced::<i64>("{m}:1", redis::cmd("INCR").arg("{m}:a"))
        .await;
    assert!(matches!(after, Err(LockError::NotHeld { .. })), "{after:?}");
    assert_eq!(get(&mut raw, "{m}:a").await.as_deref(), Some("5"));
    assert_eq!(get(&mut raw, "{m}:b").await.as_deref(), Some("-5"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leadership_fences_with_its_epoch() {
    let (_server, client, mut raw) = setup_without_signal().await;
    let leadership = client
        .election("{l}:leader")
        .not_ephemeral()
        .campaign()
        .await
        .unwrap();
    let n: i64 = leadership
        .fenced(redis::cmd("RPUSH").arg("{l}:log").arg(leadership.epoch()))
        .await
        .unwrap();
    assert_eq!(n, 1);
    force_release(&mut raw, "{l}:leader").await;
    let refused = leadership
        .fenced::<i64>(redis::cmd("RPUSH").arg("{l}:log").arg("deposed"))
        .await;
    assert!(
        matches!(
            refused,
            Err(LockError::Fenced {
                lost: LostReason::HoldGone
            })
        ),
        "{refused:?}"
    );
    assert_eq!(leadership.lost_reason(), Some(LostReason::HoldGone));
    let len: i64 = redis::cmd("LLEN")
        .arg("{l}:log")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(len, 1);
}

#[test]
fn the_blocking_guards_fence_too() {
    let server = Server::start();
    let client = redis_lock_client::blocking::LockClient::from_builder(
        LockClient::builder(redis::Client::open(server.url()).unwrap()).without_lost_signal(),
    )
    .unwrap();
    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let guard = client.lock("{b}:lock").acquire().unwrap();
    let n: i64 = guard.fenced(redis::cmd("INCR").arg("{b}:n")).unwrap();
    assert_eq!(n, 1);
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("{b}:lock")
        .query(&mut raw)
        .unwrap();
    let refused = guard.fenced::<i64>(redis::cmd("INCR").arg("{b}:n"));
    assert!(
        matches!(
            refused,
            Err(LockError::Fenced {
                lost: LostReason::HoldGone
            })
        ),
        "{refused:?}"
    );
    assert_eq!(guard.lost_reason(), Some(LostReason::HoldGone));

    let multi = client.multi_lock(["{b}:1", "{b}:2"]).acquire().unwrap();
    let n: i64 = multi
        .fenced("{b}:2", redis::cmd("INCR").arg("{b}:n"))
        .unwrap();
    assert_eq!(n, 2);
    let leadership = client.election("{b}:leader").campaign().unwrap();
    let n: i64 = leadership.fenced(redis::cmd("INCR").arg("{b}:n")).unwrap();
    assert_eq!(n, 3);
    let mut released = client.lock("{b}:other").acquire().unwrap();
    released.release().unwrap();
    assert!(matches!(
        released.fenced::<i64>(redis::cmd("INCR").arg("{b}:n")),
        Err(LockError::NotHeld { lost: None })
    ));
    let value: String = redis::cmd("GET").arg("{b}:n").query(&mut raw).unwrap();
    assert_eq!(value, "3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ephemeral_hold_fences_on_its_own_connection() {
    let (_server, client, mut raw) = setup_without_signal().await;
    let guard = client.lock("{x}:lock").ephemeral().acquire().await.unwrap();
    let _: String = guard.fenced(&set("{x}:v", "1")).await.unwrap();
    let id = ephemeral_connection(&mut raw, "{x}:lock").await;
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("ID")
        .arg(id)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(list.contains("cmd=lock.guard"), "{list}");
    // Its connection closed: the hold is gone with it, and nothing more is sent.
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query_async(&mut raw)
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("the close is seen");
    assert_eq!(reason, LostReason::ConnectionClosed);
    let refused = guard.fenced::<String>(&set("{x}:v", "2")).await;
    assert!(
        matches!(
            refused,
            Err(LockError::NotHeld {
                lost: Some(LostReason::ConnectionClosed)
            })
        ),
        "{refused:?}"
    );
    assert_eq!(get(&mut raw, "{x}:v").await.as_deref(), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_may_not_run_the_command_gets_noperm_and_keeps_the_hold() {
    let server = Server::start();
    let mut raw = support::raw(&server).await;
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("app")
        .arg("on")
        .arg(">secret")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-set")
        .query_async(&mut raw)
        .await
        .unwrap();
    let url = format!("redis://app:secret@127.0.0.1:{}/", server.port);
    let client = LockClient::builder(redis::Client::open(url).unwrap())
        .without_lost_signal()
        .build()
        .await
        .unwrap();
    let guard = client.lock("{n}:lock").acquire().await.unwrap();
    match guard.fenced::<Value>(&set("{n}:v", "1")).await {
        // The fenced command's own refusal, named after it on every server (Redis 7.0's
        // module words it, later servers and Valkey pass theirs on): the hold is not affected.
        Err(LockError::NoPermission {
            command, message, ..
        }) => {
            assert_eq!(command, "SET", "{message}");
            assert!(message.starts_with("NOPERM"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(guard.lost_reason(), None);
    assert_eq!(get(&mut raw, "{n}:v").await, None);
    let n: i64 = guard.fenced(redis::cmd("INCR").arg("{n}:c")).await.unwrap();
    assert_eq!(n, 1);
}
