//! Thousands of malformed LOCK.* calls at a live server: it must answer each one (usually with
//! an error), stay up, and leave every existing lock exactly as it was.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use lock_testkit::*;

const LOCKS: usize = 20;

/// A hash's fields (sorted) and absolute expiry.
type Stored = (Vec<(Vec<u8>, Vec<u8>)>, i64);

fn stored_fields(con: &mut Connection, key: &str) -> Stored {
    let mut fields: Vec<(Vec<u8>, Vec<u8>)> = con.hgetall(key).unwrap();
    fields.sort();
    let at: i64 = redis::cmd("PEXPIRETIME").arg(key).query(con).unwrap();
    (fields, at)
}

/// Every lock's fields and expiry.
fn snapshot(con: &mut Connection) -> Vec<Stored> {
    (0..LOCKS)
        .map(|i| stored_fields(con, &format!("lock:{i}")))
        .collect()
}

fn junk(rng: &mut StdRng) -> Vec<u8> {
    let palette: [&[u8]; 29] = [
        b"",
        b"0",
        b"-1",
        b"-0",
        b"1.5",
        b"+5",
        b"007",
        b"9223372036854775808",
        b"99999999999999999999",
        b"-9223372036854775808",
        b"WAIT",
        b"wait",
        b"NX",
        b"__fence__",
        b"mode",
        b"__mode__",
        b"badmode:1",
        b"badmode:2",
        b"badmode:3",
        b"\0",
        b"\xff\xfe",
        b"lock:3",
        b"lock:7",
        b"str",
        b"notalock",
        b"list",
        b"3153600000001",
        b" 5",
        b"5 ",
    ];
    match rng.gen_range(0..10) {
        0 => (0..rng.gen_range(0..40)).map(|_| rng.gen()).collect(),
        1 if rng.gen_ratio(1, 50) => vec![b'x'; 1 << 20],
        _ => palette[rng.gen_range(0..palette.len())].to_vec(),
    }
}

fn is_valid_wait(args: &[Vec<u8>]) -> bool {
    args.windows(2).any(|w| {
        w[0].eq_ignore_ascii_case(b"WAIT")
            && lock_core::args::parse_i64(&w[1]).is_some_and(|t| t >= 0)
    })
}

#[test]
fn thousands_of_malformed_calls_leave_the_server_up_and_every_lock_unchanged() {
    let mut server = Server::start();
    let mut con = server.connect();
    for i in 0..LOCKS {
        acquire(
            &mut con,
            &format!("lock:{i}"),
            &format!("owner-{i}"),
            600_000,
        )
        .unwrap();
    }
    let _: () = con.set("str", "x").unwrap();
    let _: () = con
        .hset_multiple("notalock", &[("a", "1"), ("b", "2")])
        .unwrap();
    let _: () = con.rpush("list", "x").unwrap();
    // Hashes whose `mode` no lock has: not a lock, and left as they are.
    let bad_modes = ["exclusive:abc", "exclusive:", "bogus"];
    for (i, mode) in bad_modes.iter().enumerate() {
        let key = format!("badmode:{}", i + 1);
        let _: () = con
            .hset_multiple(&key, &[("w", "1"), ("mode", mode)])
            .unwrap();
        let _: () = con.pexpire(&key, 600_000).unwrap();
    }
    let bad_before: Vec<Stored> = (1..=3)
        .map(|i| stored_fields(&mut con, &format!("badmode:{i}")))
        .collect();
    let before = snapshot(&mut con);

    let seed: u64 = std::env::var("LOCK_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("LOCK_FUZZ_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let commands: [&[u8]; 6] = [
        b"LOCK.ACQUIRE",
        b"LOCK.RELEASE",
        b"LOCK.RENEW",
        b"LOCK.INFO",
        b"LOCK.FORCERELEASE",
        b"lock.acquire",
    ];
    let (mut errors, mut answered) = (0, 0);
    for _ in 0..5_000 {
        let name = commands[rng.gen_range(0..commands.len())];
        let argc = rng.gen_range(0..8);
        let mut args: Vec<Vec<u8>> = (0..argc).map(|_| junk(&mut rng)).collect();
        let forcing_a_held_lock =
            name == b"LOCK.FORCERELEASE" && args.first().is_some_and(|k| k.starts_with(b"lock:"));
        if forcing_a_held_lock || is_valid_wait(&args) {
            // Legitimate calls that would change a lock or block this connection.
            args.push(b"extra-to-make-it-invalid".to_vec());
            if name == b"LOCK.FORCERELEASE" || name.eq_ignore_ascii_case(b"LOCK.ACQUIRE") {
                args.insert(0, b"str".to_vec());
            }
        }
        let mut full: Vec<&[u8]> = vec![name];
        full.extend(args.iter().map(Vec::as_slice));
        match raw(&mut con, &full) {
            Err(e) => {
                errors += 1;
                let code = e.code().unwrap_or("?");
                assert!(
                    code == "ERR" || code == "WRONGTYPE",
                    "unexpected error class: {e}"
                );
            }
            Ok(_) => answered += 1,
        }
    }
    eprintln!("malformed calls: {errors} errors, {answered} other replies");
    assert!(server.is_alive(), "the server died; log:\n{}", server.log());
    assert_eq!(snapshot(&mut con), before, "an existing lock changed");
    for (i, was) in bad_before.iter().enumerate() {
        let key = format!("badmode:{}", i + 1);
        assert_eq!(&stored_fields(&mut con, &key), was, "{key} changed");
        assert_eq!(
            error_of(&mut con, &[b"LOCK.INFO", key.as_bytes()]),
            NOT_A_LOCK,
            "{key}"
        );
    }
    assert!(errors > 4_000);
}
