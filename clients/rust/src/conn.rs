//! The connections commands go through: the client's shared one, a hold's, and connections of
//! their own (a waiting acquire's, an `EPHEMERAL` hold's), each named (`naming.rs`).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{AsyncConnectionConfig, Cmd, Value};
use tokio::sync::mpsc;

use crate::error::LockError;
use crate::naming::setname;

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
        /// `CLIENT SETNAME` sent on each new connection.
        name: String,
        /// The current connection: cloned under this lock (no await while it is held).
        conn: Mutex<Option<MultiplexedConnection>>,
        /// Held while (re)connecting, so that one task connects and the others wait for it.
        connecting: tokio::sync::Mutex<()>,
    },
    Cluster(ClusterConnection),
}

impl Commands {
    pub(crate) fn single(client: redis::Client, timeout: Duration, name: String) -> Commands {
        Commands::Single {
            client,
            config: AsyncConnectionConfig::new()
                .set_response_timeout(Some(timeout))
                .set_connection_timeout(Some(timeout)),
            name,
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
                name,
                conn: slot,
                connecting,
            } => {
                let current = relock(slot).clone();
                // A new connection sends its name with its first command: one round trip.
                let (mut conn, new) = match current {
                    Some(conn) => (conn, false),
                    None => {
                        let _connecting = connecting.lock().await;
                        let current = relock(slot).clone();
                        match current {
                            Some(conn) => (conn, false),
                            None => {
                                let conn = client
                                    .get_multiplexed_async_connection_with_config(config)
                                    .await
                                    .map_err(LockError::Connection)?;
                                *relock(slot) = Some(conn.clone());
                                (conn, true)
                            }
                        }
                    }
                };
                let reply = if new {
                    first_query(&mut conn, name, false, cmd).await
                } else {
                    cmd.query_async::<Value>(&mut conn).await
                };
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

pub(crate) fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
}

/// A connection of its own: a waiting acquire's, or an `EPHEMERAL` hold's.
pub(crate) struct OwnConnection {
    pub(crate) conn: MultiplexedConnection,
    /// The push channel of an `EPHEMERAL` hold's connection, so that its close is seen at once,
    /// not at the next renewal.
    pub(crate) pushes: Option<mpsc::UnboundedReceiver<redis::PushInfo>>,
}

/// Opens a connection of its own to `client`'s server, with a push channel if `pushes` (the
/// client must speak RESP3 then). No response timeout: the caller bounds each command. Its name
/// goes with its first command ([`first_query`]).
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

/// The first command on a new connection of its own, in one round trip with `CLIENT SETNAME`
/// (and `ASKING` when a redirect said so): `cmd`'s reply, a server error as an error.
pub(crate) async fn first_query(
    conn: &mut MultiplexedConnection,
    name: &str,
    asking: bool,
    cmd: &Cmd,
) -> redis::RedisResult<Value> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.add_command(setname(name)).ignore();
    if asking {
        pipe.cmd("ASKING").ignore();
    }
    pipe.add_command(cmd.clone());
    let mut replies: Vec<Value> = pipe.query_async(conn).await?;
    match replies.pop() {
        Some(reply) => reply.extract_error(),
        None => Err(redis::RedisError::from((
            redis::ErrorKind::Client,
            "no reply in the pipeline",
        ))),
    }
}
