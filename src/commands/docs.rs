//! COMMAND DOCS / COMMAND INFO for every LOCK.* command: summary, since, complexity, arity,
//! arguments (for redis-cli hints) and key specs (for cluster routing, ACLs, COMMAND GETKEYS).

use redis_module::raw;

use crate::ffi::command_info::{arg, ArgDoc as Arg, ArgKind as Kind, CommandDoc as Doc};
use crate::ffi::Ctx;

const KEY: Arg = arg(c"key", Kind::Key, c"The lock's key.");
const OWNER: Arg = arg(
    c"owner",
    Kind::Text,
    c"Who takes or holds the lock (e.g. a client id plus thread id).",
);
const LEASE: Arg = arg(
    c"lease-ms",
    Kind::Integer,
    c"Lease in milliseconds, 1 to lock.max-lease-ms.",
);

const DOCS: [Doc; 5] = [
    Doc {
        name: c"lock.acquire",
        summary: c"Takes or re-enters a hold (exclusive, SHARED or a LIMIT n permit) and returns its fencing token; with WAIT, blocks in FIFO order until granted or timed out.",
        complexity: c"O(1) for an exclusive lock; O(N) in the key's holders for shared and semaphore keys.",
        arity: -4,
        // Redis allows one of INSERT/UPDATE/DELETE; an acquire updates (or creates) the hold.
        key_flags: raw::REDISMODULE_CMD_KEY_RW
            | raw::REDISMODULE_CMD_KEY_ACCESS
            | raw::REDISMODULE_CMD_KEY_UPDATE,
        args: &[
            KEY,
            OWNER,
            LEASE,
            Arg {
                name: c"timeout-ms",
                kind: Kind::Tokened(c"WAIT"),
                optional: true,
                summary: c"Block up to this many milliseconds for the lock (0 = forever).",
            },
            Arg {
                name: c"shared",
                kind: Kind::Flag(c"SHARED"),
                optional: true,
                summary: c"A shared (read) hold: any number of owners hold the key SHARED together; not with LIMIT.",
            },
            Arg {
                name: c"limit",
                kind: Kind::Tokened(c"LIMIT"),
                optional: true,
                summary: c"A semaphore permit: at most this many owners (1 to 10000) hold the key at once; not with SHARED.",
            },
            Arg {
                name: c"ephemeral",
                kind: Kind::Flag(c"EPHEMERAL"),
                optional: true,
                summary: c"Bind the hold to this connection: it ends when the connection closes, or at its lease end.",
            },
            Arg {
                name: c"once",
                kind: Kind::Flag(c"ONCE"),
                optional: true,
                summary: c"If the owner holds the lock already, return its token and reset the lease without counting a re-entry (safe to retry).",
            },
        ],
    },
    Doc {
        name: c"lock.release",
        summary: c"Releases one re-entry of a lock; at zero the lock is freed or handed to the next waiter.",
        complexity: c"O(1)",
        arity: 3,
        key_flags: raw::REDISMODULE_CMD_KEY_RW
            | raw::REDISMODULE_CMD_KEY_ACCESS
            | raw::REDISMODULE_CMD_KEY_DELETE,
        args: &[KEY, OWNER],
    },
    Doc {
        name: c"lock.renew",
        summary: c"Resets the lease of a lock the owner holds.",
        complexity: c"O(1)",
        arity: 4,
        key_flags: raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE,
        args: &[KEY, OWNER, LEASE],
    },
    Doc {
        name: c"lock.info",
        summary: c"Returns a lock's owner, re-entry count, remaining lease, fencing token and number of waiters.",
        complexity: c"O(1)",
        arity: 2,
        key_flags: raw::REDISMODULE_CMD_KEY_RO | raw::REDISMODULE_CMD_KEY_ACCESS,
        args: &[KEY],
    },
    Doc {
        name: c"lock.forcerelease",
        summary: c"Administrative: removes a lock whoever holds it; it goes to the next waiter.",
        complexity: c"O(1)",
        arity: 2,
        key_flags: raw::REDISMODULE_CMD_KEY_RM | raw::REDISMODULE_CMD_KEY_DELETE,
        args: &[KEY],
    },
];

/// Attaches the docs to the registered commands. Failure is logged, not fatal: the commands
/// work without docs.
pub fn attach(ctx: Ctx) -> bool {
    crate::ffi::command_info::attach(ctx, &DOCS)
}
