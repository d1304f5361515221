//! The lock state machine.
//!
//! Storage is Redisson's `RLock` layout: a hash at the lock's key whose single owner field holds
//! the re-entry count, with the lease as the key's expiry. The module adds one field,
//! [`FENCE_FIELD`], holding the fencing token of the current hold. Redisson's scripts only use
//! `exists`, `hexists`, `hincrby`, `pexpire` and `del`, so they keep working on such a hash.
//!
//! The adapter reads what is stored ([`Stored`]), asks [`classify`] what it means for the
//! requesting owner ([`View`]), and the `decide_*` functions say what to write.
//!
//! This is the O(1) reading of one layout, not a second model: whatever it does not recognise
//! as the `RLock` layout it calls [`LockError::NotALock`], and the adapter then reads the whole
//! key with [`crate::hold::decode`], whose answer is final. So every command reads a key the same
//! way, and a hash with the mode field is always decoded as a multi-hold key.

pub use crate::kind::Queue;
use crate::kind::Reentry;
use crate::layout::{parse_positive, MODE_FIELD};
pub use crate::layout::{FENCE_FIELD, FENCE_FIELD_DISPLAY};
use crate::{LockError, UnixMs};

/// The most fields a lock's hash has: its holder and the fence.
pub const MAX_LOCK_FIELDS: usize = 2;

/// Whether a hash with `fields` fields can be a lock at all. Adapters check this before reading
/// any field, so classifying a key costs O(1) whatever the hash holds.
pub fn may_be_a_lock(fields: usize) -> bool {
    (1..=MAX_LOCK_FIELDS).contains(&fields)
}

/// What the adapter found at the key, as cheaply as it could read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored<'a> {
    Missing,
    NotAHash,
    Hash {
        /// The number of fields in the hash.
        fields: usize,
        /// The fence field's value.
        fence: Option<&'a [u8]>,
        /// The holder's field value: the requester's own field when it has one, else the one
        /// other non-fence field (None: the hash has no such field).
        holder: Option<StoredHolder<'a>>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredHolder<'a> {
    /// The field's name: the requester's owner when `is_requester`.
    pub field: &'a [u8],
    pub count: &'a [u8],
    pub is_requester: bool,
}

/// The lock as the requesting owner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    Free,
    HeldByRequester { count: u64, token: Option<u64> },
    HeldByOther { count: u64, token: Option<u64> },
}

/// Reads the `RLock` layout in O(1). A hash has it only if it has exactly one holder field
/// whose value is a positive integer (the re-entry count), plus optionally the fence field
/// holding a positive integer, and the holder field is not the mode field (`__mode__ 5` is a
/// multi-hold key with an invalid mode, not a lock held by an owner named `__mode__`).
/// Anything else is [`LockError::NotALock`] here: not this layout. The adapter then reads the
/// key with [`crate::hold::decode`], which says whether it is a lock at all; commands refuse
/// (never modify) what is not, rather than guess.
pub fn classify(stored: Stored<'_>) -> Result<View, LockError> {
    let (fields, fence, holder) = match stored {
        Stored::Missing => return Ok(View::Free),
        Stored::NotAHash => return Err(LockError::WrongType),
        Stored::Hash {
            fields,
            fence,
            holder,
        } => (fields, fence, holder),
    };
    if !may_be_a_lock(fields) {
        return Err(LockError::NotALock);
    }
    let token = match fence {
        None => None,
        Some(raw) => Some(parse_positive(raw).ok_or(LockError::NotALock)?),
    };
    let holder_fields = fields - usize::from(token.is_some());
    let holder = holder.ok_or(LockError::NotALock)?;
    if holder_fields != 1 || holder.field == MODE_FIELD {
        return Err(LockError::NotALock);
    }
    let count = parse_positive(holder.count).ok_or(LockError::NotALock)?;
    Ok(if holder.is_requester {
        View::HeldByRequester { count, token }
    } else {
        View::HeldByOther { count, token }
    })
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
    reentry: Reentry,
    now: UnixMs,
) -> Result<AcquireDecision, LockError> {
    let expires_at = now.saturating_add(lease_ms);
    Ok(match view {
        View::Free if queue == Queue::Empty => AcquireDecision::Take { expires_at },
        View::Free | View::HeldByOther { .. } => AcquireDecision::Busy,
        View::HeldByRequester { count, token } => AcquireDecision::Reenter {
            count: reentry.count_after(count)?,
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

    fn mine<'a>(fields: usize, count: &'a [u8], fence: Option<&'a [u8]>) -> Stored<'a> {
        Stored::Hash {
            fields,
            fence,
            holder: Some(StoredHolder {
                field: b"me",
                count,
                is_requester: true,
            }),
        }
    }

    fn theirs<'a>(fields: usize, count: &'a [u8], fence: Option<&'a [u8]>) -> Stored<'a> {
        held_in(b"other", fields, count, fence)
    }

    /// A hash whose one non-fence field, `field`, is not the requester's.
    fn held_in<'a>(
        field: &'a [u8],
        fields: usize,
        count: &'a [u8],
        fence: Option<&'a [u8]>,
    ) -> Stored<'a> {
        Stored::Hash {
            fields,
            fence,
            holder: Some(StoredHolder {
                field,
                count,
                is_requester: false,
            }),
        }
    }

    #[test]
    fn classify_reads_every_layout() {
        let no_holder = |fields, fence| Stored::Hash {
            fields,
            fence,
            holder: None,
        };
        let cases: Vec<(Stored, Result<View, LockError>)> = vec![
            (Stored::Missing, Ok(View::Free)),
            (Stored::NotAHash, Err(LockError::WrongType)),
            (
                mine(2, b"3", Some(b"17")),
                Ok(View::HeldByRequester {
                    count: 3,
                    token: Some(17),
                }),
            ),
            // Taken by Redisson's own script: no fence field.
            (
                mine(1, b"1", None),
                Ok(View::HeldByRequester {
                    count: 1,
                    token: None,
                }),
            ),
            (
                theirs(2, b"4", Some(b"9")),
                Ok(View::HeldByOther {
                    count: 4,
                    token: Some(9),
                }),
            ),
            (
                theirs(1, b"1", None),
                Ok(View::HeldByOther {
                    count: 1,
                    token: None,
                }),
            ),
            (
                theirs(1, b"9223372036854775807", None),
                Ok(View::HeldByOther {
                    count: i64::MAX as u64,
                    token: None,
                }),
            ),
            // Not locks: two holders, a bad count, a bad fence, only a fence, too many fields,
            // and a plain one-field hash of user data (`HSET user:1 name ada`), whoever asks.
            (mine(3, b"1", Some(b"2")), Err(LockError::NotALock)),
            (mine(2, b"1", None), Err(LockError::NotALock)),
            (mine(1, b"x", None), Err(LockError::NotALock)),
            (mine(1, b"0", None), Err(LockError::NotALock)),
            (mine(2, b"1", Some(b"-4")), Err(LockError::NotALock)),
            (no_holder(1, Some(b"4")), Err(LockError::NotALock)),
            (theirs(1, b"ada", None), Err(LockError::NotALock)),
            (theirs(2, b"1", Some(b"abc")), Err(LockError::NotALock)),
            (
                theirs(1, b"9223372036854775808", None),
                Err(LockError::NotALock),
            ),
            (theirs(1_000_000, b"1", None), Err(LockError::NotALock)),
            (no_holder(0, None), Err(LockError::NotALock)),
        ];
        for (stored, want) in cases {
            assert_eq!(classify(stored), want, "{stored:?}");
        }
    }

    #[test]
    fn the_mode_field_is_never_an_rlock_holder() {
        // `HSET k __mode__ 5` once read as a lock held by an owner named `__mode__`, while
        // `hold::decode` (INFO, FORCERELEASE) called it not a lock. It is not this layout: the
        // adapter falls back to `decode`, whose answer every command then shares.
        let cases: Vec<(&str, Stored, Result<View, LockError>)> = vec![
            (
                "mode 5",
                held_in(b"__mode__", 1, b"5", None),
                Err(LockError::NotALock),
            ),
            (
                "mode 1",
                held_in(b"__mode__", 1, b"1", None),
                Err(LockError::NotALock),
            ),
            (
                "mode 5 with a fence",
                held_in(b"__mode__", 2, b"5", Some(b"7")),
                Err(LockError::NotALock),
            ),
            (
                "largest count as mode",
                held_in(b"__mode__", 1, b"9223372036854775807", None),
                Err(LockError::NotALock),
            ),
            (
                "valid mode",
                held_in(b"__mode__", 1, b"rw", None),
                Err(LockError::NotALock),
            ),
            // The parser refuses `__mode__` as an owner; should one get here, still not a lock.
            (
                "requester named like the mode field",
                Stored::Hash {
                    fields: 1,
                    fence: None,
                    holder: Some(StoredHolder {
                        field: b"__mode__",
                        count: b"5",
                        is_requester: true,
                    }),
                },
                Err(LockError::NotALock),
            ),
            // The same values in an owner's field are the RLock layout.
            (
                "owner 5",
                held_in(b"__mode", 1, b"5", None),
                Ok(View::HeldByOther {
                    count: 5,
                    token: None,
                }),
            ),
            (
                "owner 5 with a fence",
                held_in(b"mode", 2, b"5", Some(b"7")),
                Ok(View::HeldByOther {
                    count: 5,
                    token: Some(7),
                }),
            ),
        ];
        for (case, stored, want) in cases {
            assert_eq!(classify(stored), want, "{case}");
        }
    }

    /// What the adapter passes to `classify` for `fields` (see `src/store.rs` `view_of`): the
    /// fence, and the requester's own field, else the first other non-fence field.
    fn stored_as_read<'a>(fields: &'a [(Vec<u8>, Vec<u8>)], requester: &[u8]) -> Stored<'a> {
        let fence = fields
            .iter()
            .find(|(f, _)| f.as_slice() == FENCE_FIELD)
            .map(|(_, v)| v.as_slice());
        let holder = fields
            .iter()
            .find(|(f, _)| f.as_slice() == requester)
            .or_else(|| fields.iter().find(|(f, _)| f.as_slice() != FENCE_FIELD))
            .map(|(f, v)| StoredHolder {
                field: f,
                count: v,
                is_requester: f.as_slice() == requester,
            });
        Stored::Hash {
            fields: fields.len(),
            fence,
            holder,
        }
    }

    /// One classification: for every hash of one or two fields built from names and values a
    /// lock uses, the O(1) reading either agrees with `hold::decode` or defers to it
    /// (`NotALock`), and it never defers on the `RLock` layout (which must stay O(1)).
    #[test]
    fn classify_agrees_with_decode_or_defers_to_it() {
        use crate::hold::{decode, HoldKind};
        let names: [&[u8]; 4] = [b"a", b"b", MODE_FIELD, FENCE_FIELD];
        let values: [&[u8]; 8] = [
            b"1",
            b"5",
            b"0",
            b"x",
            b"rw",
            b"semaphore:3",
            b"1:5:7",
            b"9223372036854775807",
        ];
        let mut hashes: Vec<Vec<(Vec<u8>, Vec<u8>)>> = Vec::new();
        for (i, n1) in names.iter().enumerate() {
            for v1 in values {
                hashes.push(vec![(n1.to_vec(), v1.to_vec())]);
                for n2 in names.iter().skip(i + 1) {
                    for v2 in values {
                        hashes.push(vec![(n1.to_vec(), v1.to_vec()), (n2.to_vec(), v2.to_vec())]);
                    }
                }
            }
        }
        for fields in &hashes {
            let decoded = decode(fields, Some(NOW));
            for requester in [&b"a"[..], b"b"] {
                let view = classify(stored_as_read(fields, requester));
                let shown: Vec<_> = fields
                    .iter()
                    .flat_map(|(f, v)| [String::from_utf8_lossy(f), String::from_utf8_lossy(v)])
                    .collect();
                let asker = String::from_utf8_lossy(requester);
                let case = format!("{shown:?} asked by {asker}: {view:?} / {decoded:?}");
                match (&view, &decoded) {
                    (Err(LockError::NotALock), Ok(lock)) => {
                        assert!(
                            !lock.is_rlock_layout(),
                            "deferred on the RLock layout: {case}"
                        )
                    }
                    (Err(LockError::NotALock), Err(_)) => {}
                    (
                        Ok(
                            View::HeldByRequester { count, token }
                            | View::HeldByOther { count, token },
                        ),
                        Ok(lock),
                    ) => {
                        let [hold] = lock.holds.as_slice() else {
                            panic!("{case}");
                        };
                        assert!(lock.is_rlock_layout(), "{case}");
                        assert_eq!(hold.kind, HoldKind::Exclusive, "{case}");
                        assert_eq!((hold.count, hold.token), (*count, *token), "{case}");
                        assert_eq!(
                            hold.owner == requester,
                            matches!(view, Ok(View::HeldByRequester { .. })),
                            "{case}"
                        );
                    }
                    _ => panic!("classify and decode disagree: {case}"),
                }
            }
        }
    }

    #[test]
    fn only_one_or_two_fields_can_be_a_lock() {
        assert!(!may_be_a_lock(0));
        assert!(may_be_a_lock(1));
        assert!(may_be_a_lock(2));
        assert!(!may_be_a_lock(3));
        assert!(!may_be_a_lock(usize::MAX));
    }

    #[test]
    fn acquire_decisions() {
        let mine = View::HeldByRequester {
            count: 2,
            token: Some(5),
        };
        let theirs = View::HeldByOther {
            count: 1,
            token: Some(5),
        };
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
                decide_acquire(view, queue, 100, Reentry::Counted, NOW),
                Ok(want),
                "{view:?} {queue:?}"
            );
        }
    }

    #[test]
    fn once_re_takes_a_held_lock_without_counting_and_resets_the_lease() {
        let mine = View::HeldByRequester {
            count: 2,
            token: Some(5),
        };
        assert_eq!(
            decide_acquire(mine, Queue::Waiting, 700, Reentry::Once, NOW),
            Ok(AcquireDecision::Reenter {
                count: 2,
                token: Some(5),
                expires_at: NOW + 700,
            })
        );
        // Otherwise ONCE acquires like any acquire.
        assert_eq!(
            decide_acquire(View::Free, Queue::Empty, 700, Reentry::Once, NOW),
            Ok(AcquireDecision::Take {
                expires_at: NOW + 700
            })
        );
    }

    #[test]
    fn reentry_count_overflow_is_refused() {
        for count in [i64::MAX as u64, u64::MAX] {
            let at_max = View::HeldByRequester {
                count,
                token: Some(1),
            };
            assert_eq!(
                decide_acquire(at_max, Queue::Empty, 1, Reentry::Counted, NOW),
                Err(LockError::CountOverflow)
            );
        }
        let below = View::HeldByRequester {
            count: i64::MAX as u64 - 1,
            token: Some(1),
        };
        assert!(decide_acquire(below, Queue::Empty, 1, Reentry::Counted, NOW).is_ok());
        // ONCE never counts, so it never overflows either.
        let at_max = View::HeldByRequester {
            count: i64::MAX as u64,
            token: Some(1),
        };
        assert!(decide_acquire(at_max, Queue::Empty, 1, Reentry::Once, NOW).is_ok());
    }

    #[test]
    fn release_decisions() {
        let cases = [
            (View::Free, ReleaseDecision::NotOwner),
            (
                View::HeldByOther {
                    count: 1,
                    token: None,
                },
                ReleaseDecision::NotOwner,
            ),
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
            decide_renew(
                View::HeldByOther {
                    count: 1,
                    token: None
                },
                500,
                NOW
            ),
            RenewDecision::NotOwner
        );
    }
}
