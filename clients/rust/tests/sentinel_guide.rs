//! docs/sentinel.md's set-up, as printed: its `redis.conf` and `sentinel.conf` blocks, read from
//! the page, start one master, two replicas and three Sentinels (real `redis-server` processes,
//! the Sentinels as `redis-server sentinel.conf --sentinel`) on free loopback ports. Only what
//! the page leaves to the reader is filled in: `<master-host>` and the ports (loopback ones),
//! the module's path (the test build), and the kit's `bind 127.0.0.1`, `dir` and `logfile`
//! lines. Then what the page says of it:
//!   - until a replica is connected, the master refuses a grant with `NOREPLICAS`;
//!   - every Sentinel shows the master, both replicas, the two other Sentinels and quorum 2;
//!   - the page's Rust example (its Sentinel URLs, master name and `.replicas(1, 500 ms)`, read
//!     from the block) and its Python example (run as printed, the Sentinels' addresses
//!     replaced) each take the lock, acknowledged by a replica;
//!   - after `SENTINEL FAILOVER`, both take it again, on the new master, with a higher token,
//!     each asked again while refused (`NOREPLICAS` from the old master, still a master with no
//!     replica until the Sentinels demote it, which the test waits for; `NotSafelyAcquired`
//!     from the new one right after a replica reconnected). The times are printed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use lock_testkit::{module_path, SentinelProcess, SentinelSet, Server};
use redis_lock_client::{LockClient, LockError};

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The page's code blocks of `language` ("" for the plain ones), in order.
fn blocks(language: &str) -> Vec<String> {
    let page = std::fs::read_to_string(repository().join("docs/sentinel.md")).expect("the page");
    let setup = page
        .split_once("\n## Set-up\n")
        .expect("a Set-up section")
        .1
        .split("\n## ")
        .next()
        .unwrap();
    let mut found = Vec::new();
    let mut open: Option<(bool, String)> = None;
    for line in setup.lines() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info == language, String::new())),
            (Some((wanted, body)), Some(_)) => {
                if *wanted {
                    found.push(std::mem::take(body));
                }
                open = None;
            }
            (Some((_, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    found
}

/// The block whose first line is `first`.
fn config_block(first: &str) -> String {
    blocks("")
        .into_iter()
        .find(|b| b.starts_with(first))
        .unwrap_or_else(|| panic!("a block starting {first:?}"))
}

/// The quoted strings of a block, in order.
fn quoted(block: &str) -> Vec<String> {
    block
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The Python library's venv, made or updated, as tests/failover.rs makes it.
fn python() -> PathBuf {
    let root = repository();
    let venv = std::env::var_os("PYTHON_CLIENT_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/python-client-venv"));
    let status = Command::new("bash")
        .arg(root.join("clients/python/venv.sh"))
        .env("PYTHON_CLIENT_VENV", &venv)
        .status()
        .expect("bash clients/python/venv.sh");
    assert!(status.success(), "clients/python/venv.sh failed: {status}");
    venv.join("bin/python")
}

/// The page's Python example, run as printed with the Sentinels' addresses: the token it prints,
/// and how many times it was refused (NOREPLICAS, or not acknowledged by a replica) before, each
/// time in a new process, 60 s at most.
fn python_example(python: &Path, sentinels: &[u16]) -> (u64, usize) {
    let started = Instant::now();
    let mut refusals = 0;
    loop {
        match python_example_once(python, sentinels) {
            Ok(token) => return (token, refusals),
            Err(e)
                if e.contains("LockServerError: NOREPLICAS") || e.contains("NotSafelyAcquired") =>
            {
                refusals += 1;
                println!(
                    "sentinel guide: the Python example refused: {}",
                    e.trim_end().lines().last().unwrap_or_default()
                );
                assert!(started.elapsed() < Duration::from_secs(60), "{e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

fn python_example_once(python: &Path, sentinels: &[u16]) -> Result<u64, String> {
    let mut program = blocks("python").remove(0);
    for (n, port) in sentinels.iter().enumerate() {
        let printed = format!("(\"s{}\", 26379)", n + 1);
        assert!(program.contains(&printed), "{printed} in {program}");
        program = program.replace(&printed, &format!("(\"127.0.0.1\", {port})"));
    }
    let out = Command::new(python)
        .arg("-c")
        .arg(&program)
        .output()
        .expect("python");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "the Python example failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let line = stdout.lines().last().unwrap_or_default();
    assert!(line.starts_with("held, token "), "{stdout}");
    Ok(line.rsplit(' ').next().unwrap().parse().expect("a token"))
}

fn server_config(block: &str, master_port: Option<u16>) -> String {
    let module = module_path();
    let (every, replicas_only) = block
        .split_once("# on the two replicas only:\n")
        .expect("the replicas' lines");
    let mut config = every.replace("/path/to/libredis_lock.so", &module.display().to_string());
    if let Some(port) = master_port {
        config += &replicas_only.replace("<master-host> 6379", &format!("127.0.0.1 {port}"));
    }
    config
}

/// A connection of this crate's `redis` (the test kit's is another version) to a loopback port.
fn on(port: u16) -> redis::Connection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_connection()
        .unwrap()
}

fn field(sentinel: &SentinelProcess, field: &str) -> Option<String> {
    sentinel.master_field("lockmaster", field)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_set_up_runs_as_printed_and_fails_over() {
    let started = Instant::now();
    let redis_conf = config_block("# redis.conf on every data server");
    let sentinel_conf = config_block("# sentinel.conf on every Sentinel");
    let python = tokio::task::spawn_blocking(python).await.unwrap();

    let set = tokio::task::spawn_blocking(move || {
        let master = Server::start_from_user_config(&server_config(&redis_conf, None));
        // min-replicas-to-write 1: nothing is granted before a replica is there.
        let refused: redis::RedisResult<redis::Value> = redis::cmd("LOCK.ACQUIRE")
            .arg("orders:{42}")
            .arg("early")
            .arg(30_000)
            .query(&mut on(master.port));
        let refused = refused.expect_err("no replica yet").to_string();
        assert!(refused.contains("NOREPLICAS"), "{refused}");
        // Redis waits 5 s for more replicas before a diskless full sync: not what is tested.
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("repl-diskless-sync-delay")
            .arg(0)
            .query(&mut on(master.port))
            .unwrap();
        let mut servers = vec![master];
        for _ in 0..2 {
            let config = server_config(&redis_conf, Some(servers[0].port));
            servers.push(Server::start_from_user_config(&config));
        }
        let lines: String = sentinel_conf
            .lines()
            .filter(|l| *l != "port 26379")
            .map(|l| {
                l.replace(
                    "<master-host> 6379",
                    &format!("127.0.0.1 {}", servers[0].port),
                )
            })
            .map(|l| l + "\n")
            .collect();
        assert!(!lines.contains("26379"), "the port line is `port 26379`");
        let sentinels = (0..3)
            .map(|_| SentinelProcess::start_from_config(&lines))
            .collect();
        // Returns once every Sentinel counts 2 replicas and 2 other Sentinels.
        let discovering = Instant::now();
        let set = SentinelSet::from_parts(servers, sentinels, "lockmaster");
        println!(
            "sentinel guide: the Sentinels saw the set after {:?}",
            discovering.elapsed()
        );
        set
    })
    .await
    .unwrap();
    let master = set.servers[0].port;
    for sentinel in &set.sentinels {
        assert_eq!(field(sentinel, "flags").as_deref(), Some("master"));
        assert_eq!(field(sentinel, "port"), Some(master.to_string()));
        assert_eq!(field(sentinel, "num-slaves").as_deref(), Some("2"));
        assert_eq!(field(sentinel, "num-other-sentinels").as_deref(), Some("2"));
        assert_eq!(field(sentinel, "quorum").as_deref(), Some("2"));
        assert_eq!(
            field(sentinel, "down-after-milliseconds").as_deref(),
            Some("3000")
        );
    }
    let ports: Vec<u16> = set.sentinels.iter().map(|s| s.port).collect();

    // The Rust example's Sentinels, master name and key, read from its block.
    let rust = blocks("rust").remove(0);
    let strings = quoted(&rust);
    let urls: Vec<String> = (0..3)
        .map(|n| {
            assert_eq!(strings[n], format!("redis://s{}:26379/", n + 1), "{rust}");
            format!("redis://127.0.0.1:{}/", ports[n])
        })
        .collect();
    let (name, key) = (&strings[3], &strings[4]);
    assert!(
        rust.contains(".replicas(1, std::time::Duration::from_millis(500))"),
        "{rust}"
    );
    let client = LockClient::sentinel(urls, name)
        .await
        .expect("the Sentinels");
    let lock = client
        .lock(key)
        .replicas(1, Duration::from_millis(500))
        .wait_timeout(Duration::from_secs(10));
    let mut guard = lock.acquire().await.expect("a grant through Sentinel");
    let first = guard.token();
    let info: redis::Value = redis::cmd("LOCK.INFO")
        .arg(key)
        .query(&mut on(master))
        .unwrap();
    assert_ne!(info, redis::Value::Nil, "held on the master");
    guard.release().await.unwrap();
    let python_first = tokio::task::spawn_blocking({
        let (python, ports) = (python.clone(), ports.clone());
        move || python_example(&python, &ports)
    })
    .await
    .unwrap();
    let (python_first, refused) = python_first;
    assert_eq!(refused, 0, "refused before the failover");
    assert!(python_first > first, "{python_first} after {first}");

    // The failover: every Sentinel names another master, which says it is one.
    let old = set.master_addr();
    let reply: String = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg("lockmaster")
        .query(&mut on(set.sentinels[0].port))
        .unwrap();
    assert_eq!(reply, "OK");
    let failing_over = Instant::now();
    let set = tokio::task::spawn_blocking(move || {
        set.wait_failover(&old, Duration::from_secs(30));
        set
    })
    .await
    .unwrap();
    let new = set.master_addr().1;
    assert_ne!(new, master);
    println!(
        "sentinel guide: every Sentinel named the new master after {:?}",
        failing_over.elapsed()
    );

    // The same client, and the Python example again: granted on the new master, tokens higher.
    // For a while a grant is refused with NOREPLICAS (min-replicas-to-write 1): by the old
    // master, still a master with no replica until the Sentinels demote it (SENTINEL FAILOVER
    // leaves it running), while a client still uses it, and by the new master until a replica
    // has reconnected to it. Both libraries pass the refusal on; asked again until granted, 60 s
    // at most (5 s to 10 s measured here: the old master was demoted about 10 s after).
    let refusing = Instant::now();
    let mut refusals = 0;
    let mut guard = loop {
        match lock.acquire().await {
            Ok(guard) => break guard,
            // NOREPLICAS; or a replica that has just reconnected, which counts in WAIT only
            // after its first acknowledgement (up to a second): the grant released and refused.
            Err(e @ (LockError::Server(_) | LockError::NotSafelyAcquired { .. })) if !matches!(&e, LockError::Server(m) if !m.starts_with("NOREPLICAS")) =>
            {
                refusals += 1;
                assert!(
                    refusing.elapsed() < Duration::from_secs(60),
                    "still refused after {:?}: {e:?}",
                    refusing.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("a grant on the new master: {e:?}"),
        }
    };
    println!(
        "sentinel guide: granted on the new master after {refusals} refusals, {:?}",
        refusing.elapsed()
    );
    assert!(
        guard.token() > python_first,
        "{} after {python_first}",
        guard.token()
    );
    let holder: Vec<redis::Value> = redis::cmd("LOCK.INFO")
        .arg(key)
        .query(&mut on(new))
        .unwrap();
    assert!(!holder.is_empty(), "held on the new master");
    let rust_second = guard.token();
    guard.release().await.unwrap();
    let python_second = tokio::task::spawn_blocking({
        let ports = ports.clone();
        move || python_example(&python, &ports)
    })
    .await
    .unwrap();
    let (python_second, refused) = python_second;
    println!("sentinel guide: the Python example was refused {refused} times after the failover");
    assert!(
        python_second > rust_second,
        "{python_second} after {rust_second}"
    );
    // The old master, left running by SENTINEL FAILOVER, is demoted by the Sentinels.
    let set = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(60);
        while set.role(master).as_deref() != Some("slave") {
            assert!(
                Instant::now() < deadline,
                "the old master was never demoted"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        set
    })
    .await
    .unwrap();
    println!(
        "sentinel guide: the old master was a replica {:?} after the failover",
        failing_over.elapsed()
    );
    drop(set);
    println!("sentinel guide: {:?}", started.elapsed());
}
