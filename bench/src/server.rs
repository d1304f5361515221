//! One server per scenario (the test kit's `Server`: a free loopback port, killed and reaped
//! when dropped), with the module loaded. Every approach in a scenario runs against the same
//! server, so they share one build, one configuration and one warm-up.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use lock_testkit::{Options, Server};

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

/// A server for a scenario: the kit's `Server` (`$LOCK_SERVER`, default `redis-server`) with
/// the module under test loaded.
pub fn start(module: &Path, options: &ServerOptions) -> Server {
    let mut extra = Vec::new();
    if let Some(maxclients) = options.maxclients {
        // Connect bursts of up to a few thousand: a longer accept queue than the default 511.
        extra.extend([
            "--maxclients".to_string(),
            maxclients.to_string(),
            "--tcp-backlog".to_string(),
            "4096".to_string(),
        ]);
    }
    extra.extend(options.extra.iter().cloned());
    Server::start_options(&Options {
        module: Some(module.to_path_buf()),
        module_args: options.module_args.clone(),
        extra,
        loopback_addresses: options.loopback_addresses,
        without_module: false,
    })
}

/// The command line every scenario uses, for the report (port and directory vary).
pub fn command_line(module: &Path) -> String {
    format!(
        "{} --port <free port> --bind 127.0.0.1 --save \"\" --appendonly no --dir <tmpdir> \
         --logfile <tmpdir>/redis.log --loadmodule {}",
        lock_testkit::server_name(),
        module.display()
    )
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
    pub fn new(server: &Server) -> Probe {
        Probe {
            con: server.connect(),
        }
    }

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
