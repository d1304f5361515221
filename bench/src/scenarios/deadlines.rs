//! Scenario 3, deadlines: how late a waiter gets a lock whose holder died (the lease ran out),
//! and how late a `WAIT` timeout answers, in ms past the deadline. Redis's own timers are shown
//! for reference: the `expired` keyspace event (active expiry sweep) and BLPOP's timeout.

use std::collections::HashMap;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use crate::drivers::{self, owner_id, Approach, Scripts, LEASE_MS};
use crate::format::{fmt_num, fmt_spread, Target};
use crate::resp::RawConn;
use crate::server::{self, ServerOptions};
use crate::stats::{max, percentile, Spread};
use crate::Bench;
use lock_testkit::Server;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Holder takes the lock with a lease and never releases; a waiter blocks in WAIT.
    ModuleLeaseExpiry,
    /// Same with Redisson's scripts: the waiter waits the returned ttl on its subscription.
    RedissonLeaseExpiry,
    /// Same with SET NX PX: the waiter polls.
    PollingLeaseExpiry,
    /// Reference: a key with PX, watched through the `expired` keyspace event.
    RedisExpiryEvent,
    /// The lock stays held; a waiter's `WAIT timeout` runs out.
    ModuleWaitTimeout,
    /// Reference: BLPOP on an empty list with the same timeout.
    BlpopTimeout,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::ModuleLeaseExpiry,
        Kind::RedissonLeaseExpiry,
        Kind::PollingLeaseExpiry,
        Kind::RedisExpiryEvent,
        Kind::ModuleWaitTimeout,
        Kind::BlpopTimeout,
    ];

    fn label(self) -> &'static str {
        match self {
            Kind::ModuleLeaseExpiry => "lease expiry → handoff: LOCK.* module (WAIT)",
            Kind::RedissonLeaseExpiry => "lease expiry → handoff: Redisson (waits the ttl)",
            Kind::PollingLeaseExpiry => "lease expiry → handoff: SET NX PX polling",
            Kind::RedisExpiryEvent => {
                "reference: Redis `expired` keyspace event (expiry sweep, no other volatile keys)"
            }
            Kind::ModuleWaitTimeout => "WAIT timeout: LOCK.ACQUIRE ... WAIT t answers nil",
            Kind::BlpopTimeout => "reference: BLPOP timeout",
        }
    }
}

/// Per repetition: p50, p99 and max lateness in ms.
#[derive(Default)]
pub struct Lateness {
    pub p50: Vec<f64>,
    pub p99: Vec<f64>,
    pub max: Vec<f64>,
    pub samples: usize,
}

pub struct Deadlines {
    pub kinds: HashMap<Kind, Lateness>,
}

pub fn run(bench: &Bench) -> Deadlines {
    let plan = &bench.plan;
    let server = server::start(
        &bench.module,
        &ServerOptions {
            maxclients: Some(4 * plan.deadline_samples + 1000),
            ..ServerOptions::default()
        },
    );
    let scripts = Scripts::load(&server);
    let mut kinds: HashMap<Kind, Lateness> = HashMap::new();
    for rep in 0..plan.reps {
        bench.progress(&format!("deadlines: rep {}/{}", rep + 1, plan.reps));
        for kind in Kind::ALL {
            let deadlines = spread_deadlines(plan.deadline_samples, plan.deadline_range_ms);
            let late = match kind {
                Kind::RedisExpiryEvent => expiry_events(&server, &deadlines, rep),
                _ => in_parallel(&server, &scripts, kind, &deadlines, rep),
            };
            let entry = kinds.entry(kind).or_default();
            entry.p50.push(percentile(&late, 50.0));
            entry.p99.push(percentile(&late, 99.0));
            entry.max.push(max(&late));
            entry.samples += late.len();
        }
    }
    Deadlines { kinds }
}

/// Deadlines spaced evenly over the range, so timers do not all fire in one tick.
fn spread_deadlines(count: usize, (low, high): (u64, u64)) -> Vec<u64> {
    (0..count)
        .map(|i| low + (high - low) * i as u64 / count.max(1) as u64)
        .collect()
}

/// One thread per sample, each with its own holder and waiter connections; all start together.
/// Returns each sample's lateness in ms.
fn in_parallel(
    server: &Server,
    scripts: &Scripts,
    kind: Kind,
    deadlines: &[u64],
    rep: usize,
) -> Vec<f64> {
    let start = Barrier::new(deadlines.len());
    std::thread::scope(|scope| {
        let workers: Vec<_> = deadlines
            .iter()
            .enumerate()
            .map(|(i, &deadline_ms)| {
                let start = &start;
                scope.spawn(move || {
                    let key = format!("dl:{kind:?}:{rep}:{i}");
                    sample(server, scripts, kind, &key, i, deadline_ms, start)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("deadline sample"))
            .collect()
    })
}

fn sample(
    server: &Server,
    scripts: &Scripts,
    kind: Kind,
    key: &str,
    index: usize,
    deadline_ms: u64,
    start: &Barrier,
) -> f64 {
    let mut holder = server.connect();
    let holder_owner = owner_id(1_000_000 + index);
    let late_ms = |began: Instant| began.elapsed().as_secs_f64() * 1e3 - deadline_ms as f64;
    match kind {
        Kind::ModuleLeaseExpiry => {
            let mut waiter = server.connect();
            start.wait();
            // The lease starts when the server runs the command, after `began`: lateness is
            // measured from the earliest possible deadline, never flattered.
            let began = Instant::now();
            let _: i64 = redis::cmd("LOCK.ACQUIRE")
                .arg(key)
                .arg(&holder_owner)
                .arg(deadline_ms)
                .query(&mut holder)
                .expect("holder LOCK.ACQUIRE");
            let token: Option<i64> = redis::cmd("LOCK.ACQUIRE")
                .arg(key)
                .arg(owner_id(index))
                .arg(LEASE_MS)
                .arg("WAIT")
                .arg(10 * deadline_ms)
                .query(&mut waiter)
                .expect("waiter LOCK.ACQUIRE");
            assert!(token.is_some(), "the waiter got the expired lock");
            late_ms(began)
        }
        Kind::RedissonLeaseExpiry | Kind::PollingLeaseExpiry => {
            let approach = if kind == Kind::RedissonLeaseExpiry {
                Approach::Redisson
            } else {
                Approach::Polling
            };
            let mut waiter = drivers::client(approach, server, scripts, index);
            start.wait();
            let began = Instant::now();
            if approach == Approach::Redisson {
                let ttl: Option<i64> = redis::cmd("EVALSHA")
                    .arg(&scripts.redisson_lock)
                    .arg(1)
                    .arg(key)
                    .arg(deadline_ms)
                    .arg(&holder_owner)
                    .query(&mut holder)
                    .expect("holder lock script");
                assert!(ttl.is_none());
            } else {
                let set: Option<String> = redis::cmd("SET")
                    .arg(key)
                    .arg(&holder_owner)
                    .arg("NX")
                    .arg("PX")
                    .arg(deadline_ms)
                    .query(&mut holder)
                    .expect("holder SET NX PX");
                assert!(set.is_some());
            }
            waiter.acquire(key);
            late_ms(began)
        }
        Kind::ModuleWaitTimeout => {
            let mut waiter = server.connect();
            let _: i64 = redis::cmd("LOCK.ACQUIRE")
                .arg(key)
                .arg(&holder_owner)
                .arg(LEASE_MS)
                .query(&mut holder)
                .expect("holder LOCK.ACQUIRE");
            start.wait();
            let began = Instant::now();
            let token: Option<i64> = redis::cmd("LOCK.ACQUIRE")
                .arg(key)
                .arg(owner_id(index))
                .arg(LEASE_MS)
                .arg("WAIT")
                .arg(deadline_ms)
                .query(&mut waiter)
                .expect("waiter LOCK.ACQUIRE");
            assert!(
                token.is_none(),
                "the lock stayed held: the wait must time out"
            );
            late_ms(began)
        }
        Kind::BlpopTimeout => {
            start.wait();
            let began = Instant::now();
            let popped: Option<(String, String)> = redis::cmd("BLPOP")
                .arg(key)
                .arg(format!("{:.3}", deadline_ms as f64 / 1000.0))
                .query(&mut holder)
                .expect("BLPOP");
            assert!(popped.is_none());
            late_ms(began)
        }
        Kind::RedisExpiryEvent => unreachable!("measured by expiry_events"),
    }
}

/// Keys set with PX, one subscriber on `__keyevent@0__:expired`: how long after its PX each
/// key's `expired` event arrives. That is when Redis itself notices an expired key nobody reads.
fn expiry_events(server: &Server, deadlines: &[u64], rep: usize) -> Vec<f64> {
    let mut probe = crate::server::Probe::new(server);
    // Redis's best case: only these keys have a TTL. The sweep samples 20 volatile keys at a
    // time and stops early when few are expired, so other keys with TTLs (the earlier samples'
    // 30 s leases) would make it later still.
    probe.flushall();
    probe.config_set("notify-keyspace-events", "Ex");
    let mut subscriber = RawConn::connect(server.address(0)).expect("subscriber");
    subscriber
        .call(&[b"SUBSCRIBE", b"__keyevent@0__:expired"])
        .expect("SUBSCRIBE");
    let mut con = server.connect();
    let mut set_at: HashMap<Vec<u8>, (Instant, u64)> = HashMap::new();
    for (i, &deadline_ms) in deadlines.iter().enumerate() {
        let key = format!("dl:expiry:{rep}:{i}");
        let began = Instant::now();
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg("1")
            .arg("PX")
            .arg(deadline_ms)
            .query(&mut con)
            .expect("SET PX");
        set_at.insert(key.into_bytes(), (began, deadline_ms));
    }
    let mut late = Vec::with_capacity(deadlines.len());
    while late.len() < deadlines.len() {
        let event = subscriber
            .read_within(Duration::from_secs(5))
            .expect("expired events")
            .expect("an expired event within 5 s");
        if let Some((began, deadline_ms)) = event.message_payload().and_then(|k| set_at.get(k)) {
            late.push(began.elapsed().as_secs_f64() * 1e3 - *deadline_ms as f64);
        }
    }
    probe.config_set("notify-keyspace-events", "");
    late
}

impl Deadlines {
    fn spread(&self, kind: Kind, f: fn(&Lateness) -> &Vec<f64>) -> Spread {
        Spread::of(f(&self.kinds[&kind]))
    }

    pub fn p99(&self, kind: Kind) -> Spread {
        self.spread(kind, |l| &l.p99)
    }

    pub fn targets(&self) -> Vec<Target> {
        [
            (
                Kind::ModuleLeaseExpiry,
                "lease-expiry handoff lateness p99 ≤ 5 ms",
            ),
            (Kind::ModuleWaitTimeout, "WAIT timeout lateness p99 ≤ 5 ms"),
        ]
        .into_iter()
        .map(|(kind, goal)| {
            let p99 = self.p99(kind);
            let worst = max(&self.kinds[&kind].max);
            let reference = match kind {
                Kind::ModuleLeaseExpiry => Kind::RedisExpiryEvent,
                _ => Kind::BlpopTimeout,
            };
            Target {
                scenario: "3. Deadlines",
                goal: goal.into(),
                measured: format!(
                    "p99 {} ms, max {} ms (Redis's own: p99 {} ms)",
                    fmt_spread(p99, 2),
                    fmt_num(worst, 2),
                    fmt_num(self.p99(reference).median, 1)
                ),
                met: p99.median <= 5.0,
            }
        })
        .collect()
    }

    pub fn section(&self, plan: &crate::Plan) -> String {
        let mut out = String::new();
        out.push_str("## 3. Deadlines\n\n");
        out.push_str(&format!(
            "{} samples per repetition, run in parallel (one thread and connection each), with \
             leases / timeouts spread evenly over {}–{} ms. Lateness = reply received − \
             (command sent + lease or timeout), in ms; the deadline is counted from when the \
             command was *sent*, so a round trip is included, never subtracted. p50 and p99 \
             are medians over repetitions (min–max); max is over all samples.\n\n",
            plan.deadline_samples, plan.deadline_range_ms.0, plan.deadline_range_ms.1
        ));
        out.push_str("| what | p50 ms | p99 ms | max ms |\n| --- | ---: | ---: | ---: |\n");
        for kind in Kind::ALL {
            out.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                kind.label(),
                fmt_spread(self.spread(kind, |l| &l.p50), 2),
                fmt_spread(self.spread(kind, |l| &l.p99), 2),
                fmt_num(max(&self.kinds[&kind].max), 2),
            ));
        }
        out.push('\n');
        out
    }
}
