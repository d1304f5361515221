//! A blocking twin of the async API, for code without an async runtime (as `reqwest::blocking`
//! is to `reqwest`): the same handles and guard, each call waiting for its answer.
//!
//! It is a thin layer over the async core: a [`LockClient`] owns a small tokio runtime (one
//! worker thread, `redis-lock`) shared by its handles and guards. Each call runs the async call on
//! the caller's thread with `block_on`; the watchdog, the lost-hold signal and an `EPHEMERAL`
//! hold's connection watcher are tasks on the worker thread, so they keep working while the
//! caller's thread is busy (or asleep) in its own work. The runtime ends with the last client,
//! handle or guard that uses it.
//!
//! Do not call it from async code (inside a tokio runtime): it answers
//! [`LockError::InvalidArgument`] there instead of blocking a runtime thread. Use the async API.
//!
//! ```no_run
//! use std::time::Duration;
//! use redis_lock_client::blocking::LockClient;
//!
//! # fn main() -> Result<(), redis_lock_client::LockError> {
//! let client = LockClient::open("redis://127.0.0.1:6379/")?;
//! let lock = client.lock("orders:42").lease(Duration::from_secs(10));
//! let guard = lock.acquire()?;          // waits in the server
//! let token = guard.token();            // the fence for every write
//! std::thread::sleep(Duration::from_secs(30)); // busy: the watchdog renews meanwhile
//! if let Some(reason) = guard.lost_reason() {
//!     eprintln!("lost the lock ({reason}): do not write");
//! }
//! drop(guard);                          // releases (waits for the answer)
//! # let _ = token; Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, FromRedisValue, IntoConnectionInfo};
use tokio::runtime::Runtime;

use crate::error::LockError;
use crate::guard::Release;
use crate::lock::Kind;
use crate::lost::{LostReason, LostWatch};

/// The runtime the blocking API runs the async core on.
struct Engine {
    runtime: Option<Runtime>,
}

impl Engine {
    fn start() -> Result<Arc<Engine>, LockError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("redis-lock")
            .enable_all()
            .build()
            .map_err(|e| LockError::Connection(redis::RedisError::from(e)))?;
        Ok(Arc::new(Engine {
            runtime: Some(runtime),
        }))
    }

    /// Runs `future` to its end on the caller's thread.
    fn block_on<F: std::future::Future>(&self, future: F) -> Result<F::Output, LockError> {
        if tokio::runtime::Handle::try_current().is_ok() {
            return Err(LockError::InvalidArgument(
                "the blocking API was called from async code: use the async API there",
            ));
        }
        match &self.runtime {
            Some(runtime) => Ok(runtime.block_on(future)),
            None => Err(LockError::InvalidArgument(
                "the client's runtime has shut down",
            )),
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Without waiting for its tasks, and without the panic a runtime dropped inside async
        // code would raise. Every guard holds the engine, so no hold is left behind.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// The blocking [`crate::LockClient`]: the same connections and identity, and an owned runtime.
#[derive(Clone)]
pub struct LockClient {
    inner: crate::LockClient,
    engine: Arc<Engine>,
}

impl LockClient {
    /// A client with the default settings on `client`'s server. Connects once to check it.
    pub fn new(client: redis::Client) -> Result<LockClient, LockError> {
        LockClient::from_builder(crate::LockClient::builder(client))
    }

    /// [`LockClient::new`] from a URL such as `redis://127.0.0.1:6379/`.
    pub fn open(url: &str) -> Result<LockClient, LockError> {
        let client = redis::Client::open(url).map_err(LockError::Connection)?;
        LockClient::new(client)
    }

    /// A client of the master a set of Sentinels monitors under `master_name`: see
    /// [`crate::LockClient::sentinel_builder`] (and [`LockClient::from_builder`] for settings).
    pub fn sentinel<T: IntoConnectionInfo>(
        sentinels: impl IntoIterator<Item = T>,
        master_name: &str,
    ) -> Result<LockClient, LockError> {
        LockClient::from_builder(crate::LockClient::sentinel_builder(sentinels, master_name)?)
    }

    /// A client of a Redis Cluster, from the URLs of one or more of its nodes.
    pub fn cluster<T: IntoConnectionInfo>(
        nodes: impl IntoIterator<Item = T>,
    ) -> Result<LockClient, LockError> {
        LockClient::from_builder(crate::LockClient::cluster_builder(nodes)?)
    }

    /// A client with the settings of an async builder
    /// ([`LockClient::builder`](crate::LockClient::builder),
    /// [`LockClient::cluster_builder`](crate::LockClient::cluster_builder)).
    pub fn from_builder(builder: crate::LockClientBuilder) -> Result<LockClient, LockError> {
        let engine = Engine::start()?;
        let inner = engine.block_on(builder.build())??;
        Ok(LockClient { inner, engine })
    }

    /// This client's random unique id, the prefix of its handles' owners.
    pub fn id(&self) -> &str {
        self.inner.id()
    }

    /// What serves the locks on the server: see [`crate::LockClient::backend`].
    pub fn backend(&self) -> Result<crate::Backend, LockError> {
        let inner = self.inner.clone();
        self.engine.block_on(async move { inner.backend().await })?
    }

    /// What serves the locks on `key`'s server: see [`crate::LockClient::backend_of`].
    pub fn backend_of(&self, key: impl AsRef<[u8]>) -> Result<crate::Backend, LockError> {
        let inner = self.inner.clone();
        let key = key.as_ref().to_vec();
        self.engine
            .block_on(async move { inner.backend_of(key).await })?
    }

    /// A handle on the exclusive lock of `key`.
    pub fn lock(&self, key: impl AsRef<[u8]>) -> Lock {
        self.wrap(self.inner.lock(key))
    }

    /// A handle on a shared (read) hold of `key`.
    pub fn read_lock(&self, key: impl AsRef<[u8]>) -> Lock {
        self.wrap(self.inner.read_lock(key))
    }

    /// A handle on one permit of the semaphore `key` with `limit` permits.
    pub fn semaphore(&self, key: impl AsRef<[u8]>, limit: u32) -> Lock {
        self.wrap(self.inner.semaphore(key, limit))
    }

    /// A handle on several keys taken together: see [`crate::LockClient::multi_lock`].
    pub fn multi_lock<K: AsRef<[u8]>>(&self, keys: impl IntoIterator<Item = K>) -> MultiLock {
        MultiLock {
            inner: self.inner.multi_lock(keys),
            engine: self.engine.clone(),
        }
    }

    /// A handle on the election `key` for a new candidate: see [`crate::LockClient::election`].
    pub fn election(&self, key: impl AsRef<[u8]>) -> Election {
        Election {
            inner: self.inner.election(key),
            engine: self.engine.clone(),
        }
    }

    fn wrap(&self, inner: crate::Lock) -> Lock {
        Lock {
            inner,
            engine: self.engine.clone(),
        }
    }
}

/// The blocking [`crate::Election`]: campaign, read the leader, observe.
///
/// ```no_run
/// # fn demo(client: redis_lock_client::blocking::LockClient) -> Result<(), redis_lock_client::LockError> {
/// let election = client.election("scheduler");
/// let leadership = election.campaign_with_value("10.0.0.1:80")?; // blocks until elected
/// while leadership.lost_reason().is_none() {
///     // lead, passing leadership.epoch() with every write
///     # break;
/// }
/// drop(leadership); // resigns
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    inner: crate::Election,
    engine: Arc<Engine>,
}

impl Election {
    /// See [`crate::Election::lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.inner = self.inner.lease(lease);
        self
    }

    /// See [`crate::Election::wait_timeout`].
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.inner = self.inner.wait_timeout(timeout);
        self
    }

    /// See [`crate::Election::replicas`].
    pub fn replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.inner = self.inner.replicas(replicas, timeout);
        self
    }

    /// See [`crate::Election::wait_aof`].
    pub fn wait_aof(mut self, local: u32, replicas: u32, timeout: Duration) -> Self {
        self.inner = self.inner.wait_aof(local, replicas, timeout);
        self
    }

    /// See [`crate::Election::not_ephemeral`].
    pub fn not_ephemeral(mut self) -> Self {
        self.inner = self.inner.not_ephemeral();
        self
    }

    /// The election key.
    pub fn key(&self) -> &[u8] {
        self.inner.key()
    }

    /// The name this handle campaigns under.
    pub fn candidate(&self) -> &str {
        self.inner.candidate()
    }

    /// Blocks until this candidate leads: see [`crate::Election::campaign`].
    pub fn campaign(&self) -> Result<Leadership, LockError> {
        let leadership = self.engine.block_on(self.inner.campaign())??;
        Ok(self.wrap(leadership))
    }

    /// See [`crate::Election::campaign_with_value`].
    pub fn campaign_with_value(&self, value: impl AsRef<[u8]>) -> Result<Leadership, LockError> {
        let leadership = self
            .engine
            .block_on(self.inner.campaign_with_value(value))??;
        Ok(self.wrap(leadership))
    }

    /// One attempt, no wait: see [`crate::Election::try_campaign`].
    pub fn try_campaign(&self) -> Result<Option<Leadership>, LockError> {
        let leadership = self.engine.block_on(self.inner.try_campaign())??;
        Ok(leadership.map(|l| self.wrap(l)))
    }

    /// Who leads now (`LOCK.LEADER`).
    pub fn leader(&self) -> Result<Option<crate::Leader>, LockError> {
        self.engine.block_on(self.inner.leader())?
    }

    /// Follows the key's leaders: an iterator of [`crate::Leader`] (see [`crate::Observer`]).
    pub fn observe(&self) -> Result<Observer, LockError> {
        let inner = self.engine.block_on(async { self.inner.observe() })?;
        Ok(Observer {
            inner,
            engine: self.engine.clone(),
        })
    }

    fn wrap(&self, leadership: crate::Leadership) -> Leadership {
        Leadership {
            guard: LockGuard {
                inner: Some(leadership.into_inner()),
                engine: self.engine.clone(),
            },
        }
    }
}

/// The blocking [`crate::Leadership`]. Dropping it resigns and waits for the answer.
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
}

impl Leadership {
    /// The epoch (0 only after a resignation): see [`crate::Leadership::epoch`].
    pub fn epoch(&self) -> u64 {
        self.guard.token()
    }

    /// The candidate's name.
    pub fn candidate(&self) -> &str {
        self.guard.owner()
    }

    /// `Some(reason)` once the leadership is known lost. Cheap: check it before each act.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.guard.lost_reason()
    }

    /// Blocks until the leadership is lost or `timeout` passes.
    pub fn wait_lost(&self, timeout: Duration) -> Option<LostReason> {
        self.guard.wait_lost(timeout)
    }

    /// A [`LostWatch`] of this leadership.
    pub fn watch(&self) -> Option<LostWatch> {
        self.guard.watch()
    }

    /// See [`crate::Leadership::proclaim`]: `false` once deposed (and reported lost).
    pub fn proclaim(&self, value: impl AsRef<[u8]>) -> Result<bool, LockError> {
        match self.guard.guard() {
            Some(guard) => self
                .engine()
                .block_on(crate::election::proclaim(guard, value.as_ref()))?,
            None => Ok(false),
        }
    }

    /// Runs `cmd` only while this candidate leads in this epoch: see
    /// [`crate::Leadership::fenced`].
    pub fn fenced<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, LockError> {
        self.guard.fenced(cmd)
    }

    /// See [`crate::Leadership::resign`].
    pub fn resign(&mut self) -> Result<Release, LockError> {
        self.guard.release()
    }

    fn engine(&self) -> &Engine {
        &self.guard.engine
    }
}

/// The blocking [`crate::Observer`]: an iterator of [`crate::Leader`] that never ends by itself
/// (the observer's work runs on the client's runtime thread). Drop it to stop.
pub struct Observer {
    inner: crate::Observer,
    engine: Arc<Engine>,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Observer {
    /// The next leader, or `None` when `timeout` passes first.
    pub fn next_timeout(&mut self, timeout: Duration) -> Option<crate::Leader> {
        let next = self.inner.next();
        self.engine
            .block_on(async move { tokio::time::timeout(timeout, next).await })
            .ok()?
            .ok()?
    }
}

impl Iterator for Observer {
    type Item = crate::Leader;

    fn next(&mut self) -> Option<crate::Leader> {
        self.engine.block_on(self.inner.next()).ok()?
    }
}

/// The blocking [`crate::MultiLock`]: one owner on several keys taken together.
///
/// ```no_run
/// # fn demo(client: redis_lock_client::blocking::LockClient) -> Result<(), redis_lock_client::LockError> {
/// let guard = client.multi_lock(["{wh}:east", "{wh}:west"]).acquire()?;
/// println!("tokens {:?}", guard.tokens());
/// drop(guard); // one LOCK.MRELEASE, answered before the drop returns
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    inner: crate::MultiLock,
    engine: Arc<Engine>,
}

impl MultiLock {
    /// See [`crate::MultiLock::shared`].
    pub fn shared(mut self) -> Self {
        self.inner = self.inner.shared();
        self
    }

    /// See [`crate::MultiLock::lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.inner = self.inner.lease(lease);
        self
    }

    /// See [`crate::MultiLock::fixed_lease`].
    pub fn fixed_lease(mut self, lease: Duration) -> Self {
        self.inner = self.inner.fixed_lease(lease);
        self
    }

    /// See [`crate::MultiLock::wait_timeout`].
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.inner = self.inner.wait_timeout(timeout);
        self
    }

    /// See [`crate::MultiLock::replicas`].
    pub fn replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.inner = self.inner.replicas(replicas, timeout);
        self
    }

    /// See [`crate::MultiLock::wait_aof`].
    pub fn wait_aof(mut self, local: u32, replicas: u32, timeout: Duration) -> Self {
        self.inner = self.inner.wait_aof(local, replicas, timeout);
        self
    }

    /// See [`crate::MultiLock::ephemeral`].
    pub fn ephemeral(mut self) -> Self {
        self.inner = self.inner.ephemeral();
        self
    }

    /// The keys, in the order given.
    pub fn keys(&self) -> Vec<&[u8]> {
        self.inner.keys()
    }

    /// The owner string this handle sends.
    pub fn owner(&self) -> &str {
        self.inner.owner()
    }

    /// Takes every key if all are free, without waiting: `Ok(None)` when one is busy (no key
    /// was touched).
    pub fn try_acquire(&self) -> Result<Option<MultiLockGuard>, LockError> {
        let guard = self.engine.block_on(self.inner.try_acquire())??;
        Ok(guard.map(|g| self.wrap(g)))
    }

    /// Takes every key, waiting in every key's queue at once as long as
    /// [`MultiLock::wait_timeout`] allows.
    pub fn acquire(&self) -> Result<MultiLockGuard, LockError> {
        let guard = self.engine.block_on(self.inner.acquire())??;
        Ok(self.wrap(guard))
    }

    fn wrap(&self, inner: crate::MultiLockGuard) -> MultiLockGuard {
        MultiLockGuard {
            guard: LockGuard {
                inner: Some(inner.into_inner()),
                engine: self.engine.clone(),
            },
        }
    }
}

/// The blocking [`crate::MultiLockGuard`]. Dropping it releases every key and waits for the
/// answer.
#[derive(Debug)]
pub struct MultiLockGuard {
    guard: LockGuard,
}

impl MultiLockGuard {
    /// A fencing token per key, in the keys' order (empty after a release).
    pub fn tokens(&self) -> &[u64] {
        self.guard.guard().map_or(&[], |g| &g.hold().tokens)
    }

    /// The keys, in the order given.
    pub fn keys(&self) -> Vec<&[u8]> {
        self.guard
            .guard()
            .map(|g| g.hold().keys.iter().map(|k| &**k).collect())
            .unwrap_or_default()
    }

    /// `Some(reason)` once the hold is known lost.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.guard.lost_reason()
    }

    /// Blocks until the hold is lost or `timeout` passes: see [`LockGuard::wait_lost`].
    pub fn wait_lost(&self, timeout: Duration) -> Option<LostReason> {
        self.guard.wait_lost(timeout)
    }

    /// A [`LostWatch`] of this hold.
    pub fn watch(&self) -> Option<LostWatch> {
        self.guard.watch()
    }

    /// Runs `cmd` through the fence of `key`, one of the guard's keys: see
    /// [`crate::MultiLockGuard::fenced`].
    pub fn fenced<T: FromRedisValue>(
        &self,
        key: impl AsRef<[u8]>,
        cmd: &Cmd,
    ) -> Result<T, LockError> {
        let Some(guard) = self.guard.guard() else {
            return Err(LockError::NotHeld { lost: None });
        };
        let index = guard
            .hold()
            .keys
            .iter()
            .position(|k| **k == *key.as_ref())
            .ok_or(LockError::InvalidArgument("not one of the guard's keys"))?;
        self.guard
            .engine
            .block_on(crate::guard::fenced_at(guard, index, cmd))?
    }

    /// See [`crate::MultiLockGuard::release`].
    pub fn release(&mut self) -> Result<Release, LockError> {
        self.guard.release()
    }
}

/// The blocking [`crate::Lock`]: one owner on one key, with its options.
#[derive(Clone)]
pub struct Lock {
    inner: crate::Lock,
    engine: Arc<Engine>,
}

impl Lock {
    /// See [`crate::Lock::lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.inner = self.inner.lease(lease);
        self
    }

    /// See [`crate::Lock::fixed_lease`].
    pub fn fixed_lease(mut self, lease: Duration) -> Self {
        self.inner = self.inner.fixed_lease(lease);
        self
    }

    /// See [`crate::Lock::wait_timeout`].
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.inner = self.inner.wait_timeout(timeout);
        self
    }

    /// See [`crate::Lock::replicas`].
    pub fn replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.inner = self.inner.replicas(replicas, timeout);
        self
    }

    /// See [`crate::Lock::wait_aof`].
    pub fn wait_aof(mut self, local: u32, replicas: u32, timeout: Duration) -> Self {
        self.inner = self.inner.wait_aof(local, replicas, timeout);
        self
    }

    /// See [`crate::Lock::ephemeral`]: the hold ends in the server when its connection (owned by
    /// the guard, served by the client's runtime thread) closes — also when the process dies.
    pub fn ephemeral(mut self) -> Self {
        self.inner = self.inner.ephemeral();
        self
    }

    /// The key.
    pub fn key(&self) -> &[u8] {
        self.inner.key()
    }

    /// The owner string this handle sends.
    pub fn owner(&self) -> &str {
        self.inner.owner()
    }

    /// The kind of hold this handle takes.
    pub fn kind(&self) -> Kind {
        self.inner.kind()
    }

    /// Takes the key if it is free, without waiting: `Ok(None)` when busy.
    pub fn try_acquire(&self) -> Result<Option<LockGuard>, LockError> {
        let guard = self.engine.block_on(self.inner.try_acquire())??;
        Ok(guard.map(|g| self.wrap(g)))
    }

    /// Takes the key, waiting in the server as long as [`Lock::wait_timeout`] allows
    /// ([`LockError::Timeout`] then). The calling thread blocks meanwhile.
    pub fn acquire(&self) -> Result<LockGuard, LockError> {
        let guard = self.engine.block_on(self.inner.acquire())??;
        Ok(self.wrap(guard))
    }

    /// Acquires, runs `work` on the calling thread, releases. A thread cannot be interrupted, so
    /// `work` is given the guard to check ([`LockGuard::lost_reason`]) before each step it
    /// cannot undo; if the hold was lost by the time it returns, the answer is
    /// [`LockError::NotHeld`] with the reason (its output is dropped: nothing proves it ran under
    /// the lock). The async [`crate::Lock::run`] cancels the work instead.
    pub fn run<T>(&self, work: impl FnOnce(&LockGuard) -> T) -> Result<T, LockError> {
        let mut guard = self.acquire()?;
        let output = work(&guard);
        if let Some(reason) = guard.lost_reason() {
            return Err(match &guard.inner {
                Some(inner) => inner.not_held(reason),
                None => LockError::NotHeld { lost: Some(reason) },
            });
        }
        match guard.release() {
            Ok(_) | Err(LockError::Connection(_)) => Ok(output),
            Err(e) => Err(e),
        }
    }

    fn wrap(&self, inner: crate::LockGuard) -> LockGuard {
        LockGuard {
            inner: Some(inner),
            engine: self.engine.clone(),
        }
    }
}

/// The blocking [`crate::LockGuard`]. Dropping it releases the hold and waits for the answer
/// (at most the command timeout), so the key is free when the drop returns.
pub struct LockGuard {
    inner: Option<crate::LockGuard>,
    engine: Arc<Engine>,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl LockGuard {
    fn guard(&self) -> Option<&crate::LockGuard> {
        self.inner.as_ref()
    }

    /// The hold's fencing token (0 only after a release).
    pub fn token(&self) -> u64 {
        self.guard().map_or(0, crate::LockGuard::token)
    }

    /// The key.
    pub fn key(&self) -> &[u8] {
        self.guard().map_or(&[], crate::LockGuard::key)
    }

    /// The owner string the hold is held under.
    pub fn owner(&self) -> &str {
        self.guard().map_or("", crate::LockGuard::owner)
    }

    /// `Some(reason)` once the hold is known to be lost. Cheap: check it before each write.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.guard().and_then(crate::LockGuard::lost_reason)
    }

    /// Blocks until the hold is lost (`Some(reason)`) or `timeout` passes (`None`): for a
    /// thread that watches the hold while others work.
    pub fn wait_lost(&self, timeout: Duration) -> Option<LostReason> {
        let lost = self.guard()?.lost();
        // The timer is made inside the runtime (tokio's timers need one).
        self.engine
            .block_on(async move { tokio::time::timeout(timeout, lost).await })
            .ok()?
            .ok()
    }

    /// A [`LostWatch`] of this hold, for async code elsewhere in the process.
    pub fn watch(&self) -> Option<LostWatch> {
        self.guard().map(crate::LockGuard::watch)
    }

    /// Runs `cmd` only while this hold lasts (`LOCK.GUARD`): see [`crate::LockGuard::fenced`].
    /// After a release: [`LockError::NotHeld`], nothing sent.
    ///
    /// ```no_run
    /// # fn demo(client: redis_lock_client::blocking::LockClient) -> Result<(), redis_lock_client::LockError> {
    /// let guard = client.lock("{orders:42}:lock").acquire()?;
    /// let _: i64 = guard.fenced(redis::cmd("INCR").arg("{orders:42}:count"))?;
    /// # Ok(()) }
    /// ```
    pub fn fenced<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, LockError> {
        match self.guard() {
            Some(guard) => self.engine.block_on(guard.fenced(cmd))?,
            None => Err(LockError::NotHeld { lost: None }),
        }
    }

    /// See [`crate::LockGuard::release`]: [`Release::Released`], [`Release::StillHeld`] or
    /// [`Release::AlreadyReleased`], or [`LockError::NotHeld`] after a loss.
    pub fn release(&mut self) -> Result<Release, LockError> {
        let engine = self.engine.clone();
        match self.inner.as_mut() {
            Some(guard) => engine.block_on(guard.release())?,
            None => Ok(Release::AlreadyReleased),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(mut guard) = self.inner.take().filter(|g| !g.is_released()) else {
            return;
        };
        // Release and wait for it; from async code (where blocking is refused) the async guard's
        // own drop sends the release in the background instead.
        let _ = self.engine.block_on(async move {
            let _ = guard.release().await;
        });
    }
}
