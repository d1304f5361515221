//! Test harness: one real `redis-server` per test, on a free loopback port, in its own temporary
//! directory, with the module freshly built and loaded. The guard kills and reaps the server on
//! drop, so a failing test leaves nothing behind.
//!
//! The server binary is `$LOCK_SERVER` (default `redis-server`) and the CLI `$LOCK_CLI` (default
//! `redis-cli`): `make test-valkey`, `make test-redis8` and `make test-valkey9` point them at
//! Valkey 8.1.8, Redis 8.2.3 and Valkey 9.1.2 (`scripts/server-deps.sh`).
//! `server_kind()` tells a test which server it runs on, for the few expectations that
//! legitimately differ.

#![allow(dead_code)]

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Once, OnceLock};
use std::thread::{self, sleep};
use std::time::{Duration, Instant};

pub use redis::{Commands, Connection, Value};

static BUILD: Once = Once::new();

/// The reply to any LOCK.* call on a hash that is not laid out as a lock.
pub const NOT_A_LOCK: &str = "ERR the hash at this key is not a lock; LOCK.* commands leave it as it is (DEL removes a damaged lock)";

/// The module under test: `$LOCK_MODULE`, or the debug build, rebuilt once per test binary so a
/// stale `.so` is never what gets tested.
pub fn module_path() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    BUILD.call_once(|| {
        if std::env::var_os("LOCK_MODULE").is_none() {
            let status = Command::new(env!("CARGO"))
                .args(["build", "--lib", "--quiet"])
                .current_dir(root)
                .status()
                .expect("cargo build");
            assert!(status.success(), "building the module failed");
        }
    });
    match std::env::var_os("LOCK_MODULE") {
        Some(p) => PathBuf::from(p),
        None => root.join("target/debug/libredis_lock.so"),
    }
}

/// The server binary the tests start: `$LOCK_SERVER`, or `redis-server` from the `PATH`.
pub fn server_bin() -> OsString {
    std::env::var_os("LOCK_SERVER")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "redis-server".into())
}

/// The CLI the tests run (`--cluster create`, transcripts, child processes): `$LOCK_CLI`, or
/// `redis-cli` from the `PATH`.
pub fn cli_bin() -> OsString {
    std::env::var_os("LOCK_CLI")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "redis-cli".into())
}

/// Which server the tests run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    Redis,
    Valkey,
}

/// The server kind and version, from `INFO server`: Valkey reports `server_name:valkey` and
/// `valkey_version:8.x.y` (its `redis_version` is a fixed `7.2.4`, for compatibility); Redis
/// has no `server_name` and reports `redis_version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    pub kind: ServerKind,
    /// (major, minor, patch) of the server itself (`valkey_version` on Valkey).
    pub version: (u32, u32, u32),
}

fn parse_server_info(info: &str) -> ServerInfo {
    let field = |name: &str| {
        info.lines().find_map(|l| {
            l.strip_prefix(&format!("{name}:"))
                .map(|v| v.trim().to_string())
        })
    };
    let kind = match field("server_name").as_deref() {
        Some("valkey") => ServerKind::Valkey,
        _ if field("valkey_version").is_some() => ServerKind::Valkey,
        _ => ServerKind::Redis,
    };
    let version_text = match kind {
        ServerKind::Valkey => field("valkey_version"),
        ServerKind::Redis => field("redis_version"),
    }
    .unwrap_or_default();
    let mut parts = version_text
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let version = (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    );
    ServerInfo { kind, version }
}

static SERVER_INFO: OnceLock<ServerInfo> = OnceLock::new();

/// What the tests' server is (the first server a test binary starts answers it; if none has
/// started yet, one is started to ask).
pub fn server_info() -> ServerInfo {
    if let Some(info) = SERVER_INFO.get() {
        return info.clone();
    }
    let server = Server::start();
    drop(server);
    SERVER_INFO
        .get()
        .expect("set by the server's start")
        .clone()
}

/// `ServerKind::Redis` or `ServerKind::Valkey`: see `server_info`.
pub fn server_kind() -> ServerKind {
    server_info().kind
}

/// The server binary's name, for messages.
fn server_name() -> String {
    Path::new(&server_bin())
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "redis-server".to_string())
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

pub struct Server {
    pub port: u16,
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    extra: Vec<String>,
    module_args: Vec<String>,
    /// Started from this config file (`start_from_config`) instead of from arguments.
    config: Option<PathBuf>,
}

impl Server {
    /// A server with the module loaded and no persistence.
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// Extra `redis-server` arguments, e.g. `["--appendonly", "yes"]`. Module arguments go in
    /// `start_with_module_args`.
    pub fn start_with(extra: &[&str]) -> Server {
        Server::launch(
            free_port(),
            tempfile::tempdir().expect("tempdir"),
            extra,
            &[],
        )
    }

    /// A server on exactly this port, failing if it is taken (to test the harness itself).
    pub fn start_on_port(port: u16) -> Server {
        let mut server = Server::unstarted(port, tempfile::tempdir().expect("tempdir"), &[], &[]);
        server.respawn();
        server
    }

    /// A server that tries this port first and moves to a free one if it is taken, as every
    /// fresh server does (to test the harness itself).
    pub fn start_trying_port(port: u16) -> Server {
        Server::launch(port, tempfile::tempdir().expect("tempdir"), &[], &[])
    }

    pub fn start_with_module_args(module_args: &[&str]) -> Server {
        Server::launch(
            free_port(),
            tempfile::tempdir().expect("tempdir"),
            &[],
            module_args,
        )
    }

    fn launch(port: u16, dir: tempfile::TempDir, extra: &[&str], module_args: &[&str]) -> Server {
        let mut server = Server::unstarted(port, dir, extra, module_args);
        server.spawn();
        server
    }

    fn unstarted(
        port: u16,
        dir: tempfile::TempDir,
        extra: &[&str],
        module_args: &[&str],
    ) -> Server {
        Server {
            port,
            child: None,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            module_args: module_args.iter().map(|s| s.to_string()).collect(),
            config: None,
        }
    }

    /// A server started from a config file (`redis.conf` in its directory) holding its port,
    /// directory, log file and `loadmodule` lines followed by `lines`: for what only a config file
    /// shows, such as module settings read at load and `CONFIG REWRITE`.
    pub fn start_from_config(lines: &str) -> Server {
        let port = free_port();
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("redis.conf");
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\nsave \"\"\nappendonly no\ndir {}\nlogfile {}\nloadmodule {}\n{lines}",
                dir.path().display(),
                dir.path().join("redis.log").display(),
                module_path().display()
            ),
        )
        .expect("write redis.conf");
        let mut server = Server {
            port,
            child: None,
            dir,
            extra: Vec::new(),
            module_args: Vec::new(),
            config: Some(config),
        };
        server.spawn();
        server
    }

    /// The config file this server started from, if it did (`start_from_config`).
    pub fn config_path(&self) -> Option<&Path> {
        self.config.as_deref()
    }

    /// Starts `redis-server` (`$LOCK_SERVER`) with this server's port, directory and arguments,
    /// and waits for it. A fresh server whose port was taken between `free_port` and its bind
    /// (another test's server got there first) moves to another free port and tries again.
    fn spawn(&mut self) {
        for _ in 0..5 {
            match self.spawn_once() {
                Ok(()) => return,
                Err(Start::PortTaken) => {
                    self.kill_hard();
                    self.move_to_port(free_port());
                }
                Err(Start::Failed(why)) => panic!("{why}"),
            }
        }
        panic!("no free port for {} after 5 tries", server_name());
    }

    /// After a restart the server must come back on its own port: a taken port is a failure.
    fn respawn(&mut self) {
        match self.spawn_once() {
            Ok(()) => {}
            Err(Start::PortTaken) => panic!(
                "port {} was taken while {} restarted",
                self.port,
                server_name()
            ),
            Err(Start::Failed(why)) => panic!("{why}"),
        }
    }

    fn move_to_port(&mut self, port: u16) {
        let old = self.port;
        self.port = port;
        if let Some(config) = &self.config {
            let text = std::fs::read_to_string(config).expect("read redis.conf");
            let text = text.replacen(&format!("port {old}\n"), &format!("port {port}\n"), 1);
            std::fs::write(config, text).expect("write redis.conf");
        }
    }

    fn spawn_once(&mut self) -> Result<(), Start> {
        let mut command = Command::new(server_bin());
        if let Some(config) = &self.config {
            command.arg(config);
        } else {
            command
                .arg("--port")
                .arg(self.port.to_string())
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(self.dir.path())
                .arg("--logfile")
                .arg(self.dir.path().join("redis.log"))
                .arg("--loadmodule")
                .arg(module_path())
                .args(&self.module_args)
                .args(&self.extra);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "spawn {:?} ({e}; is it installed? run make test, or make test-valkey / test-redis8 / test-valkey9)",
                    server_bin()
                )
            });
        self.child = Some(child);
        self.wait_ready()
    }

    /// Waits until *this* server answers: its own child must still be running, and the process
    /// answering on the port must be that child (another test's server could hold the port).
    fn wait_ready(&mut self) -> Result<(), Start> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let exited = match self.child.as_mut().map(Child::try_wait) {
                Some(Ok(None)) => None,
                Some(Ok(Some(status))) => Some(status.to_string()),
                Some(Err(e)) => Some(e.to_string()),
                None => Some("never started".to_string()),
            };
            if let Some(why) = exited {
                let log = self.log();
                if log.contains("Address already in use") {
                    return Err(Start::PortTaken);
                }
                return Err(Start::Failed(format!(
                    "{} on port {} exited before answering ({why}); log:\n{log}",
                    server_name(),
                    self.port,
                )));
            }
            if let Ok(mut c) = self.try_connect() {
                let info: redis::RedisResult<String> =
                    redis::cmd("INFO").arg("server").query(&mut c);
                if let Ok(info) = info {
                    let answering = info.lines().find_map(|l| {
                        l.strip_prefix("process_id:")
                            .and_then(|v| v.trim().parse::<u32>().ok())
                    });
                    if answering != self.pid() {
                        return Err(Start::PortTaken);
                    }
                    let _ = SERVER_INFO.set(parse_server_info(&info));
                    // INFO answers while a restart still loads its data; PING does not.
                    let pong: redis::RedisResult<String> = redis::cmd("PING").query(&mut c);
                    if pong.is_ok() {
                        return Ok(());
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(Start::Failed(format!(
                    "{} did not answer; log:\n{}",
                    server_name(),
                    self.log()
                )));
            }
            sleep(Duration::from_millis(20));
        }
    }

    fn try_connect(&self) -> redis::RedisResult<Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?
            .get_connection_with_timeout(Duration::from_secs(2))
    }

    pub fn connect(&self) -> Connection {
        self.try_connect().expect("connect")
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    /// SIGKILL, no goodbye: what a crash or OOM-kill looks like.
    pub fn kill_hard(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again on the same port and directory (persistence files included).
    pub fn restart(&mut self) {
        self.kill_hard();
        self.respawn();
    }

    pub fn is_alive(&mut self) -> bool {
        match self.child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => self.try_connect().is_ok(),
            _ => false,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// Why a server did not come up.
enum Start {
    /// Its port was taken by another process: a fresh server tries another.
    PortTaken,
    Failed(String),
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill_hard();
    }
}

/// Runs a command and returns the raw reply (errors become `Err` with Redis's text).
pub fn raw(con: &mut Connection, args: &[&[u8]]) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).unwrap());
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(con)
}

/// Redisson's RLock `tryLockInnerAsync` script (from ../shared/seeds/001_9c83fae6cf63878e.txt):
/// nil when acquired (or re-entered), else the lock's remaining pttl.
pub const REDISSON_LOCK: &str = "if (redis.call('exists', KEYS[1]) == 0) then \
redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; \
if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then \
redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; \
return redis.call('pttl', KEYS[1]);";

/// Redisson's tryLock: nil when acquired, else the remaining pttl.
pub fn redisson_lock(con: &mut Connection, key: &str, owner: &str, lease: u64) -> Option<i64> {
    redis::Script::new(REDISSON_LOCK)
        .key(key)
        .arg(lease)
        .arg(owner)
        .invoke(con)
        .unwrap()
}

/// `LOCK.ACQUIRE key owner lease` → Some(token) or None.
pub fn acquire(con: &mut Connection, key: &str, owner: &str, lease_ms: u64) -> Option<i64> {
    acquire_with(con, key, owner, lease_ms, &[]).expect("LOCK.ACQUIRE")
}

/// `LOCK.ACQUIRE key owner lease [options...]`, reply or error.
pub fn acquire_with(
    con: &mut Connection,
    key: &str,
    owner: &str,
    lease_ms: u64,
    options: &[&str],
) -> redis::RedisResult<Option<i64>> {
    redis::cmd("LOCK.ACQUIRE")
        .arg(key)
        .arg(owner)
        .arg(lease_ms)
        .arg(options)
        .query(con)
}

pub fn acquire_wait(
    con: &mut Connection,
    key: &str,
    owner: &str,
    lease_ms: u64,
    wait_ms: u64,
) -> Option<i64> {
    redis::cmd("LOCK.ACQUIRE")
        .arg(key)
        .arg(owner)
        .arg(lease_ms)
        .arg("WAIT")
        .arg(wait_ms)
        .query(con)
        .expect("LOCK.ACQUIRE WAIT")
}

pub fn release(con: &mut Connection, key: &str, owner: &str) -> Option<i64> {
    redis::cmd("LOCK.RELEASE")
        .arg(key)
        .arg(owner)
        .query(con)
        .expect("LOCK.RELEASE")
}

/// The error text of a command that must fail.
pub fn error_of(con: &mut Connection, args: &[&[u8]]) -> String {
    match raw(con, args) {
        Err(e) => {
            let code = e.code().unwrap_or("").to_string();
            let detail = e.detail().unwrap_or("").to_string();
            if code.is_empty() {
                e.to_string()
            } else {
                format!("{code} {detail}").trim_end().to_string()
            }
        }
        Ok(v) => panic!(
            "expected an error from {:?}, got {v:?}",
            String::from_utf8_lossy(args[0])
        ),
    }
}

/// LOCK.INFO as (name, value) pairs; None when free.
pub fn lock_info(
    con: &mut Connection,
    key: &str,
) -> Option<std::collections::HashMap<String, Value>> {
    let v: Value = redis::cmd("LOCK.INFO")
        .arg(key)
        .query(con)
        .expect("LOCK.INFO");
    match v {
        Value::Nil => None,
        Value::Bulk(items) => {
            let mut map = std::collections::HashMap::new();
            for pair in items.chunks(2) {
                let name: String = redis::from_redis_value(&pair[0]).unwrap();
                map.insert(name, pair[1].clone());
            }
            Some(map)
        }
        other => panic!("unexpected LOCK.INFO reply {other:?}"),
    }
}

pub fn info_int(info: &std::collections::HashMap<String, Value>, field: &str) -> i64 {
    redis::from_redis_value(info.get(field).unwrap_or(&Value::Nil)).unwrap_or(-999)
}

/// `CLIENT ID` of a connection.
pub fn client_id(con: &mut Connection) -> i64 {
    redis::cmd("CLIENT")
        .arg("ID")
        .query(con)
        .expect("CLIENT ID")
}

/// LOCK.INFO's top-level `ephemeral` (the bound client id of the exclusive hold), None if nil.
/// Panics when the key is free.
pub fn bound_to(con: &mut Connection, key: &str) -> Option<i64> {
    let info = lock_info(con, key).unwrap_or_else(|| panic!("{key} is free"));
    redis::from_redis_value(info.get("ephemeral").expect("an ephemeral field")).unwrap()
}

/// An INFO field of the lock section (`lock_<name>`), or commandstats etc.
pub fn info_field(con: &mut Connection, section: &str, field: &str) -> Option<String> {
    let text: String = redis::cmd("INFO").arg(section).query(con).ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(&format!("{field}:"))
            .map(|v| v.trim().to_string())
    })
}

/// A counter or gauge of `INFO lock` (`lock_<name>`).
pub fn lock_stat(con: &mut Connection, name: &str) -> i64 {
    info_field(con, "lock", &format!("lock_{name}"))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("INFO lock has no lock_{name}"))
}

pub fn used_memory(con: &mut Connection) -> i64 {
    info_field(con, "memory", "used_memory")
        .and_then(|v| v.parse().ok())
        .expect("used_memory")
}

/// `CONFIG SET notify-keyspace-events <classes>`.
pub fn notify_keyspace_events(con: &mut Connection, classes: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg(classes)
        .query(con)
        .expect("CONFIG SET notify-keyspace-events");
}

/// `sub` subscribed to `key`'s keyspace channel in db 0; a read gives up after `timeout`, so a
/// test can drain what was published.
pub fn keyspace_subscriber<'a>(
    sub: &'a mut Connection,
    key: &str,
    timeout: Duration,
) -> redis::PubSub<'a> {
    let mut pubsub = sub.as_pubsub();
    pubsub
        .subscribe(format!("__keyspace@0__:{key}"))
        .expect("SUBSCRIBE");
    pubsub
        .set_read_timeout(Some(timeout))
        .expect("read timeout");
    pubsub
}

/// Waits until `f` is true or the timeout passes; returns whether it became true.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        sleep(Duration::from_millis(10));
    }
    f()
}

/// The blocked clients' ids, in the order `CLIENT LIST` shows them.
pub fn blocked_client_ids(con: &mut Connection) -> Vec<i64> {
    let list: String = redis::cmd("CLIENT").arg("LIST").query(con).unwrap();
    lock_waiters_in(&list)
}

/// The ids of the clients blocked in LOCK.ACQUIRE in a `CLIENT LIST` text.
pub fn lock_waiters_in(list: &str) -> Vec<i64> {
    list.lines()
        .filter(|l| l.contains("cmd=lock.acquire") && l.contains("flags=b"))
        .filter_map(|l| {
            l.split(' ')
                .find_map(|f| f.strip_prefix("id="))
                .and_then(|v| v.parse().ok())
        })
        .collect()
}

pub fn waiters(con: &mut Connection) -> i64 {
    info_field(con, "lock", "lock_waiters")
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1)
}

impl Server {
    /// A replica of `master`, with the module loaded, once its link is up and the initial sync
    /// is done.
    pub fn replica_of(master: &Server) -> Server {
        // Redis waits 5 s by default for more replicas before a diskless full sync.
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("repl-diskless-sync-delay")
            .arg(0)
            .query(&mut master.connect())
            .expect("CONFIG SET");
        let port = master.port.to_string();
        let replica = Server::start_with(&["--replicaof", "127.0.0.1", &port]);
        let mut con = replica.connect();
        assert!(
            eventually(Duration::from_secs(10), || {
                info_field(&mut con, "replication", "master_link_status").as_deref() == Some("up")
            }),
            "the replica did not sync; log:\n{}",
            replica.log()
        );
        replica
    }

    /// Sends SIGSTOP (true) or SIGCONT (false) to the server process.
    pub fn pause(&self, stop: bool) {
        let signal = if stop { "-STOP" } else { "-CONT" };
        if let Some(pid) = self.pid() {
            let _ = Command::new("kill")
                .arg(signal)
                .arg(pid.to_string())
                .status();
        }
    }
}

/// `WAIT numreplicas timeout` on the master: how many replicas acknowledged every write so far.
pub fn wait_replicas(con: &mut Connection, replicas: i64, timeout_ms: u64) -> i64 {
    redis::cmd("WAIT")
        .arg(replicas)
        .arg(timeout_ms)
        .query(con)
        .expect("WAIT")
}

/// Everything that makes up a lock's stored state: its hash (sorted), its absolute lease end
/// (`PEXPIRETIME`), and every token counter of the server with its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredLock {
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
    pub expires_at: i64,
    pub counters: Vec<(String, String)>,
}

/// Waits until the replica acknowledged everything, then checks that `key` is stored on the
/// replica exactly as on the master (hash, absolute lease end, token counters).
pub fn assert_replica_matches(master: &mut Connection, replica: &mut Connection, key: &str) {
    assert_eq!(
        wait_replicas(master, 1, 5_000),
        1,
        "the replica did not ack"
    );
    let on_master = stored_lock(master, key);
    let mut on_replica = stored_lock(replica, key);
    // The ack covers what the replica received; give it a moment to have applied it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while on_replica != on_master && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
        on_replica = stored_lock(replica, key);
    }
    assert_eq!(
        on_replica, on_master,
        "replica differs from master for {key}"
    );
}

pub fn stored_lock(con: &mut Connection, key: &str) -> StoredLock {
    let mut fields: Vec<(Vec<u8>, Vec<u8>)> = con.hgetall(key).expect("HGETALL");
    fields.sort();
    let expires_at: i64 = redis::cmd("PEXPIRETIME")
        .arg(key)
        .query(con)
        .expect("PEXPIRETIME");
    let mut counters: Vec<(String, String)> = counter_names(con)
        .into_iter()
        .map(|name| {
            let value: String = con.get(&name).expect("GET counter");
            (name, value)
        })
        .collect();
    counters.sort();
    StoredLock {
        fields,
        expires_at,
        counters,
    }
}

pub fn counter_names(con: &mut Connection) -> Vec<String> {
    con.keys("__lock_fence__*").expect("KEYS")
}

/// A client blocked in `LOCK.ACQUIRE key owner lease WAIT timeout` on its own connection.
pub struct Waiter {
    pub id: i64,
    done: mpsc::Receiver<(redis::RedisResult<Option<i64>>, Duration)>,
}

impl Waiter {
    /// Starts the wait and returns once the server shows one more waiter, so that waiters
    /// started one after another queue in that order.
    pub fn start(
        server: &Server,
        key: &str,
        owner: &str,
        lease_ms: u64,
        timeout_ms: u64,
    ) -> Waiter {
        let mut admin = server.connect();
        let before = waiters(&mut admin);
        let mut con = server.connect();
        let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut con).unwrap();
        let (tx, rx) = mpsc::channel();
        let (key, owner) = (key.to_string(), owner.to_string());
        thread::spawn(move || {
            let started = Instant::now();
            let reply = redis::cmd("LOCK.ACQUIRE")
                .arg(&key)
                .arg(&owner)
                .arg(lease_ms)
                .arg("WAIT")
                .arg(timeout_ms)
                .query::<Option<i64>>(&mut con);
            let elapsed = started.elapsed();
            // Closed before the answer is handed over: a test that goes on to MODULE UNLOAD
            // must not find this connection still open with LOCK.ACQUIRE as its last command.
            drop(con);
            let _ = tx.send((reply, elapsed));
        });
        assert!(
            eventually(Duration::from_secs(5), || waiters(&mut admin) == before + 1),
            "the waiter did not block"
        );
        Waiter { id, done: rx }
    }

    pub fn answer(&self, within: Duration) -> Option<(redis::RedisResult<Option<i64>>, Duration)> {
        self.done.recv_timeout(within).ok()
    }

    pub fn token(&self, within: Duration) -> Option<i64> {
        match self.answer(within) {
            Some((Ok(t), _)) => t,
            other => panic!("waiter {} got {other:?}", self.id),
        }
    }

    pub fn still_blocked(&self) -> bool {
        matches!(self.done.try_recv(), Err(mpsc::TryRecvError::Empty))
    }
}

/// A client on a plain socket, for tests that need thousands of connections at once (a
/// `Connection` blocked in `WAIT` needs a thread of its own): commands are written as they come,
/// without waiting, and the replies read later, in order.
pub struct RawClient {
    reader: BufReader<TcpStream>,
}

impl RawClient {
    pub fn connect(port: u16) -> std::io::Result<RawClient> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        // Small: a test may hold ten thousand of these.
        Ok(RawClient {
            reader: BufReader::with_capacity(512, stream),
        })
    }

    /// Writes the commands in one write (a pipeline); their replies are not read.
    pub fn send(&mut self, cmds: &[&redis::Cmd]) -> std::io::Result<()> {
        let bytes: Vec<u8> = cmds.iter().flat_map(|c| c.get_packed_command()).collect();
        self.reader.get_mut().write_all(&bytes)
    }

    /// The next reply, as a `Connection` would give it (a server error is `Err`, with its
    /// code). An I/O error when none arrived within `timeout` or the connection closed.
    pub fn reply(&mut self, timeout: Duration) -> redis::RedisResult<Value> {
        self.reader.get_ref().set_read_timeout(Some(timeout))?;
        let mut frame = Vec::new();
        read_frame(&mut self.reader, &mut frame)?;
        redis::parse_redis_value(&frame)
    }

    /// Sends one command and reads its reply.
    pub fn query(&mut self, cmd: &redis::Cmd, timeout: Duration) -> redis::RedisResult<Value> {
        self.send(&[cmd])?;
        self.reply(timeout)
    }
}

/// Appends one RESP2 reply, as its bytes, to `out`.
fn read_frame(reader: &mut impl BufRead, out: &mut Vec<u8>) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind};
    let start = out.len();
    if reader.read_until(b'\n', out)? == 0 {
        return Err(ErrorKind::UnexpectedEof.into());
    }
    let line = &out[start..];
    let kind = line[0];
    let length = || -> std::io::Result<i64> {
        std::str::from_utf8(&line[1..])
            .ok()
            .and_then(|n| n.trim_end().parse().ok())
            .ok_or_else(|| Error::new(ErrorKind::InvalidData, "bad RESP length"))
    };
    match kind {
        b'$' => {
            let n = length()?;
            if n >= 0 {
                let mut body = vec![0; n as usize + 2];
                reader.read_exact(&mut body)?;
                out.extend_from_slice(&body);
            }
        }
        b'*' => {
            for _ in 0..length()?.max(0) {
                read_frame(reader, out)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// The soft limit on this process's open files (`ulimit -n`), from `/proc/self/limits`.
pub fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    match line.split_whitespace().nth(3)? {
        "unlimited" => Some(u64::MAX),
        soft => soft.parse().ok(),
    }
}

/// A Redis Cluster of masters on loopback, each with the module loaded, created the way a user
/// does it (`redis-server --cluster-enabled yes`, then `redis-cli --cluster create`; `$LOCK_SERVER`
/// and `$LOCK_CLI` when set).
pub struct Cluster {
    pub nodes: Vec<Server>,
}

impl Cluster {
    pub fn start(masters: usize) -> Cluster {
        let nodes: Vec<Server> = (0..masters)
            .map(|_| {
                Server::launch(
                    cluster_port(),
                    tempfile::tempdir().expect("tempdir"),
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "5000",
                    ],
                    &[],
                )
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new(cli_bin())
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .arg("--cluster-yes")
            .output()
            .expect("redis-cli --cluster create ($LOCK_CLI)");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Cluster { nodes };
        for node in &cluster.nodes {
            let mut con = node.connect();
            assert!(
                eventually(Duration::from_secs(20), || {
                    let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut con).unwrap();
                    info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
                }),
                "the cluster did not come up"
            );
        }
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Server::url).collect()
    }

    pub fn client(&self) -> redis::cluster::ClusterConnection {
        redis::cluster::ClusterClient::new(self.urls())
            .expect("cluster client")
            .get_connection()
            .expect("cluster connection")
    }

    /// The node that serves `slot` now.
    pub fn node_for_slot(&self, slot: u16) -> &Server {
        let mut con = self.nodes[0].connect();
        let shards: Vec<(i64, i64, Vec<Value>)> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query::<Vec<Vec<Value>>>(&mut con)
            .expect("CLUSTER SLOTS")
            .into_iter()
            .map(|mut entry| {
                let low = redis::from_redis_value(&entry[0]).unwrap();
                let high = redis::from_redis_value(&entry[1]).unwrap();
                (low, high, entry.drain(2..).collect())
            })
            .collect();
        let (_, _, owners) = shards
            .iter()
            .find(|(low, high, _)| (*low..=*high).contains(&i64::from(slot)))
            .expect("slot served");
        let master: (String, i64) = match &owners[0] {
            Value::Bulk(fields) => (
                redis::from_redis_value(&fields[0]).unwrap(),
                redis::from_redis_value(&fields[1]).unwrap(),
            ),
            other => panic!("unexpected CLUSTER SLOTS entry {other:?}"),
        };
        self.nodes
            .iter()
            .find(|n| i64::from(n.port) == master.1)
            .expect("a node of this cluster")
    }

    pub fn node_id(node: &Server) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut node.connect())
            .expect("CLUSTER MYID")
    }
}

/// A free port whose cluster bus port (port + 10000) is free too. Both are taken below Linux's
/// ephemeral range (32768+), so no client connection of a concurrent test can grab the bus
/// port between this check and the server's bind.
fn cluster_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    // Spread the start per process; then walk, so two tests in one process never pick the same.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = 20_000 + (std::process::id() % 2_000) as u16;
    loop {
        let port = 20_000 + (start - 20_000 + NEXT.fetch_add(1, Ordering::Relaxed)) % 2_700;
        if TcpListener::bind(("127.0.0.1", port)).is_ok()
            && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        {
            return port;
        }
    }
}
