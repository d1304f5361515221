//! The module's side of waiting: the scheduler's state (the rules live in
//! `lock_core::scheduler`), the one module timer that serves every deadline, the inbox of
//! changes noticed by keyspace events, and [`RedisPort`], which carries the scheduler's effects
//! out on the server.
//!
//! Everything runs on Redis's main thread. The scheduler is a thread-local `RefCell`; a borrow
//! is never held across a Redis call that could call back into the module, except keyspace
//! events (raised by lazy expiry inside `OpenKey`), which only touch the separate `INBOX`.

use std::cell::{Cell, RefCell};

use lock_core::args::{Reentry, Wait};
use lock_core::binding::{ClientId, GrantRef};
use lock_core::hold::{self, Decision, HoldKind, Mode};
use lock_core::queue::LockKey;
use lock_core::scheduler::{
    Answer, Attempt, Cause, Change, Ended, Ending, Handoff, NewWait, Note, Port, Scheduler, Seen,
    Want, Writes,
};
use lock_core::state::{Queue, View};
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
    /// Connections that closed since the inbox was last processed, while holds were bound.
    static GONE: RefCell<Vec<ClientId>> = const { RefCell::new(Vec::new()) };
    /// Mirrors the number of holds bound to connections (EPHEMERAL), readable without a borrow.
    static BOUND: Cell<usize> = const { Cell::new(0) };
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
            BOUND.with(|b| b.set(scheduler.bound_holds()));
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
/// (waiters, locks with waiters, holds bound to connections), for INFO.
pub fn waiting_gauges() -> (usize, usize, usize) {
    let (waiters, keys) = read_scheduler(Scheduler::gauges).unwrap_or((0, 0));
    (waiters, keys, bound_holds())
}

/// What a blocked acquire asks for.
pub struct Request<'a> {
    pub owner: &'a [u8],
    pub lease_ms: u64,
    pub wait: Wait,
    pub mode: Mode,
    /// `EPHEMERAL`: the connection its grant is bound to.
    pub bind: Option<ClientId>,
}

/// Queues the current client on `key` and blocks it.
pub fn enqueue(ctx: Ctx, key: LockKey, request: Request<'_>, seen: Seen) -> Result<(), LockError> {
    let Request {
        owner,
        lease_ms,
        wait,
        mode,
        bind,
    } = request;
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
            mode,
            bind,
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

/// What a command left of a lock it freed a hold of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Left {
    /// The key is gone (the last hold ended).
    Nothing,
    /// Other holds remain (a shared key, a semaphore).
    OtherHolds,
}

/// A hold ended inside a command (release, force-release, a lease end it noticed): hand the room
/// to the head waiter(s), or publish the unlock message when the key is free and nobody took it.
pub fn lock_freed(ctx: Ctx, key_name: RawString, name: &[u8], left: Left) {
    if anyone_waiting() {
        let key = LockKey::new(ffi::selected_db(ctx), name);
        let handed =
            with_scheduler(ctx, |s, mut port| s.freed(&mut port, &key, now_ms())).unwrap_or(false);
        if handed {
            return;
        }
    }
    if left == Left::Nothing {
        notify::publish_unlock(ctx, key_name, name);
    }
}

/// A lease end changed inside a command (renew, re-entry, a new hold): when clients wait, their
/// lease check moves to the key's earliest lease end — a shorter lease must hand off at its own
/// end, not the old one.
pub fn lease_changed(ctx: Ctx, name: &[u8], next_lease_end: Option<u64>) {
    if !anyone_waiting() {
        return;
    }
    let key = LockKey::new(ffi::selected_db(ctx), name);
    with_scheduler(ctx, |s, _| s.lease_changed(&key, next_lease_end, now_ms()));
}

/// Whether any hold is bound to a connection (cheap; skips all binding work otherwise).
pub fn any_bound() -> bool {
    BOUND.with(Cell::get) > 0
}

/// Binds a hold a command just granted to the calling connection (`EPHEMERAL`).
pub fn bind(ctx: Ctx, name: &[u8], kind: HoldKind, token: u64) {
    let key = LockKey::new(ffi::selected_db(ctx), name);
    let client = ffi::client_id(ctx);
    with_scheduler(ctx, |s, _| {
        s.bind(client, &key, kind, token, |bound| hold_exists(ctx, bound));
    });
}

/// The hold (named by its token) ended by its owner's command: forget its binding.
pub fn unbind(ctx: Ctx, name: &[u8], token: u64) {
    if !any_bound() {
        return;
    }
    let key = LockKey::new(ffi::selected_db(ctx), name);
    with_scheduler(ctx, |s, _| s.unbind(&key, token));
}

/// The connection a hold is bound to, if any.
pub fn bound_client(ctx: Ctx, name: &[u8], token: u64) -> Option<ClientId> {
    if !any_bound() {
        return None;
    }
    let key = LockKey::new(ffi::selected_db(ctx), name);
    read_scheduler(|s| s.bound_client(&key, token)).flatten()
}

/// The server became a replica: every binding is forgotten.
pub fn forget_bindings(ctx: Ctx) {
    with_scheduler(ctx, |s, _| s.forget_bindings());
}

/// Holds bound to connections now (INFO).
pub fn bound_holds() -> usize {
    BOUND.with(Cell::get)
}

/// A connection closed (server event). Its holds end from the inbox timer: the server may be
/// in the middle of anything when it frees a client.
pub fn connection_closed(ctx: Ctx, client: ClientId) {
    if !any_bound() {
        return;
    }
    GONE.with(|gone| gone.borrow_mut().push(client));
    if !INBOX_ARMED.with(Cell::get) {
        INBOX_ARMED.with(|a| a.set(true));
        wait::arm_inbox_timer(ctx);
    }
}

/// Whether a bound hold still exists (pruning a connection's list of bound holds).
fn hold_exists(ctx: Ctx, grant: &GrantRef) -> bool {
    with_db(ctx, grant.key.db, || {
        let name = OwnedString::new(&grant.key.name);
        let key = Key::open_read(ctx, name.as_ptr());
        matches!(store::read_lock(&key), Ok(Some(stored))
            if stored.lock.holds.iter().any(|h| h.kind == grant.kind && h.token == Some(grant.token)))
    })
}

/// A waiter left on its own (disconnect, CLIENT UNBLOCK). Returns true if it was still queued,
/// in which case the caller releases its handle. Its deadlines go with it, and the timer is
/// re-armed (or stopped) so that an idle module holds no timer (MODULE UNLOAD refuses then).
pub fn waiter_left(ctx: Ctx, handle: Blocked) -> bool {
    with_scheduler(ctx, |s, mut port| {
        s.waiter_left(&mut port, handle, now_ms())
    })
    .unwrap_or(false)
}

/// A grant's reply could not be delivered (the client vanished first). Scheduled, not done
/// here: Redis forbids writes from inside the free callback.
pub fn grant_undelivered(ctx: Ctx, grant: GrantRef) {
    with_scheduler(ctx, |s, _| s.grant_undelivered(grant, now_ms()));
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
    let gone = GONE.with(|gone| std::mem::take(&mut *gone.borrow_mut()));
    with_scheduler(ctx, |s, mut port| {
        let now = now_ms();
        for client in gone {
            s.client_gone(&mut port, client, now);
        }
        if !changes.is_empty() {
            s.keys_changed(&mut port, changes, now);
        }
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
    GONE.with(|gone| gone.borrow_mut().clear());
    BOUND.with(|b| b.set(0));
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

    fn try_grant(&mut self, key: &LockKey, want: Want<'_>, handoff: Handoff) -> Attempt {
        let ctx = self.ctx;
        with_db(ctx, key.db, || {
            let name = OwnedString::new(&key.name);
            let lock = Key::open(ctx, name.as_ptr());
            let missing = lock.kind() == KeyKind::Missing;
            if missing && handoff.check_route {
                if let Some(redirect) = slot_left(ctx, key) {
                    return Attempt::Moved(redirect);
                }
            }
            let exclusive = want.mode == Mode::Exclusive;
            let (attempt, ended) = if exclusive && missing {
                let attempt = grant_exclusive(ctx, &lock, name.as_ptr(), key, want.owner, handoff);
                (attempt, 0)
            } else if exclusive && held_exclusively_by_other(&lock, want.owner) {
                let held = Attempt::Held {
                    next_lease_end: lock.expires_at(),
                };
                (held, 0)
            } else {
                grant_general(ctx, &lock, name.as_ptr(), key, want, handoff)
            };
            drop(lock);
            let granted = matches!(attempt, Attempt::Granted { .. });
            // Where the server reports every key expiry (Redis >= 7.2, Valkey) `lock.expired`
            // was announced then, whether anyone waited or not. The end of one hold of several
            // only the module sees.
            let key_expired =
                granted && handoff.cause == Cause::LeaseEnded && !crate::events::counts_expiries();
            add(&STATS.holds_expired, ended as u64);
            if ended > 0 || key_expired {
                notify::event(ctx, c"lock.expired", name.as_ptr());
            }
            if granted {
                notify::event(ctx, c"lock.handoff", name.as_ptr());
            }
            attempt
        })
    }

    fn end_hold(&mut self, grant: &GrantRef, ending: Ending) -> Ended {
        let ctx = self.ctx;
        with_db(ctx, grant.key.db, || {
            let name = OwnedString::new(&grant.key.name);
            let key = Key::open(ctx, name.as_ptr());
            let Ok(live) = store::read_live(&key, now_ms()) else {
                return Ended::NotThere;
            };
            let any_count = ending == Ending::ConnectionClosed;
            let Some(new) = hold::remove_hold(&live.lock, grant.kind, grant.token, any_count)
            else {
                return Ended::NotThere;
            };
            if store::write_lock(ctx, &key, name.as_ptr(), live.stored.as_ref(), &new).is_err() {
                return Ended::NotThere;
            }
            drop(key);
            if ending == Ending::ConnectionClosed {
                notify::event(ctx, c"lock.disconnected", name.as_ptr());
            }
            if new.holds.is_empty() {
                Ended::KeyFree
            } else {
                Ended::KeyStillHeld
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
            Note::Mismatched => bump(&STATS.errors),
            Note::Disconnected { .. } => bump(&STATS.disconnected),
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

/// A free key handed to an exclusive waiter: the `RLock` layout, written as a command would.
fn grant_exclusive(
    ctx: Ctx,
    lock: &Key,
    name: RawString,
    key: &LockKey,
    owner: &[u8],
    handoff: Handoff,
) -> Attempt {
    let token = match store::next_token(ctx, &key.name, handoff.now) {
        Ok(token) => token,
        Err(e) => return Attempt::Refused(e),
    };
    let owner = OwnedString::new(owner);
    let written = store::write_hold(
        ctx,
        store::Hold {
            key_name: name,
            owner: owner.as_ptr(),
            count: 1,
            new_token: Some(token),
            expires_at: handoff.expires_at,
            key: lock,
        },
    );
    match written {
        Ok(()) => Attempt::Granted {
            token,
            next_lease_end: Some(handoff.expires_at),
        },
        Err(e) => Attempt::Refused(e),
    }
}

/// Whether the key is another owner's lock in the `RLock` layout — what an exclusive waiter most
/// often finds at a lease check — answered in O(1), without reading every field. (Redis
/// removes such a key itself when its lease ends, so the hold has not ended.)
fn held_exclusively_by_other(lock: &Key, owner: &[u8]) -> bool {
    let owner = OwnedString::new(owner);
    matches!(
        store::view_of(lock, owner.as_ptr()),
        Ok(View::HeldByOther { .. })
    )
}

/// Any other handoff: the key's ended holds go first, then the waiter gets a hold if the rules
/// give it one (`hold::decide`, as the head of the queue). Also returns how many ended holds
/// were removed.
fn grant_general(
    ctx: Ctx,
    lock: &Key,
    name: RawString,
    key: &LockKey,
    want: Want<'_>,
    handoff: Handoff,
) -> (Attempt, usize) {
    let store::LiveLock {
        stored,
        lock: current,
        ended,
    } = match store::read_live(lock, handoff.now) {
        Ok(live) => live,
        // Not a lock (a client replaced it): held until it changes or goes.
        Err(_) => {
            let held = Attempt::Held {
                next_lease_end: lock.expires_at(),
            };
            return (held, 0);
        }
    };
    let lease_ms = handoff.expires_at.saturating_sub(handoff.now);
    let decision = hold::decide(
        &current,
        want.owner,
        want.mode,
        lease_ms,
        Reentry::Counted,
        Queue::Empty,
        handoff.now,
    );
    let granted = match decision {
        Ok(Decision::Grant(granted)) => granted,
        other => {
            // Nobody granted: the ended holds still go, replicated like any write.
            let removed = if ended > 0
                && store::write_lock(ctx, lock, name, stored.as_ref(), &current).is_ok()
            {
                ended
            } else {
                0
            };
            let attempt = match other {
                Err(e) => Attempt::Mismatch(e),
                _ => Attempt::Held {
                    next_lease_end: current.next_lease_end(),
                },
            };
            return (attempt, removed);
        }
    };
    let token = match granted.token {
        Some(token) => token,
        None => match store::next_token(ctx, &key.name, handoff.now) {
            Ok(token) => token,
            Err(e) => return (Attempt::Refused(e), 0),
        },
    };
    let new = hold::apply(&current, want.owner, want.mode, &granted, token);
    if let Err(e) = store::write_lock(ctx, lock, name, stored.as_ref(), &new) {
        return (Attempt::Refused(e), 0);
    }
    let attempt = Attempt::Granted {
        token: granted.token.unwrap_or(token),
        next_lease_end: new.next_lease_end(),
    };
    (attempt, ended)
}
