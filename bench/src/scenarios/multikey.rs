//! Scenario `multikey` (issue 22): N clients each repeatedly needing k random distinct keys of
//! M, a short critical section, for a fixed time; three ways of holding several locks at once
//! (`drivers::multikey`): the module's `LOCK.MACQUIRE ... WAIT`, Redisson's MultiLock algorithm
//! over its RLock scripts, and sorted sequential `LOCK.ACQUIRE ... WAIT`.
//!
//! Every client draws the same seeded sequence of key sets for every approach. The clients
//! check exclusion themselves: each key has an in-process occupant slot, and a client entering
//! a key another client is inside (or a fencing token not above the key's last one) stops the
//! cell and aborts the bench with the keys and clients involved.
//!
//! No wait can hang the bench: every wait is bounded (see the drivers) and at the end of a cell
//! waiting clients abandon their attempt. An approach that stalls (Redisson's MultiLock, when
//! two clients hold what the other waits for, waits out its `keys × 1.5 s` round) shows it in
//! the "longest stall" and "longest wait open at end" columns instead of holding the bench up.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::drivers::multikey::{self, Acquired, MultiApproach, MultiTally};
use crate::drivers::Scripts;
use crate::format::fmt_spread;
use crate::server::{self, Probe, ServerOptions};
use crate::stats::{jain, now_ns, percentile, Spread};
use crate::Bench;
use lock_testkit::Server;

/// M: the keys every client draws from.
const KEYS: usize = 16;
/// k: keys per acquisition.
const KEYS_PER_ACQUISITION: [usize; 2] = [2, 4];
/// N: clients.
const CLIENTS: [usize; 2] = [8, 32];
/// The critical section: a sleep, like a write to another system while the keys are held. (The
/// one-key scenarios spin instead; here up to 8 holders at once on two shared cores would
/// measure the CPU, not the locks.)
const CRITICAL_SECTION: Duration = Duration::from_millis(1);
/// A gap with no acquisition by anybody at least this long is a stall.
const STALL: Duration = Duration::from_millis(100);

/// How long each cell runs, and how many repetitions: short in `--quick`.
fn cell_plan(bench: &Bench) -> (Duration, usize) {
    if bench.plan.quick {
        (Duration::from_millis(600), bench.plan.reps)
    } else {
        (Duration::from_secs(5), bench.plan.reps.min(3))
    }
}

/// One critical section as its client saw it (ns on the bench's clock).
struct Section {
    client: usize,
    requested: u64,
    acquired: u64,
}

/// One repetition of one (approach, N, k) cell.
pub struct Rep {
    pub acquisitions_per_sec: f64,
    /// Waits from asking to holding every key (ms); waits still open at the end count with
    /// their length so far.
    pub wait_p50_ms: f64,
    pub wait_p99_ms: f64,
    pub jain: f64,
    pub sent_per_acquisition: f64,
    pub executed_per_acquisition: f64,
    pub restarts_per_acquisition: f64,
    /// Longest time in the window with no acquisition by any client.
    pub longest_stall_ms: f64,
    /// The longest wait still open when the window closed.
    pub longest_open_wait_ms: f64,
}

pub struct Cell {
    pub approach: MultiApproach,
    pub clients: usize,
    pub keys: usize,
    pub reps: Vec<Rep>,
    pub error: Option<String>,
}

pub struct MultiKey {
    pub cells: Vec<Cell>,
    pub cell_duration: Duration,
    pub reps: usize,
}

pub fn run(bench: &Bench) -> MultiKey {
    let (duration, reps) = cell_plan(bench);
    let most = CLIENTS.iter().max().copied().unwrap_or(1);
    let server = server::start(
        &bench.module,
        &ServerOptions {
            maxclients: Some(4 * most + 1000),
            ..ServerOptions::default()
        },
    );
    let scripts = Scripts::load(&server);
    let mut cells: Vec<Cell> = Vec::new();
    for &n in &CLIENTS {
        for &k in &KEYS_PER_ACQUISITION {
            for approach in MultiApproach::ALL {
                cells.push(Cell {
                    approach,
                    clients: n,
                    keys: k,
                    reps: Vec::new(),
                    error: None,
                });
            }
        }
    }
    for rep in 0..reps {
        for &n in &CLIENTS {
            for &k in &KEYS_PER_ACQUISITION {
                bench.progress(&format!(
                    "multikey: rep {}/{reps}, N = {n}, k = {k}",
                    rep + 1
                ));
                let count = MultiApproach::ALL.len();
                for i in 0..count {
                    // A different approach goes first in each repetition.
                    let approach = MultiApproach::ALL[(i + rep) % count];
                    let cell = cells
                        .iter_mut()
                        .find(|c| c.approach == approach && c.clients == n && c.keys == k)
                        .expect("a cell per approach, N and k");
                    if cell.error.is_some() {
                        continue;
                    }
                    match run_cell(&server, &scripts, approach, n, k, duration, rep) {
                        Ok(result) => cell.reps.push(result),
                        Err(CellError::Violation(what)) => {
                            // The server (and its redis-server child) is dropped on the way out.
                            panic!(
                                "multikey: MUTUAL EXCLUSION VIOLATED by {} at N = {n}, k = {k}, \
                                 rep {}: {what}",
                                approach.label(),
                                rep + 1
                            );
                        }
                        Err(CellError::Failed(error)) => {
                            bench.progress(&format!(
                                "multikey: {} at N = {n}, k = {k} failed: {error}",
                                approach.label()
                            ));
                            cell.error = Some(error);
                        }
                    }
                }
            }
        }
    }
    MultiKey {
        cells,
        cell_duration: duration,
        reps,
    }
}

enum CellError {
    /// Two clients inside one key's critical section, or a fencing token that did not rise.
    Violation(String),
    /// A command failed (an error reply, a lost connection).
    Failed(String),
}

/// The in-process exclusion check: who is inside each key, and each key's last token.
struct Checker {
    inside: Vec<AtomicUsize>,
    last_token: Vec<AtomicI64>,
    violation: Mutex<Option<String>>,
}

impl Checker {
    fn new() -> Checker {
        Checker {
            inside: (0..KEYS).map(|_| AtomicUsize::new(0)).collect(),
            last_token: (0..KEYS).map(|_| AtomicI64::new(0)).collect(),
            violation: Mutex::new(None),
        }
    }

    fn violated(&self, what: String) {
        self.violation
            .lock()
            .expect("violation")
            .get_or_insert(what);
    }

    /// Client `id` enters keys `picked` holding `tokens`; false if that broke exclusion.
    fn enter(&self, id: usize, picked: &[usize], tokens: &[Option<i64>]) -> bool {
        let mut ok = true;
        for (&key, token) in picked.iter().zip(tokens) {
            if let Err(other) =
                self.inside[key].compare_exchange(0, id + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                self.violated(format!(
                    "client {id} got key {key} while client {} was inside it",
                    other - 1
                ));
                ok = false;
            }
            if let Some(token) = *token {
                let before = self.last_token[key].fetch_max(token, Ordering::SeqCst);
                if before >= token {
                    self.violated(format!(
                        "client {id} got key {key} with fencing token {token}, not above \
                         the previous {before}"
                    ));
                    ok = false;
                }
            }
        }
        ok
    }

    fn leave(&self, id: usize, picked: &[usize]) {
        for &key in picked {
            let _ =
                self.inside[key].compare_exchange(id + 1, 0, Ordering::SeqCst, Ordering::SeqCst);
        }
    }
}

/// What a worker hands back: its sections, when its last attempt began if it was still
/// waiting at the end, and its tally.
type Outcome = (Vec<Section>, Option<u64>, MultiTally);

fn run_cell(
    server: &Server,
    scripts: &Scripts,
    approach: MultiApproach,
    n: usize,
    k: usize,
    duration: Duration,
    rep: usize,
) -> Result<Rep, CellError> {
    let names: Vec<String> = (0..KEYS)
        .map(|i| format!("mk:r{rep}:n{n}:k{k}:{}:{i:02}", approach.short()))
        .collect();
    let clients: Vec<_> = (0..n)
        .map(|id| multikey::client(approach, server, scripts, id))
        .collect();
    let mut probe = Probe::new(server);
    probe.reset_stats();

    let checker = Checker::new();
    let stop = AtomicBool::new(false);
    let failure: Mutex<Option<String>> = Mutex::new(None);
    let start = Barrier::new(n + 1);
    let (window, outcomes) = std::thread::scope(|scope| {
        let workers: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(id, mut client)| {
                let (names, checker, stop, failure, start) =
                    (&names, &checker, &stop, &failure, &start);
                scope.spawn(move || -> Outcome {
                    // The same key sets, in the same order, for every approach.
                    let mut rng = StdRng::seed_from_u64((rep * 1_000_000 + n * 1_000 + id) as u64);
                    let mut sections = Vec::new();
                    let mut open = None;
                    let fail = |error: String| {
                        failure.lock().expect("failure").get_or_insert(error);
                        stop.store(true, Ordering::Relaxed);
                    };
                    start.wait();
                    while !stop.load(Ordering::Relaxed) {
                        // Drawn in random order: the caller's order Redisson's MultiLock walks.
                        let picked: Vec<usize> =
                            rand::seq::index::sample(&mut rng, KEYS, k).into_vec();
                        let keys: Vec<String> = picked.iter().map(|&i| names[i].clone()).collect();
                        let requested = now_ns();
                        let tokens = match client.acquire(&keys, stop) {
                            Ok(Acquired::All { tokens }) => tokens,
                            Ok(Acquired::Abandoned) => {
                                open = Some(requested);
                                break;
                            }
                            Err(error) => {
                                fail(error);
                                break;
                            }
                        };
                        let acquired = now_ns();
                        if !checker.enter(id, &picked, &tokens) {
                            stop.store(true, Ordering::Relaxed);
                        }
                        std::thread::sleep(CRITICAL_SECTION);
                        checker.leave(id, &picked);
                        if let Err(error) = client.release(&keys) {
                            fail(error);
                            break;
                        }
                        sections.push(Section {
                            client: id,
                            requested,
                            acquired,
                        });
                    }
                    (sections, open, client.tally())
                })
            })
            .collect();
        start.wait();
        let began = now_ns();
        let deadline = Instant::now() + duration;
        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, Ordering::Relaxed);
        let ended = now_ns();
        let outcomes: Vec<Outcome> = workers
            .into_iter()
            .map(|w| w.join().expect("multikey client"))
            .collect();
        ((began, ended), outcomes)
    });
    if let Some(what) = checker.violation.into_inner().expect("violation") {
        return Err(CellError::Violation(what));
    }
    if let Some(error) = failure.into_inner().expect("failure") {
        return Err(CellError::Failed(error));
    }
    let executed: u64 = probe.commands_executed().values().sum();
    Ok(summarize(n, outcomes, executed, window))
}

fn summarize(n: usize, outcomes: Vec<Outcome>, executed: u64, (began, ended): (u64, u64)) -> Rep {
    let mut sections: Vec<Section> = Vec::new();
    let mut open: Vec<u64> = Vec::new();
    let mut tally = MultiTally::default();
    for (mut client_sections, client_open, client_tally) in outcomes {
        sections.append(&mut client_sections);
        open.extend(client_open);
        tally.commands_sent += client_tally.commands_sent;
        tally.restarts += client_tally.restarts;
        tally.messages_received += client_tally.messages_received;
    }
    // Counts per acquisition use every finished acquisition (and so every command sent, those of
    // abandoned attempts included); rates, waits and fairness use the timed window.
    // With none, the per-acquisition counts are undefined (shown as –), not per one.
    let acquisitions = if sections.is_empty() {
        f64::NAN
    } else {
        sections.len() as f64
    };
    let in_window: Vec<&Section> = sections
        .iter()
        .filter(|s| s.acquired >= began && s.acquired < ended)
        .collect();
    let window_s = (ended - began) as f64 / 1e9;
    let mut waits: Vec<f64> = in_window
        .iter()
        .map(|s| (s.acquired - s.requested) as f64 / 1e6)
        .collect();
    // Waits still open when the window closed: attempts abandoned at the stop, and those
    // granted only after it. Both count with their length at the close.
    let open_waits: Vec<f64> = open
        .iter()
        .copied()
        .chain(
            sections
                .iter()
                .filter(|s| s.requested < ended && s.acquired >= ended)
                .map(|s| s.requested),
        )
        .map(|requested| ended.saturating_sub(requested) as f64 / 1e6)
        .collect();
    waits.extend(&open_waits);
    let mut per_client = vec![0.0; n];
    for s in &in_window {
        per_client[s.client] += 1.0;
    }
    let mut instants: Vec<u64> = in_window.iter().map(|s| s.acquired).collect();
    instants.push(began);
    instants.push(ended);
    instants.sort_unstable();
    let longest_stall = instants.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
    Rep {
        acquisitions_per_sec: in_window.len() as f64 / window_s,
        wait_p50_ms: percentile(&waits, 50.0),
        wait_p99_ms: percentile(&waits, 99.0),
        jain: jain(&per_client),
        sent_per_acquisition: tally.commands_sent as f64 / acquisitions,
        executed_per_acquisition: executed as f64 / acquisitions,
        restarts_per_acquisition: tally.restarts as f64 / acquisitions,
        longest_stall_ms: longest_stall as f64 / 1e6,
        longest_open_wait_ms: open_waits.iter().copied().fold(0.0, f64::max),
    }
}

impl MultiKey {
    fn spread(cell: &Cell, field: impl Fn(&Rep) -> f64) -> Spread {
        let values: Vec<f64> = cell.reps.iter().map(field).collect();
        Spread::of(&values)
    }

    /// Whether the approach kept making progress: "ok", or how it stopped (in the worst
    /// repetition).
    fn progress(cell: &Cell) -> String {
        let repetitions = cell.reps.len();
        let stuck = cell
            .reps
            .iter()
            .filter(|r| r.acquisitions_per_sec == 0.0)
            .count();
        let stalled = cell
            .reps
            .iter()
            .filter(|r| r.longest_stall_ms >= STALL.as_secs_f64() * 1e3)
            .count();
        if stuck > 0 {
            format!("**no acquisition at all** in {stuck} of {repetitions} repetitions")
        } else if stalled > 0 {
            format!(
                "**stalled** ≥ {} ms in {stalled} of {repetitions} repetitions",
                STALL.as_millis()
            )
        } else {
            "ok".to_string()
        }
    }

    pub fn section(&self) -> String {
        let secs = self.cell_duration.as_secs_f64();
        let mut out = String::from("## 10. Multi-key locks: k random keys of 16\n\n");
        out.push_str(&format!(
            "N clients, each looping for {secs:.1} s per repetition ({} repetitions): draw k \
             distinct keys of M = {KEYS} at random (the same seeded sequence for every \
             approach) → hold all k → critical section ({} ms, a sleep) → release all. One \
             connection per client (plus one subscription connection per Redisson client); \
             every lease 30 s.\n\n\
             - **LOCK.MACQUIRE**: `LOCK.MACQUIRE k key… owner 30000 WAIT 2000` (one request in \
             every key's FIFO queue, granted when it heads them all), `LOCK.MRELEASE k key… \
             owner`.\n\
             - **Redisson MultiLock algorithm**: a reimplementation of `RedissonMultiLock.lock()` \
             from Redisson's source, not Redisson itself, over the RLock scripts of the other \
             scenarios (run verbatim): rounds of `tryLock(k × 1500 ms)`, each taking the keys \
             one by one **in the order drawn** (the caller's), waiting for each by pub/sub as \
             `RLock.tryLock` does while holding the ones taken; when the round's time runs out \
             it unlocks what it holds and the next round starts at once (no back-off: only \
             `lock(lease)` randomises its wait). Two clients that each hold a key the other \
             waits for both wait out the round (k × 1.5 s: 3 s for k = 2, 6 s for k = 4{}), \
             and then usually deadlock again: the client whose round ends first gives its \
             keys back and takes its first key again at once, and the other, whose round \
             ends later, re-takes its own first key before the woken waiter's retry reaches \
             it (the livelock of Redisson issues #1160 and #4050).\n\
             - **LOCK.ACQUIRE sorted**: `LOCK.ACQUIRE key owner 30000 WAIT 2000` on each key in \
             sorted order (holding the earlier ones: cannot deadlock), then `LOCK.RELEASE` on \
             each.\n\n\
             Acquisitions/s and Jain's index (over clients' acquisition counts) are over the \
             timed window. Wait = asking to holding every key; waits still open when the \
             window closes (a client then finishes a grant under way, or abandons and gives \
             back what it holds) count with their length so far, so a stall shows in p99 and \
             in \"longest wait open at end\". Sent / acq = commands the clients sent \
             (SUBSCRIBE / UNSUBSCRIBE and abandoned rounds included) per finished acquisition \
             (– when none finished); executed = server calls, Lua's inner calls included. Restarts = module WAIT timeouts asked \
             again, or Redisson rounds that ran out of time. Longest stall = longest time with \
             no acquisition by anybody; progress says when it reached {} ms (100 critical \
             sections) or no acquisition happened at all: a deadlock or livelock, reported \
             instead of waited out. Exclusion is checked in process \
             (an occupant per key, and for the module each key's fencing token must rise): a \
             violation aborts the bench, so every row here had none.\n\n",
            self.reps,
            CRITICAL_SECTION.as_millis(),
            if self.cell_duration < Duration::from_secs(3) {
                "; longer than this run's cells, so no round runs out and restarts stay 0"
            } else {
                ""
            },
            STALL.as_millis(),
        ));
        out.push_str(
            "| N | k | approach | acquisitions/s | wait p50 ms | wait p99 ms | Jain | sent / acq | executed / acq | restarts / acq | longest stall ms | longest wait open at end ms | progress |\n\
             | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
        );
        for cell in &self.cells {
            let (n, k, label) = (cell.clients, cell.keys, cell.approach.label());
            if cell.reps.is_empty() {
                let why = cell.error.as_deref().unwrap_or("not run");
                out.push_str(&format!(
                    "| {n} | {k} | {label} | failed: `{}` |{}\n",
                    why.replace('|', "\\|"),
                    " |".repeat(9)
                ));
                continue;
            }
            let s = |f: fn(&Rep) -> f64, d: usize| fmt_spread(Self::spread(cell, f), d);
            let progress = Self::progress(cell);
            let mut row = format!(
                "| {n} | {k} | {label} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {progress} |",
                s(|r| r.acquisitions_per_sec, 0),
                s(|r| r.wait_p50_ms, 2),
                s(|r| r.wait_p99_ms, 1),
                s(|r| r.jain, 3),
                s(|r| r.sent_per_acquisition, 2),
                s(|r| r.executed_per_acquisition, 1),
                s(|r| r.restarts_per_acquisition, 3),
                s(|r| r.longest_stall_ms, 0),
                s(|r| r.longest_open_wait_ms, 0),
            );
            if let Some(error) = &cell.error {
                row.push_str(&format!(" (later repetition failed: {error})"));
            }
            out.push_str(&row);
            out.push('\n');
        }
        out.push('\n');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checker_flags_a_second_client_inside_a_key() {
        let checker = Checker::new();
        assert!(checker.enter(0, &[1, 2], &[None, None]));
        assert!(!checker.enter(1, &[2, 3], &[None, None]));
        let what = checker.violation.lock().unwrap().clone().unwrap();
        assert!(what.contains("client 1 got key 2 while client 0"), "{what}");
    }

    #[test]
    fn checker_lets_the_next_client_in_after_leave() {
        let checker = Checker::new();
        assert!(checker.enter(0, &[1, 2], &[Some(1), Some(1)]));
        checker.leave(0, &[1, 2]);
        assert!(checker.enter(1, &[2, 1], &[Some(2), Some(2)]));
        assert!(checker.violation.lock().unwrap().is_none());
    }

    #[test]
    fn checker_flags_a_fencing_token_that_does_not_rise() {
        let checker = Checker::new();
        assert!(checker.enter(0, &[4], &[Some(7)]));
        checker.leave(0, &[4]);
        assert!(!checker.enter(1, &[4], &[Some(7)]));
    }

    #[test]
    fn open_waits_and_stalls_are_counted() {
        let ms = 1_000_000;
        let section = |client, requested, acquired| Section {
            client,
            requested,
            acquired,
        };
        // Window 0..1000 ms: client 0 acquires at 100 and 900 ms; client 1 asked at 200 ms
        // and was granted only after the window; client 2 asked at 50 ms and abandoned.
        let outcomes = vec![
            (
                vec![section(0, 0, 100 * ms), section(0, 150 * ms, 900 * ms)],
                None,
                MultiTally::default(),
            ),
            (
                vec![section(1, 200 * ms, 1_100 * ms)],
                None,
                MultiTally::default(),
            ),
            (Vec::new(), Some(50 * ms), MultiTally::default()),
        ];
        let rep = summarize(3, outcomes, 6, (0, 1_000 * ms));
        assert_eq!(rep.acquisitions_per_sec, 2.0);
        assert_eq!(rep.longest_stall_ms, 800.0);
        assert_eq!(rep.longest_open_wait_ms, 950.0);
        assert_eq!(rep.wait_p99_ms, 950.0);
        assert_eq!(rep.executed_per_acquisition, 2.0);
        assert!((rep.jain - 1.0 / 3.0).abs() < 1e-12);
    }
}
