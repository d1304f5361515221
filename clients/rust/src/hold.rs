//! One hold as the client sees it (token, connection, local deadline, status), the connections
//! commands go through, and the task that notices an `EPHEMERAL` hold's connection close (the
//! keeper, `keeper.rs`, keeps holds alive).

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{AsyncConnectionConfig, Cmd, PushKind, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::LockError;
use crate::keeper::{Keeper, Place};
use crate::lost::{HoldStatus, LostReason};
use crate::signal::SignalHub;

/// The client's shared connection for ordinary commands (acquire without WAIT, renew, release,
/// `LOCK.INFO`): a multiplexed connection to the one server, replaced by a new one after it
/// breaks, or the cluster connection, which routes by key, follows `MOVED`/`ASK` and reconnects
/// by itself.
// One per client, made once and never moved: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Commands {
    Single {
        client: redis::Client,
        config: AsyncConnectionConfig,
        /// The current connection: cloned under this lock (no await while it is held).
        conn: Mutex<Option<MultiplexedConnection>>,
        /// Held while (re)connecting, so that one task connects and the others wait for it.
        connecting: tokio::sync::Mutex<()>,
    },
    Cluster(ClusterConnection),
}

impl Commands {
    pub(crate) fn new(client: redis::Client, timeout: Duration) -> Commands {
        Commands::Single {
            client,
            config: AsyncConnectionConfig::new()
                .set_response_timeout(Some(timeout))
                .set_connection_timeout(Some(timeout)),
            conn: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<Value, LockError> {
        self.query_routed(cmd, None).await
    }

    /// `cmd`, in a cluster sent to the master of `key`'s slot when `key` is given (a command
    /// whose first argument is not its key, such as `LOCK.MACQUIRE numkeys key ...`, would
    /// otherwise be routed by its first argument and take a `MOVED`).
    pub(crate) async fn query_routed(
        &self,
        cmd: &Cmd,
        key: Option<&[u8]>,
    ) -> Result<Value, LockError> {
        match self {
            Commands::Cluster(conn) => match key {
                None => cmd.query_async::<Value>(&mut conn.clone()).await,
                Some(key) => {
                    let route = Route::new(crate::servers::key_slot(key), SlotAddr::Master);
                    conn.clone()
                        .route_command(
                            cmd.clone(),
                            RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                        )
                        .await
                        // Routed, a server's error reply comes back as a value.
                        .and_then(Value::extract_error)
                }
            }
            .map_err(LockError::from),
            Commands::Single {
                client,
                config,
                conn: slot,
                connecting,
            } => {
                let current = relock(slot).clone();
                let mut conn = match current {
                    Some(conn) => conn,
                    None => {
                        let _connecting = connecting.lock().await;
                        let current = relock(slot).clone();
                        match current {
                            Some(conn) => conn,
                            None => {
                                let conn = client
                                    .get_multiplexed_async_connection_with_config(config)
                                    .await
                                    .map_err(LockError::Connection)?;
                                *relock(slot) = Some(conn.clone());
                                conn
                            }
                        }
                    }
                };
                let reply = cmd.query_async::<Value>(&mut conn).await;
                if let Err(e) = &reply {
                    if e.code().is_none() {
                        // Broken or timed out: the next command starts on a new connection.
                        *relock(slot) = None;
                    }
                }
                reply.map_err(LockError::from)
            }
        }
    }
}

fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only whole values are stored under these locks: a poisoned one is used as it is.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The connection a hold's renewals and release go through.
pub(crate) enum HoldConn {
    /// The client's shared connection.
    Shared(Arc<Commands>),
    /// A connection of the hold's own (`EPHEMERAL`): the hold is bound to it, so it must never
    /// be replaced; when it breaks, the hold is gone.
    Own(MultiplexedConnection),
}

impl HoldConn {
    /// `cmd` on the hold's connection; in a cluster, the shared connection sends it to the
    /// master of `key`'s slot.
    pub(crate) async fn query(&self, cmd: &Cmd, key: &[u8]) -> Result<Value, LockError> {
        match self {
            HoldConn::Shared(commands) => commands.query_routed(cmd, Some(key)).await,
            HoldConn::Own(conn) => {
                let mut conn = conn.clone();
                cmd.query_async::<Value>(&mut conn)
                    .await
                    .map_err(LockError::from)
            }
        }
    }

    pub(crate) fn is_own(&self) -> bool {
        matches!(self, HoldConn::Own(_))
    }
}

/// How a hold's lease is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// The watchdog renews at a third of the lease.
    Watchdog,
    /// Nothing renews; the hold is reported lost at its lease end.
    Fixed,
}

/// The keys of a hold and how its commands name them: one key (`LOCK.RENEW key ...`), or
/// several held together (`LOCK.MRENEW numkeys key ...`, `LOCK.MRELEASE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    One,
    Many,
}

/// One hold: what every guard of it, its tasks and the signal listener share. A hold of several
/// keys (`LOCK.MACQUIRE`) is one hold: one status, one renewal, one release.
pub(crate) struct HoldCore {
    /// The keys, in the order given (one for an ordinary hold); never empty.
    pub(crate) keys: Arc<[Arc<[u8]>]>,
    pub(crate) form: Form,
    pub(crate) owner: Arc<str>,
    /// `LOCK.RELEASE key owner` or `LOCK.MRELEASE n key... owner` (the handle's).
    release: Arc<Cmd>,
    /// A fencing token per key, in the keys' order.
    pub(crate) tokens: Arc<[u64]>,
    pub(crate) lease: Duration,
    pub(crate) conn: HoldConn,
    pub(crate) status: HoldStatus,
    /// The local lease end: the send time of the last command that set the lease, plus the
    /// lease, minus a drift margin.
    deadline: Mutex<Instant>,
    /// The runtime the hold was acquired on: a guard dropped anywhere releases through it.
    pub(crate) runtime: Option<tokio::runtime::Handle>,
    pub(crate) signals: Option<Arc<SignalHub>>,
    /// How the lease is kept, and who keeps it.
    pub(crate) renewal: Renewal,
    pub(crate) keeper: Arc<Keeper>,
    place: Mutex<Place>,
}

/// What a hold is built from.
pub(crate) struct NewHold {
    pub(crate) keys: Arc<[Arc<[u8]>]>,
    pub(crate) form: Form,
    pub(crate) owner: Arc<str>,
    pub(crate) release: Arc<Cmd>,
    pub(crate) tokens: Arc<[u64]>,
    pub(crate) lease: Duration,
    pub(crate) conn: HoldConn,
    pub(crate) sent: Instant,
    pub(crate) signals: Option<Arc<SignalHub>>,
    pub(crate) renewal: Renewal,
    pub(crate) keeper: Arc<Keeper>,
}

impl HoldCore {
    pub(crate) fn new(n: NewHold) -> Arc<HoldCore> {
        let deadline = n.sent + local_lease(n.lease);
        Arc::new(HoldCore {
            keys: n.keys,
            form: n.form,
            owner: n.owner,
            release: n.release,
            tokens: n.tokens,
            lease: n.lease,
            conn: n.conn,
            status: HoldStatus::new(),
            deadline: Mutex::new(deadline),
            runtime: tokio::runtime::Handle::try_current().ok(),
            signals: n.signals,
            renewal: n.renewal,
            keeper: n.keeper,
            place: Mutex::new(Place::default()),
        })
    }

    /// Puts the new hold on its keeper's schedule: the first renewal a third of a lease after
    /// the acquire's send, or the end of a fixed lease.
    pub(crate) fn start_keeping(self: &Arc<Self>, sent: Instant) {
        let at = match self.renewal {
            Renewal::Watchdog => sent + crate::keeper::renew_interval(self.lease),
            Renewal::Fixed => self.deadline(),
        };
        self.keeper.schedule(self, at);
    }

    /// Its place with the keeper (only under the keeper's schedule lock).
    pub(crate) fn place(&self) -> MutexGuard<'_, Place> {
        self.place.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the hold lost (no effect once it was released or lost).
    pub(crate) fn lose(&self, reason: LostReason) {
        self.status.mark_lost(reason);
    }

    pub(crate) fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A command sent at `sent` set the lease again.
    pub(crate) fn extend(&self, sent: Instant) {
        let mut d = self.deadline.lock().unwrap_or_else(|p| p.into_inner());
        *d = (*d).max(sent + local_lease(self.lease));
    }

    /// The first key: the one commands are routed by (all keys of a hold share a slot).
    pub(crate) fn key(&self) -> &[u8] {
        self.keys.first().map_or(&[], |k| k)
    }

    /// The first key's token (an ordinary hold's only one).
    pub(crate) fn token(&self) -> u64 {
        self.tokens.first().copied().unwrap_or(0)
    }

    /// `cmd` on the hold's connection (in a cluster, to its keys' master).
    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<Value, LockError> {
        self.conn.query(cmd, self.key()).await
    }

    /// `LOCK.RENEW key owner lease`, or `LOCK.MRENEW n key... owner lease`.
    pub(crate) fn renew_cmd(&self) -> Cmd {
        let mut cmd = match self.form {
            Form::One => redis::cmd("LOCK.RENEW"),
            Form::Many => {
                let mut cmd = redis::cmd("LOCK.MRENEW");
                cmd.arg(self.keys.len());
                cmd
            }
        };
        for key in self.keys.iter() {
            cmd.arg(&**key);
        }
        cmd.arg(self.owner.as_bytes()).arg(millis(self.lease));
        cmd
    }

    pub(crate) fn release_cmd(&self) -> &Cmd {
        &self.release
    }
}

/// What a renewal's reply says: `Some(true)` every key renewed (`1`, or `[1, 1, ...]`),
/// `Some(false)` the server no longer has the hold on some key (`0` anywhere), `None` a reply
/// no renewal gives.
pub(crate) fn renewed(reply: &Value) -> Option<bool> {
    match reply {
        Value::Int(1) => Some(true),
        Value::Int(0) => Some(false),
        Value::Array(items) if !items.is_empty() => {
            let mut all = true;
            for item in items {
                match item {
                    Value::Int(1) => {}
                    Value::Int(0) => all = false,
                    _ => return None,
                }
            }
            Some(all)
        }
        _ => None,
    }
}

/// What a release's reply says: `Some(true)` the server released every key (`remaining`, or an
/// array of them), `Some(false)` it did not have the hold on some key (nil anywhere: the others
/// were released all the same), `None` a reply no release gives.
pub(crate) fn released(reply: &Value) -> Option<bool> {
    match reply {
        Value::Int(_) => Some(true),
        Value::Nil => Some(false),
        Value::Array(items) if !items.is_empty() => {
            let mut all = true;
            for item in items {
                match item {
                    Value::Int(_) => {}
                    Value::Nil => all = false,
                    _ => return None,
                }
            }
            Some(all)
        }
        _ => None,
    }
}

/// The lease minus the drift margin (a tenth): how long after a send the client still trusts
/// the hold without hearing from the server.
fn local_lease(lease: Duration) -> Duration {
    lease - lease / 10
}

/// Whole milliseconds, at least 1 (the server takes leases and timeouts in ms).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// A connection of its own: a waiting acquire's, or an `EPHEMERAL` hold's.
pub(crate) struct OwnConnection {
    pub(crate) conn: MultiplexedConnection,
    /// The push channel of an `EPHEMERAL` hold's connection, so that its close is seen at once,
    /// not at the next renewal.
    pub(crate) pushes: Option<mpsc::UnboundedReceiver<redis::PushInfo>>,
}

/// Opens a connection of its own to `client`'s server, with a push channel if `pushes` (the
/// client must speak RESP3 then). No response timeout: the caller bounds each command.
pub(crate) async fn own_connection(
    client: &redis::Client,
    pushes: bool,
    timeout: Duration,
) -> Result<OwnConnection, LockError> {
    let mut config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(None);
    let mut rx = None;
    if pushes {
        let (tx, receiver) = mpsc::unbounded_channel();
        config = config.set_push_sender(tx);
        rx = Some(receiver);
    }
    let conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(LockError::Connection)?;
    Ok(OwnConnection { conn, pushes: rx })
}

/// Reports an `EPHEMERAL` hold lost when its connection closes.
pub(crate) async fn watch_connection(
    hold: Weak<HoldCore>,
    mut pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
) {
    loop {
        let closed = match pushes.recv().await {
            None => true,
            Some(push) => push.kind == PushKind::Disconnection,
        };
        if closed {
            if let Some(hold) = hold.upgrade() {
                hold.lose(LostReason::ConnectionClosed);
            }
            return;
        }
    }
}
