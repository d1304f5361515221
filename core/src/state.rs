//! The lock state machine.
//!
//! Storage is Redisson's `RLock` layout: a hash at the lock's key whose single owner field holds
//! the re-entry count, with the lease as the key's expiry. The module adds one field,
//! [`FENCE_FIELD`], holding the fencing token of the current hold. Redisson's scripts only use
//! `exists`, `hexists`, `hincrby`, `pexpire` and `del`, so they keep working on such a hash.
//!
//! The adapter reads what is stored ([`Stored`]), asks [`classify`] what it means for the
//! requesting owner ([`View`]), and the `decide_*` functions say what to write.

use crate::args::parse_positive;
use crate::{LockError, UnixMs};

/// The hash field that carries the fencing token of the current hold.
pub const FENCE_FIELD: &[u8] = b"__fence__";
pub const FENCE_FIELD_DISPLAY: &str = "__fence__";

/// What the adapter found at the key, as cheaply as it could read it: the key's kind, the number
/// of fields, and the values of the requester's field and of the fence field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored<'a> {
    Missing,
    NotAHash,
    Hash {
        fields: usize,
        requester_count: Option<&'a [u8]>,
        fence: Option<&'a [u8]>,
    },
}

/// The lock as the requesting owner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    Free,
    HeldByRequester { count: u64, token: Option<u64> },
    HeldByOther { token: Option<u64> },
}

/// Checks the stored layout and says who holds the lock. A hash with more than one owner field,
/// a count that is not a positive integer, or a fence that is not one, is not a lock: commands
/// refuse it rather than guess.
pub fn classify(stored: Stored<'_>) -> Result<View, LockError> {
    let (fields, requester_count, fence) = match stored {
        Stored::Missing => return Ok(View::Free),
        Stored::NotAHash => return Err(LockError::WrongType),
        Stored::Hash {
            fields,
            requester_count,
            fence,
        } => (fields, requester_count, fence),
    };
    let token = match fence {
        None => None,
        Some(raw) => Some(parse_positive(raw).ok_or(LockError::NotALock)?),
    };
    let owner_fields = fields.saturating_sub(usize::from(token.is_some()));
    if owner_fields != 1 {
        return Err(LockError::NotALock);
    }
    match requester_count {
        Some(raw) => {
            let count = parse_positive(raw).ok_or(LockError::NotALock)?;
            Ok(View::HeldByRequester { count, token })
        }
        None => Ok(View::HeldByOther { token }),
    }
}

/// Whether waiters are queued on the key; they come before any newcomer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    Empty,
    Waiting,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireDecision {
    /// The lock is free: write `owner = 1`, a new token, and the lease.
    Take { expires_at: UnixMs },
    /// The requester holds it: write `owner = count`, keep the token (or assign one if the hold
    /// was taken by a client outside the module and has none), and reset the lease.
    Reenter {
        count: u64,
        token: Option<u64>,
        expires_at: UnixMs,
    },
    /// Someone else holds it, or waiters are queued ahead of the requester.
    Busy,
}

pub fn decide_acquire(
    view: View,
    queue: Queue,
    lease_ms: u64,
    now: UnixMs,
) -> Result<AcquireDecision, LockError> {
    let expires_at = now.saturating_add(lease_ms);
    Ok(match view {
        View::Free if queue == Queue::Empty => AcquireDecision::Take { expires_at },
        View::Free | View::HeldByOther { .. } => AcquireDecision::Busy,
        View::HeldByRequester { count, token } => AcquireDecision::Reenter {
            count: count.checked_add(1).ok_or(LockError::NotAnInteger)?,
            token,
            expires_at,
        },
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseDecision {
    /// The requester does not hold the lock (never did, or its lease ran out).
    NotOwner,
    /// One re-entry less; the lock stays held with this count and its lease unchanged.
    CountDown { remaining: u64 },
    /// The last hold is gone: delete the key, publish, hand off to the next waiter.
    Free,
}

pub fn decide_release(view: View) -> ReleaseDecision {
    match view {
        View::HeldByRequester { count, .. } if count > 1 => ReleaseDecision::CountDown {
            remaining: count - 1,
        },
        View::HeldByRequester { .. } => ReleaseDecision::Free,
        View::Free | View::HeldByOther { .. } => ReleaseDecision::NotOwner,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewDecision {
    NotOwner,
    Extend { expires_at: UnixMs },
}

pub fn decide_renew(view: View, lease_ms: u64, now: UnixMs) -> RenewDecision {
    match view {
        View::HeldByRequester { .. } => RenewDecision::Extend {
            expires_at: now.saturating_add(lease_ms),
        },
        View::Free | View::HeldByOther { .. } => RenewDecision::NotOwner,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: UnixMs = 1_700_000_000_000;

    fn hash<'a>(fields: usize, mine: Option<&'a [u8]>, fence: Option<&'a [u8]>) -> Stored<'a> {
        Stored::Hash {
            fields,
            requester_count: mine,
            fence,
        }
    }

    #[test]
    fn classify_reads_every_layout() {
        let cases: Vec<(Stored, Result<View, LockError>)> = vec![
            (Stored::Missing, Ok(View::Free)),
            (Stored::NotAHash, Err(LockError::WrongType)),
            (
                hash(2, Some(b"3"), Some(b"17")),
                Ok(View::HeldByRequester {
                    count: 3,
                    token: Some(17),
                }),
            ),
            // Taken by Redisson's own script: no fence field.
            (
                hash(1, Some(b"1"), None),
                Ok(View::HeldByRequester {
                    count: 1,
                    token: None,
                }),
            ),
            (
                hash(2, None, Some(b"9")),
                Ok(View::HeldByOther { token: Some(9) }),
            ),
            (hash(1, None, None), Ok(View::HeldByOther { token: None })),
            // Not locks: two owners, a bad count, a bad fence, only a fence.
            (hash(3, Some(b"1"), Some(b"2")), Err(LockError::NotALock)),
            (hash(2, None, None), Err(LockError::NotALock)),
            (hash(1, Some(b"x"), None), Err(LockError::NotALock)),
            (hash(1, Some(b"0"), None), Err(LockError::NotALock)),
            (hash(2, Some(b"1"), Some(b"-4")), Err(LockError::NotALock)),
            (hash(1, None, Some(b"4")), Err(LockError::NotALock)),
        ];
        for (stored, want) in cases {
            assert_eq!(classify(stored), want, "{stored:?}");
        }
    }

    #[test]
    fn acquire_decisions() {
        let mine = View::HeldByRequester {
            count: 2,
            token: Some(5),
        };
        let theirs = View::HeldByOther { token: Some(5) };
        let cases = [
            (
                View::Free,
                Queue::Empty,
                AcquireDecision::Take {
                    expires_at: NOW + 100,
                },
            ),
            // Waiters come first: a newcomer never barges past the queue.
            (View::Free, Queue::Waiting, AcquireDecision::Busy),
            (theirs, Queue::Empty, AcquireDecision::Busy),
            (theirs, Queue::Waiting, AcquireDecision::Busy),
            // The holder re-enters even with waiters queued.
            (
                mine,
                Queue::Waiting,
                AcquireDecision::Reenter {
                    count: 3,
                    token: Some(5),
                    expires_at: NOW + 100,
                },
            ),
        ];
        for (view, queue, want) in cases {
            assert_eq!(
                decide_acquire(view, queue, 100, NOW),
                Ok(want),
                "{view:?} {queue:?}"
            );
        }
    }

    #[test]
    fn reentry_count_overflow_is_refused() {
        let at_max = View::HeldByRequester {
            count: u64::MAX,
            token: Some(1),
        };
        assert_eq!(
            decide_acquire(at_max, Queue::Empty, 1, NOW),
            Err(LockError::NotAnInteger)
        );
    }

    #[test]
    fn release_decisions() {
        let cases = [
            (View::Free, ReleaseDecision::NotOwner),
            (View::HeldByOther { token: None }, ReleaseDecision::NotOwner),
            (
                View::HeldByRequester {
                    count: 1,
                    token: Some(1),
                },
                ReleaseDecision::Free,
            ),
            (
                View::HeldByRequester {
                    count: 4,
                    token: Some(1),
                },
                ReleaseDecision::CountDown { remaining: 3 },
            ),
        ];
        for (view, want) in cases {
            assert_eq!(decide_release(view), want, "{view:?}");
        }
    }

    #[test]
    fn renew_only_extends_the_requesters_hold() {
        let mine = View::HeldByRequester {
            count: 1,
            token: Some(1),
        };
        assert_eq!(
            decide_renew(mine, 500, NOW),
            RenewDecision::Extend {
                expires_at: NOW + 500
            }
        );
        assert_eq!(decide_renew(View::Free, 500, NOW), RenewDecision::NotOwner);
        assert_eq!(
            decide_renew(View::HeldByOther { token: None }, 500, NOW),
            RenewDecision::NotOwner
        );
    }
}
