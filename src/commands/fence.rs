//! Fenced commands:
//!
//! - `LOCK.GUARD key owner token command [arg ...]`: runs `command` only if `owner` holds `key`
//!   under fencing token `token` and its lease has not ended on the server's clock, and answers
//!   its reply unchanged (in the caller's protocol); else `-FENCED ...` and nothing runs. A
//!   shared hold runs read-only commands only.
//! - `LOCK.CHECK key owner token`: 1 if that hold is alive now, else 0 (read-only, for scripts
//!   and functions).
//!
//! Parse, read the owner's holds (O(1), `store::read_owner_holds`), decide
//! (`lock_core::fence`), then run the inner command through `RedisModule_Call` as the calling
//! user under a script's rules (`ffi::call`). The inner command replicates its own effects;
//! LOCK.GUARD itself is never replicated nor written to the AOF. Its keys, with the lock's, are
//! declared through the getkeys API, so cluster routing and ACL key patterns see them all.

use std::os::raw::c_int;

use lock_core::args::{parse_check, parse_guard, FenceRequest, GUARDED_COMMAND_AT};
use lock_core::error::Fenced;
use lock_core::fence::{self, Access};
use lock_core::LockError;

use redis_module::raw;

use super::{KEY, OWNER};
use crate::ffi::call::{self, Flags, KeysOf, Refused, Rules};
use crate::ffi::command_info::{arg, ArgDoc, ArgKind, CommandSpec};
use crate::ffi::{self, now_ms, reply, Args, Ctx, Key, RawString};
use crate::guard;
use crate::stats::{bump, STATS};
use crate::store;

const TOKEN: ArgDoc = arg(
    c"token",
    ArgKind::Integer,
    c"The fencing token LOCK.ACQUIRE returned for the hold.",
);

/// How the lock key is declared: read, never written. The key spec names the lock key only and
/// says so (`INCOMPLETE`, `VARIABLE_FLAGS`): Redis then asks the command itself where its keys
/// are, with their flags (the getkeys API), for cluster routing, ACLs and COMMAND GETKEYS.
const LOCK_KEY_FLAGS: u32 = raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS;

pub const GUARD_SPEC: CommandSpec = CommandSpec {
    name: c"lock.guard",
    handler: lock_guard,
    // `write`: it may write (a replica refuses it, CLIENT PAUSE WRITE holds it back). Not
    // `deny-oom`: the inner command obeys maxmemory as itself (a DEL still runs when full).
    // `deny-script`: inside scripts and functions, LOCK.CHECK is the fence.
    flags: c"write deny-script getkeys-api",
    summary: c"Runs a command only while the owner holds the lock under this fencing token (its lease not ended on the server's clock), answering the command's own reply; else a FENCED error and nothing runs.",
    complexity: c"O(1) to check the hold, plus the command's own cost.",
    arity: -5,
    key_flags: LOCK_KEY_FLAGS
        | raw::REDISMODULE_CMD_KEY_INCOMPLETE
        | raw::REDISMODULE_CMD_KEY_VARIABLE_FLAGS,
    args: &[
        KEY,
        OWNER,
        TOKEN,
        arg(
            c"command",
            ArgKind::Text,
            c"The command to run: one that names keys (in a cluster, in the lock key's slot: share its hash tag); not a LOCK.* command, not the lock's own key.",
        ),
        ArgDoc {
            name: c"arg",
            kind: ArgKind::Rest,
            optional: true,
            summary: c"The command's arguments.",
        },
    ],
};

pub const CHECK_SPEC: CommandSpec = CommandSpec {
    name: c"lock.check",
    handler: lock_check,
    flags: c"readonly fast",
    summary: c"1 if the owner holds the lock under this fencing token and its lease has not ended on the server's clock, else 0.",
    complexity: c"O(1)",
    arity: 4,
    key_flags: LOCK_KEY_FLAGS,
    args: &[KEY, OWNER, TOKEN],
};

pub extern "C" fn lock_guard(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || {
        ffi::with_args(argv, argc, |args| run_guard(ctx, args))
    })
}

pub extern "C" fn lock_check(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || {
        ffi::with_args(argv, argc, |args| run_check(ctx, args))
    })
}

fn run_check(ctx: Ctx, args: &Args<'_>) -> Result<(), LockError> {
    let request = parse_check(args)?;
    let admitted = admit(ctx, args, &request)?.is_ok();
    reply::integer(ctx, i64::from(admitted));
    Ok(())
}

fn run_guard(ctx: Ctx, args: &Args<'_>) -> Result<(), LockError> {
    if ffi::is_keys_position_request(ctx) {
        declare_keys(ctx, args);
        return Ok(());
    }
    // Secrets of the inner line are hidden from MONITOR and SLOWLOG whatever happens next.
    for position in fence::secret_positions(args.get(GUARDED_COMMAND_AT..).unwrap_or_default()) {
        call::redact_argument(ctx, GUARDED_COMMAND_AT + position);
    }
    let request = parse_guard(args)?;
    let inner = args.strings_from(GUARDED_COMMAND_AT);
    let keys = match call::command_keys(ctx, inner, Flags::NotWanted) {
        KeysOf::Keys(keys) => Some(keys),
        KeysOf::None => None,
        KeysOf::UnknownCommand => {
            return Err(LockError::UnknownCommand(
                String::from_utf8_lossy(request.command).into_owned(),
            ))
        }
        KeysOf::WrongArity => {
            return Err(LockError::WrongArity(
                String::from_utf8_lossy(request.command).to_lowercase(),
            ))
        }
    };
    let named = keys
        .iter()
        .flat_map(|keys| keys.iter())
        .map(|(position, _)| {
            args.get(GUARDED_COMMAND_AT + position)
                .copied()
                .unwrap_or_default()
        });
    fence::check_inner(request.command, request.fence.key, named)?;
    let access = admit(ctx, args, &request.fence)?.map_err(|fenced| {
        bump(&STATS.fenced);
        LockError::Fenced(fenced)
    })?;
    bump(&STATS.guarded);
    let rules = match access {
        Access::ReadWrite => Rules::AsCaller,
        Access::ReadOnly => Rules::AsCallerReadOnly,
    };
    let (reply, refused) = call::call(ctx, inner, rules).ok_or(LockError::Internal)?;
    // Redis's own refusals pass through as it words them (script rules, maxmemory, arity...),
    // except two it words as no Redis error: an ACL refusal on Redis 7.0 (`acl verification
    // failed`, not `NOPERM`), and a write refused to a shared hold.
    if let Some(text) = reply.error_text() {
        match refused {
            Refused::Permission if !text.starts_with(b"NOPERM") => {
                return Err(LockError::NoPermission)
            }
            Refused::WriteOrMemory
                if rules == Rules::AsCallerReadOnly && !text.starts_with(b"OOM") =>
            {
                return Err(LockError::SharedHoldWrites)
            }
            _ => {}
        }
    }
    if !reply.forward(ctx) {
        return Err(LockError::Internal);
    }
    Ok(())
}

/// Answers Redis's question where the keys are: the lock key (read), then the inner command's
/// keys with the flags Redis's own key lookup gives them (most commands report none there: the
/// inner command's ACL check, with its exact flags, runs when it is called). A LOCK.* inner
/// command is not looked into: it is refused, and a LOCK.GUARD inside would ask again without
/// end.
fn declare_keys(ctx: Ctx, args: &Args<'_>) {
    if args.len() < 2 {
        return;
    }
    call::key_at_with_flags(ctx, 1, LOCK_KEY_FLAGS as c_int);
    let Some(command) = args.get(GUARDED_COMMAND_AT) else {
        return;
    };
    if fence::is_lock_command(command) {
        return;
    }
    let inner = args.strings_from(GUARDED_COMMAND_AT);
    if let KeysOf::Keys(keys) = call::command_keys(ctx, inner, Flags::Wanted) {
        for (position, flags) in keys.iter() {
            call::key_at_with_flags(ctx, GUARDED_COMMAND_AT + position, flags);
        }
    }
}

/// Whether the owner's hold admits the token now, from its holds read in O(1) (the lock key is
/// closed again before anything else runs). A key that is not a lock is an error, as for every
/// command.
fn admit(
    ctx: Ctx,
    args: &Args<'_>,
    request: &FenceRequest<'_>,
) -> Result<Result<Access, Fenced>, LockError> {
    let holds = {
        let key = Key::open_read(ctx, args.string(1));
        store::read_owner_holds(&key, args.string(2), request.owner)?
    };
    Ok(fence::admit(&holds, request.owner, request.token, now_ms()))
}
