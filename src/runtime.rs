//! The module's in-memory state (wait queues and deadlines) and the handoff logic.
//!
//! Everything runs on Redis's main thread. The state is a thread-local `RefCell`; a borrow is
//! never held across a Redis call that could call back into the module, except keyspace events
//! (raised by lazy expiry inside `OpenKey`), which only touch the separate `INBOX`.

use std::cell::{Cell, RefCell};

use lock_core::args::Wait;
use lock_core::deadlines::{DeadlineKey, Deadlines};
use lock_core::queue::{LockKey, NewWaiter, Removed, WaitQueues, WaiterId};
use lock_core::state::View;
use lock_core::LockError;

use crate::ffi::{self, now_ms, with_db, Ctx, Key, KeyKind, OwnedString, RawString};
use crate::stats::{add, bump, STATS};
use crate::wait::{self, Blocked, Outcome};
use crate::{config, log, notify, store};

/// What a deadline stands for.
enum Due {
    /// A waiter's `WAIT` timeout.
    Timeout(WaiterId),
    /// The lease end of a lock with waiters: if the lease ran out, hand off.
    LeaseCheck(LockKey),
    /// Look at a key again (it changed outside the module, or a grant was not delivered).
    Recheck(LockKey),
    /// A granted waiter vanished before its reply: free its hold if it still has it.
    Undelivered {
        key: LockKey,
        owner: Box<[u8]>,
        token: u64,
    },
    /// Writes were paused: look whether the pause ended, and if so do the deferred handoffs.
    PauseCheck,
}

/// How often the module looks again while Redis pauses writes: no event says when a pause
/// ends, so deferred handoffs happen within this many ms of its end.
const PAUSE_POLL_MS: u64 = 5;

/// Changes noted by keyspace events before the inbox is processed. A storm of events (a script
/// deleting a million keys while someone waits) collapses into one look at every waited key.
const INBOX_LIMIT: usize = 1_024;

/// Who asks for a handoff: a LOCK.* command on this node (which Redis routed here, so the slot
/// is served here), or a timer or event (the key may have left with its slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    Command,
    Background,
}

/// Why the module looks at a lock to hand it over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Released or removed by a client (LOCK.RELEASE, DEL, FLUSHALL, ...).
    Freed,
    /// The holder's lease ran out: the holder lost the lock.
    LeaseEnded,
}

/// Changes noticed by keyspace/server events, processed from a 0 ms timer.
pub enum Inbox {
    Key(LockKey, Cause),
    Db(i32),
    All,
}

#[derive(Default)]
struct Runtime {
    queues: WaitQueues<Blocked>,
    deadlines: Deadlines<Due>,
    /// The armed module timer: (id, when it fires).
    timer: Option<(u64, u64)>,
    /// Last time a "lease expired with waiters" warning was logged.
    last_expiry_warning: u64,
    /// Handoffs deferred while Redis paused writes, with their cause; done when it resumes.
    paused: std::collections::HashMap<LockKey, Cause>,
    /// The scheduled `PauseCheck`, while any handoff is deferred.
    pause_check: Option<DeadlineKey>,
}

thread_local! {
    static RUNTIME: RefCell<Runtime> = RefCell::new(Runtime::default());
    static INBOX: RefCell<Vec<Inbox>> = const { RefCell::new(Vec::new()) };
    static INBOX_ARMED: Cell<bool> = const { Cell::new(false) };
    /// Mirrors the number of queued waiters, readable without borrowing RUNTIME.
    static WAITING: Cell<usize> = const { Cell::new(0) };
}

fn with_runtime<R>(f: impl FnOnce(&mut Runtime) -> R) -> Option<R> {
    RUNTIME.with(|cell| match cell.try_borrow_mut() {
        Ok(mut rt) => {
            let out = f(&mut rt);
            WAITING.with(|w| w.set(rt.queues.total()));
            Some(out)
        }
        Err(_) => {
            log::warning("lock state re-entered; change deferred");
            None
        }
    })
}

/// Whether any client waits on any lock (cheap; used to skip all queue work on the hot path).
pub fn anyone_waiting() -> bool {
    WAITING.with(Cell::get) > 0
}

pub fn waiters_on(key: &LockKey) -> usize {
    if !anyone_waiting() {
        return 0;
    }
    with_runtime(|rt| rt.queues.len(key)).unwrap_or(0)
}

/// (waiters, locks with waiters), for INFO.
pub fn waiting_gauges() -> (usize, usize) {
    with_runtime(|rt| (rt.queues.total(), rt.queues.keys().count())).unwrap_or((0, 0))
}

/// Queues the current client on `key` and blocks it.
pub fn enqueue(
    ctx: Ctx,
    key: LockKey,
    owner: &[u8],
    lease_ms: u64,
    wait: Wait,
    lock_expires_at: Option<u64>,
    lock_is_free: bool,
) -> Result<(), LockError> {
    let now = now_ms();
    with_runtime(|rt| {
        let max = config::max_waiters_per_key();
        if rt.queues.len(&key) as u64 >= max {
            return Err(LockError::TooManyWaiters { max });
        }
        let handle = wait::block(ctx).ok_or(LockError::Internal)?;
        let new = NewWaiter {
            handle,
            key: &key,
            owner,
            lease_ms,
            now,
        };
        let id = match rt.queues.push(new, max) {
            Ok(id) => id,
            Err(e) => {
                wait::unblock(handle, Outcome::Refused(e.reply()));
                return Ok(());
            }
        };
        if let Wait::For(ms) = wait {
            let deadline = rt
                .deadlines
                .insert(now.saturating_add(ms), Due::Timeout(id));
            if let Some(w) = rt.queues.get_mut(id) {
                w.timeout = Some(deadline);
            }
        }
        if lock_is_free {
            // Waiters are queued on a free lock only between an outside change and its recheck;
            // make sure that recheck happens.
            rt.deadlines.insert(now, Due::Recheck(key.clone()));
        } else if rt.queues.lease_check(&key).is_none() {
            schedule_lease_check(rt, &key, lock_expires_at, now);
        }
        bump(&STATS.waits_started);
        arm(ctx, rt, now);
        Ok(())
    })
    .unwrap_or(Err(LockError::Internal))
}

/// A lock became free inside a command (release, force-release): hand it to the head waiter, or
/// publish the unlock message when nobody waits.
pub fn lock_freed(ctx: Ctx, key_name: RawString, name: &[u8]) {
    if anyone_waiting() {
        let key = LockKey::new(ffi::selected_db(ctx), name);
        let handed = with_runtime(|rt| {
            let now = now_ms();
            let handed = pump(ctx, rt, &key, now, Cause::Freed, Origin::Command);
            arm(ctx, rt, now);
            handed
        })
        .unwrap_or(false);
        if handed {
            return;
        }
    }
    notify::publish_unlock(ctx, key_name, name);
}

/// Gives the lock at `key` to the head waiter if it is free. Returns whether it did.
fn pump(ctx: Ctx, rt: &mut Runtime, key: &LockKey, now: u64, cause: Cause, origin: Origin) -> bool {
    // A replica never writes on its own; its master's effects arrive through replication. (When
    // a master becomes a replica, Redis unblocks every waiter with an error.)
    if !rt.queues.has_waiters(key) || ffi::is_replica(ctx) {
        return false;
    }
    // While writes are paused nothing may be written (nor even looked up for writing: an
    // expired key is still there). Hand off once the pause ends.
    if ffi::writes_paused() {
        defer_while_paused(rt, key, cause, now);
        return false;
    }
    with_db(ctx, key.db, || {
        let name = OwnedString::new(&key.name);
        let lock = Key::open(ctx, name.as_ptr());
        if lock.kind() != KeyKind::Missing {
            let expires_at = lock.expires_at();
            drop(lock);
            schedule_lease_check(rt, key, expires_at, now);
            return false;
        }
        if origin == Origin::Background && redirect_if_slot_left(ctx, rt, key) {
            return false;
        }
        // The token comes first: if the slot's tokens are exhausted, nobody can be granted the
        // key, and every waiter is told so rather than left waiting.
        let token = match store::next_token(ctx, &key.name, now) {
            Ok(token) => token,
            Err(e) => {
                drop(lock);
                refuse_all(rt, key, &e);
                return false;
            }
        };
        let Some(removed) = rt.queues.pop_front(key) else {
            return false;
        };
        let waiter = forget(rt, removed);
        if cause == Cause::LeaseEnded {
            lease_ended_with_waiters(ctx, rt, key, name.as_ptr(), now);
        }
        let owner = OwnedString::new(&waiter.owner);
        let expires_at = now.saturating_add(waiter.lease_ms);
        let written = store::write_hold(
            ctx,
            store::Hold {
                key_name: name.as_ptr(),
                owner: owner.as_ptr(),
                count: 1,
                new_token: Some(token),
                expires_at,
                key: &lock,
            },
        );
        drop(lock);
        if let Err(e) = written {
            wait::unblock(waiter.handle, Outcome::Refused(e.reply()));
            return false;
        }
        notify::event(ctx, c"lock.handoff", name.as_ptr());
        bump(&STATS.handoffs);
        add(&STATS.wait_time_ms, now.saturating_sub(waiter.enqueued_at));
        wait::unblock(
            waiter.handle,
            Outcome::Granted {
                token,
                key: key.clone(),
                owner: waiter.owner,
            },
        );
        schedule_lease_check(rt, key, Some(expires_at), now);
        true
    })
}

/// Notes a handoff to do once Redis stops pausing writes, and makes sure someone looks.
fn defer_while_paused(rt: &mut Runtime, key: &LockKey, cause: Cause, now: u64) {
    let noted = rt.paused.entry(key.clone()).or_insert(cause);
    if cause == Cause::LeaseEnded {
        *noted = cause;
    }
    if rt.pause_check.is_none() {
        rt.pause_check = Some(
            rt.deadlines
                .insert(now.saturating_add(PAUSE_POLL_MS), Due::PauseCheck),
        );
    }
}

/// Answers every waiter of `key` with `error` (nobody can be granted it).
fn refuse_all(rt: &mut Runtime, key: &LockKey, error: &LockError) {
    while let Some(removed) = rt.queues.pop_front(key) {
        let waiter = forget(rt, removed);
        wait::unblock(waiter.handle, Outcome::Refused(error.reply()));
    }
}

/// In a cluster, a lock key that vanished may have moved to another node with its slot
/// (MIGRATE deletes it here). Granting it here would make a second lock beside the moved one,
/// so the waiters get the redirect Redis would give for the key (`ASK`/`MOVED`) and their
/// cluster clients follow it. Returns whether the waiters were redirected.
fn redirect_if_slot_left(ctx: Ctx, rt: &mut Runtime, key: &LockKey) -> bool {
    if !ffi::is_cluster(ctx) {
        return false;
    }
    let slot = lock_core::slot::key_slot(&key.name);
    let route = ffi::cluster_nodes(ctx).map(|nodes| lock_core::cluster::route(&nodes, slot));
    let Some(redirect) = route.and_then(|r| r.redirect(slot)) else {
        return false;
    };
    while let Some(removed) = rt.queues.pop_front(key) {
        let waiter = forget(rt, removed);
        bump(&STATS.wait_redirected);
        wait::unblock(waiter.handle, Outcome::Refused(redirect.clone()));
    }
    true
}

/// Cancels what a removed waiter had scheduled and returns it.
fn forget(rt: &mut Runtime, removed: Removed<Blocked>) -> lock_core::queue::Waiter<Blocked> {
    if let Some(timeout) = removed.waiter.timeout {
        rt.deadlines.remove(timeout);
    }
    if let Some(check) = removed.orphaned_lease_check {
        rt.deadlines.remove(check);
    }
    removed.waiter
}

/// Keeps one lease check per key with waiters, at the holder's lease end.
fn schedule_lease_check(rt: &mut Runtime, key: &LockKey, expires_at: Option<u64>, now: u64) {
    if !rt.queues.has_waiters(key) {
        return;
    }
    let check = expires_at.map(|at| {
        // Redis expires a key once `now > at`; if that moment passed but the key is still
        // there (clients paused, say), look again shortly rather than spin.
        let when = if at < now { now + 10 } else { at + 1 };
        rt.deadlines.insert(when, Due::LeaseCheck(key.clone()))
    });
    if let Some(old) = rt.queues.set_lease_check(key, check) {
        rt.deadlines.remove(old);
    }
}

/// Looks at a key with waiters: hand off if it is free, else watch its lease end.
fn recheck(ctx: Ctx, rt: &mut Runtime, key: &LockKey, now: u64, cause: Cause) {
    if rt.queues.has_waiters(key) {
        pump(ctx, rt, key, now, cause, Origin::Background);
    }
}

/// A holder lost its lock to its lease while others waited: the event operators most need.
fn lease_ended_with_waiters(
    ctx: Ctx,
    rt: &mut Runtime,
    key: &LockKey,
    key_name: RawString,
    now: u64,
) {
    bump(&STATS.expired_with_waiters);
    notify::event(ctx, c"lock.expired", key_name);
    if now.saturating_sub(rt.last_expiry_warning) >= 10_000 {
        rt.last_expiry_warning = now;
        log::warning(&format!(
            "a held lease on '{}' ran out with waiters queued; the lock was handed to the next waiter (further warnings suppressed for 10 s)",
            String::from_utf8_lossy(&key.name)
        ));
    }
}

/// The holder's lease end changed inside a command (renew, re-entry): when clients wait, their
/// lease check moves with it — a shorter lease must hand off at its own end, not the old one.
pub fn lease_changed(ctx: Ctx, name: &[u8], expires_at: u64) {
    if !anyone_waiting() {
        return;
    }
    let key = LockKey::new(ffi::selected_db(ctx), name);
    with_runtime(|rt| {
        if rt.queues.has_waiters(&key) {
            let now = now_ms();
            schedule_lease_check(rt, &key, Some(expires_at), now);
            arm(ctx, rt, now);
        }
    });
}

/// A waiter left on its own (disconnect, CLIENT UNBLOCK). Returns true if it was still queued,
/// in which case the caller releases its handle.
pub fn waiter_left(ctx: Ctx, handle: Blocked) -> bool {
    with_runtime(|rt| match rt.queues.remove_by_handle(handle) {
        Some(removed) => {
            forget(rt, removed);
            bump(&STATS.wait_cancelled);
            // Its deadlines are gone: re-arm (or stop) the timer so that an idle module holds
            // no timer (MODULE UNLOAD refuses while one is pending).
            arm(ctx, rt, now_ms());
            true
        }
        None => false,
    })
    .unwrap_or(false)
}

/// A grant's reply could not be delivered (the client vanished first). Scheduled, not done
/// here: Redis forbids writes from inside the free callback.
pub fn grant_undelivered(ctx: Ctx, key: LockKey, owner: Box<[u8]>, token: u64) {
    with_runtime(|rt| {
        let now = now_ms();
        rt.deadlines
            .insert(now, Due::Undelivered { key, owner, token });
        arm(ctx, rt, now);
    });
}

pub fn on_timer(ctx: Ctx) {
    with_runtime(|rt| {
        rt.timer = None;
        let now = now_ms();
        while let Some((fired, due)) = rt.deadlines.pop_due(now) {
            handle_due(ctx, rt, fired, due, now);
        }
        arm(ctx, rt, now);
    });
}

fn handle_due(ctx: Ctx, rt: &mut Runtime, fired: DeadlineKey, due: Due, now: u64) {
    match due {
        Due::Timeout(id) => {
            if let Some(removed) = rt.queues.remove(id) {
                let waiter = forget(rt, removed);
                bump(&STATS.wait_timeouts);
                wait::unblock(waiter.handle, Outcome::TimedOut);
            }
        }
        Due::LeaseCheck(key) => {
            // This check fired: it is no longer the key's scheduled one.
            if rt.queues.lease_check(&key) == Some(fired) {
                rt.queues.set_lease_check(&key, None);
            }
            pump(ctx, rt, &key, now, Cause::LeaseEnded, Origin::Background);
        }
        Due::Recheck(key) => recheck(ctx, rt, &key, now, Cause::Freed),
        Due::PauseCheck => {
            rt.pause_check = None;
            if ffi::writes_paused() {
                rt.pause_check = Some(
                    rt.deadlines
                        .insert(now.saturating_add(PAUSE_POLL_MS), Due::PauseCheck),
                );
                return;
            }
            for (key, cause) in std::mem::take(&mut rt.paused) {
                pump(ctx, rt, &key, now, cause, Origin::Background);
            }
        }
        Due::Undelivered { key, owner, token } => {
            if ffi::is_replica(ctx) {
                bump(&STATS.abandoned_grants);
                return;
            }
            if ffi::writes_paused() {
                // Freeing it is a write: try again after the pause.
                rt.deadlines.insert(
                    now.saturating_add(PAUSE_POLL_MS),
                    Due::Undelivered { key, owner, token },
                );
                return;
            }
            bump(&STATS.abandoned_grants);
            let freed = with_db(ctx, key.db, || {
                let name = OwnedString::new(&key.name);
                let owner_name = OwnedString::new(&owner);
                let lock = Key::open(ctx, name.as_ptr());
                match store::view_of(&lock, owner_name.as_ptr()) {
                    Ok(View::HeldByRequester {
                        count: 1,
                        token: Some(t),
                    }) if t == token => {
                        store::delete(ctx, &lock, name.as_ptr());
                        true
                    }
                    _ => false,
                }
            });
            if freed && !pump(ctx, rt, &key, now, Cause::Freed, Origin::Background) {
                with_db(ctx, key.db, || {
                    let name = OwnedString::new(&key.name);
                    notify::publish_unlock(ctx, name.as_ptr(), &key.name);
                });
            }
        }
    }
}

/// Arms the single module timer for the earliest deadline (or stops it when none is left, so
/// that MODULE UNLOAD is not held up by an idle timer).
fn arm(ctx: Ctx, rt: &mut Runtime, now: u64) {
    let next = rt.deadlines.next_at();
    match (rt.timer, next) {
        (Some((_, at)), Some(next)) if at <= next => {}
        (armed, next) => {
            if let Some((id, _)) = armed {
                wait::stop_timer(ctx, id);
                rt.timer = None;
            }
            if let Some(next) = next {
                let id = wait::arm_timer(ctx, next.saturating_sub(now));
                rt.timer = Some((id, next.max(now)));
            }
        }
    }
}

/// Called from keyspace/server events: note the change, process it from a 0 ms timer. The
/// inbox is bounded (the event callback notes only keys somebody waits on, see
/// `may_concern_waiters`).
pub fn notice(ctx: Ctx, change: Inbox) {
    if !anyone_waiting() {
        return;
    }
    INBOX.with(|inbox| {
        let mut inbox = inbox.borrow_mut();
        if matches!(inbox.first(), Some(Inbox::All)) {
            return;
        }
        if inbox.len() >= INBOX_LIMIT || matches!(change, Inbox::All) {
            inbox.clear();
            inbox.push(Inbox::All);
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
/// own work (a lazy expiry during a handoff) the queues are borrowed: the change is noted then,
/// it most likely concerns the key being handed off.
pub fn may_concern_waiters(name: &[u8]) -> bool {
    anyone_waiting()
        && RUNTIME.with(|cell| match cell.try_borrow() {
            Ok(rt) => rt.queues.is_waited_name(name),
            Err(_) => true,
        })
}

pub fn on_inbox(ctx: Ctx) {
    INBOX_ARMED.with(|a| a.set(false));
    let changes = INBOX.with(|inbox| std::mem::take(&mut *inbox.borrow_mut()));
    with_runtime(|rt| {
        let now = now_ms();
        let mut keys: Vec<(LockKey, Cause)> = Vec::new();
        for change in changes {
            match change {
                Inbox::Key(key, cause) => keys.push((key, cause)),
                Inbox::Db(db) => keys.extend(
                    rt.queues
                        .keys()
                        .filter(|k| k.db == db)
                        .map(|k| (k.clone(), Cause::Freed)),
                ),
                Inbox::All => keys.extend(rt.queues.keys().map(|k| (k.clone(), Cause::Freed))),
            }
        }
        // Once per key; the first cause noted for it wins.
        let mut seen = std::collections::HashSet::new();
        for (key, cause) in keys {
            if seen.insert(key.clone()) {
                recheck(ctx, rt, &key, now, cause);
            }
        }
        arm(ctx, rt, now);
    });
}

/// Whether the module can be unloaded: no waiters and nothing scheduled.
pub fn idle() -> bool {
    with_runtime(|rt| rt.queues.total() == 0 && rt.deadlines.is_empty() && rt.timer.is_none())
        .unwrap_or(false)
        && !INBOX_ARMED.with(Cell::get)
}

/// Clears all state (module load; a reloaded library keeps its statics).
pub fn reset() {
    with_runtime(|rt| *rt = Runtime::default());
    INBOX.with(|inbox| inbox.borrow_mut().clear());
    INBOX_ARMED.with(|a| a.set(false));
}
