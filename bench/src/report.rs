//! The Markdown report: run facts, targets met or missed, a headline table, one section per
//! scenario, and how each recipe was driven.

use std::time::Duration;

use crate::drivers::{
    Approach, COMPARE_AND_DELETE, POLL_INTERVAL_MS, REDISSON_LOCK, REDISSON_UNLOCK,
};
use crate::format::{fmt_num, Target};
use crate::scenarios::contention::Contention;
use crate::scenarios::crash::Crash;
use crate::scenarios::deadlines::{Deadlines, Kind};
use crate::scenarios::family::Family;
use crate::scenarios::guard::Guard;
use crate::scenarios::library::Library;
use crate::scenarios::memory::Memory;
use crate::scenarios::multikey::MultiKey;
use crate::scenarios::scaling::Scaling;
use crate::scenarios::throughput::Throughput;
use crate::scenarios::tickets::Tickets;
use crate::system::Machine;
use crate::Bench;

pub struct Results {
    pub throughput: Option<Throughput>,
    pub contention: Option<Contention>,
    pub deadlines: Option<Deadlines>,
    pub scaling: Option<Scaling>,
    pub memory: Option<Memory>,
    pub rw: Option<Family>,
    pub semaphore: Option<Family>,
    pub crash: Option<Crash>,
    pub multikey: Option<MultiKey>,
    pub library: Option<Library>,
    pub guard: Option<Guard>,
    pub tickets: Option<Tickets>,
}

fn targets(results: &Results) -> Vec<Target> {
    let mut all = Vec::new();
    if let Some(t) = &results.throughput {
        all.extend(t.targets());
    }
    if let Some(c) = &results.contention {
        all.extend(c.targets());
    }
    if let Some(d) = &results.deadlines {
        all.extend(d.targets());
    }
    if let Some(s) = &results.scaling {
        all.extend(s.targets());
    }
    if let Some(m) = &results.memory {
        all.extend(m.targets());
    }
    for family in [&results.rw, &results.semaphore].into_iter().flatten() {
        all.extend(family.targets());
    }
    if let Some(l) = &results.library {
        all.extend(l.targets());
    }
    if let Some(g) = &results.guard {
        all.extend(g.targets());
    }
    if let Some(t) = &results.tickets {
        all.extend(t.targets());
    }
    all
}

/// The table the README quotes: each approach's key figures side by side.
fn headline(results: &Results) -> String {
    let n = results.contention.as_ref().map_or(0, |c| c.headline_n());
    let mut out = format!(
        "| | pairs/s (50 conns × pipeline 16) | × SET/DEL | server CPU µs/pair | critical sections/s (N={n}) | server commands / acquisition | wake-ups / release | handoff gap p50 ms | Jain | lease-expiry handoff p99 ms | bytes / held lock |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    );
    for approach in Approach::ALL {
        let mut cells: Vec<String> = Vec::new();
        match &results.throughput {
            Some(t) => {
                let (rate, ratio, cpu) = t.headline(approach);
                cells.push(fmt_num(rate.median, 0));
                cells.push(format!("{}×", fmt_num(ratio.median, 2)));
                cells.push(fmt_num(cpu.median, 2));
            }
            None => cells.extend(["".into(), "".into(), "".into()]),
        }
        match (&results.contention, approach) {
            (Some(c), Approach::Module | Approach::Redisson | Approach::Polling) => {
                let row = c.headline(approach);
                cells.push(fmt_num(row.sections_per_sec.median, 0));
                cells.push(fmt_num(row.executed_per_acquisition.median, 1));
                cells.push(
                    row.wakeups
                        .map_or("— (polls)".into(), |w| fmt_num(w.median, 2)),
                );
                cells.push(fmt_num(row.gap_p50_ms.median, 3));
                cells.push(fmt_num(row.jain.median, 3));
            }
            _ => cells.extend(std::iter::repeat_n("—".to_string(), 5)),
        }
        let lease_kind = match approach {
            Approach::Module => Some(Kind::ModuleLeaseExpiry),
            Approach::Redisson => Some(Kind::RedissonLeaseExpiry),
            Approach::Polling => Some(Kind::PollingLeaseExpiry),
            Approach::SetDel => None,
        };
        cells.push(match (&results.deadlines, lease_kind) {
            (Some(d), Some(kind)) => fmt_num(d.p99(kind).median, 2),
            _ => "—".into(),
        });
        cells.push(match (&results.memory, approach) {
            (Some(m), Approach::Module | Approach::Redisson | Approach::Polling) => {
                fmt_num(m.bytes_per_lock(approach).median, 0)
            }
            _ => "—".into(),
        });
        out.push_str(&format!(
            "| {} | {} |\n",
            approach.label(),
            cells.join(" | ")
        ));
    }
    out
}

pub fn render(
    bench: &Bench,
    machine: &Machine,
    results: &Results,
    wall: Duration,
    has_chart: bool,
) -> String {
    let plan = &bench.plan;
    let mut out = String::new();
    out.push_str(
        "# lock-bench: the LOCK.* module against Redisson's RLock and SET NX PX polling\n\n",
    );
    let command: Vec<String> = std::env::args().skip(1).collect();
    out.push_str(&format!(
        "- Run: `{}` ({}), wall time **{:.0} s**\n\
         - Exact command: `cargo run --release -p lock-bench -- {}`\n\
         - Redis: {} — one server build for every approach; each scenario starts its own \
         server: `{}`\n\
         - Module: `{}` ({} bytes, commit {})\n\
         - Machine: {} × {} logical CPUs, {:.1} GiB RAM, {}, kernel {}; load average at start {} \
         (shared machine: compare ratios within a run, not absolute figures across runs)\n\
         - Bench built with {}; figures are medians over {} repetitions, (min–max) shown when \
         they differ. The clients run on the same cores as the server: server CPU per \
         operation is the steadiest figure; rates and latencies include the clients' own \
         scheduling\n\n",
        if plan.quick {
            "make bench-quick"
        } else {
            "make bench"
        },
        if plan.quick {
            "quick: fewer repetitions, shorter runs, smaller N"
        } else {
            "full"
        },
        wall.as_secs_f64(),
        command.join(" "),
        machine.redis_server,
        crate::server::command_line(&bench.module),
        bench.module.display(),
        fmt_num(machine.module_size as f64, 0),
        machine.module_commit,
        machine.cpu,
        machine.cores,
        machine.memory_gib,
        machine.os,
        machine.kernel,
        machine.load_average,
        machine.rustc,
        plan.reps,
    ));

    let targets = targets(results);
    if !targets.is_empty() {
        let met = targets.iter().filter(|t| t.met).count();
        out.push_str(&format!(
            "## Targets: {met} of {} met\n\nJudged on the median over repetitions, like every figure here; exact counts, \
             wake-up bounds and exclusion must hold in every repetition.\n\n\
             | scenario | target | measured (median (min–max)) | met |\n| --- | --- | --- | :---: |\n",
            targets.len()
        ));
        for t in &targets {
            out.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                t.scenario,
                t.goal,
                t.measured,
                if t.met { "yes" } else { "**no**" }
            ));
        }
        out.push('\n');
    }

    // The headline quotes scenarios 1–5: without any of them it would be an empty table.
    if results.throughput.is_some()
        || results.contention.is_some()
        || results.deadlines.is_some()
        || results.memory.is_some()
    {
        out.push_str("## Headline\n\n");
        out.push_str(&headline(results));
        out.push('\n');
    }

    if let Some(t) = &results.throughput {
        out.push_str(&t.section());
    }
    if let Some(c) = &results.contention {
        let mut section = c.section(plan);
        if !has_chart {
            section = section.replace("![contention](contention.svg)\n\n", "");
        }
        out.push_str(&section);
    }
    if let Some(d) = &results.deadlines {
        out.push_str(&d.section(plan));
    }
    if let Some(s) = &results.scaling {
        out.push_str(&s.section());
    }
    if let Some(m) = &results.memory {
        out.push_str(&m.section());
    }
    if let Some(rw) = &results.rw {
        out.push_str(&rw.section());
    }
    if let Some(semaphore) = &results.semaphore {
        out.push_str(&semaphore.section());
    }
    if let Some(crash) = &results.crash {
        out.push_str(&crash.section(plan));
    }
    if let Some(library) = &results.library {
        out.push_str(&library.section());
    }
    if let Some(multikey) = &results.multikey {
        out.push_str(&multikey.section());
    }
    if let Some(guard) = &results.guard {
        out.push_str(&guard.section());
    }
    if let Some(tickets) = &results.tickets {
        out.push_str(&tickets.section());
    }
    out.push_str(&method());
    out
}

fn method() -> String {
    format!(
        "## How each approach is driven\n\n\
         Drivers are Rust threads, one connection per simulated client (`redis` crate; pub/sub \
         and the many-connection scenarios use a minimal RESP client), on the same machine as \
         the server.\n\n\
         - **LOCK.* module**: `LOCK.ACQUIRE key owner 30000 WAIT 10000`, then \
         `LOCK.RELEASE key owner`.\n\
         - **Redisson RLock**: `EVALSHA <lock> 1 key 30000 owner`; on a ttl reply, SUBSCRIBE \
         `redisson_lock__channel:{{key}}` on the client's subscription connection, retry the \
         lock script, and after each failure wait for an unlock message (at most the ttl) and \
         retry; UNSUBSCRIBE once acquired (Redisson's `RLock.lock()`). Release: `EVALSHA \
         <unlock> 2 key channel 0 30000 owner`. Scripts verbatim:\n  - lock: `{REDISSON_LOCK}`\n  \
         - unlock: `{REDISSON_UNLOCK}`\n\
         - **SET NX PX polling**: `SET key token NX PX 30000`; on nil sleep a uniformly random \
         {}–{} ms and retry. Release: `EVALSHA <cad> 1 key token` with `{COMPARE_AND_DELETE}`.\n\
         - **SET/DEL floor**: `SET key value`, `DEL key`.\n\n",
        POLL_INTERVAL_MS.0, POLL_INTERVAL_MS.1
    )
}
