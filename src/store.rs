//! How a lock is read from and written to its key, and how those writes reach replicas and the
//! AOF: every write is replicated as the plain Redis command that reproduces its effect with
//! absolute values (`HSET`, `PEXPIREAT`, `SET`, `DEL`), never the LOCK.* command itself.

use std::cell::RefCell;

use lock_core::hold::{self, Lock, Write, MAX_MULTI_FIELDS, MODE_FIELD};
use lock_core::layout::parse_positive;
use lock_core::slot::{counter_key, key_slot, SLOTS};
use lock_core::state::{classify, may_be_a_lock, Stored, StoredHolder, View, FENCE_FIELD};
use lock_core::token::SlotMemory;
use lock_core::LockError;

use crate::ffi::{replicate, Ctx, Key, KeyKind, OwnedString, RawString};

thread_local! {
    /// The fence field name and, per slot, the counter key's name (created once and reused so
    /// that the hot path allocates no key names) and what this process remembers of the slot's
    /// tokens (see `lock_core::token::SlotMemory`).
    static NAMES: RefCell<Names> = RefCell::new(Names::default());
}

#[derive(Default)]
struct Names {
    fence_field: Option<OwnedString>,
    counters: Vec<SlotCounter>,
}

#[derive(Default)]
struct SlotCounter {
    name: Option<OwnedString>,
    memory: SlotMemory,
}

fn with_fence_field<R>(f: impl FnOnce(RawString) -> R) -> R {
    NAMES.with(|names| {
        let mut names = names.borrow_mut();
        let field = names
            .fence_field
            .get_or_insert_with(|| OwnedString::new(FENCE_FIELD));
        f(field.as_ptr())
    })
}

/// Runs `f` with the slot's counter name and the slot's token memory.
fn with_slot_counter<R>(lock_key: &[u8], f: impl FnOnce(RawString, &mut SlotMemory) -> R) -> R {
    let slot = key_slot(lock_key);
    NAMES.with(|names| {
        let mut names = names.borrow_mut();
        if names.counters.is_empty() {
            names.counters.resize_with(SLOTS, SlotCounter::default);
        }
        match names.counters.get_mut(usize::from(slot)) {
            Some(entry) => {
                let name = entry
                    .name
                    .get_or_insert_with(|| OwnedString::new(&counter_key(slot)))
                    .as_ptr();
                f(name, &mut entry.memory)
            }
            // Unreachable (a slot is below SLOTS): a fresh memory is still correct, only slower.
            None => f(
                OwnedString::new(&counter_key(slot)).as_ptr(),
                &mut SlotMemory::default(),
            ),
        }
    })
}

/// `SWAPDB a b`: the counters swapped with the data, and the bounds this process reserved in
/// them follow.
pub fn swap_databases(a: i32, b: i32) {
    NAMES.with(|names| {
        for counter in &mut names.borrow_mut().counters {
            counter.memory.swap_databases(a, b);
        }
    });
}

/// Frees the cached names (module unload).
pub fn release_cached_names() {
    NAMES.with(|names| *names.borrow_mut() = Names::default());
}

/// An open lock key and how the requesting owner sees it.
pub struct LockRead {
    pub key: Key,
    pub view: View,
}

/// Opens `name` for writing and classifies it for `owner`.
pub fn read_for_owner(ctx: Ctx, name: RawString, owner: RawString) -> Result<LockRead, LockError> {
    let key = Key::open(ctx, name);
    let view = view_of(&key, owner)?;
    Ok(LockRead { key, view })
}

/// How `owner` sees the lock at `key` if it is in the `RLock` layout. O(1): a hash with more
/// fields than a lock has is refused before any field is read; the holder's own field is read
/// only when it is not the requester. `NotALock` means "not this layout": callers then read the
/// key with [`read_lock`] (`hold::decode`), whose answer is final.
pub fn view_of(key: &Key, owner: RawString) -> Result<View, LockError> {
    match key.kind() {
        KeyKind::Missing => Ok(View::Free),
        KeyKind::Hash => {
            let fields = key.len();
            if !may_be_a_lock(fields) {
                return Err(LockError::NotALock);
            }
            let (count, fence) = with_fence_field(|fence_field| key.hash_get2(owner, fence_field));
            match count {
                Some(count) => classify(Stored::Hash {
                    fields,
                    fence: fence.as_ref().map(OwnedString::bytes),
                    holder: Some(StoredHolder {
                        field: crate::ffi::bytes(owner),
                        count: count.bytes(),
                        is_requester: true,
                    }),
                }),
                None => holder_in_hash(key, fields).map(|h| View::HeldByOther {
                    count: h.count,
                    token: h.token,
                }),
            }
        }
        KeyKind::String | KeyKind::Other => Err(LockError::WrongType),
    }
}

pub use lock_core::hold::StoredLock;

/// Reads the lock at `key` in either layout (None: no key). Anything that is not a lock is an
/// error. Costs O(fields) for a multi-hold key, whose size is bounded before any field is read;
/// a hash bigger than an exclusive lock without the mode field is refused in O(1).
pub fn read_lock(key: &Key) -> Result<Option<StoredLock>, LockError> {
    match key.kind() {
        KeyKind::Missing => Ok(None),
        KeyKind::Hash => {
            let fields = key.len();
            if fields == 0 || fields > MAX_MULTI_FIELDS {
                return Err(LockError::NotALock);
            }
            if fields > lock_core::state::MAX_LOCK_FIELDS {
                let mode = OwnedString::new(MODE_FIELD);
                if key.hash_get(mode.as_ptr()).is_none() {
                    return Err(LockError::NotALock);
                }
            }
            // A hash scan may report a field twice (a rehash between calls): keep one. The
            // multi-hold layout drops such twins as it sorts its holds (`hold::decode`); a
            // hash small enough to be Redisson's layout is sorted here.
            let mut all = key.hash_fields();
            if fields <= lock_core::state::MAX_LOCK_FIELDS {
                all.sort();
                all.dedup_by(|a, b| a.0 == b.0);
            }
            let expires_at = key.expires_at();
            let lock = hold::decode(&all, expires_at)?;
            Ok(Some(StoredLock { lock, expires_at }))
        }
        KeyKind::String | KeyKind::Other => Err(LockError::WrongType),
    }
}

/// A lock as it stands at `now`: what is stored, and its holds whose lease has not ended
/// (none when the key is missing).
pub struct LiveLock {
    pub stored: Option<StoredLock>,
    pub lock: Lock,
    /// Holds whose lease ended but that are still stored (the next write removes them).
    pub ended: usize,
}

/// Reads the lock at `key` (see [`read_lock`]) and drops the holds whose lease ended by `now`.
pub fn read_live(key: &Key, now: u64) -> Result<LiveLock, LockError> {
    let stored = read_lock(key)?;
    let mut lock = stored.as_ref().map_or_else(Lock::free, |s| s.lock.clone());
    let ended = lock.drop_ended(now);
    Ok(LiveLock {
        stored,
        lock,
        ended,
    })
}

/// Turns the stored lock `old` into `new`: only the fields that change are written, each write
/// replicated as the plain command with absolute values (`HSET`, `HDEL`, `PEXPIREAT`, `DEL`).
pub fn write_lock(
    ctx: Ctx,
    key: &Key,
    key_name: RawString,
    old: Option<&StoredLock>,
    new: &Lock,
) -> Result<(), LockError> {
    if old.is_none() {
        if let [only] = new.holds.as_slice() {
            if new.is_rlock_layout() {
                // A new lock in Redisson's layout: written as the exclusive acquire writes it.
                let owner = OwnedString::new(&only.owner);
                return write_hold(
                    ctx,
                    Hold {
                        key_name,
                        owner: owner.as_ptr(),
                        count: only.count,
                        new_token: only.token,
                        expires_at: only.expires_at.ok_or(LockError::Internal)?,
                        key,
                    },
                );
            }
        }
    }
    let writes = hold::writes(old.map(|o| &o.lock), old.and_then(|o| o.expires_at), new);
    for write in writes {
        match write {
            Write::Delete => delete(ctx, key, key_name),
            Write::Set(pairs) => {
                let mut args = Vec::with_capacity(2 * pairs.len());
                for (field, value) in &pairs {
                    let (field, value) = (OwnedString::new(field), OwnedString::new(value));
                    key.hash_set(field.as_ptr(), value.as_ptr());
                    args.push(field);
                    args.push(value);
                }
                replicate::key_and_strings(ctx, c"HSET", key_name, &args);
            }
            Write::Remove(fields) => {
                let mut args = Vec::with_capacity(fields.len());
                for field in &fields {
                    let field = OwnedString::new(field);
                    key.hash_delete(field.as_ptr());
                    args.push(field);
                }
                replicate::key_and_strings(ctx, c"HDEL", key_name, &args);
            }
            Write::ExpireAt(at) => set_lease_end(ctx, key, key_name, at)?,
        }
    }
    Ok(())
}

/// Another owner's hold of an `RLock`-layout key.
struct Holder {
    count: u64,
    token: Option<u64>,
}

/// Reads the holder of a hash already known to have `fields` fields, few enough for a lock.
fn holder_in_hash(key: &Key, fields: usize) -> Result<Holder, LockError> {
    let entries = key.hash_fields();
    let mut fence = None;
    let mut holder = None;
    for (field, value) in &entries {
        if field.as_slice() == FENCE_FIELD {
            fence = Some(value.as_slice());
        } else if holder.is_none() {
            holder = Some((field, value.as_slice()));
        } else {
            return Err(LockError::NotALock);
        }
    }
    let view = classify(Stored::Hash {
        fields,
        fence,
        holder: holder.map(|(field, count)| StoredHolder {
            field: field.as_slice(),
            count,
            is_requester: false,
        }),
    })?;
    match (view, holder) {
        (View::HeldByOther { count, token }, Some(_)) => Ok(Holder { count, token }),
        _ => Err(LockError::NotALock),
    }
}

/// Takes the next token for `lock_key` (in the context's selected db) from its slot's counter.
/// The counter holds a bound reserved ahead (see `lock_core::token`); it is written, and
/// replicated as its new absolute value, only when a new window is reserved.
///
/// The caller may hold the lock key open: the counter is another key, since no LOCK.* command
/// accepts a key in the counter namespace (checked again here, so a missed check is an error,
/// never a write through a stale handle).
pub fn next_token(ctx: Ctx, lock_key: &[u8], now: u64) -> Result<u64, LockError> {
    if lock_core::layout::is_reserved_key(lock_key) {
        return Err(LockError::ReservedKey);
    }
    let db = crate::ffi::selected_db(ctx);
    with_slot_counter(lock_key, |counter_name, memory| {
        let counter = Key::open(ctx, counter_name);
        let stored = match counter.kind() {
            KeyKind::String => parse_positive(counter.string_bytes()),
            _ => None,
        };
        let grant = memory.next_token(db, stored, now)?;
        if let Some(bound) = grant.store_bound {
            let mut digits = itoa_buffer();
            let text = format_u64(bound, &mut digits);
            // A counter key overwritten with another type by a client is left alone (tokens
            // then come from the clock floor): replicate only what was written.
            if counter.string_write(text) {
                drop(counter);
                replicate::counter(ctx, counter_name, text);
            }
        }
        Ok(grant.token)
    })
}

/// Writes a hold: `owner = count`, the fence (if it changes) and the absolute lease end.
pub struct Hold<'a> {
    pub key_name: RawString,
    pub owner: RawString,
    pub count: u64,
    pub new_token: Option<u64>,
    pub expires_at: u64,
    pub key: &'a Key,
}

/// A count, token or time as the signed 64-bit integer Redis stores. The core never produces a
/// larger one (counts and tokens stop at `i64::MAX` with an error); should one get here, the
/// command fails before writing rather than store a saturated value.
pub fn stored_integer(value: u64) -> Result<i64, LockError> {
    i64::try_from(value).map_err(|_| LockError::Internal)
}

pub fn write_hold(ctx: Ctx, hold: Hold<'_>) -> Result<(), LockError> {
    let count = OwnedString::from_i64(stored_integer(hold.count)?);
    let token = hold.new_token.map(stored_integer).transpose()?;
    stored_integer(hold.expires_at)?;
    match token {
        Some(token) => {
            let token = OwnedString::from_i64(token);
            with_fence_field(|fence_field| {
                hold.key
                    .hash_set_hold(hold.owner, &count, Some((fence_field, &token)));
                replicate::strings(
                    ctx,
                    c"HSET",
                    &[
                        hold.key_name,
                        hold.owner,
                        count.as_ptr(),
                        fence_field,
                        token.as_ptr(),
                    ],
                );
            });
        }
        None => {
            hold.key.hash_set_hold(hold.owner, &count, None);
            replicate::strings(ctx, c"HSET", &[hold.key_name, hold.owner, count.as_ptr()]);
        }
    }
    set_lease_end(ctx, hold.key, hold.key_name, hold.expires_at)
}

pub fn set_lease_end(
    ctx: Ctx,
    key: &Key,
    key_name: RawString,
    expires_at: u64,
) -> Result<(), LockError> {
    let at = stored_integer(expires_at)?;
    key.set_expires_at(at);
    let at = OwnedString::from_i64(at);
    replicate::strings(ctx, c"PEXPIREAT", &[key_name, at.as_ptr()]);
    Ok(())
}

/// Writes a count-down (`owner = remaining`), leaving the lease as it is.
pub fn write_count(
    ctx: Ctx,
    key: &Key,
    key_name: RawString,
    owner: RawString,
    remaining: u64,
) -> Result<(), LockError> {
    let count = OwnedString::from_i64(stored_integer(remaining)?);
    key.hash_set_hold(owner, &count, None);
    replicate::strings(ctx, c"HSET", &[key_name, owner, count.as_ptr()]);
    Ok(())
}

pub fn delete(ctx: Ctx, key: &Key, key_name: RawString) {
    key.delete();
    replicate::strings(ctx, c"DEL", &[key_name]);
}

fn itoa_buffer() -> [u8; 20] {
    [0; 20]
}

/// Formats `value` in decimal into `buf`, returning the digits (no allocation).
fn format_u64(mut value: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        if let Some(slot) = buf.get_mut(at) {
            *slot = b'0' + (value % 10) as u8;
        }
        value /= 10;
        if value == 0 || at == 0 {
            break;
        }
    }
    buf.get(at..).unwrap_or_default()
}
