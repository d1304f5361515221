//! The test kit of the integration tests (`tests/`) and the bench (`bench/`): real
//! `redis-server` processes with the module loaded, one per test or scenario, on free loopback
//! ports in temporary directories, killed and reaped on drop (`Server`, `Server::replica_of`,
//! `Cluster`, `SentinelSet`: a master, replicas and Sentinels); clients blocked in `LOCK.ACQUIRE ... WAIT` on their own connections (`Waiter`);
//! killable `redis-cli` processes (`Cli`); and the reads the tests share (`lock`).
//!
//! The server binary is `$LOCK_SERVER` (default `redis-server`) and the CLI `$LOCK_CLI` (default
//! `redis-cli`): `make test-valkey`, `make test-redis8` and `make test-valkey9` point them at
//! Valkey 8.1.8, Redis 8.2.3 and Valkey 9.1.2 (`scripts/server-deps.sh`). The module is
//! `$LOCK_MODULE`, or the debug build, built once per process before the first server starts.
//! `server_kind()` tells a test which server it runs on, for the few expectations that
//! legitimately differ.

mod cli;
mod cluster;
pub mod lock;
mod pinger;
mod raw_client;
mod sentinel;
mod server;
mod waiter;

pub use cli::Cli;
pub use cluster::Cluster;
pub use lock::*;
pub use pinger::{ping_bound, Pinger, Pings};
pub use raw_client::{open_files_limit, RawClient};
pub use redis::{Commands, Connection, Value};
pub use sentinel::{SentinelOptions, SentinelProcess, SentinelSet};
pub use server::{
    cli_bin, free_port, module_path, server_bin, server_info, server_kind, server_name, Options,
    Server, ServerInfo, ServerKind, Signal,
};
pub use waiter::{AfterReply, Answer, QueuedIn, WaitRequest, Waiter};
