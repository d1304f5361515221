//! Giving memory back after a burst. The standard maps keep their capacity when entries are
//! removed: after 100,000 waiters have come and gone, their tables would stay at the size of
//! 100,000. Each is shrunk once it fills less than a quarter of its room (to twice its length,
//! so that a queue that breathes does not shrink and grow at every step), which keeps the
//! module's memory in proportion to what waits now.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;

/// Tables this small are never shrunk.
const KEEP: usize = 64;

fn oversized(len: usize, capacity: usize) -> bool {
    capacity > KEEP && len.saturating_mul(4) < capacity
}

pub fn shrink_map<K: Eq + Hash, V>(map: &mut HashMap<K, V>) {
    if oversized(map.len(), map.capacity()) {
        map.shrink_to(map.len().saturating_mul(2));
    }
}

pub fn shrink_set<T: Eq + Hash>(set: &mut HashSet<T>) {
    if oversized(set.len(), set.capacity()) {
        set.shrink_to(set.len().saturating_mul(2));
    }
}

pub fn shrink_deque<T>(deque: &mut VecDeque<T>) {
    if oversized(deque.len(), deque.capacity()) {
        deque.shrink_to(deque.len().saturating_mul(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_shrinks_once_it_is_nearly_empty_and_a_small_one_is_left_alone() {
        let mut map: HashMap<u32, u32> = (0..10_000).map(|i| (i, i)).collect();
        let full = map.capacity();
        map.retain(|k, _| *k < 100);
        shrink_map(&mut map);
        assert!(map.capacity() < full / 16, "{}", map.capacity());
        assert_eq!(map.len(), 100);
        let mut small: HashMap<u32, u32> = (0..40).map(|i| (i, i)).collect();
        small.clear();
        let before = small.capacity();
        shrink_map(&mut small);
        assert_eq!(small.capacity(), before, "small tables are left alone");
        let mut deque: VecDeque<u32> = (0..1_000).collect();
        deque.truncate(10);
        shrink_deque(&mut deque);
        assert!(deque.capacity() < 100);
    }
}
