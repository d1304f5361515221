//! Effects replicated as the plain commands that reproduce them (`HSET`, `HDEL`, `PEXPIREAT`,
//! `SET ... KEEPTTL`, `DEL`), through `RedisModule_Replicate`: the one variadic call of the
//! module, wrapped so that its format string always matches its arguments.

use std::ffi::CStr;
use std::os::raw::c_char;

use redis_module::raw;

use super::{api, Ctx, OwnedString, RawString};

/// Replicates a counter write as `SET name value KEEPTTL`: the write is done in place, which
/// keeps whatever TTL the key has (someone may have set one), so the replica and the AOF must
/// keep it too.
pub fn counter(ctx: Ctx, name: RawString, value: &[u8]) {
    // SAFETY: "sbc" = one RedisModuleString, one (pointer, length) buffer and one C string;
    // Redis copies all three.
    unsafe {
        api!(RedisModule_Replicate)(
            ctx,
            c"SET".as_ptr(),
            c"sbc".as_ptr(),
            name,
            value.as_ptr().cast::<c_char>(),
            value.len(),
            c"KEEPTTL".as_ptr(),
        );
    }
}

/// Replicates `command key args...` with any number of arguments.
pub fn key_and_strings(ctx: Ctx, command: &CStr, key_name: RawString, args: &[OwnedString]) {
    let mut argv: Vec<RawString> = Vec::with_capacity(1 + args.len());
    argv.push(key_name);
    argv.extend(args.iter().map(OwnedString::as_ptr));
    // SAFETY: "v" = an array of RedisModuleString pointers and its length; every pointer is a
    // live string (the key name, and `args` outlive the call). Redis copies what it needs.
    unsafe {
        api!(RedisModule_Replicate)(
            ctx,
            command.as_ptr(),
            c"v".as_ptr(),
            argv.as_mut_ptr(),
            argv.len(),
        );
    }
}

/// Replicates one command of 1, 2, 3 or 5 Redis strings (the shapes the module writes; any
/// other count replicates nothing, which no caller asks for).
pub fn strings(ctx: Ctx, command: &CStr, args: &[RawString]) {
    let c: *const c_char = command.as_ptr();
    // SAFETY: RM_Replicate is variadic; each arm passes a format of exactly one `s` per pointer
    // it passes, each a live RedisModuleString. Redis copies what it needs before returning.
    unsafe {
        let rep = api!(RedisModule_Replicate);
        match *args {
            [a] => rep(ctx, c, c"s".as_ptr(), a),
            [a, b] => rep(ctx, c, c"ss".as_ptr(), a, b),
            [a, b, d] => rep(ctx, c, c"sss".as_ptr(), a, b, d),
            [a, b, d, e, g] => rep(ctx, c, c"sssss".as_ptr(), a, b, d, e, g),
            _ => raw::REDISMODULE_ERR as i32,
        };
    }
}
