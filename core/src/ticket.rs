//! Tickets: a waiting acquire that does not block its client (`... WAIT timeout-ms TICKET`).
//!
//! A ticket is queued exactly as a blocked waiter is; the client is answered at once with the
//! ticket's name, a key in the module's reserved namespace that hashes to the lock key's slot
//! (`__lock_fence__ticket{<tag>}<id>`, the tag chosen as for the token counters, see
//! [`crate::slot`]). The client waits on it with a native blocking pop (`BLPOP <ticket>
//! <timeout>`), which costs the server a few hundred bytes where a module-blocked client costs
//! tens of kilobytes. The module writes the answer into the ticket as one list element (a plain
//! `LPUSH` with a `PEXPIREAT`, replicated as such), in the forms of [`TicketValue`].
//!
//! This file names tickets and encodes what is written into them; what happens to a ticket
//! (queued, answered, popped, cancelled, passed on) is the scheduler's (`scheduler::tickets`).

use crate::key::ClientId;
use crate::layout::{format_u64, parse_positive};
use crate::slot::{key_slot, slot_key};
use crate::UnixMs;

/// What the ticket's grant answers: one token (`LOCK.ACQUIRE`, `LOCK.CAMPAIGN`), or a token per
/// key (`LOCK.MACQUIRE`). Part of the name, so that `LOCK.CANCEL` replies in the waiting
/// command's own shape even for a ticket this process did not make (after a restart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Shape {
    One,
    Many,
}

const ONE_PREFIX: &[u8] = b"__lock_fence__ticket{";
const MANY_PREFIX: &[u8] = b"__lock_fence__mticket{";

/// How long a ticket keeps an answer that is not a grant (a timeout, a redirect, an error)
/// for a client that is not popping yet. A grant stays until its lease ends.
pub const MARKER_TTL_MS: u64 = 60_000;

/// A ticket, by its name: the database its key lives in (the lock's), the slot of its key (the
/// lock's), its shape and its id. Everything in the name; two names are the same ticket exactly
/// when they are equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TicketName {
    pub id: u64,
    pub db: i32,
    pub slot: u16,
    pub shape: Shape,
}

impl TicketName {
    /// The key's name: `__lock_fence__ticket{<tag>}<16 hex digits>` (`mticket` for
    /// [`Shape::Many`]), `<tag>` the slot's tag (as the token counter's).
    pub fn key(&self) -> Vec<u8> {
        let prefix = match self.shape {
            Shape::One => ONE_PREFIX,
            Shape::Many => MANY_PREFIX,
        };
        let mut name = slot_key(prefix, self.slot);
        name.reserve(16);
        for shift in (0..16).rev() {
            let digit = ((self.id >> (4 * shift)) & 0xf) as u8;
            name.push(if digit < 10 {
                b'0' + digit
            } else {
                b'a' + digit - 10
            });
        }
        name
    }

    /// The ticket a key name (in database `db`) names, if it is one as the module writes them
    /// (canonical: the slot's own tag, 16 lowercase hex digits).
    pub fn parse(name: &[u8], db: i32) -> Option<TicketName> {
        let (shape, rest) = match (
            name.strip_prefix(ONE_PREFIX),
            name.strip_prefix(MANY_PREFIX),
        ) {
            (Some(rest), _) => (Shape::One, rest),
            (_, Some(rest)) => (Shape::Many, rest),
            _ => return None,
        };
        let close = rest.iter().position(|&b| b == b'}')?;
        let hex = rest.get(close + 1..)?;
        if hex.len() != 16 {
            return None;
        }
        let mut id: u64 = 0;
        for &b in hex {
            let digit = match b {
                b'0'..=b'9' => b - b'0',
                b'a'..=b'f' => b - b'a' + 10,
                _ => return None,
            };
            id = (id << 4) | u64::from(digit);
        }
        let ticket = TicketName {
            id,
            db,
            slot: key_slot(name),
            shape,
        };
        (ticket.key() == name).then_some(ticket)
    }
}

/// Where ticket ids come from: a count, passed through a keyed pseudorandom permutation of the
/// 64-bit numbers (a four-round Feistel network whose round function is SipHash under a key
/// drawn from the OS when the module loads). A permutation, so no two tickets of one process
/// share an id; keyed, so that a client that sees one ticket cannot name another's (a client
/// that can pop a ticket takes its grant). Two processes (a restart, a failover) draw
/// different keys: their ids meet by chance only, one in 2^64.
#[derive(Debug, Default)]
pub struct TicketIds {
    count: u64,
    key: std::collections::hash_map::RandomState,
}

impl TicketIds {
    pub fn next_id(&mut self) -> u64 {
        let count = self.count;
        self.count = self.count.wrapping_add(1);
        self.permute(count)
    }

    fn permute(&self, x: u64) -> u64 {
        use std::hash::BuildHasher;
        let (mut left, mut right) = ((x >> 32) as u32, x as u32);
        for round in 0u8..4 {
            let f = self.key.hash_one((round, right)) as u32;
            (left, right) = (right, left ^ f);
        }
        (u64::from(left) << 32) | u64::from(right)
    }
}

/// A queued or answered ticket: its name and the connection that asked for it (a ticket
/// belongs to that connection: when it closes, its tickets go). Equal and hashed by name.
#[derive(Debug, Clone, Copy)]
pub struct Ticket {
    pub name: TicketName,
    pub client: ClientId,
}

impl PartialEq for Ticket {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Ticket {}

impl std::hash::Hash for Ticket {
    fn hash<S: std::hash::Hasher>(&self, state: &mut S) {
        self.name.hash(state);
    }
}

/// What a ticket's one list element says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TicketValue {
    /// The waiter holds the lock: its token (`LOCK.ACQUIRE`), its epoch (`LOCK.CAMPAIGN`), or
    /// its tokens in the order of its keys (`LOCK.MACQUIRE`). Written as decimal digits,
    /// tokens separated by one space: `1795352340123001`.
    Granted(Vec<u64>),
    /// The `WAIT` timeout passed: the waiter left the queue without the lock. Written `timeout`.
    TimedOut,
    /// A grant nobody popped before its lease ended: the hold is gone, nothing is held. Written
    /// `expired` in place of the grant, so that a client still waiting on the ticket (it stalled
    /// for a whole lease, or the server did) is answered rather than left blocked.
    Lapsed,
    /// An error reply the blocking form would have sent (a redirect `ASK`/`MOVED` when the key
    /// left with its slot, or why the lock cannot be granted), written with a leading `-` as on
    /// the wire: `-MOVED 3999 127.0.0.1:7001`.
    Refused(String),
}

const TIMED_OUT: &[u8] = b"timeout";
const LAPSED: &[u8] = b"expired";

impl TicketValue {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            TicketValue::Granted(tokens) => {
                let mut out = Vec::with_capacity(17 * tokens.len());
                for (i, &token) in tokens.iter().enumerate() {
                    if i > 0 {
                        out.push(b' ');
                    }
                    let mut digits = [0u8; 20];
                    out.extend_from_slice(format_u64(token, &mut digits));
                }
                out
            }
            TicketValue::TimedOut => TIMED_OUT.to_vec(),
            TicketValue::Lapsed => LAPSED.to_vec(),
            TicketValue::Refused(reply) => {
                let mut out = Vec::with_capacity(1 + reply.len());
                out.push(b'-');
                out.extend_from_slice(reply.as_bytes());
                out
            }
        }
    }

    /// Reads an element back (a ticket cancelled before it was popped); None for anything the
    /// module does not write.
    pub fn decode(bytes: &[u8]) -> Option<TicketValue> {
        if bytes == TIMED_OUT {
            return Some(TicketValue::TimedOut);
        }
        if bytes == LAPSED {
            return Some(TicketValue::Lapsed);
        }
        if let Some(reply) = bytes.strip_prefix(b"-") {
            return std::str::from_utf8(reply)
                .ok()
                .map(|r| TicketValue::Refused(r.to_string()));
        }
        let tokens: Option<Vec<u64>> = bytes.split(|&b| b == b' ').map(parse_positive).collect();
        tokens.filter(|t| !t.is_empty()).map(TicketValue::Granted)
    }

    /// When a ticket holding this answer expires: a grant with its lease (a grant nobody pops
    /// ends with it, as any hold, and the module writes [`TicketValue::Lapsed`] in its place),
    /// anything else [`MARKER_TTL_MS`] after it is written.
    pub fn expires_at(&self, lease_end: UnixMs, now: UnixMs) -> UnixMs {
        match self {
            TicketValue::Granted(_) => lease_end,
            _ => now.saturating_add(MARKER_TTL_MS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_hash_to_the_lock_keys_slot_and_parse_back() {
        for (lock, shape) in [
            (&b"orders:42"[..], Shape::One),
            (b"{user1000}.following", Shape::Many),
            (b"", Shape::One),
        ] {
            for id in [0, 1, 0xdead_beef, u64::MAX] {
                let slot = key_slot(lock);
                let name = TicketName {
                    id,
                    db: 3,
                    slot,
                    shape,
                };
                let key = name.key();
                assert_eq!(key_slot(&key), slot, "{}", String::from_utf8_lossy(&key));
                assert!(crate::layout::is_reserved_key(&key));
                assert_eq!(TicketName::parse(&key, 3), Some(name));
            }
        }
        let name = TicketName {
            id: 0x0123_4567_89ab_cdef,
            db: 0,
            slot: key_slot(b"foo"),
            shape: Shape::One,
        };
        let key = String::from_utf8(name.key()).unwrap();
        assert!(key.starts_with("__lock_fence__ticket{"), "{key}");
        assert!(key.ends_with("}0123456789abcdef"), "{key}");
    }

    #[test]
    fn ticket_ids_never_repeat_and_do_not_follow_each_other() {
        let mut ids = TicketIds::default();
        let drawn: Vec<u64> = (0..100_000).map(|_| ids.next_id()).collect();
        let distinct: std::collections::HashSet<u64> = drawn.iter().copied().collect();
        assert_eq!(distinct.len(), drawn.len());
        let consecutive = drawn
            .windows(2)
            .filter(|w| w[1] == w[0].wrapping_add(1))
            .count();
        assert!(consecutive < 3, "{consecutive} ids follow the one before");
        let mut other = TicketIds::default();
        assert_ne!(
            other.next_id(),
            drawn[0],
            "another process draws another key"
        );
    }

    #[test]
    fn only_canonical_names_are_tickets() {
        let good = TicketName {
            id: 7,
            db: 0,
            slot: 12182,
            shape: Shape::One,
        }
        .key();
        let text = String::from_utf8(good.clone()).unwrap();
        let bad = [
            text.replace("0000000000000007", "7"),
            text.replace("0000000000000007", "000000000000000G"),
            text.replace("0000000000000007", "000000000000000A"),
            text.replace("ticket{", "ticket{x"),
            text.replace("__lock_fence__", "__lock_fenc__"),
            "__lock_fence__{abc}".to_string(),
            "orders:42".to_string(),
            format!("{text}0"),
        ];
        for name in bad {
            assert_eq!(TicketName::parse(name.as_bytes(), 0), None, "{name}");
        }
        assert!(TicketName::parse(&good, 0).is_some());
    }

    #[test]
    fn values_round_trip_and_are_told_apart_by_their_first_byte() {
        let cases = [
            (
                TicketValue::Granted(vec![1795352340123001]),
                "1795352340123001",
            ),
            (TicketValue::Granted(vec![5, 6, 7]), "5 6 7"),
            (TicketValue::TimedOut, "timeout"),
            (TicketValue::Lapsed, "expired"),
            (
                TicketValue::Refused("MOVED 3999 127.0.0.1:7001".into()),
                "-MOVED 3999 127.0.0.1:7001",
            ),
        ];
        for (value, text) in cases {
            assert_eq!(value.encode(), text.as_bytes());
            assert_eq!(TicketValue::decode(text.as_bytes()), Some(value));
        }
        for junk in ["", "0", "1  2", "x", "12a", " 1"] {
            assert_eq!(TicketValue::decode(junk.as_bytes()), None, "{junk:?}");
        }
    }
}
