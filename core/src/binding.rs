//! Holds bound to the connection that took them (`EPHEMERAL`): they end when it closes.
//!
//! A grant is identified by its key's slot and its token (tokens never repeat within a slot,
//! across databases and flushes; see `token`), so the index from a hold to its connection is
//! two integers. Each connection keeps the list of its holds, so that closing it costs in
//! proportion to its own holds only.
//!
//! The binding is paid for per hold (issue #12 budgets 64 B), so both halves are packed:
//! - the index entry is 16 bytes (the token, and the slot above the client id) in a table of
//!   its own that wastes less than a standard map (see `index`);
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

use std::collections::HashMap;

use crate::hold::HoldKind;
use crate::queue::LockKey;
use crate::slot::key_slot;

mod index;

use index::{Entry, GrantIndex};

/// The server's id of a client connection.
pub type ClientId = u64;

/// One grant, named well enough to end it later: an ephemeral hold whose connection closed, or
/// an undelivered grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantRef {
    pub key: LockKey,
    pub kind: HoldKind,
    /// Tokens never repeat on a key: the token names the grant.
    pub token: u64,
}

/// A connection's list is first checked for holds gone by other means (DEL, a lease end) at
/// this many bytes (about a hundred records of short names), then each time it doubles.
const FIRST_PRUNE_AT: usize = 2_048;

/// Dead records below this many bytes are not worth a compaction.
const COMPACT_FROM: usize = 1_024;

#[derive(Debug, Default)]
pub struct Bindings {
    /// (slot, token) → client, for every client id that fits the packed entry.
    index: GrantIndex,
    /// The same for client ids of 2^50 - 1 and above, which Redis never reaches in practice (its
    /// ids count connections from 1) but which must not be bound to the wrong connection either.
    wide_index: HashMap<(u16, u64), ClientId>,
    /// Boxed: most connections hold one or two holds, and a map's slack costs per entry (a
    /// 16-byte entry instead of 56 saves about 40 bytes per connection).
    lists: HashMap<ClientId, Box<ClientHolds>>,
}

impl Bindings {
    /// Binds the hold granted with `token` on `key` to `client`. Returns true when the
    /// connection's list has grown enough to be pruned: the caller then calls [`Self::prune`]
    /// (if it can tell which holds still exist; otherwise a later bind asks again).
    ///
    /// A grant already bound stays with the connection it is bound to (a grant is bound once,
    /// when it is made, so this does not happen; the rule keeps each grant to one record).
    pub fn bind(&mut self, client: ClientId, key: &LockKey, kind: HoldKind, token: u64) -> bool {
        let slot = key_slot(&key.name);
        if self.client_of(slot, token).is_some() {
            return false;
        }
        match Entry::pack(slot, token, client) {
            Some(entry) => {
                self.index.insert(entry);
            }
            None => {
                self.wide_index.insert((slot, token), client);
            }
        }
        let list = self.lists.entry(client).or_default();
        list.push(key, kind, token);
        list.buffer.len() >= list.prune_at
    }

    /// The connection the grant is bound to, if any.
    pub fn client_of(&self, slot: u16, token: u64) -> Option<ClientId> {
        self.index
            .get(slot, token)
            .or_else(|| self.wide_index.get(&(slot, token)).copied())
    }

    /// The hold granted with `token` on `key` ended (released by its owner): forget its binding.
    /// O(1): its record stays in the connection's list, dead, until the list is compacted.
    pub fn unbind(&mut self, key: &LockKey, token: u64) {
        let Some(client) = self.remove(key_slot(&key.name), token) else {
            return;
        };
        let Some(list) = self.lists.get_mut(&client) else {
            return;
        };
        list.live = list.live.saturating_sub(1);
        list.live_bytes = list
            .live_bytes
            .saturating_sub(record_len(key.db, key.name.len()));
        if list.live == 0 {
            self.lists.remove(&client);
            return;
        }
        // Compacting copies the live records: worth it once the dead ones outweigh them, and
        // then paid for by the bytes released since the last compaction.
        let dead_bytes = list.buffer.len().saturating_sub(list.live_bytes);
        if dead_bytes > list.live_bytes && dead_bytes >= COMPACT_FROM {
            self.rewrite(client, |_| true);
        }
    }

    /// The connection closed: every hold it had bound, for the caller to end.
    pub fn take_client(&mut self, client: ClientId) -> Vec<GrantRef> {
        let Some(list) = self.lists.remove(&client) else {
            return Vec::new();
        };
        let mut holds = Vec::with_capacity(list.live);
        for record in list.iter() {
            let slot = key_slot(record.name);
            if self.client_of(slot, record.token) == Some(client) {
                self.remove(slot, record.token);
                holds.push(record.to_grant());
            }
        }
        holds
    }

    /// Holds of `client` that may have ended by other means (DEL, lease end, FORCERELEASE):
    /// `keep` says which still exist. Called when a connection's list has grown (see
    /// [`Self::bind`]), so that a long-lived connection does not accumulate bindings of holds
    /// long gone.
    pub fn prune(&mut self, client: ClientId, keep: impl FnMut(&GrantRef) -> bool) {
        self.rewrite(client, keep);
        if let Some(list) = self.lists.get_mut(&client) {
            list.prune_at = (2 * list.live_bytes).max(FIRST_PRUNE_AT);
        }
    }

    /// Forgets every binding (the server became a replica: its connections bind nothing there,
    /// and a later promotion must not revive them).
    pub fn clear(&mut self) {
        self.index.clear();
        self.wide_index = HashMap::new();
        self.lists = HashMap::new();
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
    fn remove(&mut self, slot: u16, token: u64) -> Option<ClientId> {
        self.index
            .remove(slot, token)
            .or_else(|| self.wide_index.remove(&(slot, token)))
    }

    /// Rewrites `client`'s list with its live records only, unbinding those `keep` refuses;
    /// drops the list if none is left.
    fn rewrite(&mut self, client: ClientId, mut keep: impl FnMut(&GrantRef) -> bool) {
        let Some(mut list) = self.lists.remove(&client) else {
            return;
        };
        let mut kept = ClientHolds::default();
        for record in list.iter() {
            let slot = key_slot(record.name);
            if self.client_of(slot, record.token) != Some(client) {
                continue;
            }
            if keep(&record.to_grant()) {
                kept.push_record(&record);
            } else {
                self.remove(slot, record.token);
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

fn db_and_kind(db: i32, kind: HoldKind) -> u64 {
    (u64::from(db as u32) << 2) | kind_code(kind)
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

impl Record<'_> {
    fn to_grant(&self) -> GrantRef {
        GrantRef {
            key: LockKey::new(self.db, self.name),
            kind: self.kind,
            token: self.token,
        }
    }
}

fn kind_code(kind: HoldKind) -> u64 {
    match kind {
        HoldKind::Exclusive => 0,
        HoldKind::Shared => 1,
        HoldKind::Permit => 2,
    }
}

fn kind_of(code: u64) -> Option<HoldKind> {
    match code {
        0 => Some(HoldKind::Exclusive),
        1 => Some(HoldKind::Shared),
        2 => Some(HoldKind::Permit),
        _ => None,
    }
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
        db: u32::try_from(head >> 2).ok()? as i32,
        kind: kind_of(head & 3)?,
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

    fn slot(name: &str) -> u16 {
        key_slot(name.as_bytes())
    }

    #[test]
    fn a_closed_connection_gives_back_its_own_holds_only() {
        let mut b = Bindings::default();
        let odd = LockKey::new(3, b"b\0\xff");
        b.bind(7, &key("a"), HoldKind::Exclusive, 10);
        b.bind(7, &odd, HoldKind::Shared, 11);
        b.bind(8, &key("c"), HoldKind::Permit, 12);
        assert_eq!(b.client_of(slot("a"), 10), Some(7));
        assert_eq!(
            b.client_of(slot("a") ^ 1, 10),
            None,
            "the slot is part of the identity"
        );
        let gone = b.take_client(7);
        assert_eq!(
            gone,
            [
                bound("a", HoldKind::Exclusive, 10),
                grant_of(&odd, HoldKind::Shared, 11)
            ]
        );
        assert_eq!(b.client_of(slot("a"), 10), None);
        assert_eq!(b.client_of(slot("c"), 12), Some(8));
        assert_eq!(b.len(), 1);
        assert_eq!(b.take_client(7), []);
    }

    #[test]
    fn a_release_unbinds_its_own_grant_not_one_with_the_same_token_in_another_slot() {
        let (a, other) = (key("a"), key("b"));
        assert_ne!(slot("a"), slot("b"));
        let mut b = Bindings::default();
        b.bind(7, &a, HoldKind::Exclusive, 10);
        b.bind(7, &other, HoldKind::Exclusive, 10);
        b.unbind(&other, 10);
        assert_eq!(b.client_of(slot("a"), 10), Some(7));
        assert_eq!(b.take_client(7), [grant_of(&a, HoldKind::Exclusive, 10)]);
    }

    #[test]
    fn a_release_unbinds_and_pruning_drops_holds_gone_otherwise() {
        let mut b = Bindings::default();
        for t in 0..10 {
            b.bind(7, &key("a"), HoldKind::Exclusive, t);
        }
        b.unbind(&key("a"), 3);
        assert_eq!(b.client_of(slot("a"), 3), None);
        assert_eq!(b.holds_of(7), 9);
        b.prune(7, |h| h.token % 2 == 0);
        assert_eq!(b.holds_of(7), 5);
        assert_eq!(b.client_of(slot("a"), 5), None);
        assert_eq!(b.client_of(slot("a"), 4), Some(7));
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
        assert_eq!(b.client_of(slot("a"), 10), Some(7));
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
        assert_eq!(b.client_of(slot("a"), 10), Some(wide));
        assert_eq!(b.client_of(slot("a"), 11), Some(widest_packed));
        assert_eq!(b.client_of(slot("a"), 12), Some(widest_packed + 1));
        assert_eq!(b.len(), 3);
        b.unbind(&key("a"), 12);
        assert_eq!(b.holds_of(widest_packed + 1), 0);
        assert_eq!(b.take_client(wide), [bound("a", HoldKind::Exclusive, 10)]);
        assert_eq!(b.client_of(slot("a"), 11), Some(widest_packed));
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
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            10 => (0..CLIENTS.len(), 0..TOKENS).prop_map(|(c, t)| Op::Bind(c, t)),
            8 => (0..TOKENS).prop_map(Op::Unbind),
            1 => (0..CLIENTS.len()).prop_map(Op::Close),
            1 => (0..CLIENTS.len(), 1u64..4).prop_map(|(c, m)| Op::Prune(c, m)),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Bindings answer as a map from grant to client would, through binds, releases,
        /// closes, prunes and compactions; counts never drift and dead records never outweigh
        /// the live ones by more than the compaction threshold.
        #[test]
        fn bindings_behave_like_a_map_of_grants(ops in proptest::collection::vec(op(), 1..400)) {
            let slots: Vec<u16> = (0..TOKENS).map(|t| key_slot(&grant(t).0.name)).collect();
            let mut b = Bindings::default();
            let mut model: BTreeMap<(u16, u64), u64> = BTreeMap::new();
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
                        model.insert((key_slot(&k.name), t), CLIENTS[c]);
                    }
                    Op::Unbind(t) => {
                        let (k, _) = grant(t);
                        b.unbind(&k, t);
                        model.remove(&(key_slot(&k.name), t));
                    }
                    Op::Close(c) => {
                        let got: BTreeSet<u64> = b
                            .take_client(CLIENTS[c])
                            .into_iter()
                            .map(|h| {
                                let (k, kind) = grant(h.token);
                                assert_eq!((&h.key, h.kind), (&k, kind));
                                h.token
                            })
                            .collect();
                        let want: BTreeSet<u64> = model
                            .iter()
                            .filter(|(_, &v)| v == CLIENTS[c])
                            .map(|(&(_, t), _)| t)
                            .collect();
                        prop_assert_eq!(got, want);
                        model.retain(|_, v| *v != CLIENTS[c]);
                    }
                    Op::Prune(c, m) => {
                        b.prune(CLIENTS[c], |h| h.token % m == 0);
                        model.retain(|&(_, t), v| *v != CLIENTS[c] || t % m == 0);
                    }
                    Op::Clear => {
                        b.clear();
                        model.clear();
                    }
                }
                prop_assert_eq!(b.len(), model.len());
                for (t, &s) in slots.iter().enumerate() {
                    let t = t as u64;
                    prop_assert_eq!(b.client_of(s, t), model.get(&(s, t)).copied());
                }
                for &c in &CLIENTS {
                    let live: Vec<u64> = model
                        .iter()
                        .filter(|(_, &v)| v == c)
                        .map(|(&(_, t), _)| t)
                        .collect();
                    prop_assert_eq!(b.holds_of(c), live.len());
                    let Some(list) = b.lists.get(&c) else {
                        prop_assert!(live.is_empty());
                        continue;
                    };
                    let live_bytes: usize = live
                        .iter()
                        .map(|&t| {
                            let (k, _) = grant(t);
                            record_len(k.db, k.name.len())
                        })
                        .sum();
                    prop_assert_eq!(list.live_bytes, live_bytes);
                    let dead = list.buffer.len() - list.live_bytes;
                    prop_assert!(dead <= list.live_bytes || dead < COMPACT_FROM);
                }
            }
        }
    }
}
