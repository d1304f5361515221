//! The index from a grant (its key's fingerprint, its token) to the connection it is bound to:
//! an open-addressing table of 24-byte entries.
//!
//! A binding is paid for per hold, and a standard hash map costs 16 bytes an entry plus a
//! control byte at a load between 7/16 and 7/8, in an allocation just over a power of two that
//! the allocator then rounds up by a further quarter: 37–46 bytes an entry at a few hundred to
//! a thousand holds. This table sizes itself in the allocator's own size classes and keeps its
//! load between 1/2 and 4/5: 20–32 bytes an entry.
//!
//! Linear probing with deletion by backward shift (no tombstones), so lookups stay short
//! however many bindings come and go; positions come from a keyed hash, so clients cannot aim
//! grants at one run of the table.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use super::{size_class, ClientId};

/// One binding: the token, the fingerprint of the key (its database and name), the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Entry {
    token: u64,
    key: u64,
    client: ClientId,
}

/// A free position. Its client id (2^64 - 1) is no real entry's: that id is not packed.
const FREE: Entry = Entry {
    token: 0,
    key: 0,
    client: ClientId::MAX,
};

impl Entry {
    /// None for the one client id that marks a free position.
    pub(super) fn pack(key: u64, token: u64, client: ClientId) -> Option<Entry> {
        (client != ClientId::MAX).then_some(Entry { token, key, client })
    }

    fn client(&self) -> ClientId {
        self.client
    }

    fn is_free(&self) -> bool {
        self.client == ClientId::MAX
    }

    fn is(&self, key: u64, token: u64) -> bool {
        !self.is_free() && self.token == token && self.key == key
    }
}

/// The table grows past 4/5 full, shrinks below 1/5, and is rebuilt at 2/3 (or a little less,
/// up to the next size class): a rebuild every fifth more entries at least, so each entry is
/// moved a handful of times in all.
const GROW_AT: (usize, usize) = (4, 5);
const SHRINK_AT: (usize, usize) = (1, 5);
const REBUILD_TO: (usize, usize) = (2, 3);

#[derive(Debug, Default)]
pub(super) struct GrantIndex {
    entries: Vec<Entry>,
    len: usize,
    hasher: RandomState,
}

impl GrantIndex {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn get(&self, key: u64, token: u64) -> Option<ClientId> {
        self.find(key, token)
            .and_then(|at| self.entries.get(at))
            .map(Entry::client)
    }

    /// Adds the entry; returns the client its grant was bound to before, if any.
    pub(super) fn insert(&mut self, entry: Entry) -> Option<ClientId> {
        let previous = self.remove(entry.key, entry.token);
        if (self.len + 1) * GROW_AT.1 > self.entries.len() * GROW_AT.0 {
            self.rebuild(self.len + 1);
        }
        self.place(entry);
        previous
    }

    /// Puts an entry that is not in the table at the first free position from its home (the
    /// table always has one: it grows before it is 4/5 full).
    fn place(&mut self, entry: Entry) {
        let mut at = self.home(entry.key, entry.token);
        for _ in 0..self.entries.len() {
            match self.entries.get_mut(at) {
                Some(free) if free.is_free() => {
                    *free = entry;
                    self.len += 1;
                    return;
                }
                _ => at = self.next(at),
            }
        }
    }

    /// Removes the grant's entry; returns the client it bound.
    pub(super) fn remove(&mut self, key: u64, token: u64) -> Option<ClientId> {
        let at = self.find(key, token)?;
        let client = self.entries.get(at)?.client();
        self.close_gap(at);
        self.len -= 1;
        if self.len * SHRINK_AT.1 < self.entries.len() * SHRINK_AT.0 && self.entries.len() > 8 {
            self.rebuild(self.len);
        }
        Some(client)
    }

    pub(super) fn clear(&mut self) {
        self.entries = Vec::new();
        self.len = 0;
    }

    fn find(&self, key: u64, token: u64) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mut at = self.home(key, token);
        for _ in 0..self.entries.len() {
            let entry = self.entries.get(at)?;
            if entry.is_free() {
                return None;
            }
            if entry.is(key, token) {
                return Some(at);
            }
            at = self.next(at);
        }
        None
    }

    /// Where the grant's probe starts: the hash scaled to the table's size (not a power of two).
    fn home(&self, key: u64, token: u64) -> usize {
        let hash = self.hasher.hash_one((key, token));
        ((u128::from(hash) * self.entries.len() as u128) >> 64) as usize
    }

    fn next(&self, at: usize) -> usize {
        if at + 1 >= self.entries.len() {
            0
        } else {
            at + 1
        }
    }

    /// Frees position `gap` and moves back every later entry of the run that may sit there, so
    /// that no probe stops early at a free position before its entry.
    fn close_gap(&mut self, mut gap: usize) {
        let mut at = gap;
        for _ in 0..self.entries.len() {
            at = self.next(at);
            let Some(&entry) = self.entries.get(at) else {
                break;
            };
            if entry.is_free() {
                break;
            }
            let home = self.home(entry.key, entry.token);
            // The entry stays if its home lies cyclically in (gap, at]: moving it to `gap`
            // would put it before its home.
            let stays = if gap <= at {
                gap < home && home <= at
            } else {
                gap < home || home <= at
            };
            if !stays {
                if let Some(hole) = self.entries.get_mut(gap) {
                    *hole = entry;
                }
                gap = at;
            }
        }
        if let Some(hole) = self.entries.get_mut(gap) {
            *hole = FREE;
        }
    }

    /// Moves every entry into a table sized for `len` entries at 2/3 load (in whole size
    /// classes of the allocator).
    fn rebuild(&mut self, len: usize) {
        let wanted = (len * REBUILD_TO.1 / REBUILD_TO.0).max(4);
        let bytes = size_class(wanted * std::mem::size_of::<Entry>());
        let old = std::mem::replace(
            &mut self.entries,
            vec![FREE; bytes / std::mem::size_of::<Entry>()],
        );
        self.len = 0;
        for entry in old.into_iter().filter(|e| !e.is_free()) {
            self.place(entry);
        }
    }

    #[cfg(test)]
    pub(super) fn capacity(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn entries_are_twenty_four_bytes_and_the_free_marker_is_not_packed() {
        assert_eq!(std::mem::size_of::<Entry>(), 24);
        assert!(Entry::pack(u64::MAX, 1, u64::MAX - 1).is_some());
        assert_eq!(Entry::pack(0, 1, u64::MAX), None, "that would be FREE");
        let entry = Entry::pack(16_383, u64::MAX, 12_345).unwrap();
        assert_eq!(
            (entry.key, entry.token, entry.client()),
            (16_383, u64::MAX, 12_345)
        );
        assert!(!entry.is_free());
    }

    #[test]
    fn the_load_stays_between_a_half_and_four_fifths_as_it_grows() {
        let mut index = GrantIndex::default();
        for token in 0..10_000u64 {
            index.insert(Entry::pack(7, token, 1).unwrap());
            let load = index.len() as f64 / index.capacity() as f64;
            if token > 100 {
                assert!((0.5..=0.8).contains(&load), "{token}: {load}");
            }
            let bytes = index.capacity() * 24;
            assert!(
                size_class(bytes) - bytes < 24,
                "the allocator's size class wastes less than an entry"
            );
        }
        for token in 0..10_000u64 {
            assert_eq!(index.get(7, token), Some(1));
            assert_eq!(index.get(8, token), None);
        }
        for token in 0..9_990u64 {
            assert_eq!(index.remove(7, token), Some(1));
        }
        assert_eq!(index.len(), 10);
        assert!(index.capacity() < 64, "shrinks: {}", index.capacity());
        assert_eq!(index.get(7, 9_995), Some(1));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u64, u64),
        Remove(u64, u64),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few slots and tokens, so that entries collide, runs wrap and removals hit.
        prop_oneof![
            8 => (0u64..3, 0u64..40, 1u64..5).prop_map(|(s, t, c)| Op::Insert(s, t, c)),
            6 => (0u64..3, 0u64..40).prop_map(|(s, t)| Op::Remove(s, t)),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        /// The table answers exactly as a map would, through growth, shrinking and removals
        /// in the middle of runs.
        #[test]
        fn the_index_behaves_like_a_map(ops in proptest::collection::vec(op(), 1..400)) {
            let mut index = GrantIndex::default();
            let mut model: HashMap<(u64, u64), u64> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(slot, token, client) => {
                        let entry = Entry::pack(slot, token, client).unwrap();
                        prop_assert_eq!(index.insert(entry), model.insert((slot, token), client));
                    }
                    Op::Remove(slot, token) => {
                        prop_assert_eq!(index.remove(slot, token), model.remove(&(slot, token)));
                    }
                    Op::Clear => {
                        index.clear();
                        model.clear();
                    }
                }
                prop_assert_eq!(index.len(), model.len());
                for slot in 0..3 {
                    for token in 0..40 {
                        prop_assert_eq!(index.get(slot, token), model.get(&(slot, token)).copied());
                    }
                }
            }
        }
    }
}
