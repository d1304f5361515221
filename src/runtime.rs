//! The module's side of waiting: the scheduler's state (the rules live in
//! `lock_core::scheduler`), the one module timer that serves every deadline, the inbox of
//! changes noticed by keyspace events, and [`RedisPort`], which carries the scheduler's effects
//! out on the server.
//!
//! Everything runs on Redis's main thread. The scheduler is a thread-local `RefCell`; a borrow
//! is never held across a Redis call that could call back into the module, except keyspace
//! events (raised by lazy expiry inside `OpenKey`), which only touch the separate `INBOX`.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lock_core::args::{AcquireRequest, Binding, Wait, Waiting};
use lock_core::binding::{ClientId, GrantRef};
use lock_core::election::Campaign;
use lock_core::hold::{HoldKind, Lock, Lost, Mode, StoredLock};
use lock_core::kind::Reentry;
use lock_core::queue::LockKey;
use lock_core::scheduler::tickets::TICKETS_PER_TURN;
use lock_core::scheduler::{
    Answer, Cancelled, Change, Delivery, Event, Handle, NewWait, Note, Port, Read, Scheduler, Seen,
    Shape, TicketName, Writes,
};
use lock_core::LockError;

use crate::ffi::wait::{self, Blocked};
use crate::ffi::{self, now_ms, with_db, Ctx, Key, OwnedString, RawString};
use crate::stats::{add, bump, STATS};
use crate::{config, election, log, notify, store};

/// Changes noted by keyspace events before the inbox is processed. A storm of events (a script
/// deleting a million keys while someone waits) collapses into one look at every waited key.
const INBOX_LIMIT: usize = 1_024;

thread_local! {
    /// The last `CLUSTER NODES` text, with the cached server time it was read at.
    static CLUSTER_NODES: RefCell<Option<Routes>> = const { RefCell::new(None) };
    static SCHEDULER: RefCell<Scheduler<Blocked>> = RefCell::new(Scheduler::default());
    /// The armed module timer (see [`arm`]).
    static TIMER: Cell<Option<Armed>> = const { Cell::new(None) };
    static INBOX: RefCell<Vec<Change>> = const { RefCell::new(Vec::new()) };
    static INBOX_ARMED: Cell<bool> = const { Cell::new(false) };
    /// Connections that closed since the inbox was last processed, while holds were bound.
    static GONE: RefCell<Vec<ClientId>> = const { RefCell::new(Vec::new()) };
    /// Mirrors the number of holds bound to connections (EPHEMERAL), readable without a borrow.
    static BOUND: Cell<usize> = const { Cell::new(0) };
    /// Mirrors whether any connection has a ticket not yet done, readable without a borrow.
    static TICKETS: Cell<bool> = const { Cell::new(false) };
    /// Mirrors the number of queued waiters, readable without borrowing the scheduler.
    static WAITING: Cell<usize> = const { Cell::new(0) };
    /// Answers not yet given to their waiters (see [`ANSWERS_PER_TURN`]), in order.
    static OUTBOX: RefCell<VecDeque<(Blocked, Answer)>> = const { RefCell::new(VecDeque::new()) };
    static OUTBOX_ARMED: Cell<bool> = const { Cell::new(false) };
    /// A key that `MOVE`/`RENAME` is taking away, between its two keyspace events.
    static LEAVING: RefCell<Option<LockKey>> = const { RefCell::new(None) };
    /// Last time a "lease expired with waiters" warning was logged.
    static LAST_EXPIRY_WARNING: Cell<u64> = const { Cell::new(0) };
}

/// How many waiters are answered in one turn of the server's event loop. A run of thousands of
/// shared waiters is granted in one write, but Redis then sends each its reply and resumes its
/// connection: answered all at once that kept the server from everything else for about 20 µs a
/// waiter (200 ms for 10,000). The rest are answered from a 0 ms timer, a batch each turn, with
/// other clients served in between. A waiter that disconnects (or is unblocked by `CLIENT
/// UNBLOCK`) before its answer is an undelivered grant, as before: its hold is passed on.
const ANSWERS_PER_TURN: usize = 500;

// Ticket answers are written `TICKETS_PER_TURN` a turn for the same reason (each wakes a client
// blocked on its ticket, which Redis serves right after the turn; the scheduler grants ticket
// waiters no faster): the rest are written from the same 0 ms timer.

/// Whether the code that calls the scheduler may write keys (a command, a timer): then the
/// ticket answers it decided are written at once. Inside the server's callbacks (a client being
/// freed, a keyspace or server event) they are written from a 0 ms timer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Turn {
    Writable,
    Callback,
}

/// The runtime as the blocking and timer callbacks see it (`wait::Events`).
pub struct Runtime;

impl wait::Events for Runtime {
    fn waiter_left(ctx: Ctx, handle: Blocked) -> bool {
        waiter_left(ctx, handle)
    }

    fn grant_undelivered(ctx: Ctx, grant: GrantRef) {
        grant_undelivered(ctx, grant);
    }

    fn timer(ctx: Ctx) {
        on_timer(ctx);
    }

    fn inbox(ctx: Ctx) {
        on_inbox(ctx);
    }

    fn outbox(ctx: Ctx) {
        on_outbox(ctx);
    }
}

/// Whether the server reports every key that expires (the key server event, Redis >= 7.2 and
/// Valkey): then a lease end that freed a whole key was counted and announced already.
static REPORTS_EXPIRIES: AtomicBool = AtomicBool::new(false);

pub fn set_reports_expiries(reports: bool) {
    REPORTS_EXPIRIES.store(reports, Ordering::Relaxed);
}

pub fn reports_expiries() -> bool {
    REPORTS_EXPIRIES.load(Ordering::Relaxed)
}

/// Runs `f` on the scheduler from a callback of the server (no writes), then arms the timer
/// for its next deadline.
fn with_scheduler<R>(
    ctx: Ctx,
    f: impl FnOnce(&mut Scheduler<Blocked>, RedisPort) -> R,
) -> Option<R> {
    run_scheduler(ctx, Turn::Callback, f)
}

/// [`with_scheduler`] from a command or a timer: the ticket answers it decided are written at
/// once (up to [`TICKETS_PER_TURN`]).
fn with_scheduler_writing<R>(
    ctx: Ctx,
    f: impl FnOnce(&mut Scheduler<Blocked>, RedisPort) -> R,
) -> Option<R> {
    run_scheduler(ctx, Turn::Writable, f)
}

fn run_scheduler<R>(
    ctx: Ctx,
    turn: Turn,
    f: impl FnOnce(&mut Scheduler<Blocked>, RedisPort) -> R,
) -> Option<R> {
    SCHEDULER.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scheduler) => {
            let started = Instant::now();
            let out = f(&mut scheduler, RedisPort::new(ctx));
            let more = match turn {
                Turn::Writable => {
                    let mut port = RedisPort::new(ctx);
                    let delivery = scheduler.deliver_tickets(&mut port, TICKETS_PER_TURN, now_ms());
                    delivery == Delivery::More
                }
                Turn::Callback => scheduler.tickets_to_deliver(),
            };
            WAITING.with(|w| w.set(scheduler.waiting()));
            BOUND.with(|b| b.set(scheduler.bound_holds()));
            TICKETS.with(|t| t.set(scheduler.any_tickets()));
            arm(ctx, scheduler.next_deadline(), started.elapsed());
            drop(scheduler);
            send_answers(ctx);
            if more {
                arm_outbox(ctx);
            }
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

pub fn waiting_gauges() -> crate::stats::Gauges {
    let ((waiters, keys), tickets) =
        read_scheduler(|s| (s.gauges(), s.open_tickets())).unwrap_or(((0, 0), 0));
    crate::stats::Gauges {
        waiters,
        keys,
        bound: bound_holds(),
        tickets,
    }
}

/// What a waiting acquire asks for.
pub struct Request<'a> {
    pub owner: &'a [u8],
    pub lease_ms: u64,
    pub wait: Wait,
    /// Blocked, or with a ticket of this shape (one token, or a token per key).
    pub waiting: Waiting,
    pub shape: Shape,
    pub mode: Mode,
    /// `ONCE`: a key its owner holds already is not re-entered with a count (multi-key).
    pub reentry: Reentry,
    /// `EPHEMERAL`: the connection its grant is bound to.
    pub bind: Option<ClientId>,
    /// `LOCK.CAMPAIGN`: its grant is announced to the key's observers.
    pub campaign: Option<Campaign>,
}

impl<'a> Request<'a> {
    /// What the calling client's acquire asks for, as it waits (bound to the calling
    /// connection with `EPHEMERAL`, with or without `TICKET`). `shape`: what its grant answers
    /// (one token, or a token per key of `LOCK.MACQUIRE`).
    pub fn of(
        ctx: Ctx,
        request: &AcquireRequest<'a>,
        campaign: Option<Campaign>,
        shape: Shape,
    ) -> Self {
        Request {
            owner: request.owner,
            lease_ms: request.lease_ms,
            wait: request.wait,
            waiting: request.waiting,
            shape,
            mode: request.mode,
            reentry: request.reentry,
            bind: (request.binding == Binding::Connection).then(|| ffi::client_id(ctx)),
            campaign,
        }
    }
}

/// Queues the current client's request on its key — on every key at once for a multi-key
/// acquire — and blocks the client, or (`TICKET`) replies its ticket. `keys`: each key with
/// what the acquire saw there.
pub fn enqueue(ctx: Ctx, keys: &[(LockKey, Seen)], request: Request<'_>) -> Result<(), LockError> {
    let Request {
        owner,
        lease_ms,
        wait,
        waiting,
        shape,
        mode,
        reentry,
        bind,
        campaign,
    } = request;
    let now = now_ms();
    with_scheduler_writing(ctx, |scheduler, mut port| {
        let max = config::max_waiters_per_key();
        for (key, _) in keys {
            scheduler.has_room(key, owner, max)?;
        }
        let handle = match waiting {
            Waiting::Blocked => {
                Handle::Blocked(wait::block::<Runtime>(ctx).ok_or(LockError::Internal)?)
            }
            Waiting::Ticket => {
                let (first, _) = keys.first().ok_or(LockError::Internal)?;
                Handle::Ticket(scheduler.new_ticket(first, shape, ffi::client_id(ctx)))
            }
        };
        let new = NewWait {
            handle,
            keys,
            owner,
            lease_ms,
            wait,
            mode,
            reentry,
            bind,
            campaign,
        };
        match (scheduler.enqueue(&mut port, new, max, now), handle) {
            (Ok(_), Handle::Blocked(_)) => bump(&STATS.waits_started),
            (Err(e), Handle::Blocked(blocked)) => {
                wait::unblock(blocked, Answer::Refused(e.reply()))
            }
            (Ok(_), Handle::Ticket(ticket)) => {
                bump(&STATS.waits_ticketed);
                ffi::reply::bulk(ctx, &ticket.name.key());
            }
            (Err(e), Handle::Ticket(_)) => return Err(e),
        }
        Ok(())
    })
    .unwrap_or(Err(LockError::Internal))
}

/// `LOCK.CANCEL`: withdraws a ticket (see `Scheduler::cancel`).
pub fn cancel(ctx: Ctx, ticket: TicketName) -> Result<Cancelled, LockError> {
    with_scheduler_writing(ctx, |s, mut port| s.cancel(&mut port, ticket, now_ms()))
        .ok_or(LockError::Internal)
}

pub use lock_core::command::Left;

/// A hold ended inside a command (release, force-release, a lease end it noticed): hand the room
/// to the head waiter(s), else publish the unlock message when the key is free (the rule is
/// `Scheduler::freed`). With nobody waiting anywhere there is no queue to hand to: the scheduler
/// is not even borrowed.
pub fn lock_freed(ctx: Ctx, key_name: RawString, name: &[u8], left: Left) {
    if anyone_waiting() {
        let key = LockKey::new(ffi::selected_db(ctx), name);
        with_scheduler_writing(ctx, |s, mut port| s.freed(&mut port, &key, left, now_ms()));
    } else if left == Left::Nothing {
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
    with_scheduler(ctx, |s, mut port| {
        s.bind(&mut port, client, &key, kind, token, now_ms());
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

/// `MOVE`/`RENAME` is taking this key away (its arrival follows in the same command).
pub fn key_leaving(from: LockKey) {
    LEAVING.with(|leaving| *leaving.borrow_mut() = Some(from));
}

/// The key announced by [`key_leaving`] arrived at `to` with the holds of these tokens: the
/// bound ones follow it.
pub fn key_arrived(ctx: Ctx, to: LockKey, tokens: &[u64]) {
    let Some(from) = LEAVING.with(|leaving| leaving.borrow_mut().take()) else {
        return;
    };
    with_scheduler(ctx, |s, _| s.key_moved(&from, &to, tokens));
}

/// `SWAPDB a b`: bound holds follow their keys.
pub fn databases_swapped(ctx: Ctx, a: i32, b: i32) {
    with_scheduler(ctx, |s, _| s.swap_databases(a, b));
}

/// `FLUSHDB` (Some) or `FLUSHALL` (None): the bindings of the holds there go with them.
pub fn flushed(ctx: Ctx, db: Option<i32>) {
    if any_bound() || any_tickets() {
        with_scheduler(ctx, |s, _| s.flushed(db, now_ms()));
    }
    // The token counters the flush took are written back at the next turn.
    if !INBOX_ARMED.with(Cell::get) {
        INBOX_ARMED.with(|a| a.set(true));
        wait::arm_inbox_timer::<Runtime>(ctx);
    }
}

/// The server became a replica: every binding is forgotten.
pub fn forget_bindings(ctx: Ctx) {
    with_scheduler(ctx, |s, _| s.forget_bindings());
}

/// Holds bound to connections now (INFO).
pub fn bound_holds() -> usize {
    BOUND.with(Cell::get)
}

/// Whether any connection has a ticket not yet done (cheap: skips the close of every other
/// connection).
pub fn any_tickets() -> bool {
    TICKETS.with(Cell::get)
}

/// How a ticket key went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TicketGone {
    /// A pop took its last element: the grant written there was delivered.
    Popped,
    /// It went still holding its element: a grant there was not delivered.
    TakenAway,
}

/// A key of the module's namespace went: if it was a ticket, the grant written there was
/// delivered (`Scheduler::ticket_popped`), or taken away unpopped and is looked at again
/// (`Scheduler::ticket_taken_away`). Raised inside the command that removed it: nothing is
/// written here.
pub fn ticket_gone(ctx: Ctx, name: &[u8], gone: TicketGone) {
    if !any_tickets() {
        return;
    }
    if let Some(ticket) = TicketName::parse(name, ffi::selected_db(ctx)) {
        with_scheduler(ctx, |s, _| match gone {
            TicketGone::Popped => s.ticket_popped(ticket),
            TicketGone::TakenAway => s.ticket_taken_away(ticket, now_ms()),
        });
    }
}

/// A connection closed (server event). Its holds end, and its tickets go, from the inbox
/// timer: the server may be in the middle of anything when it frees a client.
pub fn connection_closed(ctx: Ctx, client: ClientId) {
    if !any_bound() && !any_tickets() {
        return;
    }
    GONE.with(|gone| gone.borrow_mut().push(client));
    if !INBOX_ARMED.with(Cell::get) {
        INBOX_ARMED.with(|a| a.set(true));
        wait::arm_inbox_timer::<Runtime>(ctx);
    }
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
    with_scheduler_writing(ctx, |s, mut port| s.timer_fired(&mut port, now_ms()));
}

/// The armed module timer.
#[derive(Clone, Copy)]
struct Armed {
    id: u64,
    /// When it fires.
    at: u64,
    /// The deadline it was armed for (at most `at`).
    deadline: u64,
    /// Whether `at` was moved past the deadline after a long turn (at most once a deadline).
    rested: bool,
}

/// The least delay the module timer is armed with (see [`arm`]).
const TIMER_MIN_DELAY_MS: u64 = 1;
/// A turn at least this long is a long one (see [`arm`]).
const LONG_TURN: Duration = Duration::from_millis(2);
/// How long after a long turn the timer runs the next one, at the earliest (see [`arm`]).
const REST_AFTER_LONG_TURN_MS: u64 = 5;

/// Arms the single module timer for the scheduler's earliest deadline (or stops it when none is
/// left, so that MODULE UNLOAD is not held up by an idle timer); `turn` is how long the turn
/// that asks took.
///
/// Redis runs due timers right after the file events of the same event-loop iteration, and
/// writes the replies to the commands it read only in the next one. So a deadline already due
/// (a turn's rest is due a millisecond after the turn *started*, when the turn took longer) is
/// never armed at once but a millisecond from now, and after a long turn (a batch at the caps
/// takes tens of milliseconds) not sooner than [`REST_AFTER_LONG_TURN_MS`] from its end:
/// otherwise a client whose command arrived during a long turn is read right after it and
/// answered only after the next one, waiting out two turns.
///
/// A timer armed for a deadline no later than the next one is kept by a short turn (the hot
/// path: nothing but the turn's own two reads of the monotonic clock), and moved later by a
/// long turn at most once: a stream of commands never keeps a due deadline from its turn.
fn arm(ctx: Ctx, next: Option<u64>, turn: Duration) {
    let long = turn >= LONG_TURN;
    let armed = TIMER.with(Cell::get);
    let Some(next) = next else {
        if let Some(armed) = armed {
            wait::stop_timer(ctx, armed.id);
            TIMER.with(|t| t.set(None));
        }
        return;
    };
    let (deadline, rested) = match armed {
        Some(armed) if armed.deadline <= next && (!long || armed.rested) => return,
        // A long turn: the deadline armed for gets its rest (once).
        Some(armed) if armed.deadline <= next => (armed.deadline, false),
        _ => (next, false),
    };
    let now = now_ms();
    let (at, rested) = if long && !rested {
        (
            deadline.max(now.saturating_add(REST_AFTER_LONG_TURN_MS)),
            true,
        )
    } else {
        (deadline.max(now.saturating_add(TIMER_MIN_DELAY_MS)), false)
    };
    if let Some(armed) = armed {
        if armed.at == at {
            TIMER.with(|t| t.set(Some(Armed { rested, ..armed })));
            return;
        }
        wait::stop_timer(ctx, armed.id);
        TIMER.with(|t| t.set(None));
    }
    let id = wait::arm_timer::<Runtime>(ctx, at.saturating_sub(now));
    TIMER.with(|t| {
        t.set(Some(Armed {
            id,
            at,
            deadline,
            rested,
        }))
    });
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
        wait::arm_inbox_timer::<Runtime>(ctx);
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
    store::restore_flushed_counters(ctx);
    let changes = INBOX.with(|inbox| std::mem::take(&mut *inbox.borrow_mut()));
    let gone = GONE.with(|gone| std::mem::take(&mut *gone.borrow_mut()));
    with_scheduler_writing(ctx, |s, mut port| {
        let now = now_ms();
        s.clients_gone(&mut port, gone, now);
        if !changes.is_empty() {
            s.keys_changed(&mut port, changes, now);
        }
    });
}

/// Answers up to [`ANSWERS_PER_TURN`] waiters; the rest from a 0 ms timer, next turn.
fn send_answers(ctx: Ctx) {
    let (batch, more) = OUTBOX.with(|outbox| {
        let mut outbox = outbox.borrow_mut();
        let take = outbox.len().min(ANSWERS_PER_TURN);
        let batch: Vec<_> = outbox.drain(..take).collect();
        (batch, !outbox.is_empty())
    });
    for (handle, answer) in batch {
        wait::unblock(handle, answer);
    }
    if more {
        arm_outbox(ctx);
    }
}

/// The 0 ms timer that gives what a turn could not: answers to blocked clients, and ticket
/// answers.
fn arm_outbox(ctx: Ctx) {
    if !OUTBOX_ARMED.with(Cell::get) {
        OUTBOX_ARMED.with(|a| a.set(true));
        wait::arm_outbox_timer::<Runtime>(ctx);
    }
}

pub fn on_outbox(ctx: Ctx) {
    OUTBOX_ARMED.with(|a| a.set(false));
    send_answers(ctx);
    if read_scheduler(Scheduler::tickets_to_deliver).unwrap_or(false) {
        with_scheduler_writing(ctx, |_, _| ());
    }
}

/// Whether the module can be unloaded: no waiters and nothing scheduled.
pub fn idle() -> bool {
    read_scheduler(Scheduler::is_idle).unwrap_or(false)
        && TIMER.with(Cell::get).is_none()
        && !INBOX_ARMED.with(Cell::get)
        && !OUTBOX_ARMED.with(Cell::get)
        && OUTBOX.with(|outbox| outbox.borrow().is_empty())
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
    TICKETS.with(|t| t.set(false));
    OUTBOX.with(|outbox| outbox.borrow_mut().clear());
    OUTBOX_ARMED.with(|a| a.set(false));
}

/// The scheduler's store: reads and writes lock keys, takes tokens, answers waiters, through
/// the context of the command, timer or callback that called it. It decides nothing.
struct RedisPort {
    ctx: Ctx,
    /// The keys read and not yet written, still open, so that the write that follows a read
    /// goes to exactly what was read (nothing can change it in between: it is one call on the
    /// main thread). A batch reads each key once and writes it once; a key read again is
    /// closed first, so there is never more than one handle on a key. All close when the port
    /// goes, at the end of the call.
    open: Vec<OpenLock>,
}

struct OpenLock {
    key: LockKey,
    name: OwnedString,
    handle: Key,
}

impl RedisPort {
    fn new(ctx: Ctx) -> RedisPort {
        RedisPort {
            ctx,
            open: Vec::new(),
        }
    }

    /// Opens `key` (kept open for the write that follows) and reads its lock.
    fn open_and_read(&mut self, key: &LockKey, check_route: bool) -> Read {
        let ctx = self.ctx;
        with_db(ctx, key.db, || {
            let name = OwnedString::new(&key.name);
            let handle = Key::open(ctx, name.as_ptr());
            let read = match store::read_lock(&handle, None) {
                Ok(None) if check_route => match slot_left(ctx, &key.name) {
                    Some(redirect) => Read::Moved(redirect),
                    None => Read::Lock(None),
                },
                Ok(stored) => Read::Lock(stored),
                Err(_) => Read::NotALock {
                    expires_at: handle.expires_at(),
                },
            };
            self.open.push(OpenLock {
                key: key.clone(),
                name,
                handle,
            });
            read
        })
    }
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

    fn read(&mut self, key: &LockKey, check_route: bool) -> Read {
        // A key read again (by a later decision of the same call) is closed and opened anew:
        // never two handles on one key.
        self.open.retain(|open| open.key != *key);
        self.open_and_read(key, check_route)
    }

    fn write(
        &mut self,
        key: &LockKey,
        old: Option<&StoredLock>,
        new: &Lock,
    ) -> Result<(), LockError> {
        let ctx = self.ctx;
        let at = self
            .open
            .iter()
            .position(|open| open.key == *key)
            .ok_or(LockError::Internal)?;
        let open = self.open.swap_remove(at);
        with_db(ctx, key.db, || {
            store::write_lock(ctx, &open.handle, open.name.as_ptr(), None, old, new)
        })
    }

    fn next_token(&mut self, key: &LockKey, now: u64) -> Result<u64, LockError> {
        let ctx = self.ctx;
        with_db(ctx, key.db, || store::next_token(ctx, &key.name, now))
    }

    fn reports_expiries(&self) -> bool {
        reports_expiries()
    }

    fn event(&mut self, key: &LockKey, event: Event) {
        if !config::keyspace_events() {
            // Nothing to tell: skip the key name and the database switch (a run of grants
            // raises one event a waiter).
            return;
        }
        let ctx = self.ctx;
        let name = match event {
            Event::Expired => c"lock.expired",
            Event::Handoff => c"lock.handoff",
            Event::Disconnected => c"lock.disconnected",
        };
        with_db(ctx, key.db, || {
            let key_name = OwnedString::new(&key.name);
            notify::event(ctx, name, key_name.as_ptr());
        });
    }

    fn publish_unlock(&mut self, key: &LockKey) {
        let ctx = self.ctx;
        with_db(ctx, key.db, || {
            let name = OwnedString::new(&key.name);
            notify::publish_unlock(ctx, name.as_ptr(), &key.name);
        });
    }

    fn lost(&mut self, key: &LockKey, lost: &Lost) {
        notify::publish_lost(self.ctx, key.db, &key.name, lost);
    }

    fn elected(&mut self, key: &LockKey, token: u64, owner: &[u8], value: Option<&[u8]>) {
        let ctx = self.ctx;
        with_db(ctx, key.db, || {
            election::announce(ctx, &key.name, token, owner, value)
        });
    }

    fn answer(&mut self, handle: Blocked, answer: Answer) {
        // Given when the scheduler is done (see `send_answers`).
        OUTBOX.with(|outbox| outbox.borrow_mut().push_back((handle, answer)));
    }

    fn push_ticket(&mut self, ticket: &TicketName, value: &[u8], expires_at: u64) {
        let ctx = self.ctx;
        with_db(ctx, ticket.db, || {
            store::push_ticket(ctx, &ticket.key(), value, expires_at)
        });
    }

    fn take_ticket(&mut self, ticket: &TicketName) -> Option<Vec<u8>> {
        let ctx = self.ctx;
        with_db(ctx, ticket.db, || store::take_ticket(ctx, &ticket.key()))
    }

    fn note(&mut self, note: Note) {
        match note {
            Note::LeasesEnded(count) => add(&STATS.holds_expired, count as u64),
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
            Note::TicketTaken => bump(&STATS.tickets_taken),
            Note::GrantLapsed => bump(&STATS.ticket_grants_lapsed),
        }
    }
}

/// In a cluster, a lock key that vanished may have moved to another node with its slot
/// (MIGRATE deletes it here). Granting it here would make a second lock beside the moved one,
/// so the waiters get the redirect Redis would give for the key (`ASK`/`MOVED`) and their
/// cluster clients follow it.
///
/// `CLUSTER NODES` is asked once per command (or event-loop callback) where the server has a
/// cached clock (Redis >= 7.2, Valkey: the servers with key events): a `DEL` of thousands of
/// lock keys, each removal asking where its slot is, asks the server once.
pub fn slot_left(ctx: Ctx, name: &[u8]) -> Option<String> {
    if !ffi::is_cluster(ctx) {
        return None;
    }
    let slot = lock_core::slot::key_slot(name);
    let Some(now) = ffi::cached_micros() else {
        let nodes = ffi::cluster_nodes(ctx)?;
        return lock_core::cluster::route(&nodes, slot).redirect(slot);
    };
    CLUSTER_NODES.with(|cache| {
        let mut cache = cache.borrow_mut();
        if cache.as_ref().is_none_or(|c| c.at != now) {
            *cache = Some(Routes {
                at: now,
                nodes: ffi::cluster_nodes(ctx)?,
                slots: HashMap::new(),
            });
        }
        let routes = cache.as_mut()?;
        let nodes = &routes.nodes;
        routes
            .slots
            .entry(slot)
            .or_insert_with(|| lock_core::cluster::route(nodes, slot).redirect(slot))
            .clone()
    })
}

/// What `CLUSTER NODES` said at one cached server time, and each slot's redirect read from it.
struct Routes {
    at: i64,
    nodes: String,
    slots: HashMap<u16, Option<String>>,
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
