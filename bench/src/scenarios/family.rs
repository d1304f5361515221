//! Scenarios 6 and 7, the lock family (docs/lock-family.md) under contention: N clients on one
//! key, each looping acquire → critical section → release for a fixed time.
//!
//! - **Read-write lock**: each acquisition is a read (`SHARED`) with probability 0.9, else a
//!   write; module against Redisson's `RReadWriteLock`.
//! - **Semaphore**: each acquisition takes one of 4 permits; module `LIMIT 4` against
//!   Redisson's `RSemaphore`.
//!
//! The clients check exclusion themselves with one in-process counter: no writer beside
//! another holder, never more than 4 permit holders.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::drivers::family::{
    self, hold_client, module_options, server_error, FamilyScripts, HoldApproach, Mode, PERMITS,
};
use crate::drivers::Tally;
use crate::format::{fmt_num, fmt_spread, Target};
use crate::server::{self, ServerOptions};
use crate::stats::{jain, now_ns, percentile, Spread};
use crate::Bench;
use lock_testkit::Server;

/// The critical section: a busy loop, so it is as long on a loaded machine as on an idle one.
/// Shorter than scenario 2's 100 µs: up to 32 readers spin in it at once on the machine's
/// cores, beside the server.
const CRITICAL_SECTION: Duration = Duration::from_micros(50);

/// Share of the read-write scenario's acquisitions that are reads.
const READ_SHARE: f64 = 0.9;

/// Exclusion check: holders inside in the low 32 bits, writers inside in the high 32 bits.
const WRITER: u64 = 1 << 32;
const HOLDERS: u64 = WRITER - 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    ReadWrite,
    Semaphore,
}

impl Workload {
    fn approaches(self) -> [HoldApproach; 2] {
        match self {
            Workload::ReadWrite => [HoldApproach::Module, HoldApproach::RedissonReadWrite],
            Workload::Semaphore => [HoldApproach::Module, HoldApproach::RedissonSemaphore],
        }
    }

    fn name(self) -> &'static str {
        match self {
            Workload::ReadWrite => "rw",
            Workload::Semaphore => "semaphore",
        }
    }

    /// The module's options in this scenario, for labels.
    fn module_label(self) -> &'static str {
        match self {
            Workload::ReadWrite => "LOCK.* module (SHARED / exclusive)",
            Workload::Semaphore => "LOCK.* module (LIMIT 4)",
        }
    }

    fn label(self, approach: HoldApproach) -> &'static str {
        match approach {
            HoldApproach::Module => self.module_label(),
            other => other.label(),
        }
    }

    fn pick(self, rng: &mut StdRng) -> Mode {
        match self {
            Workload::ReadWrite if rng.gen_bool(READ_SHARE) => Mode::Shared,
            Workload::ReadWrite => Mode::Exclusive,
            Workload::Semaphore => Mode::Permit,
        }
    }

    /// The mode whose acquisition the module must support for its rows to run.
    fn probe_mode(self) -> Mode {
        match self {
            Workload::ReadWrite => Mode::Shared,
            Workload::Semaphore => Mode::Permit,
        }
    }
}

/// One critical section, as its client saw it (ns on the bench's clock).
struct Section {
    client: usize,
    mode: Mode,
    requested: u64,
    acquired: u64,
}

/// One repetition of one (approach, N) cell.
pub struct Rep {
    pub sections_per_sec: f64,
    pub shared_per_sec: f64,
    pub exclusive_per_sec: f64,
    pub sent_per_acquisition: f64,
    pub executed_per_acquisition: f64,
    pub wakeups_per_release: f64,
    /// Waits of every acquisition, and of reads and writes apart (ms).
    pub wait_p50_ms: f64,
    pub wait_p99_ms: f64,
    pub shared_wait_p50_ms: f64,
    pub shared_wait_p99_ms: f64,
    pub exclusive_wait_p50_ms: f64,
    pub exclusive_wait_p99_ms: f64,
    /// Most holders inside the critical section at once (readers, or permit holders).
    pub most_together: u64,
    pub jain: f64,
    pub violations: u64,
    /// Server calls per command name, per acquisition.
    pub executed_by_command: HashMap<String, f64>,
}

/// One (approach, N): its repetitions, or why it could not run.
pub struct Cell {
    pub approach: HoldApproach,
    pub clients: usize,
    pub reps: Vec<Rep>,
    pub error: Option<String>,
}

pub struct Family {
    pub workload: Workload,
    pub clients: Vec<usize>,
    pub cells: Vec<Cell>,
    pub cell_duration: Duration,
}

pub fn run(bench: &Bench, workload: Workload) -> Family {
    let plan = &bench.plan;
    let most = plan.family_clients.iter().max().copied().unwrap_or(1);
    let server = server::start(
        &bench.module,
        &ServerOptions {
            maxclients: Some(4 * most + 1000),
            ..ServerOptions::default()
        },
    );
    let scripts = FamilyScripts::load(&server);
    let approaches = workload.approaches();
    let mut cells: Vec<Cell> = Vec::new();
    for &n in &plan.family_clients {
        for approach in approaches {
            cells.push(Cell {
                approach,
                clients: n,
                reps: Vec::new(),
                error: None,
            });
        }
    }
    // A module without the option answers every request with an error: say so once.
    if let Err(error) = module_supports(&server, workload.probe_mode()) {
        bench.progress(&format!(
            "{}: the module refuses {:?}: {error}; its rows are marked unsupported",
            workload.name(),
            workload.probe_mode()
        ));
        for cell in cells.iter_mut() {
            if cell.approach == HoldApproach::Module {
                cell.error = Some(error.clone());
            }
        }
    }
    for rep in 0..plan.reps {
        for &n in &plan.family_clients {
            bench.progress(&format!(
                "{}: rep {}/{}, N = {n}",
                workload.name(),
                rep + 1,
                plan.reps
            ));
            for i in 0..approaches.len() {
                let approach = approaches[(i + rep) % approaches.len()];
                let cell = cells
                    .iter_mut()
                    .find(|c| c.approach == approach && c.clients == n)
                    .expect("a cell per approach and N");
                if cell.error.is_some() {
                    continue;
                }
                match run_cell(
                    &server,
                    &scripts,
                    workload,
                    approach,
                    n,
                    plan.family_cell,
                    rep,
                ) {
                    Ok(result) => cell.reps.push(result),
                    Err(error) => {
                        bench.progress(&format!(
                            "{}: {} at N = {n} failed: {error}",
                            workload.name(),
                            approach.label()
                        ));
                        cell.error = Some(error);
                    }
                }
            }
        }
    }
    Family {
        workload,
        clients: plan.family_clients.clone(),
        cells,
        cell_duration: plan.family_cell,
    }
}

/// Takes and gives back one hold of kind `mode` on a key of its own.
fn module_supports(server: &Server, mode: Mode) -> Result<(), String> {
    let mut con = server.connect();
    let key = "family:probe";
    let token: Option<i64> = redis::cmd("LOCK.ACQUIRE")
        .arg(key)
        .arg("probe")
        .arg(1000)
        .arg(module_options(mode))
        .query(&mut con)
        .map_err(server_error)?;
    if token.is_none() {
        return Err("a free key's hold was not granted".into());
    }
    redis::cmd("LOCK.RELEASE")
        .arg(key)
        .arg("probe")
        .query::<Option<i64>>(&mut con)
        .map_err(server_error)?;
    Ok(())
}

/// What a worker hands back.
type Outcome = (Vec<Section>, Tally);

fn run_cell(
    server: &Server,
    scripts: &FamilyScripts,
    workload: Workload,
    approach: HoldApproach,
    n: usize,
    duration: Duration,
    rep: usize,
) -> Result<Rep, String> {
    let key = format!("{}:{}:{n}:{rep}", workload.name(), approach.short());
    if approach == HoldApproach::RedissonSemaphore {
        family::set_permits(server, &key);
    }
    let clients: Vec<_> = (0..n)
        .map(|id| hold_client(approach, server, scripts, id))
        .collect();
    let mut probe = crate::server::Probe::new(server);
    let counter = |probe: &mut crate::server::Probe, name: &str| -> u64 {
        probe
            .info("lock")
            .get(&format!("lock_{name}"))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let wakeups_before = counter(&mut probe, "handoffs") + counter(&mut probe, "wait_timeouts");
    probe.reset_stats();

    let state = AtomicU64::new(0);
    let violations = AtomicU64::new(0);
    let most_together = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let failure: Mutex<Option<String>> = Mutex::new(None);
    let start = Barrier::new(n + 1);
    let (window, outcomes) = std::thread::scope(|scope| {
        let workers: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(id, mut client)| {
                let (key, state, violations, most_together, stop, failure, start) = (
                    &key,
                    &state,
                    &violations,
                    &most_together,
                    &stop,
                    &failure,
                    &start,
                );
                scope.spawn(move || -> Outcome {
                    // The same reads and writes, in the same order, for every approach.
                    let mut rng = StdRng::seed_from_u64((rep * 10_000 + id) as u64);
                    let mut sections = Vec::new();
                    let fail = |error: String| {
                        failure.lock().expect("failure").get_or_insert(error);
                        stop.store(true, Ordering::Relaxed);
                    };
                    start.wait();
                    'run: while !stop.load(Ordering::Relaxed) {
                        let mode = workload.pick(&mut rng);
                        let requested = now_ns();
                        loop {
                            match client.acquire(key, mode) {
                                Ok(true) => break,
                                Ok(false) if stop.load(Ordering::Relaxed) => break 'run,
                                Ok(false) => {}
                                Err(error) => {
                                    fail(error);
                                    break 'run;
                                }
                            }
                        }
                        let acquired = now_ns();
                        enter(mode, state, violations, most_together);
                        super::spin(CRITICAL_SECTION);
                        leave(mode, state);
                        if let Err(error) = client.release(key, mode) {
                            fail(error);
                            break;
                        }
                        sections.push(Section {
                            client: id,
                            mode,
                            requested,
                            acquired,
                        });
                    }
                    (sections, client.tally())
                })
            })
            .collect();
        start.wait();
        let began = now_ns();
        let deadline = Instant::now() + duration;
        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5).min(duration));
        }
        stop.store(true, Ordering::Relaxed);
        let ended = now_ns();
        let outcomes: Vec<Outcome> = workers
            .into_iter()
            .map(|w| w.join().expect("family client"))
            .collect();
        ((began, ended), outcomes)
    });
    if let Some(error) = failure.into_inner().expect("failure") {
        return Err(error);
    }

    let executed = probe.commands_executed();
    let module_wakeups = (counter(&mut probe, "handoffs") + counter(&mut probe, "wait_timeouts"))
        .saturating_sub(wakeups_before);
    let mut sections: Vec<Section> = Vec::new();
    let mut tally = Tally::default();
    for (mut client_sections, client_tally) in outcomes {
        sections.append(&mut client_sections);
        tally.commands_sent += client_tally.commands_sent;
        tally.messages_received += client_tally.messages_received;
    }
    let wakeups = match approach {
        HoldApproach::Module => module_wakeups,
        _ => tally.messages_received,
    };
    Ok(summarize(
        n,
        &sections,
        tally,
        &executed,
        wakeups,
        violations.load(Ordering::Relaxed),
        most_together.load(Ordering::Relaxed),
        window,
    ))
}

/// Counts the client in, and a violation if it shares the critical section with a holder it
/// excludes: a writer with anybody, a reader with a writer, a fifth permit holder.
fn enter(mode: Mode, state: &AtomicU64, violations: &AtomicU64, most: &AtomicU64) {
    let violated = match mode {
        Mode::Exclusive => state.fetch_add(WRITER, Ordering::SeqCst) != 0,
        Mode::Shared => {
            let before = state.fetch_add(1, Ordering::SeqCst);
            most.fetch_max((before & HOLDERS) + 1, Ordering::Relaxed);
            before & !HOLDERS != 0
        }
        Mode::Permit => {
            let before = state.fetch_add(1, Ordering::SeqCst);
            most.fetch_max((before & HOLDERS) + 1, Ordering::Relaxed);
            (before & HOLDERS) + 1 > u64::from(PERMITS)
        }
    };
    if violated {
        violations.fetch_add(1, Ordering::Relaxed);
    }
}

fn leave(mode: Mode, state: &AtomicU64) {
    match mode {
        Mode::Exclusive => state.fetch_sub(WRITER, Ordering::SeqCst),
        Mode::Shared | Mode::Permit => state.fetch_sub(1, Ordering::SeqCst),
    };
}

#[allow(clippy::too_many_arguments)]
fn summarize(
    n: usize,
    sections: &[Section],
    tally: Tally,
    executed: &HashMap<String, u64>,
    wakeups: u64,
    violations: u64,
    most_together: u64,
    (began, ended): (u64, u64),
) -> Rep {
    // Every started acquisition finished (clients stop only between sections), so the
    // per-acquisition counts use all of them; rates and latencies use the timed window.
    let acquisitions = sections.len().max(1) as f64;
    let in_window: Vec<&Section> = sections
        .iter()
        .filter(|s| s.acquired >= began && s.acquired < ended)
        .collect();
    let window_s = (ended - began) as f64 / 1e9;
    let wait_ms = |s: &&Section| (s.acquired - s.requested) as f64 / 1e6;
    let waits_of = |mode: Option<Mode>| -> Vec<f64> {
        in_window
            .iter()
            .filter(|s| mode.is_none_or(|m| s.mode == m))
            .map(wait_ms)
            .collect()
    };
    let (all, shared, exclusive) = (
        waits_of(None),
        waits_of(Some(Mode::Shared)),
        waits_of(Some(Mode::Exclusive)),
    );
    let mut per_client = vec![0.0; n];
    for s in &in_window {
        per_client[s.client] += 1.0;
    }
    let total_executed: u64 = executed.values().sum();
    Rep {
        sections_per_sec: in_window.len() as f64 / window_s,
        shared_per_sec: shared.len() as f64 / window_s,
        exclusive_per_sec: exclusive.len() as f64 / window_s,
        sent_per_acquisition: tally.commands_sent as f64 / acquisitions,
        executed_per_acquisition: total_executed as f64 / acquisitions,
        wakeups_per_release: wakeups as f64 / acquisitions,
        wait_p50_ms: percentile(&all, 50.0),
        wait_p99_ms: percentile(&all, 99.0),
        shared_wait_p50_ms: percentile(&shared, 50.0),
        shared_wait_p99_ms: percentile(&shared, 99.0),
        exclusive_wait_p50_ms: percentile(&exclusive, 50.0),
        exclusive_wait_p99_ms: percentile(&exclusive, 99.0),
        most_together,
        jain: jain(&per_client),
        violations,
        executed_by_command: executed
            .iter()
            .map(|(name, calls)| (name.clone(), *calls as f64 / acquisitions))
            .collect(),
    }
}

impl Family {
    fn spread(cell: &Cell, field: impl Fn(&Rep) -> f64) -> Spread {
        let values: Vec<f64> = cell.reps.iter().map(field).collect();
        Spread::of(&values)
    }

    /// Exclusion, judged over every approach and repetition that ran.
    pub fn targets(&self) -> Vec<Target> {
        let violations: u64 = self
            .cells
            .iter()
            .flat_map(|c| c.reps.iter())
            .map(|r| r.violations)
            .sum();
        let measured: Vec<String> = self
            .cells
            .iter()
            .filter(|c| !c.reps.is_empty())
            .map(|c| format!("{} N={}", self.workload.label(c.approach), c.clients))
            .collect();
        let (scenario, goal) = match self.workload {
            Workload::ReadWrite => (
                "6. Read-write lock",
                "0 exclusion violations (a writer beside any other holder)",
            ),
            Workload::Semaphore => (
                "7. Semaphore",
                "0 exclusion violations (more than 4 holders at once)",
            ),
        };
        vec![Target {
            scenario,
            goal: goal.into(),
            measured: format!(
                "{violations} violations over {} (every repetition)",
                if measured.is_empty() {
                    "nothing: no approach ran".to_string()
                } else {
                    measured.join(", ")
                }
            ),
            met: violations == 0 && !measured.is_empty(),
        }]
    }

    pub fn section(&self) -> String {
        let mut out = String::new();
        let cs = CRITICAL_SECTION.as_micros();
        let secs = self.cell_duration.as_secs_f64();
        match self.workload {
            Workload::ReadWrite => {
                out.push_str("## 6. Read-write lock, 90 % reads\n\n");
                out.push_str(&format!(
                    "N clients on one key, each looping for {secs:.2} s per repetition: a read \
                     with probability 0.9 (the same seeded sequence for both approaches), else \
                     a write → critical section ({cs} µs, busy) → release. One connection per \
                     client (plus one subscription connection per Redisson client). Module: \
                     `LOCK.ACQUIRE key owner 30000 [SHARED] WAIT 10000`, `LOCK.RELEASE key \
                     owner`. Redisson: `readLock()` / `writeLock()` `.lock(30 s)` — the lock \
                     script; on a ttl SUBSCRIBE `redisson_rwlock:{{key}}`, retry after every \
                     message or when the ttl passes, UNSUBSCRIBE once granted; unlock scripts \
                     publish when the lock becomes free. Wake-ups: module = waiters granted or \
                     timed out per release (`INFO lock`), Redisson = messages delivered per \
                     release. *Most readers* = most clients inside the critical section at \
                     once; violations = a writer beside any other holder (in-process check).\n\n"
                ));
                out.push_str(
                    "| N | approach | critical sections/s | reads/s | writes/s | sent / acq | executed / acq | wake-ups / release | read wait p50 ms | read wait p99 ms | write wait p50 ms | write wait p99 ms | most readers | Jain | violations |\n\
                     | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
                );
            }
            Workload::Semaphore => {
                out.push_str("## 7. Semaphore, 4 permits\n\n");
                out.push_str(&format!(
                    "N clients on one key with 4 permits, each looping acquire → critical \
                     section ({cs} µs, busy) → release for {secs:.2} s per repetition. Module: \
                     `LOCK.ACQUIRE key owner 30000 LIMIT 4 WAIT 10000`, `LOCK.RELEASE key \
                     owner`. Redisson `RSemaphore` (set to 4 permits first): `acquire()` runs \
                     the try-acquire script; when no permit is free, SUBSCRIBE \
                     `redisson_sc:{{key}}` and retry after every release message (each release \
                     publishes the free count to every subscriber), UNSUBSCRIBE once granted; \
                     `release()` is one script (INCRBY + PUBLISH). RSemaphore's permits have no \
                     owner and no lease: a crashed client's permit is lost. Violations = a \
                     fifth holder inside at once (in-process check).\n\n"
                ));
                out.push_str(
                    "| N | approach | critical sections/s | sent / acq | executed / acq | wake-ups / release | wait p50 ms | wait p99 ms | most holders | Jain | violations |\n\
                     | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
                );
            }
        }
        for cell in &self.cells {
            let n = cell.clients;
            let label = self.workload.label(cell.approach);
            let columns = match self.workload {
                Workload::ReadWrite => 13,
                Workload::Semaphore => 9,
            };
            if cell.reps.is_empty() {
                let why = cell.error.as_deref().unwrap_or("not run");
                out.push_str(&format!(
                    "| {n} | {label} | unsupported: `{}` |{}\n",
                    why.replace('|', "\\|"),
                    " |".repeat(columns - 1)
                ));
                continue;
            }
            let s = |f: fn(&Rep) -> f64, d: usize| fmt_spread(Self::spread(cell, f), d);
            let violations: u64 = cell.reps.iter().map(|r| r.violations).sum();
            let most = cell.reps.iter().map(|r| r.most_together).max().unwrap_or(0);
            let mut row = match self.workload {
                Workload::ReadWrite => format!(
                    "| {n} | {label} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {most} | {} | {violations} |",
                    s(|r| r.sections_per_sec, 0),
                    s(|r| r.shared_per_sec, 0),
                    s(|r| r.exclusive_per_sec, 0),
                    s(|r| r.sent_per_acquisition, 2),
                    s(|r| r.executed_per_acquisition, 1),
                    s(|r| r.wakeups_per_release, 2),
                    s(|r| r.shared_wait_p50_ms, 2),
                    s(|r| r.shared_wait_p99_ms, 2),
                    s(|r| r.exclusive_wait_p50_ms, 2),
                    s(|r| r.exclusive_wait_p99_ms, 2),
                    s(|r| r.jain, 3),
                ),
                Workload::Semaphore => format!(
                    "| {n} | {label} | {} | {} | {} | {} | {} | {} | {most} | {} | {violations} |",
                    s(|r| r.sections_per_sec, 0),
                    s(|r| r.sent_per_acquisition, 2),
                    s(|r| r.executed_per_acquisition, 1),
                    s(|r| r.wakeups_per_release, 2),
                    s(|r| r.wait_p50_ms, 2),
                    s(|r| r.wait_p99_ms, 2),
                    s(|r| r.jain, 3),
                ),
            };
            if let Some(error) = &cell.error {
                row.push_str(&format!(" (later repetition failed: {error})"));
            }
            out.push_str(&row);
            out.push('\n');
        }
        out.push('\n');
        if let Some(n) = self.clients.iter().max() {
            let parts: Vec<String> = self
                .cells
                .iter()
                .filter(|c| c.clients == *n && !c.reps.is_empty())
                .map(|cell| {
                    let mut names: Vec<&String> = cell
                        .reps
                        .iter()
                        .flat_map(|r| r.executed_by_command.keys())
                        .collect();
                    names.sort();
                    names.dedup();
                    let mut calls: Vec<(f64, String)> = names
                        .into_iter()
                        .map(|name| {
                            let median = Self::spread(cell, |r| {
                                r.executed_by_command.get(name).copied().unwrap_or(0.0)
                            })
                            .median;
                            (median, format!("{name} {}", fmt_num(median, 2)))
                        })
                        .collect();
                    calls.sort_by(|a, b| b.0.total_cmp(&a.0));
                    let calls: Vec<String> = calls.into_iter().map(|(_, s)| s).collect();
                    format!(
                        "- {}: {}\n",
                        self.workload.label(cell.approach),
                        calls.join(", ")
                    )
                })
                .collect();
            if !parts.is_empty() {
                out.push_str(&format!(
                    "What the server executed per acquisition at N = {n} (median of \
                     repetitions; Lua's inner calls included):\n\n{}\n",
                    parts.concat()
                ));
            }
        }
        out
    }
}
