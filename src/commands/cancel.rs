//! `LOCK.CANCEL ticket`: withdraws a ticket a waiting command replied (`... WAIT timeout-ms
//! TICKET`). Nil when the ticket was still queued (it leaves the queue) or holds no grant (it
//! timed out, was redirected, or its grant was popped already); the grant — the token, or a
//! token per key of `LOCK.MACQUIRE` — when it was granted and not popped: the caller holds it
//! then, and releases it. A grant is delivered once: popped or handed to a canceller, never
//! both. Any connection may cancel a ticket.

use std::os::raw::c_int;

use lock_core::args::parse_cancel;
use lock_core::scheduler::Cancelled;
use lock_core::ticket::Shape;
use lock_core::LockError;

use redis_module::raw;

use crate::ffi::command_info::{arg, ArgKind, CommandSpec};
use crate::ffi::{self, reply, Args, Ctx, RawString};
use crate::{guard, runtime, store};

pub const SPEC: CommandSpec = CommandSpec {
    name: c"lock.cancel",
    handler: cancel,
    flags: c"write fast",
    summary: c"Withdraws a ticket (LOCK.ACQUIRE/MACQUIRE/CAMPAIGN ... WAIT ... TICKET): nil when it was still queued or holds no grant; its token(s) when it was granted and not popped, which the caller then holds.",
    complexity: c"O(1)",
    arity: 2,
    // It reads and deletes the ticket key (the grant it takes out is returned).
    key_flags: raw::REDISMODULE_CMD_KEY_RW
        | raw::REDISMODULE_CMD_KEY_ACCESS
        | raw::REDISMODULE_CMD_KEY_DELETE,
    args: &[arg(
        c"ticket",
        ArgKind::Key,
        c"The ticket a waiting command with TICKET replied.",
    )],
};

pub extern "C" fn cancel(ctx: Ctx, argv: *mut RawString, argc: c_int) -> c_int {
    guard::command(ctx, || ffi::with_args(argv, argc, |args| run(ctx, args)))
}

fn run(ctx: Ctx, args: &Args<'_>) -> Result<(), LockError> {
    let ticket = parse_cancel(args, ffi::selected_db(ctx))?;
    super::refuse_while_paused()?;
    if ffi::is_replica(ctx) {
        return Err(LockError::TicketOnReplica);
    }
    match runtime::cancel(ctx, ticket)? {
        Cancelled::Left | Cancelled::Nothing => reply::null(ctx),
        Cancelled::Handed(tokens) => {
            let tokens = tokens
                .into_iter()
                .map(store::stored_integer)
                .collect::<Result<Vec<i64>, _>>()?;
            match (ticket.shape, tokens.as_slice()) {
                (Shape::One, [token]) => reply::integer(ctx, *token),
                _ => reply::integers(ctx, &tokens),
            }
        }
    }
    Ok(())
}
