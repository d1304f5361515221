//! The module's side of waiting: the scheduler's state (the rules live in
//! `lock_core::scheduler`), the one module timer that serves every deadline, the inbox of
//! changes noticed by keyspace events, and [`RedisPort`], which carries the scheduler's effects
//! out on the server.
//!
//! Everything runs on Redis's main thread. The scheduler is a thread-local `RefCell`; a borrow
//! is never held across a Redis call that could call back into the module, except keyspace
//! events (raised by lazy expiry inside `OpenKey`), which only touch the separate `INBOX`.

use std::cell::{Cell, RefCell};

use lock_core::args::Wait;
use lock_core::queue::LockKey;
use lock_core::scheduler::{
    Answer, Attempt, Cause, Change, Handoff, NewWait, Note, Port, Scheduler, Seen, Writes,
};
use lock_core::state::View;
use lock_core::LockError;

use crate::ffi::{self, now_ms, with_db, Ctx, Key, KeyKind, OwnedString, RawString};
use crate::stats::{add, bump, STATS};
use crate::wait::{self, Blocked};
use crate::{config, log, notify, store};

/// Changes noted by keyspace events before the inbox is processed. A storm of events (a script
/// deleting a million keys while someone waits) collapses into one look at every waited key.
const INBOX_LIMIT: usize = 1_024;

thread_local! {
    static SCHEDULER: RefCell<Scheduler<Blocked>> = RefCell::new(Scheduler::default());
    /// The armed module timer: (id, when it fires).
    static TIMER: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
    static INBOX: RefCell<Vec<Change>> = const { RefCell::new(Vec::new()) };
    static INBOX_ARMED: Cell<bool> = const { Cell::new(false) };
    /// Mirrors the number of queued waiters, readable without borrowing the scheduler.
    static WAITING: Cell<usize> = const { Cell::new(0) };
    /// Last time a "lease expired with waiters" warning was logged.
    static LAST_EXPIRY_WARNING: Cell<u64> = const { Cell::new(0) };
}

/// Runs `f` on the scheduler, then arms the timer for its next deadline.
fn with_scheduler<R>(
    ctx: Ctx,
    f: impl FnOnce(&mut Scheduler<Blocked>, RedisPort) -> R,
) -> Option<R> {
    SCHEDULER.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scheduler) => {
            let out = f(&mut scheduler, RedisPort { ctx });
            WAITING.with(|w| w.set(scheduler.waiting()));
            arm(ctx, scheduler.next_deadline());
            Some(out)
        }
        Err(_) => {
            log::warning("lock state re-entered; change deferred");
            None
        }
    })
}

fn read_scheduler<R>(f: impl FnOnce(&Scheduler<Blocked>) -> R) -> Option<R> {
    SCHEDULER.with(|cell| cell.try_borrow().ok().map(|s| f(&s)))
}

/// Whether any client waits on any lock (cheap; used to skip all queue work on the hot path).
pub fn anyone_waiting() -> bool {
    WAITING.with(Cell::get) > 0
}

pub fn waiters_on(key: &LockKey) -> usize {
    if !anyone_waiting() {
        return 0;
    }
    read_scheduler(|s| s.waiters_on(key)).unwrap_or(0)
}

/// (waiters, locks with waiters), for INFO.
pub fn waiting_gauges() -> (usize, usize) {
    read_scheduler(Scheduler::gauges).unwrap_or((0, 0))
}

/// Queues the current client on `key` and blocks it.
pub fn enqueue(
    ctx: Ctx,
    key: LockKey,
    owner: &[u8],
    lease_ms: u64,
    wait: Wait,
    seen: Seen,
) -> Result<(), LockError> {
    let now = now_ms();
    with_scheduler(ctx, |scheduler, mut port| {
        let max = config::max_waiters_per_key();
        scheduler.has_room(&key, owner, max)?;
        let handle = wait::block(ctx).ok_or(LockError::Internal)?;
        let new = NewWait {
            handle,
            key: &key,
            owner,
            lease_ms,
            wait,
            seen,
        };
        match scheduler.enqueue(&mut port, new, max, now) {
            Ok(_) => bump(&STATS.waits_started),
            Err(e) => wait::unblock(handle, Answer::Refused(e.reply())),
        }
        Ok(())
    })
    .unwrap_or(Err(LockError::Internal))
}

/// A lock became free inside a command (release, force-release): hand it to the head waiter, or
/// publish the unlock message when nobody waits.
pub fn lock_freed(ctx: Ctx, key_name: RawString, name: &[u8]) {
    if anyone_waiting() {
        let key = LockKey::new(ffi::selected_db(ctx), name);
        let handed =
            with_scheduler(ctx, |s, mut port| s.freed(&mut port, &key, now_ms())).unwrap_or(false);
        if handed {
            return;
        }
    }
    notify::publish_unlock(ctx, key_name, name);
}

/// The holder's lease end changed inside a command (renew, re-entry): when clients wait, their
/// lease check moves with it — a shorter lease must hand off at its own end, not the old one.
pub fn lease_changed(ctx: Ctx, name: &[u8], expires_at: u64) {
    if !anyone_waiting() {
        return;
    }
    let key = LockKey::new(ffi::selected_db(ctx), name);
    with_scheduler(ctx, |s, _| s.lease_changed(&key, expires_at, now_ms()));
}

/// A waiter left on its own (disconnect, CLIENT UNBLOCK). Returns true if it was still queued,
/// in which case the caller releases its handle. Its deadlines go with it, and the timer is
/// re-armed (or stopped) so that an idle module holds no timer (MODULE UNLOAD refuses then).
pub fn waiter_left(ctx: Ctx, handle: Blocked) -> bool {
    with_scheduler(ctx, |s, mut port| s.waiter_left(&mut port, handle)).unwrap_or(false)
}

/// A grant's reply could not be delivered (the client vanished first). Scheduled, not done
/// here: Redis forbids writes from inside the free callback.
pub fn grant_undelivered(ctx: Ctx, key: LockKey, owner: Box<[u8]>, token: u64) {
    with_scheduler(ctx, |s, _| s.grant_undelivered(key, owner, token, now_ms()));
}

pub fn on_timer(ctx: Ctx) {
    TIMER.with(|t| t.set(None));
    with_scheduler(ctx, |s, mut port| s.timer_fired(&mut port, now_ms()));
}

/// Arms the single module timer for the scheduler's earliest deadline (or stops it when none is
/// left, so that MODULE UNLOAD is not held up by an idle timer).
fn arm(ctx: Ctx, next: Option<u64>) {
    let armed = TIMER.with(Cell::get);
    match (armed, next) {
        (Some((_, at)), Some(next)) if at <= next => {}
        (armed, next) => {
            if let Some((id, _)) = armed {
                wait::stop_timer(ctx, id);
                TIMER.with(|t| t.set(None));
            }
            if let Some(next) = next {
                let now = now_ms();
                let id = wait::arm_timer(ctx, next.saturating_sub(now));
                TIMER.with(|t| t.set(Some((id, next.max(now)))));
            }
        }
    }
}

/// Called from keyspace/server events: note the change, process it from a 0 ms timer. The
/// inbox is bounded (the event callback notes only keys somebody waits on, see
/// `may_concern_waiters`).
pub fn notice(ctx: Ctx, change: Change) {
    if !anyone_waiting() {
        return;
    }
    INBOX.with(|inbox| {
        let mut inbox = inbox.borrow_mut();
        if matches!(inbox.first(), Some(Change::All)) {
            return;
        }
        if inbox.len() >= INBOX_LIMIT || matches!(change, Change::All) {
            inbox.clear();
            inbox.push(Change::All);
        } else {
            inbox.push(change);
        }
    });
    if !INBOX_ARMED.with(Cell::get) {
        INBOX_ARMED.with(|a| a.set(true));
        wait::arm_inbox_timer(ctx);
    }
}

/// Whether a keyspace event about `name` may concern a waiter (cheap; for the event callback,
/// so that it builds and notes nothing for the other keys of the server). Inside the module's
/// own work (a lazy expiry during a handoff) the scheduler is borrowed: the change is noted
/// then, it most likely concerns the key being handed off.
pub fn may_concern_waiters(name: &[u8]) -> bool {
    anyone_waiting() && read_scheduler(|s| s.is_waited_name(name)).unwrap_or(true)
}

pub fn on_inbox(ctx: Ctx) {
    INBOX_ARMED.with(|a| a.set(false));
    let changes = INBOX.with(|inbox| std::mem::take(&mut *inbox.borrow_mut()));
    with_scheduler(ctx, |s, mut port| {
        s.keys_changed(&mut port, changes, now_ms())
    });
}

/// Whether the module can be unloaded: no waiters and nothing scheduled.
pub fn idle() -> bool {
    read_scheduler(Scheduler::is_idle).unwrap_or(false)
        && TIMER.with(Cell::get).is_none()
        && !INBOX_ARMED.with(Cell::get)
}

/// Clears all state (module load; a reloaded library keeps its statics).
pub fn reset() {
    SCHEDULER.with(|cell| {
        if let Ok(mut s) = cell.try_borrow_mut() {
            *s = Scheduler::default();
        }
    });
    TIMER.with(|t| t.set(None));
    WAITING.with(|w| w.set(0));
    INBOX.with(|inbox| inbox.borrow_mut().clear());
    INBOX_ARMED.with(|a| a.set(false));
}

/// The scheduler's effects, carried out on the server through the context of the command,
/// timer or callback that called it.
struct RedisPort {
    ctx: Ctx,
}

impl Port<Blocked> for RedisPort {
    fn writes(&self) -> Writes {
        if ffi::is_replica(self.ctx) {
            Writes::Replica
        } else if ffi::writes_paused() {
            Writes::Paused
        } else {
            Writes::Allowed
        }
    }

    fn grant_if_free(&mut self, key: &LockKey, owner: &[u8], handoff: Handoff) -> Attempt {
        let ctx = self.ctx;
        with_db(ctx, key.db, || {
            let name = OwnedString::new(&key.name);
            let lock = Key::open(ctx, name.as_ptr());
            if lock.kind() != KeyKind::Missing {
                return Attempt::Held {
                    expires_at: lock.expires_at(),
                };
            }
            if handoff.check_route {
                if let Some(redirect) = slot_left(ctx, key) {
                    return Attempt::Moved(redirect);
                }
            }
            let token = match store::next_token(ctx, &key.name, handoff.now) {
                Ok(token) => token,
                Err(e) => return Attempt::Refused(e),
            };
            let owner = OwnedString::new(owner);
            let written = store::write_hold(
                ctx,
                store::Hold {
                    key_name: name.as_ptr(),
                    owner: owner.as_ptr(),
                    count: 1,
                    new_token: Some(token),
                    expires_at: handoff.expires_at,
                    key: &lock,
                },
            );
            drop(lock);
            if let Err(e) = written {
                return Attempt::Refused(e);
            }
            // Where the server reports every expiry (Redis >= 7.2, Valkey) `lock.expired` was
            // announced then, whether anyone waited or not.
            if handoff.cause == Cause::LeaseEnded && !crate::events::counts_expiries() {
                notify::event(ctx, c"lock.expired", name.as_ptr());
            }
            notify::event(ctx, c"lock.handoff", name.as_ptr());
            Attempt::Granted { token }
        })
    }

    fn release_undelivered(&mut self, key: &LockKey, owner: &[u8], token: u64) -> bool {
        let ctx = self.ctx;
        with_db(ctx, key.db, || {
            let name = OwnedString::new(&key.name);
            let owner = OwnedString::new(owner);
            let lock = Key::open(ctx, name.as_ptr());
            match store::view_of(&lock, owner.as_ptr()) {
                Ok(View::HeldByRequester {
                    count: 1,
                    token: Some(t),
                }) if t == token => {
                    store::delete(ctx, &lock, name.as_ptr());
                    true
                }
                _ => false,
            }
        })
    }

    fn publish_unlock(&mut self, key: &LockKey) {
        let ctx = self.ctx;
        with_db(ctx, key.db, || {
            let name = OwnedString::new(&key.name);
            notify::publish_unlock(ctx, name.as_ptr(), &key.name);
        });
    }

    fn answer(&mut self, handle: Blocked, answer: Answer) {
        wait::unblock(handle, answer);
    }

    fn note(&mut self, note: Note) {
        match note {
            Note::HandedOff { waited_ms, .. } => {
                bump(&STATS.handoffs);
                add(&STATS.wait_time_ms, waited_ms);
            }
            Note::ExpiredWithWaiters { key } => {
                bump(&STATS.expired_with_waiters);
                warn_lease_lost(&key);
            }
            Note::TimedOut => bump(&STATS.wait_timeouts),
            Note::Cancelled => bump(&STATS.wait_cancelled),
            Note::Redirected => bump(&STATS.wait_redirected),
            Note::Refused => bump(&STATS.errors),
            Note::AbandonedGrant => bump(&STATS.abandoned_grants),
            Note::Replaced => bump(&STATS.wait_replaced),
        }
    }
}

/// In a cluster, a lock key that vanished may have moved to another node with its slot
/// (MIGRATE deletes it here). Granting it here would make a second lock beside the moved one,
/// so the waiters get the redirect Redis would give for the key (`ASK`/`MOVED`) and their
/// cluster clients follow it.
fn slot_left(ctx: Ctx, key: &LockKey) -> Option<String> {
    if !ffi::is_cluster(ctx) {
        return None;
    }
    let slot = lock_core::slot::key_slot(&key.name);
    let nodes = ffi::cluster_nodes(ctx)?;
    lock_core::cluster::route(&nodes, slot).redirect(slot)
}

/// A holder lost its lock to its lease while others waited: the event operators most need.
/// Logged at most once per 10 s.
fn warn_lease_lost(key: &LockKey) {
    let now = now_ms();
    if now.saturating_sub(LAST_EXPIRY_WARNING.with(Cell::get)) >= 10_000 {
        LAST_EXPIRY_WARNING.with(|w| w.set(now));
        log::warning(&format!(
            "a held lease on '{}' ran out with waiters queued; the lock was handed to the next waiter (further warnings suppressed for 10 s)",
            String::from_utf8_lossy(&key.name)
        ));
    }
}
