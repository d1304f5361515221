//! The server's pub/sub messages, parsed: the lost-hold signal (`<prefix>:{<key>}` and
//! `<prefix>:flush`) and the leader channel (`<prefix>:{<key>}`). Pure: no I/O.
//!
//! Keys `a` and `{a}`, and one key name in two databases, share a channel: every message names
//! its database and key (`<keylen> <key>`, binary-safe), and a listener acts only on the
//! messages about its own.

use crate::lost::LostReason;

/// One message of the server's lost-hold signal.
///
/// | message | form |
/// | --- | --- |
/// | one hold ended | `<reason> <db> <token> <keylen> <key> <owner>` |
/// | the whole key removed or replaced | `<reason> <db> * <keylen> <key>` |
/// | the key left this node with its slot (cluster) | `moved <db> * <keylen> <key>` |
/// | a flush (on `<prefix>:flush`) | `flushed <db>`, `flushed all` |
///
/// `<key>` is exactly `<keylen>` bytes (spaces allowed); `<owner>` is the rest of the message.
///
/// ```
/// use redis_lock_client::{LostReason, LostSignal};
///
/// assert_eq!(
///     LostSignal::parse(b"forcereleased 0 17 9 orders:42 worker 1"),
///     Some(LostSignal::Hold {
///         reason: LostReason::ForceReleased,
///         db: 0,
///         token: 17,
///         key: b"orders:42".to_vec(),
///         owner: b"worker 1".to_vec(),
///     })
/// );
/// assert_eq!(
///     LostSignal::parse(b"moved 0 * 5 {a}:b"),
///     Some(LostSignal::Moved { db: 0, key: b"{a}:b".to_vec() })
/// );
/// // The form without database and key (an older module) is not read.
/// assert_eq!(LostSignal::parse(b"forcereleased 17 worker 1"), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostSignal {
    /// Exactly this hold ended: (`db`, `key`, `owner`, `token`).
    Hold {
        /// Why it ended.
        reason: LostReason,
        /// The database of the key.
        db: i64,
        /// The hold's fencing token on `key` (0 for a hold Redisson's own script took).
        token: u64,
        /// The key.
        key: Vec<u8>,
        /// The owner, binary-safe.
        owner: Vec<u8>,
    },
    /// The key was removed or replaced from outside: every hold it had when the message was
    /// published is gone (a hold granted later is not). A library checks its holds on the key
    /// with one read before reporting any lost.
    Key {
        /// `Deleted`, `Expired`, `Overwritten` or `Evicted`.
        reason: LostReason,
        /// The database of the key.
        db: i64,
        /// The key.
        key: Vec<u8>,
    },
    /// Cluster only: the key left this node with its slot (a reshard's `MIGRATE`). Not a loss:
    /// the hold normally lives on, on the slot's new node.
    Moved {
        /// The database of the key (0 in a cluster).
        db: i64,
        /// The key.
        key: Vec<u8>,
    },
    /// `FLUSHDB` (`db` is `Some`) or `FLUSHALL` (`None`): every hold in that database (or all)
    /// is checked with one read each.
    Flushed {
        /// The database flushed, or `None` for all of them.
        db: Option<i64>,
    },
}

impl LostSignal {
    /// Parses a message payload; `None` for anything not in one of the forms above (an unknown
    /// reason word included, so that a newer server's messages are ignored rather than misread).
    pub fn parse(payload: &[u8]) -> Option<LostSignal> {
        if let Some(db) = payload.strip_prefix(b"flushed ") {
            return Some(LostSignal::Flushed {
                db: match db {
                    b"all" => None,
                    n => Some(number(n)?),
                },
            });
        }
        let (word, rest) = split_word(payload)?;
        let (db, rest) = split_word(rest)?;
        let db = number(db)?;
        let (token, rest) = split_word(rest)?;
        let (key, owner) = keyed(rest)?;
        let word = std::str::from_utf8(word).ok()?;
        match (token, owner) {
            (b"*", None) if word == "moved" => Some(LostSignal::Moved { db, key }),
            (b"*", None) => {
                let reason = LostReason::from_signal_word(word)?;
                matches!(
                    reason,
                    LostReason::Deleted
                        | LostReason::Expired
                        | LostReason::Overwritten
                        | LostReason::Evicted
                )
                .then_some(LostSignal::Key { reason, db, key })
            }
            (token, Some(owner)) if !owner.is_empty() => Some(LostSignal::Hold {
                reason: LostReason::from_signal_word(word)?,
                db,
                token: number(token)?,
                key,
                owner,
            }),
            _ => None,
        }
    }

    /// Whether the message concerns `key` in database `db` (a flush: every key of its
    /// database).
    pub(crate) fn concerns(&self, db: i64, key: &[u8]) -> bool {
        match self {
            LostSignal::Hold { db: d, key: k, .. }
            | LostSignal::Key { db: d, key: k, .. }
            | LostSignal::Moved { db: d, key: k } => *d == db && k == key,
            LostSignal::Flushed { db: d } => d.is_none_or(|d| d == db),
        }
    }
}

/// One message of the leader channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeaderMessage {
    /// `elected <db> <epoch> <keylen> <key> <candidate>`.
    Elected {
        db: i64,
        epoch: u64,
        key: Vec<u8>,
        candidate: Vec<u8>,
    },
    /// `proclaimed <db> <epoch> <keylen> <key> <value>` (the value may be empty, the space
    /// before it is always there).
    Proclaimed {
        db: i64,
        epoch: u64,
        key: Vec<u8>,
        value: Vec<u8>,
    },
}

impl LeaderMessage {
    pub(crate) fn parse(payload: &[u8]) -> Option<LeaderMessage> {
        let (word, rest) = split_word(payload)?;
        let (db, rest) = split_word(rest)?;
        let (epoch, rest) = split_word(rest)?;
        let (db, epoch) = (number(db)?, number(epoch).filter(|e| *e != 0)?);
        // The server always writes the space before the candidate or the value.
        let (key, tail) = keyed(rest)?;
        let tail = tail?;
        match word {
            b"elected" if !tail.is_empty() => Some(LeaderMessage::Elected {
                db,
                epoch,
                key,
                candidate: tail,
            }),
            b"proclaimed" => Some(LeaderMessage::Proclaimed {
                db,
                epoch,
                key,
                value: tail,
            }),
            _ => None,
        }
    }

    /// Whether the message is about `key` in database `db`.
    pub(crate) fn is_about(&self, db: i64, key: &[u8]) -> bool {
        match self {
            LeaderMessage::Elected { db: d, key: k, .. }
            | LeaderMessage::Proclaimed { db: d, key: k, .. } => *d == db && k == key,
        }
    }
}

/// The first word and the rest after its one space.
fn split_word(s: &[u8]) -> Option<(&[u8], &[u8])> {
    let at = s.iter().position(|b| *b == b' ')?;
    Some((s.get(..at)?, s.get(at + 1..)?))
}

/// `<keylen> <key>` and what follows it: nothing (`None`), or one space and a tail.
fn keyed(s: &[u8]) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
    let (len, rest) = split_word(s)?;
    let len: usize = number(len)?;
    let key = rest.get(..len)?;
    match rest.get(len..)? {
        [] => Some((key.to_vec(), None)),
        [b' ', tail @ ..] => Some((key.to_vec(), Some(tail.to_vec()))),
        _ => None,
    }
}

/// A decimal number with no sign and no leading zeros (but `0` itself).
fn number<T: std::str::FromStr>(s: &[u8]) -> Option<T> {
    let digits = !s.is_empty() && s.iter().all(u8::is_ascii_digit);
    let canonical = s.len() == 1 || s.first() != Some(&b'0');
    if !(digits && canonical) {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vectors::{column, rows, unescape, LEADER_MESSAGES, LOST_MESSAGES};

    fn expected_lost(row: &[&str]) -> Option<LostSignal> {
        let text = |at| unescape(column(row, at));
        let reason = || LostReason::from_signal_word(column(row, 2)).expect("a signal word");
        let db = || column(row, 3).parse().expect("db");
        match column(row, 1) {
            "hold" => Some(LostSignal::Hold {
                reason: reason(),
                db: db(),
                token: column(row, 4).parse().expect("token"),
                key: text(5),
                owner: text(6),
            }),
            "key" => Some(LostSignal::Key {
                reason: reason(),
                db: db(),
                key: text(5),
            }),
            "moved" => Some(LostSignal::Moved {
                db: db(),
                key: text(5),
            }),
            "flushed" => Some(LostSignal::Flushed {
                db: (column(row, 3) != "all").then(db),
            }),
            kind => {
                assert_eq!(kind, "none", "{row:?}");
                None
            }
        }
    }

    #[test]
    fn lost_messages_read_as_the_shared_vectors_say() {
        let rows = rows(LOST_MESSAGES);
        assert!(rows.len() > 30);
        for row in rows {
            let payload = unescape(column(&row, 0));
            assert_eq!(LostSignal::parse(&payload), expected_lost(&row), "{row:?}");
        }
    }

    #[test]
    fn leader_messages_read_as_the_shared_vectors_say() {
        let rows = rows(LEADER_MESSAGES);
        assert!(rows.len() > 10);
        for row in rows {
            let (db, epoch, key, data) = (
                || column(&row, 2).parse().expect("db"),
                || column(&row, 3).parse().expect("epoch"),
                || unescape(column(&row, 4)),
                || unescape(column(&row, 5)),
            );
            let want = match column(&row, 1) {
                "elected" => Some(LeaderMessage::Elected {
                    db: db(),
                    epoch: epoch(),
                    key: key(),
                    candidate: data(),
                }),
                "proclaimed" => Some(LeaderMessage::Proclaimed {
                    db: db(),
                    epoch: epoch(),
                    key: key(),
                    value: data(),
                }),
                kind => {
                    assert_eq!(kind, "none", "{row:?}");
                    None
                }
            };
            let payload = unescape(column(&row, 0));
            assert_eq!(LeaderMessage::parse(&payload), want, "{row:?}");
        }
    }

    #[test]
    fn a_message_concerns_only_its_own_database_and_key() {
        let m = LostSignal::parse(b"deleted 1 * 1 k").unwrap();
        assert!(m.concerns(1, b"k"));
        assert!(!m.concerns(0, b"k"), "another database");
        assert!(!m.concerns(1, b"{k}"), "k and {{k}} share a channel");
        let all = LostSignal::Flushed { db: None };
        assert!(all.concerns(4, b"x"));
        assert!(!LostSignal::Flushed { db: Some(0) }.concerns(4, b"x"));
        let m = LeaderMessage::parse(b"elected 0 7 3 svc c").unwrap();
        assert!(m.is_about(0, b"svc"));
        assert!(!m.is_about(1, b"svc"));
        assert!(!m.is_about(0, b"{svc}"));
    }
}
