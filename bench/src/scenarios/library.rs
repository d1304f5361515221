//! Scenario 9, the Rust client library (`clients/rust`, crate `redis_lock_client`) against the raw
//! commands it sends: uncontended `try_acquire` + `release` through the library, and the same
//! two commands (`LOCK.ACQUIRE key owner 30000 ONCE`, `LOCK.RELEASE key owner`) sent by hand on
//! the same kind of connection (a `redis` 1.x multiplexed connection), one after the other on one
//! key. The difference is what the library adds on the client: its guard, its watchdog task, its
//! bookkeeping (issue #20: at most 5 %).
//!
//! Three ways to run it, each on its own runtime: a multi-threaded tokio runtime with the
//! default number of workers (`#[tokio::main]`), a `current_thread` runtime, and the blocking
//! API (its own one-worker runtime; the raw side `block_on`s the same connection kind on a
//! runtime of the same shape). Library and raw run in alternating blocks of pairs, the side that
//! starts switching every repetition, so that drift on a shared machine hits both alike.

use std::time::{Duration, Instant};

use redis_lock_client::{LockClient, Release};

use crate::drivers::LEASE_MS;
use crate::format::{fmt_num, fmt_spread, Target};
use crate::stats::Spread;
use crate::Bench;

/// Pairs per block: each side runs this many, then the other side does.
const BLOCK: usize = 100;

/// The runtime a row ran on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    MultiThread,
    CurrentThread,
    Blocking,
}

impl Flavor {
    const ALL: [Flavor; 3] = [Flavor::MultiThread, Flavor::CurrentThread, Flavor::Blocking];

    fn label(self) -> &'static str {
        match self {
            Flavor::MultiThread => "async, tokio multi-thread (default workers)",
            Flavor::CurrentThread => "async, tokio current_thread",
            Flavor::Blocking => "blocking API (its one-worker runtime)",
        }
    }
}

/// One row: µs per pair for each side, and the library's overhead, per repetition.
pub struct Row {
    pub flavor: Flavor,
    pub raw_us: Vec<f64>,
    pub library_us: Vec<f64>,
    /// The median over the repetition's adjacent blocks of library ÷ raw wall time, − 1, in %.
    pub overhead_pct: Vec<f64>,
    /// The bench process's CPU time per pair (client side only: the server is another process).
    pub raw_cpu_us: Vec<f64>,
    pub library_cpu_us: Vec<f64>,
}

pub struct Library {
    pub rows: Vec<Row>,
    pub pairs: usize,
}

/// One side's cost over a block of pairs: wall time, and the bench process's CPU time (every
/// thread: the runtime's workers, the connection's driver), which the server's share of the
/// cores does not blur.
#[derive(Default, Clone, Copy)]
struct Cost {
    wall: Duration,
    cpu: Duration,
}

impl Cost {
    fn add(&mut self, other: Cost) {
        self.wall += other.wall;
        self.cpu += other.cpu;
    }
}

/// Times `f`.
fn timed(f: impl FnOnce()) -> Cost {
    let (wall, cpu) = (Instant::now(), process_cpu());
    f();
    Cost {
        wall: wall.elapsed(),
        cpu: process_cpu().saturating_sub(cpu),
    }
}

/// This process's CPU time so far, every thread.
fn process_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// One repetition: each side's total, and the library ÷ raw wall-time ratio of every pair of
/// adjacent blocks.
#[derive(Default)]
struct Times {
    raw: Cost,
    library: Cost,
    block_ratios: Vec<f64>,
}

impl Times {
    /// The block ratios' median − 1, in %: one block disturbed by the machine's other work
    /// moves it less than it moves the totals.
    fn overhead_pct(&self) -> f64 {
        (Spread::of(&self.block_ratios).median - 1.0) * 100.0
    }
}

pub fn run(bench: &Bench) -> Library {
    let plan = &bench.plan;
    let server = crate::server::start(&bench.module, &Default::default());
    let url = server.url();
    let pairs = plan.library_pairs;
    let mut rows = Vec::new();
    for flavor in Flavor::ALL {
        bench.progress(&format!(
            "library: {}, {} reps × {pairs} pairs per side",
            flavor.label(),
            plan.reps
        ));
        let mut row = Row {
            flavor,
            raw_us: Vec::new(),
            library_us: Vec::new(),
            overhead_pct: Vec::new(),
            raw_cpu_us: Vec::new(),
            library_cpu_us: Vec::new(),
        };
        let per_pair = |d: Duration| d.as_secs_f64() * 1e6 / pairs as f64;
        for t in measure(flavor, &url, pairs, plan.reps) {
            row.raw_us.push(per_pair(t.raw.wall));
            row.library_us.push(per_pair(t.library.wall));
            row.raw_cpu_us.push(per_pair(t.raw.cpu));
            row.library_cpu_us.push(per_pair(t.library.cpu));
            row.overhead_pct.push(t.overhead_pct());
        }
        rows.push(row);
    }
    Library { rows, pairs }
}

fn runtime(flavor: Flavor) -> tokio::runtime::Runtime {
    match flavor {
        Flavor::MultiThread => tokio::runtime::Builder::new_multi_thread(),
        Flavor::CurrentThread => tokio::runtime::Builder::new_current_thread(),
        // The blocking API's own shape: one worker, the caller's thread block_on's.
        Flavor::Blocking => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(1);
            b
        }
    }
    .enable_all()
    .build()
    .expect("tokio runtime")
}

/// The raw side: the two commands by hand on a multiplexed connection.
#[derive(Clone)]
struct Raw {
    conn: redis1::aio::MultiplexedConnection,
    acquire: redis1::Cmd,
    release: redis1::Cmd,
}

impl Raw {
    async fn connect(url: &str, owner: &str) -> Raw {
        let conn = redis1::Client::open(url)
            .expect("client")
            .get_multiplexed_async_connection()
            .await
            .expect("raw connection");
        // A key of the library's key's length, and the library's owner string.
        let mut acquire = redis1::cmd("LOCK.ACQUIRE");
        acquire.arg("lib:raw").arg(owner).arg(LEASE_MS).arg("ONCE");
        let mut release = redis1::cmd("LOCK.RELEASE");
        release.arg("lib:raw").arg(owner);
        Raw {
            conn,
            acquire,
            release,
        }
    }

    async fn pairs(&mut self, n: usize) {
        for _ in 0..n {
            self.acquire().await;
            self.release().await;
        }
    }

    async fn acquire(&mut self) {
        let token: redis1::Value = self
            .acquire
            .query_async(&mut self.conn)
            .await
            .expect("raw acquire");
        assert!(matches!(token, redis1::Value::Int(t) if t > 0), "{token:?}");
    }

    async fn release(&mut self) {
        // The holds left on the key: 0.
        let left: i64 = self
            .release
            .query_async(&mut self.conn)
            .await
            .expect("raw release");
        assert_eq!(left, 0);
    }
}

async fn library_pairs(lock: &redis_lock_client::Lock, n: usize) {
    for _ in 0..n {
        let mut guard = lock
            .try_acquire()
            .await
            .expect("library acquire")
            .expect("the key is free");
        assert_eq!(guard.release().await.expect("release"), Release::Released);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Raw,
    Library,
}

fn measure(flavor: Flavor, url: &str, pairs: usize, reps: usize) -> Vec<Times> {
    let runtime = runtime(flavor);
    let lease = Duration::from_millis(LEASE_MS);
    if flavor == Flavor::Blocking {
        let client = redis_lock_client::blocking::LockClient::open(url).expect("library client");
        let lock = client.lock("lib:lib").lease(lease);
        let mut raw = runtime.block_on(Raw::connect(url, lock.owner()));
        return alternate(reps, pairs, |side, n| match side {
            // One blocking call per command, as the library's blocking API makes.
            Side::Raw => timed(|| {
                for _ in 0..n {
                    runtime.block_on(raw.acquire());
                    runtime.block_on(raw.release());
                }
            }),
            Side::Library => timed(|| {
                for _ in 0..n {
                    let mut guard = lock.try_acquire().expect("acquire").expect("free");
                    assert_eq!(guard.release().expect("release"), Release::Released);
                }
            }),
        });
    }
    let (lock, raw) = runtime.block_on(async {
        let client = LockClient::open(url).await.expect("library client");
        let lock = client.lock("lib:lib").lease(lease);
        let raw = Raw::connect(url, lock.owner()).await;
        (lock, raw)
    });
    alternate(reps, pairs, |side, n| {
        let (lock, mut raw) = (lock.clone(), raw.clone());
        // On a task of its own, as application code runs (not the runtime's block_on future);
        // timed inside it.
        let task = runtime.spawn(async move {
            let (wall, cpu) = (Instant::now(), process_cpu());
            match side {
                Side::Raw => raw.pairs(n).await,
                Side::Library => library_pairs(&lock, n).await,
            }
            Cost {
                wall: wall.elapsed(),
                cpu: process_cpu().saturating_sub(cpu),
            }
        });
        runtime.block_on(task).expect("measurement task")
    })
}

/// `reps` repetitions of `pairs` pairs per side, in alternating blocks (after one warm-up
/// block each), the side that starts switching every repetition.
fn alternate(reps: usize, pairs: usize, mut block: impl FnMut(Side, usize) -> Cost) -> Vec<Times> {
    block(Side::Raw, BLOCK);
    block(Side::Library, BLOCK);
    (0..reps)
        .map(|rep| {
            let order = if rep % 2 == 0 {
                [Side::Raw, Side::Library]
            } else {
                [Side::Library, Side::Raw]
            };
            let mut t = Times::default();
            let mut left = pairs;
            while left > 0 {
                let n = left.min(BLOCK);
                left -= n;
                let (mut raw, mut library) = (Cost::default(), Cost::default());
                for side in order {
                    let cost = block(side, n);
                    match side {
                        Side::Raw => raw = cost,
                        Side::Library => library = cost,
                    }
                }
                t.raw.add(raw);
                t.library.add(library);
                t.block_ratios
                    .push(library.wall.as_secs_f64() / raw.wall.as_secs_f64());
            }
            t
        })
        .collect()
}

impl Library {
    pub fn targets(&self) -> Vec<Target> {
        self.rows
            .iter()
            .map(|row| {
                let overhead = Spread::of(&row.overhead_pct);
                Target {
                    scenario: "9. Rust library",
                    goal: format!(
                        "try_acquire+release overhead over the raw commands ≤ 5 % ({})",
                        row.flavor.label()
                    ),
                    measured: format!(
                        "{} % ({} vs {} µs per pair)",
                        fmt_spread(overhead, 1),
                        fmt_num(Spread::of(&row.library_us).median, 1),
                        fmt_num(Spread::of(&row.raw_us).median, 1)
                    ),
                    met: overhead.median <= 5.0,
                }
            })
            .collect()
    }

    pub fn section(&self) -> String {
        let mut out = String::new();
        out.push_str("## 9. The Rust client library against the raw commands\n\n");
        out.push_str(&format!(
            "Uncontended acquire+release pairs on one key, one at a time: `Lock::try_acquire` + \
             `LockGuard::release` of `clients/rust` (default watchdog, 30 s lease) against the \
             same two commands sent by hand — `LOCK.ACQUIRE key owner 30000 ONCE`, \
             `LOCK.RELEASE key owner`, same owner length — on the same kind of connection (a \
             `redis` 1.x multiplexed connection) to the same server, each on a task of its own \
             (the blocking API from the bench's thread). {} pairs per side per repetition, in \
             alternating blocks of {BLOCK} (after a warm-up block each). Overhead = the median, \
             over the repetition's adjacent blocks, of library ÷ raw wall time, − 1: a block \
             that the machine's other work disturbs moves it less than it moves a total. \
             Client CPU = the bench process's CPU time (every thread) per pair: what the client \
             side costs, without the round trip.\n\n\
             | runtime | raw µs/pair | library µs/pair | library overhead | raw client CPU µs/pair | library client CPU µs/pair |\n\
             | --- | ---: | ---: | ---: | ---: | ---: |\n",
            fmt_num(self.pairs as f64, 0)
        ));
        for row in &self.rows {
            out.push_str(&format!(
                "| {} | {} | {} | {} % | {} | {} |\n",
                row.flavor.label(),
                fmt_spread(Spread::of(&row.raw_us), 1),
                fmt_spread(Spread::of(&row.library_us), 1),
                fmt_spread(Spread::of(&row.overhead_pct), 1),
                fmt_spread(Spread::of(&row.raw_cpu_us), 1),
                fmt_spread(Spread::of(&row.library_cpu_us), 1),
            ));
        }
        out.push('\n');
        out
    }
}
