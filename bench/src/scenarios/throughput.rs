//! Scenario 1, uncontended throughput: acquire+release pairs on distinct keys, from 1 and 50
//! connections, unpipelined and pipelined 16 deep, as pairs/s and as server CPU per pair.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use crate::drivers::{acquired, owner_id, pair_args, Approach, Scripts};
use crate::format::{fmt_num, fmt_spread, Target};
use crate::resp::{encode_into, RawConn, Resp};
use crate::server::{self, Probe, ServerOptions};
use crate::stats::Spread;
use crate::Bench;
use lock_testkit::Server;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    pub connections: usize,
    /// Commands per round trip: 1, or 16 acquires then 16 releases.
    pub pipeline: usize,
}

pub const SHAPES: [Shape; 4] = [
    Shape {
        connections: 1,
        pipeline: 1,
    },
    Shape {
        connections: 1,
        pipeline: 16,
    },
    Shape {
        connections: 50,
        pipeline: 1,
    },
    Shape {
        connections: 50,
        pipeline: 16,
    },
];

/// The shape the targets are judged at (and the baseline was measured at).
const TARGET_SHAPE: Shape = Shape {
    connections: 50,
    pipeline: 16,
};

/// Per repetition: pairs/s and server CPU µs per pair, and both as a ratio to SET/DEL measured
/// in the same repetition.
#[derive(Default)]
pub struct Cell {
    pub pairs_per_sec: Vec<f64>,
    pub cpu_us_per_pair: Vec<f64>,
    /// Server main-thread CPU ÷ wall time: near 100% means the server, not the client, was
    /// the limit.
    pub server_busy: Vec<f64>,
    pub rate_vs_floor: Vec<f64>,
    pub cpu_vs_floor: Vec<f64>,
    /// Module pairs/s divided by Redisson pairs/s, same repetition (module cells only).
    pub rate_vs_redisson: Vec<f64>,
}

/// Server CPU of each command alone, µs per call, per repetition.
#[derive(Default)]
pub struct CommandCost {
    pub acquire_us: Vec<f64>,
    pub release_us: Vec<f64>,
}

pub struct Throughput {
    pub cells: HashMap<(Shape, Approach), Cell>,
    pub per_command: HashMap<Approach, CommandCost>,
}

struct Measured {
    pairs_per_sec: f64,
    cpu_us_per_pair: f64,
    server_busy: f64,
}

pub fn run(bench: &Bench) -> Throughput {
    let plan = &bench.plan;
    let server = server::start(&bench.module, &ServerOptions::default());
    let scripts = Scripts::load(&server);
    let mut probe = Probe::new(&server);

    // Warm-up: script compilation, the module's first-call set-up, the dict's first growth.
    for approach in Approach::ALL {
        measure(
            &server,
            &scripts,
            &mut probe,
            approach,
            SHAPES[1],
            Duration::from_millis(100),
            usize::MAX,
        );
    }

    let mut cells: HashMap<(Shape, Approach), Cell> = HashMap::new();
    let mut per_command: HashMap<Approach, CommandCost> = HashMap::new();
    for rep in 0..plan.reps {
        for shape in SHAPES {
            bench.progress(&format!(
                "throughput: rep {}/{}, {} connection(s), pipeline {}",
                rep + 1,
                plan.reps,
                shape.connections,
                shape.pipeline
            ));
            // Rotate the order each repetition so drift on a shared machine hits every
            // approach alike.
            let mut results: HashMap<Approach, Measured> = HashMap::new();
            for i in 0..Approach::ALL.len() {
                let approach = Approach::ALL[(i + rep) % Approach::ALL.len()];
                let m = measure(
                    &server,
                    &scripts,
                    &mut probe,
                    approach,
                    shape,
                    plan.throughput_cell,
                    rep,
                );
                results.insert(approach, m);
            }
            let floor = &results[&Approach::SetDel];
            let redisson_rate = results[&Approach::Redisson].pairs_per_sec;
            for (approach, m) in &results {
                let cell = cells.entry((shape, *approach)).or_default();
                cell.pairs_per_sec.push(m.pairs_per_sec);
                cell.cpu_us_per_pair.push(m.cpu_us_per_pair);
                cell.server_busy.push(m.server_busy);
                cell.rate_vs_floor
                    .push(m.pairs_per_sec / floor.pairs_per_sec);
                cell.cpu_vs_floor
                    .push(m.cpu_us_per_pair / floor.cpu_us_per_pair);
                cell.rate_vs_redisson.push(m.pairs_per_sec / redisson_rate);
            }
        }
        for i in 0..Approach::ALL.len() {
            let approach = Approach::ALL[(i + rep) % Approach::ALL.len()];
            let (acquire_us, release_us) = command_costs(
                &server,
                &scripts,
                &mut probe,
                approach,
                plan.per_command_ops,
                rep,
            );
            let cost = per_command.entry(approach).or_default();
            cost.acquire_us.push(acquire_us);
            cost.release_us.push(release_us);
        }
    }
    Throughput { cells, per_command }
}

/// Runs `shape.connections` clients doing pairs on fresh keys for `duration`.
fn measure(
    server: &Server,
    scripts: &Scripts,
    probe: &mut Probe,
    approach: Approach,
    shape: Shape,
    duration: Duration,
    rep: usize,
) -> Measured {
    let stop = AtomicBool::new(false);
    // Connected first, then the CPU reading, then go: accepting connections is not a pair's cost.
    let ready = Barrier::new(shape.connections + 1);
    let start = Barrier::new(shape.connections + 1);
    let (pairs, failures, elapsed, cpu) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..shape.connections)
            .map(|client| {
                let (stop, ready, start) = (&stop, &ready, &start);
                scope.spawn(move || {
                    let mut conn = RawConn::connect(server.address(0)).expect("connect");
                    let owner = owner_id(client);
                    let prefix = format!("tp:{}:{rep}:{client}:", approach.short());
                    let mut next_key = 0u64;
                    let (mut pairs, mut failures) = (0u64, 0u64);
                    ready.wait();
                    start.wait();
                    while !stop.load(Ordering::Relaxed) {
                        let keys: Vec<String> = (0..shape.pipeline)
                            .map(|_| {
                                next_key += 1;
                                format!("{prefix}{next_key}")
                            })
                            .collect();
                        failures += run_pairs(&mut conn, approach, scripts, &keys, &owner);
                        pairs += keys.len() as u64;
                    }
                    (pairs, failures)
                })
            })
            .collect();
        ready.wait();
        let cpu_before = probe.main_thread_cpu();
        start.wait();
        let began = Instant::now();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        let mut totals = (0u64, 0u64);
        for worker in workers {
            let (pairs, failures) = worker.join().expect("throughput client");
            totals.0 += pairs;
            totals.1 += failures;
        }
        let elapsed = began.elapsed().as_secs_f64();
        let cpu = probe.main_thread_cpu() - cpu_before;
        (totals.0, totals.1, elapsed, cpu)
    });
    assert_eq!(failures, 0, "{approach:?}: an uncontended acquire failed");
    Measured {
        pairs_per_sec: pairs as f64 / elapsed,
        cpu_us_per_pair: cpu * 1e6 / pairs as f64,
        server_busy: cpu / elapsed,
    }
}

/// One round trip carrying the acquires of all `keys`, then one carrying their releases
/// (unpipelined when there is one key). Returns how many acquires failed: none may, the keys
/// are fresh. Commands are encoded straight into one buffer per round trip and replies parsed
/// by the minimal RESP client, so that the client stays cheaper than the server and the
/// server is what gets measured.
fn run_pairs(
    conn: &mut RawConn,
    approach: Approach,
    scripts: &Scripts,
    keys: &[String],
    owner: &str,
) -> u64 {
    let mut acquires = Vec::with_capacity(128 * keys.len());
    let mut releases = Vec::with_capacity(128 * keys.len());
    for key in keys {
        let (acquire, release) = pair_args(approach, scripts, key, owner);
        encode_into(&mut acquires, acquire.iter().map(Vec::as_slice));
        encode_into(&mut releases, release.iter().map(Vec::as_slice));
    }
    conn.send_encoded(&acquires).expect("send acquires");
    let mut failures = 0;
    for _ in keys {
        let reply = conn.read().expect("acquire reply");
        failures += u64::from(!acquired(approach, &reply));
    }
    conn.send_encoded(&releases).expect("send releases");
    for _ in keys {
        let reply = conn.read().expect("release reply");
        assert!(!matches!(reply, Resp::Error(_)), "release: {reply:?}");
    }
    failures
}

/// Server CPU per call of the acquire-side and the release-side command alone: `ops` acquires
/// on fresh keys, pipelined 16 deep on one connection, then `ops` releases.
fn command_costs(
    server: &Server,
    scripts: &Scripts,
    probe: &mut Probe,
    approach: Approach,
    ops: usize,
    rep: usize,
) -> (f64, f64) {
    let mut conn = RawConn::connect(server.address(0)).expect("connect");
    let owner = owner_id(0);
    let pipelines: Vec<(Vec<u8>, Vec<u8>)> = (0..ops)
        .collect::<Vec<_>>()
        .chunks(16)
        .map(|chunk| {
            let (mut acquires, mut releases) = (Vec::new(), Vec::new());
            for i in chunk {
                let key = format!("pc:{}:{rep}:{i}", approach.short());
                let (acquire, release) = pair_args(approach, scripts, &key, &owner);
                encode_into(&mut acquires, acquire.iter().map(Vec::as_slice));
                encode_into(&mut releases, release.iter().map(Vec::as_slice));
            }
            (acquires, releases)
        })
        .collect();
    let batch = |conn: &mut RawConn, bytes: &[u8], count: usize| {
        conn.send_encoded(bytes).expect("send");
        for _ in 0..count {
            let reply = conn.read().expect("reply");
            assert!(!matches!(reply, Resp::Error(_)), "{reply:?}");
        }
    };
    let sizes: Vec<usize> = (0..ops)
        .collect::<Vec<_>>()
        .chunks(16)
        .map(<[usize]>::len)
        .collect();
    let before = probe.main_thread_cpu();
    for ((acquires, _), count) in pipelines.iter().zip(&sizes) {
        batch(&mut conn, acquires, *count);
    }
    let middle = probe.main_thread_cpu();
    for ((_, releases), count) in pipelines.iter().zip(&sizes) {
        batch(&mut conn, releases, *count);
    }
    let after = probe.main_thread_cpu();
    let per_call = |cpu: f64| cpu * 1e6 / ops as f64;
    (per_call(middle - before), per_call(after - middle))
}

/// What each approach's acquire-side and release-side command is, for the report.
fn command_names(approach: Approach) -> (&'static str, &'static str) {
    match approach {
        Approach::Module => ("LOCK.ACQUIRE", "LOCK.RELEASE"),
        Approach::Redisson => ("EVALSHA lock script", "EVALSHA unlock script"),
        Approach::Polling => ("SET NX PX", "EVALSHA compare-and-delete"),
        Approach::SetDel => ("SET", "DEL"),
    }
}

impl Throughput {
    fn cell(&self, shape: Shape, approach: Approach) -> &Cell {
        &self.cells[&(shape, approach)]
    }

    pub fn targets(&self) -> Vec<Target> {
        let module = self.cell(TARGET_SHAPE, Approach::Module);
        let cpu_ratio = Spread::of(&module.cpu_vs_floor);
        let rate_ratio = Spread::of(&module.rate_vs_redisson);
        let floor_cpu = Spread::of(&self.cell(TARGET_SHAPE, Approach::SetDel).cpu_us_per_pair);
        let module_cpu = Spread::of(&module.cpu_us_per_pair);
        vec![
            Target {
                scenario: "1. Uncontended",
                goal: "LOCK.ACQUIRE+LOCK.RELEASE server CPU ≤ 1.2× a SET+DEL pair (50 conns, pipeline 16)"
                    .into(),
                measured: format!(
                    "{}× ({} µs vs {} µs per pair)",
                    fmt_spread(cpu_ratio, 2),
                    fmt_num(module_cpu.median, 2),
                    fmt_num(floor_cpu.median, 2)
                ),
                met: cpu_ratio.median <= 1.2,
            },
            Target {
                scenario: "1. Uncontended",
                goal: "pair throughput ≥ 5× Redisson's pair, pipelined (50 conns, pipeline 16)".into(),
                measured: format!("{}×", fmt_spread(rate_ratio, 1)),
                met: rate_ratio.median >= 5.0,
            },
        ]
    }

    /// Headline numbers: (pairs/s ratio to SET/DEL, CPU µs per pair) at the target shape.
    pub fn headline(&self, approach: Approach) -> (Spread, Spread, Spread) {
        let cell = self.cell(TARGET_SHAPE, approach);
        (
            Spread::of(&cell.pairs_per_sec),
            Spread::of(&cell.rate_vs_floor),
            Spread::of(&cell.cpu_us_per_pair),
        )
    }

    pub fn section(&self) -> String {
        let mut out = String::new();
        out.push_str("## 1. Uncontended throughput\n\n");
        out.push_str(
            "Acquire+release pairs on distinct fresh keys. Pipelined = 16 acquires in one round \
             trip, then their 16 releases in the next. Server CPU is the main thread's \
             `used_cpu_user_main_thread + used_cpu_sys_main_thread` delta divided by pairs. \
             Ratios are to SET/DEL measured in the same repetition. Server busy = server CPU ÷ wall \
             time: near 100% the server is the limit, lower the clients (which share the \
             machine's cores with it) are.\n\n",
        );
        out.push_str(
            "| connections × pipeline | approach | pairs/s | × SET/DEL pairs/s | server CPU µs/pair | × SET/DEL CPU | server busy |\n\
             | --- | --- | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for shape in SHAPES {
            for approach in Approach::ALL {
                let cell = self.cell(shape, approach);
                out.push_str(&format!(
                    "| {} × {} | {} | {} | {} | {} | {} | {}% |\n",
                    shape.connections,
                    shape.pipeline,
                    approach.label(),
                    fmt_spread(Spread::of(&cell.pairs_per_sec), 0),
                    fmt_spread(Spread::of(&cell.rate_vs_floor), 2),
                    fmt_spread(Spread::of(&cell.cpu_us_per_pair), 2),
                    fmt_spread(Spread::of(&cell.cpu_vs_floor), 2),
                    fmt_num(Spread::of(&cell.server_busy).median * 100.0, 0),
                ));
            }
        }
        let module = self.cell(TARGET_SHAPE, Approach::Module);
        out.push_str(&format!(
            "\nModule pairs/s ÷ Redisson pairs/s, same repetition: {}× at 50 × 16, {}× at 1 × 16.\n\n",
            fmt_spread(Spread::of(&module.rate_vs_redisson), 1),
            fmt_spread(
                Spread::of(
                    &self
                        .cell(
                            Shape {
                                connections: 1,
                                pipeline: 16
                            },
                            Approach::Module
                        )
                        .rate_vs_redisson
                ),
                1
            ),
        ));
        out.push_str(
            "**Server CPU per command**, each command alone (fresh keys, one connection, \
             pipeline 16; acquires first, then releases). With one connection every round \
             trip's event-loop and socket cost is shared by 16 commands only, so these are \
             higher than the 50-connection pairs above: compare the rows with each other.\n\n\
             | approach | acquire-side command | µs/call | release-side command | µs/call |\n\
             | --- | --- | ---: | --- | ---: |\n",
        );
        for approach in Approach::ALL {
            let cost = &self.per_command[&approach];
            let (acquire, release) = command_names(approach);
            out.push_str(&format!(
                "| {} | {} | {} | {} | {} |\n",
                approach.label(),
                acquire,
                fmt_spread(Spread::of(&cost.acquire_us), 2),
                release,
                fmt_spread(Spread::of(&cost.release_us), 2),
            ));
        }
        out.push('\n');
        out
    }
}
