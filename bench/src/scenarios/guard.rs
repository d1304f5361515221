//! Scenario `guard`: what a fenced write costs. One exclusive lock held with a long lease, and
//! the same `SET` sent three ways, side by side in one run, each repetition in another order:
//!
//! - plain `SET key value` (no fence: the floor);
//! - `LOCK.GUARD lock owner token SET key value`;
//! - the Lua recipe users write today, in one `EVALSHA`: check the lock hash (the check
//!   docs/commands.md gives beside LOCK.CHECK, read from there), then `SET`.
//!
//! Each runs from `CONNECTIONS` connections for a cell, pipelined 16 deep (the targets are
//! judged there) and unpipelined; the figure is the server's main-thread CPU per call. Then
//! `LOCK.CHECK` alone, on the exclusive lock and on a shared key of `SHARED_HOLDERS` holds (it
//! reads only the owner's fields: O(1)), against the recipe's check on the same two keys.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use crate::drivers::load_script;
use crate::format::{fmt_num, fmt_spread, Target};
use crate::resp::{encode_into, RawConn, Resp};
use crate::server::{self, Probe, ServerOptions};
use crate::stats::Spread;
use crate::Bench;
use lock_testkit::Server;

const CONNECTIONS: usize = 50;
/// Pipelined 16 deep, where the server's cost of each command shows (the targets are judged
/// here), and unpipelined, as most applications send commands.
const PIPELINES: [usize; 2] = [16, 1];
/// The checks run pipelined.
const PIPELINE: usize = 16;
/// Holds of the shared key LOCK.CHECK reads in its O(1) row: the most a stored key is read with
/// (new holds stop at 1,000 a key; keys written before with more are still locks).
const SHARED_HOLDERS: usize = 10_000;
const LOCK: &str = "{fence}:lock";
const SHARED_LOCK: &str = "{fence}:shared";
const OWNER: &str = "bench-owner";

/// What is sent, each call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    Set,
    Guard,
    Recipe,
    /// LOCK.CHECK on the exclusive lock / on the shared key of `SHARED_HOLDERS` holds.
    Check,
    CheckShared,
    /// The recipe's check alone (no write), on the same two keys.
    RecipeCheck,
    RecipeCheckShared,
}

impl Way {
    const WRITES: [Way; 3] = [Way::Set, Way::Guard, Way::Recipe];
    const CHECKS: [Way; 4] = [
        Way::Check,
        Way::CheckShared,
        Way::RecipeCheck,
        Way::RecipeCheckShared,
    ];

    fn label(self) -> &'static str {
        match self {
            Way::Set => "`SET` (no fence)",
            Way::Guard => "`LOCK.GUARD ... SET`",
            Way::Recipe => "Lua recipe: check the lock hash, then `SET` (one `EVALSHA`)",
            Way::Check => "`LOCK.CHECK`, exclusive lock",
            Way::CheckShared => "`LOCK.CHECK`, shared key of 10,000 holds",
            Way::RecipeCheck => "Lua recipe's check, exclusive lock",
            Way::RecipeCheckShared => "Lua recipe's check, shared key of 10,000 holds",
        }
    }
}

/// Per way and pipeline depth: calls/s and server CPU µs per call, one entry per repetition,
/// and the ratios to `SET` and to the recipe in the same repetition (the writes only).
#[derive(Default, Clone)]
pub struct Row {
    pub calls_per_sec: Vec<f64>,
    pub cpu_us: Vec<f64>,
    pub vs_set: Vec<f64>,
    pub vs_recipe: Vec<f64>,
}

pub struct Guard {
    pub rows: Vec<((Way, usize), Row)>,
    pub cell: Duration,
}

struct Setup {
    token: i64,
    shared_token: i64,
    /// EVALSHA of the write recipe and of the check alone.
    write_sha: String,
    check_sha: String,
}

pub fn run(bench: &Bench) -> Guard {
    let plan = &bench.plan;
    let server = server::start(
        &bench.module,
        &ServerOptions {
            maxclients: Some(CONNECTIONS + 100),
            ..ServerOptions::default()
        },
    );
    let setup = prepare(&server);
    let mut probe = Probe::new(&server);
    let cell = plan.throughput_cell;
    // Warm-up: script compilation, the first calls of each path.
    for way in Way::WRITES.iter().chain(&Way::CHECKS) {
        measure(
            &server,
            &setup,
            &mut probe,
            *way,
            PIPELINE,
            Duration::from_millis(100),
        );
    }
    let cells: Vec<(Way, usize)> = PIPELINES
        .iter()
        .flat_map(|&depth| Way::WRITES.iter().map(move |&w| (w, depth)))
        .chain(Way::CHECKS.iter().map(|&w| (w, PIPELINE)))
        .collect();
    let mut rows: Vec<((Way, usize), Row)> =
        cells.iter().map(|&cell| (cell, Row::default())).collect();
    for rep in 0..plan.reps {
        bench.progress(&format!("guard: rep {}/{}", rep + 1, plan.reps));
        let mut measured: Vec<((Way, usize), (f64, f64))> = Vec::new();
        let groups: Vec<Vec<(Way, usize)>> = PIPELINES
            .iter()
            .map(|&depth| Way::WRITES.iter().map(|&w| (w, depth)).collect())
            .chain([Way::CHECKS.iter().map(|&w| (w, PIPELINE)).collect()])
            .collect();
        for group in &groups {
            for i in 0..group.len() {
                // Rotate the order each repetition so drift hits every way alike.
                let (way, depth) = group[(i + rep) % group.len()];
                let m = measure(&server, &setup, &mut probe, way, depth, cell);
                measured.push(((way, depth), m));
            }
        }
        let cpu_of = |cell: (Way, usize)| {
            measured
                .iter()
                .find(|(c, _)| *c == cell)
                .map_or(f64::NAN, |(_, (_, cpu))| *cpu)
        };
        for ((way, depth), (rate, cpu)) in &measured {
            let row = &mut rows
                .iter_mut()
                .find(|(c, _)| *c == (*way, *depth))
                .expect("a row per cell")
                .1;
            row.calls_per_sec.push(*rate);
            row.cpu_us.push(*cpu);
            row.vs_set.push(cpu / cpu_of((Way::Set, *depth)));
            row.vs_recipe.push(cpu / cpu_of((Way::Recipe, *depth)));
        }
    }
    Guard { rows, cell }
}

/// The lock held for the whole run, a shared key of `SHARED_HOLDERS` holds, and the recipes
/// loaded.
fn prepare(server: &Server) -> Setup {
    let mut con = server.connect();
    let token: i64 = redis::cmd("LOCK.ACQUIRE")
        .arg(LOCK)
        .arg(OWNER)
        .arg(3_600_000)
        .query(&mut con)
        .expect("LOCK.ACQUIRE");
    // The shared key, written in its stored layout (docs/commands.md, *How a lock is stored*):
    // taking 10,000 holds one LOCK.ACQUIRE at a time reads the key's holds each time.
    let (seconds, _micros): (u64, u64) = redis::cmd("TIME").query(&mut con).expect("TIME");
    let lease_end = seconds * 1000 + 3_600_000;
    let hold = |i: usize| {
        (
            format!("s:reader-{i}"),
            format!("1:{lease_end}:{}", 1_000_000 + i),
        )
    };
    let _: () = redis::cmd("HSET")
        .arg(SHARED_LOCK)
        .arg("mode")
        .arg("rw")
        .query(&mut con)
        .expect("HSET");
    for chunk in (0..SHARED_HOLDERS).collect::<Vec<_>>().chunks(1_000) {
        let fields: Vec<(String, String)> = chunk.iter().map(|&i| hold(i)).collect();
        let _: () = redis::cmd("HSET")
            .arg(SHARED_LOCK)
            .arg(fields)
            .query(&mut con)
            .expect("HSET");
    }
    let _: () = redis::cmd("PEXPIREAT")
        .arg(SHARED_LOCK)
        .arg(lease_end)
        .query(&mut con)
        .expect("PEXPIREAT");
    let shared_token = 1_000_000 + (SHARED_HOLDERS / 2) as i64;
    let holders: i64 = redis::cmd("LOCK.INFO")
        .arg(SHARED_LOCK)
        .query::<redis::Value>(&mut con)
        .map(|info| match info {
            redis::Value::Bulk(fields) => fields
                .chunks(2)
                .find_map(|pair| match pair {
                    [redis::Value::Data(name), redis::Value::Bulk(holds)] if name == b"holders" => {
                        Some(holds.len() as i64)
                    }
                    _ => None,
                })
                .unwrap_or(0),
            _ => 0,
        })
        .expect("LOCK.INFO");
    assert_eq!(holders, SHARED_HOLDERS as i64, "the shared key is a lock");
    let check = documented_check();
    let write = format!(
        "{check}\nif holds(KEYS[1], ARGV[1], ARGV[2]) == 1 then \
         return redis.call('SET', KEYS[2], ARGV[3]) end \
         return redis.error_reply('FENCED the hold is gone or its token is not current')"
    );
    let check = format!("{check}\nreturn holds(KEYS[1], ARGV[1], ARGV[2])");
    Setup {
        token,
        shared_token,
        write_sha: load_script(&mut con, &write),
        check_sha: load_script(&mut con, &check),
    }
}

/// The `holds(key, owner, token)` function of the Lua recipe in docs/commands.md (its block,
/// without the final `return`).
fn documented_check() -> String {
    let path = crate::workspace_root().join("docs/commands.md");
    let docs = std::fs::read_to_string(&path).expect("docs/commands.md");
    let marker = "<!-- LOCK.CHECK in Lua: tests/guard.rs runs this block -->";
    let after = &docs[docs.find(marker).expect("the recipe's marker") + marker.len()..];
    let start = after.find("```lua\n").expect("a lua block") + "```lua\n".len();
    let block = &after[start..start + after[start..].find("```").expect("its end")];
    block
        .lines()
        .filter(|l| !l.starts_with("return holds("))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The command line of one call.
fn call(way: Way, setup: &Setup, data: &str) -> Vec<Vec<u8>> {
    let token = setup.token.to_string();
    let shared_token = setup.shared_token.to_string();
    let shared_owner = format!("reader-{}", SHARED_HOLDERS / 2);
    let words: Vec<&str> = match way {
        Way::Set => vec!["SET", data, "value"],
        Way::Guard => vec!["LOCK.GUARD", LOCK, OWNER, &token, "SET", data, "value"],
        Way::Recipe => vec![
            "EVALSHA",
            &setup.write_sha,
            "2",
            LOCK,
            data,
            OWNER,
            &token,
            "value",
        ],
        Way::Check => vec!["LOCK.CHECK", LOCK, OWNER, &token],
        Way::CheckShared => vec!["LOCK.CHECK", SHARED_LOCK, &shared_owner, &shared_token],
        Way::RecipeCheck => vec!["EVALSHA", &setup.check_sha, "1", LOCK, OWNER, &token],
        Way::RecipeCheckShared => vec![
            "EVALSHA",
            &setup.check_sha,
            "1",
            SHARED_LOCK,
            &shared_owner,
            &shared_token,
        ],
    };
    words.into_iter().map(|w| w.as_bytes().to_vec()).collect()
}

/// `CONNECTIONS` clients sending `way` pipelined `depth` deep for `duration`: calls/s and
/// server CPU µs per call. Every reply is checked: a write is `OK`, a check `1`.
fn measure(
    server: &Server,
    setup: &Setup,
    probe: &mut Probe,
    way: Way,
    depth: usize,
    duration: Duration,
) -> (f64, f64) {
    let stop = AtomicBool::new(false);
    let ready = Barrier::new(CONNECTIONS + 1);
    let start = Barrier::new(CONNECTIONS + 1);
    let (calls, elapsed, cpu) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..CONNECTIONS)
            .map(|client| {
                let (stop, ready, start) = (&stop, &ready, &start);
                scope.spawn(move || {
                    let mut conn = RawConn::connect(server.address(0)).expect("connect");
                    let data = format!("{{fence}}:data:{client}");
                    let mut batch = Vec::new();
                    let one = call(way, setup, &data);
                    for _ in 0..depth {
                        encode_into(&mut batch, one.iter().map(Vec::as_slice));
                    }
                    let mut calls = 0u64;
                    ready.wait();
                    start.wait();
                    while !stop.load(Ordering::Relaxed) {
                        conn.send_encoded(&batch).expect("send");
                        for _ in 0..depth {
                            match conn.read().expect("reply") {
                                Resp::Simple(ok) if ok == "OK" => {}
                                Resp::Int(1) => {}
                                other => panic!("{way:?}: {other:?}"),
                            }
                        }
                        calls += depth as u64;
                    }
                    calls
                })
            })
            .collect();
        ready.wait();
        let cpu_before = probe.main_thread_cpu();
        start.wait();
        let began = Instant::now();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        let calls: u64 = workers
            .into_iter()
            .map(|w| w.join().expect("guard client"))
            .sum();
        let elapsed = began.elapsed().as_secs_f64();
        (calls, elapsed, probe.main_thread_cpu() - cpu_before)
    });
    (calls as f64 / elapsed, cpu * 1e6 / calls as f64)
}

impl Guard {
    fn row(&self, way: Way, depth: usize) -> &Row {
        &self
            .rows
            .iter()
            .find(|(c, _)| *c == (way, depth))
            .expect("a row per cell")
            .1
    }

    pub fn targets(&self) -> Vec<Target> {
        let guard = self.row(Way::Guard, PIPELINE);
        let vs_recipe = Spread::of(&guard.vs_recipe);
        let vs_set = Spread::of(&guard.vs_set);
        let cpu = |way| fmt_num(Spread::of(&self.row(way, PIPELINE).cpu_us).median, 2);
        vec![
            Target {
                scenario: "Fenced writes",
                goal: "LOCK.GUARD ... SET server CPU ≤ the Lua recipe's (check the lock hash, then SET, one EVALSHA; 50 conns, pipeline 16)".into(),
                measured: format!(
                    "{}× ({} µs vs {} µs per call)",
                    fmt_spread(vs_recipe, 2),
                    cpu(Way::Guard),
                    cpu(Way::Recipe)
                ),
                met: vs_recipe.median <= 1.0,
            },
            Target {
                scenario: "Fenced writes",
                goal: "LOCK.GUARD ... SET server CPU within 2× a plain SET (50 conns, pipeline 16)".into(),
                measured: format!(
                    "{}× ({} µs vs {} µs per call)",
                    fmt_spread(vs_set, 2),
                    cpu(Way::Guard),
                    cpu(Way::Set)
                ),
                met: vs_set.median <= 2.0,
            },
        ]
    }

    pub fn section(&self) -> String {
        let mut out = String::from("## Fenced writes (`LOCK.GUARD`, `LOCK.CHECK`)\n\n");
        out.push_str(&format!(
            "One exclusive lock held for the whole run; {CONNECTIONS} connections each send the \
             same call, pipelined 16 deep (where each command's own cost shows; the targets are \
             judged there) and unpipelined (as most applications send), for {} ms per cell, \
             each repetition in another order. Server CPU is the main thread's CPU delta divided \
             by calls; ratios are to `SET` and to the Lua recipe measured in the same repetition \
             at the same depth. The recipe is the check docs/commands.md gives beside \
             `LOCK.CHECK` (read from there), then the `SET`, in one `EVALSHA`.\n\n\
             | pipeline | call | calls/s | server CPU µs/call | × SET | × Lua recipe |\n\
             | ---: | --- | ---: | ---: | ---: | ---: |\n",
            self.cell.as_millis()
        ));
        for depth in PIPELINES {
            for way in Way::WRITES {
                let row = self.row(way, depth);
                out.push_str(&format!(
                    "| {depth} | {} | {} | {} | {} | {} |\n",
                    way.label(),
                    fmt_spread(Spread::of(&row.calls_per_sec), 0),
                    fmt_spread(Spread::of(&row.cpu_us), 2),
                    fmt_spread(Spread::of(&row.vs_set), 2),
                    fmt_spread(Spread::of(&row.vs_recipe), 2),
                ));
            }
        }
        out.push_str(
            "\n**The check alone**, on the exclusive lock and on a shared key of 10,000 holds \
             (`LOCK.CHECK` reads the owner's own fields only; the recipe's check reads the \
             mode and up to three fields):\n\n\
             | call | calls/s | server CPU µs/call |\n| --- | ---: | ---: |\n",
        );
        for way in Way::CHECKS {
            let row = self.row(way, PIPELINE);
            out.push_str(&format!(
                "| {} | {} | {} |\n",
                way.label(),
                fmt_spread(Spread::of(&row.calls_per_sec), 0),
                fmt_spread(Spread::of(&row.cpu_us), 2),
            ));
        }
        out.push('\n');
        out
    }
}
