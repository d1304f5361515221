//! Why a hold was lost, and the state every guard of one hold shares.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Weak};

use tokio::sync::watch;

/// Why a hold ended without its owner releasing it.
///
/// The first four are seen by the library itself (the watchdog, the guard's own connection);
/// the rest are the server's reasons, delivered by the lost-hold signal (listened to by
/// default: [`LockClientBuilder::without_lost_signal`](crate::LockClientBuilder::without_lost_signal)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// `LOCK.RENEW` answered 0, a re-entry found another holder, a check found the hold gone
    /// (after its key's slot moved, or `LOCK.PROCLAIM` refused), or a fenced command was
    /// refused with `FENCED the hold is gone`: the server no longer has this hold (its lease ran
    /// out while renewals could not get through, or someone removed it).
    HoldGone,
    /// A fenced command ([`LockGuard::fenced`](crate::LockGuard::fenced)) was refused with
    /// `FENCED the token is not current`: the owner holds the key under another fencing token
    /// now, so this hold (this token) is over.
    TokenNotCurrent,
    /// The watchdog could not reach the server before the lease (counted from the send time of
    /// the last successful renewal, minus a drift margin) ran out. The server may still hold
    /// the key for a moment, but nothing tells this process it does.
    Unreachable,
    /// A fixed lease ([`Lock::fixed_lease`](crate::Lock::fixed_lease)) ran out: nothing renews it.
    LeaseEnded,
    /// The master kept answering the renewals, but the replicas the hold must reach
    /// ([`Lock::replicas`](crate::Lock::replicas)) did not acknowledge them for a lease: a
    /// failover could lose the hold, so it no longer counts. The library releases it.
    Unreplicated,
    /// The connection an `EPHEMERAL` hold is bound to closed or failed; the server ends the
    /// hold the moment it sees that.
    ConnectionClosed,
    /// The server's ACL refused a command the library needs to keep the hold (its renewal,
    /// or the check of its token, `LOCK.CHECK`): the library cannot keep it, ends it on this
    /// side and releases it in the background. The guard's calls answer
    /// [`LockError::NoPermission`](crate::LockError::NoPermission), naming the command and the
    /// rule to add. Not a loss the server made: fix the user's ACL.
    NoPermission,
    /// Signal `forcereleased`: `LOCK.FORCERELEASE` removed the hold.
    ForceReleased,
    /// Signal `deleted`: a command removed the key (`DEL`, `UNLINK`, `RENAME`/`MOVE` taking it
    /// away, or `RENAME`/`COPY ... REPLACE`/`RESTORE ... REPLACE` putting another value there).
    /// Sent by Redis >= 7.2 and Valkey only. For a key with several holds the server sends one
    /// message for the key, and each hold is reported only after a read no longer finds it.
    /// A flush is [`LostReason::Flushed`]; `SWAPDB` sends nothing (the watchdog reports it as
    /// [`LostReason::HoldGone`]).
    Deleted,
    /// Signal `overwritten`: a command replaced the value in place (`SET`). Redis >= 7.2 and
    /// Valkey only.
    Overwritten,
    /// Signal `evicted`: the server evicted the key under `maxmemory`.
    Evicted,
    /// Signal `disconnected`: the connection of an `EPHEMERAL` hold closed (seen by the server).
    Disconnected,
    /// Signal `expired`: the lease ran out on the server.
    Expired,
    /// Signal `flushed <db>` on `<prefix>:flush`: `FLUSHDB` or `FLUSHALL` emptied the hold's
    /// database, and the check the library made at once (`LOCK.CHECK`) no longer found the hold.
    Flushed,
}

impl LostReason {
    /// The reason named by a word of the server's lost-hold message (`forcereleased`,
    /// `deleted`, `overwritten`, `evicted`, `disconnected`, `expired`).
    pub fn from_signal_word(word: &str) -> Option<LostReason> {
        Some(match word {
            "forcereleased" => LostReason::ForceReleased,
            "deleted" => LostReason::Deleted,
            "overwritten" => LostReason::Overwritten,
            "evicted" => LostReason::Evicted,
            "disconnected" => LostReason::Disconnected,
            "expired" => LostReason::Expired,
            _ => return None,
        })
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::HoldGone => "the server no longer has the hold",
            LostReason::TokenNotCurrent => {
                "the owner holds the key under another token (a fenced command was refused)"
            }
            LostReason::Unreachable => "the server could not be reached before the lease ran out",
            LostReason::LeaseEnded => "the fixed lease ran out",
            LostReason::Unreplicated => {
                "the replicas did not acknowledge the renewals before the lease ran out"
            }
            LostReason::ConnectionClosed => "the EPHEMERAL hold's connection closed",
            LostReason::NoPermission => {
                "the server's ACL refused a command the library needs to keep the hold (NOPERM)"
            }
            LostReason::ForceReleased => "force-released (LOCK.FORCERELEASE)",
            LostReason::Deleted => "the key was deleted",
            LostReason::Overwritten => "the key was overwritten",
            LostReason::Evicted => "the key was evicted",
            LostReason::Disconnected => "the EPHEMERAL hold's connection closed (server)",
            LostReason::Expired => "the lease ran out on the server",
            LostReason::Flushed => "the database was flushed (FLUSHDB/FLUSHALL)",
        })
    }
}

/// A view of one hold's loss that the work running under it can keep: see
/// [`Lock::run`](crate::Lock::run). Cheap to clone; it does not keep the hold.
#[derive(Debug, Clone)]
pub struct LostWatch {
    rx: watch::Receiver<Status>,
    /// The hold, to look at its deadline before answering (not kept alive by the watch).
    hold: Weak<dyn Look>,
}

/// A hold that can be asked to look at its local deadline now (so that a status read right
/// after a pause is not stale).
pub(crate) trait Look: Send + Sync {
    fn look(self: Arc<Self>);
}

impl LostWatch {
    pub(crate) fn new(rx: watch::Receiver<Status>, hold: Weak<dyn Look>) -> LostWatch {
        LostWatch { rx, hold }
    }

    /// `Some(reason)` once the hold is known to be lost. A hold past its local deadline (no
    /// renewal confirmed for a lease) is lost from that instant, also when nothing has run since
    /// (a process paused past its lease reads this first thing when it resumes).
    pub fn reason(&self) -> Option<LostReason> {
        if let Some(hold) = self.hold.upgrade() {
            hold.look();
        }
        match *self.rx.borrow() {
            Status::Lost(r) => Some(r),
            _ => None,
        }
    }

    /// Resolves with the reason when the hold is lost; never once it is released. Never stale,
    /// as [`LostWatch::reason`]: each poll looks at the local deadline first, so polled right
    /// after a pause past the lease it is ready at once.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        look_and_wait_lost(self.rx.clone(), self.hold.clone())
    }
}

/// Where one hold stands, as the application sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Active,
    Released,
    Lost(LostReason),
}

/// [`wait_lost`], looking at `hold`'s local deadline at each poll first: a hold past it is
/// lost the moment the future is polled, before the keeper's own wake-up runs (a `select!` on
/// `lost()` beside the work sees the loss first thing after a pause).
pub(crate) async fn look_and_wait_lost(
    rx: watch::Receiver<Status>,
    hold: Weak<dyn Look>,
) -> LostReason {
    let mut wait = std::pin::pin!(wait_lost(rx));
    std::future::poll_fn(|cx| {
        if let Some(hold) = hold.upgrade() {
            hold.look();
        }
        wait.as_mut().poll(cx)
    })
    .await
}

pub(crate) async fn wait_lost(mut rx: watch::Receiver<Status>) -> LostReason {
    loop {
        let now = *rx.borrow_and_update();
        match now {
            Status::Lost(r) => return r,
            Status::Released => std::future::pending::<()>().await,
            Status::Active => {}
        }
        if rx.changed().await.is_err() {
            // Every guard and task of the hold is gone: nothing can report a loss.
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_words_map_to_reasons() {
        let cases = [
            ("forcereleased", Some(LostReason::ForceReleased)),
            ("deleted", Some(LostReason::Deleted)),
            ("overwritten", Some(LostReason::Overwritten)),
            ("moved", None),
            ("evicted", Some(LostReason::Evicted)),
            ("disconnected", Some(LostReason::Disconnected)),
            ("expired", Some(LostReason::Expired)),
            ("released", None),
            ("", None),
        ];
        for (word, want) in cases {
            assert_eq!(LostReason::from_signal_word(word), want, "{word}");
        }
    }

    #[tokio::test]
    async fn lost_future_resolves_with_the_reason_and_never_after_a_release() {
        let (tx, rx) = watch::channel(Status::Active);
        let lost = wait_lost(rx.clone());
        tx.send_replace(Status::Lost(LostReason::ForceReleased));
        assert_eq!(lost.await, LostReason::ForceReleased);
        let (tx, rx) = watch::channel(Status::Active);
        tx.send_replace(Status::Released);
        let never = tokio::time::timeout(std::time::Duration::from_millis(20), wait_lost(rx));
        assert!(never.await.is_err());
    }
}
