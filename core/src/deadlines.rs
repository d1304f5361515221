//! Deadlines kept in time order, so that one server timer, armed for the earliest, serves them
//! all: waiter timeouts and the lease ends of locks that have waiters.

use std::collections::BTreeMap;

use crate::UnixMs;

/// Identifies one scheduled deadline; ordered by time, then by insertion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeadlineKey {
    pub at: UnixMs,
    seq: u64,
}

#[derive(Debug)]
pub struct Deadlines<E> {
    pending: BTreeMap<DeadlineKey, E>,
    seq: u64,
}

impl<E> Default for Deadlines<E> {
    fn default() -> Self {
        Deadlines {
            pending: BTreeMap::new(),
            seq: 0,
        }
    }
}

impl<E> Deadlines<E> {
    pub fn insert(&mut self, at: UnixMs, event: E) -> DeadlineKey {
        self.seq += 1;
        let key = DeadlineKey { at, seq: self.seq };
        self.pending.insert(key, event);
        key
    }

    pub fn remove(&mut self, key: DeadlineKey) -> Option<E> {
        self.pending.remove(&key)
    }

    /// The earliest deadline, if any.
    pub fn next_at(&self) -> Option<UnixMs> {
        self.pending.keys().next().map(|k| k.at)
    }

    /// Removes and returns the earliest deadline if it is due at `now`.
    pub fn pop_due(&mut self, now: UnixMs) -> Option<(DeadlineKey, E)> {
        self.pop_due_until(now, u64::MAX)
    }

    /// A mark of what is scheduled now: [`Deadlines::pop_due_until`] with it leaves what is
    /// inserted after it for later, even if it is due already.
    pub fn mark(&self) -> u64 {
        self.seq
    }

    /// Removes and returns the earliest deadline if it is due at `now` and was inserted before
    /// `mark` was taken. (A deadline inserted later is never earlier than the `now` it was
    /// inserted at, so stopping at the first one inserted later skips none inserted before.)
    pub fn pop_due_until(&mut self, now: UnixMs, mark: u64) -> Option<(DeadlineKey, E)> {
        let first = *self.pending.keys().next()?;
        if first.at > now || first.seq > mark {
            return None;
        }
        self.pending.remove(&first).map(|e| (first, e))
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    pub fn clear(&mut self) {
        self.pending.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_time_order_then_insertion_order() {
        let mut d = Deadlines::default();
        d.insert(30, "c");
        d.insert(10, "a");
        d.insert(10, "b");
        d.insert(50, "late");
        assert_eq!(d.next_at(), Some(10));
        let mut fired = Vec::new();
        while let Some((_, e)) = d.pop_due(30) {
            fired.push(e);
        }
        assert_eq!(fired, ["a", "b", "c"]);
        assert_eq!(d.next_at(), Some(50));
        assert!(d.pop_due(49).is_none());
    }

    #[test]
    fn a_mark_leaves_what_was_inserted_after_it_for_later() {
        let mut d = Deadlines::default();
        d.insert(5, "old");
        let mark = d.mark();
        d.insert(10, "new, due");
        d.insert(10, "new, due too");
        let mut fired = Vec::new();
        while let Some((_, e)) = d.pop_due_until(10, mark) {
            fired.push(e);
        }
        assert_eq!(fired, ["old"]);
        assert_eq!(d.next_at(), Some(10), "left for the next turn");
        assert_eq!(d.pop_due(10).map(|(_, e)| e), Some("new, due"));
    }

    #[test]
    fn removed_deadlines_never_fire() {
        let mut d = Deadlines::default();
        let k = d.insert(5, 1);
        d.insert(6, 2);
        assert_eq!(d.remove(k), Some(1));
        assert_eq!(d.remove(k), None);
        assert_eq!(d.pop_due(100).map(|(_, e)| e), Some(2));
        assert!(d.is_empty());
    }
}
