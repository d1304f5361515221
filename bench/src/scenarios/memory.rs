//! Scenario 5, memory: `used_memory` per held lock (fencing-token counters included) for each
//! layout, and per blocked waiter — the waiter's own cost, with the connection's cost excluded
//! by measuring "connected and idle" against "blocked" on the same connections.

use std::time::{Duration, Instant};

use crate::drivers::{owner_id, unlock_channel, Approach, Scripts, LEASE_MS};
use crate::format::{fmt_num, fmt_spread, Target};
use crate::resp::RawConn;
use crate::server::{self, Probe, ServerOptions};
use crate::stats::Spread;
use crate::Bench;
use lock_testkit::Server;

/// Connections opened (and answered) per burst: well under the accept queue (`--tcp-backlog
/// 4096`), so no SYN is dropped and retried a second later.
const CONNECT_BURST: usize = 1000;

/// Per repetition: bytes per lock.
pub struct LockMemory {
    pub approach: Approach,
    pub bytes_per_lock: Vec<f64>,
    /// Keys beyond the locks themselves (the module's per-slot token counters).
    pub extra_keys: Vec<f64>,
}

pub struct WaiterMemory {
    pub what: &'static str,
    pub count: usize,
    /// Blocked (or subscribed) minus connected-and-idle, per client.
    pub bytes_each: f64,
    /// Blocked minus before any connection, per client: what a waiter costs in all.
    pub bytes_with_connection: f64,
}

pub struct Memory {
    pub locks: Vec<LockMemory>,
    pub lock_count: usize,
    pub waiters: Vec<WaiterMemory>,
    pub waiters_wanted: usize,
    pub open_files_limit: u64,
}

pub fn run(bench: &Bench) -> Memory {
    let plan = &bench.plan;
    let server = server::start(&bench.module, &ServerOptions::default());
    let scripts = Scripts::load(&server);
    let mut probe = Probe::new(&server);
    let layouts = [Approach::Module, Approach::Redisson, Approach::Polling];
    let mut locks: Vec<LockMemory> = layouts
        .iter()
        .map(|&approach| LockMemory {
            approach,
            bytes_per_lock: Vec::new(),
            extra_keys: Vec::new(),
        })
        .collect();
    for rep in 0..plan.reps {
        bench.progress(&format!(
            "memory: {} held locks per layout, rep {}/{}",
            plan.memory_locks,
            rep + 1,
            plan.reps
        ));
        for entry in &mut locks {
            let (bytes, extra) = bytes_per_lock(
                &server,
                &scripts,
                &mut probe,
                entry.approach,
                plan.memory_locks,
            );
            entry.bytes_per_lock.push(bytes);
            entry.extra_keys.push(extra);
        }
    }
    drop(server);

    // Each client needs a descriptor in the bench and one in the server (which inherits the
    // bench's limit); leave a few for everything else.
    let open_files_limit = crate::system::open_files_limit();
    let count = plan
        .memory_waiters
        .min(open_files_limit.saturating_sub(500) as usize);
    let mut waiters = vec![waiter_memory(bench, count, Wait::Module)];
    if plan.reference_waiters {
        waiters.push(waiter_memory(bench, count, Wait::Blpop));
        waiters.push(waiter_memory(bench, count, Wait::Subscribe));
    }
    Memory {
        locks,
        lock_count: plan.memory_locks,
        waiters,
        waiters_wanted: plan.memory_waiters,
        open_files_limit,
    }
}

/// FLUSHALL, then `count` locks of one layout on keys of the same length for every layout,
/// taken by owners of the same length. Returns (bytes per lock, extra keys per lock).
fn bytes_per_lock(
    server: &Server,
    scripts: &Scripts,
    probe: &mut Probe,
    approach: Approach,
    count: usize,
) -> (f64, f64) {
    probe.flushall();
    let mut con = server.connect();
    let owner = owner_id(0);
    let before = probe.used_memory();
    for start in (0..count).step_by(1000) {
        let mut pipe = redis::pipe();
        for i in start..(start + 1000).min(count) {
            let key = format!("lockbench:mem:{i:08}");
            match approach {
                Approach::Module => pipe.cmd("LOCK.ACQUIRE").arg(key).arg(&owner).arg(LEASE_MS),
                Approach::Redisson => pipe
                    .cmd("EVALSHA")
                    .arg(&scripts.redisson_lock)
                    .arg(1)
                    .arg(key)
                    .arg(LEASE_MS)
                    .arg(&owner),
                Approach::Polling | Approach::SetDel => pipe
                    .cmd("SET")
                    .arg(key)
                    .arg(&owner)
                    .arg("NX")
                    .arg("PX")
                    .arg(LEASE_MS),
            };
        }
        let _: Vec<redis::Value> = pipe.query(&mut con).expect("take locks");
    }
    let after = probe.used_memory();
    let extra = probe.dbsize() as f64 - count as f64;
    ((after - before) as f64 / count as f64, extra / count as f64)
}

/// A server that can take `count` clients, on enough loopback addresses for the ports.
fn server_for(bench: &Bench, count: usize) -> Server {
    server::start(
        &bench.module,
        &ServerOptions {
            loopback_addresses: (count / 20_000 + 1).min(200) as u8,
            maxclients: Some(count + 100),
            module_args: vec!["max-waiters-per-key".into(), (count + 1).to_string()],
            ..ServerOptions::default()
        },
    )
}

/// Opens `count` connections and has each one answer a PING, so every client has read a
/// command (Redis gives a client its query buffer on its first read) before the baseline.
fn connect_all(server: &Server, count: usize) -> Vec<RawConn> {
    let mut conns = Vec::with_capacity(count);
    while conns.len() < count {
        let burst_start = conns.len();
        let burst = CONNECT_BURST.min(count - burst_start);
        for i in 0..burst {
            let mut conn = RawConn::connect(server.address(burst_start + i)).expect("connect");
            conn.send(&[b"PING"]).expect("PING");
            conns.push(conn);
        }
        for conn in &mut conns[burst_start..] {
            conn.read().expect("PONG");
        }
    }
    conns
}

/// `used_memory` once Redis has shrunk idle clients' buffers: it trims a query buffer after
/// the client has been idle for 2 s (`clientsCron`, every client once a second), so wait for
/// that and for the figure to hold still, and compare states like for like.
fn settled_memory(probe: &mut Probe) -> i64 {
    std::thread::sleep(Duration::from_millis(3300));
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut last = probe.used_memory();
    loop {
        std::thread::sleep(Duration::from_millis(400));
        let now = probe.used_memory();
        if (now - last).abs() < 16 * 1024 || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

/// How a client waits, for the waiter-memory measurement.
#[derive(Clone, Copy)]
enum Wait {
    /// `LOCK.ACQUIRE ... WAIT`, all on one held lock.
    Module,
    /// Reference: BLPOP on one empty list, Redis's own blocking.
    Blpop,
    /// Redisson's waiter: SUBSCRIBE to the lock's unlock channel.
    Subscribe,
}

impl Wait {
    fn label(self) -> &'static str {
        match self {
            Wait::Module => "LOCK.ACQUIRE ... WAIT (blocked, queued)",
            Wait::Blpop => "reference: BLPOP (Redis's own blocked client)",
            Wait::Subscribe => "Redisson waiter: SUBSCRIBE to the unlock channel",
        }
    }
}

const QUEUE_KEY: &str = "lockbench:queue";

/// `count` clients connected and idle, then all waiting: the difference per client is what
/// waiting costs; against the server before any connection, what a waiter costs in all.
fn waiter_memory(bench: &Bench, count: usize, wait: Wait) -> WaiterMemory {
    bench.progress(&format!(
        "memory: {count} connections, then {count} × {}",
        wait.label()
    ));
    let server = server_for(bench, count);
    let mut probe = Probe::new(&server);
    let mut holder = server.connect();
    let _: i64 = redis::cmd("LOCK.ACQUIRE")
        .arg(QUEUE_KEY)
        .arg(owner_id(0))
        .arg(3_600_000)
        .query(&mut holder)
        .expect("holder");
    let empty = probe.used_memory();
    let mut conns = connect_all(&server, count);
    let idle = settled_memory(&mut probe);
    let lease = LEASE_MS.to_string();
    let channel = unlock_channel(QUEUE_KEY);
    for (b, burst) in conns.chunks_mut(CONNECT_BURST).enumerate() {
        for (i, conn) in burst.iter_mut().enumerate() {
            // One owner per waiter: an owner waits at most once per lock.
            let owner = owner_id(b * CONNECT_BURST + i + 1);
            let args: Vec<&[u8]> = match wait {
                Wait::Module => vec![
                    b"LOCK.ACQUIRE",
                    QUEUE_KEY.as_bytes(),
                    owner.as_bytes(),
                    lease.as_bytes(),
                    b"WAIT",
                    b"3600000",
                ],
                Wait::Blpop => vec![b"BLPOP", b"lockbench:list", b"3600"],
                Wait::Subscribe => vec![b"SUBSCRIBE", channel.as_bytes()],
            };
            conn.send(&args).expect("send the waiting command");
        }
        if let Wait::Subscribe = wait {
            for conn in burst.iter_mut() {
                conn.read().expect("subscribed");
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let waiting = match wait {
            Wait::Module => probe.waiters_on(QUEUE_KEY),
            Wait::Blpop => probe.info("clients")["blocked_clients"]
                .parse()
                .expect("blocked_clients"),
            Wait::Subscribe => count as u64,
        };
        if waiting >= count as u64 {
            break;
        }
        assert!(Instant::now() < deadline, "the clients did not all wait");
        std::thread::sleep(Duration::from_millis(50));
    }
    let waiting = settled_memory(&mut probe);
    WaiterMemory {
        what: wait.label(),
        count,
        bytes_each: (waiting - idle) as f64 / count as f64,
        bytes_with_connection: (waiting - empty) as f64 / count as f64,
    }
}

impl Memory {
    fn lock_spread(&self, approach: Approach) -> Spread {
        let entry = self
            .locks
            .iter()
            .find(|l| l.approach == approach)
            .expect("measured layout");
        Spread::of(&entry.bytes_per_lock)
    }

    pub fn bytes_per_lock(&self, approach: Approach) -> Spread {
        self.lock_spread(approach)
    }

    pub fn targets(&self) -> Vec<Target> {
        let lock = self.lock_spread(Approach::Module);
        let waiter = &self.waiters[0];
        let scaled_down = if waiter.count < self.waiters_wanted {
            format!(
                " (over {}, not {}: open-files limit)",
                fmt_num(waiter.count as f64, 0),
                fmt_num(self.waiters_wanted as f64, 0)
            )
        } else {
            format!(" (over {})", fmt_num(waiter.count as f64, 0))
        };
        vec![
            Target {
                scenario: "5. Memory",
                goal: "≤ 250 B per held lock (token state included)".into(),
                measured: format!(
                    "{} B (Redisson layout {} B, SET layout {} B)",
                    fmt_spread(lock, 1),
                    fmt_num(self.lock_spread(Approach::Redisson).median, 1),
                    fmt_num(self.lock_spread(Approach::Polling).median, 1)
                ),
                met: lock.median <= 250.0,
            },
            Target {
                scenario: "5. Memory",
                goal: "≤ 1 KB per blocked waiter".into(),
                measured: format!(
                    "{} B per waiter{scaled_down}; {} B with its connection",
                    fmt_num(waiter.bytes_each, 0),
                    fmt_num(waiter.bytes_with_connection, 0)
                ),
                met: waiter.bytes_each <= 1024.0,
            },
        ]
    }

    pub fn section(&self) -> String {
        let mut out = String::new();
        out.push_str("## 5. Memory\n\n");
        out.push_str(&format!(
            "**Held locks.** `used_memory` after taking {} locks on fresh keys minus before \
             (after FLUSHALL), per lock. Keys `lockbench:mem:<8 digits>`, owner / value a \
             38-byte Redisson-style id, lease 30 s, same for every layout. The module's figure \
             includes its fencing-token counters (one string key per hash slot touched).\n\n\
             | layout | bytes per lock | extra keys per lock |\n| --- | ---: | ---: |\n",
            fmt_num(self.lock_count as f64, 0)
        ));
        for entry in &self.locks {
            out.push_str(&format!(
                "| {} | {} | {} |\n",
                match entry.approach {
                    Approach::Module => "LOCK.ACQUIRE (Redisson hash + `mode` field)",
                    Approach::Redisson => "Redisson lock script (hash, 1 field, TTL)",
                    _ => "SET NX PX (string, TTL)",
                },
                fmt_spread(Spread::of(&entry.bytes_per_lock), 1),
                fmt_spread(Spread::of(&entry.extra_keys), 3),
            ));
        }
        out.push_str(
            "\n**Waiters.** N clients connected (each answered a PING), memory settled; then \
             each one waits — blocked in `LOCK.ACQUIRE lockbench:queue <owner> 30000 WAIT \
             3600000` (all on one key), or for reference blocked in BLPOP, or subscribed to the \
             lock's unlock channel as a Redisson waiter is — and memory settled again. \"Settled\" = after Redis \
             trimmed idle query buffers (2 s idle) and `used_memory` held still. Per waiter = \
             (blocked − idle) / N; with connection = (blocked − before connecting) / N.\n\n\
             | waiter | N | bytes per waiter | with its connection |\n| --- | ---: | ---: | ---: |\n",
        );
        for w in &self.waiters {
            out.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                w.what,
                fmt_num(w.count as f64, 0),
                fmt_num(w.bytes_each, 0),
                fmt_num(w.bytes_with_connection, 0)
            ));
        }
        if self.waiters[0].count < self.waiters_wanted {
            out.push_str(&format!(
                "\n{} waiters, not {}: every waiter is a descriptor in the bench and one in \
                 redis-server, and the open-files limit here is {} and could not be raised \
                 (raising a hard limit needs CAP_SYS_RESOURCE). The per-waiter figure does not \
                 depend on N.\n",
                fmt_num(self.waiters[0].count as f64, 0),
                fmt_num(self.waiters_wanted as f64, 0),
                fmt_num(self.open_files_limit as f64, 0)
            ));
        }
        if self.waiters.len() == 1 {
            out.push_str("\n(`--quick` measures the module's waiters only, not the references.)\n");
        }
        out.push('\n');
        out
    }
}
