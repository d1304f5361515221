//! Registering a command from its one spec (`CommandSpec`, written above each command's handler
//! in `commands/`): its name, handler and flags for `RedisModule_CreateCommand`, then its COMMAND
//! DOCS / COMMAND INFO (summary, complexity, arity, arguments for redis-cli hints, the key spec
//! for cluster routing, ACLs and COMMAND GETKEYS) as the C structures Redis keeps.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int};
use std::ptr;

use redis_module::raw;

use super::{api, Ctx};

#[derive(Clone, Copy)]
pub enum ArgKind {
    Key,
    /// `key [key ...]` after a `numkeys` argument at position 1 (a multi-key command).
    Keys,
    Text,
    Integer,
    /// `WAIT timeout-ms`: a token followed by its value.
    Tokened(&'static CStr),
    /// `ONCE`: a token alone.
    Flag(&'static CStr),
    /// `arg [arg ...]`: the rest of the line, any number of strings (LOCK.GUARD's inner
    /// command's arguments).
    Rest,
}

#[derive(Clone, Copy)]
pub struct ArgDoc {
    pub name: &'static CStr,
    pub kind: ArgKind,
    pub optional: bool,
    pub summary: &'static CStr,
}

pub const fn arg(name: &'static CStr, kind: ArgKind, summary: &'static CStr) -> ArgDoc {
    ArgDoc {
        name,
        kind,
        optional: false,
        summary,
    }
}

pub struct CommandSpec {
    pub name: &'static CStr,
    pub handler: super::CommandHandler,
    /// `RedisModule_CreateCommand` flags (`write fast`, ...).
    pub flags: &'static CStr,
    pub summary: &'static CStr,
    pub complexity: &'static CStr,
    pub arity: c_int,
    /// `REDISMODULE_CMD_KEY_*` flags of the command's one key.
    pub key_flags: u32,
    pub args: &'static [ArgDoc],
}

fn c(s: &'static CStr) -> *const c_char {
    s.as_ptr()
}

/// Builds the C argument array for one command (terminated by a zeroed entry). Leaked: it is
/// built once at load and Redis may keep pointers into it.
fn c_args(args: &[ArgDoc]) -> *mut raw::RedisModuleCommandArg {
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
                ArgKind::Key => {
                    c_arg.key_spec_index = 0;
                    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY
                }
                ArgKind::Keys => {
                    c_arg.key_spec_index = 0;
                    c_arg.flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE as c_int;
                    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY
                }
                ArgKind::Text => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING,
                ArgKind::Rest => {
                    c_arg.flags |= raw::REDISMODULE_CMD_ARG_MULTIPLE as c_int;
                    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING
                }
                ArgKind::Integer => raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER,
                ArgKind::Tokened(token) => {
                    c_arg.token = c(token);
                    raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER
                }
                ArgKind::Flag(token) => {
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

/// Whether the command takes `numkeys key [key ...]` at position 1.
fn counted_keys(spec: &CommandSpec) -> bool {
    spec.args.iter().any(|a| matches!(a.kind, ArgKind::Keys))
}

fn c_key_specs(flags: u32, counted: bool) -> *mut raw::RedisModuleCommandKeySpec {
    // SAFETY: plain C structs; zero is "unset" and terminates the array.
    let mut spec: raw::RedisModuleCommandKeySpec = unsafe { std::mem::zeroed() };
    spec.flags = u64::from(flags);
    spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    spec.bs.index.pos = 1;
    if counted {
        // Like EVAL's: the count at position 1, the keys right after it.
        spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
        spec.fk.keynum.keynumidx = 0;
        spec.fk.keynum.firstkey = 1;
        spec.fk.keynum.keystep = 1;
    } else {
        spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_RANGE;
        spec.fk.range.lastkey = 0;
        spec.fk.range.keystep = 1;
        spec.fk.range.limit = 0;
    }
    // SAFETY: as above.
    let terminator: raw::RedisModuleCommandKeySpec = unsafe { std::mem::zeroed() };
    Box::leak(vec![spec, terminator].into_boxed_slice()).as_mut_ptr()
}

/// Attaches the docs to the registered commands. Failure is logged, not fatal: the commands
/// work without docs.
/// Creates every command (with its key at position 1: every LOCK.* command takes its key first),
/// then attaches its docs. False if a command could not be created; docs that could not be
/// attached are logged, not fatal: the commands work without them.
pub fn register(ctx: Ctx, specs: &[&CommandSpec]) -> bool {
    let created = specs.iter().all(|spec| {
        // A multi-key command's keys are found by its key spec (movable keys), not by a
        // fixed (first, last, step).
        let keys = if counted_keys(spec) {
            (0, 0, 0)
        } else {
            (1, 1, 1)
        };
        super::create_command(ctx, spec.name, spec.handler, spec.flags, keys)
    });
    if created && !attach(ctx, specs) {
        super::log::warning("could not attach COMMAND DOCS to LOCK.* commands");
    }
    created
}

fn attach(ctx: Ctx, docs: &[&CommandSpec]) -> bool {
    let version: &'static raw::RedisModuleCommandInfoVersion =
        Box::leak(Box::new(raw::RedisModuleCommandInfoVersion {
            version: 1,
            sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
            sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
            sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
        }));
    docs.iter().all(|doc| {
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
            key_specs: c_key_specs(doc.key_flags, counted_keys(doc)),
            args: c_args(doc.args),
        }));
        // SAFETY: every pointer in `info` is static or leaked, so it outlives the call (and
        // whatever Redis keeps).
        unsafe { api!(RedisModule_SetCommandInfo)(command, info) == raw::REDISMODULE_OK as c_int }
    })
}
