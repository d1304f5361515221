//! Waiting with tickets: the waiting acquires of a client are served by a few waiting
//! connections.
//!
//! A waiting acquire asks with `... WAIT ms TICKET`; when the server must queue it, the reply is
//! a ticket (a key the server pushes the answer into). The waiter hands the ticket here. One
//! task per **group** of tickets keeps a waiting connection of its own (opened when a ticket of
//! the group first waits, given up when none has waited for a while) and runs
//! `BLPOP t1 ... tk timeout` over the group's outstanding tickets; a ticket that comes while a
//! `BLPOP` runs interrupts it (`CLIENT UNBLOCK` on the asking connection: it answers nil) and the
//! `BLPOP` is sent again with the new set. A popped answer goes to its waiter.
//!
//! `CLIENT UNBLOCK` is never sent alone but in a transaction with a write that changes nothing
//! (`MULTI`, `DEL` of a key that never exists in the tickets' slot, `CLIENT UNBLOCK`, `EXEC`).
//! While writes are paused (`CLIENT PAUSE WRITE`, as every failover does) a `BLPOP` sent then
//! (a write) is postponed, and unblocking a postponed client crashes Redis 7.0 (newer servers
//! answer 0, and the interrupt would be sent again and again until the pause ends). The server
//! postpones the whole transaction too, and when the pause ends it lets every postponed client
//! go before it runs any of them: the `CLIENT UNBLOCK` finds the `BLPOP` either blocked as
//! usual or not blocked at all, never postponed, and each retry waits out the pause.
//!
//! A group pops at most [`TICKETS_PER_CONNECTION`] tickets: a new ticket joins the first
//! group of its server (or slot) with room, else starts one, so that every `BLPOP` names at
//! most that many keys and a new ticket interrupts only its group's.
//!
//! On one server (standalone, Sentinel) the client's tickets are asked on its shared
//! connection and popped on waiting connections to the master. In a cluster a
//! ticket hashes to its lock's slot and one `BLPOP` may only name keys of one slot, so there are
//! groups per slot with tickets waiting, popping on the node that serves the slot; tickets are
//! asked on a connection of the client's own to that node (one per node: [`NodeConns`], so that
//! the library sees it close), and a group that stops waiting leaves its waiting connection to
//! the next group on that node (closed when none took it for a while). A `BLPOP` the server
//! redirects (`ASK`/`MOVED`: the slot is migrating or moved) is sent again where it says (with
//! `ASKING` for an `ASK`): the tickets move with the slot. A `BLPOP` that the node the tickets
//! were asked on answers `MOVED` or ends with `UNBLOCKED` (a failover made it a replica) voids
//! them: that node no longer serves their slot.
//!
//! A ticket belongs to the connection that asked for it: when that connection is replaced (it
//! broke, or the master changed), its tickets are void, and their waiters are told so
//! ([`Answer::Void`]) to withdraw them and ask again. The task pings the asking connections while
//! tickets wait, so that a connection closed under it is noticed within a second. It knows
//! nothing of locks: a grant popped for a waiter that is gone is released with the command the
//! waiter left ([`Wanted::release`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Cmd, ConnectionInfo, Pipeline, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::basics::relock;
use crate::conn::{self, Commands};
use crate::error::LockError;
use crate::master::Master;
use crate::naming::setname;
use crate::node::Node;
use crate::servers::{key_slot, Hop, Map, Redirect, Redirects, Route, Servers, SlotMap};

/// The most tickets one waiting connection pops (one `BLPOP` names them all): a client's
/// tickets on a server (of a slot, in a cluster) are split over as many waiting connections as
/// it takes, each its own group, so that each grant costs the server a `BLPOP` over at most
/// this many keys (over all of them, with 2,000 waits queued, a grant cost the server 4 times
/// a blocked waiter's) and a new ticket interrupts only the `BLPOP` it joins.
pub(crate) const TICKETS_PER_CONNECTION: usize = 100;

/// How long a waiting connection stays open with no ticket waiting.
const IDLE: Duration = Duration::from_secs(2);

/// How often the asking connections are checked while tickets wait.
const CHECK: Duration = Duration::from_secs(1);

/// How long past a ticket's deadline (and past a `BLPOP`'s own timeout) the task waits for an
/// answer before it gives the ticket up (or takes the waiting connection for broken).
const MARGIN: Duration = Duration::from_secs(2);

/// After a `CLIENT UNBLOCK` that found nothing blocked (the `BLPOP` was still on its way), how
/// soon it is sent again.
const UNBLOCK_AGAIN: Duration = Duration::from_millis(5);

/// The start of the key the fenced `CLIENT UNBLOCK` deletes (with the tickets' `{tag}`): in the
/// module's namespace, and never made by it, so it never exists.
const UNBLOCK_FENCE: &[u8] = b"__lock_fence__unblock";

/// How many times in a row the waiting connection may fail to open before the waiters are
/// answered with the error.
const OPEN_FAILURES: u32 = 3;

/// How long a group pauses before it pops again after the server answered `TRYAGAIN` (a
/// `BLPOP` over several tickets of a slot that is migrating), `CLUSTERDOWN` or another error,
/// or after a few redirects in a row.
const PAUSE: Duration = Duration::from_millis(100);

/// What a ticket came to.
#[derive(Debug)]
pub(crate) enum Answer {
    /// What the server pushed into it (see [`said`]).
    Popped(Vec<u8>),
    /// The ticket is void: the connection that asked for it was replaced (it closed, or the
    /// master changed). Withdraw it (`LOCK.CANCEL`) and ask again.
    Void,
    /// Its deadline passed (with the margin) and nothing was popped: withdraw it.
    Expired,
    /// The waiting connection could not be opened.
    Failed(LockError),
}

/// What a popped answer says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Said<'a> {
    /// Digits: the token (space-separated tokens, for a multi-key acquire).
    Granted(&'a str),
    /// `timeout`: the wait passed, nothing is held.
    TimedOut,
    /// `expired`: a grant nobody popped before its lease ended; nothing is held.
    Expired,
    /// `-ASK <slot> <host:port>` or `-MOVED ...`: the lock left with its cluster slot; ask
    /// again there (`ASKING` first for an `ASK`).
    Redirect(Redirect),
    /// `-` and another error: what a blocked waiter would have been answered.
    Error(&'a str),
    /// Anything else.
    Unknown(&'a str),
}

/// Decodes a popped answer (its first byte tells: a digit, `t`, `e` or `-`).
pub(crate) fn said(answer: &[u8]) -> Said<'_> {
    let Ok(text) = std::str::from_utf8(answer) else {
        return Said::Unknown("");
    };
    if let Some(error) = text.strip_prefix('-') {
        return match Redirect::parse(error) {
            Some(redirect) => Said::Redirect(redirect),
            None => Said::Error(error),
        };
    }
    match text {
        "timeout" => Said::TimedOut,
        "expired" => Said::Expired,
        _ if is_grant(answer) => Said::Granted(text),
        _ => Said::Unknown(text),
    }
}

/// A ticket to wait for.
#[derive(Clone)]
pub(crate) struct Wanted {
    /// The ticket's name, as the server replied it.
    pub(crate) ticket: Vec<u8>,
    /// When the acquire's wait ends (none: waits until granted).
    pub(crate) deadline: Option<Instant>,
    /// The connection that asked ([`Tickets::ask`]).
    pub(crate) asked: Asked,
    /// The key the grant is on (a cluster routes the release by it).
    pub(crate) key: Arc<[u8]>,
    /// Releases a grant popped for a waiter that is gone (the runtime shut down under it).
    pub(crate) release: Arc<Cmd>,
}

/// The connection a ticket was asked on, and its number then: when its number changes (it was
/// replaced), the ticket is void.
#[derive(Clone)]
pub(crate) struct Asked {
    asker: Asker,
    number: u64,
}

impl Asked {
    fn is_void(&self) -> bool {
        self.asker.current() != self.number
    }

    /// In a cluster, the node the ticket was asked on.
    pub(crate) fn node(&self) -> Option<&Node> {
        self.node_conns().map(|n| &n.node)
    }

    /// In a cluster, the client's connections to the node the ticket was asked on.
    fn node_conns(&self) -> Option<&Arc<NodeConns>> {
        match &self.asker {
            Asker::Shared(_) => None,
            Asker::Node(node) => Some(node),
            Asker::Own(own) => own.node.as_ref(),
        }
    }
}

/// A connection tickets are asked on: the client's shared connection to its one server, the
/// client's asking connection to a cluster node, or the connection of its own an `EPHEMERAL`
/// acquire asks on (the hold it is granted is bound to it).
#[derive(Clone)]
enum Asker {
    Shared(Arc<Commands>),
    Node(Arc<NodeConns>),
    Own(Arc<OwnAsker>),
}

/// An `EPHEMERAL` acquire's connection of its own, while its ticket waits: never replaced, so
/// its ticket is void once it failed, or (through Sentinel) once the master it is to is no
/// longer the master (number 1 while it works, 0 after). `node`: in a cluster, the client's
/// connections to its node (where the ticket is popped); `master`: on one server, the master
/// and its generation when the connection was made.
pub(crate) struct OwnAsker {
    conn: MultiplexedConnection,
    failed: AtomicBool,
    node: Option<Arc<NodeConns>>,
    master: Option<(Arc<Master>, u64)>,
    timeout: Duration,
}

impl OwnAsker {
    fn current(&self) -> u64 {
        let replaced = self
            .master
            .as_ref()
            .is_some_and(|(master, generation)| master.generation() != *generation);
        u64::from(!replaced && !self.failed.load(Ordering::SeqCst))
    }
}

impl Asker {
    /// The number of its current connection (0: none).
    fn current(&self) -> u64 {
        match self {
            Asker::Shared(commands) => commands.asking(),
            Asker::Node(node) => node.current(),
            Asker::Own(own) => own.current(),
        }
    }

    async fn query(&self, cmd: &Cmd) -> Result<Value, LockError> {
        match self {
            Asker::Shared(commands) => commands.query(cmd).await,
            Asker::Node(node) => node.query(cmd, false).await.0.map_err(LockError::from),
            Asker::Own(own) => {
                let mut conn = own.conn.clone();
                let reply = tokio::time::timeout(own.timeout, cmd.query_async::<Value>(&mut conn))
                    .await
                    .unwrap_or_else(|_| Err(timed_out_io()));
                if matches!(&reply, Err(e) if e.code().is_none()) {
                    own.failed.store(true, Ordering::SeqCst);
                }
                reply.map_err(LockError::from)
            }
        }
    }

    fn same(&self, other: &Asker) -> bool {
        match (self, other) {
            (Asker::Shared(a), Asker::Shared(b)) => Arc::ptr_eq(a, b),
            (Asker::Node(a), Asker::Node(b)) => Arc::ptr_eq(a, b),
            (Asker::Own(a), Asker::Own(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

struct Entry {
    wanted: Wanted,
    answer: oneshot::Sender<Answer>,
    /// Its waiter gave it up ([`Pending::leave`]) and waits for the group's last word on it.
    left: Arc<AtomicBool>,
    /// Counts it among its group's tickets while it lives (none: a [`Pending::leave`] poke).
    counted: Option<Counted>,
}

/// One ticket counted in its group's [`Group::count`], until dropped.
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn new(count: &Arc<AtomicUsize>) -> Counted {
        count.fetch_add(1, Ordering::SeqCst);
        Counted(count.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A group's running task, as [`Tickets::wait`] finds it: its inbox and the tickets it holds
/// (at most [`TICKETS_PER_CONNECTION`] are given to it).
struct Group {
    id: u64,
    inbox: mpsc::UnboundedSender<Entry>,
    count: Arc<AtomicUsize>,
}

impl Entry {
    /// Whether its waiter no longer waits for it.
    fn is_left(&self) -> bool {
        self.answer.is_closed() || self.left.load(Ordering::SeqCst)
    }
}

/// A ticket handed to the group's task ([`Tickets::wait`]): its answer comes here.
pub(crate) struct Pending {
    answer: oneshot::Receiver<Answer>,
    left: Arc<AtomicBool>,
    /// The group's inbox, and a copy of the ticket's request: [`Pending::leave`] sends one
    /// that nobody waits for, which interrupts the group's `BLPOP` as a new ticket does.
    inbox: mpsc::UnboundedSender<Entry>,
    wanted: Wanted,
}

impl Pending {
    /// The ticket's answer (the waiting task ended: void, asked again).
    pub(crate) async fn answer(&mut self) -> Answer {
        (&mut self.answer).await.unwrap_or(Answer::Void)
    }

    /// Gives the ticket up: the group stops popping it (its `BLPOP` is interrupted now).
    /// [`Pending::last_word`] then says whether a grant was popped for it meanwhile.
    pub(crate) fn leave(&self) {
        self.left.store(true, Ordering::SeqCst);
        let (answer, _) = oneshot::channel();
        let mut wanted = self.wanted.clone();
        wanted.ticket = Vec::new();
        let poke = Entry {
            wanted,
            answer,
            left: Arc::new(AtomicBool::new(true)),
            counted: None,
        };
        // The task ended: it dropped the ticket, nothing comes.
        let _ = self.inbox.send(poke);
    }

    /// After [`Pending::leave`], the group's last word on the ticket, within `limit`: the grant
    /// popped for it (now the caller's), or none (answered otherwise, or dropped unpopped). The
    /// grant is the caller's to release, so that the release is counted as the handle's: a
    /// grant released behind the handle's back could free the hold of its next acquire (which
    /// `ONCE` answers with the same token).
    pub(crate) async fn last_word(self, limit: Duration) -> Option<Vec<u8>> {
        match tokio::time::timeout(limit, self.answer).await {
            Ok(Ok(Answer::Popped(answer))) if is_grant(&answer) => Some(answer),
            // Not answered in time: a grant popped later is released by the group.
            _ => None,
        }
    }
}

/// Where tickets are asked and popped.
// One per client, made once and never moved: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
enum Place {
    /// One server: asked on the client's shared connection, popped on one waiting connection
    /// to the master (of the current generation, through Sentinel).
    Single(Arc<Master>),
    /// A cluster: `info` is the seed's settings (every node connection reuses them with the
    /// node's address), `slots` the client's slot map (dropped when a pop is `MOVED`); the
    /// client's connections to each node.
    Cluster {
        info: ConnectionInfo,
        slots: SlotMap,
        nodes: Mutex<HashMap<String, Arc<NodeConns>>>,
    },
}

/// The client's waiting connections and the tasks that run them.
pub(crate) struct Tickets {
    place: Place,
    /// The client's shared connection: asks on one server, releases grants nobody took.
    commands: Arc<Commands>,
    /// `CLIENT SETNAME` of the connections it opens.
    name: String,
    timeout: Duration,
    /// The running groups of each server (`None`) or cluster slot: the first with room takes a
    /// new ticket (as many as [`TICKETS_PER_CONNECTION`] each), else a new group starts.
    groups: Mutex<HashMap<Option<u16>, Vec<Group>>>,
    /// The number of the next group.
    started: AtomicU64,
    /// Set when the server refused the fenced `CLIENT UNBLOCK` (an ACL without `MULTI` or
    /// `DEL`): from then on `BLPOP`s are short and never interrupted, as without `CLIENT ID`.
    unfenced: AtomicBool,
}

/// A waiting connection, with its id for `CLIENT UNBLOCK` (none when the server refused
/// `CLIENT ID`: then each `BLPOP` lasts at most a second): to the master of `generation` on one
/// server, to `node` in a cluster.
struct Waiting {
    conn: MultiplexedConnection,
    id: Option<i64>,
    generation: u64,
    node: Option<Arc<NodeConns>>,
}

/// Where a cluster group pops: the node, and whether `ASKING` goes before each `BLPOP` (after
/// an `ASK`: the slot is being imported there).
#[derive(Clone)]
struct Pop {
    node: Arc<NodeConns>,
    asking: bool,
}

/// The client's connections to one cluster node: the one tickets for its slots are asked on,
/// and the waiting connections no group uses now.
pub(crate) struct NodeConns {
    node: Node,
    name: String,
    timeout: Duration,
    /// The asking connection and its number; none until first needed, or after it broke.
    asking: Mutex<Option<(MultiplexedConnection, u64)>>,
    made: AtomicU64,
    connecting: tokio::sync::Mutex<()>,
    /// Waiting connections left by groups that stopped waiting, each with its number (closed
    /// [`IDLE`] after it was left, if no group took it).
    idle: Mutex<Vec<(u64, Waiting)>>,
    left: AtomicU64,
}

impl NodeConns {
    fn current(&self) -> u64 {
        relock(&self.asking).as_ref().map_or(0, |(_, n)| *n)
    }

    /// `cmd` on the asking connection (after `ASKING` when `asking`), made if there is none,
    /// with the number of the connection that answered. A connection that broke or timed out is
    /// dropped: the next command makes a new one (and the tickets of this one are void).
    async fn query(&self, cmd: &Cmd, asking: bool) -> (redis::RedisResult<Value>, u64) {
        let (mut conn, number, new) = match self.connection().await {
            Ok(found) => found,
            Err(e) => return (Err(e), 0),
        };
        let reply = if new || asking {
            let name = new.then_some(self.name.as_str());
            conn::prefixed_query(&mut conn, name, asking, cmd).await
        } else {
            cmd.query_async::<Value>(&mut conn).await
        };
        if matches!(&reply, Err(e) if e.code().is_none()) {
            let mut slot = relock(&self.asking);
            if slot.as_ref().is_some_and(|(_, n)| *n == number) {
                *slot = None;
            }
        }
        (reply, number)
    }

    /// The commands of `pipe` (sent with `ignore_errors`) on the asking connection, as
    /// [`NodeConns::query`]: each command's reply, a server error as an error value.
    async fn query_pipeline(&self, pipe: &Pipeline) -> redis::RedisResult<Vec<Value>> {
        let (mut conn, number, new) = self.connection().await?;
        if new {
            // Refused (an ACL without CLIENT): the connection works unnamed.
            let _ = setname(&self.name).query_async::<Value>(&mut conn).await;
        }
        let replies = pipe.query_async::<Vec<Value>>(&mut conn).await;
        if matches!(&replies, Err(e) if e.code().is_none()) {
            let mut slot = relock(&self.asking);
            if slot.as_ref().is_some_and(|(_, n)| *n == number) {
                *slot = None;
            }
        }
        replies
    }

    async fn connection(&self) -> redis::RedisResult<(MultiplexedConnection, u64, bool)> {
        if let Some((conn, n)) = relock(&self.asking).clone() {
            return Ok((conn, n, false));
        }
        let _connecting = self.connecting.lock().await;
        if let Some((conn, n)) = relock(&self.asking).clone() {
            return Ok((conn, n, false));
        }
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(Some(self.timeout))
            .set_connection_timeout(Some(self.timeout));
        let conn = self
            .node
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let number = self.made.fetch_add(1, Ordering::SeqCst) + 1;
        *relock(&self.asking) = Some((conn.clone(), number));
        Ok((conn, number, true))
    }

    /// Keeps `waiting` for the next group that pops here, for [`IDLE`].
    fn leave(self: &Arc<Self>, waiting: Waiting) {
        let number = self.left.fetch_add(1, Ordering::SeqCst) + 1;
        relock(&self.idle).push((number, waiting));
        let conns: Weak<NodeConns> = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(IDLE).await;
            if let Some(conns) = conns.upgrade() {
                relock(&conns.idle).retain(|(n, _)| *n != number);
            }
        });
    }

    fn take_idle(&self) -> Option<Waiting> {
        relock(&self.idle).pop().map(|(_, waiting)| waiting)
    }
}

impl Tickets {
    /// The tickets of a client of one server (`master`), asked on `commands`.
    pub(crate) fn single(
        master: Arc<Master>,
        commands: Arc<Commands>,
        name: String,
        timeout: Duration,
    ) -> Tickets {
        Tickets {
            place: Place::Single(master),
            commands,
            name,
            timeout,
            groups: Mutex::new(HashMap::new()),
            started: AtomicU64::new(0),
            unfenced: AtomicBool::new(false),
        }
    }

    /// The tickets of a cluster client (`info`: the seed's settings; `slots`: the client's slot
    /// map).
    pub(crate) fn cluster(
        info: ConnectionInfo,
        slots: SlotMap,
        commands: Arc<Commands>,
        name: String,
        timeout: Duration,
    ) -> Tickets {
        Tickets {
            place: Place::Cluster {
                info,
                slots,
                nodes: Mutex::new(HashMap::new()),
            },
            commands,
            name,
            timeout,
            groups: Mutex::new(HashMap::new()),
            started: AtomicU64::new(0),
            unfenced: AtomicBool::new(false),
        }
    }

    /// The client's connections to a cluster `node` (made on first use).
    fn node_conns(&self, node: &Node) -> Arc<NodeConns> {
        let Place::Cluster { nodes, .. } = &self.place else {
            // Not reached: only a cluster asks nodes.
            return Arc::new(self.new_node_conns(node));
        };
        let address = node.client.get_connection_info().addr().to_string();
        relock(nodes)
            .entry(address)
            .or_insert_with(|| Arc::new(self.new_node_conns(node)))
            .clone()
    }

    fn new_node_conns(&self, node: &Node) -> NodeConns {
        NodeConns {
            node: node.clone(),
            name: self.name.clone(),
            timeout: self.timeout,
            asking: Mutex::new(None),
            made: AtomicU64::new(0),
            connecting: tokio::sync::Mutex::new(()),
            idle: Mutex::new(Vec::new()),
            left: AtomicU64::new(0),
        }
    }

    /// The connection of its own an `EPHEMERAL` acquire asked on (`conn`, to `node`), for its
    /// ticket's waiter.
    pub(crate) fn asked_on_own(
        &self,
        conn: MultiplexedConnection,
        node: &Node,
        generation: u64,
    ) -> Asked {
        let (node, master) = match &self.place {
            Place::Cluster { .. } => (Some(self.node_conns(node)), None),
            Place::Single(master) => (None, Some((master.clone(), generation))),
        };
        let own = OwnAsker {
            conn,
            failed: AtomicBool::new(false),
            node,
            master,
            timeout: self.timeout,
        };
        Asked {
            asker: Asker::Own(Arc::new(own)),
            number: 1,
        }
    }

    /// Asks `cmd` (`... WAIT ms TICKET`) for `key`: on one server on the shared connection; in
    /// a cluster on the client's asking connection to the node that serves `key` (`to`: the
    /// node a ticket's redirect named), following `MOVED` and `ASK` as a waiting acquire on a
    /// connection of its own does. The reply (a ticket, the token, nil, or the error) comes
    /// with the connection that asked, for the ticket's waiter.
    pub(crate) async fn ask(
        &self,
        servers: &Servers,
        cmd: &Cmd,
        key: &[u8],
        to: Option<Hop>,
    ) -> (Result<Value, LockError>, Option<Asked>) {
        if let Place::Single(_) = self.place {
            let (reply, number) = self.commands.query_asking(cmd).await;
            let asked = Asked {
                asker: Asker::Shared(self.commands.clone()),
                number,
            };
            return (reply, Some(asked));
        }
        let mut route = match Route::start(servers, key, to).await {
            Ok(route) => route,
            Err(e) => return (Err(e), None),
        };
        loop {
            let conns = self.node_conns(&route.node);
            let (reply, number) = conns.query(cmd, route.asking).await;
            if let Err(e) = &reply {
                // No answer (no error code): the node could not be reached.
                let again = if e.code().is_none() {
                    route.unreachable().await
                } else {
                    route.redirected(e)
                };
                match again {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(e) => return (Err(e), None),
                }
            }
            let asked = Asked {
                asker: Asker::Node(conns),
                number,
            };
            return (reply.map_err(LockError::from), Some(asked));
        }
    }

    /// Waits for `wanted`: its answer comes on the [`Pending`]. [`Pending::leave`] gives the
    /// ticket up here (the caller withdraws it with `LOCK.CANCEL`).
    pub(crate) fn wait(self: &Arc<Self>, wanted: Wanted) -> Pending {
        let (tx, rx) = oneshot::channel();
        let left = Arc::new(AtomicBool::new(false));
        let pending = |inbox: &mpsc::UnboundedSender<Entry>, wanted: Wanted| Pending {
            answer: rx,
            left: left.clone(),
            inbox: inbox.clone(),
            wanted,
        };
        let asked_at = match &wanted.asked.asker {
            Asker::Node(node) => Some(node.clone()),
            Asker::Own(own) => own.node.clone(),
            Asker::Shared(_) => None,
        };
        let (group, pop) = match (&self.place, asked_at) {
            (Place::Cluster { .. }, Some(node)) => (
                Some(key_slot(&wanted.ticket)),
                Some(Pop {
                    node,
                    asking: false,
                }),
            ),
            _ => (None, None),
        };
        let copy = wanted.clone();
        let mut entry = Entry {
            wanted,
            answer: tx,
            left: left.clone(),
            counted: None,
        };
        let mut groups = relock(&self.groups);
        let running = groups.entry(group).or_default();
        for sub in running.iter() {
            if sub.count.load(Ordering::SeqCst) >= TICKETS_PER_CONNECTION {
                continue;
            }
            entry.counted = Some(Counted::new(&sub.count));
            match sub.inbox.send(entry) {
                Ok(()) => return pending(&sub.inbox, copy),
                // The task ended (its runtime shut down): another, or a new one.
                Err(mpsc::error::SendError(back)) => {
                    entry = back;
                    entry.counted = None;
                }
            }
        }
        running.retain(|sub| !sub.inbox.is_closed());
        let (inbox, rx_entries) = mpsc::unbounded_channel();
        let count = Arc::new(AtomicUsize::new(0));
        entry.counted = Some(Counted::new(&count));
        // Cannot fail: the receiver is alive.
        let _ = inbox.send(entry);
        let pending = pending(&inbox, copy);
        let id = self.started.fetch_add(1, Ordering::SeqCst);
        running.push(Group { id, inbox, count });
        drop(groups);
        tokio::spawn(self.clone().run(group, id, pop, rx_entries));
        pending
    }

    /// A group's task: one `BLPOP` at a time over its outstanding tickets, until none has
    /// waited for [`IDLE`]. `group`: its server or slot, `id` its number there; `pop`: where a
    /// cluster group pops (first, the node its first ticket was asked on).
    async fn run(
        self: Arc<Self>,
        group: Option<u16>,
        id: u64,
        mut pop: Option<Pop>,
        mut inbox: mpsc::UnboundedReceiver<Entry>,
    ) {
        let mut entries: Vec<Entry> = Vec::new();
        let mut waiting: Option<Waiting> = None;
        let mut failures = 0;
        let mut redirects = Redirects::default();
        loop {
            while let Ok(entry) = inbox.try_recv() {
                entries.push(entry);
            }
            let generation = self.generation();
            if waiting.as_ref().is_some_and(|w| w.generation != generation) {
                // A failover: the waiting connection goes (the shared connection is done with
                // too, which voids every ticket it asked for).
                waiting = None;
            }
            self.sweep(&mut entries);
            if entries.is_empty() {
                // Nothing waits: the connection goes (to the next group on its node, in a
                // cluster), and the task after a while.
                if let Some(w) = waiting.take() {
                    leave(w);
                }
                match tokio::time::timeout(IDLE, inbox.recv()).await {
                    Ok(Some(entry)) => entries.push(entry),
                    Ok(None) => return,
                    Err(_) => {
                        let mut groups = relock(&self.groups);
                        match inbox.try_recv() {
                            Ok(entry) => entries.push(entry),
                            Err(_) => {
                                if let Some(running) = groups.get_mut(&group) {
                                    running.retain(|sub| sub.id != id);
                                    if running.is_empty() {
                                        groups.remove(&group);
                                    }
                                }
                                return;
                            }
                        }
                    }
                }
                continue;
            }
            let current = match waiting.take() {
                Some(w) => w,
                None => match self.open(pop.as_ref(), generation).await {
                    Ok(w) => {
                        failures = 0;
                        w
                    }
                    Err(e) => {
                        failures += 1;
                        if failures >= OPEN_FAILURES {
                            failures = 0;
                            for entry in entries.drain(..) {
                                let _ = entry.answer.send(Answer::Failed(clone_error(&e)));
                            }
                        } else {
                            tokio::time::sleep(PAUSE).await;
                        }
                        continue;
                    }
                },
            };
            let asking = pop.as_ref().is_some_and(|p| p.asking);
            match self.pop(&current, asking, &mut entries, &mut inbox).await {
                Popped::Answer(ticket, answer) => {
                    waiting = Some(current);
                    redirects.answered();
                    self.deliver(&mut entries, &ticket, answer);
                }
                Popped::Nothing => {
                    waiting = Some(current);
                    redirects.answered();
                }
                // The waiting connection broke, or stayed silent past its BLPOP's timeout, or
                // is to a master that is no longer the master: a new one (the tickets stand).
                Popped::Broken => {}
                // The slot is migrating (ASK: the tickets are not on this node) or moved: the
                // tickets are popped where the server says. Those asked on this node are void
                // if it says `MOVED`: it serves the slot no more (see [`Tickets::void_at`]). Past
                // the redirects one command follows in a row, each is followed after a pause.
                Popped::Redirect(redirect) => {
                    if redirect.moved() {
                        Tickets::void_at(&current, &mut entries);
                    }
                    let spent = redirects.spent();
                    let hop = match (&self.place, &current.node) {
                        (Place::Cluster { info, slots, .. }, Some(from)) => redirects
                            .follow(Map::Cluster { info, slots }, &redirect, &from.node)
                            .ok(),
                        _ => None,
                    };
                    leave(current);
                    if let Some(hop) = hop {
                        pop = Some(Pop {
                            node: self.node_conns(&hop.node),
                            asking: hop.asking,
                        });
                    }
                    if spent {
                        tokio::time::sleep(PAUSE).await;
                    }
                }
                Popped::Again => {
                    waiting = Some(current);
                    tokio::time::sleep(PAUSE).await;
                }
                // The server ended the `BLPOP` itself: the node became a replica.
                Popped::Unblocked => {
                    Tickets::void_at(&current, &mut entries);
                    waiting = Some(current);
                    if !entries.is_empty() {
                        tokio::time::sleep(PAUSE).await;
                    }
                }
            }
        }
    }

    /// In a cluster, answers [`Answer::Void`] to the tickets asked on the node of `waiting`,
    /// which says it no longer serves their slot (a `BLPOP` there was `MOVED`, or ended by the
    /// server with `UNBLOCKED`). After a failover (`CLUSTER FAILOVER`, or a master that failed)
    /// their queue was in the old master's memory only: nothing will ever be written into them
    /// on the new master, and their asking connection to the old node still lives, so nothing
    /// else voids them. After a migration their answers went with the slot (a grant there is
    /// taken by the waiter's `LOCK.CANCEL`, routed by the ticket's name). Either way the waiter
    /// withdraws the ticket and asks again, with `ONCE`: a hold granted meanwhile is answered
    /// with its token again, never taken twice.
    fn void_at(waiting: &Waiting, entries: &mut Vec<Entry>) {
        let Some(node) = &waiting.node else {
            return;
        };
        let mut kept = Vec::with_capacity(entries.len());
        for entry in entries.drain(..) {
            if entry
                .wanted
                .asked
                .node_conns()
                .is_some_and(|n| Arc::ptr_eq(n, node))
            {
                let _ = entry.answer.send(Answer::Void);
            } else {
                kept.push(entry);
            }
        }
        *entries = kept;
    }

    /// The master's generation on one server (0 in a cluster).
    pub(crate) fn generation(&self) -> u64 {
        match &self.place {
            Place::Single(master) => master.generation(),
            Place::Cluster { .. } => 0,
        }
    }

    /// Answers and drops what needs no `BLPOP`: waiters that gave up, tickets whose asking
    /// connection was replaced, tickets past their deadline.
    fn sweep(&self, entries: &mut Vec<Entry>) {
        let now = Instant::now();
        let mut kept = Vec::with_capacity(entries.len());
        for entry in entries.drain(..) {
            if entry.is_left() {
                // Its waiter learns that nothing was popped for it.
                continue;
            }
            if entry.wanted.asked.is_void() {
                let _ = entry.answer.send(Answer::Void);
            } else if entry.wanted.deadline.is_some_and(|d| d + MARGIN <= now) {
                let _ = entry.answer.send(Answer::Expired);
            } else {
                kept.push(entry);
            }
        }
        *entries = kept;
    }

    /// A waiting connection: to the master on one server, to `pop`'s node in a cluster (one a
    /// group left there, or a new one).
    async fn open(&self, pop: Option<&Pop>, generation: u64) -> Result<Waiting, LockError> {
        match (&self.place, pop) {
            (Place::Single(master), _) => {
                let node = master.node().await?;
                let opened = self.open_to(&node, generation, None).await;
                if opened.is_err() {
                    // Through Sentinel, the next lookup asks the Sentinels again (a failover).
                    master.forget(&node);
                }
                opened
            }
            (Place::Cluster { .. }, Some(pop)) => match pop.node.take_idle() {
                Some(waiting) => Ok(waiting),
                None => {
                    self.open_to(&pop.node.node, 0, Some(pop.node.clone()))
                        .await
                }
            },
            (Place::Cluster { .. }, None) => Err(LockError::InvalidArgument(
                "a cluster ticket without the node it was asked on",
            )),
        }
    }

    /// Opens a waiting connection to `node`: its name, `CLIENT ID`, and whether `MULTI` is
    /// allowed (`MULTI` then `DISCARD`), in one round trip.
    async fn open_to(
        &self,
        node: &Node,
        generation: u64,
        conns: Option<Arc<NodeConns>>,
    ) -> Result<Waiting, LockError> {
        let mut own = conn::own_connection(&node.client, false, self.timeout).await?;
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.add_command(setname(&self.name)).ignore();
        pipe.cmd("CLIENT").arg("ID");
        pipe.cmd("MULTI");
        pipe.cmd("DISCARD").ignore();
        let replies =
            tokio::time::timeout(self.timeout, pipe.query_async::<Vec<Value>>(&mut own.conn))
                .await
                .map_err(|_| timed_out())?
                .map_err(LockError::Connection)?;
        let id = match replies.as_slice() {
            // Without `MULTI`, `CLIENT UNBLOCK` could not go in its transaction: never sent.
            [Value::Int(id), Value::Okay] if !self.unfenced.load(Ordering::SeqCst) => Some(*id),
            // Refused (an ACL without CLIENT or MULTI): BLPOPs short enough to take new
            // tickets.
            _ => None,
        };
        Ok(Waiting {
            conn: own.conn,
            id,
            generation,
            node: conns,
        })
    }

    /// The failovers that end a `BLPOP` on one server (none in a cluster).
    fn changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        match &self.place {
            Place::Single(master) => master.changes(),
            Place::Cluster { .. } => None,
        }
    }

    /// `CLIENT UNBLOCK id` on the asking connection to the waiting connection's server, in a
    /// transaction fenced by a write that changes nothing (`DEL` of `fence`, a key in the
    /// tickets' slot that never exists): while writes are paused the server holds the whole
    /// transaction back until the pause ends (module docs above).
    async fn unblock(&self, waiting: &Waiting, id: i64, fence: &[u8]) -> Unblock {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("MULTI");
        pipe.cmd("DEL").arg(fence);
        pipe.cmd("CLIENT").arg("UNBLOCK").arg(id);
        pipe.cmd("EXEC");
        let replies = match &waiting.node {
            Some(node) => node
                .query_pipeline(&pipe)
                .await
                .map(conn::answers)
                .map_err(LockError::from),
            None => self.commands.query_pipeline(&pipe, fence).await,
        };
        unblocked(&replies)
    }

    /// One `BLPOP` over `entries`' tickets (after `ASKING` when `asking`), interrupted (and its
    /// nil answer read) when a ticket comes, a waiter gives up, or an asking connection is
    /// replaced.
    async fn pop(
        &self,
        waiting: &Waiting,
        asking: bool,
        entries: &mut Vec<Entry>,
        inbox: &mut mpsc::UnboundedReceiver<Entry>,
    ) -> Popped {
        let now = Instant::now();
        let nearest = entries.iter().filter_map(|e| e.wanted.deadline).min();
        let mut secs = match nearest {
            // Rounded up, plus a second: the server's own `timeout` answer comes first.
            Some(d) => d.saturating_duration_since(now).as_millis().div_ceil(1000) as u64 + 1,
            None => 0,
        };
        // The waiting connection's id, unless the server refused the fenced unblock.
        let id = waiting.id.filter(|_| !self.unfenced.load(Ordering::SeqCst));
        if id.is_none() {
            // Cannot be interrupted: short, so that new tickets join soon.
            secs = 1;
        }
        let fence = entries
            .first()
            .map(|e| fence_key(&e.wanted.ticket))
            .unwrap_or_default();
        let mut cmd = redis::cmd("BLPOP");
        for entry in entries.iter() {
            cmd.arg(&entry.wanted.ticket);
        }
        cmd.arg(secs);
        let mut conn = waiting.conn.clone();
        let mut blpop = Box::pin(async move {
            if asking {
                conn::prefixed_query(&mut conn, None, true, &cmd).await
            } else {
                cmd.query_async::<Value>(&mut conn).await
            }
        });
        let silent_after = (secs > 0).then(|| now + Duration::from_secs(secs) + MARGIN);
        let mut check = tokio::time::interval_at(now + CHECK, CHECK);
        let mut interrupt = false;
        let mut interrupted = false;
        let mut again = UNBLOCK_AGAIN;
        let mut inbox_open = true;
        let failover = crate::master::changed(self.changes());
        tokio::pin!(failover);
        let reply = loop {
            if interrupt && !interrupted {
                if let Some(id) = id {
                    match self.unblock(waiting, id, &fence).await {
                        Unblock::Done => interrupted = true,
                        Unblock::NotBlocked => again = UNBLOCK_AGAIN,
                        // The slot is migrating or moved: the `BLPOP` is redirected when it
                        // ends there; meanwhile the interrupt is tried again less often.
                        Unblock::Redirected => again = PAUSE,
                        Unblock::Refused => {
                            // It cannot be interrupted: the waiting connection goes (which
                            // ends its `BLPOP`; the tickets stand), and the next ones pop
                            // with short `BLPOP`s.
                            self.unfenced.store(true, Ordering::SeqCst);
                            return Popped::Broken;
                        }
                    }
                }
            }
            let retry = interrupt && !interrupted && id.is_some();
            tokio::select! {
                reply = &mut blpop => break reply,
                entry = inbox.recv(), if inbox_open => match entry {
                    Some(entry) => {
                        entries.push(entry);
                        interrupt = true;
                    }
                    None => inbox_open = false,
                },
                _ = tokio::time::sleep(again), if retry => {}
                // Through Sentinel, the master was replaced: its tickets no longer count.
                _ = &mut failover => return Popped::Broken,
                _ = check.tick() => {
                    if self.generation() != waiting.generation {
                        return Popped::Broken;
                    }
                    // A ping on each asking connection: one closed under the client is
                    // replaced now, and the tickets it asked for are void.
                    let mut askers: Vec<Asker> = Vec::new();
                    for e in entries.iter() {
                        if !askers.iter().any(|a| a.same(&e.wanted.asked.asker)) {
                            askers.push(e.wanted.asked.asker.clone());
                        }
                    }
                    for asker in &askers {
                        let _ = asker.query(&redis::cmd("PING")).await;
                    }
                    if entries
                        .iter()
                        .any(|e| e.answer.is_closed() || e.wanted.asked.is_void())
                    {
                        interrupt = true;
                    }
                    if self.generation() != waiting.generation {
                        return Popped::Broken;
                    }
                    if silent_after.is_some_and(|t| Instant::now() > t) {
                        return Popped::Broken;
                    }
                }
            }
        };
        match reply {
            Ok(Value::Array(mut pair)) if pair.len() == 2 => {
                let answer = pair.pop();
                let ticket = pair.pop();
                match (ticket, answer) {
                    (Some(Value::BulkString(ticket)), Some(Value::BulkString(answer))) => {
                        Popped::Answer(ticket, answer)
                    }
                    _ => Popped::Nothing,
                }
            }
            Ok(_) => Popped::Nothing,
            Err(e) => match Redirect::of(&e) {
                Some(redirect) if waiting.node.is_some() => Popped::Redirect(redirect),
                // Not the library's own `CLIENT UNBLOCK` (that one answers nil): the server
                // ended the wait (the node became a replica, in a failover).
                _ if e.code() == Some("UNBLOCKED") && waiting.node.is_some() => Popped::Unblocked,
                // TRYAGAIN, CLUSTERDOWN, or refused (NOPERM: an ACL without BLPOP or the
                // tickets' keys): the connection is fine, the pop is sent again after a pause.
                _ if e.code().is_some() => Popped::Again,
                _ => Popped::Broken,
            },
        }
    }

    /// Gives `answer` to the waiter of `ticket` (one that gave it up and waits for the last
    /// word too: it releases a grant itself, as its handle's release). A grant whose waiter is
    /// gone altogether (the runtime shut down under it, or it stopped waiting for the last word)
    /// is released here.
    fn deliver(&self, entries: &mut Vec<Entry>, ticket: &[u8], answer: Vec<u8>) {
        let Some(at) = entries.iter().position(|e| e.wanted.ticket == ticket) else {
            return;
        };
        let entry = entries.swap_remove(at);
        if let Err(Answer::Popped(answer)) = entry.answer.send(Answer::Popped(answer)) {
            if is_grant(&answer) {
                let commands = self.commands.clone();
                let (release, key) = (entry.wanted.release, entry.wanted.key);
                tokio::spawn(async move {
                    let _ = commands.query_routed(&release, Some(&key)).await;
                });
            }
        }
    }
}

/// A waiting connection no group uses now: kept for the next group on its cluster node, or
/// closed.
fn leave(waiting: Waiting) {
    if let Some(node) = waiting.node.clone() {
        node.leave(waiting);
    }
}

/// What a fenced `CLIENT UNBLOCK` came to.
#[derive(Debug, PartialEq)]
enum Unblock {
    /// The `BLPOP` was blocked: it answers nil now.
    Done,
    /// Nothing was blocked (the `BLPOP` was on its way, or just answered), or no answer (the
    /// connection broke or timed out): sent again soon.
    NotBlocked,
    /// The fence key's slot is migrating or moved (`ASK`, `MOVED`, `TRYAGAIN`), or the cluster
    /// is down: nothing ran.
    Redirected,
    /// The server refused the transaction or its `DEL` (an ACL without them): nothing ran.
    Refused,
}

/// The key the fenced `CLIENT UNBLOCK` deletes for `ticket`: [`UNBLOCK_FENCE`] and the ticket's
/// `{tag}` (so in its slot). No ticket is named so ([`UNBLOCK_FENCE`] is no ticket prefix).
fn fence_key(ticket: &[u8]) -> Vec<u8> {
    let mut key = UNBLOCK_FENCE.to_vec();
    let tag = ticket.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = ticket.get(open..)?;
        let close = rest.iter().position(|&b| b == b'}')?;
        rest.get(..=close)
    });
    key.extend_from_slice(tag.unwrap_or(b"{}"));
    key
}

/// The replies to `MULTI`, `DEL`, `CLIENT UNBLOCK`, `EXEC` (a server error as an `Err`).
fn unblocked(replies: &Result<Vec<Result<Value, LockError>>, LockError>) -> Unblock {
    let Ok(replies) = replies else {
        return Unblock::NotBlocked;
    };
    let redirected = |reply: &Result<Value, LockError>| match reply {
        Err(LockError::Server(text)) => matches!(
            text.split(' ').next(),
            Some("MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN" | "LOADING" | "BUSY")
        ),
        _ => false,
    };
    match replies.as_slice() {
        [Ok(Value::Okay), _, _, Ok(Value::Array(done))] => match done.as_slice() {
            [_, Value::Int(1)] => Unblock::Done,
            _ => Unblock::NotBlocked,
        },
        [Ok(Value::Okay), del, _, Err(LockError::Server(_))] if redirected(del) => {
            Unblock::Redirected
        }
        [Ok(Value::Okay), _, _, Err(LockError::Server(_))] => Unblock::Refused,
        // `MULTI` refused (checked when the waiting connection opened, so not met).
        [Err(LockError::Server(_)), ..] => Unblock::Refused,
        _ => Unblock::NotBlocked,
    }
}

/// What one `BLPOP` came to.
enum Popped {
    /// A ticket and its answer.
    Answer(Vec<u8>, Vec<u8>),
    /// Nil: it timed out, or was interrupted.
    Nothing,
    /// The waiting connection is of no more use.
    Broken,
    /// The server sent the `BLPOP` to another node.
    Redirect(Redirect),
    /// The server cannot serve it now (`TRYAGAIN`, `CLUSTERDOWN`) or refused it: again after a
    /// pause.
    Again,
    /// In a cluster, the server ended it with `UNBLOCKED` (the node became a replica).
    Unblocked,
}

/// Whether a ticket's answer is a grant (digits: the token or tokens).
pub(crate) fn is_grant(answer: &[u8]) -> bool {
    answer.first().is_some_and(u8::is_ascii_digit)
}

fn timed_out() -> LockError {
    LockError::Connection(timed_out_io())
}

fn timed_out_io() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the connection did not answer in time",
    ))
}

/// The error of a waiting connection that cannot be opened, for each of its waiters.
fn clone_error(e: &LockError) -> LockError {
    LockError::Connection(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        format!("the waiting connection cannot be opened: {e}"),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_key_is_in_the_tickets_slot_and_no_ticket() {
        let ticket = b"__lock_fence__ticket{user:1}00000000000000ff";
        let fence = fence_key(ticket);
        assert_eq!(fence, b"__lock_fence__unblock{user:1}".to_vec());
        assert_eq!(key_slot(&fence), key_slot(ticket));
        assert_eq!(fence_key(b"no-tag"), b"__lock_fence__unblock{}".to_vec());
    }

    #[test]
    fn the_fenced_unblock_replies_are_told_apart() {
        let queued = || Ok(Value::SimpleString("QUEUED".into()));
        let server = |text: &str| Err(LockError::Server(text.into()));
        let exec = |n| Ok(Value::Array(vec![Value::Int(0), Value::Int(n)]));
        let cases = [
            (
                vec![Ok(Value::Okay), queued(), queued(), exec(1)],
                Unblock::Done,
            ),
            (
                vec![Ok(Value::Okay), queued(), queued(), exec(0)],
                Unblock::NotBlocked,
            ),
            (
                vec![
                    Ok(Value::Okay),
                    server("MOVED 12 127.0.0.1:7001"),
                    queued(),
                    server("EXECABORT Transaction discarded"),
                ],
                Unblock::Redirected,
            ),
            (
                vec![
                    Ok(Value::Okay),
                    server("NOPERM User w has no permissions to run the 'del' command"),
                    queued(),
                    server("EXECABORT Transaction discarded"),
                ],
                Unblock::Refused,
            ),
            (vec![server("NOPERM multi")], Unblock::Refused),
        ];
        for (replies, expected) in cases {
            assert_eq!(unblocked(&Ok(replies)), expected);
        }
        assert_eq!(unblocked(&Err(timed_out())), Unblock::NotBlocked);
    }

    #[test]
    fn popped_answers_are_told_apart_by_their_first_byte() {
        let ask = Redirect {
            address: "127.0.0.1:7001".into(),
            asking: true,
        };
        let moved = Redirect {
            address: "10.0.0.2:6379".into(),
            asking: false,
        };
        let cases: [(&[u8], Said); 9] = [
            (b"1795352340123003", Said::Granted("1795352340123003")),
            (b"17 18", Said::Granted("17 18")),
            (b"timeout", Said::TimedOut),
            (b"expired", Said::Expired),
            (b"-ASK 3999 127.0.0.1:7001", Said::Redirect(ask)),
            (b"-MOVED 3999 10.0.0.2:6379", Said::Redirect(moved)),
            (
                b"-ERR too many waiters",
                Said::Error("ERR too many waiters"),
            ),
            (b"-ASK nonsense", Said::Error("ASK nonsense")),
            (b"what", Said::Unknown("what")),
        ];
        for (answer, expected) in cases {
            assert_eq!(
                said(answer),
                expected,
                "{}",
                String::from_utf8_lossy(answer)
            );
        }
    }
}
