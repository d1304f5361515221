//! Parsing LOCK.* arguments: a typed cursor that refuses anything it did not consume.
//!
//! Arguments arrive as byte slices (keys and owners are binary-safe). Each `parse_*` function
//! turns a whole command line into a typed request or a [`LockError`]; a request that parsed is
//! one the state machine can act on without further checks.

pub use crate::kind::Reentry;
use crate::kind::{Mode, MAX_LIMIT};
use crate::layout::{is_reserved_key, is_reserved_owner};
pub use crate::layout::{parse_i64, parse_positive};
use crate::LockError;

/// The longest `WAIT` the module accepts: 100 years, far past any real deadline, and small enough
/// that `now + timeout` can never overflow.
pub const MAX_WAIT_TIMEOUT_MS: u64 = 100 * 365 * 24 * 3600 * 1000;

/// What a `LOCK.ACQUIRE` does when another owner holds the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Answer nil at once (no `WAIT` option).
    No,
    /// Block until the lock is granted (`WAIT 0`).
    Forever,
    /// Block at most this many milliseconds.
    For(u64),
}

/// How a request that must wait waits: its client blocked until the answer (`WAIT`), or
/// answered at once with a ticket the answer is written into (`WAIT ... TICKET`, see
/// [`crate::ticket`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    Blocked,
    Ticket,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireRequest<'a> {
    pub key: &'a [u8],
    pub owner: &'a [u8],
    pub lease_ms: u64,
    pub wait: Wait,
    pub waiting: Waiting,
    pub reentry: Reentry,
    /// No option, `SHARED` or `LIMIT n`.
    pub mode: Mode,
    pub binding: Binding,
}

/// Whether a hold ends with the connection that took it (`EPHEMERAL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    Lease,
    Connection,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRequest<'a> {
    pub key: &'a [u8],
    pub owner: &'a [u8],
}

/// `LOCK.RELEASE key owner [TOKEN token]`: with `TOKEN`, only the owner's hold under that
/// token is counted down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseRequest<'a> {
    pub key: &'a [u8],
    pub owner: &'a [u8],
    pub token: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewRequest<'a> {
    pub key: &'a [u8],
    pub owner: &'a [u8],
    pub lease_ms: u64,
}

/// A cursor over one command line. `argv[0]` is the command name, kept for arity errors.
pub struct ArgCursor<'a> {
    name: &'a [u8],
    rest: std::slice::Iter<'a, &'a [u8]>,
}

impl<'a> ArgCursor<'a> {
    /// Checks the arity (`min..=max` arguments after the name) and positions after the name.
    pub fn new(argv: &'a [&'a [u8]], min: usize, max: usize) -> Result<Self, LockError> {
        let (name, rest) = argv
            .split_first()
            .ok_or_else(|| LockError::WrongArity(String::new()))?;
        if rest.len() < min || rest.len() > max {
            return Err(LockError::WrongArity(
                String::from_utf8_lossy(name).to_lowercase(),
            ));
        }
        Ok(ArgCursor {
            name,
            rest: rest.iter(),
        })
    }

    pub fn command_name(&self) -> &'a [u8] {
        self.name
    }

    /// The next argument; a missing one is an arity error (the caller's `min` guards this).
    pub fn bytes(&mut self) -> Result<&'a [u8], LockError> {
        self.rest
            .next()
            .copied()
            .ok_or_else(|| LockError::WrongArity(String::from_utf8_lossy(self.name).to_lowercase()))
    }

    /// A lock key: any bytes except the module's reserved namespace.
    pub fn key(&mut self) -> Result<&'a [u8], LockError> {
        let key = self.bytes()?;
        if is_reserved_key(key) {
            return Err(LockError::ReservedKey);
        }
        Ok(key)
    }

    pub fn integer(&mut self) -> Result<i64, LockError> {
        parse_i64(self.bytes()?).ok_or(LockError::NotAnInteger)
    }

    pub fn owner(&mut self) -> Result<&'a [u8], LockError> {
        let owner = self.bytes()?;
        if owner.is_empty() {
            return Err(LockError::EmptyOwner);
        }
        if is_reserved_owner(owner) {
            return Err(LockError::ReservedOwner);
        }
        Ok(owner)
    }

    pub fn lease(&mut self, max_lease_ms: u64) -> Result<u64, LockError> {
        let lease = self.integer()?;
        match u64::try_from(lease) {
            Ok(ms) if ms >= 1 && ms <= max_lease_ms => Ok(ms),
            _ => Err(LockError::LeaseOutOfRange {
                max_ms: max_lease_ms,
            }),
        }
    }

    /// `numkeys key [key ...]`: distinct lock keys, at most [`MAX_MULTI_KEYS`].
    pub fn keys(&mut self) -> Result<Vec<&'a [u8]>, LockError> {
        let out_of_range = LockError::NumKeysOutOfRange {
            max: MAX_MULTI_KEYS as u64,
        };
        let count = parse_i64(self.bytes()?).ok_or(LockError::NotAnInteger)?;
        let count = match usize::try_from(count) {
            Ok(n) if (1..=MAX_MULTI_KEYS).contains(&n) && n <= self.rest.len() => n,
            _ => return Err(out_of_range),
        };
        let mut keys: Vec<&'a [u8]> = Vec::with_capacity(count);
        for _ in 0..count {
            let key = self.key()?;
            // At most 64 keys: a scan costs less than a set.
            if keys.contains(&key) {
                return Err(LockError::DuplicateKey);
            }
            keys.push(key);
        }
        Ok(keys)
    }

    /// The next argument if there is one.
    pub fn option(&mut self) -> Option<&'a [u8]> {
        self.rest.next().copied()
    }

    /// Succeeds only when every argument was consumed.
    pub fn finish(mut self) -> Result<(), LockError> {
        match self.rest.next() {
            None => Ok(()),
            Some(_) => Err(LockError::Syntax),
        }
    }
}

/// `LOCK.ACQUIRE key owner lease-ms [SHARED | LIMIT n] [EPHEMERAL] [ONCE] [WAIT timeout-ms
/// [TICKET]]` (options in any order, each at most once; `TICKET` only with `WAIT`)
pub fn parse_acquire<'a>(
    argv: &'a [&'a [u8]],
    max_lease_ms: u64,
) -> Result<AcquireRequest<'a>, LockError> {
    // Like SET, extra words after the lease are options: unknown ones are a syntax error.
    let mut args = ArgCursor::new(argv, 3, usize::MAX)?;
    let key = args.key()?;
    let owner = args.owner()?;
    let lease_ms = args.lease(max_lease_ms)?;
    let options = acquire_options(&mut args)?;
    Ok(AcquireRequest {
        key,
        owner,
        lease_ms,
        wait: options.wait,
        waiting: options.waiting,
        reentry: options.reentry,
        mode: options.mode,
        binding: options.binding,
    })
}

/// The most keys one multi-key command takes.
pub const MAX_MULTI_KEYS: usize = 64;

/// `LOCK.MACQUIRE numkeys key [key ...] owner lease-ms [SHARED | LIMIT n] [EPHEMERAL] [ONCE]
/// [WAIT timeout-ms [TICKET]]`: one request per key, in the order given (distinct keys).
pub fn parse_macquire<'a>(
    argv: &'a [&'a [u8]],
    max_lease_ms: u64,
) -> Result<Vec<AcquireRequest<'a>>, LockError> {
    let mut args = ArgCursor::new(argv, 4, usize::MAX)?;
    let keys = args.keys()?;
    let owner = args.owner()?;
    let lease_ms = args.lease(max_lease_ms)?;
    let options = acquire_options(&mut args)?;
    Ok(keys
        .into_iter()
        .map(|key| AcquireRequest {
            key,
            owner,
            lease_ms,
            wait: options.wait,
            waiting: options.waiting,
            reentry: options.reentry,
            mode: options.mode,
            binding: options.binding,
        })
        .collect())
}

/// `LOCK.CAMPAIGN`: an exclusive acquire that never counts a re-entry, and the value the
/// leader proclaims with its election (if any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CampaignRequest<'a> {
    pub acquire: AcquireRequest<'a>,
    pub value: Option<&'a [u8]>,
}

/// `LOCK.CAMPAIGN key candidate lease-ms [EPHEMERAL] [WAIT timeout-ms [TICKET]] [VALUE value]`
pub fn parse_campaign<'a>(
    argv: &'a [&'a [u8]],
    max_lease_ms: u64,
) -> Result<CampaignRequest<'a>, LockError> {
    let mut args = ArgCursor::new(argv, 3, usize::MAX)?;
    let key = args.key()?;
    let owner = args.owner()?;
    let lease_ms = args.lease(max_lease_ms)?;
    let mut wait = Wait::No;
    let mut waiting = Waiting::Blocked;
    let mut binding = Binding::Lease;
    let mut value = None;
    while let Some(option) = args.option() {
        if option.eq_ignore_ascii_case(b"EPHEMERAL") && binding == Binding::Lease {
            binding = Binding::Connection;
        } else if option.eq_ignore_ascii_case(b"WAIT") && wait == Wait::No {
            wait = wait_timeout(args.bytes().map_err(|_| LockError::Syntax)?)?;
        } else if option.eq_ignore_ascii_case(b"TICKET") && waiting == Waiting::Blocked {
            waiting = Waiting::Ticket;
        } else if option.eq_ignore_ascii_case(b"VALUE") && value.is_none() {
            value = Some(proclaimed_value(
                args.bytes().map_err(|_| LockError::Syntax)?,
            )?);
        } else {
            return Err(LockError::Syntax);
        }
    }
    if waiting == Waiting::Ticket && wait == Wait::No {
        return Err(LockError::TicketNeedsWait);
    }
    Ok(CampaignRequest {
        acquire: AcquireRequest {
            key,
            owner,
            lease_ms,
            wait,
            waiting,
            reentry: Reentry::Once,
            mode: Mode::Exclusive,
            binding,
        },
        value,
    })
}

/// `LOCK.PROCLAIM key candidate epoch value`
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProclaimRequest<'a> {
    pub key: &'a [u8],
    pub owner: &'a [u8],
    pub epoch: u64,
    pub value: &'a [u8],
}

pub fn parse_proclaim<'a>(argv: &'a [&'a [u8]]) -> Result<ProclaimRequest<'a>, LockError> {
    let mut args = ArgCursor::new(argv, 4, 4)?;
    let key = args.key()?;
    let owner = args.owner()?;
    let epoch = parse_positive(args.bytes()?).ok_or(LockError::NotAnInteger)?;
    let value = proclaimed_value(args.bytes()?)?;
    args.finish()?;
    Ok(ProclaimRequest {
        key,
        owner,
        epoch,
        value,
    })
}

fn proclaimed_value(value: &[u8]) -> Result<&[u8], LockError> {
    if value.len() > crate::election::MAX_VALUE_BYTES {
        return Err(LockError::ValueTooLong {
            max: crate::election::MAX_VALUE_BYTES as u64,
        });
    }
    Ok(value)
}

fn wait_timeout(timeout: &[u8]) -> Result<Wait, LockError> {
    let timeout = parse_i64(timeout).ok_or(LockError::NotAnInteger)?;
    match u64::try_from(timeout) {
        Ok(0) => Ok(Wait::Forever),
        Ok(ms) if ms <= MAX_WAIT_TIMEOUT_MS => Ok(Wait::For(ms)),
        _ => Err(LockError::TimeoutOutOfRange),
    }
}

/// A multi-key release or renew: its keys, the owner, and the lease (renew only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiOwnerRequest<'a> {
    pub keys: Vec<&'a [u8]>,
    pub owner: &'a [u8],
    pub lease_ms: u64,
}

/// `LOCK.MRELEASE numkeys key [key ...] owner`
pub fn parse_mrelease<'a>(argv: &'a [&'a [u8]]) -> Result<MultiOwnerRequest<'a>, LockError> {
    let mut args = ArgCursor::new(argv, 3, usize::MAX)?;
    let keys = args.keys()?;
    let owner = args.owner()?;
    args.finish()?;
    Ok(MultiOwnerRequest {
        keys,
        owner,
        lease_ms: 0,
    })
}

/// `LOCK.MRENEW numkeys key [key ...] owner lease-ms`
pub fn parse_mrenew<'a>(
    argv: &'a [&'a [u8]],
    max_lease_ms: u64,
) -> Result<MultiOwnerRequest<'a>, LockError> {
    let mut args = ArgCursor::new(argv, 4, usize::MAX)?;
    let keys = args.keys()?;
    let owner = args.owner()?;
    let lease_ms = args.lease(max_lease_ms)?;
    args.finish()?;
    Ok(MultiOwnerRequest {
        keys,
        owner,
        lease_ms,
    })
}

/// The options of an acquire, one or many keys.
struct AcquireOptions {
    wait: Wait,
    waiting: Waiting,
    reentry: Reentry,
    mode: Mode,
    binding: Binding,
}

fn acquire_options(args: &mut ArgCursor<'_>) -> Result<AcquireOptions, LockError> {
    let mut wait = Wait::No;
    let mut waiting = Waiting::Blocked;
    let mut reentry = Reentry::Counted;
    let mut mode = Mode::Exclusive;
    let mut binding = Binding::Lease;
    while let Some(option) = args.option() {
        if option.eq_ignore_ascii_case(b"ONCE") && reentry == Reentry::Counted {
            reentry = Reentry::Once;
        } else if option.eq_ignore_ascii_case(b"SHARED") && mode == Mode::Exclusive {
            mode = Mode::Shared;
        } else if option.eq_ignore_ascii_case(b"EPHEMERAL") && binding == Binding::Lease {
            binding = Binding::Connection;
        } else if option.eq_ignore_ascii_case(b"LIMIT") && mode == Mode::Exclusive {
            let limit = args.bytes().map_err(|_| LockError::Syntax)?;
            let limit = parse_i64(limit).ok_or(LockError::NotAnInteger)?;
            mode = match u64::try_from(limit) {
                Ok(n) if (1..=MAX_LIMIT).contains(&n) => Mode::Limit(n),
                _ => return Err(LockError::LimitOutOfRange),
            };
        } else if option.eq_ignore_ascii_case(b"WAIT") && wait == Wait::No {
            wait = wait_timeout(args.bytes().map_err(|_| LockError::Syntax)?)?;
        } else if option.eq_ignore_ascii_case(b"TICKET") && waiting == Waiting::Blocked {
            waiting = Waiting::Ticket;
        } else {
            return Err(LockError::Syntax);
        }
    }
    if waiting == Waiting::Ticket && wait == Wait::No {
        return Err(LockError::TicketNeedsWait);
    }
    Ok(AcquireOptions {
        wait,
        waiting,
        reentry,
        mode,
        binding,
    })
}

/// `LOCK.RELEASE key owner`
pub fn parse_release<'a>(argv: &'a [&'a [u8]]) -> Result<ReleaseRequest<'a>, LockError> {
    let mut args = ArgCursor::new(argv, 2, 4)?;
    let key = args.key()?;
    let owner = args.owner()?;
    let token = match args.option() {
        None => None,
        Some(option) if option.eq_ignore_ascii_case(b"TOKEN") => {
            let token = args.integer()?;
            Some(u64::try_from(token).map_err(|_| LockError::NotAnInteger)?)
        }
        Some(_) => return Err(LockError::Syntax),
    };
    args.finish()?;
    Ok(ReleaseRequest { key, owner, token })
}

/// `LOCK.RENEW key owner lease-ms`
pub fn parse_renew<'a>(
    argv: &'a [&'a [u8]],
    max_lease_ms: u64,
) -> Result<RenewRequest<'a>, LockError> {
    let mut args = ArgCursor::new(argv, 3, 3)?;
    let key = args.key()?;
    let owner = args.owner()?;
    let lease_ms = args.lease(max_lease_ms)?;
    args.finish()?;
    Ok(RenewRequest {
        key,
        owner,
        lease_ms,
    })
}

/// `LOCK.CANCEL ticket`: the ticket, named as the module names them (in the database the
/// command runs in).
pub fn parse_cancel(argv: &[&[u8]], db: i32) -> Result<crate::ticket::TicketName, LockError> {
    let mut args = ArgCursor::new(argv, 1, 1)?;
    let name = args.bytes()?;
    args.finish()?;
    crate::ticket::TicketName::parse(name, db).ok_or(LockError::NotATicket)
}

/// `LOCK.CHECK key owner token`, and the fence `LOCK.GUARD` checks before its command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceRequest<'a> {
    pub key: &'a [u8],
    pub owner: &'a [u8],
    /// As given: any integer (one that is not positive matches no hold).
    pub token: i64,
}

/// `LOCK.GUARD key owner token command [arg ...]`: the fence, and the inner command's name.
/// The inner command's arguments are its own: Redis parses them when it runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardRequest<'a> {
    pub fence: FenceRequest<'a>,
    pub command: &'a [u8],
}

/// Where `LOCK.GUARD`'s inner command starts (its name; its arguments follow).
pub const GUARDED_COMMAND_AT: usize = 4;

/// `LOCK.CHECK key owner token`
pub fn parse_check<'a>(argv: &'a [&'a [u8]]) -> Result<FenceRequest<'a>, LockError> {
    let mut args = ArgCursor::new(argv, 3, 3)?;
    let fence = fence(&mut args)?;
    args.finish()?;
    Ok(fence)
}

/// `LOCK.GUARD key owner token command [arg ...]`
pub fn parse_guard<'a>(argv: &'a [&'a [u8]]) -> Result<GuardRequest<'a>, LockError> {
    let mut args = ArgCursor::new(argv, GUARDED_COMMAND_AT, usize::MAX)?;
    let fence = fence(&mut args)?;
    let command = args.bytes()?;
    Ok(GuardRequest { fence, command })
}

fn fence<'a>(args: &mut ArgCursor<'a>) -> Result<FenceRequest<'a>, LockError> {
    let key = args.key()?;
    let owner = args.owner()?;
    let token = args.integer()?;
    Ok(FenceRequest { key, owner, token })
}

/// `LOCK.INFO key` and `LOCK.FORCERELEASE key`
pub fn parse_key_only<'a>(argv: &'a [&'a [u8]]) -> Result<&'a [u8], LockError> {
    let mut args = ArgCursor::new(argv, 1, 1)?;
    let key = args.key()?;
    args.finish()?;
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(line: &str) -> Vec<Vec<u8>> {
        line.split(' ').map(|s| s.as_bytes().to_vec()).collect()
    }

    /// (key, owner, lease, wait, re-entry) of a parsed acquire.
    type Parsed = (Vec<u8>, Vec<u8>, u64, Wait, Reentry);

    fn acquire(line: &str) -> Result<(Vec<u8>, Vec<u8>, u64, Wait), LockError> {
        acquire_full(line).map(|r| (r.0, r.1, r.2, r.3))
    }

    fn acquire_full(line: &str) -> Result<Parsed, LockError> {
        let owned = argv(line);
        let refs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        parse_acquire(&refs, 10_000).map(|r| {
            (
                r.key.to_vec(),
                r.owner.to_vec(),
                r.lease_ms,
                r.wait,
                r.reentry,
            )
        })
    }

    #[test]
    fn once_is_an_option_in_any_order_and_only_once() {
        let cases = [
            ("LOCK.ACQUIRE k o 100", Wait::No, Reentry::Counted),
            ("LOCK.ACQUIRE k o 100 ONCE", Wait::No, Reentry::Once),
            (
                "LOCK.ACQUIRE k o 100 once WAIT 5",
                Wait::For(5),
                Reentry::Once,
            ),
            (
                "LOCK.ACQUIRE k o 100 WAIT 0 Once",
                Wait::Forever,
                Reentry::Once,
            ),
        ];
        for (line, wait, reentry) in cases {
            assert_eq!(
                acquire_full(line).map(|r| (r.3, r.4)),
                Ok((wait, reentry)),
                "{line}"
            );
        }
        assert_eq!(
            acquire_full("LOCK.ACQUIRE k o 100 ONCE ONCE"),
            Err(LockError::Syntax)
        );
        assert_eq!(
            acquire_full("LOCK.ACQUIRE k o 100 ONCE WAIT"),
            Err(LockError::Syntax)
        );
    }

    #[test]
    fn ticket_is_an_option_of_a_wait_in_any_order() {
        let parse = |line: &str| {
            let owned = argv(line);
            let refs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
            parse_acquire(&refs, 10_000).map(|r| (r.wait, r.waiting))
        };
        let cases = [
            (
                "LOCK.ACQUIRE k o 100 WAIT 5",
                Ok((Wait::For(5), Waiting::Blocked)),
            ),
            (
                "LOCK.ACQUIRE k o 100 WAIT 5 TICKET",
                Ok((Wait::For(5), Waiting::Ticket)),
            ),
            (
                "LOCK.ACQUIRE k o 100 ticket wait 0",
                Ok((Wait::Forever, Waiting::Ticket)),
            ),
            (
                "LOCK.ACQUIRE k o 100 TICKET",
                Err(LockError::TicketNeedsWait),
            ),
            (
                "LOCK.ACQUIRE k o 100 WAIT 5 TICKET TICKET",
                Err(LockError::Syntax),
            ),
        ];
        for (line, want) in cases {
            assert_eq!(parse(line), want, "{line}");
        }
        let campaign = |line: &str| {
            let owned = argv(line);
            let refs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
            parse_campaign(&refs, 10_000).map(|r| (r.acquire.wait, r.acquire.waiting))
        };
        assert_eq!(
            campaign("LOCK.CAMPAIGN k c 100 TICKET WAIT 7 VALUE v"),
            Ok((Wait::For(7), Waiting::Ticket))
        );
        assert_eq!(
            campaign("LOCK.CAMPAIGN k c 100 TICKET"),
            Err(LockError::TicketNeedsWait)
        );
        let owned = argv("LOCK.MACQUIRE 2 a b o 100 WAIT 3 TICKET");
        let refs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        let requests = parse_macquire(&refs, 10_000).unwrap();
        assert!(requests.iter().all(|r| r.waiting == Waiting::Ticket));
    }

    #[test]
    fn cancel_takes_one_ticket_name() {
        let ticket = crate::ticket::TicketName {
            id: 9,
            db: 2,
            slot: crate::slot::key_slot(b"k"),
            shape: crate::ticket::Shape::One,
        };
        let name = ticket.key();
        let line: [&[u8]; 2] = [b"LOCK.CANCEL", &name];
        assert_eq!(parse_cancel(&line, 2), Ok(ticket));
        let line: [&[u8]; 2] = [b"LOCK.CANCEL", b"k"];
        assert_eq!(parse_cancel(&line, 2), Err(LockError::NotATicket));
        let line: [&[u8]; 3] = [b"LOCK.CANCEL", &name, b"x"];
        assert!(matches!(
            parse_cancel(&line, 2),
            Err(LockError::WrongArity(_))
        ));
    }

    #[test]
    fn shared_limit_and_ephemeral_are_options_in_any_order() {
        let parse = |line: &str| {
            let owned = argv(line);
            let refs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
            parse_acquire(&refs, 10_000).map(|r| (r.mode, r.binding, r.wait))
        };
        let cases = [
            (
                "LOCK.ACQUIRE k o 100",
                Ok((Mode::Exclusive, Binding::Lease, Wait::No)),
            ),
            (
                "LOCK.ACQUIRE k o 100 SHARED",
                Ok((Mode::Shared, Binding::Lease, Wait::No)),
            ),
            (
                "LOCK.ACQUIRE k o 100 wait 5 shared ephemeral",
                Ok((Mode::Shared, Binding::Connection, Wait::For(5))),
            ),
            (
                "LOCK.ACQUIRE k o 100 LIMIT 3",
                Ok((Mode::Limit(3), Binding::Lease, Wait::No)),
            ),
            (
                "LOCK.ACQUIRE k o 100 EPHEMERAL LIMIT 1000 WAIT 0",
                Ok((Mode::Limit(1_000), Binding::Connection, Wait::Forever)),
            ),
            (
                "LOCK.ACQUIRE k o 100 LIMIT 0",
                Err(LockError::LimitOutOfRange),
            ),
            (
                "LOCK.ACQUIRE k o 100 LIMIT 1001",
                Err(LockError::LimitOutOfRange),
            ),
            (
                "LOCK.ACQUIRE k o 100 LIMIT -1",
                Err(LockError::LimitOutOfRange),
            ),
            ("LOCK.ACQUIRE k o 100 LIMIT x", Err(LockError::NotAnInteger)),
            ("LOCK.ACQUIRE k o 100 LIMIT", Err(LockError::Syntax)),
            (
                "LOCK.ACQUIRE k o 100 SHARED LIMIT 2",
                Err(LockError::Syntax),
            ),
            (
                "LOCK.ACQUIRE k o 100 LIMIT 2 SHARED",
                Err(LockError::Syntax),
            ),
            ("LOCK.ACQUIRE k o 100 SHARED SHARED", Err(LockError::Syntax)),
            (
                "LOCK.ACQUIRE k o 100 LIMIT 2 LIMIT 2",
                Err(LockError::Syntax),
            ),
            (
                "LOCK.ACQUIRE k o 100 EPHEMERAL EPHEMERAL",
                Err(LockError::Syntax),
            ),
            ("LOCK.ACQUIRE k __mode__ 100", Err(LockError::ReservedOwner)),
            ("LOCK.ACQUIRE k mode 100", Err(LockError::ReservedOwner)),
        ];
        for (line, want) in cases {
            assert_eq!(parse(line), want, "{line}");
        }
    }

    #[test]
    fn acquire_parses_every_accepted_form() {
        let cases = [
            ("LOCK.ACQUIRE k o 100", Wait::No),
            ("LOCK.ACQUIRE k o 100 WAIT 0", Wait::Forever),
            ("LOCK.ACQUIRE k o 100 wait 250", Wait::For(250)),
            ("lock.acquire k o 100 WaIt 1", Wait::For(1)),
        ];
        for (line, wait) in cases {
            assert_eq!(
                acquire(line),
                Ok((b"k".to_vec(), b"o".to_vec(), 100, wait)),
                "{line}"
            );
        }
    }

    #[test]
    fn acquire_rejects_bad_input_with_the_right_error() {
        let max = LockError::LeaseOutOfRange { max_ms: 10_000 };
        let arity = LockError::WrongArity("lock.acquire".into());
        let cases = [
            ("LOCK.ACQUIRE k o", arity.clone()),
            ("LOCK.ACQUIRE", arity.clone()),
            ("LOCK.ACQUIRE k", arity),
            ("LOCK.ACQUIRE k o 1 WAIT 1 x", LockError::Syntax),
            ("LOCK.ACQUIRE k o abc", LockError::NotAnInteger),
            ("LOCK.ACQUIRE k o 1.5", LockError::NotAnInteger),
            ("LOCK.ACQUIRE k o +5", LockError::NotAnInteger),
            ("LOCK.ACQUIRE k o 05", LockError::NotAnInteger),
            (
                "LOCK.ACQUIRE k o 99999999999999999999",
                LockError::NotAnInteger,
            ),
            ("LOCK.ACQUIRE k o 0", max.clone()),
            ("LOCK.ACQUIRE k o -1", max.clone()),
            ("LOCK.ACQUIRE k o 10001", max),
            ("LOCK.ACQUIRE k  100", LockError::EmptyOwner),
            ("LOCK.ACQUIRE k o 100 WAIT", LockError::Syntax),
            ("LOCK.ACQUIRE k o 100 NOWAIT 5", LockError::Syntax),
            ("LOCK.ACQUIRE k o 100 WAIT 5 WAIT", LockError::Syntax),
            ("LOCK.ACQUIRE k o 100 WAIT -1", LockError::TimeoutOutOfRange),
            ("LOCK.ACQUIRE k o 100 WAIT x", LockError::NotAnInteger),
            (
                "LOCK.ACQUIRE k o 100 WAIT 3153600000000000",
                LockError::TimeoutOutOfRange,
            ),
        ];
        for (line, err) in cases {
            assert_eq!(acquire(line), Err(err), "{line}");
        }
    }

    #[test]
    fn every_command_refuses_a_key_in_the_counter_namespace() {
        let key: &[u8] = b"__lock_fence__{foo}";
        let acquire: Vec<&[u8]> = vec![b"LOCK.ACQUIRE", key, b"o", b"5"];
        assert_eq!(parse_acquire(&acquire, 10), Err(LockError::ReservedKey));
        let release: Vec<&[u8]> = vec![b"LOCK.RELEASE", key, b"o"];
        assert_eq!(parse_release(&release), Err(LockError::ReservedKey));
        let renew: Vec<&[u8]> = vec![b"LOCK.RENEW", key, b"o", b"5"];
        assert_eq!(parse_renew(&renew, 10), Err(LockError::ReservedKey));
        let info: Vec<&[u8]> = vec![b"LOCK.INFO", key];
        assert_eq!(parse_key_only(&info), Err(LockError::ReservedKey));
    }

    #[test]
    fn owner_equal_to_the_fence_field_is_refused() {
        let refs: Vec<&[u8]> = vec![b"LOCK.RELEASE", b"k", crate::layout::FENCE_FIELD];
        assert_eq!(parse_release(&refs), Err(LockError::ReservedOwner));
    }

    #[test]
    fn release_takes_an_optional_token() {
        let parse = |line: &str| {
            let words: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
            parse_release(&words).map(|r| r.token)
        };
        assert_eq!(parse("LOCK.RELEASE k o"), Ok(None));
        assert_eq!(parse("LOCK.RELEASE k o TOKEN 17"), Ok(Some(17)));
        assert_eq!(parse("LOCK.RELEASE k o token 17"), Ok(Some(17)));
        assert_eq!(
            parse("LOCK.RELEASE k o TOKEN -1"),
            Err(LockError::NotAnInteger)
        );
        assert_eq!(
            parse("LOCK.RELEASE k o TOKEN x"),
            Err(LockError::NotAnInteger)
        );
        assert_eq!(parse("LOCK.RELEASE k o FOO 1"), Err(LockError::Syntax));
        assert!(matches!(
            parse("LOCK.RELEASE k o TOKEN"),
            Err(LockError::WrongArity(_))
        ));
    }

    #[test]
    fn release_renew_and_key_only_check_arity() {
        let r: Vec<&[u8]> = vec![b"LOCK.RELEASE", b"k"];
        assert!(matches!(parse_release(&r), Err(LockError::WrongArity(_))));
        let r: Vec<&[u8]> = vec![b"LOCK.RENEW", b"k", b"o", b"5", b"x"];
        assert!(matches!(parse_renew(&r, 10), Err(LockError::WrongArity(_))));
        let r: Vec<&[u8]> = vec![b"LOCK.INFO"];
        assert!(matches!(parse_key_only(&r), Err(LockError::WrongArity(_))));
        let r: Vec<&[u8]> = vec![b"LOCK.INFO", b"\0binary\xff"];
        assert_eq!(parse_key_only(&r), Ok(&b"\0binary\xff"[..]));
    }

    #[test]
    fn check_and_guard_parse_their_fence() {
        let line: Vec<&[u8]> = vec![b"LOCK.CHECK", b"k", b"o", b"-3"];
        assert_eq!(
            parse_check(&line),
            Ok(FenceRequest {
                key: b"k",
                owner: b"o",
                token: -3
            })
        );
        let line: Vec<&[u8]> = vec![b"LOCK.GUARD", b"k", b"o", b"17", b"SET", b"d", b"v"];
        let guard = parse_guard(&line).unwrap();
        assert_eq!(guard.fence.token, 17);
        assert_eq!(guard.command, b"SET");
        assert_eq!(line[GUARDED_COMMAND_AT], b"SET");
        // The inner command's arguments are its own business: anything may follow.
        let line: Vec<&[u8]> = vec![b"LOCK.GUARD", b"k", b"o", b"17", b"PING"];
        assert_eq!(parse_guard(&line).unwrap().command, b"PING");
    }

    #[test]
    fn check_and_guard_refuse_what_every_command_refuses() {
        type Case = (Vec<&'static [u8]>, LockError);
        let cases: Vec<Case> = vec![
            (
                vec![b"LOCK.CHECK", b"k", b"o"],
                LockError::WrongArity("lock.check".into()),
            ),
            (
                vec![b"LOCK.CHECK", b"k", b"o", b"1", b"x"],
                LockError::WrongArity("lock.check".into()),
            ),
            (
                vec![b"LOCK.GUARD", b"k", b"o", b"1"],
                LockError::WrongArity("lock.guard".into()),
            ),
            (
                vec![b"LOCK.CHECK", b"k", b"o", b"1.5"],
                LockError::NotAnInteger,
            ),
            (
                vec![b"LOCK.GUARD", b"k", b"o", b"abc", b"GET", b"d"],
                LockError::NotAnInteger,
            ),
            (vec![b"LOCK.CHECK", b"k", b"", b"1"], LockError::EmptyOwner),
            (
                vec![b"LOCK.GUARD", b"k", b"mode", b"1", b"GET", b"d"],
                LockError::ReservedOwner,
            ),
            (
                vec![b"LOCK.CHECK", b"__lock_fence__{x}", b"o", b"1"],
                LockError::ReservedKey,
            ),
        ];
        for (line, expected) in cases {
            let got = match line.first() {
                Some(&b"LOCK.CHECK") => parse_check(&line).map(drop),
                _ => parse_guard(&line).map(drop),
            };
            assert_eq!(got, Err(expected), "{line:?}");
        }
    }
}
