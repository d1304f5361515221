//! What the module says on its channels, byte for byte: the lost-hold messages and the leader
//! messages. Channels are named after the key's hash tag (Redisson's naming), so keys `a` and
//! `{a}` share one, and every database shares them: each message names its database and its key
//! exactly, and a listener acts only on messages about its own (database, key).
//!
//! Every message is `<kind> <db> <token|*> <keylen> <key> [<rest>]`: the key is exactly
//! `<keylen>` bytes (it may contain spaces), and the rest (an owner, a candidate, a value) runs
//! to the end of the message, spaces and all.

use crate::hold::{Lost, LostReason};
use crate::layout::format_u64;

/// Why a whole key went from outside the module (the key server event of Redis >= 7.2 and
/// Valkey), as one message for every hold it had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyGone {
    /// `DEL`, `UNLINK`, `RENAME`/`MOVE` taking it away.
    Deleted,
    Expired,
    Evicted,
    /// Another value put in its place.
    Overwritten,
    /// It left this node with its slot (`MIGRATE` during a cluster reshard): not a loss. The
    /// holds are normally alive on the node that serves the slot now.
    Moved,
}

impl KeyGone {
    pub fn name(self) -> &'static str {
        match self {
            KeyGone::Deleted => "deleted",
            KeyGone::Expired => "expired",
            KeyGone::Evicted => "evicted",
            KeyGone::Overwritten => "overwritten",
            KeyGone::Moved => "moved",
        }
    }

    /// The reason each of its holds was lost (None: `Moved`, no loss).
    pub fn lost_reason(self) -> Option<LostReason> {
        match self {
            KeyGone::Deleted => Some(LostReason::Deleted),
            KeyGone::Expired => Some(LostReason::Expired),
            KeyGone::Evicted => Some(LostReason::Evicted),
            KeyGone::Overwritten => Some(LostReason::Overwritten),
            KeyGone::Moved => None,
        }
    }
}

/// `<reason> <db> <token> <keylen> <key> <owner>`: exactly this hold ended (token `0` for a hold
/// Redisson's own script took, which has none).
pub fn lost_hold(db: i32, key: &[u8], lost: &Lost) -> Vec<u8> {
    let mut digits = [0u8; 20];
    let token = format_u64(lost.token.unwrap_or(0), &mut digits);
    message(
        lost.reason.name().as_bytes(),
        db,
        token,
        key,
        Some(&lost.owner),
    )
}

/// `<reason> <db> * <keylen> <key>`: every hold the key had when it went. A listener checks
/// its holds on that key with a read (a hold granted after this message is not concerned, and
/// pub/sub is not ordered with the command connection).
pub fn key_gone(db: i32, key: &[u8], why: KeyGone) -> Vec<u8> {
    message(why.name().as_bytes(), db, b"*", key, None)
}

/// `elected <db> <epoch> <keylen> <key> <candidate>`: a candidate became the leader.
pub fn elected(db: i32, key: &[u8], epoch: u64, candidate: &[u8]) -> Vec<u8> {
    let mut digits = [0u8; 20];
    let epoch = format_u64(epoch, &mut digits);
    message(b"elected", db, epoch, key, Some(candidate))
}

/// `proclaimed <db> <epoch> <keylen> <key> <value>`: the leader of `epoch` proclaimed a value.
pub fn proclaimed(db: i32, key: &[u8], epoch: u64, value: &[u8]) -> Vec<u8> {
    let mut digits = [0u8; 20];
    let epoch = format_u64(epoch, &mut digits);
    message(b"proclaimed", db, epoch, key, Some(value))
}

fn message(kind: &[u8], db: i32, token: &[u8], key: &[u8], rest: Option<&[u8]>) -> Vec<u8> {
    let db = db.to_string();
    let keylen = key.len().to_string();
    let rest_len = rest.map_or(0, |r| r.len() + 1);
    let mut out = Vec::with_capacity(
        kind.len() + db.len() + token.len() + keylen.len() + key.len() + 4 + rest_len,
    );
    for part in [kind, db.as_bytes(), token, keylen.as_bytes()] {
        out.extend_from_slice(part);
        out.push(b' ');
    }
    out.extend_from_slice(key);
    if let Some(rest) = rest {
        out.push(b' ');
        out.extend_from_slice(rest);
    }
    out
}

/// A message read back (what a listener parses; the tests use it to check the encoding).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed<'a> {
    pub kind: &'a [u8],
    pub db: i32,
    /// None: `*` (the whole key).
    pub token: Option<u64>,
    pub key: &'a [u8],
    pub rest: Option<&'a [u8]>,
}

/// Parses a message of this module (None: not one).
pub fn parse(message: &[u8]) -> Option<Parsed<'_>> {
    let mut at = 0;
    let mut field = |message: &[u8]| -> Option<(usize, usize)> {
        let start = at;
        let len = message.get(start..)?.iter().position(|&b| b == b' ')?;
        at = start + len + 1;
        Some((start, start + len))
    };
    let (k0, k1) = field(message)?;
    let (d0, d1) = field(message)?;
    let (t0, t1) = field(message)?;
    let (l0, l1) = field(message)?;
    let text = |a: usize, b: usize| std::str::from_utf8(message.get(a..b)?).ok();
    let db: i32 = text(d0, d1)?.parse().ok()?;
    let token = match message.get(t0..t1)? {
        b"*" => None,
        _ => Some(text(t0, t1)?.parse().ok()?),
    };
    let keylen: usize = text(l0, l1)?.parse().ok()?;
    let key_end = at.checked_add(keylen)?;
    let key = message.get(at..key_end)?;
    let rest = match message.get(key_end..)? {
        [] => None,
        [b' ', rest @ ..] => Some(rest),
        _ => return None,
    };
    Some(Parsed {
        kind: message.get(k0..k1)?,
        db,
        token,
        key,
        rest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared test vectors' rows (`clients/vectors`, see its README), `\xHH` decoded.
    fn vector_rows(text: &str) -> Vec<Vec<Vec<u8>>> {
        let unescape = |column: &str| {
            let (mut out, bytes) = (Vec::new(), column.as_bytes());
            let mut at = 0;
            while let Some(&b) = bytes.get(at) {
                let hex = bytes.get(at + 2..at + 4).filter(|_| b == b'\\');
                match (bytes.get(at + 1), hex) {
                    (Some(b'\\'), _) if b == b'\\' => (out.push(b'\\'), at += 2),
                    (Some(b'x'), Some(hex)) => {
                        let hex = std::str::from_utf8(hex).expect("hex");
                        (out.push(u8::from_str_radix(hex, 16).expect("hex")), at += 4)
                    }
                    _ => (out.push(b), at += 1),
                };
            }
            out
        };
        text.lines()
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .map(|line| line.split('\t').map(unescape).collect())
            .collect()
    }

    #[test]
    fn the_module_writes_the_messages_of_the_shared_vectors() {
        let number = |b: &[u8]| std::str::from_utf8(b).expect("digits").parse::<u64>();
        let db = |b: &[u8]| i32::try_from(number(b).expect("db")).expect("db");
        let reasons = [
            LostReason::ForceReleased,
            LostReason::Deleted,
            LostReason::Overwritten,
            LostReason::Evicted,
            LostReason::Disconnected,
            LostReason::Expired,
        ];
        let gone = [
            KeyGone::Deleted,
            KeyGone::Expired,
            KeyGone::Evicted,
            KeyGone::Overwritten,
        ];
        let mut written = 0;
        for row in vector_rows(include_str!("../../clients/vectors/lost-messages.tsv")) {
            let field = |at: usize| row.get(at).map_or(&[][..], |f| f.as_slice());
            let word = std::str::from_utf8(field(2)).expect("word");
            let expected = match field(1) {
                b"hold" => lost_hold(
                    db(field(3)),
                    field(5),
                    &Lost {
                        reason: *reasons.iter().find(|r| r.name() == word).expect("reason"),
                        owner: field(6).to_vec(),
                        token: Some(number(field(4)).expect("token")),
                    },
                ),
                b"key" => key_gone(
                    db(field(3)),
                    field(5),
                    *gone.iter().find(|g| g.name() == word).expect("reason"),
                ),
                b"moved" => key_gone(db(field(3)), field(5), KeyGone::Moved),
                // A flush is written by the module's event handler (src/notify.rs).
                b"flushed" => continue,
                kind => {
                    assert_eq!(kind, b"none", "{row:?}");
                    continue;
                }
            };
            assert_eq!(field(0), expected.as_slice(), "{row:?}");
            written += 1;
        }
        for row in vector_rows(include_str!("../../clients/vectors/leader-messages.tsv")) {
            let field = |at: usize| row.get(at).map_or(&[][..], |f| f.as_slice());
            let (d, epoch) = (|| db(field(2)), || number(field(3)).expect("epoch"));
            let expected = match field(1) {
                b"elected" => elected(d(), field(4), epoch(), field(5)),
                b"proclaimed" => proclaimed(d(), field(4), epoch(), field(5)),
                kind => {
                    assert_eq!(kind, b"none", "{row:?}");
                    continue;
                }
            };
            assert_eq!(field(0), expected.as_slice(), "{row:?}");
            written += 1;
        }
        assert!(written > 15, "{written} rows");
    }

    #[test]
    fn every_message_names_its_database_and_key_exactly() {
        let lost = |reason, token, owner: &str| Lost {
            reason,
            owner: owner.as_bytes().to_vec(),
            token,
        };
        type Case = (Vec<u8>, &'static [u8]);
        let cases: Vec<Case> = vec![
            (
                lost_hold(0, b"orders:42", &lost(LostReason::Expired, Some(17), "w-1")),
                b"expired 0 17 9 orders:42 w-1",
            ),
            (
                lost_hold(3, b"a b", &lost(LostReason::ForceReleased, None, "x y")),
                b"forcereleased 3 0 3 a b x y",
            ),
            (
                lost_hold(0, b"", &lost(LostReason::Disconnected, Some(1), "")),
                b"disconnected 0 1 0  ",
            ),
            (key_gone(1, b"{k}", KeyGone::Deleted), b"deleted 1 * 3 {k}"),
            (key_gone(0, b"k", KeyGone::Moved), b"moved 0 * 1 k"),
            (
                elected(2, b"svc", 12, b"node a"),
                b"elected 2 12 3 svc node a",
            ),
            (
                proclaimed(0, b"s v", 12, b"10.0.0.1:80"),
                b"proclaimed 0 12 3 s v 10.0.0.1:80",
            ),
        ];
        for (got, want) in cases {
            assert_eq!(
                got,
                want,
                "{} != {}",
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(want)
            );
        }
    }

    #[test]
    fn messages_parse_back_whatever_the_key_and_owner_hold() {
        let keys: [&[u8]; 5] = [b"k", b"a b c", b"{tag}x", b"", b"sp ace 7 x"];
        let owners: [&[u8]; 4] = [b"o", b"o w n", b"", b"12 3 k"];
        for key in keys {
            for owner in owners {
                let lost = Lost {
                    reason: LostReason::Deleted,
                    owner: owner.to_vec(),
                    token: Some(99),
                };
                let m = lost_hold(7, key, &lost);
                let p = parse(&m).unwrap();
                assert_eq!(
                    (p.kind, p.db, p.token, p.key, p.rest),
                    (&b"deleted"[..], 7, Some(99), key, Some(owner))
                );
                let m = key_gone(7, key, KeyGone::Evicted);
                let p = parse(&m).unwrap();
                assert_eq!(
                    (p.kind, p.db, p.token, p.key, p.rest),
                    (&b"evicted"[..], 7, None, key, None)
                );
            }
        }
        for bad in [
            &b""[..],
            b"deleted 0 * 5 k",
            b"deleted x * 1 k",
            b"deleted 0 * 1 kX",
            b"deleted 0 -1 1 k o",
        ] {
            assert_eq!(parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_key_gone_names_the_reason_its_holds_were_lost() {
        assert_eq!(KeyGone::Moved.lost_reason(), None);
        assert_eq!(
            KeyGone::Overwritten.lost_reason(),
            Some(LostReason::Overwritten)
        );
    }
}
