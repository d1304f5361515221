//! A run of grants on one read of a key (see [`Run`]).

use std::collections::HashMap;

use super::{
    decide_on, Decision, Granted, HoldKind, Lock, Mode, OwnerName, Queue, Reentry, Standing,
};
use crate::{LockError, UnixMs};

/// A lock being handed to a run of waiters (the head of its queue, then each waiter behind it
/// that still fits): every decision and grant costs O(1), so a run of any length costs one read
/// and one write of the key, not one per waiter.
///
/// The owners of a run are distinct (an owner waits at most once per key), so a waiter's own
/// holds can only be among the holds the key had when the run began: those are indexed once.
#[derive(Debug)]
pub struct Run {
    lock: Lock,
    /// Where each owner's holds are among the holds the key had.
    pub(super) own: OwnIndex,
    any_exclusive: bool,
}

/// Where an owner's holds are among a lock's holds as read.
#[derive(Debug)]
pub(super) enum OwnIndex {
    /// The first `len` holds are in (kind, owner) order, as every decoded key lists them: an
    /// owner's hold of a kind is found by binary search, with nothing built.
    Sorted { len: usize },
    /// Owner → positions of its holds (exclusive, shared, permit): holds in another order.
    Map(HashMap<OwnerName, [Option<usize>; HoldKind::ALL.len()]>),
}

impl Run {
    pub fn new(lock: Lock) -> Run {
        let any_exclusive = lock.holds.iter().any(|h| h.kind == HoldKind::Exclusive);
        let sorted = lock
            .holds
            .windows(2)
            .all(|w| matches!(w, [a, b] if (a.kind, &a.owner) < (b.kind, &b.owner)));
        let own = if sorted {
            OwnIndex::Sorted {
                len: lock.holds.len(),
            }
        } else {
            let mut own: HashMap<OwnerName, [Option<usize>; HoldKind::ALL.len()]> = HashMap::new();
            for (at, hold) in lock.holds.iter().enumerate() {
                let slots = own.entry(hold.owner.clone()).or_default();
                if let Some(slot) = slots.get_mut(hold.kind.index()) {
                    *slot = Some(at);
                }
            }
            OwnIndex::Map(own)
        };
        Run {
            lock,
            own,
            any_exclusive,
        }
    }

    /// Where `owner`'s hold of `kind` is, among the holds the key had.
    fn position(&self, owner: &[u8], kind: HoldKind) -> Option<usize> {
        match &self.own {
            OwnIndex::Sorted { len } => self
                .lock
                .holds
                .get(..*len)?
                .binary_search_by(|h| (h.kind, h.owner.as_slice()).cmp(&(kind, owner)))
                .ok(),
            OwnIndex::Map(own) => own
                .get(owner)
                .and_then(|slots| slots.get(kind.index()).copied().flatten()),
        }
    }

    pub fn lock(&self) -> &Lock {
        &self.lock
    }

    pub fn into_lock(self) -> Lock {
        self.lock
    }

    fn standing(&self, owner: &[u8]) -> Standing<'_> {
        let mut own = [None; HoldKind::ALL.len()];
        for (slot, kind) in own.iter_mut().zip(HoldKind::ALL) {
            *slot = self
                .position(owner, kind)
                .and_then(|i| self.lock.holds.get(i));
        }
        Standing {
            family: (!self.lock.holds.is_empty()).then_some(self.lock.family),
            holds: self.lock.holds.len(),
            any_exclusive: self.any_exclusive,
            own,
        }
    }

    /// The head waiter's acquire: the same rule as a command's, with nobody queued ahead.
    pub fn decide(
        &self,
        owner: &[u8],
        mode: Mode,
        lease_ms: u64,
        reentry: Reentry,
        now: UnixMs,
    ) -> Result<Decision, LockError> {
        decide_on(
            &self.standing(owner),
            mode,
            lease_ms,
            reentry,
            Queue::Empty,
            now,
        )
    }

    /// Writes the grant into the lock (see [`apply`]).
    pub fn apply(&mut self, owner: &[u8], mode: Mode, granted: &Granted, token: u64) {
        if self.lock.holds.is_empty() {
            self.lock.family = mode.family();
        }
        let hold = granted.hold(owner, token);
        self.any_exclusive |= granted.kind == HoldKind::Exclusive;
        let at = self.position(owner, granted.kind);
        match at.and_then(|i| self.lock.holds.get_mut(i)) {
            Some(slot) => *slot = hold,
            None => self.lock.holds.push(hold),
        }
    }
}
