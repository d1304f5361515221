//! Scenario `tickets`: waiting with a ticket (`LOCK.ACQUIRE ... WAIT t TICKET`, then `BLPOP`
//! on the ticket) against waiting blocked in the server (`LOCK.ACQUIRE ... WAIT t`), side by
//! side on one server build:
//!
//! - **memory per waiter**, connections excluded: `used_memory` with every connection open and
//!   idle, against every waiter queued. Blocked waiters need a connection each; ticket waiters
//!   are asked for on one connection and popped by connections that each block on
//!   `TICKETS_PER_POPPER` tickets at once (`BLPOP t1 ... tk`), as a library multiplexes.
//! - **contended throughput**: `clients` clients on one lock, each looping acquire (waiting),
//!   a short critical section, release; critical sections per second and the server's CPU per
//!   section.
//! - **handoff latency**: two clients pass one lock back and forth; from the release sent to the
//!   waiter's token read (its `WAIT` reply, or its `BLPOP` reply), the waiter already blocked.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use crate::format::{fmt_spread, Target};
use crate::resp::{RawConn, Resp};
use crate::server::{self, Probe, ServerOptions};
use crate::stats::{percentile, Spread};
use crate::Bench;
use lock_testkit::Server;

const TICKETS_PER_POPPER: usize = 100;
/// The blocked waiters measured for memory: each holds a connection and about 36 KB of the
/// server's, so a few thousand show the figure (and the server frees their spare clients at 50
/// every 100 ms once they are gone, which the next measurement waits out).
const BLOCKED_FOR_MEMORY: usize = 2_000;
const CRITICAL_SECTION: Duration = Duration::from_micros(20);
const KEY: &str = "{tickets}:lock";
const LEASE: &[u8] = b"60000";
const WAIT: &[u8] = b"60000";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    Blocked,
    Ticket,
}

impl Way {
    const BOTH: [Way; 2] = [Way::Blocked, Way::Ticket];

    fn label(self) -> &'static str {
        match self {
            Way::Blocked => "blocked (`WAIT t`)",
            Way::Ticket => "ticket (`WAIT t TICKET` + `BLPOP`)",
        }
    }
}

pub struct MemoryRow {
    pub way: Way,
    pub waiters: usize,
    /// Connections the waiters used (excluded from the figure).
    pub connections: usize,
    pub bytes_each: Vec<f64>,
}

#[derive(Default)]
pub struct ThroughputRow {
    pub sections_per_sec: Vec<f64>,
    pub cpu_us: Vec<f64>,
}

#[derive(Default)]
pub struct HandoffRow {
    pub p50_us: Vec<f64>,
    pub p99_us: Vec<f64>,
}

pub struct Tickets {
    pub memory: Vec<MemoryRow>,
    pub throughput: Vec<((Way, usize), ThroughputRow)>,
    pub handoff: Vec<(Way, HandoffRow)>,
    pub cell: Duration,
    pub handoffs: usize,
}

pub fn run(bench: &Bench) -> Tickets {
    let plan = &bench.plan;
    let ticketed = plan.memory_waiters / TICKETS_PER_POPPER * TICKETS_PER_POPPER;
    let blocked = BLOCKED_FOR_MEMORY.min(ticketed);
    let mut memory = vec![
        MemoryRow {
            way: Way::Blocked,
            waiters: blocked,
            connections: blocked,
            bytes_each: Vec::new(),
        },
        MemoryRow {
            way: Way::Ticket,
            waiters: ticketed,
            connections: ticketed / TICKETS_PER_POPPER + 1,
            bytes_each: Vec::new(),
        },
    ];
    let mut throughput: Vec<((Way, usize), ThroughputRow)> = plan
        .family_clients
        .iter()
        .flat_map(|&c| Way::BOTH.map(|w| ((w, c), ThroughputRow::default())))
        .collect();
    let mut handoff: Vec<(Way, HandoffRow)> = Way::BOTH.map(|w| (w, HandoffRow::default())).into();
    let server = server::start(
        &bench.module,
        &ServerOptions {
            maxclients: Some(ticketed / TICKETS_PER_POPPER + blocked + 200),
            module_args: vec!["max-waiters-per-key".into(), (ticketed + 1).to_string()],
            ..ServerOptions::default()
        },
    );
    let mut probe = Probe::new(&server);
    for rep in 0..plan.reps {
        bench.progress(&format!("tickets: rep {}/{}", rep + 1, plan.reps));
        // Each repetition in another order, so that drift hits both ways alike.
        let order = if rep % 2 == 0 {
            Way::BOTH
        } else {
            [Way::Ticket, Way::Blocked]
        };
        for way in order {
            let row = memory.iter_mut().find(|r| r.way == way).expect("a row");
            row.bytes_each
                .push(memory_per_waiter(&server, &mut probe, way, row.waiters));
        }
        for &clients in &plan.family_clients {
            for way in order {
                let (rate, cpu) = contended(&server, &mut probe, way, clients, plan.family_cell);
                let row = &mut throughput
                    .iter_mut()
                    .find(|(c, _)| *c == (way, clients))
                    .expect("a row")
                    .1;
                row.sections_per_sec.push(rate);
                row.cpu_us.push(cpu);
            }
        }
        for way in order {
            let samples = handoffs(&server, &mut probe, way, plan.handoff_samples);
            let row = &mut handoff
                .iter_mut()
                .find(|(w, _)| *w == way)
                .expect("a row")
                .1;
            row.p50_us.push(percentile(&samples, 50.0));
            row.p99_us.push(percentile(&samples, 99.0));
        }
    }
    Tickets {
        memory,
        throughput,
        handoff,
        cell: plan.family_cell,
        handoffs: plan.handoff_samples,
    }
}

fn connect(server: &Server) -> RawConn {
    RawConn::connect(server.address(0)).expect("connect")
}

fn expect_int(reply: Resp) -> i64 {
    match reply {
        Resp::Int(n) => n,
        other => panic!("expected an integer, got {other:?}"),
    }
}

/// Waits for the server's `blocked_clients` to reach `count`.
fn wait_blocked(probe: &mut Probe, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while probe.info("clients")["blocked_clients"]
        .parse::<usize>()
        .ok()
        != Some(count)
    {
        assert!(Instant::now() < deadline, "{count} clients never blocked");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `used_memory` once it holds still: Redis trims idle clients' buffers after 2 s idle, and
/// frees the spare clients of module-blocked clients that have gone at 50 every 100 ms, both
/// from its cron.
fn settled(probe: &mut Probe) -> i64 {
    std::thread::sleep(Duration::from_millis(3_000));
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut last = probe.used_memory();
    loop {
        std::thread::sleep(Duration::from_millis(1_000));
        let now = probe.used_memory();
        if (now - last).abs() < 16 * 1024 || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

/// Memory per waiter, its connections excluded: `count` waiters behind one held lock, against
/// the same connections open and idle. Leaves the server as it found it.
fn memory_per_waiter(server: &Server, probe: &mut Probe, way: Way, count: usize) -> f64 {
    let mut holder = connect(server);
    let held = holder.call(&[b"LOCK.ACQUIRE", KEY.as_bytes(), b"holder", b"3600000"]);
    expect_int(held.expect("the holder"));
    let poppers = match way {
        Way::Blocked => count,
        Way::Ticket => count / TICKETS_PER_POPPER,
    };
    let mut asker = connect(server);
    let mut conns: Vec<RawConn> = (0..poppers).map(|_| connect(server)).collect();
    for conn in &mut conns {
        assert_eq!(
            conn.call(&[b"PING"]).expect("PONG"),
            Resp::Simple("PONG".into())
        );
    }
    assert_eq!(
        asker.call(&[b"PING"]).expect("PONG"),
        Resp::Simple("PONG".into())
    );
    let idle = settled(probe);
    match way {
        Way::Blocked => {
            for (i, conn) in conns.iter_mut().enumerate() {
                let owner = format!("w{i}");
                conn.send(&[
                    b"LOCK.ACQUIRE",
                    KEY.as_bytes(),
                    owner.as_bytes(),
                    LEASE,
                    b"WAIT",
                    WAIT,
                ])
                .expect("send");
            }
        }
        Way::Ticket => {
            let mut tickets = Vec::with_capacity(count);
            for start in (0..count).step_by(1_000) {
                let owners: Vec<String> = (start..(start + 1_000).min(count))
                    .map(|i| format!("w{i}"))
                    .collect();
                let mut batch = Vec::new();
                for owner in &owners {
                    crate::resp::encode_into(
                        &mut batch,
                        [
                            &b"LOCK.ACQUIRE"[..],
                            KEY.as_bytes(),
                            owner.as_bytes(),
                            LEASE,
                            b"WAIT",
                            WAIT,
                            b"TICKET",
                        ]
                        .into_iter(),
                    );
                }
                asker.send_encoded(&batch).expect("send");
                for _ in &owners {
                    match asker.read().expect("a ticket") {
                        Resp::Bulk(Some(ticket)) => tickets.push(ticket),
                        other => panic!("expected a ticket, got {other:?}"),
                    }
                }
            }
            for (conn, chunk) in conns.iter_mut().zip(tickets.chunks(TICKETS_PER_POPPER)) {
                let mut args: Vec<&[u8]> = vec![b"BLPOP"];
                args.extend(chunk.iter().map(Vec::as_slice));
                args.push(b"0");
                conn.send(&args).expect("send");
            }
        }
    }
    wait_blocked(probe, poppers);
    let waiting = settled(probe);
    // Let them all go: the lock is deleted, every waiter gets it in turn and releases it.
    drop(conns);
    drop(asker);
    let _ = holder.call(&[b"LOCK.RELEASE", KEY.as_bytes(), b"holder"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while probe.lock_counter("waiters") > 0 || probe.lock_counter("tickets") > 0 {
        assert!(Instant::now() < deadline, "waiters left");
        std::thread::sleep(Duration::from_millis(10));
    }
    probe.flushall();
    (waiting - idle) as f64 / count as f64
}

/// `clients` clients loop on one lock for `duration`: acquire (waiting as `way` says), a
/// critical section, release. Returns (sections/s, server CPU µs per section).
fn contended(
    server: &Server,
    probe: &mut Probe,
    way: Way,
    clients: usize,
    duration: Duration,
) -> (f64, f64) {
    let stop = AtomicBool::new(false);
    let sections = AtomicU64::new(0);
    let start = Barrier::new(clients + 1);
    let (began, cpu_before) = std::thread::scope(|scope| {
        for client in 0..clients {
            let (stop, sections, start) = (&stop, &sections, &start);
            scope.spawn(move || {
                let mut conn = connect(server);
                let owner = format!("c{client}");
                start.wait();
                while !stop.load(Ordering::Relaxed) {
                    acquire(&mut conn, way, &owner);
                    super::spin(CRITICAL_SECTION);
                    let left = conn.call(&[b"LOCK.RELEASE", KEY.as_bytes(), owner.as_bytes()]);
                    assert_eq!(left.expect("released"), Resp::Int(0));
                    sections.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let cpu_before = probe.main_thread_cpu();
        start.wait();
        let began = Instant::now();
        std::thread::sleep(duration);
        stop.store(true, Ordering::Relaxed);
        (began, cpu_before)
    });
    // The clients finished their last section when the scope ended.
    let done = sections.load(Ordering::Relaxed) as f64;
    let cpu = probe.main_thread_cpu() - cpu_before;
    (done / began.elapsed().as_secs_f64(), cpu * 1e6 / done)
}

/// One waiting acquire by `owner`, until it holds the lock: its token.
fn acquire(conn: &mut RawConn, way: Way, owner: &str) -> i64 {
    let base: [&[u8]; 6] = [
        b"LOCK.ACQUIRE",
        KEY.as_bytes(),
        owner.as_bytes(),
        LEASE,
        b"WAIT",
        WAIT,
    ];
    match way {
        Way::Blocked => expect_int(conn.call(&base).expect("a token")),
        Way::Ticket => {
            let mut args = base.to_vec();
            args.push(b"TICKET");
            match conn.call(&args).expect("a reply") {
                Resp::Int(token) => token,
                Resp::Bulk(Some(ticket)) => pop_token(conn, &ticket),
                other => panic!("expected a token or a ticket, got {other:?}"),
            }
        }
    }
}

fn pop_token(conn: &mut RawConn, ticket: &[u8]) -> i64 {
    match conn.call(&[b"BLPOP", ticket, b"60"]).expect("popped") {
        Resp::Array(Some(items)) => match items.as_slice() {
            [_, Resp::Bulk(Some(value))] => std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("not a token: {value:?}")),
            other => panic!("{other:?}"),
        },
        other => panic!("the ticket was not answered: {other:?}"),
    }
}

/// Two clients pass the lock back and forth `samples` times; each time the waiter is blocked
/// first (in its `WAIT`, or in `BLPOP` on its ticket), then the holder's release is sent.
/// Returns the latencies in µs, release sent to token read.
fn handoffs(server: &Server, probe: &mut Probe, way: Way, samples: usize) -> Vec<f64> {
    let mut conns = [connect(server), connect(server)];
    let owners = ["a", "b"];
    expect_int(
        conns[0]
            .call(&[b"LOCK.ACQUIRE", KEY.as_bytes(), b"a", LEASE])
            .expect("a holds"),
    );
    let mut latencies = Vec::with_capacity(samples);
    for i in 0..samples {
        let (holder, waiter) = (i % 2, 1 - i % 2);
        let owner = owners[waiter].as_bytes();
        let base: [&[u8]; 6] = [b"LOCK.ACQUIRE", KEY.as_bytes(), owner, LEASE, b"WAIT", WAIT];
        match way {
            Way::Blocked => conns[waiter].send(&base).expect("send"),
            Way::Ticket => {
                let mut args = base.to_vec();
                args.push(b"TICKET");
                let ticket = match conns[waiter].call(&args).expect("a ticket") {
                    Resp::Bulk(Some(ticket)) => ticket,
                    other => panic!("expected a ticket, got {other:?}"),
                };
                conns[waiter]
                    .send(&[b"BLPOP", &ticket, b"60"])
                    .expect("send");
            }
        }
        wait_blocked(probe, 1);
        let sent = Instant::now();
        conns[holder]
            .send(&[b"LOCK.RELEASE", KEY.as_bytes(), owners[holder].as_bytes()])
            .expect("send");
        let reply = conns[waiter].read().expect("the waiter's answer");
        latencies.push(sent.elapsed().as_secs_f64() * 1e6);
        match (way, reply) {
            (Way::Blocked, Resp::Int(_)) => {}
            (Way::Ticket, Resp::Array(Some(items))) if items.len() == 2 => {}
            (_, other) => panic!("{other:?}"),
        }
        assert_eq!(conns[holder].read().expect("released"), Resp::Int(0));
    }
    let _ = conns[samples % 2].call(&[
        b"LOCK.RELEASE",
        KEY.as_bytes(),
        owners[samples % 2].as_bytes(),
    ]);
    latencies
}

impl Tickets {
    fn memory_row(&self, way: Way) -> &MemoryRow {
        self.memory.iter().find(|r| r.way == way).expect("a row")
    }

    pub fn targets(&self) -> Vec<Target> {
        let ticket = Spread::of(&self.memory_row(Way::Ticket).bytes_each);
        vec![Target {
            scenario: "Tickets",
            goal: format!(
                "server memory per ticketed waiter ≤ 1 KB, connections excluded ({} waiters, BLPOP on {TICKETS_PER_POPPER} tickets per connection)",
                self.memory_row(Way::Ticket).waiters
            ),
            measured: format!("{} B", fmt_spread(ticket, 0)),
            met: ticket.median <= 1024.0,
        }]
    }

    pub fn section(&self) -> String {
        let mut out = String::from("## Waiting with a ticket against waiting blocked\n\n");
        out.push_str(
            "The same waits two ways on one server: blocked in the server (`LOCK.ACQUIRE ... \
             WAIT t`), or with a ticket (`... WAIT t TICKET`, then `BLPOP` on the ticket). \
             **Memory** is `used_memory` with every connection open and idle against every \
             waiter queued behind one held lock, per waiter: blocked waiters need a connection \
             each; ticket waiters are asked for on one connection and popped by connections \
             that each block on 100 tickets at once.\n\n\
             | waiting | waiters | connections | bytes per waiter |\n| --- | ---: | ---: | ---: |\n",
        );
        for row in &self.memory {
            out.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                row.way.label(),
                row.waiters,
                row.connections,
                fmt_spread(Spread::of(&row.bytes_each), 0)
            ));
        }
        out.push_str(&format!(
            "\n**Contended throughput**: clients on one lock, each looping acquire (waiting), a \
             {} µs critical section, release, for {} ms per cell; server CPU is the main \
             thread's per section.\n\n\
             | clients | waiting | sections/s | server CPU µs/section |\n| ---: | --- | ---: | ---: |\n",
            CRITICAL_SECTION.as_micros(),
            self.cell.as_millis()
        ));
        for ((way, clients), row) in &self.throughput {
            out.push_str(&format!(
                "| {clients} | {} | {} | {} |\n",
                way.label(),
                fmt_spread(Spread::of(&row.sections_per_sec), 0),
                fmt_spread(Spread::of(&row.cpu_us), 1)
            ));
        }
        out.push_str(&format!(
            "\n**Handoff latency**: two clients pass one lock back and forth {} times; from the \
             release sent to the waiter's token read (its `WAIT` reply, or its `BLPOP` reply), \
             the waiter blocked first.\n\n\
             | waiting | p50 µs | p99 µs |\n| --- | ---: | ---: |\n",
            self.handoffs
        ));
        for (way, row) in &self.handoff {
            out.push_str(&format!(
                "| {} | {} | {} |\n",
                way.label(),
                fmt_spread(Spread::of(&row.p50_us), 0),
                fmt_spread(Spread::of(&row.p99_us), 0)
            ));
        }
        out.push('\n');
        out
    }
}
