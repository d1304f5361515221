//! An async (tokio) client for the `LOCK.*` Redis module: distributed locks with fencing tokens,
//! server-side FIFO waiting, read-write locks, semaphores and `EPHEMERAL` holds.
//!
//! - [`LockClient`] connects (from a [`redis::Client`] or a URL) and makes handles:
//!   [`LockClient::lock`] (exclusive), [`LockClient::read_lock`] (shared),
//!   [`LockClient::semaphore`] (one of `n` permits).
//! - A [`Lock`] handle is one owner on one key, with its options: [`Lock::lease`],
//!   [`Lock::fixed_lease`], [`Lock::wait_timeout`], [`Lock::ephemeral`]. It acquires with
//!   [`Lock::try_acquire`] (`None` when busy) or [`Lock::acquire`] (waits in the server).
//! - A [`LockGuard`] is the hold: [`LockGuard::token`] is its fencing token,
//!   [`LockGuard::lost`] resolves if it is lost ([`LostReason`]), [`LockGuard::release`]
//!   releases it (idempotent), and dropping it releases it in the background.
//!   [`LockGuard::fenced`] runs a command only while the hold lasts, checked by the server in
//!   the same step (`LOCK.GUARD`): a stale holder's write never lands
//!   ([`LockError::Fenced`]).
//!
//! - [`LockClient::multi_lock`] makes a [`MultiLock`]: several keys taken together at one
//!   instant (`LOCK.MACQUIRE`), a [`MultiLockGuard`] with a token per key, one watchdog
//!   (`LOCK.MRENEW`), one release (`LOCK.MRELEASE`).
//! - Where no module can load (a managed Redis), exclusive locks run on the `redislock`
//!   Functions library (`functions/redislock.lua`), found per server at its first lock command
//!   ([`LockClient::backend`], [`Backend`]; [`LockClientBuilder::load_functions`] loads it);
//!   what that library cannot do answers [`LockError::NotSupported`] before anything is sent.
//! - [`LockClient::election`] makes an [`Election`]: [`Election::campaign`] waits until this
//!   candidate leads and returns a [`Leadership`] (its epoch, `lost`, `proclaim`, `resign`);
//!   [`Election::leader`] reads the leader; [`Election::observe`] follows every change as a
//!   stream ([`Observer`]).
//!
//! # Safe defaults
//!
//! - **Watchdog.** A hold's lease ([`DEFAULT_LEASE`], 30 s, unless [`Lock::lease`] says
//!   otherwise) is renewed every third of a lease by the client's keeper, a task of its own (one
//!   per runtime) that holds every hold's due time, whatever the application's task is doing.
//!   `LOCK.RENEW` answering 0 (the hold is gone), or no successful renewal for a lease (counted
//!   from the *send* time of the last one, minus a tenth for clock drift), reports the hold
//!   lost. Nothing renews after a release.
//! - **A long wait is no evidence of a loss.** The server granted somewhere between the
//!   acquire's send and its reply; after a wait of a third of the lease or more, the hold is
//!   confirmed (a renewal sent at once) before the guard is handed out, and its deadline counts
//!   from that renewal's send time.
//! - **Waiting never blocks other commands.** An acquire that waits takes a ticket
//!   (`LOCK.ACQUIRE ... WAIT ms TICKET`) and the client's one waiting connection pops the
//!   answers of all its waits ([`LockClientBuilder::wait_with_tickets`], on by default; in a
//!   cluster, one waiting connection per slot with waits, on the node that serves it; an
//!   `EPHEMERAL` wait asks on the connection its hold will be bound to). Without tickets, a
//!   wait goes on a connection of its own whose read timeout is above the wait. Everything
//!   else shares one multiplexed connection.
//! - **Retries never enter twice.** Every acquire carries `ONCE`, so an acquire re-sent after a
//!   timeout or a broken connection (the library retries twice) cannot count a second re-entry.
//! - **`EPHEMERAL` holds live on a connection the guard owns**, never a pooled or shared one;
//!   any error on it reports the hold lost, and it is never reconnected.
//! - **Knowing when the lock is gone.** [`LockGuard::lost`] is a future to select on beside the
//!   work. The server's lost-hold signal is listened to by default
//!   ([`LockClientBuilder::without_lost_signal`] turns it off) and reports losses at once with
//!   the server's reason; a hold acts only on messages about its own database and key, and
//!   checks with one read before it believes a message about its whole key or a flush. Pub/sub
//!   is at-most-once, so the watchdog stays the backstop.
//! - **A release belongs to its handle.** A guard dropped without [`LockGuard::release`] is
//!   released in the background; the same handle's next acquire waits until that release is
//!   answered, so it is never handed the old hold only to see the release free it.
//! - **Named connections.** Every connection a client opens to a node is named
//!   `redis-lock-client:<client id>` (`CLIENT SETNAME`), so `CLIENT LIST` shows whose
//!   connection holds an `EPHEMERAL` hold.
//!
//! # Runtime and cancellation
//!
//! The watchdog is a tokio task (the keeper, on the runtime the hold was acquired on): on a
//! multi-threaded runtime it renews while the application's task is busy, even blocked. On a `current_thread` runtime a task that blocks the thread
//! blocks the watchdog too (use `spawn_blocking` for blocking work). Dropping an
//! [`Lock::acquire`] future that waits withdraws its ticket (`LOCK.CANCEL`; a grant that came
//! meanwhile is released) or, for a blocking wait, closes its connection, and the server forgets
//! the waiter;
//! dropping one mid-flight otherwise may leave a hold the application never saw, which ends at its
//! lease end (or is taken back by the handle's next acquire, thanks to `ONCE`).
//!
//! # Owners and re-entry
//!
//! Each client has a random id; each handle is the owner `<client id>:<n>`. Re-entry is per
//! handle: acquiring again through a handle that holds the key succeeds at once with the same
//! token, and the hold ends when its last guard is released. Two handles are two owners.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::{LockClient, LockError};
//!
//! # async fn demo() -> Result<(), LockError> {
//! // The lost-hold signal listened to; commands time out after 2 s.
//! let client = LockClient::open("redis://127.0.0.1:6379/").await?;
//! let lock = client
//!     .lock("orders:42")
//!     .lease(Duration::from_secs(10))          // default 30 s
//!     .wait_timeout(Duration::from_secs(5));   // default: until granted
//!
//! let mut guard = lock.acquire().await?; // LockError::Timeout after 5 s
//! let token = guard.token();
//! tokio::select! {
//!     reason = guard.lost() => eprintln!("lock lost ({reason}): abandon the work"),
//!     _ = write_with_fence(token) => {}
//! }
//! guard.release().await?;
//! # Ok(()) }
//! # async fn write_with_fence(_token: u64) {}
//! ```
//!
//! # Scoped work, blocking code, clusters
//!
//! - [`Lock::run`] acquires, runs the work beside the hold's loss, drops the work's future if
//!   the hold is lost (answering [`LockError::NotHeld`] with the reason), releases otherwise.
//! - [`blocking`] is the same API for code without a runtime: a client owns a one-thread tokio
//!   runtime where the watchdog and the signal run while the caller's thread is busy.
//! - [`LockClient::cluster`] talks to a Redis Cluster: commands routed by key (`MOVED`/`ASK`
//!   followed by the `redis` crate's cluster connection), a waiting acquire's ticket asked and
//!   popped on the key's master, an `EPHEMERAL` hold on a connection of its own to that
//!   master, found in the client's copy of the
//!   slot map (`MOVED`/`ASK` followed there too; a `MOVED` drops the copy, read again when next
//!   needed), the lost-hold signal with `SSUBSCRIBE` on that node.
//! - [`LockClientBuilder::lost_signal_prefix`] listens to a server whose
//!   `lock.lost-channel-prefix` is not the default `lock.lost`.
//! - [`LockClient::sentinel`] follows the master a set of Sentinels names, through failovers
//!   (see [`LockClient::sentinel_builder`] for what each call does then), and
//!   [`Lock::replicas`] counts a grant or a renewal only once replicas acknowledged it
//!   ([`LockError::NotSafelyAcquired`] otherwise).
//!
//! # Not (yet) supported
//!
//! TLS and unix sockets untested.

#![deny(missing_docs)]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod acks;
mod backend;
mod basics;
pub mod blocking;
mod channel;
mod client;
mod conn;
mod context;
mod election;
mod error;
mod guard;
mod handle;
mod hold;
mod keeper;
mod lock;
mod lost;
mod machine;
mod master;
mod message;
mod multi;
mod naming;
mod node;
mod observer;
mod reply;
mod servers;
mod signal;
mod tickets;
mod unlocked;
#[cfg(test)]
mod vectors;

pub use backend::Backend;
pub use channel::{
    leader_channel, lost_signal_channel, lost_signal_channel_with_prefix,
    DEFAULT_LEADER_CHANNEL_PREFIX, DEFAULT_LOST_SIGNAL_PREFIX,
};
pub use client::{
    LockClient, LockClientBuilder, DEFAULT_COMMAND_TIMEOUT, DEFAULT_FAILOVER_TIMEOUT,
};
pub use election::{Election, Leadership};
pub use error::LockError;
pub use guard::{LockGuard, Release};
pub use lock::{Kind, Lock, Wait, DEFAULT_LEASE};
pub use lost::{LostReason, LostWatch};
pub use message::LostSignal;
pub use multi::{MultiLock, MultiLockGuard};
pub use observer::{Leader, Observer};
