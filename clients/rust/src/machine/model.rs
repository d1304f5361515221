//! The machine against a reference model, on random event sequences (seeded, so a failure
//! names its seed and replays).
//!
//! The model does not step through states: it keeps the history (the grant, the evidence of
//! the lease and the first event that ended the hold) and says from it alone whether the hold
//! is held, until when, and why it is lost. After every event the machine must agree with it,
//! and:
//! - a guard is handed out at most once, and only after the grant (after a long wait, after a
//!   confirmation the server answered with the hold);
//! - the deadline is the largest bound any evidence gave (send time + lease left − drift);
//! - a loss is reported only with the reason of the evidence that ended the hold, and a message
//!   is never that evidence: one that names a held hold asks for a check with its reason;
//! - one renewal at a time, and none once the hold has ended;
//! - while held, the machine asks to be woken no later than its deadline.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::*;

/// What the history says.
#[derive(Debug, Default)]
struct Model {
    granted: bool,
    long_wait: bool,
    /// Confirmations unanswered so far (a long wait).
    unanswered: u32,
    delivered: bool,
    /// The largest bound given by evidence since delivery (or by the confirmation).
    bound: Option<Instant>,
    /// How the hold ended: lost with a reason, released, or refused before delivery.
    ended: Option<End>,
    renewing: bool,
    /// Bound to nothing any more (while held).
    unbound: bool,
    /// The last renewal was answered but not acknowledged by the replicas.
    unacknowledged: bool,
    /// The event just seen ended the hold in a way the server may not know of: its release is
    /// asked for in the background.
    abandoned: bool,
    /// The reason of a message naming this hold that no check has answered present: the
    /// reason of a renewal's "gone" after it.
    hint: Option<LostReason>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Lost(LostReason),
    Released,
    Refused,
}

struct Case {
    terms: Terms,
    identity: Identity,
}

impl Case {
    fn bound(&self, sent: Instant, left: Duration) -> Instant {
        sent + left.saturating_sub(self.terms.lease / 10)
    }
}

impl Model {
    fn binding(&self, terms: &Terms) -> Binding {
        if self.unbound {
            Binding::Lease
        } else {
            terms.binding
        }
    }

    fn held(&self) -> bool {
        self.delivered && self.ended.is_none()
    }

    fn end(&mut self, end: End) {
        if self.ended.is_none() {
            self.ended = Some(end);
        }
    }

    /// The model's view of one event.
    fn observe(&mut self, case: &Case, event: &Event<'_>) {
        self.abandoned = false;
        let terms = &case.terms;
        let confirming = self.granted && self.long_wait && !self.delivered && self.ended.is_none();
        if confirming || self.held() {
            match event {
                Event::Signal(signal) => {
                    if let Some(reason) = names(&case.identity, signal) {
                        self.hint = Some(reason);
                    }
                }
                Event::Answered {
                    read: Read::Check(_),
                    answer: Answer::Holds(_),
                    ..
                } => self.hint = None,
                _ => {}
            }
        }
        match *event {
            Event::Granted { sent, replied } if !self.granted => {
                self.granted = true;
                self.long_wait = replied.saturating_duration_since(sent) >= terms.interval()
                    || terms.acknowledged;
                if !self.long_wait {
                    self.delivered = true;
                    self.bound = Some(case.bound(sent, terms.lease));
                }
            }
            Event::Answered {
                read, sent, answer, ..
            } if confirming && !matches!(read, Read::Check(_)) => match answer {
                Answer::Holds(left) => {
                    self.delivered = true;
                    self.bound = Some(case.bound(sent, left.unwrap_or(terms.lease)));
                }
                Answer::Gone | Answer::Unacknowledged | Answer::Refused => self.end(End::Refused),
                Answer::Nothing => {
                    self.unanswered += 1;
                    if self.unanswered >= 3 {
                        // The server may have it: released in the background.
                        self.abandoned = true;
                        self.end(End::Refused);
                    }
                }
            },
            Event::ConnectionLost | Event::MasterReplaced
                if confirming && terms.binding == Binding::Connection =>
            {
                // A replica (or a failover's new master) has the hold, bound to nothing:
                // released there.
                self.abandoned = true;
                self.end(End::Refused)
            }
            // Before delivery and after the end, nothing else counts.
            _ if !self.held() => {}
            Event::Tick { now } if self.bound.is_some_and(|b| now >= b) => {
                self.abandoned = true;
                self.end(End::Lost(match terms.renewal {
                    Renewal::Watchdog if self.unacknowledged => LostReason::Unreplicated,
                    Renewal::Watchdog => LostReason::Unreachable,
                    Renewal::Fixed => LostReason::LeaseEnded,
                }))
            }
            Event::Answered {
                read: Read::Renewal,
                sent,
                answer,
                ..
            } => {
                self.renewing = false;
                self.unacknowledged = answer == Answer::Unacknowledged;
                match answer {
                    Answer::Holds(left) => {
                        self.extend(case.bound(sent, left.unwrap_or(terms.lease)))
                    }
                    Answer::Gone => self.end(End::Lost(self.hint.unwrap_or(LostReason::HoldGone))),
                    // The ACL refused it: this side cannot keep the hold, and releases it.
                    Answer::Refused => {
                        self.abandoned = true;
                        self.end(End::Lost(LostReason::NoPermission))
                    }
                    // Even when bound to its connection: only a read that finds it gone ends it.
                    Answer::Nothing | Answer::Unacknowledged => {}
                }
            }
            Event::Answered {
                read: Read::Check(reason),
                sent,
                answer,
                ..
            } => match answer {
                // A read of the master says nothing of the replicas.
                Answer::Holds(Some(left)) if !terms.acknowledged => {
                    self.extend(case.bound(sent, left))
                }
                Answer::Gone => self.end(End::Lost(reason)),
                Answer::Refused => {
                    self.abandoned = true;
                    self.end(End::Lost(LostReason::NoPermission))
                }
                _ => {}
            },
            Event::Reentered { sent } if !terms.acknowledged => {
                self.extend(case.bound(sent, terms.lease))
            }
            Event::Replaced => self.end(End::Lost(self.hint.unwrap_or(LostReason::HoldGone))),
            Event::Fenced(reason) => self.end(End::Lost(reason)),
            // A message is a hint: only the check it asks for can end the hold.
            Event::Signal(_) => {}
            Event::MasterReplaced if self.binding(terms) == Binding::Connection => {
                self.abandoned = true;
                self.end(End::Lost(LostReason::ConnectionClosed))
            }
            Event::Unbound => self.unbound = true,
            Event::ReleaseRequested => self.end(End::Released),
            _ => {}
        }
    }

    fn extend(&mut self, bound: Instant) {
        self.bound = Some(self.bound.map_or(bound, |b| b.max(bound)));
    }
}

/// The reason of a message that names exactly this hold, worked out from the fields.
fn names(identity: &Identity, signal: &LostSignal) -> Option<LostReason> {
    let LostSignal::Hold {
        reason,
        db,
        token,
        key,
        owner,
    } = signal
    else {
        return None;
    };
    let i = identity.keys.iter().position(|k| **k == **key)?;
    let same = *db == identity.db
        && owner.as_slice() == identity.owner.as_bytes()
        && identity.tokens.get(i) == Some(token);
    same.then_some(*reason)
}

/// Messages near and far from the hold `keys` = [k, {k}:2], owner me:1, tokens [7, 9], db 0.
fn signals() -> Vec<LostSignal> {
    let payloads: [&[u8]; 16] = [
        b"forcereleased 0 7 1 k me:1",
        b"expired 0 9 5 {k}:2 me:1",
        b"disconnected 0 7 1 k me:1",
        b"forcereleased 0 7 1 k me:2",
        b"forcereleased 0 8 1 k me:1",
        b"forcereleased 0 9 1 k me:1",
        b"forcereleased 1 7 1 k me:1",
        b"forcereleased 0 7 3 {k} me:1",
        b"deleted 0 * 1 k",
        b"deleted 1 * 1 k",
        b"deleted 0 * 3 {k}",
        b"overwritten 0 * 5 {k}:2",
        b"moved 0 * 1 k",
        b"flushed 0",
        b"flushed all",
        b"flushed 3",
    ];
    payloads
        .iter()
        .map(|p| LostSignal::parse(p).expect("a well-formed message"))
        .collect()
}

fn random_answer(rng: &mut StdRng, lease: Duration) -> Answer {
    match rng.gen_range(0..8) {
        0 | 1 => Answer::Holds(Some(lease)),
        2 => Answer::Holds(Some(lease.mul_f64(rng.gen_range(0.0..1.0)))),
        3 => Answer::Holds(None),
        4 => Answer::Gone,
        5 => Answer::Unacknowledged,
        6 => Answer::Refused,
        _ => Answer::Nothing,
    }
}

const REASONS: [LostReason; 4] = [
    LostReason::Deleted,
    LostReason::Flushed,
    LostReason::HoldGone,
    LostReason::Expired,
];

const FENCES: [LostReason; 2] = [LostReason::HoldGone, LostReason::TokenNotCurrent];

fn run(seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let lease = Duration::from_millis(rng.gen_range(3..30_000));
    let case = Case {
        terms: Terms {
            lease,
            renewal: if rng.gen_bool(0.7) {
                Renewal::Watchdog
            } else {
                Renewal::Fixed
            },
            binding: if rng.gen_bool(0.5) {
                Binding::Lease
            } else {
                Binding::Connection
            },
            form: if rng.gen_bool(0.5) {
                Form::One
            } else {
                Form::Many
            },
            acknowledged: rng.gen_bool(0.3),
        },
        identity: Identity {
            db: 0,
            keys: vec![Arc::from(&b"k"[..]), Arc::from(&b"{k}:2"[..])].into(),
            owner: "me:1".into(),
            tokens: vec![7, 9].into(),
        },
    };
    let signals = signals();
    let mut machine = Machine::new(case.identity.clone(), case.terms);
    let mut model = Model::default();
    let mut now = Instant::now();
    let mut delivered = 0;
    let mut wake = Wake::Never;
    let rtt = |rng: &mut StdRng| {
        Duration::from_micros(rng.gen_range(0..lease.as_micros() as u64 / 4 + 1))
    };
    for step in 0..rng.gen_range(1..60) {
        now += Duration::from_micros(rng.gen_range(0..lease.as_micros() as u64 / 2 + 1));
        let event = if step == 0 {
            let waited = lease.mul_f64(rng.gen_range(0.0..1.5));
            Event::Granted {
                sent: now.checked_sub(waited).unwrap_or(now),
                replied: now,
            }
        } else {
            match rng.gen_range(0..12) {
                0 | 1 => Event::Tick { now },
                2 | 3 => Event::Answered {
                    read: Read::Renewal,
                    sent: now.checked_sub(rtt(&mut rng)).unwrap_or(now),
                    replied: now,
                    answer: random_answer(&mut rng, lease),
                },
                4 => Event::Answered {
                    read: Read::LeaseLeft,
                    sent: now.checked_sub(rtt(&mut rng)).unwrap_or(now),
                    replied: now,
                    answer: random_answer(&mut rng, lease),
                },
                5 => Event::Answered {
                    read: Read::Check(REASONS[rng.gen_range(0..REASONS.len())]),
                    sent: now.checked_sub(rtt(&mut rng)).unwrap_or(now),
                    replied: now,
                    answer: random_answer(&mut rng, lease),
                },
                6 | 7 => Event::Signal(&signals[rng.gen_range(0..signals.len())]),
                8 => match rng.gen_range(0..10) {
                    0..=3 => Event::ConnectionLost,
                    4 | 5 => Event::MasterReplaced,
                    6 | 7 => Event::Unbound,
                    _ => Event::Fenced(FENCES[rng.gen_range(0..FENCES.len())]),
                },
                9 => Event::Reentered {
                    sent: now.checked_sub(rtt(&mut rng)).unwrap_or(now),
                },
                10 => {
                    if rng.gen_bool(0.2) {
                        Event::Replaced
                    } else {
                        Event::Granted {
                            sent: now,
                            replied: now,
                        }
                    }
                }
                _ => {
                    if rng.gen_bool(0.3) {
                        Event::ReleaseRequested
                    } else {
                        Event::ReleaseReplied
                    }
                }
            }
        };
        let shown = format!(
            "seed {seed} step {step}: {event:?} in {:?}",
            machine.state()
        );
        let was_renewing = matches!(machine.state(), State::Held { renewing: true, .. });
        let was_held = model.held();
        let was_confirming = matches!(machine.state(), State::Confirming { .. });
        let message = matches!(event, Event::Signal(_));
        let named = match &event {
            Event::Signal(signal) => names(&case.identity, signal),
            _ => None,
        };
        model.observe(&case, &event);
        let out = machine.step(event);

        // Handed out at most once, exactly when the model delivers.
        if out.deliver {
            delivered += 1;
        }
        assert!(delivered <= 1, "{shown}: delivered twice");
        assert_eq!(delivered == 1, model.delivered, "{shown}: delivery");
        // The status the application sees.
        let want = match model.ended {
            None => Status::Active,
            Some(End::Lost(reason)) if model.delivered => Status::Lost(reason),
            Some(End::Lost(_)) => unreachable!("lost before delivery"),
            Some(End::Released | End::Refused) => Status::Released,
        };
        assert_eq!(machine.status(), want, "{shown}");
        // Refused exactly when the model ends the hold before delivery.
        let refused_now = was_confirming && model.ended == Some(End::Refused);
        assert_eq!(out.refuse.is_some(), refused_now, "{shown}: refusal");
        if model.held() {
            assert_eq!(machine.deadline(), model.bound, "{shown}: deadline");
        }
        // A message changes nothing by itself; one naming a held hold asks for a check that
        // reports the message's reason if the hold is gone.
        if message {
            assert!(
                !out.notify && out.refuse.is_none(),
                "{shown}: a message decided"
            );
        }
        if was_held && named.is_some() {
            assert_eq!(out.check.map(|c| c.reason), named, "{shown}: no check");
        }
        // One renewal at a time, only while held, never after the end; a fixed lease only as
        // an acknowledged grant's confirmation.
        if out.renew {
            assert!(!was_renewing, "{shown}: a second renewal in flight");
            let fixed_confirmation = case.terms.acknowledged && !model.delivered;
            assert!(
                model.ended.is_none()
                    && (case.terms.renewal == Renewal::Watchdog || fixed_confirmation),
                "{shown}: renewed after the end, or a fixed lease renewed"
            );
        }
        // The release is sent once, when the application releases a held hold (or a lost
        // multi-key one), or when the replicas did not acknowledge the grant.
        if out.release {
            assert!(
                (was_held && model.ended == Some(End::Released))
                    || (matches!(model.ended, Some(End::Lost(_))) && case.terms.form == Form::Many)
                    || matches!(out.refuse, Some(Refusal::Unacknowledged | Refusal::Denied)),
                "{shown}: release"
            );
        }
        // A loss the server may not know of asks for the hold's release, once, at that loss.
        assert_eq!(
            out.abandon,
            (was_held || was_confirming) && model.abandoned && !model.held(),
            "{shown}: abandon"
        );
        if let Some(w) = out.wake {
            wake = w;
        }
        match (machine.deadline(), wake) {
            (Some(deadline), Wake::At(at)) => assert!(at <= deadline, "{shown}: woken late"),
            (Some(_), Wake::Never) => panic!("{shown}: held and never woken"),
            (None, w) => assert_eq!(w, Wake::Never, "{shown}: woken for nothing"),
        }
    }
}

#[test]
fn the_machine_agrees_with_the_model_on_random_histories() {
    let seeds: u64 = std::env::var("MACHINE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3_000);
    for seed in 0..seeds {
        run(seed);
    }
}
