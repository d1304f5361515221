//! The one error type of the crate.

use std::fmt;
use std::time::Duration;

use crate::lost::LostReason;

/// Everything that can go wrong when taking, keeping or releasing a lock.
#[derive(Debug)]
#[non_exhaustive]
pub enum LockError {
    /// The hold is not ours any more: it was lost before this call (`lost` says why, when the
    /// library knows), or the server answered that the owner does not hold the key.
    NotHeld {
        /// Why the hold was lost, when the library saw it happen.
        lost: Option<LostReason>,
    },
    /// The server refused a fenced command (`LOCK.GUARD` answered `FENCED`): the hold is gone
    /// ([`LostReason::HoldGone`]) or the owner holds the key under another token
    /// ([`LostReason::TokenNotCurrent`]). **The command did not run**, and the guard now
    /// reports the hold lost with that reason.
    Fenced {
        /// What the server said of the hold.
        lost: LostReason,
    },
    /// The lock was granted, but fewer replicas acknowledged the grant than
    /// [`Lock::replicas`](crate::Lock::replicas) asks (or the AOF fsyncs
    /// [`Lock::wait_aof`](crate::Lock::wait_aof) asks did not happen) within its timeout: the
    /// grant could be lost in a failover, so it is **not safely acquired**. The library
    /// released it; acquire again (the next grant has another token).
    NotSafelyAcquired {
        /// The fencing tokens of the grant that was released (one per key, in the keys' order).
        tokens: Vec<u64>,
        /// How many replicas acknowledged (fsynced, for `WAITAOF`).
        acknowledged: u32,
        /// How many were asked.
        wanted: u32,
        /// What was missing, in words: `0 of 1 replicas acknowledged within 500 ms (WAIT)`, or
        /// the server's refusal of `WAIT`/`WAITAOF`.
        why: String,
    },
    /// [`Lock::acquire`](crate::Lock::acquire) waited its whole wait timeout and another owner
    /// still holds the key.
    Timeout {
        /// How long the server was asked to wait.
        waited: Duration,
    },
    /// The server refused the command; the text is the server's own error line (for example
    /// `ERR the key is a read-write lock; acquire it without LIMIT`).
    Server(String),
    /// The server's ACL refused a command the library sent (`NOPERM`): the user the client
    /// connected as lacks a rule. `command` is the command refused (`LOCK.CHECK`,
    /// `CLIENT|SETNAME`, ...), `message` the server's error line; [`LockError::missing_rule`]
    /// says what to add. A renewal or check refused so ends the hold on this side
    /// ([`LostReason::NoPermission`], released in the background): the library cannot keep it.
    /// A subscription refused (`SUBSCRIBE`/`SSUBSCRIBE` of a lost-hold channel) names its
    /// `channel`: the acquire that needed it returns this error, its grant released.
    NoPermission {
        /// The command refused, upper case (`LOCK.CHECK`, `CLIENT|SETNAME`, `SUBSCRIBE`).
        command: String,
        /// The server's error line (`NOPERM User app has no permissions to run the 'lock.check'
        /// command`).
        message: String,
        /// The channel refused, for a subscription (`lock.lost:{app:42}`); the rule to add is
        /// then `&<channel>`.
        channel: Option<String>,
    },
    /// The server could not be reached, the connection broke, or a reply did not arrive in time.
    Connection(redis::RedisError),
    /// An argument the library can check before sending anything (a zero lease).
    InvalidArgument(&'static str),
    /// The server answered something LOCK.* never answers (a module that is not loaded answers
    /// with [`LockError::Server`] instead).
    UnexpectedReply(String),
    /// What was asked cannot be done on this server's backend (the `redislock` Functions
    /// library: shared holds, semaphores, multi-key locks, `EPHEMERAL` holds, fenced commands,
    /// elections, the lost-hold signal asked for by name), or the server has neither the module
    /// nor the library (and the client may not load it:
    /// [`LockClientBuilder::load_functions`](crate::LockClientBuilder::load_functions)). Raised
    /// before anything is sent for the call; the text says what to use instead.
    NotSupported(String),
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::NotHeld { lost: Some(reason) } => {
                write!(f, "the lock is not held any more: {reason}")
            }
            LockError::NotHeld { lost: None } => {
                write!(
                    f,
                    "the lock is not held (the server does not know this owner)"
                )
            }
            LockError::Fenced { lost } => {
                write!(f, "fenced out, the command did not run: {lost}")
            }
            LockError::NotSafelyAcquired { tokens, why, .. } => {
                write!(f, "not safely acquired (token {tokens:?}, released): {why}")
            }
            LockError::Timeout { waited } => {
                write!(
                    f,
                    "the lock was not granted within {} ms",
                    waited.as_millis()
                )
            }
            LockError::Server(text) => write!(f, "server error: {text}"),
            LockError::NoPermission {
                command,
                message,
                channel: None,
            } => write!(
                f,
                "the ACL refused {command} ({message}): the user needs {}",
                missing_rule(command, message)
            ),
            LockError::NoPermission {
                command,
                message,
                channel: Some(channel),
            } => write!(
                f,
                "the ACL refused {command} {channel} ({message}): the user needs &{channel}"
            ),
            LockError::Connection(e) => write!(f, "connection error: {e}"),
            LockError::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
            LockError::UnexpectedReply(what) => write!(f, "unexpected reply: {what}"),
            LockError::NotSupported(what) => write!(f, "not supported: {what}"),
        }
    }
}

impl std::error::Error for LockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LockError::Connection(e) => Some(e),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for LockError {
    /// Server error replies become [`LockError::Server`] with the server's text; everything
    /// else (I/O, timeouts, parse failures) is [`LockError::Connection`].
    fn from(e: redis::RedisError) -> Self {
        match e.code() {
            Some("NOPERM") => {
                let message = match e.detail() {
                    Some(detail) => format!("NOPERM {detail}"),
                    None => "NOPERM".to_string(),
                };
                LockError::NoPermission {
                    command: refused_command(&message).unwrap_or_default(),
                    message,
                    channel: None,
                }
            }
            Some(code) => match e.detail() {
                Some(detail) => LockError::Server(format!("{code} {detail}")),
                None => LockError::Server(code.to_string()),
            },
            None => LockError::Connection(e),
        }
    }
}

impl LockError {
    /// For [`LockError::NoPermission`], the ACL rule the user lacks: `+lock.check` for a
    /// command, `&<channel>` for a subscription refused, a key pattern (`~...`) or a channel
    /// (`&...`) otherwise.
    pub fn missing_rule(&self) -> Option<String> {
        match self {
            LockError::NoPermission {
                channel: Some(channel),
                ..
            } => Some(format!("&{channel}")),
            LockError::NoPermission {
                command, message, ..
            } => Some(missing_rule(command, message)),
            _ => None,
        }
    }

    /// A refusal (`NOPERM`) of `cmd`, named after it when the server's line does not name the
    /// command (a key or a channel refused); any other error as it is.
    pub(crate) fn sent_as(self, cmd: &redis::Cmd) -> LockError {
        match self {
            LockError::NoPermission {
                command,
                message,
                channel,
            } if command.is_empty() => LockError::NoPermission {
                command: command_name(cmd),
                message,
                channel,
            },
            e => e,
        }
    }

    /// True for errors after which the same request may be sent again on a new connection:
    /// the connection broke or timed out (the request may or may not have run).
    pub(crate) fn is_retryable(&self) -> bool {
        matches!(self, LockError::Connection(_))
    }
}

/// The name of `cmd` (its first argument), upper case.
pub(crate) fn command_name(cmd: &redis::Cmd) -> String {
    match cmd.args_iter().next() {
        Some(redis::Arg::Simple(name)) => String::from_utf8_lossy(name).to_ascii_uppercase(),
        _ => String::new(),
    }
}

/// The command a `NOPERM` line names (`... to run the 'lock.check' command`), upper case.
pub(crate) fn refused_command(message: &str) -> Option<String> {
    let (_, rest) = message.split_once("to run the '")?;
    let (name, _) = rest.split_once('\'')?;
    Some(name.to_ascii_uppercase())
}

/// The rule a `NOPERM` line says is missing: the command's (`+lock.check`,
/// `+client|setname`), or a key pattern or a channel.
pub(crate) fn missing_rule(command: &str, message: &str) -> String {
    let lower = message.to_ascii_lowercase();
    if lower.contains("given to lock.guard") {
        "the fenced command's own rules (+command, ~keys, &channels)".to_string()
    } else if lower.contains("key") {
        format!("a key pattern (~...) covering the keys of {command}")
    } else if lower.contains("channel") {
        format!("the channel (&...) {command} names")
    } else {
        format!("+{}", command.to_ascii_lowercase())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noperm(detail: &str) -> LockError {
        LockError::from(redis::make_extension_error(
            "NOPERM".into(),
            Some(detail.to_string()),
        ))
    }

    #[test]
    fn refusals_name_the_command_and_the_missing_rule() {
        let cases = [
            // Redis >= 7.2 and Valkey, then Redis 7.0.
            (
                "User app has no permissions to run the 'lock.check' command",
                "LOCK.CHECK",
                "+lock.check",
            ),
            (
                "this user has no permissions to run the 'client|setname' command",
                "CLIENT|SETNAME",
                "+client|setname",
            ),
            (
                "this user has no permissions to run the command given to LOCK.GUARD, or to access one of its keys or channels",
                "LOCK.GUARD",
                "the fenced command's own rules (+command, ~keys, &channels)",
            ),
            (
                "No permissions to access a key",
                "LOCK.ACQUIRE",
                "a key pattern (~...) covering the keys of LOCK.ACQUIRE",
            ),
            (
                "this user has no permissions to access one of the channels used as arguments",
                "SUBSCRIBE",
                "the channel (&...) SUBSCRIBE names",
            ),
        ];
        for (detail, command, rule) in cases {
            let e = noperm(detail).sent_as(redis::cmd(command).arg("k"));
            match &e {
                LockError::NoPermission {
                    command: c,
                    message,
                    channel: None,
                } => {
                    assert_eq!(c, command, "{detail}");
                    assert_eq!(message, &format!("NOPERM {detail}"));
                }
                other => panic!("{detail}: {other:?}"),
            }
            assert_eq!(e.missing_rule().as_deref(), Some(rule), "{detail}");
            assert!(e.to_string().contains(rule), "{e}");
        }
    }
}
