//! The oracle: a guard's belief against the server's truth, on seeded random histories.
//!
//! Many holders take and leave holds at random (`examples/oracle_holder.rs`: acquire,
//! try_acquire, waits longer than the lease, an acquire given up on mid-wait, re-entry through
//! the same handle, release, a guard dropped without a release): tasks on a multi-thread and on
//! a current-thread runtime, threads with the blocking API, and child processes. Meanwhile a
//! chaos task disrupts them: `LOCK.FORCERELEASE`, `DEL`, `CLIENT KILL` of a library connection,
//! `COPY` of a lock and `DEL` of the copy (the same database and another), `FLUSHDB`, `SIGKILL`
//! and `SIGSTOP` (past the lease) of a holder process, in a cluster a slot migration, and forged
//! messages that end nothing (a lost message naming a live hold exactly, leader messages naming
//! a candidate the server never elected, with a huge epoch or the next one). Two candidates
//! campaign on an election key in turn while an observer follows it.
//!
//! Every hold writes through its fence (`RPUSH {key}:writes <token>`; a shared hold reads), and
//! the checker records every guard's belief over time and the server's truth: a poller on its
//! own connection checks every believed hold every few milliseconds with a script that runs
//! `LOCK.CHECK` and, when the hold is gone, appends `end:<token>` to the key's writes in the
//! same step; a hold reported lost is checked at once the same way. It reports:
//! - **false lost**: a guard reported lost while the server still held its (owner, token):
//!   must be 0;
//! - **false held**: a guard believing held while the server no longer held it, as a duration,
//!   per cause (the disruption that ended it), each case printed; bounded generously by the
//!   lost-hold signal where the server sends it, by the watchdog's period where it cannot (Redis
//!   7.0 without key events, a message lost while the pub/sub connection was down), and from
//!   the resume for a paused process;
//! - **stale writes landed**: a write of a token after its `end:` marker: must be 0; on an
//!   exclusive key the tokens written only rise; on a semaphore no more holds write at once
//!   than its permits; and every write the library answered is there, once;
//! - **unelected**: a leader the observer yielded that the server never elected (neither a
//!   campaigner's epoch nor one `LOCK.CHECK` found holding when it was yielded): must be 0.
//!
//! `ORACLE_SEEDS` (a count, or a comma-separated list) and `ORACLE_SECS` (per seed) run it
//! longer: `make oracle-rust SEEDS=20 SECS=60`.

mod support;

#[allow(unused_imports)]
#[path = "../examples/oracle_holder.rs"]
mod holder;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use holder::{now_us, Event, KeyKind, KeySpec, Mode, Note, Plan, Sink};
use lock_testkit::Cluster;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::Value;
use redis_lock_client::{LockClient, LockError};
use support::Server;
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Every hold's lease: long enough for a loaded machine, short enough for many to end in a run.
const LEASE: Duration = Duration::from_millis(2_000);

/// How often the poller checks every believed hold.
const POLL: Duration = Duration::from_millis(10);

/// The bound on a false held where the lost-hold signal tells (or the hold's own connection
/// closes): a hang catcher, at least 5x the longest case measured on the debug build here (339
/// ms of 407 signalled cases, p99 129 ms, median 0-1 ms; two busy cores). The signal's own
/// check is `SIGNAL_MEDIAN_MS` below; its precise latency is `tests/measure.rs`'s.
const SIGNAL_BOUND_MS: u64 = 2_000;

/// Where only the watchdog can tell: its period (a third of the lease), plus slack: at least 5x
/// the longest such case measured here (666 ms of about 540: 3,666 ms).
const WATCHDOG_BOUND_MS: u64 = LEASE.as_millis() as u64 / 3 + 3_000;

/// A paused process reports its losses once it runs again: within this much after the resume.
const RESUME_BOUND_MS: u64 = 1_500;

/// Checks a hold and, if the server no longer has it, marks its end in the key's writes, in one
/// step: a write of that token after the marker is a stale write that landed.
const CHECK: &str = r#"
if redis.call('LOCK.CHECK', KEYS[1], ARGV[1], ARGV[2]) == 1 then return 1 end
redis.call('RPUSH', KEYS[2], 'end:' .. ARGV[2])
return 0
"#;

// ---------------------------------------------------------------------------------------------
// Configuration

struct Config {
    seeds: Vec<u64>,
    secs: u64,
}

/// `ORACLE_SEEDS` (a count from `first`, or `a,b,c`) and `ORACLE_SECS`, else the defaults.
fn config(first: u64, seeds: u64, secs: u64) -> Config {
    let seeds = match std::env::var("ORACLE_SEEDS") {
        Ok(v) if v.contains(',') => v.split(',').map(|s| s.trim().parse().unwrap()).collect(),
        Ok(v) if !v.trim().is_empty() => {
            (first..first + v.trim().parse::<u64>().unwrap()).collect()
        }
        _ => (first..first + seeds).collect(),
    };
    let secs = std::env::var("ORACLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(secs);
    Config { seeds, secs }
}

// ---------------------------------------------------------------------------------------------
// The servers

enum Target {
    Single(Server),
    Cluster(Cluster),
}

impl Target {
    /// What a holder connects to (`oracle_holder`'s URL argument).
    fn spec(&self) -> String {
        match self {
            Target::Single(server) => server.url(),
            Target::Cluster(cluster) => format!("cluster:{}", cluster.urls().join(",")),
        }
    }

    fn nodes(&self) -> Vec<&Server> {
        match self {
            Target::Single(server) => vec![server],
            Target::Cluster(cluster) => cluster.nodes.iter().collect(),
        }
    }

    fn is_cluster(&self) -> bool {
        matches!(self, Target::Cluster(_))
    }

    async fn raw(&self) -> Raw {
        match self {
            Target::Single(server) => Raw::Single(support::raw(server).await),
            Target::Cluster(cluster) => Raw::Cluster(
                redis::cluster::ClusterClient::new(cluster.urls())
                    .unwrap()
                    .get_async_connection()
                    .await
                    .unwrap(),
            ),
        }
    }
}

/// The checker's own connection (unnamed: never one the chaos kills).
#[derive(Clone)]
enum Raw {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Raw {
    async fn query(&self, cmd: &redis::Cmd) -> redis::RedisResult<Value> {
        match self.clone() {
            Raw::Single(mut c) => cmd.query_async(&mut c).await,
            Raw::Cluster(mut c) => cmd.query_async(&mut c).await,
        }
    }

    /// `CHECK` of one hold: `Some(true)` held, `Some(false)` gone (marked), `None` no answer.
    async fn check(&self, key: &str, owner: &str, token: u64) -> Option<bool> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(CHECK)
            .arg(2)
            .arg(key)
            .arg(holder::writes_key(key))
            .arg(owner)
            .arg(token);
        match self.query(&cmd).await {
            Ok(Value::Int(1)) => Some(true),
            Ok(Value::Int(0)) => Some(false),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// What the checker records

/// How a belief ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    Released,
    Dropped,
    Lost(String),
    /// Its process was killed.
    Killed,
    /// Still believed held when the run ended.
    Unfinished,
}

/// One hold (owner, token): what its guard believed and what the server said.
#[derive(Debug, Clone)]
struct HoldRecord {
    key: String,
    mode: Mode,
    holder: String,
    granted: u64,
    /// When its acquire began: the server granted it between `asked` and `granted`.
    asked: u64,
    /// When the application stopped believing it held, and why.
    end: Option<(u64, End)>,
    /// The send time of the last check that found it held (or the grant).
    last_held: u64,
    /// The reply time of the first check that found it gone.
    gone: Option<u64>,
    ok_writes: u32,
    unknown_writes: u32,
    /// Set when a loss report found the server still holding it.
    false_lost: Option<String>,
}

/// The client id of an owner (`<client id>:<n>`).
fn client_of(owner: &str) -> String {
    owner.rsplit_once(':').map_or(owner, |(c, _)| c).to_string()
}

#[derive(Debug, Clone)]
enum Disrupt {
    ForceRelease(String),
    Del(String),
    /// `pubsub`: the connection was the client's lost-hold listener (messages are missed until
    /// it has subscribed again).
    ClientKill {
        client: String,
        pubsub: bool,
    },
    CopyDel {
        key: String,
        other_db: bool,
    },
    FlushDb,
    SigKill {
        client: String,
    },
    SigStop {
        client: String,
        pid: u32,
        resumed: Option<u64>,
    },
    /// The key's slot moved from the master on port `from` to the one on `to`.
    Migrate {
        key: String,
        from: u16,
        to: u16,
    },
    /// Messages that end nothing, as anyone allowed to publish on the channels can send them:
    /// a lost message naming each live hold of `key` exactly (`holds` of them), and leader
    /// messages of the election naming a candidate the server never elected. (Its fields are
    /// for the `ORACLE_VERBOSE` listing.)
    #[allow(dead_code)]
    Forge {
        key: String,
        holds: usize,
    },
}

impl Disrupt {
    fn kind(&self) -> &'static str {
        match self {
            Disrupt::ForceRelease(_) => "FORCERELEASE",
            Disrupt::Del(_) => "DEL",
            Disrupt::ClientKill { .. } => "CLIENT KILL",
            Disrupt::CopyDel {
                other_db: false, ..
            } => "COPY+DEL (same db)",
            Disrupt::CopyDel { other_db: true, .. } => "COPY+DEL (other db)",
            Disrupt::FlushDb => "FLUSHDB",
            Disrupt::SigKill { .. } => "SIGKILL",
            Disrupt::SigStop { .. } => "SIGSTOP",
            Disrupt::Migrate { .. } => "slot migration",
            Disrupt::Forge { .. } => "forged messages",
        }
    }
}

#[derive(Debug, Clone)]
struct Disruption {
    what: Disrupt,
    start: u64,
    end: u64,
}

#[derive(Default)]
struct State {
    holds: HashMap<(String, u64), HoldRecord>,
    disruptions: Vec<Disruption>,
    /// Each holder client's description, by client id.
    clients: HashMap<String, String>,
    no_guard: BTreeMap<String, u64>,
    writes: BTreeMap<String, u64>,
    /// The writes lists read before each flush, per key, in order.
    flushed_writes: HashMap<String, Vec<String>>,
    checks: u64,
    /// The clients whose process was killed, and when.
    killed: HashMap<String, u64>,
    /// What a disruption could not do that it must (a slot move's BUSYKEY).
    failures: Vec<String>,
    /// The leaders the server elected (candidate, epoch): the campaigners' own, and those a
    /// `LOCK.CHECK` found holding when the observer yielded them.
    elected: std::collections::HashSet<(Vec<u8>, u64)>,
    /// What the election's observer yielded, and whether the server held it then.
    observed: Vec<redis_lock_client::Leader>,
}

type Shared = Arc<Mutex<State>>;

fn lock(state: &Shared) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the holders and the process manager send the checker.
enum Msg {
    Event {
        holder: String,
        event: Event,
    },
    /// Every hold of this client ended with its process.
    Killed {
        client: String,
        at: u64,
    },
}

/// A sink for in-process holders.
fn sink(tx: &mpsc::UnboundedSender<Msg>, holder: &str) -> Sink {
    let (tx, holder) = (tx.clone(), holder.to_string());
    Arc::new(move |event: Event| {
        let _ = tx.send(Msg::Event {
            holder: holder.clone(),
            event,
        });
    })
}

/// Takes the holders' events; a loss report is checked against the server at once.
async fn checker(state: Shared, raw: Raw, mut rx: mpsc::UnboundedReceiver<Msg>) {
    while let Some(msg) = rx.recv().await {
        let (holder, event) = match msg {
            Msg::Killed { client, at } => {
                let mut st = lock(&state);
                st.killed.insert(client.clone(), at);
                for ((owner, _), hold) in st.holds.iter_mut() {
                    if hold.end.is_none() && client_of(owner) == client {
                        hold.end = Some((at, End::Killed));
                    }
                }
                continue;
            }
            Msg::Event { holder, event } => (holder, event),
        };
        let t = event.t_us;
        match event.note {
            Note::Client { id, .. } => {
                lock(&state).clients.insert(id, holder);
            }
            Note::Granted {
                key,
                owner,
                token,
                mode,
                asked,
            } => {
                let mut st = lock(&state);
                // A line its process wrote before it was killed.
                let end = st
                    .killed
                    .get(&client_of(&owner))
                    .map(|at| (*at, End::Killed));
                if let Some(again) = st.holds.get_mut(&(owner.clone(), token)) {
                    // The same hold handed out again (a re-acquire through its handle, ONCE,
                    // after a loss report the server did not share): one record, believed again.
                    again.end = end;
                    again.gone = None;
                    continue;
                }
                st.holds.insert(
                    (owner, token),
                    HoldRecord {
                        key,
                        mode,
                        holder,
                        granted: t,
                        asked,
                        end,
                        last_held: t,
                        gone: None,
                        ok_writes: 0,
                        unknown_writes: 0,
                        false_lost: None,
                    },
                );
            }
            Note::Wrote {
                owner,
                token,
                outcome,
            } => {
                let mut st = lock(&state);
                *st.writes.entry(outcome.clone()).or_default() += 1;
                if let Some(hold) = st.holds.get_mut(&(owner, token)) {
                    match outcome.as_str() {
                        "ok" if hold.mode != Mode::Read => hold.ok_writes += 1,
                        "conn" | "err" if hold.mode != Mode::Read => hold.unknown_writes += 1,
                        _ => {}
                    }
                }
            }
            Note::Lost {
                owner,
                token,
                reason,
            } => {
                let key = {
                    let mut st = lock(&state);
                    let Some(hold) = st.holds.get_mut(&(owner.clone(), token)) else {
                        continue;
                    };
                    if hold.end.is_none() {
                        hold.end = Some((t, End::Lost(reason.clone())));
                    }
                    hold.key.clone()
                };
                // At once, on the checker's own connection: does the server still hold it?
                let (state, raw) = (state.clone(), raw.clone());
                tokio::spawn(async move {
                    let sent = now_us();
                    let held = raw.check(&key, &owner, token).await;
                    let replied = now_us();
                    let mut st = lock(&state);
                    st.checks += 1;
                    if let Some(hold) = st.holds.get_mut(&(owner.clone(), token)) {
                        match held {
                            Some(true) => {
                                hold.last_held = hold.last_held.max(sent);
                                hold.false_lost = Some(format!(
                                    "{owner} token {token} on {key}: reported {reason}, the server still holds it"
                                ));
                            }
                            Some(false) => {
                                hold.gone.get_or_insert(replied);
                            }
                            None => {}
                        }
                    }
                });
            }
            Note::Ended { owner, token, how } => {
                let mut st = lock(&state);
                if let Some(hold) = st.holds.get_mut(&(owner, token)) {
                    if hold.end.is_none() {
                        let how = if how == "released" {
                            End::Released
                        } else {
                            End::Dropped
                        };
                        hold.end = Some((t, how));
                    }
                }
            }
            Note::NoGuard { outcome, .. } => {
                *lock(&state).no_guard.entry(outcome).or_default() += 1;
            }
        }
    }
}

/// Checks every believed hold every `POLL`, until `stop`.
async fn poller(state: Shared, raw: Raw, stop: Arc<std::sync::atomic::AtomicBool>) {
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        let believed: Vec<(String, u64, String)> = lock(&state)
            .holds
            .iter()
            .filter(|(_, h)| h.end.is_none() && h.gone.is_none())
            .map(|((o, t), h)| (o.clone(), *t, h.key.clone()))
            .collect();
        let sent = now_us();
        let answers: Vec<Option<bool>> = match &raw {
            Raw::Single(conn) if !believed.is_empty() => {
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                for (owner, token, key) in &believed {
                    pipe.cmd("EVAL")
                        .arg(CHECK)
                        .arg(2)
                        .arg(key)
                        .arg(holder::writes_key(key))
                        .arg(owner)
                        .arg(token);
                }
                match pipe.query_async::<Vec<Value>>(&mut conn.clone()).await {
                    Ok(replies) => replies
                        .iter()
                        .map(|v| match v {
                            Value::Int(1) => Some(true),
                            Value::Int(0) => Some(false),
                            _ => None,
                        })
                        .collect(),
                    Err(_) => vec![None; believed.len()],
                }
            }
            _ => {
                let mut answers = Vec::new();
                for (owner, token, key) in &believed {
                    answers.push(raw.check(key, owner, *token).await);
                }
                answers
            }
        };
        let replied = now_us();
        {
            let mut st = lock(&state);
            st.checks += answers.len() as u64;
            for ((owner, token, _), answer) in believed.into_iter().zip(answers) {
                let Some(hold) = st.holds.get_mut(&(owner, token)) else {
                    continue;
                };
                match answer {
                    Some(true) => hold.last_held = hold.last_held.max(sent),
                    Some(false) => {
                        hold.gone.get_or_insert(replied);
                    }
                    None => {}
                }
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Holder processes

struct Child {
    process: tokio::process::Child,
    pid: u32,
    /// Its client id, once it said it.
    client: Arc<Mutex<Option<String>>>,
    stopped: bool,
}

struct Procs {
    children: Vec<Child>,
    next_seed: u64,
    target: String,
    keys: Vec<KeySpec>,
    until: Instant,
    /// `None` once the run is over.
    tx: Option<mpsc::UnboundedSender<Msg>>,
    exe: std::path::PathBuf,
    ephemeral: f64,
}

impl Procs {
    fn spawn(&mut self) {
        let Some(tx) = self.tx.clone() else { return };
        let secs = self
            .until
            .saturating_duration_since(Instant::now())
            .as_secs()
            .max(1);
        let seed = self.next_seed;
        self.next_seed += 1;
        let mut process = tokio::process::Command::new(&self.exe)
            .arg(seed.to_string())
            .arg(LEASE.as_millis().to_string())
            .arg(secs.to_string())
            .arg(&self.target)
            .args(self.keys.iter().map(KeySpec::text))
            .env("ORACLE_EPHEMERAL", self.ephemeral.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect(
                "the oracle_holder example (built by cargo test; add --examples to a filtered run)",
            );
        let pid = process.id().unwrap_or(0);
        let client = Arc::new(Mutex::new(None));
        let stdout = process.stdout.take().expect("piped");
        let known = client.clone();
        let name = format!("process {pid} (seed {seed})");
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Some(event) = Event::parse(&line) else {
                    continue;
                };
                if let Note::Client { id, .. } = &event.note {
                    *known.lock().unwrap() = Some(id.clone());
                }
                let _ = tx.send(Msg::Event {
                    holder: name.clone(),
                    event,
                });
            }
        });
        self.children.push(Child {
            process,
            pid,
            client,
            stopped: false,
        });
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .arg(sig)
        .arg(pid.to_string())
        .status();
}

// ---------------------------------------------------------------------------------------------
// Chaos

struct Chaos {
    rng: StdRng,
    raw: Raw,
    keys: Vec<KeySpec>,
    state: Shared,
    procs: Arc<tokio::sync::Mutex<Procs>>,
    cluster: bool,
    /// A connection to db 1 (standalone), for the other database's copy.
    db1: Option<redis::aio::MultiplexedConnection>,
    nodes: Vec<(String, u16)>,
    /// The election key the campaigners and the observer use.
    election: String,
}

/// `LOCK.INFO`'s holders as (owner, token) (RESP2 or RESP3).
fn holders_of(info: &Value) -> Vec<(String, u64)> {
    let pairs = |v: &Value| -> Vec<(Value, Value)> {
        match v {
            Value::Array(items) => items
                .chunks(2)
                .filter_map(|p| match p {
                    [k, v] => Some((k.clone(), v.clone())),
                    _ => None,
                })
                .collect(),
            Value::Map(items) => items.clone(),
            _ => Vec::new(),
        }
    };
    let field = |v: &Value, name: &str| {
        pairs(v)
            .into_iter()
            .find(|(k, _)| matches!(k, Value::BulkString(b) if b == name.as_bytes()))
            .map(|(_, v)| v)
    };
    let Some(Value::Array(list)) = field(info, "holders") else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|h| match (field(h, "owner"), field(h, "token")) {
            (Some(Value::BulkString(o)), Some(Value::Int(t))) => {
                Some((String::from_utf8_lossy(&o).into_owned(), t as u64))
            }
            _ => None,
        })
        .collect()
}

/// Two candidates campaign on `key` in turn (not bound to a connection, so that a campaign
/// whose reply a killed connection lost is found again by the next one, ONCE) until `until`,
/// each recording the epochs it was elected with.
async fn campaigner(client: LockClient, key: String, state: Shared, until: Instant, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let election = client
        .election(&key)
        .not_ephemeral()
        .lease(LEASE)
        .wait_timeout(LEASE);
    while Instant::now() < until {
        let value = format!("v{}", rng.gen_range(0..1_000));
        match election.campaign_with_value(&value).await {
            Ok(mut leadership) => {
                lock(&state).elected.insert((
                    leadership.candidate().as_bytes().to_vec(),
                    leadership.epoch(),
                ));
                tokio::time::sleep(Duration::from_millis(rng.gen_range(20..300))).await;
                if rng.gen_bool(0.5) {
                    let _ = leadership.proclaim(format!("{value}+")).await;
                    tokio::time::sleep(Duration::from_millis(rng.gen_range(20..200))).await;
                }
                let _ = leadership.resign().await;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Follows the election: every leader it yields is recorded, and checked at once
/// (`LOCK.CHECK`): one the server holds is elected for sure.
async fn observe(client: LockClient, key: String, state: Shared, raw: Raw) {
    let mut observer = client.election(&key).observe();
    while let Some(leader) = observer.next().await {
        let mut check = redis::cmd("LOCK.CHECK");
        check.arg(&key).arg(&leader.candidate).arg(leader.epoch);
        let held = matches!(raw.query(&check).await, Ok(Value::Int(1)));
        let mut st = lock(&state);
        if held {
            st.elected.insert((leader.candidate.clone(), leader.epoch));
        }
        st.observed.push(leader);
    }
}

impl Chaos {
    fn record(&self, what: Disrupt, start: u64) -> usize {
        let mut st = lock(&self.state);
        st.disruptions.push(Disruption {
            what,
            start,
            end: now_us(),
        });
        st.disruptions.len() - 1
    }

    fn key(&mut self) -> String {
        self.keys[self.rng.gen_range(0..self.keys.len())]
            .name
            .clone()
    }

    async fn one(&mut self, target: &Target) {
        // 95 and up: forged messages.
        let roll = self.rng.gen_range(0..108);
        let start = now_us();
        match roll {
            0..=17 => {
                let key = self.key();
                let _ = self
                    .raw
                    .query(redis::cmd("LOCK.FORCERELEASE").arg(&key))
                    .await;
                self.record(Disrupt::ForceRelease(key), start);
            }
            18..=31 => {
                let key = self.key();
                let _ = self.raw.query(redis::cmd("DEL").arg(&key)).await;
                self.record(Disrupt::Del(key), start);
            }
            32..=47 => self.client_kill(target).await,
            48..=57 => {
                // A copy that shares the key's channel (`k` and `{k}`), then its removal.
                let key = self.key();
                let copy = format!("{{{key}}}");
                let _ = self
                    .raw
                    .query(redis::cmd("COPY").arg(&key).arg(&copy).arg("REPLACE"))
                    .await;
                tokio::time::sleep(Duration::from_millis(self.rng.gen_range(0..50))).await;
                let _ = self.raw.query(redis::cmd("DEL").arg(&copy)).await;
                self.record(
                    Disrupt::CopyDel {
                        key,
                        other_db: false,
                    },
                    start,
                );
            }
            58..=64 if self.db1.is_some() => {
                let key = self.key();
                // `SELECT 0` in the same transaction: Valkey 8.1 leaves the connection that ran
                // `COPY ... DB 1` on database 1 (docs/guarantees.md), and this connection is
                // shared with the poller and the checker.
                if let Raw::Single(conn) = &self.raw {
                    let _: redis::RedisResult<Value> = redis::pipe()
                        .atomic()
                        .cmd("COPY")
                        .arg(&key)
                        .arg(&key)
                        .arg("DB")
                        .arg(1)
                        .arg("REPLACE")
                        .cmd("SELECT")
                        .arg(0)
                        .query_async(&mut conn.clone())
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(self.rng.gen_range(0..50))).await;
                if let Some(db1) = &mut self.db1 {
                    let _: redis::RedisResult<i64> =
                        redis::cmd("DEL").arg(&key).query_async(db1).await;
                }
                self.record(
                    Disrupt::CopyDel {
                        key,
                        other_db: true,
                    },
                    start,
                );
            }
            65..=70 if !self.cluster => self.flush().await,
            58..=70 => self.migrate(target).await,
            71..=82 => self.kill_process().await,
            83..=94 => self.stop_process().await,
            _ => self.forge().await,
        }
    }

    /// Publishes a lost message naming each live hold of a key (what `LOCK.INFO` shows:
    /// database, key, owner, token), and leader messages of the election naming a candidate
    /// the server never elected, with a huge epoch or the next one. Nothing may believe them.
    async fn forge(&mut self) {
        let start = now_us();
        let key = self.key();
        let publish = if self.cluster { "SPUBLISH" } else { "PUBLISH" };
        let holds = match self.raw.query(redis::cmd("LOCK.INFO").arg(&key)).await {
            Ok(info) => holders_of(&info),
            Err(_) => Vec::new(),
        };
        let reasons = [
            "forcereleased",
            "disconnected",
            "expired",
            "deleted",
            "overwritten",
            "evicted",
        ];
        let reason = reasons[self.rng.gen_range(0..reasons.len())];
        let channel = redis_lock_client::lost_signal_channel(key.as_bytes());
        for (owner, token) in &holds {
            let message = format!("{reason} 0 {token} {} {key} {owner}", key.len());
            let _ = self
                .raw
                .query(redis::cmd(publish).arg(&channel).arg(message))
                .await;
        }
        let election = &self.election;
        let leader = match self
            .raw
            .query(redis::cmd("LOCK.LEADER").arg(election))
            .await
        {
            Ok(Value::Array(items)) => match items.get(1) {
                Some(Value::Int(epoch)) => *epoch as u64,
                _ => 0,
            },
            _ => 0,
        };
        let epoch = if self.rng.gen_bool(0.5) {
            9_000_000_000_000_000_000
        } else {
            leader + 1
        };
        let channel = redis_lock_client::leader_channel(election.as_bytes());
        let n = election.len();
        for message in [
            format!("elected 0 {epoch} {n} {election} forged-node"),
            format!("proclaimed 0 {epoch} {n} {election} 6.6.6.6:66"),
        ] {
            let _ = self
                .raw
                .query(redis::cmd(publish).arg(&channel).arg(message))
                .await;
        }
        let holds = holds.len();
        self.record(Disrupt::Forge { key, holds }, start);
    }

    async fn client_kill(&mut self, target: &Target) {
        let start = now_us();
        let mut candidates = Vec::new();
        for node in target.nodes() {
            let Ok(mut conn) = redis::Client::open(node.url())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
            else {
                continue;
            };
            let list: String = redis::cmd("CLIENT")
                .arg("LIST")
                .query_async(&mut conn)
                .await
                .unwrap_or_default();
            for line in list.lines() {
                let field = |name: &str| {
                    line.split(' ')
                        .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
                        .map(str::to_string)
                };
                if let (Some(id), Some(name)) = (field("id"), field("name")) {
                    if let Some(client) = name.strip_prefix("redis-lock-client:") {
                        let subscribed = ["sub", "psub", "ssub"]
                            .iter()
                            .any(|f| field(f).is_some_and(|n| n != "0"));
                        candidates.push((node.url(), id, client.to_string(), subscribed));
                    }
                }
            }
        }
        if candidates.is_empty() {
            return;
        }
        let (url, id, client, pubsub) =
            candidates.swap_remove(self.rng.gen_range(0..candidates.len()));
        if let Ok(mut conn) = redis::Client::open(url)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
        {
            let _: redis::RedisResult<Value> = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("ID")
                .arg(&id)
                .query_async(&mut conn)
                .await;
        }
        self.record(Disrupt::ClientKill { client, pubsub }, start);
    }

    /// `FLUSHDB`, with every writes list read in the same transaction (nothing written between
    /// the read and the flush is lost to the checker).
    async fn flush(&mut self) {
        let Raw::Single(conn) = &self.raw else {
            return;
        };
        let start = now_us();
        let mut pipe = redis::pipe();
        pipe.atomic();
        for key in &self.keys {
            pipe.cmd("LRANGE").arg(key.writes()).arg(0).arg(-1);
        }
        pipe.cmd("FLUSHDB").ignore();
        let lists: redis::RedisResult<Vec<Vec<String>>> = pipe.query_async(&mut conn.clone()).await;
        if let Ok(lists) = lists {
            let mut st = lock(&self.state);
            for (key, list) in self.keys.iter().zip(lists) {
                st.flushed_writes
                    .entry(key.name.clone())
                    .or_default()
                    .extend(list);
            }
        }
        self.record(Disrupt::FlushDb, start);
    }

    /// Moves a key's slot to another master, as a reshard does.
    async fn migrate(&mut self, target: &Target) {
        if !target.is_cluster() {
            return;
        }
        let key = self.key();
        let start = now_us();
        let slot = support::key_slot(&key);
        let nodes = self.nodes.clone();
        let to_pick = self.rng.gen_range(0..nodes.len());
        let moved =
            tokio::task::spawn_blocking(move || support::move_slot_to(&nodes, slot, to_pick))
                .await
                .unwrap_or_else(|panic| {
                    lock(&self.state)
                        .failures
                        .push(format!("the slot move of {key} panicked: {panic}"));
                    None
                });
        if let Some(moved) = moved {
            if let Some(error) = moved.error {
                lock(&self.state)
                    .failures
                    .push(format!("the slot move of {key}: {error}"));
            }
            self.record(
                Disrupt::Migrate {
                    key,
                    from: moved.from,
                    to: moved.to,
                },
                start,
            );
        }
    }

    async fn kill_process(&mut self) {
        let start = now_us();
        let mut procs = self.procs.lock().await;
        let running: Vec<usize> = (0..procs.children.len())
            .filter(|i| !procs.children[*i].stopped)
            .collect();
        if running.is_empty() {
            return;
        }
        let i = running[self.rng.gen_range(0..running.len())];
        let mut child = procs.children.swap_remove(i);
        let _ = child.process.start_kill();
        let _ = child.process.wait().await;
        let at = now_us();
        let client = child.client.lock().unwrap().clone();
        if let (Some(client), Some(tx)) = (&client, &procs.tx) {
            let _ = tx.send(Msg::Killed {
                client: client.clone(),
                at,
            });
        }
        procs.spawn();
        drop(procs);
        self.record(
            Disrupt::SigKill {
                client: client.unwrap_or_default(),
            },
            start,
        );
    }

    /// Pauses a holder process past its lease, then lets it run again.
    async fn stop_process(&mut self) {
        let start = now_us();
        let (pid, client) = {
            let mut procs = self.procs.lock().await;
            let running: Vec<usize> = (0..procs.children.len())
                .filter(|i| !procs.children[*i].stopped)
                .collect();
            if running.len() < 2 {
                return;
            }
            // One that holds something now, if any does: its holds end while it sleeps.
            let holding: Vec<usize> = {
                let st = lock(&self.state);
                running
                    .iter()
                    .copied()
                    .filter(|i| {
                        let client = procs.children[*i].client.lock().unwrap().clone();
                        st.holds
                            .iter()
                            .any(|((o, _), h)| h.end.is_none() && Some(client_of(o)) == client)
                    })
                    .collect()
            };
            let pool = if holding.is_empty() {
                &running
            } else {
                &holding
            };
            let i = pool[self.rng.gen_range(0..pool.len())];
            let child = &mut procs.children[i];
            child.stopped = true;
            signal(child.pid, "-STOP");
            let client = child.client.lock().unwrap().clone().unwrap_or_default();
            (child.pid, client)
        };
        self.record(
            Disrupt::SigStop {
                client,
                pid,
                resumed: None,
            },
            start,
        );
        let pause = LEASE.mul_f64(self.rng.gen_range(1.3..2.0));
        let (procs, state) = (self.procs.clone(), self.state.clone());
        tokio::spawn(async move {
            tokio::time::sleep(pause).await;
            resume(&procs, &state, pid).await;
        });
    }
}

/// Lets a paused process run again, and records when.
async fn resume(procs: &tokio::sync::Mutex<Procs>, state: &Shared, pid: u32) {
    let mut procs = procs.lock().await;
    let Some(child) = procs.children.iter_mut().find(|c| c.pid == pid) else {
        return;
    };
    if !child.stopped {
        return;
    }
    signal(pid, "-CONT");
    child.stopped = false;
    let at = now_us();
    for d in lock(state).disruptions.iter_mut() {
        if let Disrupt::SigStop {
            pid: p,
            resumed: resumed @ None,
            ..
        } = &mut d.what
        {
            if *p == pid {
                *resumed = Some(at);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Blocking holders

/// The holder loop of `examples/oracle_holder.rs`, with the blocking API, on a thread.
fn blocking_holder(
    client: redis_lock_client::blocking::LockClient,
    plan: Plan,
    sink: Sink,
    runtime: tokio::runtime::Handle,
) {
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let mut handles: HashMap<(usize, Mode), redis_lock_client::blocking::Lock> = HashMap::new();
    while Instant::now() < plan.until {
        let (index, mode) = holder::pick(&mut rng, &plan.keys);
        let key = plan.keys[index].clone();
        let lock = handles
            .entry((index, mode))
            .or_insert_with(|| {
                let lock = match (key.kind, mode) {
                    (KeyKind::Permit(n), _) => client.semaphore(&key.name, n),
                    (_, Mode::Read) => client.read_lock(&key.name),
                    _ => client.lock(&key.name),
                };
                let lock = lock.lease(plan.lease);
                if rng.gen_bool(plan.ephemeral) {
                    lock.ephemeral()
                } else {
                    lock
                }
            })
            .clone();
        let asked = now_us();
        let result = if rng.gen_bool(0.3) {
            lock.try_acquire()
        } else {
            let wait = plan.lease.mul_f64(rng.gen_range(0.05..2.0));
            lock.wait_timeout(wait).acquire().map(Some)
        };
        let no_guard = |outcome: &str, text: String| {
            sink(Event::now(Note::NoGuard {
                key: key.name.clone(),
                outcome: outcome.to_string(),
                text,
            }))
        };
        let mut guard = match result {
            Ok(Some(guard)) => guard,
            Ok(None) => {
                no_guard("busy", String::new());
                std::thread::sleep(Duration::from_millis(rng.gen_range(0..60)));
                continue;
            }
            Err(LockError::Timeout { .. }) => {
                no_guard("timeout", String::new());
                continue;
            }
            Err(e) => {
                no_guard("error", e.to_string());
                std::thread::sleep(Duration::from_millis(rng.gen_range(10..100)));
                continue;
            }
        };
        let (owner, token) = (guard.owner().to_string(), guard.token());
        sink(Event::now(Note::Granted {
            key: key.name.clone(),
            owner: owner.clone(),
            token,
            mode,
            asked,
        }));
        let (ended, mut ended_rx) = tokio::sync::oneshot::channel::<()>();
        if let Some(watch) = guard.watch() {
            let (sink, owner) = (sink.clone(), owner.clone());
            runtime.spawn(async move {
                tokio::select! {
                    reason = watch.lost() => sink(Event::now(Note::Lost { owner, token, reason: format!("{reason:?}") })),
                    _ = &mut ended_rx => {}
                }
            });
        }
        for _ in 0..rng.gen_range(0..5) {
            std::thread::sleep(plan.lease.mul_f64(rng.gen_range(0.0..0.45)));
            let result = guard.fenced::<Value>(&holder::fenced_cmd(&key, mode, token));
            sink(Event::now(Note::Wrote {
                owner: owner.clone(),
                token,
                outcome: holder::outcome(&result).to_string(),
            }));
            if matches!(
                result,
                Err(LockError::Fenced { .. } | LockError::NotHeld { .. })
            ) {
                break;
            }
        }
        let release = rng.gen_bool(0.65);
        sink(Event::now(Note::Ended {
            owner,
            token,
            how: if release { "released" } else { "dropped" }.to_string(),
        }));
        if release {
            let _ = guard.release();
        } else {
            drop(guard);
        }
        let _ = ended.send(());
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..40)));
    }
}

// ---------------------------------------------------------------------------------------------
// One seed

/// How many handles take `EPHEMERAL` holds.
fn ephemeral_share(_target: &Target) -> f64 {
    0.3
}

/// The keys of a seed's run: three exclusive locks, a read-write lock, a semaphore of two
/// permits (named after the seed: what an earlier seed left behind is not in the way).
fn keys(seed: u64) -> Vec<KeySpec> {
    [
        "o1:exclusive",
        "o2:exclusive",
        "o3:exclusive",
        "sh:rw",
        "sem:permit:2",
    ]
    .iter()
    .map(|s| KeySpec::parse(&format!("s{seed}{s}")).unwrap())
    .collect()
}

/// What a seed came to.
struct Outcome {
    report: String,
    false_lost: Vec<String>,
    over_bound: Vec<String>,
    violations: Vec<String>,
    holds: usize,
    disruptions: BTreeMap<&'static str, u32>,
    /// False held durations (ms) per cause.
    by_cause: BTreeMap<&'static str, Vec<u64>>,
    /// The durations (ms) of the cases the lost-hold signal should have told.
    signalled: Vec<u64>,
    /// `ordered_pairs`: new holds, those checked, (earlier, later) pairs.
    token_reach: [usize; 3],
}

fn example(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("examples").join(name))
        .unwrap()
}

async fn run_seed(target: &Target, seed: u64, secs: u64) -> Outcome {
    let keys = keys(seed);
    let state: Shared = Arc::new(Mutex::new(State::default()));
    let (tx, rx) = mpsc::unbounded_channel();
    let raw = target.raw().await;
    let checker = tokio::spawn(checker(state.clone(), raw.clone(), rx));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poller = tokio::spawn(poller(state.clone(), raw.clone(), stop.clone()));
    let until = Instant::now() + Duration::from_secs(secs);
    let spec = target.spec();
    let ephemeral = ephemeral_share(target);
    let plan = |n: u64, cancel: bool| Plan {
        seed: seed * 1_000 + n,
        lease: LEASE,
        keys: keys.clone(),
        until,
        cancel,
        ephemeral,
    };

    // Tasks on this (multi-thread) runtime, one client.
    let client = holder::connect(&spec).await.unwrap();
    lock(&state)
        .clients
        .insert(client.id().to_string(), "multi-thread tasks".into());
    let mut tasks = Vec::new();
    for n in 0..3 {
        let sink = sink(&tx, &format!("task {n} (multi-thread)"));
        tasks.push(tokio::spawn(holder::run(
            client.clone(),
            plan(n, true),
            sink,
        )));
    }
    // Tasks on a current-thread runtime of their own.
    let mut threads = Vec::new();
    {
        let (spec, state, tx) = (spec.clone(), state.clone(), tx.clone());
        let plans = [plan(10, true), plan(11, true)];
        threads.push(std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let client = holder::connect(&spec).await.unwrap();
                lock(&state)
                    .clients
                    .insert(client.id().to_string(), "current-thread tasks".into());
                let [a, b] = plans;
                tokio::join!(
                    holder::run(client.clone(), a, sink(&tx, "task 10 (current-thread)")),
                    holder::run(client.clone(), b, sink(&tx, "task 11 (current-thread)")),
                );
            });
        }));
    }
    // Threads with the blocking API, one blocking client.
    {
        let builder = match target {
            Target::Single(server) => {
                LockClient::builder(redis::Client::open(server.url()).unwrap())
            }
            Target::Cluster(cluster) => LockClient::cluster_builder(cluster.urls()).unwrap(),
        };
        // Made on a thread outside the runtime, as blocking code does.
        let made = std::thread::spawn(move || {
            redis_lock_client::blocking::LockClient::from_builder(builder)
        });
        let blocking = tokio::task::spawn_blocking(move || made.join())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        lock(&state)
            .clients
            .insert(blocking.id().to_string(), "blocking threads".into());
        for n in 20..22 {
            let (blocking, plan, sink) = (
                blocking.clone(),
                plan(n, false),
                sink(&tx, &format!("thread {n} (blocking)")),
            );
            let runtime = tokio::runtime::Handle::current();
            threads.push(std::thread::spawn(move || {
                blocking_holder(blocking, plan, sink, runtime)
            }));
        }
    }
    // Processes of their own.
    let exe = example("oracle_holder");
    assert!(
        exe.exists(),
        "{exe:?} missing: cargo test builds it (add --examples to a run filtered to --test oracle)"
    );
    let procs = Arc::new(tokio::sync::Mutex::new(Procs {
        children: Vec::new(),
        next_seed: seed * 1_000 + 100,
        target: spec.clone(),
        keys: keys.clone(),
        until,
        tx: Some(tx.clone()),
        exe,
        ephemeral,
    }));
    {
        let mut p = procs.lock().await;
        p.spawn();
        p.spawn();
    }

    // Chaos until the end.
    let db1 = match target {
        Target::Single(server) => Some(
            redis::Client::open(format!("{}1", server.url()))
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap(),
        ),
        Target::Cluster(_) => None,
    };
    // An election: two candidates campaign in turn, an observer follows.
    let election = format!("s{seed}el:election");
    let mut elections = Vec::new();
    for n in 0..2 {
        elections.push(tokio::spawn(campaigner(
            client.clone(),
            election.clone(),
            state.clone(),
            until,
            seed * 1_000 + 500 + n,
        )));
    }
    let observer = tokio::spawn(observe(
        client.clone(),
        election.clone(),
        state.clone(),
        raw.clone(),
    ));
    let mut chaos = Chaos {
        election: election.clone(),
        rng: StdRng::seed_from_u64(seed ^ 0xC4A05),
        raw: raw.clone(),
        keys: keys.clone(),
        state: state.clone(),
        procs: procs.clone(),
        cluster: target.is_cluster(),
        db1,
        nodes: target
            .nodes()
            .iter()
            .map(|n| ("127.0.0.1".to_string(), n.port))
            .collect(),
    };
    // Let the holders start before the first disruption.
    tokio::time::sleep(Duration::from_millis(500)).await;
    while Instant::now() < until {
        chaos.one(target).await;
        let pause = chaos.rng.gen_range(150..600);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }

    // The end: a paused process runs again when its pause (past the lease) is over, not
    // earlier; holders finish their last hold.
    let paused_until = Instant::now() + LEASE * 3;
    while procs.lock().await.children.iter().any(|c| c.stopped) && Instant::now() < paused_until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let grace = Duration::from_secs(30);
    for task in elections {
        tokio::time::timeout(grace, task)
            .await
            .expect("a campaigner finished")
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await; // the last leader read
    observer.abort();
    for task in tasks {
        tokio::time::timeout(grace, task)
            .await
            .expect("a holder task finished")
            .unwrap();
    }
    for thread in threads {
        let joined = tokio::task::spawn_blocking(move || thread.join());
        tokio::time::timeout(grace, joined)
            .await
            .expect("a holder thread finished")
            .unwrap()
            .unwrap();
    }
    {
        let mut p = procs.lock().await;
        for child in p.children.iter_mut() {
            let exited = tokio::time::timeout(grace, child.process.wait()).await;
            if exited.is_err() {
                let _ = child.process.start_kill();
                let _ = child.process.wait().await;
            }
        }
    }
    procs.lock().await.tx = None;
    drop(chaos);
    drop(tx);
    // The checker drains what the holders said (the processes' readers end with their output).
    let _ = tokio::time::timeout(Duration::from_secs(10), checker).await;
    tokio::time::sleep(Duration::from_millis(200)).await; // the last loss checks
    stop.store(true, std::sync::atomic::Ordering::Release);
    let _ = poller.await;
    let finished = now_us();

    // The writes, each key's flushed lists and then its list now.
    let mut writes: HashMap<String, Vec<String>> = HashMap::new();
    for key in &keys {
        let now: Vec<String> = match raw
            .query(redis::cmd("LRANGE").arg(key.writes()).arg(0).arg(-1))
            .await
        {
            Ok(Value::Array(items)) => items
                .into_iter()
                .filter_map(|v| match v {
                    Value::BulkString(b) => String::from_utf8(b).ok(),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        let mut all = lock(&state)
            .flushed_writes
            .remove(&key.name)
            .unwrap_or_default();
        all.extend(now);
        writes.insert(key.name.clone(), all);
    }
    let st = lock(&state);
    judge(&st, &keys, &writes, seed, finished, target)
}

// ---------------------------------------------------------------------------------------------
// The verdict

/// Whether the server sends the lost-hold signal for `what` (the module sees it).
fn is_signalled(what: &Disrupt) -> bool {
    match what {
        Disrupt::Del(_) => support::reports_key_events(),
        Disrupt::ForceRelease(_) | Disrupt::FlushDb | Disrupt::ClientKill { .. } => true,
        _ => false,
    }
}

/// Whether `what` could have ended `hold` (of `client`) between `lo` and `hi`.
fn could_end(d: &Disruption, key: &str, client: &str, lo: u64, hi: u64) -> bool {
    if d.start > hi {
        return false;
    }
    match &d.what {
        Disrupt::ForceRelease(k) | Disrupt::Del(k) => k == key && d.end >= lo,
        Disrupt::FlushDb => d.end >= lo,
        Disrupt::ClientKill { client: c, .. } => c == client && d.end >= lo,
        Disrupt::SigStop {
            client: c, resumed, ..
        } => c == client && resumed.is_none_or(|r| r >= lo),
        // A forged message ends nothing: a hold the library let go on one is a false lost.
        Disrupt::SigKill { .. }
        | Disrupt::CopyDel { .. }
        | Disrupt::Migrate { .. }
        | Disrupt::Forge { .. } => false,
    }
}

/// A new hold of a key, for the token order: asked for at `asked`, handed out at `granted`
/// (client-side times, us); the server chose its token in between.
#[derive(Debug, Clone)]
struct Grant {
    key: String,
    token: u64,
    asked: u64,
    granted: u64,
}

/// Fencing tokens rise per key: the module gives every new hold (exclusive, shared, permit) a
/// token above every token it handed out before for that key. The rule checked, for two new
/// holds `g1`, `g2` of one key: when `g1` was handed out before `g2` was asked for
/// (`g1.granted < g2.asked`), the server granted `g1` first, so `g2.token > g1.token`. Holds
/// whose intervals overlap (shared holds or permits granted at once, a grant whose reply a
/// paused process read late) are not ordered, and not compared. A re-entry, or the same
/// (owner, token) handed out again through its handle, is the same hold: one record, one grant.
///
/// Returns `(g1, g2)` index pairs into `grants`, one per `g2` that fails, `g1` the grant with
/// the highest token among those handed out before `g2` was asked for.
fn falling_tokens(grants: &[Grant]) -> Vec<(usize, usize)> {
    let mut per_key: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, g) in grants.iter().enumerate() {
        per_key.entry(&g.key).or_default().push(i);
    }
    let mut out = Vec::new();
    for mut order in per_key.into_values() {
        order.sort_by_key(|&i| grants[i].granted);
        // top[n]: the grant with the highest token among the first n + 1 handed out.
        let mut top: Vec<usize> = Vec::with_capacity(order.len());
        for &i in &order {
            let best = match top.last() {
                Some(&b) if grants[b].token >= grants[i].token => b,
                _ => i,
            };
            top.push(best);
        }
        for &later in &order {
            let before = order.partition_point(|&i| grants[i].granted < grants[later].asked);
            if let Some(&earlier) = before.checked_sub(1).and_then(|n| top.get(n)) {
                if grants[later].token <= grants[earlier].token {
                    out.push((earlier, later));
                }
            }
        }
    }
    out
}

/// What `falling_tokens` compares: the new holds, those with at least one hold of their key
/// handed out before they were asked for, and the number of such (earlier, later) pairs.
fn ordered_pairs(grants: &[Grant]) -> [usize; 3] {
    let mut per_key: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for g in grants {
        per_key.entry(&g.key).or_default().push(g.granted);
    }
    for times in per_key.values_mut() {
        times.sort_unstable();
    }
    let mut out = [grants.len(), 0, 0];
    for g in grants {
        let n = per_key[g.key.as_str()].partition_point(|&t| t < g.asked);
        out[1] += usize::from(n > 0);
        out[2] += n;
    }
    out
}

/// The port of the master that served `key` at `t`, as the migrations recorded it
/// (`from->to` while one ran); None where no migration of its slot says.
fn node_at(disruptions: &[Disruption], key: &str, t: u64) -> Option<String> {
    let mut moves: Vec<(u64, u64, u16, u16)> = disruptions
        .iter()
        .filter_map(|d| match &d.what {
            Disrupt::Migrate { key: k, from, to } if k == key => Some((d.start, d.end, *from, *to)),
            _ => None,
        })
        .collect();
    moves.sort_unstable();
    if let Some((_, _, from, to)) = moves.iter().find(|m| m.0 <= t && t <= m.1) {
        return Some(format!("{from}->{to} (migrating)"));
    }
    match moves.iter().rev().find(|m| m.1 < t) {
        Some((_, _, _, to)) => Some(to.to_string()),
        None => moves.first().map(|m| m.2.to_string()),
    }
}

/// One line per hold whose token was not above an earlier one of its key (`falling_tokens`),
/// naming both holds and the disruptions between them.
fn token_order(st: &State, seed: u64) -> Vec<String> {
    let records: Vec<(&(String, u64), &HoldRecord)> = st.holds.iter().collect();
    let grants: Vec<Grant> = records
        .iter()
        .map(|((_, token), h)| Grant {
            key: h.key.clone(),
            token: *token,
            asked: h.asked,
            granted: h.granted,
        })
        .collect();
    let at = |t: u64| format!("{}.{:06}", t / 1_000_000, t % 1_000_000);
    falling_tokens(&grants)
        .into_iter()
        .map(|(earlier, later)| {
            let ((o1, t1), h1) = records[earlier];
            let ((o2, t2), h2) = records[later];
            let node = |h: &HoldRecord, t: u64| {
                node_at(&st.disruptions, &h.key, t)
                    .map(|n| format!(", node {n}"))
                    .unwrap_or_default()
            };
            let between: Vec<String> = st
                .disruptions
                .iter()
                .filter(|d| d.end >= h1.granted && d.start <= h2.granted)
                .map(|d| format!("{:?} at {}", d.what, at(d.start)))
                .collect();
            format!(
                "seed {seed}: the token fell on {}: {} ({o2}, {:?}) got {t2} at {} (asked {}{}), \
                 not above {t1} that {} ({o1}, {:?}) got at {}{}: {} lower; between them: {}",
                h2.key,
                h2.holder,
                h2.mode,
                at(h2.granted),
                at(h2.asked),
                node(h2, h2.granted),
                h1.holder,
                h1.mode,
                at(h1.granted),
                node(h1, h1.granted),
                t1 - t2,
                if between.is_empty() {
                    "no disruption".to_string()
                } else {
                    between.join("; ")
                }
            )
        })
        .collect()
}

fn judge(
    st: &State,
    keys: &[KeySpec],
    writes: &HashMap<String, Vec<String>>,
    seed: u64,
    finished: u64,
    target: &Target,
) -> Outcome {
    let mut report = String::new();
    let mut false_lost = Vec::new();
    let mut over_bound = Vec::new();
    let mut violations = Vec::new();

    // False held, per hold.
    let mut by_cause: BTreeMap<&'static str, Vec<u64>> = BTreeMap::new();
    let mut signalled = Vec::new();
    let mut cases = Vec::new();
    for ((owner, token), hold) in &st.holds {
        if let Some(why) = &hold.false_lost {
            false_lost.push(format!("seed {seed}: {why} (holder {})", hold.holder));
        }
        let (belief_end, how) = hold.end.clone().unwrap_or((finished, End::Unfinished));
        if how == End::Killed {
            continue;
        }
        // Evidence that the server had ended it before the belief did: a check that found it
        // gone before, or the loss report itself (checked at once: not a false lost).
        let proof = match (&how, hold.gone) {
            (_, Some(gone)) if gone < belief_end => Some(gone),
            (End::Lost(_), _) if hold.false_lost.is_none() => Some(belief_end),
            _ => None,
        };
        let Some(hi) = proof else { continue };
        let client = client_of(owner);
        let lo = hold.last_held;
        let cause = st
            .disruptions
            .iter()
            .filter(|d| could_end(d, &hold.key, &client, lo, hi))
            .max_by_key(|d| d.start);
        let (name, server_end, bound) = match cause {
            Some(d) => match &d.what {
                Disrupt::SigStop { resumed, .. } => {
                    let from = resumed.unwrap_or(finished).max(lo);
                    ("SIGSTOP (from the resume)", from, RESUME_BOUND_MS)
                }
                what => {
                    // A message may be missed: the client's pub/sub connection was killed shortly
                    // before (it subscribes again after a back-off), or the hold's subscription
                    // was still on its way.
                    let missed = st.disruptions.iter().any(|k| {
                        matches!(&k.what, Disrupt::ClientKill { client: c, pubsub: true } if *c == client)
                            && k.start + 2_500_000 >= d.start
                            && k.start <= d.start + SIGNAL_BOUND_MS * 1_000
                    }) || hold.granted + 300_000 > d.start;
                    let bound = if is_signalled(what) && !missed {
                        SIGNAL_BOUND_MS
                    } else {
                        WATCHDOG_BOUND_MS
                    };
                    (what.kind(), d.start.max(hold.granted), bound)
                }
            },
            None => ("unattributed (lease end)", lo, WATCHDOG_BOUND_MS),
        };
        // A process paused after the server ended its hold hears nothing until it runs again:
        // its false held counts from the resume.
        let paused = st.disruptions.iter().find_map(|d| match &d.what {
            Disrupt::SigStop {
                client: c, resumed, ..
            } if *c == client
                && d.start <= belief_end
                && resumed.is_none_or(|r| r > server_end) =>
            {
                Some(resumed.unwrap_or(finished))
            }
            _ => None,
        });
        let (name, server_end, bound) = match paused {
            Some(resumed) if !name.starts_with("SIGSTOP") => {
                let name = match name {
                    "FORCERELEASE" => "FORCERELEASE while paused (from the resume)",
                    "DEL" => "DEL while paused (from the resume)",
                    "FLUSHDB" => "FLUSHDB while paused (from the resume)",
                    "CLIENT KILL" => "CLIENT KILL while paused (from the resume)",
                    _ => "while paused (from the resume)",
                };
                (name, server_end.max(resumed), RESUME_BOUND_MS)
            }
            _ => (name, server_end, bound),
        };
        // Disruptions that touched the hold's key or client but cannot end a hold (a copy, a
        // migration, a kill of another process): named beside a case none explains.
        let nearby: Vec<String> = if cause.is_none() {
            st.disruptions
                .iter()
                .filter(|d| d.start <= hi && d.end + 1_000_000 >= lo)
                .filter(|d| match &d.what {
                    Disrupt::CopyDel { key, .. } | Disrupt::Migrate { key, .. } => *key == hold.key,
                    Disrupt::SigKill { client: c } => *c == client,
                    _ => false,
                })
                .map(|d| d.what.kind().to_string())
                .collect()
        } else {
            Vec::new()
        };
        let held_ms = belief_end.saturating_sub(server_end) / 1_000;
        by_cause.entry(name).or_default().push(held_ms);
        let line = format!(
            "  {name}: {held_ms} ms (bound {bound}) — {} {owner} token {token} on {} ({:?}), ended {how:?}{}",
            hold.holder,
            hold.key,
            hold.mode,
            if nearby.is_empty() {
                String::new()
            } else {
                format!(", near {nearby:?}")
            }
        );
        if held_ms > bound {
            over_bound.push(format!("seed {seed}:{line}"));
        }
        if bound == SIGNAL_BOUND_MS {
            signalled.push(held_ms);
        }
        cases.push((held_ms, line));
    }

    // The tokens, per key.
    let fell = token_order(st, seed);
    let reach = ordered_pairs(
        &st.holds
            .iter()
            .map(|((_, token), h)| grant(&h.key, *token, h.asked, h.granted))
            .collect::<Vec<_>>(),
    );
    violations.extend(fell.iter().cloned());
    violations.extend(st.failures.iter().map(|f| format!("seed {seed}: {f}")));

    // The writes.
    for key in keys {
        let list = writes.get(&key.name).cloned().unwrap_or_default();
        let mut ended: std::collections::HashSet<u64> = Default::default();
        let mut last: u64 = 0;
        let mut spans: HashMap<u64, (usize, usize)> = HashMap::new();
        let mut counts: HashMap<u64, u32> = HashMap::new();
        let mut n = 0usize;
        for entry in &list {
            if let Some(t) = entry.strip_prefix("end:") {
                ended.insert(t.parse().unwrap());
                continue;
            }
            let t: u64 = entry.parse().unwrap();
            if ended.contains(&t) {
                violations.push(format!(
                    "seed {seed}: a stale write landed on {}: token {t} after its hold ended",
                    key.name
                ));
            }
            if !matches!(key.kind, KeyKind::Permit(_)) && t < last {
                violations.push(format!(
                    "seed {seed}: on {} token {t} was written after {last}",
                    key.name
                ));
            }
            last = last.max(t);
            spans.entry(t).and_modify(|s| s.1 = n).or_insert((n, n));
            *counts.entry(t).or_default() += 1;
            n += 1;
        }
        if let KeyKind::Permit(limit) = key.kind {
            for i in 0..n {
                let open = spans.values().filter(|(a, b)| *a <= i && i <= *b).count();
                if open > limit as usize {
                    violations.push(format!(
                        "seed {seed}: {open} permits of {} wrote at once (limit {limit})",
                        key.name
                    ));
                    break;
                }
            }
        }
        for ((owner, token), hold) in &st.holds {
            if hold.key != key.name || hold.mode == Mode::Read {
                continue;
            }
            let landed = counts.get(token).copied().unwrap_or(0);
            // A process killed with a write on its way: the server may have run it, but no
            // outcome was ever printed (one at most: a holder writes one at a time).
            let in_flight = u32::from(matches!(hold.end, Some((_, End::Killed))));
            if landed < hold.ok_writes || landed > hold.ok_writes + hold.unknown_writes + in_flight
            {
                // What the holder's client went through while it held: a write that landed
                // more often than sent is told apart from one a kill left unreported.
                let client = client_of(owner);
                let last = hold.end.as_ref().map_or(finished, |(t, _)| *t);
                let around: Vec<String> = st
                    .disruptions
                    .iter()
                    .filter(|d| d.end >= hold.granted && d.start <= last)
                    .filter(|d| match &d.what {
                        Disrupt::ClientKill { client: c, .. }
                        | Disrupt::SigKill { client: c }
                        | Disrupt::SigStop { client: c, .. } => *c == client,
                        Disrupt::Migrate { key: k, .. }
                        | Disrupt::ForceRelease(k)
                        | Disrupt::Del(k)
                        | Disrupt::CopyDel { key: k, .. } => *k == key.name,
                        _ => true,
                    })
                    .map(|d| format!("{:?} at {}", d.what, d.start))
                    .collect();
                violations.push(format!(
                    "seed {seed}: {owner} token {token} on {}: {} writes answered, {} unknown, {landed} landed \
                     ({}, granted at {}, ended {:?}; while held: {})",
                    key.name,
                    hold.ok_writes,
                    hold.unknown_writes,
                    hold.holder,
                    hold.granted,
                    hold.end,
                    if around.is_empty() {
                        "no disruption".to_string()
                    } else {
                        around.join("; ")
                    }
                ));
            }
        }
    }

    // The report.
    let mut kinds: BTreeMap<&'static str, u32> = BTreeMap::new();
    for d in &st.disruptions {
        *kinds.entry(d.what.kind()).or_default() += 1;
    }
    let lost = st
        .holds
        .values()
        .filter(|h| matches!(h.end, Some((_, End::Lost(_)))))
        .count();
    let _ = writeln!(
        report,
        "seed {seed} on {} {:?}{}: {} holds ({} reported lost), {} server checks, writes {:?}, acquires without a guard {:?}",
        support::server_name(),
        support::server_info().version,
        if target.is_cluster() { " (cluster)" } else { "" },
        st.holds.len(),
        lost,
        st.checks,
        st.writes,
        st.no_guard
    );
    let _ = writeln!(report, "  disruptions: {kinds:?}");
    let _ = writeln!(report, "  false lost: {}", false_lost.len());
    // The election's observer: never a leader the server did not elect (a forged message's).
    let unelected: Vec<String> = st
        .observed
        .iter()
        .filter(|l| !st.elected.contains(&(l.candidate.clone(), l.epoch)))
        .map(|l| format!("seed {seed}: the observer followed {l}, which the server never elected"))
        .collect();
    let _ = writeln!(
        report,
        "  observer: {} leaders yielded, {} the server never elected",
        st.observed.len(),
        unelected.len()
    );
    for line in &unelected {
        let _ = writeln!(report, "  UNELECTED: {line}");
    }
    if st.observed.is_empty() {
        violations.push(format!("seed {seed}: the observer yielded no leader"));
    }
    violations.extend(unelected.iter().cloned());
    let _ = writeln!(
        report,
        "  false held: {} cases; longest per cause (ms): {:?}",
        cases.len(),
        by_cause
            .iter()
            .map(|(k, v)| (*k, v.len(), v.iter().max().copied().unwrap_or(0)))
            .collect::<Vec<_>>()
    );
    cases.sort_by_key(|c| std::cmp::Reverse(c.0));
    for (_, line) in &cases {
        let _ = writeln!(report, "{line}");
    }
    let _ = writeln!(
        report,
        "  tokens not above an earlier grant's: {} ({} new holds, {} checked against {} ordered pairs); \
         failed disruptions: {}; stale writes landed and other write violations: {}",
        fell.len(),
        reach[0],
        reach[1],
        reach[2],
        st.failures.len(),
        violations.len() - fell.len() - st.failures.len() - unelected.len()
            - usize::from(st.observed.is_empty())
    );
    if std::env::var_os("ORACLE_VERBOSE").is_some() {
        for d in &st.disruptions {
            let held: Vec<String> = match &d.what {
                Disrupt::SigStop { client, .. } | Disrupt::SigKill { client } => st
                    .holds
                    .iter()
                    .filter(|((o, _), h)| {
                        client_of(o) == *client
                            && h.granted <= d.start
                            && h.end.as_ref().is_none_or(|(t, _)| *t >= d.start)
                    })
                    .map(|((_, t), h)| format!("{} {t} end {:?} gone {:?}", h.key, h.end, h.gone))
                    .collect(),
                _ => Vec::new(),
            };
            let _ = writeln!(report, "  at {}: {:?} {held:?}", d.start, d.what);
        }
    }
    Outcome {
        report,
        false_lost,
        over_bound,
        violations,
        holds: st.holds.len(),
        disruptions: kinds,
        by_cause,
        signalled,
        token_reach: reach,
    }
}

/// The median of the signalled cases may not exceed this: the signal tells within a few
/// milliseconds; a library that missed it would be told by its watchdog or its next fenced
/// write, hundreds of milliseconds later.
const SIGNAL_MEDIAN_MS: u64 = 50;

async fn oracle(target: Target, config: Config) {
    let mut failures = Vec::new();
    let (mut holds, mut false_lost, mut violations) = (0, 0, 0);
    let mut disruptions: BTreeMap<&'static str, u32> = BTreeMap::new();
    let mut by_cause: BTreeMap<&'static str, Vec<u64>> = BTreeMap::new();
    let mut signalled = Vec::new();
    let mut reach = [0usize; 3];
    for seed in &config.seeds {
        let outcome = run_seed(&target, *seed, config.secs).await;
        println!("{}", outcome.report);
        for (total, n) in reach.iter_mut().zip(outcome.token_reach) {
            *total += n;
        }
        holds += outcome.holds;
        false_lost += outcome.false_lost.len();
        violations += outcome.violations.len();
        for (kind, n) in outcome.disruptions {
            *disruptions.entry(kind).or_default() += n;
        }
        for (cause, v) in outcome.by_cause {
            by_cause.entry(cause).or_default().extend(v);
        }
        signalled.extend(outcome.signalled);
        failures.extend(outcome.false_lost);
        failures.extend(outcome.over_bound);
        failures.extend(outcome.violations);
    }
    signalled.sort_unstable();
    let median = signalled.get(signalled.len() / 2).copied().unwrap_or(0);
    println!(
        "oracle summary on {} {:?}{}, seeds {:?} of {} s: {holds} holds; disruptions {disruptions:?}; \
         false lost {false_lost}; token order: {} new holds, {} checked against {} ordered pairs; \
         tokens not above an earlier grant's, failed disruptions, stale writes landed and other write violations {violations}; \
         false held {} cases, per cause (count, longest ms): {:?}; signalled cases: {}, median {median} ms",
        support::server_name(),
        support::server_info().version,
        if target.is_cluster() { " (cluster)" } else { "" },
        config.seeds,
        config.secs,
        reach[0],
        reach[1],
        reach[2],
        by_cause.values().map(Vec::len).sum::<usize>(),
        by_cause
            .iter()
            .map(|(k, v)| (*k, v.len(), v.iter().max().copied().unwrap_or(0)))
            .collect::<Vec<_>>(),
        signalled.len(),
    );
    if signalled.len() >= 6 && median > SIGNAL_MEDIAN_MS {
        failures.push(format!(
            "the signalled cases' median false held is {median} ms (over {SIGNAL_MEDIAN_MS}): {signalled:?}"
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oracle_standalone() {
    oracle(Target::Single(Server::start()), config(1, 3, 12)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oracle_cluster() {
    let target = tokio::task::spawn_blocking(|| Target::Cluster(Cluster::start(3)))
        .await
        .unwrap();
    oracle(target, config(101, 1, 12)).await;
}

// ---------------------------------------------------------------------------------------------
// The token-order check itself

fn grant(key: &str, token: u64, asked: u64, granted: u64) -> Grant {
    Grant {
        key: key.to_string(),
        token,
        asked,
        granted,
    }
}

#[test]
fn falling_tokens_flags_a_later_grant_not_above_an_earlier_one() {
    // (grants, the (earlier, later) pairs flagged)
    type Case = (&'static str, Vec<Grant>, Vec<(usize, usize)>);
    let cases: Vec<Case> = vec![
        (
            "a later grant with a lower token",
            vec![grant("K", 200, 90, 100), grant("K", 100, 150, 200)],
            vec![(0, 1)],
        ),
        (
            "an equal token",
            vec![grant("K", 200, 90, 100), grant("K", 200, 150, 200)],
            vec![(0, 1)],
        ),
        (
            "rising tokens",
            vec![grant("K", 100, 90, 100), grant("K", 200, 150, 200)],
            vec![],
        ),
        (
            "shared holds granted at once, recorded out of the server's order",
            vec![grant("K", 101, 50, 100), grant("K", 102, 50, 99)],
            vec![],
        ),
        (
            "a reply read late by a paused process: not ordered",
            vec![grant("K", 100, 100, 500), grant("K", 200, 250, 300)],
            vec![],
        ),
        (
            "below the highest of several earlier grants",
            vec![
                grant("K", 300, 90, 100),
                grant("K", 100, 100, 110),
                grant("K", 250, 190, 200),
            ],
            vec![(0, 2)],
        ),
        (
            "per key",
            vec![grant("A", 500, 90, 100), grant("B", 10, 150, 200)],
            vec![],
        ),
        (
            "the issue's migration: 60 s of tokens below",
            vec![
                grant("K", 1_795_881_813_979_014, 5_779_000_000, 5_779_491_123),
                grant("K", 1_795_881_753_979_007, 5_783_442_000, 5_783_473_047),
            ],
            vec![(0, 1)],
        ),
    ];
    for (name, grants, want) in cases {
        assert_eq!(falling_tokens(&grants), want, "{name}");
    }
}

#[test]
fn ordered_pairs_counts_what_falling_tokens_compares() {
    // K: the second asked after the first was handed out (1 pair); the third after both (2);
    // the fourth overlaps them all (asked before any came back). L: alone.
    let grants = vec![
        grant("K", 100, 90, 100),
        grant("K", 200, 150, 200),
        grant("K", 300, 250, 300),
        grant("K", 400, 50, 400),
        grant("L", 10, 0, 10),
    ];
    assert_eq!(ordered_pairs(&grants), [5, 2, 3]);
}

#[test]
fn token_order_names_both_holds_and_the_disruptions_between() {
    let mut st = State::default();
    let record = |holder: &str, asked: u64, granted: u64| HoldRecord {
        key: "K".to_string(),
        mode: Mode::Write,
        holder: holder.to_string(),
        granted,
        asked,
        end: None,
        last_held: granted,
        gone: None,
        ok_writes: 0,
        unknown_writes: 0,
        false_lost: None,
    };
    st.holds
        .insert(("a:1".into(), 200), record("task 1", 900_000, 1_000_000));
    st.holds
        .insert(("b:1".into(), 100), record("task 2", 1_500_000, 2_000_000));
    let migrate = |start, end| Disruption {
        what: Disrupt::Migrate {
            key: "K".into(),
            from: 7001,
            to: 7002,
        },
        start,
        end,
    };
    st.disruptions.push(migrate(1_500_000, 1_600_000));
    st.disruptions.push(Disruption {
        what: Disrupt::Del("K".into()),
        start: 2_500_000,
        end: 2_500_000,
    });
    let found = token_order(&st, 7);
    assert_eq!(found.len(), 1, "{found:?}");
    let line = &found[0];
    for part in [
        "seed 7: the token fell on K: task 2 (b:1, Write) got 100 at 2.000000",
        "(asked 1.500000, node 7002)",
        "not above 200 that task 1 (a:1, Write) got at 1.000000, node 7001: 100 lower",
        "Migrate { key: \"K\", from: 7001, to: 7002 } at 1.500000",
    ] {
        assert!(line.contains(part), "{part:?} not in {line}");
    }
    assert!(!line.contains("Del"), "{line}");
}
