//! Handing keys to their waiters in batches: every key a handoff looks at is read once, every
//! grant is applied to it in memory, and every key is written once, whatever mix of one-key and
//! multi-key waiters is granted — a run of shared (or permit) waiters on several keys costs one
//! read and one write of each key, not one per waiter.
//!
//! A batch starts at one key (a release, a lease end, a change from outside) and follows the
//! queues: after a key's head is granted, the next head of that key is looked at, and a
//! multi-key grant sends the batch to each of its other keys, whose heads changed. A multi-key
//! waiter is granted when it heads every one of its queues and every key has room for it
//! (docs/multi-key.md).
//!
//! So that no event keeps the server from other clients for long, a batch grants at most
//! [`BATCH_HOLDS`] holds and, once it granted somebody, reads no further key after it read
//! [`BATCH_READS`] holds; and a turn of the server's event loop (a command, one firing of the
//! timer, one round of outside changes) starts another batch only while it has done less than
//! [`TURN_START_LIMIT`] units of work (a hold read counts one, a hold granted [`GRANT_COST`])
//! and fewer ticket answers wait to be written than a turn writes ([`TICKETS_PER_TURN`]: granting
//! faster than they are written makes the turn longer without telling anyone sooner, and starts
//! leases nobody has been told of).
//! What is left is looked at again from the timer a millisecond later, so that the server reads
//! and answers its other clients in between (the module arms its timer no sooner than a
//! millisecond after a turn ends, five after a long one: Redis runs a due timer before it writes
//! the replies to what it read in the same event-loop iteration). The first batch of a turn always runs: a release
//! hands its key to the head waiter in the release itself.
//!
//! A turn's worst case at the caps: a batch reads up to 16,000 holds, then a multi-key waiter's
//! 64 keys of 1,000 holds (64,000 holds), and grants 4,000 holds — about 50 ms on a debug build
//! of the module.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;

use super::tickets::TICKETS_PER_TURN;
use super::{Answer, Cause, Event, Handle, Note, Origin, Port, Read, Scheduler, Writes};
use crate::hold::{Decision, Granted, Hold, HoldKind, Lock, Run, StoredLock};
use crate::kind::Mode;
use crate::queue::{LockKey, Waiter, WaiterId};
use crate::{LockError, UnixMs};

/// The most holds one batch grants (a multi-key grant counts one per key); the rest is granted
/// at the next turn.
pub const BATCH_HOLDS: usize = 4_000;
/// Once a batch granted somebody, it reads no further key after reading this many holds (a
/// multi-key grant sends the batch to each of its other keys, whose heads may name 63 keys more
/// each: without a bound one grant could make one batch read thousands of keys). Keys it read
/// already cost nothing more: a run on the same keys goes on.
pub const BATCH_READS: usize = 16_000;
/// A turn starts another batch only while it has done less than this much work, in units: a
/// hold read counts one, a hold granted (written, replicated, announced, answered)
/// [`GRANT_COST`].
pub const TURN_START_LIMIT: usize = 16_000;
/// What granting one hold costs, in reads of a hold.
pub const GRANT_COST: usize = 4;
/// How long after a turn the rest of its work is looked at: the server reads and answers its
/// other clients first (a continuation due at once would run right after they are read, before
/// they are answered).
pub const CONTINUE_AFTER_MS: u64 = 1;

/// One key as a batch read it.
struct KeyRead {
    key: LockKey,
    stored: Option<StoredLock>,
    run: Run,
    /// Holds whose lease had ended, removed by the batch's write.
    ended: Vec<Hold>,
    /// Something that is not a lock holds the key, until this expiry (None: no expiry).
    not_a_lock: Option<Option<UnixMs>>,
    /// Whether anything was granted on it: it must be written.
    granted: bool,
    /// Nobody can be granted the key (tokens exhausted): every waiter gets this.
    refused: Option<LockError>,
    /// Its write failed: its grants are answered with this instead.
    failed: Option<String>,
}

/// A waiter granted in a batch: its keys (by index in the batch) with their tokens.
struct Grant<H> {
    waiter: Waiter<Handle<H>>,
    holds: Vec<(usize, u64)>,
    kind: HoldKind,
}

/// What a look at a multi-key head came to.
enum MultiOutcome {
    /// Granted every key, with this mode.
    Granted(Mode),
    /// Answered with an error (it does not fit a key, or was redirected): the next head may fit.
    Refused,
    /// Some key has no room for it: it keeps its place.
    Busy,
}

pub(super) struct Batch<H> {
    keys: Vec<KeyRead>,
    at: HashMap<LockKey, usize>,
    grants: Vec<Grant<H>>,
    todo: VecDeque<LockKey>,
    /// The keys in `todo`: a key is listed there once.
    pending: HashSet<LockKey>,
    /// Holds granted (see [`BATCH_HOLDS`]).
    holds_granted: usize,
    /// Holds read.
    holds_read: usize,
    /// Keys left to look at when the batch was full.
    deferred: Vec<LockKey>,
}

impl<H> Batch<H> {
    fn new(start: &LockKey) -> Batch<H> {
        Batch {
            keys: Vec::new(),
            at: HashMap::new(),
            grants: Vec::new(),
            todo: VecDeque::from([start.clone()]),
            pending: HashSet::from([start.clone()]),
            holds_granted: 0,
            holds_read: 0,
            deferred: Vec::new(),
        }
    }

    fn full(&self) -> bool {
        self.holds_granted >= BATCH_HOLDS
    }

    /// Whether it may still read keys it has not read (see [`BATCH_READS`]).
    fn may_read<'k>(&self, mut keys: impl Iterator<Item = &'k LockKey>) -> bool {
        self.holds_read < BATCH_READS
            || self.grants.is_empty()
            || keys.all(|k| self.at.contains_key(k))
    }

    /// Its work, in units (see [`TURN_START_LIMIT`]).
    fn work(&self) -> usize {
        self.holds_read + GRANT_COST * self.holds_granted
    }

    /// Lists `key` to be looked at (unless it is listed already).
    fn look_at(&mut self, key: &LockKey) {
        if self.pending.insert(key.clone()) {
            self.todo.push_back(key.clone());
        }
    }

    fn next(&mut self) -> Option<LockKey> {
        let key = self.todo.pop_front()?;
        self.pending.remove(&key);
        Some(key)
    }

    fn granted_on(&self, key: &LockKey) -> bool {
        self.at
            .get(key)
            .and_then(|&i| self.keys.get(i))
            .is_some_and(|k| k.granted)
    }
}

/// Whether a waiter asking for `next` may be granted right behind a grant of `granted` on the
/// same key in one batch: readers behind a reader, permits behind a permit (phase-fair runs).
/// Anything else waits until the key is looked at again, so that a request of another family
/// is not refused while the key still has holds of this one.
fn may_follow(granted: Mode, next: Mode) -> bool {
    matches!(
        (granted, next),
        (Mode::Shared, Mode::Shared) | (Mode::Limit(_), Mode::Limit(_))
    )
}

impl<H: Copy + Eq + Hash> Scheduler<H> {
    /// Gives `key` (and, following the queues, the keys its grants touch) to its waiters: see
    /// the module's documentation. Returns whether anyone was granted `key` itself.
    pub(super) fn pump(
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
        // The first batch of a turn always starts; later ones only while the turn has room.
        if self.turn.batches > 0 && self.turn_used_up() {
            self.recheck(key.clone(), now.saturating_add(CONTINUE_AFTER_MS));
            return false;
        }
        self.turn.batches += 1;
        let mut batch = Batch::new(key);
        while let Some(next) = batch.next() {
            if batch.full() {
                batch.deferred.push(next);
                continue;
            }
            self.serve_key(port, &mut batch, &next, now, origin);
        }
        let granted_here = batch.granted_on(key);
        self.turn.spent += batch.work();
        let lease_ended = (cause == Cause::LeaseEnded).then_some(key);
        self.carry_out(port, batch, now, lease_ended);
        granted_here
    }

    /// Whether the turn has done its share: [`TURN_START_LIMIT`] units of work, or — once it
    /// ran a batch — as many ticket answers wait to be written as a turn writes.
    pub(super) fn turn_used_up(&self) -> bool {
        self.turn.spent >= TURN_START_LIMIT
            || (self.turn.batches > 0 && self.tickets_unwritten() >= TICKETS_PER_TURN)
    }

    /// Grants `key`'s waiters from the head while they have room.
    fn serve_key(
        &mut self,
        port: &mut impl Port<H>,
        batch: &mut Batch<H>,
        key: &LockKey,
        now: UnixMs,
        origin: Origin,
    ) {
        let mut last: Option<Mode> = None;
        while let Some(head) = self.queues.front(key) {
            if last.is_some_and(|granted| !may_follow(granted, head.mode)) {
                return;
            }
            if batch.full() {
                batch.deferred.push(key.clone());
                return;
            }
            if head.is_multi() {
                let id = head.id;
                // It waits here until it heads every one of its queues: nobody behind it
                // passes it. The batch reaches it from its other keys once it heads those.
                if !head.keys().all(|k| self.queues.heads(k, id)) {
                    return;
                }
                if !batch.may_read(head.keys()) {
                    batch.deferred.push(key.clone());
                    return;
                }
                match self.serve_multi(port, batch, id, key, now, origin) {
                    MultiOutcome::Granted(mode) => last = Some(mode),
                    MultiOutcome::Refused => {}
                    MultiOutcome::Busy => return,
                }
                continue;
            }
            let (owner, mode, lease_ms, reentry) =
                (head.owner.clone(), head.mode, head.lease_ms, head.reentry);
            if !batch.may_read(std::iter::once(key)) {
                batch.deferred.push(key.clone());
                return;
            }
            let Some(at) = self.load(port, batch, key, now, origin) else {
                return;
            };
            let Some(read) = batch.keys.get_mut(at) else {
                return;
            };
            if read.not_a_lock.is_some() || read.refused.is_some() {
                return;
            }
            let grant = match read.run.decide(&owner, mode, lease_ms, reentry, now) {
                Err(error) => {
                    if let Some(waiter) = self.take_front(key, now) {
                        port.note(Note::Mismatched);
                        let answer = Answer::Refused(error.reply());
                        self.answer(port, waiter.handle, waiter.lease_ms, answer, now);
                    }
                    continue;
                }
                Ok(Decision::Busy) => return,
                Ok(Decision::Grant(grant)) => grant,
            };
            let token = match grant.token {
                Some(token) => token,
                None => match port.next_token(key, now) {
                    Ok(token) => token,
                    Err(error) => {
                        read.refused = Some(error);
                        return;
                    }
                },
            };
            read.run.apply(&owner, mode, &grant, token);
            read.granted = true;
            let Some(waiter) = self.take_front(key, now) else {
                return;
            };
            batch.holds_granted += 1;
            batch.grants.push(Grant {
                waiter,
                holds: vec![(at, token)],
                kind: mode.kind(),
            });
            last = Some(mode);
        }
    }

    /// The multi-key waiter `id` heads every queue it stands in: grant it every key if each has
    /// room (each key's grant decided on the key as this batch has it), else leave it in place.
    fn serve_multi(
        &mut self,
        port: &mut impl Port<H>,
        batch: &mut Batch<H>,
        id: WaiterId,
        serving: &LockKey,
        now: UnixMs,
        origin: Origin,
    ) -> MultiOutcome {
        let Some(waiter) = self.queues.get(id) else {
            return MultiOutcome::Refused;
        };
        let keys: Vec<LockKey> = waiter.keys().cloned().collect();
        let (owner, mode, lease_ms, reentry, bind) = (
            waiter.owner.clone(),
            waiter.mode,
            waiter.lease_ms,
            waiter.reentry,
            waiter.bind,
        );
        let mut reads = Vec::with_capacity(keys.len());
        for key in &keys {
            match self.load(port, batch, key, now, origin) {
                Some(at) => reads.push(at),
                // Redirected: every waiter of the key (this one too) was answered.
                None => return MultiOutcome::Refused,
            }
        }
        let mut grants: Vec<Granted> = Vec::with_capacity(keys.len());
        let mut busy = false;
        for (key, &at) in keys.iter().zip(&reads) {
            let Some(read) = batch.keys.get(at) else {
                return MultiOutcome::Busy;
            };
            if read.not_a_lock.is_some() || read.refused.is_some() {
                busy = true;
                continue;
            }
            match read.run.decide(&owner, mode, lease_ms, reentry, now) {
                Ok(Decision::Grant(grant)) => {
                    // A key the owner holds already is re-entered only as it is held: an
                    // EPHEMERAL hold with EPHEMERAL, a plain one without (as a command's
                    // re-entry; see command::acquire).
                    if let Some(error) = self.binding_mismatch(key, &grant, bind) {
                        self.refuse_multi(port, id, &error.reply(), Note::Mismatched, now);
                        return MultiOutcome::Refused;
                    }
                    grants.push(grant);
                }
                Ok(Decision::Busy) => busy = true,
                Err(error) => {
                    // The request does not fit what this key is (a semaphore, say).
                    self.refuse_multi(port, id, &error.reply(), Note::Mismatched, now);
                    return MultiOutcome::Refused;
                }
            }
        }
        if busy {
            return MultiOutcome::Busy;
        }
        let mut tokens = Vec::with_capacity(keys.len());
        for (key, grant) in keys.iter().zip(&grants) {
            let token = match grant.token {
                Some(token) => token,
                None => match port.next_token(key, now) {
                    Ok(token) => token,
                    Err(error) => {
                        self.refuse_multi(port, id, &error.reply(), Note::Refused, now);
                        return MultiOutcome::Refused;
                    }
                },
            };
            tokens.push(token);
        }
        for ((&at, grant), &token) in reads.iter().zip(&grants).zip(&tokens) {
            if let Some(read) = batch.keys.get_mut(at) {
                read.run.apply(&owner, mode, grant, token);
                read.granted = true;
            }
        }
        let Some(removed) = self.queues.remove(id) else {
            return MultiOutcome::Refused;
        };
        let waiter = self.forget(removed);
        batch.holds_granted += keys.len();
        // Behind it, on each of its keys, somebody may fit too (the key being served is
        // served on by the caller).
        for key in keys.iter().filter(|k| *k != serving) {
            batch.look_at(key);
        }
        batch.grants.push(Grant {
            waiter,
            holds: reads.into_iter().zip(tokens).collect(),
            kind: mode.kind(),
        });
        MultiOutcome::Granted(mode)
    }

    /// The batch's index of `key`, read now if the batch has not read it yet. None when the key
    /// left this node with its slot: its waiters were answered with the redirect.
    fn load(
        &mut self,
        port: &mut impl Port<H>,
        batch: &mut Batch<H>,
        key: &LockKey,
        now: UnixMs,
        origin: Origin,
    ) -> Option<usize> {
        if let Some(&at) = batch.at.get(key) {
            return Some(at);
        }
        let (stored, not_a_lock) = match port.read(key, origin == Origin::Background) {
            Read::Lock(stored) => (stored, None),
            Read::NotALock { expires_at } => (None, Some(expires_at)),
            Read::Moved(redirect) => {
                // Every key of a multi-key request is in one slot: they all left with it.
                self.refuse_all(port, key, &redirect, Note::Redirected, now);
                return None;
            }
        };
        let mut lock = match (&stored, not_a_lock) {
            (Some(s), _) => s.lock.clone(),
            _ => Lock::free(),
        };
        batch.holds_read += lock.holds.len().max(1);
        let ended = if not_a_lock.is_some() {
            Vec::new()
        } else {
            lock.take_ended(now)
        };
        let at = batch.keys.len();
        batch.keys.push(KeyRead {
            key: key.clone(),
            stored,
            run: Run::new(lock),
            ended,
            not_a_lock,
            granted: false,
            refused: None,
            failed: None,
        });
        batch.at.insert(key.clone(), at);
        Some(at)
    }

    /// Writes every key the batch changed once, then tells: the holds whose lease ended, each
    /// grant (events, bindings, elections, answers, in the order granted), the waiters nobody
    /// can grant; then watches each key's next lease end, and leaves what the batch had no
    /// room for to the timer. `lease_ended`: the key whose holder's lease end started it.
    fn carry_out(
        &mut self,
        port: &mut impl Port<H>,
        mut batch: Batch<H>,
        now: UnixMs,
        lease_ended: Option<&LockKey>,
    ) {
        for read in &mut batch.keys {
            if read.granted || !read.ended.is_empty() {
                if let Err(error) = port.write(&read.key, read.stored.as_ref(), read.run.lock()) {
                    // Nothing was written: nobody got the key, and nobody can now.
                    read.failed = Some(error.reply());
                }
            }
        }
        for read in &batch.keys {
            if read.failed.is_none() {
                self.announce_ended(port, &read.key, &read.ended);
            }
        }
        // One lease end, noted once however many it lets in. Where the server reports every
        // key expiry, a lease end that freed the whole key was announced then; the end of one
        // hold of several only the module sees.
        let mut expiry_noted = false;
        for grant in batch.grants {
            let failed = grant
                .holds
                .iter()
                .find_map(|&(at, _)| batch.keys.get(at).and_then(|r| r.failed.clone()));
            if let Some(reply) = failed {
                port.note(Note::Refused);
                let waiter = &grant.waiter;
                self.answer(port, waiter.handle, 0, Answer::Refused(reply), now);
                continue;
            }
            let mut holds = Vec::with_capacity(grant.holds.len());
            for &(at, token) in &grant.holds {
                let Some(read) = batch.keys.get(at) else {
                    continue;
                };
                let key = &read.key;
                if !expiry_noted && lease_ended == Some(key) {
                    expiry_noted = true;
                    if read.ended.is_empty() && !port.reports_expiries() {
                        port.event(key, Event::Expired);
                    }
                    port.note(Note::ExpiredWithWaiters { key: key.clone() });
                }
                port.event(key, Event::Handoff);
                if let Some(client) = grant.waiter.bind {
                    self.bind(port, client, key, grant.kind, token, now);
                }
                holds.push((key.clone(), token));
            }
            let waiter = grant.waiter;
            if let Some((key, _)) = holds.first() {
                port.note(Note::HandedOff {
                    key: key.clone(),
                    waited_ms: now.saturating_sub(waiter.enqueued_at),
                });
            }
            let answer = match holds.as_slice() {
                [(key, token)] => {
                    if let Some(campaign) = &waiter.campaign {
                        port.elected(key, *token, &waiter.owner, campaign.value.as_deref());
                    }
                    Answer::Granted {
                        token: *token,
                        key: key.clone(),
                        owner: Box::from(&*waiter.owner),
                        kind: grant.kind,
                    }
                }
                _ => Answer::GrantedAll {
                    holds,
                    owner: Box::from(&*waiter.owner),
                    kind: grant.kind,
                },
            };
            self.answer(port, waiter.handle, waiter.lease_ms, answer, now);
        }
        for read in &batch.keys {
            let refusal = match (&read.failed, &read.refused) {
                (Some(reply), _) => Some((reply.clone(), Note::Refused)),
                (None, Some(error)) => Some((error.reply(), Note::Refused)),
                (None, None) => None,
            };
            match refusal {
                Some((reply, note)) => self.refuse_all(port, &read.key, &reply, note, now),
                None => {
                    let next = match read.not_a_lock {
                        Some(expires_at) => expires_at,
                        None => read.run.lock().next_lease_end(),
                    };
                    self.schedule_lease_check(&read.key, next, now);
                }
            }
        }
        // What the batch had no room for: served at the next turn of the event loop.
        for key in batch.deferred {
            if self.queues.has_waiters(&key) {
                self.recheck(key, now.saturating_add(CONTINUE_AFTER_MS));
            }
        }
    }
}
