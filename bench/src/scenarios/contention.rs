//! Scenario 2, contention: N clients on one key, each looping acquire → critical section
//! (~100 µs of spinning) → release, for a fixed time. What a lock costs when it is fought over:
//! throughput, commands per acquisition (sent, and executed by the server including Lua's
//! inner calls), wake-ups per release, waiting, handoff gap, fairness, exclusion.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use crate::drivers::{self, Approach, Scripts, Tally, POLL_INTERVAL_MS};
use crate::format::{fmt_num, fmt_spread, Target};
use crate::server::{self, ServerOptions};
use crate::stats::{jain, now_ns, percentile, Spread};
use crate::Bench;
use lock_testkit::Server;

/// The critical section: a busy loop, so it is as long on a loaded machine as on an idle one.
const CRITICAL_SECTION: Duration = Duration::from_micros(100);

/// One critical section, as its client saw it (ns on the bench's clock).
struct Section {
    client: usize,
    /// First acquire command sent.
    requested: u64,
    /// Acquire reply received: the lock is ours.
    acquired: u64,
    /// About to send the release.
    released: u64,
    token: Option<i64>,
}

/// One repetition of one (approach, N) cell.
pub struct Rep {
    pub sections_per_sec: f64,
    pub sent_per_acquisition: f64,
    pub executed_per_acquisition: f64,
    /// Clients woken per release: module handoffs, or unlock messages delivered; `None` for
    /// polling, which nobody wakes.
    pub wakeups_per_release: Option<f64>,
    pub wait_p50_ms: f64,
    pub wait_p99_ms: f64,
    pub gap_p50_ms: f64,
    pub gap_p99_ms: f64,
    pub jain: f64,
    pub violations: u64,
    pub token_regressions: u64,
    pub rtt_idle_us: f64,
    pub rtt_loaded_us: f64,
    /// Server calls per command name, per acquisition.
    pub executed_by_command: HashMap<String, f64>,
}

pub struct Contention {
    pub clients: Vec<usize>,
    pub cells: BTreeMap<(usize, usize), Vec<Rep>>,
}

fn approach_index(approach: Approach) -> usize {
    Approach::LOCKS
        .iter()
        .position(|a| *a == approach)
        .expect("a lock approach")
}

pub fn run(bench: &Bench) -> Contention {
    let plan = &bench.plan;
    let most = plan.contention_clients.iter().max().copied().unwrap_or(1);
    let server = server::start(
        &bench.module,
        &ServerOptions {
            maxclients: Some(4 * most + 1000),
            ..ServerOptions::default()
        },
    );
    let scripts = Scripts::load(&server);
    let mut cells: BTreeMap<(usize, usize), Vec<Rep>> = BTreeMap::new();
    for rep in 0..plan.reps {
        for &n in &plan.contention_clients {
            bench.progress(&format!(
                "contention: rep {}/{}, N = {n}",
                rep + 1,
                plan.reps
            ));
            for i in 0..Approach::LOCKS.len() {
                let approach = Approach::LOCKS[(i + rep) % Approach::LOCKS.len()];
                let result = run_cell(&server, &scripts, approach, n, plan.contention_cell, rep);
                cells
                    .entry((approach_index(approach), n))
                    .or_default()
                    .push(result);
            }
        }
    }
    Contention {
        clients: plan.contention_clients.clone(),
        cells,
    }
}

fn run_cell(
    server: &Server,
    scripts: &Scripts,
    approach: Approach,
    n: usize,
    duration: Duration,
    rep: usize,
) -> Rep {
    let key = format!("ct:{}:{n}:{rep}", approach.short().replace(' ', "-"));
    let clients: Vec<_> = (0..n)
        .map(|id| drivers::client(approach, server, scripts, id))
        .collect();
    let mut probe = crate::server::Probe::new(server);
    let rtt_idle_us = probe.ping_rtt_us(200);
    let handoffs_before = probe.lock_counter("handoffs");
    let timeouts_before = probe.lock_counter("wait_timeouts");
    probe.reset_stats();

    let inside = AtomicU32::new(0);
    let violations = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let start = Barrier::new(n + 2);
    let (window, outcomes, rtts) = std::thread::scope(|scope| {
        let workers: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(id, mut client)| {
                let (key, inside, violations, stop, start) =
                    (&key, &inside, &violations, &stop, &start);
                scope.spawn(move || {
                    let mut sections = Vec::new();
                    start.wait();
                    while !stop.load(Ordering::Relaxed) {
                        let requested = now_ns();
                        let token = client.acquire(key);
                        let acquired = now_ns();
                        if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                            violations.fetch_add(1, Ordering::Relaxed);
                        }
                        super::spin(CRITICAL_SECTION);
                        inside.fetch_sub(1, Ordering::SeqCst);
                        let released = now_ns();
                        client.release(key);
                        sections.push(Section {
                            client: id,
                            requested,
                            acquired,
                            released,
                            token,
                        });
                    }
                    (sections, client.tally())
                })
            })
            .collect();
        // Round trips measured while the clients fight: "one round trip" under the same load.
        let pinger = {
            let (stop, start) = (&stop, &start);
            scope.spawn(move || {
                let mut con = server.connect();
                let mut rtts = Vec::new();
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    let began = Instant::now();
                    let _: String = redis::cmd("PING").query(&mut con).expect("PING");
                    rtts.push(began.elapsed().as_secs_f64() * 1e6);
                    std::thread::sleep(Duration::from_millis(2));
                }
                rtts
            })
        };
        start.wait();
        let began = now_ns();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        let ended = now_ns();
        let outcomes: Vec<(Vec<Section>, Tally)> = workers
            .into_iter()
            .map(|w| w.join().expect("contention client"))
            .collect();
        let rtts = pinger.join().expect("pinger");
        ((began, ended), outcomes, rtts)
    });

    let executed = probe.commands_executed();
    let handoffs = probe.lock_counter("handoffs") - handoffs_before;
    let timeouts = probe.lock_counter("wait_timeouts") - timeouts_before;
    let mut sections: Vec<Section> = Vec::new();
    let mut tally = Tally::default();
    for (mut client_sections, client_tally) in outcomes {
        sections.append(&mut client_sections);
        tally.commands_sent += client_tally.commands_sent;
        tally.messages_received += client_tally.messages_received;
    }
    summarize(
        approach,
        n,
        sections,
        tally,
        &executed,
        handoffs + timeouts,
        violations.load(Ordering::Relaxed),
        window,
        rtt_idle_us,
        percentile(&rtts, 50.0),
    )
}

#[allow(clippy::too_many_arguments)]
fn summarize(
    approach: Approach,
    n: usize,
    mut sections: Vec<Section>,
    tally: Tally,
    executed: &HashMap<String, u64>,
    module_wakeups: u64,
    violations: u64,
    (began, ended): (u64, u64),
    rtt_idle_us: f64,
    rtt_loaded_us: f64,
) -> Rep {
    // Every started acquisition finished (clients stop only between sections), so the
    // per-acquisition counts use all of them; rates and latencies use the timed window.
    let acquisitions = sections.len() as f64;
    sections.sort_by_key(|s| s.acquired);
    let in_window: Vec<&Section> = sections
        .iter()
        .filter(|s| s.acquired >= began && s.acquired < ended)
        .collect();
    let window_s = (ended - began) as f64 / 1e9;
    let ms = |ns: u64| ns as f64 / 1e6;

    let waits: Vec<f64> = in_window
        .iter()
        .map(|s| ms(s.acquired - s.requested))
        .collect();
    // A handoff is a release followed by the next holder's grant, when that holder was
    // already waiting; a lock that simply sat free is not a handoff.
    let gaps: Vec<f64> = in_window
        .windows(2)
        .filter(|pair| pair[1].requested < pair[0].released)
        .map(|pair| ms(pair[1].acquired.saturating_sub(pair[0].released)))
        .collect();
    let mut per_client = vec![0.0; n];
    for s in &in_window {
        per_client[s.client] += 1.0;
    }
    let token_regressions = sections
        .windows(2)
        .filter(|pair| matches!((pair[0].token, pair[1].token), (Some(a), Some(b)) if b <= a))
        .count() as u64;
    let total_executed: u64 = executed.values().sum();
    let wakeups_per_release = match approach {
        Approach::Module => Some(module_wakeups as f64 / acquisitions),
        Approach::Redisson => Some(tally.messages_received as f64 / acquisitions),
        Approach::Polling | Approach::SetDel => None,
    };
    Rep {
        sections_per_sec: in_window.len() as f64 / window_s,
        sent_per_acquisition: tally.commands_sent as f64 / acquisitions,
        executed_per_acquisition: total_executed as f64 / acquisitions,
        wakeups_per_release,
        wait_p50_ms: percentile(&waits, 50.0),
        wait_p99_ms: percentile(&waits, 99.0),
        gap_p50_ms: percentile(&gaps, 50.0),
        gap_p99_ms: percentile(&gaps, 99.0),
        jain: jain(&per_client),
        violations,
        token_regressions,
        rtt_idle_us,
        rtt_loaded_us,
        executed_by_command: executed
            .iter()
            .map(|(name, calls)| (name.clone(), *calls as f64 / acquisitions))
            .collect(),
    }
}

impl Contention {
    fn reps(&self, approach: Approach, n: usize) -> &[Rep] {
        &self.cells[&(approach_index(approach), n)]
    }

    fn spread(&self, approach: Approach, n: usize, field: impl Fn(&Rep) -> f64) -> Spread {
        let values: Vec<f64> = self.reps(approach, n).iter().map(field).collect();
        Spread::of(&values)
    }

    /// One line per approach for the chart, medians over repetitions.
    pub fn chart_series(&self) -> Vec<Series> {
        Approach::LOCKS
            .iter()
            .map(|&approach| Series {
                approach,
                points: self
                    .clients
                    .iter()
                    .map(|&n| ChartPoint {
                        clients: n,
                        sections_per_sec: self.spread(approach, n, |r| r.sections_per_sec).median,
                        commands_per_acquisition: self
                            .spread(approach, n, |r| r.executed_per_acquisition)
                            .median,
                    })
                    .collect(),
            })
            .collect()
    }

    /// The N the headline table quotes: 32 when measured (the baseline's N), else the largest.
    pub fn headline_n(&self) -> usize {
        if self.clients.contains(&32) {
            32
        } else {
            self.clients.iter().max().copied().unwrap_or(0)
        }
    }

    pub fn headline(&self, approach: Approach) -> HeadlineRow {
        let n = self.headline_n();
        HeadlineRow {
            sections_per_sec: self.spread(approach, n, |r| r.sections_per_sec),
            executed_per_acquisition: self.spread(approach, n, |r| r.executed_per_acquisition),
            wakeups: self.wakeups(approach, n),
            gap_p50_ms: self.spread(approach, n, |r| r.gap_p50_ms),
            jain: self.spread(approach, n, |r| r.jain),
        }
    }

    fn wakeups(&self, approach: Approach, n: usize) -> Option<Spread> {
        let values: Option<Vec<f64>> = self
            .reps(approach, n)
            .iter()
            .map(|r| r.wakeups_per_release)
            .collect();
        values.map(|v| Spread::of(&v))
    }

    pub fn targets(&self) -> Vec<Target> {
        let module = Approach::Module;
        let per_n = |f: &dyn Fn(usize) -> String| -> String {
            self.clients
                .iter()
                .map(|&n| format!("N={n}: {}", f(n)))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let all_reps = || self.clients.iter().flat_map(|&n| self.reps(module, n));
        let sent_exact = all_reps().all(|r| (r.sent_per_acquisition - 2.0).abs() < 1e-9);
        let executed_exact = all_reps().all(|r| (r.executed_per_acquisition - 2.0).abs() < 1e-9);
        let max_wakeups = all_reps()
            .filter_map(|r| r.wakeups_per_release)
            .fold(0.0, f64::max);
        // Judged on the median of repetitions, like every figure; exactness and exclusion
        // below must hold in every repetition.
        let jain_ok = self
            .clients
            .iter()
            .all(|&n| self.spread(module, n, |r| r.jain).median >= 0.99);
        let violations: u64 = self
            .cells
            .values()
            .flat_map(|reps| reps.iter())
            .map(|r| r.violations)
            .sum();
        let regressions: u64 = all_reps().map(|r| r.token_regressions).sum();
        let gap_ok = self.clients.iter().all(|&n| {
            let gap = self.spread(module, n, |r| r.gap_p50_ms).median * 1000.0;
            let rtt = self.spread(module, n, |r| r.rtt_loaded_us).median;
            gap <= 2.0 * rtt
        });
        vec![
            Target {
                scenario: "2. Contention",
                goal: "exactly 2 commands per acquisition at every N (sent and executed)".into(),
                measured: per_n(&|n| {
                    format!(
                        "{} sent, {} executed",
                        fmt_num(self.spread(module, n, |r| r.sent_per_acquisition).max, 3),
                        fmt_num(
                            self.spread(module, n, |r| r.executed_per_acquisition).max,
                            3
                        )
                    )
                }) + " (max over repetitions)",
                met: sent_exact && executed_exact,
            },
            Target {
                scenario: "2. Contention",
                goal: "1 wake-up per release at every N".into(),
                measured: per_n(&|n| {
                    self.wakeups(module, n)
                        .map_or("-".into(), |s| fmt_spread(s, 3))
                }) + " (≤ 1: a release with nobody queued wakes no one)",
                met: max_wakeups <= 1.0 + 1e-9,
            },
            Target {
                scenario: "2. Contention",
                goal: "Jain's fairness index ≥ 0.99".into(),
                measured: per_n(&|n| fmt_spread(self.spread(module, n, |r| r.jain), 3)),
                met: jain_ok,
            },
            Target {
                scenario: "2. Contention",
                goal: "handoff gap p50 within 2× one round trip".into(),
                measured: per_n(&|n| {
                    format!(
                        "{} µs vs RTT {} µs",
                        fmt_num(self.spread(module, n, |r| r.gap_p50_ms).median * 1000.0, 0),
                        fmt_num(self.spread(module, n, |r| r.rtt_loaded_us).median, 0)
                    )
                }),
                met: gap_ok,
            },
            Target {
                scenario: "2. Contention",
                goal: "0 mutual-exclusion violations".into(),
                measured: format!(
                    "{violations} violations (all approaches, all runs); {regressions} fencing-token regressions"
                ),
                met: violations == 0 && regressions == 0,
            },
        ]
    }

    pub fn section(&self, plan: &crate::Plan) -> String {
        let mut out = String::new();
        out.push_str("## 2. Contention\n\n");
        out.push_str(&format!(
            "N clients on one key, each looping acquire → critical section ({} µs, busy) → \
             release for {:.1} s per repetition; one connection per client (plus one \
             subscription connection per Redisson client).\n\n\
             - The module waits with `LOCK.ACQUIRE ... WAIT`.\n\
             - Redisson subscribes to the unlock channel and retries its lock script on every \
             message.\n\
             - Polling sleeps {}–{} ms (uniform) between `SET NX PX` attempts.\n\n\
             The columns:\n\n\
             - *Sent* is counted by the clients; *executed* is every `calls=` of `INFO \
             commandstats` (Lua's inner calls and SUBSCRIBE included).\n\
             - Wake-ups: module = waiters granted or timed out per release (`INFO lock`), \
             Redisson = unlock messages delivered per release.\n\
             - Handoff gap = release sent → the next holder's acquire reply, when that holder \
             was already waiting.\n\
             - RTT = median PING round trip measured during the run.\n\n",
            CRITICAL_SECTION.as_micros(),
            plan.contention_cell.as_secs_f64(),
            POLL_INTERVAL_MS.0,
            POLL_INTERVAL_MS.1
        ));
        out.push_str("![contention](contention.svg)\n\n");
        out.push_str(
            "| N | approach | critical sections/s | sent / acq | executed / acq | wake-ups / release | wait p50 ms | wait p99 ms | handoff p50 ms | handoff p99 ms | Jain | violations |\n\
             | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for &n in &self.clients {
            for approach in Approach::LOCKS {
                let s = |f: fn(&Rep) -> f64, d: usize| fmt_spread(self.spread(approach, n, f), d);
                let violations: u64 = self.reps(approach, n).iter().map(|r| r.violations).sum();
                out.push_str(&format!(
                    "| {n} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {violations} |\n",
                    approach.label(),
                    s(|r| r.sections_per_sec, 0),
                    s(|r| r.sent_per_acquisition, 2),
                    s(|r| r.executed_per_acquisition, 1),
                    self.wakeups(approach, n)
                        .map_or("n/a (polls)".into(), |w| fmt_spread(w, 2)),
                    s(|r| r.wait_p50_ms, 2),
                    s(|r| r.wait_p99_ms, 2),
                    s(|r| r.gap_p50_ms, 3),
                    s(|r| r.gap_p99_ms, 3),
                    s(|r| r.jain, 3),
                ));
            }
        }
        out.push_str("\nRound trips (PING, µs, median of repetitions): ");
        let rtts: Vec<String> = self
            .clients
            .iter()
            .map(|&n| {
                format!(
                    "N={n}: idle {}, during the module's run {}",
                    fmt_num(
                        self.spread(Approach::Module, n, |r| r.rtt_idle_us).median,
                        0
                    ),
                    fmt_num(
                        self.spread(Approach::Module, n, |r| r.rtt_loaded_us).median,
                        0
                    )
                )
            })
            .collect();
        out.push_str(&rtts.join("; "));
        out.push_str(".\n\n");

        let n = self.headline_n();
        out.push_str(&format!(
            "What the server executed per acquisition at N = {n} (median of repetitions):\n\n"
        ));
        for approach in Approach::LOCKS {
            let mut names: Vec<String> = self
                .reps(approach, n)
                .iter()
                .flat_map(|r| r.executed_by_command.keys().cloned())
                .collect();
            names.sort();
            names.dedup();
            let mut parts: Vec<(f64, String)> = names
                .into_iter()
                .map(|name| {
                    let median = self
                        .spread(approach, n, |r| {
                            r.executed_by_command.get(&name).copied().unwrap_or(0.0)
                        })
                        .median;
                    (median, format!("{name} {}", fmt_num(median, 2)))
                })
                .collect();
            parts.sort_by(|a, b| b.0.total_cmp(&a.0));
            let parts: Vec<String> = parts.into_iter().map(|(_, s)| s).collect();
            out.push_str(&format!("- {}: {}\n", approach.label(), parts.join(", ")));
        }
        out.push('\n');
        out
    }
}

pub struct ChartPoint {
    pub clients: usize,
    pub sections_per_sec: f64,
    pub commands_per_acquisition: f64,
}

pub struct Series {
    pub approach: Approach,
    pub points: Vec<ChartPoint>,
}

pub struct HeadlineRow {
    pub sections_per_sec: Spread,
    pub executed_per_acquisition: Spread,
    pub wakeups: Option<Spread>,
    pub gap_p50_ms: Spread,
    pub jain: Spread,
}
