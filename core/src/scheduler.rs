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

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

use crate::args::Wait;
use crate::binding::{Bindings, ClientId, GrantRef};
use crate::deadlines::{DeadlineKey, Deadlines};
use crate::hold::{self, Decision, HoldKind, Lock, Mode, Run, StoredLock};
use crate::queue::{LockKey, NewWaiter, Removed, WaitQueues, Waiter, WaiterId};
use crate::{LockError, UnixMs};

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

/// Where a run of grants stopped.
enum Stop {
    /// Nobody else fits now (or the queue is empty).
    Held,
    /// Nobody can be granted the key (tokens exhausted): every waiter gets this error.
    Refused(LockError),
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
    fn answer(&mut self, handle: H, answer: Answer);
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
    /// Writes were paused: if the pause ended, do the deferred handoffs.
    PauseCheck,
    /// Check some bound holds for ends the module did not see (see [`BINDING_SWEEP_MS`]).
    BindingSweep,
}

/// A change noticed outside the module (keyspace and server events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Key(LockKey, Cause),
    Db(i32),
    All,
}

/// The holds (kind, token) that exist now on the keys read so far, for pruning bindings.
#[derive(Default)]
struct LiveHolds {
    keys: HashMap<LockKey, HashSet<(HoldKind, u64)>>,
    /// Holds read so far.
    holds_read: usize,
}

impl LiveHolds {
    /// Reads each key of `grants` not read yet (once).
    fn read_keys_of<H>(&mut self, grants: &[GrantRef], port: &mut impl Port<H>, now: UnixMs) {
        for grant in grants {
            if self.keys.contains_key(&grant.key) {
                continue;
            }
            let holds: HashSet<(HoldKind, u64)> = match port.read(&grant.key, false) {
                Read::Lock(Some(stored)) => stored
                    .lock
                    .holds
                    .iter()
                    .filter(|h| h.expires_at.is_none_or(|at| now <= at))
                    .filter_map(|h| h.token.map(|t| (h.kind, t)))
                    .collect(),
                _ => HashSet::new(),
            };
            self.holds_read += holds.len();
            self.keys.insert(grant.key.clone(), holds);
        }
    }

    fn has(&self, grant: &GrantRef) -> bool {
        self.keys
            .get(&grant.key)
            .is_some_and(|holds| holds.contains(&(grant.kind, grant.token)))
    }
}

/// One blocked acquire, as the adapter hands it in.
pub struct NewWait<'a, H> {
    pub handle: H,
    pub key: &'a LockKey,
    pub owner: &'a [u8],
    pub lease_ms: u64,
    pub wait: Wait,
    pub mode: Mode,
    /// `EPHEMERAL`: the connection a grant is bound to.
    pub bind: Option<ClientId>,
    /// What the acquire saw: the lock's lease end, or that it was free (waiters are queued on
    /// a free key only between an outside change and its recheck).
    pub seen: Seen,
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
    queues: WaitQueues<H>,
    deadlines: Deadlines<Due>,
    /// Handoffs deferred while writes were paused, with their cause.
    paused: HashMap<LockKey, Cause>,
    /// Connections that closed while writes were paused: their holds end after the pause.
    gone_while_paused: Vec<ClientId>,
    pause_check: Option<DeadlineKey>,
    bindings: Bindings,
    /// The next binding sweep, while any hold is bound, and the client it resumes after.
    binding_sweep: Option<DeadlineKey>,
    sweep_after: ClientId,
}

impl<H> Default for Scheduler<H> {
    fn default() -> Self {
        Scheduler {
            queues: WaitQueues::default(),
            deadlines: Deadlines::default(),
            paused: HashMap::new(),
            gone_while_paused: Vec::new(),
            pause_check: None,
            bindings: Bindings::default(),
            binding_sweep: None,
            sweep_after: 0,
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

    /// Queues a blocked client at the tail of its key's queue.
    ///
    /// An owner waits at most once per key. If it already waits (a client that gave up on its
    /// `WAIT` without closing the connection, and asked again), the new request takes the
    /// earlier one's place in the queue, and the earlier one is answered with an error at once,
    /// instead of being granted the lock later on behalf of a caller that has gone.
    pub fn enqueue(
        &mut self,
        port: &mut impl Port<H>,
        new: NewWait<'_, H>,
        max_per_key: u64,
        now: UnixMs,
    ) -> Result<WaiterId, LockError> {
        let id = match self.queues.queued_owner(new.key, new.owner) {
            Some(id) => {
                let (old, old_timeout) = self
                    .queues
                    .replace(id, new.handle, new.lease_ms, new.mode, new.bind)
                    .ok_or(LockError::Internal)?;
                if let Some(timeout) = old_timeout {
                    self.deadlines.remove(timeout);
                }
                port.note(Note::Replaced);
                port.answer(old, Answer::Refused(REPLACED.to_string()));
                id
            }
            None => self.queues.push(
                NewWaiter {
                    handle: new.handle,
                    key: new.key,
                    owner: new.owner,
                    lease_ms: new.lease_ms,
                    mode: new.mode,
                    bind: new.bind,
                    now,
                },
                max_per_key,
            )?,
        };
        if let Wait::For(ms) = new.wait {
            let deadline = self
                .deadlines
                .insert(now.saturating_add(ms), Due::Timeout(id));
            if let Some(w) = self.queues.get_mut(id) {
                w.timeout = Some(deadline);
            }
        }
        match new.seen {
            Seen::Free => {
                self.deadlines.insert(now, Due::Recheck(new.key.clone()));
            }
            Seen::Held { next_lease_end } => {
                if self.queues.lease_check(new.key).is_none() {
                    self.schedule_lease_check(new.key, next_lease_end, now);
                }
            }
        }
        Ok(id)
    }

    /// A command freed `key` or part of it (release, force release, a lease end it noticed):
    /// hand it to the head waiter(s). Returns whether it did; if not, and the key is free, the
    /// caller publishes the unlock.
    pub fn freed(&mut self, port: &mut impl Port<H>, key: &LockKey, now: UnixMs) -> bool {
        self.pump(port, key, now, Cause::Freed, Origin::Command)
    }

    /// A lease end changed inside a command (renew, re-entry, a new shared hold): the lease
    /// check moves to the key's earliest lease end, so a shorter lease hands off at its own end.
    pub fn lease_changed(&mut self, key: &LockKey, next_lease_end: Option<UnixMs>, now: UnixMs) {
        if self.queues.has_waiters(key) {
            self.schedule_lease_check(key, next_lease_end, now);
        }
    }

    /// A grant (by a command or to a waiter) of an `EPHEMERAL` hold to `client`: it ends when
    /// that connection closes. When the connection's list has grown, first checks which of its
    /// holds still exist (holds also end by DEL, lease ends, FORCERELEASE); keeps the sweep armed.
    pub fn bind(
        &mut self,
        port: &mut impl Port<H>,
        client: ClientId,
        key: &LockKey,
        kind: HoldKind,
        token: u64,
        now: UnixMs,
    ) {
        if self.bindings.bind(client, key, kind, token) {
            self.prune_bindings(port, client, now);
        }
        if self.binding_sweep.is_none() {
            self.binding_sweep = Some(
                self.deadlines
                    .insert(now.saturating_add(BINDING_SWEEP_MS), Due::BindingSweep),
            );
        }
    }

    /// Forgets the bindings of `client`'s holds that no longer exist: each key it holds is read
    /// once, however many of its holds are there.
    fn prune_bindings(&mut self, port: &mut impl Port<H>, client: ClientId, now: UnixMs) {
        let mut live = LiveHolds::default();
        live.read_keys_of(&self.bindings.grants_of(client), port, now);
        self.prune_with(client, &live);
    }

    fn prune_with(&mut self, client: ClientId, live: &LiveHolds) {
        self.bindings.prune(client, |grant| live.has(grant));
        self.stop_idle_sweep();
    }

    /// Checks the bound holds of the next connections (round robin) and forgets those whose hold
    /// ended unseen. Each key is read once per sweep however many connections hold it, within
    /// [`BINDING_SWEEP_BINDINGS`] and [`BINDING_SWEEP_HOLDS_READ`].
    fn sweep_bindings(&mut self, port: &mut impl Port<H>, now: UnixMs) {
        let (clients, _) = self
            .bindings
            .clients_after(self.sweep_after, BINDING_SWEEP_BINDINGS);
        let mut live = LiveHolds::default();
        let mut swept = Vec::new();
        let mut checked = 0;
        for client in clients {
            let grants = self.bindings.grants_of(client);
            let needs_read = grants.iter().any(|g| !live.keys.contains_key(&g.key));
            let full = checked + grants.len() > BINDING_SWEEP_BINDINGS
                || (needs_read && live.holds_read >= BINDING_SWEEP_HOLDS_READ);
            if full && !swept.is_empty() {
                break;
            }
            live.read_keys_of(&grants, port, now);
            checked += grants.len();
            swept.push(client);
        }
        for &client in &swept {
            self.prune_with(client, &live);
        }
        self.sweep_after = swept.last().copied().unwrap_or(0);
        self.binding_sweep = (!self.bindings.is_empty()).then(|| {
            self.deadlines
                .insert(now.saturating_add(BINDING_SWEEP_MS), Due::BindingSweep)
        });
    }

    /// The owner ended a hold itself (its last release, a FORCERELEASE): forget its binding.
    pub fn unbind(&mut self, key: &LockKey, token: u64) {
        if !self.bindings.is_empty() {
            self.bindings.unbind(key, token);
            self.stop_idle_sweep();
        }
    }

    /// Once no hold is bound, the sweep stops (an idle module keeps no timer: MODULE UNLOAD).
    fn stop_idle_sweep(&mut self) {
        if self.bindings.is_empty() {
            if let Some(sweep) = self.binding_sweep.take() {
                self.deadlines.remove(sweep);
            }
        }
    }

    /// The connection a hold (named by its key and token) is bound to, if any.
    pub fn bound_client(&self, key: &LockKey, token: u64) -> Option<ClientId> {
        if self.bindings.is_empty() {
            return None;
        }
        self.bindings.client_of(key, token)
    }

    /// The server became a replica: no connection of it binds a hold any more (its master's
    /// effects end the holds), and a later promotion must not revive the bindings.
    pub fn forget_bindings(&mut self) {
        self.bindings.clear();
        self.gone_while_paused.clear();
        self.stop_idle_sweep();
    }

    /// `SWAPDB a b`: bound holds follow their keys.
    pub fn swap_databases(&mut self, a: i32, b: i32) {
        self.bindings.swap_databases(a, b);
    }

    /// `MOVE`/`RENAME` took `from` (holding these tokens) to `to`: bound holds follow it.
    pub fn key_moved(&mut self, from: &LockKey, to: &LockKey, tokens: &[u64]) {
        if !self.bindings.is_empty() {
            self.bindings.moved(from, to, tokens);
        }
    }

    /// `FLUSHDB` (Some) or `FLUSHALL` (None): the holds there are gone, with their bindings.
    pub fn flushed(&mut self, db: Option<i32>) {
        if !self.bindings.is_empty() {
            self.bindings.flushed(db);
            self.stop_idle_sweep();
        }
    }

    /// Holds bound to connections (INFO).
    pub fn bound_holds(&self) -> usize {
        self.bindings.len()
    }

    /// Connections closed: every hold bound to them ends now (all re-entries), and each key goes
    /// to its waiters as after a release. Each key is read and written once, however many of
    /// its holds end. While writes are paused this happens after the pause.
    pub fn clients_gone(&mut self, port: &mut impl Port<H>, clients: Vec<ClientId>, now: UnixMs) {
        let mut clients = clients;
        clients.retain(|c| self.bindings.holds_of(*c) > 0);
        if clients.is_empty() {
            return;
        }
        match port.writes() {
            Writes::Allowed => {}
            // A replica's holds end with its master's effects; nothing is bound here anyway.
            Writes::Replica => {
                for client in clients {
                    self.bindings.take_client(client);
                }
                self.stop_idle_sweep();
                return;
            }
            Writes::Paused => {
                self.gone_while_paused.extend(clients);
                if self.pause_check.is_none() {
                    self.arm_pause_check(now);
                }
                return;
            }
        }
        let mut keys: Vec<(LockKey, HashSet<(HoldKind, u64)>)> = Vec::new();
        let mut at: HashMap<LockKey, usize> = HashMap::new();
        let grants: Vec<GrantRef> = clients
            .into_iter()
            .flat_map(|client| self.bindings.take_client(client))
            .collect();
        self.stop_idle_sweep();
        for grant in grants {
            {
                let i = *at.entry(grant.key.clone()).or_insert_with(|| {
                    keys.push((grant.key.clone(), HashSet::new()));
                    keys.len() - 1
                });
                if let Some((_, ending)) = keys.get_mut(i) {
                    ending.insert((grant.kind, grant.token));
                }
            }
        }
        for (key, ending) in keys {
            let Some((removed, free)) =
                self.end_holds(port, &key, &ending, Ending::ConnectionClosed, now)
            else {
                continue;
            };
            for _ in 0..removed {
                port.event(&key, Event::Disconnected);
                port.note(Note::Disconnected { key: key.clone() });
            }
            if !self.pump(port, &key, now, Cause::Freed, Origin::Background) && free {
                port.publish_unlock(&key);
            }
        }
    }

    /// Ends the named holds of one key in one read and one write. Returns how many ended and
    /// whether the key is free; None when none of them was there any more.
    fn end_holds(
        &mut self,
        port: &mut impl Port<H>,
        key: &LockKey,
        ending: &HashSet<(HoldKind, u64)>,
        why: Ending,
        now: UnixMs,
    ) -> Option<(usize, bool)> {
        let Read::Lock(Some(stored)) = port.read(key, false) else {
            return None;
        };
        let mut lock = stored.lock.clone();
        lock.drop_ended(now);
        let removed = hold::remove_holds(&mut lock, ending, why == Ending::ConnectionClosed);
        if removed == 0 {
            return None;
        }
        port.write(key, Some(&stored), &lock).ok()?;
        Some((removed, lock.holds.is_empty()))
    }

    /// A waiter left by itself (disconnect, `CLIENT UNBLOCK`). Returns true if it was still
    /// queued; then the adapter releases its handle.
    pub fn waiter_left(&mut self, port: &mut impl Port<H>, handle: H, now: UnixMs) -> bool {
        let Some(id) = self.queues.id_of(handle) else {
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
    fn remove_waiter(&mut self, id: WaiterId, now: UnixMs) -> Option<Waiter<H>> {
        let key = self.queues.get(id)?.key.clone();
        let was_head = self.queues.front(&key).map(|w| w.id) == Some(id);
        let removed = self.queues.remove(id)?;
        let waiter = self.forget(removed);
        if was_head && self.queues.has_waiters(&key) {
            self.deadlines.insert(now, Due::Recheck(key));
        }
        Some(waiter)
    }

    /// A grant's reply could not be delivered (the client vanished first). Handled from the
    /// timer: the server forbids writes where this is learnt.
    pub fn grant_undelivered(&mut self, grant: GrantRef, now: UnixMs) {
        self.deadlines.insert(now, Due::Undelivered(grant));
    }

    /// The timer fired: everything due at `now`.
    pub fn timer_fired(&mut self, port: &mut impl Port<H>, now: UnixMs) {
        while let Some((fired, due)) = self.deadlines.pop_due(now) {
            self.handle_due(port, fired, due, now);
        }
    }

    /// Changes noticed outside the module: look at each affected key with waiters once (the
    /// first cause noted for a key wins).
    pub fn keys_changed(&mut self, port: &mut impl Port<H>, changes: Vec<Change>, now: UnixMs) {
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
        self.deadlines.next_at()
    }

    /// No waiters, nothing scheduled and no hold bound to a connection (the module may be
    /// unloaded).
    pub fn is_idle(&self) -> bool {
        self.queues.total() == 0 && self.deadlines.is_empty() && self.bindings.is_empty()
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

    /// Gives the key to its head waiter if it has room; after a shared grant, to every shared
    /// waiter behind it up to the next exclusive one, and after a permit, to the next waiters
    /// while permits are free. The whole run is decided on one read of the key (holds whose
    /// lease ended go first) and written once. Returns whether anyone was granted.
    fn pump(
        &mut self,
        port: &mut impl Port<H>,
        key: &LockKey,
        now: UnixMs,
        cause: Cause,
        origin: Origin,
    ) -> bool {
        if !self.queues.has_waiters(key) {
            return false;
        }
        match port.writes() {
            Writes::Allowed => {}
            Writes::Replica => return false,
            Writes::Paused => {
                self.defer_while_paused(key, cause, now);
                return false;
            }
        }
        let stored = match port.read(key, origin == Origin::Background) {
            Read::Lock(stored) => stored,
            Read::NotALock { expires_at } => {
                self.schedule_lease_check(key, expires_at, now);
                return false;
            }
            Read::Moved(redirect) => {
                self.refuse_all(port, key, &redirect, Note::Redirected);
                return false;
            }
        };
        let mut lock = stored.as_ref().map_or_else(Lock::free, |s| s.lock.clone());
        let ended = lock.drop_ended(now);
        let mut run = Run::new(lock);
        let mut granted: Vec<(Waiter<H>, u64, HoldKind)> = Vec::new();
        let mut stop = Stop::Held;
        while let Some(head) = self.queues.front(key) {
            let mode = head.mode;
            let decision = run.decide(&head.owner, mode, head.lease_ms, now);
            let grant = match decision {
                Err(error) => {
                    if let Some(removed) = self.queues.pop_front(key) {
                        let waiter = self.forget(removed);
                        port.note(Note::Mismatched);
                        port.answer(waiter.handle, Answer::Refused(error.reply()));
                    }
                    continue;
                }
                Ok(Decision::Busy) => break,
                Ok(Decision::Grant(grant)) => grant,
            };
            let token = match grant.token {
                Some(token) => token,
                None => match port.next_token(key, now) {
                    Ok(token) => token,
                    Err(error) => {
                        stop = Stop::Refused(error);
                        break;
                    }
                },
            };
            run.apply(&head.owner, mode, &grant, token);
            let Some(removed) = self.queues.pop_front(key) else {
                break;
            };
            granted.push((self.forget(removed), token, mode.kind()));
            let next_may_follow = matches!(
                (mode, self.queues.front(key).map(|w| w.mode)),
                (Mode::Shared, Some(Mode::Shared)) | (Mode::Limit(_), Some(Mode::Limit(_)))
            );
            if !next_may_follow {
                break;
            }
        }
        if !granted.is_empty() || ended > 0 {
            if let Err(error) = port.write(key, stored.as_ref(), run.lock()) {
                // Nothing was written: nobody got the key, and nobody can now.
                let reply = error.reply();
                for (waiter, ..) in granted {
                    port.note(Note::Refused);
                    port.answer(waiter.handle, Answer::Refused(reply.clone()));
                }
                self.refuse_all(port, key, &reply, Note::Refused);
                return false;
            }
        }
        if ended > 0 {
            port.note(Note::LeasesEnded(ended));
        }
        // Where the server reports every key expiry, a lease end that freed the key was
        // announced then; the end of one hold of several only the module sees.
        let key_expired =
            !granted.is_empty() && cause == Cause::LeaseEnded && !port.reports_expiries();
        if ended > 0 || key_expired {
            port.event(key, Event::Expired);
        }
        let granted_any = !granted.is_empty();
        let mut cause = cause;
        for (waiter, token, kind) in granted {
            port.event(key, Event::Handoff);
            if cause == Cause::LeaseEnded {
                port.note(Note::ExpiredWithWaiters { key: key.clone() });
                // One lease end, noted once however many it lets in.
                cause = Cause::Freed;
            }
            port.note(Note::HandedOff {
                key: key.clone(),
                waited_ms: now.saturating_sub(waiter.enqueued_at),
            });
            if let Some(client) = waiter.bind {
                self.bind(port, client, key, kind, token, now);
            }
            port.answer(
                waiter.handle,
                Answer::Granted {
                    token,
                    key: key.clone(),
                    owner: waiter.owner,
                    kind,
                },
            );
        }
        match stop {
            Stop::Refused(error) => self.refuse_all(port, key, &error.reply(), Note::Refused),
            Stop::Held => self.schedule_lease_check(key, run.lock().next_lease_end(), now),
        }
        granted_any
    }

    fn handle_due(&mut self, port: &mut impl Port<H>, fired: DeadlineKey, due: Due, now: UnixMs) {
        match due {
            Due::Timeout(id) => {
                if let Some(waiter) = self.remove_waiter(id, now) {
                    port.note(Note::TimedOut);
                    port.answer(waiter.handle, Answer::TimedOut);
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
                self.pump(port, &key, now, Cause::Freed, Origin::Background);
            }
            Due::PauseCheck => {
                self.pause_check = None;
                match port.writes() {
                    Writes::Paused => self.arm_pause_check(now),
                    // Promoted to replica during the pause: its master decides now.
                    Writes::Replica => {
                        self.paused.clear();
                        let gone = std::mem::take(&mut self.gone_while_paused);
                        self.clients_gone(port, gone, now);
                    }
                    Writes::Allowed => {
                        let gone = std::mem::take(&mut self.gone_while_paused);
                        self.clients_gone(port, gone, now);
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
                    self.unbind(&grant.key, grant.token);
                    let ending = HashSet::from([(grant.kind, grant.token)]);
                    if let Some((_, free)) =
                        self.end_holds(port, &grant.key, &ending, Ending::Undelivered, now)
                    {
                        if !self.pump(port, &grant.key, now, Cause::Freed, Origin::Background)
                            && free
                        {
                            port.publish_unlock(&grant.key);
                        }
                    }
                }
            },
            Due::BindingSweep => self.sweep_bindings(port, now),
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
    fn refuse_all(&mut self, port: &mut impl Port<H>, key: &LockKey, reply: &str, note: Note) {
        while let Some(removed) = self.queues.pop_front(key) {
            let waiter = self.forget(removed);
            port.note(note.clone());
            port.answer(waiter.handle, Answer::Refused(reply.to_string()));
        }
    }

    /// Cancels what a removed waiter had scheduled and returns it.
    fn forget(&mut self, removed: Removed<H>) -> Waiter<H> {
        if let Some(timeout) = removed.waiter.timeout {
            self.deadlines.remove(timeout);
        }
        if let Some(check) = removed.orphaned_lease_check {
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

/// An in-memory server for the scheduler's tests (unit and model-based): keys holding a
/// [`Lock`](crate::hold::Lock) decided by the real rules (`hold::decide`), a clock the test
/// moves, and every effect recorded in order.
#[cfg(test)]
mod testing {
    use super::*;
    use crate::args::Reentry;
    use crate::hold::{self, Decision, Lock};
    use crate::state::Queue;

    #[derive(Debug, Clone, PartialEq, Eq)]
    pub enum Effect {
        Wrote {
            key: LockKey,
            owner: Vec<u8>,
            token: u64,
            expires_at: UnixMs,
        },
        /// A hold (named by its token) was removed by a write.
        Removed {
            key: LockKey,
            token: u64,
        },
        Published {
            key: LockKey,
        },
        Answered {
            handle: u32,
            answer: Answer,
            at: UnixMs,
        },
        Noted(Note),
    }

    pub struct FakePort {
        pub now: UnixMs,
        pub writes: Writes,
        pub keys: HashMap<LockKey, Lock>,
        /// Keys whose slot left this node, with the redirect.
        pub moved: HashMap<LockKey, String>,
        pub tokens_exhausted: bool,
        pub last_token: u64,
        pub effects: Vec<Effect>,
    }

    impl Default for FakePort {
        fn default() -> Self {
            FakePort {
                now: 1_000,
                writes: Writes::Allowed,
                keys: HashMap::new(),
                moved: HashMap::new(),
                tokens_exhausted: false,
                last_token: 0,
                effects: Vec::new(),
            }
        }
    }

    impl FakePort {
        /// The key's lock with its ended holds gone (as a write lookup leaves it; while writes
        /// are paused nothing is removed, as in Redis). None when nothing is held.
        pub fn lock(&mut self, key: &LockKey) -> Option<&Lock> {
            if self.writes != Writes::Paused {
                let now = self.now;
                let empty = self.keys.get_mut(key).is_some_and(|l| {
                    l.drop_ended(now);
                    l.holds.is_empty()
                });
                if empty {
                    self.keys.remove(key);
                }
            }
            self.keys.get(key)
        }

        pub fn answers(&self) -> Vec<(u32, Answer)> {
            self.answers_at()
                .into_iter()
                .map(|(h, a, _)| (h, a))
                .collect()
        }

        /// Every answer with the time it was given.
        pub fn answers_at(&self) -> Vec<(u32, Answer, UnixMs)> {
            self.effects
                .iter()
                .filter_map(|e| match e {
                    Effect::Answered { handle, answer, at } => Some((*handle, answer.clone(), *at)),
                    _ => None,
                })
                .collect()
        }

        /// A client's own acquire (no wait), with the real rules: no barging past `waiting`.
        pub fn acquire(
            &mut self,
            key: &LockKey,
            owner: &str,
            mode: Mode,
            lease_ms: u64,
            waiting: bool,
        ) -> Result<Option<u64>, LockError> {
            let now = self.now;
            let lock = self.lock(key).cloned().unwrap_or_else(Lock::free);
            let queue = if waiting {
                Queue::Waiting
            } else {
                Queue::Empty
            };
            match hold::decide(
                &lock,
                owner.as_bytes(),
                mode,
                lease_ms,
                Reentry::Counted,
                queue,
                now,
            )? {
                Decision::Busy => Ok(None),
                Decision::Grant(g) => {
                    self.last_token += 1;
                    let token = g.token.unwrap_or(self.last_token);
                    let new = hold::apply(&lock, owner.as_bytes(), mode, &g, self.last_token);
                    self.keys.insert(key.clone(), new);
                    Ok(Some(token))
                }
            }
        }
    }

    impl Port<u32> for FakePort {
        fn writes(&self) -> Writes {
            self.writes
        }

        fn read(&mut self, key: &LockKey, check_route: bool) -> Read {
            let lock = self.lock(key).cloned();
            match lock {
                None => match self.moved.get(key) {
                    Some(redirect) if check_route => Read::Moved(redirect.clone()),
                    _ => Read::Lock(None),
                },
                Some(lock) => Read::Lock(Some(StoredLock {
                    expires_at: lock.last_lease_end(),
                    lock,
                })),
            }
        }

        fn write(
            &mut self,
            key: &LockKey,
            old: Option<&StoredLock>,
            new: &Lock,
        ) -> Result<(), LockError> {
            assert_eq!(
                self.writes,
                Writes::Allowed,
                "a write while writes are not allowed"
            );
            assert_eq!(
                old.map(|o| &o.lock),
                self.keys.get(key),
                "a write of a lock that changed since it was read"
            );
            let before = old.map(|o| o.lock.holds.as_slice()).unwrap_or_default();
            for hold in &new.holds {
                if !before.contains(hold) {
                    self.effects.push(Effect::Wrote {
                        key: key.clone(),
                        owner: hold.owner.clone(),
                        token: hold.token.unwrap_or_default(),
                        expires_at: hold.expires_at.unwrap_or_default(),
                    });
                }
            }
            for hold in before {
                let kept = new
                    .holds
                    .iter()
                    .any(|h| h.kind == hold.kind && h.owner == hold.owner);
                if !kept {
                    self.effects.push(Effect::Removed {
                        key: key.clone(),
                        token: hold.token.unwrap_or_default(),
                    });
                }
            }
            if new.holds.is_empty() {
                self.keys.remove(key);
            } else {
                self.keys.insert(key.clone(), new.clone());
            }
            Ok(())
        }

        fn next_token(&mut self, _key: &LockKey, _now: UnixMs) -> Result<u64, LockError> {
            if self.tokens_exhausted {
                return Err(LockError::TokensExhausted);
            }
            self.last_token += 1;
            Ok(self.last_token)
        }

        fn reports_expiries(&self) -> bool {
            false
        }

        fn event(&mut self, _key: &LockKey, _event: Event) {}

        fn publish_unlock(&mut self, key: &LockKey) {
            self.effects.push(Effect::Published { key: key.clone() });
        }

        fn answer(&mut self, handle: u32, answer: Answer) {
            let at = self.now;
            self.effects.push(Effect::Answered { handle, answer, at });
        }

        fn note(&mut self, note: Note) {
            self.effects.push(Effect::Noted(note));
        }
    }

    /// The adapter's side of the loop, for tests: queue a blocked exclusive acquire as the
    /// command would.
    pub fn wait(
        s: &mut Scheduler<u32>,
        port: &mut FakePort,
        handle: u32,
        key: &LockKey,
        owner: &str,
        lease_ms: u64,
        wait: Wait,
    ) -> Result<WaiterId, LockError> {
        wait_as(
            s,
            port,
            handle,
            key,
            owner,
            Mode::Exclusive,
            lease_ms,
            wait,
            None,
        )
    }

    /// As [`wait`], for any mode, optionally bound to a connection.
    #[allow(clippy::too_many_arguments)]
    pub fn wait_as(
        s: &mut Scheduler<u32>,
        port: &mut FakePort,
        handle: u32,
        key: &LockKey,
        owner: &str,
        mode: Mode,
        lease_ms: u64,
        wait: Wait,
        bind: Option<ClientId>,
    ) -> Result<WaiterId, LockError> {
        let now = port.now;
        let seen = match port.lock(key) {
            None => Seen::Free,
            Some(l) => Seen::Held {
                next_lease_end: l.next_lease_end(),
            },
        };
        s.enqueue(
            port,
            NewWait {
                handle,
                key,
                owner: owner.as_bytes(),
                lease_ms,
                wait,
                mode,
                bind,
                seen,
            },
            100_000,
            now,
        )
    }

    /// Moves the clock to `to`, firing the one timer at each deadline on the way, as the
    /// adapter's precise module timer does.
    pub fn advance_to(s: &mut Scheduler<u32>, port: &mut FakePort, to: UnixMs) {
        while let Some(at) = s.next_deadline().filter(|at| *at <= to) {
            port.now = port.now.max(at);
            s.timer_fired(port, port.now);
        }
        port.now = port.now.max(to);
    }

    /// A release of the whole key inside a command: delete, then hand off or publish.
    pub fn release(s: &mut Scheduler<u32>, port: &mut FakePort, key: &LockKey) {
        port.keys.remove(key);
        let now = port.now;
        if !s.freed(port, key, now) {
            port.publish_unlock(key);
        }
    }

    /// One owner's release inside a command, with the real rule (`hold::release`).
    pub fn release_owner(s: &mut Scheduler<u32>, port: &mut FakePort, key: &LockKey, owner: &[u8]) {
        let Some(lock) = port.lock(key).cloned() else {
            return;
        };
        let Some((new, _)) = hold::release(&lock, owner) else {
            return;
        };
        let free = new.holds.is_empty();
        if free {
            port.keys.remove(key);
        } else {
            port.keys.insert(key.clone(), new);
        }
        let now = port.now;
        if !s.freed(port, key, now) && free {
            port.publish_unlock(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;
    use crate::hold::{Family, Hold, Lock};

    fn key(name: &str) -> LockKey {
        LockKey::new(0, name.as_bytes())
    }

    fn granted(token: u64, k: &LockKey, owner: &str) -> Answer {
        granted_as(token, k, owner, HoldKind::Exclusive)
    }

    fn granted_as(token: u64, k: &LockKey, owner: &str, kind: HoldKind) -> Answer {
        Answer::Granted {
            token,
            key: k.clone(),
            owner: owner.as_bytes().into(),
            kind,
        }
    }

    fn undelivered(k: &LockKey, token: u64) -> GrantRef {
        GrantRef {
            key: k.clone(),
            kind: HoldKind::Exclusive,
            token,
        }
    }

    /// The lease end of the key's only hold.
    fn lease_end(port: &FakePort, k: &LockKey) -> Option<UnixMs> {
        port.keys[k].holds[0].expires_at
    }

    fn set_lease_end(port: &mut FakePort, k: &LockKey, at: Option<UnixMs>) {
        port.keys.get_mut(k).unwrap().holds[0].expires_at = at;
    }

    /// A lock held by `owner` until `expires_at`, as a client's acquire leaves it.
    fn hold(port: &mut FakePort, k: &LockKey, owner: &str, expires_at: UnixMs) {
        port.last_token += 1;
        port.keys.insert(
            k.clone(),
            Lock {
                family: Family::ReadWrite,
                holds: vec![Hold {
                    owner: owner.as_bytes().to_vec(),
                    kind: HoldKind::Exclusive,
                    count: 1,
                    expires_at: Some(expires_at),
                    token: Some(port.last_token),
                }],
            },
        );
    }

    fn setup() -> (Scheduler<u32>, FakePort, LockKey) {
        let mut port = FakePort::default();
        let k = key("k");
        hold(&mut port, &k, "holder", 61_000);
        (Scheduler::default(), port, k)
    }

    #[test]
    fn a_release_hands_over_to_the_head_waiter_in_arrival_order() {
        let (mut s, mut port, k) = setup();
        for h in 1..=3 {
            wait(
                &mut s,
                &mut port,
                h,
                &k,
                &format!("w{h}"),
                5_000,
                Wait::Forever,
            )
            .unwrap();
        }
        release(&mut s, &mut port, &k);
        release(&mut s, &mut port, &k);
        release(&mut s, &mut port, &k);
        release(&mut s, &mut port, &k);
        assert_eq!(
            port.answers(),
            [
                (1, granted(2, &k, "w1")),
                (2, granted(3, &k, "w2")),
                (3, granted(4, &k, "w3")),
            ]
        );
        // Exactly one wake-up per release, and the last release (nobody waits) publishes.
        assert_eq!(
            port.effects.last(),
            Some(&Effect::Published { key: k.clone() })
        );
    }

    #[test]
    fn a_lease_end_hands_off_just_after_it_and_is_noted_as_lost() {
        let (mut s, mut port, k) = setup();
        wait(&mut s, &mut port, 1, &k, "w", 5_000, Wait::Forever).unwrap();
        assert_eq!(
            s.next_deadline(),
            Some(61_001),
            "checked at lease end + 1 ms"
        );
        advance_to(&mut s, &mut port, 61_000);
        assert!(port.answers().is_empty(), "not before the lease ends");
        advance_to(&mut s, &mut port, 61_001);
        assert_eq!(port.answers(), [(1, granted(2, &k, "w"))]);
        assert!(port
            .effects
            .contains(&Effect::Noted(Note::ExpiredWithWaiters { key: k.clone() })));
        // The new holder's lease starts at the handoff.
        assert_eq!(lease_end(&port, &k), Some(66_001));
    }

    #[test]
    fn a_renewed_lease_moves_the_check_later_and_a_shortened_one_earlier() {
        let (mut s, mut port, k) = setup();
        wait(&mut s, &mut port, 1, &k, "w", 5_000, Wait::Forever).unwrap();
        // Renewed further: the early check finds the key held and re-arms for the new end.
        set_lease_end(&mut port, &k, Some(90_000));
        advance_to(&mut s, &mut port, 61_001);
        assert!(port.answers().is_empty());
        assert_eq!(s.next_deadline(), Some(90_001));
        // Shortened: the check moves to the new end at once.
        set_lease_end(&mut port, &k, Some(62_000));
        s.lease_changed(&k, Some(62_000), port.now);
        assert_eq!(s.next_deadline(), Some(62_001));
        advance_to(&mut s, &mut port, 62_001);
        assert_eq!(port.answers(), [(1, granted(2, &k, "w"))]);
    }

    #[test]
    fn wait_timeouts_answer_nil_on_time_and_leave_the_rest_of_the_queue() {
        let (mut s, mut port, k) = setup();
        wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::For(100)).unwrap();
        wait(&mut s, &mut port, 2, &k, "b", 5_000, Wait::For(50_000)).unwrap();
        advance_to(&mut s, &mut port, 1_099);
        assert!(port.answers().is_empty());
        advance_to(&mut s, &mut port, 1_100);
        assert_eq!(port.answers(), [(1, Answer::TimedOut)]);
        release(&mut s, &mut port, &k);
        assert_eq!(port.answers()[1], (2, granted(2, &k, "b")));
        // Its timeout was cancelled with the grant.
        advance_to(&mut s, &mut port, 60_000);
        assert_eq!(port.answers().len(), 2);
    }

    #[test]
    fn a_waiter_that_left_is_skipped_and_its_deadlines_cancelled() {
        let (mut s, mut port, k) = setup();
        wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::For(100)).unwrap();
        wait(&mut s, &mut port, 2, &k, "b", 5_000, Wait::Forever).unwrap();
        assert!(s.waiter_left(&mut port, 1, 1_000));
        assert!(!s.waiter_left(&mut port, 1, 1_000), "only once");
        release(&mut s, &mut port, &k);
        assert_eq!(port.answers(), [(2, granted(2, &k, "b"))]);
        // Once the last waiter is gone, nothing is left scheduled: the module can unload.
        assert!(!s.waiter_left(&mut port, 99, 1_000));
        release(&mut s, &mut port, &k);
        advance_to(&mut s, &mut port, 1_000_000);
        assert!(s.is_idle());
    }

    #[test]
    fn an_undelivered_grant_goes_to_the_next_waiter_or_frees_the_key() {
        let (mut s, mut port, k) = setup();
        wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::Forever).unwrap();
        wait(&mut s, &mut port, 2, &k, "b", 5_000, Wait::Forever).unwrap();
        release(&mut s, &mut port, &k);
        assert_eq!(port.answers(), [(1, granted(2, &k, "a"))]);
        // Client 1 vanished before its reply: the server says so from its free callback.
        s.grant_undelivered(undelivered(&k, 2), port.now);
        let now = port.now;
        advance_to(&mut s, &mut port, now);
        assert!(port.effects.contains(&Effect::Removed {
            key: k.clone(),
            token: 2
        }));
        assert_eq!(port.answers()[1], (2, granted(3, &k, "b")));
        // The same for b: nobody waits now, so the key is freed and the unlock published.
        s.grant_undelivered(undelivered(&k, 3), port.now);
        advance_to(&mut s, &mut port, now);
        assert!(!port.keys.contains_key(&k));
        assert_eq!(
            port.effects.last(),
            Some(&Effect::Published { key: k.clone() })
        );
        // A grant the holder already released (or re-entered) is left alone.
        hold(&mut port, &k, "c", 99_000);
        s.grant_undelivered(undelivered(&k, 3), port.now);
        advance_to(&mut s, &mut port, now);
        assert_eq!(port.keys[&k].holds[0].owner, b"c");
    }

    #[test]
    fn outside_changes_hand_off_once_per_key() {
        let (mut s, mut port, k) = setup();
        let other = LockKey::new(1, b"k");
        hold(&mut port, &other, "x", 61_000);
        wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::Forever).unwrap();
        wait(&mut s, &mut port, 2, &other, "b", 5_000, Wait::Forever).unwrap();
        // DEL k in db 0, noticed twice.
        port.keys.remove(&k);
        let now = port.now;
        s.keys_changed(
            &mut port,
            vec![
                Change::Key(k.clone(), Cause::Freed),
                Change::Key(k.clone(), Cause::Freed),
            ],
            now,
        );
        assert_eq!(port.answers(), [(1, granted(3, &k, "a"))]);
        // FLUSHDB 1.
        port.keys.remove(&other);
        s.keys_changed(&mut port, vec![Change::Db(1)], now);
        assert_eq!(port.answers()[1], (2, granted(4, &other, "b")));
    }

    #[test]
    fn nothing_is_written_while_writes_are_paused_and_handoffs_follow_the_pause() {
        let (mut s, mut port, k) = setup();
        wait(&mut s, &mut port, 1, &k, "w", 5_000, Wait::Forever).unwrap();
        wait(&mut s, &mut port, 2, &k, "t", 5_000, Wait::For(61_500)).unwrap();
        port.writes = Writes::Paused;
        // The lease ends during the pause: the key stays (Redis keeps it) and nothing is
        // written (the fake port panics on any write while paused).
        advance_to(&mut s, &mut port, 62_000);
        assert!(port.answers().is_empty());
        // A timeout is still answered during the pause: it writes nothing.
        advance_to(&mut s, &mut port, 62_500);
        assert_eq!(port.answers(), [(2, Answer::TimedOut)]);
        advance_to(&mut s, &mut port, 63_000);
        port.writes = Writes::Allowed;
        advance_to(&mut s, &mut port, 63_000 + PAUSE_POLL_MS);
        assert_eq!(port.answers()[1], (1, granted(2, &k, "w")));
        assert!(port
            .effects
            .contains(&Effect::Noted(Note::ExpiredWithWaiters { key: k.clone() })));
    }

    #[test]
    fn an_undelivered_grant_waits_for_the_pause_to_end() {
        let (mut s, mut port, k) = setup();
        wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::Forever).unwrap();
        release(&mut s, &mut port, &k);
        port.writes = Writes::Paused;
        s.grant_undelivered(undelivered(&k, 2), port.now);
        let now = port.now;
        advance_to(&mut s, &mut port, now + 100);
        assert!(port.keys.contains_key(&k));
        port.writes = Writes::Allowed;
        advance_to(&mut s, &mut port, now + 100 + PAUSE_POLL_MS);
        assert!(!port.keys.contains_key(&k));
    }

    #[test]
    fn a_replica_never_grants() {
        let (mut s, mut port, k) = setup();
        wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::Forever).unwrap();
        port.writes = Writes::Replica;
        release(&mut s, &mut port, &k);
        advance_to(&mut s, &mut port, 100_000);
        assert!(port.answers().is_empty());
    }

    #[test]
    fn waiters_of_a_key_that_left_with_its_slot_are_redirected_but_not_on_a_command() {
        let (mut s, mut port, k) = setup();
        wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::Forever).unwrap();
        wait(&mut s, &mut port, 2, &k, "b", 5_000, Wait::Forever).unwrap();
        port.moved
            .insert(k.clone(), "ASK 1 127.0.0.1:7001".to_string());
        // MIGRATE deleted the key here; the event reaches the scheduler.
        port.keys.remove(&k);
        let now = port.now;
        s.keys_changed(&mut port, vec![Change::Key(k.clone(), Cause::Freed)], now);
        let ask = Answer::Refused("ASK 1 127.0.0.1:7001".to_string());
        assert_eq!(port.answers(), [(1, ask.clone()), (2, ask)]);
        // A command on this node means the slot is served here: no route check then.
        wait(&mut s, &mut port, 3, &k, "c", 5_000, Wait::Forever).unwrap();
        let now = port.now;
        assert!(s.freed(&mut port, &k, now));
    }

    #[test]
    fn when_tokens_run_out_every_waiter_is_told_instead_of_left_waiting() {
        let (mut s, mut port, k) = setup();
        wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::Forever).unwrap();
        wait(&mut s, &mut port, 2, &k, "b", 5_000, Wait::Forever).unwrap();
        port.tokens_exhausted = true;
        release(&mut s, &mut port, &k);
        let refused = Answer::Refused(LockError::TokensExhausted.reply());
        assert_eq!(port.answers(), [(1, refused.clone()), (2, refused)]);
        assert_eq!(s.gauges(), (0, 0));
    }

    #[test]
    fn a_waiter_queued_on_a_free_key_is_looked_at_at_once() {
        let mut s = Scheduler::default();
        let mut port = FakePort::default();
        let k = key("k");
        // Between an outside DEL and its recheck, an acquire may find the key free but queue
        // behind the waiters; the scheduler looks again on the next timer.
        wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::Forever).unwrap();
        assert_eq!(s.next_deadline(), Some(port.now));
        let now = port.now;
        advance_to(&mut s, &mut port, now);
        assert_eq!(port.answers(), [(1, granted(1, &k, "a"))]);
    }

    #[test]
    fn an_overdue_lease_is_looked_at_again_shortly_not_in_a_loop() {
        let (mut s, mut port, k) = setup();
        wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::Forever).unwrap();
        // The key outlives its lease end (as while clients are paused by CLIENT PAUSE in
        // another form): the check comes back after OVERDUE_RECHECK_MS, not at once.
        set_lease_end(&mut port, &k, None);
        advance_to(&mut s, &mut port, 61_001);
        assert_eq!(s.next_deadline(), None, "no lease: nothing to check");
        set_lease_end(&mut port, &k, Some(50_000));
        s.lease_changed(&k, Some(50_000), port.now);
        assert_eq!(s.next_deadline(), Some(61_001 + OVERDUE_RECHECK_MS));
    }

    #[test]
    fn a_full_queue_refuses_before_the_client_is_blocked() {
        let (mut s, mut port, k) = setup();
        assert_eq!(s.has_room(&k, b"a", 1), Ok(()));
        wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::Forever).unwrap();
        assert_eq!(
            s.has_room(&k, b"b", 1),
            Err(LockError::TooManyWaiters { max: 1 })
        );
        // The owner already waiting may still ask again: it only changes places with itself.
        assert_eq!(s.has_room(&k, b"a", 1), Ok(()));
    }

    #[test]
    fn an_owner_asking_again_takes_its_own_place_and_the_stale_wait_is_answered() {
        let (mut s, mut port, k) = setup();
        wait(&mut s, &mut port, 1, &k, "a", 5_000, Wait::For(100)).unwrap();
        wait(&mut s, &mut port, 2, &k, "b", 5_000, Wait::Forever).unwrap();
        // Client 1 gave up (its own timeout) but kept its connection; it asks again as 3.
        wait(&mut s, &mut port, 3, &k, "a", 7_000, Wait::Forever).unwrap();
        assert_eq!(port.answers(), [(1, Answer::Refused(REPLACED.to_string()))]);
        assert_eq!(s.waiters_on(&k), 2);
        // The old timeout went with the old request: no nil for 3 at 1,100.
        advance_to(&mut s, &mut port, 2_000);
        assert_eq!(port.answers().len(), 1);
        // Same place in the queue (ahead of b), the new request's lease.
        release(&mut s, &mut port, &k);
        assert_eq!(port.answers()[1], (3, granted(2, &k, "a")));
        assert_eq!(lease_end(&port, &k), Some(2_000 + 7_000));
        assert!(
            !s.waiter_left(&mut port, 1, 1_000),
            "the old handle is not queued any more"
        );
    }
    // ---- the lock family: shared holds, permits, mismatches, bound holds ----

    /// Who was answered what, without the tokens (checked on their own: they only rise).
    fn who(port: &FakePort) -> Vec<(u32, String, HoldKind, UnixMs)> {
        port.answers_at()
            .into_iter()
            .filter_map(|(h, a, at)| match a {
                Answer::Granted { owner, kind, .. } => {
                    Some((h, String::from_utf8_lossy(&owner).into_owned(), kind, at))
                }
                _ => None,
            })
            .collect()
    }

    fn granted_tokens(port: &FakePort) -> Vec<u64> {
        port.answers()
            .into_iter()
            .filter_map(|(_, a)| match a {
                Answer::Granted { token, .. } => Some(token),
                _ => None,
            })
            .collect()
    }

    fn assert_tokens_rise(port: &FakePort) {
        let tokens = granted_tokens(port);
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    }

    fn notes(port: &FakePort) -> Vec<Note> {
        port.effects
            .iter()
            .filter_map(|e| match e {
                Effect::Noted(n) => Some(n.clone()),
                _ => None,
            })
            .collect()
    }

    fn count_notes(port: &FakePort, note: &Note) -> usize {
        notes(port).iter().filter(|n| *n == note).count()
    }

    /// The key's holders as (owner, kind), ended holds dropped.
    fn holders(port: &mut FakePort, k: &LockKey) -> Vec<(String, HoldKind)> {
        port.lock(k).map_or_else(Vec::new, |l| {
            l.holds
                .iter()
                .map(|h| (String::from_utf8_lossy(&h.owner).into_owned(), h.kind))
                .collect()
        })
    }

    fn take(port: &mut FakePort, k: &LockKey, owner: &str, mode: Mode, lease_ms: u64) -> u64 {
        port.acquire(k, owner, mode, lease_ms, false)
            .unwrap()
            .expect("granted")
    }

    fn queue(
        s: &mut Scheduler<u32>,
        port: &mut FakePort,
        k: &LockKey,
        waiters: &[(u32, &str, Mode)],
    ) {
        for (h, owner, mode) in waiters {
            wait_as(s, port, *h, k, owner, *mode, 60_000, Wait::Forever, None).unwrap();
        }
    }

    #[test]
    fn a_released_writer_lets_in_the_shared_waiters_up_to_the_next_writer_at_once() {
        use HoldKind::{Exclusive as X, Shared as S};
        let mut s = Scheduler::default();
        let mut port = FakePort::default();
        let k = key("k");
        take(&mut port, &k, "writer", Mode::Exclusive, 60_000);
        queue(
            &mut s,
            &mut port,
            &k,
            &[
                (1, "r1", Mode::Shared),
                (2, "r2", Mode::Shared),
                (3, "r3", Mode::Shared),
                (4, "w2", Mode::Exclusive),
                (5, "r4", Mode::Shared),
            ],
        );
        advance_to(&mut s, &mut port, 2_000);
        release_owner(&mut s, &mut port, &k, b"writer");
        assert_eq!(
            who(&port),
            [
                (1, "r1".into(), S, 2_000),
                (2, "r2".into(), S, 2_000),
                (3, "r3".into(), S, 2_000),
            ]
        );
        assert_eq!(s.waiters_on(&k), 2, "the run stops at the next writer");
        // The writer waits for every reader; the reader behind it waits for the writer.
        release_owner(&mut s, &mut port, &k, b"r1");
        release_owner(&mut s, &mut port, &k, b"r2");
        assert_eq!(port.answers().len(), 3);
        advance_to(&mut s, &mut port, 3_000);
        release_owner(&mut s, &mut port, &k, b"r3");
        assert_eq!(who(&port)[3], (4, "w2".into(), X, 3_000));
        advance_to(&mut s, &mut port, 4_000);
        release_owner(&mut s, &mut port, &k, b"w2");
        assert_eq!(who(&port)[4], (5, "r4".into(), S, 4_000));
        let handles: Vec<u32> = port.answers().iter().map(|(h, _)| *h).collect();
        assert_eq!(handles, [1, 2, 3, 4, 5], "one answer per waiter, in order");
        assert_tokens_rise(&port);
        assert_eq!(
            count_notes(
                &port,
                &Note::HandedOff {
                    key: k.clone(),
                    waited_ms: 1_000
                }
            ),
            3
        );
    }

    #[test]
    fn a_shared_newcomer_queues_behind_a_waiting_writer_instead_of_barging() {
        use HoldKind::{Exclusive as X, Shared as S};
        let mut s = Scheduler::default();
        let mut port = FakePort::default();
        let k = key("k");
        take(&mut port, &k, "r1", Mode::Shared, 60_000);
        queue(&mut s, &mut port, &k, &[(1, "w", Mode::Exclusive)]);
        let waiting = s.waiters_on(&k) > 0;
        assert_eq!(
            port.acquire(&k, "r2", Mode::Shared, 60_000, waiting),
            Ok(None),
            "no barging past the writer"
        );
        assert!(
            port.acquire(&k, "r1", Mode::Shared, 60_000, waiting)
                .unwrap()
                .is_some(),
            "a re-entry is granted"
        );
        queue(&mut s, &mut port, &k, &[(2, "r2", Mode::Shared)]);
        release_owner(&mut s, &mut port, &k, b"r1");
        assert!(port.answers().is_empty(), "r1 still holds it once");
        release_owner(&mut s, &mut port, &k, b"r1");
        assert_eq!(who(&port), [(1, "w".into(), X, 1_000)]);
        assert_eq!(holders(&mut port, &k), [("w".into(), X)]);
        release_owner(&mut s, &mut port, &k, b"w");
        assert_eq!(who(&port)[1], (2, "r2".into(), S, 1_000));
        assert_tokens_rise(&port);
    }

    #[test]
    fn when_the_writer_at_the_head_leaves_the_shared_waiters_behind_it_join_the_readers_at_once() {
        use HoldKind::Shared as S;
        enum Departure {
            TimesOut,
            Leaves,
        }
        for departure in [Departure::TimesOut, Departure::Leaves] {
            let mut s = Scheduler::default();
            let mut port = FakePort::default();
            let k = key("k");
            take(&mut port, &k, "r1", Mode::Shared, 60_000);
            wait_as(
                &mut s,
                &mut port,
                1,
                &k,
                "w",
                Mode::Exclusive,
                5_000,
                Wait::For(100),
                None,
            )
            .unwrap();
            queue(
                &mut s,
                &mut port,
                &k,
                &[
                    (2, "r2", Mode::Shared),
                    (3, "r3", Mode::Shared),
                    (4, "w2", Mode::Exclusive),
                    (5, "r4", Mode::Shared),
                ],
            );
            let (at, first) = match departure {
                Departure::TimesOut => {
                    // The timeout and the 0 ms recheck it arms fire at the same moment.
                    advance_to(&mut s, &mut port, 1_100);
                    (1_100, vec![(1, Answer::TimedOut, 1_100)])
                }
                Departure::Leaves => {
                    advance_to(&mut s, &mut port, 1_050);
                    assert!(s.waiter_left(&mut port, 1, 1_050));
                    assert!(port.answers().is_empty(), "nothing written where it left");
                    // The adapter's 0 ms timer.
                    advance_to(&mut s, &mut port, 1_050);
                    (1_050, vec![])
                }
            };
            let answers = port.answers_at();
            assert_eq!(answers[..first.len()], first[..]);
            assert_eq!(
                who(&port),
                [(2, "r2".into(), S, at), (3, "r3".into(), S, at)],
                "granted right away, not at r1's lease end"
            );
            assert_eq!(s.waiters_on(&k), 2, "the run stops at the next writer");
            assert_eq!(
                holders(&mut port, &k),
                [("r1".into(), S), ("r2".into(), S), ("r3".into(), S)]
            );
        }
    }

    #[test]
    fn permits_go_strictly_in_arrival_order_and_never_past_the_limit() {
        use HoldKind::Permit as P;
        let limit = Mode::Limit(2);
        let mut s = Scheduler::default();
        let mut port = FakePort::default();
        let k = key("k");
        let within_limit = |port: &mut FakePort| {
            let n = holders(port, &k).len();
            assert!(n <= 2, "{n} permits held");
        };
        take(&mut port, &k, "a", limit, 10_000);
        take(&mut port, &k, "b", limit, 60_000);
        queue(
            &mut s,
            &mut port,
            &k,
            &[
                (1, "w1", limit),
                (2, "w2", limit),
                (3, "w3", limit),
                (4, "w4", limit),
                (5, "w5", limit),
            ],
        );
        // A release frees one permit: the head takes it, the rest wait.
        advance_to(&mut s, &mut port, 2_000);
        release_owner(&mut s, &mut port, &k, b"b");
        within_limit(&mut port);
        assert_eq!(who(&port), [(1, "w1".into(), P, 2_000)]);
        // A's lease ends at 11,000: its permit goes on at 11,001.
        assert_eq!(s.next_deadline(), Some(11_001));
        advance_to(&mut s, &mut port, 11_000);
        assert_eq!(port.answers().len(), 1);
        advance_to(&mut s, &mut port, 11_001);
        within_limit(&mut port);
        assert_eq!(who(&port)[1], (2, "w2".into(), P, 11_001));
        assert_eq!(
            count_notes(&port, &Note::ExpiredWithWaiters { key: k.clone() }),
            1
        );
        // An outside DEL frees both permits: the next two get them in the same moment.
        advance_to(&mut s, &mut port, 12_000);
        port.keys.remove(&k);
        s.keys_changed(
            &mut port,
            vec![Change::Key(k.clone(), Cause::Freed)],
            12_000,
        );
        within_limit(&mut port);
        assert_eq!(
            who(&port)[2..],
            [(3, "w3".into(), P, 12_000), (4, "w4".into(), P, 12_000)]
        );
        assert_eq!(s.waiters_on(&k), 1);
        release_owner(&mut s, &mut port, &k, b"w3");
        within_limit(&mut port);
        assert_eq!(who(&port)[4], (5, "w5".into(), P, 12_000));
        let handles: Vec<u32> = port.answers().iter().map(|(h, _)| *h).collect();
        assert_eq!(handles, [1, 2, 3, 4, 5]);
        assert_tokens_rise(&port);
    }

    #[test]
    fn a_writer_behind_readers_is_granted_just_after_the_last_of_their_lease_ends() {
        use HoldKind::{Exclusive as X, Shared as S};
        let mut s = Scheduler::default();
        let mut port = FakePort::default();
        let k = key("k");
        take(&mut port, &k, "r1", Mode::Shared, 1_000); // ends at 2,000
        take(&mut port, &k, "r2", Mode::Shared, 3_000); // ends at 4,000
        take(&mut port, &k, "r3", Mode::Shared, 2_000); // ends at 3,000
        queue(&mut s, &mut port, &k, &[(1, "w", Mode::Exclusive)]);
        // The lease check follows the earliest lease end among the holds that are left.
        let steps = [
            (2_001, vec![("r2", S), ("r3", S)], Some(3_001)),
            (3_001, vec![("r2", S)], Some(4_001)),
        ];
        assert_eq!(s.next_deadline(), Some(2_001));
        for (at, left, next) in steps {
            advance_to(&mut s, &mut port, at - 1);
            assert!(port.answers().is_empty(), "nothing before {at}");
            advance_to(&mut s, &mut port, at);
            assert!(port.answers().is_empty(), "still held at {at}");
            let left: Vec<(String, HoldKind)> = left
                .into_iter()
                .map(|(o, kind)| (o.to_string(), kind))
                .collect();
            assert_eq!(holders(&mut port, &k), left, "at {at}");
            assert_eq!(s.next_deadline(), next, "at {at}");
        }
        advance_to(&mut s, &mut port, 4_000);
        assert!(port.answers().is_empty(), "not before the last lease ends");
        advance_to(&mut s, &mut port, 4_001);
        assert_eq!(who(&port), [(1, "w".into(), X, 4_001)]);
        assert_eq!(
            count_notes(&port, &Note::ExpiredWithWaiters { key: k.clone() }),
            1
        );
        assert_eq!(holders(&mut port, &k), [("w".into(), X)]);
    }

    #[test]
    fn a_permit_whose_lease_ends_goes_to_the_next_waiter_just_after_its_own_end() {
        use HoldKind::Permit as P;
        let limit = Mode::Limit(2);
        let mut s = Scheduler::default();
        let mut port = FakePort::default();
        let k = key("k");
        take(&mut port, &k, "a", limit, 1_000); // ends at 2,000
        take(&mut port, &k, "b", limit, 4_000); // ends at 5,000
        queue(&mut s, &mut port, &k, &[(1, "w1", limit), (2, "w2", limit)]);
        assert_eq!(s.next_deadline(), Some(2_001));
        advance_to(&mut s, &mut port, 2_000);
        assert!(port.answers().is_empty());
        advance_to(&mut s, &mut port, 2_001);
        assert_eq!(who(&port), [(1, "w1".into(), P, 2_001)]);
        assert_eq!(s.next_deadline(), Some(5_001), "b's lease end, before w1's");
        advance_to(&mut s, &mut port, 5_000);
        assert_eq!(port.answers().len(), 1);
        advance_to(&mut s, &mut port, 5_001);
        assert_eq!(who(&port)[1], (2, "w2".into(), P, 5_001));
        assert_eq!(
            count_notes(&port, &Note::ExpiredWithWaiters { key: k.clone() }),
            2
        );
        assert_tokens_rise(&port);
    }

    #[test]
    fn a_waiter_whose_request_no_longer_fits_the_key_is_refused_and_the_next_one_served() {
        let cases = [
            (
                "exclusive waiter, the key became a semaphore",
                Mode::Exclusive,
                Mode::Limit(2),
                Mode::Limit(2),
                LockError::IsSemaphore { limit: 2 },
            ),
            (
                "shared waiter, the key became a semaphore",
                Mode::Shared,
                Mode::Limit(2),
                Mode::Limit(2),
                LockError::IsSemaphore { limit: 2 },
            ),
            (
                "permit waiter, the key became a semaphore of another limit",
                Mode::Limit(3),
                Mode::Limit(2),
                Mode::Limit(2),
                LockError::IsSemaphore { limit: 2 },
            ),
            (
                "permit waiter, the key became a read-write lock",
                Mode::Limit(2),
                Mode::Shared,
                Mode::Shared,
                LockError::IsReadWrite,
            ),
        ];
        for (case, first, taken_as, next, error) in cases {
            let mut s = Scheduler::default();
            let mut port = FakePort::default();
            let k = key("k");
            // Queued while the key was free (between an outside DEL and its recheck), then the
            // key was taken as the other kind before the recheck ran.
            wait_as(
                &mut s,
                &mut port,
                1,
                &k,
                "x",
                first,
                5_000,
                Wait::Forever,
                None,
            )
            .unwrap();
            take(&mut port, &k, "holder", taken_as, 60_000);
            wait_as(
                &mut s,
                &mut port,
                2,
                &k,
                "y",
                next,
                5_000,
                Wait::Forever,
                None,
            )
            .unwrap();
            let now = port.now;
            advance_to(&mut s, &mut port, now);
            assert_eq!(
                port.answers(),
                [
                    (1, Answer::Refused(error.reply())),
                    (2, granted_as(2, &k, "y", next.kind())),
                ],
                "{case}"
            );
            assert_eq!(count_notes(&port, &Note::Mismatched), 1, "{case}");
            assert_eq!(s.waiters_on(&k), 0, "{case}");
        }
    }

    #[test]
    fn a_closed_connection_ends_its_bound_holds_whatever_their_count_and_hands_each_key_on() {
        use HoldKind::{Exclusive as X, Permit as P, Shared as S};
        let mut s = Scheduler::default();
        let mut port = FakePort::default();
        let [k1, k2, k3, k4, k5] = ["k1", "k2", "k3", "k4", "k5"].map(key);
        // k1: held three times by a, two writers waiting.
        let t1 = take(&mut port, &k1, "a", Mode::Exclusive, 60_000);
        take(&mut port, &k1, "a", Mode::Exclusive, 60_000);
        take(&mut port, &k1, "a", Mode::Exclusive, 60_000);
        s.bind(&mut port, 7, &k1, X, t1, 1_000);
        queue(
            &mut s,
            &mut port,
            &k1,
            &[(1, "w1", Mode::Exclusive), (2, "w2", Mode::Exclusive)],
        );
        // k2: a reads beside b; a writer waits for both.
        let t2 = take(&mut port, &k2, "a", Mode::Shared, 60_000);
        take(&mut port, &k2, "b", Mode::Shared, 60_000);
        s.bind(&mut port, 7, &k2, S, t2, 1_000);
        queue(&mut s, &mut port, &k2, &[(3, "w3", Mode::Exclusive)]);
        // k3: a permit nobody waits for.
        let t3 = take(&mut port, &k3, "a", Mode::Limit(2), 60_000);
        s.bind(&mut port, 7, &k3, P, t3, 1_000);
        // k4: bound when a waiter with the connection's binding was granted.
        take(&mut port, &k4, "h", Mode::Exclusive, 60_000);
        wait_as(
            &mut s,
            &mut port,
            4,
            &k4,
            "e",
            Mode::Exclusive,
            60_000,
            Wait::Forever,
            Some(7),
        )
        .unwrap();
        release_owner(&mut s, &mut port, &k4, b"h");
        let Some((4, Answer::Granted { token: t4, .. })) = port.answers().last().cloned() else {
            panic!("e was not granted k4: {:?}", port.answers());
        };
        // k5: another connection's hold.
        let t5 = take(&mut port, &k5, "z", Mode::Exclusive, 60_000);
        s.bind(&mut port, 8, &k5, X, t5, 1_000);
        for (k, t) in [(&k1, t1), (&k2, t2), (&k3, t3), (&k4, t4)] {
            assert_eq!(s.bound_client(k, t), Some(7), "{k:?}");
        }
        assert_eq!(s.bound_client(&k5, t5), Some(8));
        assert_eq!(s.bound_client(&k1, t5), None, "the key is part of the name");
        assert_eq!(s.bound_holds(), 5);

        let before = port.effects.len();
        let now = port.now;
        s.clients_gone(&mut port, vec![7], now);
        let effects = port.effects[before..].to_vec();

        let ended: HashSet<LockKey> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::Removed { key, .. } => Some(key.clone()),
                _ => None,
            })
            .collect();
        let expected: HashSet<LockKey> = [&k1, &k2, &k3, &k4].into_iter().cloned().collect();
        assert_eq!(ended, expected);
        let disconnected: Vec<LockKey> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::Noted(Note::Disconnected { key }) => Some(key.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(disconnected.len(), 4, "one note per hold");
        assert_eq!(disconnected.into_iter().collect::<HashSet<_>>(), expected);
        let published: HashSet<LockKey> = effects
            .iter()
            .filter_map(|e| match e {
                Effect::Published { key } => Some(key.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            published,
            [k3.clone(), k4.clone()].into_iter().collect(),
            "only the keys that became free with nobody waiting"
        );
        // k1 goes to its head waiter, all three re-entries gone at once; k2 stays b's.
        assert_eq!(holders(&mut port, &k1), [("w1".into(), X)]);
        assert_eq!(s.waiters_on(&k1), 1);
        assert_eq!(holders(&mut port, &k2), [("b".into(), S)]);
        assert_eq!(s.waiters_on(&k2), 1);
        assert!(port.lock(&k3).is_none() && port.lock(&k4).is_none());
        assert_eq!(holders(&mut port, &k5), [("z".into(), X)]);
        for (k, t) in [(&k1, t1), (&k2, t2), (&k3, t3), (&k4, t4)] {
            assert_eq!(s.bound_client(k, t), None, "{k:?}");
        }
        assert_eq!(s.bound_holds(), 1);
        // Nothing more happens when the connection's close is reported twice.
        let before = port.effects.len();
        s.clients_gone(&mut port, vec![7], now);
        assert_eq!(port.effects.len(), before);
    }

    #[test]
    fn a_connection_closed_while_writes_are_paused_ends_its_holds_after_the_pause() {
        let mut s = Scheduler::default();
        let mut port = FakePort::default();
        let k = key("k");
        let t = take(&mut port, &k, "a", Mode::Exclusive, 60_000);
        take(&mut port, &k, "a", Mode::Exclusive, 60_000);
        s.bind(&mut port, 7, &k, HoldKind::Exclusive, t, 1_000);
        queue(&mut s, &mut port, &k, &[(1, "w", Mode::Exclusive)]);
        port.writes = Writes::Paused;
        let before = port.effects.len();
        // The fake port panics on any write while paused.
        s.clients_gone(&mut port, vec![7], 1_000);
        assert_eq!(
            port.effects.len(),
            before,
            "nothing written during the pause"
        );
        assert_eq!(s.next_deadline(), Some(1_000 + PAUSE_POLL_MS));
        advance_to(&mut s, &mut port, 1_000 + PAUSE_POLL_MS);
        assert_eq!(port.effects.len(), before, "still paused");
        assert_eq!(holders(&mut port, &k), [("a".into(), HoldKind::Exclusive)]);
        port.writes = Writes::Allowed;
        advance_to(&mut s, &mut port, 1_000 + 2 * PAUSE_POLL_MS);
        let effects = &port.effects[before..];
        assert_eq!(
            effects.first(),
            Some(&Effect::Removed {
                key: k.clone(),
                token: t
            })
        );
        assert!(effects.contains(&Effect::Noted(Note::Disconnected { key: k.clone() })));
        assert_eq!(
            who(&port),
            [(
                1,
                "w".into(),
                HoldKind::Exclusive,
                1_000 + 2 * PAUSE_POLL_MS
            )],
            "handed on after the pause"
        );
        assert_eq!(s.bound_client(&k, t), None);
    }

    #[test]
    fn a_hold_unbound_after_its_release_is_left_alone_when_its_connection_closes() {
        let mut s = Scheduler::default();
        let mut port = FakePort::default();
        let k = key("k");
        let t = take(&mut port, &k, "a", Mode::Exclusive, 60_000);
        s.bind(&mut port, 7, &k, HoldKind::Exclusive, t, 1_000);
        assert_eq!(s.bound_client(&k, t), Some(7));
        // The owner's last release ends the hold; the adapter unbinds it.
        release_owner(&mut s, &mut port, &k, b"a");
        s.unbind(&k, t);
        assert_eq!(s.bound_client(&k, t), None);
        assert_eq!(s.bound_holds(), 0);
        assert!(s.is_idle(), "nothing kept for a hold that is gone");
        take(&mut port, &k, "b", Mode::Exclusive, 60_000);
        let before = port.effects.len();
        let now = port.now;
        s.clients_gone(&mut port, vec![7], now);
        assert_eq!(port.effects.len(), before);
        assert_eq!(holders(&mut port, &k), [("b".into(), HoldKind::Exclusive)]);
    }
}

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
mod model {
    use std::collections::{HashMap, HashSet};

    use proptest::prelude::*;

    use super::testing::*;
    use super::*;
    use crate::args::Reentry;
    use crate::hold::{self, Decision, Family, Lock};
    use crate::state::Queue;

    const LIMIT: u64 = 2;

    #[derive(Debug, Clone)]
    enum Op {
        Acquire {
            key: u8,
            shared: bool,
            wait: Option<u64>,
            lease: u64,
            client: Option<u8>,
        },
        Release {
            key: u8,
            pick: usize,
        },
        Leave {
            pick: usize,
        },
        /// A queued owner asks again (its client gave up but kept the connection).
        Retry {
            pick: usize,
            wait: u64,
        },
        Advance {
            ms: u64,
        },
        Pause(bool),
        DeleteOutside {
            key: u8,
        },
        Undelivered {
            key: u8,
            pick: usize,
        },
        Disconnect {
            client: u8,
        },
        /// Time runs to the binding sweep's next deadline.
        Sweep,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => (0u8..2, any::<bool>(), proptest::option::of(prop_oneof![Just(0u64), 1u64..400]), 1u64..300, proptest::option::of(0u8..3))
                .prop_map(|(key, shared, wait, lease, client)| Op::Acquire { key, shared, wait, lease, client }),
            3 => (0u8..2, any::<usize>()).prop_map(|(key, pick)| Op::Release { key, pick }),
            1 => any::<usize>().prop_map(|pick| Op::Leave { pick }),
            1 => (any::<usize>(), 0u64..400).prop_map(|(pick, wait)| Op::Retry { pick, wait }),
            3 => (0u64..200).prop_map(|ms| Op::Advance { ms }),
            1 => any::<bool>().prop_map(Op::Pause),
            1 => (0u8..2).prop_map(|key| Op::DeleteOutside { key }),
            1 => (0u8..2, any::<usize>()).prop_map(|(key, pick)| Op::Undelivered { key, pick }),
            1 => (0u8..3).prop_map(|client| Op::Disconnect { client }),
            1 => Just(Op::Sweep),
        ]
    }

    fn mode_for(key: usize, shared: bool) -> Mode {
        match (key, shared) {
            (1, _) => Mode::Limit(LIMIT),
            (_, true) => Mode::Shared,
            _ => Mode::Exclusive,
        }
    }

    #[derive(Default)]
    struct Model {
        queues: HashMap<LockKey, Vec<u32>>,
        deadline: HashMap<u32, UnixMs>,
        owner: HashMap<u32, String>,
        mode: HashMap<u32, Mode>,
        client: HashMap<u32, ClientId>,
        answered: HashMap<u32, Answer>,
        /// Waits replaced by a newer wait of their owner: answered with an error.
        replaced: HashSet<u32>,
        /// Holds bound to each connection: (key, token).
        bound: HashMap<ClientId, Vec<(LockKey, u64)>>,
        last_grant_token: u64,
        checked: usize,
    }

    impl Model {
        /// Checks every answer the scheduler gave since the last call.
        fn check_answers(&mut self, port: &FakePort) -> Result<(), TestCaseError> {
            let answers = port.answers_at();
            for (handle, answer, at) in answers.iter().skip(self.checked) {
                prop_assert!(
                    !self.answered.contains_key(handle),
                    "{handle} answered twice"
                );
                if self.replaced.contains(handle) {
                    prop_assert_eq!(answer, &Answer::Refused(REPLACED.to_string()));
                    self.answered.insert(*handle, answer.clone());
                    continue;
                }
                let (key, queue) = self
                    .queues
                    .iter_mut()
                    .find(|(_, q)| q.contains(handle))
                    .ok_or_else(|| {
                        TestCaseError::fail(format!("{handle} answered but not queued"))
                    })?;
                match answer {
                    Answer::Granted {
                        token,
                        key: granted_key,
                        owner,
                        kind,
                    } => {
                        prop_assert_eq!(granted_key, key);
                        prop_assert_eq!(queue.first(), Some(handle), "not FIFO");
                        prop_assert!(*token > self.last_grant_token, "token did not rise");
                        self.last_grant_token = *token;
                        prop_assert_eq!(owner.as_ref(), self.owner[handle].as_bytes());
                        prop_assert_eq!(*kind, self.mode[handle].kind());
                        if let Some(c) = self.client.get(handle) {
                            self.bound
                                .entry(*c)
                                .or_default()
                                .push((key.clone(), *token));
                        }
                    }
                    Answer::TimedOut => {
                        // The one timer fires exactly at each deadline: never early, never late.
                        prop_assert_eq!(*at, self.deadline[handle], "timed out at the wrong time");
                    }
                    Answer::Refused(reply) => prop_assert!(false, "refused: {}", reply),
                }
                queue.retain(|h| h != handle);
                self.answered.insert(*handle, answer.clone());
            }
            self.checked = answers.len();
            Ok(())
        }

        /// The reference rules on the fake server's state.
        fn check_holds(&self, port: &mut FakePort, keys: &[LockKey]) -> Result<(), TestCaseError> {
            for (i, k) in keys.iter().enumerate() {
                let Some(lock) = port.lock(k).cloned() else {
                    continue;
                };
                if i == 1 {
                    prop_assert_eq!(lock.family, Family::Semaphore { limit: LIMIT });
                    prop_assert!(
                        lock.holds.len() as u64 <= LIMIT,
                        "more permits than the limit"
                    );
                } else if let Some(x) = lock.exclusive() {
                    prop_assert!(
                        lock.holds.iter().all(|h| h.owner == x.owner),
                        "a writer beside another owner's hold: {:?}",
                        lock.holds
                    );
                }
            }
            Ok(())
        }

        /// Nobody waits while the key has room for the head of its queue.
        /// A hold bound by a command stays bound while it exists; right after a sweep the
        /// gauge counts exactly the live holds that are bound (none that ended unseen).
        fn check_bindings(
            &self,
            s: &Scheduler<u32>,
            port: &mut FakePort,
            keys: &[LockKey],
            swept: bool,
        ) -> Result<(), TestCaseError> {
            // Live: not past its lease end (while writes are paused the store keeps ended holds,
            // as Redis keeps an expired key, but every command treats them as gone).
            let now = port.now;
            let live = |h: &&crate::hold::Hold| h.expires_at.is_none_or(|at| now <= at);
            for (c, held) in &self.bound {
                for (k, token) in held {
                    let exists = port.lock(k).is_some_and(|l| {
                        l.holds.iter().filter(live).any(|h| h.token == Some(*token))
                    });
                    if exists {
                        prop_assert_eq!(
                            s.bound_client(k, *token),
                            Some(*c),
                            "a live hold lost its binding"
                        );
                    }
                }
            }
            if swept {
                let live_bound = keys
                    .iter()
                    .filter_map(|k| port.lock(k).cloned().map(|l| (k, l)))
                    .map(|(k, l)| {
                        l.holds
                            .iter()
                            .filter(live)
                            .filter(|h| h.token.is_some_and(|t| s.bound_client(k, t).is_some()))
                            .count()
                    })
                    .sum::<usize>();
                prop_assert_eq!(
                    s.bound_holds(),
                    live_bound,
                    "bindings of holds gone after a sweep"
                );
            }
            Ok(())
        }

        fn check_no_idle_room(&self, port: &mut FakePort) -> Result<(), TestCaseError> {
            if port.writes != Writes::Allowed {
                return Ok(());
            }
            let now = port.now;
            for (k, queue) in &self.queues {
                let Some(head) = queue.first() else { continue };
                let lock = port.lock(k).cloned().unwrap_or_else(Lock::free);
                let d = hold::decide(
                    &lock,
                    self.owner[head].as_bytes(),
                    self.mode[head],
                    1,
                    Reentry::Counted,
                    Queue::Empty,
                    now,
                );
                prop_assert!(
                    !matches!(d, Ok(Decision::Grant(_))),
                    "waiter {} left waiting on {:?} with room: {:?}",
                    head,
                    k,
                    lock
                );
            }
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn the_scheduler_matches_a_fifo_model(ops in proptest::collection::vec(op(), 1..120)) {
            let mut s: Scheduler<u32> = Scheduler::default();
            let mut port = FakePort::default();
            let keys = [LockKey::new(0, b"a"), LockKey::new(0, b"b")];
            let mut model = Model::default();
            let mut next_handle = 0u32;
            let mut direct = 0u32;
            for op in ops {
                let mut swept = false;
                let paused = port.writes == Writes::Paused;
                match op {
                    // Client commands are writes: Redis postpones them during a pause.
                    Op::Acquire { key, shared, wait: w, lease, client } if !paused => {
                        let k = &keys[usize::from(key)];
                        let mode = mode_for(usize::from(key), shared);
                        direct += 1;
                        let owner = format!("d{direct}");
                        let waiting = s.waiters_on(k) > 0;
                        let granted = port.acquire(k, &owner, mode, lease, waiting);
                        match granted {
                            Ok(Some(token)) => {
                                // Direct grants are tokens too: later grants must be above them.
                                model.last_grant_token = token;
                                if let Some(c) = client {
                                    let c = ClientId::from(c);
                                    let now = port.now;
                                    s.bind(&mut port, c, k, mode.kind(), token, now);
                                    model.bound.entry(c).or_default().push((k.clone(), token));
                                }
                            }
                            Ok(None) => {
                                if let Some(ms) = w {
                                    next_handle += 1;
                                    let h = next_handle;
                                    let wait = if ms == 0 { Wait::Forever } else { Wait::For(ms) };
                                    let bind = client.map(ClientId::from);
                                    wait_as(&mut s, &mut port, h, k, &owner, mode, lease, wait, bind)
                                        .map_err(|e| TestCaseError::fail(e.reply()))?;
                                    model.queues.entry(k.clone()).or_default().push(h);
                                    model.deadline.insert(h, if ms == 0 { UnixMs::MAX } else { port.now + ms });
                                    model.owner.insert(h, owner);
                                    model.mode.insert(h, mode);
                                    if let Some(c) = bind {
                                        model.client.insert(h, c);
                                    }
                                }
                            }
                            Err(e) => prop_assert!(false, "direct acquire refused: {}", e.reply()),
                        }
                    }
                    Op::Release { key, pick } if !paused => {
                        let k = &keys[usize::from(key)];
                        if let Some(lock) = port.lock(k).cloned() {
                            let h = &lock.holds[pick % lock.holds.len()];
                            release_owner(&mut s, &mut port, k, &h.owner);
                        }
                    }
                    Op::DeleteOutside { key } if !paused => {
                        let k = &keys[usize::from(key)];
                        port.keys.remove(k);
                        let now = port.now;
                        s.keys_changed(&mut port, vec![Change::Key(k.clone(), Cause::Freed)], now);
                    }
                    Op::Undelivered { key, pick } => {
                        let k = &keys[usize::from(key)];
                        if let Some(lock) = port.lock(k).cloned() {
                            let h = &lock.holds[pick % lock.holds.len()];
                            let now = port.now;
                            let grant = GrantRef { key: k.clone(), kind: h.kind, token: h.token.unwrap() };
                            s.grant_undelivered(grant, now);
                        }
                    }
                    Op::Disconnect { client } => {
                        let c = ClientId::from(client);
                        // Its queued waiters leave with it (the server's disconnect callback).
                        let mine: Vec<u32> = model.queues.values().flatten().copied()
                            .filter(|h| model.client.get(h) == Some(&c)).collect();
                        let now = port.now;
                        for h in mine {
                            prop_assert!(s.waiter_left(&mut port, h, now));
                            for q in model.queues.values_mut() {
                                q.retain(|x| *x != h);
                            }
                        }
                        s.clients_gone(&mut port, vec![c], now);
                        advance_to(&mut s, &mut port, now);
                        if port.writes == Writes::Allowed {
                            for (k, token) in model.bound.remove(&c).unwrap_or_default() {
                                let still = port.lock(&k).is_some_and(|l| l.holds.iter().any(|h| h.token == Some(token)));
                                prop_assert!(!still, "a closed connection's hold survived");
                            }
                        }
                    }
                    Op::Leave { pick } => {
                        let queued: Vec<u32> = model.queues.values().flatten().copied().collect();
                        if !queued.is_empty() {
                            let h = queued[pick % queued.len()];
                            let now = port.now;
                            prop_assert!(s.waiter_left(&mut port, h, now));
                            for q in model.queues.values_mut() {
                                q.retain(|x| *x != h);
                            }
                            // The adapter's 0 ms timer.
                            advance_to(&mut s, &mut port, now);
                        }
                    }
                    Op::Retry { pick, wait: ms } => {
                        let queued: Vec<(LockKey, usize, u32)> = model
                            .queues
                            .iter()
                            .flat_map(|(k, q)| q.iter().enumerate().map(|(i, h)| (k.clone(), i, *h)))
                            .collect();
                        if !queued.is_empty() {
                            let (k, at, old) = queued[pick % queued.len()].clone();
                            next_handle += 1;
                            let h = next_handle;
                            let owner = model.owner[&old].clone();
                            let mode = model.mode[&old];
                            let bind = model.client.get(&old).copied();
                            let wait = if ms == 0 { Wait::Forever } else { Wait::For(ms) };
                            wait_as(&mut s, &mut port, h, &k, &owner, mode, 100, wait, bind)
                                .map_err(|e| TestCaseError::fail(e.reply()))?;
                            // Same place in the queue; the old request is answered at once.
                            model.queues.get_mut(&k).unwrap()[at] = h;
                            model.replaced.insert(old);
                            model.deadline.insert(h, if ms == 0 { UnixMs::MAX } else { port.now + ms });
                            model.owner.insert(h, owner);
                            model.mode.insert(h, mode);
                            if let Some(c) = bind {
                                model.client.insert(h, c);
                            }
                        }
                    }
                    Op::Advance { ms } => {
                        let to = port.now + ms;
                        advance_to(&mut s, &mut port, to);
                    }
                    Op::Pause(on) => {
                        if on {
                            port.writes = Writes::Paused;
                        } else if port.writes == Writes::Paused {
                            port.writes = Writes::Allowed;
                            // Deferred work happens at the next pause check.
                            let to = port.now + PAUSE_POLL_MS;
                            advance_to(&mut s, &mut port, to);
                        }
                    }
                    Op::Sweep => {
                        if let Some(at) = s.binding_sweep.map(|d| d.at) {
                            advance_to(&mut s, &mut port, at);
                            swept = true;
                        }
                    }
                    _ => {}
                }
                model.check_answers(&port)?;
                model.check_holds(&mut port, &keys)?;
                model.check_no_idle_room(&mut port)?;
                model.check_bindings(&s, &mut port, &keys, swept)?;
            }
            // Everyone finishes: no pause, holders release, time runs out.
            if port.writes == Writes::Paused {
                port.writes = Writes::Allowed;
                let to = port.now + PAUSE_POLL_MS;
                advance_to(&mut s, &mut port, to);
            }
            for _ in 0..1_000 {
                let to = port.now + 500;
                advance_to(&mut s, &mut port, to);
                for k in &keys {
                    if port.lock(k).is_some() {
                        release(&mut s, &mut port, k);
                    }
                }
                model.check_answers(&port)?;
                if model.queues.values().all(Vec::is_empty) {
                    break;
                }
            }
            prop_assert!(model.queues.values().all(Vec::is_empty), "waiters never answered");
            for c in 0..3 {
                let now = port.now;
                s.clients_gone(&mut port, vec![c], now);
            }
            let to = port.now + 1_000;
            advance_to(&mut s, &mut port, to);
            prop_assert!(s.is_idle(), "something stays scheduled with nobody waiting");
        }
    }
}
