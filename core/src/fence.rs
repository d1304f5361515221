//! Fenced commands. `LOCK.GUARD key owner token command [arg ...]` runs a command only while the
//! owner's hold with that fencing token is alive on the server's clock; `LOCK.CHECK key owner
//! token` says whether it is. The rules, with no Redis in them: whether an owner's holds, as
//! read at `now`, admit a token and what the admitted hold may run ([`admit`]), and which inner
//! commands LOCK.GUARD never runs ([`check_inner`]).

use crate::error::Fenced;
use crate::hold::{Hold, HoldKind};
use crate::layout::is_reserved_key;
use crate::{LockError, UnixMs};

/// What an admitted hold may run through LOCK.GUARD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// A shared hold: read-only commands (other owners hold the key with it, so it must not
    /// write what they read).
    ReadOnly,
    /// An exclusive hold or a semaphore permit: any command.
    ReadWrite,
}

/// Whether the holds read from a lock admit `owner`'s `token` at `now`: the owner has a hold
/// with exactly this token whose lease has not ended. `holds` may be the whole lock or the
/// owner's holds only (others' holds are ignored). An owner with no live hold is
/// [`Fenced::Gone`]; one whose live holds carry other tokens is [`Fenced::NotCurrent`]. A hold
/// without a token (taken by Redisson's own script) admits no token.
pub fn admit(holds: &[Hold], owner: &[u8], token: i64, now: UnixMs) -> Result<Access, Fenced> {
    let mut live = holds
        .iter()
        .filter(|h| h.owner == owner && !h.ended(now))
        .peekable();
    if live.peek().is_none() {
        return Err(Fenced::Gone);
    }
    let token = u64::try_from(token).ok();
    match live.find(|h| token.is_some() && h.token == token) {
        Some(hold) if hold.kind == HoldKind::Shared => Ok(Access::ReadOnly),
        Some(_) => Ok(Access::ReadWrite),
        None => Err(Fenced::NotCurrent),
    }
}

/// Whether a command name is one of the module's own (`lock.*`, any case): LOCK.GUARD never
/// runs those, and never asks for their keys (a LOCK.GUARD inside LOCK.GUARD would recurse).
pub fn is_lock_command(name: &[u8]) -> bool {
    name.get(..5)
        .is_some_and(|prefix| prefix.eq_ignore_ascii_case(b"lock."))
}

/// Where an inner command line (its name first) carries a secret that Redis itself hides from
/// `MONITOR` and `SLOWLOG` when the command is sent directly: `MIGRATE`'s `AUTH <password>` and
/// `AUTH2 <username> <password>` (looked for from its sixth argument up to `KEYS`, as Redis
/// does). LOCK.GUARD hides the same arguments of its own line, run or refused. (Every other
/// command that takes a secret names no key, and LOCK.GUARD refuses it.)
pub fn secret_positions(inner: &[&[u8]]) -> Vec<usize> {
    let mut secret = Vec::new();
    if !inner
        .first()
        .is_some_and(|c| c.eq_ignore_ascii_case(b"migrate"))
    {
        return secret;
    }
    let mut at = 6;
    while let Some(arg) = inner.get(at) {
        if arg.eq_ignore_ascii_case(b"keys") {
            break;
        }
        let hidden = if arg.eq_ignore_ascii_case(b"auth") {
            1
        } else if arg.eq_ignore_ascii_case(b"auth2") {
            2
        } else {
            0
        };
        secret.extend((at + 1..=at + hidden).filter(|&i| i < inner.len()));
        at += 1 + hidden;
    }
    secret
}

/// The rules for LOCK.GUARD's inner command, on its name and the keys Redis finds in it: never
/// a LOCK.* command, never one that names no key (nothing the lock protects), never one on the
/// lock's own key or on a key of the module's reserved namespace (`__lock_fence__*`).
pub fn check_inner<'a>(
    command: &[u8],
    lock_key: &[u8],
    keys: impl IntoIterator<Item = &'a [u8]>,
) -> Result<(), LockError> {
    if is_lock_command(command) {
        return Err(LockError::GuardedLockCommand);
    }
    let mut named = false;
    for key in keys {
        named = true;
        if key == lock_key {
            return Err(LockError::GuardedLockKey);
        }
        if is_reserved_key(key) {
            return Err(LockError::ReservedKey);
        }
    }
    if !named {
        return Err(LockError::GuardedKeyless);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn migrate_passwords_are_the_secrets_of_an_inner_line() {
        let line = |text: &str| -> Vec<Vec<u8>> {
            text.split(' ').map(|w| w.as_bytes().to_vec()).collect()
        };
        let cases: [(&str, &[usize]); 6] = [
            ("SET k v", &[]),
            ("MIGRATE h 6379 k 0 1000", &[]),
            ("migrate h 6379 k 0 1000 COPY REPLACE AUTH pw", &[9]),
            (
                "MIGRATE h 6379 \"\" 0 1000 AUTH2 user pw KEYS auth k2",
                &[7, 8],
            ),
            ("MIGRATE h 6379 k 0 1000 auth", &[]),
            ("MIGRATE h 6379 k 0 1000 AUTH2 user", &[7]),
        ];
        for (text, want) in cases {
            let words = line(text);
            let refs: Vec<&[u8]> = words.iter().map(Vec::as_slice).collect();
            assert_eq!(super::secret_positions(&refs), want, "{text}");
        }
    }

    use super::*;

    const NOW: UnixMs = 1_700_000_000_000;

    fn hold(owner: &str, kind: HoldKind, expires_at: Option<UnixMs>, token: Option<u64>) -> Hold {
        Hold {
            owner: owner.as_bytes().into(),
            kind,
            count: 1,
            expires_at,
            token,
        }
    }

    use HoldKind::{Exclusive, Permit, Shared};

    /// A case of `admit`: name, holds, owner, token, decision.
    type AdmitCase = (
        &'static str,
        Vec<Hold>,
        &'static str,
        i64,
        Result<Access, Fenced>,
    );
    /// A case of `check_inner`: name, command, its keys, decision.
    type InnerCase = (
        &'static str,
        &'static str,
        Vec<&'static str>,
        Result<(), LockError>,
    );

    #[test]
    fn admit_decides_by_owner_token_and_lease() {
        let later = Some(NOW + 1);
        let cases: Vec<AdmitCase> = vec![
            (
                "the exclusive holder with its token writes",
                vec![hold("a", Exclusive, later, Some(7))],
                "a",
                7,
                Ok(Access::ReadWrite),
            ),
            (
                "a lease ending this very millisecond still holds",
                vec![hold("a", Exclusive, Some(NOW), Some(7))],
                "a",
                7,
                Ok(Access::ReadWrite),
            ),
            (
                "a lease that ended is gone, even before the module removed it",
                vec![hold("a", Exclusive, Some(NOW - 1), Some(7))],
                "a",
                7,
                Err(Fenced::Gone),
            ),
            (
                "no lease (PERSIST) holds",
                vec![hold("a", Exclusive, None, Some(7))],
                "a",
                7,
                Ok(Access::ReadWrite),
            ),
            (
                "another owner's hold: this one's is gone",
                vec![hold("b", Exclusive, later, Some(9))],
                "a",
                7,
                Err(Fenced::Gone),
            ),
            (
                "no holds at all: gone",
                vec![],
                "a",
                7,
                Err(Fenced::Gone),
            ),
            (
                "the owner holds again under a newer token: the old one is not current",
                vec![hold("a", Exclusive, later, Some(9))],
                "a",
                7,
                Err(Fenced::NotCurrent),
            ),
            (
                "a token from the future is not current either",
                vec![hold("a", Exclusive, later, Some(7))],
                "a",
                8,
                Err(Fenced::NotCurrent),
            ),
            (
                "zero and negative tokens match nothing",
                vec![hold("a", Exclusive, later, Some(7))],
                "a",
                -7,
                Err(Fenced::NotCurrent),
            ),
            (
                "a hold Redisson's own script took has no token to admit",
                vec![hold("a", Exclusive, later, None)],
                "a",
                0,
                Err(Fenced::NotCurrent),
            ),
            (
                "a shared hold reads only",
                vec![
                    hold("a", Shared, later, Some(7)),
                    hold("b", Shared, later, Some(8)),
                ],
                "a",
                7,
                Ok(Access::ReadOnly),
            ),
            (
                "another reader's token is not this owner's",
                vec![
                    hold("a", Shared, later, Some(7)),
                    hold("b", Shared, later, Some(8)),
                ],
                "a",
                8,
                Err(Fenced::NotCurrent),
            ),
            (
                "a downgraded holder writes with its exclusive token",
                vec![
                    hold("a", Exclusive, later, Some(7)),
                    hold("a", Shared, later, Some(8)),
                ],
                "a",
                7,
                Ok(Access::ReadWrite),
            ),
            (
                "and reads with its shared one",
                vec![
                    hold("a", Exclusive, later, Some(7)),
                    hold("a", Shared, later, Some(8)),
                ],
                "a",
                8,
                Ok(Access::ReadOnly),
            ),
            (
                "its exclusive hold ended, its shared one lives: the exclusive token is not current",
                vec![
                    hold("a", Exclusive, Some(NOW - 1), Some(7)),
                    hold("a", Shared, later, Some(8)),
                ],
                "a",
                7,
                Err(Fenced::NotCurrent),
            ),
            (
                "a permit writes",
                vec![
                    hold("a", Permit, later, Some(7)),
                    hold("b", Permit, later, Some(8)),
                ],
                "a",
                7,
                Ok(Access::ReadWrite),
            ),
        ];
        for (name, holds, owner, token, expected) in cases {
            assert_eq!(
                admit(&holds, owner.as_bytes(), token, NOW),
                expected,
                "{name}"
            );
        }
    }

    #[test]
    fn lock_commands_are_told_by_their_prefix_in_any_case() {
        for name in ["lock.acquire", "LOCK.GUARD", "Lock.Check", "lock."] {
            assert!(is_lock_command(name.as_bytes()), "{name}");
        }
        for name in ["set", "lock", "lockacquire", "locks.x", "", "lo"] {
            assert!(!is_lock_command(name.as_bytes()), "{name}");
        }
    }

    #[test]
    fn inner_commands_that_would_touch_the_lock_or_nothing_are_refused() {
        let cases: Vec<InnerCase> = vec![
            ("a write to a data key", "SET", vec!["data"], Ok(())),
            ("several data keys", "MSET", vec!["d1", "d2"], Ok(())),
            (
                "a LOCK.* command",
                "lock.release",
                vec!["other"],
                Err(LockError::GuardedLockCommand),
            ),
            (
                "the lock's own key",
                "DEL",
                vec!["data", "lock"],
                Err(LockError::GuardedLockKey),
            ),
            (
                "a token counter",
                "SET",
                vec!["__lock_fence__{a}"],
                Err(LockError::ReservedKey),
            ),
            (
                "anything in the reserved namespace",
                "GET",
                vec!["__lock_fence__"],
                Err(LockError::ReservedKey),
            ),
            (
                "no key at all",
                "PUBLISH",
                vec![],
                Err(LockError::GuardedKeyless),
            ),
            (
                "a key that only looks like the lock's",
                "SET",
                vec!["lock:data", "{lock}"],
                Ok(()),
            ),
        ];
        for (name, command, keys, expected) in cases {
            let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
            assert_eq!(
                check_inner(command.as_bytes(), b"lock", keys),
                expected,
                "{name}"
            );
        }
    }
}
