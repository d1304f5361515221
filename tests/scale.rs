//! Scale: tens of thousands of waiters on one server. Alone in its own test binary, because
//! each waiter is a connection and this machine caps a process at 20,000 open files (a hard
//! limit root cannot raise here), so it must not share the process with other large tests.

use std::thread;
use std::time::Duration;

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
