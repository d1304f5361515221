//! The Rust side of the failover test: contending holders on a Sentinel-monitored master, each
//! acknowledged hold written as one JSON line for the checker.
//!
//! ```sh
//! cargo run -p redis-lock-client --example failover_driver -- \
//!     --sentinels 127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381 --master mymaster \
//!     --exclusive fx --shared fs --semaphore fm --limit 2 --election fe [--ephemeral fp] \
//!     --replicas 1 --duration 60 --output holds.jsonl [--lease-ms 3000] [--wait-ms 5000]
//! ```
//!
//! Holders: three on the exclusive key; two readers and a writer on the shared key (the writer's
//! holds are `exclusive` on that key); `limit + 1` on the semaphore; three candidates of the
//! election (`EPHEMERAL`, the default); with `--ephemeral`, three on that key with `EPHEMERAL`
//! exclusive holds (kind `ephemeral`). Each takes its hold (`acquire`, waiting at most
//! `--wait-ms`; `campaign` for the election) with `replicas(1, 500 ms)` when `--replicas 1`,
//! keeps it a random 100 to 1,500 ms (fenced by nothing: the checker looks at the intervals),
//! then releases it, and starts again. The lines (wall-clock epoch milliseconds):
//!
//! ```text
//! {"lib":"rust","replicas":1,"key":"fx","kind":"exclusive","limit":null,"owner":"…","token":123,
//!  "asked_ms":…,"start_ms":…,"end_ms":…,"end":"released"}   one per acknowledged hold
//! {"lib":"rust","event":"acquire-error","replicas":1,"key":"fx","kind":"exclusive","owner":"…",
//!  "at_ms":…,"error":"…"}                              every acquire that answered an error
//! {"lib":"rust","event":"unanswered","replicas":1,"key":"fx","kind":"exclusive","owner":"…",
//!  "start_ms":…}                                       an acquire still unanswered at the end
//! ```
//!
//! `asked_ms` is when the acquire (campaign) was called, `start_ms` when the grant was handed to the application (after the replicas'
//! acknowledgement), `end_ms` when the application stopped believing it held: the release sent
//! (`released`), the loss reported (`lost:<reason>`), or the run's end (`run-end`). After the
//! run's end the driver waits up to `--wait-ms` + 20 s for the acquires still on their way.

#[path = "support/json.rs"]
mod json;
use json::quoted;

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::{Rng, SeedableRng};
use redis_lock_client::{LockClient, LockError, LostReason};
use tokio::time::Instant;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Exclusive,
    Shared,
    Permit(u32),
    Ephemeral,
    Leader,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::Exclusive => "exclusive",
            Kind::Shared => "shared",
            Kind::Permit(_) => "permit",
            Kind::Ephemeral => "ephemeral",
            Kind::Leader => "leader",
        }
    }

    fn limit(self) -> String {
        match self {
            Kind::Permit(n) => n.to_string(),
            _ => "null".into(),
        }
    }
}

/// Where the lines go, and the acquires on their way.
struct Out {
    file: Mutex<std::fs::File>,
    replicas: u32,
    pending: Mutex<HashMap<u64, (String, Kind, String, u64)>>,
}

impl Out {
    fn line(&self, line: String) {
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(file, "{line}");
        let _ = file.flush();
    }

    fn head(&self, key: &str, kind: Kind) -> String {
        format!(
            "\"lib\":\"rust\",\"replicas\":{},\"key\":{},\"kind\":\"{}\"",
            self.replicas,
            quoted(key),
            kind.word()
        )
    }

    /// `times`: the acquire sent, the grant handed out, the belief ended.
    fn hold(&self, key: &str, kind: Kind, owner: &str, token: u64, times: [u64; 3], end: &str) {
        let [asked, start, end_ms] = times;
        self.line(format!(
            "{{{},\"limit\":{},\"owner\":{},\"token\":{token},\"asked_ms\":{asked},\"start_ms\":{start},\"end_ms\":{end_ms},\"end\":{}}}",
            self.head(key, kind),
            kind.limit(),
            quoted(owner),
            quoted(end)
        ));
    }

    fn error(&self, key: &str, kind: Kind, owner: &str, error: &LockError) {
        self.line(format!(
            "{{\"lib\":\"rust\",\"event\":\"acquire-error\",{},\"owner\":{},\"at_ms\":{},\"error\":{}}}",
            self.head(key, kind).trim_start_matches("\"lib\":\"rust\","),
            quoted(owner),
            now_ms(),
            quoted(&error.to_string())
        ));
    }
}

/// A holder's handle.
enum Handle {
    Lock(redis_lock_client::Lock),
    Election(redis_lock_client::Election),
}

/// A guard of any kind, as the holder needs it.
enum Held {
    Lock(redis_lock_client::LockGuard),
    Leader(redis_lock_client::Leadership),
}

impl Held {
    fn token(&self) -> u64 {
        match self {
            Held::Lock(g) => g.token(),
            Held::Leader(l) => l.epoch(),
        }
    }

    fn lost(&self) -> impl std::future::Future<Output = LostReason> + Send + 'static {
        let lost = match self {
            Held::Lock(g) => g.watch(),
            Held::Leader(l) => l.watch(),
        };
        async move { lost.lost().await }
    }

    async fn release(&mut self) {
        let _ = match self {
            Held::Lock(g) => g.release().await,
            Held::Leader(l) => l.resign().await,
        };
    }
}

struct Settings {
    lease: Duration,
    wait: Duration,
    replicas: u32,
    until: Instant,
}

async fn holder(
    client: LockClient,
    key: String,
    kind: Kind,
    settings: Arc<Settings>,
    out: Arc<Out>,
    seed: u64,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let acks = (settings.replicas > 0).then_some((settings.replicas, Duration::from_millis(500)));
    let handle = match kind {
        Kind::Leader => {
            let e = client
                .election(&key)
                .lease(settings.lease)
                .wait_timeout(settings.wait);
            Handle::Election(match acks {
                Some((n, t)) => e.replicas(n, t),
                None => e,
            })
        }
        _ => {
            let lock = match kind {
                Kind::Shared => client.read_lock(&key),
                Kind::Permit(n) => client.semaphore(&key, n),
                Kind::Ephemeral => client.lock(&key).ephemeral(),
                _ => client.lock(&key),
            };
            let lock = lock.lease(settings.lease).wait_timeout(settings.wait);
            Handle::Lock(match acks {
                Some((n, t)) => lock.replicas(n, t),
                None => lock,
            })
        }
    };
    let owner = match &handle {
        Handle::Election(e) => e.candidate().to_string(),
        Handle::Lock(l) => l.owner().to_string(),
    };
    let mut attempt = 0u64;
    while Instant::now() < settings.until {
        attempt += 1;
        let id = seed * 1_000_000 + attempt;
        let started = now_ms();
        out.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, (key.clone(), kind, owner.clone(), started));
        let result = match &handle {
            Handle::Election(e) => e.campaign().await.map(Held::Leader),
            Handle::Lock(l) => l.acquire().await.map(Held::Lock),
        };
        out.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        let mut held = match result {
            Ok(held) => held,
            Err(LockError::Timeout { .. }) => continue,
            Err(e) => {
                out.error(&key, kind, &owner, &e);
                tokio::time::sleep(Duration::from_millis(rng.gen_range(50..200))).await;
                continue;
            }
        };
        let start = now_ms();
        let token = held.token();
        let keep = Duration::from_millis(rng.gen_range(100..1_500));
        let run_end = tokio::time::sleep_until(settings.until);
        let end = tokio::select! {
            reason = held.lost() => format!("lost:{reason:?}"),
            _ = tokio::time::sleep(keep) => "released".to_string(),
            _ = run_end => "run-end".to_string(),
        };
        let end_ms = now_ms();
        out.hold(&key, kind, &owner, token, [started, start, end_ms], &end);
        held.release().await;
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..50))).await;
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let need = |name: &str| {
        arg(&args, name).unwrap_or_else(|| {
            eprintln!("missing {name}: see the example's doc comment");
            std::process::exit(2)
        })
    };
    let sentinels: Vec<String> = need("--sentinels")
        .split(',')
        .map(|a| {
            if a.starts_with("redis://") {
                a.to_string()
            } else {
                format!("redis://{a}/")
            }
        })
        .collect();
    let master = need("--master");
    let limit: u32 = need("--limit").parse().unwrap_or(2);
    let replicas: u32 = need("--replicas").parse().unwrap_or(0);
    let duration = Duration::from_secs(need("--duration").parse().unwrap_or(30));
    let lease = Duration::from_millis(
        arg(&args, "--lease-ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or(3_000),
    );
    let wait = Duration::from_millis(
        arg(&args, "--wait-ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or(5_000),
    );
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(need("--output"))
        .map_err(|e| LockError::Connection(e.into()))?;
    let out = Arc::new(Out {
        file: Mutex::new(file),
        replicas,
        pending: Mutex::new(HashMap::new()),
    });
    let settings = Arc::new(Settings {
        lease,
        wait,
        replicas,
        until: Instant::now() + duration,
    });
    // Two clients: holders of one key on both contend across connections and owners.
    let clients = [
        LockClient::sentinel(sentinels.clone(), &master).await?,
        LockClient::sentinel(sentinels, &master).await?,
    ];
    let mut plan: Vec<(String, Kind)> = Vec::new();
    let exclusive = need("--exclusive");
    let shared = need("--shared");
    let semaphore = need("--semaphore");
    let election = need("--election");
    plan.extend((0..3).map(|_| (exclusive.clone(), Kind::Exclusive)));
    plan.extend((0..2).map(|_| (shared.clone(), Kind::Shared)));
    plan.push((shared, Kind::Exclusive));
    plan.extend((0..=limit).map(|_| (semaphore.clone(), Kind::Permit(limit))));
    plan.extend((0..3).map(|_| (election.clone(), Kind::Leader)));
    if let Some(ephemeral) = arg(&args, "--ephemeral") {
        plan.extend((0..3).map(|_| (ephemeral.clone(), Kind::Ephemeral)));
    }
    let mut tasks = Vec::new();
    for (n, (key, kind)) in plan.into_iter().enumerate() {
        let client = clients[n % clients.len()].clone();
        tasks.push(tokio::spawn(holder(
            client,
            key,
            kind,
            settings.clone(),
            out.clone(),
            n as u64 + 1,
        )));
    }
    // The run's end, then the acquires still on their way get a grace period.
    tokio::time::sleep_until(settings.until).await;
    let grace = Instant::now() + wait + Duration::from_secs(20);
    for task in tasks {
        // One still waiting is reported below.
        let left = grace.saturating_duration_since(Instant::now());
        let _ = tokio::time::timeout(left, task).await;
    }
    let pending = out
        .pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    for (key, kind, owner, started) in pending.values() {
        out.line(format!(
            "{{\"lib\":\"rust\",\"event\":\"unanswered\",{},\"owner\":{},\"start_ms\":{started}}}",
            out.head(key, *kind).trim_start_matches("\"lib\":\"rust\","),
            quoted(owner)
        ));
    }
    std::process::exit(0);
}
