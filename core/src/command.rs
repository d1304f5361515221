//! What a LOCK.* command does, decided on the lock as read: parse → read → **decide** → carry
//! out. Each function here takes the key's lock ([`Live`]), the parsed request and the clock, and
//! returns an [`Outcome`]: the lock to write, the reply, the keyspace event, the counters, the
//! bindings to make or forget, whether room was made for waiters. The module carries any outcome
//! out in one place (`src/commands/outcome.rs`); the scheduler's grants go through the same
//! writer.
//!
//! Every layout is one model: the store reads Redisson's `RLock` layout in O(1) and the
//! multi-hold layout in O(holds), both into a [`Lock`]; the rules below never ask which.

use crate::args::{AcquireRequest, Binding, Wait};
use crate::hold::{self, Decision, Hold, How, Lock, Lost, LostReason, StoredLock};
use crate::key::ClientId;
pub use crate::kind::Left;
use crate::kind::{HoldKind, Queue};
use crate::scheduler::Seen;
use crate::{LockError, UnixMs};

/// The most fields the keys of one multi-key command may hold together (64 keys of 1,000 holds,
/// each with its mode field and a downgrade's exclusive hold): past it, the command is refused
/// before any field is read (only keys written when a key could hold 10,000 holds reach it).
pub const MAX_FIELDS_TOGETHER: usize = crate::args::MAX_MULTI_KEYS * (crate::kind::MAX_HOLDERS + 2);

/// Whether one multi-key command may read keys of `fields` fields in all.
pub fn readable_together(fields: usize) -> Result<(), LockError> {
    if fields > MAX_FIELDS_TOGETHER {
        return Err(LockError::TooManyHoldsTogether {
            max: MAX_FIELDS_TOGETHER as u64,
        });
    }
    Ok(())
}

/// A lock as a command finds it at `now`: what is stored, and the holds whose lease has not
/// ended (none when the key is missing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Live {
    pub stored: Option<StoredLock>,
    /// The stored lock without its ended holds, when some ended (else it is the stored lock: the
    /// common case copies nothing).
    trimmed: Option<Lock>,
    /// Holds whose lease ended but that are still stored (the next write removes them).
    pub ended: Vec<Hold>,
}

/// The lock of a missing key.
static FREE: Lock = Lock::free();

impl Live {
    pub fn new(stored: Option<StoredLock>, now: UnixMs) -> Live {
        let mut trimmed = None;
        let mut ended = Vec::new();
        if let Some(stored) = &stored {
            if stored.lock.holds.iter().any(|h| h.ended(now)) {
                let mut lock = stored.lock.clone();
                ended = lock.take_ended(now);
                trimmed = Some(lock);
            }
        }
        Live {
            stored,
            trimmed,
            ended,
        }
    }

    /// The holds whose lease has not ended.
    pub fn lock(&self) -> &Lock {
        match (&self.trimmed, &self.stored) {
            (Some(lock), _) => lock,
            (None, Some(stored)) => &stored.lock,
            (None, None) => &FREE,
        }
    }

    /// What a waiter queued now saw: free, or held until the earliest lease end.
    fn seen(&self) -> Seen {
        if self.lock().holds.is_empty() {
            Seen::Free
        } else {
            Seen::Held {
                next_lease_end: self.lock().next_lease_end(),
            }
        }
    }
}

/// What a decision may need to ask the server, asked only when the decision needs it (the hot
/// path asks nothing it does not use).
pub trait Facts {
    /// Whether the server is over `maxmemory` (a new hold takes memory; a re-entry does not).
    fn out_of_memory(&self) -> bool;
    /// The connection the hold with this token is bound to (`EPHEMERAL`), if any.
    fn bound_client(&self, token: u64) -> Option<ClientId>;
    /// The next fencing token for the key.
    fn next_token(&mut self) -> Result<u64, LockError>;
    /// Whether the calling client may block (not in MULTI, a script, or a module call).
    fn can_block(&self) -> bool;
    /// Whether this server is a replica (a writable replica must not queue a waiter).
    fn is_replica(&self) -> bool;
}

/// The reply a command gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    Integer(u64),
    Null,
    /// Not granted now: queue the caller on the key and block it; it saw the lock so.
    Wait(Seen),
}

/// The keyspace event a command raises on its key (`lock.<name>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockEvent {
    Acquired,
    Reentered,
    Released,
    Renewed,
    ForceReleased,
}

/// A counter of `INFO lock` a command moves by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    Acquired,
    AcquiredShared,
    AcquiredPermits,
    Downgraded,
    Reentered,
    Contended,
    AcquireNil,
    Released,
    ReleasedPartial,
    ReleaseNotOwner,
    Renewed,
    RenewNotOwner,
    ForceReleased,
}

/// Everything a command does, in the order the module carries it out: write `write` (the
/// lock's new state; None: nothing), bind or unbind holds, count and announce the holds whose
/// lease ended (`ended`), tell the holders who `lost` their hold, raise `event`, move `counters`, move the waiters' lease check to
/// `lease_end`, hand the room `freed` made to waiters (else publish the unlock when the key is
/// gone), and reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub write: Option<Lock>,
    /// `EPHEMERAL`: bind the new hold (kind, token) to the calling connection.
    pub bind: Option<(HoldKind, u64)>,
    /// Holds (by token) that ended: forget their connection bindings.
    pub unbind: Unbind,
    /// How many holds whose lease ended the write removes (counted and announced).
    pub ended: usize,
    /// Holders to tell they lost their hold (the lost-hold messages).
    pub lost: Vec<Lost>,
    pub event: Option<LockEvent>,
    pub counters: Counters,
    /// Some: the key's earliest lease end changed to this (None inside: no lease).
    pub lease_end: Option<Option<UnixMs>>,
    pub freed: Option<Left>,
    pub reply: Reply,
}

impl Outcome {
    fn reply(reply: Reply) -> Outcome {
        Outcome {
            write: None,
            bind: None,
            unbind: Unbind::Nothing,
            ended: 0,
            lost: Vec::new(),
            event: None,
            counters: Counters::default(),
            lease_end: None,
            freed: None,
            reply,
        }
    }

    fn counted(reply: Reply, counters: &[Counter]) -> Outcome {
        let mut outcome = Outcome::reply(reply);
        for &counter in counters {
            outcome.counters.push(counter);
        }
        outcome
    }

    /// Writes `lock`, which also removes the holds whose lease ended: they are counted, their
    /// holders told, and the room they left goes to the waiters. In place: an outcome is large,
    /// and the hot path moves it as little as it can.
    fn write(&mut self, live: &Live, lock: Lock) {
        if !live.ended.is_empty() {
            self.ended = live.ended.len();
            self.lost
                .extend(live.ended.iter().map(|h| Lost::of(h, LostReason::Expired)));
            if self.freed.is_none() {
                self.freed = Some(left(&lock));
            }
        }
        self.write = Some(lock);
    }
}

/// The holds (by token) whose connection bindings go: one for a release, without allocating;
/// every hold of the key for a force release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unbind {
    Nothing,
    One(u64),
    All(Vec<u64>),
}

impl Unbind {
    pub fn tokens(&self) -> &[u64] {
        match self {
            Unbind::Nothing => &[],
            Unbind::One(token) => std::slice::from_ref(token),
            Unbind::All(tokens) => tokens,
        }
    }
}

/// Up to three counters (no command moves more), kept inline: no allocation on the hot path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    items: [Option<Counter>; 3],
}

impl Counters {
    fn push(&mut self, counter: Counter) {
        if let Some(slot) = self.items.iter_mut().find(|slot| slot.is_none()) {
            *slot = Some(counter);
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = Counter> + '_ {
        self.items.iter().flatten().copied()
    }
}

fn left(lock: &Lock) -> Left {
    if lock.holds.is_empty() {
        Left::Nothing
    } else {
        Left::OtherHolds
    }
}

/// `LOCK.ACQUIRE`: the one acquire rule ([`hold::decide`]) for every kind and layout.
pub fn acquire(
    live: &Live,
    request: &AcquireRequest<'_>,
    queue: Queue,
    now: UnixMs,
    facts: &mut impl Facts,
) -> Result<Outcome, LockError> {
    let decision = hold::decide(
        live.lock(),
        request.owner,
        request.mode,
        request.lease_ms,
        request.reentry,
        queue,
        now,
    )?;
    match decision {
        Decision::Grant(granted) => grant(live, request, &granted, facts),
        // Holds whose lease ended stay until a write or the waiters' lease check removes them:
        // a refused acquire writes nothing.
        Decision::Busy => busy(live, request, facts),
    }
}

/// What `LOCK.MACQUIRE` decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllOrNothing {
    /// Every key is granted: an outcome per key, in the order asked.
    Granted(Vec<Outcome>),
    /// Some key is busy: nothing is written. `outcome` replies nil or queues the caller on
    /// every key, each of which it saw as `seen` says.
    NotNow {
        outcome: Box<Outcome>,
        seen: Vec<Seen>,
    },
}

/// `LOCK.MACQUIRE`: the one acquire rule on every key; every key or none. A key that refuses
/// the request (an error) refuses it whole; a busy key makes it wait on every key (or nil).
pub fn acquire_all<F: Facts>(
    lives: &[Live],
    requests: &[AcquireRequest<'_>],
    queues: &[Queue],
    now: UnixMs,
    facts: &mut [F],
) -> Result<AllOrNothing, LockError> {
    let mut decisions = Vec::with_capacity(lives.len());
    for ((live, request), queue) in lives.iter().zip(requests).zip(queues) {
        decisions.push(hold::decide(
            live.lock(),
            request.owner,
            request.mode,
            request.lease_ms,
            request.reentry,
            *queue,
            now,
        )?);
    }
    // Every check that can refuse the request runs on every key before anything is taken: a
    // token taken for one key before another refuses would write its counter for nothing.
    for (request, (decision, facts)) in requests.iter().zip(decisions.iter().zip(facts.iter())) {
        if let Decision::Grant(granted) = decision {
            // Checked even when the request will wait: the re-entry happens at its grant.
            check_reentry(request, granted, facts)?;
        }
    }
    if decisions.contains(&Decision::Busy) {
        let (Some(live), Some(request), Some(facts)) =
            (lives.first(), requests.first(), facts.first_mut())
        else {
            return Err(LockError::Internal);
        };
        let outcome = busy(live, request, facts)?;
        let seen = lives.iter().map(Live::seen).collect();
        return Ok(AllOrNothing::NotNow {
            outcome: Box::new(outcome),
            seen,
        });
    }
    for (decision, facts) in decisions.iter().zip(facts.iter_mut()) {
        if let Decision::Grant(granted) = decision {
            check_memory(granted, facts)?;
        }
    }
    let mut outcomes = Vec::with_capacity(lives.len());
    for (((live, request), decision), facts) in
        lives.iter().zip(requests).zip(&decisions).zip(facts)
    {
        if let Decision::Grant(granted) = decision {
            outcomes.push(take(live, request, granted, facts)?);
        }
    }
    Ok(AllOrNothing::Granted(outcomes))
}

/// A re-entry keeps what the hold is: an `EPHEMERAL` hold is re-entered with `EPHEMERAL`, a
/// plain one without (a hold taken before a restart or failover is bound to nothing).
#[inline]
fn check_reentry(
    request: &AcquireRequest<'_>,
    granted: &hold::Granted,
    facts: &impl Facts,
) -> Result<(), LockError> {
    if granted.how != How::Reentered {
        return Ok(());
    }
    let bound = granted.token.and_then(|t| facts.bound_client(t));
    match (bound, request.binding) {
        (Some(_), Binding::Lease) => Err(LockError::HoldIsEphemeral),
        (None, Binding::Connection) => Err(LockError::HoldIsNotEphemeral),
        _ => Ok(()),
    }
}

/// A new hold takes memory: refused over maxmemory like any deny-oom command. A re-entry,
/// renew or release must keep working then (the command is not deny-oom).
#[inline]
fn check_memory(granted: &hold::Granted, facts: &impl Facts) -> Result<(), LockError> {
    if granted.how != How::Reentered && facts.out_of_memory() {
        return Err(LockError::OutOfMemory);
    }
    Ok(())
}

/// A granted acquire: the new hold (or re-entry), its token, and what to announce.
#[inline]
fn grant(
    live: &Live,
    request: &AcquireRequest<'_>,
    granted: &hold::Granted,
    facts: &mut impl Facts,
) -> Result<Outcome, LockError> {
    check_reentry(request, granted, facts)?;
    check_memory(granted, facts)?;
    take(live, request, granted, facts)
}

/// A grant that passed its checks: its token (a new one when it needs one) and the outcome.
#[inline]
fn take(
    live: &Live,
    request: &AcquireRequest<'_>,
    granted: &hold::Granted,
    facts: &mut impl Facts,
) -> Result<Outcome, LockError> {
    // A hold taken by Redisson's own script has no token yet: it gets one now.
    let token = match granted.token {
        Some(token) => token,
        None => facts.next_token()?,
    };
    let new = hold::apply(live.lock(), request.owner, request.mode, granted, token);
    let mut outcome = Outcome::reply(Reply::Integer(token));
    outcome.lease_end = Some(new.next_lease_end());
    if granted.how == How::Reentered {
        outcome.event = Some(LockEvent::Reentered);
        outcome.counters.push(Counter::Reentered);
    } else {
        outcome.event = Some(LockEvent::Acquired);
        outcome.counters.push(Counter::Acquired);
        match granted.kind {
            HoldKind::Shared => outcome.counters.push(Counter::AcquiredShared),
            HoldKind::Permit => outcome.counters.push(Counter::AcquiredPermits),
            HoldKind::Exclusive => {}
        }
        if granted.how == How::Downgraded {
            outcome.counters.push(Counter::Downgraded);
        }
        if request.binding == Binding::Connection {
            outcome.bind = Some((granted.kind, token));
        }
    }
    outcome.write(live, new);
    Ok(outcome)
}

/// Not granted now: nil, or wait when the caller asked to and may.
fn busy(
    live: &Live,
    request: &AcquireRequest<'_>,
    facts: &mut impl Facts,
) -> Result<Outcome, LockError> {
    if request.wait == Wait::No || !facts.can_block() {
        return Ok(Outcome::counted(
            Reply::Null,
            &[Counter::Contended, Counter::AcquireNil],
        ));
    }
    if facts.is_replica() {
        // A writable replica would queue a waiter that nothing there can ever grant.
        return Err(LockError::WaitOnReplica);
    }
    Ok(Outcome::counted(
        Reply::Wait(live.seen()),
        &[Counter::Contended],
    ))
}

/// `LOCK.RELEASE`: one re-entry of the owner's hold less (its exclusive hold first); replies
/// with the owner's remaining re-entries on the key, nil when it holds nothing.
pub fn release(live: &Live, owner: &[u8], token: Option<u64>) -> Result<Outcome, LockError> {
    let Some((new, remaining)) = hold::release(live.lock(), owner, token) else {
        return Ok(Outcome::counted(Reply::Null, &[Counter::ReleaseNotOwner]));
    };
    // The owner's hold this release ended (counted down to zero), if any: one release changes
    // one hold, so only the owner's own holds (two at most) are looked for in `new`.
    let gone = live
        .lock()
        .holds
        .iter()
        .filter(|h| h.owner == owner)
        .find(|h| {
            !new.holds
                .iter()
                .any(|n| n.kind == h.kind && n.owner == owner)
        });
    let mut outcome = Outcome::reply(Reply::Integer(remaining));
    match gone {
        None => outcome.counters.push(Counter::ReleasedPartial),
        Some(hold) => {
            if let Some(token) = hold.token {
                outcome.unbind = Unbind::One(token);
            }
            outcome.event = Some(LockEvent::Released);
            outcome.counters.push(Counter::Released);
            outcome.freed = Some(left(&new));
        }
    }
    outcome.write(live, new);
    Ok(outcome)
}

/// `LOCK.RENEW`: every hold of the owner gets the lease end `now + lease_ms`; 1, or 0 when the
/// owner holds nothing.
pub fn renew(live: &Live, owner: &[u8], lease_ms: u64, now: UnixMs) -> Result<Outcome, LockError> {
    let Some(new) = hold::renew(live.lock(), owner, lease_ms, now) else {
        return Ok(Outcome::counted(
            Reply::Integer(0),
            &[Counter::RenewNotOwner],
        ));
    };
    let mut outcome = Outcome::counted(Reply::Integer(1), &[Counter::Renewed]);
    outcome.event = Some(LockEvent::Renewed);
    // A shorter lease must move the waiters' lease check earlier.
    outcome.lease_end = Some(new.next_lease_end());
    outcome.write(live, new);
    Ok(outcome)
}

/// `LOCK.FORCERELEASE`: the whole lock goes, whoever holds it (1), or 0 when there is none. Only
/// a lock is removed: the store refuses any other hash before this is asked.
pub fn force_release(live: &Live) -> Outcome {
    let Some(stored) = &live.stored else {
        return Outcome::reply(Reply::Integer(0));
    };
    let mut outcome = Outcome::counted(Reply::Integer(1), &[Counter::ForceReleased]);
    outcome.unbind = Unbind::All(stored.lock.holds.iter().filter_map(|h| h.token).collect());
    // Every holder is told: those whose lease had ended (nobody removed their hold yet) that it
    // ran out, the others that it was taken from them.
    outcome.lost = live
        .ended
        .iter()
        .map(|h| Lost::of(h, LostReason::Expired))
        .chain(
            live.lock()
                .holds
                .iter()
                .map(|h| Lost::of(h, LostReason::ForceReleased)),
        )
        .collect();
    outcome.event = Some(LockEvent::ForceReleased);
    outcome.freed = Some(Left::Nothing);
    // Every stored hold goes, ended or not: none is counted as a lease end.
    outcome.write = Some(Lock::free());
    outcome
}

#[cfg(test)]
mod tests;
