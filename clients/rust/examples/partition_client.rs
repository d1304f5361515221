//! One Rust client process of the partition test (`tests/partitions/`, `make partitions`): the
//! twin of the Python library's `tests/partitions/client.py`, with the same arguments, the same
//! loop and the same history, so that the checker reads both alike. Run by `run.py` inside a
//! network namespace of its own; by hand:
//!
//! ```sh
//! cargo run -p redis-lock-client --example partition_client -- --name c5 \
//!     --sentinels 10.77.1.10:26379,10.77.1.11:26379,10.77.1.12:26379 \
//!     --plain '{plain:a},{plain:b}' --acked '{acked:a},{acked:b}' --secs 60 --seed 1 \
//!     --out history-c5.jsonl [--master lockmaster] [--lease 4] \
//!     [--semaphores '{sem:a}' --limit 2] [--elections '{elect:a}'] [--acked-elections '{elect:b}']
//! ```
//!
//! It loops until `--secs` have passed: pick a key, acquire its lock through Sentinel (lease
//! `--lease` s, wait 1 s; `--acked` keys with `replicas(1, 500 ms)`), write to the key's log
//! through the guard's fence (`guard.fenced`, the server's `LOCK.GUARD`: the write runs only
//! while the token is current) twice with a pause between, release. A `--semaphores` key is
//! held the same way, one permit of `--limit`; an `--elections` key is campaigned for (the same
//! wait), and its leader writes heartbeats to the key's log through the leadership's fence (the
//! epoch is its token) every `HEARTBEAT_SECS`, then resigns (an `--acked-elections` key alike,
//! campaigned for with `replicas(1, 500 ms)`). Every operation is one JSON line of
//! `--out`, written when it completes (a campaign is an `acquire`, a resignation a `release`, a
//! heartbeat a `write`):
//!
//! ```text
//! {"process": "c5", "lib": "rust", "op": "acquire|write|release|lost", "key": "{plain:a}",
//!  "invoke": <monotonic s>, "complete": <monotonic s>, "outcome": "ok|fail|info",
//!  "token": <int or null>, "entry": "<what the write pushed>", "error": "..."}
//! ```
//!
//! `ok`: the server answered yes; `fail`: it answered no, nothing happened (a timeout, a
//! refusal, `FENCED`); `info`: no answer (`LockError::Connection`), it may or may not have
//! happened. `lost` is the library telling the application its hold is gone (the guard's
//! `lost()`), with client.py's word for the reason (`hold-gone`, `unreachable`, ...). `error`
//! is `<the LockError variant>: <its text>`, as client.py writes `<exception class>: <text>`:
//! the checker reads `Fenced...` and `NotHeld...` alike in both. Times are seconds of
//! `CLOCK_MONOTONIC`, the clock of Python's `time.monotonic()` on Linux: one clock for every
//! process of the host, so the holds of both libraries can be compared.

#[path = "support/json.rs"]
mod json;
use json::quoted;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis_lock_client::{
    Election, Leadership, Lock, LockClient, LockError, LockGuard, LostReason, LostWatch, Release,
};
use tokio::sync::oneshot;

/// The pause between a hold's two writes, mostly...
const SHORT_HOLD_SECS: Range<f64> = 0.05..0.4;
/// ... and in `LONG_HOLD_SHARE` of the holds.
const LONG_HOLD_SECS: Range<f64> = 2.0..8.0;
const LONG_HOLD_SHARE: f64 = 0.1;
/// A leader's heartbeats in one term, besides its first write...
const HEARTBEATS: std::ops::RangeInclusive<u32> = 2..=6;
/// ... and the pause before each.
const HEARTBEAT_SECS: Range<f64> = 0.1..0.3;
const WAIT_TIMEOUT: Duration = Duration::from_secs(1);
const REPLICAS_TIMEOUT: Duration = Duration::from_millis(500);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_RETRY: Duration = Duration::from_millis(500);

/// Seconds of `CLOCK_MONOTONIC`, computed as CPython's `time.monotonic()` does (nanoseconds,
/// then divided as a float). `std::time::Instant` reads the same clock but shows no value
/// another process could compare with.
fn monotonic_secs() -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec for the call's duration, and CLOCK_MONOTONIC
    // exists on every Linux kernel; the call writes nothing else.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    if status != 0 {
        // Only an invalid clock id or pointer fails, and neither is possible here.
        eprintln!("clock_gettime(CLOCK_MONOTONIC) failed");
        std::process::exit(1);
    }
    (i128::from(now.tv_sec) * 1_000_000_000 + i128::from(now.tv_nsec)) as f64 / 1e9
}

/// What an operation's answer says about whether it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// The server answered yes.
    Ok,
    /// The server answered no: nothing happened.
    Fail,
    /// No answer: it may or may not have happened.
    Info,
}

impl Outcome {
    fn word(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Fail => "fail",
            Outcome::Info => "info",
        }
    }

    /// client.py's `outcome_of`: a connection error (the library's name for a command that
    /// timed out too) may have run the command; every other error is an answer that it did not.
    fn of(error: &LockError) -> Outcome {
        match error {
            LockError::Connection(_) => Outcome::Info,
            _ => Outcome::Fail,
        }
    }
}

/// `<variant>: <text>`, the shape of client.py's `f"{type(e).__name__}: {e}"`. The names are
/// this library's own (`Timeout`, `Connection`, `Server`, where Python says `LockTimeout`,
/// `LockConnectionError`, `LockServerError`); `Fenced` and `NotHeld`, which the checker counts,
/// are the same words in both.
fn error_text(error: &LockError) -> String {
    let name = match error {
        LockError::NotHeld { .. } => "NotHeld",
        LockError::Fenced { .. } => "Fenced",
        LockError::NotSafelyAcquired { .. } => "NotSafelyAcquired",
        LockError::Timeout { .. } => "Timeout",
        LockError::Server(_) => "Server",
        LockError::NoPermission { .. } => "NoPermission",
        LockError::Connection(_) => "Connection",
        LockError::InvalidArgument(_) => "InvalidArgument",
        LockError::UnexpectedReply(_) => "UnexpectedReply",
        _ => "LockError",
    };
    format!("{name}: {error}")
}

/// The word the Python library's `LostReason` has for `reason` (client.py writes
/// `reason.value`), so that a loss reads the same in both libraries' lines.
fn reason_word(reason: LostReason) -> String {
    match reason {
        LostReason::HoldGone => "hold-gone".into(),
        LostReason::TokenNotCurrent => "token-not-current".into(),
        LostReason::Unreachable => "unreachable".into(),
        LostReason::LeaseEnded => "lease-ended".into(),
        LostReason::Unreplicated => "unreplicated".into(),
        LostReason::ConnectionClosed => "connection-closed".into(),
        LostReason::NoPermission => "no-permission".into(),
        LostReason::ForceReleased => "forcereleased".into(),
        LostReason::Deleted => "deleted".into(),
        LostReason::Overwritten => "overwritten".into(),
        LostReason::Evicted => "evicted".into(),
        LostReason::Disconnected => "disconnected".into(),
        LostReason::Expired => "expired".into(),
        LostReason::Flushed => "flushed".into(),
        // A reason added to the library later: its name, until it is given a word here.
        other => format!("{other:?}"),
    }
}

/// The `error` field of a line: client.py leaves it out of a granted acquire's line, writes
/// `null` for a write or release that went through, and the text otherwise.
enum ErrorField {
    Omitted,
    Null,
    Text(String),
}

/// One completed operation, the fields in client.py's order.
struct Record<'a> {
    op: &'static str,
    key: &'a str,
    invoke: f64,
    complete: f64,
    outcome: Outcome,
    token: Option<u64>,
    /// A write's entry (only writes have the field).
    entry: Option<&'a str>,
    error: ErrorField,
}

/// The JSON-lines file, one line per completed operation, each written whole in one call so
/// that a killed process leaves every line it completed.
struct History {
    file: Mutex<File>,
    process: String,
}

impl History {
    fn record(&self, record: Record<'_>) {
        let mut line = format!(
            "{{\"process\": {}, \"lib\": \"rust\", \"op\": \"{}\", \"key\": {}, \
             \"invoke\": {:?}, \"complete\": {:?}, \"outcome\": \"{}\", \"token\": {}",
            quoted(&self.process),
            record.op,
            quoted(record.key),
            record.invoke,
            record.complete,
            record.outcome.word(),
            record.token.map_or("null".into(), |t| t.to_string()),
        );
        if let Some(entry) = record.entry {
            let _ = write!(line, ", \"entry\": {}", quoted(entry));
        }
        match record.error {
            ErrorField::Omitted => {}
            ErrorField::Null => line.push_str(", \"error\": null"),
            ErrorField::Text(text) => {
                let _ = write!(line, ", \"error\": {}", quoted(&text));
            }
        }
        line.push_str("}\n");
        // The loss watchers write from their own tasks: one line at a time.
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let _ = file.write_all(line.as_bytes());
    }
}

/// client.py's flags, each followed by its value.
const FLAGS: [&str; 13] = [
    "--name",
    "--sentinels",
    "--master",
    "--plain",
    "--acked",
    "--semaphores",
    "--limit",
    "--elections",
    "--acked-elections",
    "--secs",
    "--seed",
    "--lease",
    "--out",
];

/// client.py's arguments, with its defaults.
struct Args {
    name: String,
    sentinels: Vec<String>,
    master: String,
    plain: Vec<String>,
    acked: Vec<String>,
    semaphores: Vec<String>,
    limit: u32,
    elections: Vec<String>,
    acked_elections: Vec<String>,
    secs: f64,
    seed: u64,
    lease: f64,
    out: String,
}

impl Args {
    fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut given: BTreeMap<String, String> = BTreeMap::new();
        while let Some(flag) = argv.next() {
            if !FLAGS.contains(&flag.as_str()) {
                return Err(format!("unknown argument {flag}"));
            }
            let value = argv.next().ok_or(format!("{flag} needs a value"))?;
            given.insert(flag, value);
        }
        let required = |flag: &str| {
            given
                .get(flag)
                .cloned()
                .ok_or(format!("{flag} is required"))
        };
        let list = |flag: &str| -> Result<Vec<String>, String> {
            Ok(required(flag)?.split(',').map(String::from).collect())
        };
        // client.py's optional lists: empty when left out, empty names skipped.
        let optional_list = |flag: &str| -> Vec<String> {
            given.get(flag).map_or(Vec::new(), |v| {
                v.split(',')
                    .filter(|k| !k.is_empty())
                    .map(String::from)
                    .collect()
            })
        };
        let number = |flag: &str, default: Option<f64>| match (given.get(flag), default) {
            (Some(v), _) => v.parse::<f64>().map_err(|e| format!("{flag} {v}: {e}")),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(format!("{flag} is required")),
        };
        Ok(Args {
            name: required("--name")?,
            // Python's LockClient.from_sentinel takes (host, port) pairs; this library takes URLs.
            sentinels: list("--sentinels")?
                .into_iter()
                .map(|address: String| format!("redis://{address}/"))
                .collect(),
            master: given
                .get("--master")
                .cloned()
                .unwrap_or_else(|| "lockmaster".into()),
            plain: list("--plain")?,
            acked: list("--acked")?,
            semaphores: optional_list("--semaphores"),
            limit: match given.get("--limit") {
                Some(v) => v.parse().map_err(|e| format!("--limit {v}: {e}"))?,
                None => 2,
            },
            elections: optional_list("--elections"),
            acked_elections: optional_list("--acked-elections"),
            secs: number("--secs", None)?,
            seed: match given.get("--seed") {
                Some(v) => v.parse().map_err(|e| format!("--seed {v}: {e}"))?,
                None => 0,
            },
            lease: number("--lease", Some(4.0))?,
            out: required("--out")?,
        })
    }
}

/// A generator seeded by `text` (client.py seeds Python's `random.Random` with
/// `"<seed>:<name>"`; the draws differ between the languages, the seeding is as stable): FNV-1a.
fn seeded(text: &str) -> StdRng {
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    StdRng::seed_from_u64(hash)
}

/// The library's client, retried until the Sentinels answer (they may be cut off at the start)
/// or the run is over.
async fn connect(args: &Args, deadline: f64) -> LockClient {
    loop {
        let built = match LockClient::sentinel_builder(args.sentinels.clone(), &args.master) {
            Ok(builder) => {
                builder
                    .command_timeout(COMMAND_TIMEOUT)
                    .failover_timeout(FAILOVER_TIMEOUT)
                    .build()
                    .await
            }
            Err(e) => Err(e),
        };
        match built {
            Ok(client) => return client,
            Err(e) => {
                if monotonic_secs() > deadline {
                    eprintln!("no master found through the Sentinels: {e}");
                    std::process::exit(1);
                }
                tokio::time::sleep(CONNECT_RETRY).await;
            }
        }
    }
}

/// Records the hold's loss as a `lost` line when the library reports it, until `released`
/// fires. client.py's `on_lost` is a callback of the handle, and writes the token of the key's
/// last grant; this library reports a loss per guard (`lost()`), so the line has the token of
/// the very hold that was lost.
fn watch_for_loss(history: Arc<History>, key: String, hold: &Held) -> oneshot::Sender<()> {
    let (released, mut on_release) = oneshot::channel::<()>();
    let watch = hold.watch();
    let token = hold.token();
    tokio::spawn(async move {
        tokio::select! {
            // A loss reported before (or while) the release was answered is still recorded.
            biased;
            reason = watch.lost() => {
                let now = monotonic_secs();
                history.record(Record {
                    op: "lost",
                    key: &key,
                    invoke: now,
                    complete: now,
                    outcome: Outcome::Info,
                    token: Some(token),
                    entry: None,
                    error: ErrorField::Text(reason_word(reason)),
                });
            }
            // lost() never resolves after a release: the watcher ends with the hold.
            _ = &mut on_release => {}
        }
    });
    released
}

/// What a round holds: a lock's (or a permit's) guard, or a leadership, whose epoch is its
/// token, whose fenced writes are the leader's heartbeats and whose resignation is its release
/// (client.py's `Term`).
enum Held {
    Guard(LockGuard),
    Leader(Leadership),
}

impl Held {
    fn token(&self) -> u64 {
        match self {
            Held::Guard(guard) => guard.token(),
            Held::Leader(leadership) => leadership.epoch(),
        }
    }

    fn watch(&self) -> LostWatch {
        match self {
            Held::Guard(guard) => guard.watch(),
            Held::Leader(leadership) => leadership.watch(),
        }
    }

    async fn fenced(&self, cmd: &redis::Cmd) -> Result<redis::Value, LockError> {
        match self {
            Held::Guard(guard) => guard.fenced(cmd).await,
            Held::Leader(leadership) => leadership.fenced(cmd).await,
        }
    }

    async fn release(&mut self) -> Result<Release, LockError> {
        match self {
            Held::Guard(guard) => guard.release().await,
            Held::Leader(leadership) => leadership.resign().await,
        }
    }
}

/// What a round acquires: a lock or semaphore handle, or an election (client.py's
/// `Candidacy`: acquiring is campaigning).
enum Handle {
    Lock(Lock),
    Election(Election),
}

impl Handle {
    async fn acquire(&self) -> Result<Held, LockError> {
        match self {
            Handle::Lock(lock) => lock.acquire().await.map(Held::Guard),
            Handle::Election(election) => election.campaign().await.map(Held::Leader),
        }
    }

    /// The pauses before each fenced write of a round (client.py's `lock_pauses` and
    /// `heartbeat_pauses`): a lock's or permit's two writes, at once and after a short pause,
    /// or now and then a long one (a holder that dawdles past its lease: a slow step, a GC
    /// pause; with the watchdog renewing it is still the holder, unless a fault cut it off
    /// meanwhile, and then its second write must be refused, not land after a newer
    /// holder's); a leader's heartbeats, one at once then one every `HEARTBEAT_SECS`, the last
    /// after a long pause in `LONG_HOLD_SHARE` of the terms.
    fn pauses(&self, rng: &mut StdRng) -> Vec<f64> {
        match self {
            Handle::Lock(_) => {
                let dawdle = rng.gen_bool(LONG_HOLD_SHARE);
                vec![
                    0.0,
                    rng.gen_range(if dawdle {
                        LONG_HOLD_SECS
                    } else {
                        SHORT_HOLD_SECS
                    }),
                ]
            }
            Handle::Election(_) => {
                let beats = rng.gen_range(HEARTBEATS);
                let mut pauses = vec![0.0];
                pauses.extend((0..beats).map(|_| rng.gen_range(HEARTBEAT_SECS)));
                if rng.gen_bool(LONG_HOLD_SHARE) {
                    if let Some(last) = pauses.last_mut() {
                        *last = rng.gen_range(LONG_HOLD_SECS);
                    }
                }
                pauses
            }
        }
    }
}

/// One round: acquire, a fenced write after each of `pauses`, release.
async fn hold_and_write(
    history: &Arc<History>,
    handle: &Handle,
    key: &str,
    pauses: Vec<f64>,
    counter: &mut u64,
) {
    let invoke = monotonic_secs();
    let mut guard = match handle.acquire().await {
        Ok(guard) => guard,
        Err(e) => {
            history.record(Record {
                op: "acquire",
                key,
                invoke,
                complete: monotonic_secs(),
                outcome: Outcome::of(&e),
                token: None,
                entry: None,
                error: ErrorField::Text(error_text(&e)),
            });
            return;
        }
    };
    let token = guard.token();
    history.record(Record {
        op: "acquire",
        key,
        invoke,
        complete: monotonic_secs(),
        outcome: Outcome::Ok,
        token: Some(token),
        entry: None,
        error: ErrorField::Omitted,
    });
    let released = watch_for_loss(history.clone(), key.to_string(), &guard);
    let log = format!("{key}:log");
    for pause in pauses {
        tokio::time::sleep(Duration::from_secs_f64(pause)).await;
        *counter += 1;
        let entry = format!("{}:{token}:{counter}", history.process);
        let invoke = monotonic_secs();
        let written = guard
            .fenced(redis::cmd("RPUSH").arg(&log).arg(&entry))
            .await;
        let (outcome, error) = match written {
            Ok(_) => (Outcome::Ok, ErrorField::Null),
            Err(e @ (LockError::Fenced { .. } | LockError::NotHeld { .. })) => {
                (Outcome::Fail, ErrorField::Text(error_text(&e)))
            }
            Err(e) => (Outcome::of(&e), ErrorField::Text(error_text(&e))),
        };
        history.record(Record {
            op: "write",
            key,
            invoke,
            complete: monotonic_secs(),
            outcome,
            token: Some(token),
            entry: Some(&entry),
            error,
        });
    }
    let invoke = monotonic_secs();
    let (outcome, error) = match guard.release().await {
        Ok(_) => (Outcome::Ok, ErrorField::Null),
        Err(e) => (Outcome::of(&e), ErrorField::Text(error_text(&e))),
    };
    history.record(Record {
        op: "release",
        key,
        invoke,
        complete: monotonic_secs(),
        outcome,
        token: Some(token),
        entry: None,
        error,
    });
    let _ = released.send(());
}

#[tokio::main]
async fn main() {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(why) => {
            eprintln!("partition_client: {why} (see the example's doc comment)");
            std::process::exit(2);
        }
    };
    let end = monotonic_secs() + args.secs;
    let file = match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.out)
    {
        Ok(file) => file,
        Err(e) => {
            eprintln!("partition_client: {}: {e}", args.out);
            std::process::exit(2);
        }
    };
    let history = Arc::new(History {
        file: Mutex::new(file),
        process: args.name.clone(),
    });
    let mut rng = seeded(&format!("{}:{}", args.seed, args.name));
    let client = connect(&args, end).await;

    // Sorted by key, as client.py draws from sorted(handles).
    let mut handles: BTreeMap<String, Handle> = BTreeMap::new();
    let lease = Duration::from_secs_f64(args.lease);
    for key in &args.plain {
        let lock = client.lock(key).lease(lease).wait_timeout(WAIT_TIMEOUT);
        handles.insert(key.clone(), Handle::Lock(lock));
    }
    for key in &args.acked {
        let lock = client
            .lock(key)
            .lease(lease)
            .wait_timeout(WAIT_TIMEOUT)
            .replicas(1, REPLICAS_TIMEOUT);
        handles.insert(key.clone(), Handle::Lock(lock));
    }
    for key in &args.semaphores {
        let permit = client
            .semaphore(key, args.limit)
            .lease(lease)
            .wait_timeout(WAIT_TIMEOUT);
        handles.insert(key.clone(), Handle::Lock(permit));
    }
    for key in &args.elections {
        let election = client.election(key).lease(lease).wait_timeout(WAIT_TIMEOUT);
        handles.insert(key.clone(), Handle::Election(election));
    }
    for key in &args.acked_elections {
        let election = client
            .election(key)
            .lease(lease)
            .wait_timeout(WAIT_TIMEOUT)
            .replicas(1, REPLICAS_TIMEOUT);
        handles.insert(key.clone(), Handle::Election(election));
    }
    let keys: Vec<&String> = handles.keys().collect();
    let mut counter = 0u64;
    let mut rounds = 0u64;
    while monotonic_secs() < end {
        let key = keys[rng.gen_range(0..keys.len())];
        let handle = &handles[key];
        let pauses = handle.pauses(&mut rng);
        hold_and_write(&history, handle, key, pauses, &mut counter).await;
        rounds += 1;
        tokio::time::sleep(Duration::from_secs_f64(rng.gen_range(0.0..0.05))).await;
    }
    eprintln!("{}: {rounds} rounds", args.name);
}
