//! Grants and renewals acknowledged by replicas (`WAIT`) or by AOF fsyncs (`WAITAOF`): what to
//! send after the write, and whether the answers are enough. No I/O.
//!
//! `WAIT` waits for the calling connection's last write, so the library sends it on the
//! connection that just wrote: after a `LOCK.RENEW` (or `LOCK.MRENEW`) in one pipeline. A grant
//! is confirmed the same way, with a renewal then `WAIT`, also after an acquire answered at
//! once: a waiter's grant is written by whichever client freed the key, and an acquire sent
//! again (`ONCE`) on a new connection is answered without a write, so the acquire's own
//! connection may have nothing to wait for.

use std::time::Duration;

use redis::{Cmd, Value};

use crate::basics::millis;
use crate::error::LockError;

/// What a lock asks of its grants and renewals before they count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Acknowledgement {
    /// `WAIT numreplicas timeout`.
    pub(crate) replicas: Option<(u32, Duration)>,
    /// `WAITAOF numlocal numreplicas timeout`.
    pub(crate) aof: Option<(u32, u32, Duration)>,
}

impl Acknowledgement {
    /// Whether anything is asked.
    pub(crate) fn is_on(&self) -> bool {
        self.replicas.is_some() || self.aof.is_some()
    }

    /// The commands to send after the write, in order.
    pub(crate) fn commands(&self) -> Vec<Cmd> {
        let mut out = Vec::new();
        if let Some((n, timeout)) = self.replicas {
            let mut cmd = redis::cmd("WAIT");
            cmd.arg(n).arg(millis(timeout));
            out.push(cmd);
        }
        if let Some((local, replicas, timeout)) = self.aof {
            let mut cmd = redis::cmd("WAITAOF");
            cmd.arg(local).arg(replicas).arg(millis(timeout));
            out.push(cmd);
        }
        out
    }

    /// How long the commands may block the connection, at most.
    pub(crate) fn blocks_for(&self) -> Duration {
        self.replicas.map_or(Duration::ZERO, |(_, t)| t) + self.aof.map_or(Duration::ZERO, |a| a.2)
    }

    /// Whether the answers to [`Acknowledgement::commands`] (in order) acknowledge the write:
    /// the [`Shortfall`] when not (too few, or a command refused).
    pub(crate) fn judge(&self, answers: &[Result<Value, LockError>]) -> Result<(), Shortfall> {
        let mut answers = answers.iter();
        if let Some((n, timeout)) = self.replicas {
            let short = |got: u32, why: String| Shortfall {
                acknowledged: got,
                wanted: n,
                why,
            };
            match answers.next() {
                Some(Ok(Value::Int(got))) if *got >= i64::from(n) => {}
                Some(Ok(Value::Int(got))) => {
                    return Err(short(
                        u32::try_from(*got).unwrap_or(0),
                        format!(
                            "{got} of {n} replicas acknowledged within {} ms (WAIT)",
                            timeout.as_millis()
                        ),
                    ))
                }
                Some(Err(e)) => return Err(short(0, format!("WAIT: {e}"))),
                other => return Err(short(0, format!("WAIT answered {other:?}"))),
            }
        }
        if let Some((local, replicas, timeout)) = self.aof {
            let short = |got: i64, why: String| Shortfall {
                acknowledged: u32::try_from(got).unwrap_or(0),
                wanted: replicas,
                why,
            };
            match answers.next() {
                Some(Ok(Value::Array(got))) => match got.as_slice() {
                    [Value::Int(l), Value::Int(r)]
                        if *l >= i64::from(local) && *r >= i64::from(replicas) => {}
                    [Value::Int(l), Value::Int(r)] => {
                        return Err(short(
                            *r,
                            format!(
                                "fsynced locally {l} of {local}, by replicas {r} of {replicas} within {} ms (WAITAOF)",
                                timeout.as_millis()
                            ),
                        ))
                    }
                    other => return Err(short(0, format!("WAITAOF answered {other:?}"))),
                },
                Some(Err(e)) => return Err(short(0, format!("WAITAOF: {e}"))),
                other => return Err(short(0, format!("WAITAOF answered {other:?}"))),
            }
        }
        Ok(())
    }
}

/// Why a write was not acknowledged: how many replicas did, of how many asked, and in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shortfall {
    pub(crate) acknowledged: u32,
    pub(crate) wanted: u32,
    pub(crate) why: String,
}

impl Shortfall {
    /// The shortfall said first by what the master's `ROLE` shows: with fewer connected
    /// replicas than wanted, no wait could have been acknowledged (a failover that left too few
    /// replicas: `replicas=N` needs N + 1 to survive one). Unchanged when `ROLE` says nothing
    /// (refused by an ACL, not a master) or enough are connected.
    pub(crate) fn explained_by_role(self, role: &Value) -> Shortfall {
        match connected_replicas(role) {
            Some(connected) if connected < self.wanted as usize => Shortfall {
                why: format!(
                    "the master has {connected} connected replicas, {} needed: {}",
                    self.wanted, self.why
                ),
                ..self
            },
            _ => self,
        }
    }
}

/// How many replicas a master's `ROLE` reply lists (`master`, offset, [[ip, port, offset],
/// ...]); None for anything else.
fn connected_replicas(role: &Value) -> Option<usize> {
    let Value::Array(items) = role else {
        return None;
    };
    match items.as_slice() {
        [Value::BulkString(kind), _, Value::Array(replicas)] if kind == b"master" => {
            Some(replicas.len())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_master_with_too_few_connected_replicas_is_named_as_the_cause() {
        let short = || Shortfall {
            acknowledged: 0,
            wanted: 1,
            why: "0 of 1 replicas acknowledged within 200 ms (WAIT)".into(),
        };
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let alone = Value::Array(vec![bulk("master"), Value::Int(7), Value::Array(vec![])]);
        assert_eq!(
            short().explained_by_role(&alone).why,
            "the master has 0 connected replicas, 1 needed: 0 of 1 replicas acknowledged within 200 ms (WAIT)"
        );
        let one = Value::Array(vec![
            bulk("master"),
            Value::Int(7),
            Value::Array(vec![Value::Array(vec![
                bulk("127.0.0.1"),
                bulk("6380"),
                bulk("7"),
            ])]),
        ]);
        assert_eq!(short().explained_by_role(&one), short());
        assert_eq!(short().explained_by_role(&Value::Nil), short());
    }

    #[test]
    fn enough_acknowledgements_pass_and_too_few_or_a_refusal_say_why() {
        let both = Acknowledgement {
            replicas: Some((1, Duration::from_millis(500))),
            aof: Some((1, 0, Duration::from_millis(500))),
        };
        let aof = |l, r| Ok(Value::Array(vec![Value::Int(l), Value::Int(r)]));
        assert_eq!(both.judge(&[Ok(Value::Int(2)), aof(1, 0)]), Ok(()));
        let short = both.judge(&[Ok(Value::Int(0)), aof(1, 0)]).unwrap_err();
        assert_eq!(
            short.why,
            "0 of 1 replicas acknowledged within 500 ms (WAIT)"
        );
        assert_eq!((short.acknowledged, short.wanted), (0, 1));
        let short = both.judge(&[Ok(Value::Int(1)), aof(0, 0)]).unwrap_err();
        assert!(short.why.contains("fsynced locally 0 of 1"), "{short:?}");
        let refused = Err(LockError::Server("ERR unknown command 'WAITAOF'".into()));
        let short = both.judge(&[Ok(Value::Int(1)), refused]).unwrap_err();
        assert!(
            short
                .why
                .starts_with("WAITAOF: server error: ERR unknown command"),
            "{short:?}"
        );
        assert!(both.judge(&[]).is_err());
        assert_eq!(Acknowledgement::default().judge(&[]), Ok(()));
        assert_eq!(both.blocks_for(), Duration::from_millis(1_000));
        let names: Vec<Vec<u8>> = both
            .commands()
            .iter()
            .map(|c| c.get_packed_command())
            .collect();
        assert!(String::from_utf8_lossy(&names[0]).contains("WAIT"));
        assert!(String::from_utf8_lossy(&names[1]).contains("WAITAOF"));
    }
}
