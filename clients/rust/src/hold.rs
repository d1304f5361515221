//! One hold as the client sees it (token, connection, local deadline, status), the connections
//! commands go through, and the tasks that keep a hold alive or notice its end.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, PushKind, Value};
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};

use crate::error::LockError;
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
        conn: tokio::sync::Mutex<Option<MultiplexedConnection>>,
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
            conn: tokio::sync::Mutex::new(None),
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
            } => {
                let mut conn = {
                    let mut slot = slot.lock().await;
                    match slot.as_ref() {
                        Some(conn) => conn.clone(),
                        None => {
                            let conn = client
                                .get_multiplexed_async_connection_with_config(config)
                                .await
                                .map_err(LockError::Connection)?;
                            *slot = Some(conn.clone());
                            conn
                        }
                    }
                };
                let reply = cmd.query_async::<Value>(&mut conn).await;
                if let Err(e) = &reply {
                    if e.code().is_none() {
                        // Broken or timed out: the next command starts on a new connection.
                        *slot.lock().await = None;
                    }
                }
                reply.map_err(LockError::from)
            }
        }
    }
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

    fn is_own(&self) -> bool {
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
    pub(crate) key: Vec<u8>,
    pub(crate) owner: Arc<str>,
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
}

/// What a hold is built from.
pub(crate) struct NewHold {
    pub(crate) key: Vec<u8>,
    pub(crate) owner: Arc<str>,
    pub(crate) token: u64,
    pub(crate) lease: Duration,
    pub(crate) conn: HoldConn,
    pub(crate) sent: Instant,
    pub(crate) signals: Option<Arc<SignalHub>>,
}

impl HoldCore {
    pub(crate) fn new(n: NewHold) -> Arc<HoldCore> {
        let deadline = n.sent + local_lease(n.lease);
        Arc::new(HoldCore {
            key: n.key,
            owner: n.owner,
            token: n.token,
            lease: n.lease,
            conn: n.conn,
            status: HoldStatus::new(),
            deadline: Mutex::new(deadline),
            runtime: tokio::runtime::Handle::try_current().ok(),
            signals: n.signals,
        })
    }

    /// Marks the hold lost (no effect once it was released or lost).
    pub(crate) fn lose(&self, reason: LostReason) {
        self.status.mark_lost(reason);
    }

    fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A command sent at `sent` set the lease again.
    pub(crate) fn extend(&self, sent: Instant) {
        let mut d = self.deadline.lock().unwrap_or_else(|p| p.into_inner());
        *d = (*d).max(sent + local_lease(self.lease));
    }

    fn renew_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("LOCK.RENEW");
        cmd.arg(&self.key)
            .arg(self.owner.as_bytes())
            .arg(millis(self.lease));
        cmd
    }

    pub(crate) fn release_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("LOCK.RELEASE");
        cmd.arg(&self.key).arg(self.owner.as_bytes());
        cmd
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

/// Keeps the hold alive (watchdog) or reports its lease end (fixed lease).
pub(crate) async fn keep(hold: Arc<HoldCore>, renewal: Renewal) {
    match renewal {
        Renewal::Fixed => loop {
            sleep_until(hold.deadline()).await;
            if Instant::now() >= hold.deadline() {
                hold.lose(LostReason::LeaseEnded);
                return;
            }
        },
        Renewal::Watchdog => watchdog(hold).await,
    }
}

/// Renews at a third of the lease on its own task, so a busy application task cannot starve
/// it. Ends when the hold is released (the releaser also aborts it) or lost.
async fn watchdog(hold: Arc<HoldCore>) {
    let interval = (hold.lease / 3).max(Duration::from_millis(1));
    let retry = interval.min(Duration::from_millis(100));
    let mut next = Instant::now() + interval;
    loop {
        tokio::select! {
            _ = sleep_until(next) => {}
            _ = sleep_until(hold.deadline()) => {
                hold.lose(LostReason::Unreachable);
                return;
            }
        }
        if !hold.status.is_active() {
            return;
        }
        let sent = Instant::now();
        let cmd = hold.renew_cmd();
        let reply = tokio::select! {
            r = hold.conn.query(&cmd) => r,
            _ = sleep_until(hold.deadline()) => {
                hold.lose(LostReason::Unreachable);
                return;
            }
        };
        match reply {
            Ok(Value::Int(1)) => {
                hold.extend(sent);
                next = sent + interval;
            }
            Ok(Value::Int(0)) => {
                hold.lose(LostReason::HoldGone);
                return;
            }
            Err(LockError::Server(text)) if is_final(&text) => {
                // WRONGTYPE, "not a lock": the key holds something else now.
                hold.lose(LostReason::HoldGone);
                return;
            }
            Err(_) if hold.conn.is_own() => {
                // An EPHEMERAL hold lives and dies with its connection.
                hold.lose(LostReason::ConnectionClosed);
                return;
            }
            _ => next = Instant::now() + retry,
        }
    }
}

/// Server errors after which the hold cannot be there any more (as opposed to LOADING, BUSY,
/// MASTERDOWN, ... which pass).
fn is_final(text: &str) -> bool {
    (text.starts_with("ERR ") && !text.contains("paused")) || text.starts_with("WRONGTYPE")
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
