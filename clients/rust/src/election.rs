//! Leader election on a lock key: `LOCK.CAMPAIGN`, `LOCK.PROCLAIM`, `LOCK.LEADER`, and the
//! key's leader channel.

use std::future::Future;
use std::time::Duration;

use redis::{Cmd, FromRedisValue, Value};
use tokio::time::Instant;

use crate::error::LockError;
use crate::guard::{LockGuard, Release};
use crate::lock::{Lock, Wait};
use crate::lost::{LostReason, LostWatch};
use crate::machine::{Answer, Event, Read};
use crate::observer::{read_leader, Leader, Observer};

/// A handle on one election key, for one candidate
/// ([`LockClient::election`](crate::LockClient::election)): campaign for it, read its leader,
/// observe its leaders.
///
/// - [`Election::campaign`] waits in the server's FIFO queue (`LOCK.CAMPAIGN ... WAIT`, on a
///   connection of its own) until this candidate leads, and returns its [`Leadership`]. The
///   leadership is a hold like a [`Lock`](crate::Lock)'s: the watchdog renews it every
///   `lease / 3`, and it is reported lost as any hold is.
/// - `EPHEMERAL` by default: the leadership is bound to a connection it owns, so a crashed or
///   killed process stops leading at once, not at its lease end
///   ([`Election::not_ephemeral`] makes it a plain hold).
/// - [`Election::leader`] reads who leads now; [`Election::observe`] follows every change.
///
/// The candidate's name is the handle's owner string (`<client id>:<n>`): two handles are two
/// candidates. Campaigning again through a handle that leads returns the same leadership (the
/// epoch is kept).
///
/// ```no_run
/// # async fn demo(client: redis_lock_client::LockClient) -> Result<(), redis_lock_client::LockError> {
/// let election = client.election("billing-scheduler");
/// let mut leadership = election.campaign_with_value("10.0.0.1:80").await?; // waits
/// let epoch = leadership.epoch(); // the fence for every write the leader makes
/// tokio::select! {
///     reason = leadership.lost() => eprintln!("deposed ({reason}): stop acting as leader"),
///     _ = lead(epoch) => {}
/// }
/// leadership.resign().await?; // the next candidate leads at once
/// # Ok(()) }
/// # async fn lead(_epoch: u64) {}
/// ```
#[derive(Clone)]
pub struct Election {
    lock: Lock,
}

impl Election {
    pub(crate) fn new(lock: Lock) -> Election {
        Election {
            lock: lock.ephemeral(),
        }
    }

    /// The lease of the leadership's hold (default [`DEFAULT_LEASE`](crate::DEFAULT_LEASE)),
    /// renewed by the watchdog every `lease / 3`.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lock = self.lock.lease(lease);
        self
    }

    /// How long [`Election::campaign`] waits (default: until elected); then
    /// [`LockError::Timeout`].
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.lock = self.lock.wait_timeout(timeout);
        self
    }

    /// See [`Lock::replicas`](crate::Lock::replicas): the election, and each renewal of the
    /// leadership, acknowledged by `replicas` replicas before it counts
    /// ([`LockError::NotSafelyAcquired`] from a campaign whose election was not: the
    /// leadership was resigned).
    pub fn replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.lock = self.lock.replicas(replicas, timeout);
        self
    }

    /// See [`Lock::wait_aof`](crate::Lock::wait_aof).
    pub fn wait_aof(mut self, local: u32, replicas: u32, timeout: Duration) -> Self {
        self.lock = self.lock.wait_aof(local, replicas, timeout);
        self
    }

    /// The leadership is a plain hold, renewed by the watchdog on the shared connection, which
    /// outlives a broken connection (and a dead process) until its lease ends.
    pub fn not_ephemeral(mut self) -> Self {
        self.lock = self.lock.without_ephemeral();
        self
    }

    /// The election key.
    pub fn key(&self) -> &[u8] {
        self.lock.key()
    }

    /// The name this handle campaigns under (`LOCK.LEADER` shows it while it leads).
    pub fn candidate(&self) -> &str {
        self.lock.owner()
    }

    /// Waits until this candidate leads and returns its leadership (`LOCK.CAMPAIGN`). After a
    /// wait of a third of the lease or more the leadership is confirmed first, as
    /// [`Lock::acquire`](crate::Lock::acquire) does: elected after a long wait, it leads,
    /// renews and proclaims.
    pub async fn campaign(&self) -> Result<Leadership, LockError> {
        self.campaign_inner(None).await
    }

    /// [`Election::campaign`], proclaiming `value` with the election (`VALUE`): observers see
    /// the new leader and its value together. Campaigning again while leading proclaims it.
    pub async fn campaign_with_value(
        &self,
        value: impl AsRef<[u8]>,
    ) -> Result<Leadership, LockError> {
        self.campaign_inner(Some(value.as_ref())).await
    }

    /// One attempt, no wait: `Ok(None)` when another candidate leads (or others wait).
    pub async fn try_campaign(&self) -> Result<Option<Leadership>, LockError> {
        match self
            .lock
            .acquire_waiting(Wait::Timeout(Duration::ZERO), None)
            .await
        {
            Ok(guard) => Ok(Some(Leadership { guard })),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn campaign_inner(&self, value: Option<&[u8]>) -> Result<Leadership, LockError> {
        let guard = self.lock.acquire_waiting(self.lock.wait(), value).await?;
        Ok(Leadership { guard })
    }

    /// Who leads now (`LOCK.LEADER`), or `None` when nobody does.
    pub async fn leader(&self) -> Result<Option<Leader>, LockError> {
        read_leader(&self.lock.context().commands, self.key()).await
    }

    /// Follows the key's leaders: a [`Stream`](futures_core::Stream) of [`Leader`] in the order
    /// they led (see [`Observer`]). Call it inside a tokio runtime. On a server with the
    /// `redislock` Functions library (no elections: [`Backend`](crate::Backend)) the stream
    /// ends at once; [`Election::campaign`] and [`Election::leader`] answer
    /// [`LockError::NotSupported`] there.
    pub fn observe(&self) -> Observer {
        Observer::start(self.lock.context().clone(), self.key().into())
    }
}

/// This candidate leads: its [`epoch`](Leadership::epoch) (the fencing token of its hold),
/// [`lost`](Leadership::lost), [`proclaim`](Leadership::proclaim),
/// [`resign`](Leadership::resign). Dropping it resigns (in the background).
#[derive(Debug)]
pub struct Leadership {
    guard: LockGuard,
}

impl Leadership {
    /// The epoch: a fencing token, above every earlier leader's. Pass it with every write the
    /// leader makes, and have the resource refuse an epoch below the highest it has seen.
    pub fn epoch(&self) -> u64 {
        self.guard.token()
    }

    /// The election key.
    pub fn key(&self) -> &[u8] {
        self.guard.key()
    }

    /// The candidate's name.
    pub fn candidate(&self) -> &str {
        self.guard.owner()
    }

    /// `Some(reason)` once the leadership is known lost (deposed).
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.guard.lost_reason()
    }

    /// Resolves with the reason when the leadership is lost: its lease ended, its connection
    /// closed, it was forced out, a renewal or [`Leadership::proclaim`] found it gone. Never
    /// after a resignation.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.guard.lost()
    }

    /// A [`LostWatch`] of this leadership.
    pub fn watch(&self) -> LostWatch {
        self.guard.watch()
    }

    /// Publishes `value` (at most 4096 bytes) for observers (`LOCK.PROCLAIM`): `true`, or
    /// `false` when this leadership is over — resigned, lost, past its local deadline (then
    /// reported lost, [`LostReason::Unreachable`]), refused by the server because the
    /// candidate no longer leads in this epoch (then reported lost, [`LostReason::HoldGone`]),
    /// or its `EPHEMERAL` connection closed (reported lost once a read finds the hold gone:
    /// the server ends it with its connection). A deposed leader's proclamation is never
    /// published. [`LockError::Connection`] only when no answer came and the leadership may
    /// stand (a timeout on a live connection, a server still holding it after the command
    /// timeout).
    pub async fn proclaim(&self, value: impl AsRef<[u8]>) -> Result<bool, LockError> {
        proclaim(&self.guard, value.as_ref()).await
    }

    /// Runs `cmd` only while this candidate leads in this epoch, checked by the server in the
    /// same step (`LOCK.GUARD key candidate epoch <cmd...>`): as [`LockGuard::fenced`]. A
    /// deposed leader's command never runs: [`LockError::Fenced`], and the leadership is
    /// reported lost.
    ///
    /// ```no_run
    /// # async fn demo(client: redis_lock_client::LockClient) -> Result<(), redis_lock_client::LockError> {
    /// let leadership = client.election("{jobs}:leader").campaign().await?;
    /// let _: i64 = leadership.fenced(redis::cmd("RPUSH").arg("{jobs}:queue").arg("run")).await?;
    /// # Ok(()) }
    /// ```
    pub async fn fenced<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, LockError> {
        self.guard.fenced(cmd).await
    }

    /// Stops leading (`LOCK.RELEASE`): the next candidate in the queue is elected at once. As
    /// [`LockGuard::release`]: [`LockError::NotHeld`] if the leadership was lost before.
    pub async fn resign(&mut self) -> Result<Release, LockError> {
        self.guard.release().await
    }

    pub(crate) fn into_inner(self) -> LockGuard {
        self.guard
    }
}

/// [`Leadership::proclaim`] of the leadership `guard` holds (the blocking API's too).
pub(crate) async fn proclaim(guard: &LockGuard, value: &[u8]) -> Result<bool, LockError> {
    let hold = guard.hold();
    if guard.is_released() {
        return Ok(false);
    }
    // Time passing may have ended it (no renewal confirmed for a lease).
    hold.step(Event::Tick {
        now: Instant::now(),
    });
    if !hold.is_active() {
        return Ok(false);
    }
    let mut cmd = redis::cmd("LOCK.PROCLAIM");
    cmd.arg(hold.key())
        .arg(hold.owner.as_bytes())
        .arg(hold.token())
        .arg(value);
    let sent = Instant::now();
    match hold.query(&cmd).await {
        Ok(Value::Int(1)) => Ok(true),
        Ok(Value::Int(0)) => {
            // The server says this candidate no longer leads in this epoch.
            hold.step(Event::Answered {
                read: Read::Check(LostReason::HoldGone),
                sent,
                replied: Instant::now(),
                answer: Answer::Gone,
            });
            Ok(false)
        }
        Ok(other) => Err(LockError::UnexpectedReply(format!(
            "LOCK.PROCLAIM answered {other:?}"
        ))),
        Err(e) if e.is_retryable() && hold.own_connection().is_some() => {
            // The server ends an EPHEMERAL hold with its connection: reported lost once a read
            // finds it gone, and then the leadership is over (false). Until then it may stand
            // (a timeout on a live connection): the error, not a false "over".
            if hold.closed_outcome().await {
                Ok(false)
            } else {
                Err(e)
            }
        }
        Err(e) => Err(e),
    }
}
