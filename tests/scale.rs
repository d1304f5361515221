//! Scale: tens of thousands of waiters on one server. Alone in its own test binary, because
//! each blocked waiter is a connection and this machine caps a process at 20,000 open files (a
//! hard limit root cannot raise here), so it must not share the process with other large tests.
//! Ticketed waiters need no connection each: 100,000 of them wait on a few hundred.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use lock_testkit::*;

const SOON: Duration = Duration::from_secs(3);

#[test]
fn eighteen_thousand_waiters_spread_over_a_thousand_keys_work() {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    // One connection per waiter. This machine caps a process at 20,000 open files (a hard limit
    // root cannot raise here), which bounds both this process and the server; the module's
    // queues themselves are exercised with 100,000 waiters in lock-core's unit tests.
    const KEYS: usize = 1_000;
    const PER_KEY: usize = 18;
    const N: usize = KEYS * PER_KEY;
    let server = Server::start_with(&["--maxclients", "18500", "--tcp-backlog", "4096"]);
    let mut con = server.connect();
    let mut pipe = redis::pipe();
    for k in 0..KEYS {
        pipe.cmd("LOCK.ACQUIRE")
            .arg(format!("k{k}"))
            .arg("holder")
            .arg(600_000)
            .ignore();
    }
    let _: () = pipe.query(&mut con).unwrap();

    let mut socks: Vec<TcpStream> = Vec::with_capacity(N);
    for i in 0..N {
        socks.push(TcpStream::connect(("127.0.0.1", server.port)).unwrap());
        if i % 2_000 == 1_999 {
            assert!(eventually(Duration::from_secs(20), || {
                info_field(&mut con, "clients", "connected_clients")
                    .and_then(|v| v.parse::<usize>().ok())
                    .is_some_and(|c| c > i)
            }));
        }
    }
    // Redis shrinks idle clients' buffers from its cron (about every second per client, after
    // 2 s idle): measure settled memory on both sides, or buffers blur the figure.
    let settle = || thread::sleep(Duration::from_millis(4_500));
    settle();
    let idle = used_memory(&mut con);
    // Waiter i waits on key i % KEYS, so every key's queue is in the order of i.
    for (i, sock) in socks.iter_mut().enumerate() {
        let (key, owner) = (format!("k{}", i % KEYS), format!("w{i}"));
        let cmd = format!(
            "*6\r\n$12\r\nLOCK.ACQUIRE\r\n${}\r\n{key}\r\n${}\r\n{owner}\r\n$6\r\n600000\r\n$4\r\nWAIT\r\n$1\r\n0\r\n",
            key.len(),
            owner.len()
        );
        sock.write_all(cmd.as_bytes()).unwrap();
    }
    assert!(
        eventually(Duration::from_secs(60), || waiters(&mut con) == N as i64),
        "{} of {N} waiters queued",
        waiters(&mut con)
    );
    assert_eq!(
        info_field(&mut con, "lock", "lock_locks_with_waiters").as_deref(),
        Some(KEYS.to_string().as_str())
    );
    settle();
    let per_waiter = (used_memory(&mut con) - idle) / N as i64;
    eprintln!("memory per blocked waiter, its idle connection excluded: {per_waiter} B");
    // Bounded, and most of it is Redis's: on 7.0 RM_BlockClient holds temporary clients with
    // 16 KB reply buffers while a client is blocked (about 35 KB in all). The module's queue
    // entry is a few hundred bytes (see docs/commands.md, "Limits").
    assert!(per_waiter < 64 * 1024, "{per_waiter} B per waiter");

    // Every key hands over to its first waiter at its release.
    let mut pipe = redis::pipe();
    for k in 0..KEYS {
        pipe.cmd("LOCK.RELEASE").arg(format!("k{k}")).arg("holder");
    }
    let left: Vec<i64> = pipe.query(&mut con).unwrap();
    assert!(left.iter().all(|&l| l == 0));
    let mut buf = [0u8; 64];
    for sock in socks.iter_mut().take(KEYS) {
        sock.set_read_timeout(Some(SOON)).unwrap();
        let n = sock.read(&mut buf).unwrap();
        assert!(buf[..n].starts_with(b":"), "{:?}", &buf[..n]);
    }
    // Key k0's queue is served through, in order, each holder releasing on its own socket.
    for i in (0..N).step_by(KEYS) {
        let sock = &mut socks[i];
        if i > 0 {
            let n = sock.read(&mut buf).unwrap();
            assert!(buf[..n].starts_with(b":"), "waiter {i}: {:?}", &buf[..n]);
        }
        let owner = format!("w{i}");
        let cmd = format!(
            "*3\r\n$12\r\nLOCK.RELEASE\r\n$2\r\nk0\r\n${}\r\n{owner}\r\n",
            owner.len()
        );
        sock.set_read_timeout(Some(SOON)).unwrap();
        sock.write_all(cmd.as_bytes()).unwrap();
        let n = sock.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b":0\r\n", "waiter {i} releases");
    }
    assert!(lock_info(&mut con, "k0").is_none());
    assert_eq!(waiters(&mut con), (N - KEYS - (PER_KEY - 1)) as i64);
    drop(socks);
    assert!(eventually(Duration::from_secs(60), || waiters(&mut con) == 0));
}

/// `LOCK_TICKET_WAITERS`: how many ticketed waiters the scale test queues (default 20,000, in
/// `make test` on every server; `make scale` runs 100,000, the figure the docs give).
fn ticket_waiters() -> usize {
    match std::env::var("LOCK_TICKET_WAITERS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("LOCK_TICKET_WAITERS={v:?} is not a number")),
        Err(_) => 20_000,
    }
}

/// Connections that each block on many tickets at once (`BLPOP t1 ... tk 0`) and block again on
/// the rest after each answer, as a client library multiplexes its waits on one connection. All
/// on non-blocking sockets served by one thread, so that the test's own side stays light (a
/// thread per connection would crowd the server off this machine's two cores).
struct Poppers {
    socks: Vec<Popper>,
}

struct Popper {
    sock: TcpStream,
    unread: Vec<u8>,
    waiting_on: Vec<String>,
}

impl Popper {
    fn block(&mut self) {
        let mut cmd = redis::cmd("BLPOP");
        cmd.arg(&self.waiting_on).arg(0);
        self.sock.set_nonblocking(false).unwrap();
        self.sock.write_all(&cmd.get_packed_command()).unwrap();
        self.sock.set_nonblocking(true).unwrap();
    }

    /// The answers read so far: (ticket, what it held).
    fn answers(&mut self) -> Vec<(String, String)> {
        let mut buf = [0u8; 4096];
        loop {
            match self.sock.read(&mut buf) {
                Ok(0) => panic!("a popper's connection closed"),
                Ok(n) => self.unread.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        let mut out = Vec::new();
        // A BLPOP reply is five lines: *2, $len, the ticket, $len, the element.
        while let Some(end) = self
            .unread
            .windows(2)
            .enumerate()
            .filter(|(_, w)| w == b"\r\n")
            .nth(4)
            .map(|(i, _)| i + 2)
        {
            let frame: Vec<u8> = self.unread.drain(..end).collect();
            match redis::parse_redis_value(&frame).unwrap() {
                Value::Bulk(items) => match items.as_slice() {
                    [Value::Data(k), Value::Data(v)] => out.push((
                        String::from_utf8(k.clone()).unwrap(),
                        String::from_utf8(v.clone()).unwrap(),
                    )),
                    other => panic!("{other:?}"),
                },
                other => panic!("{other:?}"),
            }
        }
        out
    }
}

impl Poppers {
    fn connect(server: &Server, count: usize) -> Poppers {
        let socks = (0..count)
            .map(|_| {
                let sock = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
                sock.set_nodelay(true).unwrap();
                Popper {
                    sock,
                    unread: Vec::new(),
                    waiting_on: Vec::new(),
                }
            })
            .collect();
        Poppers { socks }
    }

    /// Each connection blocks on its share of the tickets.
    fn block_on(&mut self, tickets: &[String]) {
        let per = tickets.len().div_ceil(self.socks.len());
        for (popper, chunk) in self.socks.iter_mut().zip(tickets.chunks(per)) {
            popper.waiting_on = chunk.to_vec();
            popper.block();
        }
    }

    /// Serves the connections until every ticket was popped or `within` passed; returns what
    /// was popped.
    fn pop_all(&mut self, within: Duration) -> Vec<String> {
        let started = Instant::now();
        let mut popped = Vec::new();
        while self.socks.iter().any(|p| !p.waiting_on.is_empty()) {
            assert!(started.elapsed() < within, "{} popped", popped.len());
            let mut any = false;
            for popper in &mut self.socks {
                if popper.waiting_on.is_empty() {
                    continue;
                }
                let answers = popper.answers();
                if answers.is_empty() {
                    continue;
                }
                any = true;
                for (ticket, value) in answers {
                    popper.waiting_on.retain(|t| *t != ticket);
                    popped.push(value);
                }
                if !popper.waiting_on.is_empty() {
                    popper.block();
                }
            }
            if !any {
                thread::sleep(Duration::from_millis(1));
            }
        }
        popped
    }
}

/// Waits for Redis to shrink idle clients' buffers (see the test above), then reads
/// `used_memory`.
fn settled_memory(con: &mut Connection) -> i64 {
    thread::sleep(Duration::from_millis(4_500));
    used_memory(con)
}

#[test]
fn ticketed_waiters_cost_under_a_kilobyte_each_and_a_grant_storm_keeps_ping_fast() {
    // Shared waiters, ten a key behind one exclusive holder, each popped by a connection that
    // blocks on a hundred tickets at once (as a client library multiplexes its waits).
    const PER_KEY: usize = 10;
    const PER_POPPER: usize = 100;
    const ASKERS: usize = 8;
    const LEASE: u64 = 3_600_000;
    let n = ticket_waiters();
    assert!(
        n.is_multiple_of(PER_KEY * PER_POPPER),
        "a multiple of {}",
        PER_KEY * PER_POPPER
    );
    let keys = n / PER_KEY;
    let server = Server::start_with(&["--maxclients", "18500", "--tcp-backlog", "4096"]);
    let mut con = server.connect();
    let hold_all = |con: &mut Connection| {
        let mut pipe = redis::pipe();
        for k in 0..keys {
            pipe.cmd("LOCK.ACQUIRE")
                .arg(format!("k{k}"))
                .arg("holder")
                .arg(LEASE)
                .ignore();
        }
        let _: () = pipe.query(con).unwrap();
    };
    hold_all(&mut con);
    let mut askers: Vec<Connection> = (0..ASKERS).map(|_| server.connect()).collect();
    let mut poppers = Poppers::connect(&server, n / PER_POPPER);
    let baseline = settled_memory(&mut con);

    // Queue the tickets, a pipeline per asking connection; waiter i waits on key i % keys.
    let started = Instant::now();
    let mut tickets: Vec<String> = Vec::with_capacity(n);
    for (a, asker) in askers.iter_mut().enumerate() {
        let mut pipe = redis::pipe();
        for i in (a..n).step_by(ASKERS) {
            pipe.cmd("LOCK.ACQUIRE")
                .arg(format!("k{}", i % keys))
                .arg(format!("w{i}"))
                .arg(LEASE)
                .arg("SHARED")
                .arg("WAIT")
                .arg(0)
                .arg("TICKET");
        }
        let names: Vec<String> = pipe.query(asker).unwrap();
        tickets.extend(names);
    }
    assert_eq!(waiters(&mut con), n as i64);
    assert_eq!(lock_stat(&mut con, "tickets"), n as i64);
    eprintln!("{n} tickets queued in {:?}", started.elapsed());

    let queued = settled_memory(&mut con);
    // Every popper blocks on its hundred tickets.
    poppers.block_on(&tickets);
    assert!(
        eventually(Duration::from_secs(60), || {
            info_field(&mut con, "clients", "blocked_clients").and_then(|v| v.parse::<usize>().ok())
                == Some(n / PER_POPPER)
        }),
        "the poppers did not all block"
    );
    let waiting = settled_memory(&mut con);
    let per_waiter = (waiting - baseline) / n as i64;
    eprintln!(
        "memory per ticketed waiter, connections excluded ({n} waiters, {} poppers): \
         {per_waiter} B: {} B queued in the module, {} B more once a BLPOP waits on its ticket",
        n / PER_POPPER,
        (queued - baseline) / n as i64,
        (waiting - queued) / n as i64
    );
    assert!(per_waiter <= 1_024, "{per_waiter} B per ticketed waiter");

    // The storm: every holder's lease ends within the same millisecond or so, and the module
    // grants every waiter and writes every ticket, a batch at a time.
    let pinger = Pinger::start(&server);
    let storm = Instant::now();
    let mut pipe = redis::pipe();
    for k in 0..keys {
        pipe.cmd("LOCK.RENEW")
            .arg(format!("k{k}"))
            .arg("holder")
            .arg(500)
            .ignore();
    }
    let _: () = pipe.query(&mut con).unwrap();
    let popped = poppers.pop_all(Duration::from_secs(300));
    let pings = pinger.stop();
    assert!(
        popped.iter().all(|v| v.parse::<i64>().is_ok()),
        "every ticket holds a token"
    );
    let popped = popped.len();
    assert_eq!(popped, n);
    eprintln!(
        "grant storm: {n} grants written and popped {:?} after the leases were cut to 500 ms; \
         worst PING {:.1} ms over {} PINGs (bound {} ms)",
        storm.elapsed(),
        pings.worst.as_secs_f64() * 1e3,
        pings.answered,
        ping_bound().as_millis()
    );
    assert!(pings.failed.is_none(), "{:?}", pings.failed);
    assert!(
        pings.worst < ping_bound(),
        "the server went {:?} without answering PING (bound {:?})",
        pings.worst,
        ping_bound()
    );
    assert_eq!(lock_stat(&mut con, "handoffs"), n as i64);
    assert_eq!(waiters(&mut con), 0);
    assert!(eventually(Duration::from_secs(10), || lock_stat(
        &mut con, "tickets"
    ) == 0));

    // Everyone releases and the holders take their keys again: the server is where it was.
    for (a, asker) in askers.iter_mut().enumerate() {
        let mut pipe = redis::pipe();
        for i in (a..n).step_by(ASKERS) {
            pipe.cmd("LOCK.RELEASE")
                .arg(format!("k{}", i % keys))
                .arg(format!("w{i}"))
                .ignore();
        }
        let _: () = pipe.query(asker).unwrap();
    }
    hold_all(&mut con);
    let after = settled_memory(&mut con);
    let left = after - baseline;
    eprintln!(
        "used_memory: {baseline} B before the tickets, {waiting} B with {n} waiting, \
         {after} B once answered and released ({left:+} B)"
    );
    // What stays is Redis's own: the table of keys clients blocked on keeps its size.
    assert!(
        left < (waiting - baseline) / 20,
        "{left} B more than before the tickets"
    );
}

/// `LOCK_CLOSE_TICKETS`: how many tickets one connection owns when it closes (default 20,000 in
/// `make test`; `make scale` runs 200,000).
fn close_tickets() -> usize {
    match std::env::var("LOCK_CLOSE_TICKETS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("LOCK_CLOSE_TICKETS={v:?} is not a number")),
        Err(_) => 20_000,
    }
}

/// One connection queues tickets on a thousand busy keys, then closes: the server withdraws
/// them a bounded batch a turn, and keeps answering PING meanwhile (it ended 200,000 in one
/// turn before, 564 ms without an answer).
#[test]
fn a_connection_closing_with_many_tickets_keeps_ping_fast() {
    const KEYS: usize = 1_000;
    const PIPELINE: usize = 10_000;
    let n = close_tickets();
    let server = Server::start();
    let mut con = server.connect();
    let mut pipe = redis::pipe();
    for k in 0..KEYS {
        pipe.cmd("LOCK.ACQUIRE")
            .arg(format!("k{k}"))
            .arg("holder")
            .arg(600_000)
            .ignore();
    }
    let _: () = pipe.query(&mut con).unwrap();
    let mut owner = server.connect();
    for start in (0..n).step_by(PIPELINE) {
        let mut pipe = redis::pipe();
        for i in start..n.min(start + PIPELINE) {
            pipe.cmd("LOCK.ACQUIRE")
                .arg(format!("k{}", i % KEYS))
                .arg(format!("w{i}"))
                .arg(60_000)
                .arg("WAIT")
                .arg(600_000)
                .arg("TICKET")
                .ignore();
        }
        let _: () = pipe.query(&mut owner).unwrap();
    }
    assert_eq!(lock_stat(&mut con, "tickets"), n as i64);
    let pinger = Pinger::start(&server);
    thread::sleep(Duration::from_millis(200));
    let closed = Instant::now();
    drop(owner);
    assert!(
        eventually(Duration::from_secs(60), || lock_stat(&mut con, "tickets")
            == 0),
        "the closed connection's tickets were not all withdrawn"
    );
    let took = closed.elapsed();
    let pings = pinger.stop();
    eprintln!(
        "close of one connection owning {n} tickets: withdrawn in {took:?}; worst PING {:.1} ms \
         over {} PINGs (bound {} ms)",
        pings.worst.as_secs_f64() * 1e3,
        pings.answered,
        ping_bound().as_millis()
    );
    assert!(pings.failed.is_none(), "{:?}", pings.failed);
    assert!(
        pings.worst < ping_bound(),
        "the server went {:?} without answering PING",
        pings.worst
    );
    assert_eq!(waiters(&mut con), 0);
}
