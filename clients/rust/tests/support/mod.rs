//! The project's one test kit (`lock-testkit`): real servers with the module loaded, on free
//! loopback ports ($LOCK_SERVER, $LOCK_MODULE as for every other test of the project), and the
//! few helpers every test file of this crate needs.

// Each test binary uses part of this module.
#![allow(dead_code)]

use redis::aio::MultiplexedConnection;
use redis_lock_client::LockClient;

pub use lock_testkit::{server_info, Server, ServerKind};

/// Whether the server reports every key removal to modules (the key server event: Redis >= 7.2
/// and Valkey): only there does the module see DEL, SET over a key, RENAME and eviction.
pub fn reports_key_events() -> bool {
    let info = server_info();
    info.kind == ServerKind::Valkey || info.version >= (7, 2, 0)
}

/// A plain connection to `server`, for looking at what the library did.
pub async fn raw(server: &Server) -> MultiplexedConnection {
    redis::Client::open(server.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

/// A server, a library client of it with the default settings (the lost-hold signal on), and
/// a plain connection.
pub async fn setup() -> (Server, LockClient, MultiplexedConnection) {
    let server = Server::start();
    let client = LockClient::open(&server.url()).await.expect("client");
    let raw = raw(&server).await;
    (server, client, raw)
}

/// A server, a library client of it that does not listen to the lost-hold signal (for what
/// the watchdog or the server's replies alone must notice), and a plain connection.
pub async fn setup_without_signal() -> (Server, LockClient, MultiplexedConnection) {
    let server = Server::start();
    let client = LockClient::builder(redis::Client::open(server.url()).expect("url"))
        .without_lost_signal()
        .build()
        .await
        .expect("client");
    let raw = raw(&server).await;
    (server, client, raw)
}

/// `INFO commandstats` calls of one command (0 when it never ran).
pub async fn calls(raw: &mut MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(raw)
        .await
        .expect("INFO");
    calls_in(&info, command)
}

/// The calls of `command` in an `INFO commandstats` reply.
pub fn calls_in(commandstats: &str, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    commandstats
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map(|n| n.parse().expect("calls"))
        .unwrap_or(0)
}
