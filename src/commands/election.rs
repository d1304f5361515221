//! Leader election on a lock key:
//!
//! - `LOCK.CAMPAIGN key candidate lease-ms [EPHEMERAL] [WAIT timeout-ms] [VALUE value]`: an
//!   exclusive acquire that never counts a re-entry (`ONCE`); the token is the leader's epoch.
//!   A new leader (at once, or when its `WAIT` is granted) is announced on the key's leader
//!   channel (`elected <epoch> <candidate>`), with its value (`proclaimed <epoch> <value>`).
//! - `LOCK.PROCLAIM key candidate epoch value`: the leader of `epoch` publishes a value; 1, or 0
//!   when `candidate` does not lead the key in `epoch` (then nothing is written or published).
//! - `LOCK.LEADER key`: `[leader, epoch, value]` (value nil if none was proclaimed in this
//!   epoch), or nil when nobody leads.

use std::os::raw::c_int;

use lock_core::args::{parse_campaign, parse_key_only, parse_proclaim, Binding};
use lock_core::command::{self, LockEvent, Reply};
use lock_core::election::{self, Campaign};
use lock_core::queue::LockKey;
use lock_core::ticket::Shape;
use lock_core::LockError;

use redis_module::raw;

use super::outcome::{self, CommandFacts, Target};
use super::{KEY, LEASE};
use crate::ffi::command_info::{arg, ArgDoc, ArgKind, CommandSpec};
use crate::ffi::{self, now_ms, reply, Args, Ctx, Key, RawString};
use crate::store::OwnLease;
use crate::{config, guard, runtime, store};

const CANDIDATE: ArgDoc = arg(
    c"candidate",
    ArgKind::Text,
    c"Who campaigns (the lock's owner while it leads).",
);

pub const CAMPAIGN_SPEC: CommandSpec = CommandSpec {
    name: c"lock.campaign",
    handler: campaign,
    flags: c"write blocking",
    summary: c"Campaigns for leadership of the key: an exclusive hold (never a counted re-entry) whose token is the epoch; a new leader is announced on the key's leader channel.",
    complexity: c"O(1)",
    arity: -4,
    key_flags: raw::REDISMODULE_CMD_KEY_RW
        | raw::REDISMODULE_CMD_KEY_ACCESS
        | raw::REDISMODULE_CMD_KEY_UPDATE,
    args: &[
        KEY,
        CANDIDATE,
        LEASE,
        ArgDoc {
            name: c"ephemeral",
            kind: ArgKind::Flag(c"EPHEMERAL"),
            optional: true,
            summary: c"Leadership ends when this connection closes (or at its lease end).",
        },
        ArgDoc {
            name: c"timeout-ms",
            kind: ArgKind::Tokened(c"WAIT"),
            optional: true,
            summary: c"Wait in FIFO order up to this many milliseconds to lead (0 = forever).",
        },
        ArgDoc {
            name: c"ticket",
            kind: ArgKind::Flag(c"TICKET"),
            optional: true,
            summary: c"With WAIT: reply at once with a ticket key instead of blocking; the answer is pushed there (pop it with BLPOP; withdraw it with LOCK.CANCEL).",
        },
        ArgDoc {
            name: c"value",
            kind: ArgKind::Tokened(c"VALUE"),
            optional: true,
            summary: c"A value to proclaim on election (at most 4096 bytes).",
        },
    ],
};

pub const PROCLAIM_SPEC: CommandSpec = CommandSpec {
    name: c"lock.proclaim",
    handler: proclaim,
    flags: c"write fast",
    summary: c"The leader of an epoch publishes a value for the key's observers; 0 when the candidate does not lead in that epoch.",
    complexity: c"O(1) for an election key (an exclusive hold); O(N) in the holders of a shared or semaphore key.",
    arity: 5,
    // It writes the key's proclamation (kept beside the key, in its slot): a user needs write
    // access to the election key to proclaim.
    key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE,
    args: &[
        KEY,
        CANDIDATE,
        arg(c"epoch", ArgKind::Integer, c"The epoch (token) it leads in."),
        arg(c"value", ArgKind::Text, c"At most 4096 bytes."),
    ],
};

pub const LEADER_SPEC: CommandSpec = CommandSpec {
    name: c"lock.leader",
    handler: leader,
    flags: c"readonly fast",
    summary: c"The key's leader, its epoch and the value it proclaimed in that epoch, or nil when nobody leads.",
    complexity: c"O(1)",
    arity: 2,
    key_flags: raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
    args: &[KEY],
};

pub extern "C" fn campaign(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || {
        ffi::with_args(argv, argc, |args| run_campaign(ctx, args))
    })
}

pub extern "C" fn proclaim(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || {
        ffi::with_args(argv, argc, |args| run_proclaim(ctx, args))
    })
}

pub extern "C" fn leader(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || {
        ffi::with_args(argv, argc, |args| run_leader(ctx, args))
    })
}

fn run_campaign(ctx: Ctx, args: &Args<'_>) -> Result<(), LockError> {
    let campaign = parse_campaign(args, config::max_lease_ms())?;
    let request = &campaign.acquire;
    super::refuse_while_paused()?;
    if request.binding == Binding::Connection && ffi::in_script(ctx) {
        return Err(LockError::EphemeralInScript);
    }
    let key = LockKey::new(ffi::selected_db(ctx), request.key);
    let queue = super::queue_at(&key);
    let now = now_ms();
    let target = Target::open(ctx, args, request.key, Some(OwnLease::Replaced));
    let live = target.read(now)?;
    let mut facts = CommandFacts {
        ctx,
        name: request.key,
        now,
    };
    let outcome = command::acquire(&live, request, queue, now, &mut facts)?;
    // A new leader is announced; a candidate that leads already keeps its epoch (and may
    // proclaim a new value with it).
    let granted = match outcome.reply {
        Reply::Integer(epoch) => Some((epoch, outcome.event == Some(LockEvent::Acquired))),
        Reply::Null | Reply::Wait(_) => None,
    };
    let Some(seen) = outcome::carry_out(ctx, target, &live, outcome)? else {
        match granted {
            Some((epoch, true)) => {
                crate::election::announce(ctx, request.key, epoch, request.owner, campaign.value)
            }
            Some((epoch, false)) => {
                if let Some(value) = campaign.value {
                    crate::election::proclaim(ctx, request.key, epoch, value);
                }
            }
            None => {}
        }
        return Ok(());
    };
    let announce = Campaign {
        value: campaign.value.map(Into::into),
    };
    runtime::enqueue(
        ctx,
        &[(key, seen)],
        runtime::Request::of(ctx, request, Some(announce), Shape::One),
    )
}

fn run_proclaim(ctx: Ctx, args: &Args<'_>) -> Result<(), LockError> {
    let request = parse_proclaim(args)?;
    super::refuse_while_paused()?;
    let now = now_ms();
    let live = read_only(ctx, args, now)?;
    if !election::leads(live.lock(), request.owner, request.epoch, now) {
        reply::integer(ctx, 0);
        return Ok(());
    }
    crate::election::proclaim(ctx, request.key, request.epoch, request.value);
    reply::integer(ctx, 1);
    Ok(())
}

/// The lock at the key (argument 1) as it stands at `now`, read without writing.
fn read_only(ctx: Ctx, args: &Args<'_>, now: u64) -> Result<lock_core::command::Live, LockError> {
    store::read_live(&Key::open_read(ctx, args.string(1)), None, now)
}

fn run_leader(ctx: Ctx, args: &Args<'_>) -> Result<(), LockError> {
    let name = parse_key_only(args)?;
    let now = now_ms();
    let live = read_only(ctx, args, now)?;
    let Some(leader) = election::leader(live.lock(), now) else {
        reply::null(ctx);
        return Ok(());
    };
    let Some(epoch) = leader.token.and_then(|t| i64::try_from(t).ok()) else {
        // Taken by Redisson's own script: a hold without a token has no epoch.
        reply::null(ctx);
        return Ok(());
    };
    let stored = store::read_proclaimed(ctx, name);
    let value = election::current_value(leader, stored.as_deref());
    reply::array(ctx, 3);
    reply::bulk(ctx, leader.owner.as_slice());
    reply::integer(ctx, epoch);
    match value {
        Some(value) => reply::bulk(ctx, value),
        None => reply::null(ctx),
    }
    Ok(())
}
