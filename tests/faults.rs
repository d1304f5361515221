//! Under faults, nothing breaks mutual exclusion.
//!
//! For a bounded time (20 s by default; `LOCK_FAULT_SECS=300 cargo test --test faults` for a
//! longer run), worker threads take locks with `WAIT`, sometimes hold past their lease, renew,
//! or vanish without releasing, while a disrupter DELs lock keys, FLUSHes, `CLIENT KILL`s
//! waiters, and runs `redis-cli` processes that it SIGKILLs while they wait or hold, or
//! SIGSTOPs past their lease. Every holder writes to a fenced resource (it refuses a token
//! lower than the highest it has seen), as the README tells users to do.
//!
//! The checker then verifies, per key, with the client-side times of each hold (from the grant
//! reply to the release request, which lie inside the server's own hold):
//! - no token was handed out twice;
//! - two holds whose release succeeded (the server confirmed they held to the end) never
//!   overlapped;
//! - a hold that started before a confirmed hold has a lower token: a stale holder's token is
//!   always lower than the current one;
//! - the fenced resource never refused a confirmed holder;
//! - every `WAIT` was answered within its timeout plus the holders' leases (no hanging waiter);
//! - the server is alive and logged no internal error.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KEYS: [&str; 3] = ["fault:0", "fault:1", "{fault}:2"];
const WORKERS: usize = 10;
const MAX_LEASE_MS: u64 = 400;
const MAX_WAIT_MS: u64 = 3_000;

#[derive(Debug, Clone)]
struct Hold {
    key: &'static str,
    owner: String,
    token: i64,
    /// When the grant reply was read.
    granted: Instant,
    /// When the holder sent its release (or gave up / died).
    ended: Instant,
    /// The server confirmed the hold lasted to the release (LOCK.RELEASE answered 0).
    confirmed: bool,
    /// The fenced resource refused one of this holder's writes.
    fenced_out: bool,
}

/// The protected resource: it remembers the highest token per key and refuses lower ones.
#[derive(Default)]
struct FencedResource {
    highest: Mutex<HashMap<&'static str, i64>>,
    refused: AtomicU64,
}

impl FencedResource {
    fn write(&self, key: &'static str, token: i64) -> bool {
        let mut highest = self.highest.lock().unwrap();
        let seen = highest.entry(key).or_insert(0);
        if token < *seen {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        *seen = token;
        true
    }
}

#[derive(Default)]
struct Counts {
    operations: AtomicU64,
    grants: AtomicU64,
    timeouts: AtomicU64,
    overstays: AtomicU64,
    vanished: AtomicU64,
    client_kills: AtomicU64,
    process_kills: AtomicU64,
    process_stops: AtomicU64,
    dels: AtomicU64,
    flushes: AtomicU64,
    unanswered: AtomicU64,
    unexpected_errors: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

struct Shared {
    url: String,
    port: u16,
    stop: AtomicBool,
    holds: Mutex<Vec<Hold>>,
    resource: FencedResource,
    counts: Counts,
    next_owner: AtomicU64,
}

impl Shared {
    fn owner(&self, prefix: &str) -> String {
        format!(
            "{prefix}-{}",
            self.next_owner.fetch_add(1, Ordering::Relaxed)
        )
    }
}

fn connect(url: &str) -> Connection {
    let con = redis::Client::open(url).unwrap().get_connection().unwrap();
    // Longer than any WAIT can take: a read that times out is a waiter left hanging.
    con.set_read_timeout(Some(Duration::from_millis(
        MAX_WAIT_MS + 4 * MAX_LEASE_MS + 5_000,
    )))
    .unwrap();
    con
}

fn worker(shared: Arc<Shared>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut con = connect(&shared.url);
    while !shared.stop.load(Ordering::Relaxed) {
        let key = KEYS[rng.gen_range(0..KEYS.len())];
        let owner = shared.owner("w");
        let lease = rng.gen_range(50..=MAX_LEASE_MS);
        let wait = rng.gen_range(0..=MAX_WAIT_MS);
        bump(&shared.counts.operations);
        let reply: redis::RedisResult<Option<i64>> = redis::cmd("LOCK.ACQUIRE")
            .arg(key)
            .arg(&owner)
            .arg(lease)
            .arg("WAIT")
            .arg(wait)
            .query(&mut con);
        let granted = Instant::now();
        let token = match reply {
            Ok(Some(token)) => token,
            Ok(None) => {
                bump(&shared.counts.timeouts);
                continue;
            }
            Err(e) => {
                if e.is_timeout() {
                    eprintln!("a worker's WAIT got no answer");
                    bump(&shared.counts.unanswered);
                } else if !e.is_connection_dropped() && !e.is_io_error() {
                    eprintln!("unexpected error: {e}");
                    bump(&shared.counts.unexpected_errors);
                }
                // Killed by the disrupter: a new connection.
                con = connect(&shared.url);
                continue;
            }
        };
        bump(&shared.counts.grants);
        let mut fenced_out = !shared.resource.write(key, token);
        let behaviour = rng.gen_range(0..100);
        let (ended, confirmed) = if behaviour < 8 {
            // Vanish without releasing: the connection closes, the lease runs out.
            bump(&shared.counts.vanished);
            con = connect(&shared.url);
            (Instant::now(), false)
        } else {
            let hold_for = if behaviour < 20 {
                bump(&shared.counts.overstays);
                lease + rng.gen_range(20..150)
            } else {
                rng.gen_range(0..lease / 3)
            };
            if behaviour >= 90 {
                let _: redis::RedisResult<i64> = redis::cmd("LOCK.RENEW")
                    .arg(key)
                    .arg(&owner)
                    .arg(lease)
                    .query(&mut con);
            }
            thread::sleep(Duration::from_millis(hold_for));
            fenced_out |= !shared.resource.write(key, token);
            let ended = Instant::now();
            let released: redis::RedisResult<Option<i64>> = redis::cmd("LOCK.RELEASE")
                .arg(key)
                .arg(&owner)
                .query(&mut con);
            if released.is_err() {
                con = connect(&shared.url);
            }
            (ended, matches!(released, Ok(Some(0))))
        };
        shared.holds.lock().unwrap().push(Hold {
            key,
            owner,
            token,
            granted,
            ended,
            confirmed,
            fenced_out,
        });
    }
}

/// A `redis-cli` process, fed commands line by line, whose replies are read by a thread.
struct CliProcess {
    child: Child,
    replies: mpsc::Receiver<String>,
}

impl CliProcess {
    fn start(port: u16) -> CliProcess {
        // Its errors too ("Error: Server closed the connection" after a CLIENT KILL). The CLI is
        // `$LOCK_CLI` (default redis-cli), passed to sh as $0.
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#"exec "$0" -p "$1" 2>&1"#)
            .arg(cli_bin())
            .arg(port.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli");
        let stdout = child.stdout.take().unwrap();
        let (tx, replies) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        CliProcess { child, replies }
    }

    fn send(&mut self, line: &str) {
        if let Some(stdin) = self.child.stdin.as_mut() {
            let _ = writeln!(stdin, "{line}");
            let _ = stdin.flush();
        }
    }

    fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .arg(signal)
            .arg(self.child.id().to_string())
            .status();
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the disrupter does to the processes it runs.
fn process_fault(shared: &Shared, rng: &mut StdRng) {
    let key = KEYS[rng.gen_range(0..KEYS.len())];
    let owner = shared.owner("p");
    let lease = rng.gen_range(50..=MAX_LEASE_MS);
    let mut cli = CliProcess::start(shared.port);
    cli.send(&format!(
        "LOCK.ACQUIRE {key} {owner} {lease} WAIT {MAX_WAIT_MS}"
    ));
    bump(&shared.counts.operations);
    match rng.gen_range(0..3) {
        0 => {
            // Killed while waiting (or just after its grant).
            thread::sleep(Duration::from_millis(rng.gen_range(0..100)));
            cli.kill();
            bump(&shared.counts.process_kills);
        }
        kind => {
            let reply = cli.replies.recv_timeout(Duration::from_millis(
                MAX_WAIT_MS + 4 * MAX_LEASE_MS + 5_000,
            ));
            let granted = Instant::now();
            let token = match reply {
                Ok(line) if line.trim().is_empty() => {
                    bump(&shared.counts.timeouts);
                    cli.kill();
                    return;
                }
                Ok(line) => match line.trim().parse::<i64>() {
                    Ok(token) => token,
                    // Its connection was killed by a CLIENT KILL while it waited.
                    Err(_) if line.contains("closed the connection") => {
                        cli.kill();
                        return;
                    }
                    Err(_) => {
                        eprintln!("unexpected redis-cli reply: {line}");
                        bump(&shared.counts.unexpected_errors);
                        cli.kill();
                        return;
                    }
                },
                Err(_) => {
                    eprintln!("a redis-cli waiter got no answer");
                    bump(&shared.counts.unanswered);
                    cli.kill();
                    return;
                }
            };
            bump(&shared.counts.grants);
            let mut fenced_out = !shared.resource.write(key, token);
            let (ended, confirmed) = if kind == 1 {
                // The holder process dies: its lease runs out, the next waiter gets the lock.
                cli.kill();
                bump(&shared.counts.process_kills);
                (Instant::now(), false)
            } else {
                // Stopped (a GC pause, a frozen VM) past its lease, then it carries on.
                cli.signal("-STOP");
                bump(&shared.counts.process_stops);
                thread::sleep(Duration::from_millis(lease + rng.gen_range(20..200)));
                cli.signal("-CONT");
                fenced_out |= !shared.resource.write(key, token);
                let ended = Instant::now();
                cli.send(&format!("LOCK.RELEASE {key} {owner}"));
                let confirmed = cli
                    .replies
                    .recv_timeout(Duration::from_secs(5))
                    .is_ok_and(|l| l.trim() == "0");
                cli.kill();
                (ended, confirmed)
            };
            shared.holds.lock().unwrap().push(Hold {
                key,
                owner,
                token,
                granted,
                ended,
                confirmed,
                fenced_out,
            });
        }
    }
}

fn disrupter(shared: Arc<Shared>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut admin = connect(&shared.url);
    let mut processes = Vec::new();
    while !shared.stop.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(rng.gen_range(50..250)));
        match rng.gen_range(0..100) {
            0..=24 => {
                let key = KEYS[rng.gen_range(0..KEYS.len())];
                let _: i64 = admin.del(key).unwrap();
                bump(&shared.counts.dels);
            }
            25..=29 => {
                let _: () = redis::cmd("FLUSHALL").query(&mut admin).unwrap();
                bump(&shared.counts.flushes);
            }
            30..=54 => {
                let blocked = blocked_client_ids(&mut admin);
                if !blocked.is_empty() {
                    let id = blocked[rng.gen_range(0..blocked.len())];
                    let killed: i64 = redis::cmd("CLIENT")
                        .arg("KILL")
                        .arg("ID")
                        .arg(id)
                        .query(&mut admin)
                        .unwrap();
                    if killed == 1 {
                        bump(&shared.counts.client_kills);
                    }
                }
            }
            _ => {
                let shared = shared.clone();
                let seed = rng.gen();
                processes.push(thread::spawn(move || {
                    process_fault(&shared, &mut StdRng::seed_from_u64(seed))
                }));
            }
        }
    }
    for p in processes {
        p.join().unwrap();
    }
}

/// Every way two holds could contradict the lock's promises; returns the violations found.
fn violations(holds: &[Hold]) -> Vec<String> {
    let mut found = Vec::new();
    for key in KEYS {
        let mut on_key: Vec<&Hold> = holds.iter().filter(|h| h.key == key).collect();
        on_key.sort_by_key(|h| h.granted);
        let mut tokens: Vec<i64> = on_key.iter().map(|h| h.token).collect();
        tokens.sort();
        if tokens.windows(2).any(|w| w[0] == w[1]) {
            found.push(format!("{key}: a token was handed out twice"));
        }
        for a in on_key.iter().filter(|h| h.confirmed) {
            if a.fenced_out {
                found.push(format!(
                    "{key}: confirmed holder {} was fenced out",
                    a.owner
                ));
            }
            for b in on_key.iter().filter(|b| b.owner != a.owner) {
                if b.confirmed && b.granted < a.ended && a.granted < b.ended {
                    found.push(format!(
                        "{key}: confirmed holds {} and {} overlapped",
                        a.owner, b.owner
                    ));
                }
                if b.granted < a.granted && b.token >= a.token {
                    found.push(format!(
                        "{key}: {} (token {}) started before confirmed {} (token {})",
                        b.owner, b.token, a.owner, a.token
                    ));
                }
            }
        }
    }
    found
}

#[test]
fn under_faults_no_two_holders_overlap_unfenced_and_every_waiter_is_answered() {
    let seconds: u64 = std::env::var("LOCK_FAULT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
        .max(1);
    let seed: u64 = std::env::var("LOCK_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    eprintln!("fault test: {seconds} s, seed {seed} (LOCK_FAULT_SECS, LOCK_FAULT_SEED)");
    let mut server = Server::start();
    let shared = Arc::new(Shared {
        url: server.url(),
        port: server.port,
        stop: AtomicBool::new(false),
        holds: Mutex::new(Vec::new()),
        resource: FencedResource::default(),
        counts: Counts::default(),
        next_owner: AtomicU64::new(0),
    });
    let mut threads: Vec<_> = (0..WORKERS as u64)
        .map(|i| {
            let shared = shared.clone();
            thread::spawn(move || worker(shared, seed.wrapping_add(i)))
        })
        .collect();
    let d = shared.clone();
    threads.push(thread::spawn(move || {
        disrupter(d, seed.wrapping_add(1_000))
    }));
    thread::sleep(Duration::from_secs(seconds));
    shared.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("a client thread panicked");
    }

    let mut admin = server.connect();
    let stat = |con: &mut Connection, section: &str, name: &str| -> u64 {
        info_field(con, section, name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let holds = shared.holds.lock().unwrap().clone();
    let found = violations(&holds);
    let c = &shared.counts;
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    eprintln!(
        "fault test: {} operations, {} grants ({} confirmed), {} WAIT timeouts, {} overstays, \
         {} vanished holders, {} CLIENT KILLs, {} process kills, {} process stops, {} DELs, \
         {} FLUSHALLs, {} expiries with waiters, {} keys expired, {} handoffs, {} abandoned \
         grants, {} fenced-out writes, {} unanswered, {} unexpected errors, {} violations",
        n(&c.operations),
        n(&c.grants),
        holds.iter().filter(|h| h.confirmed).count(),
        n(&c.timeouts),
        n(&c.overstays),
        n(&c.vanished),
        n(&c.client_kills),
        n(&c.process_kills),
        n(&c.process_stops),
        n(&c.dels),
        n(&c.flushes),
        stat(&mut admin, "lock", "lock_expired_with_waiters"),
        stat(&mut admin, "stats", "expired_keys"),
        stat(&mut admin, "lock", "lock_handoffs"),
        stat(&mut admin, "lock", "lock_abandoned_grants"),
        shared.resource.refused.load(Ordering::Relaxed),
        n(&c.unanswered),
        n(&c.unexpected_errors),
        found.len(),
    );
    assert!(found.is_empty(), "violations:\n{}", found.join("\n"));
    assert_eq!(n(&c.unanswered), 0, "a waiter was left without an answer");
    assert_eq!(n(&c.unexpected_errors), 0);
    assert!(
        n(&c.grants) > 50 && holds.iter().any(|h| h.confirmed),
        "too little happened"
    );
    assert!(server.is_alive(), "the server died");
    assert!(eventually(Duration::from_secs(5), || waiters(&mut admin) == 0));
    let log = server.log();
    assert!(
        !log.contains("internal error") && !log.contains("panic"),
        "{log}"
    );
    server.kill_hard();
}

#[test]
fn the_checker_catches_double_grants_overlaps_and_stale_tokens() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let hold = |owner: &str, token: i64, from: u64, to: u64, confirmed: bool| Hold {
        key: KEYS[0],
        owner: owner.to_string(),
        token,
        granted: at(from),
        ended: at(to),
        confirmed,
        fenced_out: false,
    };
    // A clean history: a stale holder (lower token) overlapping a confirmed one is allowed.
    let clean = vec![
        hold("a", 10, 0, 50, false),
        hold("b", 11, 20, 60, true),
        hold("c", 12, 70, 90, true),
    ];
    assert!(violations(&clean).is_empty(), "{:?}", violations(&clean));
    let cases = [
        // Two confirmed holders at once.
        vec![hold("a", 10, 0, 50, true), hold("b", 11, 40, 60, true)],
        // A hold that began earlier carries a larger token than the confirmed one.
        vec![hold("a", 12, 0, 50, false), hold("b", 11, 20, 60, true)],
        // One token handed out twice.
        vec![hold("a", 10, 0, 10, true), hold("b", 10, 20, 30, true)],
        // A confirmed holder refused by the fenced resource.
        vec![Hold {
            fenced_out: true,
            ..hold("a", 10, 0, 10, true)
        }],
    ];
    for history in cases {
        assert!(!violations(&history).is_empty(), "missed: {history:?}");
    }
}
