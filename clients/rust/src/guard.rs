//! The guard: proof of a hold, its fencing token, its loss, its release.

use std::future::Future;
use std::sync::Arc;

use redis::{Cmd, FromRedisValue};

use crate::error::LockError;
use crate::handle::{GuardEnd, HandleState};
use crate::hold::Hold;
use crate::lost::{LostReason, LostWatch};
use crate::reply;

/// What [`LockGuard::release`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The hold ended on the server (`LOCK.RELEASE` answered); the key may be someone else's now.
    Released,
    /// Other guards of the same handle (re-entries) still hold the key; nothing was sent.
    StillHeld,
    /// This guard was already released: nothing was sent. Releasing is idempotent.
    AlreadyReleased,
}

/// A hold on a key. Dropping it releases it (see below); [`LockGuard::release`] releases it and
/// says how that went.
///
/// While the guard lives, the watchdog renews the lease (unless the handle has a
/// [fixed lease](crate::Lock::fixed_lease)). Nothing renews after the release.
///
/// **Drop.** A guard dropped without [`release`](LockGuard::release) stops the watchdog at once
/// and sends `LOCK.RELEASE` from a task spawned on the tokio runtime the hold was acquired on,
/// even if the drop happens outside that runtime. The same handle's next acquire waits until
/// that release is answered, so it can never be handed the old hold and then lose it to the
/// release. If that runtime has shut down, nothing is sent: the hold ends in the server at its
/// lease end (an `EPHEMERAL` hold at once, since its connection closes with the runtime).
///
/// ```no_run
/// # async fn demo(client: redis_lock_client::LockClient) -> Result<(), redis_lock_client::LockError> {
/// let lock = client.lock("invoices");
/// let mut guard = lock.acquire().await?;
/// tokio::select! {
///     reason = guard.lost() => eprintln!("lost the lock: {reason}; stop writing"),
///     _ = async { /* work, passing guard.token() to every write */ } => {}
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub struct LockGuard {
    handle: Arc<HandleState>,
    hold: Arc<Hold>,
    released: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &String::from_utf8_lossy(self.hold.key()))
            .field("owner", &self.hold.owner)
            .field("token", &self.hold.token())
            .field("released", &self.released)
            .finish()
    }
}

impl LockGuard {
    pub(crate) fn new(handle: Arc<HandleState>, hold: Arc<Hold>) -> LockGuard {
        LockGuard {
            handle,
            hold,
            released: false,
        }
    }

    /// Whether [`LockGuard::release`] was called (or the guard dropped).
    pub(crate) fn is_released(&self) -> bool {
        self.released
    }

    /// The hold's fencing token: larger than every earlier hold's token on this key. Pass it with
    /// every write to the protected resource, and have the resource refuse a token lower than
    /// the highest it has seen.
    pub fn token(&self) -> u64 {
        self.hold.token()
    }

    /// The key (the first key of a multi-key hold).
    pub fn key(&self) -> &[u8] {
        self.hold.key()
    }

    /// The hold, for the guards built on this one (multi-key, leadership).
    pub(crate) fn hold(&self) -> &Arc<Hold> {
        &self.hold
    }

    /// The owner string the hold is held under.
    pub fn owner(&self) -> &str {
        &self.hold.owner
    }

    /// `Some(reason)` once the hold is known to be lost. Never stale: it looks at the hold's
    /// local deadline first (the send time of the last renewal the server answered, plus the
    /// lease, minus a tenth of it for clock drift), so a process paused past its lease reads
    /// `Some(Unreachable)` (a fixed lease: `Some(LeaseEnded)`) the instant it resumes, before
    /// the watchdog has run; the hold is then released in the background, as the watchdog does.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.hold.lost_reason()
    }

    /// A future that resolves with the reason when the hold is lost: the watchdog's renewal
    /// found it gone, the server could not be reached before the lease ran out, the `EPHEMERAL`
    /// connection closed, a fixed lease ran out, or the server's lost-hold signal said why. It
    /// never resolves after a release. It does not borrow the guard: select on it beside the
    /// work. Each poll looks at the local deadline first, as [`LockGuard::lost_reason`] does.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.hold.lost()
    }

    /// The error a call answers once the hold ended for `reason` (see [`Hold::not_held`]).
    pub(crate) fn not_held(&self, reason: LostReason) -> LockError {
        self.hold.not_held(Some(reason))
    }

    /// A [`LostWatch`] of this hold: its loss, without borrowing the guard.
    pub fn watch(&self) -> LostWatch {
        self.hold.watch()
    }

    /// Runs `cmd` only while this hold lasts, checked by the server in the same step:
    /// `LOCK.GUARD <key> <owner> <token> <cmd...>`, sent on the hold's connection (in a cluster,
    /// to the master of the lock key's slot: give the data keys the lock key's hash tag, as in
    /// `{orders}:lock` and `{orders}:data`). Answers the command's reply, read as `T` (a
    /// [`redis::Value`] for the raw reply).
    ///
    /// - [`LockError::Fenced`]: the server no longer holds this hold under its token (it is gone,
    ///   [`LostReason::HoldGone`], or the owner holds the key under another token,
    ///   [`LostReason::TokenNotCurrent`]). **The command did not run**, and the guard reports
    ///   the hold lost with that reason ([`LockGuard::lost`] resolves).
    /// - [`LockError::NotHeld`]: the guard was released, or its hold is lost, also when only its
    ///   local deadline says so (see [`LockGuard::lost_reason`]): nothing is sent.
    /// - [`LockError::Server`]: the command's own error, or the fence's refusal of the command
    ///   (a shared hold runs only read-only commands; a command on the lock key itself, a
    ///   `LOCK.*` command, a command that names no key, ... : see the server's `LOCK.GUARD`); the
    ///   hold is not affected.
    /// - [`LockError::Connection`]: no answer; the command may or may not have run. It is never
    ///   sent again.
    ///
    /// ```no_run
    /// # async fn demo(client: redis_lock_client::LockClient) -> Result<(), redis_lock_client::LockError> {
    /// let mut guard = client.lock("{orders:42}:lock").acquire().await?;
    /// // Lands only while this hold is the server's: a holder paused past its lease cannot write.
    /// let fields: i64 = guard
    ///     .fenced(redis::cmd("HSET").arg("{orders:42}:data").arg("status").arg("paid"))
    ///     .await?;
    /// guard.release().await?;
    /// # let _ = fields; Ok(()) }
    /// ```
    pub async fn fenced<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, LockError> {
        fenced_at(self, 0, cmd).await
    }

    /// Releases this guard. The last guard of a hold sends `LOCK.RELEASE` (after stopping the
    /// watchdog); earlier ones only count down ([`Release::StillHeld`]). A second call answers
    /// [`Release::AlreadyReleased`] and sends nothing.
    ///
    /// Errors: [`LockError::NotHeld`] when the hold was lost before (with the reason) or the
    /// server no longer knew it; [`LockError::Connection`] when the release could not be sent or
    /// answered — it is then sent again in the background by its token (`LOCK.RELEASE key owner
    /// TOKEN t`, which never releases a later hold), wherever the master is now, for up to a
    /// lease, and the handle's next acquire waits for it (it never gets this hold back). If this
    /// future is dropped before the answer, the release goes on in the background, and the
    /// handle's next acquire waits for it.
    pub async fn release(&mut self) -> Result<Release, LockError> {
        if self.released {
            return Ok(Release::AlreadyReleased);
        }
        self.released = true;
        match self.handle.end_guard(&self.hold) {
            GuardEnd::Remaining => match self.hold.lost_reason() {
                Some(reason) => Err(self.hold.not_held(Some(reason))),
                None => Ok(Release::StillHeld),
            },
            GuardEnd::Stale => Err(self.hold.not_held(self.hold.lost_reason())),
            GuardEnd::Last => {
                let (send, lost) = self.hold.release_requested();
                if !send {
                    return Err(self.hold.not_held(lost));
                }
                let hold = self.hold.clone();
                let reply = self
                    .handle
                    .release_here(hold.runtime.clone(), hold.send_release())
                    .await
                    .unwrap_or_else(|| {
                        Err(LockError::UnexpectedReply("the release ran twice".into()))
                    });
                if let Err(e) = &reply {
                    if e.is_retryable() {
                        // No answer: the server may still hold it (a failover came between).
                        // Sent again by token in the background, and the handle's next acquire
                        // waits for it: it never gets this hold, and its token, back.
                        let hold = self.hold.clone();
                        let runtime = hold.runtime.clone();
                        self.handle
                            .release_in_background(runtime.as_ref(), hold.release_abandoned());
                    }
                }
                if lost.is_some() {
                    // A multi-key hold's other keys were freed; the hold was lost all the same.
                    return Err(self.hold.not_held(lost));
                }
                let reply = reply?;
                match reply::released(&reply) {
                    Some(true) => Ok(Release::Released),
                    Some(false) => Err(LockError::NotHeld { lost: None }),
                    None => Err(LockError::UnexpectedReply(format!(
                        "the release answered {reply:?}"
                    ))),
                }
            }
        }
    }
}

/// [`LockGuard::fenced`] through the fence of the hold's `index`-th key (a multi-key guard's,
/// the blocking API's too).
pub(crate) async fn fenced_at<T: FromRedisValue>(
    guard: &LockGuard,
    index: usize,
    cmd: &Cmd,
) -> Result<T, LockError> {
    if guard.released {
        return Err(guard.hold.not_held(guard.hold.lost_reason()));
    }
    let reply = guard.hold.fenced(index, cmd).await?;
    T::from_redis_value(reply)
        .map_err(|e| LockError::UnexpectedReply(format!("the fenced command's reply: {e}")))
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        if let GuardEnd::Last = self.handle.end_guard(&self.hold) {
            let (send, _) = self.hold.release_requested();
            if send {
                let hold = self.hold.clone();
                let runtime = hold.runtime.clone();
                self.handle
                    .release_in_background(runtime.as_ref(), async move {
                        if let Err(e) = hold.clone().send_release().await {
                            if e.is_retryable() {
                                hold.release_abandoned().await;
                            }
                        }
                    });
            }
        }
    }
}
