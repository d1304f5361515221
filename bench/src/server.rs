//! One `redis-server` per scenario, with the module loaded, on a free loopback port, killed and
//! reaped when dropped. Every approach in a scenario runs against the same server, so they share
//! one build, one configuration and one warm-up.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// How a scenario wants its server.
#[derive(Default, Clone)]
pub struct ServerOptions {
    /// Listen on 127.0.0.1 .. 127.0.0.<n> instead of 127.0.0.1 only. Linux picks ephemeral ports
    /// per destination, so each address gives another ~28,000 connections from one client.
    pub loopback_addresses: u8,
    pub maxclients: Option<usize>,
    /// Arguments after the module path on `--loadmodule`.
    pub module_args: Vec<String>,
    /// Any other `redis-server` arguments.
    pub extra: Vec<String>,
}

pub struct RedisServer {
    pub port: u16,
    pub addresses: Vec<Ipv4Addr>,
    child: Child,
    dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start(module: &Path, options: &ServerOptions) -> RedisServer {
        let addresses: Vec<Ipv4Addr> = (1..=options.loopback_addresses.max(1))
            .map(|last| Ipv4Addr::new(127, 0, 0, last))
            .collect();
        // A port found free can be taken before redis-server binds it: try a few.
        let mut last_log = String::new();
        for _ in 0..5 {
            let port = free_port();
            let dir = tempfile::tempdir().expect("temporary directory");
            let mut command = Command::new("redis-server");
            command.args(server_args(module, port, &addresses, dir.path(), options));
            let child = command
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server (install it: make deps)");
            let mut server = RedisServer {
                port,
                addresses: addresses.clone(),
                child,
                dir,
            };
            if server.wait_ready() {
                return server;
            }
            last_log = std::fs::read_to_string(server.log_path()).unwrap_or_default();
        }
        panic!("redis-server did not start; its log:\n{last_log}");
    }

    /// The command line every scenario uses, for the report (port and directory vary).
    pub fn command_line(module: &Path) -> String {
        format!(
            "redis-server --port <free port> --bind 127.0.0.1 --save \"\" --appendonly no \
             --dir <tmpdir> --loadmodule {}",
            module.display()
        )
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(mut con) = self.try_connect() {
                if redis::cmd("PING").query::<String>(&mut con).is_ok() {
                    return true;
                }
            }
            sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The n-th listening address, round robin: spreads many connections over the addresses.
    pub fn address(&self, n: usize) -> SocketAddr {
        SocketAddr::from((self.addresses[n % self.addresses.len()], self.port))
    }

    fn try_connect(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(5))
    }

    pub fn connect(&self) -> redis::Connection {
        self.try_connect().expect("connect to redis-server")
    }

    pub fn probe(&self) -> Probe {
        Probe {
            con: self.connect(),
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn server_args(
    module: &Path,
    port: u16,
    addresses: &[Ipv4Addr],
    dir: &Path,
    options: &ServerOptions,
) -> Vec<String> {
    let mut args = vec!["--port".to_string(), port.to_string(), "--bind".to_string()];
    args.extend(addresses.iter().map(Ipv4Addr::to_string));
    args.extend(
        ["--save", "", "--appendonly", "no", "--dir"]
            .iter()
            .map(|s| s.to_string()),
    );
    args.push(dir.display().to_string());
    args.push("--logfile".to_string());
    args.push(dir.join("redis.log").display().to_string());
    if let Some(maxclients) = options.maxclients {
        // Connect bursts of up to a few thousand: a longer accept queue than the default 511.
        args.extend([
            "--maxclients".to_string(),
            maxclients.to_string(),
            "--tcp-backlog".to_string(),
            "4096".to_string(),
        ]);
    }
    args.push("--loadmodule".to_string());
    args.push(module.display().to_string());
    args.extend(options.module_args.iter().cloned());
    args.extend(options.extra.iter().cloned());
    args
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free loopback port")
}

/// Commands the bench itself sends to watch the server; they are not part of any workload.
const CONTROL_COMMANDS: &[&str] = &[
    "info",
    "config",
    "ping",
    "script",
    "lock.info",
    "client",
    "flushall",
    "dbsize",
    "module",
];

/// A control connection that reads the server's counters.
pub struct Probe {
    con: redis::Connection,
}

impl Probe {
    pub fn info(&mut self, section: &str) -> HashMap<String, String> {
        let text: String = redis::cmd("INFO")
            .arg(section)
            .query(&mut self.con)
            .expect("INFO");
        text.lines()
            .filter_map(|line| line.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect()
    }

    /// CPU seconds of Redis's main thread (user + system): where every command runs.
    pub fn main_thread_cpu(&mut self) -> f64 {
        let info = self.info("cpu");
        let field = |name: &str| -> f64 {
            info.get(name)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("INFO cpu has no {name}"))
        };
        field("used_cpu_user_main_thread") + field("used_cpu_sys_main_thread")
    }

    pub fn used_memory(&mut self) -> i64 {
        self.info("memory")["used_memory"]
            .parse()
            .expect("used_memory")
    }

    /// `CONFIG RESETSTAT`: command statistics start from zero.
    pub fn reset_stats(&mut self) {
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query::<()>(&mut self.con)
            .expect("CONFIG RESETSTAT");
    }

    /// Calls per command since the last reset, the bench's own control commands left out. Calls
    /// made by Lua scripts (`hincrby`, `pexpire`, `publish`, ...) count as their own commands.
    pub fn commands_executed(&mut self) -> HashMap<String, u64> {
        self.info("commandstats")
            .into_iter()
            .filter_map(|(name, stats)| {
                let command = name.strip_prefix("cmdstat_")?.to_string();
                let calls = stats
                    .split(',')
                    .find_map(|field| field.strip_prefix("calls="))?
                    .parse()
                    .ok()?;
                // Subcommands are reported as `config|resetstat`: judge them by their command.
                let base = command.split('|').next().unwrap_or_default();
                (!CONTROL_COMMANDS.contains(&base)).then_some((command, calls))
            })
            .collect()
    }

    /// A counter of `INFO lock`, e.g. `handoffs` for `lock_handoffs`.
    pub fn lock_counter(&mut self, name: &str) -> u64 {
        self.info("lock")
            .get(&format!("lock_{name}"))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("INFO lock has no lock_{name}"))
    }

    pub fn flushall(&mut self) {
        redis::cmd("FLUSHALL")
            .query::<()>(&mut self.con)
            .expect("FLUSHALL");
    }

    pub fn dbsize(&mut self) -> u64 {
        redis::cmd("DBSIZE").query(&mut self.con).expect("DBSIZE")
    }

    pub fn config_set(&mut self, name: &str, value: &str) {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query::<()>(&mut self.con)
            .expect("CONFIG SET");
    }

    /// Median PING round trip in microseconds over `count` pings.
    pub fn ping_rtt_us(&mut self, count: usize) -> f64 {
        let samples: Vec<f64> = (0..count)
            .map(|_| {
                let start = Instant::now();
                redis::cmd("PING")
                    .query::<String>(&mut self.con)
                    .expect("PING");
                start.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        crate::stats::percentile(&samples, 50.0)
    }

    /// The waiter count `LOCK.INFO` reports for a key (0 when the lock is free).
    pub fn waiters_on(&mut self, key: &str) -> u64 {
        let reply: redis::Value = redis::cmd("LOCK.INFO")
            .arg(key)
            .query(&mut self.con)
            .expect("LOCK.INFO");
        let redis::Value::Bulk(fields) = reply else {
            return 0;
        };
        fields
            .chunks(2)
            .find_map(|pair| match pair {
                [redis::Value::Data(name), redis::Value::Int(n)] if name == b"waiters" => {
                    Some(*n as u64)
                }
                _ => None,
            })
            .unwrap_or(0)
    }
}
