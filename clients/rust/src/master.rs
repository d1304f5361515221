//! The one server a standalone client talks to: a fixed address, or the master that Sentinel
//! names, found again after a failover.
//!
//! A failover is a change of the master's address, and it has a number (the *generation*):
//! every command sent before the change and answered after it is taken for unanswered, so that
//! a paused old master that comes back (a "zombie", still a master until the Sentinels turn it
//! into a replica) is never believed: its grants, renewals and fenced writes are void once a
//! replica was promoted. The client learns of a change from a poll of the Sentinels every
//! second, from a lookup right after their `+switch-master` message (a hint only: anyone who
//! may publish on a Sentinel can send one, and an old one may arrive late), from a lookup
//! after a failure, and from a lookup after an answer that says a hold is gone (`FENCED`, a
//! renewal or check answered 0: `conn.rs`), which is believed only if they still name the
//! server that gave it.
//!
//! How the master is chosen: every Sentinel is asked at once (`SENTINEL MASTER <name>`, each
//! within the command timeout; one unreachable or answering nonsense counts for nothing), and
//! the answer with the highest `config-epoch` wins: the epoch of the failover that made that
//! address the master, so a Sentinel that has not heard of the last failover yet (or one
//! restarted from an old configuration) cannot lead the client back to an older master,
//! whatever its place in the list (the price: a lookup waits for the slowest Sentinel, up to the
//! command timeout). The client remembers the highest epoch it has followed and
//! never follows another address named with a lower one (a majority of the Sentinels naming
//! the followed master itself at a lower epoch for [`EPOCH_RESET_GRACE`], a Sentinel set
//! re-created from scratch, brings the epoch down). A newer master is followed only once it
//! says it is one (`ROLE`), and not while the Sentinels that name it take it for down
//! (`s_down`, `o_down`).
//!
//! The lookup runs when the client first needs the master and whenever the one it knew fails: a
//! connection to it that cannot be made or breaks, or a reply that says it is a replica now
//! (`READONLY`, or the module's refusal to let a replica wait). Every connection the client
//! opens afterwards (the shared one, a waiting acquire's, an `EPHEMERAL` hold's, the lost-hold
//! listener's, an observer's) goes to the new master. A lookup that finds no master (no
//! Sentinel answers, the newest master does not answer `ROLE` within the command timeout: a
//! paused master still named by the Sentinels accepts connections but never answers) fails, and
//! the next one asks again.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, Value};
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

    /// Through Sentinel: asks the Sentinels which master they name now (unless a lookup that
    /// started after `answered` did), and follows a newer one ([`Master::generation`] moves).
    /// Nothing for a fixed address.
    pub(crate) async fn ask_afresh(&self, answered: Instant) {
        if let Master::Sentinel(sentinel) = self {
            sentinel.ask_afresh(answered).await;
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

/// What one Sentinel says of the master (its `SENTINEL MASTER <name>` reply).
#[derive(Debug, Clone, PartialEq, Eq)]
struct SentinelView {
    host: String,
    port: u16,
    /// The failover that made this address the master (0 before any): the higher, the newer.
    config_epoch: u64,
    /// The Sentinel's flags say `master` and neither `s_down` nor `o_down`.
    usable: bool,
}

/// Reads a `SENTINEL MASTER <name>` reply: a flat field/value list (RESP2) or a map (RESP3).
/// `None` when `ip`, `port` or `config-epoch` is missing or malformed.
fn sentinel_view(reply: &Value) -> Option<SentinelView> {
    let pairs: Vec<(&Value, &Value)> = match reply {
        Value::Array(items) => items
            .chunks_exact(2)
            .filter_map(|pair| match pair {
                [field, value] => Some((field, value)),
                _ => None,
            })
            .collect(),
        Value::Map(pairs) => pairs.iter().map(|(field, value)| (field, value)).collect(),
        _ => return None,
    };
    let field = |name: &str| {
        pairs
            .iter()
            .find(|(field, _)| text(field).as_deref() == Some(name))
            .and_then(|(_, value)| text(value))
    };
    let flags = field("flags").unwrap_or_default();
    let flags: Vec<&str> = flags.split(',').collect();
    Some(SentinelView {
        host: field("ip")?,
        port: field("port")?.parse().ok()?,
        config_epoch: field("config-epoch")?.parse().ok()?,
        usable: flags.contains(&"master")
            && !flags.iter().any(|f| *f == "s_down" || *f == "o_down"),
    })
}

/// A `SENTINEL GET-MASTER-ADDR-BY-NAME` reply: `[ip, port]`; `None` for nil or anything else.
fn current_address(reply: &Value) -> Option<(String, u16)> {
    match reply {
        Value::Array(items) => match items.as_slice() {
            [ip, port] => Some((text(ip)?, text(port)?.parse().ok()?)),
            _ => None,
        },
        _ => None,
    }
}

/// A field or value of a Sentinel's reply as text (numbers too, whatever the protocol).
fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The newest of the Sentinels' views: the highest config-epoch, a usable one first among
/// equals. Asked in turn, the first Sentinel to answer may be one that has not heard of the
/// last failover yet, and would name an older master.
fn newest(views: impl IntoIterator<Item = SentinelView>) -> Option<SentinelView> {
    views
        .into_iter()
        .max_by_key(|view| (view.config_epoch, view.usable))
}

/// The master the client follows, and the config-epoch it was named with.
struct Followed {
    addr: ConnectionAddr,
    config_epoch: u64,
    /// Since when a majority of the Sentinels has named only epochs below `config_epoch`.
    below_since: Option<Instant>,
}

impl Followed {
    fn new(addr: ConnectionAddr, config_epoch: u64) -> Followed {
        Followed {
            addr,
            config_epoch,
            below_since: None,
        }
    }

    /// What a lookup makes of the newest master the Sentinels name (`newest`: the highest
    /// epoch any that answered gave, a master flagged down included; `same_master`: it names
    /// the followed address). A lower epoch never moves the client to another master, even
    /// from a majority: Sentinels cut off with a master that was replaced name it at its old
    /// epoch for as long as the partition lasts. The followed master itself, named at a lower
    /// epoch by a majority of the Sentinels for [`EPOCH_RESET_GRACE`] (`majority_answered`,
    /// each time), is a Sentinel set re-created from scratch: its epoch comes down to theirs,
    /// so that their next failover is followed. Anything else starts that clock again.
    fn judge(
        &mut self,
        newest: u64,
        same_master: bool,
        majority_answered: bool,
        now: Instant,
    ) -> Verdict {
        if newest >= self.config_epoch {
            self.below_since = None;
            return Verdict::Follow;
        }
        if !same_master || !majority_answered {
            self.below_since = None;
            return if same_master {
                Verdict::KeepEpoch
            } else {
                Verdict::Refuse
            };
        }
        let since = *self.below_since.get_or_insert(now);
        if now.saturating_duration_since(since) >= EPOCH_RESET_GRACE {
            Verdict::LowerEpoch
        } else {
            Verdict::KeepEpoch
        }
    }
}

/// What a lookup makes of the newest master the Sentinels name ([`Followed::judge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Named at the followed epoch or above: followed (the same master, or a failover).
    Follow,
    /// The followed master, named at a lower epoch: still followed, its epoch kept.
    KeepEpoch,
    /// The followed master, named at a lower epoch by a majority for the grace: followed, at
    /// their epoch from now on.
    LowerEpoch,
    /// Another master, named at a lower epoch: never followed.
    Refuse,
}

/// The master of one Sentinel-monitored set.
pub(crate) struct SentinelMaster {
    sentinels: Vec<ConnectionInfo>,
    name: String,
    /// The master's connection settings: database, user, password, protocol.
    settings: RedisConnectionInfo,
    timeout: Duration,
    /// One lookup at a time; a connection kept per Sentinel between lookups.
    lookups: tokio::sync::Mutex<Vec<Option<MultiplexedConnection>>>,
    /// The master to use, until a failure drops it.
    current: Mutex<Option<Node>>,
    /// The last master the client followed: another address is a failover, and one named at a
    /// lower config-epoch is older than it and never followed.
    followed: Mutex<Option<Followed>>,
    generation: watch::Sender<u64>,
    /// When the last lookup started (under `lookups`): one that started after an answer
    /// arrived already says what the Sentinels name now ([`SentinelMaster::ask_afresh`]).
    last_asked: Mutex<Option<Instant>>,
    /// The last lookup's refusal by a Sentinel's ACL (its `NOPERM` line), when no Sentinel
    /// named a master: what [`SentinelMaster::node`] answers then, instead of "no master".
    refused: Mutex<Option<String>>,
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
            lookups: tokio::sync::Mutex::new(vec![None; sentinels.len()]),
            sentinels,
            name,
            settings,
            timeout,
            current: Mutex::new(None),
            followed: Mutex::new(None),
            generation: watch::Sender::new(0),
            last_asked: Mutex::new(None),
            refused: Mutex::new(None),
        })
    }

    /// `node`, named at `config_epoch`, is the master now: a failover if the client followed
    /// another address.
    fn adopt(&self, node: &Node, config_epoch: u64) {
        let addr = node.client.get_connection_info().addr().clone();
        let mut followed = relock(&self.followed);
        if followed.as_ref().is_some_and(|f| f.addr != addr) {
            self.generation.send_modify(|g| *g += 1);
        }
        match followed.as_ref() {
            // Unchanged: its clock (`below_since`) goes on.
            Some(f) if f.addr == addr && f.config_epoch == config_epoch => {}
            _ => *followed = Some(Followed::new(addr, config_epoch)),
        }
    }

    /// Every Sentinel's view of the master, asked all at once (each within the command
    /// timeout; once a majority answered, the rest within [`STRAGGLER_GRACE`]), on the
    /// connections kept in `conns`. An unreachable Sentinel, or one whose answer does not
    /// parse, counts for nothing.
    async fn ask_all(&self, conns: &mut [Option<MultiplexedConnection>]) -> Vec<SentinelView> {
        let mut asks = tokio::task::JoinSet::new();
        // Each connection goes with its ask and comes back with its answer: one the grace cut
        // off (a Sentinel paused, overloaded, its host gone), with an ask unanswered on it, is
        // not kept, and the next lookup connects afresh (a dead host's is found dead at the
        // connect, not after a command timeout).
        for (index, (info, conn)) in self.sentinels.iter().zip(conns.iter_mut()).enumerate() {
            let (info, conn, name, timeout) =
                (info.clone(), conn.take(), self.name.clone(), self.timeout);
            asks.spawn(async move {
                match tokio::time::timeout(timeout, ask_one(info, conn, &name)).await {
                    Ok((conn, view, refused)) => (index, conn, view, refused),
                    // A Sentinel that does not answer in time: connect afresh next time.
                    Err(_) => (index, None, None, None),
                }
            });
        }
        let mut views = Vec::new();
        let mut refusal = None;
        let (majority, mut answered) = (self.sentinels.len() / 2 + 1, 0);
        loop {
            // Once a majority answered, the others get a moment more, not the whole timeout:
            // a paused Sentinel would otherwise slow every lookup (each failover's included).
            let next = if answered < majority {
                asks.join_next().await
            } else {
                match tokio::time::timeout(STRAGGLER_GRACE, asks.join_next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                }
            };
            let Some(asked) = next else { break };
            let Ok((index, conn, view, refused)) = asked else {
                continue;
            };
            refusal = refusal.or(refused);
            answered += usize::from(view.is_some());
            if let Some(slot) = conns.get_mut(index) {
                *slot = conn;
            }
            views.extend(view);
        }
        *relock(&self.refused) = if views.is_empty() { refusal } else { None };
        views
    }

    /// Whether `node` says it is a master (`ROLE`), within the command timeout: a server the
    /// Sentinels name may not have been promoted yet, or no longer be one.
    async fn says_master(&self, node: &Node) -> bool {
        let role = async {
            let mut conn = node.client.get_multiplexed_async_connection().await.ok()?;
            let role: Value = redis::cmd("ROLE").query_async(&mut conn).await.ok()?;
            match role {
                Value::Array(items) => items.first().and_then(text),
                _ => None,
            }
        };
        matches!(
            tokio::time::timeout(self.timeout, role).await,
            Ok(Some(role)) if role == "master"
        )
    }

    /// Asks every Sentinel and follows the newest master they name: the same one as now, or
    /// another (a failover) once it says it is a master. Never one named at a lower
    /// config-epoch than the master followed so far (a Sentinel behind the others, or one
    /// restarted from an old configuration). The master to use, if there is one.
    async fn look_up(&self, conns: &mut [Option<MultiplexedConnection>]) -> Option<Node> {
        *relock(&self.last_asked) = Some(Instant::now());
        let views = self.ask_all(conns).await;
        let majority_answered = views.len() > self.sentinels.len() / 2;
        let view = newest(views)?;
        let addr = ConnectionAddr::Tcp(view.host.clone(), view.port);
        // Judged before the usable check: an answer at the followed epoch, its master flagged
        // down, still says the epoch is known.
        let (verdict, floor) = match relock(&self.followed).as_mut() {
            Some(followed) => (
                followed.judge(
                    view.config_epoch,
                    followed.addr == addr,
                    majority_answered,
                    Instant::now(),
                ),
                followed.config_epoch,
            ),
            None => (Verdict::Follow, 0),
        };
        if !view.usable || verdict == Verdict::Refuse {
            return None;
        }
        let epoch = match verdict {
            Verdict::KeepEpoch => floor,
            _ => view.config_epoch,
        };
        let info = addr
            .into_connection_info()
            .ok()?
            .set_redis_settings(self.settings.clone());
        let node = Node::from_info(info).ok()?;
        let current = relock(&self.current).clone();
        if let Some(current) = current.filter(|current| current.same_address(&node)) {
            self.adopt(&current, epoch);
            return Some(current);
        }
        if !self.says_master(&node).await {
            return None;
        }
        *relock(&self.current) = Some(node.clone());
        self.adopt(&node, epoch);
        Some(node)
    }

    /// Asks the Sentinels again (the poll, or a `+switch-master` message: a hint, not the
    /// answer), and switches if they name a newer master.
    async fn refresh(&self) {
        let mut conns = self.lookups.lock().await;
        self.look_up(&mut conns).await;
    }

    /// Asks the Sentinels which master they name now, unless a lookup that started after
    /// `answered` did (answers that arrive together share one lookup), and switches if they
    /// name a newer master. A lookup that finds no master changes nothing.
    async fn ask_afresh(&self, answered: Instant) {
        let mut conns = self.lookups.lock().await;
        if relock(&self.last_asked).is_some_and(|asked| asked >= answered) {
            return;
        }
        self.look_up(&mut conns).await;
    }

    async fn node(&self) -> Result<Node, LockError> {
        if let Some(node) = relock(&self.current).clone() {
            return Ok(node);
        }
        let mut conns = self.lookups.lock().await;
        // Another task may have asked meanwhile.
        if let Some(node) = relock(&self.current).clone() {
            return Ok(node);
        }
        match self.look_up(&mut conns).await {
            Some(node) => Ok(node),
            // Every Sentinel that answered refused (an ACL without `+sentinel|master`): the
            // refusal, named, not "no master".
            None => Err(match relock(&self.refused).clone() {
                Some(message) => LockError::NoPermission {
                    command: crate::error::refused_command(&message)
                        .unwrap_or_else(|| "SENTINEL".to_string()),
                    message,
                    channel: None,
                },
                None => no_master(&self.name),
            }),
        }
    }

    fn forget(&self, node: &Node) {
        let mut current = relock(&self.current);
        if current.as_ref().is_some_and(|c| c.same_address(node)) {
            *current = None;
        }
    }
}

/// One Sentinel's view of the master (`SENTINEL MASTER <name>`), on `conn` or a new
/// connection; returns the connection worth keeping, if any, and the Sentinel's `NOPERM` line
/// if its ACL refused the lookup.
async fn ask_one(
    info: ConnectionInfo,
    conn: Option<MultiplexedConnection>,
    name: &str,
) -> (
    Option<MultiplexedConnection>,
    Option<SentinelView>,
    Option<String>,
) {
    let mut conn = match conn {
        Some(conn) => conn,
        None => {
            let opened = match redis::Client::open(info) {
                Ok(client) => client.get_multiplexed_async_connection().await,
                Err(e) => Err(e),
            };
            match opened {
                Ok(conn) => conn,
                Err(_) => return (None, None, None),
            }
        }
    };
    // The epoch and flags from `SENTINEL MASTER`, the address from `GET-MASTER-ADDR-BY-NAME`:
    // the Sentinel leading a failover reports the new epoch with the old address in `SENTINEL
    // MASTER` until every replica is reconfigured, while `GET-MASTER-ADDR-BY-NAME` (and its
    // hellos to the others) already names the promoted replica.
    let replies: redis::RedisResult<(Value, Value)> = redis::pipe()
        .cmd("SENTINEL")
        .arg("MASTER")
        .arg(name)
        .cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(name)
        .query_async(&mut conn)
        .await;
    match replies {
        Ok((master, address)) => {
            let view = sentinel_view(&master).and_then(|view| {
                let (host, port) = current_address(&address)?;
                Some(SentinelView { host, port, ..view })
            });
            (Some(conn), view, None)
        }
        Err(e) if e.code() == Some("NOPERM") => {
            // A pipeline's error does not carry the server's line: each command alone says
            // which one the ACL refused.
            let mut refused = None;
            for sub in ["MASTER", "GET-MASTER-ADDR-BY-NAME"] {
                let alone: redis::RedisResult<Value> = redis::cmd("SENTINEL")
                    .arg(sub)
                    .arg(name)
                    .query_async(&mut conn)
                    .await;
                if let Err(LockError::NoPermission { message, .. }) = alone.map_err(LockError::from)
                {
                    refused = Some(message);
                    break;
                }
            }
            (Some(conn), None, refused.or_else(|| Some(e.to_string())))
        }
        // The Sentinel answered, but not with the master (it does not monitor this name):
        // the connection is fine.
        Err(e) if !e.is_io_error() && !e.is_unrecoverable_error() => (Some(conn), None, None),
        Err(_) => (None, None, None),
    }
}

/// Follows the Sentinels' view of the master while the client lives: a lookup on each of
/// their `+switch-master` messages (on one Sentinel at a time) and, as the backstop of an
/// at-most-once message, every second.
pub(crate) async fn watch_sentinels(master: Weak<SentinelMaster>) {
    let Some(first) = master.upgrade() else {
        return;
    };
    let (sentinels, name) = (first.sentinels.clone(), first.name.clone());
    drop(first);
    let mut next = 0usize;
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
        if conn.is_none() {
            // An interval's first tick is at once: without a subscription the lookup, and the
            // next Sentinel's try, would follow at once too, a loop of connection attempts for
            // as long as no Sentinel can be reached. They come a second from now.
            poll.reset();
        }
        loop {
            tokio::select! {
                push = pushes.recv(), if conn.is_some() => match push {
                    Some(push) if push.kind == redis::PushKind::Message => {
                        // `<name> <old ip> <old port> <new ip> <new port>`: only a hint that
                        // the master changed (anyone may publish it, and an old one may arrive
                        // late), so the Sentinels are asked, not believed on its word.
                        let names_ours = matches!(
                            push.data.get(1),
                            Some(Value::BulkString(b)) if b.split(|c| *c == b' ').next() == Some(name.as_bytes())
                        );
                        if names_ours {
                            let Some(master) = master.upgrade() else { return };
                            master.refresh().await;
                            poll.reset();
                        }
                    }
                    Some(push) if push.kind == redis::PushKind::Disconnection => break,
                    Some(_) => {}
                    None => break,
                },
                _ = poll.tick() => {
                    let Some(master) = master.upgrade() else { return };
                    master.refresh().await;
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

/// How long the Sentinels not yet heard from are waited for once a majority answered.
const STRAGGLER_GRACE: Duration = Duration::from_millis(100);

/// How long a majority of the Sentinels must name the followed master at a lower epoch, none
/// at the followed one or above, before the client takes the set for re-created (its epochs
/// started again from 0) and lowers the followed epoch to theirs. A failover's epoch reaches
/// every Sentinel within a few 2 s hello periods, so a lag never lasts this long; without it,
/// a client would never follow the re-created set's failovers. The Python library waits as long.
const EPOCH_RESET_GRACE: Duration = Duration::from_secs(10);

fn no_master(name: &str) -> LockError {
    LockError::Connection(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "no master for {name}: no Sentinel answered, or the newest master they name is down, \
             older than the one followed, or did not say it is a master in time"
        ),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// A `SENTINEL MASTER` reply in RESP2: a flat field/value list.
    fn flat(fields: &[(&str, &str)]) -> Value {
        Value::Array(
            fields
                .iter()
                .flat_map(|(field, value)| [bulk(field), bulk(value)])
                .collect(),
        )
    }

    fn view(port: u16, config_epoch: u64, usable: bool) -> SentinelView {
        SentinelView {
            host: "10.0.0.1".into(),
            port,
            config_epoch,
            usable,
        }
    }

    #[test]
    fn a_sentinel_master_reply_is_read_or_refused_without_panicking() {
        let full = [
            ("name", "mymaster"),
            ("ip", "10.0.0.1"),
            ("port", "6380"),
            ("flags", "master"),
            ("config-epoch", "3"),
        ];
        let with = |field: &str, value: &str| {
            let fields: Vec<(&str, &str)> = full
                .iter()
                .map(|(f, v)| (*f, if *f == field { value } else { *v }))
                .collect();
            flat(&fields)
        };
        let without = |field: &str| {
            let fields: Vec<(&str, &str)> =
                full.iter().copied().filter(|(f, _)| *f != field).collect();
            flat(&fields)
        };
        let cases: Vec<(Value, Option<SentinelView>)> = vec![
            (flat(&full), Some(view(6380, 3, true))),
            (with("flags", "master,s_down"), Some(view(6380, 3, false))),
            (
                with("flags", "master,s_down,o_down"),
                Some(view(6380, 3, false)),
            ),
            (with("flags", "slave"), Some(view(6380, 3, false))),
            (without("flags"), Some(view(6380, 3, false))),
            (without("ip"), None),
            (without("port"), None),
            (without("config-epoch"), None),
            (with("port", "99999"), None),
            (with("port", "x"), None),
            (with("config-epoch", "-1"), None),
            (with("config-epoch", ""), None),
            // An odd field count: the last field has no value.
            (
                {
                    let Value::Array(mut items) = flat(&full) else {
                        unreachable!()
                    };
                    items.push(bulk("leader"));
                    Value::Array(items)
                },
                Some(view(6380, 3, true)),
            ),
            // RESP3: a map, numbers as integers.
            (
                Value::Map(vec![
                    (bulk("ip"), bulk("10.0.0.1")),
                    (bulk("port"), Value::Int(6380)),
                    (bulk("flags"), Value::SimpleString("master".into())),
                    (bulk("config-epoch"), Value::Int(3)),
                ]),
                Some(view(6380, 3, true)),
            ),
            (Value::Nil, None),
            (Value::Int(1), None),
            (Value::Array(vec![Value::Nil, Value::Nil]), None),
            (
                Value::Array(vec![bulk("ip"), Value::BulkString(vec![0xff, 0xfe])]),
                None,
            ),
        ];
        for (reply, want) in cases {
            assert_eq!(sentinel_view(&reply), want, "{reply:?}");
        }
    }

    #[test]
    fn a_lower_epoch_never_moves_the_client_and_a_recreated_set_brings_the_epoch_down() {
        // Review F2 (and its review): the Python library's test_sentinel.py takes the same steps.
        use Verdict::*;
        let start = Instant::now();
        let at = |seconds: f64| start + Duration::from_secs_f64(seconds);
        let g = EPOCH_RESET_GRACE.as_secs_f64();
        let mut followed = Followed::new(ConnectionAddr::Tcp("127.0.0.1".into(), 1), 5);
        assert_eq!(followed.judge(5, true, true, at(0.0)), Follow);
        assert_eq!(followed.judge(6, false, false, at(0.0)), Follow);
        // A majority at epoch 0 naming another master: never followed, however long.
        assert_eq!(followed.judge(0, false, true, at(1.0)), Refuse);
        assert_eq!(followed.judge(0, false, true, at(1.0 + 2.0 * g)), Refuse);
        // A majority naming the followed master at epoch 0: still it, its epoch kept a while.
        let t = 2.0 + 2.0 * g;
        assert_eq!(followed.judge(0, true, true, at(t)), KeepEpoch);
        assert_eq!(followed.judge(0, true, true, at(t + g / 2.0)), KeepEpoch);
        // Epoch 5 still heard (its master flagged down): the clock starts again.
        assert_eq!(followed.judge(5, false, true, at(t + g / 2.0)), Follow);
        assert_eq!(followed.judge(0, true, true, at(t + g)), KeepEpoch);
        // A minority answering starts it again too, and so does another master named.
        assert_eq!(followed.judge(0, true, false, at(t + 2.0 * g)), KeepEpoch);
        assert_eq!(
            followed.judge(0, true, true, at(t + 2.0 * g + 0.1)),
            KeepEpoch
        );
        assert_eq!(followed.judge(0, false, true, at(t + 3.0 * g)), Refuse);
        assert_eq!(
            followed.judge(0, true, true, at(t + 3.0 * g + 0.1)),
            KeepEpoch
        );
        assert_eq!(
            followed.judge(0, true, true, at(t + 4.0 * g + 0.1)),
            LowerEpoch
        );
    }

    #[test]
    fn the_newest_view_is_the_highest_config_epoch_a_usable_one_first() {
        let cases: Vec<(Vec<SentinelView>, Option<SentinelView>)> = vec![
            (vec![], None),
            (vec![view(1, 0, true)], Some(view(1, 0, true))),
            // A lagging Sentinel first: the later failover wins.
            (
                vec![view(1, 0, true), view(2, 4, true), view(2, 4, true)],
                Some(view(2, 4, true)),
            ),
            (
                vec![view(2, 4, true), view(1, 0, true)],
                Some(view(2, 4, true)),
            ),
            // Down at the newest epoch: not replaced by an older master.
            (
                vec![view(2, 4, false), view(1, 0, true)],
                Some(view(2, 4, false)),
            ),
            (
                vec![view(2, 4, true), view(2, 4, false)],
                Some(view(2, 4, true)),
            ),
        ];
        for (views, want) in cases {
            assert_eq!(newest(views.clone()), want, "{views:?}");
        }
    }

    #[test]
    fn the_current_address_is_read_from_get_master_addr_by_name() {
        let cases: Vec<(Value, Option<(String, u16)>)> = vec![
            (
                Value::Array(vec![bulk("10.0.0.2"), bulk("6380")]),
                Some(("10.0.0.2".into(), 6380)),
            ),
            (Value::Nil, None),
            (Value::Array(vec![bulk("10.0.0.2")]), None),
            (Value::Array(vec![bulk("10.0.0.2"), bulk("x")]), None),
            (bulk("10.0.0.2:6380"), None),
        ];
        for (reply, want) in cases {
            assert_eq!(current_address(&reply), want, "{reply:?}");
        }
    }
}
