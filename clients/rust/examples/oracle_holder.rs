//! A lock holder driven by a seeded random plan, as the oracle test (`tests/oracle.rs`) runs it:
//! in tasks of the test's own runtimes, and as this process of its own, which the test kills
//! (`SIGKILL`) and pauses (`SIGSTOP`). It takes and leaves holds at random (acquire, try_acquire,
//! an acquire given up on mid-wait, re-entry through the same handle, release, a guard dropped
//! without a release), writes through each hold's fence (`RPUSH {key}:writes <token>`, a shared
//! hold reads), and prints what it believes, one line per event, with the wall-clock time in
//! microseconds:
//!
//! ```text
//! C <client id> <pid>                          the client's id (the prefix of its owners)
//! G <us> <key> <owner> <token> <mode> <asked>  a guard handed out (mode: write, read, permit;
//!                                              asked: when its acquire began, in us)
//! W <us> <owner> <token> <ok|fenced|notheld|conn|err>   a fenced command's outcome
//! L <us> <owner> <token> <reason>              the guard reported its hold lost
//! E <us> <owner> <token> <released|dropped>    the application let go of the hold
//! A <us> <key> <busy|timeout|cancelled|error> <text>   an acquire that got no guard
//! ```
//!
//! ```sh
//! cargo run -p redis-lock-client --example oracle_holder -- SEED LEASE_MS SECS URL KEY:MODE...
//! #   URL: redis://127.0.0.1:6379/ or cluster:redis://127.0.0.1:7000/,redis://...
//! #   KEY:MODE: o1:exclusive, sh:rw (readers and writers), sem:permit:2
//! ```

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis_lock_client::{Lock, LockClient, LockError, LockGuard};
use tokio::time::Instant;

/// Wall-clock microseconds: one clock for the test and its child processes.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// How a key is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// One holder at a time; every holder writes.
    Exclusive,
    /// Readers (shared holds, fenced reads) and writers (exclusive holds, fenced writes).
    ReadWrite,
    /// A semaphore of `n` permits; every holder writes.
    Permit(u32),
}

#[derive(Debug, Clone)]
pub struct KeySpec {
    pub name: String,
    pub kind: KeyKind,
}

impl KeySpec {
    /// `o1:exclusive`, `sh:rw`, `sem:permit:2`.
    pub fn parse(text: &str) -> Option<KeySpec> {
        let mut parts = text.split(':');
        let name = parts.next()?.to_string();
        let kind = match (parts.next()?, parts.next()) {
            ("exclusive", None) => KeyKind::Exclusive,
            ("rw", None) => KeyKind::ReadWrite,
            ("permit", Some(n)) => KeyKind::Permit(n.parse().ok()?),
            _ => return None,
        };
        Some(KeySpec { name, kind })
    }

    pub fn text(&self) -> String {
        match self.kind {
            KeyKind::Exclusive => format!("{}:exclusive", self.name),
            KeyKind::ReadWrite => format!("{}:rw", self.name),
            KeyKind::Permit(n) => format!("{}:permit:{n}", self.name),
        }
    }

    /// The list the key's holders write their tokens to (it shares the key's slot).
    pub fn writes(&self) -> String {
        writes_key(&self.name)
    }
}

pub fn writes_key(key: &str) -> String {
    format!("{{{key}}}:writes")
}

/// What a hold does under its fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    Write,
    Read,
    Permit,
}

impl Mode {
    pub fn word(self) -> &'static str {
        match self {
            Mode::Write => "write",
            Mode::Read => "read",
            Mode::Permit => "permit",
        }
    }

    pub fn parse(word: &str) -> Option<Mode> {
        Some(match word {
            "write" => Mode::Write,
            "read" => Mode::Read,
            "permit" => Mode::Permit,
            _ => return None,
        })
    }
}

/// What a holder believes, as it happens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    Client {
        id: String,
        pid: u32,
    },
    /// A guard handed out: the server granted it between `asked` (when the acquire began) and
    /// the event's time.
    Granted {
        key: String,
        owner: String,
        token: u64,
        mode: Mode,
        asked: u64,
    },
    Wrote {
        owner: String,
        token: u64,
        outcome: String,
    },
    Lost {
        owner: String,
        token: u64,
        reason: String,
    },
    Ended {
        owner: String,
        token: u64,
        how: String,
    },
    NoGuard {
        key: String,
        outcome: String,
        text: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub t_us: u64,
    pub note: Note,
}

impl Event {
    pub fn now(note: Note) -> Event {
        Event {
            t_us: now_us(),
            note,
        }
    }

    pub fn line(&self) -> String {
        let t = self.t_us;
        match &self.note {
            Note::Client { id, pid } => format!("C {id} {pid}"),
            Note::Granted {
                key,
                owner,
                token,
                mode,
                asked,
            } => format!("G {t} {key} {owner} {token} {} {asked}", mode.word()),
            Note::Wrote {
                owner,
                token,
                outcome,
            } => format!("W {t} {owner} {token} {outcome}"),
            Note::Lost {
                owner,
                token,
                reason,
            } => format!("L {t} {owner} {token} {reason}"),
            Note::Ended { owner, token, how } => format!("E {t} {owner} {token} {how}"),
            Note::NoGuard { key, outcome, text } => {
                format!("A {t} {key} {outcome} {}", text.replace('\n', " "))
            }
        }
    }

    pub fn parse(line: &str) -> Option<Event> {
        let f: Vec<&str> = line.split(' ').collect();
        let t = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
        let s = |i: usize| f.get(i).map(|v| v.to_string());
        Some(match *f.first()? {
            "C" => Event {
                t_us: now_us(),
                note: Note::Client {
                    id: s(1)?,
                    pid: s(2)?.parse().ok()?,
                },
            },
            "G" => Event {
                t_us: t(1)?,
                note: Note::Granted {
                    key: s(2)?,
                    owner: s(3)?,
                    token: t(4)?,
                    mode: Mode::parse(f.get(5)?)?,
                    asked: t(6)?,
                },
            },
            "W" => Event {
                t_us: t(1)?,
                note: Note::Wrote {
                    owner: s(2)?,
                    token: t(3)?,
                    outcome: s(4)?,
                },
            },
            "L" => Event {
                t_us: t(1)?,
                note: Note::Lost {
                    owner: s(2)?,
                    token: t(3)?,
                    reason: s(4)?,
                },
            },
            "E" => Event {
                t_us: t(1)?,
                note: Note::Ended {
                    owner: s(2)?,
                    token: t(3)?,
                    how: s(4)?,
                },
            },
            "A" => Event {
                t_us: t(1)?,
                note: Note::NoGuard {
                    key: s(2)?,
                    outcome: s(3)?,
                    text: f.get(4..).map(|r| r.join(" ")).unwrap_or_default(),
                },
            },
            _ => return None,
        })
    }
}

/// Where a holder's events go.
pub type Sink = Arc<dyn Fn(Event) + Send + Sync>;

/// A holder's plan: its seed, the lease of its holds, its keys, when to stop.
#[derive(Clone)]
pub struct Plan {
    pub seed: u64,
    pub lease: Duration,
    pub keys: Vec<KeySpec>,
    pub until: Instant,
    /// Whether an acquire may be given up on mid-wait (its future dropped).
    pub cancel: bool,
    /// How many of its handles take `EPHEMERAL` holds (0.0 to 1.0).
    pub ephemeral: f64,
}

/// The outcome word of a fenced command.
pub fn outcome<T>(result: &Result<T, LockError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(LockError::Fenced { .. }) => "fenced",
        Err(LockError::NotHeld { .. }) => "notheld",
        Err(LockError::Connection(_)) => "conn",
        Err(_) => "err",
    }
}

/// The fenced command a hold of `mode` runs on `key`.
pub fn fenced_cmd(key: &KeySpec, mode: Mode, token: u64) -> redis::Cmd {
    match mode {
        Mode::Read => {
            let mut cmd = redis::cmd("LLEN");
            cmd.arg(key.writes());
            cmd
        }
        Mode::Write | Mode::Permit => {
            let mut cmd = redis::cmd("RPUSH");
            cmd.arg(key.writes()).arg(token);
            cmd
        }
    }
}

/// A handle of the holder's, one per (key, mode), kept for the whole run: every acquire after
/// the first is a re-acquire through the same handle.
fn handle<'a>(
    handles: &'a mut HashMap<(usize, Mode), Lock>,
    client: &LockClient,
    plan: &Plan,
    rng: &mut StdRng,
    index: usize,
    mode: Mode,
) -> &'a Lock {
    handles.entry((index, mode)).or_insert_with(|| {
        let key = &plan.keys[index];
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
}

/// Picks a key and what to do with it.
pub fn pick(rng: &mut StdRng, keys: &[KeySpec]) -> (usize, Mode) {
    let index = rng.gen_range(0..keys.len());
    let mode = match keys[index].kind {
        KeyKind::Exclusive => Mode::Write,
        KeyKind::Permit(_) => Mode::Permit,
        KeyKind::ReadWrite if rng.gen_bool(0.6) => Mode::Read,
        KeyKind::ReadWrite => Mode::Write,
    };
    (index, mode)
}

/// Reports `guard`'s loss to `sink` until `ended` fires.
fn watch_loss(guard: &LockGuard, sink: &Sink) -> tokio::sync::oneshot::Sender<()> {
    let (ended, mut ended_rx) = tokio::sync::oneshot::channel::<()>();
    let lost = guard.lost();
    let (owner, token) = (guard.owner().to_string(), guard.token());
    let sink = sink.clone();
    tokio::spawn(async move {
        tokio::select! {
            reason = lost => sink(Event::now(Note::Lost { owner, token, reason: format!("{reason:?}") })),
            _ = &mut ended_rx => {}
        }
    });
    ended
}

/// Runs the plan on `client` until `plan.until`.
pub async fn run(client: LockClient, plan: Plan, sink: Sink) {
    let mut rng = StdRng::seed_from_u64(plan.seed);
    let mut handles: HashMap<(usize, Mode), Lock> = HashMap::new();
    let lease = plan.lease;
    while Instant::now() < plan.until {
        let (index, mode) = pick(&mut rng, &plan.keys);
        let key = plan.keys[index].clone();
        let lock = handle(&mut handles, &client, &plan, &mut rng, index, mode).clone();
        let roll = rng.gen_range(0..10);
        let asked = now_us();
        let no_guard = |outcome: &str, text: String| {
            sink(Event::now(Note::NoGuard {
                key: key.name.clone(),
                outcome: outcome.to_string(),
                text,
            }))
        };
        let result = if roll < 3 {
            lock.try_acquire().await
        } else if roll < 8 || !plan.cancel {
            // Sometimes longer than a lease: a grant after a long wait is confirmed first.
            let wait = lease.mul_f64(rng.gen_range(0.05..2.0));
            lock.clone().wait_timeout(wait).acquire().await.map(Some)
        } else {
            // Given up on mid-wait: the future is dropped, and the server forgets the waiter.
            let patience = Duration::from_millis(rng.gen_range(10..400));
            match tokio::time::timeout(patience, lock.acquire()).await {
                Ok(result) => result.map(Some),
                Err(_) => {
                    no_guard("cancelled", String::new());
                    continue;
                }
            }
        };
        let mut guard = match result {
            Ok(Some(guard)) => guard,
            Ok(None) => {
                no_guard("busy", String::new());
                tokio::time::sleep(Duration::from_millis(rng.gen_range(0..60))).await;
                continue;
            }
            Err(LockError::Timeout { .. }) => {
                no_guard("timeout", String::new());
                continue;
            }
            Err(e) => {
                no_guard("error", e.to_string());
                tokio::time::sleep(Duration::from_millis(rng.gen_range(10..100))).await;
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
        let ended = watch_loss(&guard, &sink);
        // Re-entry through the same handle: the same hold, one more guard.
        let mut again = if rng.gen_bool(0.15) {
            match lock.try_acquire().await {
                Ok(Some(g)) if g.token() == token => Some(g),
                Ok(Some(g)) => {
                    // Another token: the first hold was lost and replaced (reported by it).
                    drop(g);
                    None
                }
                _ => None,
            }
        } else {
            None
        };
        // Hold for a while (sometimes past a lease: the watchdog renews), writing under the fence.
        let writes = rng.gen_range(0..5);
        for _ in 0..writes {
            tokio::time::sleep(lease.mul_f64(rng.gen_range(0.0..0.45))).await;
            let result = guard
                .fenced::<redis::Value>(&fenced_cmd(&key, mode, token))
                .await;
            sink(Event::now(Note::Wrote {
                owner: owner.clone(),
                token,
                outcome: outcome(&result).to_string(),
            }));
            if matches!(
                result,
                Err(LockError::Fenced { .. } | LockError::NotHeld { .. })
            ) {
                break;
            }
        }
        if let Some(mut g) = again.take() {
            let _ = g.release().await;
        }
        let how = if rng.gen_bool(0.65) {
            "released"
        } else {
            "dropped"
        };
        sink(Event::now(Note::Ended {
            owner,
            token,
            how: how.to_string(),
        }));
        if how == "released" {
            let _ = guard.release().await;
        } else {
            drop(guard);
        }
        let _ = ended.send(());
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..40))).await;
    }
}

/// A client of `target`: a URL, or `cluster:` and the URLs of some of its nodes.
pub async fn connect(target: &str) -> Result<LockClient, LockError> {
    match target.strip_prefix("cluster:") {
        Some(urls) => LockClient::cluster(urls.split(',')).await,
        None => LockClient::open(target).await,
    }
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(seed), Some(lease), Some(secs), Some(target)) = (
        args.first().and_then(|s| s.parse::<u64>().ok()),
        args.get(1).and_then(|s| s.parse::<u64>().ok()),
        args.get(2).and_then(|s| s.parse::<u64>().ok()),
        args.get(3),
    ) else {
        eprintln!("usage: oracle_holder SEED LEASE_MS SECS URL KEY:MODE...");
        std::process::exit(2);
    };
    let keys: Option<Vec<KeySpec>> = args.get(4..).map(|specs| {
        specs
            .iter()
            .filter_map(|s| KeySpec::parse(s))
            .collect::<Vec<_>>()
    });
    let keys = keys.filter(|k| !k.is_empty()).unwrap_or_else(|| {
        eprintln!("no KEY:MODE");
        std::process::exit(2)
    });
    let client = connect(target).await?;
    let out: Sink = Arc::new(|event: Event| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", event.line());
        let _ = out.flush();
    });
    out(Event::now(Note::Client {
        id: client.id().to_string(),
        pid: std::process::id(),
    }));
    let plan = Plan {
        seed,
        lease: Duration::from_millis(lease),
        keys,
        until: Instant::now() + Duration::from_secs(secs),
        cancel: true,
        // The oracle tells its processes (ORACLE_EPHEMERAL): the same share as its tasks.
        ephemeral: std::env::var("ORACLE_EPHEMERAL")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.3),
    };
    run(client, plan, out).await;
    Ok(())
}
