//! The waiting scheduler: who gets a lock key when it frees, when to look at a key again, what
//! a grant nobody received turns into, when waiters are sent to another node. No I/O and no
//! clock of its own: the adapter calls it with events and the server's time, and it acts only
//! through the [`Port`] the adapter implements (keys, tokens, clients, notifications).
//!
//! Events in: a waiter queued ([`Scheduler::enqueue`]), a key freed by a command
//! ([`Scheduler::freed`]), a lease moved ([`Scheduler::lease_changed`]), a waiter that left
//! ([`Scheduler::waiter_left`]), a grant that was not delivered
//! ([`Scheduler::grant_undelivered`]), the timer ([`Scheduler::timer_fired`]) and changes made
//! outside the module ([`Scheduler::keys_changed`]). Effects out, through the port: write a
//! hold and get its token, answer a waiter, redirect, free an undelivered hold, publish, note
//! what happened. After every event the adapter arms one timer for [`Scheduler::next_deadline`].
//!
//! A waiter is a blocked client (`WAIT`: the port unblocks it with its answer) or a ticket
//! (`WAIT ... TICKET`: the scheduler writes its answer into the ticket's list, see
//! [`tickets`]); both wait in the same queues under the same rules.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

use crate::args::Wait;
use crate::binding::{Bindings, ClientId, GrantRef};
use crate::deadlines::{DeadlineKey, Deadlines};
use crate::election::Campaign;
use crate::hold::{self, Hold, HoldKind, Lock, Lost, LostReason, Mode, StoredLock};
use crate::kind::Left;
use crate::kind::Reentry;
use crate::queue::{LockKey, NewWaiter, Removed, WaitQueues, Waiter, WaiterId};
pub use crate::ticket::{Shape, Ticket, TicketName, TicketValue};
use crate::{LockError, UnixMs};

pub use tickets::{Cancelled, Delivery};

/// Who waits: a client the server blocked (`WAIT`, the adapter's handle `H`), or a ticket
/// (`WAIT ... TICKET`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Handle<H> {
    Blocked(H),
    Ticket(Ticket),
}

/// How often the scheduler looks again while the server pauses writes: no event says when a
/// pause ends, so deferred handoffs happen within this many ms of its end.
pub const PAUSE_POLL_MS: u64 = 5;

/// The answer to a waiter whose owner asked again for the same key while it still waited.
pub const REPLACED: &str =
    "ERR this WAIT was replaced by a newer LOCK.ACQUIRE ... WAIT of the same owner for this lock";

/// How long after a lease end that already passed (the key is still there: clients paused,
/// say) the scheduler looks again, rather than spin.
pub const OVERDUE_RECHECK_MS: u64 = 10;

/// Why the scheduler looks at a key to hand it over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Released or removed by a client (LOCK.RELEASE, DEL, FLUSHALL, ...).
    Freed,
    /// The holder's lease ran out: the holder lost the lock.
    LeaseEnded,
}

/// Who asks for a handoff: a LOCK.* command on this node (which the server routed here, so the
/// key's slot is served here), or a timer or event (the key may have left with its slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Command,
    Background,
}

/// Whether the server lets the module write now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writes {
    Allowed,
    /// `CLIENT PAUSE`, `FAILOVER`: nothing may be written until the pause ends.
    Paused,
    /// A replica never writes on its own; its master's effects arrive by replication.
    Replica,
}

/// What a read of a lock key found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// The lock stored there (None: no key).
    Lock(Option<StoredLock>),
    /// Something that is not a lock (a client replaced it): held until it changes or goes. The
    /// key's expiry, if it has one.
    NotALock { expires_at: Option<UnixMs> },
    /// The key left this node with its slot: the server's redirect for it (`ASK ...`/`MOVED ...`).
    Moved(String),
}

/// Keyspace events the scheduler raises on a lock key (`lock.<name>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Holds whose lease ended were removed, or a lease end let a waiter in.
    Expired,
    /// A waiter was granted a hold.
    Handoff,
    /// An EPHEMERAL hold ended with its connection.
    Disconnected,
}

/// Why holds are ended by [`Scheduler::end_holds`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// A grant whose reply was not delivered: ended only while it is still exactly that grant
    /// (count 1); a re-entered hold is somebody's.
    Undelivered,
    /// Its connection closed: every re-entry ends at once.
    ConnectionClosed,
}

/// How often bound holds are checked for ends the module does not see as they happen (a lease
/// end, DEL, an overwrite), and how much one check does at most: bindings looked at, and holds
/// read from their keys (past that, only connections whose keys were read already are taken;
/// the first key to go over is still read whole).
pub const BINDING_SWEEP_MS: u64 = 100;
pub const BINDING_SWEEP_BINDINGS: usize = 10_000;
pub const BINDING_SWEEP_HOLDS_READ: usize = 20_000;

/// How a waiter leaves the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Granted {
        token: u64,
        key: LockKey,
        owner: Box<[u8]>,
        kind: HoldKind,
    },
    /// A multi-key request got every key at once: each key with its token, in the order asked.
    GrantedAll {
        holds: Vec<(LockKey, u64)>,
        owner: Box<[u8]>,
        kind: HoldKind,
    },
    TimedOut,
    /// An error reply (a redirect, or why nobody can be granted the key).
    Refused(String),
}

/// What happened, for counters, logs and keyspace events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// Holds whose lease had ended were removed from a key.
    LeasesEnded(usize),
    /// A waiter got the key, after queuing this long.
    HandedOff {
        key: LockKey,
        waited_ms: u64,
    },
    /// A held lease ran out while others waited (the holder lost the lock).
    ExpiredWithWaiters {
        key: LockKey,
    },
    TimedOut,
    /// A waiter left by itself (disconnect, `CLIENT UNBLOCK`).
    Cancelled,
    Redirected,
    /// A waiter was answered with an error: nobody can be granted its key.
    Refused,
    /// A granted waiter vanished before its reply; the hold was passed on.
    AbandonedGrant,
    /// A waiter gave its place to a newer wait of the same owner.
    Replaced,
    /// A waiter's request did not fit what the key is when its turn came.
    Mismatched,
    /// An ephemeral hold ended because its connection closed.
    Disconnected {
        key: LockKey,
    },
    /// `LOCK.CANCEL` took a ticket's grant that was not popped: the canceller holds it.
    TicketTaken,
    /// A ticket's grant was not popped before its lease ended: the ticket says `expired` now.
    GrantLapsed,
}

/// What the scheduler needs from the server: a store of locks and a way to answer waiters. It
/// decides nothing (the rules are `hold`'s and the scheduler's). Every call is about one key,
/// in its database.
pub trait Port<H> {
    fn writes(&self) -> Writes;
    /// Reads the lock at `key`. With `check_route` a missing key whose slot left this node (a
    /// background handoff in a cluster) reads as [`Read::Moved`].
    fn read(&mut self, key: &LockKey, check_route: bool) -> Read;
    /// Turns the lock last read from `key` (`old`, as read) into `new`: writes, and replicates
    /// as plain commands, only what changes.
    fn write(
        &mut self,
        key: &LockKey,
        old: Option<&StoredLock>,
        new: &Lock,
    ) -> Result<(), LockError>;
    /// A new fencing token for a grant on `key`, taken at `now`.
    fn next_token(&mut self, key: &LockKey, now: UnixMs) -> Result<u64, LockError>;
    /// Whether the server reports every key expiry itself (Redis >= 7.2, Valkey): a lease end
    /// that freed the whole key was announced then.
    fn reports_expiries(&self) -> bool;
    fn event(&mut self, key: &LockKey, event: Event);
    /// Tells the lock's channel it is free (nobody was waiting for it).
    fn publish_unlock(&mut self, key: &LockKey);
    /// Tells a holder it lost its hold of `key` (the lost-hold message).
    fn lost(&mut self, key: &LockKey, lost: &Lost);
    /// A campaigning waiter became the leader of `key` in epoch `token`: store the value it
    /// proclaims (if any) and tell the key's observers.
    fn elected(&mut self, key: &LockKey, token: u64, owner: &[u8], value: Option<&[u8]>);
    fn answer(&mut self, handle: H, answer: Answer);
    /// Writes `value` as the one element of the ticket's list, expiring at `expires_at`
    /// (replicated as plain `LPUSH` and `PEXPIREAT`).
    fn push_ticket(&mut self, ticket: &TicketName, value: &[u8], expires_at: UnixMs);
    /// What the ticket's list still holds (None: nothing, it was popped or never written),
    /// removing it (replicated as `DEL`).
    fn take_ticket(&mut self, ticket: &TicketName) -> Option<Vec<u8>>;
    fn note(&mut self, note: Note);
}

/// What a deadline stands for.
#[derive(Debug)]
enum Due {
    /// A waiter's `WAIT` timeout.
    Timeout(WaiterId),
    /// The lease end of a lock with waiters: if the lease ran out, hand off.
    LeaseCheck(LockKey),
    /// Look at a key again (it changed outside the module).
    Recheck(LockKey),
    /// A granted waiter vanished before its reply: free its hold if it still has it.
    Undelivered(GrantRef),
    /// Writes were paused: if the pause ended, do the deferred handoffs; and end the next
    /// tickets of closed connections that own more than a turn ends.
    PauseCheck,
    /// Check some bound holds for ends the module did not see (see [`BINDING_SWEEP_MS`]).
    BindingSweep,
    /// A grant written into a ticket reaches its lease end (see `grant_lapsed`).
    GrantLapsed(TicketName),
}

/// A change noticed outside the module (keyspace and server events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Key(LockKey, Cause),
    Db(i32),
    All,
}

/// One blocked acquire, as the adapter hands it in.
pub struct NewWait<'a, H> {
    pub handle: Handle<H>,
    /// The keys it waits for (one, or the distinct keys of a `LOCK.MACQUIRE`), each with what
    /// the acquire saw there.
    pub keys: &'a [(LockKey, Seen)],
    pub owner: &'a [u8],
    pub lease_ms: u64,
    pub wait: Wait,
    pub mode: Mode,
    /// `ONCE`: a key its owner holds already is not re-entered with a count (multi-key).
    pub reentry: Reentry,
    /// `EPHEMERAL`: the connection a grant is bound to.
    pub bind: Option<ClientId>,
    /// `LOCK.CAMPAIGN`: the grant is announced to the key's observers.
    pub campaign: Option<Campaign>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    Free,
    /// Held; the earliest lease end among its holds.
    Held {
        next_lease_end: Option<UnixMs>,
    },
}

#[derive(Debug)]
pub struct Scheduler<H> {
    queues: WaitQueues<Handle<H>>,
    deadlines: Deadlines<Due>,
    /// Handoffs deferred while writes were paused, with their cause.
    paused: HashMap<LockKey, Cause>,
    /// Connections whose close is finished at the pause check: closed while writes were paused
    /// (their holds end after the pause), or owning more tickets than a turn ends.
    gone_later: Vec<ClientId>,
    pause_check: Option<DeadlineKey>,
    bindings: Bindings,
    /// The next binding sweep, while any hold is bound, and the client it resumes after.
    binding_sweep: Option<DeadlineKey>,
    sweep_after: ClientId,
    /// What this turn of the server's event loop did so far (see `batch::TURN_START_LIMIT`).
    turn: Turn,
    /// Keys with a `Recheck` scheduled: one is enough, however many events asked for it.
    rechecks: HashSet<LockKey>,
    /// A turn that used up its work leaves what is still due to the timer no sooner than this.
    not_before: UnixMs,
    tickets: tickets::TicketBook,
    /// Sweeps run so far (tests wait for one to have run).
    #[cfg(test)]
    sweeps_run: u64,
}

/// The work of one turn of the server's event loop: a command, a firing of the timer, a round
/// of outside changes. Reset when the next one begins.
#[derive(Debug, Default)]
struct Turn {
    /// Handoff batches started.
    batches: usize,
    /// Units of work done (holds read, holds granted).
    spent: usize,
    /// Tickets of closed connections ended (see `tickets::TICKETS_ENDED_PER_TURN`).
    tickets_ended: usize,
}

impl<H> Default for Scheduler<H> {
    fn default() -> Self {
        Scheduler {
            queues: WaitQueues::default(),
            deadlines: Deadlines::default(),
            paused: HashMap::new(),
            gone_later: Vec::new(),
            pause_check: None,
            bindings: Bindings::default(),
            binding_sweep: None,
            sweep_after: 0,
            turn: Turn::default(),
            rechecks: HashSet::new(),
            not_before: 0,
            tickets: tickets::TicketBook::default(),
            #[cfg(test)]
            sweeps_run: 0,
        }
    }
}

impl<H: Copy + Eq + Hash> Scheduler<H> {
    /// Whether `owner` may wait on `key` (checked before the client is blocked). An owner that
    /// already waits there only changes places with itself.
    pub fn has_room(&self, key: &LockKey, owner: &[u8], max_per_key: u64) -> Result<(), LockError> {
        if self.queues.len(key) as u64 >= max_per_key
            && self.queues.queued_owner(key, owner).is_none()
        {
            return Err(LockError::TooManyWaiters { max: max_per_key });
        }
        Ok(())
    }

    /// Queues a blocked client at the tail of its key's queue — of every key's queue at once,
    /// for a multi-key request.
    ///
    /// An owner waits at most once per key. If it already waits (a client that gave up on its
    /// `WAIT` without closing the connection, and asked again), the new request takes the
    /// earlier one's place in the queue, and the earlier one is answered with an error at once,
    /// instead of being granted the lock later on behalf of a caller that has gone. A request
    /// for other keys than the earlier one's cannot take its place (the queues would disagree on
    /// the order): the earlier one is answered the same and the new one queues at the tail.
    pub fn enqueue(
        &mut self,
        port: &mut impl Port<H>,
        new: NewWait<'_, H>,
        max_per_key: u64,
        now: UnixMs,
    ) -> Result<WaiterId, LockError> {
        let ((first, _), rest) = new.keys.split_first().ok_or(LockError::Internal)?;
        let mut earlier: Vec<WaiterId> = new
            .keys
            .iter()
            .filter_map(|(key, _)| self.queues.queued_owner(key, new.owner))
            .collect();
        earlier.sort_unstable();
        earlier.dedup();
        let same_keys = |w: &Waiter<Handle<H>>| {
            w.others.len() == rest.len() && new.keys.iter().all(|(k, _)| w.keys().any(|q| q == k))
        };
        let in_place = match earlier.as_slice() {
            [id] if self.queues.get(*id).is_some_and(same_keys) => Some(*id),
            _ => None,
        };
        let others: Vec<LockKey> = rest.iter().map(|(key, _)| key.clone()).collect();
        let waiter = NewWaiter {
            handle: new.handle,
            key: first,
            others: &others,
            owner: new.owner,
            lease_ms: new.lease_ms,
            mode: new.mode,
            reentry: new.reentry,
            bind: new.bind,
            campaign: new.campaign,
            now,
        };
        let id = match in_place {
            Some(id) => {
                let (old, old_timeout) =
                    self.queues.replace(id, waiter).ok_or(LockError::Internal)?;
                if let Some(timeout) = old_timeout {
                    self.deadlines.remove(timeout);
                }
                port.note(Note::Replaced);
                self.answer(port, old, 0, Answer::Refused(REPLACED.to_string()), now);
                id
            }
            None => {
                for id in earlier {
                    if let Some(old) = self.remove_waiter(id, now) {
                        port.note(Note::Replaced);
                        let reply = Answer::Refused(REPLACED.to_string());
                        self.answer(port, old.handle, old.lease_ms, reply, now);
                    }
                }
                self.queues.push(waiter, max_per_key)?
            }
        };
        self.track_ticket(new.handle);
        if let Wait::For(ms) = new.wait {
            let deadline = self
                .deadlines
                .insert(now.saturating_add(ms), Due::Timeout(id));
            if let Some(w) = self.queues.get_mut(id) {
                w.timeout = Some(deadline);
            }
        }
        for (key, seen) in new.keys {
            match seen {
                Seen::Free => {
                    self.recheck(key.clone(), now);
                }
                Seen::Held { next_lease_end } => {
                    if self.queues.lease_check(key).is_none() {
                        self.schedule_lease_check(key, *next_lease_end, now);
                    }
                }
            }
        }
        Ok(id)
    }

    /// A command freed `key` or part of it (release, force release, a lease end it noticed),
    /// leaving `left` of it: hand the room to the head waiter(s), else publish the unlock when
    /// the key is free.
    pub fn freed(&mut self, port: &mut impl Port<H>, key: &LockKey, left: Left, now: UnixMs) {
        self.turn = Turn::default();
        self.room_made(port, key, left, now, Origin::Command);
    }

    /// Room was made on `key`: hand it to the head waiter(s), else — when nothing is left of
    /// the key — tell its channel it is free. The one place "hand off, else publish" is
    /// decided, for commands and for holds the scheduler ends itself.
    fn room_made(
        &mut self,
        port: &mut impl Port<H>,
        key: &LockKey,
        left: Left,
        now: UnixMs,
        origin: Origin,
    ) {
        if !self.pump(port, key, now, Cause::Freed, origin) && left == Left::Nothing {
            port.publish_unlock(key);
        }
    }

    /// A lease end changed inside a command (renew, re-entry, a new shared hold): the lease
    /// check moves to the key's earliest lease end, so a shorter lease hands off at its own end.
    pub fn lease_changed(&mut self, key: &LockKey, next_lease_end: Option<UnixMs>, now: UnixMs) {
        if self.queues.has_waiters(key) {
            self.schedule_lease_check(key, next_lease_end, now);
        }
    }

    /// A waiter left by itself (disconnect, `CLIENT UNBLOCK`). Returns true if it was still
    /// queued; then the adapter releases its handle.
    pub fn waiter_left(&mut self, port: &mut impl Port<H>, handle: H, now: UnixMs) -> bool {
        let Some(id) = self.queues.id_of(Handle::Blocked(handle)) else {
            return false;
        };
        self.remove_waiter(id, now).is_some_and(|_| {
            port.note(Note::Cancelled);
            true
        })
    }

    /// Removes a waiter from anywhere in its queue. When it was the head, the key is looked at
    /// again (from the timer: this may run where the server forbids writes): shared requests
    /// queued behind a departed exclusive one may fit now.
    fn remove_waiter(&mut self, id: WaiterId, now: UnixMs) -> Option<Waiter<Handle<H>>> {
        let headed = self.headed_keys(id, None);
        let removed = self.queues.remove(id)?;
        let waiter = self.forget(removed);
        self.recheck_heads(headed, now);
        Some(waiter)
    }

    /// The keys (but `except`) whose queue `id` heads: when it leaves, who is behind it there
    /// may fit now.
    fn headed_keys(&self, id: WaiterId, except: Option<&LockKey>) -> Vec<LockKey> {
        let Some(waiter) = self.queues.get(id) else {
            return Vec::new();
        };
        waiter
            .keys()
            .filter(|key| Some(*key) != except && self.queues.heads(key, id))
            .cloned()
            .collect()
    }

    /// Looks at `key` again from the timer at `at` (once, however often this is asked before it
    /// runs).
    fn recheck(&mut self, key: LockKey, at: UnixMs) {
        if !self.rechecks.contains(&key) {
            self.rechecks.insert(key.clone());
            self.deadlines.insert(at, Due::Recheck(key));
        }
    }

    /// Looks again, from the timer, at each of these keys that still has waiters.
    fn recheck_heads(&mut self, keys: Vec<LockKey>, now: UnixMs) {
        for key in keys {
            if self.queues.has_waiters(&key) {
                self.recheck(key, now);
            }
        }
    }

    /// Takes the head waiter of `key` out of every queue it stands in; a multi-key waiter's
    /// other keys are looked at again where it stood first.
    fn take_front(&mut self, key: &LockKey, now: UnixMs) -> Option<Waiter<Handle<H>>> {
        let headed = match self.queues.front(key) {
            Some(head) if head.is_multi() => self.headed_keys(head.id, Some(key)),
            _ => Vec::new(),
        };
        let removed = self.queues.pop_front(key)?;
        let waiter = self.forget(removed);
        self.recheck_heads(headed, now);
        Some(waiter)
    }

    /// A grant's reply could not be delivered (the client vanished first). Handled from the
    /// timer: the server forbids writes where this is learnt.
    pub fn grant_undelivered(&mut self, grant: GrantRef, now: UnixMs) {
        self.deadlines.insert(now, Due::Undelivered(grant));
    }

    /// The timer fired: everything that was due at `now` when it fired. What this turn
    /// schedules for `now` (the rest of a batch that reached its size, a key to look at again)
    /// is left for the next turn of the server's event loop, so that other clients are served
    /// in between: the adapter's next timer fires at once.
    ///
    /// Each deadline handled counts a unit of the turn's work: once the turn has done
    /// [`batch::TURN_START_LIMIT`] units (or granted as many ticket waiters as a turn writes
    /// answers, [`tickets::TICKETS_PER_TURN`]), the deadlines still due wait, in order, for a
    /// turn [`batch::CONTINUE_AFTER_MS`] later, rather than each be looked at only to be put
    /// off again.
    pub fn timer_fired(&mut self, port: &mut impl Port<H>, now: UnixMs) {
        self.turn = Turn::default();
        let mark = self.deadlines.mark();
        while let Some((fired, due)) = self.deadlines.pop_due_until(now, mark) {
            // A lapsed grant is rewritten in its ticket: a write, as a grant is.
            let cost = match due {
                Due::GrantLapsed(_) => batch::GRANT_COST,
                _ => 1,
            };
            self.handle_due(port, fired, due, now);
            self.turn.spent += cost;
            if self.turn_used_up() {
                self.not_before = now.saturating_add(batch::CONTINUE_AFTER_MS);
                break;
            }
        }
    }

    /// Changes noticed outside the module: look at each affected key with waiters once (the
    /// first cause noted for a key wins).
    pub fn keys_changed(&mut self, port: &mut impl Port<H>, changes: Vec<Change>, now: UnixMs) {
        self.turn = Turn::default();
        let mut keys: Vec<(LockKey, Cause)> = Vec::new();
        for change in changes {
            match change {
                Change::Key(key, cause) => keys.push((key, cause)),
                Change::Db(db) => keys.extend(
                    self.queues
                        .keys()
                        .filter(|k| k.db == db)
                        .map(|k| (k.clone(), Cause::Freed)),
                ),
                Change::All => {
                    keys.extend(self.queues.keys().map(|k| (k.clone(), Cause::Freed)));
                }
            }
        }
        let mut seen = HashSet::new();
        for (key, cause) in keys {
            if seen.insert(key.clone()) {
                self.pump(port, &key, now, cause, Origin::Background);
            }
        }
    }

    /// When the adapter's one timer must fire next.
    pub fn next_deadline(&self) -> Option<UnixMs> {
        self.deadlines.next_at().map(|at| at.max(self.not_before))
    }

    /// No waiters, nothing scheduled, no hold bound to a connection and no ticket to write or
    /// watch (the module may be unloaded).
    pub fn is_idle(&self) -> bool {
        self.queues.total() == 0
            && self.deadlines.is_empty()
            && self.bindings.is_empty()
            && self.tickets.is_empty()
    }

    pub fn waiters_on(&self, key: &LockKey) -> usize {
        self.queues.len(key)
    }

    /// (waiters, keys with waiters).
    pub fn gauges(&self) -> (usize, usize) {
        (self.waiting(), self.queues.key_count())
    }

    /// Waiters on all keys (O(1): the adapter mirrors it after every event).
    pub fn waiting(&self) -> usize {
        self.queues.total()
    }

    /// Whether some database has waiters on a key of this name.
    pub fn is_waited_name(&self, name: &[u8]) -> bool {
        self.queues.is_waited_name(name)
    }

    /// Counts and announces the holds whose lease ended on `key` (removed by the write just
    /// made), and tells their holders.
    fn announce_ended(&mut self, port: &mut impl Port<H>, key: &LockKey, ended: &[Hold]) {
        if ended.is_empty() {
            return;
        }
        port.note(Note::LeasesEnded(ended.len()));
        for hold in ended {
            port.lost(key, &Lost::of(hold, LostReason::Expired));
        }
        port.event(key, Event::Expired);
    }

    fn handle_due(&mut self, port: &mut impl Port<H>, fired: DeadlineKey, due: Due, now: UnixMs) {
        match due {
            Due::Timeout(id) => {
                if let Some(waiter) = self.remove_waiter(id, now) {
                    port.note(Note::TimedOut);
                    self.answer(port, waiter.handle, waiter.lease_ms, Answer::TimedOut, now);
                }
            }
            Due::LeaseCheck(key) => {
                // This check fired: it is no longer the key's scheduled one.
                if self.queues.lease_check(&key) == Some(fired) {
                    self.queues.set_lease_check(&key, None);
                }
                self.pump(port, &key, now, Cause::LeaseEnded, Origin::Background);
            }
            Due::Recheck(key) => {
                self.rechecks.remove(&key);
                self.pump(port, &key, now, Cause::Freed, Origin::Background);
            }
            Due::PauseCheck => {
                self.pause_check = None;
                match port.writes() {
                    Writes::Paused => self.arm_pause_check(now),
                    // Promoted to replica during the pause: its master decides now.
                    Writes::Replica => {
                        self.paused.clear();
                        let gone = std::mem::take(&mut self.gone_later);
                        self.end_connections(port, gone, now);
                    }
                    Writes::Allowed => {
                        let gone = std::mem::take(&mut self.gone_later);
                        self.end_connections(port, gone, now);
                        for (key, cause) in std::mem::take(&mut self.paused) {
                            self.pump(port, &key, now, cause, Origin::Background);
                        }
                    }
                }
            }
            Due::Undelivered(grant) => match port.writes() {
                Writes::Paused => {
                    // Freeing it is a write: try again after the pause.
                    self.deadlines
                        .insert(now.saturating_add(PAUSE_POLL_MS), Due::Undelivered(grant));
                }
                Writes::Replica => port.note(Note::AbandonedGrant),
                Writes::Allowed => {
                    port.note(Note::AbandonedGrant);
                    self.abandon(port, &grant, now);
                }
            },
            Due::BindingSweep => self.sweep_bindings(port, now),
            Due::GrantLapsed(name) => self.grant_lapsed(port, name, now),
        }
    }

    /// A grant nobody received (its client vanished, or its ticket's connection closed before
    /// it was popped): its hold ends if it is still exactly that grant, and the room goes on.
    fn abandon(&mut self, port: &mut impl Port<H>, grant: &GrantRef, now: UnixMs) {
        self.unbind(&grant.key, grant.token);
        let ending = HashSet::from([(grant.kind, grant.token)]);
        if let Some((_, left)) = self.end_holds(port, &grant.key, &ending, Ending::Undelivered, now)
        {
            self.room_made(port, &grant.key, left, now, Origin::Background);
        }
    }

    fn defer_while_paused(&mut self, key: &LockKey, cause: Cause, now: UnixMs) {
        let noted = self.paused.entry(key.clone()).or_insert(cause);
        if cause == Cause::LeaseEnded {
            *noted = cause;
        }
        if self.pause_check.is_none() {
            self.arm_pause_check(now);
        }
    }

    fn arm_pause_check(&mut self, now: UnixMs) {
        self.pause_check = Some(
            self.deadlines
                .insert(now.saturating_add(PAUSE_POLL_MS), Due::PauseCheck),
        );
    }

    /// Answers every waiter of `key` with an error (a redirect, or nobody can be granted it).
    fn refuse_all(
        &mut self,
        port: &mut impl Port<H>,
        key: &LockKey,
        reply: &str,
        note: Note,
        now: UnixMs,
    ) {
        while let Some(waiter) = self.take_front(key, now) {
            port.note(note.clone());
            let answer = Answer::Refused(reply.to_string());
            self.answer(port, waiter.handle, waiter.lease_ms, answer, now);
        }
    }

    /// Cancels what a removed waiter had scheduled and returns it.
    fn forget(&mut self, removed: Removed<Handle<H>>) -> Waiter<Handle<H>> {
        if let Some(timeout) = removed.waiter.timeout {
            self.deadlines.remove(timeout);
        }
        for check in removed.orphaned_lease_checks {
            self.deadlines.remove(check);
        }
        removed.waiter
    }

    /// Keeps one lease check per key with waiters, just after the holder's lease end (the
    /// server expires a key once `now > at`). A lease end that already passed while the key is
    /// still there (clients paused, say) is looked at again shortly.
    fn schedule_lease_check(&mut self, key: &LockKey, expires_at: Option<UnixMs>, now: UnixMs) {
        if !self.queues.has_waiters(key) {
            return;
        }
        let check = expires_at.map(|at| {
            let when = if at < now {
                now.saturating_add(OVERDUE_RECHECK_MS)
            } else {
                at.saturating_add(1)
            };
            self.deadlines.insert(when, Due::LeaseCheck(key.clone()))
        });
        if let Some(old) = self.queues.set_lease_check(key, check) {
            self.deadlines.remove(old);
        }
    }
}

mod batch;
mod bindings;
mod multi;
pub mod tickets;

#[cfg(test)]
/// An in-memory server for the scheduler's tests (unit and model-based): keys holding a
/// [`Lock`](crate::hold::Lock) decided by the real rules (`hold::decide`), a clock the test
/// moves, and every effect recorded in order.
mod testing;

#[cfg(test)]
mod tests;

/// Model-based: random sequences of what clients, the clock and the server do, checked against
/// a plain reference model (one FIFO list per key, the holds of each key). Key `a` is a
/// read-write lock (exclusive and shared requests), key `b` a semaphore of 2 permits; some
/// holds are bound to connections that close. Properties: a grant goes only to the
/// longest-waiting waiter still queued; never a writer beside another holder, never more than
/// 2 permits; no waiter is left waiting while the key has room for it (phase-fair runs, no
/// lost wake-up); nothing is written while writes are paused; every waiter is answered exactly
/// once, never after it left, never timed out early; tokens only rise; a closed connection's
/// holds are gone; once everyone is done nothing stays scheduled.
#[cfg(test)]
mod model;

#[cfg(test)]
mod multi_model;

#[cfg(test)]
mod multi_tests;

#[cfg(test)]
mod election_tests;

#[cfg(test)]
mod ticket_tests;
