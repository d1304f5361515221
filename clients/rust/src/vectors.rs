//! The shared test vectors (`clients/vectors`, see its README), read by this crate's tests: each
//! file's rows, with their `\xHH` escapes decoded.

/// The rows of one vector file: its lines that are not comments, split at tabs.
pub(crate) fn rows(text: &str) -> Vec<Vec<&str>> {
    text.lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| line.split('\t').collect())
        .collect()
}

/// A row's column, empty past its end.
pub(crate) fn column<'a>(row: &[&'a str], at: usize) -> &'a str {
    row.get(at).copied().unwrap_or("")
}

/// A column's bytes: `\xHH` is the byte HH, `\\` a backslash.
pub(crate) fn unescape(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while let Some(&b) = bytes.get(at) {
        match (b, bytes.get(at + 1)) {
            (b'\\', Some(b'\\')) => {
                out.push(b'\\');
                at += 2;
            }
            (b'\\', Some(b'x')) => {
                let hex = std::str::from_utf8(bytes.get(at + 2..at + 4).expect("\\xHH"));
                out.push(u8::from_str_radix(hex.expect("hex"), 16).expect("hex"));
                at += 4;
            }
            _ => {
                out.push(b);
                at += 1;
            }
        }
    }
    out
}

pub(crate) const LOST_MESSAGES: &str = include_str!("../../vectors/lost-messages.tsv");
pub(crate) const LEADER_MESSAGES: &str = include_str!("../../vectors/leader-messages.tsv");
pub(crate) const CHANNELS: &str = include_str!("../../vectors/channels.tsv");
pub(crate) const ERROR_LINES: &str = include_str!("../../vectors/error-lines.tsv");
pub(crate) const HOLD_MACHINE: &str = include_str!("../../vectors/hold-machine.tsv");
pub(crate) const GONE_ANSWERS: &str = include_str!("../../vectors/gone-answers.tsv");

// The module is compiled for tests only (lib.rs): no second `cfg(test)` here.
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;
    use crate::error::{missing_rule, refused_command, LockError};
    use crate::hold::not_yet;
    use crate::lost::LostReason;
    use crate::machine::{
        Actions, Answer, Binding, Event, Form, Identity, Machine, Read, Refusal, Renewal, State,
        Terms, NO_LEASE,
    };
    use crate::message::LostSignal;
    use crate::reply::{fence_refusal, is_final};

    #[test]
    fn error_lines_read_as_the_shared_vectors_say() {
        let rows = rows(ERROR_LINES);
        assert!(rows.len() > 15);
        for row in rows {
            let line = column(&row, 0);
            assert_eq!(is_final(line), column(&row, 1) == "final", "{row:?}");
            let fence = match column(&row, 2) {
                "gone" => Some(LostReason::HoldGone),
                "token-not-current" => Some(LostReason::TokenNotCurrent),
                _ => None,
            };
            assert_eq!(fence_refusal(line), fence, "{row:?}");
            let server = LockError::Server(line.to_string());
            assert_eq!(not_yet(&server), column(&row, 3) == "not-yet", "{row:?}");
            if line.starts_with("NOPERM") {
                let named = refused_command(line).unwrap_or_default();
                assert_eq!(named, column(&row, 4), "{row:?}");
                let command = if named.is_empty() {
                    "LOCK.ACQUIRE"
                } else {
                    &named
                };
                assert_eq!(missing_rule(command, line), column(&row, 5), "{row:?}");
            }
        }
    }

    /// A reason by the name the vectors give it (the Python library's `LostReason` values): the
    /// server's own words as its messages say them, the library's reasons by their names.
    fn lost_reason(name: &str) -> LostReason {
        LostReason::from_signal_word(name).unwrap_or_else(|| match name {
            "hold-gone" => LostReason::HoldGone,
            "token-not-current" => LostReason::TokenNotCurrent,
            "unreachable" => LostReason::Unreachable,
            "lease-ended" => LostReason::LeaseEnded,
            "unreplicated" => LostReason::Unreplicated,
            "connection-closed" => LostReason::ConnectionClosed,
            "no-permission" => LostReason::NoPermission,
            "flushed" => LostReason::Flushed,
            _ => panic!("unknown lost reason {name:?}"),
        })
    }

    fn millis(text: &str) -> Duration {
        Duration::from_millis(text.parse().expect("milliseconds"))
    }

    /// The terms a scenario's `grant` names: the lease in milliseconds, then any of `fixed`,
    /// `ephemeral` (bound to its connection), `replicated` (acknowledged by replicas), `multi`
    /// (several keys held together).
    fn hold_terms(argument: &str) -> Terms {
        let mut words = argument.split(' ');
        let mut terms = Terms {
            lease: millis(words.next().unwrap_or_default()),
            renewal: Renewal::Watchdog,
            binding: Binding::Lease,
            form: Form::One,
            acknowledged: false,
        };
        for word in words {
            match word {
                "fixed" => terms.renewal = Renewal::Fixed,
                "ephemeral" => terms.binding = Binding::Connection,
                "replicated" => terms.acknowledged = true,
                "multi" => terms.form = Form::Many,
                _ => panic!("unknown term {word:?} in {argument:?}"),
            }
        }
        terms
    }

    #[test]
    fn the_hold_machine_follows_the_shared_scenarios() {
        // The scenarios: rows with one name, in the file's order.
        let mut scenarios: Vec<Vec<Vec<&str>>> = Vec::new();
        for row in rows(HOLD_MACHINE) {
            match scenarios
                .iter_mut()
                .find(|s| column(&s[0], 0) == column(&row, 0))
            {
                Some(steps) => steps.push(row),
                None => scenarios.push(vec![row]),
            }
        }
        assert!(scenarios.len() >= 20);
        for steps in scenarios {
            run_hold_scenario(&steps);
        }
    }

    /// Runs one scenario: the grant (sent at 0 ms) and each step after it, checking the
    /// machine's state, what it asks for and its deadline after each.
    fn run_hold_scenario(steps: &[Vec<&str>]) {
        let base = Instant::now();
        let grant = &steps[0];
        assert_eq!(column(grant, 3), "grant", "{grant:?}");
        let terms = hold_terms(column(grant, 4));
        let identity = Identity {
            db: 0,
            keys: vec![Arc::from(&b"k"[..])].into(),
            owner: "o".into(),
            tokens: vec![1].into(),
        };
        let mut m = Machine::new(identity, terms);
        // Why the grant was refused, once it was (`State::Refused` does not keep it), by the
        // reason the vectors give each refusal.
        let mut refused = None;
        for (at, row) in steps.iter().enumerate() {
            let now = base + millis(column(row, 1));
            let sent = match column(row, 2) {
                "" => now,
                ms => base + millis(ms),
            };
            let argument = column(row, 4);
            let answered = |read: Read, answer: Answer| Event::Answered {
                read,
                sent,
                replied: now,
                answer,
            };
            // A check's argument: its reason, then the lease left in ms if the read showed it.
            let check = |answer: fn(Option<Duration>) -> Answer| {
                let mut words = argument.split(' ');
                let reason = lost_reason(words.next().unwrap_or_default());
                answered(Read::Check(reason), answer(words.next().map(millis)))
            };
            let signal;
            let events = match column(row, 3) {
                "grant" => {
                    assert_eq!(at, 0, "{row:?}");
                    vec![Event::Granted {
                        sent: base,
                        replied: now,
                    }]
                }
                "tick" => vec![Event::Tick { now }],
                "confirmed" if argument.is_empty() => {
                    vec![answered(Read::Renewal, Answer::Holds(None))]
                }
                // `none`: the read shows no lease on the server (`ttl` -1).
                "confirmed" if argument == "none" => {
                    vec![answered(Read::LeaseLeft, Answer::Holds(Some(NO_LEASE)))]
                }
                "confirmed" => vec![answered(
                    Read::LeaseLeft,
                    Answer::Holds(Some(millis(argument))),
                )],
                "renewed" => vec![answered(Read::Renewal, Answer::Holds(None))],
                "renewal-gone" => vec![answered(Read::Renewal, Answer::Gone)],
                "renewal-unanswered" => vec![answered(Read::Renewal, Answer::Nothing)],
                "renewal-unacknowledged" => {
                    vec![answered(Read::Renewal, Answer::Unacknowledged)]
                }
                "renewal-denied" => vec![answered(Read::Renewal, Answer::Refused)],
                "reentered" => vec![Event::Reentered { sent }],
                "replaced" => vec![Event::Replaced],
                "hint" => {
                    signal = LostSignal::Hold {
                        reason: lost_reason(argument),
                        db: 0,
                        token: 1,
                        key: b"k".to_vec(),
                        owner: b"o".to_vec(),
                    };
                    vec![Event::Signal(&signal)]
                }
                "key-message" => {
                    signal = LostSignal::Key {
                        reason: lost_reason(argument),
                        db: 0,
                        key: b"k".to_vec(),
                    };
                    vec![Event::Signal(&signal)]
                }
                "check-present" => vec![check(Answer::Holds)],
                "check-gone" => vec![check(|_| Answer::Gone)],
                "check-denied" => vec![check(|_| Answer::Refused)],
                "check-unanswered" => vec![check(|_| Answer::Nothing)],
                "fenced" => vec![Event::Fenced(lost_reason(argument))],
                "connection-lost" => {
                    assert_eq!(terms.binding, Binding::Connection, "{row:?}");
                    vec![Event::ConnectionLost]
                }
                "master-replaced" => {
                    assert_eq!(terms.binding, Binding::Connection, "{row:?}");
                    vec![Event::MasterReplaced]
                }
                "unbound" => vec![Event::Unbound],
                "release" => vec![Event::ReleaseRequested],
                "release-replied" => vec![Event::ReleaseReplied],
                other => panic!("unknown event {other:?}: {row:?}"),
            };
            let mut out = Actions::default();
            for event in events {
                let step = m.step(event);
                out.renew |= step.renew;
                out.read_lease |= step.read_lease;
                out.release |= step.release;
                out.abandon |= step.abandon;
                out.check = out.check.or(step.check);
                out.refuse = out.refuse.or(step.refuse);
            }
            if let Some(refusal) = out.refuse {
                refused = Some(match refusal {
                    Refusal::Gone(reason) => reason,
                    Refusal::Unanswered => LostReason::Unreachable,
                    Refusal::Unacknowledged => LostReason::Unreplicated,
                    Refusal::Denied => LostReason::NoPermission,
                });
            }
            let (phase, reason) = match m.state() {
                State::Acquiring => ("acquiring", None),
                State::Confirming { .. } => ("confirming", None),
                State::Held { .. } => ("held", None),
                State::Releasing => ("releasing", None),
                State::Released => ("released", None),
                State::Lost(reason) => ("lost", Some(reason)),
                State::Refused => ("refused", refused),
            };
            let asks: BTreeSet<&str> = [
                (out.renew, "renew"),
                (out.read_lease, "read"),
                (out.check.is_some(), "check"),
                (out.release, "release"),
            ]
            .into_iter()
            .filter_map(|(asked, word)| asked.then_some(word))
            .collect();
            let want_phase = column(row, 5);
            let known = [
                "confirming",
                "held",
                "releasing",
                "released",
                "lost",
                "refused",
            ];
            assert!(known.contains(&want_phase), "unknown phase: {row:?}");
            let want_reason = match column(row, 6) {
                "" => None,
                name => Some(lost_reason(name)),
            };
            let want_asks: BTreeSet<&str> = column(row, 7).split_whitespace().collect();
            for word in &want_asks {
                assert!(
                    ["renew", "read", "check", "release"].contains(word),
                    "unknown ask {word:?}: {row:?}"
                );
            }
            let want_abandon = match column(row, 8) {
                "" => false,
                "abandon" => true,
                other => panic!("unknown abandon column {other:?}: {row:?}"),
            };
            // `never`: none that time alone reaches (a year or more on stands for it).
            let want_deadline = match column(row, 9) {
                "" => None,
                "never" => Some("never".to_string()),
                ms => Some(millis(ms).as_millis().to_string()),
            };
            let deadline = m.deadline().map(|d| match d - base {
                far if far >= Duration::from_secs(86_400 * 365) => "never".to_string(),
                near => near.as_millis().to_string(),
            });
            assert_eq!(
                (phase, reason, asks, out.abandon, deadline),
                (
                    want_phase,
                    want_reason,
                    want_asks,
                    want_abandon,
                    want_deadline
                ),
                "{row:?}"
            );
        }
    }
}
