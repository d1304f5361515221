//! Leader election on a lock key: a campaign is an exclusive hold taken with `LOCK.CAMPAIGN`
//! (its fencing token is the leader's epoch), a proclamation is a small value the leader
//! publishes with its epoch, and observers follow both on the key's leader channel. No Redis
//! here: the messages, the stored form of a proclamation, and who may proclaim.

use crate::hold::{Hold, Lock};
use crate::layout::{format_u64, parse_positive};
use crate::UnixMs;

/// A waiter that campaigns (`LOCK.CAMPAIGN ... WAIT`): its grant is announced on the key's
/// leader channel, with the value it proclaims, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Campaign {
    pub value: Option<Box<[u8]>>,
}

/// The longest value a leader may proclaim (an address, a small JSON document).
pub const MAX_VALUE_BYTES: usize = 4_096;

/// The leader of an election key at `now`: its exclusive hold, unless that hold's lease ended.
pub fn leader(lock: &Lock, now: UnixMs) -> Option<&Hold> {
    lock.exclusive().filter(|hold| !hold.ended(now))
}

/// Whether `owner` leads the key in `epoch` (holds it exclusively with that token) at `now`:
/// only then may it proclaim.
pub fn leads(lock: &Lock, owner: &[u8], epoch: u64, now: UnixMs) -> bool {
    leader(lock, now).is_some_and(|hold| hold.owner == owner && hold.token == Some(epoch))
}

/// A proclamation as stored: `<epoch>:<value>`.
pub fn encode_proclaimed(epoch: u64, value: &[u8]) -> Vec<u8> {
    let mut digits = [0u8; 20];
    let epoch = format_u64(epoch, &mut digits);
    let mut out = Vec::with_capacity(epoch.len() + 1 + value.len());
    out.extend_from_slice(epoch);
    out.push(b':');
    out.extend_from_slice(value);
    out
}

/// A stored proclamation's epoch and value (None: not one).
pub fn decode_proclaimed(stored: &[u8]) -> Option<(u64, &[u8])> {
    let colon = stored.iter().position(|&b| b == b':')?;
    let epoch = parse_positive(stored.get(..colon)?)?;
    Some((epoch, stored.get(colon + 1..)?))
}

/// The value proclaimed for the current leader: a stored proclamation counts only while its
/// epoch is the leader's (a value proclaimed in an earlier epoch is not this leader's).
pub fn current_value<'a>(leader: &Hold, stored: Option<&'a [u8]>) -> Option<&'a [u8]> {
    let (epoch, value) = decode_proclaimed(stored?)?;
    (leader.token == Some(epoch)).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hold::Hold;
    use crate::kind::{Family, HoldKind};

    fn led(owner: &str, token: u64, until: UnixMs) -> Lock {
        Lock {
            family: Family::ReadWrite,
            holds: smallvec::smallvec![Hold {
                owner: owner.as_bytes().to_vec().into(),
                kind: HoldKind::Exclusive,
                count: 1,
                expires_at: Some(until),
                token: Some(token),
            }],
        }
    }

    #[test]
    fn only_the_leader_of_the_epoch_may_proclaim_and_only_while_its_lease_lasts() {
        let lock = led("a", 7, 100);
        let cases: [(&str, u64, UnixMs, bool); 5] = [
            ("a", 7, 50, true),
            ("a", 7, 100, true),
            ("a", 7, 101, false),
            ("a", 6, 50, false),
            ("b", 7, 50, false),
        ];
        for (owner, epoch, now, want) in cases {
            assert_eq!(
                leads(&lock, owner.as_bytes(), epoch, now),
                want,
                "{owner} {epoch} {now}"
            );
        }
        assert!(!leads(&Lock::free(), b"a", 7, 0));
    }

    #[test]
    fn stored_values() {
        let stored = encode_proclaimed(12, b"x:y");
        assert_eq!(stored, b"12:x:y");
        assert_eq!(decode_proclaimed(&stored), Some((12, &b"x:y"[..])));
        for bad in [&b""[..], b"12", b":v", b"0:v", b"x:v", b"-1:v"] {
            assert_eq!(decode_proclaimed(bad), None, "{bad:?}");
        }
        let lock = led("a", 12, 100);
        let leader = leader(&lock, 0).unwrap();
        assert_eq!(current_value(leader, Some(&stored)), Some(&b"x:y"[..]));
        let old = encode_proclaimed(11, b"old");
        assert_eq!(
            current_value(leader, Some(&old)),
            None,
            "an earlier epoch's value"
        );
        assert_eq!(current_value(leader, None), None);
    }
}
