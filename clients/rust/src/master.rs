//! The one server a standalone client talks to: a fixed address, or the master that Sentinel
//! names, found again after a failover.
//!
//! A failover is a change of the master's address, and it has a number (the *generation*):
//! every command sent before the change and answered after it is taken for unanswered, so that
//! a paused old master that comes back (a "zombie", still a master until the Sentinels turn it
//! into a replica) is never believed: its grants, renewals and fenced writes are void once a
//! replica was promoted. The client learns of a change from the Sentinels' `+switch-master`
//! message, from a poll of the Sentinels every second (pub/sub is at-most-once), and from a
//! lookup after a failure that names another address.
//!
//! Through Sentinel the library asks the Sentinels for the master (the `redis` crate's
//! `Sentinel`, which also checks with `ROLE` that the server it names says it is a master) when
//! it first needs it and whenever the one it knew fails: a connection to it that cannot be
//! made or breaks, or a reply that says it is a replica now (`READONLY`, or the module's refusal
//! to let a replica wait). Every connection the client opens afterwards (the shared one, a
//! waiting acquire's, an `EPHEMERAL` hold's, the lost-hold listener's, an observer's) goes to
//! the new master. A lookup that cannot finish within the command timeout (a paused master
//! still named by the Sentinels accepts connections but never answers `ROLE`) fails, and the
//! next one asks again.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};
use tokio::sync::watch;

use crate::basics::relock;
use crate::error::LockError;
use crate::node::Node;

/// Where a standalone client's server is.
// One per client, made once and never moved: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Master {
    /// One address, for the client's whole life.
    Fixed(Node),
    /// The master the Sentinels name now.
    Sentinel(Arc<SentinelMaster>),
}

impl Master {
    /// The server to talk to now.
    pub(crate) async fn node(&self) -> Result<Node, LockError> {
        match self {
            Master::Fixed(node) => Ok(node.clone()),
            Master::Sentinel(sentinel) => sentinel.node().await,
        }
    }

    /// `node` failed (unreachable, broken, or a replica now): the next [`Master::node`] asks the
    /// Sentinels again. Nothing for a fixed address.
    pub(crate) fn forget(&self, node: &Node) {
        if let Master::Sentinel(sentinel) = self {
            sentinel.forget(node);
        }
    }

    /// Whether the server can change under the client (a failover).
    pub(crate) fn follows_failover(&self) -> bool {
        matches!(self, Master::Sentinel(_))
    }

    /// How many times the master changed (0 for a fixed address).
    pub(crate) fn generation(&self) -> u64 {
        match self {
            Master::Fixed(_) => 0,
            Master::Sentinel(sentinel) => *sentinel.generation.borrow(),
        }
    }

    /// Tells of each change of the master (`None` for a fixed address: it never changes).
    pub(crate) fn changes(&self) -> Option<watch::Receiver<u64>> {
        match self {
            Master::Fixed(_) => None,
            Master::Sentinel(sentinel) => Some(sentinel.generation.subscribe()),
        }
    }
}

/// Resolves when the master changes (never for a fixed address).
pub(crate) async fn changed(changes: Option<watch::Receiver<u64>>) {
    match changes {
        Some(mut rx) => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending::<()>().await,
    }
}

/// The master of one Sentinel-monitored set.
pub(crate) struct SentinelMaster {
    sentinel: tokio::sync::Mutex<Sentinel>,
    /// The Sentinels, for the watcher's own connections.
    sentinels: Vec<ConnectionInfo>,
    name: String,
    /// The master's connection settings: database, user, password, protocol.
    settings: RedisConnectionInfo,
    timeout: Duration,
    /// The master to use, until a failure drops it.
    current: Mutex<Option<Node>>,
    /// The last master's address the client knew: another one is a failover.
    known: Mutex<Option<ConnectionAddr>>,
    generation: watch::Sender<u64>,
}

impl SentinelMaster {
    pub(crate) fn new(
        sentinels: Vec<ConnectionInfo>,
        name: String,
        settings: RedisConnectionInfo,
        timeout: Duration,
    ) -> Result<SentinelMaster, LockError> {
        if sentinels.is_empty() {
            return Err(LockError::InvalidArgument(
                "Sentinel needs a sentinel address",
            ));
        }
        Ok(SentinelMaster {
            sentinel: tokio::sync::Mutex::new(
                Sentinel::build(sentinels.clone()).map_err(LockError::Connection)?,
            ),
            sentinels,
            name,
            settings,
            timeout,
            current: Mutex::new(None),
            known: Mutex::new(None),
            generation: watch::Sender::new(0),
        })
    }

    /// `node` is the master now: a failover if the client knew another.
    fn adopt(&self, node: &Node) {
        let addr = node.client.get_connection_info().addr().clone();
        let mut known = relock(&self.known);
        if known.as_ref().is_some_and(|k| *k != addr) {
            self.generation.send_modify(|g| *g += 1);
        }
        *known = Some(addr);
    }

    /// Where the Sentinels say the master is (`SENTINEL GET-MASTER-ADDR-BY-NAME`), asked of
    /// each in turn until one answers, on connections kept in `conns` (one per Sentinel).
    async fn ask(
        &self,
        conns: &mut Vec<Option<redis::aio::MultiplexedConnection>>,
    ) -> Option<(String, u16)> {
        conns.resize(self.sentinels.len(), None);
        for (info, slot) in self.sentinels.iter().zip(conns.iter_mut()) {
            let asked = async {
                if slot.is_none() {
                    *slot = Some(
                        redis::Client::open(info.clone())
                            .ok()?
                            .get_multiplexed_async_connection()
                            .await
                            .ok()?,
                    );
                }
                let conn = slot.as_mut()?;
                let reply: redis::RedisResult<Option<(String, String)>> = redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&self.name)
                    .query_async(conn)
                    .await;
                let (host, port) = match reply {
                    Ok(reply) => reply?,
                    Err(_) => {
                        *slot = None;
                        return None;
                    }
                };
                Some((host, port.parse().ok()?))
            };
            match tokio::time::timeout(self.timeout, asked).await {
                Ok(Some(found)) => return Some(found),
                Ok(None) => {}
                Err(_) => *slot = None,
            }
        }
        None
    }

    /// The Sentinels name `host:port` as the master: if it is not the one the client uses,
    /// switch to it (a failover).
    fn named(&self, host: String, port: u16) {
        let known = relock(&self.known).clone();
        let same = matches!(&known, Some(ConnectionAddr::Tcp(h, p)) if *h == host && *p == port);
        if same {
            return;
        }
        let Ok(info) = ConnectionAddr::Tcp(host, port).into_connection_info() else {
            return;
        };
        if let Ok(node) = Node::from_info(info.set_redis_settings(self.settings.clone())) {
            *relock(&self.current) = Some(node.clone());
            self.adopt(&node);
        }
    }

    async fn node(&self) -> Result<Node, LockError> {
        if let Some(node) = relock(&self.current).clone() {
            return Ok(node);
        }
        let mut sentinel = self.sentinel.lock().await;
        // Another task may have asked meanwhile.
        if let Some(node) = relock(&self.current).clone() {
            return Ok(node);
        }
        let info =
            SentinelNodeConnectionInfo::default().set_redis_connection_info(self.settings.clone());
        let lookup = sentinel.async_master_for(&self.name, Some(&info));
        let client = match tokio::time::timeout(self.timeout, lookup).await {
            Ok(client) => client.map_err(LockError::Connection)?,
            Err(_) => return Err(no_master(&self.name)),
        };
        let node = Node::from_info(client.get_connection_info().clone())?;
        *relock(&self.current) = Some(node.clone());
        self.adopt(&node);
        Ok(node)
    }

    fn forget(&self, node: &Node) {
        let mut current = relock(&self.current);
        if current.as_ref().is_some_and(|c| c.same_address(node)) {
            *current = None;
        }
    }
}

/// Follows the Sentinels' view of the master while the client lives: their `+switch-master`
/// messages (on one Sentinel at a time) and, as the backstop of an at-most-once message, a poll
/// every second.
pub(crate) async fn watch_sentinels(master: Weak<SentinelMaster>) {
    let Some(first) = master.upgrade() else {
        return;
    };
    let (sentinels, name) = (first.sentinels.clone(), first.name.clone());
    drop(first);
    let mut next = 0usize;
    let mut polls = Vec::new();
    loop {
        // A subscription to one Sentinel's +switch-master, while it lasts.
        let (tx, mut pushes) = tokio::sync::mpsc::unbounded_channel();
        let subscribed = async {
            let info = sentinels.get(next % sentinels.len().max(1))?.clone();
            let mut settings = info.redis_settings().clone();
            settings = settings.set_protocol(redis::ProtocolVersion::RESP3);
            let client = redis::Client::open(info.set_redis_settings(settings)).ok()?;
            let config = redis::AsyncConnectionConfig::new().set_push_sender(tx);
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .ok()?;
            conn.subscribe("+switch-master").await.ok()?;
            Some(conn)
        };
        let conn = subscribed.await;
        next += 1;
        let mut poll = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                push = pushes.recv(), if conn.is_some() => match push {
                    Some(push) if push.kind == redis::PushKind::Message => {
                        // `<name> <old ip> <old port> <new ip> <new port>`
                        let text = match push.data.get(1) {
                            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                            _ => continue,
                        };
                        let f: Vec<&str> = text.split(' ').collect();
                        if let [n, _, _, host, port] = f.as_slice() {
                            if *n == name {
                                let Some(master) = master.upgrade() else { return };
                                if let Ok(port) = port.parse() {
                                    master.named(host.to_string(), port);
                                }
                            }
                        }
                    }
                    Some(push) if push.kind == redis::PushKind::Disconnection => break,
                    Some(_) => {}
                    None => break,
                },
                _ = poll.tick() => {
                    let Some(master) = master.upgrade() else { return };
                    if let Some((host, port)) = master.ask(&mut polls).await {
                        master.named(host, port);
                    }
                    if conn.is_none() {
                        // No subscription: try the next Sentinel.
                        break;
                    }
                }
            }
        }
        drop(conn);
    }
}

fn no_master(name: &str) -> LockError {
    LockError::Connection(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("the Sentinels named no reachable master for {name} in time"),
    )))
}

/// Whether a server error says the server is not (or no longer) the master: it answers as a
/// replica (`READONLY`, the module's refusal of a wait on a replica), or a command blocked on
/// it was released because it became one (`UNBLOCKED`).
pub(crate) fn says_not_master(e: &LockError) -> bool {
    match e {
        LockError::Server(text) => {
            text.starts_with("READONLY")
                || text.starts_with("UNBLOCKED")
                || text.starts_with("MASTERDOWN")
                || text.starts_with("ERR a replica does not serve")
        }
        _ => false,
    }
}
