//! Why a hold was lost, and the state every guard of one hold shares.

use std::fmt;
use std::future::Future;
use std::sync::{Mutex, MutexGuard, OnceLock};

use tokio::sync::watch;

/// Why a hold ended without its owner releasing it.
///
/// The first three are seen by the library itself (the watchdog, the guard's own connection);
/// the rest are the server's reasons, delivered by the lost-hold signal
/// ([`LockClientBuilder::listen_for_lost_signal`](crate::LockClientBuilder::listen_for_lost_signal)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostReason {
    /// `LOCK.RENEW` answered 0, or a re-entry found another holder: the server no longer has
    /// this hold (its lease ran out while renewals could not get through, or someone removed it).
    HoldGone,
    /// The watchdog could not reach the server before the lease (counted from the send time of
    /// the last successful renewal, minus a drift margin) ran out. The server may still hold
    /// the key for a moment, but nothing tells this process it does.
    Unreachable,
    /// A fixed lease ([`Lock::fixed_lease`](crate::Lock::fixed_lease)) ran out: nothing renews it.
    LeaseEnded,
    /// The connection an `EPHEMERAL` hold is bound to closed or failed; the server ends the
    /// hold the moment it sees that.
    ConnectionClosed,
    /// Signal `forcereleased`: `LOCK.FORCERELEASE` removed the hold.
    ForceReleased,
    /// Signal `deleted`: a command removed the key (`DEL`, `UNLINK`, `RENAME`/`MOVE` taking it
    /// away, or `RENAME`/`COPY ... REPLACE`/`RESTORE ... REPLACE` putting another value there). Sent by Redis >= 7.2 and Valkey only.
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
    /// database, and the check the library made at once (`LOCK.INFO`) no longer found the hold.
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
            LostReason::HoldGone => "the server no longer has the hold (a renewal answered 0)",
            LostReason::Unreachable => "the server could not be reached before the lease ran out",
            LostReason::LeaseEnded => "the fixed lease ran out",
            LostReason::ConnectionClosed => "the EPHEMERAL hold's connection closed",
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
}

impl LostWatch {
    /// `Some(reason)` once the hold is known to be lost.
    pub fn reason(&self) -> Option<LostReason> {
        match *self.rx.borrow() {
            Status::Lost(r) => Some(r),
            _ => None,
        }
    }

    /// Resolves with the reason when the hold is lost; never once it is released.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        wait_lost(self.rx.clone())
    }
}

/// Where one hold stands. Moves only out of `Active`, once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Active,
    Released,
    Lost(LostReason),
}

/// The status of one hold, shared by its guards, its keeper and the signal listener. The watch
/// channel that tells a [`LockGuard::lost`](crate::LockGuard::lost) future or a [`LostWatch`]
/// of a change is made by the first of them: a hold nobody watches (the common case of a short
/// critical section) costs no channel, and its release and drop notify nobody.
#[derive(Debug)]
pub(crate) struct HoldStatus {
    now: Mutex<Status>,
    tx: OnceLock<watch::Sender<Status>>,
}

impl HoldStatus {
    pub(crate) fn new() -> HoldStatus {
        HoldStatus {
            now: Mutex::new(Status::Active),
            tx: OnceLock::new(),
        }
    }

    fn now(&self) -> MutexGuard<'_, Status> {
        // A status is one small Copy value, never left half-written.
        self.now.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn get(&self) -> Status {
        *self.now()
    }

    pub(crate) fn is_active(&self) -> bool {
        self.get() == Status::Active
    }

    /// Changes the status with `change` (which says whether it changed), and tells the watchers.
    fn update(&self, change: impl FnOnce(&mut Status) -> bool) -> bool {
        let mut now = self.now();
        let changed = change(&mut now);
        if changed {
            if let Some(tx) = self.tx.get() {
                tx.send_replace(*now);
            }
        }
        changed
    }

    /// Active → Lost(reason); false if the hold had already ended (released or lost).
    pub(crate) fn mark_lost(&self, reason: LostReason) -> bool {
        self.update(|s| {
            if *s == Status::Active {
                *s = Status::Lost(reason);
                true
            } else {
                false
            }
        })
    }

    /// Active → Released. `Err(reason)` if the hold was lost first.
    pub(crate) fn mark_released(&self) -> Result<(), Option<LostReason>> {
        let mut outcome = Ok(());
        self.update(|s| match *s {
            Status::Active => {
                *s = Status::Released;
                true
            }
            Status::Lost(r) => {
                outcome = Err(Some(r));
                false
            }
            Status::Released => {
                outcome = Err(None);
                false
            }
        });
        outcome
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        match self.get() {
            Status::Lost(r) => Some(r),
            _ => None,
        }
    }

    /// The channel, made with the current status under the status lock (so that no change
    /// falls between its first value and its first send).
    fn channel(&self) -> &watch::Sender<Status> {
        let now = self.now();
        self.tx.get_or_init(|| watch::Sender::new(*now))
    }

    /// Resolves with the reason when the hold is lost; never resolves once it is released.
    pub(crate) fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        wait_lost(self.channel().subscribe())
    }

    pub(crate) fn watch(&self) -> LostWatch {
        LostWatch {
            rx: self.channel().subscribe(),
        }
    }
}

async fn wait_lost(mut rx: watch::Receiver<Status>) -> LostReason {
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

    #[test]
    fn status_moves_out_of_active_once() {
        let s = HoldStatus::new();
        assert!(s.mark_lost(LostReason::HoldGone));
        assert!(!s.mark_lost(LostReason::Deleted));
        assert_eq!(s.mark_released(), Err(Some(LostReason::HoldGone)));

        let s = HoldStatus::new();
        assert_eq!(s.mark_released(), Ok(()));
        assert!(!s.mark_lost(LostReason::HoldGone));
        assert_eq!(s.mark_released(), Err(None));
    }

    #[tokio::test]
    async fn lost_future_resolves_with_the_reason() {
        let s = HoldStatus::new();
        let lost = s.lost();
        s.mark_lost(LostReason::ForceReleased);
        assert_eq!(lost.await, LostReason::ForceReleased);
    }
}
