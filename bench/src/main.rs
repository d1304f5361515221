//! `make bench`: the lock module next to the two recipes it replaces — Redisson's RLock scripts
//! (waiting by pub/sub) and `SET NX PX` with sleep-and-retry polling — with plain `SET`/`DEL` as
//! the floor, all against one `redis-server` build in one run; and the Rust client library
//! (`clients/rust`) against the raw commands it sends. The machine is shared, so the
//! report gives ratios measured side by side and medians over repetitions with their min–max.
//!
//! `cargo run --release -p lock-bench -- --module <abs path to libredis_lock.so> [--quick]
//! [--only rw,semaphore,crash]` (`--only` takes any of the scenario names in `SCENARIOS`).

mod chart;
mod drivers;
mod format;
mod report;
mod resp;
mod scenarios;
mod server;
mod stats;
mod system;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Sizes and repetitions of a run. `--quick` keeps every scenario but shrinks it to finish in
/// under a minute; the report says which plan it ran.
pub struct Plan {
    pub quick: bool,
    /// Repetitions of every measurement; the report shows their median and min–max.
    pub reps: usize,
    pub throughput_cell: Duration,
    pub per_command_ops: usize,
    pub contention_clients: Vec<usize>,
    pub contention_cell: Duration,
    pub deadline_samples: usize,
    /// Leases and WAIT timeouts are spread over this range (ms) so deadlines do not coincide.
    pub deadline_range_ms: (u64, u64),
    pub waiter_counts: Vec<usize>,
    pub handoff_samples: usize,
    pub held_lock_counts: Vec<usize>,
    pub pair_samples: usize,
    pub memory_locks: usize,
    pub memory_waiters: usize,
    /// Whether to measure BLPOP's and a Redisson subscriber's memory as references; each
    /// costs two more waits for Redis to trim idle buffers, too long for `--quick`.
    pub reference_waiters: bool,
    /// Clients of the read-write lock and semaphore scenarios, and how long each cell runs.
    pub family_clients: Vec<usize>,
    pub family_cell: Duration,
    /// Holder-crash samples: with an EPHEMERAL hold (sequential, fast) and with a lease of
    /// `crash_lease_ms` (in parallel, each waits the lease out).
    pub crash_ephemeral_samples: usize,
    pub crash_lease_samples: usize,
    pub crash_lease_ms: u64,
    /// Acquire+release pairs per side and repetition in the Rust library scenario.
    pub library_pairs: usize,
}

impl Plan {
    fn full() -> Plan {
        Plan {
            quick: false,
            reps: 5,
            throughput_cell: Duration::from_millis(800),
            per_command_ops: 20_000,
            contention_clients: vec![2, 8, 32, 128],
            contention_cell: Duration::from_millis(2000),
            deadline_samples: 100,
            deadline_range_ms: (150, 350),
            waiter_counts: vec![1, 100, 10_000],
            handoff_samples: 2_000,
            held_lock_counts: vec![1_000, 1_000_000],
            pair_samples: 20_000,
            memory_locks: 100_000,
            memory_waiters: 100_000,
            reference_waiters: true,
            family_clients: vec![2, 8, 32],
            family_cell: Duration::from_millis(2000),
            crash_ephemeral_samples: 20,
            crash_lease_samples: 3,
            crash_lease_ms: 5000,
            library_pairs: 10_000,
        }
    }

    fn quick() -> Plan {
        Plan {
            quick: true,
            reps: 3,
            throughput_cell: Duration::from_millis(120),
            per_command_ops: 4_000,
            contention_clients: vec![2, 8, 32],
            contention_cell: Duration::from_millis(250),
            deadline_samples: 40,
            deadline_range_ms: (100, 200),
            waiter_counts: vec![1, 100, 10_000],
            handoff_samples: 300,
            held_lock_counts: vec![1_000, 100_000],
            pair_samples: 3_000,
            memory_locks: 50_000,
            memory_waiters: 10_000,
            reference_waiters: false,
            family_clients: vec![8, 32],
            family_cell: Duration::from_millis(250),
            crash_ephemeral_samples: 20,
            crash_lease_samples: 3,
            crash_lease_ms: 2000,
            library_pairs: 2_000,
        }
    }
}

/// What every scenario needs: the module under test and the plan.
pub struct Bench {
    pub module: PathBuf,
    pub plan: Plan,
    started: Instant,
}

impl Bench {
    /// A progress line on stderr (the report goes to stdout at the end).
    pub fn progress(&self, message: &str) {
        eprintln!("[{:>6.1}s] {message}", self.started.elapsed().as_secs_f64());
    }
}

struct Args {
    module: PathBuf,
    quick: bool,
    out: PathBuf,
    only: Option<Vec<String>>,
}

/// The names `--only` takes, in the order the scenarios run.
const SCENARIOS: [&str; 12] = [
    "throughput",
    "contention",
    "deadlines",
    "scaling",
    "memory",
    "rw",
    "semaphore",
    "crash",
    "library",
    "multikey",
    "guard",
    "tickets",
];

fn usage() -> ! {
    eprintln!(
        "usage: lock-bench --module <abs path to libredis_lock.so> [--quick] [--out <dir>] \
         [--only {}]",
        SCENARIOS.join(",")
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut module = None;
    let mut quick = false;
    let mut out = workspace_root().join("bench-out");
    let mut only = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--module" => module = Some(PathBuf::from(args.next().unwrap_or_else(|| usage()))),
            "--quick" => quick = true,
            "--out" => out = PathBuf::from(args.next().unwrap_or_else(|| usage())),
            "--only" => {
                let list = args.next().unwrap_or_else(|| usage());
                let names: Vec<String> = list.split(',').map(str::to_string).collect();
                if let Some(unknown) = names.iter().find(|n| !SCENARIOS.contains(&n.as_str())) {
                    eprintln!("unknown scenario {unknown:?}");
                    usage();
                }
                only = Some(names);
            }
            _ => usage(),
        }
    }
    let module = module.unwrap_or_else(|| usage());
    if !module.is_file() {
        eprintln!("no module at {} (build it: make build)", module.display());
        std::process::exit(2);
    }
    Args {
        module,
        quick,
        out,
        only,
    }
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench/ sits in the workspace")
        .to_path_buf()
}

fn main() {
    let args = parse_args();
    let plan = if args.quick {
        Plan::quick()
    } else {
        Plan::full()
    };
    // Tens of thousands of connections on each side: the bench and the servers it starts
    // (which inherit the limit) need far more descriptors than the default.
    system::raise_open_files_limit(2 * plan.memory_waiters as u64 + 20_000);
    let bench = Bench {
        module: args.module.clone(),
        plan,
        started: Instant::now(),
    };
    let wanted = |name: &str| {
        args.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|o| o == name))
    };
    let machine = system::Machine::describe(&bench.module);

    let throughput = wanted("throughput").then(|| scenarios::throughput::run(&bench));
    let contention = wanted("contention").then(|| scenarios::contention::run(&bench));
    let deadlines = wanted("deadlines").then(|| scenarios::deadlines::run(&bench));
    let scaling = wanted("scaling").then(|| scenarios::scaling::run(&bench));
    let memory = wanted("memory").then(|| scenarios::memory::run(&bench));
    let rw = wanted("rw")
        .then(|| scenarios::family::run(&bench, scenarios::family::Workload::ReadWrite));
    let semaphore = wanted("semaphore")
        .then(|| scenarios::family::run(&bench, scenarios::family::Workload::Semaphore));
    let crash = wanted("crash").then(|| scenarios::crash::run(&bench));
    let library = wanted("library").then(|| scenarios::library::run(&bench));
    let multikey = wanted("multikey").then(|| scenarios::multikey::run(&bench));
    let guard = wanted("guard").then(|| scenarios::guard::run(&bench));
    let tickets = wanted("tickets").then(|| scenarios::tickets::run(&bench));

    let results = report::Results {
        throughput,
        contention,
        deadlines,
        scaling,
        memory,
        rw,
        semaphore,
        crash,
        multikey,
        library,
        guard,
        tickets,
    };
    let wall = bench.started.elapsed();
    let chart = results
        .contention
        .as_ref()
        .map(|c| chart::contention_svg(&c.chart_series(), &bench.plan));
    let markdown = report::render(&bench, &machine, &results, wall, chart.is_some());

    std::fs::create_dir_all(&args.out).expect("create the output directory");
    std::fs::write(args.out.join("report.md"), &markdown).expect("write report.md");
    if let Some(svg) = chart {
        std::fs::write(args.out.join("contention.svg"), svg).expect("write contention.svg");
    }
    println!("{markdown}");
    bench.progress(&format!(
        "report written to {}",
        args.out.join("report.md").display()
    ));
}
