//! Several keys held together: `LOCK.MACQUIRE`, one hold over every key.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, FromRedisValue};

use crate::error::LockError;
use crate::guard::{LockGuard, Release};
use crate::lock::Lock;
use crate::lost::{LostReason, LostWatch};

/// A handle on several keys taken together, with its own owner identity
/// ([`LockClient::multi_lock`](crate::LockClient::multi_lock)).
///
/// An acquire takes every key at one instant with one `LOCK.MACQUIRE`, or none: while another
/// owner holds one of the keys, [`MultiLock::try_acquire`] answers `None` and no key is touched,
/// and [`MultiLock::acquire`] waits in every key's queue at once (FIFO, no polling), so that
/// handles taking the same keys in any order cannot deadlock. The hold is one hold: one watchdog
/// renews every key with one `LOCK.MRENEW`, it is lost when any key's hold is, and one
/// `LOCK.MRELEASE` frees every key.
///
/// The keys (1 to 64, distinct) are checked before anything is sent
/// ([`LockError::InvalidArgument`]). In a cluster they must share a slot (a hash tag:
/// `{order:42}:stock`, `{order:42}:payment`), else the server answers `CROSSSLOT`
/// ([`LockError::Server`]).
///
/// ```no_run
/// # async fn demo(client: redis_lock_client::LockClient) -> Result<(), redis_lock_client::LockError> {
/// use std::time::Duration;
///
/// let accounts = client
///     .multi_lock(["account:1", "account:2"])
///     .wait_timeout(Duration::from_secs(5));
/// let mut guard = accounts.acquire().await?; // both keys, or LockError::Timeout
/// for (key, token) in guard.keys().iter().zip(guard.tokens()) {
///     println!("fence {} with {token}", String::from_utf8_lossy(key));
/// }
/// guard.release().await?;                    // one LOCK.MRELEASE frees both
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    inner: Lock,
}

impl MultiLock {
    pub(crate) fn new(inner: Lock) -> MultiLock {
        MultiLock { inner }
    }

    /// Shared holds on every key (`LOCK.MACQUIRE ... SHARED`): they share with other shared
    /// holds and exclude a writer. Set it before the first acquire (the handle keeps its owner).
    pub fn shared(mut self) -> Self {
        self.inner = self.inner.with_kind(crate::Kind::Shared);
        self
    }

    /// See [`Lock::lease`]: one lease for every key, renewed with one `LOCK.MRENEW`.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.inner = self.inner.lease(lease);
        self
    }

    /// See [`Lock::fixed_lease`].
    pub fn fixed_lease(mut self, lease: Duration) -> Self {
        self.inner = self.inner.fixed_lease(lease);
        self
    }

    /// See [`Lock::wait_timeout`]: how long [`MultiLock::acquire`] waits for every key.
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.inner = self.inner.wait_timeout(timeout);
        self
    }

    /// See [`Lock::ephemeral`]: every key's hold is bound to the one connection the guard owns.
    pub fn ephemeral(mut self) -> Self {
        self.inner = self.inner.ephemeral();
        self
    }

    /// See [`Lock::replicas`]: the grant of every key, and each `LOCK.MRENEW`, acknowledged by
    /// `replicas` replicas before it counts.
    pub fn replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.inner = self.inner.replicas(replicas, timeout);
        self
    }

    /// See [`Lock::wait_aof`].
    pub fn wait_aof(mut self, local: u32, replicas: u32, timeout: Duration) -> Self {
        self.inner = self.inner.wait_aof(local, replicas, timeout);
        self
    }

    /// The keys, in the order given.
    pub fn keys(&self) -> Vec<&[u8]> {
        self.inner.keys().iter().map(|k| &**k).collect()
    }

    /// The owner string this handle sends.
    pub fn owner(&self) -> &str {
        self.inner.owner()
    }

    /// The kind of hold taken on every key ([`Kind::Exclusive`](crate::Kind::Exclusive) or
    /// [`Kind::Shared`](crate::Kind::Shared)).
    pub fn kind(&self) -> crate::Kind {
        self.inner.kind()
    }

    /// Takes every key if all are free (or re-enters this handle's hold), without waiting:
    /// `Ok(None)` when another owner holds one of them, and then no key was touched.
    pub async fn try_acquire(&self) -> Result<Option<MultiLockGuard>, LockError> {
        Ok(self.inner.try_acquire().await?.map(MultiLockGuard::new))
    }

    /// Takes every key, waiting in every key's queue at once as long as
    /// [`MultiLock::wait_timeout`] allows; [`LockError::Timeout`] when it passes (the request
    /// then leaves every queue).
    pub async fn acquire(&self) -> Result<MultiLockGuard, LockError> {
        Ok(MultiLockGuard::new(self.inner.acquire().await?))
    }
}

/// A hold on several keys. Dropping it releases every key (in the background, as
/// [`LockGuard`] does); [`MultiLockGuard::release`] releases them and says how that went.
#[derive(Debug)]
pub struct MultiLockGuard {
    inner: LockGuard,
}

impl MultiLockGuard {
    pub(crate) fn new(inner: LockGuard) -> MultiLockGuard {
        MultiLockGuard { inner }
    }

    /// A fencing token per key, in the order the keys were given: pass each with the writes to
    /// the resource its key protects.
    pub fn tokens(&self) -> &[u64] {
        &self.inner.hold().tokens
    }

    /// The keys, in the order given.
    pub fn keys(&self) -> Vec<&[u8]> {
        self.inner.hold().keys.iter().map(|k| &**k).collect()
    }

    /// The owner string the hold is held under.
    pub fn owner(&self) -> &str {
        self.inner.owner()
    }

    /// `Some(reason)` once the hold is known lost (any one key's hold lost is the whole hold).
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.inner.lost_reason()
    }

    /// Resolves with the reason when the hold is lost: a key's lost-hold signal
    /// ([`LockClientBuilder::listen_for_lost_signal`](crate::LockClientBuilder::listen_for_lost_signal)),
    /// `LOCK.MRENEW` answering 0 for one key ([`LostReason::HoldGone`]), or any reason a
    /// [`LockGuard`] gives.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.inner.lost()
    }

    /// A [`LostWatch`] of this hold.
    pub fn watch(&self) -> LostWatch {
        self.inner.watch()
    }

    /// Runs `cmd` through the fence of `key`, one of this guard's keys, with that key's token:
    /// as [`LockGuard::fenced`] (`LOCK.GUARD key owner token <cmd...>`). A `FENCED` refusal on
    /// any key is the whole hold's loss. [`LockError::InvalidArgument`] when `key` is not one of
    /// the guard's keys (nothing is sent).
    ///
    /// ```no_run
    /// # async fn demo(client: redis_lock_client::LockClient) -> Result<(), redis_lock_client::LockError> {
    /// let guard = client.multi_lock(["{acct}:1", "{acct}:2"]).acquire().await?;
    /// let _: i64 = guard.fenced("{acct}:1", redis::cmd("DECRBY").arg("{acct}:1:balance").arg(5)).await?;
    /// let _: i64 = guard.fenced("{acct}:2", redis::cmd("INCRBY").arg("{acct}:2:balance").arg(5)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn fenced<T: FromRedisValue>(
        &self,
        key: impl AsRef<[u8]>,
        cmd: &Cmd,
    ) -> Result<T, LockError> {
        let index = self.index_of(key.as_ref())?;
        crate::guard::fenced_at(&self.inner, index, cmd).await
    }

    /// The position of `key` among the guard's keys.
    pub(crate) fn index_of(&self, key: &[u8]) -> Result<usize, LockError> {
        self.inner
            .hold()
            .keys
            .iter()
            .position(|k| **k == *key)
            .ok_or(LockError::InvalidArgument("not one of the guard's keys"))
    }

    /// Releases every key with one `LOCK.MRELEASE` (as [`LockGuard::release`]). When the hold
    /// was lost before, or the server no longer had it on one key, the other keys are released
    /// all the same and the answer is [`LockError::NotHeld`].
    pub async fn release(&mut self) -> Result<Release, LockError> {
        self.inner.release().await
    }

    pub(crate) fn into_inner(self) -> LockGuard {
        self.inner
    }
}

/// The keys of a multi-key handle, as the client takes them.
pub(crate) fn keys_of<K: AsRef<[u8]>>(keys: impl IntoIterator<Item = K>) -> Vec<Arc<[u8]>> {
    keys.into_iter().map(|k| Arc::from(k.as_ref())).collect()
}
