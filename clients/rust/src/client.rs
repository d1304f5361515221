//! The client: connections, identity, and the factory of lock handles.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use redis::cluster::ClusterClientBuilder;
use redis::{ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};

use crate::backend::Backend;
use crate::conn::{Backends, Commands};
use crate::context::Context;
use crate::election::Election;
use crate::error::LockError;
use crate::keeper::Keepers;
use crate::lock::{Kind, Lock, Verb};
use crate::master::{watch_sentinels, Master, SentinelMaster};
use crate::multi::MultiLock;
use crate::naming::client_name;
use crate::node::Node;
use crate::servers::Servers;
use crate::signal::SignalHub;
use crate::tickets::Tickets;

/// The default time an ordinary command (acquire without waiting, renew, release) may take
/// before it counts as failed.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// Through Sentinel, the default time an acquire is sent again while no master answers (a
/// failover: [`LockClientBuilder::failover_timeout`]).
pub const DEFAULT_FAILOVER_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection to a server with the LOCK.* module, and the factory of [`Lock`] handles.
///
/// Cheap to clone (clones share connections and identity). Each client has a random unique id;
/// every handle it makes gets its own owner string `<client id>:<n>`, so two handles exclude
/// each other even for the same key, like two threads of a Redisson client.
///
/// Connections: one multiplexed connection for ordinary commands (replaced after it breaks),
/// one waiting connection that pops the tickets of all waiting acquires
/// ([`LockClientBuilder::wait_with_tickets`], the default; opened while they wait; in a
/// cluster, one per slot with waits, and one connection to each node the tickets are asked
/// on), or else one
/// fresh connection for each acquire that waits (so a long `WAIT` delays nothing else),
/// one connection owned by each `EPHEMERAL` hold, and one pub/sub connection for the server's
/// lost-hold signal (on by default; [`LockClientBuilder::without_lost_signal`] turns it off).
/// Each connection the client opens to a node is named `redis-lock-client:<client id>`
/// (`CLIENT SETNAME`; `CLIENT LIST` shows it beside the connection's id, which `LOCK.INFO`
/// gives as an `EPHEMERAL` hold's `ephemeral`) and says `CLIENT SETINFO LIB-NAME
/// redis-lock-client` with the crate's version (Redis >= 7.2, Valkey).
///
/// ```no_run
/// # async fn demo() -> Result<(), redis_lock_client::LockError> {
/// use redis_lock_client::LockClient;
///
/// let client = LockClient::open("redis://127.0.0.1:6379/").await?;
/// let lock = client.lock("orders:42"); // lease 30 s, renewed every 10 s; waits until granted
/// let mut guard = lock.acquire().await?;
/// println!("fencing token {}", guard.token());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockClient {
    pub(crate) inner: Arc<ClientInner>,
}

/// What clones of a client share: what its handles share, and the count of its handles.
pub(crate) struct ClientInner {
    ctx: Arc<Context>,
    next_handle: AtomicU64,
}

/// Settings of a [`LockClient`] beyond the defaults.
pub struct LockClientBuilder {
    target: Target,
    command_timeout: Duration,
    failover_timeout: Duration,
    lost_signal: bool,
    /// The lost-hold signal asked for by name ([`LockClientBuilder::listen_for_lost_signal`]):
    /// an acquire on a server whose backend has none is refused.
    lost_signal_asked: bool,
    lost_prefix: String,
    tickets: bool,
    load_functions: bool,
    /// A setting that does not apply to this target: refused by `build`.
    misused: Option<&'static str>,
}

/// One server, the master a set of Sentinels names, or the seed nodes of a cluster.
enum Target {
    Single(redis::Client),
    Sentinel {
        sentinels: Vec<ConnectionInfo>,
        master_name: String,
        /// The master's database, user, password, protocol.
        settings: RedisConnectionInfo,
    },
    Cluster(Vec<ConnectionInfo>),
}

impl LockClientBuilder {
    /// How long an ordinary command may take (default [`DEFAULT_COMMAND_TIMEOUT`]). A waiting
    /// acquire is not bound by it: its connection's read timeout is the wait plus a margin.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Does not listen to the server's lost-hold signal: losses are then seen only by the
    /// watchdog (a renewal answered 0, at most a third of a lease late) and by an `EPHEMERAL`
    /// hold's own connection. Saves the client's one pub/sub connection and a `SUBSCRIBE` per
    /// held key.
    ///
    /// By default a client listens wherever the server has the signal (the module; the
    /// `redislock` Functions library has none): the same default as the Python library's
    /// `lost_signal=None`.
    pub fn without_lost_signal(mut self) -> Self {
        self.lost_signal = false;
        self.lost_signal_asked = false;
        self
    }

    /// Listens to the server's lost-hold signal (the default, where the server has it; asked
    /// for by name, as the Python library's `lost_signal=True`, each acquire on a server with
    /// the `redislock` Functions library, which has no such signal, answers
    /// [`LockError::NotSupported`]) on one pub/sub connection, so that a hold
    /// ended by `LOCK.FORCERELEASE`, `DEL`, an overwrite, a rename, eviction, an `EPHEMERAL`
    /// connection's close or a lease end is reported at once, with the server's reason
    /// ([`LostReason`](crate::LostReason)).
    ///
    /// Standalone it `SUBSCRIBE`s; in a cluster it `SSUBSCRIBE`s on the key's node (the server
    /// `SPUBLISH`es there). Each message names its database and key (keys `k` and `{k}`, and
    /// one key name in two databases, share a channel), and a hold acts only on those about
    /// it: a message naming its owner and token reports it lost with the server's reason; one
    /// about its whole key (`DEL` of a key with several holds, ...) or a flush of its database
    /// (`lock.lost:flush`) is checked first with one `LOCK.CHECK`, and only a hold that read no
    /// longer finds is reported ([`LostReason::Flushed`](crate::LostReason::Flushed) for a
    /// flush); in a cluster, a key that moved with its slot is looked for on its new node, and
    /// the subscription follows it there. Pub/sub is at-most-once: the watchdog stays the
    /// backstop for a message that is never delivered.
    ///
    /// The channels are the server's default (`lock.lost:{<key>}`, `lock.lost:flush`); for a
    /// server whose `lock.lost-channel-prefix` is another, see
    /// [`LockClientBuilder::lost_signal_prefix`].
    pub fn listen_for_lost_signal(mut self) -> Self {
        self.lost_signal = true;
        self.lost_signal_asked = true;
        self
    }

    /// Listens for the lost-hold signal (as [`LockClientBuilder::listen_for_lost_signal`]) of
    /// a server whose `lock.lost-channel-prefix` is `prefix` instead of the default
    /// [`lock.lost`](crate::DEFAULT_LOST_SIGNAL_PREFIX): on `<prefix>:{<key>}` and
    /// `<prefix>:flush`. It must be the server's prefix (`CONFIG GET lock.lost-channel-prefix`):
    /// with another, no message is heard, and only the watchdog reports losses. An empty
    /// prefix (the server's signal turned off) is refused by [`LockClientBuilder::build`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), redis_lock_client::LockError> {
    /// use redis_lock_client::LockClient;
    ///
    /// // The server runs with `lock.lost-channel-prefix billing.lost`.
    /// let client = LockClient::builder(redis::Client::open("redis://127.0.0.1:6379/")?)
    ///     .lost_signal_prefix("billing.lost")
    ///     .build()
    ///     .await?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn lost_signal_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.lost_signal = true;
        self.lost_signal_asked = true;
        self.lost_prefix = prefix.into();
        self
    }

    /// Whether an acquire that waits does so with a ticket (default: `true`).
    ///
    /// With tickets, a waiting acquire is sent on the client's shared connection with
    /// `LOCK.ACQUIRE ... WAIT ms TICKET`; when it must queue, the server answers at once with a
    /// ticket, and the client's **one waiting connection** (opened when a ticket first waits,
    /// closed when none has waited for two seconds) pops the answers of all its waiting
    /// acquires with one `BLPOP` (interrupted with `CLIENT UNBLOCK` when another ticket joins).
    /// A waiter costs the server under a kilobyte instead of about 36 KB, and a client that
    /// waits for many locks keeps one connection instead of one per wait. The queue, its FIFO
    /// order and its timeouts are the same. An acquire that gives up (its future dropped)
    /// withdraws its ticket with `LOCK.CANCEL`, and releases a grant that came meanwhile. If
    /// the shared connection closes while tickets wait (the server drops them), each waiting
    /// acquire asks again on the new one; after a failover, on the new master.
    ///
    /// In a cluster a ticket lives in its lock's slot and one `BLPOP` names keys of one slot
    /// only: tickets are asked on a connection of the client's own to the node that serves the
    /// key (one per node), and popped on one waiting connection per slot with waits, on that
    /// node (a waiting connection no slot needs any more is reused by the next, and closed
    /// after two seconds unused). A ticket whose lock left with its slot is asked again where
    /// the redirect says; a `BLPOP` the server redirects is sent there, never the acquire.
    ///
    /// An `EPHEMERAL` wait (and so an election's campaign, unless [`Election::not_ephemeral`])
    /// asks with `TICKET` on a new connection of its own, the one its hold will be bound to
    /// (the server binds the hold to the connection that asks), and its ticket is popped with
    /// the others; if that connection fails while the ticket waits, it asks again on a new one.
    ///
    /// `false`: each waiting acquire blocks on a connection of its own
    /// (`LOCK.ACQUIRE ... WAIT ms`), as before.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), redis_lock_client::LockError> {
    /// use redis_lock_client::LockClient;
    ///
    /// let client = LockClient::builder(redis::Client::open("redis://127.0.0.1:6379/")?)
    ///     .wait_with_tickets(false) // one blocked connection per waiting acquire
    ///     .build()
    ///     .await?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn wait_with_tickets(mut self, tickets: bool) -> Self {
        self.tickets = tickets;
        self
    }

    /// On a server without the module whose `redislock` Functions library is missing or older
    /// than this crate's (default `false`): `true` loads the crate's copy of
    /// `functions/redislock.lua` (`FUNCTION LOAD REPLACE`, which needs `+function|load`) at the
    /// first lock command to that server (in a cluster, to each master), instead of answering
    /// [`LockError::NotSupported`] there. See [`LockClient::backend`].
    pub fn load_functions(mut self, load: bool) -> Self {
        self.load_functions = load;
        self
    }

    /// Through Sentinel ([`LockClient::sentinel_builder`]): how long an acquire (waiting or
    /// not, not `EPHEMERAL`) whose master failed is sent again, with growing pauses, while no
    /// master answers (default [`DEFAULT_FAILOVER_TIMEOUT`], 30 s); then it answers
    /// [`LockError::Connection`]. Elsewhere refused by [`LockClientBuilder::build`].
    pub fn failover_timeout(mut self, timeout: Duration) -> Self {
        match &self.target {
            Target::Sentinel { .. } => self.failover_timeout = timeout,
            _ => self.misused = Some("failover_timeout applies to a client through Sentinel"),
        }
        self
    }

    /// Through Sentinel ([`LockClient::sentinel_builder`]): the master's database, user,
    /// password and protocol (the Sentinels' own come with their URLs). Default: database 0, no
    /// password, RESP2. Elsewhere the URL carries them, and this is refused by
    /// [`LockClientBuilder::build`] ([`LockError::InvalidArgument`]).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), redis_lock_client::LockError> {
    /// use redis_lock_client::LockClient;
    ///
    /// let client = LockClient::sentinel_builder(["redis://10.0.0.1:26379/"], "orders")?
    ///     .master_settings(redis::RedisConnectionInfo::default().set_db(2).set_password("secret"))
    ///     .build()
    ///     .await?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn master_settings(mut self, settings: RedisConnectionInfo) -> Self {
        match &mut self.target {
            Target::Sentinel { settings: s, .. } => *s = settings,
            _ => self.misused = Some("master_settings applies to a client through Sentinel"),
        }
        self
    }

    /// Connects (one `PING` on the shared connection) and returns the client.
    pub async fn build(self) -> Result<LockClient, LockError> {
        if let Some(why) = self.misused {
            return Err(LockError::InvalidArgument(why));
        }
        if self.lost_signal && self.lost_prefix.is_empty() {
            return Err(LockError::InvalidArgument(
                "an empty lost-signal prefix: the server sends no lost-hold signal with one",
            ));
        }
        let id = random_id();
        let name = client_name(&id);
        let prefix = self.lost_prefix.as_bytes();
        let tickets_on = self.tickets;
        let timeout = self.command_timeout;
        let tickets = |master: &Arc<Master>, commands: &Arc<Commands>, name: &String| {
            tickets_on.then(|| {
                Arc::new(Tickets::single(
                    master.clone(),
                    commands.clone(),
                    name.clone(),
                    timeout,
                ))
            })
        };
        let (servers, commands, signals, db, tickets) = match self.target {
            Target::Single(client) => {
                let info = client.get_connection_info().clone();
                let db = info.redis_settings().db();
                let master = Arc::new(Master::Fixed(Node::from_info(info)?));
                let commands = Arc::new(Commands::single(
                    master.clone(),
                    self.command_timeout,
                    name.clone(),
                    self.load_functions,
                ));
                let signals = self
                    .lost_signal
                    .then(|| SignalHub::single(master.clone(), prefix, name.clone()));
                let tickets = tickets(&master, &commands, &name);
                (Servers::Single(master), commands, signals, db, tickets)
            }
            Target::Sentinel {
                sentinels,
                master_name,
                settings,
            } => {
                let db = settings.db();
                let sentinel = Arc::new(SentinelMaster::new(
                    sentinels,
                    master_name,
                    settings,
                    self.command_timeout,
                )?);
                // Follows the Sentinels while the client lives (on the runtime it is built on).
                tokio::spawn(watch_sentinels(Arc::downgrade(&sentinel)));
                let master = Arc::new(Master::Sentinel(sentinel));
                let commands = Arc::new(Commands::single(
                    master.clone(),
                    self.command_timeout,
                    name.clone(),
                    self.load_functions,
                ));
                let signals = self
                    .lost_signal
                    .then(|| SignalHub::single(master.clone(), prefix, name.clone()));
                let tickets = tickets(&master, &commands, &name);
                (Servers::Single(master), commands, signals, db, tickets)
            }
            Target::Cluster(seeds) => {
                let Some(seed) = seeds.first().cloned() else {
                    return Err(LockError::InvalidArgument("a cluster needs a seed node"));
                };
                let conn = ClusterClientBuilder::new(seeds.clone())
                    .connection_timeout(self.command_timeout)
                    .response_timeout(self.command_timeout)
                    .build()
                    .map_err(LockError::Connection)?
                    .get_async_connection()
                    .await
                    .map_err(LockError::Connection)?;
                let signals = self
                    .lost_signal
                    .then(|| SignalHub::cluster(seeds, prefix, name.clone()));
                let commands = Arc::new(Commands::Cluster(
                    conn.clone(),
                    Backends::new(self.load_functions),
                ));
                let slots: crate::servers::SlotMap = Arc::default();
                let tickets = tickets_on.then(|| {
                    Arc::new(Tickets::cluster(
                        seed.clone(),
                        slots.clone(),
                        commands.clone(),
                        name.clone(),
                        timeout,
                    ))
                });
                let servers = Servers::Cluster {
                    info: seed,
                    conn,
                    slots,
                };
                (servers, commands, signals, 0, tickets)
            }
        };
        commands.query(&redis::cmd("PING")).await?;
        Ok(LockClient {
            inner: Arc::new(ClientInner {
                ctx: Arc::new(Context {
                    servers,
                    commands,
                    id,
                    name,
                    db,
                    command_timeout: self.command_timeout,
                    failover_timeout: self.failover_timeout,
                    signals,
                    lost_signal_asked: self.lost_signal_asked,
                    tickets,
                    keepers: Keepers::new(),
                }),
                next_handle: AtomicU64::new(1),
            }),
        })
    }
}

impl LockClient {
    /// A client with the default settings (the lost-hold signal listened to, commands timed
    /// out after [`DEFAULT_COMMAND_TIMEOUT`]) on the server of `client`, a
    /// [`redis::Client`] (add `redis = "1.8"` to your dependencies to make one). Connects once to
    /// check it.
    pub async fn new(client: redis::Client) -> Result<LockClient, LockError> {
        LockClient::builder(client).build().await
    }

    /// [`LockClient::new`] from a URL such as `redis://127.0.0.1:6379/` (`redis://host:port/db`
    /// for another database): the default settings, the lost-hold signal listened to.
    pub async fn open(url: &str) -> Result<LockClient, LockError> {
        let client = redis::Client::open(url).map_err(LockError::Connection)?;
        LockClient::new(client).await
    }

    /// Settings beyond the defaults ([`LockClientBuilder`]) for the server of `client`, a
    /// [`redis::Client`]: the library is built on the `redis` crate, so add `redis = "1.8"`
    /// beside it in your `Cargo.toml` to make one (`redis::Client::open(url)?`; its URL
    /// carries the database, user and password).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), redis_lock_client::LockError> {
    /// use std::time::Duration;
    /// use redis_lock_client::LockClient;
    ///
    /// let client = LockClient::builder(redis::Client::open("redis://127.0.0.1:6379/2")?)
    ///     .command_timeout(Duration::from_secs(5)) // default 2 s
    ///     .without_lost_signal()                    // default: listened to
    ///     .build()
    ///     .await?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn builder(client: redis::Client) -> LockClientBuilder {
        LockClientBuilder {
            target: Target::Single(client),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            failover_timeout: DEFAULT_FAILOVER_TIMEOUT,
            lost_signal: true,
            lost_signal_asked: false,
            load_functions: false,
            lost_prefix: crate::DEFAULT_LOST_SIGNAL_PREFIX.to_string(),
            tickets: true,
            misused: None,
        }
    }

    /// A client of a Redis Cluster with the default settings, from the URLs of one or more of
    /// its nodes (`redis://127.0.0.1:7000/`; the others are found from these).
    pub async fn cluster<T: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = T>,
    ) -> Result<LockClient, LockError> {
        LockClient::cluster_builder(nodes)?.build().await
    }

    /// [`LockClient::cluster`] with settings beyond the defaults. In a cluster, ordinary
    /// commands go through the `redis` crate's cluster connection (routed by key, `MOVED` and
    /// `ASK` followed); a waiting acquire's ticket is asked on the client's own connection to
    /// the master of the key's slot and popped there ([`LockClientBuilder::wait_with_tickets`]),
    /// a blocking wait and an `EPHEMERAL` hold get a connection of their own to that master,
    /// found in the client's copy of the slot map (read with
    /// `CLUSTER SLOTS` when first needed, dropped by a `MOVED`; `MOVED` and `ASK` are followed
    /// there too); the lost-hold signal is heard with `SSUBSCRIBE` on that node.
    pub fn cluster_builder<T: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = T>,
    ) -> Result<LockClientBuilder, LockError> {
        let seeds = nodes
            .into_iter()
            .map(|n| n.into_connection_info())
            .collect::<Result<Vec<_>, _>>()
            .map_err(LockError::Connection)?;
        Ok(LockClientBuilder {
            target: Target::Cluster(seeds),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            failover_timeout: DEFAULT_FAILOVER_TIMEOUT,
            lost_signal: true,
            lost_signal_asked: false,
            load_functions: false,
            lost_prefix: crate::DEFAULT_LOST_SIGNAL_PREFIX.to_string(),
            tickets: true,
            misused: None,
        })
    }

    /// A client of the master a set of Sentinels monitors under `master_name`, with the default
    /// settings, from the URLs of one or more Sentinels (`redis://10.0.0.1:26379/`). See
    /// [`LockClient::sentinel_builder`].
    pub async fn sentinel<T: IntoConnectionInfo>(
        sentinels: impl IntoIterator<Item = T>,
        master_name: &str,
    ) -> Result<LockClient, LockError> {
        LockClient::sentinel_builder(sentinels, master_name)?
            .build()
            .await
    }

    /// [`LockClient::sentinel`] with settings beyond the defaults (the master's database and
    /// password: [`LockClientBuilder::master_settings`]).
    ///
    /// The client asks the Sentinels for the master (and checks with `ROLE` that it says it is
    /// one) when it first needs it, and again whenever the one it knew fails: a connection to
    /// it that cannot be made or breaks, or a reply that says it is a replica now (`READONLY`).
    /// So after a failover:
    /// - the client follows the Sentinels (their `+switch-master` message, and a poll every
    ///   second): once they name a new master, every command goes there, and an answer that
    ///   arrives after the change from a connection to the old master is taken for none (a
    ///   paused old master that comes back is still a master until the Sentinels demote it:
    ///   its grants and renewals no longer count). A failed connection, or `READONLY`, also
    ///   sends the client to the Sentinels;
    /// - renewals, releases and fenced commands are not sent again (as after any broken
    ///   connection): the watchdog renews again soon;
    /// - an **acquire**, waiting or not (`try_acquire()`, `acquire()`, a multi-key acquire, a
    ///   campaign that is not `EPHEMERAL`), whose master fails is **sent again** to the master
    ///   the Sentinels name, with a pause of 50 ms doubling up to 250 ms, until a master answers or
    ///   the failover timeout passes ([`LockClientBuilder::failover_timeout`], 30 s; then
    ///   [`LockError::Connection`]); a wait is issued again on the new master for what is left
    ///   of it (its place in the old master's queue is gone: waiters are not replicated). A
    ///   wait on a master the Sentinels replaced is ended at once. `ONCE` makes that safe;
    /// - an **`EPHEMERAL`** hold's connection is gone with the old master: the hold is reported
    ///   lost ([`LostReason::ConnectionClosed`](crate::LostReason::ConnectionClosed)), and an
    ///   `EPHEMERAL` acquire (or campaign) on the way answers [`LockError::Connection`];
    /// - the watchdog renews on the new master: a hold the new master has (the replica had
    ///   received it) keeps being renewed, one it has not is reported lost at the first renewal
    ///   answered 0 ([`LostReason::HoldGone`](crate::LostReason::HoldGone));
    /// - the lost-hold signal and an observer's leader channel subscribe again on the new
    ///   master (an observer reads `LOCK.LEADER` there); what was published meanwhile is gone,
    ///   the watchdog stays the backstop.
    ///
    /// A grant the old master made but never replicated is lost with it: see
    /// [`Lock::replicas`](crate::Lock::replicas) for grants acknowledged by replicas.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), redis_lock_client::LockError> {
    /// use redis_lock_client::LockClient;
    ///
    /// let sentinels = ["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/", "redis://10.0.0.3:26379/"];
    /// let client = LockClient::sentinel(sentinels, "orders").await?;
    /// let mut guard = client.lock("orders:42").acquire().await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn sentinel_builder<T: IntoConnectionInfo>(
        sentinels: impl IntoIterator<Item = T>,
        master_name: &str,
    ) -> Result<LockClientBuilder, LockError> {
        let sentinels = sentinels
            .into_iter()
            .map(|n| n.into_connection_info())
            .collect::<Result<Vec<_>, _>>()
            .map_err(LockError::Connection)?;
        Ok(LockClientBuilder {
            target: Target::Sentinel {
                sentinels,
                master_name: master_name.to_string(),
                settings: RedisConnectionInfo::default(),
            },
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            failover_timeout: DEFAULT_FAILOVER_TIMEOUT,
            lost_signal: true,
            lost_signal_asked: false,
            load_functions: false,
            lost_prefix: crate::DEFAULT_LOST_SIGNAL_PREFIX.to_string(),
            tickets: true,
            misused: None,
        })
    }

    /// What serves the locks on the server ([`Backend::Module`] or [`Backend::Functions`];
    /// [`Backend::supports_ephemeral`] says whether holds can be `EPHEMERAL`), found at the
    /// first lock command to it, or now (this asks it; with
    /// [`LockClientBuilder::load_functions`], a server without either gets the library loaded).
    /// [`LockError::NotSupported`] when the server has neither (and `load_functions` is off), as
    /// every lock command to it answers. In a cluster each master is asked on its own: use
    /// [`LockClient::backend_of`] ([`LockError::InvalidArgument`] here).
    pub async fn backend(&self) -> Result<Backend, LockError> {
        if self.is_cluster() {
            return Err(LockError::InvalidArgument(
                "in a cluster, name a key (backend_of): each master is asked on its own",
            ));
        }
        self.inner.ctx.commands.backend(b"").await
    }

    /// [`LockClient::backend`] of the server that serves `key` (in a cluster, the master of its
    /// slot).
    pub async fn backend_of(&self, key: impl AsRef<[u8]>) -> Result<Backend, LockError> {
        self.inner.ctx.commands.backend(key.as_ref()).await
    }

    /// Whether this client talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.inner.ctx.servers.is_cluster()
    }

    /// This client's random unique id (32 hex digits), the prefix of its handles' owners.
    pub fn id(&self) -> &str {
        &self.inner.ctx.id
    }

    /// A handle on the exclusive lock of `key` (also the write side of its read-write lock).
    pub fn lock(&self, key: impl AsRef<[u8]>) -> Lock {
        self.handle(key.as_ref(), Kind::Exclusive)
    }

    /// A handle on a shared (read) hold of `key`: any number of readers together, excluded by
    /// an exclusive holder ([`LockClient::lock`] on the same key).
    pub fn read_lock(&self, key: impl AsRef<[u8]>) -> Lock {
        self.handle(key.as_ref(), Kind::Shared)
    }

    /// A handle on one permit of the counting semaphore `key` with `limit` permits
    /// (`LOCK.ACQUIRE ... LIMIT n`; every holder of the key must name the same limit,
    /// 1 ..= 1,000: the server refuses another, [`LockError::Server`]).
    pub fn semaphore(&self, key: impl AsRef<[u8]>, limit: u32) -> Lock {
        self.handle(key.as_ref(), Kind::Permit { limit })
    }

    /// A handle on several keys taken together, exclusively (`LOCK.MACQUIRE`; shared with
    /// [`MultiLock::shared`]): every key at one instant or none, a fencing token per key, one
    /// watchdog, one release. See [`MultiLock`].
    ///
    /// ```no_run
    /// # async fn demo(client: redis_lock_client::LockClient) -> Result<(), redis_lock_client::LockError> {
    /// let stock = client.multi_lock(["{wh}:east", "{wh}:west"]);
    /// if let Some(guard) = stock.try_acquire().await? {
    ///     println!("tokens {:?}", guard.tokens()); // in the keys' order
    /// }
    /// # Ok(()) }
    /// ```
    pub fn multi_lock<K: AsRef<[u8]>>(&self, keys: impl IntoIterator<Item = K>) -> MultiLock {
        MultiLock::new(Lock::new(
            self.inner.ctx.clone(),
            crate::multi::keys_of(keys),
            self.next_owner(),
            Kind::Exclusive,
            Verb::MultiAcquire,
        ))
    }

    /// A handle on the election `key` for a new candidate (named like a handle's owner): see
    /// [`Election`].
    ///
    /// ```no_run
    /// # async fn demo(client: redis_lock_client::LockClient) -> Result<(), redis_lock_client::LockError> {
    /// let election = client.election("scheduler");
    /// if let Some(leader) = election.leader().await? {
    ///     println!("{} leads in epoch {}", leader.candidate_str(), leader.epoch);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn election(&self, key: impl AsRef<[u8]>) -> Election {
        Election::new(Lock::new(
            self.inner.ctx.clone(),
            vec![key.as_ref().into()],
            self.next_owner(),
            Kind::Exclusive,
            Verb::Campaign,
        ))
    }

    fn handle(&self, key: &[u8], kind: Kind) -> Lock {
        Lock::new(
            self.inner.ctx.clone(),
            vec![key.into()],
            self.next_owner(),
            kind,
            Verb::Acquire,
        )
    }

    /// A new owner string: `<client id>:<n>`.
    pub(crate) fn next_owner(&self) -> Arc<str> {
        let n = self.inner.next_handle.fetch_add(1, Ordering::Relaxed);
        format!("{}:{n}", self.inner.ctx.id).into()
    }
}

fn random_id() -> String {
    let bytes: [u8; 16] = rand::thread_rng().gen();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
