//! A replicated set watched by Sentinel on loopback: one master and its replicas (each with the
//! module loaded, `$LOCK_SERVER`), and Sentinel processes (the same binary, `--sentinel`), each
//! on a free port, killed and reaped on drop. The failover tests kill or pause the master and
//! wait for the Sentinels to promote a replica.
//!
//! ```no_run
//! use lock_testkit::SentinelSet;
//!
//! let mut set = SentinelSet::start();            // 1 master, 2 replicas, 3 sentinels
//! let old = set.master_addr();
//! set.kill_master();                             // SIGKILL
//! let new = set.wait_failover(&old, std::time::Duration::from_secs(30));
//! assert_ne!(old, new);
//! ```

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis::Value;

use crate::server::{free_port, server_bin, server_name, Options, Server, Signal};

/// How a set is made.
#[derive(Debug, Clone)]
pub struct SentinelOptions {
    /// Replicas of the master (2 by default).
    pub replicas: usize,
    /// Sentinel processes (3 by default; the quorum is a majority of them).
    pub sentinels: usize,
    /// `sentinel down-after-milliseconds`: how long the master may be silent before it is
    /// taken for down (3000 ms by default: with 1000 ms, two busy cores made the Sentinels
    /// promote a second replica while the first still served, or disagree for long).
    pub down_after_ms: u64,
    /// `sentinel failover-timeout` (5000 ms by default).
    pub failover_timeout_ms: u64,
    /// Extra arguments of every data server (master and replicas), e.g. `--appendonly yes`.
    pub extra: Vec<String>,
}

impl Default for SentinelOptions {
    fn default() -> Self {
        SentinelOptions {
            replicas: 2,
            sentinels: 3,
            down_after_ms: 3_000,
            failover_timeout_ms: 5_000,
            extra: Vec::new(),
        }
    }
}

/// One Sentinel process.
pub struct SentinelProcess {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl SentinelProcess {
    fn start(
        master_name: &str,
        master_port: u16,
        quorum: usize,
        options: &SentinelOptions,
    ) -> Self {
        SentinelProcess::start_from_config(&format!(
            "sentinel monitor {master_name} 127.0.0.1 {master_port} {quorum}\n\
             sentinel down-after-milliseconds {master_name} {down}\n\
             sentinel failover-timeout {master_name} {failover}\n\
             sentinel parallel-syncs {master_name} 1\n",
            down = options.down_after_ms,
            failover = options.failover_timeout_ms,
        ))
    }

    /// A Sentinel whose `sentinel.conf` is its port, `bind 127.0.0.1`, `daemonize no`, its
    /// directory and log file, then `lines` (which name no port: the kit picks a free one).
    pub fn start_from_config(lines: &str) -> Self {
        for _ in 0..5 {
            let dir = tempfile::tempdir().expect("tempdir");
            let port = free_port();
            let config = dir.path().join("sentinel.conf");
            std::fs::write(
                &config,
                format!(
                    "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\nlogfile {log}\n{lines}",
                    dir = dir.path().display(),
                    log = dir.path().join("sentinel.log").display(),
                ),
            )
            .expect("write sentinel.conf");
            let child = Command::new(server_bin())
                .arg(&config)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn the sentinel ($LOCK_SERVER --sentinel)");
            let mut sentinel = SentinelProcess {
                port,
                dir,
                child: Some(child),
            };
            if sentinel.wait_ready() {
                return sentinel;
            }
            // The port was taken between free_port and the bind: another one.
            sentinel.kill();
        }
        panic!("no sentinel of {} came up", server_name());
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                return false;
            }
            if let Ok(mut c) = self.connect() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
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

    pub fn connect(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(2))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("sentinel.log")).unwrap_or_default()
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `SENTINEL GET-MASTER-ADDR-BY-NAME`: where this Sentinel says the master is.
    pub fn master_addr(&self, name: &str) -> Option<(String, u16)> {
        let reply: Value = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(name)
            .query(&mut self.connect().ok()?)
            .ok()?;
        let Value::Bulk(items) = reply else {
            return None;
        };
        let host: String = redis::from_redis_value(items.first()?).ok()?;
        let port: String = redis::from_redis_value(items.get(1)?).ok()?;
        Some((host, port.parse().ok()?))
    }

    /// A field of `SENTINEL MASTER name` (`num-slaves`, `num-other-sentinels`, `flags`, ...).
    pub fn master_field(&self, name: &str, field: &str) -> Option<String> {
        let reply: Vec<String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(name)
            .query(&mut self.connect().ok()?)
            .ok()?;
        reply
            .chunks(2)
            .find(|pair| pair.first().map(String::as_str) == Some(field))
            .and_then(|pair| pair.get(1).cloned())
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A master, its replicas and the Sentinels that watch them.
pub struct SentinelSet {
    /// Every data server, the first being the master the set started with. Which one is the
    /// master now: [`SentinelSet::master_addr`], [`SentinelSet::master`].
    pub servers: Vec<Server>,
    pub sentinels: Vec<SentinelProcess>,
    name: String,
    /// The server paused by [`SentinelSet::pause_master`], until [`SentinelSet::resume`].
    paused: Option<u16>,
}

impl SentinelSet {
    /// 1 master, 2 replicas, 3 Sentinels (quorum 2), the master taken for down after 3 s.
    pub fn start() -> SentinelSet {
        SentinelSet::start_with(&SentinelOptions::default())
    }

    pub fn start_with(options: &SentinelOptions) -> SentinelSet {
        let data = Options {
            extra: options.extra.clone(),
            ..Options::default()
        };
        let master = Server::start_options(&data);
        let mut servers = vec![master];
        for _ in 0..options.replicas {
            servers.push(Server::replica_of_with(&servers[0], &options.extra));
        }
        let name = "lockmaster".to_string();
        let quorum = options.sentinels / 2 + 1;
        let sentinels: Vec<SentinelProcess> = (0..options.sentinels)
            .map(|_| SentinelProcess::start(&name, servers[0].port, quorum, options))
            .collect();
        SentinelSet::from_parts(servers, sentinels, &name)
    }

    /// A set of servers and Sentinels started elsewhere (from a documented configuration: see
    /// `clients/rust/tests/sentinel_guide.rs`), the first server the master, the Sentinels
    /// monitoring it as `name`; returned once every Sentinel knows every replica and every other
    /// Sentinel (30 s at most).
    pub fn from_parts(
        servers: Vec<Server>,
        sentinels: Vec<SentinelProcess>,
        name: &str,
    ) -> SentinelSet {
        let set = SentinelSet {
            name: name.to_string(),
            paused: None,
            servers,
            sentinels,
        };
        // Every Sentinel knows every replica and every other Sentinel before a test begins.
        let (replicas, others) = (
            (set.servers.len() - 1).to_string(),
            (set.sentinels.len() - 1).to_string(),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while !set.sentinels.iter().all(|s| {
            s.master_field(&set.name, "num-slaves").as_deref() == Some(replicas.as_str())
                && s.master_field(&set.name, "num-other-sentinels").as_deref()
                    == Some(others.as_str())
        }) {
            assert!(
                Instant::now() < deadline,
                "the sentinels did not discover the set; a sentinel's log:\n{}",
                set.sentinels[0].log()
            );
            sleep(Duration::from_millis(100));
        }
        set
    }

    /// The name the Sentinels monitor the master under.
    pub fn master_name(&self) -> &str {
        &self.name
    }

    /// The Sentinels' URLs (`redis://127.0.0.1:<port>/`).
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(SentinelProcess::url).collect()
    }

    /// The Sentinels' addresses.
    pub fn sentinel_addrs(&self) -> Vec<(String, u16)> {
        self.sentinels
            .iter()
            .map(|s| ("127.0.0.1".to_string(), s.port))
            .collect()
    }

    /// Where the Sentinels say the master is (the first one that answers).
    pub fn master_addr(&self) -> (String, u16) {
        self.sentinels
            .iter()
            .find_map(|s| s.master_addr(&self.name))
            .expect("a sentinel answers")
    }

    /// The data server the Sentinels name as master.
    pub fn master(&self) -> &Server {
        let (_, port) = self.master_addr();
        self.server(port)
    }

    /// The data server on `port`.
    pub fn server(&self, port: u16) -> &Server {
        self.servers
            .iter()
            .find(|s| s.port == port)
            .expect("a server of this set")
    }

    fn server_mut(&mut self, port: u16) -> &mut Server {
        self.servers
            .iter_mut()
            .find(|s| s.port == port)
            .expect("a server of this set")
    }

    /// SIGKILLs the master the Sentinels name; returns its address.
    pub fn kill_master(&mut self) -> (String, u16) {
        let addr = self.master_addr();
        self.server_mut(addr.1).kill_hard();
        addr
    }

    /// SIGSTOPs the master the Sentinels name (a "zombie": its connections stay open);
    /// [`SentinelSet::resume`] continues it. Returns its address.
    pub fn pause_master(&mut self) -> (String, u16) {
        let addr = self.master_addr();
        self.server(addr.1).signal(Signal::Stop);
        self.paused = Some(addr.1);
        addr
    }

    /// SIGCONTs the server [`SentinelSet::pause_master`] paused (the Sentinels then make it a
    /// replica of the new master, closing its clients' connections).
    pub fn resume(&mut self) {
        if let Some(port) = self.paused.take() {
            self.server(port).signal(Signal::Cont);
        }
    }

    /// Starts a killed server again on its port and directory: it comes back as it was
    /// started (the first master, or a replica of it), and the Sentinels make it a replica of
    /// the master they name.
    pub fn restart(&mut self, port: u16) {
        self.server_mut(port).restart();
    }

    /// Starts a killed server again on its port and directory as a replica of the master the
    /// Sentinels name: what a deployment does whose restarted servers come back with the
    /// configuration the Sentinels gave them. ([`SentinelSet::restart`] of the first master
    /// brings it back as an empty master, which the Sentinels demote only after a while.)
    pub fn restart_as_replica(&mut self, port: u16) {
        let (_, master) = self.master_addr();
        self.server_mut(port).restart_as_replica_of(master);
    }

    /// Waits until every Sentinel names a master other than `old` and that server says it is a
    /// master (`ROLE`); returns its address. Panics after `timeout`.
    pub fn wait_failover(&self, old: &(String, u16), timeout: Duration) -> (String, u16) {
        let deadline = Instant::now() + timeout;
        loop {
            let named: Vec<Option<(String, u16)>> = self
                .sentinels
                .iter()
                .map(|s| s.master_addr(&self.name))
                .collect();
            if let Some(Some(new)) = named.first() {
                if new != old
                    && named.iter().all(|n| n.as_ref() == Some(new))
                    && self.role(new.1).as_deref() == Some("master")
                {
                    return new.clone();
                }
            }
            assert!(
                Instant::now() < deadline,
                "no failover within {timeout:?} (sentinels name {named:?}); a sentinel's log:\n{}",
                self.sentinels[0].log()
            );
            sleep(Duration::from_millis(50));
        }
    }

    /// The first word of `ROLE` on the server at `port` (`master`, `slave`), if it answers.
    pub fn role(&self, port: u16) -> Option<String> {
        let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .ok()?
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        let _ = con.set_read_timeout(Some(Duration::from_millis(500)));
        let reply: Value = redis::cmd("ROLE").query(&mut con).ok()?;
        match reply {
            Value::Bulk(items) => redis::from_redis_value(items.first()?).ok(),
            _ => None,
        }
    }

    /// The directories of the Sentinels' logs, for a failing test's message.
    pub fn sentinel_logs(&self) -> Vec<PathBuf> {
        self.sentinels
            .iter()
            .map(|s| s.dir.path().join("sentinel.log"))
            .collect()
    }
}

impl Drop for SentinelSet {
    fn drop(&mut self) {
        // A paused server cannot be killed cleanly until it runs again.
        self.resume();
        for sentinel in &mut self.sentinels {
            sentinel.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_role(set: &SentinelSet, port: u16, role: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while set.role(port).as_deref() != Some(role) {
            assert!(Instant::now() < deadline, "{port} never became {role}");
            sleep(Duration::from_millis(50));
        }
    }

    #[test]
    fn a_killed_master_is_replaced_and_a_paused_one_comes_back_as_a_replica() {
        let mut set = SentinelSet::start();
        let first = set.master_addr();
        assert_eq!(first.1, set.servers[0].port);
        let _: () = redis::cmd("SET")
            .arg("k")
            .arg("v")
            .query(&mut set.master().connect())
            .unwrap();
        let _: i64 = redis::cmd("WAIT")
            .arg(2)
            .arg(5_000)
            .query(&mut set.master().connect())
            .unwrap();

        let killed = set.kill_master();
        let second = set.wait_failover(&killed, Duration::from_secs(30));
        let value: String = redis::cmd("GET")
            .arg("k")
            .query(&mut set.server(second.1).connect())
            .unwrap();
        assert_eq!(value, "v");
        set.restart(killed.1);
        wait_role(&set, killed.1, "slave");

        // Usually `second`; on a loaded machine the Sentinels may have moved on again since
        // (a loaded machine can delay a Sentinel past down-after): whichever they name is paused.
        let paused = set.pause_master();
        set.wait_failover(&paused, Duration::from_secs(30));
        set.resume();
        wait_role(&set, paused.1, "slave");
    }
}
