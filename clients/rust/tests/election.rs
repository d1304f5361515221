//! Leader election through the client (`LOCK.CAMPAIGN`, `LOCK.PROCLAIM`, `LOCK.LEADER`, the
//! leader channel), against a real redis-server with the module loaded (one per test); leaders
//! killed and paused are processes of their own (the `leader` example).

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::Value;
use redis_lock_client::{blocking, Leader, LockError, LostReason, Release};
use support::{calls, setup, wait_subscribers, Server};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// `INFO lock`'s `lock_waiters`: clients waiting in the server's queues.
async fn waiting_clients(raw: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("lock")
        .query_async(raw)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("lock_waiters:"))
        .map(|n| n.trim().parse().expect("lock_waiters"))
        .unwrap_or(0)
}

fn leader(candidate: &str, epoch: u64, value: Option<&str>) -> Leader {
    Leader {
        candidate: candidate.as_bytes().to_vec(),
        epoch,
        value: value.map(|v| v.as_bytes().to_vec()),
    }
}

async fn next_leader(observer: &mut redis_lock_client::Observer) -> Leader {
    tokio::time::timeout(Duration::from_secs(5), observer.next())
        .await
        .expect("a leader within 5 s")
        .expect("the observer runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaign_leads_with_a_rising_epoch_and_leader_reads_it() {
    let (_server, client, mut raw) = setup().await;
    let election = client.election("svc");
    assert_eq!(election.leader().await.unwrap(), None, "nobody leads");
    let first = election.campaign().await.unwrap();
    assert_eq!(
        election.leader().await.unwrap(),
        Some(leader(election.candidate(), first.epoch(), None)),
        "no value until one is proclaimed"
    );
    // Campaigning again while leading: the same leadership, and the value proclaimed.
    let again = election.campaign_with_value("10.0.0.1:80").await.unwrap();
    assert_eq!(again.epoch(), first.epoch());
    assert_eq!(
        election.leader().await.unwrap(),
        Some(leader(
            election.candidate(),
            first.epoch(),
            Some("10.0.0.1:80")
        ))
    );
    // Another candidate does not lead; a timeout passes.
    let other = client.election("svc");
    assert!(other.try_campaign().await.unwrap().is_none());
    let err = other
        .clone()
        .wait_timeout(Duration::from_millis(200))
        .campaign()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    // EPHEMERAL by default: bound to the leadership's own connection.
    let info: Vec<Value> = redis::cmd("LOCK.INFO")
        .arg("svc")
        .query_async(&mut raw)
        .await
        .unwrap();
    let bound = info.chunks(2).find_map(|pair| match pair {
        [Value::BulkString(name), value] if name == b"ephemeral" => Some(value.clone()),
        _ => None,
    });
    assert!(
        matches!(bound, Some(Value::Int(_))),
        "bound to a connection: {bound:?}"
    );
    let first_epoch = first.epoch();
    drop((first, again)); // resigns
    let mut next = tokio::time::timeout(Duration::from_secs(5), other.campaign())
        .await
        .expect("elected once the leader resigned")
        .unwrap();
    assert!(next.epoch() > first_epoch);
    assert_eq!(election_epoch(&mut raw, "svc").await, next.epoch());
    assert_eq!(next.resign().await.unwrap(), Release::Released);
    assert_eq!(calls(&mut raw, "lock.campaign").await, 5);
}

async fn election_epoch(raw: &mut MultiplexedConnection, key: &str) -> u64 {
    let reply: Value = redis::cmd("LOCK.LEADER")
        .arg(key)
        .query_async(raw)
        .await
        .unwrap();
    match reply {
        Value::Array(items) => match items.get(1) {
            Some(Value::Int(e)) => u64::try_from(*e).unwrap(),
            _ => 0,
        },
        _ => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proclaim_publishes_while_leading_and_is_false_once_deposed() {
    // Without the signal: only the server's refusal tells.
    let (_server, client, mut raw) = support::setup_without_signal().await;
    let election = client.election("svc");
    let leadership = election.campaign().await.unwrap();
    assert!(leadership.proclaim("v1").await.unwrap());
    assert_eq!(
        election.leader().await.unwrap().and_then(|l| l.value),
        Some(b"v1".to_vec())
    );
    // Deposed behind its back; the lease is 30 s, so only the server's refusal tells.
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("svc")
        .query_async(&mut raw)
        .await
        .unwrap();
    let usurper = client.election("svc").campaign().await.unwrap();
    assert!(!leadership.proclaim("v2").await.unwrap());
    assert_eq!(leadership.lost_reason(), Some(LostReason::HoldGone));
    assert_eq!(
        election.leader().await.unwrap(),
        Some(leader(usurper.candidate(), usurper.epoch(), None)),
        "the deposed leader's value was not published"
    );
    // Told by its loss, it sends nothing more.
    let sent = calls(&mut raw, "lock.proclaim").await;
    assert!(!leadership.proclaim("v3").await.unwrap());
    assert_eq!(calls(&mut raw, "lock.proclaim").await, sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resign_elects_the_waiting_candidate_at_once() {
    let (_server, client, _raw) = setup().await;
    let mut first = client.election("svc").campaign().await.unwrap();
    let second = client.election("svc");
    let waiting = tokio::spawn(async move { second.campaign().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "waits in the server");
    assert_eq!(first.resign().await.unwrap(), Release::Released);
    let next = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("elected on the resignation")
        .unwrap()
        .unwrap();
    assert!(next.epoch() > first.epoch());
    assert_eq!(first.lost_reason(), None, "a resignation is not a loss");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_yields_the_leader_then_each_change_in_order() {
    let (_server, client, mut raw) = setup().await;
    let z = client.election("svc");
    let zl = z.campaign_with_value("z").await.unwrap();
    let mut observer = client.election("svc").observe();
    // The current leader first (read after subscribing).
    assert_eq!(
        next_leader(&mut observer).await,
        leader(z.candidate(), zl.epoch(), Some("z"))
    );
    wait_subscribers(&mut raw, "lock.leader:{svc}", 1).await;
    let a = client.election("svc");
    let a_name = a.candidate().to_string();
    let a_task = tokio::spawn(async move { a.campaign_with_value("a").await });
    assert!(zl.proclaim("z2").await.unwrap());
    assert!(zl.proclaim("z2").await.unwrap()); // the same value: not yielded again
    assert_eq!(
        next_leader(&mut observer).await,
        leader(z.candidate(), zl.epoch(), Some("z2"))
    );
    drop(zl); // resigns: a is elected, with its value
    let al = a_task.await.unwrap().unwrap();
    assert!(al.epoch() > 0);
    // Elected with its value at the grant: the read after the messages finds both.
    assert_eq!(
        next_leader(&mut observer).await,
        leader(&a_name, al.epoch(), Some("a"))
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), observer.next())
            .await
            .is_err(),
        "nothing else happened"
    );
    // Dropping the observer closes its subscription.
    drop(observer);
    wait_subscribers(&mut raw, "lock.leader:{svc}", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_whose_connection_was_killed_reads_the_leader_again() {
    let (_server, client, mut raw) = setup().await;
    let mut observer = client.election("svc").observe();
    wait_subscribers(&mut raw, "lock.leader:{svc}", 1).await;
    let reads = calls(&mut raw, "lock.leader").await;
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut raw)
        .await
        .unwrap();
    // Elected while the observer was away (or just back).
    let a = client.election("svc");
    let al = a.campaign_with_value("a").await.unwrap();
    let mut seen = next_leader(&mut observer).await;
    if seen.value.is_none() {
        seen = next_leader(&mut observer).await;
    }
    assert_eq!(seen, leader(a.candidate(), al.epoch(), Some("a")));
    wait_subscribers(&mut raw, "lock.leader:{svc}", 1).await;
    assert!(
        calls(&mut raw, "lock.leader").await > reads,
        "LOCK.LEADER read again after the reconnection"
    );
}

/// The `leader` example, built by `cargo test` beside the test binaries' deps/ folder.
fn leader_example() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let example = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("examples/leader"))
        .unwrap();
    assert!(
        example.exists(),
        "{example:?} missing: run through cargo test"
    );
    example
}

struct LeaderProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl LeaderProcess {
    async fn start(server: &Server, key: &str, lease_ms: u64) -> (LeaderProcess, u64) {
        let mut child = Command::new(leader_example())
            .arg(key)
            .arg(lease_ms.to_string())
            .env("REDIS_URL", server.url())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut process = LeaderProcess {
            child,
            stdin,
            stdout,
        };
        let line = process.line().await;
        let epoch = line
            .strip_prefix("leading ")
            .and_then(|e| e.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        (process, epoch)
    }

    async fn line(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(10), self.stdout.next_line())
            .await
            .expect("the leader process answers")
            .unwrap()
            .expect("a line")
    }

    async fn ask(&mut self, line: &str) -> String {
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        self.line().await
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.id().unwrap().to_string();
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid)
            .status()
            .unwrap();
        assert!(status.success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_process_is_replaced_at_once() {
    let (server, client, mut raw) = setup().await;
    let (mut process, old_epoch) = LeaderProcess::start(&server, "svc", 30_000).await;
    let candidate = client.election("svc");
    let waiting = tokio::spawn(async move {
        let leadership = candidate.campaign().await;
        (leadership, Instant::now())
    });
    // The candidate waits in the server's queue (the `lock_waiters` gauge: Valkey counts a
    // blocked command's call only once it is answered).
    let deadline = Instant::now() + Duration::from_secs(5);
    while waiting_clients(&mut raw).await < 1 {
        assert!(Instant::now() < deadline, "the candidate never campaigned");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished());
    let killed = Instant::now();
    process.signal("KILL");
    let (leadership, elected) = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the candidate leads")
        .unwrap();
    let leadership = leadership.unwrap();
    let took = elected - killed;
    println!(
        "leader process SIGKILLed -> the waiting candidate leads after {:.2} ms (lease 30 s)",
        took.as_secs_f64() * 1000.0
    );
    assert!(leadership.epoch() > old_epoch);
    // EPHEMERAL: the connection's close ended the hold, not the 30 s lease.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let _ = process.child.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_past_its_lease_is_told_on_resume_and_fenced_out() {
    let (server, client, _raw) = setup().await;
    let lease = Duration::from_millis(600);
    let (mut process, old_epoch) =
        LeaderProcess::start(&server, "svc", u64::try_from(lease.as_millis()).unwrap()).await;
    assert_eq!(process.ask("write").await, "write 1");
    process.signal("STOP");
    // Past its lease (its watchdog is paused with it), the waiting candidate leads.
    let next = tokio::time::timeout(
        Duration::from_secs(10),
        client.election("svc").lease(lease).campaign(),
    )
    .await
    .expect("elected once the paused leader's lease ended")
    .unwrap();
    assert!(next.epoch() > old_epoch);
    // The new leader writes: the resource has seen its epoch.
    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("fence")
        .arg(next.epoch())
        .query_async(&mut raw)
        .await
        .unwrap();
    process.signal("CONT");
    // Its first act on resume: the proclamation is refused and it knows it is deposed.
    let answer = process.ask("proclaim stale").await;
    println!("the paused leader on resume: {answer}");
    assert!(answer.starts_with("proclaimed false lost "), "{answer}");
    assert!(!answer.ends_with("lost none"), "{answer}");
    assert_eq!(
        process.ask("write").await,
        "write 0",
        "the old epoch is refused"
    );
    assert_eq!(
        client.election("svc").leader().await.unwrap(),
        Some(leader(next.candidate(), next.epoch(), None)),
        "the stale value was never published"
    );
    drop(process.stdin);
}

#[test]
fn the_blocking_election_campaigns_observes_and_resigns() {
    let server = Server::start();
    let client = blocking::LockClient::open(&server.url()).unwrap();
    let election = client.election("svc");
    let mut observer = election.observe().unwrap();
    let mut leadership = election.campaign_with_value("a").unwrap();
    assert!(leadership.proclaim("b").unwrap());
    let mut seen = Vec::new();
    while seen.last().and_then(|l: &Leader| l.value.clone()) != Some(b"b".to_vec()) {
        seen.push(
            observer
                .next_timeout(Duration::from_secs(5))
                .expect("a leader within 5 s"),
        );
    }
    assert!(seen.iter().all(|l| l.epoch == leadership.epoch()));
    assert_eq!(
        election.leader().unwrap(),
        Some(leader(election.candidate(), leadership.epoch(), Some("b")))
    );
    assert_eq!(leadership.resign().unwrap(), Release::Released);
    assert_eq!(election.leader().unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_not_ephemeral_leadership_outlives_its_connection_and_is_renewed() {
    let (_server, client, mut raw) = setup().await;
    let election = client
        .election("svc")
        .not_ephemeral()
        .lease(Duration::from_millis(300));
    let leadership = election.campaign().await.unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("SKIPME")
        .arg("yes")
        .arg("TYPE")
        .arg("normal")
        .query_async(&mut raw)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await; // four leases
    assert_eq!(leadership.lost_reason(), None);
    assert_eq!(
        election.leader().await.unwrap(),
        Some(leader(election.candidate(), leadership.epoch(), None)),
        "still leading: renewed by the watchdog on a new shared connection"
    );
    assert!(calls(&mut raw, "lock.renew").await >= 3);
}

/// Everything `observer` yields within `quiet` of the last thing it yielded.
async fn drain(observer: &mut redis_lock_client::Observer, quiet: Duration) -> Vec<Leader> {
    let mut seen = Vec::new();
    while let Ok(Some(l)) = tokio::time::timeout(quiet, observer.next()).await {
        seen.push(l);
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_of_one_name_in_two_databases_and_of_k_and_braced_k_each_see_their_own() {
    // `svc` in db 0, `svc` in db 1 and `{svc}` in db 0 share the channel lock.leader:{svc}
    // (and one slot's epoch counter): each observer yields only its own election's leaders.
    let server = Server::start();
    let mut raw = support::raw(&server).await;
    let db0 = redis_lock_client::LockClient::open(&server.url())
        .await
        .unwrap();
    let db1 = redis_lock_client::LockClient::open(&format!("{}1", server.url()))
        .await
        .unwrap();
    let elections = [
        db0.election("svc"),
        db1.election("svc"),
        db0.election("{svc}"),
    ];
    let mut observers: Vec<_> = elections.iter().map(|e| e.observe()).collect();
    wait_subscribers(&mut raw, "lock.leader:{svc}", 3).await;
    let mut leaderships = Vec::new();
    for (election, value) in elections.iter().zip(["db0", "db1", "braced"]) {
        leaderships.push(election.campaign_with_value(value).await.unwrap());
    }
    // The first leader proclaims again after the others were elected with higher epochs.
    assert!(leaderships[0].proclaim("db0 again").await.unwrap());
    // Each elected with its value: the read after the messages finds both.
    let want: [&[Option<&str>]; 3] = [
        &[Some("db0"), Some("db0 again")],
        &[Some("db1")],
        &[Some("braced")],
    ];
    for ((observer, leadership), values) in observers.iter_mut().zip(&leaderships).zip(want) {
        let seen = drain(observer, Duration::from_millis(500)).await;
        let expected: Vec<Leader> = values
            .iter()
            .map(|v| leader(leadership.candidate(), leadership.epoch(), *v))
            .collect();
        // Reads after a burst of messages may skip a state in between: what is yielded is the
        // expected sequence, or part of it, in order, and it ends at the last state.
        let mut rest = expected.iter();
        assert!(
            seen.iter().all(|l| rest.any(|e| e == l)) && seen.last() == expected.last(),
            "{}: {seen:?}",
            leadership.candidate()
        );
    }
    assert!(leaderships[0].epoch() < leaderships[1].epoch());
}

/// A message is a hint, never evidence: leader messages with a huge epoch, published by a user
/// who may do nothing but publish on the leader channel, make the observer read `LOCK.LEADER`,
/// which names the real leader: the observer never follows a leader the server did not elect,
/// and every real leader after them is followed (after a reconnection too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_leader_messages_never_make_an_observer_follow_a_leader_the_server_did_not_elect() {
    let (server, client, mut raw) = setup().await;
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "forger",
            "on",
            ">pw",
            "resetkeys",
            "resetchannels",
        ])
        .arg("&lock.leader:{svc}")
        .arg("+publish")
        .query_async(&mut raw)
        .await
        .unwrap();
    let mut forger = redis::Client::open(format!("redis://forger:pw@127.0.0.1:{}/", server.port))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut observer = client.election("svc").observe();
    wait_subscribers(&mut raw, "lock.leader:{svc}", 1).await;
    let a = client.election("svc");
    let al = a.campaign_with_value("10.0.0.1:80").await.unwrap();
    let mut seen = drain(&mut observer, Duration::from_millis(300)).await;
    assert_eq!(
        seen.last(),
        Some(&leader(a.candidate(), al.epoch(), Some("10.0.0.1:80")))
    );
    let fake = 9_000_000_000_000_000u64;
    for message in [
        format!("elected 0 {fake} 3 svc evil-node"),
        format!("proclaimed 0 {fake} 3 svc 6.6.6.6:66"),
    ] {
        let _: i64 = redis::cmd("PUBLISH")
            .arg("lock.leader:{svc}")
            .arg(message)
            .query_async(&mut forger)
            .await
            .unwrap();
    }
    let forged = drain(&mut observer, Duration::from_millis(300)).await;
    assert!(
        forged.iter().all(|l| l.epoch != fake),
        "followed a forged leader: {forged:?}"
    );
    seen.extend(forged);
    // A real leader after the forgery is followed, with its value.
    drop(al); // resigns
    let b = client.election("svc");
    let bl = b.campaign_with_value("10.0.0.2:80").await.unwrap();
    assert!(bl.epoch() < fake);
    let followed = drain(&mut observer, Duration::from_millis(300)).await;
    assert_eq!(
        followed.last(),
        Some(&leader(b.candidate(), bl.epoch(), Some("10.0.0.2:80"))),
        "{followed:?}"
    );
    seen.extend(followed);
    // Its connection killed, the observer reads LOCK.LEADER again, and follows b's next value.
    let _: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "pubsub"])
        .query_async(&mut raw)
        .await
        .unwrap();
    wait_subscribers(&mut raw, "lock.leader:{svc}", 1).await;
    assert!(bl.proclaim("10.0.0.3:80").await.unwrap());
    let after = drain(&mut observer, Duration::from_millis(300)).await;
    assert_eq!(
        after.last(),
        Some(&leader(b.candidate(), bl.epoch(), Some("10.0.0.3:80"))),
        "{after:?}"
    );
    seen.extend(after);
    for l in &seen {
        assert!(
            (l.candidate_str() == a.candidate() || l.candidate_str() == b.candidate())
                && l.epoch < fake,
            "yielded a leader the server never elected: {l}"
        );
    }
}
