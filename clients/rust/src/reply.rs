//! What the server's replies say, read without I/O: an acquire's tokens, a renewal's and a
//! check's answer about a hold, a release's outcome.

use std::time::Duration;

use redis::Value;

use crate::error::LockError;
use crate::lost::LostReason;
use crate::machine::Answer;

/// An acquire's reply: a token > 0 (`LOCK.ACQUIRE`, `LOCK.CAMPAIGN`), an array of `keys`
/// tokens (`LOCK.MACQUIRE`), or nil.
pub(crate) fn tokens(reply: Value, keys: usize) -> Result<Option<Vec<u64>>, LockError> {
    let token = |v: &Value| match v {
        Value::Int(n) if *n > 0 => u64::try_from(*n).ok(),
        _ => None,
    };
    let tokens = match &reply {
        Value::Nil => return Ok(None),
        Value::Array(items) if items.len() == keys => items.iter().map(token).collect(),
        single => token(single).map(|t| vec![t]),
    };
    match tokens {
        Some(tokens) => Ok(Some(tokens)),
        None => Err(LockError::UnexpectedReply(format!(
            "the acquire answered {reply:?}"
        ))),
    }
}

/// A renewal's answer (`LOCK.RENEW` → 1/0, `LOCK.MRENEW` → an array of them): every key renewed
/// for `lease` from when it ran, or the hold gone (`0` on any key: the hold is all its keys or
/// nothing; or an error after which the hold cannot be there, such as `WRONGTYPE`), or refused
/// by the ACL (`NOPERM`), or nothing known (no answer, `LOADING`, `BUSY`, a pause, ...).
pub(crate) fn renewal(reply: &Result<Value, LockError>, lease: Duration) -> Answer {
    match reply {
        Ok(Value::Int(1)) => Answer::Holds(Some(lease)),
        Ok(Value::Int(0)) => Answer::Gone,
        Ok(Value::Array(items)) if !items.is_empty() => {
            let mut all = true;
            for item in items {
                match item {
                    Value::Int(1) => {}
                    Value::Int(0) => all = false,
                    _ => return Answer::Nothing,
                }
            }
            if all {
                Answer::Holds(Some(lease))
            } else {
                Answer::Gone
            }
        }
        Err(LockError::Server(text)) if is_final(text) => Answer::Gone,
        Err(LockError::NoPermission { .. }) => Answer::Refused,
        _ => Answer::Nothing,
    }
}

/// Server errors after which the hold cannot be there any more (as opposed to LOADING, BUSY,
/// MASTERDOWN, a pause, a redirect, ... which pass).
pub(crate) fn is_final(text: &str) -> bool {
    (text.starts_with("ERR ") && !text.contains("paused")) || text.starts_with("WRONGTYPE")
}

/// What a release's reply says: `Some(true)` the server released every key (`remaining`, or an
/// array of them), `Some(false)` it did not have the hold on some key (nil anywhere: the others
/// were released all the same), `None` a reply no release gives.
pub(crate) fn released(reply: &Value) -> Option<bool> {
    match reply {
        Value::Int(_) => Some(true),
        Value::Nil => Some(false),
        Value::Array(items) if !items.is_empty() => {
            let mut all = true;
            for item in items {
                match item {
                    Value::Int(_) => {}
                    Value::Nil => all = false,
                    _ => return None,
                }
            }
            Some(all)
        }
        _ => None,
    }
}

/// What a `LOCK.INFO` reply (nil, or name/value pairs as a RESP2 flat array or a RESP3 map)
/// says of the hold (`owner`, `token`): there, with its `ttl` when it has one
/// ([`NO_LEASE`](crate::machine::NO_LEASE) for `-1`: no lease on the server); gone (the key
/// is free, or `holders` does not list the owner with this token); nothing known (a reply
/// LOCK.INFO never gives, or an error).
pub(crate) fn holder(reply: &Result<Value, LockError>, owner: &[u8], token: u64) -> Answer {
    let reply = match reply {
        Ok(Value::Nil) => return Answer::Gone,
        Ok(reply) => reply,
        Err(LockError::Server(text)) if text.starts_with("WRONGTYPE") => return Answer::Gone,
        Err(LockError::NoPermission { .. }) => return Answer::Refused,
        Err(_) => return Answer::Nothing,
    };
    let Some(Value::Array(holders)) = field(reply, b"holders") else {
        return Answer::Nothing;
    };
    let found = holders.iter().find(|h| {
        matches!(field(h, b"owner"), Some(Value::BulkString(o)) if o.as_slice() == owner)
            && matches!(field(h, b"token"), Some(Value::Int(t)) if u64::try_from(*t).ok() == Some(token))
    });
    match found {
        None => Answer::Gone,
        Some(h) => Answer::Holds(match field(h, b"ttl") {
            Some(Value::Int(-1)) => Some(crate::machine::NO_LEASE),
            Some(Value::Int(ms)) => u64::try_from(*ms).ok().map(Duration::from_millis),
            _ => None,
        }),
    }
}

/// What `LOCK.CHECK key owner token` says: `1` there, `0` gone (`WRONGTYPE`: the key is no
/// lock any more), anything else nothing known.
pub(crate) fn checked(reply: &Result<Value, LockError>) -> Answer {
    match reply {
        Ok(Value::Int(1)) => Answer::Holds(None),
        Ok(Value::Int(0)) => Answer::Gone,
        Err(LockError::Server(text)) if text.starts_with("WRONGTYPE") => Answer::Gone,
        Err(LockError::NoPermission { .. }) => Answer::Refused,
        _ => Answer::Nothing,
    }
}

/// What a `FENCED` refusal of `LOCK.GUARD` says of the hold: gone, or held under another token
/// (`None`: not a refusal of the fence, such as the command's own error).
pub(crate) fn fence_refusal(text: &str) -> Option<LostReason> {
    let rest = text.strip_prefix("FENCED")?;
    if !(rest.is_empty() || rest.starts_with(' ')) {
        return None;
    }
    Some(
        if rest.trim_start().starts_with("the token is not current") {
            LostReason::TokenNotCurrent
        } else {
            LostReason::HoldGone
        },
    )
}

fn field<'a>(value: &'a Value, name: &[u8]) -> Option<&'a Value> {
    let is_name = |v: &Value| match v {
        Value::BulkString(b) => b.as_slice() == name,
        Value::SimpleString(s) => s.as_bytes() == name,
        _ => false,
    };
    match value {
        Value::Map(pairs) => pairs.iter().find(|(k, _)| is_name(k)).map(|(_, v)| v),
        Value::Array(items) => items.chunks(2).find_map(|pair| match pair {
            [k, v] if is_name(k) => Some(v),
            _ => None,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(3);

    #[test]
    fn renewals_answer_held_gone_or_nothing() {
        let server = |t: &str| Err(LockError::Server(t.into()));
        let cases: [(Result<Value, LockError>, Answer); 10] = [
            (Ok(Value::Int(1)), Answer::Holds(Some(LEASE))),
            (Ok(Value::Int(0)), Answer::Gone),
            (
                Ok(Value::Array(vec![Value::Int(1), Value::Int(1)])),
                Answer::Holds(Some(LEASE)),
            ),
            (
                Ok(Value::Array(vec![Value::Int(1), Value::Int(0)])),
                Answer::Gone,
            ),
            (server("WRONGTYPE Operation against a key"), Answer::Gone),
            (server("ERR not a lock"), Answer::Gone),
            (server("ERR the server is paused"), Answer::Nothing),
            (server("LOADING Redis is loading"), Answer::Nothing),
            (server("MOVED 3999 127.0.0.1:7001"), Answer::Nothing),
            (
                Err(LockError::NoPermission {
                    command: "LOCK.RENEW".into(),
                    message: "NOPERM User app has no permissions to run the 'lock.renew' command"
                        .into(),
                    channel: None,
                }),
                Answer::Refused,
            ),
        ];
        for (reply, want) in cases {
            assert_eq!(renewal(&reply, LEASE), want, "{reply:?}");
        }
    }

    #[test]
    fn info_is_read_in_both_protocols() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let resp2 = Value::Array(vec![
            bulk("mode"),
            bulk("exclusive"),
            bulk("holders"),
            Value::Array(vec![Value::Array(vec![
                bulk("owner"),
                bulk("me"),
                bulk("ttl"),
                Value::Int(1500),
                bulk("token"),
                Value::Int(7),
            ])]),
        ]);
        let resp3 = Value::Map(vec![(
            bulk("holders"),
            Value::Array(vec![Value::Map(vec![
                (bulk("owner"), bulk("me")),
                (bulk("ttl"), Value::Int(1500)),
                (bulk("token"), Value::Int(7)),
            ])]),
        )]);
        let there = Answer::Holds(Some(Duration::from_millis(1500)));
        for reply in [resp2, resp3] {
            let reply = Ok(reply);
            assert_eq!(holder(&reply, b"me", 7), there);
            assert_eq!(
                holder(&reply, b"me", 8),
                Answer::Gone,
                "a later hold of the owner"
            );
            assert_eq!(holder(&reply, b"you", 7), Answer::Gone);
        }
        assert_eq!(holder(&Ok(Value::Nil), b"me", 7), Answer::Gone);
        assert_eq!(holder(&Ok(Value::Int(3)), b"me", 7), Answer::Nothing);
        // No lease on the server (`ttl` -1): nothing ends the hold for time alone.
        let unending = Value::Array(vec![
            bulk("holders"),
            Value::Array(vec![Value::Array(vec![
                bulk("owner"),
                bulk("me"),
                bulk("ttl"),
                Value::Int(-1),
                bulk("token"),
                Value::Int(7),
            ])]),
        ]);
        assert_eq!(
            holder(&Ok(unending), b"me", 7),
            Answer::Holds(Some(crate::machine::NO_LEASE))
        );
    }

    #[test]
    fn checks_answer_there_gone_or_nothing() {
        assert_eq!(checked(&Ok(Value::Int(1))), Answer::Holds(None));
        assert_eq!(checked(&Ok(Value::Int(0))), Answer::Gone);
        assert_eq!(
            checked(&Err(LockError::Server("WRONGTYPE Operation".into()))),
            Answer::Gone
        );
        assert_eq!(
            checked(&Err(LockError::Server("LOADING loading".into()))),
            Answer::Nothing
        );
        let refused = LockError::NoPermission {
            command: "LOCK.CHECK".into(),
            message: "NOPERM User app has no permissions to run the 'lock.check' command".into(),
            channel: None,
        };
        assert_eq!(checked(&Err(refused)), Answer::Refused);
    }

    #[test]
    fn fence_refusals_say_gone_or_not_current_and_nothing_else_is_one() {
        let cases = [
            (
                "FENCED the hold is gone: the owner no longer holds this lock (released, expired, force-released, handed on or deleted); the command did not run",
                Some(LostReason::HoldGone),
            ),
            (
                "FENCED the token is not current: the owner holds this lock under another token; the command did not run",
                Some(LostReason::TokenNotCurrent),
            ),
            ("FENCED", Some(LostReason::HoldGone)),
            ("FENCEDX the token is not current", None),
            ("ERR a SHARED hold runs only read-only commands through LOCK.GUARD; SET writes", None),
            ("WRONGTYPE Operation against a key holding the wrong kind of value", None),
        ];
        for (text, want) in cases {
            assert_eq!(fence_refusal(text), want, "{text}");
        }
    }

    #[test]
    fn acquires_answer_tokens_or_nil() {
        assert_eq!(tokens(Value::Int(5), 1).unwrap(), Some(vec![5]));
        assert_eq!(tokens(Value::Nil, 1).unwrap(), None);
        assert_eq!(
            tokens(Value::Array(vec![Value::Int(5), Value::Int(6)]), 2).unwrap(),
            Some(vec![5, 6])
        );
        assert!(tokens(Value::Int(0), 1).is_err());
        assert!(tokens(Value::Array(vec![Value::Int(5)]), 2).is_err());
    }
}
