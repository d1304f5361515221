//! Holds bound to the connection that took them (`EPHEMERAL`): they end when it closes.
//!
//! A grant is identified by its key (database and name, as a keyed 64-bit fingerprint) and its
//! token, so the index from a hold to its connection is three integers. The name is part of it:
//! tokens never repeat within a slot, but `COPY` puts a hold's token on a second key (whose hold
//! is a plain copy, bound to nothing). The database is part of it too, through an identity that
//! `SWAPDB` swaps in O(1) and that `MOVE`/`RENAME` rewrite for the key's own holds only, so that
//! a binding follows its hold wherever the key goes. Each connection keeps the list of its holds, so that closing it costs in
//! proportion to its own holds only.
//!
//! The binding is paid for per hold (issue #12 budgets 64 B), so both halves are packed:
//! - the index entry is 24 bytes (the token, the key's fingerprint, the client id) in a table
//!   of its own that wastes less than a standard map (see `index`);
//! - a connection's list is one byte buffer of records (database and kind, name length, token,
//!   name: 17 bytes for a 7-byte name), grown a size class at a time rather than doubled.
//!
//! Each connection with a bound hold also has its entry in `lists` and its buffer's first
//! allocation: about 100 bytes, a few percent of what Redis spends on the connection itself.
//!
//! A hold its owner releases leaves the index at once, but its record stays in the list (finding
//! it would cost a scan) until the list is compacted: a record is live exactly while the index
//! still binds its grant to that connection. Compaction runs when the dead records' bytes
//! outweigh the live ones, so the list stays within about twice its live bytes and each
//! compaction copies no more than the releases since the last one freed.

use std::collections::{BTreeMap, HashMap};

use crate::key::LockKey;
pub use crate::key::{ClientId, GrantRef};
use crate::kind::HoldKind;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

mod index;

use index::{Entry, GrantIndex};

/// A connection's list is first checked for holds gone by other means (DEL, a lease end) at
/// this many bytes (about a hundred records of short names), then each time it doubles.
const FIRST_PRUNE_AT: usize = 2_048;

/// Which database each identity is now. Records and fingerprints name a database by an
/// identity, which is its number until `SWAPDB` swaps two numbers' identities.
#[derive(Debug, Default)]
struct Databases {
    /// db → identity, where they differ.
    identity: HashMap<i32, i32>,
    /// identity → db, where they differ.
    db: HashMap<i32, i32>,
}

impl Databases {
    fn identity(&self, db: i32) -> i32 {
        self.identity.get(&db).copied().unwrap_or(db)
    }

    fn db(&self, identity: i32) -> i32 {
        self.db.get(&identity).copied().unwrap_or(identity)
    }

    fn swap(&mut self, a: i32, b: i32) {
        let (id_a, id_b) = (self.identity(a), self.identity(b));
        self.set(a, id_b);
        self.set(b, id_a);
    }

    fn set(&mut self, db: i32, identity: i32) {
        if db == identity {
            self.identity.remove(&db);
            self.db.remove(&identity);
        } else {
            self.identity.insert(db, identity);
            self.db.insert(identity, db);
        }
    }
}

/// Dead records below this many bytes are not worth a compaction.
const COMPACT_FROM: usize = 1_024;

#[derive(Debug, Default)]
pub struct Bindings {
    /// (key fingerprint, token) → client, for every client id but the one that marks a free
    /// position in the table.
    index: GrantIndex,
    /// The same for client id 2^64 - 1, which Redis never reaches (its ids count connections
    /// from 1) but which must not be bound to the wrong connection either.
    wide_index: HashMap<(u64, u64), ClientId>,
    /// Which database each identity stored in the records is now (`SWAPDB`).
    databases: Databases,
    /// Keys the fingerprints.
    keyer: RandomState,
    /// Boxed: most connections hold one or two holds, and a map's slack costs per entry (a
    /// 16-byte entry instead of 56 saves about 40 bytes per connection). Ordered, so that the
    /// sweep can go round the connections a few at a time.
    lists: BTreeMap<ClientId, Box<ClientHolds>>,
}

impl Bindings {
    /// Binds the hold granted with `token` on `key` to `client`. Returns true when the
    /// connection's list has grown enough to be pruned: the caller then calls [`Self::prune`]
    /// (if it can tell which holds still exist; otherwise a later bind asks again).
    ///
    /// A grant already bound stays with the connection it is bound to (a grant is bound once,
    /// when it is made, so this does not happen; the rule keeps each grant to one record).
    pub fn bind(&mut self, client: ClientId, key: &LockKey, kind: HoldKind, token: u64) -> bool {
        if self.client_of(key, token).is_some() {
            return false;
        }
        let identity = self.databases.identity(key.db);
        self.index_insert(self.fingerprint(identity, &key.name), token, client);
        let list = self.lists.entry(client).or_default();
        list.push_record(&Record {
            db: identity,
            kind,
            token,
            name: &key.name,
        });
        list.buffer.len() >= list.prune_at
    }

    /// The connection the grant (its key, its token) is bound to, if any.
    pub fn client_of(&self, key: &LockKey, token: u64) -> Option<ClientId> {
        let identity = self.databases.identity(key.db);
        self.bound_to(self.fingerprint(identity, &key.name), token)
    }

    fn bound_to(&self, fingerprint: u64, token: u64) -> Option<ClientId> {
        self.index
            .get(fingerprint, token)
            .or_else(|| self.wide_index.get(&(fingerprint, token)).copied())
    }

    fn fingerprint(&self, identity: i32, name: &[u8]) -> u64 {
        self.keyer.hash_one((identity, name))
    }

    fn record_fingerprint(&self, record: &Record<'_>) -> u64 {
        self.fingerprint(record.db, record.name)
    }

    fn index_insert(&mut self, fingerprint: u64, token: u64, client: ClientId) {
        match Entry::pack(fingerprint, token, client) {
            Some(entry) => {
                self.index.insert(entry);
            }
            None => {
                self.wide_index.insert((fingerprint, token), client);
            }
        }
    }

    /// The grant a record names, in the database its identity is now.
    fn grant_of(&self, record: &Record<'_>) -> GrantRef {
        GrantRef {
            key: LockKey::new(self.databases.db(record.db), record.name),
            kind: record.kind,
            token: record.token,
        }
    }

    /// `SWAPDB a b`: the holds of each database are now the other's (O(1)).
    pub fn swap_databases(&mut self, a: i32, b: i32) {
        self.databases.swap(a, b);
    }

    /// `MOVE`/`RENAME` took the key `from`, with the holds of these tokens, to `to`: their
    /// bindings follow. Costs the holds moved plus the lists of the connections they are bound
    /// to (each rewritten once).
    pub fn moved(&mut self, from: &LockKey, to: &LockKey, tokens: &[u64]) {
        let (from_id, to_id) = (
            self.databases.identity(from.db),
            self.databases.identity(to.db),
        );
        let (from_fp, to_fp) = (
            self.fingerprint(from_id, &from.name),
            self.fingerprint(to_id, &to.name),
        );
        let moving: HashMap<u64, ClientId> = tokens
            .iter()
            .filter_map(|&t| self.bound_to(from_fp, t).map(|c| (t, c)))
            .collect();
        let clients: std::collections::BTreeSet<ClientId> = moving.values().copied().collect();
        for client in clients {
            let Some(mut list) = self.lists.remove(&client) else {
                continue;
            };
            let mut kept = ClientHolds::default();
            for record in list.iter() {
                if self.bound_to(self.record_fingerprint(&record), record.token) != Some(client) {
                    continue;
                }
                let moves = record.db == from_id
                    && *record.name == *from.name
                    && moving.contains_key(&record.token);
                if moves {
                    kept.push_record(&Record {
                        db: to_id,
                        kind: record.kind,
                        token: record.token,
                        name: &to.name,
                    });
                } else {
                    kept.push_record(&record);
                }
            }
            list.buffer = kept.buffer;
            list.live = kept.live;
            list.live_bytes = kept.live_bytes;
            self.lists.insert(client, list);
        }
        for (token, client) in moving {
            self.remove(from_fp, token);
            self.index_insert(to_fp, token, client);
        }
    }

    /// `FLUSHDB` (Some) or `FLUSHALL` (None): every hold there is gone, and so are its bindings.
    pub fn flushed(&mut self, db: Option<i32>) {
        let Some(db) = db else {
            self.clear();
            return;
        };
        let identity = self.databases.identity(db);
        let clients: Vec<ClientId> = self.lists.keys().copied().collect();
        for client in clients {
            self.rewrite(client, |_| true, Some(identity));
        }
    }

    /// The hold granted with `token` on `key` ended (released by its owner): forget its binding.
    /// O(1): its record stays in the connection's list, dead, until the list is compacted.
    pub fn unbind(&mut self, key: &LockKey, token: u64) {
        let identity = self.databases.identity(key.db);
        let Some(client) = self.remove(self.fingerprint(identity, &key.name), token) else {
            return;
        };
        let Some(list) = self.lists.get_mut(&client) else {
            return;
        };
        list.live = list.live.saturating_sub(1);
        list.live_bytes = list
            .live_bytes
            .saturating_sub(record_len(identity, key.name.len()));
        if list.live == 0 {
            self.lists.remove(&client);
            return;
        }
        // Compacting copies the live records: worth it once the dead ones outweigh them, and
        // then paid for by the bytes released since the last compaction.
        let dead_bytes = list.buffer.len().saturating_sub(list.live_bytes);
        if dead_bytes > list.live_bytes && dead_bytes >= COMPACT_FROM {
            self.rewrite(client, |_| true, None);
        }
    }

    /// The connection closed: every hold it had bound, for the caller to end.
    pub fn take_client(&mut self, client: ClientId) -> Vec<GrantRef> {
        let Some(list) = self.lists.remove(&client) else {
            return Vec::new();
        };
        let mut holds = Vec::with_capacity(list.live);
        for record in list.iter() {
            let fingerprint = self.record_fingerprint(&record);
            if self.bound_to(fingerprint, record.token) == Some(client) {
                self.remove(fingerprint, record.token);
                holds.push(self.grant_of(&record));
            }
        }
        holds
    }

    /// The holds bound to `client` (its live records), without changing anything.
    pub fn grants_of(&self, client: ClientId) -> Vec<GrantRef> {
        let Some(list) = self.lists.get(&client) else {
            return Vec::new();
        };
        list.iter()
            .filter(|record| {
                self.bound_to(self.record_fingerprint(record), record.token) == Some(client)
            })
            .map(|record| self.grant_of(&record))
            .collect()
    }

    /// The connections after `after` (in id order, from the first again past the last) whose
    /// holds add up to about `budget`, and the last of them (where the next round resumes).
    pub fn clients_after(
        &self,
        after: ClientId,
        budget: usize,
    ) -> (Vec<ClientId>, Option<ClientId>) {
        let mut clients = Vec::new();
        let mut holds = 0;
        let later = self.lists.range(after.saturating_add(1)..);
        let from_start = self.lists.range(..=after);
        for (client, list) in later.chain(from_start) {
            if holds >= budget {
                break;
            }
            holds += list.live;
            clients.push(*client);
        }
        let last = clients.last().copied();
        (clients, last)
    }

    /// Holds of `client` that may have ended by other means (DEL, lease end, FORCERELEASE):
    /// `keep` says which still exist. Called when a connection's list has grown (see
    /// [`Self::bind`]), so that a long-lived connection does not accumulate bindings of holds
    /// long gone.
    pub fn prune(&mut self, client: ClientId, keep: impl FnMut(&GrantRef) -> bool) {
        self.rewrite(client, keep, None);
        if let Some(list) = self.lists.get_mut(&client) {
            list.prune_at = (2 * list.live_bytes).max(FIRST_PRUNE_AT);
        }
    }

    /// Forgets every binding (the server became a replica: its connections bind nothing there,
    /// and a later promotion must not revive them).
    pub fn clear(&mut self) {
        self.index.clear();
        self.wide_index = HashMap::new();
        self.lists = BTreeMap::new();
    }

    /// How many holds are bound to `client`.
    pub fn holds_of(&self, client: ClientId) -> usize {
        self.lists.get(&client).map_or(0, |list| list.live)
    }

    pub fn is_empty(&self) -> bool {
        self.index.len() == 0 && self.wide_index.is_empty()
    }

    pub fn len(&self) -> usize {
        self.index.len() + self.wide_index.len()
    }

    /// Removes the binding; returns the client it bound.
    fn remove(&mut self, fingerprint: u64, token: u64) -> Option<ClientId> {
        self.index
            .remove(fingerprint, token)
            .or_else(|| self.wide_index.remove(&(fingerprint, token)))
    }

    /// Rewrites `client`'s list with its live records only, unbinding those `keep` refuses
    /// and those of the database identity `flushed`; drops the list if none is left.
    fn rewrite(
        &mut self,
        client: ClientId,
        mut keep: impl FnMut(&GrantRef) -> bool,
        flushed: Option<i32>,
    ) {
        let Some(mut list) = self.lists.remove(&client) else {
            return;
        };
        let mut kept = ClientHolds::default();
        for record in list.iter() {
            let fingerprint = self.record_fingerprint(&record);
            if self.bound_to(fingerprint, record.token) != Some(client) {
                continue;
            }
            if flushed != Some(record.db) && keep(&self.grant_of(&record)) {
                kept.push_record(&record);
            } else {
                self.remove(fingerprint, record.token);
            }
        }
        kept.buffer.shrink_to(size_class(kept.buffer.len()));
        list.buffer = kept.buffer;
        list.live = kept.live;
        list.live_bytes = kept.live_bytes;
        if list.live > 0 {
            self.lists.insert(client, list);
        }
    }
}

/// A connection's bound holds, as packed records (see [`Record`]), some of them dead: a record
/// is live while the index binds its grant to this connection.
#[derive(Debug)]
struct ClientHolds {
    buffer: Vec<u8>,
    /// Live records, and their bytes (the rest of the buffer is dead records).
    live: usize,
    live_bytes: usize,
    /// [`Bindings::bind`] asks for a prune when the buffer reaches this many bytes.
    prune_at: usize,
}

impl Default for ClientHolds {
    fn default() -> ClientHolds {
        ClientHolds {
            buffer: Vec::new(),
            live: 0,
            live_bytes: 0,
            prune_at: FIRST_PRUNE_AT,
        }
    }
}

impl ClientHolds {
    #[cfg(test)]
    fn push(&mut self, key: &LockKey, kind: HoldKind, token: u64) {
        self.push_record(&Record {
            db: key.db,
            kind,
            token,
            name: &key.name,
        });
    }

    fn push_record(&mut self, record: &Record<'_>) {
        let (head, head_len) = record_head(record);
        let head = head.get(..head_len).unwrap_or_default();
        let len = head.len() + record.name.len();
        let needed = self.buffer.len() + len;
        if self.buffer.capacity() < needed {
            // The buffer is paid for per hold: doubling would cost up to half of it again, so it
            // grows to the next size class instead (an eighth to a quarter more each time, so
            // the copies still add up to a few per byte).
            self.buffer
                .reserve_exact(size_class(needed) - self.buffer.len());
        }
        self.buffer.extend_from_slice(head);
        self.buffer.extend_from_slice(record.name);
        self.live += 1;
        self.live_bytes += len;
    }

    fn iter(&self) -> Records<'_> {
        Records { rest: &self.buffer }
    }
}

/// A record's bytes before its name: `varint(db << 2 | kind)`, `varint(name length)`, the token
/// (8 bytes, little-endian); and how many of the array's bytes that is.
fn record_head(record: &Record<'_>) -> ([u8; 2 * MAX_VARINT + 8], usize) {
    let mut bytes = [0u8; 2 * MAX_VARINT + 8];
    let mut len = put_varint(&mut bytes, db_and_kind(record.db, record.kind));
    len += put_varint(
        bytes.get_mut(len..).unwrap_or_default(),
        record.name.len() as u64,
    );
    if let Some(token) = bytes.get_mut(len..len + 8) {
        token.copy_from_slice(&record.token.to_le_bytes());
        len += 8;
    }
    (bytes, len)
}

/// A record's first varint: the database above [`KIND_BITS`] bits of the hold's kind.
const KIND_BITS: u32 = 2;
const KIND_MASK: u64 = (1 << KIND_BITS) - 1;
const _: () = assert!(
    HoldKind::ALL.len() <= 1 << KIND_BITS,
    "a new hold kind needs more bits in a binding's record"
);

fn db_and_kind(db: i32, kind: HoldKind) -> u64 {
    // The mask is redundant while the assertion above holds; it keeps a kind from ever
    // spilling into the database.
    (u64::from(db as u32) << KIND_BITS) | (kind.index() as u64 & KIND_MASK)
}

/// The bytes of a record of a name of `name_len` bytes in `db`, whatever its kind (the kind is
/// in the low two bits of a varint whose length the database decides).
fn record_len(db: i32, name_len: usize) -> usize {
    varint_len(db_and_kind(db, HoldKind::Exclusive)) + varint_len(name_len as u64) + 8 + name_len
}

/// The smallest allocation size class of jemalloc (Redis's allocator, which counts the usable
/// size in `used_memory`) that holds `bytes`: 8, then steps of 16 up to 128, then four classes
/// per doubling. Asking for exactly a class leaves no rounding slack unused.
fn size_class(bytes: usize) -> usize {
    if bytes <= 8 {
        return 8;
    }
    if bytes <= 128 {
        return bytes.div_ceil(16) * 16;
    }
    let power = usize::BITS - 1 - (bytes - 1).leading_zeros();
    let quarter = 1usize << (power - 2);
    bytes.div_ceil(quarter) * quarter
}

/// One bound hold in a connection's buffer: `varint(db << 2 | kind)`, `varint(name length)`,
/// the token (8 bytes, little-endian), the name.
#[derive(Debug)]
struct Record<'a> {
    db: i32,
    kind: HoldKind,
    token: u64,
    name: &'a [u8],
}

/// The records of a buffer, in order. The buffer is only ever written by `push_record`; a
/// malformed record (which would be a bug) ends the iteration rather than panicking.
struct Records<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Records<'a> {
    type Item = Record<'a>;

    fn next(&mut self) -> Option<Record<'a>> {
        if self.rest.is_empty() {
            return None;
        }
        let parsed = parse_record(self.rest);
        match parsed {
            Some((record, rest)) => {
                self.rest = rest;
                Some(record)
            }
            None => {
                self.rest = &[];
                None
            }
        }
    }
}

fn parse_record(bytes: &[u8]) -> Option<(Record<'_>, &[u8])> {
    let (head, bytes) = take_varint(bytes)?;
    let (name_len, bytes) = take_varint(bytes)?;
    let name_len = usize::try_from(name_len).ok()?;
    let (token, bytes) = bytes.split_first_chunk::<8>()?;
    let name = bytes.get(..name_len)?;
    let rest = bytes.get(name_len..)?;
    let record = Record {
        db: u32::try_from(head >> KIND_BITS).ok()? as i32,
        kind: HoldKind::from_index((head & KIND_MASK) as usize)?,
        token: u64::from_le_bytes(*token),
        name,
    };
    Some((record, rest))
}

/// Bytes a LEB128 varint of a u64 takes at most.
const MAX_VARINT: usize = 10;

fn varint_len(value: u64) -> usize {
    let bits = (u64::BITS - value.leading_zeros()).max(1) as usize;
    bits.div_ceil(7)
}

/// Writes `value` as a LEB128 varint at the start of `out` (which has room for [`MAX_VARINT`]
/// bytes); returns the bytes written.
fn put_varint(out: &mut [u8], mut value: u64) -> usize {
    let mut written = 0;
    for byte in out.iter_mut() {
        let low = (value & 0x7f) as u8;
        value >>= 7;
        written += 1;
        if value == 0 {
            *byte = low;
            break;
        }
        *byte = low | 0x80;
    }
    written
}

fn take_varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (i, &byte) in bytes.iter().enumerate().take(MAX_VARINT) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, bytes.get(i + 1..)?));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn key(name: &str) -> LockKey {
        LockKey::new(0, name.as_bytes())
    }

    fn grant_of(key: &LockKey, kind: HoldKind, token: u64) -> GrantRef {
        GrantRef {
            key: key.clone(),
            kind,
            token,
        }
    }

    fn bound(name: &str, kind: HoldKind, token: u64) -> GrantRef {
        grant_of(&key(name), kind, token)
    }

    #[test]
    fn a_closed_connection_gives_back_its_own_holds_only() {
        let mut b = Bindings::default();
        let odd = LockKey::new(3, b"b\0\xff");
        b.bind(7, &key("a"), HoldKind::Exclusive, 10);
        b.bind(7, &odd, HoldKind::Shared, 11);
        b.bind(8, &key("c"), HoldKind::Permit, 12);
        assert_eq!(b.client_of(&key("a"), 10), Some(7));
        assert_eq!(
            b.client_of(&LockKey::new(1, b"a"), 10),
            None,
            "the database is part of the identity"
        );
        assert_eq!(
            b.client_of(&key("{a}copy"), 10),
            None,
            "the name is part of the identity (COPY keeps the slot and the token)"
        );
        let gone = b.take_client(7);
        assert_eq!(
            gone,
            [
                bound("a", HoldKind::Exclusive, 10),
                grant_of(&odd, HoldKind::Shared, 11)
            ]
        );
        assert_eq!(b.client_of(&key("a"), 10), None);
        assert_eq!(b.client_of(&key("c"), 12), Some(8));
        assert_eq!(b.len(), 1);
        assert_eq!(b.take_client(7), []);
    }

    #[test]
    fn a_release_unbinds_its_own_grant_not_one_with_the_same_token_in_another_slot() {
        let (a, other) = (key("a"), key("b"));
        let mut b = Bindings::default();
        b.bind(7, &a, HoldKind::Exclusive, 10);
        b.bind(7, &other, HoldKind::Exclusive, 10);
        b.unbind(&other, 10);
        assert_eq!(b.client_of(&key("a"), 10), Some(7));
        assert_eq!(b.take_client(7), [grant_of(&a, HoldKind::Exclusive, 10)]);
    }

    #[test]
    fn a_release_unbinds_and_pruning_drops_holds_gone_otherwise() {
        let mut b = Bindings::default();
        for t in 0..10 {
            b.bind(7, &key("a"), HoldKind::Exclusive, t);
        }
        b.unbind(&key("a"), 3);
        assert_eq!(b.client_of(&key("a"), 3), None);
        assert_eq!(b.holds_of(7), 9);
        b.prune(7, |h| h.token % 2 == 0);
        assert_eq!(b.holds_of(7), 5);
        assert_eq!(b.client_of(&key("a"), 5), None);
        assert_eq!(b.client_of(&key("a"), 4), Some(7));
        for t in [0, 2, 4, 6, 8] {
            b.unbind(&key("a"), t);
        }
        assert!(b.is_empty());
        assert_eq!(b.holds_of(7), 0);
        assert!(
            b.lists.is_empty(),
            "the last release drops the connection's list"
        );
    }

    #[test]
    fn a_grant_stays_bound_to_the_first_connection() {
        let mut b = Bindings::default();
        assert!(!b.bind(7, &key("a"), HoldKind::Exclusive, 10));
        b.bind(8, &key("a"), HoldKind::Exclusive, 10);
        b.bind(7, &key("a"), HoldKind::Shared, 10);
        assert_eq!(b.client_of(&key("a"), 10), Some(7));
        assert_eq!((b.holds_of(7), b.holds_of(8), b.len()), (1, 0, 1));
        assert_eq!(b.lists[&7].buffer.len(), record_len(0, 1), "one record");
        assert_eq!(b.take_client(8), []);
        assert_eq!(b.take_client(7), [bound("a", HoldKind::Exclusive, 10)]);
    }

    #[test]
    fn client_ids_too_wide_to_pack_are_bound_all_the_same() {
        let mut b = Bindings::default();
        let wide = u64::MAX - 1;
        let widest_packed = (1 << 50) - 2;
        b.bind(wide, &key("a"), HoldKind::Exclusive, 10);
        b.bind(widest_packed, &key("a"), HoldKind::Exclusive, 11);
        b.bind(widest_packed + 1, &key("a"), HoldKind::Shared, 12);
        assert_eq!(b.client_of(&key("a"), 10), Some(wide));
        assert_eq!(b.client_of(&key("a"), 11), Some(widest_packed));
        assert_eq!(b.client_of(&key("a"), 12), Some(widest_packed + 1));
        assert_eq!(b.len(), 3);
        b.unbind(&key("a"), 12);
        assert_eq!(b.holds_of(widest_packed + 1), 0);
        assert_eq!(b.take_client(wide), [bound("a", HoldKind::Exclusive, 10)]);
        assert_eq!(b.client_of(&key("a"), 11), Some(widest_packed));
        assert_eq!(b.len(), 1);
    }

    #[test]
    fn records_round_trip_whatever_the_database_kind_token_and_name() {
        let mut list = ClientHolds::default();
        let long = vec![0xAB; 70_000];
        let cases = [
            (0, HoldKind::Exclusive, 0, &b""[..]),
            (15, HoldKind::Shared, u64::MAX, &b"{tag}x"[..]),
            (i32::MAX, HoldKind::Permit, 1 << 63, &long[..]),
            (-1, HoldKind::Exclusive, 127, &b"\x80\xff"[..]),
            (31, HoldKind::Permit, 1, &b"x"[..]),
            (32, HoldKind::Shared, 1, &b"x"[..]),
        ];
        let mut bytes = 0;
        for &(db, kind, token, name) in &cases {
            list.push(&LockKey::new(db, name), kind, token);
            bytes += record_len(db, name.len());
            assert_eq!(list.buffer.len(), bytes, "record_len of db {db}");
        }
        let read: Vec<(i32, HoldKind, u64, Vec<u8>)> = list
            .iter()
            .map(|r| (r.db, r.kind, r.token, r.name.to_vec()))
            .collect();
        let expected: Vec<(i32, HoldKind, u64, Vec<u8>)> = cases
            .iter()
            .map(|&(db, kind, token, name)| (db, kind, token, name.to_vec()))
            .collect();
        assert_eq!(read, expected);
        assert_eq!((list.live, list.live_bytes), (cases.len(), bytes));
        // A short name in a small database costs its bytes plus 10.
        assert_eq!(record_len(0, 7), 17);
    }

    #[test]
    fn a_truncated_buffer_ends_the_records_without_a_panic() {
        let mut list = ClientHolds::default();
        list.push(&key("abc"), HoldKind::Shared, 5);
        list.push(&key("defg"), HoldKind::Permit, 6);
        let full = list.buffer.clone();
        for cut in 0..full.len() {
            let records = Records { rest: &full[..cut] }.count();
            assert!(records <= 1, "cut at {cut}: {records}");
        }
        assert_eq!(Records { rest: &[0xff; 20] }.count(), 0);
    }

    /// Releases leave dead records behind; the list is compacted once they outweigh the live
    /// ones, so it stays within about twice its live bytes however long the connection lives.
    #[test]
    fn a_long_lived_connection_keeps_its_list_near_its_live_holds() {
        let mut b = Bindings::default();
        let mut token = 0;
        let mut live = std::collections::VecDeque::new();
        for _ in 0..100 {
            token += 1;
            b.bind(7, &key("k"), HoldKind::Exclusive, token);
            live.push_back(token);
        }
        for _ in 0..10_000 {
            token += 1;
            b.bind(7, &key("k"), HoldKind::Exclusive, token);
            live.push_back(token);
            let oldest = live.pop_front().unwrap();
            b.unbind(&key("k"), oldest);
            let list = &b.lists[&7];
            assert_eq!((list.live, list.live_bytes), (100, 100 * record_len(0, 1)));
            assert!(list.buffer.len() <= 2 * list.live_bytes + record_len(0, 1));
        }
        let mut left: Vec<u64> = b.take_client(7).iter().map(|h| h.token).collect();
        left.sort_unstable();
        assert_eq!(left, Vec::from(live));
    }

    /// A release costs O(1) however long the connection's other names are: compacting copies
    /// the live records, so it waits until as many bytes have been released.
    #[test]
    fn releases_do_not_copy_other_long_names_again_and_again() {
        let mut b = Bindings::default();
        for t in 0..63u64 {
            let mut name = vec![b'x'; 64 * 1024];
            name.extend_from_slice(&t.to_le_bytes());
            b.bind(
                7,
                &LockKey::new(0, &name),
                HoldKind::Exclusive,
                1_000_000 + t,
            );
        }
        let short = key("short");
        let mut compactions = 0;
        for t in 0..20_000u64 {
            b.bind(7, &short, HoldKind::Exclusive, t);
            let before = b.lists[&7].buffer.len();
            b.unbind(&short, t);
            if b.lists[&7].buffer.len() < before {
                compactions += 1;
            }
        }
        // 20,000 releases of 15-byte records: under a tenth of the 4 MB of live names.
        assert_eq!(compactions, 0);
        assert_eq!(b.holds_of(7), 63);
    }

    /// A thousand holds on one connection: the list's buffer costs the records' bytes and at
    /// most a quarter more.
    #[test]
    fn a_connections_list_grows_by_size_classes_not_by_doubling() {
        let mut b = Bindings::default();
        let mut capacities = vec![];
        for i in 0..1_000u64 {
            b.bind(
                7,
                &key(&format!("m:{i:05}")),
                HoldKind::Exclusive,
                1 << 50 | i,
            );
            let capacity = b.lists[&7].buffer.capacity();
            if capacities.last() != Some(&capacity) {
                capacities.push(capacity);
            }
        }
        let list = &b.lists[&7];
        assert_eq!(list.buffer.len(), 17 * 1_000);
        assert_eq!(list.buffer.capacity(), 20_480, "{capacities:?}");
        assert_eq!(capacities.first(), Some(&32), "one record of 17 bytes");
        assert!(capacities.iter().all(|&c| c == size_class(c)));
        // Each growth copies the buffer; the classes rise geometrically, so the copies add up
        // to a few times the final size, not to its square.
        let copied: usize = capacities.iter().sum();
        assert!(copied < 8 * 20_480, "{capacities:?}");
    }

    #[test]
    fn size_classes_are_jemallocs() {
        let classes: Vec<usize> = [
            1, 8, 9, 17, 33, 64, 65, 100, 128, 129, 161, 17_000, 20_480, 20_481,
        ]
        .map(size_class)
        .into();
        assert_eq!(
            classes,
            [8, 8, 16, 32, 48, 64, 80, 112, 128, 160, 192, 20_480, 20_480, 24_576]
        );
    }

    #[test]
    fn bind_asks_for_a_prune_as_the_list_grows_and_prune_resets_the_threshold() {
        let mut b = Bindings::default();
        let each = record_len(0, 1);
        let asked: Vec<u64> = (1..=400)
            .filter(|&t| b.bind(7, &key("k"), HoldKind::Exclusive, t))
            .collect();
        assert_eq!(asked.first(), Some(&(FIRST_PRUNE_AT.div_ceil(each) as u64)));
        b.prune(7, |h| h.token > 250);
        assert_eq!(b.holds_of(7), 150);
        assert_eq!(b.lists[&7].buffer.len(), 150 * each);
        let next = (401..).find(|&t| b.bind(7, &key("k"), HoldKind::Exclusive, t));
        assert_eq!(
            next,
            Some(400 + 150),
            "the next prune at twice the live bytes"
        );
    }

    const NAMES: [&str; 6] = [
        "a",
        "b",
        "c",
        "{x}1",
        "{x}2",
        "long-name-zzzzzzzzzzzzzzzzzz",
    ];
    const CLIENTS: [u64; 5] = [1, 2, 3, (1 << 50) - 1, u64::MAX];
    const TOKENS: u64 = 150;

    /// The key and kind of the grant with token `t` (several per slot, tokens shared by slots).
    fn grant(t: u64) -> (LockKey, HoldKind) {
        let name = NAMES[(t % NAMES.len() as u64) as usize];
        let kind = [HoldKind::Exclusive, HoldKind::Shared, HoldKind::Permit][(t % 3) as usize];
        (LockKey::new((t % 4) as i32 - 1, name.as_bytes()), kind)
    }

    #[derive(Debug, Clone)]
    enum Op {
        Bind(usize, u64),
        Unbind(u64),
        Close(usize),
        Prune(usize, u64),
        Clear,
        Swap(i32, i32),
        /// MOVE or RENAME of the key holding this token to (db, name).
        Move(u64, i32, usize),
        Flush(Option<i32>),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            10 => (0..CLIENTS.len(), 0..TOKENS).prop_map(|(c, t)| Op::Bind(c, t)),
            8 => (0..TOKENS).prop_map(Op::Unbind),
            1 => (0..CLIENTS.len()).prop_map(Op::Close),
            1 => (0..CLIENTS.len(), 1u64..4).prop_map(|(c, m)| Op::Prune(c, m)),
            1 => Just(Op::Clear),
            2 => (-1i32..3, -1i32..3).prop_map(|(x, y)| Op::Swap(x, y)),
            3 => (0..TOKENS, -1i32..3, 0..NAMES.len()).prop_map(|(t, db, n)| Op::Move(t, db, n)),
            1 => proptest::option::of(-1i32..3).prop_map(Op::Flush),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Bindings answer as a map from grant to client would, through binds, releases,
        /// closes, prunes and compactions; counts never drift and dead records never outweigh
        /// the live ones by more than the compaction threshold.
        #[test]
        fn bindings_behave_like_a_map_of_grants(ops in proptest::collection::vec(op(), 1..400)) {
            let mut b = Bindings::default();
            // token → (where its hold is now, its client)
            let mut model: BTreeMap<u64, (LockKey, u64)> = BTreeMap::new();
            let mut used = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Bind(c, t) => {
                        // A token is granted once (tokens never repeat within a slot).
                        if !used.insert(t) {
                            continue;
                        }
                        let (k, kind) = grant(t);
                        b.bind(CLIENTS[c], &k, kind, t);
                        model.insert(t, (k, CLIENTS[c]));
                    }
                    Op::Unbind(t) => {
                        let Some((k, _)) = model.get(&t).cloned() else {
                            // Never bound, or gone: unbinding it there changes nothing.
                            b.unbind(&grant(t).0, t);
                            continue;
                        };
                        b.unbind(&k, t);
                        model.remove(&t);
                    }
                    Op::Close(c) => {
                        let got: BTreeSet<(u64, LockKey)> = b
                            .take_client(CLIENTS[c])
                            .into_iter()
                            .map(|h| {
                                assert_eq!(h.kind, grant(h.token).1);
                                (h.token, h.key)
                            })
                            .collect();
                        let want: BTreeSet<(u64, LockKey)> = model
                            .iter()
                            .filter(|(_, (_, v))| *v == CLIENTS[c])
                            .map(|(&t, (k, _))| (t, k.clone()))
                            .collect();
                        prop_assert_eq!(got, want);
                        model.retain(|_, (_, v)| *v != CLIENTS[c]);
                    }
                    Op::Prune(c, m) => {
                        b.prune(CLIENTS[c], |h| h.token % m == 0);
                        model.retain(|&t, (_, v)| *v != CLIENTS[c] || t % m == 0);
                    }
                    Op::Clear => {
                        b.clear();
                        model.clear();
                    }
                    Op::Swap(x, y) => {
                        b.swap_databases(x, y);
                        for (k, _) in model.values_mut() {
                            if k.db == x {
                                k.db = y;
                            } else if k.db == y {
                                k.db = x;
                            }
                        }
                    }
                    Op::Move(t, db, name) => {
                        // The key holding token t goes to (db, name), with every hold on it.
                        let Some((from, _)) = model.get(&t).cloned() else {
                            continue;
                        };
                        let to = LockKey::new(db, NAMES[name].as_bytes());
                        let occupied = model.values().any(|(k, _)| *k == to);
                        if to == from || occupied {
                            continue;
                        }
                        let tokens: Vec<u64> = model
                            .iter()
                            .filter(|(_, (k, _))| *k == from)
                            .map(|(&t, _)| t)
                            .collect();
                        b.moved(&from, &to, &tokens);
                        for t in tokens {
                            if let Some((k, _)) = model.get_mut(&t) {
                                *k = to.clone();
                            }
                        }
                    }
                    Op::Flush(db) => {
                        b.flushed(db);
                        model.retain(|_, (k, _)| db.is_some_and(|db| k.db != db));
                    }
                }
                prop_assert_eq!(b.len(), model.len());
                for t in 0..TOKENS {
                    let (k, _) = grant(t);
                    let here = model.get(&t);
                    match here {
                        Some((at, c)) => {
                            prop_assert_eq!(b.client_of(at, t), Some(*c));
                            if *at != k {
                                prop_assert_eq!(b.client_of(&k, t), None, "moved away");
                            }
                        }
                        None => prop_assert_eq!(b.client_of(&k, t), None),
                    }
                }
                for &c in &CLIENTS {
                    let live: Vec<LockKey> = model
                        .values()
                        .filter(|(_, v)| *v == c)
                        .map(|(k, _)| k.clone())
                        .collect();
                    prop_assert_eq!(b.holds_of(c), live.len());
                    let Some(list) = b.lists.get(&c) else {
                        prop_assert!(live.is_empty());
                        continue;
                    };
                    let live_bytes: usize = live
                        .iter()
                        .map(|k| record_len(b.databases.identity(k.db), k.name.len()))
                        .sum();
                    prop_assert_eq!(list.live_bytes, live_bytes);
                    let dead = list.buffer.len() - list.live_bytes;
                    prop_assert!(dead <= list.live_bytes || dead < COMPACT_FROM);
                }
            }
        }
    }
}
