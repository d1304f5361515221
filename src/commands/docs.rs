//! COMMAND DOCS / COMMAND INFO for every LOCK.* command: summary, since, complexity, arity,
//! arguments (for redis-cli hints) and key specs (for cluster routing, ACLs, COMMAND GETKEYS).

use std::ffi::CStr;
use std::os::raw::{c_char, c_int};
use std::ptr;

use redis_module::raw;

use crate::ffi::{api, Ctx};

#[derive(Clone, Copy)]
enum Kind {
    Key,
    Text,
    Integer,
    /// `WAIT timeout-ms`: a token followed by its value.
    Tokened(&'static CStr),
    /// `ONCE`: a token alone.
    Flag(&'static CStr),
}

#[derive(Clone, Copy)]
struct Arg {
    name: &'static CStr,
    kind: Kind,
    optional: bool,
    summary: &'static CStr,
}

const fn arg(name: &'static CStr, kind: Kind, summary: &'static CStr) -> Arg {
    Arg {
        name,
        kind,
        optional: false,
        summary,
    }
}

struct Doc {
    name: &'static CStr,
    summary: &'static CStr,
    complexity: &'static CStr,
    arity: c_int,
    key_flags: u32,
    args: &'static [Arg],
}

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

fn c(s: &'static CStr) -> *const c_char {
    s.as_ptr()
}

/// Builds the C argument array for one command (terminated by a zeroed entry). Leaked: it is
/// built once at load and Redis may keep pointers into it.
fn c_args(args: &[Arg]) -> *mut raw::RedisModuleCommandArg {
    let mut out: Vec<raw::RedisModuleCommandArg> = args
        .iter()
        .map(|a| {
            // SAFETY: RedisModuleCommandArg is a plain C struct for which all-zero is "unset".
            let mut c_arg: raw::RedisModuleCommandArg = unsafe { std::mem::zeroed() };
            c_arg.name = c(a.name);
            c_arg.summary = c(a.summary);
            c_arg.key_spec_index = -1;
            c_arg.flags = if a.optional {
                raw::REDISMODULE_CMD_ARG_OPTIONAL as c_int
            } else {
                0
            };
            c_arg.type_ = match a.kind {
                Kind::Key => {
                    c_arg.key_spec_index = 0;
                    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY
                }
                Kind::Text => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
                Kind::Integer => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
                Kind::Tokened(token) => {
                    c_arg.token = c(token);
                    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER
                }
                Kind::Flag(token) => {
                    c_arg.token = c(token);
                    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN
                }
            };
            c_arg
        })
        .collect();
    // SAFETY: as above; the zeroed entry terminates the array.
    out.push(unsafe { std::mem::zeroed() });
    Box::leak(out.into_boxed_slice()).as_mut_ptr()
}

fn c_key_specs(flags: u32) -> *mut raw::RedisModuleCommandKeySpec {
    // SAFETY: plain C structs; zero is "unset" and terminates the array.
    let mut spec: raw::RedisModuleCommandKeySpec = unsafe { std::mem::zeroed() };
    spec.flags = u64::from(flags);
    spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    spec.bs.index.pos = 1;
    spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
    spec.fk.range.lastkey = 0;
    spec.fk.range.keystep = 1;
    spec.fk.range.limit = 0;
    // SAFETY: as above.
    let terminator: raw::RedisModuleCommandKeySpec = unsafe { std::mem::zeroed() };
    Box::leak(vec![spec, terminator].into_boxed_slice()).as_mut_ptr()
}

/// Attaches the docs to the registered commands. Failure is logged, not fatal: the commands
/// work without docs.
pub fn attach(ctx: Ctx) -> bool {
    let version: &'static raw::RedisModuleCommandInfoVersion =
        Box::leak(Box::new(raw::RedisModuleCommandInfoVersion {
            version: 1,
            sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
            sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
            sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
        }));
    DOCS.iter().all(|doc| {
        // SAFETY: ctx is the load context and the command was registered just before.
        let command = unsafe { api!(RedisModule_GetCommand)(ctx, doc.name.as_ptr()) };
        if command.is_null() {
            return false;
        }
        let info = Box::leak(Box::new(raw::RedisModuleCommandInfo {
            version,
            summary: c(doc.summary),
            complexity: c(doc.complexity),
            since: c(c"1.0.0"),
            history: ptr::null_mut(),
            tips: ptr::null(),
            arity: doc.arity,
            key_specs: c_key_specs(doc.key_flags),
            args: c_args(doc.args),
        }));
        // SAFETY: every pointer in `info` is static or leaked, so it outlives the call (and
        // whatever Redis keeps).
        unsafe { api!(RedisModule_SetCommandInfo)(command, info) == raw::REDISMODULE_OK as c_int }
    })
}
