//! Running one command inside another: where a command's keys are
//! (`RedisModule_GetCommandKeysWithFlags`), declaring them in a keys-position request
//! (`RedisModule_KeyAtPosWithFlags`), and calling it (`RedisModule_Call`) with its reply passed
//! back as it came (`RedisModule_ReplyWithCallReply`). LOCK.GUARD's inner command goes through
//! here.

use std::ffi::{CStr, CString};
use std::os::raw::c_int;
use std::ptr;

use redis_module::raw;

use super::{api, bytes, Ctx, RawString};

/// The keys Redis finds in a command line (positions counted from the command's name, and
/// their `REDISMODULE_CMD_KEY_*` flags as Redis reports them: most commands report none). The
/// arrays are Redis's, freed on drop.
pub struct CommandKeys {
    positions: *mut c_int,
    flags: *mut c_int,
    len: usize,
}

impl CommandKeys {
    /// (position, flags) of each key, in the order Redis found them (flags 0 when they were
    /// not asked for).
    pub fn iter(&self) -> impl Iterator<Item = (usize, c_int)> + '_ {
        (0..self.len).filter_map(|i| {
            // SAFETY: the arrays hold `len` ints (RM_GetCommandKeysWithFlags allocated them
            // with that count; the flags only when asked for, else null) and live until drop;
            // `i < len`.
            let (position, flags) = unsafe {
                let flags = if self.flags.is_null() {
                    0
                } else {
                    *self.flags.add(i)
                };
                (*self.positions.add(i), flags)
            };
            usize::try_from(position).ok().map(|p| (p, flags))
        })
    }
}

impl Drop for CommandKeys {
    fn drop(&mut self) {
        // SAFETY: Redis allocated both arrays for the caller, who must RM_Free them; each is
        // freed once (a null one is not freed).
        unsafe {
            for p in [self.positions, self.flags] {
                if !p.is_null() {
                    api!(RedisModule_Free)(p.cast());
                }
            }
        }
    }
}

/// What Redis says about a command line's keys.
pub enum KeysOf {
    Keys(CommandKeys),
    /// A command Redis knows, with no key in this line.
    None,
    /// No such command.
    UnknownCommand,
    /// The command exists, with another number of arguments.
    WrongArity,
}

/// The keys of the command line `argv` (its name first), as Redis's own key lookup finds them:
/// the same lookup cluster routing and ACLs use for that command. `Flags::Wanted` asks for each
/// key's flags too (one more allocation: only a keys-position request needs them).
pub fn command_keys(ctx: Ctx, argv: &[RawString], flags: Flags) -> KeysOf {
    let Ok(argc) = c_int::try_from(argv.len()) else {
        return KeysOf::WrongArity;
    };
    if argc == 0 {
        return KeysOf::UnknownCommand;
    }
    let mut count: c_int = 0;
    let mut key_flags: *mut c_int = ptr::null_mut();
    let out_flags: *mut *mut c_int = match flags {
        Flags::Wanted => &mut key_flags,
        Flags::NotWanted => ptr::null_mut(),
    };
    set_errno(0);
    // SAFETY: `argv` holds `argc` live strings (a command's arguments); Redis only reads them
    // (the pointer is mutable in the signature alone). The returned arrays are ours to free
    // (a null `out_flags` asks for no flags array); errno tells a missing command or a wrong
    // arity from a command without keys.
    let positions = unsafe {
        api!(RedisModule_GetCommandKeysWithFlags)(
            ctx,
            argv.as_ptr().cast_mut(),
            argc,
            &mut count,
            out_flags,
        )
    };
    if positions.is_null() {
        return match errno() {
            libc::ENOENT => KeysOf::UnknownCommand,
            libc::EINVAL => KeysOf::WrongArity,
            _ => KeysOf::None,
        };
    }
    KeysOf::Keys(CommandKeys {
        positions,
        flags: key_flags,
        len: usize::try_from(count).unwrap_or(0),
    })
}

/// Whether [`command_keys`] reports each key's flags.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Flags {
    Wanted,
    NotWanted,
}

/// Declares argument `pos` a key with `flags` (`REDISMODULE_CMD_KEY_*`), inside a
/// keys-position request.
pub fn key_at_with_flags(ctx: Ctx, pos: usize, flags: c_int) {
    let Ok(pos) = c_int::try_from(pos) else {
        return;
    };
    // SAFETY: ctx is the context of a keys-position request (Redis ignores the call otherwise).
    unsafe { api!(RedisModule_KeyAtPosWithFlags)(ctx, pos, flags) };
}

/// Hides argument `pos` of the running command from `MONITOR` and `SLOWLOG` (as Redis hides a
/// password it takes).
pub fn redact_argument(ctx: Ctx, pos: usize) {
    let Ok(pos) = c_int::try_from(pos) else {
        return;
    };
    // SAFETY: ctx is the running command's; Redis checks `pos` against its argv and only marks
    // the argument, which it replaces with "(redacted)" when it logs the command.
    unsafe {
        api!(RedisModule_RedactClientCommandArgument)(ctx, pos);
    }
}

/// How the inner command is run: the `RedisModule_Call` flags.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Rules {
    /// `C` as the calling user (ACLs on the command, its keys and channels), `S` under the
    /// rules of a script (no MULTI/EXEC/WATCH, EVAL, FCALL, SUBSCRIBE, WAIT, ...; writes obey
    /// min-replicas and disk errors), `M` refused over `maxmemory` if it is `deny-oom`, `!`
    /// replicated (its own effects, to replicas and the AOF), `0` in the caller's protocol
    /// (RESP2 or RESP3), `E` with Redis's errors as replies. Blocking commands answer at once:
    /// `RedisModule_Call` never blocks.
    AsCaller,
    /// The same, and `W`: write commands are refused.
    AsCallerReadOnly,
}

/// A reply of a called command, freed on drop.
pub struct CallReply(*mut raw::RedisModuleCallReply);

impl CallReply {
    /// The error line when the reply is an error (without the leading `-`).
    pub fn error_text(&self) -> Option<&[u8]> {
        // SAFETY: a live reply of ours; the string pointer is valid until the reply is freed,
        // and the slice borrows `self`.
        unsafe {
            if api!(RedisModule_CallReplyType)(self.0) != raw::REDISMODULE_REPLY_ERROR as c_int {
                return None;
            }
            let mut len: usize = 0;
            let p = api!(RedisModule_CallReplyStringPtr)(self.0, &mut len);
            if p.is_null() {
                return Some(&[]);
            }
            Some(std::slice::from_raw_parts(p.cast::<u8>(), len))
        }
    }

    /// Sends the reply to the calling client as it came. False if Redis could not (a RESP3
    /// reply for a RESP2 client: never with [`Rules`], whose replies are in the caller's
    /// protocol).
    pub fn forward(&self, ctx: Ctx) -> bool {
        // SAFETY: ctx is the command's context and the reply is live; Redis copies its bytes.
        unsafe { api!(RedisModule_ReplyWithCallReply)(ctx, self.0) == raw::REDISMODULE_OK as c_int }
    }
}

impl Drop for CallReply {
    fn drop(&mut self) {
        // SAFETY: a reply RM_Call returned to us (not under automatic memory), freed once.
        unsafe { api!(RedisModule_FreeCallReply)(self.0) }
    }
}

/// Why Redis refused to run a called command before running it (errno of `RedisModule_Call`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not refused: it ran (its reply may still be its own error).
    No,
    /// ACLs (EACCES).
    Permission,
    /// `W` or `M` (ENOSPC): a write where writes are not allowed, or `deny-oom` over maxmemory.
    WriteOrMemory,
    /// Anything else (script rules, arity, cluster state...): Redis's error reply says what.
    Other,
}

/// Calls `argv` (the command's name first) under `rules`. None when Redis gave no reply at
/// all (a format error: a bug of ours), or the name is no C string (it has a NUL byte, so it
/// names no command: the key lookup has refused it already).
pub fn call(ctx: Ctx, argv: &[RawString], rules: Rules) -> Option<(CallReply, Refused)> {
    let (name, args) = argv.split_first()?;
    // RM_Call takes the name as a C string: copied with its NUL onto the stack (command names
    // are short), or the heap.
    let name = bytes(*name);
    let mut on_stack = [0u8; 64];
    let on_heap;
    let name: &CStr = match on_stack.get_mut(..=name.len()) {
        Some(buf) => {
            // `buf` is the name's length plus the NUL, which stays 0.
            for (to, from) in buf.iter_mut().zip(name) {
                *to = *from;
            }
            CStr::from_bytes_with_nul(buf).ok()?
        }
        None => {
            on_heap = CString::new(name).ok()?;
            &on_heap
        }
    };
    set_errno(0);
    let reply = call_with(ctx, name, rules, args);
    // Only RM_Call's own checks set errno to these before refusing; a command that ran leaves
    // it at 0 unless a library call inside it set it (the callers look at the reply as well).
    let refused = match errno() {
        0 => Refused::No,
        libc::EACCES => Refused::Permission,
        libc::ENOSPC => Refused::WriteOrMemory,
        _ => Refused::Other,
    };
    (!reply.is_null()).then(|| (CallReply(reply), refused))
}

/// `RedisModule_Call` with `rules`' modifiers and the arguments: up to 6 as one `s` each
/// (Redis sizes its argument vector from the format, so it allocates it once), more as a `v`.
fn call_with(
    ctx: Ctx,
    name: &CStr,
    rules: Rules,
    args: &[RawString],
) -> *mut raw::RedisModuleCallReply {
    let n = name.as_ptr();
    let read_only = rules == Rules::AsCallerReadOnly;
    let format = |with: &'static CStr, without: &'static CStr| {
        if read_only {
            with.as_ptr()
        } else {
            without.as_ptr()
        }
    };
    // SAFETY: RM_Call is variadic; each arm passes a format of the modifiers and exactly one
    // `s` per RedisModuleString pointer it passes (or one `v`: an array and its length), each
    // a live command argument (Redis takes a reference to each). The reply is ours to free
    // (CallReply's drop).
    unsafe {
        let call = api!(RedisModule_Call);
        match *args {
            [] => call(ctx, n, format(c"CSM!0EW", c"CSM!0E")),
            [a] => call(ctx, n, format(c"CSM!0EWs", c"CSM!0Es"), a),
            [a, b] => call(ctx, n, format(c"CSM!0EWss", c"CSM!0Ess"), a, b),
            [a, b, c] => call(ctx, n, format(c"CSM!0EWsss", c"CSM!0Esss"), a, b, c),
            [a, b, c, d] => call(ctx, n, format(c"CSM!0EWssss", c"CSM!0Essss"), a, b, c, d),
            [a, b, c, d, e] => call(
                ctx,
                n,
                format(c"CSM!0EWsssss", c"CSM!0Esssss"),
                a,
                b,
                c,
                d,
                e,
            ),
            [a, b, c, d, e, f] => call(
                ctx,
                n,
                format(c"CSM!0EWssssss", c"CSM!0Essssss"),
                a,
                b,
                c,
                d,
                e,
                f,
            ),
            _ => call(
                ctx,
                n,
                format(c"CSM!0EWv", c"CSM!0Ev"),
                args.as_ptr().cast_mut(),
                args.len(),
            ),
        }
    }
}

fn errno() -> c_int {
    // SAFETY: the calling thread's errno, always a valid pointer.
    unsafe { *libc::__errno_location() }
}

fn set_errno(value: c_int) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = value }
}
