//! The words of a request and of a hold, shared by every rule: what kind a hold is, what an
//! acquire asks for, what a held key is, how a re-entry counts, whether others queue first.
//! A leaf: it uses nothing of the crate but its error and the stored-integer limit.

use crate::layout::MAX_STORED_INTEGER;
use crate::LockError;

/// The largest `LIMIT`, and the most holders a shared key may have: every command on such a
/// key reads all of its holds, so the bound keeps that cost small — one command on a key at the
/// bound, or a multi-key command on 64 such keys (64,000 holds), stays well under 100 ms.
pub const MAX_LIMIT: u64 = 1_000;
pub const MAX_HOLDERS: usize = 1_000;

/// The most holds (and the largest `LIMIT`) a stored key may have and still be read as a lock:
/// the bound of earlier versions, so that a key written then keeps working (it takes no new
/// holds past [`MAX_HOLDERS`], and shrinks as its holders leave).
pub const MAX_STORED_HOLDERS: usize = 10_000;

/// The kind of one hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HoldKind {
    Exclusive,
    Shared,
    Permit,
}

impl HoldKind {
    pub(crate) fn prefix(self) -> &'static [u8] {
        match self {
            HoldKind::Exclusive => b"x:",
            HoldKind::Shared => b"s:",
            HoldKind::Permit => b"p:",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            HoldKind::Exclusive => "exclusive",
            HoldKind::Shared => "shared",
            HoldKind::Permit => "permit",
        }
    }
}

/// What an acquire asks for: no option, `SHARED`, or `LIMIT n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    Exclusive,
    Shared,
    Limit(u64),
}

impl Mode {
    pub fn kind(self) -> HoldKind {
        match self {
            Mode::Exclusive => HoldKind::Exclusive,
            Mode::Shared => HoldKind::Shared,
            Mode::Limit(_) => HoldKind::Permit,
        }
    }

    pub(crate) fn family(self) -> Family {
        match self {
            Mode::Exclusive | Mode::Shared => Family::ReadWrite,
            Mode::Limit(limit) => Family::Semaphore { limit },
        }
    }
}

/// What a held key is: a read-write lock (exclusive and shared holds) or a semaphore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    ReadWrite,
    Semaphore { limit: u64 },
}

impl HoldKind {
    /// Every kind, at its [`HoldKind::index`].
    pub const ALL: [HoldKind; 3] = [HoldKind::Exclusive, HoldKind::Shared, HoldKind::Permit];

    /// The kind's position in [`HoldKind::ALL`] (the match is exhaustive: a new kind must be
    /// given one, and the assertion below checks it is its place in `ALL`).
    pub const fn index(self) -> usize {
        match self {
            HoldKind::Exclusive => 0,
            HoldKind::Shared => 1,
            HoldKind::Permit => 2,
        }
    }

    pub fn from_index(index: usize) -> Option<HoldKind> {
        HoldKind::ALL.get(index).copied()
    }
}

// Evaluated by the compiler: an index out of range here fails the build, it cannot panic.
#[allow(clippy::indexing_slicing)]
const _: () = {
    let mut i = 0;
    while i < HoldKind::ALL.len() {
        assert!(
            HoldKind::ALL[i].index() == i,
            "HoldKind::ALL is in index order"
        );
        i += 1;
    }
};

/// What a `LOCK.ACQUIRE` by the key's current holder does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reentry {
    /// Re-enter: the count goes up, one `LOCK.RELEASE` per acquire (Redisson's semantics).
    Counted,
    /// `ONCE`: the owner holds the key at most once. Asking again while holding it returns the
    /// token and resets the lease without counting, so a client library that re-sends the
    /// command after its own timeout (its first try may have been granted) cannot take the
    /// lock twice.
    Once,
}

impl Reentry {
    /// The count of a hold re-entered this way: one more (up to the largest integer Redis
    /// stores), or the same with `ONCE`.
    pub fn count_after(self, held: u64) -> Result<u64, LockError> {
        match self {
            Reentry::Counted => held
                .checked_add(1)
                .filter(|c| *c <= MAX_STORED_INTEGER)
                .ok_or(LockError::CountOverflow),
            // Held already: the same count, a new lease.
            Reentry::Once => Ok(held),
        }
    }
}

/// Whether waiters are queued on the key; they come before any newcomer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    Empty,
    Waiting,
}

/// What is left of a key after holds of it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Left {
    /// The key is gone (the last hold ended).
    Nothing,
    /// Other holds remain (a shared key, a semaphore).
    OtherHolds,
}
