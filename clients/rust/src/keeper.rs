//! The keeper: one task per client and runtime that wakes every hold of the client acquired on
//! that runtime at the time its machine asked for (the watchdog's renewals, a deadline), from
//! one schedule of due times. It knows nothing of holds: anything [`Timed`] can be scheduled.
//!
//! Why not a task per hold: spawning one on every acquire and aborting it on every release wakes
//! an idle worker of a multi-threaded runtime twice per hold (the spawn, then the abort). That
//! was most of what the library cost over the raw commands (`make bench`, scenario 9: client CPU
//! per acquire+release pair 66 µs against the raw commands' 52 µs). Here an acquire puts its hold
//! on the schedule, and wakes the keeper only if the hold is due before the keeper's next
//! wake-up; a release takes it off.
//!
//! The keeper lives on the runtime of the acquires it keeps (a keeper per runtime, found by the
//! runtime's id): a hold is kept while the runtime it was acquired on runs. It ends when its
//! client does (every handle and guard gone) or with its runtime.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::{sleep_until, Instant};

use crate::basics::relock;

/// Something the keeper wakes at a due time.
pub(crate) trait Timed: Send + Sync + 'static {
    /// Its due time came (called outside the keeper's locks).
    fn fire(self: Arc<Self>, now: Instant);
}

/// The keepers of one client, one per runtime it acquired on.
pub(crate) struct Keepers {
    list: Mutex<Vec<Arc<Keeper>>>,
}

/// One keeper: its schedule, and how its task is told of an earlier due time.
pub(crate) struct Keeper {
    runtime: tokio::runtime::Id,
    /// False once its task has ended (its runtime shut down): the next acquire on a runtime with
    /// that id starts a new keeper.
    alive: AtomicBool,
    /// Set when the client is gone: the task ends.
    closed: AtomicBool,
    schedule: Mutex<Schedule>,
    notify: Notify,
}

/// What is due when.
#[derive(Default)]
struct Schedule {
    /// By due time (and a sequence number, to keep equal times apart).
    due: BTreeMap<(Instant, u64), Weak<dyn Timed>>,
    next_seq: u64,
    /// When the keeper's task wakes next; `None` while it waits for a notification only.
    wake_at: Option<Instant>,
}

/// A place on a keeper's schedule, kept by the scheduled item under its own lock (taken before
/// the keeper's, never after).
#[derive(Default)]
pub(crate) struct Place {
    entry: Option<(Instant, u64)>,
}

impl Keepers {
    pub(crate) fn new() -> Keepers {
        Keepers {
            list: Mutex::new(Vec::new()),
        }
    }

    /// The keeper of the runtime this is called on, started if there is none. Called in async
    /// code only (an acquire), so there is a current runtime.
    pub(crate) fn current(&self) -> Arc<Keeper> {
        let handle = Handle::current();
        let id = handle.id();
        let mut list = relock(&self.list);
        list.retain(|k| k.alive.load(Ordering::Acquire));
        if let Some(keeper) = list.iter().find(|k| k.runtime == id) {
            return keeper.clone();
        }
        let keeper = Arc::new(Keeper {
            runtime: id,
            alive: AtomicBool::new(true),
            closed: AtomicBool::new(false),
            schedule: Mutex::new(Schedule::default()),
            notify: Notify::new(),
        });
        // Made outside the task, so that a task dropped unpolled (a runtime shutting down)
        // marks the keeper dead too.
        let alive = Alive(keeper.clone());
        handle.spawn(async move {
            let alive = alive;
            run(&alive.0).await;
        });
        list.push(keeper.clone());
        keeper
    }
}

impl Drop for Keepers {
    fn drop(&mut self) {
        for keeper in relock(&self.list).iter() {
            keeper.closed.store(true, Ordering::Release);
            keeper.notify.notify_one();
        }
    }
}

/// Marks its keeper dead when dropped: when the keeper's task ends, however it ends.
struct Alive(Arc<Keeper>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::Release);
    }
}

impl Keeper {
    /// Puts `item` on the schedule at `at` (instead of where it was). Wakes the keeper's task
    /// only if `at` is before the task's next wake-up.
    pub(crate) fn schedule(&self, item: Weak<dyn Timed>, place: &mut Place, at: Instant) {
        let mut schedule = relock(&self.schedule);
        if let Some(old) = place.entry.take() {
            schedule.due.remove(&old);
        }
        let key = (at, schedule.next_seq);
        schedule.next_seq = schedule.next_seq.wrapping_add(1);
        schedule.due.insert(key, item);
        place.entry = Some(key);
        if schedule.wake_at.is_none_or(|w| at < w) {
            schedule.wake_at = Some(at);
            self.notify.notify_one();
        }
    }

    /// Takes the item at `place` off the schedule.
    pub(crate) fn cancel(&self, place: &mut Place) {
        if let Some(old) = place.entry.take() {
            relock(&self.schedule).due.remove(&old);
        }
        // The task may wake at the removed entry's time for nothing: cheaper than waking it now.
    }

    /// Takes off what is due at `now`; returns it and when the task should wake next.
    fn take_due(&self, now: Instant, due: &mut Vec<Arc<dyn Timed>>) -> Option<Instant> {
        let mut schedule = relock(&self.schedule);
        while let Some(entry) = schedule.due.first_entry() {
            if entry.key().0 > now {
                break;
            }
            // The item's place still names the entry: taking off an entry that is gone does
            // nothing, so it is left as it is (the item's lock is not taken under this one).
            if let Some(item) = entry.remove().upgrade() {
                due.push(item);
            }
        }
        // Keep a wake-up still ahead even if its entry is gone (a release took it off): an
        // acquire compares its due time with it, and one that is later wakes nobody. Recomputed
        // from the schedule alone, an acquire right after a release would find the keeper
        // waiting for nothing and wake it, every time.
        let first = schedule.due.first_key_value().map(|(k, _)| k.0);
        let ahead = schedule.wake_at.filter(|w| *w > now);
        schedule.wake_at = match (first, ahead) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        schedule.wake_at
    }
}

/// The keeper's task.
async fn run(keeper: &Keeper) {
    let mut due = Vec::new();
    loop {
        if keeper.closed.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        let next = keeper.take_due(now, &mut due);
        for item in due.drain(..) {
            item.fire(now);
        }
        match next {
            Some(at) => {
                tokio::select! {
                    _ = sleep_until(at) => {}
                    _ = keeper.notify.notified() => {}
                }
            }
            None => keeper.notify.notified().await,
        }
    }
}
