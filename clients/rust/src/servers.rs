//! Where commands go: one server (a fixed address, or the master Sentinel names), or the masters
//! of a Redis Cluster.
//!
//! Ordinary commands (acquire without waiting, renew, release, `LOCK.INFO`) go through one shared
//! connection: a multiplexed connection to the one server, or the `redis` crate's cluster
//! connection, which routes each command by its key and follows `MOVED` and `ASK`. A waiting
//! acquire and an `EPHEMERAL` hold need a connection of their own to the node that serves the
//! key (a blocked command would hold up everything behind it on a shared connection, and an
//! `EPHEMERAL` hold lives exactly as long as its connection): [`Servers::node_of`] finds that
//! node in the client's copy of the slot map (`CLUSTER SLOTS`, read when first needed), and
//! [`Redirects::follow`] (the one place a redirect is followed, and counted) turns a redirect
//! into the next node. A `MOVED` (or a node that cannot be
//! reached) means the copy is stale: [`Servers::forget`] drops it, and the next lookup reads it
//! again. Through Sentinel the one server is the master the Sentinels name (`master.rs`),
//! forgotten the same way when it fails.

use std::sync::{Arc, Mutex};

use redis::cluster_async::ClusterConnection;
use redis::{ConnectionAddr, ConnectionInfo, ProtocolVersion, Value};

use crate::basics::relock;
use crate::error::LockError;
use crate::master::Master;
use crate::node::{seed_host, Node};

/// The servers a client talks to.
pub(crate) enum Servers {
    /// One server (standalone, or a master without cluster mode): a fixed address, or the
    /// master the Sentinels name.
    Single(Arc<Master>),
    /// A Redis Cluster: `info` is a seed node's settings (credentials, database, TLS), which
    /// every node connection reuses with the node's address.
    Cluster {
        info: ConnectionInfo,
        conn: ClusterConnection,
        /// The last `CLUSTER SLOTS` reply, until a redirect says it is stale (shared with the
        /// ticket desk, whose pops see redirects too).
        slots: SlotMap,
    },
}

/// The client's copy of a cluster's slot map: the last `CLUSTER SLOTS` reply, none until first
/// needed or after a redirect said it is stale.
pub(crate) type SlotMap = Arc<Mutex<Option<Arc<Value>>>>;

/// Where a node was found: a lookup in the client's slot map may be stale, a redirect is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// The one fixed server, or the node a redirect named.
    Sure,
    /// The client's copy of the slot map, or the master the Sentinels named: a `MOVED`, a node
    /// that cannot be reached, or one that says it is a replica, means the copy is stale.
    Cached,
}

impl Servers {
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Servers::Cluster { .. })
    }

    /// Whether the one server can change under the client (Sentinel: a failover).
    pub(crate) fn follows_failover(&self) -> bool {
        matches!(self, Servers::Single(master) if master.follows_failover())
    }

    /// How many times the one server changed (a failover); 0 where it never changes.
    pub(crate) fn generation(&self) -> u64 {
        match self {
            Servers::Single(master) => master.generation(),
            Servers::Cluster { .. } => 0,
        }
    }

    /// Tells of each failover (`None` where the server never changes).
    pub(crate) fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        match self {
            Servers::Single(master) => master.changes(),
            Servers::Cluster { .. } => None,
        }
    }

    /// The node that serves `key` (the one server, or the master of the key's slot in the
    /// client's copy of the slot map, read with `CLUSTER SLOTS` when there is none).
    pub(crate) async fn node_of(&self, key: &[u8]) -> Result<(Node, Found), LockError> {
        match self {
            Servers::Single(master) => {
                let found = if master.follows_failover() {
                    Found::Cached
                } else {
                    Found::Sure
                };
                Ok((master.node().await?, found))
            }
            Servers::Cluster { info, conn, slots } => {
                let cached = relock(slots).clone();
                let map = match cached {
                    Some(map) => map,
                    None => {
                        let reply: Value = redis::cmd("CLUSTER")
                            .arg("SLOTS")
                            .query_async(&mut conn.clone())
                            .await?;
                        let map = Arc::new(reply);
                        *relock(slots) = Some(map.clone());
                        map
                    }
                };
                let (host, port) = master_of(&map, key_slot(key)).ok_or_else(|| {
                    LockError::UnexpectedReply(format!(
                        "CLUSTER SLOTS names no master for slot {}",
                        key_slot(key)
                    ))
                })?;
                let host = if host.is_empty() || host == "?" {
                    // The node does not know its own address: it is the seed's host.
                    seed_host(info).unwrap_or(host)
                } else {
                    host
                };
                Ok((node_with(info, host, port)?, Found::Cached))
            }
        }
    }

    /// Drops what the client knew of where keys are: a node it named (`node`) answered
    /// `MOVED`, could not be reached, or said it is a replica. The next [`Servers::node_of`]
    /// reads the slot map, or asks the Sentinels, again.
    pub(crate) fn forget(&self, node: &Node) {
        match self {
            Servers::Cluster { slots, .. } => *relock(slots) = None,
            Servers::Single(master) => master.forget(node),
        }
    }

    /// The node a `MOVED` or `ASK` redirect names (`host:port`; a redirect with no host means
    /// the host of `from`, the node that sent it).
    pub(crate) fn node_at(&self, address: &str, from: &Node) -> Result<Node, LockError> {
        let Servers::Cluster { info, .. } = self else {
            return Err(LockError::UnexpectedReply(format!(
                "a redirect to {address} from a server that is not in cluster mode"
            )));
        };
        node_at(info, address, from)
    }
}

/// How many `MOVED`/`ASK` redirects in a row one command follows before its answer stands.
pub(crate) const REDIRECTS: u32 = 3;

/// Where a cluster node said a key went with its slot: `MOVED` (the slot moved: the client's
/// copy of the slot map is stale) or `ASK` (the slot is moving: this one command goes there,
/// after `ASKING`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Redirect {
    /// `host:port` (no host: the host of the node that answered).
    pub(crate) address: String,
    /// An `ASK`: send `ASKING` first.
    pub(crate) asking: bool,
}

impl Redirect {
    /// `ASK <slot> <host:port>` or `MOVED <slot> <host:port>`: an error's text, or a ticket's
    /// popped answer after its `-`.
    pub(crate) fn parse(error: &str) -> Option<Redirect> {
        let mut words = error.split(' ');
        let asking = match words.next()? {
            "ASK" => true,
            "MOVED" => false,
            _ => return None,
        };
        let _slot: u16 = words.next()?.parse().ok()?;
        let address = words.next()?.to_string();
        (words.next().is_none() && !address.is_empty()).then_some(Redirect { address, asking })
    }

    /// A `MOVED`: the slot moved for good (not an `ASK`: still moving), so the node that
    /// answered no longer serves it.
    pub(crate) fn moved(&self) -> bool {
        !self.asking
    }

    /// The redirect a server's error answer is, if it is one.
    pub(crate) fn of(error: &redis::RedisError) -> Option<Redirect> {
        let (address, _slot) = error.redirect_node()?;
        Some(Redirect {
            address: address.to_string(),
            asking: error.code() == Some("ASK"),
        })
    }

    /// The redirect a reply turned into a library error is, if it is one.
    pub(crate) fn in_reply(reply: &Result<Value, LockError>) -> Option<Redirect> {
        match reply {
            Err(LockError::Server(text)) => Redirect::parse(text),
            _ => None,
        }
    }
}

/// Where the next command about a key goes: a node, and whether `ASKING` goes first (the
/// redirect that named it was an `ASK`: the slot is being imported there).
#[derive(Clone)]
pub(crate) struct Hop {
    pub(crate) node: Node,
    pub(crate) asking: bool,
}

/// What a redirect is resolved against: the client's servers, or a cluster's seed settings and
/// slot map (the ticket desk's pops, which go where the last redirect said). Either way a
/// `MOVED` drops the slot map.
#[derive(Clone, Copy)]
pub(crate) enum Map<'a> {
    Servers(&'a Servers),
    Cluster {
        info: &'a ConnectionInfo,
        slots: &'a SlotMap,
    },
}

impl Map<'_> {
    fn node_at(self, address: &str, from: &Node) -> Result<Node, LockError> {
        match self {
            Map::Servers(servers) => servers.node_at(address, from),
            Map::Cluster { info, .. } => node_at(info, address, from),
        }
    }

    fn forget(self, node: &Node) {
        match self {
            Map::Servers(servers) => servers.forget(node),
            Map::Cluster { slots, .. } => *relock(slots) = None,
        }
    }
}

/// The one place a `MOVED` or an `ASK` is followed, for every command the library sends on a
/// connection of its own (a waiting acquire's, an `EPHEMERAL` hold's, the ticket desk's asks
/// and pops, an acquire asked again where its ticket's answer sent it; the shared cluster
/// connection follows redirects itself): a redirect becomes the next [`Hop`], and the
/// redirects followed in a row are counted against one bound, [`REDIRECTS`].
#[derive(Debug, Default)]
pub(crate) struct Redirects {
    in_a_row: u32,
}

impl Redirects {
    /// Whether [`REDIRECTS`] redirects were followed in a row: the next one is not followed
    /// (a command's answer stands), or followed after a pause (the ticket desk's pops, which
    /// never give up).
    pub(crate) fn spent(&self) -> bool {
        self.in_a_row >= REDIRECTS
    }

    /// A redirect (`redirect`, answered by `from`) turned into the next hop: the node it names
    /// (no host: `from`'s host), after `ASKING` for an `ASK`. A `MOVED` means the client's slot
    /// map is stale: it is dropped, to be read again by the next lookup. Counted as one in a
    /// row.
    pub(crate) fn follow(
        &mut self,
        map: Map<'_>,
        redirect: &Redirect,
        from: &Node,
    ) -> Result<Hop, LockError> {
        if !redirect.asking {
            map.forget(from);
        }
        let node = map.node_at(&redirect.address, from)?;
        self.in_a_row = self.in_a_row.saturating_add(1);
        Ok(Hop {
            node,
            asking: redirect.asking,
        })
    }

    /// An answer that is no redirect: the count starts again.
    pub(crate) fn answered(&mut self) {
        self.in_a_row = 0;
    }
}

/// One command's way to the node that serves its key, on connections of the library's own:
/// where it goes now, a node that cannot be reached, and the redirects it follows
/// ([`Redirects`]).
pub(crate) struct Route<'a> {
    servers: &'a Servers,
    key: &'a [u8],
    /// Where the command goes now.
    pub(crate) node: Node,
    /// Whether `ASKING` goes first (the last redirect was an `ASK`).
    pub(crate) asking: bool,
    found: Found,
    redirects: Redirects,
}

impl<'a> Route<'a> {
    /// Starts at the node that serves `key`, or at `start` (where a redirect said:
    /// [`Route::after`]).
    pub(crate) async fn start(
        servers: &'a Servers,
        key: &'a [u8],
        start: Option<Hop>,
    ) -> Result<Route<'a>, LockError> {
        let (node, found, asking) = match start {
            Some(hop) => (hop.node, Found::Sure, hop.asking),
            None => {
                let (node, found) = servers.node_of(key).await?;
                (node, found, false)
            }
        };
        Ok(Route {
            servers,
            key,
            node,
            asking,
            found,
            redirects: Redirects::default(),
        })
    }

    /// Where a redirect answered later by `from` (a ticket's popped answer: the lock left with
    /// its slot while the ticket waited) sends the command asked again: it starts a new route
    /// (the wait answered, so nothing was followed in a row before it).
    pub(crate) fn after(
        servers: &Servers,
        redirect: &Redirect,
        from: &Node,
    ) -> Result<Hop, LockError> {
        Redirects::default().follow(Map::Servers(servers), redirect, from)
    }

    /// The node could not be reached (nothing was sent to it). One the client's slot map (or
    /// the Sentinels) named may be stale: the map is dropped and the key's node looked up
    /// again, once. True: send to [`Route::node`] again.
    pub(crate) async fn unreachable(&mut self) -> Result<bool, LockError> {
        if self.found != Found::Cached {
            return Ok(false);
        }
        self.servers.forget(&self.node);
        let (node, _) = self.servers.node_of(self.key).await?;
        self.node = node;
        self.found = Found::Sure;
        Ok(true)
    }

    /// The node answered `error`. A redirect (up to [`REDIRECTS`] in a row) moves the route to
    /// the node it names ([`Redirects::follow`]). True: send to [`Route::node`] again (after
    /// `ASKING` when [`Route::asking`]).
    pub(crate) fn redirected(&mut self, error: &redis::RedisError) -> Result<bool, LockError> {
        if self.redirects.spent() {
            return Ok(false);
        }
        let Some(redirect) = Redirect::of(error) else {
            return Ok(false);
        };
        let hop = self
            .redirects
            .follow(Map::Servers(self.servers), &redirect, &self.node)?;
        self.node = hop.node;
        self.asking = hop.asking;
        self.found = Found::Sure;
        Ok(true)
    }
}

/// The node of a cluster (`info`: the seed's settings) that a `MOVED` or `ASK` redirect names
/// (`host:port`; no host: the host of `from`, the node that sent it).
fn node_at(info: &ConnectionInfo, address: &str, from: &Node) -> Result<Node, LockError> {
    let (host, port) = address
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.to_string(), p.parse().ok()?)))
        .ok_or_else(|| LockError::UnexpectedReply(format!("redirect to {address}")))?;
    let host = if host.is_empty() {
        from.host().unwrap_or(host)
    } else {
        host
    };
    node_with(info, host, port)
}

/// The seed's settings with another node's address.
fn node_with(info: &ConnectionInfo, host: String, port: u16) -> Result<Node, LockError> {
    let mut addr = info.addr().clone();
    match &mut addr {
        ConnectionAddr::Tcp(h, p)
        | ConnectionAddr::TcpTls {
            host: h, port: p, ..
        } => {
            *h = host;
            *p = port;
        }
        _ => {
            return Err(LockError::InvalidArgument(
                "a cluster is reached over TCP, not a unix socket",
            ))
        }
    }
    let info = info.clone().set_addr(addr);
    let settings = crate::naming::with_lib_name(info.redis_settings().clone());
    let resp2 = settings.clone().set_protocol(ProtocolVersion::RESP2);
    let resp3 = settings.set_protocol(ProtocolVersion::RESP3);
    Ok(Node {
        client: redis::Client::open(info.clone().set_redis_settings(resp2))
            .map_err(LockError::Connection)?,
        resp3: redis::Client::open(info.set_redis_settings(resp3))
            .map_err(LockError::Connection)?,
    })
}

/// The master of `slot` in a `CLUSTER SLOTS` reply: `[[low, high, [host, port, id, ...],
/// replica...], ...]`.
fn master_of(slots: &Value, slot: u16) -> Option<(String, u16)> {
    let Value::Array(ranges) = slots else {
        return None;
    };
    ranges.iter().find_map(|range| {
        let Value::Array(fields) = range else {
            return None;
        };
        let [Value::Int(low), Value::Int(high), Value::Array(master), ..] = fields.as_slice()
        else {
            return None;
        };
        if !(*low..=*high).contains(&i64::from(slot)) {
            return None;
        }
        let [host, Value::Int(port), ..] = master.as_slice() else {
            return None;
        };
        let host = match host {
            Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
            Value::SimpleString(s) => s.clone(),
            _ => return None,
        };
        Some((host, u16::try_from(*port).ok()?))
    })
}

/// The cluster slot of a key: CRC16 (XMODEM) of the key, or of its hash tag (the part between
/// the first `{` and the next `}`, when not empty), modulo 16384.
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|b| *b == b'{')
        .and_then(|open| {
            let rest = key.get(open + 1..)?;
            let close = rest.iter().position(|b| *b == b'}')?;
            (close > 0).then(|| rest.get(..close)).flatten()
        })
        .unwrap_or(key);
    crc16(hashed) % 16_384
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for byte in data {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Rust sources under `dir`, with their paths.
    fn sources(dir: &std::path::Path, found: &mut Vec<(std::path::PathBuf, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("the crate's sources")
            .map(|e| e.expect("a directory entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                sources(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("a source file");
                found.push((path, text));
            }
        }
    }

    #[test]
    fn redirects_are_followed_in_this_module_only() {
        // What following a `MOVED` or an `ASK` takes: the node it names, whether `ASKING` goes
        // first, the bound on redirects in a row. Outside this module, code may recognise a
        // redirect (parse it, sort an error), never follow it.
        let following = [
            "redirect.asking",
            "redirect.address",
            "node_at(",
            "REDIRECTS",
            "Redirects {",
            "redirected +=",
        ];
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&src, &mut files);
        assert!(files.len() > 10, "the sources were found");
        let mut outside = Vec::new();
        for (path, text) in &files {
            if path.ends_with("servers.rs") {
                continue;
            }
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or(line);
                if following.iter().any(|f| code.contains(f)) {
                    outside.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                }
            }
        }
        assert!(
            outside.is_empty(),
            "redirects followed outside servers.rs:\n{}",
            outside.join("\n")
        );
    }

    #[test]
    fn slots_follow_the_cluster_spec() {
        // The spec's check value, and hash tags as the spec defines them.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        let cases: [(&[u8], &[u8]); 5] = [
            (b"{user1000}.following", b"user1000"),
            (b"foo{}{bar}", b"foo{}{bar}"),
            (b"foo{{bar}}zap", b"{bar"),
            (b"foo{bar}{zap}", b"bar"),
            (b"no tag", b"no tag"),
        ];
        for (key, hashed) in cases {
            assert_eq!(key_slot(key), crc16(hashed) % 16_384);
        }
    }

    #[test]
    fn the_master_of_a_slot_is_read_from_cluster_slots() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let slots = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("10.0.0.1", 7000),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                node("10.0.0.2", 7001),
                node("10.0.0.3", 7002),
            ]),
        ]);
        assert_eq!(master_of(&slots, 0), Some(("10.0.0.1".into(), 7000)));
        assert_eq!(master_of(&slots, 5461), Some(("10.0.0.2".into(), 7001)));
        assert_eq!(master_of(&Value::Array(vec![]), 1), None);
    }
}
