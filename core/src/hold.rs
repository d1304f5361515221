//! The lock family: one hold, three kinds.
//!
//! A key held by one owner exclusively keeps Redisson's `RLock` layout (the holder's field holds
//! its re-entry count, and the key's expiry is the lease; the store reads it in O(1), see
//! [`decode_rlock`]), with one more field, [`MODE_FIELD`] = `exclusive:<token>`, carrying the
//! fencing token. Every other lock — shared holds, a semaphore, an exclusive holder that also
//! took the key `SHARED` — is stored as a hash with the mode field and one field per hold:
//!
//! ```text
//! mode        rw | semaphore:<n>
//! x:<owner>   <count>:<lease-end-ms>:<token>     the exclusive hold (a downgrade)
//! s:<owner>   <count>:<lease-end-ms>:<token>     a shared hold
//! p:<owner>   <count>:<lease-end-ms>:<token>     a permit
//! ```
//!
//! and the key's own expiry is the latest lease end. Redisson's `RReadWriteLock` reads the same
//! `mode` field and takes a key only when it is missing (or `read`/`write`): none of these
//! values, so every module key is busy to it.
//!
//! Keys written before the token moved into `mode` have the old names: the token in
//! [`FENCE_FIELD`] (`__fence__`), the multi-hold mode in [`LEGACY_MODE_FIELD`] (`__mode__`). They
//! are still read ([`FieldNames::Legacy`]), and the key's next write renames them ([`writes`]).
//!
//! This module decodes either layout into a
//! [`Lock`], decides what a request does to it, and says which fields to write ([`writes`]).
//! Everything is plain data: the adapter reads, asks, writes.

use std::collections::{BTreeMap, HashMap, HashSet};

use smallvec::SmallVec;

pub use crate::kind::{
    Family, HoldKind, Mode, Queue, Reentry, MAX_HOLDERS, MAX_LIMIT, MAX_STORED_HOLDERS,
};
use crate::layout::{parse_exclusive_mode, parse_positive, FENCE_FIELD, LEGACY_MODE_FIELD};
pub use crate::layout::{MODE_FIELD, MODE_FIELD_DISPLAY};
use crate::{LockError, UnixMs};

/// The most fields a stored multi-hold key may have (the mode field, one per hold, and the
/// exclusive hold of a downgrade); a hash with more is refused before any field is read.
pub const MAX_MULTI_FIELDS: usize = MAX_STORED_HOLDERS + 2;

/// The most fields Redisson's `RLock` layout has: its holder and the mode (or, in the old layout,
/// the fence).
pub const MAX_RLOCK_FIELDS: usize = 2;

/// A lock's holds: one inline (an exclusive lock, the hot path, allocates nothing), more on the
/// heap.
pub type Holds = SmallVec<[Hold; 1]>;

/// An owner's name as a hold keeps it: inline up to 48 bytes (Redisson's `uuid:threadId` and
/// most owners), so reading and writing an exclusive lock allocates nothing for it.
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OwnerName(SmallVec<[u8; 48]>);

impl OwnerName {
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::Deref for OwnerName {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::borrow::Borrow<[u8]> for OwnerName {
    fn borrow(&self) -> &[u8] {
        &self.0
    }
}

impl From<&[u8]> for OwnerName {
    fn from(bytes: &[u8]) -> OwnerName {
        OwnerName(SmallVec::from_slice(bytes))
    }
}

impl From<Vec<u8>> for OwnerName {
    fn from(bytes: Vec<u8>) -> OwnerName {
        OwnerName(SmallVec::from_vec(bytes))
    }
}

impl PartialEq<[u8]> for OwnerName {
    fn eq(&self, other: &[u8]) -> bool {
        self.as_slice() == other
    }
}

impl PartialEq<&[u8]> for OwnerName {
    fn eq(&self, other: &&[u8]) -> bool {
        self.as_slice() == *other
    }
}

impl<const N: usize> PartialEq<&[u8; N]> for OwnerName {
    fn eq(&self, other: &&[u8; N]) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl std::fmt::Debug for OwnerName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

/// One owner's hold of one kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub owner: OwnerName,
    pub kind: HoldKind,
    pub count: u64,
    /// None only for an `RLock`-layout key without an expiry (made so outside the module).
    pub expires_at: Option<UnixMs>,
    /// None only for an `RLock`-layout hold taken by Redisson's own script.
    pub token: Option<u64>,
}

impl Hold {
    /// Whether the hold's lease ended by `now`.
    pub fn ended(&self, now: UnixMs) -> bool {
        // The server's rule for keys: expired once the clock is past the deadline.
        self.expires_at.is_some_and(|at| now > at)
    }
}

/// A lock as stored at a key: what it is and its holds (none once every hold ended).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    pub family: Family,
    pub holds: Holds,
}

/// How a stored lock's key looks in INFO's `mode` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeName {
    Exclusive,
    Shared,
    Semaphore,
}

impl ModeName {
    pub fn name(self) -> &'static str {
        match self {
            ModeName::Exclusive => "exclusive",
            ModeName::Shared => "shared",
            ModeName::Semaphore => "semaphore",
        }
    }
}

impl Lock {
    /// A free key: no holds (whoever acquires it first decides what it is).
    pub const fn free() -> Lock {
        Lock::empty(Family::ReadWrite)
    }

    const fn empty(family: Family) -> Lock {
        Lock {
            family,
            holds: SmallVec::new_const(),
        }
    }

    /// Whether the key keeps Redisson's `RLock` layout: one exclusive hold and nothing else.
    pub fn is_rlock_layout(&self) -> bool {
        self.family == Family::ReadWrite
            && matches!(self.holds.as_slice(), [hold] if hold.kind == HoldKind::Exclusive)
    }

    pub fn mode_name(&self) -> ModeName {
        match self.family {
            Family::Semaphore { .. } => ModeName::Semaphore,
            Family::ReadWrite if self.exclusive().is_some() => ModeName::Exclusive,
            Family::ReadWrite => ModeName::Shared,
        }
    }

    pub fn exclusive(&self) -> Option<&Hold> {
        self.holds.iter().find(|h| h.kind == HoldKind::Exclusive)
    }

    fn find(&self, owner: &[u8], kind: HoldKind) -> Option<usize> {
        self.holds
            .iter()
            .position(|h| h.kind == kind && h.owner == owner)
    }

    /// The earliest lease end among the holds: when the key may next have room.
    pub fn next_lease_end(&self) -> Option<UnixMs> {
        self.holds.iter().filter_map(|h| h.expires_at).min()
    }

    /// The key's expiry: the latest lease end (None if a hold has no lease).
    pub fn last_lease_end(&self) -> Option<UnixMs> {
        let mut last = None;
        for hold in &self.holds {
            let at = hold.expires_at?;
            last = Some(last.map_or(at, |l: UnixMs| l.max(at)));
        }
        last
    }

    /// Removes the holds whose lease ended by `now`; returns how many.
    pub fn drop_ended(&mut self, now: UnixMs) -> usize {
        self.take_ended(now).len()
    }

    /// Removes the holds whose lease ended by `now` and returns them (their holders lost them).
    pub fn take_ended(&mut self, now: UnixMs) -> Vec<Hold> {
        if !self.holds.iter().any(|h| h.ended(now)) {
            return Vec::new();
        }
        let mut ended = Vec::new();
        for hold in std::mem::take(&mut self.holds) {
            if hold.ended(now) {
                ended.push(hold);
            } else {
                self.holds.push(hold);
            }
        }
        ended
    }

    /// The sum of `owner`'s re-entries over its holds.
    pub fn count_of(&self, owner: &[u8]) -> u64 {
        self.holds
            .iter()
            .filter(|h| h.owner == owner)
            .fold(0u64, |sum, h| sum.saturating_add(h.count))
    }
}

/// Field names and values of a stored lock, as the adapter read them.
pub type Fields = [(Vec<u8>, Vec<u8>)];

/// Decodes any lock layout. `expires_at` is the key's expiry (it is the lease of an `RLock`
/// layout hold). Anything that is not exactly a lock is [`LockError::NotALock`].
pub fn decode(fields: &Fields, expires_at: Option<UnixMs>) -> Result<Lock, LockError> {
    let mut mode: Option<(&[u8], &[u8])> = None;
    for (field, value) in fields {
        let field = field.as_slice();
        if field == MODE_FIELD || field == LEGACY_MODE_FIELD {
            // Both names at once is no layout (one name twice is a hash scan's twin).
            if mode.is_some_and(|(seen, _)| seen != field) {
                return Err(LockError::NotALock);
            }
            mode = Some((field, value.as_slice()));
        }
    }
    match mode {
        Some((field, value))
            if field == LEGACY_MODE_FIELD || parse_exclusive_mode(value).is_none() =>
        {
            decode_multi(fields, field, value)
        }
        _ => decode_rlock(
            fields.iter().map(|(f, v)| (f.as_slice(), v.as_slice())),
            expires_at,
        ),
    }
}

/// Decodes a lock as read from its key's fields, with the names it is stored under (see
/// [`FieldNames`]).
pub fn decode_stored(fields: &Fields, expires_at: Option<UnixMs>) -> Result<StoredLock, LockError> {
    let lock = decode(fields, expires_at)?;
    let legacy = |field: &[u8]| field == FENCE_FIELD || field == LEGACY_MODE_FIELD;
    let names = match fields.iter().any(|(f, _)| legacy(f)) {
        true => FieldNames::Legacy,
        false => FieldNames::Current,
    };
    Ok(StoredLock {
        lock,
        expires_at,
        names,
    })
}

/// Decodes a hash of at most [`MAX_RLOCK_FIELDS`] fields, read as (field, value) pairs:
/// Redisson's `RLock` layout — one holder field whose value is a positive re-entry count, and
/// optionally the token: [`MODE_FIELD`] = `exclusive:<token>`, or in the old layout
/// [`FENCE_FIELD`] = `<token>` — or [`LockError::NotALock`]. The store's O(1) read of an
/// exclusive lock ends here too, so every read of this layout follows one rule.
pub fn decode_rlock<'a>(
    fields: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    expires_at: Option<UnixMs>,
) -> Result<Lock, LockError> {
    let mut token = None;
    let mut holder = None;
    for (field, value) in fields {
        // One token (in the mode or the old fence field), one holder, no old mode field:
        // anything else is not this layout.
        let token_field = field == MODE_FIELD || field == FENCE_FIELD;
        let slot_taken = if token_field {
            token.is_some()
        } else {
            holder.is_some() || field == LEGACY_MODE_FIELD
        };
        if slot_taken {
            return Err(LockError::NotALock);
        }
        if field == MODE_FIELD {
            token = Some(parse_exclusive_mode(value).ok_or(LockError::NotALock)?);
            continue;
        }
        let value = parse_positive(value).ok_or(LockError::NotALock)?;
        if token_field {
            token = Some(value);
        } else {
            holder = Some((field, value));
        }
    }
    let (owner, count) = holder.ok_or(LockError::NotALock)?;
    Ok(Lock {
        family: Family::ReadWrite,
        holds: smallvec::smallvec![Hold {
            owner: owner.into(),
            kind: HoldKind::Exclusive,
            count,
            expires_at,
            token,
        }],
    })
}

/// Whether a mode field's value is a multi-hold key's (`rw`, `semaphore:<n>`).
pub fn is_multi_mode(mode: &[u8]) -> bool {
    decode_family(mode).is_some()
}

/// The family a multi-hold key's mode value names (`rw`, `semaphore:<n>`); None for any other
/// value.
pub fn decode_family(mode: &[u8]) -> Option<Family> {
    if mode == b"rw" {
        return Some(Family::ReadWrite);
    }
    let limit = parse_positive(mode.strip_prefix(b"semaphore:")?)?;
    (limit <= MAX_STORED_HOLDERS as u64).then_some(Family::Semaphore { limit })
}

fn decode_multi(fields: &Fields, mode_field: &[u8], mode: &[u8]) -> Result<Lock, LockError> {
    let family = decode_family(mode).ok_or(LockError::NotALock)?;
    let mut lock = Lock::empty(family);
    for (field, value) in fields {
        if field.as_slice() == mode_field {
            continue;
        }
        let hold = decode_hold(field, value).ok_or(LockError::NotALock)?;
        lock.holds.push(hold);
    }
    // The exclusive hold first, then the others by owner: the order INFO lists them in. A
    // hash scan that reported a field twice (a rehash between its calls) leaves two equal
    // holds side by side: one is kept.
    lock.holds
        .sort_unstable_by(|a, b| (a.kind, &a.owner).cmp(&(b.kind, &b.owner)));
    lock.holds
        .dedup_by(|a, b| a.kind == b.kind && a.owner == b.owner);
    if !is_consistent(&lock) {
        return Err(LockError::NotALock);
    }
    Ok(lock)
}

fn decode_hold(field: &[u8], value: &[u8]) -> Option<Hold> {
    let kind = HoldKind::ALL
        .into_iter()
        .find(|k| field.starts_with(k.prefix()))?;
    let owner = field.get(2..)?;
    if owner.is_empty() {
        return None;
    }
    decode_hold_value(kind, owner, value)
}

/// One owner's holds on a multi-hold key of `family` with `holds` holds in all, from the values
/// of its own fields (in [`HoldKind::ALL`] order: `x:<owner>`, `s:<owner>`, `p:<owner>`; None
/// where absent): what the key's full read ([`decode`]) gives for this owner, in O(1) — the
/// other holds are not read. A value that is no hold, a kind the family does not have (a permit
/// in a read-write lock, an exclusive or shared hold in a semaphore), a semaphore with more holds
/// than its limit, or an exclusive hold beside holds of others (it allows only its owner's
/// shared hold) is [`LockError::NotALock`], as the full read would find. What only the other
/// holds' own fields would show (another owner's exclusive hold among many shared ones) is not
/// seen: the adapter reads a small key in full instead.
pub fn decode_owner_holds(
    family: Family,
    holds: usize,
    owner: &[u8],
    values: [Option<&[u8]>; 3],
) -> Result<Holds, LockError> {
    if let Family::Semaphore { limit } = family {
        if holds as u64 > limit {
            return Err(LockError::NotALock);
        }
    }
    let mut own = Holds::new();
    for (kind, value) in HoldKind::ALL.into_iter().zip(values) {
        let Some(value) = value else { continue };
        let allowed = match family {
            Family::Semaphore { .. } => kind == HoldKind::Permit,
            Family::ReadWrite => kind != HoldKind::Permit,
        };
        let alone = kind != HoldKind::Exclusive || holds <= 2;
        let hold =
            decode_hold_value(kind, owner, value).filter(|_| allowed && alone && !owner.is_empty());
        own.push(hold.ok_or(LockError::NotALock)?);
    }
    Ok(own)
}

/// A multi-hold layout hold's value, `<count>:<lease-end-ms>:<token>`.
fn decode_hold_value(kind: HoldKind, owner: &[u8], value: &[u8]) -> Option<Hold> {
    let mut parts = value.split(|b| *b == b':');
    let count = parse_positive(parts.next()?)?;
    let expires_at = parse_positive(parts.next()?)?;
    let token = parse_positive(parts.next()?)?;
    if parts.next().is_some() {
        return None;
    }
    Some(Hold {
        owner: owner.into(),
        kind,
        count,
        expires_at: Some(expires_at),
        token: Some(token),
    })
}

/// The rules every stored multi-hold lock obeys: a semaphore has only permits, at most
/// `limit`; a read-write lock has no permits, at most one exclusive hold, and if it has one, the
/// only shared hold is its owner's. A lone exclusive hold is stored in Redisson's layout, never
/// in this one, so such a hash was not written by the module: it is not a lock (reading it as
/// one would write Redisson's layout beside its fields).
fn is_consistent(lock: &Lock) -> bool {
    let holds = &lock.holds;
    if holds.len() > MAX_STORED_HOLDERS || lock.is_rlock_layout() {
        return false;
    }
    match lock.family {
        Family::Semaphore { limit } => {
            holds.iter().all(|h| h.kind == HoldKind::Permit) && holds.len() as u64 <= limit
        }
        Family::ReadWrite => {
            if holds.iter().any(|h| h.kind == HoldKind::Permit) {
                return false;
            }
            let mut exclusive = holds.iter().filter(|h| h.kind == HoldKind::Exclusive);
            match (exclusive.next(), exclusive.next()) {
                (None, _) => true,
                (Some(_), Some(_)) => false,
                (Some(x), None) => holds.iter().all(|h| h.owner == x.owner),
            }
        }
    }
}

/// The fields a lock is stored as (field → value), without the key's expiry.
pub fn encode(lock: &Lock) -> BTreeMap<Vec<u8>, Vec<u8>> {
    encode_as(lock, FieldNames::Current)
}

/// The fields a lock is stored as under `names`: the module writes [`FieldNames::Current`];
/// [`FieldNames::Legacy`] is what a key written before has (so that [`writes`] removes it).
fn encode_as(lock: &Lock, names: FieldNames) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut fields = BTreeMap::new();
    if lock.holds.is_empty() {
        return fields;
    }
    if lock.is_rlock_layout() {
        for hold in &lock.holds {
            fields.insert(hold.owner.to_vec(), hold.count.to_string().into_bytes());
            if let Some(token) = hold.token {
                let (field, value) = match names {
                    FieldNames::Current => (MODE_FIELD, format!("exclusive:{token}")),
                    FieldNames::Legacy => (FENCE_FIELD, token.to_string()),
                };
                fields.insert(field.to_vec(), value.into_bytes());
            }
        }
        return fields;
    }
    fields.insert(names.mode_field().to_vec(), mode_value(lock.family));
    for hold in &lock.holds {
        let (name, value) = multi_field(hold);
        fields.insert(name, value);
    }
    fields
}

/// A hold's field name in the multi-hold layout (`<kind prefix><owner>`).
fn multi_field_name(hold: &Hold) -> Vec<u8> {
    hold_field(hold.kind, &hold.owner)
}

/// The field of `owner`'s hold of `kind` in the multi-hold layout: `x:<owner>`, `s:<owner>` or
/// `p:<owner>`.
pub fn hold_field(kind: HoldKind, owner: &[u8]) -> Vec<u8> {
    let mut name = Vec::with_capacity(2 + owner.len());
    name.extend_from_slice(kind.prefix());
    name.extend_from_slice(owner);
    name
}

/// A hold's field in the multi-hold layout: `<count>:<lease-end-ms>:<token>`.
fn multi_field(hold: &Hold) -> (Vec<u8>, Vec<u8>) {
    // A multi-hold key only ever holds module-written holds, which have both.
    let value = format!(
        "{}:{}:{}",
        hold.count,
        hold.expires_at.unwrap_or_default(),
        hold.token.unwrap_or_default()
    );
    (multi_field_name(hold), value.into_bytes())
}

/// The value of the mode field of a multi-hold key of this family.
fn mode_value(family: Family) -> Vec<u8> {
    match family {
        Family::ReadWrite => b"rw".to_vec(),
        Family::Semaphore { limit } => format!("semaphore:{limit}").into_bytes(),
    }
}

/// One write to a lock's key, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// The lock is gone: delete the key.
    Delete,
    /// Set these fields (HSET).
    Set(Vec<(Vec<u8>, Vec<u8>)>),
    /// Remove these fields (HDEL).
    Remove(Vec<Vec<u8>>),
    /// The key's new expiry (PEXPIREAT).
    ExpireAt(UnixMs),
}

/// The writes that turn the stored lock `old` (None: no key), stored under `names`, into `new`:
/// only the fields that change, and the expiry when it moves. A key with the old names gets the
/// current ones (the old fields removed), so it never holds both.
pub fn writes(
    old: Option<&Lock>,
    old_expires_at: Option<UnixMs>,
    names: FieldNames,
    new: &Lock,
) -> Vec<Write> {
    if new.holds.is_empty() {
        return if old.is_some() {
            vec![Write::Delete]
        } else {
            Vec::new()
        };
    }
    if let Some(old) = old.filter(|old| stays_multi(old, new)) {
        return multi_writes(old, old_expires_at, names, new);
    }
    let mut before = old.map(|o| encode_as(o, names)).unwrap_or_default();
    if let Some(old) = old.filter(|o| o.holds.is_empty()) {
        // Only a multi-hold key decodes to a lock without holds: its mode field is stored.
        before.insert(names.mode_field().to_vec(), mode_value(old.family));
    }
    let after = encode(new);
    let mut out = Vec::new();
    let set: Vec<(Vec<u8>, Vec<u8>)> = after
        .iter()
        .filter(|(f, v)| before.get(*f) != Some(*v))
        .map(|(f, v)| (f.clone(), v.clone()))
        .collect();
    if !set.is_empty() {
        out.push(Write::Set(set));
    }
    let removed: Vec<Vec<u8>> = before
        .keys()
        .filter(|f| !after.contains_key(*f))
        .cloned()
        .collect();
    if !removed.is_empty() {
        out.push(Write::Remove(removed));
    }
    if let Some(at) = new.last_lease_end() {
        if old.is_none() || old_expires_at != Some(at) {
            out.push(Write::ExpireAt(at));
        }
    }
    out
}

/// Whether `old` and `new` are both stored in the multi-hold layout with the same mode field:
/// then only the holds that differ are written.
fn stays_multi(old: &Lock, new: &Lock) -> bool {
    old.family == new.family
        && !old.is_rlock_layout()
        && !new.is_rlock_layout()
        && !new.holds.is_empty()
}

/// [`writes`] between two multi-hold locks: O(holds), formatting only the holds that changed
/// (a command on a key of 10,000 holds writes one or two of them).
fn multi_writes(
    old: &Lock,
    old_expires_at: Option<UnixMs>,
    names: FieldNames,
    new: &Lock,
) -> Vec<Write> {
    let mut before: HashMap<(HoldKind, &[u8]), &Hold> = old
        .holds
        .iter()
        .map(|h| ((h.kind, h.owner.as_slice()), h))
        .collect();
    let mut set: Vec<(Vec<u8>, Vec<u8>)> = new
        .holds
        .iter()
        .filter(|h| before.remove(&(h.kind, h.owner.as_slice())) != Some(*h))
        .map(multi_field)
        .collect();
    let mut removed: Vec<Vec<u8>> = old
        .holds
        .iter()
        .filter(|h| before.contains_key(&(h.kind, h.owner.as_slice())))
        .map(multi_field_name)
        .collect();
    if names == FieldNames::Legacy {
        // The old mode field is renamed: `mode` set, `__mode__` removed.
        set.push((MODE_FIELD.to_vec(), mode_value(new.family)));
        removed.push(LEGACY_MODE_FIELD.to_vec());
    }
    let mut out = Vec::new();
    if !set.is_empty() {
        out.push(Write::Set(set));
    }
    if !removed.is_empty() {
        out.push(Write::Remove(removed));
    }
    if let Some(at) = new.last_lease_end() {
        if old_expires_at != Some(at) {
            out.push(Write::ExpireAt(at));
        }
    }
    out
}

/// What an acquire does to a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Grant: the lock becomes `lock` once the adapter fills in a new token where
    /// [`Granted::token`] is None.
    Grant(Granted),
    /// Somebody else's hold, or the queue ahead, is in the way.
    Busy,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    pub how: How,
    pub kind: HoldKind,
    pub count: u64,
    pub expires_at: UnixMs,
    /// The hold's token when it keeps one (a re-entry); None: a new token is needed.
    pub token: Option<u64>,
}

impl Granted {
    /// The hold this grant gives `owner`, with `token` the new token when it needed one.
    fn hold(&self, owner: &[u8], token: u64) -> Hold {
        Hold {
            owner: owner.into(),
            kind: self.kind,
            count: self.count,
            expires_at: Some(self.expires_at),
            token: Some(self.token.unwrap_or(token)),
        }
    }
}

/// How a grant came about (for counters and keyspace events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    New,
    Reentered,
    /// The exclusive holder also took the key `SHARED`.
    Downgraded,
}

/// What an acquire's decision depends on: what the key is, how many holds it has, whether one
/// is exclusive, and the requesting owner's own holds. Built from a [`Lock`] in one pass
/// ([`Standing::of`]) by a command, or kept up to date in O(1) per grant by a [`Run`].
#[derive(Debug, Clone, Copy)]
pub struct Standing<'a> {
    /// None: the key has no holds (whoever acquires it first decides what it is).
    pub family: Option<Family>,
    pub holds: usize,
    pub any_exclusive: bool,
    /// The owner's own holds, by kind (exclusive, shared, permit).
    pub own: [Option<&'a Hold>; HoldKind::ALL.len()],
}

impl<'a> Standing<'a> {
    /// How `owner` stands on `lock`: O(holds).
    pub fn of(lock: &'a Lock, owner: &[u8]) -> Standing<'a> {
        let mut own = [None; HoldKind::ALL.len()];
        let mut any_exclusive = false;
        for hold in &lock.holds {
            any_exclusive |= hold.kind == HoldKind::Exclusive;
            if hold.owner == owner {
                if let Some(slot) = own.get_mut(hold.kind.index()) {
                    *slot = Some(hold);
                }
            }
        }
        Standing {
            family: (!lock.holds.is_empty()).then_some(lock.family),
            holds: lock.holds.len(),
            any_exclusive,
            own,
        }
    }

    fn own(&self, kind: HoldKind) -> Option<&'a Hold> {
        self.own.get(kind.index()).copied().flatten()
    }

    /// Holds of owners other than the requester.
    fn others(&self) -> usize {
        self.holds - self.own.iter().flatten().count().min(self.holds)
    }
}

/// The one acquire rule for every kind, on a lock whose ended holds were dropped.
pub fn decide(
    lock: &Lock,
    owner: &[u8],
    mode: Mode,
    lease_ms: u64,
    reentry: Reentry,
    queue: Queue,
    now: UnixMs,
) -> Result<Decision, LockError> {
    decide_on(
        &Standing::of(lock, owner),
        mode,
        lease_ms,
        reentry,
        queue,
        now,
    )
}

/// [`decide`] on an owner's standing: O(1).
pub fn decide_on(
    standing: &Standing<'_>,
    mode: Mode,
    lease_ms: u64,
    reentry: Reentry,
    queue: Queue,
    now: UnixMs,
) -> Result<Decision, LockError> {
    let expires_at = now.saturating_add(lease_ms);
    let family = standing.family.unwrap_or(mode.family());
    match (family, mode) {
        (Family::Semaphore { limit }, Mode::Limit(asked)) if limit != asked => {
            return Err(LockError::IsSemaphore { limit })
        }
        (Family::Semaphore { limit }, Mode::Exclusive | Mode::Shared) => {
            return Err(LockError::IsSemaphore { limit })
        }
        (Family::ReadWrite, Mode::Limit(_)) => return Err(LockError::IsReadWrite),
        _ => {}
    }
    let kind = mode.kind();
    if let Some(held) = standing.own(kind) {
        let count = reentry.count_after(held.count)?;
        return Ok(Decision::Grant(Granted {
            how: How::Reentered,
            kind,
            count,
            expires_at,
            token: held.token,
        }));
    }
    let new = |how| {
        Ok(Decision::Grant(Granted {
            how,
            kind,
            count: 1,
            expires_at,
            token: None,
        }))
    };
    match kind {
        HoldKind::Exclusive => {
            if standing.own(HoldKind::Shared).is_some() {
                return Err(LockError::UpgradeRefused);
            }
            if standing.others() > 0 || queue == Queue::Waiting {
                return Ok(Decision::Busy);
            }
            new(How::New)
        }
        HoldKind::Shared => {
            if let Some(exclusive) = standing.own(HoldKind::Exclusive) {
                // The exclusive hold moves into the multi-hold layout, which stores a lease and
                // a token for every hold.
                if exclusive.token.is_none() || exclusive.expires_at.is_none() {
                    return Err(LockError::DowngradeNeedsLease);
                }
                // Holding it exclusively already excludes everyone else: nobody to wait for.
                return new(How::Downgraded);
            }
            if standing.any_exclusive || queue == Queue::Waiting {
                return Ok(Decision::Busy);
            }
            if standing.holds >= MAX_HOLDERS {
                return Err(LockError::TooManyHolders {
                    max: MAX_HOLDERS as u64,
                });
            }
            new(How::New)
        }
        HoldKind::Permit => {
            let limit = match family {
                Family::Semaphore { limit } => limit,
                Family::ReadWrite => return Err(LockError::IsReadWrite),
            };
            if standing.holds as u64 >= limit || queue == Queue::Waiting {
                return Ok(Decision::Busy);
            }
            new(How::New)
        }
    }
}

/// The lock after a grant, with `token` the new token when the grant needed one.
pub fn apply(lock: &Lock, owner: &[u8], mode: Mode, granted: &Granted, token: u64) -> Lock {
    let mut out = if lock.holds.is_empty() {
        Lock::empty(mode.family())
    } else {
        lock.clone()
    };
    let hold = granted.hold(owner, token);
    match out
        .find(owner, granted.kind)
        .and_then(|i| out.holds.get_mut(i))
    {
        Some(slot) => *slot = hold,
        None => out.holds.push(hold),
    }
    out
}

/// What a release does: the lock after it, and the owner's remaining re-entries; None when the
/// owner holds nothing. The exclusive hold counts down first (write → read downgrade order).
pub fn release(lock: &Lock, owner: &[u8], token: Option<u64>) -> Option<(Lock, u64)> {
    let i = match token {
        None => [HoldKind::Exclusive, HoldKind::Shared, HoldKind::Permit]
            .into_iter()
            .find_map(|kind| lock.find(owner, kind))?,
        // Tokens are unique per key: the one hold of the owner under it, whatever its kind.
        Some(token) => lock
            .holds
            .iter()
            .position(|h| h.owner == owner && h.token == Some(token))?,
    };
    if let [only] = lock.holds.as_slice() {
        if only.count == 1 {
            // The last hold goes (the common release): nothing to copy.
            return Some((Lock::empty(lock.family), 0));
        }
    }
    let mut out = lock.clone();
    let hold = out.holds.get_mut(i)?;
    if hold.count > 1 {
        hold.count -= 1;
    } else {
        out.holds.remove(i);
    }
    let remaining = out.count_of(owner);
    Some((out, remaining))
}

/// A renew: every hold of the owner gets the lease end `now + lease_ms`. None when the owner
/// holds nothing.
pub fn renew(lock: &Lock, owner: &[u8], lease_ms: u64, now: UnixMs) -> Option<Lock> {
    let mut out = lock.clone();
    let mut any = false;
    for hold in out.holds.iter_mut().filter(|h| h.owner == owner) {
        hold.expires_at = Some(now.saturating_add(lease_ms));
        any = true;
    }
    any.then_some(out)
}

/// [`remove_holds`] of one hold: the lock without it, or None when it is not there (or, with
/// `any_count` false, re-entered). The form the rule's table test states it in.
#[cfg(test)]
pub(crate) fn remove_hold(
    lock: &Lock,
    kind: HoldKind,
    token: u64,
    any_count: bool,
) -> Option<Lock> {
    let mut out = lock.clone();
    let ending = HashSet::from([(kind, token)]);
    (!remove_holds(&mut out, &ending, any_count).is_empty()).then_some(out)
}

/// Removes the holds named by (kind, token) in `ending`, whatever their count (holds whose
/// connection closed) or only at count 1 (`any_count` false: an undelivered grant; a re-entered
/// hold is in use). One pass over the lock however many are named. Returns the removed holds.
pub fn remove_holds(
    lock: &mut Lock,
    ending: &HashSet<(HoldKind, u64)>,
    any_count: bool,
) -> Vec<Hold> {
    let mut removed = Vec::new();
    for hold in std::mem::take(&mut lock.holds) {
        let named = hold.token.is_some_and(|t| ending.contains(&(hold.kind, t)));
        if named && (any_count || hold.count == 1) {
            removed.push(hold);
        } else {
            lock.holds.push(hold);
        }
    }
    removed
}

/// Why a holder lost its hold (anything but its own `LOCK.RELEASE`): the word its lost-hold
/// message starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// `LOCK.FORCERELEASE`.
    ForceReleased,
    /// The key was removed by a command (`DEL`, `UNLINK`, or `RENAME`/`MOVE` taking it away).
    Deleted,
    /// The key's value was replaced (`SET`, `RESTORE ... REPLACE`, a `RENAME` onto it).
    Overwritten,
    /// `maxmemory` evicted the key.
    Evicted,
    /// The `EPHEMERAL` hold's connection closed.
    Disconnected,
    /// The hold's lease ran out.
    Expired,
}

impl LostReason {
    pub fn name(self) -> &'static str {
        match self {
            LostReason::ForceReleased => "forcereleased",
            LostReason::Deleted => "deleted",
            LostReason::Overwritten => "overwritten",
            LostReason::Evicted => "evicted",
            LostReason::Disconnected => "disconnected",
            LostReason::Expired => "expired",
        }
    }
}

/// A hold its holder lost, and why: what the lost-hold message tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    pub reason: LostReason,
    pub owner: Vec<u8>,
    /// None for a hold Redisson's own script took (no fencing token yet).
    pub token: Option<u64>,
}

impl Lost {
    pub fn of(hold: &Hold, reason: LostReason) -> Lost {
        Lost {
            reason,
            owner: hold.owner.to_vec(),
            token: hold.token,
        }
    }
}

/// A lock as read from its key, with the key's expiry (the lease of an `RLock`-layout hold) and
/// the field names it is stored under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredLock {
    pub lock: Lock,
    pub expires_at: Option<UnixMs>,
    pub names: FieldNames,
}

/// The names a key's own fields are stored under.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FieldNames {
    /// `mode` (`exclusive:<token>`, `rw`, `semaphore:<n>`): what the module writes.
    #[default]
    Current,
    /// The old layout: the token in `__fence__`, a multi-hold key's mode in `__mode__`. Read as
    /// before; the next write renames them.
    Legacy,
}

impl FieldNames {
    /// The name of a multi-hold key's mode field.
    fn mode_field(self) -> &'static [u8] {
        match self {
            FieldNames::Current => MODE_FIELD,
            FieldNames::Legacy => LEGACY_MODE_FIELD,
        }
    }
}

mod run;
pub use run::Run;

#[cfg(test)]
mod tests;
