//! Every line of the module that talks to Redis's C API, and every `unsafe` of the crate, is in
//! this folder: here, thin safe wrappers used on the hot path (opening keys, reading and writing
//! the lock hash, strings, replies); `replicate` (effects as plain commands), `wait` (blocking
//! clients and timers), `events` (keyspace and server events), `command_info` (COMMAND DOCS),
//! `guard` (the entry guard that keeps a panic from reaching Redis), `call` (a command run
//! inside another: LOCK.GUARD's) and `log`. The layers above
//! hand plain values in and get plain values back; callbacks reach them through traits
//! (`wait::Events`, `events::ServerEvents`) that they implement.
//!
//! Every function here is called on Redis's main thread with a context Redis handed us for the
//! duration of a command or callback; the wrappers never keep a pointer beyond that.

pub mod call;
pub mod command_info;
pub mod events;
pub mod guard;
pub mod log;
pub mod replicate;
pub mod wait;

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::ptr;

use redis_module::raw;

pub type Ctx = *mut raw::RedisModuleCtx;
pub type RawString = *mut raw::RedisModuleString;

/// Calls a Redis API function pointer. They are all set by `RedisModule_Init` before any of our
/// code runs; a missing one means the server is older than the module supports, which `init`
/// checks once at load.
macro_rules! api {
    ($name:ident) => {
        match redis_module::raw::$name {
            Some(f) => f,
            None => crate::ffi::unreachable_api(stringify!($name)),
        }
    };
}
pub(crate) use api;

/// Unreachable after load: `init` refuses to load unless every API `api!` names is present.
/// Should it ever be reached, the entry-point guard catches the unwind and the client gets
/// `ERR internal error`; the server lives.
#[cold]
#[allow(clippy::panic)]
pub fn unreachable_api(name: &str) -> ! {
    // Caught by the entry-point guard: the client gets `ERR internal error`, the server lives.
    std::panic::panic_any(format!("Redis API {name} is not available"))
}

/// Borrows the bytes of a Redis string. The slice lives as long as the string does, which for
/// command arguments is the whole command.
fn bytes<'a>(s: *const raw::RedisModuleString) -> &'a [u8] {
    if s.is_null() {
        return &[];
    }
    let mut len: usize = 0;
    // SAFETY: `s` is a live RedisModuleString handed to us by Redis (argv, HashGet, ScanKey);
    // StringPtrLen returns a pointer to its `len` bytes, valid while the string is.
    unsafe {
        let p = api!(RedisModule_StringPtrLen)(s, &mut len);
        if p.is_null() {
            return &[];
        }
        std::slice::from_raw_parts(p.cast::<u8>(), len)
    }
}

/// The bytes of a Redis string Redis handed us (an event's key name, a command argument),
/// valid as long as the handle borrowed for it: the borrow ties the slice to the caller's scope.
pub fn bytes_of(s: &RawString) -> &[u8] {
    bytes(*s)
}

/// A command's arguments, read once: each as bytes (what the parsers take) and as the Redis
/// string itself (what goes back into `HashSet`, `OpenKey` and replication). Up to eight live on
/// the stack (every valid LOCK.* call), so the hot path does not allocate for them. Only
/// [`with_args`] makes one, for the length of the command: the slices cannot outlive it.
pub struct Args<'a> {
    strings: &'a [RawString],
    text: Text<'a>,
}

enum Text<'a> {
    Inline([&'a [u8]; 8], usize),
    Heap(Vec<&'a [u8]>),
}

impl<'a> std::ops::Deref for Args<'a> {
    type Target = [&'a [u8]];
    fn deref(&self) -> &Self::Target {
        match &self.text {
            Text::Inline(items, len) => items.get(..*len).unwrap_or_default(),
            Text::Heap(items) => items,
        }
    }
}

impl Args<'_> {
    /// The argument at `index` as the Redis string itself (null past the end: every API call
    /// that takes it treats null as absent).
    pub fn string(&self, index: usize) -> RawString {
        self.strings.get(index).copied().unwrap_or(ptr::null_mut())
    }

    /// The arguments from `index` on, as the Redis strings themselves (empty past the end): a
    /// command line inside this one (LOCK.GUARD's inner command).
    pub fn strings_from(&self, index: usize) -> &[RawString] {
        self.strings.get(index..).unwrap_or_default()
    }
}

/// Runs `f` on the command's arguments (`argv`, `argc` as Redis passed them).
pub fn with_args<R>(argv: *mut RawString, argc: c_int, f: impl FnOnce(&Args<'_>) -> R) -> R {
    let count = usize::try_from(argc).unwrap_or(0);
    let strings: &[RawString] = if argv.is_null() || count == 0 {
        &[]
    } else {
        // SAFETY: Redis passes `argc` valid string pointers in `argv`, alive for the command's
        // duration, which this call is within; the slice does not escape `f`.
        unsafe { std::slice::from_raw_parts(argv, count) }
    };
    let text = if count <= 8 {
        let mut items: [&[u8]; 8] = [&[]; 8];
        for (slot, &s) in items.iter_mut().zip(strings) {
            *slot = bytes(s);
        }
        Text::Inline(items, count)
    } else {
        Text::Heap(strings.iter().map(|&s| bytes(s)).collect())
    };
    f(&Args { strings, text })
}

/// A Redis string we created and must free.
pub struct OwnedString(RawString);

impl OwnedString {
    pub fn new(data: &[u8]) -> Self {
        // SAFETY: a NULL context creates a string outside automatic memory management, which we
        // free in Drop. The buffer is copied.
        OwnedString(unsafe {
            api!(RedisModule_CreateString)(
                ptr::null_mut(),
                data.as_ptr().cast::<c_char>(),
                data.len(),
            )
        })
    }

    /// The decimal digits of `value`, formatted here: Redis's own `ll2string` (behind
    /// `RedisModule_CreateStringFromLongLong`) costs about 250 instructions for a 16-digit token
    /// or time, a third of the string's whole cost on the hot path.
    pub fn from_u64(value: u64) -> Self {
        let mut digits = [0u8; 20];
        OwnedString::new(lock_core::layout::format_u64(value, &mut digits))
    }

    /// Takes ownership of a string Redis returned to us (HashGet), or one given up with
    /// `into_raw`, that we must free.
    pub fn adopt(s: RawString) -> Option<Self> {
        (!s.is_null()).then_some(OwnedString(s))
    }

    /// Gives up ownership without freeing: the caller keeps the pointer and must `adopt` it
    /// back to free it.
    pub fn into_raw(self) -> RawString {
        let s = self.0;
        std::mem::forget(self);
        s
    }

    pub fn as_ptr(&self) -> RawString {
        self.0
    }

    pub fn bytes(&self) -> &[u8] {
        bytes(self.0)
    }
}

impl Drop for OwnedString {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: we own one reference to this string (created or adopted above).
            unsafe { api!(RedisModule_FreeString)(ptr::null_mut(), self.0) }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Missing,
    Hash,
    String,
    List,
    Other,
}

/// A key opened for reading and writing; closed on drop.
pub struct Key(*mut raw::RedisModuleKey);

impl Key {
    pub fn open(ctx: Ctx, name: RawString) -> Key {
        let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
        // SAFETY: ctx and name are live for this call; a write open lazily expires the key, as
        // any write command would.
        Key(unsafe { api!(RedisModule_OpenKey)(ctx, name, mode).cast::<raw::RedisModuleKey>() })
    }

    /// Runs `f` on a key Redis opened and owns (a server event's key): it is not closed here.
    pub fn with_borrowed<R>(key: *mut raw::RedisModuleKey, f: impl FnOnce(&Key) -> R) -> R {
        let borrowed = std::mem::ManuallyDrop::new(Key(key));
        f(&borrowed)
    }

    /// The key's name and database (for a borrowed key; Redis ≥ 7.0).
    pub fn name_and_db(&self) -> Option<(OwnedString, i32)> {
        if self.0.is_null() {
            return None;
        }
        // SAFETY: an open key; the name is Redis's, so it is copied into a string of ours
        // before the key goes away.
        unsafe {
            let get_name = raw::RedisModule_GetKeyNameFromModuleKey?;
            let get_db = raw::RedisModule_GetDbIdFromModuleKey?;
            let name = get_name(self.0);
            if name.is_null() {
                return None;
            }
            Some((OwnedString::new(bytes(name)), get_db(self.0)))
        }
    }

    pub fn open_read(ctx: Ctx, name: RawString) -> Key {
        // SAFETY: as in `open`.
        Key(unsafe {
            api!(RedisModule_OpenKey)(ctx, name, raw::REDISMODULE_READ as c_int)
                .cast::<raw::RedisModuleKey>()
        })
    }

    pub fn kind(&self) -> KeyKind {
        if self.0.is_null() {
            return KeyKind::Missing;
        }
        // SAFETY: self.0 is an open key.
        let t = unsafe { api!(RedisModule_KeyType)(self.0) };
        match t as isize {
            raw::REDISMODULE_KEYTYPE_EMPTY => KeyKind::Missing,
            raw::REDISMODULE_KEYTYPE_HASH => KeyKind::Hash,
            raw::REDISMODULE_KEYTYPE_STRING => KeyKind::String,
            raw::REDISMODULE_KEYTYPE_LIST => KeyKind::List,
            _ => KeyKind::Other,
        }
    }

    pub fn len(&self) -> usize {
        if self.0.is_null() {
            return 0;
        }
        // SAFETY: self.0 is an open key.
        unsafe { api!(RedisModule_ValueLength)(self.0) }
    }

    /// Reads two hash fields at once.
    pub fn hash_get2(
        &self,
        a: RawString,
        b: RawString,
    ) -> (Option<OwnedString>, Option<OwnedString>) {
        let (mut va, mut vb): (RawString, RawString) = (ptr::null_mut(), ptr::null_mut());
        if !self.0.is_null() {
            // SAFETY: an open hash key; HashGet writes a new string (or NULL) into each out
            // pointer and stops at the NULL terminator.
            unsafe {
                api!(RedisModule_HashGet)(
                    self.0,
                    raw::REDISMODULE_HASH_NONE as c_int,
                    a,
                    &mut va as *mut RawString,
                    b,
                    &mut vb as *mut RawString,
                    ptr::null_mut::<c_void>(),
                );
            }
        }
        (OwnedString::adopt(va), OwnedString::adopt(vb))
    }

    /// Writes `owner = count` and, when given, the mode field (`exclusive:<token>`).
    pub fn hash_set_hold(
        &self,
        owner: RawString,
        count: RawString,
        mode: Option<(RawString, RawString)>,
    ) {
        // SAFETY: an open writable key (created as a hash when empty); field/value pairs end
        // with NULL.
        unsafe {
            match mode {
                Some((field, token)) => api!(RedisModule_HashSet)(
                    self.0,
                    raw::REDISMODULE_HASH_NONE as c_int,
                    owner,
                    count,
                    field,
                    token,
                    ptr::null_mut::<c_void>(),
                ),
                None => api!(RedisModule_HashSet)(
                    self.0,
                    raw::REDISMODULE_HASH_NONE as c_int,
                    owner,
                    count,
                    ptr::null_mut::<c_void>(),
                ),
            };
        }
    }

    /// Reads one hash field.
    pub fn hash_get(&self, field: RawString) -> Option<OwnedString> {
        let mut value: RawString = ptr::null_mut();
        if !self.0.is_null() {
            // SAFETY: an open hash key; HashGet writes a new string (or NULL) into the out
            // pointer and stops at the NULL terminator.
            unsafe {
                api!(RedisModule_HashGet)(
                    self.0,
                    raw::REDISMODULE_HASH_NONE as c_int,
                    field,
                    &mut value as *mut RawString,
                    ptr::null_mut::<c_void>(),
                );
            }
        }
        OwnedString::adopt(value)
    }

    /// Sets one hash field.
    pub fn hash_set(&self, field: RawString, value: RawString) {
        // SAFETY: an open writable key (created as a hash when empty); one field/value pair of
        // live strings, NULL-terminated; Redis copies (retains) what it keeps.
        unsafe {
            api!(RedisModule_HashSet)(
                self.0,
                raw::REDISMODULE_HASH_NONE as c_int,
                field,
                value,
                ptr::null_mut::<c_void>(),
            );
        }
    }

    /// Deletes one hash field.
    pub fn hash_delete(&self, field: RawString) {
        // SAFETY: an open writable hash key; REDISMODULE_HASH_DELETE as the value deletes the
        // field; NULL-terminated.
        unsafe {
            api!(RedisModule_HashSet)(
                self.0,
                raw::REDISMODULE_HASH_NONE as c_int,
                field,
                raw::REDISMODULE_HASH_DELETE as *mut raw::RedisModuleString,
                ptr::null_mut::<c_void>(),
            );
        }
    }

    /// The absolute expiry in ms, or None when the key has none.
    pub fn expires_at(&self) -> Option<u64> {
        if self.0.is_null() {
            return None;
        }
        // SAFETY: self.0 is an open key.
        let at = unsafe { api!(RedisModule_GetAbsExpire)(self.0) };
        u64::try_from(at).ok()
    }

    pub fn set_expires_at(&self, at: i64) {
        // SAFETY: self.0 is an open writable key holding a value.
        unsafe {
            api!(RedisModule_SetAbsExpire)(self.0, at);
        }
    }

    pub fn delete(&self) {
        // SAFETY: self.0 is an open writable key; deleting a missing key is a no-op.
        unsafe {
            api!(RedisModule_DeleteKey)(self.0);
        }
    }

    /// Pushes `value` at the head of the list (created when the key is empty; a client blocked
    /// on the key is served after the current command or callback). False when the key holds
    /// another type.
    pub fn list_push_head(&self, value: RawString) -> bool {
        // SAFETY: an open writable key and a live string, which Redis retains.
        unsafe {
            api!(RedisModule_ListPush)(self.0, raw::REDISMODULE_LIST_HEAD as c_int, value)
                == raw::REDISMODULE_OK as c_int
        }
    }

    /// Pops the head of the list (the key goes with its last element).
    pub fn list_pop_head(&self) -> Option<OwnedString> {
        if self.0.is_null() {
            return None;
        }
        // SAFETY: an open writable key; the popped string is ours to free (no automatic memory
        // management on our contexts), which OwnedString does.
        OwnedString::adopt(unsafe {
            api!(RedisModule_ListPop)(self.0, raw::REDISMODULE_LIST_HEAD as c_int)
        })
    }

    /// The bytes of a string value.
    pub fn string_bytes(&self) -> &[u8] {
        let mut len: usize = 0;
        // SAFETY: an open string key; DMA in read mode returns a pointer to its bytes, valid
        // until the key is closed or modified (we copy or parse before either).
        unsafe {
            let p = api!(RedisModule_StringDMA)(self.0, &mut len, raw::REDISMODULE_READ as c_int);
            if p.is_null() {
                return &[];
            }
            std::slice::from_raw_parts(p.cast::<u8>(), len)
        }
    }

    /// Overwrites a string value (or creates it) with `value`, in place: after the first
    /// write the value is a plain buffer owned by this key, so no allocation is needed.
    /// Returns false when the key holds another type (nothing is written then).
    pub fn string_write(&self, value: &[u8]) -> bool {
        // SAFETY: an open writable key. Truncate sizes (or creates) the string; DMA in write mode
        // returns its buffer of exactly that many bytes, valid until the key is closed.
        unsafe {
            if api!(RedisModule_StringTruncate)(self.0, value.len()) != raw::REDISMODULE_OK as c_int
            {
                return false;
            }
            let mut len: usize = 0;
            let p = api!(RedisModule_StringDMA)(self.0, &mut len, raw::REDISMODULE_WRITE as c_int);
            if p.is_null() || len != value.len() {
                return false;
            }
            ptr::copy_nonoverlapping(value.as_ptr(), p.cast::<u8>(), len);
            true
        }
    }

    /// Every field and value of a hash. Only for hashes already known to be small enough
    /// for a lock (`hold::MAX_MULTI_FIELDS`): this walks the whole hash.
    pub fn hash_fields(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        if self.0.is_null() {
            return out;
        }
        extern "C" fn collect(
            _key: *mut raw::RedisModuleKey,
            field: RawString,
            value: RawString,
            privdata: *mut c_void,
        ) {
            let _ = std::panic::catch_unwind(|| {
                // SAFETY: privdata is the &mut Vec passed below, alive for the ScanKey call.
                let out = unsafe { &mut *privdata.cast::<Vec<(Vec<u8>, Vec<u8>)>>() };
                out.push((bytes(field).to_vec(), bytes(value).to_vec()));
            });
        }
        // SAFETY: the cursor is created and destroyed here; the callback only touches `out`.
        unsafe {
            let cursor = api!(RedisModule_ScanCursorCreate)();
            while api!(RedisModule_ScanKey)(
                self.0,
                cursor,
                Some(collect),
                (&mut out as *mut Vec<(Vec<u8>, Vec<u8>)>).cast::<c_void>(),
            ) != 0
            {}
            api!(RedisModule_ScanCursorDestroy)(cursor);
        }
        out
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: we opened this key and close it exactly once.
            unsafe { api!(RedisModule_CloseKey)(self.0) }
        }
    }
}

pub fn now_ms() -> u64 {
    // SAFETY: a plain clock read.
    let ms = unsafe { api!(RedisModule_Milliseconds)() };
    u64::try_from(ms).unwrap_or(0)
}

/// Whether Redis only asks where the command's keys are (a `getkeys-api` command). Redis 7.0's
/// cluster routing finds keys by the legacy (first, last, step) or by this call, not by the key
/// spec: a multi-key command answers it, or a node would run it on keys of other slots.
pub fn is_keys_position_request(ctx: Ctx) -> bool {
    // SAFETY: ctx is the context of the command being asked about.
    unsafe { api!(RedisModule_IsKeysPositionRequest)(ctx) != 0 }
}

/// Reports argument `pos` as a key (only inside a keys-position request).
pub fn key_at(ctx: Ctx, pos: usize) {
    let Ok(pos) = c_int::try_from(pos) else {
        return;
    };
    // SAFETY: ctx is the context of a keys-position request.
    unsafe { api!(RedisModule_KeyAtPos)(ctx, pos) };
}

pub fn context_flags(ctx: Ctx) -> u32 {
    // SAFETY: ctx is live for this call.
    let f = unsafe { api!(RedisModule_GetContextFlags)(ctx) };
    u32::try_from(f).unwrap_or(0)
}

/// Whether Redis pauses writes now (`CLIENT PAUSE WRITE|ALL`, `FAILOVER`, a cluster manual
/// failover). While it does, Redis neither deletes expired keys nor lets write commands run, and
/// a module must not write either: a key that expired during the pause still exists though
/// lookups report it missing, so writing it creates a second entry and Redis asserts
/// (`db.c: de != NULL`). Redis 7.0 exposes the pause state only through this call.
pub fn writes_paused() -> bool {
    // SAFETY: a plain read of server state, on the main thread.
    unsafe { api!(RedisModule_AvoidReplicaTraffic)() != 0 }
}

/// Whether the server is over `maxmemory` with nothing left to evict (what `deny-oom` checks).
pub fn out_of_memory(ctx: Ctx) -> bool {
    context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_OOM != 0
}

/// Whether the command runs inside a script or function (its client is not a connection).
pub fn in_script(ctx: Ctx) -> bool {
    context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_LUA != 0
}

/// The id of the client running the command.
pub fn client_id(ctx: Ctx) -> u64 {
    // SAFETY: ctx is a command context.
    unsafe { api!(RedisModule_GetClientId)(ctx) }
}

pub fn is_replica(ctx: Ctx) -> bool {
    context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_SLAVE != 0
}

/// Whether the server is loading its data (startup, `DEBUG RELOAD`, `DEBUG LOADAOF`): what it
/// replays happened before.
pub fn is_loading(ctx: Ctx) -> bool {
    context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_LOADING != 0
}

/// Whether the server runs in cluster mode. `cluster-enabled` cannot change while the server
/// runs, so the context flags (which Redis computes afresh on every call) are read once.
pub fn is_cluster(ctx: Ctx) -> bool {
    static CLUSTER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CLUSTER.get_or_init(|| context_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0)
}

/// The server's cached time (µs): the same for everything one command (or one event-loop
/// callback) does, so it tells "still inside the same command" apart from "a later one". None
/// on a server without the call (Redis 7.0, which also has no key events).
pub fn cached_micros() -> Option<i64> {
    // SAFETY: the API table is filled in at load and never changes after; the function, where
    // the server has it, is a plain read of its cached clock.
    unsafe { { raw::RedisModule_CachedMicroseconds }.map(|cached| cached()) }
}

/// The `CLUSTER NODES` text, through RM_Call. Only for rare paths (a handoff in cluster mode
/// that no LOCK.* command caused, a lock key removed in cluster mode, a grant that finds no
/// token counter in cluster mode), never on a LOCK.* command's common path.
pub fn cluster_nodes(ctx: Ctx) -> Option<String> {
    call_text(ctx, c"CLUSTER", c"NODES")
}

/// The `CLIENT LIST` text, through RM_Call (module unload only).
pub fn client_list(ctx: Ctx) -> Option<String> {
    call_text(ctx, c"CLIENT", c"LIST")
}

/// Runs `command subcommand` and returns its bulk-string reply.
fn call_text(ctx: Ctx, command: &CStr, subcommand: &CStr) -> Option<String> {
    // SAFETY: ctx is live; "c" = one NUL-terminated C string argument. The reply is ours to
    // free; its string pointer is valid until then, and we copy it first.
    unsafe {
        let reply =
            api!(RedisModule_Call)(ctx, command.as_ptr(), c"c".as_ptr(), subcommand.as_ptr());
        if reply.is_null() {
            return None;
        }
        let mut len: usize = 0;
        let p = api!(RedisModule_CallReplyStringPtr)(reply, &mut len);
        let text = (!p.is_null()).then(|| {
            String::from_utf8_lossy(std::slice::from_raw_parts(p.cast::<u8>(), len)).into_owned()
        });
        api!(RedisModule_FreeCallReply)(reply);
        text
    }
}

pub fn selected_db(ctx: Ctx) -> i32 {
    // SAFETY: ctx is live for this call.
    unsafe { api!(RedisModule_GetSelectedDb)(ctx) }
}

/// Runs `f` with `db` selected on `ctx`, restoring the previous selection after. Needed when a
/// timer or event works on a key in another database than the context's.
pub fn with_db<R>(ctx: Ctx, db: i32, f: impl FnOnce() -> R) -> R {
    let previous = selected_db(ctx);
    if previous != db {
        // SAFETY: ctx is live; SelectDb fails only for an out-of-range db, which came from Redis.
        unsafe { api!(RedisModule_SelectDb)(ctx, db) };
    }
    let out = f();
    if previous != db {
        // SAFETY: as above.
        unsafe { api!(RedisModule_SelectDb)(ctx, previous) };
    }
    out
}

pub mod reply {
    use super::*;

    pub fn integer(ctx: Ctx, v: i64) {
        // SAFETY: ctx is a command or reply-callback context.
        unsafe { api!(RedisModule_ReplyWithLongLong)(ctx, v) };
    }

    pub fn null(ctx: Ctx) {
        // SAFETY: as above.
        unsafe { api!(RedisModule_ReplyWithNull)(ctx) };
    }

    pub fn bulk(ctx: Ctx, data: &[u8]) {
        // SAFETY: as above; the buffer is copied into the reply.
        unsafe {
            api!(RedisModule_ReplyWithStringBuffer)(ctx, data.as_ptr().cast::<c_char>(), data.len())
        };
    }

    pub fn array(ctx: Ctx, len: i64) {
        // SAFETY: as above.
        unsafe { api!(RedisModule_ReplyWithArray)(ctx, len as std::os::raw::c_long) };
    }

    /// An array of integers (a multi-key grant's tokens, a multi-key release's counts).
    pub fn integers(ctx: Ctx, values: &[i64]) {
        array(ctx, values.len() as i64);
        for &value in values {
            integer(ctx, value);
        }
    }

    /// A map in RESP3, a flat array of name/value in RESP2 (Redis does the translation).
    pub fn map(ctx: Ctx, pairs: i64) {
        // SAFETY: as above.
        unsafe { api!(RedisModule_ReplyWithMap)(ctx, pairs as std::os::raw::c_long) };
    }

    pub fn error(ctx: Ctx, message: &str) {
        let mut text = message.replace(['\r', '\n'], " ");
        text.push('\0');
        let Ok(c) = CStr::from_bytes_with_nul(text.as_bytes()) else {
            return error(ctx, "ERR internal error");
        };
        // SAFETY: as above; the message is copied.
        unsafe { api!(RedisModule_ReplyWithError)(ctx, c.as_ptr()) };
    }
}

/// Whether the server has every API function the module calls (checked at load).
pub fn required_api_present() -> bool {
    // SAFETY: reading (copying) the API table RedisModule_Init filled in, on the main thread at
    // load. Every function the module calls through `api!` is in this list, so after a
    // successful load no call can find its pointer missing.
    unsafe {
        [
            { raw::RedisModule_AvoidReplicaTraffic }.is_some(),
            { raw::RedisModule_BlockClient }.is_some(),
            { raw::RedisModule_Call }.is_some(),
            { raw::RedisModule_CallReplyStringPtr }.is_some(),
            { raw::RedisModule_CallReplyType }.is_some(),
            { raw::RedisModule_CloseKey }.is_some(),
            { raw::RedisModule_CreateCommand }.is_some(),
            { raw::RedisModule_CreateString }.is_some(),
            { raw::RedisModule_CreateTimer }.is_some(),
            { raw::RedisModule_DeleteKey }.is_some(),
            { raw::RedisModule_FreeCallReply }.is_some(),
            { raw::RedisModule_Free }.is_some(),
            { raw::RedisModule_FreeString }.is_some(),
            { raw::RedisModule_FreeThreadSafeContext }.is_some(),
            { raw::RedisModule_GetAbsExpire }.is_some(),
            { raw::RedisModule_GetBlockedClientHandle }.is_some(),
            { raw::RedisModule_GetBlockedClientPrivateData }.is_some(),
            { raw::RedisModule_GetCommand }.is_some(),
            { raw::RedisModule_GetCommandKeysWithFlags }.is_some(),
            { raw::RedisModule_GetContextFlags }.is_some(),
            { raw::RedisModule_GetDetachedThreadSafeContext }.is_some(),
            { raw::RedisModule_GetSelectedDb }.is_some(),
            { raw::RedisModule_HashGet }.is_some(),
            { raw::RedisModule_HashSet }.is_some(),
            { raw::RedisModule_IsKeysPositionRequest }.is_some(),
            { raw::RedisModule_KeyAtPos }.is_some(),
            { raw::RedisModule_KeyAtPosWithFlags }.is_some(),
            { raw::RedisModule_KeyType }.is_some(),
            { raw::RedisModule_ListPop }.is_some(),
            { raw::RedisModule_ListPush }.is_some(),
            { raw::RedisModule_Log }.is_some(),
            { raw::RedisModule_Milliseconds }.is_some(),
            { raw::RedisModule_RedactClientCommandArgument }.is_some(),
            { raw::RedisModule_NotifyKeyspaceEvent }.is_some(),
            { raw::RedisModule_OpenKey }.is_some(),
            { raw::RedisModule_PublishMessage }.is_some(),
            { raw::RedisModule_PublishMessageShard }.is_some(),
            { raw::RedisModule_Replicate }.is_some(),
            { raw::RedisModule_ReplyWithError }.is_some(),
            { raw::RedisModule_ReplyWithLongLong }.is_some(),
            { raw::RedisModule_ReplyWithMap }.is_some(),
            { raw::RedisModule_ReplyWithArray }.is_some(),
            { raw::RedisModule_ReplyWithCallReply }.is_some(),
            { raw::RedisModule_GetClientId }.is_some(),
            { raw::RedisModule_ReplyWithNull }.is_some(),
            { raw::RedisModule_ReplyWithStringBuffer }.is_some(),
            { raw::RedisModule_ScanCursorCreate }.is_some(),
            { raw::RedisModule_ScanCursorDestroy }.is_some(),
            { raw::RedisModule_ScanKey }.is_some(),
            { raw::RedisModule_SelectDb }.is_some(),
            { raw::RedisModule_SetAbsExpire }.is_some(),
            { raw::RedisModule_SetCommandInfo }.is_some(),
            { raw::RedisModule_SetDisconnectCallback }.is_some(),
            { raw::RedisModule_SetModuleOptions }.is_some(),
            { raw::RedisModule_StopTimer }.is_some(),
            { raw::RedisModule_StringDMA }.is_some(),
            { raw::RedisModule_StringPtrLen }.is_some(),
            { raw::RedisModule_StringTruncate }.is_some(),
            { raw::RedisModule_SubscribeToKeyspaceEvents }.is_some(),
            { raw::RedisModule_SubscribeToServerEvent }.is_some(),
            { raw::RedisModule_UnblockClient }.is_some(),
            { raw::RedisModule_ValueLength }.is_some(),
        ]
        .iter()
        .all(|present| *present)
    }
}

/// Emits `event` on `key` as a hash-class keyspace event (`notify-keyspace-events` with `h`,
/// or `A`, delivers it).
pub fn notify_hash_event(ctx: Ctx, event: &CStr, key: RawString) {
    // SAFETY: ctx and key are live; Redis copies the event name and the key.
    unsafe {
        api!(RedisModule_NotifyKeyspaceEvent)(
            ctx,
            raw::REDISMODULE_NOTIFY_HASH as c_int,
            event.as_ptr(),
            key,
        );
    }
}

/// Publishes `message` on `channel` as `PUBLISH` does: to this server's subscribers and, in a
/// cluster, to every node's (over the cluster bus). Both strings are live for the call; Redis
/// copies what it delivers.
pub fn publish(ctx: Ctx, channel: RawString, message: RawString) {
    // SAFETY: as said: the caller passes live strings; Redis copies them.
    unsafe {
        api!(RedisModule_PublishMessage)(ctx, channel, message);
    }
}

/// Publishes `message` on the shard channel `channel` as `SPUBLISH` does: to this server's
/// `SSUBSCRIBE` subscribers and, in a cluster, to the other nodes of this node's shard (its
/// replicas), not to the whole cluster. Unlike `SPUBLISH`, Redis does not check that this node
/// serves the channel's slot: it delivers here whatever the channel.
/// Redis ≥ 7.0.0 (`RM_PublishMessageShard`), and every Valkey (a fork of Redis 7.2).
pub fn publish_shard(ctx: Ctx, channel: RawString, message: RawString) {
    // SAFETY: as in `publish`: live strings, copied by Redis.
    unsafe {
        api!(RedisModule_PublishMessageShard)(ctx, channel, message);
    }
}

/// A command's handler, as Redis calls it.
pub type CommandHandler = extern "C" fn(Ctx, *mut RawString, c_int) -> c_int;

/// Registers a command with the key positions (1, 1, 1): every LOCK.* command takes its key
/// first. False if Redis refused it.
/// Registers a command with its legacy (first key, last key, step).
pub fn create_command(
    ctx: Ctx,
    name: &CStr,
    handler: CommandHandler,
    flags: &CStr,
    (first, last, step): (c_int, c_int, c_int),
) -> bool {
    // SAFETY: ctx is the load context; name and flags are C strings Redis copies.
    unsafe {
        api!(RedisModule_CreateCommand)(
            ctx,
            name.as_ptr(),
            Some(handler),
            flags.as_ptr(),
            first,
            last,
            step,
        ) == raw::REDISMODULE_OK as c_int
    }
}
