//! Lock handles: one owner identity on one key, and how it acquires.

use std::borrow::Cow;
use std::io;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use redis::{Cmd, Value};
use tokio::time::Instant;

use crate::acks::Acknowledgement;
use crate::backend::{self, refusal, Backend};
use crate::basics::{millis, FAILOVER_PAUSE, FAILOVER_PAUSE_MAX};
use crate::conn::{self, HoldConn, OwnConnection};
use crate::context::Context;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::handle::{HandleReleases, HandleState};
use crate::hold::{Hold, NewHold};
use crate::lost::{LostReason, LostWatch};
use crate::machine::{Binding, Event, Form, Identity, Renewal, Terms};
use crate::master::says_not_master;
use crate::node::Node;
use crate::reply;
use crate::servers::{Hop, Route};
use crate::tickets::{said, Answer, Asked, Pending, Said, Tickets, Wanted};

/// The default lease: Redisson's 30 s, renewed by the watchdog every 10 s.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// How much longer than the server-side wait a waiting connection's read timeout is.
const WAIT_MARGIN: Duration = Duration::from_secs(2);

/// How many times an acquire is sent again after its connection broke or timed out. Safe
/// because every acquire carries `ONCE`.
const RETRIES: u32 = 2;

/// An acquire sent again: what is left of its wait, and its pauses through a failover
/// ([`FAILOVER_PAUSE`] doubling up to [`FAILOVER_PAUSE_MAX`], while the client's failover
/// timeout, counted from the first failure, allows one more attempt).
struct Resend {
    wait: Option<Wait>,
    until: Option<Instant>,
    pause: Duration,
    failing_since: Option<Instant>,
}

impl Resend {
    fn new(wait: Option<Wait>) -> Resend {
        let until = match wait {
            Some(Wait::Timeout(t)) => Some(Instant::now() + t),
            _ => None,
        };
        Resend {
            wait,
            until,
            pause: FAILOVER_PAUSE,
            failing_since: None,
        }
    }

    /// The wait to ask for now: what is left of it; `None` once nothing is (one last attempt
    /// without waiting).
    fn wait_left(&self) -> Option<Wait> {
        match (self.wait, self.until) {
            (Some(Wait::Timeout(_)), Some(until)) => {
                let left = until.saturating_duration_since(Instant::now());
                (!left.is_zero()).then_some(Wait::Timeout(left))
            }
            (w, _) => w,
        }
    }

    /// A new failover (the master changed since the last failure): its count starts again.
    fn restart(&mut self) {
        self.failing_since = None;
        self.pause = FAILOVER_PAUSE;
    }

    /// After a failure through a failover: pauses, and says whether the failover timeout
    /// allows another attempt (false, at once, when it does not).
    async fn pause(&mut self, failover_timeout: Duration) -> bool {
        let since = *self.failing_since.get_or_insert_with(Instant::now);
        if since.elapsed() + self.pause >= failover_timeout {
            return false;
        }
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(FAILOVER_PAUSE_MAX);
        true
    }
}

/// The kind of hold a [`Lock`] handle takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The exclusive lock (and write side of the read-write lock).
    Exclusive,
    /// A shared (read) hold: `LOCK.ACQUIRE ... SHARED`.
    Shared,
    /// One permit of a counting semaphore: `LOCK.ACQUIRE ... LIMIT n`.
    Permit {
        /// The semaphore's number of permits.
        limit: u32,
    },
}

/// How long [`Lock::acquire`] waits for a busy key (in the server: `LOCK.ACQUIRE ... WAIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Until the key is granted (`WAIT 0`). The default.
    Forever,
    /// At most this long, then [`LockError::Timeout`]. A zero timeout is one attempt.
    Timeout(Duration),
}

/// A handle on one key, with its own owner identity (`<client id>:<n>`).
///
/// Re-entry is per handle: while a guard of this handle holds the key, acquiring again through
/// the same handle (or a clone of it) succeeds at once with the same fencing token, and the hold
/// ends when the last of its guards is released. The server sees one hold per handle (count 1):
/// every `LOCK.ACQUIRE` carries `ONCE`, which makes a re-sent acquire (after a timeout or a broken
/// connection) harmless, and lets the library retry it. Two handles, even on the same key and
/// client, are two owners and exclude each other.
///
/// The options (`lease`, `wait_timeout`, `ephemeral`, ...) are set on the handle before use; a
/// clone keeps them and shares the owner.
///
/// ```no_run
/// # async fn demo(client: redis_lock_client::LockClient) -> Result<(), redis_lock_client::LockError> {
/// use std::time::Duration;
///
/// let lock = client
///     .lock("report")
///     .lease(Duration::from_secs(10))          // renewed every ~3.3 s while held
///     .wait_timeout(Duration::from_secs(5));   // acquire() waits in the server, at most 5 s
/// match lock.try_acquire().await? {
///     Some(guard) => println!("got it at once, token {}", guard.token()),
///     None => println!("busy"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Lock {
    ctx: Arc<Context>,
    spec: Arc<Spec>,
    state: Arc<HandleState>,
    lease: Duration,
    renewal: Renewal,
    wait: Wait,
    ephemeral: bool,
    /// What each grant and renewal must be acknowledged by before it counts.
    acks: Acknowledgement,
    /// `LOCK.ACQUIRE` without `WAIT` as these options make it, built once (a builder method
    /// that changes an option clears it).
    acquire: OnceLock<Cmd>,
}

/// The command a handle acquires with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    /// `LOCK.ACQUIRE key ...`.
    Acquire,
    /// `LOCK.MACQUIRE numkeys key... ...`: every key at once.
    MultiAcquire,
    /// `LOCK.CAMPAIGN key candidate ...`: an exclusive hold that the server announces.
    Campaign,
}

/// What a handle is: its keys, owner and kind of hold.
struct Spec {
    /// The keys (one, but for a multi-key handle).
    keys: Arc<[Arc<[u8]>]>,
    owner: Arc<str>,
    /// `LOCK.RELEASE key owner` (`LOCK.MRELEASE n key... owner`), the same for every hold of the
    /// handle.
    release: Arc<Cmd>,
    kind: Kind,
    verb: Verb,
}

impl Spec {
    /// The first key: the one a connection of its own is opened for.
    fn key(&self) -> &[u8] {
        self.keys.first().map_or(&[], |k| k)
    }

    fn form(&self) -> Form {
        match self.verb {
            Verb::MultiAcquire => Form::Many,
            Verb::Acquire | Verb::Campaign => Form::One,
        }
    }
}

/// What one attempt at an acquire came to.
enum Settled {
    Guard(LockGuard),
    Busy,
    /// A release of the handle started while the acquire was on its way: send it again.
    Again,
}

/// How many times an acquire is sent again because a release of the same handle started while
/// it was on its way.
const AGAIN: u32 = 3;

impl Lock {
    pub(crate) fn new(
        ctx: Arc<Context>,
        keys: Vec<Arc<[u8]>>,
        owner: Arc<str>,
        kind: Kind,
        verb: Verb,
    ) -> Lock {
        let mut release = match verb {
            Verb::MultiAcquire => {
                let mut cmd = redis::cmd("LOCK.MRELEASE");
                cmd.arg(keys.len());
                cmd
            }
            Verb::Acquire | Verb::Campaign => redis::cmd("LOCK.RELEASE"),
        };
        for key in &keys {
            release.arg(&**key);
        }
        release.arg(owner.as_bytes());
        Lock {
            ctx,
            spec: Arc::new(Spec {
                keys: keys.into(),
                owner,
                release: Arc::new(release),
                kind,
                verb,
            }),
            state: Arc::new(HandleState::new()),
            lease: DEFAULT_LEASE,
            renewal: Renewal::Watchdog,
            wait: Wait::Forever,
            ephemeral: false,
            acks: Acknowledgement::default(),
            acquire: OnceLock::new(),
        }
    }

    /// The lease each hold gets on the server (default [`DEFAULT_LEASE`], 30 s). The watchdog
    /// renews it every `lease / 3` while the hold lasts; if it cannot for a whole lease, the
    /// hold is reported lost ([`LostReason::Unreachable`](crate::LostReason::Unreachable)).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self.renewal = Renewal::Watchdog;
        self.acquire = OnceLock::new();
        self
    }

    /// A lease nothing renews: the hold ends on the server `lease` after the acquire (or
    /// re-entry), and the guard reports [`LostReason::LeaseEnded`](crate::LostReason::LeaseEnded) then.
    pub fn fixed_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self.renewal = Renewal::Fixed;
        self.acquire = OnceLock::new();
        self
    }

    /// How long [`Lock::acquire`] waits in the server for a busy key (default: until granted).
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.wait = Wait::Timeout(timeout);
        self
    }

    /// Holds are `EPHEMERAL`: bound to a connection the guard owns, they end in the server the
    /// moment that connection closes (the process died, the socket broke, `CLIENT KILL`). Its
    /// close, seen by the library, reports the hold lost
    /// ([`LostReason::ConnectionClosed`](crate::LostReason::ConnectionClosed)) once a read on the
    /// client's shared connection finds the hold gone (the server may see the close a moment
    /// later; a renewal with no answer on a live connection is no loss). It is never
    /// reconnected. Caveat: the server's `timeout` setting closes idle connections; the
    /// watchdog's renewals keep it busy at `lease / 3`, so keep `timeout` at 0 (the default) or
    /// well above a third of the lease — and with [`Lock::fixed_lease`] nothing is sent at all.
    pub fn ephemeral(mut self) -> Self {
        self.ephemeral = true;
        self.acquire = OnceLock::new();
        self
    }

    /// Every grant, and every renewal, counts only once `replicas` replicas acknowledged it
    /// (`WAIT replicas timeout`, sent on the hold's connection right after the write): a hold
    /// the master granted but never replicated is lost when a replica is promoted, and the new
    /// master may grant it again. Default: off (a grant counts when the master answers).
    ///
    /// - **After a grant** (at once or after a wait) the acquire sends one renewal and `WAIT`
    ///   in one round trip before it returns the guard. When fewer replicas acknowledged within
    ///   `timeout`, it **releases the hold and answers
    ///   [`LockError::NotSafelyAcquired`]** (with the grant's tokens, how many replicas
    ///   acknowledged of how many, and why); it does not retry: the application decides whether
    ///   to acquire again (the next grant has another token). A fixed lease is set again from
    ///   that renewal.
    /// - **After each renewal** the watchdog sends `WAIT` too, and the guard's loss deadline
    ///   moves only on renewals the replicas acknowledged: a renewal the master never
    ///   replicated does not make the guard believe it holds longer than a promoted replica
    ///   would. Renewals unacknowledged for a whole lease report the hold lost
    ///   ([`LostReason::Unreachable`](crate::LostReason::Unreachable)).
    /// - `WAIT` blocks the connection it is sent on for up to `timeout`, so `timeout` must be
    ///   below the client's command timeout (2 s by default): else the acquire answers
    ///   [`LockError::InvalidArgument`].
    ///
    /// It is not consensus: a failover to a replica that did not acknowledge, or a partition
    /// with a master on each side, can still lose a grant. `min-replicas-to-write` on the
    /// servers narrows the second.
    ///
    /// ```no_run
    /// # async fn demo(client: redis_lock_client::LockClient) -> Result<(), redis_lock_client::LockError> {
    /// use std::time::Duration;
    /// use redis_lock_client::LockError;
    ///
    /// let lock = client.lock("orders:42").replicas(1, Duration::from_millis(500));
    /// match lock.acquire().await {
    ///     Ok(mut guard) => { /* held, and on a replica */ guard.release().await?; }
    ///     Err(LockError::NotSafelyAcquired { tokens, acknowledged, wanted, .. }) => {
    ///         eprintln!("{tokens:?} released: {acknowledged} of {wanted} replicas acknowledged")
    ///     }
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.acks.replicas = Some((replicas, timeout));
        self
    }

    /// Every grant and renewal counts only once it is in the AOF of `local` servers (0 or 1:
    /// the master's own, which needs `appendonly yes` there) and of `replicas` replicas
    /// (`WAITAOF local replicas timeout`, Redis 7.2 and later), as [`Lock::replicas`] does with
    /// `WAIT`; both may be asked. Too few: [`LockError::NotSafelyAcquired`], the hold released.
    /// A server without `WAITAOF` (Redis 7.0) refuses it, and so every acquire answers
    /// `NotSafelyAcquired` with the server's error.
    pub fn wait_aof(mut self, local: u32, replicas: u32, timeout: Duration) -> Self {
        self.acks.aof = Some((local, replicas, timeout));
        self
    }

    /// The same handle (owner, keys, options) taking holds of another kind; nothing it held is
    /// carried over.
    pub(crate) fn with_kind(self, kind: Kind) -> Lock {
        let spec = &self.spec;
        let mut lock = Lock::new(
            self.ctx.clone(),
            spec.keys.to_vec(),
            spec.owner.clone(),
            kind,
            spec.verb,
        );
        lock.lease = self.lease;
        lock.renewal = self.renewal;
        lock.wait = self.wait;
        lock.ephemeral = self.ephemeral;
        lock.acks = self.acks;
        lock
    }

    /// Holds that are not `EPHEMERAL` (the default of a lock; an election's is `EPHEMERAL`).
    pub(crate) fn without_ephemeral(mut self) -> Self {
        self.ephemeral = false;
        self.acquire = OnceLock::new();
        self
    }

    /// The wait [`Lock::acquire`] uses.
    pub(crate) fn wait(&self) -> Wait {
        self.wait
    }

    /// What the client's handles share.
    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The key.
    pub fn key(&self) -> &[u8] {
        self.spec.key()
    }

    /// The keys (one, but for a multi-key handle), in the order given.
    pub(crate) fn keys(&self) -> &[Arc<[u8]>] {
        &self.spec.keys
    }

    /// The owner string this handle sends (`<client id>:<n>`).
    pub fn owner(&self) -> &str {
        &self.spec.owner
    }

    /// The kind of hold this handle takes.
    pub fn kind(&self) -> Kind {
        self.spec.kind
    }

    /// Takes the key if it is free (or re-enters this handle's hold), without waiting:
    /// `Ok(None)` when another owner holds it or others wait for it.
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>, LockError> {
        self.acquire_inner(None, None).await
    }

    /// Takes the key, waiting in the server (FIFO, no polling) as long as
    /// [`Lock::wait_timeout`] allows; [`LockError::Timeout`] when it passes. The wait delays no
    /// other command: it takes a ticket popped on the client's waiting connection
    /// ([`LockClientBuilder::wait_with_tickets`](crate::LockClientBuilder::wait_with_tickets),
    /// the default), or runs on a connection of its own whose read timeout is above the wait.
    /// Dropping the future withdraws the ticket (a grant that came meanwhile is released), or
    /// closes that connection, and the server forgets the waiter.
    ///
    /// When the wait took a third of the lease or more, the hold is confirmed before the guard
    /// is returned (a renewal sent at once; for a fixed lease, a read of the lease it has left):
    /// its deadline then counts from that send, not from when the wait began. If the
    /// confirmation finds the hold gone, the acquire goes on within what is left of its wait
    /// (asked again three times at most, then [`LockError::Timeout`], with no wait left or
    /// not, as the Python library answers a timeout);
    /// if the server answers none of three, [`LockError::Connection`] (the hold then ends at its lease end, or
    /// this handle's next acquire takes it back). The handle's releases still on their way (a
    /// guard dropped without [`LockGuard::release`]) are answered before the acquire is sent.
    pub async fn acquire(&self) -> Result<LockGuard, LockError> {
        self.acquire_waiting(self.wait, None).await
    }

    /// [`Lock::acquire`] with this `wait`, and `VALUE value` for a campaign.
    pub(crate) async fn acquire_waiting(
        &self,
        wait: Wait,
        value: Option<&[u8]>,
    ) -> Result<LockGuard, LockError> {
        match self.acquire_inner(Some(wait), value).await? {
            Some(guard) => Ok(guard),
            None => Err(LockError::Timeout {
                waited: match wait {
                    Wait::Timeout(t) => t,
                    Wait::Forever => Duration::ZERO,
                },
            }),
        }
    }

    /// Runs `work` while holding the key: acquires (as [`Lock::acquire`]), calls
    /// `work(token, lost)` and polls its future beside the hold's loss. If the hold is lost
    /// first, the work's future is dropped at once (at its next `.await`: code between two
    /// awaits is not interrupted) and the answer is [`LockError::NotHeld`] with the reason;
    /// otherwise the hold is released and the work's output returned.
    ///
    /// `lost` is a [`LostWatch`] for work that must check before a step it cannot undo (or hand
    /// to a thread of its own). Pass `token` with every write to the protected resource.
    ///
    /// A hold found lost at the release (after the work finished) is also
    /// [`LockError::NotHeld`]: nothing then proves the work ran under the lock to its end. A
    /// release that cannot be sent is not an error of the work: the hold ends at its lease end.
    ///
    /// ```no_run
    /// # async fn demo(client: redis_lock_client::LockClient) -> Result<(), redis_lock_client::LockError> {
    /// let lock = client.lock("reports:daily");
    /// let rows = lock
    ///     .run(|token, _lost| async move {
    ///         // ... write with `token` as the fence ...
    ///         42
    ///     })
    ///     .await?; // Err(LockError::NotHeld { lost: Some(reason) }) if the hold was lost
    /// # let _ = rows; Ok(()) }
    /// ```
    pub async fn run<T, F, Fut>(&self, work: F) -> Result<T, LockError>
    where
        F: FnOnce(u64, LostWatch) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let mut guard = self.acquire().await?;
        let lost = guard.lost();
        let output = tokio::select! {
            biased;
            reason = lost => {
                // Dropping the guard here (the error path) stops the watchdog; nothing to
                // release.
                return Err(guard.not_held(reason));
            }
            output = work(guard.token(), guard.watch()) => output,
        };
        match guard.release().await {
            Ok(_) | Err(LockError::Connection(_)) => Ok(output),
            Err(e) => Err(e),
        }
    }

    /// `LOCK.ACQUIRE key owner lease [SHARED | LIMIT n] [EPHEMERAL] ONCE [WAIT ms]`,
    /// `LOCK.MACQUIRE n key... owner lease [SHARED] [EPHEMERAL] ONCE [WAIT ms]`, or
    /// `LOCK.CAMPAIGN key candidate lease [EPHEMERAL] [WAIT ms] [VALUE v]`.
    fn acquire_cmd(
        &self,
        wait: Option<Wait>,
        value: Option<&[u8]>,
        ticket: Ticket,
    ) -> Cow<'_, Cmd> {
        let base = self.acquire.get_or_init(|| {
            let mut cmd = match self.spec.verb {
                Verb::Acquire => redis::cmd("LOCK.ACQUIRE"),
                Verb::MultiAcquire => {
                    let mut cmd = redis::cmd("LOCK.MACQUIRE");
                    cmd.arg(self.spec.keys.len());
                    cmd
                }
                Verb::Campaign => redis::cmd("LOCK.CAMPAIGN"),
            };
            for key in self.spec.keys.iter() {
                cmd.arg(&**key);
            }
            cmd.arg(self.spec.owner.as_bytes()).arg(millis(self.lease));
            match self.spec.kind {
                Kind::Exclusive => {}
                Kind::Shared => {
                    cmd.arg("SHARED");
                }
                Kind::Permit { limit } => {
                    cmd.arg("LIMIT").arg(limit);
                }
            }
            if self.ephemeral {
                cmd.arg("EPHEMERAL");
            }
            if self.spec.verb != Verb::Campaign {
                // A campaign is ONCE by itself (a leader campaigning again keeps its epoch).
                cmd.arg("ONCE");
            }
            cmd
        });
        let ms = match wait {
            None | Some(Wait::Timeout(Duration::ZERO)) => None,
            Some(Wait::Forever) => Some(0),
            Some(Wait::Timeout(t)) => Some(millis(t)),
        };
        if ms.is_none() && value.is_none() {
            return Cow::Borrowed(base);
        }
        let mut cmd = base.clone();
        if let Some(ms) = ms {
            cmd.arg("WAIT").arg(ms);
            if ticket == Ticket::Yes {
                cmd.arg("TICKET");
            }
        }
        if let Some(value) = value {
            cmd.arg("VALUE").arg(value);
        }
        Cow::Owned(cmd)
    }

    async fn acquire_inner(
        &self,
        wait: Option<Wait>,
        value: Option<&[u8]>,
    ) -> Result<Option<LockGuard>, LockError> {
        if self.lease.is_zero() {
            return Err(LockError::InvalidArgument(
                "the lease must be at least 1 ms",
            ));
        }
        check_keys(&self.spec.keys)?;
        if self.acks.is_on() && self.acks.blocks_for() >= self.ctx.command_timeout {
            return Err(LockError::InvalidArgument(
                "the acknowledgement timeout (replicas, wait_aof) must be below the command timeout",
            ));
        }
        let wait = match wait {
            Some(Wait::Timeout(Duration::ZERO)) => None,
            w => w,
        };
        let _gate = self.state.gate.lock().await;
        let functions = self.check_backend(value).await?;
        let until = match wait {
            Some(Wait::Timeout(t)) => Some(Instant::now() + t),
            _ => None,
        };
        let mut wait = wait;
        let mut again = 0;
        loop {
            // The handle's releases on their way are answered first: an acquire (ONCE) that
            // overtook one would be answered with the old hold, which the release then frees.
            // Asked again, no longer than the wait allows (a background release goes on for up
            // to a lease while no master answers); without a wait, a command timeout.
            let mark = if again == 0 {
                self.state.settle_releases().await
            } else {
                let left = match until {
                    Some(until) => until.saturating_duration_since(Instant::now()),
                    None if wait.is_none() => self.ctx.command_timeout,
                    None => Duration::MAX,
                };
                let mark = match tokio::time::timeout(left, self.state.settle_releases()).await {
                    Ok(mark) => mark,
                    Err(_) => return Ok(None),
                };
                // Asked again for what is left of the wait (none left: once, not waiting), not
                // the whole of it again.
                if let Some(until) = until {
                    let left = until.saturating_duration_since(Instant::now());
                    wait = (!left.is_zero()).then_some(Wait::Timeout(left));
                }
                mark
            };
            let current = self.state.current();
            let sent = Instant::now();
            let (reply, own) = if self.ephemeral {
                // A new EPHEMERAL hold that must wait takes a ticket on the connection it will
                // be bound to; a re-entry asks on its hold's connection, as before.
                let reentry = current.as_ref().and_then(|c| c.own_connection()).is_some();
                let (reply, own) = if reentry {
                    self.send_ephemeral(current.as_ref(), wait, value).await
                } else {
                    self.send_new_ephemeral(current.as_ref(), wait, value).await
                };
                match reply {
                    Ok(reply) => (reply, own),
                    Err(e) => {
                        if let Some(c) = &current {
                            if c.own_connection().is_some() && e.is_retryable() {
                                // Its connection failed: the server ends the hold with it.
                                c.step(Event::ConnectionLost);
                            }
                        }
                        return Err(e);
                    }
                }
            } else {
                match (wait, &self.ctx.tickets) {
                    (Some(wait), _) if functions => (self.send_unlocked(wait, value).await?, None),
                    (Some(wait), Some(tickets)) => {
                        (self.send_ticketed(tickets, wait, value).await?, None)
                    }
                    _ => (
                        self.send_with_retries(wait, value, Ticket::No, None)
                            .await?
                            .0,
                        None,
                    ),
                }
            };
            let replied = Instant::now();
            let tokens = reply::tokens(reply, self.spec.keys.len())?;
            if tokens.is_some() && self.state.released_since(mark) && again < AGAIN {
                // Whatever it was answered may be the hold that release frees: wait for it and
                // ask again (ONCE: a hold granted meanwhile is answered again, not taken twice).
                again += 1;
                continue;
            }
            match self.settle(current, tokens, sent, replied, own).await? {
                Settled::Guard(guard) => return Ok(Some(guard)),
                Settled::Busy => return Ok(None),
                Settled::Again if again < AGAIN => again += 1,
                // Every grant was gone by its confirmation, or the handle's hold kept changing:
                // not acquired (a timeout for `acquire`), as in the Python library; not an
                // `UnexpectedReply`, which no reply here was.
                Settled::Again => return Ok(None),
            }
        }
    }

    /// Whether the key's server has the `redislock` Functions library, after refusing
    /// ([`LockError::NotSupported`]), before anything is sent, what this handle asks of it that
    /// it cannot do (see [`backend::sent_as`]), or the lost-hold signal asked for by name. A
    /// server that cannot be asked now is asked by the send (which refuses the same commands).
    async fn check_backend(&self, value: Option<&[u8]>) -> Result<bool, LockError> {
        let backend = match self.ctx.commands.backend(self.spec.key()).await {
            Ok(backend) => backend,
            Err(e) if e.is_retryable() => return Ok(false),
            Err(e) => return Err(e),
        };
        if backend != Backend::Functions {
            return Ok(false);
        }
        backend::sent_as(backend, &self.acquire_cmd(None, value, Ticket::No))?;
        if self.ctx.lost_signal_asked {
            return Err(refusal(
                "the lost-hold signal (listen_for_lost_signal, lost_signal_prefix)",
            ));
        }
        Ok(true)
    }

    /// A waiting acquire on the `redislock` Functions library, which cannot block
    /// ([`crate::unlocked::wait_unlocked`]): the acquire without `WAIT` asked again at each
    /// unlock message and at the holder's lease end, until `wait` passes.
    async fn send_unlocked(&self, wait: Wait, value: Option<&[u8]>) -> Result<Value, LockError> {
        let until = match wait {
            Wait::Timeout(t) => Some(Instant::now() + t),
            Wait::Forever => None,
        };
        // Boxed: the acquire's future would otherwise nest the wait's whole machinery.
        Box::pin(crate::unlocked::wait_unlocked(
            &self.ctx.servers,
            &self.ctx.commands,
            self.spec.key(),
            self.ctx.command_timeout,
            until,
            || async {
                self.send_with_retries(None, value, Ticket::No, None)
                    .await
                    .map(|(reply, _)| reply)
            },
        ))
        .await
    }

    /// Sends the acquire on the shared connection (no wait) or on a fresh connection of its own
    /// (wait), again after a broken or timed-out connection: `ONCE` makes that safe. Through
    /// Sentinel, a server that answers as a replica counts as a broken connection, and the
    /// acquire is sent again, to the master the Sentinels name, with growing pauses, until a
    /// master answers or the failover timeout passes; a wait for what is left of it (its place
    /// in the old master's queue is gone, it joins the new one's).
    ///
    /// With `ticket`, a wait is asked with `TICKET` ([`Tickets::ask`]; `to`: where a ticket's
    /// redirect sent it): the reply (a ticket, the token, or nil) comes at once, with the
    /// connection that asked.
    async fn send_with_retries(
        &self,
        wait: Option<Wait>,
        value: Option<&[u8]>,
        ticket: Ticket,
        to: Option<&Hop>,
    ) -> Result<(Value, Option<Asked>), LockError> {
        let failover = self.ctx.servers.follows_failover();
        let mut resend = Resend::new(wait);
        let mut attempt = 0;
        loop {
            let this_wait = resend.wait_left();
            let cmd = self.acquire_cmd(this_wait, value, ticket);
            let mut asked_on = None;
            let reply = match (this_wait, ticket) {
                (None, _) => {
                    let key = self.spec.key();
                    self.ctx.commands.query_routed(&cmd, Some(key)).await
                }
                (Some(_), Ticket::Yes) => {
                    let (reply, on) = self.ask_for_ticket(cmd.into_owned(), to).await;
                    asked_on = on;
                    reply
                }
                (Some(w), Ticket::No) => self.send_waiting(&cmd, w).await,
            };
            let again = matches!(&reply,
                Err(e) if e.is_retryable() || (failover && says_not_master(e)));
            if again && attempt < RETRIES {
                attempt += 1;
                continue;
            }
            // Through a failover: the master is gone or not yet replaced. A wait is issued
            // again for what is left of it.
            if again && failover && resend.pause(self.ctx.failover_timeout).await {
                continue;
            }
            return reply.map(|reply| (reply, asked_on));
        }
    }

    /// `cmd` (`... WAIT ms TICKET`) asked ([`Tickets::ask`]) in a task of its own: if this
    /// future is dropped while the ask is on its way, what the server answers (a ticket, or a
    /// grant made at once) is withdrawn (`LOCK.CANCEL`) or released in the background, counted
    /// as the handle's release, instead of being left queued and granted to nobody.
    async fn ask_for_ticket(&self, cmd: Cmd, to: Option<&Hop>) -> Asking {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let ctx = self.ctx.clone();
        let key: Arc<[u8]> = Arc::from(self.spec.key());
        let to = to.cloned();
        tokio::spawn(async move {
            let reply = match &ctx.tickets {
                Some(tickets) => tickets.ask(&ctx.servers, &cmd, &key, to).await,
                None => (Err(LockError::Connection(ask_lost())), None),
            };
            let _ = tx.send(reply);
        });
        let mut asking = AskInFlight {
            reply: Some(rx),
            lock: self,
        };
        let answer = match asking.reply.as_mut() {
            Some(rx) => rx.await,
            None => return (Err(LockError::Connection(ask_lost())), None),
        };
        asking.reply = None;
        answer.unwrap_or_else(|_| (Err(LockError::Connection(ask_lost())), None))
    }

    /// A waiting acquire with a ticket: asked ([`Tickets::ask`]); a ticket replied is waited
    /// for on the client's waiting connections. A ticket made void (its asking connection
    /// closed, the master changed) is withdrawn and the acquire asked again, for what is left
    /// of the wait; one whose wait passed with no answer is withdrawn. Withdrawn, a ticket
    /// that was granted meanwhile answers the grant (`LOCK.CANCEL`): it is taken. A ticket that
    /// answers a redirect (in a cluster, the lock left with its slot) is asked again where it
    /// says, and one that answers `expired` (a grant not popped before its lease ended) is asked
    /// again, both for what is left of the wait. Dropped while it waits, the ticket is withdrawn
    /// in the background (and a grant released), counted as a release of the handle.
    async fn send_ticketed(
        &self,
        tickets: &Arc<Tickets>,
        wait: Wait,
        value: Option<&[u8]>,
    ) -> Result<Value, LockError> {
        let deadline = match wait {
            Wait::Timeout(t) => Some(Instant::now() + t),
            Wait::Forever => None,
        };
        let mut left = Some(wait);
        let mut failing_since: Option<Instant> = None;
        let mut to: Option<Hop> = None;
        loop {
            let next = to.take();
            let (reply, asked) = self
                .send_with_retries(left, value, Ticket::Yes, next.as_ref())
                .await?;
            let Value::BulkString(ticket) = reply else {
                return Ok(reply);
            };
            let Some(asked) = asked else {
                return Err(LockError::UnexpectedReply(
                    "a ticket from an acquire that did not ask for one".into(),
                ));
            };
            let answer = tickets.wait(Wanted {
                ticket: ticket.clone(),
                deadline,
                asked: asked.clone(),
                key: self
                    .spec
                    .keys
                    .first()
                    .cloned()
                    .unwrap_or_else(|| Arc::from(&[][..])),
                release: self.spec.release.clone(),
            });
            let mut waiting = TicketWait {
                ticket,
                answer: Some(answer),
                lock: self,
            };
            let answer = waiting.answer().await;
            match answer {
                Answer::Popped(answer) => {
                    waiting.done();
                    match said(&answer) {
                        // The lock left with its slot: asked again where it went.
                        Said::Redirect(redirect) if self.ctx.servers.is_cluster() => {
                            let Some(node) = asked.node() else {
                                return self.popped(&answer);
                            };
                            to = Some(Route::after(&self.ctx.servers, &redirect, node)?);
                        }
                        // A grant not popped before its lease ended: nothing is held.
                        Said::Expired => {}
                        _ => return self.popped(&answer),
                    }
                }
                Answer::Void => {
                    // The server dropped the ticket with its connection (a grant not popped
                    // went to the next waiter), or the master that has it is no longer the
                    // master: it holds nothing for us, whatever the withdrawal answers.
                    let taken = waiting.withdraw().await.unwrap_or(Value::Nil);
                    if !matches!(taken, Value::Nil) {
                        return Ok(taken);
                    }
                }
                Answer::Expired => {
                    let taken = waiting.withdraw().await?;
                    if !matches!(taken, Value::Nil) {
                        return Ok(taken);
                    }
                }
                Answer::Failed(e) => {
                    let taken = waiting.withdraw().await.unwrap_or(Value::Nil);
                    if !matches!(taken, Value::Nil) {
                        return Ok(taken);
                    }
                    // Through a failover the waiting connection cannot be opened to the old
                    // master: asked again (on the new one, once the Sentinels name it) until
                    // the failover timeout passes.
                    let failing = failing_since.get_or_insert_with(Instant::now).elapsed();
                    if !self.ctx.servers.follows_failover()
                        || failing + FAILOVER_PAUSE_MAX >= self.ctx.failover_timeout
                    {
                        return Err(e);
                    }
                    tokio::time::sleep(FAILOVER_PAUSE_MAX).await;
                }
            }
            left = match deadline {
                None => Some(Wait::Forever),
                Some(d) => {
                    let rest = d.saturating_duration_since(Instant::now());
                    if rest.is_zero() {
                        return Ok(Value::Nil);
                    }
                    Some(Wait::Timeout(rest))
                }
            };
        }
    }

    /// A ticket's popped answer as the acquire's reply: the token (tokens, for a multi-key
    /// acquire), nil for `timeout`, or the error.
    fn popped(&self, answer: &[u8]) -> Result<Value, LockError> {
        let unexpected = || {
            LockError::UnexpectedReply(format!(
                "the ticket answered {:?}",
                String::from_utf8_lossy(answer)
            ))
        };
        let text = match said(answer) {
            Said::TimedOut | Said::Expired => return Ok(Value::Nil),
            Said::Error(_) | Said::Redirect(_) => {
                let text = String::from_utf8_lossy(answer);
                let error = text.strip_prefix('-').unwrap_or(&text);
                return Err(LockError::Server(error.to_string()));
            }
            Said::Unknown(_) => return Err(unexpected()),
            Said::Granted(text) => text,
        };
        let tokens: Option<Vec<Value>> = text
            .split(' ')
            .map(|t| t.parse::<i64>().ok().map(Value::Int))
            .collect();
        match (tokens, self.spec.verb) {
            (Some(tokens), Verb::MultiAcquire) => Ok(Value::Array(tokens)),
            (Some(mut tokens), _) if tokens.len() == 1 => Ok(tokens.remove(0)),
            _ => Err(unexpected()),
        }
    }

    /// A waiting acquire, on a connection opened for it (to the key's node) and closed after it.
    async fn send_waiting(&self, cmd: &Cmd, wait: Wait) -> Result<Value, LockError> {
        let limit = match wait {
            Wait::Forever => None,
            Wait::Timeout(t) => Some(t + WAIT_MARGIN),
        };
        self.send_on_own_connection(cmd, Pushes::No, limit).await.0
    }

    /// A new `EPHEMERAL` hold (not a re-entry): a wait with a ticket when the client has them,
    /// else asked on a new connection ([`Lock::send_ephemeral`]). Through Sentinel, an acquire a
    /// failover ended (the master it asked was replaced, or cannot be reached) is asked again on
    /// the master the Sentinels name, as a plain one is, with growing pauses, for what is left of
    /// its wait, until the failover timeout passes (counted from the first failure after the
    /// last change of master). A grant the old master made in it and replicated before it died
    /// is bound to nothing on the new master, which answers the owner's `EPHEMERAL` ask with
    /// `ERR the owner's hold is not EPHEMERAL`: that hold is this handle's (its owner is the
    /// handle's, and the handle holds nothing), so it is released there and the acquire asked
    /// again, once.
    async fn send_new_ephemeral(
        &self,
        current: Option<&Arc<Hold>>,
        wait: Option<Wait>,
        value: Option<&[u8]>,
    ) -> (Result<Value, LockError>, Option<OwnConnection>) {
        let follow = self.ctx.servers.follows_failover();
        let mut resend = Resend::new(wait);
        let mut released = false;
        loop {
            let left = resend.wait_left();
            let generation = self.ctx.servers.generation();
            let (reply, own) = match (left, &self.ctx.tickets) {
                (Some(left), Some(tickets)) => {
                    self.send_ephemeral_ticketed(tickets, left, value).await
                }
                _ => self.send_ephemeral(current, left, value).await,
            };
            let Err(e) = &reply else {
                return (reply, own);
            };
            if !follow {
                return (reply, own);
            }
            if e.is_retryable() || says_not_master(e) {
                if self.ctx.servers.generation() != generation {
                    // It reached a master that was replaced meanwhile: a new failover.
                    resend.restart();
                }
                if resend.pause(self.ctx.failover_timeout).await {
                    continue;
                }
            } else if resend.failing_since.is_some() && !released && says_not_ephemeral(e) {
                released = true;
                let key = self.spec.key();
                if self
                    .ctx
                    .commands
                    .query_routed(&self.spec.release, Some(key))
                    .await
                    .is_ok()
                {
                    continue;
                }
            }
            return (reply, own);
        }
    }

    /// An `EPHEMERAL` acquire: on the current hold's own connection (a re-entry), or on a new
    /// one that the new hold will own. No retry: a broken connection took its hold with it.
    async fn send_ephemeral(
        &self,
        current: Option<&Arc<Hold>>,
        wait: Option<Wait>,
        value: Option<&[u8]>,
    ) -> (Result<Value, LockError>, Option<OwnConnection>) {
        let limit = match wait {
            None => Some(self.ctx.command_timeout),
            Some(Wait::Forever) => None,
            Some(Wait::Timeout(t)) => Some(t + WAIT_MARGIN),
        };
        let cmd = self.acquire_cmd(wait, value, Ticket::No);
        let existing = current.and_then(|c| c.own_connection());
        match existing {
            Some(mut conn) => (
                within(limit, cmd.query_async::<Value>(&mut conn)).await,
                None,
            ),
            None => self.send_on_own_connection(&cmd, Pushes::Yes, limit).await,
        }
    }

    /// A new `EPHEMERAL` hold that waits with a ticket: asked (`... EPHEMERAL WAIT ms TICKET`) on
    /// a new connection to the key's node, the one the hold will be bound to (the server binds
    /// it to the connection that asked), and popped on the client's waiting connection. That
    /// connection stays the acquire's while the ticket waits: if it fails, the server dropped
    /// the ticket (and any grant in it), and the acquire asks again on a new one (through
    /// Sentinel, a failover ends this ask with a connection error, and
    /// [`Lock::send_new_ephemeral`] asks again on the new master). A ticket that
    /// answers a redirect or `expired` is asked again (on a new connection, where the redirect
    /// says), for what is left of the wait. Returns the answer, and the connection the grant is
    /// bound to.
    async fn send_ephemeral_ticketed(
        &self,
        tickets: &Arc<Tickets>,
        wait: Wait,
        value: Option<&[u8]>,
    ) -> (Result<Value, LockError>, Option<OwnConnection>) {
        let deadline = match wait {
            Wait::Timeout(t) => Some(Instant::now() + t),
            Wait::Forever => None,
        };
        let mut left = wait;
        let mut to: Option<Hop> = None;
        loop {
            let cmd = self.acquire_cmd(Some(left), value, Ticket::Yes);
            let start = to.take();
            let limit = Some(self.ctx.command_timeout);
            // Through Sentinel, the master of this generation or an older one is asked (a
            // failover since voids the ticket).
            let generation = tickets.generation();
            let (reply, own, node) = self
                .send_on_own_connection_from(&cmd, Pushes::Yes, limit, start)
                .await;
            let reply = match reply {
                Ok(reply) => reply,
                Err(e) => return (Err(e), None),
            };
            let (Value::BulkString(ticket), Some(conn), Some(node)) = (&reply, &own, &node) else {
                return (Ok(reply), own);
            };
            let ticket = ticket.clone();
            let asked = tickets.asked_on_own(conn.conn.clone(), node, generation);
            let answer = tickets.wait(Wanted {
                ticket: ticket.clone(),
                deadline,
                asked,
                key: Arc::from(self.spec.key()),
                release: self.spec.release.clone(),
            });
            let mut waiting = TicketWait {
                ticket,
                answer: Some(answer),
                lock: self,
            };
            match waiting.answer().await {
                Answer::Popped(answer) => {
                    waiting.done();
                    match said(&answer) {
                        Said::Redirect(redirect) if self.ctx.servers.is_cluster() => {
                            match Route::after(&self.ctx.servers, &redirect, node) {
                                Ok(hop) => to = Some(hop),
                                Err(e) => return (Err(e), None),
                            }
                        }
                        Said::Expired => {}
                        // A grant is bound to `own`, the connection that asked.
                        _ => return (self.popped(&answer), own),
                    }
                }
                Answer::Void => {
                    // The connection that asked failed: the server dropped the ticket, and a
                    // grant in it, with it. One the withdrawal still hands back is bound to
                    // nothing that lives: released.
                    let taken = waiting.withdraw().await.unwrap_or(Value::Nil);
                    if taken != Value::Nil {
                        let key = self.spec.key();
                        let _ = self
                            .ctx
                            .commands
                            .query_routed(&self.spec.release, Some(key))
                            .await;
                    }
                    // Through Sentinel, a failover ends the ticket's ask (sent again to the new
                    // master by `send_new_ephemeral`).
                    if tickets.generation() != generation {
                        return (Err(crate::conn::master_changed()), None);
                    }
                }
                Answer::Expired => match waiting.withdraw().await {
                    Ok(Value::Nil) => {}
                    // Granted just then: bound to `own`, which lives.
                    Ok(taken) => return (Ok(taken), own),
                    Err(e) => return (Err(e), None),
                },
                Answer::Failed(e) => {
                    let taken = waiting.withdraw().await.unwrap_or(Value::Nil);
                    if taken != Value::Nil {
                        return (Ok(taken), own);
                    }
                    return (Err(e), None);
                }
            }
            left = match deadline {
                None => Wait::Forever,
                Some(d) => {
                    let rest = d.saturating_duration_since(Instant::now());
                    if rest.is_zero() {
                        return (Ok(Value::Nil), None);
                    }
                    Wait::Timeout(rest)
                }
            };
        }
    }

    /// Sends `cmd` on a new connection to the node that serves the key (the one server, or the
    /// master of the key's slot in the client's slot map), following `MOVED` (the slot moved:
    /// the map is dropped, to be read again by the next lookup) and `ASK` (with `ASKING`: the
    /// slot is moving) to another node. A node of the map that cannot be reached also drops the
    /// map, and the node is looked up once more: nothing was sent to it. Returns the connection
    /// the answer came on.
    async fn send_on_own_connection(
        &self,
        cmd: &Cmd,
        pushes: Pushes,
        limit: Option<Duration>,
    ) -> (Result<Value, LockError>, Option<OwnConnection>) {
        let (reply, own, _) = self
            .send_on_own_connection_from(cmd, pushes, limit, None)
            .await;
        (reply, own)
    }

    /// [`Lock::send_on_own_connection`], starting where a redirect said (`start`: the redirect
    /// and the node that sent it) when one is given; with the node that answered.
    async fn send_on_own_connection_from(
        &self,
        cmd: &Cmd,
        pushes: Pushes,
        limit: Option<Duration>,
        start: Option<Hop>,
    ) -> (
        Result<Value, LockError>,
        Option<OwnConnection>,
        Option<Node>,
    ) {
        let servers = &self.ctx.servers;
        let timeout = self.ctx.command_timeout;
        let mut route = match Route::start(servers, self.spec.key(), start).await {
            Ok(route) => route,
            Err(e) => return (Err(e), None, None),
        };
        loop {
            let node = &route.node;
            let (target, push) = match pushes {
                Pushes::Yes => (&node.resp3, true),
                Pushes::No => (&node.client, false),
            };
            let mut own = match conn::own_connection(target, push, timeout).await {
                Ok(own) => own,
                Err(e) => match route.unreachable().await {
                    Ok(true) => continue,
                    Ok(false) => return (Err(e), None, None),
                    Err(e) => return (Err(e), None, None),
                },
            };
            // The connection's name, ASKING when a redirect said so, and the acquire: one
            // round trip.
            let first = conn::first_query(&mut own.conn, &self.ctx.name, route.asking, cmd);
            // Through Sentinel, a failover ends the wait (its connection is dropped with it):
            // the old master's queue no longer counts, nor any grant it might still make.
            let changes = servers.changes();
            let first = async {
                tokio::select! {
                    reply = first => Ok(reply),
                    _ = crate::master::changed(changes) => Err(conn::master_changed()),
                }
            };
            let reply = match limit {
                None => first.await,
                Some(limit) => match tokio::time::timeout(limit, first).await {
                    Ok(r) => r,
                    Err(_) => return (Err(timed_out()), None, None),
                },
            };
            let reply = match reply {
                Ok(reply) => reply,
                Err(e) => return (Err(e), None, None),
            };
            if let Err(e) = &reply {
                match route.redirected(e) {
                    Ok(true) => continue,
                    Ok(false) => {}
                    Err(e) => return (Err(e), None, None),
                }
            }
            let reply = reply.map_err(LockError::from);
            if let Err(e) = &reply {
                if says_not_master(e) {
                    // A replica now (a failover): the next lookup asks the Sentinels again.
                    servers.forget(&route.node);
                }
            }
            return (reply, Some(own), Some(route.node));
        }
    }

    /// Turns the server's answer into a guard: a re-entry of the current hold, or a new hold
    /// (the current one, if any, is then gone), handed out once its machine says so.
    async fn settle(
        &self,
        current: Option<Arc<Hold>>,
        tokens: Option<Vec<u64>>,
        sent: Instant,
        replied: Instant,
        own: Option<OwnConnection>,
    ) -> Result<Settled, LockError> {
        let state = &self.state;
        if let (Some(t), Some(c)) = (&tokens, &current) {
            if *c.tokens == **t {
                if !state.reenter(c) {
                    // Its last guard was released meanwhile.
                    return Ok(Settled::Again);
                }
                c.step(Event::Reentered { sent });
                return Ok(Settled::Guard(LockGuard::new(state.clone(), c.clone())));
            }
        }
        // Whatever the handle held is gone: the server answered another token, or nil.
        if let Some(c) = &current {
            c.step(Event::Replaced);
        }
        let Some(tokens) = tokens else {
            state.replace(None);
            return Ok(Settled::Busy);
        };
        let ctx = &self.ctx;
        let (conn, pushes) = match own {
            Some(mut own) => {
                own.conn.set_response_timeout(ctx.command_timeout);
                (
                    HoldConn::Own(own.conn),
                    own.pushes.map(|p| (p, ctx.servers.changes())),
                )
            }
            None => (HoldConn::Shared(ctx.commands.clone()), None),
        };
        // The redislock Functions library publishes no lost-hold signal: nothing to listen to
        // there (no pub/sub connection for it).
        let signals = match ctx.commands.backend(self.spec.key()).await {
            Ok(Backend::Functions) => None,
            _ => ctx.signals.clone(),
        };
        let hold = Hold::new(NewHold {
            identity: Identity {
                db: ctx.db,
                keys: self.spec.keys.clone(),
                owner: self.spec.owner.clone(),
                tokens: tokens.into(),
            },
            terms: Terms {
                lease: self.lease,
                renewal: self.renewal,
                binding: if self.ephemeral {
                    Binding::Connection
                } else {
                    Binding::Lease
                },
                form: self.spec.form(),
                acknowledged: self.acks.is_on(),
            },
            acks: self.acks,
            conn,
            reads: ctx.commands.clone(),
            release: self.spec.release.clone(),
            keeper: ctx.keepers.current(),
            command_timeout: ctx.command_timeout,
            signals,
            abandoned: Arc::new(HandleReleases(Arc::downgrade(state))),
        });
        // The old hold is no longer the handle's from here: a release of it cannot free this
        // one (another token).
        state.replace(Some(hold.clone()));
        let guard = LockGuard::new(state.clone(), hold.clone());
        // After a long wait, confirmed before it is handed out. A hold the server no longer has
        // goes with its guard (nothing to release), and the acquire goes on, within its wait,
        // as in the Python library; one the replicas did not acknowledge, or the ACL refused to
        // confirm, may still be on the server, and is released by its token here (the
        // machine's `release`); one whose confirmation got no answer is released in the
        // background (the machine's `abandon`, carried out by `Hold::step`: the handle's
        // release, which its next acquire waits for).
        match hold.granted(sent, replied).await {
            Ok(()) => {}
            // An EPHEMERAL grant whose connection failed before its confirmation answered
            // (released in the background: a replica it reached has it bound to nothing):
            // asked again, on the new master after a failover.
            Err(LockError::NotHeld {
                lost: Some(LostReason::ConnectionClosed),
            }) => return Ok(Settled::Again),
            // Gone: its lease ended before the grant's reply was read.
            Err(LockError::NotHeld {
                lost: None | Some(LostReason::HoldGone | LostReason::LeaseEnded),
            }) => return Ok(Settled::Again),
            // The master answered: released before the refusal is returned.
            Err(e @ (LockError::NotSafelyAcquired { .. } | LockError::NoPermission { .. })) => {
                let _ = state
                    .release_here(hold.runtime.clone(), hold.clone().release_abandoned())
                    .await;
                return Err(e);
            }
            // No answer: released in the background (again until a master answers).
            Err(e) => return Err(e),
        }
        if let Err(e) = hold.start(pushes).await {
            // The ACL refused a lost-hold channel (the error names it): the grant is released
            // before the refusal is returned, as one the replicas did not acknowledge.
            let mut guard = guard;
            let _ = guard.release().await;
            return Err(e);
        }
        Ok(Settled::Guard(guard))
    }
}

/// Whether a waiting acquire asks with `TICKET`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ticket {
    Yes,
    No,
}

/// A ticket being waited for: withdrawn if it is dropped before its answer was taken.
struct TicketWait<'a> {
    ticket: Vec<u8>,
    answer: Option<Pending>,
    lock: &'a Lock,
}

impl TicketWait<'_> {
    /// The ticket's answer (the waiting task ended: void, asked again).
    async fn answer(&mut self) -> Answer {
        match self.answer.as_mut() {
            Some(pending) => pending.answer().await,
            None => Answer::Void,
        }
    }

    /// The answer was taken: nothing to withdraw.
    fn done(&mut self) {
        self.answer = None;
    }

    /// `LOCK.CANCEL` of the ticket: nil, or the grant it held (now the caller's).
    async fn withdraw(&mut self) -> Result<Value, LockError> {
        self.answer = None;
        let mut cancel = redis::cmd("LOCK.CANCEL");
        cancel.arg(&self.ticket);
        match self.lock.ctx.commands.query(&cancel).await {
            // The asking connection is gone (the server dropped its tickets) or cannot say.
            Err(LockError::Connection(_)) => Ok(Value::Nil),
            other => other,
        }
    }
}

impl Drop for TicketWait<'_> {
    fn drop(&mut self) {
        let Some(pending) = self.answer.take() else {
            return;
        };
        // Given up now: the group stops popping the ticket at once.
        pending.leave();
        let ticket = std::mem::take(&mut self.ticket);
        self.lock
            .give_up(async move { Taken::Left(ticket, pending) });
    }
}

/// A ticketed ask on its way: if it is dropped before the reply was taken, the reply is taken
/// in the background and withdrawn: a ticket is cancelled (and the grant the cancel hands back
/// released), a grant made at once released.
struct AskInFlight<'a> {
    reply: Option<tokio::sync::oneshot::Receiver<Asking>>,
    lock: &'a Lock,
}

impl Drop for AskInFlight<'_> {
    fn drop(&mut self) {
        let Some(reply) = self.reply.take() else {
            return;
        };
        self.lock.give_up(async move {
            match reply.await {
                Ok((Ok(Value::BulkString(ticket)), _)) => Taken::Ticket(ticket),
                Ok((Ok(Value::Nil), _)) | Ok((Err(_), _)) | Err(_) => Taken::Nothing,
                Ok((Ok(_), _)) => Taken::Grant,
            }
        });
    }
}

/// What a ticketed wait that was given up had when it was: nothing, a grant (a token answered
/// at once), a ticket, or a ticket the group was popping ([`Pending::leave`]).
enum Taken {
    Nothing,
    Grant,
    Ticket(Vec<u8>),
    Left(Vec<u8>, Pending),
}

impl Lock {
    /// Gives up a ticketed wait in the background, counted as a release of the handle: once
    /// `taken` says what the wait had, a ticket is withdrawn (`LOCK.CANCEL`, routed by the
    /// ticket's name), and a grant (one it had, the one the cancel hands back, or the one the
    /// group popped for the ticket meanwhile: its last word is waited for) is released. So the
    /// handle's next acquire, which `ONCE` may answer with that grant's token, waits for that
    /// release: it cannot land under the new guard.
    fn give_up(&self, taken: impl std::future::Future<Output = Taken> + Send + 'static) {
        let commands = self.ctx.commands.clone();
        let release = self.spec.release.clone();
        let key: Arc<[u8]> = Arc::from(self.spec.key());
        let limit = self.ctx.command_timeout + LAST_WORD_MARGIN;
        let withdraw = async move {
            let cancel = |ticket: Vec<u8>| {
                let commands = commands.clone();
                async move {
                    let mut cancel = redis::cmd("LOCK.CANCEL");
                    cancel.arg(ticket);
                    matches!(commands.query(&cancel).await, Ok(v) if v != Value::Nil)
                }
            };
            let held = match taken.await {
                Taken::Nothing => false,
                Taken::Grant => true,
                Taken::Ticket(ticket) => cancel(ticket).await,
                // A grant is handed over once: to the cancel, or to the pop, never both.
                Taken::Left(ticket, pending) => {
                    let cancelled = cancel(ticket).await;
                    let popped = pending.last_word(limit).await.is_some();
                    cancelled || popped
                }
            };
            if held {
                let _ = commands.query_routed(&release, Some(&key)).await;
            }
        };
        let runtime = tokio::runtime::Handle::try_current().ok();
        self.state.release_in_background(runtime.as_ref(), withdraw);
    }
}

/// How long past the command timeout a given-up ticket's group may take to say whether it
/// popped a grant for it (its `BLPOP` is interrupted at once: normally a round trip).
const LAST_WORD_MARGIN: Duration = Duration::from_secs(2);

/// What a ticketed ask came to: the reply, and the connection that asked.
type Asking = (Result<Value, LockError>, Option<Asked>);

fn ask_lost() -> redis::RedisError {
    redis::RedisError::from(io::Error::other(
        "the ticketed acquire's task ended unanswered",
    ))
}

/// Whether a connection of its own needs the server's pushes (RESP3): an `EPHEMERAL` hold's
/// does, to see its close at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pushes {
    Yes,
    No,
}

fn timed_out() -> LockError {
    LockError::Connection(redis::RedisError::from(io::Error::new(
        io::ErrorKind::TimedOut,
        "LOCK.ACQUIRE got no reply in time",
    )))
}

/// `query` within `limit` (none: as long as it takes).
async fn within(
    limit: Option<Duration>,
    query: impl std::future::Future<Output = redis::RedisResult<Value>>,
) -> Result<Value, LockError> {
    match limit {
        None => query.await.map_err(LockError::from),
        Some(limit) => match tokio::time::timeout(limit, query).await {
            Ok(r) => r.map_err(LockError::from),
            Err(_) => Err(timed_out()),
        },
    }
}

/// The most keys one multi-key hold takes (the server's bound).
pub(crate) const MAX_KEYS: usize = 64;

/// The keys of a handle: 1 to [`MAX_KEYS`], distinct. Checked before anything is sent.
fn check_keys(keys: &[Arc<[u8]>]) -> Result<(), LockError> {
    if keys.is_empty() {
        return Err(LockError::InvalidArgument("a multi-key lock needs a key"));
    }
    if keys.len() > MAX_KEYS {
        return Err(LockError::InvalidArgument(
            "a multi-key lock takes at most 64 keys",
        ));
    }
    for (i, key) in keys.iter().enumerate() {
        if keys.iter().skip(i + 1).any(|other| other == key) {
            return Err(LockError::InvalidArgument(
                "a multi-key lock names each key once",
            ));
        }
    }
    Ok(())
}

/// The server's refusal of an `EPHEMERAL` re-entry of a hold bound to no connection (one taken
/// without `EPHEMERAL`, or one a restart or failover left bound to nothing).
fn says_not_ephemeral(e: &LockError) -> bool {
    matches!(e, LockError::Server(text) if text.contains("the owner's hold is not EPHEMERAL"))
}
