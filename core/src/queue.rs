//! The waiters of every lock, in FIFO order per key.
//!
//! Lives in memory only (ownership is what replicates). Releasing pops the head in O(1); a waiter
//! that leaves early (timeout, disconnect) is removed from the index at once and its slot in the
//! key's order is skipped when it reaches the head, so no operation scans a queue. Orders that
//! collect more dead slots than live ones are compacted, which keeps memory bounded.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::rc::Rc;

use smallvec::SmallVec;

use crate::deadlines::DeadlineKey;
use crate::election::Campaign;
use crate::key::ClientId;
pub use crate::key::LockKey;
use crate::kind::{Mode, Reentry};
use crate::memory::{shrink_deque, shrink_map};
use crate::{LockError, UnixMs};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WaiterId(u64);

/// One blocked `LOCK.ACQUIRE ... WAIT` (or `LOCK.MACQUIRE ... WAIT`, queued on several keys at
/// once). `H` is the server's handle for the blocked client.
#[derive(Debug)]
pub struct Waiter<H> {
    pub id: WaiterId,
    pub handle: H,
    pub key: LockKey,
    /// A multi-key request's other keys (empty for one key). The waiter stands in the queue of
    /// each of its keys, entered in one step, and is granted only when it heads every one.
    pub others: Box<[LockKey]>,
    /// One copy, shared with the owner index of each of its keys' queues (a 64-key waiter
    /// with a large owner name keeps it once, not 65 times).
    pub owner: Rc<[u8]>,
    pub lease_ms: u64,
    /// What it asks for: exclusive, shared or a permit.
    pub mode: Mode,
    /// `ONCE`: where its owner holds a key already (a multi-key request), the grant does not
    /// count a re-entry.
    pub reentry: Reentry,
    /// `EPHEMERAL`: the connection its grant will be bound to.
    pub bind: Option<ClientId>,
    /// `LOCK.CAMPAIGN`: its grant is announced to the key's observers.
    pub campaign: Option<Campaign>,
    pub enqueued_at: UnixMs,
    /// The scheduled timeout, absent for `WAIT 0`.
    pub timeout: Option<DeadlineKey>,
}

#[derive(Debug, Default)]
struct KeyQueue {
    order: VecDeque<WaiterId>,
    live: usize,
    /// The queued waiter of each owner (an owner waits at most once per key).
    owners: HashMap<Rc<[u8]>, WaiterId>,
    /// The scheduled check of the holder's lease end, kept only while waiters are queued.
    lease_check: Option<DeadlineKey>,
}

impl<H> Waiter<H> {
    /// Every key it waits on, its first key first.
    pub fn keys(&self) -> impl Iterator<Item = &LockKey> {
        std::iter::once(&self.key).chain(self.others.iter())
    }

    /// Whether it waits on several keys at once.
    pub fn is_multi(&self) -> bool {
        !self.others.is_empty()
    }
}

/// What a removal left behind for the caller to cancel.
#[derive(Debug)]
pub struct Removed<H> {
    pub waiter: Waiter<H>,
    /// Queues that became empty: their lease checks, now unneeded.
    pub orphaned_lease_checks: SmallVec<[DeadlineKey; 1]>,
}

#[derive(Debug)]
pub struct WaitQueues<H> {
    queues: HashMap<LockKey, KeyQueue>,
    waiters: HashMap<WaiterId, Waiter<H>>,
    by_handle: HashMap<H, WaiterId>,
    /// Key names with a queue, and in how many databases: lets a keyspace event be checked
    /// against the waited keys by name alone, without building a key.
    names: HashMap<Box<[u8]>, usize>,
    next_id: u64,
}

impl<H> Default for WaitQueues<H> {
    fn default() -> Self {
        WaitQueues {
            queues: HashMap::new(),
            waiters: HashMap::new(),
            by_handle: HashMap::new(),
            names: HashMap::new(),
            next_id: 0,
        }
    }
}

pub struct NewWaiter<'a, H> {
    pub handle: H,
    pub key: &'a LockKey,
    /// A multi-key request's other keys (distinct, none equal to `key`).
    pub others: &'a [LockKey],
    pub owner: &'a [u8],
    pub lease_ms: u64,
    pub mode: Mode,
    pub reentry: Reentry,
    pub bind: Option<ClientId>,
    pub campaign: Option<Campaign>,
    pub now: UnixMs,
}

impl<H: Copy + Eq + Hash> WaitQueues<H> {
    /// Queues a waiter at the tail of its key's queue — of each of its keys' queues, in one step,
    /// so that the queues agree on the order of any two waiters that share keys.
    pub fn push(&mut self, new: NewWaiter<'_, H>, max_per_key: u64) -> Result<WaiterId, LockError> {
        let keys = || std::iter::once(new.key).chain(new.others.iter());
        if keys().any(|key| self.len(key) as u64 >= max_per_key) {
            return Err(LockError::TooManyWaiters { max: max_per_key });
        }
        self.next_id += 1;
        let id = WaiterId(self.next_id);
        let owner: Rc<[u8]> = new.owner.into();
        for key in keys() {
            if !self.queues.contains_key(key) {
                *self.names.entry(key.name.clone()).or_default() += 1;
            }
            let queue = self.queues.entry(key.clone()).or_default();
            queue.order.push_back(id);
            queue.live += 1;
            queue.owners.insert(Rc::clone(&owner), id);
        }
        self.by_handle.insert(new.handle, id);
        self.waiters.insert(
            id,
            Waiter {
                id,
                handle: new.handle,
                key: new.key.clone(),
                others: new.others.into(),
                owner,
                lease_ms: new.lease_ms,
                mode: new.mode,
                reentry: new.reentry,
                bind: new.bind,
                campaign: new.campaign,
                enqueued_at: new.now,
                timeout: None,
            },
        );
        Ok(id)
    }

    /// Takes the longest-waiting live waiter of `key`.
    pub fn pop_front(&mut self, key: &LockKey) -> Option<Removed<H>> {
        let queue = self.queues.get_mut(key)?;
        while let Some(id) = queue.order.pop_front() {
            if let Some(waiter) = self.waiters.remove(&id) {
                self.by_handle.remove(&waiter.handle);
                queue.live -= 1;
                queue.owners.remove(&waiter.owner);
                let mut orphaned_lease_checks = SmallVec::new();
                orphaned_lease_checks.extend(self.drop_queue_if_empty(key));
                for other in waiter.keys().filter(|k| *k != key) {
                    orphaned_lease_checks.extend(self.leave_queue(other, &waiter.owner));
                }
                // Slots of waiters that already left, right behind it, go too: finding the
                // head never walks past them.
                self.drop_dead_head(key);
                self.shrink();
                return Some(Removed {
                    waiter,
                    orphaned_lease_checks,
                });
            }
        }
        // Unreachable in practice (an empty queue is dropped at once); a stale lease check that
        // fires for a key without waiters does nothing.
        self.remove_queue(key);
        None
    }

    /// The waiter `owner` has queued on `key`, if any.
    pub fn queued_owner(&self, key: &LockKey, owner: &[u8]) -> Option<WaiterId> {
        self.queues.get(key)?.owners.get(owner).copied()
    }

    /// Gives a queued waiter's place to a new blocked client of the same owner (a client that
    /// gave up on its wait and asked again): same position, the new handle and lease. Returns
    /// the old handle, and the old timeout for the caller to cancel.
    pub fn replace(
        &mut self,
        id: WaiterId,
        new: NewWaiter<'_, H>,
    ) -> Option<(H, Option<DeadlineKey>)> {
        let waiter = self.waiters.get_mut(&id)?;
        let old = std::mem::replace(&mut waiter.handle, new.handle);
        let handle = new.handle;
        waiter.lease_ms = new.lease_ms;
        waiter.mode = new.mode;
        waiter.reentry = new.reentry;
        waiter.bind = new.bind;
        waiter.campaign = new.campaign;
        // The same keys, perhaps listed in another order: the answer follows the new order
        // (its places in the queues are the waiter's, whatever the order).
        waiter.key = new.key.clone();
        waiter.others = new.others.into();
        let timeout = waiter.timeout.take();
        self.by_handle.remove(&old);
        self.by_handle.insert(handle, id);
        Some((old, timeout))
    }

    /// The longest-waiting live waiter of `key`, left in place.
    pub fn front(&self, key: &LockKey) -> Option<&Waiter<H>> {
        let queue = self.queues.get(key)?;
        queue.order.iter().find_map(|id| self.waiters.get(id))
    }

    /// Removes a waiter wherever it is in its queues (timeout, disconnect, CLIENT UNBLOCK, a
    /// multi-key grant).
    pub fn remove(&mut self, id: WaiterId) -> Option<Removed<H>> {
        let waiter = self.waiters.remove(&id)?;
        self.by_handle.remove(&waiter.handle);
        let mut orphaned_lease_checks = SmallVec::new();
        for key in waiter.keys() {
            orphaned_lease_checks.extend(self.leave_queue(key, &waiter.owner));
        }
        self.shrink();
        Some(Removed {
            waiter,
            orphaned_lease_checks,
        })
    }

    /// A waiter (already out of `waiters`) leaves `key`'s queue: its slot in the order is
    /// skipped when it reaches the head, or compacted away. Returns the queue's lease check if
    /// the queue emptied.
    fn leave_queue(&mut self, key: &LockKey, owner: &[u8]) -> Option<DeadlineKey> {
        if let Some(queue) = self.queues.get_mut(key) {
            queue.live = queue.live.saturating_sub(1);
            queue.owners.remove(owner);
            let waiters = &self.waiters;
            // Departed slots at the head go at once: finding the head never walks past them
            // (a multi-key grant leaves one at the head of each of its other keys).
            while queue
                .order
                .front()
                .is_some_and(|id| !waiters.contains_key(id))
            {
                queue.order.pop_front();
            }
            if queue.order.len() > 2 * queue.live + 32 {
                queue.order.retain(|id| waiters.contains_key(id));
            }
            shrink_deque(&mut queue.order);
            shrink_map(&mut queue.owners);
        }
        self.drop_queue_if_empty(key)
    }

    fn drop_dead_head(&mut self, key: &LockKey) {
        let waiters = &self.waiters;
        if let Some(queue) = self.queues.get_mut(key) {
            while queue
                .order
                .front()
                .is_some_and(|id| !waiters.contains_key(id))
            {
                queue.order.pop_front();
            }
            shrink_deque(&mut queue.order);
            shrink_map(&mut queue.owners);
        }
    }

    /// Gives back the tables' room once most waiters are gone (see `crate::memory`).
    fn shrink(&mut self) {
        shrink_map(&mut self.waiters);
        shrink_map(&mut self.by_handle);
        shrink_map(&mut self.queues);
        shrink_map(&mut self.names);
    }

    /// Whether `id` is the longest-waiting live waiter of `key`.
    pub fn heads(&self, key: &LockKey, id: WaiterId) -> bool {
        self.front(key).map(|w| w.id) == Some(id)
    }

    /// The waiter with this client handle.
    pub fn id_of(&self, handle: H) -> Option<WaiterId> {
        self.by_handle.get(&handle).copied()
    }

    pub fn get(&self, id: WaiterId) -> Option<&Waiter<H>> {
        self.waiters.get(&id)
    }

    pub fn remove_by_handle(&mut self, handle: H) -> Option<Removed<H>> {
        let id = *self.by_handle.get(&handle)?;
        self.remove(id)
    }

    fn drop_queue_if_empty(&mut self, key: &LockKey) -> Option<DeadlineKey> {
        match self.queues.get(key) {
            Some(q) if q.live == 0 => self.remove_queue(key).and_then(|q| q.lease_check),
            _ => None,
        }
    }

    fn remove_queue(&mut self, key: &LockKey) -> Option<KeyQueue> {
        let queue = self.queues.remove(key)?;
        if let Some(count) = self.names.get_mut(&key.name) {
            *count -= 1;
            if *count == 0 {
                self.names.remove(&key.name);
            }
        }
        Some(queue)
    }

    /// Whether some database has waiters on a key of this name.
    pub fn is_waited_name(&self, name: &[u8]) -> bool {
        self.names.contains_key(name)
    }

    pub fn get_mut(&mut self, id: WaiterId) -> Option<&mut Waiter<H>> {
        self.waiters.get_mut(&id)
    }

    /// Live waiters on `key`.
    pub fn len(&self, key: &LockKey) -> usize {
        self.queues.get(key).map_or(0, |q| q.live)
    }

    pub fn has_waiters(&self, key: &LockKey) -> bool {
        self.len(key) > 0
    }

    /// Live waiters on all keys.
    pub fn total(&self) -> usize {
        self.waiters.len()
    }

    /// How many keys have at least one live waiter (O(1)).
    pub fn key_count(&self) -> usize {
        self.queues.len()
    }

    /// Keys with at least one live waiter.
    pub fn keys(&self) -> impl Iterator<Item = &LockKey> {
        self.queues.keys()
    }

    /// Replaces the key's lease check, returning the previous one to cancel. A key without
    /// waiters keeps no lease check: the new one is returned to be cancelled at once.
    pub fn set_lease_check(
        &mut self,
        key: &LockKey,
        check: Option<DeadlineKey>,
    ) -> Option<DeadlineKey> {
        match self.queues.get_mut(key) {
            Some(q) => std::mem::replace(&mut q.lease_check, check),
            None => check,
        }
    }

    pub fn lease_check(&self, key: &LockKey) -> Option<DeadlineKey> {
        self.queues.get(key).and_then(|q| q.lease_check)
    }

    /// Every waiter, for shutdown.
    pub fn drain(&mut self) -> Vec<Waiter<H>> {
        self.queues.clear();
        self.names.clear();
        self.by_handle.clear();
        self.waiters.drain().map(|(_, w)| w).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> LockKey {
        LockKey::new(0, name.as_bytes())
    }

    fn push(q: &mut WaitQueues<u32>, handle: u32, k: &LockKey) -> WaiterId {
        q.push(
            NewWaiter {
                handle,
                key: k,
                others: &[],
                owner: format!("owner-{handle}").as_bytes(),
                lease_ms: 100,
                mode: Mode::Exclusive,
                reentry: Reentry::Counted,
                bind: None,
                campaign: None,
                now: 0,
            },
            100_000,
        )
        .unwrap()
    }

    fn drain_order(q: &mut WaitQueues<u32>, k: &LockKey) -> Vec<u32> {
        std::iter::from_fn(|| q.pop_front(k).map(|r| r.waiter.handle)).collect()
    }

    #[test]
    fn waiters_leave_in_arrival_order() {
        let mut q = WaitQueues::default();
        let a = key("a");
        for h in 1..=5 {
            push(&mut q, h, &a);
        }
        assert_eq!(q.len(&a), 5);
        assert_eq!(drain_order(&mut q, &a), [1, 2, 3, 4, 5]);
        assert_eq!(q.total(), 0);
        assert_eq!(q.keys().count(), 0);
    }

    #[test]
    fn a_waiter_that_left_is_skipped_and_never_granted() {
        let mut q = WaitQueues::default();
        let a = key("a");
        let ids: Vec<_> = (1..=4).map(|h| push(&mut q, h, &a)).collect();
        assert!(q.remove(ids[1]).is_some());
        assert!(q.remove_by_handle(3).is_some());
        assert!(q.remove(ids[1]).is_none(), "removing twice is a no-op");
        assert_eq!(q.len(&a), 2);
        assert_eq!(drain_order(&mut q, &a), [1, 4]);
    }

    #[test]
    fn a_replacement_keeps_the_place_and_the_owner_index_follows_removals() {
        let mut q = WaitQueues::default();
        let a = key("a");
        push(&mut q, 1, &a);
        let second = push(&mut q, 2, &a);
        push(&mut q, 3, &a);
        assert_eq!(q.queued_owner(&a, b"owner-2"), Some(second));
        assert_eq!(
            q.replace(
                second,
                NewWaiter {
                    handle: 20,
                    key: &a,
                    others: &[],
                    owner: b"owner-2",
                    lease_ms: 7,
                    mode: Mode::Exclusive,
                    reentry: Reentry::Counted,
                    bind: None,
                    campaign: None,
                    now: 0,
                }
            ),
            Some((2, None))
        );
        assert!(q.remove_by_handle(2).is_none(), "the old handle is gone");
        assert_eq!(q.get_mut(second).map(|w| w.lease_ms), Some(7));
        assert_eq!(drain_order(&mut q, &a), [1, 20, 3]);
        assert_eq!(q.queued_owner(&a, b"owner-2"), None);
        let w = push(&mut q, 4, &a);
        q.remove(w);
        assert_eq!(q.queued_owner(&a, b"owner-4"), None);
    }

    #[test]
    fn waited_names_follow_the_queues_across_databases() {
        let mut q = WaitQueues::default();
        let a0 = key("a");
        let a1 = LockKey::new(1, b"a");
        assert!(!q.is_waited_name(b"a"));
        let first = push(&mut q, 1, &a0);
        push(&mut q, 2, &a1);
        assert!(q.is_waited_name(b"a"));
        assert!(!q.is_waited_name(b"b"));
        q.remove(first);
        assert!(q.is_waited_name(b"a"), "db 1 still waits on a");
        q.pop_front(&a1);
        assert!(!q.is_waited_name(b"a"));
        let over = NewWaiter {
            handle: 3,
            key: &a0,
            others: &[],
            owner: b"o",
            lease_ms: 1,
            mode: Mode::Exclusive,
            reentry: Reentry::Counted,
            bind: None,
            campaign: None,
            now: 0,
        };
        assert!(q.push(over, 0).is_err());
        assert!(
            !q.is_waited_name(b"a"),
            "a refused push leaves no name behind"
        );
    }

    #[test]
    fn keys_and_databases_are_separate_queues() {
        let mut q = WaitQueues::default();
        let a0 = key("a");
        let a1 = LockKey::new(1, b"a");
        push(&mut q, 1, &a0);
        push(&mut q, 2, &a1);
        push(&mut q, 3, &a0);
        assert_eq!(drain_order(&mut q, &a1), [2]);
        assert_eq!(drain_order(&mut q, &a0), [1, 3]);
    }

    #[test]
    fn the_per_key_limit_refuses_with_a_clear_error() {
        let mut q = WaitQueues::default();
        let a = key("a");
        let new = |h| NewWaiter {
            handle: h,
            key: &a,
            others: &[],
            owner: b"o",
            lease_ms: 1,
            mode: Mode::Exclusive,
            reentry: Reentry::Counted,
            bind: None,
            campaign: None,
            now: 0,
        };
        q.push(new(1), 2).unwrap();
        q.push(new(2), 2).unwrap();
        assert_eq!(q.push(new(3), 2), Err(LockError::TooManyWaiters { max: 2 }));
        assert_eq!(q.len(&a), 2);
    }

    #[test]
    fn departed_slots_are_compacted() {
        let mut q = WaitQueues::default();
        let a = key("a");
        let ids: Vec<_> = (0..1_000).map(|h| push(&mut q, h, &a)).collect();
        for id in &ids[..999] {
            q.remove(*id);
        }
        let order_len = q.queues.get(&a).map(|kq| kq.order.len()).unwrap();
        // One live waiter: compaction keeps at most 2 * live + 32 slots (+1 before it runs).
        let live = 1;
        assert!(order_len <= 2 * live + 33, "order kept {order_len} slots");
        assert_eq!(drain_order(&mut q, &a), [999]);
    }

    #[test]
    fn the_lease_check_goes_when_the_queue_empties() {
        let mut deadlines = crate::deadlines::Deadlines::default();
        let check = deadlines.insert(10, ());
        let mut q = WaitQueues::default();
        let a = key("a");
        // No waiters: the check is handed straight back.
        assert_eq!(q.set_lease_check(&a, Some(check)), Some(check));
        push(&mut q, 1, &a);
        assert_eq!(q.set_lease_check(&a, Some(check)), None);
        assert_eq!(q.lease_check(&a), Some(check));
        let removed = q.pop_front(&a).unwrap();
        assert_eq!(removed.orphaned_lease_checks.as_slice(), [check]);
    }

    #[test]
    fn a_hundred_thousand_waiters_over_many_keys_and_ten_thousand_on_one() {
        let mut q = WaitQueues::default();
        let hot = key("hot");
        for h in 0..10_000u32 {
            push(&mut q, h, &hot);
        }
        for h in 10_000..110_000u32 {
            push(&mut q, h, &key(&format!("k{}", h % 9_000)));
        }
        assert_eq!(q.total(), 110_000);
        assert_eq!(q.len(&hot), 10_000);
        // Popping the head never walks the queue: the first pops return at once, in order.
        assert_eq!(q.pop_front(&hot).map(|r| r.waiter.handle), Some(0));
        assert_eq!(q.pop_front(&hot).map(|r| r.waiter.handle), Some(1));
        for h in 10_000..110_000u32 {
            assert!(q.remove_by_handle(h).is_some());
        }
        assert_eq!(q.total(), 9_998);
        assert_eq!(q.keys().count(), 1);
    }
}
