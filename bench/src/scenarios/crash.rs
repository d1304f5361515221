//! Scenario 8, holder crashes: how long after a holder dies the next waiter gets the lock.
//!
//! The holder is a `redis-cli` process that takes the lock and is then killed with SIGKILL, so
//! the kernel closes its connection the way a crashed service's would; a waiter is already
//! blocked (module: `WAIT`; Redisson: subscribed, waiting the ttl). Measured: SIGKILL sent →
//! the waiter's grant received.
//!
//! - module, `EPHEMERAL` hold: ends when its connection closes (docs/lock-family.md);
//! - module, plain lease: the waiter waits the lease out;
//! - Redisson `RLock` with a lease (what its watchdog leaves behind when its process dies).

use std::time::{Duration, Instant};

use lock_testkit::{Cli, Server};

use crate::drivers::{self, owner_id, unlock_channel, Approach, Scripts, LEASE_MS};
use crate::format::fmt_num;
use crate::resp::{RawConn, Resp};
use crate::stats::{max, percentile};
use crate::Bench;

/// How long the ephemeral sample's waiter waits: if the hold does not end with its connection,
/// the waiter gives up after this instead of waiting out the 30 s lease.
const EPHEMERAL_WAIT_MS: u64 = 10_000;

/// How long the bench waits for a waiter to be queued / subscribed before killing the holder.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    ModuleEphemeral,
    ModuleLease,
    RedissonLease,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::ModuleEphemeral => "LOCK.* module, `EPHEMERAL` hold (waiter in `WAIT`)",
            Kind::ModuleLease => "LOCK.* module, plain lease (waiter in `WAIT`)",
            Kind::RedissonLease => {
                "Redisson RLock, lease (waiter subscribed, retries when the ttl passes)"
            }
        }
    }
}

pub struct Row {
    pub kind: Kind,
    /// The holder's lease (ms).
    pub lease_ms: u64,
    /// Death → grant, per sample (ms).
    pub samples: Vec<f64>,
    pub error: Option<String>,
}

pub struct Crash {
    pub rows: Vec<Row>,
}

pub fn run(bench: &Bench) -> Crash {
    let plan = &bench.plan;
    let server = crate::server::start(&bench.module, &Default::default());
    let scripts = Scripts::load(&server);

    bench.progress(&format!(
        "crash: {} EPHEMERAL holders killed",
        plan.crash_ephemeral_samples
    ));
    let mut ephemeral = Row {
        kind: Kind::ModuleEphemeral,
        lease_ms: LEASE_MS,
        samples: Vec::new(),
        error: None,
    };
    for i in 0..plan.crash_ephemeral_samples {
        match module_sample(&server, Kind::ModuleEphemeral, LEASE_MS, i) {
            Ok(ms) => ephemeral.samples.push(ms),
            Err(error) => {
                bench.progress(&format!("crash: EPHEMERAL: {error}"));
                ephemeral.error = Some(error);
                break;
            }
        }
    }

    // Every lease-based sample waits the lease out: run them all at once, on keys of their own.
    let lease = plan.crash_lease_ms;
    bench.progress(&format!(
        "crash: {} module and {} Redisson holders with a {lease} ms lease killed, in parallel",
        plan.crash_lease_samples, plan.crash_lease_samples
    ));
    let results: Vec<(Kind, Result<f64, String>)> = std::thread::scope(|scope| {
        let mut workers = Vec::new();
        for i in 0..plan.crash_lease_samples {
            let (server, scripts) = (&server, &scripts);
            workers.push(scope.spawn(move || {
                (
                    Kind::ModuleLease,
                    module_sample(server, Kind::ModuleLease, lease, 1000 + i),
                )
            }));
            workers.push(scope.spawn(move || {
                (
                    Kind::RedissonLease,
                    redisson_sample(server, scripts, lease, 2000 + i),
                )
            }));
        }
        workers
            .into_iter()
            .map(|w| w.join().expect("crash sample"))
            .collect()
    });
    let mut rows = vec![ephemeral];
    for kind in [Kind::ModuleLease, Kind::RedissonLease] {
        let mut row = Row {
            kind,
            lease_ms: lease,
            samples: Vec::new(),
            error: None,
        };
        for (k, result) in &results {
            match result {
                Ok(ms) if *k == kind => row.samples.push(*ms),
                Err(error) if *k == kind => row.error = Some(error.clone()),
                _ => {}
            }
        }
        rows.push(row);
    }
    Crash { rows }
}

/// A `redis-cli` holder (the kit's `Cli`): one command line, its one-line reply (redis-cli prints
/// nil as an empty line when its output is not a terminal).
fn cli_command(holder: &mut Cli, line: &str) -> Result<String, String> {
    holder
        .send(line)
        .map_err(|e| format!("write to redis-cli: {e}"))?;
    holder
        .reply(QUEUE_TIMEOUT)
        .map(|reply| reply.trim_end().to_string())
        .ok_or_else(|| format!("redis-cli did not answer {line:?} within {QUEUE_TIMEOUT:?}"))
}

/// Polls `ready` every millisecond until it holds or `QUEUE_TIMEOUT` passes.
fn wait_until(mut ready: impl FnMut() -> bool, what: &str) -> Result<(), String> {
    let deadline = Instant::now() + QUEUE_TIMEOUT;
    while !ready() {
        if Instant::now() > deadline {
            return Err(format!("{what} within {QUEUE_TIMEOUT:?}"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// One module sample: a redis-cli holder takes the key (`EPHEMERAL` or a plain `lease_ms`
/// lease), a waiter blocks in `WAIT`, the holder is killed. Returns death → grant in ms.
fn module_sample(server: &Server, kind: Kind, lease_ms: u64, index: usize) -> Result<f64, String> {
    let key = format!("crash:{kind:?}:{index}");
    let mut holder = Cli::start(server.port).map_err(|e| format!("spawn redis-cli: {e}"))?;
    let ephemeral = if kind == Kind::ModuleEphemeral {
        " EPHEMERAL"
    } else {
        ""
    };
    let reply = cli_command(
        &mut holder,
        &format!(
            "LOCK.ACQUIRE {key} {} {lease_ms}{ephemeral}",
            owner_id(1_000_000 + index)
        ),
    )?;
    if !reply.parse::<i64>().is_ok_and(|token| token > 0) {
        return Err(if reply.is_empty() {
            "the holder's LOCK.ACQUIRE was not granted".into()
        } else {
            reply
        });
    }
    let wait_ms = match kind {
        Kind::ModuleEphemeral => EPHEMERAL_WAIT_MS,
        _ => lease_ms + 10_000,
    };
    let mut waiter = RawConn::connect(server.address(0)).map_err(|e| e.to_string())?;
    let (owner, lease, wait) = (owner_id(index), LEASE_MS.to_string(), wait_ms.to_string());
    waiter
        .send(&[
            b"LOCK.ACQUIRE",
            key.as_bytes(),
            owner.as_bytes(),
            lease.as_bytes(),
            b"WAIT",
            wait.as_bytes(),
        ])
        .map_err(|e| e.to_string())?;
    let mut probe = crate::server::Probe::new(server);
    wait_until(|| probe.waiters_on(&key) >= 1, "the waiter was not queued")?;
    let died = Instant::now();
    holder.kill();
    let reply = waiter
        .read_within(Duration::from_millis(wait_ms) + QUEUE_TIMEOUT)
        .map_err(|e| e.to_string())?;
    let elapsed_ms = died.elapsed().as_secs_f64() * 1e3;
    match reply {
        Some(ref grant) if drivers::family::is_grant(grant) => Ok(elapsed_ms),
        Some(Resp::Bulk(None)) => Err(format!(
            "the waiter's WAIT {wait_ms} ms ran out: the hold outlived its holder's connection"
        )),
        Some(Resp::Error(error)) => Err(error),
        Some(other) => Err(format!("the waiter got {other:?}")),
        None => Err("the waiter got no reply".into()),
    }
}

/// One Redisson sample: a redis-cli holder runs the RLock script with a `lease_ms` lease, a
/// Redisson waiter (`RLock.lock()`: subscribe, retry when the ttl passes) waits, the holder is
/// killed. Returns death → grant in ms.
fn redisson_sample(
    server: &Server,
    scripts: &Scripts,
    lease_ms: u64,
    index: usize,
) -> Result<f64, String> {
    let key = format!("crash:redisson:{index}");
    let mut holder = Cli::start(server.port).map_err(|e| format!("spawn redis-cli: {e}"))?;
    let reply = cli_command(
        &mut holder,
        &format!(
            "EVALSHA {} 1 {key} {lease_ms} {}",
            scripts.redisson_lock,
            owner_id(1_000_000 + index)
        ),
    )?;
    if !reply.is_empty() {
        return Err(format!("the holder's lock script answered {reply:?}"));
    }
    let mut waiter = drivers::client(Approach::Redisson, server, scripts, index);
    let mut probe = server.connect();
    let channel = unlock_channel(&key);
    std::thread::scope(|scope| {
        let waiting = scope.spawn(|| {
            waiter.acquire(&key);
            Instant::now()
        });
        let subscribed = wait_until(
            || {
                let counts: Vec<redis::Value> = redis::cmd("PUBSUB")
                    .arg("NUMSUB")
                    .arg(&channel)
                    .query(&mut probe)
                    .unwrap_or_default();
                matches!(counts.get(1), Some(redis::Value::Int(n)) if *n >= 1)
            },
            "the Redisson waiter did not subscribe",
        );
        let died = Instant::now();
        holder.kill();
        let granted = waiting.join().expect("Redisson waiter");
        subscribed.map(|_| (granted - died).as_secs_f64() * 1e3)
    })
}

impl Crash {
    pub fn section(&self, plan: &crate::Plan) -> String {
        let mut out = String::new();
        out.push_str("## 8. Holder crashes\n\n");
        out.push_str(&format!(
            "A holder dies while a waiter is queued: the holder is a `redis-cli` process that \
             took the lock; once the waiter is blocked (module: `LOCK.ACQUIRE key owner 30000 \
             WAIT t`, seen in `LOCK.INFO`'s waiters; Redisson: `RLock.lock()` subscribed to the \
             unlock channel, seen in `PUBSUB NUMSUB`), the holder gets SIGKILL and the kernel \
             closes its connection. Figure = SIGKILL sent → the waiter's grant received, ms. \
             The holders are killed right after the waiter queues, so a lease-based lock frees \
             about one lease later. Redisson's own default is a 30 s watchdog lease renewed \
             every 10 s, so a crashed Redisson holder blocks its lock for 20–30 s; here its \
             lease is {} ms like the module's plain lease. With 3 samples p99 is the largest \
             sample. `EPHEMERAL` samples run one after another; the lease-based ones all at \
             once, on keys of their own.\n\n",
            plan.crash_lease_ms
        ));
        out.push_str(
            "| holder | lease ms | samples | death → grant p50 ms | p99 ms | max ms |\n\
             | --- | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for row in &self.rows {
            let lease = match row.kind {
                Kind::ModuleEphemeral => format!("{} (ends with the connection)", row.lease_ms),
                _ => fmt_num(row.lease_ms as f64, 0),
            };
            if row.samples.is_empty() {
                let why = row.error.as_deref().unwrap_or("not run");
                out.push_str(&format!(
                    "| {} | {lease} | 0 | unsupported: `{}` | | |\n",
                    row.kind.label(),
                    why.replace('|', "\\|")
                ));
                continue;
            }
            let note = row
                .error
                .as_ref()
                .map(|e| format!(" (then failed: {e})"))
                .unwrap_or_default();
            out.push_str(&format!(
                "| {} | {lease} | {}{note} | {} | {} | {} |\n",
                row.kind.label(),
                row.samples.len(),
                fmt_num(percentile(&row.samples, 50.0), 2),
                fmt_num(percentile(&row.samples, 99.0), 2),
                fmt_num(max(&row.samples), 2),
            ));
        }
        out.push('\n');
        out
    }
}
