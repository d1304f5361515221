//! How a lock is read from and written to its key, and how those writes reach replicas and the
//! AOF: every write is replicated as the plain Redis command that reproduces its effect with
//! absolute values (`HSET`, `PEXPIREAT`, `SET`, `DEL`), never the LOCK.* command itself.

use std::cell::RefCell;

use lock_core::election;
use lock_core::hold::{
    self, FieldNames, Lock, Write, MAX_MULTI_FIELDS, MAX_RLOCK_FIELDS, MODE_FIELD,
};
use lock_core::kind::{HoldKind, Mode};
use lock_core::layout::{
    format_exclusive_mode, format_u64, parse_positive, FENCE_FIELD, LEGACY_MODE_FIELD,
};
use lock_core::slot::{counter_key, key_slot, leaders_key, SLOTS};
use lock_core::token::{Counter, SlotMemory};
use lock_core::LockError;

use crate::ffi::{replicate, Ctx, Key, KeyKind, OwnedString, RawString};

thread_local! {
    /// The mode and old fence field names and, per slot, the counter key's name (created once and reused so
    /// that the hot path allocates no key names) and what this process remembers of the slot's
    /// tokens (see `lock_core::token::SlotMemory`).
    static NAMES: RefCell<Names> = RefCell::new(Names::default());
}

#[derive(Default)]
struct Names {
    mode_field: Option<OwnedString>,
    fence_field: Option<OwnedString>,
    /// `1` to `SMALL_COUNTS`, the re-entry counts nearly every write stores: made once, so a
    /// grant creates no string for its count.
    small_counts: Vec<OwnedString>,
    counters: Vec<SlotCounter>,
    /// (slot, database, bound) of the counters a flush took, to write back
    /// ([`restore_flushed_counters`]).
    flushed_counters: Vec<(usize, i32, u64)>,
    /// (slot, database, bound) of the counters a flush is about to take ([`flushing`]).
    flushing_counters: Vec<(usize, i32, u64)>,
}

/// How many small counts are kept as ready-made strings (see `Names::small_counts`).
const SMALL_COUNTS: u64 = 8;

#[derive(Default)]
struct SlotCounter {
    name: Option<OwnedString>,
    memory: SlotMemory,
}

/// The mode field's name, made once. Like every kept string here it is freed only at module
/// unload (`release_cached_names`), which runs beside no command: the pointer outlives the
/// command that asks for it.
fn mode_field() -> RawString {
    NAMES.with(|names| {
        names
            .borrow_mut()
            .mode_field
            .get_or_insert_with(|| OwnedString::new(MODE_FIELD))
            .as_ptr()
    })
}

/// The old layout's fence field name (see [`mode_field`] for how long it lives).
fn fence_field() -> RawString {
    NAMES.with(|names| {
        names
            .borrow_mut()
            .fence_field
            .get_or_insert_with(|| OwnedString::new(FENCE_FIELD))
            .as_ptr()
    })
}

/// The kept Redis string of `count` for the small counts nearly every hold has (see
/// [`mode_field`] for how long it lives); None for a larger count.
fn small_count(count: u64) -> Option<RawString> {
    if !(1..=SMALL_COUNTS).contains(&count) {
        return None;
    }
    NAMES.with(|names| {
        let mut names = names.borrow_mut();
        if names.small_counts.is_empty() {
            names.small_counts = (1..=SMALL_COUNTS).map(OwnedString::from_u64).collect();
        }
        let index = usize::try_from(count - 1).ok()?;
        names.small_counts.get(index).map(OwnedString::as_ptr)
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

/// `FLUSHDB` (Some) or `FLUSHALL` (None) is about to take the token counters of `db`: what
/// each holds is kept for the write-back after it ([`flushed`]). A counter may hold a bound
/// above anything this process reserved or handed out in its slot: one another node reserved,
/// come here with the slot. In a cluster (database 0 only) every slot's counter is read, since
/// a counter arrives with its slot unread; outside one, those this process wrote.
pub fn flushing(ctx: Ctx, db: Option<i32>) {
    let cluster = crate::ffi::is_cluster(ctx);
    // Which (slot, database) to read, listed first: reading a key may raise events whose
    // handlers look at the names.
    let wanted: Vec<(usize, i32)> = if cluster {
        if db.is_some_and(|db| db != 0) {
            return;
        }
        (0..SLOTS).map(|slot| (slot, 0)).collect()
    } else {
        NAMES.with(|names| {
            let names = names.borrow();
            let mut wanted = Vec::new();
            for (slot, counter) in names.counters.iter().enumerate() {
                for d in counter.memory.reserved_databases() {
                    if db.is_none_or(|db| db == d) {
                        wanted.push((slot, d));
                    }
                }
            }
            wanted
        })
    };
    let mut found = Vec::new();
    for (slot, d) in wanted {
        let Ok(slot16) = u16::try_from(slot) else {
            continue;
        };
        let name = OwnedString::new(&counter_key(slot16));
        let stored = crate::ffi::with_db(ctx, d, || {
            let key = Key::open_read(ctx, name.as_ptr());
            match key.kind() {
                KeyKind::String => parse_positive(key.string_bytes()),
                _ => None,
            }
        });
        if let Some(bound) = stored {
            found.push((slot, d, bound));
        }
    }
    NAMES.with(|names| names.borrow_mut().flushing_counters = found);
}

/// The server follows a master now: the token windows this process reserved are not its own
/// any more, even where no resync replaces its data (a demoted master the new master's stream has
/// not reached): the new master may have gone above them meanwhile, with writes this server
/// never got. Promoted again, it goes above whatever its counters hold (`core::token`: a window
/// trusted after a demotion handed out tokens below the other master's). The last tokens stay.
pub fn forget_windows() {
    NAMES.with(|names| {
        for counter in names.borrow_mut().counters.iter_mut() {
            counter.memory.forget_bounds(None);
        }
    });
}

/// `FLUSHDB` (Some), `FLUSHALL` (None) or a replica's load that replaced every database: the
/// counters there are gone, and so are the windows this process reserved in them (see
/// `SlotMemory::forget_bounds`). Each is written back at the next turn with the highest of
/// what it held when the flush began ([`flushing`]), the bound this process reserved in it
/// and the last token this process handed out in the slot.
pub fn flushed(db: Option<i32>) {
    NAMES.with(|names| {
        let mut names = names.borrow_mut();
        let mut restore = std::collections::BTreeMap::new();
        for (slot, d, bound) in std::mem::take(&mut names.flushing_counters) {
            if db.is_none_or(|db| db == d) {
                restore.insert((slot, d), bound);
            }
        }
        for (slot, counter) in names.counters.iter_mut().enumerate() {
            let last = counter.memory.last().unwrap_or(0);
            for (d, bound) in counter.memory.forget_bounds(db) {
                let highest = restore.entry((slot, d)).or_insert(0);
                *highest = (*highest).max(bound).max(last);
            }
        }
        names.flushed_counters.extend(
            restore
                .into_iter()
                .map(|((slot, d), bound)| (slot, d, bound)),
        );
    });
}

/// The counters a flush took, written back (at the next turn, from the inbox: not inside the
/// flush, where a `DEBUG RELOAD` is about to load its data into the emptied databases) with
/// the highest of what they held and what this process reserved and handed out there
/// ([`flushed`]), where no counter is there yet. A flush would otherwise leave the slot with no bound: the node the slot moves
/// to next starts from its clock, which tokens may run a window (a second) ahead of. Not on a replica
/// (its master's writes arrive) or while loading; in a cluster only for the slots this node
/// serves, settled.
pub fn restore_flushed_counters(ctx: Ctx) {
    let pending = NAMES.with(|names| std::mem::take(&mut names.borrow_mut().flushed_counters));
    if pending.is_empty() || crate::ffi::is_replica(ctx) || crate::ffi::is_loading(ctx) {
        return;
    }
    // In a cluster, only the slots this node serves settled: a slot it minted in once may have
    // moved on (a key written here would be a key of a slot it does not own, which stops the
    // slot from ever being assigned back), or be moving.
    let nodes = if crate::ffi::is_cluster(ctx) {
        match crate::ffi::cluster_nodes(ctx) {
            Some(nodes) => Some(nodes),
            None => return,
        }
    } else {
        None
    };
    for (slot, db, bound) in pending {
        let Ok(slot) = u16::try_from(slot) else {
            continue;
        };
        if nodes
            .as_deref()
            .is_some_and(|nodes| !lock_core::cluster::settled_here(nodes, slot))
        {
            continue;
        }
        let name = OwnedString::new(&counter_key(slot));
        crate::ffi::with_db(ctx, db, || {
            let key = Key::open(ctx, name.as_ptr());
            if key.kind() != KeyKind::Missing {
                return;
            }
            let mut digits = [0u8; 20];
            let text = format_u64(bound, &mut digits);
            if key.string_write(text) {
                drop(key);
                replicate::counter(ctx, name.as_ptr(), text);
            }
        });
    }
}

/// Frees the cached names (module unload).
pub fn release_cached_names() {
    NAMES.with(|names| *names.borrow_mut() = Names::default());
}

pub use lock_core::command::Live;
pub use lock_core::hold::StoredLock;

/// Reads the lock at `key` in either layout (None: no key); anything that is not a lock is an
/// error, and a hash bigger than a lock can be is refused before any field is read.
///
/// With `owner` (the requester's own field name), Redisson's `RLock` layout costs O(1): one
/// `HashGet` of the owner's field and the mode; when those two are the whole hash, the lock is
/// decoded from them (a key in the old layout, whose token is in the fence field instead, costs
/// one `HashGet` more). Otherwise every field is read: O(1) for a hash of at most two fields,
/// O(holds) for a multi-hold key. Both end in `hold::decode`, so every read follows one rule.
pub fn read_lock(key: &Key, owner: Option<Owner>) -> Result<Option<StoredLock>, LockError> {
    match key.kind() {
        KeyKind::Missing => Ok(None),
        KeyKind::Hash => {
            let fields = key.len();
            if fields == 0 || fields > MAX_MULTI_FIELDS {
                return Err(LockError::NotALock);
            }
            if fields <= MAX_RLOCK_FIELDS {
                if let Some(owner) = owner {
                    // The lease is read only when the command keeps it (see `Owner`).
                    let expires_at = match owner.lease {
                        OwnLease::Kept => key.expires_at(),
                        OwnLease::Replaced => None,
                    };
                    if let Some((lock, names)) =
                        read_own_rlock(key, owner.name, fields, expires_at)?
                    {
                        return Ok(Some(StoredLock {
                            lock,
                            expires_at,
                            names,
                        }));
                    }
                }
            } else if key.hash_get(mode_field()).is_none() {
                let legacy = OwnedString::new(LEGACY_MODE_FIELD);
                if key.hash_get(legacy.as_ptr()).is_none() {
                    return Err(LockError::NotALock);
                }
            }
            // A hash scan may report a field twice (a rehash between calls): keep one. The
            // multi-hold layout drops such twins as it sorts its holds (`hold::decode`); a
            // hash small enough to be Redisson's layout is sorted here.
            let mut all = key.hash_fields();
            if fields <= MAX_RLOCK_FIELDS {
                all.sort();
                all.dedup_by(|a, b| a.0 == b.0);
            }
            hold::decode_stored(&all, key.expires_at()).map(Some)
        }
        KeyKind::String | KeyKind::List | KeyKind::Other => Err(LockError::WrongType),
    }
}

/// What a key that is about to go held, read in O(1) (a key event must not walk thousands of
/// holds inside the command that removes the key): the lock itself when the hash is small
/// enough to hold at most one hold, else only that it is a lock with several holds. None: not a
/// lock.
pub enum Peek {
    Lock(Lock),
    Several,
}

pub fn peek_lock(key: &Key) -> Option<Peek> {
    if key.kind() != KeyKind::Hash {
        return None;
    }
    let fields = key.len();
    if fields <= MAX_RLOCK_FIELDS {
        return read_lock(key, None)
            .ok()
            .flatten()
            .map(|s| Peek::Lock(s.lock));
    }
    if fields > MAX_MULTI_FIELDS {
        return None;
    }
    let mode = match key.hash_get(mode_field()) {
        Some(mode) => mode,
        None => key.hash_get(OwnedString::new(LEGACY_MODE_FIELD).as_ptr())?,
    };
    hold::is_multi_mode(mode.bytes()).then_some(Peek::Several)
}

/// The `RLock` layout held by `owner`, read in O(1), with the names it is stored under: None
/// when the owner's field and the mode (or, in the old layout, the fence) are not the whole hash
/// (another owner holds it, or it is not this layout).
fn read_own_rlock(
    key: &Key,
    owner: RawString,
    fields: usize,
    expires_at: Option<u64>,
) -> Result<Option<(Lock, FieldNames)>, LockError> {
    let (count, mode) = key.hash_get2(owner, mode_field());
    let Some(count) = count else {
        return Ok(None);
    };
    let (token, names) = match mode {
        Some(mode) => (Some((MODE_FIELD, mode)), FieldNames::Current),
        // No mode: Redisson's own hold (the owner alone), or the old layout's fence beside it.
        None if fields == 2 => match key.hash_get(fence_field()) {
            Some(fence) => (Some((FENCE_FIELD, fence)), FieldNames::Legacy),
            None => return Ok(None),
        },
        None => (None, FieldNames::Current),
    };
    if fields != 1 + usize::from(token.is_some()) {
        return Ok(None);
    }
    let owner = crate::ffi::bytes_of(&owner);
    let token = token.as_ref().map(|(field, value)| (*field, value.bytes()));
    let lock = hold::decode_rlock(
        std::iter::once((owner, count.bytes())).chain(token),
        expires_at,
    )?;
    Ok(Some((lock, names)))
}

/// The requester's own field name, for the O(1) read of Redisson's layout, and whether the
/// command keeps the lease of the requester's own exclusive hold.
#[derive(Clone, Copy)]
pub struct Owner {
    pub name: RawString,
    pub lease: OwnLease,
}

/// What a command does with the lease of the requester's own exclusive hold, when the key is in
/// Redisson's layout and the requester holds it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum OwnLease {
    /// Kept, so it is read: a `SHARED` acquire by the exclusive holder keeps it in the hold it
    /// stores beside the shared one.
    Kept,
    /// Replaced or not needed, so it is not read (one expiry lookup less on the hot path): a
    /// re-entry or renew sets a new one, a release counts down (the key keeps its expiry) or
    /// deletes the key; a fence (LOCK.GUARD, LOCK.CHECK) only asks whether the hold is alive,
    /// which Redis's key lookup answered: this layout's lease is the key's own expiry, and a key
    /// past it is not found. The hold reads as having no lease; nothing then writes one for it.
    Replaced,
}

impl OwnLease {
    /// What an acquire in `mode` does with it: only a `SHARED` (or permit) acquire by the
    /// exclusive holder keeps its exclusive hold's lease.
    pub fn of_acquire(mode: Mode) -> OwnLease {
        match mode {
            Mode::Exclusive => OwnLease::Replaced,
            Mode::Shared | Mode::Limit(_) => OwnLease::Kept,
        }
    }
}

/// Reads the lock at `key` (see [`read_lock`]) as it stands at `now`: the holds whose lease
/// ended are set apart.
pub fn read_live(key: &Key, owner: Option<Owner>, now: u64) -> Result<Live, LockError> {
    Ok(Live::new(read_lock(key, owner)?, now))
}

/// From how many fields a multi-hold key's owner's holds are read alone (`read_owner_holds`);
/// a smaller key is read whole, which checks every hold it has (two exclusive holders, say).
const OWNER_READ_FROM: usize = 17;

/// The holds `owner` (`owner_name` as a Redis string) has on the lock at `key`, ended ones
/// included (the caller decides at its `now`; the owner's exclusive hold in Redisson's layout
/// reads without a lease, having been found alive by Redis's own lookup of its key), in O(1)
/// whatever the layout: Redisson's layout as [`read_lock`] reads it for its holder (any hash of
/// at most two fields costs O(1)), a
/// multi-hold key by its mode and the owner's own fields (`x:`, `s:`, `p:<owner>`), not its
/// other holds. A key that is not a lock is an error, as for every command: an invalid mode, an
/// owner's field that breaks the layout, a semaphore with more holds than its limit, an
/// exclusive hold beside holds of others. A key of fewer than `OWNER_READ_FROM` fields is read
/// whole, which checks every hold; on a larger one, what only the other holds' own fields would
/// show (another owner's exclusive field among hundreds of shared ones) is not seen here.
pub fn read_owner_holds(
    key: &Key,
    owner_name: RawString,
    owner: &[u8],
) -> Result<hold::Holds, LockError> {
    let fields = key.len();
    if key.kind() == KeyKind::Hash && (OWNER_READ_FROM..=MAX_MULTI_FIELDS).contains(&fields) {
        if let Some(family) = key
            .hash_get(mode_field())
            .and_then(|mode| hold::decode_family(mode.bytes()))
        {
            let values = HoldKind::ALL.map(|kind| {
                let field = OwnedString::new(&hold::hold_field(kind, owner));
                key.hash_get(field.as_ptr())
            });
            let [x, s, p] = &values;
            return hold::decode_owner_holds(
                family,
                fields - 1,
                owner,
                [x, s, p].map(|v| v.as_ref().map(OwnedString::bytes)),
            );
        }
    }
    // Missing, small (O(1) anyway), the old layout or no lock at all: the one read every
    // command makes, which also refuses what is not a lock. The owner's exclusive hold in
    // Redisson's layout is alive whenever its key was found (see `OwnLease::Replaced`).
    let reading = Owner {
        name: owner_name,
        lease: OwnLease::Replaced,
    };
    let mut holds = read_lock(key, Some(reading))?
        .map(|stored| stored.lock.holds)
        .unwrap_or_default();
    holds.retain(|h| h.owner == owner);
    Ok(holds)
}

/// Turns the stored lock `old` into `new`: only the fields that change are written, each write
/// replicated as the plain command with absolute values (`HSET`, `HDEL`, `PEXPIREAT`, `DEL`).
/// `owner` is the requester's own name as a Redis string, reused when its field is written.
///
/// This is the one writer of lock keys: commands (`commands::outcome`) and the scheduler's
/// grants (`runtime::RedisPort`) both end here.
pub fn write_lock(
    ctx: Ctx,
    key: &Key,
    key_name: RawString,
    owner: Option<RawString>,
    old: Option<&StoredLock>,
    new: &Lock,
) -> Result<(), LockError> {
    if let ([hold], true) = (new.holds.as_slice(), new.is_rlock_layout()) {
        let before = match old {
            None => Some(None),
            Some(old) => match old.lock.holds.as_slice() {
                [was] if old.lock.is_rlock_layout() && was.owner == hold.owner => {
                    Some(Some((was, old.expires_at, old.names)))
                }
                _ => None,
            },
        };
        if let Some(before) = before {
            return write_rlock(ctx, key, key_name, owner, before, hold);
        }
    }
    if new.holds.is_empty() {
        // The last hold went (a release, a force release): the key goes.
        if old.is_some() {
            delete(ctx, key, key_name);
        }
        return Ok(());
    }
    let writes = hold::writes(
        old.map(|o| &o.lock),
        old.and_then(|o| o.expires_at),
        old.map_or(FieldNames::Current, |o| o.names),
        new,
    );
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

/// [`write_lock`] within Redisson's layout, for one owner: a new hold, a re-entry, a count
/// down, a renew, a token given to a hold Redisson's script took. `HSET owner count [mode
/// exclusive:<token>]` for what changed, then `PEXPIREAT` when the lease moved. A key in the old
/// layout gets its token written into `mode` and its fence field removed (`HDEL`), so it never
/// holds both. The hot path: no field name is allocated (the owner's is the command's own
/// argument, the mode's is cached).
fn write_rlock(
    ctx: Ctx,
    key: &Key,
    key_name: RawString,
    owner: Option<RawString>,
    before: Option<(&hold::Hold, Option<u64>, FieldNames)>,
    hold: &hold::Hold,
) -> Result<(), LockError> {
    let (count_changed, token_changed, lease_moved, legacy) = match before {
        None => (true, hold.token.is_some(), true, false),
        Some((was, expires_at, names)) => {
            let legacy = names == FieldNames::Legacy;
            (
                was.count != hold.count,
                was.token != hold.token || legacy,
                expires_at != hold.expires_at,
                legacy,
            )
        }
    };
    let lease_end = if lease_moved { hold.expires_at } else { None };
    stored_integer(hold.count)?;
    let mode = match hold.token.filter(|_| token_changed) {
        Some(token) => {
            stored_integer(token)?;
            let mut buf = [0u8; 30];
            Some(OwnedString::new(format_exclusive_mode(token, &mut buf)))
        }
        None => None,
    };
    lease_end.map(stored_integer).transpose()?;
    let owned_owner;
    let owner = match owner {
        Some(owner) if crate::ffi::bytes_of(&owner) == hold.owner.as_slice() => owner,
        _ => {
            owned_owner = OwnedString::new(&hold.owner);
            owned_owner.as_ptr()
        }
    };
    let mode_field = mode_field();
    let mode = mode.as_ref().map(OwnedString::as_ptr);
    if count_changed {
        let made;
        let count = match small_count(hold.count) {
            Some(kept) => kept,
            None => {
                made = OwnedString::from_u64(hold.count);
                made.as_ptr()
            }
        };
        key.hash_set_hold(owner, count, mode.map(|m| (mode_field, m)));
        match mode {
            Some(m) => replicate::strings(ctx, c"HSET", &[key_name, owner, count, mode_field, m]),
            None => replicate::strings(ctx, c"HSET", &[key_name, owner, count]),
        }
    } else if let Some(m) = mode {
        key.hash_set(mode_field, m);
        replicate::strings(ctx, c"HSET", &[key_name, mode_field, m]);
    }
    if legacy {
        let fence_field = fence_field();
        key.hash_delete(fence_field);
        replicate::strings(ctx, c"HDEL", &[key_name, fence_field]);
    }
    match lease_end {
        Some(at) => set_lease_end(ctx, key, key_name, at),
        None => Ok(()),
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
        let found = match stored {
            Some(bound) => Counter::Bound(bound),
            None if slot_settled_here(ctx, lock_key) => Counter::Missing,
            None => Counter::Elsewhere,
        };
        let grant = memory.next_token(db, found, now)?;
        if let Some(bound) = grant.store_bound {
            let mut digits = [0u8; 20];
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

/// Whether this server may begin the token counter of `lock_key`'s slot: outside a cluster
/// always; in one only while it owns the slot and is moving it nowhere (asked of `CLUSTER
/// NODES`, only when a grant finds no counter: a slot's first grant, or one during a move). An
/// unreadable answer is not settled: the grant is refused (`TRYAGAIN`) rather than guessed.
fn slot_settled_here(ctx: Ctx, lock_key: &[u8]) -> bool {
    if !crate::ffi::is_cluster(ctx) {
        return true;
    }
    crate::ffi::cluster_nodes(ctx)
        .is_some_and(|nodes| lock_core::cluster::settled_here(&nodes, key_slot(lock_key)))
}

/// Stores what the leader of `epoch` proclaims for the election key `lock_key` (in the slot's
/// hash of proclamations, replicated as `HSET`). A key there that is not a hash (a client
/// wrote one) is left alone: the value is then only announced, not kept.
pub fn write_proclaimed(ctx: Ctx, lock_key: &[u8], epoch: u64, value: &[u8]) {
    let name = OwnedString::new(&leaders_key(key_slot(lock_key)));
    let key = Key::open(ctx, name.as_ptr());
    if !matches!(key.kind(), KeyKind::Hash | KeyKind::Missing) {
        return;
    }
    let field = OwnedString::new(lock_key);
    let stored = OwnedString::new(&election::encode_proclaimed(epoch, value));
    key.hash_set(field.as_ptr(), stored.as_ptr());
    drop(key);
    replicate::key_and_strings(ctx, c"HSET", name.as_ptr(), &[field, stored]);
}

/// The proclamation stored for `lock_key`, as stored (`<epoch>:<value>`), if any.
pub fn read_proclaimed(ctx: Ctx, lock_key: &[u8]) -> Option<Vec<u8>> {
    let name = OwnedString::new(&leaders_key(key_slot(lock_key)));
    let key = Key::open_read(ctx, name.as_ptr());
    if key.kind() != KeyKind::Hash {
        return None;
    }
    let field = OwnedString::new(lock_key);
    key.hash_get(field.as_ptr()).map(|v| v.bytes().to_vec())
}

/// Writes a ticket's answer (in the context's selected database): its one element, and its
/// expiry, replicated as the plain `LPUSH` and `PEXPIREAT` they are (an AOF replays them
/// without the module). A client blocked on the ticket (`BLPOP`) is served right after the
/// command or callback that writes it. Anything else found under the name (a client wrote it:
/// the namespace is reserved) is replaced.
pub fn push_ticket(ctx: Ctx, name: &[u8], value: &[u8], expires_at: u64) {
    let Ok(at) = stored_integer(expires_at) else {
        return;
    };
    let name = OwnedString::new(name);
    let key = Key::open(ctx, name.as_ptr());
    if key.kind() != KeyKind::Missing {
        delete(ctx, &key, name.as_ptr());
    }
    let value = OwnedString::new(value);
    if !key.list_push_head(value.as_ptr()) {
        return;
    }
    key.set_expires_at(at);
    drop(key);
    replicate::strings(ctx, c"LPUSH", &[name.as_ptr(), value.as_ptr()]);
    let at = OwnedString::from_u64(expires_at);
    replicate::strings(ctx, c"PEXPIREAT", &[name.as_ptr(), at.as_ptr()]);
}

/// Takes what a ticket still holds (None: nothing, it was popped, expired or never written),
/// removing the key, replicated as `DEL`.
pub fn take_ticket(ctx: Ctx, name: &[u8]) -> Option<Vec<u8>> {
    let name = OwnedString::new(name);
    let key = Key::open(ctx, name.as_ptr());
    let value = match key.kind() {
        KeyKind::Missing => return None,
        KeyKind::List => key.list_pop_head().map(|v| v.bytes().to_vec()),
        _ => None,
    };
    delete(ctx, &key, name.as_ptr());
    value
}

/// A count, token or time as the signed 64-bit integer Redis stores. The core never produces a
/// larger one (counts and tokens stop at `i64::MAX` with an error); should one get here, the
/// command fails before writing rather than store a saturated value.
pub fn stored_integer(value: u64) -> Result<i64, LockError> {
    i64::try_from(value).map_err(|_| LockError::Internal)
}

pub fn set_lease_end(
    ctx: Ctx,
    key: &Key,
    key_name: RawString,
    expires_at: u64,
) -> Result<(), LockError> {
    key.set_expires_at(stored_integer(expires_at)?);
    let at = OwnedString::from_u64(expires_at);
    replicate::strings(ctx, c"PEXPIREAT", &[key_name, at.as_ptr()]);
    Ok(())
}

pub fn delete(ctx: Ctx, key: &Key, key_name: RawString) {
    DELETING.with(|d| d.set(true));
    key.delete();
    DELETING.with(|d| d.set(false));
    replicate::strings(ctx, c"DEL", &[key_name]);
}

thread_local! {
    /// Set while the module deletes a key itself (a release, a force release, the last hold of a
    /// key ending; a ticket it answers again or takes): the key server event it raises is the
    /// module's own, whose holders the command or the scheduler tells themselves.
    static DELETING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the module is deleting a key right now (see [`delete`]).
pub fn deleting() -> bool {
    DELETING.with(std::cell::Cell::get)
}
