//! One real `redis-server` (`$LOCK_SERVER`) with the module loaded, on a free loopback port, in
//! its own temporary directory. The guard kills and reaps it on drop, so a failing test or an
//! interrupted bench leaves nothing behind.

use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Once, OnceLock};
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis::Connection;

use crate::eventually;
use crate::lock::info_field;

static BUILD: Once = Once::new();

/// The module under test: `$LOCK_MODULE`, or the debug build, rebuilt once per process so a
/// stale `.so` is never what gets tested. The debug build is looked for in `$CARGO_TARGET_DIR`
/// when set (where the build just wrote it), else in the workspace's `target/`.
pub fn module_path() -> PathBuf {
    let root = workspace_root();
    BUILD.call_once(|| {
        if std::env::var_os("LOCK_MODULE").is_none() {
            let status = Command::new(env!("CARGO"))
                .args(["build", "-p", "redis-lock", "--lib", "--quiet"])
                .current_dir(&root)
                .status()
                .expect("cargo build");
            assert!(status.success(), "building the module failed");
        }
    });
    match std::env::var_os("LOCK_MODULE") {
        Some(p) => PathBuf::from(p),
        None => target_dir(&root).join("debug/libredis_lock.so"),
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit/ sits in the workspace")
        .to_path_buf()
}

fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    }
}

/// The server binary: `$LOCK_SERVER`, or `redis-server` from the `PATH`.
pub fn server_bin() -> OsString {
    std::env::var_os("LOCK_SERVER")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "redis-server".into())
}

/// The CLI (`--cluster create`, transcripts, child processes): `$LOCK_CLI`, or `redis-cli` from
/// the `PATH`.
pub fn cli_bin() -> OsString {
    std::env::var_os("LOCK_CLI")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "redis-cli".into())
}

/// The server binary's name, for messages.
pub fn server_name() -> String {
    Path::new(&server_bin())
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "redis-server".to_string())
}

/// Which server runs.
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

/// What the server is (the first server this process starts answers it; if none has started
/// yet, one is started to ask).
pub fn server_info() -> ServerInfo {
    if let Some(info) = SERVER_INFO.get() {
        return info.clone();
    }
    drop(Server::start());
    SERVER_INFO
        .get()
        .expect("set by the server's start")
        .clone()
}

/// `ServerKind::Redis` or `ServerKind::Valkey`: see `server_info`.
pub fn server_kind() -> ServerKind {
    server_info().kind
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// How to start a server beyond the defaults (`Server::start`).
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The module to load; `module_path()` when `None`.
    pub module: Option<PathBuf>,
    /// No module at all: a plain server (what a server without the module makes of the
    /// module's data, e.g. replaying its AOF).
    pub without_module: bool,
    /// Arguments after the module path on `--loadmodule`.
    pub module_args: Vec<String>,
    /// Any other server arguments, e.g. `--appendonly yes`.
    pub extra: Vec<String>,
    /// Listen on 127.0.0.1 ..= 127.0.0.<n> instead of 127.0.0.1 only (0 and 1 mean one). Linux
    /// picks ephemeral ports per destination, so each address gives another ~28,000
    /// connections from one client.
    pub loopback_addresses: u8,
}

/// A signal for a process the kit started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGSTOP: frozen, as in a long GC pause or a stopped VM.
    Stop,
    /// SIGCONT: carries on.
    Cont,
}

/// Sends `signal` to `pid` (through `kill(1)`).
pub(crate) fn send_signal(pid: u32, signal: Signal) {
    let flag = match signal {
        Signal::Stop => "-STOP",
        Signal::Cont => "-CONT",
    };
    let _ = Command::new("kill").arg(flag).arg(pid.to_string()).status();
}

/// How the server is started: from arguments, or from a config file in its directory.
#[derive(Debug)]
enum Launch {
    Args {
        /// None: a plain server, without the module.
        module: Option<PathBuf>,
        module_args: Vec<String>,
        extra: Vec<String>,
    },
    Config(PathBuf),
}

pub struct Server {
    pub port: u16,
    /// The loopback addresses it listens on (127.0.0.1 first).
    pub addresses: Vec<Ipv4Addr>,
    pub dir: tempfile::TempDir,
    child: Option<Child>,
    launch: Launch,
}

impl Server {
    /// A server with the module loaded and no persistence.
    pub fn start() -> Server {
        Server::start_options(&Options::default())
    }

    /// Extra server arguments, e.g. `["--appendonly", "yes"]`. Module arguments go in
    /// `start_with_module_args`.
    pub fn start_with(extra: &[&str]) -> Server {
        Server::start_options(&Options {
            extra: strings(extra),
            ..Options::default()
        })
    }

    pub fn start_with_module_args(module_args: &[&str]) -> Server {
        Server::start_options(&Options {
            module_args: strings(module_args),
            ..Options::default()
        })
    }

    /// Any options; a fresh server on a free port.
    pub fn start_options(options: &Options) -> Server {
        let mut server = Server::unstarted(free_port(), options);
        server.spawn();
        server
    }

    /// A server on exactly this port, failing if it is taken (to test the kit itself).
    pub fn start_on_port(port: u16) -> Server {
        let mut server = Server::unstarted(port, &Options::default());
        server.respawn();
        server
    }

    /// A server that tries this port first and moves to a free one if it is taken, as every
    /// fresh server does (to test the kit itself).
    pub fn start_trying_port(port: u16) -> Server {
        Server::start_on_free(port, &Options::default())
    }

    /// A fresh server that tries `port` first (`Cluster` picks ports whose bus port is free).
    pub(crate) fn start_on_free(port: u16, options: &Options) -> Server {
        let mut server = Server::unstarted(port, options);
        server.spawn();
        server
    }

    fn unstarted(port: u16, options: &Options) -> Server {
        Server {
            port,
            addresses: (1..=options.loopback_addresses.max(1))
                .map(|last| Ipv4Addr::new(127, 0, 0, last))
                .collect(),
            dir: tempfile::tempdir().expect("tempdir"),
            child: None,
            launch: Launch::Args {
                module: (!options.without_module)
                    .then(|| options.module.clone().unwrap_or_else(module_path)),
                module_args: options.module_args.clone(),
                extra: options.extra.clone(),
            },
        }
    }

    /// A server started from a config file (`redis.conf` in its directory) holding its port,
    /// directory, log file and `loadmodule` lines followed by `lines`: for what only a config file
    /// shows, such as module settings read at load and `CONFIG REWRITE`.
    pub fn start_from_config(lines: &str) -> Server {
        let mut server = Server::unstarted(free_port(), &Options::default());
        let config = server.dir.path().join("redis.conf");
        std::fs::write(
            &config,
            format!(
                "port {}\nbind 127.0.0.1\nsave \"\"\nappendonly no\ndir {}\nlogfile {}\nloadmodule {}\n{lines}",
                server.port,
                server.dir.path().display(),
                server.dir.path().join("redis.log").display(),
                module_path().display()
            ),
        )
        .expect("write redis.conf");
        server.launch = Launch::Config(config);
        server.spawn();
        server
    }

    /// A server started from a configuration of a user's own (`redis.conf` in its directory):
    /// only its port, `bind 127.0.0.1`, its directory and its log file are written before
    /// `lines`, and no `loadmodule` (`lines` load the module, or not). For a documented
    /// configuration taken as printed (`docs/sentinel.md`'s, by
    /// `clients/rust/tests/sentinel_guide.rs`).
    pub fn start_from_user_config(lines: &str) -> Server {
        let mut server = Server::unstarted(free_port(), &Options::default());
        let config = server.dir.path().join("redis.conf");
        std::fs::write(
            &config,
            format!(
                "port {}\nbind 127.0.0.1\ndir {}\nlogfile {}\n{lines}",
                server.port,
                server.dir.path().display(),
                server.dir.path().join("redis.log").display(),
            ),
        )
        .expect("write redis.conf");
        server.launch = Launch::Config(config);
        server.spawn();
        server
    }

    /// A replica of `master`, with the module loaded, once its link is up, the initial sync is
    /// done and `master` counts it in `WAIT` ([`Server::wait_replicas_acknowledge`]).
    pub fn replica_of(master: &Server) -> Server {
        Server::replica_of_with(master, &[])
    }

    /// [`Server::replica_of`] with extra server arguments (`--appendonly yes`, ...).
    pub fn replica_of_with(master: &Server, extra: &[String]) -> Server {
        // Redis waits 5 s by default for more replicas before a diskless full sync.
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("repl-diskless-sync-delay")
            .arg(0)
            .query(&mut master.connect())
            .expect("CONFIG SET");
        let port = master.port.to_string();
        let mut args = vec!["--replicaof".to_string(), "127.0.0.1".into(), port];
        args.extend(extra.iter().cloned());
        let replica = Server::start_options(&Options {
            extra: args,
            ..Options::default()
        });
        let mut con = replica.connect();
        assert!(
            eventually(Duration::from_secs(10), || {
                info_field(&mut con, "replication", "master_link_status").as_deref() == Some("up")
            }),
            "the replica did not sync; log:\n{}",
            replica.log()
        );
        master.wait_replicas_acknowledge(master.connected_replicas());
        replica
    }

    /// `connected_slaves` of `INFO replication`: the replicas this master has (in sync or not).
    pub fn connected_replicas(&self) -> usize {
        info_field(&mut self.connect(), "replication", "connected_slaves")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Waits until this master counts `replicas` replicas in `WAIT`. A replica whose link is up
    /// is not counted yet until the master has its first `REPLCONF ACK` (on Redis 7.0.15 a
    /// `WAIT 1 200` right after `master_link_status:up` can answer 0). Writes (a `SET` and a
    /// `DEL` of a key of its own, in a slot this node serves when it is a cluster node: nothing
    /// is left behind), then `WAIT replicas 5000`, again until it answers `replicas`; panics
    /// after 60 s with the master's `INFO replication`.
    pub fn wait_replicas_acknowledge(&self, replicas: usize) {
        let mut con = self.connect();
        let key = (0..100_000)
            .map(|i| format!("testkit:acknowledged:{i}"))
            .find(
                |key| match redis::cmd("SET").arg(key).arg(1).query::<()>(&mut con) {
                    Ok(()) => true,
                    Err(e) if e.kind() == redis::ErrorKind::Moved => false,
                    Err(e) => panic!("SET on the master {}: {e}", self.port),
                },
            )
            .expect("a key of a slot this node serves");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let _: () = redis::pipe()
                .cmd("SET")
                .arg(&key)
                .arg(1)
                .ignore()
                .cmd("DEL")
                .arg(&key)
                .ignore()
                .query(&mut con)
                .expect("SET and DEL on the master");
            let acknowledged: usize = redis::cmd("WAIT")
                .arg(replicas)
                .arg(5_000)
                .query(&mut con)
                .expect("WAIT");
            if acknowledged >= replicas {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{acknowledged} of {replicas} replicas acknowledged a write of the master {} \
                 within 60 s; INFO replication:\n{}",
                self.port,
                redis::cmd("INFO")
                    .arg("replication")
                    .query::<String>(&mut con)
                    .unwrap_or_default()
            );
        }
    }

    /// The config file this server started from, if it did (`start_from_config`).
    pub fn config_path(&self) -> Option<&Path> {
        match &self.launch {
            Launch::Config(path) => Some(path),
            Launch::Args { .. } => None,
        }
    }

    fn args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        match &self.launch {
            Launch::Config(config) => args.push(config.into()),
            Launch::Args {
                module,
                module_args,
                extra,
            } => {
                args.extend(["--port".into(), self.port.to_string().into()]);
                args.push("--bind".into());
                args.extend(self.addresses.iter().map(|a| a.to_string().into()));
                args.extend(["--save", "", "--appendonly", "no"].map(OsString::from));
                args.extend(["--dir".into(), self.dir.path().into()]);
                args.extend(["--logfile".into(), self.dir.path().join("redis.log").into()]);
                if let Some(module) = module {
                    args.extend(["--loadmodule".into(), module.into()]);
                    args.extend(module_args.iter().map(OsString::from));
                }
                args.extend(extra.iter().map(OsString::from));
            }
        }
        args
    }

    /// Starts the server with this server's port, directory and arguments, and waits for it. A
    /// fresh server whose port was taken between `free_port` and its bind (another server got
    /// there first) moves to another free port and tries again.
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
        if let Launch::Config(config) = &self.launch {
            let text = std::fs::read_to_string(config).expect("read redis.conf");
            let text = text.replacen(&format!("port {old}\n"), &format!("port {port}\n"), 1);
            std::fs::write(config, text).expect("write redis.conf");
        }
    }

    fn spawn_once(&mut self) -> Result<(), Start> {
        let child = Command::new(server_bin())
            .args(self.args())
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
    /// answering on the port must be that child (another server could hold the port).
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
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(2))
    }

    pub fn connect(&self) -> Connection {
        self.try_connect().expect("connect")
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The n-th listening address, round robin: spreads many connections over the addresses.
    pub fn address(&self, n: usize) -> SocketAddr {
        SocketAddr::from((self.addresses[n % self.addresses.len()], self.port))
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

    /// Starts again on the same port and directory as a replica of the server on `port` (from
    /// its first moment: `--replicaof`), whatever it was started as; later restarts keep that.
    /// Panics for a server started from a config file.
    pub fn restart_as_replica_of(&mut self, port: u16) {
        let Launch::Args { extra, .. } = &mut self.launch else {
            panic!("a server started from a config file");
        };
        if let Some(at) = extra.iter().position(|a| a == "--replicaof") {
            extra.drain(at..(at + 3).min(extra.len()));
        }
        extra.extend(["--replicaof".into(), "127.0.0.1".into(), port.to_string()]);
        self.restart();
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

    /// Stops (`Signal::Stop`) or resumes (`Signal::Cont`) the server process.
    pub fn signal(&self, signal: Signal) {
        if let Some(pid) = self.pid() {
            send_signal(pid, signal);
        }
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valkey_is_told_by_its_server_name_and_version() {
        let info =
            "# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:8.1.8\r\n";
        assert_eq!(
            parse_server_info(info),
            ServerInfo {
                kind: ServerKind::Valkey,
                version: (8, 1, 8)
            }
        );
    }

    #[test]
    fn redis_reports_its_redis_version() {
        let info = "# Server\r\nredis_version:7.0.15\r\nprocess_id:1\r\n";
        assert_eq!(
            parse_server_info(info),
            ServerInfo {
                kind: ServerKind::Redis,
                version: (7, 0, 15)
            }
        );
    }
}
