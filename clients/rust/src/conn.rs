//! The connections commands go through: the client's shared one, a hold's, and connections of
//! their own (a waiting acquire's, an `EPHEMERAL` hold's), each named (`naming.rs`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, Value};
use tokio::sync::mpsc;

use crate::backend::{self, says_backend_gone, Backend, Sent};
use crate::basics::relock;
use crate::error::{command_name, LockError};
use crate::master::{says_not_master, Master};
use crate::naming::setname;
use crate::node::Node;

/// The client's shared connection for ordinary commands (acquire without WAIT, renew, release,
/// `LOCK.INFO`): a multiplexed connection to the one server, replaced by a new one after it
/// breaks, or the cluster connection, which routes by key, follows `MOVED`/`ASK` and reconnects
/// by itself.
// One per client, made once and never moved: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Commands {
    Single {
        /// The server: a fixed address, or the master the Sentinels name.
        master: Arc<Master>,
        config: AsyncConnectionConfig,
        /// `CLIENT SETNAME` sent on each new connection.
        name: String,
        /// The current connection, the node it is to and the master's generation then: cloned
        /// under this lock (no await while it is held).
        conn: Mutex<Option<(MultiplexedConnection, Node, u64, u64)>>,
        /// How many connections were made: the current one's number (tickets belong to the
        /// connection that asked for them, [`Commands::asking`]).
        made: std::sync::atomic::AtomicU64,
        /// The number of the current connection (0: none).
        current: std::sync::atomic::AtomicU64,
        /// Held while (re)connecting, so that one task connects and the others wait for it.
        connecting: tokio::sync::Mutex<()>,
        backends: Backends,
    },
    Cluster(ClusterConnection, Backends),
}

/// Which backend serves the locks ([`Backend`]): found at the first `LOCK.*` command to a
/// server (in a cluster, to the master of a slot), and again after an answer says it is gone.
pub(crate) struct Backends {
    /// Whether a server without the module whose `redislock` library is missing or older gets
    /// the crate's copy loaded ([`backend::detect`]).
    load: bool,
    /// Per slot in a cluster; under slot 0 for the one server.
    known: Mutex<std::collections::HashMap<u16, Backend>>,
    /// Held while one task asks a server, so that the others wait for its answer.
    detecting: tokio::sync::Mutex<()>,
}

impl Backends {
    pub(crate) fn new(load: bool) -> Backends {
        Backends {
            load,
            known: Mutex::new(std::collections::HashMap::new()),
            detecting: tokio::sync::Mutex::new(()),
        }
    }
}

impl Commands {
    pub(crate) fn single(
        master: Arc<Master>,
        timeout: Duration,
        name: String,
        load_functions: bool,
    ) -> Commands {
        Commands::Single {
            master,
            config: AsyncConnectionConfig::new()
                .set_response_timeout(Some(timeout))
                .set_connection_timeout(Some(timeout)),
            name,
            conn: Mutex::new(None),
            made: std::sync::atomic::AtomicU64::new(0),
            current: std::sync::atomic::AtomicU64::new(0),
            connecting: tokio::sync::Mutex::new(()),
            backends: Backends::new(load_functions),
        }
    }

    fn backends(&self) -> &Backends {
        match self {
            Commands::Single { backends, .. } | Commands::Cluster(_, backends) => backends,
        }
    }

    /// Where the backend of `key`'s server is remembered: its slot in a cluster, 0 otherwise.
    fn backend_slot(&self, key: &[u8]) -> u16 {
        match self {
            Commands::Single { .. } => 0,
            Commands::Cluster(..) => crate::servers::key_slot(key),
        }
    }

    /// The backend of the server that serves `key` (the one server, or in a cluster the master
    /// of its slot): found once ([`backend::detect`]), again after [`Commands::forget_backend`].
    pub(crate) async fn backend(&self, key: &[u8]) -> Result<Backend, LockError> {
        let slot = self.backend_slot(key);
        let backends = self.backends();
        if let Some(known) = relock(&backends.known).get(&slot) {
            return Ok(*known);
        }
        let _detecting = backends.detecting.lock().await;
        if let Some(known) = relock(&backends.known).get(&slot) {
            return Ok(*known);
        }
        // Boxed: asked once per server, it would otherwise deepen every command's future.
        let found = Box::pin(backend::detect(
            |cmd: Cmd| async move { self.raw_routed(&cmd, Some(key)).await },
            backends.load,
        ))
        .await?;
        relock(&backends.known).insert(slot, found);
        Ok(found)
    }

    /// The backend of `key`'s server is asked again at the next command (an answer said it
    /// is gone: a `FUNCTION FLUSH`, the module unloaded, a failover to a server without it).
    fn forget_backend(&self, key: &[u8]) {
        let slot = self.backend_slot(key);
        relock(&self.backends().known).remove(&slot);
    }

    /// `cmd` as the backend of `key`'s server takes it ([`backend::sent_as`]); a command that is
    /// not `LOCK.*` as it is, without asking which backend the server has.
    async fn sent_as<'a>(&self, cmd: &'a Cmd, key: &[u8]) -> Result<Sent<'a>, LockError> {
        if !backend::is_lock_command(cmd) {
            return backend::sent_as(Backend::Module, cmd);
        }
        backend::sent_as(self.backend(key).await?, cmd)
    }

    /// The key whose server `cmd` goes to: `key`, else the command's own.
    fn route_of(cmd: &Cmd, key: Option<&[u8]>) -> Vec<u8> {
        key.map(<[u8]>::to_vec)
            .or_else(|| backend::key_of(cmd))
            .unwrap_or_default()
    }

    /// The number of the single server's current connection (0: none now; always 0 in a
    /// cluster). A ticket asked on a connection whose number is no longer current is void:
    /// the server dropped it with its connection.
    pub(crate) fn asking(&self) -> u64 {
        match self {
            Commands::Single {
                master,
                conn: slot,
                current,
                ..
            } => {
                let slot = relock(slot);
                match slot.as_ref() {
                    // A failover since: that connection is done with (its next use replaces it).
                    Some((_, _, generation, _)) if *generation != master.generation() => 0,
                    Some(_) => current.load(std::sync::atomic::Ordering::SeqCst),
                    None => 0,
                }
            }
            Commands::Cluster(..) => 0,
        }
    }

    /// `cmd` on the single server's connection, with the number of the connection that
    /// answered ([`Commands::asking`]), as the server's backend takes it.
    pub(crate) async fn query_asking(&self, cmd: &Cmd) -> (Result<Value, LockError>, u64) {
        let route = Commands::route_of(cmd, None);
        let sent = match self.sent_as(cmd, &route).await {
            Ok(sent) => sent,
            Err(e) => return (Err(e), 0),
        };
        let (reply, number) = self.raw_asking(&sent.cmd).await;
        (reply.map(|v| sent.answer.apply(v)), number)
    }

    async fn raw_asking(&self, cmd: &Cmd) -> (Result<Value, LockError>, u64) {
        match self {
            Commands::Cluster(..) => (self.raw_routed(cmd, None).await, 0),
            Commands::Single { .. } => {
                let (mut conn, node, new, generation, number) = match self.single_connection().await
                {
                    Ok(found) => found,
                    Err(e) => return (Err(e), 0),
                };
                let reply = if new {
                    first_query(&mut conn, self.name(), false, cmd).await
                } else {
                    cmd.query_async::<Value>(&mut conn).await
                }
                .map_err(|e| LockError::from(e).sent_as(cmd));
                let gone = may_say_gone(cmd, &reply);
                (self.after(&node, generation, reply, gone).await, number)
            }
        }
    }

    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<Value, LockError> {
        self.query_routed(cmd, None).await
    }

    /// `cmd`, in a cluster sent to the master of `key`'s slot when `key` is given (a command
    /// whose first argument is not its key, such as `LOCK.MACQUIRE numkeys key ...`, would
    /// otherwise be routed by its first argument and take a `MOVED`). A `LOCK.*` command goes
    /// as the server's backend takes it ([`backend::sent_as`]: the module's command, or the
    /// `redislock` library's `FCALL`); an answer that says that backend is gone has it found
    /// again and the command sent once more, as the backend found takes it.
    pub(crate) async fn query_routed(
        &self,
        cmd: &Cmd,
        key: Option<&[u8]>,
    ) -> Result<Value, LockError> {
        let route = Commands::route_of(cmd, key);
        let sent = self.sent_as(cmd, &route).await?;
        let reply = match self.raw_routed(&sent.cmd, key).await {
            Err(e) if backend::is_lock_command(cmd) && says_backend_gone(&e) => {
                self.forget_backend(&route);
                let sent = self.sent_as(cmd, &route).await?;
                return self
                    .raw_routed(&sent.cmd, key)
                    .await
                    .map(|v| sent.answer.apply(v));
            }
            reply => reply,
        };
        reply.map(|v| sent.answer.apply(v))
    }

    /// `cmd` as it is (see [`Commands::query_routed`]).
    async fn raw_routed(&self, cmd: &Cmd, key: Option<&[u8]>) -> Result<Value, LockError> {
        match self {
            Commands::Cluster(conn, _) => match key {
                None => cmd.query_async::<Value>(&mut conn.clone()).await,
                Some(key) => conn
                    .clone()
                    .route_command(cmd.clone(), RoutingInfo::SingleNode(master_of(key)))
                    .await
                    // Routed, a server's error reply comes back as a value.
                    .and_then(Value::extract_error),
            }
            .map_err(|e| LockError::from(e).sent_as(cmd)),
            Commands::Single { .. } => {
                let (mut conn, node, new, generation, _) = self.single_connection().await?;
                // A new connection sends its name with its first command: one round trip.
                let reply = if new {
                    first_query(&mut conn, self.name(), false, cmd).await
                } else {
                    cmd.query_async::<Value>(&mut conn).await
                }
                .map_err(|e| LockError::from(e).sent_as(cmd));
                let gone = may_say_gone(cmd, &reply);
                self.after(&node, generation, reply, gone).await
            }
        }
    }

    /// The commands of `pipe` in one round trip on the connection (in a cluster, to the master
    /// of `key`'s slot), each command's answer in its place (a server error as an `Err`).
    /// Its `LOCK.*` commands go as the server's backend takes them.
    pub(crate) async fn query_pipeline(
        &self,
        pipe: &Pipeline,
        key: &[u8],
    ) -> Result<Vec<Result<Value, LockError>>, LockError> {
        if !pipe.cmd_iter().any(backend::is_lock_command) {
            return self.raw_pipeline(pipe, key).await;
        }
        // (The library's pipelines with `LOCK.*` commands ignore no reply.)
        let mut sent = redis::pipe();
        sent.ignore_errors();
        let mut answers = Vec::new();
        for cmd in pipe.cmd_iter() {
            let on = self.sent_as(cmd, key).await?;
            sent.add_command(on.cmd.into_owned());
            answers.push(on.answer);
        }
        let replies = self.raw_pipeline(&sent, key).await?;
        Ok(replies
            .into_iter()
            .zip(answers.iter().map(Some).chain(std::iter::repeat(None)))
            .map(|(reply, answer)| match answer {
                Some(answer) => reply.map(|v| answer.apply(v)),
                None => reply,
            })
            .collect())
    }

    async fn raw_pipeline(
        &self,
        pipe: &Pipeline,
        key: &[u8],
    ) -> Result<Vec<Result<Value, LockError>>, LockError> {
        let replies = match self {
            Commands::Cluster(conn, _) => conn
                .clone()
                .route_pipeline(pipe.clone(), 0, pipe.len(), master_of(key))
                .await
                .map_err(LockError::from)?,
            Commands::Single { .. } => {
                let (mut conn, node, new, generation, _) = self.single_connection().await?;
                if new {
                    // Refused (an ACL without CLIENT): the connection works unnamed.
                    let _ = setname(self.name()).query_async::<Value>(&mut conn).await;
                }
                let replies = pipe
                    .query_async::<Vec<Value>>(&mut conn)
                    .await
                    .map_err(LockError::from);
                let gone = match &replies {
                    Ok(replies) => pipe
                        .cmd_iter()
                        .zip(replies)
                        .any(|(cmd, reply)| value_may_say_gone(cmd, reply)),
                    Err(e) => error_may_say_gone(e),
                };
                self.after(&node, generation, replies, gone).await?
            }
        };
        Ok(answers_of(pipe, replies))
    }

    fn name(&self) -> &str {
        match self {
            Commands::Single { name, .. } => name,
            Commands::Cluster(..) => "",
        }
    }

    /// The single server's connection, the node it is to and the master's generation when it
    /// was made, made (to the master the Sentinels name now, through Sentinel) if there is none
    /// or the master changed since; `true` when it is new; and its number ([`Commands::asking`]).
    async fn single_connection(
        &self,
    ) -> Result<(MultiplexedConnection, Node, bool, u64, u64), LockError> {
        let Commands::Single {
            master,
            config,
            conn: slot,
            connecting,
            ..
        } = self
        else {
            return Err(LockError::InvalidArgument("not a single server"));
        };
        let current = || {
            let mut slot = relock(slot);
            match slot.clone() {
                Some((conn, node, generation, number)) if generation == master.generation() => {
                    Some((conn, node, false, generation, number))
                }
                // A failover since: never the old master's connection again.
                Some(_) => {
                    *slot = None;
                    if let Commands::Single { current, .. } = self {
                        current.store(0, std::sync::atomic::Ordering::SeqCst);
                    }
                    None
                }
                None => None,
            }
        };
        if let Some(found) = current() {
            return Ok(found);
        }
        let _connecting = connecting.lock().await;
        if let Some(found) = current() {
            return Ok(found);
        }
        let generation = master.generation();
        let node = master.node().await?;
        let conn = match node
            .client
            .get_multiplexed_async_connection_with_config(config)
            .await
        {
            Ok(conn) => conn,
            Err(e) => {
                master.forget(&node);
                return Err(LockError::Connection(e));
            }
        };
        let generation = generation.max(master.generation());
        let Commands::Single { made, current, .. } = self else {
            return Err(LockError::InvalidArgument("not a single server"));
        };
        let number = made.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        {
            let mut slot = relock(slot);
            *slot = Some((conn.clone(), node.clone(), generation, number));
            current.store(number, std::sync::atomic::Ordering::SeqCst);
        }
        Ok((conn, node, true, generation, number))
    }

    /// After an answer on the single server's connection to `node`, made in `generation`:
    /// broken, timed out, or a replica now (a failover), and the next command starts on a new
    /// connection, to the master the Sentinels name then. An answer that arrives after the
    /// master changed is taken for none: it may come from the old master, paused and back.
    ///
    /// An answer that may say a hold is gone (`gone`: see [`may_say_gone`]) is believed only
    /// once the Sentinels, asked afresh, still name `node`: the client's view of them may be
    /// up to a poll (a second) old, and an old master cut off from them (a partition) still
    /// serves the clients that reach it without the holds the new master granted. Its `FENCED`
    /// or its renewal answered 0 would report a hold lost that the new master has.
    async fn after<T>(
        &self,
        node: &Node,
        generation: u64,
        reply: Result<T, LockError>,
        gone: bool,
    ) -> Result<T, LockError> {
        let Commands::Single {
            master,
            conn: slot,
            current: number,
            ..
        } = self
        else {
            return reply;
        };
        if gone && master.generation() == generation {
            // Only on such answers: a lookup that already started after this one arrived
            // serves it too.
            master.ask_afresh(std::time::Instant::now()).await;
        }
        let reply = if master.generation() != generation {
            Err(master_changed())
        } else {
            reply
        };
        if let Err(e) = &reply {
            if matches!(e, LockError::Connection(_)) || says_not_master(e) {
                let mut current = relock(slot);
                if current
                    .as_ref()
                    .is_some_and(|(_, n, _, _)| n.same_address(node))
                {
                    *current = None;
                    number.store(0, std::sync::atomic::Ordering::SeqCst);
                }
                master.forget(node);
            }
        }
        reply
    }
}

/// The commands whose `0` says a hold is gone: a renewal (a multi-key one's per key), a
/// `LOCK.CHECK`, a proclamation. Not a release: its `0` (no holder left) is the usual answer,
/// and a Sentinel lookup on every release would cost every release a round trip or more.
const GONE_AT_ZERO: [&str; 4] = ["LOCK.RENEW", "LOCK.MRENEW", "LOCK.CHECK", "LOCK.PROCLAIM"];

/// Whether an answer to `cmd` may say a hold is gone: `0` from one of [`GONE_AT_ZERO`] (a
/// multi-key renewal's `0` on any key), or a server's error (`FENCED`, one after which a
/// renewal finds the hold gone) other than one that says the server is no master. The same
/// rule as the Python library's.
fn may_say_gone(cmd: &Cmd, reply: &Result<Value, LockError>) -> bool {
    match reply {
        Ok(value) => value_may_say_gone(cmd, value),
        Err(e) => error_may_say_gone(e),
    }
}

/// [`may_say_gone`] of one reply, a pipeline's server errors given as values.
fn value_may_say_gone(cmd: &Cmd, value: &Value) -> bool {
    let gone_at_zero = || {
        let name = command_name(cmd);
        GONE_AT_ZERO.iter().any(|c| *c == name)
    };
    match value {
        Value::Int(0) => gone_at_zero(),
        Value::Array(items) => {
            items.iter().any(|item| matches!(item, Value::Int(0))) && gone_at_zero()
        }
        Value::ServerError(_) => value
            .clone()
            .extract_error()
            .err()
            .is_some_and(|e| error_may_say_gone(&LockError::from(e))),
        _ => false,
    }
}

/// [`may_say_gone`] of an error: a server's, not one that says it is no master (that one
/// already drops the connection and asks the Sentinels).
fn error_may_say_gone(e: &LockError) -> bool {
    matches!(e, LockError::Server(_)) && !says_not_master(e)
}

/// The error of a command answered after a failover: it may have run on the old master, which
/// no longer counts.
pub(crate) fn master_changed() -> LockError {
    LockError::Connection(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "the master changed (a failover) while the command was on its way",
    )))
}

/// The routing of a command to the master of `key`'s slot.
fn master_of(key: &[u8]) -> SingleNodeRoutingInfo {
    SingleNodeRoutingInfo::SpecificNode(Route::new(crate::servers::key_slot(key), SlotAddr::Master))
}

/// A pipeline's replies (sent with `ignore_errors`), each server error as an `Err`.
pub(crate) fn answers(replies: Vec<Value>) -> Vec<Result<Value, LockError>> {
    replies
        .into_iter()
        .map(|v| v.extract_error().map_err(LockError::from))
        .collect()
}

/// [`answers`] of `pipe` (none of its commands ignored): a refusal (`NOPERM`) named after the
/// command it answers.
pub(crate) fn answers_of(pipe: &Pipeline, replies: Vec<Value>) -> Vec<Result<Value, LockError>> {
    let mut answers = answers(replies);
    if answers.len() == pipe.len() {
        for (answer, cmd) in answers.iter_mut().zip(pipe.cmd_iter()) {
            if let Err(e) = answer {
                let e = std::mem::replace(e, LockError::InvalidArgument(""));
                *answer = Err(e.sent_as(cmd));
            }
        }
    }
    answers
}

/// The connection a hold's renewals and release go through.
#[derive(Clone)]
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
    /// The commands of `pipe` in one round trip on the hold's connection (see
    /// [`Commands::query_pipeline`]).
    pub(crate) async fn query_pipeline(
        &self,
        pipe: &Pipeline,
        key: &[u8],
    ) -> Result<Vec<Result<Value, LockError>>, LockError> {
        match self {
            HoldConn::Shared(commands) => commands.query_pipeline(pipe, key).await,
            HoldConn::Own(conn) => {
                let mut conn = conn.clone();
                pipe.query_async::<Vec<Value>>(&mut conn)
                    .await
                    .map(|replies| answers_of(pipe, replies))
                    .map_err(LockError::from)
            }
        }
    }

    pub(crate) async fn query(&self, cmd: &Cmd, key: &[u8]) -> Result<Value, LockError> {
        match self {
            HoldConn::Shared(commands) => commands.query_routed(cmd, Some(key)).await,
            HoldConn::Own(conn) => {
                let mut conn = conn.clone();
                cmd.query_async::<Value>(&mut conn)
                    .await
                    .map_err(|e| LockError::from(e).sent_as(cmd))
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
    prefixed_query(conn, Some(name), asking, cmd).await
}

/// `cmd` in one round trip after `CLIENT SETNAME name` (when a name is given) and `ASKING`
/// (when `asking`): `cmd`'s reply, a server error as an error.
pub(crate) async fn prefixed_query(
    conn: &mut MultiplexedConnection,
    name: Option<&str>,
    asking: bool,
    cmd: &Cmd,
) -> redis::RedisResult<Value> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    if let Some(name) = name {
        pipe.add_command(setname(name)).ignore();
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_answer_that_may_say_a_hold_is_gone_asks_the_sentinels_afresh() {
        let server = |text: &str| Err(LockError::Server(text.into()));
        let renew = redis::cmd("LOCK.RENEW");
        let cases: Vec<(Result<Value, LockError>, bool)> = vec![
            (Ok(Value::Int(0)), true),
            (Ok(Value::Int(1)), false),
            (Ok(Value::Array(vec![Value::Int(1), Value::Int(0)])), true),
            (Ok(Value::Array(vec![Value::Int(1), Value::Int(1)])), false),
            (Ok(Value::Nil), false),
            (Ok(Value::Okay), false),
            (server("FENCED the hold is gone"), true),
            (server("ERR not a lock"), true),
            (
                server("READONLY You can't write against a read only replica."),
                false,
            ),
            (server("MASTERDOWN Link with MASTER is down"), false),
            (
                Err(LockError::Connection(redis::RedisError::from(
                    std::io::Error::from(std::io::ErrorKind::BrokenPipe),
                ))),
                false,
            ),
        ];
        for (reply, want) in cases {
            assert_eq!(may_say_gone(&renew, &reply), want, "{reply:?}");
        }
        // The shared table (clients/vectors/gone-answers.tsv).
        let parse = |text: &str| match text {
            "nil" => Value::Nil,
            "OK" => Value::Okay,
            _ if text.starts_with('[') => Value::Array(
                text.trim_matches(|c| c == '[' || c == ']')
                    .split(' ')
                    .map(|n| Value::Int(n.parse().expect("an integer")))
                    .collect(),
            ),
            _ => Value::Int(text.parse().expect("an integer")),
        };
        let rows = crate::vectors::rows(crate::vectors::GONE_ANSWERS);
        assert!(rows.len() >= 10);
        for row in rows {
            let command = redis::cmd(crate::vectors::column(&row, 0));
            let reply = Ok(parse(crate::vectors::column(&row, 1)));
            let want = crate::vectors::column(&row, 2) == "afresh";
            assert_eq!(may_say_gone(&command, &reply), want, "{row:?}");
        }
        // A release's 0 is no holder left, its usual answer: no lookup.
        let release = redis::cmd("lock.release");
        assert!(!may_say_gone(&release, &Ok(Value::Int(0))));
        assert!(may_say_gone(&redis::cmd("lock.check"), &Ok(Value::Int(0))));
        assert!(may_say_gone(&release, &server("FENCED the hold is gone")));
    }
}
