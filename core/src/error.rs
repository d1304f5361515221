//! One error type for everything a LOCK.* command can refuse, mapped in one place to the exact
//! Redis reply. Redis groups `INFO errorstats` by the first word, so each reply starts with the
//! code Redis itself would use for the same mistake.

use std::fmt;

/// Why a command was refused. A refused command never changes a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockError {
    /// Too few or too many arguments; carries the command name as the client typed it.
    WrongArity(String),
    /// An unknown, repeated or misplaced option.
    Syntax,
    /// A number that does not parse as an integer.
    NotAnInteger,
    /// A multi-key command's `numkeys` outside `1..=max` (or more than the arguments given).
    NumKeysOutOfRange { max: u64 },
    /// A multi-key command names a key twice.
    DuplicateKey,
    /// A proclaimed value longer than `max` bytes.
    ValueTooLong { max: u64 },
    /// A lease outside `1..=max`.
    LeaseOutOfRange { max_ms: u64 },
    /// A negative or absurd `WAIT` timeout.
    TimeoutOutOfRange,
    /// The owner id is empty.
    EmptyOwner,
    /// The owner id collides with the field the module keeps the fencing token in.
    ReservedOwner,
    /// The key is in the module's reserved namespace (`__lock_fence__*`, the token counters).
    ReservedKey,
    /// The key holds something that is not a hash.
    WrongType,
    /// The key holds a hash, but not one laid out as a lock.
    NotALock,
    /// `lock.max-waiters-per-key` waiters are queued already.
    TooManyWaiters { max: u64 },
    /// A re-entry would take the count past the largest integer Redis stores.
    CountOverflow,
    /// The slot's token counter is at the largest integer: a new token would repeat one.
    TokensExhausted,
    /// In a cluster, the slot's token counter is not on this node while the slot is being moved
    /// to or from it: a token minted without it could fall below one handed out on the other
    /// node. Retryable: the counter arrives (or the move ends) in a moment.
    CounterElsewhere,
    /// A new lock would take memory while the server is over `maxmemory` (noeviction, or
    /// nothing left to evict).
    OutOfMemory,
    /// `WAIT` sent to a replica, which never grants locks (its master does).
    WaitOnReplica,
    /// Writes are paused (`CLIENT PAUSE WRITE|ALL`, `FAILOVER`): reached only by a LOCK.* write
    /// queued in a transaction behind the `CLIENT PAUSE` itself.
    WritesPaused,
    /// `LIMIT n` outside `1..=MAX_LIMIT`.
    LimitOutOfRange,
    /// The key is a semaphore: only `LIMIT <its limit>` may acquire it.
    IsSemaphore { limit: u64 },
    /// The key is a read-write lock (held exclusively or shared): `LIMIT` may not acquire it.
    IsReadWrite,
    /// A shared holder asked for the exclusive hold: waiting would deadlock against itself.
    UpgradeRefused,
    /// The exclusive holder asked for `SHARED` while its exclusive hold has no fencing token or
    /// no lease (taken by Redisson's own script, or `PERSIST`ed): the multi-hold layout stores
    /// both for every hold, so the downgrade would write a hold nothing could read back.
    DowngradeNeedsLease,
    /// A shared key has the most holders a lock may have.
    TooManyHolders { max: u64 },
    /// The keys of one multi-key command hold more fields together than it may read (keys
    /// written before the holder cap was 1,000 may hold up to 10,000 each).
    TooManyHoldsTogether { max: u64 },
    /// `EPHEMERAL` inside a script or function: it has no connection to bind the hold to.
    EphemeralInScript,
    /// A plain re-entry of a hold bound to its connection.
    HoldIsEphemeral,
    /// An `EPHEMERAL` re-entry of a plain hold.
    HoldIsNotEphemeral,
    /// `TICKET` without `WAIT`: a ticket is a way to wait.
    TicketNeedsWait,
    /// `LOCK.CANCEL` of a name that is not a ticket's.
    NotATicket,
    /// `LOCK.CANCEL` on a replica (its master decides every ticket).
    TicketOnReplica,
    /// `LOCK.GUARD`: the owner's hold is gone or its token is not current; nothing ran.
    Fenced(Fenced),
    /// `LOCK.GUARD`: a shared hold may run only read-only commands; this one writes.
    SharedHoldWrites,
    /// `LOCK.GUARD` of a LOCK.* command.
    GuardedLockCommand,
    /// `LOCK.GUARD` of a command that names no key: there is nothing for the fence to protect.
    GuardedKeyless,
    /// `LOCK.GUARD` of a command that names the lock's own key.
    GuardedLockKey,
    /// `LOCK.GUARD` of a command the server does not have; carries its name as given.
    UnknownCommand(String),
    /// `LOCK.GUARD`: the caller's ACL user may not run the inner command, or touch one of its keys
    /// or channels.
    NoPermission,
    /// A bug: the command was stopped before it changed anything it should not have.
    Internal,
}

/// Why `LOCK.GUARD` refused a token (and ran nothing), or `LOCK.CHECK` answered 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// The owner holds nothing on the key now: released, force-released, its lease ended,
    /// handed on, or the key was deleted or replaced.
    Gone,
    /// The owner holds the key, but under another token (a later hold of its own; or a token
    /// that was never this hold's).
    NotCurrent,
}

impl LockError {
    /// The error line sent to the client (without the leading `-`).
    pub fn reply(&self) -> String {
        match self {
            LockError::WrongArity(cmd) => {
                format!("ERR wrong number of arguments for '{cmd}' command")
            }
            LockError::Syntax => "ERR syntax error".into(),
            LockError::NumKeysOutOfRange { max } => {
                format!("ERR numkeys must be between 1 and {max}, and no more than the keys given")
            }
            LockError::DuplicateKey => "ERR a key is named twice: each key is locked once".into(),
            LockError::ValueTooLong { max } => {
                format!("ERR a proclaimed value is at most {max} bytes")
            }
            LockError::NotAnInteger => "ERR value is not an integer or out of range".into(),
            LockError::LeaseOutOfRange { max_ms } => {
                format!("ERR lease must be between 1 and {max_ms} milliseconds")
            }
            LockError::TimeoutOutOfRange => "ERR timeout is negative or out of range".into(),
            LockError::EmptyOwner => "ERR owner must not be empty".into(),
            LockError::ReservedOwner => format!(
                "ERR owners '{}', '{}' and '{}' are reserved for the lock's own fields",
                crate::layout::MODE_FIELD_DISPLAY,
                crate::layout::FENCE_FIELD_DISPLAY,
                crate::layout::LEGACY_MODE_FIELD_DISPLAY
            ),
            LockError::ReservedKey => format!(
                "ERR keys starting with '{}' are reserved for the lock module's fencing-token counters",
                crate::layout::RESERVED_KEY_PREFIX_DISPLAY
            ),
            LockError::WrongType => {
                "WRONGTYPE Operation against a key holding the wrong kind of value".into()
            }
            LockError::NotALock => {
                "ERR the hash at this key is not a lock; LOCK.* commands leave it as it is (DEL removes a damaged lock)".into()
            }
            LockError::TooManyWaiters { max } => {
                format!("ERR too many waiters on this lock (lock.max-waiters-per-key is {max})")
            }
            LockError::CountOverflow => "ERR re-entry count would overflow".into(),
            LockError::TokensExhausted => format!(
                "ERR fencing tokens exhausted: this key's '{}{{...}}' counter is at the largest integer; see docs/commands.md (fencing-token counters)",
                crate::layout::RESERVED_KEY_PREFIX_DISPLAY
            ),
            LockError::CounterElsewhere => format!(
                "TRYAGAIN this slot's fencing-token counter ('{}{{...}}') is not on this node while the slot is being moved; retry in a moment",
                crate::layout::RESERVED_KEY_PREFIX_DISPLAY
            ),
            LockError::OutOfMemory => {
                "OOM command not allowed when used memory > 'maxmemory'.".into()
            }
            LockError::WaitOnReplica => {
                "ERR a replica does not serve LOCK.ACQUIRE ... WAIT: only the master grants locks".into()
            }
            LockError::WritesPaused => {
                "ERR writes are paused on this server (CLIENT PAUSE or failover); retry after the pause".into()
            }
            LockError::LimitOutOfRange => format!(
                "ERR LIMIT must be between 1 and {}",
                crate::hold::MAX_LIMIT
            ),
            LockError::IsSemaphore { limit } => {
                format!("ERR the key is a semaphore with LIMIT {limit}; acquire it with LIMIT {limit}")
            }
            LockError::IsReadWrite => {
                "ERR the key is a read-write lock; acquire it without LIMIT".into()
            }
            LockError::DowngradeNeedsLease => {
                "ERR the owner's exclusive hold has no fencing token or no lease (taken outside the module); re-enter it with LOCK.ACQUIRE before taking it SHARED".into()
            }
            LockError::UpgradeRefused => {
                "ERR the owner holds this key SHARED; release it before asking for it exclusively (no upgrade)".into()
            }
            LockError::TooManyHolders { max } => {
                format!("ERR the key has the most holders a lock may have ({max})")
            }
            LockError::TooManyHoldsTogether { max } => format!(
                "ERR these keys hold more than {max} fields together, more than one multi-key command reads; a key written by an earlier version may hold more than 1000 holds: use single-key commands on it"
            ),
            LockError::EphemeralInScript => {
                "ERR EPHEMERAL cannot be used from a script or function: it has no connection to bind the hold to".into()
            }
            LockError::HoldIsEphemeral => {
                "ERR the owner's hold is EPHEMERAL; re-enter it with EPHEMERAL".into()
            }
            LockError::HoldIsNotEphemeral => {
                "ERR the owner's hold is not EPHEMERAL; re-enter it without EPHEMERAL".into()
            }
            LockError::TicketNeedsWait => "ERR TICKET is a way to wait: it needs WAIT timeout-ms".into(),
            LockError::NotATicket => {
                "ERR not a ticket: LOCK.CANCEL takes the ticket a LOCK.* ... WAIT ... TICKET replied".into()
            }
            LockError::TicketOnReplica => {
                "ERR a replica does not serve tickets: only the master grants locks".into()
            }
            LockError::Fenced(Fenced::Gone) => {
                "FENCED the hold is gone: the owner no longer holds this lock (released, expired, force-released, handed on or deleted); the command did not run".into()
            }
            LockError::Fenced(Fenced::NotCurrent) => {
                "FENCED the token is not current: the owner holds this lock under another token; the command did not run".into()
            }
            LockError::SharedHoldWrites => {
                "ERR a SHARED hold runs only read-only commands through LOCK.GUARD; hold the lock exclusively (or a permit) to write".into()
            }
            LockError::GuardedLockCommand => "ERR LOCK.GUARD does not run LOCK.* commands".into(),
            LockError::GuardedKeyless => {
                "ERR LOCK.GUARD runs only commands that name keys; this one names none".into()
            }
            LockError::GuardedLockKey => {
                "ERR LOCK.GUARD never runs a command on the lock's own key".into()
            }
            LockError::UnknownCommand(name) => {
                // As Redis shows an unknown name: at most 128 characters, on one line.
                let shown: String = name
                    .chars()
                    .take(128)
                    .map(|c| if c.is_control() { ' ' } else { c })
                    .collect();
                format!("ERR unknown command '{shown}' given to LOCK.GUARD")
            }
            LockError::NoPermission => {
                "NOPERM this user has no permissions to run the command given to LOCK.GUARD, or to access one of its keys or channels".into()
            }
            LockError::Internal => "ERR internal error".into(),
        }
    }
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reply())
    }
}

impl std::error::Error for LockError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reply_starts_with_a_redis_error_code() {
        let all = [
            LockError::WrongArity("lock.acquire".into()),
            LockError::Syntax,
            LockError::NotAnInteger,
            LockError::LeaseOutOfRange { max_ms: 10 },
            LockError::TimeoutOutOfRange,
            LockError::EmptyOwner,
            LockError::ReservedOwner,
            LockError::WrongType,
            LockError::NotALock,
            LockError::TooManyWaiters { max: 3 },
            LockError::ReservedKey,
            LockError::CountOverflow,
            LockError::TokensExhausted,
            LockError::CounterElsewhere,
            LockError::OutOfMemory,
            LockError::WaitOnReplica,
            LockError::WritesPaused,
            LockError::LimitOutOfRange,
            LockError::IsSemaphore { limit: 3 },
            LockError::IsReadWrite,
            LockError::UpgradeRefused,
            LockError::DowngradeNeedsLease,
            LockError::TooManyHolders { max: 3 },
            LockError::TooManyHoldsTogether { max: 3 },
            LockError::EphemeralInScript,
            LockError::HoldIsEphemeral,
            LockError::HoldIsNotEphemeral,
            LockError::TicketNeedsWait,
            LockError::NotATicket,
            LockError::TicketOnReplica,
            LockError::Fenced(Fenced::Gone),
            LockError::Fenced(Fenced::NotCurrent),
            LockError::SharedHoldWrites,
            LockError::GuardedLockCommand,
            LockError::GuardedKeyless,
            LockError::GuardedLockKey,
            LockError::UnknownCommand("nope\r\nx".into()),
            LockError::NoPermission,
            LockError::Internal,
        ];
        for e in all {
            let r = e.reply();
            let code = r.split(' ').next().unwrap_or_default();
            assert!(
                ["ERR", "WRONGTYPE", "OOM", "FENCED", "NOPERM", "TRYAGAIN"].contains(&code),
                "{r}"
            );
            assert!(!r.contains('\n') && !r.contains('\r'), "{r}");
        }
    }

    #[test]
    fn messages_match_redis_wording() {
        assert_eq!(
            LockError::WrongArity("lock.release".into()).reply(),
            "ERR wrong number of arguments for 'lock.release' command"
        );
        assert_eq!(
            LockError::NotAnInteger.reply(),
            "ERR value is not an integer or out of range"
        );
        assert_eq!(
            LockError::OutOfMemory.reply(),
            "OOM command not allowed when used memory > 'maxmemory'."
        );
        assert_eq!(
            LockError::WrongType.reply(),
            "WRONGTYPE Operation against a key holding the wrong kind of value"
        );
    }
}
