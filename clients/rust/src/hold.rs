//! One hold as the client sees it (token, connection, local deadline, status), the connections
//! commands go through, and the task that notices an `EPHEMERAL` hold's connection close (the
//! keeper, `keeper.rs`, keeps holds alive).

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
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
        match self {
            Commands::Cluster(conn) => cmd
                .query_async::<Value>(&mut conn.clone())
                .await
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
    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<Value, LockError> {
        match self {
            HoldConn::Shared(commands) => commands.query(cmd).await,
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

/// One hold: what every guard of it, its tasks and the signal listener share.
pub(crate) struct HoldCore {
    pub(crate) key: Arc<[u8]>,
    pub(crate) owner: Arc<str>,
    /// `LOCK.RELEASE key owner` (the handle's).
    release: Arc<Cmd>,
    pub(crate) token: u64,
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
    pub(crate) key: Arc<[u8]>,
    pub(crate) owner: Arc<str>,
    pub(crate) release: Arc<Cmd>,
    pub(crate) token: u64,
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
            key: n.key,
            owner: n.owner,
            release: n.release,
            token: n.token,
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

    pub(crate) fn renew_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("LOCK.RENEW");
        cmd.arg(&*self.key)
            .arg(self.owner.as_bytes())
            .arg(millis(self.lease));
        cmd
    }

    pub(crate) fn release_cmd(&self) -> &Cmd {
        &self.release
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
