//! The keeper: one task per client and runtime that keeps every hold of the client acquired on
//! that runtime — the watchdog's renewals, and the end of a fixed lease — from one schedule of
//! due times.
//!
//! Why not a task per hold: spawning one on every acquire and aborting it on every release wakes
//! an idle worker of a multi-threaded runtime twice per hold (the spawn, then the abort). That
//! was most of what the library cost over the raw commands (`make bench`, scenario 9: client CPU
//! per acquire+release pair 66 µs against the raw commands' 52 µs). Here an acquire puts its hold
//! on the schedule, and wakes the keeper only if the hold is due before the keeper's next
//! wake-up; a release takes it off. At a hold's due time the keeper spawns its renewal (a short
//! task, once per third of a lease), which puts the hold back on the schedule once the server
//! has answered, or reports it lost.
//!
//! The keeper lives on the runtime of the acquires it keeps (a keeper per runtime, found by the
//! runtime's id): a hold is kept while the runtime it was acquired on runs, as before. It ends
//! when its client does (every handle and guard gone) or with its runtime.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::{sleep_until, Instant};

use crate::error::LockError;
use crate::hold::{renewed, HoldCore, Renewal};
use crate::lost::LostReason;

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

/// Which hold is due when.
#[derive(Default)]
struct Schedule {
    /// By due time (and a sequence number, to keep equal times apart).
    due: BTreeMap<(Instant, u64), Weak<HoldCore>>,
    next_seq: u64,
    /// When the keeper's task wakes next; `None` while it waits for a notification only.
    wake_at: Option<Instant>,
}

/// A hold's place with its keeper. Read and written only under its keeper's schedule lock.
#[derive(Default)]
pub(crate) struct Place {
    entry: Option<(Instant, u64)>,
    /// The renewal in flight, aborted by a release (nothing renews after a release).
    renewal: Option<AbortHandle>,
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
    /// Puts `hold` on the schedule at `at` (instead of where it was). Wakes the keeper's task
    /// only if `at` is before the task's next wake-up.
    pub(crate) fn schedule(&self, hold: &Arc<HoldCore>, at: Instant) {
        let mut schedule = relock(&self.schedule);
        let mut place = hold.place();
        self.insert(&mut schedule, &mut place, hold, at);
    }

    fn insert(
        &self,
        schedule: &mut Schedule,
        place: &mut Place,
        hold: &Arc<HoldCore>,
        at: Instant,
    ) {
        if let Some(old) = place.entry.take() {
            schedule.due.remove(&old);
        }
        let key = (at, schedule.next_seq);
        schedule.next_seq = schedule.next_seq.wrapping_add(1);
        schedule.due.insert(key, Arc::downgrade(hold));
        place.entry = Some(key);
        if schedule.wake_at.is_none_or(|w| at < w) {
            schedule.wake_at = Some(at);
            self.notify.notify_one();
        }
    }

    /// Takes `hold` off the schedule and stops its renewal in flight, if any.
    pub(crate) fn cancel(&self, hold: &HoldCore) {
        let mut schedule = relock(&self.schedule);
        let mut place = hold.place();
        if let Some(old) = place.entry.take() {
            schedule.due.remove(&old);
        }
        if let Some(renewal) = place.renewal.take() {
            renewal.abort();
        }
        // The task may wake at the removed entry's time for nothing: cheaper than waking it now.
    }

    /// Starts what is due at `now`; returns when the task should wake next.
    fn run_due(&self, now: Instant) -> Option<Instant> {
        let mut schedule = relock(&self.schedule);
        while let Some(entry) = schedule.due.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let weak = entry.remove();
            let Some(hold) = weak.upgrade() else {
                continue;
            };
            let mut place = hold.place();
            place.entry = None;
            if !hold.status.is_active() {
                continue;
            }
            match hold.renewal {
                Renewal::Fixed => {
                    let deadline = hold.deadline();
                    if now >= deadline {
                        hold.lose(LostReason::LeaseEnded);
                    } else {
                        // A re-entry set the lease again.
                        self.insert(&mut schedule, &mut place, &hold, deadline);
                    }
                }
                Renewal::Watchdog => {
                    let task = tokio::spawn(renew(hold.clone()));
                    place.renewal = Some(task.abort_handle());
                }
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
    loop {
        if keeper.closed.load(Ordering::Acquire) {
            return;
        }
        match keeper.run_due(Instant::now()) {
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

/// One renewal of a watchdog hold: `LOCK.RENEW` (again after a failure that says nothing, until
/// the local deadline), then back on the schedule a third of a lease after its send — or the
/// hold reported lost.
async fn renew(hold: Arc<HoldCore>) {
    let interval = renew_interval(hold.lease);
    let retry = interval.min(Duration::from_millis(100));
    loop {
        if !hold.status.is_active() {
            return;
        }
        let sent = Instant::now();
        let cmd = hold.renew_cmd();
        let reply = tokio::select! {
            r = hold.query(&cmd) => r,
            _ = sleep_until(hold.deadline()) => {
                hold.lose(LostReason::Unreachable);
                return;
            }
        };
        match reply.as_ref().map(renewed) {
            Ok(Some(true)) => {
                hold.extend(sent);
                hold.keeper.schedule(&hold, sent + interval);
                return;
            }
            Ok(Some(false)) => {
                // One key of a multi-key hold is enough: the hold is all its keys or nothing.
                hold.lose(LostReason::HoldGone);
                return;
            }
            Err(LockError::Server(text)) if is_final(text) => {
                // WRONGTYPE, "not a lock": the key holds something else now.
                hold.lose(LostReason::HoldGone);
                return;
            }
            Err(_) if hold.conn.is_own() => {
                // An EPHEMERAL hold lives and dies with its connection.
                hold.lose(LostReason::ConnectionClosed);
                return;
            }
            _ => {
                tokio::select! {
                    _ = sleep_until(Instant::now() + retry) => {}
                    _ = sleep_until(hold.deadline()) => {
                        hold.lose(LostReason::Unreachable);
                        return;
                    }
                }
            }
        }
    }
}

/// How often the watchdog renews: a third of the lease (at least 1 ms).
pub(crate) fn renew_interval(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(1))
}

/// Server errors after which the hold cannot be there any more (as opposed to LOADING, BUSY,
/// MASTERDOWN, ... which pass).
fn is_final(text: &str) -> bool {
    (text.starts_with("ERR ") && !text.contains("paused")) || text.starts_with("WRONGTYPE")
}

fn relock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The schedule is only changed in whole steps under this lock; a panic elsewhere cannot
    // leave it half-updated, so a poisoned lock is used as it is.
    m.lock().unwrap_or_else(|p| p.into_inner())
}
