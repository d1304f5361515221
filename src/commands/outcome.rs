//! Carrying out what a command decided (`lock_core::command::Outcome`), in one place and one
//! order: write the lock, bind or unbind its holds, count and announce the holds whose lease
//! ended, tell holders they lost their holds, raise the event, move the counters, move the waiters' lease check, hand the room to
//! waiters (else publish the unlock), reply. The lock itself is written by `store::write_lock`,
//! the writer the scheduler's grants use too.

use lock_core::command::{Counter, Counters, Facts, Left, Live, LockEvent, Outcome, Reply};
use lock_core::key::ClientId;
use lock_core::scheduler::Seen;
use lock_core::LockError;

use crate::ffi::{self, reply, Args, Ctx, Key, KeyKind, RawString};
use crate::stats::{add, bump, STATS};
use crate::store::{OwnLease, Owner};
use crate::{notify, runtime, store};

/// The key a command works on: open for writing, with its name as a Redis string and as bytes,
/// and the requester's owner name as a Redis string (reused when its field is written).
pub struct Target<'a> {
    pub key: Key,
    pub key_name: RawString,
    pub name: &'a [u8],
    pub owner: Option<Owner>,
}

impl<'a> Target<'a> {
    /// The key at argument 1, and the owner at argument 2 when the command has one (with what
    /// the command does to the lease of the owner's own exclusive hold: see `store::OwnLease`).
    pub fn open(ctx: Ctx, args: &Args<'_>, name: &'a [u8], owner: Option<OwnLease>) -> Target<'a> {
        Target::open_at(ctx, args, 1, name, owner.map(|lease| (2, lease)))
    }

    /// The key at argument `at`, and the owner at the given argument (a multi-key command's
    /// keys and owner stand elsewhere).
    pub fn open_at(
        ctx: Ctx,
        args: &Args<'_>,
        at: usize,
        name: &'a [u8],
        owner: Option<(usize, OwnLease)>,
    ) -> Target<'a> {
        let key_name = args.string(at);
        Target {
            key: Key::open(ctx, key_name),
            key_name,
            name,
            owner: owner.map(|(at, lease)| Owner {
                name: args.string(at),
                lease,
            }),
        }
    }

    /// The lock at the key as it stands at `now`.
    pub fn read(&self, now: u64) -> Result<Live, LockError> {
        store::read_live(&self.key, self.owner, now)
    }
}

/// What a command's decision asks the server, through the command's context.
pub struct CommandFacts<'a> {
    pub ctx: Ctx,
    pub name: &'a [u8],
    pub now: u64,
}

impl Facts for CommandFacts<'_> {
    fn out_of_memory(&self) -> bool {
        ffi::out_of_memory(self.ctx)
    }

    fn bound_client(&self, token: u64) -> Option<ClientId> {
        runtime::bound_client(self.ctx, self.name, token)
    }

    fn next_token(&mut self) -> Result<u64, LockError> {
        store::next_token(self.ctx, self.name, self.now)
    }

    fn can_block(&self) -> bool {
        super::can_block(self.ctx)
    }

    fn is_replica(&self) -> bool {
        ffi::is_replica(self.ctx)
    }
}

/// Carries `outcome` out on `target`, whose lock was read as `live`. Returns what the caller
/// saw when the outcome is to wait (only `LOCK.ACQUIRE ... WAIT` queues its client).
pub fn carry_out(
    ctx: Ctx,
    target: Target<'_>,
    live: &Live,
    outcome: Outcome,
) -> Result<Option<Seen>, LockError> {
    let written = write(ctx, target, live, &outcome)?;
    let (reply, room) = finish(ctx, written, &outcome);
    if let Some(room) = room {
        hand_off(ctx, room);
    }
    match reply {
        Replied::Wait(seen) => return Ok(Some(seen)),
        Replied::Integer(value) => reply::integer(ctx, value),
        Replied::Null => reply::null(ctx),
    }
    Ok(None)
}

/// What a command replies once its outcome is carried out.
#[derive(Debug, Clone, Copy)]
pub enum Replied {
    Integer(i64),
    Null,
    Wait(Seen),
}

/// An outcome whose lock is written and whose key is closed: what is left to carry out.
pub struct Written<'a> {
    key_name: RawString,
    name: &'a [u8],
    integer: Option<i64>,
}

/// Writes the outcome's lock and closes the key. A multi-key command writes every key first,
/// then finishes each: nothing the scheduler does on one key (a handoff opens keys) runs while
/// another key of the command is still open.
#[inline]
pub fn write<'a>(
    ctx: Ctx,
    target: Target<'a>,
    live: &Live,
    outcome: &Outcome,
) -> Result<Written<'a>, LockError> {
    // Checked before anything is written: a reply Redis cannot carry fails the command whole.
    let integer = match outcome.reply {
        Reply::Integer(value) => Some(store::stored_integer(value)?),
        Reply::Null | Reply::Wait(_) => None,
    };
    let Target {
        key,
        key_name,
        name,
        owner,
    } = target;
    if let Some(new) = &outcome.write {
        let owner = owner.map(|o| o.name);
        store::write_lock(ctx, &key, key_name, owner, live.stored.as_ref(), new)?;
    }
    // Closed before the scheduler runs: a handoff opens the key again.
    drop(key);
    Ok(Written {
        key_name,
        name,
        integer,
    })
}

/// Room a command made on a key: handed to the waiters by [`hand_off`].
pub struct Room<'a> {
    key_name: RawString,
    name: &'a [u8],
    left: Left,
}

/// Hands the room to the key's waiters, else publishes the unlock (`runtime::lock_freed`).
#[inline]
pub fn hand_off(ctx: Ctx, room: Room<'_>) {
    runtime::lock_freed(ctx, room.key_name, room.name, room.left);
}

/// [`hand_off`] for one of several keys a command freed: a handoff of an earlier key may have
/// granted this one too (a waiter that asked for both), and then it is not free to announce.
pub fn hand_off_after_others(ctx: Ctx, room: Room<'_>) {
    if room.left == Left::Nothing && Key::open_read(ctx, room.key_name).kind() != KeyKind::Missing {
        return;
    }
    hand_off(ctx, room);
}

/// The rest of a written outcome, in order: bind or unbind its holds, count and announce the
/// holds whose lease ended, tell holders they lost their holds, raise the event, move the
/// counters, move the waiters' lease check; and the room it made, for [`hand_off`] (a
/// multi-key command finishes every key before it hands any room on, so that a handoff never
/// comes between another key's events).
/// The outcome is read in place, never moved: it is large, and every command passes here.
#[inline]
pub fn finish<'a>(
    ctx: Ctx,
    written: Written<'a>,
    outcome: &Outcome,
) -> (Replied, Option<Room<'a>>) {
    let Written {
        key_name,
        name,
        integer,
    } = written;
    let &Outcome {
        write: _,
        bind,
        ref unbind,
        ended,
        ref lost,
        event,
        counters,
        lease_end,
        freed,
        reply,
    } = outcome;
    if let Some((kind, token)) = bind {
        runtime::bind(ctx, name, kind, token);
    }
    for &token in unbind.tokens() {
        runtime::unbind(ctx, name, token);
    }
    if ended > 0 {
        add(&STATS.holds_expired, ended as u64);
        notify::event(ctx, c"lock.expired", key_name);
    }
    if !lost.is_empty() {
        let db = ffi::selected_db(ctx);
        for lost in lost {
            notify::publish_lost(ctx, db, name, lost);
        }
    }
    if let Some(event) = event {
        notify::event(ctx, event_name(event), key_name);
    }
    count(counters);
    if let Some(next_lease_end) = lease_end {
        runtime::lease_changed(ctx, name, next_lease_end);
    }
    let room = freed.map(|left| Room {
        key_name,
        name,
        left,
    });
    let replied = match (reply, integer) {
        (Reply::Wait(seen), _) => Replied::Wait(seen),
        (_, Some(value)) => Replied::Integer(value),
        _ => Replied::Null,
    };
    (replied, room)
}

/// Moves the `INFO lock` counters of an outcome.
pub fn count(counters: Counters) {
    for counter in counters.iter() {
        bump(counter_of(counter));
    }
}

fn event_name(event: LockEvent) -> &'static std::ffi::CStr {
    match event {
        LockEvent::Acquired => c"lock.acquired",
        LockEvent::Reentered => c"lock.reentered",
        LockEvent::Released => c"lock.released",
        LockEvent::Renewed => c"lock.renewed",
        LockEvent::ForceReleased => c"lock.forcereleased",
    }
}

fn counter_of(counter: Counter) -> &'static std::sync::atomic::AtomicU64 {
    match counter {
        Counter::Acquired => &STATS.acquired,
        Counter::AcquiredShared => &STATS.acquired_shared,
        Counter::AcquiredPermits => &STATS.acquired_permits,
        Counter::Downgraded => &STATS.downgraded,
        Counter::Reentered => &STATS.reentered,
        Counter::Contended => &STATS.contended,
        Counter::AcquireNil => &STATS.acquire_nil,
        Counter::Released => &STATS.released,
        Counter::ReleasedPartial => &STATS.released_partial,
        Counter::ReleaseNotOwner => &STATS.release_not_owner,
        Counter::Renewed => &STATS.renewed,
        Counter::RenewNotOwner => &STATS.renew_not_owner,
        Counter::ForceReleased => &STATS.force_released,
    }
}
