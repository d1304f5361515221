//! Scenario 4, cost as work grows: a release that hands the lock over while 1, 100 or 10,000
//! waiters are queued on the key; acquire/release while 1,000 or 1,000,000 other locks are held.
//! A lock that does per-waiter or per-lock work on the hot path shows it here.

use std::time::{Duration, Instant};

use crate::drivers::{owner_id, pair_commands, unlock_channel, Approach, Scripts, LEASE_MS};
use crate::format::{fmt_num, fmt_spread, Target};
use crate::resp::{RawConn, Resp};
use crate::server::{self, Probe, ServerOptions};
use crate::stats::{percentile, Spread};
use crate::Bench;
use lock_testkit::Server;

/// Per repetition: latency p50/p99 (µs) and server CPU (µs) per operation.
#[derive(Default)]
pub struct Costs {
    pub p50_us: Vec<f64>,
    pub p99_us: Vec<f64>,
    pub cpu_us: Vec<f64>,
}

pub struct Scaling {
    /// (waiters queued, module release → handoff → re-queue cycle).
    pub module_waiters: Vec<(usize, Costs)>,
    /// (subscribers on the channel, Redisson lock + unlock cycle) for comparison.
    pub redisson_subscribers: Vec<(usize, Costs)>,
    /// (locks held, module pair, SET/DEL pair).
    pub held_locks: Vec<(usize, Costs, Costs)>,
    pub handoff_samples: usize,
}

/// A waiter's WAIT timeout: finite, as real clients set one, so the module's deadline index
/// holds every waiter; long enough never to fire.
const WAITER_TIMEOUT_MS: &str = "600000";

pub fn run(bench: &Bench) -> Scaling {
    let plan = &bench.plan;
    // Each waiter is a descriptor here and one in the server: stay inside the limit (only
    // tighter than asked when the bench could not raise it).
    let cap = crate::system::open_files_limit().saturating_sub(2000) as usize;
    let waiter_counts: Vec<usize> = plan.waiter_counts.iter().map(|&w| w.min(cap)).collect();
    let total: usize = waiter_counts.iter().map(|w| w + 1).sum();
    let server = server::start(
        &bench.module,
        &ServerOptions {
            maxclients: Some(total + 1000),
            loopback_addresses: 1 + (total / 20_000) as u8,
            ..ServerOptions::default()
        },
    );
    let scripts = Scripts::load(&server);
    let mut probe = Probe::new(&server);

    // Every queue length lives on the server at once (one key each) and the repetitions take
    // turns, so a busy moment on the shared machine hits all of them, not just one.
    bench.progress(&format!("scaling: queueing {waiter_counts:?} waiters"));
    let mut rings: Vec<Ring> = waiter_counts
        .iter()
        .map(|&w| Ring::queue(&server, &mut probe, w))
        .collect();
    let mut module_waiters: Vec<Costs> = waiter_counts.iter().map(|_| Costs::default()).collect();
    // Repetition 0 is a warm-up, discarded: the server's first touches of fresh memory (page
    // faults) would otherwise be charged to whichever is measured first.
    for rep in 0..=plan.reps {
        for (ring, costs) in rings.iter_mut().zip(&mut module_waiters) {
            let (latencies, cpu_us) = ring.cycles(&mut probe, plan.handoff_samples);
            if rep > 0 {
                costs.record(&latencies, cpu_us);
            }
        }
    }
    drop(rings);

    bench.progress("scaling: the same numbers of Redisson subscribers");
    let mut channels: Vec<Subscribers> = waiter_counts
        .iter()
        .map(|&w| Subscribers::subscribe(&server, w))
        .collect();
    let mut redisson_subscribers: Vec<Costs> =
        waiter_counts.iter().map(|_| Costs::default()).collect();
    let mut con = server.connect();
    for _ in 0..plan.reps {
        for (channel, costs) in channels.iter_mut().zip(&mut redisson_subscribers) {
            // Every unlock message is written to every subscriber: fewer samples at 10,000.
            let fewer = plan.handoff_samples * 50 / channel.count.max(100);
            let samples = fewer.clamp(5, plan.handoff_samples);
            let (latencies, cpu_us) = channel.lock_unlock(&mut con, &scripts, &mut probe, samples);
            costs.record(&latencies, cpu_us);
        }
    }
    drop(channels);
    drop(server);

    // One server per keyspace size, side by side, measured in turns for the same reason.
    bench.progress(&format!(
        "scaling: holding {:?} locks",
        plan.held_lock_counts
    ));
    let keyspaces: Vec<(usize, Server, Scripts, Probe)> = plan
        .held_lock_counts
        .iter()
        .map(|&count| {
            let server = server::start(&bench.module, &ServerOptions::default());
            hold_locks(&server, count);
            let scripts = Scripts::load(&server);
            let probe = Probe::new(&server);
            (count, server, scripts, probe)
        })
        .collect();
    // Let Redis finish rehashing the grown keyspaces (incrementally, from its cron).
    std::thread::sleep(Duration::from_millis(1000));
    let mut held_locks: Vec<(usize, Costs, Costs)> = keyspaces
        .iter()
        .map(|(count, ..)| (*count, Costs::default(), Costs::default()))
        .collect();
    let mut keyspaces = keyspaces;
    for rep in 0..=plan.reps {
        for ((count, server, scripts, probe), (_, module, floor)) in
            keyspaces.iter_mut().zip(&mut held_locks)
        {
            for (approach, costs) in [
                (Approach::Module, &mut *module),
                (Approach::SetDel, &mut *floor),
            ] {
                let (latencies, cpu_us) = pairs(
                    server,
                    scripts,
                    probe,
                    approach,
                    plan.pair_samples,
                    *count,
                    rep,
                );
                if rep > 0 {
                    costs.record(&latencies, cpu_us);
                }
            }
        }
    }
    Scaling {
        module_waiters: waiter_counts.iter().copied().zip(module_waiters).collect(),
        redisson_subscribers: waiter_counts
            .iter()
            .copied()
            .zip(redisson_subscribers)
            .collect(),
        held_locks,
        handoff_samples: plan.handoff_samples,
    }
}

impl Costs {
    fn record(&mut self, latencies_us: &[f64], cpu_us: f64) {
        self.p50_us.push(percentile(latencies_us, 50.0));
        self.p99_us.push(percentile(latencies_us, 99.0));
        self.cpu_us.push(cpu_us);
    }
}

fn expect_int(reply: Resp, what: &str) -> i64 {
    match reply {
        Resp::Int(n) => n,
        other => panic!("{what}: expected an integer, got {other:?}"),
    }
}

/// A holder and `waiters` clients queued behind it on one key. Each cycle: the holder
/// releases, the head waiter is granted (timed from the release being sent to the grant
/// arriving), and the old holder queues again at the tail, so the queue keeps its length and
/// its order stays known.
struct Ring {
    key: String,
    owners: Vec<String>,
    conns: Vec<RawConn>,
    holder: usize,
}

impl Ring {
    fn queue(server: &Server, probe: &mut Probe, waiters: usize) -> Ring {
        let mut ring = Ring {
            key: format!("sc:waiters:{waiters}"),
            owners: (0..=waiters).map(owner_id).collect(),
            conns: (0..=waiters)
                .map(|i| RawConn::connect(server.address(i)).expect("waiter connection"))
                .collect(),
            holder: 0,
        };
        ring.send_acquire(0);
        expect_int(ring.conns[0].read().expect("holder"), "holder acquire");
        // Queue one at a time, each confirmed, so the FIFO order is the connections' order.
        for i in 1..=waiters {
            ring.send_acquire(i);
            let deadline = Instant::now() + Duration::from_secs(10);
            while probe.waiters_on(&ring.key) < i as u64 {
                assert!(Instant::now() < deadline, "waiter {i} did not queue");
            }
        }
        ring
    }

    fn send_acquire(&mut self, i: usize) {
        let lease = LEASE_MS.to_string();
        self.conns[i]
            .send(&[
                b"LOCK.ACQUIRE",
                self.key.as_bytes(),
                self.owners[i].as_bytes(),
                lease.as_bytes(),
                b"WAIT",
                WAITER_TIMEOUT_MS.as_bytes(),
            ])
            .expect("send LOCK.ACQUIRE");
    }

    /// `samples` cycles: each one's latency (µs), and server CPU per cycle (µs).
    fn cycles(&mut self, probe: &mut Probe, samples: usize) -> (Vec<f64>, f64) {
        let mut latencies = Vec::with_capacity(samples);
        let cpu_before = probe.main_thread_cpu();
        for _ in 0..samples {
            let holder = self.holder;
            let next = (holder + 1) % self.conns.len();
            let began = Instant::now();
            self.conns[holder]
                .send(&[
                    b"LOCK.RELEASE",
                    self.key.as_bytes(),
                    self.owners[holder].as_bytes(),
                ])
                .expect("send LOCK.RELEASE");
            expect_int(self.conns[next].read().expect("grant"), "grant");
            latencies.push(began.elapsed().as_secs_f64() * 1e6);
            let remaining = expect_int(self.conns[holder].read().expect("release"), "release");
            assert_eq!(remaining, 0);
            self.send_acquire(holder);
            self.holder = next;
        }
        let cpu = probe.main_thread_cpu() - cpu_before;
        (latencies, cpu * 1e6 / samples as f64)
    }
}

/// `count` Redisson clients waiting on one lock's channel (subscribed, never reading again).
struct Subscribers {
    key: String,
    count: usize,
    _conns: Vec<RawConn>,
}

impl Subscribers {
    fn subscribe(server: &Server, count: usize) -> Subscribers {
        let key = format!("sc:redisson:{count}");
        let channel = unlock_channel(&key);
        let mut conns: Vec<RawConn> = (0..count)
            .map(|i| RawConn::connect(server.address(i)).expect("subscriber connection"))
            .collect();
        for conn in &mut conns {
            conn.send(&[b"SUBSCRIBE", channel.as_bytes()])
                .expect("SUBSCRIBE");
        }
        for conn in &mut conns {
            conn.read().expect("subscribed");
        }
        Subscribers {
            key,
            count,
            _conns: conns,
        }
    }

    /// One client locking and unlocking: every unlock publishes to all the subscribers.
    fn lock_unlock(
        &self,
        con: &mut redis::Connection,
        scripts: &Scripts,
        probe: &mut Probe,
        samples: usize,
    ) -> (Vec<f64>, f64) {
        let owner = owner_id(0);
        let mut latencies = Vec::with_capacity(samples);
        let cpu_before = probe.main_thread_cpu();
        for _ in 0..samples {
            let (lock, unlock) = pair_commands(Approach::Redisson, scripts, &self.key, &owner);
            let began = Instant::now();
            let _: redis::Value = lock.query(con).expect("lock script");
            let _: redis::Value = unlock.query(con).expect("unlock script");
            latencies.push(began.elapsed().as_secs_f64() * 1e6);
        }
        let cpu = probe.main_thread_cpu() - cpu_before;
        (latencies, cpu * 1e6 / samples as f64)
    }
}

/// Takes `count` locks (`held:<i>`) with a one-hour lease, pipelined.
fn hold_locks(server: &Server, count: usize) {
    let mut con = server.connect();
    let owner = owner_id(0);
    for start in (0..count).step_by(1000) {
        let mut pipe = redis::pipe();
        for i in start..(start + 1000).min(count) {
            pipe.cmd("LOCK.ACQUIRE")
                .arg(format!("held:{i}"))
                .arg(&owner)
                .arg(3_600_000)
                .ignore();
        }
        let _: () = pipe.query(&mut con).expect("hold locks");
    }
}

/// Acquire+release pairs on fresh keys: latency (unpipelined) and server CPU per pair
/// (pipelined 16 deep, as in scenario 1).
fn pairs(
    server: &Server,
    scripts: &Scripts,
    probe: &mut Probe,
    approach: Approach,
    samples: usize,
    held: usize,
    rep: usize,
) -> (Vec<f64>, f64) {
    let mut con = server.connect();
    let owner = owner_id(1);
    let key = |i: usize| format!("sc:pair:{}:{held}:{rep}:{i}", approach.short());
    let latency_samples = samples / 4;
    let mut latencies = Vec::with_capacity(latency_samples);
    for i in 0..latency_samples {
        let (acquire, release) = pair_commands(approach, scripts, &key(i), &owner);
        let began = Instant::now();
        let _: redis::Value = acquire.query(&mut con).expect("acquire");
        let _: redis::Value = release.query(&mut con).expect("release");
        latencies.push(began.elapsed().as_secs_f64() * 1e6);
    }
    let cpu_before = probe.main_thread_cpu();
    for start in (latency_samples..latency_samples + samples).step_by(16) {
        let mut acquires = redis::pipe();
        let mut releases = redis::pipe();
        for i in start..start + 16 {
            let (acquire, release) = pair_commands(approach, scripts, &key(i), &owner);
            acquires.add_command(acquire);
            releases.add_command(release);
        }
        let _: Vec<redis::Value> = acquires.query(&mut con).expect("acquires");
        let _: Vec<redis::Value> = releases.query(&mut con).expect("releases");
    }
    let cpu = probe.main_thread_cpu() - cpu_before;
    (latencies, cpu * 1e6 / samples as f64)
}

/// Largest over smallest, repetition by repetition (they ran side by side), then the median:
/// 1.0 is perfectly flat.
fn growth(smallest: &[f64], largest: &[f64]) -> f64 {
    let ratios: Vec<f64> = smallest
        .iter()
        .zip(largest)
        .map(|(small, large)| large / small)
        .collect();
    Spread::of(&ratios).median
}

impl Scaling {
    pub fn targets(&self) -> Vec<Target> {
        let mut targets = Vec::new();
        if let (Some((w0, first)), Some((w1, last))) =
            (self.module_waiters.first(), self.module_waiters.last())
        {
            let latency = growth(&first.p50_us, &last.p50_us);
            let cpu = growth(&first.cpu_us, &last.cpu_us);
            // The issue asks for the release+handoff *latency* to stay flat; server CPU per
            // cycle is shown beside it.
            targets.push(Target {
                scenario: "4. Scaling",
                goal: format!("release+handoff latency flat from {w0} to {w1} waiters (≤ 1.2×)"),
                measured: format!(
                    "latency p50 {}× ({} → {} µs), server CPU {}× ({} → {} µs)",
                    fmt_num(latency, 2),
                    fmt_num(Spread::of(&first.p50_us).median, 0),
                    fmt_num(Spread::of(&last.p50_us).median, 0),
                    fmt_num(cpu, 2),
                    fmt_num(Spread::of(&first.cpu_us).median, 2),
                    fmt_num(Spread::of(&last.cpu_us).median, 2),
                ),
                met: latency <= 1.2,
            });
        }
        if let (Some((m0, first, first_floor)), Some((m1, last, last_floor))) =
            (self.held_locks.first(), self.held_locks.last())
        {
            let latency = growth(&first.p50_us, &last.p50_us);
            let cpu = growth(&first.cpu_us, &last.cpu_us);
            let floor_cpu = growth(&first_floor.cpu_us, &last_floor.cpu_us);
            targets.push(Target {
                scenario: "4. Scaling",
                goal: format!("acquire/release flat from {m0} to {m1} locks held (≤ 1.2×)"),
                measured: format!(
                    "latency p50 {}×, server CPU {}× (SET/DEL on the same keyspace: {}×)",
                    fmt_num(latency, 2),
                    fmt_num(cpu, 2),
                    fmt_num(floor_cpu, 2),
                ),
                met: latency <= 1.2 && cpu <= 1.2,
            });
        }
        targets
    }

    pub fn section(&self) -> String {
        let mut out = String::new();
        out.push_str("## 4. Cost as work grows\n\n");
        out.push_str(&format!(
            "**Waiters queued on one key.** The holder releases; the head waiter is granted; \
             the old holder queues again at the tail (`WAIT {WAITER_TIMEOUT_MS}`), so the queue \
             keeps its length. Latency = release sent → grant received, one thread driving \
             every connection; server CPU is per whole cycle (release + handoff + re-queue). \
             Every queue is on the server at once and the repetitions take turns; {} cycles \
             each. Growth = largest over smallest per repetition, median. For comparison, Redisson with the same number of \
             clients subscribed to the lock's channel: one lock + unlock round trip, whose \
             unlock publishes to all of them.\n\n",
            self.handoff_samples
        ));
        out.push_str(
            "| waiters | module handoff p50 µs | p99 µs | server CPU µs/cycle | Redisson lock+unlock p50 µs | server CPU µs/cycle |\n\
             | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for ((waiters, module), (_, redisson)) in
            self.module_waiters.iter().zip(&self.redisson_subscribers)
        {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                fmt_num(*waiters as f64, 0),
                fmt_spread(Spread::of(&module.p50_us), 0),
                fmt_spread(Spread::of(&module.p99_us), 0),
                fmt_spread(Spread::of(&module.cpu_us), 2),
                fmt_spread(Spread::of(&redisson.p50_us), 0),
                fmt_spread(Spread::of(&redisson.cpu_us), 1),
            ));
        }
        out.push_str(
            "\n**Locks held.** One server per keyspace size, side by side, each holding that \
             many locks with a 1-hour lease (created pipelined); the repetitions take turns. \
             Acquire+release pairs on fresh keys: latency unpipelined, server CPU pipelined 16 \
             deep. SET/DEL on the same keyspace shows what Redis's own dictionary costs.\n\n\
             | locks held | module pair p50 µs | p99 µs | module CPU µs/pair | SET/DEL CPU µs/pair |\n\
             | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for (held, module, floor) in &self.held_locks {
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                fmt_num(*held as f64, 0),
                fmt_spread(Spread::of(&module.p50_us), 0),
                fmt_spread(Spread::of(&module.p99_us), 0),
                fmt_spread(Spread::of(&module.cpu_us), 2),
                fmt_spread(Spread::of(&floor.cpu_us), 2),
            ));
        }
        out.push('\n');
        out
    }
}
