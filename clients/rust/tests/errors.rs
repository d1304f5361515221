//! What the public calls answer, and when, against a real redis-server with the module
//! loaded: here, the calls on an `EPHEMERAL` hold whose connection closed.

mod support;

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::Value;
use redis_lock_client::{LockClient, LockError, LostReason};
use support::{setup, setup_without_signal, Server};

/// The id of the connection an `EPHEMERAL` hold on `key` is bound to (`LOCK.INFO`'s `ephemeral`).
async fn ephemeral_connection(raw: &mut MultiplexedConnection, key: &str) -> i64 {
    let info: Value = redis::cmd("LOCK.INFO")
        .arg(key)
        .query_async(raw)
        .await
        .unwrap();
    let Value::Array(fields) = info else {
        panic!("held: {info:?}")
    };
    fields
        .chunks(2)
        .find_map(|p| match p {
            [Value::BulkString(n), Value::Int(id)] if n == b"ephemeral" => Some(*id),
            _ => None,
        })
        .expect("bound to a connection")
}

async fn kill(raw: &mut MultiplexedConnection, id: i64) {
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query_async(raw)
        .await
        .unwrap();
    assert_eq!(killed, 1);
}

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
