//! The guard: proof of a hold, its fencing token, its loss, its release.

use std::future::Future;
use std::sync::Arc;

use crate::error::LockError;
use crate::hold::{released, Form, HoldCore};
use crate::lock::{GuardEnd, HandleState};
use crate::lost::{LostReason, LostWatch};

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
/// even if the drop happens outside that runtime. If that runtime has shut down, nothing is
/// sent: the hold ends in the server at its lease end (an `EPHEMERAL` hold at once, since its
/// connection closes with the runtime).
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
    core: Arc<HoldCore>,
    released: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &String::from_utf8_lossy(self.core.key()))
            .field("owner", &self.core.owner)
            .field("token", &self.core.token())
            .field("released", &self.released)
            .finish()
    }
}

impl LockGuard {
    pub(crate) fn new(handle: Arc<HandleState>, core: Arc<HoldCore>) -> LockGuard {
        LockGuard {
            handle,
            core,
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
        self.core.token()
    }

    /// The key (the first key of a multi-key hold).
    pub fn key(&self) -> &[u8] {
        self.core.key()
    }

    /// The hold, for the guards built on this one (multi-key, leadership).
    pub(crate) fn core(&self) -> &Arc<HoldCore> {
        &self.core
    }

    /// The owner string the hold is held under.
    pub fn owner(&self) -> &str {
        &self.core.owner
    }

    /// `Some(reason)` once the hold is known to be lost.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.core.status.lost_reason()
    }

    /// A future that resolves with the reason when the hold is lost: the watchdog's renewal
    /// found it gone, the server could not be reached before the lease ran out, the `EPHEMERAL`
    /// connection closed, a fixed lease ran out, or (with the lost-hold signal) the server said
    /// why. It never resolves after a release. It does not borrow the guard: select on it
    /// beside the work.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.core.status.lost()
    }

    /// A [`LostWatch`] of this hold: its loss, without borrowing the guard.
    pub fn watch(&self) -> LostWatch {
        self.core.status.watch()
    }

    /// Releases this guard. The last guard of a hold sends `LOCK.RELEASE` (after stopping the
    /// watchdog); earlier ones only count down ([`Release::StillHeld`]). A second call answers
    /// [`Release::AlreadyReleased`] and sends nothing.
    ///
    /// Errors: [`LockError::NotHeld`] when the hold was lost before (with the reason) or the
    /// server no longer knew it; [`LockError::Connection`] when the release could not be sent or
    /// answered — it is not retried (a repeat could release a later hold), and the hold then ends
    /// at its lease end at the latest, since the watchdog has stopped.
    pub async fn release(&mut self) -> Result<Release, LockError> {
        if self.released {
            return Ok(Release::AlreadyReleased);
        }
        self.released = true;
        match self.handle.end_guard(&self.core) {
            GuardEnd::Remaining => match self.core.status.lost_reason() {
                Some(reason) => Err(LockError::NotHeld { lost: Some(reason) }),
                None => Ok(Release::StillHeld),
            },
            GuardEnd::Stale => Err(LockError::NotHeld {
                lost: self.core.status.lost_reason(),
            }),
            GuardEnd::Last(active) => {
                let marked = self.core.status.mark_released();
                active.stop();
                if let Err(lost) = marked {
                    if self.core.form == Form::Many {
                        // The other keys are still held: free them at once, not at their
                        // lease end. The hold was lost all the same.
                        let _ = self.core.query(self.core.release_cmd()).await;
                    }
                    return Err(LockError::NotHeld { lost });
                }
                let reply = self.core.query(self.core.release_cmd()).await?;
                match released(&reply) {
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

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        if let GuardEnd::Last(active) = self.handle.end_guard(&self.core) {
            let marked = self.core.status.mark_released();
            active.stop();
            // A lost multi-key hold still holds its other keys: they are released too.
            let send = marked.is_ok() || self.core.form == Form::Many;
            if let (true, Some(runtime)) = (send, &self.core.runtime) {
                let core = self.core.clone();
                // Once the runtime has shut down the task never runs, and the lease ends the
                // hold instead.
                runtime.spawn(async move {
                    let _ = core.query(core.release_cmd()).await;
                });
            }
        }
    }
}
