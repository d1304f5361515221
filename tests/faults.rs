//! Under faults, nothing breaks mutual exclusion.
//!
//! For a bounded time (20 s by default; `LOCK_FAULT_SECS=300 cargo test --test faults` for a
//! longer run), worker threads take locks with `WAIT` (a third of them with `TICKET`, popping
//! the ticket on the same connection) — exclusive locks, a read-write lock
//! (`SHARED` most of the time, exclusive otherwise) and a semaphore (`LIMIT 3`), some of them
//! `EPHEMERAL` (bound to their connection) — sometimes hold past their lease, renew, or vanish
//! without releasing, while a disrupter DELs lock keys, FLUSHes, `CLIENT KILL`s waiters and
//! holders' connections, and runs `redis-cli` processes that it SIGKILLs while they wait or
//! hold, or SIGSTOPs past their lease. The protected resource lives in Redis beside the locks,
//! and every critical section reaches it through `LOCK.GUARD` with its hold's fencing token,
//! once right after its grant and once more at its end — after it overstayed its lease, was
//! SIGSTOPped past it, or had its connection killed (it then writes from a new connection): a
//! writer (exclusive holder) appends its token to `<key>:resource` (`RPUSH`), a reader (shared
//! holder) reads the last one (`LINDEX`) and now and then tries to append too, a permit holder
//! counts (`INCR`). The server alone decides which of them land: there is no client-side check.
//!
//! The checker then verifies, per key, with the client-side times of each hold (from the grant
//! reply to the release request, which lie inside the server's own hold):
//! - no token was handed out twice;
//! - two holds that exclude each other (on the exclusive keys any two, on the read-write key a
//!   writer and any other) whose release succeeded (the server confirmed they held to the end)
//!   never overlapped;
//! - never more than 3 confirmed permits of the semaphore at once;
//! - a hold that started before a confirmed hold it excludes has a lower token: a stale
//!   holder's token is always lower than the current one; and one with a higher token was not
//!   granted (its reply read) before that confirmed hold's release was sent;
//! - tokens rise with the grants, whatever the kind: a hold whose grant reply arrived before
//!   another's request was sent has the lower token;
//! - the resource's sequence of tokens only rises: every `<key>:resource` list, read at the
//!   end, is non-decreasing, and holds only tokens of writers that tried to write;
//! - no write of a superseded hold landed (0 stale writes): a write answered as landed was sent
//!   before any hold with a higher token on its key was granted, and no reader's write landed;
//! - `LOCK.GUARD` never refused a confirmed holder;
//! - an `EPHEMERAL` hold (with a lease long enough to outlive the check) whose connection
//!   closed is gone within a second;
//! - every `WAIT` was answered within its timeout plus the holders' leases (no hanging waiter);
//! - the server is alive, logged no internal error, and keeps no connection binding once every
//!   client is gone.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use lock_testkit::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Exclusive locks only.
const KEYS: [&str; 3] = ["fault:0", "fault:1", "{fault}:2"];
/// A read-write lock: `SHARED` holds (readers) and exclusive ones (writers).
const RW_KEY: &str = "fault:rw";
/// A semaphore of `SEM_LIMIT` permits.
const SEM_KEY: &str = "fault:sem";
const SEM_LIMIT: usize = 3;
const ALL_KEYS: [&str; 5] = [KEYS[0], KEYS[1], KEYS[2], RW_KEY, SEM_KEY];
const WORKERS: usize = 16;
const MAX_LEASE_MS: u64 = 400;
const MAX_WAIT_MS: u64 = 3_000;
/// The lease of an `EPHEMERAL` holder about to vanish: long enough that only the closing of its
/// connection can end its hold within `CLOSE_NOTICED_MS`.
const EPHEMERAL_LEASE_MS: std::ops::RangeInclusive<u64> = 2_000..=3_000;
const CLOSE_NOTICED_MS: u64 = 1_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Exclusive,
    Shared,
    Permit,
}

impl Kind {
    /// The options of `LOCK.ACQUIRE` that ask for this kind.
    fn options(self) -> &'static [&'static str] {
        match self {
            Kind::Exclusive => &[],
            Kind::Shared => &["SHARED"],
            Kind::Permit => &["LIMIT", "3"],
        }
    }

    /// Whether two holds of these kinds (of different owners, on one key) may not overlap.
    fn excludes(self, other: Kind) -> bool {
        self == Kind::Exclusive || other == Kind::Exclusive
    }
}

/// What a client asks for: one of the exclusive keys (half the time), the read-write key
/// (`SHARED` 4 times in 5) or the semaphore.
fn pick(rng: &mut StdRng) -> (&'static str, Kind) {
    match rng.gen_range(0..100) {
        0..=49 => (KEYS[rng.gen_range(0..KEYS.len())], Kind::Exclusive),
        50..=74 if rng.gen_range(0..5) == 0 => (RW_KEY, Kind::Exclusive),
        50..=74 => (RW_KEY, Kind::Shared),
        _ => (SEM_KEY, Kind::Permit),
    }
}

fn acquire_args(key: &str, owner: &str, lease: u64, kind: Kind, ephemeral: bool) -> Vec<String> {
    let mut args = vec![key.to_string(), owner.to_string(), lease.to_string()];
    args.extend(kind.options().iter().map(|o| o.to_string()));
    if ephemeral {
        args.push("EPHEMERAL".to_string());
    }
    args
}

#[derive(Debug, Clone)]
struct Hold {
    key: &'static str,
    owner: String,
    kind: Kind,
    ephemeral: bool,
    token: i64,
    /// When the acquire request was sent (the server granted it after this).
    requested: Instant,
    /// When the grant reply was read.
    granted: Instant,
    /// When the holder sent its release (or gave up / died).
    ended: Instant,
    /// The server confirmed the hold lasted to the release (LOCK.RELEASE answered 0).
    confirmed: bool,
    /// `LOCK.GUARD` refused one of this holder's accesses to the resource (`FENCED`).
    fenced_out: bool,
}

/// The resource a lock key protects: a list of the tokens of the writes that landed.
fn resource_of(key: &str) -> String {
    format!("{key}:resource")
}

/// One access to the resource through `LOCK.GUARD`.
#[derive(Debug, Clone)]
struct Access {
    key: &'static str,
    kind: Kind,
    owner: String,
    token: i64,
    /// A write (`RPUSH`), or a read (`LINDEX`) / a count (`INCR`, permits).
    write: bool,
    /// When it was sent.
    sent: Instant,
    outcome: Outcome,
}

/// What `LOCK.GUARD` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// The command ran.
    Landed,
    /// `FENCED the hold is gone`.
    Gone,
    /// `FENCED the token is not current`.
    NotCurrent,
    /// A shared hold's write, refused as one.
    SharedRefused,
    /// The connection closed under it (killed): it may or may not have run.
    Unknown,
    /// Anything else: an unexpected error.
    Error,
}

impl Outcome {
    fn of_error(text: &str) -> Outcome {
        if text.starts_with("FENCED the hold is gone") {
            Outcome::Gone
        } else if text.starts_with("FENCED the token is not current") {
            Outcome::NotCurrent
        } else if text.starts_with("ERR a SHARED hold") {
            Outcome::SharedRefused
        } else {
            eprintln!("unexpected LOCK.GUARD error: {text}");
            Outcome::Error
        }
    }

    fn fenced(self) -> bool {
        matches!(self, Outcome::Gone | Outcome::NotCurrent)
    }
}

/// The `LOCK.GUARD` command line of an access: a writer appends its token, a reader reads the
/// last one (or, with `write`, tries to append: it must be refused), a permit counts.
fn guarded(key: &str, owner: &str, token: i64, kind: Kind, write: bool) -> Vec<String> {
    let mut args = vec![key.to_string(), owner.to_string(), token.to_string()];
    let resource = resource_of(key);
    let inner: Vec<String> = match (kind, write) {
        (Kind::Permit, _) => vec!["INCR".into(), resource],
        (_, true) => vec!["RPUSH".into(), resource, token.to_string()],
        (_, false) => vec!["LINDEX".into(), resource, "-1".into()],
    };
    args.extend(inner);
    args
}

#[derive(Default)]
struct Counts {
    operations: AtomicU64,
    grants: AtomicU64,
    exclusive_grants: AtomicU64,
    shared_grants: AtomicU64,
    permit_grants: AtomicU64,
    ephemeral_grants: AtomicU64,
    timeouts: AtomicU64,
    overstays: AtomicU64,
    vanished: AtomicU64,
    client_kills: AtomicU64,
    holder_kills: AtomicU64,
    process_kills: AtomicU64,
    process_stops: AtomicU64,
    dels: AtomicU64,
    flushes: AtomicU64,
    /// EPHEMERAL holds seen gone within `CLOSE_NOTICED_MS` of their connection's close.
    ephemeral_ends: AtomicU64,
    /// EPHEMERAL holds still there `CLOSE_NOTICED_MS` after their connection closed.
    ephemeral_outlived: AtomicU64,
    unanswered: AtomicU64,
    unexpected_errors: AtomicU64,
    /// Waits that asked with `TICKET`.
    tickets: AtomicU64,
}

impl Counts {
    fn granted(&self, kind: Kind, ephemeral: bool) {
        bump(&self.grants);
        bump(match kind {
            Kind::Exclusive => &self.exclusive_grants,
            Kind::Shared => &self.shared_grants,
            Kind::Permit => &self.permit_grants,
        });
        if ephemeral {
            bump(&self.ephemeral_grants);
        }
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

struct Shared {
    url: String,
    port: u16,
    stop: AtomicBool,
    holds: Mutex<Vec<Hold>>,
    /// Every access to the resources through `LOCK.GUARD`, as sent and answered.
    accesses: Mutex<Vec<Access>>,
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

    /// One access to `key`'s resource through `LOCK.GUARD` from a worker's connection, booked.
    /// When the disrupter killed the connection under it, the holder carries on from a new
    /// connection and tries once more there, as an application would after a reconnect.
    #[allow(clippy::too_many_arguments)]
    fn access(
        &self,
        con: &mut Connection,
        key: &'static str,
        kind: Kind,
        owner: &str,
        token: i64,
        write: bool,
    ) -> Outcome {
        let args = guarded(key, owner, token, kind, write);
        let mut outcome = Outcome::Unknown;
        for _ in 0..2 {
            let sent = Instant::now();
            let reply: redis::RedisResult<Value> = redis::cmd("LOCK.GUARD").arg(&args).query(con);
            outcome = match reply {
                Ok(_) => Outcome::Landed,
                Err(e) if e.is_io_error() || e.is_connection_dropped() => Outcome::Unknown,
                Err(e) => Outcome::of_error(&format!(
                    "{} {}",
                    e.code().unwrap_or(""),
                    e.detail().unwrap_or("")
                )),
            };
            self.book(key, kind, owner, token, write, sent, outcome);
            if outcome != Outcome::Unknown {
                break;
            }
            *con = connect_worker(&self.url);
        }
        outcome
    }

    /// The same access from a `redis-cli` process (an error line comes with an empty line
    /// after it).
    fn cli_access(
        &self,
        cli: &mut Cli,
        key: &'static str,
        kind: Kind,
        owner: &str,
        token: i64,
        write: bool,
    ) -> Outcome {
        let sent = Instant::now();
        let line = format!(
            "LOCK.GUARD {}",
            guarded(key, owner, token, kind, write).join(" ")
        );
        let outcome = match cli.send(&line).ok().and(cli.reply(Duration::from_secs(5))) {
            None => Outcome::Unknown,
            Some(reply) if reply.contains("closed the connection") => Outcome::Unknown,
            Some(reply) if reply.starts_with("FENCED") || reply.starts_with("ERR") => {
                let _ = cli.reply(Duration::from_secs(5));
                Outcome::of_error(reply.trim_end())
            }
            Some(_) => Outcome::Landed,
        };
        self.book(key, kind, owner, token, write, sent, outcome);
        outcome
    }

    #[allow(clippy::too_many_arguments)]
    fn book(
        &self,
        key: &'static str,
        kind: Kind,
        owner: &str,
        token: i64,
        write: bool,
        sent: Instant,
        outcome: Outcome,
    ) {
        if outcome == Outcome::Error {
            bump(&self.counts.unexpected_errors);
        }
        self.accesses.lock().unwrap().push(Access {
            key,
            kind,
            owner: owner.to_string(),
            token,
            write,
            sent,
            outcome,
        });
    }

    /// After the connection of `owner`'s EPHEMERAL hold on `key` closed: the hold must be gone
    /// within `CLOSE_NOTICED_MS` (its lease, from `EPHEMERAL_LEASE_MS`, runs longer).
    fn check_ephemeral_end(&self, key: &str, owner: &str) {
        let mut con = connect(&self.url);
        let holds = |con: &mut Connection| {
            let info: Value = redis::cmd("LOCK.INFO").arg(key).query(con).unwrap();
            mentions(&info, owner)
        };
        if eventually(Duration::from_millis(CLOSE_NOTICED_MS), || !holds(&mut con)) {
            bump(&self.counts.ephemeral_ends);
        } else {
            eprintln!(
                "{key}: EPHEMERAL hold of {owner} outlived its connection by {CLOSE_NOTICED_MS} ms"
            );
            bump(&self.counts.ephemeral_outlived);
        }
    }
}

/// Whether a reply names `owner` anywhere.
fn mentions(value: &Value, owner: &str) -> bool {
    match value {
        Value::Data(bytes) => bytes == owner.as_bytes(),
        Value::Bulk(items) => items.iter().any(|v| mentions(v, owner)),
        _ => false,
    }
}

const WORKER_NAME: &str = "fault-worker";

fn connect(url: &str) -> Connection {
    let con = redis::Client::open(url).unwrap().get_connection().unwrap();
    // Longer than any WAIT can take: a read that times out is a waiter left hanging.
    con.set_read_timeout(Some(Duration::from_millis(
        MAX_WAIT_MS + 4 * MAX_LEASE_MS + 5_000,
    )))
    .unwrap();
    con
}

/// A worker's connection, named so that the disrupter can kill it while it holds.
fn connect_worker(url: &str) -> Connection {
    let mut con = connect(url);
    let _: () = redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg(WORKER_NAME)
        .query(&mut con)
        .unwrap();
    con
}

fn worker(shared: Arc<Shared>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut con = connect_worker(&shared.url);
    while !shared.stop.load(Ordering::Relaxed) {
        let (key, kind) = pick(&mut rng);
        let owner = shared.owner("w");
        let ephemeral = rng.gen_range(0..100) < 30;
        let behaviour = rng.gen_range(0..100);
        let lease = if ephemeral && behaviour < 8 {
            rng.gen_range(EPHEMERAL_LEASE_MS)
        } else {
            rng.gen_range(50..=MAX_LEASE_MS)
        };
        let wait = rng.gen_range(0..=MAX_WAIT_MS);
        bump(&shared.counts.operations);
        let requested = Instant::now();
        let args = acquire_args(key, &owner, lease, kind, ephemeral);
        let reply = if rng.gen_range(0..100) < 30 {
            wait_with_ticket(&shared, &mut con, args, wait)
        } else {
            redis::cmd("LOCK.ACQUIRE")
                .arg(args)
                .arg("WAIT")
                .arg(wait)
                .query(&mut con)
        };
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
                con = connect_worker(&shared.url);
                continue;
            }
        };
        shared.counts.granted(kind, ephemeral);
        // Right after the grant: a writer writes, a reader reads (and one in five also tries
        // to write, which must never land), a permit counts.
        let writes = kind != Kind::Shared || rng.gen_range(0..5) == 0;
        let mut fenced_out = shared
            .access(&mut con, key, kind, &owner, token, writes)
            .fenced();
        let (ended, confirmed) = if behaviour < 8 {
            // Vanish without releasing: the connection closes, which ends an EPHEMERAL hold at
            // once; the lease runs out on another. The holder lives on and writes once more,
            // from a new connection.
            bump(&shared.counts.vanished);
            con = connect_worker(&shared.url);
            let ended = Instant::now();
            if ephemeral {
                shared.check_ephemeral_end(key, &owner);
            }
            shared.access(&mut con, key, kind, &owner, token, writes);
            (ended, false)
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
            // The end of the critical section: its last write (late, after an overstay).
            fenced_out |= shared
                .access(&mut con, key, kind, &owner, token, writes)
                .fenced();
            let ended = Instant::now();
            let released: redis::RedisResult<Option<i64>> = redis::cmd("LOCK.RELEASE")
                .arg(key)
                .arg(&owner)
                .query(&mut con);
            if released.is_err() {
                con = connect_worker(&shared.url);
            }
            (ended, matches!(released, Ok(Some(0))))
        };
        shared.holds.lock().unwrap().push(Hold {
            key,
            owner,
            kind,
            ephemeral,
            token,
            requested,
            granted,
            ended,
            confirmed,
            fenced_out,
        });
    }
}

/// A `WAIT` with a ticket (`... WAIT wait TICKET`, an `EPHEMERAL` hold bound to this
/// connection), popped on the same connection: the outcome a blocking `WAIT` has — the token,
/// or nil at the timeout. A pop that gets nothing within the wait and the holders' leases
/// withdraws the ticket (`LOCK.CANCEL` hands over a grant not popped); nothing there is a waiter
/// left hanging, unless a `FLUSHALL` took the ticket's answer before the pop.
fn wait_with_ticket(
    shared: &Shared,
    con: &mut Connection,
    args: Vec<String>,
    wait: u64,
) -> redis::RedisResult<Option<i64>> {
    let flushes = shared.counts.flushes.load(Ordering::Relaxed);
    let reply: Value = redis::cmd("LOCK.ACQUIRE")
        .arg(args)
        .arg("WAIT")
        .arg(wait)
        .arg("TICKET")
        .query(con)?;
    bump(&shared.counts.tickets);
    let ticket = match reply {
        Value::Int(token) => return Ok(Some(token)),
        Value::Data(ticket) => ticket,
        other => panic!("a ticketed WAIT answered {other:?}"),
    };
    let popped: Option<(Vec<u8>, String)> = redis::cmd("BLPOP")
        .arg(&ticket)
        .arg((wait + 4 * MAX_LEASE_MS) as f64 / 1000.0 + 1.0)
        .query(con)?;
    match popped {
        Some((_, element)) if element == "timeout" => Ok(None),
        // Granted, and its lease ended before the pop (the server stopped or stalled for a
        // whole lease in between): nothing is held.
        Some((_, element)) if element == "expired" => Ok(None),
        Some((_, element)) => match element.parse::<i64>() {
            Ok(token) => Ok(Some(token)),
            Err(_) => Err(redis::RedisError::from((
                redis::ErrorKind::ExtensionError,
                "a ticket held",
                element,
            ))),
        },
        None => match redis::cmd("LOCK.CANCEL").arg(&ticket).query(con)? {
            Value::Int(token) => Ok(Some(token)),
            _ if shared.counts.flushes.load(Ordering::Relaxed) != flushes => Ok(None),
            _ => Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "a ticket was never answered",
            ))),
        },
    }
}

/// Workers blocked popping their tickets (`BLPOP`).
fn ticket_waiter_ids(con: &mut Connection) -> Vec<i64> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(con).unwrap();
    list.lines()
        .filter(|l| l.contains("cmd=blpop") && l.contains("flags=b"))
        .filter_map(|l| {
            l.split(' ')
                .find_map(|f| f.strip_prefix("id="))
                .and_then(|v| v.parse().ok())
        })
        .collect()
}

/// What the disrupter does to the processes it runs.
fn process_fault(shared: &Shared, rng: &mut StdRng) {
    let (key, kind) = pick(rng);
    let owner = shared.owner("p");
    let ephemeral = rng.gen_range(0..2) == 0;
    let fate = rng.gen_range(0..3);
    let lease = if ephemeral && fate == 1 {
        rng.gen_range(EPHEMERAL_LEASE_MS)
    } else {
        rng.gen_range(50..=MAX_LEASE_MS)
    };
    let mut cli = Cli::start(shared.port).expect("redis-cli");
    let requested = Instant::now();
    let _ = cli.send(&format!(
        "LOCK.ACQUIRE {} WAIT {MAX_WAIT_MS}",
        acquire_args(key, &owner, lease, kind, ephemeral).join(" ")
    ));
    bump(&shared.counts.operations);
    match fate {
        0 => {
            // Killed while waiting (or just after its grant).
            thread::sleep(Duration::from_millis(rng.gen_range(0..100)));
            cli.kill();
            bump(&shared.counts.process_kills);
        }
        fate => {
            let reply = cli.reply(Duration::from_millis(
                MAX_WAIT_MS + 4 * MAX_LEASE_MS + 5_000,
            ));
            let granted = Instant::now();
            let token = match reply {
                Some(line) if line.trim().is_empty() => {
                    bump(&shared.counts.timeouts);
                    cli.kill();
                    return;
                }
                Some(line) => match line.trim().parse::<i64>() {
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
                None => {
                    eprintln!("a redis-cli waiter got no answer");
                    bump(&shared.counts.unanswered);
                    cli.kill();
                    return;
                }
            };
            shared.counts.granted(kind, ephemeral);
            let writes = kind != Kind::Shared || rng.gen_range(0..5) == 0;
            let mut fenced_out = shared
                .cli_access(&mut cli, key, kind, &owner, token, writes)
                .fenced();
            let (ended, confirmed) = if fate == 1 {
                // The holder process dies: an EPHEMERAL hold ends with its connection, another
                // when its lease runs out; then the next waiter gets the lock.
                cli.kill();
                bump(&shared.counts.process_kills);
                let ended = Instant::now();
                if ephemeral {
                    shared.check_ephemeral_end(key, &owner);
                }
                (ended, false)
            } else {
                // Stopped (a GC pause, a frozen VM) past its lease, then it carries on.
                cli.signal(Signal::Stop);
                bump(&shared.counts.process_stops);
                thread::sleep(Duration::from_millis(lease + rng.gen_range(20..200)));
                cli.signal(Signal::Cont);
                // It wakes up and writes, its lease long over: the server refuses it.
                fenced_out |= shared
                    .cli_access(&mut cli, key, kind, &owner, token, writes)
                    .fenced();
                let ended = Instant::now();
                let _ = cli.send(&format!("LOCK.RELEASE {key} {owner}"));
                let confirmed = cli
                    .reply(Duration::from_secs(5))
                    .is_some_and(|l| l.trim() == "0");
                cli.kill();
                (ended, confirmed)
            };
            shared.holds.lock().unwrap().push(Hold {
                key,
                owner,
                kind,
                ephemeral,
                token,
                requested,
                granted,
                ended,
                confirmed,
                fenced_out,
            });
        }
    }
}

/// The ids of the workers' connections that are not blocked (holding, or between requests).
fn idle_worker_ids(con: &mut Connection) -> Vec<i64> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(con).unwrap();
    list.lines()
        .filter(|l| l.split(' ').any(|f| f == format!("name={WORKER_NAME}")))
        .filter(|l| {
            l.split(' ')
                .find_map(|f| f.strip_prefix("flags="))
                .is_some_and(|flags| !flags.contains('b'))
        })
        .filter_map(|l| {
            l.split(' ')
                .find_map(|f| f.strip_prefix("id="))
                .and_then(|v| v.parse().ok())
        })
        .collect()
}

fn client_kill(admin: &mut Connection, id: i64) -> bool {
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query(admin)
        .unwrap();
    killed == 1
}

fn disrupter(shared: Arc<Shared>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut admin = connect(&shared.url);
    let mut processes = Vec::new();
    while !shared.stop.load(Ordering::Relaxed) {
        thread::sleep(Duration::from_millis(rng.gen_range(50..250)));
        match rng.gen_range(0..100) {
            0..=24 => {
                let key = ALL_KEYS[rng.gen_range(0..ALL_KEYS.len())];
                let _: i64 = admin.del(key).unwrap();
                bump(&shared.counts.dels);
            }
            25..=29 => {
                let _: () = redis::cmd("FLUSHALL").query(&mut admin).unwrap();
                bump(&shared.counts.flushes);
            }
            30..=51 => {
                let mut blocked = blocked_client_ids(&mut admin);
                blocked.extend(ticket_waiter_ids(&mut admin));
                if !blocked.is_empty() {
                    let id = blocked[rng.gen_range(0..blocked.len())];
                    if client_kill(&mut admin, id) {
                        bump(&shared.counts.client_kills);
                    }
                }
            }
            52..=61 => {
                // A worker's connection while it holds (or between two requests): its
                // EPHEMERAL hold ends, another one runs to its lease.
                let idle = idle_worker_ids(&mut admin);
                if !idle.is_empty() {
                    let id = idle[rng.gen_range(0..idle.len())];
                    if client_kill(&mut admin, id) {
                        bump(&shared.counts.holder_kills);
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
    for key in ALL_KEYS {
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
            // Only holds that exclude each other: on the exclusive keys, every pair.
            for b in on_key
                .iter()
                .filter(|b| b.owner != a.owner && a.kind.excludes(b.kind))
            {
                if b.confirmed && b.granted < a.ended && a.granted < b.ended {
                    found.push(format!(
                        "{key}: confirmed holds {} ({:?}) and {} ({:?}) overlapped",
                        a.owner, a.kind, b.owner, b.kind
                    ));
                }
                if b.granted < a.granted && b.token >= a.token {
                    found.push(format!(
                        "{key}: {} (token {}) started before confirmed {} (token {})",
                        b.owner, b.token, a.owner, a.token
                    ));
                }
                // A higher token was granted after `a`'s grant: if its reply came before `a`'s
                // release was sent, the server granted it while `a` held.
                if b.token > a.token && a.granted <= b.granted && b.granted < a.ended {
                    found.push(format!(
                        "{key}: {} (token {}) was granted while confirmed {} (token {}) held",
                        b.owner, b.token, a.owner, a.token
                    ));
                }
            }
        }
        if key == SEM_KEY {
            found.extend(permits_over_limit(&on_key, SEM_LIMIT).1);
        }
        found.extend(tokens_against_grant_order(&on_key));
    }
    found
}

/// Writes that landed for a superseded hold: sent after a hold with a higher token on their key
/// was granted (that grant means the writer's hold had ended: on these keys every other hold
/// excludes a writer's). And any reader's write that landed. Permits share their key, so a
/// permit's write supersedes nothing.
fn stale_writes(holds: &[Hold], accesses: &[Access]) -> Vec<String> {
    let mut found = Vec::new();
    for w in accesses
        .iter()
        .filter(|a| a.write && a.outcome == Outcome::Landed)
    {
        match w.kind {
            Kind::Permit => {}
            Kind::Shared => found.push(format!(
                "{}: a reader's write landed ({}, token {})",
                w.key, w.owner, w.token
            )),
            Kind::Exclusive => {
                if let Some(h) = holds
                    .iter()
                    .find(|h| h.key == w.key && h.token > w.token && h.granted < w.sent)
                {
                    found.push(format!(
                        "{}: stale write landed: {} (token {}) wrote after {} (token {}) was \
                         granted",
                        w.key, w.owner, w.token, h.owner, h.token
                    ));
                }
            }
        }
    }
    found
}

/// The resources as read at the end (`<key>:resource`, the tokens of the writes that landed, in
/// the order they landed): each must only rise, and hold only tokens of writers that wrote there.
fn resource_violations(lists: &[(&'static str, Vec<i64>)], accesses: &[Access]) -> Vec<String> {
    let mut found = Vec::new();
    for (key, list) in lists {
        if let Some(pair) = list.windows(2).find(|w| w[1] < w[0]) {
            found.push(format!(
                "{key}: the resource's tokens fell: {} after {}",
                pair[1], pair[0]
            ));
        }
        let writers: HashSet<i64> = accesses
            .iter()
            .filter(|a| a.key == *key && a.write && a.kind == Kind::Exclusive)
            .map(|a| a.token)
            .collect();
        if let Some(t) = list.iter().find(|t| !writers.contains(t)) {
            found.push(format!(
                "{key}: token {t} in the resource is no writer's (phantom write)"
            ));
        }
    }
    found
}

/// The most confirmed holds at once on a key, and a violation for every moment they went over
/// `limit`. A hold counts from its grant reply to its release request (ends first on a tie).
fn permits_over_limit(on_key: &[&Hold], limit: usize) -> (usize, Vec<String>) {
    let mut events: Vec<(Instant, bool, &Hold)> = on_key
        .iter()
        .filter(|h| h.confirmed)
        .flat_map(|h| [(h.granted, true, *h), (h.ended, false, *h)])
        .collect();
    events.sort_by_key(|&(at, starts, _)| (at, starts));
    let mut inside: Vec<&Hold> = Vec::new();
    let mut peak = 0;
    let mut found = Vec::new();
    for (_, starts, hold) in events {
        if starts {
            inside.push(hold);
            peak = peak.max(inside.len());
            if inside.len() == limit + 1 {
                let owners: Vec<&str> = inside.iter().map(|h| h.owner.as_str()).collect();
                found.push(format!(
                    "{}: {} confirmed permits at once (limit {limit}): {owners:?}",
                    hold.key,
                    inside.len()
                ));
            }
        } else {
            inside.retain(|h| h.owner != hold.owner);
        }
    }
    (peak, found)
}

/// A hold whose grant reply arrived before another's request was sent was granted first: its
/// token must be the lower one, whatever the kinds. Finds the pairs in O(n log n).
fn tokens_against_grant_order(on_key: &[&Hold]) -> Vec<String> {
    let mut by_token: Vec<&Hold> = on_key.to_vec();
    by_token.sort_by_key(|h| std::cmp::Reverse(h.token));
    let mut found = Vec::new();
    // Among the holds with a higher token, the one whose grant reply came first.
    let mut earliest: Option<&Hold> = None;
    for a in by_token {
        if let Some(b) = earliest {
            if b.token > a.token && b.granted < a.requested {
                found.push(format!(
                    "{}: {} (token {}) was granted before {} (token {}) asked",
                    a.key, b.owner, b.token, a.owner, a.token
                ));
            }
        }
        if earliest.is_none_or(|b| a.granted < b.granted) {
            earliest = Some(a);
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
        accesses: Mutex::new(Vec::new()),
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
    let accesses = shared.accesses.lock().unwrap().clone();
    let lists: Vec<(&'static str, Vec<i64>)> = KEYS
        .iter()
        .chain([RW_KEY].iter())
        .map(|&key| (key, admin.lrange(resource_of(key), 0, -1).unwrap()))
        .collect();
    let stale = stale_writes(&holds, &accesses);
    let mut found = violations(&holds);
    found.extend(stale.iter().cloned());
    found.extend(resource_violations(&lists, &accesses));
    let outcomes = |write: bool, outcome: Outcome| {
        accesses
            .iter()
            .filter(|a| a.write == write && a.kind != Kind::Shared && a.outcome == outcome)
            .count()
    };
    let reads = |outcome: Outcome| {
        accesses
            .iter()
            .filter(|a| a.kind == Kind::Shared && !a.write && a.outcome == outcome)
            .count()
    };
    let c = &shared.counts;
    let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let confirmed = |kind: Kind| {
        holds
            .iter()
            .filter(|h| h.confirmed && h.kind == kind)
            .count()
    };
    let on_sem: Vec<&Hold> = holds.iter().filter(|h| h.key == SEM_KEY).collect();
    let writers: Vec<&Hold> = holds
        .iter()
        .filter(|h| h.key == RW_KEY && h.kind == Kind::Exclusive)
        .collect();
    let peak_permits = permits_over_limit(&on_sem, SEM_LIMIT).0;
    eprintln!(
        "fault test: {} operations ({} waits with a ticket), {} grants ({} confirmed): {} \
         exclusive ({} confirmed), \
         of which {} writers on the read-write key ({} confirmed), {} shared ({} confirmed), \
         {} permits ({} confirmed, at most {peak_permits} confirmed \
         at once), {} EPHEMERAL ({} confirmed); {} WAIT timeouts, {} overstays, {} vanished \
         holders, {} CLIENT KILLs of waiters, {} of holders, {} process kills, {} process \
         stops, {} DELs, {} FLUSHALLs, {} EPHEMERAL holds ended by their connection's close \
         ({} checked gone within {CLOSE_NOTICED_MS} ms, {} outlived it), {} expiries with \
         waiters, {} keys expired, {} handoffs, {} abandoned grants; writes through \
         LOCK.GUARD: {} landed, {} refused FENCED ({} hold gone, {} token not current), {} lost \
         with their connection, {} stale writes landed; reads: {} admitted, {} refused FENCED; \
         readers' writes: {} refused, none landed; {} tokens in the resources; {} unanswered, \
         {} unexpected errors, {} violations",
        n(&c.operations),
        n(&c.tickets),
        n(&c.grants),
        holds.iter().filter(|h| h.confirmed).count(),
        n(&c.exclusive_grants),
        confirmed(Kind::Exclusive),
        writers.len(),
        writers.iter().filter(|h| h.confirmed).count(),
        n(&c.shared_grants),
        confirmed(Kind::Shared),
        n(&c.permit_grants),
        confirmed(Kind::Permit),
        n(&c.ephemeral_grants),
        holds.iter().filter(|h| h.confirmed && h.ephemeral).count(),
        n(&c.timeouts),
        n(&c.overstays),
        n(&c.vanished),
        n(&c.client_kills),
        n(&c.holder_kills),
        n(&c.process_kills),
        n(&c.process_stops),
        n(&c.dels),
        n(&c.flushes),
        stat(&mut admin, "lock", "lock_disconnected"),
        n(&c.ephemeral_ends),
        n(&c.ephemeral_outlived),
        stat(&mut admin, "lock", "lock_expired_with_waiters"),
        stat(&mut admin, "stats", "expired_keys"),
        stat(&mut admin, "lock", "lock_handoffs"),
        stat(&mut admin, "lock", "lock_abandoned_grants"),
        outcomes(true, Outcome::Landed),
        outcomes(true, Outcome::Gone) + outcomes(true, Outcome::NotCurrent),
        outcomes(true, Outcome::Gone),
        outcomes(true, Outcome::NotCurrent),
        outcomes(true, Outcome::Unknown),
        stale.len(),
        reads(Outcome::Landed),
        reads(Outcome::Gone) + reads(Outcome::NotCurrent),
        accesses
            .iter()
            .filter(|a| a.kind == Kind::Shared && a.write && a.outcome == Outcome::SharedRefused)
            .count(),
        lists.iter().map(|(_, l)| l.len()).sum::<usize>(),
        n(&c.unanswered),
        n(&c.unexpected_errors),
        found.len(),
    );
    assert!(found.is_empty(), "violations:\n{}", found.join("\n"));
    assert_eq!(n(&c.unanswered), 0, "a waiter was left without an answer");
    assert_eq!(n(&c.unexpected_errors), 0);
    assert_eq!(
        n(&c.ephemeral_outlived),
        0,
        "an EPHEMERAL hold outlived its connection"
    );
    assert!(
        n(&c.grants) > 50 && holds.iter().any(|h| h.confirmed),
        "too little happened"
    );
    assert!(
        outcomes(true, Outcome::Landed) > 0
            && outcomes(true, Outcome::Gone) + outcomes(true, Outcome::NotCurrent) > 0,
        "no write landed, or none was refused"
    );
    assert!(
        [Kind::Exclusive, Kind::Shared, Kind::Permit]
            .into_iter()
            .all(|kind| confirmed(kind) > 0),
        "a kind of hold was never confirmed"
    );
    assert!(server.is_alive(), "the server died");
    assert!(eventually(Duration::from_secs(5), || waiters(&mut admin) == 0));
    // Every client that took an EPHEMERAL hold is gone: no binding is left.
    assert!(
        eventually(Duration::from_secs(5), || stat(
            &mut admin,
            "lock",
            "lock_ephemeral_holds"
        ) == 0),
        "lock_ephemeral_holds stays at {}",
        stat(&mut admin, "lock", "lock_ephemeral_holds")
    );
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
    let on = |key: &'static str, kind: Kind| {
        move |owner: &str, token: i64, from: u64, to: u64, confirmed: bool| Hold {
            key,
            owner: owner.to_string(),
            kind,
            ephemeral: false,
            token,
            requested: at(from),
            granted: at(from),
            ended: at(to),
            confirmed,
            fenced_out: false,
        }
    };
    let hold = on(KEYS[0], Kind::Exclusive);
    let reader = on(RW_KEY, Kind::Shared);
    let writer = on(RW_KEY, Kind::Exclusive);
    let permit = on(SEM_KEY, Kind::Permit);
    // A clean history: a stale holder (lower token) overlapping a confirmed one is allowed;
    // readers share, and a reader's grant reply may come after a later reader's; 3 permits at
    // once.
    let clean = vec![
        hold("a", 10, 0, 50, false),
        hold("b", 11, 20, 60, true),
        hold("c", 12, 70, 90, true),
        writer("w1", 10, 0, 10, true),
        Hold {
            requested: at(10),
            ..reader("r1", 12, 20, 60, true)
        },
        Hold {
            requested: at(12),
            ..reader("r2", 13, 18, 70, true)
        },
        reader("r3", 11, 15, 40, false),
        writer("w2", 14, 80, 90, true),
        permit("p1", 10, 0, 50, true),
        Hold {
            requested: at(0),
            ..permit("p2", 12, 10, 60, true)
        },
        Hold {
            requested: at(0),
            ..permit("p3", 11, 20, 70, true)
        },
        permit("p4", 13, 50, 80, true),
        permit("p5", 14, 55, 90, false),
    ];
    assert!(violations(&clean).is_empty(), "{:?}", violations(&clean));
    // Each history breaks one rule; the violation found names it.
    let cases = [
        // Two confirmed holders at once.
        (
            "overlapped",
            vec![hold("a", 10, 0, 50, true), hold("b", 11, 40, 60, true)],
        ),
        // A hold that began earlier carries a larger token than the confirmed one.
        (
            "started before",
            vec![hold("a", 12, 0, 50, false), hold("b", 11, 20, 60, true)],
        ),
        // One token handed out twice.
        (
            "twice",
            vec![hold("a", 10, 0, 10, true), hold("b", 10, 20, 30, true)],
        ),
        // A confirmed holder refused by the fenced resource.
        (
            "fenced out",
            vec![Hold {
                fenced_out: true,
                ..hold("a", 10, 0, 10, true)
            }],
        ),
        // A later token granted while a confirmed holder held.
        (
            "granted while",
            vec![hold("a", 10, 0, 50, true), hold("b", 11, 20, 30, false)],
        ),
        // A confirmed writer overlapping a confirmed reader (which asked first, and got the
        // lower token: only the overlap shows it).
        (
            "overlapped",
            vec![
                writer("w", 10, 0, 50, true),
                Hold {
                    requested: at(0),
                    ..reader("r", 9, 40, 60, true)
                },
            ],
        ),
        // Two confirmed writers at once on the read-write key.
        (
            "overlapped",
            vec![
                writer("w1", 10, 0, 50, true),
                Hold {
                    requested: at(0),
                    ..writer("w2", 9, 40, 60, true)
                },
            ],
        ),
        // A reader granted while a confirmed writer held.
        (
            "granted while",
            vec![writer("w", 10, 0, 50, true), reader("r", 11, 20, 60, false)],
        ),
        // A writer granted while a confirmed reader held.
        (
            "granted while",
            vec![reader("r", 10, 0, 50, true), writer("w", 11, 20, 60, false)],
        ),
        // A reader that began before a confirmed writer carries a larger token.
        (
            "started before",
            vec![reader("r", 12, 0, 50, false), writer("w", 11, 20, 60, true)],
        ),
        // A confirmed reader refused by the fenced resource.
        (
            "fenced out",
            vec![Hold {
                fenced_out: true,
                ..reader("r", 10, 0, 10, true)
            }],
        ),
        // 4 confirmed permits at once.
        (
            "4 confirmed permits at once",
            vec![
                permit("p1", 10, 0, 50, true),
                permit("p2", 11, 10, 60, true),
                permit("p3", 12, 20, 70, true),
                permit("p4", 13, 30, 80, true),
            ],
        ),
        // A permit granted before another was asked for has the larger token.
        (
            "asked",
            vec![
                permit("p1", 12, 0, 10, false),
                permit("p2", 11, 20, 30, false),
            ],
        ),
        // One permit token handed out twice.
        (
            "twice",
            vec![
                permit("p1", 10, 0, 10, true),
                permit("p2", 10, 20, 30, true),
            ],
        ),
    ];
    for (rule, history) in cases {
        let found = violations(&history);
        assert!(
            found.iter().any(|v| v.contains(rule)),
            "missed ({rule}): {history:?}; found {found:?}"
        );
    }
}

#[test]
fn the_checker_catches_stale_falling_and_phantom_writes() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let hold = |owner: &str, token: i64, granted: u64| Hold {
        key: KEYS[0],
        owner: owner.to_string(),
        kind: Kind::Exclusive,
        ephemeral: false,
        token,
        requested: at(granted),
        granted: at(granted),
        ended: at(granted + 10),
        confirmed: false,
        fenced_out: false,
    };
    let write = |owner: &str, kind: Kind, token: i64, sent: u64, outcome: Outcome| Access {
        key: KEYS[0],
        kind,
        owner: owner.to_string(),
        token,
        write: true,
        sent: at(sent),
        outcome,
    };
    let holds = vec![hold("a", 10, 0), hold("b", 11, 50)];
    // Clean: a's write before b's grant landed, a's late write was fenced, b's landed; a
    // reader's write was refused; permits do not supersede each other.
    let clean = vec![
        write("a", Kind::Exclusive, 10, 10, Outcome::Landed),
        write("a", Kind::Exclusive, 10, 60, Outcome::Gone),
        write("b", Kind::Exclusive, 11, 60, Outcome::Landed),
        write("r", Kind::Shared, 9, 70, Outcome::SharedRefused),
        write("p", Kind::Permit, 5, 70, Outcome::Landed),
    ];
    assert!(stale_writes(&holds, &clean).is_empty());
    let lists = vec![(KEYS[0], vec![10, 11])];
    assert!(resource_violations(&lists, &clean).is_empty());

    let stale = vec![write("a", Kind::Exclusive, 10, 60, Outcome::Landed)];
    assert!(stale_writes(&holds, &stale)[0].contains("stale write landed"));
    let reader = vec![write("r", Kind::Shared, 9, 70, Outcome::Landed)];
    assert!(stale_writes(&holds, &reader)[0].contains("a reader's write landed"));
    let fell = vec![(KEYS[0], vec![11, 10])];
    assert!(resource_violations(&fell, &clean)[0].contains("fell"));
    let phantom = vec![(KEYS[0], vec![10, 12])];
    assert!(resource_violations(&phantom, &clean)[0].contains("phantom"));
}
